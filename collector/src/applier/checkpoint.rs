//! Checkpoints: the applier takes the set of jobs changed since the last checkpoint (cheap, under the write
//! lock) and the maintenance thread writes what they gained since their last snapshot as an *increment* (or,
//! once the increments outgrow the last base, every hot job as a new *base*: see `store::snaps`), copying
//! events under short read locks in groups, then the marker (see the store's checkpoint invariant), then
//! records in each job's mark what the store now holds of it. One at a time; a failed one hands its jobs back.

use super::Committer;
use crate::health::Health;
use crate::index::SharedIndex;
use crate::job::CompactEvent;
use crate::store::snaps::PartWriter;
use crate::store::{Store, StoreError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Marks recorded per index write lock after a checkpoint.
const MARKS_PER_LOCK: usize = 1024;
/// A checkpoint writes a base once the increments since the last one hold more bytes than it and than this
/// (or there are [`BASE_AFTER_INCREMENTS`] of them).
const BASE_MIN_BYTES: u64 = 1 << 20;
/// See [`BASE_MIN_BYTES`] (a few in unit tests, so that their sequences of checkpoints and restarts cross bases).
const BASE_AFTER_INCREMENTS: u64 = if cfg!(test) { 3 } else { 256 };

/// `(job, incarnation, highest sequence written)` of each job a checkpoint wrote.
type Marks = Vec<(String, u64, u64)>;

impl Committer {
    /// Takes the set of jobs changed since the last checkpoint, with the log position the checkpoint will cover.
    /// Cheap: the snapshots are encoded later, by the checkpointer, under short read locks.
    pub(super) fn take_checkpoint(&self) -> Option<Checkpoint> {
        let mut idx = self.index.write();
        // With no job changed, only to replace a base most of whose jobs left memory.
        if idx.dirty.is_empty() && !self.store.base_stale(idx.jobs.len()) {
            return None;
        }
        Some(Checkpoint {
            dirty: std::mem::take(&mut idx.dirty),
            through_seq: idx.last_seq,
            index: self.index.clone(),
            health: self.health.clone(),
            busy: self.checkpoint_busy.clone(),
            took_ms: self.checkpoint_took_ms.clone(),
            store_writes: self.store_writes.clone(),
            allow_base: true,
            done: false,
        })
    }
}

/// The jobs to snapshot so that the store covers the log through `through_seq`.
pub(super) struct Checkpoint {
    dirty: std::collections::HashSet<String>,
    through_seq: u64,
    index: SharedIndex,
    health: Arc<Health>,
    /// Cleared when this checkpoint is done (written, or failed and handed back).
    busy: Arc<AtomicBool>,
    /// Set to how long the write took, milliseconds, when it is done (failed ones included).
    took_ms: Arc<AtomicU64>,
    /// Excludes retention's deletes while a group of jobs is copied and written, and while a base is begun and
    /// switched to.
    store_writes: Arc<Mutex<()>>,
    /// Whether it may write a base (not the last one at shutdown: an increment is quicker).
    pub(super) allow_base: bool,
    /// Set once written or handed back; a checkpoint dropped without either (the maintenance thread panicked
    /// in it) hands its jobs back when dropped, so the next checkpoint, the last one at shutdown included,
    /// cannot move the marker past events no snapshot holds.
    done: bool,
}

impl Drop for Checkpoint {
    fn drop(&mut self) {
        if !self.done {
            self.index.write().dirty.extend(std::mem::take(&mut self.dirty));
            self.busy.store(false, Ordering::Release);
        }
    }
}

impl Checkpoint {
    /// Returns the jobs to the dirty set without writing anything: the next checkpoint covers them.
    pub(super) fn give_back(mut self) {
        self.index.write().dirty.extend(std::mem::take(&mut self.dirty));
        self.busy.store(false, Ordering::Release);
        self.done = true;
    }

    /// Writes an increment (or a base), flushes, writes the marker; once that succeeded, records in each job's
    /// mark what the store holds of it (unless the job left memory meanwhile: one back under the same id is a
    /// new incarnation, whose mark stays). On failure nothing moves the marker or a mark, and the jobs go back
    /// to the dirty set (parts written anyway are harmless: restore takes the union, by sequence).
    pub(super) fn write(mut self, store: &Store) {
        let started = Instant::now();
        let n = self.dirty.len();
        let base = self.allow_base
            && (store.wants_base(BASE_MIN_BYTES, BASE_AFTER_INCREMENTS)
                || store.base_stale(self.index.read().jobs.len()));
        let result = if base { self.write_base(store) } else { self.write_increment(store) };
        self.took_ms.store(started.elapsed().as_millis() as u64, Ordering::Release);
        match result {
            Ok((marks, events)) => {
                // In groups, so the write lock stays short beside a checkpoint of many jobs.
                for group in marks.chunks(MARKS_PER_LOCK) {
                    let mut idx = self.index.write();
                    for (id, incarnation, through) in group {
                        if let Some(h) = idx.jobs.get_mut(id.as_str()) {
                            if h.snap.incarnation == *incarnation {
                                h.snap.through = h.snap.through.max(*through);
                            }
                        }
                    }
                }
                tracing::debug!(
                    dirty = n,
                    jobs = marks.len(),
                    events,
                    base,
                    through_seq = self.through_seq,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "checkpoint written"
                );
                self.busy.store(false, Ordering::Release);
                self.done = true;
            }
            Err(e) => {
                tracing::error!(error = %e, "checkpoint failed; its jobs wait for the next one");
                super::write_failed(store, &self.health, &e);
                self.give_back();
            }
        }
    }

    /// The dirty jobs' events past their marks, as an increment.
    fn write_increment(&self, store: &Store) -> Result<(Marks, usize), StoreError> {
        let ids: Vec<&String> = self.dirty.iter().collect();
        let mut w = PartWriter::default();
        let mut marks = Vec::with_capacity(ids.len());
        let mut events = 0;
        let mut max_seq = 0;
        for group in ids.chunks(crate::store::SNAPSHOT_CHUNK) {
            let _writes = self.store_writes.lock().unwrap_or_else(|p| p.into_inner());
            let copied = self.copy(group.iter().map(|id| id.as_str()), false);
            for (id, incarnation, evs) in copied {
                w.add(id, &evs).map_err(|r| part_error(id, r))?;
                events += evs.len();
                let last = evs.iter().map(|e| e.seq).max().unwrap_or(0);
                max_seq = max_seq.max(last);
                marks.push((id.to_string(), incarnation, last));
            }
            store.note_snapshot_seq(max_seq)?;
            store.write_increment(w.take_done())?;
        }
        store.write_increment(w.finish().map_err(|r| part_error("", r))?)?;
        store.finish_checkpoint(self.through_seq)?;
        Ok((marks, events))
    }

    /// Every hot job's events, as a base (the dirty jobs among them).
    fn write_base(&self, store: &Store) -> Result<(Marks, usize), StoreError> {
        let base = {
            // Retention's deletes before this point are not in the base (their tombstones go at the switch);
            // later ones keep theirs.
            let _writes = self.store_writes.lock().unwrap_or_else(|p| p.into_inner());
            store.begin_base()
        };
        let ids: Vec<String> = self.index.read().jobs.keys().cloned().collect();
        let mut w = PartWriter::default();
        let mut marks = Vec::with_capacity(ids.len());
        let (mut events, mut part, mut max_seq) = (0, 0u64, 0);
        for group in ids.chunks(crate::store::SNAPSHOT_CHUNK) {
            let copied = self.copy(group.iter().map(|id| id.as_str()), true);
            for (id, incarnation, evs) in copied {
                w.add(id, &evs).map_err(|r| part_error(id, r))?;
                events += evs.len();
                let last = evs.iter().map(|e| e.seq).max().unwrap_or(0);
                max_seq = max_seq.max(last);
                marks.push((id.to_string(), incarnation, last));
            }
            let done = w.take_done();
            let n = done.len() as u64;
            store.note_snapshot_seq(max_seq)?;
            store.write_base_parts(base, part, done)?;
            part += n;
        }
        store.write_base_parts(base, part, w.finish().map_err(|r| part_error("", r))?)?;
        let _writes = self.store_writes.lock().unwrap_or_else(|p| p.into_inner());
        store.switch_base(base, self.through_seq, marks.len() as u64)?;
        Ok((marks, events))
    }

    /// Copies, under one read lock, each hot job's events past its mark (`all`: every event), with its
    /// incarnation; jobs with none are left out. Compact events share their attributes: a copy is cheap, and a
    /// job with a long history holds the committer off for a copy, not an encoding.
    fn copy<'a>(&self, ids: impl Iterator<Item = &'a str>, all: bool) -> Vec<(&'a str, u64, Vec<CompactEvent>)> {
        let idx = self.index.read();
        ids.filter_map(|id| {
            let h = idx.jobs.get(id)?;
            let through = if all { 0 } else { h.snap.through };
            let evs: Vec<CompactEvent> = h.rec.events.iter().filter(|e| e.seq > through).cloned().collect();
            (!evs.is_empty()).then_some((id, h.snap.incarnation, evs))
        })
        .collect()
    }
}

fn part_error(job_id: &str, reason: String) -> StoreError {
    StoreError::Corrupt {
        what: "jobs",
        key: job_id.to_string(),
        reason: format!("cannot encode a snapshot part: {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_dropped_unwritten_hands_its_jobs_back() {
        let index = SharedIndex::new(crate::index::JobIndex::default());
        let busy = Arc::new(AtomicBool::new(true));
        let dirty: std::collections::HashSet<String> = ["a".to_string(), "b".to_string()].into();
        let ck = Checkpoint {
            dirty: dirty.clone(),
            through_seq: 7,
            index: index.clone(),
            health: Arc::default(),
            busy: busy.clone(),
            took_ms: Arc::default(),
            store_writes: Arc::default(),
            allow_base: true,
            done: false,
        };
        // What a panic in the middle of `write` leaves: the checkpoint dropped without being written.
        drop(ck);
        assert_eq!(index.read().dirty, dirty);
        assert!(!busy.load(Ordering::Acquire));
    }
}
