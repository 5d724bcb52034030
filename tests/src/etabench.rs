//! `startline-bench eta`: how well the expected start of waiting jobs ([`startline_collector::slo::eta`]) predicts
//! the real start, measured on the simulator's fleet.
//!
//! The simulator's default fleet (with `--crunch`'s scripted H100 capacity crunches, one every 3 days) runs for
//! `--days` days, plus a day so the last jobs start. Its events are replayed in time order into per-job records
//! and a [`WaitBook`] exactly as the collector's index files them (each event inserted into the job's record, the
//! job's entry replaced with the scheduler's error once it started): at any moment the book holds only what was
//! known then. Every job of the last half that waited (its first step after its submit) is asked for its expected
//! start ([`eta::for_job`], with its queue-position progress so far) at its submit and at 25%, 50% and 75% of its
//! eventual wait; the truth is its first step. Reported per checkpoint and per pool kind and provider: the share
//! whose first step fell inside the 80% interval (and below / above it), the median absolute error of the central
//! estimate, of the pool's median wait from the same book (submit + the pool's Kaplan-Meier median, not before
//! now), and, where the job had one, of the scheduler's own estimate (not before now), and the measured cost of an
//! estimate (reading the book and estimating, as `GET /api/v1/jobs/{id}` does).

use startline_agent::simulate::arrivals;
use startline_agent::simulate::engine::{self, FleetConfig};
use startline_agent::simulate::model::{crunches, fleet};
use startline_collector::job::{CompactEvent, JobRecord};
use startline_collector::slo::eta::{self, GroupKey, QueueProgress, WaitBook};
use startline_proto::pb;
use startline_proto::pb::lifecycle_event::Kind;
use startline_proto::time::timestamp_to_ms;
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

/// Options.
#[derive(Debug, Clone)]
pub struct Args {
    /// Simulated days (the last half is judged).
    pub days: i64,
    /// Arrivals per hour.
    pub jobs_per_hour: f64,
    /// Seed.
    pub seed: u64,
}

/// Parses `eta [--days 14] [--jobs-per-hour 60] [--seed 7]`.
pub fn parse_args(args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args { days: 14, jobs_per_hour: 60.0, seed: 7 };
    let mut it = args.filter(|x| x != "eta");
    while let Some(k) = it.next() {
        let v = it.next().ok_or_else(|| format!("{k}: needs a value"))?;
        match k.as_str() {
            "--days" => a.days = v.parse().map_err(|_| format!("--days: {v:?}"))?,
            "--jobs-per-hour" => a.jobs_per_hour = v.parse().map_err(|_| format!("--jobs-per-hour: {v:?}"))?,
            "--seed" => a.seed = v.parse().map_err(|_| format!("--seed: {v:?}"))?,
            other => return Err(format!("unknown option {other}")),
        }
    }
    if a.days < 2 {
        return Err(format!("--days: at least 2 (got {})", a.days));
    }
    Ok(a)
}

/// Where in its eventual wait a job is asked.
pub const CHECKPOINTS: [f64; 4] = [0.0, 0.25, 0.5, 0.75];

/// One estimate against the truth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// The job's first step (ms).
    pub actual: i64,
    /// The estimate's `(low, central, high)`, if it gave one.
    pub eta: Option<(i64, i64, i64)>,
    /// The pool-median baseline's central estimate, if the pool had history.
    pub pool_median: Option<i64>,
    /// The scheduler's estimate, if the job had one.
    pub scheduler: Option<i64>,
    /// What the estimate cost (ns).
    pub cost_ns: u64,
}

/// The median of `v` (the mean of the two middle values when even); `None` when empty.
pub fn median(mut v: Vec<i64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] as f64 } else { (v[n / 2 - 1] as f64 + v[n / 2] as f64) / 2.0 })
}

/// A row's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Samples.
    pub jobs: usize,
    /// Samples with an estimate.
    pub estimated: usize,
    /// Share of estimated samples whose truth fell inside the interval, below it, above it.
    pub inside: f64,
    /// Below the low end.
    pub early: f64,
    /// Above the high end.
    pub late: f64,
    /// Median absolute error of the central estimate (ms), over samples with both an estimate and a pool baseline.
    pub mae: Option<f64>,
    /// Of the pool-median baseline, over the same samples.
    pub mae_pool: Option<f64>,
    /// Samples with a scheduler estimate (and an estimate).
    pub with_scheduler: usize,
    /// Median absolute error of the central estimate over those.
    pub mae_on_scheduler: Option<f64>,
    /// Of the scheduler's estimate over those.
    pub mae_scheduler: Option<f64>,
    /// Mean cost per estimate (ns).
    pub cost_ns: f64,
}

/// The figures of `samples`.
pub fn summarize(samples: &[Sample]) -> Summary {
    let est: Vec<(&Sample, (i64, i64, i64))> = samples.iter().filter_map(|s| Some((s, s.eta?))).collect();
    let n = est.len().max(1) as f64;
    let count = |f: &dyn Fn(i64, (i64, i64, i64)) -> bool| est.iter().filter(|(s, e)| f(s.actual, *e)).count();
    let both: Vec<(i64, i64)> =
        est.iter().filter_map(|(s, e)| Some(((e.1 - s.actual).abs(), (s.pool_median? - s.actual).abs()))).collect();
    let sched: Vec<(i64, i64)> =
        est.iter().filter_map(|(s, e)| Some(((e.1 - s.actual).abs(), (s.scheduler? - s.actual).abs()))).collect();
    Summary {
        jobs: samples.len(),
        estimated: est.len(),
        inside: count(&|a, e| e.0 <= a && a <= e.2) as f64 / n,
        early: count(&|a, e| a < e.0) as f64 / n,
        late: count(&|a, e| a > e.2) as f64 / n,
        mae: median(both.iter().map(|x| x.0).collect()),
        mae_pool: median(both.iter().map(|x| x.1).collect()),
        with_scheduler: sched.len(),
        mae_on_scheduler: median(sched.iter().map(|x| x.0).collect()),
        mae_scheduler: median(sched.iter().map(|x| x.1).collect()),
        cost_ns: samples.iter().map(|s| s.cost_ns as f64).sum::<f64>() / samples.len().max(1) as f64,
    }
}

/// A job being replayed.
struct Replayed {
    rec: Option<JobRecord>,
    entry: Option<eta::Entry>,
    /// Queue positions seen before its first step, in time order.
    positions: Vec<(i64, u32)>,
}

/// A job judged: its submit, first step, pool kind and provider.
struct Judged {
    id: String,
    submitted: i64,
    first_step: i64,
    kind: pb::PoolKind,
    provider: String,
}

const MIN: f64 = 60_000.0;

/// Runs the measurement and prints a Markdown table.
pub fn main(a: Args) {
    let wall = Instant::now();
    let day = 86_400_000;
    let start = 1_767_225_600_000; // 2026-01-01
    let end = start + a.days * day;
    let mut pools = fleet(0, 0, a.jobs_per_hour);
    let mut windows = Vec::new();
    let mut t = start + 3 * day;
    while t < end {
        windows.push(crunches(t, 6 * day)[0]);
        t += 3 * day;
    }
    for p in pools.iter_mut().filter(|p| p.gpu_class == "h100") {
        p.crunches = windows.clone();
    }
    let n = (a.jobs_per_hour * a.days as f64 * 24.0) as u64;
    let times = arrivals(a.seed, n, start, end);
    let mut events: Vec<pb::LifecycleEvent> =
        engine::events(FleetConfig::new(a.seed, pools, start), times, end + day).collect();
    let at = |e: &pb::LifecycleEvent| e.occurred_at.as_ref().map_or(i64::MIN, timestamp_to_ms);
    events.sort_by_key(at);

    // The truth: each job's submit and first step from its whole history.
    let mut whole: HashMap<&str, Vec<CompactEvent>> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        if let Some(c) = CompactEvent::from_pb(e, i as u64) {
            whole.entry(e.job_id.as_str()).or_default().push(c);
        }
    }
    let judged_from = start + a.days / 2 * day;
    let mut judged: Vec<Judged> = whole
        .into_iter()
        .filter_map(|(id, evs)| {
            let t = JobRecord::from_events(evs).timeline;
            let attrs = t.attrs.as_ref()?;
            let (sub, first) = (t.submitted_at?, t.first_step_at?);
            (sub >= judged_from && sub < end && first > sub).then(|| Judged {
                id: id.to_string(),
                submitted: sub,
                first_step: first,
                kind: attrs.pool_kind,
                provider: attrs.provider.clone(),
            })
        })
        .collect();
    judged.sort_by(|x, y| (x.submitted, &x.id).cmp(&(y.submitted, &y.id)));
    // Checkpoints in time order: (when, judged job, checkpoint).
    let mut asks: Vec<(i64, usize, usize)> = Vec::new();
    for (j, job) in judged.iter().enumerate() {
        for (c, f) in CHECKPOINTS.iter().enumerate() {
            asks.push((job.submitted + (f * (job.first_step - job.submitted) as f64).round() as i64, j, c));
        }
    }
    asks.sort_unstable();

    // The replay.
    let mut book = WaitBook::default();
    let mut jobs: HashMap<String, Replayed> = HashMap::new();
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); CHECKPOINTS.len()];
    let mut tags: Vec<Vec<usize>> = vec![Vec::new(); CHECKPOINTS.len()];
    let mut next = 0;
    let mut ask = |now: i64, j: usize, c: usize, book: &WaitBook, jobs: &HashMap<String, Replayed>| {
        let job = &judged[j];
        let Some(r) = jobs.get(&job.id) else { return };
        let Some(rec) = r.rec.as_ref() else { return };
        let t = &rec.timeline;
        let progress = QueueProgress::of(r.positions.iter().copied());
        let clock = Instant::now();
        let e = eta::for_job(book, t, progress, now);
        let cost_ns = clock.elapsed().as_nanos() as u64;
        let pool_median = t.attrs.as_ref().and_then(|attrs| {
            let key = GroupKey { pool: attrs.pool.clone(), priority: None, gpu_class: None, gpus: None, reason: None };
            let h = book.history(&key, now).history?;
            Some((job.submitted + h.km.quantile(0, 0.5)?).max(now))
        });
        samples[c].push(Sample {
            actual: job.first_step,
            eta: e.map(|e| (e.low_ms, e.at_ms, e.high_ms)),
            pool_median,
            scheduler: t.current_estimated_start.map(|s| s.max(now)),
            cost_ns,
        });
        tags[c].push(j);
    };
    for (seq, ev) in events.iter().enumerate() {
        let now = at(ev);
        while next < asks.len() && asks[next].0 < now {
            let (when, j, c) = asks[next];
            ask(when, j, c, &book, &jobs);
            next += 1;
        }
        let Some(c) = CompactEvent::from_pb(ev, seq as u64) else { continue };
        let r =
            jobs.entry(ev.job_id.clone()).or_insert_with(|| Replayed { rec: None, entry: None, positions: Vec::new() });
        match r.rec.as_mut() {
            Some(rec) => {
                rec.insert(c);
            }
            None => r.rec = Some(JobRecord::from_events(vec![c])),
        }
        let Some(rec) = r.rec.as_ref() else { continue };
        if let Some(Kind::Queued(q)) = &ev.kind {
            if let Some(p) = q.queue_position.filter(|_| rec.timeline.first_step_at.is_none()) {
                r.positions.push((now, p));
            }
        }
        // As the index files it (`wait_entry`).
        let mut after = eta::entry_of(&rec.timeline);
        if let Some(eta::Outcome::Started { scheduler_error_ms, .. }) = after.as_mut().map(|e| &mut e.outcome) {
            *scheduler_error_ms = eta::scheduler_error(&rec.timeline, &rec.events);
        }
        let hash = startline_proto::hash::fnv1a64(ev.job_id.as_bytes());
        book.replace(hash, r.entry.as_ref(), after.as_ref());
        r.entry = after;
    }
    while next < asks.len() {
        let (when, j, c) = asks[next];
        ask(when, j, c, &book, &jobs);
        next += 1;
    }

    println!(
        "Expected start on the simulator's fleet ({} days, {} jobs/h, seed {}, H100 crunch every 3 days; judged: {} jobs \
         of the last {} days that waited, asked at submit and at 25/50/75% of their wait; truth: first step)\n",
        a.days,
        a.jobs_per_hour,
        a.seed,
        judged.len(),
        a.days - a.days / 2
    );
    println!("| asked at | pools | jobs | estimated | inside 80% interval | below / above | MAE estimate | MAE pool median | vs pool median | with scheduler estimate | MAE estimate (those) | MAE scheduler | ns / estimate |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let min = |x: Option<f64>| x.map_or("–".to_string(), |v| format!("{:.1} min", v / MIN));
    for (c, f) in CHECKPOINTS.iter().enumerate() {
        let mut rows: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
        for (s, j) in samples[c].iter().zip(&tags[c]) {
            let job = &judged[*j];
            let kind = if job.kind == pb::PoolKind::Managed { "managed" } else { "dedicated" };
            rows.entry("0 all".into()).or_default().push(*s);
            rows.entry(format!("1 {kind}")).or_default().push(*s);
            rows.entry(format!("2 {kind}: {}", job.provider)).or_default().push(*s);
        }
        for (name, v) in &rows {
            let s = summarize(v);
            let gain = match (s.mae, s.mae_pool) {
                (Some(m), Some(p)) if p > 0.0 => format!("{:+.0}%", 100.0 * (m - p) / p),
                _ => "–".into(),
            };
            println!(
                "| {} | {} | {} | {} | {:.1}% | {:.1}% / {:.1}% | {} | {} | {gain} | {} | {} | {} | {:.0} |",
                if *f == 0.0 { "submit".to_string() } else { format!("{:.0}% of wait", f * 100.0) },
                &name[2..],
                s.jobs,
                s.estimated,
                100.0 * s.inside,
                100.0 * s.early,
                100.0 * s.late,
                min(s.mae),
                min(s.mae_pool),
                s.with_scheduler,
                min(s.mae_on_scheduler),
                min(s.mae_scheduler),
                s.cost_ns
            );
        }
    }
    println!("\n(elapsed {:.1} s)", wall.elapsed().as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(actual: i64, eta: Option<(i64, i64, i64)>, pool: Option<i64>, sched: Option<i64>, cost: u64) -> Sample {
        Sample { actual, eta, pool_median: pool, scheduler: sched, cost_ns: cost }
    }

    /// Coverage, errors and cost of five hand-made samples, each figure worked out by hand.
    #[test]
    fn summary_of_a_hand_made_case() {
        let v = [
            // inside; |100-100| = 0; pool |160-100| = 60; scheduler |130-100| = 30
            s(100, Some((50, 100, 150)), Some(160), Some(130), 10),
            // below (40 < 50); |90-40| = 50; pool |40-40| = 0
            s(40, Some((50, 90, 150)), Some(40), None, 20),
            // above (300 > 250); |200-300| = 100; pool |100-300| = 200; scheduler |310-300| = 10
            s(300, Some((150, 200, 250)), Some(100), Some(310), 30),
            // inside at the high end; |190-200| = 10; no pool baseline
            s(200, Some((100, 190, 200)), None, None, 40),
            // no estimate: counted in jobs only
            s(500, None, Some(400), Some(500), 100),
        ];
        let r = summarize(&v);
        assert_eq!((r.jobs, r.estimated), (5, 4));
        assert_eq!((r.inside, r.early, r.late), (0.5, 0.25, 0.25));
        // Estimate errors with a pool baseline: 0, 50, 100 -> 50; pool's: 60, 0, 200 -> 60.
        assert_eq!((r.mae, r.mae_pool), (Some(50.0), Some(60.0)));
        // With a scheduler estimate: errors 0 and 100 (estimate) -> 50, 30 and 10 (scheduler) -> 20.
        assert_eq!(r.with_scheduler, 2);
        assert_eq!((r.mae_on_scheduler, r.mae_scheduler), (Some(50.0), Some(20.0)));
        assert_eq!(r.cost_ns, 40.0);
    }

    #[test]
    fn median_odd_even_and_empty() {
        assert_eq!(median(vec![3, 1, 2]), Some(2.0));
        assert_eq!(median(vec![4, 1, 3, 2]), Some(2.5));
        assert_eq!(median(Vec::new()), None);
    }

    #[test]
    fn args_default_and_errors() {
        let a = parse_args(["eta"].into_iter().map(String::from)).expect("defaults");
        assert_eq!((a.days, a.seed), (14, 7));
        let e = parse_args(["eta", "--days", "x"].into_iter().map(String::from)).expect_err("bad days");
        assert!(e.contains("--days"), "{e}");
        assert!(parse_args(["eta", "--days", "1"].into_iter().map(String::from)).is_err());
    }
}
