//! Breach prediction: will a job that is still waiting miss its start SLO's deadline? Pure: the caller builds a
//! [`WaitModel`] from recent jobs and asks for each waiting job.
//!
//! Four bases, asked in this order: scheduler, stall, capacity, history (the first that predicts a breach names it).
//! - **scheduler**: the latest `queued` event of the current wait carries `estimated_start` (Slurm's `StartTime`
//!   of a pending job): a breach is predicted when it lies past the deadline, and not otherwise;
//! - **history**: the pool's recent behaviour for the job's priority. Among the jobs of the same pool and
//!   priority that started in the lookback, those that had waited at least as long as this job has: the share of
//!   them that waited past the threshold estimates `P(TTFS > threshold | TTFS > waited)`. A breach is predicted
//!   when that share is at least `confidence` and at least `min_samples` jobs back it. Jobs that ended without
//!   starting are left out of the samples (their start time is unknown);
//! - **stall**: the job's GPU class (its pool, when it names no class) is stalled for its priority now: at least
//!   `stall_jobs` other jobs of the same class and priority, in any pool, are still waiting past this SLO's
//!   threshold. What a sudden capacity crunch shows once it has caught one job (it hits every pool of a class,
//!   managed and dedicated), which history cannot: every job that arrives after the first breach is warned at once;
//! - **capacity**: the job's GPU class (its pool, when it names none) is out of capacity now: at least
//!   `capacity_jobs` jobs of the class, of any priority, were reported queued for capacity (`queued:capacity`:
//!   Slurm's `Resources`, a pod `Unschedulable`, a managed endpoint's stock-out message) in the last
//!   `capacity_window` and still wait, and no job of the class started in that window. What a crunch shows before
//!   any urgent job breaches: the normal jobs that keep arriving queue for capacity and nothing starts, so the
//!   first urgent job caught by it is warned too ([`CapacitySignals`] counts it from the live jobs).

use startline_proto::pb;
use std::collections::HashMap;

/// `[prediction]` as written.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct PredictionSection {
    /// Warn before breaches (default true).
    pub enabled: Option<bool>,
    /// Smallest breach probability that warns, 0.5 to 0.999 (default 0.8).
    pub confidence: Option<f64>,
    /// Fewest comparable jobs a history-based warning needs (default 20).
    pub min_samples: Option<usize>,
    /// How far back started jobs are history (default `7d`).
    pub lookback: Option<String>,
    /// How often the history is rebuilt (default `5m`).
    pub model_interval: Option<String>,
    /// Other jobs of the GPU class (or pool) and priority waiting past the threshold that make it stalled
    /// (default 1; 0: off).
    pub stall_jobs: Option<usize>,
    /// Jobs of the GPU class (or pool) queued for capacity in `capacity_window`, with none started, that make it
    /// out of capacity (default 3; 0: off).
    pub capacity_jobs: Option<usize>,
    /// How far back capacity waits and starts count (default `10m`).
    pub capacity_window: Option<String>,
}

impl PredictionSection {
    /// Checks the section, naming each bad field.
    pub fn validate(&self, errs: &mut Vec<String>) -> PredictSettings {
        let mut s = PredictSettings { enabled: self.enabled.unwrap_or(true), ..PredictSettings::default() };
        if let Some(n) = self.stall_jobs {
            s.stall_jobs = n;
        }
        if let Some(n) = self.capacity_jobs {
            s.capacity_jobs = n;
        }
        if let Some(c) = self.confidence {
            if (0.5..=0.999).contains(&c) {
                s.confidence = c;
            } else {
                errs.push(format!("prediction.confidence: {c} must be between 0.5 and 0.999"));
            }
        }
        if let Some(n) = self.min_samples {
            if n >= 1 {
                s.min_samples = n;
            } else {
                errs.push("prediction.min_samples: must be at least 1".to_string());
            }
        }
        let dur = |field: &str, v: &Option<String>, lo: u64, hi: u64, errs: &mut Vec<String>| -> Option<i64> {
            let v = v.as_ref()?;
            match humantime::parse_duration(v) {
                Ok(d) if d.as_secs() >= lo && d.as_secs() <= hi => Some(d.as_millis() as i64),
                Ok(_) => {
                    errs.push(format!("prediction.{field}: {v:?} is out of range"));
                    None
                }
                Err(e) => {
                    errs.push(format!("prediction.{field}: {v:?} is not a duration: {e}"));
                    None
                }
            }
        };
        if let Some(ms) = dur("lookback", &self.lookback, 3600, 400 * 86_400, errs) {
            s.lookback_ms = ms;
        }
        if let Some(ms) = dur("model_interval", &self.model_interval, 1, 86_400, errs) {
            s.model_interval_ms = ms;
        }
        if let Some(ms) = dur("capacity_window", &self.capacity_window, 60, 86_400, errs) {
            s.capacity_window_ms = ms;
        }
        s
    }

    /// Written back with every field set.
    pub fn of(s: &PredictSettings) -> PredictionSection {
        let d = |ms: i64| humantime::format_duration(std::time::Duration::from_millis(ms as u64)).to_string();
        PredictionSection {
            enabled: Some(s.enabled),
            confidence: Some(s.confidence),
            min_samples: Some(s.min_samples),
            lookback: Some(d(s.lookback_ms)),
            model_interval: Some(d(s.model_interval_ms)),
            stall_jobs: Some(s.stall_jobs),
            capacity_jobs: Some(s.capacity_jobs),
            capacity_window: Some(d(s.capacity_window_ms)),
        }
    }
}

/// `[prediction]` settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PredictSettings {
    /// Whether to predict at all.
    pub enabled: bool,
    /// Smallest breach probability that warns.
    pub confidence: f64,
    /// Fewest comparable jobs a history-based warning needs.
    pub min_samples: usize,
    /// How far back started jobs are taken as history, ms.
    pub lookback_ms: i64,
    /// How often the history is rebuilt (one scan of every job), ms.
    pub model_interval_ms: i64,
    /// Other jobs of the same GPU class (or pool) and priority waiting past the threshold that make it stalled
    /// (0: off).
    pub stall_jobs: usize,
    /// Jobs of the GPU class (or pool) queued for capacity in the window, with none started, that make it out of
    /// capacity (0: off).
    pub capacity_jobs: usize,
    /// How far back capacity waits and starts count, ms.
    pub capacity_window_ms: i64,
}

impl Default for PredictSettings {
    fn default() -> Self {
        PredictSettings {
            enabled: true,
            confidence: 0.8,
            min_samples: 20,
            lookback_ms: 7 * 86_400_000,
            model_interval_ms: 300_000,
            stall_jobs: 1,
            capacity_jobs: 3,
            capacity_window_ms: 600_000,
        }
    }
}

/// Recent times to first step by pool and priority, sorted.
#[derive(Debug, Clone, Default)]
pub struct WaitModel {
    samples: HashMap<(String, pb::PriorityClass), Vec<i64>>,
    /// When it was built.
    pub built_at_ms: i64,
}

impl WaitModel {
    /// A model from `(pool, priority, time to first step)` of started jobs.
    pub fn build(jobs: impl IntoIterator<Item = (String, pb::PriorityClass, i64)>, built_at_ms: i64) -> WaitModel {
        let mut samples: HashMap<(String, pb::PriorityClass), Vec<i64>> = HashMap::new();
        for (pool, prio, ttfs) in jobs {
            samples.entry((pool, prio)).or_default().push(ttfs);
        }
        for v in samples.values_mut() {
            v.sort_unstable();
        }
        WaitModel { samples, built_at_ms }
    }

    /// `P(TTFS > threshold | TTFS > waited)` for a job of `pool` and `priority` that has waited `waited_ms`, with
    /// the number of jobs it rests on (those that waited more than `waited_ms`); `None` without any.
    pub fn breach_probability(
        &self,
        pool: &str,
        priority: pb::PriorityClass,
        waited_ms: i64,
        threshold_ms: i64,
    ) -> Option<(f64, usize)> {
        let v = self.samples.get(&(pool.to_string(), priority))?;
        let above = |x: i64| v.len() - v.partition_point(|t| *t <= x);
        let survivors = above(waited_ms);
        (survivors > 0).then(|| (above(threshold_ms.max(waited_ms)) as f64 / survivors as f64, survivors))
    }

    /// Jobs in the model.
    pub fn len(&self) -> usize {
        self.samples.values().map(Vec::len).sum()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a breach is predicted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Basis {
    /// The scheduler's estimated start lies past the deadline.
    Scheduler {
        /// Its estimate (Unix ms).
        estimated_start_ms: i64,
    },
    /// Other jobs of the GPU class (or pool) and priority are waiting past the threshold now.
    Stall {
        /// How many.
        waiting_past: usize,
    },
    /// Jobs of the GPU class (or pool) queue for capacity and none starts.
    Capacity {
        /// Jobs queued for capacity in the window, still waiting.
        queued: usize,
    },
    /// The pool's history.
    History {
        /// `P(TTFS > threshold | TTFS > waited)`.
        probability: f64,
        /// Jobs it rests on.
        samples: usize,
    },
}

impl Basis {
    /// `scheduler`, `stall`, `capacity` or `history`.
    pub fn label(&self) -> &'static str {
        match self {
            Basis::Scheduler { .. } => "scheduler",
            Basis::Stall { .. } => "stall",
            Basis::Capacity { .. } => "capacity",
            Basis::History { .. } => "history",
        }
    }
}

/// One waiting job, as the prediction needs it.
#[derive(Debug, Clone, Copy)]
pub struct Waiting<'a> {
    /// Its pool.
    pub pool: &'a str,
    /// Its priority.
    pub priority: pb::PriorityClass,
    /// When it was submitted (Unix ms).
    pub submitted_ms: i64,
    /// The scheduler's estimated start, if the current wait carries one.
    pub estimated_start_ms: Option<i64>,
    /// Other jobs of its GPU class (its pool when it names none) and priority waiting past this threshold now.
    pub others_waiting_past: usize,
    /// Jobs of its GPU class (its pool when it names none) queued for capacity in the window with none started
    /// ([`CapacitySignals::out_of_capacity`]).
    pub capacity_queued: usize,
}

/// Whether `job` is predicted to miss the deadline `threshold_ms` after its submit, as of `now`; `None` once the
/// deadline has passed (the breach itself is paged then) or when nothing predicts a breach.
pub fn predict(model: &WaitModel, s: &PredictSettings, job: Waiting<'_>, threshold_ms: i64, now: i64) -> Option<Basis> {
    let deadline = job.submitted_ms + threshold_ms;
    if !s.enabled || now >= deadline {
        return None;
    }
    if let Some(e) = job.estimated_start_ms {
        return (e > deadline).then_some(Basis::Scheduler { estimated_start_ms: e });
    }
    if s.stall_jobs > 0 && job.others_waiting_past >= s.stall_jobs {
        return Some(Basis::Stall { waiting_past: job.others_waiting_past });
    }
    if s.capacity_jobs > 0 && job.capacity_queued >= s.capacity_jobs {
        return Some(Basis::Capacity { queued: job.capacity_queued });
    }
    let (p, n) = model.breach_probability(job.pool, job.priority, now - job.submitted_ms, threshold_ms)?;
    (n >= s.min_samples && p >= s.confidence).then_some(Basis::History { probability: p, samples: n })
}

/// The scope the stall and capacity bases count in: the GPU class (a crunch hits every pool of a class), the pool
/// when the job names no class.
pub fn class_scope(pool: &str, gpu_class: &str) -> String {
    if gpu_class.is_empty() {
        format!("pool:{pool}")
    } else {
        format!("class:{gpu_class}")
    }
}

/// What the capacity basis needs of one job at a moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CapacityView {
    /// Since when it has been reported queued for capacity (the latest such report), when that is where it waits
    /// now.
    pub capacity_since_ms: Option<i64>,
    /// When it last left the queue (nodes assigned, or preparing or its first step when nothing reported the
    /// nodes), if ever.
    pub started_ms: Option<i64>,
}

impl CapacityView {
    /// The view of a job from its timeline, as it stands now.
    pub fn of(t: &crate::job::Timeline) -> CapacityView {
        use crate::job::Segment;
        let capacity_since_ms = match t.current_wait {
            Some((Segment::Queued(pb::WaitReason::Capacity), since)) => Some(since),
            _ => None,
        };
        let started_ms = t.placements.last().map(|p| p.assigned_at).or(t.preparing_at).or(t.first_step_at);
        CapacityView { capacity_since_ms, started_ms }
    }
}

/// The capacity signal by scope ([`class_scope`]): jobs reported queued for capacity in the window that still
/// wait, and jobs that started in it. Fed every live job, one at a time.
#[derive(Debug, Clone, Default)]
pub struct CapacitySignals {
    by_scope: HashMap<String, (usize, usize)>,
    window_ms: i64,
    now: i64,
}

impl CapacitySignals {
    /// Empty, counting over `(now - window_ms, now]`.
    pub fn new(window_ms: i64, now: i64) -> CapacitySignals {
        CapacitySignals { by_scope: HashMap::new(), window_ms, now }
    }

    /// Whether `v` counts at all (it was queued for capacity or started in the window): the others need no scope.
    pub fn counts_view(&self, v: &CapacityView) -> bool {
        self.within(v.capacity_since_ms) || self.within(v.started_ms)
    }

    fn within(&self, t: Option<i64>) -> bool {
        t.is_some_and(|t| t > self.now - self.window_ms && t <= self.now)
    }

    /// Counts one job of `scope`.
    pub fn add(&mut self, scope: &str, v: CapacityView) {
        let (queued, started) = (self.within(v.capacity_since_ms), self.within(v.started_ms));
        if !queued && !started {
            return;
        }
        let e = match self.by_scope.get_mut(scope) {
            Some(e) => e,
            None => self.by_scope.entry(scope.to_string()).or_default(),
        };
        e.0 += usize::from(queued);
        e.1 += usize::from(started);
    }

    /// Jobs of `scope` queued for capacity in the window and still waiting, and jobs of it started in the window.
    pub fn counts(&self, scope: &str) -> (usize, usize) {
        self.by_scope.get(scope).copied().unwrap_or_default()
    }

    /// The capacity basis' signal: the jobs queued for capacity in the window when none of the scope started in
    /// it, else 0.
    pub fn out_of_capacity(&self, scope: &str) -> usize {
        match self.counts(scope) {
            (queued, 0) => queued,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    #[test]
    fn the_conditional_breach_share_counts_the_jobs_that_waited_as_long() {
        // 100 urgent jobs of pool a: TTFS 1..=100 minutes.
        let m = WaitModel::build((1..=100).map(|i| ("a".to_string(), pb::PriorityClass::Urgent, i * MIN)), 0);
        // Nothing waited yet: 90 of 100 took longer than 10 minutes.
        assert_eq!(m.breach_probability("a", pb::PriorityClass::Urgent, 0, 10 * MIN), Some((0.9, 100)));
        // Waited 50 minutes against a 60-minute threshold: of the 50 that waited more than 50, 40 took more than 60.
        assert_eq!(m.breach_probability("a", pb::PriorityClass::Urgent, 50 * MIN, 60 * MIN), Some((0.8, 50)));
        // Past every sample: nothing to go on.
        assert_eq!(m.breach_probability("a", pb::PriorityClass::Urgent, 100 * MIN, 120 * MIN), None);
        assert_eq!(m.breach_probability("b", pb::PriorityClass::Urgent, 0, 10 * MIN), None);
        assert_eq!(m.breach_probability("a", pb::PriorityClass::Normal, 0, 10 * MIN), None);
    }

    #[test]
    fn the_scheduler_estimate_decides_and_history_needs_confidence_and_samples() {
        let m = WaitModel::build((1..=100).map(|i| ("a".to_string(), pb::PriorityClass::Urgent, i * MIN)), 0);
        let s = PredictSettings::default();
        let job = |est: Option<i64>| Waiting {
            pool: "a",
            priority: pb::PriorityClass::Urgent,
            submitted_ms: 0,
            estimated_start_ms: est,
            others_waiting_past: 0,
            capacity_queued: 0,
        };
        // History, after a minute: of the 99 jobs that waited more than a minute, 90 waited past 10 (>= 0.8).
        assert_eq!(
            predict(&m, &s, job(None), 10 * MIN, MIN),
            Some(Basis::History { probability: 90.0 / 99.0, samples: 99 })
        );
        // A 60-minute threshold after 5 minutes: 40 of 95 -> below the confidence.
        assert_eq!(predict(&m, &s, job(None), 60 * MIN, 5 * MIN), None);
        // The scheduler says it starts at 15 minutes: past a 10-minute deadline -> predicted; at 8 -> not, even
        // though history would warn.
        assert_eq!(
            predict(&m, &s, job(Some(15 * MIN)), 10 * MIN, MIN),
            Some(Basis::Scheduler { estimated_start_ms: 15 * MIN })
        );
        assert_eq!(predict(&m, &s, job(Some(8 * MIN)), 10 * MIN, MIN), None);
        // Past the deadline: the breach page's business.
        assert_eq!(predict(&m, &s, job(Some(15 * MIN)), 10 * MIN, 10 * MIN), None);
        // Too few samples.
        let few = WaitModel::build((1..=10).map(|i| ("a".to_string(), pb::PriorityClass::Urgent, 60 * i * MIN)), 0);
        assert_eq!(predict(&few, &s, job(None), 10 * MIN, MIN), None);
        // A stalled pool warns without history; the scheduler's estimate still decides.
        let stalled = Waiting { others_waiting_past: 2, ..job(None) };
        assert_eq!(predict(&few, &s, stalled, 10 * MIN, MIN), Some(Basis::Stall { waiting_past: 2 }));
        assert_eq!(predict(&few, &s, Waiting { estimated_start_ms: Some(5 * MIN), ..stalled }, 10 * MIN, MIN), None);
        assert_eq!(predict(&few, &PredictSettings { stall_jobs: 0, ..s }, stalled, 10 * MIN, MIN), None);
        // Disabled.
        assert_eq!(predict(&m, &PredictSettings { enabled: false, ..s }, job(None), 10 * MIN, MIN), None);
    }

    #[test]
    fn the_capacity_basis_warns_when_jobs_queue_for_capacity_and_none_starts() {
        let few = WaitModel::build((1..=10).map(|i| ("a".to_string(), pb::PriorityClass::Urgent, 60 * i * MIN)), 0);
        let s = PredictSettings::default();
        assert_eq!((s.capacity_jobs, s.capacity_window_ms), (3, 10 * MIN));
        let job = |queued: usize| Waiting {
            pool: "a",
            priority: pb::PriorityClass::Urgent,
            submitted_ms: 0,
            estimated_start_ms: None,
            others_waiting_past: 0,
            capacity_queued: queued,
        };
        // Two queued for capacity: below 3, nothing; three: warned, with nothing else to go on.
        assert_eq!(predict(&few, &s, job(2), 10 * MIN, MIN), None);
        assert_eq!(predict(&few, &s, job(3), 10 * MIN, MIN), Some(Basis::Capacity { queued: 3 }));
        assert_eq!(Basis::Capacity { queued: 3 }.label(), "capacity");
        // The scheduler's in-time estimate wins; a stall is named first; off with 0; none past the deadline.
        assert_eq!(predict(&few, &s, Waiting { estimated_start_ms: Some(5 * MIN), ..job(5) }, 10 * MIN, MIN), None);
        assert_eq!(
            predict(&few, &s, Waiting { others_waiting_past: 1, ..job(5) }, 10 * MIN, MIN),
            Some(Basis::Stall { waiting_past: 1 })
        );
        assert_eq!(predict(&few, &PredictSettings { capacity_jobs: 0, ..s }, job(5), 10 * MIN, MIN), None);
        assert_eq!(predict(&few, &s, job(5), 10 * MIN, 10 * MIN), None);
    }

    #[test]
    fn capacity_signals_count_recent_capacity_waits_and_any_start_clears_them() {
        let now = 100 * MIN;
        let mut c = CapacitySignals::new(10 * MIN, now);
        let q = |since: i64| CapacityView { capacity_since_ms: Some(since), started_ms: None };
        // class:h100: capacity reports at 91, 95 and 100 min count; 90 min is on the window's open edge, 80 before it.
        for since in [80 * MIN, 90 * MIN, 91 * MIN, 95 * MIN, 100 * MIN] {
            c.add("class:h100", q(since));
        }
        // A job that started at 85 min (before the window) and one that waits for another reason: neither counts.
        c.add("class:h100", CapacityView { capacity_since_ms: None, started_ms: Some(85 * MIN) });
        c.add("class:h100", CapacityView::default());
        assert_eq!(c.counts("class:h100"), (3, 0));
        assert!(
            c.counts_view(&q(91 * MIN)) && !c.counts_view(&q(90 * MIN)) && !c.counts_view(&CapacityView::default())
        );
        assert_eq!(c.out_of_capacity("class:h100"), 3);
        // pool:p: two capacity waits but a start at 99 min in the window: not out of capacity.
        c.add("pool:p", q(92 * MIN));
        c.add("pool:p", q(93 * MIN));
        c.add("pool:p", CapacityView { capacity_since_ms: None, started_ms: Some(99 * MIN) });
        assert_eq!(c.counts("pool:p"), (2, 1));
        assert_eq!(c.out_of_capacity("pool:p"), 0);
        assert_eq!(c.out_of_capacity("class:a100"), 0);
        assert_eq!(class_scope("p", ""), "pool:p");
        assert_eq!(class_scope("p", "h100"), "class:h100");
    }

    #[test]
    fn the_section_validates_and_writes_back_the_capacity_settings() {
        let sec = PredictionSection {
            capacity_jobs: Some(5),
            capacity_window: Some("15m".to_string()),
            ..PredictionSection::default()
        };
        let mut errs = Vec::new();
        let s = sec.validate(&mut errs);
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!((s.capacity_jobs, s.capacity_window_ms), (5, 15 * MIN));
        let back = PredictionSection::of(&s);
        assert_eq!((back.capacity_jobs, back.capacity_window.as_deref()), (Some(5), Some("15m")));
        for (bad, what) in [("30s", "out of range"), ("2d", "out of range"), ("soon", "not a duration")] {
            let mut errs = Vec::new();
            PredictionSection { capacity_window: Some(bad.to_string()), ..PredictionSection::default() }
                .validate(&mut errs);
            assert_eq!(errs.len(), 1, "{bad}: {errs:?}");
            assert!(errs[0].starts_with("prediction.capacity_window:") && errs[0].contains(what), "{errs:?}");
        }
    }
}
