//! Stores written by Startline 0.1.0, frozen in `tests/fixtures/store-0.1.0/` (made once by its `make.sh` with
//! that version's binaries; `MADE_BY` names them): the current collector must open the collector's store and
//! answer for every job in it as computed here from `collector-events.json`, both after the clean shutdown that
//! wrote it (its shutdown image) and as after a crash (image removed: restored from the snapshots and the log);
//! the current node agent must open the spool and deliver what it held. A change of either format keeps these
//! passing (it reads the old format) or ships a migration tested the same way, with a new fixture beside this
//! one.

use serde_json::Value;
use startline_tests::{wait_until, workspace_root, Collector, NodeAgent};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn fixture() -> std::path::PathBuf {
    workspace_root().join("tests/fixtures/store-0.1.0")
}

/// A copy of a fixture directory (the committed one is never opened for writing).
fn copy_of(name: &str, to: &Path) -> std::path::PathBuf {
    let dest = to.join(name);
    let st = Command::new("cp").arg("-a").arg(fixture().join(name)).arg(&dest).status().expect("cp");
    assert!(st.success(), "copy {name}");
    dest
}

fn ms(rfc3339: &str) -> i64 {
    let t = humantime::parse_rfc3339(rfc3339).unwrap_or_else(|e| panic!("{rfc3339}: {e}"));
    t.duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_millis() as i64
}

/// The API's time (milliseconds, `Z`) of an RFC 3339 input time.
fn api_time(rfc3339: &str) -> String {
    let ms = ms(rfc3339);
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(ms as u64)).to_string()
}

/// Events of each job, in time order.
fn by_job(events: &Value) -> BTreeMap<String, Vec<Value>> {
    let mut m: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for e in events["events"].as_array().expect("events") {
        m.entry(e["job_id"].as_str().expect("job_id").to_string()).or_default().push(e.clone());
    }
    for evs in m.values_mut() {
        evs.sort_by_key(|e| ms(e["occurred_at"].as_str().expect("occurred_at")));
    }
    m
}

/// What the API must say about a job, worked out from its events alone.
fn check_job(c: &Collector, job: &str, evs: &[Value]) {
    let kind = |k: &str| evs.iter().find(|e| e["kind"] == k);
    let at = |e: &Value| e["occurred_at"].as_str().expect("occurred_at").to_string();
    let submitted = kind("submitted").expect("every fixture job is submitted");
    let first_step = kind("first_step");
    let done = kind("done");
    let (status, j) = c.get(&format!("/api/v1/jobs/{job}"));
    assert_eq!(status, 200, "{job}: {j}");
    assert_eq!(j["events_total"], evs.len(), "{job}: every event is kept");
    let kinds: Vec<&str> = j["events"].as_array().expect("events").iter().filter_map(|e| e["kind"].as_str()).collect();
    let want: Vec<&str> = evs.iter().filter_map(|e| e["kind"].as_str()).collect();
    assert_eq!(kinds, want, "{job}: the timeline's events in time order");
    let times: Vec<String> = j["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["occurred_at"].as_str().unwrap_or("").to_string())
        .collect();
    let want_times: Vec<String> = evs.iter().map(|e| api_time(&at(e))).collect();
    assert_eq!(times, want_times, "{job}: event times");
    for field in ["pool_kind", "provider", "pool", "priority"] {
        assert_eq!(j[field], submitted[field], "{job}: {field}");
    }
    assert_eq!(j["gpu_count"], submitted["gpu_count"], "{job}: gpu_count");
    assert_eq!(j["gpu_class"], submitted.get("gpu_class").cloned().unwrap_or(Value::from("")), "{job}: gpu_class");
    assert_eq!(j["team"], submitted.get("team").cloned().unwrap_or(Value::from("")), "{job}: team");
    assert_eq!(j["submitted_at"], api_time(&at(submitted)).as_str(), "{job}: submitted_at");
    match first_step {
        Some(f) => {
            assert_eq!(j["first_step_at"], api_time(&at(f)).as_str(), "{job}: first_step_at");
            let ttfs = (ms(&at(f)) - ms(&at(submitted))) as f64 / 1000.0;
            assert_eq!(j["time_to_first_step_seconds"].as_f64(), Some(ttfs), "{job}: time to first step");
            // The initial wait is split by reason; its parts add up to the time to first step.
            let parts: f64 = j["timeline"]["initial_wait_seconds"]
                .as_object()
                .expect("wait parts")
                .values()
                .filter_map(Value::as_f64)
                .sum();
            assert!((parts - ttfs).abs() < 1e-6, "{job}: wait parts {parts} vs {ttfs}");
        }
        None => {
            assert!(j["first_step_at"].is_null() && j["time_to_first_step_seconds"].is_null(), "{job}: not started")
        }
    }
    match done {
        Some(d) => {
            assert_eq!(j["state"], "done", "{job}");
            assert_eq!(j["outcome"], d["outcome"], "{job}: outcome");
            assert_eq!(j["done_at"], api_time(&at(d)).as_str(), "{job}: done_at");
            assert_eq!(
                j["timeline"]["exit_code"],
                d.get("exit_code").cloned().unwrap_or(Value::Null),
                "{job}: exit code"
            );
        }
        None if first_step.is_some() => assert_eq!(j["state"], "running", "{job}"),
        None => assert_eq!(j["state"], "queued", "{job}"),
    }
    let preempted = evs.iter().filter(|e| e["kind"] == "preempted").count();
    assert_eq!(j["timeline"]["preemptions"], preempted, "{job}: preemptions");
}

fn check_store(data: &Path, config: &Path, events: &Value) {
    let c = Collector::start(data, &["--config", &config.to_string_lossy()]);
    let jobs = by_job(events);
    let (status, list) = c.get("/api/v1/jobs?limit=100");
    assert_eq!(status, 200, "{list}");
    let listed: Vec<&str> =
        list["jobs"].as_array().expect("jobs").iter().filter_map(|j| j["job_id"].as_str()).collect();
    let mut want: Vec<&str> = jobs.keys().map(String::as_str).collect();
    let mut got = listed.clone();
    got.sort();
    want.sort();
    assert_eq!(got, want, "the jobs in the store");
    for (job, evs) in &jobs {
        check_job(&c, job, evs);
    }
    let _ = c.signal_and_wait("TERM");
}

#[test]
fn the_current_collector_opens_a_store_written_by_0_1_0() {
    let events: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture().join("collector-events.json")).expect("collector-events.json"),
    )
    .expect("json");
    let dir = tempfile::tempdir().expect("tempdir");
    // The fixture's jobs ended in 2026: keep them whatever today's date (retention 0s: forever).
    let config = dir.path().join("collector.toml");
    std::fs::write(&config, "[store]\nretention = \"0s\"\n").expect("config");

    // As 0.1.0 left it at a clean shutdown.
    let clean = dir.path().join("clean");
    std::fs::create_dir(&clean).expect("mkdir");
    let data = copy_of("collector", &clean);
    assert!(data.join("shutdown.img").exists(), "the fixture was written by a clean shutdown");
    check_store(&data, &config, &events);

    // As after a crash: no shutdown image, so the state is rebuilt from what the store holds.
    let crashed = dir.path().join("crashed");
    std::fs::create_dir(&crashed).expect("mkdir");
    let data = copy_of("collector", &crashed);
    std::fs::remove_file(data.join("shutdown.img")).expect("remove shutdown image");
    check_store(&data, &config, &events);
}

#[test]
fn the_current_node_agent_delivers_a_spool_written_by_0_1_0() {
    let events: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("spool-events.json")).expect("spool-events.json"))
            .expect("json");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("collector.toml");
    std::fs::write(&config, "[store]\nretention = \"0s\"\n").expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", &config.to_string_lossy()]);
    let spool = copy_of("agent-spool", dir.path());
    let _agent = NodeAgent::start(&[&c.endpoint()], &spool);
    let jobs = by_job(&events);
    let total: usize = jobs.values().map(Vec::len).sum();
    wait_until("the spooled events reach the collector", Duration::from_secs(30), || {
        jobs.keys().all(|j| c.get(&format!("/api/v1/jobs/{j}")).1["events_total"].as_u64().unwrap_or(0) > 0)
            && jobs
                .keys()
                .map(|j| c.get(&format!("/api/v1/jobs/{j}")).1["events_total"].as_u64().unwrap_or(0))
                .sum::<u64>()
                == total as u64
    });
    for (job, evs) in &jobs {
        check_job(&c, job, evs);
        // The node agent stamped its source (the node name it ran with) when it spooled them.
        let (_, j) = c.get(&format!("/api/v1/jobs/{job}"));
        for e in j["events"].as_array().expect("events") {
            assert!(e["source"].as_str().is_some_and(|s| s.contains("fixture-node")), "{job}: source {}", e["source"]);
        }
    }
}
