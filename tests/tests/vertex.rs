//! The Vertex AI adapter's real client (v1 REST with a bearer token) against a local server that replays
//! CustomJob list answers in Vertex's documented format (no Google Cloud here). The job is queued, then
//! pending, then succeeded across polls; the adapter is restarted in between; the collector's timeline holds
//! each transition once at Vertex's times. Job ids carry the configured project, not the number in resource
//! names. The server honours the adapter's `update_time>"..."` filter (the first poll looks back 2 days, later
//! ones only to the last poll) and throttles every third request with Google's 429 `RESOURCE_EXHAUSTED`: each is
//! retried on its own, so no poll fails.

use startline_tests::{binary, serve_http, wait_until, workspace_root, ChildGuard, Collector};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn fixture(name: &str) -> serde_json::Value {
    let p = workspace_root().join("agent/src/provider/fixtures").join(name);
    serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("json")
}

/// The `filter` query parameter, percent-decoded.
fn filter_of(path: &str) -> Option<String> {
    let q = path.split_once('?')?.1;
    let raw = q.split('&').find_map(|kv| kv.strip_prefix("filter="))?;
    let bytes = raw.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                out.push(u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn rfc3339_ms(s: &str) -> Option<i64> {
    let t = humantime::parse_rfc3339_weak(s).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as i64)
}

/// Serves the job as QUEUED while `stage` is 0, PENDING at 1, and as the fixture (SUCCEEDED) from 2, its
/// `updateTime` the moment its stage last changed; lists only jobs updated after the filter's time.
fn replay_server(stage: Arc<AtomicUsize>, seen: Arc<Mutex<Vec<(String, String)>>>) -> std::net::SocketAddr {
    let ok = fixture("vertex-customjob-succeeded.json");
    let mut failed = fixture("vertex-customjob-failed.json");
    // Its last update is "now" for the replay: the fixture's own updateTime is a fixed day, which the adapter's
    // first poll (looking back 2 days) stops listing two days later.
    failed["updateTime"] =
        humantime::format_rfc3339_millis(std::time::SystemTime::now() - Duration::from_secs(60)).to_string().into();
    let calls = AtomicUsize::new(0);
    let changed: Mutex<(usize, i64)> = Mutex::new((0, startline_proto::time::now_ms()));
    serve_http(move |r| {
        if let Ok(mut s) = seen.lock() {
            s.push((r.path.clone(), r.header("authorization").unwrap_or("").to_string()));
        }
        if calls.fetch_add(1, Ordering::SeqCst) % 3 == 2 {
            let e = serde_json::json!({"error": {"code": 429, "message": "Quota exceeded for aiplatform.googleapis.com/online_prediction_requests_per_base_model", "status": "RESOURCE_EXHAUSTED"}});
            return (429, "application/json", e.to_string());
        }
        let now_stage = stage.load(Ordering::SeqCst);
        let updated = {
            let mut c = changed.lock().expect("lock");
            if c.0 != now_stage {
                *c = (now_stage, startline_proto::time::now_ms());
            }
            c.1
        };
        let mut job = ok.clone();
        let state = match now_stage {
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
        let stamp = humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(updated as u64));
        job["updateTime"] = stamp.to_string().into();
        let since = filter_of(&r.path)
            .and_then(|f| f.strip_prefix("update_time>\"").and_then(|t| t.strip_suffix('"')).and_then(rfc3339_ms));
        let Some(since) = since else {
            return (400, "application/json", r#"{"error": {"code": 400, "status": "INVALID_ARGUMENT"}}"#.to_string());
        };
        let listed: Vec<&serde_json::Value> = [&job, &failed]
            .into_iter()
            .filter(|j| j["updateTime"].as_str().and_then(rfc3339_ms).is_some_and(|u| u > since))
            .collect();
        (200, "application/json", serde_json::json!({"customJobs": listed}).to_string())
    })
}

fn adapter(collector: &str, endpoint: &str, spool: &std::path::Path, metrics: u16) -> ChildGuard {
    ChildGuard(
        Command::new(binary("startline-agent"))
            .args([
                "--collector",
                collector,
                "vertex",
                "--metrics-listen",
                &format!("127.0.0.1:{metrics}"),
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

    let mut first = adapter(&c.endpoint(), &endpoint, &spool, startline_tests::free_port());
    wait_until("the queued job", Duration::from_secs(30), || c.get(job).1["state"] == "queued");
    stage.store(1, Ordering::SeqCst);
    wait_until("the pending job", Duration::from_secs(30), || c.get(job).1["state"] == "preparing");
    let _ = first.0.kill();
    let _ = first.0.wait();
    stage.store(2, Ordering::SeqCst);
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], startline_tests::free_port()));
    let _second = adapter(&c.endpoint(), &endpoint, &spool, metrics.port());
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
    // Bounded listing: the first request looks back the default 2 days; the last only to the previous poll
    // (minus the 10-minute overlap).
    let now = startline_proto::time::now_ms();
    let since: Vec<i64> = seen
        .iter()
        .filter_map(|(p, _)| filter_of(p))
        .filter_map(|f| f.strip_prefix("update_time>\"").and_then(|t| t.strip_suffix('"')).and_then(rfc3339_ms))
        .collect();
    assert_eq!(since.len(), seen.len(), "every list request is filtered: {seen:?}");
    let first = since[0];
    let last = since[since.len() - 1];
    assert!((now - first - 2 * 86_400_000).abs() < 600_000, "first poll: 2 days back, got {}", now - first);
    assert!(now - last < 11 * 60_000, "later polls: since the last poll, got {} ms back", now - last);

    // Every third request was throttled and retried on its own: not one poll failed.
    let scrape = || startline_tests::http_get_text(metrics, "/metrics").1;
    wait_until("a retried call", Duration::from_secs(30), || {
        startline_agent::metrics::sample(
            &scrape(),
            "startline_agent_provider_call_retries_total",
            &[("provider", "vertex"), ("kind", "throttled")],
        )
        .is_some_and(|n| n > 0.0)
    });
    let text = scrape();
    for k in ["throttled", "http_status", "transport"] {
        let n = startline_agent::metrics::sample(
            &text,
            "startline_agent_poll_errors_total",
            &[("provider", "vertex"), ("kind", k)],
        );
        assert_eq!(n, Some(0.0), "{k}: {text}");
    }
}
