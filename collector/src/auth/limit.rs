//! Per-identity rate limits: a token bucket refilled at `per_second`, holding at most `burst`. A request that
//! needs more than the bucket holds is refused whole (a batch is never half-accepted for a rate limit) with the
//! time until it would fit.

use std::time::Instant;

/// A rate: units per second, and the most that may be taken at once after a quiet spell.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateSpec {
    /// Refill rate, units per second (> 0).
    pub per_second: f64,
    /// Capacity (>= 1).
    pub burst: f64,
}

/// One identity's bucket.
#[derive(Debug, Clone)]
pub struct Bucket {
    level: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket.
    pub fn full(spec: RateSpec, now: Instant) -> Bucket {
        Bucket { level: spec.burst, at: now }
    }

    /// Takes `n` units, or says in how many milliseconds they would be available. A request larger than the
    /// burst is measured against the burst (it can pass once the bucket is full), so it is never refused forever.
    pub fn take(&mut self, spec: RateSpec, n: u64, now: Instant) -> Result<(), u64> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + elapsed * spec.per_second).min(spec.burst);
        self.at = now;
        let need = (n as f64).min(spec.burst);
        if self.level >= need {
            self.level -= n as f64;
            Ok(())
        } else {
            let wait = (need - self.level) / spec.per_second;
            Err((wait * 1000.0).ceil().max(1.0) as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate_and_names_the_wait() {
        let spec = RateSpec { per_second: 10.0, burst: 20.0 };
        let t0 = Instant::now();
        let mut b = Bucket::full(spec, t0);
        assert_eq!(b.take(spec, 20, t0), Ok(()));
        // Empty: 5 units take 500 ms to refill.
        assert_eq!(b.take(spec, 5, t0), Err(500));
        assert_eq!(b.take(spec, 5, t0 + Duration::from_millis(499)), Err(1));
        assert_eq!(b.take(spec, 5, t0 + Duration::from_millis(500)), Ok(()));
        // Never above the burst, however long the quiet spell.
        assert_eq!(b.take(spec, 21, t0 + Duration::from_secs(3600)), Ok(()));
        // A request larger than the burst went through once the bucket was full; the debt is paid back first.
        assert!(b.take(spec, 1, t0 + Duration::from_secs(3600)).is_err());
    }
}
