//! Deadline requests: the alert loop keeps the timer of the next SLO deadline, and when one passes it asks the
//! applier to advance the deadline index to that time ([`DeadlineRequests::request`]); the applier does the
//! write under the index write lock (the index has one writer) and wakes the alert loop, which takes the page
//! changes under a read lock. Requests coalesce: only the latest time asked for matters.

use std::sync::Mutex;
use tokio::sync::Notify;

/// Times the alert loop asked the deadline index to be advanced to, for the applier.
#[derive(Debug, Default)]
pub struct DeadlineRequests {
    to: Mutex<Option<i64>>,
    nudge: Notify,
}

impl DeadlineRequests {
    /// Asks for every deadline at or before `now_ms` to be applied, and wakes the applier.
    pub fn request(&self, now_ms: i64) {
        {
            let mut to = self.to.lock().unwrap_or_else(|p| p.into_inner());
            *to = Some(to.map_or(now_ms, |t| t.max(now_ms)));
        }
        self.nudge.notify_one();
    }

    /// The latest time asked for since the last call, if any (the applier).
    pub fn take(&self) -> Option<i64> {
        self.to.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Resolves when a request was made (a request made before the call counts).
    pub async fn requested(&self) {
        self.nudge.notified().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn requests_coalesce_to_the_latest_time_and_wake_the_waiter() {
        let r = DeadlineRequests::default();
        assert_eq!(r.take(), None);
        r.request(10);
        r.request(30);
        r.request(20);
        // The permit stored by the first request wakes a waiter that comes later.
        tokio::time::timeout(std::time::Duration::from_secs(5), r.requested()).await.expect("woken");
        assert_eq!(r.take(), Some(30));
        assert_eq!(r.take(), None);
    }
}
