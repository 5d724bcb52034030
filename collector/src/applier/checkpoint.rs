//! Checkpoints: the applier takes the set of jobs changed since the last checkpoint (cheap, under the write
//! lock) and the maintenance thread writes their snapshots in small chunks under short read locks, then the
//! marker (see the store's checkpoint invariant). One at a time; a failed one hands its jobs back.

use super::{Committer, ENCODE_UNDER_LOCK_MAX_EVENTS};
use crate::health::Health;
use crate::index::SharedIndex;
use crate::store::{Store, StoreError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

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

    /// Encodes the jobs' current records (at least as new as `through_seq`; newer is harmless because restore
    /// skips log entries a snapshot holds) in small chunks under short read locks, writes and flushes them, then
    /// the marker. On failure nothing moves the marker and the jobs go back to the dirty set.
    pub(super) fn write(self, store: &Store) {
        let started = Instant::now();
        let n = self.dirty.len();
        let ids: Vec<&String> = self.dirty.iter().collect();
        let mut result = Ok(());
        for chunk in ids.chunks(crate::store::SNAPSHOT_CHUNK) {
            let _writes = self.store_writes.lock().unwrap_or_else(|p| p.into_inner());
            // Small records are encoded under the read lock; a large one is copied under it and encoded after,
            // so a job with a long history holds the committer off for a copy, not for an encoding.
            let mut large: Vec<(&str, Vec<crate::job::CompactEvent>)> = Vec::new();
            let encoded: Result<Vec<_>, StoreError> = {
                let idx = self.index.read();
                chunk
                    .iter()
                    .filter_map(|id| {
                        let r = &idx.jobs.get(id.as_str())?.rec;
                        if r.events.len() > ENCODE_UNDER_LOCK_MAX_EVENTS {
                            large.push((id.as_str(), r.events.clone()));
                            return None;
                        }
                        Some(crate::store::encode_snapshot_events(id, &r.events))
                    })
                    .collect()
            };
            let encoded = encoded.and_then(|mut e| {
                for (id, events) in &large {
                    e.push(crate::store::encode_snapshot_events(id, events)?);
                }
                Ok(e)
            });
            result = encoded.and_then(|e| store.write_snapshots(e));
            if result.is_err() {
                break;
            }
        }
        let result = result.and_then(|()| store.finish_checkpoint(self.through_seq));
        self.took_ms.store(started.elapsed().as_millis() as u64, Ordering::Release);
        match result {
            Ok(()) => {
                tracing::debug!(
                    jobs = n,
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
