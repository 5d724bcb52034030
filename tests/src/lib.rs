//! Helpers for Startline's end-to-end tests: start the real collector binary on free ports (port 0, the bound
//! ports read from its stdout), a minimal HTTP/1.1 client, and event builders.
//!
//! The binaries must be built first (`cargo build --workspace --bins`, which the test script does).

pub mod corebench;
pub mod crashtrial;
pub mod etabench;
pub mod fuzz;
pub mod overload;
pub mod pki;
pub mod predictbench;
pub mod simbench;

use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_proto::time::ms_to_timestamp;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The directory holding the workspace's binaries (next to the test executable's `deps/`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let deps = exe.parent().expect("deps dir");
    let dir = if deps.ends_with("deps") { deps.parent().expect("profile dir") } else { deps };
    dir.to_path_buf()
}

/// The path of a workspace binary, with a clear message if it was not built.
pub fn binary(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(p.exists(), "{} is missing: run `cargo build --workspace --bins` before the tests", p.display());
    p
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// `cmd` without the variables cargo and nextest set for this test's own crate (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`,
/// `CARGO_BIN_EXE_*`, `NEXTEST_*`...), for a command that runs cargo itself. Build scripts of dependencies (ring's)
/// rerun when those change, so a `cargo build --release` started from a test with them set rebuilt the release tree
/// `scripts/test.sh` had just built, and everything above ring with it (20 minutes of a CI run on 2 cores).
/// Cargo's own settings (`CARGO_HOME`, `CARGO_TARGET_DIR`, `CARGO_BUILD_*`, ...) are kept.
pub fn outside_cargo(cmd: &mut Command) -> &mut Command {
    const KEEP: [&str; 10] = [
        "CARGO_HOME",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_",
        "CARGO_TERM_",
        "CARGO_NET_",
        "CARGO_HTTP_",
        "CARGO_REGISTRIES_",
        "CARGO_REGISTRY_",
        "CARGO_PROFILE_",
        "CARGO_INCREMENTAL",
    ];
    for (key, _) in std::env::vars_os() {
        let Some(k) = key.to_str() else { continue };
        let set_for_the_test = (k.starts_with("CARGO_") && !KEEP.iter().any(|p| k.starts_with(p)))
            || k.starts_with("NEXTEST")
            || k == "OUT_DIR";
        if set_for_the_test {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// A running collector process.
pub struct Collector {
    /// The child process.
    pub child: Child,
    /// Bound gRPC address.
    pub grpc: SocketAddr,
    /// Bound HTTP address.
    pub http: SocketAddr,
    /// Where its stderr log goes.
    pub log: PathBuf,
}

impl Collector {
    /// Starts `startline-collector` on `data_dir` with port 0 for both listeners and extra args, and waits for
    /// its ready line.
    pub fn start(data_dir: &Path, extra: &[&str]) -> Collector {
        Self::start_on(data_dir, "127.0.0.1:0", extra)
    }

    /// Like [`Collector::start`], with a given gRPC listen address (tests that start clients first).
    pub fn start_on(data_dir: &Path, grpc_listen: &str, extra: &[&str]) -> Collector {
        match Self::try_start_on(data_dir, grpc_listen, extra) {
            Ok(c) => c,
            Err((why, log)) => panic!("collector did not become ready ({why}); log:\n{log}"),
        }
    }

    /// Starts the collector; if it exits before its ready line, returns why and its log (tests of refusals).
    pub fn try_start(data_dir: &Path, extra: &[&str]) -> Result<Collector, (String, String)> {
        Self::try_start_on(data_dir, "127.0.0.1:0", extra)
    }

    /// [`Collector::try_start`] with a given gRPC listen address.
    pub fn try_start_on(data_dir: &Path, grpc_listen: &str, extra: &[&str]) -> Result<Collector, (String, String)> {
        Self::try_start_with_env(data_dir, grpc_listen, extra, &[])
    }

    /// [`Collector::start`] with environment variables set for the process (credentials of an object store).
    pub fn start_with_env(data_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Collector {
        match Self::try_start_with_env(data_dir, "127.0.0.1:0", extra, env) {
            Ok(c) => c,
            Err((why, log)) => panic!("collector did not become ready ({why}); log:\n{log}"),
        }
    }

    /// [`Collector::try_start_on`] with environment variables set for the process.
    pub fn try_start_with_env(
        data_dir: &Path,
        grpc_listen: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Collector, (String, String)> {
        let log = data_dir.with_extension("log");
        let stderr = std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("log file");
        let mut child = Command::new(binary("startline-collector"))
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--grpc-listen", grpc_listen, "--http-listen", "127.0.0.1:0"])
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn collector");
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("collector stdout not captured");
        };
        match wait_ready(stdout) {
            Ok((grpc, http)) => Ok(Collector { child, grpc, http, log }),
            Err(why) => {
                let _ = child.kill();
                let status = child.wait().map(|s| format!("{s}")).unwrap_or_default();
                Err((format!("{why}; {status}"), std::fs::read_to_string(&log).unwrap_or_default()))
            }
        }
    }

    /// The gRPC endpoint URI.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// Sends a signal (e.g. "TERM", "KILL") and waits for exit; returns the exit status.
    pub fn signal_and_wait(mut self, sig: &str) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let ok = Command::new("kill").args([&format!("-{sig}"), &pid]).status().expect("kill").success();
        assert!(ok, "kill -{sig} failed");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return st;
            }
            assert!(Instant::now() < deadline, "collector did not exit after SIG{sig}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// GET a path on the HTTP API.
    pub fn get(&self, path: &str) -> (u16, serde_json::Value) {
        http_get(self.http, path)
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads the collector's stdout until its ready line; returns the bound addresses.
fn wait_ready(stdout: std::process::ChildStdout) -> Result<(SocketAddr, SocketAddr), String> {
    let mut lines = BufReader::new(stdout).lines();
    loop {
        let line = match lines.next() {
            Some(Ok(l)) => l,
            _ => return Err("exited before its ready line".into()),
        };
        let Some(rest) = line.strip_prefix("startline-collector ready ") else {
            continue;
        };
        let mut grpc = None;
        let mut http = None;
        for part in rest.split_whitespace() {
            if let Some(a) = part.strip_prefix("grpc=") {
                grpc = a.parse().ok();
            }
            if let Some(a) = part.strip_prefix("http=") {
                http = a.parse().ok();
            }
        }
        // Keep draining stdout so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        return match (grpc, http) {
            (Some(g), Some(h)) => Ok((g, h)),
            _ => Err(format!("unreadable ready line {line:?}")),
        };
    }
}

/// A minimal HTTP/1.1 GET returning the status and the body as text (chunked bodies reassembled).
pub fn http_get_text(addr: SocketAddr, path: &str) -> (u16, String) {
    let (status, _, body) = http_request(addr, "GET", path, &[], "");
    (status, body)
}

/// A minimal HTTP/1.1 request with extra headers and a body: the status, the `Content-Type` (empty when absent)
/// and the body as text (chunked bodies reassembled).
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).expect("connect http");
    s.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).expect("write");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").expect("http response");
    let status: u16 = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).expect("status");
    let ctype = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("content-type")))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    let body =
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(body) } else { body.to_string() };
    (status, ctype, body)
}

/// A minimal HTTP/1.1 GET returning the status and the JSON body (Null if the body is not JSON).
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, serde_json::Value) {
    let (status, body) = http_get_text(addr, path);
    (status, serde_json::from_str(&body).unwrap_or(serde_json::Value::Null))
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].strip_prefix("\r\n").unwrap_or(&after[n..]);
    }
    out
}

/// Percent-encodes a query-string value (everything but unreserved characters).
pub fn query_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Polls `f` every 100 ms until it holds; panics naming `what` after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A child process killed and reaped when dropped (Prometheus, Alertmanager, agents started by a test).
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Percent-encodes a job id for use in a URL path (keeps `/`, which the API's wildcard route accepts).
pub fn path_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Builds an event.
pub fn event(job: &str, id: &str, at_ms: i64, kind: Kind) -> pb::LifecycleEvent {
    pb::LifecycleEvent {
        event_id: id.into(),
        job_id: job.into(),
        attempt: None,
        source: "test".into(),
        occurred_at: Some(ms_to_timestamp(at_ms)),
        kind: Some(kind),
    }
}

/// A `submitted` kind.
pub fn submitted(kind: pb::PoolKind, priority: pb::PriorityClass, gpus: u32) -> Kind {
    Kind::Submitted(pb::Submitted {
        pool_kind: kind as i32,
        provider: if kind == pb::PoolKind::Managed { "sagemaker" } else { "slurm" }.into(),
        pool: "pool-a".into(),
        priority: priority as i32,
        gpu_class: "a100".into(),
        gpu_count: gpus,
        node_count: 1,
        region: "r1".into(),
        ..Default::default()
    })
}

/// A timestamp `secs_ago` seconds before now.
pub fn ago(secs_ago: i64) -> i64 {
    startline_proto::time::now_ms() - secs_ago * 1000
}

/// One HTTP request as a test server saw it.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    /// Method, e.g. `POST`.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
}

impl HttpRequest {
    /// A header's value (name in lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// Serves HTTP/1.1 on a free loopback port on background threads: each request (one per connection) goes to
/// `handler`, whose `(status, content type, body)` is the answer. For webhook receivers and replays of
/// provider APIs.
pub fn serve_http(handler: impl Fn(&HttpRequest) -> (u16, &'static str, String) + Send + Sync + 'static) -> SocketAddr {
    serve_http_with_headers(move |r| {
        let (status, content_type, body) = handler(r);
        (status, content_type, Vec::new(), body)
    })
}

/// [`serve_http`] whose handler also gives extra response headers (for protocols that answer in headers, such as
/// the EC2 metadata service's token TTL).
pub fn serve_http_with_headers(
    handler: impl Fn(&HttpRequest) -> (u16, &'static str, Vec<(String, String)>, String) + Send + Sync + 'static,
) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind test http server");
    let addr = listener.local_addr().expect("addr");
    let handler = std::sync::Arc::new(handler);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let handler = handler.clone();
            std::thread::spawn(move || {
                let _ = answer(stream, &*handler);
            });
        }
    });
    addr
}

type Handler = dyn Fn(&HttpRequest) -> (u16, &'static str, Vec<(String, String)>, String);

fn answer(mut s: TcpStream, handler: &Handler) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(s.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("/").to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h)?;
        let t = h.trim();
        if t.is_empty() {
            break;
        }
        if let Some((k, v)) = t.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let len = headers.iter().find(|(k, _)| k == "content-length").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body)?;
    let (status, content_type, extra, text) = handler(&HttpRequest { method, path, headers, body });
    let extra: String = extra.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    write!(
        s,
        "HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n{text}",
        text.len()
    )?;
    Ok(())
}

/// A webhook receiver: accepts HTTP POSTs on a free loopback port and keeps (path, JSON body) of each.
#[derive(Clone)]
pub struct HookServer {
    /// Where it listens.
    pub addr: SocketAddr,
    received: std::sync::Arc<std::sync::Mutex<Vec<Received>>>,
}

/// One request the hook got: path, JSON body, arrival (Unix ms).
type Received = (String, serde_json::Value, i64);

impl HookServer {
    /// Starts the receiver on a background thread.
    pub fn start() -> HookServer {
        let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let store = received.clone();
        let addr = serve_http(move |req| {
            let at = startline_proto::time::now_ms();
            if let Ok(v) = serde_json::from_slice(&req.body) {
                if let Ok(mut g) = store.lock() {
                    g.push((req.path.clone(), v, at));
                }
            }
            (200, "text/plain", String::new())
        });
        HookServer { addr, received }
    }

    /// Everything received so far.
    pub fn received(&self) -> Vec<(String, serde_json::Value)> {
        self.received_at().into_iter().map(|(p, v, _)| (p, v)).collect()
    }

    /// Everything received so far, with arrival times (Unix ms).
    pub fn received_at(&self) -> Vec<(String, serde_json::Value, i64)> {
        self.received.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Waits until `pred` holds for some received body, up to `timeout`; returns it.
    pub fn wait_for(
        &self,
        timeout: Duration,
        pred: impl Fn(&str, &serde_json::Value) -> bool,
    ) -> Option<serde_json::Value> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some((_, v)) = self.received().into_iter().find(|(p, v)| pred(p, v)) {
                return Some(v);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

/// A free loopback port (bound and released; fine for tools that cannot be told to use port 0).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

/// Starts a real Alertmanager (Debian `prometheus-alertmanager`) on a free port routing every alert to `hook`
/// at `/am` (grouped by alertname and job id, no wait), and waits until it is ready; returns it and its URL.
pub fn start_alertmanager(dir: &std::path::Path, hook: &HookServer) -> (ChildGuard, String) {
    start_alertmanager_with(
        dir,
        &format!(
            "route:\n  receiver: hook\n  group_by: ['alertname', 'job_id']\n  group_wait: 0s\n  group_interval: 1s\n  repeat_interval: 1h\nreceivers:\n  - name: hook\n    webhook_configs:\n      - url: 'http://{}/am'\n        send_resolved: true\n",
            hook.addr
        ),
    )
}

/// Starts a real Alertmanager with this configuration (YAML) on a free port and waits until it is ready.
pub fn start_alertmanager_with(dir: &std::path::Path, config: &str) -> (ChildGuard, String) {
    let cfg = dir.join("alertmanager.yml");
    std::fs::write(&cfg, config).expect("write am config");
    let port = free_port();
    let child = Command::new("prometheus-alertmanager")
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!("--storage.path={}", dir.join("am-data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--cluster.listen-address=")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("am.log")).expect("am log"))
        .spawn()
        .expect("prometheus-alertmanager runs (scripts/test.sh installs it)");
    let am = ChildGuard(child);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, _) =
            std::panic::catch_unwind(|| http_get(addr, "/-/ready")).unwrap_or((0, serde_json::Value::Null));
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "alertmanager not ready: {}",
            std::fs::read_to_string(dir.join("am.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (am, format!("http://127.0.0.1:{port}"))
}

/// A running node agent (`startline-agent node`) on a free loopback port.
pub struct NodeAgent {
    /// The child process.
    pub child: Child,
    /// Its HTTP address.
    pub addr: SocketAddr,
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl NodeAgent {
    /// Starts a node agent delivering to `collectors` from `spool`, and reads its bound address.
    pub fn start(collectors: &[&str], spool: &Path) -> NodeAgent {
        NodeAgent::start_with(collectors, spool, &[])
    }

    /// [`NodeAgent::start`] with more `node` arguments.
    pub fn start_with(collectors: &[&str], spool: &Path, extra: &[&str]) -> NodeAgent {
        let mut child = Command::new(binary("startline-agent"))
            .args(["--collector", &collectors.join(","), "node", "--listen", "127.0.0.1:0", "--spool"])
            .arg(spool)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("agent");
        let out = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(out).lines();
        let line = lines.next().and_then(Result::ok).unwrap_or_default();
        std::thread::spawn(move || for _ in lines {});
        let addr = line
            .split_whitespace()
            .find_map(|p| p.strip_prefix("listen="))
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("agent ready line: {line:?}"));
        NodeAgent { child, addr }
    }
}

/// Posts a JSON body to a node agent's `/v1/events`; returns the status and the JSON answer.
pub fn post_events(addr: SocketAddr, body: &str) -> (u16, serde_json::Value) {
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "POST /v1/events HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read");
    let (head, b) = raw.split_once("\r\n\r\n").expect("response");
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).expect("status");
    (status, serde_json::from_str(b.trim()).unwrap_or(serde_json::Value::Null))
}
