//! The Slurm adapter. Pure core: [`parse_squeue`] and [`parse_sacct`] read `squeue --json` and `sacct --json`
//! in both the 22.05 shapes (Debian 12: plain strings and numbers) and the 23.02+ shapes (`job_state` arrays,
//! `{set, infinite, number}` numbers); [`diff`] turns a job's current view plus its memory into lifecycle
//! events; [`track_vanished`] decides when a job that left Slurm's views is given up. Shell: [`run`] polls both
//! commands, merges the views, appends events to the spool and persists each job's memory and the adapter's
//! own state (the sacct window and the jobs it follows). In slurmrestd mode ([`rest`]) the same two views come
//! from slurmrestd's `/slurm/<v>/jobs` and `/slurmdb/<v>/jobs` instead, read by the same parsers.
//!
//! What a Slurm job tells us and how it maps:
//! - `submitted` at `submit_time`: pool = partition, priority `urgent` when the partition or QOS is listed as
//!   urgent, GPUs from the requested TRES (`gres/gpu=N`), team = account, labels user, qos and job name;
//! - `queued` whenever the pending reason changes, mapped through the full table in [`reasons`] (every
//!   string Slurm 22.05..25.11 can print; the raw reason is kept). The first is dated at submit; later ones at
//!   the poll that saw them (Slurm keeps no history of reasons), except that Slurm's `eligible_time` splits
//!   the wait exactly: submit -> eligible (when more than [`ELIGIBLE_SLACK_MS`] apart) is a dependency, hold or
//!   begin-time wait, eligible -> start a
//!   resource, priority or quota wait. A job first seen waiting on, say, Resources with an `eligible_time`
//!   after its submit gets a `queued:dependency_or_hold` (raw reason `eligible_time`) at submit and its reason
//!   at `eligible_time`; a job seen going from a dependency/hold reason to another reason gets the new one at
//!   `eligible_time` too (when that lies between the two observations);
//! - the scheduler's **estimated start** (squeue's `start_time` of a pending job, when non-zero and in the
//!   future: squeue clamps a past estimate to its own clock, which is no estimate) rides on `queued` events as
//!   `estimated_start`; when it moves by more than [`ESTIMATE_STEP_MS`], a new `queued` with the same reason
//!   carries the new one;
//! - **job arrays**: squeue lists a pending array as one record (`array_task_string` like `0-2`, `0-9%2` or
//!   `1-9:2`, no task id). That record is never a job: it is expanded into one pending job per task id,
//!   `<array job>_<task>` (the ids sacct and the tasks' own squeue records use later), at most
//!   [`MAX_ARRAY_TASKS`] per record. Each task then goes through its own transitions as it splits out, runs
//!   and ends. Tasks beyond the cap, or beyond a task string squeue cut short (`...`; the adapter asks for
//!   `SLURM_BITSTR_LEN=4096`), are followed once they appear on their own, without their first pending
//!   reason;
//! - `node_assigned` at `start_time` with the nodes (and `first_step` at the same time with
//!   `first_step_on_start`, for clusters without a node agent in the job; leave it off when the training
//!   loop reports its own first step). A job in **CONFIGURING** (its nodes are booting or being set up:
//!   `job_state` CONFIGURING in 22.05, the CONFIGURING flag in the 23.02+ arrays) also gets
//!   `preparing:provisioning` at its allocation, and its `first_step` (with `first_step_on_start`) waits until
//!   it runs: Slurm re-dates `start_time` to the end of a node power-up, which is then the first step;
//! - `requeued` when `restart_cnt` grows; the next start is a new attempt;
//! - `done` at `end_time`: COMPLETED -> succeeded, CANCELLED -> cancelled, TIMEOUT/DEADLINE -> timed_out,
//!   PREEMPTED -> preempted, FAILED/OUT_OF_MEMORY/BOOT_FAIL -> failed, NODE_FAIL -> node_lost then failed.
//!   The exit code comes from squeue's raw wait status while the job is listed there (sacct 22.05 reports
//!   SUCCESS for failed jobs).
//!
//! The accounting window: each poll asks `sacct` for jobs from the start of the last successful poll minus
//! [`SACCT_OVERLAP_MS`] (persisted, so it survives a restart); the first poll ever goes back `--lookback`.
//!
//! **Vanished jobs**: a job the adapter follows that is neither in squeue (it left after `MinJobAge`) nor in
//! the sacct window is re-queried by id (`sacct -j <ids>`). If accounting answers without it for
//! `--vanished-grace` (default 10 minutes; three graces when accounting does not answer at all), the job is
//! ended with a `done` dated at the first poll that missed it. The protocol has no `unknown` outcome: the
//! closest is `cancelled` (it neither ran to an end the adapter saw nor failed; an SLO that excludes
//! cancelled jobs leaves it out), with the message `slurm: vanished ... outcome unknown`, so such jobs stay
//! recognisable. Should the job turn up later, its real `done` has the same event id and is a duplicate.

pub mod reasons;
pub mod rest;

use super::{JobMemory, MemoryStore, PollError, PollReport};
use crate::metrics::{PollErrorKind, Provider};
use reasons::map_reason;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_proto::time::ms_to_timestamp;
use std::collections::{BTreeMap, BTreeSet};

/// One job as the adapter sees it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SlurmJob {
    /// Job id (`<array job>_<task>` for array tasks).
    pub id: String,
    /// Cluster name.
    pub cluster: String,
    /// Base state, e.g. PENDING, RUNNING, COMPLETED (22.05's CONFIGURING reads as RUNNING with `configuring`).
    pub state: String,
    /// Pending reason (`None` when none).
    pub reason: String,
    /// Submit time, Unix seconds.
    pub submit: i64,
    /// When the job became (or becomes) eligible to start, Unix seconds (Slurm's `eligible_time`; None while
    /// a dependency or hold keeps it ineligible).
    pub eligible: Option<i64>,
    /// Start time, Unix seconds (None until started).
    pub start: Option<i64>,
    /// The scheduler's estimated start of a pending job, Unix seconds (squeue's `start_time` while pending).
    pub estimated_start: Option<i64>,
    /// The job's nodes are being configured (booted, powered up): Slurm's CONFIGURING.
    pub configuring: bool,
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

/// The base state and whether the job is configuring: 22.05 prints `CONFIGURING` instead of the base state
/// (always RUNNING then), 23.02+ lists the flag after the base state.
fn state_of(v: &Value) -> (String, bool) {
    let flagged = match v {
        Value::Array(a) => a.iter().any(|f| f.as_str() == Some("CONFIGURING")),
        Value::Object(o) => o.get("current").is_some_and(|c| state_of(c).1),
        _ => false,
    };
    match text(v) {
        s if s == "CONFIGURING" => ("RUNNING".into(), true),
        s => (s, flagged),
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

/// The array job id of an array record (squeue's `array_job_id`, sacct's `array.job_id`), when it is one.
fn array_job(j: &Value) -> Option<i64> {
    num(&j["array_job_id"]).filter(|a| *a > 0).or_else(|| num(&j["array"]["job_id"]).filter(|a| *a > 0))
}

fn array_task(j: &Value) -> Option<i64> {
    num(&j["array_task_id"]).or_else(|| num(&j["array"]["task_id"])).filter(|t| *t >= 0)
}

fn job_id(j: &Value) -> String {
    let id = num(&j["job_id"]).unwrap_or(0);
    match (array_job(j), array_task(j)) {
        (Some(a), Some(t)) => format!("{a}_{t}"),
        _ => id.to_string(),
    }
}

/// The most tasks one pending array record is expanded into (Slurm's default `MaxArraySize` is 1001, so a
/// default cluster's arrays are expanded whole).
pub const MAX_ARRAY_TASKS: usize = 1001;

/// The task ids of an array task string as squeue prints it (`0-2`, `1,3,5-7`, `1-9:2` with a step, `[0-9]`,
/// an optional `%N` throttle) or sacct (`0x7`: a hex bitmap, task 0 the lowest bit). A string squeue cut short ends in `...`: its last, possibly
/// partial, item is left out. At most `cap` ids; unreadable items are skipped.
pub fn array_tasks(spec: &str, cap: usize) -> Vec<u32> {
    let spec = spec.split('%').next().unwrap_or("").trim().trim_start_matches('[').trim_end_matches(']');
    if let Some(hex) = spec.strip_prefix("0x").or_else(|| spec.strip_prefix("0X")) {
        // sacct prints the task bitmap as hex, the lowest task in the last digit.
        let mut out = Vec::new();
        for (k, d) in hex.chars().rev().filter_map(|c| c.to_digit(16)).enumerate() {
            for bit in 0..4u32 {
                let Some(t) = u32::try_from(k).ok().and_then(|k| k.checked_mul(4)).and_then(|b| b.checked_add(bit))
                else {
                    return out;
                };
                if d & (1 << bit) != 0 {
                    if out.len() >= cap {
                        return out;
                    }
                    out.push(t);
                }
            }
        }
        return out;
    }
    let (spec, cut) = match spec.strip_suffix("...") {
        Some(s) => (s, true),
        None => (spec, false),
    };
    let mut items: Vec<&str> = spec.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    if cut {
        items.pop();
    }
    let mut out = Vec::new();
    for item in items {
        let (range, step) = match item.split_once(':') {
            Some((r, s)) => (r, s.parse::<u32>().ok().filter(|s| *s > 0)),
            None => (item, Some(1)),
        };
        let Some(step) = step else { continue };
        let (lo, hi) = match range.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().ok(), b.parse::<u32>().ok()),
            None => (range.parse::<u32>().ok(), range.parse::<u32>().ok()),
        };
        let (Some(lo), Some(hi)) = (lo, hi) else { continue };
        let mut t = lo;
        while t <= hi {
            if out.len() >= cap {
                return out;
            }
            out.push(t);
            match t.checked_add(step) {
                Some(n) => t = n,
                None => break,
            }
        }
    }
    out
}

/// A pending array meta-record (`array_task_string` set, no task id) as one pending job per task; any other
/// record as itself.
fn expand(record: &Value, job: SlurmJob, task_string: &str) -> Vec<SlurmJob> {
    match (array_job(record), array_task(record)) {
        (Some(a), None) if !task_string.trim().is_empty() => array_tasks(task_string, MAX_ARRAY_TASKS)
            .into_iter()
            .map(|t| SlurmJob { id: format!("{a}_{t}"), ..job.clone() })
            .collect(),
        _ => vec![job],
    }
}

/// Parses `squeue --json` (22.05 or 23.02+ shapes). A pending array record becomes one job per task.
pub fn parse_squeue(payload: &str) -> Result<Vec<SlurmJob>, ParseError> {
    squeue_jobs(&serde_json::from_str(payload)?)
}

/// [`parse_squeue`] over parsed JSON (slurmrestd's `/slurm/<v>/jobs` has the same shape).
pub fn squeue_jobs(v: &Value) -> Result<Vec<SlurmJob>, ParseError> {
    let jobs = v.get("jobs").and_then(Value::as_array).ok_or(ParseError::NoJobs)?;
    Ok(jobs
        .iter()
        .flat_map(|j| {
            let (state, configuring) = state_of(&j["job_state"]);
            let pending = matches!(state.as_str(), "PENDING" | "");
            // squeue's exit_code: 22.05 a raw wait status (768 = exit 3); 23.02+ {status, return_code}.
            let exit_code = match &j["exit_code"] {
                Value::Number(n) => n.as_i64().map(|w| (w >> 8) as i32),
                Value::Object(o) => o.get("return_code").and_then(num).map(|c| c as i32),
                _ => None,
            };
            let job = SlurmJob {
                id: job_id(j),
                cluster: text(&j["cluster"]),
                reason: text(&j["state_reason"]),
                submit: time(&j["submit_time"]).unwrap_or(0),
                eligible: time(&j["eligible_time"]),
                // A pending job's start_time is the scheduler's estimate (or its begin time), not a start.
                start: if pending { None } else { time(&j["start_time"]) },
                estimated_start: if state == "PENDING" { time(&j["start_time"]) } else { None },
                configuring,
                end: if !pending && !matches!(state.as_str(), "RUNNING" | "COMPLETING" | "SUSPENDED") {
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
            };
            expand(j, job, &text(&j["array_task_string"]))
        })
        .collect())
}

/// Parses `sacct --json` (22.05 or 23.02+ shapes). Job steps are ignored; one record per job (a pending
/// array's one record per task).
pub fn parse_sacct(payload: &str) -> Result<Vec<SlurmJob>, ParseError> {
    sacct_jobs(&serde_json::from_str(payload)?)
}

/// [`parse_sacct`] over parsed JSON (slurmrestd's `/slurmdb/<v>/jobs` has the same shape).
pub fn sacct_jobs(v: &Value) -> Result<Vec<SlurmJob>, ParseError> {
    let jobs = v.get("jobs").and_then(Value::as_array).ok_or(ParseError::NoJobs)?;
    Ok(jobs
        .iter()
        .flat_map(|j| {
            let t = &j["time"];
            let (state, _) = state_of(&j["state"]);
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
            let job = SlurmJob {
                id: job_id(j),
                cluster: text(&j["cluster"]),
                reason: text(&j["state"]["reason"]),
                submit: time(&t["submission"]).unwrap_or(0),
                eligible: time(&t["eligible"]),
                start: time(&t["start"]),
                estimated_start: None,
                configuring: false,
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
            };
            expand(j, job, &text(&j["array"]["task"]))
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

/// How far the scheduler's estimated start must move before a new `queued` event reports it.
pub const ESTIMATE_STEP_MS: i64 = 60_000;

/// How long after its submit a job may become eligible without that counting as a dependency, hold or begin
/// time: Slurm 22.05 makes an array eligible at the scheduler pass after its submit (a second later, seen on
/// real Slurm), a plain job at its submit.
pub const ELIGIBLE_SLACK_MS: i64 = 2_000;

/// The raw reason of the `queued:dependency_or_hold` that stands for the submit -> eligible part of a wait
/// when the adapter first sees the job after that part ended.
pub const INELIGIBLE_RAW_REASON: &str = "eligible_time";

fn queued(reason: pb::WaitReason, raw: &str, message: &str, estimate_ms: Option<i64>) -> Kind {
    Kind::Queued(pb::Queued {
        reason: reason as i32,
        raw_reason: super::free_text(raw, 256),
        message: message.into(),
        estimated_start: estimate_ms.map(ms_to_timestamp),
        queue_position: None,
    })
}

/// The events a job's current view implies beyond what its memory says were emitted, and the new memory.
/// `now_ms` dates transitions Slurm keeps no time for (a changed pending reason, a requeue).
pub fn diff(m: &Mapping, j: &SlurmJob, mem: &JobMemory, now_ms: i64) -> (Vec<pb::LifecycleEvent>, JobMemory) {
    use pb::WaitReason as W;
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
        mem.estimated_start_ms = None;
    }
    let attempt = mem.restarts;
    let pending = j.state == "PENDING" && !j.reason.is_empty() && j.reason != "None";
    // squeue clamps a past estimate to its own clock: only a future one is an estimate.
    let estimate_ms = j.estimated_start.map(|s| s.saturating_mul(1000)).filter(|e| *e > now_ms && pending);
    // Eligibility is a boundary once it is past and more than ELIGIBLE_SLACK_MS after the submit (a plain job is
    // eligible at its submit, an array's tasks a scheduler pass later).
    let eligible_ms = j
        .eligible
        .map(|e| e.saturating_mul(1000))
        .filter(|e| *e > submit_ms.saturating_add(ELIGIBLE_SLACK_MS) && *e <= now_ms);
    if pending && j.reason != mem.reason {
        let reason = map_reason(&j.reason);
        let first = mem.reasons_seen == 0 && attempt == 0;
        let mut at = if first { submit_ms } else { now_ms.max(submit_ms) };
        if let Some(e) = eligible_ms.filter(|_| reason != W::DependencyOrHold) {
            if first {
                // The submit -> eligible part was a dependency, hold or begin time the adapter did not see.
                mem.reasons_seen += 1;
                let n = mem.reasons_seen;
                emit(
                    &mut mem,
                    format!("queued:{n}"),
                    submit_ms,
                    queued(W::DependencyOrHold, INELIGIBLE_RAW_REASON, "not eligible before eligible_time", None),
                );
                at = e;
            } else if map_reason(&mem.reason) == W::DependencyOrHold && e >= mem.reason_at_ms {
                at = e;
            }
        }
        mem.reasons_seen += 1;
        let n = mem.reasons_seen;
        emit(&mut mem, format!("queued:{n}"), at, queued(reason, &j.reason, "", estimate_ms));
        mem.reason = j.reason.clone();
        mem.reason_at_ms = at;
        mem.estimated_start_ms = estimate_ms;
    } else if let Some(e) =
        estimate_ms.filter(|e| pending && mem.estimated_start_ms.is_none_or(|last| (e - last).abs() > ESTIMATE_STEP_MS))
    {
        // Same reason, a new estimate.
        mem.reasons_seen += 1;
        let n = mem.reasons_seen;
        emit(
            &mut mem,
            format!("queued:{n}"),
            now_ms.max(submit_ms),
            queued(map_reason(&j.reason), &j.reason, "", Some(e)),
        );
        mem.estimated_start_ms = Some(e);
    }
    if let Some(start) = j.start {
        let at = start.saturating_mul(1000);
        emit(
            &mut mem,
            format!("assigned:{attempt}"),
            at,
            Kind::NodeAssigned(pb::NodeAssigned { nodes: j.nodes.clone(), gpu_ids: vec![] }),
        );
        if j.configuring {
            emit(
                &mut mem,
                format!("preparing:{attempt}"),
                at,
                Kind::Preparing(pb::Preparing {
                    phase: pb::PreparingPhase::Provisioning as i32,
                    message: "slurm CONFIGURING: nodes booting or being set up".into(),
                }),
            );
        } else if m.first_step_on_start {
            emit(
                &mut mem,
                format!("first_step:{attempt}"),
                at,
                Kind::FirstStep(pb::FirstStep { step: 0, origin: pb::StepOrigin::SchedulerStart as i32 }),
            );
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

/// The `done` that gives up a vanished job (see the module doc): outcome `cancelled` (the protocol has no
/// `unknown`), dated `at_ms` (the first poll that missed it), with a message saying the outcome is unknown.
/// `key` is the job's Startline id, `slurm/<cluster>/<job>`.
pub fn vanished(key: &str, mem: &JobMemory, at_ms: i64) -> (Vec<pb::LifecycleEvent>, JobMemory) {
    let mut mem = mem.clone();
    let mut out = Vec::new();
    let cluster = key.split('/').nth(1).unwrap_or("");
    if mem.emitted.insert("done".into()) {
        out.push(pb::LifecycleEvent {
            event_id: format!("{key}:done"),
            job_id: key.to_string(),
            attempt: Some(mem.restarts.saturating_add(1)),
            source: format!("slurm-adapter/{cluster}"),
            occurred_at: Some(ms_to_timestamp(at_ms)),
            kind: Some(Kind::Done(pb::Done {
                outcome: pb::Outcome::Cancelled as i32,
                exit_code: None,
                message: "slurm: vanished from squeue and accounting (sacct -j) for the grace period; \
                          outcome unknown"
                    .into(),
            })),
        });
    }
    mem.done = true;
    (out, mem)
}

/// What the adapter keeps between polls besides each job's memory (persisted under [`STATE_KEY`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdapterState {
    /// Start of the last poll whose accounting window succeeded, Unix ms: the next window starts there (minus
    /// [`SACCT_OVERLAP_MS`]).
    #[serde(default)]
    pub last_poll_ms: Option<i64>,
    /// Jobs followed and not yet done: Startline id -> Slurm job id.
    #[serde(default)]
    pub open: BTreeMap<String, String>,
    /// Open jobs neither live nor in the accounting window: Startline id -> the first poll that missed them.
    #[serde(default)]
    pub missing: BTreeMap<String, i64>,
    /// `open` was filled from the job memories once (memories written before this state existed).
    #[serde(default)]
    pub open_built: bool,
}

/// The key of [`AdapterState`] in the adapter's memory tree (job keys start with `slurm/`).
pub const STATE_KEY: &str = "@state";

/// How far before the last successful poll the next accounting window starts (clock skew between this host
/// and Slurm's, and slurmdbd writing late).
pub const SACCT_OVERLAP_MS: i64 = 5 * 60_000;

/// Updates `state.missing` for the open jobs not `seen` this poll and returns the ones to give up, with the
/// time each was first missed. `answered` holds the missing jobs accounting answered about by id (without
/// them); a job is given up once missing for `grace_ms` with accounting answering, or for three graces when
/// accounting did not answer. Jobs seen again leave `missing`.
pub fn track_vanished(
    state: &mut AdapterState,
    seen: &BTreeSet<String>,
    answered: &BTreeSet<String>,
    now_ms: i64,
    grace_ms: i64,
) -> Vec<(String, i64)> {
    state.missing.retain(|k, _| state.open.contains_key(k) && !seen.contains(k));
    let mut give_up = Vec::new();
    for key in state.open.keys().filter(|k| !seen.contains(*k)) {
        let since = *state.missing.entry(key.clone()).or_insert(now_ms);
        let waited = now_ms.saturating_sub(since);
        let limit = if answered.contains(key) { grace_ms } else { grace_ms.saturating_mul(3) };
        if waited >= limit {
            give_up.push((key.clone(), since));
        }
    }
    give_up
}

/// Merges the live view (squeue) and accounting (sacct): accounting wins for finished jobs, the live view
/// for pending reasons, estimates, CONFIGURING and exit codes.
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
                    a.estimated_start = j.estimated_start;
                    a.configuring = j.configuring;
                    a.nodes = if a.nodes.is_empty() { j.nodes.clone() } else { a.nodes.clone() };
                }
                a.eligible = a.eligible.or(j.eligible);
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
    /// `sacct --json ...` command line; the adapter adds `--starttime` (the window) or `-j` (a re-query), and
    /// drops a `--starttime`/`-S` given here.
    pub sacct: Vec<String>,
    /// Poll interval.
    pub interval: std::time::Duration,
    /// How far back the first accounting window reaches (when no poll succeeded before).
    pub lookback: std::time::Duration,
    /// How long a followed job may be missing from squeue and accounting before it is given up.
    pub vanished_grace: std::time::Duration,
    /// slurmrestd mode: read both views from this client instead of running `squeue` and `sacct`.
    pub rest: Option<std::sync::Arc<rest::Client>>,
}

/// The most job ids one `sacct -j` re-query names, and the most re-queried per poll.
const REQUERY_CHUNK: usize = 100;
const REQUERY_MAX: usize = 1000;
/// The most jobs re-queried per poll in slurmrestd mode (one `GET /slurmdb/<v>/job/<id>` each; the rest
/// wait for the next poll).
const REST_REQUERY_MAX: usize = 100;

/// The configured sacct command without a `--starttime`/`-S` of its own (the adapter sets the window).
pub fn sacct_base(cmd: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip = false;
    for a in cmd {
        if skip {
            skip = false;
        } else if a == "--starttime" || a == "-S" {
            skip = true;
        } else if !(a.starts_with("--starttime=") || a.starts_with("-S")) {
            out.push(a.clone());
        }
    }
    out
}

/// The sacct command for the window starting at `from_ms` (`uts<seconds>`: Unix time, no time zone involved).
pub fn sacct_window(base: &[String], from_ms: i64) -> Vec<String> {
    let mut c = base.to_vec();
    c.extend(["--starttime".to_string(), format!("uts{}", from_ms.div_euclid(1000).max(1_000_000))]);
    c
}

async fn run_json(cmd: &[String], env: &[(&str, &str)]) -> Result<String, PollError> {
    let failed = |m: String| PollError::new(PollErrorKind::CommandFailed, m);
    let (prog, args) = cmd.split_first().ok_or_else(|| failed("empty command".into()))?;
    let mut c = tokio::process::Command::new(prog);
    c.args(args);
    for (k, v) in env {
        if std::env::var_os(k).is_none() {
            c.env(k, v);
        }
    }
    let out = c.output().await.map_err(|e| failed(format!("{prog}: {e}")))?;
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
    stop: tokio_util::sync::CancellationToken,
) {
    super::poll_loop(Provider::Slurm, metrics, shell.interval, stop, || poll_once(&m, &shell, &spool, &memory)).await
}

fn load_state(memory: &MemoryStore) -> AdapterState {
    let mut state: AdapterState = memory.get_state(STATE_KEY).unwrap_or_default();
    if !state.open_built {
        // Memories from before this state existed: follow every job not yet done.
        for (key, mem) in memory.entries() {
            if !mem.done && key.starts_with("slurm/") {
                if let Some((_, id)) = key.rsplit_once('/') {
                    state.open.insert(key.clone(), id.to_string());
                }
            }
        }
        state.open_built = true;
    }
    state
}

/// One poll: read both views, diff every job, re-query vanished ones, spool the events, save memories and the
/// adapter's state. Returns the jobs followed and the events spooled.
pub async fn poll_once(
    m: &Mapping,
    shell: &ShellSettings,
    spool: &crate::spool::Spool,
    memory: &MemoryStore,
) -> Result<PollReport, PollError> {
    let parse = |what: &str, e: ParseError| PollError::new(PollErrorKind::Parse, format!("{what}: {e}"));
    let started = startline_proto::time::now_ms();
    let mut state = load_state(memory);
    // The full array task string (squeue cuts it at 64 bytes by default).
    let live = match &shell.rest {
        Some(c) => c.live().await?,
        None => parse_squeue(&run_json(&shell.squeue, &[("SLURM_BITSTR_LEN", "4096")]).await?)
            .map_err(|e| parse("squeue", e))?,
    };
    let base = sacct_base(&shell.sacct);
    let lookback_ms = i64::try_from(shell.lookback.as_millis()).unwrap_or(i64::MAX);
    let from = match state.last_poll_ms {
        Some(t) => t.saturating_sub(SACCT_OVERLAP_MS),
        None => started.saturating_sub(lookback_ms),
    };
    let window = match &shell.rest {
        Some(c) => c.accounting(from).await,
        None => match run_json(&sacct_window(&base, from), &[]).await {
            Ok(p) => Ok(parse_sacct(&p).map_err(|e| parse("sacct", e))?),
            Err(e) => Err(e),
        },
    };
    let (acct, window_ok) = match window {
        Ok(jobs) => (jobs, true),
        Err(e) => {
            tracing::debug!(error = %e, "sacct unavailable; using squeue only");
            (Vec::new(), false)
        }
    };
    let now = startline_proto::time::now_ms();
    let mut report = PollReport::default();
    let mut seen = BTreeSet::new();
    let follow = |j: &SlurmJob,
                  state: &mut AdapterState,
                  seen: &mut BTreeSet<String>,
                  report: &mut PollReport|
     -> Result<(), PollError> {
        let key = startline_id(m, j);
        let mem = memory.get(&key);
        let (events, new_mem) = diff(m, j, &mem, now);
        super::record(spool, memory, &key, &mem, events, &new_mem, report)?;
        if new_mem.done {
            state.open.remove(&key);
        } else if j.submit > 0 {
            state.open.insert(key.clone(), j.id.clone());
        }
        seen.insert(key);
        Ok(())
    };
    for j in merge(live, acct) {
        follow(&j, &mut state, &mut seen, &mut report)?;
    }
    // Followed jobs in neither view: ask accounting about them by id.
    let requery_max = if shell.rest.is_some() { REST_REQUERY_MAX } else { REQUERY_MAX };
    let gone: Vec<(String, String)> = state
        .open
        .iter()
        .filter(|(k, _)| !seen.contains(*k))
        .take(requery_max)
        .map(|(k, id)| (k.clone(), id.clone()))
        .collect();
    let mut answered = BTreeSet::new();
    let chunk_len = if shell.rest.is_some() { 1 } else { REQUERY_CHUNK };
    for chunk in gone.chunks(chunk_len) {
        let requery = match (&shell.rest, chunk) {
            (Some(c), [(_, id)]) => c.job(id).await,
            _ => {
                let mut cmd = base.clone();
                cmd.extend(["-j".to_string(), chunk.iter().map(|(_, id)| id.as_str()).collect::<Vec<_>>().join(",")]);
                run_json(&cmd, &[]).await.and_then(|p| parse_sacct(&p).map_err(|e| parse("sacct -j", e)))
            }
        };
        match requery {
            Ok(found) => {
                let wanted: BTreeSet<&str> = chunk.iter().map(|(k, _)| k.as_str()).collect();
                for j in found.iter().filter(|j| wanted.contains(startline_id(m, j).as_str())) {
                    follow(j, &mut state, &mut seen, &mut report)?;
                }
                answered.extend(chunk.iter().map(|(k, _)| k.clone()));
            }
            Err(e) => tracing::debug!(error = %e, "sacct -j re-query failed"),
        }
    }
    let grace_ms = i64::try_from(shell.vanished_grace.as_millis()).unwrap_or(i64::MAX);
    for (key, since) in track_vanished(&mut state, &seen, &answered, now, grace_ms) {
        let mem = memory.get(&key);
        let (events, new_mem) = vanished(&key, &mem, since);
        tracing::warn!(job = %key, "job vanished from squeue and accounting; ended with outcome unknown (cancelled)");
        super::record(spool, memory, &key, &mem, events, &new_mem, &mut report)?;
        state.open.remove(&key);
        state.missing.remove(&key);
    }
    if window_ok {
        state.last_poll_ms = Some(started);
    }
    memory.put_state(STATE_KEY, &state).map_err(|e| PollError::new(PollErrorKind::Spool, e.to_string()))?;
    super::flush(memory)?;
    Ok(report)
}

#[cfg(test)]
mod tests;
