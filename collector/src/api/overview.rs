//! `GET /api/v1/overview?window=24h`: what the queue-latency view needs in one call: jobs by state, waiting
//! jobs by segment, the oldest wait per pool and priority, time-to-first-step percentiles per pool and priority
//! for jobs that started in the window, and p50/p90 over time per pool kind (24 buckets across the window).

use super::extract::Params;
use super::types::{OldestWait, Overview, PoolTtfs, SeriesPoint};
use super::{ApiError, ApiState};
use crate::compare::stats::percentile;
use crate::job::{JobAttrs, JobState};
use crate::time::format_ms;
use axum::extract::State;
use axum::Json;
use startline_proto::labels::Label;
use std::collections::BTreeMap;

/// A pool and priority: `(pool_kind, provider, pool, priority)`.
type PoolKey = (String, String, String, String);

/// Times to first step of the jobs that started in the window, by pool and over time.
struct Started {
    /// Per pool and priority, in first-seen order.
    groups: Vec<(PoolKey, Vec<f64>)>,
    by_key: std::collections::HashMap<PoolKey, usize>,
    /// Folded jobs' attribute sets (by dictionary number) to their group: one lookup per set, not per job.
    by_attrs: std::collections::HashMap<u32, usize>,
    series: BTreeMap<(&'static str, i64), Vec<f64>>,
    from: i64,
    now: i64,
    step: i64,
}

impl Started {
    fn new(from: i64, now: i64, step: i64) -> Started {
        Started {
            groups: Vec::new(),
            by_key: Default::default(),
            by_attrs: Default::default(),
            series: BTreeMap::new(),
            from,
            now,
            step,
        }
    }

    /// A job of attributes `a` (dictionary number `attrs_id` for a folded job) that reached its first step at
    /// `f` after `ttfs` ms.
    fn add(&mut self, a: &JobAttrs, attrs_id: Option<u32>, f: i64, ttfs: i64) {
        if f < self.from || f > self.now {
            return;
        }
        let secs = ttfs as f64 / 1000.0;
        let memo = attrs_id.and_then(|n| self.by_attrs.get(&n).copied());
        let group = match memo {
            Some(g) => g,
            None => {
                let key = (
                    a.pool_kind.label().to_string(),
                    a.provider.clone(),
                    a.pool.clone(),
                    a.priority.label().to_string(),
                );
                let g = match self.by_key.get(&key) {
                    Some(g) => *g,
                    None => {
                        self.by_key.insert(key.clone(), self.groups.len());
                        self.groups.push((key, Vec::new()));
                        self.groups.len() - 1
                    }
                };
                if let Some(n) = attrs_id {
                    self.by_attrs.insert(n, g);
                }
                g
            }
        };
        self.groups[group].1.push(secs);
        let bucket = self.from + ((f - self.from) / self.step) * self.step;
        self.series.entry((a.pool_kind.label(), bucket)).or_default().push(secs);
    }
}

/// The overview.
/// The end time budget deletions reached, if any (see `index::Deleted`).
pub(super) fn deleted_through(s: &ApiState) -> Option<String> {
    let ms = s.index.read().deleted.over_budget_through_ms;
    (ms > 0).then(|| format_ms(ms))
}

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
    let (states, by_pool, series): Scan = s
        .reads
        .run(move || {
            let mut states: BTreeMap<&'static str, u64> = BTreeMap::new();
            let mut acc = Started::new(from, now, step);
            // A folded job is done, and its row holds its attributes and times: its timeline is never filled in.
            let mut done_folded = 0u64;
            let (states_ref, acc_ref) = (&mut states, std::cell::RefCell::new(&mut acc));
            // Counts and sorted samples: the order of the walk does not matter.
            index.scan_unordered(
                super::compare::SCAN_CHUNK,
                false,
                |_, r| {
                    done_folded += 1;
                    if let (Some(f), Some(ttfs)) = (r.row.first_step_at(), r.row.time_to_first_step_ms()) {
                        acc_ref.borrow_mut().add(r.attrs, Some(r.row.attrs), f, ttfs);
                    }
                    false
                },
                |_, job| {
                    let t = job.timeline;
                    *states_ref.entry(t.state.label()).or_default() += 1;
                    if let (Some(a), Some(f), Some(ttfs)) =
                        (t.attrs.as_ref(), t.first_step_at, t.time_to_first_step_ms())
                    {
                        acc_ref.borrow_mut().add(a, None, f, ttfs);
                    }
                },
            );
            if done_folded > 0 {
                *states.entry(JobState::Done.label()).or_default() += done_folded;
            }
            let by_pool: BTreeMap<PoolKey, Vec<f64>> = acc.groups.into_iter().collect();
            let series: BTreeMap<(String, i64), Vec<f64>> =
                acc.series.into_iter().map(|((kind, at), xs)| ((kind.to_string(), at), xs)).collect();
            (states, by_pool, series)
        })
        .await?;
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
        history_deleted_through: deleted_through(&s),
        jobs_by_state: states,
        oldest_wait: oldest,
        ttfs_by_pool: pools,
        ttfs_series: series,
        waiting_total: waiting.values().sum::<i64>(),
        waiting_by_segment: waiting,
        window_seconds: window_ms / 1000,
    }))
}
