//! The Startline agent: everything that sends lifecycle events to the collector.
//!
//! # Layout
//! - [`uplink`]: the gRPC publisher shared by every mode: pipelined batches, ordered acks, reconnect with
//!   jittered backoff and redelivery of unacknowledged batches.
//! - [`simulate`]: a seeded fleet of managed and dedicated pools that publishes through the uplink.
//! - [`spool`]: the durable on-disk spool (a private, 0700 directory) every agent mode writes to, and its
//!   delivery task.
//! - [`node`]: the node agent's local HTTP endpoint (JSON events from training loops and scripts), the
//!   specified content ids that make a retried post a duplicate, `emit`'s event body, and job identity from
//!   the environment.
//! - [`provider`]: provider adapters (Slurm), each a pure `parse + diff -> events` core and a polling shell.
//! - [`rng`]: the seeded random generator the simulator and backoff use.

pub mod node;
pub mod provider;
pub mod rng;
pub mod simulate;
pub mod spool;
pub mod uplink;
