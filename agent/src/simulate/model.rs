//! The fleet model: which jobs arrive when, and what happens to each. Pure: given a seed, a job index and its
//! submit time, a job's whole event list is determined, so simulations replay exactly.
//!
//! Two pool kinds with different wait shapes:
//! - **dedicated** (Slurm): waits on priority and capacity that grow with the time-of-day load, short
//!   preparation (images cached), occasional quota waits and node losses;
//! - **managed** (SageMaker, Vertex AI): capacity waits with a heavy (Pareto) tail, then provisioning, image
//!   download and data staging every time; spot preemptions, with or without a checkpoint saved first.
//!
//! Urgent jobs behave as on a well-run platform: on dedicated pools they preempt normal work (a short priority
//! wait, then the preempted job's nodes), on managed endpoints they use reserved warm capacity (no Pareto capacity
//! tail, no provisioning, a cached image). Normal dedicated runs are now and then preempted for urgent work.
//! During a pool's `crunches` (the simulator scripts one hour three days before the end of its history and the
//! hour around its end, on H100 pools) every job of the pool, urgent ones included, waits
//! 20-60 minutes for capacity: the scripted bad hour that breaks the urgent-start SLO and pages.
//!
//! Dedicated pools have a fixed set of nodes (`<pool>-node-NNN`; a job gets one node per 8 GPUs); managed jobs
//! get fresh instances. One node of the `a100` shape, [`FAILING_NODE`], has GPUs whose correctable ECC errors
//! climb ([`failing_node_ecc`]) and loses or fails far more of its jobs than its pool: the suspect node of the
//! demo. Some jobs are cancelled or fail before they start; runs write checkpoints every 15-20 minutes and end
//! succeeded, failed or timed out.
//!
//! First steps: the managed adapter reports each run's container start (a `first_step` of origin
//! `container_start`, where the environment phase begins); the SageMaker jobs' training loop reports its own first
//! step (origin `training_process`), which supersedes it, the Vertex AI jobs' does not ([`trainer_reports`]), so
//! their first steps are container starts and the managed-vs-dedicated comparison flags the difference. On
//! dedicated pools the node agent reports the training loop's first step.

use crate::rng::Rng;
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_proto::time::ms_to_timestamp;

/// One pool of the simulated fleet.
#[derive(Debug, Clone)]
pub struct Pool {
    /// Managed or dedicated.
    pub kind: pb::PoolKind,
    /// Provider name.
    pub provider: &'static str,
    /// Pool name.
    pub name: &'static str,
    /// Region or site.
    pub region: &'static str,
    /// Accelerator class.
    pub gpu_class: &'static str,
    /// Share of arriving jobs sent here.
    pub share: f64,
    /// Nodes of a dedicated pool (8 GPUs each; 0 for managed pools, whose instances are fresh each time).
    pub nodes: u32,
    /// The node (its number) whose GPUs are failing, if any.
    pub failing_node: Option<u32>,
    /// Capacity crunches `[from, to)` (Unix ms): jobs submitted in one wait 20-60 minutes more for capacity.
    pub crunches: Vec<(i64, i64)>,
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

/// The default fleet: two managed endpoints and two dedicated Slurm partitions.
pub fn default_pools() -> Vec<Pool> {
    vec![
        Pool {
            kind: pb::PoolKind::Managed,
            provider: "sagemaker",
            name: "sm-p4d",
            region: "us-east-1",
            gpu_class: "a100-40g",
            share: 0.30,
            nodes: 0,
            failing_node: None,
            crunches: Vec::new(),
        },
        Pool {
            kind: pb::PoolKind::Managed,
            provider: "vertex",
            name: "vertex-a3",
            region: "europe-west4",
            gpu_class: "h100",
            share: 0.20,
            nodes: 0,
            failing_node: None,
            crunches: Vec::new(),
        },
        Pool {
            kind: pb::PoolKind::Dedicated,
            provider: "slurm",
            name: "a100",
            region: "dc-east",
            gpu_class: "a100-80g",
            share: 0.30,
            nodes: 32,
            failing_node: Some(13),
            crunches: Vec::new(),
        },
        Pool {
            kind: pb::PoolKind::Dedicated,
            provider: "slurm",
            name: "h100",
            region: "dc-east",
            gpu_class: "h100",
            share: 0.20,
            nodes: 16,
            failing_node: None,
            crunches: Vec::new(),
        },
    ]
}

/// GPU classes a generated fleet cycles through (`simulate --gpu-classes N` takes the first N).
pub const GPU_CLASSES: [&str; 8] = ["a100-40g", "a100-80g", "h100", "h200", "l4", "l40s", "b200", "mi300x"];

/// A fleet of `pools` pools (0: the default four) built from the default four's shapes (kind, provider, region,
/// wait behaviour) in turn, named `<shape>-<i>`, each with one GPU class: with `gpu_classes` > 0, pool `i` gets
/// class `i % gpu_classes` of [`GPU_CLASSES`]; with 0, its shape's own. Arrivals are shared out evenly within
/// each shape. Names are leaked once per process (a simulation builds its fleet once).
pub fn fleet(pools: usize, gpu_classes: usize) -> Vec<Pool> {
    let base = default_pools();
    if pools == 0 && gpu_classes == 0 {
        return base;
    }
    let n = if pools == 0 { base.len() } else { pools };
    let per_shape = |k: usize| (0..n).filter(|i| i % base.len() == k).count().max(1) as f64;
    (0..n)
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
        .collect()
}

/// Relative arrival intensity by UTC hour: quiet nights, a working-day peak.
pub fn load_at_hour(hour: f64) -> f64 {
    0.35 + 0.65 * (0.5 - 0.5 * ((hour - 3.0) / 24.0 * 2.0 * std::f64::consts::PI).cos())
}

fn hour_of(ms: i64) -> f64 {
    (ms.rem_euclid(86_400_000)) as f64 / 3_600_000.0
}

const MIN: f64 = 60_000.0;

/// Builds a job's events from its index and submit time. Events are returned in time order; `n` in each event
/// id counts up from 0 so ids are stable across runs.
pub fn job_events(seed: u64, idx: u64, submit_ms: i64, pools: &[Pool]) -> Vec<pb::LifecycleEvent> {
    let mut r = Rng::derive(seed, idx);
    let mut b =
        Builder { seed, idx, job_id: String::new(), events: Vec::new(), source: "", attempt: None, nodes: Vec::new() };

    let x = r.f64();
    let mut acc = 0.0;
    let pool = pools
        .iter()
        .find(|p| {
            acc += p.share;
            x < acc
        })
        .unwrap_or(&pools[pools.len() - 1]);
    let urgent = r.chance(0.12);
    let gpus = *r.pick(&[1u32, 2, 4, 8, 8, 8, 16, 32, 64]);
    let managed = pool.kind == pb::PoolKind::Managed;
    b.job_id = format!("{}/{}/{idx:07}", pool.provider, pool.name);
    b.source = if managed { "sim/managed-adapter" } else { "sim/slurm-adapter" };
    let team = *r.pick(&["nlp", "vision", "speech", "safety"]);
    b.push(
        submit_ms,
        Kind::Submitted(pb::Submitted {
            pool_kind: pool.kind as i32,
            provider: pool.provider.into(),
            pool: pool.name.into(),
            priority: if urgent { pb::PriorityClass::Urgent } else { pb::PriorityClass::Normal } as i32,
            gpu_class: pool.gpu_class.into(),
            gpu_count: gpus,
            node_count: gpus.div_ceil(8),
            region: pool.region.into(),
            team: team.into(),
            project: format!("{team}-{}", r.next_u64() % 5),
            chain_id: String::new(),
            chain_stage: "train".into(),
            labels: Default::default(),
        }),
    );

    let load = load_at_hour(hour_of(submit_ms));
    let size = (f64::from(gpus) / 8.0).max(0.25).sqrt();
    let mut t = submit_ms as f64;
    let queued = |b: &mut Builder, t: f64, reason: pb::WaitReason, raw: &str| {
        b.push(
            t as i64,
            Kind::Queued(pb::Queued {
                reason: reason as i32,
                raw_reason: raw.into(),
                message: String::new(),
                estimated_start: None,
                queue_position: None,
            }),
        )
    };

    // The initial wait.
    t += r.uniform(1.0, 20.0) * 1000.0; // adapter poll delay before the first reason is seen
    let crunch = pool.crunches.iter().any(|(from, to)| (*from..*to).contains(&submit_ms));
    if managed {
        queued(
            &mut b,
            t,
            pb::WaitReason::Capacity,
            if pool.provider == "sagemaker" { "Pending" } else { "JOB_STATE_QUEUED" },
        );
        t += if urgent {
            // Reserved warm capacity.
            r.lognormal(0.6 * MIN, 0.6)
        } else if r.chance(0.2) {
            r.pareto(10.0 * MIN, 1.3) * load * 1.3
        } else {
            r.lognormal(2.0 * MIN, 0.8) * load * 1.3
        };
    } else {
        if !urgent && r.chance(0.06) {
            queued(&mut b, t, pb::WaitReason::Quota, "QOSGrpGRES");
            t += r.lognormal(25.0 * MIN, 0.9);
        }
        queued(&mut b, t, pb::WaitReason::Priority, "Priority");
        t += if urgent { r.lognormal(0.2 * MIN, 0.6) } else { r.lognormal(8.0 * MIN, 1.0) * load * 1.5 };
        queued(&mut b, t, pb::WaitReason::Capacity, "Resources");
        // Urgent work preempts normal jobs: it waits for their checkpoint-and-exit, not for the queue to drain.
        t += if urgent { r.lognormal(1.0 * MIN, 0.5) } else { r.lognormal(12.0 * MIN, 1.1) * load * size };
    }
    if crunch {
        queued(&mut b, t, pb::WaitReason::Capacity, "capacity crunch: no H100 available");
        t += r.uniform(20.0, 60.0) * MIN;
    }
    // Some jobs never start: cancelled while waiting, or misconfigured.
    if r.chance(0.03) {
        b.push(
            t as i64,
            Kind::Done(pb::Done {
                outcome: pb::Outcome::Cancelled as i32,
                exit_code: None,
                message: "cancelled by user".into(),
            }),
        );
        return b.events;
    }
    b.source = if managed { "sim/managed-adapter" } else { "sim/node-agent" };
    let mut on_failing = assign(&mut b, &mut r, t, pool, gpus);
    t = prepare(&mut b, &mut r, t, managed, urgent);
    // A broken build fails at start now and then; urgent work (usually a re-run of known-good code) rarely.
    if r.chance(if on_failing {
        0.2
    } else if urgent {
        0.002
    } else {
        0.01
    }) {
        let message = if on_failing {
            "CUDA error: uncorrectable ECC error encountered"
        } else {
            "CUDA error: no kernel image is available"
        };
        b.push(
            t as i64,
            Kind::Done(pb::Done { outcome: pb::Outcome::Failed as i32, exit_code: Some(1), message: message.into() }),
        );
        return b.events;
    }

    // Runs, with preemptions and node losses sending the job back to waiting.
    let mut step: u64 = 0;
    let total_run = r.lognormal(180.0 * MIN, 0.7);
    let mut remaining = total_run;
    let mut attempt = 1u32;
    loop {
        b.attempt = Some(attempt);
        if trainer_reports(pool) {
            let adapter = std::mem::replace(&mut b.source, "sim/training-process");
            b.push(
                t as i64,
                Kind::FirstStep(pb::FirstStep { step: step + 1, origin: pb::StepOrigin::TrainingProcess as i32 }),
            );
            b.source = adapter;
        }
        // Spot capacity on managed endpoints is reclaimed far more often than dedicated nodes fail; normal
        // dedicated work is sometimes preempted for urgent jobs; the failing node loses a third of its runs.
        let interrupt_p = if on_failing {
            0.35
        } else if managed {
            0.12
        } else if urgent {
            0.03
        } else {
            0.06
        };
        let interrupt_at = r.chance(interrupt_p).then(|| r.uniform(0.05, 0.95) * remaining);
        let run_for = interrupt_at.unwrap_or(remaining);
        let interval = r.uniform(15.0, 20.0) * MIN;
        let mut since = 0.0;
        let mut ckpt_step = step;
        while since + interval < run_for {
            since += interval;
            ckpt_step = step + (since / 1000.0) as u64;
            b.push(
                (t + since) as i64,
                Kind::Checkpoint(pb::Checkpoint {
                    step: ckpt_step,
                    uri: format!("s3://ckpt/{}/{ckpt_step}", b.idx),
                    save_seconds: r.uniform(20.0, 90.0),
                }),
            );
        }
        t += run_for;
        step += (run_for / 1000.0) as u64;
        remaining -= run_for;
        if interrupt_at.is_none() {
            break;
        }
        let lost_node = b.nodes.first().cloned().filter(|_| !managed && (on_failing || r.chance(0.5)));
        if let Some(node) = lost_node {
            b.push(t as i64, Kind::NodeLost(pb::NodeLost { node, message: "node not responding".into() }));
        } else {
            let saved = r.chance(0.5);
            let reason = if managed { "spot-interruption" } else { "priority" };
            b.push(t as i64, Kind::Preempted(pb::Preempted { reason: reason.into(), checkpoint_saved: saved }));
            if saved {
                ckpt_step = step;
            }
        }
        // Resume from the last checkpoint: work since then is redone.
        remaining += (step - ckpt_step) as f64 * 1000.0;
        step = ckpt_step;
        attempt += 1;
        b.attempt = Some(attempt);
        t += r.uniform(5.0, 30.0) * 1000.0;
        b.push(t as i64, Kind::Requeued(pb::Requeued { resume_step: step }));
        queued(&mut b, t + 1000.0, pb::WaitReason::PreemptionRecovery, "requeued");
        t += r.lognormal(6.0 * MIN, 0.9) * load;
        on_failing = assign(&mut b, &mut r, t, pool, gpus);
        t = prepare(&mut b, &mut r, t, managed, urgent);
    }
    let (outcome, code, msg) = match r.f64() {
        x if x < 0.90 => (pb::Outcome::Succeeded, Some(0), ""),
        x if x < 0.97 => (pb::Outcome::Failed, Some(1), "loss became nan"),
        _ => (pb::Outcome::TimedOut, None, "time limit reached"),
    };
    b.push(t as i64, Kind::Done(pb::Done { outcome: outcome as i32, exit_code: code, message: msg.into() }));
    b.events
}

/// Places the job: one node per 8 GPUs, distinct nodes of a dedicated pool, fresh instances of a managed one.
/// Returns whether the failing node is among them.
fn assign(b: &mut Builder, r: &mut Rng, t: f64, pool: &Pool, gpus: u32) -> bool {
    let want = gpus.div_ceil(8).max(1);
    let mut nodes: Vec<u32> = Vec::new();
    let names: Vec<String> = if pool.nodes == 0 {
        (0..want).map(|_| format!("{}-i-{:08x}", pool.name, r.next_u64() as u32)).collect()
    } else {
        let want = want.min(pool.nodes);
        while (nodes.len() as u32) < want {
            let n = (r.next_u64() % u64::from(pool.nodes)) as u32;
            if !nodes.contains(&n) {
                nodes.push(n);
            }
        }
        nodes.iter().map(|n| node_name(pool.name, *n)).collect()
    };
    let failing = pool.failing_node.is_some_and(|f| nodes.contains(&f));
    // The failing node reports losses under its own name.
    if failing {
        if let Some(f) = pool.failing_node {
            b.nodes = vec![node_name(pool.name, f)];
        }
    } else {
        b.nodes = names.clone();
    }
    b.push(t as i64, Kind::NodeAssigned(pb::NodeAssigned { nodes: names, gpu_ids: vec![] }));
    failing
}

fn prepare(b: &mut Builder, r: &mut Rng, mut t: f64, managed: bool, urgent: bool) -> f64 {
    let phase = |b: &mut Builder, t: f64, p: pb::PreparingPhase| {
        b.push(t as i64, Kind::Preparing(pb::Preparing { phase: p as i32, message: String::new() }))
    };
    if managed && urgent {
        // A warm instance from the reserved pool with the image cached: staging only.
        phase(b, t, pb::PreparingPhase::DataStaging);
        t += r.lognormal(1.2 * MIN, 0.6);
    } else if managed {
        phase(b, t, pb::PreparingPhase::Provisioning);
        t += r.lognormal(4.0 * MIN, 0.4);
        phase(b, t, pb::PreparingPhase::ImagePull);
        t += r.lognormal(3.0 * MIN, 0.5);
        phase(b, t, pb::PreparingPhase::DataStaging);
        t += r.lognormal(2.5 * MIN, 0.8);
    } else {
        // Urgent work runs from images and datasets kept warm on the nodes.
        if r.chance(if urgent { 0.03 } else { 0.15 }) {
            phase(b, t, pb::PreparingPhase::ImagePull);
            t += r.lognormal(2.0 * MIN, 0.6);
        }
        phase(b, t, pb::PreparingPhase::DataStaging);
        t += if urgent { r.lognormal(0.5 * MIN, 0.5) } else { r.lognormal(1.0 * MIN, 0.8) };
    }
    if managed {
        // The adapter sees the container start; the environment phase inside it is the training loop's to report.
        b.push(t as i64, Kind::FirstStep(pb::FirstStep { step: 0, origin: pb::StepOrigin::ContainerStart as i32 }));
    } else {
        phase(b, t, pb::PreparingPhase::Environment);
    }
    t + if urgent { r.lognormal(0.5 * MIN, 0.4) } else { r.lognormal(0.75 * MIN, 0.5) }
}

/// Whether a pool's jobs report their own first step from the training loop: every dedicated job (its node
/// agent), and managed ones except on Vertex AI, whose simulated jobs run no reporting library (the adapter's
/// container start is all that is known of their start).
pub fn trainer_reports(pool: &Pool) -> bool {
    pool.kind == pb::PoolKind::Dedicated || pool.provider != "vertex"
}

struct Builder {
    seed: u64,
    idx: u64,
    job_id: String,
    source: &'static str,
    attempt: Option<u32>,
    events: Vec<pb::LifecycleEvent>,
    /// The nodes of the current placement (the failing one alone when it is among them).
    nodes: Vec<String>,
}

impl Builder {
    fn push(&mut self, at: i64, kind: Kind) {
        let n = self.events.len();
        let attempt = self.attempt;
        self.events.push(pb::LifecycleEvent {
            event_id: format!("sim-{:x}-{}-{n}", self.seed, self.idx),
            job_id: self.job_id.clone(),
            attempt,
            source: self.source.into(),
            occurred_at: Some(ms_to_timestamp(at)),
            kind: Some(kind),
        });
    }
}
