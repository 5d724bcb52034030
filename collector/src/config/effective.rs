//! The effective configuration: a validated [`Config`] written back as a [`FileConfig`] with every default filled
//! in, so `startline-collector check-config` prints TOML that the collector reads back to the same settings, and
//! a reload can tell which sections changed. Secrets never appear: header values are replaced by `<secret>`
//! (token hashes and file paths are not secrets and are printed as written).

use super::{Config, FileConfig, SloSection};
use crate::alert::config::TargetEntry;
use crate::ingest::WhenFull;
use crate::settings::format_duration;
use startline_proto::labels::Label;
use std::time::Duration;

/// What replaces a secret value in printed configuration.
pub const REDACTED: &str = "<secret>";

impl Config {
    /// The configuration in effect, as a file: every field set, defaults included, secrets redacted.
    pub fn effective(&self) -> FileConfig {
        let mut f = self.written.clone();
        let ms = |ms: i64| format_duration(Duration::from_millis(ms.max(0) as u64));
        let dur = |d: Duration| Some(format_duration(d));

        f.store.path = Some(self.store_path.clone());
        f.store.checkpoint_interval = dur(self.checkpoint_interval);
        f.store.retention = dur(self.retention.unwrap_or(Duration::ZERO));
        f.store.retention_interval = dur(self.retention_interval);
        f.store.max_events_per_job = Some(self.max_events_per_job);
        f.store.fold_after = dur(self.fold_after.unwrap_or(Duration::ZERO));
        f.store.fold_interval = dur(self.fold_interval);
        f.store.cache_mib = Some((self.cache_bytes >> 20) as usize);
        f.store.hot_budget_mib = Some((self.hot_budget_bytes >> 20) as usize);
        f.store.folded_budget_mib = Some((self.folded_budget_bytes >> 20) as usize);
        f.store.log_segment_kib = Some((self.log_segment_bytes >> 10) as usize);
        f.history = super::HistorySection::of(self.history, self.history_export.as_ref());
        f.store.after_write_failure = Some(self.after_write_failure.as_str().to_string());

        let c = &self.grpc_connections;
        f.grpc.listen = Some(self.grpc_listen.to_string());
        f.grpc.max_message_bytes = Some(self.max_message_bytes);
        f.grpc.max_batch_events = Some(self.max_batch_events);
        f.grpc.max_concurrent_streams = Some(self.max_concurrent_streams);
        f.grpc.max_inflight_batches = Some(self.max_inflight_batches);
        f.grpc.max_connections = Some(c.max_connections);
        f.grpc.max_connections_per_ip = Some(c.max_connections_per_ip);
        f.grpc.handshake_timeout = dur(c.handshake_timeout);
        f.grpc.keepalive_interval = dur(c.keepalive_interval);
        f.grpc.keepalive_timeout = dur(c.keepalive_timeout);
        f.grpc.drain_timeout = dur(c.drain_timeout);

        f.http.listen = Some(self.http_listen.to_string());
        f.http.max_page_size = Some(self.max_page_size);
        f.http.max_concurrent_reads = Some(self.max_concurrent_reads);
        let h = &self.http_connections;
        f.http.max_connections = Some(h.max_connections);
        f.http.max_connections_per_ip = Some(h.max_connections_per_ip);
        f.http.header_read_timeout = dur(h.header_read_timeout);
        f.http.body_read_timeout = dur(h.body_read_timeout);
        f.http.request_timeout = dur(h.request_timeout);
        f.http.idle_timeout = dur(h.idle_timeout);
        let l = &self.login;
        f.http.login_failures_per_minute = Some(l.failures_per_minute as usize);
        f.http.logins_per_identity_per_minute = Some(l.logins_per_identity_per_minute as usize);
        f.http.max_sessions_per_identity = Some(l.max_sessions_per_identity);
        f.http.allowed_origins = l.allowed_origins.clone();

        f.ingest.queue_capacity = Some(self.queue_capacity);
        f.ingest.when_full = Some(match self.when_full {
            WhenFull::Wait => "wait".to_string(),
            WhenFull::Reject => "reject".to_string(),
        });
        f.ingest.group_commit_max_events = Some(self.group_commit_max_events);
        f.ingest.max_future_skew = Some(ms(self.limits.max_future_skew_ms));
        f.ingest.max_labels = Some(self.limits.max_labels);

        f.slo = self.slos.iter().map(slo_section).collect();

        f.chain_slo = self.chain_slos.iter().map(|d| d.section()).collect();
        f.prediction = crate::slo::predict::PredictionSection::of(&self.prediction);
        f.stream = crate::stream::StreamSection::of(&self.stream);
        f.chains.evaluation_interval = Some(ms(self.chain_interval_ms));
        f.nodes.window = Some(ms(self.nodes.window_ms));
        f.nodes.alpha = Some(self.nodes.rule.alpha);
        f.nodes.min_bad = Some(self.nodes.rule.min_bad);
        f.nodes.ecc_corrected_threshold = Some(self.nodes.rule.ecc_corrected_threshold);
        f.nodes.alert = Some(self.nodes.alert);
        f.nodes.evaluation_interval = Some(ms(self.nodes.evaluation_interval_ms));

        let a = &self.alerts;
        f.alerts.evaluation_interval = dur(a.evaluation_interval);
        f.alerts.resend_interval = dur(a.resend_interval);
        f.alerts.min_jobs = Some(a.min_jobs);
        f.alerts.resolved_retention = dur(a.resolved_retention);
        f.alerts.page_max_age = dur(a.page_max_age);
        f.alerts.external_url = a.external_url.clone();
        f.alerts.runbook_base_url = a.runbook_base_url.clone();
        for t in f.alerts.alertmanager.iter_mut().chain(f.alerts.webhook.iter_mut()) {
            if let TargetEntry::Table(t) = t {
                t.timeout = Some(format_duration(match &t.timeout {
                    Some(s) => humantime::parse_duration(s).unwrap_or(crate::alert::config::DEFAULT_TIMEOUT),
                    None => crate::alert::config::DEFAULT_TIMEOUT,
                }));
            }
        }

        let m = &self.metrics;
        f.metrics.providers = m.labels.providers.clone();
        f.metrics.pools = m.labels.pools.clone();
        f.metrics.gpu_classes = m.labels.gpu_classes.clone();
        f.metrics.regions = m.labels.regions.clone();
        f.metrics.max_values_per_label = Some(m.labels.max_values_per_label);
        f.metrics.teams = m.labels.teams.clone();
        f.metrics.team_attribute = Some(m.labels.team_attribute);
        f.metrics.max_series_per_metric = Some(m.max_series_per_metric);
        if let Some(o) = &m.otlp {
            f.metrics.otlp_protocol = Some("grpc".to_string());
            f.metrics.otlp_interval = dur(o.interval);
            f.metrics.otlp_histograms = Some(
                match o.histograms {
                    crate::export::OtlpHistograms::Exponential => "exponential",
                    crate::export::OtlpHistograms::Explicit => "explicit",
                }
                .to_string(),
            );
        }

        if let Some(l) = &self.logs {
            f.logs.events = Some(l.events);
            f.logs.summaries = Some(l.summaries);
            f.logs.queue_events = Some(l.queue_events);
            f.logs.batch_records = Some(l.batch_records);
            f.logs.flush_interval = dur(l.flush_interval);
        }

        f.auth.insecure = Some(self.auth.insecure);
        f.auth.max_open_jobs = Some(f.auth.max_open_jobs.unwrap_or(crate::auth::config::MAX_OPEN_JOBS));
        f.auth.metrics = Some(if self.auth.metrics_protected { "read" } else { "open" }.to_string());
        f
    }

    /// [`Config::effective`] as TOML, headed by a comment naming its source.
    pub fn effective_toml(&self) -> Result<String, String> {
        let body = toml::to_string(&self.effective()).map_err(|e| e.to_string())?;
        let o = &self.overrides;
        let overridden = o.data_dir.is_some() || o.grpc_listen.is_some() || o.http_listen.is_some();
        let from = format!(
            "{}{}",
            self.source.as_ref().map_or_else(|| "built-in defaults".to_string(), |p| p.display().to_string()),
            if overridden { " and command-line flags" } else { "" }
        );
        Ok(format!(
            "# Effective startline-collector configuration from {from}.\n# Every default is filled in; secret \
             values are shown as \"{REDACTED}\".\n\n{body}"
        ))
    }
}

/// One SLO definition as a `[[slo]]` section.
fn slo_section(d: &crate::slo::SloDef) -> SloSection {
    let s = &d.selector;
    // Percent with the float noise of the division by 100 removed (0.995 -> 99.5, not 99.49999999999999).
    let objective = (d.objective * 100.0 * 1e9).round() / 1e9;
    SloSection {
        name: Some(d.name.clone()),
        description: Some(d.description.clone()),
        threshold: Some(format_duration(Duration::from_millis(d.threshold_ms.max(0) as u64))),
        objective: Some(objective),
        window: Some(format_duration(Duration::from_millis(d.window_ms.max(0) as u64))),
        page_on_breach: Some(d.page_on_breach),
        exclude_cancelled: Some(d.exclude_cancelled),
        selector: super::SelectorSection {
            priority: s.priority.iter().map(|p| p.label().to_string()).collect(),
            pool_kind: s.pool_kind.iter().map(|p| p.label().to_string()).collect(),
            provider: s.provider.clone(),
            pool: s.pool.clone(),
            gpu_class: s.gpu_class.clone(),
            region: s.region.clone(),
            gpu_count_min: s.gpu_count_min,
            gpu_count_max: s.gpu_count_max,
            hours: s.hours.as_ref().map(|h| {
                format!("{:02}:{:02}-{:02}:{:02}", h.from_min / 60, h.from_min % 60, h.to_min / 60, h.to_min % 60)
            }),
            timezone: s.hours.as_ref().map(|h| h.tz_name.clone()),
        },
    }
}

/// The sections of two effective configurations that differ, by name (`store`, `grpc`, `slo`, ...).
pub fn changed_sections(old: &FileConfig, new: &FileConfig) -> Vec<&'static str> {
    fn text<T: serde::Serialize>(v: &T) -> String {
        toml::to_string(v).unwrap_or_default()
    }
    #[derive(serde::Serialize)]
    struct Slos<'a> {
        slo: &'a [SloSection],
    }
    let mut out = Vec::new();
    #[derive(serde::Serialize)]
    struct ChainSlos<'a> {
        chain_slo: &'a [crate::slo::chain::ChainSloSection],
    }
    let pairs: [(&'static str, String, String); 17] = [
        ("store", text(&old.store), text(&new.store)),
        ("history", text(&old.history), text(&new.history)),
        ("grpc", text(&old.grpc), text(&new.grpc)),
        ("http", text(&old.http), text(&new.http)),
        ("ingest", text(&old.ingest), text(&new.ingest)),
        ("slo", text(&Slos { slo: &old.slo }), text(&Slos { slo: &new.slo })),
        ("alerts", text(&old.alerts), text(&new.alerts)),
        ("metrics", text(&old.metrics), text(&new.metrics)),
        ("logs", text(&old.logs), text(&new.logs)),
        ("cost", text(&old.cost), text(&new.cost)),
        ("chains", text(&old.chains), text(&new.chains)),
        ("nodes", text(&old.nodes), text(&new.nodes)),
        ("prediction", text(&old.prediction), text(&new.prediction)),
        ("stream", text(&old.stream), text(&new.stream)),
        ("chain_slo", text(&ChainSlos { chain_slo: &old.chain_slo }), text(&ChainSlos { chain_slo: &new.chain_slo })),
        ("auth", text(&old.auth), text(&new.auth)),
        ("tls", text(&old.tls), text(&new.tls)),
    ];
    for (name, a, b) in pairs {
        if a != b {
            out.push(name);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn effective(text: &str) -> String {
        let c = FileConfig::parse(text).expect("parses").validate().expect("valid");
        c.effective_toml().expect("prints")
    }

    /// Printing, reading back and printing again gives the same text: what check-config prints is a config that
    /// means exactly what is running.
    #[test]
    fn effective_config_reads_back_to_the_same_settings() {
        let example = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/collector.example.toml"))
            .expect("example config");
        let rich = r#"
            [store]
            retention = "0s"
            fold_after = "0s"
            checkpoint_interval = "1500ms"
            [ingest]
            when_full = "reject"
            max_future_skew = "90s"
            [[slo]]
            name = "night"
            threshold = "1h30m"
            objective = 99.5
            window = "7d"
            selector = { hours = "22:00-06:00", timezone = "Europe/Moscow", gpu_count_max = 8, provider = ["slurm"] }
            [alerts]
            webhook = ["http://127.0.0.1:9/hook", { url = "http://127.0.0.1:9/b", headers = { "X-Key" = "hunter2" } }]
            [metrics]
            pools = ["a100"]
            otlp_endpoint = "http://127.0.0.1:4317"
            otlp_headers = { "x-scope-orgid" = "team-secret" }
            [history.export]
            url = "s3://warehouse/startline/"
            endpoint = "http://127.0.0.1:9000"
            allow_http = true
            collector_id = "eu-1"
        "#;
        for text in ["", example.as_str(), rich] {
            let once = effective(text);
            let body: String = once.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n");
            let twice = effective(&body);
            assert_eq!(
                once.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>(),
                twice.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>()
            );
        }
        let rich_out = effective(rich);
        for expected in [
            "retention = \"0s\"",
            "fold_after = \"0s\"",
            "checkpoint_interval = \"1s500ms\"",
            "when_full = \"reject\"",
            "max_future_skew = \"1m30s\"",
            "threshold = \"1h30m\"",
            "objective = 99.5",
            "hours = \"22:00-06:00\"",
            "timezone = \"Europe/Moscow\"",
            "timeout = \"5s\"",
            "otlp_protocol = \"grpc\"",
            "X-Key = \"<secret>\"",
            "x-scope-orgid = \"<secret>\"",
            "[history.export]\nurl = \"s3://warehouse/startline\"\nendpoint = \"http://127.0.0.1:9000\"\nallow_http = true\ninterval = \"5m\"\ncollector_id = \"eu-1\"",
        ] {
            assert!(rich_out.contains(expected), "{expected} missing from:\n{rich_out}");
        }
        assert!(!rich_out.contains("hunter2") && !rich_out.contains("team-secret"), "a secret was printed");
    }

    #[test]
    fn defaults_are_printed_for_an_empty_file() {
        let out = effective("");
        for expected in [
            "path = \"./startline-data\"",
            "listen = \"127.0.0.1:50051\"",
            "listen = \"127.0.0.1:8080\"",
            "retention = \"90d\"",
            "name = \"urgent-start\"",
            "name = \"normal-start\"",
            "page_max_age = \"1h\"",
            "insecure = false",
            "metrics = \"open\"",
        ] {
            assert!(out.contains(expected), "{expected} missing from:\n{out}");
        }
    }

    #[test]
    fn connection_limits_and_timeouts_are_printed() {
        let out = effective("");
        let http = out.split("[http]").nth(1).and_then(|t| t.split("\n[").next()).expect("[http] printed");
        for expected in [
            "max_connections = 256",
            "max_connections_per_ip = 64",
            "header_read_timeout = \"10s\"",
            "body_read_timeout = \"10s\"",
            "request_timeout = \"30s\"",
            "idle_timeout = \"1m\"",
        ] {
            assert!(http.contains(expected), "{expected} missing from [http]:\n{http}");
        }
        let grpc = out.split("[grpc]").nth(1).and_then(|t| t.split("\n[").next()).expect("[grpc] printed");
        assert!(grpc.contains("max_connections_per_ip = 256"), "{grpc}");
    }

    #[test]
    fn changed_sections_names_exactly_what_changed() {
        let base = FileConfig::parse("").expect("parses").validate().expect("valid").effective();
        let same = FileConfig::parse("[store]\nretention = \"90d\"").expect("parses").validate().expect("valid");
        assert!(changed_sections(&base, &same.effective()).is_empty());
        let other = FileConfig::parse(
            "[grpc]\nlisten = \"127.0.0.1:1\"\n[alerts]\nmin_jobs = 9\n[[slo]]\nname = \"x\"\nthreshold = \"1m\"\nobjective = 90",
        )
        .expect("parses")
        .validate()
        .expect("valid");
        assert_eq!(changed_sections(&base, &other.effective()), vec!["grpc", "slo", "alerts"]);
        let export =
            FileConfig::parse("[history.export]\nurl = \"s3://bucket/p\"").expect("parses").validate().expect("valid");
        assert_eq!(changed_sections(&base, &export.effective()), vec!["history"]);
    }
}
