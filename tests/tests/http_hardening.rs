//! The HTTP API against hostile or unlucky clients, on the real collector binary: the comparison chart of a
//! fresh collector (no data) answers at once, every malformed request gets a JSON 4xx naming the problem
//! (extractor rejections, unknown paths and wrong methods included), a connection that sends half a request
//! line or nothing is closed within the header-read timeout, and SIGTERM with such a connection open exits
//! promptly with status 0.

use startline_tests::Collector;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The collector's header-read timeout (`api::serve::HEADER_READ_TIMEOUT`).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// One raw HTTP/1.1 exchange; returns the status, the head (lower-cased) and the body. Times out after 10 s.
fn exchange(addr: SocketAddr, request: &[u8]) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s.write_all(request).expect("write");
    let mut raw = Vec::new();
    if let Err(e) = s.read_to_end(&mut raw) {
        panic!("no complete answer to {:?}: {e}", String::from_utf8_lossy(&request[..request.len().min(80)]));
    }
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, head.to_ascii_lowercase(), body.to_string())
}

fn get(addr: SocketAddr, target: &str) -> Vec<u8> {
    format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").into_bytes()
}

#[test]
fn compare_svg_of_an_empty_collector_answers_at_once_saying_there_is_no_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("data"), &[]);
    for target in [
        "/api/v1/compare.svg",
        "/api/v1/compare.svg?window=30d",
        "/api/v1/compare.svg?left=pool=nothing&right=gpu_class=none&window=1m",
    ] {
        let t = Instant::now();
        let (status, head, body) = exchange(c.http, &get(c.http, target));
        let took = t.elapsed();
        assert_eq!(status, 200, "{target}: {head}\n{body}");
        assert!(head.contains("content-type: image/svg+xml"), "{head}");
        assert!(body.starts_with("<svg ") && body.trim_end().ends_with("</svg>"), "{body}");
        assert!(body.contains("No data"), "{body}");
        assert!(!body.contains("NaN") && !body.contains("inf\""), "{body}");
        assert!(took < Duration::from_secs(2), "{target} took {took:?}");
        println!("{target}: 200 in {took:?}, {} bytes", body.len());
    }
    // Still alive and answering.
    assert_eq!(c.get("/healthz").0, 200);
}

#[test]
fn every_malformed_request_gets_a_json_error_naming_the_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("data"), &[]);
    let a = c.http;
    let long = format!("/api/v1/compare?left={}", "x".repeat(9000));
    // (request, status, words the error must contain)
    let table: Vec<(Vec<u8>, u16, &[&str])> = vec![
        (get(a, "/api/v1/compare?window=abc"), 400, &["window"]),
        (get(a, "/api/v1/compare?window=1s"), 400, &["window"]),
        (get(a, "/api/v1/compare?by=colour"), 400, &["by"]),
        (get(a, "/api/v1/compare?bogus=1"), 400, &["bogus", "unknown"]),
        (get(a, "/api/v1/compare?left=a&left=b"), 400, &["left", "more than once"]),
        (get(a, "/api/v1/compare?left=%FF"), 400, &["left", "UTF-8"]),
        (get(a, "/api/v1/compare.svg?left=%ZZ"), 400, &["left", "percent-encoding"]),
        (get(a, "/api/v1/compare?left=%"), 400, &["percent-encoding"]),
        (get(a, "/api/v1/jobs?%C3=1"), 400, &["UTF-8"]),
        (get(a, "/api/v1/jobs?state=sleeping"), 400, &["state"]),
        (get(a, "/api/v1/jobs?submitted_after=yesterday"), 400, &["submitted_after"]),
        (get(a, "/api/v1/overview?window=zzz"), 400, &["window"]),
        (get(a, "/api/v1/alerts?state=maybe"), 400, &["state"]),
        (get(a, "/api/v1/slos/%FF%FE"), 400, &["path"]),
        (get(a, "/api/v1/jobs/a%C3%28b"), 400, &["path"]),
        (get(a, "/api/v1/slos/no-such-slo"), 404, &["no-such-slo"]),
        (get(a, "/api/v1/nope"), 404, &["no such endpoint"]),
        (get(a, "/api/v2/jobs"), 404, &["no such endpoint"]),
        (get(a, &long), 414, &["query string", "8192"]),
        (
            format!("POST /api/v1/jobs HTTP/1.1\r\nHost: {a}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}")
                .into_bytes(),
            405,
            &["POST", "GET"],
        ),
        (
            format!("DELETE /api/v1/slos/x HTTP/1.1\r\nHost: {a}\r\nConnection: close\r\n\r\n").into_bytes(),
            405,
            &["DELETE"],
        ),
        (
            format!("PUT /healthz HTTP/1.1\r\nHost: {a}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .into_bytes(),
            405,
            &["PUT"],
        ),
    ];
    let mut failures = Vec::new();
    for (request, want, words) in &table {
        let line = String::from_utf8_lossy(&request[..request.iter().position(|b| *b == b'\r').unwrap_or(0)])
            .chars()
            .take(90)
            .collect::<String>();
        let (status, head, body) = exchange(a, request);
        let json: Option<serde_json::Value> = serde_json::from_str(&body).ok();
        let error = json.as_ref().and_then(|j| j["error"].as_str()).unwrap_or("").to_string();
        let ok = status == *want
            && head.contains("content-type: application/json")
            && words.iter().all(|w| error.contains(w))
            && (status != 405 || head.contains("allow: get"));
        println!("{line} -> {status} {error:?}");
        if !ok {
            failures.push(format!("{line}: got {status} (want {want}), head {head:?}, body {body:?}"));
        }
    }
    assert!(failures.is_empty(), "{} of {} requests:\n{}", failures.len(), table.len(), failures.join("\n"));
}

/// Reads until the server closes the connection; returns how long after `since` that happened (None if it stays
/// open for `limit`).
fn closed_after(s: &mut TcpStream, since: Instant, limit: Duration) -> Option<Duration> {
    s.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");
    let mut buf = [0u8; 1024];
    while since.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => return Some(since.elapsed()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return Some(since.elapsed()),
        }
    }
    None
}

#[test]
fn half_sent_and_silent_connections_are_closed_within_the_header_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("data"), &[]);
    let t0 = Instant::now();
    let mut half = TcpStream::connect(c.http).expect("connect");
    half.write_all(b"GET /api/v1/sl").expect("write");
    let mut headers = TcpStream::connect(c.http).expect("connect");
    headers.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ").expect("write");
    let mut silent = TcpStream::connect(c.http).expect("connect");
    let limit = HEADER_READ_TIMEOUT + Duration::from_secs(5);
    for (name, s) in [("half request line", &mut half), ("half headers", &mut headers), ("silent", &mut silent)] {
        let t = closed_after(s, t0, limit);
        println!("{name}: closed after {t:?}");
        let Some(t) = t else { panic!("{name}: still open after {limit:?}") };
        assert!(t >= HEADER_READ_TIMEOUT - Duration::from_secs(1), "{name}: closed too early, after {t:?}");
    }
    // The server is fine for everyone else.
    assert_eq!(c.get("/healthz").0, 200);
}

#[test]
fn sigterm_with_a_half_sent_request_open_exits_promptly_with_status_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("data"), &[]);
    let mut half = TcpStream::connect(c.http).expect("connect");
    half.write_all(b"GET /api/v1/jo").expect("write");
    // An idle keep-alive connection after a complete request, too.
    let mut idle = TcpStream::connect(c.http).expect("connect");
    write!(idle, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
    idle.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut buf = [0u8; 512];
    let n = idle.read(&mut buf).expect("answer");
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let status = c.signal_and_wait("TERM");
    let took = t.elapsed();
    println!("exited with {status} {took:?} after SIGTERM");
    assert!(status.success(), "exit status {status}");
    assert!(took < Duration::from_secs(15), "took {took:?}");
    drop(half);
}

#[test]
fn an_oversized_request_head_is_refused_with_431_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let big = "a".repeat(100 << 10);
    let req = format!("GET /api/v1/jobs HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\nConnection: close\r\n\r\n");
    let mut s = TcpStream::connect(c.http).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    // The server may answer and close before the whole head is written: a failed write is fine.
    let _ = s.write_all(req.as_bytes());
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 431"), "an oversized head was not refused with 431: {text:?}");
    let (status, _) = c.get("/healthz");
    assert_eq!(status, 200, "the server stopped serving");
}
