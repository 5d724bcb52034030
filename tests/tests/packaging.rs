//! The .deb packages: `scripts/package-deb.sh` builds both from the release binaries (the same cargo command as
//! the container's builder stage), and the test reads them back with `dpkg-deb`: the files and their modes,
//! the control fields, the conffiles, the maintainer scripts (syntax, the system user, the state directory), the
//! binaries (they run), and lintian's verdict when lintian is installed (scripts/test.sh installs it).

use startline_tests::{outside_cargo, workspace_root};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Builds both packages once into `dir`; returns (collector .deb, agent .deb).
fn build(dir: &Path) -> (PathBuf, PathBuf) {
    let printed = run(outside_cargo(
        Command::new("bash").arg(workspace_root().join("scripts/package-deb.sh")).arg("--out").arg(dir),
    ));
    let debs: Vec<PathBuf> = printed.lines().map(PathBuf::from).collect();
    assert_eq!(debs.len(), 2, "package-deb.sh prints the two packages it built: {printed}");
    for d in &debs {
        assert!(d.exists(), "{} was not written", d.display());
    }
    (debs[0].clone(), debs[1].clone())
}

/// path -> (mode string, owner/group) from `dpkg-deb -c`.
fn contents(deb: &Path) -> BTreeMap<String, (String, String)> {
    run(Command::new("dpkg-deb").arg("-c").arg(deb))
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let path = f[5].trim_start_matches('.').trim_end_matches('/').to_string();
            (path, (f[0].to_string(), f[1].to_string()))
        })
        .collect()
}

fn control(deb: &Path) -> BTreeMap<String, String> {
    run(Command::new("dpkg-deb").args(["-f"]).arg(deb))
        .lines()
        .filter(|l| !l.starts_with(' '))
        .filter_map(|l| l.split_once(": ").map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

/// The maintainer scripts and conffiles of a package, extracted with `dpkg-deb -e`.
fn control_files(deb: &Path, into: &Path) -> BTreeMap<String, String> {
    run(Command::new("dpkg-deb").arg("-e").arg(deb).arg(into));
    std::fs::read_dir(into)
        .expect("control dir")
        .map(|e| {
            let e = e.expect("entry");
            (e.file_name().to_string_lossy().into_owned(), std::fs::read_to_string(e.path()).expect("text"))
        })
        .collect()
}

fn check_package(deb: &Path, pkg: &str, bin: &str, unit: &str, conffiles: &[&str], state_dir: &str) {
    let c = contents(deb);
    let want = |path: &str, mode: &str| {
        let (m, owner) = c.get(path).unwrap_or_else(|| panic!("{pkg}: {path} missing; contents: {c:#?}"));
        assert_eq!(m, mode, "{pkg}: mode of {path}");
        assert_eq!(owner, "root/root", "{pkg}: owner of {path}");
    };
    want(&format!("/usr/bin/{bin}"), "-rwxr-xr-x");
    want(&format!("/lib/systemd/system/{unit}"), "-rw-r--r--");
    want(&format!("/usr/share/doc/{pkg}/copyright"), "-rw-r--r--");
    want(&format!("/usr/share/doc/{pkg}/changelog.gz"), "-rw-r--r--");
    // Man page and shell completions made by the binary itself (its hidden `man` and `completions`).
    want(&format!("/usr/share/man/man1/{bin}.1.gz"), "-rw-r--r--");
    want(&format!("/usr/share/bash-completion/completions/{bin}"), "-rw-r--r--");
    want(&format!("/usr/share/zsh/vendor-completions/_{bin}"), "-rw-r--r--");
    want(&format!("/usr/share/fish/vendor_completions.d/{bin}.fish"), "-rw-r--r--");
    for f in conffiles {
        want(f, "-rw-r-----");
    }
    // The unit shipped is the one in deploy/systemd (systemd.rs verifies that one).
    let unpacked = tempfile::tempdir().expect("tempdir");
    run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(unpacked.path()));
    let shipped = std::fs::read(unpacked.path().join(format!("lib/systemd/system/{unit}"))).expect("unit");
    assert_eq!(shipped, std::fs::read(workspace_root().join("deploy/systemd").join(unit)).expect("source unit"));
    let version = run(Command::new(unpacked.path().join(format!("usr/bin/{bin}"))).arg("--version"));
    assert!(version.starts_with(bin), "{pkg}: the packaged binary runs: {version}");
    let file = run(Command::new("file").arg(unpacked.path().join(format!("usr/bin/{bin}"))));
    assert!(file.contains("stripped") && !file.contains("not stripped"), "{pkg}: stripped binary: {file}");

    let f = control(deb);
    assert_eq!(f["Package"], pkg);
    assert_eq!(f["Version"], env!("CARGO_PKG_VERSION"), "{pkg}: the workspace version");
    let arch = run(Command::new("dpkg").arg("--print-architecture"));
    assert_eq!(f["Architecture"], arch.trim());
    assert!(f["Depends"].contains("adduser") && f["Depends"].contains("libc6"), "{pkg}: Depends: {}", f["Depends"]);
    assert!(f["Installed-Size"].parse::<u64>().is_ok_and(|k| k > 1000), "{pkg}: Installed-Size");

    let dir = tempfile::tempdir().expect("tempdir");
    let files = control_files(deb, dir.path());
    let listed: Vec<&str> = files.get("conffiles").map(|s| s.lines().collect()).unwrap_or_default();
    assert_eq!(listed, conffiles, "{pkg}: conffiles");
    for script in ["postinst", "prerm", "postrm"] {
        let text = files.get(script).unwrap_or_else(|| panic!("{pkg}: no {script}"));
        assert!(text.starts_with("#!/bin/sh\nset -e\n"), "{pkg}: {script} is a strict sh script");
        run(Command::new("sh").arg("-n").arg(dir.path().join(script)));
    }
    let postinst = &files["postinst"];
    assert!(
        postinst.contains("getent passwd startline")
            && postinst.contains("adduser --system --group --home /nonexistent --no-create-home --quiet startline"),
        "{pkg}: postinst creates the system user once:\n{postinst}"
    );
    assert!(
        postinst.contains(&format!("install -d -o startline -g startline -m 0750 {state_dir}")),
        "{pkg}: postinst creates {state_dir}:\n{postinst}"
    );
    assert!(postinst.contains("chown root:startline /etc/startline"), "{pkg}: config readable by the service");
    assert!(files["postrm"].contains(&format!("rm -rf {state_dir}")), "{pkg}: purge removes {state_dir}");
}

#[test]
fn debs_carry_binaries_units_conffiles_and_a_system_user() {
    let out = tempfile::tempdir().expect("tempdir");
    let (collector, agent) = build(out.path());
    for deb in [&collector, &agent] {
        let size = std::fs::metadata(deb).expect("deb").len();
        println!("{}: {} KiB", deb.display(), size / 1024);
    }
    check_package(
        &collector,
        "startline-collector",
        "startline-collector",
        "startline-collector.service",
        &["/etc/startline/collector.toml"],
        "/var/lib/startline",
    );
    // The conffile is the example config users are told to edit.
    let unpacked = tempfile::tempdir().expect("tempdir");
    run(Command::new("dpkg-deb").arg("-x").arg(&collector).arg(unpacked.path()));
    assert_eq!(
        std::fs::read(unpacked.path().join("etc/startline/collector.toml")).expect("conffile"),
        std::fs::read(workspace_root().join("deploy/collector.example.toml")).expect("example")
    );
    check_package(
        &agent,
        "startline-agent",
        "startline-agent",
        "startline-agent@.service",
        &[
            "/etc/startline/agent-node.env",
            "/etc/startline/agent-slurm.env",
            "/etc/startline/agent-sagemaker.env",
            "/etc/startline/agent-vertex.env",
            "/etc/startline/agent-azureml.env",
        ],
        "/var/lib/startline-agent",
    );

    // lintian (scripts/test.sh installs it): no errors and no warnings (the man pages are there). The verdict is
    // read from the tags (lintian counts shown overrides towards --fail-on, so its exit status only tells that it
    // ran).
    for deb in [&collector, &agent] {
        let out = Command::new("lintian")
            .args(["--tag-display-limit", "0", "--show-overrides", "--fail-on", "none"])
            .arg(deb)
            .output()
            .expect("lintian is not installed: apt-get install lintian (scripts/test.sh does)");
        let said = String::from_utf8_lossy(&out.stdout);
        println!("lintian {}:\n{said}", deb.display());
        assert!(
            out.status.success(),
            "lintian {}: {}\n{said}{}",
            deb.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        // Proof that lintian read the package: our one override (0640 conffiles) is reported as overridden.
        assert!(
            said.lines()
                .any(|l| l.starts_with("O: ") && l.contains("non-standard-file-perm 0640 != 0644 [etc/startline/")),
            "lintian did not report the conffile override for {}:\n{said}{}",
            deb.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        // The only overridden error: the agent's unsafe-libyaml (a Rust translation of libyaml inside kube-rs,
        // which lintian takes for an embedded copy of the C library; the override says why).
        let overridden: Vec<&str> = said
            .lines()
            .filter(|l| l.starts_with("O: ") && !l.contains("non-standard-file-perm 0640 != 0644 [etc/startline/"))
            .collect();
        let expected: &[&str] = if deb == &agent {
            &["O: startline-agent: embedded-library libyaml [usr/bin/startline-agent]"]
        } else {
            &[]
        };
        assert_eq!(overridden, expected, "lintian overrides on {}", deb.display());
        let unexpected: Vec<&str> = said.lines().filter(|l| l.starts_with("E: ") || l.starts_with("W: ")).collect();
        assert!(unexpected.is_empty(), "lintian on {}:\n{}", deb.display(), unexpected.join("\n"));
    }
}
