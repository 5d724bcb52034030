//! Provider adapters: each is a pure `parse + diff -> events` core over the provider's documented payloads and
//! a thin polling shell. Every transition has a deterministic event id (`<provider>:<cluster>:<job>:<key>`), and
//! each job's memory (what was already emitted) is persisted beside the spool, so an adapter restart neither
//! re-emits nor misses a transition; and should memory be lost, re-emitted events are duplicates at the
//! collector, not new events. Adapters write to the same durable spool as the node agent, so the uplink does
//! not change when an adapter is added (Kubernetes/Kueue and Azure ML slot in as new modules here).

pub mod sagemaker;
pub mod sigv4;
pub mod slurm;
pub mod vertex;

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Runs `poll` every `interval` until `stop`, logging what each poll spooled or why it failed (a failed poll is
/// retried at the next interval; nothing is lost, since memories only move after events are spooled).
pub async fn poll_loop<F, Fut>(
    adapter: &str,
    interval: std::time::Duration,
    stop: crate::simulate::tokio_util_free::Stop,
    mut poll: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<usize, String>>,
{
    loop {
        match poll().await {
            Ok(n) if n > 0 => tracing::info!(adapter, events = n, "transitions spooled"),
            Ok(_) => {}
            Err(e) => tracing::warn!(adapter, error = %e, "poll failed; retrying next interval"),
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.wait() => return,
        }
    }
}

/// Spools one job's new events, then saves its memory (in that order: a crash in between re-emits the same
/// ids, which the collector treats as duplicates). Returns the events spooled.
pub fn record(
    spool: &crate::spool::Spool,
    memory: &MemoryStore,
    key: &str,
    old: &JobMemory,
    events: &[startline_proto::pb::LifecycleEvent],
    new: &JobMemory,
) -> Result<usize, String> {
    if !events.is_empty() {
        spool.append(events).map_err(|e| e.to_string())?;
    }
    if new != old {
        memory.put(key, new).map_err(|e| e.to_string())?;
    }
    Ok(events.len())
}

/// What an adapter remembers about one job between polls (and across restarts).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobMemory {
    /// Transition keys already emitted.
    pub emitted: BTreeSet<String>,
    /// The last wait reason seen (raw provider text).
    pub reason: String,
    /// How many distinct wait reasons were emitted (numbers the queued transitions).
    pub reasons_seen: u32,
    /// Requeues seen.
    pub restarts: u32,
    /// The exit code seen while the job was still listed by the live view (Slurm's accounting may lose it).
    pub exit_code: Option<i32>,
    /// The job reached a terminal state and was reported done; it can be forgotten after a while.
    pub done: bool,
}

/// Persisted job memories, in a sled tree of the spool's database.
#[derive(Clone)]
pub struct MemoryStore {
    tree: sled::Tree,
}

impl MemoryStore {
    /// Opens the memory tree for `adapter` in the spool's database.
    pub fn open(spool: &crate::spool::Spool, adapter: &str) -> Result<MemoryStore, sled::Error> {
        Ok(MemoryStore { tree: spool.open_tree(&format!("adapter-{adapter}"))? })
    }

    /// The memory of a job (empty if unknown or unreadable).
    pub fn get(&self, key: &str) -> JobMemory {
        self.tree.get(key.as_bytes()).ok().flatten().and_then(|v| serde_json::from_slice(&v).ok()).unwrap_or_default()
    }

    /// Saves a job's memory (flushed by the next spool append or by `flush`).
    pub fn put(&self, key: &str, m: &JobMemory) -> Result<(), sled::Error> {
        let v = serde_json::to_vec(m).unwrap_or_default();
        self.tree.insert(key.as_bytes(), v)?;
        Ok(())
    }

    /// Flushes to disk.
    pub fn flush(&self) -> Result<(), sled::Error> {
        self.tree.flush()?;
        Ok(())
    }
}
