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
use crate::index::footprint::Observation;
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

    /// One group commit, as named steps: answer at once while writes are halted; refuse batches over their
    /// open-jobs budget; read the folded jobs' events the group reaches; sort its events into fresh ones,
    /// duplicates and events over the per-job cap; append the fresh ones to the log in one synced write (all an
    /// ack waits for); reserve the stream's cursors; apply the events to the index; answer; hand the stream its
    /// records.
    pub(super) fn commit_group(&self, group: Vec<CommitRequest>) {
        // Every log line of a group commit (a storage error, a refused event) carries its span in JSON logs.
        let events: usize = group.iter().map(|r| r.events.len()).sum();
        let _span = tracing::info_span!("commit", batches = group.len(), events).entered();
        if let Some(cause) = self.store.halted() {
            // Writes are halted (see `super::halt`): answered at once, without a read or a write.
            answer_failed(group, cause);
            return;
        }
        let mut group = self.refuse_over_budget(group);
        if group.is_empty() {
            return;
        }
        let started = Instant::now();
        let (folded, read_failed) = self.read_folded(&group);
        let sorted = self.sort_events(&group, &folded);
        let first_seq = self.index.read().last_seq.max(self.used_seq.get()) + 1;
        let (mut entries, subjects) = self.log_entries(&mut group, &sorted.fresh, first_seq);
        let now = self.settings.clock.now_ms();
        let failed = read_failed.or(sorted.failed).or_else(|| self.append(&entries, first_seq));
        // The stream's cursors for the durable events (its records are written after the acks went out and
        // flushed off the commit path; see `stream`).
        let staged = match (&self.stream, failed) {
            (Some(sw), None) => sw.stage(entries.len()),
            _ => None,
        };
        if let Some(cause) = failed {
            // A failed read (the duplicate check) leaves writes going; a failed append halted them.
            self.health.storage_failed(cause);
            answer_failed(group, cause);
            return;
        }
        self.health.storage_ok();
        // Durable: now visible. The feed takes the stored values when someone subscribes.
        let accepted = entries.len() as u64;
        let values = self.settings.feed.active().then(|| entries.iter().map(|(_, v)| v.clone()).collect());
        if staged.is_none() {
            // Not needed any more: freed before the index lock is taken.
            entries = Vec::new();
        }
        let applied = self.apply(group, &sorted, &folded, first_seq, now, values);
        self.answer(applied.replies, &sorted.results, accepted, applied.observations, started, applied.fed);
        // The stream's records, once the acks are out: they are not part of the ack's promise (see `stream`).
        if let (Some(sw), Some(staged)) = (&self.stream, staged) {
            let events = subjects.into_iter().zip(&entries).map(|(s, (seq, v))| (s, *seq, v.as_slice()));
            sw.write_group(now, staged, events, applied.changes);
        }
    }

    /// The stored events of the folded jobs the group reaches (for the duplicate check and to unfold them), and
    /// the cause when they could not be read.
    fn read_folded(&self, group: &[CommitRequest]) -> (FoldedEvents, Option<&'static str>) {
        match self.folded_events_of(group) {
            Ok(a) => (a, None),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the events of a folded job");
                (HashMap::new(), Some(e.cause()))
            }
        }
    }

    /// Sorts every event of the group: a duplicate (of this group or of a stored event), over its job's event cap
    /// (a rejection naming `job_id`), or fresh; counted per batch.
    fn sort_events(&self, group: &[CommitRequest], folded: &FoldedEvents) -> Sorted {
        let mut sorted = Sorted {
            fresh: Vec::with_capacity(group.len()),
            results: vec![CommitResult::default(); group.len()],
            failed: None,
        };
        let mut seen: HashSet<(&str, &str)> = HashSet::new();
        // New events of this group per job, for the per-job cap.
        let mut incoming: HashMap<&str, usize> = HashMap::new();
        for (ri, req) in group.iter().enumerate() {
            let mut flags = Vec::with_capacity(req.events.len());
            for (ei, ev) in req.events.iter().enumerate() {
                let dup = !seen.insert((ev.job_id.as_str(), ev.event_id.as_str()))
                    || match self.is_stored(&ev.job_id, &ev.event_id, ev.compact.id_hash, folded) {
                        Ok(d) => d,
                        Err(e) => {
                            tracing::error!(error = %e, "duplicate check failed");
                            sorted.failed = Some(e.cause());
                            false
                        }
                    };
                // A duplicate is answered as one even when its job is full; a new event of a full job is not
                // stored (and a later copy of it in this group is not a duplicate).
                let capped = !dup && !self.take_job_room(&ev.job_id, &mut incoming, folded);
                let res = &mut sorted.results[ri];
                if capped {
                    seen.remove(&(ev.job_id.as_str(), ev.event_id.as_str()));
                    res.rejections.push(CommitRejection {
                        index: ei,
                        event_id: ev.event_id.clone(),
                        field: "job_id",
                        reason: format!(
                            "job has reached store.max_events_per_job = {} events; event not stored",
                            self.settings.max_events_per_job
                        ),
                    });
                } else if dup {
                    res.duplicates += 1;
                } else {
                    res.accepted += 1;
                }
                flags.push(!dup && !capped);
            }
            sorted.fresh.push(flags);
        }
        sorted
    }

    /// The log entries of the fresh events (their encoded values taken, sequences from `first_seq`), and, when
    /// the stream is kept, each one's filter subject (attributes from the index or from a `submitted` of this
    /// very group, whose job may not be in the index yet).
    fn log_entries(
        &self,
        group: &mut [CommitRequest],
        fresh: &[Vec<bool>],
        first_seq: u64,
    ) -> (Vec<(u64, Vec<u8>)>, Vec<crate::stream::Subject>) {
        let mut entries: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut subjects = Vec::new();
        let idx = self.stream.as_ref().map(|_| self.index.read());
        let mut arriving: HashMap<String, std::sync::Arc<crate::job::JobAttrs>> = HashMap::new();
        if idx.is_some() {
            for ev in group.iter().flat_map(|r| r.events.iter()) {
                if let crate::job::EventKind::Submitted(a) = &ev.compact.kind {
                    arriving.entry(ev.job_id.clone()).or_insert_with(|| a.clone());
                }
            }
        }
        for (req, flags) in group.iter_mut().zip(fresh) {
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
        (entries, subjects)
    }

    /// Appends the entries to the log in one synced write (nothing to do for none); the cause if it failed (then
    /// writes are halted). Their sequences are never handed out again, whatever the outcome.
    fn append(&self, entries: &[(u64, Vec<u8>)], first_seq: u64) -> Option<&'static str> {
        if entries.is_empty() {
            return None;
        }
        self.used_seq.set(first_seq + entries.len() as u64 - 1);
        match self.store.append_durable(entries) {
            Ok(()) => None,
            Err(e) => {
                tracing::error!(error = %e, "group commit failed; batches are not acknowledged");
                self.write_failed(&e);
                Some(e.cause())
            }
        }
    }

    /// Applies the durable fresh events to the index under one write lock: unfolds folded jobs they reach,
    /// inserts them, keeps the open jobs per identity, and builds what follows from them: the replies, metric
    /// observations, the feed's group (with `values`, the stored values, when the feed has subscribers) and, while
    /// the stream is kept and not broken, one change per job the group changed and the expected starts posted
    /// meanwhile.
    fn apply(
        &self,
        group: Vec<CommitRequest>,
        sorted: &Sorted,
        folded: &FoldedEvents,
        first_seq: u64,
        now: i64,
        values: Option<Vec<Vec<u8>>>,
    ) -> Applied {
        let feeding = values.is_some();
        let mut values = values.unwrap_or_default().into_iter();
        let mut out = Applied {
            replies: Vec::with_capacity(group.len()),
            observations: Vec::new(),
            changes: Vec::new(),
            fed: feeding.then(crate::feed::Group::default),
        };
        let mut idx = self.index.write();
        // Open jobs per identity, kept with the index under its write lock (see the module notes).
        let mut book = self.stats.open_jobs.book();
        let track = !book.is_empty() || group.iter().any(|r| r.owner.is_some());
        idx.begin_group();
        let mut seq = first_seq;
        let mut ended: Vec<String> = Vec::new();
        // For the stream: each job the group touches, its view before the group's first event of it, and the
        // group's last event of it (one change per job per group commit: what the collector learned at once).
        let mut touched = Touched::default();
        for ((req, flags), res) in group.into_iter().zip(&sorted.fresh).zip(&sorted.results) {
            let owner = req.owner.map(|o| o.name);
            for (ev, _) in req.events.into_iter().zip(flags).filter(|(_, f)| **f) {
                let mut compact = ev.compact;
                compact.seq = seq;
                if idx.folded(&ev.job_id).is_some() {
                    self.unfold(&mut idx, &ev.job_id, folded, now);
                }
                let at_ms = compact.at_ms;
                let done = matches!(compact.kind, crate::job::EventKind::Done { .. });
                if self.stream.is_some() {
                    touched.note(&idx, &ev.job_id, seq);
                }
                out.observations.extend(idx.insert(&ev.job_id, compact, now));
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
                if let Some(fed) = &mut out.fed {
                    let attrs = idx.jobs.get(&ev.job_id).and_then(|h| h.rec.timeline.attrs.clone());
                    if done {
                        ended.push(ev.job_id.clone());
                    }
                    let value = values.next().unwrap_or_default();
                    fed.events.push(crate::feed::Accepted { seq, job_id: ev.job_id, value, attrs });
                }
                seq += 1;
            }
            out.replies.push((req.reply, res.clone()));
        }
        idx.end_group();
        // Not while the stream is broken (its cursors were not reserved, or nothing more is written).
        if let Some(sw) = self.stream.as_ref().filter(|sw| !sw.broken()) {
            out.changes = touched.changes(&idx, sw, now);
            // Expected starts posted meanwhile, after the group's changes (so checked against them).
            out.changes.extend(sw.estimate_records(&idx, now));
        }
        if let Some(fed) = &mut out.fed {
            ended.sort();
            ended.dedup();
            fed.ended = ended
                .into_iter()
                .filter_map(|id| idx.jobs.get(&id).map(|h| h.rec.timeline.clone()).map(|t| (id, t)))
                .collect();
            fed.applied_at_ms = now;
        }
        out
    }

    /// Publishes the feed's group (when the feed has subscribers), counts the group, records its metrics (before
    /// the acks: once a client holds an ack, `/metrics` reflects its events), and answers every batch.
    fn answer(
        &self,
        replies: Vec<(tokio::sync::oneshot::Sender<Result<CommitResult, CommitError>>, CommitResult)>,
        results: &[CommitResult],
        accepted: u64,
        observations: Vec<Observation>,
        started: Instant,
        fed: Option<crate::feed::Group>,
    ) {
        if let Some(fed) = fed {
            self.settings.feed.publish(fed);
        }
        let duplicates: u64 = results.iter().map(|r| u64::from(r.duplicates)).sum();
        let rejected: usize = results.iter().map(|r| r.rejections.len()).sum();
        IngestStats::add(&self.stats.accepted, accepted);
        IngestStats::add(&self.stats.duplicates, duplicates);
        IngestStats::add(&self.stats.rejected, rejected as u64);
        IngestStats::add(&self.stats.commits, 1);
        IngestStats::add(&self.stats.commit_micros, started.elapsed().as_micros() as u64);
        if let Some(t) = &self.settings.telemetry {
            t.record(&observations);
            t.record_commit(started.elapsed());
        }
        for (reply, res) in replies {
            let _ = reply.send(Ok(res));
        }
        self.settings.wake.notify_one();
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

/// Every batch of the group answered with `cause`.
fn answer_failed(group: Vec<CommitRequest>, cause: &'static str) {
    for req in group {
        let _ = req.reply.send(Err(CommitError { cause }));
    }
}

/// The group's events sorted: per batch, per event, whether it is fresh; the batches' counts and rejections; the
/// cause when the duplicate check could not read the store.
struct Sorted {
    fresh: Vec<Vec<bool>>,
    results: Vec<CommitResult>,
    failed: Option<&'static str>,
}

/// What applying a group to the index built: the replies, metric observations, the stream's records (changes
/// and expected starts) and the feed's group (when the feed has subscribers).
struct Applied {
    replies: Vec<(tokio::sync::oneshot::Sender<Result<CommitResult, CommitError>>, CommitResult)>,
    observations: Vec<Observation>,
    changes: Vec<crate::stream::Rec>,
    fed: Option<crate::feed::Group>,
}

/// The jobs a group touches, in first-touch order: each one's view before the group's first event of it and the
/// group's last event of it.
#[derive(Default)]
struct Touched {
    jobs: Vec<(String, Option<crate::stream::JobView>, u64)>,
    at: HashMap<String, usize>,
}

impl Touched {
    /// Notes event `seq` of `job_id`, before it is applied.
    fn note(&mut self, idx: &JobIndex, job_id: &str, seq: u64) {
        match self.at.get(job_id) {
            Some(&i) => self.jobs[i].2 = seq,
            None => {
                let before = idx.jobs.get(job_id).map(|h| crate::stream::JobView::of(&h.rec.timeline, &h.slo));
                self.at.insert(job_id.to_string(), self.jobs.len());
                self.jobs.push((job_id.to_string(), before, seq));
            }
        }
    }

    /// One change record per touched job whose view changed (after the group was applied).
    fn changes(self, idx: &JobIndex, sw: &super::stream::StreamWriter, now: i64) -> Vec<crate::stream::Rec> {
        let named = |i| super::stream::slo_name(&idx.slo, i);
        let mut out = Vec::new();
        for (job_id, before, last_seq) in self.jobs {
            let Some(h) = idx.jobs.get(&job_id) else { continue };
            let after = crate::stream::JobView::of(&h.rec.timeline, &h.slo);
            if let Some(c) = crate::stream::change(before.as_ref(), &after, last_seq, named) {
                let subject = crate::stream::Subject::job(&job_id, h.rec.timeline.attrs.as_deref());
                out.push(sw.change(now, &subject, c));
            }
        }
        out
    }
}
