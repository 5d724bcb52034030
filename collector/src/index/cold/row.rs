//! A folded job in memory: a [`Row`] (the times scans judge by as plain fields, the rest packed as varints, node
//! names as numbers into the [`NodeTable`] rows share), packed from a [`Folded`] and unpacked into a timeline.

use super::*;

/// One folded job in memory: what scans judge a job by as plain fields, the rest of its [`Folded`] packed (see
/// the module doc). Made and read by [`ColdJobs`], which holds the node names the packed placements number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Index into the attribute dictionary.
    pub attrs: u32,
    pub(super) submitted_at: i64,
    pub(super) done_at: i64,
    pub(super) first_step_at: i64,
    /// The number of its summary in the store (see [`Folded::with_summary`]).
    pub(super) summary: u64,
    /// Every other field of the [`Folded`], as [`pack`] writes them.
    pub(super) packed: Box<[u8]>,
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
pub(super) struct NodeTable {
    pub(super) names: Vec<Arc<str>>,
    pub(super) ids: HashMap<Arc<str>, u32>,
}

impl NodeTable {
    /// The number of a name, adding it (and counting its bytes) if new.
    pub(super) fn id(&mut self, name: &Arc<str>, bytes: &mut usize) -> u32 {
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
    pub(super) fn name(&self, id: u64) -> Arc<str> {
        usize::try_from(id).ok().and_then(|i| self.names.get(i)).cloned().unwrap_or_else(|| Arc::from(""))
    }
}

/// Bits of a packed row's `present` byte: which optional times it holds.
pub(super) const HAS_FIRST_QUEUED: u8 = 1;
pub(super) const HAS_NODE_ASSIGNED: u8 = 2;
pub(super) const HAS_PREPARING: u8 = 4;
pub(super) const HAS_CHECKPOINT: u8 = 8;
/// Bits of a packed placement's head byte above its end's index (3 bits).
pub(super) const PLACED_FIRST_STEP: u8 = 8;
pub(super) const PLACED_ENDED: u8 = 16;
pub(super) const PLACED_LOST_NODE: u8 = 32;

pub(super) fn put_u(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(super) fn put_i(out: &mut Vec<u8>, v: i64) {
    put_u(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// Reads what [`put_u`] and [`put_i`] wrote; past the end every read is 0 (the bytes are the collector's own,
/// written by [`pack`]: a short read cannot happen, and must not panic if it did).
pub(super) struct Unpack<'a> {
    pub(super) rest: &'a [u8],
}

impl Unpack<'_> {
    pub(super) fn u(&mut self) -> u64 {
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

    pub(super) fn i(&mut self) -> i64 {
        let z = self.u();
        ((z >> 1) as i64) ^ -((z & 1) as i64)
    }

    pub(super) fn byte(&mut self) -> u8 {
        match self.rest.split_first() {
            Some((&b, rest)) => {
                self.rest = rest;
                b
            }
            None => 0,
        }
    }

    /// A time written as its offset from `base`.
    pub(super) fn at(&mut self, base: i64) -> i64 {
        base.wrapping_add(self.i())
    }

    pub(super) fn u32(&mut self) -> u32 {
        u32::try_from(self.u()).unwrap_or(u32::MAX)
    }

    pub(super) fn i32(&mut self) -> i32 {
        i32::try_from(self.i()).unwrap_or_default()
    }
}

pub(super) fn put_segment(out: &mut Vec<u8>, s: Segment) {
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

pub(super) fn take_segment(r: &mut Unpack<'_>) -> Segment {
    match r.byte() {
        1 => Segment::Queued(pb::WaitReason::try_from(r.i32()).unwrap_or_default()),
        2 => Segment::Assigned,
        3 => Segment::Preparing(pb::PreparingPhase::try_from(r.i32()).unwrap_or_default()),
        _ => Segment::Unreported,
    }
}

/// Packs a folded job (node names numbered in `nodes`, whose new names' bytes are added to `bytes`).
pub(super) fn pack(f: &Folded, nodes: &mut NodeTable, bytes: &mut usize) -> Row {
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
pub(super) struct Scalars {
    pub(super) first_queued_at: i64,
    pub(super) node_assigned_at: i64,
    pub(super) preparing_at: i64,
    pub(super) checkpoint_at: i64,
    pub(super) checkpoint_step: u64,
    pub(super) lost_steps: u64,
    pub(super) max_step: u64,
    pub(super) requeue_wait_ms: i64,
    pub(super) lost_work_ms: i64,
    pub(super) checkpoint_save_ms: i64,
    pub(super) failed_work_ms: i64,
    pub(super) runs: u32,
    pub(super) attempts: u32,
    pub(super) preemptions: u32,
    pub(super) node_losses: u32,
    pub(super) ignored_after_done: u32,
    pub(super) exit_code: i32,
    pub(super) outcome: i32,
    pub(super) flags: u8,
}

pub(super) fn take_scalars(row: &Row, r: &mut Unpack<'_>) -> Scalars {
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

pub(super) fn take_placement(base: i64, nodes: &NodeTable, r: &mut Unpack<'_>) -> Placement {
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
