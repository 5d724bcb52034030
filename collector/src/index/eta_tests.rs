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
