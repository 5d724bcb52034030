//! Where a job's GPU time went: its time from submit to its end (or now) split into categories that add up
//! exactly, derived only from its [`Timeline`] (so folded jobs are accounted from their rows, never their raw
//! events), then weighted by the GPUs it asked for.
//!
//! Categories (milliseconds of wall time; × `gpu_count` for GPU time):
//! - `waiting` by segment: the initial wait before the first step in each queued reason, unreported and assigned
//!   segment (`initial_wait_ms`, plus the open segment of a job still waiting);
//! - `preparing` by phase: the initial wait's preparing segments (image pull, data staging, ...);
//! - `requeue_wait`: waiting again after a preemption, node loss or requeue, until training resumed;
//! - `checkpoint`: time spent saving checkpoints (`Checkpoint.save_seconds`);
//! - `lost`: training since the last checkpoint lost to preemptions, node losses and restarts;
//! - `failed`: training since the last checkpoint of a run that ended with the job failed;
//! - `productive`: the rest of the time training ran.
//!
//! The identity `sum(categories) == end - submit` holds exactly for every timeline: the waits and the runs are
//! disjoint and cover the job's life; checkpoint, lost and failed time are taken out of the run time (each
//! capped by what is left, so inconsistent reports cannot make `productive` negative).

use super::{Segment, Timeline};
use std::collections::BTreeMap;

/// A job's time by category, milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Account {
    /// Initial wait by segment (queued reasons, unreported, assigned), before the first step.
    pub waiting: BTreeMap<Segment, i64>,
    /// Initial preparation by segment (`Segment::Preparing(phase)`).
    pub preparing: BTreeMap<Segment, i64>,
    /// Waiting again after a run stopped, until training resumed (or the job ended).
    pub requeue_wait: i64,
    /// Saving checkpoints.
    pub checkpoint: i64,
    /// Training lost to preemptions, node losses and restarts.
    pub lost: i64,
    /// Training lost when the job failed.
    pub failed: i64,
    /// Useful training.
    pub productive: i64,
    /// From submit to the end (or now): the sum of every category.
    pub total: i64,
    /// GPUs the job asked for (its weight).
    pub gpus: u32,
}

/// The categories' names, in report order (closed: safe as a metric attribute).
pub const CATEGORIES: [&str; 7] =
    ["waiting", "preparing", "requeue_wait", "checkpoint", "lost", "failed", "productive"];

impl Account {
    /// Milliseconds per category, in [`CATEGORIES`] order.
    pub fn by_category(&self) -> [i64; 7] {
        [
            saturating_sum(self.waiting.values()),
            saturating_sum(self.preparing.values()),
            self.requeue_wait,
            self.checkpoint,
            self.lost,
            self.failed,
            self.productive,
        ]
    }
}

/// Accounts a job at `now_ms` (used only while it has not ended); `None` before its `submitted` is known.
pub fn account(t: &Timeline, now_ms: i64) -> Option<Account> {
    let submitted = t.submitted_at?;
    let mut waits: BTreeMap<Segment, i64> = t.initial_wait_ms.iter().copied().collect();
    let mut requeue_wait = t.requeue_wait_ms;
    // The end: when it ended, else now, never before anything the timeline already holds.
    let end = match t.done_at {
        Some(d) => d,
        None => {
            let mut end = now_ms.max(submitted);
            for known in [t.first_step_at, t.last_checkpoint.map(|c| c.0), t.current_wait.map(|w| w.1)] {
                end = end.max(known.unwrap_or(end));
            }
            // The open wait: still before the first step, or waiting again after a run stopped.
            if let Some((seg, since)) = t.current_wait {
                if t.first_step_at.is_none() {
                    let w = waits.entry(seg).or_insert(0);
                    *w = w.saturating_add(end.saturating_sub(since));
                } else if let Some(started) = t.wait_started_at {
                    requeue_wait = requeue_wait.saturating_add(end.saturating_sub(started.min(end)));
                }
            }
            end
        }
    };
    // Saturating throughout: timestamps come from clients, and differences of extreme ones must not overflow.
    let total = end.saturating_sub(submitted);
    let initial = saturating_sum(waits.values());
    // The initial waits cover submit to the first step (or the end) exactly, so they never exceed `total`; the
    // requeue wait is capped by what is left, and the runs are the rest.
    let requeue_wait = requeue_wait.clamp(0, total.saturating_sub(initial).max(0));
    let run = total.saturating_sub(initial).saturating_sub(requeue_wait).max(0);
    let checkpoint = t.checkpoint_save_ms.clamp(0, run);
    let lost = t.lost_work_ms.clamp(0, run - checkpoint);
    let failed = t.failed_work_ms.clamp(0, run - checkpoint - lost);
    let (preparing, waiting): (BTreeMap<_, _>, BTreeMap<_, _>) =
        waits.into_iter().partition(|(s, _)| matches!(s, Segment::Preparing(_)));
    Some(Account {
        waiting,
        preparing,
        requeue_wait,
        checkpoint,
        lost,
        failed,
        productive: run - checkpoint - lost - failed,
        total,
        gpus: t.attrs.as_ref().map_or(0, |a| a.gpu_count),
    })
}

/// A sum that stops at `i64::MAX` / `i64::MIN` instead of overflowing.
fn saturating_sum<'a>(xs: impl Iterator<Item = &'a i64>) -> i64 {
    xs.fold(0i64, |a, x| a.saturating_add(*x))
}
