//! The committer: one thread that owns all writes. It drains the ingest channel into group commits (many
//! batches, from many streams, in one sled batch and one flush), filters duplicates, rejects new events of a job
//! that already holds `store.max_events_per_job`, applies the new events to the job index after they are
//! durable, and answers each batch. Periodically (and at shutdown) it copies the
//! jobs changed since the last checkpoint and hands them to the checkpointer thread, which encodes and writes
//! the snapshots off the commit path, so checkpoints never stall acknowledgements.
//!
//! Durability rules kept here (the store's module doc states the checkpoint invariant they serve):
//! - one checkpoint at a time: a new one is taken only after the previous one finished, and one that fails
//!   hands its jobs back to the dirty set, so no marker ever covers a snapshot that was not written;
//! - retention's deletes and the checkpointer's snapshot writes exclude each other, so a snapshot encoded
//!   before a job expired is never written back after the job's deletion;
//! - a failed storage write answers every batch of the group with an error naming the cause, marks the
//!   collector unhealthy, and the next group tries again (reopening the store if sled has given up), so ingest
//!   resumes by itself when space returns.

use super::IngestStats;
use crate::health::Health;
use crate::job::{CompactEvent, JobRecord};
use crate::state::{on_job_changed, SharedIndex};
use crate::store::{Store, StoreError};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// A validated event ready to store.
#[derive(Debug)]
pub struct PreparedEvent {
    /// The job id.
    pub job_id: String,
    /// The event id (the idempotency key within the job).
    pub event_id: String,
    /// The compact form (its `seq` is assigned at commit).
    pub compact: CompactEvent,
    /// The log value (version byte + protobuf).
    pub encoded: Vec<u8>,
}

/// The committer's answer for one batch.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommitResult {
    /// Stored for the first time.
    pub accepted: u32,
    /// Already stored.
    pub duplicates: u32,
    /// Not stored, and why (the job reached `store.max_events_per_job`).
    pub rejections: Vec<CommitRejection>,
}

/// An event of a batch that the committer did not store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitRejection {
    /// The event's position in [`CommitRequest::events`].
    pub index: usize,
    /// The event's id.
    pub event_id: String,
    /// The field the reason is about.
    pub field: &'static str,
    /// Why it was not stored.
    pub reason: String,
}

/// The store failed; nothing of the batch is acknowledged.
#[derive(Debug, Clone, thiserror::Error)]
#[error("storage unavailable: {cause}")]
pub struct CommitError {
    /// The cause, safe to show a client ("no space left on device").
    pub cause: &'static str,
}

/// One batch handed to the committer.
#[derive(Debug)]
pub struct CommitRequest {
    /// The valid events of the batch.
    pub events: Vec<PreparedEvent>,
    /// Where the answer goes, after the events are durable.
    pub reply: oneshot::Sender<Result<CommitResult, CommitError>>,
}

/// Settings of the committer.
#[derive(Clone)]
pub struct CommitterSettings {
    /// Most events per group commit.
    pub group_max_events: usize,
    /// How often to checkpoint job snapshots.
    pub checkpoint_interval: Duration,
    /// The clock SLO assessments use.
    pub clock: crate::clock::Clock,
    /// Woken after each commit so the alert loop re-reads deadlines and page changes.
    pub wake: Arc<tokio::sync::Notify>,
    /// Metrics, when enabled.
    pub telemetry: Option<Arc<crate::export::Telemetry>>,
    /// Ended jobs older than this are deleted (None: keep forever).
    pub retention: Option<Duration>,
    /// How often expired jobs are looked for.
    pub retention_interval: Duration,
    /// Most events stored per job: later new events of a job that has this many are rejected.
    pub max_events_per_job: usize,
}

/// Starts the committer thread (call it within the tokio runtime: the thread borrows its timer). It runs until
/// every sender of `rx` is dropped, then drains, checkpoints, flushes and returns.
pub fn spawn(
    store: Store,
    index: SharedIndex,
    rx: mpsc::Receiver<CommitRequest>,
    settings: CommitterSettings,
    stats: Arc<IngestStats>,
    health: Arc<Health>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let runtime = tokio::runtime::Handle::current();
    std::thread::Builder::new().name("startline-committer".into()).spawn(move || {
        Committer {
            runtime,
            store,
            index,
            settings,
            stats,
            health,
            checkpoint_busy: Arc::new(AtomicBool::new(false)),
            store_writes: Arc::new(Mutex::new(())),
            last_reopen: std::cell::Cell::new(None),
        }
        .run(rx)
    })
}

struct Committer {
    runtime: tokio::runtime::Handle,
    store: Store,
    index: SharedIndex,
    settings: CommitterSettings,
    stats: Arc<IngestStats>,
    health: Arc<Health>,
    /// Set while a checkpoint is queued or being written: the next one waits for it.
    checkpoint_busy: Arc<AtomicBool>,
    /// Held by the checkpointer while it encodes and writes a chunk, and by retention while it deletes.
    store_writes: Arc<Mutex<()>>,
    /// When the store was last reopened after a failure (reopens are at most once per [`REOPEN_BACKOFF`]).
    last_reopen: std::cell::Cell<Option<Instant>>,
}

/// Records with more events than this are copied under the index lock and encoded outside it at checkpoints.
const ENCODE_UNDER_LOCK_MAX_EVENTS: usize = 1024;

/// The least time between two reopens of a failing store.
const REOPEN_BACKOFF: Duration = Duration::from_millis(500);

impl Committer {
    fn run(self, mut rx: mpsc::Receiver<CommitRequest>) {
        // Should this thread ever panic, health and readiness must say so (clients would only see UNAVAILABLE).
        struct Unhealthy(Arc<Health>);
        impl Drop for Unhealthy {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0.committer_died();
                    tracing::error!("committer panicked; the collector is unhealthy");
                }
            }
        }
        let _guard = Unhealthy(self.health.clone());
        // One checkpoint at a time: `checkpoint_busy` is set when one is handed over and cleared when it is done,
        // and none is taken meanwhile (the dirty set simply grows until the next interval).
        let (ck_tx, ck_rx) = std::sync::mpsc::sync_channel::<Checkpoint>(1);
        let store = self.store.clone();
        let checkpointer = std::thread::Builder::new().name("startline-checkpointer".into()).spawn(move || {
            for ck in ck_rx {
                ck.write(&store);
            }
        });
        let checkpointer = match checkpointer {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::error!(error = %e, "cannot start checkpointer thread; checkpoints run inline");
                None
            }
        };
        let mut last_checkpoint = Instant::now();
        let mut last_retention = Instant::now();
        loop {
            // Wake at least every retention interval, so expiry runs on an idle collector too.
            let first = match self.settings.retention {
                Some(_) => {
                    let wait = self.settings.retention_interval.saturating_sub(last_retention.elapsed());
                    match rx.try_recv() {
                        Ok(r) => Some(r),
                        Err(mpsc::error::TryRecvError::Disconnected) => break,
                        // Idle: a timed wait on the runtime's timer (the committer is a plain thread).
                        Err(mpsc::error::TryRecvError::Empty) => {
                            match self.runtime.block_on(async { tokio::time::timeout(wait, rx.recv()).await }) {
                                Ok(Some(r)) => Some(r),
                                Ok(None) => break,
                                Err(_) => None,
                            }
                        }
                    }
                }
                None => match rx.blocking_recv() {
                    Some(r) => Some(r),
                    None => break,
                },
            };
            if let Some(retention) = self.settings.retention {
                if last_retention.elapsed() >= self.settings.retention_interval {
                    self.expire(retention);
                    last_retention = Instant::now();
                }
            }
            let Some(first) = first else { continue };
            let mut group = vec![first];
            let mut n = group[0].events.len();
            while n < self.settings.group_max_events {
                match rx.try_recv() {
                    Ok(req) => {
                        n += req.events.len();
                        group.push(req);
                    }
                    Err(_) => break,
                }
            }
            self.commit_group(group);
            if last_checkpoint.elapsed() >= self.settings.checkpoint_interval
                && !self.checkpoint_busy.load(Ordering::Acquire)
            {
                if let Some(ck) = self.take_checkpoint() {
                    self.checkpoint_busy.store(true, Ordering::Release);
                    match ck_tx.try_send(ck) {
                        Ok(()) => {}
                        Err(std::sync::mpsc::TrySendError::Full(ck)) => ck.give_back(),
                        Err(std::sync::mpsc::TrySendError::Disconnected(ck)) => ck.write(&self.store),
                    }
                }
                last_checkpoint = Instant::now();
            }
        }
        // Final checkpoint: after the one in progress (which hands its jobs back if it failed), then flush.
        drop(ck_tx);
        if let Some(h) = checkpointer {
            if h.join().is_err() {
                tracing::error!("checkpointer thread panicked");
            }
        }
        if let Some(ck) = self.take_checkpoint() {
            ck.write(&self.store);
        }
        if let Err(e) = self.store.flush() {
            tracing::error!(error = %e, "final flush failed");
        }
        tracing::info!("committer stopped");
    }

    /// Deletes jobs that ended more than `retention` ago: from the index (with their SLO contributions and metric
    /// footprints) and from the store (log entries and snapshot). Works in chunks so the write lock stays short.
    fn expire(&self, retention: Duration) {
        let cutoff = self.settings.clock.now_ms() - retention.as_millis() as i64;
        let mut expired: Vec<String> = Vec::new();
        self.index.for_each_job(4096, |id, rec| {
            if rec.timeline.done_at.is_some_and(|d| d < cutoff) {
                expired.push(id.to_string());
            }
        });
        if expired.is_empty() {
            return;
        }
        for chunk in expired.chunks(1000) {
            // No checkpoint chunk may be between encoding and writing a snapshot of these jobs while they go.
            let _writes = self.store_writes.lock().unwrap_or_else(|p| p.into_inner());
            let mut removed = Vec::with_capacity(chunk.len());
            {
                let mut idx = self.index.write();
                let crate::state::JobIndex { jobs, dirty, slo, gauges, .. } = &mut *idx;
                for id in chunk {
                    if let Some(mut rec) = jobs.remove(id) {
                        slo.forget(id, &mut rec);
                        gauges.update(id, rec.metrics.as_ref(), None, &rec.timeline, true);
                        dirty.remove(id);
                        removed.push((id.clone(), rec.events.iter().map(|e| e.seq).collect::<Vec<_>>()));
                    }
                }
            }
            if let Err(e) = self.store.delete_jobs(&removed) {
                // Gone from memory, not from disk: a restart brings them back and the next pass deletes them.
                tracing::error!(error = %e, "retention: cannot delete expired jobs from the store");
                self.health.storage_failed(e.cause());
                return;
            }
        }
        tracing::info!(jobs = expired.len(), "retention: expired jobs deleted");
    }

    /// The cause to report for a store error: while the store is closed for a reopen, the failure that closed it.
    fn cause_of(&self, e: &StoreError) -> &'static str {
        match e {
            StoreError::Closed => self.health.last_cause().unwrap_or(e.cause()),
            _ => e.cause(),
        }
    }

    /// After a failed write: sled refuses every later write once it has seen an I/O error, so the store is
    /// reopened (at most once per [`REOPEN_BACKOFF`]); the next group then finds out whether the cause is gone.
    /// The in-memory index is unaffected: it holds only acknowledged events, and those were flushed.
    fn recover_store(&self) {
        if self.last_reopen.get().is_some_and(|t| t.elapsed() < REOPEN_BACKOFF) {
            return;
        }
        self.last_reopen.set(Some(Instant::now()));
        match self.store.reopen() {
            Ok(()) => {
                self.health.reopened();
                tracing::warn!("store reopened after a write failure");
            }
            Err(e) => tracing::warn!(error = %e, "store reopen failed; trying again with a later batch"),
        }
    }

    /// Takes the set of jobs changed since the last checkpoint, with the log position the checkpoint will cover.
    /// Cheap: the snapshots are encoded later, by the checkpointer, under short read locks.
    fn take_checkpoint(&self) -> Option<Checkpoint> {
        let mut idx = self.index.write();
        if idx.dirty.is_empty() {
            return None;
        }
        Some(Checkpoint {
            dirty: std::mem::take(&mut idx.dirty),
            through_seq: idx.last_seq,
            index: self.index.clone(),
            health: self.health.clone(),
            busy: self.checkpoint_busy.clone(),
            store_writes: self.store_writes.clone(),
        })
    }

    /// Is this event already stored? Confirms each hash match against the logged event id (distinct ids may
    /// share a hash).
    fn is_stored(&self, job_id: &str, event_id: &str, id_hash: u64) -> Result<bool, StoreError> {
        let seqs: Vec<u64> =
            self.index.read().jobs.get(job_id).map(|r| r.seqs_of_hash(id_hash).collect()).unwrap_or_default();
        for seq in seqs {
            if self.store.event(seq)?.is_some_and(|e| e.event_id == event_id) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Would storing one more event of `job_id` pass the per-job cap, counting the events of this group already
    /// let through (`incoming`)? If so, counts it.
    fn take_job_room<'a>(&self, job_id: &'a str, incoming: &mut HashMap<&'a str, usize>) -> bool {
        let stored = self.index.read().jobs.get(job_id).map_or(0, |r| r.events.len());
        let n = incoming.entry(job_id).or_insert(0);
        if stored + *n >= self.settings.max_events_per_job {
            return false;
        }
        *n += 1;
        true
    }

    fn commit_group(&self, mut group: Vec<CommitRequest>) {
        let started = Instant::now();
        let mut results = vec![CommitResult::default(); group.len()];
        // Per request, per event: is it new?
        let mut fresh: Vec<Vec<bool>> = Vec::with_capacity(group.len());
        let mut failed: Option<&'static str> = None;
        {
            let mut seen: HashSet<(&str, &str)> = HashSet::new();
            // New events of this group per job, for the per-job cap.
            let mut incoming: HashMap<&str, usize> = HashMap::new();
            for (ri, req) in group.iter().enumerate() {
                let mut flags = Vec::with_capacity(req.events.len());
                for (ei, ev) in req.events.iter().enumerate() {
                    let dup = !seen.insert((ev.job_id.as_str(), ev.event_id.as_str()))
                        || match self.is_stored(&ev.job_id, &ev.event_id, ev.compact.id_hash) {
                            Ok(d) => d,
                            Err(e) => {
                                tracing::error!(error = %e, "duplicate check failed");
                                failed = Some(self.cause_of(&e));
                                false
                            }
                        };
                    // A duplicate is answered as one even when its job is full; a new event of a full job is not
                    // stored (and a later copy of it in this group is not a duplicate).
                    let capped = !dup && !self.take_job_room(&ev.job_id, &mut incoming);
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
        let first_seq = self.index.read().last_seq + 1;
        let mut entries: Vec<(u64, Vec<u8>)> = Vec::new();
        for (req, flags) in group.iter_mut().zip(&fresh) {
            for (ev, _) in req.events.iter_mut().zip(flags).filter(|(_, f)| **f) {
                entries.push((first_seq + entries.len() as u64, std::mem::take(&mut ev.encoded)));
            }
        }
        if failed.is_none() && !entries.is_empty() {
            if let Err(e) = self.store.append_durable(&entries) {
                tracing::error!(error = %e, "group commit failed; batches are not acknowledged");
                failed = Some(self.cause_of(&e));
            }
        }
        if let Some(cause) = failed {
            self.health.storage_failed(cause);
            for req in group {
                let _ = req.reply.send(Err(CommitError { cause }));
            }
            self.recover_store();
            return;
        }
        self.health.storage_ok();
        // Durable: now visible.
        let accepted = entries.len() as u64;
        drop(entries);
        let mut replies = Vec::with_capacity(group.len());
        let mut observations = Vec::new();
        {
            let now = self.settings.clock.now_ms();
            let mut idx = self.index.write();
            let crate::state::JobIndex { jobs, dirty, last_seq, slo, gauges, limiter } = &mut *idx;
            let mut seq = first_seq;
            for ((req, flags), res) in group.into_iter().zip(fresh).zip(&results) {
                for (ev, _) in req.events.into_iter().zip(flags).filter(|(_, f)| *f) {
                    let mut compact = ev.compact;
                    compact.seq = seq;
                    let obs = if let Some(rec) = jobs.get_mut(&ev.job_id) {
                        rec.insert_unchecked(compact);
                        on_job_changed(slo, gauges, limiter, &ev.job_id, rec, now)
                    } else {
                        let rec =
                            jobs.entry(ev.job_id.clone()).or_insert_with(|| JobRecord::from_events(vec![compact]));
                        on_job_changed(slo, gauges, limiter, &ev.job_id, rec, now)
                    };
                    observations.extend(obs);
                    dirty.insert(ev.job_id);
                    *last_seq = seq;
                    seq += 1;
                }
                replies.push((req.reply, res.clone()));
            }
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
    }
}

/// The jobs to snapshot so that the store covers the log through `through_seq`.
struct Checkpoint {
    dirty: std::collections::HashSet<String>,
    through_seq: u64,
    index: SharedIndex,
    health: Arc<Health>,
    /// Cleared when this checkpoint is done (written, or failed and handed back).
    busy: Arc<AtomicBool>,
    /// Excludes retention's deletes while a chunk is encoded and written.
    store_writes: Arc<Mutex<()>>,
}

impl Checkpoint {
    /// Returns the jobs to the dirty set without writing anything: the next checkpoint covers them.
    fn give_back(self) {
        self.index.write().dirty.extend(self.dirty);
        self.busy.store(false, Ordering::Release);
    }

    /// Encodes the jobs' current records (at least as new as `through_seq`; newer is harmless because restore
    /// skips log entries a snapshot holds) in small chunks under short read locks, writes and flushes them, then
    /// the marker. On failure nothing moves the marker and the jobs go back to the dirty set.
    fn write(self, store: &Store) {
        let started = Instant::now();
        let n = self.dirty.len();
        let ids: Vec<&String> = self.dirty.iter().collect();
        let mut result = Ok(());
        for chunk in ids.chunks(crate::store::SNAPSHOT_CHUNK) {
            let _writes = self.store_writes.lock().unwrap_or_else(|p| p.into_inner());
            // Small records are encoded under the read lock; a large one is copied under it and encoded after,
            // so a job with a long history holds the committer off for a copy, not for an encoding.
            let mut large: Vec<(&str, Vec<crate::job::CompactEvent>)> = Vec::new();
            let encoded: Result<Vec<_>, StoreError> = {
                let idx = self.index.read();
                chunk
                    .iter()
                    .filter_map(|id| {
                        let r = idx.jobs.get(id.as_str())?;
                        if r.events.len() > ENCODE_UNDER_LOCK_MAX_EVENTS {
                            large.push((id.as_str(), r.events.clone()));
                            return None;
                        }
                        Some(crate::store::encode_snapshot_events(id, &r.events))
                    })
                    .collect()
            };
            let encoded = encoded.and_then(|mut e| {
                for (id, events) in &large {
                    e.push(crate::store::encode_snapshot_events(id, events)?);
                }
                Ok(e)
            });
            result = encoded.and_then(|e| store.write_snapshots(e));
            if result.is_err() {
                break;
            }
        }
        let result = result.and_then(|()| store.finish_checkpoint(self.through_seq));
        match result {
            Ok(()) => {
                tracing::debug!(
                    jobs = n,
                    through_seq = self.through_seq,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "checkpoint written"
                );
                self.busy.store(false, Ordering::Release);
            }
            Err(e) => {
                tracing::error!(error = %e, "checkpoint failed; its jobs wait for the next one");
                self.health.storage_failed(e.cause());
                self.give_back();
            }
        }
    }
}
