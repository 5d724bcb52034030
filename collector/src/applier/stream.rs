//! The stream's writer, owned by the committer (the one place cursors are assigned): event records go into the
//! group commit's durable batch, job changes are written after the index applied the group, alert changes posted
//! by the alert loop join the next batch (or an idle flush), and records reach live subscribers only after a
//! flush made them durable. Also trims the stream to its retention and, at start, resyncs jobs whose change
//! records a crash lost (see the `stream` module doc for the contract).

use crate::index::SharedIndex;
use crate::job::EventKind;
use crate::store::{Store, StoreError};
use crate::stream::{self, JobView, Rec, Stream, Subject};
use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Records trimmed per store call.
const TRIM_CHUNK: usize = 10_000;
/// Most log entries the start-up repair adds (a crash leaves out at most one group commit's).
const REPAIR_MAX: u64 = 1_000_000;
/// How often the stream is trimmed.
const TRIM_EVERY: Duration = Duration::from_secs(60);

pub(super) struct StreamWriter {
    pub(super) stream: Arc<Stream>,
    /// The next cursor.
    next: Cell<u64>,
    /// Written, not yet flushed (so not yet published), in cursor order.
    pending: RefCell<Vec<Rec>>,
    last_trim: Cell<Instant>,
    /// Cursors of failed groups' records not handed out again: sled may have kept them; the committer deletes
    /// them once it has reopened the store (see [`StreamWriter::failed_records`]).
    failed: RefCell<Vec<(u64, u64)>>,
}

/// Records of one group commit that go into its durable batch.
pub(super) struct Staged {
    /// Alert and event records, in cursor order.
    pub records: Vec<Rec>,
    /// The cursor of each fresh event of the group, in order.
    pub event_cursors: Vec<u64>,
    /// Alert changes taken from the outbox (posted back if the batch fails).
    alerts: Vec<stream::AlertNote>,
    /// The next cursor before staging.
    rollback_to: u64,
}

impl StreamWriter {
    /// Opens the writer: the next cursor follows the newest retained record, and jobs whose event records lack
    /// their change records (a crash between a group commit and the next flush) get a resync record each.
    pub(super) fn open(
        store: &Store,
        index: &SharedIndex,
        stream: Arc<Stream>,
        now_ms: i64,
    ) -> Result<Self, StoreError> {
        let next = store.stream_bounds()?.map_or(1, |(_, last)| last + 1);
        let w = StreamWriter {
            stream,
            next: Cell::new(next),
            pending: RefCell::new(Vec::new()),
            last_trim: Cell::new(Instant::now()),
            failed: RefCell::new(Vec::new()),
        };
        w.repair_events(store, index, now_ms)?;
        let through = store.stream_changes_through()?;
        let mut jobs = std::collections::BTreeSet::new();
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
        if jobs.is_empty() {
            return Ok(w);
        }
        let recs: Vec<Rec> = {
            let idx = index.read();
            jobs.iter()
                .filter_map(|job_id| {
                    let h = idx.jobs.get(job_id)?;
                    let view = JobView::of(&h.rec.timeline, &h.slo);
                    let change = stream::resync(&view, |i| slo_name(&idx.slo, i));
                    Some(stream::change_record(
                        w.alloc(),
                        now_ms,
                        &Subject::job(job_id, h.rec.timeline.attrs.as_deref()),
                        change,
                    ))
                })
                .collect()
        };
        store.stream_put(&entries(&recs), Some(after), now_ms)?;
        store.flush()?;
        tracing::warn!(jobs = recs.len(), "stream: change records lost in a crash; resync records written");
        // Durable: a subscriber that connected while the collector started gets them live too.
        w.publish(recs);
        Ok(w)
    }

    /// Adds the event records of log entries the stream lacks: those a crash left in the log but not in the
    /// stream (the log batch is applied first; sled may persist it alone). A store that never kept a stream
    /// (first start, or an upgrade) starts the stream at the log's end instead.
    fn repair_events(&self, store: &Store, index: &SharedIndex, now_ms: i64) -> Result<(), StoreError> {
        let last_seq = index.read().last_seq;
        let Some(mut through) = store.stream_log_through()? else {
            store.set_stream_log_through(last_seq)?;
            return Ok(());
        };
        if last_seq.saturating_sub(through) > REPAIR_MAX {
            tracing::warn!(
                from = through,
                to = last_seq,
                "stream: more log entries than a crash leaves lack event records (was the stream disabled?); \
                 the stream resumes at the log's end without them"
            );
            store.set_stream_log_through(last_seq)?;
            return Ok(());
        }
        let mut added = Vec::new();
        loop {
            let logged = store.log_after(through, 10_000)?;
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
            store.stream_put(&entries(&recs), None, now_ms)?;
            store.set_stream_log_through(last)?;
            through = last;
            added.extend(recs);
        }
        if !added.is_empty() {
            store.flush()?;
            tracing::warn!(events = added.len(), "stream: event records a crash left out were added from the log");
            self.publish(added);
        }
        Ok(())
    }

    /// The cursors of records of failed group commits (none published; sled may have kept them), unless a
    /// cursor of the range was handed out again since. Deleting the stream blocks keyed in this range removes
    /// exactly those records: each group's records are one block keyed by its first cursor, and records written
    /// before have lower cursors.
    pub(super) fn failed_records(&self) -> Vec<(u64, u64)> {
        self.failed.borrow().clone()
    }

    /// The failed groups' records are gone from the store.
    pub(super) fn failed_records_dropped(&self) {
        self.failed.borrow_mut().clear();
    }

    fn alloc(&self) -> u64 {
        let c = self.next.get();
        // A failed group's cursor handed out again: its block will be overwritten, and deleting the range later
        // could delete the new records.
        self.failed.borrow_mut().retain(|(from, to)| !(*from..=*to).contains(&c));
        self.next.set(c + 1);
        c
    }

    /// Builds the alert records waiting in the outbox and the records of a group's fresh events. `events` are
    /// `(subject, log sequence, stored log value)` in sequence order.
    pub(super) fn stage<'a>(&self, now_ms: i64, events: impl Iterator<Item = (Subject, u64, &'a [u8])>) -> Staged {
        let rollback_to = self.next.get();
        let alerts = self.stream.take_alerts();
        let mut records: Vec<Rec> = alerts.iter().map(|a| stream::alert_record(self.alloc(), now_ms, a)).collect();
        let mut event_cursors = Vec::new();
        for (subject, seq, value) in events {
            let body = crate::store::log_value_body(value).unwrap_or_default();
            let cursor = self.alloc();
            event_cursors.push(cursor);
            records.push(stream::event_record(cursor, now_ms, &subject, seq, body));
        }
        Staged { records, event_cursors, alerts, rollback_to }
    }

    /// The batch failed: its cursors are free again and its alert changes wait for the next one. Records written
    /// since the last flush may or may not reach the disk (the store is reopened after a failure): they are never
    /// published, their cursors are never reused (the stream may show a hole there, never two records under one
    /// cursor), and live subscribers are ended so that they resume from what the store holds. (Jobs whose change
    /// records were lost get their resync record at the next start.) The failed group's own records are
    /// remembered ([`StreamWriter::failed_records`]): the committer deletes what sled kept of them once reopened.
    pub(super) fn unstage(&self, store: &Store, staged: Staged) {
        if let Some(last) = staged.records.last() {
            self.failed.borrow_mut().push((staged.rollback_to, last.cursor));
        }
        self.next.set(staged.rollback_to);
        self.stream.post_alerts(staged.alerts);
        let dropped = std::mem::take(&mut *self.pending.borrow_mut());
        if !dropped.is_empty() {
            let held = store.stream_bounds().ok().flatten().map_or(0, |(_, last)| last + 1);
            self.next.set(staged.rollback_to.max(held));
            self.stream.hub.close();
        }
    }

    /// The batch is durable (and with it every record written before): publish them, in order.
    pub(super) fn durable(&self, staged: Vec<Rec>) {
        let mut all = std::mem::take(&mut *self.pending.borrow_mut());
        all.extend(staged);
        self.publish(all);
    }

    fn publish(&self, all: Vec<Rec>) {
        if all.is_empty() {
            return;
        }
        self.stream.written.fetch_add(all.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.stream.hub.publish(all.into());
    }

    /// Allocates a cursor for a job change and builds its record.
    pub(super) fn change(&self, now_ms: i64, subject: &Subject, change: startline_proto::pb::JobChange) -> Rec {
        stream::change_record(self.alloc(), now_ms, subject, change)
    }

    /// Writes a group's change records (unflushed; published after the next flush). `through` is the cursor of
    /// the group's last event record.
    pub(super) fn write_changes(&self, store: &Store, changes: Vec<Rec>, through: Option<u64>, now_ms: i64) {
        match store.stream_put(&entries(&changes), through, now_ms) {
            Ok(()) => self.pending.borrow_mut().extend(changes),
            // Never published: a restart resyncs these jobs (the marker did not move).
            Err(e) => tracing::error!(error = %e, "stream: cannot write job change records"),
        }
    }

    /// Whether records wait for a flush, or alert changes for a write.
    pub(super) fn has_work(&self) -> bool {
        !self.pending.borrow().is_empty() || self.stream.alerts_waiting()
    }

    /// With no group commit coming: writes waiting alert changes, flushes, publishes.
    pub(super) fn idle_flush(&self, store: &Store, now_ms: i64) {
        let staged = self.stage(now_ms, std::iter::empty());
        let res =
            if staged.records.is_empty() { Ok(()) } else { store.stream_put(&entries(&staged.records), None, now_ms) }
                .and_then(|()| store.flush());
        match res {
            Ok(()) => {
                let Staged { records, .. } = staged;
                self.durable(records);
            }
            Err(e) => {
                tracing::error!(error = %e, "stream: idle flush failed");
                self.unstage(store, staged);
            }
        }
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
            ev("f", T0 + 60_000, 2, EventKind::FirstStep { step: 1 }),
        ])
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
        store.append_durable_with_stream(&[], &[(1, e1.bytes.to_vec())], T0).expect("append");
        store.stream_put::<Vec<u8>>(&[], Some(1), T0).expect("marker");
        store.append_durable_with_stream(&[], &[(2, e2.bytes.to_vec())], T0).expect("append");
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

    /// The log batch of a group commit is applied before the stream's: a crash between the two can leave events
    /// in the log (sled's background flush persisted them) with no event record. The next start adds them, after
    /// the records already there, and resyncs their jobs.
    #[test]
    fn log_entries_a_crash_left_out_of_the_stream_are_added_at_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("db")).expect("open");
        let ev = |id: &str, kind| pb::LifecycleEvent {
            job_id: "j1".into(),
            event_id: id.into(),
            source: "t".into(),
            occurred_at: Some(startline_proto::time::ms_to_timestamp(T0)),
            attempt: None,
            kind: Some(kind),
        };
        let log: Vec<(u64, Vec<u8>)> = vec![
            (1, crate::store::encode_log_value(&ev("s", pb::lifecycle_event::Kind::Submitted(Default::default())))),
            (
                2,
                crate::store::encode_log_value(&ev(
                    "f",
                    pb::lifecycle_event::Kind::FirstStep(pb::FirstStep { step: 1 }),
                )),
            ),
        ];
        let subject = Subject::job("j1", None);
        let body = crate::store::log_value_body(&log[0].1).expect("body").to_vec();
        // Group 1 was whole; group 2 reached the log only.
        store
            .append_durable_with_stream(
                &log[..1],
                &[(1, stream::event_record(1, T0, &subject, 1, &body).bytes.to_vec())],
                T0,
            )
            .expect("g1");
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
