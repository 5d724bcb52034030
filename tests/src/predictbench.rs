//! `startline-bench predict`: how well breach prediction warns, measured on the simulator's fleet.
//!
//! The simulator's default fleet (with `--crunch`'s scripted H100 capacity crunches) runs for `--days` days; every
//! job's timeline is derived with the collector's own code. Urgent jobs of the last half are judged against the
//! built-in `urgent-start` SLO (10 minutes): walking each job's wait in 15-second steps, the collector's
//! [`predict`] is asked with a wait model rebuilt every 5 simulated minutes from the jobs that had *started by
//! then* in the last 7 days (no look-ahead). A job *breached* when it had not started by its deadline (jobs that
//! ended before it are left out). Reported per confidence level: the share of breached jobs warned before their
//! deadline, the median lead time (deadline minus the first warning), and the false-warning rate (jobs warned that
//! started in time). The simulator reports no scheduler estimates, so this measures the stall and history bases
//! (the stall basis counts, at each step, the other urgent jobs of the GPU class still waiting past the threshold).

use startline_agent::simulate::arrivals;
use startline_agent::simulate::engine::{self, FleetConfig};
use startline_agent::simulate::model::{crunches, fleet};
use startline_collector::job::{CompactEvent, JobRecord};
use startline_collector::slo::predict::{predict, PredictSettings, WaitModel, Waiting};
use startline_proto::pb;

/// Options.
#[derive(Debug, Clone)]
pub struct Args {
    /// Simulated days (the last half is judged).
    pub days: i64,
    /// Arrivals per hour.
    pub jobs_per_hour: f64,
    /// Seed.
    pub seed: u64,
    /// Fewest comparable jobs a warning needs.
    pub min_samples: usize,
    /// History lookback, hours.
    pub lookback_h: i64,
    /// The start threshold judged, minutes.
    pub threshold_min: i64,
    /// The stall basis' `stall_jobs` (0: history only).
    pub stall_jobs: usize,
}

/// Parses `predict [--days 28] [--jobs-per-hour 60] [--seed 7] [--min-samples 20] [--lookback-hours 168]
/// [--threshold-minutes 10] [--stall-jobs 1]`.
pub fn parse_args(args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        days: 28,
        jobs_per_hour: 60.0,
        seed: 7,
        min_samples: 20,
        lookback_h: 168,
        threshold_min: 10,
        stall_jobs: 1,
    };
    let mut it = args.filter(|x| x != "predict");
    while let Some(k) = it.next() {
        let v = it.next().ok_or_else(|| format!("{k}: needs a value"))?;
        match k.as_str() {
            "--days" => a.days = v.parse().map_err(|_| format!("--days: {v:?}"))?,
            "--jobs-per-hour" => a.jobs_per_hour = v.parse().map_err(|_| format!("--jobs-per-hour: {v:?}"))?,
            "--seed" => a.seed = v.parse().map_err(|_| format!("--seed: {v:?}"))?,
            "--min-samples" => a.min_samples = v.parse().map_err(|_| format!("--min-samples: {v:?}"))?,
            "--stall-jobs" => a.stall_jobs = v.parse().map_err(|_| format!("--stall-jobs: {v:?}"))?,
            "--threshold-minutes" => a.threshold_min = v.parse().map_err(|_| format!("--threshold-minutes: {v:?}"))?,
            "--lookback-hours" => a.lookback_h = v.parse().map_err(|_| format!("--lookback-hours: {v:?}"))?,
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(a)
}

struct Job {
    pool: String,
    gpu_class: String,
    priority: pb::PriorityClass,
    submitted: i64,
    first_step: Option<i64>,
    done: Option<i64>,
}

const MIN: i64 = 60_000;

/// Runs the measurement and prints a Markdown table.
pub fn main(a: Args) {
    let started = std::time::Instant::now();
    let threshold = a.threshold_min * MIN;
    let end = 1_767_225_600_000 + a.days * 86_400_000; // from 2026-01-01
    let start = end - a.days * 86_400_000;
    let mut pools = fleet(0, 0, a.jobs_per_hour);
    // The scripted crunches, one every 3 days over the span (the simulator's --crunch places one near the end of a
    // history; a long span gets several so the judged half holds some).
    let mut windows = Vec::new();
    let mut t = start + 3 * 86_400_000;
    while t < end {
        windows.push(crunches(t, 6 * 86_400_000)[0]);
        t += 3 * 86_400_000;
    }
    for p in pools.iter_mut().filter(|p| p.gpu_class == "h100") {
        p.crunches = windows.clone();
    }
    let n = (a.jobs_per_hour * a.days as f64 * 24.0) as u64;
    let mut jobs = Vec::with_capacity(n as usize);
    // Every job runs to its end (the fleet keeps going a day past the last arrival).
    let times = arrivals(a.seed, n, start, end);
    let stream = engine::events(FleetConfig::new(a.seed, pools, start), times, end + 86_400_000);
    for job in engine::by_job(stream) {
        let evs: Vec<CompactEvent> =
            job.iter().enumerate().filter_map(|(i, e)| CompactEvent::from_pb(e, i as u64)).collect();
        let t = JobRecord::from_events(evs).timeline;
        let (Some(attrs), Some(sub)) = (t.attrs.as_ref(), t.submitted_at) else { continue };
        jobs.push(Job {
            pool: attrs.pool.clone(),
            gpu_class: attrs.gpu_class.clone(),
            priority: attrs.priority,
            submitted: sub,
            first_step: t.first_step_at,
            done: t.done_at,
        });
    }
    // Started jobs by first-step time, for the no-look-ahead models.
    let mut by_start: Vec<&Job> = jobs.iter().filter(|j| j.first_step.is_some()).collect();
    by_start.sort_by_key(|j| j.first_step);
    let lookback = a.lookback_h * 3_600_000;
    let model_at = |t: i64| {
        let upto = by_start.partition_point(|j| j.first_step.is_some_and(|f| f <= t));
        WaitModel::build(
            by_start[..upto]
                .iter()
                .filter(|j| j.submitted >= t - lookback)
                .filter_map(|j| Some((j.pool.clone(), j.priority, j.first_step? - j.submitted))),
            t,
        )
    };
    // Urgent jobs by pool, by submit time: who is waiting past the threshold at `t`.
    let mut urgent_by_pool: std::collections::HashMap<&str, Vec<&Job>> = std::collections::HashMap::new();
    for j in jobs.iter().filter(|j| j.priority == pb::PriorityClass::Urgent) {
        // As the collector counts them: by GPU class (a capacity crunch hits every pool of a class), by pool when the
        // job names no class.
        let key = if j.gpu_class.is_empty() { j.pool.as_str() } else { j.gpu_class.as_str() };
        urgent_by_pool.entry(key).or_default().push(j);
    }
    for v in urgent_by_pool.values_mut() {
        v.sort_by_key(|j| j.submitted);
    }
    let waiting_past = |pool: &str, me: i64, t: i64| -> usize {
        let Some(v) = urgent_by_pool.get(pool) else { return 0 };
        let lo = v.partition_point(|j| j.submitted < t - 12 * 3_600_000);
        v[lo..]
            .iter()
            .take_while(|j| j.submitted + threshold < t)
            .filter(|j| j.submitted != me)
            .filter(|j| j.first_step.is_none_or(|f| f > t) && j.done.is_none_or(|d| d > t))
            .count()
    };
    let judged_from = start + a.days / 2 * 86_400_000;
    let judged: Vec<&Job> = jobs
        .iter()
        .filter(|j| j.priority == pb::PriorityClass::Urgent && j.submitted >= judged_from)
        // Jobs that ended before their deadline without starting were withdrawn, not late.
        .filter(|j| j.first_step.is_some() || j.done.is_none_or(|d| d >= j.submitted + threshold))
        .filter(|j| j.submitted + threshold < end)
        .collect();
    // Models every 5 simulated minutes over the judged span (built lazily, cached).
    let step = 5 * MIN;
    let mut models: std::collections::BTreeMap<i64, WaitModel> = std::collections::BTreeMap::new();
    let confidences = [0.5, 0.6, 0.7, 0.8, 0.9];
    println!("Breach prediction on the simulator's fleet ({} days, {} jobs/h, seed {}; judged: {} urgent jobs of the last {} days; threshold {} min; stall_jobs {}, history min_samples {}, lookback {} h, model every 5 min)\n", a.days, a.jobs_per_hour, a.seed, judged.len(), a.days - a.days / 2, a.threshold_min, a.stall_jobs, a.min_samples, a.lookback_h);
    println!("| confidence | breached | warned in advance | median lead time | not breached | false warnings |");
    println!("|---|---|---|---|---|---|");
    for c in confidences {
        let s = PredictSettings {
            confidence: c,
            min_samples: a.min_samples,
            stall_jobs: a.stall_jobs,
            ..PredictSettings::default()
        };
        let (mut breached, mut warned, mut ok, mut false_warn) = (0u64, 0u64, 0u64, 0u64);
        let mut leads = Vec::new();
        for j in &judged {
            let deadline = j.submitted + threshold;
            let started_in_time = j.first_step.is_some_and(|f| f <= deadline);
            let until = j.first_step.unwrap_or(deadline).min(deadline);
            let mut first_warning = None;
            let mut t = j.submitted + 15_000;
            while t < until {
                let key = t.div_euclid(step) * step;
                let m = models.entry(key).or_insert_with(|| model_at(key));
                let w = Waiting {
                    pool: &j.pool,
                    priority: j.priority,
                    submitted_ms: j.submitted,
                    estimated_start_ms: None,
                    others_waiting_past: if a.stall_jobs > 0 {
                        let key = if j.gpu_class.is_empty() { &j.pool } else { &j.gpu_class };
                        waiting_past(key, j.submitted, t)
                    } else {
                        0
                    },
                };
                if predict(m, &s, w, threshold, t).is_some() {
                    first_warning = Some(t);
                    break;
                }
                t += 15_000;
            }
            if started_in_time {
                ok += 1;
                false_warn += u64::from(first_warning.is_some());
            } else {
                breached += 1;
                if let Some(w) = first_warning {
                    warned += 1;
                    leads.push(deadline - w);
                }
            }
        }
        leads.sort_unstable();
        let median = leads
            .get(leads.len().saturating_sub(1) / 2)
            .map_or("–".to_string(), |l| format!("{:.1} min", *l as f64 / MIN as f64));
        let pct = |a: u64, b: u64| {
            if b == 0 {
                "–".to_string()
            } else {
                format!("{:.2}% ({a}/{b})", 100.0 * a as f64 / b as f64)
            }
        };
        println!("| {c} | {breached} | {} | {median} | {ok} | {} |", pct(warned, breached), pct(false_warn, ok));
    }
    println!("\n(elapsed {:.1} s)", started.elapsed().as_secs_f64());
}
