//! Expected starts of waiting jobs ([`crate::slo::eta`]) as the API writes them (`expected_start` of
//! `GET /api/v1/jobs` and `GET /api/v1/jobs/{job_id}`), and the queue-position progress a job's detail reads from
//! its stored events.

use crate::slo::eta::{Eta, QueueProgress};
use crate::time::format_ms;
use serde::Serialize;
use startline_proto::labels::Label;
use startline_proto::pb::{self, lifecycle_event::Kind};

/// When a waiting job is expected to start: `at` (the conditional median), the interval `low`..`high` (10th to
/// 90th percentile, `interval` 0.8), what it rests on, and the group of comparable jobs used.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ExpectedStart {
    /// Central estimate (RFC 3339).
    pub at: String,
    /// `queue_state`, `history`, `scheduler`, `queue_position`, `queue_state+scheduler`,
    /// `queue_state+queue_position`, `history+scheduler` or `history+queue_position`.
    pub basis: &'static str,
    /// Jobs of the group used (started, ended without starting, and waiting; with a queue state, the similar jobs),
    /// 0 without history.
    pub comparable_jobs: u64,
    /// GPUs asked for by the jobs ahead (`jobs_ahead`); `null` when the pool has no queue state.
    pub gpus_ahead: Option<u64>,
    /// The group of comparable jobs used; `null` without history. A field that is `null` was not part of it
    /// (the narrowest group with enough jobs was wider; with a queue state, the pool's similar jobs: only `pool`).
    pub group: Option<EtaGroup>,
    /// The interval's high end (90th percentile).
    pub high: String,
    /// The interval's coverage: 0.8.
    pub interval: f64,
    /// Jobs of the same pool in their first wait ranked ahead of this one (a higher priority, or the same
    /// submitted earlier); `null` when the pool has no queue state.
    pub jobs_ahead: Option<u64>,
    /// The interval's low end (10th percentile).
    pub low: String,
    /// How long the job has waited in its current wait, seconds.
    pub waited_seconds: f64,
}

/// The group of comparable jobs an expected start rests on.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct EtaGroup {
    /// GPU class (`""` for jobs that name none); `null`: any.
    pub gpu_class: Option<String>,
    /// GPU-count bucket: `0`, `1`, `2-4`, `5-8`, `9-32`, `33-128`, `129+`; `null`: any.
    pub gpus: Option<&'static str>,
    /// Pool.
    pub pool: String,
    /// Priority class; `null`: any.
    pub priority: Option<&'static str>,
    /// Wait reason (`capacity`, `quota`, ..., `unreported`); `null`: any.
    pub reason: Option<&'static str>,
}

impl ExpectedStart {
    /// As written.
    pub fn of(e: &Eta) -> ExpectedStart {
        ExpectedStart {
            at: format_ms(e.at_ms),
            basis: e.basis.label(),
            comparable_jobs: e.comparable_jobs as u64,
            group: e.group.as_ref().map(|g| EtaGroup {
                gpu_class: g.gpu_class.clone(),
                gpus: g.gpus,
                pool: g.pool.clone(),
                priority: g.priority.map(|p| p.label()),
                reason: g.reason,
            }),
            gpus_ahead: e.ahead.map(|a| a.1),
            high: format_ms(e.high_ms),
            interval: crate::slo::eta::INTERVAL,
            jobs_ahead: e.ahead.map(|a| a.0 as u64),
            low: format_ms(e.low_ms),
            waited_seconds: e.waited_ms as f64 / 1000.0,
        }
    }
}

/// The queue-position progress of the current wait from a job's stored `queued` events (in time order).
pub fn queue_progress(events: &[(u64, pb::LifecycleEvent)]) -> Option<QueueProgress> {
    let mut seen: Vec<(i64, u32)> = events
        .iter()
        .filter_map(|(_, e)| match &e.kind {
            Some(Kind::Queued(q)) => {
                Some((e.occurred_at.as_ref().map(startline_proto::time::timestamp_to_ms)?, q.queue_position?))
            }
            _ => None,
        })
        .collect();
    seen.sort_unstable();
    QueueProgress::of(seen)
}

/// `GET /api/v1/advice`: where a job would start soonest, at what cost ([`crate::compare::advice`]).
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct AdviceList {
    /// When it was computed.
    pub as_of: String,
    /// Every pool that can run the job, soonest expected start first (pools without one last).
    pub pools: Vec<PoolAdvice>,
    /// The request as read.
    pub request: AdviceRequest,
}

/// The request an advice answers.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct AdviceRequest {
    pub duration_seconds: f64,
    pub gpu_class: String,
    pub gpus: u32,
    pub priority: &'static str,
    /// The window of the pools' record (and of the jobs that say which pools can run it), seconds.
    pub window_seconds: f64,
}

/// One pool's advice.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct PoolAdvice {
    pub cost: AdviceCost,
    /// When a job submitted now would start (having waited 0); `null` when no job of the pool started.
    pub expected_start: Option<ExpectedStart>,
    /// Failed over ended jobs of the pool in the window.
    pub failure_rate: Option<f64>,
    /// Productive GPU time over all GPU time of the pool's jobs in the window (as `GET /api/v1/goodput`).
    pub goodput: Option<f64>,
    /// The pool's jobs in the window.
    pub jobs: u64,
    pub pool: String,
    pub pool_kind: &'static str,
    pub provider: String,
}

/// The run's expected cost.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct AdviceCost {
    pub currency: String,
    /// `per_use` (the first matching `[[cost.price]]`), `amortised` (`[[cost.dedicated]]`) or `unpriced`.
    pub model: &'static str,
    pub per_gpu_hour: Option<f64>,
    /// GPUs x hours x price.
    pub run: Option<f64>,
    /// Run and waiting.
    pub total: Option<f64>,
    /// The expected wait priced at the pool's rate for amortised pools (their capacity is paid while the job
    /// waits); 0 per use (waiting is not billed).
    pub waiting: Option<f64>,
}

/// `GET /api/v1/advice?gpus=8&gpu_class=h100&priority=normal&duration=12h&window=7d`.
pub async fn advice(
    axum::extract::State(s): axum::extract::State<super::ApiState>,
    super::extract::Params(q): super::extract::Params,
) -> Result<axum::Json<AdviceList>, super::ApiError> {
    use super::ApiError;
    use crate::compare::advice::{advise, Records, Request};
    let (mut gpus, mut gpu_class, mut duration_ms) = (None, None, None);
    let mut priority = pb::PriorityClass::Normal;
    let mut window_ms = 7 * 86_400_000;
    for (k, v) in &q {
        match k.as_str() {
            "gpus" => {
                gpus = Some(v.parse::<u32>().ok().filter(|n| (1..=65_536).contains(n)).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "gpus: {} is not a whole number from 1 to 65536",
                        super::extract::quote(v)
                    ))
                })?)
            }
            "gpu_class" => {
                if v.is_empty() || v.len() > 256 {
                    return Err(ApiError::bad_request("gpu_class: must be 1 to 256 bytes".to_string()));
                }
                gpu_class = Some(v.clone());
            }
            "priority" => {
                priority = pb::PriorityClass::from_label(v)
                    .filter(|p| *p != pb::PriorityClass::Unspecified)
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "priority: {} is not one of normal, urgent",
                            super::extract::quote(v)
                        ))
                    })?
            }
            "duration" => {
                duration_ms = Some(
                    humantime::parse_duration(v)
                        .ok()
                        .filter(|d| d.as_secs() >= 60 && d.as_secs() <= 90 * 86_400)
                        .map(|d| d.as_millis() as i64)
                        .ok_or_else(|| {
                            ApiError::bad_request(format!(
                                "duration: {} must be a duration between 1m and 90d",
                                super::extract::quote(v)
                            ))
                        })?,
                )
            }
            "window" => window_ms = super::extract::window_param(v)?,
            other => return Err(ApiError::bad_request(format!("{other}: unknown query parameter"))),
        }
    }
    let missing = |name: &str| ApiError::bad_request(format!("{name}: required"));
    let req = Request {
        gpus: gpus.ok_or_else(|| missing("gpus"))?,
        gpu_class: gpu_class.ok_or_else(|| missing("gpu_class"))?,
        priority,
        duration_ms: duration_ms.ok_or_else(|| missing("duration"))?,
    };
    let now = s.clock.now_ms();
    let (index, model) = (s.index.clone(), s.cost.clone());
    let class = req.gpu_class.clone();
    let r = req.clone();
    let pools = s
        .reads
        .run(move || {
            let mut records = Records::new(&class, now - window_ms, now);
            index.for_each_job(super::compare::SCAN_CHUNK, |_, job| records.add(job.timeline));
            let idx = index.read();
            advise(&r, &records, &idx.waits, &model, now)
        })
        .await?;
    let currency = s.cost.currency.clone();
    Ok(axum::Json(AdviceList {
        as_of: format_ms(now),
        pools: pools
            .into_iter()
            .map(|a| PoolAdvice {
                cost: AdviceCost {
                    currency: currency.clone(),
                    model: a.cost.model,
                    per_gpu_hour: a.cost.per_gpu_hour,
                    run: a.cost.run,
                    total: a.cost.total,
                    waiting: a.cost.waiting,
                },
                expected_start: a.expected_start.as_ref().map(ExpectedStart::of),
                failure_rate: a.failure_rate,
                goodput: a.goodput,
                jobs: a.jobs,
                pool: a.pool,
                pool_kind: a.pool_kind.label(),
                provider: a.provider,
            })
            .collect(),
        request: AdviceRequest {
            duration_seconds: req.duration_ms as f64 / 1000.0,
            gpu_class: req.gpu_class,
            gpus: req.gpus,
            priority: req.priority.label(),
            window_seconds: window_ms as f64 / 1000.0,
        },
    }))
}
