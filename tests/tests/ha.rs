//! An HA pair without consensus: one node agent delivers every event to two collectors, each from its own spool
//! cursor. One collector is killed (`kill -9`) while events keep coming, an urgent job breaches during the outage,
//! and the collector comes back on its store: it catches up from the agent's spool, both end with the same job
//! states and SLO counts, and the breach reaches a real Alertmanager as one alert (both collectors send identical
//! labels, so Alertmanager deduplicates them) and one firing notification.

use serde_json::{json, Value};
use startline_tests::{
    free_port, http_get, post_events, start_alertmanager, wait_until, Collector, HookServer, NodeAgent,
};
use std::time::{Duration, Instant};

fn config(dir: &std::path::Path, am: &str) -> std::path::PathBuf {
    let p = dir.join("collector.toml");
    std::fs::write(
        &p,
        format!(
            "[[slo]]\nname = \"urgent-start\"\nthreshold = \"3s\"\nobjective = 99\nwindow = \"1d\"\n\
             [slo.selector]\npriority = [\"urgent\"]\n\
             [[slo]]\nname = \"normal-start\"\nthreshold = \"1h\"\nobjective = 95\nwindow = \"1d\"\n\
             [slo.selector]\npriority = [\"normal\"]\n\
             [alerts]\nalertmanager = [\"{am}\"]\nevaluation_interval = \"1s\"\nresend_interval = \"2s\"\n"
        ),
    )
    .expect("config");
    p
}

fn lifecycle(job: &str, now: f64, wait: f64) -> Value {
    json!({"events": [
        {"kind": "submitted", "job_id": job, "occurred_at": now - 900.0, "pool_kind": "dedicated", "provider": "slurm",
         "pool": "gpu", "priority": "normal", "gpu_count": 8},
        {"kind": "queued", "job_id": job, "occurred_at": now - 899.0, "reason": "capacity", "raw_reason": "Resources"},
        {"kind": "first_step", "job_id": job, "occurred_at": now - 900.0 + wait, "step": 1},
        {"kind": "done", "job_id": job, "occurred_at": now - 10.0, "outcome": "succeeded", "exit_code": 0},
    ]})
}

/// What must be equal between the two collectors: every job's state and milestones, every SLO's decided counts.
fn state(c: &Collector) -> (Vec<Value>, Vec<Value>) {
    let (status, jobs) = c.get("/api/v1/jobs?limit=1000");
    assert_eq!(status, 200, "{jobs}");
    let jobs = jobs["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| {
            json!([
                j["job_id"],
                j["state"],
                j["outcome"],
                j["submitted_at"],
                j["first_step_at"],
                j["done_at"],
                j["time_to_first_step_seconds"]
            ])
        })
        .collect();
    let (_, slos) = c.get("/api/v1/slos");
    let slos = slos["slos"]
        .as_array()
        .expect("slos")
        .iter()
        .map(|s| json!([s["name"], s["status"]["good"], s["status"]["bad"], s["status"]["breached_waiting"]]))
        .collect();
    (jobs, slos)
}

fn firing_for(v: &Value, job: &str) -> bool {
    v["status"] == "firing"
        && v["alerts"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x["labels"]["job_id"] == job && x["status"] == "firing"))
}

#[test]
fn two_collectors_fed_by_one_spool_agree_after_an_outage_and_a_breach_pages_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let hook = HookServer::start();
    let (_am, am_url) = start_alertmanager(d, &hook);
    let cfg = config(d, &am_url);
    let cfg_arg = cfg.display().to_string();
    let a = Collector::start(&d.join("a"), &["--config", &cfg_arg]);
    let b_addr = format!("127.0.0.1:{}", free_port());
    let b = Collector::start_on(&d.join("b"), &b_addr, &["--config", &cfg_arg]);
    let b_uri = format!("http://{b_addr}");
    let agent = NodeAgent::start(&[&a.endpoint(), &b_uri], &d.join("spool"));
    let now = startline_proto::time::now_ms() as f64 / 1000.0;

    // Both up: five jobs reach both.
    for i in 0..5 {
        let (s, body) =
            post_events(agent.addr, &lifecycle(&format!("slurm/ha/{i}"), now, 60.0 * (i + 1) as f64).to_string());
        assert_eq!(s, 202, "{body}");
    }
    let count = |c: &Collector| c.get("/api/v1/jobs?limit=1000").1["jobs"].as_array().map_or(0, Vec::len);
    wait_until("both collectors hold the first jobs", Duration::from_secs(30), || count(&a) == 5 && count(&b) == 5);

    // B dies. Events keep coming; an urgent job breaches while B is down and A pages it.
    let _ = b.signal_and_wait("KILL");
    for i in 5..12 {
        let (s, body) = post_events(agent.addr, &lifecycle(&format!("slurm/ha/{i}"), now, 30.0 * i as f64).to_string());
        assert_eq!(s, 202, "{body}");
    }
    let urgent = "slurm/ha/urgent";
    let submitted = startline_proto::time::now_ms() as f64 / 1000.0;
    let (s, body) = post_events(
        agent.addr,
        &json!({"events": [
            {"kind": "submitted", "job_id": urgent, "occurred_at": submitted, "pool_kind": "dedicated",
             "provider": "slurm", "pool": "gpu", "priority": "urgent", "gpu_count": 64},
            {"kind": "queued", "job_id": urgent, "occurred_at": submitted + 0.01, "reason": "priority", "raw_reason": "Priority"},
        ]})
        .to_string(),
    );
    assert_eq!(s, 202, "{body}");
    hook.wait_for(Duration::from_secs(30), |p, v| p == "/am" && firing_for(v, urgent))
        .expect("A paged the urgent breach through Alertmanager while B was down");
    assert!(http_get(agent.addr, "/v1/spool").1["events"].as_u64().unwrap_or(0) > 0, "the spool holds B's backlog");

    // B comes back on its store and catches up from its own cursor.
    let b = Collector::start_on(&d.join("b"), &b_addr, &["--config", &cfg_arg]);
    wait_until("the spool to drain into B", Duration::from_secs(60), || {
        http_get(agent.addr, "/v1/spool").1["events"] == 0
    });
    wait_until("B to report the breach", Duration::from_secs(30), || {
        b.get("/api/v1/slos/urgent-start").1["status"]["breached_waiting"] == 1
    });
    let (sa, sb) = (state(&a), state(&b));
    assert_eq!(sa.0.len(), 13);
    // The comparison is over real values, not absent keys.
    assert!(sa.0.iter().all(|j| j[0].is_string() && j[1].is_string() && j[3].is_string()), "{:?}", sa.0);
    assert_eq!(sa.0.iter().filter(|j| j[5].is_string()).count(), 12, "done jobs: {:?}", sa.0);
    assert!(sa.1.iter().all(|s| s[1].is_number() && s[2].is_number()), "{:?}", sa.1);
    assert_eq!(sa, sb, "the two collectors disagree");

    // Both page the same alert with identical labels; Alertmanager holds one alert and sent one firing
    // notification, through several resend intervals of both collectors.
    let labels = |c: &Collector| -> Value {
        let (_, v) = c.get("/api/v1/alerts?state=firing");
        v["alerts"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["labels"]["job_id"] == urgent))
            .map(|x| x["labels"].clone())
            .unwrap_or_default()
    };
    wait_until("B pages too", Duration::from_secs(30), || !labels(&b).is_null());
    assert_eq!(labels(&a), labels(&b), "the pair's pages differ in labels, so Alertmanager cannot deduplicate them");
    let settle = Instant::now() + Duration::from_secs(6);
    while Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(200));
    }
    let am_addr: std::net::SocketAddr = am_url.trim_start_matches("http://").parse().expect("am addr");
    let (_, alerts) = http_get(am_addr, "/api/v2/alerts?active=true");
    let ours: Vec<&Value> =
        alerts.as_array().expect("alerts").iter().filter(|x| x["labels"]["job_id"] == urgent).collect();
    assert_eq!(ours.len(), 1, "Alertmanager holds {} alerts for the job: {ours:?}", ours.len());
    let notifications = hook.received().into_iter().filter(|(p, v)| p == "/am" && firing_for(v, urgent)).count();
    assert_eq!(notifications, 1, "the breach paged {notifications} times");
}
