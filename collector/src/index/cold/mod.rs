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
mod dictionary;
mod folded;
mod image;
mod row;

pub use dictionary::Dictionary;
pub use folded::Folded;
use folded::*;
pub use image::Image;
pub use row::Row;
use row::*;

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

#[cfg(test)]
mod tests {
    use super::dictionary::encode_attrs;
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
