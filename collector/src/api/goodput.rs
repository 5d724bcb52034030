//! `GET /api/v1/goodput?by=team&window=30d` and `GET /api/v1/cost?window=30d` ([`crate::compare::cost`]): where
//! the GPU time of the jobs submitted in the window went
//! (waiting by segment, preparing by phase, requeue waits, checkpoint saves, lost work, failed runs, productive
//! training), overall and per value of `by`. Each job is accounted from its timeline ([`crate::job::goodput`];
//! folded jobs from their rows), open jobs up to now, and weighted by the GPUs it asked for.

use super::extract::{groups_limit, window_param, Params, GROUPS_LIMIT};
use super::types::{Cost, Goodput, GoodputGroup, KindCost, PoolCost};
use super::{ApiError, ApiState};
use crate::compare::cost::{price_pool, PoolTally};
use crate::job::goodput::{account, Account, CATEGORIES};
use crate::job::{JobAttrs, Segment};
use crate::time::format_ms;
use axum::extract::State;
use axum::Json;
use startline_proto::labels::Label;
use std::collections::BTreeMap;

/// The attributes jobs can be grouped by.
const BY: [&str; 9] =
    ["pool_kind", "provider", "pool", "priority", "gpu_class", "region", "team", "project", "chain_stage"];

fn value_of(by: &str, a: &JobAttrs) -> String {
    let v = match by {
        "pool_kind" => a.pool_kind.label().to_string(),
        "provider" => a.provider.clone(),
        "pool" => a.pool.clone(),
        "priority" => a.priority.label().to_string(),
        "gpu_class" => a.gpu_class.clone(),
        "region" => a.region.clone(),
        "team" => a.team.clone(),
        "project" => a.project.clone(),
        _ => a.chain_stage.clone(),
    };
    if v.is_empty() {
        "(none)".to_string()
    } else {
        v
    }
}

/// GPU-milliseconds summed over jobs.
#[derive(Default)]
struct Sum {
    jobs: u64,
    categories: [f64; 7],
    waiting: BTreeMap<Segment, f64>,
    preparing: BTreeMap<Segment, f64>,
}

impl Sum {
    fn add(&mut self, a: &Account) {
        let g = f64::from(a.gpus);
        self.jobs += 1;
        for (slot, ms) in self.categories.iter_mut().zip(a.by_category()) {
            *slot += ms as f64 * g;
        }
        for (s, ms) in &a.waiting {
            *self.waiting.entry(*s).or_insert(0.0) += *ms as f64 * g;
        }
        for (s, ms) in &a.preparing {
            *self.preparing.entry(*s).or_insert(0.0) += *ms as f64 * g;
        }
    }

    fn report(&self, group: Option<String>) -> GoodputGroup {
        const HOUR_MS: f64 = 3_600_000.0;
        let h = |ms: f64| ms / HOUR_MS;
        let [waiting, preparing, requeue_wait, checkpoint, lost, failed, productive] = self.categories;
        let total: f64 = self.categories.iter().sum();
        let held = preparing + checkpoint + lost + failed + productive;
        let by_segment = |m: &BTreeMap<Segment, f64>| m.iter().map(|(s, ms)| (s.label(), h(*ms))).collect();
        GoodputGroup {
            checkpoint_gpu_hours: h(checkpoint),
            failed_gpu_hours: h(failed),
            goodput: (total > 0.0).then(|| productive / total),
            group,
            jobs: self.jobs,
            lost_gpu_hours: h(lost),
            overhead_share: (held > 0.0).then(|| (held - productive) / held),
            preparing_gpu_hours: h(preparing),
            preparing_by_phase: by_segment(&self.preparing),
            productive_gpu_hours: h(productive),
            requeue_wait_gpu_hours: h(requeue_wait),
            total_gpu_hours: h(total),
            waiting_by_segment: by_segment(&self.waiting),
            waiting_gpu_hours: h(waiting),
        }
    }
}

/// `GET /api/v1/cost?window=30d`: every pool's cost, per use or amortised, with its useful GPU-hours.
pub async fn cost(State(s): State<ApiState>, Params(q): Params) -> Result<Json<Cost>, ApiError> {
    let mut window_ms: i64 = 30 * 86_400_000;
    for (k, v) in &q {
        match k.as_str() {
            "window" => window_ms = window_param(v)?,
            other => return Err(ApiError::bad_request(format!("{other}: unknown query parameter"))),
        }
    }
    let now = s.clock.now_ms();
    let from = now - window_ms;
    let (index, model) = (s.index.clone(), s.cost.clone());
    let (tallies, first_submit) = s
        .reads
        .run(move || {
            let mut pools: BTreeMap<String, PoolTally> = BTreeMap::new();
            let mut first_submit = i64::MAX;
            index.for_each_job(super::compare::SCAN_CHUNK, |_, job| {
                let t = job.timeline;
                let (Some(attrs), Some(sub)) = (t.attrs.as_ref(), t.submitted_at) else { return };
                first_submit = first_submit.min(sub);
                if sub < from || sub > now {
                    return;
                }
                if let Some(a) = account(t, now) {
                    pools.entry(attrs.pool.clone()).or_default().add(&model, attrs, &a);
                }
            });
            (pools, first_submit)
        })
        .await?;
    // Capacity is charged for the part of the window the collector has data for (a fresh install with a day of
    // history must not charge a dedicated pool for 30 days and divide by one day of useful work).
    let covered_ms = (now - from.max(first_submit.min(now))).max(0);
    let mut pools: Vec<PoolCost> = tallies
        .iter()
        .map(|(pool, t)| {
            let c = price_pool(&s.cost, pool, t, now - covered_ms, now);
            PoolCost {
                capacity_gpus: c.capacity_gpus,
                capacity_gpu_hours: c.capacity_gpu_hours,
                cost: c.cost,
                cost_per_useful_gpu_hour: c.cost_per_useful_gpu_hour,
                held_gpu_hours: t.held_gpu_hours,
                jobs: t.jobs,
                model: c.model,
                pool: pool.clone(),
                pool_kind: t.pool_kind,
                productive_gpu_hours: t.productive_gpu_hours,
                provider: t.provider.clone(),
                unpriced_jobs: t.unpriced_jobs,
                useful_utilisation: c.useful_utilisation,
                waiting_cost: c.waiting_cost,
                waiting_gpu_hours: t.waiting_gpu_hours,
            }
        })
        .collect();
    pools.sort_by(|a, b| b.cost.unwrap_or(-1.0).total_cmp(&a.cost.unwrap_or(-1.0)).then_with(|| a.pool.cmp(&b.pool)));
    let pool_kinds = ["managed", "dedicated"]
        .iter()
        .filter_map(|kind| {
            let of_kind: Vec<&PoolCost> = pools.iter().filter(|p| p.pool_kind == *kind).collect();
            if of_kind.is_empty() {
                return None;
            }
            let priced: Vec<&&PoolCost> = of_kind.iter().filter(|p| p.cost.is_some()).collect();
            let cost: f64 = priced.iter().filter_map(|p| p.cost).sum();
            let useful: f64 = priced.iter().map(|p| p.productive_gpu_hours).sum();
            Some(KindCost {
                cost,
                cost_per_useful_gpu_hour: (useful > 0.0 && !priced.is_empty()).then(|| cost / useful),
                jobs: of_kind.iter().map(|p| p.jobs).sum(),
                pool_kind: kind,
                productive_gpu_hours: useful,
                unpriced_pools: (of_kind.len() - priced.len()) as u64,
                waiting_cost: priced.iter().filter_map(|p| p.waiting_cost).sum(),
            })
        })
        .collect();
    Ok(Json(Cost {
        as_of: format_ms(now),
        configured: s.cost.configured(),
        covered_seconds: covered_ms / 1000,
        currency: s.cost.currency.clone(),
        pool_kinds,
        pools,
        window_seconds: window_ms / 1000,
    }))
}

/// `GET /api/v1/goodput?by=pool_kind&window=30d`.
pub async fn goodput(State(s): State<ApiState>, Params(q): Params) -> Result<Json<Goodput>, ApiError> {
    let mut by: &'static str = "pool_kind";
    let mut window_ms: i64 = 30 * 86_400_000;
    let mut limit = GROUPS_LIMIT;
    for (k, v) in &q {
        match k.as_str() {
            "by" => {
                by = BY
                    .iter()
                    .find(|b| *b == v)
                    .copied()
                    .ok_or_else(|| ApiError::bad_request(format!("by: {v:?} is not one of {}", BY.join(", "))))?
            }
            "window" => window_ms = window_param(v)?,
            "limit" => limit = groups_limit(v)?,
            other => return Err(ApiError::bad_request(format!("{other}: unknown query parameter"))),
        }
    }
    let now = s.clock.now_ms();
    let from = now - window_ms;
    let index = s.index.clone();
    let (total, groups) = s
        .reads
        .run(move || {
            let mut total = Sum::default();
            let mut groups: BTreeMap<String, Sum> = BTreeMap::new();
            index.for_each_job(super::compare::SCAN_CHUNK, |_, job| {
                let t = job.timeline;
                let (Some(attrs), Some(sub)) = (t.attrs.as_ref(), t.submitted_at) else { return };
                if sub < from || sub > now {
                    return;
                }
                let Some(a) = account(t, now) else { return };
                total.add(&a);
                groups.entry(value_of(by, attrs)).or_default().add(&a);
            });
            (total, groups)
        })
        .await?;
    let mut groups: Vec<GoodputGroup> = groups.into_iter().map(|(g, sum)| sum.report(Some(g))).collect();
    groups.sort_by(|a, b| b.total_gpu_hours.total_cmp(&a.total_gpu_hours).then_with(|| a.group.cmp(&b.group)));
    let groups_total = groups.len();
    groups.truncate(limit);
    Ok(Json(Goodput {
        as_of: format_ms(now),
        by,
        categories: CATEGORIES.to_vec(),
        truncated: groups.len() < groups_total,
        groups_total,
        groups,
        total: total.report(None),
        window_seconds: window_ms / 1000,
    }))
}
