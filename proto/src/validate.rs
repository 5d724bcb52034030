//! What makes a lifecycle event acceptable. The collector runs these checks on every event before it is stored;
//! agents may run them before spooling. Each failure names the field (as a path such as `submitted.pool_kind`)
//! and says why, in lowercase words.

use crate::pb::{self, lifecycle_event::Kind};
use crate::time::timestamp_to_ms;

/// Size limits for one event. The defaults are the documented protocol limits; the collector's config may
/// tighten the ones it exposes.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// How far `occurred_at` may be ahead of the collector's clock, in milliseconds.
    pub max_future_skew_ms: i64,
    /// Maximum number of extra labels on `submitted`.
    pub max_labels: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_future_skew_ms: 5 * 60 * 1000, max_labels: 16 }
    }
}

/// The earliest `occurred_at` accepted: 2000-01-01T00:00:00Z. Earlier times are clock faults, not history.
pub const MIN_OCCURRED_AT_MS: i64 = 946_684_800_000;

/// One reason an event was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct FieldError {
    /// The offending field as a path, e.g. `occurred_at` or `submitted.labels`.
    pub field: String,
    /// Why, in lowercase words.
    pub reason: String,
}

fn err(field: impl Into<String>, reason: impl Into<String>) -> FieldError {
    FieldError { field: field.into(), reason: reason.into() }
}

fn required_str(field: &str, value: &str, max: usize) -> Result<(), FieldError> {
    if value.is_empty() {
        return Err(err(field, "is required"));
    }
    optional_str(field, value, max)
}

fn optional_str(field: &str, value: &str, max: usize) -> Result<(), FieldError> {
    if value.len() > max {
        return Err(err(field, format!("is {} bytes, at most {max} allowed", value.len())));
    }
    if value.chars().any(char::is_control) {
        return Err(err(field, "contains control characters"));
    }
    Ok(())
}

fn known_enum<E: TryFrom<i32>>(field: &str, value: i32) -> Result<(), FieldError> {
    if value == 0 {
        return Err(err(field, "is required (unspecified)"));
    }
    E::try_from(value).map(|_| ()).map_err(|_| err(field, format!("has unknown value {value}")))
}

fn list(field: &str, values: &[String], max_items: usize, max_len: usize) -> Result<(), FieldError> {
    if values.len() > max_items {
        return Err(err(field, format!("has {} entries, at most {max_items} allowed", values.len())));
    }
    for (i, v) in values.iter().enumerate() {
        required_str(&format!("{field}[{i}]"), v, max_len)?;
    }
    Ok(())
}

fn label_key_ok(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 64
        && k.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-'))
}

/// Checks one event against the protocol's rules. `now_ms` is the receiver's clock, used only for the
/// future-skew check.
pub fn validate_event(ev: &pb::LifecycleEvent, now_ms: i64, limits: &Limits) -> Result<(), FieldError> {
    required_str("event_id", &ev.event_id, 128)?;
    required_str("job_id", &ev.job_id, 256)?;
    required_str("source", &ev.source, 128)?;
    if ev.attempt == Some(0) {
        return Err(err("attempt", "starts at 1"));
    }
    let ts = ev.occurred_at.as_ref().ok_or_else(|| err("occurred_at", "is required"))?;
    if !(0..1_000_000_000).contains(&ts.nanos) {
        return Err(err("occurred_at.nanos", "must be in 0..999999999"));
    }
    let at = timestamp_to_ms(ts);
    if at < MIN_OCCURRED_AT_MS {
        return Err(err("occurred_at", "is before 2000-01-01"));
    }
    if at > now_ms.saturating_add(limits.max_future_skew_ms) {
        return Err(err(
            "occurred_at",
            format!("is {} ms in the future, at most {} ms allowed", at - now_ms, limits.max_future_skew_ms),
        ));
    }
    let kind = ev.kind.as_ref().ok_or_else(|| err("kind", "one of submitted, queued, node_assigned, preparing, first_step, checkpoint, preempted, requeued, restarted, node_lost, done is required"))?;
    match kind {
        Kind::Submitted(s) => {
            known_enum::<pb::PoolKind>("submitted.pool_kind", s.pool_kind)?;
            required_str("submitted.provider", &s.provider, 64)?;
            required_str("submitted.pool", &s.pool, 128)?;
            known_enum::<pb::PriorityClass>("submitted.priority", s.priority)?;
            optional_str("submitted.gpu_class", &s.gpu_class, 64)?;
            if s.gpu_count > 1_000_000 {
                return Err(err("submitted.gpu_count", "is over 1000000"));
            }
            if s.node_count > 100_000 {
                return Err(err("submitted.node_count", "is over 100000"));
            }
            optional_str("submitted.region", &s.region, 64)?;
            optional_str("submitted.team", &s.team, 64)?;
            optional_str("submitted.project", &s.project, 128)?;
            optional_str("submitted.chain_id", &s.chain_id, 256)?;
            optional_str("submitted.chain_stage", &s.chain_stage, 64)?;
            if s.labels.len() > limits.max_labels {
                return Err(err(
                    "submitted.labels",
                    format!("has {} entries, at most {} allowed", s.labels.len(), limits.max_labels),
                ));
            }
            for (k, v) in &s.labels {
                if !label_key_ok(k) {
                    return Err(err("submitted.labels", format!("key {k:?} must be 1-64 bytes of [a-z0-9_.-]")));
                }
                optional_str(&format!("submitted.labels[{k}]"), v, 256)?;
            }
        }
        Kind::Queued(q) => {
            known_enum::<pb::WaitReason>("queued.reason", q.reason)?;
            optional_str("queued.raw_reason", &q.raw_reason, 256)?;
            optional_str("queued.message", &q.message, 1024)?;
        }
        Kind::NodeAssigned(n) => {
            list("node_assigned.nodes", &n.nodes, 4096, 256)?;
            list("node_assigned.gpu_ids", &n.gpu_ids, 32768, 128)?;
        }
        Kind::Preparing(p) => {
            known_enum::<pb::PreparingPhase>("preparing.phase", p.phase)?;
            optional_str("preparing.message", &p.message, 1024)?;
        }
        Kind::FirstStep(_) | Kind::Requeued(_) | Kind::Restarted(_) => {}
        Kind::Checkpoint(c) => {
            optional_str("checkpoint.uri", &c.uri, 1024)?;
            if !c.save_seconds.is_finite() || c.save_seconds < 0.0 {
                return Err(err("checkpoint.save_seconds", "must be finite and not negative"));
            }
        }
        Kind::Preempted(p) => optional_str("preempted.reason", &p.reason, 256)?,
        Kind::NodeLost(n) => {
            optional_str("node_lost.node", &n.node, 256)?;
            optional_str("node_lost.message", &n.message, 1024)?;
        }
        Kind::Done(d) => {
            known_enum::<pb::Outcome>("done.outcome", d.outcome)?;
            optional_str("done.message", &d.message, 1024)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::ms_to_timestamp;

    const NOW: i64 = 1_767_225_600_000; // 2026-01-01

    fn good() -> pb::LifecycleEvent {
        pb::LifecycleEvent {
            event_id: "e1".into(),
            job_id: "slurm/a/1".into(),
            attempt: None,
            source: "test".into(),
            occurred_at: Some(ms_to_timestamp(NOW - 1000)),
            kind: Some(Kind::Submitted(pb::Submitted {
                pool_kind: pb::PoolKind::Dedicated as i32,
                provider: "slurm".into(),
                pool: "a100".into(),
                priority: pb::PriorityClass::Urgent as i32,
                gpu_count: 8,
                ..Default::default()
            })),
        }
    }

    fn field_of(ev: &pb::LifecycleEvent) -> Option<String> {
        validate_event(ev, NOW, &Limits::default()).err().map(|e| e.field)
    }

    fn with_submitted(f: impl FnOnce(&mut pb::Submitted)) -> pb::LifecycleEvent {
        let mut ev = good();
        if let Some(Kind::Submitted(s)) = ev.kind.as_mut() {
            f(s);
        }
        ev
    }

    #[test]
    fn accepts_a_complete_event() {
        assert_eq!(field_of(&good()), None);
    }

    #[test]
    fn each_bad_field_is_named() {
        let long = "x".repeat(300);
        let cases: Vec<(pb::LifecycleEvent, &str)> = vec![
            (pb::LifecycleEvent { event_id: String::new(), ..good() }, "event_id"),
            (pb::LifecycleEvent { event_id: long.clone(), ..good() }, "event_id"),
            (pb::LifecycleEvent { job_id: String::new(), ..good() }, "job_id"),
            (pb::LifecycleEvent { job_id: "a\nb".into(), ..good() }, "job_id"),
            (pb::LifecycleEvent { source: String::new(), ..good() }, "source"),
            (pb::LifecycleEvent { attempt: Some(0), ..good() }, "attempt"),
            (pb::LifecycleEvent { occurred_at: None, ..good() }, "occurred_at"),
            (pb::LifecycleEvent { occurred_at: Some(ms_to_timestamp(NOW + 3_600_000)), ..good() }, "occurred_at"),
            (pb::LifecycleEvent { occurred_at: Some(ms_to_timestamp(1000)), ..good() }, "occurred_at"),
            (
                pb::LifecycleEvent {
                    occurred_at: Some(prost_types::Timestamp { seconds: NOW / 1000, nanos: -1 }),
                    ..good()
                },
                "occurred_at.nanos",
            ),
            (pb::LifecycleEvent { kind: None, ..good() }, "kind"),
            (with_submitted(|s| s.pool_kind = 0), "submitted.pool_kind"),
            (with_submitted(|s| s.pool_kind = 42), "submitted.pool_kind"),
            (with_submitted(|s| s.provider.clear()), "submitted.provider"),
            (with_submitted(|s| s.pool.clear()), "submitted.pool"),
            (with_submitted(|s| s.priority = 0), "submitted.priority"),
            (with_submitted(|s| s.gpu_count = 2_000_000), "submitted.gpu_count"),
            (with_submitted(|s| s.region = long.clone()), "submitted.region"),
            (
                with_submitted(|s| {
                    for i in 0..17 {
                        s.labels.insert(format!("k{i}"), "v".into());
                    }
                }),
                "submitted.labels",
            ),
            (with_submitted(|s| drop(s.labels.insert("Bad Key".into(), "v".into()))), "submitted.labels"),
            (
                pb::LifecycleEvent {
                    kind: Some(Kind::Queued(pb::Queued { reason: 0, ..Default::default() })),
                    ..good()
                },
                "queued.reason",
            ),
            (
                pb::LifecycleEvent {
                    kind: Some(Kind::Preparing(pb::Preparing { phase: 99, ..Default::default() })),
                    ..good()
                },
                "preparing.phase",
            ),
            (
                pb::LifecycleEvent {
                    kind: Some(Kind::Checkpoint(pb::Checkpoint { save_seconds: f64::NAN, ..Default::default() })),
                    ..good()
                },
                "checkpoint.save_seconds",
            ),
            (
                pb::LifecycleEvent {
                    kind: Some(Kind::NodeAssigned(pb::NodeAssigned { nodes: vec![String::new()], gpu_ids: vec![] })),
                    ..good()
                },
                "node_assigned.nodes[0]",
            ),
            (
                pb::LifecycleEvent { kind: Some(Kind::Done(pb::Done { outcome: 0, ..Default::default() })), ..good() },
                "done.outcome",
            ),
        ];
        for (i, (ev, field)) in cases.iter().enumerate() {
            assert_eq!(field_of(ev).as_deref(), Some(*field), "case {i}");
        }
    }

    #[test]
    fn future_skew_is_configurable() {
        let ev = pb::LifecycleEvent { occurred_at: Some(ms_to_timestamp(NOW + 60_000)), ..good() };
        assert!(validate_event(&ev, NOW, &Limits::default()).is_ok());
        let strict = Limits { max_future_skew_ms: 1000, ..Limits::default() };
        assert!(validate_event(&ev, NOW, &strict).is_err());
    }
}
