use super::*;
use crate::job::{CompactEvent, EventKind, JobAttrs, JobRecord};
use proptest::prelude::*;
use std::sync::Arc;

const MIN: i64 = 60_000;

fn key(pool: &str, reason: &'static str) -> GroupKey {
    GroupKey {
        pool: pool.into(),
        priority: Some(pb::PriorityClass::Normal),
        gpu_class: Some("h100".into()),
        gpus: Some("5-8"),
        reason: Some(reason),
    }
}

fn entry(k: &GroupKey, submitted_ms: i64, outcome: Outcome) -> Entry {
    Entry { key: k.clone(), submitted_ms, outcome, gpus: 8 }
}

fn started(wait_ms: i64) -> Outcome {
    Outcome::Started { wait_ms, scheduler_error_ms: None }
}

#[test]
fn kaplan_meier_by_hand() {
    // Waits 10 (started), 20 (censored), 30, 40 (started), 50 (censored).
    let km = Km::new(vec![(10, true), (20, false), (30, true), (40, true), (50, false)]);
    // S(10) = 1 - 1/5 = 0.8; at 30, 3 at risk: 0.8 * 2/3; at 40, 2 at risk: that * 1/2.
    assert_eq!(km.survival(9), 1.0);
    assert_eq!(km.survival(10), 0.8);
    assert_eq!(km.survival(29), 0.8);
    assert!((km.survival(30) - 0.8 * 2.0 / 3.0).abs() < 1e-12);
    assert!((km.survival(45) - 0.8 / 3.0).abs() < 1e-12);
    // Unconditional: 10th percentile at the first start (0.8 <= 0.9), median at 40 (0.533 > 0.5 at 30).
    assert_eq!(km.quantile(0, 0.1), Some(10));
    assert_eq!(km.quantile(0, 0.5), Some(40));
    // The 90th is never reached (S stays 0.267): the tail from 50 with lambda = 3 starts / 150 ms at risk:
    // 50 + ln(0.2667 / 0.1) / 0.02 = 50 + 49.04 -> 50 + 50 (rounded up).
    assert_eq!(km.quantile(0, 0.9), Some(100));
    // Having waited 15: S(15) = 0.8. 10th: S <= 0.72 -> 30; median: S <= 0.4 -> 40; 90th: the tail with
    // r = 0.2667 / 0.8 = 1/3: 50 + ln(3.333) / 0.02 = 50 + 60.2 -> 111.
    assert_eq!(km.quantile(15, 0.1), Some(30));
    assert_eq!(km.quantile(15, 0.5), Some(40));
    assert_eq!(km.quantile(15, 0.9), Some(111));
    // Past every wait seen: memoryless from w, ln(1 / 0.5) / 0.02 = 34.66 -> 35.
    assert_eq!(km.quantile(70, 0.5), Some(105));
    // No start at all: nothing to say.
    assert_eq!(Km::new(vec![(10, false)]).quantile(0, 0.5), None);
}

#[test]
fn the_group_backs_off_to_wider_groups_until_one_has_enough_jobs() {
    let mut book = WaitBook::default();
    let narrow = key("a", "capacity");
    let other_reason = key("a", "quota");
    let now = 10 * 86_400_000;
    let mut n = 0u64;
    let mut add = |book: &mut WaitBook, k: &GroupKey, wait: i64| {
        n += 1;
        book.add(n, &entry(k, now - 86_400_000 + n as i64, started(wait)));
    };
    for i in 0..5 {
        add(&mut book, &narrow, (i + 1) * MIN);
    }
    for i in 0..20 {
        add(&mut book, &other_reason, (i + 1) * 10 * MIN);
    }
    // 5 jobs with the reason: the reason is dropped, 25 jobs of pool a, normal, h100, 5-8 GPUs.
    let h = book.history(&narrow, now).history.expect("history");
    assert_eq!(h.group, narrow.at_level(1));
    assert_eq!(h.jobs, 25);
    assert_eq!(h.group.reason, None);
    assert_eq!(h.group.gpus, Some("5-8"));
    // 20 jobs with their reason: used as they are.
    let h = book.history(&other_reason, now).history.expect("history");
    assert_eq!((h.group.clone(), h.jobs), (other_reason.clone(), 20));
    // A job out of the queue (preparing) skips the reason level.
    let mut no_reason = other_reason.clone();
    no_reason.reason = None;
    assert_eq!(book.history(&no_reason, now).history.map(|h| h.jobs), Some(25));
    // Another pool: nothing; a pool with 3 jobs: its pool group, few as they are.
    assert!(book.history(&key("b", "capacity"), now).history.is_none());
    for i in 0..3 {
        add(&mut book, &key("c", "capacity"), i * MIN);
    }
    let mut c8 = key("c", "capacity");
    c8.gpus = Some("129+");
    let h = book.history(&c8, now).history.expect("pool group");
    assert_eq!((h.group.clone(), h.jobs), (c8.at_level(LEVELS - 1), 3));
    // Jobs submitted before the window no longer count; prune drops them.
    assert!(book.history(&narrow, now + HISTORY_MS).history.is_none());
    book.prune(now + HISTORY_MS);
    assert!(book.is_empty());
}

#[test]
fn a_group_keeps_only_its_most_recent_jobs() {
    let mut book = WaitBook::default();
    let k = key("a", "capacity");
    for i in 0..(MAX_PER_GROUP as i64 + 100) {
        book.add(i as u64, &entry(&k, i, started(MIN)));
    }
    assert_eq!(book.len(), LEVELS * MAX_PER_GROUP);
    let h = book.history(&k, 1000).history.expect("history");
    assert_eq!(h.jobs, MAX_PER_GROUP);
    // Removing a job the cap already dropped changes nothing; removing a kept one does.
    book.remove(3, &entry(&k, 3, started(MIN)));
    assert_eq!(book.len(), LEVELS * MAX_PER_GROUP);
    book.remove(200, &entry(&k, 200, started(MIN)));
    assert_eq!(book.len(), LEVELS * (MAX_PER_GROUP - 1));
}

#[test]
fn waiting_jobs_are_censored_at_now_and_ended_ones_at_their_end() {
    let mut book = WaitBook::default();
    let k = key("a", "capacity");
    book.add(1, &entry(&k, 0, started(10)));
    book.add(2, &entry(&k, 0, Outcome::Waiting));
    book.add(3, &entry(&k, 0, Outcome::Ended { wait_ms: 5 }));
    let h = book.history(&k.at_level(LEVELS - 1), 20).history.expect("history");
    // Samples: 5 censored, 10 started, 20 censored (waiting since 0, now 20): S(10) = 1 - 1/2.
    assert_eq!(h.km, Km::new(vec![(5, false), (10, true), (20, false)]));
    assert_eq!(h.km.survival(10), 0.5);
}

fn state_of(samples: Vec<(i64, bool)>) -> QueueState {
    let similar = samples.len();
    let group = GroupKey { pool: "a".into(), priority: None, gpu_class: None, gpus: None, reason: None };
    QueueState { jobs_ahead: 3, gpus_ahead: 24, started_gpus: 16, load_ms: 1.0, group, similar, km: Km::new(samples) }
}

fn hist(samples: Vec<(i64, bool)>) -> History {
    let jobs = samples.len();
    History { group: key("a", "capacity"), jobs, km: Km::new(samples) }
}

#[test]
fn history_alone_by_hand() {
    // Waits of 10, 20, ..., 100 minutes, all started.
    let inputs = Inputs {
        history: Some(hist((1..=10).map(|i| (i * 10 * MIN, true)).collect())),
        scheduler_errors: vec![],
        queue: None,
    };
    let q = Query { wait_started_ms: 0, scheduler_estimate_ms: None, queue: None };
    // Not waited: 10th at 10 min (S = 0.9), median at 50 (S = 0.5), 90th at 90 (S = 0.1).
    let e = estimate(&inputs, &q, 0).expect("eta");
    assert_eq!((e.low_ms, e.at_ms, e.high_ms), (10 * MIN, 50 * MIN, 90 * MIN));
    assert_eq!((e.basis, e.comparable_jobs, e.waited_ms), (Basis::History, 10, 0));
    // Waited 35 minutes: S(35) = 0.7; 10th S <= 0.63 -> 40; median S <= 0.35 -> 70; 90th S <= 0.07 -> 100.
    let e = estimate(&inputs, &q, 35 * MIN).expect("eta");
    assert_eq!((e.low_ms, e.at_ms, e.high_ms, e.waited_ms), (40 * MIN, 70 * MIN, 100 * MIN, 35 * MIN));
}

#[test]
fn the_queue_state_takes_the_place_of_the_group_history() {
    // The group's waits 1..10 minutes; the similar jobs' 10, 20, ..., 100 minutes.
    let inputs = Inputs {
        history: Some(hist((1..=10).map(|i| (i * MIN, true)).collect())),
        scheduler_errors: vec![],
        queue: Some(state_of((1..=10).map(|i| (i * 10 * MIN, true)).collect())),
    };
    let q = Query { wait_started_ms: 0, scheduler_estimate_ms: None, queue: None };
    let e = estimate(&inputs, &q, 0).expect("eta");
    assert_eq!((e.low_ms, e.at_ms, e.high_ms), (10 * MIN, 50 * MIN, 90 * MIN));
    assert_eq!((e.basis, e.comparable_jobs, e.ahead), (Basis::QueueState, 10, Some((3, 24))));
    assert_eq!(e.group.map(|g| g.pool), Some("a".to_string()));
    // Conditioned on the wait as a group's curve: waited 35 minutes -> 40, 70, 100.
    let e = estimate(&inputs, &q, 35 * MIN).expect("eta");
    assert_eq!((e.low_ms, e.at_ms, e.high_ms), (40 * MIN, 70 * MIN, 100 * MIN));
    // With an uncalibrated scheduler estimate at 30 minutes: half and half.
    let q = Query { wait_started_ms: 0, scheduler_estimate_ms: Some(30 * MIN), queue: None };
    let e = estimate(&inputs, &q, 0).expect("eta");
    assert_eq!((e.low_ms, e.at_ms, e.high_ms, e.basis), (20 * MIN, 40 * MIN, 60 * MIN, Basis::QueueStateScheduler));
    assert_eq!(Basis::QueueStateScheduler.label(), "queue_state+scheduler");
}

/// An entry of pool `p` asking for `gpus`, with `priority`.
fn pool_entry(submitted_min: i64, gpus: u32, priority: pb::PriorityClass, outcome: Outcome) -> Entry {
    let mut k = key("p", "capacity");
    k.priority = Some(priority);
    k.gpus = Some(gpu_bucket(gpus));
    Entry { key: k, submitted_ms: submitted_min * MIN, outcome, gpus }
}

#[test]
fn the_queue_state_by_hand() {
    use pb::PriorityClass::{Normal, Urgent};
    let mut book = WaitBook::default();
    // 20 jobs of 8 GPUs submitted every 10 minutes from minute 700, each started after 5 minutes.
    for i in 0..20 {
        book.add(i, &pool_entry(700 + 10 * i as i64, 8, Normal, started(5 * MIN)));
    }
    // Waiting: A (900, 8 GPUs), B (950, 4 GPUs, urgent), C (980, 8 GPUs).
    book.add(100, &pool_entry(900, 8, Normal, Outcome::Waiting));
    book.add(101, &pool_entry(950, 4, Urgent, Outcome::Waiting));
    book.add(102, &pool_entry(980, 8, Normal, Outcome::Waiting));
    let now = 1000 * MIN;
    // Started in [820, 1000): the starts at 825, 835, ..., 895 -> 8 jobs, 64 GPUs.
    // A normal job of 8 GPUs submitted at 960: B (urgent) and A (earlier) are ahead, 12 GPUs;
    // load (12 + 8) x 180 / 64 = 56.25 minutes.
    let s = book.queue_state("p", Normal as i32, 8, 960 * MIN, true, now).expect("state");
    assert_eq!((s.jobs_ahead, s.gpus_ahead, s.started_gpus), (2, 12, 64));
    assert!((s.load_ms - 56.25 * MIN as f64).abs() < 1e-6, "{}", s.load_ms);
    assert_eq!(s.similar, 23);
    // No longer queued: nothing ahead, 8 x 180 / 64 = 22.5 minutes.
    let s = book.queue_state("p", Normal as i32, 8, 960 * MIN, false, now).expect("state");
    assert_eq!((s.jobs_ahead, s.gpus_ahead), (0, 0));
    assert!((s.load_ms - 22.5 * MIN as f64).abs() < 1e-6);
    // An urgent job submitted at 990: only B.
    let s = book.queue_state("p", Urgent as i32, 8, 990 * MIN, true, now).expect("state");
    assert_eq!((s.jobs_ahead, s.gpus_ahead), (1, 4));
    // The loads each job met at its submit.
    let past = past_loads(&book.pools["p"], now - HISTORY_MS, now);
    let load_of = |m: i64| past.iter().find(|j| j.submitted == m * MIN).map(|j| j.load_ms / MIN as f64);
    // Job 0 (700): nothing ahead, nothing started before -> 8 x 180 / 1.
    assert_eq!(load_of(700), Some(1440.0));
    // Job 1 (710): the start at 705 -> 8 x 180 / 8.
    assert_eq!(load_of(710), Some(180.0));
    // A (900): nothing ahead; starts at 725..895, 18 x 8 = 144 GPUs -> 8 x 180 / 144.
    assert_eq!(load_of(900), Some(10.0));
    // B (950, urgent): A is not ahead of it; starts at 775..895, 104 GPUs -> 4 x 180 / 104.
    assert!((load_of(950).expect("B") - 4.0 * 180.0 / 104.0).abs() < 1e-9);
    // C (980): A and B ahead (12 GPUs); starts at 805..895, 80 GPUs -> 20 x 180 / 80.
    assert_eq!(load_of(980), Some(45.0));
    // Samples: started after 5 minutes; waiting ones censored at now.
    assert!(past.iter().any(|j| j.submitted == 900 * MIN && j.sample == (100 * MIN, false)));
    assert!(past.iter().filter(|j| j.sample == (5 * MIN, true)).count() == 20);
    // Fewer than 20 jobs: no queue state.
    let mut small = WaitBook::default();
    for i in 0..19 {
        small.add(i, &pool_entry(700 + 10 * i as i64, 8, Normal, started(5 * MIN)));
    }
    assert!(small.queue_state("p", Normal as i32, 8, 960 * MIN, true, now).is_none());
    assert!(book.queue_state("other", Normal as i32, 8, 960 * MIN, true, now).is_none());
}

#[test]
fn the_scheduler_combines_by_precision_once_calibrated() {
    let samples = (1..=10).map(|i| (i * 10 * MIN, true)).collect();
    // 10 errors: -2, -1, 0, 1, ..., 7 minutes -> 10th: -2 (rank 1), median: 2 (rank 5), 90th: 6 (rank 9).
    let errors: Vec<i64> = (-2..=7).map(|m| m * MIN).collect();
    let inputs = Inputs { history: Some(hist(samples)), scheduler_errors: errors, queue: None };
    let q = Query { wait_started_ms: 0, scheduler_estimate_ms: Some(30 * MIN), queue: None };
    let e = estimate(&inputs, &q, 0).expect("eta");
    // Scheduler: 28, 32, 36 minutes, width E = 8; history: 10, 50, 90, width H = 80. a = (1/64) / (1/64 + 1/6400)
    // = 100/101.
    let a = 100.0 / 101.0;
    let mix = |s: i64, h: i64| (a * (s * MIN) as f64 + (1.0 - a) * (h * MIN) as f64).round() as i64;
    assert_eq!((e.low_ms, e.at_ms, e.high_ms), (mix(28, 10), mix(32, 50), mix(36, 90)));
    assert_eq!(e.basis, Basis::HistoryScheduler);
    // Uncalibrated (9 errors): the estimate as it stands, half and half.
    let few = Inputs { scheduler_errors: inputs.scheduler_errors[..9].to_vec(), ..inputs.clone() };
    let e = estimate(&few, &q, 0).expect("eta");
    assert_eq!((e.low_ms, e.at_ms, e.high_ms), (20 * MIN, 40 * MIN, 60 * MIN));
    // The scheduler alone, without history; past its estimate, now.
    let alone = Inputs { history: None, scheduler_errors: inputs.scheduler_errors.clone(), queue: None };
    let e = estimate(&alone, &q, 0).expect("eta");
    assert_eq!((e.low_ms, e.at_ms, e.high_ms, e.basis), (28 * MIN, 32 * MIN, 36 * MIN, Basis::Scheduler));
    assert_eq!((e.comparable_jobs, e.group.clone()), (0, None));
    let e = estimate(&alone, &q, 33 * MIN).expect("eta");
    assert_eq!((e.low_ms, e.at_ms, e.high_ms), (33 * MIN, 33 * MIN, 36 * MIN));
    // Nothing at all.
    assert_eq!(estimate(&Inputs::default(), &Query { scheduler_estimate_ms: None, ..q }, 0), None);
}

#[test]
fn the_queue_position_gives_a_time_to_reach_the_head() {
    // 100 at 0, 40 ten minutes later: 6 places a minute, 40 left -> 6m40s after the latest sighting.
    let p = QueueProgress::of([(0, 100), (5 * MIN, 70), (10 * MIN, 40)]).expect("progress");
    assert_eq!(p, QueueProgress { first: (0, 100), latest: (10 * MIN, 40) });
    let q = Query { wait_started_ms: 0, scheduler_estimate_ms: None, queue: Some(p) };
    let e = estimate(&Inputs::default(), &q, 10 * MIN).expect("eta");
    let r = 400_000;
    assert_eq!((e.low_ms, e.at_ms, e.high_ms), (10 * MIN + r / 2, 10 * MIN + r, 10 * MIN + 2 * r));
    assert_eq!(e.basis, Basis::QueuePosition);
    // With history: half and half.
    let inputs = Inputs {
        history: Some(hist((1..=10).map(|i| (i * 10 * MIN, true)).collect())),
        scheduler_errors: vec![],
        queue: None,
    };
    let e = estimate(&inputs, &q, 10 * MIN).expect("eta");
    // History having waited 10 minutes: S(10) = 0.9: 10th S <= 0.81 -> 20; median S <= 0.45 -> 60; 90th S <= 0.09
    // -> 100.
    let half = |x: i64, y: i64| ((x + y) as f64 / 2.0).round() as i64;
    assert_eq!(
        (e.low_ms, e.at_ms, e.high_ms, e.basis),
        (
            half(10 * MIN + r / 2, 20 * MIN),
            half(10 * MIN + r, 60 * MIN),
            half(10 * MIN + 2 * r, 100 * MIN),
            Basis::HistoryQueuePosition
        )
    );
    // A position that has not fallen says nothing.
    assert!(QueueProgress::of([(0, 5), (MIN, 5)]).and_then(|p| p.quantiles()).is_none());
    assert!(QueueProgress::of([(0, 5)]).and_then(|p| p.quantiles()).is_none());
}

#[test]
fn entries_and_scheduler_errors_come_from_the_timeline() {
    let attrs = Arc::new(JobAttrs { gpu_class: "h100".into(), gpu_count: 8, pool: "a".into(), ..JobAttrs::unknown() });
    let ev = |n: u64, at: i64, kind: EventKind| CompactEvent { at_ms: at, id_hash: n, seq: n, attempt: None, kind };
    let queued = |r: pb::WaitReason, est: Option<i64>| EventKind::Queued {
        reason: r,
        raw_reason: "x".into(),
        estimated_start: est,
    };
    let mut events = vec![
        ev(1, 0, EventKind::Submitted(attrs)),
        ev(2, 0, queued(pb::WaitReason::Priority, Some(20 * MIN))),
        ev(3, 5 * MIN, queued(pb::WaitReason::Capacity, Some(30 * MIN))),
    ];
    let waiting = JobRecord::from_events(events.clone()).timeline;
    let e = entry_of(&waiting).expect("entry");
    assert_eq!(e.outcome, Outcome::Waiting);
    // Only priority closed so far (5 minutes).
    assert_eq!(e.key.reason, Some("priority"));
    assert_eq!(query_reason(&waiting), Some("capacity"));
    assert_eq!(e.key.gpus, Some("5-8"));
    events.push(ev(4, 40 * MIN, EventKind::FirstStep { step: 0, origin: pb::StepOrigin::TrainingProcess }));
    let t = JobRecord::from_events(events.clone()).timeline;
    let e = entry_of(&t).expect("entry");
    // 35 minutes in capacity against 5 in priority; started 10 minutes after the last estimate.
    assert_eq!(e.key.reason, Some("capacity"));
    assert_eq!(e.outcome, Outcome::Started { wait_ms: 40 * MIN, scheduler_error_ms: None });
    assert_eq!(scheduler_error(&t, &events), Some(10 * MIN));
    assert_eq!(query_reason(&t), None);
}

#[test]
fn the_stream_reports_moves_past_a_tenth_of_the_remaining_wait_or_five_minutes() {
    let eta = |at: i64| Eta {
        at_ms: at,
        low_ms: at,
        high_ms: at,
        basis: Basis::History,
        comparable_jobs: 1,
        group: None,
        waited_ms: 0,
        ahead: None,
    };
    // Two hours left: 12 minutes.
    assert!(!reportable_move(Some(&eta(120 * MIN)), Some(&eta(132 * MIN)), 0));
    assert!(reportable_move(Some(&eta(120 * MIN)), Some(&eta(132 * MIN + 1)), 0));
    // Ten minutes left: 5 minutes.
    assert!(!reportable_move(Some(&eta(10 * MIN)), Some(&eta(5 * MIN)), 0));
    assert!(reportable_move(Some(&eta(10 * MIN)), Some(&eta(5 * MIN - 1)), 0));
    assert!(reportable_move(None, Some(&eta(0)), 0));
    assert!(reportable_move(Some(&eta(0)), None, 0));
    assert!(!reportable_move(None, None, 0));
}

/// Kaplan-Meier the other way: Efron's redistribution to the right. Each job starts with mass 1/n; in time order
/// (starts before censored waits at a tie) a censored job hands its mass in equal parts to every job after it.
/// `S(t)` is 1 less the mass of the starts at or before `t`.
fn efron(samples: &[(i64, bool)]) -> impl Fn(i64) -> f64 {
    let mut order = samples.to_vec();
    order.sort_by_key(|(t, started)| (*t, !*started));
    let n = order.len();
    let mut mass = vec![1.0 / n as f64; n];
    for i in 0..n {
        if !order[i].1 && i + 1 < n {
            let share = mass[i] / (n - i - 1) as f64;
            for m in mass.iter_mut().skip(i + 1) {
                *m += share;
            }
            mass[i] = 0.0;
        }
    }
    move |t| 1.0 - order.iter().zip(&mass).filter(|((x, s), _)| *s && *x <= t).map(|(_, m)| m).sum::<f64>()
}

fn samples() -> impl Strategy<Value = Vec<(i64, bool)>> {
    prop::collection::vec((0i64..20, any::<bool>()), 1..12)
}

fn inputs() -> impl Strategy<Value = (Inputs, Query)> {
    let past = prop::option::of(prop::collection::vec((0i64..500, prop::bool::weighted(0.7)), 1..40));
    let errs = prop::collection::vec(-100i64..200, 0..30);
    let est = prop::option::of(0i64..1000);
    let queue = prop::option::of(((0i64..300, 0u32..50), (0i64..300, 0u32..50)));
    let similar = prop::option::of(prop::collection::vec((0i64..500, prop::bool::weighted(0.7)), 1..40));
    (past, errs, est, queue, similar).prop_map(|(h, mut errs, est, queue, similar)| {
        errs.sort_unstable();
        let history = h.map(hist).filter(|h| h.km.events() > 0);
        let queue = queue.map(|((t1, p1), (dt, p2))| QueueProgress { first: (t1, p1), latest: (t1 + dt, p2) });
        let state = similar.map(state_of).filter(|s| s.km.events() > 0);
        (
            Inputs { history, scheduler_errors: errs, queue: state },
            Query { wait_started_ms: 0, scheduler_estimate_ms: est, queue },
        )
    })
}

proptest! {
    #[test]
    fn kaplan_meier_matches_the_redistribution_to_the_right(s in samples()) {
        let km = Km::new(s.clone());
        let brute = efron(&s);
        for t in -1..=21 {
            prop_assert!((km.survival(t) - brute(t)).abs() < 1e-9, "t {t}: {} vs {}", km.survival(t), brute(t));
        }
    }

    #[test]
    fn the_interval_holds_the_estimate_and_nothing_is_before_now((inputs, q) in inputs(), now in 0i64..2000) {
        if let Some(e) = estimate(&inputs, &q, now) {
            prop_assert!(e.low_ms <= e.at_ms && e.at_ms <= e.high_ms, "{e:?}");
            prop_assert!(e.low_ms >= now, "{e:?} now {now}");
            prop_assert_eq!(e.waited_ms, now);
        }
    }

    #[test]
    fn waiting_longer_never_moves_the_estimate_earlier((inputs, q) in inputs(), steps in prop::collection::vec(0i64..120, 1..30)) {
        let mut now = 0;
        let mut last: Option<Eta> = None;
        for s in steps {
            now += s;
            let e = estimate(&inputs, &q, now);
            if let (Some(a), Some(b)) = (&last, &e) {
                prop_assert!(b.low_ms >= a.low_ms && b.at_ms >= a.at_ms && b.high_ms >= a.high_ms, "{a:?} then {b:?}");
            }
            prop_assert_eq!(last.is_some() && e.is_none(), false);
            last = e;
        }
    }

    #[test]
    fn the_loads_past_jobs_met_match_a_direct_count(
        jobs in prop::collection::vec((0i64..400, 1u32..17, any::<bool>(), 0u8..3, 0i64..120), 1..60),
    ) {
        use pb::PriorityClass::{Normal, Urgent};
        let now = 400 * MIN;
        let mut book = WaitBook::default();
        let mut model = Vec::new();
        for (i, (sub, gpus, urgent, kind, wait)) in jobs.into_iter().enumerate() {
            let outcome = match kind {
                0 => Outcome::Waiting,
                1 => started(wait * MIN),
                _ => Outcome::Ended { wait_ms: wait * MIN },
            };
            let e = pool_entry(sub, gpus, if urgent { Urgent } else { Normal }, outcome);
            book.add(i as u64, &e);
            model.push(e);
        }
        let fin = |e: &Entry| match e.outcome {
            Outcome::Waiting => i64::MAX,
            Outcome::Started { wait_ms, .. } | Outcome::Ended { wait_ms } => e.submitted_ms + wait_ms,
        };
        let rank = |e: &Entry| (std::cmp::Reverse(priority_rank(e)), e.submitted_ms);
        let mut got = past_loads(&book.pools["p"], now - HISTORY_MS, now);
        // Directly: every pair.
        let mut want: Vec<PastJob> = model
            .iter()
            .filter(|k| k.submitted_ms < now)
            .map(|k| {
                let s = k.submitted_ms;
                let ahead: u64 = model
                    .iter()
                    .filter(|e| rank(e) < rank(k) && e.submitted_ms <= s && fin(e) > s)
                    .map(|e| u64::from(e.gpus))
                    .sum();
                let started: u64 = model
                    .iter()
                    .filter(|e| matches!(e.outcome, Outcome::Started { .. }))
                    .filter(|e| fin(e) >= s - RATE_WINDOW_MS && fin(e) < s)
                    .map(|e| u64::from(e.gpus))
                    .sum();
                let sample = match k.outcome {
                    Outcome::Waiting => (now - s, false),
                    Outcome::Started { wait_ms, .. } => (wait_ms, true),
                    Outcome::Ended { wait_ms } => (wait_ms, false),
                };
                PastJob { submitted: s, priority: priority_rank(k), gpus: k.gpus, load_ms: load_ms(ahead, k.gpus, started), sample }
            })
            .collect();
        let order = |a: &PastJob, b: &PastJob| (a.submitted, a.gpus, a.priority, a.sample).cmp(&(b.submitted, b.gpus, b.priority, b.sample));
        got.sort_by(order);
        want.sort_by(order);
        prop_assert_eq!(got, want);
    }

    #[test]
    fn the_pools_queue_holds_exactly_the_current_waiting_jobs_and_starts(
        ops in prop::collection::vec((0u64..12, 0i64..100, 0u8..4, 1u32..9), 1..80),
    ) {
        let mut model: std::collections::HashMap<u64, Entry> = Default::default();
        let mut book = WaitBook::default();
        for (job, at, kind, gpus) in ops {
            let outcome = match kind { 0 => Outcome::Waiting, 1 => started(at % 10), _ => Outcome::Ended { wait_ms: at % 10 } };
            let pr = if job % 2 == 0 { pb::PriorityClass::Normal } else { pb::PriorityClass::Urgent };
            let after = (kind < 3).then(|| pool_entry(at, gpus, pr, outcome));
            book.replace(job, model.get(&job), after.as_ref());
            match after { Some(a) => { model.insert(job, a); } None => { model.remove(&job); } }
        }
        let mut waiting: Vec<_> = model.iter().filter(|(_, e)| e.outcome == Outcome::Waiting)
            .map(|(j, e)| ((std::cmp::Reverse(priority_rank(e)), e.submitted_ms, *j), e.gpus)).collect();
        let mut starts: Vec<_> = model.iter().filter_map(|(j, e)| match e.outcome {
            Outcome::Started { wait_ms, .. } => Some(((e.submitted_ms + wait_ms, *j), e.gpus)),
            _ => None,
        }).collect();
        waiting.sort_unstable();
        starts.sort_unstable();
        match book.pools.get("p") {
            Some(p) => {
                prop_assert_eq!(p.waiting.clone().into_iter().collect::<Vec<_>>(), waiting);
                prop_assert_eq!(p.starts.clone().into_iter().collect::<Vec<_>>(), starts);
                prop_assert_eq!(p.jobs.len(), model.len());
            }
            None => prop_assert!(model.is_empty()),
        }
    }

    #[test]
    fn the_book_holds_exactly_the_current_entries(ops in prop::collection::vec((0u64..12, 0usize..4, 0i64..100, 0u8..3), 1..80)) {
        // A model: the entries as they are now; the book sees each change as a replacement.
        let mut model: std::collections::HashMap<u64, Entry> = Default::default();
        let mut book = WaitBook::default();
        let reasons = ["capacity", "quota", "priority", "unreported"];
        for (job, r, at, kind) in ops {
            let outcome = match kind { 0 => Outcome::Waiting, 1 => started(at), _ => Outcome::Ended { wait_ms: at } };
            let mut k = key(if job % 2 == 0 { "a" } else { "b" }, reasons[r]);
            if job % 3 == 0 { k.gpus = Some("1"); }
            let after = (kind < 3 && at % 7 != 0).then(|| entry(&k, at, outcome));
            book.replace(job, model.get(&job), after.as_ref());
            match after { Some(a) => { model.insert(job, a); } None => { model.remove(&job); } }
        }
        let now = 200;
        for level in 0..LEVELS {
            let groups: std::collections::BTreeSet<GroupKey> = model.values().map(|e| e.key.at_level(level)).collect();
            for g in groups {
                let mut want: Vec<(i64, bool)> = model.values().filter(|e| e.key.at_level(level) == g).map(|e| match e.outcome {
                    Outcome::Waiting => (now - e.submitted_ms, false),
                    Outcome::Started { wait_ms, .. } => (wait_ms, true),
                    Outcome::Ended { wait_ms } => (wait_ms, false),
                }).collect();
                let (mut got, _) = book.samples(&g, now);
                want.sort_unstable();
                got.sort_unstable();
                prop_assert_eq!(got, want);
            }
        }
        prop_assert_eq!(book.len(), model.len() * LEVELS);
    }
}
