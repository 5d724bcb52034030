//! Job metrics kept incrementally: each job carries a small footprint (its bounded labels, its GPUs, whether it
//! waits and since when, whether it started or ended, its preemptions and lost work). When a job's timeline
//! changes, the old and new footprints are compared: gauges (jobs and GPUs waiting, oldest wait by pool) move,
//! and transitions become observations (a start with its time to first step and wait segments, the GPU-seconds
//! its initial wait held, an end with its outcome, preemptions, lost GPU-seconds) for the OpenTelemetry
//! instruments. Gauges are kept under exactly the attribute sets they are exported with (segment gauges carry
//! no GPU class or region), so a scrape neither scans jobs nor merges keys.
//!
//! Histograms and counters record each transition once, when it is first seen; a late event that changes an
//! already recorded time to first step does not re-record it (the SLO windows, which can move a job, are the
//! exact view). After a restart footprints are rebuilt silently: gauges are exact, counters start from zero.

use super::labels::{JobLabels, LabelLimiter};
use crate::job::{Segment, Timeline};
use startline_proto::pb;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// What the metrics know of one job.
#[derive(Debug, Clone, PartialEq)]
pub struct Footprint {
    /// Bounded labels.
    pub labels: Arc<JobLabels>,
    /// GPUs requested (`gpu_count` of the job's submit).
    pub gpus: u32,
    /// Waiting now: the segment and when the wait began.
    pub waiting: Option<(Segment, i64)>,
    /// Time to first step, once started.
    pub ttfs_ms: Option<i64>,
    /// The outcome, once ended.
    pub outcome: Option<pb::Outcome>,
    /// Preemptions so far.
    pub preemptions: u32,
    /// Lost GPU-seconds so far.
    pub lost_gpu_seconds: f64,
}

/// A transition to record in an instrument.
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    /// A job reached its first step.
    Started {
        /// Labels.
        labels: Arc<JobLabels>,
        /// Time to first step, seconds.
        ttfs_seconds: f64,
    },
    /// One segment of a job's initial wait, recorded when the wait ends (first step or end).
    WaitSegment {
        /// Labels.
        labels: Arc<JobLabels>,
        /// Segment name, e.g. `queued:capacity`.
        segment: String,
        /// Duration, seconds.
        seconds: f64,
    },
    /// The GPU-seconds a job's initial wait held (its GPUs x its wait before the first step), recorded when the
    /// wait ends (first step or end), with the wait segments.
    Waited {
        /// Labels.
        labels: Arc<JobLabels>,
        /// GPU-seconds.
        gpu_seconds: f64,
    },
    /// A job's GPU time by category (`job::goodput::CATEGORIES` order, GPU-seconds), recorded when it ends.
    GpuTime {
        /// Labels.
        labels: Arc<JobLabels>,
        /// GPU-seconds per category.
        gpu_seconds: [f64; 7],
    },
    /// A job ended.
    Finished {
        /// Labels.
        labels: Arc<JobLabels>,
        /// Outcome.
        outcome: pb::Outcome,
        /// It ended without ever reaching its first step (cancelled or failed while waiting).
        before_start: bool,
    },
    /// Preemptions seen.
    Preempted {
        /// Labels.
        labels: Arc<JobLabels>,
        /// How many.
        count: u64,
    },
    /// Work lost, GPU-seconds.
    LostWork {
        /// Labels.
        labels: Arc<JobLabels>,
        /// GPU-seconds.
        gpu_seconds: f64,
    },
}

/// Where the applier records job transitions and commit times: the metrics exporter implements it (the applier
/// does not know the exporter).
pub trait MetricsSink: Send + Sync {
    /// Records the transitions of one group commit.
    fn record(&self, observations: &[Observation]);
    /// Records how long one group commit took.
    fn record_commit(&self, took: std::time::Duration);
}

/// Key of the oldest-wait gauge: pool kind, provider, pool, priority.
pub type PoolKey = (&'static str, Arc<str>, Arc<str>, &'static str);

/// Key of the jobs-waiting gauge: pool kind, provider, pool, priority, team (empty when not exported), segment.
pub type SegmentKey = (&'static str, Arc<str>, Arc<str>, &'static str, Arc<str>, String);

/// Key of the GPUs-waiting gauge: pool kind, provider, pool, priority, GPU class, team (empty when not exported).
pub type GpuKey = (&'static str, Arc<str>, Arc<str>, &'static str, Arc<str>, Arc<str>);

/// Gauges over all jobs, kept incrementally.
#[derive(Debug, Default)]
pub struct JobGauges {
    /// Jobs waiting now, by pool, priority, team and segment.
    pub waiting: HashMap<SegmentKey, i64>,
    /// GPUs requested by the jobs waiting now, by pool, priority, GPU class and team.
    pub waiting_gpus: HashMap<GpuKey, i64>,
    /// Waiting jobs by pool and priority, ordered by when their wait began.
    pub oldest: HashMap<PoolKey, BTreeSet<(i64, String)>>,
}

fn pool_key(l: &JobLabels) -> PoolKey {
    (l.pool_kind, l.provider.clone(), l.pool.clone(), l.priority)
}

fn segment_key(l: &JobLabels, segment: Segment) -> SegmentKey {
    (l.pool_kind, l.provider.clone(), l.pool.clone(), l.priority, l.team.clone(), segment.label())
}

fn gpu_key(l: &JobLabels) -> GpuKey {
    (l.pool_kind, l.provider.clone(), l.pool.clone(), l.priority, l.gpu_class.clone(), l.team.clone())
}

/// The footprint of a timeline (None until the job's `submitted` arrives).
pub fn footprint(t: &Timeline, limiter: &LabelLimiter, previous: Option<&Footprint>) -> Option<Footprint> {
    let attrs = t.attrs.as_ref()?;
    // Labels never change for a job (first submitted wins), so reuse them instead of asking the limiter again.
    let labels = match previous {
        Some(p) => p.labels.clone(),
        None => Arc::new(limiter.job(attrs)),
    };
    let waiting = if t.state.is_waiting() { t.current_wait.map(|(s, _)| s).zip(t.wait_started_at) } else { None };
    Some(Footprint {
        labels,
        gpus: attrs.gpu_count,
        waiting,
        ttfs_ms: t.time_to_first_step_ms(),
        outcome: t.outcome,
        preemptions: t.preemptions,
        lost_gpu_seconds: t.lost_gpu_seconds(),
    })
}

impl JobGauges {
    /// Applies a job's footprint change; returns the transitions to record (none when `silent`).
    pub fn update(
        &mut self,
        job_id: &str,
        old: Option<&Footprint>,
        new: Option<&Footprint>,
        t: &Timeline,
        silent: bool,
    ) -> Vec<Observation> {
        if let Some(o) = old {
            if let Some((seg, since)) = o.waiting {
                self.unbump_waiting(segment_key(&o.labels, seg), gpu_key(&o.labels), i64::from(o.gpus));
                if let Some(set) = self.oldest.get_mut(&pool_key(&o.labels)) {
                    set.remove(&(since, job_id.to_string()));
                }
            }
        }
        let mut out = Vec::new();
        let Some(n) = new else { return out };
        if let Some((seg, since)) = n.waiting {
            *self.waiting.entry(segment_key(&n.labels, seg)).or_insert(0) += 1;
            if n.gpus > 0 {
                *self.waiting_gpus.entry(gpu_key(&n.labels)).or_insert(0) += i64::from(n.gpus);
            }
            self.oldest.entry(pool_key(&n.labels)).or_default().insert((since, job_id.to_string()));
        }
        if silent {
            return out;
        }
        let labels = &n.labels;
        let was_started = old.is_some_and(|o| o.ttfs_ms.is_some());
        let was_done = old.is_some_and(|o| o.outcome.is_some());
        let initial_wait_closed_now = (!was_started && n.ttfs_ms.is_some())
            || (!was_done && n.outcome.is_some() && n.ttfs_ms.is_none() && !was_started);
        if let (false, Some(ttfs)) = (was_started, n.ttfs_ms) {
            out.push(Observation::Started { labels: labels.clone(), ttfs_seconds: ttfs as f64 / 1000.0 });
        }
        if initial_wait_closed_now {
            let mut total_ms = 0;
            for (seg, ms) in &t.initial_wait_ms {
                total_ms += *ms;
                out.push(Observation::WaitSegment {
                    labels: labels.clone(),
                    segment: seg.label(),
                    seconds: *ms as f64 / 1000.0,
                });
            }
            if n.gpus > 0 && total_ms > 0 {
                out.push(Observation::Waited {
                    labels: labels.clone(),
                    gpu_seconds: f64::from(n.gpus) * total_ms as f64 / 1000.0,
                });
            }
        }
        if let (false, Some(outcome)) = (was_done, n.outcome) {
            out.push(Observation::Finished { labels: labels.clone(), outcome, before_start: n.ttfs_ms.is_none() });
            if let (Some(a), true) = (crate::job::goodput::account(t, t.done_at.unwrap_or(0)), n.gpus > 0) {
                let g = f64::from(n.gpus) / 1000.0;
                out.push(Observation::GpuTime {
                    labels: labels.clone(),
                    gpu_seconds: a.by_category().map(|ms| ms as f64 * g),
                });
            }
        }
        let prev_pre = old.map_or(0, |o| o.preemptions);
        if n.preemptions > prev_pre {
            out.push(Observation::Preempted { labels: labels.clone(), count: u64::from(n.preemptions - prev_pre) });
        }
        let prev_lost = old.map_or(0.0, |o| o.lost_gpu_seconds);
        if n.lost_gpu_seconds > prev_lost {
            out.push(Observation::LostWork { labels: labels.clone(), gpu_seconds: n.lost_gpu_seconds - prev_lost });
        }
        out
    }

    /// Removes one waiting job of `gpus` GPUs from the waiting gauges.
    fn unbump_waiting(&mut self, seg: SegmentKey, gpu: GpuKey, gpus: i64) {
        if let Some(n) = self.waiting.get_mut(&seg) {
            *n -= 1;
            if *n <= 0 {
                self.waiting.remove(&seg);
            }
        }
        if gpus > 0 {
            if let Some(n) = self.waiting_gpus.get_mut(&gpu) {
                *n -= gpus;
                if *n <= 0 {
                    self.waiting_gpus.remove(&gpu);
                }
            }
        }
    }

    /// Age of the oldest waiting job per pool and priority, seconds, as of `now_ms`.
    pub fn oldest_ages(&self, now_ms: i64) -> Vec<(PoolKey, f64)> {
        self.oldest
            .iter()
            .filter_map(|(k, set)| set.first().map(|(since, _)| (k.clone(), ((now_ms - since).max(0)) as f64 / 1000.0)))
            .collect()
    }
}
