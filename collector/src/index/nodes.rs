//! Nodes: the `[nodes]` settings, the GPU-health readings node agents report ([`HealthBook`], kept in memory
//! and in the store's `node_health` tree), and the per-node report ([`report`]) that the API, the alert loop
//! and the metrics read: every node's placements over a window judged by [`crate::job::nodes`]'s rule.

use super::SharedIndex;
use crate::job::nodes::Reading;
use crate::job::nodes::{judge, Health, NodeStats, Rule, Tally, Verdict};
use serde::{Deserialize, Serialize};
use startline_proto::pb::PoolKind;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// `[nodes]`: the suspect-node rule (docs/concepts.md, "Suspect nodes").
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodesSection {
    /// How far back placements and health readings count (default `7d`).
    pub window: Option<String>,
    /// Family-wise false-alarm rate per pool and evaluation (default 0.01).
    pub alpha: Option<f64>,
    /// Fewest bad placements that can make a node suspect (default 3).
    pub min_bad: Option<u64>,
    /// Correctable ECC errors in the window that make a node suspect (default 1000).
    pub ecc_corrected_threshold: Option<u64>,
    /// Raise `StartlineNodeSuspect` for suspect nodes (default true).
    pub alert: Option<bool>,
    /// How often the alert loop judges every node (default `1m`; each judgement scans every job).
    pub evaluation_interval: Option<String>,
}

/// Validated `[nodes]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeSettings {
    /// The window, ms.
    pub window_ms: i64,
    /// The rule.
    pub rule: Rule,
    /// Whether to alert.
    pub alert: bool,
    /// How often the alert loop judges nodes, ms.
    pub evaluation_interval_ms: i64,
}

impl Default for NodeSettings {
    fn default() -> Self {
        NodeSettings { window_ms: 7 * 86_400_000, rule: Rule::default(), alert: true, evaluation_interval_ms: 60_000 }
    }
}

impl NodesSection {
    /// Checks the section, adding problems to `errs`.
    pub fn validate(&self, errs: &mut Vec<String>) -> NodeSettings {
        let mut s = NodeSettings::default();
        if let Some(w) = &self.window {
            match humantime::parse_duration(w) {
                Ok(d) if d.as_secs() >= 3600 && d.as_secs() <= 400 * 86_400 => s.window_ms = d.as_millis() as i64,
                Ok(_) => errs.push(format!("nodes.window: {w:?} must be between 1h and 400d")),
                Err(e) => errs.push(format!("nodes.window: {w:?} is not a duration: {e}")),
            }
        }
        if let Some(a) = self.alpha {
            if a > 0.0 && a < 1.0 {
                s.rule.alpha = a;
            } else {
                errs.push(format!("nodes.alpha: {a} must be above 0 and below 1"));
            }
        }
        if let Some(m) = self.min_bad {
            if m >= 1 {
                s.rule.min_bad = m;
            } else {
                errs.push("nodes.min_bad: must be at least 1".to_string());
            }
        }
        if let Some(t) = self.ecc_corrected_threshold {
            if t >= 1 {
                s.rule.ecc_corrected_threshold = t;
            } else {
                errs.push("nodes.ecc_corrected_threshold: must be at least 1".to_string());
            }
        }
        s.alert = self.alert.unwrap_or(true);
        if let Some(w) = &self.evaluation_interval {
            match humantime::parse_duration(w) {
                Ok(d) if d.as_millis() >= 1000 && d.as_secs() <= 86_400 => {
                    s.evaluation_interval_ms = d.as_millis() as i64
                }
                Ok(_) => errs.push(format!("nodes.evaluation_interval: {w:?} must be between 1s and 1d")),
                Err(e) => errs.push(format!("nodes.evaluation_interval: {w:?} is not a duration: {e}")),
            }
        }
        s
    }
}

/// Readings kept per node at most (older ones are dropped first).
const MAX_READINGS: usize = 2048;
/// An unchanged reading is kept only this long after the previous kept one.
const KEEP_UNCHANGED_MS: i64 = 10 * 60_000;
/// Nodes remembered at most (the one heard from least recently is forgotten first).
const MAX_NODES: usize = 100_000;

/// Health readings by node, shared by the ingest edge (writer) and the readers.
#[derive(Debug, Clone, Default)]
pub struct HealthBook(Arc<Mutex<HashMap<Arc<str>, VecDeque<Reading>>>>);

impl HealthBook {
    /// Adds a reading; returns whether it was kept (a reading identical to the previous one within
    /// [`KEEP_UNCHANGED_MS`], or older than the newest, is not).
    pub fn record(&self, node: &str, r: Reading) -> bool {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= MAX_NODES && !m.contains_key(node) {
            let oldest = m.iter().min_by_key(|(_, v)| v.back().map_or(i64::MIN, |r| r.at_ms)).map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                m.remove(&k);
            }
        }
        let q = match m.get_mut(node) {
            Some(q) => q,
            None => m.entry(Arc::from(node)).or_default(),
        };
        if let Some(last) = q.back() {
            let same =
                (last.ecc_corrected, last.ecc_uncorrected) == (r.ecc_corrected, r.ecc_uncorrected) && r.xid_errors == 0;
            if r.at_ms <= last.at_ms || (same && r.at_ms - last.at_ms < KEEP_UNCHANGED_MS) {
                return false;
            }
        }
        if q.len() >= MAX_READINGS {
            q.pop_front();
        }
        q.push_back(r);
        true
    }

    /// Error counts added in `[from, to]` (counter resets, e.g. a driver reload, count from zero), if the node
    /// reported in the window.
    pub fn window(&self, node: &str, from: i64, to: i64) -> Option<Health> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let q = m.get(node)?;
        let mut h = Health::default();
        let mut prev: Option<&Reading> = None;
        let mut seen = false;
        for r in q.iter().filter(|r| r.at_ms <= to) {
            if r.at_ms >= from {
                seen = true;
                h.last_report_ms = r.at_ms;
                h.xid_errors += r.xid_errors;
                if let Some(p) = prev {
                    h.ecc_corrected += increase(p.ecc_corrected, r.ecc_corrected);
                    h.ecc_uncorrected += increase(p.ecc_uncorrected, r.ecc_uncorrected);
                }
            }
            prev = Some(r);
        }
        seen.then_some(h)
    }

    /// The latest reading of a node.
    pub fn latest(&self, node: &str) -> Option<Reading> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get(node).and_then(|q| q.back().copied())
    }

    /// Nodes with readings.
    pub fn nodes(&self) -> Vec<Arc<str>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect()
    }
}

fn increase(before: u64, after: u64) -> u64 {
    if after >= before {
        after - before
    } else {
        after
    }
}

/// One node in the report.
#[derive(Debug, Clone)]
pub struct NodeLine {
    /// Its pool.
    pub pool: String,
    /// Its pool's kind as the jobs placed in the pool in the window say (`Unspecified` when they disagree, or
    /// for a node that only reported health).
    pub kind: PoolKind,
    /// Its name.
    pub node: Arc<str>,
    /// Its placements.
    pub stats: NodeStats,
    /// The rule's verdict.
    pub verdict: Verdict,
    /// Its health in the window, if it reported.
    pub health: Option<Health>,
}

/// Every node with placements (or health readings) in the window.
#[derive(Debug, Clone, Default)]
pub struct NodeReport {
    /// The window's start and end (Unix ms).
    pub from_ms: i64,
    /// End.
    pub to_ms: i64,
    /// Nodes, by pool then name.
    pub nodes: Vec<NodeLine>,
}

impl NodeReport {
    /// Suspect nodes.
    pub fn suspects(&self) -> impl Iterator<Item = &NodeLine> {
        self.nodes.iter().filter(|n| !n.verdict.reasons.is_empty())
    }
}

/// Per pool, nodes with placements in the window and how many are suspect, as of the alert loop's last node
/// evaluation (read by the metrics).
#[derive(Debug, Clone, Default)]
pub struct NodeBoard(Arc<Mutex<BTreeMap<String, (u64, u64)>>>);

impl NodeBoard {
    /// Replaces the figures with those of `rep`.
    pub fn publish(&self, rep: &NodeReport) {
        let mut m = BTreeMap::new();
        for n in rep.nodes.iter().filter(|n| !n.pool.is_empty()) {
            let e: &mut (u64, u64) = m.entry(n.pool.clone()).or_default();
            e.0 += 1;
            e.1 += u64::from(!n.verdict.reasons.is_empty());
        }
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = m;
    }

    /// `(pool, nodes, suspects)`.
    pub fn pools(&self) -> Vec<(String, u64, u64)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(p, (n, s))| (p.clone(), *n, *s)).collect()
    }
}

/// Builds the report over `[from, to]` by scanning every job (hot and folded) once.
pub fn report(index: &SharedIndex, health: &HealthBook, from: i64, to: i64, rule: &Rule) -> NodeReport {
    let mut tally = Tally::default();
    index.for_each_job_with_placements(4096, |id, job| tally.add(id, job.timeline, from, to));
    let mut nodes = Vec::new();
    let mut placed: std::collections::HashSet<Arc<str>> = std::collections::HashSet::new();
    for (pool, members) in &tally.pools {
        // Each node's health read once (the book's lock and a walk of its readings), for the verdict and the line.
        let healths: HashMap<&str, Option<Health>> =
            members.keys().map(|n| (&**n, health.window(n, from, to))).collect();
        let verdicts: BTreeMap<Arc<str>, Verdict> = judge(members, |n| healths.get(n).copied().flatten(), rule);
        for (name, stats) in members {
            placed.insert(name.clone());
            let Some(verdict) = verdicts.get(name).cloned() else { continue };
            nodes.push(NodeLine {
                pool: pool.clone(),
                kind: tally.kinds.get(pool).copied().unwrap_or_default(),
                node: name.clone(),
                stats: stats.clone(),
                verdict,
                health: healths.get(&**name).copied().flatten(),
            });
        }
    }
    // Nodes that reported health but ran nothing in the window: judged on health alone.
    for name in health.nodes() {
        if placed.contains(&name) {
            continue;
        }
        let Some(h) = health.window(&name, from, to) else { continue };
        let one: BTreeMap<Arc<str>, NodeStats> = [(name.clone(), NodeStats::default())].into();
        let Some(verdict) = judge(&one, |_| Some(h), rule).remove(&name) else { continue };
        nodes.push(NodeLine {
            pool: String::new(),
            kind: PoolKind::Unspecified,
            node: name,
            stats: NodeStats::default(),
            verdict,
            health: Some(h),
        });
    }
    nodes.sort_by(|a, b| (&a.pool, &a.node).cmp(&(&b.pool, &b.node)));
    NodeReport { from_ms: from, to_ms: to, nodes }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(at_ms: i64, c: u64, u: u64) -> Reading {
        Reading { at_ms, ecc_corrected: c, ecc_uncorrected: u, xid_errors: 0, gpus: 8 }
    }

    #[test]
    fn the_window_counts_counter_increases_and_treats_a_drop_as_a_reset() {
        let book = HealthBook::default();
        assert!(book.record("n", reading(0, 100, 0)));
        assert!(book.record("n", reading(60_000, 150, 0)));
        assert!(!book.record("n", reading(120_000, 150, 0)), "unchanged within 10 minutes");
        assert!(!book.record("n", reading(30_000, 999, 0)), "older than the newest");
        assert!(book.record("n", reading(180_000, 20, 1)), "a reset");
        assert!(book.record("n", reading(240_000, 70, 1)));
        // In [60s, 240s]: 150 -> (reset) 20 -> 70 counts 20 + 50, plus 50 from the reading before the window.
        let h = book.window("n", 60_000, 240_000).expect("reported");
        assert_eq!((h.ecc_corrected, h.ecc_uncorrected, h.last_report_ms), (50 + 20 + 50, 1, 240_000));
        // The first reading in the window is compared with the one before it.
        let h = book.window("n", 180_000, 240_000).expect("reported");
        assert_eq!((h.ecc_corrected, h.ecc_uncorrected), (20 + 50, 1));
        assert!(book.window("n", 300_000, 400_000).is_none());
        assert!(book.window("other", 0, 400_000).is_none());
    }

    #[test]
    fn settings_are_checked_with_the_field_named() {
        let mut errs = Vec::new();
        let bad = NodesSection {
            window: Some("5m".into()),
            alpha: Some(1.5),
            min_bad: Some(0),
            ecc_corrected_threshold: Some(0),
            alert: None,
            evaluation_interval: None,
        };
        bad.validate(&mut errs);
        assert_eq!(errs.len(), 4, "{errs:?}");
        for field in ["nodes.window", "nodes.alpha", "nodes.min_bad", "nodes.ecc_corrected_threshold"] {
            assert!(errs.iter().any(|e| e.starts_with(field)), "{field}: {errs:?}");
        }
        let mut errs = Vec::new();
        let s = NodesSection { window: Some("2d".into()), ..Default::default() }.validate(&mut errs);
        assert!(errs.is_empty());
        assert_eq!(s.window_ms, 2 * 86_400_000);
    }
}
