//! Alerting settings: the `[alerts]` section as written in the config file ([`AlertsSection`]) and the validated
//! [`AlertConfig`] the alert loop and notifiers run with. The crate's `config` module reads the file and calls
//! [`AlertsSection::validate`] alongside every other section's.
//!
//! Each `alertmanager` / `webhook` entry is either a URL string (`"http://127.0.0.1:9093"`) or a table
//! ([`TargetSection`]) with a CA file, a client certificate, bearer or basic auth, extra headers and a timeout.
//! Validation reads every file once, at start, and builds each target's HTTP client ([`NotifierTarget`]), so a
//! missing or unreadable file stops the start with the field named (`alerts.alertmanager[1].ca_file: ...`).
//! Secrets are [`Secret`]s: never in `Debug` output, logs or error messages.

use super::client::{build_http_client, read_secret_file, ClientTlsFiles, Secret};
use crate::settings::duration;
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// `[alerts]`
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AlertsSection {
    /// Alertmanagers: base URLs (`http://host:port`, `https://...`) or tables; alerts go to `/api/v2/alerts`.
    #[serde(default)]
    pub alertmanager: Vec<TargetEntry>,
    /// Generic JSON webhooks: URLs or tables.
    #[serde(default)]
    pub webhook: Vec<TargetEntry>,
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
    /// The collector's URL as users reach it (`https://startline.example.com`): alerts' `generatorURL`, the
    /// webhook's `externalURL` and the dashboard links in annotations. Default: the HTTP listener's address
    /// (the host's name in place of an unspecified `0.0.0.0`).
    pub external_url: Option<String>,
    /// Labels added to every alert, e.g. `{ cluster = "eu-1", environment = "prod" }` (for routing and for
    /// telling collectors apart; they cannot replace Startline's own labels).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Runbook links by alert name, e.g. `{ StartlineJobStartBreach = "https://wiki/startline#breach" }`: the
    /// `runbook_url` annotation of those alerts.
    #[serde(default)]
    pub runbook_urls: BTreeMap<String, String>,
    /// Where the runbooks are served (the docs' `runbooks.html`, e.g. `https://docs.example.com/startline/runbooks.html`):
    /// every alert without an entry in `runbook_urls` gets `runbook_url = <this>#<alert name in lower case>`, and
    /// `startline-collector rules` puts the same link on every rule it writes. Default: no link.
    pub runbook_base_url: Option<String>,
}

/// Labels Startline sets itself; `alerts.labels` may not use them.
pub const OWN_LABELS: &[&str] = &[
    "alertname",
    "severity",
    "slo",
    "job_id",
    "pool_kind",
    "provider",
    "pool",
    "priority",
    "gpu_class",
    "region",
    "team",
];

/// The alert names the collector raises (each has a section in the docs' runbooks).
pub const ALERT_NAMES: &[&str] = &[
    "StartlineJobStartBreach",
    "StartlineJobStartBreachPredicted",
    "StartlineSLOBurnRate",
    "StartlineChainLate",
    "StartlineChainSLOBurnRate",
    "StartlineNodeSuspect",
];

/// The runbook link of `alertname` under `base` (the runbooks page): its section's anchor is the name in lower case.
pub fn runbook_link(base: &str, alertname: &str) -> String {
    format!("{base}#{}", alertname.to_ascii_lowercase())
}

/// One notifier entry as written: a URL string, or a table.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum TargetEntry {
    /// `"https://am.example:9093"`
    Url(String),
    /// `{ url = "...", ca_file = "...", ... }`
    Table(TargetSection),
}

impl From<&str> for TargetEntry {
    fn from(url: &str) -> TargetEntry {
        TargetEntry::Url(url.to_string())
    }
}

/// A string or a table. Written by hand rather than `#[serde(untagged)]` so that a mistake inside a table keeps
/// serde's own message (`unknown field "urll", expected one of ...`) instead of "did not match any variant".
impl<'de> Deserialize<'de> for TargetEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<TargetEntry, D::Error> {
        struct EntryVisitor;
        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = TargetEntry;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a URL string or a table with a `url`")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<TargetEntry, E> {
                Ok(TargetEntry::Url(s.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<TargetEntry, A::Error> {
                TargetSection::deserialize(de::value::MapAccessDeserializer::new(m)).map(TargetEntry::Table)
            }
        }
        d.deserialize_any(EntryVisitor)
    }
}

/// A notifier entry written as a table.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TargetSection {
    /// `http://` or `https://` URL, without credentials in it.
    pub url: String,
    /// PEM CA bundle trusted for `https://` instead of the built-in (webpki) roots.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (mTLS); needs `client_key_file`.
    pub client_cert_file: Option<PathBuf>,
    /// PEM private key of `client_cert_file`.
    pub client_key_file: Option<PathBuf>,
    /// File holding a bearer token, sent as `Authorization: Bearer <token>`.
    pub bearer_token_file: Option<PathBuf>,
    /// HTTP basic auth; the password comes from a file.
    pub basic_auth: Option<BasicAuthSection>,
    /// Extra request headers, e.g. `{ "X-Scope-OrgID" = "team-a" }`. Values are treated as secrets (never logged).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Timeout of one request (connect included). Default 5s.
    pub timeout: Option<String>,
}

/// `basic_auth = { username = "...", password_file = "..." }`
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuthSection {
    /// User name.
    pub username: String,
    /// File holding the password.
    pub password_file: PathBuf,
}

/// How a target authenticates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotifierAuth {
    /// No credentials.
    None,
    /// `Authorization: Bearer <token>`.
    Bearer(Secret),
    /// `Authorization: Basic ...`.
    Basic {
        /// User name (not secret).
        username: String,
        /// Password.
        password: Secret,
    },
}

/// A validated notifier target with its HTTP client (one per target, reused for every post).
#[derive(Clone)]
pub struct NotifierTarget {
    /// Its config field, e.g. `alerts.alertmanager[1]`: the name in logs and metrics.
    pub name: String,
    /// Where to post (for Alertmanager, the base URL; `/api/v2/alerts` is appended).
    pub url: reqwest::Url,
    /// Credentials.
    pub auth: NotifierAuth,
    /// Extra headers, values marked sensitive.
    pub headers: reqwest::header::HeaderMap,
    /// Request timeout.
    pub timeout: Duration,
    /// TLS files (paths only in `Debug`).
    pub tls: ClientTlsFiles,
    /// The client: connection pool, TLS roots and identity, timeout.
    pub client: reqwest::Client,
}

impl fmt::Debug for NotifierTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NotifierTarget")
            .field("name", &self.name)
            .field("url", &self.url.as_str())
            .field("auth", &self.auth)
            .field("headers", &self.headers.keys().map(|k| k.as_str()).collect::<Vec<_>>())
            .field("timeout", &self.timeout)
            .field("tls", &self.tls)
            .finish()
    }
}

impl NotifierTarget {
    /// A plain target with no credentials and the default timeout (tests, and `url` strings in the config).
    pub fn plain(name: &str, url: &str) -> Result<NotifierTarget, String> {
        TargetEntry::from(url).validate(name)
    }
}

/// Validated alerting settings.
#[derive(Debug, Clone)]
pub struct AlertConfig {
    /// Alertmanagers.
    pub alertmanagers: Vec<NotifierTarget>,
    /// Webhooks.
    pub webhooks: Vec<NotifierTarget>,
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
    /// The collector's URL as users reach it (no trailing slash); None: derived from the listener.
    pub external_url: Option<String>,
    /// Labels added to every alert.
    pub labels: BTreeMap<String, String>,
    /// Runbook links by alert name.
    pub runbook_urls: BTreeMap<String, String>,
    /// The runbooks page: alerts without their own `runbook_urls` entry link to its section.
    pub runbook_base_url: Option<String>,
}

/// The per-request timeout of a notifier without `timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

impl TargetEntry {
    /// Checks one entry named `name` (`alerts.webhook[0]`), reading its files; every problem is one message.
    fn validate_into(&self, name: &str, errs: &mut Vec<String>) -> Option<NotifierTarget> {
        let before = errs.len();
        let table;
        let t = match self {
            TargetEntry::Url(u) => {
                table = TargetSection { url: u.clone(), ..TargetSection::default() };
                &table
            }
            TargetEntry::Table(t) => t,
        };
        let url_field = if matches!(self, TargetEntry::Url(_)) { name.to_string() } else { format!("{name}.url") };
        let url = match reqwest::Url::parse(&t.url) {
            Ok(u) if !matches!(u.scheme(), "http" | "https") => {
                errs.push(format!("{url_field}: {:?} must start with http:// or https://", t.url));
                None
            }
            Ok(u) if u.host_str().is_none_or(str::is_empty) => {
                errs.push(format!("{url_field}: {:?} has no host", t.url));
                None
            }
            Ok(u) if !u.username().is_empty() || u.password().is_some() => {
                // Never echo the URL here: it holds a credential.
                errs.push(format!("{url_field}: credentials in the URL are not accepted; use basic_auth"));
                None
            }
            Ok(u) => Some(u),
            Err(e) => {
                errs.push(format!("{url_field}: {:?} is not a URL: {e}", t.url));
                None
            }
        };
        let timeout =
            duration(errs, &format!("{name}.timeout"), &t.timeout, DEFAULT_TIMEOUT, Duration::from_millis(100));
        let tls = ClientTlsFiles::read(
            errs,
            name,
            t.ca_file.as_deref(),
            t.client_cert_file.as_deref(),
            t.client_key_file.as_deref(),
        );
        let bearer = t
            .bearer_token_file
            .as_ref()
            .and_then(|p| read_secret_file(&format!("{name}.bearer_token_file"), p).map_err(|e| errs.push(e)).ok());
        let basic = t.basic_auth.as_ref().and_then(|b| {
            if b.username.is_empty() || b.username.contains(':') {
                errs.push(format!("{name}.basic_auth.username: must be non-empty without ':'"));
            }
            read_secret_file(&format!("{name}.basic_auth.password_file"), &b.password_file)
                .map_err(|e| errs.push(e))
                .ok()
                .map(|password| NotifierAuth::Basic { username: b.username.clone(), password })
        });
        let auth = match (bearer, basic) {
            (Some(_), Some(_)) => {
                errs.push(format!("{name}.basic_auth: set with bearer_token_file; choose one"));
                NotifierAuth::None
            }
            (Some(token), None) => NotifierAuth::Bearer(token),
            (None, Some(basic)) => basic,
            (None, None) => NotifierAuth::None,
        };
        let mut headers = reqwest::header::HeaderMap::new();
        for (k, v) in &t.headers {
            let field = format!("{name}.headers.{k}");
            let key = match reqwest::header::HeaderName::from_bytes(k.as_bytes()) {
                Ok(key) => key,
                Err(_) => {
                    errs.push(format!("{field}: not a valid header name"));
                    continue;
                }
            };
            if matches!(key.as_str(), "authorization" | "content-type" | "content-length" | "host") {
                errs.push(format!("{field}: set by the notifier; use bearer_token_file or basic_auth"));
                continue;
            }
            match reqwest::header::HeaderValue::from_str(v) {
                Ok(mut value) => {
                    value.set_sensitive(true);
                    headers.insert(key, value);
                }
                // The value itself is not echoed: it may be a credential.
                Err(_) => errs.push(format!("{field}: the value is not a valid header value")),
            }
        }
        if errs.len() > before {
            return None;
        }
        let url = url?;
        match build_http_client(&tls, timeout) {
            Ok(client) => Some(NotifierTarget { name: name.to_string(), url, auth, headers, timeout, tls, client }),
            Err(e) => {
                errs.push(format!("{name}: {e}"));
                None
            }
        }
    }

    /// Checks one entry alone (tests and [`NotifierTarget::plain`]); every problem joined in one message.
    pub fn validate(&self, name: &str) -> Result<NotifierTarget, String> {
        let mut errs = Vec::new();
        self.validate_into(name, &mut errs).ok_or_else(|| errs.join("; "))
    }
}

impl AlertsSection {
    /// Checks the section, pushing one message per problem onto `errs`; fields in error take their defaults.
    pub fn validate(&self, errs: &mut Vec<String>) -> AlertConfig {
        let mut targets = |name: &str, list: &[TargetEntry]| -> Vec<NotifierTarget> {
            list.iter().enumerate().filter_map(|(i, t)| t.validate_into(&format!("{name}[{i}]"), errs)).collect()
        };
        let alertmanagers = targets("alerts.alertmanager", &self.alertmanager);
        let webhooks = targets("alerts.webhook", &self.webhook);
        let http_url = |field: &str, u: &str, errs: &mut Vec<String>| match reqwest::Url::parse(u) {
            Ok(p) if matches!(p.scheme(), "http" | "https") && p.host_str().is_some_and(|h| !h.is_empty()) => {
                Some(u.trim_end_matches('/').to_string())
            }
            _ => {
                errs.push(format!("{field}: {u:?} must be an http:// or https:// URL with a host"));
                None
            }
        };
        let external_url = self.external_url.as_deref().and_then(|u| http_url("alerts.external_url", u, errs));
        for (k, v) in &self.labels {
            let valid = !k.is_empty()
                && k.bytes()
                    .enumerate()
                    .all(|(i, b)| b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()))
                && !k.starts_with("__");
            if !valid {
                errs.push(format!("alerts.labels.{k}: not a label name ([a-zA-Z_][a-zA-Z0-9_]*, no leading __)"));
            } else if OWN_LABELS.contains(&k.as_str()) {
                errs.push(format!("alerts.labels.{k}: set by Startline itself; choose another name"));
            } else if v.is_empty() {
                errs.push(format!("alerts.labels.{k}: an empty value means no label; remove it"));
            }
        }
        let mut runbook_urls = BTreeMap::new();
        for (name, u) in &self.runbook_urls {
            if !ALERT_NAMES.contains(&name.as_str()) {
                errs.push(format!(
                    "alerts.runbook_urls.{name}: not an alert Startline raises ({})",
                    ALERT_NAMES.join(", ")
                ));
            } else if let Some(u) = http_url(&format!("alerts.runbook_urls.{name}"), u, errs) {
                runbook_urls.insert(name.clone(), u);
            }
        }
        let runbook_base_url =
            self.runbook_base_url.as_deref().and_then(|u| http_url("alerts.runbook_base_url", u, errs));
        AlertConfig {
            external_url,
            labels: self.labels.clone(),
            runbook_urls,
            runbook_base_url,
            alertmanagers,
            webhooks,
            evaluation_interval: duration(
                errs,
                "alerts.evaluation_interval",
                &self.evaluation_interval,
                Duration::from_secs(10),
                Duration::from_millis(100),
            ),
            resend_interval: duration(
                errs,
                "alerts.resend_interval",
                &self.resend_interval,
                Duration::from_secs(60),
                Duration::from_secs(1),
            ),
            min_jobs: self.min_jobs.unwrap_or(5),
            page_max_age: duration(
                errs,
                "alerts.page_max_age",
                &self.page_max_age,
                Duration::from_secs(3600),
                Duration::from_secs(1),
            ),
            resolved_retention: duration(
                errs,
                "alerts.resolved_retention",
                &self.resolved_retention,
                Duration::from_secs(86_400),
                Duration::from_secs(1),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_section_gives_the_defaults() {
        let mut errs = Vec::new();
        let c = AlertsSection::default().validate(&mut errs);
        assert!(errs.is_empty(), "{errs:?}");
        assert!(c.alertmanagers.is_empty() && c.webhooks.is_empty());
        assert_eq!(c.evaluation_interval, Duration::from_secs(10));
        assert_eq!(c.resend_interval, Duration::from_secs(60));
        assert_eq!(c.min_jobs, 5);
        assert_eq!(c.page_max_age, Duration::from_secs(3600));
        assert_eq!(c.resolved_retention, Duration::from_secs(86_400));
    }

    #[test]
    fn external_url_static_labels_and_runbooks_are_checked() {
        let mut s = AlertsSection {
            external_url: Some("https://startline.example.com/".into()),
            labels: [("cluster".to_string(), "eu-1".to_string())].into(),
            runbook_urls: [("StartlineSLOBurnRate".to_string(), "https://wiki/x#burn".to_string())].into(),
            ..AlertsSection::default()
        };
        let mut errs = Vec::new();
        let c = s.validate(&mut errs);
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(c.external_url.as_deref(), Some("https://startline.example.com"), "no trailing slash");
        assert_eq!(c.labels["cluster"], "eu-1");
        assert_eq!(c.runbook_urls["StartlineSLOBurnRate"], "https://wiki/x#burn");
        s.external_url = Some("startline.example.com".into());
        s.labels = [("job_id", "x"), ("9lives", "x"), ("__meta", "x"), ("env", "")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        s.runbook_urls = [("NoSuchAlert".to_string(), "https://wiki".to_string())].into();
        let mut errs = Vec::new();
        s.validate(&mut errs);
        let fields: Vec<&str> = errs.iter().filter_map(|e| e.split(':').next()).collect();
        assert_eq!(
            fields,
            [
                "alerts.external_url",
                "alerts.labels.9lives",
                "alerts.labels.__meta",
                "alerts.labels.env",
                "alerts.labels.job_id",
                "alerts.runbook_urls.NoSuchAlert"
            ]
        );
    }

    #[test]
    fn every_bad_field_is_reported_in_order() {
        let s = AlertsSection {
            alertmanager: vec!["ftp://example".into(), "http://127.0.0.1:9093".into()],
            webhook: vec!["hook".into()],
            evaluation_interval: Some("1ms".into()),
            resend_interval: Some("often".into()),
            min_jobs: Some(1),
            resolved_retention: Some("0s".into()),
            page_max_age: Some("10ms".into()),
            ..AlertsSection::default()
        };
        let mut errs = Vec::new();
        let c = s.validate(&mut errs);
        let fields: Vec<&str> = errs.iter().filter_map(|e| e.split(':').next()).collect();
        assert_eq!(
            fields,
            [
                "alerts.alertmanager[0]",
                "alerts.webhook[0]",
                "alerts.evaluation_interval",
                "alerts.resend_interval",
                "alerts.page_max_age",
                "alerts.resolved_retention"
            ],
            "{errs:#?}"
        );
        assert_eq!(errs[0], "alerts.alertmanager[0]: \"ftp://example\" must start with http:// or https://");
        assert!(errs[1].starts_with("alerts.webhook[0]: \"hook\" is not a URL"), "{}", errs[1]);
        assert_eq!(errs[2], "alerts.evaluation_interval: \"1ms\" is shorter than 100ms");
        assert!(errs[3].starts_with("alerts.resend_interval: \"often\" is not a duration like \"5m\""), "{}", errs[3]);
        assert_eq!(errs[4], "alerts.page_max_age: \"10ms\" is shorter than 1s");
        assert_eq!(errs[5], "alerts.resolved_retention: \"0s\" is shorter than 1s");
        // Bad fields fall back to their defaults (a bad target is left out); good ones are kept.
        assert_eq!(c.alertmanagers.len(), 1);
        assert_eq!(c.alertmanagers[0].name, "alerts.alertmanager[1]");
        assert_eq!(c.evaluation_interval, Duration::from_secs(10));
        assert_eq!(c.min_jobs, 1);
    }

    fn parse(toml_text: &str) -> AlertsSection {
        toml::from_str(toml_text).expect("parses")
    }

    #[test]
    fn targets_are_url_strings_or_tables() {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = dir.path().join("token");
        let password = dir.path().join("password");
        std::fs::write(&token, "s3cret-token\n").expect("write");
        std::fs::write(&password, "pa55word").expect("write");
        let s = parse(&format!(
            r#"
            alertmanager = [
                "http://127.0.0.1:9093",
                {{ url = "https://am.example:9093/prefix/", basic_auth = {{ username = "startline", password_file = "{}" }}, timeout = "2s" }},
            ]
            webhook = [{{ url = "https://hooks.example/x?k=1", bearer_token_file = "{}", headers = {{ "X-Scope-OrgID" = "team-a" }} }}]
            "#,
            password.display(),
            token.display()
        ));
        let mut errs = Vec::new();
        let c = s.validate(&mut errs);
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(c.alertmanagers.len(), 2);
        let plain = &c.alertmanagers[0];
        assert_eq!((plain.name.as_str(), plain.url.as_str()), ("alerts.alertmanager[0]", "http://127.0.0.1:9093/"));
        assert_eq!(plain.auth, NotifierAuth::None);
        assert_eq!(plain.timeout, DEFAULT_TIMEOUT);
        let am = &c.alertmanagers[1];
        assert_eq!(am.auth, NotifierAuth::Basic { username: "startline".into(), password: Secret::new("pa55word") });
        assert_eq!(am.timeout, Duration::from_secs(2));
        let hook = &c.webhooks[0];
        assert_eq!(hook.name, "alerts.webhook[0]");
        assert_eq!(hook.auth, NotifierAuth::Bearer(Secret::new("s3cret-token")));
        assert_eq!(hook.headers["x-scope-orgid"], "team-a");
    }

    #[test]
    fn debug_output_holds_no_secret() {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = dir.path().join("token");
        let password = dir.path().join("password");
        std::fs::write(&token, "s3cret-token").expect("write");
        std::fs::write(&password, "pa55word").expect("write");
        let s = parse(&format!(
            r#"
            alertmanager = [{{ url = "https://am.example", basic_auth = {{ username = "u", password_file = "{}" }}, headers = {{ "X-Api-Key" = "k3y-value" }} }}]
            webhook = [{{ url = "https://hooks.example", bearer_token_file = "{}" }}]
            "#,
            password.display(),
            token.display()
        ));
        let mut errs = Vec::new();
        let c = s.validate(&mut errs);
        assert!(errs.is_empty(), "{errs:?}");
        let debug = format!("{c:?} {c:#?}");
        for secret in ["s3cret-token", "pa55word", "k3y-value"] {
            assert!(!debug.contains(secret), "{secret} leaked into {debug}");
        }
        assert!(debug.contains("<redacted>") && debug.contains("x-api-key"), "{debug}");
    }

    #[test]
    fn bad_target_fields_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").expect("write");
        let s = parse(&format!(
            r#"
            alertmanager = [
                "http://127.0.0.1:9093",
                {{ url = "https://am.example", ca_file = "/nonexistent/ca.pem", client_cert_file = "/nonexistent/c.pem" }},
                {{ url = "https://user:pw@am.example", bearer_token_file = "{}", timeout = "soon" }},
            ]
            webhook = [{{ url = "https://hooks.example", headers = {{ "Bad Name" = "x", "Authorization" = "Bearer y" }}, basic_auth = {{ username = "u", password_file = "/nonexistent/pw" }} }}]
            "#,
            empty.display()
        ));
        let mut errs = Vec::new();
        let c = s.validate(&mut errs);
        assert_eq!(c.alertmanagers.len(), 1, "only the good target is kept");
        assert!(c.webhooks.is_empty());
        let expect = [
            "alerts.alertmanager[1].ca_file: cannot read /nonexistent/ca.pem: No such file or directory (os error 2)",
            "alerts.alertmanager[1].client_key_file: set with client_cert_file",
            "alerts.alertmanager[2].url: credentials in the URL are not accepted; use basic_auth",
            "alerts.alertmanager[2].timeout: \"soon\" is not a duration",
            &format!("alerts.alertmanager[2].bearer_token_file: {} is empty", empty.display()),
            "alerts.webhook[0].basic_auth.password_file: cannot read /nonexistent/pw",
            "alerts.webhook[0].headers.Authorization: set by the notifier",
            "alerts.webhook[0].headers.Bad Name: not a valid header name",
        ];
        assert_eq!(errs.len(), expect.len(), "{errs:#?}");
        for (e, want) in errs.iter().zip(expect) {
            assert!(e.starts_with(want), "{e:?} should start with {want:?}");
        }
        assert!(errs.iter().all(|e| !e.contains("pw@")), "{errs:?}");
    }

    #[test]
    fn a_mistake_inside_a_table_keeps_serde_s_message() {
        let e = toml::from_str::<AlertsSection>("webhook = [{ urll = \"http://x\" }]").expect_err("unknown field");
        assert!(e.to_string().contains("unknown field `urll`"), "{e}");
        let e = toml::from_str::<AlertsSection>("webhook = [3]").expect_err("a number");
        assert!(e.to_string().contains("a URL string or a table"), "{e}");
    }
}
