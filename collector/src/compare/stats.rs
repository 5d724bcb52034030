//! Statistics for comparisons: nearest-rank percentiles with distribution-free confidence intervals, the mean
//! with a normal-approximation interval, and the two-sided Mann-Whitney U test (normal approximation with tie
//! correction). Pure functions over slices of seconds.
//!
//! Total over finite inputs: empty slices give `None`, and any finite values (zeros, all equal, up to
//! `f64::MAX`) give finite results, never NaN or infinity (sums are scaled so they cannot overflow; a confidence
//! bound beyond the largest `f64` is reported as `±f64::MAX`). Quantiles `q` are clamped to `[0, 1]`; a NaN `q`
//! gives `None`.

/// `q` clamped to `[0, 1]`, or `None` for NaN.
fn unit(q: f64) -> Option<f64> {
    (!q.is_nan()).then(|| q.clamp(0.0, 1.0))
}

/// Nearest-rank percentile of sorted values: the smallest value with at least `q` of the data at or below it.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    let q = unit(q)?;
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    Some(sorted[rank.min(sorted.len()) - 1])
}

/// A 95% distribution-free confidence interval for the `q` quantile of sorted values: order statistics at ranks
/// `n q ± 1.96 sqrt(n q (1 - q))` (normal approximation to the binomial), clamped to the data.
pub fn percentile_ci(sorted: &[f64], q: f64) -> Option<(f64, f64)> {
    let q = unit(q)?;
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let nf = n as f64;
    let half = 1.96 * (nf * q * (1.0 - q)).sqrt();
    let lo = ((nf * q - half).floor().max(1.0) as usize).min(n);
    let hi = ((nf * q + half).ceil().max(1.0) as usize).min(n);
    Some((sorted[lo - 1], sorted[hi - 1]))
}

/// Mean and its 95% confidence interval (mean ± 1.96 s / sqrt(n)).
///
/// Computed on values divided by the largest magnitude, so huge values cannot overflow the sums; the mean is
/// kept within the data's range and the bounds within `±f64::MAX`.
pub fn mean_ci(values: &[f64]) -> Option<(f64, f64, f64)> {
    let n = values.len();
    if n == 0 {
        return None;
    }
    let (min, max) = values.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
    let scale = values.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    if scale == 0.0 || !scale.is_finite() {
        // All zeros (or non-finite input, outside the contract): the plain formula.
        let mean = values.iter().sum::<f64>() / n as f64;
        return Some((mean, mean, mean));
    }
    let nf = n as f64;
    let mean_s = values.iter().map(|v| v / scale).sum::<f64>() / nf;
    let mean = (mean_s * scale).clamp(min, max);
    if n == 1 {
        return Some((mean, mean, mean));
    }
    let var_s = values.iter().map(|v| (v / scale - mean_s).powi(2)).sum::<f64>() / (nf - 1.0);
    let half_s = 1.96 * (var_s / nf).sqrt();
    let bound = |x: f64| (x * scale).clamp(-f64::MAX, f64::MAX);
    Some((mean, bound(mean_s - half_s).min(mean), bound(mean_s + half_s).max(mean)))
}

/// A ratio of sums `R = Σ num / Σ den` over paired observations (e.g. cost over useful GPU-hours, one pair per
/// job) and its 95% confidence interval by the delta method for ratio estimators:
/// `se = sqrt(Σ (num_i - R den_i)² / (n - 1) / n) / mean(den)`, `R ± 1.96 se`. `None` without pairs or when
/// the denominators sum to zero; one pair gives a zero-width interval.
pub fn ratio_ci(pairs: &[(f64, f64)]) -> Option<(f64, f64, f64)> {
    let n = pairs.len();
    let (num, den) = pairs.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    if n == 0 || den <= 0.0 || !num.is_finite() || !den.is_finite() {
        return None;
    }
    let r = num / den;
    if n == 1 {
        return Some((r, r, r));
    }
    let nf = n as f64;
    let var = pairs.iter().map(|(x, y)| (x - r * y).powi(2)).sum::<f64>() / (nf - 1.0);
    let se = (var / nf).sqrt() / (den / nf);
    Some((r, r - 1.96 * se, r + 1.96 * se))
}

/// The result of a Mann-Whitney U test.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, schemars::JsonSchema)]
pub struct MannWhitney {
    /// U statistic of the left sample (pairs where left > right, ties counting one half).
    pub u_left: f64,
    /// Standardised statistic.
    pub z: f64,
    /// Two-sided p-value.
    pub p_value: f64,
    /// Common-language effect size: P(left > right) + P(tie) / 2.
    pub prob_left_greater: f64,
}

/// Two-sided Mann-Whitney U test between two samples, by ranks with average ranks for ties.
pub fn mann_whitney(left: &[f64], right: &[f64]) -> Option<MannWhitney> {
    let (n1, n2) = (left.len(), right.len());
    if n1 == 0 || n2 == 0 {
        return None;
    }
    let mut all: Vec<(f64, bool)> = left.iter().map(|v| (*v, true)).chain(right.iter().map(|v| (*v, false))).collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    let n = all.len();
    let mut rank_sum_left = 0.0;
    let mut tie_term = 0.0;
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j + 1 < n && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        let t = (j - i + 1) as f64;
        let avg_rank = (i + j) as f64 / 2.0 + 1.0;
        rank_sum_left += all[i..=j].iter().filter(|x| x.1).count() as f64 * avg_rank;
        tie_term += t * t * t - t;
        i = j + 1;
    }
    let (n1f, n2f, nf) = (n1 as f64, n2 as f64, n as f64);
    let u_left = rank_sum_left - n1f * (n1f + 1.0) / 2.0;
    let mean = n1f * n2f / 2.0;
    let var = n1f * n2f / 12.0 * ((nf + 1.0) - tie_term / (nf * (nf - 1.0)));
    let z = if var > 0.0 {
        // Continuity correction toward the mean.
        let d = u_left - mean;
        (d - 0.5 * d.signum()) / var.sqrt()
    } else {
        0.0
    };
    let p = 2.0 * (1.0 - normal_cdf(z.abs()));
    let p_value = if p.is_nan() { 1.0 } else { p.clamp(0.0, 1.0) };
    Some(MannWhitney { u_left, z, p_value, prob_left_greater: u_left / (n1f * n2f) })
}

/// Standard normal CDF (Abramowitz-Stegun 7.1.26 erf approximation, |error| < 1.5e-7).
pub fn normal_cdf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs() / std::f64::consts::SQRT_2);
    let poly =
        t * (0.254_829_592 + t * (-0.284_496_736 + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-(x * x) / 2.0).exp();
    if x >= 0.0 {
        0.5 * (1.0 + erf)
    } else {
        0.5 * (1.0 - erf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), Some(5.0));
        assert_eq!(percentile(&v, 0.9), Some(9.0));
        assert_eq!(percentile(&v, 0.99), Some(10.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        let (lo, hi) = percentile_ci(&v, 0.5).expect("ci");
        assert!(lo <= 5.0 && hi >= 5.0);
    }

    #[test]
    fn normal_cdf_known_values() {
        assert!((normal_cdf(0.0) - 0.5).abs() < 1e-7);
        assert!((normal_cdf(1.959_963_985) - 0.975).abs() < 1e-6);
        assert!((normal_cdf(-1.0) - 0.158_655_254).abs() < 1e-6);
    }

    #[test]
    fn mann_whitney_u_equals_pair_counting() {
        let a = [1.0, 4.0, 4.0, 7.0, 9.0];
        let b = [2.0, 4.0, 5.0, 6.0];
        let mut pairs = 0.0;
        for x in a {
            for y in b {
                pairs += if x > y {
                    1.0
                } else if x == y {
                    0.5
                } else {
                    0.0
                };
            }
        }
        let r = mann_whitney(&a, &b).expect("test");
        assert!((r.u_left - pairs).abs() < 1e-12);
    }
}
