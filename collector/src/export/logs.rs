//! Accepted lifecycle events, and each job's summary when it ends, as OpenTelemetry log records pushed over
//! OTLP/gRPC (`[logs]`), so a team can route them through its OpenTelemetry Collector into the warehouse it runs.
//!
//! The records come from the accepted-event feed ([`crate::feed`]): only events acknowledged as durable, each once
//! (duplicates never reach the feed). The exporter is one task with a queue bounded in events
//! (`logs.queue_events`): when the receiver is slow or down, group commits beyond it are dropped and counted
//! (`startline_collector_otlp_log_records_total{result="dropped"}`), never slowing ingest; a batch the receiver refuses is retried three times with backoff, then
//! counted as `failed`. The events themselves stay in the store either way.
//!
//! Record shape (docs/METRICS.md, "Lifecycle events as OTLP logs"): `event_name` `startline.job.<kind>` or
//! `startline.job.summary`, `time_unix_nano` the event's `occurred_at` (a summary: its job's end), observed time
//! the commit, severity INFO (WARN for preemptions, node losses and jobs that failed or ended before starting),
//! a one-line body, and `startline.*` attributes. The SDK's log pipeline is not used: its batch processor drops
//! silently when full, and this path must count what it drops.

use super::{otlp_client_settings, otlp_tls_config, OtlpClientFiles};
use crate::alert::client::{ClientTlsFiles, Secret};
use crate::feed::{Feed, Group};
use crate::job::{JobAttrs, Timeline};
use crate::settings::{duration, range};
use crate::time::format_ms;
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_client::LogsServiceClient;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, ArrayValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::resource::v1::Resource;
use serde::{Deserialize, Serialize};
use startline_proto::labels::Label;
use startline_proto::pb::{self, lifecycle_event::Kind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Severity numbers of the OpenTelemetry log data model.
const INFO: i32 = 9;
const WARN: i32 = 13;

/// `[logs]`: lifecycle events as OTLP logs.
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LogsSection {
    /// OTLP/gRPC endpoint, e.g. `http://127.0.0.1:4317`. Unset: no log export.
    pub otlp_endpoint: Option<String>,
    /// One record per accepted event. Default true.
    pub events: Option<bool>,
    /// One record per job when it ends (`done` accepted), with its waits, time to first step and lost work.
    /// Default true.
    pub summaries: Option<bool>,
    /// Accepted events held for the exporter; beyond it whole group commits are dropped and counted. Default
    /// 100000 (about 20-40 MB).
    pub queue_events: Option<usize>,
    /// Most records per export request. Default 1000.
    pub batch_records: Option<usize>,
    /// Longest a record waits for its batch to fill. Default 1s.
    pub flush_interval: Option<String>,
    /// PEM CA bundle trusted for an `https://` endpoint instead of the built-in (webpki) roots.
    pub otlp_ca_file: Option<PathBuf>,
    /// PEM client certificate (mTLS); needs `otlp_client_key_file`.
    pub otlp_client_cert_file: Option<PathBuf>,
    /// PEM private key of `otlp_client_cert_file`.
    pub otlp_client_key_file: Option<PathBuf>,
    /// File holding a bearer token sent as `authorization: Bearer <token>`.
    pub otlp_bearer_token_file: Option<PathBuf>,
    /// gRPC metadata sent with every export; values are never logged.
    #[serde(default)]
    pub otlp_headers: std::collections::BTreeMap<String, String>,
}

/// Validated `[logs]`.
#[derive(Debug, Clone)]
pub struct LogsSettings {
    /// The receiver.
    pub endpoint: String,
    /// Export each accepted event.
    pub events: bool,
    /// Export each ended job's summary.
    pub summaries: bool,
    /// Queue capacity, in events.
    pub queue_events: usize,
    /// Records per request.
    pub batch_records: usize,
    /// Batch wait.
    pub flush_interval: Duration,
    /// TLS files.
    pub tls: ClientTlsFiles,
    /// gRPC metadata.
    pub headers: Vec<(String, Secret)>,
}

impl LogsSection {
    /// Checks the section; `None` when no endpoint is set.
    pub fn validate(&self, errs: &mut Vec<String>) -> Option<LogsSettings> {
        let flush_interval = duration(
            errs,
            "logs.flush_interval",
            &self.flush_interval,
            Duration::from_secs(1),
            Duration::from_millis(10),
        );
        let queue_events = range(errs, "logs.queue_events", self.queue_events, 100_000, 1, 10_000_000);
        let batch_records = range(errs, "logs.batch_records", self.batch_records, 1000, 1, 100_000);
        if let Some(e) = &self.otlp_endpoint {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                errs.push(format!("logs.otlp_endpoint: {e:?} must start with http:// or https://"));
            }
        }
        let (tls, headers) = otlp_client_settings(
            errs,
            "logs",
            self.otlp_endpoint.as_deref(),
            OtlpClientFiles {
                ca_file: self.otlp_ca_file.as_deref(),
                client_cert_file: self.otlp_client_cert_file.as_deref(),
                client_key_file: self.otlp_client_key_file.as_deref(),
                bearer_token_file: self.otlp_bearer_token_file.as_deref(),
                headers: &self.otlp_headers,
            },
        );
        let (events, summaries) = (self.events.unwrap_or(true), self.summaries.unwrap_or(true));
        if self.otlp_endpoint.is_some() && !events && !summaries {
            errs.push("logs: events and summaries are both false; unset logs.otlp_endpoint instead".to_string());
        }
        self.otlp_endpoint.clone().map(|endpoint| LogsSettings {
            endpoint,
            events,
            summaries,
            queue_events,
            batch_records,
            flush_interval,
            tls,
            headers,
        })
    }
}

/// What the exporter did, for `/metrics`.
#[derive(Debug, Default)]
pub struct LogStats {
    /// Records the receiver accepted.
    pub exported: AtomicU64,
    /// Records given up after retries.
    pub failed: AtomicU64,
    /// Events dropped because the queue was full (shared with the feed subscription).
    pub dropped: Arc<AtomicU64>,
}

fn kv(key: &str, v: any_value::Value) -> KeyValue {
    KeyValue { key: key.to_string(), value: Some(AnyValue { value: Some(v) }), ..Default::default() }
}

fn s(v: impl Into<String>) -> any_value::Value {
    any_value::Value::StringValue(v.into())
}

fn i(v: i64) -> any_value::Value {
    any_value::Value::IntValue(v)
}

fn f(v: f64) -> any_value::Value {
    any_value::Value::DoubleValue(v)
}

fn strings(v: &[String]) -> any_value::Value {
    any_value::Value::ArrayValue(ArrayValue {
        values: v.iter().map(|x| AnyValue { value: Some(s(x.clone())) }).collect(),
    })
}

fn nanos(ms: i64) -> u64 {
    u64::try_from(ms).unwrap_or(0).saturating_mul(1_000_000)
}

/// The job's attributes (from its `submitted`), on every record of the job.
fn attr_kvs(out: &mut Vec<KeyValue>, a: &JobAttrs) {
    out.push(kv("startline.pool.kind", s(a.pool_kind.label())));
    out.push(kv("startline.provider", s(a.provider.clone())));
    out.push(kv("startline.pool", s(a.pool.clone())));
    out.push(kv("startline.priority", s(a.priority.label())));
    out.push(kv("startline.gpu.class", s(a.gpu_class.clone())));
    out.push(kv("startline.gpu.count", i(i64::from(a.gpu_count))));
    out.push(kv("startline.region", s(a.region.clone())));
    for (k, v) in [
        ("startline.team", &a.team),
        ("startline.project", &a.project),
        ("startline.chain.id", &a.chain_id),
        ("startline.chain.stage", &a.chain_stage),
    ] {
        if !v.is_empty() {
            out.push(kv(k, s(v.clone())));
        }
    }
}

/// One accepted event as a record.
pub fn event_record(seq: u64, ev: &pb::LifecycleEvent, attrs: Option<&JobAttrs>, applied_at_ms: i64) -> LogRecord {
    let at = ev.occurred_at.as_ref().map_or(0, startline_proto::time::timestamp_to_ms);
    let mut a = vec![
        kv("startline.job.id", s(ev.job_id.clone())),
        kv("startline.event.id", s(ev.event_id.clone())),
        kv("startline.event.source", s(ev.source.clone())),
        kv("startline.event.seq", i(i64::try_from(seq).unwrap_or(i64::MAX))),
    ];
    if let Some(n) = ev.attempt {
        a.push(kv("startline.event.attempt", i(i64::from(n))));
    }
    if let Some(x) = attrs {
        attr_kvs(&mut a, x);
    }
    let mut severity = INFO;
    let (kind, body) = match &ev.kind {
        None => ("none", String::new()),
        Some(Kind::Submitted(x)) => {
            ("submitted", format!("submitted to {} ({}), {} x {}", x.pool, x.provider, x.gpu_count, x.gpu_class))
        }
        Some(Kind::Queued(q)) => {
            a.push(kv("startline.queued.reason", s(q.reason().label())));
            if !q.raw_reason.is_empty() {
                a.push(kv("startline.queued.raw_reason", s(q.raw_reason.clone())));
            }
            if let Some(t) = &q.estimated_start {
                a.push(kv("startline.queued.estimated_start", s(format_ms(startline_proto::time::timestamp_to_ms(t)))));
            }
            if let Some(p) = q.queue_position {
                a.push(kv("startline.queued.position", i(i64::from(p))));
            }
            let raw = if q.raw_reason.is_empty() { String::new() } else { format!(" ({})", q.raw_reason) };
            ("queued", format!("queued: {}{raw}", q.reason().label()))
        }
        Some(Kind::NodeAssigned(n)) => {
            a.push(kv("startline.nodes", strings(&n.nodes)));
            ("node_assigned", format!("nodes assigned: {}", n.nodes.join(", ")))
        }
        Some(Kind::Preparing(p)) => {
            a.push(kv("startline.preparing.phase", s(p.phase().label())));
            ("preparing", format!("preparing: {}", p.phase().label()))
        }
        Some(Kind::FirstStep(x)) => {
            a.push(kv("startline.step", i(i64::try_from(x.step).unwrap_or(i64::MAX))));
            ("first_step", format!("first training step ({})", x.step))
        }
        Some(Kind::Checkpoint(c)) => {
            a.push(kv("startline.step", i(i64::try_from(c.step).unwrap_or(i64::MAX))));
            a.push(kv("startline.checkpoint.save_seconds", f(c.save_seconds)));
            if !c.uri.is_empty() {
                a.push(kv("startline.checkpoint.uri", s(c.uri.clone())));
            }
            ("checkpoint", format!("checkpoint at step {}", c.step))
        }
        Some(Kind::Preempted(p)) => {
            severity = WARN;
            a.push(kv("startline.preempted.checkpoint_saved", any_value::Value::BoolValue(p.checkpoint_saved)));
            ("preempted", format!("preempted: {}", p.reason))
        }
        Some(Kind::Requeued(r)) => {
            a.push(kv("startline.resume_step", i(i64::try_from(r.resume_step).unwrap_or(i64::MAX))));
            ("requeued", format!("requeued, resuming from step {}", r.resume_step))
        }
        Some(Kind::Restarted(r)) => {
            a.push(kv("startline.resume_step", i(i64::try_from(r.resume_step).unwrap_or(i64::MAX))));
            ("restarted", format!("restarted, resuming from step {}", r.resume_step))
        }
        Some(Kind::NodeLost(n)) => {
            severity = WARN;
            a.push(kv("startline.nodes", strings(std::slice::from_ref(&n.node))));
            ("node_lost", format!("node {} lost: {}", n.node, n.message))
        }
        Some(Kind::Done(d)) => {
            if d.outcome() == pb::Outcome::Failed {
                severity = WARN;
            }
            a.push(kv("startline.job.outcome", s(d.outcome().label())));
            if let Some(code) = d.exit_code {
                a.push(kv("startline.job.exit_code", i(i64::from(code))));
            }
            ("done", format!("done: {}", d.outcome().label()))
        }
    };
    a.push(kv("startline.event.kind", s(kind)));
    LogRecord {
        time_unix_nano: nanos(at),
        observed_time_unix_nano: nanos(applied_at_ms),
        severity_number: severity,
        severity_text: if severity == WARN { "WARN" } else { "INFO" }.to_string(),
        body: Some(AnyValue { value: Some(s(body)) }),
        attributes: a,
        event_name: format!("startline.job.{kind}"),
        ..Default::default()
    }
}

/// An ended job's summary as a record: its outcome, time to first step, waits by segment, runs and lost work.
pub fn summary_record(job_id: &str, t: &Timeline, applied_at_ms: i64) -> LogRecord {
    let mut a = vec![kv("startline.job.id", s(job_id))];
    if let Some(x) = &t.attrs {
        attr_kvs(&mut a, x);
    }
    let outcome = t.outcome.map_or("unknown", |o| o.label());
    a.push(kv("startline.job.outcome", s(outcome)));
    if let Some(code) = t.exit_code {
        a.push(kv("startline.job.exit_code", i(i64::from(code))));
    }
    let secs = |ms: i64| ms as f64 / 1000.0;
    if let Some(x) = t.submitted_at {
        a.push(kv("startline.job.submitted_at", s(format_ms(x))));
    }
    if let Some(x) = t.first_step_at {
        a.push(kv("startline.job.first_step_at", s(format_ms(x))));
    }
    if let Some(x) = t.done_at {
        a.push(kv("startline.job.done_at", s(format_ms(x))));
    }
    if let Some(ms) = t.time_to_first_step_ms() {
        a.push(kv("startline.job.time_to_first_step_seconds", f(secs(ms))));
    }
    if let (Some(sub), Some(done)) = (t.submitted_at, t.done_at) {
        a.push(kv("startline.job.duration_seconds", f(secs(done - sub))));
    }
    for (seg, ms) in &t.initial_wait_ms {
        a.push(kv(&format!("startline.job.wait_seconds.{}", seg.label()), f(secs(*ms))));
    }
    a.push(kv("startline.job.requeue_wait_seconds", f(secs(t.requeue_wait_ms))));
    a.push(kv("startline.job.runs", i(i64::from(t.runs))));
    a.push(kv("startline.job.attempts", i(i64::from(t.attempts))));
    a.push(kv("startline.job.preemptions", i(i64::from(t.preemptions))));
    a.push(kv("startline.job.node_losses", i(i64::from(t.node_losses))));
    a.push(kv("startline.job.lost_work_seconds", f(secs(t.lost_work_ms))));
    let started = t.first_step_at.is_some();
    let bad = !started || t.outcome == Some(pb::Outcome::Failed);
    let body = match t.time_to_first_step_ms() {
        Some(ms) => format!("job {job_id} {outcome}; first step {:.1} s after submit", secs(ms)),
        None => format!("job {job_id} {outcome} before its first step"),
    };
    LogRecord {
        time_unix_nano: nanos(t.done_at.unwrap_or(applied_at_ms)),
        observed_time_unix_nano: nanos(applied_at_ms),
        severity_number: if bad { WARN } else { INFO },
        severity_text: if bad { "WARN" } else { "INFO" }.to_string(),
        body: Some(AnyValue { value: Some(s(body)) }),
        attributes: a,
        event_name: "startline.job.summary".to_string(),
        ..Default::default()
    }
}

/// The records of one group, as `[logs]` asks (an event whose stored value cannot be read is skipped and
/// logged: the store's own checks report it too).
pub fn group_records(g: &Group, settings: &LogsSettings) -> Vec<LogRecord> {
    let mut out = Vec::new();
    if settings.events {
        for e in &g.events {
            match crate::store::decode_stored_event(e.seq, &e.value) {
                Ok(ev) => out.push(event_record(e.seq, &ev, e.attrs.as_deref(), g.applied_at_ms)),
                Err(err) => tracing::error!(error = %err, seq = e.seq, "cannot read an accepted event for OTLP logs"),
            }
        }
    }
    if settings.summaries {
        for (id, t) in &g.ended {
            out.push(summary_record(id, t, g.applied_at_ms));
        }
    }
    out
}

fn request(records: Vec<LogRecord>) -> ExportLogsServiceRequest {
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", s("startline-collector")),
                    kv("service.version", s(env!("CARGO_PKG_VERSION"))),
                ],
                ..Default::default()
            }),
            scope_logs: vec![ScopeLogs {
                scope: Some(InstrumentationScope {
                    name: "startline.collector".to_string(),
                    version: env!("CARGO_PKG_VERSION").to_string(),
                    ..Default::default()
                }),
                log_records: records,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

/// Subscribes to the feed and starts the exporter task; it stops when `stop` is cancelled, after exporting what
/// it already holds (within a few seconds).
pub fn spawn(
    feed: &Feed,
    settings: LogsSettings,
    stop: CancellationToken,
) -> Result<(tokio::task::JoinHandle<()>, Arc<LogStats>), String> {
    let mut endpoint = tonic::transport::Endpoint::from_shared(settings.endpoint.clone())
        .map_err(|e| format!("logs.otlp_endpoint: {e}"))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10));
    if settings.endpoint.starts_with("https://") {
        endpoint = endpoint.tls_config(otlp_tls_config(&settings.tls)).map_err(|e| format!("logs TLS: {e}"))?;
    }
    let mut client = LogsServiceClient::new(endpoint.connect_lazy());
    let mut sub = feed.subscribe(settings.queue_events);
    let stats = Arc::new(LogStats { dropped: sub.dropped.clone(), ..Default::default() });
    let st = stats.clone();
    let task = tokio::spawn(async move {
        let mut pending: Vec<LogRecord> = Vec::new();
        let mut closing = false;
        loop {
            // Fill a batch: wait for the first group, then take what arrives within the flush interval.
            if pending.is_empty() && !closing {
                tokio::select! {
                    g = sub.recv() => match g {
                        Some(g) => pending.extend(group_records(&g, &settings)),
                        None => closing = true,
                    },
                    _ = stop.cancelled() => closing = true,
                }
            }
            let deadline = tokio::time::Instant::now() + settings.flush_interval;
            while pending.len() < settings.batch_records && !closing {
                tokio::select! {
                    g = sub.recv() => match g {
                        Some(g) => pending.extend(group_records(&g, &settings)),
                        None => closing = true,
                    },
                    _ = tokio::time::sleep_until(deadline) => break,
                    _ = stop.cancelled() => closing = true,
                }
            }
            if closing {
                while let Some(g) = sub.try_recv() {
                    pending.extend(group_records(&g, &settings));
                }
            }
            while !pending.is_empty() {
                let n = pending.len().min(settings.batch_records);
                let batch: Vec<LogRecord> = pending.drain(..n).collect();
                export(&mut client, &settings.headers, batch, &st, &stop).await;
                if !closing && pending.len() < settings.batch_records {
                    break;
                }
            }
            if closing && pending.is_empty() {
                return;
            }
        }
    });
    Ok((task, stats))
}

/// One export with up to three retries (0.5, 1, 2 s; only one quick try once stopping).
async fn export(
    client: &mut LogsServiceClient<tonic::transport::Channel>,
    headers: &[(String, Secret)],
    batch: Vec<LogRecord>,
    stats: &LogStats,
    stop: &CancellationToken,
) {
    let n = batch.len() as u64;
    let req = request(batch);
    let mut delay = Duration::from_millis(500);
    for attempt in 0..4 {
        let mut r = tonic::Request::new(req.clone());
        for (k, v) in headers {
            if let (Ok(k), Ok(v)) = (
                tonic::metadata::MetadataKey::<tonic::metadata::Ascii>::from_bytes(k.as_bytes()),
                tonic::metadata::MetadataValue::try_from(v.expose()),
            ) {
                r.metadata_mut().insert(k, v);
            }
        }
        match client.export(r).await {
            Ok(answer) => {
                let rejected = answer.into_inner().partial_success.map_or(0, |p| p.rejected_log_records.max(0) as u64);
                stats.exported.fetch_add(n.saturating_sub(rejected), Ordering::Relaxed);
                stats.failed.fetch_add(rejected, Ordering::Relaxed);
                return;
            }
            Err(e) => {
                let last = attempt == 3 || stop.is_cancelled();
                tracing::warn!(error = %e.message(), code = ?e.code(), records = n, last, "OTLP log export failed");
                if last {
                    break;
                }
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stop.cancelled() => {}
                }
                delay *= 2;
            }
        }
    }
    stats.failed.fetch_add(n, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{event_id_hash, CompactEvent, EventKind, JobRecord};
    use startline_proto::time::ms_to_timestamp;

    fn attr<'a>(r: &'a LogRecord, k: &str) -> Option<&'a any_value::Value> {
        r.attributes.iter().find(|a| a.key == k).and_then(|a| a.value.as_ref()).and_then(|v| v.value.as_ref())
    }

    #[test]
    fn an_event_record_carries_its_job_kind_details_and_times() {
        let ev = pb::LifecycleEvent {
            event_id: "e1".into(),
            job_id: "slurm/a/1".into(),
            attempt: Some(2),
            source: "slurm-adapter/a".into(),
            occurred_at: Some(ms_to_timestamp(1_767_225_600_123)),
            kind: Some(Kind::Queued(pb::Queued {
                reason: pb::WaitReason::Capacity as i32,
                raw_reason: "Resources".into(),
                message: String::new(),
                estimated_start: Some(ms_to_timestamp(1_767_229_200_000)),
                queue_position: Some(3),
            })),
        };
        let r = event_record(42, &ev, None, 1_767_225_601_000);
        assert_eq!(r.event_name, "startline.job.queued");
        assert_eq!(r.time_unix_nano, 1_767_225_600_123_000_000);
        assert_eq!(r.observed_time_unix_nano, 1_767_225_601_000_000_000);
        assert_eq!(r.severity_number, INFO);
        assert_eq!(attr(&r, "startline.queued.reason"), Some(&s("capacity")));
        assert_eq!(attr(&r, "startline.queued.raw_reason"), Some(&s("Resources")));
        assert_eq!(attr(&r, "startline.queued.position"), Some(&i(3)));
        assert_eq!(attr(&r, "startline.queued.estimated_start"), Some(&s("2026-01-01T01:00:00.000Z")));
        assert_eq!(attr(&r, "startline.event.seq"), Some(&i(42)));
        assert_eq!(attr(&r, "startline.event.attempt"), Some(&i(2)));
        assert_eq!(attr(&r, "startline.job.id"), Some(&s("slurm/a/1")));
    }

    #[test]
    fn a_summary_adds_up_to_the_timeline() {
        let t0 = 1_767_225_600_000i64;
        let attrs = Arc::new(JobAttrs { gpu_count: 8, team: "research".into(), ..JobAttrs::unknown() });
        let ce = |n: u32, at: i64, kind| CompactEvent {
            at_ms: at,
            id_hash: event_id_hash(&format!("e{n}")),
            seq: u64::from(n),
            attempt: None,
            kind,
        };
        let rec = JobRecord::from_events(vec![
            ce(0, t0, EventKind::Submitted(attrs)),
            ce(
                1,
                t0,
                EventKind::Queued { reason: pb::WaitReason::Quota, raw_reason: "QOSMax".into(), estimated_start: None },
            ),
            ce(2, t0 + 90_000, EventKind::NodeAssigned { nodes: [std::sync::Arc::from("n1")].into() }),
            ce(3, t0 + 100_000, EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified }),
            ce(4, t0 + 400_000, EventKind::Done { outcome: pb::Outcome::Succeeded, exit_code: Some(0) }),
        ]);
        let r = summary_record("j", &rec.timeline, t0 + 500_000);
        assert_eq!(r.event_name, "startline.job.summary");
        assert_eq!(r.time_unix_nano, nanos(t0 + 400_000));
        assert_eq!(attr(&r, "startline.job.time_to_first_step_seconds"), Some(&f(100.0)));
        assert_eq!(attr(&r, "startline.job.wait_seconds.queued:quota"), Some(&f(90.0)));
        assert_eq!(attr(&r, "startline.job.wait_seconds.assigned"), Some(&f(10.0)));
        assert_eq!(attr(&r, "startline.job.duration_seconds"), Some(&f(400.0)));
        assert_eq!(attr(&r, "startline.job.outcome"), Some(&s("succeeded")));
        assert_eq!(attr(&r, "startline.team"), Some(&s("research")));
        assert_eq!(r.severity_number, INFO);
    }

    #[test]
    fn the_section_names_each_bad_field() {
        let mut errs = Vec::new();
        let bad = LogsSection {
            otlp_endpoint: Some("otel:4317".into()),
            events: Some(false),
            summaries: Some(false),
            queue_events: Some(0),
            flush_interval: Some("1ms".into()),
            otlp_headers: [("Authorization".to_string(), "Bearer x".to_string())].into(),
            ..Default::default()
        };
        assert!(bad.validate(&mut errs).is_some());
        let text = errs.join("\n");
        for field in [
            "logs.flush_interval",
            "logs.queue_events",
            "logs.otlp_endpoint",
            "logs.otlp_headers.Authorization",
            "logs: events and summaries are both false",
        ] {
            assert!(text.contains(field), "{field} missing from {text}");
        }
        assert!(!text.contains("Bearer x"), "a secret in an error: {text}");
        let mut errs = Vec::new();
        assert!(LogsSection::default().validate(&mut errs).is_none());
        assert!(errs.is_empty(), "{errs:?}");
    }
}
