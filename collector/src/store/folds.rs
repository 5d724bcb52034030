//! Folds: the summaries of folded jobs written with the dictionary entries they first use, removed, and the
//! folded jobs' events read back through them.

use super::*;

impl Store {
    /// Every event of a folded job its summary (number `summary`) lists, in sequence order, from the log; empty
    /// if there is no such summary. An event the summary lists that the log does not hold is an error.
    pub fn folded_events(&self, job_id: &str, summary: u64) -> Result<Vec<(u64, pb::LifecycleEvent)>, StoreError> {
        self.read_folded(job_id, summary, true)
    }

    /// Like [`Store::folded_events`], leaving out events the log does not hold (for readers racing retention, which
    /// may delete the job between their reads of its summary and its events).
    pub fn folded_events_present(
        &self,
        job_id: &str,
        summary: u64,
    ) -> Result<Vec<(u64, pb::LifecycleEvent)>, StoreError> {
        self.read_folded(job_id, summary, false)
    }

    pub(super) fn read_folded(
        &self,
        job_id: &str,
        no: u64,
        strict: bool,
    ) -> Result<Vec<(u64, pb::LifecycleEvent)>, StoreError> {
        let t = self.t()?;
        let Some(seqs) = t.summary_seqs(job_id, no)? else { return Ok(Vec::new()) };
        if strict {
            // One decode per log block the job's events are in (a job's ~20 events sit in a few blocks).
            Ok(self.jobs_events(&[(job_id, &seqs)])?.pop().unwrap_or_default())
        } else {
            self.read_job_events(job_id, &seqs, false)
        }
    }

    /// Folds jobs: writes their summaries (each listing the job's log sequences) and new dictionary entries,
    /// flushes, then records `max_seq` (the highest sequence used so far), and flushes again. The jobs' events
    /// stay in the log and in the snapshot parts: restore drops a folded job's own events by its summary, and
    /// treats one with an event the summary does not list as unfolded. Sets each job's [`FoldWrite::number`]
    /// (see [`Store::fold_write`]).
    pub fn fold_jobs(
        &self,
        jobs: &mut [FoldWrite],
        dictionary: &[(u32, Vec<u8>)],
        max_seq: u64,
    ) -> Result<(), StoreError> {
        self.fold_write(jobs, dictionary)?;
        self.fold_delete(max_seq)
    }

    /// The first step of [`Store::fold_jobs`]: dictionary entries and summaries (each under a new summary
    /// number, set in [`FoldWrite::number`], deleting the summaries it replaces in the same batch), flushed.
    /// Numbers of a write that fails are never handed out again (sled may have kept it).
    pub fn fold_write(&self, jobs: &mut [FoldWrite], dictionary: &[(u32, Vec<u8>)]) -> Result<(), StoreError> {
        let first = self.next_summary.fetch_add(jobs.len() as u64, std::sync::atomic::Ordering::AcqRel);
        for (j, no) in jobs.iter_mut().zip(first..) {
            j.number = no;
        }
        let t = self.w()?;
        let mut dict = sled::Batch::default();
        for (id, body) in dictionary {
            dict.insert(&id.to_be_bytes(), seal(body));
        }
        let bytes: Vec<Vec<u8>> = jobs.iter().map(|j| summary_bytes(&j.log_seqs, &j.summary)).collect();
        let entries: Vec<packs::Entry<'_>> = jobs
            .iter()
            .zip(&bytes)
            .map(|(j, b)| packs::Entry { number: j.number, job_id: &j.job_id, summary: b })
            .collect();
        let mut summaries = sled::Batch::default();
        let replaced: Vec<(&str, u64)> =
            jobs.iter().flat_map(|j| j.replaces.iter().map(|no| (j.job_id.as_str(), *no))).collect();
        let lock = t.packs_lock();
        t.plan_summary_removal(&mut summaries, &replaced)?;
        for (first, v) in packs::encode_packs(&entries)? {
            summaries.insert(&packs::pack_key(first), v);
        }
        // The dictionary first: a summary never refers to an entry that is not stored.
        t.dictionary.apply_batch(dict)?;
        t.summaries.apply_batch(summaries)?;
        drop(lock);
        t.db.flush()?;
        self.injected_fold_failure(FAIL_FOLD_WRITE)
    }

    /// Tests: fails once if [`Store::fail_fold`] is set to `which`.
    #[cfg(test)]
    fn injected_fold_failure(&self, which: u32) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering;
        if self.fail_fold.compare_exchange(which, 0, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            return Err(StoreError::Sled(sled::Error::Io(std::io::Error::from_raw_os_error(28))));
        }
        Ok(())
    }

    #[cfg(not(test))]
    fn injected_fold_failure(&self, _: u32) -> Result<(), StoreError> {
        Ok(())
    }

    /// Tests: flips a byte in the middle of every summary pack (each then fails its checksum).
    #[cfg(test)]
    pub(crate) fn damage_summary_packs(&self) -> Result<usize, StoreError> {
        let t = self.w()?;
        let mut n = 0;
        for kv in t.summaries.range(packs::all_packs()) {
            let (k, v) = kv?;
            let mut v = v.to_vec();
            let at = v.len() / 2;
            v[at] ^= 0x40;
            t.summaries.insert(k, v)?;
            n += 1;
        }
        t.db.flush()?;
        Ok(n)
    }

    /// Every readable stored summary, `(job_id, number)`, in the store's order.
    #[cfg(test)]
    pub(crate) fn summary_numbers(&self) -> Result<Vec<(String, u64)>, StoreError> {
        let t = self.t()?;
        let mut out = Vec::new();
        for kv in t.summaries.range(packs::all_packs()) {
            let (k, v) = kv?;
            // A damaged pack's summaries cannot be read (restore reports it in `lost_packs`).
            let Ok(pack) = packs::Pack::decode(packs::pack_first(&k)?, &v) else { continue };
            for e in pack.entries() {
                let (no, job_id, _) = e?;
                out.push((job_id.to_string(), no));
            }
        }
        Ok(out)
    }

    /// Deletes summaries `(job_id, number)` and flushes: those a restore found superseded (a job with two).
    pub fn delete_summaries(&self, summaries: &[(String, u64)]) -> Result<(), StoreError> {
        if summaries.is_empty() {
            return Ok(());
        }
        let t = self.w()?;
        let mut batch = sled::Batch::default();
        let wanted: Vec<(&str, u64)> = summaries.iter().map(|(id, no)| (id.as_str(), *no)).collect();
        let lock = t.packs_lock();
        t.plan_summary_removal(&mut batch, &wanted)?;
        t.summaries.apply_batch(batch)?;
        drop(lock);
        t.db.flush()?;
        Ok(())
    }

    /// The second step of [`Store::fold_jobs`]: `max_seq` is recorded, flushed. (The folded jobs' events in
    /// snapshot parts stay: restore drops them by the summaries, and the next base leaves them out.)
    pub fn fold_delete(&self, max_seq: u64) -> Result<(), StoreError> {
        let t = self.w()?;
        t.jobs.insert(MAX_SEQ_KEY, seal(&max_seq.to_be_bytes()))?;
        t.db.flush()?;
        self.injected_fold_failure(FAIL_FOLD_DELETE)
    }

    /// The highest sequence a fold removed from the log (0 if none).
    pub(super) fn max_folded_seq(&self) -> Result<u64, StoreError> {
        let t = self.t()?;
        Ok(sealed_array(&t.jobs, "jobs", MAX_SEQ_KEY)?.map_or(0, u64::from_be_bytes))
    }
}
