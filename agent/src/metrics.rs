//! The agent's own metrics: what an operator needs to tell "no events" from "the agent is broken".
//! One [`Metrics`] per process, rendered as the Prometheus text exposition (format 0.0.4) at `GET /metrics`:
//! on the node agent's listener (behind its Host and Origin checks) and, with `--metrics-listen ADDR`, on a
//! listener of its own ([`router`]) in every mode.
//!
//! Names follow `docs/METRICS.md` ("Agent metrics"): the `startline_agent_` prefix, base units, `_total` on
//! counters. Every label is a closed set ([`Provider`], [`PollErrorKind`], the event kinds, the route and
//! status classes, the refusal reasons, the gRPC code classes); a job id, a client id or provider text is never
//! a label.
//!
//! Counters and histograms are kept as they happen (the uplink, the pollers and the HTTP middleware call in);
//! the spool's figures (depth, bytes, oldest event's age, refusals when full) are read from the
//! [`crate::spool::Spool`] when a scrape renders them, so they are exact and cost nothing between scrapes.

use crate::spool::Spool;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus::{
    Encoder, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};
use startline_proto::pb::lifecycle_event::Kind;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The `Content-Type` of the text exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Poll duration buckets, seconds: a Slurm `squeue` takes milliseconds, a cloud API listing with many pages
/// (each describe one call) tens of seconds.
pub const POLL_BUCKETS: [f64; 12] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

/// Who reports: the `provider` label of the adapter metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// The node agent.
    Node,
    /// The Slurm adapter.
    Slurm,
    /// The SageMaker adapter.
    Sagemaker,
    /// The Vertex AI adapter.
    Vertex,
    /// The Azure Machine Learning adapter.
    Azureml,
    /// The Kubernetes/Kueue adapter.
    Kueue,
}

impl Provider {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Provider::Node => "node",
            Provider::Slurm => "slurm",
            Provider::Sagemaker => "sagemaker",
            Provider::Vertex => "vertex",
            Provider::Azureml => "azureml",
            Provider::Kueue => "kueue",
        }
    }
}

/// Why a poll failed: the `kind` label of `startline_agent_poll_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollErrorKind {
    /// The provider asked the adapter to slow down (HTTP 429, AWS `ThrottlingException`).
    Throttled,
    /// The provider answered another non-2xx status.
    HttpStatus,
    /// The request did not get an answer (connection refused, TLS, timeout).
    Transport,
    /// An answer the adapter cannot read (not JSON, not the documented shape).
    Parse,
    /// A command (`squeue`, `sacct`, a token command) could not run or exited non-zero.
    CommandFailed,
    /// The spool or the adapter's job memory could not be written.
    Spool,
    /// The cloud credentials could not be had: no source configured, or the source (STS, the instance or
    /// container metadata endpoint, a token endpoint, a key file) failed or refused.
    Credentials,
}

impl PollErrorKind {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            PollErrorKind::Throttled => "throttled",
            PollErrorKind::HttpStatus => "http_status",
            PollErrorKind::Transport => "transport",
            PollErrorKind::Parse => "parse",
            PollErrorKind::CommandFailed => "command_failed",
            PollErrorKind::Spool => "spool",
            PollErrorKind::Credentials => "credentials",
        }
    }
}

/// Why the node agent refused a request: the `reason` label of `startline_agent_http_refusals_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A foreign `Host` (403).
    Host,
    /// A cross-site `Origin` (403).
    Origin,
    /// Not `application/json` (415).
    ContentType,
    /// Missing or wrong local token (401).
    LocalToken,
    /// A job outside the allow-list (403).
    JobNotPermitted,
    /// The client holds its quota of the spool (429).
    Quota,
}

impl Refusal {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Host => "host",
            Refusal::Origin => "origin",
            Refusal::ContentType => "content_type",
            Refusal::LocalToken => "local_token",
            Refusal::JobNotPermitted => "job_not_permitted",
            Refusal::Quota => "quota",
        }
    }
}

/// The `kind` label of an event: its kind's name in the node agent's JSON (`first_step`, ...).
pub fn kind_label(kind: Option<&Kind>) -> &'static str {
    match kind {
        Some(Kind::Submitted(_)) => "submitted",
        Some(Kind::Queued(_)) => "queued",
        Some(Kind::NodeAssigned(_)) => "node_assigned",
        Some(Kind::Preparing(_)) => "preparing",
        Some(Kind::FirstStep(_)) => "first_step",
        Some(Kind::Checkpoint(_)) => "checkpoint",
        Some(Kind::Preempted(_)) => "preempted",
        Some(Kind::Requeued(_)) => "requeued",
        Some(Kind::Restarted(_)) => "restarted",
        Some(Kind::NodeLost(_)) => "node_lost",
        Some(Kind::Done(_)) => "done",
        None => "none",
    }
}

/// The `code` label of an uplink failure: the gRPC codes an operator acts on, the rest as `other`.
pub fn code_class(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::Unavailable => "unavailable",
        tonic::Code::Unauthenticated => "unauthenticated",
        tonic::Code::PermissionDenied => "permission_denied",
        tonic::Code::ResourceExhausted => "resource_exhausted",
        _ => "other",
    }
}

/// Building the registry failed (a programming error: a duplicate or malformed name).
#[derive(Debug, thiserror::Error)]
#[error("agent metrics: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

/// The agent's metrics. Cheap to clone; every clone records into the same registry.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    spool: OnceLock<Spool>,
    /// Serializes scrapes: the spool's refusal count is copied into a counter by difference.
    render: Mutex<()>,
    spool_events: IntGauge,
    spool_bytes: IntGauge,
    spool_capacity_events: IntGauge,
    spool_capacity_bytes: IntGauge,
    spool_oldest_age: Gauge,
    spool_refused: IntCounterVec,
    uplink_batches: IntCounterVec,
    uplink_events: IntCounterVec,
    uplink_failures: IntCounterVec,
    uplink_connected: IntGaugeVec,
    uplink_backoff: GaugeVec,
    poll_duration: HistogramVec,
    poll_errors: IntCounterVec,
    call_retries: IntCounterVec,
    unknown_types: IntCounterVec,
    last_poll: GaugeVec,
    jobs_tracked: IntGaugeVec,
    transitions: IntCounterVec,
    http_requests: IntCounterVec,
    http_refusals: IntCounterVec,
}

fn counter_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<IntCounterVec, prometheus::Error> {
    let m = IntCounterVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(m.clone()))?;
    Ok(m)
}

fn int_gauge(r: &Registry, name: &str, help: &str) -> Result<IntGauge, prometheus::Error> {
    let m = IntGauge::new(name, help)?;
    r.register(Box::new(m.clone()))?;
    Ok(m)
}

fn gauge(r: &Registry, name: &str, help: &str) -> Result<Gauge, prometheus::Error> {
    let m = Gauge::new(name, help)?;
    r.register(Box::new(m.clone()))?;
    Ok(m)
}

impl Metrics {
    /// The metrics of an agent running in `mode` (`node`, `slurm`, `sagemaker`, `vertex`, `simulate`): every
    /// family registered, `startline_agent_build_info{version, mode}` set to 1.
    pub fn new(mode: &'static str) -> Result<Metrics, MetricsError> {
        let r = Registry::new();
        let build = IntGaugeVec::new(
            Opts::new("startline_agent_build_info", "The agent's version and mode; always 1"),
            &["version", "mode"],
        )?;
        r.register(Box::new(build.clone()))?;
        build.with_label_values(&[env!("CARGO_PKG_VERSION"), mode]).set(1);
        let inner = Inner {
            spool_events: int_gauge(&r, "startline_agent_spool_events", "Events held in the spool")?,
            spool_bytes: int_gauge(&r, "startline_agent_spool_bytes", "Bytes of encoded events held in the spool")?,
            spool_capacity_events: int_gauge(
                &r,
                "startline_agent_spool_capacity_events",
                "Most events the spool holds before refusing new ones",
            )?,
            spool_capacity_bytes: int_gauge(
                &r,
                "startline_agent_spool_capacity_bytes",
                "Most bytes the spool holds before refusing new ones",
            )?,
            spool_oldest_age: gauge(
                &r,
                "startline_agent_spool_oldest_event_age_seconds",
                "Time since the oldest event still in the spool was appended (0 when empty)",
            )?,
            spool_refused: counter_vec(
                &r,
                "startline_agent_spool_refused_events_total",
                "Events refused by the spool: full (spool at its limit) or quota (a client over its share)",
                &["reason"],
            )?,
            uplink_batches: counter_vec(
                &r,
                "startline_agent_uplink_batches_total",
                "Batches the collector acknowledged (after its durable commit), by collector endpoint",
                &["collector"],
            )?,
            uplink_events: counter_vec(
                &r,
                "startline_agent_uplink_events_total",
                "Events in acknowledged batches, by collector endpoint and the collector's answer",
                &["collector", "result"],
            )?,
            uplink_failures: counter_vec(
                &r,
                "startline_agent_uplink_failures_total",
                "Failed connects and streams to the collector, by collector endpoint and gRPC code class",
                &["collector", "code"],
            )?,
            uplink_connected: {
                let m = IntGaugeVec::new(
                    Opts::new(
                        "startline_agent_uplink_connected",
                        "1 while the uplink to this collector has a working stream, 0 while it retries",
                    ),
                    &["collector"],
                )?;
                r.register(Box::new(m.clone()))?;
                m
            },
            uplink_backoff: {
                let m = GaugeVec::new(
                    Opts::new(
                        "startline_agent_uplink_backoff_seconds",
                        "The current retry delay of the uplink to this collector (0 after a successful ack)",
                    ),
                    &["collector"],
                )?;
                r.register(Box::new(m.clone()))?;
                m
            },
            poll_duration: {
                let m = HistogramVec::new(
                    HistogramOpts::new("startline_agent_poll_duration_seconds", "Duration of one adapter poll")
                        .buckets(POLL_BUCKETS.to_vec()),
                    &["provider"],
                )?;
                r.register(Box::new(m.clone()))?;
                m
            },
            poll_errors: counter_vec(
                &r,
                "startline_agent_poll_errors_total",
                "Adapter polls that failed, by kind",
                &["provider", "kind"],
            )?,
            call_retries: counter_vec(
                &r,
                "startline_agent_provider_call_retries_total",
                "Provider API calls retried after a throttled or failed attempt, by kind of failure",
                &["provider", "kind"],
            )?,
            unknown_types: counter_vec(
                &r,
                "startline_agent_unknown_instance_types_total",
                "Jobs on an instance or accelerator type the adapter has no GPU count or class for (the type is logged; \
                 add it with --instance-type)",
                &["provider"],
            )?,
            last_poll: {
                let m = GaugeVec::new(
                    Opts::new(
                        "startline_agent_last_successful_poll_timestamp_seconds",
                        "Unix time of the adapter's last successful poll",
                    ),
                    &["provider"],
                )?;
                r.register(Box::new(m.clone()))?;
                m
            },
            jobs_tracked: {
                let m = IntGaugeVec::new(
                    Opts::new("startline_agent_jobs_tracked", "Jobs the adapter's last successful poll followed"),
                    &["provider"],
                )?;
                r.register(Box::new(m.clone()))?;
                m
            },
            transitions: counter_vec(
                &r,
                "startline_agent_transitions_total",
                "Lifecycle events an adapter emitted (spooled), by kind",
                &["provider", "kind"],
            )?,
            http_requests: counter_vec(
                &r,
                "startline_agent_http_requests_total",
                "Requests to the node agent's endpoint, by route and status class",
                &["route", "status"],
            )?,
            http_refusals: counter_vec(
                &r,
                "startline_agent_http_refusals_total",
                "Requests the node agent refused, by reason",
                &["reason"],
            )?,
            registry: r,
            spool: OnceLock::new(),
            render: Mutex::new(()),
        };
        // Every fixed series exists from the start (a rate over a series that appears late misses its first
        // increase).
        for reason in ["full", "quota"] {
            inner.spool_refused.with_label_values(&[reason]);
        }
        if mode == "node" {
            for r in [
                Refusal::Host,
                Refusal::Origin,
                Refusal::ContentType,
                Refusal::LocalToken,
                Refusal::JobNotPermitted,
                Refusal::Quota,
            ] {
                inner.http_refusals.with_label_values(&[r.label()]);
            }
        }
        Ok(Metrics { inner: Arc::new(inner) })
    }

    /// Reports `spool`'s figures at every scrape (once; a second spool is ignored).
    pub fn watch_spool(&self, spool: Spool) {
        let limits = spool.limits();
        self.inner.spool_capacity_events.set(i64::try_from(limits.max_events).unwrap_or(i64::MAX));
        self.inner.spool_capacity_bytes.set(i64::try_from(limits.max_bytes).unwrap_or(i64::MAX));
        let _ = self.inner.spool.set(spool);
    }

    /// Creates the series of an adapter, so they are scraped as 0 before its first poll.
    pub fn register_provider(&self, p: Provider) {
        let i = &self.inner;
        i.poll_duration.with_label_values(&[p.label()]);
        i.jobs_tracked.with_label_values(&[p.label()]);
        i.unknown_types.with_label_values(&[p.label()]);
        for k in [PollErrorKind::Throttled, PollErrorKind::HttpStatus, PollErrorKind::Transport] {
            i.call_retries.with_label_values(&[p.label(), k.label()]);
        }
        for k in [
            PollErrorKind::Throttled,
            PollErrorKind::HttpStatus,
            PollErrorKind::Transport,
            PollErrorKind::Parse,
            PollErrorKind::CommandFailed,
            PollErrorKind::Spool,
            PollErrorKind::Credentials,
        ] {
            i.poll_errors.with_label_values(&[p.label(), k.label()]);
        }
    }

    /// Creates the uplink series of one collector (its endpoint as configured: a bounded, config-listed value),
    /// so they are scraped as 0 before its first ack or failure.
    pub fn register_collector(&self, collector: &str) {
        let i = &self.inner;
        i.uplink_batches.with_label_values(&[collector]);
        for result in ["accepted", "duplicate", "rejected"] {
            i.uplink_events.with_label_values(&[collector, result]);
        }
        for code in ["unavailable", "unauthenticated", "permission_denied", "resource_exhausted", "other"] {
            i.uplink_failures.with_label_values(&[collector, code]);
        }
        i.uplink_connected.with_label_values(&[collector]);
        i.uplink_backoff.with_label_values(&[collector]);
    }

    /// A batch acknowledged by `collector` with these counts.
    pub fn uplink_acked(&self, collector: &str, accepted: u64, duplicates: u64, rejected: u64) {
        let i = &self.inner;
        i.uplink_batches.with_label_values(&[collector]).inc();
        i.uplink_events.with_label_values(&[collector, "accepted"]).inc_by(accepted);
        i.uplink_events.with_label_values(&[collector, "duplicate"]).inc_by(duplicates);
        i.uplink_events.with_label_values(&[collector, "rejected"]).inc_by(rejected);
        i.uplink_connected.with_label_values(&[collector]).set(1);
        i.uplink_backoff.with_label_values(&[collector]).set(0.0);
    }

    /// A connect or a stream to `collector` failed with `code`; the uplink waits `backoff` before the next attempt.
    pub fn uplink_failed(&self, collector: &str, code: tonic::Code, backoff: Duration) {
        let i = &self.inner;
        i.uplink_failures.with_label_values(&[collector, code_class(code)]).inc();
        i.uplink_connected.with_label_values(&[collector]).set(0);
        i.uplink_backoff.with_label_values(&[collector]).set(backoff.as_secs_f64());
    }

    /// The uplink has a stream (connected, not yet acknowledged).
    pub fn uplink_connected(&self, collector: &str) {
        self.inner.uplink_connected.with_label_values(&[collector]).set(1);
    }

    /// A successful poll: its duration, the jobs it followed and the events it spooled; `now` stamps it.
    pub fn poll_succeeded(
        &self,
        p: Provider,
        took: Duration,
        jobs: usize,
        events: &[startline_proto::pb::LifecycleEvent],
        now: std::time::SystemTime,
    ) {
        let i = &self.inner;
        i.poll_duration.with_label_values(&[p.label()]).observe(took.as_secs_f64());
        i.jobs_tracked.with_label_values(&[p.label()]).set(i64::try_from(jobs).unwrap_or(i64::MAX));
        let unix = now.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        i.last_poll.with_label_values(&[p.label()]).set(unix);
        for e in events {
            i.transitions.with_label_values(&[p.label(), kind_label(e.kind.as_ref())]).inc();
        }
    }

    /// A provider call that failed and is retried.
    pub fn call_retried(&self, p: Provider, kind: PollErrorKind) {
        self.inner.call_retries.with_label_values(&[p.label(), kind.label()]).inc();
    }

    /// A job on an instance or accelerator type with no known GPU count or class.
    pub fn unknown_type(&self, p: Provider) {
        self.inner.unknown_types.with_label_values(&[p.label()]).inc();
    }

    /// A failed poll.
    pub fn poll_failed(&self, p: Provider, took: Duration, kind: PollErrorKind) {
        let i = &self.inner;
        i.poll_duration.with_label_values(&[p.label()]).observe(took.as_secs_f64());
        i.poll_errors.with_label_values(&[p.label(), kind.label()]).inc();
    }

    /// A request the node agent answered.
    pub fn http_request(&self, route: &'static str, status: StatusCode) {
        let class = match status.as_u16() {
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            500..=599 => "5xx",
            _ => "1xx",
        };
        self.inner.http_requests.with_label_values(&[route, class]).inc();
    }

    /// A request the node agent refused.
    pub fn refused(&self, reason: Refusal) {
        self.inner.http_refusals.with_label_values(&[reason.label()]).inc();
    }

    /// Events a client's quota refused.
    pub fn quota_refused(&self, events: u64) {
        self.inner.spool_refused.with_label_values(&["quota"]).inc_by(events);
    }

    /// The text exposition of every metric, the spool's read now.
    pub fn render(&self) -> Result<String, MetricsError> {
        let i = &self.inner;
        let _one_at_a_time = i.render.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(spool) = i.spool.get() {
            i.spool_events.set(i64::try_from(spool.len()).unwrap_or(i64::MAX));
            i.spool_bytes.set(i64::try_from(spool.bytes()).unwrap_or(i64::MAX));
            let age = spool.oldest_age_ms(startline_proto::time::now_ms()).unwrap_or(0);
            i.spool_oldest_age.set(age as f64 / 1000.0);
            let full = i.spool_refused.with_label_values(&["full"]);
            full.inc_by(spool.refused().saturating_sub(full.get()));
        }
        let mut buf = Vec::new();
        prometheus::TextEncoder::new().encode(&i.registry.gather(), &mut buf)?;
        String::from_utf8(buf).map_err(|e| MetricsError(prometheus::Error::Msg(e.to_string())))
    }
}

/// `GET /metrics`: the exposition, or 500 (logged) if it cannot be rendered.
pub async fn serve(State(m): State<Metrics>) -> Response {
    match m.render() {
        Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "cannot render the agent's metrics");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot render metrics\n").into_response()
        }
    }
}

/// The router of `--metrics-listen`: `GET /metrics` only. It has no Host check: the operator chose the
/// address for a scraper, and it serves nothing but these counters.
pub fn router(m: Metrics) -> Router {
    Router::new().route("/metrics", get(serve)).with_state(m)
}

/// The node agent's middleware: counts every request by route class (`events`, `spool`, `metrics`,
/// `healthz`, `other`) and status class.
pub async fn count_requests(State(m): State<Metrics>, req: Request, next: Next) -> Response {
    // The router's layer runs before routing (no `MatchedPath` yet): the route class is the path itself.
    let route = match req.uri().path() {
        "/v1/events" => "events",
        "/v1/spool" => "spool",
        "/metrics" => "metrics",
        "/healthz" => "healthz",
        _ => "other",
    };
    let resp = next.run(req).await;
    m.http_request(route, resp.status());
    resp
}

/// The value of one series in a text exposition: `name` with exactly `labels` (any order), if present. For
/// tests and checks that scrape an agent.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut want: Vec<(String, String)> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    want.sort();
    text.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (n, mut got) = match series.split_once('{') {
            Some((n, rest)) => {
                let inner = rest.strip_suffix('}')?;
                let pairs: Option<Vec<(String, String)>> = inner
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(|p| {
                        let (k, v) = p.split_once('=')?;
                        Some((k.to_string(), v.trim_matches('"').to_string()))
                    })
                    .collect();
                (n, pairs?)
            }
            None => (series, Vec::new()),
        };
        got.sort();
        (n == name && got == want).then(|| value.parse().ok()).flatten()
    })
}
