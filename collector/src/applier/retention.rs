//! Retention: deletes jobs that ended more than `store.retention` ago, hot or folded, from the index (with
//! their SLO contributions and metric footprints) and from the store (log entries, snapshot, summaries, and the archive of a job an older collector folded),
//! in chunks so the write lock stays short.

use super::Committer;
use crate::store::ExpiredJob;
use std::time::Duration;

/// Jobs deleted per index write lock and store transaction.
const CHUNK: usize = 1000;

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
        for chunk in expired.chunks(CHUNK) {
            // No checkpoint chunk or fold may be between encoding and writing these jobs while they go.
            let _writes = self.store_writes.lock().unwrap_or_else(|p| p.into_inner());
            let removed: Vec<ExpiredJob> = {
                let mut idx = self.index.write();
                chunk
                    .iter()
                    .filter_map(|id| {
                        let gone = idx.remove(id, now)?;
                        Some(ExpiredJob { job_id: id.clone(), seqs: gone.seqs, summaries: gone.summaries })
                    })
                    .collect()
            };
            if let Err(e) = self.store.delete_jobs(&removed) {
                // Gone from memory, not from disk: a restart brings them back (from the snapshot parts, which
                // no base may replace until then) and the next pass deletes them.
                self.store.hold_bases();
                tracing::error!(error = %e, "retention: cannot delete expired jobs from the store");
                self.health.storage_failed(e.cause());
                return;
            }
        }
        tracing::info!(jobs = expired.len(), "retention: expired jobs deleted");
    }
}
