//! Placement advice (`GET /api/v1/advice`): for a job not yet submitted (GPUs, GPU class, priority, run length),
//! every pool that can run it, with its expected start, the run's expected cost and the pool's recent record.
//!
//! A pool can run the job when jobs of its GPU class ran there in the window and either one of them asked for
//! at least as many GPUs or the pool is dedicated (`[[cost.dedicated]]`) with at least that many.
//!
//! - **Expected start**: [`crate::slo::eta`] for a job of the pool, priority, GPU class and GPU count that has
//!   waited 0, without a scheduler's estimate (`null` when no group of the pool has a started job).
//! - **Cost** ([`crate::compare::cost`]): per use, the first matching price rule (matched on the pool's attributes
//!   with the request's priority and GPU class) x GPUs x hours; waiting is not billed. Amortised (a dedicated
//!   pool), its price x GPUs x hours, and the expected wait at the same rate, since its capacity is paid for
//!   while the job waits (the cost model's *cost of waiting*). `unpriced` when no rule matches.
//! - **Record**: over jobs of the pool submitted in the window, goodput (productive GPU time over all GPU time,
//!   as `GET /api/v1/goodput`) and the failure rate (failed over ended jobs).

use super::cost::CostModel;
use crate::job::goodput::account;
use crate::job::{JobAttrs, JobState, Timeline};
use crate::slo::eta::{self, Eta, GroupKey, WaitBook};
use startline_proto::pb;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What is asked.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// GPUs.
    pub gpus: u32,
    /// GPU class.
    pub gpu_class: String,
    /// Priority class.
    pub priority: pb::PriorityClass,
    /// How long it runs, ms.
    pub duration_ms: i64,
}

/// One pool's jobs of the window, as the advice needs them.
#[derive(Debug, Clone, Default)]
pub struct PoolRecord {
    /// A job's attributes (pool kind, provider, region for price rules).
    pub attrs: Option<Arc<JobAttrs>>,
    /// The most GPUs a job of the requested class asked for.
    pub max_gpus: u32,
    /// Jobs of the window.
    pub jobs: u64,
    /// Of them ended.
    pub ended: u64,
    /// Of them failed.
    pub failed: u64,
    /// GPU-ms of productive training.
    pub productive: f64,
    /// GPU-ms in all categories.
    pub total: f64,
}

/// Pool records from a scan: [`Records::add`] each job.
#[derive(Debug, Clone)]
pub struct Records {
    gpu_class: String,
    from: i64,
    now: i64,
    /// By pool.
    pub pools: BTreeMap<String, PoolRecord>,
}

impl Records {
    /// Records of jobs submitted in `[from, now]`, for a job of `gpu_class`.
    pub fn new(gpu_class: &str, from: i64, now: i64) -> Records {
        Records { gpu_class: gpu_class.to_string(), from, now, pools: BTreeMap::new() }
    }

    /// Counts a job.
    pub fn add(&mut self, t: &Timeline) {
        let (Some(a), Some(sub)) = (t.attrs.as_ref(), t.submitted_at) else { return };
        if sub < self.from || sub > self.now {
            return;
        }
        let r = self.pools.entry(a.pool.clone()).or_default();
        if r.attrs.is_none() || (a.gpu_class == self.gpu_class && r.max_gpus == 0) {
            r.attrs = Some(a.clone());
        }
        if a.gpu_class == self.gpu_class {
            r.max_gpus = r.max_gpus.max(a.gpu_count.max(1));
        }
        r.jobs += 1;
        if t.state == JobState::Done {
            r.ended += 1;
            r.failed += u64::from(t.outcome == Some(pb::Outcome::Failed));
        }
        if let Some(acc) = account(t, self.now) {
            let g = f64::from(acc.gpus);
            let cats = acc.by_category();
            r.productive += cats[6] as f64 * g;
            r.total += cats.iter().map(|x| *x as f64).sum::<f64>() * g;
        }
    }
}

/// The expected cost of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunCost {
    /// `per_use`, `amortised` or `unpriced`.
    pub model: &'static str,
    /// Price of a GPU-hour.
    pub per_gpu_hour: Option<f64>,
    /// GPUs x hours x price.
    pub run: Option<f64>,
    /// The expected wait at the pool's rate (amortised pools; 0 per use).
    pub waiting: Option<f64>,
    /// Run and waiting.
    pub total: Option<f64>,
}

/// One pool's advice.
#[derive(Debug, Clone, PartialEq)]
pub struct Advice {
    /// Pool.
    pub pool: String,
    /// `managed` or `dedicated`.
    pub pool_kind: pb::PoolKind,
    /// Provider.
    pub provider: String,
    /// When a job submitted now would start.
    pub expected_start: Option<Eta>,
    /// The run's expected cost.
    pub cost: RunCost,
    /// Jobs of the pool in the window.
    pub jobs: u64,
    /// Productive over all GPU time.
    pub goodput: Option<f64>,
    /// Failed over ended jobs.
    pub failure_rate: Option<f64>,
}

const HOUR_MS: f64 = 3_600_000.0;

/// Advice for every pool of `records` that can run `req`, soonest expected start first (pools without one
/// last, by name).
pub fn advise(req: &Request, records: &Records, book: &WaitBook, model: &CostModel, now: i64) -> Vec<Advice> {
    let mut out = Vec::new();
    for (pool, r) in &records.pools {
        let Some(base) = r.attrs.as_ref() else { continue };
        let capacity = model.dedicated(pool).map(|(gpus, _)| gpus);
        if r.max_gpus == 0 || (r.max_gpus < req.gpus && capacity.is_none_or(|c| c < req.gpus)) {
            continue;
        }
        let key = GroupKey {
            pool: pool.clone(),
            priority: Some(req.priority),
            gpu_class: Some(req.gpu_class.clone()),
            gpus: Some(eta::gpu_bucket(req.gpus)),
            reason: None,
        };
        let query = eta::Query { wait_started_ms: now, scheduler_estimate_ms: None, queue: None };
        let expected_start = eta::estimate(&book.history(&key, now), &query, now);
        let attrs = JobAttrs {
            priority: req.priority,
            gpu_class: req.gpu_class.clone(),
            gpu_count: req.gpus,
            ..(**base).clone()
        };
        let gpu_hours = f64::from(req.gpus) * req.duration_ms as f64 / HOUR_MS;
        let wait_hours =
            expected_start.as_ref().map_or(0.0, |e| f64::from(req.gpus) * (e.at_ms - now) as f64 / HOUR_MS);
        let cost = match (model.dedicated(pool), model.price(&attrs)) {
            (Some((_, price)), _) => RunCost {
                model: "amortised",
                per_gpu_hour: Some(price),
                run: Some(gpu_hours * price),
                waiting: Some(wait_hours * price),
                total: Some((gpu_hours + wait_hours) * price),
            },
            (None, Some(price)) => RunCost {
                model: "per_use",
                per_gpu_hour: Some(price),
                run: Some(gpu_hours * price),
                waiting: Some(0.0),
                total: Some(gpu_hours * price),
            },
            (None, None) => RunCost { model: "unpriced", per_gpu_hour: None, run: None, waiting: None, total: None },
        };
        out.push(Advice {
            pool: pool.clone(),
            pool_kind: base.pool_kind,
            provider: base.provider.clone(),
            expected_start,
            cost,
            jobs: r.jobs,
            goodput: (r.total > 0.0).then(|| r.productive / r.total),
            failure_rate: (r.ended > 0).then(|| r.failed as f64 / r.ended as f64),
        });
    }
    out.sort_by(|a, b| {
        let at = |x: &Advice| x.expected_start.as_ref().map_or(i64::MAX, |e| e.at_ms);
        at(a).cmp(&at(b)).then_with(|| a.pool.cmp(&b.pool))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{CompactEvent, EventKind, JobRecord};

    const MIN: i64 = 60_000;
    const HOUR: i64 = 3_600_000;
    const T0: i64 = 1_767_225_600_000;

    fn job(pool: &str, kind: pb::PoolKind, gpus: u32, submit: i64, wait: i64, end: Option<pb::Outcome>) -> Timeline {
        let attrs = JobAttrs {
            pool: pool.into(),
            pool_kind: kind,
            provider: "slurm".into(),
            priority: pb::PriorityClass::Normal,
            gpu_class: "h100".into(),
            gpu_count: gpus,
            ..JobAttrs::unknown()
        };
        let ev = |n: u64, at: i64, kind: EventKind| CompactEvent { at_ms: at, id_hash: n, seq: n, attempt: None, kind };
        let mut evs = vec![
            ev(1, submit, EventKind::Submitted(Arc::new(attrs))),
            ev(2, submit + wait, EventKind::FirstStep { step: 0, origin: pb::StepOrigin::TrainingProcess }),
        ];
        if let Some(o) = end {
            evs.push(ev(3, submit + wait + HOUR, EventKind::Done { outcome: o, exit_code: None }));
        }
        JobRecord::from_events(evs).timeline
    }

    fn model() -> CostModel {
        let s: super::super::cost::CostSection = toml::from_str(
            r#"
            [[price]]
            match = "pool=cloud"
            per_gpu_hour = 4.0
            [[dedicated]]
            pool = "onprem"
            gpus = 64
            per_gpu_hour = 1.5
            "#,
        )
        .expect("toml");
        let mut errs = Vec::new();
        let m = s.validate(&mut errs);
        assert!(errs.is_empty(), "{errs:?}");
        m
    }

    #[test]
    fn pools_by_hand() {
        let now = T0 + 48 * HOUR;
        let mut records = Records::new("h100", now - 7 * 24 * HOUR, now);
        let mut book = WaitBook::default();
        let mut all = Vec::new();
        let mut file = |t: &Timeline, records: &mut Records, book: &mut WaitBook| {
            all.push(t.clone());
            records.add(t);
            book.add(all.len() as u64, &eta::entry_of(t).expect("entry"));
        };
        // cloud (per use, 4/GPU-hour): 8-GPU jobs waiting 10, 20, ..., 100 minutes; each runs an hour and ends, the
        // first two failed.
        for i in 1..=10 {
            let o = if i <= 2 { pb::Outcome::Failed } else { pb::Outcome::Succeeded };
            file(
                &job("cloud", pb::PoolKind::Managed, 8, T0 + i * HOUR, i * 10 * MIN, Some(o)),
                &mut records,
                &mut book,
            );
        }
        // onprem (dedicated, 64 GPUs at 1.5): 1-GPU jobs only, each waiting 2 hours; one still running.
        for i in 1..=4 {
            let end = (i < 4).then_some(pb::Outcome::Succeeded);
            file(&job("onprem", pb::PoolKind::Dedicated, 1, T0 + i * HOUR, 2 * HOUR, end), &mut records, &mut book);
        }
        // small: 2-GPU jobs, no capacity known: cannot take 8.
        file(&job("small", pb::PoolKind::Managed, 2, T0, MIN, None), &mut records, &mut book);
        let req =
            Request { gpus: 8, gpu_class: "h100".into(), priority: pb::PriorityClass::Normal, duration_ms: 12 * HOUR };
        let advice = advise(&req, &records, &book, &model(), now);
        let pools: Vec<&str> = advice.iter().map(|a| a.pool.as_str()).collect();
        assert_eq!(pools, ["cloud", "onprem"]);
        let cloud = &advice[0];
        // Waits 10..100 minutes: 10th 10, median 50, 90th 90 (see slo::eta's tests).
        let e = cloud.expected_start.as_ref().expect("eta");
        assert_eq!((e.low_ms - now, e.at_ms - now, e.high_ms - now), (10 * MIN, 50 * MIN, 90 * MIN));
        // The pool's group (10 jobs < 20, and no narrower group has more).
        assert_eq!(e.group.as_ref().map(|g| g.priority), Some(None));
        // 8 GPUs x 12 h x 4 = 384; waiting not billed.
        assert_eq!(
            cloud.cost,
            RunCost {
                model: "per_use",
                per_gpu_hour: Some(4.0),
                run: Some(384.0),
                waiting: Some(0.0),
                total: Some(384.0)
            }
        );
        // Each job: waiting 10i minutes, then an hour of training, lost for the two that failed: productive / total
        // = 8 h / (10 h + 550 min).
        let want = 480.0 / (600.0 + 550.0);
        assert!((cloud.goodput.expect("goodput") - want).abs() < 1e-12, "{:?}", cloud.goodput);
        assert_eq!(cloud.failure_rate, Some(0.2));
        let onprem = &advice[1];
        // Every wait 2 h: 2 h for every quantile; 3 of 4 ended, none failed.
        let e = onprem.expected_start.as_ref().expect("eta");
        assert_eq!((e.low_ms - now, e.at_ms - now, e.high_ms - now), (2 * HOUR, 2 * HOUR, 2 * HOUR));
        // 8 x 12 x 1.5 = 144 for the run, 8 x 2 x 1.5 = 24 for the wait.
        assert_eq!(
            onprem.cost,
            RunCost {
                model: "amortised",
                per_gpu_hour: Some(1.5),
                run: Some(144.0),
                waiting: Some(24.0),
                total: Some(168.0)
            }
        );
        assert_eq!(onprem.failure_rate, Some(0.0));
        assert_eq!(onprem.jobs, 4);
        // Another class: nothing.
        let other = Request { gpu_class: "a100".into(), ..req.clone() };
        let mut records = Records::new("a100", now - 7 * 24 * HOUR, now);
        all.iter().for_each(|t| records.add(t));
        assert!(advise(&other, &records, &book, &model(), now).is_empty());
    }
}
