//! Suspect nodes: per node (within its pool) how the jobs placed on it fared over a window, and the rule that
//! calls a node suspect. Pure: built from job timelines' [`Placement`]s and, for GPU health, from readings the
//! caller passes in.
//!
//! # The rule
//! A placement is *bad* for a node when the job failed there (outcome `failed`) or was lost there (`node_lost`
//! naming that node, or naming none). For node `n` with `k` bad placements out of `m`, against the rest of its
//! pool (`K - k` bad out of `M - m`), the pool's rate is estimated with one pseudo-failure and one
//! pseudo-success, `p0 = (K - k + 1) / (M - m + 2)`, so a pool that never failed elsewhere does not make a single
//! failure infinitely surprising. The node is suspect when `k >= min_bad` and the one-sided binomial tail
//! `P[Binom(m, p0) >= k]` is at most `alpha / N`, `N` the number of nodes of the pool with placements in the
//! window (a Bonferroni correction: with 200 nodes, testing each at `alpha` would flag two healthy nodes per
//! evaluation by chance). Placements in the window are those assigned in it.
//!
//! GPU health makes a node suspect on its own: any uncorrectable ECC error, at least
//! `ecc_corrected_threshold` correctable ones, or any XID error, reported in the window.

use super::timeline::{Placement, PlacementEnd};
use super::Timeline;
use serde::{Deserialize, Serialize};
use startline_proto::pb::PoolKind;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The rule's parameters (`[nodes]` in the config).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rule {
    /// Family-wise false-alarm rate per pool and evaluation.
    pub alpha: f64,
    /// Fewest bad placements that can make a node suspect.
    pub min_bad: u64,
    /// Correctable ECC errors in the window that make a node suspect.
    pub ecc_corrected_threshold: u64,
}

impl Default for Rule {
    fn default() -> Self {
        Rule { alpha: 0.01, min_bad: 3, ecc_corrected_threshold: 1000 }
    }
}

/// One health reading of a node, summed over its GPUs: cumulative counters as the driver reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reading {
    /// When it was taken (Unix ms).
    pub at_ms: i64,
    /// Correctable ECC errors, cumulative.
    pub ecc_corrected: u64,
    /// Uncorrectable ECC errors, cumulative.
    pub ecc_uncorrected: u64,
    /// XID errors reported with this reading (not cumulative).
    pub xid_errors: u64,
    /// GPUs reporting.
    pub gpus: u32,
}

/// GPU health of one node over the window: error counts added in it (the rise of the cumulative counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Health {
    /// Correctable ECC errors.
    pub ecc_corrected: u64,
    /// Uncorrectable ECC errors.
    pub ecc_uncorrected: u64,
    /// XID errors reported.
    pub xid_errors: u64,
    /// When the last reading was taken.
    pub last_report_ms: i64,
}

/// One bad placement: the job and how it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Incident {
    /// The job.
    pub job_id: Arc<str>,
    /// How the placement ended.
    pub end: PlacementEnd,
    /// When.
    pub at_ms: i64,
}

/// What one node's placements came to in the window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeStats {
    /// Placements assigned in the window.
    pub placements: u64,
    /// Of those, placements that reached a first step.
    pub started: u64,
    /// Ended by placement end, indexed like [`PlacementEnd::ALL`] (lost counts only when this node is blamed).
    pub ends: [u64; 8],
    /// Seconds from assignment to first step, for placements that started.
    pub startup_ms: Vec<i64>,
    /// Time to first step of jobs whose first run was here.
    pub ttfs_ms: Vec<i64>,
    /// Bad placements, newest last.
    pub incidents: Vec<Incident>,
}

impl NodeStats {
    /// Failed plus lost placements.
    pub fn bad(&self) -> u64 {
        self.ends[2] + self.ends[5]
    }

    /// Placements ended by `end` (lost only when this node was blamed).
    pub fn ended(&self, end: PlacementEnd) -> u64 {
        self.ends[end as usize]
    }
}

/// Per (pool, node) statistics of the placements assigned in `[from, to]`.
#[derive(Debug, Default)]
pub struct Tally {
    /// By pool, then node.
    pub pools: BTreeMap<String, BTreeMap<Arc<str>, NodeStats>>,
    /// Each pool's kind, as the jobs placed in it say; `Unspecified` when they disagree.
    pub kinds: BTreeMap<String, PoolKind>,
}

impl Tally {
    /// Adds one job's placements.
    pub fn add(&mut self, job_id: &str, t: &Timeline, from: i64, to: i64) {
        let Some(attrs) = t.attrs.as_ref() else { return };
        if t.placements.iter().all(|p| p.assigned_at < from || p.assigned_at > to) {
            return;
        }
        match self.kinds.get_mut(attrs.pool.as_str()) {
            Some(k) if *k != attrs.pool_kind => *k = PoolKind::Unspecified,
            Some(_) => {}
            None => {
                self.kinds.insert(attrs.pool.clone(), attrs.pool_kind);
            }
        }
        let pool = match self.pools.get_mut(attrs.pool.as_str()) {
            Some(p) => p,
            None => self.pools.entry(attrs.pool.clone()).or_default(),
        };
        let id: Arc<str> = Arc::from(job_id);
        for p in t.placements.iter().filter(|p| p.assigned_at >= from && p.assigned_at <= to) {
            for node in p.nodes.iter() {
                let s = pool.entry(node.clone()).or_default();
                add_placement(s, p, node, t.first_step_at, t.submitted_at, &id);
            }
        }
    }
}

fn add_placement(s: &mut NodeStats, p: &Placement, node: &str, first: Option<i64>, sub: Option<i64>, id: &Arc<str>) {
    s.placements += 1;
    if let Some(f) = p.first_step_at {
        s.started += 1;
        s.startup_ms.push(f - p.assigned_at);
        if let (Some(jf), Some(sub)) = (first, sub) {
            if jf == f {
                s.ttfs_ms.push(f - sub);
            }
        }
    }
    let blamed = p.end != PlacementEnd::Lost || p.blames(node);
    if p.end == PlacementEnd::Lost && !blamed {
        // Another node of the placement was lost: for this one the run was cut short, like a requeue.
        s.ends[PlacementEnd::Requeued as usize] += 1;
        return;
    }
    s.ends[p.end as usize] += 1;
    if matches!(p.end, PlacementEnd::Failed | PlacementEnd::Lost) {
        s.incidents.push(Incident { job_id: id.clone(), end: p.end, at_ms: p.ended_at.unwrap_or(p.assigned_at) });
    }
}

/// The verdict on one node.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// Bad placements on the node.
    pub bad: u64,
    /// Placements on the node.
    pub placements: u64,
    /// The rest of the pool's smoothed bad rate, `p0`.
    pub pool_rate: f64,
    /// `P[Binom(placements, p0) >= bad]`.
    pub p_value: f64,
    /// The threshold it was held to, `alpha / N`.
    pub threshold: f64,
    /// Why it is suspect (empty when it is not): `failure_rate`, `ecc_uncorrected`, `ecc_corrected`, `xid`.
    pub reasons: Vec<&'static str>,
}

/// Judges every node of one pool. `health` gives a node's GPU health in the window, if it reported any.
pub fn judge(
    nodes: &BTreeMap<Arc<str>, NodeStats>,
    health: impl Fn(&str) -> Option<Health>,
    rule: &Rule,
) -> BTreeMap<Arc<str>, Verdict> {
    let total_bad: u64 = nodes.values().map(NodeStats::bad).sum();
    let total: u64 = nodes.values().map(|s| s.placements).sum();
    let threshold = rule.alpha / nodes.len().max(1) as f64;
    nodes
        .iter()
        .map(|(name, s)| {
            let (k, m) = (s.bad(), s.placements);
            let p0 = (total_bad - k + 1) as f64 / (total - m + 2) as f64;
            let p_value = binomial_tail(m, k, p0);
            let mut reasons = Vec::new();
            if k >= rule.min_bad && p_value <= threshold && nodes.len() > 1 {
                reasons.push("failure_rate");
            }
            if let Some(h) = health(name) {
                if h.ecc_uncorrected > 0 {
                    reasons.push("ecc_uncorrected");
                }
                if h.ecc_corrected >= rule.ecc_corrected_threshold {
                    reasons.push("ecc_corrected");
                }
                if h.xid_errors > 0 {
                    reasons.push("xid");
                }
            }
            (name.clone(), Verdict { bad: k, placements: m, pool_rate: p0, p_value, threshold, reasons })
        })
        .collect()
}

/// `ln C(m, k)`, summed over the smaller side.
fn ln_choose(m: u64, k: u64) -> f64 {
    let k = k.min(m - k);
    (1..=k).map(|i| ((m - k + i) as f64 / i as f64).ln()).sum()
}

/// `ln P[Binom(m, p) = k]` for `0 < p < 1`.
fn ln_pmf(m: u64, k: u64, p: f64) -> f64 {
    ln_choose(m, k) + k as f64 * p.ln() + (m - k) as f64 * (1.0 - p).ln()
}

/// `P[Binom(m, p) >= k]`, accurate in both tails: above the mean it sums the upper terms, which shrink from
/// `k` on; below it, it takes one minus the lower tail, whose terms shrink from `k - 1` down. Each sum is taken
/// relative to its first term (in logs), so nothing underflows for large `m`.
pub fn binomial_tail(m: u64, k: u64, p: f64) -> f64 {
    if k == 0 {
        return 1.0;
    }
    if k > m || p <= 0.0 {
        return 0.0;
    }
    if p >= 1.0 {
        return 1.0;
    }
    let odds = p / (1.0 - p);
    if k as f64 > m as f64 * p {
        let (mut sum, mut rel) = (0.0f64, 1.0f64);
        for j in k..=m {
            sum += rel;
            rel *= (m - j) as f64 / (j + 1) as f64 * odds;
            if rel < sum * 1e-17 {
                break;
            }
        }
        (ln_pmf(m, k, p) + sum.ln()).exp().min(1.0)
    } else {
        let (mut sum, mut rel) = (0.0f64, 1.0f64);
        let mut j = k - 1;
        loop {
            sum += rel;
            if j == 0 {
                break;
            }
            rel *= j as f64 / (m - j + 1) as f64 / odds;
            j -= 1;
            if rel < sum * 1e-17 {
                break;
            }
        }
        (1.0 - (ln_pmf(m, k - 1, p) + sum.ln()).exp()).clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tail by direct summation with exact binomial coefficients (small `m` only).
    fn direct_tail(m: u64, k: u64, p: f64) -> f64 {
        let choose = |n: u64, r: u64| -> f64 {
            let mut c: u128 = 1;
            for i in 0..r {
                c = c * u128::from(n - i) / u128::from(i + 1);
            }
            c as f64
        };
        (k..=m).map(|j| choose(m, j) * p.powi(j as i32) * (1.0 - p).powi((m - j) as i32)).sum()
    }

    #[test]
    fn the_binomial_tail_matches_direct_summation() {
        for m in 0..=40u64 {
            for k in 0..=m + 1 {
                for p in [0.001, 0.02, 0.1, 0.37, 0.5, 0.8, 0.999] {
                    let (got, want) = (binomial_tail(m, k, p), direct_tail(m, k, p));
                    assert!((got - want).abs() <= 1e-12 + 1e-9 * want, "m={m} k={k} p={p}: {got} vs {want}");
                }
            }
        }
    }

    #[test]
    fn the_binomial_tail_stays_finite_and_ordered_for_large_counts() {
        // 10,000 placements at 5%: the mean is 500; e^-513 would underflow a naive first term.
        let mut last = 1.0;
        for k in (0..=10_000).step_by(50) {
            let t = binomial_tail(10_000, k, 0.05);
            assert!(t.is_finite() && (0.0..=1.0).contains(&t), "k={k}: {t}");
            assert!(t <= last + 1e-12, "the tail must not grow with k: k={k} {t} > {last}");
            last = t;
        }
        // Symmetry at p = 1/2: P[X >= k] = P[X <= m - k] = 1 - P[X >= m - k + 1].
        for k in [1u64, 400, 480, 500, 520, 700] {
            let a = binomial_tail(1000, k, 0.5);
            let b = 1.0 - binomial_tail(1000, 1000 - k + 1, 0.5);
            assert!((a - b).abs() < 1e-9, "k={k}: {a} vs {b}");
        }
    }

    fn placement(nodes: &[&str], at: i64, first: Option<i64>, end: PlacementEnd, lost: Option<&str>) -> Placement {
        Placement {
            nodes: nodes.iter().map(|n| Arc::from(*n)).collect(),
            assigned_at: at,
            first_step_at: first,
            ended_at: Some(at + 1000),
            end,
            lost_node: lost.map(Arc::from),
        }
    }

    fn timeline(pool: &str, sub: i64, placements: Vec<Placement>) -> Timeline {
        timeline_of(PoolKind::Dedicated, pool, sub, placements)
    }

    fn timeline_of(kind: PoolKind, pool: &str, sub: i64, placements: Vec<Placement>) -> Timeline {
        let mut attrs = crate::job::JobAttrs::unknown();
        attrs.pool = pool.into();
        attrs.pool_kind = kind;
        Timeline {
            attrs: Some(Arc::new(attrs)),
            submitted_at: Some(sub),
            first_step_at: placements.iter().find_map(|p| p.first_step_at),
            placements,
            ..Timeline::default()
        }
    }

    #[test]
    fn a_node_that_fails_far_more_often_than_its_pool_is_suspect_and_an_average_one_is_not() {
        let mut tally = Tally::default();
        let mut n = 0;
        let mut job = |tally: &mut Tally, node: &str, end: PlacementEnd| {
            n += 1;
            let p = placement(&[node], 1_000 * n, Some(1_000 * n + 500), end, Some(node));
            tally.add(&format!("j{n}"), &timeline("a100", 1_000 * n - 100, vec![p]), 0, i64::MAX);
        };
        // 20 healthy nodes, 30 placements each, one failure each (3.3%); the bad node fails 8 of 30.
        for i in 0..20 {
            for j in 0..30 {
                job(
                    &mut tally,
                    &format!("ok-{i:02}"),
                    if j == 0 { PlacementEnd::Failed } else { PlacementEnd::Succeeded },
                );
            }
        }
        for j in 0..30 {
            job(&mut tally, "bad", if j % 4 == 0 && j < 29 { PlacementEnd::Lost } else { PlacementEnd::Succeeded });
        }
        let pool = &tally.pools["a100"];
        assert_eq!(pool.len(), 21);
        let v = judge(pool, |_| None, &Rule::default());
        let bad = &v["bad"];
        assert_eq!((bad.bad, bad.placements), (8, 30));
        // Rest of the pool: 20 bad of 600, smoothed (20 + 1) / (600 + 2).
        assert!((bad.pool_rate - 21.0 / 602.0).abs() < 1e-15);
        assert!((bad.p_value - direct_tail(30, 8, 21.0 / 602.0)).abs() < 1e-12);
        assert!((bad.threshold - 0.01 / 21.0).abs() < 1e-15);
        assert_eq!(bad.reasons, vec!["failure_rate"]);
        for (name, verdict) in &v {
            if &**name != "bad" {
                assert!(verdict.reasons.is_empty(), "{name}: {verdict:?}");
            }
        }
        assert_eq!(pool["bad"].incidents.len(), 8);
        assert_eq!(pool["bad"].ended(PlacementEnd::Lost), 8);
        assert_eq!(pool["bad"].startup_ms, vec![500; 30]);
    }

    #[test]
    fn a_loss_blames_the_named_node_only_and_health_alone_makes_a_node_suspect() {
        let mut tally = Tally::default();
        let p = placement(&["n1", "n2"], 10, Some(20), PlacementEnd::Lost, Some("n2"));
        tally.add("j", &timeline("p", 0, vec![p]), 0, 100);
        let pool = &tally.pools["p"];
        assert_eq!(pool["n1"].bad(), 0);
        assert_eq!(pool["n1"].ended(PlacementEnd::Requeued), 1);
        assert_eq!(pool["n2"].bad(), 1);
        assert_eq!(pool["n2"].ttfs_ms, vec![20]);
        // Out of the window: not counted.
        let mut late = Tally::default();
        late.add("j", &timeline("p", 0, vec![placement(&["n1"], 10, None, PlacementEnd::Failed, None)]), 11, 100);
        assert!(late.pools.is_empty());
        let rule = Rule { ecc_corrected_threshold: 50, ..Rule::default() };
        let health = |n: &str| {
            (n == "n1").then_some(Health { ecc_corrected: 50, ecc_uncorrected: 0, xid_errors: 0, last_report_ms: 0 })
        };
        let v = judge(pool, health, &rule);
        assert_eq!(v["n1"].reasons, vec!["ecc_corrected"]);
        assert!(v["n2"].reasons.is_empty(), "one loss is not enough: {:?}", v["n2"]);
    }

    #[test]
    fn a_pools_kind_is_what_its_placed_jobs_say_and_unspecified_when_they_disagree() {
        let mut tally = Tally::default();
        let one = |node: &str| vec![placement(&[node], 10, Some(20), PlacementEnd::Succeeded, None)];
        tally.add("m1", &timeline_of(PoolKind::Managed, "sm", 0, one("sm-i-1")), 0, 100);
        tally.add("m2", &timeline_of(PoolKind::Managed, "sm", 0, one("sm-i-2")), 0, 100);
        tally.add("d1", &timeline_of(PoolKind::Dedicated, "mixed", 0, one("x-1")), 0, 100);
        tally.add("m3", &timeline_of(PoolKind::Managed, "mixed", 0, one("x-2")), 0, 100);
        tally.add("d2", &timeline_of(PoolKind::Dedicated, "mixed", 0, one("x-3")), 0, 100);
        // Placed outside the window: says nothing about the pool.
        tally.add("late", &timeline_of(PoolKind::Dedicated, "sm", 0, one("sm-i-3")), 11, 100);
        assert_eq!(tally.kinds["sm"], PoolKind::Managed);
        assert_eq!(tally.kinds["mixed"], PoolKind::Unspecified);
        assert_eq!(tally.pools["sm"].len(), 2);
    }
}
