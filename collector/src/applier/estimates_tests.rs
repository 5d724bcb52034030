//! The estimate sweep against a model of what a subscriber holds: after a sweep whose notes the committer
//! wrote at once, every waiting job that has an estimate has one delivered, made in its current state and
//! segment, within the reportable move of its estimate now; and none was written for a job that had left the
//! state or segment it was estimated in; and the sweep remembers no job that stopped waiting; after any sequence of submits, reason changes, starts, ends, deletes,
//! time passing, and sweeps whose notes race with later events.

use super::*;
use crate::index::JobIndex;
use crate::job::{CompactEvent, EventKind, JobAttrs};
use proptest::prelude::*;
use startline_proto::pb;
use std::collections::BTreeMap;

const T0: i64 = 1_767_225_600_000;
const MIN: i64 = 60_000;
const JOBS: usize = 6;

fn attrs() -> Arc<JobAttrs> {
    let mut a = JobAttrs::unknown();
    a.pool = "p".into();
    a.gpu_class = "h100".into();
    a.gpu_count = 8;
    Arc::new(a)
}

fn queued(reason: pb::WaitReason, estimated_start: Option<i64>) -> EventKind {
    EventKind::Queued { reason, raw_reason: "r".into(), estimated_start }
}

struct World {
    index: SharedIndex,
    stream: Arc<Stream>,
    seq: u64,
}

impl World {
    /// An index holding the pool's history: 40 jobs started after 10 to 49 minutes.
    fn new() -> World {
        let w = World {
            index: SharedIndex::new(JobIndex::default()),
            stream: Stream::new(crate::stream::StreamSettings::default()),
            seq: 0,
        };
        let mut w = w;
        for i in 0..40 {
            let id = format!("old-{i:02}");
            let at = T0 - 86_400_000 + i * 10 * MIN;
            w.event(&id, at, EventKind::Submitted(attrs()), T0);
            w.event(
                &id,
                at + (10 + i) * MIN,
                EventKind::FirstStep { step: 1, origin: pb::StepOrigin::TrainingProcess },
                T0,
            );
        }
        w
    }

    fn event(&mut self, id: &str, at_ms: i64, kind: EventKind, now: i64) {
        self.seq += 1;
        let ev = CompactEvent { at_ms, id_hash: self.seq, seq: self.seq, attempt: None, kind };
        self.index.write().insert(id, ev, now);
    }

    /// The committer's part: the notes still true of their jobs are delivered (returned), the others named
    /// back, as `StreamWriter::estimate_records` does.
    fn commit(&self) -> Vec<EstimateNote> {
        let idx = self.index.read();
        let mut written = Vec::new();
        let mut dropped = Vec::new();
        for n in self.stream.take_estimates() {
            match idx.jobs.get(&n.job_id).filter(|h| n.holds_for(&h.rec.timeline)) {
                Some(_) => written.push(n),
                None => dropped.push(n.job_id),
            }
        }
        self.stream.estimates_dropped(dropped);
        written
    }
}

#[test]
fn a_first_sweep_posts_every_waiting_job_and_an_unchanged_one_nothing() {
    let mut w = World::new();
    let now = T0 + 30 * MIN;
    w.event("a", T0, EventKind::Submitted(attrs()), now);
    w.event("a", T0 + 1000, queued(pb::WaitReason::Capacity, None), now);
    w.event("b", T0 + 5 * MIN, EventKind::Submitted(attrs()), now);
    let mut s = Sweeper::new(w.index.clone(), w.stream.clone());
    let swept = s.sweep(now, &|| false);
    assert_eq!(swept, Swept { waiting: 2, posted: 2 });
    let notes = w.commit();
    let ids: Vec<&str> = notes.iter().map(|n| n.job_id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
    // The same estimates as the job listing's, and the view they were made in.
    for n in &notes {
        let idx = w.index.read();
        let t = &idx.jobs[&n.job_id].rec.timeline;
        assert_eq!(Some(&n.eta), eta::for_job(&idx.waits, t, None, now).as_ref());
    }
    assert_eq!(notes[0].segment.map(crate::job::Segment::label).as_deref(), Some("queued:capacity"));
    // A second sweep a second later: nothing moved.
    assert_eq!(s.sweep(now + 1000, &|| false), Swept { waiting: 2, posted: 0 });
    assert!(w.commit().is_empty());
    // A stop asked before the first chunk leaves everything for the next sweep.
    assert_eq!(s.sweep(now + 2000, &|| true), Swept::default());
}

#[derive(Debug, Clone)]
enum Op {
    Submit { job: usize },
    Queue { job: usize, reason: u8, estimate_in: Option<u8> },
    Start { job: usize },
    End { job: usize },
    Delete { job: usize },
    Wait { minutes: u8 },
    Sweep,
    Commit,
    SweepAndCommit,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..JOBS).prop_map(|job| Op::Submit { job }),
        3 => (0..JOBS, 0u8..3, proptest::option::of(0u8..120)).prop_map(|(job, reason, estimate_in)| Op::Queue { job, reason, estimate_in }),
        1 => (0..JOBS).prop_map(|job| Op::Start { job }),
        1 => (0..JOBS).prop_map(|job| Op::End { job }),
        1 => (0..JOBS).prop_map(|job| Op::Delete { job }),
        3 => (0u8..90).prop_map(|minutes| Op::Wait { minutes }),
        1 => Just(Op::Sweep),
        1 => Just(Op::Commit),
        3 => Just(Op::SweepAndCommit),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]
    #[test]
    fn a_subscriber_holds_every_waiting_jobs_estimate_within_the_reportable_move(
        ops in prop::collection::vec(op(), 1..80)
    ) {
        let mut w = World::new();
        let mut s = Sweeper::new(w.index.clone(), w.stream.clone());
        let mut now = T0 + 60 * MIN;
        // What a subscriber holds: the last estimate written per job, and the view it was made in.
        let mut held: BTreeMap<String, EstimateNote> = BTreeMap::new();
        let reasons = [pb::WaitReason::Capacity, pb::WaitReason::Quota, pb::WaitReason::Priority];
        for op in ops {
            let mut delivered = Vec::new();
            match op {
                Op::Submit { job } => w.event(&format!("j{job}"), now, EventKind::Submitted(attrs()), now),
                Op::Queue { job, reason, estimate_in } => {
                    let est = estimate_in.map(|m| now + i64::from(m) * MIN);
                    w.event(&format!("j{job}"), now, queued(reasons[reason as usize], est), now);
                }
                Op::Start { job } => w.event(&format!("j{job}"), now, EventKind::FirstStep { step: 1, origin: pb::StepOrigin::TrainingProcess }, now),
                Op::End { job } => w.event(&format!("j{job}"), now, EventKind::Done { outcome: pb::Outcome::Cancelled, exit_code: None }, now),
                Op::Delete { job } => {
                    let _ = w.index.write().remove(&format!("j{job}"), now);
                }
                Op::Wait { minutes } => now += i64::from(minutes) * MIN + 1,
                Op::Sweep => {
                    s.sweep(now, &|| false);
                }
                Op::Commit => delivered = w.commit(),
                Op::SweepAndCommit => {
                    s.sweep(now, &|| false);
                    delivered = w.commit();
                }
            }
            // A delivered note is true of its job at delivery.
            for n in delivered {
                let idx = w.index.read();
                let h = idx.jobs.get(&n.job_id);
                prop_assert!(h.is_some_and(|h| n.holds_for(&h.rec.timeline) && h.rec.timeline.state.is_waiting()));
                held.insert(n.job_id.clone(), n);
            }
            if matches!(op, Op::SweepAndCommit) {
                let idx = w.index.read();
                // The sweep remembers waiting jobs only.
                let waiting = idx.jobs.values().filter(|h| h.rec.timeline.state.is_waiting()).count();
                prop_assert!(s.posted.len() <= waiting, "{} remembered, {waiting} waiting", s.posted.len());
                for (id, h) in &idx.jobs {
                    let Some(e) = eta::for_job(&idx.waits, &h.rec.timeline, None, now) else { continue };
                    let seen = held.get(id);
                    prop_assert!(seen.is_some(), "{id} waits with an estimate and none was delivered");
                    prop_assert!(seen.is_some_and(|n| n.holds_for(&h.rec.timeline)), "{id}: delivered in another view");
                    prop_assert!(
                        !eta::reportable_move(seen.map(|n| &n.eta), Some(&e), now),
                        "{id}: delivered {:?}, now {:?}", seen.map(|n| n.eta.at_ms), e.at_ms
                    );
                }
            }
        }
    }
}
