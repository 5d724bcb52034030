//! Export of history files (`[history.export]`): every `interval` (and soon after start) the sealed days
//! ([`History::sealed`], read from the files' footers) are compared with what this collector last uploaded, and
//! each day whose fingerprint differs is copied whole to an S3-compatible bucket with one `PUT`, at
//! `<prefix>/end_date=YYYY-MM-DD/<collector_id>.parquet`: Hive partitions as on disk, one object per collector and
//! day, so many collectors feed one bucket without overwriting each other and any engine reads
//! `<prefix>/*/*.parquet` as one table. Days whose file is gone locally (retention, no job left) are deleted from
//! the bucket: only this collector's object of that day.
//!
//! What was uploaded (day, fingerprint, job count) is kept in `<store>/history/exported.json`, written to a `.tmp`
//! file, synced and renamed over, so a restart uploads nothing again; it names its destination (endpoint, bucket,
//! prefix, collector id), and a file for another destination counts as none. Without one, the bucket is listed
//! once (this collector's objects under the prefix): days found there are uploaded again if sealed locally, deleted
//! otherwise.
//!
//! A failure (network, credentials, a 403) stops the pass with a warning and is counted; the next pass tries again.
//! Nothing here is on the ingest or commit path: the task reads files the seal pass renamed into place.

use crate::store::history::{date_of, day_of_date, Fingerprint, History, HistoryError};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, PutPayload, RetryConfig};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What was uploaded, beside the history files.
pub const STATE_FILE: &str = "exported.json";
/// The longest wait before the first pass after start.
const FIRST_PASS_MAX_DELAY: Duration = Duration::from_secs(5);

/// `[history.export]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSettings {
    /// The bucket.
    pub bucket: String,
    /// The key prefix: segments joined by `/`, no leading or trailing `/`; empty for the bucket's root.
    pub prefix: String,
    /// An S3-compatible server's URL (MinIO, R2, moto); `None`: AWS.
    pub endpoint: Option<String>,
    /// The region; `None`: `AWS_REGION` / `AWS_DEFAULT_REGION`, else `us-east-1`.
    pub region: Option<String>,
    /// Whether an `http://` endpoint may be used.
    pub allow_http: bool,
    /// How often sealed days are compared with the bucket.
    pub interval: Duration,
    /// This collector's object name in each day's partition.
    pub collector_id: String,
}

impl ExportSettings {
    /// The destination as written in the config: `s3://bucket[/prefix]`.
    pub fn url(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }

    /// A day's object key: `<prefix>/end_date=YYYY-MM-DD/<collector_id>.parquet`.
    pub fn key_of(&self, day: i64) -> String {
        let rel = format!("end_date={}/{}.parquet", date_of(day), self.collector_id);
        if self.prefix.is_empty() {
            rel
        } else {
            format!("{}/{rel}", self.prefix)
        }
    }

    /// The day of one of this collector's keys (`None`: another collector's object, or not a day's).
    fn day_of_key(&self, key: &str) -> Option<i64> {
        let rel = if self.prefix.is_empty() { key } else { key.strip_prefix(&self.prefix)?.strip_prefix('/')? };
        let (part, name) = rel.split_once('/')?;
        if name != format!("{}.parquet", self.collector_id) {
            return None;
        }
        day_of_date(part.strip_prefix("end_date=")?)
    }

    /// What the state file names as its destination.
    fn target(&self) -> String {
        format!("{} {} {}", self.endpoint.as_deref().unwrap_or("aws"), self.url(), self.collector_id)
    }
}

/// The checks of `history.export.url`: `s3://bucket[/prefix]`, a valid bucket name, prefix segments of safe
/// characters. Returns the bucket and the prefix (no leading or trailing `/`).
pub fn parse_url(url: &str) -> Result<(String, String), String> {
    let rest = url.strip_prefix("s3://").ok_or_else(|| format!("{url:?} must start with s3://"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let bucket_ok = (3..=63).contains(&bucket.len())
        && bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
        && bucket.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && bucket.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric());
    if !bucket_ok {
        return Err(format!(
            "{bucket:?} is not a bucket name (3 to 63 lowercase letters, digits, dots and hyphens, starting and \
             ending with a letter or digit)"
        ));
    }
    let prefix = prefix.trim_end_matches('/');
    if !prefix.is_empty() {
        for seg in prefix.split('/') {
            if !safe_component(seg, 255) {
                return Err(format!(
                    "prefix segment {seg:?} must be 1 to 255 letters, digits, '.', '_', '-' or '=' (not \".\" or \"..\")"
                ));
            }
        }
    }
    Ok((bucket.to_string(), prefix.to_string()))
}

/// A path component of letters, digits, `.`, `_`, `-`, `=`, at most `max` long, not `.` or `..`.
pub fn safe_component(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s != "."
        && s != ".."
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'='))
}

/// The default `history.export.collector_id`: the host's name, with characters a key component cannot have
/// replaced by `-`.
pub fn default_collector_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "collector".to_string());
    let id: String = host
        .chars()
        .take(128)
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '-' })
        .collect();
    if safe_component(&id, 128) {
        id
    } else {
        "collector".to_string()
    }
}

/// What the uploader did (metric `startline.collector.history.exports`).
#[derive(Debug, Default)]
pub struct ExportStats {
    /// Day files uploaded (new or again).
    pub uploaded: AtomicU64,
    /// Objects deleted (their day's file is gone locally).
    pub deleted: AtomicU64,
    /// Uploads, deletions and listings that failed (the next pass tries again).
    pub failed: AtomicU64,
}

/// Failures of the uploader.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The object store client could not be built.
    #[error("history.export: {0}")]
    Client(String),
    /// A call to the bucket failed.
    #[error("{op} {key}: {message}")]
    Remote {
        /// `upload`, `delete` or `list`.
        op: &'static str,
        /// The object key or prefix.
        key: String,
        /// The cause.
        message: String,
    },
    /// Reading a history file failed.
    #[error(transparent)]
    History(#[from] HistoryError),
    /// Writing the state file failed.
    #[error("{path}: {source}")]
    State {
        /// The state file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A blocking task failed.
    #[error("{0}")]
    Task(String),
}

/// A day as uploaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Uploaded {
    /// Jobs in the file.
    jobs: u64,
    /// The fingerprint, hex; empty for an object found in the bucket by a listing (uploaded again if sealed).
    fingerprint: String,
}

impl Uploaded {
    fn of(fp: Fingerprint) -> Uploaded {
        Uploaded { jobs: fp.jobs, fingerprint: format!("{:016x}", fp.hash) }
    }
}

/// The state file.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct State {
    /// The destination it describes ([`ExportSettings::target`]).
    target: String,
    /// Days uploaded, by `YYYY-MM-DD`.
    days: BTreeMap<String, Uploaded>,
}

/// What a pass did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Days uploaded.
    pub uploaded: Vec<i64>,
    /// Days deleted.
    pub deleted: Vec<i64>,
}

/// The uploader of one collector's history files.
pub struct Exporter {
    settings: ExportSettings,
    history: History,
    bucket: Arc<dyn ObjectStore>,
    state_path: PathBuf,
    /// What was uploaded; `None` until the bucket was listed (no usable state file at start).
    state: Option<State>,
    stats: Arc<ExportStats>,
}

impl Exporter {
    /// An uploader of `<store_dir>/history` to an S3 bucket, with credentials from the environment
    /// ([`AmazonS3Builder::from_env`]: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, web
    /// identity (IRSA), ECS container credentials, else the EC2 instance metadata service).
    pub fn new(store_dir: &Path, settings: ExportSettings, stats: Arc<ExportStats>) -> Result<Exporter, ExportError> {
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(&settings.bucket)
            .with_allow_http(settings.allow_http)
            // A failed call is retried a little, then the pass gives up until the next interval.
            .with_retry(RetryConfig { max_retries: 2, retry_timeout: Duration::from_secs(30), ..Default::default() })
            .with_client_options(
                ClientOptions::new()
                    .with_allow_http(settings.allow_http)
                    .with_connect_timeout(Duration::from_secs(10))
                    .with_timeout(Duration::from_secs(120)),
            );
        if let Some(e) = &settings.endpoint {
            b = b.with_endpoint(e);
        }
        if let Some(r) = &settings.region {
            b = b.with_region(r);
        }
        let bucket = b.build().map_err(|e| ExportError::Client(e.to_string()))?;
        Ok(Exporter::with_store(store_dir, settings, Arc::new(bucket), stats))
    }

    /// An uploader to any object store (tests use an in-memory one).
    pub fn with_store(
        store_dir: &Path,
        settings: ExportSettings,
        bucket: Arc<dyn ObjectStore>,
        stats: Arc<ExportStats>,
    ) -> Exporter {
        let history = History::at(store_dir);
        let state_path = history.dir().join(STATE_FILE);
        let state = match std::fs::read(&state_path) {
            Ok(bytes) => match serde_json::from_slice::<State>(&bytes) {
                Ok(s) if s.target == settings.target() => Some(s),
                Ok(s) => {
                    tracing::info!(
                        was = %s.target,
                        now = %settings.target(),
                        "history export: a new destination; its objects are listed and every day uploaded"
                    );
                    None
                }
                Err(e) => {
                    tracing::warn!(path = %state_path.display(), error = %e, "history export state unreadable; the bucket is listed again");
                    None
                }
            },
            Err(_) => None,
        };
        Exporter { settings, history, bucket, state_path, state, stats }
    }

    /// Runs passes until `stop` (a pass under way is dropped: an object is written whole or not at all, and a
    /// day not recorded is uploaded again by the next start).
    pub async fn run(mut self, stop: CancellationToken) {
        let mut wait = self.settings.interval.min(FIRST_PASS_MAX_DELAY);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                r = self.pass() => if let Err(e) = r {
                    tracing::warn!(error = %e, url = %self.settings.url(), "history export failed; the next pass tries again");
                }
            }
            wait = self.settings.interval;
        }
    }

    /// One pass: list the bucket if no state says what is there, upload each sealed day whose fingerprint
    /// differs from the one uploaded, delete the objects of days no longer sealed. Stops at the first failure.
    pub async fn pass(&mut self) -> Result<PassReport, ExportError> {
        let mut report = PassReport::default();
        if !self.history.dir().is_dir() {
            return Ok(report);
        }
        let history = self.history.clone();
        let sealed = blocking(move || history.sealed()).await??;
        if self.state.is_none() {
            let found = self.list_own().await.inspect_err(|_| self.fail())?;
            let mut state = State { target: self.settings.target(), days: BTreeMap::new() };
            for day in found {
                state.days.insert(date_of(day), Uploaded { jobs: 0, fingerprint: String::new() });
            }
            self.state = Some(state);
            self.save().await?;
        }
        for (day, s) in &sealed {
            let date = date_of(*day);
            if self.days().get(&date) == Some(&Uploaded::of(s.fingerprint)) {
                continue;
            }
            let history = self.history.clone();
            let d = *day;
            let Some((bytes, read)) = blocking(move || history.read_day(d)).await?? else { continue };
            let key = self.settings.key_of(*day);
            if let Err(e) = self.bucket.put(&ObjectPath::from(key.as_str()), PutPayload::from(bytes)).await {
                self.fail();
                return Err(ExportError::Remote { op: "upload", key, message: e.to_string() });
            }
            self.days_mut().insert(date, Uploaded::of(read.fingerprint));
            self.save().await?;
            self.stats.uploaded.fetch_add(1, Ordering::Relaxed);
            report.uploaded.push(*day);
        }
        let gone: Vec<i64> = self
            .days()
            .keys()
            .filter_map(|d| day_of_date(d))
            .filter(|d| !sealed.contains_key(d))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        for day in gone {
            let key = self.settings.key_of(day);
            match self.bucket.delete(&ObjectPath::from(key.as_str())).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    self.fail();
                    return Err(ExportError::Remote { op: "delete", key, message: e.to_string() });
                }
            }
            self.days_mut().remove(&date_of(day));
            self.save().await?;
            self.stats.deleted.fetch_add(1, Ordering::Relaxed);
            report.deleted.push(day);
        }
        Ok(report)
    }

    /// The days of this collector's objects under the prefix.
    async fn list_own(&self) -> Result<BTreeSet<i64>, ExportError> {
        use tokio_stream::StreamExt;
        let prefix = (!self.settings.prefix.is_empty()).then(|| ObjectPath::from(self.settings.prefix.as_str()));
        let mut listing = self.bucket.list(prefix.as_ref());
        let mut days = BTreeSet::new();
        while let Some(meta) = listing.next().await {
            let meta =
                meta.map_err(|e| ExportError::Remote { op: "list", key: self.settings.url(), message: e.to_string() })?;
            days.extend(self.settings.day_of_key(meta.location.as_ref()));
        }
        Ok(days)
    }

    fn fail(&self) {
        self.stats.failed.fetch_add(1, Ordering::Relaxed);
    }

    fn days(&self) -> &BTreeMap<String, Uploaded> {
        static EMPTY: BTreeMap<String, Uploaded> = BTreeMap::new();
        self.state.as_ref().map_or(&EMPTY, |s| &s.days)
    }

    fn days_mut(&mut self) -> &mut BTreeMap<String, Uploaded> {
        let target = self.settings.target();
        &mut self.state.get_or_insert_with(|| State { target, days: BTreeMap::new() }).days
    }

    /// Writes the state file: `.tmp`, synced, renamed over, directory synced.
    async fn save(&self) -> Result<(), ExportError> {
        let state = self.state.clone().unwrap_or_default();
        let path = self.state_path.clone();
        blocking(move || write_atomically(&path, &state)).await?
    }
}

fn write_atomically(path: &Path, state: &State) -> Result<(), ExportError> {
    let err = |source| ExportError::State { path: path.to_path_buf(), source };
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_vec_pretty(state).map_err(|e| err(std::io::Error::other(e)))?;
    let mut f = std::fs::File::create(&tmp).map_err(err)?;
    f.write_all(&text).map_err(err)?;
    f.sync_all().map_err(err)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(err)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(err)?;
    }
    Ok(())
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, ExportError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ExportError::Task(e.to_string()))
}

/// Starts the uploader on the runtime; it stops when `stop` is cancelled.
pub fn spawn(
    store_dir: &Path,
    settings: ExportSettings,
    stats: Arc<ExportStats>,
    stop: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, ExportError> {
    let exporter = Exporter::new(store_dir, settings, stats)?;
    Ok(tokio::spawn(exporter.run(stop)))
}

#[cfg(test)]
mod tests;
