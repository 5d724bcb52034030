//! Checkpoints: snapshot increments and bases as part files, the marker, and the shutdown image.

use super::*;

impl Store {
    /// Writes the shutdown image (see [`image`]): `body` writes what the index needs instead of the summaries.
    /// Call it at a clean stop, after the last write to the store: any later write makes it wrong (the next
    /// open discards it only if that open is not the next start).
    pub fn write_shutdown_image(
        &self,
        body: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
    ) -> Result<(), StoreError> {
        let marker = self.checkpoint_seq()?;
        let token =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
                ^ (u64::from(std::process::id()) << 32);
        image::write(&self.path, token, marker, body)?;
        let t = self.w()?;
        let mut record = token.to_be_bytes().to_vec();
        record.extend_from_slice(&marker.to_be_bytes());
        t.jobs.insert(IMAGE_KEY, seal(&record))?;
        t.db.flush()?;
        Ok(())
    }

    /// The shutdown image this open found, read by `body` (which reads exactly what the writer's body wrote),
    /// if there is one and it is this store's as it is now; `None` otherwise (a reason is logged when there was
    /// an image it could not use). The file is removed either way: an image is used at most once.
    pub fn take_shutdown_image<T>(&self, body: impl FnOnce(&mut dyn std::io::Read) -> Result<T, String>) -> Option<T> {
        let record = self.image_record.lock().unwrap_or_else(|p| p.into_inner()).take();
        let (token, marker) = record?;
        let result = match self.checkpoint_seq() {
            Ok(now) if now == marker => image::read(&self.path, token, marker, body),
            Ok(now) => Err(format!("the checkpoint marker moved from {marker} to {now}")),
            Err(e) => Err(e.to_string()),
        };
        image::remove(&self.path);
        match result {
            Ok(Some(v)) => Some(v),
            Ok(None) => {
                tracing::warn!("shutdown image missing; the summaries are read instead");
                None
            }
            Err(reason) => {
                tracing::warn!(%reason, "shutdown image unusable; the summaries are read instead");
                None
            }
        }
    }

    /// Writes snapshots of the given jobs, then records that snapshots now cover the log through `through_seq`.
    ///
    /// Each job's events are written whole, as an increment (parts of up to [`snaps::PART_RAW_BYTES`]), then
    /// [`Store::finish_checkpoint`]. A crash part-way leaves parts newer than the marker, which is harmless:
    /// restore skips the log entries a snapshot already holds. For tools and tests: the committer writes only
    /// what its jobs gained, and bases (see [`snaps`]).
    pub fn checkpoint<'a>(
        &self,
        jobs: impl Iterator<Item = (&'a str, &'a JobRecord)>,
        through_seq: u64,
    ) -> Result<usize, StoreError> {
        let mut w = snaps::PartWriter::default();
        let mut n = 0;
        let mut max_seq = 0;
        for (job_id, rec) in jobs {
            w.add(job_id, &rec.events).map_err(|r| corrupt("jobs", job_id.as_bytes(), r))?;
            max_seq = rec.events.iter().map(|e| e.seq).fold(max_seq, u64::max);
            n += 1;
        }
        self.note_snapshot_seq(max_seq)?;
        self.write_increment(w.finish().map_err(|r| corrupt("jobs", b"", r))?)?;
        self.finish_checkpoint(through_seq)?;
        Ok(n)
    }

    /// The snapshot counter as it stands (see [`snaps`]): retention's tombstones carry it.
    pub(super) fn snapshot_counter(&self) -> u64 {
        self.snap.next.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Records that snapshot parts written from now on may hold events up to sequence `seq` (every one of them
    /// acknowledged): call it before writing them. sled keeps writes in order, so a part that survives a crash
    /// has its record too. Writes only when `seq` is above what this process recorded.
    pub fn note_snapshot_seq(&self, seq: u64) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering::AcqRel;
        if self.snap.noted_seq.load(std::sync::atomic::Ordering::Acquire) >= seq {
            return Ok(());
        }
        let t = self.w()?;
        t.jobs.insert(SNAPSHOT_SEQ_KEY, seal(&seq.to_be_bytes()))?;
        // Durable before the parts' files that may hold `seq` (sled orders its own writes, not the files').
        t.db.flush()?;
        self.snap.noted_seq.fetch_max(seq, AcqRel);
        Ok(())
    }

    /// Writes a checkpoint's increment (parts from [`snaps::PartWriter`]), each part a file under a new number
    /// (see [`snaps::PartFiles`]); every one is durable when this returns.
    pub fn write_increment(&self, parts: Vec<Vec<u8>>) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering::AcqRel;
        let t = self.w()?;
        let (count, bytes) = (parts.len() as u64, parts.iter().map(|p| p.len() as u64).sum::<u64>());
        let numbered = parts.into_iter().map(|part| (snaps::PartFile::Inc(self.snap.next.fetch_add(1, AcqRel)), part));
        t.parts.write(numbered.collect::<Vec<_>>())?;
        self.snap.inc_bytes.fetch_add(bytes, AcqRel);
        self.snap.inc_count.fetch_add(count, AcqRel);
        Ok(())
    }

    /// Whether the next checkpoint should write a base: the increments since the last one hold more than it
    /// and more than `min_bytes`, or there are more than `max_count` of them.
    /// Never while bases are held (see [`Store::hold_bases`]); always after a restore that rebuilt every job.
    pub fn wants_base(&self, min_bytes: u64, max_count: u64) -> bool {
        use std::sync::atomic::Ordering::Acquire;
        if self.snap.hold_bases.load(Acquire) {
            return false;
        }
        let inc = self.snap.inc_bytes.load(Acquire);
        self.snap.base_due.load(Acquire)
            || (inc > min_bytes && inc > self.snap.base_bytes.load(Acquire))
            || self.snap.inc_count.load(Acquire) > max_count
    }

    /// Whether most jobs of the base have left memory since (folded or deleted: a restart would decode their
    /// events only to drop them), with `hot_jobs` in memory now: the next checkpoint should write a base, even
    /// with no job changed. Never while bases are held.
    pub fn base_stale(&self, hot_jobs: usize) -> bool {
        use std::sync::atomic::Ordering::Acquire;
        let base = self.snap.base_jobs.load(Acquire);
        !self.snap.hold_bases.load(Acquire) && base > 1024 && (hot_jobs as u64).saturating_mul(2) < base
    }

    /// No more bases until the next start: retention could not delete jobs it dropped from memory, and the
    /// snapshot parts that hold them must stay for the next start to bring them back (and delete them).
    pub fn hold_bases(&self) {
        self.snap.hold_bases.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether [`Store::hold_bases`] was called since the open.
    pub fn bases_held(&self) -> bool {
        self.snap.hold_bases.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Starts a base: its number. Call it under the lock that retention's deletes hold (the applier's
    /// `store_writes`), before reading the first job: a tombstone numbered up to it belongs to a job deleted
    /// before, which the base cannot hold, and [`Store::switch_base`] removes it.
    pub fn begin_base(&self) -> u64 {
        self.snap.next.fetch_add(1, std::sync::atomic::Ordering::AcqRel)
    }

    /// Writes parts of base `base` as files, numbered from `first`; durable when this returns, invisible to
    /// restore until [`Store::switch_base`].
    pub fn write_base_parts(&self, base: u64, first: u64, parts: Vec<Vec<u8>>) -> Result<(), StoreError> {
        let t = self.w()?;
        t.parts
            .write((first..).zip(parts).map(|(no, part)| (snaps::PartFile::Base(base, no), part)).collect::<Vec<_>>())
    }

    /// Ends a checkpoint that wrote base `base` (every hot job's events as of `through_seq` or later; its files
    /// are durable): in one sled batch points restore at it, sets the increments' floor above every increment
    /// written so far, removes what sled still holds of older parts (0.1.0's) and the tombstones it supersedes, and
    /// moves the marker; flushes; then removes the files of every increment below the floor and every other base
    /// (and temporary files a crash left).
    ///
    /// Must not interleave with retention's deletes (its tombstones): call it under the applier's `store_writes`.
    pub fn switch_base(&self, base: u64, through_seq: u64, jobs: u64) -> Result<(), StoreError> {
        let t = self.w()?;
        t.db.flush()?;
        let floor = self.snap.next.load(std::sync::atomic::Ordering::Acquire);
        let mut batch = sled::Batch::default();
        let mut base_bytes = 0u64;
        for kv in t.jobs.scan_prefix([snaps::BASE_PREFIX]) {
            let (k, v) = kv?;
            if snaps::key_number(&k, 1) == Some(base) {
                base_bytes += v.len() as u64;
            } else {
                batch.remove(k);
            }
        }
        for k in t.jobs.scan_prefix([snaps::INC_PREFIX]).keys() {
            batch.remove(k?);
        }
        for kv in t.jobs.scan_prefix([snaps::TOMB_PREFIX]) {
            let (k, v) = kv?;
            // An unreadable tombstone goes too: restore would refuse it, and its job is gone from the base.
            if unseal(&v).and_then(snaps::parse_tomb).map_or(true, |(no, _)| no <= base) {
                batch.remove(k);
            }
        }
        batch.insert(BASE_KEY, seal(&base.to_be_bytes()));
        batch.insert(SNAP_FLOOR_KEY, seal(&floor.to_be_bytes()));
        batch.insert(CHECKPOINT_KEY, seal(&through_seq.to_be_bytes()));
        t.jobs.apply_batch(batch)?;
        t.db.flush()?;
        let mut stale = Vec::new();
        for (file, len) in t.parts.list()? {
            match file {
                snaps::PartFile::Base(b, _) if b == base => base_bytes += len,
                snaps::PartFile::Inc(no) if no >= floor => {}
                other => stale.push(other),
            }
        }
        t.parts.remove(&stale)?;
        self.snap.inc_bytes.store(0, std::sync::atomic::Ordering::Release);
        self.snap.inc_count.store(0, std::sync::atomic::Ordering::Release);
        self.snap.base_bytes.store(base_bytes, std::sync::atomic::Ordering::Release);
        self.snap.base_due.store(false, std::sync::atomic::Ordering::Release);
        self.snap.base_jobs.store(jobs, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Ends a checkpoint whose snapshots are all written: flushes them, then records that snapshots cover the log
    /// through `through_seq`. The flush comes first so a crash can never keep the marker and lose a snapshot it
    /// depends on; the marker itself is made durable by the next group commit's flush (or shutdown), and until
    /// then a restore simply replays from the previous marker.
    pub fn finish_checkpoint(&self, through_seq: u64) -> Result<(), StoreError> {
        let t = self.w()?;
        t.db.flush()?;
        t.jobs.insert(CHECKPOINT_KEY, seal(&through_seq.to_be_bytes()))?;
        Ok(())
    }
}
