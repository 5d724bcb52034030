//! JSON renderings of jobs, timelines and raw events.

use crate::job::Timeline;
// Temporary re-export: `api/jobs.rs` still imports `parse_time` from here.
pub(super) use crate::time::{format_ms, parse_time};
use serde_json::{json, Map, Value};
use startline_proto::labels::Label;
use startline_proto::pb::{self, lifecycle_event::Kind};

fn opt_time(v: Option<i64>) -> Value {
    v.map_or(Value::Null, |ms| Value::String(format_ms(ms)))
}

fn secs(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

/// The summary of a job shown in listings.
pub fn job_summary(job_id: &str, t: &Timeline, now_ms: i64) -> Value {
    let mut m = Map::new();
    m.insert("job_id".into(), json!(job_id));
    m.insert("state".into(), json!(t.state.label()));
    if let Some(a) = &t.attrs {
        m.insert("pool_kind".into(), json!(a.pool_kind.label()));
        m.insert("provider".into(), json!(a.provider));
        m.insert("pool".into(), json!(a.pool));
        m.insert("priority".into(), json!(a.priority.label()));
        m.insert("gpu_class".into(), json!(a.gpu_class));
        m.insert("gpu_count".into(), json!(a.gpu_count));
        m.insert("region".into(), json!(a.region));
        m.insert("team".into(), json!(a.team));
        m.insert("project".into(), json!(a.project));
    }
    m.insert("submitted_at".into(), opt_time(t.submitted_at));
    m.insert("first_step_at".into(), opt_time(t.first_step_at));
    m.insert("done_at".into(), opt_time(t.done_at));
    m.insert("outcome".into(), t.outcome.map_or(Value::Null, |o| json!(o.label())));
    m.insert("time_to_first_step_seconds".into(), t.time_to_first_step_ms().map_or(Value::Null, |v| json!(secs(v))));
    m.insert(
        "waiting_seconds".into(),
        t.wait_started_at.map_or(Value::Null, |since| json!(secs((now_ms - since).max(0)))),
    );
    m.insert(
        "current_wait".into(),
        t.current_wait.map_or(Value::Null, |(seg, since)| {
            json!({"segment": seg.label(), "since": format_ms(since), "raw_reason": t.current_raw_reason})
        }),
    );
    Value::Object(m)
}

/// The full timeline of a job.
pub fn timeline_detail(t: &Timeline, now_ms: i64) -> Value {
    let mut initial: Map<String, Value> =
        t.initial_wait_ms.iter().map(|(s, ms)| (s.label(), json!(secs(*ms)))).collect();
    // A job still in its initial wait: the open segment counts up to now.
    if t.first_step_at.is_none() && t.done_at.is_none() {
        if let Some((seg, since)) = t.current_wait {
            let e = initial.entry(seg.label()).or_insert(json!(0.0));
            *e = json!(e.as_f64().unwrap_or(0.0) + secs((now_ms - since).max(0)));
        }
    }
    json!({
        "milestones": {
            "submitted": opt_time(t.submitted_at),
            "first_queued": opt_time(t.first_queued_at),
            "node_assigned": opt_time(t.node_assigned_at),
            "preparing": opt_time(t.preparing_at),
            "first_step": opt_time(t.first_step_at),
            "last_checkpoint": t.last_checkpoint.map_or(Value::Null, |(at, step)| json!({"at": format_ms(at), "step": step})),
            "done": opt_time(t.done_at),
        },
        "initial_wait_seconds": initial,
        "requeue_wait_seconds": secs(t.requeue_wait_ms),
        "runs": t.runs,
        "attempts": t.attempts,
        "preemptions": t.preemptions,
        "node_losses": t.node_losses,
        "lost_work_seconds": secs(t.lost_work_ms),
        "lost_gpu_seconds": t.lost_gpu_seconds(),
        "lost_steps": t.lost_steps,
        "exit_code": t.exit_code,
        "ignored_after_done": t.ignored_after_done,
    })
}

/// The job's attributes in full (including chain and labels).
pub fn attrs_detail(t: &Timeline) -> Value {
    match &t.attrs {
        None => Value::Null,
        Some(a) => json!({
            "node_count": a.node_count,
            "chain_id": a.chain_id,
            "chain_stage": a.chain_stage,
            "labels": a.labels,
        }),
    }
}

/// One raw event as stored.
pub fn event_json(seq: u64, ev: &pb::LifecycleEvent) -> Value {
    let (kind, detail) = match &ev.kind {
        None => ("none", Value::Null),
        Some(Kind::Submitted(s)) => (
            "submitted",
            json!({
                "pool_kind": s.pool_kind().label(), "provider": s.provider, "pool": s.pool,
                "priority": s.priority().label(), "gpu_class": s.gpu_class, "gpu_count": s.gpu_count,
                "node_count": s.node_count, "region": s.region, "team": s.team, "project": s.project,
                "chain_id": s.chain_id, "chain_stage": s.chain_stage, "labels": s.labels,
            }),
        ),
        Some(Kind::Queued(q)) => {
            ("queued", json!({"reason": q.reason().label(), "raw_reason": q.raw_reason, "message": q.message}))
        }
        Some(Kind::NodeAssigned(n)) => ("node_assigned", json!({"nodes": n.nodes, "gpu_ids": n.gpu_ids})),
        Some(Kind::Preparing(p)) => ("preparing", json!({"phase": p.phase().label(), "message": p.message})),
        Some(Kind::FirstStep(f)) => ("first_step", json!({"step": f.step})),
        Some(Kind::Checkpoint(c)) => {
            ("checkpoint", json!({"step": c.step, "uri": c.uri, "save_seconds": c.save_seconds}))
        }
        Some(Kind::Preempted(p)) => ("preempted", json!({"reason": p.reason, "checkpoint_saved": p.checkpoint_saved})),
        Some(Kind::Requeued(r)) => ("requeued", json!({"resume_step": r.resume_step})),
        Some(Kind::Restarted(r)) => ("restarted", json!({"resume_step": r.resume_step})),
        Some(Kind::NodeLost(n)) => ("node_lost", json!({"node": n.node, "message": n.message})),
        Some(Kind::Done(d)) => {
            ("done", json!({"outcome": d.outcome().label(), "exit_code": d.exit_code, "message": d.message}))
        }
    };
    json!({
        "seq": seq,
        "event_id": ev.event_id,
        "source": ev.source,
        "attempt": ev.attempt,
        "occurred_at": ev.occurred_at.as_ref().map(|t| format_ms(startline_proto::time::timestamp_to_ms(t))),
        "kind": kind,
        "detail": detail,
    })
}
