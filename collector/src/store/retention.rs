//! Retention: jobs deleted from every place the store holds them (log, parts by tombstone, summaries), with the
//! history's deleted-through time.

use super::*;

impl Store {
    /// The latest end time (Unix ms) of a job deleted for the memory budget, as last recorded (0 if none).
    pub fn history_deleted_through(&self) -> Result<i64, StoreError> {
        let t = self.t()?;
        Ok(sealed_array(&t.jobs, "jobs", DELETED_THROUGH_KEY)?.map_or(0, i64::from_be_bytes))
    }

    /// Deletes jobs with their logged events and summaries, and tombstones their snapshots, atomically, and
    /// flushes.
    pub fn delete_jobs(&self, jobs: &[ExpiredJob]) -> Result<(), StoreError> {
        self.delete_jobs_noting(jobs, None)
    }

    /// [`Store::delete_jobs`], recording in the same transaction `deleted_through`: the latest end time (Unix
    /// ms) of jobs deleted for the memory budget (see [`Store::history_deleted_through`]).
    pub fn delete_jobs_noting(&self, jobs: &[ExpiredJob], deleted_through: Option<i64>) -> Result<(), StoreError> {
        use sled::transaction::Transactional;
        let t = self.w()?;
        let mut job_batch = sled::Batch::default();
        if let Some(ms) = deleted_through {
            job_batch.insert(DELETED_THROUGH_KEY, seal(&ms.to_be_bytes()));
        }
        let last_logged = t.files.last_seq();
        let mut summaries = sled::Batch::default();
        let mut seqs = Vec::new();
        for job in jobs {
            seqs.extend_from_slice(&job.seqs);
            // Its events in snapshot parts written before now are not restored (see [`snaps`]).
            job_batch
                .insert(snaps::tomb_key(&job.job_id), seal(&snaps::tomb_body(self.snapshot_counter(), last_logged)));
        }
        let wanted: Vec<(&str, u64)> =
            jobs.iter().flat_map(|j| j.summaries.iter().map(|no| (j.job_id.as_str(), *no))).collect();
        let rewrites = t.log_rewrites();
        let packs_lock = t.packs_lock();
        // A folded job's events are the log entries its summary lists. (A summary damaged on disk lists none here;
        // restore will have rebuilt that job as a hot one, whose sequences the caller passes.)
        for (no, job_id, summary) in t.plan_summary_removal(&mut summaries, &wanted)? {
            match parse_summary(&summary) {
                Ok((listed, _)) => seqs.extend_from_slice(&listed),
                Err(reason) => tracing::warn!(job_id, no, reason = %reason, "retention: summary unusable"),
            }
        }
        let mut dead = t.dead();
        let mut kill = log::plan_kill(&t.files, &dead, &seqs)?;
        let log = std::mem::take(&mut kill.batch);
        tracing::debug!(
            jobs = jobs.len(),
            events = seqs.len(),
            blocks_all_dead = kill.stats.all_dead,
            blocks_marked = kill.stats.marked,
            "log entries of deleted jobs"
        );
        // One transaction over the trees: a crash keeps all of a job or none of it (deleting the log entries
        // first would let a restart restore the snapshot without its raw events; the snapshot first, rebuild the
        // job from just its log tail).
        let applied = (&t.blocks, &t.jobs, &t.summaries).transaction(|(l, j, s)| {
            l.apply_batch(&log)?;
            j.apply_batch(&job_batch)?;
            s.apply_batch(&summaries)?;
            Ok(())
        });
        transaction_result(applied)?;
        let touched = kill.touched();
        kill.commit(&mut dead);
        drop(dead);
        drop(packs_lock);
        t.db.flush()?;
        // Segments now all or mostly dead go or shrink in the next [`Store::maintain_log`], on the maintenance
        // thread: a rewrite of a segment takes long enough to hold group commits up.
        let names = t.files.segments_of(&touched);
        t.collect_pending.lock().unwrap_or_else(|p| p.into_inner()).extend(names);
        drop(rewrites);
        Ok(())
    }
}
