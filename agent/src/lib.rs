//! The Startline agent: everything that sends lifecycle events to the collector.
//!
//! # Layout
//! - [`uplink`]: the gRPC publisher shared by every mode: pipelined batches, ordered acks, reconnect with
//!   jittered backoff and redelivery of unacknowledged batches.
//! - [`simulate`]: a seeded fleet of managed and dedicated pools that publishes through the uplink.
//! - [`rng`]: the seeded random generator the simulator and backoff use.

pub mod rng;
pub mod simulate;
pub mod uplink;
