//! Folding: on the maintenance thread, jobs that ended and have not changed for `store.fold_after` are moved
//! out of memory. Per chunk of jobs, under the store-writes lock (so no snapshot or retention delete of the same
//! jobs interleaves): their rows are made under the index write lock (interning attributes), their raw events
//! read from the log (or a previous archive), their archives and summaries written and their log entries and
//! snapshots removed in one transaction, and only then are they dropped from memory, unless a late event
//! arrived meanwhile (such a job stays hot; its archive and summary are superseded by its next fold, and
//! restore treats it as unfolded).

use crate::health::Health;
use crate::index::SharedIndex;
use crate::store::{ArchiveEncoder, FoldWrite, Store, StoreError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Jobs folded per store write.
pub const FOLD_CHUNK: usize = 512;

/// Longest a pass runs before it yields the maintenance thread (to a checkpoint) and asks for another pass.
const PASS_BUDGET: Duration = Duration::from_secs(2);

/// One pass over the fold candidates.
pub(super) struct FoldPass {
    pub index: SharedIndex,
    pub health: Arc<Health>,
    pub store_writes: Arc<Mutex<()>>,
    /// Cleared when the pass is done.
    pub busy: Arc<AtomicBool>,
    /// Fold jobs that have not changed since this time (collector milliseconds).
    pub unchanged_since: i64,
    /// Set when the pass stopped with candidates left: the committer starts the next pass at once.
    pub more: Arc<AtomicBool>,
    /// Set at shutdown: the pass stops after its current chunk (the jobs stay hot; nothing is lost).
    pub stop: Arc<AtomicBool>,
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
        self.more.store(false, Ordering::Release);
        // At most what one pass can fold (the rest waits for the next pass), in no particular order.
        let candidates: Vec<String> = {
            let idx = self.index.read();
            idx.settling
                .iter()
                .filter(|(_, at)| **at <= self.unchanged_since)
                .map(|(k, _)| k.clone())
                .take(FOLD_CHUNK * 32)
                .collect()
        };
        let mut folded = 0;
        let mut encoder = match ArchiveEncoder::new() {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, "fold: cannot create a compressor");
                self.busy.store(false, Ordering::Release);
                return 0;
            }
        };
        let mut chunks = candidates.chunks(FOLD_CHUNK);
        for chunk in chunks.by_ref() {
            if started.elapsed() >= PASS_BUDGET || self.stop.load(Ordering::Acquire) {
                self.more.store(!self.stop.load(Ordering::Acquire), Ordering::Release);
                break;
            }
            match self.fold_chunk(store, chunk, &mut encoder) {
                Ok(n) => folded += n,
                Err(e) => {
                    tracing::error!(error = %e, "fold failed; the jobs stay in memory and are tried again later");
                    self.health.storage_failed(e.cause());
                    break;
                }
            }
        }
        if candidates.len() == FOLD_CHUNK * 32 && chunks.next().is_none() && !self.stop.load(Ordering::Acquire) {
            // Took as many as one pass may: there may be more.
            self.more.store(true, Ordering::Release);
        }
        if folded > 0 {
            tracing::debug!(jobs = folded, elapsed_ms = started.elapsed().as_millis() as u64, "jobs folded");
        }
        self.busy.store(false, Ordering::Release);
        folded
    }

    fn fold_chunk(&self, store: &Store, chunk: &[String], encoder: &mut ArchiveEncoder) -> Result<usize, StoreError> {
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
                archive: encoder.encode(&p.job_id, &events)?,
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
