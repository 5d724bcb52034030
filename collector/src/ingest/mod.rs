//! The ingest path: the gRPC edge ([`service`]) validates batches and hands them to the committer
//! ([`committer`]) over one bounded channel; the committer writes group commits to sled, flushes, updates the
//! job index, and only then answers each batch's ack.
//!
//! In front of the edge: [`conn`] caps and times out connections and closes them all at the end of the
//! shutdown drain; [`codec`] refuses a batch over the event cap before decoding it.

pub mod codec;
pub mod committer;
pub mod conn;
pub mod service;

use std::sync::atomic::{AtomicU64, Ordering};

/// What a full ingest queue does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// Wait for room; backpressure reaches the client through flow control.
    Wait,
    /// Answer `RESOURCE_EXHAUSTED` at once.
    Reject,
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
}

impl IngestStats {
    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}
