//! The Startline collector: durable gRPC ingest of job lifecycle events on sled, per-job timelines, and the HTTP
//! API over them.
//!
//! # Layout
//! - [`config`]: the TOML file and CLI flags, validated into [`config::Config`] before any port is bound.
//! - [`job`]: the pure domain: compact events, job records and the timeline state machine.
//! - [`store`]: sled key layout, codecs, durable append, checkpoints and restore.
//! - [`state`]: the in-memory job index shared by the committer and readers.
//! - [`ingest`]: the gRPC edge (validation, policy when full) and the committer thread (group commit, acks).
//! - [`api`]: the axum router: JSON API, health and readiness.
//! - [`app`]: wiring and the shutdown order.

pub mod api;
pub mod app;
pub mod config;
pub mod ingest;
pub mod job;
pub mod state;
pub mod store;
