//! A job's record: its compact events in canonical order, plus the timeline derived from them.

use super::{CompactEvent, Timeline};

use serde::{Deserialize, Serialize};

/// All that is known about one job, as kept in memory and in store snapshots.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// The job's events, sorted by [`CompactEvent::sort_key`], without duplicates.
    pub events: Vec<CompactEvent>,
    /// Derived from `events`; recomputed on every insert.
    #[serde(skip)]
    pub timeline: Timeline,
    /// The job's current contribution to each SLO that covers it (kept by [`crate::slo::SloEngine`]).
    #[serde(skip)]
    pub slo: Vec<crate::slo::Contribution>,
    /// What the metrics last saw of the job (kept by [`crate::export::jobs`]).
    #[serde(skip)]
    pub metrics: Option<crate::export::jobs::Footprint>,
}

/// What happened when an event was offered to a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertOutcome {
    /// The event was new and was inserted.
    Inserted,
    /// An event with the same id hash is already there (at the given log sequence); the caller must confirm it is
    /// the same event id before treating it as a duplicate.
    SameHash { existing_seq: u64 },
}

impl JobRecord {
    /// Builds a record from events in any order (used when restoring). The same stored event seen twice (same
    /// log sequence) is kept once; distinct events are all kept, even if their id hashes collide.
    pub fn from_events(mut events: Vec<CompactEvent>) -> Self {
        events.sort_by_key(|e| (e.sort_key(), e.seq));
        events.dedup_by_key(|e| (e.seq, e.id_hash));
        let mut r = JobRecord { events, ..Default::default() };
        r.rederive();
        r
    }

    /// The log sequence of an event with this id hash, if the record has one.
    pub fn seq_of_hash(&self, id_hash: u64) -> Option<u64> {
        self.events.iter().find(|e| e.id_hash == id_hash).map(|e| e.seq)
    }

    /// The log sequences of every event with this id hash (more than one only if distinct ids collide).
    pub fn seqs_of_hash(&self, id_hash: u64) -> impl Iterator<Item = u64> + '_ {
        self.events.iter().filter(move |e| e.id_hash == id_hash).map(|e| e.seq)
    }

    /// Inserts an event unless one with the same id hash is present.
    pub fn insert(&mut self, ev: CompactEvent) -> InsertOutcome {
        if let Some(existing_seq) = self.seq_of_hash(ev.id_hash) {
            return InsertOutcome::SameHash { existing_seq };
        }
        self.insert_unchecked(ev);
        InsertOutcome::Inserted
    }

    /// Inserts an event known to be new (its id was checked against the stored events).
    pub fn insert_unchecked(&mut self, ev: CompactEvent) {
        let key = ev.sort_key();
        let pos = self.events.partition_point(|e| e.sort_key() <= key);
        self.events.insert(pos, ev);
        self.rederive();
    }

    /// Recomputes the timeline from the events.
    pub fn rederive(&mut self) {
        self.timeline = Timeline::derive(&self.events);
    }
}
