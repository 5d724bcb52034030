//! History files copied to object storage (`[history.export]`), end to end: real collectors upload to a real
//! S3-compatible server (moto's, `python3 -m moto.server`, no AWS account) through a TCP relay the test can cut.
//! Two collectors sharing one bucket and prefix seal the jobs they received (ended on five past days) into day
//! files; every file reaches the bucket at `<prefix>/end_date=YYYY-MM-DD/<collector_id>.parquet` with the same
//! bytes (read back with boto3, `tests/history/s3.py`), and DuckDB reads the bucket's objects as one table with
//! every job once. Then, for one collector: a late event uploads its day again and only it; a restart uploads
//! nothing; while the server is unreachable the failures are counted on `/metrics` and the change waits, then
//! goes up once it is back; days removed locally (a shorter retention) are deleted from the bucket, and the other
//! collector's object of the same day is left alone. (DuckDB reads the downloaded objects: its S3 reader,
//! `httpfs`, is an extension DuckDB downloads at run time, which these machines cannot.)

use startline_proto::pb::{self, ingest_service_client::IngestServiceClient, lifecycle_event::Kind};
use startline_tests::{event, free_port, http_get_text, submitted, wait_until, workspace_root, ChildGuard, Collector};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const DAY: i64 = 86_400_000;
const BUCKET: &str = "startline-warehouse";
const PREFIX: &str = "fleet/jobs";
const ID: &str = "eu-1";
/// A second collector sharing the bucket.
const OTHER: &str = "us-2";
const CREDENTIALS: [(&str, &str); 2] = [("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")];

/// A TCP relay to `target` that can be cut: while down, every open connection is closed and new ones are closed
/// as they are accepted (the server is unreachable as far as the collector can tell; moto keeps its objects).
struct Relay {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Relay {
    fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind relay");
        let addr = listener.local_addr().expect("relay address");
        let up = Arc::new(AtomicBool::new(true));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (u, o) = (up.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if !u.load(Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let Ok(server) = TcpStream::connect(target) else { continue };
                let mut list = o.lock().expect("relay list");
                for s in [&client, &server] {
                    if let Ok(c) = s.try_clone() {
                        list.push(c);
                    }
                }
                drop(list);
                for (mut from, mut to) in
                    [(client.try_clone().expect("clone"), server.try_clone().expect("clone")), (server, client)]
                {
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        loop {
                            match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    if to.write_all(&buf[..n]).is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Relay { addr, up, open }
    }

    fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::SeqCst);
        if !up {
            for s in self.open.lock().expect("relay list").drain(..) {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// Starts moto's S3-compatible server on a free port and waits until it answers.
fn start_moto() -> (ChildGuard, SocketAddr) {
    let ok = Command::new("python3").args(["-c", "import moto, flask, flask_cors, boto3"]).status().expect("python3");
    assert!(
        ok.success(),
        "moto's server is not installed: python3 -m pip install 'moto[server]' (scripts/test.sh does)"
    );
    let port = free_port();
    let child = Command::new("python3")
        .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start moto");
    let guard = ChildGuard(child);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("address");
    wait_until("moto answers", Duration::from_secs(30), || TcpStream::connect(addr).is_ok());
    (guard, addr)
}

/// Runs `tests/history/s3.py` against moto; its JSON answer.
fn s3(moto: SocketAddr, args: &[&str]) -> serde_json::Value {
    let out = Command::new("python3")
        .arg(workspace_root().join("tests/history/s3.py"))
        .args(args)
        .args(["--endpoint", &format!("http://{moto}"), "--bucket", BUCKET])
        .envs(CREDENTIALS)
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "s3.py {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("s3.py prints JSON")
}

/// The bucket's objects under the prefix: key -> (sha256, last modified).
fn bucket(moto: SocketAddr) -> BTreeMap<String, (String, String)> {
    let v = s3(moto, &["list", "--prefix", &format!("{PREFIX}/")]);
    v.as_object()
        .expect("object")
        .iter()
        .map(|(k, o)| {
            let s = |f: &str| o[f].as_str().expect("string").to_string();
            (k.clone(), (s("sha256"), s("modified")))
        })
        .collect()
}

fn sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).expect("read file");
    ring::digest::digest(&ring::digest::SHA256, &bytes).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The local day files as the bucket should hold them: collector `id`'s key -> sha256.
fn local(data: &Path, id: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for p in std::fs::read_dir(data.join("history")).expect("history dir").flatten() {
        let name = p.file_name().to_string_lossy().into_owned();
        let file = p.path().join("jobs.parquet");
        if name.starts_with("end_date=") && file.exists() {
            out.insert(format!("{PREFIX}/{name}/{id}.parquet"), sha256(&file));
        }
    }
    out
}

/// Collector `id`'s objects: key -> sha256.
fn own(moto: SocketAddr, id: &str) -> BTreeMap<String, String> {
    bucket(moto).into_iter().filter(|(k, _)| k.ends_with(&format!("/{id}.parquet"))).map(|(k, v)| (k, v.0)).collect()
}

/// `startline_collector_history_exports_total{result}` on `/metrics`.
fn exports(c: &Collector, result: &str) -> u64 {
    let (status, text) = http_get_text(c.http, "/metrics");
    assert_eq!(status, 200);
    text.lines()
        .filter(|l| {
            l.starts_with("startline_collector_history_exports_total{") && l.contains(&format!("result=\"{result}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

async fn publish(endpoint: String, events: Vec<pb::LifecycleEvent>) {
    let mut client = IngestServiceClient::connect(endpoint).await.expect("connect");
    let r = client.publish_batch(pb::PublishRequest { batch_seq: 1, events }).await.expect("publish").into_inner();
    assert!(r.rejections.is_empty(), "{:?}", r.rejections);
}

/// Job `j` of collector `c`: submitted, started a minute later, done ten minutes after submit, `2 + j % 5` days
/// before `now`.
fn job(c: &str, j: usize, now: i64) -> Vec<pb::LifecycleEvent> {
    let id = format!("{c}/{j}");
    let s = now - (2 + (j % 5) as i64) * DAY - 3_000_000;
    vec![
        event(&id, "s", s, submitted(pb::PoolKind::Managed, pb::PriorityClass::Normal, 8)),
        event(
            &id,
            "f",
            s + 60_000,
            Kind::FirstStep(pb::FirstStep { step: 1, origin: pb::StepOrigin::TrainingProcess as i32 }),
        ),
        event(
            &id,
            "d",
            s + 600_000,
            Kind::Done(pb::Done { outcome: pb::Outcome::Succeeded as i32, ..Default::default() }),
        ),
    ]
}

fn late(j: usize, now: i64) -> pb::LifecycleEvent {
    let s = now - (2 + (j % 5) as i64) * DAY - 3_000_000;
    event(&format!("{ID}/{j}"), "late", s + 120_000, Kind::Checkpoint(pb::Checkpoint { step: 5, ..Default::default() }))
}

fn config(dir: &Path, relay: SocketAddr, retention: &str, id: &str) -> String {
    let path = dir.join(format!("collector-{id}-{retention}.toml"));
    std::fs::write(
        &path,
        format!(
            "[store]\nfold_after = \"1s\"\nfold_interval = \"100ms\"\nretention = \"{retention}\"\n\
             [[slo]]\nname = \"day\"\nthreshold = \"10m\"\nobjective = 90\nwindow = \"1d\"\n\
             [history]\nseal_after = \"0s\"\nseal_interval = \"1s\"\n\
             [history.export]\nurl = \"s3://{BUCKET}/{PREFIX}\"\nendpoint = \"http://{relay}\"\nallow_http = true\n\
             region = \"us-east-1\"\ninterval = \"1s\"\ncollector_id = \"{id}\"\n"
        ),
    )
    .expect("config");
    path.to_str().expect("utf-8 path").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_days_are_copied_to_an_s3_bucket_and_kept_in_step() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let (_moto, moto) = start_moto();
    let relay = Relay::start(moto);
    s3(moto, &["make-bucket"]);
    let now = startline_proto::time::now_ms();
    let oldest = startline_collector::store::history::date_of((now - 6 * DAY - 3_000_000).div_euclid(DAY));

    // Two collectors share the bucket and the prefix, each with its own jobs.
    let other_data = tmp.path().join("other");
    let other = Collector::start_with_env(
        &other_data,
        &["--config", &config(tmp.path(), relay.addr, "30d", OTHER)],
        &CREDENTIALS,
    );
    publish(other.endpoint(), (0..25).flat_map(|j| job(OTHER, j, now)).collect()).await;
    let cfg = config(tmp.path(), relay.addr, "30d", ID);
    let c = Collector::start_with_env(&data, &["--config", &cfg], &CREDENTIALS);
    publish(c.endpoint(), (0..40).flat_map(|j| job(ID, j, now)).collect()).await;

    // Every sealed day in the bucket, byte for byte, under each collector's name.
    wait_until("five days sealed and uploaded by each collector", Duration::from_secs(60), || {
        let (l, o) = (local(&data, ID), local(&other_data, OTHER));
        l.len() == 5 && o.len() == 5 && own(moto, ID) == l && own(moto, OTHER) == o
    });
    assert_eq!(bucket(moto).len(), 10);
    // The bucket read as one table (DuckDB over the objects as downloaded, Hive partitions): every job once.
    let table = s3(moto, &["duckdb", "--prefix", &format!("{PREFIX}/")]);
    assert_eq!(table["jobs"], 65, "{table}");
    assert_eq!(table["by_collector"], serde_json::json!({ ID: 40, OTHER: 25 }), "{table}");
    assert_eq!(table["days"], 5, "{table}");
    assert_eq!(table["distinct_job_ids"], 65, "{table}");
    assert_eq!(other.signal_and_wait("TERM").code(), Some(0));
    // The other collector's object of the oldest day: never touched by this one.
    let foreign = format!("{PREFIX}/end_date={oldest}/{OTHER}.parquet");
    let foreign_before = bucket(moto)[&foreign].clone();
    assert_eq!(exports(&c, "uploaded"), 5);
    assert_eq!(exports(&c, "failed"), 0);
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("history/exported.json")).expect("state file")).expect("json");
    assert_eq!(state["days"].as_object().expect("days").len(), 5, "{state}");
    assert_eq!(bucket(moto)[&foreign], foreign_before);

    // A late event for one job: its day is written again locally and uploaded again, and only it.
    let before = bucket(moto);
    publish(c.endpoint(), vec![late(1, now)]).await;
    wait_until("the late job's day uploaded again", Duration::from_secs(60), || {
        exports(&c, "uploaded") == 6 && own(moto, ID) == local(&data, ID)
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = bucket(moto);
    let changed: Vec<_> = after.iter().filter(|(k, v)| before.get(*k) != Some(*v)).map(|(k, _)| k.clone()).collect();
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert_eq!(exports(&c, "uploaded"), 6);

    // A restart reads exported.json: nothing is uploaded again.
    let status = c.signal_and_wait("TERM");
    assert!(status.success(), "{status}");
    let c = Collector::start_with_env(&data, &["--config", &cfg], &CREDENTIALS);
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(exports(&c, "uploaded"), 0);
    assert_eq!(exports(&c, "deleted"), 0);
    assert_eq!(bucket(moto), after);

    // The server unreachable: the changed day waits and each failed pass is counted; once it is back, the day
    // goes up.
    relay.set_up(false);
    publish(c.endpoint(), vec![late(3, now)]).await;
    wait_until("failed uploads counted", Duration::from_secs(90), || exports(&c, "failed") >= 2);
    assert_ne!(bucket(moto).len(), 0);
    assert_ne!(own(moto, ID), local(&data, ID), "the changed day cannot have been uploaded");
    assert_eq!(exports(&c, "uploaded"), 0);
    relay.set_up(true);
    wait_until("the changed day uploaded once the server is back", Duration::from_secs(90), || {
        own(moto, ID) == local(&data, ID)
    });
    assert_eq!(exports(&c, "uploaded"), 1);

    // A shorter retention removes the oldest days locally: their objects go too, the other collector's stays.
    let status = c.signal_and_wait("TERM");
    assert!(status.success(), "{status}");
    let cfg = config(tmp.path(), relay.addr, "4d", ID);
    let c = Collector::start_with_env(&data, &["--config", &cfg], &CREDENTIALS);
    wait_until("expired days removed locally and from the bucket", Duration::from_secs(60), || {
        let l = local(&data, ID);
        l.len() < 5 && own(moto, ID) == l
    });
    let removed = 5 - local(&data, ID).len() as u64;
    assert!(removed >= 2, "days 5 and 6 days ago are past a 4d retention");
    wait_until("deletions counted", Duration::from_secs(10), || exports(&c, "deleted") == removed);
    assert_eq!(exports(&c, "uploaded"), 0);
    assert_eq!(bucket(moto)[&foreign], foreign_before);
    assert!(!bucket(moto).contains_key(&format!("{PREFIX}/end_date={oldest}/{ID}.parquet")));
    drop(c);
}
