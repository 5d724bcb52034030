//! End-to-end ingest over real gRPC on loopback into a real collector process on sled.

use startline_agent::uplink::{Publisher, UplinkSettings};
use startline_proto::pb::{self, ingest_service_client::IngestServiceClient, lifecycle_event::Kind};
use startline_tests::{ago, event, path_escape, submitted, Collector};
use tonic::Code;

async fn channel(c: &Collector) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(c.endpoint()).expect("uri").connect().await.expect("connect")
}

fn job_events(job: &str) -> Vec<pb::LifecycleEvent> {
    vec![
        event(job, "e1", ago(600), submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Urgent, 8)),
        event(
            job,
            "e2",
            ago(590),
            Kind::Queued(pb::Queued {
                reason: pb::WaitReason::Capacity as i32,
                raw_reason: "Resources".into(),
                message: String::new(),
                estimated_start: None,
                queue_position: None,
            }),
        ),
        event(job, "e3", ago(300), Kind::NodeAssigned(pb::NodeAssigned { nodes: vec!["n1".into()], gpu_ids: vec![] })),
        event(
            job,
            "e4",
            ago(290),
            Kind::Preparing(pb::Preparing { phase: pb::PreparingPhase::ImagePull as i32, message: String::new() }),
        ),
        event(job, "e5", ago(200), Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_uplink_publishes_and_timeline_reads_back_over_http() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");
    // Out of order: first step before submitted; one bad event; then a full redelivery.
    let mut evs = job_events("slurm/a/1");
    evs.reverse();
    let mut bad = event("slurm/a/1", "bad", ago(100), Kind::Queued(pb::Queued::default()));
    bad.source = String::new();
    evs.push(bad);
    up.send(evs).await.expect("send");
    up.send(job_events("slurm/a/1")).await.expect("send again");
    up.flush().await.expect("flush");
    let t = up.totals();
    assert_eq!((t.accepted, t.duplicates, t.rejected), (5, 5, 1));
    assert_eq!(t.rejections[0].field, "source");
    assert_eq!(t.rejections[0].index, 5);

    let (status, job) = c.get(&format!("/api/v1/jobs/{}", path_escape("slurm/a/1")));
    assert_eq!(status, 200, "{job}");
    assert_eq!(job["state"], "running");
    assert_eq!(job["priority"], "urgent");
    assert_eq!(job["time_to_first_step_seconds"].as_f64(), Some(400.0));
    let w = &job["timeline"]["initial_wait_seconds"];
    assert_eq!(w["unreported"].as_f64(), Some(10.0));
    assert_eq!(w["queued:capacity"].as_f64(), Some(290.0));
    assert_eq!(w["assigned"].as_f64(), Some(10.0));
    assert_eq!(w["preparing:image_pull"].as_f64(), Some(90.0));
    let ids: Vec<&str> =
        job["events"].as_array().expect("events").iter().filter_map(|e| e["event_id"].as_str()).collect();
    assert_eq!(ids, ["e1", "e2", "e3", "e4", "e5"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_batch_over_the_cap_is_invalid_argument_and_mixed_batch_keeps_good_events() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[grpc]\nmax_batch_events = 10\n").expect("write config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf8")]);
    let mut client = IngestServiceClient::connect(c.endpoint()).await.expect("connect");

    let too_many: Vec<_> =
        (0..11).map(|i| event("j", &format!("x{i}"), ago(5), Kind::NodeLost(pb::NodeLost::default()))).collect();
    let err = client.publish_batch(pb::PublishRequest { batch_seq: 1, events: too_many }).await.expect_err("over cap");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().starts_with("events:"), "{}", err.message());

    let mut future = event("j2", "f", ago(-3600), Kind::NodeLost(pb::NodeLost::default()));
    future.job_id = "j2".into();
    let mut mixed = job_events("j2");
    mixed.insert(2, future);
    mixed.insert(0, event("", "nojob", ago(5), Kind::NodeLost(pb::NodeLost::default())));
    let ack = client.publish_batch(pb::PublishRequest { batch_seq: 7, events: mixed }).await.expect("ack").into_inner();
    assert_eq!(ack.batch_seq, 7);
    assert_eq!(ack.accepted, 5);
    let fields: Vec<(u32, &str)> = ack.rejections.iter().map(|r| (r.index, r.field.as_str())).collect();
    assert_eq!(fields, [(0, "job_id"), (3, "occurred_at")]);
    assert!(ack.rejections[1].reason.contains("future"), "{:?}", ack.rejections[1]);
    let (status, job) = c.get("/api/v1/jobs/j2");
    assert_eq!(status, 200);
    assert_eq!(job["events"].as_array().map(Vec::len), Some(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_v1_and_v1alpha_are_served() {
    use tonic_health::pb::{health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest};
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let mut health = HealthClient::new(channel(&c).await);
    let st = health
        .check(HealthCheckRequest { service: "startline.v1.IngestService".into() })
        .await
        .expect("health")
        .into_inner();
    assert_eq!(st.status(), ServingStatus::Serving);

    use tonic_reflection::pb::{v1, v1alpha};
    let req = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(String::new())),
    };
    let mut r1 = v1::server_reflection_client::ServerReflectionClient::new(channel(&c).await);
    let mut resp = r1.server_reflection_info(tokio_stream::iter(vec![req])).await.expect("v1").into_inner();
    let msg = resp.message().await.expect("msg").expect("some");
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) = msg.message_response else {
        panic!("unexpected v1 reflection answer")
    };
    assert!(list.service.iter().any(|s| s.name == "startline.v1.IngestService"), "{list:?}");

    let req = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1alpha::server_reflection_request::MessageRequest::FileContainingSymbol(
            "startline.v1.LifecycleEvent".into(),
        )),
    };
    let mut ra = v1alpha::server_reflection_client::ServerReflectionClient::new(channel(&c).await);
    let mut resp = ra.server_reflection_info(tokio_stream::iter(vec![req])).await.expect("v1alpha").into_inner();
    let msg = resp.message().await.expect("msg").expect("some");
    assert!(
        matches!(msg.message_response, Some(v1alpha::server_reflection_response::MessageResponse::FileDescriptorResponse(ref f)) if !f.file_descriptor_proto.is_empty()),
        "{msg:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_api_filters_paginates_and_answers_errors_as_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");
    let mut evs = Vec::new();
    let base = ago(1000);
    for i in 0..25 {
        let kind = if i % 2 == 0 { pb::PoolKind::Managed } else { pb::PoolKind::Dedicated };
        let prio = if i % 5 == 0 { pb::PriorityClass::Urgent } else { pb::PriorityClass::Normal };
        evs.push(event(&format!("job-{i:02}"), "s", base + i * 1000, submitted(kind, prio, 1)));
        if i % 3 == 0 {
            evs.push(event(
                &format!("job-{i:02}"),
                "f",
                ago(10),
                Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() }),
            ));
        }
    }
    up.send(evs).await.expect("send");
    up.flush().await.expect("flush");

    // Page through managed jobs 4 at a time: 13 managed jobs, in id order, no repeats.
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let q = match &token {
            Some(t) => format!("/api/v1/jobs?pool_kind=managed&order=job_id&limit=4&page_token={t}"),
            None => "/api/v1/jobs?pool_kind=managed&order=job_id&limit=4".to_string(),
        };
        let (status, page) = c.get(&q);
        assert_eq!(status, 200);
        for j in page["jobs"].as_array().expect("jobs") {
            assert_eq!(j["pool_kind"], "managed");
            seen.push(j["job_id"].as_str().expect("id").to_string());
        }
        match page["next_page_token"].as_str() {
            Some(t) => token = Some(t.to_string()),
            None => break,
        }
    }
    let expected: Vec<String> = (0..25).filter(|i| i % 2 == 0).map(|i| format!("job-{i:02}")).collect();
    assert_eq!(seen, expected);

    let (_, running_urgent) = c.get("/api/v1/jobs?priority=urgent&state=running&order=job_id");
    let ids: Vec<&str> =
        running_urgent["jobs"].as_array().expect("jobs").iter().filter_map(|j| j["job_id"].as_str()).collect();
    assert_eq!(ids, ["job-00", "job-15"]);

    let cutoff = startline_collector::time::format_ms(base + 20 * 1000);
    let (_, late) = c.get(&format!("/api/v1/jobs?submitted_after={cutoff}"));
    assert_eq!(late["jobs"].as_array().map(Vec::len), Some(5));

    for (path, status, needle) in [
        ("/api/v1/jobs?priority=asap", 400, "priority"),
        ("/api/v1/jobs?submitted_after=yesterday", 400, "submitted_after"),
        ("/api/v1/jobs?color=red", 400, "color"),
        ("/api/v1/jobs/no-such-job", 404, "no-such-job"),
        ("/api/v1/nothing", 404, "no such endpoint"),
    ] {
        let (s, body) = c.get(path);
        assert_eq!(s, status, "{path}");
        assert!(body["error"].as_str().is_some_and(|e| e.contains(needle)), "{path}: {body}");
    }
    assert_eq!(c.get("/healthz").0, 200);
    assert_eq!(c.get("/readyz").0, 200);
}
