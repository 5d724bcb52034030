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
use crate::slo::eta;
use crate::stream::{EstimateNote, Stream};
use std::collections::HashMap;
use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Waiting jobs estimated under one read lock.
const ESTIMATES_PER_LOCK: usize = 64;
/// Hot jobs looked at under one read lock (most hot jobs are running or ended).
const JOBS_PER_LOCK: usize = 4096;

/// The sweep's memory: the central estimate last posted per waiting job, with the state and segment it was made
/// in, keyed by a hash of the job's id (about 40 bytes a waiting job, whatever its id and attributes; two ids
/// sharing a 64-bit hash would share an entry, and one of them would be posted less often).
pub(super) struct Sweeper {
    index: SharedIndex,
    stream: Arc<Stream>,
    posted: HashMap<u64, Posted>,
}

/// An estimate posted: its central time and the view it was made in.
struct Posted {
    state: JobState,
    segment: Option<Segment>,
    at_ms: i64,
}

/// The key a job's posted estimate is kept under.
fn key(job_id: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    job_id.hash(&mut h);
    h.finish()
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
        let mut waiting_now: Vec<u64> = Vec::new();
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
            self.posted.remove(&key(&id));
        }
    }

    /// Under one read lock: the hot jobs after `after` (at most [`JOBS_PER_LOCK`], or until
    /// [`ESTIMATES_PER_LOCK`] waiting ones), the notes of the moved estimates, and the last id looked at (`None`
    /// at the end of the jobs).
    fn estimate_chunk(
        &mut self,
        after: Option<&str>,
        now: i64,
        waiting_now: &mut Vec<u64>,
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
            let k = key(id);
            waiting_now.push(k);
            let Some(e) = eta::for_job(&idx.waits, t, None, now) else {
                // No estimate now (no history): posted again once there is one.
                self.posted.remove(&k);
                continue;
            };
            let segment = t.current_wait.map(|(s, _)| s);
            let last = self.posted.get(&k).filter(|p| p.state == t.state && p.segment == segment);
            if last.is_some_and(|p| !eta::central_moved(p.at_ms, e.at_ms, now)) {
                continue;
            }
            self.posted.insert(k, Posted { state: t.state, segment, at_ms: e.at_ms });
            notes.push(EstimateNote { job_id: id.clone(), state: t.state, segment, eta: e });
        }
        (notes, None)
    }

    /// Jobs no longer waiting (started, ended, deleted) leave the memory: a later wait is estimated afresh.
    fn forget_not_waiting(&mut self, waiting_now: &[u64]) {
        let waiting: std::collections::HashSet<u64> = waiting_now.iter().copied().collect();
        self.posted.retain(|k, _| waiting.contains(k));
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
