//! Who is talking to the collector and what they may do: identities, their scopes and restrictions, bearer
//! tokens (stored only as SHA-256 hashes), client-certificate names, per-identity rate limits, and the counts of
//! every refusal by reason. Used by both edges (the gRPC ingest service and the HTTP API); imports no other
//! collector module but [`crate::settings`].
//!
//! - An [`Identity`] has a name (config-listed, so it is safe as a metric label), [`Scopes`] (`ingest`, `read`,
//!   `admin`; `admin` implies `read`), optional job-id prefixes and source names its events must match, node-name
//!   prefixes its health readings and its events' node fields must match, and an optional rate limit in events
//!   (ingest) or requests (HTTP) per second.
//! - A client proves an identity with `Authorization: Bearer <token>` (the [`Keyring`] holds the token's SHA-256,
//!   never the token) or with a client certificate whose DNS or URI subject-alternative name is listed for the
//!   identity (mTLS, verified against `tls.client_ca_file` by [`tls`]).
//! - With no identity configured at all, [`Auth`] is *open*: every request acts as [`Identity::anonymous`] with
//!   every scope. The config refuses a non-loopback listener in that case unless `auth.insecure = true`.
//! - [`Auth::reload`] swaps the keyring atomically (SIGHUP, file change, `POST /api/v1/admin/reload`): a removed
//!   token fails from the next request on, including sessions the dashboard opened with it. Long calls (gRPC
//!   `Publish` and `Subscribe` streams) keep a [`Held`] identity: each reload bumps a generation they watch, and
//!   they prove their credentials again against the new keyring before their next batch or record, ending when
//!   the credential is gone or the scope was taken away.
//!
//! No token is ever logged, formatted into an error or a URL, or exported: [`Denied`] names a reason and the
//! identity (when one was proven), nothing else.

pub mod config;
pub mod limit;
pub mod tls;

use limit::{Bucket, RateSpec};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

/// A permission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Publish lifecycle events (gRPC `IngestService`).
    Ingest,
    /// Read jobs, SLOs, alerts, comparisons, the dashboard (and `/metrics` when it is protected).
    Read,
    /// Reload the configuration; implies `read`.
    Admin,
}

impl Scope {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Ingest => "ingest",
            Scope::Read => "read",
            Scope::Admin => "admin",
        }
    }

    /// Parses the config spelling.
    pub fn parse(s: &str) -> Option<Scope> {
        match s {
            "ingest" => Some(Scope::Ingest),
            "read" => Some(Scope::Read),
            "admin" => Some(Scope::Admin),
            _ => None,
        }
    }
}

/// A set of scopes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scopes(u8);

impl Scopes {
    /// Every scope.
    pub const ALL: Scopes = Scopes(0b111);

    fn bit(s: Scope) -> u8 {
        match s {
            Scope::Ingest => 1,
            Scope::Read => 2,
            Scope::Admin => 4,
        }
    }

    /// Adds a scope.
    pub fn with(self, s: Scope) -> Scopes {
        Scopes(self.0 | Self::bit(s))
    }

    /// Whether the set grants `s` (`admin` grants `read`).
    pub fn grants(self, s: Scope) -> bool {
        self.0 & Self::bit(s) != 0 || (s == Scope::Read && self.0 & Self::bit(Scope::Admin) != 0)
    }
}

/// A configured identity.
#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    /// Its name (from the config; used in logs and metric labels).
    pub name: String,
    /// What it may do.
    pub scopes: Scopes,
    /// Job ids its events must start with (empty: any).
    pub job_id_prefixes: Vec<String>,
    /// Source names its events and health readings must carry exactly (empty: any).
    pub sources: Vec<String>,
    /// Node names its health readings and its events' node fields must start with (empty: any).
    pub node_prefixes: Vec<String>,
    /// Events (ingest) or requests (HTTP) per second, with a burst.
    pub rate: Option<RateSpec>,
    /// Most events per UTC day (ingest only).
    pub events_per_day: Option<u64>,
    /// Most jobs open at once that its batches opened (a job is open from its first event until it is done);
    /// 0: no budget.
    pub max_open_jobs: u64,
}

impl Identity {
    /// The identity of every request when no authentication is configured.
    pub fn anonymous() -> Identity {
        Identity {
            name: "anonymous".into(),
            scopes: Scopes::ALL,
            job_id_prefixes: Vec::new(),
            sources: Vec::new(),
            node_prefixes: Vec::new(),
            rate: None,
            events_per_day: None,
            max_open_jobs: 0,
        }
    }

    /// Whether this identity may write an event for `job_id` with `source`; `Err` names the field refused.
    pub fn permits_event(&self, job_id: &str, source: &str) -> Result<(), &'static str> {
        if !self.job_id_prefixes.is_empty() && !self.job_id_prefixes.iter().any(|p| job_id.starts_with(p.as_str())) {
            return Err("job_id");
        }
        if !self.permits_source(source) {
            return Err("source");
        }
        Ok(())
    }

    /// Whether this identity may send an event or a health reading with `source` (one of its `sources`, if any).
    pub fn permits_source(&self, source: &str) -> bool {
        self.sources.is_empty() || self.sources.iter().any(|s| s == source)
    }

    /// Whether this identity may report on `node`: in a health reading, or named by an event (`node_assigned.nodes`,
    /// `node_lost.node`). Node names must start with one of its `node_prefixes`, if it has any.
    pub fn permits_node(&self, node: &str) -> bool {
        self.node_prefixes.is_empty() || self.node_prefixes.iter().any(|p| node.starts_with(p.as_str()))
    }
}

/// The SHA-256 of a bearer token.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenHash([u8; 32]);

impl std::fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.to_config())
    }
}

impl TokenHash {
    /// Hashes a token.
    pub fn of(token: &str) -> TokenHash {
        let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let mut h = [0u8; 32];
        h.copy_from_slice(d.as_ref());
        TokenHash(h)
    }

    /// Parses the config form `sha256:<64 hex digits>`.
    pub fn parse(s: &str) -> Result<TokenHash, String> {
        let hex = s.strip_prefix("sha256:").ok_or_else(|| {
            "is not a token hash like \"sha256:<64 hex digits>\" (make one with `startline-collector token`)"
                .to_string()
        })?;
        if hex.len() != 64 {
            return Err(format!("has {} hex digits after \"sha256:\", 64 expected", hex.len()));
        }
        let mut h = [0u8; 32];
        for (i, chunk) in hex.as_bytes().chunks(2).enumerate() {
            let digit = |c: u8| (c as char).to_digit(16);
            match (digit(chunk[0]), digit(chunk[1])) {
                (Some(a), Some(b)) => h[i] = (a * 16 + b) as u8,
                _ => return Err("has a character that is not a hex digit after \"sha256:\"".into()),
            }
        }
        Ok(TokenHash(h))
    }

    /// The config form.
    pub fn to_config(&self) -> String {
        let mut s = String::with_capacity(71);
        s.push_str("sha256:");
        for b in self.0 {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }
}

/// Makes a new random token: `stl_` and 64 hex digits (256 bits from the OS's generator).
pub fn generate_token() -> Result<String, String> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new().fill(&mut bytes).map_err(|_| "the system random generator failed".to_string())?;
    let mut s = String::from("stl_");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    Ok(s)
}

/// The configured identities, looked up by token hash or certificate name.
#[derive(Debug, Default)]
pub struct Keyring {
    by_token: HashMap<TokenHash, Arc<Identity>>,
    by_cert_name: HashMap<String, Arc<Identity>>,
    names: Vec<Arc<Identity>>,
}

impl Keyring {
    /// Builds a keyring: each identity with its token hashes and certificate names.
    pub fn new(entries: Vec<(Identity, Vec<TokenHash>, Vec<String>)>) -> Keyring {
        let mut k = Keyring::default();
        for (identity, tokens, cert_names) in entries {
            let id = Arc::new(identity);
            for t in tokens {
                k.by_token.insert(t, id.clone());
            }
            for n in cert_names {
                k.by_cert_name.insert(n, id.clone());
            }
            k.names.push(id);
        }
        k
    }

    /// Whether any identity is configured.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The identities, in config order.
    pub fn identities(&self) -> &[Arc<Identity>] {
        &self.names
    }
}

/// Why a request was refused. The label is a closed set, safe for metrics.
#[derive(Debug, Clone, PartialEq)]
pub enum Denied {
    /// No credentials where some are required.
    Missing,
    /// An `Authorization` header that is not `Bearer <token>`.
    Malformed,
    /// A token (or certificate name) no identity has.
    Unknown,
    /// An identity without the scope the route needs.
    Scope {
        /// The identity.
        identity: String,
        /// The scope needed.
        needed: Scope,
    },
    /// Over the identity's daily event quota.
    Quota {
        /// The identity.
        identity: String,
        /// Until the quota resets (the next UTC midnight), milliseconds.
        retry_after_ms: u64,
    },
    /// Over the identity's rate limit.
    RateLimited {
        /// The identity.
        identity: String,
        /// When a retry can succeed, milliseconds.
        retry_after_ms: u64,
    },
}

impl Denied {
    /// The status that ends an open stream whose credential (`UNAUTHENTICATED`) or scope (`PERMISSION_DENIED`) a
    /// configuration reload took away (used by both the ingest edge and the stream out).
    pub fn revoked_status(&self) -> tonic::Status {
        let msg = format!("ended by a configuration reload: {}", self.message());
        if self.is_unauthenticated() {
            tonic::Status::unauthenticated(msg)
        } else {
            tonic::Status::permission_denied(msg)
        }
    }

    /// The metric label of the reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Denied::Missing => "missing",
            Denied::Malformed => "malformed",
            Denied::Unknown => "unknown",
            Denied::Scope { .. } => "scope",
            Denied::RateLimited { .. } => "rate_limited",
            Denied::Quota { .. } => "quota",
        }
    }

    /// Unauthenticated (401 / `UNAUTHENTICATED`) rather than forbidden or limited.
    pub fn is_unauthenticated(&self) -> bool {
        matches!(self, Denied::Missing | Denied::Malformed | Denied::Unknown)
    }

    /// The message for the client: the reason, never a credential.
    pub fn message(&self) -> String {
        match self {
            Denied::Missing => "authentication required: send Authorization: Bearer <token>".into(),
            Denied::Malformed => "malformed Authorization header: expected Bearer <token>".into(),
            Denied::Unknown => "unknown or revoked credentials".into(),
            Denied::Scope { identity, needed } => {
                format!("identity {identity:?} lacks the {:?} scope", needed.as_str())
            }
            Denied::RateLimited { identity, retry_after_ms } => {
                format!("identity {identity:?} is over its rate limit; retry after {retry_after_ms} ms")
            }
            Denied::Quota { identity, retry_after_ms } => {
                format!("identity {identity:?} has used its daily event quota; retry after {retry_after_ms} ms")
            }
        }
    }
}

/// Refusals and per-event denials, by reason, for self-metrics.
#[derive(Debug, Default)]
pub struct AuthStats {
    /// Requests without credentials where some are required.
    pub missing: AtomicU64,
    /// Malformed `Authorization` headers.
    pub malformed: AtomicU64,
    /// Unknown or revoked tokens and certificate names.
    pub unknown: AtomicU64,
    /// Identities without the needed scope.
    pub scope: AtomicU64,
    /// Batches and requests over a rate limit.
    pub rate_limited: AtomicU64,
    /// Batches over a daily event quota.
    pub quota: AtomicU64,
    /// Events refused because their job id or source is not permitted for the identity.
    pub not_permitted: AtomicU64,
    /// State-changing HTTP requests refused as coming from another origin.
    pub origin: AtomicU64,
    /// Successful reloads of the identities.
    pub reloads: AtomicU64,
    /// Open long calls ended by a reload, by call ([`LongCall`]) and by whether the credential was gone
    /// (`UNAUTHENTICATED`, index 0) or the scope taken away (`PERMISSION_DENIED`, index 1).
    pub revoked: [[AtomicU64; 2]; 2],
}

impl AuthStats {
    /// Counts a refusal.
    pub fn count(&self, d: &Denied) {
        let c = match d {
            Denied::Missing => &self.missing,
            Denied::Malformed => &self.malformed,
            Denied::Unknown => &self.unknown,
            Denied::Scope { .. } => &self.scope,
            Denied::RateLimited { .. } => &self.rate_limited,
            Denied::Quota { .. } => &self.quota,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a long call ended by a reload.
    pub fn count_revoked(&self, call: LongCall, d: &Denied) {
        self.revoked[call as usize][usize::from(!d.is_unauthenticated())].fetch_add(1, Ordering::Relaxed);
    }

    /// Long calls ended by reloads: `(call, code, count)` for every call and code.
    pub fn revoked_calls(&self) -> [(&'static str, &'static str, u64); 4] {
        let g = |c: LongCall, i: usize| self.revoked[c as usize][i].load(Ordering::Relaxed);
        [
            ("publish", "unauthenticated", g(LongCall::Publish, 0)),
            ("publish", "permission_denied", g(LongCall::Publish, 1)),
            ("subscribe", "unauthenticated", g(LongCall::Subscribe, 0)),
            ("subscribe", "permission_denied", g(LongCall::Subscribe, 1)),
        ]
    }

    /// Every counter with its reason label.
    pub fn by_reason(&self) -> [(&'static str, u64); 8] {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("missing", g(&self.missing)),
            ("malformed", g(&self.malformed)),
            ("unknown", g(&self.unknown)),
            ("scope", g(&self.scope)),
            ("rate_limited", g(&self.rate_limited)),
            ("quota", g(&self.quota)),
            ("not_permitted", g(&self.not_permitted)),
            ("origin", g(&self.origin)),
        ]
    }
}

/// Who is on the other end of a connection (gRPC or HTTP): in every request's extensions.
#[derive(Debug, Clone)]
pub struct Peer {
    /// The peer's address.
    pub remote: Option<std::net::SocketAddr>,
    /// The verified client certificate's DNS and URI names (empty without one).
    pub cert_names: Arc<[String]>,
    /// Whether the connection is TLS.
    pub tls: bool,
}

/// What a client presented.
#[derive(Debug, Default, Clone, Copy)]
pub struct Credentials<'a> {
    /// The raw `Authorization` header, if any.
    pub authorization: Option<&'a [u8]>,
    /// A session's token hash (the dashboard's cookie, resolved by the API).
    pub session: Option<TokenHash>,
    /// The verified client certificate's names, if the connection presented one.
    pub cert_names: &'a [String],
}

/// What proved a caller's identity, kept by a long call so it can be proven again after a reload: a token's
/// hash, never the token.
#[derive(Debug, Clone, PartialEq)]
pub enum Proof {
    /// No credentials.
    None,
    /// An `Authorization` header: the bearer token's hash, or `None` when the header was malformed.
    Bearer(Option<TokenHash>),
    /// A dashboard session's token hash.
    Session(TokenHash),
    /// The connection's verified client-certificate names.
    Cert(Arc<[String]>),
}

impl Proof {
    /// What `creds` prove, in the order [`Auth::authenticate`] looks: a bearer token, a session, a certificate.
    pub fn of(creds: Credentials<'_>) -> Proof {
        if let Some(header) = creds.authorization {
            return Proof::Bearer(bearer(header).map(TokenHash::of));
        }
        if let Some(hash) = creds.session {
            return Proof::Session(hash);
        }
        if !creds.cert_names.is_empty() {
            return Proof::Cert(creds.cert_names.into());
        }
        Proof::None
    }
}

/// The long calls that hold an identity for their whole life (a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LongCall {
    /// gRPC `IngestService.Publish`.
    Publish = 0,
    /// gRPC `StreamService.Subscribe`.
    Subscribe = 1,
}

/// A long call's hold on its caller's identity: proven when the call opened, proven again against the new
/// keyring after every reload, before the call's next batch or record. Checking costs one atomic load while no
/// reload happened.
#[derive(Debug, Clone)]
pub struct Held {
    auth: Arc<Auth>,
    proof: Proof,
    scope: Option<Scope>,
    identity: Arc<Identity>,
    reloads: tokio::sync::watch::Receiver<u64>,
}

impl Held {
    /// The identity as last proven.
    pub fn identity(&self) -> &Arc<Identity> {
        &self.identity
    }

    /// Counts the call as ended by a reload (`startline_collector_auth_revoked_calls_total`).
    pub fn count_revoked(&self, call: LongCall, d: &Denied) {
        self.auth.stats.count_revoked(call, d);
    }

    /// The identity now: proven again if the identities were reloaded since the last check; `Err` when the
    /// credential is gone ([`Denied::is_unauthenticated`]) or the identity lost the call's scope.
    pub fn check(&mut self) -> Result<&Arc<Identity>, Denied> {
        if self.reloads.has_changed().unwrap_or(false) {
            self.reloads.mark_unchanged();
            self.identity = self.auth.prove(&self.proof, self.scope)?;
        }
        Ok(&self.identity)
    }

    /// Resolves when a reload took the call's credential or scope away (reloads that keep them only refresh the
    /// identity). Cancel-safe: a reload seen here and not yet judged is judged by the next [`Held::check`].
    pub async fn revoked(&mut self) -> Denied {
        loop {
            if self.reloads.changed().await.is_err() {
                // The authenticator is gone (the collector is stopping): nothing more to watch.
                std::future::pending::<()>().await;
            }
            match self.auth.prove(&self.proof, self.scope) {
                Ok(id) => self.identity = id,
                Err(d) => return d,
            }
        }
    }
}

/// The authenticator both edges share.
#[derive(Debug)]
pub struct Auth {
    keyring: RwLock<Arc<Keyring>>,
    /// Bumped by every reload, after the new keyring is in place (long calls watch it).
    generation: tokio::sync::watch::Sender<u64>,
    /// Set when the operator allowed a non-loopback listener without authentication.
    insecure: AtomicBool,
    /// Whether `/metrics` needs a `read` identity.
    metrics_protected: AtomicBool,
    buckets: Mutex<HashMap<String, Bucket>>,
    /// Events taken per identity in the current UTC day: (day number, events).
    days: Mutex<HashMap<String, (u64, u64)>>,
    /// Refusal counts.
    pub stats: AuthStats,
}

impl Auth {
    /// An authenticator over `keyring`.
    pub fn new(keyring: Keyring, insecure: bool, metrics_protected: bool) -> Auth {
        Auth {
            keyring: RwLock::new(Arc::new(keyring)),
            generation: tokio::sync::watch::Sender::new(0),
            insecure: AtomicBool::new(insecure),
            metrics_protected: AtomicBool::new(metrics_protected),
            buckets: Mutex::new(HashMap::new()),
            days: Mutex::new(HashMap::new()),
            stats: AuthStats::default(),
        }
    }

    /// No authentication: everyone is [`Identity::anonymous`].
    pub fn open() -> Auth {
        Auth::new(Keyring::default(), false, false)
    }

    /// The current keyring.
    pub fn keyring(&self) -> Arc<Keyring> {
        match self.keyring.read() {
            Ok(k) => k.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Whether requests must prove an identity.
    pub fn required(&self) -> bool {
        !self.keyring().is_empty()
    }

    /// Whether a non-loopback listener runs without authentication by explicit choice.
    pub fn insecure(&self) -> bool {
        self.insecure.load(Ordering::Relaxed)
    }

    /// Whether `/metrics` needs a `read` identity.
    pub fn metrics_protected(&self) -> bool {
        self.metrics_protected.load(Ordering::Relaxed) && self.required()
    }

    /// Replaces the identities (and the settings that come with them). Rate-limit state of identities that
    /// remain is kept.
    pub fn reload(&self, keyring: Keyring, insecure: bool, metrics_protected: bool) {
        let names: std::collections::HashSet<String> = keyring.names.iter().map(|i| i.name.clone()).collect();
        match self.keyring.write() {
            Ok(mut k) => *k = Arc::new(keyring),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(keyring),
        }
        self.insecure.store(insecure, Ordering::Relaxed);
        self.metrics_protected.store(metrics_protected, Ordering::Relaxed);
        if let Ok(mut b) = self.buckets.lock() {
            b.retain(|name, _| names.contains(name));
        }
        if let Ok(mut d) = self.days.lock() {
            d.retain(|name, _| names.contains(name));
        }
        self.stats.reloads.fetch_add(1, Ordering::Relaxed);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Authenticates, checks `scope` (`None`: any proven identity) and keeps what proved it, for a call that
    /// checks it again after each reload ([`Held`]). Refusals are counted as by [`Auth::authorize`].
    pub fn hold(self: &Arc<Self>, creds: Credentials<'_>, scope: Option<Scope>) -> Result<Held, Denied> {
        // Watch before looking up: a reload that lands after the lookup is then seen by the first check.
        let reloads = self.generation.subscribe();
        let identity = match scope {
            Some(s) => self.authorize(creds, s)?,
            None => self.authenticate(creds)?,
        };
        Ok(Held { auth: self.clone(), proof: Proof::of(creds), scope, identity, reloads })
    }

    /// Proves a kept proof against the keyring in force (not counted as a refusal: the caller counts what it
    /// ends).
    fn prove(&self, proof: &Proof, scope: Option<Scope>) -> Result<Arc<Identity>, Denied> {
        let id = Self::resolve(&self.keyring(), proof)?;
        match scope {
            Some(needed) if !id.scopes.grants(needed) => Err(Denied::Scope { identity: id.name.clone(), needed }),
            _ => Ok(id),
        }
    }

    /// Finds the identity the credentials prove (a bearer token first, then a session, then a certificate).
    /// Refusals are counted here; the caller logs them with the peer address.
    pub fn authenticate(&self, creds: Credentials<'_>) -> Result<Arc<Identity>, Denied> {
        let keyring = self.keyring();
        let found = Self::lookup(&keyring, creds);
        match found {
            Ok(id) => Ok(id),
            Err(d) => {
                self.stats.count(&d);
                Err(d)
            }
        }
    }

    fn lookup(keyring: &Keyring, creds: Credentials<'_>) -> Result<Arc<Identity>, Denied> {
        Self::resolve(keyring, &Proof::of(creds))
    }

    fn resolve(keyring: &Keyring, proof: &Proof) -> Result<Arc<Identity>, Denied> {
        if keyring.is_empty() {
            return Ok(Arc::new(Identity::anonymous()));
        }
        match proof {
            Proof::Bearer(None) => Err(Denied::Malformed),
            Proof::Bearer(Some(hash)) | Proof::Session(hash) => {
                keyring.by_token.get(hash).cloned().ok_or(Denied::Unknown)
            }
            Proof::Cert(names) => {
                names.iter().find_map(|n| keyring.by_cert_name.get(n).cloned()).ok_or(Denied::Unknown)
            }
            Proof::None => Err(Denied::Missing),
        }
    }

    /// Authenticates and checks one scope.
    pub fn authorize(&self, creds: Credentials<'_>, needed: Scope) -> Result<Arc<Identity>, Denied> {
        let id = self.authenticate(creds)?;
        if !id.scopes.grants(needed) {
            let d = Denied::Scope { identity: id.name.clone(), needed };
            self.stats.count(&d);
            return Err(d);
        }
        Ok(id)
    }

    /// Takes `n` units (events or requests) from the identity's rate limit, if it has one.
    pub fn take(&self, id: &Identity, n: u64) -> Result<(), Denied> {
        self.take_at(id, n, Instant::now())
    }

    /// Takes `n` events from the identity's rate limit and its daily quota (UTC days, counted in memory: a
    /// restart starts the day's count afresh). A batch over either is refused whole.
    pub fn take_events(&self, id: &Identity, n: u64) -> Result<(), Denied> {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        self.take_events_at(id, n, Instant::now(), now_ms)
    }

    fn take_events_at(&self, id: &Identity, n: u64, now: Instant, wall_ms: u64) -> Result<(), Denied> {
        const DAY_MS: u64 = 86_400_000;
        let Some(max) = id.events_per_day else { return self.take_at(id, n, now) };
        let day = wall_ms / DAY_MS;
        let Ok(mut days) = self.days.lock() else { return self.take_at(id, n, now) };
        let entry = days.entry(id.name.clone()).or_insert((day, 0));
        if entry.0 != day {
            *entry = (day, 0);
        }
        if entry.1.saturating_add(n) > max {
            let d = Denied::Quota { identity: id.name.clone(), retry_after_ms: (day + 1) * DAY_MS - wall_ms };
            self.stats.count(&d);
            return Err(d);
        }
        self.take_at(id, n, now)?;
        entry.1 += n;
        Ok(())
    }

    fn take_at(&self, id: &Identity, n: u64, now: Instant) -> Result<(), Denied> {
        let Some(spec) = id.rate else { return Ok(()) };
        let Ok(mut buckets) = self.buckets.lock() else { return Ok(()) };
        let bucket = buckets.entry(id.name.clone()).or_insert_with(|| Bucket::full(spec, now));
        match bucket.take(spec, n, now) {
            Ok(()) => Ok(()),
            Err(retry_after_ms) => {
                let d = Denied::RateLimited { identity: id.name.clone(), retry_after_ms };
                self.stats.count(&d);
                Err(d)
            }
        }
    }
}

impl Auth {
    /// Logs a refusal: the reason, the identity when one was proven, the peer and the path, never a credential.
    /// The first 100 of each reason and then one in a thousand, so a flood does not flood the log.
    pub fn audit(&self, d: &Denied, peer: Option<std::net::SocketAddr>, path: &str) {
        let n = self.stats.by_reason().iter().find(|(r, _)| *r == d.reason()).map(|(_, n)| *n).unwrap_or(0);
        if n > 100 && n % 1000 != 0 {
            return;
        }
        let identity = match d {
            Denied::Scope { identity, .. } | Denied::RateLimited { identity, .. } => Some(identity.as_str()),
            _ => None,
        };
        tracing::warn!(reason = d.reason(), identity, peer = ?peer, path, so_far = n, "request refused: {}", d.message());
    }
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive, one space or more).
pub fn bearer(header: &[u8]) -> Option<&str> {
    let s = std::str::from_utf8(header).ok()?;
    let (scheme, rest) = s.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = rest.trim_start_matches(' ');
    if token.is_empty() || token.len() > 1024 || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return None;
    }
    Some(token)
}

#[cfg(test)]
mod tests;
