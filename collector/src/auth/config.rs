//! The `[auth]` and `[tls]` config sections and their validation.
//!
//! ```toml
//! [auth]
//! metrics = "open"            # or "read": /metrics needs a read identity
//! # insecure = true           # only to listen beyond loopback with no identity at all (logged, exported)
//!
//! [[auth.identity]]
//! name = "slurm-cluster-a"
//! token_hashes = ["sha256:…"] # from `startline-collector token`
//! cert_names = []             # client certificate DNS/URI SANs (needs tls.client_ca_file)
//! scopes = ["ingest"]         # ingest, read, admin (admin implies read)
//! job_id_prefixes = ["slurm/cluster-a/"]
//! sources = ["slurm-adapter/cluster-a"]
//! node_prefixes = ["a-gpu-"]  # node names its health readings and events may name
//! rate_per_second = 2000      # events (gRPC) or requests (HTTP) per second
//! burst = 20000
//! events_per_day = 50000000  # a daily quota (UTC days; counted in memory)
//! max_open_jobs = 20000       # jobs open at once that its batches opened (default: auth.max_open_jobs)
//!
//! [tls]
//! cert_file = "/etc/startline/tls.crt"
//! key_file = "/etc/startline/tls.key"
//! client_ca_file = "/etc/startline/clients-ca.crt"
//! client_certs = "optional"   # or "required"
//! ```

use super::limit::RateSpec;
use super::tls::{ClientCerts, TlsFiles};
use super::{Identity, Keyring, Scope, Scopes, TokenHash};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::path::PathBuf;

/// `[auth]` as written.
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSection {
    /// Listen beyond loopback with no identity configured (default false).
    pub insecure: Option<bool>,
    /// `open` (default) or `read`.
    pub metrics: Option<String>,
    /// Each identity's open-jobs budget unless it sets its own (default [`MAX_OPEN_JOBS`]; 0: none).
    pub max_open_jobs: Option<u64>,
    /// `[[auth.identity]]`
    #[serde(default)]
    pub identity: Vec<IdentitySection>,
}

/// One `[[auth.identity]]`.
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct IdentitySection {
    /// Name (letters, digits, `.`, `_`, `-`).
    pub name: Option<String>,
    /// Token hashes, `sha256:<hex>`.
    #[serde(default)]
    pub token_hashes: Vec<String>,
    /// Client certificate names (DNS or URI SANs).
    #[serde(default)]
    pub cert_names: Vec<String>,
    /// Scopes.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// Job-id prefixes its events must have.
    #[serde(default)]
    pub job_id_prefixes: Vec<String>,
    /// Sources its events and health readings must carry.
    #[serde(default)]
    pub sources: Vec<String>,
    /// Prefixes of the node names its health readings and events may name.
    #[serde(default)]
    pub node_prefixes: Vec<String>,
    /// Rate limit, per second.
    pub rate_per_second: Option<f64>,
    /// Burst (default: one second's worth, at least 1).
    pub burst: Option<f64>,
    /// Most events per UTC day.
    pub events_per_day: Option<u64>,
    /// Most jobs open at once that its batches opened (default `auth.max_open_jobs`; 0: no budget).
    pub max_open_jobs: Option<u64>,
}

/// Default `auth.max_open_jobs`: 100,000 open jobs per identity (about 250 MB of hot jobs at ~2.5 KB each).
pub const MAX_OPEN_JOBS: u64 = 100_000;

/// `[tls]` as written.
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// PEM certificate chain.
    pub cert_file: Option<PathBuf>,
    /// PEM private key.
    pub key_file: Option<PathBuf>,
    /// PEM CA bundle for client certificates.
    pub client_ca_file: Option<PathBuf>,
    /// `optional` (default when a CA is given) or `required`.
    pub client_certs: Option<String>,
}

/// The validated `[auth]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AuthConfig {
    /// Identities with their token hashes and certificate names.
    pub identities: Vec<(Identity, Vec<TokenHash>, Vec<String>)>,
    /// `auth.insecure`.
    pub insecure: bool,
    /// `/metrics` needs a read identity.
    pub metrics_protected: bool,
}

impl AuthConfig {
    /// The keyring these identities make.
    pub fn keyring(&self) -> Keyring {
        Keyring::new(self.identities.clone())
    }

    /// Whether any identity is configured.
    pub fn enabled(&self) -> bool {
        !self.identities.is_empty()
    }
}

/// A prefix that no valid id can start with (an invisible character, a `.`/`..` segment or `//` before its last
/// `/`) is an error: ids follow the protocol's id rule, so it would refuse everything.
fn prefix_matches_ids(errs: &mut Vec<String>, field: &str, prefix: &str) {
    use startline_proto::validate::{invisible_in_id, unnormalized_path};
    if let Some(c) = prefix.chars().find(|c| invisible_in_id(*c).is_some()) {
        errs.push(format!("{field}: {prefix:?} has U+{:04X}, which no id may contain", c as u32));
    } else if let Some((whole, _)) = prefix.rsplit_once('/') {
        if let Some(what) = unnormalized_path(&format!("{whole}/x")) {
            errs.push(format!("{field}: {prefix:?} has {what}, which no id may contain"));
        }
    }
}

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

impl AuthSection {
    /// Checks the section; `has_client_ca` says whether `[tls]` verifies client certificates.
    pub fn validate(&self, errs: &mut Vec<String>, has_client_ca: bool) -> AuthConfig {
        let metrics_protected = match self.metrics.as_deref() {
            None | Some("open") => false,
            Some("read") => true,
            Some(other) => {
                errs.push(format!("auth.metrics: {other:?} is not \"open\" or \"read\""));
                false
            }
        };
        let default_open_jobs = self.max_open_jobs.unwrap_or(MAX_OPEN_JOBS);
        let mut names = HashSet::new();
        let mut hashes = HashSet::new();
        let mut cert_seen = HashSet::new();
        let mut identities = Vec::new();
        for (i, s) in self.identity.iter().enumerate() {
            let at = |field: &str| format!("auth.identity[{i}].{field}");
            let name = match s.name.as_deref() {
                Some(n) if valid_name(n) => n.to_string(),
                Some(n) => {
                    errs.push(format!("{}: {n:?} must be 1-64 letters, digits, '.', '_' or '-'", at("name")));
                    continue;
                }
                None => {
                    errs.push(format!("{}: is required", at("name")));
                    continue;
                }
            };
            if !names.insert(name.clone()) {
                errs.push(format!("{}: {name:?} is used by another identity", at("name")));
            }
            let mut tokens = Vec::new();
            for (j, h) in s.token_hashes.iter().enumerate() {
                match TokenHash::parse(h) {
                    Ok(t) => {
                        if !hashes.insert(t) {
                            errs.push(format!(
                                "auth.identity[{i}].token_hashes[{j}]: the same token hash is listed twice"
                            ));
                        }
                        tokens.push(t);
                    }
                    // The value is a hash, not a secret, but echo only its shape.
                    Err(why) => errs.push(format!("auth.identity[{i}].token_hashes[{j}]: {why}")),
                }
            }
            for (j, c) in s.cert_names.iter().enumerate() {
                if c.is_empty() {
                    errs.push(format!("auth.identity[{i}].cert_names[{j}]: is empty"));
                } else if !cert_seen.insert(c.clone()) {
                    errs.push(format!("auth.identity[{i}].cert_names[{j}]: {c:?} is listed twice"));
                }
            }
            if !s.cert_names.is_empty() && !has_client_ca {
                errs.push(format!("{}: client certificates need tls.client_ca_file", at("cert_names")));
            }
            if s.token_hashes.is_empty() && s.cert_names.is_empty() {
                errs.push(format!("auth.identity[{i}] ({name}): needs token_hashes or cert_names"));
            }
            let mut scopes = Scopes::default();
            for sc in &s.scopes {
                match Scope::parse(sc) {
                    Some(x) => scopes = scopes.with(x),
                    None => errs.push(format!("{}: {sc:?} is not ingest, read or admin", at("scopes"))),
                }
            }
            if s.scopes.is_empty() {
                errs.push(format!("{}: at least one of ingest, read, admin is required", at("scopes")));
            }
            for p in &s.job_id_prefixes {
                if p.is_empty() {
                    errs.push(format!(
                        "{}: an empty prefix permits every job; leave the list empty instead",
                        at("job_id_prefixes")
                    ));
                }
                prefix_matches_ids(errs, &at("job_id_prefixes"), p);
            }
            for p in &s.node_prefixes {
                if p.is_empty() {
                    errs.push(format!(
                        "{}: an empty prefix permits every node; leave the list empty instead",
                        at("node_prefixes")
                    ));
                }
                prefix_matches_ids(errs, &at("node_prefixes"), p);
            }
            if s.events_per_day == Some(0) {
                errs.push(format!(
                    "{}: 0 refuses every event; remove the identity's ingest scope instead",
                    at("events_per_day")
                ));
            }
            let rate = match s.rate_per_second {
                None => {
                    if s.burst.is_some() {
                        errs.push(format!("{}: needs rate_per_second", at("burst")));
                    }
                    None
                }
                Some(r) if r.is_finite() && r > 0.0 => {
                    let burst = s.burst.unwrap_or(r.max(1.0));
                    if !(burst.is_finite() && burst >= 1.0) {
                        errs.push(format!("{}: {burst} must be at least 1", at("burst")));
                    }
                    Some(RateSpec { per_second: r, burst: burst.max(1.0) })
                }
                Some(r) => {
                    errs.push(format!("{}: {r} must be a positive number", at("rate_per_second")));
                    None
                }
            };
            identities.push((
                Identity {
                    name,
                    scopes,
                    job_id_prefixes: s.job_id_prefixes.clone(),
                    sources: s.sources.clone(),
                    node_prefixes: s.node_prefixes.clone(),
                    rate,
                    events_per_day: s.events_per_day,
                    max_open_jobs: s.max_open_jobs.unwrap_or(default_open_jobs),
                },
                tokens,
                s.cert_names.clone(),
            ));
        }
        AuthConfig { identities, insecure: self.insecure.unwrap_or(false), metrics_protected }
    }
}

impl TlsSection {
    /// Checks the section (paths only; the files are read when the collector starts and on every reload).
    pub fn validate(&self, errs: &mut Vec<String>) -> Option<TlsFiles> {
        let client_certs = match self.client_certs.as_deref() {
            None if self.client_ca_file.is_some() => ClientCerts::Optional,
            None => ClientCerts::None,
            Some("optional") => ClientCerts::Optional,
            Some("required") => ClientCerts::Required,
            Some(other) => {
                errs.push(format!("tls.client_certs: {other:?} is not \"optional\" or \"required\""));
                ClientCerts::None
            }
        };
        if client_certs != ClientCerts::None && self.client_ca_file.is_none() {
            errs.push("tls.client_certs: needs tls.client_ca_file".into());
        }
        match (&self.cert_file, &self.key_file) {
            (None, None) => {
                if self.client_ca_file.is_some() {
                    errs.push("tls.client_ca_file: needs tls.cert_file and tls.key_file".into());
                }
                None
            }
            (Some(_), None) => {
                errs.push("tls.key_file: is required with tls.cert_file".into());
                None
            }
            (None, Some(_)) => {
                errs.push("tls.cert_file: is required with tls.key_file".into());
                None
            }
            (Some(c), Some(k)) => Some(TlsFiles {
                cert_file: c.clone(),
                key_file: k.clone(),
                client_ca_file: self.client_ca_file.clone(),
                client_certs,
            }),
        }
    }
}
