//! `startline-bench core`: what the collector's core costs as the number of tracked jobs grows,
//! on the real collector process over loopback gRPC and HTTP, in one run:
//!
//! - **ingest** of `--jobs` jobs of the simulator's realistic mix (`startline_agent::simulate::engine::events`:
//!   arrivals over the last `--days` days with the time-of-day load, queueing on capacity sized for that rate),
//!   widened to 40 pools and 24 teams / 96 projects, of which `--open-share` are still open (waiting, preparing or
//!   running) at the end; sent in time order (as the simulator's backfill does) by a closed-loop client with
//!   `--in-flight` batches in flight on one stream: events/s, server CPU per event, bytes on disk per event beside
//!   the events' mean protobuf encoding;
//! - **memory**: the collector's RSS (and peak) after ingest, and per million tracked jobs;
//! - **expected starts for the stream**: jobs waiting after ingest, the last estimate sweep's duration and the
//!   expected-start changes written (the collector's config gets `[stream] expected_start_interval = "5s"` unless
//!   `--collector-config` is given, so the ingest figures include the sweeps);
//! - **API** timings (p50 and max of `--reps` requests after a warm-up): comparison, overview, SLOs, `/metrics`,
//!   listings with filters (first page and a page after 20,000 matches), job detail of a done and an open job;
//! - **history files**: how long until the seal passes caught up with the ingest (the collector's config gets
//!   `[history] seal_interval = "5s"` unless `--collector-config` is given), files, bytes per job, and the same
//!   two questions (TTFS p50/p90/p99 by pool kind x priority over 30 days; GPU-hours by category by pool kind)
//!   timed on the API and on DuckDB (Python package) over the files, with DuckDB's peak RSS;
//! - **restart**: SIGTERM, restart on the same data directory, spawn to `/readyz` 200, RSS after restart, and
//!   whether job counts by state and time-to-first-step figures over all jobs are the same after it.
//!
//! `--sizes 100000,1000000` runs several sizes (each on its own store) and prints one table with a column per
//! size. `--keep-dir PATH` keeps each store in `PATH/<jobs>/` and, when it is already there, skips ingest and
//! reruns only the queries and the restart (ingest figures are then read from `PATH/<jobs>/build.json`).
//! The output ends with a Markdown table and one JSON line (`{"bench":"core",...}`).
//!
//! Durable ingest against the sled ceiling and ack latency at 10% load are measured by `startline-bench ingest`
//! and are not repeated here.

use crate::{http_get, http_get_text, path_escape, Collector};
use prost::Message;
use serde_json::{json, Value};
use startline_agent::rng::Rng;
use startline_agent::simulate::arrivals;
use startline_agent::simulate::engine::{self, FleetConfig};
use startline_agent::simulate::model::{default_pools, size_for_rate, Pool};
use startline_proto::pb::{self, ingest_service_client::IngestServiceClient, lifecycle_event::Kind};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_stream::wrappers::ReceiverStream;

/// Usage of `startline-bench core`.
pub const USAGE: &str = "usage: startline-bench core [--jobs N | --sizes N,N,...] [--open-share F] [--days D] \
[--batch N] [--in-flight N] [--reps N] [--settle SECS] [--seed N] [--keep-dir PATH] [--collector-config FILE]";

/// Options of the core benchmark.
#[derive(Debug, Clone)]
pub struct CoreArgs {
    /// Job counts to run, each on its own store.
    pub sizes: Vec<u64>,
    /// Share of jobs still open (waiting or running) at the end of the history.
    pub open_share: f64,
    /// Days of history the jobs are spread over, ending now.
    pub days: u64,
    /// Events per batch.
    pub batch: usize,
    /// Batches in flight on the ingest stream.
    pub in_flight: usize,
    /// Timed requests per API query (after a warm-up of two).
    pub reps: usize,
    /// Seconds to wait after the last ack before measuring RSS, disk and queries.
    pub settle: u64,
    /// Seed of the simulated fleet.
    pub seed: u64,
    /// Keep the stores in `PATH/<jobs>/` and reuse them when present.
    pub keep_dir: Option<PathBuf>,
    /// Passed to the collector as `--config`.
    pub collector_config: Option<PathBuf>,
}

impl Default for CoreArgs {
    fn default() -> Self {
        CoreArgs {
            sizes: vec![100_000],
            open_share: 0.1,
            days: 30,
            batch: 1000,
            in_flight: 8,
            reps: 10,
            settle: 5,
            seed: 42,
            keep_dir: None,
            collector_config: None,
        }
    }
}

/// Parses the arguments after the program name; the word `core` itself is skipped.
pub fn parse_args(args: impl IntoIterator<Item = String>) -> Result<CoreArgs, String> {
    let mut a = CoreArgs::default();
    let mut it = args.into_iter();
    let mut saw_core = false;
    while let Some(x) = it.next() {
        let mut val = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        let num = |name: &str, v: String| {
            v.replace('_', "").parse::<u64>().map_err(|_| format!("{name}: {v:?} is not a number"))
        };
        match x.as_str() {
            "core" if !saw_core => saw_core = true,
            "--jobs" => a.sizes = vec![num("--jobs", val("--jobs")?)?.max(1)],
            "--sizes" => {
                let v = val("--sizes")?;
                a.sizes = v
                    .split(',')
                    .map(|s| num("--sizes", s.trim().to_string()).map(|n| n.max(1)))
                    .collect::<Result<_, _>>()?;
                if a.sizes.is_empty() {
                    return Err("--sizes needs at least one size".into());
                }
            }
            "--open-share" => {
                let v = val("--open-share")?;
                a.open_share = v
                    .parse::<f64>()
                    .ok()
                    .filter(|f| (0.0..=1.0).contains(f))
                    .ok_or(format!("--open-share: {v:?} is not a share in 0..=1"))?;
            }
            "--days" => a.days = num("--days", val("--days")?)?.max(1),
            "--batch" => a.batch = num("--batch", val("--batch")?)?.max(1) as usize,
            "--in-flight" => a.in_flight = num("--in-flight", val("--in-flight")?)?.max(1) as usize,
            "--reps" => a.reps = num("--reps", val("--reps")?)?.max(1) as usize,
            "--settle" => a.settle = num("--settle", val("--settle")?)?,
            "--seed" => a.seed = num("--seed", val("--seed")?)?,
            "--keep-dir" => a.keep_dir = Some(PathBuf::from(val("--keep-dir")?)),
            "--collector-config" => a.collector_config = Some(PathBuf::from(val("--collector-config")?)),
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}; {USAGE}")),
        }
    }
    Ok(a)
}

/// Runs the benchmark for every size and prints the table and the JSON line.
pub fn main(a: CoreArgs) {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let machine = machine();
    println!(
        "# startline-bench core ({machine}): sizes {:?}, open share {}, {} days, batches of {}, {} in flight",
        a.sizes, a.open_share, a.days, a.batch, a.in_flight
    );
    let mut reports = Vec::new();
    for &jobs in &a.sizes {
        reports.push(run_size(&rt, &a, jobs));
    }
    print_table(&a, &reports);
    let line = json!({
        "bench": "core",
        "machine": machine,
        "at": startline_proto::time::now_ms(),
        "open_share": a.open_share,
        "days": a.days,
        "batch": a.batch,
        "in_flight": a.in_flight,
        "reps": a.reps,
        "seed": a.seed,
        "sizes": reports.iter().map(|r| r.json.clone()).collect::<Vec<_>>(),
    });
    println!();
    println!("{line}");
}

fn machine() -> String {
    format!(
        "{} cores, {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| s.lines().find(|l| l.starts_with("model name")).map(|l| l
                .split(':')
                .nth(1)
                .unwrap_or("")
                .trim()
                .to_string()))
            .unwrap_or_default()
    )
}

// ---------------------------------------------------------------------------------------------------------------
// The fleet: the simulator's per-job model over more pools, teams and projects, with a share left open.

/// Teams of the widened fleet (each with four projects).
const TEAMS: [&str; 24] = [
    "nlp",
    "vision",
    "speech",
    "safety",
    "robotics",
    "search",
    "ads",
    "recsys",
    "infra",
    "research",
    "agents",
    "code",
    "math",
    "bio",
    "chem",
    "audio",
    "video",
    "multimodal",
    "eval",
    "alignment",
    "retrieval",
    "translation",
    "ocr",
    "forecast",
];

/// Variants of each of the simulator's five pools (40 pools in all).
const POOL_VARIANTS: usize = 8;

/// The simulator's five pools, each split into eight with the same kind, provider, GPU class and scheduler
/// (and a region of its provider), sharing the original's arrivals; capacity is sized for the arrival rate when
/// the fleet runs.
pub fn fleet_pools() -> Vec<Pool> {
    let mut out = Vec::new();
    for base in default_pools() {
        let regions: &[&'static str] = match base.provider {
            "sagemaker" => &["us-east-1", "us-west-2", "eu-west-1", "ap-northeast-1"],
            "vertex" => &["europe-west4", "us-central1", "asia-southeast1", "us-east5"],
            _ => &["dc-east", "dc-west"],
        };
        for i in 0..POOL_VARIANTS {
            out.push(Pool {
                name: Box::leak(format!("{}-{i}", base.name).into_boxed_str()),
                region: regions[i % regions.len()],
                share: base.share / POOL_VARIANTS as f64,
                ..base.clone()
            });
        }
    }
    out
}

/// Which jobs exist: the simulated fleet over `[start_ms, end_ms)`.
struct Fleet {
    seed: u64,
    jobs: u64,
    open_share: f64,
    start_ms: i64,
    end_ms: i64,
    pools: Vec<Pool>,
}

/// Per job in flight: events kept so far, and how many an open job keeps (`None`: all).
struct Kept {
    n: u32,
    keep: Option<u32>,
}

impl Fleet {
    /// Whether to send `e`: a job's submitted gets a team and project of the wider fleet and decides whether the
    /// job is one of the open ones, which keeps only a prefix of its events without its `done` (waiting, assigned,
    /// preparing, running or requeued at the end).
    fn keep(&self, e: &mut pb::LifecycleEvent, jobs: &mut HashMap<String, Kept>, stats: &mut GenStats) -> bool {
        if let Some(Kind::Submitted(s)) = e.kind.as_mut() {
            let mut r = Rng::derive(self.seed ^ 0xC0DE_BE4C, startline_proto::hash::fnv1a64(e.job_id.as_bytes()));
            let team = TEAMS[(r.next_u64() % TEAMS.len() as u64) as usize];
            s.team = team.into();
            s.project = format!("{team}-{}", r.next_u64() % 4);
            let open = r.chance(self.open_share);
            stats.open_jobs += u64::from(open);
            jobs.insert(e.job_id.clone(), Kept { n: 0, keep: open.then(|| 1 + (r.next_u64() % 12) as u32) });
        }
        let done = matches!(e.kind, Some(Kind::Done(_)));
        let Some(k) = jobs.get_mut(&e.job_id) else { return true };
        let send = k.keep.is_none_or(|keep| k.n < keep && !done);
        k.n += 1;
        if done {
            jobs.remove(&e.job_id);
        }
        send
    }
}

/// What the generator produced.
#[derive(Debug, Clone, Default)]
struct GenStats {
    jobs: u64,
    open_jobs: u64,
    events: u64,
    /// Sum of `prost::Message::encoded_len` over the events.
    encoded_bytes: u64,
    /// Seconds of generator CPU (its thread's wall time, most of it spent generating).
    gen_secs: f64,
}

/// Generates the fleet's events in time order on a thread of its own and sends them in batches of `batch`.
fn spawn_generator(
    fleet: Fleet,
    batch: usize,
    tx: tokio::sync::mpsc::Sender<Vec<pb::LifecycleEvent>>,
) -> std::thread::JoinHandle<GenStats> {
    std::thread::spawn(move || {
        let started = Instant::now();
        let mut waited = Duration::ZERO;
        let mut stats = GenStats { jobs: fleet.jobs, ..Default::default() };
        let times = arrivals(fleet.seed, fleet.jobs, fleet.start_ms, fleet.end_ms);
        let mut pools = fleet.pools.clone();
        let hours = (fleet.end_ms - fleet.start_ms).max(1) as f64 / 3_600_000.0;
        size_for_rate(&mut pools, fleet.jobs as f64 / hours);
        let stream = engine::events(FleetConfig::new(fleet.seed, pools, fleet.start_ms), times, fleet.end_ms);
        let mut jobs: HashMap<String, Kept> = HashMap::new();
        let mut out: Vec<pb::LifecycleEvent> = Vec::with_capacity(batch);
        for mut ev in stream {
            if !fleet.keep(&mut ev, &mut jobs, &mut stats) {
                continue;
            }
            stats.events += 1;
            stats.encoded_bytes += ev.encoded_len() as u64;
            out.push(ev);
            if out.len() >= batch {
                let w = Instant::now();
                let ok = tx.blocking_send(std::mem::replace(&mut out, Vec::with_capacity(batch))).is_ok();
                waited += w.elapsed();
                if !ok {
                    return stats;
                }
            }
        }
        if !out.is_empty() {
            let w = Instant::now();
            let _ = tx.blocking_send(out);
            waited += w.elapsed();
        }
        stats.gen_secs = (started.elapsed() - waited).as_secs_f64();
        stats
    })
}

// ---------------------------------------------------------------------------------------------------------------
// Ingest: a closed loop on one stream (as `startline-bench ingest` does), with at most `in_flight` unacknowledged
// batches, fed from the generator.

#[derive(Debug, Default)]
struct IngestRun {
    batches: u64,
    accepted: u64,
    duplicates: u64,
    rejected: u64,
    first_rejection: Option<String>,
    secs: f64,
}

async fn client(endpoint: &str) -> IngestServiceClient<tonic::transport::Channel> {
    let ch = tonic::transport::Endpoint::from_shared(endpoint.to_string())
        .expect("uri")
        .initial_stream_window_size(Some(4 << 20))
        .initial_connection_window_size(Some(16 << 20))
        .tcp_nodelay(true)
        .connect()
        .await
        .expect("connect");
    IngestServiceClient::new(ch)
}

async fn closed_loop(
    endpoint: &str,
    mut batches: tokio::sync::mpsc::Receiver<Vec<pb::LifecycleEvent>>,
    in_flight: usize,
    expected_events: Option<u64>,
) -> IngestRun {
    let mut c = client(endpoint).await;
    let (tx, rx) = tokio::sync::mpsc::channel(in_flight);
    let window = Arc::new(tokio::sync::Semaphore::new(in_flight));
    let start = Instant::now();
    let mut acks = c.publish(ReceiverStream::new(rx)).await.expect("publish").into_inner();
    let w = window.clone();
    let mut sender = tokio::spawn(async move {
        let mut seq = 0u64;
        while let Some(events) = batches.recv().await {
            let Ok(permit) = w.acquire().await else { break };
            permit.forget();
            seq += 1;
            if tx.send(pb::PublishRequest { batch_seq: seq, events }).await.is_err() {
                break;
            }
        }
        seq
    });
    let mut run = IngestRun::default();
    let mut total: Option<u64> = None;
    let mut last_note = Instant::now();
    loop {
        if total.is_some_and(|t| run.batches >= t) {
            break;
        }
        tokio::select! {
            sent = &mut sender, if total.is_none() => total = Some(sent.expect("sender task")),
            msg = acks.message() => match msg {
                Ok(Some(ack)) => {
                    window.add_permits(1);
                    run.batches += 1;
                    run.accepted += u64::from(ack.accepted);
                    run.duplicates += u64::from(ack.duplicates);
                    run.rejected += ack.rejections.len() as u64;
                    if run.first_rejection.is_none() {
                        run.first_rejection = ack.rejections.first().map(|r| format!("{r:?}"));
                    }
                    if last_note.elapsed() >= Duration::from_secs(15) {
                        last_note = Instant::now();
                        let done = run.accepted + run.duplicates + run.rejected;
                        let pct = expected_events.map_or(String::new(), |n| format!(" ({:.0}%)", done as f64 * 100.0 / n.max(1) as f64));
                        eprintln!(
                            "  ... {done} events acknowledged{pct} in {:.0} s, {:.0} ev/s",
                            start.elapsed().as_secs_f64(),
                            done as f64 / start.elapsed().as_secs_f64()
                        );
                    }
                }
                other => panic!("ingest stream ended early after {} batches: {other:?}", run.batches),
            },
        }
    }
    run.secs = start.elapsed().as_secs_f64();
    run
}

// ---------------------------------------------------------------------------------------------------------------
// Process figures.

/// A `/proc/<pid>/status` field in KiB (VmRSS, VmHWM).
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|v| v.strip_prefix(':')))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Clients that open the comparison at once in [`concurrent_reads`].
const CONCURRENT_READERS: usize = 16;

/// Memory under many large reads at once: [`CONCURRENT_READERS`] clients ask for the 30-day comparison by pool
/// together, three rounds; the peak RSS (`VmHWM`, reset before through `clear_refs`) against the RSS before. The
/// collector runs at most `http.max_concurrent_reads` of them at once (its `--collector-config` sets it).
fn concurrent_reads(c: &Collector, rep: &mut SizeReport) {
    let pid = c.child.id();
    let path = "/api/v1/compare?window=30d&by=pool";
    let _ = http_get_text(c.http, path);
    std::thread::sleep(Duration::from_secs(2));
    let before = status_kib(pid, "VmRSS");
    // Resets VmHWM to the current RSS (Linux >= 4.0).
    let reset = std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok();
    let started = Instant::now();
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let threads: Vec<_> = (0..CONCURRENT_READERS)
            .map(|_| {
                let http = c.http;
                std::thread::spawn(move || http_get_text(http, path).0)
            })
            .collect();
        statuses.extend(threads.into_iter().map(|t| t.join().unwrap_or(0)));
    }
    let secs = started.elapsed().as_secs_f64();
    let peak = status_kib(pid, "VmHWM");
    let ok = statuses.iter().filter(|s| **s == 200).count();
    let cell = if reset {
        format!(
            "RSS {:.0} MiB before, peak {:.0} MiB (+{:.0} MiB); {ok}/{} answered 200 in {secs:.1} s",
            mib(before),
            mib(peak),
            mib(peak.saturating_sub(before)),
            statuses.len()
        )
    } else {
        "n/a (cannot reset VmHWM)".to_string()
    };
    println!("- {CONCURRENT_READERS} concurrent `GET {path}`, 3 rounds: {cell}");
    rep.cell(format!("{CONCURRENT_READERS} concurrent compares by pool (3 rounds): memory"), cell);
    rep.json["concurrent_reads"] = json!({
        "readers": CONCURRENT_READERS,
        "rounds": 3,
        "rss_mib_before": mib(before),
        "peak_rss_mib": reset.then(|| mib(peak)),
        "ok": ok,
        "requests": statuses.len(),
        "seconds": secs,
    });
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// User + system CPU seconds of a process.
/// CPU seconds (user + system) a process has used, from `/proc/<pid>/stat`.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let hz = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .unwrap_or(100.0);
    ticks / hz
}

/// (apparent bytes, allocated bytes) of every file under `p`.
fn dir_size(p: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut total = (0, 0);
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            let Ok(md) = e.metadata() else { continue };
            let (a, b) = if md.is_dir() { dir_size(&e.path()) } else { (md.len(), md.blocks() * 512) };
            total.0 += a;
            total.1 += b;
        }
    }
    total
}

// ---------------------------------------------------------------------------------------------------------------
// API timings.

/// `reps` timed GETs after two untimed ones.
#[derive(Debug, Clone)]
struct Timing {
    status: u16,
    p50: f64,
    max: f64,
    bytes: usize,
}

fn time_get(http: std::net::SocketAddr, path: &str, reps: usize) -> Timing {
    let (mut status, mut bytes) = (0, 0);
    for _ in 0..2 {
        let (s, b) = http_get_text(http, path);
        (status, bytes) = (s, b.len());
    }
    let mut t: Vec<f64> = Vec::with_capacity(reps);
    for _ in 0..reps {
        let s = Instant::now();
        let (st, body) = http_get_text(http, path);
        t.push(s.elapsed().as_secs_f64() * 1000.0);
        if st != 200 {
            status = st;
        }
        bytes = body.len();
    }
    t.sort_by(f64::total_cmp);
    let q = |p: f64| t[((t.len() - 1) as f64 * p).round() as usize];
    Timing { status, p50: q(0.5), max: q(1.0), bytes }
}

fn timing_cell(t: &Timing, reps: usize) -> String {
    if t.status != 200 {
        return format!("HTTP {}", t.status);
    }
    let f = |ms: f64| if ms >= 100.0 { format!("{ms:.0}") } else { format!("{ms:.2}") };
    format!("{} / {} ms (max of {reps})", f(t.p50), f(t.max))
}

fn timing_json(t: &Timing) -> Value {
    json!({"status": t.status, "p50_ms": t.p50, "max_ms": t.max, "bytes": t.bytes})
}

/// The history files: waits until the files' footers count every job that ended before the last sealable day's
/// end (ended jobs fold `store.fold_after` after the ingest, and a day is sealed once all its jobs folded; at
/// most 15 minutes), then times the same two questions on the API and on DuckDB over
/// the files. The files hold the ended jobs of sealed days (UTC days that ended `history.seal_after` ago); the
/// API answers over every job in its window, open ones included: the sets differ by the open jobs and those
/// that ended today.
fn history_files(c: &Collector, db: &Path, a: &CoreArgs, rep: &mut SizeReport) {
    let t = Instant::now();
    let history = match startline_collector::store::history::History::open(db) {
        Ok(h) => h,
        Err(e) => {
            rep.cell("history files", format!("unreadable: {e}"));
            return;
        }
    };
    let total = || -> (u64, u64, usize) {
        let sealed = history.sealed().unwrap_or_default();
        (sealed.values().map(|d| d.fingerprint.jobs).sum(), sealed.values().map(|d| d.bytes).sum(), sealed.len())
    };
    // What the files must hold once the seal passes caught up: every ended job of the days that ended an hour
    // (`history.seal_after`'s default) ago: the done jobs less those that ended since, counted by paging the
    // listing newest end first.
    let now = startline_proto::time::now_ms();
    let cutoff = (now - 3_600_000).div_euclid(86_400_000) * 86_400_000;
    let (_, ov) = http_get(c.http, "/api/v1/overview?window=400d");
    let done = ov["jobs_by_state"]["done"].as_u64().unwrap_or(0);
    let mut recent = 0u64;
    let mut token: Option<String> = None;
    'pages: loop {
        let mut path = "/api/v1/jobs?state=done&order=ended_at&desc=true&limit=1000".to_string();
        if let Some(t) = &token {
            path.push_str(&format!("&page_token={}", crate::query_escape(t)));
        }
        let (_, page) = http_get(c.http, &path);
        for j in page["jobs"].as_array().cloned().unwrap_or_default() {
            let ended = j["done_at"].as_str().and_then(|d| humantime::parse_rfc3339(d).ok());
            let ended_ms =
                ended.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_millis() as i64);
            if ended_ms < cutoff {
                break 'pages;
            }
            recent += 1;
        }
        match page["next_page_token"].as_str() {
            Some(t) => token = Some(t.to_string()),
            None => break,
        }
    }
    let expected = done.saturating_sub(recent);
    let mut last = total();
    while last.0 != expected && t.elapsed() < Duration::from_secs(900) {
        std::thread::sleep(Duration::from_secs(1));
        last = total();
    }
    if last.0 != expected {
        println!("- history files: {} jobs after 15 min, {expected} expected", last.0);
    }
    let (jobs, bytes, files) = last;
    let caught_up = t.elapsed().as_secs_f64();
    println!(
        "- history files: {jobs} jobs in {files} day files, {:.1} MiB ({:.0} B/job), all sealed {caught_up:.0} s after the API timings",
        bytes as f64 / 1048576.0,
        bytes as f64 / jobs.max(1) as f64
    );
    rep.cell(
        "history files: jobs (days), bytes per job",
        format!("{} ({files}), {:.0} B", thousands(jobs), bytes as f64 / jobs.max(1) as f64),
    );
    rep.json["history"] = json!({"jobs": jobs, "files": files, "bytes": bytes, "caught_up_s": caught_up});
    if jobs == 0 {
        return;
    }
    let api_compare = time_get(c.http, "/api/v1/compare?window=30d&by=priority", a.reps);
    let api_goodput = time_get(c.http, "/api/v1/goodput?window=30d&by=pool_kind", a.reps);
    let dir = history.dir().display().to_string();
    let script = format!(
        r#"
import duckdb, json, resource, time
files = "{dir}/*/*.parquet"
q_compare = f"""SELECT pool_kind, priority, count(*), count(time_to_first_step_ms),
  quantile_disc(time_to_first_step_ms, [0.5, 0.9, 0.99])
  FROM read_parquet('{{files}}', hive_partitioning = true)
  WHERE submitted_at >= now() - INTERVAL 30 DAY GROUP BY ALL"""
q_goodput = f"""SELECT pool_kind, count(*), sum(waiting_gpu_ms), sum(preparing_gpu_ms), sum(requeue_wait_gpu_ms),
  sum(checkpoint_gpu_ms), sum(lost_gpu_ms), sum(failed_gpu_ms), sum(productive_gpu_ms), sum(total_gpu_ms)
  FROM read_parquet('{{files}}', hive_partitioning = true)
  WHERE submitted_at >= now() - INTERVAL 30 DAY GROUP BY ALL"""
out = {{}}
t = time.perf_counter(); con = duckdb.connect(); rows = con.execute(q_compare).fetchall()
out["first_ms"] = (time.perf_counter() - t) * 1000
for name, q in (("compare", q_compare), ("goodput", q_goodput)):
    ts = []
    for _ in range({reps}):
        t = time.perf_counter(); con.execute(q).fetchall(); ts.append((time.perf_counter() - t) * 1000)
    ts.sort()
    out[name] = {{"p50_ms": ts[len(ts) // 2], "max_ms": ts[-1]}}
out["jobs"] = con.execute(f"SELECT count(*) FROM read_parquet('{{files}}')").fetchone()[0]
out["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"#,
        reps = a.reps
    );
    let out = std::process::Command::new("python3").arg("-c").arg(&script).output();
    let duck: Option<Value> = match out {
        Ok(o) if o.status.success() => serde_json::from_slice(&o.stdout).ok(),
        Ok(o) => {
            println!("- DuckDB failed: {}", String::from_utf8_lossy(&o.stderr));
            None
        }
        Err(e) => {
            println!("- DuckDB not run: {e}");
            None
        }
    };
    let ms = |v: &Value| {
        let f = |x: f64| if x >= 100.0 { format!("{x:.0}") } else { format!("{x:.1}") };
        format!("{} / {} ms", f(v["p50_ms"].as_f64().unwrap_or(0.0)), f(v["max_ms"].as_f64().unwrap_or(0.0)))
    };
    match duck {
        Some(d) => {
            println!("- DuckDB over the history files: {d}");
            rep.cell(
                "compare by priority, 30 d: API / DuckDB on the files (p50 / max)",
                format!("{} / {}", timing_cell(&api_compare, a.reps), ms(&d["compare"])),
            );
            rep.cell(
                "goodput by pool kind, 30 d: API / DuckDB on the files (p50 / max)",
                format!("{} / {}", timing_cell(&api_goodput, a.reps), ms(&d["goodput"])),
            );
            rep.cell(
                "DuckDB: open + first query; peak RSS of its process",
                format!(
                    "{:.0} ms; {:.0} MiB",
                    d["first_ms"].as_f64().unwrap_or(0.0),
                    d["max_rss_mib"].as_f64().unwrap_or(0.0)
                ),
            );
            rep.json["history"]["duckdb"] = d;
        }
        None => rep.cell("DuckDB on the history files", "not run"),
    }
    rep.json["history"]["api_compare"] = timing_json(&api_compare);
    rep.json["history"]["api_goodput"] = timing_json(&api_goodput);
}

/// The listings timed: (label, query without `limit`/`page_token`).
fn listings(now_s: i64) -> Vec<(&'static str, String)> {
    vec![
        ("no filter", String::new()),
        ("state=running", "state=running".into()),
        ("state=queued", "state=queued".into()),
        ("pool=a100-3", "pool=a100-3".into()),
        ("pool_kind=managed, priority=urgent", "pool_kind=managed&priority=urgent".into()),
        ("provider=vertex, state=done", "provider=vertex&state=done".into()),
        ("submitted in the last 24 h", format!("submitted_after={}", now_s - 86_400)),
        ("team=nlp", "team=nlp".into()),
    ]
}

/// Walks a listing with pages of 1,000 up to `matches` jobs; returns the token to continue from and how many
/// jobs were passed (fewer if the listing ended first), or the status if it is refused.
fn deep_token(http: std::net::SocketAddr, query: &str, matches: usize) -> Result<(Option<String>, usize), u16> {
    let mut token: Option<String> = None;
    let mut passed = 0;
    while passed < matches {
        let mut path = format!("/api/v1/jobs?limit=1000{}{}", if query.is_empty() { "" } else { "&" }, query);
        if let Some(t) = &token {
            path.push_str(&format!("&page_token={}", crate::query_escape(t)));
        }
        let (status, body) = http_get(http, &path);
        if status != 200 {
            return Err(status);
        }
        let n = body["jobs"].as_array().map_or(0, Vec::len);
        match body["next_page_token"].as_str() {
            Some(t) => {
                passed += n;
                token = Some(t.to_string());
            }
            None => break,
        }
    }
    Ok((token, passed))
}

// ---------------------------------------------------------------------------------------------------------------
// One size.

/// One size's results: table cells by row label, and its JSON object.
struct SizeReport {
    jobs: u64,
    cells: Vec<(String, String)>,
    json: Value,
}

impl SizeReport {
    fn cell(&mut self, label: impl Into<String>, value: impl Into<String>) {
        self.cells.push((label.into(), value.into()));
    }
}

fn start_collector(db: &Path, a: &CoreArgs) -> (Collector, f64) {
    // `STARTLINE_BENCH_COLLECTOR_LOG` overrides the collector's log filter (e.g.
    // `warn,startline_collector::applier=debug` shows each fold pass with its phases).
    let log = std::env::var("STARTLINE_BENCH_COLLECTOR_LOG").unwrap_or_else(|_| "warn".into());
    let mut extra: Vec<String> = vec!["--log".into(), log];
    if let Some(cfg) = &a.collector_config {
        extra.push("--config".into());
        extra.push(cfg.display().to_string());
    }
    if a.collector_config.is_none() {
        // History files sealed every 5 s (not every 10 min), so the bench sees them catch up with the ingest, and
        // waiting jobs estimated for the stream every 5 s (not every minute), so the ingest pays for the sweeps.
        let cfg = db.with_extension("toml");
        std::fs::write(&cfg, "[history]\nseal_interval = \"5s\"\n[stream]\nexpected_start_interval = \"5s\"\n")
            .expect("bench config");
        extra.push("--config".into());
        extra.push(cfg.display().to_string());
    }
    let refs: Vec<&str> = extra.iter().map(String::as_str).collect();
    let t = Instant::now();
    let c = Collector::start(db, &refs);
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let (status, _) = http_get_text(c.http, "/readyz");
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "collector never answered /readyz 200");
        std::thread::sleep(Duration::from_millis(5));
    }
    (c, t.elapsed().as_secs_f64())
}

/// SIGTERM and wait for exit (up to 10 minutes: a large store's final checkpoint may take longer than the 30 s
/// [`Collector::signal_and_wait`] allows); returns the exit status and the seconds it took.
fn stop(mut c: Collector) -> (std::process::ExitStatus, f64) {
    let t = Instant::now();
    let pid = c.child.id().to_string();
    let ok = std::process::Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success();
    assert!(ok, "kill -TERM {pid} failed");
    loop {
        if let Some(st) = c.child.try_wait().expect("wait") {
            return (st, t.elapsed().as_secs_f64());
        }
        assert!(t.elapsed() < Duration::from_secs(600), "collector did not exit within 10 minutes of SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What must be the same after a restart: job counts by state, and, over a 400-day window (so that no job
/// leaves it while the collector restarts), each pool's time-to-first-step figures and the comparison's job
/// counts and time-to-first-step summaries. SLO statuses are not part of it: their 28-day windows move and
/// waiting jobs cross thresholds during the restart.
fn state_fingerprint(http: std::net::SocketAddr) -> Value {
    let (_, ov) = http_get(http, "/api/v1/overview?window=400d");
    let (_, cmp) = http_get(http, "/api/v1/compare?window=400d&by=gpu_class");
    let side = |s: &Value| {
        json!({"jobs": s["jobs"], "started": s["started"], "still_waiting": s["still_waiting"],
               "ended_before_start": s["ended_before_start"], "ttfs_seconds": s["ttfs_seconds"]})
    };
    let groups: Vec<Value> = cmp["groups"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|g| json!({"group": g["group"], "left": side(&g["left"]), "right": side(&g["right"])}))
        .collect();
    json!({"jobs_by_state": ov["jobs_by_state"], "pools": ov["pools"], "compare": groups})
}

/// SLO totals (decided jobs and good ones) over each SLO's own window.
fn slo_totals(http: std::net::SocketAddr) -> Value {
    let (_, slos) = http_get(http, "/api/v1/slos");
    let totals: Vec<Value> = slos["slos"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|s| json!({"name": s["name"], "total": s["status"]["total"], "good": s["status"]["good"]}))
        .collect();
    Value::Array(totals)
}

fn run_size(rt: &tokio::runtime::Runtime, a: &CoreArgs, jobs: u64) -> SizeReport {
    println!();
    println!("## core: {jobs} jobs, {:.0}% open, over {} days", a.open_share * 100.0, a.days);
    let mut rep = SizeReport { jobs, cells: Vec::new(), json: json!({"jobs": jobs}) };
    // Holds a temporary store until this size is done.
    let mut _tmp: Option<tempfile::TempDir> = None;
    let (db, build_file) = match &a.keep_dir {
        Some(k) => {
            let d = k.join(jobs.to_string());
            std::fs::create_dir_all(&d).expect("keep dir");
            (d.join("db"), Some(d.join("build.json")))
        }
        None => {
            let t = tempfile::Builder::new().prefix("startline-core-").tempdir().expect("tempdir");
            let db = t.path().join("db");
            _tmp = Some(t);
            (db, None)
        }
    };
    let previous: Option<Value> = build_file
        .as_ref()
        .filter(|_| db.exists())
        .and_then(|f| std::fs::read_to_string(f).ok())
        .and_then(|s| serde_json::from_str(&s).ok());
    if db.exists() && build_file.is_some() && previous.is_none() {
        panic!("{} exists without its build.json (an interrupted build?): remove it", db.display());
    }

    let (c, first_start) = start_collector(&db, a);
    let pid = c.child.id();
    let ingest = match previous {
        Some(prev) => {
            let same = prev["jobs"] == json!(jobs)
                && prev["open_share"] == json!(a.open_share)
                && prev["days"] == json!(a.days)
                && prev["seed"] == json!(a.seed);
            assert!(same, "{} was built with other options: {prev}", db.display());
            let age_h = (startline_proto::time::now_ms() - prev["built_at"].as_i64().unwrap_or(0)) as f64 / 3.6e6;
            println!(
                "- reusing the store in {} (built {age_h:.1} h ago; ingest figures are from that build); opened in {first_start:.2} s",
                db.display()
            );
            rep.json["reused_store"] = json!(true);
            rep.json["first_open_s"] = json!(first_start);
            prev
        }
        None => {
            let fleet_end = startline_proto::time::now_ms();
            let fleet = Fleet {
                seed: a.seed,
                jobs,
                open_share: a.open_share,
                start_ms: fleet_end - a.days as i64 * 86_400_000,
                end_ms: fleet_end,
                pools: fleet_pools(),
            };
            let (tx, rx) = tokio::sync::mpsc::channel(64);
            let cpu0 = cpu_seconds(pid);
            let generator = spawn_generator(fleet, a.batch, tx);
            let expected = jobs * 20;
            let run = rt.block_on(closed_loop(&c.endpoint(), rx, a.in_flight, Some(expected)));
            let cpu = cpu_seconds(pid) - cpu0;
            let g = generator.join().expect("generator");
            let sent = run.accepted + run.duplicates + run.rejected;
            assert_eq!(sent, g.events, "every generated event acknowledged");
            let eps = g.events as f64 / run.secs;
            println!(
                "- ingest: {} jobs ({} open), {} events ({:.1} per job) in {:.1} s: {eps:.0} ev/s; accepted {}, \
                 duplicates {}, rejected {}{}; collector CPU {:.1} µs/event; generator {:.1} s",
                g.jobs,
                g.open_jobs,
                g.events,
                g.events as f64 / g.jobs as f64,
                run.secs,
                run.accepted,
                run.duplicates,
                run.rejected,
                run.first_rejection.as_deref().map_or(String::new(), |r| format!(" (first: {r})")),
                cpu * 1e6 / g.events.max(1) as f64,
                g.gen_secs
            );
            std::thread::sleep(Duration::from_secs(a.settle));
            let rss = status_kib(pid, "VmRSS");
            let hwm = status_kib(pid, "VmHWM");
            let (disk, alloc) = dir_size(&db);
            println!(
                "- after ingest (+{} s): RSS {:.0} MiB (peak {:.0} MiB); data dir {:.1} MiB ({:.1} MiB allocated)",
                a.settle,
                mib(rss),
                mib(hwm),
                disk as f64 / 1048576.0,
                alloc as f64 / 1048576.0
            );
            json!({
                "jobs": jobs,
                "open_share": a.open_share,
                "days": a.days,
                "seed": a.seed,
                "built_at": fleet_end,
                "open_jobs": g.open_jobs,
                "events": g.events,
                "events_per_job": g.events as f64 / g.jobs.max(1) as f64,
                "accepted": run.accepted,
                "duplicates": run.duplicates,
                "rejected": run.rejected,
                "ingest_s": run.secs,
                "events_per_s": eps,
                "collector_cpu_us_per_event": cpu * 1e6 / g.events.max(1) as f64,
                "protobuf_mean_bytes": g.encoded_bytes as f64 / g.events.max(1) as f64,
                "disk_bytes_after_ingest": disk,
                "disk_allocated_bytes_after_ingest": alloc,
                "rss_mib_after_ingest": mib(rss),
                "peak_rss_mib_ingest": mib(hwm),
            })
        }
    };
    // Written as soon as the store is built: a run cut short in its queries (a 10M store's take many minutes) can
    // be resumed on the kept store.
    if let (Some(f), None) = (&build_file, rep.json.get("reused_store")) {
        std::fs::write(f, ingest.to_string()).expect("build.json");
    }
    let events = ingest["events"].as_u64().unwrap_or(0).max(1);
    let pb_mean = ingest["protobuf_mean_bytes"].as_f64().unwrap_or(0.0);
    for k in [
        "open_jobs",
        "events",
        "events_per_job",
        "accepted",
        "duplicates",
        "rejected",
        "ingest_s",
        "events_per_s",
        "collector_cpu_us_per_event",
        "protobuf_mean_bytes",
        "disk_bytes_after_ingest",
        "disk_allocated_bytes_after_ingest",
        "rss_mib_after_ingest",
        "peak_rss_mib_ingest",
    ] {
        rep.json[k] = ingest[k].clone();
    }
    let open = ingest["open_jobs"].as_u64().unwrap_or(0);
    rep.cell("jobs (open: waiting or running)", format!("{} ({})", thousands(jobs), thousands(open)));
    rep.cell(
        "events (per job)",
        format!("{} ({:.1})", thousands(events), ingest["events_per_job"].as_f64().unwrap_or(0.0)),
    );
    rep.cell(
        "ingest: time, events/s",
        format!(
            "{:.0} s, {} ev/s",
            ingest["ingest_s"].as_f64().unwrap_or(0.0),
            thousands(ingest["events_per_s"].as_f64().unwrap_or(0.0) as u64)
        ),
    );
    rep.cell(
        "collector CPU per event (ingest)",
        format!("{:.1} µs", ingest["collector_cpu_us_per_event"].as_f64().unwrap_or(0.0)),
    );
    rep.cell("jobs in memory / folded (collector self-metrics)", residence(&c));
    rep.cell("expected-start sweep: jobs waiting, last sweep, changes written", estimate_sweep(&c));
    let disk_ingest = ingest["disk_bytes_after_ingest"].as_f64().unwrap_or(0.0) / events as f64;
    rep.cell(
        "bytes on disk per event, after ingest (x protobuf)",
        format!("{disk_ingest:.0} B ({:.2}x of {pb_mean:.0} B)", disk_ingest / pb_mean.max(1.0)),
    );
    rep.json["disk_bytes_per_event_after_ingest"] = json!(disk_ingest);
    rep.json["disk_ratio_after_ingest"] = json!(disk_ingest / pb_mean.max(1.0));
    let rss_ingest = ingest["rss_mib_after_ingest"].as_f64();
    rep.cell(
        "RSS after ingest (per million jobs); peak",
        match rss_ingest {
            Some(r) => format!(
                "{r:.0} MiB ({:.0} MiB/M); peak {:.0} MiB",
                r / (jobs as f64 / 1e6),
                ingest["peak_rss_mib_ingest"].as_f64().unwrap_or(0.0)
            ),
            None => "n/a".into(),
        },
    );
    if let Some(r) = rss_ingest {
        rep.json["rss_mib_per_million_jobs_after_ingest"] = json!(r / (jobs as f64 / 1e6));
    }

    // API timings.
    let mut api = serde_json::Map::new();
    let http = c.http;
    let fixed = [
        ("`GET /api/v1/compare?window=30d`", "/api/v1/compare?window=30d"),
        ("`GET /api/v1/compare?window=30d&by=gpu_class`", "/api/v1/compare?window=30d&by=gpu_class"),
        ("`GET /api/v1/overview` (24 h)", "/api/v1/overview"),
        ("`GET /api/v1/overview?window=30d`", "/api/v1/overview?window=30d"),
        ("`GET /api/v1/slos` (both SLOs)", "/api/v1/slos"),
        ("`GET /api/v1/slos/normal-start` (28 d)", "/api/v1/slos/normal-start"),
        ("`GET /api/v1/slos/urgent-start?window=7d`", "/api/v1/slos/urgent-start?window=7d"),
        ("`GET /metrics`", "/metrics"),
    ];
    for (label, path) in fixed {
        let t = time_get(http, path, a.reps);
        println!("- GET {path}: {} ({} bytes)", timing_cell(&t, a.reps), t.bytes);
        rep.cell(label, timing_cell(&t, a.reps));
        api.insert(path.to_string(), timing_json(&t));
    }
    concurrent_reads(&c, &mut rep);
    history_files(&c, &db, a, &mut rep);
    let now_s = startline_proto::time::now_ms() / 1000;
    const DEEP: usize = 20_000;
    for (label, q) in listings(now_s) {
        let sep = if q.is_empty() { "" } else { "&" };
        let first = format!("/api/v1/jobs?limit=100{sep}{q}");
        let t = time_get(http, &first, a.reps);
        println!("- GET {first}: {}", timing_cell(&t, a.reps));
        rep.cell(format!("jobs list `{label}`, first page of 100"), timing_cell(&t, a.reps));
        api.insert(first, timing_json(&t));
        let deep_label = format!("jobs list `{label}`, page of 100 after {}k matches", DEEP / 1000);
        match deep_token(http, &q, DEEP) {
            Ok((Some(token), passed)) => {
                let path = format!(
                    "{}&page_token={}",
                    &format!("/api/v1/jobs?limit=100{sep}{q}"),
                    crate::query_escape(&token)
                );
                let t = time_get(http, &path, a.reps);
                let note = if passed < DEEP { format!(" (after {passed}: the last page)") } else { String::new() };
                println!("- GET {path}: {}{note}", timing_cell(&t, a.reps));
                rep.cell(deep_label, format!("{}{note}", timing_cell(&t, a.reps)));
                api.insert(format!("/api/v1/jobs?limit=100{sep}{q}&page_token=<after {passed}>"), timing_json(&t));
            }
            Ok((None, _)) => rep.cell(deep_label, "one page only"),
            Err(status) => rep.cell(deep_label, format!("HTTP {status}")),
        }
    }
    // Job detail: a done job (its events read from the store) and an open one.
    for (label, q) in [("done", "state=done"), ("running", "state=running")] {
        let (_, body) = http_get(http, &format!("/api/v1/jobs?limit=1&{q}"));
        let cell_label = format!("`GET /api/v1/jobs/{{id}}`, a {label} job");
        match body["jobs"][0]["job_id"].as_str() {
            Some(id) => {
                let path = format!("/api/v1/jobs/{}", path_escape(id));
                let t = time_get(http, &path, a.reps);
                println!("- GET {path}: {}", timing_cell(&t, a.reps));
                rep.cell(cell_label, timing_cell(&t, a.reps));
                api.insert(format!("/api/v1/jobs/<{label}>"), timing_json(&t));
            }
            None => rep.cell(cell_label, "no such job"),
        }
    }
    rep.json["api"] = Value::Object(api);

    // Restart on the same data directory.
    let before = state_fingerprint(http);
    let slos_before = slo_totals(http);
    let (status, stop_s) = stop(c);
    let (disk, alloc) = dir_size(&db);
    let disk_per_event = disk as f64 / events as f64;
    println!(
        "- SIGTERM: exited {status} in {stop_s:.2} s; data dir {:.1} MiB ({:.1} MiB allocated): {disk_per_event:.0} B per event, \
         protobuf mean {pb_mean:.1} B",
        disk as f64 / 1048576.0,
        alloc as f64 / 1048576.0
    );
    rep.cell(
        "bytes on disk per event, after clean stop (x protobuf)",
        format!("{disk_per_event:.0} B ({:.2}x of {pb_mean:.0} B)", disk_per_event / pb_mean.max(1.0)),
    );
    rep.cell("stop on SIGTERM", format!("{stop_s:.2} s"));
    rep.json["stop_s"] = json!(stop_s);
    rep.json["disk_bytes_after_stop"] = json!(disk);
    rep.json["disk_allocated_bytes_after_stop"] = json!(alloc);
    rep.json["disk_bytes_per_event"] = json!(disk_per_event);
    rep.json["disk_ratio_to_protobuf"] = json!(disk_per_event / pb_mean.max(1.0));

    let (c, ready_s) = start_collector(&db, a);
    let rss = status_kib(c.child.id(), "VmRSS");
    let first_compare = {
        let s = Instant::now();
        let (st, _) = http_get_text(c.http, "/api/v1/compare?window=30d");
        (st, s.elapsed().as_secs_f64() * 1000.0)
    };
    let after = state_fingerprint(c.http);
    let slos_after = slo_totals(c.http);
    let same = before == after;
    println!(
        "- restart: spawn to /readyz 200 in {ready_s:.2} s; RSS {:.0} MiB ({:.0} MiB per million jobs); first compare \
         after restart {:.0} ms (HTTP {}); state after restart {}",
        mib(rss),
        mib(rss) / (jobs as f64 / 1e6),
        first_compare.1,
        first_compare.0,
        if same { "the same" } else { "DIFFERENT" }
    );
    if !same {
        println!("  before: {before}\n  after:  {after}");
    }
    println!("  SLO totals before the restart {slos_before}, after {slos_after} (not compared: the windows move)");
    rep.cell("restart: spawn to `/readyz` 200", format!("{ready_s:.2} s"));
    rep.cell(
        "RSS after restart (per million jobs)",
        format!("{:.0} MiB ({:.0} MiB/M)", mib(rss), mib(rss) / (jobs as f64 / 1e6)),
    );
    rep.cell("first `compare?window=30d` after restart", format!("{:.0} ms", first_compare.1));
    rep.cell(
        "after restart: jobs by state, per-pool and compared TTFS figures (400 d)",
        if same { "same" } else { "DIFFERENT" },
    );
    rep.json["restart_ready_s"] = json!(ready_s);
    rep.json["rss_mib_after_restart"] = json!(mib(rss));
    rep.json["rss_mib_per_million_jobs_after_restart"] = json!(mib(rss) / (jobs as f64 / 1e6));
    rep.json["first_compare_after_restart_ms"] = json!(first_compare.1);
    rep.json["state_same_after_restart"] = json!(same);
    rep.json["state"] = before["jobs_by_state"].clone();
    rep.json["slo_totals_before_restart"] = slos_before;
    rep.json["slo_totals_after_restart"] = slos_after;
    let (status, _) = stop(c);
    assert!(status.success(), "collector exited {status}");
    rep
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// The collector core's aims (RSS, bytes on disk, restart, query times), by row label prefix.
fn target(label: &str) -> &'static str {
    if label.starts_with("RSS") {
        "≤ 256 MiB per million jobs"
    } else if label.starts_with("bytes on disk") {
        "≤ 1.0x protobuf"
    } else if label.starts_with("restart") {
        "≤ 1 s at 1M jobs"
    } else if label.contains("compare?window=30d`") || label.contains("overview") {
        "≤ 50 ms at 1M jobs"
    } else if label.contains("slos") {
        "≤ 10 ms"
    } else if label.starts_with("jobs list") {
        "≤ 20 ms per page"
    } else {
        ""
    }
}

fn print_table(a: &CoreArgs, reports: &[SizeReport]) {
    let mut labels: Vec<String> = Vec::new();
    for r in reports {
        for (l, _) in &r.cells {
            if !labels.contains(l) {
                labels.push(l.clone());
            }
        }
    }
    println!();
    println!(
        "Core benchmark: the simulator's mix over {} days, {:.0}% of jobs open at the end; API timings p50 / max of {} \
         after 2 warm-ups; one run.",
        a.days,
        a.open_share * 100.0,
        a.reps
    );
    println!();
    let mut head = String::from("| measure |");
    let mut rule = String::from("|---|");
    for r in reports {
        head.push_str(&format!(" {} jobs |", thousands(r.jobs)));
        rule.push_str("---|");
    }
    head.push_str(" aim |");
    rule.push_str("---|");
    println!("{head}");
    println!("{rule}");
    for l in &labels {
        let mut row = format!("| {l} |");
        for r in reports {
            let v = r.cells.iter().find(|(k, _)| k == l).map_or("", |(_, v)| v.as_str());
            row.push_str(&format!(" {v} |"));
        }
        row.push_str(&format!(" {} |", target(l)));
        println!("{row}");
    }
    println!();
    println!(
        "Durable ingest against the sled ceiling of the same run and ack p99 at 10% of max rate are not repeated \
         here: `startline-bench ingest` (or `./scripts/bench.sh ingest`) measures them."
    );
}

/// Waiting jobs, the last estimate sweep's duration and the expected-start changes written, from `/metrics`.
fn estimate_sweep(c: &Collector) -> String {
    let (_, text) = http_get_text(c.http, "/metrics");
    let sum = |prefix: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(prefix) && !l.starts_with('#'))
            .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
            .sum()
    };
    format!(
        "{} / {:.0} ms / {}",
        thousands(sum("startline_jobs_waiting{") as u64),
        sum("startline_collector_stream_estimate_sweep_duration_seconds") * 1000.0,
        thousands(sum("startline_collector_stream_expected_start_changes_total") as u64),
    )
}

/// `hot / folded` jobs and the index's estimated bytes, from the collector's `/metrics`.
fn residence(c: &Collector) -> String {
    let (_, text) = http_get_text(c.http, "/metrics");
    let value = |prefix: &str, attr: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(prefix) && l.contains(attr))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    format!(
        "{} / {} (index estimate: hot {:.0} MiB, folded {:.0} MiB)",
        thousands(value("startline_collector_jobs{", "residence=\"hot\"") as u64),
        thousands(value("startline_collector_jobs{", "residence=\"folded\"") as u64),
        value("startline_collector_memory_bytes{", "part=\"hot_jobs\"") / 1048576.0,
        value("startline_collector_memory_bytes{", "part=\"folded_jobs\"") / 1048576.0,
    )
}
