//! The accepted-event feed: after each group commit is durable and applied, the committer hands its new events
//! (log sequence, job id, stored log value, the job's attributes) and the timelines of jobs that ended in it to
//! every subscriber. Subscribers are readers that ship what the collector accepted elsewhere (today the OTLP
//! logs exporter, `export::logs`).
//!
//! The feed never slows ingest: each subscriber has a bounded queue of groups, a group that does not fit is
//! dropped for that subscriber and counted in its [`Subscription::dropped`] (events, not groups), and the
//! committer does no work at all for the feed while nobody subscribes. What a subscriber receives was acknowledged
//! as durable; what it drops is still in the store (the feed is a tap, not the record).

use crate::job::{JobAttrs, Timeline};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One accepted event.
#[derive(Debug, Clone)]
pub struct Accepted {
    /// Its log sequence number (increasing across groups).
    pub seq: u64,
    /// Its job.
    pub job_id: String,
    /// The stored log value (`store::decode_log_value` reads it).
    pub value: Vec<u8>,
    /// The job's attributes once its `submitted` is known.
    pub attrs: Option<Arc<JobAttrs>>,
}

/// What one group commit added.
#[derive(Debug, Default)]
pub struct Group {
    /// The new events, in sequence order.
    pub events: Vec<Accepted>,
    /// Jobs that received a `done` in this group, with their timelines after it.
    pub ended: Vec<(String, Timeline)>,
    /// When the group was applied (the clock's ms).
    pub applied_at_ms: i64,
}

struct Sub {
    tx: tokio::sync::mpsc::Sender<Arc<Group>>,
    dropped: Arc<AtomicU64>,
}

/// The feed (one per collector).
#[derive(Default)]
pub struct Feed {
    subs: Mutex<Vec<Sub>>,
    active: AtomicBool,
}

/// A subscriber's end.
pub struct Subscription {
    /// Groups, in commit order, minus the dropped ones.
    pub rx: tokio::sync::mpsc::Receiver<Arc<Group>>,
    /// Events dropped because this subscriber's queue was full.
    pub dropped: Arc<AtomicU64>,
}

impl Feed {
    /// A feed without subscribers.
    pub fn new() -> Arc<Feed> {
        Arc::new(Feed::default())
    }

    /// Whether anyone subscribes (the committer skips building groups otherwise).
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Subscribes with a queue of `capacity` groups.
    pub fn subscribe(&self, capacity: usize) -> Subscription {
        let (tx, rx) = tokio::sync::mpsc::channel(capacity.max(1));
        let dropped = Arc::new(AtomicU64::new(0));
        let mut subs = self.subs.lock().unwrap_or_else(|p| p.into_inner());
        subs.push(Sub { tx, dropped: dropped.clone() });
        self.active.store(true, Ordering::Relaxed);
        Subscription { rx, dropped }
    }

    /// Hands a group to every subscriber that has room; never waits. Closed subscriptions are forgotten.
    pub fn publish(&self, group: Group) {
        if group.events.is_empty() && group.ended.is_empty() {
            return;
        }
        let n = group.events.len() as u64;
        let group = Arc::new(group);
        let mut subs = self.subs.lock().unwrap_or_else(|p| p.into_inner());
        subs.retain(|s| match s.tx.try_send(group.clone()) {
            Ok(()) => true,
            Err(tokio::sync::mpsc::error::TrySendError::Full(_)) => {
                s.dropped.fetch_add(n, Ordering::Relaxed);
                true
            }
            Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => false,
        });
        self.active.store(!subs.is_empty(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(seqs: std::ops::Range<u64>) -> Group {
        Group {
            events: seqs
                .map(|seq| Accepted { seq, job_id: format!("j{seq}"), value: vec![seq as u8], attrs: None })
                .collect(),
            ended: Vec::new(),
            applied_at_ms: 0,
        }
    }

    #[test]
    fn a_full_subscriber_drops_and_counts_without_blocking_and_others_still_receive() {
        let feed = Feed::new();
        assert!(!feed.active());
        feed.publish(group(0..3)); // nobody listens: nothing happens
        let mut slow = feed.subscribe(1);
        let mut fast = feed.subscribe(8);
        assert!(feed.active());
        feed.publish(group(1..3));
        feed.publish(group(3..6)); // slow is full: dropped for it (3 events)
        feed.publish(group(6..7));
        assert_eq!(slow.dropped.load(Ordering::Relaxed), 4);
        assert_eq!(fast.dropped.load(Ordering::Relaxed), 0);
        let got: Vec<u64> = std::iter::from_fn(|| fast.rx.try_recv().ok())
            .flat_map(|g| g.events.iter().map(|e| e.seq).collect::<Vec<_>>())
            .collect();
        assert_eq!(got, (1..7).collect::<Vec<_>>());
        let first = slow.rx.try_recv().expect("first group");
        assert_eq!(first.events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2]);
        // Closed subscriptions are forgotten; with none left the feed is inactive again.
        drop(slow);
        drop(fast);
        feed.publish(group(7..8));
        assert!(!feed.active());
    }
}
