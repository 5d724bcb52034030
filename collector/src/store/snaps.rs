//! Snapshot parts: the hot jobs' compact events as checkpoints store them (see the store's module doc). A part
//! is one file of [`PartFiles`] holding the events of many jobs, `[7] ++ crc32 ++ varint(raw length) ++
//! zstd(raw)`, raw being per job `varint(len) ++ job_id ++ varint(len) ++ events`, events as [`events_body`]
//! encodes them: a checkpoint's *increment* (the events its dirty jobs gained since their last part) or a part of
//! a *base* (every hot job's events, written when the increments outgrow the last base). Tree `jobs` keeps
//! `[5u8] ++ job_id`, the tombstone of a job retention deleted (`number ++ highest sequence`, both u64
//! big-endian: its events in parts written before are not restored). Numbers come from one counter, so every
//! increment written after a base is numbered above it. Startline 0.1.0 stored parts as values of tree `jobs`,
//! `[3u8] ++ number` for increments and `[4u8] ++ base number ++ part number` for bases: read, and removed by the
//! next base.

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

/// The key of increment `no` (in sled, as 0.1.0 wrote them).
#[cfg(test)]
pub(super) fn inc_key(no: u64) -> [u8; 9] {
    let mut k = [INC_PREFIX; 9];
    k[1..].copy_from_slice(&no.to_be_bytes());
    k
}

/// The key of part `part` of base `base` (in sled, as 0.1.0 wrote them).
#[cfg(test)]
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
    let mut body = super::unseal_as(PART_VERSION, v)?;
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

/// The snapshot parts' files, in the store's directory `snaps/` beside sled's: one file per part, named by its
/// kind and number (`inc-<number>.part`, `base-<base>-<part>.part`, numbers as 20 decimal digits so names sort as
/// numbers do), holding the part exactly as [`PartWriter`] made it (sealed and checksummed). Parts are large values
/// written once and deleted whole, which sled keeps badly (a superseded value's space is reclaimed only when its
/// segment is mostly garbage); as files they take their bytes on disk and nothing more, and sled keeps only small
/// values. A part is written to a temporary name, synced, renamed, and the directory synced: a crash leaves a
/// part whole or absent (a leftover temporary file is ignored and removed by the next base).
pub(super) struct PartFiles {
    dir: std::path::PathBuf,
}

/// A part file found in the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum PartFile {
    /// An increment, by number.
    Inc(u64),
    /// Part `1` of base `0`.
    Base(u64, u64),
    /// A temporary file a crash left.
    Temp(String),
}

impl PartFile {
    pub(super) fn name(&self) -> String {
        match self {
            PartFile::Inc(no) => format!("inc-{no:020}.part"),
            PartFile::Base(base, part) => format!("base-{base:020}-{part:020}.part"),
            PartFile::Temp(name) => name.clone(),
        }
    }

    fn parse(name: &str) -> Option<PartFile> {
        if name.ends_with(".tmp") {
            return Some(PartFile::Temp(name.to_string()));
        }
        let stem = name.strip_suffix(".part")?;
        let number = |s: &str| (s.len() == 20 && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok())?;
        if let Some(no) = stem.strip_prefix("inc-") {
            return number(no).map(PartFile::Inc);
        }
        let (base, part) = stem.strip_prefix("base-")?.split_once('-')?;
        Some(PartFile::Base(number(base)?, number(part)?))
    }

    /// The highest number the file's name holds (0 for a temporary file).
    pub(super) fn number(&self) -> u64 {
        match self {
            PartFile::Inc(no) => *no,
            PartFile::Base(base, _) => *base,
            PartFile::Temp(_) => 0,
        }
    }
}

impl PartFiles {
    /// The directory `dir`, created (private) when missing.
    pub(super) fn open(dir: &std::path::Path) -> Result<PartFiles, super::StoreError> {
        super::create_private_dir(dir)?;
        Ok(PartFiles { dir: dir.to_path_buf() })
    }

    fn err(&self, path: &std::path::Path, e: std::io::Error) -> super::StoreError {
        super::files::file_err(path, e)
    }

    /// Every part file, with its size, increments and bases in number order.
    pub(super) fn list(&self) -> Result<Vec<(PartFile, u64)>, super::StoreError> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(|e| self.err(&self.dir, e))? {
            let entry = entry.map_err(|e| self.err(&self.dir, e))?;
            let Some(file) = entry.file_name().to_str().and_then(PartFile::parse) else { continue };
            let len = entry.metadata().map_err(|e| self.err(&entry.path(), e))?.len();
            out.push((file, len));
        }
        out.sort_by(|a, b| {
            let key = |f: &PartFile| match f {
                PartFile::Base(b, p) => (0, *b, *p),
                PartFile::Inc(n) => (1, *n, 0),
                PartFile::Temp(_) => (2, 0, 0),
            };
            key(&a.0).cmp(&key(&b.0))
        });
        Ok(out)
    }

    /// A part's bytes.
    pub(super) fn read(&self, file: &PartFile) -> Result<Vec<u8>, super::StoreError> {
        let path = self.dir.join(file.name());
        std::fs::read(&path).map_err(|e| self.err(&path, e))
    }

    /// Writes `parts` under the names `files` gives, each synced and renamed into place, then syncs the directory:
    /// once this returns, every one of them survives a crash.
    pub(super) fn write(&self, parts: impl IntoIterator<Item = (PartFile, Vec<u8>)>) -> Result<(), super::StoreError> {
        use std::io::Write;
        let mut wrote = false;
        for (file, bytes) in parts {
            let path = self.dir.join(file.name());
            let tmp = self.dir.join(format!("{}.tmp", file.name()));
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)
                .map_err(|e| self.err(&tmp, e))?;
            f.write_all(&bytes).and_then(|()| f.sync_all()).map_err(|e| self.err(&tmp, e))?;
            drop(f);
            std::fs::rename(&tmp, &path).map_err(|e| self.err(&path, e))?;
            wrote = true;
            std::thread::yield_now();
        }
        if wrote {
            self.sync()?;
        }
        Ok(())
    }

    /// Removes `files` (a file already gone is fine), then syncs the directory.
    pub(super) fn remove(&self, files: &[PartFile]) -> Result<(), super::StoreError> {
        for file in files {
            let path = self.dir.join(file.name());
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(self.err(&path, e)),
            }
        }
        if !files.is_empty() {
            self.sync()?;
        }
        Ok(())
    }

    fn sync(&self) -> Result<(), super::StoreError> {
        std::fs::File::open(&self.dir).and_then(|d| d.sync_all()).map_err(|e| self.err(&self.dir, e))
    }
}

#[cfg(test)]
mod file_tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sort_as_numbers() {
        for f in [PartFile::Inc(0), PartFile::Inc(u64::MAX), PartFile::Base(7, 0), PartFile::Base(u64::MAX, 12)] {
            assert_eq!(PartFile::parse(&f.name()), Some(f.clone()), "{}", f.name());
        }
        for bad in ["inc-1.part", "inc-0000000000000000000x.part", "base-00000000000000000001.part", "x.part", "inc"] {
            assert_eq!(PartFile::parse(bad), None, "{bad}");
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let files = PartFiles::open(&dir.path().join("snaps")).expect("open");
        files
            .write([
                (PartFile::Inc(10), b"ten".to_vec()),
                (PartFile::Inc(9), b"nine".to_vec()),
                (PartFile::Base(3, 1), b"b31".to_vec()),
                (PartFile::Base(3, 0), b"b30".to_vec()),
            ])
            .expect("write");
        std::fs::write(dir.path().join("snaps/inc-00000000000000000011.part.tmp"), b"torn").expect("tmp");
        let listed = files.list().expect("list");
        let names: Vec<PartFile> = listed.iter().map(|(f, _)| f.clone()).collect();
        assert_eq!(
            names,
            [
                PartFile::Base(3, 0),
                PartFile::Base(3, 1),
                PartFile::Inc(9),
                PartFile::Inc(10),
                PartFile::Temp("inc-00000000000000000011.part.tmp".into())
            ]
        );
        assert_eq!(listed[2].1, 4);
        assert_eq!(files.read(&PartFile::Inc(10)).expect("read"), b"ten");
        files.remove(&[PartFile::Inc(9), PartFile::Inc(9), names[4].clone()]).expect("remove");
        assert_eq!(files.list().expect("list").len(), 3);
    }
}
