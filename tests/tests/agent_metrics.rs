//! The agents report on themselves: the real `startline-agent` in node mode, delivering to a real
//! collector, scraped on its own listener and on `--metrics-listen`: delivered counts equal what the collector
//! acknowledged (its own `startline_collector_events_total`), the spool drains to 0, every request and refusal
//! is counted, and `promtool check metrics` accepts the exposition. Then the Vertex adapter against a replayed
//! API that first throttles (429): a `throttled` poll error, then jobs tracked, transitions by kind, the last
//! successful poll's time, and deliveries matching the collector.

use startline_agent::metrics::sample;
use startline_tests::{binary, http_get_text, serve_http, wait_until, workspace_root, ChildGuard, Collector};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Starts the agent with `args` (and `env`) and reads `listen=` and `metrics=` from its ready line.
fn start(args: &[&str], env: &[(&str, &str)]) -> (ChildGuard, Option<SocketAddr>, SocketAddr) {
    let mut child = Command::new(binary("startline-agent"))
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("agent");
    let out = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(out).lines();
    let line = lines.next().and_then(Result::ok).unwrap_or_default();
    std::thread::spawn(move || for _ in lines {});
    let field = |name: &str| {
        line.split_whitespace().find_map(|p| p.strip_prefix(name)).and_then(|a| a.parse::<SocketAddr>().ok())
    };
    let metrics = field("metrics=").unwrap_or_else(|| panic!("no metrics= in the ready line {line:?}"));
    (ChildGuard(child), field("listen="), metrics)
}

fn post(addr: SocketAddr, host: &str, body: &str) -> u16 {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "POST /v1/events HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read");
    raw.split_whitespace().nth(1).and_then(|c| c.parse().ok()).expect("status")
}

fn scrape(addr: SocketAddr) -> String {
    let (status, text) = http_get_text(addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    text
}

fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    sample(text, name, labels).unwrap_or_else(|| panic!("no {name}{labels:?} in\n{text}"))
}

/// The collector's events by result (its series carry extra OpenTelemetry labels).
fn collector_events(c: &Collector, result: &str) -> f64 {
    let (_, text) = http_get_text(c.http, "/metrics");
    let want = format!("result=\"{result}\"");
    text.lines()
        .filter(|l| l.starts_with("startline_collector_events_total{") && l.contains(&want))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

fn promtool_check(text: &str) {
    let mut p = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs (scripts/test.sh installs Debian's prometheus)");
    p.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write");
    let out = p.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "promtool: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_node_agent_counts_deliveries_as_the_collector_acknowledged_them_and_passes_promtool() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let spool = dir.path().join("spool");
    let spool = spool.to_str().expect("utf-8 path");
    let (_agent, listen, metrics) = start(
        &[
            "--collector",
            &c.endpoint(),
            "node",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--spool",
            spool,
        ],
        &[],
    );
    let listen = listen.expect("listen= in the ready line");
    let host = listen.to_string();

    let now = startline_proto::time::now_ms() as f64 / 1000.0;
    let mut bodies = Vec::new();
    for j in 0..3 {
        let job = format!("slurm/c1/{j}");
        bodies.push(serde_json::json!({"events": [
            {"kind": "submitted", "job_id": job, "occurred_at": now - 600.0, "pool_kind": "dedicated", "provider": "slurm", "pool": "gpu", "priority": "normal", "gpu_count": 8},
            {"kind": "queued", "job_id": job, "occurred_at": now - 590.0, "reason": "capacity", "raw_reason": "Resources"},
            {"kind": "first_step", "job_id": job, "occurred_at": now - 200.0, "step": 1},
        ]}).to_string());
    }
    for b in &bodies {
        assert_eq!(post(listen, &host, b), 202);
    }
    // The same bytes again: the same content ids, duplicates at the collector.
    assert_eq!(post(listen, &host, &bodies[0]), 202);
    // A DNS-rebinding page: refused and counted.
    assert_eq!(post(listen, "evil.example", &bodies[1]), 403);

    // Uplink series carry the collector endpoint as configured (--collector).
    let ep = c.endpoint();
    wait_until("the collector to acknowledge all 12 events", Duration::from_secs(30), || {
        let t = scrape(metrics);
        sample(&t, "startline_agent_spool_events", &[]) == Some(0.0)
            && sample(&t, "startline_agent_uplink_events_total", &[("collector", &ep), ("result", "accepted")])
                .unwrap_or(0.0)
                + sample(&t, "startline_agent_uplink_events_total", &[("collector", &ep), ("result", "duplicate")])
                    .unwrap_or(0.0)
                == 12.0
    });
    // On the node agent's own listener (its Host check passes: the Host is the listen address).
    let text = scrape(listen);
    assert_eq!(value(&text, "startline_agent_uplink_events_total", &[("collector", &ep), ("result", "accepted")]), 9.0);
    assert_eq!(
        value(&text, "startline_agent_uplink_events_total", &[("collector", &ep), ("result", "duplicate")]),
        3.0
    );
    assert_eq!(value(&text, "startline_agent_uplink_events_total", &[("collector", &ep), ("result", "rejected")]), 0.0);
    assert_eq!(
        value(&text, "startline_agent_uplink_events_total", &[("collector", &ep), ("result", "accepted")]),
        collector_events(&c, "accepted")
    );
    assert_eq!(
        value(&text, "startline_agent_uplink_events_total", &[("collector", &ep), ("result", "duplicate")]),
        collector_events(&c, "duplicate")
    );
    assert!(value(&text, "startline_agent_uplink_batches_total", &[("collector", &ep)]) >= 1.0);
    assert_eq!(value(&text, "startline_agent_uplink_connected", &[("collector", &ep)]), 1.0);
    assert_eq!(value(&text, "startline_agent_uplink_backoff_seconds", &[("collector", &ep)]), 0.0);
    assert_eq!(value(&text, "startline_agent_spool_events", &[]), 0.0);
    assert_eq!(value(&text, "startline_agent_spool_bytes", &[]), 0.0);
    assert_eq!(value(&text, "startline_agent_spool_oldest_event_age_seconds", &[]), 0.0);
    assert_eq!(value(&text, "startline_agent_http_requests_total", &[("route", "events"), ("status", "2xx")]), 4.0);
    assert_eq!(value(&text, "startline_agent_http_requests_total", &[("route", "events"), ("status", "4xx")]), 1.0);
    assert_eq!(value(&text, "startline_agent_http_refusals_total", &[("reason", "host")]), 1.0);
    assert_eq!(
        value(&text, "startline_agent_build_info", &[("version", env!("CARGO_PKG_VERSION")), ("mode", "node")]),
        1.0
    );
    assert!(!text.contains("slurm/c1/"), "no job id in any label");
    promtool_check(&text);
}

fn fixture(name: &str) -> serde_json::Value {
    let p = workspace_root().join("agent/src/provider/fixtures").join(name);
    serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("json")
}

#[test]
fn the_vertex_adapter_counts_a_retried_throttled_call_then_its_jobs_transitions_and_deliveries() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let calls = Arc::new(AtomicUsize::new(0));
    let (ok, failed) = (fixture("vertex-customjob-succeeded.json"), fixture("vertex-customjob-failed.json"));
    let counter = calls.clone();
    let api = serve_http(move |_| {
        if counter.fetch_add(1, Ordering::SeqCst) == 0 {
            let body = r#"{"error": {"code": 429, "message": "Quota exceeded", "status": "RESOURCE_EXHAUSTED"}}"#;
            return (429, "application/json", body.to_string());
        }
        (200, "application/json", serde_json::json!({"customJobs": [ok.clone(), failed.clone()]}).to_string())
    });
    let spool = dir.path().join("spool");
    let (_adapter, _, metrics) = start(
        &[
            "--collector",
            &c.endpoint(),
            "vertex",
            "--project",
            "ml-prod",
            "--location",
            "europe-west4",
            "--interval",
            "1s",
            "--endpoint",
            &format!("http://{api}"),
            "--metrics-listen",
            "127.0.0.1:0",
            "--spool",
            spool.to_str().expect("utf-8 path"),
        ],
        &[("VERTEX_ACCESS_TOKEN", "ya29.test-token")],
    );
    let text = {
        let mut last = String::new();
        wait_until("a successful poll despite the throttled call, delivered", Duration::from_secs(30), || {
            last = scrape(metrics);
            sample(&last, "startline_agent_last_successful_poll_timestamp_seconds", &[("provider", "vertex")]).is_some()
                && sample(&last, "startline_agent_spool_events", &[]) == Some(0.0)
                && sample(
                    &last,
                    "startline_agent_uplink_events_total",
                    &[("collector", &c.endpoint()), ("result", "accepted")],
                )
                .unwrap_or(0.0)
                    > 0.0
        });
        last
    };
    let errors = |kind| value(&text, "startline_agent_poll_errors_total", &[("provider", "vertex"), ("kind", kind)]);
    // The one throttled call was retried on its own: counted as a retry, and no poll failed.
    let retried =
        value(&text, "startline_agent_provider_call_retries_total", &[("provider", "vertex"), ("kind", "throttled")]);
    assert_eq!(retried, 1.0);
    assert_eq!(
        (errors("throttled"), errors("http_status"), errors("transport"), errors("parse")),
        (0.0, 0.0, 0.0, 0.0)
    );
    assert_eq!(value(&text, "startline_agent_jobs_tracked", &[("provider", "vertex")]), 2.0);
    let transitions = |kind| {
        sample(&text, "startline_agent_transitions_total", &[("provider", "vertex"), ("kind", kind)]).unwrap_or(0.0)
    };
    assert_eq!(transitions("submitted"), 2.0, "one per job");
    assert_eq!(transitions("done"), 2.0, "both jobs ended");
    let accepted =
        value(&text, "startline_agent_uplink_events_total", &[("collector", &c.endpoint()), ("result", "accepted")]);
    assert_eq!(accepted, collector_events(&c, "accepted"));
    let spooled: f64 =
        ["submitted", "queued", "node_assigned", "preparing", "first_step", "preempted", "requeued", "done"]
            .into_iter()
            .map(transitions)
            .sum();
    assert_eq!(spooled, accepted, "every transition spooled was delivered and accepted once");
    let last = value(&text, "startline_agent_last_successful_poll_timestamp_seconds", &[("provider", "vertex")]);
    let now = startline_proto::time::now_ms() as f64 / 1000.0;
    assert!(last <= now && now - last < 30.0, "last poll {last}, now {now}");
    let polls = value(&text, "startline_agent_poll_duration_seconds_count", &[("provider", "vertex")]);
    assert!(polls >= 1.0, "the poll (with its retried call) is timed: {polls}");
    assert_eq!(
        value(&text, "startline_agent_build_info", &[("version", env!("CARGO_PKG_VERSION")), ("mode", "vertex")]),
        1.0
    );
    assert!(!text.contains("5478273648572874752"), "no job id in any label");
    promtool_check(&text);
}
