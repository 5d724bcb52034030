//! `GET /api/v1/slos`, `GET /api/v1/slos/{name}?window=7d`, `GET /api/v1/alerts?state=firing|resolved|all`.

use super::extract::{ApiPath, Params};
use super::types::{Alert, AlertList, Slo, SloList};
use super::{ApiError, ApiState};
use crate::time::format_ms;
use axum::extract::State;
use axum::Json;

/// `GET /api/v1/slos`: every SLO with its status over its own window.
pub async fn list(State(s): State<ApiState>) -> Json<SloList> {
    let now = s.clock.now_ms();
    let idx = s.index.read();
    let slos: Vec<Slo> = idx
        .slo
        .defs()
        .iter()
        .enumerate()
        .map(|(i, d)| Slo::new(d, idx.slo.status(i, now, d.window_ms).as_ref()))
        .collect();
    Json(SloList { as_of: format_ms(now), slos })
}

/// `GET /api/v1/slos/{name}?window=7d`: one SLO over a chosen window (default: its own).
pub async fn detail(
    State(s): State<ApiState>,
    ApiPath(name): ApiPath<String>,
    Params(q): Params,
) -> Result<Json<Slo>, ApiError> {
    let now = s.clock.now_ms();
    let mut window: Option<i64> = None;
    for (k, v) in &q {
        match k.as_str() {
            "window" => {
                let d = humantime::parse_duration(v)
                    .ok()
                    .filter(|d| d.as_secs() >= 60 && d.as_secs() <= 400 * 86_400)
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "window: {v:?} must be a duration between 1m and 400d, like \"7d\""
                        ))
                    })?;
                window = Some(d.as_millis() as i64);
            }
            other => return Err(ApiError::bad_request(format!("{other}: unknown query parameter"))),
        }
    }
    let idx = s.index.read();
    let i = idx
        .slo
        .defs()
        .iter()
        .position(|d| d.name == name)
        .ok_or_else(|| ApiError::not_found(format!("slo {name:?} is not defined")))?;
    let d = &idx.slo.defs()[i];
    if let Some(w) = window {
        let kept = idx.slo.retained_ms(i);
        if w > kept {
            return Err(ApiError::bad_request(format!(
                "window: slo {name:?} keeps {} of history; ask for at most that",
                humantime::format_duration(std::time::Duration::from_millis(kept as u64))
            )));
        }
    }
    let status = idx.slo.status(i, now, window.unwrap_or(d.window_ms));
    Ok(Json(Slo { as_of: Some(format_ms(now)), ..Slo::new(d, status.as_ref()) }))
}

/// `GET /api/v1/alerts?state=firing|resolved|all` (default `all`).
pub async fn alerts(State(s): State<ApiState>, Params(q): Params) -> Result<Json<AlertList>, ApiError> {
    let mut want: Option<bool> = None;
    for (k, v) in &q {
        match (k.as_str(), v.as_str()) {
            ("state", "firing") => want = Some(true),
            ("state", "resolved") => want = Some(false),
            ("state", "all") => want = None,
            ("state", other) => {
                return Err(ApiError::bad_request(format!("state: {other:?} is not one of firing, resolved, all")))
            }
            (other, _) => return Err(ApiError::bad_request(format!("{other}: unknown query parameter"))),
        }
    }
    let mut alerts = s.board.snapshot();
    alerts.retain(|a| want.is_none_or(|w| a.firing() == w));
    alerts.sort_by(|a, b| b.starts_at_ms.cmp(&a.starts_at_ms).then_with(|| a.key.cmp(&b.key)));
    Ok(Json(AlertList { alerts: alerts.iter().map(Alert::new).collect() }))
}
