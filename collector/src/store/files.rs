//! The event log's files: the log's blocks (format: see [`super::log`]) appended to segment files beside sled's,
//! outside sled. Owns the frame and index formats, appends with `fsync`, torn-tail recovery, lookups by
//! sequence, and deleting or rewriting segments whose events retention removed.
//!
//! # Layout
//! Directory `log/` under the store's directory:
//! - `<first seq, 20 digits>.seg`: a *segment*, frames appended in sequence order. A frame is a 16-byte header
//!   `len u32 LE ++ first seq u64 LE ++ crc32(the first 12 bytes) u32 LE` followed by `len` bytes: the sealed block
//!   value (its own version and checksum). A group commit's blocks go into one segment, written with one `write`
//!   and made durable with `fdatasync` before the commit is acknowledged; a new segment is started (and the
//!   directory synced) once the current one holds [`SEGMENT_MAX`] bytes.
//! - `<first seq>.idx`: the block index of a segment no longer appended to (`"SLIX" ++ version ++ n ++ n x (first
//!   u64, offset u32, len u32, count u32) ++ segment length u64 ++ crc32`, little-endian), so an open reads a few
//!   bytes per block instead of the segments. An index that is missing, damaged or whose length does not match
//!   its segment is ignored and the segment scanned (and the index written again).
//!
//! # Crashes
//! Only the newest segment is ever appended to. At open its frames are read up to the first that is incomplete
//! or fails a checksum, and the file is cut there: a write that was not acknowledged (its `fdatasync` never
//! returned) may be partly on disk. A damaged frame in any older segment is an error: those were acknowledged and
//! synced, and are never rewritten in place.
//!
//! Retention marks removed events in the dead records (a sled tree, see [`super::log`]); a segment whose events
//! are all dead is then deleted, and one at least half dead is rewritten with only its live events (a new file,
//! synced, renamed over the old one, the directory synced). A rewritten block holds fewer events than the dead
//! record of its old version says its block held, so a dead record left behind by a crash after the rename is
//! recognised at open (its count no longer matches the block's) and dropped.

use super::log::{self, Block, BlockMeta};
use super::StoreError;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

/// A segment takes no more appends once it holds this many bytes.
pub(super) const SEGMENT_MAX: u64 = 32 << 20;
const HEADER: usize = 16;
const INDEX_MAGIC: &[u8; 4] = b"SLIX";
const INDEX_VERSION: u8 = 1;
/// The largest frame body accepted when reading (a block is at most a few hundred KiB).
const FRAME_MAX: u32 = 64 << 20;

/// One block's place: its first sequence, where its frame's body starts, its length and its event count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ix {
    pub first: u64,
    offset: u32,
    len: u32,
    pub count: u32,
}

/// A segment: its file and its blocks.
struct Seg {
    /// The number in its name: at or below its first block's first sequence.
    name: u64,
    /// Rewritten into large blocks once sealed (see [`LogFiles::compact`]).
    compacted: bool,
    file: Arc<File>,
    blocks: Vec<Ix>,
    /// Bytes in use (frames past it are not part of the segment).
    end: u64,
}

impl Seg {
    fn events(&self) -> u64 {
        self.blocks.iter().map(|b| u64::from(b.count)).sum()
    }
}

/// The last sequence in `segs` (0 if they hold no block): read from the newest block's frame.
fn last_seq_of(dir: &Path, segs: &[Seg]) -> Result<u64, StoreError> {
    let Some((file, ix)) = segs.iter().rev().find_map(|g| g.blocks.last().map(|b| (&g.file, *b))) else {
        return Ok(0);
    };
    let mut v = vec![0u8; ix.len as usize];
    file.read_exact_at(&mut v, u64::from(ix.offset)).map_err(|e| file_err(dir, e))?;
    Ok(log::decode_block(ix.first, &v)?.last())
}

/// The log's segments. Appends, truncation and retention's deletes and rewrites are serialised by the writer
/// lock; readers take the state's read lock only to find a block, and read its frame after releasing it.
pub(super) struct LogFiles {
    dir: PathBuf,
    /// See [`SEGMENT_MAX`].
    segment_max: u64,
    state: RwLock<State>,
    writer: Mutex<Writer>,
}

#[derive(Default)]
struct State {
    /// Ascending by name.
    segs: Vec<Seg>,
    /// The last sequence appended (0 if none).
    last: u64,
}

#[derive(Default)]
struct Writer {
    /// An append failed: every later one is refused until the next open (which scans the tail again).
    broken: bool,
}

/// What the rest of the store proves about the log, for [`LogFiles::open`] to tell a torn write from damage.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Acknowledged {
    /// The highest sequence known to have been acknowledged (0: none).
    pub through: u64,
}

impl Acknowledged {
    /// Whether an append cut off at the newest segment's end was acknowledged. Its own header says where it
    /// started (`cut_first`); without one, it started past every sequence `kept`.
    fn covers(
        &self,
        cut_first: Option<u64>,
        kept: impl FnOnce() -> Result<u64, StoreError>,
    ) -> Result<bool, StoreError> {
        if self.through == 0 {
            return Ok(false);
        }
        Ok(match cut_first {
            Some(first) => self.through >= first,
            None => self.through > kept()?,
        })
    }
}

/// What one open found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct OpenStats {
    pub segments: usize,
    pub scanned: usize,
    pub blocks: usize,
    /// Bytes cut from the newest segment's end (an unacknowledged write cut short).
    pub torn_bytes: u64,
}

pub(super) fn file_err(path: &Path, source: std::io::Error) -> StoreError {
    StoreError::File { path: path.display().to_string(), source }
}

fn seg_path(dir: &Path, name: u64) -> PathBuf {
    dir.join(format!("{name:020}.seg"))
}

fn idx_path(dir: &Path, name: u64) -> PathBuf {
    dir.join(format!("{name:020}.idx"))
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| file_err(dir, e))
}

/// The bit of a header's length word saying that more frames of the same append follow.
const MORE: u32 = 1 << 31;

/// A frame's header: `more` when further frames of the same append follow it.
fn header(len: u32, first: u64, more: bool) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    let word = if more { len | MORE } else { len };
    h[..4].copy_from_slice(&word.to_le_bytes());
    h[4..12].copy_from_slice(&first.to_le_bytes());
    let crc = crc32fast::hash(&h[..12]);
    h[12..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// A header's `(len, first, more)`, if it is one.
fn parse_header(h: &[u8; HEADER]) -> Option<(u32, u64, bool)> {
    let crc = u32::from_le_bytes([h[12], h[13], h[14], h[15]]);
    if crc32fast::hash(&h[..12]) != crc {
        return None;
    }
    let word = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    let len = word & !MORE;
    let mut f = [0u8; 8];
    f.copy_from_slice(&h[4..12]);
    (len <= FRAME_MAX).then_some((len, u64::from_le_bytes(f), word & MORE != 0))
}

/// Appends the frames of `blocks` to `out` as one append (each frame but the last says more follow), returning
/// their index entries (offsets: `base` plus the position in `out`, `out` being written at `base`).
pub(super) fn frames(blocks: &[(u64, Vec<u8>)], base: u64, out: &mut Vec<u8>) -> Result<Vec<Ix>, StoreError> {
    let mut ixs = Vec::with_capacity(blocks.len());
    for (i, (first, value)) in blocks.iter().enumerate() {
        let meta = log::block_meta(*first, value)?;
        let len = u32::try_from(value.len())
            .ok()
            .filter(|l| *l <= FRAME_MAX)
            .ok_or_else(|| bad_frame(*first, "block over 64 MiB"))?;
        out.extend_from_slice(&header(len, *first, i + 1 < blocks.len()));
        let offset = base + out.len() as u64;
        let offset = u32::try_from(offset).map_err(|_| bad_frame(*first, "segment over 4 GiB"))?;
        out.extend_from_slice(value);
        ixs.push(Ix { first: *first, offset, len, count: meta.count });
    }
    Ok(ixs)
}

fn bad_frame(first: u64, reason: impl ToString) -> StoreError {
    StoreError::Corrupt { what: "log", key: format!("block {first}"), reason: reason.to_string() }
}

/// Where [`scan`] stopped short of a segment's end.
struct Damage {
    why: String,
    /// Nothing valid follows the append cut off: it may be a write a crash cut short.
    torn: bool,
    /// The first sequence of the append cut off, when a header of it could be read.
    cut_first: Option<u64>,
    /// The last sequence of the blocks kept (`None`: no block kept).
    kept_last: Option<u64>,
}

/// Reads a segment's frames from the start: its blocks, the bytes they span, and whether the read stopped at a
/// damaged or incomplete frame (the returned length is then the start of the append it belongs to: an append's
/// frames are kept all or none).
fn scan(path: &Path) -> Result<(Vec<Ix>, u64, Option<Damage>), StoreError> {
    let mut bytes = Vec::new();
    File::open(path).and_then(|mut f| f.read_to_end(&mut bytes)).map_err(|e| file_err(path, e))?;
    let mut blocks: Vec<Ix> = Vec::new();
    let mut at = 0usize;
    let mut prev_last: Option<u64> = None;
    // Where the append being read started, and the blocks before it.
    let mut append_at = 0usize;
    let mut append_blocks = 0usize;
    let mut append_prev_last: Option<u64> = None;
    while at < bytes.len() {
        // The first sequence of the frame being read, once its header is read.
        let mut header_first: Option<u64> = None;
        let why = match bytes.get(at..at + HEADER) {
            None => Some("an incomplete frame header".to_string()),
            Some(h) => match <&[u8; HEADER]>::try_from(h).ok().and_then(parse_header) {
                None => Some("a frame header that fails its checksum".to_string()),
                Some((len, first, more)) => {
                    header_first = Some(first);
                    let body = at + HEADER;
                    match bytes.get(body..body + len as usize) {
                        None => Some("an incomplete frame".to_string()),
                        Some(value) => match log::block_meta(first, value) {
                            Err(e) => Some(e.to_string()),
                            Ok(_) if prev_last.is_some_and(|p| p >= first) => {
                                Some(format!("block {first} does not follow the previous block"))
                            }
                            Ok(BlockMeta { count, last }) => {
                                let offset = u32::try_from(body).map_err(|_| bad_frame(first, "segment over 4 GiB"))?;
                                blocks.push(Ix { first, offset, len, count });
                                prev_last = Some(last);
                                at = body + len as usize;
                                if !more {
                                    append_at = at;
                                    append_blocks = blocks.len();
                                    append_prev_last = prev_last;
                                }
                                None
                            }
                        },
                    }
                }
            },
        };
        if let Some(why) = why {
            // A torn write is the file's last append: nothing valid follows it. A valid frame after the damage
            // means an acknowledged block itself is damaged.
            // Pages of an unsynced write may reach the disk out of order: valid frames after the damage are still
            // a torn write when they are the rest of one append ending the file.
            let (why, torn) = match valid_frame_after(&bytes, at + 1) {
                Some(later) if !ends_one_append(&bytes, later) => {
                    (format!("{why}, followed by a valid frame at byte {later} (not a torn write)"), false)
                }
                _ => (format!("{why} {TORN}"), true),
            };
            let cut_first = blocks.get(append_blocks).map(|b| b.first).or(header_first);
            blocks.truncate(append_blocks);
            let damage = Damage { why, torn, cut_first, kept_last: append_prev_last };
            return Ok((blocks, append_at as u64, Some(damage)));
        }
    }
    if append_at < at {
        let cut_first = blocks.get(append_blocks).map(|b| b.first);
        blocks.truncate(append_blocks);
        let why = format!("an append whose last frame is missing {TORN}");
        return Ok((
            blocks,
            append_at as u64,
            Some(Damage { why, torn: true, cut_first, kept_last: append_prev_last }),
        ));
    }
    Ok((blocks, at as u64, None))
}

/// Marks a damage [`scan`] found to be a torn tail.
const TORN: &str = "(nothing valid after it)";

/// Whether the frames from `at` on are all valid and the end of one append: each but the last says more follow,
/// the last ends the file.
fn ends_one_append(bytes: &[u8], mut at: usize) -> bool {
    loop {
        let Some(h) = bytes.get(at..at + HEADER).and_then(|h| <&[u8; HEADER]>::try_from(h).ok()) else {
            return false;
        };
        let Some((len, first, more)) = parse_header(h) else { return false };
        let end = at + HEADER + len as usize;
        match bytes.get(at + HEADER..end) {
            Some(v) if log::block_meta(first, v).is_ok() => {}
            _ => return false,
        }
        if !more {
            return end == bytes.len();
        }
        at = end;
    }
}

/// The offset of the first valid frame at or after `from`, if any.
fn valid_frame_after(bytes: &[u8], from: usize) -> Option<usize> {
    (from..bytes.len().saturating_sub(HEADER)).find(|&at| {
        let Some(h) = bytes.get(at..at + HEADER).and_then(|h| <&[u8; HEADER]>::try_from(h).ok()) else {
            return false;
        };
        parse_header(h).is_some_and(|(len, first, _)| {
            bytes.get(at + HEADER..at + HEADER + len as usize).is_some_and(|v| log::block_meta(first, v).is_ok())
        })
    })
}

/// Index flag: the segment was compacted.
const COMPACTED: u8 = 1;

fn encode_index(blocks: &[Ix], seg_len: u64, flags: u8) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + 2 + 4 + blocks.len() * 20 + 12);
    v.extend_from_slice(INDEX_MAGIC);
    v.push(INDEX_VERSION);
    v.push(flags);
    v.extend_from_slice(&(blocks.len() as u32).to_le_bytes());
    for b in blocks {
        v.extend_from_slice(&b.first.to_le_bytes());
        v.extend_from_slice(&b.offset.to_le_bytes());
        v.extend_from_slice(&b.len.to_le_bytes());
        v.extend_from_slice(&b.count.to_le_bytes());
    }
    v.extend_from_slice(&seg_len.to_le_bytes());
    let crc = crc32fast::hash(&v);
    v.extend_from_slice(&crc.to_le_bytes());
    v
}

/// A segment's index and flags, if it is intact and made for a segment of `seg_len` bytes.
fn decode_index(v: &[u8], seg_len: u64) -> Option<(Vec<Ix>, u8)> {
    let (body, crc) = v.split_at_checked(v.len().checked_sub(4)?)?;
    if crc32fast::hash(body).to_le_bytes() != crc {
        return None;
    }
    let rest = body.strip_prefix(INDEX_MAGIC)?;
    let (&version, rest) = rest.split_first()?;
    if version != INDEX_VERSION {
        return None;
    }
    let (&flags, rest) = rest.split_first()?;
    let (n, rest) = rest.split_at_checked(4)?;
    let n = u32::from_le_bytes(n.try_into().ok()?) as usize;
    let (entries, len) = rest.split_at_checked(n.checked_mul(20)?)?;
    if u64::from_le_bytes(len.try_into().ok()?) != seg_len {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    for e in entries.chunks_exact(20) {
        let u32_at = |i: usize| u32::from_le_bytes([e[i], e[i + 1], e[i + 2], e[i + 3]]);
        let mut f = [0u8; 8];
        f.copy_from_slice(&e[..8]);
        out.push(Ix { first: u64::from_le_bytes(f), offset: u32_at(8), len: u32_at(12), count: u32_at(16) });
    }
    Some((out, flags))
}

/// Writes `bytes` to `path` through a temporary file, synced and renamed (the directory is synced by the caller).
fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    write_new(dir, path, bytes).map(drop)
}

/// [`write_atomically`], returning the new file opened for reading and writing. The rename is the commit point:
/// on `Ok` the new contents are at `path` (durable once the directory is synced).
fn write_new(dir: &Path, path: &Path, bytes: &[u8]) -> Result<File, StoreError> {
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<File> {
        let mut f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_data()?;
        std::fs::rename(&tmp, path)?;
        Ok(f)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        file_err(dir, e)
    })
}

impl LogFiles {
    /// Opens (creating) the segments under `dir`: reads each older segment's index (or scans it), scans the
    /// newest and cuts a torn tail from it, unless `acknowledged` shows that tail was acknowledged (then it is
    /// damage, refused, and nothing is cut).
    pub fn open(dir: &Path, segment_max: u64, acknowledged: Acknowledged) -> Result<(LogFiles, OpenStats), StoreError> {
        if !dir.is_dir() {
            super::create_private_dir(dir)?;
            if let Some(parent) = dir.parent() {
                sync_dir(parent)?;
            }
        }
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| file_err(dir, e))? {
            let entry = entry.map_err(|e| file_err(dir, e))?;
            let file_name = entry.file_name();
            let Some(file_name) = file_name.to_str() else { continue };
            if file_name.ends_with(".tmp") {
                // A rewrite or an index write cut short: never renamed, so never in use.
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            if let Some(n) = file_name.strip_suffix(".seg").and_then(|n| n.parse::<u64>().ok()) {
                names.push(n);
            }
        }
        names.sort_unstable();
        let mut stats = OpenStats { segments: names.len(), ..OpenStats::default() };
        let mut segs: Vec<Seg> = Vec::with_capacity(names.len());
        for (i, &name) in names.iter().enumerate() {
            let newest = i + 1 == names.len();
            let path = seg_path(dir, name);
            let file = OpenOptions::new().read(true).write(true).open(&path).map_err(|e| file_err(&path, e))?;
            let len = file.metadata().map_err(|e| file_err(&path, e))?.len();
            let indexed =
                if newest { None } else { std::fs::read(idx_path(dir, name)).ok().and_then(|v| decode_index(&v, len)) };
            let (blocks, end, compacted) = match indexed {
                Some((blocks, flags)) => (blocks, len, flags & COMPACTED != 0),
                None => {
                    stats.scanned += 1;
                    let (blocks, end, damage) = scan(&path)?;
                    if let Some(Damage { why, torn, cut_first, kept_last }) = damage {
                        let covered = newest
                            && torn
                            && acknowledged
                                .covers(cut_first, || kept_last.map_or_else(|| last_seq_of(dir, &segs), Ok))?;
                        if !newest || !torn || covered {
                            let reason = if covered {
                                format!(
                                    "{why}; but the store records sequence {} as acknowledged, past the last intact \
                                     one: that write was acknowledged, so this is damage, not a torn write",
                                    acknowledged.through
                                )
                            } else {
                                why
                            };
                            return Err(StoreError::Corrupt {
                                what: "log",
                                key: format!("segment {} at byte {end}", path.display()),
                                reason,
                            });
                        }
                        tracing::warn!(
                            segment = %path.display(),
                            at = end,
                            cut = len - end,
                            reason = %why,
                            "log: cutting an unacknowledged write from the newest segment"
                        );
                        stats.torn_bytes = len - end;
                        file.set_len(end).and_then(|()| file.sync_all()).map_err(|e| file_err(&path, e))?;
                    } else if !newest {
                        write_atomically(dir, &idx_path(dir, name), &encode_index(&blocks, end, 0))?;
                    }
                    (blocks, end, false)
                }
            };
            if blocks.is_empty() && newest {
                // Created by a roll whose first append never completed: nothing in it was acknowledged.
                drop(file);
                std::fs::remove_file(&path).map_err(|e| file_err(&path, e))?;
                let _ = std::fs::remove_file(idx_path(dir, name));
                sync_dir(dir)?;
                continue;
            }
            if let (Some(prev), Some(head)) = (segs.last().and_then(|s| s.blocks.last()), blocks.first()) {
                if prev.first >= head.first {
                    return Err(bad_frame(head.first, format!("segment {name} overlaps the one before it")));
                }
            }
            stats.blocks += blocks.len();
            segs.push(Seg { name, compacted, file: Arc::new(file), blocks, end });
        }
        let files = LogFiles {
            dir: dir.to_path_buf(),
            segment_max,
            state: RwLock::new(State { segs, last: 0 }),
            writer: Mutex::default(),
        };
        files.reset_last()?;
        Ok((files, stats))
    }

    fn state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn state_mut(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last sequence in the log (0 if empty).
    pub fn last_seq(&self) -> u64 {
        self.state().last
    }

    /// Appends sealed blocks `(first seq, value)` (ascending, above every stored block) and syncs: on `Ok` they
    /// survive a crash of the process and of the machine. On an error nothing of them is counted on (a partial
    /// write is cut off, now or at the next open) and every later append fails until the next open.
    pub fn append(&self, blocks: &[(u64, Vec<u8>)]) -> Result<(), StoreError> {
        if blocks.is_empty() {
            return Ok(());
        }
        let mut w = self.writer();
        if w.broken {
            return Err(StoreError::Closed);
        }
        let result = self.append_locked(blocks);
        if result.is_err() {
            w.broken = true;
        }
        result
    }

    fn append_locked(&self, blocks: &[(u64, Vec<u8>)]) -> Result<(), StoreError> {
        let first = blocks[0].0;
        let (file, base, roll) = {
            let s = self.state();
            if let Some(prev) = s.segs.last().and_then(|g| g.blocks.last()) {
                if prev.first >= first || s.last >= first {
                    return Err(bad_frame(first, format!("appended after block {} (last seq {})", prev.first, s.last)));
                }
            }
            match s.segs.last() {
                Some(g) if g.end < self.segment_max || g.blocks.is_empty() => (Some(g.file.clone()), g.end, false),
                Some(_) => (None, 0, true),
                None => (None, 0, false),
            }
        };
        let (file, base, new_seg) = match file {
            Some(f) => (f, base, None),
            None => {
                if roll {
                    self.seal_newest()?;
                }
                let path = seg_path(&self.dir, first);
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(&path)
                    .map_err(|e| file_err(&path, e))?;
                sync_dir(&self.dir)?;
                let f = Arc::new(f);
                (f.clone(), 0, Some(Seg { name: first, compacted: false, file: f, blocks: Vec::new(), end: 0 }))
            }
        };
        let mut buf = Vec::with_capacity(blocks.iter().map(|(_, v)| v.len() + HEADER).sum());
        let ixs = frames(blocks, base, &mut buf)?;
        let last = match blocks.last() {
            Some((f, v)) => log::block_meta(*f, v)?.last,
            None => 0,
        };
        let written = file.write_all_at(&buf, base).and_then(|()| file.sync_data());
        if let Err(e) = written {
            // Cut what may have reached the file; if even that fails the next open cuts it (it is the tail).
            let _ = file.set_len(base).and_then(|()| file.sync_data());
            return Err(file_err(&seg_path(&self.dir, new_seg.as_ref().map_or(0, |s| s.name)), e));
        }
        let mut s = self.state_mut();
        if let Some(seg) = new_seg {
            s.segs.push(seg);
        }
        if let Some(seg) = s.segs.last_mut() {
            seg.blocks.extend(ixs);
            seg.end = base + buf.len() as u64;
        }
        s.last = last;
        Ok(())
    }

    /// Writes the newest segment's index (it takes no more appends).
    fn seal_newest(&self) -> Result<(), StoreError> {
        let (name, index) = {
            let s = self.state();
            let Some(g) = s.segs.last() else { return Ok(()) };
            (g.name, encode_index(&g.blocks, g.end, 0))
        };
        write_atomically(&self.dir, &idx_path(&self.dir, name), &index)
    }

    /// The block holding `seq` (or, if `seq` is in no block, the block before it), with its frame's place.
    fn find(&self, seq: u64) -> Option<(Arc<File>, Ix)> {
        let s = self.state();
        let i = s.segs.partition_point(|g| g.name <= seq).checked_sub(1)?;
        // The segment named at or below `seq` may hold no block at or below it (its first blocks were removed):
        // then the block before is the previous segment's last.
        for g in s.segs[..=i].iter().rev() {
            let j = g.blocks.partition_point(|b| b.first <= seq);
            if let Some(j) = j.checked_sub(1) {
                return Some((g.file.clone(), g.blocks[j]));
            }
        }
        None
    }

    /// The first block starting after `first`.
    fn after(&self, first: u64) -> Option<(Arc<File>, Ix)> {
        let s = self.state();
        let i = s.segs.partition_point(|g| g.name <= first).saturating_sub(1);
        for g in &s.segs[i..] {
            let j = g.blocks.partition_point(|b| b.first <= first);
            if let Some(b) = g.blocks.get(j) {
                return Some((g.file.clone(), *b));
            }
        }
        None
    }

    fn read(&self, file: &File, ix: Ix) -> Result<Vec<u8>, StoreError> {
        let mut v = vec![0u8; ix.len as usize];
        file.read_exact_at(&mut v, u64::from(ix.offset)).map_err(|e| file_err(&self.dir, e))?;
        Ok(v)
    }

    fn decode(&self, file: &File, ix: Ix) -> Result<Block, StoreError> {
        log::decode_block(ix.first, &self.read(file, ix)?)
    }

    /// The block holding `seq`, if any (it may not hold `seq` itself).
    pub fn block_at(&self, seq: u64) -> Result<Option<Block>, StoreError> {
        match self.find(seq) {
            Some((f, ix)) => self.decode(&f, ix).map(Some),
            None => Ok(None),
        }
    }

    /// Sets the last sequence from the newest block.
    fn reset_last(&self) -> Result<(), StoreError> {
        let last = self.last_block()?.map_or(0, |b| b.last());
        self.state_mut().last = last;
        Ok(())
    }

    /// The newest block.
    fn last_block(&self) -> Result<Option<Block>, StoreError> {
        let found = {
            let s = self.state();
            s.segs.iter().rev().find_map(|g| g.blocks.last().map(|b| (g.file.clone(), *b)))
        };
        match found {
            Some((f, ix)) => self.decode(&f, ix).map(Some),
            None => Ok(None),
        }
    }

    /// The block holding `from` (or the first after it), then each next one in order.
    pub fn blocks_from(&self, from: u64) -> BlockIter<'_> {
        BlockIter { files: self, through: from.saturating_sub(1), prev: None }
    }

    /// The event count of every block, by first sequence (for checking dead records at open).
    pub fn counts(&self) -> BTreeMap<u64, u32> {
        let s = self.state();
        s.segs.iter().flat_map(|g| g.blocks.iter().map(|b| (b.first, b.count))).collect()
    }

    /// Blocks and bytes in all.
    pub fn totals(&self) -> (u64, u64) {
        let s = self.state();
        (s.segs.iter().map(|g| g.blocks.len() as u64).sum(), s.segs.iter().map(|g| g.end).sum())
    }

    /// Every segment other than the newest, by name.
    pub fn sealed(&self) -> Vec<u64> {
        let s = self.state();
        let n = s.segs.len().saturating_sub(1);
        s.segs[..n].iter().map(|g| g.name).collect()
    }

    /// The segments other than the newest holding blocks `touched`, by name.
    pub fn segments_of(&self, touched: &[u64]) -> Vec<u64> {
        let s = self.state();
        let newest = s.segs.last().map(|g| g.name);
        let mut names: Vec<u64> = touched
            .iter()
            .filter_map(|&first| {
                let i = s.segs.partition_point(|g| g.name <= first).checked_sub(1)?;
                Some(s.segs[i].name).filter(|n| Some(*n) != newest)
            })
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Deletes segment `name` (not the newest) if every event in it is dead by `dead` (a block's dead record:
    /// its event count and dead sequences; a record whose count is not the block's is ignored), or rewrites it
    /// with only its live events if at least half are dead. Returns, once that is durable, the first sequences
    /// of the blocks that no longer exist as they were (their dead records are to go) and whether the segment
    /// was deleted; `None` when it stays as it is. A failure after the segment was replaced (syncing the
    /// directory) refuses appends until the next open: the dead records must stay until it is known
    /// which file a crash would keep.
    pub fn collect_segment(
        &self,
        name: u64,
        dead: &dyn Fn(u64) -> Option<(u32, Vec<u64>)>,
    ) -> Result<Option<(Vec<u64>, bool)>, StoreError> {
        let mut w = self.writer();
        let (file, blocks, total, compacted) = {
            let s = self.state();
            let newest = s.segs.last().map(|g| g.name);
            let Ok(i) = s.segs.binary_search_by_key(&name, |g| g.name) else { return Ok(None) };
            if Some(name) == newest {
                return Ok(None);
            }
            let g = &s.segs[i];
            (g.file.clone(), g.blocks.clone(), g.events(), g.compacted)
        };
        let records: Vec<Option<Vec<u64>>> =
            blocks.iter().map(|b| dead(b.first).filter(|(c, _)| *c == b.count).map(|(_, d)| d)).collect();
        let dead_n: u64 = records.iter().flatten().map(|d| d.len() as u64).sum();
        if dead_n * 2 < total {
            return Ok(None);
        }
        let path = seg_path(&self.dir, name);
        let deleted = dead_n >= total;
        let gone: Vec<u64> = if deleted {
            std::fs::remove_file(idx_path(&self.dir, name))
                .or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) })
                .map_err(|e| file_err(&path, e))?;
            std::fs::remove_file(&path).map_err(|e| file_err(&path, e))?;
            self.state_mut().segs.retain(|g| g.name != name);
            blocks.iter().map(|b| b.first).collect()
        } else {
            // Blocks without dead events are copied as they are.
            let mut out = Vec::new();
            let mut new_blocks = Vec::with_capacity(blocks.len());
            let mut replaced = Vec::new();
            for (b, d) in blocks.iter().zip(&records) {
                let value = self.read(&file, *b)?;
                match d {
                    None => new_blocks.extend(frames(&[(b.first, value)], 0, &mut out)?),
                    Some(d) => {
                        replaced.push(b.first);
                        let block = log::decode_block(b.first, &value)?;
                        let live: Vec<(u64, &[u8])> =
                            block.iter().filter(|(s, _)| d.binary_search(s).is_err()).collect();
                        if let Some((first, _)) = live.first() {
                            let v = log::encode_block(*first, &live)?;
                            new_blocks.extend(frames(&[(*first, v)], 0, &mut out)?);
                        }
                    }
                }
            }
            let _ = std::fs::remove_file(idx_path(&self.dir, name));
            let f = write_new(&self.dir, &path, &out)?;
            self.replace(name, Seg { name, compacted, file: Arc::new(f), blocks: new_blocks, end: out.len() as u64 });
            replaced
        };
        if let Err(e) = sync_dir(&self.dir) {
            w.broken = true;
            return Err(e);
        }
        if !deleted {
            self.write_index(name);
        }
        Ok(Some((gone, deleted)))
    }

    /// Puts `seg` in the place of segment `name`.
    fn replace(&self, name: u64, seg: Seg) {
        let mut s = self.state_mut();
        if let Ok(i) = s.segs.binary_search_by_key(&name, |g| g.name) {
            s.segs[i] = seg;
        }
    }

    /// Writes segment `name`'s index; a failure only costs a scan of the segment at the next open.
    fn write_index(&self, name: u64) {
        let index = {
            let s = self.state();
            let Ok(i) = s.segs.binary_search_by_key(&name, |g| g.name) else { return };
            let g = &s.segs[i];
            encode_index(&g.blocks, g.end, if g.compacted { COMPACTED } else { 0 })
        };
        if let Err(e) = write_atomically(&self.dir, &idx_path(&self.dir, name), &index) {
            tracing::warn!(error = %e, segment = name, "log: cannot write a segment's index (it is scanned at open)");
        }
    }
}

impl LogFiles {
    /// The oldest segment that takes no more appends and was not compacted yet.
    pub fn next_to_compact(&self) -> Option<u64> {
        let s = self.state();
        let sealed = s.segs.len().checked_sub(1)?;
        s.segs[..sealed].iter().find(|g| !g.compacted).map(|g| g.name)
    }

    /// Rewrites segment `name` (not the newest) with its events in large blocks ([`COMPACT_RAW`] bytes before
    /// compression, zstd level [`COMPACT_LEVEL`]): a quiet collector commits a few events at a time, and small
    /// blocks cost their framing and compress poorly. Blocks with dead events (`has_dead`) are copied as they
    /// are, so no dead record ever names a block compaction made. Returns the first sequences of the blocks
    /// replaced (their cached sequences are stale) and the segment's bytes before and after.
    pub fn compact(
        &self,
        name: u64,
        has_dead: &dyn Fn(u64) -> bool,
    ) -> Result<Option<(Vec<u64>, u64, u64)>, StoreError> {
        let _w = self.writer();
        let (file, blocks, before) = {
            let s = self.state();
            let newest = s.segs.last().map(|g| g.name);
            let Ok(i) = s.segs.binary_search_by_key(&name, |g| g.name) else { return Ok(None) };
            let g = &s.segs[i];
            if Some(name) == newest || g.compacted {
                return Ok(None);
            }
            (g.file.clone(), g.blocks.clone(), g.end)
        };
        let mut out = Vec::new();
        let mut new_blocks = Vec::with_capacity(blocks.len() / 8 + 1);
        let mut replaced = Vec::new();
        let mut run: Vec<(u64, Vec<u8>)> = Vec::new();
        let flush_run = |run: &mut Vec<(u64, Vec<u8>)>, out: &mut Vec<u8>, new_blocks: &mut Vec<Ix>| {
            let refs: Vec<(u64, &[u8])> = run.iter().map(|(s, b)| (*s, b.as_slice())).collect();
            for block in log::encode_blocks_at(log::LOG, &refs, COMPACT_EVENTS, COMPACT_RAW, COMPACT_LEVEL)? {
                new_blocks.extend(frames(&[block], 0, out)?);
            }
            run.clear();
            Ok::<(), StoreError>(())
        };
        for b in &blocks {
            let value = self.read(&file, *b)?;
            if has_dead(b.first) {
                flush_run(&mut run, &mut out, &mut new_blocks)?;
                new_blocks.extend(frames(&[(b.first, value)], 0, &mut out)?);
            } else {
                replaced.push(b.first);
                let block = log::decode_block(b.first, &value)?;
                run.extend(block.iter().map(|(s, v)| (s, v.to_vec())));
            }
        }
        flush_run(&mut run, &mut out, &mut new_blocks)?;
        let path = seg_path(&self.dir, name);
        let _ = std::fs::remove_file(idx_path(&self.dir, name));
        let f = write_new(&self.dir, &path, &out)?;
        let after = out.len() as u64;
        self.replace(name, Seg { name, compacted: true, file: Arc::new(f), blocks: new_blocks, end: after });
        // Either file holds the same events: a crash before the directory is synced costs nothing.
        sync_dir(&self.dir)?;
        self.write_index(name);
        Ok(Some((replaced, before, after)))
    }
}

/// Payload of a block written by compaction, bytes before compression.
const COMPACT_RAW: usize = 64 * 1024;
/// Most events in a block written by compaction.
const COMPACT_EVENTS: usize = 4096;
/// zstd level of compaction (blocks of group commits use level 1: they are on the ack's path).
const COMPACT_LEVEL: i32 = 3;

/// What [`LogFiles::collect_segment`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Collected {
    pub deleted: usize,
    pub rewritten: usize,
}

/// Blocks in sequence order (see [`LogFiles::blocks_from`]). Each step looks its block up again, so segments
/// deleted, rewritten or compacted between steps are never read from a stale place; a block may then come back
/// merged into a larger one, so each step also says through which sequence its events were already handed out.
pub(super) struct BlockIter<'a> {
    files: &'a LogFiles,
    /// Every sequence at or below it was covered by earlier steps.
    through: u64,
    /// The previous step's block (first sequence, event count), or `None` before the first step.
    prev: Option<(u64, u32)>,
}

impl BlockIter<'_> {
    /// The next block, and the sequence through which its events were covered by earlier blocks.
    pub fn next_block(&mut self) -> Result<Option<(Block, u64)>, StoreError> {
        let next = match self.files.find(self.through.saturating_add(1)) {
            // Every block starts above: the first one.
            None => self.files.first_block(),
            // The block just handed out, unchanged: the one after it.
            Some((_, ix)) if Some((ix.first, ix.count)) == self.prev => self.files.after(ix.first),
            Some((f, ix)) => {
                let block = self.files.decode(&f, ix)?;
                if block.last() > self.through {
                    return Ok(Some(self.step(block, ix)));
                }
                // An older block (the ones after it went): the next one starts above `through`.
                self.files.after(ix.first)
            }
        };
        match next {
            Some((f, ix)) => {
                let block = self.files.decode(&f, ix)?;
                Ok(Some(self.step(block, ix)))
            }
            None => Ok(None),
        }
    }

    fn step(&mut self, block: Block, ix: Ix) -> (Block, u64) {
        let covered = self.through;
        self.through = self.through.max(block.last());
        self.prev = Some((ix.first, ix.count));
        (block, covered)
    }
}

impl LogFiles {
    fn first_block(&self) -> Option<(Arc<File>, Ix)> {
        let s = self.state();
        s.segs.iter().find_map(|g| g.blocks.first().map(|b| (g.file.clone(), *b)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Blocks of `n` events from `first` on, every third sequence skipped (gaps are allowed), a few events per
    /// block.
    /// `(first seq, bytes)`: sealed blocks, or events.
    type Numbered = Vec<(u64, Vec<u8>)>;

    fn blocks(first: u64, n: u64) -> (Numbered, Numbered) {
        let events: Vec<(u64, Vec<u8>)> = (0..n)
            .map(|i| first + i + i / 2)
            .map(|s| (s, format!("event {s} ").repeat((s % 5 + 1) as usize).into_bytes()))
            .collect();
        let refs: Vec<(u64, &[u8])> = events.iter().map(|(s, b)| (*s, b.as_slice())).collect();
        let mut out = Vec::new();
        for chunk in refs.chunks(4) {
            out.push((chunk[0].0, log::encode_block(chunk[0].0, chunk).expect("encode")));
        }
        (out, events)
    }

    fn all(files: &LogFiles) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        let mut it = files.blocks_from(0);
        while let Some((b, covered)) = it.next_block().expect("read") {
            out.extend(b.iter().filter(|(s, _)| *s > covered).map(|(s, v)| (s, v.to_vec())));
        }
        out
    }

    /// Collects every segment holding blocks `touched`, as the store does: `(blocks gone, what was done)`.
    fn collect(
        files: &LogFiles,
        touched: &[u64],
        dead: &dyn Fn(u64) -> Option<(u32, Vec<u64>)>,
    ) -> (Vec<u64>, Collected) {
        let mut gone = Vec::new();
        let mut done = Collected::default();
        for name in files.segments_of(touched) {
            if let Some((g, deleted)) = files.collect_segment(name, dead).expect("collect") {
                gone.extend(g);
                if deleted {
                    done.deleted += 1;
                } else {
                    done.rewritten += 1;
                }
            }
        }
        (gone, done)
    }

    fn newest_seg(dir: &Path) -> PathBuf {
        let mut segs: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "seg"))
            .collect();
        segs.sort();
        segs.pop().expect("a segment")
    }

    #[test]
    fn blocks_round_trip_across_segments_indexes_and_reopens() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log");
        let mut model = Vec::new();
        let mut next = 1;
        {
            let (files, _) = LogFiles::open(&path, 700, Acknowledged::default()).expect("open");
            for _ in 0..12 {
                let (bs, evs) = blocks(next, 9);
                next = evs.last().expect("events").0 + 5;
                files.append(&bs).expect("append");
                model.extend(evs);
            }
            assert_eq!(all(&files), model);
            assert_eq!(files.last_seq(), model.last().expect("some").0);
        }
        let segments = std::fs::read_dir(&path).expect("dir").count();
        assert!(segments > 6, "small segments roll: {segments} files");
        let (files, stats) = LogFiles::open(&path, 700, Acknowledged::default()).expect("reopen");
        assert_eq!(stats.scanned, 1, "only the newest segment is scanned: {stats:?}");
        assert_eq!(all(&files), model);
        for (s, body) in &model {
            let b = files.block_at(*s).expect("read").expect("a block");
            assert_eq!(b.get(*s), Some(body.as_slice()), "seq {s}");
        }
        // A sequence in a gap lands on the block before it, which does not hold it.
        let gap = model[1].0 + 1;
        assert!(files.block_at(gap).expect("read").is_some_and(|b| b.get(gap).is_none()));
        assert!(files.block_at(0).expect("read").is_none());
        // A damaged index is ignored: the segment is scanned and the index written again.
        let idx = std::fs::read_dir(&path)
            .expect("dir")
            .map(|e| e.expect("entry").path())
            .find(|p| p.extension().is_some_and(|x| x == "idx"))
            .expect("an index");
        let mut v = std::fs::read(&idx).expect("read");
        v[10] ^= 0xFF;
        std::fs::write(&idx, v).expect("write");
        drop(files);
        let (files, stats) = LogFiles::open(&path, 700, Acknowledged::default()).expect("reopen");
        assert_eq!(stats.scanned, 2, "{stats:?}");
        assert_eq!(all(&files), model);
        drop(files);
        let (_, stats) = LogFiles::open(&path, 700, Acknowledged::default()).expect("reopen");
        assert_eq!(stats.scanned, 1, "the index was written again: {stats:?}");
    }

    #[test]
    fn a_torn_tail_is_cut_and_appends_go_on_after_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log");
        let (bs, mut model) = blocks(1, 20);
        {
            let (files, _) = LogFiles::open(&path, 1 << 20, Acknowledged::default()).expect("open");
            files.append(&bs).expect("append");
        }
        let full = std::fs::read(newest_seg(&path)).expect("read");
        // Every cut of a further append: a header cut short, a body cut short, zeros where the body should be.
        // A two-block append cut anywhere, even after its whole first frame, loses both: appends are all or none.
        let (two, _) = blocks(100, 8);
        assert_eq!(two.len(), 2);
        let mut frame = Vec::new();
        frames(&two, 0, &mut frame).expect("frames");
        let first_frame = HEADER + two[0].1.len();
        let (more, more_events) = blocks(100, 4);
        let mut one = Vec::new();
        frames(&more, 0, &mut one).expect("frames");
        let cuts = [1, HEADER - 1, HEADER, HEADER + 3, first_frame, first_frame + HEADER + 2, frame.len() - 1];
        for (frame, cut) in cuts.iter().map(|c| (&frame, *c)).chain([(&one, one.len() - 1), (&one, 3)]) {
            let mut torn = full.clone();
            torn.extend_from_slice(&frame[..cut]);
            std::fs::write(newest_seg(&path), &torn).expect("write");
            let (files, stats) = LogFiles::open(&path, 1 << 20, Acknowledged::default()).expect("reopen cuts the tail");
            assert_eq!(stats.torn_bytes, cut as u64);
            assert_eq!(all(&files), model, "cut at {cut}");
            assert_eq!(std::fs::metadata(newest_seg(&path)).expect("meta").len(), full.len() as u64);
        }
        let mut zeros = full.clone();
        zeros.extend(std::iter::repeat_n(0u8, 300));
        std::fs::write(newest_seg(&path), &zeros).expect("write");
        let (files, _) = LogFiles::open(&path, 1 << 20, Acknowledged::default()).expect("reopen");
        files.append(&more).expect("append after the cut");
        model.extend(more_events);
        assert_eq!(all(&files), model);
    }

    #[test]
    fn a_damaged_tail_the_store_knows_was_acknowledged_is_refused_not_cut() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log");
        let (bs, model) = blocks(1, 20);
        {
            let (files, _) = LogFiles::open(&path, 1 << 20, Acknowledged::default()).expect("open");
            files.append(&bs).expect("append");
        }
        let kept_last = model.last().expect("events").0;
        let full = std::fs::read(newest_seg(&path)).expect("read");
        let (two, _) = blocks(100, 8);
        let mut frame = Vec::new();
        frames(&two, 0, &mut frame).expect("frames");
        let flipped = |i: usize| {
            let mut f = frame.clone();
            f[i] ^= 0x10;
            f
        };
        // (a further append as it is on disk, whether its first header is readable)
        let cases = [
            (flipped(HEADER + 5), true),
            (frame[..frame.len() - 1].to_vec(), true),
            (frame[..HEADER - 1].to_vec(), false),
            (flipped(2), false),
        ];
        for (i, (tail, readable)) in cases.iter().enumerate() {
            let mut damaged = full.clone();
            damaged.extend_from_slice(tail);
            // The lowest acknowledged sequence that proves the append was acknowledged: with its header, its
            // first sequence (100); without, one past what is kept.
            let refused_from = if *readable { 100 } else { kept_last + 1 };
            for through in [0, refused_from - 1, refused_from, refused_from + 10] {
                std::fs::write(newest_seg(&path), &damaged).expect("write");
                let opened = LogFiles::open(&path, 1 << 20, Acknowledged { through });
                let len = std::fs::metadata(newest_seg(&path)).expect("meta").len();
                let what = format!("case {i}, acknowledged through {through}");
                if through >= refused_from {
                    let err = opened.err().unwrap_or_else(|| panic!("{what}: refused"));
                    assert!(err.is_damage() && err.to_string().contains("acknowledged"), "{what}: {err}");
                    assert_eq!(len, damaged.len() as u64, "{what}: a refused open cuts nothing");
                } else {
                    let (files, stats) = opened.unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(stats.torn_bytes, tail.len() as u64, "{what}");
                    assert_eq!(all(&files), model, "{what}");
                    assert_eq!(len, full.len() as u64, "{what}");
                }
            }
        }
        // A segment whose only append lost its header (a roll, then a crash): what is kept ends in the segment
        // before it.
        std::fs::write(newest_seg(&path), &full).expect("write");
        let rolled = seg_path(&path, 100);
        for through in [kept_last, kept_last + 1] {
            std::fs::write(&rolled, &frame[..HEADER - 1]).expect("write");
            let opened = LogFiles::open(&path, 1 << 20, Acknowledged { through });
            if through > kept_last {
                assert!(opened.is_err_and(|e| e.is_damage()), "refused at {through}");
                assert!(rolled.exists(), "a refused open removes nothing");
            } else {
                let (files, _) = opened.expect("a torn first append of a segment is cut");
                assert_eq!(all(&files), model);
                assert!(!rolled.exists(), "the empty segment goes");
            }
        }
    }

    #[test]
    fn damage_before_valid_frames_or_in_an_older_segment_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log");
        {
            let (files, _) = LogFiles::open(&path, 1 << 20, Acknowledged::default()).expect("open");
            files.append(&blocks(1, 20).0).expect("append");
            // A later append: the damage below is in an append that is not the newest.
            files.append(&blocks(100, 4).0).expect("append");
        }
        let seg = newest_seg(&path);
        let good = std::fs::read(&seg).expect("read");
        let mut bad = good.clone();
        bad[HEADER + 6] ^= 0x40;
        std::fs::write(&seg, &bad).expect("write");
        let err = LogFiles::open(&path, 1 << 20, Acknowledged::default()).err().expect("refused").to_string();
        assert!(err.contains("not a torn write"), "{err}");
        std::fs::write(&seg, &good).expect("write");
        // An older segment: any damage is refused, even at its end.
        {
            let (files, _) = LogFiles::open(&path, 1, Acknowledged::default()).expect("open");
            files.append(&blocks(200, 4).0).expect("append");
        }
        let mut cut = good.clone();
        cut.truncate(good.len() - 2);
        std::fs::write(&seg, &cut).expect("write");
        let _ = std::fs::remove_file(seg.with_extension("idx"));
        let err = LogFiles::open(&path, 1, Acknowledged::default()).err().expect("refused").to_string();
        assert!(err.contains("incomplete frame"), "{err}");
    }

    #[test]
    fn a_torn_append_with_a_hole_before_its_later_frames_is_cut_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log");
        let (bs, model) = blocks(1, 20);
        {
            let (files, _) = LogFiles::open(&path, 1 << 20, Acknowledged::default()).expect("open");
            files.append(&bs).expect("append");
        }
        let full = std::fs::read(newest_seg(&path)).expect("read");
        // An unsynced three-frame append whose first frame never reached the disk (zeros) while the later ones
        // did: pages of one write can land out of order.
        let (three, _) = blocks(100, 12);
        assert_eq!(three.len(), 3);
        let mut frame = Vec::new();
        frames(&three, 0, &mut frame).expect("frames");
        let hole = HEADER + three[0].1.len();
        frame[..hole].iter_mut().for_each(|b| *b = 0);
        let mut torn = full.clone();
        torn.extend_from_slice(&frame);
        std::fs::write(newest_seg(&path), &torn).expect("write");
        let (files, stats) = LogFiles::open(&path, 1 << 20, Acknowledged::default()).expect("a torn write, not damage");
        assert_eq!(stats.torn_bytes, frame.len() as u64);
        assert_eq!(all(&files), model);
        drop(files);
        // The same with a complete append after the hole is damage: that append was acknowledged.
        let mut next = Vec::new();
        frames(&blocks(500, 4).0, 0, &mut next).expect("frames");
        let mut damaged = full.clone();
        damaged.extend_from_slice(&frame);
        damaged.extend_from_slice(&next);
        std::fs::write(newest_seg(&path), &damaged).expect("write");
        assert!(LogFiles::open(&path, 1 << 20, Acknowledged::default()).is_err());
    }

    #[test]
    fn an_empty_newest_segment_left_by_a_failed_roll_is_removed_at_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log");
        let (bs, mut model) = blocks(1, 8);
        {
            let (files, _) = LogFiles::open(&path, 1, Acknowledged::default()).expect("open");
            files.append(&bs[..1]).expect("append");
            files.append(&bs[1..]).expect("append");
        }
        // A roll created the next segment, then its first append failed and was cut to nothing.
        let empty = seg_path(&path, 1_000);
        std::fs::write(&empty, b"").expect("create");
        let (files, _) = LogFiles::open(&path, 1, Acknowledged::default()).expect("reopen");
        assert!(!empty.exists(), "the empty segment is removed");
        assert_eq!(all(&files), model);
        // Sequences of failed groups may be handed out again after a restart: below the removed segment's name.
        let (more, more_events) = blocks(50, 4);
        files.append(&more).expect("append");
        model.extend(more_events);
        assert_eq!(all(&files), model);
        for (s, body) in &model {
            assert_eq!(files.block_at(*s).expect("read").expect("block").get(*s), Some(body.as_slice()));
        }
    }

    #[test]
    fn collection_deletes_dead_segments_rewrites_mostly_dead_ones_and_keeps_the_newest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log");
        let (files, _) = LogFiles::open(&path, 1, Acknowledged::default()).expect("open");
        let (bs, events) = blocks(1, 60);
        for b in bs.chunks(2) {
            files.append(b).expect("append");
        }
        let counts = files.counts();
        let firsts: Vec<u64> = counts.keys().copied().collect();
        // One segment per append of two blocks. Dead: all of the first segment's events, three of four of each
        // block of the next two, one of four of the rest.
        let mut dead: BTreeMap<u64, (u32, Vec<u64>)> = BTreeMap::new();
        for (i, (&first, &count)) in counts.iter().enumerate() {
            let block = files.block_at(first).expect("read").expect("block");
            let seqs: Vec<u64> = block.iter().map(|(s, _)| s).collect();
            let n = match i {
                0 | 1 => seqs.len(),
                2..=5 => 3,
                _ => 1,
            };
            dead.insert(first, (count, seqs[..n].to_vec()));
        }
        let is_dead = |s: u64| dead.iter().any(|(_, (_, d))| d.contains(&s));
        let live: Vec<(u64, Vec<u8>)> = events.iter().filter(|(s, _)| !is_dead(*s)).cloned().collect();
        let (gone, done) = collect(&files, &firsts, &|f| dead.get(&f).cloned());
        assert!(done.deleted >= 1 && done.rewritten >= 1, "{done:?}");
        // Every block of a deleted or rewritten segment with dead events went; blocks of kept segments stayed.
        let after = files.counts();
        for f in &gone {
            assert!(after.get(f).is_none_or(|c| *c < counts[f]), "block {f}");
        }
        // What remains: the live events of collected segments, everything of the others (dead records still
        // apply to those).
        let stored: Vec<(u64, Vec<u8>)> = all(&files);
        let kept_dead: Vec<u64> =
            dead.iter().filter(|(f, _)| !gone.contains(f)).flat_map(|(_, (_, d))| d.clone()).collect();
        let visible: Vec<(u64, Vec<u8>)> = stored.iter().filter(|(s, _)| !kept_dead.contains(s)).cloned().collect();
        assert_eq!(visible, live);
        drop(files);
        let (files, stats) = LogFiles::open(&path, 1, Acknowledged::default()).expect("reopen");
        assert_eq!(stats.scanned, 1, "rewritten segments have their index: {stats:?}");
        assert_eq!(all(&files), stored);
        // The newest segment is never collected, even all dead.
        let newest = *files.counts().keys().last().expect("a block");
        let before = all(&files);
        let all_dead: BTreeMap<u64, (u32, Vec<u64>)> = files
            .counts()
            .into_iter()
            .filter(|(f, _)| *f == newest)
            .map(|(f, c)| {
                let b = files.block_at(f).expect("read").expect("block");
                (f, (c, b.iter().map(|(s, _)| s).collect()))
            })
            .collect();
        let (gone, _) = collect(&files, &[newest], &|f| all_dead.get(&f).cloned());
        assert!(gone.is_empty());
        assert_eq!(all(&files), before);
    }

    #[test]
    fn compaction_merges_small_blocks_keeps_marked_ones_and_reads_the_same() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log");
        let (files, _) = LogFiles::open(&path, 600, Acknowledged::default()).expect("open");
        // Many small appends, as a quiet collector makes them.
        let mut model = Vec::new();
        let mut next = 1;
        for _ in 0..80 {
            let (bs, evs) = blocks(next, 2);
            next = evs.last().expect("events").0 + 3;
            files.append(&bs).expect("append");
            model.extend(evs);
        }
        let before = files.totals();
        let counts = files.counts();
        // A reader part-way through the log while compaction merges the blocks it has read with the next ones:
        // it neither skips nor repeats an event.
        let mut reader = files.blocks_from(0);
        let mut read = Vec::new();
        for _ in 0..5 {
            let (b, covered) = reader.next_block().expect("read").expect("a block");
            read.extend(b.iter().filter(|(s, _)| *s > covered).map(|(s, v)| (s, v.to_vec())));
        }
        // One block is marked (a dead record names it): it stays as it is.
        let marked = *counts.keys().nth(3).expect("a block");
        let mut compacted = 0;
        while let Some(name) = files.next_to_compact() {
            let (replaced, b, a) = files.compact(name, &|f| f == marked).expect("compact").expect("done");
            assert!(a < b, "smaller: {a} < {b}");
            assert!(!replaced.contains(&marked));
            compacted += 1;
        }
        assert!(compacted > 3, "{compacted}");
        while let Some((b, covered)) = reader.next_block().expect("read") {
            read.extend(b.iter().filter(|(s, _)| *s > covered).map(|(s, v)| (s, v.to_vec())));
        }
        assert_eq!(read, model, "a reader across compaction");
        let after = files.totals();
        assert!(after.0 < before.0 / 4 && after.1 < before.1, "blocks and bytes shrink: {before:?} -> {after:?}");
        assert_eq!(files.counts().get(&marked), counts.get(&marked), "the marked block is kept as it was");
        assert_eq!(all(&files), model);
        for (s, body) in &model {
            assert_eq!(files.block_at(*s).expect("read").expect("block").get(*s), Some(body.as_slice()));
        }
        drop(files);
        let (files, stats) = LogFiles::open(&path, 600, Acknowledged::default()).expect("reopen");
        assert_eq!(stats.scanned, 1, "{stats:?}");
        assert_eq!(files.next_to_compact(), None, "compaction is remembered in the index");
        assert_eq!(all(&files), model);
    }
}
