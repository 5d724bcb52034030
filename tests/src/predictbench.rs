//! `startline-bench predict`: how well breach prediction warns, measured on the simulator's fleet.
//!
//! The simulator's default fleet runs for `--days` days with scripted H100 capacity crunches (every
//! `--crunch-every-days` days at `--crunch-hour` UTC for `--crunch-minutes`: nothing of the class starts, urgent
//! jobs included, while jobs keep arriving and queue with reason `capacity`); every job's timeline is derived with
//! the collector's own code. Urgent jobs of the last half are judged against the built-in `urgent-start` SLO (10
//! minutes): walking each job's wait in 15-second steps, the collector's [`predict`] is asked with a wait model
//! rebuilt every 5 simulated minutes from the jobs that had *started by then* in the last 7 days (no look-ahead).
//! A job *breached* when it had not started by its deadline (jobs that ended before it are left out). Reported per
//! configuration of the bases: the share of breached jobs warned before their deadline, the median lead time
//! (deadline minus the first warning), the false-warning rate (jobs warned that started in time) also per 1,000
//! judged urgent jobs, and whether each crunch's first breaching urgent job was warned. Scheduler estimates are
//! not replayed unless `--estimates on` (the simulator's Slurm pools send them; the simulated scheduler knows
//! when a crunch ends, a real one whose nodes went away may not), so by default this measures the stall,
//! capacity and history bases. The
//! stall basis counts, at each step, the other urgent jobs of the GPU class still waiting past the threshold; the
//! capacity basis counts, with the collector's [`CapacitySignals`] over each job's [`CapacityView`] as it stood
//! after each of its events, the jobs of the class queued for capacity in the window and the starts in it.

use startline_agent::simulate::arrivals;
use startline_agent::simulate::engine::{self, FleetConfig};
use startline_agent::simulate::model::fleet;
use startline_collector::job::{CompactEvent, JobRecord, TimelineFold};
use startline_collector::slo::predict::{
    class_scope, predict, CapacitySignals, CapacityView, PredictSettings, WaitModel, Waiting,
};
use startline_proto::pb;
use std::collections::{BTreeMap, HashMap};

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
    /// The history basis' confidence.
    pub confidence: f64,
    /// The stall basis' `stall_jobs` (0: off).
    pub stall_jobs: usize,
    /// The capacity basis' `capacity_jobs` (0: off).
    pub capacity_jobs: usize,
    /// The capacity basis' window, minutes.
    pub capacity_window_min: i64,
    /// A crunch every this many days.
    pub crunch_every_days: i64,
    /// The UTC hour a crunch begins.
    pub crunch_hour: i64,
    /// How long a crunch lasts, minutes.
    pub crunch_minutes: i64,
    /// Replay the simulator's scheduler estimates (the Slurm pools' `estimated_start`) as the collector reads them.
    pub estimates: bool,
}

/// Parses `predict [--days 28] [--jobs-per-hour 60] [--seed 7] [--min-samples 20] [--lookback-hours 168]
/// [--threshold-minutes 10] [--confidence 0.8] [--stall-jobs 1] [--capacity-jobs 3] [--capacity-window-minutes 10]
/// [--crunch-every-days 1] [--crunch-hour 14] [--crunch-minutes 60] [--estimates off]`.
pub fn parse_args(args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        days: 28,
        jobs_per_hour: 60.0,
        seed: 7,
        min_samples: 20,
        lookback_h: 168,
        threshold_min: 10,
        confidence: 0.8,
        stall_jobs: 1,
        capacity_jobs: 3,
        capacity_window_min: 10,
        crunch_every_days: 1,
        crunch_hour: 14,
        crunch_minutes: 60,
        estimates: false,
    };
    let mut it = args.filter(|x| x != "predict");
    while let Some(k) = it.next() {
        let v = it.next().ok_or_else(|| format!("{k}: needs a value"))?;
        let bad = || format!("{k}: {v:?}");
        match k.as_str() {
            "--days" => a.days = v.parse().map_err(|_| bad())?,
            "--jobs-per-hour" => a.jobs_per_hour = v.parse().map_err(|_| bad())?,
            "--seed" => a.seed = v.parse().map_err(|_| bad())?,
            "--min-samples" => a.min_samples = v.parse().map_err(|_| bad())?,
            "--confidence" => a.confidence = v.parse().map_err(|_| bad())?,
            "--stall-jobs" => a.stall_jobs = v.parse().map_err(|_| bad())?,
            "--capacity-jobs" => a.capacity_jobs = v.parse().map_err(|_| bad())?,
            "--capacity-window-minutes" => a.capacity_window_min = v.parse().map_err(|_| bad())?,
            "--crunch-every-days" => a.crunch_every_days = v.parse().map_err(|_| bad())?,
            "--crunch-hour" => a.crunch_hour = v.parse().map_err(|_| bad())?,
            "--crunch-minutes" => a.crunch_minutes = v.parse().map_err(|_| bad())?,
            "--estimates" => {
                a.estimates = match v.as_str() {
                    "on" => true,
                    "off" => false,
                    _ => return Err(bad()),
                }
            }
            "--threshold-minutes" => a.threshold_min = v.parse().map_err(|_| bad())?,
            "--lookback-hours" => a.lookback_h = v.parse().map_err(|_| bad())?,
            other => return Err(format!("unknown option {other}")),
        }
    }
    if a.days < 2 || a.crunch_every_days < 1 || !(0..24).contains(&a.crunch_hour) || a.crunch_minutes < 1 {
        return Err(
            "--days at least 2, --crunch-every-days at least 1, --crunch-hour 0-23, --crunch-minutes at least 1"
                .to_string(),
        );
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
    /// What the capacity basis sees of it after each of its events: (from, view), in time order.
    views: Vec<(i64, CapacityView)>,
    /// The scheduler's estimated start of its current wait after each of its events: (from, estimate).
    estimates: Vec<(i64, Option<i64>)>,
}

impl Job {
    fn view_at(&self, t: i64) -> CapacityView {
        let i = self.views.partition_point(|(at, _)| *at <= t);
        if i == 0 {
            CapacityView::default()
        } else {
            self.views[i - 1].1
        }
    }

    fn estimate_at(&self, t: i64) -> Option<i64> {
        let i = self.estimates.partition_point(|(at, _)| *at <= t);
        i.checked_sub(1).and_then(|i| self.estimates[i].1)
    }
}

const MIN: i64 = 60_000;

/// What one judged job's wait looked like at each 15-second step: the stall count and the capacity signal.
struct Step {
    t: i64,
    waiting_past: usize,
    capacity_queued: usize,
    estimate: Option<i64>,
}

/// One row of the table: a configuration of the bases.
struct Row {
    label: String,
    s: PredictSettings,
}

/// Runs the measurement and prints Markdown tables.
pub fn main(a: Args) {
    let started = std::time::Instant::now();
    let threshold = a.threshold_min * MIN;
    let end = 1_767_225_600_000 + a.days * 86_400_000; // from 2026-01-01
    let start = end - a.days * 86_400_000;
    let mut pools = fleet(0, 0, a.jobs_per_hour);
    // The scripted crunches of the H100 class (both its pools, managed and dedicated, at once).
    let mut windows = Vec::new();
    let mut t = start + a.crunch_every_days * 86_400_000 + a.crunch_hour * 3_600_000;
    while t < end {
        windows.push((t, t + a.crunch_minutes * MIN));
        t += a.crunch_every_days * 86_400_000;
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
        let rec = JobRecord::from_events(evs);
        // The view after each event, as the collector's timeline of the events so far gives it (the fold applied
        // one event at a time, finished after each, knowing nothing of the events to come).
        let mut views: Vec<(i64, CapacityView)> = Vec::new();
        let mut estimates: Vec<(i64, Option<i64>)> = Vec::new();
        if let Some((mut fold, mut live)) = TimelineFold::start(&rec.events) {
            for e in &rec.events {
                fold.apply(&mut live, e, &[]);
                fold.finish(&mut live);
                let v = CapacityView::of(&live);
                match views.last_mut() {
                    Some(last) if last.0 == e.at_ms => last.1 = v,
                    Some(last) if last.1 == v => {}
                    _ => views.push((e.at_ms, v)),
                }
                let est = live.current_estimated_start;
                match estimates.last_mut() {
                    Some(last) if last.0 == e.at_ms => last.1 = est,
                    Some(last) if last.1 == est => {}
                    _ => estimates.push((e.at_ms, est)),
                }
            }
        }
        let t = rec.timeline;
        let (Some(attrs), Some(sub)) = (t.attrs.as_ref(), t.submitted_at) else { continue };
        jobs.push(Job {
            pool: attrs.pool.clone(),
            gpu_class: attrs.gpu_class.clone(),
            priority: attrs.priority,
            submitted: sub,
            first_step: t.first_step_at,
            done: t.done_at,
            views,
            estimates,
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
    let scope = |j: &Job| class_scope(&j.pool, &j.gpu_class);
    // Urgent jobs by scope, by submit time: who is waiting past the threshold at `t` (the stall basis).
    let mut urgent_by_scope: HashMap<String, Vec<&Job>> = HashMap::new();
    for j in jobs.iter().filter(|j| j.priority == pb::PriorityClass::Urgent) {
        urgent_by_scope.entry(scope(j)).or_default().push(j);
    }
    for v in urgent_by_scope.values_mut() {
        v.sort_by_key(|j| j.submitted);
    }
    let waiting_past = |key: &str, me: i64, t: i64| -> usize {
        let Some(v) = urgent_by_scope.get(key) else { return 0 };
        let lo = v.partition_point(|j| j.submitted < t - 12 * 3_600_000);
        v[lo..]
            .iter()
            .take_while(|j| j.submitted + threshold < t)
            .filter(|j| j.submitted != me)
            .filter(|j| j.first_step.is_none_or(|f| f > t) && j.done.is_none_or(|d| d > t))
            .count()
    };
    // Every job's view changes by scope, in time order (the capacity basis): a job counts at `t` only through a view
    // set by an event in the window, so the jobs with an event in it are all that need asking.
    let mut changes_by_scope: HashMap<String, Vec<(i64, usize)>> = HashMap::new();
    for (i, j) in jobs.iter().enumerate() {
        let v = changes_by_scope.entry(scope(j)).or_default();
        v.extend(j.views.iter().map(|(at, _)| (*at, i)));
    }
    for v in changes_by_scope.values_mut() {
        v.sort_unstable();
    }
    let window = a.capacity_window_min * MIN;
    let capacity_at = |key: &str, t: i64| -> usize {
        let Some(v) = changes_by_scope.get(key) else { return 0 };
        let (lo, hi) = (v.partition_point(|c| c.0 <= t - window), v.partition_point(|c| c.0 <= t));
        let mut seen: Vec<usize> = v[lo..hi].iter().map(|c| c.1).collect();
        seen.sort_unstable();
        seen.dedup();
        let mut sig = CapacitySignals::new(window, t);
        for i in seen {
            sig.add(key, jobs[i].view_at(t));
        }
        sig.out_of_capacity(key)
    };
    let judged_from = start + a.days / 2 * 86_400_000;
    let judged: Vec<&Job> = jobs
        .iter()
        .filter(|j| j.priority == pb::PriorityClass::Urgent && j.submitted >= judged_from)
        // Jobs that ended before their deadline without starting were withdrawn, not late.
        .filter(|j| j.first_step.is_some() || j.done.is_none_or(|d| d >= j.submitted + threshold))
        .filter(|j| j.submitted + threshold < end)
        .collect();
    // Each judged job's steps, computed once for every row.
    let steps: Vec<Vec<Step>> = judged
        .iter()
        .map(|j| {
            let deadline = j.submitted + threshold;
            let until = j.first_step.unwrap_or(deadline).min(deadline);
            let key = scope(j);
            let mut out = Vec::new();
            let mut t = j.submitted + 15_000;
            while t < until {
                out.push(Step {
                    t,
                    waiting_past: waiting_past(&key, j.submitted, t),
                    capacity_queued: capacity_at(&key, t),
                    estimate: if a.estimates { j.estimate_at(t) } else { None },
                });
                t += 15_000;
            }
            out
        })
        .collect();
    // The first breaching urgent job of each crunch (by submit time, submitted within it), among the judged.
    let breached = |j: &Job| j.first_step.is_none_or(|f| f > j.submitted + threshold);
    let mut first_of_crunch: BTreeMap<i64, usize> = BTreeMap::new();
    let mut breached_in_crunch: BTreeMap<i64, usize> = BTreeMap::new();
    for (i, j) in judged.iter().enumerate() {
        if j.gpu_class != "h100" || !breached(j) {
            continue;
        }
        if let Some(w) = windows.iter().find(|(from, to)| (*from..*to).contains(&j.submitted)) {
            *breached_in_crunch.entry(w.0).or_default() += 1;
            let e = first_of_crunch.entry(w.0).or_insert(i);
            if judged[*e].submitted > j.submitted {
                *e = i;
            }
        }
    }
    let crunches_judged = windows.iter().filter(|(from, _)| *from >= judged_from && *from + threshold < end).count();
    // Models every 5 simulated minutes over the judged span (built lazily, cached).
    let step = 5 * MIN;
    let mut models: BTreeMap<i64, WaitModel> = BTreeMap::new();
    let base = PredictSettings {
        confidence: a.confidence,
        min_samples: a.min_samples,
        stall_jobs: a.stall_jobs,
        capacity_jobs: a.capacity_jobs,
        capacity_window_ms: window,
        ..PredictSettings::default()
    };
    let no_history = usize::MAX;
    let mut rows = vec![
        Row { label: "history + stall + capacity (as given)".into(), s: base },
        Row { label: "history + stall (`--capacity-jobs 0`)".into(), s: PredictSettings { capacity_jobs: 0, ..base } },
        Row { label: "history alone".into(), s: PredictSettings { capacity_jobs: 0, stall_jobs: 0, ..base } },
    ];
    for n in [1, 2, 3, 5, 8] {
        rows.push(Row {
            label: format!("capacity alone, `capacity_jobs` {n}"),
            s: PredictSettings { capacity_jobs: n, stall_jobs: 0, min_samples: no_history, ..base },
        });
    }
    println!(
        "Breach prediction on the simulator's fleet ({} days, {} jobs/h, seed {}; H100 crunch of {} min at {:02}:00 UTC every {} day(s), {} in the judged half; judged: {} urgent jobs of the last {} days; threshold {} min; confidence {}, history min_samples {}, lookback {} h, model every 5 min; stall_jobs {}; capacity_jobs {}, capacity window {} min; scheduler estimates {})\n",
        a.days, a.jobs_per_hour, a.seed, a.crunch_minutes, a.crunch_hour, a.crunch_every_days, crunches_judged,
        judged.len(), a.days - a.days / 2, a.threshold_min, a.confidence, a.min_samples, a.lookback_h, a.stall_jobs,
        a.capacity_jobs, a.capacity_window_min, if a.estimates { "replayed" } else { "left out" }
    );
    println!("| bases | breached | warned in advance | median lead time | not breached | false warnings | false per 1,000 urgent | first breach of a crunch warned | warned by |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut details: Vec<String> = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        let s = row.s;
        let (mut n_breached, mut warned, mut ok, mut false_warn) = (0u64, 0u64, 0u64, 0u64);
        let (mut first_warned, mut by) = (0u64, BTreeMap::<&str, u64>::new());
        let mut leads = Vec::new();
        for (i, j) in judged.iter().enumerate() {
            let deadline = j.submitted + threshold;
            let mut first_warning = None;
            for st in &steps[i] {
                let key = st.t.div_euclid(step) * step;
                let m = models.entry(key).or_insert_with(|| model_at(key));
                let w = Waiting {
                    pool: &j.pool,
                    priority: j.priority,
                    submitted_ms: j.submitted,
                    estimated_start_ms: st.estimate,
                    others_waiting_past: st.waiting_past,
                    capacity_queued: st.capacity_queued,
                };
                if let Some(b) = predict(m, &s, w, threshold, st.t) {
                    first_warning = Some((st.t, b));
                    break;
                }
            }
            if let Some((_, b)) = first_warning {
                *by.entry(b.label()).or_default() += 1;
            }
            if !breached(j) {
                ok += 1;
                false_warn += u64::from(first_warning.is_some());
                continue;
            }
            n_breached += 1;
            if let Some((w, _)) = first_warning {
                warned += 1;
                leads.push(deadline - w);
            }
            if let Some((from, _)) = first_of_crunch.iter().find(|(_, k)| **k == i) {
                first_warned += u64::from(first_warning.is_some());
                if r == 0 {
                    details.push(format!(
                        "| {} | {} | +{:.1} min | {} | {} | {} |",
                        fmt_ms(*from),
                        breached_in_crunch.get(from).copied().unwrap_or(0),
                        (j.submitted - from) as f64 / MIN as f64,
                        j.pool,
                        first_warning.map_or("no".to_string(), |(w, _)| format!(
                            "yes, {:.1} min ahead",
                            (deadline - w) as f64 / MIN as f64
                        )),
                        first_warning.map_or("–", |(_, b)| b.label()),
                    ));
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
        let per_1000 = 1000.0 * false_warn as f64 / judged.len().max(1) as f64;
        let by = by.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ");
        println!(
            "| {} | {n_breached} | {} | {median} | {ok} | {} | {per_1000:.1} | {first_warned}/{} | {} |",
            row.label,
            pct(warned, n_breached),
            pct(false_warn, ok),
            first_of_crunch.len(),
            if by.is_empty() { "–".to_string() } else { by }
        );
    }
    println!("\nEach crunch's first breaching urgent job, with the bases as given:\n");
    println!("| crunch from | urgent breaches in it | first submitted | pool | warned | basis |");
    println!("|---|---|---|---|---|---|");
    for d in details {
        println!("{d}");
    }
    println!("\n(elapsed {:.1} s)", started.elapsed().as_secs_f64());
}

/// `2026-01-15 14:00` (UTC).
fn fmt_ms(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let rem = ms.rem_euclid(86_400_000);
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}", rem / 3_600_000, rem % 3_600_000 / MIN)
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}
