//! The node agent: durable spool across a collector outage and a `kill -9` of the agent (every event reaches
//! the collector exactly once in its view), `emit` for scripts, JSON errors, and the README's standard-library
//! Python training-loop snippet run against a real agent.

use startline_tests::{binary, free_port, http_get, path_escape, wait_until, workspace_root, Collector};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Agent {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_agent(collector: &str, spool: &std::path::Path) -> Agent {
    let mut child = Command::new(binary("startline-agent"))
        .args(["--collector", collector, "node", "--listen", "127.0.0.1:0", "--spool"])
        .arg(spool)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("agent");
    let out = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(out).lines();
    let line = lines.next().and_then(Result::ok).unwrap_or_default();
    std::thread::spawn(move || for _ in lines {});
    let addr = line
        .split_whitespace()
        .find_map(|p| p.strip_prefix("listen="))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("agent ready line: {line:?}"));
    Agent { child, addr }
}

fn post(addr: SocketAddr, body: &str) -> (u16, serde_json::Value) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(s, "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).expect("write");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read");
    let (head, b) = raw.split_once("\r\n\r\n").expect("response");
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).expect("status");
    (status, serde_json::from_str(b.trim()).unwrap_or(serde_json::Value::Null))
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
