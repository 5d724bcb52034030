//! Restore: what an open gives back to the index (hot jobs from the snapshot parts and the log after the marker,
//! folded jobs from their summaries, the markers), and the parts reader it uses.

use super::*;

impl Store {
    /// Reads every job snapshot, replays the log after the last checkpoint and collects the summaries of folded
    /// jobs into [`Restored::summaries`] (see the module doc).
    pub fn restore(&self) -> Result<Restored, StoreError> {
        let mut summaries = Vec::new();
        let mut out = self.restore_with(|id, no, body| {
            summaries.push((id.to_string(), no, body.to_vec()));
            Ok(())
        })?;
        out.summaries = summaries;
        Ok(out)
    }

    /// Like [`Store::restore`], handing each folded job's summary (job id, summary number, body) to
    /// `on_summary` instead of collecting them, in the store's order (packs by number). A pack that cannot be read is listed in [`Restored::lost_packs`], and every job the
    /// log holds with neither a snapshot nor a readable summary is rebuilt from the log as a hot job. A summary `on_summary` refuses (it cannot decode it) is set aside: the job is rebuilt from its
    /// events as a hot job (which the next fold folds again). If a job has two summaries (a failed fold's write
    /// kept by sled), both are handed over: the one with the higher number is the newer.
    pub fn restore_with(
        &self,
        mut on_summary: impl FnMut(&str, u64, &[u8]) -> Result<(), String>,
    ) -> Result<Restored, StoreError> {
        self.restore_from(Summaries::Read(&mut on_summary))
    }

    /// Like [`Store::restore_with`] when a shutdown image (see [`Store::take_shutdown_image`]) already holds the
    /// folded jobs: no summary is read. `folded` says whether a job was folded at the stop; `stale` is the
    /// stale summaries of the jobs that were hot (their events are read, as [`Store::restore_with`] does).
    pub fn restore_known(
        &self,
        folded: &dyn Fn(&str) -> bool,
        stale: &HashMap<String, Vec<u64>>,
    ) -> Result<Restored, StoreError> {
        let mut out = self.restore_from(Summaries::Known { folded, stale })?;
        out.from_image = true;
        Ok(out)
    }

    fn restore_from(&self, summaries: Summaries<'_>) -> Result<Restored, StoreError> {
        let t = self.t()?;
        let started = std::time::Instant::now();
        let mut out = Restored::default();
        let marker = match self.checkpoint_seq() {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "checkpoint marker unusable; rebuilding every job from the log");
                out.rebuilt = Some(e.to_string());
                0
            }
        };
        let mut events: HashMap<String, Vec<CompactEvent>> = HashMap::new();
        // Events in snapshots past the marker (written by a checkpoint that crashed before its marker).
        let mut beyond: HashSet<u64> = HashSet::new();
        if out.rebuilt.is_none() {
            match read_parts(&t, marker, &mut events, &mut beyond, &mut out) {
                Ok(read) => {
                    use std::sync::atomic::Ordering::Release;
                    // Sequences must stay above a deleted job's: its tombstone hides parts' events up to it.
                    out.last_seq = read.tomb_seq;
                    self.snap.inc_bytes.store(read.inc_bytes, Release);
                    self.snap.inc_count.store(read.inc_count, Release);
                    self.snap.base_bytes.store(read.base_bytes, Release);
                    self.snap.base_jobs.store(read.base_jobs, Release);
                }
                Err((what, reason)) => {
                    tracing::warn!(part = %what, reason = %reason, "snapshot part unusable; rebuilding every job from the log");
                    out.rebuilt = Some(format!("snapshot part {what}: {reason}"));
                }
            }
        }
        out.snapshots = events.len();
        let snapshots_done = started.elapsed();
        // A checkpoint only snapshots events whose log write was acknowledged: one past the log's end means the
        // log lost it.
        if let Some(&past) = beyond.iter().filter(|s| **s > t.files.last_seq()).max() {
            return Err(StoreError::Corrupt {
                what: "log",
                key: format!("sequence {past}"),
                reason: format!(
                    "a job snapshot holds this event but the log ends at sequence {}: acknowledged log writes are \
                     missing",
                    t.files.last_seq()
                ),
            });
        }
        let from = if out.rebuilt.is_some() {
            events.clear();
            beyond.clear();
            out.snapshot_through.clear();
            out.snapshots = 0;
            1
        } else {
            marker.saturating_add(1)
        };
        // The tail may bring a folded job's own events (its summary lists them): they leave again below.
        let dead = t.dead();
        let mut tail = log::Events::from(&t.files, &dead, from)?;
        while let Some((seq, body)) = tail.next_event()? {
            out.replayed += 1;
            if beyond.contains(&seq) {
                continue;
            }
            let ev = decode_log_body(seq, &body)?;
            if let Some(ce) = CompactEvent::from_pb(&ev, seq) {
                out.dirty.insert(ev.job_id.clone());
                events.entry(ev.job_id).or_default().push(ce);
            }
        }
        drop(tail);
        drop(dead);
        if out.rebuilt.is_some() {
            out.dirty.extend(events.keys().cloned());
        }
        let log_done = started.elapsed();
        // Time spent in `on_summary` (building the index's rows), reported apart from reading the summaries.
        let mut in_callback = std::time::Duration::ZERO;
        match summaries {
            Summaries::Known { folded, stale } => {
                // The shutdown image says which jobs were folded: what snapshot parts still hold of them is their
                // own (folded) events. A hot job's stale summaries are the image's too; their events join it.
                events.retain(|id, _| {
                    let hot = !folded(id);
                    if !hot {
                        out.dirty.remove(id);
                        out.snapshot_through.remove(id);
                    }
                    hot
                });
                for (job_id, numbers) in stale {
                    if let Some(evs) = events.get_mut(job_id) {
                        for &no in numbers {
                            let folded = self.read_folded(job_id, no, false)?;
                            evs.extend(folded.iter().filter_map(|(seq, ev)| CompactEvent::from_pb(ev, *seq)));
                            out.unfolded += 1;
                        }
                        out.dirty.insert(job_id.clone());
                    }
                    out.stale_summaries.insert(job_id.clone(), numbers.clone());
                }
            }
            Summaries::Read(on_summary) => {
                // Folded jobs: a summary each, unless the job is hot again (then its folded events join the rest).
                let mut damaged: HashSet<String> = HashSet::new();
                let mut one = |job_id: &str, no: u64, stored: Result<(Vec<u64>, &[u8]), String>| {
                    let (seqs, body) = match stored {
                        Ok(x) => x,
                        Err(reason) => {
                            tracing::warn!(job_id, reason = %reason, "summary unusable; rebuilding the job from the log");
                            damaged.insert(job_id.to_string());
                            out.stale_summaries.entry(job_id.to_string()).or_default().push(no);
                            return Ok(());
                        }
                    };
                    // An event the summary does not list (a late one), in a snapshot or the log's tail. Snapshot parts
                    // keep a folded job's events until the next base; those the summary lists are its own.
                    let hot =
                        events.get(job_id).is_some_and(|evs| evs.iter().any(|e| seqs.binary_search(&e.seq).is_err()));
                    if !hot && events.remove(job_id).is_some() {
                        // The snapshots and the tail held only the folded job's own events.
                        out.dirty.remove(job_id);
                        out.snapshot_through.remove(job_id);
                    }
                    let usable = if hot {
                        out.unfolded += 1;
                        Err(String::new())
                    } else {
                        let t0 = std::time::Instant::now();
                        let r = on_summary(job_id, no, body);
                        in_callback += t0.elapsed();
                        r
                    };
                    match usable {
                        Ok(()) => out.folded += 1,
                        Err(reason) => {
                            if !reason.is_empty() {
                                tracing::warn!(job_id, reason = %reason, "summary unusable; rebuilding the job from its events");
                            }
                            out.stale_summaries.entry(job_id.to_string()).or_default().push(no);
                            let folded = self.jobs_events(&[(job_id, &seqs)])?.pop().unwrap_or_default();
                            let evs = events.entry(job_id.to_string()).or_default();
                            evs.extend(folded.iter().filter_map(|(seq, ev)| CompactEvent::from_pb(ev, *seq)));
                            out.dirty.insert(job_id.to_string());
                        }
                    }
                    Ok::<(), StoreError>(())
                };
                // Packs that cannot be read: which jobs they held is unknown until the log is read (below).
                let mut lost_packs: Vec<u64> = Vec::new();
                for kv in t.summaries.range(packs::all_packs()) {
                    let (k, v) = kv?;
                    let first = packs::pack_first(&k)?;
                    let pack = match packs::Pack::decode(first, &v) {
                        Ok(p) => p,
                        Err(e) => {
                            tracing::warn!(pack = first, error = %e, "summary pack unusable; rebuilding its jobs from the log");
                            lost_packs.push(first);
                            continue;
                        }
                    };
                    for entry in pack.entries() {
                        match entry {
                            Ok((no, job_id, summary)) => one(job_id, no, parse_summary(summary))?,
                            Err(e) => {
                                tracing::warn!(pack = first, error = %e, "summary pack unusable; rebuilding its jobs from the log");
                                lost_packs.push(first);
                                break;
                            }
                        }
                    }
                }
                // With a pack lost, any job the log holds without a usable summary may have been in it (snapshot parts
                // may hold some of a folded job's events, the tail an unfolded one's): read the summaries' job ids once
                // more, and rebuild every other job from the whole log (the union with what it has: the same events).
                let mut unknown: Option<HashSet<String>> = None;
                if !lost_packs.is_empty() {
                    out.lost_packs = lost_packs;
                    let mut summarized: HashSet<String> = HashSet::new();
                    for kv in t.summaries.range(packs::all_packs()) {
                        let (k, v) = kv?;
                        if let Ok(pack) = packs::Pack::decode(packs::pack_first(&k)?, &v) {
                            summarized.extend(pack.entries().filter_map(|e| e.ok()).map(|(_, id, _)| id.to_string()));
                        }
                    }
                    unknown = Some(summarized);
                }
                if !damaged.is_empty() || unknown.is_some() {
                    // Which log entries a damaged summary listed is unknown: the whole log is read for those jobs, and
                    // each comes back hot.
                    let lost = |id: &str| unknown.as_ref().is_some_and(|summarized| !summarized.contains(id));
                    let mut rebuilt: HashSet<String> = HashSet::new();
                    let dead = t.dead();
                    let mut all = log::Events::from(&t.files, &dead, 1)?;
                    while let Some((seq, body)) = all.next_event()? {
                        let ev = decode_log_body(seq, &body)?;
                        if damaged.contains(&ev.job_id) || lost(&ev.job_id) {
                            if let Some(ce) = CompactEvent::from_pb(&ev, seq) {
                                rebuilt.insert(ev.job_id.clone());
                                events.entry(ev.job_id).or_default().push(ce);
                            }
                        }
                    }
                    drop(all);
                    drop(dead);
                    for job_id in damaged {
                        events.entry(job_id.clone()).or_default();
                        out.dirty.insert(job_id);
                    }
                    out.dirty.extend(rebuilt);
                }
            }
        }
        let summaries_done = started.elapsed();
        // One derivation per job (records dedupe by sequence number, never by id hash: two events whose ids
        // collide are both kept).
        out.jobs = events.into_iter().map(|(id, evs)| (id, JobRecord::from_events(evs))).collect();
        let last_logged = t.files.last_seq();
        out.last_seq = last_logged.max(marker).max(self.max_folded_seq()?).max(out.last_seq);
        if out.rebuilt.is_some() {
            // The next checkpoint writes a base, so that the next start reads parts again.
            self.snap.base_due.store(true, std::sync::atomic::Ordering::Release);
        }
        tracing::debug!(
            snapshots_ms = snapshots_done.as_millis() as u64,
            log_tail_ms = (log_done - snapshots_done).as_millis() as u64,
            summaries_ms = (summaries_done - log_done).as_millis() as u64,
            summary_rows_ms = in_callback.as_millis() as u64,
            derive_ms = (started.elapsed() - summaries_done).as_millis() as u64,
            "store read"
        );
        Ok(out)
    }
}

/// What [`read_parts`] found besides the events: the stored bytes and number of increments, the bytes and jobs
/// of the base, the highest sequence a tombstone covers.
#[derive(Debug, Default)]
struct PartsRead {
    inc_bytes: u64,
    inc_count: u64,
    base_bytes: u64,
    base_jobs: u64,
    tomb_seq: u64,
}

/// Reads the snapshot parts (the base the pointer names, then every increment) into `events`, leaving out the
/// events of deleted jobs their tombstones cover, and notes events past the marker in `beyond`, each job's
/// highest sequence in [`Restored::snapshot_through`] and the parts' bytes in the store's counters. A value
/// that cannot be read is returned with its key, printable, and the reason.
fn read_parts(
    t: &Trees,
    marker: u64,
    events: &mut HashMap<String, Vec<CompactEvent>>,
    beyond: &mut HashSet<u64>,
    out: &mut Restored,
) -> Result<PartsRead, (String, String)> {
    let shown = |k: &[u8]| format!("{k:02x?}");
    let sled_err = |e: sled::Error| ("tree jobs".to_string(), e.to_string());
    let mut tombs: HashMap<String, u64> = HashMap::new();
    for kv in t.jobs.scan_prefix([snaps::TOMB_PREFIX]) {
        let (k, v) = kv.map_err(sled_err)?;
        let id = std::str::from_utf8(&k[1..]).map_err(|_| (shown(&k), "job id is not UTF-8".to_string()))?;
        let (_, max_seq) = unseal(&v).and_then(snaps::parse_tomb).map_err(|r| (shown(&k), r))?;
        tombs.insert(id.to_string(), max_seq);
    }
    let base = match t.jobs.get(BASE_KEY).map_err(sled_err)? {
        Some(v) => Some(base_number(&v).map_err(|r| ("base pointer".to_string(), r))?),
        None => None,
    };
    let floor = match t.jobs.get(SNAP_FLOOR_KEY).map_err(sled_err)? {
        Some(v) => base_number(&v).map_err(|r| ("increments' floor".to_string(), r))?,
        None => 0,
    };
    let mut read = PartsRead { tomb_seq: tombs.values().copied().max().unwrap_or(0), ..PartsRead::default() };
    // Parts in sled (written by 0.1.0, removed by the next base), then the parts' files: the base
    // the pointer names, and the increments from the floor up.
    let base_parts = base.map(|b| t.jobs.scan_prefix(snaps::base_prefix(b)));
    let incs = t.jobs.scan_prefix([snaps::INC_PREFIX]);
    let in_sled = base_parts
        .into_iter()
        .flatten()
        .map(|kv| (true, kv))
        .chain(incs.map(|kv| (false, kv)))
        .map(|(is_base, kv)| kv.map(|(k, v)| (is_base, shown(&k), v.to_vec())).map_err(sled_err));
    let files = t.parts.list().map_err(|e| ("snapshot files".to_string(), e.to_string()))?;
    let in_files = files
        .into_iter()
        .filter(|(f, _)| match f {
            snaps::PartFile::Base(b, _) => Some(*b) == base,
            snaps::PartFile::Inc(no) => *no >= floor,
            snaps::PartFile::Temp(_) => false,
        })
        .map(|(f, _)| {
            let name = format!("snapshot file {f:?}");
            let v = t.parts.read(&f).map_err(|e| (name.clone(), e.to_string()))?;
            Ok((matches!(f, snaps::PartFile::Base(..)), name, v))
        });
    for part in in_sled.chain(in_files) {
        let (is_base, k, v) = part?;
        if is_base {
            read.base_bytes += v.len() as u64;
        } else {
            read.inc_bytes += v.len() as u64;
            read.inc_count += 1;
        }
        for (job_id, mut evs) in snaps::decode_part(&v).map_err(|r| (k.clone(), r))? {
            if is_base {
                read.base_jobs += 1;
            }
            if let Some(dead) = tombs.get(&job_id) {
                evs.retain(|e| e.seq > *dead);
                if evs.is_empty() {
                    continue;
                }
            }
            beyond.extend(evs.iter().filter(|e| e.seq > marker).map(|e| e.seq));
            let last = evs.iter().map(|e| e.seq).max().unwrap_or(0);
            let through = out.snapshot_through.entry(job_id.clone()).or_default();
            *through = (*through).max(last);
            events.entry(job_id).or_default().extend(evs);
        }
    }
    Ok(read)
}
