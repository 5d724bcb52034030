//! Backup, verify and restore with the real binaries, as a sequence: ingest under load, a backup through the admin
//! API mid-stream (`startline-collector backup`), more ingest, kill -9, `verify --backup`, `restore` into a new
//! directory, a collector started on it. Every batch acknowledged before the backup began is there, none sent after
//! it ended, a batch in between whole or absent; the restored jobs answer exactly as the original collector did;
//! a damaged backup is refused naming the file, and restores nothing.

use startline_proto::pb::{self, ingest_service_client::IngestServiceClient, lifecycle_event::Kind};
use startline_tests::{ago, binary, event, path_escape, submitted, Collector};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Jobs per batch; each job's four events travel in one batch.
const JOBS_PER_BATCH: usize = 4;

/// The jobs of batch `n`.
fn batch(n: u64) -> Vec<pb::LifecycleEvent> {
    let t = ago(3600);
    let mut out = Vec::new();
    for j in 0..JOBS_PER_BATCH {
        let job = format!("backup/{n}/{j}");
        let wait = (n as i64 * 7 + j as i64 * 13) % 600 * 1000;
        out.push(event(&job, "s", t, submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Normal, 8)));
        out.push(event(
            &job,
            "q",
            t,
            Kind::Queued(pb::Queued { reason: pb::WaitReason::Capacity as i32, ..Default::default() }),
        ));
        out.push(event(&job, "f", t + wait, Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })));
        if j % 2 == 0 {
            out.push(event(
                &job,
                "d",
                t + wait + 60_000,
                Kind::Done(pb::Done { outcome: pb::Outcome::Succeeded as i32, ..Default::default() }),
            ));
        }
    }
    out
}

/// One batch as the publisher saw it: when it was sent and when (if) it was acknowledged.
#[derive(Debug, Clone, Copy)]
struct Sent {
    n: u64,
    sent: Instant,
    acked: Option<Instant>,
}

/// Publishes batch after batch until stopped or the collector goes away.
async fn publish(endpoint: String, log: Arc<Mutex<Vec<Sent>>>, stop: Arc<std::sync::atomic::AtomicBool>) {
    let Ok(mut client) = IngestServiceClient::connect(endpoint).await else { return };
    let mut n = 0;
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        n += 1;
        let sent = Instant::now();
        let r = client.publish_batch(pb::PublishRequest { batch_seq: n, events: batch(n) }).await;
        let acked = r.is_ok().then(Instant::now);
        log.lock().unwrap_or_else(|p| p.into_inner()).push(Sent { n, sent, acked });
        if acked.is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn collector_cmd(args: &[&str]) -> std::process::Output {
    Command::new(binary("startline-collector")).args(args).output().expect("run startline-collector")
}

/// The job's detail without the fields that move with the clock.
fn detail(c: &Collector, job: &str) -> Option<serde_json::Value> {
    let (status, mut v) = c.get(&format!("/api/v1/jobs/{}", path_escape(job)));
    if status == 404 {
        return None;
    }
    assert_eq!(status, 200, "{job}: {v}");
    if let Some(o) = v.as_object_mut() {
        o.remove("waiting_seconds");
        if let Some(t) = o.get_mut("timeline").and_then(|t| t.as_object_mut()) {
            t.remove("initial_wait_seconds");
            t.remove("time_by_category_seconds");
        }
    }
    Some(v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_under_load_restores_exactly_what_was_acknowledged_before_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("db");
    let c = Collector::start(&db, &[]);
    let api = format!("http://{}", c.http);
    let log = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publisher = tokio::spawn(publish(c.endpoint(), log.clone(), stop.clone()));
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // The backup, mid-stream, through the command a user runs.
    let to = dir.path().join("backup");
    let began = Instant::now();
    let out = tokio::task::spawn_blocking({
        let (api, to) = (api.clone(), to.clone());
        move || collector_cmd(&["backup", "--api", &api, "--to", to.to_str().expect("utf-8")])
    })
    .await
    .expect("backup task");
    let ended = Instant::now();
    assert!(out.status.success(), "backup: {}", String::from_utf8_lossy(&out.stderr));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("backup status JSON");
    assert_eq!(status["state"], "done", "{status}");
    let through = status["through_seq"].as_u64().expect("through_seq");
    tokio::time::sleep(Duration::from_millis(800)).await;

    // What the original answers for the jobs of batches acknowledged before the backup began.
    let before: Vec<u64> = {
        let l = log.lock().unwrap_or_else(|p| p.into_inner());
        l.iter().filter(|s| s.acked.is_some_and(|a| a < began)).map(|s| s.n).collect()
    };
    assert!(before.len() > 20, "{} batches acknowledged before the backup", before.len());
    let mut original = BTreeMap::new();
    for n in before.iter().step_by((before.len() / 40).max(1)) {
        for j in 0..JOBS_PER_BATCH {
            let job = format!("backup/{n}/{j}");
            original.insert(job.clone(), detail(&c, &job).expect("an acknowledged job"));
        }
    }
    c.signal_and_wait("KILL");
    stop.store(true, std::sync::atomic::Ordering::Release);
    let _ = publisher.await;
    let sent = log.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let after: Vec<u64> = sent.iter().filter(|s| s.sent > ended).map(|s| s.n).collect();
    assert!(after.len() > 10, "{} batches sent after the backup ended", after.len());

    // The backup checks out; restored into a new directory, a collector starts on it.
    let out = collector_cmd(&["verify", "--backup", to.to_str().expect("utf-8")]);
    assert!(out.status.success(), "verify: {}", String::from_utf8_lossy(&out.stderr));
    let restored = dir.path().join("restored");
    let out = collector_cmd(&[
        "--data-dir",
        restored.to_str().expect("utf-8"),
        "restore",
        "--from",
        to.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "restore: {}", String::from_utf8_lossy(&out.stderr));
    let r = Collector::start(&restored, &[]);
    let whole = |n: u64| -> Option<bool> {
        let present: Vec<bool> = (0..JOBS_PER_BATCH)
            .map(|j| {
                let job = format!("backup/{n}/{j}");
                let v = detail(&r, &job);
                if let Some(v) = &v {
                    let want = if j % 2 == 0 { 4 } else { 3 };
                    assert_eq!(v["events_total"].as_u64(), Some(want), "{job}: a batch is stored whole");
                }
                v.is_some()
            })
            .collect();
        if present.iter().all(|p| *p) {
            Some(true)
        } else if present.iter().all(|p| !*p) {
            Some(false)
        } else {
            None
        }
    };
    for n in &before {
        assert_eq!(whole(*n), Some(true), "batch {n} was acknowledged before the backup began");
    }
    for n in &after {
        assert_eq!(whole(*n), Some(false), "batch {n} was sent after the backup ended");
    }
    let between: Vec<u64> =
        sent.iter().filter(|s| !before.contains(&s.n) && !after.contains(&s.n)).map(|s| s.n).collect();
    for n in &between {
        assert!(whole(*n).is_some(), "batch {n} (sent during the backup) is whole or absent");
    }
    eprintln!(
        "backup through sequence {through}: {} events; batches acknowledged before it {}, sent after it {}, during it {}; {} jobs compared",
        status["events"],
        before.len(),
        after.len(),
        between.len(),
        original.len()
    );
    // The same answers as the original collector gave.
    for (job, want) in &original {
        assert_eq!(detail(&r, job).as_ref(), Some(want), "{job} answers as it did before the crash");
    }
    // The restored collector's log holds exactly the backup's events.
    drop(r);
    let out = collector_cmd(&["--data-dir", restored.to_str().expect("utf-8"), "verify"]);
    assert!(out.status.success(), "verify the restored store: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("verify JSON");
    assert_eq!(report["report"]["log_events"], status["events"], "{report}");
    assert!(status["events"].as_u64().is_some_and(|e| e > 0 && e <= through), "{status}");

    damaged_backups_are_refused_naming_the_file(&to, dir.path());
}

/// A backup with a flipped byte, a cut events file or no manifest: `verify --backup` exits 1 naming the file, and
/// `restore` makes nothing; a restore into a directory that is not empty is refused.
fn damaged_backups_are_refused_naming_the_file(good: &Path, scratch: &Path) {
    let copy = |name: &str| {
        let d = scratch.join(name);
        std::fs::create_dir_all(&d).expect("dir");
        for f in ["events.zst", "manifest.json"] {
            std::fs::copy(good.join(f), d.join(f)).expect("copy");
        }
        d
    };
    let flipped = copy("flipped");
    let mut bytes = std::fs::read(flipped.join("events.zst")).expect("read");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    std::fs::write(flipped.join("events.zst"), &bytes).expect("write");
    let cut = copy("cut");
    std::fs::write(cut.join("events.zst"), &bytes[..mid]).expect("write");
    let headless = copy("headless");
    std::fs::remove_file(headless.join("manifest.json")).expect("rm");
    for (d, names) in [(&flipped, "events.zst"), (&cut, "events.zst"), (&headless, "manifest.json")] {
        let out = collector_cmd(&["verify", "--backup", d.to_str().expect("utf-8")]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{}: verify passed a damaged backup", d.display());
        assert!(err.contains(names), "{}: the error names {names}: {err}", d.display());
        let target = scratch.join(format!("restore-{}", d.file_name().and_then(|n| n.to_str()).unwrap_or("x")));
        let out = collector_cmd(&[
            "--data-dir",
            target.to_str().expect("utf-8"),
            "restore",
            "--from",
            d.to_str().expect("utf-8"),
        ]);
        assert!(!out.status.success(), "{}: restore took a damaged backup", d.display());
        assert!(!target.exists(), "{}: a refused restore leaves nothing behind", d.display());
    }
    let occupied = scratch.join("occupied");
    std::fs::create_dir_all(&occupied).expect("dir");
    std::fs::write(occupied.join("something"), b"x").expect("write");
    let out = collector_cmd(&[
        "--data-dir",
        occupied.to_str().expect("utf-8"),
        "restore",
        "--from",
        good.to_str().expect("utf-8"),
    ]);
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("not empty"),
        "restore into a used directory"
    );
}
