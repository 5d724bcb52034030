//! The accepted-event feed: after each group commit is durable and applied, the committer hands its new events
//! (log sequence, job id, stored log value, the job's attributes) and the timelines of jobs that ended in it to
//! every subscriber. Subscribers are readers that ship what the collector accepted elsewhere (today the OTLP
//! logs exporter, `export::logs`).
//!
//! The feed never slows ingest: each subscriber has a queue bounded in events (memory follows events, not group
//! commits), a group that does not fit is dropped for that subscriber and counted in its
//! [`Subscription::dropped`] (events, not groups), and the committer does no work at all for the feed while nobody
//! subscribes. What a subscriber receives was acknowledged
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
    tx: tokio::sync::mpsc::UnboundedSender<Arc<Group>>,
    /// Events handed over and not yet received.
    queued: Arc<AtomicU64>,
    /// Most events queued at once.
    max_events: u64,
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
    rx: tokio::sync::mpsc::UnboundedReceiver<Arc<Group>>,
    queued: Arc<AtomicU64>,
    /// Events dropped because this subscriber's queue was full.
    pub dropped: Arc<AtomicU64>,
}

impl Subscription {
    fn taken(&self, g: Arc<Group>) -> Arc<Group> {
        self.queued.fetch_sub(g.events.len() as u64, Ordering::Relaxed);
        g
    }

    /// The next group, in commit order (dropped ones skipped); `None` once the feed is gone.
    pub async fn recv(&mut self) -> Option<Arc<Group>> {
        let g = self.rx.recv().await?;
        Some(self.taken(g))
    }

    /// The next group if one is queued.
    pub fn try_recv(&mut self) -> Option<Arc<Group>> {
        let g = self.rx.try_recv().ok()?;
        Some(self.taken(g))
    }
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

    /// Subscribes with a queue of at most `max_events` events (a group larger than that on its own is still
    /// taken when the queue is empty, so a huge group commit is never dropped for its size alone): memory is
    /// bounded by events, not by group commits, whose sizes vary by four orders of magnitude.
    pub fn subscribe(&self, max_events: usize) -> Subscription {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let dropped = Arc::new(AtomicU64::new(0));
        let queued = Arc::new(AtomicU64::new(0));
        let mut subs = self.subs.lock().unwrap_or_else(|p| p.into_inner());
        subs.push(Sub { tx, queued: queued.clone(), max_events: max_events.max(1) as u64, dropped: dropped.clone() });
        self.active.store(true, Ordering::Relaxed);
        Subscription { rx, queued, dropped }
    }

    /// Hands a group to every subscriber that has room; never waits. Closed subscriptions are forgotten.
    pub fn publish(&self, group: Group) {
        if group.events.is_empty() && group.ended.is_empty() {
            return;
        }
        let n = group.events.len() as u64;
        let group = Arc::new(group);
        let mut subs = self.subs.lock().unwrap_or_else(|p| p.into_inner());
        subs.retain(|s| {
            let queued = s.queued.load(Ordering::Relaxed);
            if queued > 0 && queued + n > s.max_events {
                s.dropped.fetch_add(n, Ordering::Relaxed);
                return !s.tx.is_closed();
            }
            s.queued.fetch_add(n, Ordering::Relaxed);
            if s.tx.send(group.clone()).is_err() {
                return false;
            }
            true
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
        let mut slow = feed.subscribe(2);
        let mut fast = feed.subscribe(100);
        assert!(feed.active());
        feed.publish(group(1..3)); // 2 events: slow is now full
        feed.publish(group(3..6)); // dropped for slow (3 events)
        feed.publish(group(6..7)); // dropped for slow (1 event)
        assert_eq!(slow.dropped.load(Ordering::Relaxed), 4);
        assert_eq!(fast.dropped.load(Ordering::Relaxed), 0);
        let got: Vec<u64> = std::iter::from_fn(|| fast.try_recv())
            .flat_map(|g| g.events.iter().map(|e| e.seq).collect::<Vec<_>>())
            .collect();
        assert_eq!(got, (1..7).collect::<Vec<_>>());
        let first = slow.try_recv().expect("first group");
        assert_eq!(first.events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2]);
        // Received: room again; a group larger than the whole budget still goes to an empty queue.
        feed.publish(group(7..12));
        assert_eq!(slow.try_recv().map(|g| g.events.len()), Some(5));
        assert_eq!(slow.dropped.load(Ordering::Relaxed), 4);
        // Closed subscriptions are forgotten; with none left the feed is inactive again.
        drop(slow);
        drop(fast);
        feed.publish(group(12..13));
        assert!(!feed.active());
    }
}
