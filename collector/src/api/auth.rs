//! Authentication on the HTTP side: the middleware every route passes, the dashboard's login form and its
//! sessions, and the admin reload route.
//!
//! - Open routes: `/healthz`, `/readyz`, `/login`, `/logout`, and `/metrics` unless `auth.metrics = "read"`.
//! - `/api/v1/admin/*` needs `admin`; every other route (the dashboard, the JSON API, unknown paths) needs
//!   `read`. With no identity configured every request passes as the anonymous identity.
//! - Credentials: `Authorization: Bearer <token>`, a dashboard session cookie, or a verified client certificate.
//!   A refused API request gets 401 (with `WWW-Authenticate: Bearer`), 403 or 429 (with `Retry-After`) and a
//!   JSON body; a browser asking for a dashboard page without credentials is sent to `/login`.
//! - `POST /login` checks the token (form field `token`) and, for an identity with `read`, opens a session: a
//!   random 256-bit id in an `HttpOnly; SameSite=Strict` cookie (`Secure` over TLS), mapped in memory to the
//!   token's hash, valid for [`SESSION_TTL`]. The cookie never holds the token; a token removed by a reload ends
//!   its sessions at their next request; sessions end with the process.
//! - Logins are throttled ([`LoginSettings`], token buckets): failed logins per client address (an IPv4 address,
//!   an IPv6 /64), and logins that prove an identity (successful or not) per identity; past either, 429 with
//!   `Retry-After` and `{"error": ...}`, before the token is even looked at. Each identity holds at most
//!   `max_sessions_per_identity` sessions: its next login ends its own oldest one, never another identity's;
//!   past [`MAX_SESSIONS`] in all a login is refused (503) rather than evicting anyone.
//! - Every request that can change state (any method but GET, HEAD and OPTIONS: `/login`, `/logout`, the admin
//!   reload) is refused with 403 JSON when a browser says it comes from another origin ([`same_origin`]): an
//!   `Origin` that is neither this collector's (the request's `Host`) nor listed in `http.allowed_origins`, or
//!   `Sec-Fetch-Site: cross-site`/`same-site` without an `Origin`. Clients that send neither (curl, scripts) pass.
//! - Identities with a rate limit spend one unit per request.

use super::{ApiError, ApiState};
use crate::auth::limit::{Bucket, RateSpec};
use crate::auth::{Credentials, Denied, Peer, Scope, TokenHash};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a dashboard session lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Most sessions kept in all; past it a login is refused (no session of another identity is evicted).
pub const MAX_SESSIONS: usize = 10_000;
/// The session cookie's name.
pub const COOKIE: &str = "startline_session";
/// Default `http.login_failures_per_minute`.
pub const LOGIN_FAILURES_PER_MINUTE: u32 = 10;
/// Default `http.logins_per_identity_per_minute`.
pub const LOGINS_PER_IDENTITY_PER_MINUTE: u32 = 30;
/// Default `http.max_sessions_per_identity`.
pub const MAX_SESSIONS_PER_IDENTITY: usize = 20;
/// Throttle buckets kept per kind; past it, buckets that have refilled are dropped first.
const MAX_BUCKETS: usize = 65_536;

/// Login throttling, session caps and the origins state-changing requests may come from (`[http]`).
#[derive(Debug, Clone, PartialEq)]
pub struct LoginSettings {
    /// Failed logins per minute from one client address (the burst too); 0: no limit.
    pub failures_per_minute: u32,
    /// Logins per minute that prove one identity, successful or not (the burst too); 0: no limit.
    pub logins_per_identity_per_minute: u32,
    /// Sessions one identity holds at most; its next login ends its own oldest.
    pub max_sessions_per_identity: usize,
    /// Origins (`scheme://host[:port]`) besides the collector's own that may send state-changing requests.
    pub allowed_origins: Vec<String>,
}

impl Default for LoginSettings {
    fn default() -> Self {
        LoginSettings {
            failures_per_minute: LOGIN_FAILURES_PER_MINUTE,
            logins_per_identity_per_minute: LOGINS_PER_IDENTITY_PER_MINUTE,
            max_sessions_per_identity: MAX_SESSIONS_PER_IDENTITY,
            allowed_origins: Vec::new(),
        }
    }
}

/// One dashboard session.
#[derive(Debug, Clone)]
struct Session {
    hash: TokenHash,
    identity: String,
    end: Instant,
}

/// Sessions and the login throttles' buckets.
#[derive(Debug, Default)]
struct SessionState {
    by_id: HashMap<String, Session>,
    by_address: HashMap<IpAddr, Bucket>,
    by_identity: HashMap<String, Bucket>,
}

/// Dashboard sessions (id -> the token hash that opened it, its identity and when it ends) and the login
/// throttles, under [`LoginSettings`].
#[derive(Debug, Default)]
pub struct Sessions {
    settings: LoginSettings,
    state: Mutex<SessionState>,
}

/// Why a login was not let through.
#[derive(Debug, Clone, PartialEq)]
pub enum LoginRefused {
    /// Too many failed logins from this client address; retry after this many milliseconds.
    Address(u64),
    /// Too many logins of this identity; retry after this many milliseconds.
    Identity(u64),
    /// [`MAX_SESSIONS`] sessions are open.
    Full,
}

fn per_minute(n: u32) -> Option<RateSpec> {
    (n > 0).then(|| RateSpec { per_second: f64::from(n) / 60.0, burst: f64::from(n) })
}

/// Whether a bucket (absent: full) has one unit now; `Err` is the wait, milliseconds.
fn has_room(bucket: Option<&Bucket>, spec: RateSpec, now: Instant) -> Result<(), u64> {
    match bucket {
        Some(b) => b.clone().take(spec, 1, now),
        None => Ok(()),
    }
}

/// Takes one unit from `key`'s bucket, keeping the map bounded (refilled buckets are the same as none).
fn spend<K: std::hash::Hash + Eq>(map: &mut HashMap<K, Bucket>, key: K, spec: RateSpec, now: Instant) {
    if map.len() >= MAX_BUCKETS && !map.contains_key(&key) {
        map.retain(|_, b| b.clone().take(spec, spec.burst.ceil() as u64, now).is_err());
        if map.len() >= MAX_BUCKETS {
            // Every bucket is in use: the oldest state goes (a flood from this many addresses is not held back
            // by a per-address throttle anyway).
            map.clear();
        }
    }
    let _ = map.entry(key).or_insert_with(|| Bucket::full(spec, now)).take(spec, 1, now);
}

impl Sessions {
    /// Sessions under these settings.
    pub fn new(settings: LoginSettings) -> Self {
        Sessions { settings, state: Mutex::default() }
    }

    /// The settings.
    pub fn settings(&self) -> &LoginSettings {
        &self.settings
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SessionState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a login from `address` may be tried now (its failures are within the limit).
    pub fn address_allows(&self, address: Option<IpAddr>, now: Instant) -> Result<(), LoginRefused> {
        let (Some(spec), Some(a)) = (per_minute(self.settings.failures_per_minute), address) else { return Ok(()) };
        has_room(self.state().by_address.get(&a), spec, now).map_err(LoginRefused::Address)
    }

    /// Counts a failed login from `address`.
    pub fn failed(&self, address: Option<IpAddr>, now: Instant) {
        if let (Some(spec), Some(a)) = (per_minute(self.settings.failures_per_minute), address) {
            spend(&mut self.state().by_address, a, spec, now);
        }
    }

    /// Counts a login that proved `identity`; `Err` when the identity is over its logins per minute.
    pub fn identity_attempt(&self, identity: &str, now: Instant) -> Result<(), LoginRefused> {
        let Some(spec) = per_minute(self.settings.logins_per_identity_per_minute) else { return Ok(()) };
        let mut st = self.state();
        has_room(st.by_identity.get(identity), spec, now).map_err(LoginRefused::Identity)?;
        spend(&mut st.by_identity, identity.to_string(), spec, now);
        Ok(())
    }

    /// Opens a session for `identity`: ends the identity's own oldest session when it holds
    /// `max_sessions_per_identity`; refused when [`MAX_SESSIONS`] are open (none of another identity's sessions
    /// is ended).
    pub fn open(&self, hash: TokenHash, identity: &str, now: Instant) -> Result<String, LoginRefused> {
        let id = crate::auth::generate_token().map_err(|_| LoginRefused::Full)?;
        let mut st = self.state();
        st.by_id.retain(|_, s| s.end > now);
        let cap = self.settings.max_sessions_per_identity.max(1);
        let mut own: Vec<(Instant, String)> =
            st.by_id.iter().filter(|(_, s)| s.identity == identity).map(|(k, s)| (s.end, k.clone())).collect();
        if own.len() >= cap {
            own.sort();
            for (_, k) in own.iter().take(own.len() + 1 - cap) {
                st.by_id.remove(k);
            }
        }
        if st.by_id.len() >= MAX_SESSIONS {
            return Err(LoginRefused::Full);
        }
        st.by_id.insert(id.clone(), Session { hash, identity: identity.to_string(), end: now + SESSION_TTL });
        Ok(id)
    }

    fn get(&self, id: &str) -> Option<TokenHash> {
        self.state().by_id.get(id).filter(|s| s.end > Instant::now()).map(|s| s.hash)
    }

    fn close(&self, id: &str) {
        self.state().by_id.remove(id);
    }

    /// Open sessions of `identity` (tests, diagnostics).
    pub fn open_sessions(&self, identity: &str) -> usize {
        let now = Instant::now();
        self.state().by_id.values().filter(|s| s.identity == identity && s.end > now).count()
    }
}

/// What a route needs.
fn needs(path: &str, metrics_protected: bool) -> Option<Scope> {
    match path {
        "/healthz" | "/readyz" | "/login" | "/logout" => None,
        "/metrics" if !metrics_protected => None,
        p if p.starts_with("/api/v1/admin/") => Some(Scope::Admin),
        _ => Some(Scope::Read),
    }
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';')).find_map(|kv| {
        let (k, v) = kv.trim().split_once('=')?;
        (k == name).then_some(v)
    })
}

fn wants_html(req: &Request) -> bool {
    req.method() == axum::http::Method::GET
        && matches!(req.uri().path(), "/" | "/dashboard")
        && req.headers().get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("text/html"))
}

/// The refusal as an HTTP answer.
fn refused(d: &Denied) -> Response {
    let status = if d.is_unauthenticated() {
        StatusCode::UNAUTHORIZED
    } else if matches!(d, Denied::RateLimited { .. } | Denied::Quota { .. }) {
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::FORBIDDEN
    };
    let mut r = ApiError::new(status, d.message()).into_response();
    if d.is_unauthenticated() {
        r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"startline\""));
    }
    if let Denied::RateLimited { retry_after_ms, .. } | Denied::Quota { retry_after_ms, .. } = d {
        if let Ok(v) = HeaderValue::from_str(&retry_after_ms.div_ceil(1000).max(1).to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    r
}

/// The middleware: proves the caller's identity and checks the route's scope.
pub async fn require(State(s): State<ApiState>, req: Request, next: Next) -> Response {
    let Some(scope) = needs(req.uri().path(), s.auth.metrics_protected()) else { return next.run(req).await };
    let peer = req.extensions().get::<Peer>().cloned();
    let session = cookie(req.headers(), COOKIE).and_then(|id| s.sessions.get(id));
    let names: &[String] = peer.as_ref().map(|p| &p.cert_names[..]).unwrap_or(&[]);
    let creds = Credentials {
        authorization: req.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes()),
        session,
        cert_names: names,
    };
    let proven = s.auth.authorize(creds, scope).and_then(|id| s.auth.take(&id, 1).map(|()| id));
    match proven {
        Ok(_) => next.run(req).await,
        Err(d) => {
            s.auth.audit(&d, peer.as_ref().and_then(|p| p.remote), req.uri().path());
            if d.is_unauthenticated() && wants_html(&req) {
                return (StatusCode::SEE_OTHER, [(header::LOCATION, "/login")]).into_response();
            }
            refused(&d)
        }
    }
}

const LOGIN: &str = include_str!("login.html");

fn login_page(status: StatusCode, message: &str) -> Response {
    let body = LOGIN.replace("{{message}}", message);
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::HeaderName::from_static("x-frame-options"), "DENY"),
        ],
        body,
    )
        .into_response()
}

/// `GET /login`: the form.
pub async fn login_form(State(s): State<ApiState>) -> Response {
    if !s.auth.required() {
        return (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
    }
    login_page(StatusCode::OK, "")
}

/// Decodes one `application/x-www-form-urlencoded` value.
fn form_value(body: &[u8], key: &str) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let raw = text.split('&').find_map(|kv| kv.split_once('=').filter(|(k, _)| *k == key).map(|(_, v)| v))?;
    let mut out = Vec::with_capacity(raw.len());
    let b = raw.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b'%' => return None,
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// A throttled login: 429 with `Retry-After` (whole seconds) and a JSON body.
fn throttled(retry_after_ms: u64, why: &str) -> Response {
    let secs = retry_after_ms.div_ceil(1000).max(1);
    let mut r = ApiError::new(StatusCode::TOO_MANY_REQUESTS, format!("{why}; retry after {secs} s")).into_response();
    if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

/// Logs a refused login (the first 100 of the process, then one in a thousand) and counts it as `rate_limited`.
fn audit_login(s: &ApiState, why: &str, identity: Option<&str>, peer: Option<std::net::SocketAddr>) {
    let n = s.auth.stats.rate_limited.fetch_add(1, Ordering::Relaxed) + 1;
    if n <= 100 || n % 1000 == 0 {
        tracing::warn!(reason = "rate_limited", identity, peer = ?peer, path = "/login", so_far = n, "login refused: {why}");
    }
}

/// `POST /login`: checks the token and opens a session.
pub async fn login(State(s): State<ApiState>, req: Request) -> Response {
    let peer = req.extensions().get::<Peer>().cloned();
    let remote = peer.as_ref().and_then(|p| p.remote);
    let address = remote.map(|a| crate::conn_limit::address_key(a.ip()));
    let tls = peer.as_ref().is_some_and(|p| p.tls);
    if let Err(LoginRefused::Address(ms)) = s.sessions.address_allows(address, Instant::now()) {
        let why = "too many failed logins from this address (http.login_failures_per_minute)";
        audit_login(&s, why, None, remote);
        return throttled(ms, why);
    }
    let body = match axum::body::to_bytes(req.into_body(), 4096).await {
        Ok(b) => b,
        Err(_) => return login_page(StatusCode::PAYLOAD_TOO_LARGE, "The form is too large."),
    };
    let Some(token) = form_value(&body, "token").map(|t| t.trim().to_string()).filter(|t| !t.is_empty()) else {
        return login_page(StatusCode::BAD_REQUEST, "Enter a token.");
    };
    let header = format!("Bearer {token}");
    let creds = Credentials { authorization: Some(header.as_bytes()), session: None, cert_names: &[] };
    let now = Instant::now();
    match s.auth.authorize(creds, Scope::Read) {
        Ok(id) => {
            let opened = s
                .sessions
                .identity_attempt(&id.name, now)
                .and_then(|()| s.sessions.open(TokenHash::of(&token), &id.name, now));
            let session = match opened {
                Ok(session) => session,
                Err(LoginRefused::Identity(ms)) | Err(LoginRefused::Address(ms)) => {
                    let why =
                        format!("too many logins of identity {:?} (http.logins_per_identity_per_minute)", id.name);
                    audit_login(&s, &why, Some(&id.name), remote);
                    return throttled(ms, &why);
                }
                Err(LoginRefused::Full) => {
                    tracing::warn!(identity = %id.name, "login refused: {MAX_SESSIONS} dashboard sessions are open");
                    return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "too many dashboard sessions are open")
                        .into_response();
                }
            };
            tracing::info!(identity = %id.name, peer = ?remote, "dashboard login");
            let secure = if tls { "; Secure" } else { "" };
            let cookie = format!(
                "{COOKIE}={session}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
                SESSION_TTL.as_secs()
            );
            let mut r = (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
        Err(d) => {
            s.auth.audit(&d, remote, "/login");
            s.sessions.failed(address, now);
            let msg = match &d {
                Denied::Scope { identity, .. } => {
                    // A token of an identity without read still proves the identity: its logins count.
                    if let Err(LoginRefused::Identity(ms)) = s.sessions.identity_attempt(identity, now) {
                        let why =
                            format!("too many logins of identity {identity:?} (http.logins_per_identity_per_minute)");
                        audit_login(&s, &why, Some(identity), remote);
                        return throttled(ms, &why);
                    }
                    "This token has no read access."
                }
                _ => "Unknown or revoked token.",
            };
            login_page(StatusCode::UNAUTHORIZED, msg)
        }
    }
}

/// The authority (`host[:port]`, lowercase, without the scheme's default port) of an origin or a `Host` value.
fn authority(value: &str, scheme: &str) -> String {
    let v = value.trim().trim_end_matches('/').to_ascii_lowercase();
    let default = if scheme == "https" { ":443" } else { ":80" };
    v.strip_suffix(default).map(str::to_string).unwrap_or(v)
}

/// Why a state-changing request is refused as cross-origin, if it is (see the module notes).
pub fn cross_origin(headers: &HeaderMap, host: Option<&str>, allowed: &[String]) -> Option<String> {
    let text = |name: &str| headers.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}").trim().to_string());
    match text("origin") {
        Some(origin) => {
            let Some((scheme, rest)) = origin.split_once("://") else {
                return Some(format!(
                    "cross-origin request refused: Origin {} is not an origin",
                    super::extract::quote(&origin)
                ));
            };
            let scheme = scheme.to_ascii_lowercase();
            let own = host.is_some_and(|h| authority(h, &scheme) == authority(rest, &scheme));
            let listed =
                allowed.iter().any(|a| a.trim_end_matches('/').eq_ignore_ascii_case(origin.trim_end_matches('/')));
            (!own && !listed).then(|| {
                format!(
                    "cross-origin request refused: Origin {} is not this collector's (list it in http.allowed_origins)",
                    super::extract::quote(&origin)
                )
            })
        }
        None => match text("sec-fetch-site").as_deref() {
            Some(site @ ("cross-site" | "same-site")) => {
                Some(format!("cross-origin request refused: Sec-Fetch-Site is {site}"))
            }
            _ => None,
        },
    }
}

/// The middleware in front of every route: a request that can change state (any method but GET, HEAD and
/// OPTIONS) from another origin is refused with 403 JSON before it reaches its route or authentication.
pub async fn same_origin(State(s): State<ApiState>, req: Request, next: Next) -> Response {
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        return next.run(req).await;
    }
    let host = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_string())
        .or_else(|| req.headers().get(header::HOST).and_then(|v| v.to_str().ok()).map(str::to_string));
    match cross_origin(req.headers(), host.as_deref(), &s.sessions.settings().allowed_origins) {
        None => next.run(req).await,
        Some(why) => {
            let peer = req.extensions().get::<Peer>().and_then(|p| p.remote);
            let n = s.auth.stats.origin.fetch_add(1, Ordering::Relaxed) + 1;
            if n <= 100 || n % 1000 == 0 {
                tracing::warn!(reason = "origin", peer = ?peer, path = req.uri().path(), so_far = n, "request refused: {why}");
            }
            ApiError::new(StatusCode::FORBIDDEN, why).into_response()
        }
    }
}

/// `POST /logout`: ends the session.
pub async fn logout(State(s): State<ApiState>, headers: HeaderMap) -> Response {
    if let Some(id) = cookie(&headers, COOKIE) {
        s.sessions.close(id);
    }
    let mut r = (StatusCode::SEE_OTHER, [(header::LOCATION, "/login")]).into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("startline_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    r
}

/// `POST /api/v1/admin/reload`: re-reads `[auth]` and `[tls]` from the config file.
pub async fn reload(State(s): State<ApiState>) -> Response {
    let Some(reload) = s.reload.clone() else {
        return ApiError::new(StatusCode::CONFLICT, "started without a config file: nothing to reload").into_response();
    };
    match tokio::task::spawn_blocking(move || reload()).await {
        Ok(Ok(summary)) => axum::Json(summary).into_response(),
        Ok(Err(why)) => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, why).into_response(),
        Err(e) => ApiError::unavailable(e).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_values_decode_and_bad_escapes_are_refused() {
        assert_eq!(form_value(b"token=stl_abc&x=1", "token").as_deref(), Some("stl_abc"));
        assert_eq!(form_value(b"x=1&token=a%2Bb+c", "token").as_deref(), Some("a+b c"));
        assert_eq!(form_value(b"token=%zz", "token"), None);
        assert_eq!(form_value(b"token=%4", "token"), None);
        assert_eq!(form_value(b"tok=1", "token"), None);
    }

    #[test]
    fn routes_need_the_right_scope() {
        assert_eq!(needs("/healthz", true), None);
        assert_eq!(needs("/metrics", false), None);
        assert_eq!(needs("/metrics", true), Some(Scope::Read));
        assert_eq!(needs("/api/v1/admin/reload", false), Some(Scope::Admin));
        assert_eq!(needs("/api/v1/jobs", false), Some(Scope::Read));
        assert_eq!(needs("/no/such/route", false), Some(Scope::Read));
    }

    #[test]
    fn cookies_are_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, HeaderValue::from_static("a=1; startline_session=xyz; b=2"));
        assert_eq!(cookie(&h, COOKIE), Some("xyz"));
        assert_eq!(cookie(&h, "c"), None);
    }
}
