//! The Startline collector: durable gRPC ingest of job lifecycle events on sled, per-job timelines, and the HTTP
//! API over them.
//!
//! # Layout
//! - [`config`]: the TOML file and CLI flags, validated into [`config::Config`] before any port is bound; each
//!   section checked by its own `validate(&mut errors)` with the helpers of [`settings`].
//! - [`job`]: the pure domain: compact events, job records and the timeline state machine.
//! - [`store`]: sled key layout, codecs, durable append, checkpoints and restore.
//! - [`state`]: the in-memory job index shared by the committer and readers.
//! - [`ingest`]: the gRPC edge (validation, policy when full) and the committer thread (group commit, acks).
//! - [`slo`]: start objectives: selectors, rolling windows of counts and HDR histograms, the deadline index.
//! - [`alert`]: per-job pages and burn-rate alerts, their stored state, Alertmanager and webhook notifiers.
//! - [`export`]: metrics: one OpenTelemetry MeterProvider, Prometheus `/metrics` and OTLP push.
//! - [`compare`]: side-by-side comparison of two job sets (managed vs dedicated) with significance tests.
//! - [`health`]: whether storage writes fail (and why) and whether the committer lives, for health checks.
//! - [`time`]: the clock (wall time advanced by tokio's clock, pausable in tests) and the text form of times.
//! - [`api`]: the axum router: JSON API, health and readiness.
//! - [`app`]: wiring and the shutdown order.

pub mod alert;
pub mod api;
pub mod app;
pub mod compare;
pub mod config;
pub mod export;
pub mod health;
pub mod ingest;
pub mod job;
pub mod settings;
pub mod slo;
pub mod state;
pub mod store;
pub mod time;

/// Temporary alias of [`time`]'s clock for `app.rs` and `ingest/committer.rs`, which still name `crate::clock`;
/// remove with the storage rewrite.
pub mod clock {
    pub use crate::time::Clock;
}
