//! The durable spool every agent mode writes to: an event counts as emitted once it is appended here and
//! flushed (sled on disk), so a collector outage, an agent restart or a `kill -9` loses nothing. The uplink's
//! delivery task (`crate::uplink::delivery`) sends the oldest events in batches and removes them only once the
//! collector acknowledged them (after its own durable commit); a crash in between redelivers them, which event
//! ids make harmless. The spool itself knows nothing of the uplink.
//!
//! Bounded: at most `max_events` events and `max_bytes` bytes. When full, new events are **refused** (the
//! caller gets [`SpoolError::Full`], the node agent answers 503, `emit` exits non-zero, and a warning is
//! logged with the refusal count); events already spooled are never dropped.
//!
//! **Per-client quotas** (the node agent): an event appended for a client ([`Spool::append_for`]) carries the
//! client's id in its key (`sequence (8 bytes, big-endian) || client id`), so the events each client holds are
//! counted exactly, recomputed when the spool is opened, and released when delivered. A client over its
//! [`ClientQuota`] is refused with [`SpoolError::Quota`] (the node agent answers 429) before the spool fills,
//! so one local user cannot make another job's own events fail. Events appended without a client (the
//! adapters) and spools written before quotas (8-byte keys) count for no client.
//!
//! Private: the spool directory (and any missing parent the agent creates) is created with mode 0700, and an
//! existing spool directory (one holding sled's `conf`) readable by others is narrowed to 0700 when opened, so
//! events (job ids, labels, node names) are not readable by other local users.

use prost::Message;
use startline_proto::pb;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// Limits of the spool.
#[derive(Debug, Clone, Copy)]
pub struct SpoolLimits {
    /// Most events held.
    pub max_events: u64,
    /// Most bytes of encoded events held.
    pub max_bytes: u64,
}

impl Default for SpoolLimits {
    fn default() -> Self {
        SpoolLimits { max_events: 1_000_000, max_bytes: 512 << 20 }
    }
}

/// The most one client may hold in the spool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientQuota {
    /// Most events.
    pub max_events: u64,
    /// Most bytes of encoded events.
    pub max_bytes: u64,
}

/// Spool failures.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    /// The spool is at its limit; the events were not spooled.
    #[error("spool full: {events} events, {bytes} bytes held (limits {max_events} events, {max_bytes} bytes)")]
    Full {
        /// Events held.
        events: u64,
        /// Bytes held.
        bytes: u64,
        /// Event limit.
        max_events: u64,
        /// Byte limit.
        max_bytes: u64,
    },
    /// The client already holds its quota of the spool; the events were not spooled.
    #[error("client quota exceeded: {events} events, {bytes} bytes held for this client (quota {max_events} events, {max_bytes} bytes); retry when they are delivered")]
    Quota {
        /// Events the client holds.
        events: u64,
        /// Bytes the client holds.
        bytes: u64,
        /// The client's event quota.
        max_events: u64,
        /// The client's byte quota.
        max_bytes: u64,
    },
    /// sled failed.
    #[error("spool storage: {0}")]
    Storage(#[from] sled::Error),
    /// The spool directory could not be created or made private.
    #[error("spool directory {path}: {source}")]
    Directory {
        /// The directory.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A spooled value could not be decoded.
    #[error("spool entry {0} is corrupt")]
    Corrupt(u64),
}

/// A durable FIFO of lifecycle events. Cheap to clone.
#[derive(Clone)]
pub struct Spool {
    db: sled::Db,
    tree: sled::Tree,
    /// Per destination (collector endpoint): the last sequence it acknowledged.
    cursors: sled::Tree,
    dests: Arc<std::sync::Mutex<HashMap<String, Dest>>>,
    state: Arc<State>,
    limits: SpoolLimits,
    /// Woken when events are appended.
    pub appended: Arc<Notify>,
}

struct State {
    next_seq: AtomicU64,
    events: AtomicU64,
    bytes: AtomicU64,
    refused: AtomicU64,
    /// Events and bytes held per client; the lock also serializes appends and removals.
    lock: std::sync::Mutex<HashMap<String, Held>>,
    /// When events were appended, for the oldest event's age (metrics): runs of sequence numbers as (last
    /// sequence number of the run, Unix ms of its first append), oldest first; appends within a second share a
    /// run. Not persisted: events found when the spool is opened count from the open.
    appended_at: std::sync::Mutex<std::collections::VecDeque<(u64, i64)>>,
}

/// One delivery destination's progress.
#[derive(Debug, Clone, Copy)]
struct Dest {
    /// Last sequence acknowledged (durable in the `cursors` tree).
    acked: u64,
    /// When it last acknowledged something, or was registered.
    progress: std::time::Instant,
}

/// Events and bytes one client holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// Events.
    pub events: u64,
    /// Bytes of encoded events.
    pub bytes: u64,
}

impl Spool {
    /// Opens (or creates) the spool under `path`.
    pub fn open(path: &Path, limits: SpoolLimits) -> Result<Spool, SpoolError> {
        private_dir(path).map_err(|source| SpoolError::Directory { path: path.to_path_buf(), source })?;
        let db = open_retrying_lock(path)?;
        let tree = db.open_tree("spool")?;
        let cursors = db.open_tree("cursors")?;
        let mut events = 0u64;
        let mut bytes = 0u64;
        let mut clients: HashMap<String, Held> = HashMap::new();
        for kv in tree.iter() {
            let (k, v) = kv?;
            events += 1;
            bytes += v.len() as u64;
            if let Some(client) = client_of(&k) {
                let h = clients.entry(client).or_default();
                h.events += 1;
                h.bytes += v.len() as u64;
            }
        }
        // Sequence numbers never go back, even when every event was delivered and removed: a collector's cursor
        // may point at the last one, and a new event must come after it.
        let mut next = match tree.last()? {
            Some((k, _)) => seq_of(&k)? + 1,
            None => 1,
        };
        for kv in cursors.iter() {
            let (_, v) = kv?;
            next = next.max(seq_of(&v)? + 1);
        }
        Ok(Spool {
            db,
            tree,
            cursors,
            dests: Arc::default(),
            state: Arc::new(State {
                next_seq: AtomicU64::new(next),
                events: AtomicU64::new(events),
                bytes: AtomicU64::new(bytes),
                refused: AtomicU64::new(0),
                lock: std::sync::Mutex::new(clients),
                appended_at: std::sync::Mutex::new(
                    (events > 0).then(|| (next - 1, startline_proto::time::now_ms())).into_iter().collect(),
                ),
            }),
            limits,
            appended: Arc::new(Notify::new()),
        })
    }

    /// Appends events and flushes. When this returns `Ok`, the events survive a crash.
    pub fn append(&self, events: &[pb::LifecycleEvent]) -> Result<(), SpoolError> {
        self.append_for(events, None)
    }

    /// Appends events for a client, if one is given, within its quota; then flushes. When this returns `Ok`,
    /// the events survive a crash.
    pub fn append_for(
        &self,
        events: &[pb::LifecycleEvent],
        client: Option<(&str, ClientQuota)>,
    ) -> Result<(), SpoolError> {
        let encoded: Vec<Vec<u8>> = events.iter().map(|e| e.encode_to_vec()).collect();
        let add_bytes: u64 = encoded.iter().map(|v| v.len() as u64).sum();
        let mut clients = self.state.lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((id, quota)) = client {
            let h = clients.get(id).copied().unwrap_or_default();
            if h.events + encoded.len() as u64 > quota.max_events || h.bytes + add_bytes > quota.max_bytes {
                return Err(SpoolError::Quota {
                    events: h.events,
                    bytes: h.bytes,
                    max_events: quota.max_events,
                    max_bytes: quota.max_bytes,
                });
            }
        }
        let (held, held_bytes) = (self.state.events.load(Ordering::Relaxed), self.state.bytes.load(Ordering::Relaxed));
        if held + encoded.len() as u64 > self.limits.max_events || held_bytes + add_bytes > self.limits.max_bytes {
            let refused = self.state.refused.fetch_add(encoded.len() as u64, Ordering::Relaxed) + encoded.len() as u64;
            tracing::warn!(held, held_bytes, refused_total = refused, "spool full: new events refused");
            return Err(SpoolError::Full {
                events: held,
                bytes: held_bytes,
                max_events: self.limits.max_events,
                max_bytes: self.limits.max_bytes,
            });
        }
        let mut batch = sled::Batch::default();
        let mut last_seq = 0;
        for v in encoded {
            let seq = self.state.next_seq.fetch_add(1, Ordering::Relaxed);
            last_seq = seq;
            let mut key = seq.to_be_bytes().to_vec();
            if let Some((id, _)) = client {
                key.extend_from_slice(id.as_bytes());
            }
            batch.insert(key, v);
        }
        self.tree.apply_batch(batch)?;
        self.db.flush()?;
        self.state.events.fetch_add(events.len() as u64, Ordering::Relaxed);
        self.state.bytes.fetch_add(add_bytes, Ordering::Relaxed);
        if let Some((id, _)) = client {
            let h = clients.entry(id.to_string()).or_default();
            h.events += events.len() as u64;
            h.bytes += add_bytes;
        }
        drop(clients);
        if !events.is_empty() {
            self.note_appended(last_seq, startline_proto::time::now_ms());
        }
        self.appended.notify_one();
        Ok(())
    }

    /// The oldest events, up to `max`, with their spool sequence numbers.
    pub fn oldest(&self, max: usize) -> Result<Vec<(u64, pb::LifecycleEvent)>, SpoolError> {
        let mut out = Vec::new();
        for kv in self.tree.iter().take(max) {
            let (k, v) = kv?;
            let seq = seq_of(&k)?;
            out.push((seq, pb::LifecycleEvent::decode(v.as_ref()).map_err(|_| SpoolError::Corrupt(seq))?));
        }
        Ok(out)
    }

    /// Removes every event up to and including `seq` (they were acknowledged).
    pub fn remove_through(&self, seq: u64) -> Result<(), SpoolError> {
        let mut clients = self.state.lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut batch = sled::Batch::default();
        let (mut n, mut bytes) = (0u64, 0u64);
        let mut released: HashMap<String, Held> = HashMap::new();
        // Keys are the sequence number, then the client id, if any: everything below `seq + 1` is through `seq`.
        for kv in self.tree.range(..seq.saturating_add(1).to_be_bytes()) {
            let (k, v) = kv?;
            if let Some(client) = client_of(&k) {
                let h = released.entry(client).or_default();
                h.events += 1;
                h.bytes += v.len() as u64;
            }
            batch.remove(k);
            n += 1;
            bytes += v.len() as u64;
        }
        self.tree.apply_batch(batch)?;
        self.db.flush()?;
        self.forget_appended_through(seq);
        for (client, r) in released {
            if let Some(h) = clients.get_mut(&client) {
                h.events = h.events.saturating_sub(r.events);
                h.bytes = h.bytes.saturating_sub(r.bytes);
                if h.events == 0 {
                    clients.remove(&client);
                }
            }
        }
        self.state.events.fetch_sub(n.min(self.state.events.load(Ordering::Relaxed)), Ordering::Relaxed);
        self.state.bytes.fetch_sub(bytes.min(self.state.bytes.load(Ordering::Relaxed)), Ordering::Relaxed);
        Ok(())
    }

    /// Registers a delivery destination (a collector endpoint) and returns the last sequence it acknowledged
    /// (0 for a new one: it starts from the oldest event held).
    pub fn register(&self, dest: &str) -> Result<u64, SpoolError> {
        let acked = match self.cursors.get(dest.as_bytes())? {
            Some(v) => seq_of(&v)?,
            None => 0,
        };
        let mut d = self.dests.lock().unwrap_or_else(|p| p.into_inner());
        d.insert(dest.to_string(), Dest { acked, progress: std::time::Instant::now() });
        Ok(acked)
    }

    /// The oldest events after `cursor`, up to `max`, with their sequence numbers.
    pub fn after(&self, cursor: u64, max: usize) -> Result<Vec<(u64, pb::LifecycleEvent)>, SpoolError> {
        let mut out = Vec::new();
        for kv in self.tree.range(cursor.saturating_add(1).to_be_bytes()..).take(max) {
            let (k, v) = kv?;
            let seq = seq_of(&k)?;
            out.push((seq, pb::LifecycleEvent::decode(v.as_ref()).map_err(|_| SpoolError::Corrupt(seq))?));
        }
        Ok(out)
    }

    /// Records that `dest` acknowledged every event through `seq` (durably), then removes the events every
    /// destination still counted has acknowledged. A destination that has events to deliver but acknowledged
    /// nothing for `give_up` stops holding events back (they are removed once the others have them; it resumes
    /// with what is left when it answers again); with every destination stalled, nothing is removed.
    pub fn ack(&self, dest: &str, seq: u64, give_up: Option<std::time::Duration>) -> Result<(), SpoolError> {
        self.cursors.insert(dest.as_bytes(), &seq.to_be_bytes())?;
        let through = {
            let mut d = self.dests.lock().unwrap_or_else(|p| p.into_inner());
            let now = std::time::Instant::now();
            d.insert(dest.to_string(), Dest { acked: seq, progress: now });
            let newest = self.state.next_seq.load(Ordering::Relaxed).saturating_sub(1);
            let live =
                |x: &Dest| x.acked >= newest || give_up.is_none_or(|g| now.saturating_duration_since(x.progress) < g);
            let counted: Vec<u64> = d.values().filter(|x| live(x)).map(|x| x.acked).collect();
            let all: Vec<u64> = d.values().map(|x| x.acked).collect();
            let stalled: Vec<&String> = d.iter().filter(|(_, x)| !live(x)).map(|(k, _)| k).collect();
            if !stalled.is_empty() && !counted.is_empty() {
                tracing::warn!(?stalled, "collectors silent past the give-up time no longer hold events in the spool");
            }
            if counted.is_empty() { all.into_iter().min() } else { counted.into_iter().min() }.unwrap_or(0)
        };
        if through == 0 {
            self.db.flush()?;
            return Ok(());
        }
        // remove_through flushes, which also makes the cursor durable.
        self.remove_through(through)
    }

    /// Events held.
    pub fn len(&self) -> u64 {
        self.state.events.load(Ordering::Relaxed)
    }

    /// Whether the spool is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Another tree in the spool's database (adapters keep their per-job memory there; sled allows one
    /// process per database).
    pub fn open_tree(&self, name: &str) -> Result<sled::Tree, sled::Error> {
        self.db.open_tree(name)
    }

    /// What a client holds in the spool.
    pub fn held_by(&self, client: &str) -> Held {
        self.state.lock.lock().unwrap_or_else(|p| p.into_inner()).get(client).copied().unwrap_or_default()
    }

    /// The spool's limits.
    pub fn limits(&self) -> SpoolLimits {
        self.limits
    }

    /// Events refused because the spool was full, since start.
    pub fn refused(&self) -> u64 {
        self.state.refused.load(Ordering::Relaxed)
    }

    /// Bytes of encoded events held.
    pub fn bytes(&self) -> u64 {
        self.state.bytes.load(Ordering::Relaxed)
    }

    /// How long ago (ms before `now_ms`) the oldest event still held was appended; `None` when empty. Events
    /// found when the spool was opened count from the open.
    pub fn oldest_age_ms(&self, now_ms: i64) -> Option<i64> {
        let (k, _) = self.tree.first().ok()??;
        let oldest = seq_of(&k).ok()?;
        self.forget_appended_through(oldest.saturating_sub(1));
        let runs = self.state.appended_at.lock().unwrap_or_else(|p| p.into_inner());
        let at = runs.iter().find(|(last, _)| *last >= oldest).map_or(now_ms, |(_, at)| *at);
        Some((now_ms - at).max(0))
    }

    /// Records an append through `last_seq` at `now_ms` (joining the newest run if it began within a second).
    fn note_appended(&self, last_seq: u64, now_ms: i64) {
        let mut runs = self.state.appended_at.lock().unwrap_or_else(|p| p.into_inner());
        match runs.back_mut() {
            Some((last, at)) if now_ms - *at < 1000 => *last = last_seq.max(*last),
            _ => runs.push_back((last_seq, now_ms)),
        }
    }

    /// Drops the append times of runs that are wholly removed (everything through `seq`).
    fn forget_appended_through(&self, seq: u64) {
        let mut runs = self.state.appended_at.lock().unwrap_or_else(|p| p.into_inner());
        while runs.front().is_some_and(|(last, _)| *last <= seq) {
            runs.pop_front();
        }
    }
}

/// Opens the sled database. sled's background writers may hold the directory's lock for a moment after the
/// last handle of a previous open is dropped (a restart in the same process, tests), so a lock conflict is
/// retried for up to two seconds.
fn open_retrying_lock(path: &Path) -> Result<sled::Db, sled::Error> {
    let mut attempts = 0;
    loop {
        match sled::Config::new().path(path).open() {
            Err(sled::Error::Io(e)) if attempts < 100 && e.to_string().contains("could not acquire lock") => {
                attempts += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// Creates `path` (and missing parents) with mode 0700; an existing sled directory that others may read is
/// narrowed to 0700 (a warning if it cannot be). Other existing directories are left as they are (the agent did not create them), with a
/// warning if others may read them.
pub fn private_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if !path.exists() {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(path)?;
        // The umask may have narrowed the mode further, never widened it; set it exactly anyway.
        return std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700));
    }
    let mode = std::fs::metadata(path)?.permissions().mode();
    if mode & 0o077 != 0 {
        if path.join("conf").is_file() {
            match std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)) {
                Ok(()) => {
                    tracing::info!(path = %path.display(), was = format!("{:o}", mode & 0o777), "spool directory narrowed to 0700")
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "spool directory is readable by other users and cannot be narrowed")
                }
            }
        } else {
            tracing::warn!(path = %path.display(), mode = format!("{:o}", mode & 0o777), "spool directory is readable by other users");
        }
    }
    Ok(())
}

fn seq_of(k: &[u8]) -> Result<u64, SpoolError> {
    let arr: [u8; 8] = k.get(..8).and_then(|s| s.try_into().ok()).ok_or(SpoolError::Corrupt(0))?;
    Ok(u64::from_be_bytes(arr))
}

/// The client an entry was appended for (the key's bytes after the sequence number), if any.
fn client_of(k: &[u8]) -> Option<String> {
    k.get(8..).filter(|c| !c.is_empty()).map(|c| String::from_utf8_lossy(c).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(i: u32) -> pb::LifecycleEvent {
        pb::LifecycleEvent { event_id: format!("e{i}"), job_id: "j".into(), source: "t".into(), ..Default::default() }
    }

    /// Random sequences of appends, acknowledgements by two collectors (in any order, repeated, stale) and
    /// reopens, against a model: an event stays until both collectors acknowledged it, each collector sees
    /// exactly the events after its own cursor, and cursors survive reopening.
    #[test]
    fn two_collectors_each_get_every_event_and_an_event_leaves_only_when_both_have_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n.max(1)
        };
        let dests = ["http://a:1", "http://b:1"];
        let mut s = Spool::open(dir.path(), SpoolLimits::default()).expect("open");
        let mut model_acked = [0u64; 2];
        let mut appended = 0u64;
        for d in dests {
            assert_eq!(s.register(d).expect("register"), 0);
        }
        for step in 0..600 {
            match next(10) {
                0..=3 => {
                    let n = next(5) + 1;
                    let evs: Vec<_> = (0..n).map(|i| ev((appended + i + 1) as u32)).collect();
                    s.append(&evs).expect("append");
                    appended += n;
                }
                4..=7 => {
                    let d = next(2) as usize;
                    // A collector acknowledges up to what it was sent: somewhere after its cursor.
                    let seen = s.after(model_acked[d], next(12) as usize + 1).expect("after");
                    if let Some((seq, _)) = seen.last() {
                        s.ack(dests[d], *seq, None).expect("ack");
                        model_acked[d] = *seq;
                    }
                }
                8 => {
                    drop(s);
                    s = Spool::open(dir.path(), SpoolLimits::default()).expect("reopen");
                    for (d, name) in dests.iter().enumerate() {
                        assert_eq!(s.register(name).expect("register"), model_acked[d], "cursor lost at step {step}");
                    }
                }
                _ => {}
            }
            let low = model_acked.iter().copied().min().unwrap_or(0);
            let held: Vec<u64> = s.oldest(100_000).expect("oldest").into_iter().map(|(q, _)| q).collect();
            let want: Vec<u64> = (low + 1..=appended).collect();
            assert_eq!(held, want, "step {step}: held events");
            assert_eq!(s.len(), want.len() as u64, "step {step}: count");
            for (d, acked) in model_acked.iter().enumerate() {
                let pending: Vec<u64> = s.after(*acked, 100_000).expect("after").into_iter().map(|(q, _)| q).collect();
                assert_eq!(pending, (acked + 1..=appended).collect::<Vec<_>>(), "step {step}: pending for {d}");
            }
        }
    }

    #[test]
    fn after_everything_was_delivered_a_reopened_spool_numbers_new_events_after_every_cursor() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let s = Spool::open(dir.path(), SpoolLimits::default()).expect("open");
            s.register("a").expect("a");
            s.append(&[ev(1), ev(2)]).expect("append");
            s.ack("a", 2, None).expect("ack");
            assert!(s.is_empty());
        }
        let s = Spool::open(dir.path(), SpoolLimits::default()).expect("reopen");
        let cursor = s.register("a").expect("a");
        assert_eq!(cursor, 2);
        s.append(&[ev(3)]).expect("append");
        let next: Vec<String> = s.after(cursor, 10).expect("after").into_iter().map(|(_, e)| e.event_id).collect();
        assert_eq!(next, ["e3"], "a new event after a full delivery and a restart reaches the collector");
    }

    #[test]
    fn a_collector_silent_past_the_give_up_time_stops_holding_events() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = Spool::open(dir.path(), SpoolLimits::default()).expect("open");
        s.register("a").expect("a");
        s.register("b").expect("b");
        s.append(&[ev(1), ev(2), ev(3)]).expect("append");
        // Long enough that the steps above fit in it on a loaded machine (with 200 ms a busy CI host took longer
        // between `register("b")` and this ack, and b was already past its give-up time).
        let give_up = Some(std::time::Duration::from_millis(1500));
        s.ack("a", 2, give_up).expect("ack");
        assert_eq!(s.len(), 3, "b has acknowledged nothing yet and is within its give-up time");
        std::thread::sleep(std::time::Duration::from_millis(1600));
        s.ack("a", 3, give_up).expect("ack");
        assert_eq!(s.len(), 0, "b is silent past the give-up time: a's acknowledgements remove events");
        // b comes back: it gets what is left after its cursor (nothing of the removed events), and new events.
        s.append(&[ev(4)]).expect("append");
        let for_b: Vec<String> = s.after(0, 10).expect("after").into_iter().map(|(_, e)| e.event_id).collect();
        assert_eq!(for_b, ["e4"]);
        // With both silent, nothing is removed.
        std::thread::sleep(std::time::Duration::from_millis(1600));
        s.append(&[ev(5)]).expect("append");
        s.ack("a", 3, give_up).expect("stale ack");
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn appended_events_survive_reopen_in_order_and_removal_is_durable() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let s = Spool::open(dir.path(), SpoolLimits::default()).expect("open");
            s.append(&[ev(1), ev(2), ev(3)]).expect("append");
            let first = s.oldest(2).expect("oldest");
            s.remove_through(first[1].0).expect("remove");
        }
        let s = Spool::open(dir.path(), SpoolLimits::default()).expect("reopen");
        let rest: Vec<String> = s.oldest(10).expect("oldest").into_iter().map(|(_, e)| e.event_id).collect();
        assert_eq!(rest, ["e3"]);
        assert_eq!(s.len(), 1);
        s.append(&[ev(4)]).expect("append");
        let ids: Vec<String> = s.oldest(10).expect("oldest").into_iter().map(|(_, e)| e.event_id).collect();
        assert_eq!(ids, ["e3", "e4"], "sequence continues after reopen");
    }

    #[test]
    fn a_full_spool_refuses_new_events_and_keeps_the_old_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = Spool::open(dir.path(), SpoolLimits { max_events: 2, max_bytes: 1 << 20 }).expect("open");
        s.append(&[ev(1), ev(2)]).expect("fits");
        assert!(matches!(s.append(&[ev(3)]), Err(SpoolError::Full { events: 2, .. })));
        assert_eq!(s.refused(), 1);
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn client_quotas_count_per_client_release_on_delivery_and_survive_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let quota = ClientQuota { max_events: 2, max_bytes: 1 << 20 };
        {
            let s = Spool::open(dir.path(), SpoolLimits { max_events: 10, max_bytes: 1 << 20 }).expect("open");
            s.append_for(&[ev(1), ev(2)], Some(("uid:1000", quota))).expect("within quota");
            assert!(matches!(
                s.append_for(&[ev(3)], Some(("uid:1000", quota))),
                Err(SpoolError::Quota { events: 2, max_events: 2, .. })
            ));
            s.append_for(&[ev(4)], Some(("uid:1001", quota))).expect("another client has its own quota");
            s.append(&[ev(5)]).expect("no client, no quota");
            assert_eq!(s.held_by("uid:1000").events, 2);
            assert_eq!(s.len(), 4);
        }
        let s = Spool::open(dir.path(), SpoolLimits { max_events: 10, max_bytes: 1 << 20 }).expect("reopen");
        assert_eq!((s.held_by("uid:1000").events, s.held_by("uid:1001").events), (2, 1), "recounted on open");
        let ids: Vec<String> = s.oldest(10).expect("oldest").into_iter().map(|(_, e)| e.event_id).collect();
        assert_eq!(ids, ["e1", "e2", "e4", "e5"], "order is the sequence, whatever the client");
        let first = s.oldest(1).expect("oldest")[0].0;
        s.remove_through(first).expect("deliver one");
        assert_eq!(s.held_by("uid:1000").events, 1, "delivery releases quota");
        s.append_for(&[ev(6)], Some(("uid:1000", quota))).expect("room again");
        let last = s.oldest(10).expect("oldest").last().expect("some").0;
        s.remove_through(last).expect("deliver all");
        assert_eq!((s.len(), s.held_by("uid:1000"), s.held_by("uid:1001")), (0, Held::default(), Held::default()));
    }

    #[test]
    fn the_spool_directory_and_the_parents_it_creates_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777;
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let path = dir.path().join("data").join("spool");
        drop(Spool::open(&path, SpoolLimits::default()).expect("open"));
        assert_eq!(mode(&path), 0o700, "spool directory");
        assert_eq!(mode(&dir.path().join("data")), 0o700, "parent the agent created");
        assert_eq!(mode(dir.path()), 0o755, "an existing parent is not the agent's to change");

        // A spool left world-readable by an older agent is narrowed when opened.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let s = Spool::open(&path, SpoolLimits::default()).expect("reopen");
        assert_eq!(mode(&path), 0o700, "existing spool narrowed");
        s.append(&[ev(1)]).expect("append");
    }
}
