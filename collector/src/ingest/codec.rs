//! The wire codec of `startline.v1.IngestService`, with the batch cap enforced before a message is decoded.
//!
//! tonic refuses a message whose length prefix is over `grpc.max_message_bytes` before buffering it. Within that
//! size a message can still hold millions of tiny events (an empty event is two bytes on the wire and hundreds
//! in memory), so [`RequestDecoder`] first walks the message's top-level fields with prost's wire-format helpers,
//! counting `events` entries without decoding them, and refuses the batch as soon as the count passes
//! `grpc.max_batch_events`. Only then is the message decoded. Undecodable bytes are `INVALID_ARGUMENT` with a
//! fixed message: decoder internals never reach the client.

use prost::bytes::Buf;
use prost::encoding::{decode_key, skip_field, DecodeContext};
use prost::Message;
use startline_proto::pb;
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
