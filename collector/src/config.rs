//! Configuration in two phases: [`FileConfig`] mirrors the TOML file (unknown keys are errors), CLI flags
//! override it, and [`FileConfig::validate`] turns it into the [`Config`] the rest of the collector uses,
//! reporting every problem at once before any port is bound.

use crate::alert::config::{AlertConfig, AlertsSection};
use crate::applier::halt::AfterWriteFailure;
use crate::auth::config::{AuthConfig, AuthSection, TlsSection};
use crate::auth::tls::TlsFiles;
use crate::ingest::WhenFull;
pub use effective::{changed_sections, REDACTED};

mod effective;
use crate::settings::{duration, range, socket_addr};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The TOML file, as written. Every field is optional; defaults give a collector on loopback with sled under
/// `./startline-data`.
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `[store]`
    #[serde(default)]
    pub store: StoreSection,
    /// `[history]`: ended jobs as Parquet files, one per day.
    #[serde(default)]
    pub history: HistorySection,
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
    /// `[logs]`: accepted events and job summaries as OTLP logs.
    #[serde(default)]
    pub logs: crate::export::logs::LogsSection,
    /// `[cost]`: prices per GPU-hour and dedicated pools' capacity.
    #[serde(default)]
    pub cost: crate::compare::cost::CostSection,
    /// `[chains]`: when a chain of jobs is complete.
    #[serde(default)]
    pub chains: ChainsSection,
    /// `[prediction]`: warnings before start SLO breaches.
    #[serde(default)]
    pub prediction: crate::slo::predict::PredictionSection,
    /// `[stream]`: the resumable stream out (gRPC `StreamService`).
    #[serde(default)]
    pub stream: crate::stream::StreamSection,
    /// `[[chain_slo]]`: deadlines on time to artifact for chains.
    #[serde(default)]
    pub chain_slo: Vec<crate::slo::chain::ChainSloSection>,
    /// `[nodes]`: the suspect-node rule.
    #[serde(default)]
    pub nodes: crate::index::nodes::NodesSection,
    /// `[auth]`: identities, scopes, restrictions.
    #[serde(default)]
    pub auth: AuthSection,
    /// `[tls]`: certificate, key, client CA.
    #[serde(default)]
    pub tls: TlsSection,
}

/// `[chains]`: jobs sharing a `chain_id` seen as one timeline (docs/concepts.md, "Chains").
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ChainsSection {
    /// Stages whose job, once it succeeded, completes its chain (e.g. `["quantize"]`). Empty: a chain is complete when
    /// every job in it is done.
    #[serde(default)]
    pub final_stages: Vec<String>,
    /// How often the alert loop evaluates chain SLOs (default `1m`; each evaluation scans every job).
    pub evaluation_interval: Option<String>,
}

/// `[metrics]`: bounded attribute values and OTLP push.
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
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
    /// Teams exported as themselves (with `team_attribute`).
    #[serde(default)]
    pub teams: Vec<String>,
    /// Add a bounded `team` attribute to the time-to-first-step histogram, the waiting gauges and the GPU-seconds
    /// waited. Default false.
    pub team_attribute: Option<bool>,
    /// Cap on distinct values of an unlisted attribute. Default 64.
    pub max_values_per_label: Option<usize>,
    /// Cap on the attribute sets of each job metric; past it, measurements go to the metric's overflow series
    /// (`otel_metric_overflow="true"`) and are counted in `startline_collector_metric_overflow_total`. Default 2000.
    pub max_series_per_metric: Option<usize>,
    /// Histograms on the OTLP path: `exponential` (base-2, the default) or `explicit` (Prometheus' boundaries).
    pub otlp_histograms: Option<String>,
    /// OTLP/gRPC endpoint to push to, e.g. `http://127.0.0.1:4317`. Unset: no push.
    pub otlp_endpoint: Option<String>,
    /// OTLP protocol: only `grpc` is built.
    pub otlp_protocol: Option<String>,
    /// OTLP push interval. Default 30s.
    pub otlp_interval: Option<String>,
    /// PEM CA bundle trusted for an `https://` OTLP endpoint instead of the built-in (webpki) roots.
    pub otlp_ca_file: Option<PathBuf>,
    /// PEM client certificate for OTLP (mTLS); needs `otlp_client_key_file`.
    pub otlp_client_cert_file: Option<PathBuf>,
    /// PEM private key of `otlp_client_cert_file`.
    pub otlp_client_key_file: Option<PathBuf>,
    /// File holding a bearer token sent as `authorization: Bearer <token>` with every export.
    pub otlp_bearer_token_file: Option<PathBuf>,
    /// gRPC metadata sent with every export, e.g. `{ "x-scope-orgid" = "team-a" }`; values are never logged.
    #[serde(default)]
    pub otlp_headers: std::collections::BTreeMap<String, String>,
}

/// Validated metrics settings.
#[derive(Debug, Clone)]
pub struct MetricsConfig {
    /// Attribute bounds.
    pub labels: crate::index::labels::LabelSettings,
    /// OTLP push, when configured.
    pub otlp: Option<crate::export::OtlpSettings>,
    /// Attribute sets allowed per job metric.
    pub max_series_per_metric: usize,
}

/// `[[slo]]`: one start objective.
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
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
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
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

/// `[history]`
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HistorySection {
    /// Write ended jobs as Parquet files under `<store.path>/history/end_date=YYYY-MM-DD/jobs.parquet`, one row
    /// per job, for DuckDB, Spark, Trino, ClickHouse and the like. Default true.
    pub enabled: Option<bool>,
    /// A day's file is written once the day ended this long ago (reports arriving later rewrite it), e.g.
    /// `"1h"`. Default 1h.
    pub seal_after: Option<String>,
    /// How often days to write (or write again) are looked for. Default 10m, at least 1s.
    pub seal_interval: Option<String>,
    /// `[history.export]`: copy the sealed files to an S3-compatible bucket. Absent: no copy.
    pub export: Option<HistoryExportSection>,
}

/// `[history.export]`: sealed history files copied to S3-compatible object storage, one object per day and
/// collector, `<prefix>/end_date=YYYY-MM-DD/<collector_id>.parquet`. Credentials come from the environment (AWS
/// variables, web identity / IRSA, container or instance credentials), never from this file.
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HistoryExportSection {
    /// Destination, `s3://bucket` or `s3://bucket/prefix`. Required.
    pub url: Option<String>,
    /// URL of an S3-compatible server (MinIO, Ceph, Cloudflare R2, moto), e.g. `https://minio.internal:9000`.
    /// Unset: AWS S3 (or `AWS_ENDPOINT`).
    pub endpoint: Option<String>,
    /// Region, e.g. `eu-west-1`. Unset: `AWS_REGION` / `AWS_DEFAULT_REGION`, else `us-east-1`.
    pub region: Option<String>,
    /// Allow an `http://` endpoint (no TLS). Default false.
    pub allow_http: Option<bool>,
    /// How often sealed days are compared with what was uploaded. Default 5m, at least 1s.
    pub interval: Option<String>,
    /// This collector's object name in each day's directory, unique among the collectors sharing the bucket:
    /// letters, digits, `.`, `_`, `-`, at most 128. Default: the host name.
    pub collector_id: Option<String>,
}

impl HistoryExportSection {
    /// Checks the section, naming each bad field.
    pub fn validate(&self, errs: &mut Vec<String>) -> Option<crate::export::history::ExportSettings> {
        let before = errs.len();
        let (bucket, prefix) = match self.url.as_deref() {
            None => {
                errs.push("history.export.url: required, e.g. \"s3://bucket/startline\"".to_string());
                (String::new(), String::new())
            }
            Some(u) => crate::export::history::parse_url(u).unwrap_or_else(|e| {
                errs.push(format!("history.export.url: {e}"));
                (String::new(), String::new())
            }),
        };
        let allow_http = self.allow_http.unwrap_or(false);
        if let Some(e) = &self.endpoint {
            let rest = e.strip_prefix("https://").or_else(|| e.strip_prefix("http://"));
            match rest {
                Some(r) if !r.is_empty() && !r.starts_with('/') && !r.contains(char::is_whitespace) => {
                    if e.starts_with("http://") && !allow_http {
                        errs.push(format!(
                            "history.export.endpoint: {e:?} is plain http (no TLS): use https://, or set \
                             history.export.allow_http = true"
                        ));
                    }
                }
                _ => errs.push(format!("history.export.endpoint: {e:?} must be an http:// or https:// URL")),
            }
        }
        if let Some(r) = &self.region {
            if r.is_empty() || r.len() > 64 || !r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                errs.push(format!("history.export.region: {r:?} must be 1 to 64 letters, digits and hyphens"));
            }
        }
        let interval =
            duration(errs, "history.export.interval", &self.interval, Duration::from_secs(300), Duration::from_secs(1));
        let collector_id = match &self.collector_id {
            None => crate::export::history::default_collector_id(),
            Some(id) => {
                if !crate::export::history::safe_component(id, 128) || id.starts_with('.') {
                    errs.push(format!(
                        "history.export.collector_id: {id:?} must be 1 to 128 letters, digits, '.', '_' or '-', \
                         not starting with '.'"
                    ));
                }
                id.clone()
            }
        };
        (errs.len() == before).then(|| crate::export::history::ExportSettings {
            bucket,
            prefix,
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            allow_http,
            interval,
            collector_id,
        })
    }

    /// The section for validated settings.
    pub fn of(s: &crate::export::history::ExportSettings) -> HistoryExportSection {
        HistoryExportSection {
            url: Some(s.url()),
            endpoint: s.endpoint.clone(),
            region: s.region.clone(),
            allow_http: Some(s.allow_http),
            interval: Some(crate::settings::format_duration(s.interval)),
            collector_id: Some(s.collector_id.clone()),
        }
    }
}

impl HistorySection {
    /// Checks the section, naming each bad field; `None` when history files are off.
    pub fn validate(&self, errs: &mut Vec<String>) -> Option<crate::applier::history::HistorySettings> {
        let d = crate::applier::history::HistorySettings::default();
        let seal_after = duration(errs, "history.seal_after", &self.seal_after, d.seal_after, Duration::ZERO);
        let seal_interval =
            duration(errs, "history.seal_interval", &self.seal_interval, d.seal_interval, Duration::from_secs(1));
        self.enabled.unwrap_or(true).then_some(crate::applier::history::HistorySettings { seal_after, seal_interval })
    }

    /// `[history.export]`, checked (`None`: absent or invalid); it needs history files.
    pub fn validate_export(&self, errs: &mut Vec<String>) -> Option<crate::export::history::ExportSettings> {
        let export = self.export.as_ref()?;
        if !self.enabled.unwrap_or(true) {
            errs.push("history.export: needs history files; remove it or set history.enabled = true".to_string());
        }
        export.validate(errs)
    }

    /// The section for `settings` (`None`: disabled, with the defaults shown) and the export's.
    pub fn of(
        settings: Option<crate::applier::history::HistorySettings>,
        export: Option<&crate::export::history::ExportSettings>,
    ) -> HistorySection {
        let s = settings.unwrap_or_default();
        HistorySection {
            enabled: Some(settings.is_some()),
            seal_after: Some(crate::settings::format_duration(s.seal_after)),
            seal_interval: Some(crate::settings::format_duration(s.seal_interval)),
            export: export.map(HistoryExportSection::of),
        }
    }
}

/// `[store]`
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
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
    /// Memory budget of hot jobs (waiting, running, ended and not yet folded), MiB, by the index's estimate.
    /// Over it, ended jobs are folded without waiting for `fold_after`. Default 256.
    pub hot_budget_mib: Option<usize>,
    /// Memory budget of folded jobs' rows, MiB, by the index's estimate. Over it, the folded jobs that ended
    /// longest ago are deleted, like retention (which deletes by age). Default 1024; 0: no budget.
    pub folded_budget_mib: Option<usize>,
    /// Size of a log segment file, KiB: the unit retention deletes or rewrites and compaction rewrites.
    /// Default 32768 (32 MiB).
    pub log_segment_kib: Option<usize>,
    /// After a store write fails (a full disk, too many open files, an I/O error) writes halt and ingest is
    /// refused; once the store is writable again the collector `"restart"`s in place (default: same process id,
    /// arguments and addresses) or `"exit"`s with code 75 for its supervisor to restart it.
    pub after_write_failure: Option<String>,
}

/// `[grpc]`
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
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
    /// Most gRPC connections open at once; more are closed as they are accepted. Default 4096, sized for a
    /// fleet of agents (one connection each) under the packaged unit's `LimitNOFILE=65536`; whatever it is, gRPC
    /// and HTTP connections together never take more than the open-file limit less 128 descriptors (the
    /// descriptor budget, `crate::conn_limit`), which keeps the store's descriptors free.
    pub max_connections: Option<usize>,
    /// Most gRPC connections open at once from one client address (an IPv4 address, an IPv6 /64); more are closed
    /// as they are accepted. Default 256 (or `max_connections` if lower): one host cannot take the budget alone
    /// (a 1024 open-file limit leaves 896 connections), yet a host running many agents has room. Agents behind
    /// one NAT or proxy share its address: raise it for them.
    pub max_connections_per_ip: Option<usize>,
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
    /// Most connections open at once from one client address.
    pub max_connections_per_ip: usize,
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
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSection {
    /// Listen address of the JSON API and dashboard. Default `127.0.0.1:8080`.
    pub listen: Option<String>,
    /// Most jobs one page of `GET /api/v1/jobs` returns. Default 1000.
    pub max_page_size: Option<usize>,
    /// Large reads (answers that walk every job: compare, goodput, cost, overview, listings, chains, nodes; a
    /// job's events) running at once; the others wait their turn within `request_timeout`. Bounds the memory of
    /// many concurrent large reads to this many. Default 4.
    pub max_concurrent_reads: Option<usize>,
    /// Most HTTP connections open at once; more are closed as they are accepted. Default 256: dashboards,
    /// Prometheus and API clients need a few each, and 256 leaves most of a 1024 open-file limit to gRPC and the
    /// store (HTTP and gRPC connections together never take more than the limit less 128 descriptors).
    pub max_connections: Option<usize>,
    /// Most HTTP connections open at once from one client address (an IPv4 address, an IPv6 /64). Default 64 (or
    /// `max_connections` if lower): a browser opens 6 per site, so one address cannot hold every connection.
    /// Behind a reverse proxy every client shares the proxy's address: raise it to `max_connections` there.
    pub max_connections_per_ip: Option<usize>,
    /// Time a request's head (request line and headers) has, from its first byte; a new connection's first head
    /// has it from the accept (TLS handshake included). Default 10s.
    pub header_read_timeout: Option<String>,
    /// Time a request's body has, from the end of its head; a late one is answered 408 and the connection closed.
    /// Default 10s (the API's bodies are a login form or nothing).
    pub body_read_timeout: Option<String>,
    /// Time a whole request has, from its first byte to its answer: 408 while its body is still arriving, 503 if
    /// the answer is not ready; the answer then has 2s more to be written. Default 30s.
    pub request_timeout: Option<String>,
    /// Time a keep-alive connection may wait for its next request before it is closed. Default 60s: longer than
    /// the dashboard's 15s refresh and 15-30s Prometheus scrapes, so they reuse their connections (and TLS
    /// sessions); idle connections count against the caps.
    pub idle_timeout: Option<String>,
    /// Failed dashboard logins per minute from one client address (an IPv4 address, an IPv6 /64), also the
    /// burst; past it `POST /login` answers 429 with `Retry-After`. Default 10; 0: no limit.
    pub login_failures_per_minute: Option<usize>,
    /// Dashboard logins per minute that prove one identity (successful or not), also the burst; past it 429.
    /// Default 30; 0: no limit.
    pub logins_per_identity_per_minute: Option<usize>,
    /// Dashboard sessions one identity holds at most; its next login ends its own oldest session (never another
    /// identity's). Default 20.
    pub max_sessions_per_identity: Option<usize>,
    /// Origins (`scheme://host[:port]`) besides the collector's own (the request's `Host`) whose browsers may
    /// send state-changing requests (`POST /login`, `/logout`, the admin reload), e.g. a reverse proxy's public
    /// URL when it rewrites `Host`. Default empty.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
}

/// Validated limits and timeouts of HTTP connections.
#[derive(Debug, Clone, Copy)]
pub struct HttpConnections {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Most connections open at once from one client address.
    pub max_connections_per_ip: usize,
    /// For a request's head.
    pub header_read_timeout: Duration,
    /// For a request's body.
    pub body_read_timeout: Duration,
    /// For a whole request.
    pub request_timeout: Duration,
    /// For a keep-alive connection's next request.
    pub idle_timeout: Duration,
}

/// `[ingest]`
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
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
    /// History files (`[history]`; None: off).
    pub history: Option<crate::applier::history::HistorySettings>,
    /// Copying the sealed history files to object storage (`[history.export]`; None: no copy).
    pub history_export: Option<crate::export::history::ExportSettings>,
    /// Most events stored per job.
    pub max_events_per_job: usize,
    /// Ended jobs unchanged for this long are folded out of memory (None: never).
    pub fold_after: Option<Duration>,
    /// How often fold candidates are looked for.
    pub fold_interval: Duration,
    /// sled's page cache, bytes.
    pub cache_bytes: u64,
    /// Memory budget of hot jobs, bytes (over it, ended jobs fold without waiting for `fold_after`).
    pub hot_budget_bytes: u64,
    /// Memory budget of folded rows, bytes (over it, the folded jobs that ended longest ago are deleted; 0: none).
    pub folded_budget_bytes: u64,
    /// Log segment size, bytes (`store.log_segment_kib`).
    pub log_segment_bytes: u64,
    /// What the process does once the store is writable again after a write failure halted writes.
    pub after_write_failure: AfterWriteFailure,
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
    /// Large reads running at once.
    pub max_concurrent_reads: usize,
    /// HTTP connection limits and timeouts.
    pub http_connections: HttpConnections,
    /// Dashboard login throttles, session caps and accepted origins.
    pub login: crate::api::auth::LoginSettings,
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
    /// OTLP logs of accepted events, when configured.
    pub logs: Option<crate::export::logs::LogsSettings>,
    /// Prices and capacities.
    pub cost: crate::compare::cost::CostModel,
    /// Stages that complete a chain.
    pub final_stages: Vec<String>,
    /// Breach prediction.
    pub prediction: crate::slo::predict::PredictSettings,
    /// The stream out.
    pub stream: crate::stream::StreamSettings,
    /// Chain SLOs.
    pub chain_slos: Vec<crate::slo::chain::ChainSloDef>,
    /// How often chain SLOs are evaluated, ms.
    pub chain_interval_ms: i64,
    /// The suspect-node rule.
    pub nodes: crate::index::nodes::NodeSettings,
    /// Identities (empty: no authentication, loopback only unless `auth.insecure`).
    pub auth: AuthConfig,
    /// TLS on both listeners.
    pub tls: Option<TlsFiles>,
    /// The file this config came from, re-read on reload (SIGHUP).
    pub source: Option<PathBuf>,
    /// Command-line values that replace the file's, applied again to the file re-read on reload.
    pub overrides: Overrides,
    /// The file as written (after command-line overrides), secret values redacted: the parts of
    /// [`Config::effective`] that have no defaults to fill in (notifier tables, identities, TLS paths).
    pub written: FileConfig,
}

/// Command-line flags that override file fields (`--data-dir`, `--grpc-listen`, `--http-listen`).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `store.path`
    pub data_dir: Option<PathBuf>,
    /// `grpc.listen`
    pub grpc_listen: Option<String>,
    /// `http.listen`
    pub http_listen: Option<String>,
}

impl Overrides {
    /// Sets the overridden fields of `file`.
    pub fn apply(&self, file: &mut FileConfig) {
        if let Some(d) = &self.data_dir {
            file.store.path = Some(d.clone());
        }
        if let Some(a) = &self.grpc_listen {
            file.grpc.listen = Some(a.clone());
        }
        if let Some(a) = &self.http_listen {
            file.http.listen = Some(a.clone());
        }
    }
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

    /// A copy with every secret value (notifier and OTLP header values) replaced by [`REDACTED`].
    pub fn redacted(&self) -> FileConfig {
        let mut f = self.clone();
        for t in f.alerts.alertmanager.iter_mut().chain(f.alerts.webhook.iter_mut()) {
            if let crate::alert::config::TargetEntry::Table(t) = t {
                t.headers.values_mut().for_each(|v| *v = REDACTED.to_string());
            }
        }
        f.metrics.otlp_headers.values_mut().for_each(|v| *v = REDACTED.to_string());
        f.logs.otlp_headers.values_mut().for_each(|v| *v = REDACTED.to_string());
        f
    }

    /// Checks every section and builds the validated config, or lists every problem.
    pub fn validate(&self) -> Result<Config, ConfigErrors> {
        let mut errs = Vec::new();
        let store = self.store.validate(&mut errs);
        let grpc = self.grpc.validate(&mut errs);
        let http = self.http.validate(&mut errs);
        let ingest = self.ingest.validate(&mut errs);
        let slos =
            if self.slo.is_empty() { crate::slo::SloDef::defaults() } else { validate_slos(&self.slo, &mut errs) };
        let alerts = self.alerts.validate(&mut errs);
        let metrics = self.metrics.validate(&mut errs);
        let logs = self.logs.validate(&mut errs);
        let cost = self.cost.validate(&mut errs);
        for (i, s) in self.chains.final_stages.iter().enumerate() {
            if s.is_empty() || s.len() > 128 {
                errs.push(format!("chains.final_stages[{i}]: {s:?} must be 1 to 128 characters"));
            }
        }
        let nodes = self.nodes.validate(&mut errs);
        let chain_slos = crate::slo::chain::validate(&self.chain_slo, &mut errs);
        let prediction = self.prediction.validate(&mut errs);
        let stream = self.stream.validate(&mut errs);
        let history = self.history.validate(&mut errs);
        let history_export = self.history.validate_export(&mut errs);
        let chain_interval_ms = match self.chains.evaluation_interval.as_deref().map(humantime::parse_duration) {
            None => 60_000,
            Some(Ok(d)) if d.as_millis() >= 1000 && d.as_secs() <= 86_400 => d.as_millis() as i64,
            Some(Ok(_)) => {
                errs.push("chains.evaluation_interval: must be between 1s and 1d".to_string());
                60_000
            }
            Some(Err(e)) => {
                errs.push(format!("chains.evaluation_interval: {e}"));
                60_000
            }
        };
        let tls = self.tls.validate(&mut errs);
        let has_client_ca = tls.as_ref().is_some_and(|t| t.client_ca_file.is_some());
        let auth = self.auth.validate(&mut errs, has_client_ca);
        check_listeners_differ(&mut errs, grpc.listen, http.listen);
        check_exposure(&mut errs, &auth, &[("grpc.listen", grpc.listen), ("http.listen", http.listen)]);
        check_retention_covers_slos(&mut errs, store.retention, &slos);
        if !errs.is_empty() {
            return Err(ConfigErrors(errs));
        }
        Ok(Config {
            metrics,
            logs,
            cost,
            final_stages: self.chains.final_stages.clone(),
            chain_slos,
            prediction,
            stream,
            chain_interval_ms,
            nodes,
            store_path: store.path,
            checkpoint_interval: store.checkpoint_interval,
            retention: store.retention,
            retention_interval: store.retention_interval,
            history,
            history_export,
            max_events_per_job: store.max_events_per_job,
            fold_after: store.fold_after,
            fold_interval: store.fold_interval,
            cache_bytes: store.cache_bytes,
            hot_budget_bytes: store.hot_budget_bytes,
            folded_budget_bytes: store.folded_budget_bytes,
            log_segment_bytes: store.log_segment_bytes,
            after_write_failure: store.after_write_failure,
            grpc_listen: grpc.listen,
            max_message_bytes: grpc.max_message_bytes,
            max_batch_events: grpc.max_batch_events,
            max_concurrent_streams: grpc.max_concurrent_streams,
            max_inflight_batches: grpc.max_inflight_batches,
            grpc_connections: grpc.connections,
            http_listen: http.listen,
            max_page_size: http.max_page_size,
            max_concurrent_reads: http.max_concurrent_reads,
            http_connections: http.connections,
            login: http.login,
            queue_capacity: ingest.queue_capacity,
            when_full: ingest.when_full,
            group_commit_max_events: ingest.group_commit_max_events,
            limits: ingest.limits,
            slos,
            alerts,
            auth,
            tls,
            source: None,
            overrides: Overrides::default(),
            written: self.redacted(),
        })
    }
}

/// Across `[auth]`, `[grpc]` and `[http]`: with no identity configured, a listener beyond loopback is an error
/// unless `auth.insecure = true` says it is meant.
fn check_exposure(errs: &mut Vec<String>, auth: &AuthConfig, listeners: &[(&str, SocketAddr)]) {
    if auth.enabled() || auth.insecure {
        return;
    }
    for (name, addr) in listeners {
        if !addr.ip().is_loopback() {
            errs.push(format!(
                "{name}: {addr} is reachable beyond this host but no [[auth.identity]] is configured: add \
                 identities (see `startline-collector token`), listen on 127.0.0.1, or set auth.insecure = true"
            ));
        }
    }
}

/// The validated `[store]` fields.
struct StoreSettings {
    path: PathBuf,
    checkpoint_interval: Duration,
    retention: Option<Duration>,
    retention_interval: Duration,
    max_events_per_job: usize,
    fold_after: Option<Duration>,
    fold_interval: Duration,
    cache_bytes: u64,
    hot_budget_bytes: u64,
    folded_budget_bytes: u64,
    log_segment_bytes: u64,
    after_write_failure: AfterWriteFailure,
}

impl StoreSection {
    fn validate(&self, errs: &mut Vec<String>) -> StoreSettings {
        let path = self.path.clone().unwrap_or_else(|| PathBuf::from("./startline-data"));
        if path.as_os_str().is_empty() {
            errs.push("store.path: must not be empty".to_string());
        }
        let checkpoint_interval = duration(
            errs,
            "store.checkpoint_interval",
            &self.checkpoint_interval,
            Duration::from_secs(2),
            Duration::from_millis(10),
        );
        let retention =
            duration(errs, "store.retention", &self.retention, Duration::from_secs(90 * 86_400), Duration::ZERO);
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
        let retention_interval = duration(
            errs,
            "store.retention_interval",
            &self.retention_interval,
            Duration::from_secs(600),
            Duration::from_millis(100),
        );
        let max_events_per_job =
            range(errs, "store.max_events_per_job", self.max_events_per_job, 100_000, 1, 10_000_000);
        let fold_after = duration(errs, "store.fold_after", &self.fold_after, Duration::from_secs(300), Duration::ZERO);
        let fold_after = (!fold_after.is_zero()).then_some(fold_after);
        let fold_interval = duration(
            errs,
            "store.fold_interval",
            &self.fold_interval,
            Duration::from_secs(10),
            Duration::from_millis(10),
        );
        let cache_bytes = range(errs, "store.cache_mib", self.cache_mib, 64, 4, 1 << 20) as u64 * (1 << 20);
        let hot_budget_bytes =
            range(errs, "store.hot_budget_mib", self.hot_budget_mib, 256, 1, 1 << 20) as u64 * (1 << 20);
        let folded_budget_bytes =
            range(errs, "store.folded_budget_mib", self.folded_budget_mib, 1024, 0, 1 << 20) as u64 * (1 << 20);
        let log_segment_bytes =
            range(errs, "store.log_segment_kib", self.log_segment_kib, 32 << 10, 64, 1 << 20) as u64 * (1 << 10);
        let after_write_failure = match self.after_write_failure.as_deref() {
            None | Some("restart") => AfterWriteFailure::Restart,
            Some("exit") => AfterWriteFailure::Exit,
            Some(other) => {
                errs.push(format!("store.after_write_failure: {other:?} is not \"restart\" or \"exit\""));
                AfterWriteFailure::Restart
            }
        };
        StoreSettings {
            path,
            checkpoint_interval,
            retention,
            retention_interval,
            max_events_per_job,
            fold_after,
            fold_interval,
            cache_bytes,
            hot_budget_bytes,
            folded_budget_bytes,
            log_segment_bytes,
            after_write_failure,
        }
    }
}

/// The validated `[grpc]` fields.
struct GrpcSettings {
    listen: SocketAddr,
    max_message_bytes: usize,
    max_batch_events: usize,
    max_concurrent_streams: u32,
    max_inflight_batches: usize,
    connections: GrpcConnections,
}

impl GrpcSection {
    fn validate(&self, errs: &mut Vec<String>) -> GrpcSettings {
        let listen = socket_addr(errs, "grpc.listen", &self.listen, "127.0.0.1:50051");
        let max_message_bytes = range(errs, "grpc.max_message_bytes", self.max_message_bytes, 4 << 20, 4096, 64 << 20);
        let max_batch_events = range(errs, "grpc.max_batch_events", self.max_batch_events, 10_000, 1, 1_000_000);
        let max_concurrent_streams =
            range(errs, "grpc.max_concurrent_streams", self.max_concurrent_streams.map(|v| v as usize), 100, 1, 65_536)
                as u32;
        let max_inflight_batches = range(errs, "grpc.max_inflight_batches", self.max_inflight_batches, 32, 1, 4096);
        let max_connections = range(errs, "grpc.max_connections", self.max_connections, 4096, 1, 1 << 20);
        let connections = GrpcConnections {
            max_connections,
            max_connections_per_ip: per_ip_cap(errs, "grpc", self.max_connections_per_ip, 256, max_connections),
            handshake_timeout: duration(
                errs,
                "grpc.handshake_timeout",
                &self.handshake_timeout,
                Duration::from_secs(10),
                Duration::from_millis(100),
            ),
            keepalive_interval: duration(
                errs,
                "grpc.keepalive_interval",
                &self.keepalive_interval,
                Duration::from_secs(30),
                Duration::from_secs(1),
            ),
            keepalive_timeout: duration(
                errs,
                "grpc.keepalive_timeout",
                &self.keepalive_timeout,
                Duration::from_secs(10),
                Duration::from_secs(1),
            ),
            drain_timeout: duration(
                errs,
                "grpc.drain_timeout",
                &self.drain_timeout,
                Duration::from_secs(10),
                Duration::ZERO,
            ),
        };
        if connections.drain_timeout > Duration::from_secs(600) {
            errs.push("grpc.drain_timeout: at most 10m (a shutdown must finish)".to_string());
        }
        GrpcSettings {
            listen,
            max_message_bytes,
            max_batch_events,
            max_concurrent_streams,
            max_inflight_batches,
            connections,
        }
    }
}

/// The validated `[http]` fields.
struct HttpSettings {
    listen: SocketAddr,
    max_page_size: usize,
    max_concurrent_reads: usize,
    connections: HttpConnections,
    login: crate::api::auth::LoginSettings,
}

impl HttpSection {
    fn validate(&self, errs: &mut Vec<String>) -> HttpSettings {
        use crate::api::serve;
        let max_connections =
            range(errs, "http.max_connections", self.max_connections, serve::MAX_CONNECTIONS, 1, 1 << 20);
        let timeout = |errs: &mut Vec<String>, name: &str, v: &Option<String>, default: Duration, min: Duration| {
            let d = duration(errs, name, v, default, min);
            if d > Duration::from_secs(3600) {
                errs.push(format!("{name}: at most 1h (a connection must not be held longer)"));
            }
            d
        };
        let (ms, s) = (Duration::from_millis(100), Duration::from_secs(1));
        let connections = HttpConnections {
            max_connections,
            max_connections_per_ip: per_ip_cap(
                errs,
                "http",
                self.max_connections_per_ip,
                serve::MAX_CONNECTIONS_PER_IP,
                max_connections,
            ),
            header_read_timeout: timeout(
                errs,
                "http.header_read_timeout",
                &self.header_read_timeout,
                serve::HEADER_READ_TIMEOUT,
                ms,
            ),
            body_read_timeout: timeout(
                errs,
                "http.body_read_timeout",
                &self.body_read_timeout,
                serve::BODY_READ_TIMEOUT,
                ms,
            ),
            request_timeout: timeout(errs, "http.request_timeout", &self.request_timeout, serve::REQUEST_TIMEOUT, s),
            idle_timeout: timeout(errs, "http.idle_timeout", &self.idle_timeout, serve::IDLE_TIMEOUT, s),
        };
        use crate::api::auth as login;
        let per_minute = |errs: &mut Vec<String>, name: &str, v: Option<usize>, default: u32| {
            range(errs, name, v, default as usize, 0, 1_000_000) as u32
        };
        for (i, o) in self.allowed_origins.iter().enumerate() {
            let ok = o.trim_end_matches('/').split_once("://").is_some_and(|(scheme, rest)| {
                matches!(scheme, "http" | "https") && !rest.is_empty() && !rest.contains(['/', ' ', '?', '#', '@'])
            });
            if !ok {
                errs.push(format!(
                    "http.allowed_origins[{i}]: {o:?} is not an origin like \"https://startline.example.com\" (scheme, \
                     host and port only)"
                ));
            }
        }
        HttpSettings {
            listen: socket_addr(errs, "http.listen", &self.listen, "127.0.0.1:8080"),
            max_page_size: range(errs, "http.max_page_size", self.max_page_size, 1000, 1, 100_000),
            max_concurrent_reads: range(
                errs,
                "http.max_concurrent_reads",
                self.max_concurrent_reads,
                crate::api::reads::MAX_CONCURRENT_READS,
                1,
                1024,
            ),
            connections,
            login: login::LoginSettings {
                failures_per_minute: per_minute(
                    errs,
                    "http.login_failures_per_minute",
                    self.login_failures_per_minute,
                    login::LOGIN_FAILURES_PER_MINUTE,
                ),
                logins_per_identity_per_minute: per_minute(
                    errs,
                    "http.logins_per_identity_per_minute",
                    self.logins_per_identity_per_minute,
                    login::LOGINS_PER_IDENTITY_PER_MINUTE,
                ),
                max_sessions_per_identity: range(
                    errs,
                    "http.max_sessions_per_identity",
                    self.max_sessions_per_identity,
                    login::MAX_SESSIONS_PER_IDENTITY,
                    1,
                    login::MAX_SESSIONS,
                ),
                allowed_origins: self.allowed_origins.iter().map(|o| o.trim_end_matches('/').to_string()).collect(),
            },
        }
    }
}

/// A listener's `max_connections_per_ip`: `default`, or `max_connections` if that is lower, when unset; a value
/// over `max_connections` is reported (it could never be reached).
fn per_ip_cap(
    errs: &mut Vec<String>,
    section: &str,
    v: Option<usize>,
    default: usize,
    max_connections: usize,
) -> usize {
    if v.is_none() {
        return default.min(max_connections).max(1);
    }
    let name = format!("{section}.max_connections_per_ip");
    let n = range(errs, &name, v, default, 1, 1 << 20);
    if n > max_connections {
        errs.push(format!("{name}: {n} is more than {section}.max_connections = {max_connections}"));
    }
    n
}

/// The validated `[ingest]` fields.
struct IngestSettings {
    queue_capacity: usize,
    when_full: WhenFull,
    group_commit_max_events: usize,
    limits: startline_proto::Limits,
}

impl IngestSection {
    fn validate(&self, errs: &mut Vec<String>) -> IngestSettings {
        let queue_capacity = range(errs, "ingest.queue_capacity", self.queue_capacity, 256, 1, 1 << 20);
        let group_commit_max_events =
            range(errs, "ingest.group_commit_max_events", self.group_commit_max_events, 32_768, 1, 10_000_000);
        let when_full = match self.when_full.as_deref() {
            None | Some("wait") => WhenFull::Wait,
            Some("reject") => WhenFull::Reject,
            Some(other) => {
                errs.push(format!("ingest.when_full: {other:?} is not one of \"wait\", \"reject\""));
                WhenFull::Wait
            }
        };
        let skew =
            duration(errs, "ingest.max_future_skew", &self.max_future_skew, Duration::from_secs(300), Duration::ZERO);
        let max_labels = range(errs, "ingest.max_labels", self.max_labels, 16, 0, 64);
        IngestSettings {
            queue_capacity,
            when_full,
            group_commit_max_events,
            limits: startline_proto::Limits {
                max_future_skew_ms: i64::try_from(skew.as_millis()).unwrap_or(i64::MAX),
                max_labels,
            },
        }
    }
}

impl MetricsSection {
    fn validate(&self, errs: &mut Vec<String>) -> MetricsConfig {
        let otlp_interval = duration(
            errs,
            "metrics.otlp_interval",
            &self.otlp_interval,
            Duration::from_secs(30),
            Duration::from_secs(1),
        );
        match self.otlp_protocol.as_deref() {
            None | Some("grpc") => {}
            Some(other) => {
                errs.push(format!("metrics.otlp_protocol: {other:?} is not supported; only \"grpc\" is built"))
            }
        }
        if let Some(e) = &self.otlp_endpoint {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                errs.push(format!("metrics.otlp_endpoint: {e:?} must start with http:// or https://"));
            }
        }
        let (otlp_tls, otlp_headers) = crate::export::otlp_client_settings(
            errs,
            "metrics",
            self.otlp_endpoint.as_deref(),
            crate::export::OtlpClientFiles {
                ca_file: self.otlp_ca_file.as_deref(),
                client_cert_file: self.otlp_client_cert_file.as_deref(),
                client_key_file: self.otlp_client_key_file.as_deref(),
                bearer_token_file: self.otlp_bearer_token_file.as_deref(),
                headers: &self.otlp_headers,
            },
        );
        let histograms = match self.otlp_histograms.as_deref() {
            None | Some("exponential") => crate::export::OtlpHistograms::Exponential,
            Some("explicit") => crate::export::OtlpHistograms::Explicit,
            Some(other) => {
                errs.push(format!("metrics.otlp_histograms: {other:?} is not one of \"exponential\", \"explicit\""));
                crate::export::OtlpHistograms::Exponential
            }
        };
        if self.team_attribute != Some(true) && !self.teams.is_empty() {
            errs.push("metrics.teams: has no effect without metrics.team_attribute = true".to_string());
        }
        MetricsConfig {
            labels: crate::index::labels::LabelSettings {
                providers: self.providers.clone(),
                pools: self.pools.clone(),
                gpu_classes: self.gpu_classes.clone(),
                regions: self.regions.clone(),
                teams: self.teams.clone(),
                team_attribute: self.team_attribute.unwrap_or(false),
                max_values_per_label: range(
                    errs,
                    "metrics.max_values_per_label",
                    self.max_values_per_label,
                    64,
                    1,
                    1000,
                ),
            },
            otlp: self.otlp_endpoint.clone().map(|endpoint| crate::export::OtlpSettings {
                endpoint,
                interval: otlp_interval,
                tls: otlp_tls,
                headers: otlp_headers,
                histograms,
            }),
            max_series_per_metric: range(
                errs,
                "metrics.max_series_per_metric",
                self.max_series_per_metric,
                crate::export::DEFAULT_MAX_SERIES,
                10,
                100_000,
            ),
        }
    }
}

/// Across `[grpc]` and `[http]`: the two listeners cannot share a fixed address.
fn check_listeners_differ(errs: &mut Vec<String>, grpc_listen: SocketAddr, http_listen: SocketAddr) {
    if grpc_listen == http_listen && grpc_listen.port() != 0 {
        errs.push(format!("http.listen: {http_listen} is also grpc.listen"));
    }
}

/// Across `[store]` and `[[slo]]`: retention must keep the history of every SLO window.
fn check_retention_covers_slos(errs: &mut Vec<String>, retention: Option<Duration>, slos: &[crate::slo::SloDef]) {
    let Some(r) = retention else { return };
    for d in slos {
        if (r.as_millis() as i64) < d.window_ms {
            errs.push(format!(
                "store.retention: {} is shorter than slo {:?}'s window; its figures would lose history",
                humantime::format_duration(r),
                d.name
            ));
        }
    }
}

fn validate_slos(sections: &[SloSection], errs: &mut Vec<String>) -> Vec<crate::slo::SloDef> {
    use startline_proto::labels::Label;
    use startline_proto::pb;
    let mut out = Vec::new();
    let mut names = std::collections::HashSet::new();
    for (i, s) in sections.iter().enumerate() {
        let at = format!("slo[{i}]");
        let name = s.name.clone().unwrap_or_default();
        crate::slo::def::check_name(&at, &name, &mut names, errs);
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
        let objective = crate::slo::def::objective_share(&at, s.objective, "99", 0.99, errs);
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
            Some(h) => match crate::slo::Hours::parse(h, sel.timezone.as_deref()) {
                Ok(hours) => Some(hours),
                Err(problems) => {
                    errs.extend(problems.into_iter().map(|(field, why)| format!("{at}.selector.{field}: {why}")));
                    None
                }
            },
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
        assert_eq!(c.grpc_connections.max_connections_per_ip, 256);
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
    fn connection_caps_and_http_timeouts_have_safe_defaults_and_are_validated() {
        let c = FileConfig::default().validate().expect("defaults are valid");
        let h = c.http_connections;
        assert_eq!((h.max_connections, h.max_connections_per_ip), (256, 64));
        assert_eq!(
            (h.header_read_timeout, h.body_read_timeout, h.request_timeout, h.idle_timeout),
            (Duration::from_secs(10), Duration::from_secs(10), Duration::from_secs(30), Duration::from_secs(60))
        );
        // Defaults leave room under a 1024 open-file limit: HTTP's cap plus one address's gRPC connections.
        assert!(h.max_connections + c.grpc_connections.max_connections_per_ip < 1024 - 128);
        // An unset per-address cap follows a lower listener cap.
        let low = FileConfig::parse("[http]\nmax_connections = 10\n[grpc]\nmax_connections = 20\n").expect("parses");
        let low = low.validate().expect("valid");
        assert_eq!(low.http_connections.max_connections_per_ip, 10);
        assert_eq!(low.grpc_connections.max_connections_per_ip, 20);
        let f = FileConfig::parse(
            r#"
            [http]
            max_connections = 0
            max_connections_per_ip = 0
            header_read_timeout = "1ms"
            body_read_timeout = "soon"
            request_timeout = "2h"
            idle_timeout = "0s"
            [grpc]
            max_connections = 10
            max_connections_per_ip = 11
            "#,
        )
        .expect("parses");
        let errs = f.validate().expect_err("invalid").0;
        for expected in [
            "grpc.max_connections_per_ip: 11 is more than grpc.max_connections = 10",
            "http.max_connections: 0 is outside 1..=1048576",
            "http.max_connections_per_ip: 0 is outside 1..=1048576",
            "http.header_read_timeout: \"1ms\" is shorter than 100ms",
            "http.request_timeout: at most 1h (a connection must not be held longer)",
            "http.idle_timeout: \"0s\" is shorter than 1s",
        ] {
            assert!(errs.iter().any(|e| e == expected), "{expected} missing from {errs:?}");
        }
        assert!(errs.iter().any(|e| e.starts_with("http.body_read_timeout: \"soon\" is not a duration")), "{errs:?}");
    }

    #[test]
    fn login_throttles_session_caps_and_origins_have_defaults_and_are_validated() {
        let c = FileConfig::default().validate().expect("defaults are valid");
        assert_eq!(c.login, crate::api::auth::LoginSettings::default());
        assert_eq!((c.login.failures_per_minute, c.login.logins_per_identity_per_minute), (10, 30));
        assert_eq!(c.login.max_sessions_per_identity, 20);
        let f = FileConfig::parse(
            "[http]\nlogin_failures_per_minute = 0\nallowed_origins = [\"https://startline.example.com/\"]\n",
        )
        .expect("parses");
        let c = f.validate().expect("valid");
        assert_eq!(c.login.failures_per_minute, 0);
        assert_eq!(c.login.allowed_origins, ["https://startline.example.com"]);
        let f = FileConfig::parse(
            "[http]\nmax_sessions_per_identity = 0\nallowed_origins = [\"startline.example.com\", \"https://a/b\"]\n",
        )
        .expect("parses");
        let errs = f.validate().expect_err("invalid").0;
        for expected in ["http.max_sessions_per_identity: 0", "http.allowed_origins[0]", "http.allowed_origins[1]"] {
            assert!(errs.iter().any(|e| e.starts_with(expected)), "{expected} missing from {errs:?}");
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

    fn fields(errs: &[String]) -> Vec<&str> {
        errs.iter().filter_map(|e| e.split(':').next()).collect()
    }

    #[test]
    fn store_section_reports_each_bad_field() {
        let s = StoreSection {
            path: Some(PathBuf::new()),
            checkpoint_interval: Some("1ms".into()),
            retention: Some("2h".into()),
            retention_interval: Some("soon".into()),
            max_events_per_job: Some(0),
            fold_after: Some("later".into()),
            fold_interval: Some("1ms".into()),
            cache_mib: Some(1),
            hot_budget_mib: Some(0),
            folded_budget_mib: Some(1 << 21),
            log_segment_kib: Some(2),
            after_write_failure: Some("reopen".into()),
        };
        let mut errs = Vec::new();
        let v = s.validate(&mut errs);
        assert_eq!(errs[0], "store.path: must not be empty");
        assert_eq!(errs[1], "store.checkpoint_interval: \"1ms\" is shorter than 10ms");
        assert_eq!(errs[2], "store.retention: keep at least 1d (or \"0s\" for forever); SLO windows need the history");
        assert!(
            errs[3].starts_with("store.retention_interval: \"soon\" is not a duration like \"5m\": "),
            "{}",
            errs[3]
        );
        assert_eq!(errs[4], "store.max_events_per_job: 0 is outside 1..=10000000");
        assert!(errs[5].starts_with("store.fold_after: \"later\" is not a duration"), "{}", errs[5]);
        assert_eq!(errs[6], "store.fold_interval: \"1ms\" is shorter than 10ms");
        assert_eq!(errs[7], "store.cache_mib: 1 is outside 4..=1048576");
        assert_eq!(errs[8], "store.hot_budget_mib: 0 is outside 1..=1048576");
        assert_eq!(errs[9], "store.folded_budget_mib: 2097152 is outside 0..=1048576");
        assert_eq!(errs[10], "store.log_segment_kib: 2 is outside 64..=1048576");
        assert_eq!(errs[11], "store.after_write_failure: \"reopen\" is not \"restart\" or \"exit\"");
        assert_eq!(errs.len(), 12, "{errs:#?}");
        assert_eq!((v.checkpoint_interval, v.retention), (Duration::from_secs(2), None));
    }

    #[test]
    fn grpc_section_reports_each_bad_field() {
        let s = GrpcSection {
            listen: Some("nowhere".into()),
            max_message_bytes: Some(1),
            max_batch_events: Some(0),
            max_concurrent_streams: Some(0),
            max_inflight_batches: Some(5000),
            max_connections: Some(0),
            max_connections_per_ip: None,
            handshake_timeout: Some("1ms".into()),
            keepalive_interval: Some("often".into()),
            keepalive_timeout: Some("0s".into()),
            drain_timeout: Some("1h".into()),
        };
        let mut errs = Vec::new();
        s.validate(&mut errs);
        assert_eq!(
            fields(&errs),
            [
                "grpc.listen",
                "grpc.max_message_bytes",
                "grpc.max_batch_events",
                "grpc.max_concurrent_streams",
                "grpc.max_inflight_batches",
                "grpc.max_connections",
                "grpc.handshake_timeout",
                "grpc.keepalive_interval",
                "grpc.keepalive_timeout",
                "grpc.drain_timeout",
            ],
            "{errs:#?}"
        );
        assert_eq!(errs[0], "grpc.listen: \"nowhere\" is not a socket address like 127.0.0.1:8080");
        assert_eq!(errs[1], "grpc.max_message_bytes: 1 is outside 4096..=67108864");
        assert_eq!(errs[3], "grpc.max_concurrent_streams: 0 is outside 1..=65536");
        assert_eq!(errs[6], "grpc.handshake_timeout: \"1ms\" is shorter than 100ms");
        assert_eq!(errs[8], "grpc.keepalive_timeout: \"0s\" is shorter than 1s");
        assert_eq!(errs[9], "grpc.drain_timeout: at most 10m (a shutdown must finish)");
    }

    #[test]
    fn http_section_reports_each_bad_field() {
        let s = HttpSection { listen: Some("8080".into()), max_page_size: Some(0), ..Default::default() };
        let mut errs = Vec::new();
        s.validate(&mut errs);
        assert_eq!(
            errs,
            [
                "http.listen: \"8080\" is not a socket address like 127.0.0.1:8080",
                "http.max_page_size: 0 is outside 1..=100000",
            ]
        );
    }

    #[test]
    fn ingest_section_reports_each_bad_field() {
        let s = IngestSection {
            queue_capacity: Some(0),
            when_full: Some("drop".into()),
            group_commit_max_events: Some(0),
            max_future_skew: Some("soon".into()),
            max_labels: Some(65),
        };
        let mut errs = Vec::new();
        let v = s.validate(&mut errs);
        assert_eq!(errs[0], "ingest.queue_capacity: 0 is outside 1..=1048576");
        assert_eq!(errs[1], "ingest.group_commit_max_events: 0 is outside 1..=10000000");
        assert_eq!(errs[2], "ingest.when_full: \"drop\" is not one of \"wait\", \"reject\"");
        assert!(errs[3].starts_with("ingest.max_future_skew: \"soon\" is not a duration"), "{}", errs[3]);
        assert_eq!(errs[4], "ingest.max_labels: 65 is outside 0..=64");
        assert_eq!(errs.len(), 5, "{errs:#?}");
        assert_eq!(v.when_full, WhenFull::Wait);
        assert_eq!(v.limits.max_future_skew_ms, 300_000);
    }

    #[test]
    fn history_export_reports_each_bad_field() {
        let errs = |text: &str| match FileConfig::parse(text).expect("parses").validate() {
            Ok(_) => Vec::new(),
            Err(e) => e.0,
        };
        assert_eq!(
            errs("[history.export]\ninterval = \"1m\""),
            vec!["history.export.url: required, e.g. \"s3://bucket/startline\"".to_string()]
        );
        let all = errs(
            "[history.export]\nurl = \"s3://Bad_Bucket/x\"\nendpoint = \"ftp://minio\"\nregion = \"eu west\"\n\
             interval = \"500ms\"\ncollector_id = \"../up\"",
        );
        assert_eq!(all.len(), 5, "{all:#?}");
        for (e, field) in all.iter().zip(["url", "endpoint", "region", "interval", "collector_id"]) {
            assert!(e.starts_with(&format!("history.export.{field}: ")), "{e}");
        }
        assert!(all[0].contains("\"Bad_Bucket\" is not a bucket name"), "{}", all[0]);
        assert!(all[3].contains("shorter than 1s"), "{}", all[3]);
        let http = errs("[history.export]\nurl = \"s3://bucket\"\nendpoint = \"http://127.0.0.1:9000\"");
        assert_eq!(http.len(), 1, "{http:?}");
        assert!(http[0].starts_with("history.export.endpoint: \"http://127.0.0.1:9000\" is plain http"), "{http:?}");
        assert!(http[0].contains("history.export.allow_http = true"), "{http:?}");
        let off = errs("[history]\nenabled = false\n[history.export]\nurl = \"s3://bucket\"");
        assert_eq!(off, vec!["history.export: needs history files; remove it or set history.enabled = true"]);

        let c = FileConfig::parse(
            "[history.export]\nurl = \"s3://bucket/a/b/\"\nendpoint = \"http://127.0.0.1:9000\"\n\
             allow_http = true\ncollector_id = \"eu-1\"",
        )
        .expect("parses")
        .validate()
        .expect("valid");
        let x = c.history_export.expect("export on");
        assert_eq!((x.bucket.as_str(), x.prefix.as_str(), x.collector_id.as_str()), ("bucket", "a/b", "eu-1"));
        assert_eq!(x.interval, Duration::from_secs(300));
        assert!(x.allow_http && x.region.is_none());
        assert_eq!(x.key_of(0), "a/b/end_date=1970-01-01/eu-1.parquet");
        let d =
            FileConfig::parse("[history.export]\nurl = \"s3://bucket\"").expect("parses").validate().expect("valid");
        let x = d.history_export.expect("export on");
        assert_eq!(x.collector_id, crate::export::history::default_collector_id());
        assert!(!x.allow_http);
        assert!(FileConfig::parse("").expect("parses").validate().expect("valid").history_export.is_none());
    }

    #[test]
    fn metrics_section_reports_each_bad_field() {
        let s = MetricsSection {
            max_values_per_label: Some(0),
            otlp_endpoint: Some("collector:4317".into()),
            otlp_protocol: Some("http/protobuf".into()),
            otlp_interval: Some("1ms".into()),
            ..Default::default()
        };
        let mut errs = Vec::new();
        let v = s.validate(&mut errs);
        assert_eq!(
            errs,
            [
                "metrics.otlp_interval: \"1ms\" is shorter than 1s",
                "metrics.otlp_protocol: \"http/protobuf\" is not supported; only \"grpc\" is built",
                "metrics.otlp_endpoint: \"collector:4317\" must start with http:// or https://",
                "metrics.max_values_per_label: 0 is outside 1..=1000",
            ]
        );
        assert_eq!(v.otlp.map(|o| o.interval), Some(Duration::from_secs(30)));
    }

    #[test]
    fn listeners_may_share_only_an_ephemeral_port() {
        let fixed: SocketAddr = "127.0.0.1:8080".parse().expect("addr");
        let ephemeral: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let mut errs = Vec::new();
        check_listeners_differ(&mut errs, ephemeral, ephemeral);
        assert!(errs.is_empty());
        check_listeners_differ(&mut errs, fixed, fixed);
        assert_eq!(errs, ["http.listen: 127.0.0.1:8080 is also grpc.listen"]);
    }

    #[test]
    fn retention_shorter_than_an_slo_window_names_the_slo() {
        let slos = crate::slo::SloDef::defaults();
        let mut errs = Vec::new();
        check_retention_covers_slos(&mut errs, None, &slos);
        check_retention_covers_slos(&mut errs, Some(Duration::from_secs(90 * 86_400)), &slos);
        assert!(errs.is_empty(), "{errs:?}");
        check_retention_covers_slos(&mut errs, Some(Duration::from_secs(7 * 86_400)), &slos);
        assert_eq!(
            errs[0],
            "store.retention: 7days is shorter than slo \"urgent-start\"'s window; its figures would lose history"
        );
        assert_eq!(errs.len(), slos.len());
    }

    #[test]
    fn example_config_in_deploy_parses_and_validates() {
        for path in [
            concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/collector.example.toml"),
            concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/demo.toml"),
        ] {
            let f = FileConfig::load(std::path::Path::new(path)).expect("example config loads");
            let c = f.validate().expect("example config is valid");
            assert_eq!(c.cost.configured(), path.ends_with("demo.toml"), "{path}");
        }
    }
}
