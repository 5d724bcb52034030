//! Metrics: one OpenTelemetry `SdkMeterProvider` with a Prometheus reader (served at `/metrics`) and, when
//! configured, a periodic OTLP/gRPC exporter (plain or TLS with a CA file or the built-in webpki roots, an
//! optional client certificate, and gRPC metadata such as a bearer token or a tenant header: [`OtlpSettings`]). Names follow OpenTelemetry conventions (dot-separated, unit in
//! metadata); every attribute is bounded (closed enums, config-listed or capped values, SLO names from config),
//! never a job id. `docs/METRICS.md` specifies each metric.
//!
//! Synchronous instruments (histograms, counters) are recorded by the committer from job transitions
//! ([`jobs`]); gauges are observed at collection time from state kept incrementally (no scan of all jobs).

/// Moved to the index (derived per-job metric state lives beside the jobs); re-exported for old paths.
pub use crate::index::{footprint as jobs, labels};

pub mod rules;

use crate::alert::client::{read_secret_file, ClientTlsFiles, Secret};
use crate::alert::AlertBoard;
use crate::health::IngestStats;
use crate::index::SharedIndex;
use crate::store::Store;
use crate::time::Clock;
use jobs::Observation;
use labels::JobLabels;
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

/// Reads and checks the OTLP client fields of `[metrics]` (files read now; one message per problem, naming the
/// field, never a secret): the TLS files, then the metadata (headers, and `authorization` from the token file).
pub fn otlp_client_settings(
    errs: &mut Vec<String>,
    endpoint: Option<&str>,
    f: OtlpClientFiles<'_>,
) -> (ClientTlsFiles, Vec<(String, Secret)>) {
    let tls = ClientTlsFiles::read(errs, "metrics.otlp_", f.ca_file, f.client_cert_file, f.client_key_file);
    let is_https = endpoint.is_some_and(|e| e.starts_with("https://"));
    if (tls.ca.is_some() || tls.identity.is_some()) && !is_https {
        errs.push("metrics.otlp_ca_file: TLS files need an https:// otlp_endpoint".to_string());
    }
    let mut headers = Vec::new();
    for (k, v) in f.headers {
        let key = k.to_ascii_lowercase();
        let field = format!("metrics.otlp_headers.{k}");
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
        match read_secret_file("metrics.otlp_bearer_token_file", p) {
            Ok(t) => headers.push(("authorization".to_string(), Secret::new(format!("Bearer {}", t.expose())))),
            Err(e) => errs.push(e),
        }
    }
    (tls, headers)
}

/// Failure to set up metrics.
#[derive(Debug, thiserror::Error)]
#[error("metrics: {0}")]
pub struct TelemetryError(String);

/// The synchronous instruments.
struct Instruments {
    ttfs: Histogram<f64>,
    wait: Histogram<f64>,
    started: Counter<u64>,
    finished: Counter<u64>,
    ended_before_start: Counter<u64>,
    preemptions: Counter<u64>,
    lost_work: Counter<f64>,
    commit: Histogram<f64>,
}

/// The metrics pipeline.
pub struct Telemetry {
    provider: SdkMeterProvider,
    registry: prometheus::Registry,
    instruments: Instruments,
}

/// What the gauges read at collection time.
#[derive(Clone)]
pub struct Sources {
    /// Jobs, SLOs and job gauges.
    pub index: SharedIndex,
    /// Ingest counters.
    pub stats: Arc<IngestStats>,
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

impl Telemetry {
    /// Builds the provider, its readers and every instrument. Observable instruments are registered in a fixed
    /// order, group by group.
    pub fn new(sources: Sources, otlp: Option<OtlpSettings>) -> Result<Telemetry, TelemetryError> {
        let (provider, registry) = meter_provider(otlp)?;
        let meter = provider.meter("startline-collector");
        // Every configured SLO threshold is a bucket boundary, so an `le`-based SLI is exact at the threshold.
        let thresholds: Vec<i64> = sources.index.read().slo.defs().iter().map(|d| d.threshold_ms).collect();
        let instruments = Instruments::new(&meter, ttfs_boundaries(&thresholds));
        observe_waiting_jobs(&meter, &sources);
        observe_slo_status(&meter, &sources);
        observe_slo_windows(&meter, &sources);
        observe_alerts(&meter, &sources);
        observe_ingest(&meter, &sources);
        observe_auth(&meter, &sources);
        observe_store(&meter, &sources);
        observe_memory(&meter, &sources);
        observe_process(&meter);
        Ok(Telemetry { provider, registry, instruments })
    }

    /// Registers `startline.alerts.notifications`: each notifier's outcomes (`sent`, `failed` attempts,
    /// `abandoned` after every retry, `dropped` on a full queue) by its config name. Called once, when the
    /// notifiers start (after the provider is built, which the SDK allows).
    pub fn observe_notifiers(&self, stats: Arc<crate::alert::AlertStats>) {
        let _ = self
            .provider
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

    /// Records job transitions.
    pub fn record(&self, observations: &[Observation]) {
        let i = &self.instruments;
        for o in observations {
            match o {
                Observation::Started { labels, ttfs_seconds } => {
                    let a = job_attrs(labels);
                    i.ttfs.record(*ttfs_seconds, &a);
                    i.started.add(1, &a);
                }
                Observation::WaitSegment { labels, segment, seconds } => {
                    let mut a = job_attrs(labels);
                    a.push(KeyValue::new("segment", segment.clone()));
                    i.wait.record(*seconds, &a);
                }
                Observation::Finished { labels, outcome, before_start } => {
                    use startline_proto::labels::Label;
                    let mut a = job_attrs(labels);
                    a.push(KeyValue::new("outcome", outcome.label()));
                    i.finished.add(1, &a);
                    if *before_start {
                        i.ended_before_start.add(1, &a);
                    }
                }
                Observation::Preempted { labels, count } => i.preemptions.add(*count, &job_attrs(labels)),
                Observation::LostWork { labels, gpu_seconds } => i.lost_work.add(*gpu_seconds, &job_attrs(labels)),
            }
        }
    }

    /// Records one group commit's duration.
    pub fn record_commit(&self, d: Duration) {
        self.instruments.commit.record(d.as_secs_f64(), &[]);
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
        if let Err(e) = self.provider.shutdown() {
            tracing::debug!(error = %e, "metrics shutdown");
        }
    }
}

/// The provider with its readers: Prometheus (into the returned registry) and, when configured, OTLP push.
fn meter_provider(otlp: Option<OtlpSettings>) -> Result<(SdkMeterProvider, prometheus::Registry), TelemetryError> {
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
    let mut builder = SdkMeterProvider::builder().with_resource(resource).with_reader(prom);
    if let Some(o) = otlp {
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
        builder = builder.with_reader(
            opentelemetry_sdk::metrics::PeriodicReader::builder(exporter).with_interval(o.interval).build(),
        );
    }
    Ok((builder.build(), registry))
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
                .f64_histogram("startline.job.time_to_first_step")
                .with_unit("s")
                .with_description("Time from submit to the first training step, recorded when a job first starts")
                .with_boundaries(ttfs_boundaries)
                .build(),
            wait: meter
                .f64_histogram("startline.job.wait.duration")
                .with_unit("s")
                .with_description("Time a job spent in each wait segment before its first step (reason or phase)")
                .with_boundaries(WAIT_BOUNDARIES.to_vec())
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
                .u64_counter("startline.job.preemptions")
                .with_unit("{preemption}")
                .with_description("Preemptions of running jobs")
                .build(),
            lost_work: meter
                .f64_counter("startline.job.lost_work.gpu_seconds")
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

/// Gauges of the jobs waiting now: how many per segment, and the oldest wait.
fn observe_waiting_jobs(meter: &Meter, sources: &Sources) {
    let s = sources.clone();
    let _ = meter
        .i64_observable_gauge("startline.jobs.waiting")
        .with_unit("{job}")
        .with_description(
            "Jobs waiting now, by wait segment (queued:<reason>, assigned, preparing:<phase>, unreported)",
        )
        .with_callback(move |o| {
            let idx = s.index.read();
            for ((labels, segment), n) in &idx.gauges.waiting {
                let mut a = job_attrs(labels);
                a.push(KeyValue::new("segment", segment.clone()));
                o.observe(*n, &a);
            }
        })
        .build();
    let s = sources.clone();
    let _ = meter
        .f64_observable_gauge("startline.job.oldest_wait")
        .with_unit("s")
        .with_description("Age of the oldest waiting job, by pool and priority")
        .with_callback(move |o| {
            let now = s.clock.now_ms();
            let idx = s.index.read();
            for ((kind, provider, pool, priority), age) in idx.gauges.oldest_ages(now) {
                o.observe(
                    age,
                    &[
                        KeyValue::new("pool.kind", kind),
                        KeyValue::new("provider", provider.to_string()),
                        KeyValue::new("pool", pool.to_string()),
                        KeyValue::new("priority", priority),
                    ],
                );
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
        .with_unit("1")
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
        .i64_observable_gauge("startline.slo.jobs")
        .with_unit("{job}")
        .with_description(
            "Jobs decided over the SLO's window, by result (good, bad); breached_waiting and pending are now",
        )
        .with_callback(move |o| {
            for st in slo_statuses(&s) {
                for (result, n) in [
                    ("good", st.good),
                    ("bad", st.bad),
                    ("breached_waiting", st.breached_waiting),
                    ("pending", st.pending),
                ] {
                    o.observe(n as i64, &[KeyValue::new("slo", st.name.clone()), KeyValue::new("result", result)]);
                }
            }
        })
        .build();
}

/// Gauges of each SLO's burn-rate windows (counts to sum across collectors) and its objective.
fn observe_slo_windows(meter: &Meter, sources: &Sources) {
    let s = sources.clone();
    let _ = meter
        .i64_observable_gauge("startline.slo.window.jobs")
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
        .i64_observable_gauge("startline.alerts.firing")
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
        "Batches and connections refused at the edge, by reason (queue_full with when_full = reject, \
         connection_limit over grpc.max_connections, handshake_timeout past grpc.handshake_timeout, tls_handshake \
         for failed TLS handshakes)",
        |st| {
            [
                ("queue_full", &st.refused_full),
                ("connection_limit", &st.connections_refused),
                ("handshake_timeout", &st.connections_timed_out),
                ("tls_handshake", &st.tls_handshake_failures),
            ]
        },
    );
}

/// Authentication refusals by reason, and whether the collector runs exposed without authentication.
fn observe_auth(meter: &Meter, sources: &Sources) {
    let a = sources.auth.clone();
    let _ = meter
        .u64_observable_counter("startline.collector.auth.refusals")
        .with_unit("{refusal}")
        .with_description(
            "Requests and events refused by authentication or authorization, by reason (missing, malformed, \
             unknown, scope, rate_limited, quota; not_permitted counts events outside the identity's job-id prefixes or \
             sources)",
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
}

/// Storage health, write errors, reopens and size on disk.
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
        .u64_observable_counter("startline.collector.store.reopens")
        .with_description("Times the store was reopened to recover from a write failure")
        .with_callback(move |o| o.observe(s.health.reopens(), &[]))
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
        .u64_observable_gauge("startline.collector.jobs")
        .with_description("Jobs tracked: `residence=hot` in memory with their events, `folded` as compact summaries")
        .with_callback(move |o| {
            let m = s.index.read().memory();
            o.observe(m.hot_jobs as u64, &[KeyValue::new("residence", "hot")]);
            o.observe(m.folded_jobs as u64, &[KeyValue::new("residence", "folded")]);
        })
        .build();
    let s = sources.clone();
    let _ = meter
        .u64_observable_gauge("startline.collector.memory")
        .with_unit("By")
        .with_description(
            "Estimated bytes by part: hot_jobs, folded_jobs (index), store_cache (sled's page cache budget, \
             store.cache_mib)",
        )
        .with_callback(move |o| {
            let m = s.index.read().memory();
            o.observe(m.hot_bytes as u64, &[KeyValue::new("part", "hot_jobs")]);
            o.observe(m.folded_bytes as u64, &[KeyValue::new("part", "folded_jobs")]);
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
        let limiter = labels::LabelLimiter::new(&Default::default());
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
            index,
            stats: Arc::new(IngestStats::default()),
            board,
            store: Store::open(dir.path()).expect("store"),
            health: Arc::new(crate::health::Health::default()),
            clock,
            auth: Arc::new(crate::auth::Auth::open()),
        };
        let t = Telemetry::new(sources, None).expect("telemetry");
        let labels = Arc::new(JobLabels {
            pool_kind: "dedicated",
            provider: "slurm".into(),
            pool: "a100".into(),
            priority: "urgent",
            gpu_class: "a100".into(),
            region: "dc".into(),
        });
        t.record(&[
            Observation::Started { labels: labels.clone(), ttfs_seconds: 12.0 },
            Observation::WaitSegment { labels: labels.clone(), segment: "queued:capacity".into(), seconds: 10.0 },
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
                "startline_collector_commit_duration_seconds histogram",
                "startline_collector_events_total counter",
                "startline_collector_jobs gauge",
                "startline_collector_memory_bytes gauge",
                "startline_collector_refusals_total counter",
                "startline_collector_store_healthy gauge",
                "startline_collector_store_reopens_total counter",
                "startline_collector_store_size_bytes gauge",
                "startline_collector_store_write_errors_total counter",
                "startline_job_lost_work_gpu_seconds_total counter",
                "startline_job_oldest_wait_seconds gauge",
                "startline_job_preemptions_total counter",
                "startline_job_time_to_first_step_seconds histogram",
                "startline_job_wait_duration_seconds histogram",
                "startline_jobs_ended_before_start_total counter",
                "startline_jobs_finished_total counter",
                "startline_jobs_started_total counter",
                "startline_jobs_waiting gauge",
                "startline_slo_burn_rate_ratio gauge",
                "startline_slo_compliance_ratio gauge",
                "startline_slo_decisions_total counter",
                "startline_slo_error_budget_remaining_ratio gauge",
                "startline_slo_jobs gauge",
                "startline_slo_objective_ratio gauge",
                "startline_slo_window_jobs gauge",
            ]
        );
        assert!(text.contains("startline_job_oldest_wait_seconds{pool=\"other\",pool_kind=\"dedicated\",priority=\"urgent\",provider=\"other\",otel_scope_name=\"startline-collector\"} 60\n"), "{text}");
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
        let (tls, h) = otlp_client_settings(&mut errs, Some("https://otel.example:4317"), files);
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
        };
        let debug = format!("{settings:?}");
        assert!(!debug.contains("otlp-t0ken") && !debug.contains("tenant-s3cret"), "{debug}");
        // An https endpoint with the built-in roots builds (no CA file needed).
        let (provider, _) = meter_provider(Some(settings)).expect("exporter with webpki roots");
        drop(provider);

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
        otlp_client_settings(&mut errs, Some("http://127.0.0.1:4317"), files);
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
