//! `GET /api/v1/compare?left=pool_kind=managed&right=pool_kind=dedicated&by=gpu_class&window=30d` (JSON) and
//! `GET /api/v1/compare.svg?...` (the CDF overlay). Defaults: managed vs dedicated over 30 days.

use super::extract::{groups_limit, quote, Params, GROUPS_LIMIT};
use super::{ApiError, ApiState};
use crate::compare::{self, Attr, Query, Selector};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::collections::HashMap;

/// The left side when none is given.
const DEFAULT_LEFT: &str = "pool_kind=managed";
/// The right side when none is given.
const DEFAULT_RIGHT: &str = "pool_kind=dedicated";

/// Jobs visited per read lock during a scan.
pub const SCAN_CHUNK: usize = 4096;

fn parse(s: &ApiState, q: &HashMap<String, String>) -> Result<Query, ApiError> {
    let mut left = DEFAULT_LEFT.to_string();
    let mut right = DEFAULT_RIGHT.to_string();
    let mut by = None;
    let mut window_ms = 30 * 86_400_000;
    for (k, v) in q {
        match k.as_str() {
            // The groups shown: see `json`.
            "limit" => {
                groups_limit(v)?;
            }
            "left" => left = v.clone(),
            "right" => right = v.clone(),
            "by" if v.is_empty() => by = None,
            "by" => {
                by = Some(Attr::parse(v).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "by: {} is not one of pool_kind, provider, pool, priority, gpu_class, region",
                        quote(v)
                    ))
                })?)
            }
            "window" => {
                window_ms = humantime::parse_duration(v)
                    .ok()
                    .filter(|d| d.as_secs() >= 60 && d.as_secs() <= 400 * 86_400)
                    .map(|d| d.as_millis() as i64)
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "window: {} must be a duration between 1m and 400d, like \"30d\"",
                            quote(v)
                        ))
                    })?
            }
            other => return Err(ApiError::bad_request(format!("{}: unknown query parameter", quote(other)))),
        }
    }
    Ok(Query {
        left: Selector::parse(&left).map_err(|e| ApiError::bad_request(format!("left: {e}")))?,
        right: Selector::parse(&right).map_err(|e| ApiError::bad_request(format!("right: {e}")))?,
        by,
        window_ms,
        now_ms: s.clock.now_ms(),
        cost: s.cost.configured().then(|| s.cost.clone()),
    })
}

/// The comparison as JSON: `all` and at most `limit` groups (default 100, at most 1000), those with the most jobs.
pub async fn json(State(s): State<ApiState>, Params(q): Params) -> Result<Json<compare::Report>, ApiError> {
    let query = parse(&s, &q)?;
    let limit = q.get("limit").map(|v| groups_limit(v)).transpose()?.unwrap_or(GROUPS_LIMIT);
    let slos = s.index.read().slo.defs().to_vec();
    let index = s.index.clone();
    // A full scan: off the async workers, in chunks under short read locks.
    let report = s
        .reads
        .run(move || {
            let c = std::cell::RefCell::new(compare::Collector::new(query));
            // Sorted samples and counts (costs summed in sorted order): the order of the walk does not matter.
            index.scan_unordered(
                SCAN_CHUNK,
                true,
                |_, f| c.borrow().wants(f.attrs, f.row.submitted_at()),
                |_, r| c.borrow_mut().add(r),
            );
            let mut report = c.into_inner().finish(&slos);
            report.keep_largest_groups(limit);
            report
        })
        .await?;
    Ok(Json(compare::Report { history_deleted_through: super::overview::deleted_through(&s), ..report }))
}

/// The CDF overlay as SVG (a chart that says so when neither side has a started job).
pub async fn svg(State(s): State<ApiState>, Params(q): Params) -> Result<Response, ApiError> {
    let query = parse(&s, &q)?;
    let index = s.index.clone();
    let samples = s
        .reads
        .run(move || {
            let c = std::cell::RefCell::new(compare::Collector::new(compare::Query { by: None, ..query }));
            index.scan_unordered(
                SCAN_CHUNK,
                true,
                |_, f| c.borrow().wants(f.attrs, f.row.submitted_at()),
                |_, r| c.borrow_mut().add(r),
            );
            c.into_inner().samples()
        })
        .await?;
    // The legend names the selectors as parsed: absent is the default, empty selects every job.
    let name = |key: &str, default: &str| match q.get(key).map(|v| v.trim()) {
        None => default.to_string(),
        Some("") => "all jobs".to_string(),
        Some(v) => v.to_string(),
    };
    let body = compare::svg::cdf_overlay(
        &name("left", DEFAULT_LEFT),
        &samples.left,
        &name("right", DEFAULT_RIGHT),
        &samples.right,
    );
    Ok(([(axum::http::header::CONTENT_TYPE, "image/svg+xml")], body).into_response())
}
