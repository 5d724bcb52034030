//! Side-by-side comparison of two sets of jobs (e.g. managed endpoints vs dedicated pools): counts, time to
//! first step percentiles and mean with 95% confidence intervals, SLO compliance, the split of waiting into
//! segments, time of day, and whether the difference is statistically significant (two-sided Mann-Whitney U,
//! alpha 0.05). Exact: computed from the jobs' timelines, not from histograms. Pure over a job map.
//!
//! Time to first step statistics cover jobs that started; jobs still waiting or that ended without starting
//! are counted beside them (a distribution of started jobs alone flatters a pool that fails to start jobs).
//!
//! Each side also counts its started jobs by where their first step came from (the training process, a
//! container or scheduler start, or unspecified by older sources), and each group says whether the two sides'
//! sets of sources differ: a managed side measured to its containers' start against a dedicated side measured to
//! the training loop's first step looks faster by the data loading, compilation and rendezvous it leaves out.

pub mod advice;
pub mod cost;
pub mod stats;
pub mod svg;

use crate::index::JobRef;
use crate::job::{JobAttrs, Segment};
use crate::slo::{SloDef, Standing};
use serde::Serialize;
use startline_proto::labels::Label;
use startline_proto::pb;
use std::collections::{BTreeMap, BTreeSet};

/// An attribute jobs can be selected or grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attr {
    /// `pool_kind`
    PoolKind,
    /// `provider`
    Provider,
    /// `pool`
    Pool,
    /// `priority`
    Priority,
    /// `gpu_class`
    GpuClass,
    /// `region`
    Region,
}

impl Attr {
    /// Parses an attribute name.
    pub fn parse(s: &str) -> Option<Attr> {
        Some(match s {
            "pool_kind" => Attr::PoolKind,
            "provider" => Attr::Provider,
            "pool" => Attr::Pool,
            "priority" => Attr::Priority,
            "gpu_class" => Attr::GpuClass,
            "region" => Attr::Region,
            _ => return None,
        })
    }

    /// The job's value of this attribute.
    pub fn of<'a>(&self, a: &'a JobAttrs) -> &'a str {
        match self {
            Attr::PoolKind => a.pool_kind.label(),
            Attr::Provider => &a.provider,
            Attr::Pool => &a.pool,
            Attr::Priority => a.priority.label(),
            Attr::GpuClass => &a.gpu_class,
            Attr::Region => &a.region,
        }
    }
}

/// A conjunction of `attribute=value` terms, e.g. `pool_kind=managed,gpu_class=h100`.
#[derive(Debug, Clone, PartialEq)]
pub struct Selector {
    terms: Vec<(Attr, String)>,
    text: String,
}

impl Selector {
    /// Parses `k=v[,k=v]`; an empty string selects every job.
    pub fn parse(s: &str) -> Result<Selector, String> {
        let mut terms = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| format!("{part:?} is not attribute=value"))?;
            let attr = Attr::parse(k.trim())
                .ok_or_else(|| format!("{k:?} is not one of pool_kind, provider, pool, priority, gpu_class, region"))?;
            terms.push((attr, v.trim().to_string()));
        }
        Ok(Selector { terms, text: s.to_string() })
    }

    /// Whether a job matches.
    pub fn matches(&self, a: &JobAttrs) -> bool {
        self.terms.iter().all(|(attr, v)| attr.of(a) == v)
    }
}

/// What to compare.
#[derive(Debug, Clone)]
pub struct Query {
    /// Left side.
    pub left: Selector,
    /// Right side.
    pub right: Selector,
    /// Optional grouping attribute.
    pub by: Option<Attr>,
    /// Jobs submitted in the `window_ms` before `now_ms`.
    pub window_ms: i64,
    /// Now.
    pub now_ms: i64,
    /// Prices (`[cost]`); with none configured the sides have no cost figures.
    pub cost: Option<std::sync::Arc<cost::CostModel>>,
}

#[derive(Default)]
struct Side {
    sources: FirstStepSources,
    jobs: u64,
    waiting: u64,
    ended_before_start: u64,
    ttfs: Vec<f64>,
    wait_ms: BTreeMap<Segment, i64>,
    /// Good and bad decisions by SLO index (`None`: no job of the side is covered by it).
    slo: Vec<Option<(u64, u64)>>,
    /// TTFS samples by hour of the day (UTC) of the submit.
    by_hour: [Vec<f64>; 24],
    /// Per priced job: (cost, useful GPU-hours).
    costs: Vec<(f64, f64)>,
    unpriced: u64,
}

/// What a side's jobs cost, at each job's per-use price (managed) or its pool's amortised rate (dedicated, per
/// GPU-hour held: capacity left idle is not in it; `GET /api/v1/cost` shows it as useful utilisation).
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct CostSummary {
    /// Jobs priced.
    pub priced_jobs: u64,
    /// Jobs no price rule or dedicated pool covers.
    pub unpriced_jobs: u64,
    /// Their cost: GPU-hours held (preparing, training, checkpoints, lost and failed work) x the rate.
    pub total: f64,
    /// Mean cost of a job, with a normal-approximation 95% interval (`null` without priced jobs).
    pub per_job: Option<MeanEstimate>,
    /// Total cost / useful (productive) GPU-hours, with a delta-method 95% interval for a ratio of sums.
    pub per_useful_gpu_hour: Estimate,
}

/// Started jobs by where their first step (the one their time to first step is measured to) came from.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct FirstStepSources {
    /// Reported by the training process (node agent, `emit`, a training-loop library): the real first step.
    pub training_process: u64,
    /// The training container's start, as a managed endpoint's adapter (or Kueue's pods ready) saw it, with no
    /// first step from the training process in the same run: before data loading, compilation and rendezvous.
    pub container_start: u64,
    /// The scheduler's start of the job (Slurm), with no first step from the training process in the same run.
    pub scheduler_start: u64,
    /// Not said (sources older than first-step origins).
    pub unspecified: u64,
}

impl FirstStepSources {
    /// Counts one first step of `origin`.
    pub fn add(&mut self, origin: pb::StepOrigin, n: u64) {
        let slot = match origin {
            pb::StepOrigin::TrainingProcess => &mut self.training_process,
            pb::StepOrigin::ContainerStart => &mut self.container_start,
            pb::StepOrigin::SchedulerStart => &mut self.scheduler_start,
            pb::StepOrigin::Unspecified => &mut self.unspecified,
        };
        *slot = slot.saturating_add(n);
    }

    /// The sources with at least one first step, as a bit set (by `pb::StepOrigin` number).
    fn present(&self) -> u8 {
        [self.unspecified, self.training_process, self.container_start, self.scheduler_start]
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .fold(0, |acc, (i, _)| acc | 1 << i)
    }

    /// Whether two sets of started jobs measure their first steps from different sources: both have started
    /// jobs, and a source counts on one side and not on the other.
    pub fn differ(&self, other: &FirstStepSources) -> bool {
        let (a, b) = (self.present(), other.present());
        a != 0 && b != 0 && a != b
    }
}

/// A percentile and its 95% confidence interval, seconds.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct Estimate {
    /// The estimate (`null` without data).
    pub value: Option<f64>,
    /// Lower and upper bound (`null` without data).
    pub ci95: Option<[f64; 2]>,
}

/// The mean and its 95% confidence interval, seconds.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct MeanEstimate {
    /// The mean.
    pub value: f64,
    /// Lower and upper bound.
    pub ci95: [f64; 2],
}

/// Time to first step of the started jobs of one side, seconds.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct TtfsSummary {
    /// Median.
    pub p50: Estimate,
    /// 90th percentile.
    pub p90: Estimate,
    /// 99th percentile.
    pub p99: Estimate,
    /// Mean (`null` without data).
    pub mean: Option<MeanEstimate>,
    /// Largest (`null` without data).
    pub max: Option<f64>,
}

/// Good and bad jobs of one side under one SLO.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct SloCompliance {
    /// The SLO's name.
    pub slo: String,
    /// Jobs decided good.
    pub good: u64,
    /// Jobs decided bad.
    pub bad: u64,
    /// good / (good + bad), `null` when none is decided.
    pub compliance: Option<f64>,
}

/// Time spent in one wait segment, summed over a side's jobs.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct WaitShare {
    /// Seconds.
    pub seconds: f64,
    /// Share of all the side's initial waiting (0 when there was none).
    pub share: f64,
}

/// Started jobs by the hour (UTC) they were submitted in.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct HourStats {
    /// Hour of day, UTC.
    pub hour_utc: u32,
    /// Jobs submitted in that hour that started.
    pub started: usize,
    /// Median time to first step, seconds.
    pub p50: Option<f64>,
    /// 90th percentile, seconds.
    pub p90: Option<f64>,
}

/// One side of one group.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct SideReport {
    /// Jobs submitted in the window.
    pub jobs: u64,
    /// Of those, jobs that started (reached a first step).
    pub started: usize,
    /// Jobs still waiting.
    pub still_waiting: u64,
    /// Jobs that ended without starting.
    pub ended_before_start: u64,
    /// Time to first step of the started jobs.
    pub ttfs_seconds: TtfsSummary,
    /// The started jobs by where their first step came from.
    pub first_step_sources: FirstStepSources,
    /// Compliance under each SLO covering these jobs.
    pub slo: Vec<SloCompliance>,
    /// Initial waiting by segment.
    pub wait_split: BTreeMap<String, WaitShare>,
    /// The 24 hours of the day.
    pub by_hour: Vec<HourStats>,
    /// What the jobs cost (`null` without a `[cost]` section).
    pub cost: Option<CostSummary>,
}

/// Whether the sides differ.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct Difference {
    /// The test used.
    pub test: &'static str,
    /// Its significance level.
    pub alpha: f64,
    /// The test's result (`null` unless both sides have started jobs).
    pub mann_whitney: Option<stats::MannWhitney>,
    /// p < alpha.
    pub significant: bool,
    /// `left` or `right` when significant.
    pub faster: Option<&'static str>,
    /// Right median over left median (`null` without a positive left median or when not representable).
    pub p50_ratio_right_over_left: Option<f64>,
    /// The sides' first steps come from different sources (see [`FirstStepSources::differ`]; e.g. container
    /// starts on one side, the training process on the other): their times to first step measure different
    /// things, and the side measured to an earlier point looks faster.
    pub first_step_sources_differ: bool,
}

/// The comparison of one group (`all`, or one value of the grouping attribute).
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct GroupReport {
    /// `all` or the attribute's value.
    pub group: String,
    /// Left side.
    pub left: SideReport,
    /// Right side.
    pub right: SideReport,
    /// The significance test.
    pub difference: Difference,
}

/// The whole comparison, as `GET /api/v1/compare` answers it.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct Report {
    /// The left selector as given.
    pub left: String,
    /// The right selector as given.
    pub right: String,
    /// The grouping attribute, if any.
    pub by: Option<String>,
    /// The window, seconds.
    pub window_seconds: i64,
    /// `all` first, then each group in order (at most `limit` of them: see `truncated`).
    pub groups: Vec<GroupReport>,
    /// Groups the jobs fell into (besides `all`), shown or not.
    pub groups_total: usize,
    /// Whether groups were left out to keep the answer within `limit`: those with the fewest jobs went (`all`
    /// still counts every job).
    pub truncated: bool,
    /// When set (RFC 3339), jobs that ended before it were deleted to keep folded jobs within
    /// `store.folded_budget_mib`: a window reaching before it compares what is left.
    pub history_deleted_through: Option<String>,
}

/// Seconds from milliseconds.
fn secs(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

impl Side {
    fn add(&mut self, job: JobRef<'_>, model: Option<&cost::CostModel>, now: i64) {
        let t = job.timeline;
        self.jobs += 1;
        if let (Some(m), Some(a)) = (model, t.attrs.as_ref()) {
            let rate = m.dedicated(&a.pool).map(|(_, p)| p).or_else(|| m.price(a));
            match (rate, crate::job::goodput::account(t, now)) {
                (Some(rate), Some(acc)) => {
                    let [_, preparing, _, checkpoint, lost, failed, productive] = acc.by_category();
                    let g = f64::from(acc.gpus) / 3_600_000.0;
                    // In f64: each part is at most i64::MAX (saturated), their sum need not be.
                    let held =
                        [preparing, checkpoint, lost, failed, productive].iter().map(|x| *x as f64).sum::<f64>() * g;
                    self.costs.push((held * rate, productive as f64 * g));
                }
                _ => self.unpriced += 1,
            }
        }
        // Saturating: timestamps come from clients, and a difference of extreme ones must not overflow.
        let ttfs = t.first_step_at.zip(t.submitted_at).map(|(f, s)| f.saturating_sub(s));
        match (ttfs, t.done_at) {
            (Some(ttfs), _) => {
                let s = secs(ttfs);
                self.ttfs.push(s);
                self.sources.add(t.first_step_origin.unwrap_or_default(), 1);
                let hour = (t.submitted_at.unwrap_or(0).rem_euclid(86_400_000) / 3_600_000) as usize;
                if let Some(h) = self.by_hour.get_mut(hour) {
                    h.push(s);
                }
            }
            (None, Some(_)) => self.ended_before_start += 1,
            (None, None) => self.waiting += 1,
        }
        for (seg, ms) in &t.initial_wait_ms {
            let e = self.wait_ms.entry(*seg).or_default();
            *e = e.saturating_add(*ms);
        }
        for c in job.slo {
            let i = usize::from(c.slo);
            if self.slo.len() <= i {
                self.slo.resize(i + 1, None);
            }
            let e = self.slo[i].get_or_insert_default();
            match c.standing {
                Standing::Good { .. } => e.0 += 1,
                Standing::Bad { .. } => e.1 += 1,
                _ => {}
            }
        }
    }

    fn summarize(&mut self, slos: &[SloDef], priced: bool) -> SideReport {
        let cost = priced.then(|| {
            // In a fixed order, so that sums do not depend on the order jobs were added in (scans walk hot and
            // folded jobs in an order of their own).
            self.costs.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
            let per_job: Vec<f64> = self.costs.iter().map(|(c, _)| *c).collect();
            let ratio = stats::ratio_ci(&self.costs);
            CostSummary {
                priced_jobs: self.costs.len() as u64,
                unpriced_jobs: self.unpriced,
                total: per_job.iter().sum(),
                // Costs are not negative: the normal interval's lower bound is cut at zero.
                per_job: stats::mean_ci(&per_job).map(|(m, lo, hi)| MeanEstimate { value: m, ci95: [lo.max(0.0), hi] }),
                per_useful_gpu_hour: Estimate { value: ratio.map(|r| r.0), ci95: ratio.map(|r| [r.1.max(0.0), r.2]) },
            }
        });
        self.ttfs.sort_by(f64::total_cmp);
        let v = &self.ttfs;
        let pct =
            |q: f64| Estimate { value: stats::percentile(v, q), ci95: stats::percentile_ci(v, q).map(|(a, b)| [a, b]) };
        let total_wait = self.wait_ms.values().fold(0i64, |a, ms| a.saturating_add(*ms));
        let wait_split = self
            .wait_ms
            .iter()
            .map(|(k, ms)| {
                let share = if total_wait > 0 { *ms as f64 / total_wait as f64 } else { 0.0 };
                (k.label(), WaitShare { seconds: secs(*ms), share })
            })
            .collect();
        let slo = self
            .slo
            .iter()
            .enumerate()
            .filter_map(|(i, counts)| {
                let (good, bad) = counts.as_ref()?;
                let d = slos.get(i)?;
                let total = good.saturating_add(*bad);
                Some(SloCompliance {
                    slo: d.name.clone(),
                    good: *good,
                    bad: *bad,
                    compliance: (total > 0).then(|| *good as f64 / total as f64),
                })
            })
            .collect();
        let by_hour = (0..24u32)
            .map(|h| {
                let mut xs = std::mem::take(&mut self.by_hour[h as usize]);
                xs.sort_by(f64::total_cmp);
                HourStats {
                    hour_utc: h,
                    started: xs.len(),
                    p50: stats::percentile(&xs, 0.5),
                    p90: stats::percentile(&xs, 0.9),
                }
            })
            .collect();
        SideReport {
            jobs: self.jobs,
            started: v.len(),
            still_waiting: self.waiting,
            ended_before_start: self.ended_before_start,
            ttfs_seconds: TtfsSummary {
                p50: pct(0.5),
                p90: pct(0.9),
                p99: pct(0.99),
                mean: stats::mean_ci(v).map(|(m, lo, hi)| MeanEstimate { value: m, ci95: [lo, hi] }),
                max: v.last().copied(),
            },
            first_step_sources: self.sources,
            slo,
            wait_split,
            by_hour,
            cost,
        }
    }
}

/// The TTFS samples (seconds, sorted) of each side for one group, for charts.
pub struct Samples {
    /// Left side.
    pub left: Vec<f64>,
    /// Right side.
    pub right: Vec<f64>,
}

/// Accumulates jobs one at a time, so callers can feed it in chunks (releasing the index lock between them).
pub struct Collector {
    q: Query,
    groups: BTreeMap<String, (Side, Side)>,
}

impl Collector {
    /// An empty accumulation for a query.
    pub fn new(q: Query) -> Self {
        Collector { q, groups: BTreeMap::new() }
    }

    /// Whether a job with these attributes, submitted then, counts ([`Collector::add`] ignores the rest): a scan
    /// asks before filling in a folded job's timeline.
    pub fn wants(&self, attrs: &crate::job::JobAttrs, submitted_at: i64) -> bool {
        let q = &self.q;
        submitted_at >= q.now_ms.saturating_sub(q.window_ms)
            && submitted_at <= q.now_ms
            && (q.left.matches(attrs) || q.right.matches(attrs))
    }

    /// Adds one job (ignored unless submitted in the window and on a side).
    pub fn add(&mut self, job: JobRef<'_>) {
        let q = &self.q;
        let t = job.timeline;
        let (Some(a), Some(sub)) = (t.attrs.as_ref(), t.submitted_at) else { return };
        if sub < q.now_ms.saturating_sub(q.window_ms) || sub > q.now_ms {
            return;
        }
        let (l, r) = (q.left.matches(a), q.right.matches(a));
        if !l && !r {
            return;
        }
        let by = q.by.map(|by| by.of(a));
        for k in std::iter::once("all").chain(by) {
            // Look up before allocating a key: almost every job joins groups that already exist.
            let g = match self.groups.get_mut(k) {
                Some(g) => g,
                None => self.groups.entry(k.to_string()).or_default(),
            };
            let model = q.cost.as_deref();
            if l {
                g.0.add(job, model, q.now_ms);
            }
            if r {
                g.1.add(job, model, q.now_ms);
            }
        }
    }

    /// The comparison.
    pub fn finish(self, slos: &[SloDef]) -> Report {
        report(&self.q, self.groups, slos)
    }

    /// The sorted TTFS samples of both sides over all groups (for the CDF chart).
    pub fn samples(mut self) -> Samples {
        let (mut l, mut r) = self.groups.remove("all").map(|(l, r)| (l.ttfs, r.ttfs)).unwrap_or_default();
        l.sort_by(f64::total_cmp);
        r.sort_by(f64::total_cmp);
        Samples { left: l, right: r }
    }
}

/// Builds the comparison document from the accumulated sides.
fn report(q: &Query, groups: BTreeMap<String, (Side, Side)>, slos: &[SloDef]) -> Report {
    let order: BTreeSet<String> = groups.keys().filter(|k| *k != "all").cloned().collect();
    let mut out = Vec::new();
    let mut groups = groups;
    for key in std::iter::once("all".to_string()).chain(order) {
        let Some((mut l, mut r)) = groups.remove(&key) else { continue };
        let priced = q.cost.is_some();
        let left = l.summarize(slos, priced);
        let right = r.summarize(slos, priced);
        let sources_differ = left.first_step_sources.differ(&right.first_step_sources);
        let mw = stats::mann_whitney(&l.ttfs, &r.ttfs);
        let significant = mw.is_some_and(|m| m.p_value < 0.05);
        let faster = match (mw, significant) {
            (Some(m), true) => Some(if m.prob_left_greater > 0.5 { "right" } else { "left" }),
            _ => None,
        };
        let p50_ratio = match (stats::percentile(&l.ttfs, 0.5), stats::percentile(&r.ttfs, 0.5)) {
            (Some(a), Some(b)) if a > 0.0 => Some(b / a).filter(|x| x.is_finite()),
            _ => None,
        };
        out.push(GroupReport {
            group: key,
            left,
            right,
            difference: Difference {
                test: "mann-whitney-u, two-sided, normal approximation with tie correction",
                alpha: 0.05,
                mann_whitney: mw,
                significant,
                faster,
                p50_ratio_right_over_left: p50_ratio,
                first_step_sources_differ: sources_differ,
            },
        });
    }
    Report {
        left: q.left.text.clone(),
        right: q.right.text.clone(),
        by: q.by.map(|b| format!("{b:?}")),
        window_seconds: q.window_ms / 1000,
        groups_total: out.len().saturating_sub(1),
        groups: out,
        truncated: false,
        history_deleted_through: None,
    }
}

impl Report {
    /// Keeps `all` and the `limit` groups with the most jobs (both sides together; ties to the first in order),
    /// in their order; says so in `truncated`.
    pub fn keep_largest_groups(&mut self, limit: usize) {
        let groups = self.groups.len().saturating_sub(1);
        if groups <= limit {
            return;
        }
        let mut by_size: Vec<(u64, usize)> =
            self.groups.iter().enumerate().skip(1).map(|(i, g)| (g.left.jobs + g.right.jobs, i)).collect();
        by_size.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut keep = vec![false; self.groups.len()];
        keep[0] = true;
        for &(_, i) in by_size.iter().take(limit) {
            keep[i] = true;
        }
        let mut i = 0;
        self.groups.retain(|_| {
            i += 1;
            keep[i - 1]
        });
        self.truncated = true;
    }
}

#[cfg(test)]
mod tests;
