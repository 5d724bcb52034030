//! SLO definitions: a selector over job attributes, a threshold on time to first step, an objective and a
//! rolling window. Built from config (see `config.rs`), with the built-in defaults `urgent-start` and
//! `normal-start`.

use crate::job::JobAttrs;
use startline_proto::labels::Label;
use startline_proto::pb;
use std::sync::Arc;

/// A time-of-day window (minutes after local midnight, `from` inclusive, `to` exclusive; may wrap midnight) in a
/// time zone.
#[derive(Debug, Clone)]
pub struct Hours {
    /// Start, minutes after midnight.
    pub from_min: u32,
    /// End, minutes after midnight.
    pub to_min: u32,
    /// The zone name as configured (e.g. `Europe/Moscow`).
    pub tz_name: String,
    /// The zone, from the system's tz database.
    pub tz: Arc<tz::TimeZone>,
}

/// Checks an objective's name (`[a-z0-9-]{1,64}`, unique among `names`), naming the problem at `{at}.name`.
pub fn check_name(at: &str, name: &str, names: &mut std::collections::HashSet<String>, errs: &mut Vec<String>) {
    if name.is_empty()
        || name.len() > 64
        || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        errs.push(format!("{at}.name: {name:?} must be 1-64 characters of [a-z0-9-]"));
    } else if !names.insert(name.to_string()) {
        errs.push(format!("{at}.name: {name:?} is used twice"));
    }
}

/// An objective written in percent as a share, or `fallback` with the problem named at `{at}.objective` when it is
/// missing (`example` shows a value) or not strictly between 0 and 100.
pub fn objective_share(at: &str, percent: Option<f64>, example: &str, fallback: f64, errs: &mut Vec<String>) -> f64 {
    match percent {
        Some(o) if o > 0.0 && o < 100.0 => o / 100.0,
        Some(o) => {
            errs.push(format!("{at}.objective: {o} must be a percentage strictly between 0 and 100"));
            fallback
        }
        None => {
            errs.push(format!("{at}.objective: is required, e.g. {example}"));
            fallback
        }
    }
}

fn parse_hhmm(s: &str) -> Option<u32> {
    let (h, m) = s.trim().split_once(':')?;
    let (h, m): (u32, u32) = (h.parse().ok()?, m.parse().ok()?);
    (h <= 24 && m < 60 && h * 60 + m <= 1440).then_some(h * 60 + m)
}

impl Hours {
    /// Parses `"HH:MM-HH:MM"` (different ends; may wrap midnight) in time zone `tz` (a tz database name, default
    /// `UTC`). Errors name every field that is wrong: `("hours" | "timezone", reason)`.
    pub fn parse(hours: &str, tz: Option<&str>) -> Result<Hours, Vec<(&'static str, String)>> {
        let tz_name = tz.unwrap_or("UTC").to_string();
        let range = hours.split_once('-').and_then(|(a, b)| Some((parse_hhmm(a)?, parse_hhmm(b)?)));
        let zone = tz::TimeZone::from_posix_tz(&tz_name);
        match (range.filter(|(a, b)| a != b), zone) {
            (Some((from_min, to_min)), Ok(tz)) => Ok(Hours { from_min, to_min, tz_name, tz: Arc::new(tz) }),
            (range, zone) => {
                let mut errs = Vec::new();
                if range.is_none() {
                    errs.push(("hours", format!("{hours:?} must be \"HH:MM-HH:MM\" with different ends")));
                }
                if let Err(e) = zone {
                    errs.push(("timezone", format!("{tz_name:?} is not a known time zone: {e}")));
                }
                Err(errs)
            }
        }
    }

    /// Written back as `"HH:MM-HH:MM"`.
    pub fn text(&self) -> String {
        format!("{:02}:{:02}-{:02}:{:02}", self.from_min / 60, self.from_min % 60, self.to_min / 60, self.to_min % 60)
    }

    /// Whether `ms` falls in the window, in local time.
    pub fn contains(&self, ms: i64) -> bool {
        let secs = ms.div_euclid(1000);
        let offset = self.tz.find_local_time_type(secs).map_or(0, |t| i64::from(t.ut_offset()));
        let minute = ((secs + offset).rem_euclid(86_400) / 60) as u32;
        if self.from_min <= self.to_min {
            (self.from_min..self.to_min).contains(&minute)
        } else {
            minute >= self.from_min || minute < self.to_min
        }
    }
}

/// Which jobs an SLO covers. Empty lists match everything.
#[derive(Debug, Clone, Default)]
pub struct Selector {
    /// Priority classes.
    pub priority: Vec<pb::PriorityClass>,
    /// Pool kinds.
    pub pool_kind: Vec<pb::PoolKind>,
    /// Providers.
    pub provider: Vec<String>,
    /// Pools.
    pub pool: Vec<String>,
    /// GPU classes.
    pub gpu_class: Vec<String>,
    /// Regions or sites.
    pub region: Vec<String>,
    /// Smallest GPU count (inclusive).
    pub gpu_count_min: Option<u32>,
    /// Largest GPU count (inclusive).
    pub gpu_count_max: Option<u32>,
    /// Submit time of day.
    pub hours: Option<Hours>,
}

impl Selector {
    /// Whether a job with these attributes, submitted at `submitted_ms`, is covered.
    pub fn matches(&self, a: &JobAttrs, submitted_ms: i64) -> bool {
        fn any<T: PartialEq>(list: &[T], v: &T) -> bool {
            list.is_empty() || list.contains(v)
        }
        any(&self.priority, &a.priority)
            && any(&self.pool_kind, &a.pool_kind)
            && any(&self.provider, &a.provider)
            && any(&self.pool, &a.pool)
            && any(&self.gpu_class, &a.gpu_class)
            && any(&self.region, &a.region)
            && self.gpu_count_min.is_none_or(|m| a.gpu_count >= m)
            && self.gpu_count_max.is_none_or(|m| a.gpu_count <= m)
            && self.hours.as_ref().is_none_or(|h| h.contains(submitted_ms))
    }

    /// A JSON description for the API.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "priority": self.priority.iter().map(|p| p.label()).collect::<Vec<_>>(),
            "pool_kind": self.pool_kind.iter().map(|p| p.label()).collect::<Vec<_>>(),
            "provider": self.provider,
            "pool": self.pool,
            "gpu_class": self.gpu_class,
            "region": self.region,
            "gpu_count_min": self.gpu_count_min,
            "gpu_count_max": self.gpu_count_max,
            "hours": self.hours.as_ref().map(|h| format!(
                "{:02}:{:02}-{:02}:{:02} {}", h.from_min / 60, h.from_min % 60, h.to_min / 60, h.to_min % 60, h.tz_name
            )),
        })
    }
}

/// One start objective.
#[derive(Debug, Clone)]
pub struct SloDef {
    /// Unique name, e.g. `urgent-start`; a bounded metric label.
    pub name: String,
    /// Free text.
    pub description: String,
    /// Which jobs it covers.
    pub selector: Selector,
    /// A job is good when its first step comes within this many ms of submit.
    pub threshold_ms: i64,
    /// Target share of good jobs, in (0, 1).
    pub objective: f64,
    /// Rolling window, ms.
    pub window_ms: i64,
    /// Page on each job that crosses the threshold while still waiting.
    pub page_on_breach: bool,
    /// Leave out jobs the user cancelled before their deadline (they did not fail to start; they were
    /// withdrawn). Jobs cancelled after the deadline stay bad.
    pub exclude_cancelled: bool,
}

impl SloDef {
    /// The built-in defaults: `urgent-start` (urgent jobs, 10 min, 99%, 28 d, pages) and `normal-start` (normal
    /// jobs, 2 h, 95%, 28 d).
    pub fn defaults() -> Vec<SloDef> {
        const DAY: i64 = 86_400_000;
        vec![
            SloDef {
                name: "urgent-start".into(),
                description: "urgent jobs reach their first training step within 10 minutes".into(),
                selector: Selector { priority: vec![pb::PriorityClass::Urgent], ..Selector::default() },
                threshold_ms: 10 * 60_000,
                objective: 0.99,
                window_ms: 28 * DAY,
                page_on_breach: true,
                exclude_cancelled: true,
            },
            SloDef {
                name: "normal-start".into(),
                description: "normal jobs reach their first training step within 2 hours".into(),
                selector: Selector { priority: vec![pb::PriorityClass::Normal], ..Selector::default() },
                threshold_ms: 2 * 3_600_000,
                objective: 0.95,
                window_ms: 28 * DAY,
                page_on_breach: false,
                exclude_cancelled: true,
            },
        ]
    }
}
