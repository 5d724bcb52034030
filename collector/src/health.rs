//! The collector's health as /healthz, /readyz and self-metrics report it: whether storage writes are failing
//! (and why, in words safe to show a client), and whether the committer thread is still alive. Written by the
//! applier (committer and checkpointer), read by the API and the exporter. Also the ingest counters
//! ([`IngestStats`]), written by the edge and the applier and read by the exporter.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// Shared health state. Cheap to read.
#[derive(Debug, Default)]
pub struct Health {
    /// Set when the last storage write failed; cleared by the next one that succeeds.
    storage_failing: AtomicBool,
    /// The cause of the last storage failure ("no space left on device").
    storage_cause: Mutex<Option<&'static str>>,
    /// Set for good if the committer thread panicked.
    committer_dead: AtomicBool,
    /// Storage write failures so far (group commits, checkpoints, retention, reopen attempts).
    storage_errors: AtomicU64,
    /// Times the store was reopened after a failure.
    reopens: AtomicU64,
}

impl Health {
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

    /// Records that the store was reopened.
    pub fn reopened(&self) {
        self.reopens.fetch_add(1, Ordering::Relaxed);
    }

    /// Records that the committer thread died: the collector cannot acknowledge anything until restarted.
    pub fn committer_died(&self) {
        self.committer_dead.store(true, Ordering::Relaxed);
    }

    /// Whether the collector can acknowledge events now.
    pub fn is_healthy(&self) -> bool {
        !self.storage_failing.load(Ordering::Relaxed) && !self.committer_dead.load(Ordering::Relaxed)
    }

    /// Why not, in words safe to show a client; `None` when healthy.
    pub fn problem(&self) -> Option<String> {
        if self.committer_dead.load(Ordering::Relaxed) {
            return Some("committer stopped; restart the collector".to_string());
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

    /// Times the store was reopened after a failure.
    pub fn reopens(&self) -> u64 {
        self.reopens.load(Ordering::Relaxed)
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
