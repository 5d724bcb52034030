//! `GET /api/v1/chains?window=30d&state=open|complete|all` and `GET /api/v1/chains/{chain_id}`: jobs that share a
//! `chain_id` as one timeline ([`crate::job::chain`]): time to artifact, gaps, stages, critical path.

use super::extract::{ApiPath, Params};
use super::types::{
    ChainBurn, ChainDetail, ChainGap, ChainKind, ChainList, ChainMember, ChainSloStatus, ChainStage, ChainStep,
    ChainSummary, ChainVerdict,
};
use super::{ApiError, ApiState};
use crate::job::chain::{derive, Chain, Member};
use crate::slo::chain::{counts, verdict, Verdict};
use crate::time::format_ms;
use axum::extract::State;
use axum::Json;
use std::collections::BTreeMap;

/// Chains listed at most.
const MAX_LISTED: usize = 500;

fn secs(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

/// Every chain's members (one scan).
async fn members(s: &ApiState) -> Result<BTreeMap<String, Vec<Member>>, ApiError> {
    let index = s.index.clone();
    s.reads.run(move || crate::index::chains::members(&index)).await
}

fn verdicts(s: &ApiState, id: &str, c: &Chain, now: i64) -> Vec<ChainVerdict> {
    s.chain_slos
        .iter()
        .filter(|d| d.selector.matches(id, &c.kind(), c.team()))
        .map(|d| ChainVerdict {
            deadline: format_ms(c.start_ms + d.threshold_ms),
            slo: d.name.clone(),
            verdict: verdict(d, c, now).label().to_string(),
        })
        .collect()
}

/// Every chain SLO's status over every chain.
fn statuses(s: &ApiState, all: &BTreeMap<String, Chain>, now: i64) -> Vec<ChainSloStatus> {
    s.chain_slos
        .iter()
        .map(|d| {
            let vs: Vec<Verdict> = all
                .iter()
                .filter(|(id, c)| d.selector.matches(id, &c.kind(), c.team()))
                .map(|(_, c)| verdict(d, c, now))
                .collect();
            let c = counts(&vs, now, d.window_ms);
            let allowed = (1.0 - d.objective) * c.total() as f64;
            ChainSloStatus {
                bad: c.bad,
                burn_rates: crate::alert::burn::RULES
                    .iter()
                    .map(|r| {
                        let (long, short) = (counts(&vs, now, r.long_ms), counts(&vs, now, r.short_ms));
                        ChainBurn {
                            factor: r.factor(d.window_ms),
                            long_burn_rate: crate::slo::burn_rate(long, d.objective),
                            long_decided: long.total(),
                            severity: r.severity.to_string(),
                            short_burn_rate: crate::slo::burn_rate(short, d.objective),
                            windows: r.windows.to_string(),
                        }
                    })
                    .collect(),
                compliance: (c.total() > 0).then(|| c.good as f64 / c.total() as f64),
                description: d.description.clone(),
                error_budget_remaining: (c.total() > 0).then(|| 1.0 - c.bad as f64 / allowed),
                good: c.good,
                late_open: vs.iter().filter(|v| matches!(v, Verdict::Bad { open: true, .. })).count() as u64,
                name: d.name.clone(),
                objective: d.objective,
                page_on_breach: d.page_on_breach,
                pending: vs.iter().filter(|v| matches!(v, Verdict::Pending { .. })).count() as u64,
                threshold_seconds: d.threshold_ms / 1000,
                window_seconds: d.window_ms / 1000,
            }
        })
        .collect()
}

fn summary(s: &ApiState, id: &str, c: &Chain, now: i64) -> ChainSummary {
    ChainSummary {
        slos: verdicts(s, id, c, now),
        chain_id: id.to_string(),
        complete: c.complete,
        ended_at: c.complete.then(|| format_ms(c.end_ms)),
        gap_seconds: secs(c.gap_ms()),
        jobs: c.members.len() as u64,
        kind: c.kind(),
        span_seconds: secs(c.span_ms()),
        started_at: format_ms(c.start_ms),
    }
}

/// Nearest-rank percentile of sorted values.
fn rank(sorted: &[f64], q: f64) -> Option<f64> {
    let n = sorted.len();
    (n > 0).then(|| sorted[((q * n as f64).ceil() as usize).clamp(1, n) - 1])
}

/// `GET /api/v1/chains`.
pub async fn list(State(s): State<ApiState>, Params(q): Params) -> Result<Json<ChainList>, ApiError> {
    let mut window_ms: i64 = 30 * 86_400_000;
    let mut want: Option<bool> = None;
    for (k, v) in &q {
        match (k.as_str(), v.as_str()) {
            ("window", v) => window_ms = super::extract::window_param(v)?,
            ("state", "open") => want = Some(false),
            ("state", "complete") => want = Some(true),
            ("state", "all") => want = None,
            ("state", other) => {
                return Err(ApiError::bad_request(format!("state: {other:?} is not one of open, complete, all")))
            }
            (other, _) => return Err(ApiError::bad_request(format!("{other}: unknown query parameter"))),
        }
    }
    let now = s.clock.now_ms();
    let from = now - window_ms;
    let all: BTreeMap<String, Chain> =
        members(&s).await?.into_iter().filter_map(|(id, m)| derive(m, &s.final_stages, now).map(|c| (id, c))).collect();
    let slos = statuses(&s, &all, now);
    let mut chains: Vec<(String, Chain)> =
        all.into_iter().filter(|(_, c)| c.start_ms >= from && want.is_none_or(|w| c.complete == w)).collect();
    let mut kinds: BTreeMap<String, (Vec<f64>, u64)> = BTreeMap::new();
    for (_, c) in &chains {
        let k = kinds.entry(c.kind()).or_default();
        if c.complete {
            k.0.push(secs(c.span_ms()));
        } else {
            k.1 += 1;
        }
    }
    let by_kind = kinds
        .into_iter()
        .map(|(kind, (mut spans, open))| {
            spans.sort_by(f64::total_cmp);
            ChainKind {
                complete: spans.len() as u64,
                kind,
                max: spans.last().copied(),
                open,
                p50: rank(&spans, 0.5),
                p90: rank(&spans, 0.9),
                p99: rank(&spans, 0.99),
            }
        })
        .collect();
    let total = chains.len() as u64;
    chains.sort_by(|a, b| b.1.start_ms.cmp(&a.1.start_ms).then_with(|| a.0.cmp(&b.0)));
    chains.truncate(MAX_LISTED);
    Ok(Json(ChainList {
        as_of: format_ms(now),
        by_kind,
        chains: chains.iter().map(|(id, c)| summary(&s, id, c, now)).collect(),
        final_stages: s.final_stages.to_vec(),
        slos,
        total,
        window_seconds: window_ms / 1000,
    }))
}

/// `GET /api/v1/chains/{chain_id}`.
pub async fn detail(State(s): State<ApiState>, ApiPath(id): ApiPath<String>) -> Result<Json<ChainDetail>, ApiError> {
    let now = s.clock.now_ms();
    let mut all = members(&s).await?;
    let c = all
        .remove(&id)
        .and_then(|m| derive(m, &s.final_stages, now))
        .ok_or_else(|| ApiError::not_found(format!("chain {id:?} is not known")))?;
    let mut stages: Vec<ChainStage> = Vec::new();
    for m in &c.members {
        let end = m.done_at.unwrap_or(now).max(m.submitted_at);
        let started = m.first_step_at.map_or(end, |f| f.clamp(m.submitted_at, end));
        let st = match stages.iter_mut().find(|s| s.stage == m.stage) {
            Some(st) => st,
            None => {
                stages.push(ChainStage {
                    first_submitted_at: format_ms(m.submitted_at),
                    jobs: 0,
                    last_ended_at: None,
                    run_seconds: 0.0,
                    stage: m.stage.clone(),
                    wait_seconds: 0.0,
                });
                let last = stages.len() - 1;
                &mut stages[last]
            }
        };
        st.jobs += 1;
        st.wait_seconds += secs(started - m.submitted_at);
        st.run_seconds += secs(end - started);
    }
    for st in &mut stages {
        let ends: Vec<Option<i64>> = c.members.iter().filter(|m| m.stage == st.stage).map(|m| m.done_at).collect();
        if ends.iter().all(Option::is_some) {
            st.last_ended_at = ends.into_iter().flatten().max().map(format_ms);
        }
    }
    Ok(Json(ChainDetail {
        as_of: format_ms(now),
        critical_path: c
            .critical_path
            .iter()
            .map(|p| ChainStep {
                gap_before_seconds: secs(p.gap_before_ms),
                job_id: c.members[p.member].job_id.clone(),
                run_seconds: secs(p.run_ms),
                stage: c.members[p.member].stage.clone(),
                wait_seconds: secs(p.wait_ms),
            })
            .collect(),
        gaps: c
            .gaps
            .iter()
            .map(|(a, b)| ChainGap { from: format_ms(*a), seconds: secs(b - a), to: format_ms(*b) })
            .collect(),
        members: c
            .members
            .iter()
            .map(|m| ChainMember {
                done_at: m.done_at.map(format_ms),
                first_step_at: m.first_step_at.map(format_ms),
                job_id: m.job_id.clone(),
                stage: m.stage.clone(),
                submitted_at: format_ms(m.submitted_at),
                succeeded: m.succeeded,
            })
            .collect(),
        stages,
        summary: summary(&s, &id, &c, now),
    }))
}
