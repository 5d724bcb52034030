//! A damaged store on disk: flipped bytes and truncated files in sled's data file, flipped bytes in the log's
//! newest segment file. For each damaged copy of a store whose contents are known, the collector must either
//! refuse to start with a clear message naming the store, or start and serve exactly the known timelines: never
//! silently different ones. The one damage a log cannot tell from a crash is damage inside its newest append
//! (a write cut short by a crash looks the same): the collector then cuts that append, says so in its log, and
//! serves the store without it (the jobs of the last batch only).

use startline_proto::pb::{self, ingest_service_client::IngestServiceClient, lifecycle_event::Kind};
use startline_tests::crashtrial::Rng;
use startline_tests::{ago, event, submitted, Collector};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read dir") {
        let e = e.expect("entry");
        let target = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).expect("copy");
        }
    }
}

/// Every job's (state, sorted event ids), as the API serves them.
fn snapshot_of(c: &Collector, jobs: &[String]) -> BTreeMap<String, (String, Vec<String>)> {
    jobs.iter()
        .map(|j| {
            let (status, body) = c.get(&format!("/api/v1/jobs/{j}"));
            if status != 200 {
                return (j.clone(), (format!("http {status}"), Vec::new()));
            }
            let mut ids: Vec<String> = body["events"]
                .as_array()
                .map(|a| a.iter().filter_map(|e| e["event_id"].as_str().map(str::to_string)).collect())
                .unwrap_or_default();
            ids.sort();
            (j.clone(), (body["state"].as_str().unwrap_or("?").to_string(), ids))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_store_files_are_refused_or_served_exactly_never_silently_wrong() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("db");
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[store]\ncheckpoint_interval = \"10ms\"\n").expect("config");
    let cfg_arg = cfg.to_str().expect("utf-8").to_string();
    // A known store: 150 jobs, written in parts so that snapshots, markers and log tail all exist.
    let c = Collector::start(&db, &["--config", &cfg_arg]);
    let mut client = IngestServiceClient::connect(c.endpoint()).await.expect("connect");
    let base = ago(7200);
    let mut jobs = Vec::new();
    for part in 0..15u64 {
        let mut events = Vec::new();
        for j in 0..10 {
            let job = format!("dmg-{part}-{j}");
            events.push(event(&job, "s", base, submitted(pb::PoolKind::Managed, pb::PriorityClass::Urgent, 8)));
            events.push(event(
                &job,
                "f",
                base + 60_000,
                Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() }),
            ));
            for k in 1..8 {
                events.push(event(
                    &job,
                    &format!("c{k}"),
                    base + 60_000 + k * 1000,
                    Kind::Checkpoint(pb::Checkpoint { step: k as u64, ..Default::default() }),
                ));
            }
            jobs.push(job);
        }
        let ack = client
            .publish_batch(pb::PublishRequest { batch_seq: part + 1, events })
            .await
            .expect("publish")
            .into_inner();
        assert_eq!(ack.accepted, 90);
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    // The last parts stay in the log tail only: kill -9, no final checkpoint.
    assert!(!c.signal_and_wait("KILL").success());
    let c = Collector::start(&db, &[]);
    let reference = snapshot_of(&c, &jobs);
    assert!(reference.values().all(|(s, ids)| s == "running" && ids.len() == 9), "reference store is complete");
    drop(c);

    let data_file = db.join("db");
    let sled_len = std::fs::metadata(&data_file).expect("sled data file").len();
    let newest_segment = |dir: &Path| {
        std::fs::read_dir(dir.join("log"))
            .expect("log dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "seg"))
            .max()
            .expect("a log segment")
    };
    let seg_name = newest_segment(&db).file_name().expect("name").to_owned();
    // STARTLINE_CORRUPTION_SEED and STARTLINE_CORRUPTION_ROUNDS widen the search by hand (rounds of 36 cases).
    let env_u64 = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let mut rng = Rng::new(env_u64("STARTLINE_CORRUPTION_SEED", 8));
    let rounds = env_u64("STARTLINE_CORRUPTION_ROUNDS", 1) as u32;
    let (mut refused, mut exact, mut cut_logged, mut wrong) = (0, 0, 0, Vec::new());
    let last_part: Vec<&String> = jobs.iter().filter(|j| j.starts_with("dmg-14-")).collect();
    for case in 0..36 * rounds {
        let copy = dir.path().join(format!("case{case}"));
        copy_dir(&db, &copy);
        let in_log = case % 36 >= 24;
        let target = if in_log { copy.join("log").join(&seg_name) } else { copy.join("db") };
        let len = if in_log { std::fs::metadata(&target).expect("segment").len() } else { sled_len };
        let what = if !in_log && case % 3 == 2 {
            let keep = rng.range(len / 8, len - 1);
            let f = std::fs::OpenOptions::new().write(true).open(&target).expect("open");
            f.set_len(keep).expect("truncate");
            format!("truncated to {keep} of {len} bytes")
        } else {
            let mut bytes = std::fs::read(&target).expect("read");
            let n = rng.range(1, 8);
            let mut at = Vec::new();
            for _ in 0..n {
                let i = rng.range(0, len - 1) as usize;
                bytes[i] ^= 1 << rng.range(0, 7);
                at.push(i);
            }
            std::fs::write(&target, bytes).expect("write");
            format!("{n} bit flips at {at:?} of {}", target.display())
        };
        match Collector::try_start(&copy, &[]) {
            Err((_, log)) => {
                assert!(
                    log.contains("store at") && log.contains("damaged"),
                    "case {case} ({what}): the refusal names the store and says it is damaged: {log}"
                );
                refused += 1;
            }
            Ok(c) => {
                let served = snapshot_of(&c, &jobs);
                let log = std::fs::read_to_string(&c.log).unwrap_or_default();
                drop(c);
                let differ: Vec<&String> = served.keys().filter(|k| reference.get(*k) != served.get(*k)).collect();
                if served == reference {
                    exact += 1;
                } else if in_log
                    && log.contains("cutting an unacknowledged write")
                    && differ.iter().all(|j| last_part.contains(j) && served[*j].0 == "http 404")
                {
                    // Damage inside the newest append: cut as a torn write, and said so.
                    cut_logged += 1;
                } else {
                    let diff = served.iter().filter(|(k, v)| reference.get(*k) != Some(v)).count();
                    wrong.push(format!("case {case} ({what}): {diff} jobs differ; log: {log}"));
                }
            }
        }
        let _ = std::fs::remove_dir_all(&copy);
    }
    println!(
        "refused {refused}, served exactly {exact}, newest append cut (logged) {cut_logged}, served wrong {}",
        wrong.len()
    );
    assert!(refused > 0 && exact + cut_logged > 0, "both outcomes occur: refused {refused}, served {exact}");
    assert!(wrong.is_empty(), "served silently wrong timelines:\n{}", wrong.join("\n"));

    // Damage inside the newest append once a checkpoint covers it (a SIGTERM's final checkpoint): that write was
    // acknowledged, so it must be refused, never cut as if torn (and the refused store keeps its bytes).
    let covered = dir.path().join("covered");
    copy_dir(&db, &covered);
    let c = Collector::start(&covered, &[]);
    assert!(c.signal_and_wait("TERM").success(), "a clean stop");
    let seg = newest_segment(&covered);
    let mut bytes = std::fs::read(&seg).expect("read");
    let at = bytes.len() - 20;
    bytes[at] ^= 0x04;
    std::fs::write(&seg, &bytes).expect("write");
    for attempt in 0..2 {
        match Collector::try_start(&covered, &[]) {
            Ok(c) => panic!("attempt {attempt}: served a store whose acknowledged newest append is damaged: {:?}", {
                let served = snapshot_of(&c, &jobs);
                served.iter().filter(|(k, v)| reference.get(*k) != Some(v)).count()
            }),
            Err((_, log)) => assert!(
                log.contains("store at") && log.contains("damaged") && log.contains("acknowledged"),
                "attempt {attempt}: the refusal names the store and the acknowledged write: {log}"
            ),
        }
        assert!(std::fs::read(&seg).expect("read") == bytes, "attempt {attempt}: nothing was cut");
    }
}
