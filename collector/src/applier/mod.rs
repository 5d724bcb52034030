//! The applier: one thread (the committer) that owns all writes, a maintenance thread and the stream's flush
//! thread beside it.
//!
//! - [`commit`]: drains the ingest channel into group commits (many batches, from many streams, in one synced
//!   log append: all an ack waits for), filters duplicates, rejects new events of a job that already holds
//!   `store.max_events_per_job`, applies the new events to the job index after they are durable, and answers
//!   each batch.
//! - [`checkpoint`]: periodically (and at shutdown) the committer takes the jobs changed since the last
//!   checkpoint and hands them to the maintenance thread, which writes their snapshots off the commit path,
//!   then does the log's upkeep (`Store::maintain_log`: segments retention emptied deleted or rewritten, one
//!   sealed segment compacted into large blocks; also after each fold pass).
//! - [`fold`]: periodically the maintenance thread folds ended, settled jobs out of memory (a summary listing their log entries).
//! - [`retention`]: deletes jobs that ended longer ago than `store.retention`.
//! - [`deadlines`]: SLO deadlines the alert loop saw pass, applied to the index (and the stream), and the SLO
//!   windows pruned.
//! - [`stream`]: the stream out's writer: cursors, records built after the acks, written and flushed by its
//!   own thread, published once durable, repaired from the log after a crash or a failed write.
//! - [`estimates`]: a thread that estimates every waiting job's start now and then, off the commit path, and
//!   posts the moved estimates for the stream (the committer writes them).
//! - [`health`]: node agents' GPU health readings, stored and added to the node health book (beside the
//!   committer: they are not lifecycle events).
//!
//! Durability rules kept here (the store's module doc states the checkpoint invariant they serve):
//! - one checkpoint at a time: a new one is taken only after the previous one finished, and one that fails
//!   hands its jobs back to the dirty set, so no marker ever covers a snapshot that was not written;
//! - checkpoints and folds run one after the other on the maintenance thread, and retention's deletes exclude
//!   both (`store_writes`), so a snapshot encoded before a job expired or folded is never written back after;
//! - a failed storage write answers every batch of the group with an error naming the cause and halts every
//!   later write (`crate::health::WriteHalt`): sled may block for ever on an I/O that failed, so nothing touches
//!   it again; later groups are answered at once with the same cause, and [`halt`] restarts the process once the
//!   store's file system is writable again. Everything acknowledged is in the log's synced files.
//! - [`halt`]: the watch that restarts the process after a halt.

mod checkpoint;
mod commit;
mod deadlines;
mod estimates;
pub mod fold;
pub mod halt;
pub mod health;
pub mod history;
mod retention;

/// How often the committer checks folded rows against their budget (`store.folded_budget_mib`).
const TRIM_EVERY: Duration = Duration::from_millis(if cfg!(test) { 10 } else { 1000 });
mod stream;
#[cfg(test)]
mod tests;

use crate::health::{Health, IngestStats};
use crate::index::SharedIndex;
use crate::job::CompactEvent;
use crate::store::{Store, StoreError};
use checkpoint::Checkpoint;
use fold::FoldPass;
use history::SealPass;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// Hash of the event's `source` (see [`crate::index::SourceMarks`]): tells a source replaying a backlog from
    /// a live one.
    pub source: u64,
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
    /// Set when the whole batch was refused, nothing of it stored: it would have taken its identity past its
    /// open-jobs budget ([`Owner`]). The reason, for the client (`RESOURCE_EXHAUSTED`).
    pub refused: Option<String>,
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
    /// The identity that sent it, when it has an open-jobs budget: jobs the batch opens count against it
    /// ([`crate::health::OpenJobs`]), and a batch that would take it past its budget is refused whole.
    pub owner: Option<Owner>,
}

/// An identity with an open-jobs budget, as a batch's owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The identity's name.
    pub name: Arc<str>,
    /// Most jobs open at once counted against it (at least 1).
    pub max_open_jobs: u64,
}

/// Settings of the committer.
#[derive(Clone)]
pub struct CommitterSettings {
    /// Most events per group commit.
    pub group_max_events: usize,
    /// How often to checkpoint job snapshots.
    pub checkpoint_interval: Duration,
    /// The clock SLO assessments use.
    pub clock: crate::time::Clock,
    /// Woken after each commit so the alert loop re-reads deadlines and page changes.
    pub wake: Arc<tokio::sync::Notify>,
    /// Metrics, when enabled.
    pub telemetry: Option<Arc<dyn crate::index::footprint::MetricsSink>>,
    /// Ended jobs older than this are deleted (None: keep forever).
    pub retention: Option<Duration>,
    /// How often expired jobs are looked for.
    pub retention_interval: Duration,
    /// Most events stored per job: later new events of a job that has this many are rejected.
    pub max_events_per_job: usize,
    /// Where accepted events go after each group commit (nothing is built while nobody subscribes).
    pub feed: Arc<crate::feed::Feed>,
    /// Ended jobs unchanged for this long are folded out of memory (None: never fold).
    pub fold_after: Option<Duration>,
    /// How often fold candidates are looked for.
    pub fold_interval: Duration,
    /// The stream out, when kept (`[stream] enabled`).
    pub stream: Option<Arc<crate::stream::Stream>>,
    /// The alert loop's requests to advance the SLO deadline index.
    pub deadlines: Arc<crate::index::deadlines::DeadlineRequests>,
    /// `[history]`: ended jobs sealed into Parquet files by day (None: no history files).
    pub history: Option<history::HistorySettings>,
    /// What the seal passes did.
    pub seal_stats: Arc<crate::store::history::SealStats>,
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
    // What the store holds at open was read from disk: durable, so readable by subscribers from the start (the
    // writer's repair, on the committer thread, only adds after it).
    if let (Some(s), Ok(Some((_, last)))) = (&settings.stream, store.stream_bounds()) {
        s.durable.fetch_max(last, Ordering::AcqRel);
    }
    std::thread::Builder::new().name("startline-committer".into()).spawn(move || {
        let stream = settings.stream.clone().and_then(|s| {
            match stream::StreamWriter::open(&store, &index, s, settings.clock.now_ms()) {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::error!(error = %e, "cannot open the stream; it is not kept until a restart");
                    None
                }
            }
        });
        let history = settings.history.and_then(|_| match crate::store::history::History::open(store.path()) {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::error!(error = %e, "cannot open the history directory; no history files until a restart");
                None
            }
        });
        Committer {
            stream,
            history,
            seal_busy: Arc::new(AtomicBool::new(false)),
            runtime,
            store,
            index,
            settings,
            stats,
            health,
            checkpoint_busy: Arc::new(AtomicBool::new(false)),
            checkpoint_took_ms: Arc::new(AtomicU64::new(0)),
            fold_busy: Arc::new(AtomicBool::new(false)),
            fold_more: Arc::new(AtomicBool::new(false)),
            fold_over_budget: Arc::new(AtomicBool::new(false)),
            fixed_over_budget: AtomicBool::new(false),
            stopping: Arc::new(AtomicBool::new(false)),
            store_writes: Arc::new(Mutex::new(())),
            write_failed: std::cell::Cell::new(false),
            used_seq: std::cell::Cell::new(0),
        }
        .run(rx)
    })
}

/// The committer's state (see the module doc).
struct Committer {
    /// The stream's writer, when the stream is kept.
    stream: Option<stream::StreamWriter>,
    /// The history files' directory, with `[history]`.
    history: Option<crate::store::history::History>,
    /// Set while a seal pass is queued or running.
    seal_busy: Arc<AtomicBool>,
    runtime: tokio::runtime::Handle,
    store: Store,
    index: SharedIndex,
    settings: CommitterSettings,
    stats: Arc<IngestStats>,
    health: Arc<Health>,
    /// Set while a checkpoint is queued or being written: the next one waits for it.
    checkpoint_busy: Arc<AtomicBool>,
    /// How long the last checkpoint took to write, milliseconds (see [`checkpoint_every`]).
    checkpoint_took_ms: Arc<AtomicU64>,
    /// Set while a fold pass is queued or running.
    fold_busy: Arc<AtomicBool>,
    /// Set by a fold pass that ran out of its time budget with jobs left to fold.
    fold_more: Arc<AtomicBool>,
    /// Whether the last fold pass found hot jobs over their memory budget.
    fold_over_budget: Arc<AtomicBool>,
    /// Whether the folded rows' fixed share (node names, dictionary slots) was found to fill their budget (logged
    /// once).
    fixed_over_budget: AtomicBool,
    /// Set at shutdown, so a running fold pass stops after its chunk.
    stopping: Arc<AtomicBool>,
    /// Held by the checkpointer while it encodes and writes a chunk, and by retention while it deletes.
    store_writes: Arc<Mutex<()>>,
    /// A write failed since start: the store may hold what memory does not (blocks of failed groups), which only
    /// a start that reads the summaries and the log sorts out, so the stop writes no shutdown image.
    write_failed: std::cell::Cell<bool>,
    /// The last log sequence any write used, acknowledged or not. A failed group commit's sequences are never
    /// handed out again: sled may have kept some of its blocks, and a later block starting inside that range
    /// would leave a stale block in front of acknowledged events (blocks must never overlap).
    used_seq: std::cell::Cell<u64>,
}

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
        // One checkpoint (and one fold pass) at a time: the busy flag is set when one is handed over and cleared
        // when it is done, and none is taken meanwhile (the dirty set simply grows until the next interval).
        let (task_tx, task_rx) = std::sync::mpsc::sync_channel::<Task>(2);
        let store = self.store.clone();
        let maintenance = std::thread::Builder::new().name("startline-maintenance".into()).spawn(move || {
            for task in task_rx {
                task.run(&store);
            }
        });
        let maintenance = match maintenance {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the maintenance thread; checkpoints and folds run inline");
                None
            }
        };
        let estimates = self.spawn_estimates();
        let mut last_checkpoint = Instant::now();
        let mut last_retention = Instant::now();
        let mut last_fold = Instant::now();
        let mut last_prune = Instant::now();
        let mut last_trim = Instant::now();
        // The first seal pass runs soon after the start (days that ended while the collector was down).
        let mut last_seal: Option<Instant> = None;
        loop {
            // Wake at least every retention and fold interval, so expiry and folding run on an idle collector.
            let mut wait = self.settings.checkpoint_interval.saturating_sub(last_checkpoint.elapsed());
            if self.settings.retention.is_some() {
                wait = wait.min(self.settings.retention_interval.saturating_sub(last_retention.elapsed()));
            }
            if self.settings.fold_after.is_some() {
                let fold_wait = if self.fold_more.load(Ordering::Acquire) {
                    Duration::from_millis(20)
                } else {
                    self.settings.fold_interval.saturating_sub(last_fold.elapsed())
                };
                wait = wait.min(fold_wait);
            }
            if let Some(h) = self.settings.history {
                wait = wait.min(last_seal.map_or(Duration::ZERO, |l| h.seal_interval.saturating_sub(l.elapsed())));
            }
            let first = match rx.try_recv() {
                Ok(r) => Some(r),
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                // Idle: alert changes waiting for the stream are written first; then a timed wait on the
                // runtime's timer (the committer is a plain thread), which posted alert changes cut short.
                Err(mpsc::error::TryRecvError::Empty) => {
                    if let Some(sw) = self.stream.as_ref().filter(|s| s.has_work()) {
                        sw.idle_write(&self.index, self.settings.clock.now_ms());
                    }
                    let woken = async {
                        match &self.stream {
                            Some(sw) => sw.stream.wake.notified().await,
                            None => std::future::pending().await,
                        }
                    };
                    match self.runtime.block_on(async {
                        tokio::select! {
                            r = tokio::time::timeout(wait, rx.recv()) => r.map_err(|_| ()),
                            _ = woken => Err(()),
                            _ = self.settings.deadlines.requested() => Err(()),
                        }
                    }) {
                        Ok(Some(r)) => Some(r),
                        Ok(None) => break,
                        Err(()) => None,
                    }
                }
            };
            // After a failed write nothing touches the store again (see `halt`): groups are answered with the
            // cause, and the store's upkeep (stream, retention, checkpoints, folds) stops.
            let halted = self.store.halted().is_some();
            if let Some(sw) = self.stream.as_ref().filter(|s| !s.broken()) {
                sw.trim(&self.store, self.settings.clock.now_ms());
            }
            if last_prune.elapsed() >= deadlines::PRUNE_EVERY {
                self.prune_slo_windows();
                last_prune = Instant::now();
            }
            if let Some(retention) = self.settings.retention.filter(|_| !halted) {
                if last_retention.elapsed() >= self.settings.retention_interval {
                    self.expire(retention);
                    last_retention = Instant::now();
                }
            }
            if last_trim.elapsed() >= TRIM_EVERY {
                self.trim_folded();
                last_trim = Instant::now();
            }
            if let Some(first) = first {
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
            }
            // After the group: a deadline the alert loop saw pass is judged on every event that came before it.
            if let Some(to) = self.settings.deadlines.take() {
                self.advance_deadlines(to);
            }
            // A reload's new SLO definitions, installed between group commits by the index's one writer.
            if let Some(swap) = self.settings.deadlines.take_slos() {
                let started = Instant::now();
                self.index.write().replace_slos(swap.defs, self.settings.clock.now_ms());
                let _ = swap.done.send(started.elapsed());
                self.settings.wake.notify_one();
            }
            let checkpoint_every = checkpoint_every(
                self.settings.checkpoint_interval,
                self.fold_more.load(Ordering::Acquire),
                Duration::from_millis(self.checkpoint_took_ms.load(Ordering::Acquire)),
            );
            if !halted && last_checkpoint.elapsed() >= checkpoint_every && !self.checkpoint_busy.load(Ordering::Acquire)
            {
                if let Some(ck) = self.take_checkpoint() {
                    self.checkpoint_busy.store(true, Ordering::Release);
                    match task_tx.try_send(Task::Checkpoint(ck)) {
                        Ok(()) => {}
                        Err(std::sync::mpsc::TrySendError::Full(t)) => t.give_back(),
                        Err(std::sync::mpsc::TrySendError::Disconnected(t)) => t.run(&self.store),
                    }
                }
                last_checkpoint = Instant::now();
            }
            if let Some(after) = self.settings.fold_after.filter(|_| !halted) {
                let due = last_fold.elapsed() >= self.settings.fold_interval || self.fold_more.load(Ordering::Acquire);
                if due && !self.fold_busy.load(Ordering::Acquire) {
                    self.fold_busy.store(true, Ordering::Release);
                    let pass = FoldPass {
                        index: self.index.clone(),
                        health: self.health.clone(),
                        store_writes: self.store_writes.clone(),
                        busy: self.fold_busy.clone(),
                        unchanged_since: self.settings.clock.now_ms() - after.as_millis() as i64,
                        now: self.settings.clock.now_ms(),
                        over_budget: self.fold_over_budget.clone(),
                        more: self.fold_more.clone(),
                        stop: self.stopping.clone(),
                    };
                    match task_tx.try_send(Task::Fold(pass)) {
                        Ok(()) => {}
                        Err(std::sync::mpsc::TrySendError::Full(t)) => t.give_back(),
                        Err(std::sync::mpsc::TrySendError::Disconnected(t)) => t.run(&self.store),
                    }
                    last_fold = Instant::now();
                }
            }
            if let Some(pass) = self.seal_pass(halted, last_seal) {
                // A full queue hands the pass back; it is tried again at the next turn.
                match task_tx.try_send(Task::Seal(pass)) {
                    Ok(()) => last_seal = Some(Instant::now()),
                    Err(std::sync::mpsc::TrySendError::Full(t)) => t.give_back(),
                    Err(std::sync::mpsc::TrySendError::Disconnected(t)) => {
                        t.run(&self.store);
                        last_seal = Some(Instant::now());
                    }
                }
            }
        }
        // A reload waiting for an SLO swap is told it will not happen.
        drop(self.settings.deadlines.take_slos());
        // The estimate sweep stops after its chunk (it only reads the index).
        if let Some((stop, h)) = estimates {
            drop(stop);
            if !join_within(h, HALTED_JOIN_WAIT) {
                tracing::warn!("estimate sweep did not stop in time; left behind");
            }
        }
        if let Some(cause) = self.store.halted() {
            // Nothing more can be written, and the maintenance and stream threads may be waiting in sled for ever:
            // they are not waited for. Everything acknowledged is in the log's synced files.
            self.stopping.store(true, Ordering::Release);
            drop(task_tx);
            if let Some(h) = maintenance {
                if !join_within(h, HALTED_JOIN_WAIT) {
                    tracing::warn!("maintenance thread still in a store call after writes halted; left behind");
                }
            }
            if let Some(sw) = &self.stream {
                sw.finish();
                sw.stream.hub.close();
            }
            tracing::warn!(cause, "committer stopped without a final checkpoint: store writes are halted");
            return;
        }
        // Final checkpoint: after the tasks in progress (a fold pass stops after its chunk; a failed checkpoint
        // hands its jobs back), then flush.
        self.stopping.store(true, Ordering::Release);
        drop(task_tx);
        if let Some(h) = maintenance {
            if h.join().is_err() {
                tracing::error!("maintenance thread panicked");
            }
        }
        if let Some(mut ck) = self.take_checkpoint() {
            ck.allow_base = false;
            ck.write(&self.store);
        }
        if let Some(sw) = &self.stream {
            sw.idle_write(&self.index, self.settings.clock.now_ms());
            sw.finish();
            sw.stream.hub.close();
        }
        match self.store.flush() {
            Err(e) => tracing::error!(error = %e, "final flush failed"),
            Ok(()) => self.write_shutdown_image(),
        }
        tracing::info!("committer stopped");
    }

    /// The estimate sweep's thread (see [`estimates`]), with the stream and a nonzero `expected_start_interval`:
    /// its stop (drop it) and handle.
    fn spawn_estimates(&self) -> Option<(std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>)> {
        let sw = self.stream.as_ref()?;
        let every = sw.stream.settings.expected_start_interval;
        if every.is_zero() {
            return None;
        }
        let (stop, stopped) = std::sync::mpsc::channel();
        match estimates::spawn(self.index.clone(), sw.stream.clone(), self.settings.clock, every, stopped) {
            Ok(h) => Some((stop, h)),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the estimate sweep; the stream carries no expected starts");
                None
            }
        }
    }

    /// A seal pass, when `[history]` is on, one is due and none is running (and store writes are not halted).
    fn seal_pass(&self, halted: bool, last: Option<Instant>) -> Option<SealPass> {
        let settings = self.settings.history?;
        let history = self.history.as_ref()?;
        let due = last.is_none_or(|l| l.elapsed() >= settings.seal_interval);
        if halted || !due || self.seal_busy.load(Ordering::Acquire) {
            return None;
        }
        self.seal_busy.store(true, Ordering::Release);
        Some(SealPass {
            index: self.index.clone(),
            history: history.clone(),
            settings,
            retention: self.settings.retention,
            folding: self.settings.fold_after.is_some(),
            now: self.settings.clock.now_ms(),
            busy: self.seal_busy.clone(),
            stop: self.stopping.clone(),
            stats: self.settings.seal_stats.clone(),
            collect_max: history::COLLECT_MAX,
        })
    }

    /// Writes the shutdown image (the folded rows, for the next start to read instead of every summary: see
    /// `store::image`). Nothing the image covers (summaries, snapshots, the log) is written after it. None after a
    /// failed write, or when retention could not delete jobs it dropped from memory (the next start must find
    /// them in the summaries to delete them again).
    fn write_shutdown_image(&self) {
        if self.write_failed.get() || self.store.bases_held() {
            tracing::info!(
                "no shutdown image (a store write failed while running): the next start reads the summaries"
            );
            return;
        }
        let started = Instant::now();
        let idx = self.index.read();
        let rows = idx.cold.rows.len();
        match self.store.write_shutdown_image(|w| idx.cold.write_image(&idx.stale_summaries, w)) {
            Ok(()) => tracing::info!(
                folded = rows,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "shutdown image written"
            ),
            Err(e) => tracing::warn!(error = %e, "shutdown image not written; the next start reads the summaries"),
        }
    }

    /// A store write failed with `e`: see [`write_failed`]; the stop writes no shutdown image.
    fn write_failed(&self, e: &StoreError) {
        self.write_failed.set(true);
        write_failed(&self.store, &self.health, e);
    }
}

/// How long a stop waits for a thread that may be in a store call once store writes are halted.
pub(crate) const HALTED_JOIN_WAIT: Duration = Duration::from_secs(2);

/// Joins `h` if it ends within `wait` (true); otherwise leaves it running (false): after writes halted, a thread
/// may wait in sled for ever, and the process restarts or exits without it.
pub(crate) fn join_within(h: std::thread::JoinHandle<()>, wait: Duration) -> bool {
    let until = Instant::now() + wait;
    while !h.is_finished() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    if !h.is_finished() {
        return false;
    }
    if h.join().is_err() {
        tracing::error!("a store thread panicked");
    }
    true
}

/// A store write failed with `e`: health counts it and reports its cause, and an I/O failure halts every later
/// write (see `crate::health::WriteHalt`; [`halt`] restarts the process once the store is writable again).
pub(crate) fn write_failed(store: &Store, health: &Health, e: &StoreError) {
    health.storage_failed(e.cause());
    store.halt_after(e);
}

/// Work for the maintenance thread.
/// How long after handing a checkpoint over the next one is due. Normally every `interval`. While folding has a
/// backlog, less often: at least 4 intervals, and at least twice as long as the last checkpoint took to write,
/// so that fold passes get at least as much of the maintenance thread as checkpoints. Checkpoints write the
/// snapshots of every job changed since the last one, settled ended jobs included, so when they run back to back
/// they crowd folding out: in a 10M-job replay (BENCHMARKS.md, run 15) checkpoints of 60-100k jobs took 9-17 s each and ran
/// one after the other, a 2 s fold pass between them folded ~700 jobs/s while ~1,700 ended, and the hot jobs grew
/// past a million (RSS 7.6 GB at 22%). Jobs folded in the meantime drop out of the next checkpoint (it writes
/// only jobs still in memory), so giving folds the time also shrinks the checkpoints.
fn checkpoint_every(interval: Duration, fold_backlog: bool, last_took: Duration) -> Duration {
    if fold_backlog {
        (interval * 4).max(last_took * 2)
    } else {
        interval
    }
}

/// The log's upkeep rides on the maintenance thread's turns (after each checkpoint and fold pass): segments
/// retention emptied are deleted or rewritten, and at most one sealed segment is compacted per turn.
fn log_upkeep(store: &Store) {
    if let Err(e) = store.maintain_log() {
        tracing::warn!(error = %e, "log upkeep failed; trying again at the next checkpoint or fold pass");
    }
}

enum Task {
    Checkpoint(Checkpoint),
    Fold(FoldPass),
    Seal(SealPass),
}

impl Task {
    fn run(self, store: &Store) {
        match self {
            Task::Checkpoint(ck) => {
                ck.write(store);
                log_upkeep(store);
            }
            Task::Fold(f) => {
                f.run(store);
                log_upkeep(store);
            }
            Task::Seal(p) => {
                // Failures are logged and counted by the pass; the next one tries again.
                let _ = p.run();
            }
        }
    }

    /// Not handed over: a checkpoint returns its jobs to the dirty set; a fold pass is simply skipped.
    fn give_back(self) {
        match self {
            Task::Checkpoint(ck) => ck.give_back(),
            Task::Fold(f) => f.busy.store(false, Ordering::Release),
            Task::Seal(p) => p.busy.store(false, Ordering::Release),
        }
    }
}
