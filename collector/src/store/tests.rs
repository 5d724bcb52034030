//! Store tests on a real sled directory: write, close, reopen, identical state.

use super::*;
use crate::job::JobState;
use startline_proto::pb::lifecycle_event::Kind;
use startline_proto::time::ms_to_timestamp;

fn ev(job: &str, id: &str, at: i64, kind: Kind) -> pb::LifecycleEvent {
    pb::LifecycleEvent {
        event_id: id.into(),
        job_id: job.into(),
        attempt: None,
        source: "test".into(),
        occurred_at: Some(ms_to_timestamp(at)),
        kind: Some(kind),
    }
}

fn submitted() -> Kind {
    Kind::Submitted(pb::Submitted {
        pool_kind: pb::PoolKind::Managed as i32,
        provider: "sagemaker".into(),
        pool: "ml.p4d".into(),
        priority: pb::PriorityClass::Urgent as i32,
        gpu_count: 8,
        ..Default::default()
    })
}

/// Writes events through the store the way the committer does, updating an in-memory map alongside.
fn write(store: &Store, mem: &mut BTreeMap<String, JobRecord>, seq: &mut u64, events: &[pb::LifecycleEvent]) {
    let mut entries = Vec::new();
    for e in events {
        *seq += 1;
        entries.push((*seq, encode_log_value(e)));
        let ce = CompactEvent::from_pb(e, *seq).expect("has kind");
        mem.entry(e.job_id.clone()).or_default().insert(ce);
    }
    store.append_durable(&entries).expect("append");
}

#[test]
fn reopen_restores_identical_state_from_snapshots_and_log_tail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut mem = BTreeMap::new();
    let mut seq = 0;
    {
        let store = Store::open(dir.path()).expect("open");
        write(
            &store,
            &mut mem,
            &mut seq,
            &[
                ev("a", "a1", 1_000_000, submitted()),
                ev("a", "a2", 1_060_000, Kind::FirstStep(pb::FirstStep { step: 1 })),
                ev("b", "b1", 1_000_000, submitted()),
            ],
        );
        // Checkpoint covers a and b so far; later events live only in the log tail.
        let through = seq;
        store.checkpoint(mem.iter().map(|(k, v)| (k.as_str(), v)), through).expect("checkpoint");
        write(
            &store,
            &mut mem,
            &mut seq,
            &[
                ev(
                    "b",
                    "b2",
                    1_100_000,
                    Kind::Queued(pb::Queued { reason: 1, raw_reason: "Pending".into(), message: String::new() }),
                ),
                ev("c", "c1", 1_200_000, Kind::FirstStep(pb::FirstStep { step: 1 })),
            ],
        );
    }
    let store = Store::open(dir.path()).expect("reopen");
    let restored = store.restore().expect("restore");
    assert_eq!(restored.snapshots, 2);
    assert_eq!(restored.replayed, 2, "only the tail after the checkpoint is replayed");
    assert_eq!(restored.last_seq, seq);
    assert_eq!(restored.jobs, mem);
    // A job still waiting is known after reopen, with its wait reason.
    let b = &restored.jobs["b"].timeline;
    assert_eq!(b.state, JobState::Queued);
    assert_eq!(b.current_raw_reason.as_deref(), Some("Pending"));
    // A job whose submitted has not arrived yet is kept.
    assert_eq!(restored.jobs["c"].timeline.state, JobState::Unsubmitted);
    // Raw events are readable by sequence.
    assert_eq!(store.event(1).expect("read").map(|e| e.event_id), Some("a1".to_string()));
}

#[test]
fn empty_store_restores_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let r = store.restore().expect("restore");
    assert!(r.jobs.is_empty());
    assert_eq!(r.last_seq, 0);
}
