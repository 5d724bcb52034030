//! Configuration in two phases: [`FileConfig`] mirrors the TOML file (unknown keys are errors), CLI flags
//! override it, and [`FileConfig::validate`] turns it into the [`Config`] the rest of the collector uses,
//! reporting every problem at once before any port is bound.

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The TOML file, as written. Every field is optional; defaults give a collector on loopback with sled under
/// `./startline-data`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `[store]`
    #[serde(default)]
    pub store: StoreSection,
    /// `[grpc]`
    #[serde(default)]
    pub grpc: GrpcSection,
    /// `[http]`
    #[serde(default)]
    pub http: HttpSection,
    /// `[ingest]`
    #[serde(default)]
    pub ingest: IngestSection,
    /// `[[slo]]`: start objectives. When none are given, the built-in `urgent-start` and `normal-start` apply.
    #[serde(default)]
    pub slo: Vec<SloSection>,
    /// `[alerts]`
    #[serde(default)]
    pub alerts: AlertsSection,
    /// `[metrics]`
    #[serde(default)]
    pub metrics: MetricsSection,
}

/// `[metrics]`: bounded attribute values and OTLP push.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    /// Providers exported as themselves (others: `other`). Empty: the first `max_values_per_label` seen.
    #[serde(default)]
    pub providers: Vec<String>,
    /// Pools exported as themselves.
    #[serde(default)]
    pub pools: Vec<String>,
    /// GPU classes exported as themselves.
    #[serde(default)]
    pub gpu_classes: Vec<String>,
    /// Regions exported as themselves.
    #[serde(default)]
    pub regions: Vec<String>,
    /// Cap on distinct values of an unlisted attribute. Default 32.
    pub max_values_per_label: Option<usize>,
    /// OTLP/gRPC endpoint to push to, e.g. `http://127.0.0.1:4317`. Unset: no push.
    pub otlp_endpoint: Option<String>,
    /// OTLP protocol: only `grpc` is built.
    pub otlp_protocol: Option<String>,
    /// OTLP push interval. Default 30s.
    pub otlp_interval: Option<String>,
}

/// Validated metrics settings.
#[derive(Debug, Clone)]
pub struct MetricsConfig {
    /// Attribute bounds.
    pub labels: crate::export::labels::LabelSettings,
    /// OTLP push, when configured.
    pub otlp: Option<crate::export::OtlpSettings>,
}

/// `[[slo]]`: one start objective.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SloSection {
    /// Unique name, `[a-z0-9-]{1,64}`.
    pub name: Option<String>,
    /// Free text.
    pub description: Option<String>,
    /// Time to first step that counts as good, e.g. `"10m"`.
    pub threshold: Option<String>,
    /// Target share of good jobs, in percent, e.g. `99` or `99.5`.
    pub objective: Option<f64>,
    /// Rolling window, e.g. `"28d"`. Default 28d.
    pub window: Option<String>,
    /// Page on each covered job that crosses the threshold while waiting. Default: true when the selector is
    /// limited to urgent jobs.
    pub page_on_breach: Option<bool>,
    /// Leave out jobs cancelled by the user before their deadline. Default true.
    pub exclude_cancelled: Option<bool>,
    /// Which jobs it covers.
    #[serde(default)]
    pub selector: SelectorSection,
}

/// `[slo.selector]`: empty lists match everything.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelectorSection {
    /// `normal`, `urgent`.
    #[serde(default)]
    pub priority: Vec<String>,
    /// `managed`, `dedicated`.
    #[serde(default)]
    pub pool_kind: Vec<String>,
    /// Provider names.
    #[serde(default)]
    pub provider: Vec<String>,
    /// Pool names.
    #[serde(default)]
    pub pool: Vec<String>,
    /// GPU classes.
    #[serde(default)]
    pub gpu_class: Vec<String>,
    /// Regions or sites.
    #[serde(default)]
    pub region: Vec<String>,
    /// Smallest GPU count (job size), inclusive.
    pub gpu_count_min: Option<u32>,
    /// Largest GPU count, inclusive.
    pub gpu_count_max: Option<u32>,
    /// Submit time of day, `"HH:MM-HH:MM"` (may wrap midnight), in `timezone`.
    pub hours: Option<String>,
    /// IANA time zone for `hours`, e.g. `"Europe/Moscow"`. Default `UTC`.
    pub timezone: Option<String>,
}

/// `[alerts]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertsSection {
    /// Alertmanager base URLs (`http://host:port`); alerts go to `/api/v2/alerts`.
    #[serde(default)]
    pub alertmanager: Vec<String>,
    /// Generic JSON webhook URLs.
    #[serde(default)]
    pub webhook: Vec<String>,
    /// How often burn rates are evaluated. Default 10s.
    pub evaluation_interval: Option<String>,
    /// How often firing alerts are re-posted to Alertmanager (their `endsAt` is 3 intervals ahead). Default 1m.
    pub resend_interval: Option<String>,
    /// Low-volume guard: a burn-rate alert needs at least this many decided jobs in its long window. Default 5.
    pub min_jobs: Option<u64>,
    /// How long resolved alerts stay listed. Default 24h.
    pub resolved_retention: Option<String>,
    /// Per-job pages are sent only for crossings at most this old when first seen (an adapter catching up on
    /// history must not page for jobs that breached days ago). Default 1h.
    pub page_max_age: Option<String>,
}

/// Validated alerting settings.
#[derive(Debug, Clone)]
pub struct AlertConfig {
    /// Alertmanager base URLs.
    pub alertmanagers: Vec<String>,
    /// Webhook URLs.
    pub webhooks: Vec<String>,
    /// Burn-rate evaluation interval.
    pub evaluation_interval: Duration,
    /// Re-post interval for firing alerts.
    pub resend_interval: Duration,
    /// Low-volume guard.
    pub min_jobs: u64,
    /// Resolved-alert retention.
    pub resolved_retention: Duration,
    /// Oldest crossing that still pages.
    pub page_max_age: Duration,
}

/// `[store]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSection {
    /// Directory of the sled database. Default `./startline-data`.
    pub path: Option<PathBuf>,
    /// How often job snapshots are checkpointed, e.g. `"2s"`. Default 2s.
    pub checkpoint_interval: Option<String>,
    /// Jobs that ended longer ago than this are deleted with their events, e.g. `"90d"`. Default 90d;
    /// `"0s"` keeps everything forever.
    pub retention: Option<String>,
    /// How often expired jobs are looked for. Default 10m.
    pub retention_interval: Option<String>,
    /// Most events stored per job; later events of a job that has this many are rejected. Default 100000.
    pub max_events_per_job: Option<usize>,
    /// Ended jobs unchanged for this long are folded out of memory into a compact summary (their events stay
    /// on disk), e.g. `"5m"`. Default 5m; `"0s"` keeps every job in memory.
    pub fold_after: Option<String>,
    /// How often jobs to fold are looked for. Default 10s.
    pub fold_interval: Option<String>,
    /// sled's page cache, MiB. Default 64.
    pub cache_mib: Option<usize>,
}

/// `[grpc]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcSection {
    /// Listen address for ingest. Default `127.0.0.1:50051`.
    pub listen: Option<String>,
    /// Largest gRPC message accepted, in bytes, refused from its length prefix before it is read. Default 4 MiB:
    /// a full batch of 10000 events of about 250 bytes (a `submitted` with a few labels) is 2.5 MB.
    pub max_message_bytes: Option<usize>,
    /// Most events in one batch, counted before the batch is decoded. Default 10000.
    pub max_batch_events: Option<usize>,
    /// Most concurrent streams per connection (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`). Default 100.
    pub max_concurrent_streams: Option<u32>,
    /// Batches one stream may have waiting for their ack. Default 32.
    pub max_inflight_batches: Option<usize>,
    /// Most gRPC connections open at once; more are closed as they are accepted. Default 4096.
    pub max_connections: Option<usize>,
    /// Time a new connection has to send the HTTP/2 preface and first frame, e.g. `"10s"`. Default 10s.
    pub handshake_timeout: Option<String>,
    /// HTTP/2 keepalive: how often an idle connection is pinged. Default 30s.
    pub keepalive_interval: Option<String>,
    /// HTTP/2 keepalive: how long a ping may go unanswered before the connection is closed. Default 10s.
    pub keepalive_timeout: Option<String>,
    /// At shutdown, how long open streams get to finish their acks before every gRPC connection is closed.
    /// Default 10s.
    pub drain_timeout: Option<String>,
}

/// Validated limits and timeouts of gRPC connections.
#[derive(Debug, Clone, Copy)]
pub struct GrpcConnections {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Deadline for the HTTP/2 handshake of a new connection.
    pub handshake_timeout: Duration,
    /// HTTP/2 ping interval.
    pub keepalive_interval: Duration,
    /// HTTP/2 ping timeout.
    pub keepalive_timeout: Duration,
    /// Shutdown drain deadline, after which every gRPC connection is closed.
    pub drain_timeout: Duration,
}

/// `[http]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSection {
    /// Listen address of the JSON API and dashboard. Default `127.0.0.1:8080`.
    pub listen: Option<String>,
    /// Most jobs one page of `GET /api/v1/jobs` returns. Default 1000.
    pub max_page_size: Option<usize>,
}

/// `[ingest]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngestSection {
    /// Batches that may wait for the committer. Default 256.
    pub queue_capacity: Option<usize>,
    /// What a full queue does: `"wait"` (default: the stream stops being read, so HTTP/2 flow control slows the
    /// client) or `"reject"` (answer RESOURCE_EXHAUSTED at once; the client retries later).
    pub when_full: Option<String>,
    /// Most events one group commit writes. Default 32768.
    pub group_commit_max_events: Option<usize>,
    /// How far ahead of the collector's clock `occurred_at` may be, e.g. `"5m"`. Default 5m.
    pub max_future_skew: Option<String>,
    /// Most extra labels per job. Default 16.
    pub max_labels: Option<usize>,
}

/// What a full ingest queue does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// Wait for room; backpressure reaches the client through flow control.
    Wait,
    /// Answer `RESOURCE_EXHAUSTED` at once.
    Reject,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// sled directory.
    pub store_path: PathBuf,
    /// Checkpoint interval.
    pub checkpoint_interval: Duration,
    /// Ended jobs older than this are deleted (None: keep forever).
    pub retention: Option<Duration>,
    /// How often expired jobs are looked for.
    pub retention_interval: Duration,
    /// Most events stored per job.
    pub max_events_per_job: usize,
    /// Ended jobs unchanged for this long are folded out of memory (None: never).
    pub fold_after: Option<Duration>,
    /// How often fold candidates are looked for.
    pub fold_interval: Duration,
    /// sled's page cache, bytes.
    pub cache_bytes: u64,
    /// gRPC listen address.
    pub grpc_listen: SocketAddr,
    /// Largest gRPC message, bytes.
    pub max_message_bytes: usize,
    /// Most events per batch.
    pub max_batch_events: usize,
    /// Most concurrent HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
    /// Batches in flight per stream.
    pub max_inflight_batches: usize,
    /// Connection limits and timeouts.
    pub grpc_connections: GrpcConnections,
    /// HTTP listen address.
    pub http_listen: SocketAddr,
    /// Page size cap for job listings.
    pub max_page_size: usize,
    /// Ingest queue capacity, in batches.
    pub queue_capacity: usize,
    /// Full-queue policy.
    pub when_full: WhenFull,
    /// Group commit cap, in events.
    pub group_commit_max_events: usize,
    /// Event limits shared with the protocol's validation.
    pub limits: startline_proto::Limits,
    /// Start objectives.
    pub slos: Vec<crate::slo::SloDef>,
    /// Alerting.
    pub alerts: AlertConfig,
    /// Metrics.
    pub metrics: MetricsConfig,
}

/// Every problem found in a configuration.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n  - {}", .0.join("\n  - "))]
pub struct ConfigErrors(pub Vec<String>);

/// Failure to read or parse the file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML is malformed or has unknown keys.
    #[error("cannot parse config file {path}: {message}")]
    Parse {
        /// The path.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
}

impl FileConfig {
    /// Reads and parses a TOML file.
    pub fn load(path: &std::path::Path) -> Result<FileConfig, LoadError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| LoadError::Read { path: path.to_path_buf(), source })?;
        Self::parse(&text).map_err(|message| LoadError::Parse { path: path.to_path_buf(), message })
    }

    /// Parses TOML text.
    pub fn parse(text: &str) -> Result<FileConfig, String> {
        toml::from_str(text).map_err(|e| e.to_string().trim().to_string())
    }

    /// Checks every field and builds the validated config, or lists every problem.
    pub fn validate(&self) -> Result<Config, ConfigErrors> {
        let mut errs = Vec::new();
        let addr = |errs: &mut Vec<String>, name: &str, v: &Option<String>, def: &str| -> SocketAddr {
            let s = v.as_deref().unwrap_or(def);
            s.parse().unwrap_or_else(|_| {
                errs.push(format!("{name}: {s:?} is not a socket address like 127.0.0.1:8080"));
                SocketAddr::from(([127, 0, 0, 1], 0))
            })
        };
        let dur = |errs: &mut Vec<String>, name: &str, v: &Option<String>, def: Duration, min: Duration| match v {
            None => def,
            Some(s) => match humantime::parse_duration(s) {
                Ok(d) if d >= min => d,
                Ok(_) => {
                    errs.push(format!("{name}: {s:?} is shorter than {}", humantime::format_duration(min)));
                    def
                }
                Err(e) => {
                    errs.push(format!("{name}: {s:?} is not a duration like \"5m\": {e}"));
                    def
                }
            },
        };
        let range = |errs: &mut Vec<String>, name: &str, v: Option<usize>, def: usize, lo: usize, hi: usize| {
            let x = v.unwrap_or(def);
            if !(lo..=hi).contains(&x) {
                errs.push(format!("{name}: {x} is outside {lo}..={hi}"));
            }
            x
        };

        let store_path = self.store.path.clone().unwrap_or_else(|| PathBuf::from("./startline-data"));
        if store_path.as_os_str().is_empty() {
            errs.push("store.path: must not be empty".to_string());
        }
        let checkpoint_interval = dur(
            &mut errs,
            "store.checkpoint_interval",
            &self.store.checkpoint_interval,
            Duration::from_secs(2),
            Duration::from_millis(10),
        );
        let retention =
            dur(&mut errs, "store.retention", &self.store.retention, Duration::from_secs(90 * 86_400), Duration::ZERO);
        let retention = if retention.is_zero() {
            None
        } else if retention < Duration::from_secs(86_400) {
            errs.push(
                "store.retention: keep at least 1d (or \"0s\" for forever); SLO windows need the history".to_string(),
            );
            None
        } else {
            Some(retention)
        };
        let retention_interval = dur(
            &mut errs,
            "store.retention_interval",
            &self.store.retention_interval,
            Duration::from_secs(600),
            Duration::from_millis(100),
        );
        let max_events_per_job =
            range(&mut errs, "store.max_events_per_job", self.store.max_events_per_job, 100_000, 1, 10_000_000);
        let fold_after =
            dur(&mut errs, "store.fold_after", &self.store.fold_after, Duration::from_secs(300), Duration::ZERO);
        let fold_after = (!fold_after.is_zero()).then_some(fold_after);
        let fold_interval = dur(
            &mut errs,
            "store.fold_interval",
            &self.store.fold_interval,
            Duration::from_secs(10),
            Duration::from_millis(10),
        );
        let cache_bytes = range(&mut errs, "store.cache_mib", self.store.cache_mib, 64, 4, 1 << 20) as u64 * (1 << 20);
        let grpc_listen = addr(&mut errs, "grpc.listen", &self.grpc.listen, "127.0.0.1:50051");
        let http_listen = addr(&mut errs, "http.listen", &self.http.listen, "127.0.0.1:8080");
        if grpc_listen == http_listen && grpc_listen.port() != 0 {
            errs.push(format!("http.listen: {http_listen} is also grpc.listen"));
        }
        let max_message_bytes =
            range(&mut errs, "grpc.max_message_bytes", self.grpc.max_message_bytes, 4 << 20, 4096, 64 << 20);
        let max_batch_events =
            range(&mut errs, "grpc.max_batch_events", self.grpc.max_batch_events, 10_000, 1, 1_000_000);
        let max_concurrent_streams = range(
            &mut errs,
            "grpc.max_concurrent_streams",
            self.grpc.max_concurrent_streams.map(|v| v as usize),
            100,
            1,
            65_536,
        ) as u32;
        let max_inflight_batches =
            range(&mut errs, "grpc.max_inflight_batches", self.grpc.max_inflight_batches, 32, 1, 4096);
        let grpc_connections = GrpcConnections {
            max_connections: range(&mut errs, "grpc.max_connections", self.grpc.max_connections, 4096, 1, 1 << 20),
            handshake_timeout: dur(
                &mut errs,
                "grpc.handshake_timeout",
                &self.grpc.handshake_timeout,
                Duration::from_secs(10),
                Duration::from_millis(100),
            ),
            keepalive_interval: dur(
                &mut errs,
                "grpc.keepalive_interval",
                &self.grpc.keepalive_interval,
                Duration::from_secs(30),
                Duration::from_secs(1),
            ),
            keepalive_timeout: dur(
                &mut errs,
                "grpc.keepalive_timeout",
                &self.grpc.keepalive_timeout,
                Duration::from_secs(10),
                Duration::from_secs(1),
            ),
            drain_timeout: dur(
                &mut errs,
                "grpc.drain_timeout",
                &self.grpc.drain_timeout,
                Duration::from_secs(10),
                Duration::ZERO,
            ),
        };
        if grpc_connections.drain_timeout > Duration::from_secs(600) {
            errs.push("grpc.drain_timeout: at most 10m (a shutdown must finish)".to_string());
        }
        let max_page_size = range(&mut errs, "http.max_page_size", self.http.max_page_size, 1000, 1, 100_000);
        let queue_capacity = range(&mut errs, "ingest.queue_capacity", self.ingest.queue_capacity, 256, 1, 1 << 20);
        let group_commit_max_events = range(
            &mut errs,
            "ingest.group_commit_max_events",
            self.ingest.group_commit_max_events,
            32_768,
            1,
            10_000_000,
        );
        let when_full = match self.ingest.when_full.as_deref() {
            None | Some("wait") => WhenFull::Wait,
            Some("reject") => WhenFull::Reject,
            Some(other) => {
                errs.push(format!("ingest.when_full: {other:?} is not one of \"wait\", \"reject\""));
                WhenFull::Wait
            }
        };
        let skew = dur(
            &mut errs,
            "ingest.max_future_skew",
            &self.ingest.max_future_skew,
            Duration::from_secs(300),
            Duration::ZERO,
        );
        let max_labels = range(&mut errs, "ingest.max_labels", self.ingest.max_labels, 16, 0, 64);
        let slos =
            if self.slo.is_empty() { crate::slo::SloDef::defaults() } else { validate_slos(&self.slo, &mut errs) };
        let mut urls = |name: &str, list: &[String]| -> Vec<String> {
            for u in list {
                if let Err(e) = crate::alert::http::HttpUrl::parse(u) {
                    errs.push(format!("{name}: {u:?}: {e}"));
                }
            }
            list.to_vec()
        };
        let alertmanagers = urls("alerts.alertmanager", &self.alerts.alertmanager);
        let webhooks = urls("alerts.webhook", &self.alerts.webhook);
        let alerts = AlertConfig {
            alertmanagers,
            webhooks,
            evaluation_interval: dur(
                &mut errs,
                "alerts.evaluation_interval",
                &self.alerts.evaluation_interval,
                Duration::from_secs(10),
                Duration::from_millis(100),
            ),
            resend_interval: dur(
                &mut errs,
                "alerts.resend_interval",
                &self.alerts.resend_interval,
                Duration::from_secs(60),
                Duration::from_secs(1),
            ),
            min_jobs: self.alerts.min_jobs.unwrap_or(5),
            page_max_age: dur(
                &mut errs,
                "alerts.page_max_age",
                &self.alerts.page_max_age,
                Duration::from_secs(3600),
                Duration::from_secs(1),
            ),
            resolved_retention: dur(
                &mut errs,
                "alerts.resolved_retention",
                &self.alerts.resolved_retention,
                Duration::from_secs(86_400),
                Duration::from_secs(1),
            ),
        };
        let m = &self.metrics;
        let otlp_interval =
            dur(&mut errs, "metrics.otlp_interval", &m.otlp_interval, Duration::from_secs(30), Duration::from_secs(1));
        match m.otlp_protocol.as_deref() {
            None | Some("grpc") => {}
            Some(other) => {
                errs.push(format!("metrics.otlp_protocol: {other:?} is not supported; only \"grpc\" is built"))
            }
        }
        if let Some(e) = &m.otlp_endpoint {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                errs.push(format!("metrics.otlp_endpoint: {e:?} must start with http:// or https://"));
            }
        }
        let metrics = MetricsConfig {
            labels: crate::export::labels::LabelSettings {
                providers: m.providers.clone(),
                pools: m.pools.clone(),
                gpu_classes: m.gpu_classes.clone(),
                regions: m.regions.clone(),
                max_values_per_label: range(
                    &mut errs,
                    "metrics.max_values_per_label",
                    m.max_values_per_label,
                    32,
                    1,
                    1000,
                ),
            },
            otlp: m
                .otlp_endpoint
                .clone()
                .map(|endpoint| crate::export::OtlpSettings { endpoint, interval: otlp_interval }),
        };
        if let Some(r) = retention {
            for d in &slos {
                if (r.as_millis() as i64) < d.window_ms {
                    errs.push(format!(
                        "store.retention: {} is shorter than slo {:?}'s window; its figures would lose history",
                        humantime::format_duration(r),
                        d.name
                    ));
                }
            }
        }
        if !errs.is_empty() {
            return Err(ConfigErrors(errs));
        }
        Ok(Config {
            metrics,
            store_path,
            checkpoint_interval,
            retention,
            retention_interval,
            max_events_per_job,
            fold_after,
            fold_interval,
            cache_bytes,
            grpc_listen,
            max_message_bytes,
            max_batch_events,
            max_concurrent_streams,
            max_inflight_batches,
            grpc_connections,
            http_listen,
            max_page_size,
            queue_capacity,
            when_full,
            group_commit_max_events,
            limits: startline_proto::Limits {
                max_future_skew_ms: i64::try_from(skew.as_millis()).unwrap_or(i64::MAX),
                max_labels,
            },
            slos,
            alerts,
        })
    }
}

fn parse_hhmm(s: &str) -> Option<u32> {
    let (h, m) = s.trim().split_once(':')?;
    let (h, m): (u32, u32) = (h.parse().ok()?, m.parse().ok()?);
    (h <= 24 && m < 60 && h * 60 + m <= 1440).then_some(h * 60 + m)
}

fn validate_slos(sections: &[SloSection], errs: &mut Vec<String>) -> Vec<crate::slo::SloDef> {
    use startline_proto::labels::Label;
    use startline_proto::pb;
    let mut out = Vec::new();
    let mut names = std::collections::HashSet::new();
    for (i, s) in sections.iter().enumerate() {
        let at = format!("slo[{i}]");
        let name = s.name.clone().unwrap_or_default();
        if name.is_empty()
            || name.len() > 64
            || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            errs.push(format!("{at}.name: {name:?} must be 1-64 characters of [a-z0-9-]"));
        } else if !names.insert(name.clone()) {
            errs.push(format!("{at}.name: {name:?} is used twice"));
        }
        let threshold_ms = match s.threshold.as_deref().map(humantime::parse_duration) {
            None => {
                errs.push(format!("{at}.threshold: is required, e.g. \"10m\""));
                0
            }
            Some(Err(e)) => {
                errs.push(format!("{at}.threshold: {e}"));
                0
            }
            Some(Ok(d)) if d.is_zero() => {
                errs.push(format!("{at}.threshold: must be positive"));
                0
            }
            Some(Ok(d)) => d.as_millis() as i64,
        };
        let objective = match s.objective {
            Some(o) if o > 0.0 && o < 100.0 => o / 100.0,
            Some(o) => {
                errs.push(format!("{at}.objective: {o} must be a percentage strictly between 0 and 100"));
                0.99
            }
            None => {
                errs.push(format!("{at}.objective: is required, e.g. 99"));
                0.99
            }
        };
        let window_ms = match s.window.as_deref().map(humantime::parse_duration) {
            None => 28 * 86_400_000,
            Some(Ok(d)) if d >= Duration::from_secs(3600) && d <= Duration::from_secs(400 * 86_400) => {
                d.as_millis() as i64
            }
            Some(Ok(_)) => {
                errs.push(format!("{at}.window: must be between 1h and 400d"));
                28 * 86_400_000
            }
            Some(Err(e)) => {
                errs.push(format!("{at}.window: {e}"));
                28 * 86_400_000
            }
        };
        let sel = &s.selector;
        let mut enum_list = |field: &str, vals: &[String], all: &[&str]| {
            for v in vals {
                if !all.contains(&v.as_str()) {
                    errs.push(format!("{at}.selector.{field}: {v:?} is not one of {}", all.join(", ")));
                }
            }
        };
        enum_list("priority", &sel.priority, &["normal", "urgent"]);
        enum_list("pool_kind", &sel.pool_kind, &["managed", "dedicated"]);
        let priority: Vec<pb::PriorityClass> =
            sel.priority.iter().filter_map(|v| pb::PriorityClass::from_label(v)).collect();
        let pool_kind: Vec<pb::PoolKind> = sel.pool_kind.iter().filter_map(|v| pb::PoolKind::from_label(v)).collect();
        if let (Some(lo), Some(hi)) = (sel.gpu_count_min, sel.gpu_count_max) {
            if lo > hi {
                errs.push(format!("{at}.selector: gpu_count_min {lo} is above gpu_count_max {hi}"));
            }
        }
        let hours = match &sel.hours {
            None => {
                if sel.timezone.is_some() {
                    errs.push(format!("{at}.selector.timezone: only meaningful with hours"));
                }
                None
            }
            Some(h) => {
                let tz_name = sel.timezone.clone().unwrap_or_else(|| "UTC".into());
                let tz = tz::TimeZone::from_posix_tz(&tz_name);
                let range = h.split_once('-').and_then(|(a, b)| Some((parse_hhmm(a)?, parse_hhmm(b)?)));
                match (range, tz) {
                    (Some((from_min, to_min)), Ok(tz)) if from_min != to_min => {
                        Some(crate::slo::Hours { from_min, to_min, tz_name, tz: std::sync::Arc::new(tz) })
                    }
                    (range, tz) => {
                        if range.is_none_or(|(a, b)| a == b) {
                            errs.push(format!(
                                "{at}.selector.hours: {h:?} must be \"HH:MM-HH:MM\" with different ends"
                            ));
                        }
                        if let Err(e) = tz {
                            errs.push(format!("{at}.selector.timezone: {tz_name:?} is not a known time zone: {e}"));
                        }
                        None
                    }
                }
            }
        };
        let urgent_only = priority == [pb::PriorityClass::Urgent];
        out.push(crate::slo::SloDef {
            name,
            description: s.description.clone().unwrap_or_default(),
            selector: crate::slo::Selector {
                priority,
                pool_kind,
                provider: sel.provider.clone(),
                pool: sel.pool.clone(),
                gpu_class: sel.gpu_class.clone(),
                region: sel.region.clone(),
                gpu_count_min: sel.gpu_count_min,
                gpu_count_max: sel.gpu_count_max,
                hours,
            },
            threshold_ms,
            objective,
            window_ms,
            page_on_breach: s.page_on_breach.unwrap_or(urgent_only),
            exclude_cancelled: s.exclude_cancelled.unwrap_or(true),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_with_no_config_at_all() {
        let c = FileConfig::default().validate().expect("defaults are valid");
        assert_eq!(c.store_path, PathBuf::from("./startline-data"));
        assert!(c.grpc_listen.ip().is_loopback() && c.http_listen.ip().is_loopback());
        assert_eq!(c.when_full, WhenFull::Wait);
        assert_eq!(c.max_events_per_job, 100_000);
    }

    #[test]
    fn per_job_event_cap_is_checked() {
        let c = FileConfig::parse("[store]\nmax_events_per_job = 5\n").expect("parses").validate().expect("valid");
        assert_eq!(c.max_events_per_job, 5);
        let errs = FileConfig::parse("[store]\nmax_events_per_job = 0\n").expect("parses").validate().expect_err("0").0;
        assert!(errs.iter().any(|e| e.starts_with("store.max_events_per_job: 0 is outside")), "{errs:?}");
    }

    #[test]
    fn reports_every_error_at_once() {
        let f = FileConfig::parse(
            r#"
            [grpc]
            listen = "nowhere"
            max_batch_events = 0
            [ingest]
            when_full = "drop"
            max_future_skew = "soon"
            "#,
        )
        .expect("parses");
        let errs = f.validate().expect_err("invalid").0;
        assert_eq!(errs.len(), 4, "{errs:?}");
        for needle in ["grpc.listen", "grpc.max_batch_events", "ingest.when_full", "ingest.max_future_skew"] {
            assert!(errs.iter().any(|e| e.starts_with(needle)), "{needle} missing from {errs:?}");
        }
    }

    #[test]
    fn grpc_connection_limits_have_safe_defaults_and_are_validated() {
        let c = FileConfig::default().validate().expect("defaults are valid");
        assert_eq!(c.max_message_bytes, 4 << 20);
        assert_eq!(c.grpc_connections.max_connections, 4096);
        assert_eq!(c.grpc_connections.drain_timeout, Duration::from_secs(10));
        let f = FileConfig::parse(
            r#"
            [grpc]
            max_message_bytes = 1073741824
            max_connections = 0
            handshake_timeout = "1ms"
            keepalive_interval = "often"
            keepalive_timeout = "0s"
            drain_timeout = "1h"
            "#,
        )
        .expect("parses");
        let errs = f.validate().expect_err("invalid").0;
        for needle in [
            "grpc.max_message_bytes",
            "grpc.max_connections",
            "grpc.handshake_timeout",
            "grpc.keepalive_interval",
            "grpc.keepalive_timeout",
            "grpc.drain_timeout",
        ] {
            assert!(errs.iter().any(|e| e.starts_with(needle)), "{needle} missing from {errs:?}");
        }
    }

    #[test]
    fn default_slos_apply_without_config_and_config_replaces_them() {
        let c = FileConfig::default().validate().expect("valid");
        let names: Vec<&str> = c.slos.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["urgent-start", "normal-start"]);
        let f = FileConfig::parse(
            r#"
            [[slo]]
            name = "big-jobs-office-hours"
            threshold = "30m"
            objective = 97.5
            window = "7d"
            [slo.selector]
            gpu_count_min = 64
            pool_kind = ["dedicated"]
            hours = "09:00-18:00"
            timezone = "Europe/Moscow"
            "#,
        )
        .expect("parses");
        let c = f.validate().expect("valid");
        assert_eq!(c.slos.len(), 1);
        let s = &c.slos[0];
        assert_eq!((s.threshold_ms, s.window_ms), (1_800_000, 7 * 86_400_000));
        assert!((s.objective - 0.975).abs() < 1e-12);
        assert!(!s.page_on_breach);
        // 2026-01-01T06:30:00Z is 09:30 in Moscow (UTC+3): inside; 16:00Z is 19:00: outside.
        let h = s.selector.hours.as_ref().expect("hours");
        assert!(h.contains(1_767_249_000_000));
        assert!(!h.contains(1_767_283_200_000));
    }

    #[test]
    fn invalid_slos_are_all_reported() {
        let f = FileConfig::parse(
            r#"
            [[slo]]
            name = "Bad Name"
            threshold = "soon"
            objective = 100
            [slo.selector]
            priority = ["asap"]
            hours = "9-18"
            timezone = "Mars/Olympus"
            [[slo]]
            name = "x"
            threshold = "1m"
            [alerts]
            alertmanager = ["ftp://example"]
            "#,
        )
        .expect("parses");
        let errs = f.validate().expect_err("invalid").0;
        for needle in [
            "slo[0].name",
            "slo[0].threshold",
            "slo[0].objective",
            "slo[0].selector.priority",
            "slo[0].selector.hours",
            "slo[0].selector.timezone",
            "slo[1].objective",
            "alerts.alertmanager",
        ] {
            assert!(errs.iter().any(|e| e.starts_with(needle)), "{needle} missing from {errs:#?}");
        }
    }

    #[test]
    fn retention_must_cover_every_slo_window() {
        let c = FileConfig::default().validate().expect("defaults are valid");
        assert_eq!(c.retention, Some(Duration::from_secs(90 * 86_400)));
        let forever = FileConfig::parse("[store]\nretention = \"0s\"\n").expect("parses").validate().expect("valid");
        assert_eq!(forever.retention, None);
        let errs =
            FileConfig::parse("[store]\nretention = \"7d\"\n").expect("parses").validate().expect_err("too short").0;
        assert!(errs.iter().any(|e| e.starts_with("store.retention") && e.contains("urgent-start")), "{errs:?}");
        let errs =
            FileConfig::parse("[store]\nretention = \"2h\"\n").expect("parses").validate().expect_err("under a day").0;
        assert!(errs.iter().any(|e| e.contains("at least 1d")), "{errs:?}");
    }

    #[test]
    fn unknown_keys_are_errors() {
        let e = FileConfig::parse("[grpc]\nlisten_addr = \"x\"\n").expect_err("unknown key");
        assert!(e.contains("listen_addr"), "{e}");
    }

    #[test]
    fn example_config_in_deploy_parses_and_validates() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/collector.example.toml");
        let f = FileConfig::load(std::path::Path::new(path)).expect("example config loads");
        f.validate().expect("example config is valid");
    }
}
