//! The compact, in-memory form of one lifecycle event: what the timeline needs, without the free text. The full
//! event stays in the store's log and is fetched by `seq` when a user asks for raw events.

use serde::{Deserialize, Serialize};
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_proto::time::timestamp_to_ms;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The job's attributes, from its `submitted` event.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct JobAttrs {
    /// Managed endpoint or dedicated pool.
    pub pool_kind: pb::PoolKind,
    /// Scheduler or provider name, e.g. `slurm`.
    pub provider: String,
    /// Pool name.
    pub pool: String,
    /// Start objective class.
    pub priority: pb::PriorityClass,
    /// Accelerator class; may be empty.
    pub gpu_class: String,
    /// Accelerators requested.
    pub gpu_count: u32,
    /// Nodes requested.
    pub node_count: u32,
    /// Region or site.
    pub region: String,
    /// Owning team.
    pub team: String,
    /// Project.
    pub project: String,
    /// Chain id, if the job is a stage of one.
    pub chain_id: String,
    /// Stage within the chain.
    pub chain_stage: String,
    /// Extra labels (stored and shown, never exported as metric labels).
    pub labels: BTreeMap<String, String>,
}

impl JobAttrs {
    /// Placeholder attributes (every name `unknown`), shown when stored attributes cannot be read.
    pub fn unknown() -> JobAttrs {
        let u = || "unknown".to_string();
        JobAttrs {
            pool_kind: pb::PoolKind::default(),
            provider: u(),
            pool: u(),
            priority: pb::PriorityClass::default(),
            gpu_class: String::new(),
            gpu_count: 0,
            node_count: 0,
            region: String::new(),
            team: u(),
            project: String::new(),
            chain_id: String::new(),
            chain_stage: String::new(),
            labels: BTreeMap::new(),
        }
    }
}

/// What happened, reduced to what the timeline uses.
///
/// Stored in snapshot parts with postcard, which writes a variant as its index and its fields in order: a first
/// step from an unspecified origin is written as before origins existed (variant 4, its step), one with an origin
/// as variant 11, `FirstStepFrom` (see [`Stored`]), so parts written by older collectors read back unchanged and
/// their first steps as unspecified.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "Stored")]
pub enum EventKind {
    /// The job was accepted, with its attributes (shared with the timeline, not copied).
    Submitted(Arc<JobAttrs>),
    /// The job waits for a reason; the provider's raw reason is kept for display and alerts, and the scheduler's
    /// estimated start (Unix ms) when it gave one.
    Queued { reason: pb::WaitReason, raw_reason: Arc<str>, estimated_start: Option<i64> },
    /// Nodes were assigned (their names, possibly none).
    NodeAssigned { nodes: Arc<[Arc<str>]> },
    /// A preparation phase started.
    Preparing { phase: pb::PreparingPhase },
    /// The first training step of a run completed, as observed from `origin` (the training process, a container
    /// or scheduler start, or unspecified by an older source); see [`super::timeline`] for how origins combine.
    FirstStep { step: u64, origin: pb::StepOrigin },
    /// A checkpoint holding `step` was written, taking `save_ms` (from `save_seconds`, 0 when not reported).
    Checkpoint { step: u64, save_ms: u32 },
    /// The job was preempted; `checkpoint_saved` says whether it saved first.
    Preempted { checkpoint_saved: bool },
    /// The job went back to its queue, resuming from `resume_step`.
    Requeued { resume_step: u64 },
    /// The job restarted in place, resuming from `resume_step`.
    Restarted { resume_step: u64 },
    /// A node of the job was lost (its name; empty when the source did not say).
    NodeLost { node: Arc<str> },
    /// The job ended.
    Done { outcome: pb::Outcome, exit_code: Option<i32> },
}

impl EventKind {
    /// Lifecycle order, used to break ties between events with the same timestamp.
    pub fn rank(&self) -> u8 {
        match self {
            EventKind::Submitted(_) => 0,
            EventKind::Queued { .. } => 1,
            EventKind::NodeAssigned { .. } => 2,
            EventKind::Preparing { .. } => 3,
            EventKind::FirstStep { .. } => 4,
            EventKind::Checkpoint { .. } => 5,
            EventKind::Preempted { .. } => 6,
            EventKind::NodeLost { .. } => 7,
            EventKind::Requeued { .. } => 8,
            EventKind::Restarted { .. } => 9,
            EventKind::Done { .. } => 10,
        }
    }

    /// Whether this kind ends a run, or marks a job that is not running (`queued`, `preempted`, `node_lost`,
    /// `requeued`, `restarted`, `done`): a first step after it belongs to another run, so it cannot supersede a
    /// first step before it.
    pub fn ends_run(&self) -> bool {
        matches!(
            self,
            EventKind::Queued { .. }
                | EventKind::Preempted { .. }
                | EventKind::NodeLost { .. }
                | EventKind::Requeued { .. }
                | EventKind::Restarted { .. }
                | EventKind::Done { .. }
        )
    }

    /// The kind's name as in the protocol's oneof, e.g. `first_step`.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::Submitted(_) => "submitted",
            EventKind::Queued { .. } => "queued",
            EventKind::NodeAssigned { .. } => "node_assigned",
            EventKind::Preparing { .. } => "preparing",
            EventKind::FirstStep { .. } => "first_step",
            EventKind::Checkpoint { .. } => "checkpoint",
            EventKind::Preempted { .. } => "preempted",
            EventKind::NodeLost { .. } => "node_lost",
            EventKind::Requeued { .. } => "requeued",
            EventKind::Restarted { .. } => "restarted",
            EventKind::Done { .. } => "done",
        }
    }
}

/// One event as a job record keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactEvent {
    /// When it happened (Unix ms, source clock).
    pub at_ms: i64,
    /// Hash of the event id (see [`super::event_id_hash`]).
    pub id_hash: u64,
    /// Position of the full event in the store's log.
    pub seq: u64,
    /// The attempt it concerns, if the source said.
    pub attempt: Option<u32>,
    /// What happened.
    pub kind: EventKind,
}

impl CompactEvent {
    /// The key events are sorted by: time, then lifecycle order, then id hash (a total, arrival-independent order).
    pub fn sort_key(&self) -> (i64, u8, u64) {
        (self.at_ms, self.kind.rank(), self.id_hash)
    }

    /// Builds the compact form of a validated protocol event. Returns `None` if the event has no kind (validation
    /// rejects those first).
    pub fn from_pb(ev: &pb::LifecycleEvent, seq: u64) -> Option<Self> {
        let kind = match ev.kind.as_ref()? {
            Kind::Submitted(s) => EventKind::Submitted(Arc::new(JobAttrs {
                pool_kind: s.pool_kind(),
                provider: s.provider.clone(),
                pool: s.pool.clone(),
                priority: s.priority(),
                gpu_class: s.gpu_class.clone(),
                gpu_count: s.gpu_count,
                node_count: s.node_count,
                region: s.region.clone(),
                team: s.team.clone(),
                project: s.project.clone(),
                chain_id: s.chain_id.clone(),
                chain_stage: s.chain_stage.clone(),
                labels: s.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            })),
            Kind::Queued(q) => EventKind::Queued {
                reason: q.reason(),
                raw_reason: Arc::from(q.raw_reason.as_str()),
                estimated_start: q.estimated_start.as_ref().map(timestamp_to_ms),
            },
            Kind::NodeAssigned(n) => {
                EventKind::NodeAssigned { nodes: n.nodes.iter().map(|s| Arc::from(s.as_str())).collect() }
            }
            Kind::Preparing(p) => EventKind::Preparing { phase: p.phase() },
            Kind::FirstStep(f) => EventKind::FirstStep { step: f.step, origin: f.origin() },
            Kind::Checkpoint(c) => EventKind::Checkpoint {
                step: c.step,
                // Validated finite and not negative; saturates at ~49 days.
                save_ms: (c.save_seconds * 1000.0).round().clamp(0.0, f64::from(u32::MAX)) as u32,
            },
            Kind::Preempted(p) => EventKind::Preempted { checkpoint_saved: p.checkpoint_saved },
            Kind::Requeued(r) => EventKind::Requeued { resume_step: r.resume_step },
            Kind::Restarted(r) => EventKind::Restarted { resume_step: r.resume_step },
            Kind::NodeLost(n) => EventKind::NodeLost { node: Arc::from(n.node.as_str()) },
            Kind::Done(d) => EventKind::Done { outcome: d.outcome(), exit_code: d.exit_code },
        };
        Some(CompactEvent {
            at_ms: ev.occurred_at.as_ref().map(timestamp_to_ms)?,
            id_hash: super::event_id_hash(&ev.event_id),
            seq,
            attempt: ev.attempt,
            kind,
        })
    }
}

/// How strongly a first step's origin says training began: a first step is superseded by a later one of a higher
/// strength in the same run. The training process is the truth; an unspecified origin (older sources) is read as
/// a first step, as it always was, but yields to the training process; a container or scheduler start yields to
/// both.
pub fn origin_strength(origin: pb::StepOrigin) -> u8 {
    match origin {
        pb::StepOrigin::TrainingProcess => 2,
        pb::StepOrigin::Unspecified => 1,
        pb::StepOrigin::ContainerStart | pb::StepOrigin::SchedulerStart => 0,
    }
}

/// [`EventKind`] as postcard stores it (see there): the variants before origins existed, in their order, then
/// first steps with an origin.
#[derive(Serialize, Deserialize)]
#[serde(rename = "EventKind")]
enum Stored {
    Submitted(Arc<JobAttrs>),
    Queued { reason: pb::WaitReason, raw_reason: Arc<str>, estimated_start: Option<i64> },
    NodeAssigned { nodes: Arc<[Arc<str>]> },
    Preparing { phase: pb::PreparingPhase },
    FirstStep { step: u64 },
    Checkpoint { step: u64, save_ms: u32 },
    Preempted { checkpoint_saved: bool },
    Requeued { resume_step: u64 },
    Restarted { resume_step: u64 },
    NodeLost { node: Arc<str> },
    Done { outcome: pb::Outcome, exit_code: Option<i32> },
    FirstStepFrom { step: u64, origin: pb::StepOrigin },
}

/// [`Stored`] by reference, for writing without cloning.
#[derive(Serialize)]
#[serde(rename = "EventKind")]
enum StoredRef<'a> {
    Submitted(&'a Arc<JobAttrs>),
    Queued { reason: &'a pb::WaitReason, raw_reason: &'a Arc<str>, estimated_start: &'a Option<i64> },
    NodeAssigned { nodes: &'a Arc<[Arc<str>]> },
    Preparing { phase: &'a pb::PreparingPhase },
    FirstStep { step: &'a u64 },
    Checkpoint { step: &'a u64, save_ms: &'a u32 },
    Preempted { checkpoint_saved: &'a bool },
    Requeued { resume_step: &'a u64 },
    Restarted { resume_step: &'a u64 },
    NodeLost { node: &'a Arc<str> },
    Done { outcome: &'a pb::Outcome, exit_code: &'a Option<i32> },
    FirstStepFrom { step: &'a u64, origin: &'a pb::StepOrigin },
}

impl From<Stored> for EventKind {
    fn from(s: Stored) -> EventKind {
        match s {
            Stored::Submitted(a) => EventKind::Submitted(a),
            Stored::Queued { reason, raw_reason, estimated_start } => {
                EventKind::Queued { reason, raw_reason, estimated_start }
            }
            Stored::NodeAssigned { nodes } => EventKind::NodeAssigned { nodes },
            Stored::Preparing { phase } => EventKind::Preparing { phase },
            Stored::FirstStep { step } => EventKind::FirstStep { step, origin: pb::StepOrigin::Unspecified },
            Stored::Checkpoint { step, save_ms } => EventKind::Checkpoint { step, save_ms },
            Stored::Preempted { checkpoint_saved } => EventKind::Preempted { checkpoint_saved },
            Stored::Requeued { resume_step } => EventKind::Requeued { resume_step },
            Stored::Restarted { resume_step } => EventKind::Restarted { resume_step },
            Stored::NodeLost { node } => EventKind::NodeLost { node },
            Stored::Done { outcome, exit_code } => EventKind::Done { outcome, exit_code },
            Stored::FirstStepFrom { step, origin } => EventKind::FirstStep { step, origin },
        }
    }
}

impl Serialize for EventKind {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let r = match self {
            EventKind::Submitted(a) => StoredRef::Submitted(a),
            EventKind::Queued { reason, raw_reason, estimated_start } => {
                StoredRef::Queued { reason, raw_reason, estimated_start }
            }
            EventKind::NodeAssigned { nodes } => StoredRef::NodeAssigned { nodes },
            EventKind::Preparing { phase } => StoredRef::Preparing { phase },
            EventKind::FirstStep { step, origin: pb::StepOrigin::Unspecified } => StoredRef::FirstStep { step },
            EventKind::FirstStep { step, origin } => StoredRef::FirstStepFrom { step, origin },
            EventKind::Checkpoint { step, save_ms } => StoredRef::Checkpoint { step, save_ms },
            EventKind::Preempted { checkpoint_saved } => StoredRef::Preempted { checkpoint_saved },
            EventKind::Requeued { resume_step } => StoredRef::Requeued { resume_step },
            EventKind::Restarted { resume_step } => StoredRef::Restarted { resume_step },
            EventKind::NodeLost { node } => StoredRef::NodeLost { node },
            EventKind::Done { outcome, exit_code } => StoredRef::Done { outcome, exit_code },
        };
        r.serialize(ser)
    }
}
