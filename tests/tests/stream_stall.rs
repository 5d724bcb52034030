//! Subscribers that stop reading cannot hold the stream out's slots: `max_subscribers` raw HTTP/2 clients (the
//! `h2` crate, no gRPC library) subscribe with a tiny stream window and never send WINDOW_UPDATE, one more is
//! refused, records are published until every window and queue is full; each stalled call ends once a send to
//! it has waited `[stream] send_timeout`, freeing its slot, and a stalled client that finally reads finds the
//! records it was handed, then `RESOURCE_EXHAUSTED` with the `startline-resume-cursor` trailer naming the last
//! of them. A normal subscriber then gets a slot and receives every record; a slow reader that keeps reading is
//! never cut.

use prost::bytes::Bytes;
use prost::Message;
use startline_proto::pb::{
    self, ingest_service_client::IngestServiceClient, lifecycle_event::Kind, stream_record::Record,
    stream_service_client::StreamServiceClient,
};
use startline_tests::{ago, event, http_get_text, submitted, Collector};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tonic::codegen::http;

const MAX_SUBSCRIBERS: usize = 64;
const SEND_TIMEOUT: Duration = Duration::from_secs(2);
/// The stalled clients' stream window, bytes: a record or two, then nothing.
const STALL_WINDOW: u32 = 64;

/// A raw HTTP/2 Subscribe call: the response head, its body, and the connection's driver.
struct RawCall {
    status: Option<String>,
    body: h2::RecvStream,
    headers: http::HeaderMap,
    _driver: tokio::task::JoinHandle<()>,
}

/// Opens a connection with stream window `window` and sends one Subscribe (the request encoded as one gRPC
/// message); returns once the response head arrived. Nothing is read from the body.
async fn raw_subscribe(addr: SocketAddr, window: u32, req: &pb::SubscribeRequest) -> RawCall {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut client, conn) =
        h2::client::Builder::new().initial_window_size(window).handshake::<_, Bytes>(tcp).await.expect("h2 handshake");
    // Drives the connection (answers pings and settings) without ever opening a stream's window.
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let head = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/startline.v1.StreamService/Subscribe"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request");
    let (response, mut send) = client.send_request(head, false).expect("send request");
    let msg = req.encode_to_vec();
    let mut frame = Vec::with_capacity(5 + msg.len());
    frame.push(0);
    frame.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    frame.extend_from_slice(&msg);
    send.send_data(Bytes::from(frame), true).expect("send body");
    let response = tokio::time::timeout(Duration::from_secs(10), response).await.expect("head in time").expect("head");
    let (parts, body) = response.into_parts();
    let status = parts.headers.get("grpc-status").and_then(|v| v.to_str().ok()).map(str::to_string);
    RawCall { status, body, headers: parts.headers, _driver: driver }
}

/// Reads a raw call to its end, releasing window as it goes (sleeping `pause` after each chunk): the records in
/// order, and the trailers.
async fn read_to_end(call: &mut RawCall, pause: Duration) -> (Vec<pb::StreamRecord>, http::HeaderMap) {
    let mut buf = Vec::<u8>::new();
    let mut recs = Vec::new();
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(30), call.body.data()).await.expect("no stall") {
        let chunk = chunk.expect("data");
        let _ = call.body.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
        while buf.len() >= 5 {
            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if buf.len() < 5 + len {
                break;
            }
            recs.push(pb::StreamRecord::decode(&buf[5..5 + len]).expect("a StreamRecord"));
            buf.drain(..5 + len);
        }
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    assert!(buf.is_empty(), "{} bytes of a cut message", buf.len());
    let trailers = call.body.trailers().await.expect("trailers").unwrap_or_default();
    (recs, trailers)
}

fn header<'a>(h: &'a http::HeaderMap, name: &str) -> &'a str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// `grpc-message` is percent-encoded.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if let Some(v) = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A series' value on `/metrics` (its first series, whatever its labels).
fn metric(c: &Collector, name: &str) -> f64 {
    let (_, text) = http_get_text(c.http, "/metrics");
    text.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with([' ', '{'])))
        .find_map(|l| l.rsplit(' ').next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

fn job(id: &str, base: i64) -> Vec<pb::LifecycleEvent> {
    vec![
        event(id, "s", base, submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Normal, 8)),
        event(
            id,
            "q",
            base + 5_000,
            Kind::Queued(pb::Queued { reason: pb::WaitReason::Capacity as i32, ..Default::default() }),
        ),
        event(id, "f", base + 60_000, Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })),
        event(id, "c", base + 90_000, Kind::Checkpoint(pb::Checkpoint { step: 10, ..Default::default() })),
        event(
            id,
            "d",
            base + 120_000,
            Kind::Done(pb::Done { outcome: pb::Outcome::Succeeded as i32, exit_code: Some(0), ..Default::default() }),
        ),
    ]
}

/// Publishes `jobs` jobs (5 events each, 50 jobs a batch) named `{prefix}/{n}`.
async fn publish_jobs(ep: &str, prefix: &str, jobs: u64) {
    let mut client = IngestServiceClient::connect(ep.to_string()).await.expect("connect ingest");
    let base = ago(3600);
    for b in 0..jobs / 50 {
        let events: Vec<_> = (0..50).flat_map(|j| job(&format!("{prefix}/{b}/{j}"), base)).collect();
        let ack = client.publish_batch(pb::PublishRequest { batch_seq: b + 1, events }).await.expect("ack");
        assert_eq!(ack.into_inner().accepted, 250, "batch {b}");
    }
}

/// Reads a tonic subscription until `n` records (progress records skipped) arrived.
async fn take(s: &mut tonic::Streaming<pb::StreamRecord>, n: usize) -> Vec<pb::StreamRecord> {
    let mut out = Vec::new();
    while out.len() < n {
        match tokio::time::timeout(Duration::from_secs(20), s.message()).await {
            Ok(Ok(Some(r))) if matches!(r.record, Some(Record::Progress(_))) => {}
            Ok(Ok(Some(r))) => out.push(r),
            other => panic!("after {} of {n} records: {other:?}", out.len()),
        }
    }
    out
}

fn assert_consecutive(recs: &[pb::StreamRecord], from: u64) {
    for (i, r) in recs.iter().enumerate() {
        assert_eq!(r.cursor, from + i as u64, "record {i} of {}", recs.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_subscribers_are_ended_at_the_send_deadline_and_free_their_slots() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!("[stream]\nmax_subscribers = {MAX_SUBSCRIBERS}\nsend_timeout = \"{}s\"\n", SEND_TIMEOUT.as_secs()),
    )
    .expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf-8")]);
    let ep = c.endpoint();

    // max_subscribers stalled calls, each on its own connection, take every slot; one more is refused.
    let live = pb::SubscribeRequest::default();
    let mut stalled = Vec::new();
    for i in 0..MAX_SUBSCRIBERS {
        let call = raw_subscribe(c.grpc, STALL_WINDOW, &live).await;
        assert_eq!(call.status, None, "stalled call {i} was answered at once: {:?}", call.headers);
        stalled.push(call);
    }
    let refused = raw_subscribe(c.grpc, STALL_WINDOW, &live).await;
    assert_eq!(refused.status.as_deref(), Some("8"), "{:?}", refused.headers);
    assert!(percent_decode(header(&refused.headers, "grpc-message")).contains("max_subscribers"));
    assert_eq!(metric(&c, "startline_collector_stream_subscribers"), MAX_SUBSCRIBERS as f64);

    // 1,000 jobs: 6,000 records (5 events and one change per job), far more than a window, a queue and what the
    // transport takes ahead. Ingest acknowledges every batch while the subscribers stall.
    let jobs = 1_000u64;
    let total = jobs * 6;
    let published = Instant::now();
    publish_jobs(&ep, "stall", jobs).await;
    let publish_took = published.elapsed();
    let mut freed = None;
    while freed.is_none() {
        assert!(
            published.elapsed() < publish_took + SEND_TIMEOUT + Duration::from_secs(10),
            "the stalled calls still hold {} slots {:?} after publishing began",
            metric(&c, "startline_collector_stream_subscribers"),
            published.elapsed()
        );
        if metric(&c, "startline_collector_stream_subscribers") == 0.0 {
            freed = Some(published.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let freed = freed.unwrap_or_default();
    assert!(freed >= SEND_TIMEOUT, "slots freed {freed:?} after publishing began, before the deadline");
    assert_eq!(metric(&c, "startline_collector_stream_send_timeouts_total"), MAX_SUBSCRIBERS as f64);
    assert_eq!(metric(&c, "startline_collector_stream_subscriber_overflows_total"), 0.0);
    eprintln!(
        "{MAX_SUBSCRIBERS} stalled subscribers ended {freed:?} after publishing began (publishing took \
         {publish_took:?}, send_timeout {SEND_TIMEOUT:?})"
    );

    // A normal subscriber gets a slot now and receives every record.
    let mut normal = StreamServiceClient::connect(ep.clone())
        .await
        .expect("connect stream")
        .subscribe(pb::SubscribeRequest { from_oldest: true, ..Default::default() })
        .await
        .expect("a slot is free")
        .into_inner();
    let everything = take(&mut normal, total as usize).await;
    assert_consecutive(&everything, 1);
    assert_eq!(everything.iter().filter(|r| matches!(r.record, Some(Record::Event(_)))).count() as u64, jobs * 5);

    // A stalled client that reads at last: the records it had been handed, in order from the first, then
    // RESOURCE_EXHAUSTED whose trailer and message name the last of them (its resume cursor).
    for (i, call) in stalled.iter_mut().enumerate().step_by(16) {
        let (recs, trailers) = read_to_end(call, Duration::ZERO).await;
        assert_eq!(header(&trailers, "grpc-status"), "8", "call {i}: {trailers:?}");
        let message = percent_decode(header(&trailers, "grpc-message"));
        let resume: u64 = header(&trailers, "startline-resume-cursor").parse().expect("resume cursor trailer");
        assert!(message.contains("[stream] send_timeout"), "{message}");
        assert!(message.contains(&format!("resume with after_cursor = {resume}")), "{message}");
        assert_consecutive(&recs, 1);
        assert_eq!(recs.last().map_or(0, |r| r.cursor), resume, "call {i}: the resume cursor is the last record");
        assert!(resume < total, "call {i} was cut before the end");
        if i == 0 {
            eprintln!("a stalled call had been handed {} records; it resumes after {resume}", recs.len());
        }
    }

    // A slow reader that keeps reading (a 4 KiB window, a 40 ms pause every 100 records) through every record and
    // 1,000 more jobs published meanwhile: slower than the stream, so its queue stays full and sends wait, and
    // slower than the deadline in all, but no send waits that long; it is not cut.
    let mut slow = raw_subscribe(c.grpc, 4096, &pb::SubscribeRequest { from_oldest: true, ..Default::default() }).await;
    assert_eq!(slow.status, None);
    let ep2 = ep.clone();
    let more = tokio::spawn(async move { publish_jobs(&ep2, "more", jobs).await });
    let started = Instant::now();
    let reader = tokio::spawn(async move {
        let mut got = Vec::new();
        let mut buf = Vec::<u8>::new();
        while (got.len() as u64) < 2 * total {
            let chunk = match tokio::time::timeout(Duration::from_secs(30), slow.body.data()).await {
                Ok(Some(Ok(c))) => c,
                other => {
                    let trailers = slow.body.trailers().await;
                    panic!("the slow reader was cut after {} records: {other:?} {trailers:?}", got.len())
                }
            };
            let _ = slow.body.flow_control().release_capacity(chunk.len());
            buf.extend_from_slice(&chunk);
            while buf.len() >= 5 {
                let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
                if buf.len() < 5 + len {
                    break;
                }
                let r = pb::StreamRecord::decode(&buf[5..5 + len]).expect("a StreamRecord");
                buf.drain(..5 + len);
                if matches!(r.record, Some(Record::Progress(_))) {
                    continue;
                }
                got.push(r);
                if got.len() % 100 == 0 {
                    tokio::time::sleep(Duration::from_millis(40)).await;
                }
            }
        }
        got
    });
    more.await.expect("publisher");
    let got = reader.await.expect("slow reader");
    let took = started.elapsed();
    assert_consecutive(&got, 1);
    assert!(took > SEND_TIMEOUT, "the slow reader took {took:?}: not slower than the deadline");
    assert_eq!(metric(&c, "startline_collector_stream_send_timeouts_total"), MAX_SUBSCRIBERS as f64);
    eprintln!("a slow reader took {took:?} for {} records and was not cut", got.len());
}
