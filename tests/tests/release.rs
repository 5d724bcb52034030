//! `scripts/release.sh`, run as a release would: every artefact is there, `sha256sum -c SHA256SUMS` verifies
//! them, each tarball holds its binary (which runs), LICENSE, README, CHANGELOG, example configs, systemd
//! units, man pages and shell completions that bash really loads; the .debs and the OCI archive name the
//! version; the CycloneDX SBOM validates against the official CycloneDX 1.6 JSON schema
//! (`tests/fixtures/cyclonedx/`, python jsonschema) and lists every crate that goes into the binaries, checked
//! two ways: against `cargo tree` for the two packages, and against the crates whose source paths the release
//! binaries themselves carry (their line tables name `<crate>-<version>/src/...` of every crate compiled in).

use startline_tests::workspace_root;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn metadata() -> serde_json::Value {
    let out = run(Command::new(cargo())
        .args(["metadata", "--format-version", "1", "--no-deps", "--locked"])
        .current_dir(workspace_root()));
    serde_json::from_str(&out).expect("metadata json")
}

/// Files in `dir` (names).
fn files(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .expect("dir")
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect()
}

/// `NAME-VERSION` of every crates.io crate whose source path a binary carries (debug line tables and panic
/// locations name `.../index.crates.io-*/NAME-VERSION/src/...`).
fn crates_in_binary(bin: &Path) -> BTreeSet<(String, String)> {
    let bytes = std::fs::read(bin).expect("binary");
    let text = String::from_utf8_lossy(&bytes);
    let mut found = BTreeSet::new();
    for (i, _) in text.match_indices("index.crates.io-") {
        let rest = &text[i..];
        let Some(slash) = rest.find('/') else { continue };
        let dir: String = rest[slash + 1..].chars().take_while(|c| *c != '/' && !c.is_control()).collect();
        // NAME-VERSION: the version is what follows the first '-' after which comes MAJOR.MINOR.PATCH (numbers),
        // so names with a digit after a '-' (`md-5-0.10.6`) split right.
        let semver_core = |v: &str| {
            let core = v.split(['-', '+']).next().unwrap_or("");
            let parts: Vec<&str> = core.split('.').collect();
            parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
        };
        let split = dir.match_indices('-').map(|(j, _)| j).find(|j| semver_core(&dir[j + 1..]));
        if let Some(j) = split {
            let (name, version) = (&dir[..j], &dir[j + 1..]);
            if !name.is_empty()
                && version.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '+')
            {
                found.insert((name.to_string(), version.to_string()));
            }
        }
    }
    found
}

#[test]
fn release_script_builds_every_artefact_and_each_verifies() {
    let meta = metadata();
    let version = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|p| p["name"] == "startline-collector")
        .and_then(|p| p["version"].as_str())
        .expect("version")
        .to_string();
    let target = PathBuf::from(meta["target_directory"].as_str().expect("target_directory"));
    let arch = run(Command::new("uname").arg("-m")).trim().to_string();
    let deb_arch = run(Command::new("dpkg").arg("--print-architecture")).trim().to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("bundle");
    // From the release binaries scripts/test.sh built before the tests (`cargo build --release --locked ...`).
    run(Command::new("bash").arg(workspace_root().join("scripts/release.sh")).arg("--no-build").arg("--out").arg(&out));

    let collector_tar = format!("startline-collector-{version}-{arch}-linux.tar.gz");
    let agent_tar = format!("startline-agent-{version}-{arch}-linux.tar.gz");
    let want: BTreeSet<String> = [
        collector_tar.clone(),
        agent_tar.clone(),
        format!("startline-collector_{version}_{deb_arch}.deb"),
        format!("startline-agent_{version}_{deb_arch}.deb"),
        format!("startline-{version}-oci.tar"),
        format!("startline-{version}.cdx.json"),
        "SHA256SUMS".to_string(),
    ]
    .into_iter()
    .collect();
    assert_eq!(files(&out), want, "the bundle's files");

    // Checksums: one line per artefact, and sha256sum -c verifies every one.
    let sums = std::fs::read_to_string(out.join("SHA256SUMS")).expect("SHA256SUMS");
    let listed: BTreeSet<String> = sums
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|n| n.trim_start_matches('*').to_string())
        .collect();
    let mut others = want.clone();
    others.remove("SHA256SUMS");
    assert_eq!(listed, others, "SHA256SUMS lists every artefact");
    let check = run(Command::new("sha256sum").args(["-c", "SHA256SUMS"]).current_dir(&out));
    assert_eq!(check.lines().filter(|l| l.ends_with(": OK")).count(), others.len(), "{check}");
    // A damaged artefact is caught.
    let damaged = dir.path().join("damaged");
    std::fs::create_dir(&damaged).expect("mkdir");
    for f in &want {
        std::fs::copy(out.join(f), damaged.join(f)).expect("copy");
    }
    let sbom_name = format!("startline-{version}.cdx.json");
    std::fs::write(damaged.join(&sbom_name), "{}").expect("damage");
    let bad = Command::new("sha256sum").args(["-c", "SHA256SUMS"]).current_dir(&damaged).output().expect("sha256sum");
    assert!(!bad.status.success(), "a changed file fails the check");

    // Each tarball: one top folder with the binary, docs, examples, units, completions and man pages.
    for (tar, bin, units, examples) in [
        (
            &collector_tar,
            "startline-collector",
            vec!["systemd/startline-collector.service"],
            vec!["examples/collector.toml", "examples/prometheus/startline-rules.yml"],
        ),
        (
            &agent_tar,
            "startline-agent",
            vec!["systemd/startline-agent@.service"],
            vec!["examples/agent-node.env", "examples/agent-slurm.env"],
        ),
    ] {
        let top = tar.trim_end_matches(".tar.gz").to_string();
        let x = dir.path().join(format!("x-{bin}"));
        std::fs::create_dir(&x).expect("mkdir");
        run(Command::new("tar").arg("-xzf").arg(out.join(tar)).arg("-C").arg(&x));
        let root = x.join(&top);
        let mut expected: Vec<String> =
            [bin, "LICENSE", "README.md", "CHANGELOG.md"].iter().map(|s| s.to_string()).collect();
        expected.extend(units.iter().chain(examples.iter()).map(|s| s.to_string()));
        expected.extend([
            format!("completions/{bin}.bash"),
            format!("completions/_{bin}"),
            format!("completions/{bin}.fish"),
            format!("man/man1/{bin}.1"),
            format!("man/man1/{bin}-run.1").replace("startline-agent-run", "startline-agent-node"),
        ]);
        for f in &expected {
            assert!(root.join(f).is_file(), "{tar}: {f} missing");
        }
        assert_eq!(std::fs::read(root.join("LICENSE")).ok(), std::fs::read(workspace_root().join("LICENSE")).ok());
        let v = run(Command::new(root.join(bin)).arg("--version"));
        assert_eq!(v.trim(), format!("{bin} {version}"));
        // Hidden subcommands get no man page and no completion.
        for hidden in ["completions", "man"] {
            assert!(!root.join(format!("man/man1/{bin}-{hidden}.1")).exists(), "{bin}-{hidden}.1 is hidden");
        }
        let page = std::fs::read_to_string(root.join(format!("man/man1/{bin}.1"))).expect("man page");
        assert!(page.contains(&format!(".TH {bin} 1")), "{bin}.1 is a roff man page in section 1");
        // bash loads the completion and registers it for the command.
        let script = root.join(format!("completions/{bin}.bash"));
        let complete =
            run(Command::new("bash").arg("-c").arg(format!("source {} && complete -p {bin}", script.display())));
        assert!(complete.trim_end().ends_with(&format!(" {bin}")) && complete.contains(" -F _"), "{complete}");
        // And it completes the subcommands (the first word after the command).
        let words = run(Command::new("bash").arg("-c").arg(format!(
            "source {s} && COMP_WORDS=({bin} '') && COMP_CWORD=1 && COMP_LINE='{bin} ' && COMP_POINT=${{#COMP_LINE}} && \
             _{f} {bin} '' {bin} && printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            s = script.display(),
            f = bin.replace('-', "__")
        )));
        let sub = if bin == "startline-collector" { "check-config" } else { "node" };
        assert!(words.lines().any(|w| w == sub), "{bin}: completing the first word offers {sub}: {words}");
        let zsh = std::fs::read_to_string(root.join(format!("completions/_{bin}"))).expect("zsh");
        assert!(zsh.starts_with(&format!("#compdef {bin}")), "zsh completion");
        let fish = std::fs::read_to_string(root.join(format!("completions/{bin}.fish"))).expect("fish");
        assert!(fish.contains(&format!("complete -c {bin}")), "fish completion");
    }

    // The .debs and the image carry the version.
    for pkg in ["startline-collector", "startline-agent"] {
        let deb = out.join(format!("{pkg}_{version}_{deb_arch}.deb"));
        let fields = run(Command::new("dpkg-deb").arg("-f").arg(&deb).args(["Package", "Version"]));
        assert_eq!(fields, format!("Package: {pkg}\nVersion: {version}\n"));
    }
    let index =
        run(Command::new("tar").arg("-xOf").arg(out.join(format!("startline-{version}-oci.tar"))).arg("index.json"));
    assert!(index.contains(&format!("\"org.opencontainers.image.ref.name\":\"startline:{version}\"")), "{index}");

    // The SBOM: valid CycloneDX (and the validator does refuse a broken one).
    let sbom_path = out.join(&sbom_name);
    let validate = |p: &Path| -> Vec<String> {
        let out = run(Command::new("python3").arg(workspace_root().join("tests/python/validate_cyclonedx.py")).arg(p));
        let v: serde_json::Value = serde_json::from_str(&out).expect("validator json");
        assert_eq!(v["schema"], "http://cyclonedx.org/schema/bom-1.6.schema.json");
        serde_json::from_value(v["errors"].clone()).expect("errors")
    };
    let errors = validate(&sbom_path);
    assert!(errors.is_empty(), "the SBOM is not valid CycloneDX 1.6: {errors:?}");
    let sbom: serde_json::Value = serde_json::from_slice(&std::fs::read(&sbom_path).expect("sbom")).expect("json");
    let mut broken = sbom.clone();
    broken["components"][0]["hashes"][0]["alg"] = "SHA-257".into();
    broken.as_object_mut().expect("object").remove("specVersion");
    std::fs::write(dir.path().join("broken.json"), broken.to_string()).expect("write");
    assert!(validate(&dir.path().join("broken.json")).len() >= 2, "the schema check catches a broken SBOM");
    assert_eq!(sbom["metadata"]["component"]["version"], version.as_str());

    let components = sbom["components"].as_array().expect("components");
    let required: BTreeSet<(String, String)> = components
        .iter()
        .filter(|c| c["scope"] == "required")
        .map(|c| (c["name"].as_str().expect("name").to_string(), c["version"].as_str().expect("v").to_string()))
        .collect();
    for c in components {
        let (name, v) = (c["name"].as_str().expect("name"), c["version"].as_str().expect("version"));
        assert_eq!(c["purl"], format!("pkg:cargo/{name}@{v}").as_str(), "purl of {name}");
    }
    // Every crate cargo resolves into the two binaries (normal edges, this platform).
    let host = run(Command::new("rustc").arg("-vV"));
    let triple = host.lines().find_map(|l| l.strip_prefix("host: ")).expect("host triple");
    let tree = run(Command::new(cargo())
        .args(["tree", "--locked", "-e", "normal", "--prefix", "none", "--format", "{p}", "--target", triple])
        .args(["-p", "startline-collector", "-p", "startline-agent"])
        .current_dir(workspace_root()));
    let resolved: BTreeSet<(String, String)> = tree
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let name = w.next()?;
            let v = w.next()?.strip_prefix('v')?;
            Some((name.to_string(), v.to_string()))
        })
        .collect();
    assert!(resolved.len() > 100, "cargo tree: {} crates", resolved.len());
    let missing: Vec<_> = resolved.difference(&required).collect();
    assert!(missing.is_empty(), "crates in the binaries but not in the SBOM: {missing:?}");
    // Every crates.io crate whose code the release binaries carry.
    let mut compiled_in = BTreeSet::new();
    for bin in ["startline-collector", "startline-agent"] {
        compiled_in.extend(crates_in_binary(&target.join("release").join(bin)));
    }
    assert!(compiled_in.len() > 50, "crate paths found in the binaries: {}", compiled_in.len());
    let missing: Vec<_> = compiled_in.difference(&required).collect();
    assert!(missing.is_empty(), "crates compiled into the binaries but not required in the SBOM: {missing:?}");
}
