//! Folded ("cold") jobs: ended jobs whose events left memory, each kept as one packed [`Row`], plus the
//! interned job attributes and node names the rows point to. Owns both stored codecs: the summary body (a
//! [`Folded`], sealed by the store in its summary packs) and the attribute dictionary entries (its `dictionary`
//! tree).
//!
//! A [`Folded`] holds everything of a done job's [`Timeline`] and gives back exactly the timeline it was made
//! from (a property test checks it), so readers see a folded job as they saw it hot, and the SLO contributions
//! and metric footprints of a folded job are recomputed from it when needed instead of kept. In memory it is
//! kept as a [`Row`]: the four times scans judge a job by (submit, first step, end, and the summary number) as
//! plain fields, everything else packed into a few dozen bytes of varints (times as offsets from the submit,
//! node names as numbers into a table the rows share). ~150 bytes a folded job in all, against ~570 as a struct
//! with its own allocations (BENCHMARKS.md, run 16); a fill decodes the packed bytes straight into a
//! [`Timeline`].

use crate::job::{JobAttrs, JobState, Placement, PlacementEnd, Segment, Timeline};
use serde::{Deserialize, Serialize};
use startline_proto::pb;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// "No value" in an `i64` time field of a row.
const NONE: i64 = i64::MIN;
/// The summary body's format (inside the store's pack): `SUMMARY_FORMAT ++ postcard((Disk, [checkpoint save ms,
/// failed-run ms], placements))`.
const SUMMARY_FORMAT: u8 = 3;

/// One folded job. Times are Unix milliseconds, [`NONE`] when absent.
#[derive(Debug, Clone, PartialEq)]
pub struct Folded {
    /// Index into the attribute dictionary.
    pub attrs: u32,
    submitted_at: i64,
    done_at: i64,
    first_step_at: i64,
    first_queued_at: i64,
    node_assigned_at: i64,
    preparing_at: i64,
    checkpoint_at: i64,
    checkpoint_step: u64,
    requeue_wait_ms: i64,
    lost_work_ms: i64,
    checkpoint_save_ms: i64,
    failed_work_ms: i64,
    lost_steps: u64,
    max_step: u64,
    runs: u32,
    attempts: u32,
    preemptions: u32,
    node_losses: u32,
    ignored_after_done: u32,
    exit_code: i32,
    /// `pb::Outcome` as i32.
    outcome: i32,
    /// Bit 0: has exit code; bit 1: has max step; bit 2: has outcome; bits 3-4: the first step's origin
    /// (`pb::StepOrigin` as i32; 0, unspecified, in summaries written before origins existed).
    flags: u8,
    /// The initial wait by segment, in segment order.
    waits: Box<[(Segment, i64)]>,
    /// Where it ran.
    placements: Box<[Placement]>,
    /// The number of its summary in the store (from 1; 0 while it has none); not part of the summary body.
    summary: u64,
}

fn opt(v: i64) -> Option<i64> {
    (v != NONE).then_some(v)
}

/// The flag bits (3-4) that keep a first step's origin.
fn origin_bits(origin: Option<pb::StepOrigin>) -> u8 {
    ((origin.unwrap_or_default() as i32 & 3) as u8) << 3
}

/// The first step's origin from a row's flags, for a job that started (`first_step_at`).
fn origin_of(flags: u8, first_step_at: Option<i64>) -> Option<pb::StepOrigin> {
    first_step_at.map(|_| pb::StepOrigin::try_from(i32::from((flags >> 3) & 3)).unwrap_or_default())
}

impl Folded {
    #[cfg(test)]
    /// When the job ended.
    pub fn done_at(&self) -> i64 {
        self.done_at
    }

    #[cfg(test)]
    /// When the job was submitted.
    pub fn submitted_at(&self) -> i64 {
        self.submitted_at
    }

    #[cfg(test)]
    /// When it reached its first training step, if it did.
    pub fn first_step_at(&self) -> Option<i64> {
        opt(self.first_step_at)
    }

    #[cfg(test)]
    /// Its time to first step, as [`Timeline::time_to_first_step_ms`] gives it.
    pub fn time_to_first_step_ms(&self) -> Option<i64> {
        Some(self.first_step_at()? - self.submitted_at)
    }

    /// The number of its summary in the store (see [`Folded::with_summary`]).
    pub fn summary(&self) -> u64 {
        self.summary
    }

    /// The row with its stored summary's number (the store assigns it when it writes the summary).
    pub fn with_summary(mut self, summary: u64) -> Folded {
        self.summary = summary;
        self
    }

    #[cfg(test)]
    /// How many placements the row keeps.
    pub fn placements_len(&self) -> usize {
        self.placements.len()
    }

    /// The row of a done timeline with its attributes interned as `attrs`; `None` unless the job is done and
    /// submitted.
    pub fn of(t: &Timeline, attrs: u32) -> Option<Folded> {
        if t.state != JobState::Done || t.attrs.is_none() || t.current_wait.is_some() {
            return None;
        }
        let mut flags = 0;
        if t.exit_code.is_some() {
            flags |= 1;
        }
        if t.max_step.is_some() {
            flags |= 2;
        }
        if t.outcome.is_some() {
            flags |= 4;
        }
        flags |= origin_bits(t.first_step_origin);
        Some(Folded {
            attrs,
            submitted_at: t.submitted_at?,
            done_at: t.done_at?,
            first_step_at: t.first_step_at.unwrap_or(NONE),
            first_queued_at: t.first_queued_at.unwrap_or(NONE),
            node_assigned_at: t.node_assigned_at.unwrap_or(NONE),
            preparing_at: t.preparing_at.unwrap_or(NONE),
            checkpoint_at: t.last_checkpoint.map_or(NONE, |c| c.0),
            checkpoint_step: t.last_checkpoint.map_or(0, |c| c.1),
            requeue_wait_ms: t.requeue_wait_ms,
            lost_work_ms: t.lost_work_ms,
            checkpoint_save_ms: t.checkpoint_save_ms,
            failed_work_ms: t.failed_work_ms,
            lost_steps: t.lost_steps,
            max_step: t.max_step.unwrap_or(0),
            runs: t.runs,
            attempts: t.attempts,
            preemptions: t.preemptions,
            node_losses: t.node_losses,
            ignored_after_done: t.ignored_after_done,
            exit_code: t.exit_code.unwrap_or(0),
            outcome: t.outcome.map_or(0, |o| o as i32),
            flags,
            waits: t.initial_wait_ms.iter().map(|(s, ms)| (*s, *ms)).collect(),
            placements: t.placements.iter().cloned().collect(),
            summary: 0,
        })
    }

    #[cfg(test)]
    /// Writes the job's timeline into `t` (reusing its allocations), with `attrs` as its attributes.
    pub fn fill(&self, attrs: &Arc<JobAttrs>, t: &mut Timeline) {
        self.fill_with(attrs, t, true)
    }

    #[cfg(test)]
    /// [`Folded::fill`], leaving `placements` empty unless asked for: copying them clones every node name, which
    /// is most of a scan's cost per folded job, and only the node report reads them.
    pub fn fill_with(&self, attrs: &Arc<JobAttrs>, t: &mut Timeline, placements: bool) {
        t.state = JobState::Done;
        if !t.attrs.as_ref().is_some_and(|a| Arc::ptr_eq(a, attrs)) {
            t.attrs = Some(attrs.clone());
        }
        t.submitted_at = Some(self.submitted_at);
        t.first_queued_at = opt(self.first_queued_at);
        t.node_assigned_at = opt(self.node_assigned_at);
        t.preparing_at = opt(self.preparing_at);
        t.first_step_at = opt(self.first_step_at);
        t.first_step_origin = origin_of(self.flags, t.first_step_at);
        t.last_checkpoint = opt(self.checkpoint_at).map(|at| (at, self.checkpoint_step));
        t.done_at = Some(self.done_at);
        t.outcome = (self.flags & 4 != 0).then(|| pb::Outcome::try_from(self.outcome).unwrap_or_default());
        t.exit_code = (self.flags & 1 != 0).then_some(self.exit_code);
        t.current_wait = None;
        t.wait_started_at = None;
        t.current_raw_reason = None;
        t.current_estimated_start = None;
        t.initial_wait_ms.clear();
        t.initial_wait_ms.extend(self.waits.iter().copied());
        t.requeue_wait_ms = self.requeue_wait_ms;
        t.runs = self.runs;
        t.attempts = self.attempts;
        t.preemptions = self.preemptions;
        t.node_losses = self.node_losses;
        t.lost_work_ms = self.lost_work_ms;
        t.checkpoint_save_ms = self.checkpoint_save_ms;
        t.failed_work_ms = self.failed_work_ms;
        t.lost_steps = self.lost_steps;
        t.max_step = (self.flags & 2 != 0).then_some(self.max_step);
        t.ignored_after_done = self.ignored_after_done;
        t.placements.clear();
        if placements {
            t.placements.extend(self.placements.iter().cloned());
        }
    }

    /// The stored summary body.
    pub fn encode(&self) -> Vec<u8> {
        let disk = Disk {
            attrs: self.attrs,
            times: [
                self.submitted_at,
                self.done_at,
                self.first_step_at,
                self.first_queued_at,
                self.node_assigned_at,
                self.preparing_at,
                self.checkpoint_at,
            ],
            counts: [self.checkpoint_step, self.lost_steps, self.max_step],
            requeue_wait_ms: self.requeue_wait_ms,
            lost_work_ms: self.lost_work_ms,
            small: [self.runs, self.attempts, self.preemptions, self.node_losses, self.ignored_after_done],
            exit_code: self.exit_code,
            outcome: self.outcome,
            flags: self.flags,
            waits: self.waits.iter().map(|(s, ms)| (*s, *ms)).collect(),
        };
        let mut out = vec![SUMMARY_FORMAT];
        // Serializing plain integers and enums into a Vec cannot fail.
        let placements: &[Placement] = &self.placements;
        out.extend(
            postcard::to_stdvec(&(disk, [self.checkpoint_save_ms, self.failed_work_ms], placements))
                .unwrap_or_default(),
        );
        out
    }

    /// Decodes a stored summary body.
    pub fn decode(body: &[u8]) -> Result<Folded, String> {
        let (d, [checkpoint_save_ms, failed_work_ms], placements) = match body.split_first() {
            Some((&SUMMARY_FORMAT, rest)) => {
                postcard::from_bytes::<(Disk, [i64; 2], Vec<Placement>)>(rest).map_err(|e| e.to_string())?
            }
            _ => return Err(format!("unknown summary format {:?}", body.first())),
        };
        let [submitted_at, done_at, first_step_at, first_queued_at, node_assigned_at, preparing_at, checkpoint_at] =
            d.times;
        let [checkpoint_step, lost_steps, max_step] = d.counts;
        let [runs, attempts, preemptions, node_losses, ignored_after_done] = d.small;
        Ok(Folded {
            attrs: d.attrs,
            submitted_at,
            done_at,
            first_step_at,
            first_queued_at,
            node_assigned_at,
            preparing_at,
            checkpoint_at,
            checkpoint_step,
            requeue_wait_ms: d.requeue_wait_ms,
            lost_work_ms: d.lost_work_ms,
            checkpoint_save_ms,
            failed_work_ms,
            lost_steps,
            max_step,
            runs,
            attempts,
            preemptions,
            node_losses,
            ignored_after_done,
            exit_code: d.exit_code,
            outcome: d.outcome,
            flags: d.flags,
            waits: d.waits.into_boxed_slice(),
            placements: placements.into_boxed_slice(),
            summary: 0,
        })
    }
}

/// The summary as stored (postcard: integers as varints).
#[derive(Serialize, Deserialize)]
struct Disk {
    attrs: u32,
    times: [i64; 7],
    counts: [u64; 3],
    requeue_wait_ms: i64,
    lost_work_ms: i64,
    small: [u32; 5],
    exit_code: i32,
    outcome: i32,
    flags: u8,
    waits: Vec<(Segment, i64)>,
}

/// Job attributes by number, shared by folded rows: one entry per distinct attribute set, which fleets repeat
/// (same pool, team, project); chain ids and per-job labels make one per chain or job. Numbers are persisted in
/// summaries and never handed out twice. [`ColdJobs`] counts the rows that point to each entry: one no row points
/// to any more is *freed* (dropped from memory; its number waits in [`Dictionary::take_freed`] for the store to
/// delete it once the deletions that freed it are durable), so the dictionary never outgrows the rows. A summary
/// that still names a freed number is a hot job's stale one: restore rebuilds such a job from its events.
#[derive(Debug, Default)]
pub struct Dictionary {
    /// Entries by number; `None`: freed (or a gap in the store's numbers).
    list: Vec<Option<Arc<JobAttrs>>>,
    /// Rows pointing to each entry.
    refs: Vec<u32>,
    ids: HashMap<Arc<JobAttrs>, u32>,
    /// Entries below this number are in the store.
    persisted: u32,
    /// Estimated bytes of the entries (see [`attrs_bytes`]).
    bytes: usize,
    /// Live entries.
    live: usize,
    /// Stored entries freed since the last [`Dictionary::take_freed`].
    freed: Vec<u32>,
    /// Sets the store held under more than one number (see [`Dictionary::load_with_next`]), with the live
    /// numbers: when the one `ids` maps to is freed, it maps to another.
    dups: HashMap<Arc<JobAttrs>, Vec<u32>>,
}

/// Estimated bytes of one dictionary entry: the attributes behind their `Arc`, their strings and labels, and the
/// entry's share of the list and the map.
fn attrs_bytes(a: &JobAttrs) -> usize {
    const STRING: usize = 16;
    let strings = [&a.provider, &a.pool, &a.gpu_class, &a.region, &a.team, &a.project, &a.chain_id, &a.chain_stage];
    let labels: usize = a.labels.iter().map(|(k, v)| 48 + k.len() + v.len() + 2 * STRING).sum();
    std::mem::size_of::<JobAttrs>() + 16 + 8 + 32 + strings.iter().map(|s| s.len()).sum::<usize>() + labels
}

impl Dictionary {
    /// The number of an attribute set, adding it if new.
    pub fn intern(&mut self, a: &Arc<JobAttrs>) -> u32 {
        if let Some(id) = self.ids.get(a) {
            return *id;
        }
        let id = self.list.len() as u32;
        self.bytes += attrs_bytes(a);
        self.live += 1;
        self.list.push(Some(a.clone()));
        self.refs.push(0);
        self.ids.insert(a.clone(), id);
        id
    }

    /// Holds entry `id` for a row about to be made from it (a fold writes the summary naming it first): it
    /// cannot be freed meanwhile. [`ColdJobs::insert_pinned`] hands the hold to the row; [`Dictionary::unpin`]
    /// gives it back if no row is made.
    pub fn pin(&mut self, id: u32) {
        self.add_ref(id);
    }

    /// Gives back a [`Dictionary::pin`] (which may free the entry).
    pub fn unpin(&mut self, id: u32) {
        self.drop_ref(id);
    }

    /// One more row points to entry `id`.
    fn add_ref(&mut self, id: u32) {
        if let Some(r) = self.refs.get_mut(id as usize) {
            *r += 1;
        }
    }

    /// One row fewer points to entry `id`; the last one gone frees it.
    fn drop_ref(&mut self, id: u32) {
        let Some(r) = self.refs.get_mut(id as usize) else { return };
        *r = r.saturating_sub(1);
        if *r == 0 {
            self.free(id);
        }
    }

    /// Drops entry `id` from memory (a stored one is listed for the store to delete).
    fn free(&mut self, id: u32) {
        let Some(a) = self.list.get_mut(id as usize).and_then(Option::take) else { return };
        // (A set stored under two numbers maps to one of them: another live one takes its place.)
        let other = match self.dups.get_mut(&a) {
            Some(numbers) => {
                numbers.retain(|n| *n != id);
                numbers.first().copied()
            }
            None => None,
        };
        if self.ids.get(&a) == Some(&id) {
            match other {
                Some(n) => {
                    self.ids.insert(a.clone(), n);
                }
                None => {
                    self.ids.remove(&a);
                }
            }
        }
        self.bytes -= attrs_bytes(&a);
        self.live -= 1;
        if id < self.persisted {
            self.freed.push(id);
        }
    }

    /// Frees every entry no row points to (after a restore loaded the rows: entries only stale summaries or
    /// deleted jobs named). Returns how many.
    pub fn free_unreferenced(&mut self) -> usize {
        let unused: Vec<u32> = (0..self.list.len() as u32)
            .filter(|&id| self.list[id as usize].is_some() && self.refs[id as usize] == 0)
            .collect();
        for &id in &unused {
            self.free(id);
        }
        unused.len()
    }

    /// The stored entries freed since the last call, for the store to delete.
    pub fn take_freed(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.freed)
    }

    /// Gives back numbers [`Dictionary::take_freed`] returned that the store could not delete (tried again later).
    pub fn return_freed(&mut self, ids: Vec<u32>) {
        self.freed.extend(ids);
    }

    /// Rows pointing to entry `id`.
    pub fn refs(&self, id: u32) -> u32 {
        self.refs.get(id as usize).copied().unwrap_or(0)
    }

    /// Estimated bytes of entry `id` (0 if freed).
    pub fn entry_bytes(&self, id: u32) -> usize {
        self.get(id).map_or(0, |a| attrs_bytes(a))
    }

    /// Estimated bytes of the entries, and of the slot every number handed out keeps (12 bytes, at the vectors'
    /// room): numbers are never reused, so a freed entry's slot stays, a fixed cost no deletion gives back.
    pub fn bytes(&self) -> usize {
        self.bytes + self.slot_bytes()
    }

    /// Estimated bytes of the live entries alone (without the slots).
    pub fn entry_total(&self) -> usize {
        self.bytes
    }

    /// Bytes of the per-number slots (see [`Dictionary::bytes`]): memory no deletion gives back.
    pub fn slot_bytes(&self) -> usize {
        self.list.capacity() * std::mem::size_of::<Option<Arc<JobAttrs>>>() + self.refs.capacity() * 4
    }

    /// The attributes of a number (`None`: never handed out, or freed).
    pub fn get(&self, id: u32) -> Option<&Arc<JobAttrs>> {
        self.list.get(id as usize)?.as_ref()
    }

    /// Numbers handed out, freed ones included (the next entry's number).
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether no number was handed out.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Entries in memory (not freed).
    pub fn live(&self) -> usize {
        self.live
    }

    /// Entries not yet stored: `(number, encoded)`.
    pub fn unpersisted(&self) -> Vec<(u32, Vec<u8>)> {
        (self.persisted..self.list.len() as u32)
            .filter_map(|id| Some((id, encode_attrs(self.list.get(id as usize)?.as_ref()?))))
            .collect()
    }

    /// Records that every entry below `upto` is stored.
    pub fn mark_persisted(&mut self, upto: u32) {
        self.persisted = self.persisted.max(upto);
    }

    /// Loads stored entries, in ascending numbers (freed numbers are gaps). No row points to them yet: rows
    /// loaded by [`ColdJobs::load`] count themselves, then [`Dictionary::free_unreferenced`] drops the rest.
    pub fn load(entries: Vec<(u32, Vec<u8>)>) -> Result<Dictionary, String> {
        Self::load_with_next(entries, 0)
    }

    /// [`Dictionary::load`], with the next number the store recorded (see [`Dictionary::len`]): numbers up to it
    /// may be named by summaries although their entries were deleted, so new entries take numbers from it on,
    /// never one a summary could name with another set.
    pub fn load_with_next(entries: Vec<(u32, Vec<u8>)>, next: u32) -> Result<Dictionary, String> {
        let mut d = Dictionary::default();
        for (id, body) in entries {
            if (id as usize) < d.list.len() {
                return Err(format!("dictionary entry {id} after {}", d.list.len() - 1));
            }
            let a: JobAttrs = postcard::from_bytes(&body).map_err(|e| format!("dictionary entry {id}: {e}"))?;
            let a = Arc::new(a);
            d.list.resize(id as usize, None);
            d.refs.resize(id as usize, 0);
            d.bytes += attrs_bytes(&a);
            d.live += 1;
            if let Some(first) = d.ids.insert(a.clone(), id) {
                // Two numbers of one set (freed, interned again, and the store stopped before it deleted the old
                // number): rows keep whichever they name; new rows take the first that lives.
                d.ids.insert(a.clone(), first);
                d.dups.entry(a.clone()).or_insert_with(|| vec![first]).push(id);
            }
            d.list.push(Some(a));
            d.refs.push(0);
        }
        if (next as usize) > d.list.len() {
            d.list.resize(next as usize, None);
            d.refs.resize(next as usize, 0);
        }
        d.persisted = d.list.len() as u32;
        Ok(d)
    }
}

fn encode_attrs(a: &JobAttrs) -> Vec<u8> {
    postcard::to_stdvec(a).unwrap_or_default()
}

/// One folded job in memory: what scans judge a job by as plain fields, the rest of its [`Folded`] packed (see
/// the module doc). Made and read by [`ColdJobs`], which holds the node names the packed placements number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Index into the attribute dictionary.
    pub attrs: u32,
    submitted_at: i64,
    done_at: i64,
    first_step_at: i64,
    /// The number of its summary in the store (see [`Folded::with_summary`]).
    summary: u64,
    /// Every other field of the [`Folded`], as [`pack`] writes them.
    packed: Box<[u8]>,
}

impl Row {
    /// When the job ended.
    pub fn done_at(&self) -> i64 {
        self.done_at
    }

    /// When the job was submitted.
    pub fn submitted_at(&self) -> i64 {
        self.submitted_at
    }

    /// When it reached its first training step, if it did.
    pub fn first_step_at(&self) -> Option<i64> {
        opt(self.first_step_at)
    }

    /// Its time to first step, as [`Timeline::time_to_first_step_ms`] gives it.
    pub fn time_to_first_step_ms(&self) -> Option<i64> {
        Some(self.first_step_at()? - self.submitted_at)
    }

    /// The number of its summary in the store.
    pub fn summary(&self) -> u64 {
        self.summary
    }

    /// Bytes of the packed part.
    pub fn packed_len(&self) -> usize {
        self.packed.len()
    }
}

/// Node names packed rows number: one allocation per distinct node, not one per job and node (a fleet's nodes
/// are few and every job names some). Append-only, so a number stays valid while any row holds it; grows with
/// the distinct nodes ever folded.
#[derive(Debug, Default)]
struct NodeTable {
    names: Vec<Arc<str>>,
    ids: HashMap<Arc<str>, u32>,
}

impl NodeTable {
    /// The number of a name, adding it (and counting its bytes) if new.
    fn id(&mut self, name: &Arc<str>, bytes: &mut usize) -> u32 {
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        let id = self.names.len() as u32;
        *bytes += 16 + name.len() + 3 * std::mem::size_of::<Arc<str>>() + 8;
        self.names.push(name.clone());
        self.ids.insert(name.clone(), id);
        id
    }

    /// The shared name of a number (a number no row could have written reads as an empty name).
    fn name(&self, id: u64) -> Arc<str> {
        usize::try_from(id).ok().and_then(|i| self.names.get(i)).cloned().unwrap_or_else(|| Arc::from(""))
    }
}

/// Bits of a packed row's `present` byte: which optional times it holds.
const HAS_FIRST_QUEUED: u8 = 1;
const HAS_NODE_ASSIGNED: u8 = 2;
const HAS_PREPARING: u8 = 4;
const HAS_CHECKPOINT: u8 = 8;
/// Bits of a packed placement's head byte above its end's index (3 bits).
const PLACED_FIRST_STEP: u8 = 8;
const PLACED_ENDED: u8 = 16;
const PLACED_LOST_NODE: u8 = 32;

fn put_u(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_i(out: &mut Vec<u8>, v: i64) {
    put_u(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// Reads what [`put_u`] and [`put_i`] wrote; past the end every read is 0 (the bytes are the collector's own,
/// written by [`pack`]: a short read cannot happen, and must not panic if it did).
struct Unpack<'a> {
    rest: &'a [u8],
}

impl Unpack<'_> {
    fn u(&mut self) -> u64 {
        let mut v = 0u64;
        let mut shift = 0;
        while let Some((&b, rest)) = self.rest.split_first() {
            self.rest = rest;
            if shift < 64 {
                v |= u64::from(b & 0x7f) << shift;
            }
            shift += 7;
            if b & 0x80 == 0 {
                break;
            }
        }
        v
    }

    fn i(&mut self) -> i64 {
        let z = self.u();
        ((z >> 1) as i64) ^ -((z & 1) as i64)
    }

    fn byte(&mut self) -> u8 {
        match self.rest.split_first() {
            Some((&b, rest)) => {
                self.rest = rest;
                b
            }
            None => 0,
        }
    }

    /// A time written as its offset from `base`.
    fn at(&mut self, base: i64) -> i64 {
        base.wrapping_add(self.i())
    }

    fn u32(&mut self) -> u32 {
        u32::try_from(self.u()).unwrap_or(u32::MAX)
    }

    fn i32(&mut self) -> i32 {
        i32::try_from(self.i()).unwrap_or_default()
    }
}

fn put_segment(out: &mut Vec<u8>, s: Segment) {
    match s {
        Segment::Unreported => out.push(0),
        Segment::Queued(r) => {
            out.push(1);
            put_i(out, r as i64);
        }
        Segment::Assigned => out.push(2),
        Segment::Preparing(p) => {
            out.push(3);
            put_i(out, p as i64);
        }
    }
}

fn take_segment(r: &mut Unpack<'_>) -> Segment {
    match r.byte() {
        1 => Segment::Queued(pb::WaitReason::try_from(r.i32()).unwrap_or_default()),
        2 => Segment::Assigned,
        3 => Segment::Preparing(pb::PreparingPhase::try_from(r.i32()).unwrap_or_default()),
        _ => Segment::Unreported,
    }
}

/// Packs a folded job (node names numbered in `nodes`, whose new names' bytes are added to `bytes`).
fn pack(f: &Folded, nodes: &mut NodeTable, bytes: &mut usize) -> Row {
    let base = f.submitted_at;
    let mut out = Vec::with_capacity(48);
    let times = [
        (f.first_queued_at, HAS_FIRST_QUEUED),
        (f.node_assigned_at, HAS_NODE_ASSIGNED),
        (f.preparing_at, HAS_PREPARING),
        (f.checkpoint_at, HAS_CHECKPOINT),
    ];
    let present = times.iter().filter(|(v, _)| *v != NONE).fold(0, |acc, (_, bit)| acc | bit);
    out.push(present);
    out.push(f.flags);
    for (v, _) in times.iter().filter(|(v, _)| *v != NONE) {
        put_i(&mut out, v.wrapping_sub(base));
    }
    for v in [f.checkpoint_step, f.lost_steps, f.max_step] {
        put_u(&mut out, v);
    }
    for v in [f.requeue_wait_ms, f.lost_work_ms, f.checkpoint_save_ms, f.failed_work_ms] {
        put_i(&mut out, v);
    }
    for v in [f.runs, f.attempts, f.preemptions, f.node_losses, f.ignored_after_done] {
        put_u(&mut out, u64::from(v));
    }
    put_i(&mut out, i64::from(f.exit_code));
    put_i(&mut out, i64::from(f.outcome));
    put_u(&mut out, f.waits.len() as u64);
    for (s, ms) in f.waits.iter() {
        put_segment(&mut out, *s);
        put_i(&mut out, *ms);
    }
    put_u(&mut out, f.placements.len() as u64);
    for p in f.placements.iter() {
        let end = PlacementEnd::ALL.iter().position(|e| *e == p.end).unwrap_or(0) as u8;
        let mut head = end;
        if p.first_step_at.is_some() {
            head |= PLACED_FIRST_STEP;
        }
        if p.ended_at.is_some() {
            head |= PLACED_ENDED;
        }
        if p.lost_node.is_some() {
            head |= PLACED_LOST_NODE;
        }
        out.push(head);
        put_i(&mut out, p.assigned_at.wrapping_sub(base));
        for v in p.first_step_at.iter().chain(p.ended_at.iter()) {
            put_i(&mut out, v.wrapping_sub(base));
        }
        put_u(&mut out, p.nodes.len() as u64);
        for n in p.nodes.iter() {
            put_u(&mut out, u64::from(nodes.id(n, bytes)));
        }
        if let Some(n) = &p.lost_node {
            put_u(&mut out, u64::from(nodes.id(n, bytes)));
        }
    }
    Row {
        attrs: f.attrs,
        submitted_at: f.submitted_at,
        done_at: f.done_at,
        first_step_at: f.first_step_at,
        summary: f.summary,
        packed: out.into_boxed_slice(),
    }
}

/// A packed row's fields before its wait segments (which follow in the reader).
struct Scalars {
    first_queued_at: i64,
    node_assigned_at: i64,
    preparing_at: i64,
    checkpoint_at: i64,
    checkpoint_step: u64,
    lost_steps: u64,
    max_step: u64,
    requeue_wait_ms: i64,
    lost_work_ms: i64,
    checkpoint_save_ms: i64,
    failed_work_ms: i64,
    runs: u32,
    attempts: u32,
    preemptions: u32,
    node_losses: u32,
    ignored_after_done: u32,
    exit_code: i32,
    outcome: i32,
    flags: u8,
}

fn take_scalars(row: &Row, r: &mut Unpack<'_>) -> Scalars {
    let base = row.submitted_at;
    let present = r.byte();
    let flags = r.byte();
    let time = |bit: u8, r: &mut Unpack<'_>| if present & bit != 0 { r.at(base) } else { NONE };
    let first_queued_at = time(HAS_FIRST_QUEUED, r);
    let node_assigned_at = time(HAS_NODE_ASSIGNED, r);
    let preparing_at = time(HAS_PREPARING, r);
    let checkpoint_at = time(HAS_CHECKPOINT, r);
    Scalars {
        first_queued_at,
        node_assigned_at,
        preparing_at,
        checkpoint_at,
        checkpoint_step: r.u(),
        lost_steps: r.u(),
        max_step: r.u(),
        requeue_wait_ms: r.i(),
        lost_work_ms: r.i(),
        checkpoint_save_ms: r.i(),
        failed_work_ms: r.i(),
        runs: r.u32(),
        attempts: r.u32(),
        preemptions: r.u32(),
        node_losses: r.u32(),
        ignored_after_done: r.u32(),
        exit_code: r.i32(),
        outcome: r.i32(),
        flags,
    }
}

fn take_placement(base: i64, nodes: &NodeTable, r: &mut Unpack<'_>) -> Placement {
    let head = r.byte();
    let assigned_at = r.at(base);
    let first_step_at = (head & PLACED_FIRST_STEP != 0).then(|| r.at(base));
    let ended_at = (head & PLACED_ENDED != 0).then(|| r.at(base));
    let n = r.u();
    let names: Vec<Arc<str>> = (0..n).map(|_| nodes.name(r.u())).collect();
    let lost_node = (head & PLACED_LOST_NODE != 0).then(|| nodes.name(r.u()));
    Placement {
        nodes: names.into(),
        assigned_at,
        first_step_at,
        ended_at,
        end: PlacementEnd::ALL.get(usize::from(head & 7)).copied().unwrap_or(PlacementEnd::Open),
        lost_node,
    }
}

/// Every folded job, by id, with the dictionary and node names its rows point to.
#[derive(Debug, Default)]
pub struct ColdJobs {
    /// Rows by job id (listings page by id). Change them with [`ColdJobs::insert`] and [`ColdJobs::remove`].
    pub rows: BTreeMap<Box<str>, Row>,
    /// The attributes rows point to.
    pub dict: Dictionary,
    /// Node names the rows' placements number.
    nodes: NodeTable,
    /// Estimated bytes of the rows and the node names.
    bytes: usize,
    /// The node names' share of `bytes` (append-only: no deletion gives it back).
    node_bytes: usize,
}

/// Estimated bytes of one row in the map beside its id and packed bytes: the row, the key's box, the B-tree's
/// share of a node (nodes hold 11 entries and are a third empty on average, plus edges), and the allocator's
/// rounding of the two allocations (the id's and the packed bytes'). `collector/tests/memory.rs` checks it.
const ROW_OVERHEAD: usize = std::mem::size_of::<Row>() + std::mem::size_of::<Box<str>>() + 40 + 2 * 8;

/// The row's own bytes (node names are shared: [`ColdJobs`] counts each once).
fn row_bytes(id: &str, row: &Row) -> usize {
    ROW_OVERHEAD + id.len() + row.packed.len()
}

impl ColdJobs {
    /// No rows yet, over a loaded dictionary.
    pub fn with_dictionary(dict: Dictionary) -> ColdJobs {
        ColdJobs { rows: BTreeMap::new(), dict, nodes: NodeTable::default(), bytes: 0, node_bytes: 0 }
    }

    /// Adds (or replaces) a folded job.
    pub fn insert(&mut self, job_id: &str, row: Folded) {
        let row = self.pack(&row);
        self.insert_row(job_id, row);
    }

    /// A folded job packed for [`ColdJobs::load`] (its node names added to the shared table).
    pub fn pack(&mut self, row: &Folded) -> Row {
        let before = self.bytes;
        let packed = pack(row, &mut self.nodes, &mut self.bytes);
        self.node_bytes += self.bytes - before;
        packed
    }

    /// Estimated bytes no deletion of rows gives back: the node names rows numbered and the dictionary's slots.
    pub fn fixed_bytes(&self) -> usize {
        self.node_bytes + self.dict.slot_bytes()
    }

    fn insert_row(&mut self, job_id: &str, row: Row) {
        self.dict.add_ref(row.attrs);
        self.insert_held(job_id, row);
    }

    /// Adds (or replaces) a folded job whose attribute entry the caller pinned ([`Dictionary::pin`]): the row
    /// takes over the pin.
    pub fn insert_pinned(&mut self, job_id: &str, row: Folded) {
        let row = self.pack(&row);
        self.insert_held(job_id, row);
    }

    fn insert_held(&mut self, job_id: &str, row: Row) {
        self.bytes += row_bytes(job_id, &row);
        if let Some(old) = self.rows.insert(job_id.into(), row) {
            self.bytes -= row_bytes(job_id, &old);
            self.dict.drop_ref(old.attrs);
        }
    }

    /// Adds the rows a restart read (in the store's order: by summary number; each packed by
    /// [`ColdJobs::pack`] as it was read, so that the transient list is small) to an empty set: sorted by job
    /// id, then built into the map in one pass, with full nodes (inserting one by one leaves them about half
    /// full). A job with two rows (two summaries: a failed fold's write that sled kept) keeps the one with the
    /// higher summary number, the newer; the others are returned `(job_id, summary number)`, for the store to
    /// delete. Rows already present are kept unless a loaded row replaces them.
    pub fn load(&mut self, mut rows: Vec<(Box<str>, Row)>) -> Vec<(String, u64)> {
        rows.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.summary.cmp(&b.1.summary)));
        let mut superseded = Vec::new();
        let mut keep: Vec<(Box<str>, Row)> = Vec::with_capacity(rows.len());
        for (id, row) in rows {
            if let Some(last) = keep.last_mut().filter(|(k, _)| *k == id) {
                superseded.push((id.to_string(), last.1.summary));
                last.1 = row;
                continue;
            }
            keep.push((id, row));
        }
        if !self.rows.is_empty() {
            for (id, row) in keep {
                self.insert_row(&id, row);
            }
            return superseded;
        }
        for (id, row) in &keep {
            self.bytes += row_bytes(id, row);
            self.dict.add_ref(row.attrs);
        }
        self.rows = keep.into_iter().collect();
        superseded
    }

    /// Removes a folded job.
    pub fn remove(&mut self, job_id: &str) -> Option<Row> {
        let row = self.rows.remove(job_id)?;
        self.bytes -= row_bytes(job_id, &row);
        self.dict.drop_ref(row.attrs);
        Some(row)
    }

    /// Estimated bytes of one row (node names aside: those stay).
    pub fn row_bytes(job_id: &str, row: &Row) -> usize {
        row_bytes(job_id, row)
    }

    /// Estimated bytes removing one row frees: the row, and its dictionary entry if no other row names it.
    pub fn freeing_bytes(&self, job_id: &str, row: &Row) -> usize {
        let entry = if self.dict.refs(row.attrs) == 1 { self.dict.entry_bytes(row.attrs) } else { 0 };
        row_bytes(job_id, row) + entry
    }

    /// Estimated bytes of the rows.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The [`Folded`] a row was packed from.
    pub fn unpack(&self, row: &Row) -> Folded {
        let mut r = Unpack { rest: &row.packed };
        let s = take_scalars(row, &mut r);
        let waits: Vec<(Segment, i64)> = (0..r.u()).map(|_| (take_segment(&mut r), r.i())).collect();
        let placements: Vec<Placement> =
            (0..r.u()).map(|_| take_placement(row.submitted_at, &self.nodes, &mut r)).collect();
        Folded {
            attrs: row.attrs,
            submitted_at: row.submitted_at,
            done_at: row.done_at,
            first_step_at: row.first_step_at,
            first_queued_at: s.first_queued_at,
            node_assigned_at: s.node_assigned_at,
            preparing_at: s.preparing_at,
            checkpoint_at: s.checkpoint_at,
            checkpoint_step: s.checkpoint_step,
            requeue_wait_ms: s.requeue_wait_ms,
            lost_work_ms: s.lost_work_ms,
            checkpoint_save_ms: s.checkpoint_save_ms,
            failed_work_ms: s.failed_work_ms,
            lost_steps: s.lost_steps,
            max_step: s.max_step,
            runs: s.runs,
            attempts: s.attempts,
            preemptions: s.preemptions,
            node_losses: s.node_losses,
            ignored_after_done: s.ignored_after_done,
            exit_code: s.exit_code,
            outcome: s.outcome,
            flags: s.flags,
            waits: waits.into_boxed_slice(),
            placements: placements.into_boxed_slice(),
            summary: row.summary,
        }
    }

    /// The full timeline of a folded job.
    pub fn timeline(&self, row: &Row) -> Timeline {
        let mut t = Timeline::default();
        self.fill(row, &mut t);
        t
    }

    /// Writes a folded job's timeline into `t`.
    pub fn fill(&self, row: &Row, t: &mut Timeline) {
        self.fill_with(row, t, true)
    }

    /// [`ColdJobs::fill`], with `placements` only when asked for (copying them clones every node name; only the
    /// node report reads them). Decodes the packed row straight into `t`, reusing its allocations.
    pub fn fill_with(&self, row: &Row, t: &mut Timeline, placements: bool) {
        match self.dict.get(row.attrs) {
            Some(a) => {
                if !t.attrs.as_ref().is_some_and(|have| Arc::ptr_eq(have, a)) {
                    t.attrs = Some(a.clone());
                }
            }
            // Rows are only made from interned attributes; an unknown number means a damaged dictionary.
            None => t.attrs = Some(Arc::new(JobAttrs::unknown())),
        }
        let mut r = Unpack { rest: &row.packed };
        let s = take_scalars(row, &mut r);
        t.state = JobState::Done;
        t.submitted_at = Some(row.submitted_at);
        t.first_queued_at = opt(s.first_queued_at);
        t.node_assigned_at = opt(s.node_assigned_at);
        t.preparing_at = opt(s.preparing_at);
        t.first_step_at = opt(row.first_step_at);
        t.first_step_origin = origin_of(s.flags, t.first_step_at);
        t.last_checkpoint = opt(s.checkpoint_at).map(|at| (at, s.checkpoint_step));
        t.done_at = Some(row.done_at);
        t.outcome = (s.flags & 4 != 0).then(|| pb::Outcome::try_from(s.outcome).unwrap_or_default());
        t.exit_code = (s.flags & 1 != 0).then_some(s.exit_code);
        t.current_wait = None;
        t.wait_started_at = None;
        t.current_raw_reason = None;
        t.current_estimated_start = None;
        t.initial_wait_ms.clear();
        for _ in 0..r.u() {
            let seg = take_segment(&mut r);
            t.initial_wait_ms.insert(seg, r.i());
        }
        t.requeue_wait_ms = s.requeue_wait_ms;
        t.runs = s.runs;
        t.attempts = s.attempts;
        t.preemptions = s.preemptions;
        t.node_losses = s.node_losses;
        t.lost_work_ms = s.lost_work_ms;
        t.checkpoint_save_ms = s.checkpoint_save_ms;
        t.failed_work_ms = s.failed_work_ms;
        t.lost_steps = s.lost_steps;
        t.max_step = (s.flags & 2 != 0).then_some(s.max_step);
        t.ignored_after_done = s.ignored_after_done;
        t.placements.clear();
        if placements {
            for _ in 0..r.u() {
                t.placements.push(take_placement(row.submitted_at, &self.nodes, &mut r));
            }
        }
    }

    /// Folded jobs.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether none.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// What a shutdown image holds of the index (the store frames, checksums and places it: `store::image`): the
/// folded rows with the node names their placements number, and the hot jobs' stale summaries. Written by
/// [`ColdJobs::write_image`] at a clean stop, read by [`ColdJobs::read_image`] at the next start instead of every
/// summary. Body: chunks of `len u32 LE ++ len bytes` (so the reader checksums whole chunks), the last one empty;
/// inside them varints: the node names (`n`, then `len ++ bytes` each), the rows sorted by job id (`n`, then `id
/// len ++ id ++ attrs ++ submitted (zigzag) ++ done (zigzag) ++ first step (zigzag) ++ summary ++ packed len ++
/// packed` each), then the stale summaries (`n`, then `id len ++ id ++ k ++ k numbers` each).
#[derive(Debug, Default)]
pub struct Image {
    nodes: Vec<Arc<str>>,
    rows: Vec<(Box<str>, Row)>,
    /// The stale summaries of the jobs that were hot (see `JobIndex::stale_summaries`).
    pub stale: HashMap<String, Vec<u64>>,
}

impl Image {
    /// Whether `job_id` was folded at the stop.
    pub fn is_folded(&self, job_id: &str) -> bool {
        self.rows.binary_search_by(|(k, _)| (**k).cmp(job_id)).is_ok()
    }

    /// Folded jobs in the image.
    pub fn rows(&self) -> usize {
        self.rows.len()
    }
}

/// Writes varints into chunks of about [`IMAGE_CHUNK`] bytes.
struct ChunkWriter<'a> {
    w: &'a mut dyn std::io::Write,
    buf: Vec<u8>,
}

const IMAGE_CHUNK: usize = 1 << 20;

impl ChunkWriter<'_> {
    fn bytes(&mut self, b: &[u8]) {
        put_u(&mut self.buf, b.len() as u64);
        self.buf.extend_from_slice(b);
    }

    /// Ends a record: the chunk goes out once it is full.
    fn end_record(&mut self) -> std::io::Result<()> {
        if self.buf.len() >= IMAGE_CHUNK {
            self.flush_chunk()?;
        }
        Ok(())
    }

    fn flush_chunk(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            self.w.write_all(&(self.buf.len() as u32).to_le_bytes())?;
            self.w.write_all(&self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }

    fn finish(mut self) -> std::io::Result<()> {
        self.flush_chunk()?;
        self.w.write_all(&0u32.to_le_bytes())
    }
}

/// Reads what [`ChunkWriter`] wrote; every short read is an error.
struct ChunkReader<'a> {
    r: &'a mut dyn std::io::Read,
    chunk: Vec<u8>,
    at: usize,
}

impl ChunkReader<'_> {
    fn refill(&mut self) -> Result<(), String> {
        if self.at < self.chunk.len() {
            return Ok(());
        }
        let mut len = [0u8; 4];
        self.r.read_exact(&mut len).map_err(|e| format!("chunk length: {e}"))?;
        let len = u32::from_le_bytes(len) as usize;
        if len == 0 || len > 64 * IMAGE_CHUNK {
            return Err(format!("a chunk of {len} bytes where a record should be"));
        }
        self.chunk.resize(len, 0);
        self.r.read_exact(&mut self.chunk).map_err(|e| format!("chunk of {len} bytes: {e}"))?;
        self.at = 0;
        Ok(())
    }

    fn u(&mut self) -> Result<u64, String> {
        self.refill()?;
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.chunk.get(self.at).ok_or("a number cut short")?;
            self.at += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("a number over 64 bits".to_string())
    }

    fn i(&mut self) -> Result<i64, String> {
        let z = self.u()?;
        Ok(((z >> 1) as i64) ^ -((z & 1) as i64))
    }

    fn len(&mut self) -> Result<usize, String> {
        usize::try_from(self.u()?).map_err(|_| "a length past memory".to_string())
    }

    fn bytes(&mut self) -> Result<&[u8], String> {
        let n = self.len()?;
        let end = self.at.checked_add(n).ok_or("a length past memory")?;
        let b = self.chunk.get(self.at..end).ok_or("bytes cut short")?;
        self.at = end;
        Ok(b)
    }

    fn text(&mut self) -> Result<&str, String> {
        std::str::from_utf8(self.bytes()?).map_err(|_| "text that is not UTF-8".to_string())
    }

    /// The end: the chunk read is used up and an empty one follows.
    fn finish(self) -> Result<(), String> {
        if self.at < self.chunk.len() {
            return Err(format!("{} bytes past the last record", self.chunk.len() - self.at));
        }
        let mut len = [0u8; 4];
        self.r.read_exact(&mut len).map_err(|e| format!("end: {e}"))?;
        if len != [0; 4] {
            return Err("records past the end".to_string());
        }
        Ok(())
    }
}

impl ColdJobs {
    /// Writes the image body (see [`Image`]): these rows and node names, and the hot jobs' `stale` summaries.
    pub fn write_image(&self, stale: &HashMap<String, Vec<u64>>, w: &mut dyn std::io::Write) -> std::io::Result<()> {
        let mut c = ChunkWriter { w, buf: Vec::with_capacity(IMAGE_CHUNK + 4096) };
        put_u(&mut c.buf, self.nodes.names.len() as u64);
        for name in &self.nodes.names {
            c.bytes(name.as_bytes());
            c.end_record()?;
        }
        put_u(&mut c.buf, self.rows.len() as u64);
        for (id, row) in &self.rows {
            c.bytes(id.as_bytes());
            put_u(&mut c.buf, u64::from(row.attrs));
            put_i(&mut c.buf, row.submitted_at);
            put_i(&mut c.buf, row.done_at);
            put_i(&mut c.buf, row.first_step_at);
            put_u(&mut c.buf, row.summary);
            c.bytes(&row.packed);
            c.end_record()?;
        }
        put_u(&mut c.buf, stale.len() as u64);
        for (id, numbers) in stale {
            c.bytes(id.as_bytes());
            put_u(&mut c.buf, numbers.len() as u64);
            for n in numbers {
                put_u(&mut c.buf, *n);
            }
            c.end_record()?;
        }
        c.finish()
    }

    /// Reads an image body [`ColdJobs::write_image`] wrote; refuses anything else (rows out of order included).
    pub fn read_image(r: &mut dyn std::io::Read) -> Result<Image, String> {
        let mut c = ChunkReader { r, chunk: Vec::new(), at: 0 };
        let mut image = Image::default();
        let n = c.len()?;
        for _ in 0..n {
            image.nodes.push(Arc::from(c.text()?));
        }
        let n = c.len()?;
        for _ in 0..n {
            let id: Box<str> = Box::from(c.text()?);
            let attrs = u32::try_from(c.u()?).map_err(|_| "an attribute number past 32 bits".to_string())?;
            let (submitted_at, done_at, first_step_at) = (c.i()?, c.i()?, c.i()?);
            let summary = c.u()?;
            let packed: Box<[u8]> = Box::from(c.bytes()?);
            if image.rows.last().is_some_and(|(last, _)| *last >= id) {
                return Err(format!("rows out of order at {id:?}"));
            }
            image.rows.push((id, Row { attrs, submitted_at, done_at, first_step_at, summary, packed }));
        }
        let n = c.len()?;
        for _ in 0..n {
            let id = c.text()?.to_string();
            let k = c.len()?;
            let mut numbers = Vec::with_capacity(k.min(1024));
            for _ in 0..k {
                numbers.push(c.u()?);
            }
            if image.stale.insert(id, numbers).is_some() {
                return Err("a job's stale summaries twice".to_string());
            }
        }
        c.finish()?;
        Ok(image)
    }

    /// Loads an image's rows and node names into an empty set over its dictionary; refuses (and keeps nothing)
    /// a row naming an attribute set the dictionary does not hold.
    pub fn load_image(&mut self, image: Image) -> Result<HashMap<String, Vec<u64>>, String> {
        if let Some((id, row)) = image.rows.iter().find(|(_, r)| self.dict.get(r.attrs).is_none()) {
            return Err(format!("job {id:?} names attribute set {}, which the dictionary does not hold", row.attrs));
        }
        let distinct: std::collections::HashSet<&Arc<str>> = image.nodes.iter().collect();
        if distinct.len() != image.nodes.len() || !self.nodes.names.is_empty() || !self.rows.is_empty() {
            return Err("a node name twice, or rows already loaded".to_string());
        }
        let mut bytes = 0;
        for name in &image.nodes {
            self.nodes.id(name, &mut bytes);
        }
        self.node_bytes += bytes;
        self.bytes += bytes;
        self.load(image.rows);
        Ok(image.stale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn time() -> impl Strategy<Value = i64> {
        prop_oneof![
            2 => Just(NONE),
            1 => Just(i64::MAX),
            6 => 1_700_000_000_000i64..1_800_000_000_000,
            1 => any::<i64>(),
        ]
    }

    fn segment() -> impl Strategy<Value = Segment> {
        (0u8..4, 0i32..12).prop_map(|(tag, code)| match tag {
            0 => Segment::Unreported,
            1 => Segment::Queued(pb::WaitReason::try_from(code).unwrap_or_default()),
            2 => Segment::Assigned,
            _ => Segment::Preparing(pb::PreparingPhase::try_from(code % 6).unwrap_or_default()),
        })
    }

    fn placement() -> impl Strategy<Value = Placement> {
        (
            prop::collection::vec(0usize..5, 0..4),
            time(),
            prop::option::of(time()),
            prop::option::of(time()),
            0usize..8,
            prop::option::of(0usize..5),
        )
            .prop_map(|(nodes, assigned_at, first_step_at, ended_at, end, lost)| {
                let name = |i: usize| Arc::<str>::from(format!("gpu-node-{i:03}"));
                Placement {
                    nodes: nodes.into_iter().map(name).collect::<Vec<_>>().into(),
                    assigned_at,
                    first_step_at,
                    ended_at,
                    end: PlacementEnd::ALL[end],
                    lost_node: lost.map(name),
                }
            })
    }

    prop_compose! {
        fn folded()(
            attrs in 0u32..3,
            times in prop::array::uniform7(time()),
            counts in prop::array::uniform3(prop_oneof![Just(0u64), any::<u64>()]),
            ms in prop::array::uniform4(prop_oneof![Just(0i64), -5_000i64..86_400_000, any::<i64>()]),
            small in prop::array::uniform5(prop_oneof![0u32..4, any::<u32>()]),
            exit_code in any::<i32>(),
            outcome in -1i32..7,
            flags in 0u8..32,
            waits in prop::collection::btree_map(segment(), any::<i64>(), 0..5),
            placements in prop::collection::vec(placement(), 0..4),
            summary in any::<u64>(),
        ) -> Folded {
            let [submitted_at, done_at, first_step_at, first_queued_at, node_assigned_at, preparing_at, checkpoint_at] = times;
            Folded {
                attrs,
                submitted_at: if submitted_at == NONE { 0 } else { submitted_at },
                done_at,
                first_step_at,
                first_queued_at,
                node_assigned_at,
                preparing_at,
                checkpoint_at,
                checkpoint_step: counts[0],
                requeue_wait_ms: ms[0],
                lost_work_ms: ms[1],
                checkpoint_save_ms: ms[2],
                failed_work_ms: ms[3],
                lost_steps: counts[1],
                max_step: counts[2],
                runs: small[0],
                attempts: small[1],
                preemptions: small[2],
                node_losses: small[3],
                ignored_after_done: small[4],
                exit_code,
                outcome,
                flags,
                waits: waits.into_iter().collect::<Vec<_>>().into_boxed_slice(),
                placements: placements.into_boxed_slice(),
                summary,
            }
        }
    }

    fn dictionary() -> Dictionary {
        let mut d = Dictionary::default();
        for team in ["a", "b", "c"] {
            d.intern(&Arc::new(JobAttrs { team: team.into(), ..JobAttrs::unknown() }));
        }
        d
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
        /// Any row, extreme values included, packs and unpacks to itself, and fills in the timeline its unpacked
        /// form fills (with and without placements), node names shared; removing every row leaves only the names.
        #[test]
        fn a_packed_row_unpacks_to_itself(rows in prop::collection::vec(folded(), 1..12)) {
            let mut cold = ColdJobs::with_dictionary(dictionary());
            for (i, f) in rows.iter().enumerate() {
                cold.insert(&format!("job-{i}"), f.clone());
            }
            let names = cold.nodes.names.len();
            prop_assert!(names <= 5);
            for (i, f) in rows.iter().enumerate() {
                let row = &cold.rows[format!("job-{i}").as_str()];
                prop_assert_eq!(&cold.unpack(row), f);
                prop_assert_eq!((row.done_at(), row.submitted_at(), row.first_step_at(), row.summary()),
                    (f.done_at(), f.submitted_at(), f.first_step_at(), f.summary()));
                let attrs = cold.dict.get(f.attrs).expect("interned").clone();
                for placements in [true, false] {
                    let mut want = Timeline::default();
                    f.fill_with(&attrs, &mut want, placements);
                    // Filling over a timeline left by another job reuses it and leaves nothing of it behind.
                    let mut got = cold.timeline(&cold.rows["job-0"]);
                    cold.fill_with(row, &mut got, placements);
                    prop_assert_eq!(&got, &want);
                    for p in &got.placements {
                        for n in p.nodes.iter().chain(p.lost_node.iter()) {
                            let shared = cold.nodes.ids.get_key_value(n).map(|(k, _)| k.clone());
                            prop_assert!(shared.is_some_and(|s| Arc::ptr_eq(&s, n)), "node {} is a copy", n);
                        }
                    }
                }
            }
            for i in 0..rows.len() {
                let id = format!("job-{i}");
                prop_assert!(cold.remove(&id).is_some());
            }
            prop_assert_eq!(cold.bytes(), cold.nodes.names.iter().map(|n| 16 + n.len() + 3 * 16 + 8).sum::<usize>());
        }
    }

    /// The dictionary's estimate grows with each distinct attribute set, not with repeats, and a reload from
    /// what it stored counts the same.
    #[test]
    fn the_dictionary_counts_each_distinct_attribute_set_once() {
        let mut d = Dictionary::default();
        assert_eq!(d.entry_total(), 0);
        let team = |t: &str| Arc::new(JobAttrs { team: t.into(), pool: "a100".into(), ..JobAttrs::unknown() });
        d.intern(&team("vision"));
        let one = d.entry_total();
        assert!(one >= std::mem::size_of::<JobAttrs>() + "vision".len() + "a100".len(), "{one}");
        d.intern(&team("vision"));
        assert_eq!(d.entry_total(), one, "a repeat costs nothing");
        d.intern(&team("speech"));
        assert_eq!(d.entry_total(), 2 * one, "a second set of the same sizes costs the same");
        let mut labelled = JobAttrs { team: "speech".into(), ..JobAttrs::unknown() };
        labelled.labels.insert("run".into(), "r-000017".into());
        d.intern(&Arc::new(labelled));
        assert!(d.entry_total() > 3 * one - "a100".len(), "labels are counted: {}", d.entry_total());
        let reloaded = Dictionary::load(d.unpersisted()).expect("load");
        assert_eq!((reloaded.len(), reloaded.entry_total()), (3, d.entry_total()));
    }

    /// Rows count the entries they name: an entry is freed with the last row naming it (a replaced row's old
    /// entry too), a stored one listed for the store to delete; a set interned again gets a new number; a
    /// reload with gaps keeps the numbers, and frees what no loaded row names.
    #[test]
    fn dictionary_entries_are_freed_with_the_last_row_that_names_them() {
        let set = |t: &str| Arc::new(JobAttrs { team: t.into(), ..JobAttrs::unknown() });
        let mut d = Dictionary::default();
        let (a, b, c) = (d.intern(&set("a")), d.intern(&set("b")), d.intern(&set("c")));
        d.mark_persisted(3);
        let one = d.entry_total() / 3;
        let mut cold = ColdJobs::with_dictionary(d);
        let row = |attrs: u32, at: i64| {
            let t = Timeline {
                submitted_at: Some(at),
                done_at: Some(at + 10),
                state: JobState::Done,
                attrs: Some(Arc::new(JobAttrs::unknown())),
                ..Default::default()
            };
            Folded::of(&t, attrs).expect("done")
        };
        cold.insert("j1", row(a, 1));
        cold.insert("j2", row(a, 2));
        cold.insert("j3", row(b, 3));
        assert_eq!((cold.dict.refs(a), cold.dict.refs(b), cold.dict.refs(c)), (2, 1, 0));
        // c was never named: it stays until a restore's sweep.
        cold.remove("j1");
        assert_eq!(cold.dict.live(), 3);
        cold.remove("j2");
        assert_eq!((cold.dict.live(), cold.dict.get(a)), (2, None), "a freed with its last row");
        assert_eq!(cold.dict.entry_total(), 2 * one);
        // A replaced row lets go of its old entry.
        cold.insert("j3", row(c, 4));
        assert_eq!((cold.dict.get(b), cold.dict.refs(c)), (None, 1));
        assert_eq!(cold.dict.take_freed(), vec![a, b]);
        assert!(cold.dict.take_freed().is_empty());
        // Interned again: a new number, never a freed one.
        let a2 = cold.dict.intern(&set("a"));
        assert_eq!(a2, 3);
        assert_eq!(cold.dict.unpersisted().len(), 1, "only the new entry is unstored");
        // What the store would hold now: c and the new a; a reload keeps their numbers, and the sweep frees
        // the one no loaded row names.
        let stored: Vec<(u32, Vec<u8>)> =
            [c, a2].iter().map(|&id| (id, encode_attrs(cold.dict.get(id).expect("live")))).collect();
        let mut back = ColdJobs::with_dictionary(Dictionary::load(stored).expect("gaps load"));
        assert_eq!((back.dict.len(), back.dict.live(), back.dict.get(a)), (4, 2, None));
        assert_eq!(back.dict.get(a2).map(|x| x.team.as_str()), Some("a"));
        let packed = back.pack(&row(c, 4));
        back.load(vec![("j3".into(), packed)]);
        assert_eq!(back.dict.free_unreferenced(), 1);
        assert_eq!((back.dict.take_freed(), back.dict.live(), back.dict.entry_total()), (vec![a2], 1, one));
        assert!(Dictionary::load(vec![(2, encode_attrs(&set("x"))), (1, encode_attrs(&set("y")))]).is_err());
    }

    /// A pin keeps an entry a summary being written names, whatever rows come and go; the row made from it takes
    /// the pin over. Numbers continue from the store's recorded next one, past entries deleted at the top; a set
    /// stored under two numbers stays interned while either lives.
    #[test]
    fn pinned_entries_stay_and_numbers_are_never_handed_out_twice() {
        let set = |t: &str| Arc::new(JobAttrs { team: t.into(), ..JobAttrs::unknown() });
        let row = |attrs: u32| {
            let t = Timeline {
                submitted_at: Some(1),
                done_at: Some(2),
                state: JobState::Done,
                attrs: Some(Arc::new(JobAttrs::unknown())),
                ..Default::default()
            };
            Folded::of(&t, attrs).expect("done")
        };
        let mut cold = ColdJobs::with_dictionary(Dictionary::default());
        let a = cold.dict.intern(&set("a"));
        cold.insert("j1", row(a));
        // A fold interns and pins a for j2; meanwhile j1 unfolds (its row goes): a stays.
        cold.dict.pin(a);
        cold.remove("j1");
        assert_eq!(cold.dict.get(a).map(|x| x.team.as_str()), Some("a"), "pinned");
        cold.insert_pinned("j2", row(a));
        assert_eq!(cold.dict.refs(a), 1, "the row took the pin over");
        cold.remove("j2");
        assert_eq!(cold.dict.get(a), None, "freed with its last row");
        // A pin given back with no row made frees the entry too.
        let b = cold.dict.intern(&set("b"));
        cold.dict.pin(b);
        cold.dict.unpin(b);
        assert_eq!((cold.dict.get(b), cold.dict.live()), (None, 0));
        // The store recorded next = 5 and kept only entry 1: new numbers start at 5.
        let mut d = Dictionary::load_with_next(vec![(1, encode_attrs(&set("c")))], 5).expect("load");
        assert_eq!((d.len(), d.live()), (5, 1));
        assert_eq!(d.intern(&set("d")), 5);
        assert_eq!(d.unpersisted().len(), 1);
        // One set under two numbers (1 and 3): freeing the one interning maps to keeps the other reachable.
        let mut two = ColdJobs::with_dictionary(
            Dictionary::load(vec![(1, encode_attrs(&set("e"))), (3, encode_attrs(&set("e")))]).expect("load"),
        );
        let packed = (two.pack(&row(1)), two.pack(&row(3)));
        two.load(vec![("x".into(), packed.0), ("y".into(), packed.1)]);
        two.remove("x");
        assert_eq!(two.dict.intern(&set("e")), 3, "the live number of the set, not a new one");
        two.remove("y");
        assert_eq!(two.dict.live(), 0);
    }

    /// A typical folded job (times in milliseconds minutes apart, three wait segments, one placement on one
    /// node) packs into a few dozen bytes: the size the memory model counts on.
    /// A folded job keeps its first step's origin (in flag bits 3-4, through the summary and the packed row); a
    /// summary written before origins existed (those bits 0) reads back as unspecified, and a job that never
    /// started has none.
    #[test]
    fn a_folded_job_keeps_its_first_steps_origin() {
        let attrs = Arc::new(JobAttrs::unknown());
        let mut dict = Dictionary::default();
        let n = dict.intern(&attrs);
        let mut cold = ColdJobs::with_dictionary(dict);
        for origin in [pb::StepOrigin::ContainerStart, pb::StepOrigin::TrainingProcess, pb::StepOrigin::SchedulerStart]
        {
            let t = Timeline {
                state: JobState::Done,
                attrs: Some(attrs.clone()),
                submitted_at: Some(1_000),
                first_step_at: Some(5_000),
                first_step_origin: Some(origin),
                done_at: Some(9_000),
                ..Timeline::default()
            };
            let f = Folded::of(&t, n).expect("done");
            let back = Folded::decode(&f.encode()).expect("decode");
            assert_eq!(back, f);
            cold.insert("j", back.clone());
            assert_eq!(cold.timeline(&cold.rows["j"]).first_step_origin, Some(origin));
            let old = Folded { flags: back.flags & 0b111, ..back };
            cold.insert("j", old);
            assert_eq!(cold.timeline(&cold.rows["j"]).first_step_origin, Some(pb::StepOrigin::Unspecified));
        }
        let never = Timeline {
            state: JobState::Done,
            attrs: Some(attrs.clone()),
            submitted_at: Some(1_000),
            done_at: Some(9_000),
            ..Timeline::default()
        };
        cold.insert("k", Folded::of(&never, n).expect("done"));
        assert_eq!(cold.timeline(&cold.rows["k"]).first_step_origin, None);
    }

    #[test]
    fn a_typical_row_packs_small() {
        let t0 = 1_780_000_000_000;
        let f = Folded {
            attrs: 1,
            submitted_at: t0,
            done_at: t0 + 7_200_000,
            first_step_at: t0 + 900_000,
            first_queued_at: t0 + 1_000,
            node_assigned_at: t0 + 600_000,
            preparing_at: t0 + 610_000,
            checkpoint_at: t0 + 3_600_000,
            checkpoint_step: 12_000,
            requeue_wait_ms: 0,
            lost_work_ms: 0,
            checkpoint_save_ms: 45_000,
            failed_work_ms: 0,
            lost_steps: 0,
            max_step: 24_000,
            runs: 1,
            attempts: 1,
            preemptions: 0,
            node_losses: 0,
            ignored_after_done: 0,
            exit_code: 0,
            outcome: pb::Outcome::Succeeded as i32,
            flags: 7,
            waits: vec![
                (Segment::Unreported, 1_000),
                (Segment::Queued(pb::WaitReason::Capacity), 599_000),
                (Segment::Preparing(pb::PreparingPhase::ImagePull), 290_000),
            ]
            .into_boxed_slice(),
            placements: vec![Placement {
                nodes: vec![Arc::<str>::from("a100-node-013")].into(),
                assigned_at: t0 + 600_000,
                first_step_at: Some(t0 + 900_000),
                ended_at: Some(t0 + 7_200_000),
                end: PlacementEnd::Succeeded,
                lost_node: None,
            }]
            .into_boxed_slice(),
            summary: 7,
        };
        let mut cold = ColdJobs::with_dictionary(dictionary());
        cold.insert("slurm/cluster-a/1234567", f.clone());
        let row = &cold.rows["slurm/cluster-a/1234567"];
        assert_eq!(cold.unpack(row), f);
        assert!(row.packed_len() <= 64, "{} bytes packed", row.packed_len());
        assert!(std::mem::size_of::<Row>() <= 56);
    }
}
