//! The in-memory job index: hot jobs (waiting, running, or ended too recently to fold) with their events and
//! timelines, folded jobs as compact rows ([`cold`]), and the state derived from both: SLO windows and the
//! deadline index ([`SloEngine`]), metric gauges and per-job metric footprints ([`footprint`]), and the label
//! limits ([`labels`]). The applier is the only writer; readers (API, export, alert) scan it through
//! [`SharedIndex`] under short read locks and see hot and folded jobs alike as a [`JobRef`].
//!
//! # Memory model
//! A hot job costs its events (72 bytes each, counted by the room its vector holds), its timeline, its own copy
//! of its attributes and its derived state: ~2.8 KB beside the events, ~4-5 KB for a typical job. A folded job
//! costs one packed [`cold::Row`] (56 bytes plus ~40-60 bytes of varints) and its id in a B-tree, ~200-300 bytes
//! in all (`collector/tests/memory.rs` checks both estimates against what the structures hold); its attributes and node names are shared through tables, and its SLO contributions are recomputed from its row when needed (an ended
//! job's contributions do not change), not kept.

pub mod capacity;
pub mod chains;
pub mod cold;
pub mod deadlines;
pub mod footprint;
pub mod labels;
pub mod nodes;

use crate::job::{CompactEvent, JobRecord, Timeline};
use crate::slo::eta::{self, WaitBook};
use crate::slo::{Contribution, SloEngine};
use cold::{ColdJobs, Folded, Row};
use footprint::{footprint, Footprint, JobGauges, Observation};
use labels::{LabelLimiter, LabelSettings};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A job in memory with everything derived from it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HotJob {
    /// Its events and timeline.
    pub rec: JobRecord,
    /// Its current contribution to each SLO that covers it.
    pub slo: Vec<Contribution>,
    /// What the metrics last saw of it.
    pub metrics: Option<Footprint>,
    /// Hash of the source of its latest event received since start (0: none since start).
    pub source: u64,
    /// What the store's snapshot chunks of this job hold.
    pub snap: SnapMark,
}

/// What the store's snapshot parts hold of a hot job, for the applier's checkpoints (which write the job's
/// events past it: see `store::snaps`). Bookkeeping of the store's, not state of the job: every two marks
/// compare equal, so a restored job equals the one before the restart.
#[derive(Debug, Clone, Copy, Default)]
pub struct SnapMark {
    /// The highest log sequence the parts hold of it; 0 when none is known (a new, unfolded or rebuilt job):
    /// the next checkpoint writes all its events.
    pub through: u64,
    /// Which life of the job in memory this mark belongs to (a job that left memory and came back is a new
    /// one, whose chunks a checkpoint of the old one must not vouch for).
    pub incarnation: u64,
}

impl SnapMark {
    /// The mark of a job new in memory: nothing known stored, a new incarnation.
    pub fn fresh() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        SnapMark { through: 0, incarnation: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) }
    }
}

impl PartialEq for SnapMark {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl HotJob {
    /// How readers see it.
    pub fn view(&self) -> JobRef<'_> {
        JobRef { timeline: &self.rec.timeline, slo: &self.slo, folded: false }
    }
}

/// A folded job as a scan shows it before filling in its timeline (see [`SharedIndex::scan_where`]).
#[derive(Debug, Clone, Copy)]
pub struct FoldedRef<'a> {
    /// Its row (the times scans judge by; [`ColdJobs::fill_with`] gives the rest).
    pub row: &'a Row,
    /// Its attributes (shared by every row with the same set; `row.attrs` numbers them).
    pub attrs: &'a Arc<crate::job::JobAttrs>,
}

/// How a reader sees one job, hot or folded.
#[derive(Debug, Clone, Copy)]
pub struct JobRef<'a> {
    /// Its timeline.
    pub timeline: &'a Timeline,
    /// Its contribution to each SLO that covers it.
    pub slo: &'a [Contribution],
    /// Whether it is folded (its events are on disk only).
    pub folded: bool,
}

/// How far each event source has come, to tell a source replaying a backlog (an agent's spool draining after
/// an outage, an adapter catching up on history) from one reporting live. A source is *catching up* while it is
/// still sending (its last batch within [`SourceMarks::QUIET_MS`]) and either its events run more than
/// [`SourceMarks::LAG_MS`] behind the collector's clock, or its current burst of batches covers event time much
/// faster than wall time (a replay: a day of events in seconds, right up to the present). The deadlines of its
/// jobs are judged once it has caught up or gone quiet, so a job whose first step is further down the backlog
/// never pages. Not persisted: after a restart every source counts as live.
#[derive(Debug, Default)]
pub struct SourceMarks {
    marks: HashMap<u64, SourceMark>,
}

/// One source's progress.
#[derive(Debug, Clone, Copy)]
struct SourceMark {
    /// Latest event time ever received.
    max_at_ms: i64,
    /// When it last sent.
    last_received_ms: i64,
    /// The current burst (batches less than QUIET_MS apart): when it began, and its event-time span.
    burst_received_ms: i64,
    burst_min_at_ms: i64,
    burst_max_at_ms: i64,
}

impl SourceMarks {
    /// Events this far behind the collector's clock make a source one that is catching up.
    pub const LAG_MS: i64 = 120_000;
    /// A source that sent nothing for this long has delivered its backlog.
    pub const QUIET_MS: i64 = 3_000;
    /// A burst is a replay when its events span more than twice the wall time it took plus this slack (an
    /// adapter's poll may report a few minutes of transitions at once).
    const REPLAY_SLACK_MS: i64 = 60_000;
    /// Sources remembered at most (the ones not heard from for longest are forgotten first).
    const MAX_SOURCES: usize = 100_000;

    /// A batch from `source` held an event at `at_ms`, received at `now`.
    pub fn note(&mut self, source: u64, at_ms: i64, now: i64) {
        if source == 0 {
            return;
        }
        if self.marks.len() >= Self::MAX_SOURCES && !self.marks.contains_key(&source) {
            self.marks.retain(|_, m| now - m.last_received_ms < Self::QUIET_MS);
        }
        let fresh = SourceMark {
            max_at_ms: at_ms,
            last_received_ms: now,
            burst_received_ms: now,
            burst_min_at_ms: at_ms,
            burst_max_at_ms: at_ms,
        };
        let m = self.marks.entry(source).or_insert(fresh);
        if now - m.last_received_ms >= Self::QUIET_MS {
            // A new burst after a quiet spell.
            *m = SourceMark { max_at_ms: m.max_at_ms.max(at_ms), ..fresh };
        }
        m.max_at_ms = m.max_at_ms.max(at_ms);
        m.last_received_ms = m.last_received_ms.max(now);
        m.burst_min_at_ms = m.burst_min_at_ms.min(at_ms);
        m.burst_max_at_ms = m.burst_max_at_ms.max(at_ms);
    }

    /// Whether `source` is still sending a backlog (see [`SourceMarks`]).
    pub fn catching_up(&self, source: u64, now: i64) -> bool {
        self.marks.get(&source).is_some_and(|m| {
            let sending = now - m.last_received_ms < Self::QUIET_MS;
            let behind = m.max_at_ms < now - Self::LAG_MS;
            let replaying =
                m.burst_max_at_ms - m.burst_min_at_ms > 2 * (now - m.burst_received_ms) + Self::REPLAY_SLACK_MS;
            sending && (behind || replaying)
        })
    }
}

/// Every job the collector knows, plus which changed since the last checkpoint, and the state derived from them
/// (kept under the same lock so it always matches the jobs).
#[derive(Debug)]
pub struct JobIndex {
    /// Hot jobs by id, in id order (the API paginates by id).
    pub jobs: BTreeMap<String, HotJob>,
    /// Folded jobs.
    pub cold: ColdJobs,
    /// Hot jobs changed since the last checkpoint.
    pub dirty: HashSet<String>,
    /// Hot jobs that have ended, with when they last changed (collector time): fold candidates.
    pub settling: HashMap<String, i64>,
    /// Hot jobs that still have summaries in the store (folded once, then hot again after a late event), with
    /// the summaries' numbers: the job's next fold replaces them, retention deletes them.
    pub stale_summaries: HashMap<String, Vec<u64>>,
    /// The highest log sequence applied.
    pub last_seq: u64,
    /// SLO windows and the deadline index.
    pub slo: SloEngine,
    /// Bumped each time [`JobIndex::replace_slos`] installs new definitions (the alert loop then reconciles).
    pub slo_generation: u64,
    /// Per source: how far its events have come, to tell a backlog being replayed from live reports.
    pub sources: SourceMarks,
    /// Job gauges for metrics, kept incrementally.
    pub gauges: JobGauges,
    /// Bounds free-text metric attributes.
    pub limiter: LabelLimiter,
    /// Memory budget of hot jobs, bytes by [`JobIndex::hot_bytes`] (`store.hot_budget_mib`; unbounded unless
    /// set): over it, the applier folds ended jobs without waiting for them to settle.
    pub hot_budget: usize,
    /// Memory budget of folded rows and the dictionary entries they name, bytes by [`ColdJobs::bytes`] plus
    /// [`cold::Dictionary::bytes`] (`store.folded_budget_mib`; unbounded unless set): over it, the applier deletes
    /// the folded jobs that ended longest ago.
    pub folded_budget: usize,
    /// Jobs deleted since start, by why, and how far the budget reached (self-metrics).
    pub deleted: Deleted,
    /// Recent waits of comparable jobs, for expected starts ([`crate::slo::eta`]): kept as jobs change.
    pub waits: WaitBook,
}

/// Jobs the applier deleted since start (see `applier::retention`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deleted {
    /// Ended longer ago than `store.retention`.
    pub expired: u64,
    /// Folded jobs deleted to bring folded rows within [`JobIndex::folded_budget`].
    pub over_budget: u64,
    /// The latest end time (Unix ms) of a job ever deleted for the budget (0: none; the store keeps it): the
    /// history the index holds is complete only for jobs that ended after it.
    pub over_budget_through_ms: i64,
}

impl Default for JobIndex {
    fn default() -> Self {
        JobIndex::new(BTreeMap::new(), 0, SloEngine::new(Vec::new()), LabelLimiter::new(&LabelSettings::default()))
    }
}

impl JobIndex {
    /// An index over restored jobs: assesses every job for the SLOs and the metric gauges (silently: no counter
    /// moves for history).
    pub fn new(jobs: BTreeMap<String, JobRecord>, last_seq: u64, slo: SloEngine, limiter: LabelLimiter) -> Self {
        Self::new_at(jobs, ColdJobs::default(), last_seq, slo, limiter, startline_proto::time::now_ms())
    }

    /// [`JobIndex::new`] with folded jobs, as of a given time.
    pub fn new_at(
        jobs: BTreeMap<String, JobRecord>,
        cold: ColdJobs,
        last_seq: u64,
        slo: SloEngine,
        limiter: LabelLimiter,
        now: i64,
    ) -> Self {
        let mut idx = JobIndex {
            jobs: BTreeMap::new(),
            cold,
            dirty: HashSet::new(),
            settling: HashMap::new(),
            stale_summaries: HashMap::new(),
            last_seq,
            slo,
            slo_generation: 0,
            sources: SourceMarks::default(),
            gauges: JobGauges::default(),
            limiter,
            hot_budget: usize::MAX,
            folded_budget: usize::MAX,
            deleted: Deleted::default(),
            waits: WaitBook::default(),
        };
        let mut t = Timeline::default();
        for (id, row) in &idx.cold.rows {
            idx.cold.fill(row, &mut t);
            idx.slo.count_ended(id, &t, now, 1);
            if let Some(e) = eta::entry_of(&t) {
                idx.waits.add(job_hash(id), &e);
            }
        }
        for (id, rec) in jobs {
            idx.waits.replace(job_hash(&id), None, wait_entry(&rec.timeline, &rec.events).as_ref());
            let mut hot = HotJob { rec, snap: SnapMark::fresh(), ..Default::default() };
            idx.slo.on_job(&id, &hot.rec.timeline, &mut hot.slo, now);
            hot.metrics = footprint(&hot.rec.timeline, &idx.limiter, None);
            idx.gauges.update(&id, None, hot.metrics.as_ref(), &hot.rec.timeline, true);
            if hot.rec.timeline.state == crate::job::JobState::Done {
                idx.settling.insert(id.clone(), now);
            }
            idx.jobs.insert(id, hot);
        }
        idx
    }

    /// Records that `job_id` received an event from `source` (a hash) that happened at `at_ms`, at collector time
    /// `now`.
    pub fn note_source(&mut self, job_id: &str, source: u64, at_ms: i64, now: i64) {
        if let Some(h) = self.jobs.get_mut(job_id) {
            h.source = source;
        }
        self.sources.note(source, at_ms, now);
    }

    /// Starts applying a group commit: SLO decisions are counted once per job, by the group's outcome.
    pub fn begin_group(&mut self) {
        self.slo.begin_group();
    }

    /// Ends a group commit (see [`JobIndex::begin_group`]).
    pub fn end_group(&mut self) {
        let jobs = &self.jobs;
        self.slo.end_group(|id| jobs.get(id).map(|h| h.slo.clone()));
    }

    /// Whether `job_id`'s source is still replaying a backlog: its page waits until what the backlog holds has
    /// been applied (see [`SourceMarks::catching_up`]).
    pub fn catching_up(&self, job_id: &str, now: i64) -> bool {
        self.jobs.get(job_id).is_some_and(|h| self.sources.catching_up(h.source, now))
    }

    /// Installs new SLO definitions (a reload): every job, hot and folded, is assessed again, so windows, deadlines
    /// and breached-waiting counts are exactly those a restart with the new definitions would build. Jobs past a
    /// new deadline and still waiting raise page changes (the alert loop pages them unless the crossing is older
    /// than `page_max_age`, or the page is already firing). Takes time proportional to the jobs known.
    pub fn replace_slos(&mut self, defs: Vec<crate::slo::SloDef>, now: i64) {
        let mut slo = SloEngine::new(defs);
        let mut t = Timeline::default();
        for (id, row) in &self.cold.rows {
            self.cold.fill(row, &mut t);
            slo.count_ended(id, &t, now, 1);
        }
        for (id, hot) in self.jobs.iter_mut() {
            hot.slo.clear();
            slo.on_job(id, &hot.rec.timeline, &mut hot.slo, now);
        }
        slo.carry_decisions(&self.slo);
        self.slo = slo;
        self.slo_generation += 1;
    }

    /// Records the stored summaries of hot jobs (after a restore: jobs unfolded by a late event, or whose
    /// summary was unusable); entries of jobs that are not hot are left out.
    pub fn with_stale_summaries(mut self, stale: HashMap<String, Vec<u64>>) -> Self {
        self.stale_summaries = stale.into_iter().filter(|(id, _)| self.jobs.contains_key(id)).collect();
        self
    }

    /// Marks jobs as changed since the last checkpoint: after a restore, every job rebuilt from the log tail,
    /// whose snapshot lacks those events (else the next checkpoint would move the marker past them unwritten).
    pub fn with_dirty(mut self, dirty: HashSet<String>) -> Self {
        self.dirty = dirty;
        self
    }

    /// Sets what the store's snapshot parts hold of restored jobs: the highest sequence, by job.
    pub fn with_snapshot_through(mut self, through: HashMap<String, u64>) -> Self {
        for (id, seq) in through {
            if let Some(h) = self.jobs.get_mut(&id) {
                h.snap.through = seq;
            }
        }
        self
    }

    /// Jobs known, hot and folded.
    pub fn len(&self) -> usize {
        self.jobs.len() + self.cold.len()
    }

    /// Whether no job is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The index with a memory budget for hot jobs (see [`JobIndex::hot_budget`]).
    pub fn with_hot_budget(mut self, bytes: usize) -> Self {
        self.hot_budget = bytes;
        self
    }

    /// The index with a memory budget for folded rows (see [`JobIndex::folded_budget`]).
    pub fn with_folded_budget(mut self, bytes: usize) -> Self {
        self.folded_budget = bytes;
        self
    }

    /// Estimated bytes of the hot jobs (a fixed share per job for its timeline, derived state and map entry,
    /// plus the room its events' vector holds); takes one pass over the hot jobs.
    pub fn hot_bytes(&self) -> usize {
        self.hot_bytes_with(self.hot_events().1)
    }

    /// Events held by hot jobs, and the room their vectors hold.
    fn hot_events(&self) -> (usize, usize) {
        self.jobs.values().fold((0, 0), |(n, room), h| (n + h.rec.events.len(), room + h.rec.events.capacity()))
    }

    /// [`JobIndex::hot_bytes`] given the room of the hot jobs' event vectors.
    fn hot_bytes_with(&self, event_room: usize) -> usize {
        self.jobs.len() * HOT_JOB_BYTES + event_room * std::mem::size_of::<CompactEvent>()
    }

    /// What the index holds and its estimated size in memory, for self-metrics.
    pub fn memory(&self) -> MemoryUse {
        let (events, room) = self.hot_events();
        let hot_bytes = self.hot_bytes_with(room);
        MemoryUse {
            hot_jobs: self.jobs.len(),
            hot_events: events,
            hot_bytes,
            hot_budget_bytes: self.hot_budget,
            folded_jobs: self.cold.len(),
            folded_bytes: self.cold.bytes(),
            folded_budget_bytes: self.folded_budget,
            dictionary_entries: self.cold.dict.live(),
            dictionary_bytes: self.cold.dict.bytes(),
            slo_bytes: self.slo.memory_bytes(),
        }
    }

    /// A folded job's row.
    pub fn folded(&self, job_id: &str) -> Option<&Row> {
        self.cold.rows.get(job_id)
    }

    /// Inserts a new, durable event (its `seq` assigned) into its job, creating the job if needed, and updates
    /// everything derived. The job must be hot (see [`JobIndex::unfold`]). Returns the transitions to record.
    pub fn insert(&mut self, job_id: &str, ev: CompactEvent, now: i64) -> Vec<Observation> {
        let seq = ev.seq;
        let hot = match self.jobs.get_mut(job_id) {
            Some(h) => {
                let before = eta::EntrySignature::of(&h.rec.timeline);
                // A scheduler's estimate arriving late, before the first step it estimated, changes its error.
                let estimate_at = match &ev.kind {
                    crate::job::EventKind::Queued { estimated_start: Some(_), .. } => Some(ev.at_ms),
                    _ => None,
                };
                h.rec.insert_unchecked(ev);
                let t = &h.rec.timeline;
                let late_estimate = estimate_at.is_some_and(|at| t.first_step_at.is_some_and(|f| at <= f));
                if late_estimate || eta::EntrySignature::of(t) != before {
                    let after = wait_entry(&h.rec.timeline, &h.rec.events);
                    self.waits.replace(job_hash(job_id), before.entry().as_ref(), after.as_ref());
                }
                h
            }
            None => self.jobs.entry(job_id.to_string()).or_insert_with(|| HotJob {
                rec: JobRecord::from_events(vec![ev]),
                snap: SnapMark::fresh(),
                ..Default::default()
            }),
        };
        if hot.rec.events.len() == 1 {
            let after = wait_entry(&hot.rec.timeline, &hot.rec.events);
            self.waits.replace(job_hash(job_id), None, after.as_ref());
        }
        self.slo.on_job(job_id, &hot.rec.timeline, &mut hot.slo, now);
        let fp = footprint(&hot.rec.timeline, &self.limiter, hot.metrics.as_ref());
        let obs = self.gauges.update(job_id, hot.metrics.as_ref(), fp.as_ref(), &hot.rec.timeline, false);
        hot.metrics = fp;
        if hot.rec.timeline.state == crate::job::JobState::Done {
            // An ended job rarely gets more events: give back the room the vector grew for (up to half of it),
            // once, when it ends (not at every late event, which would copy the vector each time).
            if !self.settling.contains_key(job_id) {
                hot.rec.events.shrink_to_fit();
            }
            self.settling.insert(job_id.to_string(), now);
        } else {
            self.settling.remove(job_id);
        }
        if !self.dirty.contains(job_id) {
            self.dirty.insert(job_id.to_string());
        }
        self.last_seq = self.last_seq.max(seq);
        obs
    }

    /// Re-assesses jobs whose SLO deadline passed (they become bad while still waiting). Returns each job
    /// re-assessed with its SLO contributions before (the applier turns them into stream changes).
    pub fn advance_deadlines(&mut self, now: i64) -> Vec<(String, Vec<Contribution>)> {
        let due = self.slo.take_due(now);
        let mut out = Vec::with_capacity(due.len());
        for job_id in due {
            if let Some(h) = self.jobs.get_mut(&job_id) {
                let before = h.slo.clone();
                self.slo.on_job(&job_id, &h.rec.timeline, &mut h.slo, now);
                out.push((job_id, before));
            }
        }
        out
    }

    /// Makes a folded job hot again from its events (read from the store), before a late event is applied to
    /// it. Its SLO contributions and footprint are recomputed silently (the windows already count them).
    /// Returns false if the job is not folded.
    pub fn unfold(&mut self, job_id: &str, events: Vec<CompactEvent>, now: i64) -> bool {
        let before = self.cold.rows.get(job_id).map(|r| self.cold.timeline(r)).and_then(|t| eta::entry_of(&t));
        let Some(row) = self.cold.remove(job_id) else { return false };
        self.stale_summaries.entry(job_id.to_string()).or_default().push(row.summary());
        let rec = JobRecord::from_events(events);
        self.waits.replace(job_hash(job_id), before.as_ref(), wait_entry(&rec.timeline, &rec.events).as_ref());
        let mut slo = Vec::new();
        self.slo.assess_into(&rec.timeline, now, &mut slo);
        let metrics = footprint(&rec.timeline, &self.limiter, None);
        if rec.timeline.state == crate::job::JobState::Done {
            self.settling.insert(job_id.to_string(), now);
        }
        self.jobs.insert(job_id.to_string(), HotJob { rec, slo, metrics, source: 0, snap: SnapMark::fresh() });
        true
    }

    /// Folds a hot, ended job into a row, dropping its events from memory; `summary` is the number of the
    /// summary the store holds for it (which replaced its stale ones). Its SLO contributions stay counted (they
    /// are final). Returns the row, or `None` if the job is not hot and ended.
    pub fn fold(&mut self, job_id: &str, summary: u64) -> Option<Folded> {
        let attrs = self.jobs.get(job_id)?.rec.timeline.attrs.clone()?;
        let id = self.cold.dict.intern(&attrs);
        self.cold.dict.pin(id);
        let row = self.fold_as(job_id, summary, id);
        if row.is_none() {
            self.cold.dict.unpin(id);
        }
        row
    }

    /// [`JobIndex::fold`] under attribute entry `attrs`, the one the summary names, which the caller pinned
    /// ([`cold::Dictionary::pin`]) when it made the summary: the row takes the pin over. Returns `None` (the pin
    /// stays the caller's) if the job is not hot and ended.
    pub fn fold_as(&mut self, job_id: &str, summary: u64, attrs: u32) -> Option<Folded> {
        let hot = self.jobs.get(job_id)?;
        let row = Folded::of(&hot.rec.timeline, attrs)?.with_summary(summary);
        self.jobs.remove(job_id);
        self.dirty.remove(job_id);
        self.settling.remove(job_id);
        self.stale_summaries.remove(job_id);
        self.cold.insert_pinned(job_id, row.clone());
        Some(row)
    }

    /// Removes a job (hot or folded) with its SLO contributions and metric footprint. Returns what the store
    /// holds of it, or `None` if unknown.
    pub fn remove(&mut self, job_id: &str, now: i64) -> Option<Removed> {
        if let Some(mut h) = self.jobs.remove(job_id) {
            if let Some(e) = eta::entry_of(&h.rec.timeline) {
                self.waits.remove(job_hash(job_id), &e);
            }
            self.slo.forget(job_id, &mut h.slo);
            self.gauges.update(job_id, h.metrics.as_ref(), None, &h.rec.timeline, true);
            self.dirty.remove(job_id);
            self.settling.remove(job_id);
            let summaries = self.stale_summaries.remove(job_id).unwrap_or_default();
            return Some(Removed { seqs: h.rec.events.iter().map(|e| e.seq).collect(), summaries });
        }
        // The timeline before the row goes: removing the last row naming an attribute set frees its entry.
        let t = self.cold.timeline(self.cold.rows.get(job_id)?);
        let row = self.cold.remove(job_id)?;
        self.slo.count_ended(job_id, &t, now, -1);
        if let Some(e) = eta::entry_of(&t) {
            self.waits.remove(job_hash(job_id), &e);
        }
        Some(Removed { seqs: Vec::new(), summaries: vec![row.summary()] })
    }
}

/// The hash a job is filed under in the [`WaitBook`].
fn job_hash(job_id: &str) -> u64 {
    startline_proto::hash::fnv1a64(job_id.as_bytes())
}

/// A job's entry in the [`WaitBook`], with the scheduler's error once it started.
fn wait_entry(t: &Timeline, events: &[CompactEvent]) -> Option<eta::Entry> {
    let mut e = eta::entry_of(t)?;
    if let eta::Outcome::Started { scheduler_error_ms, .. } = &mut e.outcome {
        *scheduler_error_ms = eta::scheduler_error(t, events);
    }
    Some(e)
}

/// What the store holds of a job removed from the index (see [`JobIndex::remove`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removed {
    /// The log sequences of a hot job's events (a folded job's are listed by its summary).
    pub seqs: Vec<u64>,
    /// The numbers of its summaries in the store: a folded job's, or a hot job's stale ones.
    pub summaries: Vec<u64>,
}

/// Fixed bytes of one hot job beside its events: the record, timeline, fold state, SLO contributions, metric
/// footprint and map entry, with its own copy of its attributes (an estimate: `collector/tests/memory.rs` counts
/// what a typical job of 20 events really holds, ~2.8 KB beside its events, and checks the estimate against it).
const HOT_JOB_BYTES: usize = 2816;

/// What the index holds, with estimated bytes (reported in self-metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryUse {
    /// Hot jobs.
    pub hot_jobs: usize,
    /// Events held by hot jobs.
    pub hot_events: usize,
    /// Estimated bytes of hot jobs.
    pub hot_bytes: usize,
    /// Their budget ([`JobIndex::hot_budget`]).
    pub hot_budget_bytes: usize,
    /// Folded jobs.
    pub folded_jobs: usize,
    /// Estimated bytes of folded rows, their ids and wait segments.
    pub folded_bytes: usize,
    /// Their budget ([`JobIndex::folded_budget`]).
    pub folded_budget_bytes: usize,
    /// Distinct attribute sets of folded jobs.
    pub dictionary_entries: usize,
    /// Their estimated bytes.
    pub dictionary_bytes: usize,
    /// Estimated bytes of the SLO windows (minute counts, exact times to first step) and deadline index.
    pub slo_bytes: usize,
}

/// What a scan derives for folded jobs beyond their timeline.
#[derive(Debug, Clone, Copy, Default)]
struct Needs {
    /// SLO contributions.
    slo: bool,
    /// Placements (node names).
    placements: bool,
}

/// A cheaply clonable handle to the index. Readers hold the lock briefly; never across `.await`.
#[derive(Debug, Clone, Default)]
pub struct SharedIndex(Arc<RwLock<JobIndex>>);

impl SharedIndex {
    /// Wraps an index.
    pub fn new(index: JobIndex) -> Self {
        SharedIndex(Arc::new(RwLock::new(index)))
    }

    /// Read access. A poisoned lock (a panic while writing) is still readable: the index is only ever changed
    /// by whole-event inserts.
    pub fn read(&self) -> RwLockReadGuard<'_, JobIndex> {
        self.0.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Visits every job, hot and folded, in id order, `chunk` jobs per read lock, releasing the lock between
    /// chunks so a long scan (comparisons, overviews, filtered listings over a million jobs) never holds the
    /// applier off for more than one chunk. Jobs changed during the scan are seen in whichever state the visit
    /// finds them. Folded jobs' SLO contributions are not computed ([`JobRef::slo`] is empty for them): use
    /// [`SharedIndex::for_each_job_with_slo`] when they are needed; nor are their placements
    /// ([`SharedIndex::for_each_job_with_placements`]).
    pub fn for_each_job(&self, chunk: usize, mut f: impl FnMut(&str, JobRef<'_>)) {
        self.scan(
            None,
            chunk,
            Needs::default(),
            |_, _| true,
            |k, r| {
                f(k, r);
                true
            },
        );
    }

    /// [`SharedIndex::for_each_job`] with every job's SLO contributions.
    pub fn for_each_job_with_slo(&self, chunk: usize, mut f: impl FnMut(&str, JobRef<'_>)) {
        self.scan(
            None,
            chunk,
            Needs { slo: true, placements: false },
            |_, _| true,
            |k, r| {
                f(k, r);
                true
            },
        );
    }

    /// [`SharedIndex::for_each_job`] with folded jobs' placements filled in too (the other scans leave a folded
    /// job's `timeline.placements` empty: copying them is most of a scan's cost per folded job).
    pub fn for_each_job_with_placements(&self, chunk: usize, mut f: impl FnMut(&str, JobRef<'_>)) {
        self.scan(
            None,
            chunk,
            Needs { slo: false, placements: true },
            |_, _| true,
            |k, r| {
                f(k, r);
                true
            },
        );
    }

    /// Like [`SharedIndex::for_each_job`], starting after `after` and stopping when `f` returns false.
    pub fn scan_from(&self, after: Option<&str>, chunk: usize, f: impl FnMut(&str, JobRef<'_>) -> bool) {
        self.scan(after, chunk, Needs::default(), |_, _| true, f)
    }

    /// Like [`SharedIndex::scan_from`], showing each folded job to `pre` first, as its row: only rows `pre`
    /// accepts have their timeline filled in and go to `f`. A reader that can tell from a row (its times, its
    /// attributes) whether it wants the job saves filling a timeline for the rest (a skipped row still costs the
    /// walk to it: ~0.1-0.2 µs per row at 1M jobs, BENCHMARKS.md run 14); a reader that needs nothing more
    /// than the row handles it in `pre` and returns false.
    pub fn scan_where(
        &self,
        after: Option<&str>,
        chunk: usize,
        pre: impl FnMut(&str, FoldedRef<'_>) -> bool,
        f: impl FnMut(&str, JobRef<'_>) -> bool,
    ) {
        self.scan(after, chunk, Needs::default(), pre, f)
    }

    /// Every job once, hot and folded, in no particular order, for readers that only aggregate (counts, sorted
    /// samples): like [`SharedIndex::scan_where`] without an `after` and without stopping, without placements,
    /// and with folded jobs' SLO contributions when `with_slo`. The key space is walked in chunks, each under one read lock: a chunk ends at
    /// the `chunk`-th folded job (or hot job, if those come first), and inside it the folded jobs and then the hot
    /// ones are visited by range, without comparing their ids. (The ordered walk compares the next hot and folded
    /// ids at every step, touching every id's bytes: most of an overview at 1M jobs, BENCHMARKS.md run 18.)
    pub fn scan_unordered(
        &self,
        chunk: usize,
        with_slo: bool,
        pre: impl FnMut(&str, FoldedRef<'_>) -> bool,
        f: impl FnMut(&str, JobRef<'_>),
    ) {
        self.scan_unordered_with(chunk, Needs { slo: with_slo, placements: false }, pre, f)
    }

    /// [`SharedIndex::scan_unordered`] with the folded jobs `pre` accepts filled in with their placements (the
    /// history files' `nodes`).
    pub fn scan_unordered_with_placements(
        &self,
        chunk: usize,
        pre: impl FnMut(&str, FoldedRef<'_>) -> bool,
        f: impl FnMut(&str, JobRef<'_>),
    ) {
        self.scan_unordered_with(chunk, Needs { slo: false, placements: true }, pre, f)
    }

    fn scan_unordered_with(
        &self,
        chunk: usize,
        needs: Needs,
        mut pre: impl FnMut(&str, FoldedRef<'_>) -> bool,
        mut f: impl FnMut(&str, JobRef<'_>),
    ) {
        let with_slo = needs.slo;
        let chunk = chunk.max(1);
        let mut after: Option<String> = None;
        let mut scratch = Timeline::default();
        let mut contribs: Vec<Contribution> = Vec::new();
        let now = startline_proto::time::now_ms();
        loop {
            let idx = self.read();
            let lower = after.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
            // The chunk's end: its `chunk`-th folded job, or the end of the index.
            let mut end: Option<&str> =
                idx.cold.rows.range::<str, _>((lower, Bound::Unbounded)).nth(chunk - 1).map(|(k, _)| &**k);
            // Hot jobs up to it, at most `chunk` of them (else the chunk ends at the last one visited).
            let mut n = 0;
            for (k, h) in idx.jobs.range::<str, _>((lower, end.map_or(Bound::Unbounded, Bound::Included))) {
                f(k, JobRef { timeline: &h.rec.timeline, slo: &h.slo, folded: false });
                n += 1;
                if n == chunk {
                    end = Some(k.as_str());
                    break;
                }
            }
            for (k, row) in idx.cold.rows.range::<str, _>((lower, end.map_or(Bound::Unbounded, Bound::Included))) {
                let wanted = match idx.cold.dict.get(row.attrs) {
                    Some(attrs) => pre(k, FoldedRef { row, attrs }),
                    None => true,
                };
                if wanted {
                    idx.cold.fill_with(row, &mut scratch, needs.placements);
                    contribs.clear();
                    if with_slo {
                        idx.slo.assess_into(&scratch, now, &mut contribs);
                    }
                    f(k, JobRef { timeline: &scratch, slo: &contribs, folded: true });
                }
            }
            let Some(end) = end.map(str::to_string) else { return };
            drop(idx);
            after = Some(end);
        }
    }

    fn scan(
        &self,
        after: Option<&str>,
        chunk: usize,
        needs: Needs,
        mut pre: impl FnMut(&str, FoldedRef<'_>) -> bool,
        mut f: impl FnMut(&str, JobRef<'_>) -> bool,
    ) {
        let chunk = chunk.max(1);
        let mut after: Option<String> = after.map(str::to_string);
        let mut scratch = Timeline::default();
        let mut contribs: Vec<Contribution> = Vec::new();
        let now = startline_proto::time::now_ms();
        loop {
            let idx = self.read();
            let lower = after.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
            let mut hot = idx.jobs.range::<str, _>((lower, Bound::Unbounded)).peekable();
            let mut cold = idx.cold.rows.range::<str, _>((lower, Bound::Unbounded)).peekable();
            let mut n = 0;
            let mut last: Option<&str> = None;
            while n < chunk {
                let take_hot = match (hot.peek(), cold.peek()) {
                    (Some((h, _)), Some((c, _))) => h.as_str() < &***c,
                    (Some(_), None) => true,
                    (None, Some(_)) => false,
                    (None, None) => break,
                };
                let (k, go_on) = if take_hot {
                    let Some((k, h)) = hot.next() else { break };
                    (k.as_str(), f(k, JobRef { timeline: &h.rec.timeline, slo: &h.slo, folded: false }))
                } else {
                    let Some((k, row)) = cold.next() else { break };
                    let wanted = match idx.cold.dict.get(row.attrs) {
                        Some(attrs) => pre(k, FoldedRef { row, attrs }),
                        None => true,
                    };
                    if !wanted {
                        n += 1;
                        last = Some(k);
                        continue;
                    }
                    idx.cold.fill_with(row, &mut scratch, needs.placements);
                    if needs.slo {
                        idx.slo.assess_into(&scratch, now, &mut contribs);
                    }
                    (&**k, f(k, JobRef { timeline: &scratch, slo: &contribs, folded: true }))
                };
                if !go_on {
                    return;
                }
                n += 1;
                last = Some(k);
            }
            let next = last.map(str::to_string);
            drop(hot);
            drop(cold);
            drop(idx);
            if n < chunk {
                return;
            }
            after = next;
        }
    }

    /// Write access, for the applier.
    pub fn write(&self) -> RwLockWriteGuard<'_, JobIndex> {
        self.0.write().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod eta_tests;
#[cfg(test)]
mod tests;
