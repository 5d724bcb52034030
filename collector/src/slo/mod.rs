//! Start SLOs: which jobs count as good or bad for each objective, the rolling windows of counts and
//! exact times to first step, the deadline index that finds threshold crossings while jobs still wait,
//! and the maths of compliance, error budget and burn rates.
//!
//! Rules (also in the docs: docs/concepts.md, "SLOs and burn rates"):
//! - a covered job is **good** when its first step comes within the threshold (decided at the first step);
//! - it is **bad** the moment it crosses the threshold still waiting (decided at `submitted + threshold`), or
//!   when it ends before its first step (decided at the end, or at the deadline if that came first);
//! - a job the user cancelled before its deadline is **excluded** when the SLO says so (default);
//! - a job still waiting before its deadline is **pending**: not yet in good, bad or total.
//!
//! Decision times come from event timestamps, never arrival times, so late and out-of-order events land in the
//! right buckets; each job's current contribution is remembered and replaced when its timeline changes, so a
//! late first step that turns a breach into a success moves the job from bad to good instead of counting twice.
//!
//! Pure: time arrives as `now_ms`.

pub mod chain;
pub mod def;
pub mod eta;
pub mod predict;
pub mod window;

use crate::job::Timeline;
pub use def::{Hours, Selector, SloDef};
use serde::Serialize;
use startline_proto::pb;
use std::collections::BTreeSet;
use window::{Counts, WindowState};

/// Burn-rate windows reported for every SLO.
pub const BURN_WINDOWS: [(&str, i64); 7] = [
    ("5m", 300_000),
    ("30m", 1_800_000),
    ("1h", 3_600_000),
    ("2h", 7_200_000),
    ("6h", 21_600_000),
    ("1d", 86_400_000),
    ("3d", 259_200_000),
];

/// A job's standing for one SLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum Standing {
    /// Waiting, deadline not reached.
    Pending {
        /// `submitted + threshold`.
        deadline_ms: i64,
    },
    /// First step within the threshold.
    Good {
        /// When decided (the first step).
        at_ms: i64,
    },
    /// Crossed the threshold, or ended without starting.
    Bad {
        /// When decided.
        at_ms: i64,
    },
    /// Cancelled by the user before the deadline, excluded by the SLO's rule.
    Excluded,
}

/// A job's contribution to one SLO, remembered so it can be replaced exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contribution {
    /// Index of the SLO.
    pub slo: u16,
    /// Its standing.
    pub standing: Standing,
    /// (started at, time to first step) when the job started.
    pub ttfs: Option<(i64, i64)>,
    /// Where that first step came from (unspecified while the job has not started).
    pub first_step_origin: pb::StepOrigin,
    /// Whether the job is past its deadline and still waiting for its first step (a per-job page condition).
    pub breached_waiting: bool,
}

/// Decides a job's contribution to `def` as of `now_ms`; `None` when the SLO does not cover it.
pub fn assess(slo: u16, def: &SloDef, t: &Timeline, now_ms: i64) -> Option<Contribution> {
    let attrs = t.attrs.as_ref()?;
    let sub = t.submitted_at?;
    if !def.selector.matches(attrs, sub) {
        return None;
    }
    let deadline = sub + def.threshold_ms;
    let ttfs = t.first_step_at.map(|f| (f, f - sub));
    let (standing, breached_waiting) = match (t.first_step_at, t.done_at) {
        (Some(f), _) if f - sub <= def.threshold_ms => (Standing::Good { at_ms: f }, false),
        (Some(_), _) => (Standing::Bad { at_ms: deadline }, false),
        (None, Some(d)) => {
            if d < deadline && def.exclude_cancelled && t.outcome == Some(pb::Outcome::Cancelled) {
                (Standing::Excluded, false)
            } else {
                (Standing::Bad { at_ms: d.min(deadline) }, false)
            }
        }
        (None, None) if now_ms >= deadline => (Standing::Bad { at_ms: deadline }, true),
        (None, None) => (Standing::Pending { deadline_ms: deadline }, false),
    };
    let first_step_origin = t.first_step_origin.filter(|_| ttfs.is_some()).unwrap_or_default();
    Some(Contribution { slo, standing, ttfs, first_step_origin, breached_waiting })
}

/// A change in a per-job page condition, for the alert loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageChange {
    /// The SLO's index.
    pub slo: u16,
    /// The job.
    pub job_id: String,
    /// True: the job crossed its threshold and is still waiting. False: it started or ended.
    pub firing: bool,
}

/// All SLOs' state.
#[derive(Debug)]
pub struct SloEngine {
    defs: Vec<SloDef>,
    windows: Vec<WindowState>,
    /// Pending jobs by deadline: (deadline, slo, job id). Only waiting jobs before their deadline are here.
    deadlines: BTreeSet<(i64, u16, String)>,
    /// Page-condition changes not yet taken by the alert loop: a hand-off queue, so the alert loop takes them
    /// under the index's read lock (the applier alone writes the index).
    changes: std::sync::Mutex<Vec<PageChange>>,
    /// Per SLO: jobs past their deadline and still waiting.
    breached_waiting: Vec<u64>,
    /// Per SLO: decisions counted since start (see [`Decisions`]); off while history is rebuilt.
    decisions: Vec<Decisions>,
    /// Whether decisions are counted (turned on once the restored history has been assessed).
    counting: bool,
    /// While a group commit is applied: each touched job's contributions before the group, so the group is
    /// counted by its outcome (a submit and a first step in one batch are one good decision, not bad then good).
    group: Option<std::collections::HashMap<String, Vec<Contribution>>>,
}

/// An SLO's decisions as counters (the SLI for `increase()` over any window): each covered job counts once when
/// it is decided good or bad; a later event that changes a decision (a late first step dated before the
/// deadline turns bad into good) counts as a restatement, and the window gauges show the corrected figures.
/// Counted from the collector's start (restored history is not counted again).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Decisions {
    /// Decided good (first step within the threshold).
    pub good: u64,
    /// Decided bad (deadline passed while waiting, started late, or ended before starting).
    pub bad: u64,
    /// Decisions changed from bad to good by a late event.
    pub restated_good: u64,
    /// Decisions changed from good to bad by a late event.
    pub restated_bad: u64,
}

/// The computed status of one SLO over a window.
#[derive(Debug, Clone, Serialize)]
pub struct SloStatus {
    /// The SLO's name.
    pub name: String,
    /// The window the figures cover, ms.
    pub window_ms: i64,
    /// Good jobs decided in the window.
    pub good: u64,
    /// Bad jobs decided in the window.
    pub bad: u64,
    /// good + bad.
    pub total: u64,
    /// good / total (1 when total is 0).
    pub compliance: f64,
    /// The objective.
    pub objective: f64,
    /// Share of the error budget left: 1 - bad / (total * (1 - objective)); negative when overspent.
    pub error_budget_remaining: f64,
    /// Burn rate per window: (bad / total) / (1 - objective); 0 when the window holds no decided job.
    pub burn_rates: Vec<(String, f64, u64)>,
    /// Jobs past the threshold and still waiting, now.
    pub breached_waiting: u64,
    /// Jobs waiting before their deadline, now.
    pub pending: u64,
    /// Time-to-first-step percentiles of jobs that started in the window, seconds: p50, p90, p95, p99, max.
    pub ttfs_seconds: Option<Percentiles>,
    /// Those jobs by where their first step came from, indexed by `pb::StepOrigin` number (unspecified,
    /// training process, container start, scheduler start).
    pub first_steps_by_origin: [u64; window::ORIGINS],
}

/// One point of [`SloEngine::history`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryPoint {
    /// The point in time, ms.
    pub at_ms: i64,
    /// Decided in the SLO window ending at `at_ms`.
    pub window: Counts,
    /// Decided in each of the asked windows ending at `at_ms`, in their order.
    pub windows: Vec<Counts>,
}

/// Percentiles in seconds.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Percentiles {
    /// Jobs in the distribution.
    pub count: u64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

/// Percentiles of a window's times to first step (milliseconds), in seconds: exact nearest-rank order
/// statistics.
pub fn percentiles(t: &window::Ttfs<'_>) -> Option<Percentiles> {
    let q = |p: f64| t.quantile(p).map(|v| v as f64 / 1000.0);
    Some(Percentiles {
        count: t.len(),
        p50: q(0.5)?,
        p90: q(0.9)?,
        p95: q(0.95)?,
        p99: q(0.99)?,
        max: t.max()? as f64 / 1000.0,
    })
}

/// Burn rate: the share of bad jobs relative to the share the objective allows.
pub fn burn_rate(c: Counts, objective: f64) -> f64 {
    if c.total() == 0 {
        return 0.0;
    }
    (c.bad as f64 / c.total() as f64) / (1.0 - objective)
}

impl SloEngine {
    /// An engine for these definitions.
    pub fn new(defs: Vec<SloDef>) -> Self {
        let windows = defs.iter().map(|_| WindowState::default()).collect();
        let breached_waiting = vec![0; defs.len()];
        let decisions = vec![Decisions::default(); defs.len()];
        SloEngine {
            defs,
            windows,
            deadlines: BTreeSet::new(),
            changes: std::sync::Mutex::new(Vec::new()),
            breached_waiting,
            decisions,
            counting: false,
            group: None,
        }
    }

    /// Starts a group: decisions of the jobs re-assessed until [`SloEngine::end_group`] are counted once, by
    /// the group's outcome.
    pub fn begin_group(&mut self) {
        self.group = Some(std::collections::HashMap::new());
    }

    /// Ends a group: `current` gives each touched job's contributions now (None: the job is gone).
    pub fn end_group(&mut self, current: impl Fn(&str) -> Option<Vec<Contribution>>) {
        let Some(group) = self.group.take() else { return };
        for (job, old) in group {
            if let Some(new) = current(&job) {
                self.count_decisions(&old, &new);
            }
        }
    }

    /// Starts counting decisions (after the restored history has been assessed).
    pub fn start_counting(&mut self) {
        self.counting = true;
    }

    /// Carries the decision counters of SLOs that keep their name into this engine (a reload), and starts
    /// counting.
    pub fn carry_decisions(&mut self, from: &SloEngine) {
        for (i, d) in self.defs.iter().enumerate() {
            if let Some(j) = from.defs.iter().position(|o| o.name == d.name) {
                self.decisions[i] = from.decisions[j];
            }
        }
        self.counting = from.counting;
    }

    /// SLO `i`'s decision counters.
    pub fn decisions(&self, i: usize) -> Decisions {
        self.decisions.get(i).copied().unwrap_or_default()
    }

    /// The definitions.
    pub fn defs(&self) -> &[SloDef] {
        &self.defs
    }

    /// The earliest pending deadline.
    pub fn next_deadline(&self) -> Option<i64> {
        self.deadlines.first().map(|(d, _, _)| *d)
    }

    /// Takes the page-condition changes recorded since the last call (through a shared reference: readers
    /// take them under the index's read lock).
    pub fn take_changes(&self) -> Vec<PageChange> {
        std::mem::take(&mut *self.changes.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Every contribution of a timeline, as of `now_ms`, into `out` (cleared first).
    pub fn assess_into(&self, t: &Timeline, now_ms: i64, out: &mut Vec<Contribution>) {
        out.clear();
        out.extend(self.defs.iter().enumerate().filter_map(|(i, d)| assess(i as u16, d, t, now_ms)));
    }

    /// Re-assesses one job after its timeline changed, replacing its old contributions (`contribs`: what the job
    /// contributed so far, updated to what it contributes now).
    pub fn on_job(&mut self, job_id: &str, t: &Timeline, contribs: &mut Vec<Contribution>, now_ms: i64) {
        let mut new = Vec::new();
        self.assess_into(t, now_ms, &mut new);
        let old = std::mem::take(contribs);
        for c in &old {
            self.apply(job_id, c, -1);
        }
        for c in &new {
            self.apply(job_id, c, 1);
        }
        if self.counting {
            match self.group.as_mut() {
                Some(g) => {
                    g.entry(job_id.to_string()).or_insert_with(|| old.clone());
                }
                None => self.count_decisions(&old, &new),
            }
        }
        // Page-condition changes.
        let changes = self.changes.get_mut().unwrap_or_else(|p| p.into_inner());
        for c in &new {
            let was = old.iter().find(|o| o.slo == c.slo).is_some_and(|o| o.breached_waiting);
            if c.breached_waiting != was {
                changes.push(PageChange { slo: c.slo, job_id: job_id.to_string(), firing: c.breached_waiting });
            }
        }
        for o in &old {
            if o.breached_waiting && !new.iter().any(|c| c.slo == o.slo) {
                changes.push(PageChange { slo: o.slo, job_id: job_id.to_string(), firing: false });
            }
        }
        *contribs = new;
    }

    fn count_decisions(&mut self, old: &[Contribution], new: &[Contribution]) {
        let verdict = |c: Option<&Contribution>| match c.map(|c| c.standing) {
            Some(Standing::Good { .. }) => Some(true),
            Some(Standing::Bad { .. }) => Some(false),
            _ => None,
        };
        for c in new {
            let before = verdict(old.iter().find(|o| o.slo == c.slo));
            let Some(d) = self.decisions.get_mut(c.slo as usize) else { continue };
            match (before, verdict(Some(c))) {
                (None, Some(true)) => d.good += 1,
                (None, Some(false)) => d.bad += 1,
                (Some(false), Some(true)) => d.restated_good += 1,
                (Some(true), Some(false)) => d.restated_bad += 1,
                _ => {}
            }
        }
    }

    /// Removes a job's contributions (the job is being deleted).
    pub fn forget(&mut self, job_id: &str, contribs: &mut Vec<Contribution>) {
        for c in std::mem::take(contribs) {
            self.apply(job_id, &c, -1);
        }
    }

    /// Adds (`sign` 1) or removes (-1) the contributions of an ended job that keeps none of its own (a folded
    /// job): an ended job's contributions do not depend on `now_ms`, so they are recomputed, not remembered.
    pub fn count_ended(&mut self, job_id: &str, t: &Timeline, now_ms: i64, sign: i64) {
        let mut cs = Vec::new();
        self.assess_into(t, now_ms, &mut cs);
        for c in &cs {
            self.apply(job_id, c, sign);
        }
    }

    fn apply(&mut self, job_id: &str, c: &Contribution, sign: i64) {
        if c.breached_waiting {
            let n = &mut self.breached_waiting[c.slo as usize];
            *n = n.saturating_add_signed(sign);
        }
        let w = &mut self.windows[c.slo as usize];
        match c.standing {
            Standing::Good { at_ms } => w.count(at_ms, true, sign),
            Standing::Bad { at_ms } => w.count(at_ms, false, sign),
            Standing::Pending { deadline_ms } => {
                let key = (deadline_ms, c.slo, job_id.to_string());
                if sign > 0 {
                    self.deadlines.insert(key);
                } else {
                    self.deadlines.remove(&key);
                }
            }
            Standing::Excluded => {}
        }
        if let Some((started, ttfs)) = c.ttfs {
            w.ttfs(started, ttfs, sign > 0);
            w.origin(started, c.first_step_origin as usize, sign > 0);
        }
    }

    /// Takes the jobs whose deadline is at or before `now_ms` (each once, in id order): the caller re-assesses
    /// each with [`SloEngine::on_job`], which moves it from pending to bad.
    pub fn take_due(&mut self, now_ms: i64) -> Vec<String> {
        let mut due = Vec::new();
        while let Some(first) = self.deadlines.first() {
            if first.0 > now_ms {
                break;
            }
            if let Some(k) = self.deadlines.pop_first() {
                due.push(k.2);
            }
        }
        due.sort();
        due.dedup();
        due
    }

    /// Status of SLO `i` over the `window_ms` ending at `now_ms`.
    pub fn status(&self, i: usize, now_ms: i64, window_ms: i64) -> Option<SloStatus> {
        let def = self.defs.get(i)?;
        let w = &self.windows[i];
        let end = now_ms + 1;
        let c = w.counts_between(now_ms - window_ms, end);
        let budget = 1.0 - def.objective;
        let burn_rates = BURN_WINDOWS
            .iter()
            .map(|(name, ms)| {
                let bc = w.counts_between(now_ms - ms, end);
                ((*name).to_string(), burn_rate(bc, def.objective), bc.total())
            })
            .collect();
        let pending = self.deadlines.iter().filter(|(_, s, _)| *s as usize == i).count() as u64;
        Some(SloStatus {
            name: def.name.clone(),
            window_ms,
            good: c.good,
            bad: c.bad,
            total: c.total(),
            compliance: if c.total() == 0 { 1.0 } else { c.good as f64 / c.total() as f64 },
            objective: def.objective,
            error_budget_remaining: if c.total() == 0 { 1.0 } else { 1.0 - c.bad as f64 / (c.total() as f64 * budget) },
            burn_rates,
            breached_waiting: self.breached_waiting[i],
            pending,
            ttfs_seconds: percentiles(&w.ttfs_between(now_ms - window_ms, end)),
            first_steps_by_origin: w.origins_between(now_ms - window_ms, end),
        })
    }

    /// Estimated bytes of every SLO's windows and the deadline index (for self-metrics).
    pub fn memory_bytes(&self) -> usize {
        let deadlines: usize = self.deadlines.iter().map(|(_, _, id)| 64 + id.len()).sum();
        self.windows.iter().map(WindowState::memory_bytes).sum::<usize>() + deadlines
    }

    /// Counts decided in a window, for burn-rate alerting.
    pub fn counts(&self, i: usize, now_ms: i64, window_ms: i64) -> Counts {
        self.windows.get(i).map_or(Counts::default(), |w| w.counts_between(now_ms - window_ms, now_ms + 1))
    }

    /// How far back SLO `i` keeps its time-to-first-step histograms, and so the longest window its status can
    /// cover: its window (at least the 3-day burn window) plus a day.
    pub fn retained_ms(&self, i: usize) -> i64 {
        self.defs.get(i).map_or(0, |d| d.window_ms.max(3 * 86_400_000) + 86_400_000)
    }

    /// How far back SLO `i` keeps its good/bad minute counts: twice [`Self::retained_ms`]'s span, so that the
    /// error budget of every window ending within the last SLO window can be charted ([`Self::history`]).
    pub fn history_retained_ms(&self, i: usize) -> i64 {
        self.defs.get(i).map_or(0, |d| 2 * d.window_ms.max(3 * 86_400_000) + 86_400_000)
    }

    /// Drops window buckets older than each SLO retains.
    pub fn prune(&mut self, now_ms: i64) {
        for i in 0..self.windows.len() {
            let (counts, hists) = (self.history_retained_ms(i), self.retained_ms(i));
            self.windows[i].prune_before(now_ms - counts, now_ms - hists);
        }
    }

    /// SLO `i` at every `step_ms` from `from_ms` to `to_ms` (both included, aligned to `to_ms`): the good and
    /// bad counts of the SLO window ending at each point (so its compliance and error budget then) and of each
    /// of `windows`, for burn-rate history. Counts are exact (minute buckets, the same as [`Self::status`]).
    pub fn history(&self, i: usize, from_ms: i64, to_ms: i64, step_ms: i64, windows: &[i64]) -> Vec<HistoryPoint> {
        let (Some(def), Some(w)) = (self.defs.get(i), self.windows.get(i)) else { return Vec::new() };
        let longest = windows.iter().copied().fold(def.window_ms, i64::max);
        let running = w.running(from_ms - longest);
        let step = step_ms.max(window::COUNT_BUCKET_MS);
        let mut out = Vec::new();
        let mut at = to_ms;
        while at >= from_ms {
            let end = at + 1;
            out.push(HistoryPoint {
                at_ms: at,
                window: running.between(at - def.window_ms, end),
                windows: windows.iter().map(|ms| running.between(at - ms, end)).collect(),
            });
            at -= step;
        }
        out.reverse();
        out
    }
}

#[cfg(test)]
mod tests;
