//! The systemd units in `deploy/systemd/`: `systemd-analyze verify` accepts them without a single warning (it
//! exits 0 even for unknown keys, so any output fails the test), they carry the settings docs/install.md promises,
//! and the collector really speaks the readiness protocol `Type=notify` relies on (READY=1 once it serves,
//! STOPPING=1 when it drains), checked against a real `NOTIFY_SOCKET`.
//!
//! `verify` wants the `ExecStart` binaries to exist. The units name `/usr/bin/...` (where the .deb installs
//! them); the test verifies copies whose `/usr/bin/startline-*` point at the binaries built for this test run,
//! and checks the paths separately (`tests/tests/packaging.rs` checks that the .deb puts them there).

use startline_tests::{bin_dir, workspace_root, Collector};
use std::collections::BTreeMap;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// `[Section] Key=Value` lines of a unit; repeated keys keep every value in order.
fn parse_unit(path: &Path) -> BTreeMap<(String, String), Vec<String>> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut section = String::new();
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = s.to_string();
            continue;
        }
        let (k, v) = line.split_once('=').unwrap_or_else(|| panic!("{}: not Key=Value: {line}", path.display()));
        out.entry((section.clone(), k.trim().to_string())).or_default().push(v.trim().to_string());
    }
    out
}

fn one<'a>(unit: &'a BTreeMap<(String, String), Vec<String>>, section: &str, key: &str) -> &'a str {
    match unit.get(&(section.to_string(), key.to_string())).map(Vec::as_slice) {
        Some([v]) => v,
        other => panic!("[{section}] {key}: expected exactly one value, found {other:?}"),
    }
}

fn seconds(v: &str) -> u64 {
    let (n, unit) = v.split_at(v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len()));
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("{v:?} is not a time span"));
    match unit {
        "" | "s" => n,
        "min" => n * 60,
        other => panic!("{v:?}: unit {other:?} not handled by this test"),
    }
}

fn units_dir() -> std::path::PathBuf {
    workspace_root().join("deploy/systemd")
}

/// Runs `systemd-analyze verify` on `units` (file names in a directory prepared by the caller).
fn verify(dir: &Path, units: &[&str]) {
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg("--man=no")
        .args(units.iter().map(|u| dir.join(u)))
        .output()
        .expect("systemd-analyze (Debian's systemd package) must be installed");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.trim().is_empty(), "systemd-analyze verify {units:?}: {}\n{said}", out.status);
}

/// A copy of each unit whose `/usr/bin/startline-*` is the binary built for this run.
fn units_pointing_at_built_binaries(instances: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let bins = bin_dir();
    for name in ["startline-collector", "startline-agent"] {
        assert!(
            bins.join(name).exists(),
            "{} is missing: run `cargo build --workspace --bins` first",
            bins.join(name).display()
        );
    }
    let rewrite = |file: &str| {
        let text = std::fs::read_to_string(units_dir().join(file)).expect("unit file");
        text.replace("/usr/bin/startline-", &format!("{}/startline-", bins.display()))
    };
    std::fs::write(dir.path().join("startline-collector.service"), rewrite("startline-collector.service"))
        .expect("write");
    for i in instances {
        std::fs::write(dir.path().join(format!("startline-agent@{i}.service")), rewrite("startline-agent@.service"))
            .expect("write");
    }
    dir
}

#[test]
fn units_pass_systemd_analyze_verify_without_warnings() {
    let instances = ["slurm", "sagemaker", "vertex", "azureml", "node"];
    let dir = units_pointing_at_built_binaries(&instances);
    verify(dir.path(), &["startline-collector.service"]);
    let agents: Vec<String> = instances.iter().map(|i| format!("startline-agent@{i}.service")).collect();
    verify(dir.path(), &agents.iter().map(String::as_str).collect::<Vec<_>>());
}

#[test]
fn verify_would_catch_a_broken_unit() {
    // The guard on the check above: verify exits 0 on an unknown key, and only its output tells.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("bad.service"), "[Service]\nExecStart=/bin/true\nProtectSystem=bogus\n")
        .expect("write");
    let out = Command::new("systemd-analyze").args(["verify", "--man=no"]).arg(dir.path().join("bad.service")).output();
    let out = out.expect("systemd-analyze");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("ProtectSystem") || said.contains("protect system"), "verify said: {said}");
}

#[test]
fn collector_unit_is_a_hardened_notify_service() {
    let u = parse_unit(&units_dir().join("startline-collector.service"));
    assert_eq!(one(&u, "Service", "Type"), "notify");
    assert_eq!(
        one(&u, "Service", "ExecStart"),
        "/usr/bin/startline-collector run --config /etc/startline/collector.toml"
    );
    assert_eq!(one(&u, "Service", "ExecReload"), "/bin/kill -HUP $MAINPID", "SIGHUP reloads [auth] and [tls]");
    assert_eq!(one(&u, "Service", "Restart"), "on-failure");
    assert_eq!(one(&u, "Service", "User"), "startline", "the dedicated user the .deb creates");
    assert_eq!(one(&u, "Service", "StateDirectory"), "startline");
    // The example config the .deb installs stores sled in the state directory.
    let example = std::fs::read_to_string(workspace_root().join("deploy/collector.example.toml")).expect("example");
    assert!(example.contains("path = \"/var/lib/startline\""), "store.path must be StateDirectory's path");
    for (k, v) in [
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("NoNewPrivileges", "yes"),
        ("PrivateTmp", "yes"),
        ("CapabilityBoundingSet", ""),
    ] {
        assert_eq!(one(&u, "Service", k), v, "[Service] {k}");
    }
    // The drain: grpc.drain_timeout (10 s) + the HTTP server's 5 s + checkpoint and flush.
    let stop = seconds(one(&u, "Service", "TimeoutStopSec"));
    assert!(stop >= 10 + 5 + 15, "TimeoutStopSec={stop}s does not cover the drain");
    assert_eq!(one(&u, "Install", "WantedBy"), "multi-user.target");
}

#[test]
fn agent_template_runs_each_instance_as_its_subcommand() {
    let u = parse_unit(&units_dir().join("startline-agent@.service"));
    assert_eq!(one(&u, "Service", "EnvironmentFile"), "/etc/startline/agent-%i.env");
    let exec = one(&u, "Service", "ExecStart");
    assert!(exec.starts_with("/usr/bin/startline-agent %i --spool /var/lib/startline-agent/%i "), "{exec}");
    assert!(exec.ends_with("$STARTLINE_AGENT_ARGS"), "unquoted: systemd splits it into words: {exec}");
    assert_eq!(one(&u, "Service", "StateDirectory"), "startline-agent/%i");
    assert_eq!(one(&u, "Service", "User"), "startline");
    assert_eq!(one(&u, "Service", "Restart"), "on-failure");
    assert_eq!(one(&u, "Service", "ProtectSystem"), "strict");
    assert_eq!(one(&u, "Service", "NoNewPrivileges"), "yes");
    // Every shipped instance has an environment file whose arguments its subcommand accepts.
    for i in ["slurm", "sagemaker", "vertex", "azureml", "node"] {
        let env = units_dir().join(format!("agent-{i}.env"));
        let text = std::fs::read_to_string(&env).unwrap_or_else(|e| panic!("{}: {e}", env.display()));
        let args = text
            .lines()
            .find_map(|l| l.strip_prefix("STARTLINE_AGENT_ARGS="))
            .unwrap_or_else(|| panic!("{}: no STARTLINE_AGENT_ARGS", env.display()));
        assert!(text.contains("STARTLINE_TOKEN_FILE="), "{}: agents authenticate", env.display());
        // clap parses the line as systemd would split it; --help stops before anything runs.
        let out = Command::new(bin_dir().join("startline-agent"))
            .arg(i)
            .args(["--spool", "/var/lib/startline-agent/x"])
            .args(args.split_whitespace())
            .arg("--help")
            .output()
            .expect("startline-agent");
        assert!(out.status.success(), "{}: {}", env.display(), String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn collector_notifies_systemd_when_ready_and_when_stopping() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("bind notify socket");
    sock.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    // nextest runs each test in its own process: the variable reaches only this test's collector.
    std::env::set_var("NOTIFY_SOCKET", &sock_path);
    let c = Collector::start(&dir.path().join("data"), &[]);
    let mut buf = [0u8; 1024];
    let n = sock.recv(&mut buf).expect("READY=1 within 30 s of the ready line");
    let ready = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(ready.starts_with("READY=1\n"), "{ready:?}");
    assert!(ready.contains(&format!("grpc={}", c.grpc)) && ready.contains(&format!("http={}", c.http)), "{ready:?}");
    let status = c.signal_and_wait("TERM");
    assert!(status.success(), "collector exit after SIGTERM: {status}");
    let n = sock.recv(&mut buf).expect("STOPPING=1 after SIGTERM");
    assert_eq!(String::from_utf8_lossy(&buf[..n]), "STOPPING=1");
}
