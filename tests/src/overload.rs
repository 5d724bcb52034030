//! The overload scenario: clients streaming as fast as they can into one collector for a
//! fixed time, with `ingest.when_full = "wait"` or `"reject"`, while a prober times `/healthz` and
//! `GET /api/v1/slos` and a sampler reads the collector's RSS. Reports what clients saw (acks and each gRPC
//! status code), the probe latencies and the peak RSS. A measurement for `startline-bench overload`, not a test.

use crate::Collector;
use startline_proto::pb::{self, ingest_service_client::IngestServiceClient, lifecycle_event::Kind};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_stream::wrappers::ReceiverStream;

/// What to run.
#[derive(Debug, Clone)]
pub struct OverloadConfig {
    /// Concurrent clients, one stream each.
    pub clients: usize,
    /// How long they blast.
    pub duration: Duration,
    /// `wait` or `reject`.
    pub when_full: String,
    /// `ingest.queue_capacity` (batches waiting for the committer); `None`: the default (256).
    pub queue_capacity: Option<usize>,
    /// Events per batch.
    pub batch: usize,
    /// Batches in flight per stream.
    pub window: usize,
    /// Distinct jobs the events go to (bounds the index's growth to the events themselves).
    pub jobs_per_client: usize,
}

impl Default for OverloadConfig {
    fn default() -> Self {
        OverloadConfig {
            clients: 8,
            duration: Duration::from_secs(60),
            when_full: "wait".into(),
            queue_capacity: None,
            batch: 500,
            window: 32,
            jobs_per_client: 2000,
        }
    }
}

/// What the clients, the prober and the sampler saw.
#[derive(Debug, Default, Clone)]
pub struct OverloadReport {
    /// Events acknowledged.
    pub acked_events: u64,
    /// Batches acknowledged.
    pub acked_batches: u64,
    /// Stream failures by gRPC code name.
    pub statuses: BTreeMap<String, u64>,
    /// Probe latencies, milliseconds, per path.
    pub probes: BTreeMap<String, Vec<f64>>,
    /// Probes that failed (connect error or non-200), per path.
    pub probe_failures: BTreeMap<String, u64>,
    /// RSS before the blast, bytes.
    pub rss_before: u64,
    /// Peak RSS during the blast, bytes.
    pub rss_peak: u64,
    /// RSS at the end, bytes.
    pub rss_end: u64,
    /// Seconds the blast ran.
    pub seconds: f64,
}

/// The process's resident set, bytes.
pub fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<u64>().ok()).map(|kb| kb * 1024))
        })
        .unwrap_or(0)
}

/// One timed GET over a fresh connection (what a health checker does); `None` on failure.
fn timed_get(addr: SocketAddr, path: &str) -> Option<f64> {
    let started = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let ok = raw.starts_with(b"HTTP/1.1 200");
    ok.then(|| started.elapsed().as_secs_f64() * 1000.0)
}

fn batch_of(client: usize, n: u64, cfg: &OverloadConfig, base: i64) -> Vec<pb::LifecycleEvent> {
    (0..cfg.batch as u64)
        .map(|i| {
            let k = n * cfg.batch as u64 + i;
            let job = format!("blast/{client}/{}", k % cfg.jobs_per_client as u64);
            let round = k / cfg.jobs_per_client as u64;
            let kind = if round == 0 {
                crate::submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Normal, 8)
            } else {
                Kind::Checkpoint(pb::Checkpoint { step: round, ..Default::default() })
            };
            crate::event(&job, &format!("e{round}"), base + round as i64, kind)
        })
        .collect()
}

/// One client: streams until `stop`, reconnecting after a failure; counts acks and failure codes.
async fn blast(
    endpoint: String,
    client: usize,
    cfg: OverloadConfig,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    batches: Arc<AtomicU64>,
    statuses: Arc<Mutex<BTreeMap<String, u64>>>,
) {
    let base = startline_proto::time::now_ms() - 86_400_000;
    let mut n = 0u64;
    let count = |code: String| *statuses.lock().unwrap_or_else(|p| p.into_inner()).entry(code).or_default() += 1;
    while !stop.load(Ordering::Relaxed) {
        let mut c = match IngestServiceClient::connect(endpoint.clone()).await {
            Ok(c) => c,
            Err(_) => {
                count("connect_error".into());
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (tx, rx) = tokio::sync::mpsc::channel(cfg.window);
        let resp = match c.publish(ReceiverStream::new(rx)).await {
            Ok(r) => r,
            Err(s) => {
                count(format!("{:?}", s.code()));
                continue;
            }
        };
        let mut acks = resp.into_inner();
        let mut in_flight = 0usize;
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            while in_flight < cfg.window {
                n += 1;
                if tx.send(pb::PublishRequest { batch_seq: n, events: batch_of(client, n, &cfg, base) }).await.is_err()
                {
                    break;
                }
                in_flight += 1;
            }
            match acks.message().await {
                Ok(Some(ack)) => {
                    in_flight -= 1;
                    acked.fetch_add(u64::from(ack.accepted + ack.duplicates), Ordering::Relaxed);
                    batches.fetch_add(1, Ordering::Relaxed);
                }
                Ok(None) => {
                    count("stream_ended".into());
                    break;
                }
                Err(s) => {
                    count(format!("{:?}", s.code()));
                    break;
                }
            }
        }
    }
}

/// Starts a collector (release binaries, from the harness's own directory) and runs the blast.
pub async fn run(cfg: &OverloadConfig, dir: &std::path::Path) -> OverloadReport {
    let toml = dir.join("overload.toml");
    let mut text = format!("[ingest]\nwhen_full = \"{}\"\n", cfg.when_full);
    if let Some(q) = cfg.queue_capacity {
        text.push_str(&format!("queue_capacity = {q}\n"));
    }
    let _ = std::fs::write(&toml, text);
    let toml_arg = toml.to_string_lossy().into_owned();
    let c = Collector::start(&dir.join("db"), &["--config", &toml_arg, "--log", "warn"]);
    let pid = c.child.id();
    let mut report = OverloadReport { rss_before: rss_bytes(pid), ..Default::default() };
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let batches = Arc::new(AtomicU64::new(0));
    let statuses = Arc::new(Mutex::new(BTreeMap::new()));
    let started = Instant::now();
    let clients: Vec<_> = (0..cfg.clients)
        .map(|i| {
            tokio::spawn(blast(
                c.endpoint(),
                i,
                cfg.clone(),
                stop.clone(),
                acked.clone(),
                batches.clone(),
                statuses.clone(),
            ))
        })
        .collect();
    // Prober and sampler on their own thread: what a kubelet or a load balancer would see.
    let http = c.http;
    let prober_stop = stop.clone();
    let prober = std::thread::spawn(move || {
        let mut probes: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        let mut failures: BTreeMap<String, u64> = BTreeMap::new();
        let mut peak = 0u64;
        while !prober_stop.load(Ordering::Relaxed) {
            for path in ["/healthz", "/api/v1/slos"] {
                match timed_get(http, path) {
                    Some(ms) => probes.entry(path.to_string()).or_default().push(ms),
                    None => *failures.entry(path.to_string()).or_default() += 1,
                }
            }
            peak = peak.max(rss_bytes(pid));
            std::thread::sleep(Duration::from_millis(100));
        }
        (probes, failures, peak)
    });
    tokio::time::sleep(cfg.duration).await;
    stop.store(true, Ordering::Relaxed);
    report.seconds = started.elapsed().as_secs_f64();
    for t in clients {
        t.abort();
    }
    if let Ok((probes, failures, peak)) = prober.join() {
        report.probes = probes;
        report.probe_failures = failures;
        report.rss_peak = peak;
    }
    report.rss_end = rss_bytes(pid);
    report.acked_events = acked.load(Ordering::Relaxed);
    report.acked_batches = batches.load(Ordering::Relaxed);
    report.statuses = statuses.lock().unwrap_or_else(|p| p.into_inner()).clone();
    drop(c);
    report
}

/// Percentile (nearest rank) of unsorted values.
pub fn percentile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}
