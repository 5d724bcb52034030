//! `GET /api/v1/slos`, `GET /api/v1/slos/{name}?window=7d`, `GET /api/v1/slos/{name}/history?range=28d&step=6h`,
//! `GET /api/v1/alerts?state=firing|resolved|all`.

use super::extract::{ApiPath, Params};
use super::types::{Alert, AlertList, BurnRuleInfo, RuleBurn, Slo, SloHistory, SloHistoryPoint, SloList};
use super::{ApiError, ApiState};
use crate::alert::burn::RULES;
use crate::slo::{burn_rate, window::Counts};
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

/// Points a history answer may hold.
const MAX_POINTS: i64 = 2_000;

fn duration_param(k: &str, v: &str, min_s: u64) -> Result<i64, ApiError> {
    humantime::parse_duration(v)
        .ok()
        .filter(|d| d.as_secs() >= min_s && d.as_secs() <= 800 * 86_400)
        .map(|d| d.as_millis() as i64)
        .ok_or_else(|| {
            ApiError::bad_request(format!("{k}: {v:?} must be a duration of at least {min_s} s, like \"6h\""))
        })
}

/// `GET /api/v1/slos/{name}/history?range=28d&step=6h`: the SLO window's counts, compliance and error budget,
/// and every burn-rate rule's two windows, at each step over the range (default: the SLO's window, in about 120
/// steps of whole minutes). The range is limited to what the collector keeps (`window + max(window, 3d) + 1d`
/// of minute counts), so every point is exact.
pub async fn history(
    State(s): State<ApiState>,
    ApiPath(name): ApiPath<String>,
    Params(q): Params,
) -> Result<Json<SloHistory>, ApiError> {
    let now = s.clock.now_ms();
    let (mut range, mut step) = (None, None);
    for (k, v) in &q {
        match k.as_str() {
            "range" => range = Some(duration_param(k, v, 60)?),
            "step" => step = Some(duration_param(k, v, 60)?),
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
    let longest = RULES.iter().map(|r| r.long_ms).fold(d.window_ms, i64::max);
    let max_range = idx.slo.history_retained_ms(i) - longest;
    let range = range.unwrap_or(d.window_ms);
    if range > max_range {
        return Err(ApiError::bad_request(format!(
            "range: slo {name:?} keeps counts for charts over at most {}",
            humantime::format_duration(std::time::Duration::from_secs((max_range / 1000) as u64))
        )));
    }
    let step = match step {
        Some(st) => (st / 60_000).max(1) * 60_000,
        None => ((range + 119) / 120 + 59_999) / 60_000 * 60_000,
    };
    if range / step + 1 > MAX_POINTS {
        let d = |ms: i64| humantime::format_duration(std::time::Duration::from_secs((ms / 1000) as u64));
        return Err(ApiError::bad_request(format!(
            "step: {} in steps of {} is {} points, more than {MAX_POINTS}; ask for a longer step",
            d(range),
            d(step),
            range / step + 1
        )));
    }
    let windows: Vec<i64> = RULES.iter().flat_map(|r| [r.long_ms, r.short_ms]).collect();
    let points = idx.slo.history(i, now - range, now, step, &windows);
    let objective = d.objective;
    let budget = |c: Counts| {
        if c.total() == 0 {
            (1.0, 1.0)
        } else {
            (c.good as f64 / c.total() as f64, 1.0 - c.bad as f64 / (c.total() as f64 * (1.0 - objective)))
        }
    };
    let answer = SloHistory {
        as_of: format_ms(now),
        burn_rules: RULES
            .iter()
            .map(|r| BurnRuleInfo {
                factor: r.factor(d.window_ms),
                long_window_seconds: r.long_ms / 1000,
                severity: r.severity,
                short_window_seconds: r.short_ms / 1000,
                windows: r.windows,
            })
            .collect(),
        name: d.name.clone(),
        objective,
        points: points
            .into_iter()
            .map(|p| {
                let (compliance, error_budget_remaining) = budget(p.window);
                SloHistoryPoint {
                    at: format_ms(p.at_ms),
                    at_ms: p.at_ms,
                    bad: p.window.bad,
                    burn_rates: RULES
                        .iter()
                        .zip(p.windows.chunks(2))
                        .map(|(r, c)| RuleBurn {
                            long: burn_rate(c[0], objective),
                            short: burn_rate(c[1], objective),
                            windows: r.windows,
                        })
                        .collect(),
                    compliance,
                    error_budget_remaining,
                    good: p.window.good,
                }
            })
            .collect(),
        step_seconds: step / 1000,
        window_seconds: d.window_ms / 1000,
    };
    Ok(Json(answer))
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
