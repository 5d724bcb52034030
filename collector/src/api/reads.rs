//! The gate of the API's large reads: the answers that walk every job (compare, goodput, cost, overview, job
//! listings, chains, nodes) or read a job's events from the store run on blocking threads, at most
//! `http.max_concurrent_reads` at once; the others wait their turn (within the request's `http.request_timeout`).
//! Each such read holds memory of the order of the jobs it walks (a comparison's samples, a listing's page): the
//! gate bounds the memory of many concurrent large reads to that of `max_concurrent_reads`, and keeps tokio's
//! blocking pool (512 threads) from running every one at once on a few cores.

use super::ApiError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Semaphore;

/// Large reads at once when `http.max_concurrent_reads` is not set.
pub const MAX_CONCURRENT_READS: usize = 4;

/// See the module doc. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ReadGate {
    permits: Arc<Semaphore>,
    counts: Arc<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    waiting: AtomicU64,
    running: AtomicU64,
    started: AtomicU64,
}

/// What the gate holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadCounts {
    /// Reads waiting for their turn.
    pub waiting: u64,
    /// Reads running.
    pub running: u64,
    /// Reads started since the collector started.
    pub started: u64,
}

impl ReadGate {
    /// A gate that lets `limit` reads run at once (at least one).
    pub fn new(limit: usize) -> ReadGate {
        ReadGate { permits: Arc::new(Semaphore::new(limit.max(1))), counts: Arc::default() }
    }

    /// What the gate holds now.
    pub fn counts(&self) -> ReadCounts {
        ReadCounts {
            waiting: self.counts.waiting.load(Ordering::Relaxed),
            running: self.counts.running.load(Ordering::Relaxed),
            started: self.counts.started.load(Ordering::Relaxed),
        }
    }

    /// Runs `read` on a blocking thread once a turn is free. The turn is held until `read` returns, even when the
    /// request is abandoned meanwhile (a client that hangs up does not free memory its read still holds).
    pub async fn run<T, F>(&self, read: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let permit = {
            let _waiting = Tally::enter(&self.counts.waiting);
            self.permits.clone().acquire_owned().await.map_err(ApiError::unavailable)?
        };
        self.counts.started.fetch_add(1, Ordering::Relaxed);
        let counts = self.counts.clone();
        tokio::task::spawn_blocking(move || {
            let _running = Tally::enter(&counts.running);
            let out = read();
            drop(permit);
            out
        })
        .await
        .map_err(ApiError::unavailable)
    }
}

/// Counts one in while alive.
struct Tally<'a>(&'a AtomicU64);

impl<'a> Tally<'a> {
    fn enter(n: &'a AtomicU64) -> Tally<'a> {
        n.fetch_add(1, Ordering::Relaxed);
        Tally(n)
    }
}

impl Drop for Tally<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Many reads at once never run more than the limit together, and each one runs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn never_more_than_the_limit_run_at_once() {
        let gate = ReadGate::new(3);
        let now = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..24u64 {
            let (gate, now, peak) = (gate.clone(), now.clone(), peak.clone());
            tasks.push(tokio::spawn(async move {
                gate.run(move || {
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(n, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(5 + i % 4));
                    now.fetch_sub(1, Ordering::SeqCst);
                    i
                })
                .await
            }));
        }
        let mut sum = 0;
        for t in tasks {
            sum += t.await.expect("task").expect("read");
        }
        assert_eq!(sum, (0..24).sum::<u64>());
        assert_eq!(peak.load(Ordering::SeqCst), 3, "peak concurrency");
        assert_eq!(gate.counts(), ReadCounts { waiting: 0, running: 0, started: 24 });
    }

    /// A request abandoned while its read runs keeps its turn until the read ends; one abandoned while waiting
    /// leaves the queue.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_abandoned_read_holds_its_turn_until_it_ends() {
        let gate = ReadGate::new(1);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let g = gate.clone();
        let first = tokio::spawn(async move { g.run(move || rx.recv().is_ok()).await });
        while gate.counts().running == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        first.abort();
        let g = gate.clone();
        let waiting = tokio::spawn(async move { g.run(|| 1).await });
        while gate.counts().waiting == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        waiting.abort();
        let _ = waiting.await;
        assert_eq!(gate.counts().waiting, 0, "an abandoned wait leaves the queue");
        assert_eq!(gate.counts().running, 1, "the abandoned read still runs and holds the turn");
        let g = gate.clone();
        let next = tokio::spawn(async move { g.run(|| 2).await });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!next.is_finished(), "the next read waits for the turn the running read holds");
        tx.send(()).expect("release");
        assert_eq!(next.await.expect("task").expect("read"), 2);
    }
}
