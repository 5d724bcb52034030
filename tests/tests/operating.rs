//! Operating the collector: documented exit codes (usage 2, config 78, unavailable 69), JSON logs selected by
//! flag or environment, and the build and process metrics every exporter is expected to have.

use startline_tests::{binary, http_get_text, Collector};
use std::process::Command;

fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(binary("startline-collector")).args(args).envs(env.iter().copied()).output().expect("runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn failures_exit_with_their_documented_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (code, err) = run(&["--no-such-flag"], &[]);
    assert_eq!(code, 2, "usage: {err}");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[grpc]\nlisten_addr = \"x\"\n").expect("config");
    let (code, err) = run(&["check-config", "--config", &bad.display().to_string()], &[]);
    assert_eq!(code, 78, "unknown key: {err}");
    assert!(err.contains("listen_addr"), "{err}");
    std::fs::write(&bad, "[store]\nretention = \"soon\"\n").expect("config");
    let (code, err) = run(&["--config", &bad.display().to_string()], &[]);
    assert_eq!(code, 78, "invalid value: {err}");
    assert!(err.contains("store.retention"), "{err}");
    // A port in use: unavailable.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let db = dir.path().join("db").display().to_string();
    let (code, err) = run(&["--data-dir", &db, "--grpc-listen", &addr, "--http-listen", "127.0.0.1:0"], &[]);
    assert_eq!(code, 69, "port in use: {err}");
    assert!(err.contains(&addr), "{err}");
}

/// `check-config` prints the effective configuration as TOML: defaults filled in, flags and environment applied,
/// secrets redacted, and the printed text is itself a config that prints the same again.
#[test]
fn check_config_prints_effective_toml_that_reads_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "[store]\nretention = \"30d\"\n[[slo]]\nname = \"gpu8\"\nthreshold = \"15m\"\nobjective = 99.5\n\
         selector = { gpu_count_min = 8 }\n[alerts]\nwebhook = [{ url = \"http://127.0.0.1:9/h\", headers = { X-Api-Key = \"s3cret\" } }]\n",
    )
    .expect("config");
    let print = |path: &std::path::Path| {
        let out = Command::new(binary("startline-collector"))
            .args(["check-config", "--config", &path.display().to_string(), "--http-listen", "127.0.0.1:18080"])
            .env("STARTLINE_DATA_DIR", dir.path().join("db"))
            .output()
            .expect("runs");
        assert!(out.status.success(), "check-config: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).expect("utf-8")
    };
    let first = print(&file);
    for expected in [
        "retention = \"30d\"",
        "fold_after = \"5m\"",
        "listen = \"127.0.0.1:18080\"",
        &format!("path = \"{}\"", dir.path().join("db").display()),
        "name = \"gpu8\"",
        "objective = 99.5",
        "gpu_count_min = 8",
        "X-Api-Key = \"<secret>\"",
        "timeout = \"5s\"",
    ] {
        assert!(first.contains(expected), "{expected} missing from:\n{first}");
    }
    assert!(!first.contains("s3cret"), "a secret was printed:\n{first}");
    let again = dir.path().join("effective.toml");
    std::fs::write(&again, &first).expect("write");
    let second = print(&again);
    let body = |s: &str| s.lines().filter(|l| !l.starts_with('#')).map(str::to_string).collect::<Vec<_>>();
    assert_eq!(body(&first), body(&second));
}

#[test]
fn json_logs_from_the_environment_and_build_and_process_metrics() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::env::set_var("STARTLINE_LOG_FORMAT", "json");
    let c = Collector::start(&dir.path().join("db"), &[]);
    std::env::remove_var("STARTLINE_LOG_FORMAT");
    // CPU seconds read independently from the child's /proc before and after the scrape bracket the scraped value.
    let cpu = |pid: u32| -> f64 {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        let f: Vec<&str> = text[text.rfind(')').expect(")") + 2..].split_whitespace().collect();
        (f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")) as f64 / 100.0
    };
    let before = cpu(c.child.id());
    let (status, metrics) = http_get_text(c.http, "/metrics");
    let after = cpu(c.child.id());
    assert_eq!(status, 200);
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name) && !l.starts_with('#'))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing"))
    };
    assert!(metrics.contains("startline_build_info{binary=\"startline-collector\""), "{metrics}");
    assert!(metrics.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))));
    assert!(value("process_resident_memory_bytes") > 1_000_000.0);
    assert!(value("process_open_fds") >= 3.0);
    let scraped = value("process_cpu_seconds_total");
    assert!(before <= scraped && scraped <= after, "cpu {scraped} outside [{before}, {after}]");
    let started = value("process_start_time_seconds");
    let now = startline_proto::time::now_ms() as f64 / 1000.0;
    assert!(started <= now && now - started < 600.0, "start time {started} vs now {now}");
    let log = std::fs::read_to_string(&c.log).expect("log");
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty());
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["level"].is_string() && v["timestamp"].is_string(), "{l}");
    }
    assert!(lines.iter().any(|l| l.contains("collector ready")), "{log}");
}

#[test]
fn the_agent_takes_every_setting_from_the_environment_and_logs_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let out = Command::new(binary("startline-agent"))
        .arg("simulate")
        .env("STARTLINE_COLLECTOR", c.endpoint())
        .env("STARTLINE_LOG_FORMAT", "json")
        .env("STARTLINE_JOBS", "7")
        .env("STARTLINE_HISTORY", "2h")
        .env("STARTLINE_SEED", "11")
        .env("STARTLINE_LOG", "debug")
        .output()
        .expect("agent runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "no log lines");
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["level"].is_string(), "{l}");
    }
    let (_, jobs) = c.get("/api/v1/jobs?limit=100");
    assert_eq!(jobs["jobs"].as_array().map(Vec::len), Some(7), "STARTLINE_JOBS was not used: {jobs}");
}
