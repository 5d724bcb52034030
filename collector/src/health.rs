//! The collector's health as /healthz, /readyz and self-metrics report it: whether storage writes are failing
//! (and why, in words safe to show a client), whether they are halted for the life of the process
//! ([`WriteHalt`]), and whether the committer thread is still alive. Written by the applier (committer and
//! checkpointer) and the store, read by the ingest edge, the API and the exporter. Also the ingest counters
//! ([`IngestStats`]), written by the edge and the applier and read by the exporter.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

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
}

impl IngestStats {
    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}
