//! Rolling-window bookkeeping for one SLO: good/bad counts per minute (by the time a job was decided) and the
//! times to first step per hour (by the time the job started), kept exactly. Both support removing a job's
//! contribution, so a late event that changes a job's outcome moves it instead of counting it twice.
//!
//! Each hour's times to first step are a sorted multiset of milliseconds (8 bytes per started job), kept as
//! consecutive sorted runs of at most [`RUN_MAX`] values so that a change costs the same in a busy hour. A window's
//! percentiles are exact nearest-rank order statistics over the union of its hours ([`Ttfs`]), found by a
//! binary search on the value that narrows each run's index range as it goes, so a query over a 28-day window
//! touches each hour a few dozen times and never copies or sorts the values.

use std::collections::BTreeMap;

/// Minute buckets for counts.
pub const COUNT_BUCKET_MS: i64 = 60_000;
/// Hour buckets for times to first step.
pub const HIST_BUCKET_MS: i64 = 3_600_000;

/// Good and bad counts of one minute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Jobs decided good.
    pub good: u64,
    /// Jobs decided bad.
    pub bad: u64,
}

impl Counts {
    /// good + bad.
    pub fn total(&self) -> u64 {
        self.good + self.bad
    }
}

/// Where first steps came from, in the order of `pb::StepOrigin`'s numbers: unspecified, training process,
/// container start, scheduler start.
pub const ORIGINS: usize = 4;

/// The window state of one SLO.
#[derive(Debug, Default)]
pub struct WindowState {
    counts: BTreeMap<i64, Counts>,
    /// Hour bucket -> the times to first step (ms) of the jobs that started in it.
    hists: BTreeMap<i64, Hour>,
    /// Hour bucket -> the jobs that started in it, by where their first step came from (see [`ORIGINS`]).
    origins: BTreeMap<i64, [u64; ORIGINS]>,
}

fn bucket(ms: i64, width: i64) -> i64 {
    ms.div_euclid(width) * width
}

impl WindowState {
    /// Adds (`+1`) or removes (`-1`) one decided job at `at_ms`.
    pub fn count(&mut self, at_ms: i64, good: bool, sign: i64) {
        let c = self.counts.entry(bucket(at_ms, COUNT_BUCKET_MS)).or_default();
        let slot = if good { &mut c.good } else { &mut c.bad };
        *slot = slot.saturating_add_signed(sign);
        if c.total() == 0 {
            self.counts.remove(&bucket(at_ms, COUNT_BUCKET_MS));
        }
    }

    /// Adds or removes one time to first step, for a job that started at `started_ms` (negative times, which
    /// only a client's clock error can make, count as 0). Removing a value that is not held (its hour was
    /// pruned since it was added) changes nothing. O(log n + [`RUN_MAX`]) whatever the hour holds.
    pub fn ttfs(&mut self, started_ms: i64, ttfs_ms: i64, add: bool) {
        let v = ttfs_ms.max(0) as u64;
        let key = bucket(started_ms, HIST_BUCKET_MS);
        let hour = self.hists.entry(key).or_default();
        hour.change(v, add);
        if hour.runs.is_empty() {
            self.hists.remove(&key);
        }
    }

    /// Adds or removes one started job's first-step origin (`origin`: its `pb::StepOrigin` number, below
    /// [`ORIGINS`]) in the hour it started, as [`WindowState::ttfs`] adds its time (removing from a pruned hour
    /// changes nothing).
    pub fn origin(&mut self, started_ms: i64, origin: usize, add: bool) {
        let key = bucket(started_ms, HIST_BUCKET_MS);
        if origin >= ORIGINS {
            return;
        }
        if add {
            self.origins.entry(key).or_default()[origin] += 1;
        } else if let Some(h) = self.origins.get_mut(&key) {
            h[origin] = h[origin].saturating_sub(1);
            if h.iter().all(|n| *n == 0) {
                self.origins.remove(&key);
            }
        }
    }

    /// The jobs that started in `[from_ms, to_ms)` (hour-aligned, as [`WindowState::ttfs_between`]) by where
    /// their first step came from.
    pub fn origins_between(&self, from_ms: i64, to_ms: i64) -> [u64; ORIGINS] {
        let mut out = [0; ORIGINS];
        if to_ms > from_ms {
            for h in self.origins.range(bucket(from_ms, HIST_BUCKET_MS)..to_ms).map(|(_, h)| h) {
                for (o, n) in out.iter_mut().zip(h) {
                    *o += n;
                }
            }
        }
        out
    }

    /// Counts decided in `[from_ms, to_ms)` (minute-aligned: buckets whose start is in the range).
    pub fn counts_between(&self, from_ms: i64, to_ms: i64) -> Counts {
        let mut out = Counts::default();
        for c in self.counts.range(bucket(from_ms, COUNT_BUCKET_MS)..to_ms).map(|(_, c)| c) {
            out.good += c.good;
            out.bad += c.bad;
        }
        out
    }

    /// The times to first step of jobs that started in `[from_ms, to_ms)` (hour-aligned).
    pub fn ttfs_between(&self, from_ms: i64, to_ms: i64) -> Ttfs<'_> {
        if to_ms <= from_ms {
            return Ttfs { hours: Vec::new() };
        }
        Ttfs {
            hours: self
                .hists
                .range(bucket(from_ms, HIST_BUCKET_MS)..to_ms)
                .flat_map(|(_, h)| h.runs.iter().map(Vec::as_slice))
                .collect(),
        }
    }

    /// Times to first step held, over every hour (for memory accounting and tests).
    pub fn ttfs_values(&self) -> usize {
        self.hists.values().flat_map(|h| &h.runs).map(Vec::len).sum()
    }

    /// Estimated bytes held: each bucket's map entry, and each hour's values at their allocated capacity.
    pub fn memory_bytes(&self) -> usize {
        const ENTRY: usize = 64;
        let runs: usize = self.hists.values().flat_map(|h| &h.runs).map(|r| 24 + r.capacity() * 8).sum();
        (self.counts.len() + self.hists.len()) * ENTRY + self.origins.len() * (ENTRY + 8 * ORIGINS) + runs
    }

    /// Running totals of the minute counts from `from_ms` on, for answering many windows at once.
    pub fn running(&self, from_ms: i64) -> Running {
        let mut at = Vec::new();
        let mut total = Counts::default();
        let mut sums = Vec::new();
        for (m, c) in self.counts.range(bucket(from_ms, COUNT_BUCKET_MS)..) {
            total.good += c.good;
            total.bad += c.bad;
            at.push(*m);
            sums.push(total);
        }
        Running { at, sums }
    }

    /// Drops count buckets that end before `counts_from_ms` and histogram buckets before `hists_from_ms`.
    pub fn prune_before(&mut self, counts_from_ms: i64, hists_from_ms: i64) {
        let c = bucket(counts_from_ms, COUNT_BUCKET_MS);
        self.counts = self.counts.split_off(&c);
        let h = bucket(hists_from_ms, HIST_BUCKET_MS);
        self.hists = self.hists.split_off(&h);
        self.origins = self.origins.split_off(&h);
    }

    /// Minute buckets held (for memory accounting and tests).
    pub fn count_buckets(&self) -> usize {
        self.counts.len()
    }
}

/// Most values in one run of an hour: an insert or removal moves at most this many (an hour with a million
/// starts costs no more per change than one with a thousand).
pub const RUN_MAX: usize = 4096;

/// One hour's times to first step: a sorted multiset kept as consecutive sorted runs (each value of run `i` is at
/// most every value of run `i + 1`), none empty, each at most [`RUN_MAX`] long.
#[derive(Debug, Default)]
struct Hour {
    runs: Vec<Vec<u64>>,
}

impl Hour {
    fn change(&mut self, v: u64, add: bool) {
        // The first run whose last value is >= v (or the last run): where v goes, or where the first copy is.
        let r = self.runs.partition_point(|run| run.last().is_some_and(|l| *l < v));
        if add {
            if self.runs.is_empty() {
                self.runs.push(vec![v]);
                return;
            }
            let r = r.min(self.runs.len() - 1);
            let run = &mut self.runs[r];
            let i = run.partition_point(|x| *x < v);
            run.insert(i, v);
            if run.len() > RUN_MAX {
                let upper = run.split_off(run.len() / 2);
                self.runs.insert(r + 1, upper);
            }
        } else if let Some(run) = self.runs.get_mut(r) {
            let i = run.partition_point(|x| *x < v);
            if run.get(i) == Some(&v) {
                run.remove(i);
                if run.is_empty() {
                    self.runs.remove(r);
                }
            }
        }
    }
}

/// The times to first step of a window: sorted runs of its hours, read in place.
#[derive(Debug)]
pub struct Ttfs<'a> {
    hours: Vec<&'a [u64]>,
}

impl Ttfs<'_> {
    /// Values in the window.
    pub fn len(&self) -> u64 {
        self.hours.iter().map(|h| h.len() as u64).sum()
    }

    /// Whether the window holds no value.
    pub fn is_empty(&self) -> bool {
        self.hours.iter().all(|h| h.is_empty())
    }

    /// The largest value.
    pub fn max(&self) -> Option<u64> {
        self.hours.iter().filter_map(|h| h.last().copied()).max()
    }

    /// The nearest-rank `q` quantile: the smallest value with at least `ceil(q n)` values (at least one) at or
    /// below it; `None` when empty. `q` is clamped to `[0, 1]` (NaN reads as 0).
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let n = self.len();
        if n == 0 {
            return None;
        }
        let q = if q.is_nan() { 0.0 } else { q.clamp(0.0, 1.0) };
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        let mut lo = self.hours.iter().filter_map(|h| h.first().copied()).min()?;
        let mut hi = self.max()?;
        // Per hour, the index range in which the answer's partition point still lies.
        let mut bounds: Vec<(usize, usize)> = self.hours.iter().map(|h| (0, h.len())).collect();
        let mut points = vec![0usize; self.hours.len()];
        // Invariant: the answer is in [lo, hi], and for each hour, the partition point of `<= answer` is within
        // its bounds.
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let mut at_or_below = 0u64;
            for ((h, (b0, b1)), p) in self.hours.iter().zip(&bounds).zip(points.iter_mut()) {
                *p = b0 + h[*b0..*b1].partition_point(|x| *x <= mid);
                at_or_below += *p as u64;
            }
            if at_or_below >= rank {
                hi = mid;
                for (b, p) in bounds.iter_mut().zip(&points) {
                    b.1 = *p;
                }
            } else {
                lo = mid + 1;
                for (b, p) in bounds.iter_mut().zip(&points) {
                    b.0 = *p;
                }
            }
        }
        Some(lo)
    }
}

/// Running totals over minute buckets: the counts of any `[from, to)` in two binary searches.
#[derive(Debug, Default)]
pub struct Running {
    at: Vec<i64>,
    sums: Vec<Counts>,
}

impl Running {
    /// Total of the buckets starting before `ms`.
    fn before(&self, ms: i64) -> Counts {
        match self.at.partition_point(|m| *m < ms) {
            0 => Counts::default(),
            n => self.sums[n - 1],
        }
    }

    /// Counts decided in `[from_ms, to_ms)`, as [`WindowState::counts_between`] answers them (for ranges that
    /// start at or after the running totals' start).
    pub fn between(&self, from_ms: i64, to_ms: i64) -> Counts {
        let (a, b) = (self.before(bucket(from_ms, COUNT_BUCKET_MS)), self.before(to_ms));
        Counts { good: b.good - a.good, bad: b.bad - a.bad }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// First-step origins count by start hour, as times to first step do: added, removed (a removal from an
    /// hour never added, or already pruned, changes nothing), read over hour-aligned ranges, pruned with them.
    #[test]
    fn origins_count_by_start_hour() {
        let h = HIST_BUCKET_MS;
        let mut w = WindowState::default();
        w.origin(h + 5, 2, true);
        w.origin(h + 10, 1, true);
        w.origin(3 * h, 1, true);
        w.origin(3 * h, 9, true);
        assert_eq!(w.origins_between(0, 4 * h), [0, 2, 1, 0]);
        assert_eq!(w.origins_between(2 * h, 4 * h), [0, 1, 0, 0]);
        assert_eq!(w.origins_between(h + 30, h + 40), [0, 1, 1, 0], "hour-aligned: the whole start hour");
        assert_eq!(w.origins_between(4 * h, 2 * h), [0; ORIGINS]);
        w.origin(h, 2, false);
        w.origin(7 * h, 2, false);
        assert_eq!(w.origins_between(0, 4 * h), [0, 2, 0, 0]);
        w.prune_before(0, 2 * h);
        assert_eq!(w.origins_between(0, 4 * h), [0, 1, 0, 0]);
        w.origin(3 * h, 1, false);
        assert!(w.origins.is_empty(), "an hour with no job left is dropped");
    }

    /// The nearest-rank percentile by sorting everything: the oracle.
    fn sorted_quantile(values: &[u64], q: f64) -> Option<u64> {
        let mut v = values.to_vec();
        v.sort_unstable();
        if v.is_empty() {
            return None;
        }
        let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
        Some(v[rank - 1])
    }

    #[test]
    fn removing_a_value_restores_the_distribution() {
        let mut w = WindowState::default();
        for v in [1_000, 2_000, 3_000, 400_000] {
            w.ttfs(7_200_000, v, true);
        }
        w.ttfs(7_200_000, 400_000, false);
        let t = w.ttfs_between(0, 10_800_000);
        assert_eq!(t.len(), 3);
        assert_eq!(t.max(), Some(3_000));
        assert_eq!(t.quantile(0.5), Some(2_000));
        // Removing a value never added changes nothing.
        w.ttfs(7_200_000, 5, false);
        assert_eq!(w.ttfs_values(), 3);
        for v in [1_000, 2_000, 3_000] {
            w.ttfs(7_200_000, v, false);
        }
        assert_eq!(w.ttfs_values(), 0);
        assert!(w.hists.is_empty(), "empty hours are dropped");
        assert_eq!(w.ttfs_between(0, 10_800_000).quantile(0.5), None);
    }

    #[test]
    fn percentiles_are_exact_order_statistics_over_any_window() {
        // Random adds and removes over 200 hours; every window's quantiles equal the sorted oracle's.
        let mut w = WindowState::default();
        let mut model: Vec<(i64, u64)> = Vec::new();
        let mut x: u64 = 99;
        let mut next = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            x >> 11
        };
        for step in 0..6_000 {
            if step % 4 == 3 && !model.is_empty() {
                let (at, v) = model.swap_remove(next() as usize % model.len());
                w.ttfs(at, v as i64, false);
            } else {
                let at = (next() % 200) as i64 * HIST_BUCKET_MS + (next() % 3_600_000) as i64;
                // Heavy ties and a long tail: seconds to days, a few exact repeats.
                let v = match next() % 4 {
                    0 => 60_000,
                    1 => next() % 1_000,
                    _ => next() % (9 * 86_400_000),
                };
                w.ttfs(at, v as i64, true);
                model.push((at, v));
            }
        }
        for (from_h, to_h) in [(0, 200), (0, 1), (13, 14), (50, 120), (199, 400), (-5, 3), (120, 50)] {
            let (from, to) = (from_h * HIST_BUCKET_MS, to_h * HIST_BUCKET_MS);
            let inside: Vec<u64> = model.iter().filter(|(at, _)| *at >= from && *at < to).map(|(_, v)| *v).collect();
            let t = w.ttfs_between(from, to);
            assert_eq!(t.len(), inside.len() as u64, "{from_h}..{to_h}");
            assert_eq!(t.max(), inside.iter().max().copied());
            for q in [0.0, 0.001, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0] {
                assert_eq!(t.quantile(q), sorted_quantile(&inside, q), "{from_h}..{to_h} q={q}");
            }
        }
    }

    #[test]
    fn one_hour_with_many_starts_splits_into_runs_and_stays_exact() {
        let mut w = WindowState::default();
        let mut model: Vec<u64> = Vec::new();
        let mut x: u64 = 5;
        let mut next = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            x >> 11
        };
        for step in 0..40_000 {
            if step % 5 == 4 {
                let v = model.swap_remove(next() as usize % model.len());
                w.ttfs(7_200_000, v as i64, false);
            } else {
                // Many ties (a few hundred distinct values), so equal values span runs.
                let v = (next() % 300) * 1_000;
                w.ttfs(7_200_000, v as i64, true);
                model.push(v);
            }
        }
        let hour = &w.hists[&7_200_000];
        assert!(hour.runs.len() > 4, "runs split: {}", hour.runs.len());
        assert!(hour.runs.iter().all(|r| !r.is_empty() && r.len() <= RUN_MAX));
        assert!(hour.runs.windows(2).all(|p| p[0].last() <= p[1].first()), "runs in order");
        let t = w.ttfs_between(0, 10_800_000);
        assert_eq!(t.len(), model.len() as u64);
        for q in [0.0, 0.01, 0.5, 0.9, 0.99, 1.0] {
            assert_eq!(t.quantile(q), sorted_quantile(&model, q), "q={q}");
        }
        for v in model.clone() {
            w.ttfs(7_200_000, v as i64, false);
        }
        assert!(w.hists.is_empty(), "every value removed, every run dropped");
    }

    #[test]
    fn extreme_values_are_kept_exactly() {
        let mut w = WindowState::default();
        let year = 365 * 86_400_000i64;
        for v in [400 * 86_400_000, 30 * year, i64::MAX, -5, 0] {
            w.ttfs(7_200_000, v, true);
        }
        let t = w.ttfs_between(0, 10_800_000);
        assert_eq!(t.max(), Some(i64::MAX as u64));
        assert_eq!(t.quantile(0.0), Some(0));
        assert_eq!(t.quantile(0.4), Some(0), "a negative time counts as 0");
        assert_eq!(t.quantile(0.6), Some(400 * 86_400_000));
        assert_eq!(t.quantile(0.8), Some(30 * year as u64));
        assert_eq!(t.quantile(f64::NAN), Some(0));
        w.ttfs(7_200_000, i64::MAX, false);
        assert_eq!(w.ttfs_between(0, 10_800_000).max(), Some(30 * year as u64));
    }

    #[test]
    fn running_totals_answer_every_window_like_a_direct_sum() {
        let mut w = WindowState::default();
        let mut x: u64 = 7;
        for i in 0..2_000i64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            w.count(i * 37_000 + (x >> 40) as i64 % 30_000, x % 5 == 0, 1);
        }
        let r = w.running(0);
        for from in (0..80_000_000i64).step_by(1_234_567) {
            for len in [60_000, 300_000, 3_600_000, 21_600_000, 86_400_000] {
                assert_eq!(r.between(from, from + len), w.counts_between(from, from + len), "{from}+{len}");
            }
        }
    }

    #[test]
    fn counts_move_between_buckets() {
        let mut w = WindowState::default();
        w.count(60_000, false, 1);
        w.count(60_000, false, -1);
        w.count(120_000, true, 1);
        assert_eq!(w.counts_between(0, 60_000 * 10), Counts { good: 1, bad: 0 });
        assert_eq!(w.count_buckets(), 1);
    }
}
