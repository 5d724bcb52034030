//! Durability of acknowledged events across kill -9 and graceful shutdown, with a client streaming.

use startline_proto::pb::{self, ingest_service_client::IngestServiceClient, lifecycle_event::Kind};
use startline_tests::{ago, event, submitted, Collector};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio_stream::wrappers::ReceiverStream;

/// Streams batches (10 jobs x 20 events each per batch) until the stream fails or `max_batches` are acked.
/// Returns the (job_id, event_id) pairs of every acknowledged batch.
async fn stream_until_failure(
    endpoint: String,
    max_batches: u64,
    progress: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> BTreeSet<(String, String)> {
    let mut acked = BTreeSet::new();
    let Ok(mut client) = IngestServiceClient::connect(endpoint).await else {
        return acked;
    };
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let Ok(resp) = client.publish(ReceiverStream::new(rx)).await else {
        return acked;
    };
    let mut acks = resp.into_inner();
    let mut sent = std::collections::VecDeque::new();
    let base = ago(3600);
    for seq in 1..=max_batches {
        let mut events = Vec::new();
        for j in 0..10 {
            let job = format!("job-{seq}-{j}");
            events.push(event(&job, "s", base, submitted(pb::PoolKind::Managed, pb::PriorityClass::Normal, 4)));
            for k in 1..20 {
                events.push(event(
                    &job,
                    &format!("c{k}"),
                    base + k * 1000,
                    Kind::Checkpoint(pb::Checkpoint { step: k as u64, ..Default::default() }),
                ));
            }
        }
        let ids: Vec<(String, String)> = events.iter().map(|e| (e.job_id.clone(), e.event_id.clone())).collect();
        if tx.send(pb::PublishRequest { batch_seq: seq, events }).await.is_err() {
            break;
        }
        sent.push_back((seq, ids));
        // Keep up to 4 batches in flight.
        while sent.len() >= 4 {
            match acks.message().await {
                Ok(Some(ack)) => {
                    let (s, ids) = sent.pop_front().expect("in flight");
                    assert_eq!(ack.batch_seq, s);
                    assert_eq!(ack.accepted, 200);
                    acked.extend(ids);
                    progress.store(acked.len(), std::sync::atomic::Ordering::SeqCst);
                }
                _ => return acked,
            }
        }
    }
    drop(tx);
    while let Ok(Some(ack)) = acks.message().await {
        let (s, ids) = sent.pop_front().expect("in flight");
        assert_eq!(ack.batch_seq, s);
        acked.extend(ids);
    }
    acked
}

/// Waits until the streaming client has `n` events acknowledged (the crash must land mid-stream).
async fn wait_for_progress(progress: &std::sync::atomic::AtomicUsize, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while progress.load(std::sync::atomic::Ordering::SeqCst) < n {
        assert!(tokio::time::Instant::now() < deadline, "the client never got {n} events acknowledged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn stored_pairs(c: &Collector, jobs: &BTreeSet<String>) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for job in jobs {
        let (status, body) = c.get(&format!("/api/v1/jobs/{job}"));
        if status != 200 {
            continue;
        }
        for e in body["events"].as_array().expect("events") {
            out.insert((job.clone(), e["event_id"].as_str().expect("id").to_string()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_streaming_loses_no_acknowledged_event() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("db");
    let c = Collector::start(&db, &[]);
    let progress = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let client = tokio::spawn(stream_until_failure(c.endpoint(), 100_000, progress.clone()));
    // Let a good number of batches be acknowledged, then crash the collector mid-stream.
    wait_for_progress(&progress, 2000).await;
    let status = c.signal_and_wait("KILL");
    assert!(!status.success());
    let acked = client.await.expect("client task");
    assert!(acked.len() >= 2000, "only {} events acked before the crash", acked.len());

    let c = Collector::start(&db, &[]);
    let jobs: BTreeSet<String> = acked.iter().map(|(j, _)| j.clone()).collect();
    let stored = stored_pairs(&c, &jobs);
    let missing: Vec<_> = acked.difference(&stored).take(5).collect();
    assert!(missing.is_empty(), "{} acknowledged events lost, e.g. {missing:?}", acked.difference(&stored).count());
    // Each acknowledged job has its full timeline state back.
    let (_, j) = c.get(&format!("/api/v1/jobs/{}", jobs.iter().next().expect("a job")));
    assert_eq!(j["state"], "queued");
    assert_eq!(j["timeline"]["milestones"]["last_checkpoint"]["step"], 19);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_acks_checkpoints_and_exits_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("db");
    let c = Collector::start(&db, &[]);
    let progress = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let client = tokio::spawn(stream_until_failure(c.endpoint(), 100_000, progress.clone()));
    wait_for_progress(&progress, 1000).await;
    let status = c.signal_and_wait("TERM");
    assert!(status.success(), "exit status {status:?}");
    let acked = client.await.expect("client task");
    assert!(!acked.is_empty());

    // After a graceful stop the final checkpoint covers everything: nothing is replayed from the log.
    let c = Collector::start(&db, &[]);
    let log = std::fs::read_to_string(&c.log).expect("log");
    let restored_line = log.lines().rev().find(|l| l.contains("store restored")).expect("restore logged");
    assert!(restored_line.contains("replayed=0"), "{restored_line}");
    let jobs: BTreeSet<String> = acked.iter().map(|(j, _)| j.clone()).collect();
    let stored = stored_pairs(&c, &jobs);
    assert!(acked.is_subset(&stored), "{} acknowledged events lost", acked.difference(&stored).count());
}

/// Writes a config file with the given checkpoint interval next to the data directory.
fn config_with_checkpoint(dir: &std::path::Path, name: &str, interval: &str) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, format!("[store]\ncheckpoint_interval = \"{interval}\"\n")).expect("config");
    path
}

/// Sends every event of `events` on one unary call per batch and returns (accepted, duplicates) summed.
async fn publish_all(endpoint: String, events: &[pb::LifecycleEvent]) -> (u32, u32) {
    let mut client = IngestServiceClient::connect(endpoint).await.expect("connect");
    let (mut accepted, mut duplicates) = (0, 0);
    for (i, chunk) in events.chunks(200).enumerate() {
        let ack = client
            .publish_batch(pb::PublishRequest { batch_seq: i as u64 + 1, events: chunk.to_vec() })
            .await
            .expect("publish")
            .into_inner();
        assert!(ack.rejections.is_empty(), "{:?}", ack.rejections);
        accepted += ack.accepted;
        duplicates += ack.duplicates;
    }
    (accepted, duplicates)
}

/// Publishes `events` in parts 100 ms apart (with a 10 ms checkpoint interval a checkpoint follows each part's
/// commit, and the next part's group commit flushes that checkpoint's marker), then kills the collector.
async fn publish_in_parts_then_kill(c: Collector, events: &[pb::LifecycleEvent], part: usize) {
    for part in events.chunks(part) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(publish_all(c.endpoint(), part).await, (part.len() as u32, 0));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!c.signal_and_wait("KILL").success());
}

fn lifecycle(prefix: &str, jobs: usize) -> Vec<pb::LifecycleEvent> {
    let base = ago(7200);
    let mut out = Vec::new();
    for j in 0..jobs {
        let job = format!("{prefix}-{j}");
        out.push(event(&job, "s", base, submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Urgent, 8)));
        out.push(event(
            &job,
            "q",
            base + 1000,
            Kind::Queued(pb::Queued { reason: pb::WaitReason::Capacity as i32, ..Default::default() }),
        ));
        out.push(event(&job, "f", base + 60_000, Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })));
    }
    out
}

/// The second-crash loss (a regression test): jobs rebuilt from the log tail at restart were not marked changed, so the
/// next checkpoint moved the marker past them without writing their snapshots, and the restart after that
/// neither read them from a snapshot nor replayed them. Kill, restart, ingest, checkpoint, kill, restart: every
/// acknowledged event must still be in its timeline and be answered as a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_events_survive_a_second_crash_after_a_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("db");
    let never = config_with_checkpoint(dir.path(), "never", "1h");
    let often = config_with_checkpoint(dir.path(), "often", "10ms");
    let never_args = ["--config", never.to_str().expect("utf-8 path")];
    let often_args = ["--config", often.to_str().expect("utf-8 path")];

    // 1. Events A are acknowledged and live only in the log (no checkpoint yet); crash.
    let a = lifecycle("a", 50);
    let c = Collector::start(&db, &never_args);
    assert_eq!(publish_all(c.endpoint(), &a).await, (a.len() as u32, 0));
    assert!(!c.signal_and_wait("KILL").success());

    // 2. Restart (A comes back from the log tail); events B are acknowledged and checkpointed; crash.
    let b = lifecycle("b", 50);
    publish_in_parts_then_kill(Collector::start(&db, &often_args), &b, 30).await;

    // 3. Restart: every acknowledged event is there, and resending any of them is a duplicate.
    let c = Collector::start(&db, &never_args);
    let all: Vec<pb::LifecycleEvent> = a.iter().chain(&b).cloned().collect();
    let acked: BTreeSet<(String, String)> = all.iter().map(|e| (e.job_id.clone(), e.event_id.clone())).collect();
    let jobs: BTreeSet<String> = acked.iter().map(|(j, _)| j.clone()).collect();
    let stored = stored_pairs(&c, &jobs);
    let missing: Vec<_> = acked.difference(&stored).take(5).collect();
    assert!(missing.is_empty(), "{} acknowledged events lost, e.g. {missing:?}", acked.difference(&stored).count());
    for job in ["a-0", "a-49", "b-0"] {
        let (_, j) = c.get(&format!("/api/v1/jobs/{job}"));
        assert_eq!(j["state"], "running", "{job}: {j}");
    }
    assert_eq!(publish_all(c.endpoint(), &all).await, (0, all.len() as u32), "resent events must be duplicates");

    // 4. And once more through a checkpoint and a crash, to show the state is stable, not lucky.
    let c2_events = lifecycle("c", 10);
    drop(c);
    publish_in_parts_then_kill(Collector::start(&db, &often_args), &c2_events, 6).await;
    let c = Collector::start(&db, &never_args);
    let all: Vec<pb::LifecycleEvent> = all.into_iter().chain(c2_events).collect();
    assert_eq!(publish_all(c.endpoint(), &all).await, (0, all.len() as u32), "every acknowledged event is stored");
}
