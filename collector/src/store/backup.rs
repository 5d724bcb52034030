//! Backups: every event the store holds, up to a stated sequence, in a directory of two files, taken from a running
//! collector without stopping ingest, checked, and restored into a new store.
//!
//! The log is the store's source of truth: jobs, timelines, summaries, snapshot parts and SLO figures are all
//! derived from it (a start that cannot use its snapshots rebuilds every job from the log). A backup therefore holds
//! the log's events and nothing derived:
//! - `events.zst`: a zstd stream of frames `varint(seq) ++ varint(len) ++ sealed log value`, in sequence order
//!   (each value carries its own checksum, as in the log);
//! - `manifest.json`, written last (to a temporary name, synced, renamed, the directory synced), so that a
//!   directory with a manifest is a whole backup: the format, the highest sequence it holds (`through_seq`: every
//!   event acknowledged at or before it that retention had not deleted is in the backup, none after it), the number
//!   of events and the SHA-256 and size of `events.zst`.
//!
//! The cut is consistent without a pause: sequences are handed out in commit order, the log's events up to
//! `through_seq` are immutable once acknowledged, and later events are left out by their sequence. Retention may
//! delete an expired job while the backup runs; its events are then in the backup or not, whole or partly, as they
//! would be after the deletion (the restored collector's retention deletes what remains).
//!
//! A restore writes the events into a new store's log, in the same sequences; its first start rebuilds every job
//! from the log. Not in a backup: alert records (a restored collector raises what is still true again), node
//! health readings (kept 30 days, rebuilt by node agents) and the stream out's records (a subscriber resumes from
//! the restored collector's first cursor).

use super::{Store, StoreError};
use prost::encoding::{decode_varint, encode_varint};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// The backup format this code writes and reads.
pub const FORMAT: u32 = 1;
/// The events file of a backup.
pub const EVENTS_FILE: &str = "events.zst";
/// The manifest of a backup.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Events read from the log per step.
const PAGE: usize = 4096;
/// Largest sealed value accepted in a backup (a gRPC message is at most 16 MiB).
const MAX_VALUE: u64 = 16 << 20;

/// A backup's manifest.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: u32,
    /// The collector's version that wrote it.
    pub collector_version: String,
    /// When it was finished (RFC 3339).
    pub created_at: String,
    /// Every event with a sequence up to it (not deleted by retention) is in the backup; none above it.
    pub through_seq: u64,
    /// Events in `events.zst`.
    pub events: u64,
    /// Size of `events.zst`, bytes.
    pub events_bytes: u64,
    /// SHA-256 of `events.zst`, lower-case hex.
    pub events_sha256: String,
}

/// A backup that cannot be written, read or trusted.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A file of the backup could not be written or read.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file of the backup is damaged or not a backup (the file named, and why).
    #[error("{path}: {reason}")]
    Damaged {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The target cannot take a backup or a restore (not empty, a store already there).
    #[error("{0}")]
    Target(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BackupError + '_ {
    move |source| BackupError::Io { path: path.to_path_buf(), source }
}

fn damaged(path: &Path, reason: impl Into<String>) -> BackupError {
    BackupError::Damaged { path: path.to_path_buf(), reason: reason.into() }
}

/// A writer that hashes and counts what passes through it.
struct Hashing<W> {
    inner: W,
    hash: ring::digest::Context,
    bytes: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Creates `dir` (private) for a backup or checks that it is an empty directory.
pub fn prepare_target(dir: &Path) -> Result<(), BackupError> {
    if dir.exists() {
        let mut entries = std::fs::read_dir(dir).map_err(io(dir))?;
        if entries.next().is_some() {
            return Err(BackupError::Target(format!(
                "{} is not empty: a backup goes into a new directory",
                dir.display()
            )));
        }
        return Ok(());
    }
    super::create_private_dir(dir)?;
    Ok(())
}

/// The highest sequence the store's log holds now: a backup started now holds every event up to it.
pub fn current_through(store: &Store) -> Result<u64, BackupError> {
    Ok(store.t()?.files.last_seq())
}

/// Writes a backup of `store`'s events with sequences up to `through` into `dir` (empty or new); calls `progress`
/// with the events written so far after each step. Returns the manifest, written last.
pub fn write(store: &Store, dir: &Path, through: u64, mut progress: impl FnMut(u64)) -> Result<Manifest, BackupError> {
    prepare_target(dir)?;
    let path = dir.join(EVENTS_FILE);
    let file = std::fs::File::create(&path).map_err(io(&path))?;
    let mut out =
        Hashing { inner: BufWriter::new(file), hash: ring::digest::Context::new(&ring::digest::SHA256), bytes: 0 };
    let mut z = zstd::stream::Encoder::new(&mut out, 3).map_err(io(&path))?;
    let (mut after, mut events) = (0u64, 0u64);
    let mut frame = Vec::new();
    'pages: loop {
        let page = store.log_after(after, PAGE)?;
        if page.is_empty() {
            break;
        }
        for (seq, _, value) in page {
            if seq > through {
                break 'pages;
            }
            frame.clear();
            encode_varint(seq, &mut frame);
            encode_varint(value.len() as u64, &mut frame);
            frame.extend_from_slice(&value);
            z.write_all(&frame).map_err(io(&path))?;
            after = seq;
            events += 1;
        }
        progress(events);
    }
    z.finish().map_err(io(&path))?;
    out.flush().map_err(io(&path))?;
    let (hash, bytes) = (out.hash.clone().finish(), out.bytes);
    let file = out.inner.into_inner().map_err(|e| BackupError::Io { path: path.clone(), source: e.into_error() })?;
    file.sync_all().map_err(io(&path))?;
    drop(file);
    let manifest = Manifest {
        format: FORMAT,
        collector_version: env!("CARGO_PKG_VERSION").to_string(),
        created_at: crate::time::format_ms(startline_proto::time::now_ms()),
        through_seq: through,
        events,
        events_bytes: bytes,
        events_sha256: hex(hash.as_ref()),
    };
    write_manifest(dir, &manifest)?;
    Ok(manifest)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn write_manifest(dir: &Path, m: &Manifest) -> Result<(), BackupError> {
    let path = dir.join(MANIFEST_FILE);
    let tmp = dir.join(format!("{MANIFEST_FILE}.tmp"));
    let body = serde_json::to_vec_pretty(m).map_err(|e| damaged(&path, e.to_string()))?;
    let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(&body).and_then(|()| f.sync_all()).map_err(io(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// Reads `dir`'s manifest.
pub fn read_manifest(dir: &Path) -> Result<Manifest, BackupError> {
    let path = dir.join(MANIFEST_FILE);
    let body = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(damaged(&path, "missing: not a backup, or one that did not finish"))
        }
        Err(e) => return Err(io(&path)(e)),
    };
    let m: Manifest =
        serde_json::from_slice(&body).map_err(|e| damaged(&path, format!("not a backup manifest: {e}")))?;
    if m.format != FORMAT {
        return Err(damaged(&path, format!("format {} (this collector reads format {FORMAT})", m.format)));
    }
    Ok(m)
}

/// Reads a backup's events in sequence order, each checked, and hands them to `each` as `(seq, sealed value)`;
/// checks the events file's size and SHA-256 against the manifest, the count, the order and the bound.
pub fn read(
    dir: &Path,
    mut each: impl FnMut(u64, Vec<u8>) -> Result<(), BackupError>,
) -> Result<Manifest, BackupError> {
    let m = read_manifest(dir)?;
    let path = dir.join(EVENTS_FILE);
    let file = std::fs::File::open(&path).map_err(io(&path))?;
    let len = file.metadata().map_err(io(&path))?.len();
    if len != m.events_bytes {
        return Err(damaged(&path, format!("{len} bytes, the manifest says {}", m.events_bytes)));
    }
    // The hash of the whole file first: a damaged file is refused before anything of it is used.
    let mut hash = ring::digest::Context::new(&ring::digest::SHA256);
    let mut r = BufReader::new(file);
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = r.read(&mut buf).map_err(io(&path))?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
    }
    if hex(hash.finish().as_ref()) != m.events_sha256 {
        return Err(damaged(&path, "SHA-256 differs from the manifest's: the file is damaged"));
    }
    let file = std::fs::File::open(&path).map_err(io(&path))?;
    let mut z = BufReader::new(zstd::stream::Decoder::new(file).map_err(io(&path))?);
    let (mut last, mut count) = (0u64, 0u64);
    while let Some(seq) = read_varint(&mut z).map_err(|e| damaged(&path, format!("after {count} events: {e}")))? {
        let len = read_varint(&mut z)
            .map_err(|e| damaged(&path, format!("event {count}: {e}")))?
            .ok_or_else(|| damaged(&path, format!("event {count}: cut short")))?;
        if len > MAX_VALUE {
            return Err(damaged(&path, format!("event {count}: a value of {len} bytes")));
        }
        let mut value = vec![0u8; len as usize];
        z.read_exact(&mut value).map_err(|e| damaged(&path, format!("event {count}: {e}")))?;
        if seq <= last || seq > m.through_seq {
            return Err(damaged(
                &path,
                format!("event {count}: sequence {seq} after {last} (through {})", m.through_seq),
            ));
        }
        super::decode_stored_event(seq, &value).map_err(|e| damaged(&path, format!("sequence {seq}: {e}")))?;
        each(seq, value)?;
        (last, count) = (seq, count + 1);
    }
    if count != m.events {
        return Err(damaged(&path, format!("{count} events, the manifest says {}", m.events)));
    }
    Ok(m)
}

/// A varint, or `None` at a clean end of the stream.
fn read_varint(r: &mut impl Read) -> Result<Option<u64>, String> {
    let mut bytes = Vec::with_capacity(10);
    let mut b = [0u8; 1];
    loop {
        match r.read(&mut b) {
            Ok(0) if bytes.is_empty() => return Ok(None),
            Ok(0) => return Err("cut short in a varint".into()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.to_string()),
        }
        bytes.push(b[0]);
        if b[0] & 0x80 == 0 {
            break;
        }
        if bytes.len() == 10 {
            return Err("a varint over 10 bytes".into());
        }
    }
    decode_varint(&mut bytes.as_slice()).map(Some).map_err(|e| e.to_string())
}

/// Restores the backup in `from` into a new store at `to` (a new or empty directory): every event into its log, in
/// its sequence. The collector's first start on `to` rebuilds every job from the log.
pub fn restore(from: &Path, to: &Path) -> Result<Manifest, BackupError> {
    // Checked whole before the new store is made: a damaged backup leaves nothing behind.
    read(from, |_, _| Ok(()))?;
    prepare_target(to)?;
    let store = Store::open(to)?;
    let mut chunk: Vec<(u64, Vec<u8>)> = Vec::with_capacity(PAGE);
    let m = read(from, |seq, value| {
        chunk.push((seq, value));
        if chunk.len() == PAGE {
            store.append_durable(&chunk)?;
            chunk.clear();
        }
        Ok(())
    })?;
    if !chunk.is_empty() {
        store.append_durable(&chunk)?;
    }
    store.flush()?;
    Ok(m)
}

/// What [`verify_store`] read.
#[derive(Debug, Default, serde::Serialize)]
pub struct StoreReport {
    /// Log events read and decoded (every block's checksum checked).
    pub log_events: u64,
    /// Jobs restored (snapshot parts, summaries and the log's tail read as a start reads them).
    pub jobs: usize,
    /// Why the snapshot parts could not be used, if they could not (every job was rebuilt from the log).
    pub snapshots_refused: Option<String>,
    /// Stream records read.
    pub stream_records: u64,
    /// Problems found (empty: the store is sound).
    pub problems: Vec<String>,
}

/// Reads everything a store holds, as a start would and more: the restore (snapshot parts, summaries, the log's
/// tail), every log event, every stream record. A closed store only (the collector stopped).
pub fn verify_store(store: &Store) -> StoreReport {
    let mut report = StoreReport::default();
    match store.restore() {
        Ok(r) => {
            report.jobs = r.jobs.len();
            report.snapshots_refused = r.rebuilt;
            if let Some(why) = &report.snapshots_refused {
                report.problems.push(format!("snapshot parts refused (jobs rebuilt from the log): {why}"));
            }
        }
        Err(e) => report.problems.push(format!("restore: {e}")),
    }
    let mut after = 0;
    loop {
        match store.log_after(after, PAGE) {
            Ok(page) if page.is_empty() => break,
            Ok(page) => {
                report.log_events += page.len() as u64;
                after = page.last().map_or(after, |p| p.0);
            }
            Err(e) => {
                report.problems.push(format!("log after sequence {after}: {e}"));
                break;
            }
        }
    }
    match store.stream_bounds() {
        Ok(None) => {}
        Err(e) => report.problems.push(format!("stream: {e}")),
        Ok(Some((first, _))) => {
            let mut cursor = first.saturating_sub(1);
            loop {
                match store.stream_read(cursor, PAGE) {
                    Ok(records) if records.is_empty() => break,
                    Ok(records) => {
                        report.stream_records += records.len() as u64;
                        cursor = records.last().map_or(cursor, |r| r.cursor);
                    }
                    Err(e) => {
                        report.problems.push(format!("stream after cursor {cursor}: {e}"));
                        break;
                    }
                }
            }
        }
    }
    report
}
