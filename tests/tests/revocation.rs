//! A reload reaches open streams: against the real collector, identities `a` and `b` each hold a `Publish`
//! stream and a `Subscribe` call open, and `c` a `Publish` stream. `a`'s token is removed from the config and
//! SIGHUP sent: `a`'s two calls end with `UNAUTHENTICATED` before another batch is taken or record sent (the
//! batch `a` sends next is not stored), while `b`'s and `c`'s go on. The admin route then takes `b`'s `ingest`
//! scope: `b`'s Publish ends with `PERMISSION_DENIED`, its Subscribe (still `read`) goes on; taking `read` too
//! ends that with `PERMISSION_DENIED`. `c`, never changed, publishes through all of it.

use startline_proto::pb::{
    self, ingest_service_client::IngestServiceClient, stream_service_client::StreamServiceClient,
};
use startline_tests::{ago, event, http_get_text, submitted, Collector};
use std::path::Path;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

fn hash(t: &str) -> String {
    startline_collector::auth::TokenHash::of(t).to_config()
}

/// The config: `(name, token, scopes)` per identity.
fn write_config(path: &Path, ids: &[(&str, &str, &[&str])]) {
    let mut s = String::new();
    for (name, token, scopes) in ids {
        let scopes: Vec<String> = scopes.iter().map(|s| format!("{s:?}")).collect();
        s.push_str(&format!(
            "[[auth.identity]]\nname = {name:?}\ntoken_hashes = [{:?}]\nscopes = [{}]\n",
            hash(token),
            scopes.join(", ")
        ));
    }
    std::fs::write(path, s).expect("write config");
}

fn authorized<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert("authorization", format!("Bearer {token}").parse().expect("metadata"));
    r
}

/// An open Publish stream.
struct Pub {
    tx: mpsc::Sender<pb::PublishRequest>,
    acks: tonic::Streaming<pb::PublishAck>,
    seq: u64,
}

impl Pub {
    async fn open(ep: &str, token: &str) -> Pub {
        let (tx, rx) = mpsc::channel(8);
        let mut client = IngestServiceClient::connect(ep.to_string()).await.expect("connect ingest");
        let acks =
            client.publish(authorized(ReceiverStream::new(rx), token)).await.expect("publish opens").into_inner();
        Pub { tx, acks, seq: 0 }
    }

    /// Sends one batch (one job's `submitted`); a stream the collector ended may no longer take it.
    async fn send(&mut self, job: &str) {
        self.seq += 1;
        let ev = event(job, "s", ago(60), submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Normal, 8));
        let _ = self.tx.send(pb::PublishRequest { batch_seq: self.seq, events: vec![ev] }).await;
    }

    /// Sends one batch and returns its ack, or the status that ended the stream.
    async fn batch(&mut self, job: &str) -> Result<pb::PublishAck, tonic::Status> {
        self.send(job).await;
        match tokio::time::timeout(Duration::from_secs(10), self.acks.message()).await.expect("an answer in time") {
            Ok(Some(ack)) => Ok(ack),
            Ok(None) => panic!("the publish stream ended with OK"),
            Err(s) => Err(s),
        }
    }

    /// The status that ended the stream, without sending anything more.
    async fn ended(&mut self) -> tonic::Status {
        match tokio::time::timeout(Duration::from_secs(10), self.acks.message()).await.expect("ended in time") {
            Err(s) => s,
            other => panic!("expected the stream to end with a status, got {other:?}"),
        }
    }
}

async fn subscribe(ep: &str, token: &str) -> tonic::Streaming<pb::StreamRecord> {
    let mut client = StreamServiceClient::connect(ep.to_string()).await.expect("connect stream");
    client.subscribe(authorized(pb::SubscribeRequest::default(), token)).await.expect("subscribe").into_inner()
}

/// The next records until one of `job` (event records only), or the status that ended the call.
async fn until_job(
    s: &mut tonic::Streaming<pb::StreamRecord>,
    job: &str,
) -> Result<Vec<pb::StreamRecord>, (tonic::Status, Vec<pb::StreamRecord>)> {
    let mut got = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), s.message()).await.expect("a record or the end in time") {
            Ok(Some(r)) => {
                let done = r.job_id == job && matches!(r.record, Some(pb::stream_record::Record::Event(_)));
                got.push(r);
                if done {
                    return Ok(got);
                }
            }
            Ok(None) => panic!("the subscription ended with OK"),
            Err(st) => return Err((st, got)),
        }
    }
}

/// Reads until nothing more comes for a second (what was published so far, changes included).
async fn quiet(s: &mut tonic::Streaming<pb::StreamRecord>) -> Vec<pb::StreamRecord> {
    let mut got = Vec::new();
    while let Ok(r) = tokio::time::timeout(Duration::from_secs(1), s.message()).await {
        got.push(r.expect("open").expect("not ended"));
    }
    got
}

fn resume_cursor(s: &tonic::Status) -> Option<u64> {
    s.metadata().get("startline-resume-cursor")?.to_str().ok()?.parse().ok()
}

fn revoked(c: &Collector, call: &str, code: &str) -> u64 {
    let (_, text) = http_get_text(c.http, "/metrics");
    let series = format!("startline_collector_auth_revoked_calls_total{{call=\"{call}\",code=\"{code}\"");
    text.lines().find(|l| l.starts_with(&series)).and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(u64::MAX)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_ends_the_open_streams_of_revoked_credentials_and_scopes_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("collector.toml");
    let both: &[&str] = &["ingest", "read"];
    write_config(
        &cfg,
        &[("a", "tok-a", both), ("b", "tok-b", both), ("c", "tok-c", &["ingest"]), ("ops", "tok-ops", &["admin"])],
    );
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf-8")]);
    let ep = c.endpoint();

    let mut sub_a = subscribe(&ep, "tok-a").await;
    let mut sub_b = subscribe(&ep, "tok-b").await;
    let mut pub_a = Pub::open(&ep, "tok-a").await;
    let mut pub_b = Pub::open(&ep, "tok-b").await;
    let mut pub_c = Pub::open(&ep, "tok-c").await;
    assert_eq!(pub_a.batch("a/1").await.expect("a publishes").accepted, 1);
    assert_eq!(pub_b.batch("b/1").await.expect("b publishes").accepted, 1);
    assert_eq!(pub_c.batch("c/1").await.expect("c publishes").accepted, 1);
    let mut seen_a = until_job(&mut sub_a, "c/1").await.expect("a reads");
    seen_a.extend(quiet(&mut sub_a).await);
    until_job(&mut sub_b, "c/1").await.expect("b reads");
    let last_a = seen_a.last().map(|r| r.cursor).expect("records");

    // a's token is removed; SIGHUP. a's calls end at once, each with UNAUTHENTICATED: the subscription names
    // the last record it was sent as the cursor to resume after (with a new token).
    write_config(
        &cfg,
        &[("a", "tok-a-new", both), ("b", "tok-b", both), ("c", "tok-c", &["ingest"]), ("ops", "tok-ops", &["admin"])],
    );
    let pid = c.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-HUP", &pid]).status().expect("kill").success());
    let (end, after_reload) = until_job(&mut sub_a, "never").await.expect_err("a's subscription ends");
    assert_eq!(end.code(), Code::Unauthenticated, "{end:?}");
    assert!(end.message().contains("reload"), "{end:?}");
    assert!(after_reload.is_empty(), "a was sent {after_reload:?} after the reload");
    assert_eq!(resume_cursor(&end), Some(last_a), "{end:?}");
    let end = pub_a.ended().await;
    assert_eq!(end.code(), Code::Unauthenticated, "{end:?}");
    // a's next batch is not taken (checked below: nothing of it is stored).
    pub_a.send("a/2").await;
    // b and c, unchanged, keep their streams: b's and c's next batches are acknowledged, b reads them.
    assert_eq!(pub_b.batch("b/2").await.expect("b still publishes").accepted, 1);
    assert_eq!(pub_c.batch("c/2").await.expect("c still publishes").accepted, 1);
    let seen_b = until_job(&mut sub_b, "c/2").await.expect("b still reads");
    assert!(seen_b.iter().any(|r| r.job_id == "b/2"), "{seen_b:?}");
    assert!(!seen_b.iter().any(|r| r.job_id == "a/2"), "a's batch after the reload was stored: {seen_b:?}");
    assert_eq!((revoked(&c, "publish", "unauthenticated"), revoked(&c, "subscribe", "unauthenticated")), (1, 1));

    // The admin route takes b's ingest scope (b keeps read): b's Publish ends with PERMISSION_DENIED before
    // another batch; its Subscribe goes on.
    write_config(&cfg, &[("b", "tok-b", &["read"]), ("c", "tok-c", &["ingest"]), ("ops", "tok-ops", &["admin"])]);
    let reload = reqwest::Client::new()
        .post(format!("http://{}/api/v1/admin/reload", c.http))
        .bearer_auth("tok-ops")
        .send()
        .await
        .expect("reload request");
    assert_eq!(reload.status().as_u16(), 200, "{:?}", reload.text().await);
    let end = pub_b.ended().await;
    assert_eq!(end.code(), Code::PermissionDenied, "{end:?}");
    assert!(end.message().contains("\"ingest\""), "{end:?}");
    pub_b.send("b/3").await;
    assert_eq!(pub_c.batch("c/3").await.expect("c still publishes").accepted, 1);
    let mut seen_b = until_job(&mut sub_b, "c/3").await.expect("b, still read, still reads");
    seen_b.extend(quiet(&mut sub_b).await);
    assert!(!seen_b.iter().any(|r| r.job_id == "b/3"), "b's batch after the reload was stored: {seen_b:?}");
    let last_b = seen_b.last().map(|r| r.cursor).expect("records");

    // Taking read too ends b's Subscribe with PERMISSION_DENIED, naming its resume cursor.
    write_config(&cfg, &[("b", "tok-b", &["ingest"]), ("c", "tok-c", &["ingest"]), ("ops", "tok-ops", &["admin"])]);
    let pid = c.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-HUP", &pid]).status().expect("kill").success());
    let (end, after_reload) = until_job(&mut sub_b, "never").await.expect_err("b's subscription ends");
    assert_eq!(end.code(), Code::PermissionDenied, "{end:?}");
    assert!(end.message().contains("\"read\""), "{end:?}");
    assert!(after_reload.is_empty(), "b was sent {after_reload:?} after the reload");
    assert_eq!(resume_cursor(&end), Some(last_b), "{end:?}");
    assert_eq!(pub_c.batch("c/4").await.expect("c publishes through every reload").accepted, 1);
    assert_eq!((revoked(&c, "publish", "permission_denied"), revoked(&c, "subscribe", "permission_denied")), (1, 1));
    // The batches sent on the ended streams were never stored; c's last one was.
    let job = |id: &str| {
        let (code, _, _) = startline_tests::http_request(
            c.http,
            "GET",
            &format!("/api/v1/jobs/{id}"),
            &[("Authorization", "Bearer tok-ops")],
            "",
        );
        code
    };
    assert_eq!((job("a/2"), job("b/3"), job("c/4")), (404, 404, 200));
}
