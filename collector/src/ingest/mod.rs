//! The ingest edge: the gRPC service ([`service`]) validates batches and hands them to the applier
//! ([`crate::applier`]) over one bounded channel; the applier writes group commits to sled, flushes, updates the
//! job index, and only then answers each batch's ack. GPU health readings of node agents take their own small
//! path ([`node_health`]): validated, stored and flushed, then kept in the node health book.
//!
//! [`http`] is the same edge for JSON over HTTP (`POST /api/v1/events`), on the HTTP API's listener.
//!
//! In front of the edge: [`conn`] caps and times out connections and closes them all at the end of the
//! shutdown drain and runs TLS handshakes; [`guard`] proves each request's identity and scope; [`codec`] refuses a
//! batch over the event cap (and a health report or a subscription over its caps) before decoding it;
//! [`subscribe`] serves the stream out's `Subscribe` with that codec.

pub mod codec;
pub mod conn;
pub mod guard;
pub mod http;
pub mod node_health;
pub mod service;
pub mod subscribe;

/// What a full ingest queue does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// Wait for room; backpressure reaches the client through flow control.
    Wait,
    /// Answer `RESOURCE_EXHAUSTED` at once.
    Reject,
}
