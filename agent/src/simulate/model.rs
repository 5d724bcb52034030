//! The fleet model: the pools, their capacity, and what each arriving job asks for. The engine
//! ([`super::engine`]) runs these jobs against the pools' capacity; this module holds what is drawn per job (its
//! pool, priority, size, run length, time limit) and the pools' shapes.
//!
//! Pools and their capacity:
//! - **dedicated** pools (Slurm partitions, a Kubernetes cluster queue under Kueue) have `nodes` nodes of 8 GPUs
//!   each: a job starts only when its GPUs are free, urgent jobs preempt normal ones, each team may hold at most
//!   half of the pool (Slurm's `QOSGrpGRES`); Slurm pools backfill, Kueue's admits in strict order;
//! - **managed** endpoints (SageMaker, Vertex AI, Azure ML) have an account quota of `quota_gpus` GPUs for normal
//!   jobs and regional stock-outs (about `stockouts_per_day` a day, more at the daily peak) during which no normal
//!   job gets capacity; urgent jobs run on reserved warm capacity outside both.
//!
//! Capacity is sized for the arrival rate ([`size_for_rate`]): [`NODES_PER_JOB_HOUR`] nodes per job an hour sent
//! to a dedicated pool, [`QUOTA_GPUS_PER_JOB_HOUR`] GPUs of quota per job an hour sent to a managed one, which
//! puts the daily peak above capacity and the night below it: waits, queues and utilisation come from that load.
//!
//! Dedicated nodes are named `<pool>-node-NNN`; managed jobs get fresh instances. One node of the `a100` pool,
//! [`FAILING_NODE`], has GPUs whose correctable ECC errors climb ([`failing_node_ecc`]); it fails every few
//! hours (its jobs get `node_lost`) and a fifth of the jobs placed on it fail at start: the suspect node of the
//! demo. During a pool's `crunches` nothing of the pool starts, urgent jobs included: the scripted bad hour that
//! breaks the urgent-start SLO and pages.
//!
//! First steps: the managed adapter reports each run's container start (a `first_step` of origin
//! `container_start`, where the environment phase begins); the SageMaker jobs' training loop reports its own first
//! step (origin `training_process`), which supersedes it, the Vertex AI jobs' does not ([`trainer_reports`]), so
//! their first steps are container starts and the managed-vs-dedicated comparison flags the difference. On
//! dedicated pools the node agent reports the training loop's first step.

use crate::rng::Rng;
use startline_proto::pb;

/// One pool of the simulated fleet.
#[derive(Debug, Clone)]
pub struct Pool {
    /// Managed or dedicated.
    pub kind: pb::PoolKind,
    /// Provider name: `slurm` and `kubernetes` (Kueue) for dedicated pools, `sagemaker`, `vertex`, `azureml`.
    pub provider: &'static str,
    /// Pool name.
    pub name: &'static str,
    /// Region or site.
    pub region: &'static str,
    /// Accelerator class.
    pub gpu_class: &'static str,
    /// Share of arriving jobs sent here.
    pub share: f64,
    /// Nodes of a dedicated pool, 8 GPUs each (0 for managed pools, whose instances are fresh each time).
    pub nodes: u32,
    /// The node (its number) whose GPUs are failing, if any.
    pub failing_node: Option<u32>,
    /// Capacity crunches `[from, to)` (Unix ms): nothing of the pool starts in them.
    pub crunches: Vec<(i64, i64)>,
    /// Managed pools: the account's quota, the most GPUs its normal jobs may hold at once (0: none).
    pub quota_gpus: u32,
    /// Managed pools: regional stock-outs a day on average (at the mean load; more at the peak).
    pub stockouts_per_day: f64,
}

/// GPUs per node of a dedicated pool.
pub const GPUS_PER_NODE: u32 = 8;

/// How a pool's scheduler reports on waiting jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheduler {
    /// Slurm: priority order with backfill, an estimated start per pending job.
    Slurm,
    /// Kueue: strict priority order, a position in the cluster queue per pending workload.
    Kueue,
    /// A managed endpoint: neither estimates nor positions.
    Managed,
}

impl Pool {
    /// The pool's scheduler.
    pub fn scheduler(&self) -> Scheduler {
        match (self.kind, self.provider) {
            (pb::PoolKind::Managed, _) => Scheduler::Managed,
            (_, "kubernetes") => Scheduler::Kueue,
            _ => Scheduler::Slurm,
        }
    }

    /// GPUs of a dedicated pool (0 for managed ones).
    pub fn gpus(&self) -> u32 {
        self.nodes * GPUS_PER_NODE
    }

    /// The most GPUs one team's normal jobs may hold in a dedicated pool (half of it).
    pub fn team_limit(&self) -> u32 {
        (self.gpus() / 2).max(MAX_JOB_GPUS)
    }
}

/// The failing node of the default `a100` pool.
pub const FAILING_NODE: &str = "a100-node-013";

/// The name of node `n` of `pool`.
pub fn node_name(pool: &str, n: u32) -> String {
    format!("{pool}-node-{n:03}")
}

/// Cumulative correctable ECC errors of the failing node's GPUs at `ms`, the simulation having started at
/// `since_ms`: a count that climbs faster and faster (from 40, doubling every day, at most 40 x 2^20), the
/// pattern that precedes a GPU's failure.
pub fn failing_node_ecc(ms: i64, since_ms: i64) -> u64 {
    let days = (ms - since_ms) as f64 / 86_400_000.0;
    (40.0 * 2f64.powf(days.clamp(0.0, 20.0))) as u64
}

/// The scripted capacity crunches of a simulation whose history ends at `end_ms`: one hour three days before the
/// end (or half-way through a shorter history), and the hour around the end (from 30 minutes before to 30
/// minutes after), so jobs of the history are still waiting past their threshold when it ends and, with
/// `--follow`, new ones keep crossing it live.
pub fn crunches(end_ms: i64, history_ms: i64) -> Vec<(i64, i64)> {
    let back = (3 * 86_400_000).min(history_ms / 2);
    vec![(end_ms - back, end_ms - back + 3_600_000), (end_ms - 1_800_000, end_ms + 1_800_000)]
}

/// Dedicated nodes per job an hour sent to the pool: at the default mix a pool's mean offered load is about
/// 80% of its GPUs, about 120% at the daily peak.
pub const NODES_PER_JOB_HOUR: f64 = 16.0 / 9.0;

/// Managed quota GPUs per job an hour sent to the pool: the quota binds around the daily peak.
pub const QUOTA_GPUS_PER_JOB_HOUR: f64 = 16.0;

/// The arrival rate the default fleet is sized for (`simulate`'s default `--jobs-per-hour`).
pub const DEFAULT_JOBS_PER_HOUR: f64 = 60.0;

/// The largest job (GPUs).
pub const MAX_JOB_GPUS: u32 = 32;

/// Sizes every pool's capacity for `jobs_per_hour` arrivals over the fleet: dedicated pools get
/// [`NODES_PER_JOB_HOUR`] nodes per job an hour of their share (at least enough for the largest job), managed
/// pools [`QUOTA_GPUS_PER_JOB_HOUR`] GPUs of quota (at least the largest job). A failing node beyond the pool
/// is dropped.
pub fn size_for_rate(pools: &mut [Pool], jobs_per_hour: f64) {
    for p in pools {
        let rate = p.share * jobs_per_hour.max(0.0);
        match p.kind {
            pb::PoolKind::Managed => {
                p.quota_gpus = ((rate * QUOTA_GPUS_PER_JOB_HOUR).round() as u32).max(MAX_JOB_GPUS);
            }
            _ => {
                p.nodes = ((rate * NODES_PER_JOB_HOUR).round() as u32).max(MAX_JOB_GPUS / GPUS_PER_NODE);
                p.failing_node = p.failing_node.filter(|f| *f < p.nodes);
            }
        }
    }
}

/// The default fleet, sized for [`DEFAULT_JOBS_PER_HOUR`]: two managed endpoints, two dedicated Slurm partitions
/// (`a100`: 32 nodes, 256 GPUs; `h100`: 16 nodes, 128 GPUs) and a Kubernetes cluster queue under Kueue (`l40s`:
/// 11 nodes, 88 GPUs).
pub fn default_pools() -> Vec<Pool> {
    let managed = |provider, name, region, gpu_class, share| Pool {
        kind: pb::PoolKind::Managed,
        provider,
        name,
        region,
        gpu_class,
        share,
        nodes: 0,
        failing_node: None,
        crunches: Vec::new(),
        quota_gpus: 0,
        stockouts_per_day: 0.7,
    };
    let dedicated = |provider, name, region, gpu_class, share, failing_node| Pool {
        kind: pb::PoolKind::Dedicated,
        provider,
        name,
        region,
        gpu_class,
        share,
        nodes: 0,
        failing_node,
        crunches: Vec::new(),
        quota_gpus: 0,
        stockouts_per_day: 0.0,
    };
    let mut pools = vec![
        managed("sagemaker", "sm-p4d", "us-east-1", "a100-40g", 0.25),
        managed("vertex", "vertex-a3", "europe-west4", "h100", 0.20),
        dedicated("slurm", "a100", "dc-east", "a100-80g", 0.30, Some(13)),
        dedicated("slurm", "h100", "dc-east", "h100", 0.15, None),
        dedicated("kubernetes", "l40s", "dc-west", "l40s", 0.10, None),
    ];
    size_for_rate(&mut pools, DEFAULT_JOBS_PER_HOUR);
    pools
}

/// GPU classes a generated fleet cycles through (`simulate --gpu-classes N` takes the first N).
pub const GPU_CLASSES: [&str; 8] = ["a100-40g", "a100-80g", "h100", "h200", "l4", "l40s", "b200", "mi300x"];

/// A fleet of `pools` pools (0: the default five) built from the default five's shapes (kind, provider, region,
/// scheduler) in turn, named `<shape>-<i>`, each with one GPU class: with `gpu_classes` > 0, pool `i` gets
/// class `i % gpu_classes` of [`GPU_CLASSES`]; with 0, its shape's own. Arrivals are shared out evenly within
/// each shape. Capacity is sized for `jobs_per_hour` ([`size_for_rate`]). Names are leaked once per process (a
/// simulation builds its fleet once).
pub fn fleet(pools: usize, gpu_classes: usize, jobs_per_hour: f64) -> Vec<Pool> {
    let base = default_pools();
    if pools == 0 && gpu_classes == 0 {
        let mut base = base;
        size_for_rate(&mut base, jobs_per_hour);
        return base;
    }
    let n = if pools == 0 { base.len() } else { pools };
    let per_shape = |k: usize| (0..n).filter(|i| i % base.len() == k).count().max(1) as f64;
    let mut out = (0..n)
        .map(|i| {
            let shape = &base[i % base.len()];
            let name: &'static str =
                if pools == 0 { shape.name } else { Box::leak(format!("{}-{i:02}", shape.name).into_boxed_str()) };
            Pool {
                name,
                gpu_class: if gpu_classes == 0 {
                    shape.gpu_class
                } else {
                    GPU_CLASSES[i % gpu_classes.min(GPU_CLASSES.len())]
                },
                share: shape.share / per_shape(i % base.len()),
                ..shape.clone()
            }
        })
        .collect::<Vec<_>>();
    // Fewer pools than shapes: the shares still add up to 1.
    let total: f64 = out.iter().map(|p| p.share).sum();
    for p in &mut out {
        p.share /= total;
    }
    size_for_rate(&mut out, jobs_per_hour);
    out
}

/// Relative arrival intensity by UTC hour: quiet nights, a working-day peak.
pub fn load_at_hour(hour: f64) -> f64 {
    0.35 + 0.65 * (0.5 - 0.5 * ((hour - 3.0) / 24.0 * 2.0 * std::f64::consts::PI).cos())
}

/// The UTC hour of day (fractional) of `ms`.
pub fn hour_of(ms: i64) -> f64 {
    (ms.rem_euclid(86_400_000)) as f64 / 3_600_000.0
}

/// Whether a pool's jobs report their own first step from the training loop: every dedicated job (its node
/// agent), and managed ones except on Vertex AI, whose simulated jobs run no reporting library (the adapter's
/// container start is all that is known of their start).
pub fn trainer_reports(pool: &Pool) -> bool {
    pool.kind == pb::PoolKind::Dedicated || pool.provider != "vertex"
}

/// Teams jobs belong to; on dedicated pools each holds at most [`Pool::team_limit`] GPUs at once.
pub const TEAMS: [&str; 4] = ["nlp", "vision", "speech", "safety"];

/// GPU counts jobs ask for (drawn uniformly): one node or less, or whole nodes.
pub const JOB_GPUS: [u32; 10] = [1, 1, 2, 4, 4, 8, 8, 8, 16, 32];

const MIN: f64 = 60_000.0;

/// What an arriving job asks for and how its work goes, drawn from the job's own random stream.
#[derive(Debug, Clone)]
pub struct JobSpec {
    /// Index of its pool in the fleet.
    pub pool: usize,
    /// Urgent (else normal).
    pub urgent: bool,
    /// GPUs (a multiple of [`GPUS_PER_NODE`] when more than one node).
    pub gpus: u32,
    /// Owning team (one of [`TEAMS`]).
    pub team: usize,
    /// Project.
    pub project: String,
    /// Training time the job needs (ms), after preparation.
    pub work_ms: i64,
    /// The time limit of a run (ms), from its start: what the user asked the scheduler for, usually well above
    /// the need, now and then below it (the run times out).
    pub limit_ms: i64,
    /// The adapter's poll delay before it first sees the job waiting (ms).
    pub poll_ms: i64,
    /// The user cancels the job if it has not started this long after its submit.
    pub cancel_after_ms: Option<i64>,
    /// How the job ends once its work is done: succeeded, or failed (`loss became nan`).
    pub fails_at_end: bool,
}

impl JobSpec {
    /// Nodes the job runs on.
    pub fn node_count(&self) -> u32 {
        self.gpus.div_ceil(GPUS_PER_NODE).max(1)
    }
}

/// Draws a job: its pool by share, its priority (12% urgent), size, team, work and time limit.
pub fn draw_job(r: &mut Rng, pools: &[Pool]) -> JobSpec {
    let x = r.f64();
    let mut acc = 0.0;
    let pool = pools
        .iter()
        .position(|p| {
            acc += p.share;
            x < acc
        })
        .unwrap_or(pools.len().saturating_sub(1));
    let urgent = r.chance(0.12);
    let gpus = *r.pick(&JOB_GPUS);
    let team = (r.next_u64() % TEAMS.len() as u64) as usize;
    let project = format!("{}-{}", TEAMS[team], r.next_u64() % 5);
    let work = r.lognormal(50.0 * MIN, 0.8).clamp(5.0 * MIN, 24.0 * 60.0 * MIN);
    // Limits are asked for in half hours, with room for preparation; 3% are set too short.
    let asked = if r.chance(0.03) { work * r.uniform(0.5, 0.9) } else { work * r.uniform(1.2, 2.5) + 15.0 * MIN };
    let limit = ((asked / (30.0 * MIN)).ceil().max(1.0) * 30.0 * MIN) as i64;
    JobSpec {
        pool,
        urgent,
        gpus,
        team,
        project,
        work_ms: work as i64,
        limit_ms: limit,
        poll_ms: (r.uniform(1.0, 20.0) * 1000.0) as i64,
        cancel_after_ms: r.chance(0.03).then(|| r.lognormal(20.0 * MIN, 1.0) as i64),
        fails_at_end: r.chance(0.07),
    }
}
