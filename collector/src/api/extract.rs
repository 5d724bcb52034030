//! Request extractors whose rejections are JSON [`ApiError`]s (axum's own answer in plain text), and the safety
//! net that turns any other error response into JSON.
//!
//! - [`Params`]: the query string, decoded strictly: a `%` must start two hex digits, the decoded bytes must be
//!   UTF-8, a parameter may appear once, and the whole string is at most [`MAX_QUERY_BYTES`] (414 beyond).
//! - [`ApiPath`]: path parameters, like `axum::extract::Path`, rejected as JSON.
//! - [`json_errors`]: a response mapper: a 4xx/5xx without a JSON (or the login form's HTML) body becomes
//!   `{"error": "..."}`.

use super::ApiError;
use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use std::collections::HashMap;

/// Longest query string accepted, bytes (414 URI Too Long beyond it).
pub const MAX_QUERY_BYTES: usize = 8 * 1024;
/// Longest piece of client input quoted back in an error message, characters.
const QUOTE_CHARS: usize = 40;

/// Client input quoted in a message: Rust-escaped (no control characters reach the client) and cut short.
pub fn quote(s: &str) -> String {
    let cut: String = s.chars().take(QUOTE_CHARS).collect();
    if cut.len() < s.len() {
        format!("{cut:?}...")
    } else {
        format!("{cut:?}")
    }
}

/// The query string's parameters, strictly decoded (see the module notes).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Params(pub HashMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parse_query(parts.uri.query().unwrap_or("")).map(Params)
    }
}

/// Parses `k=v&k2=v2` (`+` is a space, `%XX` a byte): see the module notes for what is rejected.
pub fn parse_query(query: &str) -> Result<HashMap<String, String>, ApiError> {
    if query.len() > MAX_QUERY_BYTES {
        return Err(ApiError::new(
            StatusCode::URI_TOO_LONG,
            format!("query string of {} bytes; at most {MAX_QUERY_BYTES} are accepted", query.len()),
        ));
    }
    let mut out = HashMap::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let key = decode(k).map_err(|e| ApiError::bad_request(format!("query parameter {}: {e}", quote(k))))?;
        let value = decode(v).map_err(|e| ApiError::bad_request(format!("{}: {e}", quote(&key))))?;
        if out.contains_key(&key) {
            return Err(ApiError::bad_request(format!("{}: query parameter given more than once", quote(&key))));
        }
        out.insert(key, value);
    }
    Ok(out)
}

/// Decodes one `application/x-www-form-urlencoded` component, strictly.
fn decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' => {
                let hex = |c: Option<&u8>| c.and_then(|c| char::from(*c).to_digit(16));
                match (hex(b.get(i + 1)), hex(b.get(i + 2))) {
                    (Some(hi), Some(lo)) => out.push((hi * 16 + lo) as u8),
                    _ => {
                        let bad: String = s[i..].chars().take(3).collect();
                        return Err(format!("invalid percent-encoding {bad:?} (a % must start two hex digits)"));
                    }
                }
                i += 3;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| "not valid UTF-8 once percent-decoded".to_string())
}

/// Path parameters, like `axum::extract::Path<T>`, with a JSON rejection.
#[derive(Debug, Clone)]
pub struct ApiPath<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiPath<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(ApiPath(v)),
            Err(rejection) => {
                let status = rejection.status();
                let text = rejection.body_text();
                Err(ApiError::new(status, format!("path: {}", text.chars().take(200).collect::<String>())))
            }
        }
    }
}

/// Answers a request for an unknown path.
pub async fn unknown_route(uri: Uri) -> ApiError {
    ApiError::not_found(format!("no such endpoint: {}", quote(uri.path())))
}

/// Answers a known path with a method it does not serve (axum adds the `Allow` header).
pub async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method {} is not allowed on {}; use GET", quote(method.as_str()), quote(uri.path())),
    )
}

/// Largest error body quoted when a non-JSON error is turned into JSON.
const QUOTED_BODY_BYTES: usize = 4096;

/// Turns any error response (4xx/5xx) that is not JSON into `{"error": ...}`: the status's reason, plus its body
/// when that is short text. Extractors and fallbacks above already answer JSON; this covers anything else (a
/// rejection from a layer, or a route added later with a plain extractor).
pub async fn json_errors(res: Response) -> Response {
    let status = res.status();
    let is_json = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json") || v.starts_with("text/html"));
    // JSON passes as it is, and so do the login form's own pages (HTML for a browser).
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return res;
    }
    let (mut parts, body) = res.into_parts();
    let reason = status.canonical_reason().unwrap_or("error").to_string();
    let message = match axum::body::to_bytes(body, QUOTED_BODY_BYTES).await {
        Ok(b) if !b.is_empty() => match std::str::from_utf8(&b) {
            Ok(t) => format!("{reason}: {}", t.trim()),
            Err(_) => reason,
        },
        _ => reason,
    };
    let json = ApiError::new(status, message).into_response();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let (_, body) = json.into_parts();
    Response::from_parts(parts, Body::new(body))
}

/// A `window` parameter of the scanning routes (overview, goodput, cost, chains): a duration from 1h to 400d, in
/// milliseconds.
pub fn window_param(v: &str) -> Result<i64, ApiError> {
    humantime::parse_duration(v)
        .ok()
        .filter(|d| d.as_secs() >= 3600 && d.as_secs() <= 400 * 86_400)
        .map(|d| d.as_millis() as i64)
        .ok_or_else(|| ApiError::bad_request(format!("window: {v:?} must be a duration between 1h and 400d")))
}

/// Groups a grouped answer (compare, goodput) shows when `limit` is not given.
pub const GROUPS_LIMIT: usize = 100;
/// The largest `limit` of grouped answers.
pub const MAX_GROUPS_LIMIT: usize = 1000;

/// The `limit` parameter of grouped answers: 1 to [`MAX_GROUPS_LIMIT`] groups.
pub fn groups_limit(v: &str) -> Result<usize, ApiError> {
    v.parse::<usize>().ok().filter(|n| (1..=MAX_GROUPS_LIMIT).contains(n)).ok_or_else(|| {
        ApiError::bad_request(format!("limit: {} is not a whole number from 1 to {MAX_GROUPS_LIMIT}", quote(v)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_query_decoding() {
        let ok = parse_query("a=1&b=x+y&c=%C3%A9&d&&e=").expect("valid");
        assert_eq!(ok.get("b").map(String::as_str), Some("x y"));
        assert_eq!(ok.get("c").map(String::as_str), Some("\u{e9}"));
        assert_eq!(ok.get("d").map(String::as_str), Some(""));
        for bad in ["a=%", "a=%G1", "a=%1", "a=%+1", "%FF=1", "a=%C3", "a=1&a=2"] {
            assert!(parse_query(bad).is_err(), "{bad}");
        }
        let long = format!("a={}", "x".repeat(MAX_QUERY_BYTES));
        assert!(parse_query(&long).is_err());
    }

    #[test]
    fn quotes_are_escaped_and_short() {
        assert_eq!(quote("a\u{1}b"), "\"a\\u{1}b\"");
        assert!(quote(&"x".repeat(500)).len() < 60);
    }
}
