//! When will a waiting job start? Pure: no I/O, no clock reads (the caller passes `now`).
//!
//! **History.** The index keeps a [`WaitBook`]: for every group of comparable jobs, the most recent
//! [`MAX_PER_GROUP`] jobs by submit time (those submitted in the last [`HISTORY_MS`] count), each as a *wait*:
//! submitted to its first step (a job that started), submitted to its end (a job that ended without starting:
//! right-censored), or submitted to `now` (a job still waiting in its first wait: right-censored). The book is
//! updated as jobs change (the index replaces a job's entry whenever its timeline changes it), not rebuilt by a
//! scan. A group is `(pool, priority, GPU class, GPU-count bucket, wait reason)`; each job is also counted in four
//! wider groups, dropping the reason, then the GPU-count bucket, then the GPU class, then the priority (so the
//! widest is the pool). A job's reason in the book is the queued reason it spent longest in before its first
//! step (closed segments; the open one while it has none), else `unreported`.
//!
//! **Estimate from history.** The Kaplan-Meier estimate `S(t)` of the group's waits, conditioned on how long
//! this job has already waited `w`: `S(t | T > w) = S(t) / S(w)`. The central estimate is the conditional
//! median, the interval ([`INTERVAL`], 80%) the conditional 10th to 90th percentiles: the `q`-quantile is the
//! first time `t > w` where `S(t) <= (1 - q) S(w)`. Where the curve never falls that far (the job has waited
//! past most of what the group saw, or its longest waits are still open), the tail is a constant hazard, the
//! group's events over its total time at risk (`lambda = starts / sum of waits`), from `max(w, longest wait)`:
//! `t = m + ln(r / (1 - q)) / lambda` with `r = S(m) / S(w)` (1 when `S(w)` is 0), at most [`TAIL_CAP_MS`] past
//! `m`. Every quantile is then at or after `w` and none moves earlier as `w` grows.
//! The group used is the first, from the narrowest, with at least [`MIN_JOBS`] jobs of which at least one
//! started; failing that the pool's group if any of its jobs started; failing that there is no history. The
//! reason level is skipped for a job no longer queued (nodes assigned, preparing).
//!
//! **Queue state.** The book also keeps, per pool, its jobs still in their first wait ranked as the simulator's
//! and most schedulers rank them (a higher priority first, then by submit time), its first steps by time, and its
//! most recent [`POOL_JOBS`] jobs with their priority and GPUs (none of these is capped by [`MAX_PER_GROUP`]; all are
//! dropped with the history window). A waiting job's *load* is the time the pool would take, at the rate it
//! started GPUs in the last [`RATE_WINDOW_MS`], to start the GPUs of the jobs ranked ahead of it and its own:
//! `load = (GPUs ahead + own GPUs) x window / max(GPUs started in the window, 1)` ([`load_ms`]); a job no longer
//! queued (nodes assigned, preparing) has nothing ahead. The pool's [`CALIBRATION_JOBS`] most recently submitted
//! jobs each have the load they met at their submit, computed from the same book (the jobs then in their first
//! wait ranked ahead of them, the GPUs started in the window before it: all known at that submit). The
//! [`SIMILAR_JOBS`] of them nearest to this job's load now, by `|ln load - ln load'|` plus 10 for another
//! priority and 0.5 for another GPU-count bucket, make a Kaplan-Meier curve of their waits (from their submit;
//! still waiting or ended without starting: censored), and the quantiles are taken from it exactly as from a
//! group's curve, conditioned on this job's wait `w`. With at least [`MIN_JOBS`] recent jobs in the pool and one
//! of the similar ones started, the queue state is used in place of the group's history (`queue_state`); else the
//! group's history is. In the simulator's fleet this halves the error of dedicated pools, where a job's wait is
//! decided by the queue in front of it (BENCHMARKS.md).
//!
//! **The scheduler's estimate** (`Queued.estimated_start`, Slurm's `StartTime`) is calibrated by the pool's
//! history: for each job that started, the error `first step - the last estimate before it` (an estimate is of
//! the allocation; the error includes preparation too). With at least [`MIN_CALIBRATION`] errors in the pool's
//! group, the scheduler's quantiles are `estimate + the errors' 10th/50th/90th percentiles`; with fewer, the
//! estimate is taken as it stands, for all three.
//!
//! **The queue position's progress** (`Queued.queue_position`, Kueue): from the first and the latest position
//! seen in the current wait, the rate at which it fell gives the time to reach 0 after the latest sighting,
//! `R = position / rate`; the central estimate is then that time, the interval `R / 2 .. 2 R` after it (no
//! history of positions is kept to calibrate it). No estimate while the position has not fallen.
//!
//! **Combined** (quantile by quantile, `c = a * other + (1 - a) * history`, then not before `now`; "history" is
//! the queue state's curve when there is one): a calibrated scheduler weighs by precision,
//! `a = (1/E^2) / (1/E^2 + 1/H^2)`, with `E` the width of its error interval and `H` the width of the curve's
//! unconditional interval (both at least a minute); an uncalibrated scheduler or a
//! queue position weighs `a = 1/2`. The scheduler wins over the queue position when a job has both. Either alone,
//! without history, is the estimate. The weights do not depend on `w`, so the combined estimate keeps the
//! history's monotony.

use crate::job::{CompactEvent, EventKind, JobAttrs, Segment, Timeline};
use startline_proto::labels::Label;
use startline_proto::pb;
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// The interval's coverage (10th to 90th percentile).
pub const INTERVAL: f64 = 0.8;
/// Quantiles of the interval's low end, the central estimate and the high end.
pub const QUANTILES: [f64; 3] = [0.1, 0.5, 0.9];
/// Jobs kept per group (the most recently submitted).
pub const MAX_PER_GROUP: usize = 512;
/// Jobs a group needs before it is used (the pool's group is used with fewer, if any of its jobs started).
pub const MIN_JOBS: usize = 20;
/// How far back (by submit time) jobs count: 7 days, as `prediction.lookback`'s default.
pub const HISTORY_MS: i64 = 7 * 86_400_000;
/// Errors of the scheduler's estimates a pool needs before they correct its estimates.
pub const MIN_CALIBRATION: usize = 10;
/// The constant-hazard tail reaches at most this far past `max(w, longest wait)`: 30 days.
pub const TAIL_CAP_MS: i64 = 30 * 86_400_000;
/// The smallest interval width the weights use (a minute), so a degenerate interval does not take all weight.
const MIN_WIDTH_MS: f64 = 60_000.0;
/// How far apart (in the load's natural log) a job of another priority is counted.
const OTHER_PRIORITY: f64 = 10.0;
/// How far apart a job of another GPU-count bucket is counted.
const OTHER_GPU_BUCKET: f64 = 0.5;
/// Levels of grouping, narrowest first.
pub const LEVELS: usize = 5;
/// Jobs of a pool kept for its queue state (the most recently submitted).
pub const POOL_JOBS: usize = 4096;
/// The pool's most recent jobs the queue state compares a job with.
pub const CALIBRATION_JOBS: usize = 256;
/// Of those, the similar ones whose waits make the queue-state estimate.
pub const SIMILAR_JOBS: usize = 40;
/// The window of a pool's recent starts, for its rate: 3 hours.
pub const RATE_WINDOW_MS: i64 = 3 * 3_600_000;

/// The GPU-count bucket of a job asking for `n` GPUs.
pub fn gpu_bucket(n: u32) -> &'static str {
    match n {
        0 => "0",
        1 => "1",
        2..=4 => "2-4",
        5..=8 => "5-8",
        9..=32 => "9-32",
        33..=128 => "33-128",
        _ => "129+",
    }
}

/// A group of comparable jobs; `None` fields are not part of it (a wider group).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKey {
    /// Pool.
    pub pool: String,
    /// Priority class.
    pub priority: Option<pb::PriorityClass>,
    /// GPU class (empty: the job named none).
    pub gpu_class: Option<String>,
    /// GPU-count bucket ([`gpu_bucket`]).
    pub gpus: Option<&'static str>,
    /// Wait reason (a `WaitReason` label or `unreported`).
    pub reason: Option<&'static str>,
}

impl GroupKey {
    /// The group at `level` (0 the narrowest, [`LEVELS`] - 1 the pool) of a full key.
    pub fn at_level(&self, level: usize) -> GroupKey {
        GroupKey {
            pool: self.pool.clone(),
            priority: if level <= 3 { self.priority } else { None },
            gpu_class: if level <= 2 { self.gpu_class.clone() } else { None },
            gpus: if level <= 1 { self.gpus } else { None },
            reason: if level == 0 { self.reason } else { None },
        }
    }
}

/// How a job's first wait ended, as the book keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Still waiting for its first step (censored at `now`).
    Waiting,
    /// Started after `wait_ms`; `scheduler_error_ms` is the first step less the scheduler's last estimate
    /// before it, when there was one.
    Started { wait_ms: i64, scheduler_error_ms: Option<i64> },
    /// Ended after `wait_ms` without starting (censored).
    Ended { wait_ms: i64 },
}

/// One job's place in the book.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its narrowest group.
    pub key: GroupKey,
    /// When it was submitted.
    pub submitted_ms: i64,
    /// Its first wait.
    pub outcome: Outcome,
    /// The GPUs it asks for.
    pub gpus: u32,
}

/// The reason a job is filed under in the book: the queued reason of its longest closed initial-wait segment,
/// else its open queued segment's, else `unreported`.
fn book_reason(t: &Timeline) -> &'static str {
    let mut best: Option<(i64, pb::WaitReason)> = None;
    for (seg, ms) in &t.initial_wait_ms {
        if let Segment::Queued(r) = seg {
            if best.is_none_or(|(b, _)| *ms > b) {
                best = Some((*ms, *r));
            }
        }
    }
    match (best, t.current_wait) {
        (Some((_, r)), _) => r.label(),
        (None, Some((Segment::Queued(r), _))) if t.first_step_at.is_none() => r.label(),
        _ => "unreported",
    }
}

/// A job's entry from its timeline, without the scheduler's error (see [`scheduler_error`]); `None` before its
/// `submitted` is known.
pub fn entry_of(t: &Timeline) -> Option<Entry> {
    EntrySignature::of(t).entry()
}

/// What of a timeline decides its entry, cheap to take and compare (the attributes by pointer): the index files a
/// job again only when it changes.
#[derive(Debug, Clone)]
pub struct EntrySignature {
    attrs: Option<Arc<JobAttrs>>,
    submitted: Option<i64>,
    first_step: Option<i64>,
    done: Option<i64>,
    reason: &'static str,
}

impl PartialEq for EntrySignature {
    fn eq(&self, o: &Self) -> bool {
        let same_attrs = match (&self.attrs, &o.attrs) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        same_attrs
            && (self.submitted, self.first_step, self.done, self.reason)
                == (o.submitted, o.first_step, o.done, o.reason)
    }
}

impl EntrySignature {
    /// A timeline's.
    pub fn of(t: &Timeline) -> EntrySignature {
        EntrySignature {
            attrs: t.attrs.clone(),
            submitted: t.submitted_at,
            first_step: t.first_step_at,
            done: t.done_at,
            reason: book_reason(t),
        }
    }

    /// The entry (without the scheduler's error).
    pub fn entry(&self) -> Option<Entry> {
        let a = self.attrs.as_ref()?;
        let submitted_ms = self.submitted?;
        let outcome = match (self.first_step, self.done) {
            (Some(f), _) => Outcome::Started { wait_ms: (f - submitted_ms).max(0), scheduler_error_ms: None },
            (None, Some(d)) => Outcome::Ended { wait_ms: (d - submitted_ms).max(0) },
            (None, None) => Outcome::Waiting,
        };
        let key = GroupKey {
            pool: a.pool.clone(),
            priority: Some(a.priority),
            gpu_class: Some(a.gpu_class.clone()),
            gpus: Some(gpu_bucket(a.gpu_count)),
            reason: Some(self.reason),
        };
        Some(Entry { key, submitted_ms, outcome, gpus: a.gpu_count })
    }
}

/// The first step less the scheduler's last estimate given before it (`None` without either).
pub fn scheduler_error(t: &Timeline, events: &[CompactEvent]) -> Option<i64> {
    let first = t.first_step_at?;
    let est = events
        .iter()
        .filter(|e| e.at_ms <= first)
        .filter_map(|e| match &e.kind {
            EventKind::Queued { estimated_start: Some(s), .. } => Some((e.at_ms, *s)),
            _ => None,
        })
        .max_by_key(|(at, _)| *at)?;
    Some(first - est.1)
}

/// The query's reason: its open queued segment's reason, `unreported` before any; `None` once it left the queue
/// (nodes assigned, preparing).
pub fn query_reason(t: &Timeline) -> Option<&'static str> {
    match t.current_wait {
        Some((Segment::Queued(r), _)) => Some(r.label()),
        Some((Segment::Unreported, _)) => Some("unreported"),
        _ => None,
    }
}

/// Recent waits of comparable jobs, by group, and each pool's queue (see the module's documentation).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WaitBook {
    groups: HashMap<GroupKey, BTreeMap<(i64, u64), Outcome>>,
    pools: HashMap<String, PoolQueue>,
}

/// A job as a pool's queue keeps it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Filed {
    priority: i32,
    gpus: u32,
    outcome: Outcome,
}

/// One pool's jobs, for the queue state: the most recently submitted [`POOL_JOBS`], with every job still in its
/// first wait by rank and every first step by time (neither capped).
#[derive(Debug, Clone, Default, PartialEq)]
struct PoolQueue {
    /// `(submitted, job)`.
    jobs: BTreeMap<(i64, u64), Filed>,
    /// `(higher priority first, submitted, job)` -> GPUs.
    waiting: BTreeMap<(Reverse<i32>, i64, u64), u32>,
    /// `(first step, job)` -> GPUs.
    starts: BTreeMap<(i64, u64), u32>,
}

impl PoolQueue {
    fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.waiting.is_empty() && self.starts.is_empty()
    }

    /// GPUs that had their first step in `[at - RATE_WINDOW_MS, at)`.
    fn started_gpus(&self, at: i64) -> u64 {
        self.starts.range((at.saturating_sub(RATE_WINDOW_MS), 0)..(at, 0)).map(|(_, g)| u64::from(*g)).sum()
    }
}

/// The queue-state load of a job: the time the pool would take to start the GPUs ahead of it and its own at the
/// rate it started GPUs in the last [`RATE_WINDOW_MS`] (at least one GPU in that window), ms.
pub fn load_ms(gpus_ahead: u64, gpus: u32, started_gpus: u64) -> f64 {
    (gpus_ahead + u64::from(gpus.max(1))) as f64 * RATE_WINDOW_MS as f64 / started_gpus.max(1) as f64
}

/// What the collector knows of a job's place in its pool's queue, and the pool's recent jobs that met a queue
/// like it (see the module's documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct QueueState {
    /// Jobs of the pool in their first wait ranked ahead of it.
    pub jobs_ahead: usize,
    /// The GPUs they ask for.
    pub gpus_ahead: u64,
    /// GPUs the pool started in the last [`RATE_WINDOW_MS`].
    pub started_gpus: u64,
    /// Its load ([`load_ms`]).
    pub load_ms: f64,
    /// The group the similar jobs come from: the pool.
    pub group: GroupKey,
    /// The similar jobs used.
    pub similar: usize,
    /// Their waits from their submit.
    pub km: Km,
}

impl WaitBook {
    /// Files a job (`job` is a hash of its id) in its groups; each keeps its [`MAX_PER_GROUP`] most recently
    /// submitted jobs.
    pub fn add(&mut self, job: u64, e: &Entry) {
        for level in 0..LEVELS {
            let g = self.groups.entry(e.key.at_level(level)).or_default();
            g.insert((e.submitted_ms, job), e.outcome);
            while g.len() > MAX_PER_GROUP {
                g.pop_first();
            }
        }
        let p = self.pools.entry(e.key.pool.clone()).or_default();
        let priority = priority_rank(e);
        p.jobs.insert((e.submitted_ms, job), Filed { priority, gpus: e.gpus, outcome: e.outcome });
        while p.jobs.len() > POOL_JOBS {
            p.jobs.pop_first();
        }
        match e.outcome {
            Outcome::Waiting => {
                p.waiting.insert((Reverse(priority), e.submitted_ms, job), e.gpus);
            }
            Outcome::Started { wait_ms, .. } => {
                p.starts.insert((e.submitted_ms.saturating_add(wait_ms), job), e.gpus);
            }
            Outcome::Ended { .. } => {}
        }
    }

    /// Takes a job out of its groups (nothing if they no longer keep it).
    pub fn remove(&mut self, job: u64, e: &Entry) {
        for level in 0..LEVELS {
            let key = e.key.at_level(level);
            if let Some(g) = self.groups.get_mut(&key) {
                g.remove(&(e.submitted_ms, job));
                if g.is_empty() {
                    self.groups.remove(&key);
                }
            }
        }
        if let Some(p) = self.pools.get_mut(&e.key.pool) {
            p.jobs.remove(&(e.submitted_ms, job));
            match e.outcome {
                Outcome::Waiting => {
                    p.waiting.remove(&(Reverse(priority_rank(e)), e.submitted_ms, job));
                }
                Outcome::Started { wait_ms, .. } => {
                    p.starts.remove(&(e.submitted_ms.saturating_add(wait_ms), job));
                }
                Outcome::Ended { .. } => {}
            }
            if p.is_empty() {
                self.pools.remove(&e.key.pool);
            }
        }
    }

    /// Replaces a job's entry `before` by `after` (either may be absent).
    pub fn replace(&mut self, job: u64, before: Option<&Entry>, after: Option<&Entry>) {
        if before == after {
            return;
        }
        if let Some(b) = before {
            self.remove(job, b);
        }
        if let Some(a) = after {
            self.add(job, a);
        }
    }

    /// Drops jobs submitted before the history window.
    pub fn prune(&mut self, now: i64) {
        let from = now.saturating_sub(HISTORY_MS);
        self.groups.retain(|_, g| {
            while g.first_key_value().is_some_and(|((s, _), _)| *s < from) {
                g.pop_first();
            }
            !g.is_empty()
        });
        self.pools.retain(|_, p| {
            while p.jobs.first_key_value().is_some_and(|((s, _), _)| *s < from) {
                p.jobs.pop_first();
            }
            p.waiting.retain(|(_, s, _), _| *s >= from);
            while p.starts.first_key_value().is_some_and(|((s, _), _)| *s < from) {
                p.starts.pop_first();
            }
            !p.is_empty()
        });
    }

    /// Entries held (over every level).
    pub fn len(&self) -> usize {
        self.groups.values().map(BTreeMap::len).sum()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// A group's jobs in the window as `(wait, started)` (a job still waiting as `now - submitted`), with the
    /// scheduler's errors among them.
    fn samples(&self, key: &GroupKey, now: i64) -> (Vec<(i64, bool)>, Vec<i64>) {
        let (mut waits, mut errors) = (Vec::new(), Vec::new());
        let Some(g) = self.groups.get(key) else { return (waits, errors) };
        for ((submitted, _), o) in g.range((now.saturating_sub(HISTORY_MS), 0)..) {
            match *o {
                Outcome::Waiting => waits.push(((now - submitted).max(0), false)),
                Outcome::Started { wait_ms, scheduler_error_ms } => {
                    waits.push((wait_ms, true));
                    errors.extend(scheduler_error_ms);
                }
                Outcome::Ended { wait_ms } => waits.push((wait_ms, false)),
            }
        }
        (waits, errors)
    }

    /// The history a job of `key` (full; `reason` `None` to skip the reason level) rests on at `now`: the group
    /// used and its curve, with the pool's scheduler errors. `None` when no group qualifies.
    pub fn history(&self, key: &GroupKey, now: i64) -> Inputs {
        let start = if key.reason.is_some() { 0 } else { 1 };
        let mut chosen = None;
        for level in start..LEVELS {
            let k = key.at_level(level);
            let (waits, _) = self.samples(&k, now);
            let started = waits.iter().any(|(_, s)| *s);
            if started && (waits.len() >= MIN_JOBS || level == LEVELS - 1) {
                chosen = Some((k, waits));
                break;
            }
        }
        let errors = self.scheduler_errors(&key.pool, now);
        Inputs {
            history: chosen.map(|(group, waits)| {
                let jobs = waits.len();
                History { group, jobs, km: Km::new(waits) }
            }),
            scheduler_errors: errors,
            queue: None,
        }
    }

    /// The pool's scheduler errors in the window, sorted.
    pub fn scheduler_errors(&self, pool: &str, now: i64) -> Vec<i64> {
        let key = GroupKey { pool: pool.to_string(), priority: None, gpu_class: None, gpus: None, reason: None };
        let (_, mut errors) = self.samples(&key, now);
        errors.sort_unstable();
        errors
    }

    /// The queue state at `now` of a job of `pool` with `priority` (its rank, [`pb::PriorityClass`] as a number),
    /// asking for `gpus`, submitted at `submitted` (see the module's documentation); `None` when the pool has
    /// fewer than [`MIN_JOBS`] recent jobs or none of the similar ones started.
    pub fn queue_state(
        &self,
        pool: &str,
        priority: i32,
        gpus: u32,
        submitted: i64,
        queued: bool,
        now: i64,
    ) -> Option<QueueState> {
        let p = self.pools.get(pool)?;
        let from = now.saturating_sub(HISTORY_MS);
        let (mut jobs_ahead, mut gpus_ahead) = (0usize, 0u64);
        let me = if queued { (Reverse(priority), submitted, 0) } else { (Reverse(i32::MAX), i64::MIN, 0) };
        for ((_, s, _), g) in p.waiting.range(..me) {
            if *s >= from {
                jobs_ahead += 1;
                gpus_ahead += u64::from(*g);
            }
        }
        let started_gpus = p.started_gpus(now);
        let load = load_ms(gpus_ahead, gpus, started_gpus);
        let past = past_loads(p, from, now);
        if past.len() < MIN_JOBS {
            return None;
        }
        let mut scored: Vec<(f64, (i64, bool))> = past
            .iter()
            .map(|j| {
                let apart = if j.priority == priority { 0.0 } else { OTHER_PRIORITY }
                    + if gpu_bucket(j.gpus) == gpu_bucket(gpus) { 0.0 } else { OTHER_GPU_BUCKET };
                ((j.load_ms.ln() - load.ln()).abs() + apart, j.sample)
            })
            .collect();
        let k = SIMILAR_JOBS.min(scored.len());
        if k < scored.len() {
            scored.select_nth_unstable_by(k - 1, |a, b| a.0.total_cmp(&b.0));
            scored.truncate(k);
        }
        let km = Km::new(scored.into_iter().map(|x| x.1).collect());
        let group = GroupKey { pool: pool.to_string(), priority: None, gpu_class: None, gpus: None, reason: None };
        (km.events() > 0).then_some(QueueState {
            jobs_ahead,
            gpus_ahead,
            started_gpus,
            load_ms: load,
            group,
            similar: k,
            km,
        })
    }
}

/// A recent job of a pool with the load it met at its submit, and its wait as a Kaplan-Meier sample.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PastJob {
    submitted: i64,
    priority: i32,
    gpus: u32,
    load_ms: f64,
    sample: (i64, bool),
}

/// The pool's [`CALIBRATION_JOBS`] most recent jobs submitted in `[from, now)`, newest first, each with the load
/// it met at its submit (see the module's documentation).
fn past_loads(p: &PoolQueue, from: i64, now: i64) -> Vec<PastJob> {
    // The pool's most recent jobs submitted by now, each with when its first wait ended (`None`: still waiting).
    let recent: Vec<(i64, Filed, Option<i64>)> = p
        .jobs
        .range((from, 0)..(now, u64::MAX))
        .rev()
        .take(CALIBRATION_JOBS)
        .map(|((s, _), f)| {
            let fin = match f.outcome {
                Outcome::Waiting => None,
                Outcome::Started { wait_ms, .. } | Outcome::Ended { wait_ms } => Some(s.saturating_add(wait_ms)),
            };
            (*s, *f, fin)
        })
        .collect();
    let earliest = recent.last().map_or(now, |r| r.0);
    // GPUs of the jobs that may have been waiting at one of those submits (not done by the earliest; a job
    // done by then adds as much as it takes away), by priority: their submits and ends, accumulated.
    // Per priority: (submit, GPUs) and (end, GPUs).
    type Times = Vec<(i64, u64)>;
    let mut by_priority: BTreeMap<i32, (Times, Times)> = BTreeMap::new();
    for ((s, _), f) in p.jobs.range((from, 0)..(now, u64::MAX)) {
        let fin = match f.outcome {
            Outcome::Waiting => None,
            Outcome::Started { wait_ms, .. } | Outcome::Ended { wait_ms } => Some(s.saturating_add(wait_ms)),
        };
        if fin.is_some_and(|x| x <= earliest || x <= *s) {
            continue;
        }
        let (subs, fins) = by_priority.entry(f.priority).or_default();
        subs.push((*s, u64::from(f.gpus)));
        fins.extend(fin.map(|x| (x, u64::from(f.gpus))));
    }
    let by_priority: Vec<(i32, Cumulative, Cumulative)> =
        by_priority.into_iter().map(|(pr, (s, f))| (pr, Cumulative::new(s), Cumulative::new(f))).collect();
    let starts = Cumulative::new(
        p.starts
            .range((earliest.saturating_sub(RATE_WINDOW_MS), 0)..(now, 0))
            .map(|((t, _), g)| (*t, u64::from(*g)))
            .collect(),
    );
    recent
        .iter()
        .map(|(s, f, fin)| {
            // Ranked ahead at its submit: a higher priority submitted by then, or the same submitted before.
            let ahead: u64 = by_priority
                .iter()
                .filter(|(pr, _, _)| *pr >= f.priority)
                .map(|(pr, subs, fins)| {
                    let submitted = if *pr > f.priority { subs.upto(*s, true) } else { subs.upto(*s, false) };
                    submitted.saturating_sub(fins.upto(*s, true))
                })
                .sum();
            let started = starts.upto(*s, false) - starts.upto(s.saturating_sub(RATE_WINDOW_MS), false);
            let l = load_ms(ahead, f.gpus, started);
            let sample = match (f.outcome, fin) {
                (Outcome::Started { wait_ms, .. }, _) => (wait_ms, true),
                (_, Some(fin)) => (fin - s, false),
                (_, None) => ((now - s).max(0), false),
            };
            PastJob { submitted: *s, priority: f.priority, gpus: f.gpus, load_ms: l, sample }
        })
        .collect()
}

/// Values at times, accumulated: how much came by a time.
struct Cumulative {
    times: Vec<i64>,
    sums: Vec<u64>,
}

impl Cumulative {
    fn new(mut v: Vec<(i64, u64)>) -> Cumulative {
        v.sort_unstable();
        let mut total = 0;
        let sums = v.iter().map(|(_, x)| {
            total += x;
            total
        });
        let sums = sums.collect();
        Cumulative { times: v.into_iter().map(|x| x.0).collect(), sums }
    }

    /// The sum of the values at times before `t` (and at `t` when `inclusive`).
    fn upto(&self, t: i64, inclusive: bool) -> u64 {
        let i =
            if inclusive { self.times.partition_point(|x| *x <= t) } else { self.times.partition_point(|x| *x < t) };
        if i == 0 {
            0
        } else {
            self.sums[i - 1]
        }
    }
}

/// An entry's priority as a rank (higher first).
fn priority_rank(e: &Entry) -> i32 {
    e.key.priority.map_or(0, |p| p as i32)
}

/// A Kaplan-Meier survival curve of waits.
#[derive(Debug, Clone, PartialEq)]
pub struct Km {
    /// Distinct times at which jobs started, ascending.
    times: Vec<i64>,
    /// `S(t)` just after each of `times`.
    surv: Vec<f64>,
    /// The longest wait seen (started or not).
    last: i64,
    /// Starts.
    events: usize,
    /// Total time at risk (the sum of all waits), ms.
    exposure: f64,
}

impl Km {
    /// The curve of `(wait ms, started)` samples (a sample that did not start is censored at its wait). At a time
    /// with starts and censored waits, the censored jobs count as at risk.
    pub fn new(mut samples: Vec<(i64, bool)>) -> Km {
        samples.sort_unstable();
        let mut at_risk = samples.len();
        let (mut times, mut surv) = (Vec::new(), Vec::new());
        let mut s = 1.0f64;
        let mut events = 0;
        let mut i = 0;
        while i < samples.len() {
            let t = samples[i].0;
            let (mut d, mut n) = (0usize, 0usize);
            while i < samples.len() && samples[i].0 == t {
                d += usize::from(samples[i].1);
                n += 1;
                i += 1;
            }
            if d > 0 {
                s *= 1.0 - d as f64 / at_risk as f64;
                times.push(t);
                surv.push(s);
                events += d;
            }
            at_risk -= n;
        }
        Km {
            times,
            surv,
            last: samples.last().map_or(0, |x| x.0),
            events,
            exposure: samples.iter().map(|x| x.0.max(0) as f64).sum(),
        }
    }

    /// `S(t)`: the share of jobs still waiting after `t`.
    pub fn survival(&self, t: i64) -> f64 {
        let i = self.times.partition_point(|x| *x <= t);
        if i == 0 {
            1.0
        } else {
            self.surv[i - 1]
        }
    }

    /// Starts in the curve.
    pub fn events(&self) -> usize {
        self.events
    }

    /// The `q`-quantile (0 < q < 1) of the wait of a job that has waited `w`: the first start time `t > w` with
    /// `S(t) <= (1 - q) S(w)`, else the constant-hazard tail (see the module's documentation). `None` when no job
    /// started.
    pub fn quantile(&self, w: i64, q: f64) -> Option<i64> {
        if self.events == 0 {
            return None;
        }
        let sw = self.survival(w);
        if sw > 0.0 {
            // A hair above, so a curve that reaches the target exactly (0.1 after 9 of 10 starts) is not missed
            // by a rounding error of the products.
            let target = (1.0 - q) * sw + 1e-9;
            let from = self.times.partition_point(|x| *x <= w);
            let k = from + self.surv[from..].partition_point(|s| *s > target);
            if k < self.times.len() {
                return Some(self.times[k]);
            }
        }
        let lambda = self.events as f64 / self.exposure.max(1.0);
        let (m, r) = if sw > 0.0 { (w.max(self.last), self.survival(self.last) / sw) } else { (w, 1.0) };
        let add = ((r / (1.0 - q)).ln() / lambda).ceil().clamp(0.0, TAIL_CAP_MS as f64);
        Some(m.saturating_add(add as i64))
    }
}

/// The `q`-quantile of sorted values (nearest rank).
fn empirical(sorted: &[i64], q: f64) -> Option<i64> {
    let n = sorted.len();
    (n > 0).then(|| sorted[((q * n as f64).ceil() as usize).clamp(1, n) - 1])
}

/// The group a history estimate rests on.
#[derive(Debug, Clone, PartialEq)]
pub struct History {
    /// The group used.
    pub group: GroupKey,
    /// Its jobs in the window (started, ended and waiting).
    pub jobs: usize,
    /// Their curve.
    pub km: Km,
}

/// What an estimate rests on besides the job itself: read from the book once, then asked for any `now`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Inputs {
    /// The group's history, if any qualifies.
    pub history: Option<History>,
    /// The pool's scheduler errors (first step less the last estimate), sorted.
    pub scheduler_errors: Vec<i64>,
    /// The job's queue state, if the pool has one.
    pub queue: Option<QueueState>,
}

/// Positions seen in the current wait: the first and the latest, as `(time, position)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueProgress {
    /// The first position seen in the current wait.
    pub first: (i64, u32),
    /// The latest.
    pub latest: (i64, u32),
}

impl QueueProgress {
    /// From the current wait's positions in time order.
    pub fn of(positions: impl IntoIterator<Item = (i64, u32)>) -> Option<QueueProgress> {
        let mut it = positions.into_iter();
        let first = it.next()?;
        let latest = it.last().unwrap_or(first);
        Some(QueueProgress { first, latest })
    }

    /// When the position reaches 0 at the rate it fell, with the interval (remaining time halved and doubled);
    /// `None` while it has not fallen.
    fn quantiles(&self) -> Option<[i64; 3]> {
        let ((t1, p1), (t2, p2)) = (self.first, self.latest);
        if p2 >= p1 || t2 <= t1 {
            return None;
        }
        let rate = f64::from(p1 - p2) / (t2 - t1) as f64;
        let remaining = f64::from(p2) / rate;
        let at = |f: f64| t2.saturating_add((remaining * f).round().min(TAIL_CAP_MS as f64) as i64);
        Some([at(0.5), at(1.0), at(2.0)])
    }
}

/// A waiting job, as the estimate needs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Query {
    /// When its current wait began (its submit for a first wait).
    pub wait_started_ms: i64,
    /// The scheduler's estimated start of the current wait.
    pub scheduler_estimate_ms: Option<i64>,
    /// Its queue position's progress in the current wait.
    pub queue: Option<QueueProgress>,
}

/// What an estimate rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// The group's history alone.
    History,
    /// The scheduler's estimate alone.
    Scheduler,
    /// The queue position's progress alone.
    QueuePosition,
    /// History and the scheduler's estimate.
    HistoryScheduler,
    /// History and the queue position.
    HistoryQueuePosition,
    /// The queue state alone.
    QueueState,
    /// The queue state and the scheduler's estimate.
    QueueStateScheduler,
    /// The queue state and the queue position.
    QueueStateQueuePosition,
}

impl Basis {
    /// As the API writes it.
    pub fn label(self) -> &'static str {
        match self {
            Basis::History => "history",
            Basis::Scheduler => "scheduler",
            Basis::QueuePosition => "queue_position",
            Basis::HistoryScheduler => "history+scheduler",
            Basis::HistoryQueuePosition => "history+queue_position",
            Basis::QueueState => "queue_state",
            Basis::QueueStateScheduler => "queue_state+scheduler",
            Basis::QueueStateQueuePosition => "queue_state+queue_position",
        }
    }
}

/// A job's expected start.
#[derive(Debug, Clone, PartialEq)]
pub struct Eta {
    /// Central estimate (Unix ms).
    pub at_ms: i64,
    /// The interval's low end.
    pub low_ms: i64,
    /// Its high end.
    pub high_ms: i64,
    /// What it rests on.
    pub basis: Basis,
    /// Jobs of the group used (0 without history).
    pub comparable_jobs: usize,
    /// The group used (`None` without history).
    pub group: Option<GroupKey>,
    /// How long the job has waited (its current wait).
    pub waited_ms: i64,
    /// Jobs of its pool in their first wait ranked ahead of it and the GPUs they ask for, when the pool has a
    /// queue state.
    pub ahead: Option<(usize, u64)>,
}

/// The expected start of `q` at `now` from `inputs` (see the module's documentation); `None` when nothing gives
/// one.
pub fn estimate(inputs: &Inputs, q: &Query, now: i64) -> Option<Eta> {
    let w = (now - q.wait_started_ms).max(0);
    let curve = |km: &Km| {
        let at = |p: f64| km.quantile(w, p).map(|t| q.wait_started_ms.saturating_add(t));
        let spread = km.quantile(0, QUANTILES[2])? - km.quantile(0, QUANTILES[0])?;
        Some(([at(QUANTILES[0])?, at(QUANTILES[1])?, at(QUANTILES[2])?], spread))
    };
    // The queue state's similar jobs, else the group's history.
    let (hist, from_queue) = match inputs.queue.as_ref().and_then(|s| curve(&s.km)) {
        Some(c) => (Some(c), true),
        None => (inputs.history.as_ref().and_then(|h| curve(&h.km)), false),
    };
    let errs = &inputs.scheduler_errors;
    let sched = q.scheduler_estimate_ms.map(|est| {
        if errs.len() >= MIN_CALIBRATION {
            let e = QUANTILES.map(|p| empirical(errs, p).unwrap_or(0));
            (e.map(|x| est.saturating_add(x)), Some(e[2] - e[0]))
        } else {
            ([est; 3], None)
        }
    });
    let queue = q.queue.and_then(|p| p.quantiles());
    let width = |x: i64| (x as f64).max(MIN_WIDTH_MS);
    let (qs, basis) = match (hist, sched, queue) {
        (Some((h, hw)), Some((s, sw)), _) => {
            let a = match sw {
                Some(sw) => {
                    let (ws, wh) = (1.0 / width(sw).powi(2), 1.0 / width(hw).powi(2));
                    ws / (ws + wh)
                }
                None => 0.5,
            };
            (mix(s, h, a), if from_queue { Basis::QueueStateScheduler } else { Basis::HistoryScheduler })
        }
        (Some((h, _)), None, Some(p)) => {
            (mix(p, h, 0.5), if from_queue { Basis::QueueStateQueuePosition } else { Basis::HistoryQueuePosition })
        }
        (Some((h, _)), None, None) => (h, if from_queue { Basis::QueueState } else { Basis::History }),
        (None, Some((s, _)), _) => (s, Basis::Scheduler),
        (None, None, Some(p)) => (p, Basis::QueuePosition),
        (None, None, None) => return None,
    };
    let [low, at, high] = qs.map(|x| x.max(now));
    let with_history = !matches!(basis, Basis::Scheduler | Basis::QueuePosition);
    let (comparable_jobs, group) = match (&inputs.queue, &inputs.history) {
        _ if !with_history => (0, None),
        (Some(s), _) if from_queue => (s.similar, Some(s.group.clone())),
        (_, Some(h)) => (h.jobs, Some(h.group.clone())),
        _ => (0, None),
    };
    Some(Eta {
        at_ms: at,
        low_ms: low,
        high_ms: high,
        basis,
        comparable_jobs,
        group,
        waited_ms: w,
        ahead: inputs.queue.as_ref().map(|s| (s.jobs_ahead, s.gpus_ahead)),
    })
}

/// The expected start of a job from its timeline: `None` unless it waits (queued, assigned or preparing) with
/// its attributes known, or when nothing gives one. A first wait counts from the submit, a later one (after a
/// preemption or requeue) from when it began; `queue` is the current wait's queue-position progress if the caller
/// has it (the compact events the index keeps do not hold positions).
pub fn for_job(book: &WaitBook, t: &Timeline, queue: Option<QueueProgress>, now: i64) -> Option<Eta> {
    if !t.state.is_waiting() {
        return None;
    }
    let a = t.attrs.as_ref()?;
    let wait_started_ms = if t.first_step_at.is_none() { t.submitted_at? } else { t.wait_started_at? };
    let key = GroupKey {
        pool: a.pool.clone(),
        priority: Some(a.priority),
        gpu_class: Some(a.gpu_class.clone()),
        gpus: Some(gpu_bucket(a.gpu_count)),
        reason: query_reason(t),
    };
    let query = Query { wait_started_ms, scheduler_estimate_ms: t.current_estimated_start, queue };
    let state = t
        .submitted_at
        .and_then(|s| book.queue_state(&a.pool, a.priority as i32, a.gpu_count, s, key.reason.is_some(), now));
    // With a queue state the group's history is not used: it is not read.
    let inputs = match state {
        Some(state) => {
            Inputs { history: None, scheduler_errors: book.scheduler_errors(&a.pool, now), queue: Some(state) }
        }
        None => book.history(&key, now),
    };
    estimate(&inputs, &query, now)
}

/// `a * other + (1 - a) * history`, quantile by quantile.
fn mix(other: [i64; 3], history: [i64; 3], a: f64) -> [i64; 3] {
    let mut out = [0; 3];
    for i in 0..3 {
        out[i] = (a * other[i] as f64 + (1.0 - a) * history[i] as f64).round() as i64;
    }
    out
}

/// The smallest move of the central estimate the stream reports: 10% of the wait it had left, at least 5 minutes.
pub fn reportable_move(before: Option<&Eta>, after: Option<&Eta>, now: i64) -> bool {
    match (before, after) {
        (None, None) => false,
        (Some(b), Some(a)) => central_moved(b.at_ms, a.at_ms, now),
        _ => true,
    }
}

/// Whether a central estimate moved from `before_ms` to `after_ms` by more than [`reportable_move`] reports.
pub fn central_moved(before_ms: i64, after_ms: i64, now: i64) -> bool {
    let threshold = ((before_ms - now).max(0) / 10).max(5 * 60_000);
    (after_ms - before_ms).abs() > threshold
}

#[cfg(test)]
#[path = "eta_tests.rs"]
mod tests;
