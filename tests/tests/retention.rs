//! Retention: jobs that ended longer ago than `store.retention` are deleted with their events (from the
//! index, the SLO windows and the store); recent, running and waiting jobs stay; a restart does not bring
//! deleted jobs back.

use startline_agent::uplink::{Publisher, UplinkSettings};
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_tests::{ago, event, submitted, Collector};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_jobs_past_retention_are_deleted_and_stay_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        "[store]\nretention = \"1d\"\nretention_interval = \"200ms\"\n\n[[slo]]\nname = \"any\"\nthreshold = \"10m\"\nobjective = 99\nwindow = \"1h\"\n",
    )
    .expect("config");
    let args = ["--config", cfg.to_str().expect("utf8")];
    let db = dir.path().join("db");
    let c = Collector::start(&db, &args);
    let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");
    let day = 86_400;
    let done = |outcome| Kind::Done(pb::Done { outcome: outcome as i32, ..Default::default() });
    up.send(vec![
        // Ended three days ago: expires.
        event("old", "s", ago(4 * day), submitted(pb::PoolKind::Managed, pb::PriorityClass::Normal, 8)),
        event("old", "f", ago(4 * day - 60), Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })),
        event("old", "d", ago(3 * day), done(pb::Outcome::Succeeded)),
        // Ended an hour ago: stays.
        event("recent", "s", ago(2 * 3600), submitted(pb::PoolKind::Managed, pb::PriorityClass::Normal, 8)),
        event("recent", "d", ago(3600), done(pb::Outcome::Failed)),
        // Submitted long ago but never ended: stays.
        event("waiting", "s", ago(5 * day), submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Normal, 8)),
    ])
    .await
    .expect("send");
    up.flush().await.expect("flush");

    let deadline = Instant::now() + Duration::from_secs(30);
    while c.get("/api/v1/jobs/old").0 != 404 {
        assert!(Instant::now() < deadline, "the expired job was not deleted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(c.get("/api/v1/jobs/recent").0, 200);
    assert_eq!(c.get("/api/v1/jobs/waiting").0, 200);
    let (_, list) = c.get("/api/v1/jobs");
    let ids: Vec<&str> = list["jobs"].as_array().expect("jobs").iter().filter_map(|j| j["job_id"].as_str()).collect();
    assert_eq!(ids, ["recent", "waiting"]);

    // After a restart the deleted job stays deleted (snapshot and log entries are gone).
    c.signal_and_wait("TERM");
    let c = Collector::start(&db, &args);
    assert_eq!(c.get("/api/v1/jobs/old").0, 404);
    assert_eq!(c.get("/api/v1/jobs/recent").0, 200);
    let (_, j) = c.get("/api/v1/jobs/recent");
    assert_eq!(j["events"].as_array().map(Vec::len), Some(2));
}
