//! The wire codecs of the gRPC services, with caps on repeated fields enforced before a message is decoded.
//!
//! tonic refuses a message whose length prefix is over `grpc.max_message_bytes` before buffering it. Within that
//! size a message can still hold millions of tiny entries (an empty event or health reading is two bytes on the
//! wire and hundreds in memory), so each request is first walked with prost's wire-format helpers, counting the
//! entries of its repeated fields without decoding them, and refused as soon as a count passes its cap: the
//! events of a `PublishRequest` ([`RequestDecoder`], `grpc.max_batch_events`), the readings of a
//! `ReportHealthRequest` with the GPUs of each reading and the XID errors of each GPU ([`check_report`]), and the
//! filter lists of a `SubscribeRequest` ([`check_subscribe`]). Only then is the message decoded. Undecodable bytes
//! are `INVALID_ARGUMENT` with a fixed message naming the message type: decoder internals never reach the client.

use prost::bytes::Buf;
use prost::encoding::{decode_key, decode_varint, skip_field, DecodeContext, WireType};
use prost::Message;
use startline_proto::pb;
use std::marker::PhantomData;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Code, Status};

/// The field number of `PublishRequest.events`.
const EVENTS_FIELD: u32 = 2;

/// What a client is told about bytes that are not a `PublishRequest`.
const MALFORMED: &str = "message: not a valid startline.v1.PublishRequest";

/// Encodes acks and decodes requests, refusing batches over `max_events` before decoding them.
#[derive(Debug, Clone, Copy)]
pub struct PublishCodec {
    max_events: usize,
}

impl PublishCodec {
    /// A codec for batches of at most `max_events` events.
    pub fn new(max_events: usize) -> Self {
        PublishCodec { max_events }
    }
}

impl Codec for PublishCodec {
    type Encode = pb::PublishAck;
    type Decode = pb::PublishRequest;
    type Encoder = AckEncoder;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> AckEncoder {
        AckEncoder
    }

    fn decoder(&mut self) -> RequestDecoder {
        RequestDecoder { max_events: self.max_events }
    }
}

/// Encodes a `PublishAck`.
#[derive(Debug)]
pub struct AckEncoder;

impl Encoder for AckEncoder {
    type Item = pb::PublishAck;
    type Error = Status;

    fn encode(&mut self, item: pb::PublishAck, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst).map_err(|_| Status::internal("ack could not be encoded"))
    }
}

/// Decodes a `PublishRequest` after counting its events.
#[derive(Debug)]
pub struct RequestDecoder {
    max_events: usize,
}

impl Decoder for RequestDecoder {
    type Item = pb::PublishRequest;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<pb::PublishRequest>, Status> {
        let len = src.remaining();
        if src.chunk().len() == len {
            // tonic hands over one contiguous message: count in place, then decode from the same bytes.
            count_events(src.chunk(), self.max_events)?;
            return pb::PublishRequest::decode(src).map(Some).map_err(|_| malformed());
        }
        let bytes = src.copy_to_bytes(len);
        count_events(&bytes, self.max_events)?;
        pb::PublishRequest::decode(bytes).map(Some).map_err(|_| malformed())
    }
}

fn malformed() -> Status {
    Status::invalid_argument(MALFORMED)
}

/// Counts the `events` entries of an encoded `PublishRequest` without decoding them; refuses the message as soon
/// as there are more than `max`. Every other field is skipped by its wire type.
pub fn count_events(mut buf: &[u8], max: usize) -> Result<usize, Status> {
    let mut n = 0usize;
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(|_| malformed())?;
        if tag == EVENTS_FIELD {
            n += 1;
            if n > max {
                return Err(Status::invalid_argument(format!(
                    "events: batch has more than {max} events, at most {max} allowed (grpc.max_batch_events)"
                )));
            }
        }
        skip_field(wire_type, tag, &mut buf, DecodeContext::default()).map_err(|_| malformed())?;
    }
    Ok(n)
}

/// The status a client gets when its request stream fails before a message could be decoded. tonic refuses an
/// oversized message with `OUT_OF_RANGE` and protocol faults (a bad compression flag, a frame cut short) with
/// `INTERNAL` and its own wording; those become `RESOURCE_EXHAUSTED` naming the limit and `INVALID_ARGUMENT`.
/// The codec's own statuses and a client's cancellation pass unchanged.
pub fn inbound_error(status: Status, max_message_bytes: usize) -> Status {
    match status.code() {
        Code::OutOfRange | Code::ResourceExhausted => Status::resource_exhausted(format!(
            "message: larger than grpc.max_message_bytes ({max_message_bytes} bytes); send smaller batches"
        )),
        Code::InvalidArgument | Code::Cancelled => status,
        _ => Status::invalid_argument("message: malformed grpc frame"),
    }
}

/// The one request message of a call read as a client stream (`name`: the message type, for the error): an
/// empty stream is `INVALID_ARGUMENT`, a failed read becomes [`inbound_error`]'s status.
pub async fn single_message<T>(
    stream: &mut tonic::Streaming<T>,
    name: &str,
    max_message_bytes: usize,
) -> Result<T, Status> {
    match stream.message().await {
        Ok(Some(message)) => Ok(message),
        Ok(None) => Err(Status::invalid_argument(format!("message: the request has no {name}"))),
        Err(status) => Err(inbound_error(status, max_message_bytes)),
    }
}

/// Checks an encoded request before it is decoded; `Err` is the client's status.
pub type Precheck = fn(&[u8]) -> Result<(), Status>;

/// The codec of a service whose requests (`D`) are checked by a [`Precheck`] before they are decoded, and whose
/// undecodable requests are `INVALID_ARGUMENT` with a fixed message; answers (`E`) are encoded as usual.
pub struct CheckedCodec<E, D> {
    check: Precheck,
    malformed: &'static str,
    types: PhantomData<fn() -> (E, D)>,
}

impl<E, D> CheckedCodec<E, D> {
    /// A codec that runs `check` on every request and says `malformed` of undecodable ones.
    pub fn new(check: Precheck, malformed: &'static str) -> Self {
        CheckedCodec { check, malformed, types: PhantomData }
    }
}

impl<E: Message + Send + 'static, D: Message + Default + Send + 'static> Codec for CheckedCodec<E, D> {
    type Encode = E;
    type Decode = D;
    type Encoder = PlainEncoder<E>;
    type Decoder = CheckedDecoder<D>;

    fn encoder(&mut self) -> PlainEncoder<E> {
        PlainEncoder(PhantomData)
    }

    fn decoder(&mut self) -> CheckedDecoder<D> {
        CheckedDecoder { check: self.check, malformed: self.malformed, types: PhantomData }
    }
}

/// Encodes an answer.
#[derive(Debug)]
pub struct PlainEncoder<E>(PhantomData<fn() -> E>);

impl<E: Message> Encoder for PlainEncoder<E> {
    type Item = E;
    type Error = Status;

    fn encode(&mut self, item: E, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst).map_err(|_| Status::internal("answer could not be encoded"))
    }
}

/// Decodes a request after its [`Precheck`].
pub struct CheckedDecoder<D> {
    check: Precheck,
    malformed: &'static str,
    types: PhantomData<fn() -> D>,
}

impl<D: Message + Default> Decoder for CheckedDecoder<D> {
    type Item = D;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        let len = src.remaining();
        let decoded = if src.chunk().len() == len {
            // One contiguous message: checked and decoded in place, then consumed.
            let d = checked_decode(src.chunk(), self.check, self.malformed);
            src.advance(len);
            d
        } else {
            checked_decode(&src.copy_to_bytes(len), self.check, self.malformed)
        };
        decoded.map(Some)
    }
}

/// Checks and decodes one request: the [`Precheck`]'s status, or `INVALID_ARGUMENT` with `malformed` for bytes
/// that do not decode.
pub fn checked_decode<D: Message + Default>(
    wire: &[u8],
    check: Precheck,
    malformed: &'static str,
) -> Result<D, Status> {
    check(wire)?;
    D::decode(wire).map_err(|_| Status::invalid_argument(malformed))
}

/// What a client is told about bytes that are not a `ReportHealthRequest`.
pub const MALFORMED_REPORT: &str = "message: not a valid startline.v1.ReportHealthRequest";
/// What a client is told about bytes that are not a `SubscribeRequest`.
pub const MALFORMED_SUBSCRIBE: &str = "message: not a valid startline.v1.SubscribeRequest";

/// Readings per `ReportHealthRequest` at most.
pub const MAX_REPORTS: usize = 1000;
/// GPUs per reading at most.
pub const MAX_GPUS: usize = 64;
/// XID errors per GPU and reading at most.
pub const MAX_XIDS: usize = 64;
/// Values per `SubscribeRequest` filter list at most (as `stream::Filter::of` checks them after decoding).
pub const MAX_FILTER_VALUES: usize = 64;

/// Walks the top-level fields of an encoded message: `f(tag, wire type, bytes)` for each, with a length-delimited
/// field's contents (empty for other wire types). `Err(())`: the bytes are not a message.
fn walk<'a>(mut buf: &'a [u8], mut f: impl FnMut(u32, WireType, &'a [u8]) -> Result<(), Status>) -> Result<(), Walk> {
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(|_| Walk::Malformed)?;
        if wire_type == WireType::LengthDelimited {
            let len = decode_varint(&mut buf).map_err(|_| Walk::Malformed)?;
            let len = usize::try_from(len).ok().filter(|&l| l <= buf.len()).ok_or(Walk::Malformed)?;
            let (field, rest) = buf.split_at(len);
            buf = rest;
            f(tag, wire_type, field).map_err(Walk::Refused)?;
        } else {
            skip_field(wire_type, tag, &mut buf, DecodeContext::default()).map_err(|_| Walk::Malformed)?;
            f(tag, wire_type, &[]).map_err(Walk::Refused)?;
        }
    }
    Ok(())
}

/// Why [`walk`] stopped.
enum Walk {
    /// The bytes are not a message.
    Malformed,
    /// The callback refused a field.
    Refused(Status),
}

impl Walk {
    fn status(self, malformed: &'static str) -> Status {
        match self {
            Walk::Malformed => Status::invalid_argument(malformed),
            Walk::Refused(s) => s,
        }
    }
}

/// Entries of a repeated scalar field in one occurrence on the wire: the varints of a packed run, or one.
fn scalar_entries(wire_type: WireType, bytes: &[u8]) -> Result<usize, Status> {
    match wire_type {
        WireType::LengthDelimited => {
            // Every varint ends with a byte under 0x80; a run must end with one.
            if bytes.last().is_some_and(|b| b & 0x80 != 0) {
                return Err(Status::invalid_argument("packed field cut short"));
            }
            Ok(bytes.iter().filter(|b| **b & 0x80 == 0).count())
        }
        _ => Ok(1),
    }
}

fn over(field: String, max: usize, what: &str) -> Status {
    Status::invalid_argument(format!("{field}: more than {max} {what}, at most {max} allowed"))
}

/// The [`Precheck`] of `NodeHealthService.Report`: at most [`MAX_REPORTS`] readings, [`MAX_GPUS`] GPUs per reading
/// and [`MAX_XIDS`] XID errors per GPU, counted on the wire (field numbers of `lifecycle.proto`).
pub fn check_report(wire: &[u8]) -> Result<(), Status> {
    const REPORTS: u32 = 1;
    const GPUS: u32 = 4;
    const XID_ERRORS: u32 = 5;
    let mut readings = 0usize;
    walk(wire, |tag, wt, reading| {
        if tag != REPORTS {
            return Ok(());
        }
        let i = readings;
        readings += 1;
        if readings > MAX_REPORTS {
            return Err(over("reports".into(), MAX_REPORTS, "readings per request"));
        }
        if wt != WireType::LengthDelimited {
            return Err(Status::invalid_argument(MALFORMED_REPORT));
        }
        let mut gpus = 0usize;
        walk(reading, |tag, wt, gpu| {
            if tag != GPUS {
                return Ok(());
            }
            let j = gpus;
            gpus += 1;
            if gpus > MAX_GPUS {
                return Err(over(format!("reports[{i}].gpus"), MAX_GPUS, "GPUs per reading"));
            }
            if wt != WireType::LengthDelimited {
                return Err(Status::invalid_argument(MALFORMED_REPORT));
            }
            let mut xids = 0usize;
            walk(gpu, |tag, wt, bytes| {
                if tag == XID_ERRORS {
                    xids += scalar_entries(wt, bytes).map_err(|_| Status::invalid_argument(MALFORMED_REPORT))?;
                    if xids > MAX_XIDS {
                        return Err(over(format!("reports[{i}].gpus[{j}].xid_errors"), MAX_XIDS, "XID errors"));
                    }
                }
                Ok(())
            })
            .map_err(|w| w.status(MALFORMED_REPORT))
        })
        .map_err(|w| w.status(MALFORMED_REPORT))
    })
    .map_err(|w| w.status(MALFORMED_REPORT))
}

/// The [`Precheck`] of `StreamService.Subscribe`: at most [`MAX_FILTER_VALUES`] values in each filter list
/// (`pools`, `priorities`, `teams`, `kinds`), counted on the wire.
pub fn check_subscribe(wire: &[u8]) -> Result<(), Status> {
    const LISTS: [(u32, &str); 4] = [(3, "pools"), (4, "priorities"), (5, "teams"), (7, "kinds")];
    let mut counts = [0usize; 4];
    walk(wire, |tag, wt, bytes| {
        let Some(k) = LISTS.iter().position(|(t, _)| *t == tag) else { return Ok(()) };
        // `priorities` is an enum list (packed varints or one per key); the others are strings.
        let n = if tag == 4 {
            scalar_entries(wt, bytes).map_err(|_| Status::invalid_argument(MALFORMED_SUBSCRIBE))?
        } else {
            1
        };
        counts[k] += n;
        if counts[k] > MAX_FILTER_VALUES {
            return Err(over(LISTS[k].1.into(), MAX_FILTER_VALUES, "values"));
        }
        Ok(())
    })
    .map_err(|w| w.status(MALFORMED_SUBSCRIBE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use startline_proto::pb::lifecycle_event::Kind;

    fn request(n: usize) -> pb::PublishRequest {
        let ev = pb::LifecycleEvent {
            event_id: "e".into(),
            job_id: "j".into(),
            attempt: Some(2),
            source: "s".into(),
            occurred_at: Some(prost_types::Timestamp { seconds: 1_700_000_000, nanos: 5 }),
            kind: Some(Kind::NodeAssigned(pb::NodeAssigned { nodes: vec!["n1".into()], gpu_ids: vec!["0".into()] })),
        };
        pb::PublishRequest { batch_seq: 7, events: vec![ev; n] }
    }

    #[test]
    fn counts_events_of_real_requests() {
        for n in [0, 1, 2, 100] {
            assert_eq!(count_events(&request(n).encode_to_vec(), 100).expect("within cap"), n);
        }
    }

    #[test]
    fn refuses_over_the_cap_without_looking_inside_the_events() {
        // The events are not even valid events: counting never decodes them, so the cap is what is reported.
        let mut wire = Vec::new();
        for _ in 0..11 {
            wire.extend_from_slice(&[0x12, 3, 0xff, 0xff, 0xff]);
        }
        let err = count_events(&wire, 10).expect_err("over the cap");
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().starts_with("events:") && err.message().contains("grpc.max_batch_events"));
        assert_eq!(count_events(&wire, 11).expect("at the cap"), 11);
    }

    #[test]
    fn stops_counting_at_the_cap_on_a_huge_message() {
        // Four million empty events in 8 MiB; the walk stops after the cap.
        let wire = [0x12u8, 0x00].repeat(4 << 20);
        let err = count_events(&wire, 10_000).expect_err("over the cap");
        assert!(err.message().contains("10000"), "{}", err.message());
    }

    #[test]
    fn malformed_bytes_are_invalid_argument_without_decoder_detail() {
        for wire in [&[0xffu8; 12][..], &[0x12, 0x05, 0x0a], &[0x0a], &[0x0b]] {
            let err = count_events(wire, 10).expect_err("malformed");
            assert_eq!(err.code(), Code::InvalidArgument, "{wire:?}");
            assert_eq!(err.message(), MALFORMED);
        }
    }

    fn reading(gpus: usize, xids: usize) -> pb::NodeHealth {
        let gpu = pb::GpuHealth { uuid: "GPU-1".into(), xid_errors: vec![79; xids], ..Default::default() };
        pb::NodeHealth { node: "gpu-1".into(), source: "s".into(), gpus: vec![gpu; gpus], ..Default::default() }
    }

    #[test]
    fn health_reports_are_checked_against_every_cap_before_decoding() {
        let req = |n, gpus, xids| pb::ReportHealthRequest { reports: vec![reading(gpus, xids); n] }.encode_to_vec();
        let ok: pb::ReportHealthRequest =
            checked_decode(&req(MAX_REPORTS, MAX_GPUS, MAX_XIDS), check_report, MALFORMED_REPORT).expect("at caps");
        assert_eq!(ok.reports.len(), MAX_REPORTS);
        for (wire, starts) in [
            (req(MAX_REPORTS + 1, 0, 0), "reports: more than 1000 readings"),
            (req(2, MAX_GPUS + 1, 0), "reports[0].gpus: more than 64 GPUs"),
            (req(1, 3, MAX_XIDS + 1), "reports[0].gpus[0].xid_errors: more than 64"),
        ] {
            let e = check_report(&wire).expect_err("over a cap");
            assert_eq!(e.code(), Code::InvalidArgument);
            assert!(e.message().starts_with(starts), "{}", e.message());
        }
        // Unpacked XID errors (one key each) count the same.
        let mut gpu = Vec::new();
        for _ in 0..=MAX_XIDS {
            gpu.extend_from_slice(&[0x28, 79]);
        }
        let mut inner = vec![0x22];
        prost::encoding::encode_varint(gpu.len() as u64, &mut inner);
        inner.extend(gpu);
        let mut wire = vec![0x0a];
        prost::encoding::encode_varint(inner.len() as u64, &mut wire);
        wire.extend(inner);
        assert!(check_report(&wire).expect_err("over").message().contains("xid_errors"));
        // Two million empty readings stop at the cap; garbage is the fixed message.
        assert!(check_report(&[0x0a, 0x00].repeat(2_000_000)).is_err());
        for wire in [&[0xffu8; 12][..], &[0x0a, 0x05, 0x0a], &[0x0a], &[0x08, 0x01], &[0x0a, 0x02, 0x20, 0x01]] {
            let e = checked_decode::<pb::ReportHealthRequest>(wire, check_report, MALFORMED_REPORT).expect_err("bad");
            assert_eq!((e.code(), e.message()), (Code::InvalidArgument, MALFORMED_REPORT), "{wire:?}");
        }
    }

    #[test]
    fn subscriptions_are_checked_per_filter_list_before_decoding() {
        let at_cap = pb::SubscribeRequest {
            pools: vec!["p".into(); MAX_FILTER_VALUES],
            priorities: vec![1; MAX_FILTER_VALUES],
            teams: vec!["t".into(); MAX_FILTER_VALUES],
            kinds: vec!["event".into(); MAX_FILTER_VALUES],
            ..Default::default()
        };
        assert!(check_subscribe(&at_cap.encode_to_vec()).is_ok());
        let over_by_one = |f: fn(&mut pb::SubscribeRequest)| {
            let mut r = at_cap.clone();
            f(&mut r);
            check_subscribe(&r.encode_to_vec()).expect_err("over").message().to_string()
        };
        assert!(over_by_one(|r| r.pools.push("p".into())).starts_with("pools: more than 64 values"));
        assert!(over_by_one(|r| r.priorities.push(2)).starts_with("priorities: more than 64 values"));
        assert!(over_by_one(|r| r.teams.push("t".into())).starts_with("teams: more than 64 values"));
        assert!(over_by_one(|r| r.kinds.push("alert".into())).starts_with("kinds: more than 64 values"));
        for wire in [&[0xffu8; 12][..], &[0x1a, 0x05, 0x0a], &[0x22, 0x01, 0x80]] {
            let e =
                checked_decode::<pb::SubscribeRequest>(wire, check_subscribe, MALFORMED_SUBSCRIBE).expect_err("bad");
            assert_eq!((e.code(), e.message()), (Code::InvalidArgument, MALFORMED_SUBSCRIBE), "{wire:?}");
        }
    }

    #[test]
    fn tonic_errors_map_to_documented_codes() {
        let big = inbound_error(Status::out_of_range("Error, decoded message length too large"), 4096);
        assert_eq!(big.code(), Code::ResourceExhausted);
        assert!(big.message().contains("grpc.max_message_bytes (4096 bytes)"), "{}", big.message());
        let frame = inbound_error(Status::internal("protocol error: received message with invalid compression"), 1);
        assert_eq!(frame.code(), Code::InvalidArgument);
        assert!(!frame.message().contains("compression"));
        assert_eq!(inbound_error(malformed(), 1).message(), MALFORMED);
    }
}
