//! The index keeps its book of waits ([`crate::slo::eta::WaitBook`]) as jobs change: after any sequence of
//! events (late ones included), folds, unfolds and removals, it holds exactly what filing every job's current
//! timeline afresh gives.

use super::*;
use crate::job::{EventKind, JobAttrs};
use proptest::prelude::*;
use startline_proto::pb;

#[derive(Debug, Clone)]
enum Op {
    /// An event for job `job` at minute `m`.
    Event { job: usize, m: i64, kind: u8, pick: u8 },
    /// Fold the job if it ended.
    Fold { job: usize },
    /// Delete the job.
    Remove { job: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..5, 0i64..200, 0u8..5, 0u8..4).prop_map(|(job, m, kind, pick)| Op::Event { job, m, kind, pick }),
        1 => (0usize..5).prop_map(|job| Op::Fold { job }),
        1 => (0usize..5).prop_map(|job| Op::Remove { job }),
    ]
}

fn kind(kind: u8, pick: u8) -> EventKind {
    let reasons = [pb::WaitReason::Capacity, pb::WaitReason::Quota, pb::WaitReason::Priority, pb::WaitReason::Capacity];
    match kind {
        0 => {
            let mut a = JobAttrs::unknown();
            a.pool = if pick % 2 == 0 { "a" } else { "b" }.into();
            a.gpu_class = "h100".into();
            a.gpu_count = if pick < 2 { 8 } else { 1 };
            EventKind::Submitted(Arc::new(a))
        }
        1 => EventKind::Queued {
            reason: reasons[pick as usize],
            raw_reason: "r".into(),
            estimated_start: (pick % 2 == 1).then_some(1_767_225_600_000 + i64::from(pick) * 600_000),
        },
        2 => EventKind::FirstStep { step: 0, origin: pb::StepOrigin::TrainingProcess },
        3 => EventKind::NodeAssigned { nodes: Arc::from(Vec::<Arc<str>>::new()) },
        _ => EventKind::Done { outcome: pb::Outcome::Cancelled, exit_code: None },
    }
}

/// The book filed afresh from every job's events.
fn afresh(events: &BTreeMap<String, Vec<CompactEvent>>) -> WaitBook {
    let mut book = WaitBook::default();
    for (id, evs) in events {
        let rec = JobRecord::from_events(evs.clone());
        book.replace(job_hash(id), None, wait_entry(&rec.timeline, &rec.events).as_ref());
    }
    book
}

proptest! {
    #[test]
    fn the_book_follows_every_change(ops in prop::collection::vec(op(), 1..60)) {
        let now = 1_767_225_600_000 + 300 * 60_000;
        let mut idx = JobIndex::default();
        let mut events: BTreeMap<String, Vec<CompactEvent>> = BTreeMap::new();
        let mut seq = 0;
        let mut summary = 0;
        for op in ops {
            match op {
                Op::Event { job, m, kind: k, pick } => {
                    let id = format!("j{job}");
                    seq += 1;
                    let ev = CompactEvent {
                        at_ms: 1_767_225_600_000 + m * 60_000,
                        id_hash: seq,
                        seq,
                        attempt: None,
                        kind: kind(k, pick),
                    };
                    if idx.folded(&id).is_some() {
                        prop_assert!(idx.unfold(&id, events[&id].clone(), now));
                    }
                    idx.insert(&id, ev.clone(), now);
                    events.entry(id).or_default().push(ev);
                }
                Op::Fold { job } => {
                    summary += 1;
                    let id = format!("j{job}");
                    let _ = idx.fold(&id, summary);
                }
                Op::Remove { job } => {
                    let id = format!("j{job}");
                    let _ = idx.remove(&id, now);
                    events.remove(&id);
                }
            }
            prop_assert_eq!(&idx.waits, &afresh(&events));
        }
    }
}

/// The API reads expected starts from the index's book (`eta::for_job` on `idx.waits`, as `GET /api/v1/jobs` and
/// `GET /api/v1/jobs/{job_id}` do): with enough jobs of a pool filed, a waiting job's estimate rests on the pool's
/// queue state, with the jobs ranked ahead of it counted from what the index holds.
#[test]
fn the_api_path_reads_the_queue_state_the_index_keeps() {
    let t0 = 1_767_225_600_000;
    let mut idx = JobIndex::default();
    let mut seq = 0;
    let mut push = |idx: &mut JobIndex, id: &str, at: i64, kind: EventKind| {
        seq += 1;
        idx.insert(id, CompactEvent { at_ms: at, id_hash: seq, seq, attempt: None, kind }, at);
    };
    let attrs = |gpus: u32, priority: pb::PriorityClass| {
        let mut a = JobAttrs::unknown();
        a.pool = "q".into();
        a.gpu_class = "h100".into();
        a.gpu_count = gpus;
        a.priority = priority;
        EventKind::Submitted(Arc::new(a))
    };
    let queued =
        || EventKind::Queued { reason: pb::WaitReason::Capacity, raw_reason: "r".into(), estimated_start: None };
    // 24 jobs of 8 GPUs, one every 10 minutes, each started 4 minutes after its submit.
    for i in 0..24 {
        let id = format!("s{i}");
        push(&mut idx, &id, t0 + i * 600_000, attrs(8, pb::PriorityClass::Normal));
        push(
            &mut idx,
            &id,
            t0 + i * 600_000 + 240_000,
            EventKind::FirstStep { step: 0, origin: pb::StepOrigin::TrainingProcess },
        );
    }
    // Waiting: w0 (4 GPUs) and w1 (8 GPUs), then w2 (2 GPUs) behind them.
    let base = t0 + 240 * 60_000;
    for (id, m, gpus) in [("w0", 0, 4), ("w1", 1, 8), ("w2", 2, 2)] {
        push(&mut idx, id, base + m * 60_000, attrs(gpus, pb::PriorityClass::Normal));
        push(&mut idx, id, base + m * 60_000, queued());
    }
    let now = base + 10 * 60_000;
    let t = &idx.jobs["w2"].rec.timeline;
    let e = eta::for_job(&idx.waits, t, None, now).expect("an estimate");
    assert_eq!(e.basis, eta::Basis::QueueState);
    assert_eq!(e.ahead, Some((2, 12)));
    let api = crate::api::eta::ExpectedStart::of(&e);
    assert_eq!((api.basis, api.jobs_ahead, api.gpus_ahead), ("queue_state", Some(2), Some(12)));
    // The first in line has nothing ahead.
    let e = eta::for_job(&idx.waits, &idx.jobs["w0"].rec.timeline, None, now).expect("an estimate");
    assert_eq!(e.ahead, Some((0, 0)));
}
