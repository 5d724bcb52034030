//! The stream's writer, owned by the committer (the one place cursors are assigned). A group commit's event
//! records are written (unflushed) once its log append is durable, its job changes after the index applied the
//! group, alert changes posted by the alert loop join the next write; then the records go to the [`Flusher`], a
//! thread that flushes sled off the commit path (an ack waits for the log's sync only) and publishes records to
//! live subscribers once a flush made them durable. Also trims the stream to its retention and, at start or after a
//! store failure, repairs what a crash lost: event records from the log, resync records for jobs whose change
//! records are gone (see the `stream` module doc for the contract).

use crate::index::SharedIndex;
use crate::job::EventKind;
use crate::store::{Store, StoreError};
use crate::stream::{self, JobView, Rec, Stream, Subject};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Records trimmed per store call.
const TRIM_CHUNK: usize = 10_000;
/// Most log entries the repair adds (a crash leaves out at most the records of the flushes in flight; a store
/// failure, those of the groups acknowledged until writes halted).
const REPAIR_MAX: u64 = 1_000_000;
/// How often the stream is trimmed.
const TRIM_EVERY: Duration = Duration::from_secs(60);

pub(super) struct StreamWriter {
    pub(super) stream: Arc<Stream>,
    /// The next cursor.
    next: Cell<u64>,
    last_trim: Cell<Instant>,
    /// Jobs whose change records could not be written (the stream was broken): resynced by the next repair.
    resync_later: std::cell::RefCell<std::collections::BTreeSet<String>>,
    flusher: Flusher,
}

impl StreamWriter {
    /// Opens the writer: the next cursor follows the newest retained record, event records a crash left out are
    /// added from the log, and jobs whose event records lack their change records get a resync record each.
    pub(super) fn open(
        store: &Store,
        index: &SharedIndex,
        stream: Arc<Stream>,
        now_ms: i64,
    ) -> Result<Self, StoreError> {
        let w = StreamWriter {
            flusher: Flusher::start(store.clone(), stream.clone()),
            stream,
            next: Cell::new(1),
            last_trim: Cell::new(Instant::now()),
            resync_later: Default::default(),
        };
        w.repair(store, index, now_ms)?;
        Ok(w)
    }

    /// Whether a stream write or flush failed, or store writes are halted: nothing more is written (the next
    /// start's repair adds the event records from the log).
    pub(super) fn broken(&self) -> bool {
        self.flusher.failed()
    }

    /// Makes the store's stream whole with its log and index: cursors continue after the newest record (never
    /// reusing one handed out before), event records the store lacks are added from the log, jobs whose change
    /// records are missing (and those [`StreamWriter::resync_later`] named) get a resync record; everything is
    /// flushed, every record the store now holds counts as durable, and live subscribers get the new records
    /// (or, when the store also holds records they were never sent, are ended so that they read them from it).
    fn repair(&self, store: &Store, index: &SharedIndex, now_ms: i64) -> Result<(), StoreError> {
        let held_last = store.stream_bounds()?.map_or(0, |(_, last)| last);
        self.next.set(self.next.get().max(held_last + 1));
        // Records a failed flush or repair left in the store (sled can keep a write it reported failed): durable
        // now, never published.
        let unpublished = held_last > self.stream.durable.load(Ordering::Acquire);
        let mut recs = self.repair_events(store, index, now_ms)?;
        let through = store.stream_changes_through()?;
        let mut jobs: std::collections::BTreeSet<String> = self.resync_later.borrow().iter().cloned().collect();
        let mut after = through;
        loop {
            let chunk = store.stream_read(after, 10_000)?;
            let Some(last) = chunk.last() else { break };
            after = last.cursor;
            for r in chunk {
                if matches!(r.record, Some(startline_proto::pb::stream_record::Record::Event(_))) {
                    jobs.insert(r.job_id);
                }
            }
        }
        if !jobs.is_empty() {
            let resync: Vec<Rec> = {
                let idx = index.read();
                jobs.iter()
                    .filter_map(|job_id| {
                        let h = idx.jobs.get(job_id)?;
                        let view = JobView::of(&h.rec.timeline, &h.slo);
                        let change = stream::resync(&view, |i| slo_name(&idx.slo, i));
                        Some(stream::change_record(
                            self.alloc(),
                            now_ms,
                            &Subject::job(job_id, h.rec.timeline.attrs.as_deref()),
                            change,
                        ))
                    })
                    .collect()
            };
            store.stream_put(&entries(&resync), Some(after), now_ms)?;
            tracing::warn!(jobs = resync.len(), "stream: change records lost in a crash; resync records written");
            recs.extend(resync);
        }
        store.flush()?;
        self.resync_later.borrow_mut().clear();
        self.flusher.repaired(&self.stream, recs, self.next.get() - 1, unpublished);
        Ok(())
    }

    /// The event records of log entries the stream lacks (written, not flushed): those of group commits whose
    /// stream write a crash or a store failure lost (the log is synced first and alone). A store that never kept
    /// a stream (first start, or an upgrade) starts the stream at the log's end instead.
    fn repair_events(&self, store: &Store, index: &SharedIndex, now_ms: i64) -> Result<Vec<Rec>, StoreError> {
        let last_seq = index.read().last_seq;
        let Some(mut through) = store.stream_log_through()? else {
            store.set_stream_log_through(last_seq)?;
            return Ok(Vec::new());
        };
        if last_seq.saturating_sub(through) > REPAIR_MAX {
            tracing::warn!(
                from = through,
                to = last_seq,
                "stream: more log entries lack event records than a repair adds (was the stream disabled, or its \
                 store failing for long?); the stream resumes at the log's end without them"
            );
            store.set_stream_log_through(last_seq)?;
            return Ok(Vec::new());
        }
        let mut added = Vec::new();
        // Up to the last acknowledged sequence: after a failed group commit the log may still hold its blocks
        // (when cutting them failed too); they were never acknowledged.
        while through < last_seq {
            let mut logged = store.log_after(through, 10_000)?;
            logged.retain(|(seq, _, _)| *seq <= last_seq);
            let Some((last, _, _)) = logged.last() else { break };
            let last = *last;
            let recs: Vec<Rec> = {
                let idx = index.read();
                logged
                    .iter()
                    .map(|(seq, job_id, value)| {
                        let attrs = idx.jobs.get(job_id).and_then(|h| h.rec.timeline.attrs.clone());
                        let body = crate::store::log_value_body(value).unwrap_or_default();
                        stream::event_record(self.alloc(), now_ms, &Subject::job(job_id, attrs.as_deref()), *seq, body)
                    })
                    .collect()
            };
            store.stream_put_events(&entries(&recs), last, None, now_ms)?;
            through = last;
            added.extend(recs);
        }
        if !added.is_empty() {
            tracing::warn!(events = added.len(), "stream: event records a crash left out were added from the log");
        }
        Ok(added)
    }

    fn alloc(&self) -> u64 {
        let c = self.next.get();
        self.next.set(c + 1);
        c
    }

    /// Reserves the cursors of a group's records, in the order they are written: the alert changes waiting in the
    /// outbox (taken from it), then one event record per fresh event (`events`, whose log append is durable);
    /// the group's job changes take theirs after ([`StreamWriter::change`]). `None` while the stream is broken
    /// (the next start's repair adds the event records; alert changes keep waiting).
    pub(super) fn stage(&self, events: usize) -> Option<Staged> {
        if self.broken() {
            return None;
        }
        let alerts = self.stream.take_alerts();
        let alerts_from = self.next.get();
        self.next.set(alerts_from + alerts.len() as u64 + events as u64);
        Some(Staged { alerts, alerts_from, events })
    }

    /// Builds a staged group's records (after its acks went out) and hands them to the flusher, which writes
    /// them with the stream's markers and flushes. `events` are `(subject, log sequence, stored log value)` in
    /// sequence order, as many as staged; `changes` were built after staging.
    pub(super) fn write_group<'a>(
        &self,
        now_ms: i64,
        staged: Staged,
        events: impl Iterator<Item = (Subject, u64, &'a [u8])>,
        changes: Vec<Rec>,
    ) {
        let Staged { alerts, alerts_from, events: staged_events } = staged;
        if self.broken() {
            // Failed since staging: the repair covers the events; alert changes wait again.
            self.stream.post_alerts(alerts);
            return;
        }
        let mut cursor = alerts_from;
        let mut recs: Vec<Rec> = Vec::with_capacity(alerts.len() + staged_events + changes.len());
        for a in &alerts {
            recs.push(stream::alert_record(cursor, now_ms, a));
            cursor += 1;
        }
        let mut marks = Marks::default();
        for (subject, seq, value) in events.take(staged_events) {
            let body = crate::store::log_value_body(value).unwrap_or_default();
            recs.push(stream::event_record(cursor, now_ms, &subject, seq, body));
            // The group's changes are written with its last event record.
            marks = Marks { log_through: Some(seq), changes_through: Some(cursor) };
            cursor += 1;
        }
        recs.extend(changes);
        if !recs.is_empty() {
            self.flusher.hand(recs, marks, now_ms);
        }
    }

    /// Jobs whose change (made by time passing, not an event) could not be recorded: the next repair writes
    /// their resync records.
    pub(super) fn resync_later(&self, jobs: impl IntoIterator<Item = String>) {
        self.resync_later.borrow_mut().extend(jobs);
    }

    /// Allocates a cursor for a job change and builds its record.
    pub(super) fn change(&self, now_ms: i64, subject: &Subject, change: startline_proto::pb::JobChange) -> Rec {
        stream::change_record(self.alloc(), now_ms, subject, change)
    }

    /// The change records of the posted expected starts whose jobs are still in the state and segment they were
    /// estimated in, with the next cursors (call after the group's own changes took theirs, under the index lock
    /// the group was applied under, so no later change of the job can precede its estimate); the others are
    /// named back to the estimate sweep, which estimates them again.
    pub(super) fn estimate_records(&self, idx: &crate::index::JobIndex, now_ms: i64) -> Vec<Rec> {
        let notes = self.stream.take_estimates();
        if notes.is_empty() {
            return Vec::new();
        }
        let mut recs = Vec::with_capacity(notes.len());
        let mut dropped = Vec::new();
        for note in notes {
            match idx.jobs.get(&note.job_id).filter(|h| note.holds_for(&h.rec.timeline)) {
                Some(h) => {
                    // The subject as the job's attributes are now (a later `submitted` may have changed them).
                    let subject = Subject::job(&note.job_id, h.rec.timeline.attrs.as_deref());
                    let last_seq = h.rec.events.iter().map(|e| e.seq).max().unwrap_or(0);
                    recs.push(self.change(now_ms, &subject, stream::expected_start_change(&note, last_seq)));
                }
                None => dropped.push(note.job_id),
            }
        }
        self.stream.expected_starts.fetch_add(recs.len() as u64, Ordering::Relaxed);
        self.stream.estimates_dropped(dropped);
        recs
    }

    /// Whether alert changes or expected starts wait for a write.
    pub(super) fn has_work(&self) -> bool {
        (self.stream.alerts_waiting() || self.stream.estimates_waiting()) && !self.broken()
    }

    /// With no group commit coming: writes waiting alert changes and expected starts and hands them to the
    /// flusher.
    pub(super) fn idle_write(&self, index: &SharedIndex, now_ms: i64) {
        if let Some(staged) = self.stage(0) {
            let estimates = self.estimate_records(&index.read(), now_ms);
            self.write_group(now_ms, staged, std::iter::empty(), estimates);
        }
    }

    /// At shutdown: waits for the flusher's last flush (and publication), unless store writes are halted.
    pub(super) fn finish(&self) {
        self.flusher.finish();
    }

    /// Deletes records older than the retention (at most once a minute).
    pub(super) fn trim(&self, store: &Store, now_ms: i64) {
        if self.last_trim.get().elapsed() < TRIM_EVERY {
            return;
        }
        self.last_trim.set(Instant::now());
        let before = now_ms - self.stream.settings.retention.as_millis() as i64;
        loop {
            match store.stream_trim(before, TRIM_CHUNK) {
                Ok(n) if n == TRIM_CHUNK => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::error!(error = %e, "stream: trim failed");
                    break;
                }
            }
        }
    }
}

/// A group's reserved cursors (see [`StreamWriter::stage`]).
pub(super) struct Staged {
    alerts: Vec<stream::AlertNote>,
    alerts_from: u64,
    events: usize,
}

/// Writes the stream's records and flushes sled, off the commit path. The committer hands over a group's records
/// and goes on; this thread writes whatever was handed meanwhile as one batch (with the stream's markers),
/// flushes, then marks those records durable (the catch-up reads of `export::stream` stop there) and publishes
/// them to live subscribers, in cursor order. The commit path never waits for sled.
///
/// A failed write or flush publishes nothing, ends live subscribers (they resume from what the store holds),
/// marks the stream failed and halts store writes (see `crate::health::WriteHalt`): nothing handed over later is
/// written, and the next start's repair adds what is missing from the log. A write cycle (write, flush,
/// publication) holds the cycle lock, as does the repair's publication, so publications keep cursor order.
struct Flusher {
    tx: Mutex<Option<std::sync::mpsc::Sender<Handed>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    shared: Arc<FlushShared>,
    /// For cycles run by the committer itself when the thread could not start.
    store: Store,
    stream: Arc<Stream>,
}

#[derive(Default)]
struct FlushShared {
    /// Held for a write cycle and the repair's publication.
    cycle: Mutex<()>,
    failed: AtomicBool,
}

/// The stream's markers a batch moves (see [`Store::stream_put_events`]).
#[derive(Debug, Default, Clone, Copy)]
struct Marks {
    log_through: Option<u64>,
    changes_through: Option<u64>,
}

/// One group's records, handed to the flusher.
struct Handed {
    recs: Vec<Rec>,
    marks: Marks,
    at_ms: i64,
}

impl Flusher {
    fn start(store: Store, stream: Arc<Stream>) -> Flusher {
        let shared = Arc::new(FlushShared::default());
        let (tx, rx) = std::sync::mpsc::channel::<Handed>();
        let (sh, st, sr) = (shared.clone(), store.clone(), stream.clone());
        let thread = std::thread::Builder::new().name("startline-stream-flush".into()).spawn(move || {
            while let Ok(first) = rx.recv() {
                let mut handed = vec![first];
                handed.extend(rx.try_iter());
                sh.cycle(&st, &sr, handed);
            }
        });
        let (tx, thread) = match thread {
            Ok(h) => (Some(tx), Some(h)),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the stream's flush thread; the committer writes and flushes the stream itself");
                (None, None)
            }
        };
        Flusher { tx: Mutex::new(tx), thread: Mutex::new(thread), shared, store, stream }
    }

    fn failed(&self) -> bool {
        self.shared.failed.load(Ordering::Acquire) || self.store.halted().is_some()
    }

    /// Hands a group's records (and the markers they move) to the thread.
    fn hand(&self, recs: Vec<Rec>, marks: Marks, at_ms: i64) {
        let h = Handed { recs, marks, at_ms };
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let h = match tx.as_ref() {
            Some(tx) => match tx.send(h) {
                Ok(()) => return,
                Err(std::sync::mpsc::SendError(h)) => h,
            },
            None => h,
        };
        drop(tx);
        // No thread (it could not start, or is gone): the cycle runs here, on the commit path.
        self.shared.cycle(&self.store, &self.stream, vec![h]);
    }

    /// After a repair the caller flushed: everything through `durable` is durable; the repair's records go to
    /// live subscribers, or, when the store holds records they were never sent (`unpublished`), they are ended
    /// and read them from the store.
    fn repaired(&self, stream: &Stream, recs: Vec<Rec>, durable: u64, unpublished: bool) {
        let _cycle = self.shared.lock();
        stream.durable.fetch_max(durable, Ordering::AcqRel);
        if unpublished {
            stream.hub.close();
        } else {
            publish(stream, recs);
        }
    }

    /// Waits for the thread's last cycle; after store writes halted, for at most `HALTED_JOIN_WAIT` (it may be
    /// waiting in sled for an I/O that failed, for ever: then it is left behind, and the process restarts
    /// without it).
    fn finish(&self) {
        drop(self.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
        if let Some(h) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            if self.store.halted().is_some() {
                if !super::join_within(h, super::HALTED_JOIN_WAIT) {
                    tracing::warn!("stream flush thread still in a store call after writes halted; left behind");
                }
                return;
            }
            if h.join().is_err() {
                tracing::error!("stream flush thread panicked");
            }
        }
    }
}

impl FlushShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.cycle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes the handed records as one batch, flushes, publishes.
    fn cycle(&self, store: &Store, stream: &Stream, handed: Vec<Handed>) {
        let _cycle = self.lock();
        if self.failed.load(Ordering::Acquire) || store.halted().is_some() {
            // Dropped: the next start's repair makes the store whole.
            return;
        }
        let mut marks = Marks::default();
        let mut at_ms = 0;
        let mut recs = Vec::new();
        for h in handed {
            marks.log_through = h.marks.log_through.or(marks.log_through);
            marks.changes_through = h.marks.changes_through.or(marks.changes_through);
            at_ms = at_ms.max(h.at_ms);
            recs.extend(h.recs);
        }
        if recs.is_empty() {
            return;
        }
        let written = match marks.log_through {
            Some(seq) => store.stream_put_events(&entries(&recs), seq, marks.changes_through, at_ms),
            None => store.stream_put(&entries(&recs), marks.changes_through, at_ms),
        };
        match written.and_then(|()| store.flush()) {
            Ok(()) => publish(stream, recs),
            Err(e) => {
                tracing::error!(error = %e, "stream: write or flush failed; the next start repairs the stream");
                self.failed.store(true, Ordering::Release);
                store.halt_after(&e);
                stream.hub.close();
                // The committer learns of the halt without waiting for the next batch.
                stream.wake.notify_one();
            }
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Durable records: marked so (catch-up reads go that far) and handed to live subscribers, in order.
fn publish(stream: &Stream, recs: Vec<Rec>) {
    let Some(last) = recs.last() else { return };
    stream.durable.fetch_max(last.cursor, Ordering::AcqRel);
    stream.written.fetch_add(recs.len() as u64, Ordering::Relaxed);
    stream.hub.publish(recs.into());
}

/// Records as the store takes them: `(cursor, encoded record)`, sharing the bytes.
pub(super) fn entries(recs: &[Rec]) -> Vec<(u64, Arc<[u8]>)> {
    recs.iter().map(|r| (r.cursor, r.bytes.clone())).collect()
}

/// An SLO's name by index.
pub(super) fn slo_name(engine: &crate::slo::SloEngine, i: u16) -> String {
    engine.defs().get(usize::from(i)).map(|d| d.name.clone()).unwrap_or_default()
}

/// The filter subject of an event: from its own `submitted`, else from the job's known attributes.
pub(super) fn subject_of(job_id: &str, kind: &EventKind, known: Option<&crate::job::JobAttrs>) -> Subject {
    match kind {
        EventKind::Submitted(a) => Subject::job(job_id, Some(a)),
        _ => Subject::job(job_id, known),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::labels::LabelLimiter;
    use crate::index::JobIndex;
    use crate::job::{event_id_hash, CompactEvent, JobAttrs, JobRecord};
    use crate::slo::{SloDef, SloEngine};
    use startline_proto::pb;
    use std::collections::BTreeMap;

    const T0: i64 = 1_767_225_600_000;

    fn record() -> JobRecord {
        let attrs = JobAttrs {
            pool_kind: pb::PoolKind::Dedicated,
            provider: "slurm".into(),
            pool: "a100".into(),
            priority: pb::PriorityClass::Urgent,
            gpu_class: "a100".into(),
            gpu_count: 8,
            node_count: 1,
            region: "r".into(),
            team: "t".into(),
            project: "p".into(),
            chain_id: String::new(),
            chain_stage: String::new(),
            labels: Default::default(),
        };
        let ev = |id: &str, at: i64, seq: u64, kind| CompactEvent {
            at_ms: at,
            id_hash: event_id_hash(id),
            seq,
            attempt: None,
            kind,
        };
        JobRecord::from_events(vec![
            ev("s", T0, 1, EventKind::Submitted(Arc::new(attrs))),
            ev(
                "f",
                T0 + 60_000,
                2,
                EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified },
            ),
        ])
    }

    /// Job j1's `submitted` and `first_step`, encoded as the log stores them, at sequences 1 and 2.
    fn submitted_then_first_step() -> Vec<(u64, Vec<u8>)> {
        let ev = |id: &str, kind| pb::LifecycleEvent {
            job_id: "j1".into(),
            event_id: id.into(),
            source: "t".into(),
            occurred_at: Some(startline_proto::time::ms_to_timestamp(T0)),
            attempt: None,
            kind: Some(kind),
        };
        vec![
            (1, crate::store::encode_log_value(&ev("s", pb::lifecycle_event::Kind::Submitted(Default::default())))),
            (
                2,
                crate::store::encode_log_value(&ev(
                    "f",
                    pb::lifecycle_event::Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() }),
                )),
            ),
        ]
    }

    fn index_with(jobs: BTreeMap<String, JobRecord>, last_seq: u64) -> crate::index::SharedIndex {
        crate::index::SharedIndex::new(JobIndex::new_at(
            jobs,
            Default::default(),
            last_seq,
            SloEngine::new(SloDef::defaults()),
            LabelLimiter::new(&Default::default()),
            T0,
        ))
    }

    /// A crash after a group commit's flush and before the next one loses its change records: the next start
    /// finds event records after the changes marker and writes one resync record per job they name.
    #[test]
    fn jobs_whose_change_records_a_crash_lost_get_a_resync_record_at_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("db")).expect("open");
        let subject = Subject::job("j1", None);
        let e1 = stream::event_record(1, T0, &subject, 1, &[]);
        let e2 = stream::event_record(2, T0, &subject, 2, &[]);
        // The changes of event record 1 were written (marker 1); those of record 2 were not.
        store.stream_put(&[(1, e1.bytes.to_vec())], None, T0).expect("put");
        store.stream_put::<Vec<u8>>(&[], Some(1), T0).expect("marker");
        store.stream_put(&[(2, e2.bytes.to_vec())], None, T0).expect("put");
        let index = index_with(BTreeMap::from([("j1".to_string(), record())]), 2);
        let stream = Stream::new(Default::default());
        let w = StreamWriter::open(&store, &index, stream.clone(), T0 + 120_000).expect("open");
        assert_eq!(w.next.get(), 4, "the resync record took cursor 3");
        let recs = store.stream_read(2, 10).expect("read");
        assert_eq!(recs.len(), 1);
        let r = &recs[0];
        assert_eq!((r.cursor, r.job_id.as_str(), r.pool.as_str()), (3, "j1", "a100"));
        match &r.record {
            Some(pb::stream_record::Record::Change(c)) => {
                assert!(c.resync);
                assert_eq!(c.state, "running");
                assert_eq!(c.slo_decisions.len(), 1);
                assert_eq!(c.slo_decisions[0].slo, "urgent-start");
                assert_eq!(c.slo_decisions[0].verdict, "good");
            }
            other => panic!("not a change: {other:?}"),
        }
        assert_eq!(store.stream_changes_through().expect("marker"), 2);
        // A second start finds nothing to resync.
        let w = StreamWriter::open(&store, &index, stream, T0 + 180_000).expect("reopen");
        assert_eq!(w.next.get(), 4);
        assert_eq!(store.stream_read(3, 10).expect("read").len(), 0);
    }

    /// A group commit's log append is synced before its stream records are written (by the flush thread, after
    /// the acks): a crash between the two leaves events in the log with no event record. The next start adds them, after
    /// the records already there, and resyncs their jobs.
    #[test]
    fn log_entries_a_crash_left_out_of_the_stream_are_added_at_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("db")).expect("open");
        let log = submitted_then_first_step();
        let subject = Subject::job("j1", None);
        let body = crate::store::log_value_body(&log[0].1).expect("body").to_vec();
        // Group 1 was whole; group 2 reached the log only.
        store.append_durable(&log[..1]).expect("g1 log");
        store
            .stream_put_events(&[(1, stream::event_record(1, T0, &subject, 1, &body).bytes.to_vec())], 1, None, T0)
            .expect("g1 stream");
        store.stream_put::<Vec<u8>>(&[], Some(1), T0).expect("marker");
        store.append_durable(&log[1..]).expect("g2 log only");
        let index = index_with(BTreeMap::from([("j1".to_string(), record())]), 2);
        let w = StreamWriter::open(&store, &index, Stream::new(Default::default()), T0 + 60_000).expect("open");
        let recs = store.stream_read(1, 10).expect("read");
        assert_eq!(recs.iter().map(|r| r.cursor).collect::<Vec<_>>(), vec![2, 3]);
        match &recs[0].record {
            Some(pb::stream_record::Record::Event(a)) => {
                assert_eq!(a.seq, 2);
                assert_eq!(a.event.as_ref().map(|e| e.event_id.as_str()), Some("f"));
                assert_eq!(recs[0].pool, "a100", "the job's attributes from the index");
            }
            other => panic!("not an event: {other:?}"),
        }
        assert!(
            matches!(&recs[1].record, Some(pb::stream_record::Record::Change(c)) if c.resync && c.state == "running")
        );
        assert_eq!(store.stream_log_through().expect("through"), Some(2));
        assert_eq!(w.next.get(), 4);
        // An empty stream on a store with a log (an upgrade) starts at the log's end.
        let dir2 = tempfile::tempdir().expect("tempdir");
        let store2 = Store::open(&dir2.path().join("db")).expect("open");
        store2.append_durable(&log).expect("log");
        StreamWriter::open(&store2, &index, Stream::new(Default::default()), T0).expect("open");
        assert_eq!(store2.stream_bounds().expect("bounds"), None);
        assert_eq!(store2.stream_log_through().expect("through"), Some(2));
    }

    /// Records handed to the flusher are written and published only after a flush: in order, with the durable
    /// mark moved to the last. A failed flush publishes nothing, ends live subscribers, marks the stream broken
    /// and halts store writes; nothing handed after it is written, and `finish` does not wait on the flush thread.
    #[tokio::test]
    async fn the_flusher_publishes_only_what_a_flush_made_durable_and_nothing_after_a_failure() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("db")).expect("open");
        let index = index_with(BTreeMap::new(), 0);
        let stream = Stream::new(Default::default());
        let w = StreamWriter::open(&store, &index, stream.clone(), T0).expect("open");
        let subject = Subject::job("j", None);
        let mut live = stream.hub.subscribe(100);
        let hand = |from: u64, n: u64| {
            let recs = (from..from + n).map(|c| stream::event_record(c, T0, &subject, c, &[])).collect();
            w.flusher.hand(recs, Marks::default(), T0);
        };
        let cursors = || store.stream_read(0, 100).expect("read").iter().map(|r| r.cursor).collect::<Vec<_>>();
        hand(1, 3);
        let got = tokio::time::timeout(Duration::from_secs(10), live.recv()).await.expect("published").expect("live");
        assert_eq!(got.iter().map(|r| r.cursor).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(stream.durable.load(Ordering::Acquire), 3);
        assert_eq!(cursors(), vec![1, 2, 3]);
        // A failed flush: nothing published, the subscriber ended, the writer broken, store writes halted.
        store.fail_flush.store(1, Ordering::Release);
        hand(4, 2);
        let end = tokio::time::timeout(Duration::from_secs(10), live.recv()).await.expect("ended");
        assert!(matches!(end, Err(crate::stream::Ended::Closed)), "{end:?}");
        assert!(w.broken());
        assert_eq!(store.halted(), Some("I/O error"));
        assert_eq!(stream.durable.load(Ordering::Acquire), 3);
        assert!(w.stage(1).is_none(), "nothing is staged after a failure");
        // Handed after the failure: never written.
        hand(6, 1);
        w.finish();
        assert_eq!(cursors(), vec![1, 2, 3, 4, 5], "4-5 written (their flush failed), 6 never");
    }

    /// A store failure lost a group's stream write (its log append was synced and acknowledged) and halted
    /// writes: the next start's writer adds the group's event records from the log and a resync for its job,
    /// flushed, published live and marked durable, with cursors after every one handed out before.
    #[tokio::test]
    async fn after_a_halt_the_next_start_adds_the_event_records_the_failure_lost() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        let store = Store::open(&path).expect("open");
        let log = submitted_then_first_step();
        let stream = Stream::new(Default::default());
        let index = index_with(BTreeMap::new(), 0);
        let w = StreamWriter::open(&store, &index, stream.clone(), T0).expect("open");
        store.append_durable(&log[..1]).expect("g1 log");
        let subject = Subject::job("j1", None);
        let mut live = stream.hub.subscribe(100);
        let staged = w.stage(1).expect("not broken");
        w.write_group(T0, staged, std::iter::once((subject, 1, log[0].1.as_slice())), Vec::new());
        // Written and flushed by the flush thread.
        let got = tokio::time::timeout(Duration::from_secs(10), live.recv()).await.expect("published").expect("live");
        assert_eq!(got.iter().map(|r| r.cursor).collect::<Vec<_>>(), vec![1]);
        assert_eq!(store.stream_log_through().expect("marker"), Some(1));
        assert_eq!(store.stream_changes_through().expect("marker"), 1);
        // Group 2 reached the log; then a failure halted writes before its stream records.
        store.append_durable(&log[1..]).expect("g2 log");
        store.halt_after(&StoreError::Sled(sled::Error::Io(std::io::Error::from_raw_os_error(28))));
        assert!(w.broken());
        w.finish();
        drop(w);
        drop(store);
        // The next start.
        let store = Store::open(&path).expect("reopen");
        let index = index_with(BTreeMap::from([("j1".to_string(), record())]), 2);
        let stream = Stream::new(Default::default());
        let w = StreamWriter::open(&store, &index, stream.clone(), T0 + 60_000).expect("open");
        assert!(!w.broken());
        let recs = store.stream_read(1, 10).expect("read");
        assert_eq!(recs.iter().map(|r| r.cursor).collect::<Vec<_>>(), vec![2, 3]);
        assert!(matches!(&recs[0].record, Some(pb::stream_record::Record::Event(a)) if a.seq == 2));
        assert!(matches!(&recs[1].record, Some(pb::stream_record::Record::Change(c)) if c.resync));
        assert_eq!(stream.durable.load(std::sync::atomic::Ordering::Acquire), 3);
        w.finish();
    }

    /// After a failed flush sled may keep records nobody was sent, and after a failed group commit the log may keep
    /// blocks nobody acknowledged: the next start's repair adds event records only up to the index's last
    /// sequence and counts the kept records durable.
    #[tokio::test]
    async fn a_repair_stops_at_the_last_acknowledged_sequence_and_counts_kept_records_durable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        let store = Store::open(&path).expect("open");
        let ev = |id: &str| pb::LifecycleEvent {
            job_id: "j1".into(),
            event_id: id.into(),
            source: "t".into(),
            occurred_at: Some(startline_proto::time::ms_to_timestamp(T0)),
            attempt: None,
            kind: Some(pb::lifecycle_event::Kind::Submitted(Default::default())),
        };
        let log: Vec<(u64, Vec<u8>)> =
            (1..=3).map(|n| (n, crate::store::encode_log_value(&ev(&format!("e{n}"))))).collect();
        let stream = Stream::new(Default::default());
        let w = StreamWriter::open(&store, &index_with(BTreeMap::new(), 0), stream.clone(), T0).expect("open");
        store.append_durable(&log[..1]).expect("g1 log");
        let subject = Subject::job("j1", None);
        let staged = w.stage(1).expect("not broken");
        let mut live = stream.hub.subscribe(100);
        w.write_group(T0, staged, std::iter::once((subject.clone(), 1, log[0].1.as_slice())), Vec::new());
        let got = tokio::time::timeout(Duration::from_secs(10), live.recv()).await.expect("published").expect("live");
        assert_eq!(got.iter().map(|r| r.cursor).collect::<Vec<_>>(), vec![1]);
        // Group 2 (seq 2) acknowledged, its stream write lost; a change record (cursor 2) kept by sled although its
        // flush failed; group 3 (seq 3) failed and its block was not cut.
        store.append_durable(&log[1..]).expect("g2, g3 log");
        store
            .stream_put(&[(2, stream::change_record(2, T0, &subject, Default::default()).bytes.to_vec())], None, T0)
            .expect("kept");
        w.finish();
        drop(w);
        drop(store);
        let store = Store::open(&path).expect("reopen");
        let index = index_with(BTreeMap::from([("j1".to_string(), record())]), 2);
        let stream = Stream::new(Default::default());
        let w = StreamWriter::open(&store, &index, stream.clone(), T0 + 60_000).expect("open");
        let recs = store.stream_read(0, 10).expect("read");
        let event_seqs: Vec<u64> = recs
            .iter()
            .filter_map(|r| match &r.record {
                Some(pb::stream_record::Record::Event(a)) => Some(a.seq),
                _ => None,
            })
            .collect();
        assert_eq!(event_seqs, vec![1, 2], "seq 3 is past the index's last sequence");
        assert_eq!(store.stream_log_through().expect("marker"), Some(2));
        let last = recs.last().map_or(0, |r| r.cursor);
        assert_eq!(stream.durable.load(Ordering::Acquire), last);
        w.finish();
    }

    /// The committer trims records older than `[stream] retention`, at most once a minute, never the newest.
    #[test]
    fn the_writer_trims_to_the_retention_once_a_minute() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("db")).expect("open");
        let subject = Subject::job("j", None);
        let recs: Vec<(u64, Vec<u8>)> = (1..=5u64)
            .map(|c| (c, stream::event_record(c, T0 + c as i64 * 60_000, &subject, c, &[]).bytes.to_vec()))
            .collect();
        for (i, r) in recs.iter().enumerate() {
            store.stream_put(std::slice::from_ref(r), None, T0 + (i as i64 + 1) * 60_000).expect("put");
        }
        let index = index_with(BTreeMap::new(), 0);
        let settings = crate::stream::StreamSettings { retention: Duration::from_secs(120), ..Default::default() };
        let w = StreamWriter::open(&store, &index, Stream::new(settings), T0).expect("open");
        // Just opened: not yet a minute since the last trim.
        w.trim(&store, T0 + 10 * 60_000);
        assert_eq!(store.stream_bounds().expect("bounds"), Some((1, 5)));
        let Some(past) = Instant::now().checked_sub(TRIM_EVERY) else { return };
        w.last_trim.set(past);
        // Now T0+6m with 2 minutes kept: records stamped before T0+4m (1, 2, 3) go.
        w.trim(&store, T0 + 6 * 60_000);
        assert_eq!(store.stream_bounds().expect("bounds"), Some((4, 5)));
        w.last_trim.set(past);
        w.trim(&store, T0 + 60 * 60_000);
        assert_eq!(store.stream_bounds().expect("bounds"), Some((5, 5)), "the newest record stays");
    }
}
