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
}

/// `[store]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSection {
    /// Directory of the sled database. Default `./startline-data`.
    pub path: Option<PathBuf>,
    /// How often job snapshots are checkpointed, e.g. `"2s"`. Default 2s.
    pub checkpoint_interval: Option<String>,
}

/// `[grpc]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcSection {
    /// Listen address for ingest. Default `127.0.0.1:50051`.
    pub listen: Option<String>,
    /// Largest gRPC message accepted, in bytes. Default 16 MiB.
    pub max_message_bytes: Option<usize>,
    /// Most events in one batch. Default 10000.
    pub max_batch_events: Option<usize>,
    /// Most concurrent streams per connection. Default 256.
    pub max_concurrent_streams: Option<u32>,
    /// Batches one stream may have waiting for their ack. Default 32.
    pub max_inflight_batches: Option<usize>,
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
        let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text).map_err(|message| LoadError::Parse {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Parses TOML text.
    pub fn parse(text: &str) -> Result<FileConfig, String> {
        toml::from_str(text).map_err(|e| e.to_string().trim().to_string())
    }

    /// Checks every field and builds the validated config, or lists every problem.
    pub fn validate(&self) -> Result<Config, ConfigErrors> {
        let mut errs = Vec::new();
        let addr =
            |errs: &mut Vec<String>, name: &str, v: &Option<String>, def: &str| -> SocketAddr {
                let s = v.as_deref().unwrap_or(def);
                s.parse().unwrap_or_else(|_| {
                    errs.push(format!(
                        "{name}: {s:?} is not a socket address like 127.0.0.1:8080"
                    ));
                    SocketAddr::from(([127, 0, 0, 1], 0))
                })
            };
        let dur = |errs: &mut Vec<String>,
                   name: &str,
                   v: &Option<String>,
                   def: Duration,
                   min: Duration| {
            match v {
                None => def,
                Some(s) => match humantime::parse_duration(s) {
                    Ok(d) if d >= min => d,
                    Ok(_) => {
                        errs.push(format!(
                            "{name}: {s:?} is shorter than {}",
                            humantime::format_duration(min)
                        ));
                        def
                    }
                    Err(e) => {
                        errs.push(format!("{name}: {s:?} is not a duration like \"5m\": {e}"));
                        def
                    }
                },
            }
        };
        let range = |errs: &mut Vec<String>,
                     name: &str,
                     v: Option<usize>,
                     def: usize,
                     lo: usize,
                     hi: usize| {
            let x = v.unwrap_or(def);
            if !(lo..=hi).contains(&x) {
                errs.push(format!("{name}: {x} is outside {lo}..={hi}"));
            }
            x
        };

        let store_path = self
            .store
            .path
            .clone()
            .unwrap_or_else(|| PathBuf::from("./startline-data"));
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
        let grpc_listen = addr(
            &mut errs,
            "grpc.listen",
            &self.grpc.listen,
            "127.0.0.1:50051",
        );
        let http_listen = addr(
            &mut errs,
            "http.listen",
            &self.http.listen,
            "127.0.0.1:8080",
        );
        if grpc_listen == http_listen && grpc_listen.port() != 0 {
            errs.push(format!("http.listen: {http_listen} is also grpc.listen"));
        }
        let max_message_bytes = range(
            &mut errs,
            "grpc.max_message_bytes",
            self.grpc.max_message_bytes,
            16 << 20,
            4096,
            256 << 20,
        );
        let max_batch_events = range(
            &mut errs,
            "grpc.max_batch_events",
            self.grpc.max_batch_events,
            10_000,
            1,
            1_000_000,
        );
        let max_concurrent_streams = range(
            &mut errs,
            "grpc.max_concurrent_streams",
            self.grpc.max_concurrent_streams.map(|v| v as usize),
            256,
            1,
            65_536,
        ) as u32;
        let max_inflight_batches = range(
            &mut errs,
            "grpc.max_inflight_batches",
            self.grpc.max_inflight_batches,
            32,
            1,
            4096,
        );
        let max_page_size = range(
            &mut errs,
            "http.max_page_size",
            self.http.max_page_size,
            1000,
            1,
            100_000,
        );
        let queue_capacity = range(
            &mut errs,
            "ingest.queue_capacity",
            self.ingest.queue_capacity,
            256,
            1,
            1 << 20,
        );
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
                errs.push(format!(
                    "ingest.when_full: {other:?} is not one of \"wait\", \"reject\""
                ));
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
        let max_labels = range(
            &mut errs,
            "ingest.max_labels",
            self.ingest.max_labels,
            16,
            0,
            64,
        );
        if !errs.is_empty() {
            return Err(ConfigErrors(errs));
        }
        Ok(Config {
            store_path,
            checkpoint_interval,
            grpc_listen,
            max_message_bytes,
            max_batch_events,
            max_concurrent_streams,
            max_inflight_batches,
            http_listen,
            max_page_size,
            queue_capacity,
            when_full,
            group_commit_max_events,
            limits: startline_proto::Limits {
                max_future_skew_ms: i64::try_from(skew.as_millis()).unwrap_or(i64::MAX),
                max_labels,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_with_no_config_at_all() {
        let c = FileConfig::default()
            .validate()
            .expect("defaults are valid");
        assert_eq!(c.store_path, PathBuf::from("./startline-data"));
        assert!(c.grpc_listen.ip().is_loopback() && c.http_listen.ip().is_loopback());
        assert_eq!(c.when_full, WhenFull::Wait);
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
        for needle in [
            "grpc.listen",
            "grpc.max_batch_events",
            "ingest.when_full",
            "ingest.max_future_skew",
        ] {
            assert!(
                errs.iter().any(|e| e.starts_with(needle)),
                "{needle} missing from {errs:?}"
            );
        }
    }

    #[test]
    fn unknown_keys_are_errors() {
        let e = FileConfig::parse("[grpc]\nlisten_addr = \"x\"\n").expect_err("unknown key");
        assert!(e.contains("listen_addr"), "{e}");
    }

    #[test]
    fn example_config_in_deploy_parses_and_validates() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/collector.example.toml"
        );
        let f = FileConfig::load(std::path::Path::new(path)).expect("example config loads");
        f.validate().expect("example config is valid");
    }
}
