//! `GET /api/v1/nodes?window=7d&pool=&suspect=true` and `GET /api/v1/nodes/{node}`: how the jobs placed on each
//! node fared, its GPU health, and whether it stands out from its pool ([`crate::index::nodes::report`], the rule
//! in [`crate::job::nodes`]).

use super::extract::{window_param, ApiPath, Params};
use super::types::{NodeDetail, NodeHealthWindow, NodeIncident, NodeList, NodePool, NodeReading, NodeRow, NodeRule};
use super::{ApiError, ApiState};
use crate::index::nodes::{report, NodeLine, NodeReport};
use crate::job::PlacementEnd;
use crate::time::format_ms;
use axum::extract::State;
use axum::Json;
use std::collections::BTreeMap;

/// Nodes listed at most.
const MAX_LISTED: usize = 1000;
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

/// `GET /api/v1/nodes`.
pub async fn list(State(s): State<ApiState>, Params(q): Params) -> Result<Json<NodeList>, ApiError> {
    let mut window_ms = s.nodes.window_ms;
    let mut pool: Option<String> = None;
    let mut only_suspect = false;
    for (k, v) in &q {
        match k.as_str() {
            "window" => window_ms = window_param(v)?,
            "pool" => pool = Some(v.clone()),
            "suspect" => {
                only_suspect = match v.as_str() {
                    "true" => true,
                    "false" => false,
                    _ => return Err(ApiError::bad_request(format!("suspect: {v:?} must be true or false"))),
                }
            }
            other => return Err(ApiError::bad_request(format!("{other}: unknown query parameter"))),
        }
    }
    let rep = build(&s, window_ms).await?;
    let mut pools: BTreeMap<&str, NodePool> = BTreeMap::new();
    for n in rep.nodes.iter().filter(|n| !n.pool.is_empty()) {
        let p = pools.entry(&n.pool).or_insert_with(|| NodePool {
            bad_rate: None,
            bad: 0,
            nodes: 0,
            placements: 0,
            pool: n.pool.clone(),
            suspects: 0,
        });
        p.nodes += 1;
        p.bad += n.stats.bad();
        p.placements += n.stats.placements;
        p.suspects += u64::from(!n.verdict.reasons.is_empty());
    }
    let pools: Vec<NodePool> = pools
        .into_values()
        .map(|mut p| {
            p.bad_rate = (p.placements > 0).then(|| p.bad as f64 / p.placements as f64);
            p
        })
        .filter(|p| pool.as_ref().is_none_or(|want| *want == p.pool))
        .collect();
    let mut rows: Vec<NodeRow> = rep
        .nodes
        .iter()
        .filter(|n| pool.as_ref().is_none_or(|p| *p == n.pool))
        .filter(|n| !only_suspect || !n.verdict.reasons.is_empty())
        .map(row)
        .collect();
    rows.sort_by(|a, b| {
        b.suspect
            .cmp(&a.suspect)
            .then(a.p_value.total_cmp(&b.p_value))
            .then_with(|| (&a.pool, &a.node).cmp(&(&b.pool, &b.node)))
    });
    let total = rows.len() as u64;
    rows.truncate(MAX_LISTED);
    Ok(Json(NodeList {
        as_of: format_ms(rep.to_ms),
        nodes: rows,
        pools,
        rule: rule(&s),
        total,
        window_seconds: window_ms / 1000,
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
