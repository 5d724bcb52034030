//! A full disk, for real: the collector's store on a small tmpfs mounted by the test (the test runs as root, as
//! CI does). A filler file takes the free space; the first failed write halts store writes: clients get
//! `UNAVAILABLE` naming the cause at once, nothing unacknowledged is acknowledged, `/healthz` and `/metrics` say
//! why, reads are served, and the process stays up. When the filler is deleted, the collector restarts itself in
//! place (same process id, same ports) and ingest resumes. Three fill/free cycles, then kill -9 and restart:
//! every acknowledged event is there. Also: a stop while halted ends within the drain deadline, and with
//! `store.after_write_failure = "exit"` the process exits with code 75 once space returns.

use startline_proto::pb::{self, ingest_service_client::IngestServiceClient, lifecycle_event::Kind};
use startline_tests::{ago, event, http_get, http_get_text, submitted, Collector};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).expect("mount point");
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("run mount");
        assert!(
            st.success(),
            "cannot mount a tmpfs at {} (this test needs root, as CI has; it simulates a full disk for real)",
            dir.display()
        );
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the filesystem with a file until writing fails; returns its path.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).expect("filler");
    let chunk = vec![0u8; 64 * 1024];
    while f.write_all(&chunk).is_ok() {}
    // Byte by byte for the last partial chunk.
    while f.write_all(&[0]).is_ok() {}
    let _ = f.sync_all();
    path
}

fn batch(round: u32, n: u32) -> Vec<pb::LifecycleEvent> {
    let base = ago(3600);
    (0..n)
        .map(|i| {
            let job = format!("full-{round}-{}", i / 10);
            if i % 10 == 0 {
                event(&job, &format!("s{i}"), base, submitted(pb::PoolKind::Managed, pb::PriorityClass::Normal, 1))
            } else {
                event(
                    &job,
                    &format!("c{i}"),
                    base + i64::from(i) * 1000,
                    Kind::Checkpoint(pb::Checkpoint { step: u64::from(i), ..Default::default() }),
                )
            }
        })
        .collect()
}

fn ids(events: &[pb::LifecycleEvent]) -> Vec<(String, String)> {
    events.iter().map(|e| (e.job_id.clone(), e.event_id.clone())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_with_the_cause_and_ingest_resumes_by_itself_when_space_returns() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mnt = tmp.path().join("mnt");
    let _fs = Tmpfs::mount(&mnt, "24m");
    // The store is the mount point itself, so the collector's log (next to it, `mnt.log`) stays off the tmpfs.
    let db = mnt.clone();
    let mut c = Collector::start(&db, &[]);
    let pid = c.child.id();
    let mut client = IngestServiceClient::connect(c.endpoint()).await.expect("connect");
    let mut acked: BTreeSet<(String, String)> = BTreeSet::new();
    let mut seq = 0u64;
    for cycle in 0..3u32 {
        // Some traffic with space left.
        for r in 0..5 {
            seq += 1;
            let evs = batch(cycle * 1000 + r, 200);
            let ack = client
                .publish_batch(pb::PublishRequest { batch_seq: seq, events: evs.clone() })
                .await
                .unwrap_or_else(|e| panic!("cycle {cycle}: a batch with space left failed: {e}"))
                .into_inner();
            assert_eq!(ack.accepted, 200);
            acked.extend(ids(&evs));
        }
        // Take the rest of the space; keep sending until writes fail.
        let filler = fill(&mnt);
        let mut failure = None;
        for r in 0..2000u32 {
            seq += 1;
            let evs = batch(cycle * 1000 + 100 + r, 200);
            match client.publish_batch(pb::PublishRequest { batch_seq: seq, events: evs.clone() }).await {
                Ok(ack) => {
                    assert_eq!(ack.into_inner().accepted, 200);
                    acked.extend(ids(&evs));
                }
                Err(status) => {
                    failure = Some(status);
                    break;
                }
            }
        }
        let status = failure.unwrap_or_else(|| panic!("cycle {cycle}: writes never failed on a full disk"));
        assert_eq!(status.code(), tonic::Code::Unavailable, "cycle {cycle}: {status:?}");
        assert!(status.message().contains("no space left on device"), "cycle {cycle}: {}", status.message());
        // Health says why; the metric too; the process is up and answers reads.
        let (code, health) = http_get(c.http, "/healthz");
        assert_eq!(code, 503, "{health}");
        assert!(health["reason"].as_str().is_some_and(|r| r.contains("no space left on device")), "{health}");
        let (_, metrics) = http_get_text(c.http, "/metrics");
        assert!(
            metrics.lines().any(|l| l.starts_with("startline_collector_store_healthy") && l.ends_with(" 0")),
            "{metrics}"
        );
        assert!(
            metrics.lines().any(|l| l.starts_with("startline_collector_store_writes_halted") && l.ends_with(" 1")),
            "{metrics}"
        );
        assert!(metrics.contains("startline_collector_store_write_errors_total"), "write errors counted");
        let (code, _) = http_get(c.http, "/api/v1/slos");
        assert_eq!(code, 200, "reads keep working while writes fail");
        // Still failing while the disk is full: nothing is acknowledged, and the answer comes at once.
        seq += 1;
        let asked = Instant::now();
        let err = client
            .publish_batch(pb::PublishRequest { batch_seq: seq, events: batch(cycle * 1000 + 900, 50) })
            .await
            .expect_err("still full");
        assert!(asked.elapsed() < Duration::from_secs(2), "refused at once, not at a deadline: {:?}", asked.elapsed());
        assert_eq!(err.code(), tonic::Code::Unavailable);
        assert!(err.message().contains("no space left on device"), "the cause stays: {}", err.message());

        // Space returns: the collector restarts itself in place and ingest resumes.
        std::fs::remove_file(&filler).expect("remove filler");
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut resumed = false;
        while Instant::now() < deadline {
            seq += 1;
            let evs = batch(cycle * 1000 + 950, 50);
            if let Ok(ack) = client.publish_batch(pb::PublishRequest { batch_seq: seq, events: evs.clone() }).await {
                let ack = ack.into_inner();
                assert_eq!(ack.accepted + ack.duplicates, 50);
                acked.extend(ids(&evs));
                resumed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if !resumed {
            let log = std::fs::read_to_string(&c.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!(
                "cycle {cycle}: ingest did not resume within 30 s after space returned; collector log (newest first):\n{}",
                tail.join("\n")
            );
        }
        let (code, health) = http_get(c.http, "/healthz");
        assert_eq!(code, 200, "cycle {cycle}: {health}");
        assert!(c.child.try_wait().expect("wait").is_none(), "cycle {cycle}: the process is still running");
        assert_eq!(c.child.id(), pid);
    }
    let log = std::fs::read_to_string(&c.log).unwrap_or_default();
    let restarts = log.matches("the store is writable again; restarting to resume ingest").count();
    assert_eq!(restarts, 3, "one restart in place per cycle");
    assert_eq!(log.matches("collector ready").count(), 4, "the first start and three in place");
    // Nothing acknowledged is missing, before and after a crash.
    check_all(&c, &acked, "before restart");
    assert!(!c.signal_and_wait("KILL").success());
    let c = Collector::start(&db, &[]);
    check_all(&c, &acked, "after kill -9 and restart");
    check_stream(&c, &acked).await;
}

/// The stream out across the failures and the crash: cursors only increase (a failed write may leave a hole,
/// never a repeat), and every acknowledged event is in it.
async fn check_stream(c: &Collector, acked: &BTreeSet<(String, String)>) {
    use pb::stream_record::Record;
    let mut client = pb::stream_service_client::StreamServiceClient::connect(c.endpoint()).await.expect("connect");
    let mut call = client
        .subscribe(pb::SubscribeRequest { from_oldest: true, kinds: vec!["event".into()], ..Default::default() })
        .await
        .expect("subscribe")
        .into_inner();
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    let mut last = 0u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !acked.is_subset(&seen) {
        assert!(
            Instant::now() < deadline,
            "{} acknowledged events never came in the stream",
            acked.difference(&seen).count()
        );
        match tokio::time::timeout(Duration::from_secs(5), call.message()).await {
            Ok(Ok(Some(r))) => {
                assert!(r.cursor > last, "cursor {} after {last}", r.cursor);
                last = r.cursor;
                if let Some(Record::Event(a)) = r.record {
                    if let Some(e) = a.event {
                        seen.insert((e.job_id, e.event_id));
                    }
                }
            }
            other => panic!(
                "stream ended or stalled with {} acknowledged events unseen: {other:?}",
                acked.difference(&seen).count()
            ),
        }
    }
}

fn check_all(c: &Collector, acked: &BTreeSet<(String, String)>, when: &str) {
    let jobs: BTreeSet<&String> = acked.iter().map(|(j, _)| j).collect();
    let mut stored = BTreeSet::new();
    for job in jobs {
        let (status, body) = c.get(&format!("/api/v1/jobs/{job}"));
        assert_eq!(status, 200, "{when}: job {job} missing");
        for e in body["events"].as_array().expect("events") {
            stored.insert((job.clone(), e["event_id"].as_str().expect("id").to_string()));
        }
    }
    let missing: Vec<&(String, String)> = acked.difference(&stored).collect();
    let log = std::fs::read_to_string(&c.log).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(30).collect();
    assert!(
        missing.is_empty(),
        "{when}: {} acknowledged events missing, first {:?}; collector log (newest first):\n{}",
        missing.len(),
        &missing[..missing.len().min(12)],
        tail.join("\n")
    );
}

/// A collector whose store is on a fresh 24 MiB tmpfs under `tmp`, with `config` as its configuration file, after
/// 500 acknowledged events; then the disk is filled until a batch is refused `UNAVAILABLE`. Returns the mount, the
/// collector and the filler.
async fn halted_collector(tmp: &Path, config: &str) -> (Tmpfs, Collector, PathBuf) {
    let mnt = tmp.join("mnt");
    let fs = Tmpfs::mount(&mnt, "24m");
    let conf = tmp.join("collector.toml");
    std::fs::write(&conf, config).expect("config");
    let conf = conf.to_string_lossy().into_owned();
    let c = Collector::start(&mnt, &["--config", &conf]);
    let mut client = IngestServiceClient::connect(c.endpoint()).await.expect("connect");
    let ack = client
        .publish_batch(pb::PublishRequest { batch_seq: 1, events: batch(1, 500) })
        .await
        .expect("with space left")
        .into_inner();
    assert_eq!(ack.accepted, 500);
    let filler = fill(&mnt);
    let mut refused = false;
    for r in 0..2000u32 {
        let sent = client.publish_batch(pb::PublishRequest { batch_seq: u64::from(r) + 2, events: batch(r + 2, 200) });
        if let Err(status) = sent.await {
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
            refused = true;
            break;
        }
    }
    assert!(refused, "writes never failed on a full disk");
    let (code, _) = http_get(c.http, "/healthz");
    assert_eq!(code, 503);
    (fs, c, filler)
}

/// A stop while store writes are halted (some threads may be stuck in a store call for ever) ends the process
/// within the drain deadline, and nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_while_writes_are_halted_ends_within_the_drain_deadline() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_fs, c, filler) = halted_collector(tmp.path(), "[grpc]\ndrain_timeout = \"2s\"\n").await;
    let db = tmp.path().join("mnt");
    let stopping = Instant::now();
    let status = c.signal_and_wait("TERM");
    let took = stopping.elapsed();
    assert!(took < Duration::from_secs(10), "a stop while halted took {took:?}");
    assert!(status.success(), "a stop is a clean exit even while halted: {status}");
    std::fs::remove_file(&filler).expect("remove filler");
    let c = Collector::start(&db, &[]);
    let (code, body) = c.get("/api/v1/jobs/full-1-0");
    assert_eq!(code, 200, "{body}");
}

/// With `store.after_write_failure = "exit"`, the halted process exits with code 75 once space returns (for
/// systemd's `Restart=on-failure` or Kubernetes to restart it), and not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_exit_configured_the_halted_collector_exits_75_once_space_returns() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_fs, mut c, filler) = halted_collector(tmp.path(), "[store]\nafter_write_failure = \"exit\"\n").await;
    std::thread::sleep(Duration::from_secs(2));
    assert!(c.child.try_wait().expect("wait").is_none(), "no exit while the disk is full");
    std::fs::remove_file(&filler).expect("remove filler");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = c.child.try_wait().expect("wait") {
            break st;
        }
        assert!(Instant::now() < deadline, "no exit within 30 s of space returning");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(75), "{status}");
}
