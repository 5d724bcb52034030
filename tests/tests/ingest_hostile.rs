//! Hostile and broken gRPC input against a real collector process: oversized messages and batches are refused
//! before they are decoded, malformed frames end a stream with an error (never OK), undecodable input is
//! `INVALID_ARGUMENT` without decoder detail, connections are capped and timed out, and SIGTERM finishes with
//! silent connections open.
//!
//! Raw frames go through tonic's client with a codec that sends and receives plain bytes, so a test can put any
//! bytes into a well-formed gRPC frame (5-byte prefix + payload) on a real HTTP/2 stream.

use prost::bytes::{Buf, BufMut};
use prost::Message;
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_tests::{ago, event, path_escape, Collector};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::{Code, Status};

/// Sends and receives message payloads as they are: whatever bytes the test built.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

/// [`RawCodec`]'s encoder.
#[derive(Debug)]
struct RawEncoder;

/// [`RawCodec`]'s decoder.
#[derive(Debug)]
struct RawDecoder;

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let mut out = vec![0; src.remaining()];
        src.copy_to_slice(&mut out);
        Ok(Some(out))
    }
}

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

const PUBLISH: &str = "/startline.v1.IngestService/Publish";
const PUBLISH_BATCH: &str = "/startline.v1.IngestService/PublishBatch";

/// Bytes that are no protobuf message: a field key whose varint never ends.
const GARBAGE: [u8; 12] = [0xff; 12];

async fn raw_client(c: &Collector) -> tonic::client::Grpc<tonic::transport::Channel> {
    try_raw_client(c).await.expect("connect")
}

async fn try_raw_client(c: &Collector) -> Result<tonic::client::Grpc<tonic::transport::Channel>, Status> {
    let ch = tonic::transport::Endpoint::from_shared(c.endpoint())
        .expect("uri")
        .connect()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    Ok(tonic::client::Grpc::new(ch))
}

/// One raw unary `PublishBatch` on a new connection; returns the decoded ack or the status.
async fn publish_raw(c: &Collector, payload: Vec<u8>) -> Result<pb::PublishAck, Status> {
    let mut grpc = try_raw_client(c).await?;
    grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
    let resp = grpc.unary(tonic::Request::new(payload), PathAndQuery::from_static(PUBLISH_BATCH), RawCodec).await?;
    Ok(pb::PublishAck::decode(resp.into_inner().as_slice()).expect("ack decodes"))
}

fn one_event_batch(seq: u64, job: &str, id: &str) -> pb::PublishRequest {
    pb::PublishRequest {
        batch_seq: seq,
        events: vec![event(job, id, ago(60), Kind::NodeLost(pb::NodeLost::default()))],
    }
}

/// `n` empty events (`events` field, length 0): two bytes each on the wire.
fn empty_events(n: usize) -> Vec<u8> {
    [0x12u8, 0x00].repeat(n)
}

/// The collector still acknowledges a normal batch.
async fn still_serves(c: &Collector, job: &str) {
    let ack = publish_raw(c, one_event_batch(99, job, "alive").encode_to_vec()).await.expect("a normal batch is acked");
    assert_eq!(ack.accepted, 1, "{ack:?}");
}

/// No decoder internals in a client-facing message.
fn assert_no_internal_detail(status: &Status) {
    let m = status.message().to_ascii_lowercase();
    for leak in ["decodeerror", "varint", "wire type", "buffer", "invalid tag", "prost", "failed to decode"] {
        assert!(!m.contains(leak), "status leaks decoder detail {leak:?}: {:?}", status.message());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_over_the_size_limit_is_resource_exhausted_naming_the_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    // 5 MiB of empty events: over the documented 4 MiB default, refused from the frame's length prefix.
    let started = Instant::now();
    let err = publish_raw(&c, empty_events(5 << 19)).await.expect_err("over the size limit");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("grpc.max_message_bytes"), "{}", err.message());
    assert!(err.message().contains(&(4u64 << 20).to_string()), "names the limit: {}", err.message());
    assert!(started.elapsed() < Duration::from_secs(10), "answered after {:?}", started.elapsed());
    still_serves(&c, "after-oversized").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_events_are_refused_by_counting_before_decoding() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[grpc]\nmax_batch_events = 10\n").expect("write config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf8")]);

    // Eleven events of which the last is not even a valid event: the count refuses the batch before any event
    // is decoded, so the answer is the cap, not a decode error.
    let mut payload = empty_events(10);
    payload.extend_from_slice(&[0x12, GARBAGE.len() as u8]);
    payload.extend_from_slice(&GARBAGE);
    let err = publish_raw(&c, payload).await.expect_err("over the event cap");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("events:"), "{}", err.message());
    assert!(err.message().contains("grpc.max_batch_events"), "{}", err.message());
    assert!(err.message().contains("10"), "{}", err.message());

    // Half a million empty events in 1 MiB (under the size limit): refused at once by the count.
    let started = Instant::now();
    let err = publish_raw(&c, empty_events(1 << 19)).await.expect_err("over the event cap");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("grpc.max_batch_events"), "{}", err.message());
    assert!(started.elapsed() < Duration::from_secs(10), "answered after {:?}", started.elapsed());

    // On a stream, the over-cap batch ends the stream with the same status after the earlier batch's ack.
    let mut grpc = raw_client(&c).await;
    grpc.ready().await.expect("ready");
    let frames = vec![one_event_batch(1, "capped", "a").encode_to_vec(), empty_events(11)];
    let mut acks = grpc
        .streaming(tonic::Request::new(tokio_stream::iter(frames)), PathAndQuery::from_static(PUBLISH), RawCodec)
        .await
        .expect("stream opens")
        .into_inner();
    let first = acks.message().await.expect("first ack").expect("an ack");
    assert_eq!(pb::PublishAck::decode(first.as_slice()).expect("ack").accepted, 1);
    let err = acks.message().await.expect_err("the stream ends with an error");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("grpc.max_batch_events"), "{}", err.message());

    still_serves(&c, "after-too-many").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_unary_request_is_invalid_argument_without_decoder_detail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    for payload in [GARBAGE.to_vec(), vec![0x12, 0x05, 0x0a], vec![0x0a]] {
        let err = publish_raw(&c, payload.clone()).await.expect_err("undecodable");
        assert_eq!(err.code(), Code::InvalidArgument, "{payload:?}: {err:?}");
        assert_no_internal_detail(&err);
    }
    still_serves(&c, "after-garbage").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_mid_stream_ends_the_stream_with_invalid_argument_after_the_durable_ack() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("db");
    let c = Collector::start(&db, &[]);
    let mut grpc = raw_client(&c).await;
    grpc.ready().await.expect("ready");
    let frames = vec![
        one_event_batch(1, "mid-stream", "before").encode_to_vec(),
        GARBAGE.to_vec(),
        one_event_batch(3, "mid-stream", "after").encode_to_vec(),
    ];
    let mut acks = grpc
        .streaming(tonic::Request::new(tokio_stream::iter(frames)), PathAndQuery::from_static(PUBLISH), RawCodec)
        .await
        .expect("stream opens")
        .into_inner();
    let first = acks.message().await.expect("first ack").expect("an ack before the error");
    let first = pb::PublishAck::decode(first.as_slice()).expect("ack");
    assert_eq!((first.batch_seq, first.accepted), (1, 1), "{first:?}");
    let err = match acks.message().await {
        Err(e) => e,
        Ok(other) => panic!("the stream must end with an error status after a malformed frame, got {other:?}"),
    };
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_no_internal_detail(&err);

    // The first batch's ack was durable: it survives kill -9; the batch after the garbage was never acked.
    let status = c.signal_and_wait("KILL");
    assert!(!status.success());
    let c = Collector::start(&db, &[]);
    let (code, job) = c.get(&format!("/api/v1/jobs/{}", path_escape("mid-stream")));
    assert_eq!(code, 200, "{job}");
    let ids: Vec<&str> =
        job["events"].as_array().expect("events").iter().filter_map(|e| e["event_id"].as_str()).collect();
    assert_eq!(ids, ["before"]);
}

const REPORT: &str = "/startline.v1.NodeHealthService/Report";
const SUBSCRIBE: &str = "/startline.v1.StreamService/Subscribe";

/// The collector's peak resident memory so far, KiB (`VmHWM`).
fn peak_kib(c: &Collector) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", c.child.id())).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

/// One raw `Report` on a new connection.
async fn report_raw(c: &Collector, payload: Vec<u8>) -> Result<pb::ReportHealthResponse, Status> {
    let mut grpc = raw_client(c).await;
    grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
    let resp = grpc.unary(tonic::Request::new(payload), PathAndQuery::from_static(REPORT), RawCodec).await?;
    Ok(pb::ReportHealthResponse::decode(resp.into_inner().as_slice()).expect("answer decodes"))
}

/// One raw `Subscribe`: the status the call ends with before its first record (`Ok` if a record came).
async fn subscribe_raw(c: &Collector, payload: Vec<u8>) -> Result<(), Status> {
    let mut grpc = raw_client(c).await;
    grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
    let path = PathAndQuery::from_static(SUBSCRIBE);
    let mut records = grpc.server_streaming(tonic::Request::new(payload), path, RawCodec).await?.into_inner();
    tokio::time::timeout(Duration::from_secs(10), records.message()).await.expect("answered in time").map(|_| ())
}

/// `NodeHealthService.Report` is counted before it is decoded: two million empty readings in 4 MB are refused
/// naming `reports` without the collector's memory growing by what decoding them takes (hundreds of MB), and so
/// are too many GPUs in one reading and too many XID errors of one GPU; undecodable bytes are `INVALID_ARGUMENT`
/// without decoder detail (not `INTERNAL`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_are_counted_before_decoding_and_undecodable_ones_are_invalid_argument() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let before = peak_kib(&c);
    let started = Instant::now();
    let err = report_raw(&c, [0x0au8, 0x00].repeat(2_000_000)).await.expect_err("over the reading cap");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("reports: more than 1000"), "{}", err.message());
    assert!(started.elapsed() < Duration::from_secs(10), "answered after {:?}", started.elapsed());
    let grew = peak_kib(&c).saturating_sub(before);
    assert!(grew < 48 * 1024, "the refused request grew the collector's peak by {grew} KiB");

    // One reading with 65 empty GPUs; one GPU with 65 XID errors (packed).
    let gpus = {
        let inner = [0x22u8, 0x00].repeat(65);
        let mut w = vec![0x0a];
        prost::encoding::encode_varint(inner.len() as u64, &mut w);
        w.extend(inner);
        w
    };
    let err = report_raw(&c, gpus).await.expect_err("over the GPU cap");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("reports[0].gpus: more than 64"), "{}", err.message());
    let gpu = pb::GpuHealth { xid_errors: vec![79; 65], ..Default::default() };
    let many_xids = pb::ReportHealthRequest {
        reports: vec![pb::NodeHealth { node: "n".into(), gpus: vec![gpu], ..Default::default() }],
    };
    let err = report_raw(&c, many_xids.encode_to_vec()).await.expect_err("over the XID cap");
    assert!(err.message().starts_with("reports[0].gpus[0].xid_errors: more than 64"), "{}", err.message());

    for payload in [GARBAGE.to_vec(), vec![0x0a, 0x05, 0x0a], vec![0x0a]] {
        let err = report_raw(&c, payload.clone()).await.expect_err("undecodable");
        assert_eq!(err.code(), Code::InvalidArgument, "{payload:?}: {err:?}");
        assert_eq!(err.message(), "message: not a valid startline.v1.ReportHealthRequest");
        assert_no_internal_detail(&err);
    }
    // A good reading is still taken.
    let now = startline_proto::time::ms_to_timestamp(startline_proto::time::now_ms());
    let ok = pb::ReportHealthRequest {
        reports: vec![pb::NodeHealth { node: "gpu-1".into(), observed_at: Some(now), ..Default::default() }],
    };
    assert_eq!(report_raw(&c, ok.encode_to_vec()).await.expect("stored").accepted, 1);
}

/// `StreamService.Subscribe` is counted before it is decoded too (64 values per filter list), and undecodable
/// bytes are `INVALID_ARGUMENT` without decoder detail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_are_counted_before_decoding_and_undecodable_ones_are_invalid_argument() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let before = peak_kib(&c);
    let err = subscribe_raw(&c, [0x1au8, 0x00].repeat(2_000_000)).await.expect_err("over the filter cap");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("pools: more than 64 values"), "{}", err.message());
    let grew = peak_kib(&c).saturating_sub(before);
    assert!(grew < 24 * 1024, "the refused request grew the collector's peak by {grew} KiB");
    // 65 priorities in one packed run.
    let mut packed = vec![0x22, 65];
    packed.extend([1u8; 65]);
    let err = subscribe_raw(&c, packed).await.expect_err("over the filter cap");
    assert!(err.message().starts_with("priorities: more than 64 values"), "{}", err.message());
    for payload in [GARBAGE.to_vec(), vec![0x1a, 0x05, 0x0a], vec![0x0a]] {
        let err = subscribe_raw(&c, payload.clone()).await.expect_err("undecodable");
        assert_eq!(err.code(), Code::InvalidArgument, "{payload:?}: {err:?}");
        assert_eq!(err.message(), "message: not a valid startline.v1.SubscribeRequest");
        assert_no_internal_detail(&err);
    }
    // A good subscription still gets its records (a progress-free one from the oldest: the first event).
    still_serves(&c, "subscribed").await;
    let req = pb::SubscribeRequest { from_oldest: true, ..Default::default() };
    subscribe_raw(&c, req.encode_to_vec()).await.expect("a record");
}

/// The HTTP/2 client preface and an empty SETTINGS frame: a handshake, then silence.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const EMPTY_SETTINGS: [u8; 9] = [0, 0, 0, 0x4, 0, 0, 0, 0, 0];

/// Reads until the peer closes (or errors), up to `limit`; returns how long that took, or None.
fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");
    let mut buf = [0u8; 4096];
    while started.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => return Some(started.elapsed()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return Some(started.elapsed()),
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_silent_connections_exits_promptly_after_the_final_flush() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("db");
    let c = Collector::start(&db, &[]);
    for i in 0..5 {
        let ack =
            publish_raw(&c, one_event_batch(i, "before-term", &format!("e{i}")).encode_to_vec()).await.expect("acked");
        assert_eq!(ack.accepted, 1);
    }
    // Silent peers: one says nothing, one sends only the preface, one completes the handshake and goes quiet,
    // one opens a stream and never finishes it.
    let mut silent = TcpStream::connect(c.grpc).expect("connect");
    let mut preface_only = TcpStream::connect(c.grpc).expect("connect");
    preface_only.write_all(PREFACE).expect("write");
    let mut handshaken = TcpStream::connect(c.grpc).expect("connect");
    handshaken.write_all(PREFACE).expect("write");
    handshaken.write_all(&EMPTY_SETTINGS).expect("write");
    let mut grpc = raw_client(&c).await;
    grpc.ready().await.expect("ready");
    let (_hold_open, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(1);
    let open_stream = tokio::spawn(async move {
        grpc.streaming(
            tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx)),
            PathAndQuery::from_static(PUBLISH),
            RawCodec,
        )
        .await
        .map(|r| r.into_inner())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut c = c;
    let pid = c.child.id().to_string();
    let started = Instant::now();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success());
    let status = loop {
        if let Some(st) = c.child.try_wait().expect("wait") {
            break st;
        }
        // The default drain deadline is 10 s; the connections still open then are closed.
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "collector still running 20 s after SIGTERM with silent connections open; log:\n{}",
            std::fs::read_to_string(&c.log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit status {status:?}");
    let log = std::fs::read_to_string(&c.log).unwrap_or_default();
    assert!(log.contains("store flushed") && log.contains("collector stopped"), "no final flush in the log:\n{log}");
    for s in [&mut silent, &mut preface_only, &mut handshaken] {
        assert!(closed_within(s, Duration::from_secs(2)).is_some(), "a connection outlived the collector");
    }
    // The open stream was told the collector is going away (after its acks), not OK.
    let mut acks = open_stream.await.expect("task").expect("the stream was open");
    match acks.message().await {
        Err(e) => assert_eq!(e.code(), Code::Unavailable, "{e:?}"),
        Ok(other) => panic!("a stream cut by shutdown must end with UNAVAILABLE, got {other:?}"),
    }
    drop(c);

    let c = Collector::start(&db, &[]);
    let (code, job) = c.get("/api/v1/jobs/before-term");
    assert_eq!(code, 200, "{job}");
    assert_eq!(job["events"].as_array().map(Vec::len), Some(5), "{job}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_are_closed_and_idle_handshakes_time_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[grpc]\nmax_connections = 2\nhandshake_timeout = \"1s\"\n").expect("write config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf8")]);

    // Two connections that never speak hold both slots until the handshake timeout closes them.
    let mut a = TcpStream::connect(c.grpc).expect("connect");
    let mut b = TcpStream::connect(c.grpc).expect("connect");
    std::thread::sleep(Duration::from_millis(200));
    let mut third = TcpStream::connect(c.grpc).expect("the kernel still accepts");
    third.write_all(PREFACE).expect("write");
    let _ = third.write_all(&EMPTY_SETTINGS);
    let refused = closed_within(&mut third, Duration::from_millis(900));
    assert!(refused.is_some(), "a connection over grpc.max_connections must be closed at once");
    for s in [&mut a, &mut b] {
        let t = closed_within(s, Duration::from_secs(5)).expect("a silent connection is closed by handshake_timeout");
        assert!(t < Duration::from_secs(3), "closed after {t:?}");
    }
    // With the slots free again, a real client gets through.
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(e) = publish_raw(&c, one_event_batch(1, "cap", "ok").encode_to_vec()).await {
        assert!(Instant::now() < deadline, "no client served after the slots freed: {e:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Operators see both in /metrics.
    let (_, metrics) = startline_tests::http_get_text(c.http, "/metrics");
    let count = |reason: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("startline_collector_refusals_total") && l.contains(&format!("reason=\"{reason}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    assert!(count("connection_limit").is_some_and(|n| n >= 1.0), "{metrics}");
    assert!(count("handshake_timeout").is_some_and(|n| n >= 2.0), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_answering_pings_is_closed_by_http2_keepalive() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[grpc]\nkeepalive_interval = \"1s\"\nkeepalive_timeout = \"1s\"\n").expect("write config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf8")]);
    let mut s = TcpStream::connect(c.grpc).expect("connect");
    s.write_all(PREFACE).expect("write");
    s.write_all(&EMPTY_SETTINGS).expect("write");
    // Handshake done; the peer now reads nothing and answers nothing (a half-open connection looks the same).
    let t = closed_within(&mut s, Duration::from_secs(8)).expect("closed by keepalive");
    assert!(t < Duration::from_secs(6), "closed after {t:?}");
}
