use super::engine::{self, FleetConfig, Trace};
use super::*;
use pb::lifecycle_event::Kind;
use std::collections::{BTreeMap, HashMap};

const T0: i64 = 1_767_225_600_000; // 2026-01-01T00:00Z
const DAY: i64 = 86_400_000;

fn at(e: &pb::LifecycleEvent) -> i64 {
    timestamp_to_ms(e.occurred_at.as_ref().expect("time"))
}

fn week(seed: u64, jobs_per_hour: f64, days: i64) -> (Vec<Pool>, Trace) {
    let pools = model::fleet(0, 0, jobs_per_hour);
    let n = (jobs_per_hour * days as f64 * 24.0) as u64;
    let times = arrivals(seed, n, T0, T0 + days * DAY);
    let cfg = FleetConfig::new(seed, pools.clone(), T0);
    (pools, engine::simulate(cfg, &times, T0 + days * DAY))
}

fn label_limit(s: &pb::Submitted) -> i64 {
    s.labels.get("time_limit_minutes").and_then(|v| v.parse::<i64>().ok()).expect("time limit label") * 60_000
}

fn node_of(gpu_id: &str) -> u32 {
    let n = gpu_id.rsplit("-node-").next().and_then(|r| r.split('/').next()).expect("node");
    n.parse().expect("node number")
}

/// The rank of a job: urgent first, then by submit time.
fn key(x: &Seen) -> (bool, i64) {
    (!x.urgent, x.submit)
}

/// A job as the checker sees it from the events.
#[derive(Debug, Clone)]
struct Seen {
    pool: usize,
    urgent: bool,
    submit: i64,
    gpus: u32,
    nodes: u32,
    team: String,
    limit: i64,
    /// Waiting and eligible (its wait reported) since.
    waiting: bool,
    running: Option<(i64, Vec<String>)>,
    interrupted: bool,
}

/// An independent model of what the scheduler may do, fed the events (and node changes) in order: every rule
/// of the brief checked at each start.
struct Checker<'a> {
    pools: &'a [Pool],
    backfill: bool,
    jobs: HashMap<String, Seen>,
    used: Vec<HashMap<u32, u8>>,
    down: Vec<std::collections::HashSet<u32>>,
    starts: u64,
    backfilled: u64,
    ended: u64,
}

impl<'a> Checker<'a> {
    fn new(pools: &'a [Pool], backfill: bool) -> Self {
        Checker {
            pools,
            backfill,
            jobs: HashMap::new(),
            used: vec![HashMap::new(); pools.len()],
            down: vec![Default::default(); pools.len()],
            starts: 0,
            backfilled: 0,
            ended: 0,
        }
    }

    fn free(&self, p: usize, n: u32) -> u32 {
        if self.down[p].contains(&n) {
            0
        } else {
            8 - self.used[p].get(&n).map_or(0, |b| b.count_ones())
        }
    }

    fn fits_with(&self, p: usize, free: &[u32], j: &Seen) -> bool {
        let per = j.gpus.div_ceil(j.nodes);
        let _ = p;
        free.iter().filter(|f| **f >= per).count() as u32 >= j.nodes
    }

    fn free_now(&self, p: usize) -> Vec<u32> {
        (0..self.pools[p].nodes).map(|n| self.free(p, n)).collect()
    }

    /// The earliest time `k` fits if running jobs of pool `p` end at their time limits.
    fn shadow(&self, p: usize, k: &Seen, now: i64) -> Option<i64> {
        let mut free = self.free_now(p);
        if self.fits_with(p, &free, k) {
            return Some(now);
        }
        let mut ends: Vec<(i64, &Vec<String>)> = self
            .jobs
            .values()
            .filter(|j| j.pool == p)
            .filter_map(|j| j.running.as_ref().map(|(s, g)| (s + j.limit, g)))
            .collect();
        ends.sort_by_key(|(e, _)| *e);
        for (e, gpus) in ends {
            for g in gpus {
                let n = node_of(g);
                if !self.down[p].contains(&n) {
                    free[n as usize] += 1;
                }
            }
            if self.fits_with(p, &free, k) {
                return Some(e.max(now));
            }
        }
        None
    }

    /// GPUs `j`'s team holds in pool `p` as the scheduler saw it when it looked at `j` at `t`: runs started at `t`
    /// by jobs ranked after `j` came later in that pass.
    fn team_used(&self, p: usize, j: &Seen, t: i64) -> u32 {
        self.jobs
            .values()
            .filter(|x| x.pool == p && !x.urgent && x.team == j.team)
            .filter(|x| x.running.as_ref().is_some_and(|(s, _)| *s < t || key(x) < key(j)))
            .map(|x| x.gpus)
            .sum()
    }

    fn quota_blocked(&self, p: usize, j: &Seen, t: i64) -> bool {
        let pool = &self.pools[p];
        !j.urgent && pool.scheduler() == model::Scheduler::Slurm && self.team_used(p, j, t) + j.gpus > pool.team_limit()
    }

    fn event(&mut self, e: &pb::LifecycleEvent) {
        let t = at(e);
        match e.kind.as_ref().expect("kind") {
            Kind::Submitted(s) => {
                let pool = self.pools.iter().position(|p| p.name == s.pool).expect("pool");
                let seen = Seen {
                    pool,
                    urgent: s.priority == pb::PriorityClass::Urgent as i32,
                    submit: t,
                    gpus: s.gpu_count,
                    nodes: s.node_count,
                    team: s.team.clone(),
                    limit: label_limit(s),
                    waiting: false,
                    running: None,
                    interrupted: false,
                };
                assert!(self.jobs.insert(e.job_id.clone(), seen).is_none(), "{} submitted twice", e.job_id);
            }
            Kind::Queued(_) => {
                let j = self.jobs.get_mut(&e.job_id).expect("submitted first");
                assert!(t >= j.submit && j.running.is_none(), "{}: queued while running", e.job_id);
                j.waiting = true;
            }
            Kind::NodeAssigned(n) => self.start(e, t, n),
            Kind::Preempted(_) | Kind::NodeLost(_) | Kind::Done(_) => {
                let j = self.jobs.get_mut(&e.job_id).expect("submitted first");
                let done = matches!(e.kind, Some(Kind::Done(_)));
                if let Some((_, gpus)) = j.running.take() {
                    let p = j.pool;
                    for g in &gpus {
                        let n = node_of(g);
                        let bit = 1u8 << g.rsplit('/').next().and_then(|x| x.parse::<u8>().ok()).expect("gpu");
                        let u = self.used[p].entry(n).or_default();
                        *u &= !bit;
                    }
                } else {
                    assert!(done, "{}: stopped while not running", e.job_id);
                }
                let j = self.jobs.get_mut(&e.job_id).expect("job");
                j.waiting = false;
                if done {
                    self.jobs.remove(&e.job_id);
                    self.ended += 1;
                } else {
                    j.interrupted = true;
                }
            }
            Kind::Requeued(_) => {
                let j = self.jobs.get_mut(&e.job_id).expect("job");
                assert!(j.interrupted && j.running.is_none(), "{}: requeued without a stop", e.job_id);
            }
            _ => {}
        }
    }

    fn start(&mut self, e: &pb::LifecycleEvent, t: i64, n: &pb::NodeAssigned) {
        let j = self.jobs.get(&e.job_id).expect("submitted and not over").clone();
        assert!(t >= j.submit, "{} started before its submit", e.job_id);
        assert!(j.waiting && j.running.is_none(), "{}: started while not waiting", e.job_id);
        let p = j.pool;
        let pool = &self.pools[p];
        assert!(!pool.crunches.iter().any(|(a, b)| (*a..*b).contains(&t)), "{} started in a crunch", e.job_id);
        self.starts += 1;
        if pool.kind == pb::PoolKind::Managed {
            if !j.urgent && pool.quota_gpus > 0 {
                let held: u32 = self
                    .jobs
                    .values()
                    .filter(|x| x.pool == p && !x.urgent && x.running.is_some())
                    .map(|x| x.gpus)
                    .sum();
                assert!(held + j.gpus <= pool.quota_gpus, "{}: {held} + {} over the quota", pool.name, j.gpus);
            }
        } else {
            assert_eq!(n.gpu_ids.len() as u32, j.gpus, "{}: GPUs named", e.job_id);
            assert!(!self.quota_blocked(p, &j, t), "{} started over its team's limit", e.job_id);
            // Higher-ranked jobs waiting, eligible and not held by their team's limit.
            let higher: Vec<&Seen> = self
                .jobs
                .values()
                .filter(|x| x.pool == p && x.waiting && key(x) < key(&j) && !self.quota_blocked(p, x, t))
                .collect();
            let strict = !self.backfill || pool.scheduler() == model::Scheduler::Kueue;
            if !higher.is_empty() {
                assert!(
                    !strict,
                    "{}: {} started with a higher-ranked job waiting in strict order",
                    pool.name, e.job_id
                );
                // Backfill: some higher job does not fit, and this one ends by that job's reservation.
                let free = self.free_now(p);
                let protected = higher
                    .iter()
                    .filter(|k| !self.fits_with(p, &free, k))
                    .any(|k| t + j.limit <= self.shadow(p, k, t).unwrap_or(i64::MAX));
                assert!(
                    protected,
                    "{}: {} started at {t} ahead of {:?} without backfill's guarantee; free {free:?}",
                    pool.name, e.job_id, higher
                );
                self.backfilled += 1;
            }
            for g in &n.gpu_ids {
                let node = node_of(g);
                assert!(node < pool.nodes, "{g} outside the pool");
                let bit = 1u8 << g.rsplit('/').next().and_then(|x| x.parse::<u8>().ok()).expect("gpu");
                let u = self.used[p].entry(node).or_default();
                assert_eq!(*u & bit, 0, "{g} given twice");
                *u |= bit;
            }
            let in_use: u32 = self.used[p].values().map(|u| u.count_ones()).sum();
            assert!(in_use <= pool.gpus(), "{}: {in_use} GPUs in use of {}", pool.name, pool.gpus());
        }
        let jm = self.jobs.get_mut(&e.job_id).expect("job");
        jm.waiting = false;
        jm.interrupted = false;
        jm.running = Some((t, n.gpu_ids.clone()));
    }

    fn node_change(&mut self, c: &engine::NodeChange) {
        if c.up {
            self.down[c.pool].remove(&c.node);
        } else {
            self.down[c.pool].insert(c.node);
        }
    }

    /// Feeds a trace: node changes before the events of their instant.
    fn run(&mut self, tr: &Trace) {
        let mut changes = tr.node_changes.iter().peekable();
        for e in &tr.events {
            while let Some(c) = changes.next_if(|c| c.at_ms <= at(e)) {
                self.node_change(c);
            }
            self.event(e);
        }
    }
}

/// Per dedicated pool, from the events alone: GPU ids held (each by one run at a time), GPU-ms held, the most
/// held at once; a GPU of a run is held from its node_assigned to its preempted, node_lost or done.
#[derive(Debug, Default, Clone)]
struct Held {
    now: u32,
    max: u32,
    gpu_ms: f64,
    last: i64,
}

fn replay(pools: &[Pool], events: &[pb::LifecycleEvent], end: i64) -> BTreeMap<String, Held> {
    let mut pool_of: HashMap<String, String> = HashMap::new();
    let mut holding: HashMap<String, Vec<String>> = HashMap::new();
    let mut owner: HashMap<String, String> = HashMap::new();
    let mut out: BTreeMap<String, Held> = BTreeMap::new();
    let cap: HashMap<&str, u32> = pools.iter().map(|p| (p.name, p.gpus())).collect();
    let mut last = i64::MIN;
    for e in events {
        let t = at(e);
        assert!(t >= last, "events in time order");
        last = t;
        let advance = |h: &mut Held| {
            if h.last != 0 {
                h.gpu_ms += f64::from(h.now) * (t - h.last) as f64;
            }
            h.last = t;
        };
        match e.kind.as_ref().expect("kind") {
            Kind::Submitted(s) if s.pool_kind == pb::PoolKind::Dedicated as i32 => {
                pool_of.insert(e.job_id.clone(), s.pool.clone());
            }
            Kind::NodeAssigned(n) => {
                let Some(pool) = pool_of.get(&e.job_id) else { continue };
                let h = out.entry(pool.clone()).or_default();
                advance(h);
                assert!(!n.gpu_ids.is_empty(), "dedicated runs name their GPUs");
                for g in &n.gpu_ids {
                    assert!(g.starts_with(&format!("{pool}-node-")), "{g}");
                    if let Some(o) = owner.insert(g.clone(), e.job_id.clone()) {
                        panic!("GPU {g} given to {} while {o} holds it", e.job_id);
                    }
                }
                assert!(holding.insert(e.job_id.clone(), n.gpu_ids.clone()).is_none(), "{} placed twice", e.job_id);
                h.now += n.gpu_ids.len() as u32;
                h.max = h.max.max(h.now);
                assert!(h.now <= cap[pool.as_str()], "{pool}: {} GPUs in use of {}", h.now, cap[pool.as_str()]);
            }
            Kind::Preempted(_) | Kind::NodeLost(_) | Kind::Done(_) => {
                if let Some(gpus) = holding.remove(&e.job_id) {
                    let h = out.get_mut(&pool_of[&e.job_id]).expect("pool");
                    advance(h);
                    for g in &gpus {
                        owner.remove(g);
                    }
                    h.now -= gpus.len() as u32;
                }
            }
            _ => {}
        }
    }
    for h in out.values_mut() {
        h.gpu_ms += f64::from(h.now) * (end - h.last) as f64;
    }
    out
}

#[test]
fn same_seed_gives_the_same_events() {
    let (_, a) = week(7, 60.0, 1);
    let (_, b) = week(7, 60.0, 1);
    assert_eq!(a.events, b.events);
    assert_eq!(a.starts, b.starts);
    assert_eq!(arrivals(7, 100, 0, 86_400_000), arrivals(7, 100, 0, 86_400_000));
    // The streaming form gives the same events as the whole-range one.
    let pools = model::fleet(0, 0, 60.0);
    let times = arrivals(7, 1440, T0, T0 + DAY);
    let streamed: Vec<_> = engine::events(FleetConfig::new(7, pools, T0), times, T0 + DAY).collect();
    assert_eq!(streamed, a.events);
}

#[test]
fn generated_events_pass_protocol_validation_and_are_in_time_order() {
    let (_, tr) = week(3, 60.0, 1);
    let limits = startline_proto::Limits::default();
    let mut last = i64::MIN;
    for e in &tr.events {
        startline_proto::validate::validate_event(e, i64::MAX / 4, &limits).expect("valid");
        assert!(at(e) >= last, "events out of order");
        last = at(e);
    }
    // Grouped by job: each job's submitted first.
    let jobs: Vec<_> = engine::by_job(tr.events.iter().cloned()).collect();
    assert_eq!(jobs.len() as u64, tr.jobs);
    assert!(jobs.iter().all(|j| matches!(j[0].kind, Some(Kind::Submitted(_)))));
}

/// A week of the default fleet at the default rate, replayed from its events: no GPU is given to two runs at once,
/// no dedicated pool has more GPUs in use than it has, and GPU-hours held stay within capacity x hours.
#[test]
fn a_simulated_week_never_oversubscribes_a_dedicated_pool() {
    let (pools, tr) = week(42, 60.0, 7);
    let held = replay(&pools, &tr.events, T0 + 7 * DAY);
    for p in pools.iter().filter(|p| p.kind == pb::PoolKind::Dedicated) {
        let h = &held[p.name];
        let capacity = f64::from(p.gpus()) * 7.0 * DAY as f64;
        assert!(h.max <= p.gpus(), "{}: {} in use of {}", p.name, h.max, p.gpus());
        assert!(h.gpu_ms <= capacity, "{}: {} GPU-ms held of {capacity}", p.name, h.gpu_ms);
        // Loaded, not idle: the daily peak fills the pool.
        assert!(h.max as f64 >= 0.9 * f64::from(p.gpus()), "{}: at most {} of {} in use", p.name, h.max, p.gpus());
        assert!(h.gpu_ms >= 0.4 * capacity, "{}: held {:.0}% of capacity", p.name, 100.0 * h.gpu_ms / capacity);
    }
    // The independent checker agrees on every start.
    let mut c = Checker::new(&pools, true);
    c.run(&tr);
    assert!(c.starts > 9000 && c.backfilled > 0, "{} starts, {} backfilled", c.starts, c.backfilled);
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

        /// Random seeds, loads, fleets and crunches: no job starts before its submit or in a crunch, no GPU is
        /// oversubscribed, quotas hold, every stopped run is requeued and starts again or ends, and priorities
        /// are respected (with backfill only when the backfilled job ends by the head's reservation).
        #[test]
        fn the_scheduler_keeps_its_rules(
            seed in any::<u64>(),
            rate in 10.0f64..200.0,
            load in 0.6f64..2.0,
            pools in 0usize..8,
            backfill in any::<bool>(),
            crunch in any::<bool>(),
        ) {
            let mut fleet = model::fleet(pools, 0, rate);
            if crunch {
                for p in fleet.iter_mut().step_by(2) {
                    p.crunches = vec![(T0 + 6 * 3_600_000, T0 + 7 * 3_600_000)];
                }
            }
            // Arrivals over a day at `load` times the rate capacity is sized for; the fleet runs on for three more.
            let n = (rate * load * 24.0) as u64;
            let times = arrivals(seed, n, T0, T0 + DAY);
            let cfg = FleetConfig { backfill, chains: 0.1, ..FleetConfig::new(seed, fleet.clone(), T0) };
            let tr = engine::simulate(cfg, &times, T0 + 4 * DAY);
            let mut c = Checker::new(&fleet, backfill);
            c.run(&tr);
            let left: Vec<&String> = c.jobs.iter().filter(|(_, j)| j.interrupted).map(|(id, _)| id).collect();
            prop_assert!(left.is_empty(), "stopped and never started again: {:?}", left);
            let open = c.jobs.len() as u64;
            prop_assert!(open * 100 <= c.ended, "{} jobs still open three days after the last arrival, {} ended", open, c.ended);
            for s in &tr.starts {
                prop_assert!(s.start_ms >= s.submitted_ms && s.start_ms >= s.waited_from_ms);
            }
        }
    }
}

/// Slurm pools send estimated starts, the Kueue pool queue positions, managed pools neither; estimates lie in the
/// future when sent and, planned from time limits, mostly at or after the run's true start.
#[test]
fn slurm_estimates_kueue_positions_and_managed_pools_neither() {
    let (pools, tr) = week(42, 60.0, 3);
    let kind_of: HashMap<&str, model::Scheduler> = pools.iter().map(|p| (p.name, p.scheduler())).collect();
    let mut pool_of: HashMap<&str, model::Scheduler> = HashMap::new();
    let starts = tr.true_starts();
    let (mut estimates, mut late_or_exact, mut positions, mut heads) = (0u32, 0u32, 0u32, 0u32);
    let mut last_position: HashMap<&str, u32> = HashMap::new();
    for e in &tr.events {
        match e.kind.as_ref().expect("kind") {
            Kind::Submitted(s) => {
                pool_of.insert(&e.job_id, kind_of[s.pool.as_str()]);
            }
            Kind::Queued(q) => {
                let sched = pool_of[e.job_id.as_str()];
                if let Some(est) = &q.estimated_start {
                    assert_eq!(sched, model::Scheduler::Slurm, "{}", e.job_id);
                    let est = timestamp_to_ms(est);
                    assert!(est > at(e), "an estimate in the past");
                    let attempt = e.attempt.unwrap_or(1);
                    if let Some(start) = starts.get(&(e.job_id.clone(), attempt)) {
                        estimates += 1;
                        late_or_exact += u32::from(est + 60_000 >= *start);
                    }
                }
                if let Some(p) = q.queue_position {
                    assert_eq!(sched, model::Scheduler::Kueue, "{}", e.job_id);
                    assert!(q.message.contains(&format!("position {p} ")), "{}", q.message);
                    positions += 1;
                    last_position.insert(&e.job_id, p);
                }
            }
            Kind::NodeAssigned(_) => {
                if let Some(p) = last_position.remove(e.job_id.as_str()) {
                    heads += u32::from(p < 3);
                }
            }
            _ => {}
        }
    }
    assert!(estimates > 500 && positions > 100, "{estimates} estimates, {positions} positions");
    assert!(
        f64::from(late_or_exact) > 0.5 * f64::from(estimates),
        "{late_or_exact} of {estimates} at or after the start"
    );
    assert!(heads > 50, "jobs start from near the head of the queue: {heads}");
}

/// Urgent jobs start within seconds (by preempting normal work) except in a crunch, which holds even them; the
/// failing node loses and fails far more of its runs than the rest of its pool.
#[test]
fn urgent_jobs_start_at_once_unless_a_crunch_holds_them_and_the_failing_node_fails_more() {
    let mut pools = model::fleet(0, 0, 60.0);
    let crunch = (T0 + DAY + 12 * 3_600_000, T0 + DAY + 13 * 3_600_000);
    for p in pools.iter_mut().filter(|p| p.gpu_class == "h100") {
        p.crunches = vec![crunch];
    }
    let times = arrivals(5, 60 * 24 * 5, T0, T0 + 5 * DAY);
    let tr = engine::simulate(FleetConfig::new(5, pools.clone(), T0), &times, T0 + 6 * DAY);
    let mut sub: HashMap<&str, (i64, bool, String)> = HashMap::new();
    let (mut urgent, mut late, mut crunched) = (0u32, 0u32, Vec::new());
    let (mut on_failing, mut failing_bad, mut elsewhere, mut elsewhere_bad) = (0u32, 0u32, 0u32, 0u32);
    let mut placed: HashMap<&str, bool> = HashMap::new();
    for e in &tr.events {
        match e.kind.as_ref().expect("kind") {
            Kind::Submitted(s) => {
                let u = s.priority == pb::PriorityClass::Urgent as i32;
                sub.insert(&e.job_id, (at(e), u, s.gpu_class.clone()));
            }
            Kind::NodeAssigned(n) => {
                let (s, u, class) = &sub[e.job_id.as_str()];
                if *u && e.attempt == Some(1) {
                    let w = at(e) - s;
                    if class == "h100" && (crunch.0..crunch.0 + 1_800_000).contains(s) {
                        crunched.push(w);
                    } else if !(crunch.0 - 600_000..crunch.1).contains(s) {
                        urgent += 1;
                        late += u32::from(w > 600_000);
                    }
                }
                if e.job_id.starts_with("slurm/a100/") {
                    placed.insert(&e.job_id, n.nodes.iter().any(|x| x == model::FAILING_NODE));
                }
            }
            Kind::NodeLost(_) | Kind::Done(_) | Kind::Preempted(_) => {
                if let Some(f) = placed.remove(e.job_id.as_str()) {
                    let bad = matches!(&e.kind, Some(Kind::NodeLost(_)))
                        || matches!(&e.kind, Some(Kind::Done(d)) if d.outcome == pb::Outcome::Failed as i32);
                    if f {
                        (on_failing, failing_bad) = (on_failing + 1, failing_bad + u32::from(bad));
                    } else {
                        (elsewhere, elsewhere_bad) = (elsewhere + 1, elsewhere_bad + u32::from(bad));
                    }
                }
            }
            _ => {}
        }
    }
    assert!(urgent > 800, "{urgent} urgent jobs");
    assert!(f64::from(late) / f64::from(urgent) < 0.01, "{late} of {urgent} urgent jobs started after 10 minutes");
    assert!(!crunched.is_empty() && crunched.iter().all(|w| *w >= 30 * 60_000), "crunched: {crunched:?}");
    let rate = |bad: u32, all: u32| f64::from(bad) / f64::from(all.max(1));
    assert!(on_failing > 30, "{on_failing} placements on the failing node");
    assert!(
        rate(failing_bad, on_failing) > 3.0 * rate(elsewhere_bad, elsewhere),
        "failing node {failing_bad}/{on_failing} vs the pool {elsewhere_bad}/{elsewhere}"
    );
    assert_eq!(model::failing_node_ecc(T0, T0), 40);
    assert_eq!(model::failing_node_ecc(T0 + 2 * DAY, T0), 160);
}

/// Managed pools: jobs wait for quota and for stock-outs, reported with the provider's words.
#[test]
fn managed_jobs_wait_for_quota_and_stock_outs() {
    let (_, tr) = week(42, 60.0, 7);
    let mut seen: BTreeMap<(String, i32), u32> = BTreeMap::new();
    for e in tr.events.iter().filter(|e| e.job_id.starts_with("sagemaker/") || e.job_id.starts_with("vertex/")) {
        if let Some(Kind::Queued(q)) = &e.kind {
            *seen.entry((q.raw_reason.clone(), q.reason)).or_default() += 1;
        }
    }
    let has = |raw: &str, r: pb::WaitReason| seen.get(&(raw.to_string(), r as i32)).copied().unwrap_or(0) > 0;
    assert!(has("ResourceLimitExceeded", pb::WaitReason::Quota), "{seen:?}");
    assert!(has("Quota exceeded", pb::WaitReason::Quota), "{seen:?}");
    assert!(
        has("CapacityError: Unable to provision requested ML compute capacity", pb::WaitReason::Capacity),
        "{seen:?}"
    );
    assert!(has("Resources are insufficient in region", pb::WaitReason::Capacity), "{seen:?}");
}

/// Chains run their stages in order, each submitted 2-30 minutes after the previous one ended.
#[test]
fn chains_run_their_stages_in_order_each_after_the_previous_one_ended() {
    let pools = model::fleet(0, 0, 60.0);
    let times = arrivals(5, 600, T0, T0 + DAY / 2);
    let cfg = FleetConfig { chains: 0.3, ..FleetConfig::new(5, pools, T0) };
    let tr = engine::simulate(cfg, &times, T0 + 4 * DAY);
    let mut chains: BTreeMap<String, Vec<(i64, i64, String, bool)>> = BTreeMap::new();
    for job in engine::by_job(tr.events.iter().cloned()) {
        let Some(Kind::Submitted(s)) = &job[0].kind else { panic!("submitted first") };
        if s.chain_id.is_empty() {
            continue;
        }
        assert!(job[0].job_id.starts_with(&s.chain_id), "members are named after their chain");
        let end = job.iter().find_map(|e| match &e.kind {
            Some(Kind::Done(d)) => Some((at(e), d.outcome == pb::Outcome::Succeeded as i32)),
            _ => None,
        });
        let (end, ok) = end.expect("every member ends");
        chains.entry(s.chain_id.clone()).or_default().push((at(&job[0]), end, s.chain_stage.clone(), ok));
    }
    assert!(chains.len() > 100, "{} chains", chains.len());
    let (mut complete, mut retries) = (0, 0);
    for members in chains.values_mut() {
        members.sort_by_key(|m| m.0);
        for w in members.windows(2) {
            assert!(w[1].0 >= w[0].1 + 120_000 && w[1].0 <= w[0].1 + 1_800_000, "{members:?}");
            let (i, j) =
                (CHAIN_STAGES.iter().position(|s| *s == w[0].2), CHAIN_STAGES.iter().position(|s| *s == w[1].2));
            if w[0].3 {
                assert_eq!(j, i.map(|i| i + 1), "{members:?}");
            } else {
                assert_eq!(j, i, "a failed stage is retried: {members:?}");
                retries += 1;
            }
        }
        complete += usize::from(members.last().is_some_and(|m| m.2 == "quantize" && m.3));
    }
    assert!(complete * 2 > chains.len(), "most chains reach quantize ({complete} of {})", chains.len());
    assert!(retries > 0, "some stage failed and was retried");
}

/// A crunch reports only what the providers' adapters report when out of capacity: on Slurm the pending reasons
/// the Slurm adapter maps to the same wait reason (`Resources` on the head, `Priority` behind it), on Kueue a
/// pod's `Unschedulable`, on SageMaker a status message the SageMaker adapter reads as a capacity wait, on Vertex
/// AI its stock-out text; never a text of the simulator's own. And the H100 class shows it: several jobs are
/// reported queued for capacity in the crunch's first 15 minutes while none of the class starts.
#[test]
fn a_crunch_reports_what_the_providers_report_when_out_of_capacity() {
    use crate::provider::{sagemaker::is_capacity_message, slurm::reasons::map_reason};
    let mut pools = model::fleet(0, 0, 60.0);
    let crunch = (T0 + DAY + 14 * 3_600_000, T0 + DAY + 15 * 3_600_000);
    for p in pools.iter_mut() {
        p.crunches = vec![crunch];
    }
    let times = arrivals(9, 60 * 24 * 2, T0, T0 + 2 * DAY);
    let tr = engine::simulate(FleetConfig::new(9, pools.clone(), T0), &times, T0 + 3 * DAY);
    let mut pool_of: HashMap<&str, &Pool> = HashMap::new();
    let mut raws: BTreeMap<(&str, &str), u32> = BTreeMap::new();
    let (mut h100_capacity, mut h100_starts) = (0u32, 0u32);
    for e in &tr.events {
        let t = at(e);
        match e.kind.as_ref().expect("kind") {
            Kind::Submitted(s) => {
                let p = pools.iter().find(|p| p.name == s.pool).expect("pool");
                pool_of.insert(&e.job_id, p);
            }
            Kind::Queued(q) if (crunch.0..crunch.1).contains(&t) => {
                let p = pool_of[e.job_id.as_str()];
                let raw = q.raw_reason.as_str();
                assert!(!raw.to_lowercase().contains("crunch"), "{raw}");
                let capacity = q.reason == pb::WaitReason::Capacity as i32;
                match p.scheduler() {
                    model::Scheduler::Slurm => assert_eq!(map_reason(raw) as i32, q.reason, "{raw}"),
                    model::Scheduler::Kueue => {
                        assert!(capacity && ["Pending", "Unschedulable"].contains(&raw), "{raw}")
                    }
                    model::Scheduler::Managed if p.provider == "sagemaker" && capacity => {
                        assert!(raw == "Pending" || is_capacity_message(raw), "{raw}")
                    }
                    model::Scheduler::Managed if p.provider == "vertex" && capacity => {
                        assert!(["JOB_STATE_QUEUED", "Resources are insufficient in region"].contains(&raw), "{raw}")
                    }
                    model::Scheduler::Managed => {}
                }
                *raws.entry((p.name, raw)).or_default() += 1;
                if p.gpu_class == "h100" && capacity && t < crunch.0 + 15 * 60_000 {
                    h100_capacity += 1;
                }
            }
            Kind::NodeAssigned(_) if (crunch.0..crunch.1).contains(&t) => {
                h100_starts += u32::from(pool_of[e.job_id.as_str()].gpu_class == "h100");
            }
            _ => {}
        }
    }
    // Every pool reported its out-of-capacity words in the crunch.
    for (pool, raw) in [
        ("h100", "Resources"),
        ("a100", "Resources"),
        ("l40s", "Unschedulable"),
        ("vertex-a3", "Resources are insufficient in region"),
        ("sm-p4d", "CapacityError: Unable to provision requested ML compute capacity"),
    ] {
        assert!(raws.get(&(pool, raw)).is_some_and(|n| *n > 0), "{pool} {raw}: {raws:?}");
    }
    assert!(h100_capacity >= 3, "{h100_capacity} capacity reports of the class in the first 15 minutes: {raws:?}");
    assert_eq!(h100_starts, 0, "nothing of the class starts in the crunch");
}
