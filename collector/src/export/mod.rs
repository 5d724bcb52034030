//! Metrics: one OpenTelemetry `SdkMeterProvider` with a Prometheus reader (served at `/metrics`) and, when
//! configured, a periodic OTLP/gRPC exporter (plain or TLS with a CA file or the built-in webpki roots, an
//! optional client certificate, and gRPC metadata such as a bearer token or a tenant header: [`OtlpSettings`]). Names follow OpenTelemetry conventions (dot-separated, unit in
//! metadata); every attribute is bounded (closed enums, config-listed or capped values, SLO names from config),
//! never a job id. `docs/METRICS.md` specifies each metric.
//!
//! Synchronous instruments (histograms, counters) are recorded by the committer from job transitions
//! ([`jobs`]); gauges are observed at collection time from state kept incrementally (no scan of all jobs).
//!
//! Cardinality: besides each attribute's own bound ([`labels`]), every job metric has an explicit limit on its
//! attribute sets ([`SeriesLimit`], `metrics.max_series_per_metric`): a new set past the limit is recorded under
//! `otel.metric.overflow = true` (the OpenTelemetry convention) and counted in
//! `startline.collector.metric.overflow{metric}`; the SDK's own per-instrument limit is set above it by a View,
//! so data never folds silently. With OTLP configured, a second provider serves the OTLP path with the same
//! instruments and base-2 exponential histograms (Prometheus keeps the explicit buckets, which its text format
//! needs).

pub mod history;
pub mod logs;
pub mod rules;
pub mod slo_spec;
pub mod stream;

use crate::alert::client::{read_secret_file, ClientTlsFiles, Secret};
use crate::alert::AlertBoard;
use crate::health::IngestStats;
use crate::index::footprint::Observation;
use crate::index::labels::JobLabels;
use crate::index::SharedIndex;
use crate::store::Store;
use crate::time::Clock;
use opentelemetry::metrics::{Counter, Histogram, Meter, MeterProvider};
use opentelemetry::KeyValue;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Boundaries (seconds) for waits: a second to a week, past Kueue's 10,240 s cap.
pub const WAIT_BOUNDARIES: [f64; 19] = [
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 43200.0, 86400.0,
    172800.0, 345600.0, 604800.0,
];
/// The time-to-first-step boundaries: [`WAIT_BOUNDARIES`] plus each SLO threshold (ms), sorted, without
/// duplicates (thresholds are fixed at start; an SLO reload with a new threshold needs a restart for its bucket).
pub fn ttfs_boundaries(thresholds_ms: &[i64]) -> Vec<f64> {
    let mut b: Vec<f64> = WAIT_BOUNDARIES.to_vec();
    b.extend(thresholds_ms.iter().filter(|t| **t > 0).map(|t| *t as f64 / 1000.0));
    b.sort_by(f64::total_cmp);
    b.dedup();
    b
}

/// Boundaries (seconds) for group-commit latency.
pub const COMMIT_BOUNDARIES: [f64; 11] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

/// OTLP push settings.
#[derive(Debug, Clone)]
pub struct OtlpSettings {
    /// Collector endpoint, e.g. `http://127.0.0.1:4317` or `https://otel.example:4317`.
    pub endpoint: String,
    /// Export interval.
    pub interval: Duration,
    /// CA bundle and client certificate, read at start (paths only in `Debug`).
    pub tls: ClientTlsFiles,
    /// gRPC metadata sent with every export (lowercase keys; values redacted in `Debug`).
    pub headers: Vec<(String, Secret)>,
    /// Histogram aggregation for OTLP.
    pub histograms: OtlpHistograms,
}

/// The `[metrics]` OTLP client fields as written (paths and header map).
pub struct OtlpClientFiles<'a> {
    /// `otlp_ca_file`
    pub ca_file: Option<&'a std::path::Path>,
    /// `otlp_client_cert_file`
    pub client_cert_file: Option<&'a std::path::Path>,
    /// `otlp_client_key_file`
    pub client_key_file: Option<&'a std::path::Path>,
    /// `otlp_bearer_token_file`
    pub bearer_token_file: Option<&'a std::path::Path>,
    /// `otlp_headers`
    pub headers: &'a std::collections::BTreeMap<String, String>,
}

/// Reads and checks the OTLP client fields of `[metrics]` or `[logs]` (`section`; files read now; one message per
/// problem, naming the field, never a secret): the TLS files, then the metadata (headers, and `authorization`
/// from the token file).
pub fn otlp_client_settings(
    errs: &mut Vec<String>,
    section: &str,
    endpoint: Option<&str>,
    f: OtlpClientFiles<'_>,
) -> (ClientTlsFiles, Vec<(String, Secret)>) {
    let prefix = format!("{section}.otlp_");
    let tls = ClientTlsFiles::read(errs, &prefix, f.ca_file, f.client_cert_file, f.client_key_file);
    let is_https = endpoint.is_some_and(|e| e.starts_with("https://"));
    if (tls.ca.is_some() || tls.identity.is_some()) && !is_https {
        errs.push(format!("{section}.otlp_ca_file: TLS files need an https:// otlp_endpoint"));
    }
    let mut headers = Vec::new();
    for (k, v) in f.headers {
        let key = k.to_ascii_lowercase();
        let field = format!("{section}.otlp_headers.{k}");
        if tonic::metadata::MetadataKey::<tonic::metadata::Ascii>::from_bytes(key.as_bytes()).is_err() {
            errs.push(format!("{field}: not a valid gRPC metadata key"));
        } else if key == "authorization" {
            errs.push(format!("{field}: use otlp_bearer_token_file (a file keeps the token out of the config)"));
        } else if tonic::metadata::MetadataValue::<tonic::metadata::Ascii>::try_from(v.as_str()).is_err() {
            errs.push(format!("{field}: the value is not valid gRPC metadata"));
        } else {
            headers.push((key, Secret::new(v.clone())));
        }
    }
    if let Some(p) = f.bearer_token_file {
        match read_secret_file(&format!("{section}.otlp_bearer_token_file"), p) {
            Ok(t) => headers.push(("authorization".to_string(), Secret::new(format!("Bearer {}", t.expose())))),
            Err(e) => errs.push(e),
        }
    }
    (tls, headers)
}

/// How histograms are aggregated on the OTLP path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpHistograms {
    /// Base-2 exponential histograms (160 buckets, scale up to 20): no boundaries to choose, ~4% relative error.
    Exponential,
    /// The same explicit boundaries as Prometheus.
    Explicit,
}

/// Failure to set up metrics.
#[derive(Debug, thiserror::Error)]
#[error("metrics: {0}")]
pub struct TelemetryError(String);

/// The synchronous instruments.
struct Instruments {
    ttfs: Histogram<f64>,
    wait: Histogram<f64>,
    waited: Counter<f64>,
    started: Counter<u64>,
    finished: Counter<u64>,
    ended_before_start: Counter<u64>,
    preemptions: Counter<u64>,
    lost_work: Counter<f64>,
    gpu_time: Counter<f64>,
    commit: Histogram<f64>,
}

/// The metrics pipeline.
pub struct Telemetry {
    /// The Prometheus provider, then the OTLP one when configured.
    providers: Vec<SdkMeterProvider>,
    registry: prometheus::Registry,
    /// One set per provider, same order.
    instruments: Vec<Instruments>,
    series: Arc<SeriesLimit>,
    team: bool,
}

/// The job metrics whose attribute sets are limited (OpenTelemetry names); each has an overflow count.
pub const LIMITED_METRICS: [&str; 12] = [
    "startline.jobs.time_to_first_step",
    "startline.jobs.wait.duration",
    "startline.jobs.wait.gpu_seconds",
    "startline.jobs.started",
    "startline.jobs.finished",
    "startline.jobs.ended_before_start",
    "startline.jobs.preemptions",
    "startline.jobs.lost_work.gpu_seconds",
    "startline.jobs.gpu_seconds",
    "startline.jobs.waiting",
    "startline.jobs.waiting.gpus",
    "startline.jobs.oldest_wait",
];

/// Default of `metrics.max_series_per_metric` (the OpenTelemetry SDK's own default limit).
pub const DEFAULT_MAX_SERIES: usize = 2000;

/// Explicit per-metric limits on attribute sets, with an overflow count per metric.
///
/// A metric admits attribute sets until it has seen `limit` distinct ones (since start); a later new set is
/// replaced by the single overflow set `otel.metric.overflow = true` and counted. Measurements keep their
/// value, so totals (`sum()` over a metric) stay exact; only the split by attribute is lost for them.
#[derive(Debug)]
pub struct SeriesLimit {
    limit: usize,
    seen: std::sync::Mutex<std::collections::HashMap<&'static str, std::collections::HashSet<u64>>>,
    overflow: std::collections::HashMap<&'static str, std::sync::atomic::AtomicU64>,
}

impl SeriesLimit {
    /// A limit of `limit` attribute sets per metric.
    pub fn new(limit: usize) -> Self {
        SeriesLimit {
            limit,
            seen: Default::default(),
            overflow: LIMITED_METRICS.iter().map(|m| (*m, std::sync::atomic::AtomicU64::new(0))).collect(),
        }
    }

    /// `attrs` if `metric` may have them, else the overflow set (and one more overflow counted when `count`).
    pub fn admit(&self, metric: &'static str, attrs: Vec<KeyValue>, count: bool) -> Vec<KeyValue> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for kv in &attrs {
            kv.key.as_str().hash(&mut h);
            kv.value.as_str().hash(&mut h);
        }
        let key = h.finish();
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let set = seen.entry(metric).or_default();
        if set.contains(&key) || (set.len() < self.limit && set.insert(key)) {
            return attrs;
        }
        drop(seen);
        if count {
            if let Some(c) = self.overflow.get(metric) {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        vec![KeyValue::new("otel.metric.overflow", true)]
    }

    /// Measurements recorded under each metric's overflow set.
    pub fn overflows(&self) -> Vec<(&'static str, u64)> {
        LIMITED_METRICS.iter().map(|m| (*m, self.overflow.get(m).map_or(0, |c| c.load(Ordering::Relaxed)))).collect()
    }

    /// Distinct attribute sets each metric has had.
    pub fn series(&self, metric: &str) -> usize {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).get(metric).map_or(0, |s| s.len())
    }
}

/// An HTTP listener's counters as the exporter reads them. The API's server keeps them and implements this, so
/// the exporter (a lower layer) never imports the API.
pub trait HttpCounters: Send + Sync {
    /// Connections open now.
    fn open(&self) -> u64;
    /// Connections refused at accept so far, by `reason` attribute.
    fn refusals(&self) -> Vec<(&'static str, u64)>;
    /// Timeouts so far, by `reason` attribute.
    fn timeouts(&self) -> Vec<(&'static str, u64)>;
}

/// What the gauges read at collection time.
#[derive(Clone)]
pub struct Sources {
    /// Jobs, SLOs and job gauges.
    pub index: SharedIndex,
    /// Ingest counters.
    pub stats: Arc<IngestStats>,
    /// HTTP listener counters: open connections, refusals, timeouts.
    pub http: Arc<dyn HttpCounters>,
    /// Alerts.
    pub board: AlertBoard,
    /// The store (size on disk).
    pub store: Store,
    /// Storage health.
    pub health: Arc<crate::health::Health>,
    /// The clock.
    pub clock: Clock,
    /// Authentication: refusal counts, whether the collector runs exposed.
    pub auth: Arc<crate::auth::Auth>,
    /// Node figures of the alert loop's last node evaluation.
    pub nodes: crate::index::nodes::NodeBoard,
    /// Chain SLO figures of the alert loop's last chain evaluation.
    pub chain_slos: crate::index::chains::ChainSloBoard,
}

/// An observable counter over ingest counters, one attribute value (`key`) per counter.
fn stats_counter<const N: usize>(
    meter: &Meter,
    sources: &Sources,
    (name, unit, key): (&'static str, &'static str, &'static str),
    description: &'static str,
    pick: fn(&IngestStats) -> [(&'static str, &std::sync::atomic::AtomicU64); N],
) {
    let s = sources.clone();
    let _ = meter
        .u64_observable_counter(name)
        .with_unit(unit)
        .with_description(description)
        .with_callback(move |o| {
            for (value, c) in pick(&s.stats) {
                o.observe(c.load(Ordering::Relaxed), &[KeyValue::new(key, value)]);
            }
        })
        .build();
}

/// The job attributes: pool kind, provider, pool, priority, GPU class, region.
fn job_attrs(l: &JobLabels) -> Vec<KeyValue> {
    vec![
        KeyValue::new("pool.kind", l.pool_kind),
        KeyValue::new("provider", l.provider.to_string()),
        KeyValue::new("pool", l.pool.to_string()),
        KeyValue::new("priority", l.priority),
        KeyValue::new("gpu.class", l.gpu_class.to_string()),
        KeyValue::new("region", l.region.to_string()),
    ]
}

/// The pool attributes: pool kind, provider, pool, priority.
fn pool_attrs(kind: &'static str, provider: &str, pool: &str, priority: &'static str) -> Vec<KeyValue> {
    vec![
        KeyValue::new("pool.kind", kind),
        KeyValue::new("provider", provider.to_string()),
        KeyValue::new("pool", pool.to_string()),
        KeyValue::new("priority", priority),
    ]
}

/// Adds `team` when the team attribute is on.
fn with_team(mut a: Vec<KeyValue>, team: bool, value: &str) -> Vec<KeyValue> {
    if team {
        a.push(KeyValue::new("team", value.to_string()));
    }
    a
}

impl Telemetry {
    /// Builds the provider, its readers and every instrument. Observable instruments are registered in a fixed
    /// order, group by group.
    pub fn new(
        sources: Sources,
        otlp: Option<OtlpSettings>,
        max_series_per_metric: usize,
    ) -> Result<Telemetry, TelemetryError> {
        let (providers, registry) = meter_providers(otlp, max_series_per_metric)?;
        let series = Arc::new(SeriesLimit::new(max_series_per_metric));
        let team = sources.index.read().limiter.team_attribute();
        // Every configured SLO threshold is a bucket boundary, so an `le`-based SLI is exact at the threshold.
        let thresholds: Vec<i64> = sources.index.read().slo.defs().iter().map(|d| d.threshold_ms).collect();
        let mut instruments = Vec::with_capacity(providers.len());
        for (i, provider) in providers.iter().enumerate() {
            let meter = provider.meter("startline-collector");
            instruments.push(Instruments::new(&meter, ttfs_boundaries(&thresholds)));
            // Overflows of gauges are counted once, on the Prometheus provider's collections.
            observe_waiting_jobs(&meter, &sources, &series, team, i == 0);
            observe_slo_status(&meter, &sources);
            observe_slo_windows(&meter, &sources);
            observe_alerts(&meter, &sources);
            observe_nodes(&meter, &sources);
            observe_chain_slos(&meter, &sources);
            observe_ingest(&meter, &sources);
            observe_http(&meter, &sources);
            observe_auth(&meter, &sources);
            observe_store(&meter, &sources);
            observe_memory(&meter, &sources);
            observe_process(&meter);
            observe_overflow(&meter, &series);
        }
        Ok(Telemetry { providers, registry, instruments, series, team })
    }

    /// The per-metric series limit (for tests and self-checks).
    pub fn series_limit(&self) -> &SeriesLimit {
        &self.series
    }

    /// Registers `startline.alerts.notifications`: each notifier's outcomes (`sent`, `failed` attempts,
    /// `abandoned` after every retry, `dropped` on a full queue) by its config name. Called once, when the
    /// notifiers start (after the provider is built, which the SDK allows).
    pub fn observe_notifiers(&self, stats: Arc<crate::alert::AlertStats>) {
        for provider in &self.providers {
            Self::observe_notifiers_on(provider, stats.clone());
        }
    }

    /// Registers `startline.collector.otlp.log_records`: the OTLP logs exporter's records by `result` (`exported`,
    /// `failed` after retries, `dropped` on a full queue). Called once, when the exporter starts.
    pub fn observe_log_export(&self, stats: Arc<logs::LogStats>) {
        for provider in &self.providers {
            let s = stats.clone();
            let _ = provider
                .meter("startline-collector")
                .u64_observable_counter("startline.collector.otlp.log_records")
                .with_unit("{record}")
                .with_description(
                    "OTLP log records of accepted events and job summaries: exported, failed after retries, dropped on a full queue",
                )
                .with_callback(move |o| {
                    for (result, c) in [("exported", &s.exported), ("failed", &s.failed), ("dropped", &*s.dropped)] {
                        o.observe(c.load(Ordering::Relaxed), &[KeyValue::new("result", result)]);
                    }
                })
                .build();
        }
    }

    /// Registers the history files' seal-pass counters. Called once at start.
    pub fn observe_history(&self, stats: Arc<crate::store::history::SealStats>) {
        for provider in &self.providers {
            let meter = provider.meter("startline-collector");
            let s = stats.clone();
            let _ = meter
                .u64_observable_counter("startline.collector.history.files")
                .with_unit("{file}")
                .with_description("History files (one per day of ended jobs) written, written again or removed")
                .with_callback(move |o| {
                    o.observe(s.files_written.load(Ordering::Relaxed), &[KeyValue::new("op", "written")]);
                    o.observe(s.files_removed.load(Ordering::Relaxed), &[KeyValue::new("op", "removed")]);
                })
                .build();
            let s = stats.clone();
            let _ = meter
                .u64_observable_counter("startline.collector.history.seal_failures")
                .with_unit("{pass}")
                .with_description("Seal passes that failed (the previous files stay; the next pass tries again)")
                .with_callback(move |o| o.observe(s.failures.load(Ordering::Relaxed), &[]))
                .build();
        }
    }

    /// Registers `startline.collector.history.exports`: the history export's objects by `result` (`uploaded`,
    /// `deleted`, `failed`). Called once, when the uploader starts.
    pub fn observe_history_export(&self, stats: Arc<history::ExportStats>) {
        for provider in &self.providers {
            let s = stats.clone();
            let _ = provider
                .meter("startline-collector")
                .u64_observable_counter("startline.collector.history.exports")
                .with_unit("{object}")
                .with_description(
                    "History files copied to object storage: days uploaded (new or changed), objects deleted (day \
                     gone locally), calls failed (retried at the next pass)",
                )
                .with_callback(move |o| {
                    for (result, c) in [("uploaded", &s.uploaded), ("deleted", &s.deleted), ("failed", &s.failed)] {
                        o.observe(c.load(Ordering::Relaxed), &[KeyValue::new("result", result)]);
                    }
                })
                .build();
        }
    }

    /// Registers the stream out's self-metrics: records written, live subscribers, subscribers disconnected for
    /// falling behind or for not reading. Called once at start.
    pub fn observe_stream(&self, stream: Arc<crate::stream::Stream>) {
        for provider in &self.providers {
            let meter = provider.meter("startline-collector");
            let s = stream.clone();
            let _ = meter
                .u64_observable_counter("startline.collector.stream.records")
                .with_unit("{record}")
                .with_description("Records written to the stream out (events, job changes, alert changes)")
                .with_callback(move |o| o.observe(s.written.load(Ordering::Relaxed), &[]))
                .build();
            let s = stream.clone();
            let _ = meter
                .u64_observable_gauge("startline.collector.stream.subscribers")
                .with_unit("{subscriber}")
                .with_description("Subscribe calls open (catching up from disk or following the live stream)")
                .with_callback(move |o| o.observe(s.open_calls(), &[]))
                .build();
            let s = stream.clone();
            let _ = meter
                .u64_observable_counter("startline.collector.stream.subscriber_overflows")
                .with_unit("{subscriber}")
                .with_description(
                    "Subscribers disconnected for falling more than [stream] subscriber_buffer records behind",
                )
                .with_callback(move |o| o.observe(s.overflows.load(Ordering::Relaxed), &[]))
                .build();
            let s = stream.clone();
            let _ = meter
                .u64_observable_counter("startline.collector.stream.send_timeouts")
                .with_unit("{subscriber}")
                .with_description(
                    "Subscribers disconnected because a record waited more than [stream] send_timeout for room \
                     (the client stopped reading)",
                )
                .with_callback(move |o| o.observe(s.send_timeouts.load(Ordering::Relaxed), &[]))
                .build();
            let s = stream.clone();
            let _ = meter
                .u64_observable_counter("startline.collector.stream.expected_start_changes")
                .with_unit("{record}")
                .with_description(
                    "Expected-start changes written to the stream (a waiting job's estimate, first known or moved)",
                )
                .with_callback(move |o| o.observe(s.expected_starts.load(Ordering::Relaxed), &[]))
                .build();
            let s = stream.clone();
            let _ = meter
                .f64_observable_gauge("startline.collector.stream.estimate_sweep_duration")
                .with_unit("s")
                .with_description("How long the last sweep estimating every waiting job's start took")
                .with_callback(move |o| o.observe(s.estimate_sweep_micros.load(Ordering::Relaxed) as f64 / 1e6, &[]))
                .build();
        }
    }

    fn observe_notifiers_on(provider: &SdkMeterProvider, stats: Arc<crate::alert::AlertStats>) {
        let _ = provider
            .meter("startline-collector")
            .u64_observable_counter("startline.alerts.notifications")
            .with_unit("{notification}")
            .with_description(
                "Notifier outcomes by target: sent, failed attempts (retried), abandoned after every retry, dropped on a full queue",
            )
            .with_callback(move |o| {
                for (name, s) in &stats.notifiers() {
                    for (result, c) in
                        [("sent", &s.sent), ("failed", &s.failed), ("abandoned", &s.abandoned), ("dropped", &s.dropped)]
                    {
                        o.observe(
                            c.load(Ordering::Relaxed),
                            &[KeyValue::new("target", name.clone()), KeyValue::new("result", result)],
                        );
                    }
                }
            })
            .build();
    }

    /// Records job transitions (attribute sets limited once, then recorded on every provider).
    pub fn record(&self, observations: &[Observation]) {
        let limit = |metric: &'static str, a: Vec<KeyValue>| self.series.admit(metric, a, true);
        for o in observations {
            match o {
                Observation::Started { labels, ttfs_seconds } => {
                    let ttfs = limit(
                        "startline.jobs.time_to_first_step",
                        with_team(job_attrs(labels), self.team, &labels.team),
                    );
                    let started = limit("startline.jobs.started", job_attrs(labels));
                    for i in &self.instruments {
                        i.ttfs.record(*ttfs_seconds, &ttfs);
                        i.started.add(1, &started);
                    }
                }
                Observation::WaitSegment { labels, segment, seconds } => {
                    let mut a = pool_attrs(labels.pool_kind, &labels.provider, &labels.pool, labels.priority);
                    a.push(KeyValue::new("segment", segment.clone()));
                    let a = limit("startline.jobs.wait.duration", a);
                    for i in &self.instruments {
                        i.wait.record(*seconds, &a);
                    }
                }
                Observation::Waited { labels, gpu_seconds } => {
                    let a =
                        limit("startline.jobs.wait.gpu_seconds", with_team(job_attrs(labels), self.team, &labels.team));
                    for i in &self.instruments {
                        i.waited.add(*gpu_seconds, &a);
                    }
                }
                Observation::GpuTime { labels, gpu_seconds } => {
                    let base = with_team(
                        pool_attrs(labels.pool_kind, &labels.provider, &labels.pool, labels.priority),
                        self.team,
                        &labels.team,
                    );
                    for (category, v) in crate::job::goodput::CATEGORIES.iter().zip(gpu_seconds) {
                        if *v <= 0.0 {
                            continue;
                        }
                        let mut a = base.clone();
                        a.push(KeyValue::new("category", *category));
                        let a = limit("startline.jobs.gpu_seconds", a);
                        for i in &self.instruments {
                            i.gpu_time.add(*v, &a);
                        }
                    }
                }
                Observation::Finished { labels, outcome, before_start } => {
                    use startline_proto::labels::Label;
                    let mut a = job_attrs(labels);
                    a.push(KeyValue::new("outcome", outcome.label()));
                    let finished = limit("startline.jobs.finished", a.clone());
                    let before = before_start.then(|| limit("startline.jobs.ended_before_start", a));
                    for i in &self.instruments {
                        i.finished.add(1, &finished);
                        if let Some(b) = &before {
                            i.ended_before_start.add(1, b);
                        }
                    }
                }
                Observation::Preempted { labels, count } => {
                    let a = limit("startline.jobs.preemptions", job_attrs(labels));
                    for i in &self.instruments {
                        i.preemptions.add(*count, &a);
                    }
                }
                Observation::LostWork { labels, gpu_seconds } => {
                    let a = limit("startline.jobs.lost_work.gpu_seconds", job_attrs(labels));
                    for i in &self.instruments {
                        i.lost_work.add(*gpu_seconds, &a);
                    }
                }
            }
        }
    }

    /// Records one group commit's duration.
    pub fn record_commit(&self, d: Duration) {
        for i in &self.instruments {
            i.commit.record(d.as_secs_f64(), &[]);
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn prometheus_text(&self) -> Result<String, TelemetryError> {
        use prometheus::Encoder;
        let mut buf = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .map_err(|e| TelemetryError(e.to_string()))?;
        String::from_utf8(buf).map_err(|e| TelemetryError(e.to_string()))
    }

    /// Flushes and stops the exporters.
    pub fn shutdown(&self) {
        for p in &self.providers {
            if let Err(e) = p.shutdown() {
                tracing::debug!(error = %e, "metrics shutdown");
            }
        }
    }
}

/// The providers: Prometheus (into the returned registry) and, when configured, OTLP push. Each has a View that
/// sets every instrument's SDK cardinality limit above [`SeriesLimit`]'s (which folds and counts first); the
/// OTLP one also turns histograms exponential when so configured.
fn meter_providers(
    otlp: Option<OtlpSettings>,
    max_series: usize,
) -> Result<(Vec<SdkMeterProvider>, prometheus::Registry), TelemetryError> {
    let registry = prometheus::Registry::new();
    let prom = opentelemetry_prometheus::exporter()
        .with_registry(registry.clone())
        .without_target_info()
        .build()
        .map_err(|e| TelemetryError(e.to_string()))?;
    // OTLP receivers see who reports: service name, version and this process's instance id. (Prometheus gets
    // `startline_build_info` instead, and tells replicas apart by the scrape's `instance` label.)
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("startline-collector")
        .with_attributes([
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::new("service.instance.id", format!("{host}:{}", std::process::id())),
        ])
        .build();
    // Room for the admitted sets, the overflow set, and one spare.
    let sdk_limit = max_series + 2;
    let limited = move |_: &opentelemetry_sdk::metrics::Instrument| {
        opentelemetry_sdk::metrics::Stream::builder().with_cardinality_limit(sdk_limit).build().ok()
    };
    let mut providers =
        vec![SdkMeterProvider::builder().with_resource(resource.clone()).with_reader(prom).with_view(limited).build()];
    if let Some(o) = otlp {
        let exponential = o.histograms == OtlpHistograms::Exponential;
        let view = move |i: &opentelemetry_sdk::metrics::Instrument| {
            let b = opentelemetry_sdk::metrics::Stream::builder().with_cardinality_limit(sdk_limit);
            let b = if exponential && i.kind() == opentelemetry_sdk::metrics::InstrumentKind::Histogram {
                b.with_aggregation(opentelemetry_sdk::metrics::Aggregation::Base2ExponentialHistogram {
                    max_size: 160,
                    max_scale: 20,
                    record_min_max: true,
                })
            } else {
                b
            };
            b.build().ok()
        };
        use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
        let mut b = opentelemetry_otlp::MetricExporter::builder().with_tonic();
        if o.endpoint.starts_with("https://") {
            b = b.with_tls_config(otlp_tls_config(&o.tls));
        }
        if !o.headers.is_empty() {
            let mut metadata = tonic::metadata::MetadataMap::new();
            for (k, v) in &o.headers {
                // Checked at validation; a value is never put in an error message.
                let key = tonic::metadata::MetadataKey::<tonic::metadata::Ascii>::from_bytes(k.as_bytes())
                    .map_err(|_| TelemetryError(format!("otlp header {k:?}: not a valid metadata key")))?;
                let value = tonic::metadata::MetadataValue::<tonic::metadata::Ascii>::try_from(v.expose())
                    .map_err(|_| TelemetryError(format!("otlp header {k:?}: not a valid metadata value")))?;
                metadata.insert(key, value);
            }
            b = b.with_metadata(metadata);
        }
        let exporter =
            b.with_endpoint(o.endpoint).build().map_err(|e| TelemetryError(format!("otlp exporter: {e}")))?;
        providers.push(
            SdkMeterProvider::builder()
                .with_resource(resource)
                .with_reader(
                    opentelemetry_sdk::metrics::PeriodicReader::builder(exporter).with_interval(o.interval).build(),
                )
                .with_view(view)
                .build(),
        );
    }
    Ok((providers, registry))
}

/// `startline_build_info` and the process metrics Prometheus users expect from any exporter (resident memory,
/// CPU seconds, open file descriptors, start time), read from `/proc/self` at collection time.
fn observe_process(meter: &Meter) {
    let _ = meter
        .u64_observable_gauge("startline.build.info")
        .with_description("Always 1; the labels say which build runs")
        .with_callback(|o| {
            o.observe(
                1,
                &[KeyValue::new("version", env!("CARGO_PKG_VERSION")), KeyValue::new("binary", "startline-collector")],
            )
        })
        .build();
    let _ = meter
        .u64_observable_gauge("process.resident_memory")
        .with_unit("By")
        .with_description("Resident set size")
        .with_callback(|o| {
            if let Some(kib) = proc_status_kib("VmRSS:") {
                o.observe(kib * 1024, &[]);
            }
        })
        .build();
    let _ = meter
        .f64_observable_counter("process.cpu")
        .with_unit("s")
        .with_description("User and system CPU time spent")
        .with_callback(|o| {
            if let Some(s) = proc_cpu_seconds() {
                o.observe(s, &[]);
            }
        })
        .build();
    let _ = meter
        .u64_observable_gauge("process.open_fds")
        .with_description("Open file descriptors")
        .with_callback(|o| {
            if let Ok(d) = std::fs::read_dir("/proc/self/fd") {
                o.observe(d.count() as u64, &[]);
            }
        })
        .build();
    let started =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let _ = meter
        .f64_observable_gauge("process.start_time")
        .with_unit("s")
        .with_description("When the collector started, Unix seconds")
        .with_callback(move |o| o.observe(started, &[]))
        .build();
}

/// A `kB` field of /proc/self/status.
fn proc_status_kib(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    line[field.len()..].split_whitespace().next()?.parse().ok()
}

/// utime + stime of /proc/self/stat, in seconds (Linux reports them in USER_HZ = 100 ticks per second).
fn proc_cpu_seconds() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let (utime, stime): (u64, u64) = (f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?);
    Some((utime + stime) as f64 / 100.0)
}

/// TLS for an `https://` OTLP endpoint: the configured CA bundle, or else the built-in webpki roots (the
/// same roots reqwest uses for notifiers), and the client certificate when configured.
fn otlp_tls_config(files: &ClientTlsFiles) -> tonic::transport::ClientTlsConfig {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let mut tls = ClientTlsConfig::new();
    tls = match &files.ca {
        Some((_, pem)) => tls.ca_certificate(Certificate::from_pem(pem)),
        None => tls.trust_anchors(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    };
    if let Some((_, cert, key)) = &files.identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    tls
}

impl Instruments {
    /// The synchronous instruments: job transitions (recorded by the committer) and group commits.
    fn new(meter: &Meter, ttfs_boundaries: Vec<f64>) -> Instruments {
        Instruments {
            ttfs: meter
                .f64_histogram("startline.jobs.time_to_first_step")
                .with_unit("s")
                .with_description("Time from submit to the first training step, recorded when a job first starts")
                .with_boundaries(ttfs_boundaries)
                .build(),
            wait: meter
                .f64_histogram("startline.jobs.wait.duration")
                .with_unit("s")
                .with_description("Time a job spent in each wait segment before its first step (reason or phase)")
                .with_boundaries(WAIT_BOUNDARIES.to_vec())
                .build(),
            gpu_time: meter
                .f64_counter("startline.jobs.gpu_seconds")
                .with_unit("{gpu_second}")
                .with_description(
                    "Where ended jobs' GPU time went (requested GPUs x time from submit to end), by category: waiting, \
                     preparing, requeue_wait, checkpoint, lost, failed, productive; recorded when a job ends",
                )
                .build(),
            waited: meter
                .f64_counter("startline.jobs.wait.gpu_seconds")
                .with_unit("{gpu_second}")
                .with_description(
                    "GPU-seconds held waiting before the first step (requested GPUs x initial wait), recorded when \
                     the wait ends",
                )
                .build(),
            started: meter
                .u64_counter("startline.jobs.started")
                .with_unit("{job}")
                .with_description("Jobs that reached their first step")
                .build(),
            finished: meter
                .u64_counter("startline.jobs.finished")
                .with_unit("{job}")
                .with_description("Jobs that ended, by outcome")
                .build(),
            ended_before_start: meter
                .u64_counter("startline.jobs.ended_before_start")
                .with_unit("{job}")
                .with_description(
                    "Jobs that ended without reaching their first step, by outcome (the time-to-first-step histogram \
                     counts only jobs that started: add these to see every job that waited)",
                )
                .build(),
            preemptions: meter
                .u64_counter("startline.jobs.preemptions")
                .with_unit("{preemption}")
                .with_description("Preemptions of running jobs")
                .build(),
            lost_work: meter
                .f64_counter("startline.jobs.lost_work.gpu_seconds")
                .with_unit("{gpu_second}")
                .with_description(
                    "GPU-seconds of training lost since the last checkpoint to preemptions, node losses and restarts",
                )
                .build(),
            commit: meter
                .f64_histogram("startline.collector.commit.duration")
                .with_unit("s")
                .with_description("Duration of one group commit (sled write and flush)")
                .with_boundaries(COMMIT_BOUNDARIES.to_vec())
                .build(),
        }
    }
}

/// Observes `(attributes, value)` pairs through the series limit, merging what overflows into one observation
/// (summed for additive gauges, the largest for `max`).
fn observe_limited<T: Copy + std::ops::Add<Output = T> + PartialOrd>(
    o: &dyn opentelemetry::metrics::AsyncInstrument<T>,
    series: &SeriesLimit,
    metric: &'static str,
    count: bool,
    max: bool,
    points: impl Iterator<Item = (Vec<KeyValue>, T)>,
) {
    let mut overflow: Option<T> = None;
    for (a, v) in points {
        let a = series.admit(metric, a, count);
        if a.len() == 1 && a[0].key.as_str() == "otel.metric.overflow" {
            overflow = Some(match overflow {
                None => v,
                Some(x) if max => {
                    if v > x {
                        v
                    } else {
                        x
                    }
                }
                Some(x) => x + v,
            });
        } else {
            o.observe(v, &a);
        }
    }
    if let Some(v) = overflow {
        o.observe(v, &[KeyValue::new("otel.metric.overflow", true)]);
    }
}

/// Gauges of the jobs waiting now: how many per segment, their GPUs, and the oldest wait. Job and GPU counts are
/// additive (up-down counters: summing across pools or collectors means something); the oldest wait is a gauge.
fn observe_waiting_jobs(meter: &Meter, sources: &Sources, series: &Arc<SeriesLimit>, team: bool, count: bool) {
    let (s, lim) = (sources.clone(), series.clone());
    let _ = meter
        .i64_observable_up_down_counter("startline.jobs.waiting")
        .with_unit("{job}")
        .with_description(
            "Jobs waiting now, by wait segment (queued:<reason>, assigned, preparing:<phase>, unreported)",
        )
        .with_callback(move |o| {
            let idx = s.index.read();
            let points = idx.gauges.waiting.iter().map(|((kind, provider, pool, priority, t, segment), n)| {
                let mut a = with_team(pool_attrs(kind, provider, pool, priority), team, t);
                a.push(KeyValue::new("segment", segment.clone()));
                (a, *n)
            });
            observe_limited(o, &lim, "startline.jobs.waiting", count, false, points);
        })
        .build();
    let (s, lim) = (sources.clone(), series.clone());
    let _ = meter
        .i64_observable_up_down_counter("startline.jobs.waiting.gpus")
        .with_unit("{gpu}")
        .with_description("GPUs requested by the jobs waiting now (a job asking for 64 GPUs weighs 64)")
        .with_callback(move |o| {
            let idx = s.index.read();
            let points = idx.gauges.waiting_gpus.iter().map(|((kind, provider, pool, priority, class, t), n)| {
                let mut a = pool_attrs(kind, provider, pool, priority);
                a.push(KeyValue::new("gpu.class", class.to_string()));
                (with_team(a, team, t), *n)
            });
            observe_limited(o, &lim, "startline.jobs.waiting.gpus", count, false, points);
        })
        .build();
    let (s, lim) = (sources.clone(), series.clone());
    let _ = meter
        .f64_observable_gauge("startline.jobs.oldest_wait")
        .with_unit("s")
        .with_description("Age of the oldest waiting job, by pool and priority")
        .with_callback(move |o| {
            let now = s.clock.now_ms();
            let idx = s.index.read();
            let points = idx
                .gauges
                .oldest_ages(now)
                .into_iter()
                .map(|((kind, provider, pool, priority), age)| (pool_attrs(kind, &provider, &pool, priority), age));
            observe_limited(o, &lim, "startline.jobs.oldest_wait", count, true, points);
        })
        .build();
}

/// `startline.collector.metric.overflow`: measurements each limited metric recorded under its overflow set.
fn observe_overflow(meter: &Meter, series: &Arc<SeriesLimit>) {
    let lim = series.clone();
    let _ = meter
        .u64_observable_counter("startline.collector.metric.overflow")
        .with_unit("{measurement}")
        .with_description(
            "Measurements a job metric recorded under otel.metric.overflow=true because it already had \
             metrics.max_series_per_metric attribute sets (raise the limit, or list the values to keep)",
        )
        .with_callback(move |o| {
            for (metric, n) in lim.overflows() {
                o.observe(n, &[KeyValue::new("metric", metric)]);
            }
        })
        .build();
}

/// Gauges of each SLO's status over its window: compliance, error budget, burn rates, job counts.
fn observe_slo_status(meter: &Meter, sources: &Sources) {
    let s = sources.clone();
    let _ = meter
        .f64_observable_gauge("startline.slo.compliance")
        .with_unit("1")
        .with_description("Share of good jobs over the SLO's window")
        .with_callback(move |o| {
            for st in slo_statuses(&s) {
                o.observe(st.compliance, &[KeyValue::new("slo", st.name.clone())]);
            }
        })
        .build();
    let s = sources.clone();
    let _ = meter
        .f64_observable_gauge("startline.slo.error_budget.remaining")
        .with_unit("1")
        .with_description("Share of the SLO's error budget left over its window (negative when overspent)")
        .with_callback(move |o| {
            for st in slo_statuses(&s) {
                o.observe(st.error_budget_remaining, &[KeyValue::new("slo", st.name.clone())]);
            }
        })
        .build();
    let s = sources.clone();
    let _ = meter
        .f64_observable_gauge("startline.slo.burn_rate")
        .with_unit("{multiple}")
        .with_description("Error-budget burn rate over a window: (bad / total) / (1 - objective)")
        .with_callback(move |o| {
            for st in slo_statuses(&s) {
                for (w, r, _) in &st.burn_rates {
                    o.observe(*r, &[KeyValue::new("slo", st.name.clone()), KeyValue::new("window", w.clone())]);
                }
            }
        })
        .build();
    let s = sources.clone();
    let _ = meter
        .i64_observable_up_down_counter("startline.slo.jobs")
        .with_unit("{job}")
        .with_description("Jobs decided over the SLO's window, by result (good, bad)")
        .with_callback(move |o| {
            for st in slo_statuses(&s) {
                for (result, n) in [("good", st.good), ("bad", st.bad)] {
                    o.observe(n as i64, &[KeyValue::new("slo", st.name.clone()), KeyValue::new("result", result)]);
                }
            }
        })
        .build();
    let s = sources.clone();
    let _ = meter
        .i64_observable_up_down_counter("startline.slo.jobs.waiting")
        .with_unit("{job}")
        .with_description(
            "Covered jobs waiting now, by state: breached (past the SLO's threshold, not started) or pending \
             (still within it)",
        )
        .with_callback(move |o| {
            for st in slo_statuses(&s) {
                for (state, n) in [("breached", st.breached_waiting), ("pending", st.pending)] {
                    o.observe(n as i64, &[KeyValue::new("slo", st.name.clone()), KeyValue::new("state", state)]);
                }
            }
        })
        .build();
}

/// Gauges of each SLO's burn-rate windows (counts to sum across collectors) and its objective.
fn observe_slo_windows(meter: &Meter, sources: &Sources) {
    let s = sources.clone();
    let _ = meter
        .i64_observable_up_down_counter("startline.slo.window.jobs")
        .with_unit("{job}")
        .with_description("Jobs decided within each burn-rate window, by result (good, bad): sum across collectors for global burn rates")
        .with_callback(move |o| {
            let now = s.clock.now_ms();
            let idx = s.index.read();
            for (i, d) in idx.slo.defs().iter().enumerate() {
                for (w, ms) in crate::slo::BURN_WINDOWS {
                    let c = idx.slo.counts(i, now, ms);
                    for (result, n) in [("good", c.good), ("bad", c.bad)] {
                        o.observe(
                            n as i64,
                            &[KeyValue::new("slo", d.name.clone()), KeyValue::new("window", w), KeyValue::new("result", result)],
                        );
                    }
                }
            }
        })
        .build();
    let s = sources.clone();
    let _ = meter
        .u64_observable_counter("startline.slo.decisions")
        .with_unit("{job}")
        .with_description(
            "Jobs decided for each SLO since the collector started, by result: good, bad, and restated_good / \
             restated_bad when a late event changed a decision (the SLI as counters: compute any window with increase())",
        )
        .with_callback(move |o| {
            let idx = s.index.read();
            for (i, d) in idx.slo.defs().iter().enumerate() {
                let c = idx.slo.decisions(i);
                for (result, n) in
                    [("good", c.good), ("bad", c.bad), ("restated_good", c.restated_good), ("restated_bad", c.restated_bad)]
                {
                    o.observe(n, &[KeyValue::new("slo", d.name.clone()), KeyValue::new("result", result)]);
                }
            }
        })
        .build();
    let s = sources.clone();
    let _ = meter
        .f64_observable_gauge("startline.slo.objective")
        .with_unit("1")
        .with_description("The SLO's objective, as a share (0.99 for 99%)")
        .with_callback(move |o| {
            let idx = s.index.read();
            for d in idx.slo.defs() {
                o.observe(d.objective, &[KeyValue::new("slo", d.name.clone())]);
            }
        })
        .build();
}

/// The gauge of firing alerts.
fn observe_alerts(meter: &Meter, sources: &Sources) {
    let s = sources.clone();
    let _ = meter
        .i64_observable_up_down_counter("startline.alerts.firing")
        .with_unit("{alert}")
        .with_description("Alerts firing now, by alert name, severity and SLO")
        .with_callback(move |o| {
            let mut counts: std::collections::BTreeMap<(String, String, String), i64> = Default::default();
            for a in s.board.snapshot().into_iter().filter(|a| a.firing()) {
                let g = |k: &str| a.labels.get(k).cloned().unwrap_or_default();
                *counts.entry((g("alertname"), g("severity"), g("slo"))).or_default() += 1;
            }
            for ((name, sev, slo), n) in counts {
                o.observe(
                    n,
                    &[KeyValue::new("alertname", name), KeyValue::new("severity", sev), KeyValue::new("slo", slo)],
                );
            }
        })
        .build();
}

/// `startline.nodes` and `startline.nodes.suspect`: per pool (bounded like every pool label), nodes with
/// placements in the `[nodes]` window and how many of them the suspect-node rule flags, as of the last node
/// evaluation (every minute at most).
fn observe_nodes(meter: &Meter, sources: &Sources) {
    for (name, desc, suspect) in [
        ("startline.nodes", "Nodes with placements in the [nodes] window, by pool", false),
        ("startline.nodes.suspect", "Nodes the suspect-node rule flags now, by pool", true),
    ] {
        let s = sources.clone();
        let _ = meter
            .i64_observable_up_down_counter(name)
            .with_unit("{node}")
            .with_description(desc)
            .with_callback(move |o| {
                let limiter = &s.index.read().limiter;
                let mut by: std::collections::BTreeMap<Arc<str>, i64> = Default::default();
                for (pool, nodes, suspects) in s.nodes.pools() {
                    *by.entry(limiter.pool(&pool)).or_default() += (if suspect { suspects } else { nodes }) as i64;
                }
                for (pool, n) in by {
                    o.observe(n, &[KeyValue::new("pool", pool.to_string())]);
                }
            })
            .build();
    }
}

/// `startline.chain_slo.chains` (by SLO and result: `good` and `bad` decided in its window, `pending` open with
/// the deadline ahead) and `startline.chains.late` (open chains past their deadline), as of the last chain SLO
/// evaluation. SLO names are config-listed, so the label is bounded.
fn observe_chain_slos(meter: &Meter, sources: &Sources) {
    let s = sources.clone();
    let _ = meter
        .i64_observable_up_down_counter("startline.chain_slo.chains")
        .with_unit("{chain}")
        .with_description("Chains covered by each chain SLO: good and bad decided in its window, pending now")
        .with_callback(move |o| {
            for f in s.chain_slos.figures() {
                for (result, n) in [("good", f.good), ("bad", f.bad), ("pending", f.pending)] {
                    o.observe(n as i64, &[KeyValue::new("slo", f.slo.clone()), KeyValue::new("result", result)]);
                }
            }
        })
        .build();
    let s = sources.clone();
    let _ = meter
        .i64_observable_up_down_counter("startline.chains.late")
        .with_unit("{chain}")
        .with_description("Chains still open past their chain SLO's deadline")
        .with_callback(move |o| {
            for f in s.chain_slos.figures() {
                o.observe(f.late_open as i64, &[KeyValue::new("slo", f.slo.clone())]);
            }
        })
        .build();
}

/// Observable counters over the ingest path's counters: events by result, refusals by reason.
fn observe_ingest(meter: &Meter, sources: &Sources) {
    stats_counter(
        meter,
        sources,
        ("startline.collector.events", "{event}", "result"),
        "Events received, by result (accepted, duplicate, rejected)",
        |st| [("accepted", &st.accepted), ("duplicate", &st.duplicates), ("rejected", &st.rejected)],
    );
    stats_counter(
        meter,
        sources,
        ("startline.collector.refusals", "{refusal}", "reason"),
        "Batches and gRPC connections refused at the edge, by reason (queue_full with when_full = reject, \
         connection_limit over grpc.max_connections, connection_limit_per_ip over grpc.max_connections_per_ip, \
         descriptor_budget when connections hold the open-file limit less the reserve, handshake_timeout past \
         grpc.handshake_timeout, tls_handshake for failed TLS handshakes, open_jobs for batches that would take \
         their identity past its max_open_jobs)",
        |st| {
            [
                ("queue_full", &st.refused_full),
                ("connection_limit", &st.connections_refused),
                ("connection_limit_per_ip", &st.connections_refused_per_ip),
                ("descriptor_budget", &st.connections_refused_descriptors),
                ("handshake_timeout", &st.connections_timed_out),
                ("tls_handshake", &st.tls_handshake_failures),
                ("open_jobs", &st.refused_open_jobs),
            ]
        },
    );
    let st = sources.stats.clone();
    let _ = meter
        .u64_observable_gauge("startline.collector.identity.open_jobs")
        .with_unit("{job}")
        .with_description(
            "Open jobs counted against each identity with an open-jobs budget (max_open_jobs): jobs its batches \
             opened that are not done yet, counted since the collector started",
        )
        .with_callback(move |o| {
            for (identity, n) in st.open_jobs.counts() {
                o.observe(n, &[KeyValue::new("identity", identity.to_string())]);
            }
        })
        .build();
}

/// The HTTP listener: connections open, refused at accept by reason, and timeouts by reason.
fn observe_http(meter: &Meter, sources: &Sources) {
    let h = sources.http.clone();
    let _ = meter
        .u64_observable_gauge("startline.collector.http.connections")
        .with_unit("{connection}")
        .with_description("HTTP connections open (at most http.max_connections)")
        .with_callback(move |o| o.observe(h.open(), &[]))
        .build();
    let h = sources.http.clone();
    let _ = meter
        .u64_observable_counter("startline.collector.http.refusals")
        .with_unit("{connection}")
        .with_description(
            "HTTP connections closed as they were accepted, by reason (connection_limit over http.max_connections, \
             connection_limit_per_ip over http.max_connections_per_ip, descriptor_budget when connections hold the \
             open-file limit less the reserve)",
        )
        .with_callback(move |o| {
            for (reason, n) in h.refusals() {
                o.observe(n, &[KeyValue::new("reason", reason)]);
            }
        })
        .build();
    let h = sources.http.clone();
    let _ = meter
        .u64_observable_counter("startline.collector.http.timeouts")
        .with_unit("{timeout}")
        .with_description(
            "HTTP connections closed and requests cut short by a timeout, by reason (header_read, body_read: \
             answered 408, request: answered 408 or 503 or the answer not written, idle: keep-alive connections \
             closed after http.idle_timeout)",
        )
        .with_callback(move |o| {
            for (reason, n) in h.timeouts() {
                o.observe(n, &[KeyValue::new("reason", reason)]);
            }
        })
        .build();
}

/// Authentication refusals by reason, and whether the collector runs exposed without authentication.
fn observe_auth(meter: &Meter, sources: &Sources) {
    let a = sources.auth.clone();
    let _ = meter
        .u64_observable_counter("startline.collector.auth.refusals")
        .with_unit("{refusal}")
        .with_description(
            "Requests and events refused by authentication or authorization, by reason (missing, malformed, \
             unknown, scope, rate_limited, quota; not_permitted counts events and health reports outside the \
             identity's job-id prefixes, sources or node prefixes; origin counts cross-origin HTTP requests that \
             would change state)",
        )
        .with_callback(move |o| {
            for (reason, n) in a.stats.by_reason() {
                o.observe(n, &[KeyValue::new("reason", reason)]);
            }
        })
        .build();
    let a = sources.auth.clone();
    let _ = meter
        .u64_observable_gauge("startline.collector.auth.insecure")
        .with_description(
            "1 when a listener is reachable beyond loopback with no authentication (auth.insecure = true), else 0",
        )
        .with_callback(move |o| o.observe(u64::from(a.insecure() && !a.required()), &[]))
        .build();
    let a = sources.auth.clone();
    let _ = meter
        .u64_observable_counter("startline.collector.auth.revoked_calls")
        .with_unit("{call}")
        .with_description(
            "Open Publish and Subscribe calls ended by a configuration reload that removed their credential \
             (unauthenticated) or their scope (permission_denied)",
        )
        .with_callback(move |o| {
            for (call, code, n) in a.stats.revoked_calls() {
                o.observe(n, &[KeyValue::new("call", call), KeyValue::new("code", code)]);
            }
        })
        .build();
}

/// Storage health, write errors, the write halt and size on disk.
fn observe_store(meter: &Meter, sources: &Sources) {
    let s = sources.clone();
    let _ = meter
        .u64_observable_gauge("startline.collector.store.healthy")
        .with_description("1 while storage writes succeed, 0 while they fail (see /healthz for the cause)")
        .with_callback(move |o| o.observe(u64::from(s.health.is_healthy()), &[]))
        .build();
    let s = sources.clone();
    let _ = meter
        .u64_observable_counter("startline.collector.store.write.errors")
        .with_description("Storage writes that failed (group commits, checkpoints, retention)")
        .with_callback(move |o| o.observe(s.health.storage_errors(), &[]))
        .build();
    let s = sources.clone();
    let _ = meter
        .u64_observable_gauge("startline.collector.store.writes_halted")
        .with_description(
            "1 once a store write failed with an I/O error: writes halt and ingest is refused until the collector \
             restarts, which it does once the store is writable again (store.after_write_failure)",
        )
        .with_callback(move |o| o.observe(u64::from(s.health.halted().is_some()), &[]))
        .build();
    let s = sources.clone();
    let _ = meter
        .u64_observable_counter("startline.collector.jobs.deleted")
        .with_description(
            "Jobs deleted since start, by reason: retention (ended longer ago than store.retention) or \
             memory_budget (folded jobs that ended longest ago, while folded rows were over store.folded_budget_mib)",
        )
        .with_callback(move |o| {
            let d = s.index.read().deleted;
            o.observe(d.expired, &[KeyValue::new("reason", "retention")]);
            o.observe(d.over_budget, &[KeyValue::new("reason", "memory_budget")]);
        })
        .build();
    let s = sources.clone();
    let _ = meter
        .f64_observable_gauge("startline.collector.history.deleted_through")
        .with_unit("s")
        .with_description(
            "End time (Unix seconds) of the latest-ending job ever deleted for store.folded_budget_mib (0: none): \
             jobs that ended before it may be missing from comparisons, listings and SLO counts",
        )
        .with_callback(move |o| {
            let ms = s.index.read().deleted.over_budget_through_ms;
            o.observe(ms as f64 / 1000.0, &[]);
        })
        .build();
    let s = sources.clone();
    let _ = meter
        .u64_observable_gauge("startline.collector.store.size")
        .with_unit("By")
        .with_description("Bytes the sled database occupies on disk")
        .with_callback(move |o| {
            if let Ok(n) = s.store.size_on_disk() {
                o.observe(n, &[]);
            }
        })
        .build();
}

/// The index's residents and their estimated memory, and the store's cache budget.
fn observe_memory(meter: &Meter, sources: &Sources) {
    let s = sources.clone();
    let _ = meter
        .i64_observable_up_down_counter("startline.collector.jobs")
        .with_description("Jobs tracked: `residence=hot` in memory with their events, `folded` as compact summaries")
        .with_callback(move |o| {
            let m = s.index.read().memory();
            o.observe(m.hot_jobs as i64, &[KeyValue::new("residence", "hot")]);
            o.observe(m.folded_jobs as i64, &[KeyValue::new("residence", "folded")]);
        })
        .build();
    let s = sources.clone();
    let _ = meter
        .u64_observable_gauge("startline.collector.memory")
        .with_unit("By")
        .with_description(
            "Estimated bytes by part: hot_jobs, folded_jobs (index), dictionary (attribute sets folded rows \
             share), slo_windows (SLO counts, exact times to first step, deadlines), store_cache (sled's page \
             cache budget, store.cache_mib)",
        )
        .with_callback(move |o| {
            let m = s.index.read().memory();
            o.observe(m.hot_bytes as u64, &[KeyValue::new("part", "hot_jobs")]);
            o.observe(m.folded_bytes as u64, &[KeyValue::new("part", "folded_jobs")]);
            o.observe(m.dictionary_bytes as u64, &[KeyValue::new("part", "dictionary")]);
            o.observe(m.slo_bytes as u64, &[KeyValue::new("part", "slo_windows")]);
            o.observe(s.store.cache_bytes(), &[KeyValue::new("part", "store_cache")]);
        })
        .build();
    let s = sources.clone();
    let _ = meter
        .u64_observable_gauge("startline.collector.memory.budget")
        .with_unit("By")
        .with_description(
            "Memory budgets by part: hot_jobs (store.hot_budget_mib: over it, ended jobs fold at once), \
             folded_jobs (store.folded_budget_mib: over it, the folded jobs that ended longest ago are deleted), \
             store_cache (store.cache_mib)",
        )
        .with_callback(move |o| {
            let (hot, folded) = {
                let idx = s.index.read();
                (idx.hot_budget, idx.folded_budget)
            };
            o.observe(hot as u64, &[KeyValue::new("part", "hot_jobs")]);
            // (No series without a budget: `store.folded_budget_mib = 0`.)
            if folded != usize::MAX {
                o.observe(folded as u64, &[KeyValue::new("part", "folded_jobs")]);
            }
            o.observe(s.store.cache_bytes(), &[KeyValue::new("part", "store_cache")]);
        })
        .build();
}

fn slo_statuses(s: &Sources) -> Vec<crate::slo::SloStatus> {
    let now = s.clock.now_ms();
    let idx = s.index.read();
    (0..idx.slo.defs().len()).filter_map(|i| idx.slo.status(i, now, idx.slo.defs()[i].window_ms)).collect()
}

impl crate::index::footprint::MetricsSink for Telemetry {
    fn record(&self, observations: &[Observation]) {
        Telemetry::record(self, observations);
    }

    fn record_commit(&self, took: Duration) {
        Telemetry::record_commit(self, took);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alert::AlertRecord;
    use crate::index::JobIndex;
    use crate::job::{event_id_hash, CompactEvent, EventKind, JobAttrs, JobRecord};
    use crate::slo::{SloDef, SloEngine};
    use startline_proto::pb;

    const T0: i64 = 1_767_225_600_000;

    /// The `# TYPE` lines of the Prometheus text: every metric family exposed.
    fn families(text: &str) -> Vec<String> {
        text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).map(str::to_string).collect()
    }

    /// A job submitted at `T0` and still waiting.
    fn waiting_job() -> JobRecord {
        JobRecord::from_events(vec![CompactEvent {
            at_ms: T0,
            id_hash: event_id_hash("w-s"),
            seq: 1,
            attempt: None,
            kind: EventKind::Submitted(Arc::new(JobAttrs {
                pool_kind: pb::PoolKind::Dedicated,
                provider: "slurm".into(),
                pool: "a100".into(),
                priority: pb::PriorityClass::Urgent,
                gpu_class: "a100".into(),
                gpu_count: 8,
                node_count: 1,
                region: "dc".into(),
                team: String::new(),
                project: String::new(),
                chain_id: String::new(),
                chain_stage: String::new(),
                labels: Default::default(),
            })),
        }])
    }

    /// The instrument set and one paused-clock gauge, checked against the output of `Telemetry::new` before it
    /// was split into groups (identical then, apart from the timing-dependent store size).
    #[tokio::test(start_paused = true)]
    async fn every_instrument_group_is_registered_and_exposed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let clock = Clock::starting_at(T0 + 60_000);
        let limiter = crate::index::labels::LabelLimiter::new(&Default::default());
        let index = SharedIndex::new(JobIndex::new_at(
            [("slurm/a/1".to_string(), waiting_job())].into_iter().collect(),
            Default::default(),
            1,
            SloEngine::new(SloDef::defaults()),
            limiter,
            T0 + 60_000,
        ));
        let board = AlertBoard::default();
        board.insert(AlertRecord {
            key: "burn/urgent-start/page".into(),
            labels: [("alertname".to_string(), "StartlineSLOBurnRate".to_string())].into_iter().collect(),
            annotations: Default::default(),
            starts_at_ms: T0,
            resolved_at_ms: None,
        });
        let sources = Sources {
            nodes: Default::default(),
            chain_slos: Default::default(),
            index,
            stats: Arc::new(IngestStats::default()),
            http: Arc::new(crate::api::serve::HttpStats::default()),
            board,
            store: Store::open(dir.path()).expect("store"),
            health: Arc::new(crate::health::Health::default()),
            clock,
            auth: Arc::new(crate::auth::Auth::open()),
        };
        let t = Telemetry::new(sources, None, DEFAULT_MAX_SERIES).expect("telemetry");
        let labels = Arc::new(JobLabels {
            pool_kind: "dedicated",
            provider: "slurm".into(),
            pool: "a100".into(),
            priority: "urgent",
            gpu_class: "a100".into(),
            region: "dc".into(),
            team: "".into(),
        });
        t.record(&[
            Observation::Started { labels: labels.clone(), ttfs_seconds: 12.0 },
            Observation::WaitSegment { labels: labels.clone(), segment: "queued:capacity".into(), seconds: 10.0 },
            Observation::Waited { labels: labels.clone(), gpu_seconds: 80.0 },
            Observation::Finished { labels: labels.clone(), outcome: pb::Outcome::Succeeded, before_start: false },
            Observation::Finished { labels: labels.clone(), outcome: pb::Outcome::Cancelled, before_start: true },
            Observation::Preempted { labels: labels.clone(), count: 1 },
            Observation::LostWork { labels, gpu_seconds: 8.0 },
        ]);
        t.record_commit(Duration::from_millis(2));
        let text = t.prometheus_text().expect("text");
        // The SLO thresholds are bucket boundaries (600 s and 7200 s are also standard ones; 2700 s is not).
        assert_eq!(
            ttfs_boundaries(&[2_700_000, 600_000]),
            [
                1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 2700.0, 3600.0, 7200.0, 14400.0,
                28800.0, 43200.0, 86400.0, 172800.0, 345600.0, 604800.0
            ]
        );
        assert!(text.contains("startline_jobs_ended_before_start_total{"), "{text}");
        // Sorted by name, as the Prometheus registry gathers them; every group of `Telemetry::new` is there.
        assert_eq!(
            families(&text),
            [
                "process_cpu_seconds_total counter",
                "process_open_fds gauge",
                "process_resident_memory_bytes gauge",
                "process_start_time_seconds gauge",
                "startline_alerts_firing gauge",
                "startline_build_info gauge",
                "startline_collector_auth_insecure gauge",
                "startline_collector_auth_refusals_total counter",
                "startline_collector_auth_revoked_calls_total counter",
                "startline_collector_commit_duration_seconds histogram",
                "startline_collector_events_total counter",
                "startline_collector_history_deleted_through_seconds gauge",
                "startline_collector_http_connections gauge",
                "startline_collector_http_refusals_total counter",
                "startline_collector_http_timeouts_total counter",
                "startline_collector_jobs gauge",
                "startline_collector_jobs_deleted_total counter",
                "startline_collector_memory_budget_bytes gauge",
                "startline_collector_memory_bytes gauge",
                "startline_collector_metric_overflow_total counter",
                "startline_collector_refusals_total counter",
                "startline_collector_store_healthy gauge",
                "startline_collector_store_size_bytes gauge",
                "startline_collector_store_write_errors_total counter",
                "startline_collector_store_writes_halted gauge",
                "startline_jobs_ended_before_start_total counter",
                "startline_jobs_finished_total counter",
                "startline_jobs_lost_work_gpu_seconds_total counter",
                "startline_jobs_oldest_wait_seconds gauge",
                "startline_jobs_preemptions_total counter",
                "startline_jobs_started_total counter",
                "startline_jobs_time_to_first_step_seconds histogram",
                "startline_jobs_wait_duration_seconds histogram",
                "startline_jobs_wait_gpu_seconds_total counter",
                "startline_jobs_waiting gauge",
                "startline_jobs_waiting_gpus gauge",
                "startline_slo_burn_rate gauge",
                "startline_slo_compliance_ratio gauge",
                "startline_slo_decisions_total counter",
                "startline_slo_error_budget_remaining_ratio gauge",
                "startline_slo_jobs gauge",
                "startline_slo_jobs_waiting gauge",
                "startline_slo_objective_ratio gauge",
                "startline_slo_window_jobs gauge",
            ]
        );
        assert!(text.contains("startline_jobs_oldest_wait_seconds{pool=\"other\",pool_kind=\"dedicated\",priority=\"urgent\",provider=\"other\",otel_scope_name=\"startline-collector\"} 60\n"), "{text}");
        t.shutdown();
    }

    #[test]
    fn series_limit_admits_up_to_the_limit_then_folds_and_counts() {
        let l = SeriesLimit::new(2);
        let a = |v: &str| vec![KeyValue::new("pool", v.to_string())];
        assert_eq!(l.admit("startline.jobs.started", a("x"), true), a("x"));
        assert_eq!(l.admit("startline.jobs.started", a("y"), true), a("y"));
        // A third set overflows; seen sets stay admitted; another metric has its own budget.
        let over = vec![KeyValue::new("otel.metric.overflow", true)];
        assert_eq!(l.admit("startline.jobs.started", a("z"), true), over);
        assert_eq!(l.admit("startline.jobs.started", a("x"), true), a("x"));
        assert_eq!(l.admit("startline.jobs.started", a("w"), false), over);
        assert_eq!(l.admit("startline.jobs.finished", a("z"), true), a("z"));
        let o: std::collections::BTreeMap<_, _> = l.overflows().into_iter().collect();
        assert_eq!(o["startline.jobs.started"], 1, "the uncounted one is not counted");
        assert_eq!(o["startline.jobs.finished"], 0);
        assert_eq!(l.series("startline.jobs.started"), 2);
    }

    /// Past `max_series_per_metric`, measurements keep their values under the overflow set (totals stay exact)
    /// and are counted; the team attribute appears only where documented.
    #[tokio::test(start_paused = true)]
    async fn overflow_keeps_totals_and_is_counted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let limiter = crate::index::labels::LabelLimiter::new(&crate::index::labels::LabelSettings {
            team_attribute: true,
            max_values_per_label: 100,
            ..Default::default()
        });
        let index = SharedIndex::new(JobIndex::new_at(
            Default::default(),
            Default::default(),
            1,
            SloEngine::new(Vec::new()),
            limiter,
            T0,
        ));
        let sources = Sources {
            nodes: Default::default(),
            chain_slos: Default::default(),
            index,
            stats: Arc::new(IngestStats::default()),
            http: Arc::new(crate::api::serve::HttpStats::default()),
            board: AlertBoard::default(),
            store: Store::open(dir.path()).expect("store"),
            health: Arc::new(crate::health::Health::default()),
            clock: Clock::starting_at(T0),
            auth: Arc::new(crate::auth::Auth::open()),
        };
        let t = Telemetry::new(sources, None, 10).expect("telemetry");
        let mut obs = Vec::new();
        for i in 0..25 {
            let labels = Arc::new(JobLabels {
                pool_kind: "dedicated",
                provider: "slurm".into(),
                pool: format!("p{i}").into(),
                priority: "normal",
                gpu_class: "a100".into(),
                region: "dc".into(),
                team: "nlp".into(),
            });
            obs.push(Observation::Started { labels: labels.clone(), ttfs_seconds: 1.0 + i as f64 });
            obs.push(Observation::Waited { labels, gpu_seconds: 10.0 });
        }
        t.record(&obs);
        let text = t.prometheus_text().expect("text");
        let value = |prefix: &str| -> f64 {
            text.lines()
                .filter(|l| l.starts_with(prefix))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        assert_eq!(value("startline_jobs_started_total{"), 25.0, "{text}");
        assert_eq!(value("startline_jobs_started_total{otel_metric_overflow=\"true\""), 15.0, "{text}");
        assert_eq!(value("startline_jobs_time_to_first_step_seconds_count{"), 25.0);
        assert_eq!(value("startline_jobs_wait_gpu_seconds_total{"), 250.0);
        assert_eq!(
            value("startline_collector_metric_overflow_total{metric=\"startline.jobs.started\""),
            15.0,
            "{text}"
        );
        assert_eq!(
            value("startline_collector_metric_overflow_total{metric=\"startline.jobs.time_to_first_step\""),
            15.0
        );
        assert_eq!(value("startline_collector_metric_overflow_total{metric=\"startline.jobs.finished\""), 0.0);
        // team: on the TTFS histogram and GPU-seconds waited, not on the started counter.
        assert!(text
            .lines()
            .any(|l| l.starts_with("startline_jobs_time_to_first_step_seconds_count{") && l.contains("team=\"nlp\"")));
        assert!(text
            .lines()
            .any(|l| l.starts_with("startline_jobs_wait_gpu_seconds_total{") && l.contains("team=\"nlp\"")));
        assert!(!text.lines().any(|l| l.starts_with("startline_jobs_started_total{") && l.contains("team=")));
        // Never more than the limit plus the overflow set.
        let sets = text.lines().filter(|l| l.starts_with("startline_jobs_started_total{")).count();
        assert_eq!(sets, 11, "{text}");
        t.shutdown();
    }

    #[tokio::test]
    async fn otlp_client_fields_are_read_checked_and_redacted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = dir.path().join("token");
        std::fs::write(&token, "otlp-t0ken\n").expect("write");
        let headers: std::collections::BTreeMap<String, String> =
            [("X-Scope-OrgID".to_string(), "tenant-s3cret".to_string())].into_iter().collect();
        let mut errs = Vec::new();
        let files = OtlpClientFiles {
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
            bearer_token_file: Some(&token),
            headers: &headers,
        };
        let (tls, h) = otlp_client_settings(&mut errs, "metrics", Some("https://otel.example:4317"), files);
        assert!(errs.is_empty(), "{errs:?}");
        assert!(tls.ca.is_none());
        let keys: Vec<&str> = h.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["x-scope-orgid", "authorization"]);
        assert_eq!(h[1].1.expose(), "Bearer otlp-t0ken");
        let settings = OtlpSettings {
            endpoint: "https://otel.example:4317".into(),
            interval: Duration::from_secs(30),
            tls,
            headers: h,
            histograms: OtlpHistograms::Exponential,
        };
        let debug = format!("{settings:?}");
        assert!(!debug.contains("otlp-t0ken") && !debug.contains("tenant-s3cret"), "{debug}");
        // An https endpoint with the built-in roots builds (no CA file needed).
        let (providers, _) = meter_providers(Some(settings), DEFAULT_MAX_SERIES).expect("exporter with webpki roots");
        assert_eq!(providers.len(), 2, "Prometheus and OTLP");

        let bad: std::collections::BTreeMap<String, String> =
            [("Authorization".to_string(), "Bearer x".to_string()), ("bad key".to_string(), "v".to_string())]
                .into_iter()
                .collect();
        let mut errs = Vec::new();
        let files = OtlpClientFiles {
            ca_file: Some(std::path::Path::new("/nonexistent/ca.pem")),
            client_cert_file: None,
            client_key_file: None,
            bearer_token_file: Some(std::path::Path::new("/nonexistent/token")),
            headers: &bad,
        };
        otlp_client_settings(&mut errs, "metrics", Some("http://127.0.0.1:4317"), files);
        let prefixes = [
            "metrics.otlp_ca_file: cannot read /nonexistent/ca.pem",
            "metrics.otlp_headers.Authorization: use otlp_bearer_token_file",
            "metrics.otlp_headers.bad key: not a valid gRPC metadata key",
            "metrics.otlp_bearer_token_file: cannot read /nonexistent/token",
        ];
        assert_eq!(errs.len(), prefixes.len(), "{errs:#?}");
        for (e, p) in errs.iter().zip(prefixes) {
            assert!(e.starts_with(p), "{e:?} should start with {p:?}");
        }
    }
}
