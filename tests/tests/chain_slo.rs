//! Chain SLOs end to end over real gRPC: four `safety-fix/` chains (one done in time, one done late, one still open
//! past its 6 h deadline, one open within it) and one uncovered chain, sent to a collector with a
//! `[[chain_slo]]`; the API's counts, verdicts, error budget and burn rates compared with values worked out here,
//! the `StartlineChainLate` page for the open late chain (resolved once it completes), the ticket burn-rate alert,
//! and the `startline_chain_slo_chains` gauge.

use startline_agent::uplink::{Publisher, UplinkSettings};
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_tests::{event, http_get_text, wait_until, Collector};
use std::time::Duration;

const MIN: i64 = 60_000;
const H: i64 = 60 * MIN;

fn sub(chain: &str, stage: &str) -> Kind {
    Kind::Submitted(pb::Submitted {
        pool_kind: pb::PoolKind::Dedicated as i32,
        provider: "slurm".into(),
        pool: "a100".into(),
        priority: pb::PriorityClass::Urgent as i32,
        gpu_count: 8,
        team: "safety".into(),
        chain_id: chain.into(),
        chain_stage: stage.into(),
        ..Default::default()
    })
}

/// A stage: submitted at `at`, first step a minute later, done at `done` (if given).
fn stage(chain: &str, name: &str, at: i64, done: Option<i64>) -> Vec<pb::LifecycleEvent> {
    let job = format!("{chain}/{name}");
    let mut evs = vec![
        event(&job, "s", at, sub(chain, name)),
        event(&job, "f", at + MIN, Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })),
    ];
    if let Some(d) = done {
        evs.push(event(
            &job,
            "d",
            d,
            Kind::Done(pb::Done { outcome: pb::Outcome::Succeeded as i32, ..Default::default() }),
        ));
    }
    evs
}

fn alert_firing(c: &Collector, name: &str, needle: &str) -> bool {
    let (_, a) = c.get("/api/v1/alerts?state=firing");
    a["alerts"]
        .as_array()
        .is_some_and(|l| l.iter().any(|x| x["labels"]["alertname"] == name && x.to_string().contains(needle)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_chain_pages_while_open_and_counts_against_its_slo() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        r#"
[alerts]
evaluation_interval = "1s"
min_jobs = 3

[chains]
final_stages = ["quantize"]
evaluation_interval = "1s"

[[chain_slo]]
name = "safety-fix"
description = "safety fixes ship within 6 hours"
threshold = "6h"
objective = 90
[chain_slo.selector]
chain_id_prefix = ["safety-fix/"]
"#,
    )
    .expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf8")]);
    let now = startline_tests::ago(0);
    let mut evs = Vec::new();
    // safety-fix/1: 3 days ago, done in 5 h (good, decided at completion).
    let t1 = now - 72 * H;
    evs.extend(stage("safety-fix/1", "train", t1, Some(t1 + 3 * H)));
    evs.extend(stage("safety-fix/1", "quantize", t1 + 3 * H, Some(t1 + 5 * H)));
    // safety-fix/2: 2 days ago, done in 8 h (late, decided at its 6 h deadline).
    let t2 = now - 48 * H;
    evs.extend(stage("safety-fix/2", "train", t2, Some(t2 + 5 * H)));
    evs.extend(stage("safety-fix/2", "quantize", t2 + 5 * H, Some(t2 + 8 * H)));
    // safety-fix/3: 6.5 h ago, still open (training done, quantize running): late for 30 minutes.
    let t3 = now - 6 * H - 30 * MIN;
    evs.extend(stage("safety-fix/3", "train", t3, Some(t3 + 4 * H)));
    evs.extend(stage("safety-fix/3", "quantize", t3 + 4 * H, None));
    // safety-fix/4: an hour ago, open: pending.
    evs.extend(stage("safety-fix/4", "train", now - H, None));
    // Not covered.
    evs.extend(stage("release/9", "train", now - 10 * H, None));
    let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");
    up.send(evs).await.expect("send");
    up.flush().await.expect("flush");

    let (status, l) = c.get("/api/v1/chains");
    assert_eq!(status, 200, "{l}");
    let s = &l["slos"][0];
    assert_eq!(s["name"], "safety-fix");
    assert_eq!((s["good"].as_u64(), s["bad"].as_u64()), (Some(1), Some(2)), "{s}");
    assert_eq!((s["pending"].as_u64(), s["late_open"].as_u64()), (Some(1), Some(1)));
    assert!((s["compliance"].as_f64().expect("c") - 1.0 / 3.0).abs() < 1e-12);
    // Budget: 10% of 3 decided chains = 0.3 allowed late; 2 late -> 1 - 2 / 0.3.
    assert!((s["error_budget_remaining"].as_f64().expect("b") - (1.0 - 2.0 / 0.3)).abs() < 1e-9, "{s}");
    // 3d/6h: 1 good and 2 late over 3 days -> (2/3)/0.1; only the open late chain in 6 h -> 1/0.1.
    let r = s["burn_rates"].as_array().expect("burn").iter().find(|r| r["windows"] == "3d/6h").expect("3d/6h");
    assert!((r["long_burn_rate"].as_f64().expect("l") - 20.0 / 3.0).abs() < 1e-9, "{r}");
    assert!((r["short_burn_rate"].as_f64().expect("s") - 10.0).abs() < 1e-9, "{r}");
    assert!((r["factor"].as_f64().expect("f") - 0.1 * 28.0 / 3.0).abs() < 1e-9);
    let verdict = |id: &str| {
        l["chains"].as_array().expect("chains").iter().find(|x| x["chain_id"] == id).map(|x| x["slos"].clone())
    };
    assert_eq!(verdict("safety-fix/3").expect("sf3")[0]["verdict"], "late");
    assert_eq!(verdict("safety-fix/4").expect("sf4")[0]["verdict"], "pending");
    assert_eq!(verdict("safety-fix/1").expect("sf1")[0]["verdict"], "good");
    assert_eq!(verdict("release/9").expect("r9"), serde_json::json!([]), "not covered");

    // The page for the open late chain, and the ticket burn-rate alert (the 3d/6h rule: 6.7x and 10x >= 0.93x).
    wait_until("StartlineChainLate fires", Duration::from_secs(20), || {
        alert_firing(&c, "StartlineChainLate", "safety-fix/3")
    });
    assert!(!alert_firing(&c, "StartlineChainLate", "safety-fix/4"), "a chain within its deadline does not page");
    wait_until("the chain SLO burns", Duration::from_secs(20), || {
        alert_firing(&c, "StartlineChainSLOBurnRate", "ticket")
    });
    let (_, metrics) = http_get_text(c.http, "/metrics");
    let line = |result: &str| {
        metrics.lines().find(|l| {
            l.starts_with("startline_chain_slo_chains{")
                && l.contains("slo=\"safety-fix\"")
                && l.contains(&format!("result=\"{result}\""))
        })
    };
    assert!(line("bad").is_some_and(|l| l.ends_with(" 2")), "{metrics}");
    assert!(line("pending").is_some_and(|l| l.ends_with(" 1")));

    // The late chain completes: the page resolves; it stays late in the counts (decided at its deadline).
    let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");
    up.send(vec![event(
        "safety-fix/3/quantize",
        "d",
        now,
        Kind::Done(pb::Done { outcome: pb::Outcome::Succeeded as i32, ..Default::default() }),
    )])
    .await
    .expect("send");
    up.flush().await.expect("flush");
    wait_until("the page resolves", Duration::from_secs(20), || {
        !alert_firing(&c, "StartlineChainLate", "safety-fix/3")
    });
    let (_, l) = c.get("/api/v1/chains");
    assert_eq!((l["slos"][0]["bad"].as_u64(), l["slos"][0]["late_open"].as_u64()), (Some(2), Some(0)));
}
