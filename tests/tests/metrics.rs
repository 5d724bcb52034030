//! `/metrics`: the exposition passes `promtool check metrics` (Debian `prometheus`, installed by
//! scripts/test.sh), and its numbers match the JSON API for the same jobs.

use startline_agent::uplink::{Publisher, UplinkSettings};
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_tests::{ago, event, submitted, Collector};
use std::io::Write;
use std::process::{Command, Stdio};

fn metrics_text(c: &Collector) -> String {
    let (status, body) = startline_tests::http_get_text(c.http, "/metrics");
    assert_eq!(status, 200);
    body
}

/// Sum of every sample of `name` whose labels contain all of `with`.
fn sum(text: &str, name: &str, with: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| with.iter().all(|w| l.contains(w)))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_pass_promtool_and_match_the_api() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");
    let mut evs = Vec::new();
    // Three started jobs (TTFS 60 s, 300 s, 900 s), two waiting (capacity, image pull), one cancelled early.
    for (i, ttfs) in [60i64, 300, 900].iter().enumerate() {
        let j = format!("started/{i}");
        evs.push(event(&j, "s", ago(3600), submitted(pb::PoolKind::Managed, pb::PriorityClass::Urgent, 8)));
        evs.push(event(
            &j,
            "q",
            ago(3600) + 1000,
            Kind::Queued(pb::Queued { reason: pb::WaitReason::Capacity as i32, ..Default::default() }),
        ));
        evs.push(event(
            &j,
            "f",
            ago(3600) + ttfs * 1000,
            Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() }),
        ));
    }
    evs.push(event("wait/0", "s", ago(1200), submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Normal, 8)));
    evs.push(event(
        "wait/0",
        "q",
        ago(1190),
        Kind::Queued(pb::Queued { reason: pb::WaitReason::Capacity as i32, ..Default::default() }),
    ));
    evs.push(event("wait/1", "s", ago(600), submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Normal, 8)));
    evs.push(event(
        "wait/1",
        "p",
        ago(500),
        Kind::Preparing(pb::Preparing { phase: pb::PreparingPhase::ImagePull as i32, ..Default::default() }),
    ));
    evs.push(event("gone/0", "s", ago(400), submitted(pb::PoolKind::Managed, pb::PriorityClass::Normal, 8)));
    evs.push(event(
        "gone/0",
        "d",
        ago(300),
        Kind::Done(pb::Done { outcome: pb::Outcome::Cancelled as i32, ..Default::default() }),
    ));
    let mut bad = event("x", "bad", ago(1), Kind::NodeLost(pb::NodeLost::default()));
    bad.source.clear();
    evs.push(bad);
    up.send(evs).await.expect("send");
    up.flush().await.expect("flush");

    let text = metrics_text(&c);
    // promtool lints the exposition.
    let mut p = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs (scripts/test.sh installs Debian's prometheus)");
    p.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write");
    let out = p.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Counts against the API.
    let (_, jobs) = c.get("/api/v1/jobs?limit=100");
    let jobs = jobs["jobs"].as_array().cloned().expect("jobs");
    let started: Vec<f64> = jobs.iter().filter_map(|j| j["time_to_first_step_seconds"].as_f64()).collect();
    let waiting = jobs
        .iter()
        .filter(|j| ["queued", "assigned", "preparing"].contains(&j["state"].as_str().unwrap_or("")))
        .count();
    assert_eq!(sum(&text, "startline_jobs_started_total", &[]), started.len() as f64);
    assert_eq!(sum(&text, "startline_jobs_time_to_first_step_seconds_count", &[]), started.len() as f64);
    let ttfs_sum = sum(&text, "startline_jobs_time_to_first_step_seconds_sum", &[]);
    assert!((ttfs_sum - started.iter().sum::<f64>()).abs() < 1e-6, "{ttfs_sum} vs {started:?}");
    // Histogram buckets: the 300 s bucket holds the 60 s and 300 s jobs.
    assert_eq!(sum(&text, "startline_jobs_time_to_first_step_seconds_bucket", &["le=\"300\""]), 2.0);
    assert_eq!(sum(&text, "startline_jobs_waiting", &[]), waiting as f64);
    assert_eq!(sum(&text, "startline_jobs_waiting", &["segment=\"preparing:image_pull\""]), 1.0);
    assert_eq!(sum(&text, "startline_jobs_finished_total", &["outcome=\"cancelled\""]), 1.0);
    // The cancelled job never started: it is not in the time-to-first-step histogram, but it is counted here.
    assert_eq!(sum(&text, "startline_jobs_ended_before_start_total", &["outcome=\"cancelled\""]), 1.0);
    assert_eq!(sum(&text, "startline_jobs_ended_before_start_total", &[]), 1.0);
    assert_eq!(sum(&text, "startline_collector_events_total", &["result=\"rejected\""]), 1.0);
    assert_eq!(sum(&text, "startline_collector_events_total", &["result=\"accepted\""]), 15.0);
    let oldest = sum(&text, "startline_jobs_oldest_wait_seconds", &["pool_kind=\"dedicated\""]);
    assert!((1199.0..1300.0).contains(&oldest), "oldest dedicated wait {oldest}");
    // SLO gauges equal the SLO API.
    let (_, slos) = c.get("/api/v1/slos");
    for s in slos["slos"].as_array().expect("slos") {
        let name = s["name"].as_str().expect("name");
        let label = format!("slo=\"{name}\"");
        let m = sum(&text, "startline_slo_compliance_ratio", &[&label]);
        assert!((m - s["status"]["compliance"].as_f64().expect("c")).abs() < 1e-9, "{name}");
        assert_eq!(
            sum(&text, "startline_slo_jobs", &[&label, "result=\"bad\""]),
            s["status"]["bad"].as_f64().expect("bad")
        );
        // The SLI counters: every job decided since start, once (no restatements in this run).
        for result in ["good", "bad"] {
            assert_eq!(
                sum(&text, "startline_slo_decisions_total", &[&label, &format!("result=\"{result}\"")]),
                s["status"][result].as_f64().expect("count"),
                "{name} {result}"
            );
        }
    }
    // Never a job id as a label.
    assert!(!text.contains("job_id") && !text.contains("started/0"));
}
