//! The open-jobs budget per identity (`max_open_jobs`, `auth.max_open_jobs`) against a real collector: a job is
//! open from its first event until it is done; a batch that would take its identity past its budget is refused
//! whole with `RESOURCE_EXHAUSTED` naming the key (nothing of it stored), counted in
//! `startline_collector_refusals_total{reason="open_jobs"}`; events of open jobs still flow; a `done` frees room,
//! also within the batch that opens new jobs; another identity is unaffected; the default applies to identities
//! that set none; the gauge `startline_collector_identity_open_jobs{identity}` follows.

use startline_proto::pb::{self, ingest_service_client::IngestServiceClient, lifecycle_event::Kind};
use startline_tests::{ago, event, http_request, submitted, Collector};
use tonic::Code;

fn hash(t: &str) -> String {
    startline_collector::auth::TokenHash::of(t).to_config()
}

fn sub(job: &str) -> pb::LifecycleEvent {
    event(job, "s", ago(600), submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Normal, 8))
}

fn done(job: &str) -> pb::LifecycleEvent {
    event(job, "d", ago(60), Kind::Done(pb::Done { outcome: pb::Outcome::Succeeded as i32, ..Default::default() }))
}

fn queued(job: &str) -> pb::LifecycleEvent {
    event(
        job,
        "q",
        ago(500),
        Kind::Queued(pb::Queued { reason: pb::WaitReason::Capacity as i32, ..Default::default() }),
    )
}

async fn publish(c: &Collector, token: &str, events: Vec<pb::LifecycleEvent>) -> Result<pb::PublishAck, tonic::Status> {
    let mut client = IngestServiceClient::connect(c.endpoint()).await.expect("connect");
    let mut r = tonic::Request::new(pb::PublishRequest { batch_seq: 1, events });
    r.metadata_mut().insert("authorization", format!("Bearer {token}").parse().expect("metadata"));
    client.publish_batch(r).await.map(|a| a.into_inner())
}

fn stored(c: &Collector, reader: &str, job: &str) -> bool {
    let auth = format!("Bearer {reader}");
    http_request(c.http, "GET", &format!("/api/v1/jobs/{job}"), &[("authorization", &auth)], "").0 == 200
}

/// The value of one series of `/metrics` (the first line that starts with `series`).
fn metric(c: &Collector, reader: &str, series: &str) -> Option<f64> {
    let auth = format!("Bearer {reader}");
    let (_, _, text) = http_request(c.http, "GET", "/metrics", &[("authorization", &auth)], "");
    text.lines().find(|l| l.starts_with(series))?.rsplit(' ').next()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_past_its_open_jobs_budget_is_refused_until_its_jobs_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (small, other, reader) = ("stl_open_jobs_small", "stl_open_jobs_other", "stl_open_jobs_reader");
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[auth]\nmax_open_jobs = 4\n\
             [[auth.identity]]\nname = \"small\"\ntoken_hashes = [\"{}\"]\nscopes = [\"ingest\"]\nmax_open_jobs = 2\n\
             [[auth.identity]]\nname = \"other\"\ntoken_hashes = [\"{}\"]\nscopes = [\"ingest\"]\n\
             [[auth.identity]]\nname = \"reader\"\ntoken_hashes = [\"{}\"]\nscopes = [\"read\"]\n",
            hash(small),
            hash(other),
            hash(reader)
        ),
    )
    .expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf8")]);

    // Two open jobs: the budget.
    let ack = publish(&c, small, vec![sub("s/1"), sub("s/2")]).await.expect("within the budget");
    assert_eq!(ack.accepted, 2, "{ack:?}");
    // A third would pass it: the whole batch is refused, the open job's event in it too.
    let err = publish(&c, small, vec![queued("s/1"), sub("s/3")]).await.expect_err("over the budget");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    for part in ["\"small\" has 2 open jobs", "would open 1 more", "max_open_jobs = 2"] {
        assert!(err.message().contains(part), "{part:?} missing from {}", err.message());
    }
    assert!(!stored(&c, reader, "s/3"), "nothing of a refused batch is stored");
    // Events of its open jobs still flow, and a job whose whole life is in one batch never counts.
    assert_eq!(publish(&c, small, vec![queued("s/1")]).await.expect("open job").accepted, 1);
    assert_eq!(publish(&c, small, vec![sub("s/brief"), done("s/brief")]).await.expect("opens nothing").accepted, 2);
    // A done in the same batch makes room for a new job.
    let ack = publish(&c, small, vec![done("s/1"), sub("s/3")]).await.expect("one ends, one opens");
    assert_eq!(ack.accepted, 2, "{ack:?}");
    assert!(publish(&c, small, vec![sub("s/4")]).await.is_err(), "s/2 and s/3 are open");
    // Another identity has its own budget, the default (4).
    for i in 0..4 {
        publish(&c, other, vec![sub(&format!("o/{i}"))]).await.expect("within the default budget");
    }
    let err = publish(&c, other, vec![sub("o/4")]).await.expect_err("over the default budget");
    assert!(err.message().contains("max_open_jobs = 4"), "{}", err.message());
    // A done from the identity frees room.
    publish(&c, small, vec![done("s/2")]).await.expect("done");
    publish(&c, small, vec![sub("s/4")]).await.expect("room again");

    assert_eq!(metric(&c, reader, "startline_collector_refusals_total{reason=\"open_jobs\""), Some(3.0));
    assert_eq!(metric(&c, reader, "startline_collector_identity_open_jobs{identity=\"small\""), Some(2.0));
    assert_eq!(metric(&c, reader, "startline_collector_identity_open_jobs{identity=\"other\""), Some(4.0));
}
