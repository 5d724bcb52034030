//! `startline-bench sim`: the fleet simulator's speed and the utilisation its fleet reaches, as the collector
//! computes it.
//!
//! - **generation**: `--jobs` jobs over `--days` days on the default fleet sized for that rate
//!   (`startline_agent::simulate::engine::events`), every event generated and counted: jobs and events per second;
//! - **a simulated week** of the default fleet at 60 jobs an hour: every job's timeline derived with the
//!   collector's code (`JobRecord`), its GPU time accounted (`job::goodput::account`) and each pool priced by the
//!   cost model (`compare::cost`, capacity of the dedicated pools as they are simulated, the demo's prices):
//!   useful utilisation per dedicated pool (productive GPU-hours / capacity x hours) and GPU-hours held.

use startline_agent::simulate::engine::{self, FleetConfig};
use startline_agent::simulate::{arrivals, model};
use startline_collector::compare::cost::{price_pool, CostSection, DedicatedEntry, PoolTally, PriceEntry};
use startline_collector::job::{goodput, CompactEvent, JobRecord};
use startline_proto::pb;
use std::collections::BTreeMap;
use std::time::Instant;

/// Usage of `startline-bench sim`.
pub const USAGE: &str = "usage: startline-bench sim [--jobs N] [--days D] [--seed N]";

/// Options.
#[derive(Debug, Clone)]
pub struct Args {
    /// Jobs generated for the speed figure.
    pub jobs: u64,
    /// Days they arrive over.
    pub days: i64,
    /// Seed.
    pub seed: u64,
}

/// Parses the arguments after the program name; the word `sim` is skipped.
pub fn parse_args(args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args { jobs: 1_000_000, days: 30, seed: 42 };
    let mut it = args.filter(|x| x != "sim");
    while let Some(k) = it.next() {
        let v = it.next().ok_or_else(|| format!("{k}: needs a value; {USAGE}"))?;
        match k.as_str() {
            "--jobs" => a.jobs = v.replace('_', "").parse().map_err(|_| format!("--jobs: {v:?}"))?,
            "--days" => a.days = v.parse().map_err(|_| format!("--days: {v:?}"))?,
            "--seed" => a.seed = v.parse().map_err(|_| format!("--seed: {v:?}"))?,
            other => return Err(format!("unknown option {other}; {USAGE}")),
        }
    }
    Ok(a)
}

/// One pool's figures over the simulated span.
#[derive(Debug, Clone)]
pub struct PoolFigure {
    /// Pool name.
    pub pool: String,
    /// `managed` or `dedicated`.
    pub kind: &'static str,
    /// GPUs of a dedicated pool.
    pub capacity_gpus: Option<u32>,
    /// Jobs counted.
    pub jobs: u64,
    /// GPU-hours of useful training.
    pub productive_gpu_hours: f64,
    /// GPU-hours held (preparing, checkpoints, lost, failed, productive).
    pub held_gpu_hours: f64,
    /// GPU-hours waiting.
    pub waiting_gpu_hours: f64,
    /// Productive GPU-hours / (capacity x hours), as the collector's cost view shows it.
    pub useful_utilisation: Option<f64>,
    /// Cost per useful GPU-hour at the demo's prices.
    pub cost_per_useful_gpu_hour: Option<f64>,
}

/// The default fleet at `jobs_per_hour` for `days` days from 2026-01-01, accounted and priced by the collector's
/// code as of the end of the span.
pub fn fleet_costs(seed: u64, jobs_per_hour: f64, days: i64) -> Vec<PoolFigure> {
    let start = 1_767_225_600_000;
    let end = start + days * 86_400_000;
    let pools = model::fleet(0, 0, jobs_per_hour);
    // The demo's prices (deploy/demo.toml), the dedicated pools at their simulated capacity.
    let section = CostSection {
        currency: None,
        price: vec![
            PriceEntry { selector: "pool=vertex-a3".into(), per_gpu_hour: 11.0 },
            PriceEntry { selector: "pool=sm-p4d".into(), per_gpu_hour: 4.10 },
        ],
        dedicated: pools
            .iter()
            .filter(|p| p.kind == pb::PoolKind::Dedicated)
            .map(|p| DedicatedEntry {
                pool: p.name.into(),
                gpus: p.gpus(),
                per_gpu_hour: if p.gpu_class == "h100" { 2.90 } else { 1.60 },
                capacity: Vec::new(),
            })
            .collect(),
    };
    let mut errs = Vec::new();
    let cost = section.validate(&mut errs);
    assert!(errs.is_empty(), "{errs:?}");
    let n = (jobs_per_hour * days as f64 * 24.0) as u64;
    let times = arrivals(seed, n, start, end);
    let stream = engine::events(FleetConfig::new(seed, pools.clone(), start), times, end);
    let mut tallies: BTreeMap<String, PoolTally> = BTreeMap::new();
    for job in engine::by_job(stream) {
        let evs: Vec<CompactEvent> =
            job.iter().enumerate().filter_map(|(i, e)| CompactEvent::from_pb(e, i as u64)).collect();
        let t = JobRecord::from_events(evs).timeline;
        let (Some(attrs), Some(acc)) = (t.attrs.clone(), goodput::account(&t, end)) else { continue };
        tallies.entry(attrs.pool.clone()).or_default().add(&cost, &attrs, &acc);
    }
    tallies
        .into_iter()
        .map(|(pool, t)| {
            let c = price_pool(&cost, &pool, &t, start, end);
            PoolFigure {
                kind: t.pool_kind,
                capacity_gpus: c.capacity_gpus,
                jobs: t.jobs,
                productive_gpu_hours: t.productive_gpu_hours,
                held_gpu_hours: t.held_gpu_hours,
                waiting_gpu_hours: t.waiting_gpu_hours,
                useful_utilisation: c.useful_utilisation,
                cost_per_useful_gpu_hour: c.cost_per_useful_gpu_hour,
                pool,
            }
        })
        .collect()
}

/// Generates `jobs` jobs over `days` days; returns (jobs submitted, events, seconds).
pub fn generate(seed: u64, jobs: u64, days: i64) -> (u64, u64, f64) {
    let start = 1_767_225_600_000;
    let end = start + days * 86_400_000;
    let rate = jobs as f64 / (days as f64 * 24.0);
    let began = Instant::now();
    let times = arrivals(seed, jobs, start, end);
    let mut stream = engine::events(FleetConfig::new(seed, model::fleet(0, 0, rate), start), times, end);
    let mut events = 0u64;
    for e in stream.by_ref() {
        events += u64::from(e.occurred_at.is_some());
    }
    (stream.jobs_submitted(), events, began.elapsed().as_secs_f64())
}

/// Runs both measurements and prints Markdown tables.
pub fn main(a: Args) {
    let (jobs, events, secs) = generate(a.seed, a.jobs, a.days);
    println!("## Simulator generation ({} jobs over {} days, seed {})\n", a.jobs, a.days, a.seed);
    println!("| jobs | events | seconds | jobs/s | events/s |\n|---|---|---|---|---|");
    println!("| {jobs} | {events} | {secs:.1} | {:.0} | {:.0} |\n", jobs as f64 / secs, events as f64 / secs);
    println!("## A simulated week of the default fleet (60 jobs/h, seed {})\n", a.seed);
    println!("| pool | kind | GPUs | jobs | useful GPU-h | held GPU-h | waiting GPU-h | useful utilisation | cost per useful GPU-h |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for f in fleet_costs(a.seed, 60.0, 7) {
        println!(
            "| {} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {} | {} |",
            f.pool,
            f.kind,
            f.capacity_gpus.map_or("-".into(), |g| g.to_string()),
            f.jobs,
            f.productive_gpu_hours,
            f.held_gpu_hours,
            f.waiting_gpu_hours,
            f.useful_utilisation.map_or("-".into(), |u| format!("{:.1}%", u * 100.0)),
            f.cost_per_useful_gpu_hour.map_or("-".into(), |c| format!("{c:.2}")),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A simulated week through the collector's accounting and cost model: no pool's useful utilisation passes
    /// 100%, useful time never exceeds held time, and the dedicated pools are busy (the daily peak fills them).
    #[test]
    fn a_simulated_week_keeps_every_pool_within_its_capacity() {
        let figures = fleet_costs(42, 60.0, 7);
        assert_eq!(figures.len(), 5, "{figures:?}");
        for f in &figures {
            assert!(f.productive_gpu_hours <= f.held_gpu_hours + 1e-6, "{f:?}");
            match f.kind {
                "dedicated" => {
                    let u = f.useful_utilisation.expect("dedicated pools have a utilisation");
                    let gpus = f64::from(f.capacity_gpus.expect("capacity"));
                    // Independently: held GPU-hours within capacity x the week's hours.
                    assert!(f.held_gpu_hours <= gpus * 7.0 * 24.0, "{f:?}");
                    assert!(u <= 1.0 && u > 0.3, "{}: useful utilisation {u}", f.pool);
                    assert!((u - f.productive_gpu_hours / (gpus * 7.0 * 24.0)).abs() < 1e-9, "{f:?}");
                }
                _ => assert!(f.useful_utilisation.is_none(), "{f:?}"),
            }
        }
    }
}
