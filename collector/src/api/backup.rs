//! `POST /api/v1/admin/backup` (`{"to": "/abs/dir"}`): starts a backup of the running collector's events into a
//! directory on the collector's host (see [`crate::store::backup`]); answers 202 at once with the sequence the
//! backup is cut at. `GET /api/v1/admin/backup`: the last backup's state (`running`, `done`, `failed`), events
//! written, its manifest when done. One backup at a time (409 while one runs). Ingest goes on throughout: the
//! backup reads the log's acknowledged events, which never change.

use super::{ApiError, ApiState};
use crate::store::backup;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The last backup this collector started (shared with the thread that writes it).
#[derive(Debug, Default)]
pub struct Backups {
    last: Arc<Mutex<Option<BackupStatus>>>,
}

/// A backup's state as `GET /api/v1/admin/backup` answers it.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
pub struct BackupStatus {
    /// `running`, `done` or `failed`.
    pub state: &'static str,
    /// The directory, on the collector's host.
    pub to: String,
    /// Every event acknowledged at or before this sequence (and not deleted by retention) is in the backup.
    pub through_seq: u64,
    /// Events written so far.
    pub events: u64,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// Why it failed.
    pub error: Option<String>,
    /// The manifest, once done.
    pub events_sha256: Option<String>,
}

/// The body of `POST /api/v1/admin/backup`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackupRequest {
    /// An absolute path on the collector's host: a new or empty directory.
    pub to: String,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `POST /api/v1/admin/backup`.
pub async fn start(State(s): State<ApiState>, body: axum::body::Bytes) -> Response {
    let req: BackupRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return ApiError::bad_request(format!("body: {e} (expected {{\"to\": \"/absolute/directory\"}})"))
                .into_response()
        }
    };
    let to = PathBuf::from(&req.to);
    if !to.is_absolute() || to.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
        return ApiError::bad_request(format!("to: {:?} must be an absolute path without ..", req.to)).into_response();
    }
    let mut last = lock(&s.backups.last);
    if let Some(running) = last.as_ref().filter(|b| b.state == "running") {
        return ApiError::new(StatusCode::CONFLICT, format!("a backup into {} is running", running.to)).into_response();
    }
    if let Err(e) = backup::prepare_target(&to) {
        return ApiError::bad_request(format!("to: {e}")).into_response();
    }
    let through = match backup::current_through(&s.store) {
        Ok(t) => t,
        Err(e) => return ApiError::unavailable(e).into_response(),
    };
    let started = BackupStatus {
        state: "running",
        to: req.to.clone(),
        through_seq: through,
        events: 0,
        started_at: crate::time::format_ms(s.clock.now_ms()),
        error: None,
        events_sha256: None,
    };
    *last = Some(started.clone());
    drop(last);
    let (store, shared) = (s.store.clone(), s.backups.last.clone());
    let spawned = std::thread::Builder::new().name("backup".into()).spawn(move || {
        let update = |f: &dyn Fn(&mut BackupStatus)| {
            if let Some(st) = lock(&shared).as_mut() {
                f(st);
            }
        };
        let result = backup::write(&store, &to, through, |n| update(&|st| st.events = n));
        let mut guard = lock(&shared);
        let Some(st) = guard.as_mut() else { return };
        match result {
            Ok(m) => {
                st.state = "done";
                st.events = m.events;
                st.events_sha256 = Some(m.events_sha256);
                tracing::info!(to = %to.display(), through_seq = through, events = m.events, "backup written");
            }
            Err(e) => {
                st.state = "failed";
                st.error = Some(e.to_string());
                tracing::error!(to = %to.display(), error = %e, "backup failed");
            }
        }
    });
    if let Err(e) = spawned {
        if let Some(st) = lock(&s.backups.last).as_mut() {
            (st.state, st.error) = ("failed", Some(e.to_string()));
        }
        return ApiError::unavailable(e).into_response();
    }
    (StatusCode::ACCEPTED, Json(started)).into_response()
}

/// `GET /api/v1/admin/backup`.
pub async fn status(State(s): State<ApiState>) -> Response {
    match lock(&s.backups.last).as_ref() {
        Some(st) => Json(st.clone()).into_response(),
        None => ApiError::not_found("no backup was started since the collector started").into_response(),
    }
}
