//! The node agent's local endpoint: a training loop, a Slurm prolog/epilog or a container entry point posts
//! lifecycle events as JSON to `http://127.0.0.1:7465/v1/events`; they are validated and appended to the
//! durable spool before the answer (202), and delivered to the collector by the spool's delivery task.
//!
//! JSON: one event object or `{"events": [...]}`, each in the form [`startline_proto::json`] specifies (it
//! parses them, [`event_from_json`]); the agent stamps its own `source`. Errors are 4xx JSON naming the field; a
//! full spool answers 503.
//!
//! `GET /metrics` serves the agent's own metrics ([`crate::metrics`]) behind the same Host and Origin checks;
//! `GET /v1/spool` the spool's depth as JSON; `GET /healthz` is unchecked.
//!
//! # Hardening
//! The same router serves the loopback TCP port and the unix socket ([`crate::access`] has the rules). In
//! order, a request is refused with: 403 when its `Host` or `Origin` is foreign (every route but `/healthz`);
//! for a POST, 401 without the local token (when one is configured), 415 unless the body is
//! `application/json`, 400 naming `events[i].source` when the client sets `source` (the agent stamps its own,
//! [`NodeState::source`], on every event: a client cannot claim to be an adapter), 403 naming
//! `events[i].job_id` ("not permitted") for a job outside the allow-list when one is configured, and 429 with
//! `Retry-After` when the client (socket peer uid, or `tcp`) holds its quota of the spool. A request is all
//! or nothing: one refused event refuses the request.
//!
//! # Event ids: a retried post is a duplicate
//! An event without `event_id` gets its **content id** ([`startline_proto::json::content_id`], specified in
//! [`startline_proto::json`]): the same post, retried, gets the same id and the collector stores it once.

use crate::access::{self, Access};
use crate::metrics::{Metrics, Refusal};
use crate::spool::{Spool, SpoolError};
use axum::extract::{Request, State};
use axum::http::{header, Extensions, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use startline_proto::json::event_from_json;
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
    /// Source name stamped on every event, e.g. `node-agent/gpu-017`.
    pub source: String,
    /// Validation limits.
    pub limits: startline_proto::Limits,
    /// Who may post, and how much.
    pub access: std::sync::Arc<Access>,
    /// The agent's metrics (served at `/metrics`; requests and refusals are counted here).
    pub metrics: Metrics,
}

/// The endpoint's router.
pub fn router(state: NodeState) -> Router {
    Router::new()
        .route("/v1/events", post(post_events))
        .route("/v1/spool", get(spool_status))
        .route("/metrics", get(metrics))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), same_host_only))
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .layer(axum::middleware::from_fn_with_state(state.metrics.clone(), crate::metrics::count_requests))
        .with_state(state)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": message.into()}))).into_response()
}

fn bad(field: &str, reason: impl Into<String>) -> Response {
    field_error(StatusCode::BAD_REQUEST, field, reason)
}

fn field_error(status: StatusCode, field: &str, reason: impl Into<String>) -> Response {
    (status, Json(json!({"error": format!("{field}: {}", reason.into()), "field": field}))).into_response()
}

/// Refuses a foreign `Host` (DNS rebinding) or `Origin` (a browser's cross-site request) with 403.
async fn same_host_only(State(s): State<NodeState>, req: Request, next: Next) -> Response {
    let listen = &s.access.listen_hosts;
    let host = match req.headers().get(header::HOST) {
        Some(h) => match h.to_str() {
            Ok(h) => Some(h.to_string()),
            Err(_) => {
                s.metrics.refused(Refusal::Host);
                return error(StatusCode::FORBIDDEN, "Host header is not text");
            }
        },
        None => req.uri().authority().map(|a| a.to_string()),
    };
    if let Some(h) = &host {
        if !access::host_allowed(h, listen) {
            tracing::debug!("refused a request for a foreign Host");
            s.metrics.refused(Refusal::Host);
            return error(StatusCode::FORBIDDEN, "Host is not this agent's address (localhost or the listen address)");
        }
    }
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        if !origin.to_str().is_ok_and(|o| access::origin_allowed(o, host.as_deref(), listen)) {
            tracing::debug!("refused a cross-origin request");
            s.metrics.refused(Refusal::Origin);
            return error(StatusCode::FORBIDDEN, "cross-origin requests are refused");
        }
    }
    next.run(req).await
}

/// The local token and content type checks of a POST, before its body is parsed: the refusal, if any.
fn check_post(s: &NodeState, headers: &HeaderMap) -> Option<Response> {
    if let Some(local) = &s.access.local_token {
        let expected = local.current();
        let presented = headers.get(header::AUTHORIZATION).and_then(|v| crate::auth::bearer(v.as_bytes()));
        if !presented.zip(expected.as_ref()).is_some_and(|(p, e)| crate::auth::secret_eq(p, e)) {
            let mut r = error(StatusCode::UNAUTHORIZED, "missing or wrong local token (Authorization: Bearer)");
            r.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
            s.metrics.refused(Refusal::LocalToken);
            return Some(r);
        }
    }
    let json = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(access::json_content_type);
    if !json {
        s.metrics.refused(Refusal::ContentType);
        return Some(error(StatusCode::UNSUPPORTED_MEDIA_TYPE, "Content-Type must be application/json"));
    }
    None
}

async fn metrics(State(s): State<NodeState>) -> Response {
    crate::metrics::serve(State(s.metrics.clone())).await
}

async fn spool_status(State(s): State<NodeState>) -> Json<Value> {
    Json(json!({"events": s.spool.len(), "refused_full": s.spool.refused()}))
}

async fn post_events(
    State(s): State<NodeState>,
    extensions: Extensions,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Some(refused) = check_post(&s, &headers) {
        return refused;
    }
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
        if item.get("source").is_some_and(|x| !x.is_null()) {
            return bad(
                &format!("events[{i}].source"),
                format!("is stamped by the node agent ({}); leave it out", s.source),
            );
        }
        if let (Some(jobs), Some(job)) = (&s.access.jobs, item.get("job_id").and_then(Value::as_str)) {
            if !jobs.permits(job) {
                s.metrics.refused(Refusal::JobNotPermitted);
                return field_error(
                    StatusCode::FORBIDDEN,
                    &format!("events[{i}].job_id"),
                    format!("job {job:?} is not permitted on this node"),
                );
            }
        }
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
    let client = access::client_id(&extensions);
    let quota = s.access.client_quota;
    match tokio::task::spawn_blocking(move || spool.append_for(&events, Some((&client, quota)))).await {
        Ok(Ok(())) => (StatusCode::ACCEPTED, Json(json!({"spooled": n}))).into_response(),
        Ok(Err(e @ SpoolError::Quota { .. })) => {
            s.metrics.refused(Refusal::Quota);
            s.metrics.quota_refused(n as u64);
            let mut r = error(StatusCode::TOO_MANY_REQUESTS, e.to_string());
            r.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("5"));
            r
        }
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

/// Why `emit` could not build its event.
#[derive(Debug, thiserror::Error)]
pub enum EmitError {
    /// A `--field` without `=`.
    #[error("--field {0:?} is not key=value")]
    NotKeyValue(String),
    /// A `--field` that has its own option.
    #[error("--field {field}: use {option} instead")]
    HasOption {
        /// The field.
        field: String,
        /// The option to use.
        option: &'static str,
    },
    /// The event is not valid.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field, as the node agent names it.
        field: String,
        /// Why.
        reason: String,
    },
}

/// The JSON value of an `emit --field key=value`, typed as the endpoint expects the field: integers for
/// `step`, `resume_step`, `gpu_count`, `node_count`, `attempt`, `exit_code`; numbers for `save_seconds` and a
/// numeric `occurred_at` (Unix seconds); booleans for `checkpoint_saved`; comma-separated lists for `nodes` and
/// `gpu_ids`; strings for everything else (`nodes=1001`, `pool=42`, `reason=true` stay strings). An empty value
/// of a typed field is sent as absent. A value that does not fit its type is sent as text, and the event is
/// rejected naming the field.
pub fn emit_value(key: &str, value: &str) -> Value {
    let typed = |parsed: Option<Value>| {
        if value.is_empty() {
            Value::Null
        } else {
            parsed.unwrap_or_else(|| Value::from(value))
        }
    };
    match key {
        "step" | "resume_step" | "gpu_count" | "node_count" | "attempt" => {
            typed(value.parse::<u64>().ok().map(Value::from))
        }
        "exit_code" => typed(value.parse::<i64>().ok().map(Value::from)),
        "save_seconds" | "occurred_at" => {
            typed(value.parse::<f64>().ok().and_then(serde_json::Number::from_f64).map(Value::Number))
        }
        "checkpoint_saved" => typed(match value {
            "true" => Some(Value::Bool(true)),
            "false" => Some(Value::Bool(false)),
            _ => None,
        }),
        "nodes" | "gpu_ids" => {
            Value::from(value.split(',').filter(|x| !x.is_empty()).map(str::to_string).collect::<Vec<_>>())
        }
        _ => Value::from(value),
    }
}

/// The body `emit` posts, built once per invocation so every retry sends the same bytes: `kind`, `job_id`, the
/// `--field`s (typed by [`emit_value`]; `labels.<key>=<value>` adds a label), `occurred_at` stamped now
/// (`now_ms`, RFC 3339 with milliseconds) unless given, and `event_id`: `event_id` if given (`--event-id`),
/// else the [`startline_proto::json::content_id`] of the stamped event. The event is checked as the node agent
/// would parse it.
pub fn emit_body(
    kind: &str,
    job: &str,
    fields: &[String],
    event_id: Option<&str>,
    now_ms: i64,
) -> Result<Value, EmitError> {
    let mut body = serde_json::Map::new();
    body.insert("kind".into(), Value::from(kind));
    body.insert("job_id".into(), Value::from(job));
    let mut labels = serde_json::Map::new();
    for f in fields {
        let (k, v) = f.split_once('=').ok_or_else(|| EmitError::NotKeyValue(f.clone()))?;
        let option = match k {
            "kind" => Some("the kind argument"),
            "job_id" => Some("--job"),
            "event_id" => Some("--event-id"),
            _ => None,
        };
        if let Some(option) = option {
            return Err(EmitError::HasOption { field: k.to_string(), option });
        }
        match k.strip_prefix("labels.") {
            Some(label) => {
                labels.insert(label.to_string(), Value::from(v));
            }
            None => {
                body.insert(k.to_string(), emit_value(k, v));
            }
        }
    }
    if !labels.is_empty() {
        body.insert("labels".into(), Value::Object(labels));
    }
    if body.get("occurred_at").is_none_or(Value::is_null) {
        body.insert("occurred_at".into(), Value::from(startline_proto::rfc3339::format_ms(now_ms.max(0))));
    }
    if let Some(id) = event_id {
        body.insert("event_id".into(), Value::from(id));
    }
    let body = Value::Object(body);
    let ev = event_from_json(&body, "", now_ms).map_err(|(field, reason)| EmitError::Invalid { field, reason })?;
    let mut body = body;
    if event_id.is_none() {
        if let Value::Object(m) = &mut body {
            m.insert("event_id".into(), Value::from(ev.event_id));
        }
    }
    Ok(body)
}

/// The node this agent runs on, as the scheduler names it (in `node_assigned`, health reports and the default
/// source `node-agent/<node>`): `explicit` (`--node-name`/`STARTLINE_NODE_NAME`), else `NODE_NAME` (a Kubernetes
/// DaemonSet sets it from the downward API's `spec.nodeName`: inside a pod, /etc/hostname holds the pod's name,
/// not the node's), else the contents of /etc/hostname (`hostname_file`), else `node`.
pub fn node_name(explicit: Option<&str>, env: &HashMap<String, String>, hostname_file: Option<&str>) -> String {
    [explicit, env.get("NODE_NAME").map(String::as_str), hostname_file]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|n| !n.is_empty())
        .unwrap_or("node")
        .to_string()
}

/// The job id from the environment: `STARTLINE_JOB_ID`, then Slurm (`slurm/<cluster>/<job>`, array tasks as
/// `<array job>_<task>`), then a Kubernetes job's pod (`k8s/<cluster>/<namespace>/<job>`, [`kubernetes_job`]),
/// then any other pod (`kubernetes/<namespace>/<pod>` from the downward API).
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
    if let Some(job) = kubernetes_job(env) {
        return Some(job);
    }
    match (env.get("POD_NAMESPACE"), env.get("POD_NAME")) {
        (Some(ns), Some(pod)) if !ns.is_empty() && !pod.is_empty() => Some(format!("kubernetes/{ns}/{pod}")),
        _ => None,
    }
}

/// Environment variables naming a pod's job, set from the pod's labels through the downward API, most specific
/// first (the same order as the Kueue adapter's [`crate::provider::kueue::JOB_LABELS`]).
pub const K8S_JOB_ENV: [&str; 3] =
    ["STARTLINE_K8S_JOBSET_NAME", "STARTLINE_K8S_KUBEFLOW_JOB_NAME", "STARTLINE_K8S_JOB_NAME"];

/// The job id of a Kubernetes job's pod, the same id the Kueue adapter gives the job:
/// `k8s/<STARTLINE_CLUSTER>/<STARTLINE_K8S_NAMESPACE or POD_NAMESPACE>/<job name>`, the job name from the first
/// non-empty of [`K8S_JOB_ENV`] (a label the pod lacks gives an empty variable). Every pod of a multi-pod job
/// (JobSet, PyTorchJob, indexed Job) and every restarted pod gets the same id.
pub fn kubernetes_job(env: &HashMap<String, String>) -> Option<String> {
    let get = |k: &str| env.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    let namespace = get("STARTLINE_K8S_NAMESPACE").or_else(|| get("POD_NAMESPACE"))?;
    let job = K8S_JOB_ENV.iter().find_map(|k| get(k))?;
    let cluster = get("STARTLINE_CLUSTER").unwrap_or("default");
    Some(crate::jobid::kubernetes(cluster, namespace, job))
}

#[cfg(test)]
mod tests {
    use super::*;
    use startline_proto::pb::{self, lifecycle_event::Kind};

    /// In a DaemonSet's pod /etc/hostname holds the pod's name (`startline-node-agent-x7k2p`), which no scheduler
    /// names in `node_assigned`: the node's name comes from `NODE_NAME` (the downward API's `spec.nodeName`).
    #[test]
    fn the_node_is_named_from_node_name_before_the_hostname_file() {
        let env = |pairs: &[(&str, &str)]| {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>()
        };
        let pod_hostname = Some("startline-node-agent-x7k2p\n");
        let in_pod = env(&[("NODE_NAME", "gke-gpu-pool-3f2a-node-7")]);
        assert_eq!(node_name(None, &in_pod, pod_hostname), "gke-gpu-pool-3f2a-node-7");
        assert_eq!(node_name(Some("a-gpu-01"), &in_pod, pod_hostname), "a-gpu-01", "--node-name wins");
        assert_eq!(node_name(None, &env(&[]), Some("a-gpu-01\n")), "a-gpu-01", "on a host: /etc/hostname");
        assert_eq!(node_name(None, &env(&[("NODE_NAME", "")]), Some("a-gpu-01")), "a-gpu-01", "an empty NODE_NAME");
        assert_eq!(node_name(None, &env(&[]), None), "node");
    }

    #[test]
    fn every_pod_of_a_kubernetes_job_gets_the_job_id_the_kueue_adapter_gives_it() {
        let env = |pairs: &[(&str, &str)]| {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>()
        };
        // A JobSet's worker: its child Job's label is there too, the JobSet wins.
        let worker = env(&[
            ("STARTLINE_CLUSTER", "gke-eu"),
            ("STARTLINE_K8S_NAMESPACE", "ml"),
            ("STARTLINE_K8S_JOBSET_NAME", "llama-sft"),
            ("STARTLINE_K8S_JOB_NAME", "llama-sft-workers-0"),
            ("STARTLINE_K8S_KUBEFLOW_JOB_NAME", ""),
            ("POD_NAMESPACE", "ml"),
            ("POD_NAME", "llama-sft-workers-0-1-x7k2p"),
        ]);
        assert_eq!(job_from_env(&worker).as_deref(), Some("k8s/gke-eu/ml/llama-sft"));
        let labels: std::collections::BTreeMap<String, String> = [
            ("jobset.sigs.k8s.io/jobset-name".to_string(), "llama-sft".to_string()),
            ("batch.kubernetes.io/job-name".to_string(), "llama-sft-workers-0".to_string()),
        ]
        .into();
        let m = crate::provider::kueue::Mapping { cluster: "gke-eu".into(), ..Default::default() };
        let adapter =
            crate::provider::kueue::pod_job_name(&labels).map(|j| crate::provider::kueue::startline_id(&m, "ml", &j));
        assert_eq!(adapter, job_from_env(&worker), "the adapter and the node agent agree");
        // A plain Job's pod, with empty variables for the labels it lacks.
        let pod = env(&[
            ("STARTLINE_K8S_JOBSET_NAME", ""),
            ("STARTLINE_K8S_KUBEFLOW_JOB_NAME", ""),
            ("STARTLINE_K8S_JOB_NAME", "train"),
            ("POD_NAMESPACE", "ml"),
            ("POD_NAME", "train-abcde"),
        ]);
        assert_eq!(job_from_env(&pod).as_deref(), Some("k8s/default/ml/train"));
        let pytorch =
            env(&[("STARTLINE_K8S_KUBEFLOW_JOB_NAME", "bert"), ("POD_NAMESPACE", "ml"), ("POD_NAME", "bert-worker-3")]);
        assert_eq!(job_from_env(&pytorch).as_deref(), Some("k8s/default/ml/bert"));
    }

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

    #[test]
    fn occurred_at_text_keeps_its_offset_and_needs_one() {
        let at = |t: &str| {
            event_from_json(&json!({"kind": "first_step", "job_id": "j", "step": 1, "occurred_at": t}), "s", 0)
                .map(|ev| startline_proto::time::timestamp_to_ms(ev.occurred_at.as_ref().expect("t")))
        };
        // 2026-01-01T10:00:00Z (`date -u -d 2026-01-01T10:00:00Z +%s%3N`).
        assert_eq!(at("2026-01-01T12:00:00+02:00").ok(), Some(1_767_261_600_000), "+02:00 is 10:00 UTC");
        assert_eq!(at("2026-01-01T05:00:00.250-05:00").ok(), Some(1_767_261_600_250), "-05:00 is 10:00 UTC");
        // A local time without its zone is refused rather than read as UTC (Python's naive isoformat()).
        assert_eq!(at("2026-01-01T12:00:00").expect_err("no offset").0, "occurred_at");
    }

    /// One JSON body of every kind the endpoint accepts, none with `occurred_at`.
    fn every_kind(job: &str) -> Vec<Value> {
        vec![
            json!({"kind": "submitted", "job_id": job, "pool_kind": "dedicated", "provider": "slurm", "pool": "gpu",
                   "priority": "urgent", "gpu_count": 8, "node_count": 1,
                   "labels": {"team": "vision", "stage": "pretrain", "owner": "ana", "cost_center": "42"}}),
            json!({"kind": "queued", "job_id": job, "reason": "capacity", "raw_reason": "Resources"}),
            json!({"kind": "node_assigned", "job_id": job, "nodes": ["gpu-1", "gpu-2"], "gpu_ids": ["0", "1"]}),
            json!({"kind": "preparing", "job_id": job, "phase": "image_pull", "message": "pulling"}),
            json!({"kind": "first_step", "job_id": job, "step": 1}),
            json!({"kind": "checkpoint", "job_id": job, "step": 100, "uri": "s3://c/100", "save_seconds": 2.5}),
            json!({"kind": "preempted", "job_id": job, "reason": "spot", "checkpoint_saved": true}),
            json!({"kind": "requeued", "job_id": job, "resume_step": 100, "attempt": 2}),
            json!({"kind": "restarted", "job_id": job, "resume_step": 100, "attempt": 2}),
            json!({"kind": "node_lost", "job_id": job, "node": "gpu-2", "message": "xid 79"}),
            json!({"kind": "done", "job_id": job, "outcome": "succeeded", "exit_code": 0}),
        ]
    }

    #[test]
    fn a_retry_without_occurred_at_has_the_same_id_though_it_is_stamped_later() {
        let now = 1_767_225_600_000;
        for body in every_kind("slurm/c1/7") {
            let first = event_from_json(&body, "node-agent/a", now).expect("valid");
            let retry = event_from_json(&body, "node-agent/a", now + 1_234).expect("valid");
            assert_eq!(first.event_id, retry.event_id, "{body}");
            assert_ne!(first.occurred_at, retry.occurred_at, "each arrival is stamped");
            assert!(startline_proto::validate::validate_event(&first, now, &Default::default()).is_ok(), "{body}");
        }
        // With occurred_at, the client's time is part of the content: the same kind at another time is another
        // event, and a retry at the same time is the same one.
        let at = |t: i64| json!({"kind": "checkpoint", "job_id": "j", "step": 5, "occurred_at": t});
        let id = |b: &Value, now: i64| event_from_json(b, "s", now).expect("valid").event_id;
        assert_eq!(id(&at(1_767_225_500), now), id(&at(1_767_225_500), now + 99));
        assert_ne!(id(&at(1_767_225_500), now), id(&at(1_767_225_501), now));
        assert_ne!(id(&at(1_767_225_500), now), id(&json!({"kind": "checkpoint", "job_id": "j", "step": 5}), now));
    }

    #[test]
    fn labels_in_any_key_order_give_the_same_id() {
        let orders = [
            r#"{"kind":"submitted","job_id":"j","pool_kind":"managed","provider":"p","pool":"q","priority":"normal","labels":{"a":"1","b":"2","c":"3","d":"4","e":"5","f":"6"}}"#,
            r#"{"labels":{"f":"6","e":"5","d":"4","c":"3","b":"2","a":"1"},"priority":"normal","pool":"q","provider":"p","pool_kind":"managed","job_id":"j","kind":"submitted"}"#,
            r#"{"kind":"submitted","labels":{"c":"3","a":"1","f":"6","b":"2","e":"5","d":"4"},"job_id":"j","pool":"q","provider":"p","pool_kind":"managed","priority":"normal"}"#,
        ];
        let ids: Vec<String> = orders
            .iter()
            .map(|o| {
                let v: Value = serde_json::from_str(o).expect("json");
                event_from_json(&v, "s", 1_767_225_600_000).expect("valid").event_id
            })
            .collect();
        assert_eq!(ids[0], ids[1]);
        assert_eq!(ids[0], ids[2]);
        // Many parses of the same bytes (each a new HashMap with its own iteration order): one id.
        let v: Value = serde_json::from_str(orders[0]).expect("json");
        for _ in 0..200 {
            assert_eq!(event_from_json(&v, "s", 1_767_225_600_000).expect("valid").event_id, ids[0]);
        }
        // A different value is a different event.
        let other: Value = serde_json::from_str(&orders[0].replace(r#""f":"6""#, r#""f":"7""#)).expect("json");
        assert_ne!(event_from_json(&other, "s", 1_767_225_600_000).expect("valid").event_id, ids[0]);
    }

    #[test]
    fn content_ids_are_pinned() {
        // These values are the specification's (module docs) output: a change of encoding or hash breaks
        // deduplication of events spooled by an older agent, and must be a new version, not an accident.
        let now = 1_767_225_600_000;
        let id = |body: Value| event_from_json(&body, "node-agent/gpu-017", now).expect("valid").event_id;
        let got: Vec<String> = every_kind("slurm/c1/7").into_iter().map(id).collect();
        let pinned: [&str; 11] = PINNED;
        assert_eq!(got, pinned, "content ids changed");
        let timed = id(json!({"kind": "first_step", "job_id": "kubernetes/ml/train-0", "step": 1,
                              "occurred_at": "2026-01-01T00:00:00.250Z", "attempt": 1}));
        assert_eq!(timed, PINNED_TIMED);
        // The id is the FNV-1a 64 of the canonical encoding, which is the length-prefixed fields, in order.
        let ev = event_from_json(&json!({"kind": "first_step", "job_id": "j", "step": 7}), "s", now).expect("valid");
        let mut h = startline_proto::hash::Fnv1a64::default();
        for f in ["startline.content-id.v1", "j", "s", "", "", "first_step", "7"] {
            h.write_field(f.as_bytes());
        }
        assert_eq!(ev.event_id, format!("c-{:016x}", h.finish()));
        // A first step's origin defaults to the training process and is then left out of the id (above); any
        // other origin is written after the step, as its protocol number.
        assert_eq!(
            ev.kind,
            Some(Kind::FirstStep(pb::FirstStep { step: 7, origin: pb::StepOrigin::TrainingProcess as i32 }))
        );
        let body = json!({"kind": "first_step", "job_id": "j", "step": 7, "origin": "container_start"});
        let ev = event_from_json(&body, "s", now).expect("valid");
        assert_eq!(ev.kind, Some(Kind::FirstStep(pb::FirstStep { step: 7, origin: 2 })));
        let mut h = startline_proto::hash::Fnv1a64::default();
        for f in ["startline.content-id.v1", "j", "s", "", "", "first_step", "7", "2"] {
            h.write_field(f.as_bytes());
        }
        assert_eq!(ev.event_id, format!("c-{:016x}", h.finish()));
        let bad = json!({"kind": "first_step", "job_id": "j", "step": 7, "origin": "guess"});
        assert_eq!(event_from_json(&bad, "s", now).expect_err("refused").0, "origin");
    }

    // Computed independently from the module docs' specification (a Python script over the same fields).
    const PINNED: [&str; 11] = [
        "c-65f0ece73b07dc03",
        "c-1d04d69edd6c59fd",
        "c-256251b832abe830",
        "c-996457eaa059367c",
        "c-b0f50640f0d8c141",
        "c-f93e3728b5f08dbb",
        "c-20b9e1af88356c91",
        "c-98885a0f33eb74d1",
        "c-8421536f2bf87e64",
        "c-cecc7d593fd3bbd7",
        "c-f4dfd7d4168fe3eb",
    ];
    const PINNED_TIMED: &str = "c-dca4bb3caffe818c";

    #[test]
    fn emit_sends_fields_as_their_schema_types_and_stamps_once() {
        let now = 1_767_225_600_000;
        let fields = |f: &[&str]| f.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let body = emit_body("node_assigned", "slurm/c1/9", &fields(&["nodes=1001", "gpu_ids=0,1"]), None, now)
            .expect("valid");
        assert_eq!(body["nodes"], json!(["1001"]));
        assert_eq!(body["gpu_ids"], json!(["0", "1"]));
        assert_eq!(body["occurred_at"], "2026-01-01T00:00:00.000Z");
        let id = body["event_id"].as_str().expect("id").to_string();
        let ev = event_from_json(&body, "node-agent/x", now + 5_000).expect("the agent accepts it");
        assert_eq!(ev.event_id, id);
        assert_eq!(startline_proto::time::timestamp_to_ms(ev.occurred_at.as_ref().expect("t")), now);

        let body = emit_body(
            "submitted",
            "j",
            &fields(&[
                "pool_kind=dedicated",
                "provider=slurm",
                "pool=42",
                "priority=urgent",
                "gpu_count=8",
                "region=1",
                "labels.team=7",
                "labels.stage=true",
                "gpu_class=3.5",
            ]),
            Some("epilog-1"),
            now,
        )
        .expect("valid");
        assert_eq!(body["pool"], "42");
        assert_eq!(body["region"], "1");
        assert_eq!(body["gpu_class"], "3.5");
        assert_eq!(body["gpu_count"], 8);
        assert_eq!(body["labels"], json!({"team": "7", "stage": "true"}));
        assert_eq!(body["event_id"], "epilog-1");

        let body = emit_body("done", "j", &fields(&["outcome=failed", "exit_code=137", "message=0"]), None, now)
            .expect("valid");
        assert_eq!((body["exit_code"].clone(), body["message"].clone()), (json!(137), json!("0")));
        let body =
            emit_body("preempted", "j", &fields(&["checkpoint_saved=true", "reason=1"]), None, now).expect("valid");
        assert_eq!((body["checkpoint_saved"].clone(), body["reason"].clone()), (json!(true), json!("1")));
        let body = emit_body("checkpoint", "j", &fields(&["step=10", "save_seconds=1.5"]), None, now).expect("ok");
        assert_eq!((body["step"].clone(), body["save_seconds"].clone()), (json!(10), json!(1.5)));

        for (kind, f, field) in
            [("checkpoint", "step=ten", "step"), ("preempted", "checkpoint_saved=yes", "checkpoint_saved")]
        {
            match emit_body(kind, "j", &fields(&[f]), None, now) {
                Err(EmitError::Invalid { field: got, .. }) => assert_eq!(got, field),
                other => panic!("{f}: {other:?}"),
            }
        }
        assert!(matches!(emit_body("done", "j", &fields(&["outcome"]), None, now), Err(EmitError::NotKeyValue(_))));
        assert!(matches!(emit_body("done", "j", &fields(&["job_id=x"]), None, now), Err(EmitError::HasOption { .. })));
    }
}
