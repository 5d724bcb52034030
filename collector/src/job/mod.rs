//! The pure job domain: the compact form of lifecycle events kept per job, the record that holds a job's
//! events, and the timeline derived from them. No I/O and no clock reads: time arrives as data.
//!
//! A job's timeline is a function of the *set* of its events: events are kept sorted by
//! `(occurred_at, lifecycle rank, event id hash)` and folded from the start, so arrival order and duplicates do
//! not change the result, and events that arrive before `submitted` take effect once it comes.

pub mod chain;
mod event;
pub mod goodput;
pub mod nodes;
mod record;
mod timeline;
mod update;

pub use event::{CompactEvent, EventKind, JobAttrs};
pub use record::{InsertOutcome, JobRecord};
pub use timeline::{JobState, Placement, PlacementEnd, Segment, SegmentTotals, Timeline, TimelineFold};

/// The 64-bit hash of an event id: FNV-1a 64 of its UTF-8 bytes ([`startline_proto::hash`]), fixed by its
/// specification so the hashes persisted in job snapshots never change meaning. It orders ties and indexes
/// duplicates; FNV is not collision-resistant, so a match is always confirmed against the stored event id before
/// an event is called a duplicate, and records keep every event whose id collides.
pub fn event_id_hash(event_id: &str) -> u64 {
    startline_proto::hash::fnv1a64(event_id.as_bytes())
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod update_tests;
