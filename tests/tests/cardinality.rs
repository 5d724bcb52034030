//! The series budget (docs/METRICS.md, "Series budget"), checked on a real collector fed by the real simulator
//! with 40 pools and 4 GPU classes (default `[metrics]` settings): no measurement reaches an overflow series,
//! and every job metric has exactly the attribute sets the documented formula gives for the jobs that exist.
//! The expected sets are computed from the JSON API's job listing (each job's attributes, state, current wait
//! segment and outcome), independently of the metrics code; the histogram's series count follows from its sets
//! times (boundaries + 3).

use serde_json::Value;
use startline_tests::{binary, http_get, http_get_text, Collector};
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// Every job of the collector, through the paged listing.
fn all_jobs(c: &Collector) -> Vec<Value> {
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let path = match &token {
            Some(t) => format!("/api/v1/jobs?limit=1000&page_token={}", startline_tests::query_escape(t)),
            None => "/api/v1/jobs?limit=1000".to_string(),
        };
        let (status, body) = http_get(c.http, &path);
        assert_eq!(status, 200, "{body}");
        out.extend(body["jobs"].as_array().expect("jobs").iter().cloned());
        match body["next_page_token"].as_str() {
            Some(t) => token = Some(t.to_string()),
            None => return out,
        }
    }
}

/// The label sets of the samples of one metric family (`name` exactly, or `name_bucket`/`_sum`/`_count` for a
/// histogram when `suffix` is given), without `le` and the scope label.
fn label_sets(text: &str, name: &str) -> BTreeSet<BTreeMap<String, String>> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let labels = rest.strip_prefix('{')?.split_once('}')?.0;
            let mut m = BTreeMap::new();
            for part in labels.split("\",") {
                let (k, v) = part.split_once("=\"")?;
                if k != "le" && k != "otel_scope_name" {
                    m.insert(k.to_string(), v.trim_end_matches('"').to_string());
                }
            }
            Some(m)
        })
        .collect()
}

fn samples(text: &str, name: &str) -> usize {
    text.lines().filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{')).count()
}

fn set(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[test]
fn forty_pools_four_gpu_classes_fit_the_documented_series_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let sim = Command::new(binary("startline-agent"))
        .args([
            "--collector",
            &c.endpoint(),
            "simulate",
            "--pools",
            "40",
            "--gpu-classes",
            "4",
            "--history",
            "2d",
            "--jobs",
            "4000",
            "--seed",
            "13",
        ])
        .output()
        .expect("simulator");
    assert!(sim.status.success(), "{}", String::from_utf8_lossy(&sim.stderr));
    let (status, text) = http_get_text(c.http, "/metrics");
    assert_eq!(status, 200);

    // No overflow anywhere, and the overflow counter is there (at 0) for each limited metric.
    assert!(!text.contains("otel_metric_overflow"), "an overflow series exists");
    let overflow = label_sets(&text, "startline_collector_metric_overflow_total");
    assert_eq!(overflow.len(), 12, "{overflow:?}");
    assert!(text
        .lines()
        .filter(|l| l.starts_with("startline_collector_metric_overflow_total{"))
        .all(|l| l.ends_with(" 0")));

    // The expected attribute sets, from the jobs.
    let jobs = all_jobs(&c);
    assert_eq!(jobs.len(), 4000);
    let mut pools = BTreeSet::new();
    let mut classes = BTreeSet::new();
    let (mut ttfs, mut finished, mut waiting, mut waiting_gpus, mut oldest) =
        (BTreeSet::new(), BTreeSet::new(), BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    let mut gpu_time_pools = BTreeSet::new();
    // GPU-seconds of ended jobs, the plain way: requested GPUs x (end - submit).
    let mut ended_gpu_seconds = 0.0;
    for j in &jobs {
        let s = |k: &str| j[k].as_str().expect(k).to_string();
        let (kind, provider, pool, priority, class, region) =
            (s("pool_kind"), s("provider"), s("pool"), s("priority"), s("gpu_class"), s("region"));
        pools.insert(pool.clone());
        classes.insert(class.clone());
        let job = [
            ("pool_kind", kind.as_str()),
            ("provider", provider.as_str()),
            ("pool", pool.as_str()),
            ("priority", priority.as_str()),
            ("gpu_class", class.as_str()),
            ("region", region.as_str()),
        ];
        let pool_only = &job[..4];
        if !j["first_step_at"].is_null() {
            ttfs.insert(set(&job));
        }
        if let Some(o) = j["outcome"].as_str() {
            let mut m = set(&job);
            m.insert("outcome".into(), o.into());
            finished.insert(m);
            if j["gpu_count"].as_u64().unwrap_or(0) > 0 && j["done_at"] != j["submitted_at"] {
                gpu_time_pools.insert(set(pool_only));
            }
            let at = |k: &str| startline_collector::time::parse_time(j[k].as_str().expect(k)).expect("time") as f64;
            ended_gpu_seconds += j["gpu_count"].as_f64().unwrap_or(0.0) * (at("done_at") - at("submitted_at")) / 1000.0;
        }
        if let Some(seg) = j["current_wait"]["segment"].as_str() {
            let mut m = set(pool_only);
            m.insert("segment".into(), seg.into());
            waiting.insert(m);
            oldest.insert(set(pool_only));
            if j["gpu_count"].as_u64().unwrap_or(0) > 0 {
                let mut m = set(pool_only);
                m.insert("gpu_class".into(), class.clone());
                waiting_gpus.insert(m);
            }
        }
    }
    assert_eq!(pools.len(), 40, "{pools:?}");
    assert_eq!(classes.len(), 4, "{classes:?}");
    assert!(!waiting.is_empty() && !finished.is_empty(), "the fleet has jobs in flight and ended ones");

    assert_eq!(label_sets(&text, "startline_jobs_started_total"), ttfs);
    assert_eq!(label_sets(&text, "startline_jobs_time_to_first_step_seconds_count"), ttfs);
    assert_eq!(label_sets(&text, "startline_jobs_finished_total"), finished);
    assert_eq!(label_sets(&text, "startline_jobs_waiting"), waiting);
    assert_eq!(label_sets(&text, "startline_jobs_waiting_gpus"), waiting_gpus);
    assert_eq!(label_sets(&text, "startline_jobs_oldest_wait_seconds"), oldest);
    // GPU time by category: pool attributes and a closed category, for every pool with an ended job.
    let gpu_time = label_sets(&text, "startline_jobs_gpu_seconds_total");
    let categories = ["waiting", "preparing", "requeue_wait", "checkpoint", "lost", "failed", "productive"];
    assert!(gpu_time.iter().all(|m| m.get("category").is_some_and(|c| categories.contains(&c.as_str()))));
    let pools_seen: BTreeSet<_> = gpu_time
        .into_iter()
        .map(|mut m| {
            m.remove("category");
            m
        })
        .collect();
    assert_eq!(pools_seen, gpu_time_pools);
    // The categories add up to every ended job's GPU time.
    let counted: f64 = text
        .lines()
        .filter(|l| l.starts_with("startline_jobs_gpu_seconds_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(ended_gpu_seconds > 0.0);
    assert!((counted - ended_gpu_seconds).abs() <= 1e-6 * ended_gpu_seconds, "{counted} vs {ended_gpu_seconds}");
    // The histogram: each set has one sample per boundary, +Inf, _sum and _count (19 boundaries plus each
    // default SLO threshold that is not one already: 10 min and 2 h are, so 19).
    let buckets = samples(&text, "startline_jobs_time_to_first_step_seconds_bucket");
    assert_eq!(buckets, ttfs.len() * 20, "one bucket sample per boundary and +Inf");
    // Segment metrics carry no GPU class or region.
    assert!(label_sets(&text, "startline_jobs_wait_duration_seconds_count")
        .iter()
        .all(|m| !m.contains_key("gpu_class") && !m.contains_key("region") && m.contains_key("segment")));
    // Well inside the budget: the documented bound P x 2 x G x R for one region and one class per pool.
    assert!(ttfs.len() <= 40 * 2, "{}", ttfs.len());
}
