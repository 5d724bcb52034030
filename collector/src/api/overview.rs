//! `GET /api/v1/overview?window=24h`: what the queue-latency view needs in one call: jobs by state, waiting
//! jobs by segment, the oldest wait per pool and priority, time-to-first-step percentiles per pool and priority
//! for jobs that started in the window, and p50/p90 over time per pool kind (24 buckets across the window).

use super::extract::Params;
use super::{ApiError, ApiState};
use crate::compare::stats::percentile;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use startline_proto::labels::Label;
use std::collections::BTreeMap;

/// The overview.
pub async fn overview(State(s): State<ApiState>, Params(q): Params) -> Result<Json<Value>, ApiError> {
    let mut window_ms: i64 = 86_400_000;
    for (k, v) in &q {
        match k.as_str() {
            "window" => {
                window_ms = humantime::parse_duration(v)
                    .ok()
                    .filter(|d| d.as_secs() >= 3600 && d.as_secs() <= 400 * 86_400)
                    .map(|d| d.as_millis() as i64)
                    .ok_or_else(|| {
                        ApiError::bad_request(format!("window: {v:?} must be a duration between 1h and 400d"))
                    })?
            }
            other => return Err(ApiError::bad_request(format!("{other}: unknown query parameter"))),
        }
    }
    let now = s.clock.now_ms();
    let from = now - window_ms;
    let step = (window_ms / 24).max(60_000);
    type Scan = (
        BTreeMap<&'static str, u64>,
        BTreeMap<(String, String, String, String), Vec<f64>>,
        BTreeMap<(String, i64), Vec<f64>>,
    );
    let index = s.index.clone();
    // A full scan: off the async workers, in chunks under short read locks.
    let (states, by_pool, series): Scan = tokio::task::spawn_blocking(move || {
        let mut states: BTreeMap<&'static str, u64> = BTreeMap::new();
        let mut by_pool: BTreeMap<(String, String, String, String), Vec<f64>> = BTreeMap::new();
        let mut series: BTreeMap<(String, i64), Vec<f64>> = BTreeMap::new();
        index.for_each_job(super::compare::SCAN_CHUNK, |_, job| {
            let t = job.timeline;
            *states.entry(t.state.label()).or_default() += 1;
            let (Some(a), Some(f), Some(ttfs)) = (t.attrs.as_ref(), t.first_step_at, t.time_to_first_step_ms()) else {
                return;
            };
            if f < from || f > now {
                return;
            }
            let secs = ttfs as f64 / 1000.0;
            by_pool
                .entry((
                    a.pool_kind.label().to_string(),
                    a.provider.clone(),
                    a.pool.clone(),
                    a.priority.label().to_string(),
                ))
                .or_default()
                .push(secs);
            let bucket = from + ((f - from) / step) * step;
            series.entry((a.pool_kind.label().to_string(), bucket)).or_default().push(secs);
        });
        (states, by_pool, series)
    })
    .await
    .map_err(ApiError::unavailable)?;
    let idx = s.index.read();
    let mut waiting: BTreeMap<String, i64> = BTreeMap::new();
    for ((_, seg), n) in &idx.gauges.waiting {
        *waiting.entry(seg.clone()).or_default() += n;
    }
    let oldest: Vec<Value> = {
        let mut v: Vec<_> = idx.gauges.oldest_ages(now);
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        v.into_iter()
            .map(|((kind, provider, pool, priority), age)| {
                json!({"pool_kind": kind, "provider": &*provider, "pool": &*pool, "priority": priority, "seconds": age})
            })
            .collect()
    };
    drop(idx);
    let pools: Vec<Value> = by_pool
        .into_iter()
        .map(|((kind, provider, pool, priority), mut xs)| {
            xs.sort_by(f64::total_cmp);
            json!({
                "pool_kind": kind, "provider": provider, "pool": pool, "priority": priority, "started": xs.len(),
                "p50": percentile(&xs, 0.5), "p90": percentile(&xs, 0.9), "p99": percentile(&xs, 0.99),
            })
        })
        .collect();
    let series: Vec<Value> = series
        .into_iter()
        .map(|((kind, at), mut xs)| {
            xs.sort_by(f64::total_cmp);
            json!({"pool_kind": kind, "at": super::format_ms(at), "at_ms": at, "started": xs.len(), "p50": percentile(&xs, 0.5), "p90": percentile(&xs, 0.9)})
        })
        .collect();
    Ok(Json(json!({
        "as_of": super::format_ms(now),
        "window_seconds": window_ms / 1000,
        "bucket_seconds": step / 1000,
        "jobs_by_state": states,
        "waiting_by_segment": waiting,
        "waiting_total": waiting.values().sum::<i64>(),
        "oldest_wait": oldest,
        "ttfs_by_pool": pools,
        "ttfs_series": series,
    })))
}
