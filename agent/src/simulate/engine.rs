//! The fleet's discrete-event simulation: jobs queue on the pools' capacity, and waits, crunches and utilisation
//! come from the load instead of being drawn.
//!
//! One heap of timed actions (arrivals, a job's next step, node failures and repairs, stock-outs, scheduling
//! passes, Slurm's planner ticks) drives every pool; each action costs O(log n) in the heap plus the pool's
//! bounded work, so a million jobs run in seconds. Events are emitted at the simulated instant they happen, so
//! [`FleetSim::take_events`] hands them out in time order.
//!
//! **Dedicated pools** ([`model::Scheduler::Slurm`], [`model::Scheduler::Kueue`]) have nodes of 8 GPUs. A job of
//! up to 8 GPUs runs on one node (the fullest one it fits on), a larger one on whole free nodes. Waiting jobs are
//! ranked urgent before normal, then by submit time (a requeued job keeps its place); a scheduling pass (on every
//! arrival, end and repair) looks at the first [`SCAN`] of them in rank order and starts each that fits until
//! the first that does not, the *head*:
//! - Slurm pools then **backfill**: a later job that fits starts if its time limit ends by the head's
//!   reservation (the earliest time the head fits when running jobs end at their time limits), so it cannot
//!   delay the head. Kueue's pool admits in strict order: nothing after the head starts.
//! - An urgent job that does not fit **preempts** normal jobs (never urgent ones): the youngest on the node that
//!   frees its GPUs at the least cost, or whole nodes with the fewest normal GPUs for a multi-node job. The
//!   victims get `preempted` (reason `priority`, half of them with a checkpoint saved), `requeued` 5-30 s later
//!   and wait again (`preemption_recovery`) in their old place.
//! - Each team's normal jobs may hold at most half of a Slurm pool (`QOSGrpGRES`); a job over it waits with
//!   reason `quota` and does not block the jobs behind it.
//! - Nodes fail (a healthy one every 60 days on average, repaired in about 3 hours; the failing node every 6
//!   hours, back within 15-40 minutes): their jobs get `node_lost` and are requeued.
//!
//! Waiting jobs get `queued` with the reason a scheduler would show: the head `capacity` (`Resources`), the jobs
//! behind it `priority` (`Priority`), `quota`; in a crunch, what the provider says when out of capacity: Slurm's
//! head `Resources` and `Priority` behind it, `Unschedulable` for every Kueue job, a managed endpoint's stock-out
//! message for every job. Slurm pools also send the
//! **estimated start** of their first [`ESTIMATED`] waiting jobs, planned every [`PLAN_EVERY_MS`] like Slurm's
//! backfill planner: from running jobs' time limits (the scheduler does not know when a job will really end),
//! each job in rank order placed at the earliest time it fits after those ahead of it; a new `queued` goes out
//! when the estimate moves by more than [`ESTIMATE_STEP_MS`]. Kueue's pool sends each workload's
//! **queue position** (0 = next) when it moves as the Kueue adapter reports it
//! ([`crate::provider::kueue::position_moved`]).
//!
//! **Managed pools** start an urgent job at once on reserved warm capacity; a normal job waits for capacity
//! while a regional stock-out lasts, and for quota while the pool's normal jobs hold more than its quota
//! (first come, first served; a job that does not fit the quota does not block a smaller one behind it). Spot
//! capacity is reclaimed during 12% of runs. They send neither estimates nor positions.
//!
//! During a pool's crunch nothing of it starts. A run is prepared (image pull, data staging, environment; on
//! managed endpoints provisioning first), reports its first step, checkpoints every 15-20 minutes, and ends when
//! its work is done (succeeded, or failed), at its time limit (timed out), or at start (a broken build, or an
//! ECC error on the failing node). Some users cancel a job that waited too long.

use super::model::{self, JobSpec, Pool, Scheduler, GPUS_PER_NODE};
use crate::rng::Rng;
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_proto::time::ms_to_timestamp;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};

const MIN: i64 = 60_000;
/// Waiting jobs a scheduling pass looks at, in rank order (Slurm's `bf_max_job_test`).
pub const SCAN: usize = 100;
/// Waiting jobs of a Slurm pool that get an estimated start.
pub const ESTIMATED: usize = 20;
/// How often a Slurm pool's planner runs when something changed.
pub const PLAN_EVERY_MS: i64 = 60_000;
/// How far an estimated start must move before a new `queued` reports it (as the Slurm adapter does).
pub const ESTIMATE_STEP_MS: i64 = crate::provider::slurm::ESTIMATE_STEP_MS;

/// A fleet to simulate.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// Seed: the same seed, pools and arrivals give the same events.
    pub seed: u64,
    /// The pools (see [`model::default_pools`], [`model::fleet`]).
    pub pools: Vec<Pool>,
    /// Share of arrivals that start a chain of [`super::CHAIN_STAGES`].
    pub chains: f64,
    /// When the simulation starts (Unix ms): node failures and stock-outs are scheduled from here.
    pub start_ms: i64,
    /// Slurm pools backfill (else they admit in strict order, like Kueue's).
    pub backfill: bool,
    /// Keep [`Start`]s and [`NodeChange`]s for [`FleetSim::take_starts`] and [`FleetSim::take_node_changes`].
    pub trace: bool,
}

impl FleetConfig {
    /// The default fleet sized for `jobs_per_hour`, no chains, backfill on, no trace.
    pub fn new(seed: u64, pools: Vec<Pool>, start_ms: i64) -> Self {
        FleetConfig { seed, pools, chains: 0.0, start_ms, backfill: true, trace: false }
    }
}

/// A run's start (its nodes assigned): what an estimate of the job's start is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    /// The job.
    pub job_id: String,
    /// The run (1 = the first; a requeued job starts again with the next).
    pub attempt: u32,
    /// Index of its pool in the fleet.
    pub pool: usize,
    /// The job's submit time.
    pub submitted_ms: i64,
    /// When this wait began (the submit, or the requeue).
    pub waited_from_ms: i64,
    /// When the run started.
    pub start_ms: i64,
    /// Whether it started by preempting other jobs.
    pub preempted_others: bool,
}

/// A dedicated node going down or coming back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeChange {
    /// When.
    pub at_ms: i64,
    /// Index of its pool in the fleet.
    pub pool: usize,
    /// The node's number.
    pub node: u32,
    /// Up (repaired) or down (failed).
    pub up: bool,
}

/// The free GPUs of a dedicated pool's nodes, indexed by free count so a fit is found in O(1).
#[derive(Debug, Clone)]
struct Nodes {
    /// Used GPUs of each node, one bit per GPU.
    used: Vec<u8>,
    up: Vec<bool>,
    /// Up nodes by free GPUs (0..=8).
    bucket: [Vec<u32>; 9],
    /// Each node's index in its bucket.
    pos: Vec<u32>,
}

impl Nodes {
    fn new(n: u32) -> Self {
        let mut bucket: [Vec<u32>; 9] = Default::default();
        bucket[8] = (0..n).rev().collect();
        let pos = (0..n).map(|i| n - 1 - i).collect();
        Nodes { used: vec![0; n as usize], up: vec![true; n as usize], bucket, pos }
    }

    fn free(&self, n: u32) -> u32 {
        GPUS_PER_NODE - self.used[n as usize].count_ones()
    }

    fn unlink(&mut self, n: u32) {
        let f = self.free(n) as usize;
        let i = self.pos[n as usize] as usize;
        self.bucket[f].swap_remove(i);
        if let Some(&moved) = self.bucket[f].get(i) {
            self.pos[moved as usize] = i as u32;
        }
    }

    fn link(&mut self, n: u32) {
        let f = self.free(n) as usize;
        self.pos[n as usize] = self.bucket[f].len() as u32;
        self.bucket[f].push(n);
    }

    fn set_used(&mut self, n: u32, used: u8) {
        if self.up[n as usize] {
            self.unlink(n);
            self.used[n as usize] = used;
            self.link(n);
        } else {
            self.used[n as usize] = used;
        }
    }

    fn fits(&self, gpus: u32, node_count: u32) -> bool {
        let per = per_node(gpus, node_count) as usize;
        per <= 8 && self.bucket[per..].iter().map(Vec::len).sum::<usize>() >= node_count as usize
    }

    /// Places a job: one node, the fullest it fits on; or whole nodes, the freest first. Returns (node, GPU
    /// bits) per node.
    fn take(&mut self, gpus: u32, node_count: u32) -> Option<Vec<(u32, u8)>> {
        if !self.fits(gpus, node_count) {
            return None;
        }
        let per = per_node(gpus, node_count) as usize;
        let mut out = Vec::with_capacity(node_count as usize);
        let order: Vec<usize> = if node_count == 1 { (per..=8).collect() } else { (per..=8).rev().collect() };
        for f in order {
            while out.len() < node_count as usize {
                let Some(&n) = self.bucket[f].last() else { break };
                let mut bits = 0u8;
                let used = self.used[n as usize];
                for g in 0..8u8 {
                    if bits.count_ones() as usize == per {
                        break;
                    }
                    if used & (1 << g) == 0 {
                        bits |= 1 << g;
                    }
                }
                self.set_used(n, used | bits);
                out.push((n, bits));
            }
        }
        Some(out)
    }

    fn give(&mut self, n: u32, bits: u8) {
        let used = self.used[n as usize] & !bits;
        self.set_used(n, used);
    }

    fn set_up(&mut self, n: u32, up: bool) {
        if self.up[n as usize] == up {
            return;
        }
        if up {
            self.up[n as usize] = true;
            self.used[n as usize] = 0;
            self.link(n);
        } else {
            self.unlink(n);
            self.up[n as usize] = false;
        }
    }

    fn up_count(&self) -> usize {
        self.up.iter().filter(|u| **u).count()
    }
}

fn per_node(gpus: u32, node_count: u32) -> u32 {
    gpus.div_ceil(node_count.max(1))
}

/// A step of a run, due at a time.
#[derive(Debug, Clone)]
enum Item {
    Phase(pb::PreparingPhase),
    ContainerStart,
    TrainStart,
    Checkpoint(u64),
    Spot,
    Done(pb::Outcome, Option<i32>, &'static str),
}

#[derive(Debug, Clone, Copy)]
struct ChainPos {
    chain: u64,
    stage: usize,
    retry: bool,
    n: u64,
}

#[derive(Debug)]
struct Job {
    idx: u64,
    id: String,
    pool: usize,
    spec: JobSpec,
    submit_ms: i64,
    /// Not a candidate before (managed allocation latency).
    ready_ms: i64,
    waited_from_ms: i64,
    /// Events emitted so far (event ids count up).
    n: u32,
    attempt: Option<u32>,
    rng: Rng,
    /// The queue key while waiting.
    key: Option<QueueKey>,
    started_once: bool,
    requeued: bool,
    reason: Option<(pb::WaitReason, &'static str)>,
    estimate: Option<i64>,
    position: Option<u64>,
    /// Dedicated: (node, GPU bits) per node; managed: instance names.
    placed: Vec<(u32, u8)>,
    instances: Vec<String>,
    started_ms: i64,
    train_ms: Option<i64>,
    resume_step: u64,
    last_ckpt_step: u64,
    plan: VecDeque<(i64, Item)>,
    chain: Option<ChainPos>,
    on_failing: bool,
}

type QueueKey = (u8, i64, u64);

#[derive(Debug)]
struct PoolState {
    cfg: Pool,
    sched: Scheduler,
    nodes: Nodes,
    /// Jobs (slots) running on each node.
    on_node: Vec<Vec<usize>>,
    queue: BTreeMap<QueueKey, usize>,
    /// Running jobs by the end of their time limit.
    ends: BTreeSet<(i64, usize)>,
    team_used: [u32; model::TEAMS.len()],
    /// GPUs held by normal jobs (managed: against the quota).
    normal_used: u32,
    crunch_until: i64,
    stockout_until: i64,
    pass_pending: bool,
    tick_pending: bool,
    dirty: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Act {
    Arrive(u64),
    ChainArrive { chain: u64, stage: usize, retry: bool, n: u64 },
    Eligible(usize, u32),
    Plan(usize, u32),
    Requeue(usize, u32),
    RequeueReady(usize, u32),
    Cancel(usize, u32),
    Pass(usize),
    Tick(usize),
    NodeFail(usize, u32),
    NodeUp(usize, u32),
    Stockout(usize),
    StockoutEnd(usize),
    Crunch(usize, i64),
    CrunchEnd(usize),
}

struct Slot {
    gen: u32,
    job: Option<Job>,
}

/// The simulation: feed it arrivals ([`FleetSim::submit`]), move its clock ([`FleetSim::advance`]), take the
/// events it emitted ([`FleetSim::take_events`], in time order).
pub struct FleetSim {
    cfg: FleetConfig,
    pools: Vec<PoolState>,
    slots: Vec<Slot>,
    free_slots: Vec<usize>,
    heap: BinaryHeap<Reverse<(i64, u64, Act)>>,
    seq: u64,
    clock: i64,
    next_idx: u64,
    out: VecDeque<pb::LifecycleEvent>,
    starts: Vec<Start>,
    node_changes: Vec<NodeChange>,
    rng: Rng,
    jobs_submitted: u64,
}

const HEALTHY_MTBF_MS: f64 = 60.0 * 86_400_000.0;
const FAILING_MTBF_MS: f64 = 6.0 * 3_600_000.0;

impl FleetSim {
    /// A fleet at `cfg.start_ms` with nothing running.
    pub fn new(cfg: FleetConfig) -> Self {
        let mut sim = FleetSim {
            pools: cfg
                .pools
                .iter()
                .map(|p| PoolState {
                    cfg: p.clone(),
                    sched: p.scheduler(),
                    nodes: Nodes::new(if p.kind == pb::PoolKind::Managed { 0 } else { p.nodes }),
                    on_node: vec![Vec::new(); if p.kind == pb::PoolKind::Managed { 0 } else { p.nodes as usize }],
                    queue: BTreeMap::new(),
                    ends: BTreeSet::new(),
                    team_used: [0; model::TEAMS.len()],
                    normal_used: 0,
                    crunch_until: i64::MIN,
                    stockout_until: i64::MIN,
                    pass_pending: false,
                    tick_pending: false,
                    dirty: false,
                })
                .collect(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            heap: BinaryHeap::new(),
            seq: 0,
            clock: cfg.start_ms,
            next_idx: 0,
            out: VecDeque::new(),
            starts: Vec::new(),
            node_changes: Vec::new(),
            rng: Rng::derive(cfg.seed, u64::MAX - 7),
            jobs_submitted: 0,
            cfg,
        };
        let start = sim.cfg.start_ms;
        for p in 0..sim.pools.len() {
            let pool = sim.pools[p].cfg.clone();
            for n in 0..sim.pools[p].nodes.up.len() as u32 {
                let at = start + sim.rng.exp(mtbf(&pool, n)) as i64;
                sim.push(at, Act::NodeFail(p, n));
            }
            if pool.kind == pb::PoolKind::Managed && pool.stockouts_per_day > 0.0 {
                let at = start + sim.rng.exp(stockout_gap(&pool)) as i64;
                sim.push(at, Act::Stockout(p));
            }
            for &(from, to) in &pool.crunches {
                if to > start {
                    sim.push(from.max(start), Act::Crunch(p, to));
                }
            }
        }
        sim
    }

    /// The simulated clock.
    pub fn clock(&self) -> i64 {
        self.clock
    }

    /// The fleet.
    pub fn pools(&self) -> &[Pool] {
        &self.cfg.pools
    }

    /// Jobs submitted so far (arrivals and chain members).
    pub fn jobs_submitted(&self) -> u64 {
        self.jobs_submitted
    }

    /// An arrival at `at_ms` (not before the clock): a job, or the first stage of a chain. Arrivals are numbered
    /// in the order they are submitted; the number is in the job's id.
    pub fn submit(&mut self, at_ms: i64) {
        let idx = self.next_idx;
        self.next_idx += 1;
        self.push(at_ms.max(self.clock), Act::Arrive(idx));
    }

    /// Runs every action due by `until_ms`.
    pub fn advance(&mut self, until_ms: i64) {
        while let Some(Reverse((at, _, act))) = self.heap.peek().copied() {
            if at > until_ms {
                break;
            }
            self.heap.pop();
            self.clock = at;
            self.act(act);
        }
        self.clock = self.clock.max(until_ms);
    }

    /// The events emitted so far, in time order.
    pub fn take_events(&mut self) -> std::collections::vec_deque::Drain<'_, pb::LifecycleEvent> {
        self.out.drain(..)
    }

    /// The next event emitted, in time order.
    pub fn pop_event(&mut self) -> Option<pb::LifecycleEvent> {
        self.out.pop_front()
    }

    /// Runs started so far (kept only with [`FleetConfig::trace`]).
    pub fn take_starts(&mut self) -> Vec<Start> {
        std::mem::take(&mut self.starts)
    }

    /// Node failures and repairs so far (kept only with [`FleetConfig::trace`]).
    pub fn take_node_changes(&mut self) -> Vec<NodeChange> {
        std::mem::take(&mut self.node_changes)
    }

    fn push(&mut self, at: i64, act: Act) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, act)));
    }

    fn job(&self, slot: usize, gen: u32) -> Option<&Job> {
        self.slots.get(slot).filter(|s| s.gen == gen).and_then(|s| s.job.as_ref())
    }

    fn gen(&self, slot: usize) -> u32 {
        self.slots[slot].gen
    }

    fn j(&mut self, slot: usize) -> &mut Job {
        self.slots[slot].job.as_mut().expect("a live slot")
    }

    fn act(&mut self, act: Act) {
        match act {
            Act::Arrive(idx) => self.arrive(idx),
            Act::ChainArrive { chain, stage, retry, n } => {
                self.create((1 << 40) | (chain << 8) | n, Some(ChainPos { chain, stage, retry, n }))
            }
            Act::Eligible(s, g) if self.job(s, g).is_some() => self.eligible(s),
            Act::Plan(s, g) if self.job(s, g).is_some() => self.plan_step(s),
            Act::Requeue(s, g) if self.job(s, g).is_some() => self.requeue(s),
            Act::RequeueReady(s, g) if self.job(s, g).is_some() => self.requeue_ready(s),
            Act::Cancel(s, g) if self.job(s, g).is_some_and(|j| j.key.is_some() && !j.started_once) => self.cancel(s),
            Act::Pass(p) => self.pass(p),
            Act::Tick(p) => self.tick(p),
            Act::NodeFail(p, n) => self.node_fail(p, n),
            Act::NodeUp(p, n) => self.node_up(p, n),
            Act::Stockout(p) => self.stockout(p),
            Act::StockoutEnd(p) => self.request_pass(p),
            Act::Crunch(p, to) => {
                self.pools[p].crunch_until = to;
                self.push(to, Act::CrunchEnd(p));
                self.request_pass(p);
            }
            Act::CrunchEnd(p) => self.request_pass(p),
            _ => {}
        }
    }

    fn arrive(&mut self, idx: u64) {
        if self.cfg.chains > 0.0 && Rng::derive(self.cfg.seed ^ 0xC4A1_0000, idx).chance(self.cfg.chains) {
            self.create((1 << 40) | (idx << 8) | 1, Some(ChainPos { chain: idx, stage: 0, retry: false, n: 1 }));
        } else {
            self.create(idx, None);
        }
    }

    fn create(&mut self, idx: u64, chain: Option<ChainPos>) {
        let now = self.clock;
        let mut rng = Rng::derive(self.cfg.seed, idx);
        let spec = model::draw_job(&mut rng, &self.cfg.pools);
        let pool = &self.pools[spec.pool].cfg;
        let id = match (chain, pool.scheduler()) {
            (Some(c), _) => {
                let stage = super::CHAIN_STAGES[c.stage];
                if c.retry {
                    format!("chain/{:07}/{stage}-retry", c.chain)
                } else {
                    format!("chain/{:07}/{stage}", c.chain)
                }
            }
            (None, Scheduler::Kueue) => format!("k8s/{}/{}/train-{idx:07}", pool.region, model::TEAMS[spec.team]),
            (None, _) => format!("{}/{}/{idx:07}", pool.provider, pool.name),
        };
        let submitted = pb::Submitted {
            pool_kind: pool.kind as i32,
            provider: pool.provider.into(),
            pool: pool.name.into(),
            priority: if spec.urgent { pb::PriorityClass::Urgent } else { pb::PriorityClass::Normal } as i32,
            gpu_class: pool.gpu_class.into(),
            gpu_count: spec.gpus,
            node_count: spec.node_count(),
            region: pool.region.into(),
            team: model::TEAMS[spec.team].into(),
            project: spec.project.clone(),
            chain_id: chain.map(|c| format!("chain/{:07}", c.chain)).unwrap_or_default(),
            chain_stage: chain.map_or("train", |c| super::CHAIN_STAGES[c.stage]).into(),
            labels: [("time_limit_minutes".to_string(), (spec.limit_ms / MIN).to_string())].into(),
        };
        let managed = pool.kind == pb::PoolKind::Managed;
        let ready =
            now + spec.poll_ms + if managed && !spec.urgent { rng.lognormal(1.0 * MIN as f64, 0.6) as i64 } else { 0 };
        let job = Job {
            idx,
            id,
            pool: spec.pool,
            submit_ms: now,
            ready_ms: ready,
            waited_from_ms: now,
            n: 0,
            attempt: None,
            rng,
            key: None,
            started_once: false,
            requeued: false,
            reason: None,
            estimate: None,
            position: None,
            placed: Vec::new(),
            instances: Vec::new(),
            started_ms: 0,
            train_ms: None,
            resume_step: 0,
            last_ckpt_step: 0,
            plan: VecDeque::new(),
            chain,
            on_failing: false,
            spec,
        };
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.slots[s].job = Some(job);
                s
            }
            None => {
                self.slots.push(Slot { gen: 0, job: Some(job) });
                self.slots.len() - 1
            }
        };
        self.jobs_submitted += 1;
        self.emit(slot, adapter(&self.pools[self.j_pool(slot)].cfg), Kind::Submitted(submitted));
        let (poll, cancel) = {
            let j = self.j(slot);
            (j.submit_ms + j.spec.poll_ms, j.spec.cancel_after_ms.map(|c| j.submit_ms + c))
        };
        let gen = self.gen(slot);
        self.push(poll, Act::Eligible(slot, gen));
        if let Some(c) = cancel {
            self.push(c.max(poll + 1000), Act::Cancel(slot, gen));
        }
    }

    fn j_pool(&self, slot: usize) -> usize {
        self.slots[slot].job.as_ref().map_or(0, |j| j.pool)
    }

    /// The adapter first sees the job waiting: it enters its pool's queue.
    fn eligible(&mut self, slot: usize) {
        let p = self.j_pool(slot);
        let raw = match self.pools[p].sched {
            Scheduler::Managed => managed_raw(self.pools[p].cfg.provider).0,
            Scheduler::Kueue => "Pending",
            Scheduler::Slurm => "Priority",
        };
        let reason =
            if self.pools[p].sched == Scheduler::Slurm { pb::WaitReason::Priority } else { pb::WaitReason::Capacity };
        self.enqueue(slot, reason, raw);
        let ready = self.j(slot).ready_ms;
        if ready > self.clock {
            self.push(ready, Act::Pass(p));
        }
    }

    fn enqueue(&mut self, slot: usize, reason: pb::WaitReason, raw: &'static str) {
        let now = self.clock;
        let (p, key) = {
            let j = self.j(slot);
            let key = (u8::from(!j.spec.urgent), j.submit_ms, j.idx);
            j.key = Some(key);
            j.waited_from_ms = now;
            j.estimate = None;
            j.position = None;
            j.reason = None;
            (j.pool, key)
        };
        self.pools[p].queue.insert(key, slot);
        self.set_reason(slot, reason, raw);
        self.request_pass(p);
    }

    fn request_pass(&mut self, p: usize) {
        self.pools[p].dirty = true;
        if !self.pools[p].pass_pending {
            self.pools[p].pass_pending = true;
            self.push(self.clock, Act::Pass(p));
        }
    }

    /// Sends a `queued` if the job's reason changed.
    fn set_reason(&mut self, slot: usize, reason: pb::WaitReason, raw: &'static str) {
        let j = self.j(slot);
        if j.reason == Some((reason, raw)) {
            return;
        }
        j.reason = Some((reason, raw));
        self.emit_queued(slot);
    }

    fn emit_queued(&mut self, slot: usize) {
        let p = self.j_pool(slot);
        let now = self.clock;
        let j = self.j(slot);
        // An estimate the clock has passed is no estimate (as the Slurm adapter reads squeue).
        j.estimate = j.estimate.filter(|e| *e > now);
        let Some((reason, raw)) = j.reason else { return };
        let q = pb::Queued {
            reason: reason as i32,
            raw_reason: raw.into(),
            message: j.position.map(|n| format!("(position {n} in ClusterQueue)")).unwrap_or_default(),
            estimated_start: j.estimate.map(ms_to_timestamp),
            queue_position: j.position.map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        };
        let source = adapter(&self.pools[p].cfg);
        self.emit(slot, source, Kind::Queued(q));
    }

    fn emit(&mut self, slot: usize, source: &str, kind: Kind) {
        let at = self.clock;
        let seed = self.cfg.seed;
        let j = self.j(slot);
        let n = j.n;
        j.n += 1;
        let ev = pb::LifecycleEvent {
            event_id: format!("sim-{seed:x}-{}-{n}", j.idx),
            job_id: j.id.clone(),
            attempt: j.attempt,
            source: source.into(),
            occurred_at: Some(ms_to_timestamp(at)),
            kind: Some(kind),
        };
        self.out.push_back(ev);
    }

    fn pass(&mut self, p: usize) {
        self.pools[p].pass_pending = false;
        let now = self.clock;
        let keys: Vec<(QueueKey, usize)> = self.pools[p].queue.iter().take(SCAN).map(|(k, s)| (*k, *s)).collect();
        if self.pools[p].crunch_until > now {
            // Nothing fits: Slurm shows `Resources` on the first job in rank order and `Priority` behind it, as
            // it does when a pool is full; Kueue's pods and managed endpoints report capacity for every job.
            let raw = crunch_raw(&self.pools[p].cfg);
            let slurm = self.pools[p].sched == Scheduler::Slurm;
            for (i, (_, s)) in keys.into_iter().enumerate() {
                if slurm && i > 0 {
                    self.set_reason(s, pb::WaitReason::Priority, "Priority");
                } else {
                    self.set_reason(s, pb::WaitReason::Capacity, raw);
                }
            }
        } else if self.pools[p].sched == Scheduler::Managed {
            self.pass_managed(p, &keys);
        } else {
            self.pass_dedicated(p, &keys);
        }
        if self.pools[p].sched == Scheduler::Kueue {
            self.positions(p);
        }
        if self.pools[p].sched == Scheduler::Slurm && self.pools[p].dirty && !self.pools[p].tick_pending {
            self.pools[p].tick_pending = true;
            let at = (now.div_euclid(PLAN_EVERY_MS) + 1) * PLAN_EVERY_MS;
            self.push(at, Act::Tick(p));
        }
    }

    fn pass_managed(&mut self, p: usize, keys: &[(QueueKey, usize)]) {
        let now = self.clock;
        let (_, stockout_raw, quota_raw) = managed_raw(self.pools[p].cfg.provider);
        for &(_, s) in keys {
            let (ready, urgent, gpus) = {
                let j = self.j(s);
                (j.ready_ms, j.spec.urgent, j.spec.gpus)
            };
            if ready > now {
                continue;
            }
            let pool = &self.pools[p];
            if urgent {
                self.start(s, false);
            } else if pool.stockout_until > now {
                self.set_reason(s, pb::WaitReason::Capacity, stockout_raw);
            } else if pool.cfg.quota_gpus > 0 && pool.normal_used + gpus > pool.cfg.quota_gpus {
                self.set_reason(s, pb::WaitReason::Quota, quota_raw);
            } else {
                self.start(s, false);
            }
        }
    }

    fn pass_dedicated(&mut self, p: usize, keys: &[(QueueKey, usize)]) {
        let now = self.clock;
        let slurm = self.pools[p].sched == Scheduler::Slurm;
        let backfill = slurm && self.cfg.backfill;
        let team_limit = self.pools[p].cfg.team_limit();
        // The first job that does not fit, and its reservation (computed when a later job could backfill).
        let mut head: Option<(usize, Option<i64>)> = None;
        for &(_, s) in keys {
            let (urgent, gpus, nc, team, limit) = {
                let j = self.j(s);
                (j.spec.urgent, j.spec.gpus, j.spec.node_count(), j.spec.team, j.spec.limit_ms)
            };
            if slurm && !urgent && self.pools[p].team_used[team] + gpus > team_limit {
                self.set_reason(s, pb::WaitReason::Quota, "QOSGrpGRES");
                continue;
            }
            let (capacity, behind) = if slurm {
                ((pb::WaitReason::Capacity, "Resources"), (pb::WaitReason::Priority, "Priority"))
            } else {
                ((pb::WaitReason::Capacity, "Pending"), (pb::WaitReason::Capacity, "Pending"))
            };
            if self.pools[p].nodes.fits(gpus, nc) {
                match head {
                    None => self.start(s, false),
                    Some((h, ref mut shadow)) if backfill => {
                        let sh = match *shadow {
                            Some(sh) => sh,
                            None => {
                                let sh = self.plan_starts(p, &[h])[0].unwrap_or(i64::MAX);
                                *shadow = Some(sh);
                                sh
                            }
                        };
                        if now + limit <= sh {
                            self.start(s, false);
                        } else {
                            self.set_reason(s, behind.0, behind.1);
                        }
                    }
                    Some(_) => self.set_reason(s, behind.0, behind.1),
                }
            } else if urgent && head.is_none() && self.preempt_for(p, s) {
                self.start(s, true);
            } else if head.is_none() {
                head = Some((s, None));
                self.set_reason(s, capacity.0, capacity.1);
            } else {
                self.set_reason(s, behind.0, behind.1);
            }
        }
    }

    /// Frees GPUs for urgent job `s` by preempting normal jobs; false (nothing done) when it cannot.
    fn preempt_for(&mut self, p: usize, s: usize) -> bool {
        let (gpus, nc) = {
            let j = self.j(s);
            (j.spec.gpus, j.spec.node_count())
        };
        let per = per_node(gpus, nc);
        let mut victims: Vec<usize> = Vec::new();
        {
            let pool = &self.pools[p];
            let nodes = &pool.nodes;
            let on_node = &pool.on_node;
            let urgent_on =
                |n: usize| on_node[n].iter().any(|v| self.slots[*v].job.as_ref().is_some_and(|j| j.spec.urgent));
            // Per candidate node: (normal GPUs to preempt, node).
            let mut cands: Vec<(u32, u32)> = Vec::new();
            for (n, here) in on_node.iter().enumerate().take(nodes.up.len()) {
                if !nodes.up[n] {
                    continue;
                }
                let free = nodes.free(n as u32);
                if nc > 1 {
                    if urgent_on(n) {
                        continue;
                    }
                    cands.push((GPUS_PER_NODE - free, n as u32));
                } else {
                    // Youngest normal jobs first until enough is free.
                    let mut on: Vec<(i64, usize, u32)> = here
                        .iter()
                        .filter_map(|v| {
                            let j = self.slots[*v].job.as_ref()?;
                            let bits = j.placed.iter().find(|(x, _)| *x == n as u32)?.1;
                            (!j.spec.urgent).then_some((j.started_ms, *v, bits.count_ones()))
                        })
                        .collect();
                    on.sort_by_key(|(t, v, _)| (Reverse(*t), *v));
                    let (mut f, mut cost) = (free, 0);
                    for (_, _, g) in &on {
                        if f >= per {
                            break;
                        }
                        f += g;
                        cost += g;
                    }
                    if f >= per {
                        cands.push((cost, n as u32));
                    }
                }
            }
            if cands.len() < nc as usize {
                return false;
            }
            cands.sort_unstable();
            for &(_, n) in cands.iter().take(nc as usize) {
                let n = n as usize;
                if nc > 1 {
                    victims.extend(on_node[n].iter().copied());
                } else {
                    let mut on: Vec<(i64, usize, u32)> = on_node[n]
                        .iter()
                        .filter_map(|v| {
                            let j = self.slots[*v].job.as_ref()?;
                            let bits = j.placed.iter().find(|(x, _)| *x == n as u32)?.1;
                            (!j.spec.urgent).then_some((j.started_ms, *v, bits.count_ones()))
                        })
                        .collect();
                    on.sort_by_key(|(t, v, _)| (Reverse(*t), *v));
                    let mut f = nodes.free(n as u32);
                    for (_, v, g) in on {
                        if f >= per {
                            break;
                        }
                        f += g;
                        victims.push(v);
                    }
                }
            }
        }
        victims.sort_unstable();
        victims.dedup();
        for v in victims {
            let saved = self.j(v).rng.chance(0.5);
            self.interrupt(v, Kind::Preempted(pb::Preempted { reason: "priority".into(), checkpoint_saved: saved }));
        }
        self.pools[p].nodes.fits(gpus, nc)
    }

    /// Kueue: each waiting workload's position, sent when it moved enough.
    fn positions(&mut self, p: usize) {
        let keys: Vec<usize> = self.pools[p].queue.values().take(SCAN).copied().collect();
        for (i, s) in keys.into_iter().enumerate() {
            let j = self.j(s);
            if crate::provider::kueue::position_moved(j.position, i as u64) {
                j.position = Some(i as u64);
                self.emit_queued(s);
            }
        }
    }

    /// Slurm's planner: estimated starts of the first waiting jobs.
    fn tick(&mut self, p: usize) {
        self.pools[p].tick_pending = false;
        if !self.pools[p].dirty {
            return;
        }
        self.pools[p].dirty = false;
        let now = self.clock;
        let team_limit = self.pools[p].cfg.team_limit();
        let slots: Vec<usize> = self.pools[p]
            .queue
            .values()
            .copied()
            .filter(|s| {
                let j = self.slots[*s].job.as_ref().expect("queued job");
                j.spec.urgent || self.pools[p].team_used[j.spec.team] + j.spec.gpus <= team_limit
            })
            .take(ESTIMATED)
            .collect();
        let crunch = self.pools[p].crunch_until;
        let est = self.plan_starts(p, &slots);
        for (s, e) in slots.into_iter().zip(est) {
            let e = e.map(|e| if now < crunch { e.max(crunch) } else { e }).filter(|e| *e > now);
            let j = self.j(s);
            let moved = match (j.estimate, e) {
                (None, Some(_)) => true,
                (Some(last), Some(e)) => (e - last).abs() > ESTIMATE_STEP_MS,
                _ => false,
            };
            if moved {
                j.estimate = e;
                self.emit_queued(s);
            }
        }
    }

    /// When each of `slots` (in this order) could start if running jobs end at their time limits and each takes
    /// its GPUs at its planned start until its own limit: the earliest time it fits after the ones before it.
    fn plan_starts(&self, p: usize, slots: &[usize]) -> Vec<Option<i64>> {
        let pool = &self.pools[p];
        // A copy of the pool's free GPUs (O(nodes) memory copies, then O(1) per placement or release).
        let mut st = pool.nodes.clone();
        let mut ends = pool.ends.iter().peekable();
        let mut planned: BinaryHeap<Reverse<(i64, usize)>> = BinaryHeap::new();
        let mut allocs: Vec<Vec<(u32, u8)>> = Vec::new();
        let mut t = self.clock;
        let mut out = Vec::with_capacity(slots.len());
        for &s in slots {
            let j = self.slots[s].job.as_ref().expect("queued job");
            let (gpus, nc) = (j.spec.gpus, j.spec.node_count());
            let mut ok = true;
            while !st.fits(gpus, nc) {
                let next_run = ends.peek().map(|(e, _)| *e);
                let next_plan = planned.peek().map(|Reverse((e, _))| *e);
                let take_run = match (next_run, next_plan) {
                    (None, None) => {
                        ok = false;
                        break;
                    }
                    (Some(a), Some(b)) => a <= b,
                    (Some(_), None) => true,
                    (None, Some(_)) => false,
                };
                if take_run {
                    let Some(&(e, v)) = ends.next() else { break };
                    t = t.max(e);
                    if let Some(vj) = self.slots[v].job.as_ref() {
                        for (n, bits) in &vj.placed {
                            if st.up[*n as usize] {
                                st.give(*n, *bits);
                            }
                        }
                    }
                } else {
                    let Some(Reverse((e, a))) = planned.pop() else { break };
                    t = t.max(e);
                    for &(n, bits) in &allocs[a] {
                        st.give(n, bits);
                    }
                }
            }
            if !ok {
                out.push(None);
                continue;
            }
            let alloc = st.take(gpus, nc).unwrap_or_default();
            planned.push(Reverse((t + j.spec.limit_ms, allocs.len())));
            allocs.push(alloc);
            out.push(Some(t));
        }
        out
    }

    /// Starts job `s` now: its nodes (or instances), then its run's plan.
    fn start(&mut self, s: usize, preempted_others: bool) {
        let now = self.clock;
        let p = self.j_pool(s);
        let managed = self.pools[p].sched == Scheduler::Managed;
        let key = self.j(s).key.take().expect("a waiting job");
        self.pools[p].queue.remove(&key);
        let (gpus, nc, urgent, team, limit) = {
            let j = self.j(s);
            (j.spec.gpus, j.spec.node_count(), j.spec.urgent, j.spec.team, j.spec.limit_ms)
        };
        let pool_name = self.pools[p].cfg.name;
        let (names, gpu_ids) = if managed {
            let names: Vec<String> = {
                let j = self.j(s);
                (0..nc).map(|_| format!("{pool_name}-i-{:08x}", j.rng.next_u64() as u32)).collect()
            };
            self.j(s).instances = names.clone();
            (names, Vec::new())
        } else {
            let placed = self.pools[p].nodes.take(gpus, nc).expect("a job started only when it fits");
            for (n, _) in &placed {
                self.pools[p].on_node[*n as usize].push(s);
            }
            let names: Vec<String> = placed.iter().map(|(n, _)| model::node_name(pool_name, *n)).collect();
            let ids = placed
                .iter()
                .flat_map(|(n, bits)| {
                    (0..8u8).filter(move |g| bits & (1 << g) != 0).map(move |g| format!("{pool_name}-node-{n:03}/{g}"))
                })
                .collect();
            let failing = self.pools[p].cfg.failing_node.is_some_and(|f| placed.iter().any(|(n, _)| *n == f));
            let j = self.j(s);
            j.placed = placed;
            j.on_failing = failing;
            (names, ids)
        };
        if !urgent {
            self.pools[p].normal_used += gpus;
            if !managed {
                self.pools[p].team_used[team] += gpus;
            }
        }
        self.pools[p].ends.insert((now + limit, s));
        let attempt = {
            let j = self.j(s);
            let a = j.attempt.unwrap_or(1);
            j.attempt = Some(a);
            j.started_once = true;
            j.started_ms = now;
            j.train_ms = None;
            j.estimate = None;
            j.position = None;
            j.reason = None;
            j.last_ckpt_step = j.resume_step;
            a
        };
        if self.cfg.trace {
            let j = self.slots[s].job.as_ref().expect("live");
            self.starts.push(Start {
                job_id: j.id.clone(),
                attempt,
                pool: p,
                submitted_ms: j.submit_ms,
                waited_from_ms: j.waited_from_ms,
                start_ms: now,
                preempted_others,
            });
        }
        let source = runner(&self.pools[p].cfg);
        self.emit(s, source, Kind::NodeAssigned(pb::NodeAssigned { nodes: names, gpu_ids }));
        self.make_plan(s);
        self.pools[p].dirty = true;
        self.next_plan(s);
    }

    /// The run's steps from now: preparation, first step, checkpoints, its end.
    fn make_plan(&mut self, s: usize) {
        let now = self.clock as f64;
        let p = self.j_pool(s);
        let managed = self.pools[p].cfg.kind == pb::PoolKind::Managed;
        let j = self.j(s);
        let r = &mut j.rng;
        let urgent = j.spec.urgent;
        let m = MIN as f64;
        let mut plan = VecDeque::new();
        let mut t = now;
        if managed && urgent {
            // A warm instance from the reserved pool with the image cached: staging only.
            plan.push_back((t, Item::Phase(pb::PreparingPhase::DataStaging)));
            t += r.lognormal(1.2 * m, 0.6);
        } else if managed {
            plan.push_back((t, Item::Phase(pb::PreparingPhase::Provisioning)));
            t += r.lognormal(4.0 * m, 0.4);
            plan.push_back((t, Item::Phase(pb::PreparingPhase::ImagePull)));
            t += r.lognormal(3.0 * m, 0.5);
            plan.push_back((t, Item::Phase(pb::PreparingPhase::DataStaging)));
            t += r.lognormal(2.5 * m, 0.8);
        } else {
            // Urgent work runs from images and datasets kept warm on the nodes.
            if r.chance(if urgent { 0.03 } else { 0.15 }) {
                plan.push_back((t, Item::Phase(pb::PreparingPhase::ImagePull)));
                t += r.lognormal(2.0 * m, 0.6);
            }
            plan.push_back((t, Item::Phase(pb::PreparingPhase::DataStaging)));
            t += if urgent { r.lognormal(0.5 * m, 0.5) } else { r.lognormal(1.0 * m, 0.8) };
        }
        if managed {
            plan.push_back((t, Item::ContainerStart));
        } else {
            plan.push_back((t, Item::Phase(pb::PreparingPhase::Environment)));
        }
        t += if urgent { r.lognormal(0.5 * m, 0.4) } else { r.lognormal(0.75 * m, 0.5) };
        let deadline = j.started_ms as f64 + j.spec.limit_ms as f64;
        // A broken build fails at start now and then; urgent work (usually a re-run of known-good code) rarely;
        // a fifth of the runs placed on the failing node hit an ECC error.
        let fail_p = if j.on_failing {
            0.2
        } else if urgent {
            0.002
        } else {
            0.01
        };
        if t >= deadline {
            plan.push_back((deadline, Item::Done(pb::Outcome::TimedOut, None, "time limit reached")));
        } else if r.chance(fail_p) {
            let msg = if j.on_failing {
                "CUDA error: uncorrectable ECC error encountered"
            } else {
                "CUDA error: no kernel image is available"
            };
            plan.push_back((t, Item::Done(pb::Outcome::Failed, Some(1), msg)));
        } else {
            plan.push_back((t, Item::TrainStart));
            let remaining = (j.spec.work_ms - j.resume_step as i64 * 1000).max(60_000) as f64;
            let spot = managed && r.chance(0.12);
            let (end, end_item) = if spot {
                (t + r.uniform(0.05, 0.95) * remaining, Item::Spot)
            } else if j.spec.fails_at_end {
                (t + remaining, Item::Done(pb::Outcome::Failed, Some(1), "loss became nan"))
            } else {
                (t + remaining, Item::Done(pb::Outcome::Succeeded, Some(0), ""))
            };
            let (end, end_item) = if end > deadline {
                (deadline, Item::Done(pb::Outcome::TimedOut, None, "time limit reached"))
            } else {
                (end, end_item)
            };
            let interval = r.uniform(15.0, 20.0) * m;
            let mut since = interval;
            while t + since < end {
                plan.push_back((t + since, Item::Checkpoint(j.resume_step + (since / 1000.0) as u64)));
                since += interval;
            }
            plan.push_back((end, end_item));
        }
        j.plan = plan.into_iter().map(|(at, i)| (at as i64, i)).collect();
    }

    fn next_plan(&mut self, s: usize) {
        let gen = self.gen(s);
        if let Some(&(at, _)) = self.j(s).plan.front() {
            self.push(at, Act::Plan(s, gen));
        }
    }

    fn plan_step(&mut self, s: usize) {
        let Some((_, item)) = self.j(s).plan.pop_front() else { return };
        let p = self.j_pool(s);
        let src = runner(&self.pools[p].cfg);
        let trainer = model::trainer_reports(&self.pools[p].cfg);
        match item {
            Item::Phase(ph) => {
                self.emit(s, src, Kind::Preparing(pb::Preparing { phase: ph as i32, message: String::new() }))
            }
            Item::ContainerStart => self.emit(
                s,
                src,
                Kind::FirstStep(pb::FirstStep { step: 0, origin: pb::StepOrigin::ContainerStart as i32 }),
            ),
            Item::TrainStart => {
                let now = self.clock;
                let j = self.j(s);
                j.train_ms = Some(now);
                let step = j.resume_step + 1;
                if trainer {
                    self.emit(
                        s,
                        "sim/training-process",
                        Kind::FirstStep(pb::FirstStep { step, origin: pb::StepOrigin::TrainingProcess as i32 }),
                    );
                }
            }
            Item::Checkpoint(step) => {
                let j = self.j(s);
                j.last_ckpt_step = step;
                let save = j.rng.uniform(20.0, 90.0);
                let uri = format!("s3://ckpt/{}/{step}", j.idx);
                self.emit(s, src, Kind::Checkpoint(pb::Checkpoint { step, uri, save_seconds: save }));
            }
            Item::Spot => {
                let saved = self.j(s).rng.chance(0.5);
                self.interrupt(
                    s,
                    Kind::Preempted(pb::Preempted { reason: "spot-interruption".into(), checkpoint_saved: saved }),
                );
                return;
            }
            Item::Done(outcome, code, msg) => {
                self.release(s);
                self.emit(
                    s,
                    src,
                    Kind::Done(pb::Done { outcome: outcome as i32, exit_code: code, message: msg.into() }),
                );
                self.finish(s, outcome);
                return;
            }
        }
        self.next_plan(s);
    }

    /// Gives a running job's GPUs (or quota) back.
    fn release(&mut self, s: usize) {
        let p = self.j_pool(s);
        let (placed, gpus, urgent, team, end) = {
            let j = self.j(s);
            (std::mem::take(&mut j.placed), j.spec.gpus, j.spec.urgent, j.spec.team, j.started_ms + j.spec.limit_ms)
        };
        let pool = &mut self.pools[p];
        for (n, bits) in placed {
            if pool.nodes.up[n as usize] {
                pool.nodes.give(n, bits);
            }
            pool.on_node[n as usize].retain(|v| *v != s);
        }
        pool.ends.remove(&(end, s));
        if !urgent {
            pool.normal_used -= gpus;
            if pool.sched != Scheduler::Managed {
                pool.team_used[team] -= gpus;
            }
        }
        self.request_pass(p);
    }

    /// Stops a running job (`preempted` or `node_lost`), which is requeued.
    fn interrupt(&mut self, s: usize, kind: Kind) {
        let now = self.clock;
        let p = self.j_pool(s);
        self.release(s);
        let saved = matches!(&kind, Kind::Preempted(pr) if pr.checkpoint_saved);
        let src =
            if matches!(kind, Kind::NodeLost(_)) { runner(&self.pools[p].cfg) } else { adapter(&self.pools[p].cfg) };
        self.emit(s, src, kind);
        {
            let j = self.j(s);
            // Resume from the last checkpoint (or the step reached, when one was saved at the stop).
            let reached = j.train_ms.map_or(j.resume_step, |t| j.resume_step + ((now - t).max(0) / 1000) as u64);
            j.resume_step = if saved { reached } else { j.last_ckpt_step };
            j.plan.clear();
            j.train_ms = None;
        }
        self.slots[s].gen = self.slots[s].gen.wrapping_add(1);
        let gen = self.gen(s);
        let delay = (self.j(s).rng.uniform(5.0, 30.0) * 1000.0) as i64;
        self.push(now + delay, Act::Requeue(s, gen));
    }

    fn requeue(&mut self, s: usize) {
        let p = self.j_pool(s);
        let step = {
            let j = self.j(s);
            j.attempt = Some(j.attempt.unwrap_or(1) + 1);
            j.requeued = true;
            j.resume_step
        };
        self.emit(s, adapter(&self.pools[p].cfg), Kind::Requeued(pb::Requeued { resume_step: step }));
        let gen = self.gen(s);
        self.push(self.clock + 1000, Act::RequeueReady(s, gen));
    }

    fn requeue_ready(&mut self, s: usize) {
        self.j(s).ready_ms = self.clock;
        self.enqueue(s, pb::WaitReason::PreemptionRecovery, "requeued");
    }

    fn cancel(&mut self, s: usize) {
        let p = self.j_pool(s);
        if let Some(key) = self.j(s).key.take() {
            self.pools[p].queue.remove(&key);
        }
        let src = adapter(&self.pools[p].cfg);
        self.emit(
            s,
            src,
            Kind::Done(pb::Done {
                outcome: pb::Outcome::Cancelled as i32,
                exit_code: None,
                message: "cancelled by user".into(),
            }),
        );
        self.finish(s, pb::Outcome::Cancelled);
        self.request_pass(p);
    }

    /// The job is over: its slot is freed, and a chain submits its next stage.
    fn finish(&mut self, s: usize, outcome: pb::Outcome) {
        let job = self.slots[s].job.take().expect("live");
        self.slots[s].gen = self.slots[s].gen.wrapping_add(1);
        self.free_slots.push(s);
        if let Some(c) = job.chain {
            let next = if outcome == pb::Outcome::Succeeded {
                (c.stage + 1 < super::CHAIN_STAGES.len()).then_some((c.stage + 1, false))
            } else {
                (!c.retry).then_some((c.stage, true))
            };
            if let Some((stage, retry)) = next {
                let mut r = Rng::derive(self.cfg.seed ^ 0xC4A1_0000, (c.chain << 8) | c.n);
                let gap = r.lognormal(8.0 * MIN as f64, 0.8).clamp(120_000.0, 1_800_000.0) as i64;
                self.push(self.clock + gap, Act::ChainArrive { chain: c.chain, stage, retry, n: c.n + 1 });
            }
        }
    }

    fn node_fail(&mut self, p: usize, n: u32) {
        let now = self.clock;
        let pool = self.pools[p].cfg.clone();
        if !self.pools[p].nodes.up[n as usize] {
            return;
        }
        let name = model::node_name(pool.name, n);
        let mut on = self.pools[p].on_node[n as usize].clone();
        on.sort_unstable();
        for s in on {
            self.interrupt(
                s,
                Kind::NodeLost(pb::NodeLost { node: name.clone(), message: "node not responding".into() }),
            );
        }
        self.pools[p].nodes.set_up(n, false);
        if self.cfg.trace {
            self.node_changes.push(NodeChange { at_ms: now, pool: p, node: n, up: false });
        }
        let repair = if pool.failing_node == Some(n) {
            self.rng.uniform(15.0, 40.0) * MIN as f64
        } else {
            self.rng.lognormal(3.0 * 3_600_000.0, 0.5)
        };
        self.push(now + repair as i64, Act::NodeUp(p, n));
    }

    fn node_up(&mut self, p: usize, n: u32) {
        let now = self.clock;
        self.pools[p].nodes.set_up(n, true);
        if self.cfg.trace {
            self.node_changes.push(NodeChange { at_ms: now, pool: p, node: n, up: true });
        }
        let next = self.rng.exp(mtbf(&self.pools[p].cfg, n)) as i64;
        self.push(now + next.max(60_000), Act::NodeFail(p, n));
        self.request_pass(p);
    }

    /// A candidate stock-out (thinned by the hour's load: stock-outs come with demand).
    fn stockout(&mut self, p: usize) {
        let now = self.clock;
        let pool = self.pools[p].cfg.clone();
        if self.rng.f64() < model::load_at_hour(model::hour_of(now)) {
            let until = now + self.rng.lognormal(45.0 * MIN as f64, 0.7) as i64;
            self.pools[p].stockout_until = self.pools[p].stockout_until.max(until);
            self.push(until, Act::StockoutEnd(p));
            self.request_pass(p);
        }
        let next = self.rng.exp(stockout_gap(&pool)) as i64;
        self.push(now + next.max(60_000), Act::Stockout(p));
    }

    /// GPUs in use in dedicated pool `p` now (for checks).
    pub fn gpus_in_use(&self, p: usize) -> u32 {
        self.pools[p]
            .nodes
            .used
            .iter()
            .zip(&self.pools[p].nodes.up)
            .filter(|(_, up)| **up)
            .map(|(u, _)| u.count_ones())
            .sum()
    }

    /// Up nodes of pool `p` now.
    pub fn nodes_up(&self, p: usize) -> usize {
        self.pools[p].nodes.up_count()
    }

    /// GPUs normal jobs of pool `p` hold now (a managed pool's quota use).
    pub fn normal_gpus(&self, p: usize) -> u32 {
        self.pools[p].normal_used
    }
}

fn mtbf(pool: &Pool, n: u32) -> f64 {
    if pool.failing_node == Some(n) {
        FAILING_MTBF_MS
    } else {
        HEALTHY_MTBF_MS
    }
}

/// Mean time between candidate stock-outs (thinned by load, whose mean is 0.675).
fn stockout_gap(pool: &Pool) -> f64 {
    86_400_000.0 * 0.675 / pool.stockouts_per_day.max(1e-9)
}

/// The adapter that reports a pool's scheduler-side events.
fn adapter(pool: &Pool) -> &'static str {
    match pool.scheduler() {
        Scheduler::Managed => "sim/managed-adapter",
        Scheduler::Kueue => "sim/kueue-adapter",
        Scheduler::Slurm => "sim/slurm-adapter",
    }
}

/// What reports a run's events: the node agent on dedicated pools, the adapter on managed ones.
fn runner(pool: &Pool) -> &'static str {
    match pool.scheduler() {
        Scheduler::Managed => "sim/managed-adapter",
        _ => "sim/node-agent",
    }
}

/// A managed provider's raw reasons: waiting, stocked out, over quota.
fn managed_raw(provider: &str) -> (&'static str, &'static str, &'static str) {
    match provider {
        "sagemaker" => {
            ("Pending", "CapacityError: Unable to provision requested ML compute capacity", "ResourceLimitExceeded")
        }
        "vertex" => ("JOB_STATE_QUEUED", "Resources are insufficient in region", "Quota exceeded"),
        _ => ("Queued", "Not enough capacity in region", "Quota exceeded"),
    }
}

/// What a crunch shows a waiting job (the head's, on Slurm), as its scheduler or provider reports running out of
/// capacity: Slurm's `Resources` (nothing fits), a pod `Unschedulable` under Kueue, a managed endpoint's stock-out
/// message. Nothing a real adapter would not send.
fn crunch_raw(pool: &Pool) -> &'static str {
    match pool.scheduler() {
        Scheduler::Slurm => "Resources",
        Scheduler::Kueue => "Unschedulable",
        Scheduler::Managed => managed_raw(pool.provider).1,
    }
}

/// What [`simulate`] returns.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// Every event, in time order.
    pub events: Vec<pb::LifecycleEvent>,
    /// Every run's start.
    pub starts: Vec<Start>,
    /// Node failures and repairs.
    pub node_changes: Vec<NodeChange>,
    /// Jobs submitted.
    pub jobs: u64,
}

impl Trace {
    /// Each run's true start, by (job id, attempt).
    pub fn true_starts(&self) -> HashMap<(String, u32), i64> {
        self.starts.iter().map(|s| ((s.job_id.clone(), s.attempt), s.start_ms)).collect()
    }
}

/// Runs `cfg`'s fleet from `cfg.start_ms` to `end_ms` with `arrivals` (Unix ms, sorted): the events in time order
/// and, for checking estimates, each run's true start. Jobs still waiting or running at `end_ms` stay so.
pub fn simulate(mut cfg: FleetConfig, arrivals: &[i64], end_ms: i64) -> Trace {
    cfg.trace = true;
    let mut sim = FleetSim::new(cfg);
    let mut trace = Trace::default();
    let mut next = 0;
    let mut clock = sim.clock();
    while clock < end_ms {
        let step = (clock + 3_600_000).min(end_ms);
        while next < arrivals.len() && arrivals[next] <= step {
            if arrivals[next] < end_ms {
                sim.submit(arrivals[next]);
            }
            next += 1;
        }
        sim.advance(step);
        trace.events.extend(sim.take_events());
        clock = step;
    }
    trace.starts = sim.take_starts();
    trace.node_changes = sim.take_node_changes();
    trace.jobs = sim.jobs_submitted();
    trace
}

/// The events of `cfg`'s fleet from `cfg.start_ms` to `end_ms` with `arrivals` (sorted), in time order, generated
/// as they are taken (memory holds only the jobs in flight).
pub fn events(cfg: FleetConfig, arrivals: Vec<i64>, end_ms: i64) -> Events {
    let clock = cfg.start_ms;
    Events { sim: FleetSim::new(cfg), arrivals, next: 0, end_ms, clock }
}

/// See [`events`].
pub struct Events {
    sim: FleetSim,
    arrivals: Vec<i64>,
    next: usize,
    end_ms: i64,
    clock: i64,
}

impl Events {
    /// Jobs submitted so far.
    pub fn jobs_submitted(&self) -> u64 {
        self.sim.jobs_submitted()
    }
}

impl Iterator for Events {
    type Item = pb::LifecycleEvent;

    fn next(&mut self) -> Option<pb::LifecycleEvent> {
        loop {
            if let Some(e) = self.sim.pop_event() {
                return Some(e);
            }
            if self.clock >= self.end_ms {
                return None;
            }
            let step = (self.clock + 600_000).min(self.end_ms);
            while self.next < self.arrivals.len() && self.arrivals[self.next] <= step {
                if self.arrivals[self.next] < self.end_ms {
                    self.sim.submit(self.arrivals[self.next]);
                }
                self.next += 1;
            }
            self.sim.advance(step);
            self.clock = step;
        }
    }
}

/// Groups a time-ordered event stream by job: each job's events once it is done (in the order jobs end), then the
/// jobs still open when the stream ends (in the order they were submitted).
pub fn by_job(events: impl Iterator<Item = pb::LifecycleEvent>) -> impl Iterator<Item = Vec<pb::LifecycleEvent>> {
    let mut events = events.fuse();
    let mut open: HashMap<String, (u64, Vec<pb::LifecycleEvent>)> = HashMap::new();
    let mut order = 0u64;
    let mut rest: Option<std::vec::IntoIter<Vec<pb::LifecycleEvent>>> = None;
    std::iter::from_fn(move || loop {
        if let Some(r) = rest.as_mut() {
            return r.next();
        }
        match events.next() {
            Some(e) => {
                let done = matches!(e.kind, Some(Kind::Done(_)));
                let id = e.job_id.clone();
                let entry = open.entry(id.clone()).or_insert_with(|| {
                    order += 1;
                    (order, Vec::new())
                });
                entry.1.push(e);
                if done {
                    return open.remove(&id).map(|(_, v)| v);
                }
            }
            None => {
                let mut left: Vec<(u64, Vec<pb::LifecycleEvent>)> = open.drain().map(|(_, v)| v).collect();
                left.sort_by_key(|(o, _)| *o);
                rest = Some(left.into_iter().map(|(_, v)| v).collect::<Vec<_>>().into_iter());
            }
        }
    })
}
