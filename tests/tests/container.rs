//! `deploy/Containerfile`, checked without a container engine: these machines reach no image registry, so
//! neither the Rust builder image nor the distroless runtime can be pulled (buildah itself runs here, with
//! `--isolation chroot`). The test reads the file and checks what the image promises: two stages, a non-root
//! user, no shell needed in the final stage, the time zone database, the volume, the entry point; then it runs
//! the builder stage's build command outside a container and checks what the stage copies exists, that the
//! image's built-in config validates, and that a time-of-day SLO's zone resolves from `/usr/share/zoneinfo`.

use startline_tests::workspace_root;
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
    let out = Command::new(cargo()).args(&words[1..]).current_dir(workspace_root()).output().expect("cargo build");
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
