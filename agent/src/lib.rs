//! The Startline agent: everything that sends lifecycle events to the collector.
//!
//! # Layout
//! - [`access`]: who may post to the node agent: Host/Origin, content type, local token, job allow-list,
//!   client identity (socket peer credentials) and quotas, the socket's mode and group.
//! - [`auth`]: bearer tokens (a [`auth::Secret`] prints `<redacted>`), token files, constant-time comparison.
//! - [`uplink`]: the gRPC publisher shared by every mode: pipelined batches, ordered acks, reconnect with
//!   jittered backoff and redelivery of unacknowledged batches; and the spool's delivery to each collector.
//! - [`simulate`]: a seeded fleet of managed and dedicated pools that publishes through the uplink.
//! - [`spool`]: the durable on-disk spool (a private, 0700 directory) every agent mode writes to.
//! - [`emit`]: the client of the node agent's endpoint (`startline-agent emit`): TCP (reqwest) or the unix
//!   socket, with the optional local token.
//! - [`metrics`]: the agent's own metrics (spool, uplink, adapter polls, the node agent's requests), served as
//!   the Prometheus text exposition at `/metrics`.
//! - [`node`]: the node agent's local HTTP endpoint (JSON events from training loops and scripts), the
//!   specified content ids that make a retried post a duplicate, `emit`'s event body, and job identity from
//!   the environment.
//! - [`provider`]: provider adapters (Slurm, SageMaker, Vertex AI, Azure ML, Kubernetes/Kueue), each a pure
//!   `parse + diff -> events` core and a polling or watching shell.
//! - [`rng`]: the seeded random generator the simulator and backoff use.
//! - [`runner`]: the one runner of every mode: spool, metrics server, delivery, the mode's tasks, and shutdown
//!   on one cancellation token.
//! - [`tail`]: `startline-agent tail`, which follows the collector's stream out and prints each record.
//! - [`eta`]: `startline-agent eta`, which asks the collector's API when a waiting job is expected to start and
//!   tells it in one line.
//! - [`gameday`]: `startline-agent gameday`, failure rehearsals against a collector.
//! - [`gpu`]: GPU health from `nvidia-smi`, reported by the node agent.
//! - [`jobid`]: job ids made in more than one place (a Kubernetes job's, by the node agent and the Kueue adapter).

pub mod access;
pub mod auth;
pub mod emit;
pub mod eta;
pub mod gameday;
pub mod gpu;
pub mod jobid;
pub mod metrics;
pub mod node;
pub mod provider;
pub mod rng;
pub mod runner;
pub mod simulate;
pub mod spool;
pub mod tail;
pub mod uplink;
