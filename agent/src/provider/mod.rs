//! Provider adapters: each is a pure `parse + diff -> events` core over the provider's documented payloads and
//! a thin polling shell. Every transition has a deterministic event id (`<provider>:<cluster>:<job>:<key>`), and
//! each job's memory (what was already emitted) is persisted beside the spool, so an adapter restart neither
//! re-emits nor misses a transition; and should memory be lost, re-emitted events are duplicates at the
//! collector, not new events. Adapters write to the same durable spool as the node agent, so the uplink does
//! not change when an adapter is added (Kubernetes/Kueue and Azure ML slot in as new modules here).

pub mod aws_credentials;
pub mod azureml;
pub mod google_credentials;
pub mod gpus;
pub mod kueue;
pub mod retry;
pub mod sagemaker;
pub mod sigv4;
pub mod slurm;
pub mod vertex;

use crate::metrics::{Metrics, PollErrorKind, Provider};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Provider free text (status messages, failure reasons, scheduler reasons) made acceptable to the collector's
/// validation: control characters (a stack trace's newlines and tabs) become spaces and the text is cut to
/// `max_bytes` at a character boundary. Without this a failure message with a newline got the job's `done`
/// rejected (found by `startline-fuzz`).
pub fn free_text(s: &str, max_bytes: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max_bytes));
    for c in s.chars().map(|c| if c.is_control() { ' ' } else { c }) {
        if out.len() + c.len_utf8() > max_bytes {
            break;
        }
        out.push(c);
    }
    out
}

/// A provider attribute (a team or project from a tag) made acceptable as an id-like attribute: white space
/// (control or not: tabs, newlines, no-break and other non-ASCII spaces) becomes an ASCII space, every other
/// character the collector's id rule refuses (`startline_proto::validate::invisible_in_id`: format, private-use,
/// default-ignorable, blank...) is left out, and the text is cut to `max_bytes` at a character boundary.
pub fn attribute(s: &str, max_bytes: usize) -> String {
    let visible: String = s
        .chars()
        .filter_map(|c| match c {
            c if c.is_whitespace() => Some(' '),
            c if startline_proto::validate::invisible_in_id(c).is_some() => None,
            c => Some(c),
        })
        .collect();
    free_text(visible.trim(), max_bytes)
}

/// A provider's tag or label key as a Startline label key (1-64 bytes of `[a-z0-9_.-]`, the collector's rule):
/// ASCII letters are lowercased, any other character outside the set becomes `_`, and the key is cut to 64
/// bytes. None for a key with no letter or digit left (nothing recognisable to show).
pub fn label_key(k: &str) -> Option<String> {
    let mut out = String::with_capacity(k.len().min(64));
    for c in k.chars() {
        if out.len() == 64 {
            break;
        }
        let c = c.to_ascii_lowercase();
        out.push(if c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '.' | '-') { c } else { '_' });
    }
    out.bytes().any(|b| b.is_ascii_alphanumeric()).then_some(out)
}

/// Provider tags or labels as Startline labels, at most `room` of them: keys through [`label_key`], values
/// through [`free_text`] (256 bytes), in the tags' order; a tag whose key maps to nothing, to a key already
/// taken (`Team` after `team`), or beyond `room` is dropped. Returns the labels and how many tags were dropped.
/// An adapter never loses a job to the collector's label rules: every key it sends is valid.
pub fn provider_labels<'a>(
    tags: impl IntoIterator<Item = (&'a str, &'a str)>,
    room: usize,
) -> (std::collections::HashMap<String, String>, usize) {
    let mut labels = std::collections::HashMap::new();
    let mut dropped = 0;
    for (k, v) in tags {
        match label_key(k) {
            Some(key) if labels.len() < room && !labels.contains_key(&key) => {
                labels.insert(key, free_text(v, 256));
            }
            _ => dropped += 1,
        }
    }
    (labels, dropped)
}

/// The label that counts provider tags left out of a job's labels ([`provider_labels`]).
pub const TAGS_DROPPED_LABEL: &str = "tags_dropped";

/// The `first_step` an adapter sends when it sees the training container start (SageMaker's `Training`, Vertex
/// AI's `startTime`, Azure ML's `Running`, a Kueue workload's pods ready): step 0, origin `container_start`. It is
/// the adapter's nearest signal, not the training loop's first step; a first step the training process reports
/// for the same run supersedes it at the collector, which then counts the time between as preparing.
pub fn container_start() -> startline_proto::pb::lifecycle_event::Kind {
    use startline_proto::pb;
    pb::lifecycle_event::Kind::FirstStep(pb::FirstStep { step: 0, origin: pb::StepOrigin::ContainerStart as i32 })
}

/// When a credential or token with `lifetime` left is fetched again: shortly before it expires, a fifth of its
/// life early and at most 5 minutes early (a 1-hour token after 55 minutes, a 5-minute one after 4). Every cloud
/// adapter's credentials follow it (AWS credentials, Google access tokens, Microsoft Entra tokens).
pub fn renew_after(lifetime: std::time::Duration) -> std::time::Duration {
    lifetime.saturating_sub((lifetime / 5).min(std::time::Duration::from_secs(300)))
}

/// A failed poll: its kind (the `kind` label of `startline_agent_poll_errors_total`) and what is logged.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct PollError {
    /// What failed.
    pub kind: PollErrorKind,
    /// Why, for the log.
    pub message: String,
}

impl PollError {
    /// A failure of `kind`.
    pub fn new(kind: PollErrorKind, message: impl Into<String>) -> Self {
        PollError { kind, message: message.into() }
    }

    /// The provider answered HTTP `status` with `body`: throttled on 429 or an AWS throttling error, else
    /// `http_status`.
    pub fn http(provider: &str, status: u16, body: &str) -> Self {
        let throttled = status == 429 || body.contains("ThrottlingException") || body.contains("RESOURCE_EXHAUSTED");
        let kind = if throttled { PollErrorKind::Throttled } else { PollErrorKind::HttpStatus };
        PollError::new(kind, format!("{provider} answered {status}: {}", body.chars().take(500).collect::<String>()))
    }
}

/// What a successful poll did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PollReport {
    /// Jobs the poll followed (listed by the provider and diffed).
    pub jobs: usize,
    /// The events it spooled.
    pub events: Vec<startline_proto::pb::LifecycleEvent>,
}

/// Runs `poll` every `interval` until `stop`, logging what each poll spooled or why it failed (a failed poll is
/// retried at the next interval; nothing is lost, since memories only move after events are spooled), and
/// counting each in `metrics` as `provider`.
pub async fn poll_loop<F, Fut>(
    provider: Provider,
    metrics: Metrics,
    interval: std::time::Duration,
    stop: tokio_util::sync::CancellationToken,
    mut poll: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<PollReport, PollError>>,
{
    let adapter = provider.label();
    metrics.register_provider(provider);
    loop {
        let started = tokio::time::Instant::now();
        match poll().await {
            Ok(report) => {
                metrics.poll_succeeded(
                    provider,
                    started.elapsed(),
                    report.jobs,
                    &report.events,
                    std::time::SystemTime::now(),
                );
                if !report.events.is_empty() {
                    tracing::info!(adapter, events = report.events.len(), "transitions spooled");
                }
            }
            Err(e) => {
                metrics.poll_failed(provider, started.elapsed(), e.kind);
                tracing::warn!(adapter, kind = e.kind.label(), error = %e, "poll failed; retrying next interval");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// Spools one job's new events, then saves its memory (in that order: a crash in between re-emits the same
/// ids, which the collector treats as duplicates). The job and its events are added to `report`.
pub fn record(
    spool: &crate::spool::Spool,
    memory: &MemoryStore,
    key: &str,
    old: &JobMemory,
    events: Vec<startline_proto::pb::LifecycleEvent>,
    new: &JobMemory,
    report: &mut PollReport,
) -> Result<(), PollError> {
    if !events.is_empty() {
        spool.append(&events).map_err(|e| PollError::new(PollErrorKind::Spool, e.to_string()))?;
    }
    if new != old {
        memory.put(key, new).map_err(|e| PollError::new(PollErrorKind::Spool, e.to_string()))?;
    }
    report.jobs += 1;
    report.events.extend(events);
    Ok(())
}

/// Appends `kind` as the job's transition `key` unless `mem` records it as emitted already: the event id is
/// `<job>:<key>`, so the same transition seen again (or after a restart) gets the same id.
pub fn emit_once(
    out: &mut Vec<startline_proto::pb::LifecycleEvent>,
    mem: &mut JobMemory,
    job: &str,
    source: &str,
    key: &str,
    at_ms: i64,
    kind: startline_proto::pb::lifecycle_event::Kind,
) {
    if mem.emitted.insert(key.to_string()) {
        out.push(startline_proto::pb::LifecycleEvent {
            event_id: format!("{job}:{key}"),
            job_id: job.to_string(),
            attempt: None,
            source: source.to_string(),
            occurred_at: Some(startline_proto::time::ms_to_timestamp(at_ms)),
            kind: Some(kind),
        });
    }
}

/// Flushes the adapter's memory at the end of a poll.
pub fn flush(memory: &MemoryStore) -> Result<(), PollError> {
    memory.flush().map_err(|e| PollError::new(PollErrorKind::Spool, e.to_string()))
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
    /// When the current wait reason was dated, Unix ms (Slurm: a later reason may be dated at eligible_time,
    /// never before this).
    #[serde(default)]
    pub reason_at_ms: i64,
    /// The scheduler's estimated start last reported, Unix ms.
    #[serde(default)]
    pub estimated_start_ms: Option<i64>,
    /// SageMaker: whether the current `Starting` transition's message said capacity when last seen.
    #[serde(default)]
    pub starting_capacity: Option<bool>,
    /// SageMaker: waits split inside `Starting` transitions (numbers their events).
    #[serde(default)]
    pub starting_splits: u32,
    /// The queue position last reported (Kueue).
    #[serde(default)]
    pub queue_position: Option<u64>,
    /// The attributes the last `submitted` carried that can be learned after the submit (Kueue: the pool and
    /// the GPU class, `\u{1f}`-separated): a `submitted` is sent again when they become better known.
    #[serde(default)]
    pub attributes: Option<String>,
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

    /// A named poll cursor (Unix ms), e.g. the start of the last successful poll; None before the first. Kept as
    /// adapter state (`@cursor/<name>`).
    pub fn cursor(&self, name: &str) -> Option<i64> {
        self.get_state(&format!("@cursor/{name}"))
    }

    /// Moves a named cursor (flushed with the memories by `flush`).
    pub fn set_cursor(&self, name: &str, ms: i64) -> Result<(), sled::Error> {
        self.put_state(&format!("@cursor/{name}"), &ms)
    }

    /// Every job memory stored, with its key (unreadable entries and adapter state keys left out).
    pub fn entries(&self) -> Vec<(String, JobMemory)> {
        self.tree
            .iter()
            .filter_map(Result::ok)
            .filter_map(|(k, v)| {
                let key = String::from_utf8(k.to_vec()).ok().filter(|k| !k.starts_with('@'))?;
                Some((key, serde_json::from_slice(&v).ok()?))
            })
            .collect()
    }

    /// An adapter's own state stored under `key` (keys starting with `@` are never job ids), if readable.
    pub fn get_state<T: serde::de::DeserializeOwned>(&self, key: &str) -> Option<T> {
        self.tree.get(key.as_bytes()).ok().flatten().and_then(|v| serde_json::from_slice(&v).ok())
    }

    /// Saves an adapter's own state under `key` (flushed by `flush`).
    pub fn put_state<T: Serialize>(&self, key: &str, state: &T) -> Result<(), sled::Error> {
        let v = serde_json::to_vec(state).unwrap_or_default();
        self.tree.insert(key.as_bytes(), v)?;
        Ok(())
    }

    /// Flushes to disk.
    pub fn flush(&self) -> Result<(), sled::Error> {
        self.tree.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod free_text_tests {
    use super::free_text;

    #[test]
    fn control_characters_become_spaces_and_the_cut_respects_bytes_and_characters() {
        assert_eq!(
            free_text("CapacityError:\nno capacity\tin us-east-1", 1024),
            "CapacityError: no capacity in us-east-1"
        );
        // 3-byte characters: 1024 bytes hold 341 of them, never half of one.
        let t = free_text(&"€".repeat(1000), 1024);
        assert_eq!(t.len(), 1023);
        assert!(t.chars().all(|c| c == '€'));
    }
}

#[cfg(test)]
mod poll_error_tests {
    use super::{PollError, PollErrorKind};

    #[test]
    fn http_answers_are_throttled_or_http_status() {
        assert_eq!(PollError::http("vertex", 429, "").kind, PollErrorKind::Throttled);
        let aws = r#"{"__type":"ThrottlingException","message":"Rate exceeded"}"#;
        assert_eq!(PollError::http("sagemaker", 400, aws).kind, PollErrorKind::Throttled);
        let aws = r#"{"__type":"ValidationException","message":"bad"}"#;
        assert_eq!(PollError::http("sagemaker", 400, aws).kind, PollErrorKind::HttpStatus);
        assert_eq!(PollError::http("vertex", 503, "unavailable").kind, PollErrorKind::HttpStatus);
        assert!(PollError::http("vertex", 503, &"x".repeat(2000)).message.len() < 600, "the body is cut");
    }
}

#[cfg(test)]
mod label_tests {
    use super::{attribute, label_key, provider_labels};

    fn valid_key(k: &str) -> bool {
        !k.is_empty()
            && k.len() <= 64
            && k.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-'))
    }

    #[test]
    fn provider_keys_become_valid_label_keys_or_are_dropped_with_a_count() {
        assert_eq!(label_key("_aml_system_ComputeTargetStatus").as_deref(), Some("_aml_system_computetargetstatus"));
        assert_eq!(label_key("Cost Center/ID").as_deref(), Some("cost_center_id"));
        assert_eq!(label_key("mlflow.source.git.repoURL").as_deref(), Some("mlflow.source.git.repourl"));
        assert_eq!(label_key("équipe").as_deref(), Some("_quipe"));
        assert_eq!(label_key("日本"), None, "nothing recognisable left");
        assert_eq!(label_key(""), None);
        assert_eq!(label_key(&"K".repeat(300)).map(|k| k.len()), Some(64));
        let tags = [("Team", "a"), ("team", "b"), ("日本", "c"), ("x", "d\ne"), ("y", "1"), ("z", "2")];
        let (labels, dropped) = provider_labels(tags.iter().map(|(k, v)| (*k, *v)), 3);
        assert_eq!(labels.len(), 3);
        assert_eq!(labels.get("team").map(String::as_str), Some("a"), "the first of two keys that map alike");
        assert_eq!(labels.get("x").map(String::as_str), Some("d e"));
        assert_eq!(dropped, 3, "a collision, an unmappable key and one over the room");
        assert!(labels.keys().all(|k| valid_key(k)));
        assert_eq!(attribute("  nlp\u{200B}-team\n", 64), "nlp-team");
        assert_eq!(attribute("ml\u{00A0}team\u{3164}\u{FE0F}\u{2800}", 64), "ml team");
        assert_eq!(attribute("a\u{0}b\u{E000}c", 64), "abc");
        assert_eq!(attribute(&"é".repeat(100), 64).len(), 64);
    }

    proptest::proptest! {
        #[test]
        fn every_mapped_key_passes_the_collectors_rule(tags in proptest::collection::btree_map(".{0,80}", ".{0,300}", 0..40)) {
            let (labels, dropped) = provider_labels(tags.iter().map(|(k, v)| (k.as_str(), v.as_str())), 13);
            proptest::prop_assert!(labels.len() <= 13);
            proptest::prop_assert_eq!(labels.len() + dropped, tags.len());
            for (k, v) in &labels {
                proptest::prop_assert!(valid_key(k), "{:?}", k);
                proptest::prop_assert!(v.len() <= 256 && !v.chars().any(char::is_control));
            }
        }
    }
}
