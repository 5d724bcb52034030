//! `startline-agent tail`: follows the collector's stream out (`StreamService.Subscribe`) and prints each record,
//! one line each (JSON or text). Resumes after the last cursor it printed whenever the call ends (collector
//! restart, a slow-subscriber disconnect, a network break), so the output has no gaps and no repeats; with
//! `--cursor-file` the position also survives a restart of `tail` itself. A cursor older than the collector's
//! retained stream ends it with an error (the records in between are gone) rather than silently skipping.

use crate::uplink::Publisher;
use prost_types::Timestamp;
use startline_proto::pb::{self, stream_record::Record};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;
use tonic::Code;

/// How `tail` runs.
#[derive(Debug, Clone)]
pub struct TailOptions {
    /// The subscription (its `after_cursor` is replaced by the resume position).
    pub request: pb::SubscribeRequest,
    /// One JSON object per line (else text).
    pub json: bool,
    /// Stop after this many records (progress records not counted).
    pub limit: Option<u64>,
    /// Where the last printed cursor is kept (read at start, written after each record).
    pub cursor_file: Option<PathBuf>,
    /// Stop when the call ends instead of resuming.
    pub no_resume: bool,
}

/// Why `tail` stopped.
#[derive(Debug, thiserror::Error)]
pub enum TailError {
    /// The collector refused the subscription (bad filter, cursor out of range, credentials).
    #[error("collector refused the subscription: {0}")]
    Refused(tonic::Status),
    /// The call ended and `--no-resume` was given.
    #[error("stream ended: {0}")]
    Ended(tonic::Status),
    /// Output or the cursor file failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The cursor file does not hold a cursor.
    #[error("cursor file {path}: {why}")]
    CursorFile {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
}

/// A record's time as RFC 3339 with milliseconds, UTC ([`startline_proto::rfc3339::format_ms`]); empty when unset.
fn ts(t: &Option<Timestamp>) -> String {
    t.as_ref().map(startline_proto::time::timestamp_to_ms).map(startline_proto::rfc3339::format_ms).unwrap_or_default()
}

fn event_kind(e: &pb::LifecycleEvent) -> (&'static str, serde_json::Value) {
    use pb::lifecycle_event::Kind;
    use serde_json::json;
    use startline_proto::labels::Label;
    let label = |l: Option<&'static str>| l.unwrap_or("unspecified");
    match &e.kind {
        Some(Kind::Submitted(s)) => (
            "submitted",
            json!({"pool": s.pool, "provider": s.provider, "gpu_count": s.gpu_count,
                   "priority": label(pb::PriorityClass::try_from(s.priority).ok().map(Label::label))}),
        ),
        Some(Kind::Queued(q)) => (
            "queued",
            json!({"reason": label(pb::WaitReason::try_from(q.reason).ok().map(Label::label)), "raw_reason": q.raw_reason}),
        ),
        Some(Kind::NodeAssigned(n)) => ("node_assigned", json!({"nodes": n.nodes})),
        Some(Kind::Preparing(p)) => {
            ("preparing", json!({"phase": label(pb::PreparingPhase::try_from(p.phase).ok().map(Label::label))}))
        }
        Some(Kind::FirstStep(f)) => (
            "first_step",
            json!({"step": f.step, "origin": label(pb::StepOrigin::try_from(f.origin).ok().map(Label::label))}),
        ),
        Some(Kind::Checkpoint(c)) => ("checkpoint", json!({"step": c.step})),
        Some(Kind::Preempted(_)) => ("preempted", json!({})),
        Some(Kind::Requeued(_)) => ("requeued", json!({})),
        Some(Kind::Restarted(_)) => ("restarted", json!({})),
        Some(Kind::NodeLost(n)) => ("node_lost", json!({"node": n.node})),
        Some(Kind::Done(d)) => {
            ("done", json!({"outcome": label(pb::Outcome::try_from(d.outcome).ok().map(Label::label))}))
        }
        None => ("unknown", json!({})),
    }
}

/// A record as one JSON object.
pub fn to_json(r: &pb::StreamRecord) -> serde_json::Value {
    use serde_json::json;
    let mut v = json!({
        "cursor": r.cursor,
        "recorded_at": ts(&r.recorded_at),
    });
    let o = v.as_object_mut().expect("object");
    for (k, s) in [("job_id", &r.job_id), ("pool", &r.pool), ("team", &r.team)] {
        if !s.is_empty() {
            o.insert(k.into(), json!(s));
        }
    }
    if let Ok(p) = pb::PriorityClass::try_from(r.priority) {
        if p != pb::PriorityClass::Unspecified {
            o.insert("priority".into(), json!(startline_proto::labels::Label::label(p)));
        }
    }
    match &r.record {
        Some(Record::Event(a)) => {
            o.insert("type".into(), json!("event"));
            o.insert("seq".into(), json!(a.seq));
            if let Some(e) = &a.event {
                let (kind, detail) = event_kind(e);
                o.insert(
                    "event".into(),
                    json!({"kind": kind, "event_id": e.event_id, "source": e.source,
                           "occurred_at": ts(&e.occurred_at), "attempt": e.attempt, "detail": detail}),
                );
            }
        }
        Some(Record::Change(c)) => {
            o.insert("type".into(), json!("change"));
            o.insert(
                "change".into(),
                json!({"event_seq": c.event_seq, "previous_state": c.previous_state, "state": c.state,
                       "previous_segment": c.previous_segment, "segment": c.segment, "outcome": c.outcome,
                       "resync": c.resync,
                       "expected_start": c.expected_start.as_ref().map(|e| json!({"at": ts(&e.at), "low": ts(&e.low),
                           "high": ts(&e.high), "basis": e.basis, "comparable_jobs": e.comparable_jobs,
                           "waited_seconds": e.waited_seconds})),
                       "slo_decisions": c.slo_decisions.iter().map(|d| json!({"slo": d.slo, "verdict": d.verdict,
                           "time_to_first_step_seconds": d.time_to_first_step_seconds,
                           "first_step_origin": pb::StepOrigin::try_from(d.first_step_origin)
                               .map_or("unspecified", startline_proto::labels::Label::label)}))
                           .collect::<Vec<_>>()}),
            );
        }
        Some(Record::Alert(a)) => {
            o.insert("type".into(), json!("alert"));
            o.insert(
                "alert".into(),
                json!({"key": a.key, "status": a.status, "labels": a.labels, "annotations": a.annotations,
                       "starts_at": ts(&a.starts_at), "ends_at": a.ends_at.map(|t| ts(&Some(t)))}),
            );
        }
        Some(Record::Progress(_)) => {
            o.insert("type".into(), json!("progress"));
        }
        None => {
            o.insert("type".into(), json!("unknown"));
        }
    }
    v
}

/// A record as one line of text.
pub fn to_text(r: &pb::StreamRecord) -> String {
    let head =
        format!("{:>10}  {}  {}", r.cursor, ts(&r.recorded_at), if r.job_id.is_empty() { "-" } else { &r.job_id });
    match &r.record {
        Some(Record::Event(a)) => {
            let (kind, detail) = a.event.as_ref().map(event_kind).unwrap_or(("unknown", serde_json::Value::Null));
            format!("{head}  event   {kind} {detail}")
        }
        Some(Record::Change(c)) => {
            let mut s = format!("{head}  change  {} -> {}", or_dash(&c.previous_state), or_dash(&c.state));
            if c.segment != c.previous_segment {
                s.push_str(&format!(" [{} -> {}]", or_dash(&c.previous_segment), or_dash(&c.segment)));
            }
            if !c.outcome.is_empty() {
                s.push_str(&format!(" outcome={}", c.outcome));
            }
            for d in &c.slo_decisions {
                s.push_str(&format!(" slo {}={}", d.slo, d.verdict));
            }
            if c.resync {
                s.push_str(" (resync)");
            }
            if let Some(e) = &c.expected_start {
                s.push_str(&format!(
                    " expected start {} (80%: {} - {}) basis {}",
                    ts(&e.at),
                    ts(&e.low),
                    ts(&e.high),
                    e.basis
                ));
            }
            s
        }
        Some(Record::Alert(a)) => format!(
            "{head}  alert   {} {} {}",
            a.labels.get("alertname").map(String::as_str).unwrap_or("-"),
            a.status,
            a.key
        ),
        Some(Record::Progress(_)) => format!("{head}  progress"),
        None => format!("{head}  unknown"),
    }
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}

fn read_cursor(path: &PathBuf) -> Result<Option<u64>, TailError> {
    match std::fs::read_to_string(path) {
        Ok(s) => s
            .trim()
            .parse::<u64>()
            .map(Some)
            .map_err(|e| TailError::CursorFile { path: path.display().to_string(), why: format!("not a cursor: {e}") }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn write_cursor(path: &PathBuf, cursor: u64) -> Result<(), TailError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{cursor}\n"))?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Whether `tail` resumes after a call ends with this status.
fn resumable(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable
            | Code::ResourceExhausted
            | Code::Unknown
            | Code::Internal
            | Code::Cancelled
            | Code::DeadlineExceeded
    )
}

/// Follows the stream until `limit` records were printed, or forever; returns the records printed.
pub async fn run(up: &mut Publisher, opts: TailOptions, out: &mut (impl Write + Send)) -> Result<u64, TailError> {
    let mut after = opts.request.after_cursor;
    if let Some(p) = &opts.cursor_file {
        if let Some(c) = read_cursor(p)? {
            after = Some(c);
        }
    }
    let mut printed = 0u64;
    let mut backoff = Duration::from_millis(200);
    loop {
        let mut req = opts.request.clone();
        req.after_cursor = after;
        let mut stream = match up.subscribe(req).await {
            Ok(s) => s,
            Err(s) if resumable(&s) && !opts.no_resume => {
                tracing::warn!(status = %s, "cannot subscribe; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
                continue;
            }
            Err(s) => return Err(TailError::Refused(s)),
        };
        let ended = loop {
            match stream.message().await {
                Ok(Some(r)) => {
                    backoff = Duration::from_millis(200);
                    after = Some(r.cursor);
                    if !matches!(r.record, Some(Record::Progress(_))) || opts.json {
                        if opts.json {
                            writeln!(out, "{}", to_json(&r))?;
                        } else {
                            writeln!(out, "{}", to_text(&r))?;
                        }
                        out.flush()?;
                    }
                    if let Some(p) = &opts.cursor_file {
                        write_cursor(p, r.cursor)?;
                    }
                    if !matches!(r.record, Some(Record::Progress(_))) {
                        printed += 1;
                        if opts.limit.is_some_and(|l| printed >= l) {
                            return Ok(printed);
                        }
                    }
                }
                Ok(None) => break tonic::Status::unavailable("the collector ended the stream"),
                Err(s) => break s,
            }
        };
        if opts.no_resume {
            return Err(TailError::Ended(ended));
        }
        if !resumable(&ended) {
            return Err(TailError::Refused(ended));
        }
        tracing::warn!(status = %ended, after = ?after, "stream ended; resuming after the last cursor");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_utc() {
        let at = |ms: i64| ts(&Some(startline_proto::time::ms_to_timestamp(ms)));
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(1_767_225_600_123), "2026-01-01T00:00:00.123Z");
        assert_eq!(at(951_827_696_007), "2000-02-29T12:34:56.007Z");
        assert_eq!(ts(&None), "");
    }

    #[test]
    fn a_change_prints_its_transition_and_decisions() {
        let r = pb::StreamRecord {
            cursor: 12,
            job_id: "slurm/a/1".into(),
            record: Some(Record::Change(pb::JobChange {
                previous_state: "queued".into(),
                state: "running".into(),
                previous_segment: "queued:capacity".into(),
                slo_decisions: vec![pb::SloDecision {
                    slo: "urgent-start".into(),
                    verdict: "good".into(),
                    time_to_first_step_seconds: Some(42.0),
                    first_step_origin: pb::StepOrigin::ContainerStart as i32,
                }],
                ..Default::default()
            })),
            ..Default::default()
        };
        let line = to_text(&r);
        assert!(line.contains("change  queued -> running [queued:capacity -> -] slo urgent-start=good"), "{line}");
        let j = to_json(&r);
        assert_eq!(j["type"], "change");
        assert_eq!(j["change"]["slo_decisions"][0]["time_to_first_step_seconds"], 42.0);
        assert_eq!(j["change"]["slo_decisions"][0]["first_step_origin"], "container_start");
        assert_eq!(j["cursor"], 12);
        assert!(j["change"]["expected_start"].is_null());
    }

    #[test]
    fn an_expected_start_change_prints_the_estimate() {
        let r = pb::StreamRecord {
            cursor: 13,
            job_id: "slurm/a/2".into(),
            record: Some(Record::Change(pb::JobChange {
                previous_state: "queued".into(),
                state: "queued".into(),
                previous_segment: "queued:capacity".into(),
                segment: "queued:capacity".into(),
                expected_start: Some(pb::ExpectedStart {
                    at: Some(prost_types::Timestamp { seconds: 1_767_225_600, nanos: 0 }),
                    low: Some(prost_types::Timestamp { seconds: 1_767_225_000, nanos: 0 }),
                    high: Some(prost_types::Timestamp { seconds: 1_767_229_200, nanos: 0 }),
                    basis: "history".into(),
                    comparable_jobs: 40,
                    waited_seconds: 90.5,
                }),
                ..Default::default()
            })),
            ..Default::default()
        };
        let line = to_text(&r);
        assert!(
            line.ends_with(
                "change  queued -> queued expected start 2026-01-01T00:00:00.000Z (80%: 2025-12-31T23:50:00.000Z - \
                 2026-01-01T01:00:00.000Z) basis history"
            ),
            "{line}"
        );
        let j = to_json(&r);
        assert_eq!(j["change"]["expected_start"]["at"], "2026-01-01T00:00:00.000Z");
        assert_eq!(j["change"]["expected_start"]["high"], "2026-01-01T01:00:00.000Z");
        assert_eq!(j["change"]["expected_start"]["comparable_jobs"], 40);
        assert_eq!(j["change"]["expected_start"]["waited_seconds"], 90.5);
    }
}
