//! The crash-trial harness: drives a real `startline-collector` process through randomized sequences of
//! streaming on several gRPC connections, `kill -9` at random moments (during checkpoints, during retention,
//! during a graceful shutdown), SIGTERM and restarts, and after every restart compares what the collector serves
//! with a model of what it acknowledged (the oracle).
//!
//! The model is independent of the collector's code: it knows which events were acknowledged (and which were in
//! flight when the process died, so may or may not be stored), and derives each job's state and the urgent-start
//! SLO counts with its own simple rules over lifecycles generated so those rules are exact:
//! - every acknowledged event is in its job's `events` and is answered as a duplicate when sent again;
//! - no event is stored that was never sent (in-flight events may or may not be);
//! - a job's `state` is the state of its latest stored lifecycle event (`unsubmitted` without `submitted`);
//! - `urgent-start` counts, over its 28-day window: total = urgent jobs with `submitted` stored, good = those
//!   whose `first_step` is stored and came within 10 minutes (every job was submitted over an hour ago, so a job
//!   not started yet is already bad).
//!
//! Jobs that ended 40 days ago are sent whole in one batch: retention (30 days, checked every 100 ms in half of
//! the trials) deletes them at any moment, so each must be either absent or complete.
//!
//! Run it with `cargo run --release -p startline-tests --bin startline-crashtrial -- --trials 100` (after
//! `cargo build --release --bins`); the test suite runs a short version.

use crate::{event, http_get, path_escape, Collector};
use startline_proto::pb::{self, ingest_service_client::IngestServiceClient, lifecycle_event::Kind};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_stream::wrappers::ReceiverStream;

/// What to run.
#[derive(Debug, Clone)]
pub struct TrialConfig {
    /// Number of trials (each on a fresh store).
    pub trials: u32,
    /// Seed of the first trial; trial `i` uses `seed + i`.
    pub seed: u64,
    /// Crash/restart cycles per trial: a random number in this range (inclusive).
    pub cycles: (u32, u32),
    /// Longest streaming phase before a fault, milliseconds.
    pub max_phase_ms: u64,
    /// Print one line per cycle.
    pub verbose: bool,
}

impl Default for TrialConfig {
    fn default() -> Self {
        TrialConfig { trials: 100, seed: 1, cycles: (3, 6), max_phase_ms: 3000, verbose: false }
    }
}

/// What the trials found.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Trials run.
    pub trials: u32,
    /// Restarts verified.
    pub restarts: u32,
    /// Faults by kind.
    pub kills: u32,
    /// Graceful stops (SIGTERM, exit 0 expected).
    pub terms: u32,
    /// SIGTERM followed by kill -9 during the shutdown.
    pub kills_during_shutdown: u32,
    /// Distinct events acknowledged (first time) over all trials.
    pub acked_events: u64,
    /// Batches acknowledged.
    pub acked_batches: u64,
    /// Acknowledged events missing after a restart.
    pub lost: u64,
    /// Stored events never sent.
    pub phantom: u64,
    /// Acknowledged events answered `accepted` (not duplicate) when sent again.
    pub not_duplicate: u64,
    /// Jobs whose state differed from the model.
    pub state_mismatches: u64,
    /// SLO count comparisons that differed.
    pub slo_mismatches: u64,
    /// Ancient jobs found incomplete (retention must delete a job whole).
    pub partial_expired: u64,
    /// Stream out findings: a cursor gap or repeat, an acknowledged event missing from the stream, an event in
    /// it twice or never sent, a change naming no earlier event, a job whose last change is not its state.
    pub stream_mismatches: u64,
    /// Each trial's store after its last stop: bytes allocated on disk, live bytes (`store-stats`).
    pub space: Vec<(u64, u64)>,
    /// The largest value in sled after any trial, bytes.
    pub largest_sled_value: u64,
    /// Stream records read back over all restarts.
    pub stream_records: u64,
    /// Of them, expected-start changes.
    pub expected_start_records: u64,
    /// The first few failures, described.
    pub failures: Vec<String>,
}

impl Report {
    /// Whether every check passed.
    pub fn ok(&self) -> bool {
        self.lost == 0
            && self.phantom == 0
            && self.not_duplicate == 0
            && self.state_mismatches == 0
            && self.slo_mismatches == 0
            && self.partial_expired == 0
            && self.stream_mismatches == 0
            && self.failures.is_empty()
    }

    fn fail(&mut self, what: String) {
        if self.failures.len() < 20 {
            self.failures.push(what);
        }
    }

    /// A summary for humans.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "trials {} · restarts verified {} · faults: kill -9 {}, SIGTERM {}, kill -9 during shutdown {}",
            self.trials, self.restarts, self.kills, self.terms, self.kills_during_shutdown
        );
        let _ = writeln!(s, "events acknowledged {} in {} batches", self.acked_events, self.acked_batches);
        let _ = writeln!(
            s,
            "lost {} · phantom {} · acked but not duplicate {} · state mismatches {} · SLO mismatches {} · partially expired {}",
            self.lost, self.phantom, self.not_duplicate, self.state_mismatches, self.slo_mismatches, self.partial_expired
        );
        let _ = writeln!(
            s,
            "stream out: {} records read back after restarts ({} expected-start changes), {} mismatches",
            self.stream_records, self.expected_start_records, self.stream_mismatches
        );
        if let Some(worst) = self.space.iter().map(|&(a, l)| a as f64 / l.max(1) as f64).reduce(f64::max) {
            let (a, l) = self.space.iter().fold((0u64, 0u64), |(a, l), &(x, y)| (a + x, l + y));
            let _ = writeln!(
                s,
                "store space: {a} bytes allocated for {l} live ({:.2}x over all trials, worst trial {worst:.2}x), largest sled value {} bytes",
                a as f64 / l.max(1) as f64,
                self.largest_sled_value
            );
        }
        for f in &self.failures {
            let _ = writeln!(s, "FAILURE: {f}");
        }
        s
    }
}

/// SplitMix64: small, seedable, good enough to pick operations.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// The lifecycle stage of an event, in the order a job goes through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    Submitted,
    Queued,
    Assigned,
    Preparing,
    Running,
    /// A checkpoint: changes no state (a checkpoint without a stored first step starts no run).
    Checkpoint,
    Done,
}

impl Stage {
    fn label(self) -> &'static str {
        match self {
            Stage::Submitted | Stage::Queued => "queued",
            Stage::Assigned => "assigned",
            Stage::Preparing => "preparing",
            Stage::Running | Stage::Checkpoint => "running",
            Stage::Done => "done",
        }
    }
}

/// One generated job: its whole lifecycle, fixed up front.
#[derive(Debug, Clone)]
struct JobPlan {
    id: String,
    urgent: bool,
    ancient: bool,
    submitted_at: i64,
    first_step_at: i64,
    events: Vec<(pb::LifecycleEvent, Stage)>,
}

fn plan_job(rng: &mut Rng, n: usize, now: i64) -> JobPlan {
    let ancient = rng.chance(0.08);
    let urgent = rng.chance(0.5);
    let id = format!("trial/{}/{n}", if ancient { "old" } else { "job" });
    let t0 = if ancient { now - 40 * 86_400_000 } else { now - rng.range(3_600_000, 20 * 3_600_000) as i64 };
    let ttfs = rng.range(60_000, 1_800_000) as i64;
    let prio = if urgent { pb::PriorityClass::Urgent } else { pb::PriorityClass::Normal };
    let pool_kind = if rng.chance(0.5) { pb::PoolKind::Managed } else { pb::PoolKind::Dedicated };
    let mut submitted = crate::submitted(pool_kind, prio, 8);
    // Some jobs have an attribute set of their own (a label): its dictionary entry goes with the job's row when
    // retention deletes or a late event unfolds it, so kills land around those deletions too.
    if let (Kind::Submitted(s), true) = (&mut submitted, rng.chance(0.3)) {
        s.labels.insert("run".into(), format!("r{n}"));
    }
    let mut evs = vec![(event(&id, "s", t0, submitted), Stage::Submitted)];
    evs.push((
        event(
            &id,
            "q",
            t0 + 1000,
            Kind::Queued(pb::Queued { reason: pb::WaitReason::Capacity as i32, ..Default::default() }),
        ),
        Stage::Queued,
    ));
    evs.push((event(&id, "a", t0 + ttfs / 2, Kind::NodeAssigned(pb::NodeAssigned::default())), Stage::Assigned));
    evs.push((
        event(
            &id,
            "p",
            t0 + ttfs * 3 / 4,
            Kind::Preparing(pb::Preparing { phase: pb::PreparingPhase::ImagePull as i32, ..Default::default() }),
        ),
        Stage::Preparing,
    ));
    evs.push((
        event(&id, "f", t0 + ttfs, Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })),
        Stage::Running,
    ));
    let ckpts = rng.range(0, 6);
    for k in 1..=ckpts {
        evs.push((
            event(
                &id,
                &format!("c{k}"),
                t0 + ttfs + k as i64 * 60_000,
                Kind::Checkpoint(pb::Checkpoint { step: k * 100, ..Default::default() }),
            ),
            Stage::Checkpoint,
        ));
    }
    if ancient || rng.chance(0.6) {
        evs.push((
            event(
                &id,
                "d",
                t0 + ttfs + 10 * 60_000,
                Kind::Done(pb::Done { outcome: pb::Outcome::Succeeded as i32, ..Default::default() }),
            ),
            Stage::Done,
        ));
    }
    JobPlan { id, urgent, ancient, submitted_at: t0, first_step_at: t0 + ttfs, events: evs }
}

/// What the model knows.
#[derive(Debug, Default)]
struct Model {
    jobs: Vec<JobPlan>,
    /// (job index, event index) acknowledged (and, for ancient jobs, not yet seen expired).
    acked: BTreeSet<(usize, usize)>,
    /// In flight when a stream failed: may or may not be stored.
    maybe: BTreeSet<(usize, usize)>,
    /// Distinct events ever acknowledged.
    acked_total: u64,
    batches: u64,
}

impl Model {
    fn on_ack(&mut self, batch: &[(usize, usize)]) {
        self.batches += 1;
        for k in batch {
            self.maybe.remove(k);
            if self.acked.insert(*k) {
                self.acked_total += 1;
            }
        }
    }
}

/// Builds the next batch: events of a few jobs (new or known), in random order, sometimes with events already
/// acknowledged; or one ancient job whole.
fn next_batch(rng: &mut Rng, model: &Mutex<Model>, now: i64) -> Vec<(usize, usize)> {
    let mut m = model.lock().unwrap_or_else(|p| p.into_inner());
    let want_new = m.jobs.len() < 8 || rng.chance(0.3);
    if want_new {
        let n = m.jobs.len();
        let plan = plan_job(rng, n, now);
        let whole = plan.ancient;
        let count = plan.events.len();
        m.jobs.push(plan);
        if whole {
            return (0..count).map(|e| (n, e)).collect();
        }
    }
    let size = rng.range(1, 300) as usize;
    let mut out = Vec::with_capacity(size);
    let jobs = m.jobs.len();
    for _ in 0..size {
        let j = (jobs - 1).saturating_sub(rng.range(0, 40.min(jobs as u64 - 1)) as usize);
        if m.jobs[j].ancient {
            continue;
        }
        let e = rng.range(0, m.jobs[j].events.len() as u64 - 1) as usize;
        out.push((j, e));
    }
    out
}

/// Streams batches on one connection until `stop` fires or the stream fails. Up to 4 batches in flight.
async fn stream(endpoint: String, model: Arc<Mutex<Model>>, seed: u64, stop: tokio_util::sync::CancellationToken) {
    let mut rng = Rng::new(seed);
    let Ok(mut client) = IngestServiceClient::connect(endpoint).await else { return };
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let Ok(resp) = client.publish(ReceiverStream::new(rx)).await else { return };
    let mut acks = resp.into_inner();
    let mut in_flight: std::collections::VecDeque<(u64, Vec<(usize, usize)>)> = Default::default();
    let mut seq = 0u64;
    let now = startline_proto::time::now_ms();
    let finish = |model: &Mutex<Model>, in_flight: std::collections::VecDeque<(u64, Vec<(usize, usize)>)>| {
        let mut m = model.lock().unwrap_or_else(|p| p.into_inner());
        for (_, b) in in_flight {
            for k in b {
                if !m.acked.contains(&k) {
                    m.maybe.insert(k);
                }
            }
        }
    };
    loop {
        if stop.is_cancelled() {
            break;
        }
        let batch = next_batch(&mut rng, &model, now);
        if batch.is_empty() {
            continue;
        }
        seq += 1;
        let events: Vec<pb::LifecycleEvent> = {
            let m = model.lock().unwrap_or_else(|p| p.into_inner());
            batch.iter().map(|(j, e)| m.jobs[*j].events[*e].0.clone()).collect()
        };
        in_flight.push_back((seq, batch));
        if tx.send(pb::PublishRequest { batch_seq: seq, events }).await.is_err() {
            finish(&model, in_flight);
            return;
        }
        while in_flight.len() >= 4 {
            let msg = tokio::select! {
                m = acks.message() => m,
                _ = stop.cancelled() => { finish(&model, in_flight); return; }
            };
            match msg {
                Ok(Some(ack)) => {
                    let Some((s, b)) = in_flight.pop_front() else { return };
                    let mut m = model.lock().unwrap_or_else(|p| p.into_inner());
                    if ack.batch_seq != s
                        || !ack.rejections.is_empty()
                        || (ack.accepted + ack.duplicates) as usize != b.len()
                    {
                        // A protocol violation: the task's panic reaches the report as a failed client.
                        drop(m);
                        panic!("bad ack for batch {s}: {ack:?} (batch of {})", b.len());
                    }
                    m.on_ack(&b);
                }
                _ => {
                    finish(&model, in_flight);
                    return;
                }
            }
        }
    }
    // Stop: close our side and collect the acks still due (the server may be gone).
    drop(tx);
    while let Ok(Ok(Some(ack))) = tokio::time::timeout(Duration::from_secs(5), acks.message()).await {
        let Some((s, b)) = in_flight.pop_front() else { break };
        if ack.batch_seq == s {
            model.lock().unwrap_or_else(|p| p.into_inner()).on_ack(&b);
        } else {
            in_flight.push_front((s, b));
            break;
        }
    }
    finish(&model, in_flight);
}

fn write_config(dir: &Path, rng: &mut Rng) -> (std::path::PathBuf, String) {
    // Log-uniform checkpoint interval, 10 ms to 10 s.
    let exp = rng.range(0, 1000) as f64 / 1000.0 * 3.0;
    let checkpoint_ms = (10.0 * 10f64.powf(exp)) as u64;
    let fast_retention = rng.chance(0.5);
    // The smallest log segments: appends roll to new files often, and compaction and retention rewrite them.
    let mut toml =
        format!("[store]\ncheckpoint_interval = \"{checkpoint_ms}ms\"\nretention = \"30d\"\nlog_segment_kib = 64\n");
    if fast_retention {
        toml.push_str("retention_interval = \"100ms\"\n");
    }
    // Folding: in two trials of three, ended jobs leave memory after 0-400 ms (so kills land during folds, and
    // duplicates and late events reach folded jobs); otherwise after the default 5 minutes (never, here).
    let fold = rng.chance(0.67).then(|| rng.range(0, 400));
    if let Some(ms) = fold {
        toml.push_str(&format!("fold_after = \"{}ms\"\nfold_interval = \"50ms\"\n", ms.max(1)));
    }
    // Every waiting job estimated each second, so the stream's expected-start changes race kills and restarts.
    toml.push_str("[stream]\nexpected_start_interval = \"1s\"\n");
    let path = dir.join("collector.toml");
    std::fs::write(&path, &toml).expect("write config");
    (
        path,
        format!(
            "checkpoint {checkpoint_ms} ms, retention pass every {}, {}",
            if fast_retention { "100 ms" } else { "10 min" },
            match fold {
                Some(ms) => format!("fold after {} ms", ms.max(1)),
                None => "no folding".to_string(),
            }
        ),
    )
}

/// Runs the trials; returns what they found (never panics on a finding: the report says it).
pub async fn run(cfg: &TrialConfig) -> Report {
    let mut report = Report::default();
    for t in 0..cfg.trials {
        let seed = cfg.seed.wrapping_add(u64::from(t));
        trial(cfg, seed, &mut report).await;
        report.trials += 1;
        if !report.failures.is_empty() {
            break;
        }
    }
    report
}

async fn trial(cfg: &TrialConfig, seed: u64, report: &mut Report) {
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("db");
    let (config, described) = write_config(dir.path(), &mut rng);
    let config_arg = config.to_str().expect("utf-8 temp path").to_string();
    let model = Arc::new(Mutex::new(Model::default()));
    let cycles = rng.range(u64::from(cfg.cycles.0), u64::from(cfg.cycles.1));
    let mut collector = Collector::start(&db, &["--config", &config_arg]);
    for cycle in 0..cycles {
        let stop = tokio_util::sync::CancellationToken::new();
        let conns = rng.range(2, 4);
        let clients: Vec<_> = (0..conns)
            .map(|c| tokio::spawn(stream(collector.endpoint(), model.clone(), rng.next_u64() ^ c, stop.clone())))
            .collect();
        let phase = Duration::from_millis(rng.range(50, cfg.max_phase_ms.max(51)));
        tokio::time::sleep(phase).await;
        let fault = rng.range(0, 9);
        let what = match fault {
            0..=5 => {
                report.kills += 1;
                let st = collector.signal_and_wait("KILL");
                if st.success() {
                    report.fail(format!("seed {seed} cycle {cycle}: kill -9 exited successfully?"));
                }
                "kill -9"
            }
            6..=7 => {
                report.terms += 1;
                let st = collector.signal_and_wait("TERM");
                if !st.success() {
                    report.fail(format!("seed {seed} cycle {cycle}: SIGTERM exit status {st:?}"));
                }
                "SIGTERM"
            }
            _ => {
                report.kills_during_shutdown += 1;
                let pid = collector.child.id().to_string();
                let _ = std::process::Command::new("kill").args(["-TERM", &pid]).status();
                tokio::time::sleep(Duration::from_millis(rng.range(0, 300))).await;
                let _ = collector.signal_and_wait("KILL");
                "SIGTERM then kill -9"
            }
        };
        stop.cancel();
        for c in clients {
            if let Err(e) = c.await {
                report.fail(format!("seed {seed} cycle {cycle}: client task failed: {e}"));
            }
        }
        collector = Collector::start(&db, &["--config", &config_arg]);
        report.restarts += 1;
        let before = report.lost
            + report.phantom
            + report.state_mismatches
            + report.slo_mismatches
            + report.not_duplicate
            + report.stream_mismatches;
        verify(&collector, &model, seed, cycle, report).await;
        let after = report.lost
            + report.phantom
            + report.state_mismatches
            + report.slo_mismatches
            + report.not_duplicate
            + report.stream_mismatches;
        if cfg.verbose {
            let m = model.lock().unwrap_or_else(|p| p.into_inner());
            println!(
                "seed {seed} ({described}) cycle {cycle}: {what} after {} ms; {} jobs, {} events acked; {}",
                phase.as_millis(),
                m.jobs.len(),
                m.acked.len(),
                if after == before { "ok" } else { "MISMATCH" }
            );
        }
        if after != before {
            break;
        }
    }
    let m = model.lock().unwrap_or_else(|p| p.into_inner());
    report.acked_events += m.acked_total;
    report.acked_batches += m.batches;
    drop(m);
    drop(collector);
    measure_space(&db, &config_arg, seed, cfg.verbose, report);
}

/// The store's space after the trial (the collector stopped): `store-stats`' allocated bytes against the bytes
/// its trees and log hold, and its largest value in sled.
fn measure_space(db: &Path, config: &str, seed: u64, verbose: bool, report: &mut Report) {
    let out = std::process::Command::new(crate::binary("startline-collector"))
        .args(["--config", config, "--data-dir"])
        .arg(db)
        .arg("store-stats")
        .output();
    let stats = match out {
        Ok(o) if o.status.success() => serde_json::from_slice::<serde_json::Value>(&o.stdout).ok(),
        Ok(o) => {
            report.fail(format!("seed {seed}: store-stats failed: {}", String::from_utf8_lossy(&o.stderr)));
            return;
        }
        Err(e) => {
            report.fail(format!("seed {seed}: cannot run store-stats: {e}"));
            return;
        }
    };
    let Some(stats) = stats else {
        report.fail(format!("seed {seed}: store-stats did not print JSON"));
        return;
    };
    let (Some(allocated), Some(live), Some(largest)) =
        (stats["allocated_bytes"].as_u64(), stats["keys_and_values"].as_u64(), stats["largest_sled_value"].as_u64())
    else {
        report.fail(format!("seed {seed}: store-stats without its sizes: {stats}"));
        return;
    };
    if verbose {
        println!("seed {seed}: store {allocated} bytes allocated, {live} live, largest sled value {largest} bytes");
        let out = std::process::Command::new("du").args(["-k", "-d1"]).arg(db).output();
        if let Ok(o) = out {
            print!("{}", String::from_utf8_lossy(&o.stdout));
        }
        for t in stats["trees"].as_array().into_iter().flatten() {
            println!("  {}: {} values, {} bytes, largest {}", t["tree"], t["values"], t["bytes"], t["largest_value"]);
        }
    }
    report.space.push((allocated, live));
    report.largest_sled_value = report.largest_sled_value.max(largest);
}

/// Compares the restarted collector with the model; promotes in-flight events found stored to acknowledged.
async fn verify(c: &Collector, model: &Mutex<Model>, seed: u64, cycle: u64, report: &mut Report) {
    let Some((good, total, resend, states)) = check_jobs(c, model, seed, cycle, report) else { return };
    check_stream(c, model, &states, seed, cycle, report).await;
    // SLO counts against the model.
    let (_, slos) = http_get(c.http, "/api/v1/slos");
    let urgent = slos["slos"].as_array().and_then(|a| a.iter().find(|s| s["name"] == "urgent-start"));
    match urgent {
        Some(s) => {
            let (g, b, t) = (s["status"]["good"].as_u64(), s["status"]["bad"].as_u64(), s["status"]["total"].as_u64());
            if (g, b, t) != (Some(good), Some(total - good), Some(total)) {
                report.slo_mismatches += 1;
                report.fail(format!(
                    "seed {seed} cycle {cycle}: urgent-start good/bad/total {g:?}/{b:?}/{t:?}, model {good}/{}/{total}",
                    total - good
                ));
            }
        }
        None => report.fail(format!("seed {seed} cycle {cycle}: no urgent-start SLO in {slos}")),
    }
    // Every stored event is a duplicate when sent again.
    let Ok(mut client) = IngestServiceClient::connect(c.endpoint()).await else {
        report.fail(format!("seed {seed} cycle {cycle}: cannot connect to resend"));
        return;
    };
    for (i, chunk) in resend.chunks(500).enumerate() {
        match client.publish_batch(pb::PublishRequest { batch_seq: i as u64 + 1, events: chunk.to_vec() }).await {
            Ok(ack) => {
                let ack = ack.into_inner();
                if ack.accepted != 0 {
                    report.not_duplicate += u64::from(ack.accepted);
                    report.fail(format!("seed {seed} cycle {cycle}: {} stored events accepted again", ack.accepted));
                }
            }
            Err(e) => report.fail(format!("seed {seed} cycle {cycle}: resend failed: {e}")),
        }
    }
}

/// What `check_jobs` found: the model's urgent-start (good, total), the stored events to send again, and each
/// job's state.
type Checked = (u64, u64, Vec<pb::LifecycleEvent>, std::collections::BTreeMap<String, &'static str>);

/// Checks every job the model knows (blocking HTTP); returns the model's urgent-start (good, total) and the
/// stored events to send again.
fn check_jobs(c: &Collector, model: &Mutex<Model>, seed: u64, cycle: u64, report: &mut Report) -> Option<Checked> {
    let mut m = model.lock().unwrap_or_else(|p| p.into_inner());
    let mut states = std::collections::BTreeMap::new();
    let touched: BTreeSet<usize> = m.acked.iter().chain(m.maybe.iter()).map(|(j, _)| *j).collect();
    let (mut good, mut total) = (0u64, 0u64);
    let mut resend: Vec<pb::LifecycleEvent> = Vec::new();
    for j in touched {
        let plan = m.jobs[j].clone();
        let (status, body) = http_get(c.http, &format!("/api/v1/jobs/{}", path_escape(&plan.id)));
        let stored: BTreeSet<usize> = if status == 200 {
            let ids: BTreeSet<String> = body["events"]
                .as_array()
                .map(|a| a.iter().filter_map(|e| e["event_id"].as_str().map(str::to_string)).collect())
                .unwrap_or_default();
            let mut idx = BTreeSet::new();
            for id in &ids {
                match plan.events.iter().position(|(e, _)| &e.event_id == id) {
                    Some(i) => {
                        idx.insert(i);
                    }
                    None => {
                        report.phantom += 1;
                        report.fail(format!("seed {seed} cycle {cycle}: job {} has unknown event {id}", plan.id));
                    }
                }
            }
            idx
        } else if status == 404 {
            BTreeSet::new()
        } else {
            report.fail(format!("seed {seed} cycle {cycle}: GET job {} answered {status}: {body}", plan.id));
            return None;
        };
        let acked: BTreeSet<usize> = m.acked.iter().filter(|(jj, _)| *jj == j).map(|(_, e)| *e).collect();
        let maybe: BTreeSet<usize> = m.maybe.iter().filter(|(jj, _)| *jj == j).map(|(_, e)| *e).collect();
        if plan.ancient {
            // Expired whole, or complete.
            let known: BTreeSet<usize> = acked.union(&maybe).copied().collect();
            if !stored.is_empty() && stored.len() != plan.events.len() {
                report.partial_expired += 1;
                report.fail(format!("seed {seed} cycle {cycle}: ancient job {} partly stored: {stored:?}", plan.id));
            }
            if stored.is_empty() {
                m.acked.retain(|(jj, _)| *jj != j);
            } else if !stored.is_subset(&known) {
                report.phantom += 1;
            }
            m.maybe.retain(|(jj, _)| *jj != j);
            for e in stored {
                m.acked.insert((j, e));
            }
            continue;
        }
        for e in acked.difference(&stored) {
            report.lost += 1;
            report.fail(format!(
                "seed {seed} cycle {cycle}: acknowledged event {}/{} missing",
                plan.id, plan.events[*e].0.event_id
            ));
        }
        for e in stored.difference(&acked) {
            if !maybe.contains(e) {
                report.phantom += 1;
                report.fail(format!(
                    "seed {seed} cycle {cycle}: event {}/{} stored but never sent",
                    plan.id, plan.events[*e].0.event_id
                ));
            }
        }
        m.maybe.retain(|(jj, _)| *jj != j);
        for e in &stored {
            m.acked.insert((j, *e));
        }
        // The model's state: the latest stage among stored events; unsubmitted without `submitted`.
        let has_submitted = stored.contains(&0);
        let want = if !has_submitted {
            if stored.is_empty() {
                None
            } else {
                Some("unsubmitted")
            }
        } else {
            stored.iter().map(|e| plan.events[*e].1).filter(|s| *s != Stage::Checkpoint).max().map(Stage::label)
        };
        let got = if status == 200 { body["state"].as_str() } else { None };
        if let Some(w) = want {
            states.insert(plan.id.clone(), w);
        }
        if want != got {
            report.state_mismatches += 1;
            report.fail(format!(
                "seed {seed} cycle {cycle}: job {} state {got:?}, model {want:?} (stored {stored:?})",
                plan.id
            ));
        }
        if plan.urgent && has_submitted {
            total += 1;
            let started = stored.iter().any(|e| plan.events[*e].1 == Stage::Running);
            if started && plan.first_step_at - plan.submitted_at <= 600_000 {
                good += 1;
            }
        }
        resend.extend(stored.iter().map(|e| plan.events[*e].0.clone()));
    }
    Some((good, total, resend, states))
}

/// Reads the whole stream out (from the oldest record, until it has been quiet for a moment) and checks it
/// against the model: consecutive cursors from 1; every acknowledged event in it exactly once (an ancient job
/// may come twice: retention deleted it and a redelivery stored it again); nothing never sent; every change
/// after the event that caused it; and each job's last change carrying its state now (`states`, the model's,
/// checked against the API by `check_jobs`), which holds across crashes only through the resync records.
async fn check_stream(
    c: &Collector,
    model: &Mutex<Model>,
    states: &std::collections::BTreeMap<String, &'static str>,
    seed: u64,
    cycle: u64,
    report: &mut Report,
) {
    use pb::stream_record::Record;
    let fail = |report: &mut Report, what: String| {
        report.stream_mismatches += 1;
        report.fail(format!("seed {seed} cycle {cycle}: stream: {what}"));
    };
    let Ok(mut client) = pb::stream_service_client::StreamServiceClient::connect(c.endpoint()).await else {
        fail(report, "cannot connect".into());
        return;
    };
    let mut call = match client.subscribe(pb::SubscribeRequest { from_oldest: true, ..Default::default() }).await {
        Ok(r) => r.into_inner(),
        Err(e) => {
            fail(report, format!("subscribe refused: {e}"));
            return;
        }
    };
    let (acked, ancient): (Vec<(String, String)>, BTreeSet<String>) = {
        let m = model.lock().unwrap_or_else(|p| p.into_inner());
        (
            m.acked.iter().map(|(j, e)| (m.jobs[*j].id.clone(), m.jobs[*j].events[*e].0.event_id.clone())).collect(),
            m.jobs.iter().filter(|j| j.ancient).map(|j| j.id.clone()).collect(),
        )
    };
    let sent: BTreeSet<(String, String)> = {
        let m = model.lock().unwrap_or_else(|p| p.into_inner());
        m.jobs.iter().flat_map(|j| j.events.iter().map(|(e, _)| (j.id.clone(), e.event_id.clone()))).collect()
    };
    let mut recs: Vec<pb::StreamRecord> = Vec::new();
    let mut seen: std::collections::BTreeMap<(String, String), u32> = std::collections::BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::time::timeout(Duration::from_millis(500), call.message()).await {
            Ok(Ok(Some(r))) => {
                if let Some(Record::Event(a)) = &r.record {
                    if let Some(e) = &a.event {
                        *seen.entry((e.job_id.clone(), e.event_id.clone())).or_default() += 1;
                    }
                }
                recs.push(r);
            }
            Ok(Ok(None)) => break,
            Ok(Err(e)) => {
                fail(report, format!("call failed: {e}"));
                return;
            }
            // Quiet: done if every acknowledged event arrived (else keep reading until the deadline).
            Err(_) => {
                if acked.iter().all(|k| seen.contains_key(k)) || tokio::time::Instant::now() > deadline {
                    break;
                }
            }
        }
    }
    report.stream_records += recs.len() as u64;
    report.expected_start_records +=
        recs.iter().filter(|r| matches!(&r.record, Some(Record::Change(ch)) if ch.expected_start.is_some())).count()
            as u64;
    for (i, r) in recs.iter().enumerate() {
        if r.cursor != i as u64 + 1 {
            fail(report, format!("record {i} has cursor {} (gap or repeat)", r.cursor));
            return;
        }
    }
    for k in &acked {
        if !seen.contains_key(k) {
            fail(report, format!("acknowledged event {}/{} is not in the stream", k.0, k.1));
        }
    }
    for (k, n) in &seen {
        if !sent.contains(k) {
            fail(report, format!("event {}/{} in the stream was never sent", k.0, k.1));
        }
        if *n > 1 && !ancient.contains(&k.0) {
            fail(report, format!("event {}/{} is in the stream {n} times", k.0, k.1));
        }
    }
    let mut seqs: std::collections::BTreeMap<u64, String> = std::collections::BTreeMap::new();
    let mut last_state: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    for r in &recs {
        match &r.record {
            Some(Record::Event(a)) => {
                seqs.insert(a.seq, r.job_id.clone());
            }
            Some(Record::Change(ch)) => {
                if !ch.resync && seqs.get(&ch.event_seq) != Some(&r.job_id) {
                    fail(
                        report,
                        format!(
                            "change at {} names event seq {} not seen before for {}",
                            r.cursor, ch.event_seq, r.job_id
                        ),
                    );
                }
                last_state.insert(r.job_id.clone(), ch.state.clone());
            }
            _ => {}
        }
    }
    for (job, want) in states {
        if ancient.contains(job) {
            continue;
        }
        if last_state.get(job).map(String::as_str) != Some(*want) {
            fail(report, format!("job {job}: last change says {:?}, its state is {want}", last_state.get(job)));
        }
    }
}
