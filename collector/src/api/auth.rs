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
//! - Identities with a rate limit spend one unit per request.

use super::{ApiError, ApiState};
use crate::auth::{Credentials, Denied, Peer, Scope, TokenHash};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a dashboard session lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Most sessions kept; the oldest goes first.
const MAX_SESSIONS: usize = 10_000;
/// The session cookie's name.
pub const COOKIE: &str = "startline_session";

/// Dashboard sessions: id -> the token hash that opened it and when it ends.
#[derive(Debug, Default)]
pub struct Sessions(Mutex<HashMap<String, (TokenHash, Instant)>>);

impl Sessions {
    fn open(&self, hash: TokenHash) -> Option<String> {
        let id = crate::auth::generate_token().ok()?;
        let now = Instant::now();
        let mut m = self.0.lock().ok()?;
        m.retain(|_, (_, end)| *end > now);
        if m.len() >= MAX_SESSIONS {
            if let Some(oldest) = m.iter().min_by_key(|(_, (_, end))| *end).map(|(k, _)| k.clone()) {
                m.remove(&oldest);
            }
        }
        m.insert(id.clone(), (hash, now + SESSION_TTL));
        Some(id)
    }

    fn get(&self, id: &str) -> Option<TokenHash> {
        let m = self.0.lock().ok()?;
        m.get(id).filter(|(_, end)| *end > Instant::now()).map(|(h, _)| *h)
    }

    fn close(&self, id: &str) {
        if let Ok(mut m) = self.0.lock() {
            m.remove(id);
        }
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

/// `POST /login`: checks the token and opens a session.
pub async fn login(State(s): State<ApiState>, req: Request) -> Response {
    let peer = req.extensions().get::<Peer>().cloned();
    let tls = peer.as_ref().is_some_and(|p| p.tls);
    let body = match axum::body::to_bytes(req.into_body(), 4096).await {
        Ok(b) => b,
        Err(_) => return login_page(StatusCode::PAYLOAD_TOO_LARGE, "The form is too large."),
    };
    let Some(token) = form_value(&body, "token").map(|t| t.trim().to_string()).filter(|t| !t.is_empty()) else {
        return login_page(StatusCode::BAD_REQUEST, "Enter a token.");
    };
    let header = format!("Bearer {token}");
    let creds = Credentials { authorization: Some(header.as_bytes()), session: None, cert_names: &[] };
    match s.auth.authorize(creds, Scope::Read) {
        Ok(id) => {
            let Some(session) = s.sessions.open(TokenHash::of(&token)) else {
                return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "cannot open a session").into_response();
            };
            tracing::info!(identity = %id.name, peer = ?peer.and_then(|p| p.remote), "dashboard login");
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
            s.auth.audit(&d, peer.and_then(|p| p.remote), "/login");
            let msg = match d {
                Denied::Scope { .. } => "This token has no read access.",
                _ => "Unknown or revoked token.",
            };
            login_page(StatusCode::UNAUTHORIZED, msg)
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
