//! The Startline collector: durable gRPC ingest of job lifecycle events on sled, per-job timelines, and the HTTP
//! API over them.
//!
//! # Layout
//! - [`config`]: the TOML file and CLI flags, validated into [`config::Config`] before any port is bound; each
//!   section checked by its own `validate(&mut errors)` with the helpers of [`settings`].
//! - [`job`]: the pure domain: compact events, job records, the timeline state machine and GPU-time accounting.
//! - [`store`]: sled key layout, codecs, durable append, checkpoints, folds and restore; the history files
//!   (ended jobs as Parquet, [`store::history`]).
//! - [`index`]: the in-memory job index (hot jobs, folded rows, derived SLO and metric state) shared by the
//!   applier (its only writer) and readers.
//! - [`applier`]: the committer thread (group commit, acks) and the maintenance thread (checkpoints, folds,
//!   history seal passes), and retention.
//! - [`ingest`]: the gRPC edge (validation, policy when full), handing batches to the applier.
//! - [`conn_limit`]: connection caps of both listeners (per listener, per client address, one descriptor budget).
//! - [`slo`]: start objectives: selectors, rolling windows of counts and exact times to first step, the deadline index.
//! - [`alert`]: per-job pages and burn-rate alerts, their stored state, Alertmanager and webhook notifiers.
//! - [`feed`]: accepted events and ended jobs, handed by the committer to subscribers (bounded, never blocking).
//! - [`export`]: metrics (one OpenTelemetry MeterProvider, Prometheus `/metrics` and OTLP push) and accepted
//!   events as OTLP logs; sealed history files copied to S3-compatible object storage (`export::history`).
//! - [`compare`]: side-by-side comparison of two job sets (managed vs dedicated) with significance tests.
//! - [`health`]: whether storage writes fail (and why) and whether the committer lives, for health checks.
//! - [`time`]: the clock (wall time advanced by tokio's clock, pausable in tests) and the text form of times.
//! - [`stream`]: the stream out: its records, the live hub subscribers follow, the filters and the alert outbox.
//! - [`api`]: the axum router: JSON API, health and readiness.
//! - [`auth`]: identities, scopes, bearer-token hashes, client-certificate names, rate limits and TLS for both
//!   listeners.
//! - [`app`]: wiring and the shutdown order.

pub mod alert;
pub mod api;
pub mod app;
pub mod applier;
pub mod auth;
pub mod compare;
pub mod config;
pub mod conn_limit;
pub mod export;
pub mod feed;
pub mod health;
pub mod index;
pub mod ingest;
pub mod job;
pub mod settings;
pub mod slo;
pub mod store;
pub mod stream;
pub mod time;
