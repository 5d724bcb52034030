//! The summary body: a [`Folded`] job, everything of a done job's timeline, and its stored codec.

use super::*;

/// The summary body's format (inside the store's pack): `SUMMARY_FORMAT ++ postcard((Disk, [checkpoint save ms,
/// failed-run ms], placements))`.
pub(super) const SUMMARY_FORMAT: u8 = 3;

/// One folded job. Times are Unix milliseconds, [`NONE`] when absent.
#[derive(Debug, Clone, PartialEq)]
pub struct Folded {
    /// Index into the attribute dictionary.
    pub attrs: u32,
    pub(super) submitted_at: i64,
    pub(super) done_at: i64,
    pub(super) first_step_at: i64,
    pub(super) first_queued_at: i64,
    pub(super) node_assigned_at: i64,
    pub(super) preparing_at: i64,
    pub(super) checkpoint_at: i64,
    pub(super) checkpoint_step: u64,
    pub(super) requeue_wait_ms: i64,
    pub(super) lost_work_ms: i64,
    pub(super) checkpoint_save_ms: i64,
    pub(super) failed_work_ms: i64,
    pub(super) lost_steps: u64,
    pub(super) max_step: u64,
    pub(super) runs: u32,
    pub(super) attempts: u32,
    pub(super) preemptions: u32,
    pub(super) node_losses: u32,
    pub(super) ignored_after_done: u32,
    pub(super) exit_code: i32,
    /// `pb::Outcome` as i32.
    pub(super) outcome: i32,
    /// Bit 0: has exit code; bit 1: has max step; bit 2: has outcome; bits 3-4: the first step's origin
    /// (`pb::StepOrigin` as i32; 0, unspecified, in summaries written before origins existed).
    pub(super) flags: u8,
    /// The initial wait by segment, in segment order.
    pub(super) waits: Box<[(Segment, i64)]>,
    /// Where it ran.
    pub(super) placements: Box<[Placement]>,
    /// The number of its summary in the store (from 1; 0 while it has none); not part of the summary body.
    pub(super) summary: u64,
}

pub(super) fn opt(v: i64) -> Option<i64> {
    (v != NONE).then_some(v)
}

/// The flag bits (3-4) that keep a first step's origin.
pub(super) fn origin_bits(origin: Option<pb::StepOrigin>) -> u8 {
    ((origin.unwrap_or_default() as i32 & 3) as u8) << 3
}

/// The first step's origin from a row's flags, for a job that started (`first_step_at`).
pub(super) fn origin_of(flags: u8, first_step_at: Option<i64>) -> Option<pb::StepOrigin> {
    first_step_at.map(|_| pb::StepOrigin::try_from(i32::from((flags >> 3) & 3)).unwrap_or_default())
}

impl Folded {
    #[cfg(test)]
    /// When the job ended.
    pub fn done_at(&self) -> i64 {
        self.done_at
    }

    #[cfg(test)]
    /// When the job was submitted.
    pub fn submitted_at(&self) -> i64 {
        self.submitted_at
    }

    #[cfg(test)]
    /// When it reached its first training step, if it did.
    pub fn first_step_at(&self) -> Option<i64> {
        opt(self.first_step_at)
    }

    #[cfg(test)]
    /// Its time to first step, as [`Timeline::time_to_first_step_ms`] gives it.
    pub fn time_to_first_step_ms(&self) -> Option<i64> {
        Some(self.first_step_at()? - self.submitted_at)
    }

    /// The number of its summary in the store (see [`Folded::with_summary`]).
    pub fn summary(&self) -> u64 {
        self.summary
    }

    /// The row with its stored summary's number (the store assigns it when it writes the summary).
    pub fn with_summary(mut self, summary: u64) -> Folded {
        self.summary = summary;
        self
    }

    #[cfg(test)]
    /// How many placements the row keeps.
    pub fn placements_len(&self) -> usize {
        self.placements.len()
    }

    /// The row of a done timeline with its attributes interned as `attrs`; `None` unless the job is done and
    /// submitted.
    pub fn of(t: &Timeline, attrs: u32) -> Option<Folded> {
        if t.state != JobState::Done || t.attrs.is_none() || t.current_wait.is_some() {
            return None;
        }
        let mut flags = 0;
        if t.exit_code.is_some() {
            flags |= 1;
        }
        if t.max_step.is_some() {
            flags |= 2;
        }
        if t.outcome.is_some() {
            flags |= 4;
        }
        flags |= origin_bits(t.first_step_origin);
        Some(Folded {
            attrs,
            submitted_at: t.submitted_at?,
            done_at: t.done_at?,
            first_step_at: t.first_step_at.unwrap_or(NONE),
            first_queued_at: t.first_queued_at.unwrap_or(NONE),
            node_assigned_at: t.node_assigned_at.unwrap_or(NONE),
            preparing_at: t.preparing_at.unwrap_or(NONE),
            checkpoint_at: t.last_checkpoint.map_or(NONE, |c| c.0),
            checkpoint_step: t.last_checkpoint.map_or(0, |c| c.1),
            requeue_wait_ms: t.requeue_wait_ms,
            lost_work_ms: t.lost_work_ms,
            checkpoint_save_ms: t.checkpoint_save_ms,
            failed_work_ms: t.failed_work_ms,
            lost_steps: t.lost_steps,
            max_step: t.max_step.unwrap_or(0),
            runs: t.runs,
            attempts: t.attempts,
            preemptions: t.preemptions,
            node_losses: t.node_losses,
            ignored_after_done: t.ignored_after_done,
            exit_code: t.exit_code.unwrap_or(0),
            outcome: t.outcome.map_or(0, |o| o as i32),
            flags,
            waits: t.initial_wait_ms.iter().map(|(s, ms)| (*s, *ms)).collect(),
            placements: t.placements.iter().cloned().collect(),
            summary: 0,
        })
    }

    #[cfg(test)]
    /// Writes the job's timeline into `t` (reusing its allocations), with `attrs` as its attributes.
    pub fn fill(&self, attrs: &Arc<JobAttrs>, t: &mut Timeline) {
        self.fill_with(attrs, t, true)
    }

    #[cfg(test)]
    /// [`Folded::fill`], leaving `placements` empty unless asked for: copying them clones every node name, which
    /// is most of a scan's cost per folded job, and only the node report reads them.
    pub fn fill_with(&self, attrs: &Arc<JobAttrs>, t: &mut Timeline, placements: bool) {
        t.state = JobState::Done;
        if !t.attrs.as_ref().is_some_and(|a| Arc::ptr_eq(a, attrs)) {
            t.attrs = Some(attrs.clone());
        }
        t.submitted_at = Some(self.submitted_at);
        t.first_queued_at = opt(self.first_queued_at);
        t.node_assigned_at = opt(self.node_assigned_at);
        t.preparing_at = opt(self.preparing_at);
        t.first_step_at = opt(self.first_step_at);
        t.first_step_origin = origin_of(self.flags, t.first_step_at);
        t.last_checkpoint = opt(self.checkpoint_at).map(|at| (at, self.checkpoint_step));
        t.done_at = Some(self.done_at);
        t.outcome = (self.flags & 4 != 0).then(|| pb::Outcome::try_from(self.outcome).unwrap_or_default());
        t.exit_code = (self.flags & 1 != 0).then_some(self.exit_code);
        t.current_wait = None;
        t.wait_started_at = None;
        t.current_raw_reason = None;
        t.current_estimated_start = None;
        t.initial_wait_ms.clear();
        t.initial_wait_ms.extend(self.waits.iter().copied());
        t.requeue_wait_ms = self.requeue_wait_ms;
        t.runs = self.runs;
        t.attempts = self.attempts;
        t.preemptions = self.preemptions;
        t.node_losses = self.node_losses;
        t.lost_work_ms = self.lost_work_ms;
        t.checkpoint_save_ms = self.checkpoint_save_ms;
        t.failed_work_ms = self.failed_work_ms;
        t.lost_steps = self.lost_steps;
        t.max_step = (self.flags & 2 != 0).then_some(self.max_step);
        t.ignored_after_done = self.ignored_after_done;
        t.placements.clear();
        if placements {
            t.placements.extend(self.placements.iter().cloned());
        }
    }

    /// The stored summary body.
    pub fn encode(&self) -> Vec<u8> {
        let disk = Disk {
            attrs: self.attrs,
            times: [
                self.submitted_at,
                self.done_at,
                self.first_step_at,
                self.first_queued_at,
                self.node_assigned_at,
                self.preparing_at,
                self.checkpoint_at,
            ],
            counts: [self.checkpoint_step, self.lost_steps, self.max_step],
            requeue_wait_ms: self.requeue_wait_ms,
            lost_work_ms: self.lost_work_ms,
            small: [self.runs, self.attempts, self.preemptions, self.node_losses, self.ignored_after_done],
            exit_code: self.exit_code,
            outcome: self.outcome,
            flags: self.flags,
            waits: self.waits.iter().map(|(s, ms)| (*s, *ms)).collect(),
        };
        let mut out = vec![SUMMARY_FORMAT];
        // Serializing plain integers and enums into a Vec cannot fail.
        let placements: &[Placement] = &self.placements;
        out.extend(
            postcard::to_stdvec(&(disk, [self.checkpoint_save_ms, self.failed_work_ms], placements))
                .unwrap_or_default(),
        );
        out
    }

    /// Decodes a stored summary body.
    pub fn decode(body: &[u8]) -> Result<Folded, String> {
        let (d, [checkpoint_save_ms, failed_work_ms], placements) = match body.split_first() {
            Some((&SUMMARY_FORMAT, rest)) => {
                postcard::from_bytes::<(Disk, [i64; 2], Vec<Placement>)>(rest).map_err(|e| e.to_string())?
            }
            _ => return Err(format!("unknown summary format {:?}", body.first())),
        };
        let [submitted_at, done_at, first_step_at, first_queued_at, node_assigned_at, preparing_at, checkpoint_at] =
            d.times;
        let [checkpoint_step, lost_steps, max_step] = d.counts;
        let [runs, attempts, preemptions, node_losses, ignored_after_done] = d.small;
        Ok(Folded {
            attrs: d.attrs,
            submitted_at,
            done_at,
            first_step_at,
            first_queued_at,
            node_assigned_at,
            preparing_at,
            checkpoint_at,
            checkpoint_step,
            requeue_wait_ms: d.requeue_wait_ms,
            lost_work_ms: d.lost_work_ms,
            checkpoint_save_ms,
            failed_work_ms,
            lost_steps,
            max_step,
            runs,
            attempts,
            preemptions,
            node_losses,
            ignored_after_done,
            exit_code: d.exit_code,
            outcome: d.outcome,
            flags: d.flags,
            waits: d.waits.into_boxed_slice(),
            placements: placements.into_boxed_slice(),
            summary: 0,
        })
    }
}

/// The summary as stored (postcard: integers as varints).
#[derive(Serialize, Deserialize)]
pub(super) struct Disk {
    pub(super) attrs: u32,
    pub(super) times: [i64; 7],
    pub(super) counts: [u64; 3],
    pub(super) requeue_wait_ms: i64,
    pub(super) lost_work_ms: i64,
    pub(super) small: [u32; 5],
    pub(super) exit_code: i32,
    pub(super) outcome: i32,
    pub(super) flags: u8,
    pub(super) waits: Vec<(Segment, i64)>,
}
