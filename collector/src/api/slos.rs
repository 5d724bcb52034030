//! `GET /api/v1/slos`, `GET /api/v1/slos/{name}?window=7d`, `GET /api/v1/alerts?state=firing|resolved|all`.

use super::extract::{ApiPath, Params};
use super::{ApiError, ApiState};
use crate::slo::SloDef;
use crate::time::format_ms;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

fn definition(d: &SloDef) -> Value {
    json!({
        "name": d.name,
        "description": d.description,
        "threshold_seconds": d.threshold_ms as f64 / 1000.0,
        "objective_percent": d.objective * 100.0,
        "window": humantime::format_duration(std::time::Duration::from_millis(d.window_ms as u64)).to_string(),
        "window_seconds": d.window_ms / 1000,
        "page_on_breach": d.page_on_breach,
        "exclude_cancelled": d.exclude_cancelled,
        "selector": d.selector.to_json(),
    })
}

fn status_json(s: &crate::slo::SloStatus) -> Value {
    json!({
        "window_seconds": s.window_ms / 1000,
        "good": s.good,
        "bad": s.bad,
        "total": s.total,
        "compliance": s.compliance,
        "objective": s.objective,
        "error_budget_remaining": s.error_budget_remaining,
        "burn_rates": s.burn_rates.iter().map(|(w, r, n)| json!({"window": w, "burn_rate": r, "decided_jobs": n})).collect::<Vec<_>>(),
        "breached_waiting": s.breached_waiting,
        "pending": s.pending,
        "time_to_first_step_seconds": s.ttfs_seconds,
    })
}

/// `GET /api/v1/slos`: every SLO with its status over its own window.
pub async fn list(State(s): State<ApiState>) -> Json<Value> {
    let now = s.clock.now_ms();
    let idx = s.index.read();
    let slos: Vec<Value> = idx
        .slo
        .defs()
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let mut v = definition(d);
            v["status"] = idx.slo.status(i, now, d.window_ms).map_or(Value::Null, |st| status_json(&st));
            v
        })
        .collect();
    Json(json!({ "slos": slos, "as_of": format_ms(now) }))
}

/// `GET /api/v1/slos/{name}?window=7d`: one SLO over a chosen window (default: its own).
pub async fn detail(
    State(s): State<ApiState>,
    ApiPath(name): ApiPath<String>,
    Params(q): Params,
) -> Result<Json<Value>, ApiError> {
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
    let mut v = definition(d);
    v["status"] = idx.slo.status(i, now, window.unwrap_or(d.window_ms)).map_or(Value::Null, |st| status_json(&st));
    v["as_of"] = json!(format_ms(now));
    Ok(Json(v))
}

/// `GET /api/v1/alerts?state=firing|resolved|all` (default `all`).
pub async fn alerts(State(s): State<ApiState>, Params(q): Params) -> Result<Json<Value>, ApiError> {
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
    let out: Vec<Value> = alerts
        .iter()
        .map(|a| {
            json!({
                "key": a.key,
                "state": if a.firing() { "firing" } else { "resolved" },
                "labels": a.labels,
                "annotations": a.annotations,
                "starts_at": format_ms(a.starts_at_ms),
                "resolved_at": a.resolved_at_ms.map(format_ms),
            })
        })
        .collect();
    Ok(Json(json!({ "alerts": out })))
}
