//! Breach prediction end to end over real gRPC: urgent jobs still within their 10-minute deadline get
//! `StartlineJobStartBreachPredicted` when the pool's recent urgent jobs almost all waited past it (history), or
//! when the scheduler's estimated start lies past the deadline (scheduler), or when another urgent job of the pool
//! is already waiting past it (stall); not when the estimate is in time; the
//! warning resolves when the job starts, and the breach page never fires for a job that started in time.

use startline_agent::uplink::{Publisher, UplinkSettings};
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_proto::time::ms_to_timestamp;
use startline_tests::{event, wait_until, Collector};
use std::time::Duration;

const MIN: i64 = 60_000;

fn sub(pool: &str) -> Kind {
    Kind::Submitted(pb::Submitted {
        pool_kind: pb::PoolKind::Dedicated as i32,
        provider: "slurm".into(),
        pool: pool.into(),
        priority: pb::PriorityClass::Urgent as i32,
        gpu_count: 8,
        ..Default::default()
    })
}

fn queued(estimate: Option<i64>) -> Kind {
    Kind::Queued(pb::Queued {
        reason: pb::WaitReason::Capacity as i32,
        raw_reason: "Resources".into(),
        estimated_start: estimate.map(ms_to_timestamp),
        ..Default::default()
    })
}

fn firing(c: &Collector) -> Vec<serde_json::Value> {
    let (_, a) = c.get("/api/v1/alerts?state=firing");
    a["alerts"].as_array().cloned().unwrap_or_default()
}

fn predicted(c: &Collector, job: &str) -> Option<serde_json::Value> {
    firing(c)
        .into_iter()
        .find(|a| a["labels"]["alertname"] == "StartlineJobStartBreachPredicted" && a["labels"]["job_id"] == job)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_urgent_jobs_are_warned_before_their_deadline_from_history_or_the_scheduler() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        "[alerts]\nevaluation_interval = \"1s\"\n[prediction]\nmodel_interval = \"1s\"\nmin_samples = 5\n",
    )
    .expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf8")]);
    let now = startline_tests::ago(0);
    let mut evs = Vec::new();
    // History: pool "slow" started each of its 10 urgent jobs of yesterday after 30 minutes.
    for i in 0..10 {
        let t = now - 86_400_000 + i * 10 * MIN;
        let id = format!("slow/old-{i}");
        evs.push(event(&id, "s", t, sub("slow")));
        evs.push(event(&id, "f", t + 30 * MIN, Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })));
    }
    // Waiting now, a minute in: one in "slow" (no estimate), two in "fast" with the scheduler's estimates.
    evs.push(event("slow/now", "s", now - MIN, sub("slow")));
    evs.push(event("slow/now", "q", now - MIN + 1000, queued(None)));
    evs.push(event("fast/late", "s", now - MIN, sub("fast")));
    evs.push(event("fast/late", "q", now - MIN + 1000, queued(Some(now + 20 * MIN))));
    evs.push(event("fast/ok", "s", now - MIN, sub("fast")));
    evs.push(event("fast/ok", "q", now - MIN + 1000, queued(Some(now + 2 * MIN))));
    // Pool "stuck": one urgent job already 15 minutes in (past its deadline: paged), a new one a minute in.
    evs.push(event("stuck/first", "s", now - 15 * MIN, sub("stuck")));
    evs.push(event("stuck/first", "q", now - 15 * MIN + 1000, queued(None)));
    evs.push(event("stuck/next", "s", now - MIN, sub("stuck")));
    evs.push(event("stuck/next", "q", now - MIN + 1000, queued(None)));
    let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");
    up.send(evs).await.expect("send");
    up.flush().await.expect("flush");

    wait_until("the warnings", Duration::from_secs(20), || {
        predicted(&c, "slow/now").is_some()
            && predicted(&c, "fast/late").is_some()
            && predicted(&c, "stuck/next").is_some()
    });
    let st = predicted(&c, "stuck/next").expect("stall warning");
    assert_eq!(st["annotations"]["basis"], "stall");
    assert_eq!(st["annotations"]["waiting_past_threshold"], "1");
    assert!(predicted(&c, "stuck/first").is_none(), "past its deadline: the breach page, not a prediction");
    let h = predicted(&c, "slow/now").expect("history warning");
    assert_eq!(h["labels"]["severity"], "warning");
    assert_eq!(h["annotations"]["basis"], "history");
    // Of the 10 comparable jobs, all waited more than the minute waited so far and all past 10 minutes.
    assert_eq!(h["annotations"]["probability"], "1.000");
    assert_eq!(h["annotations"]["samples"], "10");
    let s = predicted(&c, "fast/late").expect("scheduler warning");
    assert_eq!(s["annotations"]["basis"], "scheduler");
    assert!(s["annotations"]["summary"].as_str().is_some_and(|t| t.contains("scheduler estimates its start")));
    assert!(predicted(&c, "fast/ok").is_none(), "an estimate within the deadline does not warn");
    let pages: Vec<String> = firing(&c)
        .iter()
        .filter(|a| a["labels"]["alertname"] == "StartlineJobStartBreach")
        .filter_map(|a| a["labels"]["job_id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(pages, vec!["stuck/first".to_string()], "only the job past its deadline is paged");

    // The job starts in time: the warning resolves and no page follows.
    let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");
    up.send(vec![event(
        "slow/now",
        "f",
        startline_tests::ago(0),
        Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() }),
    )])
    .await
    .expect("send");
    up.flush().await.expect("flush");
    wait_until("the warning resolves", Duration::from_secs(20), || predicted(&c, "slow/now").is_none());
    let (_, all) = c.get("/api/v1/alerts?state=all");
    let resolved = all["alerts"].as_array().expect("alerts").iter().any(|a| {
        a["labels"]["job_id"] == "slow/now"
            && a["labels"]["alertname"] == "StartlineJobStartBreachPredicted"
            && !a["resolved_at"].is_null()
    });
    assert!(resolved, "{all}");
}

/// A job of GPU class `class` in `pool`, of `priority`.
fn sub_class(pool: &str, class: &str, priority: pb::PriorityClass) -> Kind {
    Kind::Submitted(pb::Submitted {
        pool_kind: pb::PoolKind::Dedicated as i32,
        provider: "slurm".into(),
        pool: pool.into(),
        gpu_class: class.into(),
        priority: priority as i32,
        gpu_count: 8,
        ..Default::default()
    })
}

fn queued_raw(reason: pb::WaitReason, raw: &str) -> Kind {
    Kind::Queued(pb::Queued { reason: reason as i32, raw_reason: raw.into(), ..Default::default() })
}

/// A crunch on class h100: three normal jobs of two pools queue for capacity (Slurm's `Resources`, a managed
/// stock-out) and none starts, so the first urgent job that arrives is warned at once (`basis=capacity`); a job of
/// the class starting clears it. A class where jobs wait for quota, or where one started, warns nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_urgent_job_of_a_capacity_crunch_is_warned_from_the_capacity_waits_of_its_class() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        "[alerts]\nevaluation_interval = \"1s\"\n[prediction]\nmodel_interval = \"1s\"\ncapacity_jobs = 3\ncapacity_window = \"10m\"\n",
    )
    .expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf8")]);
    let now = startline_tests::ago(0);
    let (normal, urgent) = (pb::PriorityClass::Normal, pb::PriorityClass::Urgent);
    let mut evs = Vec::new();
    // h100: three normal jobs queued for capacity in the last 6 minutes, two pools; then the urgent one.
    for (i, (pool, raw)) in
        [("h100", "Resources"), ("vertex-a3", "Resources are insufficient in region"), ("h100", "Resources")]
            .iter()
            .enumerate()
    {
        let id = format!("{pool}/n{i}");
        let t = now - (6 - 2 * i as i64) * MIN;
        evs.push(event(&id, "s", t, sub_class(pool, "h100", normal)));
        evs.push(event(&id, "q", t + 1000, queued_raw(pb::WaitReason::Capacity, raw)));
    }
    evs.push(event("h100/urgent", "s", now - 30_000, sub_class("h100", "h100", urgent)));
    evs.push(event("h100/urgent", "q", now - 29_000, queued_raw(pb::WaitReason::Capacity, "Resources")));
    // l40s: three normal jobs waiting for quota, not capacity: nothing.
    for i in 0..3 {
        let id = format!("l40s/q{i}");
        evs.push(event(&id, "s", now - 5 * MIN, sub_class("l40s", "l40s", normal)));
        evs.push(event(&id, "q", now - 5 * MIN + 1000, queued_raw(pb::WaitReason::Quota, "QOSGrpGRES")));
    }
    evs.push(event("l40s/urgent", "s", now - 30_000, sub_class("l40s", "l40s", urgent)));
    evs.push(event("l40s/urgent", "q", now - 29_000, queued_raw(pb::WaitReason::Capacity, "Resources")));
    let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");
    up.send(evs).await.expect("send");
    up.flush().await.expect("flush");

    wait_until("the capacity warning", Duration::from_secs(20), || predicted(&c, "h100/urgent").is_some());
    let w = predicted(&c, "h100/urgent").expect("capacity warning");
    assert_eq!(w["annotations"]["basis"], "capacity");
    // The three normal jobs and the urgent one itself, all queued for capacity within 10 minutes.
    assert_eq!(w["annotations"]["queued_for_capacity"], "4");
    assert!(w["annotations"]["summary"].as_str().is_some_and(|t| t.contains("queued for capacity")), "{w}");
    assert!(predicted(&c, "l40s/urgent").is_none(), "quota waits are no capacity signal");

    // A job of the class gets nodes: the class is not out of capacity, the warning resolves.
    let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");
    let nodes = Kind::NodeAssigned(pb::NodeAssigned { nodes: vec!["gpu-01".into()], ..Default::default() });
    up.send(vec![event("h100/n0", "a", startline_tests::ago(0), nodes)]).await.expect("send");
    up.flush().await.expect("flush");
    wait_until("the warning resolves", Duration::from_secs(20), || predicted(&c, "h100/urgent").is_none());
}
