//! `startline-agent simulate`: a seeded, deterministic fleet that publishes through the real uplink.
//!
//! The simulation backfills `history` (jobs submitted over the span ending now), emitting events in
//! simulated-time order through a compressed clock (`speedup` simulated seconds per wall second, or as fast as
//! the collector acknowledges with `speedup = 0`), then with `follow` keeps going in real time. Jobs still in
//! flight at the end of the span stay waiting or running, as in a real fleet. `disorder` delays some events
//! and `duplicates` redelivers some, to exercise the collector's order independence and idempotency.

pub mod model;

use crate::rng::Rng;
use crate::uplink::{Publisher, Totals, UplinkError};
use model::{job_events, load_at_hour, Pool};
use startline_proto::pb::{self, lifecycle_event::Kind};
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
    /// Pools in the fleet; 0 = the default four (see [`model::fleet`]).
    pub pools: usize,
    /// GPU classes spread over the pools; 0 = each default pool's own.
    pub gpu_classes: usize,
    /// Share of arrivals that start a chain of stages (see [`CHAIN_STAGES`]); 0 = none.
    pub chains: f64,
    /// Script H100 capacity crunches ([`model::crunches`]): one in the history, one over the hour around its end.
    pub crunch: bool,
}

/// The stages of a simulated chain, in order.
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
        }
    }
}

/// A chain started by arrival `idx`: one job per stage of [`CHAIN_STAGES`], all with chain id `chain/<idx>`, each
/// stage submitted 2-30 minutes (lognormal) after the previous one ended; a stage that did not succeed is retried
/// once (`<stage>-retry`), and a chain whose retry fails too stops there (it stays open).
pub fn chain_jobs(seed: u64, idx: u64, submit_ms: i64, pools: &[Pool]) -> Vec<Vec<pb::LifecycleEvent>> {
    let mut r = Rng::derive(seed ^ 0xC4A1_0000, idx);
    let chain_id = format!("chain/{idx:07}");
    let mut out = Vec::new();
    let mut at = submit_ms;
    let mut n: u64 = 0;
    for stage in CHAIN_STAGES {
        let mut succeeded = false;
        for attempt in 0..2 {
            n += 1;
            // A distinct job index per member (beyond any plain arrival's) keeps ids and randomness apart.
            let mut evs = job_events(seed, (1 << 40) | (idx << 8) | n, at, pools);
            let name = if attempt == 0 { stage.to_string() } else { format!("{stage}-retry") };
            let job_id = format!("{chain_id}/{name}");
            let mut end = at;
            for ev in &mut evs {
                ev.job_id = job_id.clone();
                if let Some(Kind::Submitted(s)) = ev.kind.as_mut() {
                    s.chain_id = chain_id.clone();
                    s.chain_stage = stage.to_string();
                }
                if let Some(Kind::Done(d)) = &ev.kind {
                    succeeded = d.outcome() == pb::Outcome::Succeeded;
                    end = ev.occurred_at.as_ref().map(timestamp_to_ms).unwrap_or(at);
                }
            }
            out.push(evs);
            at = end + (r.lognormal(8.0 * 60_000.0, 0.8).clamp(120_000.0, 1_800_000.0)) as i64;
            if succeeded {
                break;
            }
        }
        if !succeeded {
            break;
        }
    }
    out
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
    heap: BinaryHeap<Scheduled>,
    tie: u64,
    next_job: u64,
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

    fn schedule_job(&mut self, submit_ms: i64) {
        let idx = self.next_job;
        self.next_job += 1;
        if self.settings.chains > 0.0 && self.delivery.chance(self.settings.chains) {
            for evs in chain_jobs(self.settings.seed, idx, submit_ms, &self.pools) {
                self.report.jobs += 1;
                self.emit(evs, submit_ms);
            }
            return;
        }
        self.report.jobs += 1;
        self.emit(job_events(self.settings.seed, idx, submit_ms, &self.pools), submit_ms);
    }

    /// Schedules one job's events, some delivered late or twice as the settings ask.
    fn emit(&mut self, events: Vec<pb::LifecycleEvent>, submit_ms: i64) {
        for ev in events {
            let at = ev.occurred_at.as_ref().map(timestamp_to_ms).unwrap_or(submit_ms);
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
    let mut pools = model::fleet(settings.pools, settings.gpu_classes);
    if settings.crunch {
        for p in pools.iter_mut().filter(|p| p.gpu_class == "h100") {
            p.crunches = model::crunches(end_ms, span_ms);
        }
    }
    let mut sim = Sim {
        delivery: Rng::derive(settings.seed, u64::MAX - 1),
        pools,
        heap: BinaryHeap::new(),
        tie: 0,
        next_job: 0,
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
            sim.schedule_job(times[next_arrival]);
            next_arrival += 1;
        }
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
                    sim.schedule_job(next);
                }
                next += arrivals_rng.exp(1.0 / peak_per_ms).max(1.0) as i64;
            }
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
mod tests {
    use super::*;

    #[test]
    fn same_seed_gives_the_same_jobs() {
        let pools = model::default_pools();
        let a: Vec<_> = (0..50).flat_map(|i| job_events(7, i, 1_767_225_600_000 + i as i64 * 60_000, &pools)).collect();
        let b: Vec<_> = (0..50).flat_map(|i| job_events(7, i, 1_767_225_600_000 + i as i64 * 60_000, &pools)).collect();
        assert_eq!(a, b);
        assert_eq!(arrivals(7, 100, 0, 86_400_000), arrivals(7, 100, 0, 86_400_000));
    }

    #[test]
    fn generated_events_pass_protocol_validation_and_are_time_ordered() {
        let pools = model::default_pools();
        let t0 = 1_767_225_600_000;
        let limits = startline_proto::Limits::default();
        for i in 0..500 {
            let evs = job_events(3, i, t0, &pools);
            assert!(matches!(evs[0].kind, Some(pb::lifecycle_event::Kind::Submitted(_))));
            let mut last = i64::MIN;
            for e in &evs {
                startline_proto::validate::validate_event(e, i64::MAX / 4, &limits).expect("valid");
                let at = timestamp_to_ms(e.occurred_at.as_ref().expect("time"));
                assert!(at >= last, "job {i} events out of order");
                last = at;
            }
        }
    }

    /// The first step a collector counts for a simulated job: the training process's first one, else the first
    /// container start (the simulated runs report one or both per run, the trainer after the container).
    fn first_step(evs: &[pb::LifecycleEvent]) -> Option<&pb::LifecycleEvent> {
        let is = |e: &&pb::LifecycleEvent, o: Option<pb::StepOrigin>| match &e.kind {
            Some(pb::lifecycle_event::Kind::FirstStep(f)) => o.is_none_or(|o| f.origin == o as i32),
            _ => false,
        };
        evs.iter().find(|e| is(e, Some(pb::StepOrigin::TrainingProcess))).or_else(|| evs.iter().find(|e| is(e, None)))
    }

    /// Each managed run reports its container start; SageMaker's training loop then its own first step, after
    /// it, in the same run; Vertex AI's never does; dedicated runs report only the training loop's.
    #[test]
    fn first_steps_come_from_the_container_and_the_training_loop_as_the_pool_reports_them() {
        use pb::lifecycle_event::Kind;
        let pools = model::default_pools();
        let (mut superseded, mut container_only) = (0, 0);
        for i in 0..2000 {
            let evs = job_events(3, i, 1_767_268_800_000, &pools);
            let Some(Kind::Submitted(s)) = &evs[0].kind else { panic!("submitted first") };
            let origins: Vec<(i32, i64)> = evs
                .iter()
                .filter_map(|e| match &e.kind {
                    Some(Kind::FirstStep(f)) => Some((f.origin, timestamp_to_ms(e.occurred_at.as_ref()?))),
                    _ => None,
                })
                .collect();
            let (cs, tp) = (pb::StepOrigin::ContainerStart as i32, pb::StepOrigin::TrainingProcess as i32);
            match (s.pool_kind == pb::PoolKind::Managed as i32, s.provider.as_str()) {
                (false, _) => assert!(origins.iter().all(|(o, _)| *o == tp), "{origins:?}"),
                (true, "vertex") => {
                    assert!(origins.iter().all(|(o, _)| *o == cs), "{origins:?}");
                    container_only += usize::from(!origins.is_empty());
                }
                (true, _) => {
                    // Pairs (a job that failed at its start has a container start alone at the end).
                    for pair in origins.chunks(2).filter(|p| p.len() == 2) {
                        assert_eq!((pair[0].0, pair[1].0), (cs, tp), "{origins:?}");
                        assert!(pair[0].1 <= pair[1].1, "{origins:?}");
                        superseded += 1;
                    }
                }
            }
        }
        assert!(superseded > 100 && container_only > 100, "{superseded} {container_only}");
    }

    #[test]
    fn managed_and_dedicated_waits_differ_and_have_heavy_tails() {
        let pools = model::default_pools();
        let t0 = 1_767_268_800_000; // noon UTC
        let (mut managed, mut dedicated) = (Vec::new(), Vec::new());
        for i in 0..4000 {
            let evs = job_events(11, i, t0, &pools);
            let first = first_step(&evs);
            let (Some(pb::lifecycle_event::Kind::Submitted(s)), Some(f)) = (&evs[0].kind, first) else {
                continue;
            };
            let w = timestamp_to_ms(f.occurred_at.as_ref().expect("t")) - t0;
            if s.pool_kind == pb::PoolKind::Managed as i32 {
                managed.push(w)
            } else {
                dedicated.push(w)
            }
        }
        managed.sort_unstable();
        dedicated.sort_unstable();
        let q = |v: &Vec<i64>, p: f64| v[((v.len() - 1) as f64 * p) as usize];
        assert!(managed.len() > 1000 && dedicated.len() > 1000);
        // Heavy tails: p99 is many times the median in both pools.
        assert!(q(&managed, 0.99) > 4 * q(&managed, 0.5));
        assert!(q(&dedicated, 0.99) > 4 * q(&dedicated, 0.5));
        assert_ne!(q(&managed, 0.5), q(&dedicated, 0.5));
    }

    #[test]
    fn urgent_jobs_start_within_ten_minutes_unless_a_crunch_holds_them_and_the_failing_node_fails_more() {
        let mut pools = model::default_pools();
        let t0 = 1_767_268_800_000; // noon UTC
        let crunch = (t0 + 86_400_000, t0 + 86_400_000 + 3_600_000);
        for p in pools.iter_mut().filter(|p| p.gpu_class == "h100") {
            p.crunches = vec![crunch];
        }
        let ttfs = |evs: &[pb::LifecycleEvent], sub: i64| {
            let first = first_step(evs)?;
            Some(timestamp_to_ms(first.occurred_at.as_ref()?) - sub)
        };
        let (mut urgent, mut late, mut crunched) = (0, 0, Vec::new());
        let (mut on_failing, mut failing_bad, mut elsewhere, mut elsewhere_bad) = (0u32, 0u32, 0u32, 0u32);
        for i in 0..20_000u64 {
            let in_crunch = i % 10 == 0;
            let sub = if in_crunch { crunch.0 + (i as i64 % 3_600) * 1000 } else { t0 + (i as i64 % 86_400) * 1000 };
            let evs = job_events(5, i, sub, &pools);
            let Some(Kind::Submitted(s)) = &evs[0].kind else { panic!("submitted first") };
            if s.priority == pb::PriorityClass::Urgent as i32 {
                let Some(w) = ttfs(&evs, sub) else { continue };
                if in_crunch && s.gpu_class == "h100" {
                    crunched.push(w);
                } else if !in_crunch {
                    urgent += 1;
                    late += i32::from(w > 600_000);
                }
            }
            // Placements on the failing node against the rest of its pool: ended by node_lost or a failure.
            let mut placed: Option<bool> = None;
            for e in &evs {
                match &e.kind {
                    Some(Kind::NodeAssigned(n)) => placed = Some(n.nodes.iter().any(|x| x == model::FAILING_NODE)),
                    Some(Kind::NodeLost(_)) | Some(Kind::Done(_)) | Some(Kind::Preempted(_)) => {
                        if let (Some(f), true) = (placed.take(), s.pool == "a100") {
                            let bad = matches!(&e.kind, Some(Kind::NodeLost(_)))
                                || matches!(&e.kind, Some(Kind::Done(d)) if d.outcome == pb::Outcome::Failed as i32);
                            if f {
                                (on_failing, failing_bad) = (on_failing + 1, failing_bad + u32::from(bad));
                            } else {
                                (elsewhere, elsewhere_bad) = (elsewhere + 1, elsewhere_bad + u32::from(bad));
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        assert!(urgent > 1500, "{urgent} urgent jobs");
        assert!(f64::from(late) / f64::from(urgent) < 0.01, "{late} of {urgent} urgent jobs started after 10 minutes");
        assert!(!crunched.is_empty() && crunched.iter().all(|w| *w > 20 * 60_000), "crunched: {crunched:?}");
        let rate = |bad: u32, all: u32| f64::from(bad) / f64::from(all.max(1));
        assert!(on_failing > 50, "{on_failing} placements on the failing node");
        assert!(
            rate(failing_bad, on_failing) > 3.0 * rate(elsewhere_bad, elsewhere),
            "failing node {failing_bad}/{on_failing} vs the pool {elsewhere_bad}/{elsewhere}"
        );
        // Its correctable errors climb from 40, doubling each day.
        assert_eq!(model::failing_node_ecc(t0, t0), 40);
        assert_eq!(model::failing_node_ecc(t0 + 2 * 86_400_000, t0), 160);
    }

    #[test]
    fn chains_run_their_stages_in_order_each_after_the_previous_one_ended() {
        let pools = model::default_pools();
        let mut retries = 0;
        let mut complete = 0;
        for idx in 0..60u64 {
            let jobs = chain_jobs(5, idx, 1_767_225_600_000 + idx as i64 * 600_000, &pools);
            assert!(!jobs.is_empty());
            let mut prev_end: Option<i64> = None;
            let mut stages = Vec::new();
            for evs in &jobs {
                let sub = evs.iter().find_map(|e| match &e.kind {
                    Some(Kind::Submitted(s)) => Some((s.chain_id.clone(), s.chain_stage.clone())),
                    _ => None,
                });
                let (chain, stage) = sub.expect("submitted");
                assert_eq!(chain, format!("chain/{idx:07}"));
                assert!(evs.iter().all(|e| e.job_id.starts_with(&chain)), "members are named after their chain");
                let submit = evs.iter().filter_map(|e| e.occurred_at.as_ref().map(timestamp_to_ms)).min().expect("t");
                if let Some(end) = prev_end {
                    assert!(submit >= end + 120_000, "a stage starts 2-30 min after the previous one ended");
                }
                let done = evs.iter().find_map(|e| match &e.kind {
                    Some(Kind::Done(d)) => {
                        Some((e.occurred_at.as_ref().map(timestamp_to_ms).unwrap_or(0), d.outcome()))
                    }
                    _ => None,
                });
                let (end, _) = done.expect("every simulated job ends");
                prev_end = Some(end);
                if stages.last() == Some(&stage) {
                    retries += 1;
                }
                stages.push(stage);
            }
            let mut distinct = stages.clone();
            distinct.dedup();
            assert_eq!(distinct, CHAIN_STAGES[..distinct.len()].to_vec(), "stages in order");
            if distinct.len() == CHAIN_STAGES.len() {
                complete += 1;
            }
            // Deterministic: the same seed and arrival give the same chain.
            assert_eq!(jobs, chain_jobs(5, idx, 1_767_225_600_000 + idx as i64 * 600_000, &pools));
        }
        assert!(complete > 40, "most chains reach quantize ({complete} of 60)");
        assert!(retries > 0, "some stage failed and was retried");
    }
}
