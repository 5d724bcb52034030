//! The durable store, on sled. Owns the key layout, the value codecs (each value versioned and checksummed)
//! and restore.
//!
//! Its code by concern: this module holds the errors, the key layout, the value codecs, open, the log's append
//! and reads, and the store's upkeep; [`restore`] what an open gives back; [`checkpoints`] snapshot increments,
//! bases and the shutdown image (format in [`snaps`] and [`image`]); [`folds`] the summaries of folded jobs
//! (packed by [`packs`]); [`retention`] deletions; [`stream_tree`] the stream's records; [`side`] the dictionary,
//! alert records and node health; [`log`] and [`files`] the log's blocks and segment files; [`history`] the
//! Parquet day files; [`backup`] online backups.
//!
//! # Key layout
//! - tree `alerts`: alert key -> sealed JSON alert record (firing since, resolved at).
//! - tree `node_health`: `node ++ [0u8] ++ at_ms` (i64 big-endian) -> sealed `postcard(Reading)`: GPU health
//!   readings of node agents (see `index::nodes`), kept for 30 days.
//! - directory `log/` beside sled's files: the log, every accepted event in commit order, as compressed blocks
//!   of consecutive sequences, one or more per group commit (block format and dead events: see [`log`]),
//!   appended to segment files (framing, torn tails, deletes and rewrites: see [`files`]). An event is
//!   acknowledged only after its block's append is synced (and sled flushed). Outside sled, so the log costs
//!   its compressed bytes on disk and nothing more (sled keeps superseded pages until a segment of its file is
//!   mostly garbage).
//! - tree `log_blocks`: the dead records of the log's blocks (see [`log`]).
//! - directory `history/` beside sled's files: ended jobs as Parquet, one file per UTC day of their end (derived
//!   from the jobs; see [`history`]).
//! - directory `snaps/` beside sled's files: the hot jobs' snapshots, as *parts* (format and names: see
//!   [`snaps`]): one or more zstd files per checkpoint, each holding the compact events of many jobs. A checkpoint
//!   writes an *increment*: each dirty job's events past what the store holds of it (the committer keeps that mark
//!   per hot job, learnt after the checkpoint's flush; sequences are handed out in arrival order, late events
//!   included, so "past" is "above the highest sequence written"). Once the increments hold more bytes than the
//!   last *base* (and more than a floor), a checkpoint writes a new base, every hot job's events, and one sled batch
//!   points restore at it (`[0u8] ++ "snap_base"` -> sealed u64) and sets the increments' *floor* (`[0u8] ++
//!   "snap_floor"` -> sealed u64: increments numbered below it are superseded); the increments' and older bases'
//!   files are removed after it (a crash between leaves them for the next base; restore ignores them). Each event
//!   is so written about twice, compressed, in a few large files, and a restart decodes the hot jobs from a few
//!   dozen files without reading the log. Outside sled, the parts take their bytes on disk and nothing more (sled
//!   keeps a superseded value's space until its segment is mostly garbage), and sled holds only small values.
//!   Parts are never edited: a fold leaves a folded job's events in them (restore tells by its summary, which
//!   lists every one of them), and retention writes a *tombstone* for each job it deletes (tree `jobs`), so that
//!   restore skips the job's events in parts written before (the next base removes it). Stores written by
//!   Startline 0.1.0 keep parts as values of tree `jobs` (`tests/fixtures/store-0.1.0` holds one): they are
//!   read, and the next base removes them.
//! - tree `jobs`, key `[0u8] ++ "checkpoint_seq"` -> sealed u64 big-endian: the marker.
//! - tree `jobs`, key `[0u8] ++ "snapshot_seq"` -> sealed u64 big-endian: the highest sequence a snapshot part
//!   may hold, written before the parts that hold it (parts may run past the marker). With the marker and
//!   `max_seq` it tells an open which log sequences were acknowledged: damage at the log's end that holds one
//!   is refused, never cut as a torn write (see [`files`]). The stream's `log_through` (below) proves the same.
//! - tree `jobs`, key `[0u8] ++ "deleted_through"` -> sealed i64 big-endian: the latest end time (Unix ms) of
//!   the jobs retention deleted for `store.folded_budget_mib`, written with their deletion.
//! - tree `jobs`, key `[0u8] ++ "max_seq"` -> sealed u64 big-endian: the highest sequence in use when a fold
//!   last ran (sequence numbers never go back, even when retention deletes the newest log entries).
//! - tree `summaries`: the summaries of folded jobs (ended jobs whose history left memory), packed many to a
//!   value: `[0xFE] ++ first summary number` (u64 big-endian) -> a pack of the summaries of one fold chunk with
//!   consecutive numbers (format, rewrites and damage: see [`packs`]). A summary is `varint(n) ++ n varint
//!   sequence deltas ++ body`: the log sequences of every event of the job (which stay in the log) and the
//!   summary body, whose format belongs to the index (the store seals and checks it, and never looks inside).
//!   Summary numbers are handed out in fold order, so folds append packs to the tree's end and a restart reads a
//!   few thousand compressed values per 100k folded jobs front to back. A job has at most one summary: a fold
//!   that replaces an older summary (of a job folded again after a late event) removes it in the same batch (its
//!   pack is rewritten without it); if a failed write left two anyway, restore keeps the highest number.
//!   Numbers start at 1 ([`NO_SUMMARY`], 0, names none).
//! - tree `dictionary`: `u32` big-endian -> sealed entry: the job attribute sets summaries refer to by number
//!   (the index's format). Written in the same batch as the summaries that first use them (before them);
//!   numbers are never reused (`[0xFF] ++ "next"` -> sealed u32: the next number, written before each fold's
//!   batch, so that a restore never hands out a number a summary may still name); an entry no folded job names any more is deleted after the deletions that freed
//!   it are durable (`delete_dictionary`), and one a crash kept is freed at the next restore. A summary naming a
//!   deleted entry is a hot job's stale one: restore refuses it and rebuilds the job from its events.
//!
//! - tree `stream`: `[1u8] ++ first cursor` (u64 big-endian) -> sealed block of consecutive protobuf
//!   `StreamRecord`s (one block per write: a group commit's event records, its change records, ...; zstd over
//!   256 bytes): the stream out (see `stream`), kept for `[stream] retention` (the newest block always stays, so
//!   cursors never go back).
//!   Event records are written in the same flush as their log entries; change and alert records after it, and
//!   are made durable by the next flush before anyone is sent them. `[0u8] ++ "changes_through"` -> sealed u64:
//!   the cursor of the last event record whose change records were written (restore resyncs the jobs of later
//!   event records). `[0u8] ++ "log_through"` -> sealed u64: the last log sequence with an event record,
//!   written in the same batch as the event records (the log batch goes first; a crash between the two is
//!   repaired at start from the log).
//!
//! A *sealed* value is `[version u8] ++ crc32(body) as u32 little-endian ++ body` (version 2; some values have a
//! version of their own: the log's blocks and dead records 3, snapshot parts 7).
//!
//! # The checkpoint invariant
//! For every hot job, its snapshot (what the base and the increments hold of it) holds every event of the job
//! with `seq <= checkpoint_seq`. Snapshots may be
//! newer than the marker (a crash mid-checkpoint): restore skips log entries a snapshot already holds, by
//! sequence number. To keep the invariant:
//! - every job whose record holds events that its snapshot may not (jobs rebuilt from the log tail at restart,
//!   jobs changed since the last checkpoint) is *dirty*, and a checkpoint writes every dirty job's snapshot
//!   before it moves the marker; a checkpoint that fails hands its jobs back to the dirty set;
//! - the snapshots of a checkpoint are flushed before its marker is written, so a crash can never keep the
//!   marker and lose a snapshot it depends on, whatever order sled's recovery keeps unflushed writes in;
//! - the committer learns what the store holds of a job only after that flush (a part of a failed checkpoint
//!   is never counted on; restore takes the union anyway), and a job that leaves memory and comes back starts
//!   from nothing known, so its next part holds all its events;
//! - sequence numbers never go backwards, even when retention deletes the newest log entries: the next
//!   sequence is above both the last log entry and the marker.
//!
//! # Folded jobs
//! A fold writes an ended job's summary, which lists the log sequences of all its events (see
//! [`Store::fold_jobs`]); the events stay where they are, in the log's compressed blocks and in the snapshot
//! parts (a fold neither reads nor rewrites either). For every job, then, its snapshot **or the log entries its
//! summary lists** hold every event with `seq <= checkpoint_seq`. A job is *unfolded* when it is hot again (a late event) while its
//! summary remains: its events are the union of the events its summary lists, its snapshot and its later log
//! entries. Restore treats a job this way when its snapshot or the log's tail holds an event its summary does
//! not list (a late event); otherwise what they hold of it is the folded job's own and is dropped. A fold never
//! runs while a checkpoint is being written (they share one thread), so a part written after a fold holds every
//! event of the job, folded ones included.
//!
//! # Restore
//! Reads the base and the increments, then replays only the log entries after `checkpoint_seq`, then reads the
//! summaries (never a folded job's events, except for unfolded jobs): restart cost is bounded by the number of
//! jobs and of hot jobs' events plus the events since the last checkpoint. A part that fails its checksum or
//! cannot be decoded is reported with its key, and every job is then rebuilt from the whole log (which holds
//! every accepted event until retention deletes the job). A damaged log value cannot be
//! rebuilt from anything: restore refuses with an error naming its sequence number, rather than serve a timeline
//! silently missing an event. A summary pack that fails its checksum is reported, and the jobs it held (those
//! in the log with neither a snapshot nor a readable summary) are rebuilt from the whole log (see [`packs`]).
//!
//! # What a flush promises
//! `append_durable` returns after the log's append is synced (`fdatasync`): an acknowledged event survives a
//! crash of the process and of the machine, provided the disk honours fsync. sled is flushed (its `flush` writes
//! and `fsync`s sled's log) by whoever needs its own writes durable: checkpoints, folds, retention's log upkeep,
//! and the stream's flush thread; nothing sled holds refers to an event not yet durable in the log. sled checksums its own
//! log segments and recovers the longest intact prefix of them after a crash; values written but not yet
//! flushed may or may not survive (never acknowledged, so never counted on).
//!
//! sled calls block; callers run them on the applier thread or in `spawn_blocking`.

use crate::health::WriteHalt;
use crate::job::{CompactEvent, JobRecord};
use prost::Message;
use startline_proto::pb;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// One stored node health reading: `(node, body)`, or why it cannot be read.
pub type StoredReading = Result<(String, Vec<u8>), String>;

/// The current version of every sealed value.
const SEALED_VERSION: u8 = 2;
const CHECKPOINT_KEY: &[u8] = b"\0checkpoint_seq";
const MAX_SEQ_KEY: &[u8] = b"\0max_seq";
const SNAPSHOT_SEQ_KEY: &[u8] = b"\0snapshot_seq";
const IMAGE_KEY: &[u8] = b"\0shutdown_image";
/// Key (tree `dictionary`; 5 bytes, where entries' keys are 4) of the next number the dictionary hands out.
const DICTIONARY_NEXT_KEY: &[u8] = b"\xffnext";
/// Key (tree `jobs`) of the latest end time of jobs deleted for the memory budget.
const DELETED_THROUGH_KEY: &[u8] = b"\0deleted_through";
/// Tree `jobs`: the number of the base the snapshot parts build on (see [`snaps`]).
const BASE_KEY: &[u8] = b"\0snap_base";
/// Tree `jobs`: increments in files numbered below it are superseded by the base (written with the base pointer;
/// the files go after it, and a crash between leaves them for the next base to remove).
const SNAP_FLOOR_KEY: &[u8] = b"\0snap_floor";
/// The directory of the snapshot parts' files (see [`snaps::PartFiles`]), beside sled's files.
const SNAP_DIR: &str = "snaps";
/// Summary numbers start at 1: 0 names no summary.
pub const NO_SUMMARY: u64 = 0;

/// Failures of the store. Messages are for logs and operators; clients see only "storage unavailable".
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// sled reported an error (I/O, no space, corruption of its own files).
    #[error("sled: {0}")]
    Sled(sled::Error),
    /// A stored value could not be decoded or failed its checksum.
    #[error("corrupt {what} at key {key}: {reason}")]
    Corrupt {
        /// Which tree.
        what: &'static str,
        /// The key, printable.
        key: String,
        /// Why.
        reason: String,
    },
    /// A file of the store outside sled (the log's segments, snapshot parts) could not be read or written.
    #[error("store file {path}: {source}")]
    File {
        /// The file or directory.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The log's files refuse appends after one failed (the next open repairs them).
    #[error("log closed after a failed append")]
    Closed,
    /// Writes are halted after a write failed (see [`WriteHalt`]): nothing is written until a restart.
    #[error("store writes halted after a write failure ({0}); the collector restarts once the store is writable")]
    Halted(&'static str),
    /// The data directory could not be created or secured.
    #[error("data directory {path}: {source}")]
    Dir {
        /// The directory.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        StoreError::Sled(e)
    }
}

impl StoreError {
    /// Whether the data on disk is damaged (as opposed to unreadable for now: permissions, a lock, no space).
    pub fn is_damage(&self) -> bool {
        matches!(self, StoreError::Corrupt { .. } | StoreError::Sled(sled::Error::Corruption { .. }))
    }

    /// Whether this failure of a write halts every later one (see [`WriteHalt`]): any error of sled or of the
    /// file system (after one, sled may block for ever on the I/O that failed). Not damage found in a value, and
    /// not a write refused because writes were already halted.
    pub fn halts_writes(&self) -> bool {
        match self {
            StoreError::Sled(sled::Error::Corruption { .. }) | StoreError::Corrupt { .. } | StoreError::Halted(_) => {
                false
            }
            StoreError::Sled(_) | StoreError::File { .. } | StoreError::Dir { .. } | StoreError::Closed => true,
        }
    }

    /// A short cause for clients and health checks, without internal detail: "no space left on device",
    /// "I/O error", "corrupt store".
    pub fn cause(&self) -> &'static str {
        let io = match self {
            StoreError::Sled(sled::Error::Io(e)) => Some(e),
            StoreError::Dir { source, .. } | StoreError::File { source, .. } => Some(source),
            _ => None,
        };
        match (io, self) {
            (Some(e), _) => io_cause(e),
            (None, StoreError::Halted(cause)) => cause,
            (None, StoreError::Closed) => "log closed after an I/O error",
            (None, StoreError::Sled(sled::Error::Corruption { .. }) | StoreError::Corrupt { .. }) => "corrupt store",
            (None, _) => "storage error",
        }
    }
}

/// Names an I/O error's cause. sled sometimes wraps the OS error in an error of its own, so the kind, the OS code
/// and the wrapped error are all looked at.
fn io_cause(e: &std::io::Error) -> &'static str {
    const ENOSPC: i32 = 28;
    const EDQUOT: i32 = 122;
    const EMFILE: i32 = 24;
    const ENFILE: i32 = 23;
    let inner = e.get_ref().and_then(|i| i.downcast_ref::<std::io::Error>());
    let code = e.raw_os_error().or_else(|| inner.and_then(|i| i.raw_os_error()));
    let text = e.to_string();
    if code == Some(ENOSPC) || e.kind() == std::io::ErrorKind::StorageFull || text.contains("No space left") {
        "no space left on device"
    } else if code == Some(EDQUOT) || e.kind() == std::io::ErrorKind::QuotaExceeded || text.contains("quota") {
        "disk quota exceeded"
    } else if code == Some(EMFILE) || code == Some(ENFILE) || text.contains("Too many open files") {
        "too many open files"
    } else {
        "I/O error"
    }
}

/// What restoring the store produced.
#[derive(Debug, Default)]
pub struct Restored {
    /// Every job, with its timeline derived.
    pub jobs: BTreeMap<String, JobRecord>,
    /// The highest sequence ever used (0 if empty): new events are numbered above it.
    pub last_seq: u64,
    /// Jobs a snapshot part holds events of.
    pub snapshots: usize,
    /// Log entries replayed after the last checkpoint.
    pub replayed: usize,
    /// Jobs whose records hold events their snapshots may not: the next checkpoint must write them.
    pub dirty: HashSet<String>,
    /// The highest sequence the snapshot parts hold of each job they hold: a checkpoint writes the job's
    /// later events only (a hot job not listed: all of them).
    pub snapshot_through: HashMap<String, u64>,
    /// Why the snapshots were set aside and every job rebuilt from the log, if they were.
    pub rebuilt: Option<String>,
    /// Summaries of folded jobs, `(job_id, summary number, body)`, in the store's order, when restored with
    /// [`Store::restore`] (with [`Store::restore_with`] they go to the callback instead).
    pub summaries: Vec<(String, u64, Vec<u8>)>,
    /// The summaries of jobs restored hot (unfolded by a late event, or with a damaged summary), by job: the
    /// next fold of the job replaces them and retention deletes them.
    pub stale_summaries: HashMap<String, Vec<u64>>,
    /// Summaries read (folded jobs).
    pub folded: usize,
    /// Folded jobs found hot again (a summary plus later events), restored with the events their summary lists.
    pub unfolded: usize,
    /// Summary packs that could not be read (by first summary number): their jobs were rebuilt from the log.
    pub lost_packs: Vec<u64>,
    /// The folded jobs came from a shutdown image, not the summaries (see [`Store::restore_known`]).
    pub from_image: bool,
}

/// What a restore hands each summary to: `(job id, summary number, body)`; an `Err` sets the summary aside.
type OnSummary<'a> = dyn FnMut(&str, u64, &[u8]) -> Result<(), String> + 'a;

/// Where a restore learns the folded jobs from.
enum Summaries<'a> {
    /// Every summary in the store, each handed to the callback.
    Read(&'a mut OnSummary<'a>),
    /// A shutdown image: which jobs were folded, and the hot ones' stale summaries.
    Known { folded: &'a dyn Fn(&str) -> bool, stale: &'a HashMap<String, Vec<u64>> },
}

/// Options of the store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// sled's page cache, bytes.
    pub cache_bytes: u64,
    /// A log segment takes no more appends once it holds this many bytes (see [`files`]).
    pub segment_bytes: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions { cache_bytes: 64 << 20, segment_bytes: files::SEGMENT_MAX }
    }
}

/// One job to fold (see [`Store::fold_jobs`]).
#[derive(Debug, Default)]
pub struct FoldWrite {
    /// The job.
    pub job_id: String,
    /// The log sequences of every event of the job (they stay in the log; the summary lists them).
    pub log_seqs: Vec<u64>,
    /// The summary body (the index's format); the store seals it with the sequences.
    pub summary: Vec<u8>,
    /// The numbers of the job's older summaries, deleted in the same batch (a job folded again after a late
    /// event; numbers that are not stored are no error).
    pub replaces: Vec<u64>,
    /// The new summary's number, set by [`Store::fold_write`] (also when it fails: sled may have kept the write).
    pub number: u64,
}

/// A job retention deletes (see [`Store::delete_jobs`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredJob {
    /// The job.
    pub job_id: String,
    /// The log sequences of its events held in memory (a hot job's); a folded job's come from its summaries.
    pub seqs: Vec<u64>,
    /// The numbers of its summaries (a folded job's, or a hot job's stale ones).
    pub summaries: Vec<u64>,
}

/// A summary as stored in a pack: `varint(n) ++ n sequence deltas ++ body` (sequences sorted, duplicates
/// dropped).
fn summary_bytes(seqs: &[u64], body: &[u8]) -> Vec<u8> {
    let mut sorted = seqs.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut inner = Vec::with_capacity(body.len() + 2 * sorted.len() + 4);
    prost::encoding::encode_varint(sorted.len() as u64, &mut inner);
    let mut prev = 0u64;
    for s in sorted {
        prost::encoding::encode_varint(s - prev, &mut inner);
        prev = s;
    }
    inner.extend_from_slice(body);
    inner
}

/// A summary's log sequences and body (see [`summary_bytes`]).
fn parse_summary(mut rest: &[u8]) -> Result<(Vec<u64>, &[u8]), String> {
    let n = prost::encoding::decode_varint(&mut rest).map_err(|e| format!("sequence count: {e}"))?;
    // Each sequence takes at least one byte: a count beyond the bytes left is damage, not an allocation size.
    if n > rest.len() as u64 {
        return Err(format!("{n} sequences claimed in {} bytes", rest.len()));
    }
    let mut seqs = Vec::with_capacity(n as usize);
    let mut prev = 0u64;
    for i in 0..n {
        let d = prost::encoding::decode_varint(&mut rest).map_err(|e| format!("sequence {i}: {e}"))?;
        if i > 0 && d == 0 {
            return Err(format!("sequence {i} repeats the one before"));
        }
        prev = prev.checked_add(d).ok_or_else(|| format!("sequence {i} overflows"))?;
        seqs.push(prev);
    }
    Ok((seqs, rest))
}

/// Jobs a checkpoint copies per index read lock (and, for an increment, per hold of the applier's
/// `store_writes`): short holds beside the committer and retention.
pub const SNAPSHOT_CHUNK: usize = 64;

/// `[version] ++ crc32(body) LE ++ body`.
fn seal(body: &[u8]) -> Vec<u8> {
    seal_as(SEALED_VERSION, body)
}

fn seal_as(version: u8, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(5 + body.len());
    v.push(version);
    v.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    v.extend_from_slice(body);
    v
}

/// The body of a sealed value, checked.
fn unseal(v: &[u8]) -> Result<&[u8], String> {
    unseal_as(SEALED_VERSION, v)
}

fn unseal_as(version: u8, v: &[u8]) -> Result<&[u8], String> {
    match v.split_first() {
        Some((&got, rest)) if got == version && rest.len() >= 4 => {
            let (crc, body) = rest.split_at(4);
            let want = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
            let got = crc32fast::hash(body);
            if want == got {
                Ok(body)
            } else {
                Err(format!("checksum mismatch (stored {want:08x}, computed {got:08x})"))
            }
        }
        Some((&got, _)) if got == version => Err("truncated value".to_string()),
        Some((v, _)) => Err(format!("unknown version {v}")),
        None => Err("empty value".to_string()),
    }
}

/// The base number a base pointer value holds.
fn base_number(v: &[u8]) -> Result<u64, String> {
    let body = unseal(v)?;
    let b: [u8; 8] = body.try_into().map_err(|_| "base pointer is not 8 bytes".to_string())?;
    Ok(u64::from_be_bytes(b))
}

/// What one tree holds (see [`Store::tree_stats`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct TreeStats {
    /// The tree's name.
    pub tree: &'static str,
    /// Values (keys) in it.
    pub values: u64,
    /// Bytes of its keys and values.
    pub bytes: u64,
    /// Bytes of its largest value.
    pub largest_value: u64,
}

/// Handle to the sled database. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    path: Arc<PathBuf>,
    options: Arc<StoreOptions>,
    /// The open database.
    inner: Trees,
    /// Set by the first write that fails: no write reaches the database after it (see [`WriteHalt`]).
    halt: Arc<WriteHalt>,
    /// The next summary number (see the module doc): above every stored one.
    next_summary: Arc<std::sync::atomic::AtomicU64>,
    /// Snapshot parts (see [`snaps`]): the next number, and the stored bytes of the increments since the base
    /// and of the base (set by restore, kept by the writes; they decide when a checkpoint writes a new base).
    snap: Arc<SnapCounters>,
    /// The shutdown image's record `(token, marker)` this open took away (see [`image`]), until a restore uses it.
    image_record: Arc<Mutex<Option<(u64, u64)>>>,
    /// Tests: this many more durable appends are written and flushed, then reported as failed (what a write cut
    /// short by a full disk can leave: sled kept some of it, the caller was told it failed).
    #[cfg(test)]
    pub(crate) fail_after_write: Arc<std::sync::atomic::AtomicU32>,
    #[cfg(test)]
    /// Tests: the next this many [`Store::flush`] calls report failure without flushing.
    pub(crate) fail_flush: Arc<std::sync::atomic::AtomicU32>,
    /// Tests: [`FAIL_FOLD_WRITE`] makes the next [`Store::fold_write`], [`FAIL_FOLD_DELETE`] the next
    /// [`Store::fold_delete`], write and flush, then report a failure (once).
    #[cfg(test)]
    pub(crate) fail_fold: Arc<std::sync::atomic::AtomicU32>,
}

/// Tests: see `Store::fail_fold`.
pub(crate) const FAIL_FOLD_WRITE: u32 = 1;
/// Tests: see `Store::fail_fold`.
pub(crate) const FAIL_FOLD_DELETE: u32 = 2;

/// The open database and its trees.
#[derive(Clone)]
struct Trees {
    db: sled::Db,
    /// The event log's blocks, in files beside sled's (see [`files`]).
    files: Arc<files::LogFiles>,
    /// The snapshot parts, in files beside sled's (see [`snaps::PartFiles`]).
    parts: Arc<snaps::PartFiles>,
    /// Tree `log_blocks`: the dead records of the log's blocks.
    blocks: sled::Tree,
    /// The dead events of the log's blocks (see [`log::DeadTable`]); written by retention (the committer) and
    /// the log's upkeep (the maintenance thread), which exclude each other by `log_rewrites`.
    dead: Arc<Mutex<log::DeadTable>>,
    /// Held by retention's deletes and by log compaction, from reading the dead table to applying what they
    /// change: a dead record must always name a block as it is stored. Lock order: before the packs' lock.
    log_rewrites: Arc<Mutex<()>>,
    /// Every segment is to be looked at for deleting or rewriting (a collection failed, or the store opened
    /// with dead records).
    collect_due: Arc<std::sync::atomic::AtomicBool>,
    /// Segments holding events retention removed since the last [`Store::maintain_log`], by name: collected
    /// there, off the commit path.
    collect_pending: Arc<Mutex<std::collections::BTreeSet<u64>>>,
    /// Held by whoever rewrites summary packs, from reading a pack to applying its rewrite (see [`packs`]).
    /// Lock order: before the dead table.
    packs: Arc<Mutex<()>>,
    jobs: sled::Tree,
    alerts: sled::Tree,
    summaries: sled::Tree,
    dictionary: sled::Tree,
    node_health: sled::Tree,
    stream: sled::Tree,
}

/// See [`Store::snap`].
#[derive(Debug, Default)]
struct SnapCounters {
    next: std::sync::atomic::AtomicU64,
    inc_bytes: std::sync::atomic::AtomicU64,
    inc_count: std::sync::atomic::AtomicU64,
    base_bytes: std::sync::atomic::AtomicU64,
    /// Jobs the base holds (most of them may have folded since: see [`Store::base_stale`]).
    base_jobs: std::sync::atomic::AtomicU64,
    /// The highest value stored under `SNAPSHOT_SEQ_KEY` by this process.
    noted_seq: std::sync::atomic::AtomicU64,
    /// Set when retention failed to delete jobs it already dropped from memory: only the parts (and the log)
    /// still bring them back at the next start, for the next pass to delete, so no base may replace them.
    hold_bases: std::sync::atomic::AtomicBool,
    /// Set when a restore rebuilt every job from the log (a part could not be read): the next checkpoint writes
    /// a base, so that the next start does not rebuild again.
    base_due: std::sync::atomic::AtomicBool,
}

impl Trees {
    /// One above every number a snapshot part or the base pointer uses (1 without any).
    fn next_snapshot_number(&self) -> Result<u64, StoreError> {
        let mut last = 0;
        if let Some((k, _)) = self.jobs.scan_prefix([snaps::INC_PREFIX]).next_back().transpose()? {
            last = last.max(snaps::key_number(&k, 1).unwrap_or(0));
        }
        if let Some((k, _)) = self.jobs.scan_prefix([snaps::BASE_PREFIX]).next_back().transpose()? {
            last = last.max(snaps::key_number(&k, 1).unwrap_or(0));
        }
        if let Some(v) = self.jobs.get(BASE_KEY)? {
            last = last.max(base_number(&v).map_err(|r| corrupt("jobs", BASE_KEY, r))?);
        }
        if let Some(v) = self.jobs.get(SNAP_FLOOR_KEY)? {
            last = last.max(base_number(&v).map_err(|r| corrupt("jobs", SNAP_FLOOR_KEY, r))?);
        }
        for (file, _) in self.parts.list()? {
            last = last.max(file.number());
        }
        Ok(last + 1)
    }

    fn dead(&self) -> MutexGuard<'_, log::DeadTable> {
        self.dead.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn log_rewrites(&self) -> MutexGuard<'_, ()> {
        self.log_rewrites.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One above the highest stored summary number, packed or single (1 without numbered summaries).
    fn next_summary(&self) -> Result<u64, StoreError> {
        Ok(packs::last_number(&self.summaries)?.saturating_add(1))
    }

    fn packs_lock(&self) -> MutexGuard<'_, ()> {
        self.packs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The log sequences summary number `no` of a job lists: `None` if there is no such summary.
    fn summary_seqs(&self, job_id: &str, no: u64) -> Result<Option<Vec<u64>>, StoreError> {
        if no == NO_SUMMARY {
            return Ok(None);
        }
        let Some(pack) = packs::pack_at(&self.summaries, no)? else { return Ok(None) };
        match pack.get(no) {
            Some(entry) => {
                let (held_by, summary) = entry?;
                if held_by != job_id {
                    return Ok(None);
                }
                let (seqs, _) = parse_summary(summary).map_err(|r| StoreError::Corrupt {
                    what: "summaries",
                    key: format!("summary {no}"),
                    reason: r,
                })?;
                Ok(Some(seqs))
            }
            None => Ok(None),
        }
    }

    /// Adds removing summaries `(job id, number)` to `batch` (by rewriting their packs) and returns those
    /// removed (with their summaries). The caller holds [`Trees::packs_lock`]
    /// until the batch is applied. A damaged pack is left alone (logged): nothing in it can be read or
    /// rewritten.
    fn plan_summary_removal(
        &self,
        batch: &mut sled::Batch,
        wanted: &[(&str, u64)],
    ) -> Result<Vec<packs::Removed>, StoreError> {
        packs::plan_remove(&self.summaries, batch, wanted)
    }

    /// The live event at `seq`, if the log holds it.
    fn log_get(&self, seq: u64) -> Result<Option<pb::LifecycleEvent>, StoreError> {
        let Some(block) = self.files.block_at(seq)? else { return Ok(None) };
        match block.get(seq) {
            Some(body) if !self.dead().is_dead(block.first, seq) => decode_log_body(seq, body).map(Some),
            _ => Ok(None),
        }
    }

    /// Opens the database. sled's background writers may hold the directory's lock for a moment after the last
    /// handle of a previous open is dropped, so a lock conflict is retried for up to two seconds.
    fn open(path: &Path, options: &StoreOptions) -> Result<Trees, StoreError> {
        let mut attempts = 0;
        let db = loop {
            let config =
                sled::Config::new().path(path).mode(sled::Mode::HighThroughput).cache_capacity(options.cache_bytes);
            match config.open() {
                Ok(db) => break db,
                Err(sled::Error::Io(e)) if attempts < 100 && e.to_string().contains("could not acquire lock") => {
                    attempts += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => return Err(e.into()),
            }
        };
        let blocks = db.open_tree("log_blocks")?;
        // What sled proves about the log: the highest sequence it knows was acknowledged (an unreadable record
        // is left out: the restore reports it, and checks the snapshots against the log too).
        let jobs = db.open_tree("jobs")?;
        let stream = db.open_tree("stream")?;
        let stored_seq = |tree: &sled::Tree, key: &[u8]| {
            sealed_array(tree, "jobs", key).ok().flatten().map_or(0, u64::from_be_bytes)
        };
        let acknowledged = files::Acknowledged {
            through: [MAX_SEQ_KEY, SNAPSHOT_SEQ_KEY]
                .iter()
                .map(|k| stored_seq(&jobs, k))
                .chain([marker_in(&jobs).unwrap_or(0), stored_seq(&stream, stream_tree::STREAM_LOG_KEY)])
                .max()
                .unwrap_or(0),
        };
        let (files, opened) = files::LogFiles::open(&path.join(LOG_DIR), options.segment_bytes, acknowledged)?;
        if opened.torn_bytes > 0 || opened.scanned > 1 {
            tracing::info!(?opened, "log files opened");
        }
        let dead = log::DeadTable::load(&blocks, &files.counts())?;
        let collect_due = Arc::new(std::sync::atomic::AtomicBool::new(dead.totals().0 > 0));
        let dead = Arc::new(Mutex::new(dead));
        let parts = snaps::PartFiles::open(&path.join(SNAP_DIR))?;
        Ok(Trees {
            files: Arc::new(files),
            parts: Arc::new(parts),
            blocks,
            dead,
            log_rewrites: Arc::default(),
            collect_due,
            collect_pending: Arc::default(),
            packs: Arc::default(),
            jobs,
            stream,
            alerts: db.open_tree("alerts")?,
            summaries: db.open_tree("summaries")?,
            dictionary: db.open_tree("dictionary")?,
            node_health: db.open_tree("node_health")?,
            db,
        })
    }
}

/// The checkpoint marker in the `jobs` tree (0 if there is none).
fn marker_in(jobs: &sled::Tree) -> Result<u64, StoreError> {
    let Some(v) = jobs.get(CHECKPOINT_KEY)? else { return Ok(0) };
    let bad = |r: String| corrupt("jobs", CHECKPOINT_KEY, r);
    let body = unseal(&v).map_err(bad)?;
    let arr: [u8; 8] = body.try_into().map_err(|_| bad("not 8 bytes".to_string()))?;
    Ok(u64::from_be_bytes(arr))
}

/// The sealed fixed-size value under `key` in `tree` (named `what` in errors), if there is one.
fn sealed_array<const N: usize>(
    tree: &sled::Tree,
    what: &'static str,
    key: &[u8],
) -> Result<Option<[u8; N]>, StoreError> {
    let Some(v) = tree.get(key)? else { return Ok(None) };
    let bad = |r: String| corrupt(what, key, r);
    let body = unseal(&v).map_err(bad)?;
    let arr: [u8; N] = body.try_into().map_err(|_| bad(format!("not {N} bytes")))?;
    Ok(Some(arr))
}

fn corrupt(what: &'static str, key: &[u8], reason: impl ToString) -> StoreError {
    StoreError::Corrupt { what, key: String::from_utf8_lossy(key).into_owned(), reason: reason.to_string() }
}

/// Encodes an event as stored in the log.
pub fn encode_log_value(ev: &pb::LifecycleEvent) -> Vec<u8> {
    seal(&ev.encode_to_vec())
}

/// The protobuf body of a stored log value (without version and checksum), if it is one.
pub fn log_value_body(v: &[u8]) -> Option<&[u8]> {
    unseal(v).ok()
}

/// Decodes a stored log value of sequence `seq` (as the accepted-event feed hands them out).
pub fn decode_stored_event(seq: u64, v: &[u8]) -> Result<pb::LifecycleEvent, StoreError> {
    decode_log_value(&seq.to_be_bytes(), v)
}

fn decode_log_value(key: &[u8], v: &[u8]) -> Result<pb::LifecycleEvent, StoreError> {
    let body = unseal(v).map_err(|r| corrupt_log(key, r))?;
    pb::LifecycleEvent::decode(body).map_err(|e| corrupt_log(key, e))
}

/// Decodes a log event's protobuf body (from a block).
fn decode_log_body(seq: u64, body: &[u8]) -> Result<pb::LifecycleEvent, StoreError> {
    pb::LifecycleEvent::decode(body).map_err(|e| corrupt_log(&seq.to_be_bytes(), e))
}

fn corrupt_log(key: &[u8], reason: impl ToString) -> StoreError {
    let shown = match <[u8; 8]>::try_from(key) {
        Ok(a) => format!("seq {}", u64::from_be_bytes(a)),
        Err(_) => String::from_utf8_lossy(key).into_owned(),
    };
    StoreError::Corrupt { what: "log", key: shown, reason: reason.to_string() }
}

/// An event a job's record says is stored, not found in the log.
fn missing_event(job_id: &str, seq: u64) -> StoreError {
    StoreError::Corrupt {
        what: "log",
        key: format!("seq {seq}"),
        reason: format!("event of job {job_id:?} is not in the log"),
    }
}

impl Store {
    /// Opens (or creates) the store under `path`. A directory it creates is made 0700 (job, team and project
    /// names are not for every local user); an existing directory is left as the operator set it.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Store::open_with(path, StoreOptions::default())
    }
    /// [`Store::open`] with options.
    pub fn open_with(path: &Path, options: StoreOptions) -> Result<Store, StoreError> {
        create_private_dir(path)?;
        let trees = Trees::open(path, &options)?;
        let next_summary = trees.next_summary()?;
        let snap = SnapCounters::default();
        snap.next.store(trees.next_snapshot_number()?, std::sync::atomic::Ordering::Release);
        // A shutdown image is good for this opening only: its record goes before anything else can write.
        let image_record = match trees.jobs.remove(IMAGE_KEY)? {
            Some(v) => {
                trees.db.flush()?;
                match unseal(&v).ok().and_then(|b| <[u8; 16]>::try_from(b).ok()) {
                    Some(b) => Some((
                        u64::from_be_bytes(b[..8].try_into().unwrap_or_default()),
                        u64::from_be_bytes(b[8..].try_into().unwrap_or_default()),
                    )),
                    None => {
                        tracing::warn!("shutdown image record unreadable; the summaries are read instead");
                        image::remove(path);
                        None
                    }
                }
            }
            None => {
                image::remove(path);
                None
            }
        };
        Ok(Store {
            path: Arc::new(path.to_path_buf()),
            options: Arc::new(options),
            inner: trees,
            halt: Arc::default(),
            next_summary: Arc::new(next_summary.into()),
            snap: Arc::new(snap),
            image_record: Arc::new(Mutex::new(image_record)),
            #[cfg(test)]
            fail_after_write: Arc::default(),
            #[cfg(test)]
            fail_flush: Arc::default(),
            #[cfg(test)]
            fail_fold: Arc::default(),
        })
    }
    /// The store's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open trees (cheap clones of sled handles), for reading.
    fn t(&self) -> Result<Trees, StoreError> {
        Ok(self.inner.clone())
    }

    /// The open trees, for writing: refused once writes are halted (see [`WriteHalt`]), before sled is touched.
    fn w(&self) -> Result<Trees, StoreError> {
        match self.halt.cause() {
            Some(cause) => Err(StoreError::Halted(cause)),
            None => Ok(self.inner.clone()),
        }
    }
    /// The store's write halt, for health to report.
    pub fn write_halt(&self) -> Arc<WriteHalt> {
        self.halt.clone()
    }
    /// The cause, once writes are halted.
    pub fn halted(&self) -> Option<&'static str> {
        self.halt.cause()
    }
    /// After a write failed with `e`: halts every later write if `e` is of a kind that must (see
    /// [`StoreError::halts_writes`]); true if this call halted them (the first).
    pub fn halt_after(&self, e: &StoreError) -> bool {
        let first = e.halts_writes() && self.halt.halt(e.cause());
        if first {
            tracing::error!(
                error = %e,
                cause = e.cause(),
                "store writes halted: ingest is refused until the collector restarts, once the store is writable"
            );
        }
        first
    }
    /// The events of a job at the given sequences (in the order given), from the log. A sequence the log does not
    /// hold is an error: the job's record says the store holds it.
    pub fn job_events(&self, job_id: &str, seqs: &[u64]) -> Result<Vec<(u64, pb::LifecycleEvent)>, StoreError> {
        self.read_job_events(job_id, seqs, true)
    }
    /// Like [`Store::job_events`], leaving out sequences the log does not hold (for readers racing retention,
    /// which may delete a job between their index lookup and this read).
    pub fn job_events_present(&self, job_id: &str, seqs: &[u64]) -> Result<Vec<(u64, pb::LifecycleEvent)>, StoreError> {
        self.read_job_events(job_id, seqs, false)
    }
    /// The events of many jobs at once (a folded job's, by its summary): `jobs[i]` gets the events at
    /// `seqs[i]`, in sequence order. The log is read in one pass in sequence order (each block touched is read
    /// and decompressed once, so a chunk of jobs costs one block read per block it touches, not one per event). A
    /// sequence the log does not hold is an error, as for [`Store::job_events`].
    pub fn jobs_events(&self, jobs: &[(&str, &[u64])]) -> Result<Vec<Vec<(u64, pb::LifecycleEvent)>>, StoreError> {
        let mut out = self.jobs_events_map(jobs, |seq, ev| Some((seq, ev)))?;
        for evs in &mut out {
            evs.sort_by_key(|(s, _)| *s);
        }
        Ok(out)
    }

    /// [`Store::jobs_events`], each event handed to `map` as it is decoded (in sequence order) and dropped when it
    /// gives `None`: reading many jobs' events never holds them all decoded.
    fn jobs_events_map<T>(
        &self,
        jobs: &[(&str, &[u64])],
        map: impl Fn(u64, pb::LifecycleEvent) -> Option<T>,
    ) -> Result<Vec<Vec<T>>, StoreError> {
        let t = self.t()?;
        let mut wanted: Vec<(u64, u32)> =
            jobs.iter().enumerate().flat_map(|(i, (_, seqs))| seqs.iter().map(move |s| (*s, i as u32))).collect();
        wanted.sort_unstable();
        let mut out: Vec<Vec<T>> = jobs.iter().map(|(_, seqs)| Vec::with_capacity(seqs.len())).collect();
        // One decode per block touched: the wanted sequences are sorted, and a block covers a run of them. The
        // dead table's lock only per lookup, so readers of single events are not held up.
        let mut block: Option<log::Block> = None;
        for (seq, i) in wanted {
            if !block.as_ref().is_some_and(|b| b.first <= seq && seq <= b.last()) {
                block = t.files.block_at(seq)?;
            }
            match block.as_ref().and_then(|b| b.get(seq).filter(|_| !t.dead().is_dead(b.first, seq))) {
                Some(body) => out[i as usize].extend(map(seq, decode_log_body(seq, body)?)),
                None => return Err(missing_event(jobs[i as usize].0, seq)),
            }
        }
        Ok(out)
    }

    /// Reads each sequence from the log; one it does not hold is an error when `strict`, else left out.
    fn read_job_events(
        &self,
        job_id: &str,
        seqs: &[u64],
        strict: bool,
    ) -> Result<Vec<(u64, pb::LifecycleEvent)>, StoreError> {
        let mut out = Vec::with_capacity(seqs.len());
        for &seq in seqs {
            match self.event(seq)? {
                Some(ev) => out.push((seq, ev)),
                None if !strict => {}
                None => return Err(missing_event(job_id, seq)),
            }
        }
        Ok(out)
    }
    /// The log sequence that the job snapshots cover.
    pub fn checkpoint_seq(&self) -> Result<u64, StoreError> {
        marker_in(&self.t()?.jobs)
    }
    /// Appends encoded events at the given sequences to the log's files, all or none, and syncs them: when this
    /// returns `Ok`, the events survive a crash of the process and of the machine. sled is not flushed: nothing
    /// it holds is needed to read the log.
    pub fn append_durable(&self, entries: &[(u64, Vec<u8>)]) -> Result<(), StoreError> {
        let t = self.w()?;
        let mut bodies = Vec::with_capacity(entries.len());
        for (seq, value) in entries {
            let body = unseal(value).map_err(|r| corrupt_log(&seq.to_be_bytes(), r))?;
            bodies.push((*seq, body));
        }
        t.files.append(&log::encode_blocks(&bodies)?)?;
        #[cfg(test)]
        {
            use std::sync::atomic::Ordering;
            if self.fail_after_write.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok() {
                return Err(StoreError::Sled(sled::Error::Io(std::io::Error::from_raw_os_error(28))));
            }
        }
        Ok(())
    }
    /// Reads one logged event.
    pub fn event(&self, seq: u64) -> Result<Option<pb::LifecycleEvent>, StoreError> {
        self.t()?.log_get(seq)
    }
    /// Log upkeep, for a thread off the commit path: deletes or rewrites the segments retention emptied since
    /// the last call (every segment when a collection failed or the store was opened with dead records; a
    /// failure loses nothing, the dead records are durable, and the next call looks at every segment), then
    /// compacts the oldest segment not yet compacted (see [`files::LogFiles::compact`]). Returns the segment
    /// compacted with its bytes before and after.
    pub fn maintain_log(&self) -> Result<Option<(u64, u64, u64)>, StoreError> {
        let t = self.w()?;
        let _rewrites = t.log_rewrites();
        let pending = std::mem::take(&mut *t.collect_pending.lock().unwrap_or_else(|p| p.into_inner()));
        let names: Vec<u64> = if t.collect_due.swap(false, std::sync::atomic::Ordering::AcqRel) {
            t.files.sealed()
        } else {
            pending.into_iter().collect()
        };
        if let Err(e) = self.collect_log(&t, &names) {
            tracing::warn!(error = %e, "log: cannot reclaim the segments of deleted events yet");
            t.collect_due.store(true, std::sync::atomic::Ordering::Release);
            return Err(e);
        }
        let Some(name) = t.files.next_to_compact() else { return Ok(None) };
        let started = std::time::Instant::now();
        let Some((_, before, after)) = t.files.compact(name, &|first| t.dead().of(first).is_some())? else {
            return Ok(None);
        };
        tracing::debug!(
            segment = name,
            before,
            after,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "log segment compacted"
        );
        Ok(Some((name, before, after)))
    }

    /// Deletes or rewrites the log segments `names` that are all or mostly dead (see
    /// [`files::LogFiles::collect_segment`]), one at a time, each followed by removing (and flushing away) the
    /// dead records of its blocks that went. The caller holds `log_rewrites`.
    fn collect_log(&self, t: &Trees, names: &[u64]) -> Result<files::Collected, StoreError> {
        let mut done = files::Collected::default();
        for &name in names {
            let Some((gone, deleted)) = t.files.collect_segment(name, &|first| t.dead().of(first))? else {
                continue;
            };
            if deleted {
                done.deleted += 1;
            } else {
                done.rewritten += 1;
            }
            let batch = t.dead().forget(&gone);
            t.blocks.apply_batch(batch)?;
            t.db.flush()?;
        }
        if done != files::Collected::default() {
            tracing::debug!(deleted = done.deleted, rewritten = done.rewritten, "log segments reclaimed");
        }
        Ok(done)
    }
    /// Flushes everything written so far.
    pub fn flush(&self) -> Result<(), StoreError> {
        let t = self.w()?;
        #[cfg(test)]
        {
            use std::sync::atomic::Ordering;
            if self.fail_flush.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok() {
                return Err(StoreError::Sled(sled::Error::Io(std::io::Error::from_raw_os_error(5))));
            }
        }
        t.db.flush()?;
        Ok(())
    }
    /// sled's page cache budget, bytes.
    pub fn cache_bytes(&self) -> u64 {
        self.options.cache_bytes
    }
    /// What each tree holds: values and bytes of keys plus values (what sled's files hold beyond it is its own
    /// framing, page table and not yet reclaimed space). Reads every value: for `store-stats`, not the data path.
    pub fn tree_stats(&self) -> Result<Vec<TreeStats>, StoreError> {
        let t = self.t()?;
        let trees: [(&'static str, &sled::Tree); 7] = [
            ("log_blocks (dead records)", &t.blocks),
            ("jobs", &t.jobs),
            ("summaries", &t.summaries),
            ("dictionary", &t.dictionary),
            ("stream", &t.stream),
            ("alerts", &t.alerts),
            ("node_health", &t.node_health),
        ];
        let mut out = Vec::with_capacity(trees.len() + 1);
        let (blocks, bytes) = t.files.totals();
        out.push(TreeStats { tree: "log files", values: blocks, bytes, largest_value: 0 });
        let parts = t.parts.list()?;
        out.push(TreeStats {
            tree: "snapshot files",
            values: parts.len() as u64,
            bytes: parts.iter().map(|(_, len)| len).sum(),
            largest_value: 0,
        });
        for (name, tree) in trees {
            let mut s = TreeStats { tree: name, values: 0, bytes: 0, largest_value: 0 };
            for kv in tree.iter() {
                let (k, v) = kv?;
                s.values += 1;
                s.bytes += (k.len() + v.len()) as u64;
                s.largest_value = s.largest_value.max(v.len() as u64);
            }
            out.push(s);
        }
        Ok(out)
    }
    /// Bytes the file system has allocated to the store's directory (every file under it: sled's file and blobs,
    /// the log's segments, snapshot files), as `du` counts them: the space the store really takes.
    pub fn allocated_bytes(&self) -> Result<u64, StoreError> {
        fn walk(dir: &Path) -> std::io::Result<u64> {
            use std::os::unix::fs::MetadataExt;
            let mut total = 0;
            for entry in std::fs::read_dir(dir)? {
                let entry = entry?;
                let meta = match entry.metadata() {
                    Ok(m) => m,
                    // Removed by sled's background writers while we walked.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                };
                total += if meta.is_dir() { walk(&entry.path())? } else { meta.blocks() * 512 };
            }
            Ok(total)
        }
        walk(&self.path).map_err(|e| StoreError::Sled(sled::Error::Io(e)))
    }
    /// Bytes the database occupies on disk.
    pub fn size_on_disk(&self) -> Result<u64, StoreError> {
        let t = self.t()?;
        let parts: u64 = t.parts.list()?.iter().map(|(_, len)| len).sum();
        Ok(t.db.size_on_disk()? + t.files.totals().1 + parts)
    }
}

fn transaction_result(r: Result<(), sled::transaction::TransactionError<()>>) -> Result<(), StoreError> {
    match r {
        Ok(()) => Ok(()),
        Err(sled::transaction::TransactionError::Storage(e)) => Err(e.into()),
        Err(sled::transaction::TransactionError::Abort(())) => {
            Err(StoreError::Corrupt { what: "jobs", key: String::new(), reason: "transaction aborted".into() })
        }
    }
}

/// Creates `path` (and missing parents) with mode 0700 on Unix.
fn create_private_dir(path: &Path) -> Result<(), StoreError> {
    if path.is_dir() {
        return Ok(());
    }
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(path).map_err(|source| StoreError::Dir { path: path.display().to_string(), source })
}

pub mod backup;
mod checkpoints;
mod files;
mod folds;
pub mod history;
mod image;
mod log;
mod packs;
mod restore;
mod retention;
mod side;
pub mod snaps;
mod stream_tree;

/// The directory of the log's files, under the store's.
const LOG_DIR: &str = "log";
#[cfg(test)]
pub(crate) mod tests;

pub use log::KillStats;
