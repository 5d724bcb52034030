//! Checkpoints: the applier takes the set of jobs changed since the last checkpoint (cheap, under the write
//! lock) and the maintenance thread writes each job's new events as a snapshot chunk (groups of jobs under
//! short read locks), then the marker (see the store's checkpoint invariant), then records what each job's
//! chunks hold. One at a time; a failed one hands its jobs back.

use super::Committer;
use crate::health::Health;
use crate::index::{SharedIndex, SnapMark};
use crate::store::{ChunkPlan, Store, StoreError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Marks recorded per index write lock after a checkpoint.
const MARKS_PER_LOCK: usize = 1024;

impl Committer {
    /// Takes the set of jobs changed since the last checkpoint, with the log position the checkpoint will cover.
    /// Cheap: the snapshots are encoded later, by the checkpointer, under short read locks.
    pub(super) fn take_checkpoint(&self) -> Option<Checkpoint> {
        let mut idx = self.index.write();
        if idx.dirty.is_empty() {
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
    /// Excludes retention's deletes while a chunk is encoded and written.
    store_writes: Arc<Mutex<()>>,
}

impl Checkpoint {
    /// Returns the jobs to the dirty set without writing anything: the next checkpoint covers them.
    pub(super) fn give_back(self) {
        self.index.write().dirty.extend(self.dirty);
        self.busy.store(false, Ordering::Release);
    }

    /// Writes each job's next snapshot chunk (its events since its chunks, or all of them: see
    /// [`ChunkPlan`]) in small groups, the events copied under short read locks and encoded outside them, then
    /// flushes and writes the marker; once that succeeded, records in each job's [`SnapMark`] what its chunks
    /// now hold. On failure nothing moves the marker or a mark, and the jobs go back to the dirty set (a chunk
    /// that was written anyway is replaced by the next one, which starts at the same sequence and holds more).
    ///
    /// [`SnapMark`]: crate::index::SnapMark
    pub(super) fn write(self, store: &Store) {
        let started = Instant::now();
        let n = self.dirty.len();
        let ids: Vec<&String> = self.dirty.iter().collect();
        let mut result = Ok(());
        // `(job, incarnation, through, chunks)` to record once the checkpoint is durable.
        let mut marks: Vec<(&str, u64, u64, u32)> = Vec::with_capacity(n);
        let mut written = 0usize;
        for chunk in ids.chunks(crate::store::SNAPSHOT_CHUNK) {
            let _writes = self.store_writes.lock().unwrap_or_else(|p| p.into_inner());
            // Each job's new events are copied under the read lock (reference-counted attributes: cheap), and
            // encoded after it: a job with a long history holds the committer off for a copy, not an encoding.
            let plans: Vec<(&str, SnapMark, ChunkPlan)> = {
                let idx = self.index.read();
                chunk
                    .iter()
                    .filter_map(|id| {
                        let h = idx.jobs.get(id.as_str())?;
                        let plan = ChunkPlan::of(&h.rec.events, h.snap.through, h.snap.chunks)?;
                        Some((id.as_str(), h.snap, plan))
                    })
                    .collect()
            };
            let encoded: Result<Vec<_>, StoreError> = plans.iter().map(|(id, _, p)| p.encode(id)).collect();
            result = encoded.and_then(|e| store.write_chunks(e));
            if result.is_err() {
                break;
            }
            for (id, mark, plan) in &plans {
                let (through, chunks) = plan.after(mark.through, mark.chunks);
                written += plan.events.len();
                marks.push((id, mark.incarnation, through, chunks));
            }
        }
        let result = result.and_then(|()| store.finish_checkpoint(self.through_seq));
        self.took_ms.store(started.elapsed().as_millis() as u64, Ordering::Release);
        match result {
            Ok(()) => {
                // Durable: the jobs' chunks hold what the marks say, unless the job left memory meanwhile (its
                // chunks went with it; one back under the same id is a new incarnation, whose mark stays).
                // In groups, so the write lock stays short beside a checkpoint of many jobs.
                for group in marks.chunks(MARKS_PER_LOCK) {
                    let mut idx = self.index.write();
                    for &(id, incarnation, through, chunks) in group {
                        if let Some(h) = idx.jobs.get_mut(id) {
                            if h.snap.incarnation == incarnation {
                                h.snap.through = through;
                                h.snap.chunks = chunks;
                            }
                        }
                    }
                }
                tracing::debug!(
                    jobs = n,
                    events = written,
                    through_seq = self.through_seq,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "checkpoint written"
                );
                self.busy.store(false, Ordering::Release);
            }
            Err(e) => {
                tracing::error!(error = %e, "checkpoint failed; its jobs wait for the next one");
                self.health.storage_failed(e.cause());
                self.give_back();
            }
        }
    }
}
