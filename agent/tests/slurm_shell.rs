//! The Slurm adapter's polling shell over stub commands: the accounting window starts at the last successful
//! poll (persisted across a restart; the first poll goes back `lookback`), and a followed job that leaves squeue
//! without an accounting record is re-queried by id and then given up as `cancelled` with outcome unknown.

use startline_agent::provider::{slurm, MemoryStore};
use startline_agent::spool::{Spool, SpoolLimits};
use startline_proto::pb::{self, lifecycle_event::Kind};
use std::time::Duration;

const SQUEUE: &str = include_str!("../src/provider/fixtures/squeue-22.05.json");

fn mapping() -> slurm::Mapping {
    slurm::Mapping { cluster: "c1".into(), ..Default::default() }
}

fn shell(dir: &std::path::Path, grace: Duration) -> slurm::ShellSettings {
    let file = |n: &str| dir.join(n).to_string_lossy().to_string();
    slurm::ShellSettings {
        squeue: vec!["sh".into(), "-c".into(), "cat \"$0\"".into(), file("squeue.json")],
        // Logs the arguments the adapter appends, then answers with the file.
        sacct: vec![
            "sh".into(),
            "-c".into(),
            "echo \"$@\" >> \"$0.args\"; cat \"$0\"".into(),
            file("sacct.json"),
            "--starttime".into(),
            "now-2days".into(),
        ],
        interval: Duration::from_secs(3600),
        lookback: Duration::from_secs(3600),
        vanished_grace: grace,
        rest: None,
    }
}

/// Job 3 of the captured squeue payload alone (pending on Resources).
fn one_pending_job() -> String {
    let mut v: serde_json::Value = serde_json::from_str(SQUEUE).expect("json");
    v["jobs"] = serde_json::json!([v["jobs"][2].clone()]);
    v.to_string()
}

fn starttimes(log: &str) -> Vec<i64> {
    log.lines().filter_map(|l| l.strip_prefix("--starttime uts")).filter_map(|s| s.trim().parse::<i64>().ok()).collect()
}

#[tokio::test]
async fn the_window_starts_at_the_last_poll_and_a_vanished_job_ends_unknown() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::write(d.join("squeue.json"), one_pending_job()).expect("write");
    std::fs::write(d.join("sacct.json"), r#"{"jobs": []}"#).expect("write");
    let sh = shell(d, Duration::ZERO);
    let m = mapping();
    let t0 = startline_proto::time::now_ms() / 1000;
    {
        let spool = Spool::open(&d.join("spool"), SpoolLimits::default()).expect("spool");
        let memory = MemoryStore::open(&spool, "slurm").expect("memory");
        let r = slurm::poll_once(&m, &sh, &spool, &memory).await.expect("poll 1");
        assert_eq!(r.events.len(), 2, "submitted and queued");
    }
    let log = std::fs::read_to_string(d.join("sacct.json.args")).expect("args");
    let first = starttimes(&log);
    assert_eq!(first.len(), 1, "{log}");
    assert!((first[0] - (t0 - 3600)).abs() <= 2, "first window goes back the lookback: {log}");
    assert!(!log.contains("now-2days"), "the configured --starttime is dropped: {log}");

    // Restart; the job left squeue and accounting has no record of it.
    std::fs::write(d.join("squeue.json"), r#"{"jobs": []}"#).expect("write");
    let spool = Spool::open(&d.join("spool"), SpoolLimits::default()).expect("spool");
    let memory = MemoryStore::open(&spool, "slurm").expect("memory");
    let r = slurm::poll_once(&m, &sh, &spool, &memory).await.expect("poll 2");
    let log = std::fs::read_to_string(d.join("sacct.json.args")).expect("args");
    let windows = starttimes(&log);
    assert_eq!(windows.len(), 2, "{log}");
    assert!(
        (windows[1] - (t0 - slurm::SACCT_OVERLAP_MS / 1000)).abs() <= 2,
        "the second window starts at the first poll minus the overlap, across the restart: {log}"
    );
    assert!(log.lines().any(|l| l.trim() == "-j 3"), "re-queried by id: {log}");
    assert_eq!(r.events.len(), 1, "{:?}", r.events);
    let e = &r.events[0];
    assert_eq!((e.job_id.as_str(), e.event_id.as_str()), ("slurm/startline/3", "slurm/startline/3:done"));
    let Some(Kind::Done(done)) = &e.kind else { panic!("done: {e:?}") };
    assert_eq!(done.outcome(), pb::Outcome::Cancelled);
    assert!(done.message.contains("outcome unknown"));
    // Given up once: the next poll neither re-queries nor re-emits.
    let r = slurm::poll_once(&m, &sh, &spool, &memory).await.expect("poll 3");
    assert!(r.events.is_empty());
    let log = std::fs::read_to_string(d.join("sacct.json.args")).expect("args");
    assert_eq!(log.lines().filter(|l| l.starts_with("-j")).count(), 1, "{log}");
}

#[tokio::test]
async fn a_job_found_by_the_re_query_is_not_given_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::write(d.join("squeue.json"), one_pending_job()).expect("write");
    std::fs::write(d.join("sacct.json"), r#"{"jobs": []}"#).expect("write");
    let sh = shell(d, Duration::ZERO);
    let m = mapping();
    let spool = Spool::open(&d.join("spool"), SpoolLimits::default()).expect("spool");
    let memory = MemoryStore::open(&spool, "slurm").expect("memory");
    slurm::poll_once(&m, &sh, &spool, &memory).await.expect("poll 1");
    // Out of squeue; accounting only answers by id (the stub answers every query, so this also covers a
    // window that returns it): it completed.
    std::fs::write(d.join("squeue.json"), r#"{"jobs": []}"#).expect("write");
    let sacct = include_str!("../src/provider/fixtures/sacct-22.05.json");
    let mut v: serde_json::Value = serde_json::from_str(sacct).expect("json");
    let mut job = v["jobs"][0].clone();
    job["job_id"] = 3.into();
    v["jobs"] = serde_json::json!([job]);
    std::fs::write(d.join("sacct.json"), v.to_string()).expect("write");
    let r = slurm::poll_once(&m, &sh, &spool, &memory).await.expect("poll 2");
    let done: Vec<&pb::Done> = r
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::Done(d)) => Some(d),
            _ => None,
        })
        .collect();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].outcome(), pb::Outcome::Succeeded);
}
