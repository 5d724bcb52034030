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
