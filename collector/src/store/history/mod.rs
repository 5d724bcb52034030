//! History files: ended jobs as Apache Parquet, one row per job ([`columns`]), one file per UTC day of the
//! jobs' end, laid out as Hive partitions so any warehouse reads the directory as one table:
//! `<store>/history/end_date=YYYY-MM-DD/jobs.parquet` (DuckDB:
//! `read_parquet('history/*/*.parquet', hive_partitioning = true)`).
//!
//! A day's file is written whole (zstd, row groups of 64k rows, sorted by end time then job id) to
//! `jobs.parquet.tmp`, synced, renamed over the day's file and the directory synced: a reader (or a crash) sees
//! the old file or the new one, never half of one; a `.tmp` left by a crash is removed at open. The footer
//! carries the day's *fingerprint* (job count and a hash of each job's version, see
//! [`crate::applier`]'s seal pass) and its format number, so a start lists what is sealed by reading footers,
//! never rows. History files are derived: the log keeps every event, so a damaged or missing file is written
//! again from the jobs (a file whose footer cannot be read counts as missing).

pub mod columns;

use arrow_array::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{FileReader, SerializedFileReader};
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

/// The history files' format, in each footer's `startline.format`.
pub const FORMAT: &str = "1";
/// A day's file name inside its partition directory.
pub const FILE: &str = "jobs.parquet";
/// Rows per row group.
const ROW_GROUP: usize = 65_536;
const DAY_MS: i64 = 86_400_000;

/// What a history file's footer says of its day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    /// Jobs in the file.
    pub jobs: u64,
    /// A hash over the jobs' ids and versions (order-independent).
    pub hash: u64,
}

/// A sealed day.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedDay {
    /// Its fingerprint.
    pub fingerprint: Fingerprint,
    /// File size, bytes.
    pub bytes: u64,
}

/// What the seal passes did (metrics `startline.collector.history.*`).
#[derive(Debug, Default)]
pub struct SealStats {
    /// Passes run.
    pub passes: AtomicU64,
    /// Day files written (new or again).
    pub files_written: AtomicU64,
    /// Day files removed.
    pub files_removed: AtomicU64,
    /// Jobs written.
    pub jobs_written: AtomicU64,
    /// Passes that failed.
    pub failures: AtomicU64,
    /// Milliseconds the last pass took.
    pub last_pass_ms: AtomicU64,
}

/// Errors of the history files.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// A file-system call failed.
    #[error("history file {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// Arrow or Parquet refused the data.
    #[error("history file {path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> HistoryError + '_ {
    move |source| HistoryError::Io { path: path.to_path_buf(), source }
}

/// The UTC day (days since 1970-01-01) of a Unix millisecond time.
pub fn day_of(ms: i64) -> i64 {
    ms.div_euclid(DAY_MS)
}

/// The first millisecond of a day.
pub fn day_start_ms(day: i64) -> i64 {
    day.saturating_mul(DAY_MS)
}

/// `YYYY-MM-DD` of a day.
pub fn date_of(day: i64) -> String {
    match time::OffsetDateTime::from_unix_timestamp(day.saturating_mul(86_400)) {
        Ok(t) => format!("{:04}-{:02}-{:02}", t.year(), u8::from(t.month()), t.day()),
        Err(_) => format!("day-{day}"),
    }
}

/// The day of a `YYYY-MM-DD` partition value.
pub fn day_of_date(s: &str) -> Option<i64> {
    let mut parts = s.splitn(3, '-');
    let year: i32 = parts.next()?.parse().ok()?;
    let month = time::Month::try_from(parts.next()?.parse::<u8>().ok()?).ok()?;
    let day: u8 = parts.next()?.parse().ok()?;
    let d = time::Date::from_calendar_date(year, month, day).ok()?;
    Some(d.midnight().assume_utc().unix_timestamp().div_euclid(86_400))
}

/// The history directory of a store.
#[derive(Debug, Clone)]
pub struct History {
    dir: PathBuf,
}

impl History {
    /// Opens (creates) `<store>/history` and removes files a crash left half written.
    pub fn open(store_dir: &Path) -> Result<History, HistoryError> {
        let dir = store_dir.join("history");
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let h = History { dir };
        for (_, part) in h.partitions()? {
            let tmp = part.join(format!("{FILE}.tmp"));
            if tmp.exists() {
                fs::remove_file(&tmp).map_err(io_err(&tmp))?;
            }
        }
        Ok(h)
    }

    /// `<store>/history` as it is, touching nothing: for a reader beside the seal pass (which alone creates the
    /// directory and removes what a crash left).
    pub fn at(store_dir: &Path) -> History {
        History { dir: store_dir.join("history") }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A day's file.
    pub fn file_of(&self, day: i64) -> PathBuf {
        self.dir.join(format!("end_date={}", date_of(day))).join(FILE)
    }

    fn partitions(&self) -> Result<Vec<(i64, PathBuf)>, HistoryError> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(io_err(&self.dir))? {
            let entry = entry.map_err(io_err(&self.dir))?;
            let name = entry.file_name();
            let Some(day) = name.to_str().and_then(|n| n.strip_prefix("end_date=")).and_then(day_of_date) else {
                continue;
            };
            out.push((day, entry.path()));
        }
        Ok(out)
    }

    /// Every sealed day with a readable footer, by day. A file whose footer cannot be read is left out (and
    /// logged): the next seal pass writes it again.
    pub fn sealed(&self) -> Result<BTreeMap<i64, SealedDay>, HistoryError> {
        let mut out = BTreeMap::new();
        for (day, part) in self.partitions()? {
            let path = part.join(FILE);
            if !path.exists() {
                continue;
            }
            match read_footer(&path) {
                Ok(s) => {
                    out.insert(day, s);
                }
                Err(e) => tracing::warn!(error = %e, "history file unreadable; it is written again"),
            }
        }
        Ok(out)
    }

    /// Writes a day's file (replacing any) from one batch, with its fingerprint in the footer; returns its size.
    pub fn write_day(&self, day: i64, batch: &RecordBatch, fp: Fingerprint) -> Result<u64, HistoryError> {
        let mut w = self.begin_day(day)?;
        w.append(batch)?;
        w.commit(fp)
    }

    /// Starts writing a day's file in batches ([`DayWriter::append`], in row order); nothing replaces the day's
    /// file before [`DayWriter::commit`], and a writer dropped uncommitted removes what it wrote.
    pub fn begin_day(&self, day: i64) -> Result<DayWriter, HistoryError> {
        let path = self.file_of(day);
        let part = path.parent().unwrap_or(&self.dir).to_path_buf();
        let created = !part.exists();
        fs::create_dir_all(&part).map_err(io_err(&part))?;
        let tmp = part.join(format!("{FILE}.tmp"));
        Ok(DayWriter { day, path, part, tmp, created, history_dir: self.dir.clone(), writer: None })
    }

    /// A day's file, whole, with what its footer says (`None`: no file). Both come from one open file, so they
    /// agree even when a seal pass renames a new file over it meanwhile.
    pub fn read_day(&self, day: i64) -> Result<Option<(Vec<u8>, SealedDay)>, HistoryError> {
        use std::io::{Read, Seek};
        let path = self.file_of(day);
        let mut file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(HistoryError::Io { path, source: e }),
        };
        let sealed = footer_of(file.try_clone().map_err(io_err(&path))?, &path)?;
        let mut bytes = Vec::with_capacity(usize::try_from(sealed.bytes).unwrap_or(0));
        file.seek(io::SeekFrom::Start(0)).map_err(io_err(&path))?;
        file.read_to_end(&mut bytes).map_err(io_err(&path))?;
        if bytes.len() as u64 != sealed.bytes {
            return Err(HistoryError::Format {
                path,
                message: format!("{} bytes read, the file has {}", bytes.len(), sealed.bytes),
            });
        }
        Ok(Some((bytes, sealed)))
    }

    /// Removes a day's file and its directory.
    pub fn remove_day(&self, day: i64) -> Result<(), HistoryError> {
        let path = self.file_of(day);
        let part = path.parent().unwrap_or(&self.dir).to_path_buf();
        match fs::remove_dir_all(&part) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(HistoryError::Io { path: part, source: e }),
        }
        sync_dir(&self.dir)
    }
}

/// A day's file being written (see [`History::begin_day`]).
pub struct DayWriter {
    day: i64,
    path: PathBuf,
    part: PathBuf,
    tmp: PathBuf,
    created: bool,
    history_dir: PathBuf,
    /// Opened with the first batch (the schema is the batch's).
    writer: Option<ArrowWriter<File>>,
}

impl DayWriter {
    fn format_err(&self) -> impl Fn(parquet::errors::ParquetError) -> HistoryError + '_ {
        |e| HistoryError::Format { path: self.tmp.clone(), message: e.to_string() }
    }

    /// Appends rows (after those appended before).
    pub fn append(&mut self, batch: &RecordBatch) -> Result<(), HistoryError> {
        if self.writer.is_none() {
            let props = WriterProperties::builder()
                .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).map_err(self.format_err())?))
                .set_max_row_group_row_count(Some(ROW_GROUP))
                .set_created_by(format!("startline-collector {}", env!("CARGO_PKG_VERSION")))
                .build();
            let file = File::create(&self.tmp).map_err(io_err(&self.tmp))?;
            let w = ArrowWriter::try_new(file, batch.schema(), Some(props)).map_err(self.format_err())?;
            self.writer = Some(w);
        }
        let Some(mut w) = self.writer.take() else { return Ok(()) };
        let r = w.write(batch).map_err(self.format_err());
        self.writer = Some(w);
        r
    }

    /// Writes the footer with the day's fingerprint, syncs, and renames the file over the day's; returns its
    /// size. A day with no rows written gets no file.
    pub fn commit(mut self, fp: Fingerprint) -> Result<u64, HistoryError> {
        let Some(mut w) = self.writer.take() else { return Ok(0) };
        for (k, v) in [
            ("startline.format", FORMAT.to_string()),
            ("startline.end_date", date_of(self.day)),
            ("startline.jobs", fp.jobs.to_string()),
            ("startline.fingerprint", format!("{:016x}", fp.hash)),
        ] {
            w.append_key_value_metadata(KeyValue::new(k.to_string(), v));
        }
        let file = w.into_inner().map_err(self.format_err())?;
        file.sync_all().map_err(io_err(&self.tmp))?;
        let bytes = file.metadata().map_err(io_err(&self.tmp))?.len();
        drop(file);
        fs::rename(&self.tmp, &self.path).map_err(io_err(&self.path))?;
        sync_dir(&self.part)?;
        if self.created {
            sync_dir(&self.history_dir)?;
        }
        Ok(bytes)
    }
}

impl Drop for DayWriter {
    /// An uncommitted file (a failed write: a full disk) is removed at once, not left to the next start.
    fn drop(&mut self) {
        if self.writer.take().is_some() || self.tmp.exists() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

fn sync_dir(dir: &Path) -> Result<(), HistoryError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err(dir))
}

/// A file's day record from its footer (format, job count, fingerprint).
pub fn read_footer(path: &Path) -> Result<SealedDay, HistoryError> {
    footer_of(File::open(path).map_err(io_err(path))?, path)
}

fn footer_of(file: File, path: &Path) -> Result<SealedDay, HistoryError> {
    let bad = |message: String| HistoryError::Format { path: path.to_path_buf(), message };
    let bytes = file.metadata().map_err(io_err(path))?.len();
    let reader = SerializedFileReader::new(file).map_err(|e| bad(e.to_string()))?;
    let meta = reader.metadata().file_metadata();
    let kv = |k: &str| {
        meta.key_value_metadata().and_then(|kvs| kvs.iter().find(|e| e.key == k)).and_then(|e| e.value.clone())
    };
    if kv("startline.format").as_deref() != Some(FORMAT) {
        return Err(bad(format!("not a history file of format {FORMAT}")));
    }
    let jobs: u64 = kv("startline.jobs").and_then(|v| v.parse().ok()).ok_or_else(|| bad("no job count".into()))?;
    let hash = kv("startline.fingerprint")
        .and_then(|v| u64::from_str_radix(&v, 16).ok())
        .ok_or_else(|| bad("no fingerprint".into()))?;
    if u64::try_from(meta.num_rows()).ok() != Some(jobs) {
        return Err(bad(format!("{} rows, footer says {jobs} jobs", meta.num_rows())));
    }
    Ok(SealedDay { fingerprint: Fingerprint { jobs, hash }, bytes })
}

#[cfg(test)]
mod tests;
