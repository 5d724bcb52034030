//! The in-memory job index shared by the committer (the only writer) and readers (API, exporters).

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
}

impl Default for JobIndex {
    fn default() -> Self {
        JobIndex { jobs: BTreeMap::new(), dirty: HashSet::new(), last_seq: 0, slo: SloEngine::new(Vec::new()) }
    }
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

    /// Write access, for the committer.
    pub fn write(&self) -> RwLockWriteGuard<'_, JobIndex> {
        self.0.write().unwrap_or_else(|p| p.into_inner())
    }
}
