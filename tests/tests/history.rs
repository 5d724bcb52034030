//! History files end to end, with the real collector and the real DuckDB (Python package): jobs of every shape
//! (managed and dedicated, normal and urgent, preempted and requeued, failed, cancelled before starting, several
//! preparation phases, checkpoints) that ended on past days are sealed into one Parquet file per day; DuckDB
//! reads the directory as it is and `tests/history/reproduce.py` rebuilds `GET /api/v1/compare` and
//! `GET /api/v1/goodput` from the files alone: every count, percentile, interval, mean, test statistic, wait
//! split and GPU-hour equals the API's. A restart reads the footers and rewrites nothing; a late event for a
//! sealed job rewrites its day, and only that day.

use startline_proto::pb::{self, ingest_service_client::IngestServiceClient, lifecycle_event::Kind};
use startline_tests::{event, workspace_root, Collector};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

const DAY: i64 = 86_400_000;

fn kind_sub(job: usize) -> Kind {
    let managed = job % 3 == 0;
    Kind::Submitted(pb::Submitted {
        pool_kind: if managed { pb::PoolKind::Managed } else { pb::PoolKind::Dedicated } as i32,
        provider: if managed { "sagemaker" } else { "slurm" }.into(),
        pool: if managed { "ml.p4d" } else { ["a100", "h100"][job % 2] }.into(),
        priority: if job % 5 == 0 { pb::PriorityClass::Urgent } else { pb::PriorityClass::Normal } as i32,
        gpu_class: ["a100", "h100", ""][job % 3].into(),
        gpu_count: [1, 8, 16, 0][job % 4],
        node_count: 1,
        region: "eu".into(),
        team: ["nlp", "vision", ""][job % 3].into(),
        project: "p".into(),
        ..Default::default()
    })
}

/// Job `j`'s events: submitted `days_ago`-ish days before `now`, a shape chosen by `j`, ended at least two days
/// before `now` (so its UTC day is over).
fn job_events(j: usize, now: i64) -> Vec<pb::LifecycleEvent> {
    let id = format!("hist/{j}");
    let s = now - 6 * DAY + (j as i64 * 7_919_000) % (3 * DAY);
    let wait = 1000 * ((j as i64 * 37) % 5400 + 1);
    let mut v = vec![
        event(&id, "s", s, kind_sub(j)),
        event(&id, "q", s, Kind::Queued(pb::Queued { reason: [1, 2, 3][j % 3], ..Default::default() })),
    ];
    if j % 7 == 6 {
        // Cancelled before it started.
        v.push(event(
            &id,
            "d",
            s + wait,
            Kind::Done(pb::Done { outcome: pb::Outcome::Cancelled as i32, ..Default::default() }),
        ));
        return v;
    }
    let node = format!("node-{}", j % 11);
    v.push(event(
        &id,
        "n",
        s + wait / 2,
        Kind::NodeAssigned(pb::NodeAssigned { nodes: vec![node], ..Default::default() }),
    ));
    v.push(event(&id, "p", s + wait / 2, Kind::Preparing(pb::Preparing { phase: 2, ..Default::default() })));
    v.push(event(&id, "p2", s + wait * 3 / 4, Kind::Preparing(pb::Preparing { phase: 3, ..Default::default() })));
    let origin =
        if j % 3 == 0 && j % 2 == 0 { pb::StepOrigin::ContainerStart } else { pb::StepOrigin::TrainingProcess };
    v.push(event(&id, "f", s + wait, Kind::FirstStep(pb::FirstStep { step: 1, origin: origin as i32 })));
    let mut t = s + wait;
    v.push(event(
        &id,
        "c",
        t + 600_000,
        Kind::Checkpoint(pb::Checkpoint { step: 100, save_seconds: 12.5, ..Default::default() }),
    ));
    t += 1_800_000;
    if j % 4 == 1 {
        // Preempted after its checkpoint, requeued, started again.
        v.push(event(&id, "x", t, Kind::Preempted(pb::Preempted { checkpoint_saved: false, ..Default::default() })));
        v.push(event(&id, "r", t, Kind::Requeued(pb::Requeued { resume_step: 100 })));
        t += 900_000;
        v.push(event(
            &id,
            "f2",
            t,
            Kind::FirstStep(pb::FirstStep { step: 101, origin: pb::StepOrigin::TrainingProcess as i32 }),
        ));
        t += 1_200_000;
    }
    let outcome = if j % 9 == 4 { pb::Outcome::Failed } else { pb::Outcome::Succeeded };
    v.push(event(
        &id,
        "d",
        t,
        Kind::Done(pb::Done { outcome: outcome as i32, exit_code: Some(i32::from(j % 9 == 4)), ..Default::default() }),
    ));
    v
}

fn python(args: &[&str]) -> serde_json::Value {
    let out = Command::new("python3")
        .arg(workspace_root().join("tests/history/reproduce.py"))
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "reproduce.py {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("reproduce.py prints JSON")
}

fn files(dir: &Path) -> BTreeMap<PathBuf, SystemTime> {
    let mut out = BTreeMap::new();
    let Ok(parts) = std::fs::read_dir(dir) else { return out };
    for p in parts.flatten() {
        let f = p.path().join("jobs.parquet");
        if let Ok(m) = std::fs::metadata(&f) {
            out.insert(f, m.modified().expect("mtime"));
        }
    }
    out
}

/// The API's answer without what the files cannot know (SLO compliance and cost depend on the configuration; the
/// history deletion mark on the collector's state).
fn without_config_parts(mut v: serde_json::Value) -> serde_json::Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("history_deleted_through");
        o.remove("as_of");
    }
    for g in v.get_mut("groups").and_then(|g| g.as_array_mut()).into_iter().flatten() {
        for side in ["left", "right"] {
            if let Some(s) = g.get_mut(side).and_then(|s| s.as_object_mut()) {
                s.remove("slo");
                s.remove("cost");
            }
        }
    }
    v
}

async fn publish(endpoint: String, events: Vec<pb::LifecycleEvent>) {
    let mut client = IngestServiceClient::connect(endpoint).await.expect("connect");
    for (n, chunk) in events.chunks(500).enumerate() {
        let r = client
            .publish_batch(pb::PublishRequest { batch_seq: n as u64 + 1, events: chunk.to_vec() })
            .await
            .expect("publish")
            .into_inner();
        assert!(r.rejections.is_empty(), "{:?}", r.rejections);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duckdb_reproduces_the_apis_compare_and_goodput_from_the_history_files() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let config = tmp.path().join("collector.toml");
    std::fs::write(
        &config,
        "[store]\nfold_after = \"1s\"\nfold_interval = \"100ms\"\n[history]\nseal_after = \"0s\"\nseal_interval = \"1s\"\n",
    )
    .expect("config");
    let cfg = config.to_str().expect("utf-8 path");
    let c = Collector::start(&data, &["--config", cfg]);
    let now = startline_proto::time::now_ms();
    const JOBS: usize = 400;
    let events: Vec<_> = (0..JOBS).flat_map(|j| job_events(j, now)).collect();
    publish(c.endpoint(), events).await;

    // Every job sealed: one file per end day, the rows adding up to every job.
    let history = data.join("history");
    let dir = history.to_str().expect("utf-8 path").to_string();
    startline_tests::wait_until("every job in the history files", Duration::from_secs(60), || {
        !files(&history).is_empty() && python(&["check", "--dir", &dir])["jobs"] == JOBS
    });
    let check = python(&["check", "--dir", &dir]);
    assert_eq!(check["ok"], true, "{check}");
    assert!(check["files"].as_u64().expect("files") >= 3, "jobs ended on several days: {check}");

    // compare, grouped and not, and goodput by two attributes: the files answer exactly as the API.
    for (left, right, by) in [
        ("pool_kind=managed", "pool_kind=dedicated", "priority"),
        ("pool_kind=managed", "pool_kind=dedicated", ""),
        ("priority=urgent", "priority=normal", "pool"),
    ] {
        let q = format!(
            "/api/v1/compare?left={left}&right={right}&window=30d{}",
            if by.is_empty() { String::new() } else { format!("&by={by}") }
        );
        let (status, api) = c.get(&q);
        assert_eq!(status, 200, "{api}");
        let now = startline_proto::time::now_ms().to_string();
        let files_answer = python(&[
            "compare",
            "--dir",
            &dir,
            "--left",
            left,
            "--right",
            right,
            "--by",
            by,
            "--window-ms",
            &(30 * DAY).to_string(),
            "--now-ms",
            &now,
        ]);
        let api = without_config_parts(api);
        assert!(api["groups"][0]["left"]["jobs"].as_u64().expect("jobs") > 0, "{api}");
        assert_eq!(without_config_parts(files_answer), api, "compare {q}");
    }
    for by in ["pool_kind", "team"] {
        let (status, api) = c.get(&format!("/api/v1/goodput?by={by}&window=30d"));
        assert_eq!(status, 200, "{api}");
        let now = startline_proto::time::now_ms().to_string();
        let files_answer =
            python(&["goodput", "--dir", &dir, "--by", by, "--window-ms", &(30 * DAY).to_string(), "--now-ms", &now]);
        assert_eq!(api["total"]["jobs"], JOBS, "{api}");
        assert_eq!(without_config_parts(files_answer), without_config_parts(api), "goodput by {by}");
    }

    // A restart reads the footers: nothing is written again.
    let before = files(&history);
    let status = c.signal_and_wait("TERM");
    assert!(status.success(), "{status}");
    let c = Collector::start(&data, &["--config", cfg]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(files(&history), before, "a restart rewrote history files");

    // A late event for one sealed job rewrites its day only.
    let late = event(
        "hist/1",
        "late-ckpt",
        now - 6 * DAY + 7_919_000 + 60_000,
        Kind::Checkpoint(pb::Checkpoint { step: 5, ..Default::default() }),
    );
    publish(c.endpoint(), vec![late]).await;
    startline_tests::wait_until("the late job's day written again", Duration::from_secs(30), || {
        files(&history).iter().filter(|(f, m)| before.get(*f) != Some(*m)).count() == 1
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let changed: Vec<_> = files(&history).into_iter().filter(|(f, m)| before.get(f) != Some(m)).collect();
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert_eq!(python(&["check", "--dir", &dir])["jobs"], JOBS);
    drop(c);
}

/// The reproduction script's own check: hand-made files with answers computed independently in plain Python.
#[test]
fn the_reproduction_script_passes_its_self_test() {
    let out =
        Command::new("python3").arg(workspace_root().join("tests/history/selftest.py")).output().expect("python3 runs");
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}
