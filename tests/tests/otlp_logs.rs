//! Lifecycle events as OTLP logs: a collector with `[logs]` pushes one log record per accepted event and one
//! summary per ended job to an OTLP LogsService receiver started here (opentelemetry-proto's server; no
//! OpenTelemetry Collector can be installed on these machines). The records are checked against what was sent
//! (each accepted event once, duplicates never, attributes and times as sent) and against the API (a summary's
//! time to first step and waits equal the job's timeline). With the receiver gone, ingest still acknowledges at
//! once, and the records it cannot take are counted as failed or dropped in `/metrics`.

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{LogsService, LogsServiceServer};
use opentelemetry_proto::tonic::collector::logs::v1::{ExportLogsServiceRequest, ExportLogsServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use startline_agent::uplink::{Publisher, UplinkSettings};
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_tests::{ago, event, http_get_text, submitted, Collector};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Records received, with the resource's `service.name`; while `down` is set, every export waits a second and
/// is refused as UNAVAILABLE (a receiver that is overloaded, then gone).
#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<(String, LogRecord)>>>, Arc<std::sync::atomic::AtomicBool>);

#[tonic::async_trait]
impl LogsService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        if self.1.load(std::sync::atomic::Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_secs(1)).await;
            return Err(tonic::Status::unavailable("receiver down"));
        }
        let req = request.into_inner();
        if let Ok(mut v) = self.0.lock() {
            for rl in req.resource_logs {
                let service = rl
                    .resource
                    .iter()
                    .flat_map(|r| r.attributes.iter())
                    .find(|a| a.key == "service.name")
                    .and_then(|a| a.value.as_ref().and_then(|v| v.value.clone()))
                    .map(|v| match v {
                        Value::StringValue(s) => s,
                        other => format!("{other:?}"),
                    })
                    .unwrap_or_default();
                for sl in rl.scope_logs {
                    v.extend(sl.log_records.into_iter().map(|r| (service.clone(), r)));
                }
            }
        }
        Ok(tonic::Response::new(ExportLogsServiceResponse { partial_success: None }))
    }
}

impl Receiver {
    fn records(&self) -> Vec<LogRecord> {
        self.0.lock().map(|v| v.iter().map(|(_, r)| r.clone()).collect()).unwrap_or_default()
    }
}

fn attr(r: &LogRecord, k: &str) -> Option<Value> {
    r.attributes.iter().find(|a| a.key == k).and_then(|a| a.value.as_ref()).and_then(|v| v.value.clone())
}

fn text(r: &LogRecord, k: &str) -> String {
    match attr(r, k) {
        Some(Value::StringValue(s)) => s,
        other => panic!("{k}: {other:?} in {r:?}"),
    }
}

fn number(r: &LogRecord, k: &str) -> f64 {
    match attr(r, k) {
        Some(Value::DoubleValue(d)) => d,
        Some(Value::IntValue(i)) => i as f64,
        other => panic!("{k}: {other:?} in {r:?}"),
    }
}

/// `startline_collector_otlp_log_records_total{result}` from `/metrics`.
fn exporter_count(c: &Collector, result: &str) -> f64 {
    let (_, body) = http_get_text(c.http, "/metrics");
    body.lines()
        .filter(|l| {
            l.starts_with("startline_collector_otlp_log_records_total{") && l.contains(&format!("result=\"{result}\""))
        })
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

async fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_events_and_job_summaries_are_pushed_as_otlp_logs() {
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(LogsServiceServer::new(receiver.clone()))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!("[logs]\notlp_endpoint = \"http://{addr}\"\nflush_interval = \"100ms\"\nqueue_events = 2\n"),
    )
    .expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf8")]);
    let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");

    // Job a starts after a 90 s quota wait and 10 s on its node, then succeeds; job b is cancelled before it
    // starts. The first batch's queued event is sent again in the second batch: a duplicate, never re-exported.
    let sub = |prio| submitted(pb::PoolKind::Dedicated, prio, 8);
    let queued = |reason: pb::WaitReason, raw: &str| {
        Kind::Queued(pb::Queued { reason: reason as i32, raw_reason: raw.into(), ..Default::default() })
    };
    let a_queued = event("logs/a", "a-q", ago(400), queued(pb::WaitReason::Quota, "QOSMaxGRESPerUser"));
    let first = vec![
        event("logs/a", "a-s", ago(400), sub(pb::PriorityClass::Urgent)),
        a_queued.clone(),
        event(
            "logs/a",
            "a-n",
            ago(310),
            Kind::NodeAssigned(pb::NodeAssigned { nodes: vec!["gpu-7".into()], gpu_ids: vec![] }),
        ),
        event("logs/b", "b-s", ago(200), sub(pb::PriorityClass::Normal)),
        event("logs/b", "b-q", ago(200), queued(pb::WaitReason::Capacity, "Resources")),
    ];
    up.send(first).await.expect("send");
    up.flush().await.expect("flush");
    let second = vec![
        a_queued,
        event("logs/a", "a-f", ago(300), Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })),
        event(
            "logs/a",
            "a-d",
            ago(10),
            Kind::Done(pb::Done { outcome: pb::Outcome::Succeeded as i32, exit_code: Some(0), message: String::new() }),
        ),
        event(
            "logs/b",
            "b-d",
            ago(100),
            Kind::Done(pb::Done { outcome: pb::Outcome::Cancelled as i32, exit_code: None, message: "user".into() }),
        ),
    ];
    up.send(second).await.expect("send");
    up.flush().await.expect("flush");

    // 8 distinct events and 2 summaries.
    wait_for("10 records", Duration::from_secs(20), || receiver.records().len() >= 10).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let records = receiver.records();
    assert_eq!(records.len(), 10, "{records:#?}");
    assert!(receiver.0.lock().expect("lock").iter().all(|(svc, _)| svc == "startline-collector"));
    let mut by_event: BTreeMap<String, &LogRecord> = BTreeMap::new();
    let mut summaries: BTreeMap<String, &LogRecord> = BTreeMap::new();
    for r in &records {
        if r.event_name == "startline.job.summary" {
            summaries.insert(text(r, "startline.job.id"), r);
        } else {
            assert!(by_event.insert(text(r, "startline.event.id"), r).is_none(), "exported twice: {r:?}");
        }
    }
    let ids: Vec<&str> = by_event.keys().map(String::as_str).collect();
    assert_eq!(ids, ["a-d", "a-f", "a-n", "a-q", "a-s", "b-d", "b-q", "b-s"]);
    let q = by_event["a-q"];
    assert_eq!(q.event_name, "startline.job.queued");
    assert_eq!(text(q, "startline.queued.reason"), "quota");
    assert_eq!(text(q, "startline.queued.raw_reason"), "QOSMaxGRESPerUser");
    assert_eq!(text(q, "startline.job.id"), "logs/a");
    assert_eq!(text(q, "startline.priority"), "urgent");
    assert_eq!(number(q, "startline.gpu.count"), 8.0);
    // Event time is occurred_at (to the ms the protocol carries); observed time is the commit, later.
    let (_, job_a) = c.get("/api/v1/jobs/logs/a");
    let submitted_ms =
        startline_collector::time::parse_time(job_a["submitted_at"].as_str().expect("submitted_at")).expect("time");
    assert_eq!(by_event["a-s"].time_unix_nano, submitted_ms as u64 * 1_000_000);
    assert!(q.observed_time_unix_nano > q.time_unix_nano);
    assert_eq!(text(by_event["b-d"], "startline.job.outcome"), "cancelled");

    // Summaries agree with the API's timelines.
    let a = summaries["logs/a"];
    assert_eq!(
        number(a, "startline.job.time_to_first_step_seconds"),
        job_a["time_to_first_step_seconds"].as_f64().expect("ttfs")
    );
    let waits = job_a["timeline"]["initial_wait_seconds"].as_object().expect("waits");
    assert!(waits.contains_key("queued:quota") && waits.contains_key("assigned"), "{waits:?}");
    for (segment, secs) in waits {
        assert_eq!(
            number(a, &format!("startline.job.wait_seconds.{segment}")),
            secs.as_f64().expect("secs"),
            "{segment}"
        );
    }
    assert_eq!(text(a, "startline.job.outcome"), "succeeded");
    assert_eq!(a.severity_text, "INFO");
    let b = summaries["logs/b"];
    assert!(attr(b, "startline.job.time_to_first_step_seconds").is_none(), "b never started");
    assert_eq!(b.severity_text, "WARN");
    assert_eq!(exporter_count(&c, "exported"), 10.0);

    // The receiver stops taking records: ingest still acknowledges at once; what cannot be sent is counted (failed
    // after retries, dropped beyond the queue of 2 groups), not waited for.
    receiver.1.store(true, std::sync::atomic::Ordering::Relaxed);
    let before = Instant::now();
    for i in 0..12 {
        let j = format!("logs/down/{i}");
        up.send(vec![event(&j, "s", ago(5), sub(pb::PriorityClass::Normal))]).await.expect("send");
        up.flush().await.expect("flush");
        if i == 0 {
            // The exporter takes this one and retries it; the next groups find its queue (2 events) full.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    assert!(before.elapsed() < Duration::from_secs(5), "ingest waited on the log exporter: {:?}", before.elapsed());
    wait_for("failed and dropped records", Duration::from_secs(30), || {
        exporter_count(&c, "failed") >= 1.0 && exporter_count(&c, "dropped") >= 1.0
    })
    .await;
    let (_, listed) = c.get("/api/v1/jobs?pool_kind=dedicated&limit=100");
    assert_eq!(listed["jobs"].as_array().map_or(0, Vec::len), 14, "every acknowledged event is stored");
    assert_eq!(receiver.records().len(), 10, "nothing arrived while the receiver refused");
    server.abort();
}
