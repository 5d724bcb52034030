//! `GET /api/v1/nodes?window=7d&pool=&name=&suspect=true&offset=0&limit=100` and `GET /api/v1/nodes/{node}`: how
//! the jobs placed on each node fared, its GPU health, and whether it stands out from its pool
//! ([`crate::index::nodes::report`], the rule in [`crate::job::nodes`]).
//!
//! A managed pool (SageMaker, Vertex AI, Azure ML) places each job on fresh instances, so a week holds thousands
//! of nodes with one placement each: the listing sums them up per pool (`pools`, `grouped`) and lists one only
//! when it is suspect or its name matches `name`. Dedicated nodes are listed, paged, suspects first.

use super::extract::{quote, window_param, ApiPath, Params};
use super::types::{NodeDetail, NodeHealthWindow, NodeIncident, NodeList, NodePool, NodeReading, NodeRow, NodeRule};
use super::{ApiError, ApiState};
use crate::index::nodes::{report, NodeLine, NodeReport};
use crate::job::PlacementEnd;
use crate::time::format_ms;
use axum::extract::State;
use axum::Json;
use startline_proto::labels::Label;
use startline_proto::pb::PoolKind;
use std::collections::{BTreeMap, HashMap};

/// Nodes a page of `GET /api/v1/nodes` holds when `limit` is not given.
const PAGE: usize = 100;
/// The largest `limit`.
const MAX_PAGE: usize = 1000;
/// Incidents shown per node at most.
const MAX_INCIDENTS: usize = 200;

fn median_s(v: &[i64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_unstable();
    let n = v.len();
    (n > 0).then(|| v[n.div_ceil(2) - 1] as f64 / 1000.0)
}

fn row(n: &NodeLine) -> NodeRow {
    let s = &n.stats;
    let v = &n.verdict;
    NodeRow {
        bad: s.bad(),
        bad_rate: (s.placements > 0).then(|| s.bad() as f64 / s.placements as f64),
        cancelled: s.ended(PlacementEnd::Cancelled),
        failed: s.ended(PlacementEnd::Failed),
        health: n.health.map(|h| NodeHealthWindow {
            ecc_corrected: h.ecc_corrected,
            ecc_uncorrected: h.ecc_uncorrected,
            last_report: format_ms(h.last_report_ms),
            xid_errors: h.xid_errors,
        }),
        lost: s.ended(PlacementEnd::Lost),
        node: n.node.to_string(),
        open: s.ended(PlacementEnd::Open),
        p_value: v.p_value,
        placements: s.placements,
        pool: n.pool.clone(),
        pool_kind: n.kind.label(),
        pool_rate: v.pool_rate,
        preempted: s.ended(PlacementEnd::Preempted),
        reasons: v.reasons.iter().map(|r| r.to_string()).collect(),
        requeued: s.ended(PlacementEnd::Requeued),
        started: s.started,
        startup_p50_seconds: median_s(&s.startup_ms),
        succeeded: s.ended(PlacementEnd::Succeeded),
        suspect: !v.reasons.is_empty(),
        threshold: v.threshold,
        timed_out: s.ended(PlacementEnd::TimedOut),
        time_to_first_step_p50_seconds: median_s(&s.ttfs_ms),
    }
}

/// The rule in force, in words.
pub fn rule(s: &ApiState) -> NodeRule {
    let r = s.nodes.rule;
    NodeRule {
        alpha: r.alpha,
        ecc_corrected_threshold: r.ecc_corrected_threshold,
        min_bad: r.min_bad,
        statement: format!(
            "A node is suspect when at least {} of its placements failed or were lost and P[Binom(placements, \
             pool rate) >= bad] <= {} / nodes in its pool (pool rate: the rest of the pool's, smoothed as \
             (bad + 1) / (placements + 2)); or when its GPUs reported an uncorrectable ECC error, an XID error, or \
             at least {} correctable ECC errors in the window.",
            r.min_bad, r.alpha, r.ecc_corrected_threshold
        ),
    }
}

async fn build(s: &ApiState, window_ms: i64) -> Result<NodeReport, ApiError> {
    let (index, health, rule) = (s.index.clone(), s.node_health.clone(), s.nodes.rule);
    let now = s.clock.now_ms();
    s.reads.run(move || report(&index, &health, now - window_ms, now, &rule)).await
}

/// What `GET /api/v1/nodes` was asked for.
#[derive(Debug, Clone, PartialEq)]
struct ListQuery {
    window_ms: i64,
    /// Only this pool.
    pool: Option<String>,
    /// Only nodes whose name contains this, lower-cased (also lists grouped instances); `None` when not given or
    /// empty.
    name: Option<String>,
    only_suspect: bool,
    offset: usize,
    limit: usize,
}

fn list_query(q: &HashMap<String, String>, default_window_ms: i64) -> Result<ListQuery, ApiError> {
    let mut l =
        ListQuery { window_ms: default_window_ms, pool: None, name: None, only_suspect: false, offset: 0, limit: PAGE };
    for (k, v) in q {
        match k.as_str() {
            "window" => l.window_ms = window_param(v)?,
            "pool" => l.pool = Some(v.clone()),
            "name" => l.name = (!v.is_empty()).then(|| v.to_lowercase()),
            "suspect" => {
                l.only_suspect = match v.as_str() {
                    "true" => true,
                    "false" => false,
                    _ => return Err(ApiError::bad_request(format!("suspect: {v:?} must be true or false"))),
                }
            }
            "offset" => {
                l.offset = v.parse().map_err(|_| {
                    ApiError::bad_request(format!("offset: {} is not a whole number (0 or more)", quote(v)))
                })?
            }
            "limit" => {
                l.limit = v.parse().ok().filter(|n| (1..=MAX_PAGE).contains(n)).ok_or_else(|| {
                    ApiError::bad_request(format!("limit: {} is not a whole number from 1 to {MAX_PAGE}", quote(v)))
                })?
            }
            other => return Err(ApiError::bad_request(format!("{other}: unknown query parameter"))),
        }
    }
    Ok(l)
}

/// Whether a node is one instance of a managed pool: fresh for each job, so not worth a row of its own.
fn grouped(n: &NodeLine) -> bool {
    n.kind == PoolKind::Managed && !n.pool.is_empty()
}

fn suspect(n: &NodeLine) -> bool {
    !n.verdict.reasons.is_empty()
}

/// The answer to `q` over `rep`: per-pool rows, the page of listed nodes, the nodes matched, the grouped
/// instances not listed by default.
struct Selection<'a> {
    pools: Vec<NodePool>,
    page: Vec<&'a NodeLine>,
    total: usize,
    grouped_instances: u64,
}

fn rate(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

fn select<'a>(rep: &'a NodeReport, q: &ListQuery) -> Selection<'a> {
    let in_pool = |n: &NodeLine| q.pool.as_ref().is_none_or(|p| *p == n.pool);
    let mut pools: BTreeMap<&str, NodePool> = BTreeMap::new();
    let mut grouped_instances = 0;
    for n in rep.nodes.iter().filter(|n| !n.pool.is_empty() && in_pool(n)) {
        let p = pools.entry(&n.pool).or_insert_with(|| NodePool {
            bad_rate: None,
            bad: 0,
            failed: 0,
            failed_rate: None,
            grouped: grouped(n),
            kind: n.kind.label(),
            lost: 0,
            lost_rate: None,
            nodes: 0,
            placements: 0,
            pool: n.pool.clone(),
            suspects: 0,
        });
        p.nodes += 1;
        p.bad += n.stats.bad();
        p.failed += n.stats.ended(PlacementEnd::Failed);
        p.lost += n.stats.ended(PlacementEnd::Lost);
        p.placements += n.stats.placements;
        p.suspects += u64::from(suspect(n));
        grouped_instances += u64::from(grouped(n) && !suspect(n));
    }
    let pools = pools
        .into_values()
        .map(|mut p| {
            p.bad_rate = rate(p.bad, p.placements);
            p.failed_rate = rate(p.failed, p.placements);
            p.lost_rate = rate(p.lost, p.placements);
            p
        })
        .collect();
    let mut listed: Vec<&NodeLine> = rep
        .nodes
        .iter()
        .filter(|n| in_pool(n))
        .filter(|n| !q.only_suspect || suspect(n))
        .filter(|n| match &q.name {
            Some(want) => n.node.to_lowercase().contains(want.as_str()),
            None => !grouped(n) || suspect(n),
        })
        .collect();
    listed.sort_by(|a, b| {
        suspect(b)
            .cmp(&suspect(a))
            .then(a.verdict.p_value.total_cmp(&b.verdict.p_value))
            .then_with(|| (&a.pool, &a.node).cmp(&(&b.pool, &b.node)))
    });
    let total = listed.len();
    let page = listed.into_iter().skip(q.offset).take(q.limit).collect();
    Selection { pools, page, total, grouped_instances }
}

/// `GET /api/v1/nodes`.
pub async fn list(State(s): State<ApiState>, Params(q): Params) -> Result<Json<NodeList>, ApiError> {
    let q = list_query(&q, s.nodes.window_ms)?;
    let rep = build(&s, q.window_ms).await?;
    let sel = select(&rep, &q);
    let end = q.offset.saturating_add(q.limit);
    Ok(Json(NodeList {
        as_of: format_ms(rep.to_ms),
        grouped_instances: sel.grouped_instances,
        limit: q.limit as u64,
        next_offset: (end < sel.total).then_some(end as u64),
        nodes: sel.page.into_iter().map(row).collect(),
        offset: q.offset as u64,
        pools: sel.pools,
        rule: rule(&s),
        total: sel.total as u64,
        window_seconds: q.window_ms / 1000,
    }))
}

/// `GET /api/v1/nodes/{node}`.
pub async fn detail(
    State(s): State<ApiState>,
    ApiPath(node): ApiPath<String>,
    Params(q): Params,
) -> Result<Json<NodeDetail>, ApiError> {
    let mut window_ms = s.nodes.window_ms;
    for (k, v) in &q {
        match k.as_str() {
            "window" => window_ms = window_param(v)?,
            other => return Err(ApiError::bad_request(format!("{other}: unknown query parameter"))),
        }
    }
    let rep = build(&s, window_ms).await?;
    let lines: Vec<&NodeLine> = rep.nodes.iter().filter(|n| *n.node == *node).collect();
    let latest = s.node_health.latest(&node);
    if lines.is_empty() && latest.is_none() {
        return Err(ApiError::not_found(format!("node {node:?}: no placements in the window and no health readings")));
    }
    let mut incidents: Vec<NodeIncident> = lines
        .iter()
        .flat_map(|n| {
            n.stats.incidents.iter().map(|i| NodeIncident {
                at: format_ms(i.at_ms),
                end: i.end.label().to_string(),
                job_id: i.job_id.to_string(),
                pool: n.pool.clone(),
            })
        })
        .collect();
    incidents.sort_by(|a, b| b.at.cmp(&a.at).then_with(|| a.job_id.cmp(&b.job_id)));
    incidents.truncate(MAX_INCIDENTS);
    Ok(Json(NodeDetail {
        as_of: format_ms(rep.to_ms),
        incidents,
        latest_health: latest.map(|r| NodeReading {
            at: format_ms(r.at_ms),
            ecc_corrected_total: r.ecc_corrected,
            ecc_uncorrected_total: r.ecc_uncorrected,
            gpus: r.gpus,
            xid_errors: r.xid_errors,
        }),
        node: node.clone(),
        rows: lines.into_iter().map(row).collect(),
        window_seconds: window_ms / 1000,
    }))
}

#[cfg(test)]
mod tests;
