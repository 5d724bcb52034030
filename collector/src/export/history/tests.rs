//! The history uploader against an in-memory object store: keys, the checks of the destination, and long random
//! sequences of seal passes (days written, written again, removed), restarts, a lost state file and other
//! collectors' objects, checked after every pass against a simple model of what the bucket must hold.

use super::*;
use crate::store::history::columns::Columns;
use object_store::memory::InMemory;
use proptest::prelude::*;

/// 2026-12-01.
const D0: i64 = 20_788;

fn settings(prefix: &str, id: &str) -> ExportSettings {
    ExportSettings {
        bucket: "warehouse".into(),
        prefix: prefix.into(),
        endpoint: None,
        region: None,
        allow_http: false,
        interval: Duration::from_secs(1),
        collector_id: id.into(),
    }
}

#[test]
fn keys_are_hive_partitions_with_one_object_per_collector() {
    let s = settings("startline/jobs", "eu-1");
    assert_eq!(date_of(D0), "2026-12-01");
    assert_eq!(s.key_of(D0), "startline/jobs/end_date=2026-12-01/eu-1.parquet");
    assert_eq!(s.day_of_key("startline/jobs/end_date=2026-12-01/eu-1.parquet"), Some(D0));
    assert_eq!(s.day_of_key("startline/jobs/end_date=2026-12-01/eu-2.parquet"), None, "another collector's");
    assert_eq!(s.day_of_key("startline/jobsx/end_date=2026-12-01/eu-1.parquet"), None);
    assert_eq!(s.day_of_key("startline/jobs/end_date=2026-13-01/eu-1.parquet"), None);
    assert_eq!(s.url(), "s3://warehouse/startline/jobs");
    let root = settings("", "eu-1");
    assert_eq!(root.key_of(D0 + 1), "end_date=2026-12-02/eu-1.parquet");
    assert_eq!(root.day_of_key("end_date=2026-12-02/eu-1.parquet"), Some(D0 + 1));
    assert_eq!(root.url(), "s3://warehouse");
}

#[test]
fn the_url_is_checked() {
    assert_eq!(parse_url("s3://my-bucket"), Ok(("my-bucket".into(), String::new())));
    assert_eq!(parse_url("s3://my.bucket/a/b=c/"), Ok(("my.bucket".into(), "a/b=c".into())));
    for bad in ["https://bucket/x", "s3://", "s3://ab", "s3://Bucket", "s3://-bucket", "s3://b_ucket"] {
        assert!(parse_url(bad).is_err(), "{bad}");
    }
    for bad in ["s3://bucket//x", "s3://bucket/a/../b", "s3://bucket/a b", "s3://bucket/./a", "s3://bucket/a?b"] {
        let e = parse_url(bad).expect_err(bad);
        assert!(e.contains("prefix segment"), "{bad}: {e}");
    }
    assert!(safe_component("eu-1.host_a", 128));
    for bad in ["", ".", "..", "a/b", "a b", "ä"] {
        assert!(!safe_component(bad, 128), "{bad:?}");
    }
    assert!(!safe_component(&"a".repeat(129), 128));
    assert!(safe_component(&default_collector_id(), 128));
}

/// Writes a day's file with a fingerprint (no rows: the uploader copies files, whatever they hold).
fn write(history: &History, day: i64, hash: u64) {
    let batch = Columns::default().finish().expect("empty batch");
    history.write_day(day, &batch, Fingerprint { jobs: 0, hash }).expect("write day");
}

/// Every object in the store, key -> bytes.
async fn objects(store: &InMemory) -> BTreeMap<String, Vec<u8>> {
    use tokio_stream::StreamExt;
    let mut out = BTreeMap::new();
    let mut listing = store.list(None);
    while let Some(m) = listing.next().await {
        let m = m.expect("list");
        let bytes = store.get(&m.location).await.expect("get").bytes().await.expect("bytes");
        out.insert(m.location.to_string(), bytes.to_vec());
    }
    out
}

#[derive(Debug, Clone)]
enum Op {
    /// The seal pass writes a day (new, or again with other jobs).
    Write(i64, u64),
    /// The seal pass removes a day (retention, no job left).
    Remove(i64),
    /// An upload pass.
    Pass,
    /// The collector restarts (the state file is read again).
    Restart,
    /// The state file is lost, then the collector restarts (the bucket is listed).
    LoseState,
    /// Another collector uploads its object of a day.
    Foreign(i64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..6i64, 0..4u64).prop_map(|(d, h)| Op::Write(D0 + d, h)),
        2 => (0..6i64).prop_map(|d| Op::Remove(D0 + d)),
        4 => Just(Op::Pass),
        1 => Just(Op::Restart),
        1 => Just(Op::LoseState),
        1 => (0..6i64).prop_map(|d| Op::Foreign(D0 + d)),
    ]
}

/// Runs `ops`, checking after each pass: this collector's objects are exactly the local files, byte for byte;
/// other collectors' objects are untouched; the uploads and deletions counted are the model's.
async fn run(ops: Vec<Op>, prefix: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let history = History::open(dir.path()).expect("open");
    let store = Arc::new(InMemory::new());
    let s = settings(prefix, "eu-1");
    let other = settings(prefix, "us-2");
    let stats = Arc::new(ExportStats::default());
    let mut exporter = Exporter::with_store(dir.path(), s.clone(), store.clone(), stats.clone());
    // The model: what this collector's object of each day is (None: there, its fingerprint unknown after the
    // state file was lost), the local days, the other collector's objects.
    let mut remote: BTreeMap<i64, Option<u64>> = BTreeMap::new();
    let mut local: BTreeMap<i64, u64> = BTreeMap::new();
    let mut foreign: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let (mut uploads, mut deletes) = (0u64, 0u64);
    for op in ops {
        match op {
            Op::Write(d, h) => {
                write(&history, d, h);
                local.insert(d, h);
            }
            Op::Remove(d) => {
                history.remove_day(d).expect("remove");
                local.remove(&d);
            }
            Op::Restart => exporter = Exporter::with_store(dir.path(), s.clone(), store.clone(), stats.clone()),
            Op::LoseState => {
                let _ = std::fs::remove_file(history.dir().join(STATE_FILE));
                exporter = Exporter::with_store(dir.path(), s.clone(), store.clone(), stats.clone());
                remote.values_mut().for_each(|fp| *fp = None);
            }
            Op::Foreign(d) => {
                let key = other.key_of(d);
                let body = format!("{key} {}", foreign.len()).into_bytes();
                store.put(&ObjectPath::from(key.as_str()), PutPayload::from(body.clone())).await.expect("put");
                foreign.insert(key, body);
            }
            Op::Pass => {
                let report = exporter.pass().await.expect("pass");
                let mut want_up: Vec<i64> =
                    local.iter().filter(|(d, h)| remote.get(d) != Some(&Some(**h))).map(|(d, _)| *d).collect();
                want_up.sort_unstable();
                let want_del: Vec<i64> = remote.keys().filter(|d| !local.contains_key(d)).copied().collect();
                assert_eq!(report.uploaded, want_up);
                assert_eq!(report.deleted, want_del);
                uploads += want_up.len() as u64;
                deletes += want_del.len() as u64;
                remote = local.iter().map(|(d, h)| (*d, Some(*h))).collect();
                let all = objects(&store).await;
                let mine: BTreeMap<String, Vec<u8>> = local
                    .keys()
                    .map(|d| (s.key_of(*d), std::fs::read(history.file_of(*d)).expect("local file")))
                    .collect();
                let mut want = foreign.clone();
                want.extend(mine);
                assert_eq!(all.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
                assert!(all == want, "an object differs from its file");
                assert_eq!(stats.uploaded.load(Ordering::Relaxed), uploads);
                assert_eq!(stats.deleted.load(Ordering::Relaxed), deletes);
                assert_eq!(stats.failed.load(Ordering::Relaxed), 0);
                // A second pass finds nothing to do.
                assert_eq!(exporter.pass().await.expect("pass"), PassReport::default());
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn the_bucket_holds_exactly_the_sealed_days(ops in prop::collection::vec(op(), 1..40), root in any::<bool>()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(run(ops, if root { "" } else { "startline/jobs" }));
    }
}

#[tokio::test]
async fn a_restart_uploads_nothing_and_a_changed_destination_starts_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let history = History::open(dir.path()).expect("open");
    for d in 0..3 {
        write(&history, D0 + d, d as u64);
    }
    let store = Arc::new(InMemory::new());
    let stats = Arc::new(ExportStats::default());
    let s = settings("p", "eu-1");
    let mut e = Exporter::with_store(dir.path(), s.clone(), store.clone(), stats.clone());
    assert_eq!(e.pass().await.expect("pass").uploaded, vec![D0, D0 + 1, D0 + 2]);
    let saved: State =
        serde_json::from_slice(&std::fs::read(history.dir().join(STATE_FILE)).expect("state")).expect("json");
    assert_eq!(saved.days.len(), 3);
    assert_eq!(saved.days["2026-12-02"], Uploaded { jobs: 0, fingerprint: "0000000000000001".into() });
    assert!(!history.dir().join("exported.json.tmp").exists());
    // The sealed days are still listed as before: the state file is not a day.
    assert_eq!(history.sealed().expect("sealed").len(), 3);
    let mut e = Exporter::with_store(dir.path(), s.clone(), store.clone(), stats.clone());
    assert_eq!(e.pass().await.expect("pass"), PassReport::default());
    // Another collector id is another destination: its objects are uploaded, the first ones left alone.
    let mut e = Exporter::with_store(dir.path(), settings("p", "eu-2"), store.clone(), stats.clone());
    assert_eq!(e.pass().await.expect("pass").uploaded.len(), 3);
    assert_eq!(objects(&store).await.len(), 6);
    assert_eq!(stats.uploaded.load(Ordering::Relaxed), 6);
}
