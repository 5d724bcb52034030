//! The in-memory job index shared by the committer (the only writer) and readers (API, exporters).

use crate::export::jobs::{footprint, JobGauges, Observation};
use crate::export::labels::{LabelLimiter, LabelSettings};
use crate::job::JobRecord;
use crate::slo::SloEngine;
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Every job the collector knows, by job id, plus which changed since the last checkpoint, and the SLO state
/// derived from them (kept under the same lock so it always matches the jobs).
#[derive(Debug)]
pub struct JobIndex {
    /// Jobs by id, in id order (the API paginates by id).
    pub jobs: BTreeMap<String, JobRecord>,
    /// Jobs changed since the last checkpoint.
    pub dirty: HashSet<String>,
    /// The highest log sequence applied.
    pub last_seq: u64,
    /// SLO windows and the deadline index.
    pub slo: SloEngine,
    /// Job gauges for metrics, kept incrementally.
    pub gauges: JobGauges,
    /// Bounds free-text metric attributes.
    pub limiter: LabelLimiter,
}

impl Default for JobIndex {
    fn default() -> Self {
        JobIndex::new(BTreeMap::new(), 0, SloEngine::new(Vec::new()), LabelLimiter::new(&LabelSettings::default()))
    }
}

impl JobIndex {
    /// An index over restored jobs: assesses every job for the SLOs and the metric gauges (silently: no counter
    /// moves for history).
    pub fn new(jobs: BTreeMap<String, JobRecord>, last_seq: u64, slo: SloEngine, limiter: LabelLimiter) -> Self {
        Self::new_at(jobs, last_seq, slo, limiter, startline_proto::time::now_ms())
    }

    /// [`JobIndex::new`] as of a given time.
    pub fn new_at(
        mut jobs: BTreeMap<String, JobRecord>,
        last_seq: u64,
        mut slo: SloEngine,
        limiter: LabelLimiter,
        now: i64,
    ) -> Self {
        let mut gauges = JobGauges::default();
        slo.rebuild(&mut jobs, now);
        for (id, rec) in jobs.iter_mut() {
            rec.metrics = None;
            let fp = footprint(&rec.timeline, &limiter, None);
            gauges.update(id, None, fp.as_ref(), &rec.timeline, true);
            rec.metrics = fp;
        }
        JobIndex { jobs, dirty: HashSet::new(), last_seq, slo, gauges, limiter }
    }

    /// Marks jobs as changed since the last checkpoint: after a restore, every job rebuilt from the log tail,
    /// whose snapshot lacks those events (else the next checkpoint would move the marker past them unwritten).
    pub fn with_dirty(mut self, dirty: HashSet<String>) -> Self {
        self.dirty = dirty;
        self
    }
}

/// Everything derived from a job after its timeline changed: SLO contributions and metric footprint. Returns the
/// transitions to record in metrics.
pub fn on_job_changed(
    slo: &mut SloEngine,
    gauges: &mut JobGauges,
    limiter: &LabelLimiter,
    job_id: &str,
    rec: &mut JobRecord,
    now_ms: i64,
) -> Vec<Observation> {
    slo.on_job(job_id, rec, now_ms);
    let fp = footprint(&rec.timeline, limiter, rec.metrics.as_ref());
    let obs = gauges.update(job_id, rec.metrics.as_ref(), fp.as_ref(), &rec.timeline, false);
    rec.metrics = fp;
    obs
}

/// A cheaply clonable handle to the index. Readers hold the lock briefly; never across `.await`.
#[derive(Debug, Clone, Default)]
pub struct SharedIndex(Arc<RwLock<JobIndex>>);

impl SharedIndex {
    /// Wraps an index.
    pub fn new(index: JobIndex) -> Self {
        SharedIndex(Arc::new(RwLock::new(index)))
    }

    /// Read access. A poisoned lock (a panic while writing) is still readable: the index is only ever changed
    /// by whole-event inserts.
    pub fn read(&self) -> RwLockReadGuard<'_, JobIndex> {
        self.0.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Visits every job in id order, `chunk` jobs per read lock, releasing the lock between chunks so a long scan
    /// (comparisons, overviews, filtered listings over a million jobs) never holds the committer off for more
    /// than one chunk. Jobs changed during the scan are seen in whichever state the visit finds them.
    pub fn for_each_job(&self, chunk: usize, mut f: impl FnMut(&str, &JobRecord)) {
        self.scan_from(None, chunk, |k, r| {
            f(k, r);
            true
        });
    }

    /// Like [`SharedIndex::for_each_job`], starting after `after` and stopping when `f` returns false.
    pub fn scan_from(&self, after: Option<&str>, chunk: usize, mut f: impl FnMut(&str, &JobRecord) -> bool) {
        use std::ops::Bound;
        let chunk = chunk.max(1);
        let mut after: Option<String> = after.map(str::to_string);
        loop {
            let idx = self.read();
            let lower = match &after {
                Some(k) => Bound::Excluded(k.clone()),
                None => Bound::Unbounded,
            };
            let mut n = 0;
            let mut last = None;
            for (k, r) in idx.jobs.range((lower, Bound::Unbounded)).take(chunk) {
                if !f(k, r) {
                    return;
                }
                n += 1;
                last = Some(k);
            }
            let next = last.cloned();
            drop(idx);
            if n < chunk {
                return;
            }
            after = next;
        }
    }

    /// Write access, for the committer.
    pub fn write(&self) -> RwLockWriteGuard<'_, JobIndex> {
        self.0.write().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_scan_visits_every_job_once_in_order() {
        let mut idx = JobIndex::default();
        for i in 0..7 {
            idx.jobs.insert(format!("j{i}"), JobRecord::default());
        }
        let shared = SharedIndex::new(idx);
        for chunk in [1, 2, 3, 7, 8, 100] {
            let mut seen = Vec::new();
            shared.for_each_job(chunk, |k, _| seen.push(k.to_string()));
            let want: Vec<String> = (0..7).map(|i| format!("j{i}")).collect();
            assert_eq!(seen, want, "chunk {chunk}");
            // Resuming after a key, and stopping early.
            let mut part = Vec::new();
            shared.scan_from(Some("j2"), chunk, |k, _| {
                part.push(k.to_string());
                part.len() < 3
            });
            assert_eq!(part, ["j3", "j4", "j5"], "chunk {chunk}");
        }
    }
}
