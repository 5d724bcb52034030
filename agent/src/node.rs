//! The node agent's local endpoint: a training loop, a Slurm prolog/epilog or a container entry point posts
//! lifecycle events as JSON to `http://127.0.0.1:7465/v1/events`; they are validated and appended to the
//! durable spool before the answer (202), and delivered to the collector by the spool's delivery task.
//!
//! JSON: one event object or `{"events": [...]}`. Fields: `kind` (submitted, queued, node_assigned, preparing,
//! first_step, checkpoint, preempted, requeued, restarted, node_lost, done), `job_id`, optional `event_id`
//! (default: a hash of the event's content, so a retried post is a duplicate, not a new event), optional
//! `occurred_at` (RFC 3339 or Unix seconds; default now), `attempt`, `source`, and the kind's fields
//! (`step`, `uri`, `save_seconds`, `phase`, `reason`, `raw_reason`, `message`, `nodes`, `gpu_ids`,
//! `checkpoint_saved`, `resume_step`, `node`, `outcome`, `exit_code`, and for `submitted`: `pool_kind`,
//! `provider`, `pool`, `priority`, `gpu_class`, `gpu_count`, `node_count`, `region`, `team`, `project`,
//! `chain_id`, `chain_stage`, `labels`). Errors are 4xx JSON naming the field; a full spool answers 503.

use crate::spool::{Spool, SpoolError};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use startline_proto::labels::Label;
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_proto::time::ms_to_timestamp;
use std::collections::HashMap;

/// Wall time advanced by the monotonic clock, anchored when the agent starts: events posted without
/// `occurred_at` get stamps that a wall-clock step cannot reorder.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicWall {
    wall0_ms: i64,
    mono0: std::time::Instant,
}

impl MonotonicWall {
    /// Anchors now.
    pub fn start() -> Self {
        MonotonicWall { wall0_ms: startline_proto::time::now_ms(), mono0: std::time::Instant::now() }
    }

    /// Now, Unix milliseconds.
    pub fn now_ms(&self) -> i64 {
        self.wall0_ms + self.mono0.elapsed().as_millis() as i64
    }
}

/// What the endpoint needs.
#[derive(Clone)]
pub struct NodeState {
    /// Stamps for events posted without `occurred_at`.
    pub clock: MonotonicWall,
    /// The spool.
    pub spool: Spool,
    /// Source name for events that do not set one, e.g. `node-agent/gpu-017`.
    pub source: String,
    /// Validation limits.
    pub limits: startline_proto::Limits,
}

/// The endpoint's router.
pub fn router(state: NodeState) -> Router {
    Router::new()
        .route("/v1/events", post(post_events))
        .route("/v1/spool", get(spool_status))
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .with_state(state)
}

fn bad(field: &str, reason: impl Into<String>) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({"error": format!("{field}: {}", reason.into()), "field": field})))
        .into_response()
}

async fn spool_status(State(s): State<NodeState>) -> Json<Value> {
    Json(json!({"events": s.spool.len(), "refused_full": s.spool.refused()}))
}

async fn post_events(State(s): State<NodeState>, body: axum::body::Bytes) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return bad("body", format!("is not JSON: {e}")),
    };
    let items: Vec<Value> = match v.get("events") {
        Some(Value::Array(a)) => a.clone(),
        Some(_) => return bad("events", "must be an array"),
        None => vec![v],
    };
    let now = s.clock.now_ms();
    let mut events = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        match event_from_json(item, &s.source, now) {
            Ok(ev) => match startline_proto::validate::validate_event(&ev, now, &s.limits) {
                Ok(()) => events.push(ev),
                Err(e) => return bad(&format!("events[{i}].{}", e.field), e.reason),
            },
            Err((field, reason)) => return bad(&format!("events[{i}].{field}"), reason),
        }
    }
    let spool = s.spool.clone();
    let n = events.len();
    match tokio::task::spawn_blocking(move || spool.append(&events)).await {
        Ok(Ok(())) => (StatusCode::ACCEPTED, Json(json!({"spooled": n}))).into_response(),
        Ok(Err(e @ SpoolError::Full { .. })) => {
            (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"error": e.to_string()}))).into_response()
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "spool append failed");
            (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"error": "spool storage failure"}))).into_response()
        }
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"error": "spool task failed"}))).into_response(),
    }
}

type FieldErr = (String, String);

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

/// Parses `occurred_at`: RFC 3339 text or Unix seconds (may be fractional).
fn time(v: &Value, now_ms: i64) -> Result<i64, FieldErr> {
    match v.get("occurred_at") {
        None | Some(Value::Null) => Ok(now_ms),
        Some(Value::Number(n)) => {
            n.as_f64().map(|s| (s * 1000.0) as i64).ok_or_else(|| ferr("occurred_at", "is not a number"))
        }
        Some(Value::String(t)) => humantime::parse_rfc3339_weak(t)
            .ok()
            .and_then(|st| st.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as i64)
            .ok_or_else(|| ferr("occurred_at", "must be RFC 3339, e.g. 2026-01-02T03:04:05Z, or Unix seconds")),
        Some(_) => Err(ferr("occurred_at", "must be RFC 3339 text or Unix seconds")),
    }
}

/// Builds a protocol event from the endpoint's JSON.
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
        }),
        "node_assigned" => {
            Kind::NodeAssigned(pb::NodeAssigned { nodes: list(v, "nodes")?, gpu_ids: list(v, "gpu_ids")? })
        }
        "preparing" => Kind::Preparing(pb::Preparing {
            phase: named::<pb::PreparingPhase>(v, "phase")?,
            message: s(v, "message")?,
        }),
        "first_step" => Kind::FirstStep(pb::FirstStep { step: u(v, "step")? }),
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
            checkpoint_saved: v.get("checkpoint_saved").and_then(Value::as_bool).unwrap_or(false),
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
    let at = time(v, now_ms)?;
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
        occurred_at: Some(ms_to_timestamp(at)),
        kind: Some(kind),
    };
    if ev.event_id.is_empty() {
        ev.event_id = content_id(&ev);
    }
    Ok(ev)
}

/// A deterministic id from the event's content: a retried post of the same event is a duplicate.
pub fn content_id(ev: &pb::LifecycleEvent) -> String {
    use prost::Message;
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut copy = ev.clone();
    copy.event_id.clear();
    copy.encode_to_vec().hash(&mut h);
    format!("c-{:016x}", h.finish())
}

/// The job id from the environment: `STARTLINE_JOB_ID`, then Slurm (`slurm/<cluster>/<job>`, array tasks as
/// `<array job>_<task>`), then Kubernetes (`kubernetes/<namespace>/<pod>` from the downward API).
pub fn job_from_env(env: &HashMap<String, String>) -> Option<String> {
    if let Some(j) = env.get("STARTLINE_JOB_ID").filter(|j| !j.is_empty()) {
        return Some(j.clone());
    }
    if let Some(id) = env.get("SLURM_JOB_ID").filter(|j| !j.is_empty()) {
        let cluster = env.get("SLURM_CLUSTER_NAME").map_or("default", String::as_str);
        let job = match (env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")) {
            (Some(a), Some(t)) if !a.is_empty() && !t.is_empty() => format!("{a}_{t}"),
            _ => id.clone(),
        };
        return Some(format!("slurm/{cluster}/{job}"));
    }
    match (env.get("POD_NAMESPACE"), env.get("POD_NAME")) {
        (Some(ns), Some(pod)) if !ns.is_empty() && !pod.is_empty() => Some(format!("kubernetes/{ns}/{pod}")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_identity_from_slurm_and_kubernetes_env() {
        let env = |pairs: &[(&str, &str)]| {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>()
        };
        assert_eq!(
            job_from_env(&env(&[("SLURM_JOB_ID", "42"), ("SLURM_CLUSTER_NAME", "c1")])).as_deref(),
            Some("slurm/c1/42")
        );
        assert_eq!(
            job_from_env(&env(&[("SLURM_JOB_ID", "43"), ("SLURM_ARRAY_JOB_ID", "40"), ("SLURM_ARRAY_TASK_ID", "3")]))
                .as_deref(),
            Some("slurm/default/40_3")
        );
        assert_eq!(
            job_from_env(&env(&[("POD_NAMESPACE", "ml"), ("POD_NAME", "train-0")])).as_deref(),
            Some("kubernetes/ml/train-0")
        );
        assert_eq!(job_from_env(&env(&[("STARTLINE_JOB_ID", "x/1"), ("SLURM_JOB_ID", "1")])).as_deref(), Some("x/1"));
        assert_eq!(job_from_env(&env(&[])), None);
    }

    #[test]
    fn json_events_become_protocol_events_with_named_errors() {
        let now = 1_767_225_600_000;
        let ev = event_from_json(
            &json!({"kind": "checkpoint", "job_id": "j", "step": 500, "save_seconds": 12.5, "occurred_at": 1767225500}),
            "node-agent/x",
            now,
        )
        .expect("valid");
        assert_eq!(ev.source, "node-agent/x");
        assert!(matches!(ev.kind, Some(Kind::Checkpoint(ref c)) if c.step == 500));
        assert_eq!(startline_proto::time::timestamp_to_ms(ev.occurred_at.as_ref().expect("t")), 1_767_225_500_000);
        let again = event_from_json(
            &json!({"kind": "checkpoint", "job_id": "j", "step": 500, "save_seconds": 12.5, "occurred_at": 1767225500}),
            "node-agent/x",
            now,
        )
        .expect("valid");
        assert_eq!(ev.event_id, again.event_id, "same content, same id");
        for (body, field) in [
            (json!({"job_id": "j"}), "kind"),
            (json!({"kind": "warp", "job_id": "j"}), "kind"),
            (json!({"kind": "preparing", "job_id": "j", "phase": "compiling"}), "phase"),
            (json!({"kind": "first_step", "job_id": "j", "step": -1}), "step"),
            (json!({"kind": "first_step", "job_id": "j", "occurred_at": "yesterday"}), "occurred_at"),
            (json!({"kind": "done", "job_id": "j", "outcome": "succeeded", "exit_code": "zero"}), "exit_code"),
        ] {
            assert_eq!(event_from_json(&body, "s", now).expect_err("invalid").0, field, "{body}");
        }
    }
}
