//! An SVG chart of two empirical CDFs of time to first step on a logarithmic time axis, drawn on the server so
//! the CLI and the API can hand out a file without a browser.
//!
//! Total over its inputs: any slices (empty, one value, all equal, zeros, negative, huge, NaN or infinite
//! values, unsorted) give a well-formed SVG of bounded size with only finite coordinates. Non-finite values are
//! left out of the curves (they cannot be placed on a time axis); values below one second are drawn at the
//! left edge. When neither side has a value the chart says there is no data.

use std::fmt::Write as _;

/// Most steps drawn per curve: a larger sample is drawn through this many evenly spaced order statistics, so the
/// image stays small (about 30 bytes a step) whatever the number of jobs.
pub const MAX_STEPS: usize = 1000;
/// Longest series name shown, in characters; a longer one is cut and ends with an ellipsis.
pub const MAX_NAME_CHARS: usize = 120;
/// Most labelled ticks on the time axis (decades are skipped evenly beyond that).
pub const MAX_TICKS: i32 = 12;
/// Shown instead of curves when neither side has a value.
pub const NO_DATA: &str = "No data: no started job with a time to first step on either side";

const W: f64 = 720.0;
const H: f64 = 400.0;
const ML: f64 = 60.0;
const MR: f64 = 20.0;
const MT: f64 = 30.0;
const MB: f64 = 50.0;
const PW: f64 = W - ML - MR;
const PH: f64 = H - MT - MB;

/// Escapes text for XML, replaces characters XML 1.0 does not allow (and other control characters) with U+FFFD,
/// and cuts it to [`MAX_NAME_CHARS`].
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_NAME_CHARS * 2));
    for (i, c) in s.chars().enumerate() {
        if i == MAX_NAME_CHARS {
            out.push('\u{2026}');
            break;
        }
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if c.is_control() || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// The logarithmic time axis: decades `lo..=hi` of seconds, `lo < hi`, both within `0..=309`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Axis {
    lo: i32,
    hi: i32,
}

impl Axis {
    /// The axis covering the finite values (at least one decade, starting at 1 s or above); `None` without any.
    fn covering(values: &[f64]) -> Option<Axis> {
        let mut any = false;
        let mut min_pos = f64::INFINITY;
        let mut max = 0.0f64;
        for &v in values.iter().filter(|v| v.is_finite()) {
            any = true;
            if v > 0.0 {
                min_pos = min_pos.min(v);
                max = max.max(v);
            }
        }
        if !any {
            return None;
        }
        // Finite and positive from here on, so the logarithms are finite (at most 308.3).
        let lo_v = if min_pos.is_finite() { min_pos.max(1.0) } else { 1.0 };
        let hi_v = max.max(lo_v);
        let lo = (lo_v.log10().floor() as i32).clamp(0, 308);
        let hi = (hi_v.log10().ceil() as i32).clamp(lo + 1, 309);
        Some(Axis { lo, hi })
    }

    /// Horizontal position of `v` seconds (finite; at the left edge below the axis, at the right edge above it).
    fn x(&self, v: f64) -> f64 {
        let d = if v > 0.0 { v.log10() } else { f64::from(self.lo) };
        self.x_decade(d.clamp(f64::from(self.lo), f64::from(self.hi)))
    }

    fn x_decade(&self, d: f64) -> f64 {
        ML + (d - f64::from(self.lo)) / f64::from(self.hi - self.lo) * PW
    }

    /// The decades that get a tick and a label: every one, or every k-th so at most [`MAX_TICKS`] + 1.
    fn ticks(&self) -> impl Iterator<Item = i32> {
        let span = self.hi - self.lo;
        let step = ((span + MAX_TICKS - 1) / MAX_TICKS).max(1);
        (self.lo..=self.hi).step_by(step as usize)
    }
}

fn y(p: f64) -> f64 {
    MT + (1.0 - p.clamp(0.0, 1.0)) * PH
}

/// A short label for 10^decade seconds: `1s`, `10s`, `2m`, `17m`, `3h`, `1.2d`, `12d`, `3.2y`, ..., `1e15s`.
fn decade_label(decade: i32) -> String {
    let v = 10f64.powi(decade);
    let short = |x: f64, unit: &str| if x < 9.95 { format!("{x:.1}{unit}") } else { format!("{x:.0}{unit}") };
    if decade > 10 {
        format!("1e{decade}s")
    } else if v < 60.0 {
        format!("{v:.0}s")
    } else if v < 3600.0 {
        format!("{:.0}m", v / 60.0)
    } else if v < 86_400.0 {
        format!("{:.0}h", v / 3600.0)
    } else if v < 365.0 * 86_400.0 {
        short(v / 86_400.0, "d")
    } else {
        short(v / (365.25 * 86_400.0), "y")
    }
}

/// The finite values, sorted.
fn finite_sorted(values: &[f64]) -> Vec<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    v
}

/// The step path of the empirical CDF of sorted finite values, through at most [`MAX_STEPS`] order statistics.
fn cdf_path(axis: &Axis, sorted: &[f64]) -> String {
    let n = sorted.len();
    let steps = n.min(MAX_STEPS);
    let mut path = String::with_capacity(steps * 32 + 16);
    let Some(first) = sorted.first() else { return path };
    let _ = write!(path, "M{:.1},{:.1}", axis.x(*first), y(0.0));
    let mut prev_rank = 0u128;
    for j in 1..=steps as u128 {
        // The j-th of `steps` evenly spaced ranks (1-based): ceil(j n / steps); every rank when n <= MAX_STEPS.
        let rank = (j * n as u128).div_ceil(steps as u128);
        let v = sorted[(rank as usize).clamp(1, n) - 1];
        let (p0, p1) = (prev_rank as f64 / n as f64, rank as f64 / n as f64);
        let _ = write!(path, " L{:.1},{:.1} L{:.1},{:.1}", axis.x(v), y(p0), axis.x(v), y(p1));
        prev_rank = rank;
    }
    path
}

/// Renders the CDF overlay of two samples of seconds (any order; see the module notes for odd values).
pub fn cdf_overlay(left_name: &str, left: &[f64], right_name: &str, right: &[f64]) -> String {
    let left = finite_sorted(left);
    let right = finite_sorted(right);
    let both: Vec<f64> = left.iter().chain(right.iter()).copied().collect();
    let axis = Axis::covering(&both);
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12"><rect width="{W}" height="{H}" fill="white"/><text x="{ML}" y="18" font-size="14">Time to first step, empirical CDF</text>"#
    );
    // Axes and grid.
    if let Some(axis) = &axis {
        for d in axis.ticks() {
            let _ = write!(
                s,
                r##"<line x1="{0:.1}" y1="{MT}" x2="{0:.1}" y2="{1:.1}" stroke="#ddd"/><text x="{0:.1}" y="{2:.1}" text-anchor="middle">{3}</text>"##,
                axis.x_decade(f64::from(d)),
                MT + PH,
                MT + PH + 16.0,
                decade_label(d)
            );
        }
    }
    for p in [0.0, 0.25, 0.5, 0.75, 0.9, 1.0] {
        let _ = write!(
            s,
            r##"<line x1="{ML}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="#eee"/><text x="{2:.1}" y="{3:.1}" text-anchor="end">{4:.0}%</text>"##,
            y(p),
            ML + PW,
            ML - 6.0,
            y(p) + 4.0,
            p * 100.0
        );
    }
    let _ = write!(s, r##"<rect x="{ML}" y="{MT}" width="{PW}" height="{PH}" fill="none" stroke="#888"/>"##);
    if axis.is_none() {
        let _ = write!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="14" fill="#555">{}</text>"##,
            ML + PW / 2.0,
            MT + PH / 2.0,
            esc(NO_DATA)
        );
    }
    for (i, (name, vals, color)) in
        [(left_name, &left, "#1f77b4"), (right_name, &right, "#d62728")].into_iter().enumerate()
    {
        if let Some(axis) = &axis {
            if !vals.is_empty() {
                let _ =
                    write!(s, r#"<path d="{}" fill="none" stroke="{color}" stroke-width="2"/>"#, cdf_path(axis, vals));
            }
        }
        let ly = MT + 16.0 + 16.0 * i as f64;
        let _ = write!(
            s,
            r#"<line x1="{0:.1}" y1="{1:.1}" x2="{2:.1}" y2="{1:.1}" stroke="{color}" stroke-width="3"/><text x="{3:.1}" y="{4:.1}">{5} (n={6})</text>"#,
            ML + PW - 220.0,
            ly,
            ML + PW - 200.0,
            ML + PW - 195.0,
            ly + 4.0,
            esc(name),
            vals.len()
        );
    }
    s += "</svg>";
    s
}
