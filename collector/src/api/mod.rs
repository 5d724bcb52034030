//! The HTTP side of the collector (axum): the built-in dashboard, the JSON API over jobs, SLOs, alerts,
//! comparisons and the overview, `/metrics`, health and readiness. Every error is a 4xx
//! (or 503) with a JSON body `{"error": "..."}`, extractor rejections, unknown paths and wrong methods included
//! (see [`extract`]); internal error text never reaches clients. [`serve`] runs the router on a listener with
//! header-read and idle timeouts and a bounded shutdown.
//!
//! Every JSON body is a typed struct serialized by serde: the routes' bodies are in `types` (declared with keys in
//! alphabetical order, the order those routes have always written them), the comparison's is
//! [`crate::compare::Report`] and errors are [`ApiError`]. `tests` calls every route in process against golden
//! bodies. [`openapi`] serves the contract, generated from those structs.

pub mod auth;
pub mod backup;
mod chains;
mod compare;
pub mod eta;
pub mod extract;
mod goodput;
mod jobs;
mod nodes;
pub mod openapi;
mod overview;
pub mod reads;
pub mod serve;
mod slos;
#[cfg(test)]
mod tests;
pub mod types;

use crate::index::SharedIndex;
use crate::store::Store;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use types::Status;

/// What the handlers share.
#[derive(Clone)]
pub struct ApiState {
    /// The job index.
    pub index: SharedIndex,
    /// The store, for raw events.
    pub store: Store,
    /// Set once the store is restored and the listeners are bound.
    pub ready: Arc<AtomicBool>,
    /// Storage and committer health.
    pub health: Arc<crate::health::Health>,
    /// Page size cap for listings.
    pub max_page_size: usize,
    /// The clock.
    pub clock: crate::time::Clock,
    /// Current alerts.
    pub board: crate::alert::AlertBoard,
    /// Metrics, when enabled.
    pub telemetry: Option<Arc<crate::export::Telemetry>>,
    /// Identities and refusal counts.
    pub auth: Arc<crate::auth::Auth>,
    /// Dashboard sessions.
    pub sessions: Arc<auth::Sessions>,
    /// Re-reads `[auth]` and `[tls]` (absent without a config file); answers what it loaded.
    pub reload: Option<Reload>,
    /// Prices and capacities (`[cost]`).
    pub cost: Arc<crate::compare::cost::CostModel>,
    /// Stages that complete a chain (`[chains] final_stages`).
    pub final_stages: Arc<Vec<String>>,
    /// The suspect-node rule (`[nodes]`).
    pub nodes: crate::index::nodes::NodeSettings,
    /// GPU health readings from node agents.
    pub node_health: crate::index::nodes::HealthBook,
    /// Chain SLOs (`[[chain_slo]]`).
    pub chain_slos: Arc<Vec<crate::slo::chain::ChainSloDef>>,
    /// The gate of large reads (`http.max_concurrent_reads`).
    pub reads: reads::ReadGate,
    /// The last backup started through the admin API.
    pub backups: Arc<backup::Backups>,
}

/// The reload hook `POST /api/v1/admin/reload` calls.
pub type Reload = Arc<dyn Fn() -> Result<types::Reloaded, String> + Send + Sync>;

/// An error answer: a status and a message for the client.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

/// The body of every error answer.
#[derive(Debug, Serialize, schemars::JsonSchema)]
#[schemars(rename = "Error")]
struct ErrorBody<'a> {
    error: &'a str,
}

impl ApiError {
    /// Any status with a message.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into() }
    }
    /// 400 with a message.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into() }
    }
    /// 404 with a message.
    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::NOT_FOUND, message: message.into() }
    }
    /// 503; the detail goes to the log, not the client.
    pub fn unavailable(detail: impl std::fmt::Display) -> Self {
        tracing::error!(%detail, "request failed");
        ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: "storage unavailable".into() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(ErrorBody { error: &self.message })).into_response()
    }
}

/// The API router. Tests call it without a socket.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/api/v1/jobs", get(jobs::list))
        .route("/api/v1/jobs/{*job_id}", get(jobs::detail))
        .route("/api/v1/slos", get(slos::list))
        .route("/api/v1/slos/{name}", get(slos::detail))
        .route("/api/v1/slos/{name}/history", get(slos::history))
        .route("/api/v1/alerts", get(slos::alerts))
        .route("/api/v1/overview", get(overview::overview))
        .route("/api/v1/goodput", get(goodput::goodput))
        .route("/api/v1/cost", get(goodput::cost))
        .route("/api/v1/advice", get(eta::advice))
        .route("/api/v1/chains", get(chains::list))
        .route("/api/v1/chains/{*chain_id}", get(chains::detail))
        .route("/api/v1/nodes", get(nodes::list))
        .route("/api/v1/nodes/{node}", get(nodes::detail))
        .route("/api/v1/compare", get(compare::json))
        .route("/api/v1/compare.svg", get(compare::svg))
        .route("/api/v1/openapi.json", get(openapi::serve))
        .route("/metrics", get(metrics))
        .route("/", get(dashboard))
        .route("/dashboard", get(dashboard))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/login", get(auth::login_form).post(auth::login))
        .route("/logout", axum::routing::post(auth::logout))
        .route("/api/v1/admin/reload", axum::routing::post(auth::reload))
        .route("/api/v1/admin/backup", axum::routing::post(backup::start).get(backup::status))
        .fallback(extract::unknown_route)
        .method_not_allowed_fallback(extract::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(state.clone(), auth::require))
        .layer(axum::middleware::from_fn_with_state(state.clone(), auth::same_origin))
        .layer(axum::middleware::map_response(extract::json_errors))
        .with_state(state)
}

/// The built-in dashboard: one page, its script and styles embedded in the binary (no CDN).
const DASHBOARD: &str = include_str!("dashboard.html");

async fn dashboard() -> Response {
    (
        [
            (axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (axum::http::header::CACHE_CONTROL, "no-cache"),
        ],
        DASHBOARD,
    )
        .into_response()
}

async fn metrics(axum::extract::State(s): axum::extract::State<ApiState>) -> Response {
    match s.telemetry.as_ref().map(|t| t.prometheus_text()) {
        Some(Ok(text)) => {
            ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
        }
        Some(Err(e)) => ApiError::unavailable(e).into_response(),
        None => ApiError::not_found("metrics are disabled").into_response(),
    }
}

async fn healthz(axum::extract::State(s): axum::extract::State<ApiState>) -> Response {
    match s.health.problem() {
        None => Json(Status { reason: None, status: "ok" }).into_response(),
        Some(why) => {
            (StatusCode::SERVICE_UNAVAILABLE, Json(Status { reason: Some(why), status: "unhealthy" })).into_response()
        }
    }
}

async fn readyz(axum::extract::State(s): axum::extract::State<ApiState>) -> Response {
    let not_ready = |why: String| {
        (StatusCode::SERVICE_UNAVAILABLE, Json(Status { reason: Some(why), status: "not ready" })).into_response()
    };
    if !s.ready.load(Ordering::Relaxed) {
        return not_ready("starting".to_string());
    }
    match s.health.problem() {
        None => Json(Status { reason: None, status: "ready" }).into_response(),
        Some(why) => not_ready(why),
    }
}
