//! The HTTP JSON edge of ingest: `POST /api/v1/events`, for clients where gRPC is a burden and no node agent runs
//! (a training process on a managed endpoint reporting its own first step and checkpoints). Served on the HTTP
//! API's listener (and its TLS), next to the API's routes but not part of them: the API only reads.
//!
//! - **Identity**: `Authorization: Bearer <token>` or a verified client certificate, as on gRPC; the identity
//!   needs the `ingest` scope (401 without credentials, 403 without the scope, 429 over its rate or daily
//!   quota, each with a JSON body). Its job-id prefixes, sources and node prefixes apply to every event.
//! - **Body**: `Content-Type: application/json` (else 415), at most the gRPC message cap in bytes (else 413):
//!   one event object or `{"events": [...]}` in the JSON form of [`startline_proto::json`] (the node agent's),
//!   each with its `source`, at most `max_batch_events` events.
//! - **All or nothing**: every event is parsed and checked as gRPC checks it ([`Ingest::publish_whole`]); the
//!   first refused one refuses the request with 400 (403 when the identity may not write it), naming the field
//!   as `events[i].<field>` in `{"error": ..., "field": ...}`; nothing is stored.
//! - **Durable answer**: 200 `{"accepted", "duplicates", "rejections"}` only after the events are committed and
//!   flushed, as `PublishBatch` answers; a retried request (same event ids) counts as duplicates. A halted
//!   store, a full queue or a collector shutting down answer 503 or 429 with `Retry-After`: nothing was
//!   acknowledged, retry.

use super::service::{Ingest, WholeRefused};
use crate::auth::{Auth, Credentials, Denied, Peer, Scope};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use startline_proto::pb;
use std::sync::Arc;

/// What the route needs.
#[derive(Clone)]
pub struct HttpIngest {
    /// The ingest service (shared with gRPC: same committer, same intake).
    pub ingest: Ingest,
    /// Identities.
    pub auth: Arc<Auth>,
    /// Largest body, bytes.
    pub max_body_bytes: usize,
}

/// The route's path.
pub const PATH: &str = "/api/v1/events";

/// `POST /api/v1/events`.
pub fn router(state: HttpIngest) -> Router {
    Router::new().route(PATH, post(post_events)).with_state(state)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": message.into()}))).into_response()
}

fn field_error(status: StatusCode, field: &str, reason: &str) -> Response {
    (status, Json(json!({"error": format!("{field}: {reason}"), "field": field}))).into_response()
}

fn with_retry_after(mut r: Response, secs: u64) -> Response {
    if let Ok(v) = HeaderValue::from_str(&secs.max(1).to_string()) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

/// The answer to a refused identity: 401 (with `WWW-Authenticate`), 403 or 429 (with `Retry-After`).
fn denied(d: &Denied) -> Response {
    match d {
        d if d.is_unauthenticated() => {
            let mut r = error(StatusCode::UNAUTHORIZED, d.message());
            r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"startline\""));
            r
        }
        Denied::RateLimited { retry_after_ms, .. } | Denied::Quota { retry_after_ms, .. } => {
            with_retry_after(error(StatusCode::TOO_MANY_REQUESTS, d.message()), retry_after_ms.div_ceil(1000))
        }
        _ => error(StatusCode::FORBIDDEN, d.message()),
    }
}

/// A refusal with a gRPC status (the shared path's), as HTTP.
fn status_answer(s: &tonic::Status) -> Response {
    use tonic::Code;
    let retry_ms = s.metadata().get("retry-after-ms").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let message = s.message().to_string();
    match s.code() {
        Code::InvalidArgument => {
            let field = message.split_once(':').map_or("events", |(f, _)| f).to_string();
            (StatusCode::BAD_REQUEST, Json(json!({"error": message, "field": field}))).into_response()
        }
        Code::Unauthenticated => error(StatusCode::UNAUTHORIZED, message),
        Code::PermissionDenied => error(StatusCode::FORBIDDEN, message),
        Code::ResourceExhausted => {
            with_retry_after(error(StatusCode::TOO_MANY_REQUESTS, message), retry_ms.map_or(1, |ms| ms.div_ceil(1000)))
        }
        _ => with_retry_after(error(StatusCode::SERVICE_UNAVAILABLE, message), 1),
    }
}

async fn post_events(State(s): State<HttpIngest>, req: Request) -> Response {
    let peer = req.extensions().get::<Peer>().cloned();
    let names: &[String] = peer.as_ref().map(|p| &p.cert_names[..]).unwrap_or(&[]);
    let creds = Credentials {
        authorization: req.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes()),
        session: None,
        cert_names: names,
    };
    let identity = match s.auth.authorize(creds, Scope::Ingest) {
        Ok(id) => id,
        Err(d) => {
            s.auth.audit(&d, peer.as_ref().and_then(|p| p.remote), PATH);
            return denied(&d);
        }
    };
    let json_body = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(';').next().is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json")));
    if !json_body {
        return error(StatusCode::UNSUPPORTED_MEDIA_TYPE, "Content-Type must be application/json");
    }
    let body = match axum::body::to_bytes(req.into_body(), s.max_body_bytes).await {
        Ok(b) => b,
        Err(_) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("body: larger than {} bytes (the ingest message cap)", s.max_body_bytes),
            )
        }
    };
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return field_error(StatusCode::BAD_REQUEST, "body", &format!("is not JSON: {e}")),
    };
    let items: Vec<Value> = match v.get("events") {
        Some(Value::Array(a)) => a.clone(),
        Some(_) => return field_error(StatusCode::BAD_REQUEST, "events", "must be an array"),
        None => vec![v],
    };
    let now = startline_proto::time::now_ms();
    let mut events: Vec<pb::LifecycleEvent> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        match startline_proto::json::event_from_json(item, "", now) {
            Ok(ev) => events.push(ev),
            Err((field, reason)) => {
                let field = if field.is_empty() { format!("events[{i}]") } else { format!("events[{i}].{field}") };
                return field_error(StatusCode::BAD_REQUEST, &field, &reason);
            }
        }
    }
    match s.ingest.publish_whole(events, identity).await {
        Ok(ack) => (
            StatusCode::OK,
            Json(json!({
                "accepted": ack.accepted,
                "duplicates": ack.duplicates,
                "rejections": ack.rejections.iter().map(|r| json!({
                    "index": r.index, "event_id": r.event_id, "field": r.field, "reason": r.reason,
                })).collect::<Vec<_>>(),
            })),
        )
            .into_response(),
        Err(WholeRefused::Event { index, error, not_permitted }) => {
            let status = if not_permitted { StatusCode::FORBIDDEN } else { StatusCode::BAD_REQUEST };
            field_error(status, &format!("events[{index}].{}", error.field), &error.reason)
        }
        Err(WholeRefused::Status(st)) => status_answer(&st),
    }
}
