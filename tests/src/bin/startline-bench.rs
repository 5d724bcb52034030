//! `startline-bench`: Startline's benchmark harness. One command:
//!
//! ```text
//! cargo run --release -p startline-tests --bin startline-bench -- ingest
//! ```
//!
//! `ingest` measures, in one run and on the same simulated messages:
//! - ceiling 1: raw sled (the collector's log encoding, batch insert + flush per 1000 events);
//! - ceiling 2: a no-op tonic server implementing `IngestService` (acks without storing);
//! - the real collector process over loopback: closed-loop max durable throughput, server CPU per event, bytes
//!   on disk per event, and open-loop ack latency p50/p99 at fixed offered rates (10% and 50% of its max);
//! - restart-to-ready time of the collector binary over a store holding `--restart-jobs` jobs.
//!
//! `busy` (`startline-bench busy [--busy-events N] [--busy-rate EV_PER_S]`) measures whether one busy job slows
//! everyone else: a probe client sends one-event batches for other jobs and records their ack latency, first alone
//! (the baseline), then while another client streams `--busy-events` events (default 1M, open loop at
//! `--busy-rate`, default 20000/s) spread over 1000 jobs, onto one job in time order, and onto one job with 1% of
//! its events late.
//!
//! `core` (`startline-bench core [--jobs N | --sizes N,N] [--open-share F] [--days D] [--keep-dir PATH] ...`,
//! see `corebench`) measures the collector core's costs as tracked jobs grow: ingest of the simulator's
//! 30-day mix, bytes on disk per event against protobuf, RSS per million jobs, API timings and restart. It is
//! long, so `all` does not include it.
//!
//! `predict` (`startline-bench predict [--days 28] [--jobs-per-hour 60] [--seed 7]`, see `predictbench`) measures
//! breach prediction on the simulator's fleet: breaches warned in advance, lead time, false warnings.
//! `eta` (`startline-bench eta [--days 14] [--jobs-per-hour 60] [--seed 7]`, see `etabench`) measures the expected
//! start of waiting jobs on the simulator's fleet: interval coverage and error against the pool's median wait and
//! the scheduler's estimate, per checkpoint of the wait and per pool kind.
//!
//! Results print as Markdown for BENCHMARKS.md. Timings live here, never in tests.

use startline_agent::simulate::engine::{self, FleetConfig};
use startline_agent::simulate::model::fleet;
use startline_collector::job::{CompactEvent, JobRecord};
use startline_collector::store::{encode_log_value, Store};
use startline_proto::pb::{self, ingest_service_client::IngestServiceClient, ingest_service_server};
use startline_tests::Collector;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio_stream::wrappers::ReceiverStream;

type Batches = Vec<Vec<pb::LifecycleEvent>>;

struct Args {
    events: usize,
    batch: usize,
    restart_jobs: u64,
    collector_config: Option<String>,
    waiting: u64,
    crossing: u64,
    busy_events: usize,
    busy_rate: u64,
    overload_secs: u64,
    cmd: String,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        events: 400_000,
        batch: 1000,
        restart_jobs: 1_000_000,
        collector_config: None,
        waiting: 100_000,
        crossing: 2_000,
        busy_events: 1_000_000,
        busy_rate: 20_000,
        overload_secs: 60,
        cmd: String::new(),
    };
    let mut it = std::env::args().skip(1);
    let mut saw_cmd = false;
    while let Some(x) = it.next() {
        let mut val =
            |name: &str| it.next().and_then(|v| v.parse::<u64>().ok()).ok_or(format!("{name} needs a number"));
        match x.as_str() {
            "ingest" | "slo" | "busy" | "overload" | "all" => {
                saw_cmd = true;
                a.cmd = x.clone();
            }
            "--waiting" => a.waiting = val("--waiting")?,
            "--crossing" => a.crossing = val("--crossing")?,
            "--busy-events" => a.busy_events = val("--busy-events")? as usize,
            "--busy-rate" => a.busy_rate = val("--busy-rate")?.max(1),
            "--overload-secs" => a.overload_secs = val("--overload-secs")?.max(1),
            "--events" => a.events = val("--events")? as usize,
            "--batch" => a.batch = val("--batch")? as usize,
            "--restart-jobs" => a.restart_jobs = val("--restart-jobs")?,
            "--collector-config" => a.collector_config = Some(it.next().ok_or("--collector-config needs a file")?),
            other => return Err(format!("unknown argument {other:?}; usage: startline-bench ingest|slo|busy|overload|all|core [--events N] [--batch N] [--restart-jobs N] [--waiting N] [--crossing N] [--busy-events N] [--busy-rate EV_PER_S] [--overload-secs N] [--collector-config FILE]")),
        }
    }
    if !saw_cmd {
        return Err(
            "usage: startline-bench ingest|slo|busy|overload|all|core [--events N] [--batch N] [--restart-jobs N] [--waiting N] [--crossing N] [--busy-events N] [--busy-rate EV_PER_S] [--overload-secs N] [--collector-config FILE]"
                .into(),
        );
    }
    Ok(a)
}

/// Simulated events (realistic sizes and mixes: a job every 30 s on a fleet sized for that rate), each job's
/// together, relabelled per phase so every phase stores fresh events.
fn make_events(n: usize, phase: &str) -> Vec<pb::LifecycleEvent> {
    let t0 = startline_proto::time::now_ms() - 40 * 86_400_000;
    let end = t0 + 35 * 86_400_000;
    let times: Vec<i64> = (0..).map(|j: i64| t0 + j * 30_000).take_while(|t| *t < end - 86_400_000).collect();
    let stream = engine::events(FleetConfig::new(9, fleet(0, 0, 120.0), t0), times, end);
    let mut out = Vec::with_capacity(n);
    for job in engine::by_job(stream) {
        for mut e in job {
            e.job_id = format!("{phase}/{}", e.job_id);
            out.push(e);
        }
        if out.len() >= n {
            break;
        }
    }
    assert!(out.len() >= n, "35 days of a job every 30 s hold {} events, {n} asked for", out.len());
    out.truncate(n);
    out
}

fn batches(events: Vec<pb::LifecycleEvent>, size: usize) -> Batches {
    let mut out = Vec::new();
    let mut it = events.into_iter().peekable();
    while it.peek().is_some() {
        out.push(it.by_ref().take(size).collect());
    }
    out
}

fn sled_ceiling(events: &[pb::LifecycleEvent], batch: usize) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = sled::Config::new().path(dir.path()).mode(sled::Mode::HighThroughput).open().expect("sled");
    let tree = db.open_tree("log").expect("tree");
    let start = Instant::now();
    let mut seq = 0u64;
    for chunk in events.chunks(batch) {
        let mut b = sled::Batch::default();
        for e in chunk {
            seq += 1;
            b.insert(&seq.to_be_bytes(), encode_log_value(e));
        }
        tree.apply_batch(b).expect("apply");
        db.flush().expect("flush");
    }
    events.len() as f64 / start.elapsed().as_secs_f64()
}

#[derive(Clone, Default)]
struct Noop;

#[tonic::async_trait]
impl ingest_service_server::IngestService for Noop {
    type PublishStream = ReceiverStream<Result<pb::PublishAck, tonic::Status>>;
    async fn publish(
        &self,
        req: tonic::Request<tonic::Streaming<pb::PublishRequest>>,
    ) -> Result<tonic::Response<Self::PublishStream>, tonic::Status> {
        let mut inbound = req.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            while let Ok(Some(r)) = inbound.message().await {
                let ack =
                    pb::PublishAck { batch_seq: r.batch_seq, accepted: r.events.len() as u32, ..Default::default() };
                if tx.send(Ok(ack)).await.is_err() {
                    break;
                }
            }
        });
        Ok(tonic::Response::new(ReceiverStream::new(rx)))
    }
    async fn publish_batch(
        &self,
        req: tonic::Request<pb::PublishRequest>,
    ) -> Result<tonic::Response<pb::PublishAck>, tonic::Status> {
        let r = req.into_inner();
        Ok(tonic::Response::new(pb::PublishAck {
            batch_seq: r.batch_seq,
            accepted: r.events.len() as u32,
            ..Default::default()
        }))
    }
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

/// Closed loop: keeps `window` batches in flight; returns events per second.
async fn closed_loop(endpoint: &str, batches: Batches, window: usize) -> f64 {
    let mut c = client(endpoint).await;
    let n: usize = batches.iter().map(Vec::len).sum();
    let count = batches.len();
    let (tx, rx) = tokio::sync::mpsc::channel(window);
    let start = Instant::now();
    let mut acks = c.publish(ReceiverStream::new(rx)).await.expect("publish").into_inner();
    let sender = tokio::spawn(async move {
        for (i, events) in batches.into_iter().enumerate() {
            if tx.send(pb::PublishRequest { batch_seq: i as u64 + 1, events }).await.is_err() {
                break;
            }
        }
    });
    let mut got = 0;
    while got < count {
        match acks.message().await {
            Ok(Some(_)) => got += 1,
            other => panic!("stream ended early: {other:?}"),
        }
    }
    let _ = sender.await;
    n as f64 / start.elapsed().as_secs_f64()
}

/// Open loop: batch i is due at `i / batches_per_sec`; latency = ack time - due time. Returns (p50, p99) in ms.
/// Ack latency of an open loop: `(p50, p99)` in milliseconds measured from each batch's due time (what a client
/// on that schedule sees, including the sender's own timer lateness) and from the moment it was handed to the
/// stream (the collector's share: the sender never waits for the collector, so this hides no stall), and the
/// achieved rate.
struct OpenLoop {
    due: (f64, f64),
    sent: (f64, f64),
    achieved: f64,
}

async fn open_loop(endpoint: &str, batches: Batches, events_per_sec: f64) -> OpenLoop {
    let mut c = client(endpoint).await;
    let per_batch = batches.first().map_or(1, Vec::len) as f64;
    let interval = Duration::from_secs_f64(per_batch / events_per_sec);
    let count = batches.len();
    let (tx, rx) = tokio::sync::mpsc::channel(count.max(1));
    let mut acks = c.publish(ReceiverStream::new(rx)).await.expect("publish").into_inner();
    let t0 = tokio::time::Instant::now() + Duration::from_millis(50);
    let sent_at = std::sync::Arc::new(std::sync::Mutex::new(vec![None; count]));
    let sent = sent_at.clone();
    let sender = tokio::spawn(async move {
        for (i, events) in batches.into_iter().enumerate() {
            tokio::time::sleep_until(t0 + interval * i as u32).await;
            sent.lock().expect("not poisoned")[i] = Some(tokio::time::Instant::now());
            if tx.send(pb::PublishRequest { batch_seq: i as u64 + 1, events }).await.is_err() {
                break;
            }
        }
    });
    // Latency from the due time (not the send time), so a stalled collector is not hidden by a client that
    // waited for it (coordinated omission); recorded in microseconds to 3 significant figures (0.1%).
    let hist = || hdrhistogram::Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("constant bounds");
    let (mut from_due, mut from_sent) = (hist(), hist());
    while from_due.len() < count as u64 {
        match acks.message().await {
            Ok(Some(ack)) => {
                let now = tokio::time::Instant::now();
                let i = ack.batch_seq as usize - 1;
                let due = t0 + interval * i as u32;
                from_due.saturating_record((now.saturating_duration_since(due).as_micros() as u64).max(1));
                let at = sent_at.lock().expect("not poisoned")[i].unwrap_or(due);
                from_sent.saturating_record((now.saturating_duration_since(at).as_micros() as u64).max(1));
            }
            other => panic!("stream ended early: {other:?}"),
        }
    }
    let _ = sender.await;
    let achieved = count as f64 * per_batch / (tokio::time::Instant::now() - t0).as_secs_f64();
    let q = |h: &hdrhistogram::Histogram<u64>, p: f64| h.value_at_quantile(p) as f64 / 1000.0;
    OpenLoop { due: (q(&from_due, 0.5), q(&from_due, 0.99)), sent: (q(&from_sent, 0.5), q(&from_sent, 0.99)), achieved }
}

/// The latency floor of a durable ack on this disk: one 8 KiB append plus `fdatasync` (what a group commit of
/// ~100 events costs at the least), `n` times; `(p50, p99)` in milliseconds.
fn fsync_floor(dir: &std::path::Path, n: usize) -> (f64, f64) {
    use std::io::Write;
    let path = dir.join("fsync-floor");
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path).expect("fsync floor file");
    let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("constant bounds");
    let block = vec![0x5au8; 8192];
    for _ in 0..n {
        let t = Instant::now();
        f.write_all(&block).expect("write");
        f.sync_data().expect("fdatasync");
        h.saturating_record((t.elapsed().as_micros() as u64).max(1));
    }
    let _ = std::fs::remove_file(&path);
    (h.value_at_quantile(0.5) as f64 / 1000.0, h.value_at_quantile(0.99) as f64 / 1000.0)
}

fn dir_size(p: &std::path::Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            let Ok(md) = e.metadata() else { continue };
            total += if md.is_dir() { dir_size(&e.path()) } else { md.len() };
        }
    }
    total
}

fn logical_bytes(events: &[pb::LifecycleEvent]) -> u64 {
    events.iter().map(|e| encode_log_value(e).len() as u64).sum()
}

/// Builds a store with `jobs` jobs submitted over the last 30 days (a tenth still waiting, the rest up to their
/// first step) directly through the
/// store API, checkpointed as a cleanly stopped collector leaves it.
fn build_restart_store(path: &std::path::Path, jobs: u64) -> u64 {
    let store = Store::open(path).expect("open");
    let t0 = startline_proto::time::now_ms() - 30 * 86_400_000;
    let mut seq = 0u64;
    let mut chunk: BTreeMap<String, JobRecord> = BTreeMap::new();
    let mut entries = Vec::new();
    // Spread over the 30 days before now, on a fleet sized for that rate; every job runs to its end.
    let times: Vec<i64> = (0..jobs).map(|j| t0 + (j as i128 * 30 * 86_400_000 / jobs.max(1) as i128) as i64).collect();
    let rate = jobs as f64 / (30.0 * 24.0);
    let stream = engine::events(FleetConfig::new(5, fleet(0, 0, rate), t0), times, t0 + 33 * 86_400_000);
    for (j, evs) in engine::by_job(stream).enumerate() {
        let j = j as u64;
        // A tenth still waiting (submitted and queued); the rest up to and including their first step.
        let first_step = evs
            .iter()
            .position(|e| matches!(e.kind, Some(pb::lifecycle_event::Kind::FirstStep(_))))
            .map_or(evs.len(), |i| i + 1);
        let keep = if j % 10 == 0 { 2 } else { first_step };
        for e in evs.into_iter().take(keep) {
            seq += 1;
            let ce = CompactEvent::from_pb(&e, seq).expect("kind");
            chunk.entry(e.job_id.clone()).or_default().insert(ce);
            entries.push((seq, encode_log_value(&e)));
        }
        if chunk.len() >= 20_000 {
            store.append_durable(&entries).expect("append");
            store.checkpoint(chunk.iter().map(|(k, v)| (k.as_str(), v)), seq).expect("checkpoint");
            entries.clear();
            chunk.clear();
        }
    }
    store.append_durable(&entries).expect("append");
    store.checkpoint(chunk.iter().map(|(k, v)| (k.as_str(), v)), seq).expect("checkpoint");
    store.flush().expect("flush");
    seq
}

fn main() {
    if std::env::args().skip(1).any(|x| x == "sim") {
        match startline_tests::simbench::parse_args(std::env::args().skip(1)) {
            Ok(a) => startline_tests::simbench::main(a),
            Err(e) => {
                eprintln!("startline-bench sim: {e}");
                std::process::exit(2);
            }
        }
        return;
    }
    if std::env::args().skip(1).any(|x| x == "eta") {
        match startline_tests::etabench::parse_args(std::env::args().skip(1)) {
            Ok(a) => startline_tests::etabench::main(a),
            Err(e) => {
                eprintln!("startline-bench eta: {e}");
                std::process::exit(2);
            }
        }
        return;
    }
    if std::env::args().skip(1).any(|x| x == "predict") {
        match startline_tests::predictbench::parse_args(std::env::args().skip(1)) {
            Ok(a) => startline_tests::predictbench::main(a),
            Err(e) => {
                eprintln!("startline-bench predict: {e}");
                std::process::exit(2);
            }
        }
        return;
    }
    // `core` has options of its own (lists, shares, paths): it parses them itself.
    if std::env::args().skip(1).any(|x| x == "core") {
        match startline_tests::corebench::parse_args(std::env::args().skip(1)) {
            Ok(a) => startline_tests::corebench::main(a),
            Err(e) => {
                eprintln!("startline-bench core: {e}");
                std::process::exit(2);
            }
        }
        return;
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("startline-bench: {e}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(run(args));
}

async fn run(a: Args) {
    let machine = format!(
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
    );
    println!("# startline-bench {} ({machine})", a.cmd);
    let mut rows: Vec<String> = Vec::new();
    if a.cmd == "ingest" || a.cmd == "all" {
        rows.extend(ingest_bench(&a).await);
    }
    if a.cmd == "slo" || a.cmd == "all" {
        rows.extend(breach_bench(&a).await);
    }
    if a.cmd == "busy" || a.cmd == "all" {
        rows.extend(busy_bench(&a).await);
    }
    if a.cmd == "overload" || a.cmd == "all" {
        rows.extend(overload_bench(&a).await);
    }
    if a.cmd != "busy" && a.cmd != "overload" {
        rows.extend(restart_bench(&a, a.cmd != "ingest"));
    }
    println!();
    println!("| measure | value | ratio |");
    println!("|---|---|---|");
    for r in rows {
        println!("{r}");
    }
}

/// Overload: 8 clients at full speed with `when_full = wait` and `reject`; what clients see, probe
/// latencies of /healthz and /api/v1/slos during the blast, and RSS.
async fn overload_bench(a: &Args) -> Vec<String> {
    use startline_tests::overload::{percentile, run, OverloadConfig};
    let mut rows = Vec::new();
    // `reject` with a queue smaller than 8 streams x 32 batches in flight, so that it does refuse.
    for (policy, queue) in [("wait", None), ("reject", Some(16))] {
        let cfg = OverloadConfig {
            duration: std::time::Duration::from_secs(a.overload_secs),
            when_full: policy.to_string(),
            queue_capacity: queue,
            ..OverloadConfig::default()
        };
        println!(
            "## overload: {} clients x {} s, when_full = {policy}, queue_capacity = {}",
            cfg.clients,
            a.overload_secs,
            queue.map_or("256 (default)".to_string(), |q| q.to_string())
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let r = run(&cfg, dir.path()).await;
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let rate = r.acked_events as f64 / r.seconds.max(0.001);
        rows.push(format!("| overload {policy}: events acknowledged | {} ({rate:.0} ev/s) | |", r.acked_events));
        rows.push(format!(
            "| overload {policy}: stream failures by status | {} | |",
            if r.statuses.is_empty() { "none".to_string() } else { format!("{:?}", r.statuses) }
        ));
        rows.push(format!(
            "| overload {policy}: RSS before / peak / end | {:.0} / {:.0} / {:.0} MiB | |",
            mib(r.rss_before),
            mib(r.rss_peak),
            mib(r.rss_end)
        ));
        for (path, v) in &r.probes {
            let over = v.iter().filter(|ms| **ms > 100.0).count();
            rows.push(format!(
                "| overload {policy}: GET {path} p50 / p99 / max ({} probes, {over} over 100 ms, {} failed) | {:.1} / {:.1} / {:.1} ms | {:.2} of 100 ms (p99) |",
                v.len(),
                r.probe_failures.get(path).copied().unwrap_or(0),
                percentile(v, 0.5),
                percentile(v, 0.99),
                percentile(v, 1.0),
                percentile(v, 0.99) / 100.0
            ));
        }
    }
    rows
}

async fn ingest_bench(a: &Args) -> Vec<String> {
    println!("## ingest: events per phase {}, batch {}", a.events, a.batch);
    // Ceiling 1: raw sled.
    let ev = make_events(a.events, "sled");
    let bytes_per_event = logical_bytes(&ev) as f64 / ev.len() as f64;
    let sled_eps = sled_ceiling(&ev, a.batch);
    drop(ev);
    println!("- sled ceiling (batch insert + flush per {}): {:.0} events/s", a.batch, sled_eps);

    // Ceiling 2: no-op tonic server, same messages.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let noop = tokio::spawn(
        tonic::transport::Server::builder()
            .initial_stream_window_size(Some(4 << 20))
            .initial_connection_window_size(Some(16 << 20))
            .add_service(ingest_service_server::IngestServiceServer::new(Noop).max_decoding_message_size(64 << 20))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))),
    );
    let noop_eps = closed_loop(&format!("http://{addr}"), batches(make_events(a.events, "noop"), a.batch), 8).await;
    noop.abort();
    println!("- no-op tonic ceiling (stream, 8 batches in flight): {noop_eps:.0} events/s");

    // The real collector.
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("db");
    let mut extra = vec!["--log", "warn"];
    if let Some(cfg) = &a.collector_config {
        extra.extend(["--config", cfg.as_str()]);
    }
    let c = Collector::start(&db, &extra);
    let ep = c.endpoint();
    let cpu0 = startline_tests::corebench::cpu_seconds(c.child.id());
    let ev = make_events(a.events, "durable");
    let durable_eps = closed_loop(&ep, batches(ev, a.batch), 8).await;
    let cpu = startline_tests::corebench::cpu_seconds(c.child.id()) - cpu0;
    println!("- collector durable max (stream, 8 batches in flight): {durable_eps:.0} events/s");
    println!("  server CPU per event: {:.1} us", cpu * 1e6 / a.events as f64);

    let floor = fsync_floor(dir.path(), 1000);
    println!("- fsync floor (8 KiB append + fdatasync, same disk): p50 {:.2} ms, p99 {:.2} ms", floor.0, floor.1);
    let mut lat_rows = Vec::new();
    for (i, share) in [0.1, 0.5].into_iter().enumerate() {
        let rate = durable_eps * share;
        // ~8 s of offered load (bounded by --events), batches of 100 as an agent's uplink would send.
        let n = ((rate * 8.0) as usize).clamp(2_000, a.events);
        let ev = make_events(n, &format!("open{i}"));
        let ol = open_loop(&ep, batches(ev, 100), rate).await;
        println!(
            "- open loop at {:.0}% of max ({rate:.0} ev/s offered, {:.0} achieved), batches of 100: ack from due \
             time p50 {:.2} ms, p99 {:.2} ms; from hand-over p50 {:.2} ms, p99 {:.2} ms",
            share * 100.0,
            ol.achieved,
            ol.due.0,
            ol.due.1,
            ol.sent.0,
            ol.sent.1
        );
        lat_rows.push((share, rate, ol, n));
    }
    let status = c.signal_and_wait("TERM");
    assert!(status.success());
    let on_disk = dir_size(&db);
    let stored_events = a.events + lat_rows.iter().map(|r| r.3).sum::<usize>();
    let per_event = on_disk as f64 / stored_events as f64;
    println!(
        "  bytes on disk per event: {per_event:.0} (logical {bytes_per_event:.0}; {:.2}x)",
        per_event / bytes_per_event
    );

    let mut rows = vec![
        format!("| sled ceiling | {sled_eps:.0} ev/s | 1.00 |"),
        format!("| no-op tonic ceiling | {noop_eps:.0} ev/s | {:.2} of sled |", noop_eps / sled_eps),
        format!(
            "| collector durable max | {durable_eps:.0} ev/s | **{:.2} of sled**, {:.3} of no-op |",
            durable_eps / sled_eps,
            durable_eps / noop_eps
        ),
        format!("| server CPU per event | {:.1} us | |", cpu * 1e6 / a.events as f64),
    ];
    rows.push(format!(
        "| fsync floor (8 KiB append + fdatasync) | p50 {:.2} ms, p99 {:.2} ms | 1.00 |",
        floor.0, floor.1
    ));
    for (share, rate, ol, _) in &lat_rows {
        rows.push(format!(
            "| ack latency at {:.0}% of max ({rate:.0} ev/s), from due time | p50 {:.2} ms, p99 {:.2} ms | p99 {:.1}x floor |",
            share * 100.0,
            ol.due.0,
            ol.due.1,
            ol.due.1 / floor.1
        ));
        rows.push(format!(
            "| ack latency at {:.0}% of max, from hand-over to the stream | p50 {:.2} ms, p99 {:.2} ms | p99 {:.1}x floor |",
            share * 100.0,
            ol.sent.0,
            ol.sent.1,
            ol.sent.1 / floor.1
        ));
    }
    rows.push(format!(
        "| bytes on disk per event | {per_event:.0} B | {:.2}x logical ({bytes_per_event:.0} B) |",
        per_event / bytes_per_event
    ));
    rows
}

/// Breach detection latency: `waiting` jobs wait (normal jobs, 2 h threshold, in the deadline index), and
/// `crossing` urgent jobs cross a 20 s threshold spread over ~20 s; the collector posts each page to a local
/// receiver speaking Alertmanager's `POST /api/v2/alerts`. Latency = arrival - the alert's `startsAt` (the
/// crossing time).
async fn breach_bench(a: &Args) -> Vec<String> {
    println!("## breach detection: {} jobs waiting, {} urgent crossings", a.waiting, a.crossing);
    let hook = startline_tests::HookServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[slo]]\nname = \"urgent-start\"\nthreshold = \"20s\"\nobjective = 99\nwindow = \"1d\"\n[slo.selector]\npriority = [\"urgent\"]\n\n[[slo]]\nname = \"normal-start\"\nthreshold = \"2h\"\nobjective = 95\n[slo.selector]\npriority = [\"normal\"]\n\n[alerts]\nalertmanager = [\"http://{}\"]\nresend_interval = \"1h\"\n",
            hook.addr
        ),
    )
    .expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--log", "warn", "--config", cfg.to_str().expect("utf8")]);
    let mut up = startline_agent::uplink::Publisher::new(startline_agent::uplink::UplinkSettings::new(c.endpoint()))
        .expect("uplink");
    let now = startline_proto::time::now_ms();
    let mk = |job: String, at: i64, prio: pb::PriorityClass| pb::LifecycleEvent {
        event_id: "s".into(),
        job_id: job,
        attempt: None,
        source: "bench".into(),
        occurred_at: Some(startline_proto::time::ms_to_timestamp(at)),
        kind: Some(pb::lifecycle_event::Kind::Submitted(pb::Submitted {
            pool_kind: pb::PoolKind::Dedicated as i32,
            provider: "slurm".into(),
            pool: "a100".into(),
            priority: prio as i32,
            gpu_count: 8,
            ..Default::default()
        })),
    };
    let mut batch = Vec::new();
    for i in 0..a.waiting {
        batch.push(mk(format!("wait/{i}"), now - (i as i64 % 3_600_000), pb::PriorityClass::Normal));
        if batch.len() == 1000 {
            up.send(std::mem::take(&mut batch)).await.expect("send");
        }
    }
    // Urgent jobs whose 20 s deadlines fall 5-25 s from now.
    for i in 0..a.crossing {
        let at = now - 15_000 + (i as i64 * 20_000 / a.crossing.max(1) as i64);
        batch.push(mk(format!("urgent/{i}"), at, pb::PriorityClass::Urgent));
        if batch.len() == 1000 {
            up.send(std::mem::take(&mut batch)).await.expect("send");
        }
    }
    up.send(batch).await.expect("send");
    up.flush().await.expect("flush");
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut lat: Vec<f64> = Vec::new();
    while Instant::now() < deadline {
        lat.clear();
        for (_, v, at) in hook.received_at() {
            for al in v.as_array().cloned().unwrap_or_default() {
                let starts = al["startsAt"].as_str().and_then(|s| startline_collector::time::parse_time(s).ok());
                if let (Some(st), true) = (starts, al["labels"]["alertname"] == "StartlineJobStartBreach") {
                    lat.push((at - st) as f64);
                }
            }
        }
        if lat.len() as u64 >= a.crossing {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(c);
    lat.sort_by(f64::total_cmp);
    if lat.is_empty() {
        return vec!["| breach detection | no page arrived | |".into()];
    }
    let q = |p: f64| lat[((lat.len() - 1) as f64 * p).round() as usize];
    println!(
        "- pages received: {} of {}; crossing -> POST received: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        lat.len(),
        a.crossing,
        q(0.5),
        q(0.99),
        q(1.0)
    );
    vec![format!(
        "| breach detection, {} waiting, {} crossings | p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms (crossing to Alertmanager POST) | |",
        a.waiting, lat.len(), q(0.5), q(0.99), q(1.0)
    )]
}

/// `n` timed GETs of `path` (each must answer 200), in milliseconds, sorted.
fn timed_gets(c: &Collector, path: &str, n: usize) -> Vec<f64> {
    let mut t: Vec<f64> = (0..n)
        .map(|_| {
            let s = Instant::now();
            let (status, _) = c.get(path);
            assert_eq!(status, 200, "{path}");
            s.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t
}

/// Restart to ready over `restart_jobs` jobs; with `slo_queries`, SLO status query latency on that store.
fn restart_bench(a: &Args, slo_queries: bool) -> Vec<String> {
    println!("## restart: {} jobs", a.restart_jobs);
    let rdir = tempfile::tempdir().expect("tempdir");
    let rdb = rdir.path().join("db");
    let build = Instant::now();
    let seqs = build_restart_store(&rdb, a.restart_jobs);
    println!("- restart store: {} jobs, {seqs} events, built in {:.1}s", a.restart_jobs, build.elapsed().as_secs_f64());
    let t = Instant::now();
    let c = Collector::start(&rdb, &["--log", "warn"]);
    let ready = t.elapsed().as_secs_f64();
    let rss = std::fs::read_to_string(format!("/proc/{}/status", c.child.id()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").parse::<u64>().unwrap_or(0))
        })
        .unwrap_or(0);
    println!("  restart to ready: {ready:.2} s; RSS after restore: {} MiB", rss / 1024);
    let mut rows = vec![format!(
        "| restart to ready, {} jobs ({seqs} events) | {ready:.2} s, RSS {} MiB | |",
        a.restart_jobs,
        rss / 1024
    )];
    if slo_queries {
        for path in ["/api/v1/slos/normal-start?window=28d", "/api/v1/slos"] {
            let t = timed_gets(&c, path, 30);
            let (_, body) = c.get("/api/v1/slos/normal-start?window=28d");
            println!(
                "- GET {path}: p50 {:.2} ms, max of 30 {:.2} ms (total decided: {})",
                t[15], t[29], body["status"]["total"]
            );
            rows.push(format!(
                "| SLO status query `{path}`, {} jobs over 30 days, 28 d window | p50 {:.2} ms, max of 30 {:.2} ms | |",
                a.restart_jobs, t[15], t[29]
            ));
        }
        // /metrics scrape with every job tracked, and the comparison over 30 days.
        let mut scrape: Vec<(f64, usize)> = (0..10)
            .map(|_| {
                let s = Instant::now();
                let body = startline_tests::http_get_text(c.http, "/metrics").1;
                (s.elapsed().as_secs_f64() * 1000.0, body.len())
            })
            .collect();
        scrape.sort_by(|a, b| a.0.total_cmp(&b.0));
        let series = startline_tests::http_get_text(c.http, "/metrics")
            .1
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .count();
        println!(
            "- GET /metrics: p50 {:.1} ms, max of 10 {:.1} ms, {} bytes, {series} series",
            scrape[5].0, scrape[9].0, scrape[5].1
        );
        rows.push(format!(
            "| `/metrics` scrape, {} jobs tracked | p50 {:.1} ms, max of 10 {:.1} ms; {} KiB, {series} series | |",
            a.restart_jobs,
            scrape[5].0,
            scrape[9].0,
            scrape[5].1 / 1024
        ));
        for path in ["/api/v1/compare?window=30d", "/api/v1/compare?window=30d&by=gpu_class"] {
            let t = timed_gets(&c, path, 10);
            println!("- GET {path}: p50 {:.0} ms, max of 10 {:.0} ms", t[5], t[9]);
            rows.push(format!(
                "| compare query `{path}`, {} jobs over 30 days | p50 {:.0} ms, max of 10 {:.0} ms | |",
                a.restart_jobs, t[5], t[9]
            ));
        }
    }
    rows
}

/// How the busy client's events are laid out over jobs and time.
#[derive(Clone, Copy)]
enum Busy {
    /// Round-robin over 1000 jobs (the same load, no long history).
    Spread,
    /// One job, every event later than the one before.
    InOrder,
    /// One job, in order except 1% of the events, stamped up to 10 minutes (about 600 events) in the past.
    Late,
}

/// The busy client's `i`-th event: a `submitted`, `queued`, `node_assigned` and `first_step`, then a checkpoint
/// per second of the job's (simulated) life.
fn busy_event(shape: Busy, phase: &str, i: usize, t0: i64, rng: &mut u64) -> pb::LifecycleEvent {
    use pb::lifecycle_event::Kind;
    let (job, k) = match shape {
        Busy::Spread => (format!("{phase}/job-{}", i % 1000), i / 1000),
        Busy::InOrder | Busy::Late => (format!("{phase}/busy"), i),
    };
    // xorshift64: reproducible, no dependency.
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    let late = matches!(shape, Busy::Late) && k > 1000 && *rng % 100 == 0;
    let (at_step, lag_ms) = if late { (k - 1 - (*rng >> 8) as usize % 600, 500) } else { (k, 0) };
    let at = t0 + at_step as i64 * 1000 - lag_ms;
    let kind = match k {
        0 => startline_tests::submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Normal, 8),
        1 => Kind::Queued(pb::Queued { reason: pb::WaitReason::Capacity as i32, ..Default::default() }),
        2 => Kind::NodeAssigned(Default::default()),
        3 => Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() }),
        _ => Kind::Checkpoint(pb::Checkpoint { step: at_step as u64, ..Default::default() }),
    };
    startline_tests::event(&job, &format!("e{k}"), at, kind)
}

/// What the busy client saw.
struct BusyRun {
    /// Events per second achieved.
    eps: f64,
    /// Ack latency (ack - due) of the first and of the last 10% of its batches, sorted, ms.
    first: Vec<f64>,
    last: Vec<f64>,
}

/// Streams `n` busy events in batches of `batch`, open loop at `rate` events/s (batch i is due at
/// `i * batch / rate`), so the busy client offers the same load whatever the job's history.
async fn busy_stream(endpoint: &str, shape: Busy, phase: &str, n: usize, batch: usize, rate: f64) -> BusyRun {
    let mut c = client(endpoint).await;
    let count = n.div_ceil(batch);
    let interval = Duration::from_secs_f64(batch as f64 / rate);
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let mut acks = c.publish(ReceiverStream::new(rx)).await.expect("publish").into_inner();
    let phase_owned = phase.to_string();
    let t0 = startline_proto::time::now_ms() - 30 * 86_400_000;
    let start = tokio::time::Instant::now() + Duration::from_millis(50);
    let sender = tokio::spawn(async move {
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        for b in 0..count {
            let events = (b * batch..((b + 1) * batch).min(n))
                .map(|i| busy_event(shape, &phase_owned, i, t0, &mut rng))
                .collect();
            tokio::time::sleep_until(start + interval * b as u32).await;
            if tx.send(pb::PublishRequest { batch_seq: b as u64 + 1, events }).await.is_err() {
                break;
            }
        }
    });
    let mut lat = Vec::with_capacity(count);
    while lat.len() < count {
        match acks.message().await {
            Ok(Some(ack)) => {
                assert!(ack.rejections.is_empty(), "busy events rejected: {:?}", ack.rejections.first());
                let due = start + interval * (ack.batch_seq as u32 - 1);
                lat.push(tokio::time::Instant::now().saturating_duration_since(due).as_secs_f64() * 1000.0);
            }
            other => panic!("stream ended early: {other:?}"),
        }
    }
    let _ = sender.await;
    let eps = n as f64 / (tokio::time::Instant::now() - start).as_secs_f64();
    let tenth = (count / 10).max(1);
    let mut first = lat[..tenth].to_vec();
    let mut last = lat[count - tenth..].to_vec();
    first.sort_by(f64::total_cmp);
    last.sort_by(f64::total_cmp);
    BusyRun { eps, first, last }
}

/// Sends one-event batches (a `submitted` of a new job) every 20 ms, one at a time, until `stop` is set (or for
/// `at_most`); returns the ack latencies in ms, sorted.
async fn probe(
    endpoint: String,
    phase: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    at_most: Duration,
) -> Vec<f64> {
    let mut c = client(&endpoint).await;
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started = Instant::now();
    let mut lat = Vec::new();
    let at = startline_proto::time::now_ms() - 60_000;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) && started.elapsed() < at_most {
        tick.tick().await;
        let kind = startline_tests::submitted(pb::PoolKind::Managed, pb::PriorityClass::Normal, 1);
        let ev = startline_tests::event(&format!("{phase}/probe-{}", lat.len()), "s", at, kind);
        let sent = Instant::now();
        let ack = c.publish_batch(pb::PublishRequest { batch_seq: 1, events: vec![ev] }).await.expect("probe acked");
        assert_eq!(ack.into_inner().accepted, 1);
        lat.push(sent.elapsed().as_secs_f64() * 1000.0);
    }
    lat.sort_by(f64::total_cmp);
    lat
}

fn quantile(sorted: &[f64], p: f64) -> f64 {
    sorted.get(((sorted.len().max(1) - 1) as f64 * p).round() as usize).copied().unwrap_or(f64::NAN)
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// One busy job against everyone else's acks: probe ack latency alone, then beside a busy client
/// whose load is spread over 1000 jobs, sent to one job in time order, and sent to one job with 1% late events.
async fn busy_bench(a: &Args) -> Vec<String> {
    let n = a.busy_events;
    println!(
        "## busy job: {n} events per phase, batches of {} at {} ev/s (open loop); probe: one-event batches every 20 ms",
        a.batch, a.busy_rate
    );
    let dir = tempfile::tempdir().expect("tempdir");
    // The cap must let the busy job reach N events; `--collector-config` replaces this file (set the cap there).
    let cfg = match &a.collector_config {
        Some(f) => std::path::PathBuf::from(f),
        None => {
            let cfg = dir.path().join("c.toml");
            std::fs::write(&cfg, format!("[store]\nmax_events_per_job = {}\n", (n + 1000).min(10_000_000)))
                .expect("config");
            cfg
        }
    };
    let c = Collector::start(&dir.path().join("db"), &["--log", "warn", "--config", cfg.to_str().expect("utf8")]);
    let ep = c.endpoint();
    let idle = probe(ep.clone(), "idle".into(), Default::default(), Duration::from_secs(5)).await;
    println!(
        "- baseline, no busy client: probe ack p50 {:.2} ms, p99 {:.2} ms ({} probes)",
        quantile(&idle, 0.5),
        quantile(&idle, 0.99),
        idle.len()
    );
    let mut rows = vec![format!(
        "| probe ack, no busy client (baseline) | p50 {:.2} ms, p99 {:.2} ms | {} probes |",
        quantile(&idle, 0.5),
        quantile(&idle, 0.99),
        idle.len()
    )];
    let phases = [
        (Busy::Spread, "spread", "busy client spread over 1000 jobs"),
        (Busy::InOrder, "inorder", "one job growing to N events, in order"),
        (Busy::Late, "late", "one job growing to N events, 1% late"),
    ];
    for (shape, phase, what) in phases {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let prober = tokio::spawn(probe(ep.clone(), phase.into(), stop.clone(), Duration::from_secs(3600)));
        let busy = busy_stream(&ep, shape, phase, n, a.batch, a.busy_rate as f64).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let lat = prober.await.expect("probe task");
        let (p50, p99) = (quantile(&lat, 0.5), quantile(&lat, 0.99));
        let (f50, f99) = (quantile(&busy.first, 0.5), quantile(&busy.first, 0.99));
        let (l50, l99) = (quantile(&busy.last, 0.5), quantile(&busy.last, 0.99));
        println!(
            "- {what}: busy {:.0} ev/s, its batch acks first 10% p50 {f50:.2} / p99 {f99:.2} ms, last 10% p50 \
             {l50:.2} / p99 {l99:.2} ms; probe ack p50 {p50:.2} ms, p99 {p99:.2} ms, max {:.2} ms ({} probes); \
             collector RSS {:.0} MiB",
            busy.eps,
            lat.last().copied().unwrap_or(f64::NAN),
            lat.len(),
            rss_mib(c.child.id())
        );
        rows.push(format!(
            "| probe ack, {what} | p50 {p50:.2} ms, p99 {p99:.2} ms | busy batch acks: first 10% p50 {f50:.1} / p99 {f99:.1} ms, last 10% p50 {l50:.1} / p99 {l99:.1} ms |"
        ));
    }
    let status = c.signal_and_wait("TERM");
    assert!(status.success());
    rows
}
