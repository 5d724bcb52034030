//! Expected starts for the stream: a thread (`startline-estimates`) that, every `[stream]
//! expected_start_interval`, estimates every waiting job's start ([`eta::for_job`], the estimate of the job
//! listing: history and the scheduler's estimate, without the queue-position progress only a job's detail reads
//! from the store) and posts an [`EstimateNote`] for each job whose estimate is new, made in another state or
//! waiting segment, or moved by more than [`eta::reportable_move`] (a tenth of the wait it had left, at least 5
//! minutes) since the one last posted.
//!
//! It walks the hot jobs in id order in chunks, each under its own short read lock, so the committer (the
//! index's one writer) never waits for more than a chunk: an estimate costs tens of microseconds, too much for
//! the commit path when a hundred thousand jobs wait. The committer, the one writer of cursors, writes the notes
//! with its next group or idle write, after checking under its lock that each job is still in the state and
//! segment it was estimated in; a note that lost that race is named back ([`Stream::take_estimates_dropped`]),
//! forgotten here, and its job estimated again by the next sweep. What was posted lives in memory only: after a
//! restart the first sweep posts every waiting job's estimate again.

use crate::index::SharedIndex;
use crate::job::{JobState, Segment};
use crate::slo::eta::{self, Eta};
use crate::stream::{EstimateNote, Stream, Subject};
use std::collections::HashMap;
use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Waiting jobs estimated under one read lock.
const ESTIMATES_PER_LOCK: usize = 64;
/// Hot jobs looked at under one read lock (most hot jobs are running or ended).
const JOBS_PER_LOCK: usize = 4096;

/// The sweep's memory: the estimate last posted per waiting job, with the state and segment it was made in.
pub(super) struct Sweeper {
    index: SharedIndex,
    stream: Arc<Stream>,
    posted: HashMap<String, Posted>,
}

/// An estimate posted, and the view it was made in.
struct Posted {
    state: JobState,
    segment: Option<Segment>,
    eta: Eta,
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Swept {
    /// Waiting jobs estimated (with an estimate or without).
    pub waiting: usize,
    /// Notes posted.
    pub posted: usize,
}

impl Sweeper {
    pub(super) fn new(index: SharedIndex, stream: Arc<Stream>) -> Sweeper {
        Sweeper { index, stream, posted: HashMap::new() }
    }

    /// One sweep at `now`: every waiting job estimated, moved estimates posted; `stop` is asked between chunks
    /// (a stop leaves the rest for the next sweep).
    pub(super) fn sweep(&mut self, now: i64, stop: &dyn Fn() -> bool) -> Swept {
        self.forget_dropped();
        let mut swept = Swept::default();
        let mut waiting_now: Vec<String> = Vec::new();
        let mut after: Option<String> = None;
        loop {
            if stop() {
                return swept;
            }
            let (notes, last) = self.estimate_chunk(after.as_deref(), now, &mut waiting_now, &mut swept);
            swept.posted += notes.len();
            self.stream.post_estimates(notes);
            match last {
                Some(id) => after = Some(id),
                None => break,
            }
        }
        self.forget_not_waiting(&waiting_now);
        swept
    }

    /// Jobs whose note the committer dropped are estimated afresh.
    fn forget_dropped(&mut self) {
        for id in self.stream.take_estimates_dropped() {
            self.posted.remove(&id);
        }
    }

    /// Under one read lock: the hot jobs after `after` (at most [`JOBS_PER_LOCK`], or until
    /// [`ESTIMATES_PER_LOCK`] waiting ones), the notes of the moved estimates, and the last id looked at (`None`
    /// at the end of the jobs).
    fn estimate_chunk(
        &mut self,
        after: Option<&str>,
        now: i64,
        waiting_now: &mut Vec<String>,
        swept: &mut Swept,
    ) -> (Vec<EstimateNote>, Option<String>) {
        let idx = self.index.read();
        let from = match after {
            Some(a) => Bound::Excluded(a),
            None => Bound::Unbounded,
        };
        let mut notes = Vec::new();
        let (mut looked, mut estimated) = (0, 0);
        let mut last = None;
        for (id, h) in idx.jobs.range::<str, _>((from, Bound::Unbounded)) {
            if looked == JOBS_PER_LOCK || estimated == ESTIMATES_PER_LOCK {
                return (notes, last);
            }
            looked += 1;
            last = Some(id.clone());
            let t = &h.rec.timeline;
            if !t.state.is_waiting() {
                continue;
            }
            estimated += 1;
            swept.waiting += 1;
            waiting_now.push(id.clone());
            let Some(e) = eta::for_job(&idx.waits, t, None, now) else {
                // No estimate now (no history): posted again once there is one.
                self.posted.remove(id);
                continue;
            };
            let segment = t.current_wait.map(|(s, _)| s);
            let last = self.posted.get(id).filter(|p| p.state == t.state && p.segment == segment);
            if !eta::reportable_move(last.map(|p| &p.eta), Some(&e), now) {
                continue;
            }
            notes.push(EstimateNote {
                subject: Subject::job(id, t.attrs.as_deref()),
                state: t.state,
                segment,
                eta: e.clone(),
            });
            self.posted.insert(id.clone(), Posted { state: t.state, segment, eta: e });
        }
        (notes, None)
    }

    /// Jobs no longer waiting (started, ended, deleted) leave the memory: a later wait is estimated afresh.
    fn forget_not_waiting(&mut self, waiting_now: &[String]) {
        if self.posted.len() == waiting_now.len() {
            return;
        }
        let waiting: std::collections::HashSet<&str> = waiting_now.iter().map(String::as_str).collect();
        self.posted.retain(|id, _| waiting.contains(id.as_str()));
    }
}

/// Starts the sweep thread: a sweep every `every` (the first one after `every`) until `stop` is dropped.
pub(super) fn spawn(
    index: SharedIndex,
    stream: Arc<Stream>,
    clock: crate::time::Clock,
    every: Duration,
    stop: std::sync::mpsc::Receiver<()>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("startline-estimates".into()).spawn(move || {
        let mut sweeper = Sweeper::new(index, stream.clone());
        let stopped = || matches!(stop.try_recv(), Err(std::sync::mpsc::TryRecvError::Disconnected));
        loop {
            match stop.recv_timeout(every) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                _ => return,
            }
            let started = Instant::now();
            let swept = sweeper.sweep(clock.now_ms(), &stopped);
            let took = started.elapsed();
            stream.estimate_sweep_micros.store(took.as_micros() as u64, std::sync::atomic::Ordering::Relaxed);
            tracing::debug!(
                waiting = swept.waiting,
                posted = swept.posted,
                took_ms = took.as_millis() as u64,
                "estimate sweep"
            );
        }
    })
}

#[cfg(test)]
#[path = "estimates_tests.rs"]
mod tests;
