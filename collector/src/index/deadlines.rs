//! Requests other tasks make of the applier, the index's one writer. Deadlines: the alert loop keeps the timer of
//! the next SLO deadline, and when one passes it asks the applier to advance the deadline index to that time
//! ([`DeadlineRequests::request`]); the applier does the write under the index write lock and wakes the alert
//! loop, which takes the page changes under a read lock. Requests coalesce: only the latest time asked for
//! matters. New SLO definitions: a reload hands them over ([`DeadlineRequests::request_slos`]) and waits until
//! the applier has installed them between two group commits; a newer reload's definitions replace ones not yet
//! taken (the older reload is told so).

use crate::slo::SloDef;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::Notify;

/// SLO definitions for the applier to install, and where to report how long it took.
#[derive(Debug)]
pub struct SloSwap {
    /// The new definitions.
    pub defs: Vec<SloDef>,
    /// Told the time the swap took, once installed.
    pub done: SyncSender<Duration>,
}

/// Times the alert loop asked the deadline index to be advanced to, for the applier.
#[derive(Debug, Default)]
pub struct DeadlineRequests {
    to: Mutex<Option<i64>>,
    slos: Mutex<Option<SloSwap>>,
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

    /// Hands new SLO definitions to the applier and wakes it; the receiver gets the time the swap took once they
    /// are installed, or disconnects if they never will be (a newer request replaced them, or the applier
    /// stopped).
    pub fn request_slos(&self, defs: Vec<SloDef>) -> Receiver<Duration> {
        let (done, rx) = sync_channel(1);
        *self.slos.lock().unwrap_or_else(|p| p.into_inner()) = Some(SloSwap { defs, done });
        self.nudge.notify_one();
        rx
    }

    /// The SLO definitions waiting to be installed, if any (the applier).
    pub fn take_slos(&self) -> Option<SloSwap> {
        self.slos.lock().unwrap_or_else(|p| p.into_inner()).take()
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

    #[tokio::test]
    async fn a_newer_slo_swap_replaces_one_not_yet_taken_and_the_older_waiter_is_told() {
        let r = DeadlineRequests::default();
        assert!(r.take_slos().is_none());
        let older = r.request_slos(Vec::new());
        let newer = r.request_slos(SloDef::defaults());
        tokio::time::timeout(std::time::Duration::from_secs(5), r.requested()).await.expect("woken");
        assert!(older.recv().is_err(), "the replaced request's waiter is disconnected");
        let swap = r.take_slos().expect("the newer swap");
        assert_eq!(swap.defs.len(), SloDef::defaults().len());
        assert!(r.take_slos().is_none());
        swap.done.send(Duration::from_millis(3)).expect("waiter there");
        assert_eq!(newer.recv(), Ok(Duration::from_millis(3)));
        // A swap taken and dropped (the applier stopping) disconnects its waiter.
        let dropped = r.request_slos(Vec::new());
        drop(r.take_slos());
        assert!(dropped.recv().is_err());
    }
}
