//! Per-call retries for the cloud adapters' HTTP calls: a throttled (429, AWS `ThrottlingException`, Google
//! `RESOURCE_EXHAUSTED`) or temporarily failed (5xx, transport) call is retried after a jittered exponential
//! backoff ("full jitter": a uniform delay up to `base * 2^attempt`, capped), or after the server's
//! `Retry-After` when it gives one. So one throttled call costs a short wait, not the whole poll; only a call
//! that keeps failing through every attempt fails the poll (and the next poll starts over, losing nothing).

use super::PollError;
use crate::metrics::PollErrorKind;
use std::future::Future;
use std::time::Duration;

/// How a call is retried.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts in all (1: no retry).
    pub attempts: u32,
    /// Backoff unit: attempt `n` (from 0) waits up to `base * 2^n`.
    pub base: Duration,
    /// Longest single wait, `Retry-After` included.
    pub cap: Duration,
}

impl Default for RetryPolicy {
    /// 6 attempts, 250 ms doubling, at most 20 s per wait: about 16 s of waiting at most in expectation.
    fn default() -> Self {
        RetryPolicy { attempts: 6, base: Duration::from_millis(250), cap: Duration::from_secs(20) }
    }
}

/// One failed attempt: the error, and the server's `Retry-After` when it sent one.
#[derive(Debug)]
pub struct Attempt {
    /// What failed.
    pub error: PollError,
    /// The server's requested wait.
    pub retry_after: Option<Duration>,
}

impl From<PollError> for Attempt {
    fn from(error: PollError) -> Attempt {
        Attempt { error, retry_after: None }
    }
}

/// Whether another attempt may succeed: throttling, a 5xx answer, or no answer at all.
pub fn retryable(e: &PollError) -> bool {
    match e.kind {
        PollErrorKind::Throttled | PollErrorKind::Transport => true,
        PollErrorKind::HttpStatus => {
            // PollError::http writes "<provider> answered <status>: ..."
            e.message.split(" answered ").nth(1).and_then(|r| r.get(..3)).is_some_and(|s| s.starts_with('5'))
        }
        _ => false,
    }
}

/// `Retry-After` as seconds (the HTTP-date form is not used by these providers and is ignored).
pub fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let v = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    v.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// The wait before attempt `n + 1` (n from 0): a server's `Retry-After` (capped), else full jitter.
pub fn backoff(p: &RetryPolicy, n: u32, retry_after: Option<Duration>, unit_random: f64) -> Duration {
    if let Some(r) = retry_after {
        return r.min(p.cap);
    }
    let ceiling = p.base.saturating_mul(1u32 << n.min(20)).min(p.cap);
    ceiling.mul_f64(unit_random.clamp(0.0, 1.0))
}

/// Runs `call` until it succeeds, fails with an error that is not [`retryable`], or runs out of attempts;
/// `on_retry` is told of each retried failure (for logs and metrics).
pub async fn with_retries<T, F, Fut>(
    p: &RetryPolicy,
    mut call: F,
    mut on_retry: impl FnMut(&PollError),
) -> Result<T, PollError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Attempt>>,
{
    let mut n = 0;
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(a) if n + 1 < p.attempts.max(1) && retryable(&a.error) => {
                on_retry(&a.error);
                let wait = backoff(p, n, a.retry_after, jitter());
                tracing::debug!(attempt = n + 1, wait_ms = wait.as_millis() as u64, error = %a.error, "retrying");
                tokio::time::sleep(wait).await;
                n += 1;
            }
            Err(a) => return Err(a.error),
        }
    }
}

/// A uniform number in [0, 1) from the clock and a counter (no RNG dependency; jitter needs spread, not quality).
fn jitter() -> f64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mut x = nanos ^ COUNTER.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    // splitmix64 finaliser
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(kind: PollErrorKind, msg: &str) -> PollError {
        PollError::new(kind, msg)
    }

    #[test]
    fn throttling_5xx_and_transport_are_retried_4xx_and_parse_are_not() {
        assert!(retryable(&PollError::http("sagemaker", 400, "{\"__type\":\"ThrottlingException\"}")));
        assert!(retryable(&PollError::http("vertex", 429, "")));
        assert!(retryable(&PollError::http("vertex", 503, "unavailable")));
        assert!(retryable(&err(PollErrorKind::Transport, "connection refused")));
        assert!(!retryable(&PollError::http("vertex", 403, "PERMISSION_DENIED")));
        assert!(!retryable(&PollError::http("vertex", 404, "")));
        assert!(!retryable(&err(PollErrorKind::Parse, "bad json")));
    }

    #[test]
    fn backoff_is_jittered_under_a_doubling_ceiling_and_retry_after_wins() {
        let p = RetryPolicy { attempts: 6, base: Duration::from_millis(100), cap: Duration::from_secs(1) };
        assert_eq!(backoff(&p, 0, None, 1.0), Duration::from_millis(100));
        assert_eq!(backoff(&p, 3, None, 1.0), Duration::from_millis(800));
        assert_eq!(backoff(&p, 4, None, 1.0), Duration::from_secs(1), "capped");
        assert_eq!(backoff(&p, 4, None, 0.5), Duration::from_millis(500));
        assert_eq!(backoff(&p, 2, Some(Duration::from_secs(7)), 0.1), Duration::from_secs(1), "retry-after, capped");
        assert_eq!(backoff(&p, 2, Some(Duration::from_millis(300)), 0.1), Duration::from_millis(300));
        let xs: Vec<f64> = (0..1000).map(|_| jitter()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((0.4..0.6).contains(&mean), "spread over [0, 1): mean {mean}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttled_call_is_retried_until_it_succeeds_and_a_hard_error_stops_at_once() {
        let p = RetryPolicy::default();
        let mut calls = 0;
        let mut retried = 0;
        let v = with_retries(
            &p,
            || {
                calls += 1;
                let n = calls;
                async move {
                    if n < 4 {
                        Err(Attempt::from(PollError::http("vertex", 429, "RESOURCE_EXHAUSTED")))
                    } else {
                        Ok(n)
                    }
                }
            },
            |_| retried += 1,
        )
        .await
        .expect("succeeds on the 4th attempt");
        assert_eq!((v, retried), (4, 3));

        let mut calls = 0;
        let e = with_retries(
            &p,
            || {
                calls += 1;
                async { Err::<(), _>(Attempt::from(PollError::http("vertex", 403, "denied"))) }
            },
            |_| {},
        )
        .await
        .expect_err("403 is final");
        assert_eq!((calls, e.kind), (1, PollErrorKind::HttpStatus));

        let mut calls = 0;
        let e = with_retries(
            &p,
            || {
                calls += 1;
                async { Err::<(), _>(Attempt::from(PollError::http("sagemaker", 400, "ThrottlingException"))) }
            },
            |_| {},
        )
        .await
        .expect_err("throttled on every attempt");
        assert_eq!((calls, e.kind), (6, PollErrorKind::Throttled));
    }
}
