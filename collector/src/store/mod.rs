//! The durable store, on sled. Owns the key layout and the value codecs.
//!
//! # Key layout
//! - tree `alerts`: alert key -> JSON alert record (firing since, resolved at).
//! - tree `log`: `seq` (u64 big-endian) -> `[1u8] ++ protobuf LifecycleEvent`. Every accepted event, in commit
//!   order. An event is acknowledged only after its batch is applied here and the database is flushed.
//! - tree `jobs`: `[1u8] ++ job_id` -> `[1u8] ++ postcard(Vec<CompactEvent>)`. Job snapshots, written by
//!   checkpoints; each snapshot holds at least the job's events with `seq <= checkpoint_seq`.
//! - tree `jobs`, key `[0u8] ++ "checkpoint_seq"` -> u64 big-endian: the marker, written after the snapshots
//!   of a checkpoint. A snapshot may be newer than the marker (a crash mid-checkpoint); replay is idempotent.
//!
//! Restoring reads every snapshot, then replays only the log entries after `checkpoint_seq`: restart cost is
//! bounded by the number of jobs plus the events since the last checkpoint, not by the whole log.
//!
//! sled calls block; callers run them on the applier thread or in `spawn_blocking`.

use crate::job::{CompactEvent, JobRecord};
use prost::Message;
use startline_proto::pb;
use std::collections::BTreeMap;
use std::path::Path;

const LOG_VERSION: u8 = 1;
const SNAPSHOT_VERSION: u8 = 1;
const CHECKPOINT_KEY: &[u8] = b"\0checkpoint_seq";
const JOB_PREFIX: u8 = 1;

/// Failures of the store. Messages are for logs; clients see only "storage unavailable".
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// sled reported an error (I/O, corruption).
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    /// A stored value could not be decoded.
    #[error("corrupt {what} at key {key}: {reason}")]
    Corrupt {
        /// Which tree.
        what: &'static str,
        /// The key, printable.
        key: String,
        /// Why.
        reason: String,
    },
}

/// What restoring the store produced.
#[derive(Debug, Default)]
pub struct Restored {
    /// Every job, with its timeline derived.
    pub jobs: BTreeMap<String, JobRecord>,
    /// The highest log sequence in the store (0 if empty).
    pub last_seq: u64,
    /// Snapshots read.
    pub snapshots: usize,
    /// Log entries replayed after the last checkpoint.
    pub replayed: usize,
}

/// Snapshots per sled batch in a checkpoint: sled applies a batch under a database-wide lock, and a large one
/// would stall the group commits running beside it.
pub const SNAPSHOT_CHUNK: usize = 64;

/// Encodes one job snapshot as a `jobs` tree key and value.
pub fn encode_snapshot(job_id: &str, rec: &JobRecord) -> Result<(Vec<u8>, Vec<u8>), StoreError> {
    let mut v = vec![SNAPSHOT_VERSION];
    let body = postcard::to_stdvec(&rec.events).map_err(|e| corrupt("jobs", job_id.as_bytes(), e))?;
    v.extend_from_slice(&body);
    let mut key = Vec::with_capacity(1 + job_id.len());
    key.push(JOB_PREFIX);
    key.extend_from_slice(job_id.as_bytes());
    Ok((key, v))
}

/// Handle to the sled database. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    db: sled::Db,
    log: sled::Tree,
    jobs: sled::Tree,
    alerts: sled::Tree,
}

fn corrupt(what: &'static str, key: &[u8], reason: impl ToString) -> StoreError {
    StoreError::Corrupt { what, key: String::from_utf8_lossy(key).into_owned(), reason: reason.to_string() }
}

/// Encodes an event as stored in the log.
pub fn encode_log_value(ev: &pb::LifecycleEvent) -> Vec<u8> {
    let mut buf = Vec::with_capacity(1 + ev.encoded_len());
    buf.push(LOG_VERSION);
    // Encoding into a Vec cannot run out of space.
    let _ = ev.encode(&mut buf);
    buf
}

fn decode_log_value(key: &[u8], v: &[u8]) -> Result<pb::LifecycleEvent, StoreError> {
    match v.split_first() {
        Some((&LOG_VERSION, rest)) => pb::LifecycleEvent::decode(rest).map_err(|e| corrupt("log", key, e)),
        _ => Err(corrupt("log", key, "unknown version byte")),
    }
}

fn seq_from_key(key: &[u8]) -> Result<u64, StoreError> {
    let arr: [u8; 8] = key.try_into().map_err(|_| corrupt("log", key, "key is not 8 bytes"))?;
    Ok(u64::from_be_bytes(arr))
}

impl Store {
    /// Opens (or creates) the store under `path`.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let db = sled::Config::new().path(path).mode(sled::Mode::HighThroughput).open()?;
        Ok(Store { log: db.open_tree("log")?, jobs: db.open_tree("jobs")?, alerts: db.open_tree("alerts")?, db })
    }

    /// Reads every job snapshot and replays the log after the last checkpoint.
    pub fn restore(&self) -> Result<Restored, StoreError> {
        let mut out = Restored::default();
        for kv in self.jobs.scan_prefix([JOB_PREFIX]) {
            let (k, v) = kv?;
            let job_id = String::from_utf8(k[1..].to_vec()).map_err(|e| corrupt("jobs", &k, e))?;
            let events: Vec<CompactEvent> = match v.split_first() {
                Some((&SNAPSHOT_VERSION, rest)) => postcard::from_bytes(rest).map_err(|e| corrupt("jobs", &k, e))?,
                _ => return Err(corrupt("jobs", &k, "unknown version byte")),
            };
            out.jobs.insert(job_id, JobRecord::from_events(events));
            out.snapshots += 1;
        }
        let from = self.checkpoint_seq()?.saturating_add(1);
        for kv in self.log.range(from.to_be_bytes()..) {
            let (k, v) = kv?;
            let seq = seq_from_key(&k)?;
            let ev = decode_log_value(&k, &v)?;
            if let Some(ce) = CompactEvent::from_pb(&ev, seq) {
                // The log holds only first deliveries, so a plain insert is exact; `insert` still guards
                // against a snapshot that already holds the event.
                out.jobs.entry(ev.job_id).or_default().insert(ce);
            }
            out.replayed += 1;
        }
        out.last_seq = match self.log.last()? {
            Some((k, _)) => seq_from_key(&k)?,
            None => 0,
        };
        Ok(out)
    }

    /// The log sequence that the job snapshots cover.
    pub fn checkpoint_seq(&self) -> Result<u64, StoreError> {
        match self.jobs.get(CHECKPOINT_KEY)? {
            Some(v) => {
                let arr: [u8; 8] = v.as_ref().try_into().map_err(|_| corrupt("jobs", CHECKPOINT_KEY, "not 8 bytes"))?;
                Ok(u64::from_be_bytes(arr))
            }
            None => Ok(0),
        }
    }

    /// Appends encoded events at the given sequences in one atomic batch and flushes: when this returns `Ok`,
    /// the events survive a crash of the process.
    pub fn append_durable(&self, entries: &[(u64, Vec<u8>)]) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for (seq, value) in entries {
            batch.insert(&seq.to_be_bytes(), value.as_slice());
        }
        self.log.apply_batch(batch)?;
        self.db.flush()?;
        Ok(())
    }

    /// Reads one logged event.
    pub fn event(&self, seq: u64) -> Result<Option<pb::LifecycleEvent>, StoreError> {
        let key = seq.to_be_bytes();
        match self.log.get(key)? {
            Some(v) => decode_log_value(&key, &v).map(Some),
            None => Ok(None),
        }
    }

    /// Writes snapshots of the given jobs, then records that snapshots now cover the log through `through_seq`.
    ///
    /// Snapshots go in small batches (sled applies a batch under a database-wide lock, and a large one would stall
    /// the commits running beside it); the marker goes last. A crash part-way leaves some snapshots newer than
    /// the marker, which is harmless: restore replays the log after the marker and replaying an event a
    /// snapshot already holds changes nothing (records skip ids they have).
    ///
    /// Not flushed here: the next group commit's flush (or shutdown) makes it durable, and until then a restore
    /// simply replays from the previous marker.
    pub fn checkpoint<'a>(
        &self,
        jobs: impl Iterator<Item = (&'a str, &'a JobRecord)>,
        through_seq: u64,
    ) -> Result<usize, StoreError> {
        let mut chunk = Vec::with_capacity(SNAPSHOT_CHUNK);
        let mut n = 0;
        for (job_id, rec) in jobs {
            chunk.push(encode_snapshot(job_id, rec)?);
            n += 1;
            if chunk.len() == SNAPSHOT_CHUNK {
                self.write_snapshots(std::mem::take(&mut chunk))?;
            }
        }
        self.write_snapshots(chunk)?;
        self.write_checkpoint_marker(through_seq)?;
        Ok(n)
    }

    /// Writes encoded snapshots (from [`encode_snapshot`]) in one batch, then yields so that a waiting group commit
    /// can take sled's lock. Keep batches small ([`SNAPSHOT_CHUNK`]).
    pub fn write_snapshots(&self, snapshots: Vec<(Vec<u8>, Vec<u8>)>) -> Result<(), StoreError> {
        if snapshots.is_empty() {
            return Ok(());
        }
        let mut batch = sled::Batch::default();
        for (k, v) in snapshots {
            batch.insert(k, v);
        }
        self.jobs.apply_batch(batch)?;
        std::thread::yield_now();
        Ok(())
    }

    /// Records that snapshots cover the log through `through_seq`. Call only after every snapshot of the
    /// checkpoint is written.
    pub fn write_checkpoint_marker(&self, through_seq: u64) -> Result<(), StoreError> {
        self.jobs.insert(CHECKPOINT_KEY, &through_seq.to_be_bytes())?;
        Ok(())
    }

    /// Saves alert records (by key) and flushes, so a restart neither loses a firing alert nor re-pages a
    /// resolved one.
    pub fn save_alerts(&self, alerts: &[crate::alert::AlertRecord]) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for a in alerts {
            let v = serde_json::to_vec(a).map_err(|e| corrupt("alerts", a.key.as_bytes(), e))?;
            batch.insert(a.key.as_bytes(), v);
        }
        self.alerts.apply_batch(batch)?;
        self.db.flush()?;
        Ok(())
    }

    /// Forgets alert records.
    pub fn delete_alerts(&self, keys: &[String]) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for k in keys {
            batch.remove(k.as_bytes());
        }
        self.alerts.apply_batch(batch)?;
        Ok(())
    }

    /// Every stored alert record.
    pub fn load_alerts(&self) -> Result<Vec<crate::alert::AlertRecord>, StoreError> {
        let mut out = Vec::new();
        for kv in self.alerts.iter() {
            let (k, v) = kv?;
            out.push(serde_json::from_slice(&v).map_err(|e| corrupt("alerts", &k, e))?);
        }
        Ok(out)
    }

    /// Deletes jobs with their logged events: the log entries first, then the snapshots (a crash in between
    /// leaves a snapshot whose raw events are gone, and the next retention pass deletes it again).
    pub fn delete_jobs(&self, jobs: &[(String, Vec<u64>)]) -> Result<(), StoreError> {
        let mut log = sled::Batch::default();
        let mut snaps = sled::Batch::default();
        for (job_id, seqs) in jobs {
            for seq in seqs {
                log.remove(&seq.to_be_bytes());
            }
            let mut key = Vec::with_capacity(1 + job_id.len());
            key.push(JOB_PREFIX);
            key.extend_from_slice(job_id.as_bytes());
            snaps.remove(key);
        }
        self.log.apply_batch(log)?;
        self.jobs.apply_batch(snaps)?;
        self.db.flush()?;
        Ok(())
    }

    /// Flushes everything written so far.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }

    /// Bytes the database occupies on disk.
    pub fn size_on_disk(&self) -> Result<u64, StoreError> {
        Ok(self.db.size_on_disk()?)
    }
}

#[cfg(test)]
mod tests;
