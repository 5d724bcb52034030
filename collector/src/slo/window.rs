//! Rolling-window bookkeeping for one SLO: good/bad counts per minute (by the time a job was decided) and
//! time-to-first-step HDR histograms per hour (by the time the job started). Both support removing a job's
//! contribution, so a late event that changes a job's outcome moves it instead of counting it twice.
//!
//! HDR histograms cannot decrement, so each hour keeps an `added` and a `removed` histogram; a window's
//! distribution is `sum(added) - sum(removed)`, exact because only recorded values are ever removed.
//!
//! The histograms track 1 ms to [`MAX_TTFS_MS`] (2^40 ms, about 34.8 years) to two significant figures, so any
//! real wait, a year-long one included, keeps its 1% precision. A larger value (only a client's clock error can
//! make one) is recorded as `MAX_TTFS_MS`, counted in [`clamped_total`] and logged, never silently.

use hdrhistogram::Histogram;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Times to first step above [`MAX_TTFS_MS`] recorded (clamped) since the process started.
static CLAMPED: AtomicU64 = AtomicU64::new(0);

/// How many times to first step were above [`MAX_TTFS_MS`] and recorded as it, since the process started.
pub fn clamped_total() -> u64 {
    CLAMPED.load(Ordering::Relaxed)
}

/// Minute buckets for counts.
pub const COUNT_BUCKET_MS: i64 = 60_000;
/// Hour buckets for histograms.
pub const HIST_BUCKET_MS: i64 = 3_600_000;
/// Largest time to first step recorded to within the histograms' precision: 2^40 ms, about 34.8 years (larger
/// values are recorded as this, counted and logged). Costs about 17 KiB a histogram, against 14 KiB for 60 days.
pub const MAX_TTFS_MS: u64 = 1 << 40;
/// Significant figures of the histograms: values are exact to within 1% (relative).
pub const SIGFIG: u8 = 2;

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

fn new_hist() -> Histogram<u32> {
    // Constant, valid bounds: hdrhistogram only rejects low < 1, high < 2 * low or sigfig > 5.
    Histogram::new_with_bounds(1, MAX_TTFS_MS, SIGFIG).expect("constant histogram bounds are valid")
}

/// The window state of one SLO.
#[derive(Debug, Default)]
pub struct WindowState {
    counts: BTreeMap<i64, Counts>,
    hists: BTreeMap<i64, (Histogram<u32>, Histogram<u32>)>,
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

    /// Adds or removes one time to first step, for a job that started at `started_ms`.
    pub fn ttfs(&mut self, started_ms: i64, ttfs_ms: i64, add: bool) {
        let v = ttfs_ms.max(1) as u64;
        let v = if v > MAX_TTFS_MS {
            if add {
                CLAMPED.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    ttfs_ms,
                    max_ms = MAX_TTFS_MS,
                    "time to first step beyond the histogram range: recorded as its maximum"
                );
            }
            MAX_TTFS_MS
        } else {
            v
        };
        let (added, removed) =
            self.hists.entry(bucket(started_ms, HIST_BUCKET_MS)).or_insert_with(|| (new_hist(), new_hist()));
        let h = if add { added } else { removed };
        // Values are clamped into the histogram's range, so recording cannot fail.
        let _ = h.record(v);
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

    /// The time-to-first-step distribution of jobs that started in `[from_ms, to_ms)` (hour-aligned).
    pub fn ttfs_between(&self, from_ms: i64, to_ms: i64) -> Histogram<u32> {
        let mut added = new_hist();
        let mut removed = new_hist();
        for (a, r) in self.hists.range(bucket(from_ms, HIST_BUCKET_MS)..to_ms).map(|(_, h)| h) {
            let _ = added.add(a);
            let _ = removed.add(r);
        }
        let _ = added.subtract(&removed);
        added
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
    }

    /// Minute buckets held (for memory accounting and tests).
    pub fn count_buckets(&self) -> usize {
        self.counts.len()
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

    #[test]
    fn removing_a_value_restores_the_distribution() {
        let mut w = WindowState::default();
        for v in [1_000, 2_000, 3_000, 400_000] {
            w.ttfs(7_200_000, v, true);
        }
        w.ttfs(7_200_000, 400_000, false);
        let h = w.ttfs_between(0, 10_800_000);
        assert_eq!(h.len(), 3);
        assert!(h.max() < 3_100);
    }

    #[test]
    fn histograms_cover_years_and_clamp_beyond_the_range_visibly() {
        let mut w = WindowState::default();
        let year = 365 * 86_400_000i64;
        for v in [400 * 86_400_000, 30 * year, MAX_TTFS_MS as i64] {
            w.ttfs(7_200_000, v, true);
        }
        let h = w.ttfs_between(0, 10_800_000);
        assert!(h.value_at_quantile(0.3) as f64 >= 400.0 * 86_400_000.0 * 0.99);
        assert!((h.value_at_quantile(0.6) as f64 - 30.0 * year as f64).abs() <= 30.0 * year as f64 * 0.01);
        let before = clamped_total();
        w.ttfs(7_200_000, i64::MAX, true);
        w.ttfs(7_200_000, i64::MAX, false);
        assert!(clamped_total() > before);
        assert_eq!(w.ttfs_between(0, 10_800_000).len(), 3);
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
