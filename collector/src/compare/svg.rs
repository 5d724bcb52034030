//! An SVG chart of two empirical CDFs of time to first step on a logarithmic time axis, drawn on the server so
//! the CLI and the API can hand out a file without a browser.

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Renders the CDF overlay. `left` and `right` are sorted seconds.
pub fn cdf_overlay(left_name: &str, left: &[f64], right_name: &str, right: &[f64]) -> String {
    let (w, h, ml, mr, mt, mb) = (720.0, 400.0, 60.0, 20.0, 30.0, 50.0);
    let pw = w - ml - mr;
    let ph = h - mt - mb;
    let all = left.iter().chain(right.iter());
    let lo = all.clone().copied().filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min).max(1.0);
    let hi = all.copied().fold(0.0, f64::max).max(lo * 10.0);
    let (llo, lhi) = (lo.log10().floor(), hi.log10().ceil());
    let x = |v: f64| ml + (v.max(10f64.powf(llo)).log10() - llo) / (lhi - llo) * pw;
    let y = |p: f64| mt + (1.0 - p) * ph;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12"><rect width="{w}" height="{h}" fill="white"/><text x="{ml}" y="18" font-size="14">Time to first step, empirical CDF</text>"#
    );
    // Axes and grid.
    let mut d = llo as i32;
    while d as f64 <= lhi {
        let v = 10f64.powi(d);
        let label = if v >= 86_400.0 {
            format!("{}d", v / 86_400.0)
        } else if v >= 3600.0 {
            format!("{:.0}h", v / 3600.0)
        } else if v >= 60.0 {
            format!("{:.0}m", v / 60.0)
        } else {
            format!("{v}s")
        };
        s += &format!(
            r##"<line x1="{0:.1}" y1="{mt}" x2="{0:.1}" y2="{1:.1}" stroke="#ddd"/><text x="{0:.1}" y="{2:.1}" text-anchor="middle">{label}</text>"##,
            x(v),
            mt + ph,
            mt + ph + 16.0
        );
        d += 1;
    }
    for p in [0.0, 0.25, 0.5, 0.75, 0.9, 1.0] {
        s += &format!(
            r##"<line x1="{ml}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="#eee"/><text x="{2:.1}" y="{3:.1}" text-anchor="end">{4:.0}%</text>"##,
            y(p),
            ml + pw,
            ml - 6.0,
            y(p) + 4.0,
            p * 100.0
        );
    }
    s += &format!(r##"<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>"##);
    for (i, (name, vals, color)) in
        [(left_name, left, "#1f77b4"), (right_name, right, "#d62728")].into_iter().enumerate()
    {
        if !vals.is_empty() {
            let n = vals.len() as f64;
            let mut path = format!("M{:.1},{:.1}", x(vals[0]), y(0.0));
            for (k, v) in vals.iter().enumerate() {
                path += &format!(" L{:.1},{:.1} L{:.1},{:.1}", x(*v), y(k as f64 / n), x(*v), y((k + 1) as f64 / n));
            }
            s += &format!(r#"<path d="{path}" fill="none" stroke="{color}" stroke-width="2"/>"#);
        }
        let ly = mt + 16.0 + 16.0 * i as f64;
        s += &format!(
            r#"<line x1="{0:.1}" y1="{1:.1}" x2="{2:.1}" y2="{1:.1}" stroke="{color}" stroke-width="3"/><text x="{3:.1}" y="{4:.1}">{5} (n={6})</text>"#,
            ml + pw - 220.0,
            ly,
            ml + pw - 200.0,
            ml + pw - 195.0,
            ly + 4.0,
            esc(name),
            vals.len()
        );
    }
    s += "</svg>";
    s
}
