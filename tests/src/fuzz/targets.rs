//! The non-HTTP targets: protobuf ingest decoding and validation ([`Proto`]), the node agent's JSON endpoint
//! parser ([`Node`]) and the provider adapters' pure cores ([`Slurm`], [`SageMaker`], [`Vertex`]), with their
//! seed corpora built from real payloads: the providers' captured responses under `agent/src/provider/fixtures/`,
//! the adapters' own events on those, `emit`'s bodies, and events of every kind built from the protocol types.
//!
//! Time is fixed ([`NOW`]) so a saved input replays exactly.

use super::mutate::{self, pick};
use super::{Outcome, Target};
use crate::crashtrial::Rng;
use prost::Message;
use serde_json::Value;
use startline_agent::node;
use startline_agent::provider::{sagemaker, slurm, vertex, JobMemory};
use startline_collector::ingest::codec::count_events;
use startline_collector::job::{CompactEvent, JobRecord};
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_proto::time::ms_to_timestamp;
use startline_proto::validate::validate_event;
use startline_proto::Limits;
use std::collections::{BTreeMap, HashMap};

/// The receiver's clock for every target: 2027-12-27 (after every fixture's timestamps).
pub const NOW: i64 = 1_830_000_000_000;

/// The collector's default batch cap (`grpc.max_batch_events`).
pub const MAX_BATCH_EVENTS: usize = 10_000;

const SQUEUE_22: &str = include_str!("../../../agent/src/provider/fixtures/squeue-22.05.json");
const SQUEUE_23: &str = include_str!("../../../agent/src/provider/fixtures/squeue-23.02.json");
const SACCT_22: &str = include_str!("../../../agent/src/provider/fixtures/sacct-22.05.json");
const SAGEMAKER_COMPLETED: &str =
    include_str!("../../../agent/src/provider/fixtures/sagemaker-describe-completed.json");
const SAGEMAKER_FAILED: &str = include_str!("../../../agent/src/provider/fixtures/sagemaker-describe-failed.json");
const VERTEX_SUCCEEDED: &str = include_str!("../../../agent/src/provider/fixtures/vertex-customjob-succeeded.json");
const VERTEX_FAILED: &str = include_str!("../../../agent/src/provider/fixtures/vertex-customjob-failed.json");

/// A validation field as an outcome class: list indexes and label keys dropped (`node_assigned.nodes`).
fn field_class(field: &str) -> String {
    field.split('[').next().unwrap_or(field).to_string()
}

/// Validates adapter or agent output; the first invalid field, if any.
fn first_invalid(events: &[pb::LifecycleEvent]) -> Option<String> {
    events.iter().find_map(|e| validate_event(e, NOW, &Limits::default()).err().map(|e| field_class(&e.field)))
}

fn slurm_mapping() -> slurm::Mapping {
    slurm::Mapping {
        urgent_partitions: vec!["urgent".into(), "gpu-urgent".into()],
        urgent_qos: vec!["high".into()],
        site: "site-a".into(),
        gpu_class: "h100".into(),
        first_step_on_start: true,
        cluster: "fallback".into(),
    }
}

fn sagemaker_mapping() -> sagemaker::Mapping {
    sagemaker::Mapping {
        region: "us-east-1".into(),
        urgent_prefixes: vec!["urgent-".into()],
        namespace: "123456789012".into(),
        gpus: Default::default(),
    }
}

fn vertex_mapping() -> vertex::Mapping {
    vertex::Mapping { project: "ml-prod".into(), urgent_prefixes: vec!["urgent-".into()], gpus: Default::default() }
}

/// Events of every kind, as a dedicated and a managed job report them (built from the protocol types).
pub fn protocol_events(job: &str, base_ms: i64) -> Vec<pb::LifecycleEvent> {
    let kinds = vec![
        Kind::Submitted(pb::Submitted {
            pool_kind: pb::PoolKind::Dedicated as i32,
            provider: "slurm".into(),
            pool: "gpu".into(),
            priority: pb::PriorityClass::Urgent as i32,
            gpu_class: "h100".into(),
            gpu_count: 16,
            node_count: 2,
            region: "site-a".into(),
            team: "research".into(),
            project: "llm".into(),
            chain_id: "chain-7".into(),
            chain_stage: "train".into(),
            labels: HashMap::from([("user".into(), "alice".into()), ("qos".into(), "high".into())]),
        }),
        Kind::Queued(pb::Queued {
            reason: pb::WaitReason::Capacity as i32,
            raw_reason: "Resources".into(),
            message: "waiting for 2 nodes".into(),
            estimated_start: None,
            queue_position: Some(3),
        }),
        Kind::NodeAssigned(pb::NodeAssigned {
            nodes: vec!["gpu-001".into(), "gpu-002".into()],
            gpu_ids: vec!["0".into(), "1".into()],
        }),
        Kind::Preparing(pb::Preparing { phase: pb::PreparingPhase::ImagePull as i32, message: "pulling".into() }),
        Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() }),
        Kind::Checkpoint(pb::Checkpoint { step: 1000, uri: "s3://ckpt/1000".into(), save_seconds: 12.5 }),
        Kind::Preempted(pb::Preempted { reason: "spot-interruption".into(), checkpoint_saved: true }),
        Kind::Requeued(pb::Requeued { resume_step: 1000 }),
        Kind::Restarted(pb::Restarted { resume_step: 1000 }),
        Kind::NodeLost(pb::NodeLost { node: "gpu-002".into(), message: "NODE_FAIL".into() }),
        Kind::Done(pb::Done { outcome: pb::Outcome::Succeeded as i32, exit_code: Some(0), message: "ok".into() }),
    ];
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| pb::LifecycleEvent {
            event_id: format!("{job}:e{i}"),
            job_id: job.into(),
            attempt: if i > 7 { Some(2) } else { Some(1) },
            source: "fuzz-seed".into(),
            occurred_at: Some(ms_to_timestamp(base_ms + i as i64 * 60_000)),
            kind: Some(kind),
        })
        .collect()
}

/// The events the adapters derive from the captured provider payloads (what they really send).
pub fn adapter_events() -> Vec<pb::LifecycleEvent> {
    let mut out = Vec::new();
    let live = slurm::parse_squeue(SQUEUE_23).unwrap_or_default();
    let live22 = slurm::parse_squeue(SQUEUE_22).unwrap_or_default();
    let acct = slurm::parse_sacct(SACCT_22).unwrap_or_default();
    for j in slurm::merge(live, acct).iter().chain(live22.iter()) {
        out.extend(slurm::diff(&slurm_mapping(), j, &JobMemory::default(), NOW).0);
    }
    for s in [SAGEMAKER_COMPLETED, SAGEMAKER_FAILED] {
        if let Some(j) = serde_json::from_str(s).ok().as_ref().and_then(sagemaker::parse_describe) {
            out.extend(sagemaker::diff(&sagemaker_mapping(), &j, &JobMemory::default()).0);
        }
    }
    for s in [VERTEX_SUCCEEDED, VERTEX_FAILED] {
        if let Some(j) = serde_json::from_str(s).ok().as_ref().and_then(vertex::parse_custom_job) {
            out.extend(vertex::diff(&vertex_mapping(), &j, &JobMemory::default(), NOW).0);
        }
    }
    out
}

/// Bodies `emit` posts to the node agent for every kind (built by the real `emit_body`).
pub fn emit_bodies() -> Vec<Value> {
    let cases: &[(&str, &[&str])] = &[
        (
            "submitted",
            &[
                "pool_kind=dedicated",
                "provider=slurm",
                "pool=gpu",
                "priority=urgent",
                "gpu_class=h100",
                "gpu_count=8",
                "node_count=1",
                "labels.user=alice",
                "labels.qos=high",
            ],
        ),
        ("queued", &["reason=capacity", "raw_reason=Resources", "message=waiting"]),
        ("node_assigned", &["nodes=gpu-001,gpu-002", "gpu_ids=0,1,2,3"]),
        ("preparing", &["phase=data_staging", "message=copying shards"]),
        ("first_step", &["step=1"]),
        ("checkpoint", &["step=1000", "uri=s3://ckpt/job/1000", "save_seconds=3.25"]),
        ("preempted", &["reason=spot", "checkpoint_saved=true"]),
        ("requeued", &["resume_step=1000"]),
        ("restarted", &["resume_step=1000"]),
        ("node_lost", &["node=gpu-002", "message=xid 79"]),
        ("done", &["outcome=succeeded", "exit_code=0"]),
    ];
    let mut out = Vec::new();
    for (i, (kind, fields)) in cases.iter().enumerate() {
        let fields: Vec<String> = fields.iter().map(|f| f.to_string()).collect();
        let id = if i % 2 == 0 { None } else { Some("epilog-done-4242-0") };
        if let Ok(b) = node::emit_body(kind, "slurm/cluster-a/4242", &fields, id, NOW - 3_600_000 + i as i64 * 1000) {
            out.push(b);
        }
    }
    out
}

/// One structural mutation of a protocol event: ids, attempt, time and kind fields set to edge values.
fn mutate_event(rng: &mut Rng, ev: &mut pb::LifecycleEvent) {
    let text = |rng: &mut Rng| -> String {
        match rng.range(0, 11) {
            0 => String::new(),
            1 => "a".repeat(*pick(rng, &[64usize, 65, 128, 129, 256, 257, 1024, 1025, 5000])),
            2 => "job\u{0}id".into(),
            3 => "job\u{200b}id".into(),
            4 => "a\u{2028}b".into(),
            5 => "\u{e9}\u{1f600}".into(),
            6 => "x\u{202e}y".into(),
            7 => "line\nbreak".into(),
            8 => pick(rng, &["a/../b", "a//b", "./a", "a/.."]).to_string(),
            9 => pick(rng, &["\u{3164}", "a\u{2800}", "b\u{fe0f}", "c\u{a0}d", "\u{e0100}", "\u{e000}"]).to_string(),
            _ => format!("v{}", rng.next_u64() % 1000),
        }
    };
    let enum_value = |rng: &mut Rng| *pick(rng, &[0, 1, 2, 3, 5, 10, 11, 99, -1, i32::MAX, i32::MIN]);
    let big = |rng: &mut Rng| *pick(rng, &[0u64, 1, u64::from(u32::MAX), u64::MAX, 1_000_000, 1_000_001, 100_001]);
    match rng.range(0, 9) {
        0 => ev.event_id = text(rng),
        1 => ev.job_id = text(rng),
        2 => ev.source = text(rng),
        3 => ev.attempt = *pick(rng, &[None, Some(0), Some(1), Some(u32::MAX)]),
        4 | 5 => {
            let seconds = *pick(
                rng,
                &[i64::MIN, i64::MAX, -1, 0, 946_684_799, 946_684_800, NOW / 1000, NOW / 1000 + 300, NOW / 1000 + 301],
            );
            let nanos = *pick(rng, &[0, -1, 999_999_999, 1_000_000_000, i32::MIN, i32::MAX, 500_000_000]);
            ev.occurred_at = if rng.chance(0.1) { None } else { Some(prost_types::Timestamp { seconds, nanos }) };
        }
        _ => {
            let Some(kind) = ev.kind.as_mut() else {
                ev.kind = Some(Kind::FirstStep(pb::FirstStep { step: big(rng), ..Default::default() }));
                return;
            };
            match kind {
                Kind::Submitted(s) => match rng.range(0, 7) {
                    0 => s.pool_kind = enum_value(rng),
                    1 => s.priority = enum_value(rng),
                    2 => s.gpu_count = big(rng) as u32,
                    3 => s.node_count = big(rng) as u32,
                    4 => {
                        for i in 0..rng.range(1, 20) {
                            let key = if rng.chance(0.7) { format!("k{i}") } else { text(rng) };
                            s.labels.insert(key, text(rng));
                        }
                    }
                    5 => s.provider = text(rng),
                    6 => s.pool = text(rng),
                    _ => s.region = text(rng),
                },
                Kind::Queued(q) => match rng.range(0, 2) {
                    0 => q.reason = enum_value(rng),
                    1 => q.raw_reason = text(rng),
                    _ => q.message = text(rng),
                },
                Kind::NodeAssigned(n) => {
                    let count = *pick(rng, &[0usize, 1, 4096, 4097]);
                    n.nodes = (0..count).map(|i| format!("n{i}")).collect();
                    if rng.chance(0.3) {
                        n.nodes.push(text(rng));
                    }
                }
                Kind::Preparing(p) => p.phase = enum_value(rng),
                Kind::Checkpoint(c) => match rng.range(0, 2) {
                    0 => c.save_seconds = *pick(rng, &[f64::NAN, f64::INFINITY, -0.0, -1.0, f64::MAX, 1e-300]),
                    1 => c.step = big(rng),
                    _ => c.uri = text(rng),
                },
                Kind::Done(d) => match rng.range(0, 2) {
                    0 => d.outcome = enum_value(rng),
                    1 => d.exit_code = *pick(rng, &[None, Some(i32::MIN), Some(-1), Some(255)]),
                    _ => d.message = text(rng),
                },
                Kind::NodeLost(n) => n.node = text(rng),
                Kind::Preempted(p) => p.reason = text(rng),
                Kind::FirstStep(f) => f.step = big(rng),
                Kind::Requeued(r) => r.resume_step = big(rng),
                Kind::Restarted(r) => r.resume_step = big(rng),
            }
        }
    }
}

/// `PublishRequest` and `LifecycleEvent` bytes: the collector's pre-decode event count, prost decoding,
/// validation, the compact form and the job timeline of the valid events.
pub struct Proto {
    limits: Limits,
}

impl Proto {
    /// The target.
    pub fn new() -> Self {
        Proto { limits: Limits::default() }
    }
}

impl Default for Proto {
    fn default() -> Self {
        Self::new()
    }
}

impl Target for Proto {
    fn name(&self) -> &'static str {
        "proto"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        let mut events = protocol_events("slurm/cluster-a/1001", NOW - 7_200_000);
        events.extend(adapter_events());
        for b in emit_bodies() {
            if let Ok(ev) = startline_proto::json::event_from_json(&b, "node-agent/gpu-001", NOW) {
                events.push(ev);
            }
        }
        let mut out: Vec<Vec<u8>> = events.iter().map(|e| e.encode_to_vec()).collect();
        let mut by_job: BTreeMap<&str, Vec<pb::LifecycleEvent>> = BTreeMap::new();
        for e in &events {
            by_job.entry(e.job_id.as_str()).or_default().push(e.clone());
        }
        for (i, evs) in by_job.into_values().enumerate() {
            out.push(pb::PublishRequest { batch_seq: i as u64 + 1, events: evs }.encode_to_vec());
        }
        out.push(pb::PublishRequest { batch_seq: 7, events: Vec::new() }.encode_to_vec());
        out
    }

    fn mutate(&self, rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
        match rng.range(0, 19) {
            0..=11 => {
                let Ok(mut req) = pb::PublishRequest::decode(input.as_slice()) else {
                    return mutate::bytes(rng, input, corpus, &[]);
                };
                match rng.range(0, 5) {
                    0 if !req.events.is_empty() => {
                        let i = rng.range(0, req.events.len() as u64 - 1) as usize;
                        let e = req.events[i].clone();
                        // Bounded by the input size limit (the generator must not be what runs out of memory).
                        let copies = (*pick(rng, &[1usize, 2, 100, 10_000])).min((256 << 10) / e.encoded_len().max(1));
                        req.events.extend(std::iter::repeat_n(e, copies));
                    }
                    1 if !req.events.is_empty() => {
                        let i = rng.range(0, req.events.len() as u64 - 1) as usize;
                        req.events.remove(i);
                    }
                    2 => req.batch_seq = *pick(rng, &[0, 1, u64::MAX]),
                    _ if !req.events.is_empty() => {
                        let i = rng.range(0, req.events.len() as u64 - 1) as usize;
                        mutate_event(rng, &mut req.events[i]);
                    }
                    _ => req.events.extend(protocol_events("j", NOW - 1000)),
                }
                *input = req.encode_to_vec();
            }
            12..=16 => {
                if let Some(b) = mutate::protobuf(rng, input, 0) {
                    *input = b;
                } else {
                    mutate::bytes(rng, input, corpus, &[]);
                }
            }
            _ => mutate::bytes(rng, input, corpus, &[]),
        }
    }

    fn run(&mut self, input: &[u8]) -> Result<Outcome, String> {
        // The single-event path (no property beyond not panicking).
        if let Ok(ev) = pb::LifecycleEvent::decode(input) {
            let _ = validate_event(&ev, NOW, &self.limits);
        }
        let counted = count_events(input, MAX_BATCH_EVENTS);
        let decoded = pb::PublishRequest::decode(input);
        let req = match (counted, decoded) {
            (Err(status), Ok(req)) => {
                if req.events.len() <= MAX_BATCH_EVENTS {
                    return Err(format!(
                        "count_events refused a message prost decodes ({} events): {}",
                        req.events.len(),
                        status.message()
                    ));
                }
                return Ok(Outcome::Rejected("over the batch cap".into()));
            }
            (Err(status), Err(_)) => {
                let class = if status.message().starts_with("events:") { "over the batch cap" } else { "malformed" };
                return Ok(Outcome::Rejected(class.into()));
            }
            (Ok(_), Err(_)) => return Ok(Outcome::Rejected("undecodable".into())),
            (Ok(n), Ok(req)) => {
                if n != req.events.len() {
                    return Err(format!("count_events counted {n} events, prost decoded {}", req.events.len()));
                }
                req
            }
        };
        let mut first_invalid = None;
        let mut by_job: BTreeMap<&str, Vec<CompactEvent>> = BTreeMap::new();
        for (i, ev) in req.events.iter().enumerate() {
            match validate_event(ev, NOW, &self.limits) {
                Ok(()) => {
                    let compact = CompactEvent::from_pb(ev, i as u64 + 1)
                        .ok_or_else(|| format!("a valid event has no compact form: {ev:?}"))?;
                    if startline_collector::store::encode_log_value(ev).is_empty() {
                        return Err("empty log value".into());
                    }
                    by_job.entry(ev.job_id.as_str()).or_default().push(compact);
                }
                Err(e) => {
                    first_invalid.get_or_insert_with(|| field_class(&e.field));
                }
            }
        }
        for events in by_job.into_values() {
            let rec = JobRecord::from_events(events);
            let _ = (rec.timeline.time_to_first_step_ms(), rec.timeline.lost_gpu_seconds());
        }
        Ok(match first_invalid {
            Some(f) => Outcome::Rejected(format!("invalid {f}")),
            None if req.events.is_empty() => Outcome::Accepted("empty batch".into()),
            None => Outcome::Accepted("valid".into()),
        })
    }
}

/// JSON targets share a dictionary of the seeds' keys and short strings.
struct JsonDict {
    keys: Vec<String>,
    strings: Vec<String>,
    tokens: Vec<Vec<u8>>,
}

impl JsonDict {
    fn of(seeds: &[Vec<u8>]) -> Self {
        let (mut keys, mut strings) = (Vec::new(), Vec::new());
        for s in seeds {
            if let Ok(v) = serde_json::from_slice::<Value>(s) {
                mutate::json_dictionary(&v, &mut keys, &mut strings);
            }
        }
        let tokens = keys.iter().map(|k| format!("\"{k}\":").into_bytes()).collect();
        JsonDict { keys, strings, tokens }
    }

    /// A structural mutation when the input is JSON, else a byte-level one.
    fn mutate(&self, rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
        if rng.chance(0.8) {
            if let Ok(mut v) = serde_json::from_slice::<Value>(input) {
                for _ in 0..rng.range(1, 3) {
                    mutate::json(rng, &mut v, &self.keys, &self.strings);
                }
                if let Ok(b) = serde_json::to_vec(&v) {
                    *input = b;
                    return;
                }
            }
        }
        mutate::bytes(rng, input, corpus, &self.tokens);
    }
}

/// The node agent's endpoint: JSON parsing as `POST /v1/events` does it,
/// [`startline_proto::json::event_from_json`] for each event and validation; property: the same post, retried
/// later, gets the same event id.
pub struct Node {
    dict: JsonDict,
    limits: Limits,
}

impl Node {
    /// The target.
    pub fn new() -> Self {
        let seeds = Self::seed_bodies();
        Node { dict: JsonDict::of(&seeds), limits: Limits::default() }
    }

    fn seed_bodies() -> Vec<Vec<u8>> {
        let bodies = emit_bodies();
        let mut out: Vec<Vec<u8>> = bodies.iter().filter_map(|b| serde_json::to_vec(b).ok()).collect();
        // The Python snippet's posts (docs/node-agent.md, tests/python/train_loop.py): Unix seconds, no event id.
        for b in [
            r#"{"kind": "preparing", "job_id": "slurm/cluster-a/4242", "occurred_at": 1829999000.125, "phase": "data_staging"}"#,
            r#"{"kind": "first_step", "job_id": "slurm/cluster-a/4242", "occurred_at": 1829999100.5, "step": 1}"#,
            r#"{"kind": "checkpoint", "job_id": "slurm/cluster-a/4242", "occurred_at": 1829999200, "step": 1000, "uri": "s3://ckpt/slurm/cluster-a/4242/1000"}"#,
            r#"{"kind": "done", "job_id": "slurm/cluster-a/4242", "outcome": "succeeded", "exit_code": 0}"#,
        ] {
            out.push(b.as_bytes().to_vec());
        }
        let all = Value::Object(serde_json::Map::from_iter([("events".to_string(), Value::Array(bodies))]));
        if let Ok(b) = serde_json::to_vec(&all) {
            out.push(b);
        }
        out
    }
}

impl Default for Node {
    fn default() -> Self {
        Self::new()
    }
}

/// The node agent's source name in the fuzz runs.
const NODE_SOURCE: &str = "node-agent/gpu-001";

impl Target for Node {
    fn name(&self) -> &'static str {
        "node"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        Self::seed_bodies()
    }

    fn mutate(&self, rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
        self.dict.mutate(rng, input, corpus);
    }

    fn run(&mut self, input: &[u8]) -> Result<Outcome, String> {
        let Ok(v) = serde_json::from_slice::<Value>(input) else {
            return Ok(Outcome::Rejected("body is not JSON".into()));
        };
        let items: Vec<&Value> = match v.get("events") {
            Some(Value::Array(a)) => a.iter().collect(),
            Some(_) => return Ok(Outcome::Rejected("events not an array".into())),
            None => vec![&v],
        };
        let mut kinds = Vec::new();
        for item in items {
            let ev = match startline_proto::json::event_from_json(item, NODE_SOURCE, NOW) {
                Ok(ev) => ev,
                Err((field, _)) => return Ok(Outcome::Rejected(format!("parse {field}"))),
            };
            // A retry arrives later: stamped later when it has no occurred_at, but it must keep its id.
            match startline_proto::json::event_from_json(item, NODE_SOURCE, NOW + 61_234) {
                Ok(again) if again.event_id == ev.event_id => {}
                Ok(again) => {
                    return Err(format!("a retried post got event id {} instead of {}", again.event_id, ev.event_id))
                }
                Err((field, _)) => return Err(format!("a retried post was refused ({field}) after being parsed")),
            }
            if let Err(e) = validate_event(&ev, NOW, &self.limits) {
                return Ok(Outcome::Rejected(format!("invalid {}", field_class(&e.field))));
            }
            kinds.push(ev.kind.as_ref().map_or("none", kind_name));
        }
        kinds.sort_unstable();
        kinds.dedup();
        Ok(Outcome::Accepted(if kinds.len() == 1 { kinds[0].to_string() } else { format!("{} kinds", kinds.len()) }))
    }
}

fn kind_name(k: &Kind) -> &'static str {
    match k {
        Kind::Submitted(_) => "submitted",
        Kind::Queued(_) => "queued",
        Kind::NodeAssigned(_) => "node_assigned",
        Kind::Preparing(_) => "preparing",
        Kind::FirstStep(_) => "first_step",
        Kind::Checkpoint(_) => "checkpoint",
        Kind::Preempted(_) => "preempted",
        Kind::Requeued(_) => "requeued",
        Kind::Restarted(_) => "restarted",
        Kind::NodeLost(_) => "node_lost",
        Kind::Done(_) => "done",
    }
}

/// The outcome of an adapter's events: accepted with the number of events, or noting the first invalid field
/// (an adapter's output the collector would refuse is an accepted parse, reported as its own class).
fn adapter_outcome(events: &[pb::LifecycleEvent], jobs: usize) -> Outcome {
    match first_invalid(events) {
        Some(f) => Outcome::Accepted(format!("output invalid {f}")),
        None if jobs == 0 => Outcome::Accepted("no jobs".into()),
        None => Outcome::Accepted("events".into()),
    }
}

/// The property every adapter keeps: a second `diff` with the memory the first returned emits nothing.
fn second_diff_is_empty(adapter: &str, again: &[pb::LifecycleEvent]) -> Result<(), String> {
    match again.first() {
        None => Ok(()),
        Some(e) => Err(format!("{adapter}: a second diff with the new memory emitted {} again", e.event_id)),
    }
}

/// Seeds from a payload with a `jobs` array: the whole payload and each job alone.
fn split_jobs(payload: &str, key: &str) -> Vec<Vec<u8>> {
    let mut out = vec![payload.as_bytes().to_vec()];
    if let Ok(v) = serde_json::from_str::<Value>(payload) {
        for j in v[key].as_array().into_iter().flatten() {
            let one = serde_json::json!({ key: [j] });
            if let Ok(b) = serde_json::to_vec(&one) {
                out.push(b);
            }
        }
    }
    out
}

/// The Slurm adapter's core: `squeue --json` and `sacct --json` parsing (both on every input), merging, and
/// `diff` to events.
pub struct Slurm {
    dict: JsonDict,
}

impl Slurm {
    /// The target.
    pub fn new() -> Self {
        Slurm { dict: JsonDict::of(&Self::seed_payloads()) }
    }

    fn seed_payloads() -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for p in [SQUEUE_22, SQUEUE_23, SACCT_22] {
            out.extend(split_jobs(p, "jobs"));
        }
        out
    }
}

impl Default for Slurm {
    fn default() -> Self {
        Self::new()
    }
}

impl Target for Slurm {
    fn name(&self) -> &'static str {
        "slurm"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        Self::seed_payloads()
    }

    fn mutate(&self, rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
        self.dict.mutate(rng, input, corpus);
    }

    fn run(&mut self, input: &[u8]) -> Result<Outcome, String> {
        // The shell refuses command output that is not UTF-8 before parsing.
        let Ok(text) = std::str::from_utf8(input) else {
            return Ok(Outcome::Rejected("not UTF-8".into()));
        };
        let live = slurm::parse_squeue(text);
        let acct = slurm::parse_sacct(text);
        let (live, acct) = match (live, acct) {
            (Err(e), Err(_)) => {
                let class = match e {
                    slurm::ParseError::Json(_) => "not JSON",
                    slurm::ParseError::NoJobs => "no jobs array",
                };
                return Ok(Outcome::Rejected(class.into()));
            }
            (l, a) => (l.unwrap_or_default(), a.unwrap_or_default()),
        };
        let m = slurm_mapping();
        // Each view alone (as when only one command answers) and merged (one payload parsed both ways would
        // otherwise let one view's defaults mask the other's values).
        let merged = slurm::merge(live.clone(), acct.clone());
        let jobs: Vec<&slurm::SlurmJob> = live.iter().chain(acct.iter()).chain(merged.iter()).collect();
        let mut all = Vec::new();
        for j in jobs.iter().copied() {
            let (events, mem) = slurm::diff(&m, j, &JobMemory::default(), NOW);
            let (again, _) = slurm::diff(&m, j, &mem, NOW + 10_000);
            second_diff_is_empty("slurm", &again)?;
            all.extend(events);
        }
        Ok(adapter_outcome(&all, jobs.len()))
    }
}

/// The SageMaker adapter's core: a `DescribeTrainingJob` answer parsed and diffed to events.
pub struct SageMaker {
    dict: JsonDict,
}

impl SageMaker {
    /// The target.
    pub fn new() -> Self {
        SageMaker { dict: JsonDict::of(&Self::seed_payloads()) }
    }

    fn seed_payloads() -> Vec<Vec<u8>> {
        vec![SAGEMAKER_COMPLETED.as_bytes().to_vec(), SAGEMAKER_FAILED.as_bytes().to_vec()]
    }
}

impl Default for SageMaker {
    fn default() -> Self {
        Self::new()
    }
}

impl Target for SageMaker {
    fn name(&self) -> &'static str {
        "sagemaker"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        Self::seed_payloads()
    }

    fn mutate(&self, rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
        self.dict.mutate(rng, input, corpus);
    }

    fn run(&mut self, input: &[u8]) -> Result<Outcome, String> {
        // The client reads the answer as text, then JSON.
        let Ok(v) =
            std::str::from_utf8(input).map_err(|_| ()).and_then(|t| serde_json::from_str::<Value>(t).map_err(|_| ()))
        else {
            return Ok(Outcome::Rejected("not JSON".into()));
        };
        let Some(job) = sagemaker::parse_describe(&v) else {
            return Ok(Outcome::Rejected("unreadable DescribeTrainingJob".into()));
        };
        let m = sagemaker_mapping();
        let (events, mem) = sagemaker::diff(&m, &job, &JobMemory::default());
        let (again, _) = sagemaker::diff(&m, &job, &mem);
        second_diff_is_empty("sagemaker", &again)?;
        Ok(adapter_outcome(&events, 1))
    }
}

/// The Vertex AI adapter's core: a CustomJob (or a list page of them) parsed and diffed to events.
pub struct Vertex {
    dict: JsonDict,
}

impl Vertex {
    /// The target.
    pub fn new() -> Self {
        Vertex { dict: JsonDict::of(&Self::seed_payloads()) }
    }

    fn seed_payloads() -> Vec<Vec<u8>> {
        let mut out = vec![VERTEX_SUCCEEDED.as_bytes().to_vec(), VERTEX_FAILED.as_bytes().to_vec()];
        let page: Vec<Value> =
            [VERTEX_SUCCEEDED, VERTEX_FAILED].iter().filter_map(|s| serde_json::from_str(s).ok()).collect();
        if let Ok(b) = serde_json::to_vec(&serde_json::json!({"customJobs": page, "nextPageToken": ""})) {
            out.push(b);
        }
        out
    }
}

impl Default for Vertex {
    fn default() -> Self {
        Self::new()
    }
}

impl Target for Vertex {
    fn name(&self) -> &'static str {
        "vertex"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        Self::seed_payloads()
    }

    fn mutate(&self, rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
        self.dict.mutate(rng, input, corpus);
    }

    fn run(&mut self, input: &[u8]) -> Result<Outcome, String> {
        let Ok(v) =
            std::str::from_utf8(input).map_err(|_| ()).and_then(|t| serde_json::from_str::<Value>(t).map_err(|_| ()))
        else {
            return Ok(Outcome::Rejected("not JSON".into()));
        };
        // A list page (as the client reads it) or one resource.
        let resources: Vec<Value> = match v.get("customJobs") {
            Some(_) => v["customJobs"].as_array().cloned().unwrap_or_default(),
            None => vec![v],
        };
        let m = vertex_mapping();
        let mut all = Vec::new();
        let mut jobs = 0;
        for r in &resources {
            let Some(job) = vertex::parse_custom_job(r) else { continue };
            jobs += 1;
            let (events, mem) = vertex::diff(&m, &job, &JobMemory::default(), NOW);
            let (again, _) = vertex::diff(&m, &job, &mem, NOW + 10_000);
            second_diff_is_empty("vertex", &again)?;
            all.extend(events);
        }
        if jobs == 0 {
            return Ok(Outcome::Rejected("unreadable CustomJob".into()));
        }
        Ok(adapter_outcome(&all, jobs))
    }
}

/// The credential parsers both edges share: the `Authorization` header (`bearer`), token hashes from the config
/// (`TokenHash::parse`) and the authenticator itself, with one configured identity. Input: the header value, a
/// newline, a token-hash string. Invariants: a parsed token is a printable slice of the header; a parsed hash
/// round-trips; only the configured token authenticates; no refusal message echoes the input.
pub struct AuthParsers {
    auth: startline_collector::auth::Auth,
    dict: Vec<Vec<u8>>,
}

/// The token of the fuzz run's one identity.
const FUZZ_TOKEN: &str = "stl_0123456789abcdef";

impl AuthParsers {
    /// The target.
    pub fn new() -> Self {
        use startline_collector::auth::{Identity, Keyring, TokenHash};
        let keyring = Keyring::new(vec![(Identity::anonymous(), vec![TokenHash::of(FUZZ_TOKEN)], Vec::new())]);
        let dict = ["Bearer ", "bearer", "Basic ", " ", "\t", "sha256:", FUZZ_TOKEN, "%", "\u{0}", "\r\n", "\u{ff}"]
            .iter()
            .map(|s| s.as_bytes().to_vec())
            .collect();
        AuthParsers { auth: startline_collector::auth::Auth::new(keyring, false, false), dict }
    }
}

impl Default for AuthParsers {
    fn default() -> Self {
        Self::new()
    }
}

impl Target for AuthParsers {
    fn name(&self) -> &'static str {
        "auth"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        let h = startline_collector::auth::TokenHash::of(FUZZ_TOKEN).to_config();
        [
            format!("Bearer {FUZZ_TOKEN}\n{h}"),
            format!("bearer   {FUZZ_TOKEN}\n{}", h.to_uppercase()),
            "Bearer stl_wrong\nsha256:00".to_string(),
            "Basic dXNlcjpwYXNz\nmd5:abc".to_string(),
            "Bearer\n".to_string(),
        ]
        .into_iter()
        .map(String::into_bytes)
        .collect()
    }

    fn mutate(&self, rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
        super::mutate::bytes(rng, input, corpus, &self.dict);
    }

    fn run(&mut self, input: &[u8]) -> Result<Outcome, String> {
        use startline_collector::auth::{bearer, Credentials, Scope, TokenHash};
        let (header, hash) = match input.iter().position(|&b| b == b'\n') {
            Some(i) => (&input[..i], &input[i + 1..]),
            None => (input, &[][..]),
        };
        if let Some(t) = bearer(header) {
            let inside = header.windows(t.len()).any(|w| w == t.as_bytes());
            if t.is_empty() || t.len() > 1024 || !inside || !t.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!("bearer() returned {t:?} from {:?}", String::from_utf8_lossy(header)));
            }
        }
        if let Ok(text) = std::str::from_utf8(hash) {
            if let Ok(h) = TokenHash::parse(text) {
                if TokenHash::parse(&h.to_config()) != Ok(h) || !text.eq_ignore_ascii_case(&h.to_config()) {
                    return Err(format!("hash {text:?} does not round-trip"));
                }
            }
        }
        let creds = Credentials { authorization: Some(header), session: None, cert_names: &[] };
        match self.auth.authorize(creds, Scope::Ingest) {
            Ok(_) if bearer(header) == Some(FUZZ_TOKEN) => Ok(Outcome::Accepted("authenticated".into())),
            Ok(_) => Err(format!("{:?} authenticated", String::from_utf8_lossy(header))),
            Err(d) => {
                let msg = d.message();
                // Longer than any word of the fixed messages, so a hit is an echo.
                if let Some(t) = bearer(header).filter(|t| t.len() >= 12) {
                    if msg.contains(t) {
                        return Err(format!("refusal message echoes the token: {msg}"));
                    }
                }
                Ok(Outcome::Rejected(d.reason().into()))
            }
        }
    }
}
