//! What makes a lifecycle event acceptable. The collector runs these checks on every event before it is stored;
//! agents may run them before spooling. Each failure names the field (as a path such as `submitted.pool_kind`)
//! and says why, in lowercase words.

use crate::pb::{self, lifecycle_event::Kind};
use crate::time::timestamp_to_ms;
use icu_properties::props::GeneralCategory;
use icu_properties::{CodePointMapData, CodePointSetData};

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

/// Free text (messages, reasons, URIs, label values): bounded, no control characters. Format characters are
/// allowed here: they are part of ordinary text (emoji joiners, soft hyphens, right-to-left marks).
fn optional_str(field: &str, value: &str, max: usize) -> Result<(), FieldError> {
    if value.len() > max {
        return Err(err(field, format!("is {} bytes, at most {max} allowed", value.len())));
    }
    if value.chars().any(char::is_control) {
        return Err(err(field, "contains control characters"));
    }
    Ok(())
}

/// Characters that are none of the properties below yet render as blank space in common fonts (the Braille
/// blank, the null notehead), found as "invisible" in Unicode's confusables data and lists of invisible
/// characters. Hangul fillers (U+115F, U+1160, U+3164, U+FFA0) are Default_Ignorable_Code_Point already.
const BLANK_GLYPHS: &[char] = &['\u{2800}', '\u{1D159}'];

/// Whether `c` is a format character (general category Cf, from ICU4X's Unicode data).
pub fn is_format_char(c: char) -> bool {
    general_category(c) == GeneralCategory::Format
}

fn general_category(c: char) -> GeneralCategory {
    CodePointMapData::<GeneralCategory>::new().get(c)
}

/// Why `c` may not appear in an id, if it may not. The rule, in this order (the first that applies names it):
/// general category Cc (control), Cf (format: zero-width spaces and joiners, bidi controls, the BOM, soft hyphen,
/// tags), Zl and Zp (line and paragraph separators), Zs other than U+0020 (no-break, en, em, ideographic... spaces),
/// Co (private use: no agreed glyph) and Cs (surrogates, which a Rust string cannot hold anyway); then the
/// properties Default_Ignorable_Code_Point (variation selectors U+FE00-FE0F and U+E0100-E01EF, the combining
/// grapheme joiner, Hangul fillers, Mongolian free variation selectors...), White_Space and
/// Noncharacter_Code_Point; then the [`BLANK_GLYPHS`]. The properties come from ICU4X's compiled Unicode data
/// (`icu_properties`), so a newer Unicode version only adds to them. ASCII space stays allowed.
pub fn invisible_in_id(c: char) -> Option<&'static str> {
    use icu_properties::props::{DefaultIgnorableCodePoint, NoncharacterCodePoint, WhiteSpace};
    if c == ' ' {
        return None;
    }
    let why = match general_category(c) {
        GeneralCategory::Control => "control character",
        GeneralCategory::Format => "invisible format character",
        GeneralCategory::LineSeparator | GeneralCategory::ParagraphSeparator => "line or paragraph separator",
        GeneralCategory::SpaceSeparator => "space other than ASCII space",
        GeneralCategory::PrivateUse => "private-use character",
        GeneralCategory::Surrogate => "surrogate",
        _ if CodePointSetData::new::<DefaultIgnorableCodePoint>().contains(c) => {
            "default-ignorable (invisible) character"
        }
        _ if CodePointSetData::new::<WhiteSpace>().contains(c) => "white space character",
        _ if CodePointSetData::new::<NoncharacterCodePoint>().contains(c) => "noncharacter",
        _ if BLANK_GLYPHS.contains(&c) => "blank character",
        _ => return None,
    };
    Some(why)
}

/// Why a path-like id (`job_id`, `submitted.chain_id`, node names) is not in its one spelling, if it is not: a
/// `.` or `..` segment between slashes, or an empty one (`//`). Prefix rules (`job_id_prefixes`,
/// `node_prefixes`, a chain SLO's `chain_id_prefix`) compare ids as strings, and `a/../b` would pass a prefix `a/`
/// yet name `b` wherever paths are normalized (URLs, the API's `/api/v1/jobs/{id}` in a browser).
pub fn unnormalized_path(value: &str) -> Option<&'static str> {
    let segments: Vec<&str> = value.split('/').collect();
    let last = segments.len() - 1;
    for (i, seg) in segments.iter().enumerate() {
        match *seg {
            "." | ".." => return Some("a \".\" or \"..\" path segment"),
            "" if i != 0 && i != last => return Some("an empty path segment (\"//\")"),
            _ => {}
        }
    }
    None
}

/// [`optional_id`] for a path-like id: also in its one spelling ([`unnormalized_path`]).
fn path_id(field: &str, value: &str, max: usize, required: bool) -> Result<(), FieldError> {
    if required {
        required_id(field, value, max)?;
    } else {
        optional_id(field, value, max)?;
    }
    match unnormalized_path(value) {
        Some(what) => {
            Err(err(field, format!("contains {what}; ids are compared as written, so they must be normalized")))
        }
        None => Ok(()),
    }
}

/// Checks one id-like value (an id, an attribute, a node name) against the rules events' ids follow: at most
/// `max` bytes, no invisible character ([`invisible_in_id`]), and, for `path`, no `.`/`..`/empty segments. For
/// other messages than events (health readings) to share the rule.
pub fn check_id(field: &str, value: &str, max: usize, path: bool) -> Result<(), FieldError> {
    if path {
        path_id(field, value, max, true)
    } else {
        required_id(field, value, max)
    }
}

/// An identifier or attribute (ids, provider, pool, node names...): required, bounded, and made of visible
/// characters only.
fn required_id(field: &str, value: &str, max: usize) -> Result<(), FieldError> {
    if value.is_empty() {
        return Err(err(field, "is required"));
    }
    optional_id(field, value, max)
}

/// Like [`required_id`], but may be empty.
fn optional_id(field: &str, value: &str, max: usize) -> Result<(), FieldError> {
    if value.len() > max {
        return Err(err(field, format!("is {} bytes, at most {max} allowed", value.len())));
    }
    if let Some((c, what)) = value.chars().find_map(|c| invisible_in_id(c).map(|w| (c, w))) {
        return Err(err(
            field,
            format!(
                "contains {what} U+{:04X}; ids must be visible text (no control, format, invisible or non-ASCII space \
                 characters)",
                c as u32
            ),
        ));
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
        required_id(&format!("{field}[{i}]"), v, max_len)?;
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
    required_id("event_id", &ev.event_id, 128)?;
    path_id("job_id", &ev.job_id, 256, true)?;
    required_id("source", &ev.source, 128)?;
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
            required_id("submitted.provider", &s.provider, 64)?;
            required_id("submitted.pool", &s.pool, 128)?;
            known_enum::<pb::PriorityClass>("submitted.priority", s.priority)?;
            optional_id("submitted.gpu_class", &s.gpu_class, 64)?;
            if s.gpu_count > 1_000_000 {
                return Err(err("submitted.gpu_count", "is over 1000000"));
            }
            if s.node_count > 100_000 {
                return Err(err("submitted.node_count", "is over 100000"));
            }
            optional_id("submitted.region", &s.region, 64)?;
            optional_id("submitted.team", &s.team, 64)?;
            optional_id("submitted.project", &s.project, 128)?;
            path_id("submitted.chain_id", &s.chain_id, 256, false)?;
            optional_id("submitted.chain_stage", &s.chain_stage, 64)?;
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
            // An estimate may lie far in the future (a scheduler's backlog): only its shape and a floor are checked.
            if let Some(est) = &q.estimated_start {
                if !(0..1_000_000_000).contains(&est.nanos) {
                    return Err(err("queued.estimated_start.nanos", "must be in 0..999999999"));
                }
                if timestamp_to_ms(est) < MIN_OCCURRED_AT_MS {
                    return Err(err("queued.estimated_start", "is before 2000-01-01"));
                }
            }
        }
        Kind::NodeAssigned(n) => {
            if n.nodes.len() > 4096 {
                return Err(err("node_assigned.nodes", format!("has {} entries, at most 4096 allowed", n.nodes.len())));
            }
            for (i, node) in n.nodes.iter().enumerate() {
                path_id(&format!("node_assigned.nodes[{i}]"), node, 256, true)?;
            }
            list("node_assigned.gpu_ids", &n.gpu_ids, 32768, 128)?;
        }
        Kind::Preparing(p) => {
            known_enum::<pb::PreparingPhase>("preparing.phase", p.phase)?;
            optional_str("preparing.message", &p.message, 1024)?;
        }
        Kind::FirstStep(f) => {
            // Unspecified is allowed: older agents do not send it.
            if pb::StepOrigin::try_from(f.origin).is_err() {
                return Err(err("first_step.origin", format!("has unknown value {}", f.origin)));
            }
        }
        Kind::Requeued(_) | Kind::Restarted(_) => {}
        Kind::Checkpoint(c) => {
            optional_str("checkpoint.uri", &c.uri, 1024)?;
            if !c.save_seconds.is_finite() || c.save_seconds < 0.0 {
                return Err(err("checkpoint.save_seconds", "must be finite and not negative"));
            }
        }
        Kind::Preempted(p) => optional_str("preempted.reason", &p.reason, 256)?,
        Kind::NodeLost(n) => {
            path_id("node_lost.node", &n.node, 256, false)?;
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
    fn first_step_origin_may_be_unset_or_any_known_value() {
        for origin in 0..=3 {
            let ev = pb::LifecycleEvent { kind: Some(Kind::FirstStep(pb::FirstStep { step: 1, origin })), ..good() };
            assert_eq!(field_of(&ev), None, "origin {origin}");
        }
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
                pb::LifecycleEvent { kind: Some(Kind::FirstStep(pb::FirstStep { step: 1, origin: 99 })), ..good() },
                "first_step.origin",
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

    /// Builds a valid event with the given value in one field.
    type WithValue = fn(&str) -> pb::LifecycleEvent;

    /// Every id-like field, and a setter that puts a value into it.
    fn id_fields() -> Vec<(&'static str, WithValue)> {
        fn node_assigned(nodes: Vec<String>, gpu_ids: Vec<String>) -> pb::LifecycleEvent {
            pb::LifecycleEvent { kind: Some(Kind::NodeAssigned(pb::NodeAssigned { nodes, gpu_ids })), ..good() }
        }
        vec![
            ("event_id", |v| pb::LifecycleEvent { event_id: v.into(), ..good() }),
            ("job_id", |v| pb::LifecycleEvent { job_id: v.into(), ..good() }),
            ("source", |v| pb::LifecycleEvent { source: v.into(), ..good() }),
            ("submitted.provider", |v| with_submitted(|s| s.provider = v.into())),
            ("submitted.pool", |v| with_submitted(|s| s.pool = v.into())),
            ("submitted.gpu_class", |v| with_submitted(|s| s.gpu_class = v.into())),
            ("submitted.region", |v| with_submitted(|s| s.region = v.into())),
            ("submitted.team", |v| with_submitted(|s| s.team = v.into())),
            ("submitted.project", |v| with_submitted(|s| s.project = v.into())),
            ("submitted.chain_id", |v| with_submitted(|s| s.chain_id = v.into())),
            ("submitted.chain_stage", |v| with_submitted(|s| s.chain_stage = v.into())),
            ("node_assigned.nodes[1]", |v| node_assigned(vec!["n0".into(), v.into()], vec![])),
            ("node_assigned.gpu_ids[0]", |v| node_assigned(vec!["n0".into()], vec![v.into()])),
            ("node_lost.node", |v| pb::LifecycleEvent {
                kind: Some(Kind::NodeLost(pb::NodeLost { node: v.into(), message: String::new() })),
                ..good()
            }),
        ]
    }

    #[test]
    fn ids_with_invisible_control_or_format_characters_are_rejected_naming_field_and_character() {
        let invisible: &[(char, &str)] = &[
            ('\u{0000}', "control character U+0000"),
            ('\u{0009}', "control character U+0009"),
            ('\u{007F}', "control character U+007F"),
            ('\u{0085}', "control character U+0085"),
            ('\u{00AD}', "format character U+00AD"),
            ('\u{061C}', "format character U+061C"),
            ('\u{180E}', "format character U+180E"),
            ('\u{200B}', "format character U+200B"),
            ('\u{200C}', "format character U+200C"),
            ('\u{200D}', "format character U+200D"),
            ('\u{200E}', "format character U+200E"),
            ('\u{200F}', "format character U+200F"),
            ('\u{202A}', "format character U+202A"),
            ('\u{202E}', "format character U+202E"),
            ('\u{2060}', "format character U+2060"),
            ('\u{2064}', "format character U+2064"),
            ('\u{2066}', "format character U+2066"),
            ('\u{2069}', "format character U+2069"),
            ('\u{206F}', "format character U+206F"),
            ('\u{FEFF}', "format character U+FEFF"),
            ('\u{FFF9}', "format character U+FFF9"),
            ('\u{1343F}', "format character U+1343F"),
            ('\u{1D173}', "format character U+1D173"),
            ('\u{E0001}', "format character U+E0001"),
            ('\u{E0041}', "format character U+E0041"),
            ('\u{E007F}', "format character U+E007F"),
            ('\u{2028}', "separator U+2028"),
            ('\u{2029}', "separator U+2029"),
        ];
        for (field, set) in id_fields() {
            assert_eq!(field_of(&set("visible-id_1.2/3:4@é日本")), None, "{field}: a visible id is fine");
            for (c, why) in invisible {
                for value in [format!("{c}job"), format!("jo{c}b"), format!("job{c}")] {
                    let e = validate_event(&set(&value), NOW, &Limits::default())
                        .expect_err(&format!("{field} with U+{:04X}", *c as u32));
                    assert_eq!(e.field, field, "U+{:04X}", *c as u32);
                    assert!(e.reason.contains(why), "{field}: {:?} does not say {why:?}", e.reason);
                }
            }
        }
    }

    #[test]
    fn free_text_keeps_format_characters_but_not_control_characters() {
        let text = "waiting \u{200D}\u{00AD}\u{200F}";
        let queued = |message: &str| pb::LifecycleEvent {
            kind: Some(Kind::Queued(pb::Queued {
                reason: pb::WaitReason::Capacity as i32,
                raw_reason: String::new(),
                message: message.into(),
                estimated_start: None,
                queue_position: None,
            })),
            ..good()
        };
        assert_eq!(field_of(&queued(text)), None);
        assert_eq!(field_of(&queued("a\u{0007}b")).as_deref(), Some("queued.message"));
    }

    /// The id rule, class by class: each character with the reason it is refused (or `None`: allowed).
    #[test]
    fn the_id_rule_refuses_every_class_of_invisible_character() {
        let table: &[(char, Option<&str>)] = &[
            // Allowed: letters, digits, punctuation, symbols, ASCII space, marks that combine visibly.
            ('a', None),
            ('Z', None),
            ('0', None),
            (' ', None),
            ('-', None),
            ('/', None),
            ('é', None),
            ('日', None),
            ('\u{0301}', None), // combining acute accent (Mn, not default-ignorable)
            ('\u{1F600}', None),
            ('\u{2764}', None),
            ('\u{FFFD}', None),
            // Cc
            ('\u{0000}', Some("control character")),
            ('\u{0009}', Some("control character")),
            ('\u{0085}', Some("control character")),
            ('\u{009F}', Some("control character")),
            // Cf
            ('\u{00AD}', Some("invisible format character")),
            ('\u{200B}', Some("invisible format character")),
            ('\u{2066}', Some("invisible format character")),
            ('\u{FEFF}', Some("invisible format character")),
            ('\u{E0041}', Some("invisible format character")),
            // Zl, Zp
            ('\u{2028}', Some("line or paragraph separator")),
            ('\u{2029}', Some("line or paragraph separator")),
            // Zs other than ASCII space
            ('\u{00A0}', Some("space other than ASCII space")),
            ('\u{1680}', Some("space other than ASCII space")),
            ('\u{2000}', Some("space other than ASCII space")),
            ('\u{200A}', Some("space other than ASCII space")),
            ('\u{202F}', Some("space other than ASCII space")),
            ('\u{205F}', Some("space other than ASCII space")),
            ('\u{3000}', Some("space other than ASCII space")),
            // Co
            ('\u{E000}', Some("private-use character")),
            ('\u{F8FF}', Some("private-use character")),
            ('\u{F0000}', Some("private-use character")),
            ('\u{10FFFD}', Some("private-use character")),
            // Default_Ignorable_Code_Point (not Cf)
            ('\u{034F}', Some("default-ignorable")), // combining grapheme joiner
            ('\u{115F}', Some("default-ignorable")), // Hangul choseong filler
            ('\u{1160}', Some("default-ignorable")), // Hangul jungseong filler
            ('\u{17B4}', Some("default-ignorable")), // Khmer vowel inherent aq
            ('\u{180B}', Some("default-ignorable")), // Mongolian free variation selector one
            ('\u{3164}', Some("default-ignorable")), // HANGUL FILLER
            ('\u{FE00}', Some("default-ignorable")), // variation selectors
            ('\u{FE0F}', Some("default-ignorable")),
            ('\u{FFA0}', Some("default-ignorable")),  // halfwidth Hangul filler
            ('\u{E0100}', Some("default-ignorable")), // variation selectors supplement
            ('\u{E01EF}', Some("default-ignorable")),
            ('\u{E0FFF}', Some("default-ignorable")), // reserved, default-ignorable
            // Noncharacters
            ('\u{FDD0}', Some("noncharacter")),
            ('\u{FFFE}', Some("noncharacter")),
            ('\u{10FFFF}', Some("noncharacter")),
            // Blank glyphs
            ('\u{2800}', Some("blank character")),  // BRAILLE PATTERN BLANK
            ('\u{1D159}', Some("blank character")), // MUSICAL SYMBOL NULL NOTEHEAD
        ];
        for &(c, want) in table {
            let got = invisible_in_id(c);
            match want {
                None => assert_eq!(got, None, "U+{:04X} is allowed", c as u32),
                Some(w) => assert!(got.is_some_and(|g| g.starts_with(w)), "U+{:04X}: {got:?}, want {w:?}", c as u32),
            }
        }
        // Every id field refuses each of them, naming the field and the code point.
        for (field, set) in id_fields() {
            for &(c, want) in table.iter().filter(|(_, w)| w.is_some()) {
                let e = validate_event(&set(&format!("a{c}b")), NOW, &Limits::default()).expect_err(field);
                assert_eq!(e.field, field);
                assert!(e.reason.contains(&format!("U+{:04X}", c as u32)), "{}", e.reason);
                assert!(e.reason.contains(want.unwrap_or_default()), "{}", e.reason);
            }
        }
        // Cf is exactly what the general category says (the old table's edges).
        for c in ['\u{0600}', '\u{0605}', '\u{061C}', '\u{180E}', '\u{2064}', '\u{13430}', '\u{1343F}'] {
            assert!(is_format_char(c), "U+{:04X}", c as u32);
        }
        for c in ['a', ' ', '\u{200A}', '\u{2070}', '\u{FEFE}', '\u{3164}'] {
            assert!(!is_format_char(c), "U+{:04X}", c as u32);
        }
    }

    /// Path-like ids have one spelling: `.`/`..` segments and `//` are refused, so `a/../b` cannot pass a prefix
    /// `a/` while naming `b`; dots inside a segment and a leading or trailing slash are fine.
    #[test]
    fn path_like_ids_must_be_normalized() {
        let job = |v: &str| pb::LifecycleEvent { job_id: v.into(), ..good() };
        for bad in ["a/../b", "a/./b", "..", ".", "./a", "a/..", "a//b", "slurm/cluster-a/../cluster-b/1"] {
            let e = validate_event(&job(bad), NOW, &Limits::default()).expect_err(bad);
            assert_eq!(e.field, "job_id", "{bad}");
            assert!(e.reason.contains("normalized"), "{}", e.reason);
        }
        for ok in ["a/b", "a.b/c..d", "/a", "a/", "v1.2/x", "...", "a/.../b"] {
            assert_eq!(field_of(&job(ok)), None, "{ok}");
        }
        let chain = with_submitted(|s| s.chain_id = "c/../d".into());
        assert_eq!(field_of(&chain).as_deref(), Some("submitted.chain_id"));
        let nodes = pb::LifecycleEvent {
            kind: Some(Kind::NodeAssigned(pb::NodeAssigned {
                nodes: vec!["n1".into(), "a//b".into()],
                gpu_ids: vec![],
            })),
            ..good()
        };
        assert_eq!(field_of(&nodes).as_deref(), Some("node_assigned.nodes[1]"));
        let lost = pb::LifecycleEvent {
            kind: Some(Kind::NodeLost(pb::NodeLost { node: "..".into(), message: String::new() })),
            ..good()
        };
        assert_eq!(field_of(&lost).as_deref(), Some("node_lost.node"));
        assert!(check_id("reports[0].node", "a/./b", 256, true).is_err());
        assert!(check_id("reports[0].source", "a/./b", 256, false).is_ok());
    }

    #[test]
    fn an_estimated_start_is_accepted_far_ahead_but_not_malformed() {
        let queued = |est: Option<prost_types::Timestamp>| pb::LifecycleEvent {
            kind: Some(Kind::Queued(pb::Queued {
                reason: pb::WaitReason::Priority as i32,
                raw_reason: "Priority".into(),
                message: String::new(),
                estimated_start: est,
                queue_position: None,
            })),
            ..good()
        };
        assert_eq!(field_of(&queued(None)), None);
        // A year ahead of the receiver's clock: an estimate, not an occurrence, so no skew check.
        assert_eq!(field_of(&queued(Some(ms_to_timestamp(NOW + 365 * 86_400_000)))), None);
        assert_eq!(field_of(&queued(Some(ms_to_timestamp(1000)))).as_deref(), Some("queued.estimated_start"));
        let bad_nanos = prost_types::Timestamp { seconds: NOW / 1000, nanos: 1_000_000_000 };
        assert_eq!(field_of(&queued(Some(bad_nanos))).as_deref(), Some("queued.estimated_start.nanos"));
    }

    #[test]
    fn future_skew_is_configurable() {
        let ev = pb::LifecycleEvent { occurred_at: Some(ms_to_timestamp(NOW + 60_000)), ..good() };
        assert!(validate_event(&ev, NOW, &Limits::default()).is_ok());
        let strict = Limits { max_future_skew_ms: 1000, ..Limits::default() };
        assert!(validate_event(&ev, NOW, &strict).is_err());
    }
}
