//! A connection flood against the real collector binary, run under an open-file limit of 256 descriptors: 300
//! connections from other addresses (slow-body `POST /login`s dripping a byte a second, idle HTTP connections,
//! idle gRPC connections) more than exhaust the limit without the connection caps. With them, each address holds
//! at most `max_connections_per_ip`, the rest are closed as they are accepted and counted, and a client on
//! another address gets `/healthz`, a `PublishBatch` ack and an API answer within two seconds while the flood is
//! on; each slow body is cut with a JSON 408 at the body-read timeout. Also: an idle keep-alive connection lives
//! past the header-read timeout and closes at the idle timeout.
//!
//! The flood comes from 127.0.0.2-127.0.0.7 (all loopback on Linux), the probes from 127.0.0.1.

use startline_proto::pb::{self, ingest_service_client::IngestServiceClient};
use startline_tests::{ago, binary, event, submitted, Collector};
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio::net::TcpSocket;

/// The collector's open-file limit in the flood test.
const NOFILE: usize = 256;
/// `max_connections_per_ip` of both listeners in the flood test.
const PER_IP: usize = 16;
/// `http.body_read_timeout` in the flood test.
const BODY_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections each flooding address opens.
const PER_ADDRESS: usize = 50;
/// The addresses sending slow bodies.
const SLOW_ADDRESSES: [&str; 4] = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"];
/// The address holding idle HTTP connections, and the one holding idle gRPC connections.
const IDLE_HTTP: &str = "127.0.0.6";
const IDLE_GRPC: &str = "127.0.0.7";

/// Starts the collector under `ulimit -n nofile` (soft and hard), with `config`; waits for its ready line.
fn start_limited(data_dir: &Path, config: &Path, nofile: usize) -> Collector {
    let log = data_dir.with_extension("log");
    let stderr = std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("log file");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\""))
        .arg(binary("startline-collector"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--config"])
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("spawn collector");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let ready = loop {
        match lines.next() {
            Some(Ok(l)) if l.starts_with("startline-collector ready ") => break l,
            Some(Ok(_)) => continue,
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("collector did not start; log:\n{}", std::fs::read_to_string(&log).unwrap_or_default());
            }
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let addr = |key: &str| -> SocketAddr {
        ready
            .split_whitespace()
            .find_map(|p| p.strip_prefix(key))
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {ready:?}"))
    };
    let (grpc, http) = (addr("grpc="), addr("http="));
    Collector { child, grpc, http, log }
}

/// A connection from a given loopback source address.
async fn connect_from(source: &str, to: SocketAddr) -> tokio::net::TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.bind(format!("{source}:0").parse().expect("source")).expect("bind source");
    socket.connect(to).await.expect("connect")
}

/// One HTTP/1.1 GET from 127.0.0.1 with a 5 s read timeout: status, body and how long it took.
fn get_timed(addr: SocketAddr, path: &str) -> Result<(u16, String, Duration), String> {
    let t = Instant::now();
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| format!("{path}: no answer after {:?}: {e}", t.elapsed()))?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| format!("{path}: not HTTP: {text:?}"))?;
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((status, body.to_string(), t.elapsed()))
}

/// The value of one series of the Prometheus text (`name{...reason="r"...}`), 0 when absent.
fn series(metrics: &str, name: &str, reason: Option<&str>) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| reason.is_none_or(|r| l.contains(&format!("reason=\"{r}\""))))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// What became of one slow-body connection.
#[derive(Debug)]
enum Outcome {
    /// Closed with no answer (refused at accept), after this long.
    Closed(Duration),
    /// Answered (then closed), this long after its head was sent.
    Answered(Duration, String),
    /// Still open when the watch ended.
    Open,
}

/// Drips one body byte a second into each connection and watches for answers and closes, for up to `watch`.
async fn drip(mut conns: Vec<(tokio::net::TcpStream, Instant)>, watch: Duration) -> Vec<Outcome> {
    let mut outcomes: Vec<Option<Outcome>> = conns.iter().map(|_| None).collect();
    let started = Instant::now();
    let mut next_drip = started;
    while started.elapsed() < watch && outcomes.iter().any(Option::is_none) {
        let dripping = Instant::now() >= next_drip;
        if dripping {
            next_drip += Duration::from_secs(1);
        }
        for ((s, sent), outcome) in conns.iter_mut().zip(outcomes.iter_mut()) {
            if outcome.is_some() {
                continue;
            }
            let mut buf = vec![0u8; 4096];
            match s.try_read(&mut buf) {
                Ok(0) => *outcome = Some(Outcome::Closed(sent.elapsed())),
                Ok(n) => {
                    // The answer is small: what follows its first bytes is there at once.
                    let at = sent.elapsed();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    let mut more = vec![0u8; 4096];
                    let m = s.try_read(&mut more).unwrap_or(0);
                    buf.truncate(n);
                    buf.extend_from_slice(&more[..m]);
                    *outcome = Some(Outcome::Answered(at, String::from_utf8_lossy(&buf).to_string()));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if dripping {
                        let _ = s.try_write(b"a");
                    }
                }
                Err(_) => *outcome = Some(Outcome::Closed(sent.elapsed())),
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    outcomes.into_iter().map(|o| o.unwrap_or(Outcome::Open)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_past_the_caps_leaves_health_ingest_and_the_api_answering() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("collector.toml");
    std::fs::write(
        &cfg,
        format!(
            "[http]\nmax_connections_per_ip = {PER_IP}\nbody_read_timeout = \"{}s\"\n\
             [grpc]\nmax_connections_per_ip = {PER_IP}\n",
            BODY_TIMEOUT.as_secs()
        ),
    )
    .expect("config");
    let c = start_limited(&dir.path().join("db"), &cfg, NOFILE);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", c.child.id())).expect("limits");
    let nofile = limits.lines().find(|l| l.starts_with("Max open files")).expect("open files line");
    assert!(nofile.split_whitespace().nth(3) == Some(&NOFILE.to_string()), "{nofile}");

    // The flood: 4 x 50 slow bodies, 50 idle HTTP and 50 idle gRPC connections, 300 in all (over 256).
    let t0 = Instant::now();
    let head = format!(
        "POST /login HTTP/1.1\r\nHost: {}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: 100\r\n\r\n",
        c.http
    );
    let mut slow = Vec::new();
    for source in SLOW_ADDRESSES {
        for _ in 0..PER_ADDRESS {
            let mut s = connect_from(source, c.http).await;
            // A refused connection may already be closed: the write's result does not matter.
            let _ = tokio::io::AsyncWriteExt::write_all(&mut s, head.as_bytes()).await;
            slow.push((s, Instant::now()));
        }
    }
    let mut idle = Vec::new();
    for _ in 0..PER_ADDRESS {
        idle.push(connect_from(IDLE_HTTP, c.http).await);
        idle.push(connect_from(IDLE_GRPC, c.grpc).await);
    }
    let opened = t0.elapsed();
    println!("flood: {} connections opened in {opened:?}", slow.len() + idle.len());
    let watch = tokio::spawn(drip(slow, BODY_TIMEOUT + Duration::from_secs(5)));
    tokio::time::sleep(Duration::from_millis(300)).await;

    // While the flood holds its connections: health, ingest and the API answer within two seconds.
    let http = c.http;
    let (status, body, took) =
        tokio::task::spawn_blocking(move || get_timed(http, "/healthz")).await.expect("join").expect("healthz");
    println!("GET /healthz: {status} in {took:?}");
    assert_eq!(status, 200, "{body}");
    assert!(took < Duration::from_secs(2), "/healthz took {took:?}");

    let t = Instant::now();
    let ack = tokio::time::timeout(Duration::from_secs(5), async {
        let mut client = IngestServiceClient::connect(c.endpoint()).await.expect("connect grpc");
        let e = event("flood-probe", "s", ago(60), submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Normal, 8));
        client.publish_batch(pb::PublishRequest { batch_seq: 1, events: vec![e] }).await.expect("ack").into_inner()
    })
    .await
    .expect("PublishBatch acknowledged within 5 s");
    let took = t.elapsed();
    println!("PublishBatch: accepted {} in {took:?}", ack.accepted);
    assert_eq!(ack.accepted, 1, "{ack:?}");
    assert!(took < Duration::from_secs(2), "PublishBatch took {took:?}");

    let (status, body, took) = tokio::task::spawn_blocking(move || get_timed(http, "/api/v1/jobs/flood-probe"))
        .await
        .expect("join")
        .expect("api");
    println!("GET /api/v1/jobs/flood-probe: {status} in {took:?}");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("flood-probe"), "{body}");
    assert!(took < Duration::from_secs(2), "the API took {took:?}");

    let (status, during, _) =
        tokio::task::spawn_blocking(move || get_timed(http, "/metrics")).await.expect("join").expect("metrics");
    assert_eq!(status, 200);
    let attack_on = t0.elapsed();
    assert!(attack_on < opened + BODY_TIMEOUT - Duration::from_millis(500), "probes ended after {attack_on:?}");
    let open_http = series(&during, "startline_collector_http_connections", None);
    let open_fds = series(&during, "process_open_fds", None);
    println!("during the flood: {open_http} HTTP connections open, {open_fds} descriptors open");
    let held_http = (SLOW_ADDRESSES.len() * PER_IP + PER_IP) as f64;
    assert!(open_http >= held_http && open_http <= held_http + 4.0, "{open_http} HTTP connections open");
    assert!(open_fds < NOFILE as f64 - 64.0, "{open_fds} descriptors open");

    // Each slow address got PER_IP connections, cut with a JSON 408 at the body-read timeout; the rest were
    // closed at accept.
    let outcomes = watch.await.expect("drip");
    let mut refused = 0;
    let mut cut = Vec::new();
    for o in &outcomes {
        match o {
            Outcome::Closed(after) => {
                assert!(*after < Duration::from_secs(2), "closed only after {after:?}");
                refused += 1;
            }
            Outcome::Answered(after, text) => {
                assert!(text.starts_with("HTTP/1.1 408"), "{text}");
                assert!(text.to_ascii_lowercase().contains("connection: close"), "{text}");
                assert!(text.contains(r#"{"error":"request body not received within http.body_read_timeout (5s)"}"#));
                cut.push(*after);
            }
            Outcome::Open => panic!("a slow body was never cut: {outcomes:?}"),
        }
    }
    cut.sort();
    println!(
        "slow bodies: {} cut with 408 after {:?}..{:?}, {refused} refused at accept",
        cut.len(),
        cut.first(),
        cut.last()
    );
    assert_eq!(cut.len(), SLOW_ADDRESSES.len() * PER_IP, "{outcomes:?}");
    assert_eq!(refused, SLOW_ADDRESSES.len() * (PER_ADDRESS - PER_IP));
    assert!(cut[0] >= BODY_TIMEOUT - Duration::from_millis(100), "cut early: {cut:?}");
    assert!(cut[cut.len() - 1] < BODY_TIMEOUT + Duration::from_secs(2), "cut late: {cut:?}");

    // The metrics count every refusal and every cut.
    let (_, after, _) =
        tokio::task::spawn_blocking(move || get_timed(http, "/metrics")).await.expect("join").expect("metrics");
    let refused_http = series(&after, "startline_collector_http_refusals_total", Some("connection_limit_per_ip"));
    let refused_grpc = series(&after, "startline_collector_refusals_total", Some("connection_limit_per_ip"));
    let body_cuts = series(&after, "startline_collector_http_timeouts_total", Some("body_read"));
    println!("refused per address: http {refused_http}, grpc {refused_grpc}; body-read timeouts {body_cuts}");
    assert_eq!(refused_http, ((SLOW_ADDRESSES.len() + 1) * (PER_ADDRESS - PER_IP)) as f64, "{after}");
    assert_eq!(refused_grpc, (PER_ADDRESS - PER_IP) as f64);
    assert_eq!(body_cuts, (SLOW_ADDRESSES.len() * PER_IP) as f64);
    assert_eq!(series(&after, "startline_collector_http_refusals_total", Some("descriptor_budget")), 0.0);
    drop(idle);
    // Still healthy after the flood.
    assert_eq!(c.get("/healthz").0, 200);
}

#[test]
fn an_idle_keep_alive_connection_outlives_the_header_read_timeout_and_closes_at_the_idle_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("collector.toml");
    std::fs::write(&cfg, "[http]\nheader_read_timeout = \"2s\"\nidle_timeout = \"5s\"\n").expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf8")]);
    let mut s = TcpStream::connect(c.http).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let request = format!("GET /healthz HTTP/1.1\r\nHost: {}\r\n\r\n", c.http);
    let answer = |s: &mut TcpStream| {
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).expect("answer");
        String::from_utf8_lossy(&buf[..n]).to_string()
    };
    s.write_all(request.as_bytes()).expect("write");
    assert!(answer(&mut s).starts_with("HTTP/1.1 200"));
    // Idle past the header-read timeout: the connection still takes a request.
    std::thread::sleep(Duration::from_secs(3));
    s.write_all(request.as_bytes()).expect("write");
    let second = answer(&mut s);
    assert!(second.starts_with("HTTP/1.1 200"), "{second:?}");
    let t = Instant::now();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    let idle = t.elapsed();
    println!("idle keep-alive connection closed after {idle:?}");
    assert!(rest.is_empty(), "{rest:?}");
    assert!(idle > Duration::from_millis(4_500) && idle < Duration::from_secs(7), "closed after {idle:?}");
}
