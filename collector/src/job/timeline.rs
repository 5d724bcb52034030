//! The timeline of one job, derived by folding its events in canonical order.
//!
//! Rules (also in the docs: docs/concepts.md, "Timeline rules"):
//! - The first `submitted` (by time, then id) gives the attributes and the start of the wait. Events stamped
//!   before it (clock skew between sources) count as happening at submit time. A later `submitted` updates the
//!   attributes with each one it sets (`super::update`), unless it comes after `done`.
//! - The wait before the first step is split into segments: `unreported` (submitted, no reason yet),
//!   `queued:<reason>`, `assigned` (nodes assigned, no phase reported), `preparing:<phase>`. Their durations add
//!   up to the time to first step, or to the time until the job ended if it never started.
//! - A preemption, node loss, requeue or restart while running sends the job back to waiting; work since the
//!   later of the run's start and its last checkpoint is lost unless a checkpoint was saved right before the
//!   preemption. The wait until the next first step counts as requeue wait.
//! - `done` is terminal: events stamped after it do not change the timeline.
//! - A first step carries its origin: the training process, a container start (managed adapters, Kueue), a
//!   scheduler start (Slurm), or unspecified (sources before origins). A first step is *superseded* when a later
//!   one of a stronger origin ([`super::event::origin_strength`]: training process > unspecified > container or
//!   scheduler start) follows it in the same run, i.e. with no event that ends a run
//!   ([`EventKind::ends_run`]) between them in canonical order. A superseded first step is a phase boundary: the
//!   job is `preparing:environment` from it until the first step that supersedes it, and it never starts a run.
//!   So a job whose training process reported its first step gets that as its first step (and time to first
//!   step) whatever order the adapter's container start and the training process's step arrived in, and a job
//!   with only a container start keeps it as its first step, marked by `first_step_origin`.
//! - Each `node_assigned` with node names opens a *placement* (further assignments before it ends add nodes to
//!   it); the placement ends with the run: `preempted`, `node_lost`, `requeued`, `restarted` (which opens a new
//!   placement on the same nodes), `queued` again, or `done` (by outcome). Per-node statistics read these.

use super::event::origin_strength;
use super::{CompactEvent, EventKind, JobAttrs};
use serde::{Deserialize, Serialize};
use startline_proto::pb;
use std::collections::BTreeMap;
use std::num::NonZeroI64;
use std::sync::Arc;

/// Where a job is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Events arrived but no `submitted` yet; kept until it comes.
    #[default]
    Unsubmitted,
    /// Waiting in a queue (including after a preemption).
    Queued,
    /// Nodes assigned, no preparation phase reported yet.
    Assigned,
    /// Preparing on its nodes.
    Preparing,
    /// Training: a first step was seen and the job has not stopped since.
    Running,
    /// Ended.
    Done,
}

impl JobState {
    /// Short lowercase name.
    pub fn label(self) -> &'static str {
        match self {
            JobState::Unsubmitted => "unsubmitted",
            JobState::Queued => "queued",
            JobState::Assigned => "assigned",
            JobState::Preparing => "preparing",
            JobState::Running => "running",
            JobState::Done => "done",
        }
    }

    /// Parses a short name.
    pub fn from_label(s: &str) -> Option<Self> {
        [
            JobState::Unsubmitted,
            JobState::Queued,
            JobState::Assigned,
            JobState::Preparing,
            JobState::Running,
            JobState::Done,
        ]
        .into_iter()
        .find(|st| st.label() == s)
    }

    /// Whether the job is waiting to (re)start training.
    pub fn is_waiting(self) -> bool {
        matches!(self, JobState::Queued | JobState::Assigned | JobState::Preparing)
    }
}

/// A stretch of waiting, by cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Segment {
    /// Submitted, no reason reported yet.
    Unreported,
    /// Queued for a reason.
    Queued(pb::WaitReason),
    /// Nodes assigned, no phase reported yet.
    Assigned,
    /// Preparing, in a phase.
    Preparing(pb::PreparingPhase),
}

impl Segment {
    /// A bounded name such as `queued:capacity` or `preparing:image_pull`.
    pub fn label(self) -> String {
        use startline_proto::labels::Label;
        match self {
            Segment::Unreported => "unreported".to_string(),
            Segment::Queued(r) => format!("queued:{}", r.label()),
            Segment::Assigned => "assigned".to_string(),
            Segment::Preparing(p) => format!("preparing:{}", p.label()),
        }
    }

    fn state(self) -> JobState {
        match self {
            Segment::Unreported | Segment::Queued(_) => JobState::Queued,
            Segment::Assigned => JobState::Assigned,
            Segment::Preparing(_) => JobState::Preparing,
        }
    }
}

/// How a placement ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlacementEnd {
    /// The job is still on these nodes.
    Open,
    /// The job ended successfully here.
    Succeeded,
    /// The job failed here.
    Failed,
    /// The job hit its time limit here.
    TimedOut,
    /// The job was cancelled here.
    Cancelled,
    /// A node was lost (`node_lost`).
    Lost,
    /// The job was preempted (an event, or `done` with outcome preempted).
    Preempted,
    /// The job went back to its queue or restarted in place.
    Requeued,
}

impl PlacementEnd {
    /// Every end, in a fixed order (stored as its index).
    pub const ALL: [PlacementEnd; 8] = [
        PlacementEnd::Open,
        PlacementEnd::Succeeded,
        PlacementEnd::Failed,
        PlacementEnd::TimedOut,
        PlacementEnd::Cancelled,
        PlacementEnd::Lost,
        PlacementEnd::Preempted,
        PlacementEnd::Requeued,
    ];

    /// Short lowercase name.
    pub fn label(self) -> &'static str {
        match self {
            PlacementEnd::Open => "open",
            PlacementEnd::Succeeded => "succeeded",
            PlacementEnd::Failed => "failed",
            PlacementEnd::TimedOut => "timed_out",
            PlacementEnd::Cancelled => "cancelled",
            PlacementEnd::Lost => "lost",
            PlacementEnd::Preempted => "preempted",
            PlacementEnd::Requeued => "requeued",
        }
    }

    fn of_outcome(o: pb::Outcome) -> PlacementEnd {
        match o {
            pb::Outcome::Succeeded => PlacementEnd::Succeeded,
            pb::Outcome::Failed | pb::Outcome::Unspecified => PlacementEnd::Failed,
            pb::Outcome::TimedOut => PlacementEnd::TimedOut,
            pb::Outcome::Cancelled => PlacementEnd::Cancelled,
            pb::Outcome::Preempted => PlacementEnd::Preempted,
        }
    }
}

/// One stay of the job on a set of nodes: from an assignment to the end of the run (or of the job) there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// The nodes, in the order first reported.
    pub nodes: Arc<[Arc<str>]>,
    /// When they were assigned.
    pub assigned_at: i64,
    /// When training reached its first step here, if it did.
    pub first_step_at: Option<i64>,
    /// When it ended, unless open.
    pub ended_at: Option<i64>,
    /// How it ended.
    pub end: PlacementEnd,
    /// For [`PlacementEnd::Lost`]: the node the `node_lost` named, when it is one of `nodes` (else every node
    /// of the placement is counted as lost).
    pub lost_node: Option<Arc<str>>,
}

impl Placement {
    /// Whether `node` is the one blamed for this placement's end (a loss names one node; any other end concerns
    /// every node).
    pub fn blames(&self, node: &str) -> bool {
        self.lost_node.as_deref().is_none_or(|n| n == node)
    }
}

/// Milliseconds per wait segment, in segment order: a map of a few entries kept as a sorted vector, so a reader
/// that refills one timeline per job (a scan over folded jobs) reuses its allocation instead of building a tree
/// per job. Serialized as a map.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SegmentTotals(Vec<(Segment, i64)>);

impl SegmentTotals {
    /// Adds `ms` to a segment's total (a new segment starts at 0).
    pub fn add(&mut self, seg: Segment, ms: i64) {
        match self.0.binary_search_by(|(s, _)| s.cmp(&seg)) {
            Ok(i) => self.0[i].1 += ms,
            Err(i) => self.0.insert(i, (seg, ms)),
        }
    }

    /// Sets a segment's total.
    pub fn insert(&mut self, seg: Segment, ms: i64) {
        match self.0.binary_search_by(|(s, _)| s.cmp(&seg)) {
            Ok(i) => self.0[i].1 = ms,
            Err(i) => self.0.insert(i, (seg, ms)),
        }
    }

    /// A segment's total, if it has one.
    pub fn get(&self, seg: &Segment) -> Option<&i64> {
        self.0.binary_search_by(|(s, _)| s.cmp(seg)).ok().map(|i| &self.0[i].1)
    }

    /// `(segment, total)` in segment order.
    pub fn iter(&self) -> std::slice::Iter<'_, (Segment, i64)> {
        self.0.iter()
    }

    /// The totals, in segment order.
    pub fn values(&self) -> impl Iterator<Item = &i64> {
        self.0.iter().map(|(_, ms)| ms)
    }

    /// No segments.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// Whether no segment has a total.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Segments with a total.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl<'a> IntoIterator for &'a SegmentTotals {
    type Item = &'a (Segment, i64);
    type IntoIter = std::slice::Iter<'a, (Segment, i64)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl FromIterator<(Segment, i64)> for SegmentTotals {
    fn from_iter<I: IntoIterator<Item = (Segment, i64)>>(iter: I) -> Self {
        let mut t = SegmentTotals::default();
        t.extend(iter);
        t
    }
}

impl Extend<(Segment, i64)> for SegmentTotals {
    /// Like a map's: a later total for the same segment replaces the earlier.
    fn extend<I: IntoIterator<Item = (Segment, i64)>>(&mut self, iter: I) {
        for (seg, ms) in iter {
            self.insert(seg, ms);
        }
    }
}

impl Serialize for SegmentTotals {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ser.collect_map(self.0.iter().map(|(s, ms)| (s, ms)))
    }
}

impl<'de> Deserialize<'de> for SegmentTotals {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        Ok(BTreeMap::<Segment, i64>::deserialize(de)?.into_iter().collect())
    }
}

/// Everything derived about one job. All times are Unix milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// Where the job is now.
    pub state: JobState,
    /// Attributes from the first `submitted`, as later ones updated them.
    pub attrs: Option<Arc<JobAttrs>>,
    /// When it was submitted.
    pub submitted_at: Option<i64>,
    /// When it was first reported queued.
    pub first_queued_at: Option<i64>,
    /// When nodes were first assigned.
    pub node_assigned_at: Option<i64>,
    /// When preparation first started.
    pub preparing_at: Option<i64>,
    /// When the first training step of the first run completed.
    pub first_step_at: Option<i64>,
    /// What `first_step_at` was observed from (set with it): the training process, or the container or scheduler
    /// start when nothing stronger reported that run's first step.
    #[serde(default)]
    pub first_step_origin: Option<pb::StepOrigin>,
    /// The last checkpoint: (time, step).
    pub last_checkpoint: Option<(i64, u64)>,
    /// When it ended.
    pub done_at: Option<i64>,
    /// How it ended.
    pub outcome: Option<pb::Outcome>,
    /// Exit code from `done`, if given.
    pub exit_code: Option<i32>,
    /// While waiting: the current segment and since when.
    pub current_wait: Option<(Segment, i64)>,
    /// While waiting: when the current wait began (submit, or the stop of the last run).
    pub wait_started_at: Option<i64>,
    /// The raw provider reason of the current `queued` segment, if any.
    pub current_raw_reason: Option<Arc<str>>,
    /// The scheduler's estimated start given with the current `queued` segment, if any (Unix ms).
    pub current_estimated_start: Option<i64>,
    /// Time spent in each segment before the first step (or before the end, if it never started).
    pub initial_wait_ms: SegmentTotals,
    /// Time spent waiting again after preemptions, node losses and requeues, before training resumed.
    pub requeue_wait_ms: i64,
    /// Runs started (1 for a job that ran once; 0 before the first step).
    pub runs: u32,
    /// Attempts: 1 + requeues and restarts, or the highest attempt a source reported, whichever is larger.
    pub attempts: u32,
    /// Preemptions seen.
    pub preemptions: u32,
    /// Node losses seen.
    pub node_losses: u32,
    /// Training time lost to preemptions, node losses and restarts (since the last checkpoint).
    pub lost_work_ms: i64,
    /// Steps lost: training progressed past the step a requeue or restart resumed from.
    pub lost_steps: u64,
    /// Time spent saving checkpoints (the sum of their `save_seconds`).
    pub checkpoint_save_ms: i64,
    /// Training lost when the job failed: its last run since the later of its start and last checkpoint.
    pub failed_work_ms: i64,
    /// The highest step seen.
    pub max_step: Option<u64>,
    /// Events stamped after `done`, ignored for the timeline (still stored).
    pub ignored_after_done: u32,
    /// Where the job ran (or was placed), in order.
    pub placements: Vec<Placement>,
}

impl Timeline {
    /// Time to first step, if the job has started.
    pub fn time_to_first_step_ms(&self) -> Option<i64> {
        Some(self.first_step_at? - self.submitted_at?)
    }

    /// GPU-seconds of work lost, from `lost_work_ms` and the job's GPU count.
    pub fn lost_gpu_seconds(&self) -> f64 {
        let gpus = self.attrs.as_ref().map_or(0, |a| a.gpu_count);
        self.lost_work_ms as f64 / 1000.0 * f64::from(gpus)
    }

    /// Folds events in canonical order into a timeline.
    pub fn derive(events: &[CompactEvent]) -> Timeline {
        let Some((mut fold, mut t)) = TimelineFold::start(events) else {
            // Nothing is derived until the job's `submitted` arrives; the events are kept.
            return Timeline::default();
        };
        for (i, ev) in events.iter().enumerate() {
            fold.apply(&mut t, ev, &events[i + 1..]);
        }
        fold.finish(&mut t);
        t
    }
}

/// Where folding a job's events in canonical order stands: the fold's locals (the open waiting segment or the
/// open run, and the counters the final fields are computed from), kept beside the timeline they fold into so a
/// record can apply an event that sorts after all of its events without refolding the others.
///
/// The timeline is not inside the fold (a record keeps one timeline, not two): [`TimelineFold::apply`] updates
/// the caller's timeline and never reads the fields [`TimelineFold::finish`] computes (`state`, `attempts`,
/// `current_wait`, `wait_started_at`, `current_raw_reason`, `current_estimated_start`), so `finish` can be called after every event and
/// the next `apply` continues as if it had not been. Applying events in canonical order from
/// [`TimelineFold::start`] and then finishing gives exactly [`Timeline::derive`].
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineFold {
    /// When the first `submitted` happened; earlier stamps count from it.
    submitted_at: i64,
    /// The first `submitted`'s place in canonical order.
    submitted_key: (i64, u8, u64),
    /// The open waiting segment and its start.
    wait: Option<(Segment, i64)>,
    /// The open run's start.
    run_start: Option<i64>,
    /// The open run's last checkpoint.
    last_ckpt_at: Option<i64>,
    /// The open run's checkpoints, `(step, at)` in arrival order: a restart that resumes from an older one than
    /// the last (a corrupt or missing copy) loses the training since the one it resumed from.
    run_ckpts: Vec<(u64, i64)>,
    /// When the open requeue wait began.
    requeue_wait_start: Option<i64>,
    /// Requeues and restarts seen.
    requeues: u32,
    /// The highest attempt a source reported (at least 1).
    max_attempt: u32,
    /// The raw reason of the last `queued`, shown only while the open segment is a queued one.
    raw_reason: Option<Arc<str>>,
    /// The estimated start of the last `queued`, likewise.
    estimate: Option<i64>,
    /// Since the last event that ends a run: when the earliest first step whose origin is not the training
    /// process happened (its `at_ms`; 0 kept as -1, as this is only a bound to refold from). A first step of a
    /// stronger origin added after it may supersede it (see [`TimelineFold::weak_first_step_since`]). Eight bytes:
    /// the fold is kept inline in every record.
    weak_at: Option<NonZeroI64>,
}

impl TimelineFold {
    /// Starts folding `events` (in canonical order): the fold and the timeline before any event is applied, or
    /// `None` while the events hold no `submitted` (nothing is derived before it).
    pub fn start(events: &[CompactEvent]) -> Option<(TimelineFold, Timeline)> {
        let sub = events.iter().find(|e| matches!(e.kind, EventKind::Submitted(_)))?;
        let EventKind::Submitted(attrs) = &sub.kind else { return None };
        let submitted_at = sub.at_ms;
        let t = Timeline {
            attrs: Some(Arc::clone(attrs)),
            submitted_at: Some(submitted_at),
            attempts: 1,
            ..Timeline::default()
        };
        let fold = TimelineFold {
            submitted_at,
            submitted_key: sub.sort_key(),
            wait: Some((Segment::Unreported, submitted_at)),
            run_start: None,
            last_ckpt_at: None,
            run_ckpts: Vec::new(),
            requeue_wait_start: None,
            requeues: 0,
            max_attempt: 1,
            raw_reason: None,
            estimate: None,
            weak_at: None,
        };
        Some((fold, t))
    }

    /// The [`CompactEvent::sort_key`] of the `submitted` the fold started from: a `submitted` that sorts before
    /// it changes every event's effective time, so the fold must start again.
    pub fn submitted_key(&self) -> (i64, u8, u64) {
        self.submitted_key
    }

    /// A time at or before the earliest first step folded since the last event that ends a run whose origin is
    /// not the training process, if a first step of `strength` ([`origin_strength`]) added after every folded
    /// event may supersede it: the fold must then start again from there. `None`: such a first step changes
    /// nothing folded. (Conservative: an unspecified first step after an unspecified one refolds for nothing.)
    pub fn weak_first_step_since(&self, strength: u8) -> Option<i64> {
        self.weak_at.filter(|_| strength > 0).map(NonZeroI64::get)
    }

    /// Applies the next event in canonical order to `t` (call [`TimelineFold::finish`] before reading `t`).
    /// `later`: the events after it in canonical order (as far as known), which say whether a first step is
    /// superseded (see the module docs).
    pub fn apply(&mut self, t: &mut Timeline, ev: &CompactEvent, later: &[CompactEvent]) {
        match ev.kind {
            ref k if k.ends_run() => self.weak_at = None,
            EventKind::FirstStep { origin, .. } if origin != pb::StepOrigin::TrainingProcess => {
                self.weak_at = self.weak_at.or(NonZeroI64::new(ev.at_ms).or(NonZeroI64::new(-1)));
            }
            _ => {}
        }
        let at = ev.at_ms.max(self.submitted_at);
        if let Some(a) = ev.attempt {
            self.max_attempt = self.max_attempt.max(a);
        }
        if t.done_at.is_some() {
            t.ignored_after_done += 1;
            return;
        }
        let wait = &mut self.wait;
        let run_start = &mut self.run_start;
        let last_ckpt_at = &mut self.last_ckpt_at;
        let requeue_wait_start = &mut self.requeue_wait_start;
        match &ev.kind {
            EventKind::Submitted(later) => {
                // A later `submitted` updates the attributes (`super::update`); the first is where they began.
                if let Some(cur) = t.attrs.as_ref().filter(|a| !Arc::ptr_eq(a, later)) {
                    if let Some(updated) = cur.updated_by(later) {
                        t.attrs = Some(if updated == **later { Arc::clone(later) } else { Arc::new(updated) });
                    }
                }
            }
            EventKind::Queued { reason, raw_reason, estimated_start } => {
                t.first_queued_at.get_or_insert(at);
                if run_start.is_some() {
                    // Queued while running: the run stopped without an explicit preemption event.
                    t.lost_work_ms += lost_since(at, *run_start, *last_ckpt_at);
                    *run_start = None;
                    *requeue_wait_start = Some(at);
                }
                end_placement(t, PlacementEnd::Requeued, at, None);
                switch(t, wait, Segment::Queued(*reason), at);
                self.raw_reason = Some(raw_reason.clone());
                self.estimate = *estimated_start;
            }
            EventKind::NodeAssigned { nodes } => {
                t.node_assigned_at.get_or_insert(at);
                place(t, nodes, at);
                if wait.is_some() {
                    switch(t, wait, Segment::Assigned, at);
                }
            }
            EventKind::Preparing { phase } => {
                t.preparing_at.get_or_insert(at);
                if wait.is_some() {
                    switch(t, wait, Segment::Preparing(*phase), at);
                }
            }
            EventKind::FirstStep { origin, .. } if superseded(*origin, later) => {
                // A container or scheduler start the training process's own first step follows: preparing.
                t.preparing_at.get_or_insert(at);
                if wait.is_some() {
                    switch(t, wait, Segment::Preparing(pb::PreparingPhase::Environment), at);
                }
            }
            EventKind::FirstStep { step, origin } => {
                t.max_step = Some(t.max_step.map_or(*step, |m| m.max(*step)));
                if run_start.is_none() {
                    close(t, wait, at);
                    if let Some(s) = requeue_wait_start.take() {
                        t.requeue_wait_ms += at - s;
                    }
                    if t.first_step_at.is_none() {
                        t.first_step_at = Some(at);
                        t.first_step_origin = Some(*origin);
                    }
                    t.runs += 1;
                    if let Some(p) = t.placements.last_mut().filter(|p| p.end == PlacementEnd::Open) {
                        p.first_step_at.get_or_insert(at);
                    }
                    *run_start = Some(at);
                    *last_ckpt_at = None;
                    self.run_ckpts.clear();
                }
            }
            EventKind::Checkpoint { step, save_ms } => {
                t.checkpoint_save_ms += i64::from(*save_ms);
                t.max_step = Some(t.max_step.map_or(*step, |m| m.max(*step)));
                // Checkpoints in the same millisecond sort by id hash; the later one is the higher step.
                if t.last_checkpoint.is_none_or(|last| (at, *step) >= last) {
                    t.last_checkpoint = Some((at, *step));
                }
                *last_ckpt_at = Some(at);
                self.run_ckpts.push((*step, at));
            }
            EventKind::Preempted { checkpoint_saved } => {
                t.preemptions += 1;
                end_placement(t, PlacementEnd::Preempted, at, None);
                if run_start.is_some() {
                    if !checkpoint_saved {
                        t.lost_work_ms += lost_since(at, *run_start, *last_ckpt_at);
                    }
                    stop_run(run_start, requeue_wait_start, wait, at);
                }
            }
            EventKind::NodeLost { node } => {
                t.node_losses += 1;
                end_placement(t, PlacementEnd::Lost, at, Some(node));
                if run_start.is_some() {
                    t.lost_work_ms += lost_since(at, *run_start, *last_ckpt_at);
                    stop_run(run_start, requeue_wait_start, wait, at);
                }
            }
            EventKind::Requeued { resume_step } | EventKind::Restarted { resume_step } => {
                self.requeues += 1;
                if let Some(nodes) = end_placement(t, PlacementEnd::Requeued, at, None) {
                    if matches!(ev.kind, EventKind::Restarted { .. }) {
                        place(t, &nodes, at);
                    }
                }
                if let Some(m) = t.max_step {
                    t.lost_steps += m.saturating_sub(*resume_step);
                }
                if run_start.is_some() {
                    // Resumed from the newest checkpoint of this run at or below resume_step (the last one when
                    // it resumes from there; none: a checkpoint from before this run, or scratch).
                    let resumed_from = self.run_ckpts.iter().filter(|(s, _)| *s <= *resume_step).map(|(_, a)| *a).max();
                    t.lost_work_ms += lost_since(at, *run_start, resumed_from);
                    stop_run(run_start, requeue_wait_start, wait, at);
                }
                // Progress now restarts from resume_step.
                t.max_step = Some(*resume_step);
            }
            EventKind::Done { outcome, exit_code } => {
                close(t, wait, at);
                if let Some(s) = requeue_wait_start.take() {
                    t.requeue_wait_ms += at - s;
                }
                if *outcome == pb::Outcome::Failed {
                    t.failed_work_ms += lost_since(at, *run_start, *last_ckpt_at);
                }
                *run_start = None;
                end_placement(t, PlacementEnd::of_outcome(*outcome), at, None);
                t.done_at = Some(at);
                t.outcome = Some(*outcome);
                t.exit_code = *exit_code;
            }
        }
    }

    /// Sets the fields that describe where the job is now (`state`, `attempts`, `current_wait`,
    /// `wait_started_at`, `current_raw_reason`) from the fold, which it leaves as it was.
    pub fn finish(&self, t: &mut Timeline) {
        t.attempts = (1 + self.requeues).max(self.max_attempt);
        t.state = if t.done_at.is_some() {
            JobState::Done
        } else if self.run_start.is_some() {
            JobState::Running
        } else {
            self.wait.map_or(JobState::Queued, |(s, _)| s.state())
        };
        t.current_wait = self.wait;
        t.wait_started_at = match (t.state.is_waiting(), self.requeue_wait_start) {
            (false, _) => None,
            (true, Some(s)) => Some(s),
            (true, None) => Some(self.submitted_at),
        };
        (t.current_raw_reason, t.current_estimated_start) = match self.wait {
            Some((Segment::Queued(_), _)) => (self.raw_reason.clone(), self.estimate),
            _ => (None, None),
        };
    }
}

/// Whether a first step of `origin` is superseded by one of `later` (the events after it in canonical order): a
/// first step of a stronger origin comes before any event that ends a run.
fn superseded(origin: pb::StepOrigin, later: &[CompactEvent]) -> bool {
    if origin == pb::StepOrigin::TrainingProcess {
        return false;
    }
    let s = origin_strength(origin);
    for e in later {
        match &e.kind {
            EventKind::FirstStep { origin, .. } if origin_strength(*origin) > s => return true,
            k if k.ends_run() => return false,
            _ => {}
        }
    }
    false
}

/// Work lost at `at`: since the later of the run's start and its last checkpoint.
fn lost_since(at: i64, run_start: Option<i64>, last_ckpt: Option<i64>) -> i64 {
    let from = match (run_start, last_ckpt) {
        (Some(r), Some(c)) => r.max(c),
        (Some(r), None) => r,
        (None, _) => return 0,
    };
    (at - from).max(0)
}

/// Ends the current run and opens a requeue wait.
fn stop_run(run_start: &mut Option<i64>, requeue_start: &mut Option<i64>, wait: &mut Option<(Segment, i64)>, at: i64) {
    *run_start = None;
    requeue_start.get_or_insert(at);
    *wait = Some((Segment::Queued(pb::WaitReason::PreemptionRecovery), at));
}

/// Closes the open segment at `at`, crediting it to the initial wait if the job has not started yet.
fn close(t: &mut Timeline, wait: &mut Option<(Segment, i64)>, at: i64) {
    if let Some((seg, since)) = wait.take() {
        if t.first_step_at.is_none() {
            t.initial_wait_ms.add(seg, at - since);
        }
    }
}

/// Opens a placement on `nodes` at `at`, or adds them to the open one.
fn place(t: &mut Timeline, nodes: &Arc<[Arc<str>]>, at: i64) {
    if nodes.is_empty() {
        return;
    }
    match t.placements.last_mut().filter(|p| p.end == PlacementEnd::Open) {
        Some(p) => {
            if nodes.iter().any(|n| !p.nodes.contains(n)) {
                let mut all: Vec<Arc<str>> = p.nodes.to_vec();
                for n in nodes.iter() {
                    if !all.contains(n) {
                        all.push(n.clone());
                    }
                }
                p.nodes = all.into();
            }
        }
        None => t.placements.push(Placement {
            nodes: nodes.clone(),
            assigned_at: at,
            first_step_at: None,
            ended_at: None,
            end: PlacementEnd::Open,
            lost_node: None,
        }),
    }
}

/// Ends the open placement, if any, returning its nodes. `lost` is the node a `node_lost` named.
fn end_placement(t: &mut Timeline, end: PlacementEnd, at: i64, lost: Option<&Arc<str>>) -> Option<Arc<[Arc<str>]>> {
    let p = t.placements.last_mut().filter(|p| p.end == PlacementEnd::Open)?;
    p.end = end;
    p.ended_at = Some(at);
    p.lost_node = lost.filter(|n| p.nodes.contains(n)).cloned();
    Some(p.nodes.clone())
}

/// Switches the open waiting segment to `seg` at `at`.
fn switch(t: &mut Timeline, wait: &mut Option<(Segment, i64)>, seg: Segment, at: i64) {
    close(t, wait, at);
    *wait = Some((seg, at));
}
