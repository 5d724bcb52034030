//! Folding: on the maintenance thread, jobs that ended and have not changed for `store.fold_after` are moved
//! out of memory. Per chunk of jobs, under the store-writes lock (so no snapshot or retention delete of the same
//! jobs interleaves): their rows are made under the index write lock (interning attributes), their raw events
//! read from the log (or a previous archive), their archives and summaries written and their log entries and
//! snapshots removed in one transaction, and only then are they dropped from memory, unless a late event
//! arrived meanwhile (such a job stays hot; its archive and summary are superseded by its next fold, and
//! restore treats it as unfolded).

use crate::health::Health;
use crate::index::SharedIndex;
use crate::store::{encode_archive, FoldWrite, Store, StoreError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Jobs folded per transaction.
pub const FOLD_CHUNK: usize = 256;

/// One pass over the fold candidates.
pub(super) struct FoldPass {
    pub index: SharedIndex,
    pub health: Arc<Health>,
    pub store_writes: Arc<Mutex<()>>,
    /// Cleared when the pass is done.
    pub busy: Arc<AtomicBool>,
    /// Fold jobs that have not changed since this time (collector milliseconds).
    pub unchanged_since: i64,
}

/// A job prepared for folding.
struct Prepared {
    job_id: String,
    seqs: Vec<u64>,
    summary: Vec<u8>,
}

impl FoldPass {
    /// Folds every candidate; returns how many jobs left memory.
    pub fn run(self, store: &Store) -> usize {
        let started = Instant::now();
        let mut candidates: Vec<String> = {
            let idx = self.index.read();
            idx.settling.iter().filter(|(_, at)| **at <= self.unchanged_since).map(|(k, _)| k.clone()).collect()
        };
        candidates.sort();
        let mut folded = 0;
        for chunk in candidates.chunks(FOLD_CHUNK) {
            match self.fold_chunk(store, chunk) {
                Ok(n) => folded += n,
                Err(e) => {
                    tracing::error!(error = %e, "fold failed; the jobs stay in memory and are tried again later");
                    self.health.storage_failed(e.cause());
                    break;
                }
            }
        }
        if folded > 0 {
            tracing::debug!(jobs = folded, elapsed_ms = started.elapsed().as_millis() as u64, "jobs folded");
        }
        self.busy.store(false, Ordering::Release);
        folded
    }

    fn fold_chunk(&self, store: &Store, chunk: &[String]) -> Result<usize, StoreError> {
        let _writes = self.store_writes.lock().unwrap_or_else(|p| p.into_inner());
        // Rows and sequences, under a short write lock (interning may add dictionary entries).
        let (prepared, dictionary, dict_len, max_seq) = {
            let mut idx = self.index.write();
            let idx = &mut *idx;
            let mut out = Vec::with_capacity(chunk.len());
            for id in chunk {
                let Some(h) = idx.jobs.get(id) else { continue };
                let Some(attrs) = h.rec.timeline.attrs.clone() else { continue };
                let n = idx.cold.dict.intern(&attrs);
                let Some(row) = crate::index::cold::Folded::of(&h.rec.timeline, n) else { continue };
                out.push(Prepared {
                    job_id: id.clone(),
                    seqs: h.rec.events.iter().map(|e| e.seq).collect(),
                    summary: row.encode(),
                });
            }
            (out, idx.cold.dict.unpersisted(), idx.cold.dict.len() as u32, idx.last_seq)
        };
        if prepared.is_empty() {
            return Ok(0);
        }
        // Raw events and archives, outside the index lock.
        let mut writes = Vec::with_capacity(prepared.len());
        for p in &prepared {
            let events = store.job_events(&p.job_id, &p.seqs)?;
            writes.push(FoldWrite {
                job_id: p.job_id.clone(),
                archive: encode_archive(&p.job_id, &events)?,
                log_seqs: p.seqs.clone(),
                summary: p.summary.clone(),
            });
        }
        store.fold_jobs(&writes, &dictionary, max_seq)?;
        // Durable: drop from memory the jobs that did not change meanwhile.
        let mut idx = self.index.write();
        idx.cold.dict.mark_persisted(dict_len);
        let mut n = 0;
        for p in prepared {
            let unchanged = idx.jobs.get(&p.job_id).is_some_and(|h| h.rec.events.len() == p.seqs.len());
            if unchanged && idx.fold(&p.job_id).is_some() {
                n += 1;
            }
        }
        Ok(n)
    }
}
