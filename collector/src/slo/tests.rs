//! SLO maths: table tests of the rules, properties (good + bad = total; budget and burn identities; order and
//! lateness do not change counts), and percentiles checked against exact order statistics.

use super::*;
use crate::job::{event_id_hash, CompactEvent, EventKind, JobAttrs, JobRecord};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

const T0: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z, an hour boundary
const MIN: i64 = 60_000;

fn attrs(priority: pb::PriorityClass) -> Arc<JobAttrs> {
    Arc::new(JobAttrs {
        pool_kind: pb::PoolKind::Managed,
        provider: "sagemaker".into(),
        pool: "p".into(),
        priority,
        gpu_class: "h100".into(),
        gpu_count: 8,
        node_count: 1,
        region: "r".into(),
        team: String::new(),
        project: String::new(),
        chain_id: String::new(),
        chain_stage: String::new(),
        labels: Default::default(),
    })
}

fn ev(job: &str, n: u32, at: i64, kind: EventKind) -> CompactEvent {
    CompactEvent { at_ms: at, id_hash: event_id_hash(&format!("{job}-{n}")), seq: 0, attempt: None, kind }
}

fn urgent_slo() -> SloDef {
    SloDef::defaults().remove(0)
}

/// The independent rule, written the plain way: (good, bad, excluded) for a job, or None when pending.
fn expected(
    sub: i64,
    first_step: Option<i64>,
    done: Option<(i64, pb::Outcome)>,
    now: i64,
    threshold: i64,
) -> Option<&'static str> {
    match (first_step, done) {
        (Some(f), _) => Some(if f - sub <= threshold { "good" } else { "bad" }),
        (None, Some((d, o))) => {
            Some(if o == pb::Outcome::Cancelled && d < sub + threshold { "excluded" } else { "bad" })
        }
        (None, None) => (now >= sub + threshold).then_some("bad"),
    }
}

#[test]
fn standing_rules() {
    let def = urgent_slo();
    let sub = ev("j", 0, T0, EventKind::Submitted(attrs(pb::PriorityClass::Urgent)));
    let rec = |extra: Vec<CompactEvent>| {
        let mut all = vec![sub.clone()];
        all.extend(extra);
        JobRecord::from_events(all)
    };
    let a = |r: &JobRecord, now| assess(0, &def, &r.timeline, now).map(|c| (c.standing, c.breached_waiting));
    // Waiting, before and after the deadline.
    let waiting = rec(vec![]);
    assert_eq!(a(&waiting, T0 + 9 * MIN), Some((Standing::Pending { deadline_ms: T0 + 10 * MIN }, false)));
    assert_eq!(a(&waiting, T0 + 10 * MIN), Some((Standing::Bad { at_ms: T0 + 10 * MIN }, true)));
    // Started in time; started late (bad, decided at the deadline).
    let fast = rec(vec![ev(
        "j",
        1,
        T0 + 10 * MIN,
        EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified },
    )]);
    assert_eq!(a(&fast, T0 + 60 * MIN), Some((Standing::Good { at_ms: T0 + 10 * MIN }, false)));
    let slow = rec(vec![ev(
        "j",
        1,
        T0 + 25 * MIN,
        EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified },
    )]);
    assert_eq!(a(&slow, T0 + 60 * MIN), Some((Standing::Bad { at_ms: T0 + 10 * MIN }, false)));
    // Failed to start: bad at the failure. Cancelled before the deadline: excluded; after it: bad at the deadline.
    let done = |at, outcome| rec(vec![ev("j", 1, at, EventKind::Done { outcome, exit_code: None })]);
    assert_eq!(
        a(&done(T0 + 3 * MIN, pb::Outcome::Failed), T0 + 60 * MIN),
        Some((Standing::Bad { at_ms: T0 + 3 * MIN }, false))
    );
    assert_eq!(a(&done(T0 + 3 * MIN, pb::Outcome::Cancelled), T0 + 60 * MIN), Some((Standing::Excluded, false)));
    assert_eq!(
        a(&done(T0 + 30 * MIN, pb::Outcome::Cancelled), T0 + 60 * MIN),
        Some((Standing::Bad { at_ms: T0 + 10 * MIN }, false))
    );
    // Not covered: a normal job.
    let normal = JobRecord::from_events(vec![ev("n", 0, T0, EventKind::Submitted(attrs(pb::PriorityClass::Normal)))]);
    assert_eq!(a(&normal, T0), None);
}

/// An urgent job (10-minute threshold) whose container starts 8 minutes after submit: good by the container start.
/// The training process's first step, 13 minutes after submit, arrives later: it supersedes the container start,
/// so the job turns bad (decided at the deadline) and its time to first step and source move with it.
#[test]
fn a_trainer_first_step_after_the_container_start_restates_the_decision_and_its_source() {
    let mut e = SloEngine::new(vec![urgent_slo()]);
    let mut jobs = BTreeMap::new();
    let sub = ev("j", 0, T0, EventKind::Submitted(attrs(pb::PriorityClass::Urgent)));
    let container = ev("j", 1, T0 + 8 * MIN, EventKind::FirstStep { step: 0, origin: pb::StepOrigin::ContainerStart });
    jobs.insert("j".to_string(), Tracked::of(JobRecord::from_events(vec![sub, container])));
    rebuild(&mut e, &mut jobs, T0 + 9 * MIN);
    let status = |e: &SloEngine, now| e.status(0, now, 3_600_000).expect("status");
    let s = status(&e, T0 + 9 * MIN);
    assert_eq!((s.good, s.bad), (1, 0));
    assert_eq!(s.first_steps_by_origin, [0, 0, 1, 0], "one container start");
    assert_eq!(s.ttfs_seconds.map(|p| p.max), Some(480.0));
    let tr = jobs.get_mut("j").expect("job");
    tr.rec.insert(ev("j", 2, T0 + 13 * MIN, EventKind::FirstStep { step: 1, origin: pb::StepOrigin::TrainingProcess }));
    e.on_job("j", &tr.rec.timeline, &mut tr.slo, T0 + 14 * MIN);
    let s = status(&e, T0 + 14 * MIN);
    assert_eq!((s.good, s.bad), (0, 1), "13 minutes is past the threshold");
    assert_eq!(s.first_steps_by_origin, [0, 1, 0, 0], "the trainer's, not also the container's");
    assert_eq!(s.ttfs_seconds.map(|p| (p.count, p.max)), Some((1, 780.0)));
}

#[test]
fn late_first_step_moves_a_breach_to_good_without_double_counting() {
    let mut e = SloEngine::new(vec![urgent_slo()]);
    let mut jobs = BTreeMap::new();
    jobs.insert(
        "j".to_string(),
        Tracked::of(JobRecord::from_events(vec![ev(
            "j",
            0,
            T0,
            EventKind::Submitted(attrs(pb::PriorityClass::Urgent)),
        )])),
    );
    rebuild(&mut e, &mut jobs, T0);
    assert_eq!(e.next_deadline(), Some(T0 + 10 * MIN));
    assert_eq!(advance(&mut e, &mut jobs, T0 + 10 * MIN), 1);
    assert_eq!(e.take_changes(), vec![PageChange { slo: 0, job_id: "j".into(), firing: true }]);
    assert_eq!(e.counts(0, T0 + 11 * MIN, 3_600_000), Counts { good: 0, bad: 1 });
    // The first step, stamped 9 minutes after submit, arrives late.
    let tr = jobs.get_mut("j").expect("job");
    tr.rec.insert(ev(
        "j",
        1,
        T0 + 9 * MIN,
        EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified },
    ));
    e.on_job("j", &tr.rec.timeline, &mut tr.slo, T0 + 12 * MIN);
    assert_eq!(e.counts(0, T0 + 12 * MIN, 3_600_000), Counts { good: 1, bad: 0 });
    assert_eq!(e.take_changes(), vec![PageChange { slo: 0, job_id: "j".into(), firing: false }]);
    assert_eq!(e.next_deadline(), None);
}

/// The decision counters: each job once when decided, a restatement counted apart, history not counted.
#[test]
fn decisions_are_counted_once_and_a_restatement_apart() {
    let mut e = SloEngine::new(vec![urgent_slo()]);
    let mut jobs = BTreeMap::new();
    let job = |id: &str, extra: Vec<CompactEvent>| {
        let mut v = vec![ev(id, 0, T0, EventKind::Submitted(attrs(pb::PriorityClass::Urgent)))];
        v.extend(extra);
        Tracked::of(JobRecord::from_events(v))
    };
    // Restored history: one good job, assessed before counting starts.
    jobs.insert(
        "old".to_string(),
        job(
            "old",
            vec![ev(
                "old",
                1,
                T0 + MIN,
                EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified },
            )],
        ),
    );
    rebuild(&mut e, &mut jobs, T0 + 2 * MIN);
    assert_eq!(e.decisions(0), Decisions::default(), "history is not counted");
    e.start_counting();
    // A job that starts in time: good once, however often it is re-assessed.
    let mut a = job("a", vec![]);
    e.on_job("a", &a.rec.timeline, &mut a.slo, T0 + 2 * MIN);
    a.rec.insert(ev(
        "a",
        1,
        T0 + 3 * MIN,
        EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified },
    ));
    for now in [T0 + 3 * MIN, T0 + 4 * MIN] {
        e.on_job("a", &a.rec.timeline, &mut a.slo, now);
    }
    // A job judged bad at its deadline, then restated good by a late first step.
    let mut b = job("b", vec![]);
    e.on_job("b", &b.rec.timeline, &mut b.slo, T0 + 2 * MIN);
    e.on_job("b", &b.rec.timeline, &mut b.slo, T0 + 10 * MIN);
    assert_eq!(e.decisions(0), Decisions { good: 1, bad: 1, restated_good: 0, restated_bad: 0 });
    b.rec.insert(ev(
        "b",
        1,
        T0 + 9 * MIN,
        EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified },
    ));
    e.on_job("b", &b.rec.timeline, &mut b.slo, T0 + 12 * MIN);
    assert_eq!(e.decisions(0), Decisions { good: 1, bad: 1, restated_good: 1, restated_bad: 0 });
    // The window gauges show the corrected figures (plus the restored job).
    assert_eq!(e.counts(0, T0 + 12 * MIN, 3_600_000), Counts { good: 3, bad: 0 });
    // A job whose submit and (late) first step are applied in one group commit is one good decision, not a bad
    // one restated: the group is counted by its outcome.
    let mut c = job("c", vec![]);
    let mut contribs = std::collections::HashMap::new();
    e.begin_group();
    e.on_job("c", &c.rec.timeline, &mut c.slo, T0 + 30 * MIN);
    c.rec.insert(ev(
        "c",
        1,
        T0 + 5 * MIN,
        EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified },
    ));
    e.on_job("c", &c.rec.timeline, &mut c.slo, T0 + 30 * MIN);
    contribs.insert("c".to_string(), c.slo.clone());
    e.end_group(|id| contribs.get(id).cloned());
    assert_eq!(e.decisions(0), Decisions { good: 2, bad: 1, restated_good: 1, restated_bad: 0 });
    // A reload keeps the counters of an SLO that keeps its name.
    let mut next = SloEngine::new(vec![urgent_slo()]);
    next.carry_decisions(&e);
    assert_eq!(next.decisions(0), e.decisions(0));
}

#[test]
fn late_submitted_places_the_job_by_its_own_times() {
    let mut e = SloEngine::new(vec![urgent_slo()]);
    let mut rec = JobRecord::from_events(vec![ev(
        "j",
        1,
        T0 - 2 * 86_400_000 + 5 * MIN,
        EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified },
    )]);
    let mut slo = Vec::new();
    e.on_job("j", &rec.timeline, &mut slo, T0);
    assert_eq!(e.counts(0, T0, 28 * 86_400_000).total(), 0, "not covered until submitted arrives");
    rec.insert(ev("j", 0, T0 - 2 * 86_400_000, EventKind::Submitted(attrs(pb::PriorityClass::Urgent))));
    e.on_job("j", &rec.timeline, &mut slo, T0);
    // Decided two days ago: inside 3d, outside 1d.
    assert_eq!(e.counts(0, T0, 3 * 86_400_000), Counts { good: 1, bad: 0 });
    assert_eq!(e.counts(0, T0, 86_400_000).total(), 0);
}

/// A job's submit time, effective first step and end, as the test computes them.
type Truth = (i64, Option<i64>, Option<(i64, pb::Outcome)>);

/// A random job: submit offset, optional first-step delay, optional end.
fn arb_job() -> impl Strategy<Value = (i64, Option<i64>, Option<(i64, u8)>, bool)> {
    (0i64..6 * 60, prop::option::of(1i64..40), prop::option::of((1i64..40, 0u8..3)), any::<bool>())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn counts_match_an_independent_computation_whatever_the_arrival_order(
        jobs in proptest::collection::vec(arb_job(), 1..40),
        order in proptest::collection::vec(any::<prop::sample::Index>(), 0..200),
        now_off in 0i64..8 * 60,
    ) {
        let def = urgent_slo();
        let threshold = def.threshold_ms;
        let now = T0 + now_off * MIN;
        // Build every job's events, in minutes.
        let mut events: Vec<(String, CompactEvent)> = Vec::new();
        let mut truth: Vec<Truth> = Vec::new();
        for (i, (sub_m, fs, done, urgent)) in jobs.iter().enumerate() {
            if !urgent { continue; }
            let id = format!("j{i}");
            let sub = T0 + sub_m * MIN;
            events.push((id.clone(), ev(&id, 0, sub, EventKind::Submitted(attrs(pb::PriorityClass::Urgent)))));
            let fs_at = fs.map(|d| sub + d * MIN).filter(|t| *t <= now);
            let done_at = done.map(|(d, o)| (sub + d * MIN, [pb::Outcome::Failed, pb::Outcome::Cancelled, pb::Outcome::Succeeded][o as usize])).filter(|(t, _)| *t <= now);
            if let Some(f) = fs_at { events.push((id.clone(), ev(&id, 1, f, EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified }))); }
            if let Some((d, o)) = done_at { events.push((id.clone(), ev(&id, 2, d, EventKind::Done { outcome: o, exit_code: None }))); }
            // What the timeline will hold: done absorbs a later first step, and a first step after done is ignored.
            let eff_fs = match (fs_at, done_at) { (Some(f), Some((d, _))) if f > d => None, (f, _) => f };
            truth.push((sub, eff_fs, done_at));
        }
        // Deliver in a scrambled order (with repeats), re-assessing each time, then everything once more.
        let mut e = SloEngine::new(vec![def]);
        let mut recs: BTreeMap<String, Tracked> = BTreeMap::new();
        let deliver = |e: &mut SloEngine, recs: &mut BTreeMap<String, Tracked>, (id, evt): &(String, CompactEvent)| {
            let r = recs.entry(id.clone()).or_insert_with(|| Tracked::of(JobRecord::default()));
            r.rec.insert(evt.clone());
            e.on_job(id, &r.rec.timeline, &mut r.slo, now);
        };
        for ix in &order {
            if !events.is_empty() { deliver(&mut e, &mut recs, &events[ix.index(events.len())]); }
        }
        for item in &events { deliver(&mut e, &mut recs, item); }
        advance(&mut e, &mut recs, now);

        let (mut good, mut bad) = (0u64, 0u64);
        for (sub, fs, done) in &truth {
            match expected(*sub, *fs, *done, now, threshold) {
                Some("good") => good += 1,
                Some("bad") => bad += 1,
                _ => {}
            }
        }
        let c = e.counts(0, now, 400 * 86_400_000);
        prop_assert_eq!(c, Counts { good, bad });
        // A fresh engine rebuilt from the final records agrees.
        let mut fresh = SloEngine::new(vec![urgent_slo()]);
        rebuild(&mut fresh, &mut recs, now);
        prop_assert_eq!(fresh.counts(0, now, 400 * 86_400_000), c);
        // Identities.
        let st = e.status(0, now, 28 * 86_400_000).expect("status");
        prop_assert_eq!(st.good + st.bad, st.total);
        if st.total > 0 {
            let budget = 1.0 - st.objective;
            prop_assert!((st.compliance - st.good as f64 / st.total as f64).abs() < 1e-12);
            prop_assert!((st.error_budget_remaining - (1.0 - st.bad as f64 / (st.total as f64 * budget))).abs() < 1e-9);
            // Burn rate over the whole window times the budget is the bad share; remaining budget = 1 - that burn.
            let burn = burn_rate(c, st.objective);
            prop_assert!((burn * budget - st.bad as f64 / st.total as f64).abs() < 1e-12);
            prop_assert!((st.error_budget_remaining - (1.0 - burn)).abs() < 1e-9);
        }
    }
}

#[test]
fn percentiles_are_the_exact_order_statistics() {
    let mut e = SloEngine::new(vec![SloDef { threshold_ms: 86_400_000, ..urgent_slo() }]);
    let mut rng = 0x2545F4914F6CDD1Du64;
    let mut values = Vec::new();
    for i in 0..5000u32 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // Heavy-tailed waits from 1 s to ~3 hours.
        let u = (rng >> 11) as f64 / (1u64 << 53) as f64;
        let ttfs = (1000.0 * (1.0 / (1.0 - u * 0.99)).powf(2.0)) as i64;
        let id = format!("p{i}");
        let sub = T0 + 1800 * 1000 - ttfs.min(1_700_000); // every start falls inside the queried window
        let start = sub + ttfs;
        let rec = JobRecord::from_events(vec![
            ev(&id, 0, sub, EventKind::Submitted(attrs(pb::PriorityClass::Urgent))),
            ev(&id, 1, start, EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified }),
        ]);
        e.on_job(&id, &rec.timeline, &mut Vec::new(), start + 1);
        values.push(ttfs as f64 / 1000.0);
    }
    values.sort_by(f64::total_cmp);
    let exact = |q: f64| values[((q * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1];
    let st = e.status(0, T0 + 20 * 86_400_000, 28 * 86_400_000).expect("status");
    let p = st.ttfs_seconds.expect("percentiles");
    assert_eq!(p.count, 5000);
    for (got, q) in [(p.p50, 0.5), (p.p90, 0.9), (p.p95, 0.95), (p.p99, 0.99), (p.max, 1.0)] {
        let want = exact(q);
        assert_eq!(got, want, "q{q}: reported {got} vs exact {want}");
    }
}

#[test]
fn percentiles_of_waits_of_90_and_400_days_are_not_capped() {
    const DAY: i64 = 86_400_000;
    let mut e = SloEngine::new(vec![SloDef { threshold_ms: DAY, ..urgent_slo() }]);
    let start = T0 + 1800 * 1000;
    let mut exact = Vec::new();
    for (i, days) in [90i64, 400, 400].into_iter().enumerate() {
        let id = format!("long{i}");
        let ttfs = days * DAY + 12_345;
        let rec = JobRecord::from_events(vec![
            ev(&id, 0, start - ttfs, EventKind::Submitted(attrs(pb::PriorityClass::Urgent))),
            ev(&id, 1, start, EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified }),
        ]);
        e.on_job(&id, &rec.timeline, &mut Vec::new(), start + 1);
        exact.push(ttfs as f64 / 1000.0);
    }
    let st = e.status(0, T0 + 86_400_000, 28 * DAY).expect("status");
    let p = st.ttfs_seconds.expect("percentiles");
    assert_eq!(p.count, 3);
    // Nearest-rank order statistics of (90 d, 400 d, 400 d), in seconds, computed here.
    for (got, want) in [(p.p50, exact[1]), (p.max, exact[2])] {
        assert_eq!(got, want, "reported {got} s vs exact {want} s");
    }
    let (lone, want) = {
        let mut e = SloEngine::new(vec![SloDef { threshold_ms: DAY, ..urgent_slo() }]);
        let ttfs = 90 * DAY;
        let rec = JobRecord::from_events(vec![
            ev("ninety", 0, start - ttfs, EventKind::Submitted(attrs(pb::PriorityClass::Urgent))),
            ev(
                "ninety",
                1,
                start,
                EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified },
            ),
        ]);
        e.on_job("ninety", &rec.timeline, &mut Vec::new(), start + 1);
        (e.status(0, T0 + DAY, 28 * DAY).and_then(|s| s.ttfs_seconds).expect("percentiles"), 90.0 * 86_400.0)
    };
    for got in [lone.p50, lone.p99, lone.max] {
        assert_eq!(got, want, "reported {got} s vs exact {want} s");
    }
}

/// A job and its remembered contributions, as the index keeps them.
struct Tracked {
    rec: JobRecord,
    slo: Vec<Contribution>,
}

impl Tracked {
    fn of(rec: JobRecord) -> Self {
        Tracked { rec, slo: Vec::new() }
    }
}

/// Assesses every job from scratch, as the index does after a restore.
fn rebuild(e: &mut SloEngine, jobs: &mut BTreeMap<String, Tracked>, now: i64) {
    for (id, t) in jobs.iter_mut() {
        t.slo.clear();
        e.on_job(id, &t.rec.timeline, &mut t.slo, now);
    }
}

/// Re-assesses the jobs whose deadline passed, as the index does.
fn advance(e: &mut SloEngine, jobs: &mut BTreeMap<String, Tracked>, now: i64) -> usize {
    let due = e.take_due(now);
    for id in &due {
        if let Some(t) = jobs.get_mut(id) {
            e.on_job(id, &t.rec.timeline, &mut t.slo, now);
        }
    }
    due.len()
}

#[test]
fn history_counts_each_window_like_an_independent_count_of_decisions() {
    // 60 days of urgent jobs, one every ~17 minutes, some late: each decision's time and verdict is known here
    // from the plain rule, and every history point's windows must hold exactly the decisions in them.
    let def = urgent_slo();
    let mut e = SloEngine::new(vec![def.clone()]);
    let mut decided: Vec<(i64, bool)> = Vec::new();
    let mut rng = 0x9E3779B97F4A7C15u64;
    let end = T0 + 60 * 86_400_000;
    let mut sub = T0;
    let mut n = 0u32;
    while sub < end - 86_400_000 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let wait = (rng % (20 * MIN as u64)) as i64;
        let id = format!("h{n}");
        let rec = JobRecord::from_events(vec![
            ev(&id, 0, sub, EventKind::Submitted(attrs(pb::PriorityClass::Urgent))),
            ev(
                &id,
                1,
                sub + wait,
                EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified },
            ),
        ]);
        e.on_job(&id, &rec.timeline, &mut Vec::new(), sub + wait + 1);
        let good = wait <= def.threshold_ms;
        decided.push((if good { sub + wait } else { sub + def.threshold_ms }, good));
        sub += 17 * MIN + (rng % 1000) as i64;
        n += 1;
    }
    e.prune(end);
    let windows = [3_600_000, 86_400_000];
    let from = end - def.window_ms;
    let points = e.history(0, from, end, 6 * 3_600_000, &windows);
    assert_eq!(points.len() as i64, def.window_ms / (6 * 3_600_000) + 1);
    assert_eq!(points.last().map(|p| p.at_ms), Some(end));
    // Minute buckets: a window [at - w, at] holds the decisions whose minute starts in it.
    let count = |at: i64, w: i64| {
        let lo = (at - w).div_euclid(MIN) * MIN;
        let (mut good, mut bad) = (0, 0);
        for (t, g) in &decided {
            let minute = t.div_euclid(MIN) * MIN;
            if minute >= lo && minute <= at {
                if *g {
                    good += 1
                } else {
                    bad += 1
                }
            }
        }
        window::Counts { good, bad }
    };
    for p in &points {
        assert_eq!(p.window, count(p.at_ms, def.window_ms), "SLO window at {}", p.at_ms);
        assert!(p.window.total() > 0);
        for (w, c) in windows.iter().zip(&p.windows) {
            assert_eq!(*c, count(p.at_ms, *w), "{w} ms window at {}", p.at_ms);
        }
    }
    // The last point is the status now.
    let st = e.status(0, end, def.window_ms).expect("status");
    let last = &points[points.len() - 1];
    assert_eq!((last.window.good, last.window.bad), (st.good, st.bad));
}
