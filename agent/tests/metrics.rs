//! The agent's own metrics, in process: the node agent's `/metrics` after known requests (spool
//! depth and bytes, requests by route and status class, each refusal reason, quota and full-spool refusals),
//! the uplink's failure and backoff figures against a closed port, and the Slurm adapter's poll metrics from
//! the recorded fixtures, a failing command and an unreadable answer.

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::json;
use startline_agent::access::{Access, JobAllowList, LocalToken};
use startline_agent::auth::Secret;
use startline_agent::metrics::{sample, Metrics};
use startline_agent::node::{router, MonotonicWall, NodeState};
use startline_agent::spool::{ClientQuota, Spool, SpoolLimits};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

fn node(dir: &std::path::Path, limits: SpoolLimits, configure: impl FnOnce(&mut Access)) -> NodeState {
    let spool = Spool::open(dir, limits).expect("spool");
    let mut access = Access::open(limits);
    configure(&mut access);
    let metrics = Metrics::new("node").expect("metrics");
    metrics.watch_spool(spool.clone());
    NodeState {
        clock: MonotonicWall::start(),
        spool,
        source: "node-agent/test".into(),
        limits: startline_proto::Limits::default(),
        access: Arc::new(access),
        metrics,
    }
}

fn post(body: serde_json::Value) -> Request<Body> {
    Request::post("/v1/events")
        .header(header::HOST, "localhost:7465")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("request")
}

fn events(job: &str, n: usize) -> serde_json::Value {
    let items: Vec<_> = (0..n).map(|i| json!({"kind": "checkpoint", "job_id": job, "step": i + 1})).collect();
    json!({ "events": items })
}

async fn send(state: &NodeState, req: Request<Body>) -> StatusCode {
    router(state.clone()).oneshot(req).await.expect("response").status()
}

async fn scrape(state: &NodeState) -> String {
    let req = Request::get("/metrics").header(header::HOST, "127.0.0.1:7465").body(Body::empty()).expect("request");
    let resp = router(state.clone()).oneshot(req).await.expect("response");
    assert_eq!(resp.status(), StatusCode::OK);
    let ct = resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8(bytes.to_vec()).expect("utf-8")
}

fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    sample(text, name, labels).unwrap_or_else(|| panic!("no {name}{labels:?} in\n{text}"))
}

#[tokio::test]
async fn posted_events_show_as_spool_depth_bytes_and_requests() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = node(dir.path(), SpoolLimits { max_events: 100, max_bytes: 1 << 20 }, |_| {});
    let before = scrape(&state).await;
    assert_eq!(value(&before, "startline_agent_spool_events", &[]), 0.0);
    assert_eq!(value(&before, "startline_agent_spool_oldest_event_age_seconds", &[]), 0.0, "empty spool");
    assert_eq!(
        value(&before, "startline_agent_build_info", &[("version", env!("CARGO_PKG_VERSION")), ("mode", "node")]),
        1.0
    );
    assert_eq!(value(&before, "startline_agent_spool_capacity_events", &[]), 100.0);

    assert_eq!(send(&state, post(events("j/1", 3))).await, StatusCode::ACCEPTED);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let text = scrape(&state).await;
    assert_eq!(value(&text, "startline_agent_spool_events", &[]), 3.0);
    assert_eq!(value(&text, "startline_agent_spool_bytes", &[]), state.spool.bytes() as f64);
    assert!(state.spool.bytes() > 0);
    let age = value(&text, "startline_agent_spool_oldest_event_age_seconds", &[]);
    assert!((1.0..30.0).contains(&age), "oldest event age {age}");
    assert_eq!(value(&text, "startline_agent_http_requests_total", &[("route", "events"), ("status", "2xx")]), 1.0);
    // A request is counted when answered: this scrape counts the one before it, not itself.
    assert_eq!(value(&text, "startline_agent_http_requests_total", &[("route", "metrics"), ("status", "2xx")]), 1.0);
    assert_eq!(value(&text, "startline_agent_spool_refused_events_total", &[("reason", "full")]), 0.0);

    // Delivered: the spool is empty again, and so is its age.
    let last = state.spool.oldest(10).expect("oldest").last().expect("events").0;
    state.spool.remove_through(last).expect("remove");
    let text = scrape(&state).await;
    assert_eq!(value(&text, "startline_agent_spool_events", &[]), 0.0);
    assert_eq!(value(&text, "startline_agent_spool_bytes", &[]), 0.0);
    assert_eq!(value(&text, "startline_agent_spool_oldest_event_age_seconds", &[]), 0.0);
}

#[tokio::test]
async fn every_refusal_is_counted_by_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let allow = dir.path().join("jobs");
    std::fs::write(&allow, "j/ok\n").expect("allow file");
    let state = node(&dir.path().join("spool"), SpoolLimits { max_events: 100, max_bytes: 1 << 20 }, |a| {
        a.local_token = Some(LocalToken::Fixed(Secret::new("t0k")));
        a.jobs = Some(JobAllowList::new([], Some(allow.clone())));
        a.client_quota = ClientQuota { max_events: 2, max_bytes: 1 << 20 };
    });
    let auth = |mut r: Request<Body>| {
        r.headers_mut().insert(header::AUTHORIZATION, "Bearer t0k".parse().expect("value"));
        r
    };
    let mut foreign = auth(post(events("j/ok", 1)));
    foreign.headers_mut().insert(header::HOST, "evil.example".parse().expect("value"));
    assert_eq!(send(&state, foreign).await, StatusCode::FORBIDDEN);
    let mut cross = auth(post(events("j/ok", 1)));
    cross.headers_mut().insert(header::ORIGIN, "http://evil.example".parse().expect("value"));
    assert_eq!(send(&state, cross).await, StatusCode::FORBIDDEN);
    assert_eq!(send(&state, post(events("j/ok", 1))).await, StatusCode::UNAUTHORIZED);
    let mut text_plain = auth(post(events("j/ok", 1)));
    text_plain.headers_mut().insert(header::CONTENT_TYPE, "text/plain".parse().expect("value"));
    assert_eq!(send(&state, text_plain).await, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(send(&state, auth(post(events("j/other", 1)))).await, StatusCode::FORBIDDEN);
    assert_eq!(send(&state, auth(post(events("j/ok", 2)))).await, StatusCode::ACCEPTED);
    assert_eq!(send(&state, auth(post(events("j/ok", 3)))).await, StatusCode::TOO_MANY_REQUESTS);
    // /metrics keeps the Host check: a DNS-rebinding page cannot read it.
    let rebound = Request::get("/metrics").header(header::HOST, "evil.example").body(Body::empty()).expect("request");
    assert_eq!(send(&state, rebound).await, StatusCode::FORBIDDEN);

    let text = scrape(&state).await;
    for (reason, n) in [
        ("host", 2.0),
        ("origin", 1.0),
        ("local_token", 1.0),
        ("content_type", 1.0),
        ("job_not_permitted", 1.0),
        ("quota", 1.0),
    ] {
        assert_eq!(value(&text, "startline_agent_http_refusals_total", &[("reason", reason)]), n, "{reason}");
    }
    assert_eq!(value(&text, "startline_agent_spool_refused_events_total", &[("reason", "quota")]), 3.0);
    assert_eq!(value(&text, "startline_agent_http_requests_total", &[("route", "events"), ("status", "4xx")]), 6.0);
    assert_eq!(value(&text, "startline_agent_http_requests_total", &[("route", "events"), ("status", "2xx")]), 1.0);
    assert_eq!(value(&text, "startline_agent_http_requests_total", &[("route", "metrics"), ("status", "4xx")]), 1.0);
    assert_eq!(value(&text, "startline_agent_spool_events", &[]), 2.0);
}

#[tokio::test]
async fn a_full_spool_counts_refused_events() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = node(dir.path(), SpoolLimits { max_events: 4, max_bytes: 1 << 20 }, |a| {
        a.client_quota = ClientQuota { max_events: 100, max_bytes: 1 << 20 };
    });
    assert_eq!(send(&state, post(events("j/1", 3))).await, StatusCode::ACCEPTED);
    assert_eq!(send(&state, post(events("j/2", 2))).await, StatusCode::SERVICE_UNAVAILABLE);
    let text = scrape(&state).await;
    assert_eq!(value(&text, "startline_agent_spool_refused_events_total", &[("reason", "full")]), 2.0);
    assert_eq!(value(&text, "startline_agent_http_requests_total", &[("route", "events"), ("status", "5xx")]), 1.0);
    // Scraped again: the counter does not grow by itself.
    let again = scrape(&state).await;
    assert_eq!(value(&again, "startline_agent_spool_refused_events_total", &[("reason", "full")]), 2.0);
}

#[tokio::test]
async fn an_unreachable_collector_counts_unavailable_failures_and_backoff() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut settings = startline_agent::uplink::UplinkSettings::new(endpoint.clone());
    settings.backoff_initial = Duration::from_millis(20);
    settings.backoff_max = Duration::from_millis(40);
    settings.give_up_after = Some(Duration::from_millis(200));
    let mut up = startline_agent::uplink::Publisher::new(settings).expect("publisher");
    let metrics = Metrics::new("node").expect("metrics");
    up.set_metrics(metrics.clone());
    let ev = startline_proto::pb::LifecycleEvent { event_id: "e1".into(), job_id: "j".into(), ..Default::default() };
    up.send(vec![ev]).await.expect("queued");
    assert!(up.flush().await.is_err(), "gives up");
    let text = metrics.render().expect("render");
    let failures =
        value(&text, "startline_agent_uplink_failures_total", &[("collector", &endpoint), ("code", "unavailable")]);
    assert!(failures >= 2.0, "{failures}");
    assert_eq!(failures, up.totals().reconnects as f64 + 1.0, "every failure, the last one (given up) too");
    assert_eq!(
        value(&text, "startline_agent_uplink_failures_total", &[("collector", &endpoint), ("code", "unauthenticated")]),
        0.0
    );
    assert_eq!(value(&text, "startline_agent_uplink_connected", &[("collector", &endpoint)]), 0.0);
    assert!(value(&text, "startline_agent_uplink_backoff_seconds", &[("collector", &endpoint)]) > 0.0);
    assert_eq!(value(&text, "startline_agent_uplink_batches_total", &[("collector", &endpoint)]), 0.0);
    assert_eq!(
        value(&text, "startline_agent_uplink_events_total", &[("collector", &endpoint), ("result", "accepted")]),
        0.0
    );
}

fn fixture(name: &str) -> String {
    format!("{}/src/provider/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Runs the Slurm adapter with these commands until its first poll is counted; returns the exposition.
async fn slurm_poll(squeue: &[&str], sacct: &[&str], spool: &Spool) -> String {
    use startline_agent::provider::{slurm, MemoryStore};
    let metrics = Metrics::new("slurm").expect("metrics");
    metrics.watch_spool(spool.clone());
    let memory = MemoryStore::open(spool, "slurm").expect("memory");
    let mapping = slurm::Mapping {
        urgent_partitions: vec![],
        urgent_qos: vec![],
        site: String::new(),
        gpu_class: String::new(),
        first_step_on_start: true,
        cluster: "c1".into(),
    };
    let owned = |c: &[&str]| c.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let shell = slurm::ShellSettings {
        squeue: owned(squeue),
        sacct: owned(sacct),
        interval: Duration::from_secs(3600),
        lookback: Duration::from_secs(3600),
        vanished_grace: Duration::from_secs(600),
        rest: None,
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(slurm::run(mapping, shell, spool.clone(), memory, metrics.clone(), stop.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = metrics.render().expect("render");
        if sample(&text, "startline_agent_poll_duration_seconds_count", &[("provider", "slurm")]) == Some(1.0) {
            stop.cancel();
            task.await.expect("poller");
            return text;
        }
        assert!(tokio::time::Instant::now() < deadline, "no poll counted:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn slurm_polls_count_jobs_transitions_errors_and_the_last_success() {
    use startline_agent::provider::slurm;
    let dir = tempfile::tempdir().expect("tempdir");
    let spool = Spool::open(dir.path(), SpoolLimits::default()).expect("spool");
    let (squeue, sacct) = (fixture("squeue-23.02.json"), fixture("sacct-22.05.json"));
    let before = startline_proto::time::now_ms() as f64 / 1000.0;
    // The adapter appends `--starttime uts<seconds>` to the sacct command: the stub ignores its arguments.
    let text = slurm_poll(&["cat", &squeue], &["sh", "-c", "cat \"$0\"", &sacct], &spool).await;

    let live = slurm::parse_squeue(&std::fs::read_to_string(&squeue).expect("read")).expect("squeue");
    let acct = slurm::parse_sacct(&std::fs::read_to_string(&sacct).expect("read")).expect("sacct");
    let jobs = slurm::merge(live, acct).len();
    assert!(jobs > 0);
    assert_eq!(value(&text, "startline_agent_jobs_tracked", &[("provider", "slurm")]), jobs as f64);
    let kinds = [
        "submitted",
        "queued",
        "node_assigned",
        "preparing",
        "first_step",
        "checkpoint",
        "preempted",
        "requeued",
        "restarted",
        "node_lost",
        "done",
    ];
    let transitions: f64 = kinds
        .iter()
        .filter_map(|k| sample(&text, "startline_agent_transitions_total", &[("provider", "slurm"), ("kind", k)]))
        .sum();
    assert_eq!(transitions, spool.len() as f64, "every spooled event counted once, by kind");
    assert_eq!(
        value(&text, "startline_agent_transitions_total", &[("provider", "slurm"), ("kind", "submitted")]),
        jobs as f64,
        "one submitted per job"
    );
    let last = value(&text, "startline_agent_last_successful_poll_timestamp_seconds", &[("provider", "slurm")]);
    assert!(last >= before.floor() && last < before + 60.0, "{last} vs {before}");
    assert_eq!(value(&text, "startline_agent_poll_errors_total", &[("provider", "slurm"), ("kind", "parse")]), 0.0);
    assert_eq!(value(&text, "startline_agent_spool_events", &[]), spool.len() as f64);

    // squeue failing: command_failed; an answer that is not squeue's: parse. No last-success stamp either time.
    let failed = slurm_poll(&["false"], &["false"], &spool).await;
    assert_eq!(
        value(&failed, "startline_agent_poll_errors_total", &[("provider", "slurm"), ("kind", "command_failed")]),
        1.0
    );
    assert_eq!(
        sample(&failed, "startline_agent_last_successful_poll_timestamp_seconds", &[("provider", "slurm")]),
        None
    );
    let unreadable = slurm_poll(&["echo", "{}"], &["false"], &spool).await;
    assert_eq!(
        value(&unreadable, "startline_agent_poll_errors_total", &[("provider", "slurm"), ("kind", "parse")]),
        1.0
    );
}

#[test]
fn every_metric_is_documented_in_metrics_md_and_every_documented_one_exists() {
    use startline_agent::metrics::{PollErrorKind, Provider, Refusal};
    let dir = tempfile::tempdir().expect("tempdir");
    let spool = Spool::open(dir.path(), SpoolLimits::default()).expect("spool");
    let m = Metrics::new("slurm").expect("metrics");
    m.watch_spool(spool);
    m.register_provider(Provider::Slurm);
    m.poll_succeeded(Provider::Slurm, Duration::from_millis(5), 1, &[], std::time::SystemTime::now());
    m.poll_failed(Provider::Slurm, Duration::from_millis(5), PollErrorKind::Parse);
    let ev = startline_proto::pb::LifecycleEvent::default();
    m.poll_succeeded(Provider::Slurm, Duration::from_millis(5), 1, &[ev], std::time::SystemTime::now());
    m.http_request("events", StatusCode::ACCEPTED);
    m.refused(Refusal::Host);
    m.register_collector("http://127.0.0.1:50051");
    m.uplink_acked("http://127.0.0.1:50051", 1, 0, 0);
    let text = m.render().expect("render");
    let mut exported: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(String::from)
        .collect();
    exported.sort();
    let doc = std::fs::read_to_string(format!("{}/../docs/METRICS.md", env!("CARGO_MANIFEST_DIR"))).expect("doc");
    let section = doc.split("## Agent metrics").nth(1).expect("an Agent metrics section");
    let mut documented: Vec<String> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `startline_agent_"))
        .filter_map(|l| l.split('`').next())
        .map(|rest| format!("startline_agent_{rest}"))
        .collect();
    documented.sort();
    assert_eq!(exported, documented);
}
