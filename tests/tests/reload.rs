//! Reloading a running collector's configuration (SIGHUP and `POST /api/v1/admin/reload`): new SLOs are applied
//! to every job already known, with figures equal to those a restart with the same file computes; a job waiting
//! past a new, tighter threshold pages through a webhook the same reload added; a removed SLO's page resolves;
//! sections that need a restart are named and left alone; a bad file changes nothing.

use startline_agent::uplink::{Publisher, UplinkSettings};
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_tests::{event, submitted, wait_until, Collector, HookServer};
use std::time::Duration;

const MIN: i64 = 60_000;

fn write_config(path: &std::path::Path, slos: &str, alerts: &str, grpc: &str) {
    std::fs::write(
        path,
        format!("{grpc}\n{slos}\n[alerts]\nevaluation_interval = \"1s\"\nresend_interval = \"2s\"\n{alerts}\n"),
    )
    .expect("write config");
}

const URGENT_1H: &str = r#"
[[slo]]
name = "urgent-start"
threshold = "1h"
objective = 99
window = "1d"
selector = { priority = ["urgent"] }
"#;

const URGENT_1M_AND_ANY_15M: &str = r#"
[[slo]]
name = "urgent-start"
threshold = "1m"
objective = 99
window = "1d"
selector = { priority = ["urgent"] }

[[slo]]
name = "any-start"
threshold = "15m"
objective = 90
window = "1d"
"#;

const ANY_15M: &str = r#"
[[slo]]
name = "any-start"
threshold = "15m"
objective = 90
window = "1d"
"#;

/// (name, good, bad, breached_waiting, pending) of every SLO, in order.
fn slo_figures(c: &Collector) -> Vec<(String, u64, u64, u64, u64)> {
    let (code, v) = c.get("/api/v1/slos");
    assert_eq!(code, 200, "{v}");
    v["slos"]
        .as_array()
        .expect("slos")
        .iter()
        .map(|s| {
            let n = |k: &str| s["status"][k].as_u64().unwrap_or(u64::MAX);
            (
                s["name"].as_str().unwrap_or_default().to_string(),
                n("good"),
                n("bad"),
                n("breached_waiting"),
                n("pending"),
            )
        })
        .collect()
}

fn page_is(v: &serde_json::Value, job: &str, slo: &str, status: &str) -> bool {
    v["alerts"].as_array().is_some_and(|a| {
        a.iter().any(|x| x["labels"]["job_id"] == job && x["labels"]["slo"] == slo && x["status"] == status)
    })
}

async fn post_reload(c: &Collector) -> (u16, serde_json::Value) {
    let resp = reqwest::Client::new()
        .post(format!("http://{}/api/v1/admin/reload", c.http))
        .send()
        .await
        .expect("reload request");
    let code = resp.status().as_u16();
    (code, resp.json().await.expect("json body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slos_and_alert_settings_reload_without_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hook = HookServer::start();
    let cfg = dir.path().join("collector.toml");
    write_config(&cfg, URGENT_1H, "", "");
    let db = dir.path().join("db");
    let args = ["--config", cfg.to_str().expect("utf8")];
    let c = Collector::start(&db, &args);
    let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");
    let now = startline_proto::time::now_ms();
    let queued = || {
        Kind::Queued(pb::Queued {
            reason: pb::WaitReason::Capacity as i32,
            raw_reason: "Resources".into(),
            ..Default::default()
        })
    };
    let urgent = || submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Urgent, 8);
    let normal = || submitted(pb::PoolKind::Managed, pb::PriorityClass::Normal, 8);
    let step = || Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() });
    // A: urgent, waiting 5 minutes. B: urgent, started after 2 minutes. C: normal, started after 20 minutes.
    up.send(vec![
        event("r/a", "s", now - 5 * MIN, urgent()),
        event("r/a", "q", now - 5 * MIN + 10, queued()),
        event("r/b", "s", now - 10 * MIN, urgent()),
        event("r/b", "f", now - 8 * MIN, step()),
        event("r/c", "s", now - 30 * MIN, normal()),
        event("r/c", "f", now - 10 * MIN, step()),
    ])
    .await
    .expect("send");
    up.flush().await.expect("flush");
    wait_until("three jobs", Duration::from_secs(10), || {
        c.get("/api/v1/jobs").1["jobs"].as_array().map(Vec::len) == Some(3)
    });
    assert_eq!(slo_figures(&c), vec![("urgent-start".to_string(), 1, 0, 0, 1)]);

    // SIGHUP with a tighter urgent SLO, a new any-priority SLO, a webhook, and a gRPC change that needs a restart.
    let webhook = format!("webhook = [\"http://{}/direct\"]", hook.addr);
    write_config(&cfg, URGENT_1M_AND_ANY_15M, &webhook, "[grpc]\nmax_batch_events = 5000\n");
    let ok = std::process::Command::new("kill").args(["-HUP", &c.child.id().to_string()]).status().expect("kill");
    assert!(ok.success());
    // A crossed 1m four minutes ago and still waits; B took 2m (bad); C (any-start) took 20m (bad), B 2m (good),
    // A is pending for any-start (5m of 15m).
    let want = vec![("urgent-start".to_string(), 0, 2, 1, 0), ("any-start".to_string(), 1, 1, 0, 1)];
    wait_until("the reloaded SLOs", Duration::from_secs(15), || slo_figures(&c) == want);
    let page = hook
        .wait_for(Duration::from_secs(15), |p, v| p == "/direct" && page_is(v, "r/a", "urgent-start", "firing"))
        .expect("the waiting urgent job pages through the webhook the reload added");
    assert_eq!(page["alerts"][0]["labels"]["alertname"], "StartlineJobStartBreach");

    // The admin route: what is in force, and that the gRPC change still waits for a restart.
    let (code, body) = post_reload(&c).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["slos"], serde_json::json!(["urgent-start", "any-start"]));
    assert_eq!(body["notifiers"], 1);
    assert_eq!(body["changed"], serde_json::json!(["grpc"]), "{body}");
    assert_eq!(body["restart_needed"], serde_json::json!(["grpc"]), "{body}");

    // A bad file: refused with every problem named, nothing changes.
    std::fs::write(&cfg, "[[slo]]\nname = \"Bad Name\"\nthreshold = \"soon\"\nobjective = 99\n").expect("write");
    let (code, body) = post_reload(&c).await;
    assert_eq!(code, 422, "{body}");
    let msg = body["error"].as_str().unwrap_or_default();
    assert!(msg.contains("slo[0].name") && msg.contains("slo[0].threshold"), "{msg}");
    assert_eq!(slo_figures(&c), want);

    // The same figures as a restart with the reloaded file computes.
    write_config(&cfg, URGENT_1M_AND_ANY_15M, &webhook, "[grpc]\nmax_batch_events = 5000\n");
    drop(up);
    let status = c.signal_and_wait("TERM");
    assert!(status.success(), "{status}");
    let c = Collector::start(&db, &args);
    assert_eq!(slo_figures(&c), want);

    // Removing the urgent SLO resolves its page.
    write_config(&cfg, ANY_15M, &webhook, "[grpc]\nmax_batch_events = 5000\n");
    let (code, body) = post_reload(&c).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["changed"], serde_json::json!(["slo"]), "{body}");
    assert_eq!(slo_figures(&c), vec![("any-start".to_string(), 1, 1, 0, 1)]);
    hook.wait_for(Duration::from_secs(15), |p, v| p == "/direct" && page_is(v, "r/a", "urgent-start", "resolved"))
        .expect("the removed SLO's page resolves");
    let (_, firing) = c.get("/api/v1/alerts?state=firing");
    assert!(!page_is(&firing, "r/a", "urgent-start", "firing"), "{firing}");
}
