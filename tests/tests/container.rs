//! `deploy/Containerfile`, checked without a container engine: these machines reach no image registry, so
//! neither the Rust builder image nor the distroless runtime can be pulled (buildah itself runs here, with
//! `--isolation chroot`). The test reads the file and checks what the image promises: two stages, a non-root
//! user, no shell needed in the final stage, the time zone database, the volume, the entry point; then it runs
//! the builder stage's build command outside a container and checks what the stage copies exists, that the
//! image's built-in config validates, and that a time-of-day SLO's zone resolves from `/usr/share/zoneinfo`.

use startline_tests::{outside_cargo, workspace_root};
use std::path::PathBuf;
use std::process::Command;

/// One instruction: keyword and its arguments (continuation lines joined).
#[derive(Debug, Clone)]
struct Instr {
    op: String,
    args: String,
}

#[derive(Debug)]
struct Stage {
    from: String,
    name: String,
    instrs: Vec<Instr>,
}

fn parse() -> (Vec<Instr>, Vec<Stage>) {
    let text = std::fs::read_to_string(workspace_root().join("deploy/Containerfile")).expect("deploy/Containerfile");
    let mut logical = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if cur.is_empty() && (t.is_empty() || t.starts_with('#')) {
            continue;
        }
        if let Some(head) = t.strip_suffix('\\') {
            cur += head;
            cur += " ";
        } else {
            cur += t;
            logical.push(std::mem::take(&mut cur));
        }
    }
    let (mut globals, mut stages) = (Vec::new(), Vec::<Stage>::new());
    for l in logical {
        let (op, args) = l.split_once(char::is_whitespace).unwrap_or((&l, ""));
        let instr = Instr { op: op.to_ascii_uppercase(), args: args.trim().to_string() };
        if instr.op == "FROM" {
            let parts: Vec<&str> = instr.args.split_whitespace().collect();
            assert!(parts.len() == 3 && parts[1].eq_ignore_ascii_case("AS"), "FROM without a stage name: {l}");
            stages.push(Stage { from: parts[0].to_string(), name: parts[2].to_string(), instrs: Vec::new() });
        } else if let Some(s) = stages.last_mut() {
            s.instrs.push(instr);
        } else {
            globals.push(instr);
        }
    }
    (globals, stages)
}

/// The default of a global `ARG NAME=value`, for `FROM ${NAME}`.
fn resolve(globals: &[Instr], from: &str) -> String {
    let Some(name) = from.strip_prefix("${").and_then(|f| f.strip_suffix('}')) else { return from.to_string() };
    globals
        .iter()
        .filter(|i| i.op == "ARG")
        .find_map(|i| i.args.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("FROM {from}: no ARG {name}=default before the first stage"))
        .to_string()
}

fn args_of<'a>(stage: &'a Stage, op: &str) -> Vec<&'a str> {
    stage.instrs.iter().filter(|i| i.op == op).map(|i| i.args.as_str()).collect()
}

/// The `cargo build ...` command of the builder stage's RUN.
fn builder_cargo_command(stage: &Stage) -> String {
    let run = args_of(stage, "RUN").into_iter().find(|r| r.contains("cargo build")).expect("a RUN with cargo build");
    let start = run.find("cargo build").expect("cargo build");
    run[start..].split("&&").next().expect("command").trim().to_string()
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn target_dir() -> PathBuf {
    let out = Command::new(cargo())
        .args(["metadata", "--format-version", "1", "--no-deps", "--locked"])
        .current_dir(workspace_root())
        .output()
        .expect("cargo metadata");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata json");
    PathBuf::from(v["target_directory"].as_str().expect("target_directory"))
}

#[test]
fn containerfile_has_a_rust_builder_and_a_shell_free_non_root_runtime() {
    let (globals, stages) = parse();
    let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["builder", "runtime"], "two stages, the last one is the image");
    let builder_image = resolve(&globals, &stages[0].from);
    assert!(
        builder_image.contains("/rust:") && builder_image.ends_with("-bookworm"),
        "builder from Debian's Rust image: {builder_image}"
    );
    let runtime_image = resolve(&globals, &stages[1].from);
    assert!(runtime_image.starts_with("gcr.io/distroless/cc-debian12"), "distroless runtime: {runtime_image}");

    let rt = &stages[1];
    for op in ["RUN", "SHELL", "ADD"] {
        assert!(args_of(rt, op).is_empty(), "runtime stage: no {op} (distroless has no shell; COPY only)");
    }
    assert_eq!(args_of(rt, "USER"), ["65532:65532"], "non-root user 65532 (distroless nonroot)");
    assert_eq!(args_of(rt, "VOLUME"), [r#"["/var/lib/startline"]"#]);
    assert_eq!(args_of(rt, "WORKDIR"), ["/var/lib/startline"]);
    // Exec form: with no shell in the image, a shell-form entry point could not start.
    let entry: Vec<String> = serde_json::from_str(args_of(rt, "ENTRYPOINT")[0]).expect("ENTRYPOINT in exec form");
    assert_eq!(entry, ["/usr/bin/startline-collector"]);
    let cmd: Vec<String> = serde_json::from_str(args_of(rt, "CMD")[0]).expect("CMD in exec form");
    assert_eq!(cmd, ["run"]);
    assert_eq!(args_of(rt, "ENV"), ["STARTLINE_CONFIG=/etc/startline/collector.toml"]);

    let copies = args_of(rt, "COPY");
    assert!(copies.iter().all(|c| c.starts_with("--from=builder ")), "everything comes from the builder: {copies:?}");
    assert!(copies.contains(&"--from=builder /usr/share/zoneinfo /usr/share/zoneinfo"), "tz database: {copies:?}");
    assert!(
        copies.contains(&"--from=builder --chown=65532:65532 /out/var/lib/startline /var/lib/startline"),
        "the volume's directory belongs to the runtime user: {copies:?}"
    );
    let runs = args_of(&stages[0], "RUN").join(" ");
    assert!(runs.contains("install -y --no-install-recommends tzdata"), "builder installs tzdata: {runs}");
}

#[test]
fn binaries_the_image_copies_are_cargo_targets_of_the_packages_it_builds() {
    let (_, stages) = parse();
    let cmd = builder_cargo_command(&stages[0]);
    let copied: Vec<String> = args_of(&stages[1], "COPY")
        .iter()
        .flat_map(|c| c.split_whitespace())
        .filter_map(|w| w.strip_prefix("/out/usr/bin/").map(str::to_string))
        .collect();
    assert_eq!(copied, ["startline-collector", "startline-agent"]);
    let out = Command::new(cargo())
        .args(["metadata", "--format-version", "1", "--no-deps", "--locked"])
        .current_dir(workspace_root())
        .output()
        .expect("cargo metadata");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata json");
    for bin in &copied {
        let pkg = v["packages"]
            .as_array()
            .expect("packages")
            .iter()
            .find(|p| {
                p["targets"].as_array().is_some_and(|ts| {
                    ts.iter().any(|t| t["name"] == bin.as_str() && t["kind"].as_array().is_some_and(|k| k[0] == "bin"))
                })
            })
            .unwrap_or_else(|| panic!("no cargo bin target named {bin}"));
        let name = pkg["name"].as_str().expect("name");
        assert!(cmd.contains(&format!("-p {name}")), "{bin} is in package {name}, which `{cmd}` does not build");
    }
    // The .deb is built by the same command (scripts/package-deb.sh), and the README documents it.
    let script = std::fs::read_to_string(workspace_root().join("scripts/package-deb.sh")).expect("package-deb.sh");
    assert!(script.contains(&format!("BUILD_CMD=\"{cmd}\"")), "scripts/package-deb.sh builds with `{cmd}`");
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).expect("README");
    assert!(readme.contains(&cmd), "README documents `{cmd}`");
}

#[test]
fn builder_stage_steps_run_outside_a_container() {
    let (_, stages) = parse();
    let cmd = builder_cargo_command(&stages[0]);
    let words: Vec<&str> = cmd.split_whitespace().collect();
    assert_eq!(words[0], "cargo");
    // The same command the image runs (incremental: nothing to do when the release build is current).
    let out = outside_cargo(Command::new(cargo()).args(&words[1..]).current_dir(workspace_root()))
        .output()
        .expect("cargo build");
    assert!(out.status.success(), "`{cmd}` failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let release = target_dir().join("release");
    for bin in ["startline-collector", "startline-agent"] {
        let v = Command::new(release.join(bin)).arg("--version").output().expect("run the release binary");
        assert!(v.status.success() && String::from_utf8_lossy(&v.stdout).starts_with(bin), "{bin} --version");
    }
    // The image's built-in config: valid, and its store is the volume.
    let config = workspace_root().join("deploy/container/collector.toml");
    let check = Command::new(release.join("startline-collector"))
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .expect("check-config");
    let printed = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "check-config: {}", String::from_utf8_lossy(&check.stderr));
    assert!(printed.contains("/var/lib/startline"), "store.path is the volume: {printed}");
    // What the runtime stage copies from the builder's tzdata: the example config's time-of-day SLO zone.
    let zone = std::path::Path::new("/usr/share/zoneinfo/Europe/Moscow");
    let head = std::fs::read(zone).unwrap_or_else(|e| panic!("{}: {e} (install tzdata)", zone.display()));
    assert!(head.starts_with(b"TZif"), "{} is a TZif file", zone.display());
}

/// The image `scripts/build-image.sh` builds (no registry: Debian's libraries, CA bundle and tzdata from this
/// machine, committed by buildah from `scratch`), unpacked as a container runtime would: the OCI archive's
/// index, manifest and config, and its layers extracted in order with their owners into a root file system.
struct Image {
    _dir: tempfile::TempDir,
    archive: PathBuf,
    rootfs: PathBuf,
    config: serde_json::Value,
}

fn sha256_of(path: &std::path::Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().expect("sha256sum");
    assert!(out.status.success(), "sha256sum {}", path.display());
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().expect("digest").to_string()
}

fn workspace_version() -> String {
    let out = Command::new(cargo())
        .args(["metadata", "--format-version", "1", "--no-deps", "--locked"])
        .current_dir(workspace_root())
        .output()
        .expect("cargo metadata");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata json");
    v["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|p| p["name"] == "startline-collector")
        .and_then(|p| p["version"].as_str())
        .expect("startline-collector version")
        .to_string()
}

fn build_image() -> Image {
    assert!(
        Command::new("buildah").arg("--version").output().is_ok_and(|o| o.status.success()),
        "buildah is not installed (scripts/test.sh installs Debian's buildah)"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let archive = dir.path().join("startline-oci.tar");
    // From the release binaries scripts/test.sh built (the Containerfile's builder command) before the tests.
    let out = Command::new("bash")
        .arg(workspace_root().join("scripts/build-image.sh"))
        .arg("--no-build")
        .arg("--out")
        .arg(&archive)
        .current_dir(workspace_root())
        .output()
        .expect("scripts/build-image.sh");
    assert!(
        out.status.success(),
        "scripts/build-image.sh failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let oci = dir.path().join("oci");
    std::fs::create_dir(&oci).expect("mkdir");
    let st = Command::new("tar").arg("-xf").arg(&archive).arg("-C").arg(&oci).status().expect("tar");
    assert!(st.success(), "the archive is a tar file");
    let layout: serde_json::Value =
        serde_json::from_slice(&std::fs::read(oci.join("oci-layout")).expect("oci-layout")).expect("json");
    assert_eq!(layout["imageLayoutVersion"], "1.0.0");
    // Every blob is read through its digest, and the digest is checked (a runtime refuses a mismatch too).
    let blob = |digest: &str| -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or_else(|| panic!("sha256 digest: {digest}"));
        let p = oci.join("blobs/sha256").join(hex);
        assert_eq!(sha256_of(&p), hex, "blob {digest} holds what its digest says");
        p
    };
    let json = |p: PathBuf| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(&p).expect("blob")).expect("json blob")
    };
    let index = json(oci.join("index.json"));
    let manifests = index["manifests"].as_array().expect("manifests");
    assert_eq!(manifests.len(), 1, "one image in the archive: {index}");
    assert_eq!(
        manifests[0]["annotations"]["org.opencontainers.image.ref.name"],
        format!("startline:{}", workspace_version()).as_str(),
        "the archive names the image startline:VERSION"
    );
    let manifest = json(blob(manifests[0]["digest"].as_str().expect("manifest digest")));
    assert_eq!(manifest["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    let config = json(blob(manifest["config"]["digest"].as_str().expect("config digest")));
    let layers = manifest["layers"].as_array().expect("layers");
    assert_eq!(config["rootfs"]["diff_ids"].as_array().map(Vec::len), Some(layers.len()), "a diff_id per layer");
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir(&rootfs).expect("mkdir");
    for layer in layers {
        assert_eq!(layer["mediaType"], "application/vnd.oci.image.layer.v1.tar+gzip", "compressed layers");
        let st = Command::new("tar")
            .args(["--numeric-owner", "-xpf"])
            .arg(blob(layer["digest"].as_str().expect("layer digest")))
            .arg("-C")
            .arg(&rootfs)
            .status()
            .expect("tar");
        assert!(st.success(), "layer {layer} extracts");
    }
    Image { _dir: dir, archive, rootfs, config }
}

/// A program's path from this process's PATH (the child's environment is cleared, PATH included).
fn which(program: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} is not installed"))
}

fn du_bytes(path: &std::path::Path) -> u64 {
    let out = Command::new("du").args(["-sb"]).arg(path).output().expect("du");
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().and_then(|n| n.parse().ok()).expect("du bytes")
}

#[test]
fn image_archive_runs_the_collector_from_its_own_root_filesystem_as_its_user() {
    use std::io::BufRead;
    use std::os::unix::fs::MetadataExt;
    let image = build_image();
    eprintln!(
        "image: {} bytes as an OCI archive (gzip layers), {} bytes unpacked",
        std::fs::metadata(&image.archive).expect("archive").len(),
        du_bytes(&image.rootfs)
    );
    let cfg = &image.config["config"];
    let labels = &cfg["Labels"];
    let revision = Command::new("git").args(["rev-parse", "HEAD"]).current_dir(workspace_root()).output().ok();
    let revision =
        revision.filter(|o| o.status.success()).map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    for (key, want) in [
        ("title", Some("startline".to_string())),
        ("version", Some(workspace_version())),
        ("licenses", Some("Apache-2.0".to_string())),
        ("revision", revision),
        ("source", None),
        ("created", None),
    ] {
        let got = labels[format!("org.opencontainers.image.{key}")].as_str();
        let got = got.unwrap_or_else(|| panic!("label org.opencontainers.image.{key} missing: {labels}"));
        assert!(!got.is_empty(), "label {key} is empty");
        if let Some(w) = want {
            assert_eq!(got, w, "label org.opencontainers.image.{key}");
        }
    }
    let created = labels["org.opencontainers.image.created"].as_str().expect("created");
    let created_ok = created.len() == 20 && created.ends_with('Z') && created.as_bytes()[10] == b'T';
    assert!(created_ok, "created is an RFC 3339 UTC time: {created}");

    // The image's user: numeric, not root, and named in the image's own /etc/passwd.
    let user = cfg["User"].as_str().expect("User").to_string();
    let (uid, gid) = user.split_once(':').expect("User is uid:gid");
    let uid: u32 = uid.parse().expect("numeric uid");
    assert_ne!(uid, 0, "the image does not run as root");
    let passwd = std::fs::read_to_string(image.rootfs.join("etc/passwd")).expect("the image's /etc/passwd");
    assert!(
        passwd.lines().any(|l| l.split(':').nth(2) == Some(&uid.to_string())),
        "uid {uid} in /etc/passwd: {passwd}"
    );
    let volume = "/var/lib/startline";
    assert!(cfg["Volumes"][volume].is_object(), "volume {volume}: {cfg}");
    let vol_dir = image.rootfs.join(volume.trim_start_matches('/'));
    assert_eq!(std::fs::metadata(&vol_dir).expect("volume dir").uid(), uid, "the volume belongs to the user");

    // Start the entry point in the image's root file system as its user, with only the image's environment:
    // every library, the CA bundle and the config come from the image, none from this machine.
    let mut argv: Vec<String> = serde_json::from_value(cfg["Entrypoint"].clone()).expect("Entrypoint");
    argv.extend(serde_json::from_value::<Vec<String>>(cfg["Cmd"].clone()).expect("Cmd"));
    let env: Vec<String> = serde_json::from_value(cfg["Env"].clone()).expect("Env");
    let mut cmd = Command::new(which("chroot"));
    cmd.arg(format!("--userspec={uid}:{gid}")).arg(&image.rootfs).args(&argv);
    // Free ports (the image's config listens on 50051/8080, which may be taken here).
    cmd.args(["--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"]);
    cmd.env_clear().envs(env.iter().filter_map(|kv| kv.split_once('=')));
    let mut child = startline_tests::ChildGuard(
        cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().expect("chroot"),
    );
    let stdout = child.0.stdout.take().expect("stdout");
    let mut lines = std::io::BufReader::new(stdout).lines();
    let ready = lines.by_ref().map_while(Result::ok).find(|l| l.starts_with("startline-collector ready "));
    let Some(ready) = ready else {
        let _ = child.0.kill();
        let mut err = String::new();
        if let Some(mut e) = child.0.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        panic!("the image's collector did not become ready:\n{err}");
    };
    std::thread::spawn(move || for _ in lines {});
    let http: std::net::SocketAddr = ready
        .split_whitespace()
        .find_map(|p| p.strip_prefix("http="))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("ready line: {ready}"));
    startline_tests::wait_until("/readyz answers 200", std::time::Duration::from_secs(30), || {
        startline_tests::http_get_text(http, "/readyz").0 == 200
    });
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.0.id())).expect("/proc status");
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).expect("Uid line");
    assert!(
        uid_line.split_whitespace().skip(1).all(|u| u == uid.to_string()),
        "the collector runs as {uid}: {uid_line}"
    );
    // Its store is the image's volume, written by the image's user.
    let store: Vec<_> = std::fs::read_dir(&vol_dir).expect("volume").filter_map(Result::ok).collect();
    assert!(!store.is_empty(), "the collector's store is in {volume}");
    for e in &store {
        assert_eq!(e.metadata().expect("meta").uid(), uid, "{} written by the image's user", e.path().display());
    }
    drop(child);

    let agent = Command::new(which("chroot"))
        .arg(format!("--userspec={uid}:{gid}"))
        .arg(&image.rootfs)
        .args(["/usr/bin/startline-agent", "--version"])
        .env_clear()
        .output()
        .expect("chroot agent");
    assert!(agent.status.success(), "startline-agent --version: {}", String::from_utf8_lossy(&agent.stderr));
    assert_eq!(String::from_utf8_lossy(&agent.stdout).trim(), format!("startline-agent {}", workspace_version()));
}

/// What a builder-stage RUN puts under /out: `cp SRC... DEST` (DEST a directory when it ends with `/`), and
/// which /out files `strip --strip-debug` rewrites.
fn builder_outputs(builder: &Stage) -> (Vec<(String, String)>, Vec<String>) {
    let (mut copied, mut stripped) = (Vec::new(), Vec::new());
    for run in args_of(builder, "RUN") {
        for step in run.split("&&") {
            let words: Vec<&str> = step.split_whitespace().collect();
            match words.as_slice() {
                ["cp", srcs @ .., dest] if dest.starts_with("/out/") => {
                    for src in srcs {
                        let to = match dest.strip_suffix('/') {
                            Some(d) => format!("{d}/{}", src.rsplit('/').next().expect("name")),
                            None => dest.to_string(),
                        };
                        copied.push((src.to_string(), to));
                    }
                }
                ["strip", "--strip-debug", files @ ..] => stripped.extend(files.iter().map(|f| f.to_string())),
                _ => {}
            }
        }
    }
    (copied, stripped)
}

#[test]
fn image_archive_and_containerfile_install_the_same_files_and_settings() {
    use std::os::unix::fs::MetadataExt;
    let (_, stages) = parse();
    let (builder, runtime) = (&stages[0], &stages[1]);
    let (copied, stripped) = builder_outputs(builder);
    let image = build_image();
    let release = target_dir().join("release");
    let in_image = |p: &str| image.rootfs.join(p.trim_start_matches('/'));
    let mut checked = 0;
    for copy in args_of(runtime, "COPY") {
        let words: Vec<&str> = copy.split_whitespace().collect();
        let chown = words.iter().find_map(|w| w.strip_prefix("--chown="));
        let paths: Vec<&str> = words.iter().copied().filter(|w| !w.starts_with("--")).collect();
        let (dest, srcs) = paths.split_last().expect("COPY SRC... DEST");
        for src in srcs {
            let to = match dest.strip_suffix('/') {
                Some(d) => format!("{d}/{}", src.rsplit('/').next().expect("name")),
                None => dest.to_string(),
            };
            let target = in_image(&to);
            let meta = std::fs::symlink_metadata(&target)
                .unwrap_or_else(|e| panic!("COPY {copy}: {to} is not in the image ({e})"));
            if let Some(owner) = chown {
                assert_eq!(
                    format!("{}:{}", meta.uid(), meta.gid()),
                    owner,
                    "{to}: owner as the Containerfile's --chown"
                );
            }
            if let Some(from) = src.strip_prefix("/out/").map(|_| src.to_string()) {
                match copied.iter().find(|(_, o)| *o == from) {
                    // A file of this repository or of the release build, copied in the builder.
                    Some((repo_src, _)) => {
                        let want = if let Some(bin) = repo_src.strip_prefix("target/release/") {
                            assert!(stripped.contains(&from), "the builder strips {from}");
                            let tmp = tempfile::NamedTempFile::new().expect("tmp");
                            let st = Command::new("strip")
                                .arg("--strip-debug")
                                .arg("-o")
                                .arg(tmp.path())
                                .arg(release.join(bin))
                                .status()
                                .expect("strip");
                            assert!(st.success());
                            std::fs::read(tmp.path()).expect("stripped")
                        } else {
                            std::fs::read(workspace_root().join(repo_src)).expect("repository file")
                        };
                        assert!(
                            std::fs::read(&target).expect("image file") == want,
                            "{to}: the same bytes as {repo_src}"
                        );
                    }
                    // A directory the builder makes (the volume).
                    None => assert!(meta.is_dir(), "{to}: a directory, as the builder's {from}"),
                }
            } else {
                // A path of a Debian package installed in the builder (tzdata): every file the package ships
                // there is in the image.
                let owner = Command::new("dpkg-query").args(["-S", src]).output().expect("dpkg-query");
                let pkg =
                    String::from_utf8_lossy(&owner.stdout).split(':').next().unwrap_or_default().trim().to_string();
                assert!(owner.status.success() && !pkg.is_empty(), "{src}: installed by a Debian package here");
                let listed = Command::new("dpkg-query").args(["-L", &pkg]).output().expect("dpkg-query -L");
                let files: Vec<String> = String::from_utf8_lossy(&listed.stdout)
                    .lines()
                    .filter(|l| l.starts_with(&format!("{src}/")) && std::path::Path::new(l).is_file())
                    .map(str::to_string)
                    .collect();
                assert!(files.len() > 100, "{pkg} ships {src}: {}", files.len());
                for f in &files {
                    assert!(in_image(f).exists(), "{f} ({pkg}) is in the image, as COPY {copy}");
                }
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 5, "zoneinfo, two binaries, the config and the volume");

    // What the distroless base brings, from Debian here: the non-root user, CA certificates, the C libraries.
    let passwd = std::fs::read_to_string(in_image("/etc/passwd")).expect("passwd");
    assert!(passwd.lines().any(|l| l.starts_with("nonroot:x:65532:65532:")), "distroless's nonroot user: {passwd}");
    let bundle = std::fs::read_to_string(in_image("/etc/ssl/certs/ca-certificates.crt")).expect("CA bundle");
    assert!(bundle.matches("BEGIN CERTIFICATE").count() > 100, "Debian's CA bundle");

    // The settings: the Containerfile's runtime instructions and the archive's config say the same.
    let cfg = &image.config["config"];
    assert_eq!(cfg["User"], args_of(runtime, "USER")[0]);
    assert_eq!(cfg["WorkingDir"], args_of(runtime, "WORKDIR")[0]);
    let entry: serde_json::Value = serde_json::from_str(args_of(runtime, "ENTRYPOINT")[0]).expect("exec form");
    assert_eq!(cfg["Entrypoint"], entry);
    let cmd: serde_json::Value = serde_json::from_str(args_of(runtime, "CMD")[0]).expect("exec form");
    assert_eq!(cfg["Cmd"], cmd);
    let env: Vec<String> = serde_json::from_value(cfg["Env"].clone()).expect("Env");
    for e in args_of(runtime, "ENV") {
        assert!(env.contains(&e.to_string()), "ENV {e} in the image: {env:?}");
    }
    let volumes: Vec<String> = serde_json::from_str(args_of(runtime, "VOLUME")[0]).expect("VOLUME exec form");
    for v in &volumes {
        assert!(cfg["Volumes"][v].is_object(), "VOLUME {v}: {cfg}");
    }
    for port in args_of(runtime, "EXPOSE").iter().flat_map(|p| p.split_whitespace()) {
        let key = if port.contains('/') { port.to_string() } else { format!("{port}/tcp") };
        let exposed = cfg["ExposedPorts"].as_object().expect("ExposedPorts");
        assert!(exposed.contains_key(&key) || exposed.contains_key(port), "EXPOSE {port}: {exposed:?}");
    }
    // Every LABEL of the Containerfile; the literal ones with the same value (the others are build arguments).
    let label_text = args_of(runtime, "LABEL").join(" ");
    let mut labels = 0;
    for pair in label_text.split("\" ").map(|p| p.trim()) {
        let Some((k, v)) = pair.split_once('=') else { continue };
        let v = v.trim_matches('"');
        let got = cfg["Labels"][k].as_str().unwrap_or_else(|| panic!("LABEL {k} missing in the image"));
        if !v.contains("${") {
            assert_eq!(got, v, "LABEL {k}");
        }
        labels += 1;
    }
    assert_eq!(labels, 7, "the Containerfile's labels: {label_text}");
}
