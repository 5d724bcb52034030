//! `startline-agent simulate`: a seeded, deterministic fleet that publishes through the real uplink.
//!
//! The fleet is a discrete-event simulation ([`engine`]): jobs queue on their pools' capacity (nodes of GPUs,
//! managed quotas and stock-outs) in priority order, urgent jobs preempt, and waits come from the load. The
//! simulation backfills `history` (jobs submitted over the span ending now), emitting events in simulated-time
//! order through a compressed clock (`speedup` simulated seconds per wall second, or as fast as the collector
//! acknowledges with `speedup = 0`), then with `follow` keeps going in real time. Jobs still in flight at the end
//! of the span stay waiting or running, as in a real fleet. `disorder` delays some events and `duplicates`
//! redelivers some, to exercise the collector's order independence and idempotency.
//!
//! As a library: [`engine::simulate`] (or the streaming [`engine::events`]) yields a fleet's events over a time
//! range and each run's true start, for checking start-time estimates.

pub mod engine;
pub mod model;

use crate::rng::Rng;
use crate::uplink::{Publisher, Totals, UplinkError};
use engine::{FleetConfig, FleetSim};
use model::{load_at_hour, Pool};
use startline_proto::pb;
use startline_proto::time::timestamp_to_ms;
use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Options of a simulation.
#[derive(Debug, Clone)]
pub struct SimSettings {
    /// Seed: the same seed gives the same jobs and events.
    pub seed: u64,
    /// The simulated span before `end_ms` to backfill.
    pub history: Duration,
    /// Jobs submitted over the history span; when `None`, `jobs_per_hour` decides.
    pub jobs: Option<u64>,
    /// Average arrivals per hour (used for follow mode, and for history when `jobs` is `None`).
    pub jobs_per_hour: f64,
    /// Simulated seconds per wall second during the backfill; 0 = as fast as possible.
    pub speedup: f64,
    /// Most events per wall second sent; 0 = unlimited.
    pub rate: f64,
    /// After the backfill, keep simulating in real time until stopped.
    pub follow: bool,
    /// Probability that an event is delivered late (up to 10 simulated minutes).
    pub disorder: f64,
    /// Probability that an event is delivered twice.
    pub duplicates: f64,
    /// Events per batch.
    pub batch_size: usize,
    /// End of the history span (Unix ms); `None` = now.
    pub end_ms: Option<i64>,
    /// Pools in the fleet; 0 = the default five (see [`model::fleet`]).
    pub pools: usize,
    /// GPU classes spread over the pools; 0 = each default pool's own.
    pub gpu_classes: usize,
    /// Share of arrivals that start a chain of stages (see [`CHAIN_STAGES`]); 0 = none.
    pub chains: f64,
    /// Script H100 capacity crunches ([`model::crunches`]): one in the history, one over the hour around its end.
    pub crunch: bool,
    /// Slurm pools backfill (else they start jobs in strict priority order).
    pub backfill: bool,
}

/// The stages of a simulated chain, in order: one job per stage, all with chain id `chain/<idx>`, each stage
/// submitted 2-30 minutes (lognormal) after the previous one ended; a stage that did not succeed is retried once
/// (`<stage>-retry`), and a chain whose retry fails too stops there (it stays open).
pub const CHAIN_STAGES: [&str; 4] = ["train", "evaluate", "merge", "quantize"];

impl Default for SimSettings {
    fn default() -> Self {
        SimSettings {
            seed: 42,
            history: Duration::from_secs(7 * 86_400),
            jobs: None,
            jobs_per_hour: 60.0,
            speedup: 0.0,
            rate: 0.0,
            follow: false,
            disorder: 0.0,
            duplicates: 0.0,
            batch_size: 1000,
            end_ms: None,
            pools: 0,
            gpu_classes: 0,
            chains: 0.0,
            crunch: false,
            backfill: true,
        }
    }
}

/// What a simulation did.
#[derive(Debug, Clone, Default)]
pub struct SimReport {
    /// Jobs submitted.
    pub jobs: u64,
    /// Events sent (including redeliveries).
    pub events_sent: u64,
    /// The collector's answers.
    pub totals: Totals,
    /// GPU health readings the collector acknowledged.
    pub health_readings: u64,
}

/// Arrival times of `n` jobs over `[start, end)`, following the time-of-day load, sorted. Deterministic.
pub fn arrivals(seed: u64, n: u64, start_ms: i64, end_ms: i64) -> Vec<i64> {
    let mut r = Rng::derive(seed, u64::MAX);
    let span = (end_ms - start_ms).max(1) as f64;
    let mut out = Vec::with_capacity(n as usize);
    while (out.len() as u64) < n {
        let t = start_ms + (r.f64() * span) as i64;
        if r.f64() < load_at_hour((t.rem_euclid(86_400_000)) as f64 / 3_600_000.0) {
            out.push(t);
        }
    }
    out.sort_unstable();
    out
}

struct Scheduled {
    emit_at: i64,
    tie: u64,
    event: pb::LifecycleEvent,
}

impl PartialEq for Scheduled {
    fn eq(&self, o: &Self) -> bool {
        (self.emit_at, self.tie) == (o.emit_at, o.tie)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Scheduled {
    // Reversed: BinaryHeap is a max-heap and we want the earliest first.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.emit_at, o.tie).cmp(&(self.emit_at, self.tie))
    }
}

/// The simulation's state between clock steps.
struct Sim {
    settings: SimSettings,
    pools: Vec<Pool>,
    fleet: FleetSim,
    heap: BinaryHeap<Scheduled>,
    tie: u64,
    delivery: Rng,
    batch: Vec<pb::LifecycleEvent>,
    report: SimReport,
    rate_window: (tokio::time::Instant, u64),
    /// When the simulation's span began (the failing node's errors climb from here).
    start_ms: i64,
    /// Set once the collector refuses health readings (e.g. an older collector): not tried again.
    health_off: bool,
}

impl Sim {
    /// Reports every dedicated node's GPU health as of `at_ms` (8 GPUs each; the failing node's third GPU carries
    /// its climbing correctable ECC count, a few healthy nodes hold a couple of old errors).
    async fn report_health(&mut self, at_ms: i64, up: &mut Publisher) {
        if self.health_off {
            return;
        }
        let mut reports = Vec::new();
        for pool in self.pools.iter().filter(|p| p.nodes > 0) {
            for n in 0..pool.nodes {
                let failing = pool.failing_node == Some(n);
                let gpus = (0..8u32)
                    .map(|g| pb::GpuHealth {
                        index: g,
                        uuid: format!(
                            "GPU-{:08x}-{n:03}-{g}",
                            startline_proto::hash::fnv1a64(pool.name.as_bytes()) as u32
                        ),
                        ecc_corrected: Some(match (failing, g) {
                            (true, 3) => model::failing_node_ecc(at_ms, self.start_ms),
                            (false, 0) if n % 7 == 0 => 2,
                            _ => 0,
                        }),
                        ecc_uncorrected: Some(0),
                        xid_errors: Vec::new(),
                        temperature_c: Some(40.0 + f64::from((n + g) % 9)),
                    })
                    .collect();
                reports.push(pb::NodeHealth {
                    node: model::node_name(pool.name, n),
                    observed_at: Some(startline_proto::time::ms_to_timestamp(at_ms)),
                    source: "sim/node-agent".into(),
                    gpus,
                });
            }
        }
        for chunk in reports.chunks(500) {
            match up.report_health(pb::ReportHealthRequest { reports: chunk.to_vec() }).await {
                Ok(r) => self.report.health_readings += u64::from(r.accepted),
                Err(e) => {
                    tracing::warn!(error = %e, "the collector did not take GPU health readings; not sending more");
                    self.health_off = true;
                    return;
                }
            }
        }
    }

    /// Moves the fleet to `until` and schedules what it emitted for delivery.
    fn advance(&mut self, until: i64) {
        self.fleet.advance(until);
        let events: Vec<pb::LifecycleEvent> = self.fleet.take_events().collect();
        self.report.jobs = self.fleet.jobs_submitted();
        self.emit(events);
    }

    /// Schedules one job's events, some delivered late or twice as the settings ask.
    fn emit(&mut self, events: Vec<pb::LifecycleEvent>) {
        for ev in events {
            let at = ev.occurred_at.as_ref().map(timestamp_to_ms).unwrap_or(0);
            if self.settings.duplicates > 0.0 && self.delivery.chance(self.settings.duplicates) {
                let later = at + (self.delivery.uniform(0.0, 30.0) * 60_000.0) as i64;
                self.push(later, ev.clone());
            }
            let emit_at = if self.settings.disorder > 0.0 && self.delivery.chance(self.settings.disorder) {
                at + (self.delivery.uniform(0.0, 10.0) * 60_000.0) as i64
            } else {
                at
            };
            self.push(emit_at, ev);
        }
    }

    fn push(&mut self, emit_at: i64, event: pb::LifecycleEvent) {
        self.tie += 1;
        self.heap.push(Scheduled { emit_at, tie: self.tie, event });
    }

    /// Sends every event due by `until`.
    async fn emit_until(&mut self, until: i64, up: &mut Publisher) -> Result<(), UplinkError> {
        while self.heap.peek().is_some_and(|s| s.emit_at <= until) {
            let Some(s) = self.heap.pop() else { break };
            self.batch.push(s.event);
            self.report.events_sent += 1;
            if self.batch.len() >= self.settings.batch_size {
                self.send_batch(up).await?;
            }
        }
        Ok(())
    }

    async fn send_batch(&mut self, up: &mut Publisher) -> Result<(), UplinkError> {
        let n = self.batch.len() as u64;
        if n == 0 {
            return Ok(());
        }
        if self.settings.rate > 0.0 {
            // Simple pacing: never exceed `rate` events per wall second on average.
            let (start, sent) = self.rate_window;
            let due = start + Duration::from_secs_f64((sent + n) as f64 / self.settings.rate);
            tokio::time::sleep_until(due).await;
            self.rate_window.1 += n;
        }
        up.send(std::mem::take(&mut self.batch)).await
    }
}

/// Runs a simulation, publishing through `up`, until the backfill is done (and, with `follow`, until `stop`).
pub async fn run(settings: SimSettings, up: &mut Publisher, stop: CancellationToken) -> Result<SimReport, UplinkError> {
    let end_ms = settings.end_ms.unwrap_or_else(startline_proto::time::now_ms);
    let span_ms = i64::try_from(settings.history.as_millis()).unwrap_or(i64::MAX / 2);
    let start_ms = end_ms - span_ms;
    let n = settings.jobs.unwrap_or_else(|| (settings.jobs_per_hour * span_ms as f64 / 3_600_000.0).round() as u64);
    let times = arrivals(settings.seed, n, start_ms, end_ms);
    // Capacity follows the arrival rate of the history (or of --jobs-per-hour when following without one).
    let rate = if span_ms > 0 && n > 0 { n as f64 * 3_600_000.0 / span_ms as f64 } else { settings.jobs_per_hour };
    let mut pools = model::fleet(settings.pools, settings.gpu_classes, rate);
    if settings.crunch {
        for p in pools.iter_mut().filter(|p| p.gpu_class == "h100") {
            p.crunches = model::crunches(end_ms, span_ms);
        }
    }
    let fleet = FleetSim::new(FleetConfig {
        seed: settings.seed,
        pools: pools.clone(),
        chains: settings.chains,
        start_ms,
        backfill: settings.backfill,
        trace: false,
    });
    let mut sim = Sim {
        delivery: Rng::derive(settings.seed, u64::MAX - 1),
        pools,
        fleet,
        heap: BinaryHeap::new(),
        tie: 0,
        batch: Vec::with_capacity(settings.batch_size),
        report: SimReport::default(),
        rate_window: (tokio::time::Instant::now(), 0),
        start_ms,
        health_off: false,
        settings,
    };

    // Backfill: advance the simulated clock in steps of at most one simulated hour.
    let wall_start = tokio::time::Instant::now();
    let mut clock = start_ms;
    let mut last_health = i64::MIN / 2;
    let mut next_arrival = 0usize;
    while clock < end_ms {
        if stop.is_cancelled() {
            break;
        }
        let step_end = if sim.settings.speedup > 0.0 {
            let target = start_ms + (wall_start.elapsed().as_secs_f64() * sim.settings.speedup * 1000.0) as i64;
            if target <= clock {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            target.min(clock + 3_600_000).min(end_ms)
        } else {
            (clock + 3_600_000).min(end_ms)
        };
        while next_arrival < times.len() && times[next_arrival] <= step_end {
            sim.fleet.submit(times[next_arrival]);
            next_arrival += 1;
        }
        sim.advance(step_end);
        sim.emit_until(step_end, up).await?;
        if step_end - last_health >= 3_600_000 || step_end == end_ms {
            sim.report_health(step_end, up).await;
            last_health = step_end;
        }
        clock = step_end;
    }
    sim.send_batch(up).await?;

    if sim.settings.follow {
        tracing::info!(jobs = sim.report.jobs, events = sim.report.events_sent, "history done; following in real time");
        let mut arrivals_rng = Rng::derive(sim.settings.seed, u64::MAX - 2);
        let peak_per_ms = sim.settings.jobs_per_hour / 0.675 / 3_600_000.0;
        let mut next = clock + arrivals_rng.exp(1.0 / peak_per_ms) as i64;
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        while !stop.is_cancelled() {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => break,
            }
            let now = startline_proto::time::now_ms();
            while next <= now {
                // Thinning: accept an arrival with the load of its hour.
                if arrivals_rng.f64() < load_at_hour((next.rem_euclid(86_400_000)) as f64 / 3_600_000.0) {
                    sim.fleet.submit(next);
                }
                next += arrivals_rng.exp(1.0 / peak_per_ms).max(1.0) as i64;
            }
            sim.advance(now);
            sim.emit_until(now, up).await?;
            sim.send_batch(up).await?;
            if now - last_health >= 600_000 {
                sim.report_health(now, up).await;
                last_health = now;
            }
        }
    }
    up.flush().await?;
    sim.report.totals = up.totals().clone();
    Ok(sim.report)
}

#[cfg(test)]
mod tests;
