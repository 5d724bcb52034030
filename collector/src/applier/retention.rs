//! Retention: deletes jobs from the index (with their SLO contributions and metric footprints) and from the store
//! (log entries, snapshot parts, summaries, and the archive of a job an older collector folded), in chunks so the
//! write lock stays short, for two reasons:
//! - age: jobs, hot or folded, that ended more than `store.retention` ago ([`Committer::expire`]);
//! - memory: while folded rows and the dictionary entries they name are over their budget
//!   (`store.folded_budget_mib`), the folded jobs that ended longest ago, until they are at 95% of it (entries
//!   no row names any more are freed with the last row, and deleted from the store after the jobs;
//!   [`Committer::trim_folded`]). Like Prometheus's size-based retention beside its time-based one: whichever
//!   comes first. Each such deletion is counted, and the latest end time it reached is stored with it (the
//!   index's history is complete only after it) and logged as a warning that says whether it reaches into an
//!   SLO's window.

use super::Committer;
use crate::index::cold::ColdJobs;
use crate::index::JobIndex;
use crate::store::ExpiredJob;
use std::ops::Bound;
use std::time::Duration;

/// Jobs deleted per index write lock and store transaction.
const CHUNK: usize = 1000;

/// Folded rows read per index read lock while choosing which to delete for the budget.
const SCAN_CHUNK: usize = 65_536;

/// Time buckets the budget's choice sorts rows into before it orders the rows of one bucket exactly.
const BUCKETS: usize = 4096;

/// Why a job is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    Expired,
    OverBudget,
}

impl Committer {
    /// Deletes every job that ended before `now - retention`.
    pub(super) fn expire(&self, retention: Duration) {
        let now = self.settings.clock.now_ms();
        let cutoff = now - retention.as_millis() as i64;
        let expired: Vec<String> = {
            let idx = self.index.read();
            let hot = idx.jobs.iter().filter(|(_, h)| h.rec.timeline.done_at.is_some_and(|d| d < cutoff));
            let cold = idx.cold.rows.iter().filter(|(_, r)| r.done_at() < cutoff);
            hot.map(|(k, _)| k.clone()).chain(cold.map(|(k, _)| k.to_string())).collect()
        };
        if expired.is_empty() {
            return;
        }
        let n = self.delete(&expired, now, Why::Expired);
        tracing::info!(jobs = n, "retention: expired jobs deleted");
    }

    /// Deletes the folded jobs that ended longest ago while folded rows are over their budget, down to 95% of it.
    /// Returns how many were deleted.
    pub(super) fn trim_folded(&self) -> usize {
        let (bytes, fixed, budget) = {
            let idx = self.index.read();
            (idx.cold.bytes() + idx.cold.dict.bytes(), idx.cold.fixed_bytes(), idx.folded_budget)
        };
        if bytes <= budget {
            return 0;
        }
        let target = budget - budget / 20;
        if fixed >= target {
            // Node names and the dictionary's slots alone fill the budget: deleting rows cannot bring it down.
            if !self.fixed_over_budget.swap(true, std::sync::atomic::Ordering::AcqRel) {
                tracing::error!(
                    fixed_mib = fixed >> 20,
                    budget_mib = budget >> 20,
                    "node names and dictionary slots alone fill store.folded_budget_mib: nothing is deleted \
                     for it; raise the budget"
                );
            }
            return 0;
        }
        let victims = self.oldest_folded(bytes - target);
        if victims.is_empty() {
            return 0;
        }
        let now = self.settings.clock.now_ms();
        let n = self.delete(&victims, now, Why::OverBudget);
        let idx = self.index.read();
        let through = idx.deleted.over_budget_through_ms;
        let longest_slo = idx.slo.defs().iter().map(|d| d.window_ms).max().unwrap_or(0);
        let now_bytes = idx.cold.bytes() + idx.cold.dict.bytes();
        let inside_slo_window = through > now - longest_slo;
        tracing::warn!(
            jobs = n,
            folded_mib = bytes >> 20,
            budget_mib = budget >> 20,
            now_mib = now_bytes >> 20,
            ended_through = %crate::time::format_ms(through),
            inside_slo_window,
            "folded jobs over store.folded_budget_mib: deleted the oldest (inside an SLO's window, its counts now \
             leave them out; raise the budget to keep the whole window)"
        );
        n
    }

    /// The folded jobs that ended longest ago whose rows (with the dictionary entries only they name) add up to
    /// at least `free` bytes (fewer if all of them do not; entries that several victims alone share are not
    /// counted, so a pass may free a little less than asked, and the next one the rest), read in chunks of rows
    /// per read lock: a first pass sums row bytes into [`BUCKETS`] buckets of end
    /// time, a second takes every row of the buckets wholly needed and, of the last bucket, its rows in end
    /// order until enough.
    fn oldest_folded(&self, free: usize) -> Vec<String> {
        let (mut lo, mut hi) = (i64::MAX, i64::MIN);
        self.each_row_chunked(|_, _, row| {
            lo = lo.min(row.done_at());
            hi = hi.max(row.done_at());
        });
        if lo > hi {
            return Vec::new();
        }
        let width = ((hi as i128 - lo as i128) / BUCKETS as i128 + 1).max(1);
        // (A row folded between the passes may end before `lo`: the first bucket.)
        let bucket = |at: i64| (((at as i128 - lo as i128).max(0) / width) as usize).min(BUCKETS - 1);
        let mut sums = vec![0usize; BUCKETS];
        self.each_row_chunked(|cold, id, row| sums[bucket(row.done_at())] += cold.freeing_bytes(id, row));
        let (mut whole, mut sum) = (0, 0);
        while whole < BUCKETS && sum + sums[whole] < free {
            sum += sums[whole];
            whole += 1;
        }
        let mut out = Vec::new();
        let mut last: Vec<(i64, String, usize)> = Vec::new();
        self.each_row_chunked(|cold, id, row| {
            let b = bucket(row.done_at());
            if b < whole {
                out.push(id.to_string());
            } else if b == whole {
                last.push((row.done_at(), id.to_string(), cold.freeing_bytes(id, row)));
            }
        });
        last.sort_unstable();
        for (_, id, bytes) in last {
            if sum >= free {
                break;
            }
            sum += bytes;
            out.push(id);
        }
        out
    }

    /// Every folded row, [`SCAN_CHUNK`] per read lock (rows folded or deleted meanwhile may or may not be seen).
    fn each_row_chunked(&self, mut f: impl FnMut(&ColdJobs, &str, &crate::index::cold::Row)) {
        let mut after: Option<Box<str>> = None;
        loop {
            let idx = self.index.read();
            let lower = after.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
            let mut n = 0;
            let mut next = None;
            for (k, row) in idx.cold.rows.range::<str, _>((lower, Bound::Unbounded)).take(SCAN_CHUNK) {
                f(&idx.cold, k, row);
                n += 1;
                next = Some(k);
            }
            if n < SCAN_CHUNK {
                return;
            }
            after = next.cloned();
        }
    }

    /// Deletes jobs from the index and the store, [`CHUNK`] at a time; for the budget, only jobs still folded (a
    /// late event may have brought one back). Stops at a store failure (the jobs of that chunk are gone from
    /// memory, not from disk: a restart brings them back, and a later pass deletes them). Returns how many were
    /// deleted.
    fn delete(&self, ids: &[String], now: i64, why: Why) -> usize {
        let mut n = 0;
        for chunk in ids.chunks(CHUNK) {
            // No checkpoint chunk or fold may be between encoding and writing these jobs while they go.
            let _writes = self.store_writes.lock().unwrap_or_else(|p| p.into_inner());
            let (removed, through): (Vec<ExpiredJob>, Option<i64>) = {
                let mut idx = self.index.write();
                let removed: Vec<ExpiredJob> = chunk
                    .iter()
                    .filter_map(|id| {
                        let ended = match why {
                            Why::Expired => 0,
                            Why::OverBudget => idx.folded(id)?.done_at(),
                        };
                        let gone = idx.remove(id, now)?;
                        count(&mut idx, why, ended);
                        Some(ExpiredJob { job_id: id.clone(), seqs: gone.seqs, summaries: gone.summaries })
                    })
                    .collect();
                let through = (why == Why::OverBudget).then_some(idx.deleted.over_budget_through_ms);
                (removed, through)
            };
            if let Err(e) = self.store.delete_jobs_noting(&removed, through) {
                // Gone from memory, not from disk: a restart brings them back (from the snapshot parts, which
                // no base may replace until then) and the next pass deletes them. Their summaries still name the
                // dictionary entries their rows freed: those stay in the store (a restart's sweep decides).
                self.index.write().cold.dict.take_freed();
                self.store.hold_bases();
                tracing::error!(error = %e, "retention: cannot delete jobs from the store");
                self.write_failed(&e);
                return n;
            }
            n += removed.len();
            // Durable: the dictionary entries no row names any more go too (a failure keeps them for later).
            let freed = self.index.write().cold.dict.take_freed();
            if let Err(e) = self.store.delete_dictionary(&freed) {
                tracing::warn!(error = %e, "retention: cannot delete freed dictionary entries; tried again later");
                self.index.write().cold.dict.return_freed(freed);
            }
        }
        n
    }
}

fn count(idx: &mut JobIndex, why: Why, ended: i64) {
    match why {
        Why::Expired => idx.deleted.expired += 1,
        Why::OverBudget => {
            idx.deleted.over_budget += 1;
            idx.deleted.over_budget_through_ms = idx.deleted.over_budget_through_ms.max(ended);
        }
    }
}
