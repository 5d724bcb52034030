//! The pure job domain: the compact form of lifecycle events kept per job, the record that holds a job's
//! events, and the timeline derived from them. No I/O and no clock reads: time arrives as data.
//!
//! A job's timeline is a function of the *set* of its events: events are kept sorted by
//! `(occurred_at, lifecycle rank, event id hash)` and folded from the start, so arrival order and duplicates do
//! not change the result, and events that arrive before `submitted` take effect once it comes.

mod event;
mod record;
mod timeline;

pub use event::{CompactEvent, EventKind, JobAttrs};
pub use record::{InsertOutcome, JobRecord};
pub use timeline::{JobState, Segment, Timeline};

/// A stable 64-bit hash of an event id: the in-memory duplicate index. A match is confirmed against the stored
/// event before an event is called a duplicate, so a collision never loses an event.
pub fn event_id_hash(event_id: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    // DefaultHasher::new() is SipHash with fixed keys: stable within one build, which is all the in-memory
    // index needs. The hash is also persisted in job snapshots; a toolchain change that altered it would only
    // weaken duplicate detection for old events, and snapshots record the hash algorithm version.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    event_id.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests;
