//! Alert timing on tokio's paused clock: a page goes out at the exact moment an urgent job crosses its
//! threshold while waiting, resolves when it starts, and stored state prevents a second page after a restart.

use super::*;
use crate::job::{event_id_hash, CompactEvent, EventKind, JobAttrs, JobRecord};
use crate::slo::{SloDef, SloEngine};
use startline_proto::pb;

const T0: i64 = 1_767_225_600_000;
const MIN: i64 = 60_000;

fn urgent_job(id: &str) -> JobRecord {
    JobRecord::from_events(vec![CompactEvent {
        at_ms: T0,
        id_hash: event_id_hash(&format!("{id}-s")),
        seq: 1,
        attempt: None,
        kind: EventKind::Submitted(std::sync::Arc::new(JobAttrs {
            pool_kind: pb::PoolKind::Dedicated,
            provider: "slurm".into(),
            pool: "a100".into(),
            priority: pb::PriorityClass::Urgent,
            gpu_class: "a100".into(),
            gpu_count: 8,
            node_count: 1,
            region: "dc".into(),
            team: String::new(),
            project: String::new(),
            chain_id: String::new(),
            chain_stage: String::new(),
            labels: Default::default(),
        })),
    }])
}

fn limiter() -> crate::index::labels::LabelLimiter {
    crate::index::labels::LabelLimiter::new(&Default::default())
}

fn alert_config() -> AlertConfig {
    AlertConfig {
        alertmanagers: vec![],
        webhooks: vec![],
        evaluation_interval: Duration::from_secs(10),
        resend_interval: Duration::from_secs(3600),
        min_jobs: 5,
        resolved_retention: Duration::from_secs(86_400),
        page_max_age: Duration::from_secs(3600),
        external_url: None,
        labels: Default::default(),
        runbook_urls: Default::default(),
        runbook_base_url: None,
    }
}

struct Harness {
    index: SharedIndex,
    clock: Clock,
    wake: Arc<Notify>,
    rx: mpsc::Receiver<Vec<AlertRecord>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    board: AlertBoard,
}

/// Plays the applier's part for the alert loop under test: applies each deadline request to the index and
/// wakes the loop (the committer does this in the collector; `applier::deadlines`).
fn applier_stand_in(index: &SharedIndex, wake: &Arc<Notify>) -> Arc<crate::index::deadlines::DeadlineRequests> {
    let requests = Arc::new(crate::index::deadlines::DeadlineRequests::default());
    let (r, index, wake) = (requests.clone(), index.clone(), wake.clone());
    tokio::spawn(async move {
        loop {
            r.requested().await;
            if let Some(to) = r.take() {
                index.write().advance_deadlines(to);
                wake.notify_one();
            }
        }
    });
    requests
}

fn start(store: &Store, clock: Clock, jobs: Vec<(&str, JobRecord)>) -> Harness {
    let map: BTreeMap<String, JobRecord> = jobs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let index = SharedIndex::new(JobIndex::new_at(
        map,
        Default::default(),
        1,
        SloEngine::new(SloDef::defaults()),
        limiter(),
        clock.now_ms(),
    ));
    let board = AlertBoard::default();
    for a in store.load_alerts().expect("load alerts") {
        board.insert(a);
    }
    let (tx, rx) = mpsc::channel(16);
    let wake = Arc::new(Notify::new());
    let stop = CancellationToken::new();
    let deadlines = applier_stand_in(&index, &wake);
    let l = AlertLoop {
        deadlines,
        index: index.clone(),
        store: store.clone(),
        clock,
        config: alert_config(),
        board: board.clone(),
        wake: wake.clone(),
        notifiers: vec![tx],
        stats: Arc::new(AlertStats::default()),
        base_url: "http://test".into(),
        reconfigure: None,
        deferred: Default::default(),
        stream: None,
        scans: ScanAlerts {
            prediction: crate::slo::predict::PredictSettings { enabled: false, ..Default::default() },
            ..Default::default()
        },
    };
    let task = tokio::spawn(l.run(stop.clone()));
    Harness { index, clock, wake, rx, stop, task, board }
}

impl Harness {
    /// The next notification that is not a periodic resend of nothing new.
    async fn next(&mut self) -> Vec<AlertRecord> {
        self.rx.recv().await.expect("notification")
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

#[tokio::test(start_paused = true)]
async fn pages_at_the_crossing_and_resolves_when_the_job_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("store");
    // Five minutes after submit: five minutes to go.
    let mut h = start(&store, Clock::starting_at(T0 + 5 * MIN), vec![("slurm/a/1", urgent_job("slurm/a/1"))]);

    let fired = h.next().await;
    let now = h.clock.now_ms();
    assert_eq!(now, T0 + 10 * MIN, "paged exactly at the threshold crossing");
    assert_eq!(fired.len(), 1);
    let a = &fired[0];
    assert!(a.firing());
    assert_eq!(a.key, "job/urgent-start/slurm/a/1");
    assert_eq!(a.labels["job_id"], "slurm/a/1");
    assert_eq!(a.labels["priority"], "urgent");
    assert_eq!(a.labels["pool"], "a100");
    assert_eq!(a.annotations["waiting_reason"], "unreported");
    assert_eq!(a.annotations["waited_seconds"], "600");
    assert_eq!(a.starts_at_ms, T0 + 10 * MIN);

    // Two minutes later the job starts: the page resolves.
    tokio::time::advance(Duration::from_millis(2 * MIN as u64)).await;
    {
        let mut idx = h.index.write();
        let ev = CompactEvent {
            at_ms: T0 + 12 * MIN,
            id_hash: 7,
            seq: 2,
            attempt: None,
            kind: EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified },
        };
        idx.insert("slurm/a/1", ev, T0 + 12 * MIN);
    }
    h.wake.notify_one();
    let resolved = h.next().await;
    assert_eq!(resolved.len(), 1);
    assert_eq!(resolved[0].resolved_at_ms, Some(T0 + 12 * MIN));
    assert_eq!(h.board.snapshot().len(), 1);
    h.stop().await;

    // Stored: resolved, not re-paged after a "restart" on the same store.
    let stored: Vec<AlertRecord> = store.load_alerts().expect("load");
    assert_eq!(stored.len(), 1);
    assert!(!stored[0].firing());
}

#[tokio::test(start_paused = true)]
async fn a_restart_after_the_crossing_pages_once_and_a_second_restart_does_not_repeat() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("store");
    // The collector was down across the deadline: it comes back 20 minutes after submit.
    let mut h = start(&store, Clock::starting_at(T0 + 20 * MIN), vec![("slurm/a/2", urgent_job("slurm/a/2"))]);
    let fired = h.next().await;
    assert_eq!(fired[0].key, "job/urgent-start/slurm/a/2");
    assert_eq!(fired[0].starts_at_ms, T0 + 10 * MIN, "the page is dated at the crossing, not at the restart");
    h.stop().await;

    // Restart again, job still waiting: the firing alert is known. The only thing sent is the re-post of that
    // same alert (same key, same startsAt) that keeps it open in Alertmanager; no new page.
    let mut h = start(&store, Clock::starting_at(T0 + 25 * MIN), vec![("slurm/a/2", urgent_job("slurm/a/2"))]);
    tokio::time::advance(Duration::from_secs(30)).await;
    tokio::task::yield_now().await;
    while let Ok(batch) = h.rx.try_recv() {
        for a in batch {
            assert_eq!((a.key.as_str(), a.starts_at_ms), ("job/urgent-start/slurm/a/2", T0 + 10 * MIN), "no new page");
        }
    }
    let firing: Vec<AlertRecord> = h.board.snapshot().into_iter().filter(|a| a.firing()).collect();
    assert_eq!(firing.len(), 1);
    assert_eq!(firing[0].starts_at_ms, T0 + 10 * MIN);
    h.stop().await;
}

/// An agent's spool drains a backlog: job A's submit arrives first, its first step (before its deadline) several
/// batches later; job B never started. While the source replays old events, no deadline of its jobs is judged:
/// A never pages (no fire-and-resolve pair), B pages once the source has caught up or gone quiet.
#[tokio::test(start_paused = true)]
async fn a_backlog_being_replayed_is_applied_before_its_deadlines_are_judged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("store");
    // The collector clock is 40 minutes after both submits; the source replays events from T0 on.
    let now0 = T0 + 40 * MIN;
    let mut h = start(&store, Clock::starting_at(now0), vec![]);
    let source = event_id_hash("node-agent/gpu-7");
    let batch = |h: &Harness, job: &str, ev: CompactEvent| {
        let now = h.clock.now_ms();
        let mut idx = h.index.write();
        let at = ev.at_ms;
        if !idx.jobs.contains_key(job) {
            idx.jobs.insert(job.to_string(), crate::index::HotJob { rec: urgent_job(job), ..Default::default() });
            let t = idx.jobs[job].rec.timeline.clone();
            let mut c = Vec::new();
            idx.slo.on_job(job, &t, &mut c, now);
            if let Some(hj) = idx.jobs.get_mut(job) {
                hj.slo = c;
            }
        } else {
            idx.insert(job, ev, now);
        }
        idx.note_source(job, source, at, now);
        drop(idx);
        h.wake.notify_one();
    };
    let submit = |id: &str| CompactEvent {
        at_ms: T0,
        id_hash: event_id_hash(&format!("{id}-s")),
        seq: 1,
        attempt: None,
        kind: EventKind::Submitted(Arc::new(JobAttrs::unknown())),
    };
    batch(&h, "spool/a", submit("spool/a"));
    batch(&h, "spool/b", submit("spool/b"));
    // The replay goes on for a while (batches every 500 ms, events 30 s apart): both deadlines (T0 + 10 min)
    // have long passed on the collector's clock, but nothing is judged while the source is behind.
    for i in 1..=20 {
        tokio::time::advance(Duration::from_millis(500)).await;
        let ev = CompactEvent {
            at_ms: T0 + i * 30_000,
            id_hash: event_id_hash(&format!("noise-{i}")),
            seq: 1 + i as u64,
            attempt: None,
            kind: EventKind::Checkpoint { step: i as u64, save_ms: 0 },
        };
        batch(&h, "spool/c", ev);
        tokio::task::yield_now().await;
        assert!(h.rx.try_recv().is_err(), "nothing is paged while the backlog is replayed");
    }
    // A's first step, 5 minutes after submit, arrives further down the backlog.
    let fs = CompactEvent {
        at_ms: T0 + 5 * MIN,
        id_hash: 99,
        seq: 50,
        attempt: None,
        kind: EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified },
    };
    batch(&h, "spool/a", fs);
    // The source goes quiet (its spool is drained): B, still waiting, pages; A never does.
    let fired = tokio::time::timeout(Duration::from_secs(60), h.next()).await.expect("a page once quiet");
    let keys: Vec<&str> = fired.iter().map(|a| a.key.as_str()).collect();
    // C (the job whose checkpoints made up the rest of the backlog, never started either) pages with B.
    assert_eq!(keys, ["job/urgent-start/spool/b", "job/urgent-start/spool/c"]);
    assert!(h.clock.now_ms() - now0 >= 10_000 + crate::index::SourceMarks::QUIET_MS, "judged after the quiet period");
    tokio::time::advance(Duration::from_secs(60)).await;
    tokio::task::yield_now().await;
    while let Ok(batch) = h.rx.try_recv() {
        assert!(batch.iter().all(|a| a.key != "job/urgent-start/spool/a"), "A never pages: {batch:?}");
    }
    assert!(h.board.snapshot().iter().all(|a| a.key != "job/urgent-start/spool/a"));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_crossing_older_than_page_max_age_is_counted_but_not_paged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("store");
    // First seen two hours after its deadline (history catching up): bad in the SLO, no page.
    let h = start(&store, Clock::starting_at(T0 + 130 * MIN), vec![("old/1", urgent_job("old/1"))]);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(h.board.snapshot().iter().all(|a| !a.key.starts_with("job/")), "{:?}", h.board.snapshot());
    assert_eq!(h.index.read().slo.counts(0, T0 + 130 * MIN, 86_400_000).bad, 1);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_slow_notifier_never_blocks_the_loop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("store");
    // A notifier queue of one that nobody reads, and many jobs crossing: the loop keeps going and counts drops.
    let (tx, _rx) = mpsc::channel(1);
    let jobs: BTreeMap<String, JobRecord> = (0..20).map(|i| (format!("j{i}"), urgent_job(&format!("j{i}")))).collect();
    let index = SharedIndex::new(JobIndex::new_at(
        jobs,
        Default::default(),
        1,
        SloEngine::new(SloDef::defaults()),
        limiter(),
        T0,
    ));
    let stats = Arc::new(AlertStats::default());
    let board = AlertBoard::default();
    let stop = CancellationToken::new();
    let wake = Arc::new(Notify::new());
    let l = AlertLoop {
        deadlines: applier_stand_in(&index, &wake),
        index,
        store: store.clone(),
        clock: Clock::starting_at(T0),
        config: AlertConfig { resend_interval: Duration::from_secs(1), ..alert_config() },
        board: board.clone(),
        wake,
        notifiers: vec![tx],
        stats: stats.clone(),
        base_url: String::new(),
        reconfigure: None,
        deferred: Default::default(),
        stream: None,
        scans: ScanAlerts {
            prediction: crate::slo::predict::PredictSettings { enabled: false, ..Default::default() },
            ..Default::default()
        },
    };
    let task = tokio::spawn(l.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(11 * MIN as u64)).await;
    let firing = board.snapshot();
    assert_eq!(firing.iter().filter(|a| a.firing() && a.key.starts_with("job/")).count(), 20);
    // 20 of 20 urgent jobs bad within the hour: both page rules burn far above 13.44x (28-day window).
    assert!(firing.iter().any(|a| a.key == "burn/urgent-start/page" && a.firing()), "{firing:#?}");
    assert!(stats.dropped.load(std::sync::atomic::Ordering::Relaxed) > 0);
    stop.cancel();
    task.await.expect("loop ends");
}
