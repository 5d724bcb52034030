//! Group commit and acknowledgements: drains batches into one synced append to the log's files, filters duplicates (against
//! hot jobs' id hashes, or a folded job's stored events), enforces the per-job event cap, unfolds folded jobs a late
//! event reaches, applies the new events to the index after they are durable, records metrics, then answers.
//!
//! Open-jobs budgets: before anything is read or written, a batch whose identity has a budget ([`super::Owner`])
//! is refused whole when the jobs it would open (new to the index and to this group, not done within the batch),
//! less the identity's open jobs its `done` events end, would take the identity's open jobs
//! ([`crate::health::OpenJobs`]) past its budget. While the group is applied, each event's job is counted as open
//! against its batch's identity, or no longer counted once it is done.

use super::{CommitError, CommitRejection, CommitRequest, CommitResult, Committer};
use crate::health::IngestStats;
use crate::index::JobIndex;
use crate::job::CompactEvent;
use crate::store::StoreError;
use startline_proto::pb;
use std::collections::{HashMap, HashSet};
use std::time::Instant;

/// The stored events of folded jobs (read through their summaries), by job id.
type FoldedEvents = HashMap<String, Vec<(u64, pb::LifecycleEvent)>>;

impl Committer {
    /// Is this event already stored? For a folded job, its stored events say (`folded`); for a hot one, each hash
    /// match is confirmed against the stored event id (distinct ids may share a hash).
    fn is_stored(&self, job_id: &str, event_id: &str, id_hash: u64, folded: &FoldedEvents) -> Result<bool, StoreError> {
        if let Some(archived) = folded.get(job_id) {
            return Ok(archived.iter().any(|(_, e)| e.event_id == event_id));
        }
        let (seqs, folded_since) = {
            let idx = self.index.read();
            match idx.jobs.get(job_id) {
                Some(h) => (h.rec.seqs_of_hash(id_hash).collect(), None),
                None => (Vec::new(), idx.folded(job_id).map(|r| r.summary())),
            }
        };
        if let Some(summary) = folded_since {
            // Folded by the maintenance thread after this group's folded events were read: they say.
            return Ok(self.store.folded_events(job_id, summary)?.iter().any(|(_, e)| e.event_id == event_id));
        }
        for seq in seqs {
            if self.store.event(seq)?.is_some_and(|e| e.event_id == event_id) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The stored events of the folded jobs a group writes to (read once per group, outside the index lock).
    fn folded_events_of(&self, group: &[CommitRequest]) -> Result<FoldedEvents, StoreError> {
        let wanted: HashMap<&str, u64> = {
            let idx = self.index.read();
            group
                .iter()
                .flat_map(|r| r.events.iter())
                .filter_map(|e| Some((e.job_id.as_str(), idx.folded(&e.job_id)?.summary())))
                .collect()
        };
        let mut out = HashMap::with_capacity(wanted.len());
        for (job_id, summary) in wanted {
            out.insert(job_id.to_string(), self.store.folded_events(job_id, summary)?);
        }
        Ok(out)
    }

    /// Would storing one more event of `job_id` pass the per-job cap, counting the events of this group already
    /// let through (`incoming`)? If so, counts it.
    fn take_job_room<'a>(
        &self,
        job_id: &'a str,
        incoming: &mut HashMap<&'a str, usize>,
        folded: &FoldedEvents,
    ) -> bool {
        let stored = match folded.get(job_id) {
            Some(a) => a.len(),
            None => {
                let idx = self.index.read();
                match (idx.jobs.get(job_id), idx.folded(job_id).map(|r| r.summary())) {
                    (Some(h), _) => h.rec.events.len(),
                    // Folded since this group's folded events were read: read them now.
                    (None, Some(summary)) => {
                        drop(idx);
                        self.store.folded_events(job_id, summary).map_or(0, |a| a.len())
                    }
                    (None, None) => 0,
                }
            }
        };
        let n = incoming.entry(job_id).or_insert(0);
        if stored + *n >= self.settings.max_events_per_job {
            return false;
        }
        *n += 1;
        true
    }

    /// Answers the batches that would take their identity past its open-jobs budget (refused whole, nothing
    /// stored) and returns the others, in order.
    fn refuse_over_budget(&self, group: Vec<CommitRequest>) -> Vec<CommitRequest> {
        if group.iter().all(|r| r.owner.is_none()) {
            return group;
        }
        let idx = self.index.read();
        let book = self.stats.open_jobs.book();
        // Jobs opened by the batches of this group let through so far, and each identity's net change.
        let mut opening: HashSet<String> = HashSet::new();
        let mut pending: HashMap<std::sync::Arc<str>, i64> = HashMap::new();
        let mut keep = Vec::with_capacity(group.len());
        for req in group {
            let mut new: HashSet<&str> = HashSet::new();
            let mut done: HashSet<&str> = HashSet::new();
            for ev in &req.events {
                let job = ev.job_id.as_str();
                if matches!(ev.compact.kind, crate::job::EventKind::Done { .. }) {
                    done.insert(job);
                }
                if !opening.contains(job) && !idx.jobs.contains_key(job) && idx.folded(job).is_none() {
                    new.insert(job);
                }
            }
            if let Some(o) = &req.owner {
                let opens = new.iter().filter(|j| !done.contains(*j)).count() as i64;
                let closes = done.iter().filter(|j| book.owner(j) == Some(&o.name)).count() as i64;
                let open = book.count(&o.name) as i64 + pending.get(&o.name).copied().unwrap_or(0);
                if opens > 0 && open + opens - closes > o.max_open_jobs as i64 {
                    IngestStats::add(&self.stats.refused_open_jobs, 1);
                    let why = format!(
                        "identity {:?} has {open} open jobs and this batch would open {opens} more, over its \
                         max_open_jobs = {} (a job is open from its first event until it is done); batch not stored, \
                         retry once some of its jobs have ended",
                        o.name, o.max_open_jobs
                    );
                    tracing::warn!(identity = %o.name, open, opens, "batch refused: {why}");
                    let _ = req.reply.send(Ok(CommitResult { refused: Some(why), ..Default::default() }));
                    continue;
                }
                *pending.entry(o.name.clone()).or_default() += opens - closes;
            }
            opening.extend(new.into_iter().map(str::to_string));
            keep.push(req);
        }
        keep
    }

    pub(super) fn commit_group(&self, group: Vec<CommitRequest>) {
        // Every log line of a group commit (a storage error, a refused event) carries its span in JSON logs.
        let events: usize = group.iter().map(|r| r.events.len()).sum();
        let _span = tracing::info_span!("commit", batches = group.len(), events).entered();
        if let Some(cause) = self.store.halted() {
            // Writes are halted (see `super::halt`): answered at once, without a read or a write.
            for req in group {
                let _ = req.reply.send(Err(CommitError { cause }));
            }
            return;
        }
        let mut group = self.refuse_over_budget(group);
        if group.is_empty() {
            return;
        }
        let started = Instant::now();
        let mut results = vec![CommitResult::default(); group.len()];
        // Per request, per event: is it new?
        let mut fresh: Vec<Vec<bool>> = Vec::with_capacity(group.len());
        let mut failed: Option<&'static str> = None;
        let folded = match self.folded_events_of(&group) {
            Ok(a) => a,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the events of a folded job");
                failed = Some(e.cause());
                HashMap::new()
            }
        };
        {
            let mut seen: HashSet<(&str, &str)> = HashSet::new();
            // New events of this group per job, for the per-job cap.
            let mut incoming: HashMap<&str, usize> = HashMap::new();
            for (ri, req) in group.iter().enumerate() {
                let mut flags = Vec::with_capacity(req.events.len());
                for (ei, ev) in req.events.iter().enumerate() {
                    let dup = !seen.insert((ev.job_id.as_str(), ev.event_id.as_str()))
                        || match self.is_stored(&ev.job_id, &ev.event_id, ev.compact.id_hash, &folded) {
                            Ok(d) => d,
                            Err(e) => {
                                tracing::error!(error = %e, "duplicate check failed");
                                failed = Some(e.cause());
                                false
                            }
                        };
                    // A duplicate is answered as one even when its job is full; a new event of a full job is not
                    // stored (and a later copy of it in this group is not a duplicate).
                    let capped = !dup && !self.take_job_room(&ev.job_id, &mut incoming, &folded);
                    if capped {
                        seen.remove(&(ev.job_id.as_str(), ev.event_id.as_str()));
                        results[ri].rejections.push(CommitRejection {
                            index: ei,
                            event_id: ev.event_id.clone(),
                            field: "job_id",
                            reason: format!(
                                "job has reached store.max_events_per_job = {} events; event not stored",
                                self.settings.max_events_per_job
                            ),
                        });
                    } else if dup {
                        results[ri].duplicates += 1;
                    } else {
                        results[ri].accepted += 1;
                    }
                    flags.push(!dup && !capped);
                }
                fresh.push(flags);
            }
        }
        let first_seq = self.index.read().last_seq.max(self.used_seq.get()) + 1;
        let mut entries: Vec<(u64, Vec<u8>)> = Vec::new();
        // The stream's filter subject of each fresh event (only when the stream is kept).
        let mut subjects = Vec::new();
        {
            let idx = self.stream.as_ref().map(|_| self.index.read());
            // Attributes a `submitted` of this very group brings (its job may not be in the index yet).
            let mut arriving: HashMap<String, std::sync::Arc<crate::job::JobAttrs>> = HashMap::new();
            if idx.is_some() {
                for ev in group.iter().flat_map(|r| r.events.iter()) {
                    if let crate::job::EventKind::Submitted(a) = &ev.compact.kind {
                        arriving.entry(ev.job_id.clone()).or_insert_with(|| a.clone());
                    }
                }
            }
            for (req, flags) in group.iter_mut().zip(&fresh) {
                for (ev, _) in req.events.iter_mut().zip(flags).filter(|(_, f)| **f) {
                    entries.push((first_seq + entries.len() as u64, std::mem::take(&mut ev.encoded)));
                    if let Some(idx) = &idx {
                        let known = idx
                            .jobs
                            .get(&ev.job_id)
                            .and_then(|h| h.rec.timeline.attrs.clone())
                            .or_else(|| arriving.get(&ev.job_id).cloned());
                        subjects.push(super::stream::subject_of(&ev.job_id, &ev.compact.kind, known.as_deref()));
                    }
                }
            }
        }
        let now = self.settings.clock.now_ms();
        if failed.is_none() && !entries.is_empty() {
            self.used_seq.set(first_seq + entries.len() as u64 - 1);
            // Synced before anything else: the ack waits for this alone.
            if let Err(e) = self.store.append_durable(&entries) {
                tracing::error!(error = %e, "group commit failed; batches are not acknowledged");
                self.write_failed(&e);
                failed = Some(e.cause());
            }
        }
        // The stream's cursors for the durable events (its records are written after the acks went out and
        // flushed off the commit path; see `stream`).
        let staged = match (&self.stream, failed) {
            (Some(sw), None) => sw.stage(entries.len()),
            _ => None,
        };
        if let Some(cause) = failed {
            // A failed read (the duplicate check) leaves writes going; a failed append halted them.
            self.health.storage_failed(cause);
            for req in group {
                let _ = req.reply.send(Err(CommitError { cause }));
            }
            return;
        }
        self.health.storage_ok();
        // Durable: now visible.
        let accepted = entries.len() as u64;
        // The feed takes the stored values when someone subscribes; otherwise they go now.
        let feeding = self.settings.feed.active();
        let mut values =
            if feeding { entries.iter().map(|(_, v)| v.clone()).collect() } else { Vec::new() }.into_iter();
        if staged.is_none() {
            // Not needed any more: freed before the index lock is taken.
            entries = Vec::new();
        }
        let mut fed = crate::feed::Group::default();
        let mut replies = Vec::with_capacity(group.len());
        let mut observations = Vec::new();
        let mut changes = Vec::new();
        {
            let mut idx = self.index.write();
            // Open jobs per identity, kept with the index under its write lock (see the module notes).
            let mut book = self.stats.open_jobs.book();
            let track = !book.is_empty() || group.iter().any(|r| r.owner.is_some());
            idx.begin_group();
            let mut seq = first_seq;
            let mut ended: Vec<String> = Vec::new();
            // For the stream: each job the group touches, its view before the group's first event of it, and the
            // group's last event of it (one change per job per group commit: what the collector learned at once).
            let mut touched: Vec<(String, Option<crate::stream::JobView>, u64)> = Vec::new();
            let mut touched_at: HashMap<String, usize> = HashMap::new();
            for ((req, flags), res) in group.into_iter().zip(fresh).zip(&results) {
                let owner = req.owner.map(|o| o.name);
                for (ev, _) in req.events.into_iter().zip(flags).filter(|(_, f)| *f) {
                    let mut compact = ev.compact;
                    compact.seq = seq;
                    if idx.folded(&ev.job_id).is_some() {
                        self.unfold(&mut idx, &ev.job_id, &folded, now);
                    }
                    let at_ms = compact.at_ms;
                    let done = matches!(compact.kind, crate::job::EventKind::Done { .. });
                    if self.stream.is_some() {
                        match touched_at.get(&ev.job_id) {
                            Some(&i) => touched[i].2 = seq,
                            None => {
                                let before = idx
                                    .jobs
                                    .get(&ev.job_id)
                                    .map(|h| crate::stream::JobView::of(&h.rec.timeline, &h.slo));
                                touched_at.insert(ev.job_id.clone(), touched.len());
                                touched.push((ev.job_id.clone(), before, seq));
                            }
                        }
                    }
                    observations.extend(idx.insert(&ev.job_id, compact, now));
                    idx.note_source(&ev.job_id, ev.source, at_ms, now);
                    if track {
                        match idx.jobs.get(&ev.job_id).map(|h| h.rec.timeline.state) {
                            Some(state) if state != crate::job::JobState::Done => {
                                if let Some(name) = &owner {
                                    book.opened(&ev.job_id, name);
                                }
                            }
                            _ => book.closed(&ev.job_id),
                        }
                    }
                    if feeding {
                        let attrs = idx.jobs.get(&ev.job_id).and_then(|h| h.rec.timeline.attrs.clone());
                        if done {
                            ended.push(ev.job_id.clone());
                        }
                        let value = values.next().unwrap_or_default();
                        fed.events.push(crate::feed::Accepted { seq, job_id: ev.job_id, value, attrs });
                    }
                    seq += 1;
                }
                replies.push((req.reply, res.clone()));
            }
            idx.end_group();
            if let Some(sw) = self.stream.as_ref().filter(|_| staged.is_some()) {
                let named = |i| super::stream::slo_name(&idx.slo, i);
                for (job_id, before, last_seq) in touched {
                    let Some(h) = idx.jobs.get(&job_id) else { continue };
                    let after = crate::stream::JobView::of(&h.rec.timeline, &h.slo);
                    if let Some(c) = crate::stream::change(before.as_ref(), &after, last_seq, named) {
                        let subject = crate::stream::Subject::job(&job_id, h.rec.timeline.attrs.as_deref());
                        changes.push(sw.change(now, &subject, c));
                    }
                }
                // Expected starts posted meanwhile, after the group's changes (so checked against them).
                changes.extend(sw.estimate_records(&idx, now));
            }
            if feeding {
                ended.sort();
                ended.dedup();
                fed.ended = ended
                    .into_iter()
                    .filter_map(|id| idx.jobs.get(&id).map(|h| h.rec.timeline.clone()).map(|t| (id, t)))
                    .collect();
                fed.applied_at_ms = now;
            }
        }
        if feeding {
            self.settings.feed.publish(fed);
        }
        let duplicates: u64 = results.iter().map(|r| u64::from(r.duplicates)).sum();
        let rejected: usize = results.iter().map(|r| r.rejections.len()).sum();
        IngestStats::add(&self.stats.accepted, accepted);
        IngestStats::add(&self.stats.duplicates, duplicates);
        IngestStats::add(&self.stats.rejected, rejected as u64);
        IngestStats::add(&self.stats.commits, 1);
        IngestStats::add(&self.stats.commit_micros, started.elapsed().as_micros() as u64);
        // Metrics before acks: once a client holds an ack, /metrics reflects its events.
        if let Some(t) = &self.settings.telemetry {
            t.record(&observations);
            t.record_commit(started.elapsed());
        }
        for (reply, res) in replies {
            let _ = reply.send(Ok(res));
        }
        self.settings.wake.notify_one();
        // The stream's records, once the acks are out: they are not part of the ack's promise (see `stream`).
        if let (Some(sw), Some(staged)) = (&self.stream, staged) {
            let events = subjects.into_iter().zip(&entries).map(|(s, (seq, v))| (s, *seq, v.as_slice()));
            sw.write_group(now, staged, events, changes);
        }
    }

    /// Makes a folded job hot before a new event joins it, from the events read for this group or, if the job
    /// was folded since (by the fold pass, between the duplicate check and now), from the store.
    fn unfold(&self, idx: &mut JobIndex, job_id: &str, folded: &FoldedEvents, now: i64) {
        let read;
        let summary = idx.folded(job_id).map_or(crate::store::NO_SUMMARY, |r| r.summary());
        let archived = match folded.get(job_id) {
            Some(a) => a,
            None => match self.store.folded_events(job_id, summary) {
                Ok(a) => {
                    read = a;
                    &read
                }
                Err(e) => {
                    // The event is durable. The folded row goes (with its SLO contributions, so nothing counts
                    // twice) and the event starts a hot record, which the next checkpoint snapshots; restore
                    // then finds the summary beside the snapshot and rebuilds the whole job from its stored events.
                    // Until a restart the job's timeline in memory lacks the folded events.
                    tracing::error!(error = %e, job_id, "cannot read a folded job's events to apply a late event");
                    self.health.storage_failed(e.cause());
                    if let Some(gone) = idx.remove(job_id, now) {
                        // Its summary stays in the store: the hot record's next fold replaces it.
                        idx.stale_summaries.insert(job_id.to_string(), gone.summaries);
                    }
                    return;
                }
            },
        };
        let events = archived.iter().filter_map(|(seq, e)| CompactEvent::from_pb(e, *seq)).collect();
        idx.unfold(job_id, events, now);
    }
}
