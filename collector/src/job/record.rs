//! A job's record: its compact events in canonical order, plus the timeline derived from them.
//!
//! Inserting an event costs the same whatever the job's history (a job may hold a million events, and its inserts
//! share the committer with every other job's):
//! - the fold that derived the timeline is kept, so an event that sorts after every other one (the common case:
//!   sources report in time order) is applied to the timeline directly. For long records the fold's state is also
//!   kept every [`MARK_EVERY`] events, so a late event refolds only from the last mark before it. Only a
//!   `submitted` that becomes the job's first refolds everything (it changes every event's effective time),
//!   and a first step that supersedes an earlier one (see [`super::timeline`]) refolds from the one it
//!   supersedes: the fold keeps the earliest first step since the last run-ending event that a stronger one could
//!   supersede, so that costs no scan;
//! - records with more than [`INDEX_MIN`] events keep an id-hash index for the duplicate check. Most jobs have
//!   a few dozen events and keep no index, and no marks.
//!
//! Both are caches: not serialized, not compared, rebuilt when missing. The timeline they produce is always the
//! one [`Timeline::derive`] gives over the record's events.

use super::event::origin_strength;
use super::{CompactEvent, EventKind, Timeline, TimelineFold};

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Records with more events than this keep an id-hash index; smaller ones are scanned.
#[cfg(not(test))]
const INDEX_MIN: usize = 64;
/// Small in unit tests, so the property tests exercise the index.
#[cfg(test)]
const INDEX_MIN: usize = 8;

/// The fold's state is kept before every event whose position is a multiple of this.
#[cfg(not(test))]
const MARK_EVERY: usize = 4096;
/// Small in unit tests, so the property tests exercise refolding from marks.
#[cfg(test)]
const MARK_EVERY: usize = 4;

/// All that is known about one job, as kept in memory and in store snapshots.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct JobRecord {
    /// The job's events, sorted by [`CompactEvent::sort_key`], without duplicates. Change them only through
    /// [`JobRecord`]'s methods (or call [`JobRecord::rederive`] after).
    pub events: Vec<CompactEvent>,
    /// Derived from `events`; kept up to date on every insert.
    #[serde(skip)]
    pub timeline: Timeline,
    /// Where the fold that derived `timeline` left off.
    #[serde(skip)]
    fold: Fold,
    /// Id hash → log sequences, once the record has more than [`INDEX_MIN`] events.
    #[serde(skip)]
    by_hash: Option<Box<HashIndex>>,
}

/// Records are equal when their events and what was derived from them are; the caches do not count.
impl PartialEq for JobRecord {
    fn eq(&self, other: &Self) -> bool {
        self.events == other.events && self.timeline == other.timeline
    }
}

/// The state of the fold over a record's events.
#[derive(Debug, Clone, Default)]
enum Fold {
    /// Unknown (a new or deserialized record, or events changed from outside): the next insert refolds.
    #[default]
    Stale,
    /// The events hold no `submitted`, so the timeline is the default one.
    Unsubmitted,
    /// Every event is folded into the timeline.
    Folded {
        /// The fold after the last event.
        fold: TimelineFold,
        /// The fold before the events at positions `MARK_EVERY`, `2 * MARK_EVERY`, … (in order).
        marks: Vec<Mark>,
    },
}

/// The fold's state before the event at position `at`.
#[derive(Debug, Clone)]
struct Mark {
    at: usize,
    fold: TimelineFold,
    timeline: Timeline,
}

/// Id hash → log sequences. Distinct ids rarely share a hash, so the second and later sequences of a hash go to
/// a separate map that is almost always empty.
#[derive(Debug, Clone, Default)]
struct HashIndex {
    first: HashMap<u64, u64>,
    more: HashMap<u64, Vec<u64>>,
}

impl HashIndex {
    fn of(events: &[CompactEvent]) -> Box<Self> {
        let mut ix = HashIndex { first: HashMap::with_capacity(events.len()), more: HashMap::new() };
        for e in events {
            ix.add(e.id_hash, e.seq);
        }
        Box::new(ix)
    }

    fn add(&mut self, id_hash: u64, seq: u64) {
        match self.first.entry(id_hash) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(seq);
            }
            std::collections::hash_map::Entry::Occupied(_) => self.more.entry(id_hash).or_default().push(seq),
        }
    }
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
        self.seqs_of_hash(id_hash).next()
    }

    /// The log sequences of every event with this id hash (more than one only if distinct ids collide).
    pub fn seqs_of_hash(&self, id_hash: u64) -> impl Iterator<Item = u64> + '_ {
        let (indexed, scanned) = match &self.by_hash {
            Some(ix) => {
                let first = ix.first.get(&id_hash).copied();
                let more = ix.more.get(&id_hash).into_iter().flatten().copied();
                (Some(first.into_iter().chain(more)), None)
            }
            None => (None, Some(self.events.iter().filter(move |e| e.id_hash == id_hash).map(|e| e.seq))),
        };
        indexed.into_iter().flatten().chain(scanned.into_iter().flatten())
    }

    /// Inserts an event unless one with the same id hash is present.
    pub fn insert(&mut self, ev: CompactEvent) -> InsertOutcome {
        if let Some(existing_seq) = self.seq_of_hash(ev.id_hash) {
            return InsertOutcome::SameHash { existing_seq };
        }
        self.insert_unchecked(ev);
        InsertOutcome::Inserted
    }

    /// Inserts an event known to be new (its id was checked against the stored events), and brings the timeline
    /// up to date: directly if the event sorts last, else by refolding from the last mark before it.
    pub fn insert_unchecked(&mut self, ev: CompactEvent) {
        let key = ev.sort_key();
        let is_submitted = matches!(ev.kind, EventKind::Submitted(_));
        // Whether an earlier first step's decision (superseded or not) may change, as the strength a first step
        // must have to be superseded by this event: a first step supersedes weaker ones before it; an event that
        // ends a run, put between a first step and a stronger one, un-supersedes it.
        let supersedes = match &ev.kind {
            EventKind::FirstStep { origin, .. } => Some(origin_strength(*origin)),
            k if k.ends_run() => Some(u8::MAX),
            _ => None,
        };
        let pos = if self.events.last().is_none_or(|e| e.sort_key() <= key) {
            self.events.len()
        } else {
            self.events.partition_point(|e| e.sort_key() <= key)
        };
        match &mut self.by_hash {
            Some(ix) => ix.add(ev.id_hash, ev.seq),
            None if self.events.len() >= INDEX_MIN => {
                let mut ix = HashIndex::of(&self.events);
                ix.add(ev.id_hash, ev.seq);
                self.by_hash = Some(ix);
            }
            None => {}
        }
        self.events.insert(pos, ev);
        match &mut self.fold {
            // Nothing is derived before the `submitted`.
            Fold::Unsubmitted if !is_submitted => {}
            // A new first `submitted` changes when every event counts from.
            Fold::Folded { fold, .. } if is_submitted && key < fold.submitted_key() => self.refold_from(0),
            Fold::Folded { fold, marks } if pos + 1 == self.events.len() => {
                // Last: only a first step can change what came before (an event that ends a run after all the
                // others separates nothing).
                let weak = match &self.events[pos].kind {
                    EventKind::FirstStep { origin, .. } => fold.weak_first_step_since(origin_strength(*origin)),
                    _ => None,
                };
                if let Some(weak) = weak {
                    let from = self.events.partition_point(|e| e.at_ms < weak);
                    self.refold_from(from);
                    return;
                }
                if pos % MARK_EVERY == 0 && pos > 0 && marks.last().is_none_or(|m| m.at < pos) {
                    marks.push(Mark { at: pos, fold: fold.clone(), timeline: self.timeline.clone() });
                }
                fold.apply(&mut self.timeline, &self.events[pos], &[]);
                fold.finish(&mut self.timeline);
            }
            Fold::Folded { marks, .. } => {
                // The refold from `pos` starts at the last mark at or before it and re-decides every first step
                // from there; one before the mark that this event may re-decide is the mark's weak first step.
                let mark = marks.iter().rev().find(|m| m.at <= pos);
                let weak = mark.zip(supersedes).and_then(|(m, s)| m.fold.weak_first_step_since(s));
                let from = weak.map_or(pos, |w| self.events.partition_point(|e| e.at_ms < w).min(pos));
                self.refold_from(from)
            }
            Fold::Stale | Fold::Unsubmitted => self.refold_from(0),
        }
    }

    /// Recomputes the timeline (and the caches) from the events.
    pub fn rederive(&mut self) {
        self.fold = Fold::Stale;
        self.by_hash = (self.events.len() > INDEX_MIN).then(|| HashIndex::of(&self.events));
        self.refold_from(0);
    }

    /// Refolds the events from the last mark at or before position `pos` (the events before `pos` are the ones
    /// folded when the mark was taken), keeping new marks on the way.
    fn refold_from(&mut self, pos: usize) {
        let resumed = match std::mem::take(&mut self.fold) {
            Fold::Folded { mut marks, .. } => {
                marks.truncate(marks.partition_point(|m| m.at <= pos));
                marks.last().map(|m| (m.fold.clone(), m.timeline.clone(), m.at)).map(|(f, t, at)| (f, t, at, marks))
            }
            Fold::Stale | Fold::Unsubmitted => None,
        };
        let (mut fold, mut t, from, mut marks) = match resumed {
            Some(r) => r,
            None => match TimelineFold::start(&self.events) {
                Some((f, t)) => (f, t, 0, Vec::new()),
                None => {
                    self.timeline = Timeline::default();
                    self.fold = Fold::Unsubmitted;
                    return;
                }
            },
        };
        for (i, ev) in self.events.iter().enumerate().skip(from) {
            if i % MARK_EVERY == 0 && i > from {
                marks.push(Mark { at: i, fold: fold.clone(), timeline: t.clone() });
            }
            fold.apply(&mut t, ev, &self.events[i + 1..]);
        }
        fold.finish(&mut t);
        self.timeline = t;
        self.fold = Fold::Folded { fold, marks };
    }
}
