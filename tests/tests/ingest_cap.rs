//! The per-job event cap (`store.max_events_per_job`): a new event of a job that holds the cap is not stored and
//! its batch's ack rejects it by index, naming `job_id` and the setting; duplicates of the job's stored events are
//! still answered as duplicates; other jobs are unaffected; the cap holds across a restart.

use startline_proto::pb::{self, ingest_service_client::IngestServiceClient, lifecycle_event::Kind};
use startline_tests::{ago, event, submitted, Collector};

const CAP: usize = 5;

fn checkpoint(job: &str, k: u64, base: i64) -> pb::LifecycleEvent {
    event(
        job,
        &format!("c{k}"),
        base + k as i64 * 1000,
        Kind::Checkpoint(pb::Checkpoint { step: k, ..Default::default() }),
    )
}

fn start(db: &std::path::Path, cfg: &std::path::Path) -> Collector {
    Collector::start(db, &["--config", cfg.to_str().expect("utf8")])
}

async fn publish(c: &Collector, batch_seq: u64, events: Vec<pb::LifecycleEvent>) -> pb::PublishAck {
    let mut client = IngestServiceClient::connect(c.endpoint()).await.expect("connect");
    client.publish_batch(pb::PublishRequest { batch_seq, events }).await.expect("acked").into_inner()
}

fn stored_ids(c: &Collector, job: &str) -> Vec<String> {
    let (status, body) = c.get(&format!("/api/v1/jobs/{job}"));
    assert_eq!(status, 200, "{body}");
    let mut ids: Vec<String> = body["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["event_id"].as_str().expect("id").to_string())
        .collect();
    ids.sort();
    ids
}

/// The rejections of an ack as (index, event_id, field), checking every reason names the cap.
fn cap_rejections(ack: &pb::PublishAck) -> Vec<(u32, String, String)> {
    ack.rejections
        .iter()
        .filter(|r| r.field == "job_id")
        .map(|r| {
            assert_eq!(
                r.reason,
                format!("job has reached store.max_events_per_job = {CAP} events; event not stored"),
                "{r:?}"
            );
            (r.index, r.event_id.clone(), r.field.clone())
        })
        .collect()
}

fn rej(index: u32, id: &str) -> (u32, String, String) {
    (index, id.to_string(), "job_id".to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_over_the_per_job_cap_are_rejected_by_index_and_duplicates_still_answered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("db");
    let cfg = dir.path().join("collector.toml");
    std::fs::write(&cfg, format!("[store]\nmax_events_per_job = {CAP}\ncheckpoint_interval = \"10ms\"\n"))
        .expect("config");
    let c = start(&db, &cfg);
    let base = ago(3600);
    let sub = || event("busy", "s", base, submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Normal, 8));
    let other = |id: &str| event("other", id, base, submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Normal, 8));

    // 7 events of the busy job in one batch: 5 fit; the 6th and 7th (indices 5, 6) are rejected. The other
    // job's event after them is stored.
    let mut batch = vec![sub()];
    batch.extend((1..=6).map(|k| checkpoint("busy", k, base)));
    batch.push(other("s"));
    let ack = publish(&c, 1, batch.clone()).await;
    assert_eq!((ack.batch_seq, ack.accepted, ack.duplicates), (1, 5 + 1, 0), "{ack:?}");
    assert_eq!(cap_rejections(&ack), vec![rej(5, "c5"), rej(6, "c6")]);
    assert_eq!(ack.rejections.len(), 2, "{ack:?}");

    // The same batch again: the stored events are duplicates (the busy job is full, yet they are answered as
    // duplicates), the two that never got in are rejected again.
    let ack = publish(&c, 2, batch).await;
    assert_eq!((ack.accepted, ack.duplicates), (0, 5 + 1), "{ack:?}");
    assert_eq!(cap_rejections(&ack), vec![rej(5, "c5"), rej(6, "c6")]);

    // Mixed with a validation rejection, the indices are the batch's and in order; two copies of a rejected
    // event in one batch are both rejected (the first was not stored, so the second is no duplicate).
    let invalid = event("busy", "", base, Kind::NodeAssigned(Default::default()));
    let batch = vec![
        invalid,
        checkpoint("busy", 7, base),
        other("o1"),
        checkpoint("busy", 7, base),
        checkpoint("busy", 1, base),
    ];
    let ack = publish(&c, 3, batch).await;
    assert_eq!((ack.accepted, ack.duplicates), (1, 1), "{ack:?}");
    assert_eq!(ack.rejections.len(), 3, "{ack:?}");
    assert_eq!(ack.rejections[0].index, 0);
    assert_eq!(ack.rejections[0].field, "event_id", "{ack:?}");
    assert_eq!(cap_rejections(&ack), vec![rej(1, "c7"), rej(3, "c7")]);

    let busy: Vec<String> = ["c1", "c2", "c3", "c4", "s"].into_iter().map(String::from).collect();
    assert_eq!(stored_ids(&c, "busy"), busy);
    assert_eq!(stored_ids(&c, "other"), vec!["o1".to_string(), "s".to_string()]);

    // After a restart (the job restored from its snapshot and the log) the cap still holds.
    let status = c.signal_and_wait("TERM");
    assert!(status.success(), "{status}");
    let c = start(&db, &cfg);
    let ack = publish(&c, 4, vec![checkpoint("busy", 8, base), checkpoint("busy", 2, base), other("o2")]).await;
    assert_eq!((ack.accepted, ack.duplicates), (1, 1), "{ack:?}");
    assert_eq!(cap_rejections(&ack), vec![rej(0, "c8")]);
    assert_eq!(stored_ids(&c, "busy"), busy);
}
