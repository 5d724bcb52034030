//! `GET /api/v1/overview?window=24h`: what the queue-latency view needs in one call: jobs by state, waiting
//! jobs by segment, the oldest wait per pool and priority, time-to-first-step percentiles per pool and priority
//! for jobs that started in the window, and p50/p90 over time per pool kind (24 buckets across the window).

use super::extract::Params;
use super::types::{OldestWait, Overview, PoolTtfs, SeriesPoint};
use super::{ApiError, ApiState};
use crate::compare::stats::percentile;
use crate::time::format_ms;
use axum::extract::State;
use axum::Json;
use startline_proto::labels::Label;
use std::collections::BTreeMap;

/// The overview.
pub async fn overview(State(s): State<ApiState>, Params(q): Params) -> Result<Json<Overview>, ApiError> {
    let mut window_ms: i64 = 86_400_000;
    for (k, v) in &q {
        match k.as_str() {
            "window" => window_ms = super::extract::window_param(v)?,
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
    for ((.., seg), n) in &idx.gauges.waiting {
        *waiting.entry(seg.clone()).or_default() += n;
    }
    let oldest: Vec<OldestWait> = {
        let mut v: Vec<_> = idx.gauges.oldest_ages(now);
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        v.into_iter()
            .map(|((pool_kind, provider, pool, priority), seconds)| OldestWait {
                pool: pool.to_string(),
                pool_kind,
                priority,
                provider: provider.to_string(),
                seconds,
            })
            .collect()
    };
    drop(idx);
    let pools: Vec<PoolTtfs> = by_pool
        .into_iter()
        .map(|((pool_kind, provider, pool, priority), mut xs)| {
            xs.sort_by(f64::total_cmp);
            PoolTtfs {
                p50: percentile(&xs, 0.5),
                p90: percentile(&xs, 0.9),
                p99: percentile(&xs, 0.99),
                pool,
                pool_kind,
                priority,
                provider,
                started: xs.len(),
            }
        })
        .collect();
    let series: Vec<SeriesPoint> = series
        .into_iter()
        .map(|((pool_kind, at), mut xs)| {
            xs.sort_by(f64::total_cmp);
            SeriesPoint {
                at: format_ms(at),
                at_ms: at,
                p50: percentile(&xs, 0.5),
                p90: percentile(&xs, 0.9),
                pool_kind,
                started: xs.len(),
            }
        })
        .collect();
    Ok(Json(Overview {
        as_of: format_ms(now),
        bucket_seconds: step / 1000,
        jobs_by_state: states,
        oldest_wait: oldest,
        ttfs_by_pool: pools,
        ttfs_series: series,
        waiting_total: waiting.values().sum::<i64>(),
        waiting_by_segment: waiting,
        window_seconds: window_ms / 1000,
    }))
}
