//! The collector's health as /healthz, /readyz and self-metrics report it: whether storage writes are failing
//! (and why, in words safe to show a client), whether they are halted for the life of the process
//! ([`WriteHalt`]), and whether the committer thread is still alive. Written by the applier (committer and
//! checkpointer) and the store, read by the ingest edge, the API and the exporter. Also the ingest counters
//! ([`IngestStats`]), written by the edge and the applier and read by the exporter, with the open jobs of each
//! identity ([`OpenJobs`]) the committer keeps for the identities' open-jobs budgets.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Store writes halted for the rest of this process's life: set once, by the first store write that fails with
/// an I/O error (a full disk, too many open files, a failing device), never cleared.
///
/// After such a failure sled may wait for ever on an I/O buffer whose write failed (in a flush, in a later write,
/// in the drop of the database), so nothing may touch the database again: every later write is refused at once,
/// ingest answers `UNAVAILABLE`, reads keep being served from memory and from what is on disk, and once the
/// store's file system is writable again the process is restarted (see `applier::halt`). Everything acknowledged
/// before is in the log's synced files, so the restart loses nothing.
#[derive(Debug, Default)]
pub struct WriteHalt {
    cause: OnceLock<&'static str>,
}

impl WriteHalt {
    /// Halts writes with `cause` (words safe to show a client); true if this call halted them (the first).
    pub fn halt(&self, cause: &'static str) -> bool {
        self.cause.set(cause).is_ok()
    }

    /// The cause, once halted.
    pub fn cause(&self) -> Option<&'static str> {
        self.cause.get().copied()
    }
}

/// Shared health state. Cheap to read.
#[derive(Debug, Default)]
pub struct Health {
    /// Set when the last storage write failed; cleared by the next one that succeeds.
    storage_failing: AtomicBool,
    /// The cause of the last storage failure ("no space left on device").
    storage_cause: Mutex<Option<&'static str>>,
    /// Set for good if the committer thread panicked.
    committer_dead: AtomicBool,
    /// Storage write failures so far (group commits, checkpoints, folds, retention, the stream).
    storage_errors: AtomicU64,
    /// The store's write halt (shared with the store, which sets it).
    halt: Arc<WriteHalt>,
}

impl Health {
    /// Health that reports the store's write halt (see [`WriteHalt`]).
    pub fn watching(halt: Arc<WriteHalt>) -> Health {
        Health { halt, ..Health::default() }
    }

    /// The cause, once store writes are halted.
    pub fn halted(&self) -> Option<&'static str> {
        self.halt.cause()
    }

    /// Records a failed storage write and its cause.
    pub fn storage_failed(&self, cause: &'static str) {
        if let Ok(mut c) = self.storage_cause.lock() {
            *c = Some(cause);
        }
        self.storage_failing.store(true, Ordering::Relaxed);
        self.storage_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// The cause of the last storage failure, if any was recorded.
    pub fn last_cause(&self) -> Option<&'static str> {
        self.storage_cause.lock().ok().and_then(|c| *c)
    }

    /// Records a storage write that succeeded: storage is healthy again.
    pub fn storage_ok(&self) {
        if self.storage_failing.swap(false, Ordering::Relaxed) {
            tracing::info!("storage writes succeed again; ingest resumed");
        }
    }

    /// Records that the committer thread died: the collector cannot acknowledge anything until restarted.
    pub fn committer_died(&self) {
        self.committer_dead.store(true, Ordering::Relaxed);
    }

    /// Whether the collector can acknowledge events now.
    pub fn is_healthy(&self) -> bool {
        !self.storage_failing.load(Ordering::Relaxed)
            && !self.committer_dead.load(Ordering::Relaxed)
            && self.halt.cause().is_none()
    }

    /// Why not, in words safe to show a client; `None` when healthy.
    pub fn problem(&self) -> Option<String> {
        if self.committer_dead.load(Ordering::Relaxed) {
            return Some("committer stopped; restart the collector".to_string());
        }
        if let Some(cause) = self.halt.cause() {
            return Some(format!(
                "storage writes failed: {cause}; ingest is refused until the collector restarts, which it does by \
                 itself once the store's file system is writable again"
            ));
        }
        if self.storage_failing.load(Ordering::Relaxed) {
            let cause = self.storage_cause.lock().ok().and_then(|c| *c).unwrap_or("storage error");
            return Some(format!("storage writes failing: {cause}"));
        }
        None
    }

    /// Storage write failures so far.
    pub fn storage_errors(&self) -> u64 {
        self.storage_errors.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_reported_with_its_cause_and_clears_on_success() {
        let h = Health::default();
        assert!(h.is_healthy());
        assert_eq!(h.problem(), None);
        h.storage_failed("no space left on device");
        assert!(!h.is_healthy());
        assert_eq!(h.problem().as_deref(), Some("storage writes failing: no space left on device"));
        h.storage_ok();
        assert!(h.is_healthy());
        assert_eq!(h.storage_errors(), 1);
        h.committer_died();
        h.storage_ok();
        assert!(!h.is_healthy(), "a dead committer is not cured by a write");
    }

    #[test]
    fn a_write_halt_is_for_good_and_keeps_its_first_cause() {
        let halt = Arc::new(WriteHalt::default());
        let h = Health::watching(halt.clone());
        assert!(h.is_healthy());
        assert!(halt.halt("no space left on device"));
        assert!(!halt.halt("I/O error"), "only the first halt counts");
        assert_eq!(h.halted(), Some("no space left on device"));
        h.storage_ok();
        assert!(!h.is_healthy(), "a halt is not cured by anything but a restart");
        let problem = h.problem().unwrap_or_default();
        assert!(problem.contains("no space left on device") && problem.contains("restarts"), "{problem}");
    }

    #[test]
    fn open_jobs_count_against_the_identity_that_opened_them_until_they_close() {
        let o = OpenJobs::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let mut book = o.book();
        book.opened("j1", &a);
        book.opened("j2", &a);
        book.opened("j1", &b); // already counted: the first identity keeps it
        book.opened("j3", &b);
        assert_eq!((book.count("a"), book.count("b"), book.count("c")), (2, 1, 0));
        assert_eq!(book.owner("j1").map(|n| &**n), Some("a"));
        book.closed("j1");
        book.closed("j1");
        book.closed("unknown");
        assert_eq!((book.count("a"), book.len()), (1, 2));
        drop(book);
        assert_eq!(o.counts(), vec![(a, 1), (b, 1)]);
    }
}

/// Counters of the ingest path, read by the metrics exporter and the benchmark.
#[derive(Debug, Default)]
pub struct IngestStats {
    /// Events stored for the first time.
    pub accepted: AtomicU64,
    /// Events acknowledged as duplicates.
    pub duplicates: AtomicU64,
    /// Events rejected by validation or by the per-job event cap.
    pub rejected: AtomicU64,
    /// Group commits written.
    pub commits: AtomicU64,
    /// Total time spent in group commits (write + flush), microseconds.
    pub commit_micros: AtomicU64,
    /// Batches refused because the queue was full (`when_full = "reject"`).
    pub refused_full: AtomicU64,
    /// gRPC connections closed at accept because `grpc.max_connections` were open.
    pub connections_refused: AtomicU64,
    /// gRPC connections closed at accept because `grpc.max_connections_per_ip` were open from their address.
    pub connections_refused_per_ip: AtomicU64,
    /// gRPC connections closed at accept because connections held the whole descriptor budget.
    pub connections_refused_descriptors: AtomicU64,
    /// gRPC connections closed because their HTTP/2 handshake did not arrive within `grpc.handshake_timeout`.
    pub connections_timed_out: AtomicU64,
    /// gRPC connections whose TLS handshake failed (no certificate where one is required, a bad certificate,
    /// not TLS at all).
    pub tls_handshake_failures: AtomicU64,
    /// Batches refused because they would take their identity past its open-jobs budget (`max_open_jobs`).
    pub refused_open_jobs: AtomicU64,
    /// Open jobs per identity with an open-jobs budget.
    pub open_jobs: OpenJobs,
}

/// Open jobs per identity, for the identities' open-jobs budgets (`max_open_jobs`). A job is open from its
/// first event until it is done, and counts against the identity whose batch brought the event that made it
/// open (the first one whose identity has a budget); its `done` (from anyone) ends it. Kept by the committer,
/// the only writer; counted from the process's start: a job open before a restart counts again from its next
/// event. About 60-100 bytes per counted job (its id and a number).
#[derive(Debug, Default)]
pub struct OpenJobs(Mutex<OpenJobsBook>);

impl OpenJobs {
    /// The book, locked (the committer holds it for one group at a time; readers briefly).
    pub fn book(&self) -> MutexGuard<'_, OpenJobsBook> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every identity counted so far with its open jobs (for the gauge).
    pub fn counts(&self) -> Vec<(Arc<str>, u64)> {
        let b = self.book();
        b.names.iter().cloned().zip(b.counts.iter().copied()).collect()
    }
}

/// The open jobs of identities with a budget: job id -> identity, and a count per identity.
#[derive(Debug, Default)]
pub struct OpenJobsBook {
    owner_of: HashMap<Box<str>, u32>,
    names: Vec<Arc<str>>,
    numbers: HashMap<Arc<str>, u32>,
    counts: Vec<u64>,
}

impl OpenJobsBook {
    /// Open jobs counted against `identity`.
    pub fn count(&self, identity: &str) -> u64 {
        self.numbers.get(identity).map_or(0, |&n| self.counts[n as usize])
    }

    /// The identity an open job counts against, if it is counted.
    pub fn owner(&self, job_id: &str) -> Option<&Arc<str>> {
        self.owner_of.get(job_id).map(|&n| &self.names[n as usize])
    }

    /// `job_id` is open after an event of `identity`'s batch: counted against it unless it already counts.
    pub fn opened(&mut self, job_id: &str, identity: &Arc<str>) {
        if self.owner_of.contains_key(job_id) {
            return;
        }
        let n = match self.numbers.get(identity) {
            Some(&n) => n,
            None => {
                let n = self.names.len() as u32;
                self.names.push(identity.clone());
                self.numbers.insert(identity.clone(), n);
                self.counts.push(0);
                n
            }
        };
        self.owner_of.insert(job_id.into(), n);
        self.counts[n as usize] += 1;
    }

    /// `job_id` is not open (any more): no longer counted.
    pub fn closed(&mut self, job_id: &str) {
        if let Some(n) = self.owner_of.remove(job_id) {
            self.counts[n as usize] = self.counts[n as usize].saturating_sub(1);
        }
    }

    /// Open jobs counted in all.
    pub fn len(&self) -> usize {
        self.owner_of.len()
    }

    /// Whether no job is counted.
    pub fn is_empty(&self) -> bool {
        self.owner_of.is_empty()
    }
}

impl IngestStats {
    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}
