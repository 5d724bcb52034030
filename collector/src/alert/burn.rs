//! Multi-window, multi-burn-rate alert rules over an SLO's decided jobs (Google SRE workbook, as Sloth ships
//! them): a rule fires when both its long and its short window burn faster than its factor, where
//! `factor = budget share x SLO window / long window` (14.4, 6, 3 and 1 for a 30-day window) and the short
//! window is a twelfth of the long one.
//!
//! Low-volume guard: job starts are rare, so a window holding one bad job can show an enormous burn rate. A rule
//! only fires when its long window holds at least `min_jobs` decided jobs and its short window at least one bad
//! job. Below that, the per-job page (an urgent job past its threshold while still waiting) is the signal.

use crate::slo::{burn_rate, SloEngine};

/// One rule.
#[derive(Debug, Clone, Copy)]
pub struct BurnRule {
    /// `page` or `ticket`.
    pub severity: &'static str,
    /// Share of the window's error budget this rule lets burn within its long window.
    pub budget_share: f64,
    /// Long window, ms.
    pub long_ms: i64,
    /// Short window, ms.
    pub short_ms: i64,
    /// Names of the two windows, e.g. `1h/5m`.
    pub windows: &'static str,
}

/// The four standard rules.
pub const RULES: [BurnRule; 4] = [
    BurnRule { severity: "page", budget_share: 0.02, long_ms: 3_600_000, short_ms: 300_000, windows: "1h/5m" },
    BurnRule { severity: "page", budget_share: 0.05, long_ms: 21_600_000, short_ms: 1_800_000, windows: "6h/30m" },
    BurnRule { severity: "ticket", budget_share: 0.10, long_ms: 86_400_000, short_ms: 7_200_000, windows: "1d/2h" },
    BurnRule { severity: "ticket", budget_share: 0.10, long_ms: 259_200_000, short_ms: 21_600_000, windows: "3d/6h" },
];

impl BurnRule {
    /// The burn-rate factor for an SLO window.
    pub fn factor(&self, slo_window_ms: i64) -> f64 {
        self.budget_share * slo_window_ms as f64 / self.long_ms as f64
    }
}

/// A rule that fires now, with what it saw.
#[derive(Debug, Clone, PartialEq)]
pub struct Firing {
    /// The rule.
    pub severity: &'static str,
    /// Its windows.
    pub windows: &'static str,
    /// Its factor.
    pub factor: f64,
    /// Burn rate over the long window.
    pub long_burn: f64,
    /// Burn rate over the short window.
    pub short_burn: f64,
}

/// The rules firing for SLO `i` at `now_ms`.
pub fn evaluate(engine: &SloEngine, i: usize, now_ms: i64, min_jobs: u64) -> Vec<Firing> {
    let Some(def) = engine.defs().get(i) else { return Vec::new() };
    let mut out = Vec::new();
    for r in RULES {
        let long = engine.counts(i, now_ms, r.long_ms);
        let short = engine.counts(i, now_ms, r.short_ms);
        if long.total() < min_jobs || short.bad == 0 {
            continue;
        }
        let factor = r.factor(def.window_ms);
        let (lb, sb) = (burn_rate(long, def.objective), burn_rate(short, def.objective));
        if lb >= factor && sb >= factor {
            out.push(Firing { severity: r.severity, windows: r.windows, factor, long_burn: lb, short_burn: sb });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{event_id_hash, CompactEvent, EventKind, JobAttrs, JobRecord};
    use crate::slo::SloDef;
    use startline_proto::pb;

    const T0: i64 = 1_767_225_600_000;

    /// `n` urgent jobs submitted a second apart 12 minutes before T0; the first `bad` never start (decided bad
    /// about 2 minutes before T0), the others start after a minute.
    fn engine_with(n: i64, bad: i64) -> SloEngine {
        let mut e = SloEngine::new(SloDef::defaults());
        for i in 0..n {
            let id = format!("j{i}");
            let sub = T0 - 12 * 60_000 + i * 1000;
            let attrs = std::sync::Arc::new(JobAttrs {
                pool_kind: pb::PoolKind::Managed,
                provider: "p".into(),
                pool: "p".into(),
                priority: pb::PriorityClass::Urgent,
                gpu_class: String::new(),
                gpu_count: 1,
                node_count: 1,
                region: String::new(),
                team: String::new(),
                project: String::new(),
                chain_id: String::new(),
                chain_stage: String::new(),
                labels: Default::default(),
            });
            let mut evs = vec![CompactEvent {
                at_ms: sub,
                id_hash: event_id_hash(&id),
                seq: 0,
                attempt: None,
                kind: EventKind::Submitted(attrs),
            }];
            if i >= bad {
                evs.push(CompactEvent {
                    at_ms: sub + 60_000,
                    id_hash: 1,
                    seq: 0,
                    attempt: None,
                    kind: EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified },
                });
            }
            let rec = JobRecord::from_events(evs);
            e.on_job(&id, &rec.timeline, &mut Vec::new(), T0);
        }
        e
    }

    #[test]
    fn low_volume_guard_keeps_a_single_bad_job_from_paging() {
        // One job, bad: burn rate 100x, but below min_jobs.
        assert!(evaluate(&engine_with(1, 1), 0, T0, 5).is_empty());
        // Ten jobs, three bad: 30% bad / 1% budget = 30x over 1h and 5m -> both page rules (13.44x, 5.6x) fire.
        let f = evaluate(&engine_with(10, 3), 0, T0, 5);
        let windows: Vec<&str> = f.iter().map(|x| x.windows).collect();
        assert!(windows.contains(&"1h/5m") && windows.contains(&"6h/30m"), "{f:?}");
        assert!(f.iter().all(|x| (x.long_burn - 30.0).abs() < 1e-9 || x.windows != "1h/5m"));
        // Ten jobs, none bad: nothing.
        assert!(evaluate(&engine_with(10, 0), 0, T0, 5).is_empty());
    }

    #[test]
    fn factors_match_the_workbook_for_30_days() {
        let month = 30 * 86_400_000;
        let f: Vec<f64> = RULES.iter().map(|r| (r.factor(month) * 1000.0).round() / 1000.0).collect();
        assert_eq!(f, [14.4, 6.0, 3.0, 1.0]);
        for r in RULES {
            assert_eq!(r.long_ms, r.short_ms * 12);
        }
    }
}
