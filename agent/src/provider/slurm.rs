//! The Slurm adapter. Pure core: [`parse_squeue`] and [`parse_sacct`] read `squeue --json` and `sacct --json`
//! in both the 22.05 shapes (Debian 12: plain strings and numbers) and the 23.02+ shapes (`job_state` arrays,
//! `{set, infinite, number}` numbers); [`diff`] turns a job's current view plus its memory into lifecycle
//! events. Shell: [`run`] polls both commands, merges the views, appends events to the spool and persists each
//! job's memory.
//!
//! What a Slurm job tells us and how it maps:
//! - `submitted` at `submit_time`: pool = partition, priority `urgent` when the partition or QOS is listed as
//!   urgent, GPUs from the requested TRES (`gres/gpu=N`), team = account, labels user, qos and job name;
//! - `queued` whenever the pending reason changes (the first at submit time, later ones at the poll that saw
//!   them: Slurm keeps no history of reasons), mapped: Resources -> capacity, Priority -> priority,
//!   QOS*/Assoc* limits -> quota, Dependency/JobHeld*/BeginTime -> dependency_or_hold,
//!   ReqNodeNotAvail/PartitionDown/... -> misconfigured, others -> unknown; the raw reason is kept;
//! - `node_assigned` at `start_time` with the nodes (and `first_step` at the same time with
//!   `first_step_on_start`, for clusters without a node agent in the job; leave it off when the training
//!   loop reports its own first step);
//! - `requeued` when `restart_cnt` grows; the next start is a new attempt;
//! - `done` at `end_time`: COMPLETED -> succeeded, CANCELLED -> cancelled, TIMEOUT/DEADLINE -> timed_out,
//!   PREEMPTED -> preempted, FAILED/OUT_OF_MEMORY/BOOT_FAIL -> failed, NODE_FAIL -> node_lost then failed.
//!   The exit code comes from squeue's raw wait status while the job is listed there (sacct 22.05 reports
//!   SUCCESS for failed jobs).

use super::{JobMemory, MemoryStore, PollError, PollReport};
use crate::metrics::{PollErrorKind, Provider};
use serde_json::Value;
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_proto::time::ms_to_timestamp;
use std::collections::BTreeMap;

/// One job as the adapter sees it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SlurmJob {
    /// Job id (`<array job>_<task>` for array tasks).
    pub id: String,
    /// Cluster name.
    pub cluster: String,
    /// Base state, e.g. PENDING, RUNNING, COMPLETED.
    pub state: String,
    /// Pending reason (`None` when none).
    pub reason: String,
    /// Submit time, Unix seconds.
    pub submit: i64,
    /// Start time, Unix seconds (None until started; squeue's estimate for pending jobs is dropped).
    pub start: Option<i64>,
    /// End time, Unix seconds (None until ended).
    pub end: Option<i64>,
    /// Allocated nodes.
    pub nodes: Vec<String>,
    /// Partition.
    pub partition: String,
    /// QOS.
    pub qos: String,
    /// Account.
    pub account: String,
    /// User.
    pub user: String,
    /// Job name.
    pub name: String,
    /// GPUs requested.
    pub gpus: u32,
    /// Nodes requested.
    pub node_count: u32,
    /// Requeues.
    pub restarts: u32,
    /// Exit code, when known.
    pub exit_code: Option<i32>,
}

/// Why a payload could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// Not JSON.
    #[error("not json: {0}")]
    Json(#[from] serde_json::Error),
    /// No `jobs` array.
    #[error("no jobs array")]
    NoJobs,
}

/// A number in either shape: plain, or `{"set": bool, "infinite": bool, "number": n}`.
fn num(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::Object(o) => {
            let set = o.get("set").and_then(Value::as_bool).unwrap_or(true);
            let inf = o.get("infinite").and_then(Value::as_bool).unwrap_or(false);
            if set && !inf {
                o.get("number").and_then(Value::as_i64)
            } else {
                None
            }
        }
        _ => None,
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        // 23.02+: job_state as an array of flags, the base state first.
        Value::Array(a) => a.first().and_then(Value::as_str).unwrap_or("").to_string(),
        Value::Object(o) => o.get("current").map(text).unwrap_or_default(),
        _ => String::new(),
    }
}

/// A positive time or None (Slurm uses 0 for "not yet").
fn time(v: &Value) -> Option<i64> {
    num(v).filter(|t| *t > 0)
}

fn gpus_from_tres(s: &str) -> u32 {
    s.split(',')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| *k == "gres/gpu" || k.starts_with("gres/gpu:"))
        .filter_map(|(_, v)| v.parse::<u32>().ok())
        .max()
        .unwrap_or(0)
}

fn job_id(j: &Value) -> String {
    let id = num(&j["job_id"]).unwrap_or(0);
    let array = num(&j["array_job_id"]).filter(|a| *a > 0);
    let task = num(&j["array_task_id"]).or_else(|| num(&j["array"]["task_id"]));
    match (array.or_else(|| num(&j["array"]["job_id"]).filter(|a| *a > 0)), task) {
        (Some(a), Some(t)) => format!("{a}_{t}"),
        _ => id.to_string(),
    }
}

/// Parses `squeue --json` (22.05 or 23.02+ shapes).
pub fn parse_squeue(payload: &str) -> Result<Vec<SlurmJob>, ParseError> {
    let v: Value = serde_json::from_str(payload)?;
    let jobs = v.get("jobs").and_then(Value::as_array).ok_or(ParseError::NoJobs)?;
    Ok(jobs
        .iter()
        .map(|j| {
            let state = text(&j["job_state"]);
            let started = !matches!(state.as_str(), "PENDING" | "");
            // squeue's exit_code: 22.05 a raw wait status (768 = exit 3); 23.02+ {status, return_code}.
            let exit_code = match &j["exit_code"] {
                Value::Number(n) => n.as_i64().map(|w| (w >> 8) as i32),
                Value::Object(o) => o.get("return_code").and_then(num).map(|c| c as i32),
                _ => None,
            };
            SlurmJob {
                id: job_id(j),
                cluster: text(&j["cluster"]),
                reason: text(&j["state_reason"]),
                submit: time(&j["submit_time"]).unwrap_or(0),
                start: if started { time(&j["start_time"]) } else { None },
                end: if started && !matches!(state.as_str(), "RUNNING" | "COMPLETING" | "SUSPENDED" | "CONFIGURING") {
                    time(&j["end_time"])
                } else {
                    None
                },
                nodes: text(&j["nodes"]).split(',').filter(|s| !s.is_empty()).map(str::to_string).collect(),
                partition: text(&j["partition"]),
                qos: text(&j["qos"]),
                account: text(&j["account"]),
                user: text(&j["user_name"]),
                name: text(&j["name"]),
                gpus: gpus_from_tres(&text(&j["tres_req_str"])),
                node_count: num(&j["node_count"]).unwrap_or(1).max(0) as u32,
                restarts: num(&j["restart_cnt"]).unwrap_or(0).max(0) as u32,
                exit_code,
                state,
            }
        })
        .collect())
}

/// Parses `sacct --json` (22.05 or 23.02+ shapes). Job steps are ignored; one record per job.
pub fn parse_sacct(payload: &str) -> Result<Vec<SlurmJob>, ParseError> {
    let v: Value = serde_json::from_str(payload)?;
    let jobs = v.get("jobs").and_then(Value::as_array).ok_or(ParseError::NoJobs)?;
    Ok(jobs
        .iter()
        .map(|j| {
            let t = &j["time"];
            let state = text(&j["state"]);
            let gpus = j["tres"]["requested"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter(|x| x["type"] == "gres" && x["name"].as_str().is_some_and(|n| n.starts_with("gpu")))
                        .filter_map(|x| num(&x["count"]))
                        .max()
                        .unwrap_or(0)
                })
                .unwrap_or(0) as u32;
            let exit = &j["exit_code"];
            let exit_code = exit.get("return_code").and_then(num).map(|c| c as i32);
            SlurmJob {
                id: job_id(j),
                cluster: text(&j["cluster"]),
                reason: text(&j["state"]["reason"]),
                submit: time(&t["submission"]).unwrap_or(0),
                start: time(&t["start"]),
                end: if matches!(state.as_str(), "PENDING" | "RUNNING" | "REQUEUED") { None } else { time(&t["end"]) },
                nodes: text(&j["nodes"])
                    .split(',')
                    .filter(|s| !s.is_empty() && *s != "None assigned")
                    .map(str::to_string)
                    .collect(),
                partition: text(&j["partition"]),
                qos: text(&j["qos"]),
                account: text(&j["account"]),
                user: text(&j["user"]),
                name: text(&j["name"]),
                gpus,
                node_count: 1,
                restarts: num(&j["restart_cnt"]).unwrap_or(0).max(0) as u32,
                exit_code,
                state,
            }
        })
        .collect())
}

/// How Slurm jobs map onto Startline's attributes.
#[derive(Debug, Clone, Default)]
pub struct Mapping {
    /// Partitions whose jobs are urgent.
    pub urgent_partitions: Vec<String>,
    /// QOS names whose jobs are urgent.
    pub urgent_qos: Vec<String>,
    /// Region or site name.
    pub site: String,
    /// GPU class reported for every job (Slurm's TRES rarely names it reliably).
    pub gpu_class: String,
    /// Emit `first_step` at the job's start (no node agent in the job).
    pub first_step_on_start: bool,
    /// Cluster name when the payload has none.
    pub cluster: String,
}

/// The closed wait reason for a Slurm pending reason.
pub fn map_reason(raw: &str) -> pb::WaitReason {
    use pb::WaitReason as W;
    match raw {
        "Resources" | "Licenses" | "Reservation" | "NodeDown" => W::Capacity,
        "Priority" => W::Priority,
        "Dependency" | "DependencyNeverSatisfied" | "JobHeldUser" | "JobHeldAdmin" | "BeginTime" => W::DependencyOrHold,
        "ReqNodeNotAvail" | "PartitionDown" | "PartitionNodeLimit" | "PartitionTimeLimit" | "BadConstraints"
        | "InvalidAccount" | "InvalidQOS" | "PartitionConfig" => W::Misconfigured,
        r if r.starts_with("QOS") || r.starts_with("Assoc") || r.starts_with("MaxGRES") => W::Quota,
        _ => W::Unknown,
    }
}

fn outcome(state: &str) -> Option<pb::Outcome> {
    use pb::Outcome as O;
    Some(match state {
        "COMPLETED" => O::Succeeded,
        "CANCELLED" => O::Cancelled,
        "TIMEOUT" | "DEADLINE" => O::TimedOut,
        "PREEMPTED" => O::Preempted,
        "FAILED" | "OUT_OF_MEMORY" | "BOOT_FAIL" | "NODE_FAIL" => O::Failed,
        _ => return None,
    })
}

/// The Startline job id of a Slurm job.
pub fn startline_id(m: &Mapping, j: &SlurmJob) -> String {
    let cluster = if j.cluster.is_empty() { m.cluster.as_str() } else { j.cluster.as_str() };
    format!("slurm/{cluster}/{}", j.id)
}

/// The most `requeued` events one job reports in one poll (Slurm's own requeue limit, `MaxBatchRequeue`, is 5 by
/// default).
pub const MAX_REQUEUES_PER_POLL: u32 = 64;

/// The events a job's current view implies beyond what its memory says were emitted, and the new memory.
/// `now_ms` dates transitions Slurm keeps no time for (a changed pending reason, a requeue).
pub fn diff(m: &Mapping, j: &SlurmJob, mem: &JobMemory, now_ms: i64) -> (Vec<pb::LifecycleEvent>, JobMemory) {
    let mut out = Vec::new();
    let mut mem = mem.clone();
    let job = startline_id(m, j);
    let mut emit = |mem: &mut JobMemory, key: String, at_ms: i64, kind: Kind| {
        if mem.emitted.insert(key.clone()) {
            out.push(pb::LifecycleEvent {
                event_id: format!("{job}:{key}"),
                job_id: job.clone(),
                attempt: Some(mem.restarts.saturating_add(1)),
                source: format!("slurm-adapter/{}", if j.cluster.is_empty() { &m.cluster } else { &j.cluster }),
                occurred_at: Some(ms_to_timestamp(at_ms)),
                kind: Some(kind),
            });
        }
    };
    if j.submit <= 0 {
        return (out, mem);
    }
    // Saturating: a time far out of range (a broken or hostile payload) must not overflow; validation refuses it.
    let submit_ms = j.submit.saturating_mul(1000);
    let urgent = m.urgent_partitions.contains(&j.partition) || m.urgent_qos.contains(&j.qos);
    let mut labels = std::collections::HashMap::new();
    for (k, v) in [("user", &j.user), ("qos", &j.qos), ("name", &j.name)] {
        if !v.is_empty() {
            labels.insert(k.to_string(), v.chars().take(256).collect::<String>());
        }
    }
    emit(
        &mut mem,
        "submitted".into(),
        submit_ms,
        Kind::Submitted(pb::Submitted {
            pool_kind: pb::PoolKind::Dedicated as i32,
            provider: "slurm".into(),
            pool: if j.partition.is_empty() { "default".into() } else { j.partition.clone() },
            priority: if urgent { pb::PriorityClass::Urgent } else { pb::PriorityClass::Normal } as i32,
            gpu_class: m.gpu_class.clone(),
            gpu_count: j.gpus,
            node_count: j.node_count.max(1),
            region: m.site.clone(),
            team: j.account.clone(),
            project: j.account.clone(),
            chain_id: String::new(),
            chain_stage: String::new(),
            labels,
        }),
    );
    // A requeue: the job goes back to waiting; later transitions belong to the next attempt. A jump of more than
    // MAX_REQUEUES_PER_POLL reports the latest ones only (attempts keep Slurm's numbering), so a broken or hostile
    // restart count (up to 4294967295) cannot make one poll emit billions of events.
    mem.restarts = mem.restarts.max(j.restarts.saturating_sub(MAX_REQUEUES_PER_POLL));
    while mem.restarts < j.restarts {
        mem.restarts += 1;
        let n = mem.restarts;
        emit(&mut mem, format!("requeued:{n}"), now_ms, Kind::Requeued(pb::Requeued { resume_step: 0 }));
        mem.reason.clear();
    }
    let attempt = mem.restarts;
    if j.state == "PENDING" && !j.reason.is_empty() && j.reason != "None" && j.reason != mem.reason {
        let at = if mem.reasons_seen == 0 && attempt == 0 { submit_ms } else { now_ms.max(submit_ms) };
        mem.reasons_seen += 1;
        let n = mem.reasons_seen;
        emit(
            &mut mem,
            format!("queued:{n}"),
            at,
            Kind::Queued(pb::Queued {
                reason: map_reason(&j.reason) as i32,
                raw_reason: super::free_text(&j.reason, 256),
                message: String::new(),
            }),
        );
        mem.reason = j.reason.clone();
    }
    if let Some(start) = j.start {
        let at = start.saturating_mul(1000);
        emit(
            &mut mem,
            format!("assigned:{attempt}"),
            at,
            Kind::NodeAssigned(pb::NodeAssigned { nodes: j.nodes.clone(), gpu_ids: vec![] }),
        );
        if m.first_step_on_start {
            emit(&mut mem, format!("first_step:{attempt}"), at, Kind::FirstStep(pb::FirstStep { step: 0 }));
        }
    }
    if j.exit_code.is_some_and(|c| c != 0) {
        mem.exit_code = j.exit_code;
    }
    if let (Some(o), Some(end)) = (outcome(&j.state), j.end) {
        let at = end.saturating_mul(1000).max(submit_ms);
        if j.state == "NODE_FAIL" {
            emit(
                &mut mem,
                "node_lost".into(),
                at,
                Kind::NodeLost(pb::NodeLost { node: j.nodes.join(","), message: "NODE_FAIL".into() }),
            );
        }
        let exit_code = mem.exit_code.or(j.exit_code.filter(|_| o == pb::Outcome::Succeeded));
        emit(
            &mut mem,
            "done".into(),
            at,
            Kind::Done(pb::Done { outcome: o as i32, exit_code, message: format!("slurm state {}", j.state) }),
        );
        mem.done = true;
    }
    (out, mem)
}

/// Merges the live view (squeue) and accounting (sacct): accounting wins for finished jobs, the live view
/// for pending reasons and exit codes.
pub fn merge(live: Vec<SlurmJob>, acct: Vec<SlurmJob>) -> Vec<SlurmJob> {
    let mut by_id: BTreeMap<String, SlurmJob> = BTreeMap::new();
    for j in acct {
        by_id.insert(j.id.clone(), j);
    }
    for j in live {
        match by_id.get_mut(&j.id) {
            Some(a) => {
                if a.end.is_none() {
                    // Still live: squeue knows the pending reason and the current state best.
                    a.state = j.state.clone();
                    a.reason = j.reason.clone();
                    a.start = a.start.or(j.start);
                    a.nodes = if a.nodes.is_empty() { j.nodes.clone() } else { a.nodes.clone() };
                }
                a.restarts = a.restarts.max(j.restarts);
                a.gpus = a.gpus.max(j.gpus);
                if j.exit_code.is_some_and(|c| c != 0) {
                    a.exit_code = j.exit_code;
                }
            }
            None => {
                by_id.insert(j.id.clone(), j);
            }
        }
    }
    by_id.into_values().collect()
}

/// Settings of the polling shell.
#[derive(Debug, Clone)]
pub struct ShellSettings {
    /// `squeue --json` command line.
    pub squeue: Vec<String>,
    /// `sacct --json ...` command line.
    pub sacct: Vec<String>,
    /// Poll interval.
    pub interval: std::time::Duration,
}

async fn run_json(cmd: &[String]) -> Result<String, PollError> {
    let failed = |m: String| PollError::new(PollErrorKind::CommandFailed, m);
    let (prog, args) = cmd.split_first().ok_or_else(|| failed("empty command".into()))?;
    let out =
        tokio::process::Command::new(prog).args(args).output().await.map_err(|e| failed(format!("{prog}: {e}")))?;
    if !out.status.success() {
        return Err(failed(format!("{prog} exited {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim())));
    }
    String::from_utf8(out.stdout).map_err(|e| PollError::new(PollErrorKind::Parse, format!("{prog}: {e}")))
}

/// Polls Slurm until `stop`, appending events to the spool and persisting job memories.
pub async fn run(
    m: Mapping,
    shell: ShellSettings,
    spool: crate::spool::Spool,
    memory: MemoryStore,
    metrics: crate::metrics::Metrics,
    stop: crate::simulate::tokio_util_free::Stop,
) {
    super::poll_loop(Provider::Slurm, metrics, shell.interval, stop, || poll_once(&m, &shell, &spool, &memory)).await
}

/// One poll: read both views, diff every job, spool the events, save memories. Returns the jobs followed and
/// the events spooled.
pub async fn poll_once(
    m: &Mapping,
    shell: &ShellSettings,
    spool: &crate::spool::Spool,
    memory: &MemoryStore,
) -> Result<PollReport, PollError> {
    let parse = |what: &str, e: ParseError| PollError::new(PollErrorKind::Parse, format!("{what}: {e}"));
    let live = parse_squeue(&run_json(&shell.squeue).await?).map_err(|e| parse("squeue", e))?;
    let acct = match run_json(&shell.sacct).await {
        Ok(p) => parse_sacct(&p).map_err(|e| parse("sacct", e))?,
        Err(e) => {
            tracing::debug!(error = %e, "sacct unavailable; using squeue only");
            Vec::new()
        }
    };
    let now = startline_proto::time::now_ms();
    let mut report = PollReport::default();
    for j in merge(live, acct) {
        let key = startline_id(m, &j);
        let mem = memory.get(&key);
        let (events, new_mem) = diff(m, &j, &mem, now);
        super::record(spool, memory, &key, &mem, events, &new_mem, &mut report)?;
    }
    super::flush(memory)?;
    Ok(report)
}

#[cfg(test)]
mod tests;
