//! The client of the node agent's endpoint, as `startline-agent emit` uses it: one JSON body POSTed to
//! `/v1/events`, over TCP (reqwest, `http://` or `https://`) or over the node agent's unix socket (HTTP/1.1
//! on a tokio `UnixStream` through hyper's client connection: reqwest has no unix-socket transport), with the
//! node agent's optional local token as `Authorization: Bearer`.
//!
//! [`post_with_retry`] sends the same bytes until the agent accepts them (202), answers something a retry
//! cannot change (400, 401, 403, 413, 415: returned at once), or the retry budget ends; unreachable, 408, 429
//! (waiting for `Retry-After` when given) and 5xx are retried with backoff. Event ids make the retries
//! duplicates.

use crate::auth::Secret;
use std::path::PathBuf;
use std::time::Duration;

/// Where the node agent listens.
#[derive(Debug, Clone)]
pub enum Target {
    /// `http://host:port` (or `https://`).
    Url(String),
    /// The node agent's unix socket.
    Socket(PathBuf),
}

/// A failed post. Messages never hold the token.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    /// The node agent could not be reached (or answered garbage).
    #[error("cannot reach the node agent at {target}: {reason}")]
    Unreachable {
        /// The URL or socket path.
        target: String,
        /// Why.
        reason: String,
    },
    /// The node agent answered with a status a retry cannot change.
    #[error("node agent answered {status}: {body}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// The answer's body (a JSON error).
        body: String,
    },
    /// Retried for the whole budget without success.
    #[error("{last} (gave up after {})", humantime::format_duration(*.waited))]
    GaveUp {
        /// The last failure.
        last: String,
        /// The budget.
        waited: Duration,
    },
}

/// An answer of the node agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// Body text.
    pub body: String,
    /// `Retry-After` in seconds, when given.
    pub retry_after: Option<u64>,
}

const TIMEOUT: Duration = Duration::from_secs(30);

/// A client for one target; reuse it across retries.
pub struct Client {
    target: Target,
    token: Option<Secret>,
    http: reqwest::Client,
}

impl Client {
    /// A client for `target` sending `token` (if any) as `Authorization: Bearer`.
    pub fn new(target: Target, token: Option<Secret>) -> Result<Self, PostError> {
        if let Target::Url(u) = &target {
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                return Err(PostError::Unreachable {
                    target: u.clone(),
                    reason: "the node agent URL must start with http:// or https://".into(),
                });
            }
        }
        let http = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .build()
            .map_err(|e| PostError::Unreachable { target: describe(&target), reason: e.to_string() })?;
        Ok(Client { target, token, http })
    }

    /// One POST of `payload` to `/v1/events`.
    pub async fn post_once(&self, payload: &str) -> Result<Answer, PostError> {
        let unreachable = |reason: String| PostError::Unreachable { target: describe(&self.target), reason };
        match &self.target {
            Target::Url(base) => {
                let url = format!("{}/v1/events", base.trim_end_matches('/'));
                let mut req = self
                    .http
                    .post(url)
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(payload.to_string());
                if let Some(t) = &self.token {
                    req = req.bearer_auth(t.expose());
                }
                // reqwest's error text holds the URL (no credentials: the token is a header).
                let resp = req.send().await.map_err(|e| unreachable(error_chain(&e)))?;
                let status = resp.status().as_u16();
                let retry_after = retry_after(resp.headers());
                let body = resp.text().await.map_err(|e| unreachable(error_chain(&e)))?;
                Ok(Answer { status, body, retry_after })
            }
            Target::Socket(path) => tokio::time::timeout(TIMEOUT, self.post_socket(path, payload))
                .await
                .map_err(|_| unreachable(format!("no answer within {}s", TIMEOUT.as_secs())))?,
        }
    }

    async fn post_socket(&self, path: &std::path::Path, payload: &str) -> Result<Answer, PostError> {
        use http_body_util::{BodyExt, Full};
        let unreachable = |reason: String| PostError::Unreachable { target: describe(&self.target), reason };
        let stream = tokio::net::UnixStream::connect(path).await.map_err(|e| unreachable(e.to_string()))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake::<_, Full<axum::body::Bytes>>(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| unreachable(error_chain(&e)))?;
        let driver = tokio::spawn(conn);
        let mut req = hyper::Request::post("/v1/events")
            .header(hyper::header::HOST, "localhost")
            .header(hyper::header::CONTENT_TYPE, "application/json");
        if let Some(t) = &self.token {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {}", t.expose()));
        }
        let req = req
            .body(Full::new(axum::body::Bytes::from(payload.to_string())))
            .map_err(|_| unreachable("the request cannot be built (the token holds invalid characters)".into()))?;
        let result = async {
            let resp = sender.send_request(req).await.map_err(|e| unreachable(error_chain(&e)))?;
            let status = resp.status().as_u16();
            let retry_after = retry_after(resp.headers());
            let body = resp.into_body().collect().await.map_err(|e| unreachable(error_chain(&e)))?.to_bytes();
            Ok(Answer { status, body: String::from_utf8_lossy(&body).into_owned(), retry_after })
        }
        .await;
        driver.abort();
        result
    }
}

fn describe(t: &Target) -> String {
    match t {
        Target::Url(u) => u.clone(),
        Target::Socket(p) => format!("unix:{}", p.display()),
    }
}

fn retry_after(h: &hyper::HeaderMap) -> Option<u64> {
    h.get(hyper::header::RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(c) = next {
        out.push_str(": ");
        out.push_str(&c.to_string());
        next = c.source();
    }
    out
}

/// Whether an answer may change on a retry.
pub fn retryable_status(status: u16) -> bool {
    status == 408 || status == 429 || status >= 500
}

/// Posts `payload` until accepted (202), refused for good, or `retry_for` is spent; each retry waits with
/// doubling backoff (200 ms to 5 s), or the agent's `Retry-After` when it is shorter than what is left.
/// `on_retry` hears each failure that will be retried and the wait before the next attempt.
pub async fn post_with_retry(
    client: &Client,
    payload: &str,
    retry_for: Duration,
    mut on_retry: impl FnMut(&str, Duration),
) -> Result<Answer, PostError> {
    let deadline = tokio::time::Instant::now() + retry_for;
    let mut backoff = Duration::from_millis(200);
    loop {
        let (failure, hint) = match client.post_once(payload).await {
            Ok(a) if (200..300).contains(&a.status) => return Ok(a),
            Ok(a) if retryable_status(a.status) => {
                (format!("node agent answered {}: {}", a.status, a.body.trim()), a.retry_after)
            }
            Ok(a) => return Err(PostError::Refused { status: a.status, body: a.body.trim().to_string() }),
            Err(e) => (e.to_string(), None),
        };
        let wait = hint.map_or(backoff, |s| Duration::from_secs(s).max(backoff));
        if tokio::time::Instant::now() + wait > deadline {
            return Err(PostError::GaveUp { last: failure, waited: retry_for });
        }
        on_retry(&failure, wait);
        tokio::time::sleep(wait).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
