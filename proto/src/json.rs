//! The JSON form of a lifecycle event, shared by the node agent's local endpoint (`POST /v1/events`) and the
//! collector's HTTP ingest route (`POST /api/v1/events`), and the specified **content id** that makes a retried
//! post of the same event a duplicate.
//!
//! JSON: one event object or `{"events": [...]}`. Fields: `kind` (submitted, queued, node_assigned, preparing,
//! first_step, checkpoint, preempted, requeued, restarted, node_lost, done), `job_id`, optional `event_id`
//! (default: derived from the event's content, see below), optional `occurred_at` (RFC 3339 with its offset,
//! `Z` or `+hh:mm`/`-hh:mm`, read by [`crate::rfc3339`]; or Unix seconds; default: stamped on arrival),
//! `attempt`, and the kind's fields (`step`, `origin`, `uri`, `save_seconds`, `phase`, `reason`, `raw_reason`, `message`,
//! `nodes`, `gpu_ids`, `checkpoint_saved`, `resume_step`, `node`, `outcome`, `exit_code`, and for `submitted`:
//! `pool_kind`, `provider`, `pool`, `priority`, `gpu_class`, `gpu_count`, `node_count`, `region`, `team`,
//! `project`, `chain_id`, `chain_stage`, `labels`). A `first_step`'s `origin` (`training_process`,
//! `container_start`, `scheduler_start`) defaults to `training_process`: what posts JSON is the training process
//! or a script beside it; a container entry point reporting its own start says `container_start`. A refused
//! field is named relative to the event ([`FieldErr`]); receivers prefix it with `events[i].`.
//!
//! # Event ids: a retried post is a duplicate
//! An event without `event_id` gets a **content id** ([`content_id`]): FNV-1a 64 (a hash fixed by its
//! specification, [`crate::hash`]) over a canonical encoding of the event, so the same post, retried
//! (after a timeout, a lost answer, a restarted script), gets the same id and the collector stores it once,
//! whatever the order of the JSON object's keys. The **arrival stamp is not part of the id**: an event posted
//! without `occurred_at` is stamped when it arrives, but its id covers only what the client sent. So two events
//! whose content is identical are one event, unless the client makes them differ: a client that reports the
//! same content more than once on purpose (the same `checkpoint` step saved twice, a second `preempted` with
//! the same reason) must send `occurred_at` (which is then part of the id) or its own `event_id`.
//!
//! The canonical encoding (version 1) is the concatenation of these fields, each written as its length in
//! bytes (u64, little-endian) followed by its bytes:
//! 1. `startline.content-id.v1`;
//! 2. `job_id`, `source` (after the receiver's default is applied), `attempt` (decimal; empty when absent);
//! 3. `occurred_at` as Unix milliseconds in decimal when the client sent it, empty when it was stamped on arrival;
//! 4. the kind's name (`checkpoint`, ...), then the kind's fields in `.proto` field order: strings as UTF-8,
//!    integers and enums (by their protocol number) in decimal, booleans as `true`/`false`, `save_seconds` as
//!    the 16 lowercase hex digits of its IEEE 754 bits (`-0` as `0`), an absent `exit_code` as empty; a
//!    repeated field (`nodes`, `gpu_ids`) as its count in decimal, then each item; `labels` as its count, then
//!    each key and value, ordered by the keys' bytes. A `first_step`'s `origin` is written (after `step`) only
//!    when it is not `training_process`, the default, so first steps keep the ids agents gave them
//!    before the field existed.
//!
//! The id is `c-` and the hash's 16 lowercase hex digits.

use crate::labels::Label;
use crate::pb::{self, lifecycle_event::Kind};
use crate::time::ms_to_timestamp;
use serde_json::Value;
use std::collections::HashMap;

/// A refused field: its name (relative to the event) and the reason.
pub type FieldErr = (String, String);

fn ferr(field: &str, reason: &str) -> FieldErr {
    (field.to_string(), reason.to_string())
}

fn s(v: &Value, k: &str) -> Result<String, FieldErr> {
    match v.get(k) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(x)) => Ok(x.clone()),
        Some(_) => Err(ferr(k, "must be a string")),
    }
}

fn u(v: &Value, k: &str) -> Result<u64, FieldErr> {
    match v.get(k) {
        None | Some(Value::Null) => Ok(0),
        Some(x) => x.as_u64().ok_or_else(|| ferr(k, "must be a non-negative integer")),
    }
}

fn list(v: &Value, k: &str) -> Result<Vec<String>, FieldErr> {
    match v.get(k) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => {
            a.iter().map(|x| x.as_str().map(str::to_string).ok_or_else(|| ferr(k, "must be strings"))).collect()
        }
        Some(_) => Err(ferr(k, "must be an array of strings")),
    }
}

fn named<T: Label + Into<i32>>(v: &Value, k: &str) -> Result<i32, FieldErr> {
    let name = s(v, k)?;
    if name.is_empty() {
        return Ok(0);
    }
    T::from_label(&name).map(Into::into).ok_or_else(|| {
        let all: Vec<&str> = T::all().iter().skip(1).map(|x| x.label()).collect();
        (k.to_string(), format!("{name:?} is not one of {}", all.join(", ")))
    })
}

/// Parses `occurred_at`: RFC 3339 text with an offset ([`crate::rfc3339::parse_ms`]: a time without one is
/// refused, not guessed to be UTC) or Unix seconds (may be fractional); `None` when the client sent none.
fn time(v: &Value) -> Result<Option<i64>, FieldErr> {
    match v.get("occurred_at") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            n.as_f64().map(|s| Some((s * 1000.0) as i64)).ok_or_else(|| ferr("occurred_at", "is not a number"))
        }
        Some(Value::String(t)) => crate::rfc3339::parse_ms(t).map(Some).ok_or_else(|| {
            ferr("occurred_at", "must be RFC 3339 with an offset, e.g. 2026-01-02T03:04:05Z or +02:00, or Unix seconds")
        }),
        Some(_) => Err(ferr("occurred_at", "must be RFC 3339 text or Unix seconds")),
    }
}

/// Builds a protocol event from the endpoint's JSON. `now_ms` stamps an event without `occurred_at`; an event
/// without `event_id` gets its [`content_id`] (which leaves that stamp out).
pub fn event_from_json(v: &Value, default_source: &str, now_ms: i64) -> Result<pb::LifecycleEvent, FieldErr> {
    if !v.is_object() {
        return Err(ferr("", "each event must be a JSON object"));
    }
    let kind_name = s(v, "kind")?;
    let kind = match kind_name.as_str() {
        "submitted" => Kind::Submitted(pb::Submitted {
            pool_kind: named::<pb::PoolKind>(v, "pool_kind")?,
            provider: s(v, "provider")?,
            pool: s(v, "pool")?,
            priority: named::<pb::PriorityClass>(v, "priority")?,
            gpu_class: s(v, "gpu_class")?,
            gpu_count: u(v, "gpu_count")?.min(u64::from(u32::MAX)) as u32,
            node_count: u(v, "node_count")?.min(u64::from(u32::MAX)) as u32,
            region: s(v, "region")?,
            team: s(v, "team")?,
            project: s(v, "project")?,
            chain_id: s(v, "chain_id")?,
            chain_stage: s(v, "chain_stage")?,
            labels: match v.get("labels") {
                None | Some(Value::Null) => HashMap::new(),
                Some(Value::Object(m)) => m
                    .iter()
                    .map(|(k, x)| {
                        x.as_str()
                            .map(|x| (k.clone(), x.to_string()))
                            .ok_or_else(|| ferr("labels", "values must be strings"))
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err(ferr("labels", "must be an object of strings")),
            },
        }),
        "queued" => Kind::Queued(pb::Queued {
            reason: named::<pb::WaitReason>(v, "reason")?,
            raw_reason: s(v, "raw_reason")?,
            message: s(v, "message")?,
            estimated_start: None,
            queue_position: None,
        }),
        "node_assigned" => {
            Kind::NodeAssigned(pb::NodeAssigned { nodes: list(v, "nodes")?, gpu_ids: list(v, "gpu_ids")? })
        }
        "preparing" => Kind::Preparing(pb::Preparing {
            phase: named::<pb::PreparingPhase>(v, "phase")?,
            message: s(v, "message")?,
        }),
        "first_step" => Kind::FirstStep(pb::FirstStep {
            step: u(v, "step")?,
            // What posts here is the training process (or a script beside it) unless it says otherwise.
            origin: match named::<pb::StepOrigin>(v, "origin")? {
                0 => pb::StepOrigin::TrainingProcess as i32,
                o => o,
            },
        }),
        "checkpoint" => Kind::Checkpoint(pb::Checkpoint {
            step: u(v, "step")?,
            uri: s(v, "uri")?,
            save_seconds: match v.get("save_seconds") {
                None | Some(Value::Null) => 0.0,
                Some(x) => x.as_f64().ok_or_else(|| ferr("save_seconds", "must be a number"))?,
            },
        }),
        "preempted" => Kind::Preempted(pb::Preempted {
            reason: s(v, "reason")?,
            checkpoint_saved: match v.get("checkpoint_saved") {
                None | Some(Value::Null) => false,
                Some(x) => x.as_bool().ok_or_else(|| ferr("checkpoint_saved", "must be true or false"))?,
            },
        }),
        "requeued" => Kind::Requeued(pb::Requeued { resume_step: u(v, "resume_step")? }),
        "restarted" => Kind::Restarted(pb::Restarted { resume_step: u(v, "resume_step")? }),
        "node_lost" => Kind::NodeLost(pb::NodeLost { node: s(v, "node")?, message: s(v, "message")? }),
        "done" => Kind::Done(pb::Done {
            outcome: named::<pb::Outcome>(v, "outcome")?,
            exit_code: match v.get("exit_code") {
                None | Some(Value::Null) => None,
                Some(x) => Some(
                    x.as_i64()
                        .and_then(|c| i32::try_from(c).ok())
                        .ok_or_else(|| ferr("exit_code", "must be a 32-bit integer"))?,
                ),
            },
            message: s(v, "message")?,
        }),
        "" => return Err(ferr("kind", "is required")),
        other => return Err(ferr("kind", &format!("{other:?} is not a lifecycle event kind"))),
    };
    let client_at = time(v)?;
    let source = match s(v, "source")? {
        x if x.is_empty() => default_source.to_string(),
        x => x,
    };
    let attempt = match v.get("attempt") {
        None | Some(Value::Null) => None,
        Some(x) => Some(
            x.as_u64()
                .and_then(|a| u32::try_from(a).ok())
                .ok_or_else(|| ferr("attempt", "must be a positive integer"))?,
        ),
    };
    let job_id = s(v, "job_id")?;
    let mut ev = pb::LifecycleEvent {
        event_id: s(v, "event_id")?,
        job_id,
        attempt,
        source,
        occurred_at: Some(ms_to_timestamp(client_at.unwrap_or(now_ms))),
        kind: Some(kind),
    };
    if ev.event_id.is_empty() {
        let stamp = if client_at.is_some() { Stamp::FromClient } else { Stamp::OnArrival };
        ev.event_id = content_id(&ev, stamp);
    }
    Ok(ev)
}

/// Who set an event's `occurred_at`, which decides whether it is part of the [`content_id`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stamp {
    /// The client sent it: part of the content, so part of the id.
    FromClient,
    /// The agent stamped it on arrival: left out of the id, so a retry (stamped later) has the same id.
    OnArrival,
}

/// The canonical encoding of an event's content (version 1, specified in the [module docs](self)): every
/// field in a fixed order, length-prefixed, maps sorted by key. `event_id` is not part of it.
pub fn canonical_content(ev: &pb::LifecycleEvent, stamp: Stamp) -> Vec<u8> {
    let mut c = Canon(Vec::with_capacity(256));
    c.text("startline.content-id.v1");
    c.text(&ev.job_id);
    c.text(&ev.source);
    c.opt(ev.attempt);
    match (stamp, &ev.occurred_at) {
        (Stamp::FromClient, Some(t)) => c.num(crate::time::timestamp_to_ms(t)),
        _ => c.text(""),
    }
    match &ev.kind {
        None => c.text(""),
        Some(Kind::Submitted(x)) => {
            c.text("submitted");
            c.num(x.pool_kind);
            c.text(&x.provider);
            c.text(&x.pool);
            c.num(x.priority);
            c.text(&x.gpu_class);
            c.num(x.gpu_count);
            c.num(x.node_count);
            c.text(&x.region);
            c.text(&x.team);
            c.text(&x.project);
            c.text(&x.chain_id);
            c.text(&x.chain_stage);
            let mut labels: Vec<(&String, &String)> = x.labels.iter().collect();
            labels.sort_unstable();
            c.num(labels.len());
            for (k, v) in labels {
                c.text(k);
                c.text(v);
            }
        }
        Some(Kind::Queued(x)) => {
            c.text("queued");
            c.num(x.reason);
            c.text(&x.raw_reason);
            c.text(&x.message);
        }
        Some(Kind::NodeAssigned(x)) => {
            c.text("node_assigned");
            for list in [&x.nodes, &x.gpu_ids] {
                c.num(list.len());
                for item in list {
                    c.text(item);
                }
            }
        }
        Some(Kind::Preparing(x)) => {
            c.text("preparing");
            c.num(x.phase);
            c.text(&x.message);
        }
        Some(Kind::FirstStep(x)) => {
            c.text("first_step");
            c.num(x.step);
            // Only when not the endpoint's default: first steps keep the ids they had before the field existed.
            if x.origin != pb::StepOrigin::TrainingProcess as i32 {
                c.num(x.origin);
            }
        }
        Some(Kind::Checkpoint(x)) => {
            c.text("checkpoint");
            c.num(x.step);
            c.text(&x.uri);
            let secs = if x.save_seconds == 0.0 { 0.0f64 } else { x.save_seconds };
            c.text(&format!("{:016x}", secs.to_bits()));
        }
        Some(Kind::Preempted(x)) => {
            c.text("preempted");
            c.text(&x.reason);
            c.text(if x.checkpoint_saved { "true" } else { "false" });
        }
        Some(Kind::Requeued(x)) => {
            c.text("requeued");
            c.num(x.resume_step);
        }
        Some(Kind::Restarted(x)) => {
            c.text("restarted");
            c.num(x.resume_step);
        }
        Some(Kind::NodeLost(x)) => {
            c.text("node_lost");
            c.text(&x.node);
            c.text(&x.message);
        }
        Some(Kind::Done(x)) => {
            c.text("done");
            c.num(x.outcome);
            c.opt(x.exit_code);
            c.text(&x.message);
        }
    }
    c.0
}

/// Builder of the canonical encoding: length-prefixed fields.
struct Canon(Vec<u8>);

impl Canon {
    fn text(&mut self, t: &str) {
        self.0.extend_from_slice(&(t.len() as u64).to_le_bytes());
        self.0.extend_from_slice(t.as_bytes());
    }

    fn num(&mut self, n: impl std::fmt::Display) {
        self.text(&n.to_string());
    }

    fn opt(&mut self, n: Option<impl std::fmt::Display>) {
        match n {
            Some(n) => self.num(n),
            None => self.text(""),
        }
    }
}

/// The event's content id: `c-` and the FNV-1a 64 of its [`canonical_content`] in 16 lowercase hex digits. A
/// retried post of the same event gets the same id, so the collector stores it once.
pub fn content_id(ev: &pb::LifecycleEvent, stamp: Stamp) -> String {
    format!("c-{:016x}", crate::hash::fnv1a64(&canonical_content(ev, stamp)))
}
