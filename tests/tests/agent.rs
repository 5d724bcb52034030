//! The node agent: durable spool across a collector outage and a `kill -9` of the agent (every event reaches
//! the collector exactly once in its view), `emit` for scripts, JSON errors, the docs' standard-library
//! Python training-loop snippet run against a real agent, and exactly-once for retries: every event kind posted
//! three times as the same bytes (without `occurred_at`), `emit` retrying through lost answers, and `emit`
//! re-run with `--event-id`, each stored once.

use startline_tests::{binary, free_port, http_get, path_escape, wait_until, workspace_root, Collector, NodeAgent};

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

fn start_agent(collector: &str, spool: &std::path::Path) -> NodeAgent {
    NodeAgent::start(&[collector], spool)
}

fn post(addr: SocketAddr, body: &str) -> (u16, serde_json::Value) {
    startline_tests::post_events(addr, body)
}

#[test]
fn spooled_events_survive_a_collector_outage_and_kill_9_and_arrive_exactly_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let grpc_port = free_port();
    let collector_uri = format!("http://127.0.0.1:{grpc_port}");
    let spool = dir.path().join("spool");
    let agent = start_agent(&collector_uri, &spool);

    // The collector is down. Events are still accepted: they are on disk.
    let now = startline_proto::time::now_ms() as f64 / 1000.0;
    for j in 0..3 {
        let job = format!("slurm/c1/{j}");
        let events = serde_json::json!({"events": [
            {"kind": "submitted", "job_id": job, "occurred_at": now - 600.0, "pool_kind": "dedicated", "provider": "slurm", "pool": "gpu", "priority": "urgent", "gpu_count": 8},
            {"kind": "queued", "job_id": job, "occurred_at": now - 590.0, "reason": "capacity", "raw_reason": "Resources"},
            {"kind": "preparing", "job_id": job, "occurred_at": now - 300.0, "phase": "image_pull"},
            {"kind": "first_step", "job_id": job, "occurred_at": now - 200.0, "step": 1},
        ]});
        let (status, body) = post(agent.addr, &events.to_string());
        assert_eq!(status, 202, "{body}");
    }
    // `emit`, as a Slurm epilog would call it, with the job id from Slurm's environment.
    for j in 0..3 {
        let out = Command::new(binary("startline-agent"))
            .args([
                "emit",
                "done",
                "--agent",
                &format!("http://{}", agent.addr),
                "-f",
                "outcome=succeeded",
                "-f",
                "exit_code=0",
            ])
            .env("SLURM_JOB_ID", j.to_string())
            .env("SLURM_CLUSTER_NAME", "c1")
            .output()
            .expect("emit");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    // Bad input: a JSON error naming the field; nothing spooled.
    let (status, body) = post(agent.addr, r#"{"kind": "preparing", "job_id": "x", "phase": "compiling"}"#);
    assert_eq!(status, 400);
    assert!(body["error"].as_str().is_some_and(|e| e.starts_with("events[0].phase")), "{body}");
    assert_eq!(http_get(agent.addr, "/v1/spool").1["events"], 15);

    // kill -9 the agent, restart it on the same spool, then bring the collector up.
    let mut agent = agent;
    let _ = agent.child.kill();
    let _ = agent.child.wait();
    let agent = start_agent(&collector_uri, &spool);
    let c = Collector::start_on(&dir.path().join("db"), &format!("127.0.0.1:{grpc_port}"), &[]);
    wait_until("the spool to drain", Duration::from_secs(60), || http_get(agent.addr, "/v1/spool").1["events"] == 0);
    for j in 0..3 {
        let (status, job) = c.get(&format!("/api/v1/jobs/{}", path_escape(&format!("slurm/c1/{j}"))));
        assert_eq!(status, 200);
        let ids: Vec<&str> =
            job["events"].as_array().expect("events").iter().filter_map(|e| e["event_id"].as_str()).collect();
        assert_eq!(ids.len(), 5, "exactly once: {ids:?}");
        assert_eq!(job["state"], "done");
        assert_eq!(job["time_to_first_step_seconds"].as_f64(), Some(400.0));
    }
}

#[test]
fn python_standard_library_training_loop_reports_through_a_real_agent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let agent = start_agent(&c.endpoint(), &dir.path().join("spool"));
    let job = "kubernetes/ml/train-7";
    // The scheduler side (normally an adapter) says the job was submitted a minute ago.
    let sub = serde_json::json!({"kind": "submitted", "job_id": job, "occurred_at": startline_proto::time::now_ms() as f64 / 1000.0 - 60.0,
        "pool_kind": "dedicated", "provider": "kubernetes", "pool": "a100-queue", "priority": "normal", "gpu_count": 8});
    assert_eq!(post(agent.addr, &sub.to_string()).0, 202);
    let out = Command::new("python3")
        .arg(workspace_root().join("tests/python/train_loop.py"))
        .env("STARTLINE_AGENT", format!("http://{}", agent.addr))
        .env("STARTLINE_JOB_ID", job)
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Every event of the run (1 submitted + 8 from the loop) has arrived, not only the final one.
    wait_until("all of the job's events", Duration::from_secs(30), || {
        c.get(&format!("/api/v1/jobs/{job}")).1["events"].as_array().map_or(0, Vec::len) == 9
    });
    let (_, j) = c.get(&format!("/api/v1/jobs/{job}"));
    let t = &j["timeline"];
    assert_eq!(t["milestones"]["last_checkpoint"]["step"], 300, "{j:#}");
    assert!(t["initial_wait_seconds"]["preparing:data_staging"].as_f64().is_some_and(|s| s >= 0.2));
    assert!(t["initial_wait_seconds"]["preparing:environment"].as_f64().is_some_and(|s| s >= 0.2));
    let ttfs = j["time_to_first_step_seconds"].as_f64().expect("ttfs");
    assert!((60.0..120.0).contains(&ttfs), "{ttfs}");
    assert_eq!(j["outcome"], "succeeded");
    assert_eq!(j["events"].as_array().map(Vec::len), Some(1 + 1 + 2 + 1 + 3 + 1));
}

/// `emit`'s arguments for one event of every kind the node agent accepts (`nodes=1001` and `cost_center=42`:
/// values that look like numbers where the protocol has text).
fn every_kind_for_emit() -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        (
            "submitted",
            vec![
                "pool_kind=dedicated",
                "provider=slurm",
                "pool=gpu",
                "priority=urgent",
                "gpu_count=8",
                "labels.team=vision",
                "labels.stage=pretrain",
                "labels.owner=ana",
                "labels.cost_center=42",
            ],
        ),
        ("queued", vec!["reason=capacity", "raw_reason=Resources"]),
        ("node_assigned", vec!["nodes=1001,1002", "gpu_ids=0,1"]),
        ("preparing", vec!["phase=image_pull"]),
        ("first_step", vec!["step=1"]),
        ("checkpoint", vec!["step=100", "uri=s3://ckpt/100", "save_seconds=2.5"]),
        ("preempted", vec!["reason=spot", "checkpoint_saved=true"]),
        ("requeued", vec!["resume_step=100", "attempt=2"]),
        ("restarted", vec!["resume_step=100", "attempt=2"]),
        ("node_lost", vec!["node=1002", "message=xid 79"]),
        ("done", vec!["outcome=succeeded", "exit_code=0"]),
    ]
}

/// The same kinds as endpoint JSON, without `occurred_at` (the agent stamps each arrival).
fn every_kind_as_json(job: &str) -> Vec<serde_json::Value> {
    use serde_json::json;
    vec![
        json!({"kind": "submitted", "job_id": job, "pool_kind": "dedicated", "provider": "slurm", "pool": "gpu",
               "priority": "urgent", "gpu_count": 8,
               "labels": {"team": "vision", "stage": "pretrain", "owner": "ana", "cost_center": "42"}}),
        json!({"kind": "queued", "job_id": job, "reason": "capacity", "raw_reason": "Resources"}),
        json!({"kind": "node_assigned", "job_id": job, "nodes": ["1001", "1002"], "gpu_ids": ["0", "1"]}),
        json!({"kind": "preparing", "job_id": job, "phase": "image_pull"}),
        json!({"kind": "first_step", "job_id": job, "step": 1}),
        json!({"kind": "checkpoint", "job_id": job, "step": 100, "uri": "s3://ckpt/100", "save_seconds": 2.5}),
        json!({"kind": "preempted", "job_id": job, "reason": "spot", "checkpoint_saved": true}),
        json!({"kind": "requeued", "job_id": job, "resume_step": 100, "attempt": 2}),
        json!({"kind": "restarted", "job_id": job, "resume_step": 100, "attempt": 2}),
        json!({"kind": "node_lost", "job_id": job, "node": "1002", "message": "xid 79"}),
        json!({"kind": "done", "job_id": job, "outcome": "succeeded", "exit_code": 0}),
    ]
}

fn stored_events(c: &Collector, job: &str) -> Vec<String> {
    let (_, j) = c.get(&format!("/api/v1/jobs/{}", path_escape(job)));
    j["events"].as_array().map_or_else(Vec::new, |a| {
        a.iter().filter_map(|e| Some(format!("{} {}", e["kind"].as_str()?, e["event_id"].as_str()?))).collect()
    })
}

fn emit(agent: &str, job: &str, kind: &str, fields: &[&str], extra: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(binary("startline-agent"));
    cmd.args(["emit", kind, "--agent", agent, "--job", job, "--retry-for", "20s"]).args(extra);
    for f in fields {
        cmd.args(["-f", f]);
    }
    cmd.output().expect("emit")
}

#[test]
fn every_kind_retried_three_times_with_identical_bytes_is_stored_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let agent = start_agent(&c.endpoint(), &dir.path().join("spool"));
    let kinds = every_kind_for_emit().len();

    // 1. Posts without occurred_at (stamped on arrival), each sent three times as the same bytes.
    let posted = "slurm/c1/posted";
    for body in every_kind_as_json(posted) {
        let bytes = body.to_string();
        for _ in 0..3 {
            let (status, answer) = post(agent.addr, &bytes);
            assert_eq!(status, 202, "{bytes}: {answer}");
            std::thread::sleep(Duration::from_millis(5)); // a later arrival, a later stamp
        }
    }
    // ... and a batch with every kind, three times.
    let batched = "slurm/c1/batched";
    let batch = serde_json::json!({"events": every_kind_as_json(batched)}).to_string();
    for _ in 0..3 {
        assert_eq!(post(agent.addr, &batch).0, 202);
        std::thread::sleep(Duration::from_millis(5));
    }

    let stored_once = |jobs: &[&str]| {
        wait_until("the spool to drain", Duration::from_secs(60), || {
            http_get(agent.addr, "/v1/spool").1["events"] == 0
        });
        for job in jobs {
            wait_until("the job's events", Duration::from_secs(10), || stored_events(&c, job).len() >= kinds);
            let events = stored_events(&c, job);
            assert_eq!(events.len(), kinds, "{job}: each kind stored once: {events:#?}");
            let (_, j) = c.get(&format!("/api/v1/jobs/{}", path_escape(job)));
            assert_eq!(j["timeline"]["preemptions"], 1, "{job}: {j:#}");
            assert_eq!(j["state"], "done", "{job}");
        }
    };
    stored_once(&[posted, batched]);

    // 2. `emit` through a proxy that hands every attempt to the agent but answers the first two of every three
    // with 503, as a lost answer would: emit retries, and every attempt must carry the same bytes.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Vec<u8>>::new()));
    let record = seen.clone();
    let real = agent.addr;
    let proxy = startline_tests::serve_http(move |req| {
        let body = String::from_utf8_lossy(&req.body).to_string();
        let (status, answer) = post(real, &body);
        let n = record.lock().map(|mut g| {
            g.push(req.body.clone());
            g.len()
        });
        match n {
            Ok(n) if n % 3 == 0 => (status, "application/json", answer.to_string()),
            _ => (503, "application/json", r#"{"error": "lost answer"}"#.to_string()),
        }
    });
    let emitted = "slurm/c1/emitted";
    for (kind, fields) in every_kind_for_emit() {
        let out = emit(&format!("http://{proxy}"), emitted, kind, &fields, &[]);
        assert!(out.status.success(), "emit {kind}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let attempts = seen.lock().expect("attempts").clone();
    assert_eq!(attempts.len(), 3 * kinds, "three attempts per emit");
    for (i, three) in attempts.chunks(3).enumerate() {
        assert!(three.iter().all(|b| b == &three[0]), "emit #{i} retried with other bytes");
        let v: serde_json::Value = serde_json::from_slice(&three[0]).expect("json");
        assert!(v["occurred_at"].is_string() && v["event_id"].is_string(), "stamped once: {v}");
    }

    // 3. A script that runs the whole `emit` again passes --event-id: every re-run is a duplicate.
    let rerun = "slurm/c1/rerun";
    let agent_uri = format!("http://{}", agent.addr);
    for (kind, fields) in every_kind_for_emit() {
        for _ in 0..3 {
            let id = format!("rerun-{kind}");
            let out = emit(&agent_uri, rerun, kind, &fields, &["--event-id", &id]);
            assert!(out.status.success(), "emit {kind}: {}", String::from_utf8_lossy(&out.stderr));
        }
    }

    stored_once(&[emitted, rerun]);
    let (_, j) = c.get(&format!("/api/v1/jobs/{}", path_escape(emitted)));
    let assigned = j["events"].as_array().and_then(|a| a.iter().find(|e| e["kind"] == "node_assigned")).cloned();
    assert!(assigned.is_some_and(|e| e.to_string().contains("1001")), "nodes=1001 arrived as a node name: {j:#}");
}
