//! Folded ("cold") jobs: ended jobs whose events left memory, each kept as one fixed-size [`Folded`] row, plus
//! the interned job attributes the rows point to. Owns both stored codecs: the summary body (sealed by the
//! store in its `summaries` tree) and the attribute dictionary entries (its `dictionary` tree).
//!
//! A row holds everything of a done job's [`Timeline`]: [`Folded::timeline`] gives back exactly the timeline it
//! was made from (a property test checks it), so readers see a folded job as they saw it hot, and the SLO
//! contributions and metric footprints of a folded job are recomputed from it when needed instead of kept.

use crate::job::{JobAttrs, JobState, Placement, Segment, Timeline};
use serde::{Deserialize, Serialize};
use startline_proto::pb;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// "No value" in an `i64` time field of a row.
const NONE: i64 = i64::MIN;
/// The summary body's format (inside the store's seal): 2 adds checkpoint save and failed-run time (format-1
/// rows read back with both at 0), 3 adds the placements (format-2 rows read back with none).
const SUMMARY_FORMAT: u8 = 3;
const SUMMARY_FORMAT_2: u8 = 2;
const SUMMARY_FORMAT_1: u8 = 1;

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
    /// Bit 0: has exit code; bit 1: has max step; bit 2: has outcome.
    flags: u8,
    /// The initial wait by segment, in segment order.
    waits: Box<[(Segment, i64)]>,
    /// Where it ran.
    placements: Box<[Placement]>,
    /// The number of its summary in the store (0: keyed by its job id, as older collectors stored them); not
    /// part of the summary body.
    summary: u64,
}

fn opt(v: i64) -> Option<i64> {
    (v != NONE).then_some(v)
}

impl Folded {
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

    /// The number of its summary in the store (see [`Folded::with_summary`]).
    pub fn summary(&self) -> u64 {
        self.summary
    }

    /// The row with its stored summary's number (the store assigns it when it writes the summary).
    pub fn with_summary(mut self, summary: u64) -> Folded {
        self.summary = summary;
        self
    }

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

    /// Writes the job's timeline into `t` (reusing its allocations), with `attrs` as its attributes.
    pub fn fill(&self, attrs: &Arc<JobAttrs>, t: &mut Timeline) {
        self.fill_with(attrs, t, true)
    }

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
            Some((&SUMMARY_FORMAT_2, rest)) => {
                let (d, extra) = postcard::from_bytes::<(Disk, [i64; 2])>(rest).map_err(|e| e.to_string())?;
                (d, extra, Vec::new())
            }
            Some((&SUMMARY_FORMAT_1, rest)) => {
                (postcard::from_bytes::<Disk>(rest).map_err(|e| e.to_string())?, [0, 0], Vec::new())
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

/// Job attributes by number, shared by folded rows. Append-only: an attribute set keeps its number for the
/// life of the store (numbers are persisted in summaries), so retention does not shrink it; it holds one entry
/// per distinct attribute set, which fleets repeat (same pool, team, project).
#[derive(Debug, Default)]
pub struct Dictionary {
    list: Vec<Arc<JobAttrs>>,
    ids: HashMap<Arc<JobAttrs>, u32>,
    /// Entries below this number are in the store.
    persisted: u32,
}

impl Dictionary {
    /// The number of an attribute set, adding it if new.
    pub fn intern(&mut self, a: &Arc<JobAttrs>) -> u32 {
        if let Some(id) = self.ids.get(a) {
            return *id;
        }
        let id = self.list.len() as u32;
        self.list.push(a.clone());
        self.ids.insert(a.clone(), id);
        id
    }

    /// The attributes of a number.
    pub fn get(&self, id: u32) -> Option<&Arc<JobAttrs>> {
        self.list.get(id as usize)
    }

    /// Entries.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Entries not yet stored: `(number, encoded)`.
    pub fn unpersisted(&self) -> Vec<(u32, Vec<u8>)> {
        (self.persisted..self.list.len() as u32)
            .filter_map(|id| Some((id, encode_attrs(self.list.get(id as usize)?))))
            .collect()
    }

    /// Records that every entry below `upto` is stored.
    pub fn mark_persisted(&mut self, upto: u32) {
        self.persisted = self.persisted.max(upto);
    }

    /// Loads stored entries (numbers must be dense from 0).
    pub fn load(entries: Vec<(u32, Vec<u8>)>) -> Result<Dictionary, String> {
        let mut d = Dictionary::default();
        for (i, (id, body)) in entries.into_iter().enumerate() {
            if id as usize != i {
                return Err(format!("dictionary entry {id} where {i} was expected"));
            }
            let a: JobAttrs = postcard::from_bytes(&body).map_err(|e| format!("dictionary entry {id}: {e}"))?;
            let a = Arc::new(a);
            d.ids.insert(a.clone(), id);
            d.list.push(a);
        }
        d.persisted = d.list.len() as u32;
        Ok(d)
    }
}

fn encode_attrs(a: &JobAttrs) -> Vec<u8> {
    postcard::to_stdvec(a).unwrap_or_default()
}

/// Every folded job, by id, with the dictionary its rows point to.
#[derive(Debug, Default)]
pub struct ColdJobs {
    /// Rows by job id (listings page by id). Change them with [`ColdJobs::insert`] and [`ColdJobs::remove`].
    pub rows: BTreeMap<Box<str>, Folded>,
    /// The attributes rows point to.
    pub dict: Dictionary,
    /// Node names the rows' placements share: one allocation per distinct node, not one per job and node (a
    /// fleet's nodes are few and every job names some). Grows with the distinct nodes ever folded.
    nodes: HashSet<Arc<str>>,
    /// Estimated bytes of the rows and the node names.
    bytes: usize,
}

/// Estimated bytes of one row in the map beside its id and wait segments (the row, the key's box, and the
/// B-tree's share of a node).
const ROW_OVERHEAD: usize = std::mem::size_of::<Folded>() + std::mem::size_of::<Box<str>>() + 16;

/// The row's own bytes (node names are shared: [`ColdJobs`] counts each once).
fn row_bytes(id: &str, row: &Folded) -> usize {
    let placements: usize = row
        .placements
        .iter()
        .map(|p| std::mem::size_of::<Placement>() + 16 + p.nodes.len() * std::mem::size_of::<Arc<str>>())
        .sum();
    ROW_OVERHEAD + id.len() + std::mem::size_of_val(&*row.waits) + placements
}

impl ColdJobs {
    /// No rows yet, over a loaded dictionary.
    pub fn with_dictionary(dict: Dictionary) -> ColdJobs {
        ColdJobs { rows: BTreeMap::new(), dict, nodes: HashSet::new(), bytes: 0 }
    }

    /// Adds (or replaces) a folded job.
    pub fn insert(&mut self, job_id: &str, mut row: Folded) {
        self.share_nodes(&mut row);
        self.bytes += row_bytes(job_id, &row);
        if let Some(old) = self.rows.insert(job_id.into(), row) {
            self.bytes -= row_bytes(job_id, &old);
        }
    }

    /// Adds the rows a restart read (in the store's order: by summary number) to an empty set: sorted by job
    /// id, then built into the map in one pass, with full nodes (inserting one by one leaves them about half
    /// full). A job with two rows (two summaries: a failed fold's write that sled kept) keeps the one with the
    /// higher summary number, the newer; the others are returned `(job_id, summary number)`, for the store to
    /// delete. Rows already present are kept unless a loaded row replaces them.
    pub fn load(&mut self, mut rows: Vec<(Box<str>, Folded)>) -> Vec<(String, u64)> {
        rows.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.summary.cmp(&b.1.summary)));
        let mut superseded = Vec::new();
        let mut keep: Vec<(Box<str>, Folded)> = Vec::with_capacity(rows.len());
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
                self.insert(&id, row);
            }
            return superseded;
        }
        for (id, row) in &mut keep {
            self.share_nodes(row);
            self.bytes += row_bytes(id, row);
        }
        self.rows = keep.into_iter().collect();
        superseded
    }

    /// Points the row's node names at the shared ones (adding names not seen before).
    fn share_nodes(&mut self, row: &mut Folded) {
        for p in row.placements.iter_mut() {
            let is_shared = |n: &Arc<str>| self.nodes.get(n).is_some_and(|s| Arc::ptr_eq(s, n));
            let shared = p.nodes.iter().all(is_shared) && p.lost_node.as_ref().is_none_or(is_shared);
            if shared {
                continue;
            }
            let nodes: Vec<Arc<str>> = p.nodes.iter().map(|n| intern(&mut self.nodes, &mut self.bytes, n)).collect();
            p.nodes = nodes.into();
            if let Some(lost) = &p.lost_node {
                p.lost_node = Some(intern(&mut self.nodes, &mut self.bytes, lost));
            }
        }
    }

    /// Removes a folded job.
    pub fn remove(&mut self, job_id: &str) -> Option<Folded> {
        let row = self.rows.remove(job_id)?;
        self.bytes -= row_bytes(job_id, &row);
        Some(row)
    }

    /// Estimated bytes of the rows.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The full timeline of a folded job.
    pub fn timeline(&self, row: &Folded) -> Timeline {
        let mut t = Timeline::default();
        self.fill(row, &mut t);
        t
    }

    /// Writes a folded job's timeline into `t`.
    pub fn fill(&self, row: &Folded, t: &mut Timeline) {
        self.fill_with(row, t, true)
    }

    /// [`ColdJobs::fill`], with `placements` only when asked for (see [`Folded::fill_with`]).
    pub fn fill_with(&self, row: &Folded, t: &mut Timeline, placements: bool) {
        match self.dict.get(row.attrs) {
            Some(a) => row.fill_with(a, t, placements),
            // Rows are only made from interned attributes; an unknown number means a damaged dictionary.
            None => {
                let a = Arc::new(JobAttrs::unknown());
                row.fill_with(&a, t, placements)
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

/// The shared copy of a node name, added (and its bytes counted) if new.
fn intern(names: &mut HashSet<Arc<str>>, bytes: &mut usize, name: &Arc<str>) -> Arc<str> {
    if let Some(n) = names.get(name) {
        return n.clone();
    }
    *bytes += 16 + name.len() + 2 * std::mem::size_of::<Arc<str>>();
    names.insert(name.clone());
    name.clone()
}
