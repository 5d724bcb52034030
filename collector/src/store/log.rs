//! The event log as compressed blocks: the block and dead-record codecs, the in-memory table of dead events,
//! and the reads and writes the store makes of them (the blocks live in the log's files, see [`super::files`];
//! the dead records in sled's tree `log_blocks`).
//!
//! A group commit's events go in as one or more *blocks* (at most [`BLOCK_MAX_EVENTS`] events or
//! [`BLOCK_MAX_RAW`] bytes each), each sealed (version [`BLOCK_VERSION`]) `[format] ++ varint(count) ++
//! varint(last seq - first seq) ++ payload`, the payload being per event, in sequence order, `varint(seq - first
//! seq) ++ varint(len) ++ protobuf LifecycleEvent`; format 1 keeps it as is, format 2 is `varint(raw length) ++
//! zstd(payload)` (blocks over 256 bytes, when smaller). Its first sequence is in its frame. Blocks never overlap.
//!
//! Sequences are never reused, not even those of a failed group commit (a failed append is cut from the file;
//! one the file kept although the commit failed stays, and is read back by the next start), so a lookup by sequence always
//! lands on the block that holds it.
//!
//! Events leave the log when their job is deleted by retention (a folded job's summary lists its sequences).
//! Gone events are listed in their block's
//! *dead record*, key `[1u8] ++ first seq`, value sealed (version [`DEAD_VERSION`]) `varint(count) ++ varint(n)
//! ++ n x varint(seq delta)` (count: the block's events; deltas from the block's first seq, then from the
//! previous dead seq), written in the same sled transaction as the rest of the job's removal. Once a segment's
//! events are all or half dead it is deleted or rewritten (see [`super::files`]) and its blocks' dead records
//! go. Readers never see dead events: every read filters them through the in-memory [`DeadTable`] (loaded at
//! open from the dead records, checked against the blocks' event counts).

use super::files::{BlockIter, LogFiles};
use super::{corrupt, seal_as, unseal_as, StoreError};
use prost::encoding::{decode_varint, encode_varint};
use std::collections::BTreeMap;
use std::ops::Range;

/// Seal version of a block value.
pub(super) const BLOCK_VERSION: u8 = 3;
/// Seal version of a dead record.
pub(super) const DEAD_VERSION: u8 = 3;
/// At most this many events per block.
pub(super) const BLOCK_MAX_EVENTS: usize = 256;
/// A block is closed once its payload reaches this many bytes (before compression). (While blocks lived in
/// sled, 16 KiB blocks made sled tear its log on a full disk; the log's files have no such limit.)
pub(super) const BLOCK_MAX_RAW: usize = 4 * 1024;
const FORMAT_RAW: u8 = 1;
const FORMAT_ZSTD: u8 = 2;
const COMPRESS_OVER: usize = 256;
const ZSTD_LEVEL: i32 = 1;
const DEAD_PREFIX: u8 = 1;

/// Key of the dead record of the block starting at `first`.
pub(super) fn dead_key(first: u64) -> [u8; 9] {
    let mut k = [DEAD_PREFIX; 9];
    k[1..].copy_from_slice(&first.to_be_bytes());
    k
}

/// The first sequence in a dead-record key.
pub(super) fn key_seq(key: &[u8]) -> Result<u64, StoreError> {
    match key {
        [DEAD_PREFIX, rest @ ..] if rest.len() == 8 => {
            let mut a = [0u8; 8];
            a.copy_from_slice(rest);
            Ok(u64::from_be_bytes(a))
        }
        _ => Err(corrupt("log", key, "not a dead-record key")),
    }
}

/// What a block holds: the tree it is named by in errors and the seal version of its values. The log's blocks
/// and the summaries' packs (see `super::packs`) share the block format.
#[derive(Debug, Clone, Copy)]
pub(super) struct Kind {
    pub what: &'static str,
    pub version: u8,
}

/// The log's blocks.
pub(super) const LOG: Kind = Kind { what: "log", version: BLOCK_VERSION };

impl Kind {
    fn bad(self, first: u64, reason: impl ToString) -> StoreError {
        StoreError::Corrupt { what: self.what, key: format!("block {first}"), reason: reason.to_string() }
    }
}

/// Encodes events `(seq, protobuf body)`, ascending and all at or above `first`, as one sealed block value.
pub(super) fn encode_block(first: u64, events: &[(u64, &[u8])]) -> Result<Vec<u8>, StoreError> {
    encode_block_of(LOG, first, events)
}

/// Encodes entries `(number, bytes)`, ascending and all at or above `first`, as one sealed block of `kind`.
pub(super) fn encode_block_of(kind: Kind, first: u64, events: &[(u64, &[u8])]) -> Result<Vec<u8>, StoreError> {
    encode_block_at(kind, first, events, ZSTD_LEVEL)
}

/// [`encode_block_of`] at zstd level `level`.
pub(super) fn encode_block_at(
    kind: Kind,
    first: u64,
    events: &[(u64, &[u8])],
    level: i32,
) -> Result<Vec<u8>, StoreError> {
    let (Some(head), Some(last)) = (events.first(), events.last()) else {
        return Err(kind.bad(first, "an empty block"));
    };
    if head.0 < first || events.windows(2).any(|w| w[0].0 >= w[1].0) {
        return Err(kind.bad(first, "sequences not ascending from the block's first"));
    }
    let mut raw = Vec::with_capacity(events.iter().map(|(_, b)| b.len() + 4).sum());
    for (seq, body) in events {
        encode_varint(seq - first, &mut raw);
        encode_varint(body.len() as u64, &mut raw);
        raw.extend_from_slice(body);
    }
    let mut out = Vec::with_capacity(raw.len() / 2 + 16);
    let mut compressed = None;
    if raw.len() > COMPRESS_OVER {
        let z = compress(&raw, level).map_err(|e| kind.bad(first, e))?;
        if z.len() + 4 < raw.len() {
            compressed = Some(z);
        }
    }
    out.push(if compressed.is_some() { FORMAT_ZSTD } else { FORMAT_RAW });
    encode_varint(events.len() as u64, &mut out);
    encode_varint(last.0 - first, &mut out);
    match compressed {
        Some(z) => {
            encode_varint(raw.len() as u64, &mut out);
            out.extend_from_slice(&z);
        }
        None => out.extend_from_slice(&raw),
    }
    Ok(seal_as(kind.version, &out))
}

/// A block's event count and last sequence, without decompressing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BlockMeta {
    pub count: u32,
    pub last: u64,
}

fn block_header(kind: Kind, first: u64, v: &[u8]) -> Result<(u8, BlockMeta, &[u8]), StoreError> {
    let body = unseal_as(kind.version, v).map_err(|r| kind.bad(first, r))?;
    let Some((&format, mut rest)) = body.split_first() else { return Err(kind.bad(first, "empty value")) };
    if !matches!(format, FORMAT_RAW | FORMAT_ZSTD) {
        return Err(kind.bad(first, format!("unknown block format {format}")));
    }
    let count = decode_varint(&mut rest).map_err(|e| kind.bad(first, e))?;
    let span = decode_varint(&mut rest).map_err(|e| kind.bad(first, e))?;
    if count == 0 || count > u64::from(u32::MAX) {
        return Err(kind.bad(first, format!("block claims {count} events")));
    }
    let last = first.checked_add(span).ok_or_else(|| kind.bad(first, "last sequence overflows"))?;
    Ok((format, BlockMeta { count: count as u32, last }, rest))
}

/// The header of a stored block.
pub(super) fn block_meta(first: u64, v: &[u8]) -> Result<BlockMeta, StoreError> {
    block_meta_of(LOG, first, v)
}

/// The header of a stored block of `kind`.
pub(super) fn block_meta_of(kind: Kind, first: u64, v: &[u8]) -> Result<BlockMeta, StoreError> {
    block_header(kind, first, v).map(|(_, m, _)| m)
}

/// A decoded block: its events' sequences and protobuf bodies.
pub(super) struct Block {
    pub first: u64,
    raw: Vec<u8>,
    entries: Vec<(u64, Range<usize>)>,
}

impl Block {
    /// The events, in sequence order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &[u8])> + '_ {
        self.entries.iter().map(|(s, r)| (*s, &self.raw[r.clone()]))
    }

    /// The body of the event at `seq`, if the block holds it.
    pub fn get(&self, seq: u64) -> Option<&[u8]> {
        let i = self.entries.binary_search_by_key(&seq, |(s, _)| *s).ok()?;
        Some(&self.raw[self.entries[i].1.clone()])
    }

    /// The last sequence the block holds.
    pub fn last(&self) -> u64 {
        self.entries.last().map_or(self.first, |(s, _)| *s)
    }
}

/// Decodes a stored block (checksum, header, every event's framing).
pub(super) fn decode_block(first: u64, v: &[u8]) -> Result<Block, StoreError> {
    decode_block_of(LOG, first, v)
}

/// Decodes a stored block of `kind` (checksum, header, every entry's framing).
pub(super) fn decode_block_of(kind: Kind, first: u64, v: &[u8]) -> Result<Block, StoreError> {
    let (format, meta, mut rest) = block_header(kind, first, v)?;
    let raw = if format == FORMAT_ZSTD {
        let raw_len = decode_varint(&mut rest).map_err(|e| kind.bad(first, e))?;
        // A block's payload is at most BLOCK_MAX_RAW plus one event; anything far above is damage.
        if raw_len > (64 << 20) {
            return Err(kind.bad(first, format!("block claims {raw_len} bytes")));
        }
        let raw = decompress(rest, raw_len as usize).map_err(|e| kind.bad(first, e))?;
        if raw.len() as u64 != raw_len {
            return Err(kind.bad(first, format!("{} bytes, header says {raw_len}", raw.len())));
        }
        raw
    } else {
        rest.to_vec()
    };
    let mut entries = Vec::with_capacity(meta.count as usize);
    let mut buf: &[u8] = &raw;
    let mut prev: Option<u64> = None;
    while !buf.is_empty() {
        let delta = decode_varint(&mut buf).map_err(|e| kind.bad(first, e))?;
        let len = decode_varint(&mut buf).map_err(|e| kind.bad(first, e))? as usize;
        if len > buf.len() {
            return Err(kind.bad(first, "truncated event"));
        }
        let seq = first.checked_add(delta).ok_or_else(|| kind.bad(first, "sequence overflows"))?;
        if prev.is_some_and(|p| p >= seq) {
            return Err(kind.bad(first, "sequences out of order"));
        }
        prev = Some(seq);
        let start = raw.len() - buf.len();
        entries.push((seq, start..start + len));
        buf = &buf[len..];
    }
    if entries.len() != meta.count as usize || prev != Some(meta.last) {
        return Err(kind.bad(first, format!("{} events through {prev:?}, header says {meta:?}", entries.len())));
    }
    Ok(Block { first, raw, entries })
}

/// Splits events (ascending) into blocks of at most [`BLOCK_MAX_EVENTS`] events and about [`BLOCK_MAX_RAW`]
/// bytes: `(first seq, sealed value)`.
pub(super) fn encode_blocks(events: &[(u64, &[u8])]) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
    encode_blocks_of(LOG, events, BLOCK_MAX_EVENTS, BLOCK_MAX_RAW)
}

/// Splits entries (ascending) into blocks of `kind` of at most `max_entries` entries and about `max_raw` bytes:
/// `(first number, sealed value)`.
pub(super) fn encode_blocks_of(
    kind: Kind,
    entries: &[(u64, &[u8])],
    max_entries: usize,
    max_raw: usize,
) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
    encode_blocks_at(kind, entries, max_entries, max_raw, ZSTD_LEVEL)
}

/// [`encode_blocks_of`] at zstd level `level`.
pub(super) fn encode_blocks_at(
    kind: Kind,
    entries: &[(u64, &[u8])],
    max_entries: usize,
    max_raw: usize,
    level: i32,
) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < entries.len() {
        let mut j = i;
        let mut bytes = 0;
        while j < entries.len() && j - i < max_entries && bytes < max_raw {
            bytes += entries[j].1.len() + 4;
            j += 1;
        }
        let first = entries[i].0;
        out.push((first, encode_block_at(kind, first, &entries[i..j], level)?));
        i = j;
    }
    Ok(out)
}

/// The dead events of one block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Dead {
    /// The block's event count.
    pub count: u32,
    /// Dead sequences, ascending.
    pub seqs: Vec<u64>,
}

/// Encodes a dead record of the block starting at `first`.
pub(super) fn encode_dead(first: u64, dead: &Dead) -> Vec<u8> {
    let mut body = Vec::with_capacity(dead.seqs.len() * 2 + 8);
    encode_varint(u64::from(dead.count), &mut body);
    encode_varint(dead.seqs.len() as u64, &mut body);
    let mut prev = first;
    for &s in &dead.seqs {
        encode_varint(s - prev, &mut body);
        prev = s;
    }
    seal_as(DEAD_VERSION, &body)
}

/// Decodes a dead record of the block starting at `first`.
pub(super) fn decode_dead(first: u64, v: &[u8]) -> Result<Dead, StoreError> {
    let bad = |r: String| StoreError::Corrupt { what: "log", key: format!("dead record {first}"), reason: r };
    let mut body = unseal_as(DEAD_VERSION, v).map_err(bad)?;
    let count = decode_varint(&mut body).map_err(|e| bad(e.to_string()))?;
    let n = decode_varint(&mut body).map_err(|e| bad(e.to_string()))?;
    if count == 0 || count > u64::from(u32::MAX) || n > count {
        return Err(bad(format!("{n} dead of {count}")));
    }
    let mut seqs = Vec::with_capacity(n as usize);
    let mut prev = first;
    for i in 0..n {
        let d = decode_varint(&mut body).map_err(|e| bad(e.to_string()))?;
        if i > 0 && d == 0 {
            return Err(bad("dead sequences repeat".into()));
        }
        prev = prev.checked_add(d).ok_or_else(|| bad("sequence overflows".into()))?;
        seqs.push(prev);
    }
    if !body.is_empty() {
        return Err(bad("bytes after the last dead sequence".into()));
    }
    Ok(Dead { count: count as u32, seqs })
}

/// The dead events of every block that has any, by block first seq.
#[derive(Debug, Default)]
pub(super) struct DeadTable {
    blocks: BTreeMap<u64, Dead>,
}

impl DeadTable {
    /// Loads the dead records of a `log_blocks` tree, keeping those of blocks `counts` (first sequence -> event
    /// count) holds with the count they were written for; the others are left over from a segment deleted or
    /// rewritten just before a crash (see [`super::files`]) and are removed from the tree.
    pub fn load(tree: &sled::Tree, counts: &BTreeMap<u64, u32>) -> Result<DeadTable, StoreError> {
        let mut blocks = BTreeMap::new();
        let mut stale = sled::Batch::default();
        let mut n_stale = 0usize;
        for kv in tree.range(dead_key(0)..) {
            let (k, v) = kv?;
            let first = key_seq(&k)?;
            let dead = decode_dead(first, &v)?;
            if counts.get(&first) == Some(&dead.count) {
                blocks.insert(first, dead);
            } else {
                stale.remove(k);
                n_stale += 1;
            }
        }
        if n_stale > 0 {
            tracing::info!(records = n_stale, "log: dropping dead records of blocks no longer stored");
            tree.apply_batch(stale)?;
            tree.flush()?;
        }
        Ok(DeadTable { blocks })
    }

    /// The dead record of the block at `first`: its event count and dead sequences.
    pub fn of(&self, first: u64) -> Option<(u32, Vec<u64>)> {
        self.blocks.get(&first).map(|d| (d.count, d.seqs.clone()))
    }

    /// Forgets the dead records of blocks deleted or rewritten; returns the batch removing them from the tree.
    pub fn forget(&mut self, firsts: &[u64]) -> sled::Batch {
        let mut batch = sled::Batch::default();
        for first in firsts {
            self.blocks.remove(first);
            batch.remove(&dead_key(*first));
        }
        batch
    }

    /// Whether the event at `seq` of the block starting at `first` is dead.
    pub fn is_dead(&self, first: u64, seq: u64) -> bool {
        self.blocks.get(&first).is_some_and(|d| d.seqs.binary_search(&seq).is_ok())
    }

    /// Blocks with dead events, and dead events in all.
    pub fn totals(&self) -> (usize, usize) {
        (self.blocks.len(), self.blocks.values().map(|d| d.seqs.len()).sum())
    }

    fn get(&self, first: u64) -> Option<&Dead> {
        self.blocks.get(&first)
    }

    fn apply(&mut self, changes: Vec<(u64, Dead)>) {
        self.blocks.extend(changes);
    }
}

/// What a kill writes: a batch for the `log_blocks` tree and the dead-table changes to make once it is applied.
pub(super) struct Kill {
    pub batch: sled::Batch,
    changes: Vec<(u64, Dead)>,
    /// Blocks now all dead, and blocks with some events dead.
    pub stats: KillStats,
}

/// Counts of one kill: dead records written for blocks whose events are now all dead (their segment's
/// collection removes them) and for blocks with some left.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KillStats {
    pub all_dead: usize,
    pub marked: usize,
}

impl Kill {
    /// The first sequences of the blocks it marks.
    pub fn touched(&self) -> Vec<u64> {
        self.changes.iter().map(|(first, _)| *first).collect()
    }

    /// Applies the dead-table changes (after the batch was applied).
    pub fn commit(self, table: &mut DeadTable) {
        table.apply(self.changes);
    }
}

/// Plans removing the events at `seqs` (any order; sequences not in the log are ignored) from the log: every
/// block holding any gets a dead record listing them (a block whose events are all dead too: its segment's
/// collection, see [`LogFiles::collect_segment`], deletes or rewrites it once the batch is durable).
pub(super) fn plan_kill(files: &LogFiles, table: &DeadTable, seqs: &[u64]) -> Result<Kill, StoreError> {
    let mut sorted = seqs.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut batch = sled::Batch::default();
    let mut changes = Vec::new();
    let mut stats = KillStats::default();
    let mut i = 0;
    while i < sorted.len() {
        let seq = sorted[i];
        let Some(block) = files.block_at(seq)? else {
            i += 1;
            continue;
        };
        let first = block.first;
        let held: Vec<u64> = block.entries.iter().map(|(s, _)| *s).collect();
        let last = held.last().copied().unwrap_or(first);
        if seq > last {
            // In the gap after the block's last event: not in the log.
            i += 1;
            continue;
        }
        // A record for another version of the block (left by a rewrite) does not apply to this one.
        let mut dead = table
            .get(first)
            .filter(|d| d.count as usize == held.len())
            .cloned()
            .unwrap_or(Dead { count: held.len() as u32, seqs: Vec::new() });
        let before = dead.seqs.len();
        while i < sorted.len() && sorted[i] <= last {
            let s = sorted[i];
            if held.binary_search(&s).is_ok() {
                if let Err(at) = dead.seqs.binary_search(&s) {
                    dead.seqs.insert(at, s);
                }
            }
            i += 1;
        }
        if dead.seqs.len() == before {
            continue;
        }
        if dead.seqs.len() >= dead.count as usize {
            stats.all_dead += 1;
        } else {
            stats.marked += 1;
        }
        batch.insert(&dead_key(first), encode_dead(first, &dead));
        changes.push((first, dead));
    }
    Ok(Kill { batch, changes, stats })
}

/// Iterates the live events at or after `from`, block by block, in sequence order.
pub(super) struct Events<'a> {
    blocks: BlockIter<'a>,
    table: &'a DeadTable,
    from: u64,
    /// The block being read, and the sequence through which earlier blocks covered its events.
    current: Option<(Block, u64)>,
    at: usize,
}

impl<'a> Events<'a> {
    /// Live events from `from` on.
    pub fn from(files: &'a LogFiles, table: &'a DeadTable, from: u64) -> Result<Events<'a>, StoreError> {
        Ok(Events { blocks: files.blocks_from(from), table, from, current: None, at: 0 })
    }

    /// The next live event `(seq, protobuf body)`, copied out.
    pub fn next_event(&mut self) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        loop {
            if let Some((b, covered)) = &self.current {
                while self.at < b.entries.len() {
                    let (seq, r) = b.entries[self.at].clone();
                    self.at += 1;
                    if seq >= self.from && seq > *covered && !self.table.is_dead(b.first, seq) {
                        return Ok(Some((seq, b.raw[r].to_vec())));
                    }
                }
            }
            match self.blocks.next_block()? {
                Some(b) => {
                    self.current = Some(b);
                    self.at = 0;
                }
                None => return Ok(None),
            }
        }
    }
}

/// zstd decompression of at most `capacity` bytes with this thread's decompression context, reused: creating
/// one per call (what `zstd::bulk::decompress` does) was a tenth of a restart's CPU (one per summary pack).
pub(super) fn decompress(data: &[u8], capacity: usize) -> std::io::Result<Vec<u8>> {
    thread_local! {
        static DCTX: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    DCTX.with(|c| {
        let mut slot = c.borrow_mut();
        if slot.is_none() {
            *slot = Some(zstd::bulk::Decompressor::new()?);
        }
        match slot.as_mut() {
            Some(z) => z.decompress(data, capacity),
            None => zstd::bulk::decompress(data, capacity),
        }
    })
}

/// zstd at `level` with this thread's compression context, reused: creating one per call (what
/// `zstd::bulk::compress` does) costs more than compressing a group commit's block. The output is the same.
pub(super) fn compress(raw: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    thread_local! {
        static CCTX: std::cell::RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
            const { std::cell::RefCell::new(None) };
    }
    CCTX.with(|c| {
        let mut slot = c.borrow_mut();
        if slot.as_ref().is_none_or(|(l, _)| *l != level) {
            *slot = Some((level, zstd::bulk::Compressor::new(level)?));
        }
        match slot.as_mut() {
            Some((_, z)) => z.compress(raw),
            None => zstd::bulk::compress(raw, level),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(seqs: &[u64]) -> Vec<(u64, Vec<u8>)> {
        seqs.iter().map(|s| (*s, format!("event body {s} ").repeat((*s % 7 + 1) as usize).into_bytes())).collect()
    }

    fn refs(evs: &[(u64, Vec<u8>)]) -> Vec<(u64, &[u8])> {
        evs.iter().map(|(s, b)| (*s, b.as_slice())).collect()
    }

    #[test]
    fn a_block_round_trips_raw_and_compressed() {
        for seqs in [vec![7u64], vec![10, 11, 12, 40], (100..356).collect::<Vec<_>>()] {
            let evs = events(&seqs);
            let v = encode_block(seqs[0], &refs(&evs)).expect("encode");
            assert_eq!(v[0], BLOCK_VERSION);
            let b = decode_block(seqs[0], &v).expect("decode");
            let got: Vec<(u64, Vec<u8>)> = b.iter().map(|(s, x)| (s, x.to_vec())).collect();
            assert_eq!(got, evs);
            assert_eq!(
                block_meta(seqs[0], &v).expect("meta"),
                BlockMeta { count: seqs.len() as u32, last: *seqs.last().expect("last") }
            );
            assert_eq!(b.get(seqs[0]), Some(evs[0].1.as_slice()));
            assert_eq!(b.get(seqs[0] + 100_000), None);
        }
        // Many events compress: the value is well under their total.
        let evs = events(&(1..=256).collect::<Vec<_>>());
        let v = encode_block(1, &refs(&evs)).expect("encode");
        assert!(v.len() * 3 < evs.iter().map(|(_, b)| b.len()).sum::<usize>(), "{} bytes", v.len());
    }

    #[test]
    fn a_damaged_or_foreign_block_is_refused_with_its_first_seq() {
        let evs = events(&[5, 6, 9]);
        let v = encode_block(5, &refs(&evs)).expect("encode");
        let mut flipped = v.clone();
        let n = flipped.len();
        flipped[n - 2] ^= 0x20;
        let err = decode_block(5, &flipped).err().expect("checksum").to_string();
        assert!(err.contains("block 5"), "{err}");
        let mut other_version = v.clone();
        other_version[0] = 2;
        assert!(decode_block(5, &other_version).is_err());
        assert!(encode_block(5, &[]).is_err());
        assert!(encode_block(6, &refs(&evs)).is_err(), "an event below the block's first");
        let backwards = vec![(9u64, b"a".as_slice()), (6, b"b".as_slice())];
        assert!(encode_block(5, &backwards).is_err());
    }

    #[test]
    fn blocks_split_by_count_and_size() {
        let seqs: Vec<u64> = (1..=1000).collect();
        let evs = events(&seqs);
        let blocks = encode_blocks(&refs(&evs)).expect("encode");
        assert!(blocks.len() >= 1000 / BLOCK_MAX_EVENTS);
        let mut all = Vec::new();
        for (first, v) in &blocks {
            let b = decode_block(*first, v).expect("decode");
            assert!(b.entries.len() <= BLOCK_MAX_EVENTS);
            all.extend(b.iter().map(|(s, x)| (s, x.to_vec())));
        }
        assert_eq!(all, evs);
    }

    #[test]
    fn a_dead_record_round_trips_and_refuses_damage() {
        let d = Dead { count: 200, seqs: vec![1000, 1001, 1090, 1199] };
        let v = encode_dead(1000, &d);
        assert_eq!(decode_dead(1000, &v).expect("decode"), d);
        let mut flipped = v.clone();
        let n = flipped.len();
        flipped[n - 1] ^= 1;
        assert!(decode_dead(1000, &flipped).is_err());
        // A block whose events are all dead is marked so until its segment is collected.
        let all_dead = Dead { count: 2, seqs: vec![1, 2] };
        assert_eq!(decode_dead(1, &encode_dead(1, &all_dead)).expect("decode"), all_dead);
        let too_many = Dead { count: 1, seqs: vec![1, 2] };
        assert!(decode_dead(1, &encode_dead(1, &too_many)).is_err(), "more dead than the block holds");
    }
}
