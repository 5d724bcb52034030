//! The committer driven through its channel, with a store that can report a durable write as failed.

use super::*;
use crate::index::cold::ColdJobs;
use crate::index::labels::LabelLimiter;
use crate::index::JobIndex;
use crate::slo::{SloDef, SloEngine};
use crate::store::encode_log_value;
use crate::store::tests::{ev, submitted};
use proptest::prelude::*;
use startline_proto::pb::{self, lifecycle_event::Kind};
use std::collections::{BTreeMap, BTreeSet};

/// `n` events of jobs `{tag}-0`, `{tag}-1`, ... (ten events each: a `submitted`, then checkpoints).
fn batch(tag: &str, n: usize, at_ms: i64) -> Vec<pb::LifecycleEvent> {
    (0..n)
        .map(|i| {
            let kind = if i % 10 == 0 {
                submitted()
            } else {
                Kind::Checkpoint(pb::Checkpoint { step: i as u64, ..Default::default() })
            };
            ev(&format!("{tag}-{}", i / 10), &format!("{tag}-event-{i}"), at_ms + i as i64 * 1000, kind)
        })
        .collect()
}

fn prepared(events: &[pb::LifecycleEvent]) -> Vec<PreparedEvent> {
    events
        .iter()
        .map(|ev| PreparedEvent {
            job_id: ev.job_id.clone(),
            event_id: ev.event_id.clone(),
            compact: CompactEvent::from_pb(ev, 0).expect("valid event"),
            encoded: encode_log_value(ev),
            source: crate::job::event_id_hash(&ev.source),
        })
        .collect()
}

async fn send(tx: &mpsc::Sender<CommitRequest>, events: &[pb::LifecycleEvent]) -> Result<CommitResult, CommitError> {
    let (reply, rx) = oneshot::channel();
    tx.send(CommitRequest { events: prepared(events), reply, owner: None }).await.expect("committer running");
    rx.await.expect("committer answers")
}

/// Asserts two sets of `(job id, event id)` are equal, naming a few of the differences (not every event).
fn assert_same(got: &BTreeSet<(String, String)>, want: &BTreeSet<(String, String)>, what: &str) {
    let missing: Vec<_> = want.difference(got).take(5).collect();
    let extra: Vec<_> = got.difference(want).take(5).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{what}: {} missing (first {missing:?}), {} not acknowledged (first {extra:?})",
        want.difference(got).count(),
        got.difference(want).count()
    );
}

fn ids(events: &[pb::LifecycleEvent]) -> BTreeSet<(String, String)> {
    events.iter().map(|e| (e.job_id.clone(), e.event_id.clone())).collect()
}

/// Every event the index holds, read back from the store by its sequence: `(job id, event id)`.
fn stored_by_index(index: &SharedIndex, store: &Store) -> BTreeSet<(String, String)> {
    let idx = index.read();
    let mut out = BTreeSet::new();
    for (job_id, hot) in &idx.jobs {
        for e in &hot.rec.events {
            let ev = store.event(e.seq).expect("read").unwrap_or_else(|| panic!("{job_id} seq {}", e.seq));
            assert_eq!(&ev.job_id, job_id, "seq {} reads another job's event", e.seq);
            assert_eq!(crate::job::event_id_hash(&ev.event_id), e.id_hash, "seq {} reads another event", e.seq);
            out.insert((ev.job_id, ev.event_id));
        }
    }
    out
}

/// Committer settings for these tests: folding after `fold_after` (None: never), checkpoints rare unless folding.
fn settings(fold_after: Option<Duration>) -> CommitterSettings {
    CommitterSettings {
        group_max_events: 10_000,
        checkpoint_interval: if fold_after.is_some() { Duration::from_millis(5) } else { Duration::from_secs(3600) },
        clock: crate::time::Clock::system(),
        wake: Arc::new(tokio::sync::Notify::new()),
        telemetry: None,
        retention: None,
        retention_interval: Duration::from_secs(3600),
        max_events_per_job: 10_000,
        feed: crate::feed::Feed::new(),
        fold_after,
        fold_interval: Duration::from_millis(5),
        // With folding (the model test), the stream out too.
        stream: fold_after.map(|_| crate::stream::Stream::new(crate::stream::StreamSettings::default())),
        deadlines: Arc::default(),
        history: None,
        seal_stats: Arc::default(),
    }
}

/// An empty index.
fn empty_index() -> SharedIndex {
    SharedIndex::new(JobIndex::new(
        BTreeMap::new(),
        0,
        SloEngine::new(SloDef::defaults()),
        LabelLimiter::new(&Default::default()),
    ))
}

/// A group commit the store kept although it reported failure (a write cut short by a full disk) halts writes:
/// later groups are answered at once with the cause, without touching the store, and the committer stops without
/// waiting on it. The next start serves every acknowledged event; what the failed group kept is stored, so its
/// retry is answered as duplicates, never stored twice. Three rounds, each on the store the last one left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_group_commit_halts_writes_and_the_next_start_serves_every_acknowledged_event() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t0 = startline_proto::time::now_ms() - 3_600_000;
    let mut acked = BTreeSet::new();
    for round in 0..3 {
        let store = Store::open(dir.path()).expect("open");
        let index = restored_index(&store);
        let health = Arc::new(Health::watching(store.write_halt()));
        let (tx, committer) = start(&store, &index, &health, None);
        assert_same(&stored_by_index(&index, &store), &acked, &format!("round {round}: after the start"));
        if round > 0 {
            // The last round's failed group was kept: its retry is all duplicates.
            let b = batch(&format!("b{}", round - 1), 300, t0);
            let again = send(&tx, &b[..50]).await.expect("retry");
            assert_eq!((again.accepted, again.duplicates), (0, 50), "round {round}");
        }
        let a = batch(&format!("a{round}"), 300, t0);
        assert_eq!(send(&tx, &a).await.expect("a").accepted, 300);
        acked.extend(ids(&a));
        store.fail_after_write.store(1, std::sync::atomic::Ordering::Release);
        let b = batch(&format!("b{round}"), 300, t0);
        let err = send(&tx, &b).await.expect_err("reported failed");
        assert_eq!(err.cause, "no space left on device");
        acked.extend(ids(&b));
        assert_eq!(health.halted(), Some("no space left on device"));
        assert!(!health.is_healthy());
        // Halted: refused at once, nothing written.
        let log_before = store.log_after(0, usize::MAX).expect("log").len();
        let c = batch(&format!("c{round}"), 50, t0);
        let err = send(&tx, &c).await.expect_err("halted");
        assert_eq!(err.cause, "no space left on device");
        assert_eq!(store.log_after(0, usize::MAX).expect("log").len(), log_before, "nothing more in the log");
        drop(tx);
        let stopped = std::time::Instant::now();
        tokio::task::spawn_blocking(move || committer.join()).await.expect("join").expect("committer exits cleanly");
        assert!(stopped.elapsed() < Duration::from_secs(10), "the stop does not wait on the halted store");
        assert!(!dir.path().join("shutdown.img").exists(), "no shutdown image after a halt");
    }
    // The last start: exactly the acknowledged events and the failed groups' kept ones, each once.
    let store = Store::open(dir.path()).expect("reopen");
    let restored = store.restore().expect("restore");
    let mut got = BTreeSet::new();
    for (job_id, rec) in &restored.jobs {
        for e in &rec.events {
            let ev = store.event(e.seq).expect("read").expect("stored");
            assert_eq!(crate::job::event_id_hash(&ev.event_id), e.id_hash);
            assert!(got.insert((job_id.clone(), ev.event_id)), "an event stored twice");
        }
    }
    assert_same(&got, &acked, "after the last start");
}

/// One step of [`acknowledged_events_survive_failed_commits_folds_and_restarts`].
#[derive(Debug, Clone)]
enum Op {
    /// A batch of `(job, event)` numbers (repeats of stored events are duplicates).
    Send(Vec<(u8, u8)>),
    /// The same, with the store reporting the write as failed after keeping it: writes halt.
    SendFailing(Vec<(u8, u8)>),
    /// Stop the committer (final checkpoint, shutdown image), reopen the store, restore (from the image, or with
    /// it gone, from the summaries, as after a crash), start again.
    Restart(bool),
    /// The next fold's store write (`FAIL_FOLD_WRITE`) or snapshot delete (`FAIL_FOLD_DELETE`) is kept and
    /// reported failed: writes halt; its jobs stay hot, and the summaries it wrote become their stale ones.
    FailNextFold(u32),
    /// A batch whose stream records' flush (on the flush thread, after the ack) reports failure: writes halt,
    /// and the next start repairs the stream from the log.
    SendFailingStreamFlush(Vec<(u8, u8)>),
}

fn op() -> impl Strategy<Value = Op> {
    let events = proptest::collection::vec((0u8..12, 0u8..10), 1..120);
    prop_oneof![
        6 => events.clone().prop_map(Op::Send),
        2 => events.prop_map(Op::SendFailing),
        1 => any::<bool>().prop_map(Op::Restart),
        1 => prop_oneof![Just(crate::store::FAIL_FOLD_WRITE), Just(crate::store::FAIL_FOLD_DELETE)].prop_map(Op::FailNextFold),
        1 => proptest::collection::vec((0u8..12, 0u8..10), 1..120).prop_map(Op::SendFailingStreamFlush),
    ]
}

/// Event `e` of job `j`: 0 is the `submitted`, 9 the `done` (so jobs fold, and later events unfold them), the
/// rest checkpoints.
fn numbered(j: u8, e: u8, t0: i64) -> pb::LifecycleEvent {
    let kind = match e {
        // Attribute sets shared by some jobs (the pool) and some of a job's own (a label): dictionary entries
        // are freed as folds, unfolds and restarts move rows.
        0 => {
            let mut s = submitted();
            if let Kind::Submitted(sub) = &mut s {
                sub.pool = format!("pool-{}", j % 3);
                if j % 4 == 0 {
                    sub.labels.insert("run".into(), format!("run-{j}"));
                }
            }
            s
        }
        9 => Kind::Done(pb::Done { outcome: pb::Outcome::Succeeded as i32, ..Default::default() }),
        _ => Kind::Checkpoint(pb::Checkpoint { step: u64::from(e), ..Default::default() }),
    };
    ev(&format!("m{j}"), &format!("m{j}-e{e}"), t0 + i64::from(e) * 1000, kind)
}

/// The events numbered in `numbers`, each once.
fn distinct_events(numbers: &[(u8, u8)], t0: i64) -> Vec<pb::LifecycleEvent> {
    let mut seen = BTreeSet::new();
    numbers.iter().filter(|n| seen.insert(**n)).map(|&(j, e)| numbered(j, e, t0)).collect()
}

/// Starts a committer on `store` and `index` (folding after `fold`); returns its channel and thread.
fn start(
    store: &Store,
    index: &SharedIndex,
    health: &Arc<Health>,
    fold: Option<Duration>,
) -> (mpsc::Sender<CommitRequest>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(16);
    let c = spawn(store.clone(), index.clone(), rx, settings(fold), Arc::default(), health.clone()).expect("spawn");
    (tx, c)
}

/// Every event the index holds (hot jobs by sequence, folded ones through their summaries), read from the store.
fn stored_events(index: &SharedIndex, store: &Store) -> BTreeSet<(String, String)> {
    let mut out = stored_by_index(index, store);
    let folded: Vec<(String, u64)> = index.read().cold.rows.iter().map(|(k, r)| (k.to_string(), r.summary())).collect();
    for (job_id, summary) in folded {
        for (_, ev) in store.folded_events(&job_id, summary).expect("folded events") {
            out.insert((job_id.clone(), ev.event_id));
        }
    }
    out
}

/// What a start does: restore the store into an index.
fn restored_index(store: &Store) -> SharedIndex {
    index_of(crate::app::restore_index(store).expect("restore"))
}

/// The index a start builds from what the store restored.
fn index_of((restored, cold): (crate::store::Restored, ColdJobs)) -> SharedIndex {
    SharedIndex::new(
        JobIndex::new_at(
            restored.jobs,
            cold,
            restored.last_seq,
            SloEngine::new(SloDef::defaults()),
            LabelLimiter::new(&Default::default()),
            startline_proto::time::now_ms(),
        )
        .with_dirty(restored.dirty)
        .with_snapshot_through(restored.snapshot_through)
        .with_stale_summaries(restored.stale_summaries),
    )
}

/// Every folded job's attribute set (as text), asserting each row names a live dictionary entry.
fn row_sets(index: &SharedIndex) -> BTreeMap<String, String> {
    let idx = index.read();
    idx.cold
        .rows
        .iter()
        .map(|(k, r)| {
            let a = idx.cold.dict.get(r.attrs).unwrap_or_else(|| panic!("{k} names freed entry {}", r.attrs));
            (k.to_string(), format!("{a:?}"))
        })
        .collect()
}

/// With nothing running: every summary the store holds is one the index knows (a folded job's row, or a hot job's
/// stale summary, which its next fold replaces and retention deletes), and every folded row's summary is stored.
fn assert_summaries_known(index: &SharedIndex, store: &Store, what: &str) {
    let stored: BTreeSet<(String, u64)> = store.summary_numbers().expect("summaries").into_iter().collect();
    let idx = index.read();
    let rows: BTreeSet<(String, u64)> = idx.cold.rows.iter().map(|(k, r)| (k.to_string(), r.summary())).collect();
    let stale: BTreeSet<(String, u64)> =
        idx.stale_summaries.iter().flat_map(|(k, ns)| ns.iter().map(move |n| (k.clone(), *n))).collect();
    assert!(rows.is_subset(&stored), "{what}: folded rows without a stored summary: {:?}", rows.difference(&stored));
    let known: BTreeSet<(String, u64)> = rows.union(&stale).cloned().collect();
    assert!(stored.is_subset(&known), "{what}: summaries the index does not know: {:?}", stored.difference(&known));
    for (job_id, _) in &stale {
        assert!(idx.jobs.contains_key(job_id), "{what}: stale summary of {job_id}, which is not hot");
    }
}

/// A running committer in [`acknowledged_events_survive_failed_commits_folds_and_restarts`].
struct Running {
    store: Store,
    index: SharedIndex,
    health: Arc<Health>,
    tx: mpsc::Sender<CommitRequest>,
    committer: std::thread::JoinHandle<()>,
}

/// The model of that test: events acknowledged, and events of batches answered with an error (a failed write may
/// have kept them: after the next start they are stored or not, each once).
#[derive(Default)]
struct Model {
    acked: BTreeSet<(String, String)>,
    maybe: BTreeSet<(String, String)>,
}

/// Starts a committer on the store in `dir` after restoring it, with health watching its write halt.
fn start_on(store: Store, index: SharedIndex) -> Running {
    let health = Arc::new(Health::watching(store.write_halt()));
    let (tx, committer) = start(&store, &index, &health, Some(Duration::ZERO));
    Running { store, index, health, tx, committer }
}

/// Stops the committer (a halted one must not wait on the store), opens the store again and restores it (from the
/// shutdown image when `image` and one was written, else from the summaries, as after a crash), checks what the
/// start finds against the model, and starts again: everything stored now counts as acknowledged (a failed
/// write's kept events included).
async fn restart(dir: &std::path::Path, r: Running, image: bool, model: &mut Model, what: &str) -> Running {
    let Running { store, index, health, tx, committer } = r;
    drop(tx);
    let halted = health.halted().is_some();
    let stopping = std::time::Instant::now();
    tokio::task::spawn_blocking(move || committer.join()).await.expect("join").expect("clean exit");
    assert!(stopping.elapsed() < Duration::from_secs(10), "{what}: the stop took {:?}", stopping.elapsed());
    assert_summaries_known(&index, &store, &format!("{what}: before the restart"));
    let sets_before = row_sets(&index);
    drop(store);
    let written = dir.join("shutdown.img").exists();
    assert!(!(halted && written), "{what}: a stop after a halt writes no image");
    if !image && written {
        // As after a crash: the summaries are read.
        std::fs::remove_file(dir.join("shutdown.img")).expect("remove the image");
    }
    let store = Store::open(dir).expect("reopen");
    let restored = crate::app::restore_index(&store).expect("restore");
    assert_eq!(restored.0.from_image, image && written, "{what}: restored from the image");
    let index = index_of(restored);
    assert_summaries_known(&index, &store, &format!("{what}: after the restart"));
    // Jobs folded on both sides name the same attribute sets.
    for (job, set) in &row_sets(&index) {
        if let Some(before) = sets_before.get(job) {
            assert_eq!(before, set, "{what}: {job}'s attributes after the restart");
        }
    }
    let stored_entries = store.load_dictionary().expect("dictionary").len();
    assert_eq!(stored_entries, index.read().cold.dict.live(), "{what}: stored entries are the live ones");
    let stored = stored_events(&index, &store);
    let missing: Vec<_> = model.acked.difference(&stored).collect();
    assert!(missing.is_empty(), "{what}: acknowledged events lost: {missing:?}");
    let allowed: BTreeSet<_> = model.acked.union(&model.maybe).cloned().collect();
    let extra: Vec<_> = stored.difference(&allowed).collect();
    assert!(extra.is_empty(), "{what}: events stored that nobody sent: {extra:?}");
    model.acked = stored;
    model.maybe.clear();
    start_on(store, index)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random sequences of batches (new events, duplicates, late events of folded jobs), store writes reported
    /// failed after keeping them (group commits, folds, stream flushes: each halts writes, and the test restarts
    /// as the process would), and restarts, against a model of acknowledged events and of events a failed batch
    /// may have left: after every step the index reads back exactly the acknowledged ones from the store and the
    /// log holds nothing else; while halted every batch is refused at once with the cause; after every restart
    /// nothing acknowledged is missing and nothing unsent appears; each answer counts new events and duplicates
    /// as the model does.
    #[test]
    fn acknowledged_events_survive_failed_commits_folds_and_restarts(ops in proptest::collection::vec(op(), 1..24)) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        rt.block_on(async move {
            let dir = tempfile::tempdir().expect("tempdir");
            let t0 = startline_proto::time::now_ms() - 3_600_000;
            let store = Store::open(dir.path()).expect("open");
            let mut r = start_on(store, empty_index());
            let mut model = Model::default();
            // A batch's answer against the model; a refusal must come from halted writes.
            let answered = |got: Result<CommitResult, CommitError>, evs: &[pb::LifecycleEvent], r: &Running, model: &mut Model, step: usize| {
                match got {
                    Ok(got) => {
                        let new = ids(evs).difference(&model.acked).count() as u32;
                        assert_eq!((got.accepted, got.duplicates), (new, evs.len() as u32 - new), "step {step}");
                        model.acked.extend(ids(evs));
                    }
                    Err(e) => {
                        let cause = r.store.halted().unwrap_or_else(|| panic!("step {step}: refused ({e}) but not halted"));
                        assert_eq!(e.cause, cause, "step {step}");
                        model.maybe.extend(ids(evs).difference(&model.acked).cloned().collect::<Vec<_>>());
                    }
                }
            };
            for (step, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Send(evs) | Op::SendFailing(evs) | Op::SendFailingStreamFlush(evs) if evs.is_empty() => {}
                    Op::SendFailingStreamFlush(numbers) => {
                        let evs = distinct_events(&numbers, t0);
                        // An empty batch's answer: the committer is past its start (whose stream repair flushes too).
                        // A failed fold may have halted writes meanwhile: then the batch is refused.
                        if let Err(e) = send(&r.tx, &[]).await {
                            assert_eq!(Some(e.cause), r.store.halted(), "step {step}: refused but not halted");
                        }
                        r.store.fail_flush.store(1, std::sync::atomic::Ordering::Release);
                        // Acknowledged: the ack waits for the log's sync, not for the stream's flush.
                        let got = send(&r.tx, &evs).await;
                        let nothing_new = got.as_ref().is_ok_and(|g| g.accepted == 0);
                        answered(got, &evs, &r, &mut model, step);
                        if nothing_new && r.store.fail_flush.compare_exchange(1, 0, std::sync::atomic::Ordering::AcqRel, std::sync::atomic::Ordering::Acquire).is_ok() {
                            // Nothing was written, so nothing flushed: the failure never happened.
                        } else {
                            // The flush fails (now or soon) and halts writes, unless a failed fold halted them first
                            // (then the flush never comes, and the next start repairs the stream).
                            let deadline = std::time::Instant::now() + Duration::from_secs(20);
                            while r.store.halted().is_none() {
                                assert!(std::time::Instant::now() < deadline, "step {step}: no halt after the failed flush");
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                        }
                    }
                    Op::Send(numbers) => {
                        let evs = distinct_events(&numbers, t0);
                        let got = send(&r.tx, &evs).await;
                        answered(got, &evs, &r, &mut model, step);
                    }
                    Op::SendFailing(numbers) => {
                        let evs = distinct_events(&numbers, t0);
                        r.store.fail_after_write.store(1, std::sync::atomic::Ordering::Release);
                        let got = send(&r.tx, &evs).await;
                        if let Ok(g) = &got {
                            // Every event was a duplicate: nothing to write, nothing failed.
                            assert_eq!(g.accepted, 0, "step {step}: a write was made and reported failed");
                            r.store.fail_after_write.store(0, std::sync::atomic::Ordering::Release);
                        }
                        answered(got, &evs, &r, &mut model, step);
                    }
                    Op::FailNextFold(which) => {
                        r.store.fail_fold.store(which, std::sync::atomic::Ordering::Release);
                    }
                    Op::Restart(image) => {
                        r = restart(dir.path(), r, image, &mut model, &format!("step {step}")).await;
                    }
                }
                if r.store.halted().is_some() {
                    // Refused at once while halted, without a write.
                    let probe = [numbered(11, 9, t0)];
                    let err = send(&r.tx, &probe).await.expect_err("halted");
                    assert_eq!(Some(err.cause), r.store.halted(), "step {step}");
                    model.maybe.extend(ids(&probe).difference(&model.acked).cloned().collect::<Vec<_>>());
                    // What the process does once the store is writable: start again.
                    r = restart(dir.path(), r, true, &mut model, &format!("step {step}: after the halt")).await;
                }
                assert_same(&stored_events(&r.index, &r.store), &model.acked, &format!("step {step}: the index"));
                row_sets(&r.index);
                let mut in_log = BTreeSet::new();
                let listed = r.store.log_after(0, usize::MAX).expect("log");
                for (seq, job_id, _) in &listed {
                    let Some(ev) = r.store.event(*seq).expect("read") else {
                        panic!("step {step}: the log lists seq {seq} of {job_id}, a read by sequence does not find it");
                    };
                    in_log.insert((job_id.clone(), ev.event_id));
                }
                assert_same(&in_log, &model.acked, &format!("step {step}: the log"));
                // The stream's event records: one per acknowledged event, cursors increasing (always); every
                // acknowledged event there once its flush is done (unless writes halted meanwhile: the next start's
                // repair adds them).
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                loop {
                    let mut in_stream = BTreeSet::new();
                    let mut last = 0;
                    for rec in r.store.stream_read(0, usize::MAX).expect("stream") {
                        assert!(rec.cursor > last, "step {step}: cursor {} after {last}", rec.cursor);
                        last = rec.cursor;
                        if let Some(pb::stream_record::Record::Event(a)) = rec.record {
                            let ev = a.event.expect("event");
                            let fresh = in_stream.insert((ev.job_id, ev.event_id));
                            assert!(fresh, "step {step}: an event twice in the stream");
                        }
                    }
                    if in_stream == model.acked || r.store.halted().is_some() {
                        break;
                    }
                    if std::time::Instant::now() > deadline {
                        assert_same(&in_stream, &model.acked, &format!("step {step}: the stream"));
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            drop(r.tx);
            tokio::task::spawn_blocking(move || r.committer.join()).await.expect("join").expect("clean exit");
        });
    }
}

/// `n` jobs named `{prefix}{j:05}` submitted an hour ago, those `ended(j)` done a minute later, appended to the
/// store's log: the last log sequence and the jobs' records.
fn jobs_in_log(
    store: &Store,
    prefix: &str,
    n: usize,
    ended: impl Fn(usize) -> bool,
) -> (u64, BTreeMap<String, crate::job::JobRecord>) {
    let t0 = startline_proto::time::now_ms() - 3_600_000;
    let mut events = Vec::new();
    for j in 0..n {
        let id = format!("{prefix}{j:05}");
        events.push(ev(&id, &format!("{id}-s"), t0, submitted()));
        if ended(j) {
            let done = Kind::Done(pb::Done { outcome: pb::Outcome::Succeeded as i32, ..Default::default() });
            events.push(ev(&id, &format!("{id}-d"), t0 + 60_000, done));
        }
    }
    let entries: Vec<(u64, Vec<u8>)> =
        events.iter().enumerate().map(|(i, e)| (i as u64 + 1, encode_log_value(e))).collect();
    store.append_durable(&entries).expect("append");
    let mut by_job: BTreeMap<String, Vec<crate::job::CompactEvent>> = BTreeMap::new();
    for (i, e) in events.iter().enumerate() {
        by_job
            .entry(e.job_id.clone())
            .or_default()
            .push(crate::job::CompactEvent::from_pb(e, i as u64 + 1).expect("kind"));
    }
    let recs = by_job.into_iter().map(|(k, evs)| (k, crate::job::JobRecord::from_events(evs))).collect();
    (entries.len() as u64, recs)
}

/// A fold pass folds at least one chunk even when its time budget is gone before the first (the budget is zero in
/// unit tests): a backlog of ended jobs always shrinks, a chunk per pass, oldest settled first, and every folded
/// job's summary is the one its row names. (In a 10M-job run, choosing among 1.2M candidates outlasted the 2 s
/// budget, the budget was checked before the first chunk, and no pass folded anything.)
#[test]
fn every_fold_pass_folds_a_chunk_even_out_of_time_and_the_backlog_drains() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let jobs = fold::FOLD_CHUNK * 2 + 100;
    let (last_seq, recs) = jobs_in_log(&store, "b", jobs, |_| true);
    let now = startline_proto::time::now_ms();
    let mut idx = JobIndex::new_at(
        recs,
        Default::default(),
        last_seq,
        SloEngine::new(SloDef::defaults()),
        LabelLimiter::new(&Default::default()),
        now,
    );
    // Settled at different times: the longest settled fold first.
    for (i, at) in idx.settling.values_mut().enumerate() {
        *at = now - 1_000 - i as i64;
    }
    let oldest: BTreeSet<String> = {
        let mut by_age: Vec<(i64, String)> = idx.settling.iter().map(|(k, at)| (*at, k.clone())).collect();
        by_age.sort();
        by_age.into_iter().take(fold::FOLD_CHUNK).map(|(_, k)| k).collect()
    };
    let index = SharedIndex::new(idx);
    let store_writes: Arc<Mutex<()>> = Arc::default();
    let pass = |more: &Arc<AtomicBool>| fold::FoldPass {
        index: index.clone(),
        health: Arc::new(Health::default()),
        store_writes: store_writes.clone(),
        busy: Arc::new(AtomicBool::new(true)),
        unchanged_since: now,
        now,
        over_budget: Arc::default(),
        more: more.clone(),
        stop: Arc::default(),
    };
    let more = Arc::new(AtomicBool::new(false));
    assert_eq!(pass(&more).run(&store), fold::FOLD_CHUNK, "one chunk, though the budget was spent");
    assert!(more.load(std::sync::atomic::Ordering::Acquire), "more to fold: another pass at once");
    let folded: BTreeSet<String> = index.read().cold.rows.keys().map(|k| k.to_string()).collect();
    assert_eq!(folded, oldest, "the longest settled first");
    // While a pass runs (here: held up at its first chunk) the backlog flag stays as the last pass left it: the
    // committer reads it then to decide whether a checkpoint is due (a flag cleared at the start of every pass
    // let checkpoints run back to back in the 10M-job replay of BENCHMARKS.md run 15).
    let held = store_writes.lock().expect("lock");
    let running = std::thread::spawn({
        let p = pass(&more);
        let store = store.clone();
        move || p.run(&store)
    });
    std::thread::sleep(Duration::from_millis(100));
    assert!(more.load(std::sync::atomic::Ordering::Acquire), "the backlog flag cleared while a pass runs");
    drop(held);
    assert!(running.join().expect("pass") > 0);
    let mut passes = 2;
    while !index.read().settling.is_empty() {
        assert!(pass(&more).run(&store) > 0, "pass {passes} folded nothing");
        passes += 1;
        assert!(passes <= 3, "{passes} passes for {jobs} jobs");
    }
    assert_eq!(pass(&more).run(&store), 0);
    assert!(!more.load(std::sync::atomic::Ordering::Acquire), "a pass with nothing left clears the flag");
    let idx = index.read();
    assert_eq!((idx.cold.len(), idx.jobs.len()), (jobs, 0));
    let stored: BTreeSet<(String, u64)> = store.summary_numbers().expect("summaries").into_iter().collect();
    let rows: BTreeSet<(String, u64)> = idx.cold.rows.iter().map(|(k, r)| (k.to_string(), r.summary())).collect();
    assert_eq!(stored, rows);
}

/// Over the hot jobs' memory budget (`store.hot_budget_mib`), a pass folds ended jobs that have not settled for
/// `fold_after` yet; within it, only settled ones. Jobs still open never fold, whatever the budget.
#[test]
fn over_the_hot_budget_ended_jobs_fold_without_settling() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let (last_seq, recs) = jobs_in_log(&store, "h", 60, |j| j % 3 != 0);
    let now = startline_proto::time::now_ms();
    let fold_after = 300_000;
    let index = |budget: usize| {
        let idx = JobIndex::new_at(
            recs.clone(),
            Default::default(),
            last_seq,
            SloEngine::new(SloDef::defaults()),
            LabelLimiter::new(&Default::default()),
            now,
        )
        .with_hot_budget(budget);
        SharedIndex::new(idx)
    };
    let pass = |index: &SharedIndex, over: &Arc<AtomicBool>| fold::FoldPass {
        index: index.clone(),
        health: Arc::new(Health::default()),
        store_writes: Arc::default(),
        busy: Arc::new(AtomicBool::new(true)),
        // Every job ended (and settled) just now: none has been unchanged for fold_after.
        unchanged_since: now - fold_after,
        now,
        over_budget: over.clone(),
        more: Arc::default(),
        stop: Arc::default(),
    };
    let within = index(usize::MAX);
    let hot = within.read().hot_bytes();
    assert!(hot > 0);
    let over = Arc::new(AtomicBool::new(false));
    assert_eq!(pass(&within, &over).run(&store), 0, "within the budget: nothing settled for fold_after yet");
    assert!(!over.load(std::sync::atomic::Ordering::Acquire));
    let tight = index(hot - 1);
    assert_eq!(pass(&tight, &over).run(&store), 40, "over the budget: every ended job folds, no open one");
    assert!(over.load(std::sync::atomic::Ordering::Acquire), "the pass saw the budget exceeded");
    let idx = tight.read();
    assert_eq!((idx.jobs.len(), idx.cold.len()), (20, 40));
    assert!(idx.jobs.keys().all(|k| k[1..].parse::<u32>().is_ok_and(|j| j % 3 == 0)), "only open jobs stay hot");
    assert!(idx.hot_bytes() < hot);
    drop(idx);
    // Back within it (the open jobs alone fit): the next pass says so and folds nothing more.
    assert_eq!(pass(&tight, &over).run(&store), 0);
    assert!(!over.load(std::sync::atomic::Ordering::Acquire), "back within the budget");
}

#[test]
fn with_a_fold_backlog_checkpoints_leave_folding_at_least_as_much_time_as_they_take() {
    let interval = Duration::from_secs(2);
    // No backlog: the configured interval, however long the last checkpoint took.
    assert_eq!(checkpoint_every(interval, false, Duration::from_secs(14)), interval);
    // A backlog: four intervals at least...
    assert_eq!(checkpoint_every(interval, true, Duration::from_millis(500)), Duration::from_secs(8));
    // ...and twice the last checkpoint's time, so that of each cycle (measured from hand-over) the checkpoint
    // takes at most half and fold passes get the rest.
    let took = Duration::from_secs(14);
    let every = checkpoint_every(interval, true, took);
    assert_eq!(every, Duration::from_secs(28));
    assert!(every - took >= took, "folds get {:?} after a {took:?} checkpoint", every - took);
}

/// Over the folded rows' budget (`store.folded_budget_mib`: rows and the dictionary entries they name), the
/// committer deletes the folded jobs that ended longest ago, down to 95% of the budget. Waves of jobs, each wave
/// ending after the one before (in shuffled order within it), every third job with an attribute set of its own (a
/// label), against a model that is the list of jobs by end time: after every wave the rows kept are exactly the
/// latest-ending ones, within the budget and not far under it, and the dictionary holds exactly the sets they
/// name (in memory, and in the store after a restart); the counts, the store's summaries and (after a restart,
/// which derives them from what is left) the SLO counts agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_folded_budget_the_jobs_that_ended_longest_ago_are_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = Store::open(dir.path()).expect("open");
    let budget = 12_000;
    let index = SharedIndex::new(
        JobIndex::new(BTreeMap::new(), 0, SloEngine::new(SloDef::defaults()), LabelLimiter::new(&Default::default()))
            .with_folded_budget(budget),
    );
    let health = Arc::new(Health::default());
    let (tx, c) = start(&store, &index, &health, Some(Duration::ZERO));
    let t0 = startline_proto::time::now_ms() - 6 * 3_600_000;
    // The model: every job sent, with when it ended.
    let mut ended: Vec<(i64, String)> = Vec::new();
    for wave in 0..5i64 {
        let mut evs = Vec::new();
        for j in 0..50i64 {
            let id = format!("w{wave}-{:02}", (j * 17) % 50);
            let at = t0 + wave * 3_600_000 + j * 60_000;
            let done = at + 30_000 + (j * 7919 % 50) * 100;
            let mut s = submitted();
            if let (Kind::Submitted(sub), 0) = (&mut s, j % 3) {
                sub.labels.insert("run".into(), id.clone());
            }
            evs.push(ev(&id, &format!("{id}-s"), at, s));
            evs.push(ev(
                &id,
                &format!("{id}-f"),
                at + 5_000,
                Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() }),
            ));
            let d = Kind::Done(pb::Done { outcome: pb::Outcome::Succeeded as i32, ..Default::default() });
            evs.push(ev(&id, &format!("{id}-d"), done, d));
            ended.push((done, id));
        }
        assert_eq!(send(&tx, &evs).await.expect("sent").accepted, 150);
        ended.sort();
        // Folded and trimmed: no hot job left, rows within the budget.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let settled = {
                let idx = index.read();
                idx.jobs.is_empty() && idx.cold.bytes() + idx.cold.dict.bytes() <= budget
            };
            if settled {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "wave {wave}: not folded and trimmed in time");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A trim may be under way (it chose, then deletes in chunks): wait for the counts to be still.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let idx = index.read();
        let kept: Vec<String> = idx.cold.rows.keys().map(|k| k.to_string()).collect();
        let n = kept.len();
        let mut want: Vec<String> = ended[ended.len() - n..].iter().map(|(_, id)| id.clone()).collect();
        want.sort();
        assert_eq!(kept, want, "wave {wave}: the {n} latest-ending jobs are kept");
        let deleted = ended.len() - n;
        assert_eq!(idx.deleted.over_budget, deleted as u64, "wave {wave}");
        assert_eq!(idx.deleted.expired, 0);
        let sum: usize = idx.cold.rows.iter().map(|(k, r)| ColdJobs::row_bytes(k, r)).sum();
        assert!(idx.cold.bytes() >= sum, "wave {wave}: {} counted for rows of {sum} bytes", idx.cold.bytes());
        let named: BTreeSet<u32> = idx.cold.rows.values().map(|r| r.attrs).collect();
        assert_eq!(idx.cold.dict.live(), named.len(), "wave {wave}: the dictionary holds the sets rows name");
        assert!(named.iter().all(|a| idx.cold.dict.get(*a).is_some()));
        let bytes = idx.cold.bytes() + idx.cold.dict.bytes();
        if deleted > 0 {
            let newest_deleted = ended[ended.len() - n - 1].0;
            assert_eq!(idx.deleted.over_budget_through_ms, newest_deleted, "wave {wave}");
            let largest = idx.cold.rows.iter().map(|(k, r)| idx.cold.freeing_bytes(k, r)).max().unwrap_or(0);
            assert!(bytes + largest > budget - budget / 20, "wave {wave}: {bytes} bytes kept: deleted too many");
        } else {
            assert!(wave == 0, "wave {wave}: over the budget and nothing deleted");
        }
        drop(idx);
        assert_summaries_known(&index, &store, &format!("wave {wave}"));
    }
    // A restart derives SLO counts from what is left: the same as the running index, which took each deleted job
    // out of its counts.
    drop(tx);
    tokio::task::spawn_blocking(move || c.join()).await.expect("join").expect("clean exit");
    let now = startline_proto::time::now_ms();
    let counts = |index: &SharedIndex| -> Vec<crate::slo::window::Counts> {
        let idx = index.read();
        (0..idx.slo.defs().len()).map(|i| idx.slo.counts(i, now, idx.slo.defs()[i].window_ms)).collect()
    };
    let before = counts(&index);
    assert!(before.iter().any(|c| c.good + c.bad > 0), "the SLOs count the jobs kept: {before:?}");
    drop(store);
    store = Store::open(dir.path()).expect("reopen");
    let restored = restored_index(&store);
    let keys = |i: &SharedIndex| i.read().cold.rows.keys().map(|k| k.to_string()).collect::<Vec<_>>();
    assert_eq!(keys(&restored), keys(&index), "the deleted jobs stay deleted");
    let sets = |i: &SharedIndex| {
        let idx = i.read();
        let mut v: Vec<String> =
            idx.cold.rows.values().map(|r| format!("{:?}", idx.cold.dict.get(r.attrs).expect("named"))).collect();
        v.sort();
        v.dedup();
        v
    };
    assert_eq!(sets(&restored), sets(&index));
    let stored = store.load_dictionary().expect("dictionary").len();
    assert_eq!(stored, restored.read().cold.dict.live(), "the store keeps only the entries rows name");
    assert!(stored > 1 && stored < 100, "{stored} entries: shared ones and the kept jobs' own");
    assert_eq!(counts(&restored), before);
}

/// A job with two summaries (a failed fold's write that sled kept, then a later fold) whose newer one restore
/// cannot use (it names a dictionary entry that is gone) is rebuilt hot from that summary's events; the older
/// summary must not also bring it back folded (it would count twice), and goes.
#[test]
fn a_job_whose_newer_summary_is_refused_restores_hot_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let events = [
        ev("x", "x1", 1_000_000, submitted()),
        ev("x", "x2", 1_060_000, Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })),
        ev("x", "x3", 1_200_000, Kind::Done(pb::Done::default())),
    ];
    let entries: Vec<(u64, Vec<u8>)> = events.iter().zip(1u64..).map(|(e, s)| (s, encode_log_value(e))).collect();
    store.append_durable(&entries).expect("append");
    let rec = crate::job::JobRecord::from_events(
        events.iter().zip(1u64..).map(|(e, s)| CompactEvent::from_pb(e, s).expect("kind")).collect(),
    );
    let attrs = rec.timeline.attrs.clone().expect("attributes");
    let mut dict = crate::index::cold::Dictionary::default();
    let n = dict.intern(&attrs);
    let fold = |attrs_no: u32| crate::store::FoldWrite {
        job_id: "x".to_string(),
        log_seqs: vec![1, 2, 3],
        summary: crate::index::cold::Folded::of(&rec.timeline, attrs_no).expect("ended").encode(),
        replaces: Vec::new(),
        number: 0,
    };
    let mut older = [fold(n)];
    store.fold_write(&mut older, &dict.unpersisted()).expect("older summary");
    let mut newer = [fold(n + 7)];
    store.fold_jobs(&mut newer, &[], 3).expect("newer summary, naming an entry never stored");
    assert!(newer[0].number > older[0].number);
    for start in 0..2 {
        let index = restored_index(&store);
        let idx = index.read();
        let hot = idx.jobs.get("x").map(|h| h.rec.events.len());
        assert_eq!(hot, Some(3), "start {start}: rebuilt hot from its events");
        assert!(!idx.cold.rows.contains_key("x"), "start {start}: and not folded too");
        drop(idx);
        let stored = store.summary_numbers().expect("summaries");
        assert_eq!(stored, vec![("x".to_string(), newer[0].number)], "start {start}: the older summary went");
        assert_summaries_known(&index, &store, &format!("start {start}"));
    }
}

/// A new store under `dir` with a committer on an empty index that folds ended jobs at once.
fn folding_committer(
    dir: &std::path::Path,
) -> (Store, SharedIndex, Arc<Health>, mpsc::Sender<CommitRequest>, std::thread::JoinHandle<()>) {
    let store = Store::open(dir).expect("open");
    let index = empty_index();
    let health = Arc::new(Health::default());
    let (tx, c) = start(&store, &index, &health, Some(Duration::ZERO));
    (store, index, health, tx, c)
}

/// Every file under `from`, copied to `to`.
fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read dir") {
        let e = e.expect("entry");
        if e.file_type().expect("type").is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
        }
    }
}

/// What a restart gives, for comparing two: folded jobs (id, summary, timeline), hot jobs (id, events), stale
/// summaries, live dictionary entries, the last sequence.
type Restart = (Vec<(String, u64, String)>, Vec<(String, String)>, BTreeMap<String, Vec<u64>>, usize, u64);

fn restart_of(index: &SharedIndex) -> Restart {
    let idx = index.read();
    let rows = idx.cold.rows.iter().map(|(k, r)| (k.to_string(), r.summary(), format!("{:?}", idx.cold.timeline(r))));
    let hot = idx.jobs.iter().map(|(k, h)| (k.clone(), format!("{:?}", h.rec.events)));
    let stale = idx.stale_summaries.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    (rows.collect(), hot.collect(), stale, idx.cold.dict.live(), idx.last_seq)
}

/// After a clean stop the shutdown image restores exactly what reading every summary restores: the same rows,
/// hot jobs (an unfolded one with its stale summary among them), dictionary and sequence; and it is used once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_image_restores_what_the_summaries_do() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t0 = startline_proto::time::now_ms() - 3_600_000;
    let (store, index, health, tx, c) = folding_committer(dir.path());
    // 40 jobs that end (and fold), 10 still running; then a late event unfolds one folded job.
    let mut numbers: Vec<(u8, u8)> = (0..50u8).flat_map(|j| (0..10u8).map(move |e| (j, e))).collect();
    numbers.retain(|&(j, e)| j < 40 || e != 9);
    send(&tx, &distinct_events(&numbers, t0)).await.expect("ingest");
    for _ in 0..200 {
        if index.read().cold.rows.len() == 40 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(index.read().cold.rows.len(), 40, "the ended jobs folded");
    drop(tx);
    tokio::task::spawn_blocking(move || c.join()).await.expect("join").expect("clean exit");
    // The late event comes to a committer that folds only jobs unchanged for an hour, so the unfolded job is
    // still hot at the stop (with folding at once, a fold pass in the same turn could fold it again first).
    let (tx, c) = start(&store, &index, &health, Some(Duration::from_secs(3600)));
    let late = pb::LifecycleEvent { event_id: "m3-late".into(), ..numbered(3, 5, t0) };
    send(&tx, &[late]).await.expect("late event");
    drop(tx);
    tokio::task::spawn_blocking(move || c.join()).await.expect("join").expect("clean exit");
    let before = restart_of(&index);
    assert_eq!(before.0.len(), 39);
    assert!(before.2.contains_key("m3"), "the unfolded job's summary is stale");
    drop(index);
    drop(store);
    assert!(dir.path().join("shutdown.img").exists(), "a clean stop writes the image");
    let other = tempfile::tempdir().expect("tempdir");
    copy_tree(dir.path(), other.path());
    std::fs::remove_file(other.path().join("shutdown.img")).expect("remove");

    // A damaged image is not used (the summaries are read).
    let damaged = tempfile::tempdir().expect("tempdir");
    copy_tree(dir.path(), damaged.path());
    let img = damaged.path().join("shutdown.img");
    let mut bytes = std::fs::read(&img).expect("read");
    let n = bytes.len();
    bytes[n / 2] ^= 0x20;
    std::fs::write(&img, bytes).expect("write");
    let store3 = Store::open(damaged.path()).expect("open");
    let (r, _) = crate::app::restore_index(&store3).expect("restore");
    assert!(!r.from_image, "a damaged image is not used");
    drop(store3);
    assert_eq!(restart_of(&restored_index(&Store::open(damaged.path()).expect("open"))), before, "and agrees");

    let store = Store::open(dir.path()).expect("open");
    let restored = crate::app::restore_index(&store).expect("restore");
    assert!(restored.0.from_image, "a clean stop's image is used");
    let imaged = index_of(restored);
    assert!(!dir.path().join("shutdown.img").exists(), "the image is used once");
    let store2 = Store::open(other.path()).expect("open");
    let read = restored_index(&store2);
    assert_eq!(restart_of(&imaged), before, "from the image");
    assert_eq!(restart_of(&read), before, "from the summaries");
    // The image is gone: the next start reads the summaries, and agrees.
    drop(imaged);
    drop(store);
    let store = Store::open(dir.path()).expect("open");
    assert_eq!(restart_of(&restored_index(&store)), before, "a start without an image");

    // A clean stop whose image needs a summary pack damaged after it (the unfolded job's stale summary): the
    // start reads everything as after a crash (the damaged packs' jobs rebuilt from the log), never refuses.
    let index = restored_index(&store);
    let (tx, c) = start(&store, &index, &health, None);
    drop(tx);
    tokio::task::spawn_blocking(move || c.join()).await.expect("join").expect("clean exit");
    assert!(store.damage_summary_packs().expect("damage") > 0);
    drop(store);
    assert!(dir.path().join("shutdown.img").exists());
    let store = Store::open(dir.path()).expect("open");
    let (restored, cold) = crate::app::restore_index(&store).expect("a damaged pack is no reason to refuse");
    assert!(!restored.from_image && !restored.lost_packs.is_empty());
    let mut ids: Vec<String> = restored.jobs.keys().cloned().chain(cold.rows.keys().map(|k| k.to_string())).collect();
    ids.sort();
    let mut want: Vec<String> =
        before.0.iter().map(|r| r.0.clone()).chain(before.1.iter().map(|h| h.0.clone())).collect();
    want.sort();
    assert_eq!(ids, want, "every job, hot or rebuilt");
}

/// A stop after a store write failed, or after retention could not delete jobs it dropped from memory, writes no
/// shutdown image: the next start must read the summaries (and the log) to find what memory no longer knew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_shutdown_image_after_a_failed_write_or_a_failed_retention_delete() {
    for failure in ["write", "retention"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let t0 = startline_proto::time::now_ms() - 3_600_000;
        let (store, _index, _health, tx, c) = folding_committer(dir.path());
        let numbers: Vec<(u8, u8)> = (0..5u8).flat_map(|j| (0..10u8).map(move |e| (j, e))).collect();
        send(&tx, &distinct_events(&numbers, t0)).await.expect("ingest");
        match failure {
            "write" => {
                store.fail_after_write.store(1, std::sync::atomic::Ordering::Release);
                let more = [pb::LifecycleEvent { event_id: "m0-late".into(), ..numbered(0, 5, t0) }];
                assert!(send(&tx, &more).await.is_err(), "the write is reported failed");
            }
            _ => store.hold_bases(),
        }
        drop(tx);
        tokio::task::spawn_blocking(move || c.join()).await.expect("join").expect("clean exit");
        assert!(!dir.path().join("shutdown.img").exists(), "{failure}: no image");
    }
}
