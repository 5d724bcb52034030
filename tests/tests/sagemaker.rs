//! The SageMaker adapter's real client (SigV4-signed AWS JSON 1.1 over HTTP) against a local server that
//! replays `ListTrainingJobs` and `DescribeTrainingJob` answers in SageMaker's documented format (no AWS here).
//! A job's description moves from in progress to completed across polls, the adapter is killed and restarted
//! in between, and the collector's timeline must hold every transition exactly once at SageMaker's times.
//! Every third call is throttled (`ThrottlingException`, as SageMaker answers a rate limit): each throttled call
//! is retried on its own, so no poll fails (the adapter's metrics say so).

use startline_tests::{binary, post_events, serve_http, wait_until, workspace_root, ChildGuard, Collector, NodeAgent};
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

/// A SageMaker training job in progress, dated from `created` (Unix seconds): Starting at creation, Pending (a
/// capacity wait) at +300 s, the image download at +600 s, the data download at +720 s, Training (the container
/// starts) at +900 s.
fn in_training(name: &str, created: i64) -> serde_json::Value {
    let at = |s: i64| serde_json::json!(created + s);
    serde_json::json!({
        "TrainingJobName": name,
        "TrainingJobStatus": "InProgress",
        "SecondaryStatus": "Training",
        "CreationTime": at(0),
        "TrainingStartTime": at(900),
        "ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 1, "VolumeSizeInGB": 500},
        "SecondaryStatusTransitions": [
            {"Status": "Starting", "StartTime": at(0), "StatusMessage": "Launching requested ML instances"},
            {"Status": "Pending", "StartTime": at(300), "StatusMessage": "Insufficient capacity. Waiting for capacity"},
            {"Status": "Downloading", "StartTime": at(600), "StatusMessage": "Downloading the training image..."},
            {"Status": "Downloading", "StartTime": at(720), "StatusMessage": "Downloading input data"},
            {"Status": "Training", "StartTime": at(900), "StatusMessage": "Training image download completed. Training in progress."}
        ]
    })
}

/// The training process's own first step, sent with `startline-agent emit` through the node agent (as the
/// training-loop library will), `occurred_at` in Unix seconds; no `origin`: the endpoint's default, the training
/// process.
fn trainer_first_step(node: &NodeAgent, job_id: &str, at_s: i64) {
    let out = Command::new(binary("startline-agent"))
        .args([
            "emit",
            "first_step",
            "--agent",
            &format!("http://{}", node.addr),
            "--job",
            job_id,
            "--retry-for",
            "20s",
        ])
        .args(["-f", "step=1", "-f", &format!("occurred_at={at_s}")])
        .output()
        .expect("emit");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The lie this fixes: SageMaker has no node agent, so its adapter reports the container's start as the first
/// step. Here the training process reports its real first step five minutes after the container started: that
/// one is the job's first step (time to first step, SLOs, the comparison), the container start becomes the start
/// of `preparing:environment`, and no second first step appears, whichever of the two arrives first (job `a`: the
/// adapter's first; job `b`: the trainer's, before the adapter ever saw the job). A dedicated job reported by its
/// node agent is compared against them. Every figure below is worked out by hand from the times the test sets.
#[test]
fn a_training_process_first_step_supersedes_the_sagemaker_container_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let node = NodeAgent::start(&[&c.endpoint()], &dir.path().join("node-spool"));
    // Whole seconds, an hour ago: the job was created at `t0`, its container started at t0 + 900 s, its training
    // loop completed step 1 at t0 + 1200 s.
    let t0 = startline_proto::time::now_ms() / 1000 - 3600;
    let (a, b) = ("llm-origin-a", "llm-origin-b");
    let id = |name: &str| format!("sagemaker/123456789012/{name}");
    let api = |name: &str| format!("/api/v1/jobs/{}", id(name));

    // Job b: the trainer's first step arrives before the adapter has seen the job.
    trainer_first_step(&node, &id(b), t0 + 1200);
    wait_until("b's first step, held until its submitted", Duration::from_secs(30), || {
        c.get(&api(b)).1["state"] == "unsubmitted"
    });

    // A dedicated job, reported by its node agent: submitted at t0, its first step 600 s later.
    let slurm = "slurm/cluster-a/4242";
    let body = serde_json::json!({"events": [
        {"kind": "submitted", "job_id": slurm, "occurred_at": t0, "pool_kind": "dedicated", "provider": "slurm",
         "pool": "a100", "priority": "normal", "gpu_class": "a100-80g", "gpu_count": 8},
        {"kind": "first_step", "job_id": slurm, "occurred_at": t0 + 600, "step": 1}
    ]});
    assert_eq!(post_events(node.addr, &body.to_string()).0, 202);

    // The adapter follows both SageMaker jobs, each with its container started at t0 + 900 s.
    let jobs = [in_training(a, t0), in_training(b, t0)];
    let addr = serve_http(move |r| {
        let req: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
        let answer = match r.header("x-amz-target").unwrap_or("") {
            "SageMaker.ListTrainingJobs" => {
                serde_json::json!({"TrainingJobSummaries": jobs.iter().map(|j| serde_json::json!(
                {"TrainingJobName": j["TrainingJobName"], "TrainingJobStatus": "InProgress", "CreationTime": j["CreationTime"]}
            )).collect::<Vec<_>>()})
            }
            "SageMaker.DescribeTrainingJob" => {
                jobs.iter().find(|j| j["TrainingJobName"] == req["TrainingJobName"]).cloned().unwrap_or_default()
            }
            _ => serde_json::json!({"__type": "UnknownOperationException"}),
        };
        (200, "application/x-amz-json-1.1", answer.to_string())
    });
    let _adapter =
        adapter(&c.endpoint(), &format!("http://{addr}"), &dir.path().join("spool"), startline_tests::free_port());
    wait_until("both containers started", Duration::from_secs(30), || {
        [a, b].iter().all(|n| c.get(&api(n)).1["state"] == "running")
    });

    // Job a, before its trainer reported: the container start is its first step, and says so.
    let (_, ja) = c.get(&api(a));
    assert_eq!(ja["first_step_origin"], "container_start");
    assert_eq!(ja["time_to_first_step_seconds"].as_f64(), Some(900.0));
    let compare = "/api/v1/compare?left=pool_kind%3Dmanaged&right=pool_kind%3Ddedicated&window=7d";
    let (_, cmp) = c.get(compare);
    let g = &cmp["groups"][0];
    assert_eq!(g["left"]["first_step_sources"]["container_start"], 1);
    assert_eq!(g["left"]["first_step_sources"]["training_process"], 1, "b's trainer");
    assert_eq!(g["difference"]["first_step_sources_differ"], true, "container start vs the dedicated trainer");

    // Job a's trainer reports, five minutes after its container started.
    trainer_first_step(&node, &id(a), t0 + 1200);
    wait_until("a's trainer first step", Duration::from_secs(30), || {
        c.get(&api(a)).1["first_step_origin"] == "training_process"
    });

    for name in [a, b] {
        let (_, j) = c.get(&api(name));
        let t = &j["timeline"];
        assert_eq!(j["state"], "running", "{name}");
        assert_eq!(j["first_step_origin"], "training_process", "{name}");
        // 1200 s from creation to the trainer's step 1, not the 900 s to the container's start.
        assert_eq!(j["time_to_first_step_seconds"].as_f64(), Some(1200.0), "{name}");
        assert_eq!(t["runs"].as_u64(), Some(1), "{name}: one run, no second first step");
        let w = &t["initial_wait_seconds"];
        let split: Vec<(&str, f64)> = [
            "preparing:provisioning",
            "queued:capacity",
            "preparing:image_pull",
            "preparing:data_staging",
            "preparing:environment",
        ]
        .iter()
        .map(|k| (*k, w[*k].as_f64().unwrap_or(-1.0)))
        .collect();
        assert_eq!(
            split,
            vec![
                ("preparing:provisioning", 300.0),
                ("queued:capacity", 300.0),
                ("preparing:image_pull", 120.0),
                ("preparing:data_staging", 180.0),
                ("preparing:environment", 300.0),
            ],
            "{name}: the five minutes after the container start are preparing"
        );
        let firsts: Vec<&str> = j["events"]
            .as_array()
            .expect("events")
            .iter()
            .filter(|e| e["kind"] == "first_step")
            .filter_map(|e| e["detail"]["origin"].as_str())
            .collect();
        assert_eq!(firsts, ["container_start", "training_process"], "{name}: both stored, in time order");
    }

    // The comparison: three trainers' first steps, by hand: managed 1200 s and 1200 s, dedicated 600 s.
    let (_, cmp) = c.get(compare);
    let g = &cmp["groups"][0];
    let sources = |side: &str| {
        let s = &g[side]["first_step_sources"];
        ["training_process", "container_start", "scheduler_start", "unspecified"].map(|k| s[k].as_u64())
    };
    assert_eq!(sources("left"), [Some(2), Some(0), Some(0), Some(0)]);
    assert_eq!(sources("right"), [Some(1), Some(0), Some(0), Some(0)]);
    assert_eq!(g["difference"]["first_step_sources_differ"], false);
    assert_eq!(g["left"]["ttfs_seconds"]["max"].as_f64(), Some(1200.0));
    assert_eq!(g["left"]["ttfs_seconds"]["p50"]["value"].as_f64(), Some(1200.0));
    assert_eq!(g["right"]["ttfs_seconds"]["p50"]["value"].as_f64(), Some(600.0));
    // The normal-start SLO (2 h) judges all three good, and counts where their first steps came from.
    let (_, slo) = c.get("/api/v1/slos/normal-start?window=7d");
    let s = &slo["status"];
    assert_eq!((s["good"].as_u64(), s["bad"].as_u64()), (Some(3), Some(0)));
    assert_eq!(s["first_step_sources"]["training_process"], 3);
    assert_eq!(s["first_step_sources"]["container_start"], 0);
    assert_eq!(s["time_to_first_step_seconds"]["max"].as_f64(), Some(1200.0));
}
