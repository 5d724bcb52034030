//! The SageMaker adapter's real client (SigV4-signed AWS JSON 1.1 over HTTP) against a local server that
//! replays `ListTrainingJobs` and `DescribeTrainingJob` answers in SageMaker's documented format (no AWS here).
//! A job's description moves from in progress to completed across polls, the adapter is killed and restarted
//! in between, and the collector's timeline must hold every transition exactly once at SageMaker's times.
//! Every third call is throttled (`ThrottlingException`, as SageMaker answers a rate limit): each throttled call
//! is retried on its own, so no poll fails (the adapter's metrics say so).

use startline_tests::{binary, serve_http, wait_until, workspace_root, ChildGuard, Collector};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn fixture(name: &str) -> serde_json::Value {
    let p = workspace_root().join("agent/src/provider/fixtures").join(name);
    serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("json")
}

/// Replays SageMaker: the completed job is shown in progress (first four transitions) until `complete` is set.
fn replay_server(complete: Arc<AtomicBool>, seen_auth: Arc<Mutex<Vec<String>>>) -> std::net::SocketAddr {
    let done_job = fixture("sagemaker-describe-completed.json");
    let failed_job = fixture("sagemaker-describe-failed.json");
    let calls = std::sync::atomic::AtomicUsize::new(0);
    serve_http(move |r| {
        if calls.fetch_add(1, Ordering::SeqCst) % 3 == 2 {
            let throttled = serde_json::json!({"__type": "ThrottlingException", "message": "Rate exceeded"});
            return (400, "application/x-amz-json-1.1", throttled.to_string());
        }
        let req: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
        if let Ok(mut a) = seen_auth.lock() {
            a.push(r.header("authorization").unwrap_or("").to_string());
        }
        let answer = match r.header("x-amz-target").unwrap_or("") {
            "SageMaker.ListTrainingJobs" => serde_json::json!({"TrainingJobSummaries": [
                {"TrainingJobName": done_job["TrainingJobName"], "TrainingJobStatus": "InProgress", "CreationTime": done_job["CreationTime"]},
                {"TrainingJobName": failed_job["TrainingJobName"], "TrainingJobStatus": "Failed", "CreationTime": failed_job["CreationTime"]}
            ]}),
            "SageMaker.DescribeTrainingJob" if req["TrainingJobName"] == failed_job["TrainingJobName"] => {
                failed_job.clone()
            }
            "SageMaker.DescribeTrainingJob" if complete.load(Ordering::SeqCst) => done_job.clone(),
            "SageMaker.DescribeTrainingJob" => {
                let mut j = done_job.clone();
                j["TrainingJobStatus"] = "InProgress".into();
                j["SecondaryStatus"] = "Downloading".into();
                if let Some(o) = j.as_object_mut() {
                    o.remove("TrainingEndTime");
                }
                if let Some(t) = j["SecondaryStatusTransitions"].as_array_mut() {
                    t.truncate(4);
                }
                j
            }
            _ => serde_json::json!({"__type": "UnknownOperationException"}),
        };
        (200, "application/x-amz-json-1.1", answer.to_string())
    })
}

fn adapter(collector: &str, endpoint: &str, spool: &std::path::Path, metrics: u16) -> ChildGuard {
    ChildGuard(
        Command::new(binary("startline-agent"))
            .args([
                "--collector",
                collector,
                "sagemaker",
                "--metrics-listen",
                &format!("127.0.0.1:{metrics}"),
                "--interval",
                "1s",
                "--namespace",
                "123456789012",
                "--urgent-prefix",
                "urgent-",
            ])
            .args(["--endpoint", endpoint, "--region", "us-east-1"])
            .arg("--spool")
            .arg(spool)
            .env("AWS_ACCESS_KEY_ID", "AKIDTEST")
            .env("AWS_SECRET_ACCESS_KEY", "secret")
            .env_remove("AWS_SESSION_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("adapter"),
    )
}

#[test]
fn sagemaker_jobs_are_followed_through_a_replayed_api_across_an_adapter_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let complete = Arc::new(AtomicBool::new(false));
    let auths = Arc::new(Mutex::new(Vec::new()));
    let addr = replay_server(complete.clone(), auths.clone());
    let endpoint = format!("http://{addr}");
    let spool = dir.path().join("spool");
    let job = "/api/v1/jobs/sagemaker/123456789012/llm-finetune-2026-11-30-01";

    let mut first = adapter(&c.endpoint(), &endpoint, &spool, startline_tests::free_port());
    wait_until("the in-progress view", Duration::from_secs(30), || {
        c.get(job).1["timeline"]["milestones"]["preparing"].is_string()
    });
    let (_, partial) = c.get(job);
    assert_eq!(partial["state"], "preparing");
    // Restart the adapter; the job completes meanwhile.
    let _ = first.0.kill();
    let _ = first.0.wait();
    complete.store(true, Ordering::SeqCst);
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], startline_tests::free_port()));
    let _second = adapter(&c.endpoint(), &endpoint, &spool, metrics.port());
    wait_until("the job to be done", Duration::from_secs(30), || c.get(job).1["state"] == "done");

    let (_, j) = c.get(job);
    let t = &j["timeline"];
    assert_eq!(j["outcome"], "succeeded");
    assert_eq!(j["pool_kind"], "managed");
    assert_eq!(j["gpu_count"], 16);
    assert_eq!(t["milestones"]["submitted"], "2026-11-30T00:53:20.123Z");
    let w = &t["initial_wait_seconds"];
    assert_eq!(w["preparing:provisioning"].as_f64(), Some(299.5));
    assert_eq!(w["queued:capacity"].as_f64(), Some(300.0));
    assert_eq!(w["preparing:image_pull"].as_f64(), Some(120.0));
    assert_eq!(w["preparing:data_staging"].as_f64(), Some(180.0));
    assert_eq!(j["time_to_first_step_seconds"].as_f64(), Some(899.877));
    assert_eq!((t["preemptions"].as_u64(), t["attempts"].as_u64()), (Some(1), Some(2)));
    assert_eq!(t["requeue_wait_seconds"].as_f64(), Some(500.0));
    let ids: Vec<&str> =
        j["events"].as_array().expect("events").iter().filter_map(|e| e["event_id"].as_str()).collect();
    assert_eq!(ids.len(), 10, "each transition exactly once across the restart: {ids:?}");

    let failed = "/api/v1/jobs/sagemaker/123456789012/urgent-fix-7";
    wait_until("the failed job", Duration::from_secs(30), || c.get(failed).1["state"] == "done");
    let (_, f) = c.get(failed);
    assert_eq!((f["outcome"].as_str(), f["priority"].as_str()), (Some("failed"), Some("urgent")));
    let done =
        f["events"].as_array().and_then(|e| e.iter().find(|x| x["kind"] == "done").cloned()).expect("done event");
    assert!(done["detail"]["message"].as_str().is_some_and(|m| m.starts_with("CapacityError")));
    assert!(f["timeline"]["initial_wait_seconds"]["queued:capacity"].as_f64().is_some_and(|s| s == 3500.0));

    // Throttled calls were retried one by one: not one poll failed.
    let scrape = || startline_tests::http_get_text(metrics, "/metrics").1;
    wait_until("a retried call", Duration::from_secs(30), || {
        startline_agent::metrics::sample(
            &scrape(),
            "startline_agent_provider_call_retries_total",
            &[("provider", "sagemaker"), ("kind", "throttled")],
        )
        .is_some_and(|n| n > 0.0)
    });
    let text = scrape();
    let polls_failed = ["throttled", "http_status", "transport"].iter().map(|k| {
        startline_agent::metrics::sample(
            &text,
            "startline_agent_poll_errors_total",
            &[("provider", "sagemaker"), ("kind", k)],
        )
    });
    assert!(polls_failed.into_iter().all(|n| n == Some(0.0)), "{text}");

    // Every call was SigV4-signed for SageMaker in us-east-1 with the configured key.
    let auths = auths.lock().expect("auths").clone();
    assert!(!auths.is_empty());
    for a in auths {
        assert!(a.starts_with("AWS4-HMAC-SHA256 Credential=AKIDTEST/"), "{a}");
        assert!(a.contains("/us-east-1/sagemaker/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature="), "{a}");
    }
}
