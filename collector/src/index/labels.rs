//! Bounded metric attribute values. Pool kind, priority, wait reason, phase and outcome are closed enums.
//! Provider, pool, GPU class, region and team come from events, so they are bounded here: values listed in
//! `[metrics]` config are kept; with no list, the first `max_values_per_label` distinct values seen are kept.
//! Anything else is exported as `other`. Team is only exported when `metrics.team_attribute` is on (otherwise
//! it is empty here and never becomes an attribute). Job ids are never attributes.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// The value used for anything not admitted.
pub const OTHER: &str = "other";

/// One free-text attribute's admitted values.
#[derive(Debug)]
struct Admitted {
    listed: bool,
    values: HashSet<Arc<str>>,
    cap: usize,
}

impl Admitted {
    fn new(list: &[String], cap: usize) -> Self {
        Admitted { listed: !list.is_empty(), values: list.iter().map(|v| Arc::from(v.as_str())).collect(), cap }
    }

    fn admit(&mut self, v: &str) -> Arc<str> {
        if let Some(x) = self.values.get(v) {
            return x.clone();
        }
        if !self.listed && self.values.len() < self.cap && !v.is_empty() {
            let x: Arc<str> = Arc::from(v);
            self.values.insert(x.clone());
            return x;
        }
        Arc::from(if v.is_empty() { "" } else { OTHER })
    }
}

/// The admitted values of every free-text attribute.
#[derive(Debug, Clone)]
pub struct LabelLimiter(Arc<Mutex<[Admitted; 5]>>, bool);

/// Settings: explicit lists (may be empty) and the cap for unlisted attributes.
#[derive(Debug, Clone, Default)]
pub struct LabelSettings {
    /// Providers to export as themselves.
    pub providers: Vec<String>,
    /// Pools to export as themselves.
    pub pools: Vec<String>,
    /// GPU classes to export as themselves.
    pub gpu_classes: Vec<String>,
    /// Regions to export as themselves.
    pub regions: Vec<String>,
    /// Teams to export as themselves (with `team_attribute`).
    pub teams: Vec<String>,
    /// Whether `team` is an attribute of the time-to-first-step histogram and the waiting gauges.
    pub team_attribute: bool,
    /// With no list for an attribute, how many distinct values are admitted before `other`.
    pub max_values_per_label: usize,
}

/// Bounded attribute values of one job.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JobLabels {
    /// `managed` or `dedicated`.
    pub pool_kind: &'static str,
    /// Provider (bounded).
    pub provider: Arc<str>,
    /// Pool (bounded).
    pub pool: Arc<str>,
    /// `normal` or `urgent`.
    pub priority: &'static str,
    /// GPU class (bounded).
    pub gpu_class: Arc<str>,
    /// Region (bounded).
    pub region: Arc<str>,
    /// Team (bounded); empty when `metrics.team_attribute` is off.
    pub team: Arc<str>,
}

impl LabelLimiter {
    /// A limiter for these settings.
    pub fn new(s: &LabelSettings) -> Self {
        let cap = s.max_values_per_label;
        LabelLimiter(
            Arc::new(Mutex::new([
                Admitted::new(&s.providers, cap),
                Admitted::new(&s.pools, cap),
                Admitted::new(&s.gpu_classes, cap),
                Admitted::new(&s.regions, cap),
                Admitted::new(&s.teams, cap),
            ])),
            s.team_attribute,
        )
    }

    /// Whether `team` is exported.
    pub fn team_attribute(&self) -> bool {
        self.1
    }

    /// The bounded label of a pool name.
    pub fn pool(&self, pool: &str) -> Arc<str> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())[1].admit(pool)
    }

    /// The bounded labels of a job's attributes.
    pub fn job(&self, a: &crate::job::JobAttrs) -> JobLabels {
        use startline_proto::labels::Label;
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        JobLabels {
            pool_kind: a.pool_kind.label(),
            provider: g[0].admit(&a.provider),
            pool: g[1].admit(&a.pool),
            priority: a.priority.label(),
            gpu_class: g[2].admit(&a.gpu_class),
            region: g[3].admit(&a.region),
            team: if self.1 { g[4].admit(&a.team) } else { Arc::from("") },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlisted_values_are_capped_and_listed_values_are_exact() {
        let mut a = Admitted::new(&[], 2);
        assert_eq!(&*a.admit("x"), "x");
        assert_eq!(&*a.admit("y"), "y");
        assert_eq!(&*a.admit("z"), OTHER);
        assert_eq!(&*a.admit("x"), "x");
        let mut l = Admitted::new(&["a100".to_string()], 100);
        assert_eq!(&*l.admit("a100"), "a100");
        assert_eq!(&*l.admit("h100"), OTHER);
    }
}
