//! The Startline lifecycle protocol, `startline.v1`.
//!
//! # Layout
//! - [`pb`]: the prost types and tonic client/server stubs generated from `proto/startline/v1/lifecycle.proto`,
//!   and [`FILE_DESCRIPTOR_SET`] for gRPC reflection.
//! - [`labels`]: the closed enums as short lowercase names (`managed`, `urgent`, `capacity`), used in the JSON API,
//!   the config and as bounded metric labels.
//! - [`validate`]: the rules an event must satisfy before the collector stores it, shared with agents so a
//!   source can check its own events before spooling them.
//! - [`hash`]: FNV-1a 64, a hash fixed by its specification, for anything persisted or compared across processes.
//! - [`time`]: conversions between protobuf timestamps and Unix milliseconds.
//! - [`rfc3339`]: the one RFC 3339 parser (offsets honoured, fractions truncated to the millisecond) and
//!   formatter (UTC, milliseconds) every agent mode and the JSON form use.
//! - [`json`]: the JSON form of an event (the node agent's endpoint and the collector's HTTP ingest route) and
//!   its specified content id.

pub mod hash;
pub mod json;
pub mod labels;
pub mod rfc3339;
pub mod time;
pub mod validate;

/// Generated protobuf types and gRPC stubs for package `startline.v1`.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("startline.v1");
}

/// The encoded `FileDescriptorSet` of `startline.v1`, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/startline_v1_descriptor.bin"));

pub use validate::{FieldError, Limits};
