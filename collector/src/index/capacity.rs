//! The capacity basis' signal counted from the live jobs: by GPU class (pool when a job names none), the jobs
//! reported queued for capacity in the last `prediction.capacity_window` that still wait, and the jobs that
//! started in it ([`crate::slo::predict::CapacitySignals`]). The alert loop asks for it at each prediction sweep.

use super::JobIndex;
use crate::slo::predict::{class_scope, CapacitySignals, CapacityView};

impl JobIndex {
    /// The capacity signal of every GPU class (or pool) over `(now - window_ms, now]`, from the jobs in memory
    /// (every waiting job is; a job that started in a window of minutes still is).
    pub fn capacity_signals(&self, window_ms: i64, now: i64) -> CapacitySignals {
        let mut out = CapacitySignals::new(window_ms, now);
        for h in self.jobs.values() {
            let t = &h.rec.timeline;
            let v = CapacityView::of(t);
            // Most jobs neither queued for capacity nor started lately: no scope to build for them.
            let Some(a) = t.attrs.as_ref().filter(|_| out.counts_view(&v)) else { continue };
            out.add(&class_scope(&a.pool, &a.gpu_class), v);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{CompactEvent, EventKind, JobAttrs};
    use startline_proto::pb;
    use std::sync::Arc;

    const MIN: i64 = 60_000;
    const T0: i64 = 1_767_225_600_000;

    struct Feed {
        idx: JobIndex,
        seq: u64,
    }

    impl Feed {
        fn ev(&mut self, job: &str, m: i64, kind: EventKind) {
            self.seq += 1;
            let ev = CompactEvent { at_ms: T0 + m * MIN, id_hash: self.seq, seq: self.seq, attempt: None, kind };
            self.idx.insert(job, ev, T0 + m * MIN);
        }
        fn submit(&mut self, job: &str, m: i64, pool: &str, class: &str) {
            let mut a = JobAttrs::unknown();
            a.pool = pool.into();
            a.gpu_class = class.into();
            self.ev(job, m, EventKind::Submitted(Arc::new(a)));
        }
        fn queued(&mut self, job: &str, m: i64, reason: pb::WaitReason, raw: &str) {
            self.ev(job, m, EventKind::Queued { reason, raw_reason: Arc::from(raw), estimated_start: None });
        }
        fn assigned(&mut self, job: &str, m: i64) {
            self.ev(job, m, EventKind::NodeAssigned { nodes: vec![Arc::from("n1")].into() });
        }
        fn at(&self, m: i64, scope: &str) -> (usize, usize, usize) {
            let s = self.idx.capacity_signals(10 * MIN, T0 + m * MIN);
            let (q, st) = s.counts(scope);
            (q, st, s.out_of_capacity(scope))
        }
    }

    /// A crunch on class h100, in two pools: jobs queue for capacity and the count rises; a start clears it; the
    /// window passing lets it fall; jobs of another class or another reason never count.
    #[test]
    fn the_signal_rises_as_jobs_queue_for_capacity_and_falls_when_one_starts_or_the_window_passes() {
        let mut f = Feed { idx: JobIndex::default(), seq: 0 };
        let h = "class:h100";
        // Minute 0: a job of the class starts (nodes assigned at 1).
        f.submit("s0", 0, "slurm-h100", "h100");
        f.queued("s0", 0, pb::WaitReason::Capacity, "Resources");
        f.assigned("s0", 1);
        assert_eq!(f.at(1, h), (0, 1, 0));
        // Minutes 5, 7, 9: three jobs queue for capacity in two pools (Slurm's Resources, a managed stock-out).
        f.submit("a", 5, "slurm-h100", "h100");
        f.queued("a", 5, pb::WaitReason::Capacity, "Resources");
        f.submit("b", 7, "vertex-a3", "h100");
        f.queued("b", 7, pb::WaitReason::Capacity, "Resources are insufficient in region");
        // Waiting for quota or priority is not capacity; another class is another scope.
        f.submit("q", 8, "vertex-a3", "h100");
        f.queued("q", 8, pb::WaitReason::Quota, "Quota exceeded");
        f.submit("x", 8, "a100", "a100-80g");
        f.queued("x", 8, pb::WaitReason::Capacity, "Resources");
        f.submit("c", 9, "slurm-h100", "h100");
        f.queued("c", 9, pb::WaitReason::Capacity, "Resources");
        // At 9: 3 queued, but s0's start at 1 is still within 10 minutes.
        assert_eq!(f.at(9, h), (3, 1, 0));
        // At 11 the start has left the window: out of capacity, 3 jobs.
        assert_eq!(f.at(11, h), (3, 0, 3));
        // Rising: a fourth at 12.
        f.submit("d", 12, "vertex-a3", "h100");
        f.queued("d", 12, pb::WaitReason::Capacity, "Resources are insufficient in region");
        assert_eq!(f.at(12, h), (4, 0, 4));
        assert_eq!(f.at(12, "class:a100-80g"), (1, 0, 1));
        // Falling: at 16, a's report of minute 5 left the window.
        assert_eq!(f.at(16, h), (3, 0, 3));
        // A start (b gets nodes at 17) clears the signal, and b no longer waits.
        f.assigned("b", 17);
        assert_eq!(f.at(17, h), (2, 1, 0));
        // A job reported again (c re-queued for capacity at 18, e.g. a new message) counts from its latest report.
        f.queued("c", 18, pb::WaitReason::Capacity, "Resources");
        assert_eq!(f.at(27, h), (1, 0, 1));
        // Long after: nothing recent.
        assert_eq!(f.at(60, h), (0, 0, 0));
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        /// What happens to one job at one minute.
        #[derive(Debug, Clone, Copy)]
        enum Step {
            /// Queued for capacity.
            Capacity,
            /// Queued for quota.
            Quota,
            /// Nodes assigned.
            Assigned,
        }

        fn step() -> impl Strategy<Value = Step> {
            prop_oneof![Just(Step::Capacity), Just(Step::Quota), Just(Step::Assigned)]
        }

        proptest! {
            /// Long random sequences of capacity waits, quota waits and starts over 6 jobs of two classes, fed
            /// one event at a time through the index (a job's steps a minute or more apart): at every minute the
            /// signal equals a plain model's, which reads each job's own steps (its last step is a capacity wait
            /// reported in the window; its last start lies in the window).
            #[test]
            fn the_signal_matches_a_model_of_each_jobs_last_steps(
                ops in prop::collection::vec((0usize..6, 1i64..4, step()), 1..80),
                window in 1i64..20,
            ) {
                let mut f = Feed { idx: JobIndex::default(), seq: 0 };
                let class = |j: usize| if j % 2 == 0 { "h100" } else { "a100" };
                for j in 0..6 {
                    f.submit(&format!("j{j}"), 0, &format!("p{}", j % 3), class(j));
                }
                // Per job: its steps so far, (minute, step).
                let mut seen: Vec<Vec<(i64, Step)>> = vec![Vec::new(); 6];
                let mut m = 0i64;
                for (j, gap, st) in ops {
                    m += gap;
                    let id = format!("j{j}");
                    match st {
                        Step::Capacity => f.queued(&id, m, pb::WaitReason::Capacity, "Resources"),
                        Step::Quota => f.queued(&id, m, pb::WaitReason::Quota, "QOSGrpGRES"),
                        Step::Assigned => f.assigned(&id, m),
                    }
                    seen[j].push((m, st));
                    let now = T0 + m * MIN;
                    let sig = f.idx.capacity_signals(window * MIN, now);
                    for c in ["h100", "a100"] {
                        let (mut queued, mut started) = (0, 0);
                        for steps in seen.iter().enumerate().filter(|(k, _)| class(*k) == c).map(|(_, s)| s) {
                            let inside = |t: i64| t > m - window && t <= m;
                            // The last step decides where it waits.
                            if let Some((t, Step::Capacity)) = steps.last() {
                                queued += usize::from(inside(*t));
                            }
                            // A start: nodes assigned to a job that was not placed (its first assignment, or
                            // the first after a wait); more nodes for a placed job are the same start.
                            let start = steps
                                .iter()
                                .enumerate()
                                .filter(|(i, (_, s))| {
                                    matches!(s, Step::Assigned)
                                        && (*i == 0 || !matches!(steps[i - 1].1, Step::Assigned))
                                })
                                .map(|(_, (t, _))| *t)
                                .next_back();
                            if let Some(t) = start {
                                started += usize::from(inside(t));
                            }
                        }
                        let scope = format!("class:{c}");
                        prop_assert_eq!(sig.counts(&scope), (queued, started), "minute {}, {}", m, c);
                        let want = if started == 0 { queued } else { 0 };
                        prop_assert_eq!(sig.out_of_capacity(&scope), want);
                    }
                }
            }
        }
    }
}
