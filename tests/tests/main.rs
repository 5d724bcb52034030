//! Startline's end-to-end tests, one module per area, built as one test binary (`e2e`). Each module starts real
//! collectors, agents and the real components it names (Slurm, Prometheus, Alertmanager, Chromium) or a local
//! server replaying a provider's documented payloads, and says which. Run one area with
//! `cargo nextest run -p startline-tests --test e2e -E 'test(/^disk_full::/)'`.

mod agent;
mod agent_metrics;
mod alert_routing;
mod alerts;
mod alerts_tls;
mod azureml;
mod backlog;
mod cardinality;
mod chain_slo;
mod chains;
mod compare;
mod connection_flood;
mod container;
mod corruption;
mod crash_trials;
mod dashboard;
mod dashboard_login;
mod dashboards;
mod disk_full;
mod durability;
mod fold;
mod foreign_client;
mod fuzz_short;
mod gameday;
mod ha;
mod http_hardening;
mod hygiene;
mod ingest;
mod ingest_cap;
mod ingest_hostile;
mod kubernetes;
mod kueue;
mod metrics;
mod nodes;
mod open_jobs;
mod openapi;
mod operating;
mod otlp;
mod otlp_logs;
mod packaging;
mod prediction;
mod reload;
mod retention;
mod revocation;
mod sagemaker;
mod security;
mod slo_export;
mod slurm;
mod slurmrestd;
mod stream;
mod stream_stall;
mod systemd;
mod vertex;
