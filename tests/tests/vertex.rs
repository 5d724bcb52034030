//! The Vertex AI adapter's real client (v1 REST with a bearer token) against a local server that replays
//! CustomJob list answers in Vertex's documented format (no Google Cloud here). The job is queued, then
//! pending, then succeeded across polls; the adapter is restarted in between; the collector's timeline holds
//! each transition once at Vertex's times.

use startline_tests::{binary, serve_http, wait_until, workspace_root, ChildGuard, Collector};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn fixture(name: &str) -> serde_json::Value {
    let p = workspace_root().join("agent/src/provider/fixtures").join(name);
    serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("json")
}

/// Serves the job as QUEUED while `stage` is 0, PENDING at 1, and as the fixture (SUCCEEDED) from 2.
fn replay_server(stage: Arc<AtomicUsize>, seen: Arc<Mutex<Vec<(String, String)>>>) -> std::net::SocketAddr {
    let ok = fixture("vertex-customjob-succeeded.json");
    let failed = fixture("vertex-customjob-failed.json");
    serve_http(move |r| {
        if let Ok(mut s) = seen.lock() {
            s.push((r.path.clone(), r.header("authorization").unwrap_or("").to_string()));
        }
        let mut job = ok.clone();
        let state = match stage.load(Ordering::SeqCst) {
            0 => Some("JOB_STATE_QUEUED"),
            1 => Some("JOB_STATE_PENDING"),
            _ => None,
        };
        if let Some(state) = state {
            job["state"] = state.into();
            if let Some(o) = job.as_object_mut() {
                o.remove("startTime");
                o.remove("endTime");
            }
        }
        (200, "application/json", serde_json::json!({"customJobs": [job, failed.clone()]}).to_string())
    })
}

fn adapter(collector: &str, endpoint: &str, spool: &std::path::Path) -> ChildGuard {
    ChildGuard(
        Command::new(binary("startline-agent"))
            .args([
                "--collector",
                collector,
                "vertex",
                "--project",
                "ml-prod",
                "--location",
                "europe-west4",
                "--interval",
                "1s",
            ])
            .args(["--endpoint", endpoint])
            .arg("--spool")
            .arg(spool)
            .env("VERTEX_ACCESS_TOKEN", "ya29.test-token")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("adapter"),
    )
}

#[test]
fn vertex_jobs_are_followed_through_a_replayed_api_across_an_adapter_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let stage = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let endpoint = format!("http://{}", replay_server(stage.clone(), seen.clone()));
    let spool = dir.path().join("spool");
    let job = "/api/v1/jobs/vertex/ml-prod/europe-west4/5478273648572874752";

    let mut first = adapter(&c.endpoint(), &endpoint, &spool);
    wait_until("the queued job", Duration::from_secs(30), || c.get(job).1["state"] == "queued");
    stage.store(1, Ordering::SeqCst);
    wait_until("the pending job", Duration::from_secs(30), || c.get(job).1["state"] == "preparing");
    let _ = first.0.kill();
    let _ = first.0.wait();
    stage.store(2, Ordering::SeqCst);
    let _second = adapter(&c.endpoint(), &endpoint, &spool);
    wait_until("the job to be done", Duration::from_secs(30), || c.get(job).1["state"] == "done");

    let (_, j) = c.get(job);
    assert_eq!(j["outcome"], "succeeded");
    assert_eq!(
        (j["gpu_count"].as_u64(), j["gpu_class"].as_str(), j["region"].as_str()),
        (Some(16), Some("h100"), Some("europe-west4"))
    );
    let m = &j["timeline"]["milestones"];
    assert_eq!(m["submitted"], "2026-11-30T01:00:00.250Z");
    assert_eq!(m["first_queued"], "2026-11-30T01:00:00.250Z", "first state seen is dated at createTime");
    assert_eq!(m["first_step"], "2026-11-30T01:20:30.000Z");
    assert_eq!(m["done"], "2026-11-30T03:00:00.500Z");
    assert_eq!(j["time_to_first_step_seconds"].as_f64(), Some(1229.75));
    let w = &j["timeline"]["initial_wait_seconds"];
    let total: f64 = w.as_object().expect("segments").values().filter_map(|v| v.as_f64()).sum();
    assert!((total - 1229.75).abs() < 1e-6 && w["queued:capacity"].is_number(), "{w}");
    let ids: Vec<&str> =
        j["events"].as_array().expect("events").iter().filter_map(|e| e["event_id"].as_str()).collect();
    assert_eq!(ids.len(), 5, "submitted, queued, pending, first step, done, each once: {ids:?}");

    let failed = "/api/v1/jobs/vertex/ml-prod/europe-west4/998877";
    wait_until("the failed job", Duration::from_secs(30), || c.get(failed).1["state"] == "done");
    let (_, f) = c.get(failed);
    assert_eq!((f["outcome"].as_str(), f["priority"].as_str()), (Some("failed"), Some("urgent")));

    let seen = seen.lock().expect("seen").clone();
    assert!(
        seen.iter().all(|(p, a)| p.starts_with("/v1/projects/ml-prod/locations/europe-west4/customJobs")
            && a == "Bearer ya29.test-token"),
        "{seen:?}"
    );
}
