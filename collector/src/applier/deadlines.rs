//! SLO deadlines, applied by the committer: the alert loop keeps the timer of the next deadline and, when one
//! passes, asks ([`crate::index::deadlines::DeadlineRequests`]); the committer re-assesses the jobs whose
//! deadline passed under the index write lock (each becomes bad while it still waits), writes one stream change
//! record per job whose SLO decision changed (published once flushed, like every record), and
//! wakes the alert loop, which takes the page changes under a read lock. The committer also prunes the SLO
//! windows once a minute. So the index has one writer, and a decision made by time passing reaches the stream.

use super::Committer;
use crate::stream::{change, JobView, Subject};
use std::time::Duration;

/// How often the SLO windows drop buckets older than they keep.
pub(super) const PRUNE_EVERY: Duration = Duration::from_secs(60);

impl Committer {
    /// Applies every deadline at or before `to_ms` (the time the alert loop saw them pass).
    pub(super) fn advance_deadlines(&self, to_ms: i64) {
        let now = self.settings.clock.now_ms();
        let mut records = Vec::new();
        // Cursors for waiting alert changes first, then the change records built below (none while the stream
        // is broken: the jobs are named for a repair, and nothing more is written to the stream in this process).
        let staged = self.stream.as_ref().and_then(|sw| sw.stage(0));
        {
            let mut idx = self.index.write();
            let due = idx.advance_deadlines(to_ms);
            if let (Some(sw), None) = (&self.stream, &staged) {
                sw.resync_later(due.into_iter().map(|(job_id, _)| job_id));
            } else if let Some(sw) = &self.stream {
                let named = |i| super::stream::slo_name(&idx.slo, i);
                for (job_id, before) in due {
                    let Some(h) = idx.jobs.get(&job_id) else { continue };
                    let t = &h.rec.timeline;
                    // The change follows the job's newest event (time, not an event, made it).
                    let last_seq = h.rec.events.iter().map(|e| e.seq).max().unwrap_or(0);
                    if let Some(c) = change(Some(&JobView::of(t, &before)), &JobView::of(t, &h.slo), last_seq, named) {
                        records.push(sw.change(now, &Subject::job(&job_id, t.attrs.as_deref()), c));
                    }
                }
            }
        }
        if let (Some(sw), Some(staged)) = (&self.stream, staged) {
            sw.write_group(now, staged, std::iter::empty(), records);
        }
        self.settings.wake.notify_one();
    }

    /// Drops SLO window buckets older than each SLO keeps, and waits older than the expected-start history.
    pub(super) fn prune_slo_windows(&self) {
        let now = self.settings.clock.now_ms();
        let mut idx = self.index.write();
        idx.slo.prune(now);
        idx.waits.prune(now);
    }
}
