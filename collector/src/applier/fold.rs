//! Folding: on the maintenance thread, jobs that ended and have not changed for `store.fold_after` (or, while
//! hot jobs are over their memory budget `store.hot_budget_mib`, every ended job) are moved out of memory. Per
//! chunk of jobs, under the store-writes lock (so no snapshot or retention delete of the same jobs interleaves):
//! their rows are made under the index write lock (interning attributes), their summaries (each listing the
//! job's log sequences: the events stay in the log, nothing is read or copied) written and flushed, their
//! snapshots removed, and only then are they dropped from memory, unless a late event arrived meanwhile (such a
//! job stays hot; its summary is stale: superseded by its next fold, deleted by retention, and restore treats it
//! as unfolded). A job's new summary replaces its stale ones in the same store batch.

use crate::health::Health;
use crate::index::SharedIndex;
use crate::store::{FoldWrite, Store, StoreError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Jobs folded per store write.
pub const FOLD_CHUNK: usize = 512;

/// Longest a pass runs before it yields the maintenance thread (to a checkpoint) and asks for another pass; a
/// pass folds at least one chunk whatever the time (zero in unit tests: one chunk per pass).
#[cfg(not(test))]
const PASS_BUDGET: Duration = Duration::from_secs(2);
#[cfg(test)]
const PASS_BUDGET: Duration = Duration::ZERO;

/// One pass over the fold candidates.
pub(super) struct FoldPass {
    pub index: SharedIndex,
    pub health: Arc<Health>,
    pub store_writes: Arc<Mutex<()>>,
    /// Cleared when the pass is done.
    pub busy: Arc<AtomicBool>,
    /// Fold jobs that have not changed since this time (collector milliseconds)...
    pub unchanged_since: i64,
    /// ...or, while hot jobs are over their budget ([`crate::index::JobIndex::hot_budget`]), every ended job
    /// unchanged since this time (the pass's start).
    pub now: i64,
    /// Whether the last pass found hot jobs over their budget (a change is logged).
    pub over_budget: Arc<AtomicBool>,
    /// Set when the pass stopped with candidates left (the committer then starts the next pass at once, and
    /// checkpoints less often); cleared when a pass ends with none left. Not cleared while a pass runs: the
    /// committer reads it then, to decide whether a checkpoint is due.
    pub more: Arc<AtomicBool>,
    /// Set at shutdown: the pass stops after its current chunk (the jobs stay hot; nothing is lost).
    pub stop: Arc<AtomicBool>,
}

impl FoldPass {
    /// Folds every candidate; returns how many jobs left memory.
    pub fn run(self, store: &Store) -> usize {
        let started = Instant::now();
        let mut more = false;
        // At most what one pass can fold (the rest waits for the next pass), the longest settled first. Only the
        // settling set is read (one pass over it, no lookups, under the read lock): with a backlog of a million
        // ended jobs, looking each up to order them by their first log sequence took longer than the pass's
        // budget (and held the applier's write lock off as long).
        let candidates: Vec<String> = {
            let idx = self.index.read();
            let since = self.cutoff(idx.hot_bytes(), idx.hot_budget, idx.jobs.len(), idx.settling.len());
            let mut due: Vec<(i64, &String)> =
                idx.settling.iter().filter(|(_, at)| **at <= since).map(|(k, at)| (*at, k)).collect();
            let n = due.len().min(FOLD_CHUNK * 32);
            if n < due.len() {
                due.select_nth_unstable(n);
                due.truncate(n);
            }
            due.sort_unstable();
            due.into_iter().map(|(_, k)| k.clone()).collect()
        };
        let mut folded = 0;
        let mut chunks = candidates.chunks(FOLD_CHUNK);
        for (i, chunk) in chunks.by_ref().enumerate() {
            // The first chunk whatever the time: a pass that spent its budget choosing candidates must still make
            // progress (in BENCHMARKS.md's 10M-job run 14 none did, and hot jobs piled up to 1.4M).
            let out_of_time = i > 0 && started.elapsed() >= PASS_BUDGET;
            if out_of_time || self.stop.load(Ordering::Acquire) {
                more = !self.stop.load(Ordering::Acquire);
                break;
            }
            match self.fold_chunk(store, chunk) {
                Ok(n) => folded += n,
                Err(e) => {
                    tracing::error!(error = %e, "fold failed; the jobs stay in memory and are tried again later");
                    super::write_failed(store, &self.health, &e);
                    break;
                }
            }
        }
        if candidates.len() == FOLD_CHUNK * 32 && chunks.next().is_none() && !self.stop.load(Ordering::Acquire) {
            // Took as many as one pass may: there may be more.
            more = true;
        }
        self.more.store(more, Ordering::Release);
        if folded > 0 {
            tracing::debug!(jobs = folded, elapsed_ms = started.elapsed().as_millis() as u64, "jobs folded");
        }
        self.busy.store(false, Ordering::Release);
        folded
    }

    /// The time before which ended jobs fold: settled for `fold_after`, or, over the hot budget, any. Logs when
    /// hot jobs go over or back under their budget.
    fn cutoff(&self, hot_bytes: usize, budget: usize, hot_jobs: usize, ended: usize) -> i64 {
        let over = hot_bytes > budget;
        if self.over_budget.swap(over, Ordering::AcqRel) != over {
            let mib = |b: usize| b >> 20;
            if over {
                tracing::warn!(
                    hot_mib = mib(hot_bytes),
                    budget_mib = mib(budget),
                    hot_jobs,
                    open_jobs = hot_jobs.saturating_sub(ended),
                    "hot jobs are over store.hot_budget_mib: ended jobs fold at once, without waiting for \
                     store.fold_after (open jobs cannot fold; if they alone are over it, raise the budget)"
                );
            } else {
                tracing::info!(
                    hot_mib = mib(hot_bytes),
                    budget_mib = mib(budget),
                    "hot jobs are within store.hot_budget_mib again"
                );
            }
        }
        if over {
            self.now.max(self.unchanged_since)
        } else {
            self.unchanged_since
        }
    }

    /// After a failed fold: the jobs stay hot, and the summaries the fold wrote (or may have written) become their
    /// stale ones, in place of the older ones when the write is known to have `replaced` them.
    fn keep_stale(&self, writes: &[FoldWrite], replaced: bool) {
        let mut idx = self.index.write();
        for w in writes {
            if !idx.jobs.contains_key(&w.job_id) {
                continue;
            }
            let stale = idx.stale_summaries.entry(w.job_id.clone()).or_default();
            if replaced {
                stale.clear();
            }
            stale.push(w.number);
        }
    }

    fn fold_chunk(&self, store: &Store, chunk: &[String]) -> Result<usize, StoreError> {
        let _writes = self.store_writes.lock().unwrap_or_else(|p| p.into_inner());
        // Rows and sequences, under a short write lock (interning may add dictionary entries). Each summary's
        // entry is pinned until its row is made (or the fold gives up on the job): an unfold on the committer
        // meanwhile must not free an entry a summary being written names.
        let (mut writes, pins, dictionary, dict_len, max_seq) = {
            let mut idx = self.index.write();
            let idx = &mut *idx;
            let mut out = Vec::with_capacity(chunk.len());
            let mut pins = Vec::with_capacity(chunk.len());
            for id in chunk {
                let Some(h) = idx.jobs.get(id) else { continue };
                let Some(attrs) = h.rec.timeline.attrs.clone() else { continue };
                let n = idx.cold.dict.intern(&attrs);
                let Some(row) = crate::index::cold::Folded::of(&h.rec.timeline, n) else { continue };
                idx.cold.dict.pin(n);
                pins.push(n);
                out.push(FoldWrite {
                    job_id: id.clone(),
                    log_seqs: h.rec.events.iter().map(|e| e.seq).collect(),
                    summary: row.encode(),
                    replaces: idx.stale_summaries.get(id).cloned().unwrap_or_default(),
                    number: 0,
                });
            }
            (out, pins, idx.cold.dict.unpersisted(), idx.cold.dict.len() as u32, idx.last_seq)
        };
        if writes.is_empty() {
            return Ok(0);
        }
        let unpin = |pins: &[u32]| {
            let mut idx = self.index.write();
            for &n in pins {
                idx.cold.dict.unpin(n);
            }
        };
        let t0 = Instant::now();
        // With new entries, the next dictionary number first (no flush: sled keeps writes in order, so it is durable
        // no later than the summaries after it): numbers are never handed out twice, even across restarts. Without
        // new entries every number these summaries name is pinned, so stored by an earlier fold that noted it.
        let noted = if dictionary.is_empty() { Ok(()) } else { store.note_dictionary_next(dict_len) };
        let written = noted.and_then(|()| store.fold_write(&mut writes, &dictionary));
        if let Err(e) = written {
            // sled may have kept the write: its summaries are the jobs' stale ones too, beside the older ones it
            // may not have deleted (deleting a summary that is not stored is no error).
            self.keep_stale(&writes, false);
            unpin(&pins);
            return Err(e);
        }
        let t_write = t0.elapsed();
        if let Err(e) = store.fold_delete(max_seq) {
            // The summaries are stored (and replaced the older ones): the jobs stay hot with them as stale.
            self.keep_stale(&writes, true);
            unpin(&pins);
            return Err(e);
        }
        tracing::debug!(
            jobs = writes.len(),
            events = writes.iter().map(|w| w.log_seqs.len()).sum::<usize>(),
            write_ms = t_write.as_millis() as u64,
            delete_ms = (t0.elapsed() - t_write).as_millis() as u64,
            "fold chunk"
        );
        // Durable: drop from memory the jobs that did not change meanwhile.
        let mut idx = self.index.write();
        idx.cold.dict.mark_persisted(dict_len);
        let mut n = 0;
        for (w, pin) in writes.into_iter().zip(pins) {
            let unchanged = idx.jobs.get(&w.job_id).is_some_and(|h| h.rec.events.len() == w.log_seqs.len());
            if unchanged && idx.fold_as(&w.job_id, w.number, pin).is_some() {
                n += 1;
                continue;
            }
            idx.cold.dict.unpin(pin);
            if idx.jobs.contains_key(&w.job_id) {
                // Changed meanwhile: it stays hot, and the summary just written is its stale one.
                idx.stale_summaries.insert(w.job_id, vec![w.number]);
            }
        }
        Ok(n)
    }
}
