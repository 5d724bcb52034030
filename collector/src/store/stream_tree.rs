//! The stream's tree: records written as sealed zstd blocks of consecutive cursors, the `log_through` and
//! `changes_through` markers, reads after a cursor, trims by age.

use super::*;

impl Store {
    /// Writes stream records holding the event records of log entries (consecutive cursors, recorded at `at_ms`)
    /// with the stream's log marker (event records are held through log sequence `log_through`) and, when given,
    /// the changes marker (see [`Store::stream_put`]), in one batch, without a flush: a crash before the next
    /// flush loses all or none, and the stream's writer adds the missing records from the log at start.
    pub fn stream_put_events<B: AsRef<[u8]>>(
        &self,
        records: &[(u64, B)],
        log_through: u64,
        changes_through: Option<u64>,
        at_ms: i64,
    ) -> Result<(), StoreError> {
        let t = self.w()?;
        let mut batch = stream_batch(records, at_ms)?;
        batch.insert(STREAM_LOG_KEY, seal(&log_through.to_be_bytes()));
        if let Some(c) = changes_through {
            batch.insert(STREAM_CHANGES_KEY, seal(&c.to_be_bytes()));
        }
        t.stream.apply_batch(batch)?;
        Ok(())
    }

    /// The last log sequence whose event record the stream holds (written with the event records, after the log
    /// entries: sled may persist the log batch and not the stream's if the process dies between the two, and
    /// the stream's writer then adds the missing event records at start). `None` before the stream's first write.
    pub fn stream_log_through(&self) -> Result<Option<u64>, StoreError> {
        let t = self.t()?;
        let Some(v) = t.stream.get(STREAM_LOG_KEY)? else { return Ok(None) };
        let bad = |r: String| corrupt("stream", STREAM_LOG_KEY, r);
        let body = unseal(&v).map_err(bad)?;
        let arr: [u8; 8] = body.try_into().map_err(|_| bad("not 8 bytes".to_string()))?;
        Ok(Some(u64::from_be_bytes(arr)))
    }

    /// Records that the stream holds event records through log sequence `seq` (no flush).
    pub fn set_stream_log_through(&self, seq: u64) -> Result<(), StoreError> {
        let t = self.w()?;
        t.stream.insert(STREAM_LOG_KEY, seal(&seq.to_be_bytes()))?;
        Ok(())
    }

    /// Up to `limit` log entries after `after`, in order: `(seq, job id, stored value)`.
    pub fn log_after(&self, after: u64, limit: usize) -> Result<Vec<(u64, String, Vec<u8>)>, StoreError> {
        let t = self.t()?;
        let mut out = Vec::new();
        let dead = t.dead();
        let mut events = log::Events::from(&t.files, &dead, after.saturating_add(1))?;
        while out.len() < limit {
            let Some((seq, body)) = events.next_event()? else { break };
            let ev = decode_log_body(seq, &body)?;
            out.push((seq, ev.job_id, seal(&body)));
        }
        Ok(out)
    }

    /// Writes stream records (consecutive cursors, recorded at `at_ms`) as one block without a flush (the next
    /// flush makes them durable), and, when given, the cursor of the last event record whose change records are
    /// now written.
    pub fn stream_put<B: AsRef<[u8]>>(
        &self,
        records: &[(u64, B)],
        changes_through: Option<u64>,
        at_ms: i64,
    ) -> Result<(), StoreError> {
        let t = self.w()?;
        let mut batch = stream_batch(records, at_ms)?;
        if let Some(c) = changes_through {
            batch.insert(STREAM_CHANGES_KEY, seal(&c.to_be_bytes()));
        }
        t.stream.apply_batch(batch)?;
        Ok(())
    }

    /// The cursor of the last event record whose change records were written (0: none).
    pub fn stream_changes_through(&self) -> Result<u64, StoreError> {
        let t = self.t()?;
        Ok(sealed_array(&t.stream, "stream", STREAM_CHANGES_KEY)?.map_or(0, u64::from_be_bytes))
    }

    /// The oldest and newest retained stream cursors, if any record is retained.
    pub fn stream_bounds(&self) -> Result<Option<(u64, u64)>, StoreError> {
        let t = self.t()?;
        let range = || t.stream.range(stream_key(0)..);
        let first = match range().next() {
            Some(kv) => stream_cursor(&kv?.0)?,
            None => return Ok(None),
        };
        let last = match range().next_back() {
            Some(kv) => {
                let (k, v) = kv?;
                let (count, _) = stream_block_meta(&k, &v)?;
                stream_cursor(&k)? + u64::from(count) - 1
            }
            None => return Ok(None),
        };
        Ok(Some((first, last)))
    }

    /// Stream records with cursors above `after`, in order: whole blocks until at least `limit` records (or the
    /// end).
    pub fn stream_read(&self, after: u64, limit: usize) -> Result<Vec<pb::StreamRecord>, StoreError> {
        let t = self.t()?;
        let want = after.saturating_add(1);
        // The block holding `want` starts at or before it.
        let start = match t.stream.range(stream_key(0)..=stream_key(want)).next_back() {
            Some(kv) => stream_cursor(&kv?.0)?,
            None => 0,
        };
        let mut out = Vec::new();
        for kv in t.stream.range(stream_key(start)..) {
            let (k, v) = kv?;
            for r in decode_stream_block(&k, &v)? {
                if r.cursor > after {
                    out.push(r);
                }
            }
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// Deletes stream blocks whose records were all recorded before `before_ms`, oldest first, at most `limit`
    /// records' worth, never the newest block. Returns how many records went.
    pub fn stream_trim(&self, before_ms: i64, limit: usize) -> Result<usize, StoreError> {
        let t = self.w()?;
        let Some(last_key) = t.stream.range(stream_key(0)..).next_back().transpose()?.map(|(k, _)| k) else {
            return Ok(0);
        };
        let mut batch = sled::Batch::default();
        let mut n = 0;
        for kv in t.stream.range(stream_key(0)..) {
            let (k, v) = kv?;
            if k == last_key || n >= limit {
                break;
            }
            let (count, newest_ms) = stream_block_meta(&k, &v)?;
            if newest_ms >= before_ms {
                break;
            }
            batch.remove(k);
            n += count as usize;
        }
        if n > 0 {
            t.stream.apply_batch(batch)?;
        }
        Ok(n)
    }
}

const STREAM_CHANGES_KEY: &[u8] = b"\0changes_through";
pub(super) const STREAM_LOG_KEY: &[u8] = b"\0log_through";

pub(super) fn stream_key(cursor: u64) -> [u8; 9] {
    let mut k = [1u8; 9];
    k[1..].copy_from_slice(&cursor.to_be_bytes());
    k
}

fn stream_cursor(key: &[u8]) -> Result<u64, StoreError> {
    match key {
        [1, rest @ ..] if rest.len() == 8 => {
            let mut a = [0u8; 8];
            a.copy_from_slice(rest);
            Ok(u64::from_be_bytes(a))
        }
        _ => Err(corrupt("stream", key, "not a stream record key")),
    }
}

/// The format of a stream block body (inside the sealed value): `[format] ++ count u32 LE ++ recorded_at ms i64
/// LE ++ raw length u32 LE ++ payload`, the payload being, per record in cursor order, `varint(len) ++
/// StreamRecord`; format 1 stores it as is, format 2 zstd-compressed (blocks over 256 bytes).
const STREAM_RAW: u8 = 1;
const STREAM_ZSTD: u8 = 2;
const STREAM_HEADER: usize = 17;

/// One block per run of consecutive cursors (a writer's records always are one run). (Blocks capped at 32 KiB
/// were tried: smaller blocks compress less, and sled then held more space than it does for the large values it
/// keeps as blob files; BENCHMARKS.md, run 11.)
fn stream_batch<B: AsRef<[u8]>>(records: &[(u64, B)], at_ms: i64) -> Result<sled::Batch, StoreError> {
    let mut batch = sled::Batch::default();
    for (first, value) in encode_stream_blocks(records, at_ms)? {
        batch.insert(&stream_key(first), value);
    }
    Ok(batch)
}

/// The sealed blocks of `records`: `(first cursor, value)`.
pub(super) fn encode_stream_blocks<B: AsRef<[u8]>>(
    records: &[(u64, B)],
    at_ms: i64,
) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
    use prost::encoding::encode_varint;
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < records.len() {
        let first = records[i].0;
        let mut j = i;
        let mut raw = Vec::new();
        while j < records.len() && records[j].0 == first + (j - i) as u64 {
            let bytes = records[j].1.as_ref();
            encode_varint(bytes.len() as u64, &mut raw);
            raw.extend_from_slice(bytes);
            j += 1;
        }
        let count = (j - i) as u32;
        let (format, payload) = if raw.len() > 256 {
            let z = log::compress(&raw, 1).map_err(|e| corrupt("stream", &stream_key(first), e))?;
            (STREAM_ZSTD, z)
        } else {
            (STREAM_RAW, raw.clone())
        };
        let mut body = Vec::with_capacity(STREAM_HEADER + payload.len());
        body.push(format);
        body.extend_from_slice(&count.to_le_bytes());
        body.extend_from_slice(&at_ms.to_le_bytes());
        body.extend_from_slice(&(raw.len() as u32).to_le_bytes());
        body.extend_from_slice(&payload);
        blocks.push((first, seal(&body)));
        i = j;
    }
    Ok(blocks)
}

/// A block's record count and recording time, without decompressing it.
fn stream_block_meta(key: &[u8], v: &[u8]) -> Result<(u32, i64), StoreError> {
    let body = unseal(v).map_err(|r| corrupt("stream", key, r))?;
    if body.len() < STREAM_HEADER || !matches!(body[0], STREAM_RAW | STREAM_ZSTD) {
        return Err(corrupt("stream", key, "not a stream block"));
    }
    let count = u32::from_le_bytes([body[1], body[2], body[3], body[4]]);
    let mut at = [0u8; 8];
    at.copy_from_slice(&body[5..13]);
    if count == 0 {
        return Err(corrupt("stream", key, "empty block"));
    }
    Ok((count, i64::from_le_bytes(at)))
}

fn decode_stream_block(key: &[u8], v: &[u8]) -> Result<Vec<pb::StreamRecord>, StoreError> {
    let first = stream_cursor(key)?;
    let (count, _) = stream_block_meta(key, v)?;
    let bad = |r: String| corrupt("stream", key, r);
    let body = unseal(v).map_err(bad)?;
    let raw_len = u32::from_le_bytes([body[13], body[14], body[15], body[16]]) as usize;
    let payload = &body[STREAM_HEADER..];
    let raw = match body[0] {
        STREAM_ZSTD => log::decompress(payload, raw_len).map_err(|e| bad(e.to_string()))?,
        _ => payload.to_vec(),
    };
    if raw.len() != raw_len {
        return Err(bad(format!("{} bytes, header says {raw_len}", raw.len())));
    }
    let mut buf = raw.as_slice();
    let mut out = Vec::with_capacity(count as usize);
    for i in 0..u64::from(count) {
        let len = prost::encoding::decode_varint(&mut buf).map_err(|e| bad(e.to_string()))? as usize;
        if len > buf.len() {
            return Err(bad("truncated record".into()));
        }
        let rec = pb::StreamRecord::decode(&buf[..len]).map_err(|e| bad(e.to_string()))?;
        if rec.cursor != first + i {
            return Err(bad(format!("record {i} holds cursor {}, expected {}", rec.cursor, first + i)));
        }
        out.push(rec);
        buf = &buf[len..];
    }
    if !buf.is_empty() {
        return Err(bad("bytes after the last record".into()));
    }
    Ok(out)
}
