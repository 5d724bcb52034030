//! Snapshot parts: the hot jobs' compact events as checkpoints store them in tree `jobs` (see the store's
//! module doc). A part is one sled value holding the events of many jobs, `[7] ++ crc32 ++ varint(raw length)
//! ++ zstd(raw)`, raw being per job `varint(len) ++ job_id ++ varint(len) ++ events`, events as
//! [`events_body`] encodes them. Keys: `[3u8] ++ number` (u64 big-endian) for a checkpoint's *increment* (the
//! events its dirty jobs gained since their last part), `[4u8] ++ base number ++ part number` for a *base* (every
//! hot job's events, written when the increments outgrow the last base), `[5u8] ++ job_id` for the tombstone of
//! a job retention deleted (`number ++ highest sequence`, both u64 big-endian: its events in parts written before
//! are not restored). Numbers come from one counter, so every increment written after a base is numbered above
//! it.

use crate::job::{CompactEvent, EventKind};

/// Sealed version of snapshot parts.
pub(super) const PART_VERSION: u8 = 7;
/// First key byte of increments.
pub(super) const INC_PREFIX: u8 = 3;
/// First key byte of base parts.
pub(super) const BASE_PREFIX: u8 = 4;
/// First key byte of tombstones.
pub(super) const TOMB_PREFIX: u8 = 5;
/// Raw bytes per part before a new part is started (a base of a million open jobs is a few dozen parts).
pub const PART_RAW_BYTES: usize = 4 << 20;
/// Largest raw part accepted when reading (a part is cut after [`PART_RAW_BYTES`] plus one job's events).
const PART_MAX_RAW: u64 = 1 << 30;
/// zstd level of parts: attribute sets and names repeat across jobs.
const PART_ZSTD_LEVEL: i32 = 3;

/// The key of increment `no`.
pub(super) fn inc_key(no: u64) -> [u8; 9] {
    let mut k = [INC_PREFIX; 9];
    k[1..].copy_from_slice(&no.to_be_bytes());
    k
}

/// The key of part `part` of base `base`.
pub(super) fn base_key(base: u64, part: u64) -> [u8; 17] {
    let mut k = [BASE_PREFIX; 17];
    k[1..9].copy_from_slice(&base.to_be_bytes());
    k[9..].copy_from_slice(&part.to_be_bytes());
    k
}

/// The prefix of every part of base `base`.
pub(super) fn base_prefix(base: u64) -> [u8; 9] {
    let mut k = [BASE_PREFIX; 9];
    k[1..].copy_from_slice(&base.to_be_bytes());
    k
}

/// The key of a job's tombstone.
pub(super) fn tomb_key(job_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + job_id.len());
    k.push(TOMB_PREFIX);
    k.extend_from_slice(job_id.as_bytes());
    k
}

/// A tombstone's body: the counter when the job was deleted, and its highest sequence.
pub(super) fn tomb_body(number: u64, max_seq: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&number.to_be_bytes());
    b[8..].copy_from_slice(&max_seq.to_be_bytes());
    b
}

/// A tombstone body's counter and highest sequence.
pub(super) fn parse_tomb(body: &[u8]) -> Result<(u64, u64), String> {
    let b: [u8; 16] = body.try_into().map_err(|_| format!("tombstone of {} bytes, not 16", body.len()))?;
    let mut n = [0u8; 8];
    n.copy_from_slice(&b[..8]);
    let mut s = [0u8; 8];
    s.copy_from_slice(&b[8..]);
    Ok((u64::from_be_bytes(n), u64::from_be_bytes(s)))
}

/// A number from a part key (`[prefix] ++ u64 ...`) at byte `at`.
pub(super) fn key_number(k: &[u8], at: usize) -> Option<u64> {
    let b: [u8; 8] = k.get(at..at + 8)?.try_into().ok()?;
    Some(u64::from_be_bytes(b))
}

/// One job's events: `varint(n)`, then per event in sequence order `varint(seq - previous seq)` (the first: the
/// sequence), `zigzag varint(at_ms - previous at_ms)` (the first: from 0), the id hash as u64 little-endian and
/// `postcard((attempt, kind))`: about 15 bytes an event before compression.
pub(super) fn events_body(events: &[CompactEvent], out: &mut Vec<u8>) -> Result<(), postcard::Error> {
    let mut sorted: Vec<&CompactEvent> = events.iter().collect();
    sorted.sort_unstable_by_key(|e| e.seq);
    prost::encoding::encode_varint(sorted.len() as u64, out);
    let (mut seq, mut at) = (0u64, 0i64);
    for e in sorted {
        prost::encoding::encode_varint(e.seq.wrapping_sub(seq), out);
        let d = e.at_ms.wrapping_sub(at);
        prost::encoding::encode_varint(((d << 1) ^ (d >> 63)) as u64, out);
        out.extend_from_slice(&e.id_hash.to_le_bytes());
        let buf = std::mem::take(out);
        *out = postcard::to_extend(&(e.attempt, &e.kind), buf)?;
        (seq, at) = (e.seq, e.at_ms);
    }
    Ok(())
}

/// Decodes [`events_body`] from the front of `rest`, advancing it.
pub(super) fn decode_events(rest: &mut &[u8]) -> Result<Vec<CompactEvent>, String> {
    let n = prost::encoding::decode_varint(rest).map_err(|e| format!("event count: {e}"))?;
    // Each event takes at least 12 bytes: a count beyond that is damage, not an allocation size.
    if n > rest.len() as u64 / 12 {
        return Err(format!("{n} events claimed in {} bytes", rest.len()));
    }
    let mut out = Vec::with_capacity(n as usize);
    let (mut seq, mut at) = (0u64, 0i64);
    for i in 0..n {
        let d = prost::encoding::decode_varint(rest).map_err(|e| format!("event {i}: sequence: {e}"))?;
        if i > 0 && d == 0 {
            return Err(format!("event {i} repeats the sequence before"));
        }
        seq = seq.checked_add(d).ok_or_else(|| format!("event {i}: sequence overflows"))?;
        let z = prost::encoding::decode_varint(rest).map_err(|e| format!("event {i}: time: {e}"))?;
        at = at.wrapping_add(((z >> 1) as i64) ^ -((z & 1) as i64));
        let (hash, tail) = rest.split_at_checked(8).ok_or_else(|| format!("event {i}: truncated id hash"))?;
        let mut h = [0u8; 8];
        h.copy_from_slice(hash);
        let ((attempt, kind), tail) =
            postcard::take_from_bytes::<(Option<u32>, EventKind)>(tail).map_err(|e| format!("event {i}: {e}"))?;
        out.push(CompactEvent { at_ms: at, id_hash: u64::from_le_bytes(h), seq, attempt, kind });
        *rest = tail;
    }
    Ok(out)
}

/// Builds parts from jobs' events: [`PartWriter::add`] each job, [`PartWriter::finish`] for the last part.
#[derive(Default)]
pub struct PartWriter {
    raw: Vec<u8>,
    done: Vec<Vec<u8>>,
}

impl PartWriter {
    /// Adds a job's events (none: nothing).
    pub fn add(&mut self, job_id: &str, events: &[CompactEvent]) -> Result<(), String> {
        if events.is_empty() {
            return Ok(());
        }
        prost::encoding::encode_varint(job_id.len() as u64, &mut self.raw);
        self.raw.extend_from_slice(job_id.as_bytes());
        let mut body = Vec::with_capacity(16 * events.len() + 4);
        events_body(events, &mut body).map_err(|e| e.to_string())?;
        prost::encoding::encode_varint(body.len() as u64, &mut self.raw);
        self.raw.extend_from_slice(&body);
        if self.raw.len() >= PART_RAW_BYTES {
            self.cut()?;
        }
        Ok(())
    }

    /// Parts completed so far (each sealed), taken.
    pub fn take_done(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.done)
    }

    /// Every part, the last one included.
    pub fn finish(mut self) -> Result<Vec<Vec<u8>>, String> {
        if !self.raw.is_empty() {
            self.cut()?;
        }
        Ok(self.done)
    }

    fn cut(&mut self) -> Result<(), String> {
        let raw = std::mem::take(&mut self.raw);
        let z = super::log::compress(&raw, PART_ZSTD_LEVEL).map_err(|e| e.to_string())?;
        let mut body = Vec::with_capacity(z.len() + 10);
        prost::encoding::encode_varint(raw.len() as u64, &mut body);
        body.extend_from_slice(&z);
        self.done.push(super::seal_as(PART_VERSION, &body));
        Ok(())
    }
}

/// Every job's events in a part, in the part's order.
pub(super) fn decode_part(v: &[u8]) -> Result<Vec<(String, Vec<CompactEvent>)>, String> {
    let mut body = super::unseal_as(PART_VERSION, v, false)?;
    let raw_len = prost::encoding::decode_varint(&mut body).map_err(|e| format!("raw length: {e}"))?;
    if raw_len > PART_MAX_RAW {
        return Err(format!("part claims {raw_len} raw bytes"));
    }
    let raw = super::log::decompress(body, raw_len as usize).map_err(|e| e.to_string())?;
    if raw.len() as u64 != raw_len {
        return Err(format!("part holds {} raw bytes, claims {raw_len}", raw.len()));
    }
    let mut rest: &[u8] = &raw;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let n = prost::encoding::decode_varint(&mut rest).map_err(|e| format!("job id length: {e}"))?;
        let (id, tail) = rest.split_at_checked(usize::try_from(n).unwrap_or(usize::MAX)).ok_or("truncated job id")?;
        let id = std::str::from_utf8(id).map_err(|_| "job id is not UTF-8")?.to_string();
        rest = tail;
        let n = prost::encoding::decode_varint(&mut rest).map_err(|e| format!("{id}: events length: {e}"))?;
        let (mut evs, tail) =
            rest.split_at_checked(usize::try_from(n).unwrap_or(usize::MAX)).ok_or("truncated events")?;
        let events = decode_events(&mut evs).map_err(|e| format!("{id}: {e}"))?;
        if !evs.is_empty() {
            return Err(format!("{id}: {} bytes after the events", evs.len()));
        }
        rest = tail;
        out.push((id, events));
    }
    Ok(out)
}
