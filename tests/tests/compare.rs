//! Managed vs dedicated comparison on seeded jobs with known distributions: the reported percentiles, U
//! statistic, p-value and verdict are checked against values computed independently here (nearest-rank
//! percentiles from the test's own samples, U by counting pairs, the p-value by numerically integrating the
//! normal density). The CLI gives the same answer and writes the SVG chart.

use startline_agent::rng::Rng;
use startline_agent::uplink::{Publisher, UplinkSettings};
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_tests::{binary, event, Collector};
use std::process::Command;

struct Job {
    id: String,
    managed: bool,
    gpu: &'static str,
    ttfs_ms: i64,
}

fn jobs() -> Vec<Job> {
    let mut r = Rng::new(20261130);
    let mut out = Vec::new();
    for i in 0..600 {
        let managed = i % 2 == 0;
        // Managed waits ~2x longer at the median; both heavy-tailed.
        let median = if managed { 600_000.0 } else { 300_000.0 };
        out.push(Job {
            id: format!("job/{i}"),
            managed,
            gpu: if i % 3 == 0 { "h100" } else { "a100" },
            ttfs_ms: r.lognormal(median, 0.8).round() as i64 + 1,
        });
    }
    out
}

fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    let k = ((q * sorted.len() as f64).ceil() as usize).max(1);
    sorted[k - 1]
}

/// Two-sided p-value of z: 2 * (1 - Phi(|z|)), with Phi integrated by Simpson's rule (independent of the
/// collector's erf approximation).
fn p_two_sided(z: f64) -> f64 {
    let z = z.abs();
    let n = 20_000;
    let h = z / n as f64;
    let f = |x: f64| (-x * x / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt();
    let mut s = f(0.0) + f(z);
    for k in 1..n {
        s += f(k as f64 * h) * if k % 2 == 1 { 4.0 } else { 2.0 };
    }
    let half = s * h / 3.0; // integral from 0 to |z|
    2.0 * (0.5 - half)
}

/// U by counting pairs, z with continuity correction (no ties in these samples), p by integration.
fn independent_test(left: &[f64], right: &[f64]) -> (f64, f64) {
    let mut u = 0.0;
    for a in left {
        for b in right {
            u += if a > b {
                1.0
            } else if a == b {
                0.5
            } else {
                0.0
            };
        }
    }
    let (n1, n2) = (left.len() as f64, right.len() as f64);
    let mean = n1 * n2 / 2.0;
    let sd = (n1 * n2 * (n1 + n2 + 1.0) / 12.0).sqrt();
    let d = u - mean;
    let z = (d - 0.5 * d.signum()) / sd;
    (u, p_two_sided(z))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn comparison_matches_independent_statistics_and_the_cli_agrees() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");
    let now = startline_proto::time::now_ms();
    let all = jobs();
    let mut evs = Vec::new();
    for (i, j) in all.iter().enumerate() {
        let sub = now - 5 * 86_400_000 + i as i64 * 60_000;
        let mut s = startline_tests::submitted(
            if j.managed { pb::PoolKind::Managed } else { pb::PoolKind::Dedicated },
            pb::PriorityClass::Normal,
            8,
        );
        if let Kind::Submitted(x) = &mut s {
            x.gpu_class = j.gpu.into();
        }
        evs.push(event(&j.id, "s", sub, s));
        evs.push(event(&j.id, "f", sub + j.ttfs_ms, Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })));
    }
    up.send(evs).await.expect("send");
    up.flush().await.expect("flush");

    let (status, v) =
        c.get("/api/v1/compare?left=pool_kind%3Dmanaged&right=pool_kind%3Ddedicated&by=gpu_class&window=30d");
    assert_eq!(status, 200, "{v}");
    let groups = v["groups"].as_array().expect("groups");
    let names: Vec<&str> = groups.iter().filter_map(|g| g["group"].as_str()).collect();
    assert_eq!(names, ["all", "a100", "h100"]);

    for g in groups {
        let name = g["group"].as_str().expect("name");
        let pick = |managed: bool| {
            let mut xs: Vec<f64> = all
                .iter()
                .filter(|j| j.managed == managed && (name == "all" || j.gpu == name))
                .map(|j| j.ttfs_ms as f64 / 1000.0)
                .collect();
            xs.sort_by(f64::total_cmp);
            xs
        };
        let (l, r) = (pick(true), pick(false));
        assert_eq!(g["left"]["started"].as_u64(), Some(l.len() as u64));
        assert_eq!(g["right"]["started"].as_u64(), Some(r.len() as u64));
        for (side, xs) in [("left", &l), ("right", &r)] {
            for (p, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99)] {
                let got = g[side]["ttfs_seconds"][p]["value"].as_f64().expect("pct");
                assert_eq!(got, nearest_rank(xs, q), "{name} {side} {p}");
                let ci = &g[side]["ttfs_seconds"][p]["ci95"];
                assert!(ci[0].as_f64().expect("lo") <= got && got <= ci[1].as_f64().expect("hi"));
            }
            let mean = xs.iter().sum::<f64>() / xs.len() as f64;
            assert!((g[side]["ttfs_seconds"]["mean"]["value"].as_f64().expect("mean") - mean).abs() < 1e-9);
        }
        let (u, p) = independent_test(&l, &r);
        let mw = &g["difference"]["mann_whitney"];
        assert!((mw["u_left"].as_f64().expect("u") - u).abs() < 1e-9, "{name}: U");
        let got_p = mw["p_value"].as_f64().expect("p");
        assert!((got_p - p).abs() < 1e-6 + p * 1e-4, "{name}: p {got_p} vs independent {p}");
        assert_eq!(g["difference"]["significant"].as_bool(), Some(p < 0.05), "{name}");
        if p < 0.05 {
            assert_eq!(g["difference"]["faster"], "right", "{name}: dedicated waits less");
        }
    }
    assert_eq!(groups[0]["difference"]["significant"], true, "a 2x median difference over 600 jobs is detected");

    // The CLI, through the API: same JSON, and the chart.
    let svg = dir.path().join("cdf.svg");
    let out = Command::new(binary("startline-collector"))
        .args([
            "compare",
            "--api",
            &format!("http://{}", c.http),
            "--by",
            "gpu_class",
            "--window",
            "30d",
            "--format",
            "json",
            "--svg",
        ])
        .arg(&svg)
        .output()
        .expect("cli");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cli: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(cli["groups"], v["groups"]);
    let chart = std::fs::read_to_string(&svg).expect("svg written");
    assert!(chart.starts_with("<svg") && chart.matches("<path").count() == 2, "{chart}");
    let table = Command::new(binary("startline-collector"))
        .args(["compare", "--api", &format!("http://{}", c.http)])
        .output()
        .expect("cli");
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("ttfs p50") && text.contains("significant at 0.05"), "{text}");

    // Bad parameters are 400 with a JSON error.
    let (s, e) = c.get("/api/v1/compare?by=colour");
    assert_eq!(s, 400);
    assert!(e["error"].as_str().is_some_and(|m| m.starts_with("by:")));
    let (s, e) = c.get("/api/v1/compare?left=size%3Dbig");
    assert_eq!(s, 400);
    assert!(e["error"].as_str().is_some_and(|m| m.starts_with("left:")));
}
