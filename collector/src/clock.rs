//! The collector's clock: wall time in Unix milliseconds, advanced by tokio's clock so that tests can pause and
//! advance time (`tokio::time::pause`) and every deadline follows. Read only at the edges (ingest, the alert
//! loop, the API); domain code takes `now_ms` as an argument.

use tokio::time::Instant;

/// A wall clock anchored once, advanced by tokio's monotonic clock.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin_ms: i64,
    origin: Instant,
}

impl Clock {
    /// Anchors to the system's wall clock now.
    pub fn system() -> Self {
        Clock { origin_ms: startline_proto::time::now_ms(), origin: Instant::now() }
    }

    /// Anchors to a given wall time (tests).
    pub fn starting_at(origin_ms: i64) -> Self {
        Clock { origin_ms, origin: Instant::now() }
    }

    /// Now, in Unix milliseconds.
    pub fn now_ms(&self) -> i64 {
        self.origin_ms + Instant::now().saturating_duration_since(self.origin).as_millis() as i64
    }

    /// The tokio instant at which the wall clock reads `ms` (now, if that is in the past).
    pub fn instant_at(&self, ms: i64) -> Instant {
        let now = self.now_ms();
        Instant::now() + std::time::Duration::from_millis((ms - now).max(0) as u64)
    }
}
