//! Store tests on a real sled directory: write, close, reopen, identical state.

use super::stream_tree::{encode_stream_blocks, stream_key};
use super::*;
use crate::job::JobState;
use startline_proto::pb::lifecycle_event::Kind;
use startline_proto::time::ms_to_timestamp;
use std::collections::BTreeSet;

/// An event of `job` (source `test`); the collector's other unit tests build theirs with it too.
pub(crate) fn ev(job: &str, id: &str, at: i64, kind: Kind) -> pb::LifecycleEvent {
    pb::LifecycleEvent {
        event_id: id.into(),
        job_id: job.into(),
        attempt: None,
        source: "test".into(),
        occurred_at: Some(ms_to_timestamp(at)),
        kind: Some(kind),
    }
}

/// A `submitted` of a managed, urgent 8-GPU job.
pub(crate) fn submitted() -> Kind {
    Kind::Submitted(pb::Submitted {
        pool_kind: pb::PoolKind::Managed as i32,
        provider: "sagemaker".into(),
        pool: "ml.p4d".into(),
        priority: pb::PriorityClass::Urgent as i32,
        gpu_count: 8,
        ..Default::default()
    })
}

/// Writes events through the store the way the committer does, updating an in-memory map alongside.
fn write(store: &Store, mem: &mut BTreeMap<String, JobRecord>, seq: &mut u64, events: &[pb::LifecycleEvent]) {
    let mut entries = Vec::new();
    for e in events {
        *seq += 1;
        entries.push((*seq, encode_log_value(e)));
        let ce = CompactEvent::from_pb(e, *seq).expect("has kind");
        mem.entry(e.job_id.clone()).or_default().insert(ce);
    }
    store.append_durable(&entries).expect("append");
}

#[test]
fn reopen_restores_identical_state_from_snapshots_and_log_tail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut mem = BTreeMap::new();
    let mut seq = 0;
    {
        let store = Store::open(dir.path()).expect("open");
        write(
            &store,
            &mut mem,
            &mut seq,
            &[
                ev("a", "a1", 1_000_000, submitted()),
                ev("a", "a2", 1_060_000, Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })),
                ev("b", "b1", 1_000_000, submitted()),
            ],
        );
        // Checkpoint covers a and b so far; later events live only in the log tail.
        let through = seq;
        store.checkpoint(mem.iter().map(|(k, v)| (k.as_str(), v)), through).expect("checkpoint");
        write(
            &store,
            &mut mem,
            &mut seq,
            &[
                ev(
                    "b",
                    "b2",
                    1_100_000,
                    Kind::Queued(pb::Queued {
                        reason: 1,
                        raw_reason: "Pending".into(),
                        message: String::new(),
                        estimated_start: None,
                        queue_position: None,
                    }),
                ),
                ev("c", "c1", 1_200_000, Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })),
            ],
        );
    }
    let store = Store::open(dir.path()).expect("reopen");
    let restored = store.restore().expect("restore");
    assert_eq!(restored.snapshots, 2);
    assert_eq!(restored.replayed, 2, "only the tail after the checkpoint is replayed");
    assert_eq!(restored.last_seq, seq);
    assert_eq!(restored.jobs, mem);
    // A job still waiting is known after reopen, with its wait reason.
    let b = &restored.jobs["b"].timeline;
    assert_eq!(b.state, JobState::Queued);
    assert_eq!(b.current_raw_reason.as_deref(), Some("Pending"));
    // A job whose submitted has not arrived yet is kept.
    assert_eq!(restored.jobs["c"].timeline.state, JobState::Unsubmitted);
    // Raw events are readable by sequence.
    assert_eq!(store.event(1).expect("read").map(|e| e.event_id), Some("a1".to_string()));
}

#[test]
fn empty_store_restores_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let r = store.restore().expect("restore");
    assert!(r.jobs.is_empty());
    assert_eq!(r.last_seq, 0);
}

/// Raw access for corruption tests.
fn raw_put(store: &Store, tree: &str, key: &[u8], value: &[u8]) {
    let t = store.t().expect("open");
    let tree = match tree {
        "jobs" => t.jobs,
        "blocks" => t.blocks,
        "stream" => t.stream,
        _ => t.alerts,
    };
    tree.insert(key, value).expect("insert");
    t.db.flush().expect("flush");
}

fn three_jobs(store: &Store) -> (BTreeMap<String, JobRecord>, u64) {
    let mut mem = BTreeMap::new();
    let mut seq = 0;
    write(
        store,
        &mut mem,
        &mut seq,
        &[
            ev("a", "a1", 1_000_000, submitted()),
            ev("a", "a2", 1_060_000, Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })),
            ev("b", "b1", 1_000_000, submitted()),
        ],
    );
    store.checkpoint(mem.iter().map(|(k, v)| (k.as_str(), v)), seq).expect("checkpoint");
    write(store, &mut mem, &mut seq, &[ev("c", "c1", 1_100_000, submitted())]);
    (mem, seq)
}

#[test]
fn values_are_versioned_and_checksummed() {
    let e = ev("a", "a1", 1_000_000, submitted());
    let v = encode_log_value(&e);
    assert_eq!(v[0], SEALED_VERSION);
    assert_eq!(decode_log_value(&1u64.to_be_bytes(), &v).expect("round trip"), e);
    // Every single flipped bit is detected.
    for i in 0..v.len() * 8 {
        let mut bad = v.clone();
        bad[i / 8] ^= 1 << (i % 8);
        assert!(decode_log_value(&1u64.to_be_bytes(), &bad).is_err(), "flip of bit {i} not detected");
    }
    // Truncated values are detected.
    for n in 0..v.len() {
        assert!(decode_log_value(&1u64.to_be_bytes(), &v[..n]).is_err(), "truncation to {n} bytes not detected");
    }
    // A value of another version is refused, whatever follows.
    let mut other = vec![1u8];
    other.extend_from_slice(&e.encode_to_vec());
    let err = decode_log_value(&1u64.to_be_bytes(), &other).expect_err("version 1");
    assert!(err.to_string().contains("unknown version 1"), "{err}");
}

/// The keys of the `jobs` tree under a prefix.
fn jobs_keys(store: &Store, prefix: &[u8]) -> Vec<Vec<u8>> {
    let t = store.t().expect("open");
    t.jobs.scan_prefix(prefix).keys().map(|k| k.expect("key").to_vec()).collect()
}

/// The snapshot parts' files, by kind: increments' numbers, bases' `(base, part)`.
fn part_files(store: &Store) -> (Vec<u64>, Vec<(u64, u64)>) {
    let t = store.t().expect("open");
    let (mut incs, mut bases) = (Vec::new(), Vec::new());
    for (f, _) in t.parts.list().expect("list") {
        match f {
            snaps::PartFile::Inc(no) => incs.push(no),
            snaps::PartFile::Base(b, p) => bases.push((b, p)),
            snaps::PartFile::Temp(name) => panic!("a temporary file left: {name}"),
        }
    }
    (incs, bases)
}

/// The path of a part's file.
fn part_path(store: &Store, file: &snaps::PartFile) -> std::path::PathBuf {
    store.path().join(SNAP_DIR).join(file.name())
}

/// A checkpoint as the committer writes one: the jobs' events past their marks as an increment, then the
/// marker; the marks advance.
fn increment(
    store: &Store,
    mem: &BTreeMap<String, JobRecord>,
    marks: &mut HashMap<String, u64>,
    jobs: &[&str],
    through: u64,
) {
    let mut w = snaps::PartWriter::default();
    let mut after = Vec::new();
    for id in jobs {
        let m = marks.get(*id).copied().unwrap_or(0);
        let evs: Vec<CompactEvent> = mem[*id].events.iter().filter(|e| e.seq > m).cloned().collect();
        w.add(id, &evs).expect("add");
        if let Some(last) = evs.iter().map(|e| e.seq).max() {
            after.push((id.to_string(), last));
        }
    }
    store.write_increment(w.finish().expect("finish")).expect("increment");
    store.finish_checkpoint(through).expect("marker");
    marks.extend(after);
}

/// A checkpoint that writes a base of every job in `mem`.
fn base(store: &Store, mem: &BTreeMap<String, JobRecord>, marks: &mut HashMap<String, u64>, through: u64) {
    let no = store.begin_base();
    let mut w = snaps::PartWriter::default();
    for (id, rec) in mem {
        w.add(id, &rec.events).expect("add");
    }
    store.write_base_parts(no, 0, w.finish().expect("finish")).expect("parts");
    store.switch_base(no, through, mem.len() as u64).expect("switch");
    marks.clear();
    marks.extend(mem.iter().map(|(id, r)| (id.clone(), r.events.iter().map(|e| e.seq).max().unwrap_or(0))));
}

#[test]
fn increments_add_only_new_events_and_a_base_supersedes_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let mut mem = BTreeMap::new();
    let mut seq = 0;
    let mut marks: HashMap<String, u64> = HashMap::new();
    // "a" and "ab": one job id a prefix of another.
    write(&store, &mut mem, &mut seq, &[ev("a", "a0", 1_000_000, submitted()), ev("ab", "x0", 1_000_000, submitted())]);
    increment(&store, &mem, &mut marks, &["a", "ab"], seq);
    for i in 1..10i64 {
        // A late event (earlier time, higher sequence) is new too.
        let at = if i == 5 { 999_000 } else { 1_000_000 + i * 1000 };
        let k = Kind::Checkpoint(pb::Checkpoint { step: i as u64, ..Default::default() });
        write(&store, &mut mem, &mut seq, &[ev("a", &format!("a{i}"), at, k)]);
        increment(&store, &mem, &mut marks, &["a"], seq);
    }
    assert_eq!(part_files(&store).0.len(), 10, "one increment per checkpoint");
    assert!(jobs_keys(&store, &[snaps::INC_PREFIX]).is_empty(), "parts are files, not sled values");
    let r = store.restore().expect("restore");
    assert!(r.rebuilt.is_none());
    assert_eq!(r.jobs, mem);
    assert_eq!((r.snapshots, r.replayed), (2, 0), "nothing after the marker");
    assert_eq!(r.snapshot_through, marks, "restore finds what the marks say");
    assert!(!store.wants_base(1 << 20, 1024));
    assert!(store.wants_base(0, 1024), "the increments hold more than the (empty) base");
    assert!(store.wants_base(1 << 20, 9), "more increments than allowed");
    // A base replaces every increment.
    write(
        &store,
        &mut mem,
        &mut seq,
        &[ev("ab", "x1", 1_100_000, Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() }))],
    );
    base(&store, &mem, &mut marks, seq);
    assert!(part_files(&store).0.is_empty());
    assert_eq!(part_files(&store).1.len(), 1);
    assert!(!store.wants_base(0, 1024), "nothing since the base");
    let r = store.restore().expect("restore");
    assert_eq!(r.jobs, mem);
    assert_eq!(r.snapshot_through, marks);
    // Increments after the base join it; a second base replaces the first.
    write(&store, &mut mem, &mut seq, &[ev("c", "c0", 1_000_000, submitted())]);
    increment(&store, &mem, &mut marks, &["c"], seq);
    assert_eq!(store.restore().expect("restore").jobs, mem);
    let first = part_files(&store).1;
    base(&store, &mem, &mut marks, seq);
    let second = part_files(&store).1;
    assert_eq!(second.len(), 1);
    assert_ne!(first, second);
    // Reopened, the store numbers parts above every stored one.
    drop(store);
    let store = Store::open(dir.path()).expect("reopen");
    assert!(store.begin_base() > second[0].0);
    assert_eq!(store.restore().expect("restore").jobs, mem);
}

#[test]
fn a_deleted_jobs_parts_stay_deleted_until_a_base_and_its_id_can_come_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let mut mem = BTreeMap::new();
    let mut seq = 0;
    let mut marks = HashMap::new();
    write(&store, &mut mem, &mut seq, &[ev("a", "a0", 1_000_000, submitted()), ev("b", "b0", 1_000_000, submitted())]);
    increment(&store, &mem, &mut marks, &["a", "b"], seq);
    // Retention deletes "a": its events in the increment are not restored.
    let rec = mem.remove("a").expect("a");
    let seqs = rec.events.iter().map(|e| e.seq).collect();
    store.delete_jobs(&[ExpiredJob { job_id: "a".into(), seqs, summaries: Vec::new() }]).expect("delete");
    let r = store.restore().expect("restore");
    assert_eq!(r.jobs, mem);
    assert!(!r.snapshot_through.contains_key("a"));
    // A new job under the same id keeps its own events.
    write(&store, &mut mem, &mut seq, &[ev("a", "new", 2_000_000, submitted())]);
    marks.remove("a");
    increment(&store, &mem, &mut marks, &["a"], seq);
    let r = store.restore().expect("restore");
    assert_eq!(r.jobs, mem);
    assert_eq!(r.jobs["a"].events.len(), 1);
    // A base drops the tombstone (it holds only live jobs); one deleted after the base began keeps its own.
    let no = store.begin_base();
    let mut w = snaps::PartWriter::default();
    for (id, r) in &mem {
        w.add(id, &r.events).expect("add");
    }
    store.write_base_parts(no, 0, w.finish().expect("finish")).expect("parts");
    let gone = mem.remove("b").expect("b");
    let seqs = gone.events.iter().map(|e| e.seq).collect();
    store.delete_jobs(&[ExpiredJob { job_id: "b".into(), seqs, summaries: Vec::new() }]).expect("delete");
    store.switch_base(no, seq, mem.len() as u64).expect("switch");
    assert_eq!(jobs_keys(&store, &snaps::tomb_key("a")), Vec::<Vec<u8>>::new());
    assert_eq!(jobs_keys(&store, &snaps::tomb_key("b")).len(), 1);
    let r = store.restore().expect("restore");
    assert_eq!(r.jobs, mem, "b, in the base but deleted after it began, stays deleted");
    assert!(r.last_seq >= seq, "new sequences stay above the tombstone's");
    // After a failed retention delete, no base may replace the parts that still hold the jobs.
    increment(&store, &mem, &mut HashMap::new(), &["a"], seq);
    assert!(store.wants_base(0, 0));
    // A base most of whose jobs left memory is due again, even with nothing new (unless bases are held).
    let no = store.begin_base();
    store.switch_base(no, seq, 5000).expect("switch");
    assert!(store.base_stale(2499) && !store.base_stale(2500));
    store.hold_bases();
    assert!(!store.wants_base(0, 0) && !store.base_stale(0));
}

/// After a write fails with an I/O error, writes are halted: every later write (the checkpoint's marker, a
/// base's switch, a group's log append, the stream, retention) is refused before sled is touched, with the first
/// failure's cause; reads go on; what was written before is restored by the next open.
#[test]
fn after_a_failed_write_every_later_write_is_refused_before_sled_and_reads_go_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let (mem, seq) = three_jobs(&store);
    let marker = store.checkpoint_seq().expect("marker");
    let mut w = snaps::PartWriter::default();
    w.add("c", &mem["c"].events).expect("add");
    store.write_increment(w.finish().expect("finish")).expect("increment");
    let corrupt = StoreError::Corrupt { what: "jobs", key: "x".into(), reason: "bad".into() };
    assert!(!store.halt_after(&corrupt), "damage in a value read does not halt writes");
    let enospc = StoreError::Sled(sled::Error::Io(std::io::Error::from_raw_os_error(28)));
    assert!(store.halt_after(&enospc), "the first I/O failure halts");
    let emfile = StoreError::Sled(sled::Error::Io(std::io::Error::from_raw_os_error(24)));
    assert_eq!(emfile.cause(), "too many open files");
    assert!(!store.halt_after(&emfile), "only the first halts; its cause stays");
    assert_eq!(store.halted(), Some("no space left on device"));
    let halted = |r: Result<(), StoreError>, what: &str| match r {
        Err(StoreError::Halted(cause)) => assert_eq!(cause, "no space left on device", "{what}"),
        other => panic!("{what}: {other:?}"),
    };
    halted(store.finish_checkpoint(seq), "marker");
    let no = store.begin_base();
    halted(store.switch_base(no, seq, 3), "base switch");
    halted(store.append_durable(&[(seq + 1, encode_log_value(&pb::LifecycleEvent::default()))]), "log append");
    halted(store.stream_put::<Vec<u8>>(&[], Some(1), 0), "stream");
    halted(store.flush(), "flush");
    halted(store.save_alerts(&[]), "alerts");
    assert_eq!(store.checkpoint_seq().expect("marker"), marker, "the marker stays; reads go on");
    assert!(store.log_after(0, usize::MAX).expect("the log reads").len() >= 3);
    drop(store);
    let store = Store::open(dir.path()).expect("a new open is not halted");
    assert_eq!(store.halted(), None);
    assert_eq!(store.restore().expect("restore").jobs, mem);
}

#[test]
fn the_part_codec_round_trips_every_kind_and_extreme_values_and_detects_damage() {
    let kinds = [
        submitted(),
        Kind::Queued(pb::Queued { reason: 2, raw_reason: "Resources".into(), ..Default::default() }),
        Kind::NodeAssigned(pb::NodeAssigned { nodes: vec!["gpu-7".into()], ..Default::default() }),
        Kind::Preparing(pb::Preparing::default()),
        Kind::FirstStep(pb::FirstStep { step: 3, ..Default::default() }),
        Kind::Checkpoint(pb::Checkpoint { step: 1000, save_seconds: 2.5, ..Default::default() }),
        Kind::Preempted(pb::Preempted { reason: "spot".into(), checkpoint_saved: true }),
        Kind::Done(pb::Done { exit_code: Some(-9), ..Default::default() }),
    ];
    // Times and sequences out of order and at the extremes; hashes of every width.
    let times = [i64::MAX, 1_000_000, i64::MIN, -5, 0, 1_796_000_000_000, 1, i64::MAX - 1];
    let seqs = [7, 3, u64::MAX, 1, 1 << 40, 9, 8, 2];
    let mut events = Vec::new();
    for (i, k) in kinds.into_iter().enumerate() {
        let mut ce = CompactEvent::from_pb(&ev("j", &format!("e{i}"), 0, k), seqs[i]).expect("kind");
        ce.at_ms = times[i];
        ce.id_hash = [0, 1, u64::MAX, 1 << 63, 12345, u64::MAX - 1, 77, 1 << 7][i];
        ce.attempt = (i % 2 == 0).then_some(i as u32);
        events.push(ce);
    }
    let mut w = snaps::PartWriter::default();
    w.add("j\u{e9}", &events).expect("add");
    w.add("empty", &[]).expect("nothing");
    w.add("k", &events[..2]).expect("add");
    let parts = w.finish().expect("finish");
    assert_eq!(parts.len(), 1);
    let mut want = events.clone();
    want.sort_by_key(|e| e.seq);
    let mut want_k = events[..2].to_vec();
    want_k.sort_by_key(|e| e.seq);
    assert_eq!(
        snaps::decode_part(&parts[0]).expect("decode"),
        vec![("j\u{e9}".to_string(), want.clone()), ("k".to_string(), want_k)]
    );
    // Every flipped bit and every truncation is detected.
    for i in 0..parts[0].len() * 8 {
        let mut bad = parts[0].clone();
        bad[i / 8] ^= 1 << (i % 8);
        assert!(snaps::decode_part(&bad).is_err(), "flip of bit {i} not detected");
    }
    for n in 0..parts[0].len() {
        assert!(snaps::decode_part(&parts[0][..n]).is_err(), "truncation to {n} bytes not detected");
    }
    // Bodies the checksum vouches for but that lie are refused: a huge count, bytes after the events.
    let mut body = Vec::new();
    prost::encoding::encode_varint(u64::MAX, &mut body);
    assert!(snaps::decode_events(&mut body.as_slice()).expect_err("count").contains("claimed"));
    let mut raw = Vec::new();
    prost::encoding::encode_varint(1, &mut raw);
    raw.push(b'j');
    let mut evs = Vec::new();
    snaps::events_body(&want, &mut evs).expect("body");
    evs.push(0);
    prost::encoding::encode_varint(evs.len() as u64, &mut raw);
    raw.extend_from_slice(&evs);
    let mut sealed_body = Vec::new();
    prost::encoding::encode_varint(raw.len() as u64, &mut sealed_body);
    sealed_body.extend_from_slice(&zstd::bulk::compress(&raw, 3).expect("zstd"));
    let lie = seal_as(snaps::PART_VERSION, &sealed_body);
    assert!(snaps::decode_part(&lie).expect_err("trailing").contains("after the events"));
    // About 15 bytes an event before compression (postcard of whole events: ~25).
    let typical: Vec<CompactEvent> = (1..=20u64)
        .map(|i| {
            let k = Kind::Checkpoint(pb::Checkpoint { step: i * 100, ..Default::default() });
            CompactEvent::from_pb(&ev("j", &format!("c{i}"), 1_796_000_000_000 + i as i64 * 60_000, k), 1000 + i * 3)
                .expect("kind")
        })
        .collect();
    let mut compact = Vec::new();
    snaps::events_body(&typical, &mut compact).expect("body");
    let whole = postcard::to_stdvec(&typical).expect("postcard").len();
    assert!(
        compact.len() <= 20 * 18 && compact.len() < whole,
        "{} bytes (postcard {whole}) for 20 events",
        compact.len()
    );
    // Parts are cut at about PART_RAW_BYTES.
    let mut w = snaps::PartWriter::default();
    for i in 0..(snaps::PART_RAW_BYTES / 300 + 10) {
        w.add(&format!("job-{i}"), &typical).expect("add");
    }
    let parts = w.finish().expect("finish");
    assert_eq!(parts.len(), 2);
    let n: usize = parts.iter().map(|p| snaps::decode_part(p).expect("decode").len()).sum();
    assert_eq!(n, snaps::PART_RAW_BYTES / 300 + 10);
}

#[test]
fn increments_join_and_a_damaged_part_rebuilds_every_job_from_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let (mut mem, mut seq) = three_jobs(&store);
    // "a" changes after the first checkpoint: the next increment holds the rest of it.
    let mut marks: HashMap<String, u64> = HashMap::new();
    marks.insert("a".into(), seq);
    write(&store, &mut mem, &mut seq, &[ev("a", "a3", 1_200_000, Kind::Done(pb::Done::default()))]);
    increment(&store, &mem, &mut marks, &["a", "c"], seq);
    let r = store.restore().expect("restore");
    assert!(r.rebuilt.is_none());
    assert_eq!(r.jobs, mem);
    // A part that fails its checksum: reported with its key, every job rebuilt from the log.
    let k = snaps::PartFile::Inc(part_files(&store).0.pop().expect("an increment"));
    let mut v = std::fs::read(part_path(&store, &k)).expect("part");
    let last = v.len() - 1;
    v[last] ^= 0x01;
    std::fs::write(part_path(&store, &k), &v).expect("damage");
    let r = store.restore().expect("restore");
    let why = r.rebuilt.expect("rebuilt");
    assert!(why.contains("checksum mismatch") && why.contains("snapshot part"), "{why}");
    assert_eq!(r.jobs, mem);
    assert!(r.snapshot_through.is_empty() && r.dirty.len() == mem.len(), "every job rewritten by the next checkpoint");
    assert!(store.wants_base(u64::MAX, u64::MAX), "the next checkpoint writes a base");
    // A base pointer that cannot be read likewise.
    std::fs::write(part_path(&store, &k), seal_as(snaps::PART_VERSION, &[0])).expect("damage");
    raw_put(&store, "jobs", BASE_KEY, &seal(&[1, 2, 3]));
    let why = store.restore().expect("restore").rebuilt.expect("rebuilt");
    assert!(why.contains("base pointer"), "{why}");
}

/// Flips a byte near the end of the (only) log segment under store `dir`: the segment and its damaged bytes.
fn damage_log_end(dir: &std::path::Path) -> (std::path::PathBuf, Vec<u8>) {
    let seg = std::fs::read_dir(dir.join(LOG_DIR))
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .find(|p| p.extension().is_some_and(|x| x == "seg"))
        .expect("segment");
    let mut bytes = std::fs::read(&seg).expect("read");
    let n = bytes.len();
    bytes[n - 2] ^= 0x55;
    std::fs::write(&seg, &bytes).expect("write");
    (seg, bytes)
}

#[test]
fn a_damaged_log_value_stops_the_restore_with_its_sequence_number() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let (_, seq) = three_jobs(&store);
    // c1 went in by itself: its block starts at its sequence. Damage its body in the log's file (a reader
    // in this process reads it; see `files` for what a reopen makes of damage).
    let t = store.t().expect("open");
    let block = t.files.block_at(seq).expect("read").expect("block");
    assert_eq!(block.first, seq);
    damage_log_end(dir.path());
    let err = store.restore().expect_err("must refuse").to_string();
    assert!(err.contains(&format!("block {seq}")) && err.contains("checksum mismatch"), "{err}");
}

/// Damage inside the log's newest append looks like a torn write, but when a snapshot part holds its events
/// they were acknowledged: the open refuses and cuts nothing. Without the `snapshot_seq` record (removed here, as
/// when it cannot be read) the open cuts the tail, and the restore still refuses, at that start and every later
/// one.
#[test]
fn damage_in_the_newest_append_a_snapshot_holds_is_refused_never_cut() {
    for without_record in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open");
        let (mem, _) = three_jobs(&store);
        // Parts that hold every event, the marker behind them (as after a crash before a checkpoint's marker:
        // `three_jobs` checkpointed through 3, this moves the marker back to 1 by hand).
        store.checkpoint(mem.iter().map(|(k, v)| (k.as_str(), v)), 1).expect("checkpoint");
        if without_record {
            store.t().expect("open").jobs.remove(SNAPSHOT_SEQ_KEY).expect("remove");
        }
        store.flush().expect("flush");
        drop(store);
        let (seg, bytes) = damage_log_end(dir.path());
        if without_record {
            for start in 0..2 {
                let store = Store::open(dir.path()).expect("an open without the record cuts the tail");
                assert!(std::fs::read(&seg).expect("read").len() < bytes.len(), "start {start}: the tail was cut");
                let err = store.restore().expect_err("the restore refuses");
                assert!(err.is_damage() && err.to_string().contains("log ends at sequence"), "start {start}: {err}");
            }
        } else {
            let err = Store::open(dir.path()).err().expect("refused");
            assert!(err.is_damage() && err.to_string().contains("acknowledged"), "{err}");
            assert!(std::fs::read(&seg).expect("read") == bytes, "a refused open cuts nothing");
        }
    }
}

#[test]
fn a_block_is_marked_then_rewritten_then_deleted_as_its_events_leave() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Every write starts a segment: the ten jobs' block is in a segment that takes no more appends.
    let small = || StoreOptions { segment_bytes: 1, ..StoreOptions::default() };
    let store = Store::open_with(dir.path(), small()).expect("open");
    let mut mem = BTreeMap::new();
    let mut seq = 0;
    // Ten jobs, two events each, in one block.
    let evs: Vec<pb::LifecycleEvent> =
        (0..20).map(|i| ev(&format!("j{}", i % 10), &format!("e{i}"), 1_000_000 + i, submitted())).collect();
    write(&store, &mut mem, &mut seq, &evs);
    write(&store, &mut mem, &mut seq, &[ev("z", "z0", 2_000_000, submitted())]);
    let t = store.t().expect("open");
    assert_eq!(t.files.totals().0, 2);
    let seqs_of =
        |job: &str, mem: &BTreeMap<String, JobRecord>| mem[job].events.iter().map(|e| e.seq).collect::<Vec<_>>();
    let blocks_state = |store: &Store| {
        let t = store.t().expect("open");
        let totals = t.dead().totals();
        (t.files.totals().0, totals, t.blocks.len())
    };
    // One job of ten goes: its two events are marked dead, the block stays.
    store.delete_jobs(&[expired("j0", seqs_of("j0", &mem))]).expect("delete");
    store.maintain_log().expect("log upkeep");
    assert_eq!(blocks_state(&store), (2, (1, 2), 1));
    assert_eq!(store.event(1).expect("read"), None, "a dead event is not read");
    assert!(store.event(2).expect("read").is_some());
    // Marks survive a reopen.
    drop(t);
    drop(store);
    let store = Store::open_with(dir.path(), small()).expect("reopen");
    assert_eq!(blocks_state(&store), (2, (1, 2), 1));
    let r = store.restore().expect("restore");
    assert_eq!(r.replayed, 19, "dead events are not replayed");
    // Four more jobs go: half the segment is dead, it is rewritten with the live half and its mark goes (by the
    // log's upkeep, on the maintenance thread in the collector).
    let gone: Vec<ExpiredJob> = (1..5).map(|j| expired(&format!("j{j}"), seqs_of(&format!("j{j}"), &mem))).collect();
    store.delete_jobs(&gone).expect("delete");
    store.maintain_log().expect("log upkeep");
    assert_eq!(blocks_state(&store), (2, (0, 0), 0));
    let r = store.restore().expect("restore");
    assert_eq!(r.replayed, 11);
    let left: BTreeMap<String, JobRecord> =
        mem.iter().filter(|(k, _)| k.as_str() >= "j5").map(|(k, v)| (k.clone(), v.clone())).collect();
    assert_eq!(r.jobs, left);
    // The rest go: the segment goes.
    let gone: Vec<ExpiredJob> = (5..10).map(|j| expired(&format!("j{j}"), seqs_of(&format!("j{j}"), &mem))).collect();
    store.delete_jobs(&gone).expect("delete");
    store.maintain_log().expect("log upkeep");
    assert_eq!(blocks_state(&store), (1, (0, 0), 0));
    let r = store.restore().expect("restore");
    assert_eq!(r.jobs.keys().collect::<Vec<_>>(), vec!["z"]);
    drop(store);
    let store = Store::open_with(dir.path(), small()).expect("reopen");
    assert_eq!(store.restore().expect("restore").jobs.keys().collect::<Vec<_>>(), vec!["z"]);
}

#[test]
fn sequence_numbers_never_go_back_when_the_newest_log_entries_are_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let (mem, seq) = three_jobs(&store);
    store.checkpoint(mem.iter().map(|(k, v)| (k.as_str(), v)), seq).expect("checkpoint");
    // Retention deletes the job holding the newest entry.
    store.delete_jobs(&[expired("c", vec![seq])]).expect("delete");
    let r = store.restore().expect("restore");
    assert_eq!(r.last_seq, seq, "the next event must be numbered above the checkpoint marker");
}

/// A hot job retention deletes: its events' sequences, no summaries.
fn expired(job: &str, seqs: Vec<u64>) -> ExpiredJob {
    ExpiredJob { job_id: job.to_string(), seqs, summaries: Vec::new() }
}

#[test]
fn a_directory_the_store_creates_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nested").join("db");
    let _store = Store::open(&path).expect("open");
    let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{mode:o}");
}

mod model {
    //! The store driven through random sequences of appends, checkpoints (of the jobs the committer would call
    //! dirty), retention deletes and restarts, against a model of what was acknowledged.
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    #[derive(Debug, Clone)]
    enum Op {
        /// Append events for jobs (job index, count).
        Append(Vec<(u8, u8)>),
        /// Checkpoint the dirty jobs.
        Checkpoint,
        /// Checkpoint that crashes after writing some of the dirty jobs' snapshots (no marker).
        TornCheckpoint(u8),
        /// A checkpoint that writes a base.
        Base,
        /// A base whose parts are written but never switched to (a crash).
        TornBase,
        /// Delete a job (retention).
        Expire(u8),
        /// Drop the store (everything acknowledged was flushed) and restore.
        Restart,
        /// The log's upkeep: compact a sealed segment, collect dead ones if due.
        MaintainLog,
        /// A group commit of this many events dies part-way through writing its block to the log's newest
        /// segment (never acknowledged); then restart.
        TornAppend(u8),
        /// Fold hot jobs in one write (their summaries, each listing its log entries, share a pack; snapshots
        /// removed) and drop them from memory.
        Fold(Vec<u8>),
        /// Fold a hot job whose late event arrives meanwhile: written, but the job stays hot.
        FoldKeptHot(u8),
        /// A fold that crashes between its two steps: summary written, snapshot not deleted (the job
        /// stays hot in memory; the next restart must restore it whole).
        TornFold(u8),
    }

    /// Writes part of a block of `k` events (above `last_seq`) at the end of the log's newest segment: a
    /// group commit cut short by a crash.
    fn tear_log_tail(dir: &std::path::Path, last_seq: u64, k: u8) {
        let Some(seg) = std::fs::read_dir(dir.join(LOG_DIR))
            .expect("dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "seg"))
            .max()
        else {
            return;
        };
        let bodies: Vec<(u64, Vec<u8>)> = (1..=u64::from(k))
            .map(|i| (last_seq + i, ev("j0", &format!("torn{i}"), 5_000_000, submitted()).encode_to_vec()))
            .collect();
        let refs: Vec<(u64, &[u8])> = bodies.iter().map(|(s, b)| (*s, b.as_slice())).collect();
        let mut frame = Vec::new();
        files::frames(&log::encode_blocks(&refs).expect("encode"), 0, &mut frame).expect("frames");
        let cut = 1 + (usize::from(k) * 7919) % (frame.len() - 1);
        let mut f = std::fs::OpenOptions::new().append(true).open(seg).expect("open");
        std::io::Write::write_all(&mut f, &frame[..cut]).expect("write");
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => proptest::collection::vec((0u8..6, 1u8..4), 1..4).prop_map(Op::Append),
            2 => Just(Op::Checkpoint),
            1 => (0u8..6).prop_map(Op::TornCheckpoint),
            1 => Just(Op::Base),
            1 => Just(Op::TornBase),
            1 => (0u8..6).prop_map(Op::Expire),
            2 => Just(Op::Restart),
            1 => (1u8..9).prop_map(Op::TornAppend),
            2 => Just(Op::MaintainLog),
            2 => proptest::collection::vec(0u8..6, 1..4).prop_map(Op::Fold),
            1 => (0u8..6).prop_map(Op::FoldKeptHot),
            1 => (0u8..6).prop_map(Op::TornFold),
        ]
    }

    /// What a fold of `job` writes: its sequences, and its id as the summary, replacing its older summaries.
    fn fold_write(job: &str, rec: &JobRecord, replaces: &[u64]) -> FoldWrite {
        let seqs: Vec<u64> = rec.events.iter().map(|e| e.seq).collect();
        let summary = job.as_bytes().to_vec();
        FoldWrite { job_id: job.to_string(), log_seqs: seqs, summary, replaces: replaces.to_vec(), number: 0 }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn restore_always_returns_every_acknowledged_event(ops in proptest::collection::vec(op(), 1..40)) {
            let dir = tempfile::tempdir().expect("tempdir");
            // Small segments: appends roll often and retention deletes and rewrites them.
            let open = |p: &std::path::Path| Store::open_with(p, StoreOptions { segment_bytes: 1500, ..StoreOptions::default() });
            let mut store = open(dir.path()).expect("open");
            // The model: what was acknowledged, per job (event ids).
            let mut acked: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            // The committer's view.
            let mut mem: BTreeMap<String, JobRecord> = BTreeMap::new();
            let mut dirty: HashSet<String> = HashSet::new();
            // Folded jobs, with the record they had when folded.
            let mut folded: BTreeMap<String, JobRecord> = BTreeMap::new();
            // Hot jobs whose fold crashed after writing their summary and that have not changed since: a restart
            // may bring them back folded (the summary lists every event they have) or hot (a snapshot beside it).
            let mut torn: HashSet<String> = HashSet::new();
            // The numbers of the summaries the store holds per job (a folded job's; a hot job's stale ones).
            let mut summaries: BTreeMap<String, Vec<u64>> = BTreeMap::new();
            let mut last_seq = 0u64;
            // The highest sequence a checkpoint marker claims: new events must be numbered above it.
            let mut marker = 0u64;
            // What the snapshot parts hold of each hot job, as the committer's marks say (its highest sequence);
            // a job not listed has nothing known stored (its next checkpoint writes all its events).
            let mut marks: HashMap<String, u64> = HashMap::new();
            let mut n = 0u64;
            for op in ops {
                let op = match op {
                    Op::TornAppend(k) => {
                        tear_log_tail(dir.path(), last_seq, k);
                        Op::Restart
                    }
                    op => op,
                };
                match op {
                    Op::Append(items) => {
                        let mut evs = Vec::new();
                        for (j, count) in items {
                            let job = format!("j{j}");
                            torn.remove(&job);
                            for _ in 0..count {
                                n += 1;
                                let kind = if acked.get(&job).is_none_or(|s| s.is_empty()) {
                                    submitted()
                                } else {
                                    Kind::Checkpoint(pb::Checkpoint { step: n, ..Default::default() })
                                };
                                evs.push(ev(&job, &format!("e{n}"), 1_000_000 + n as i64, kind));
                            }
                            // A late event for a folded job unfolds it from its folded events first.
                            if let Some(rec) = folded.remove(&job) {
                                marks.remove(&job);
                                let number = summaries[&job][0];
                                let archived = store.folded_events(&job, number).expect("folded events");
                                let compact = archived.iter().filter_map(|(q, e)| CompactEvent::from_pb(e, *q)).collect();
                                let back = JobRecord::from_events(compact);
                                prop_assert_eq!(&back, &rec);
                                mem.insert(job.clone(), back);
                            }
                        }
                        write(&store, &mut mem, &mut last_seq, &evs);
                        for e in evs {
                            dirty.insert(e.job_id.clone());
                            acked.entry(e.job_id).or_default().insert(e.event_id);
                        }
                    }
                    Op::MaintainLog => {
                        store.maintain_log().expect("log upkeep");
                    }
                    // As the committer does: each dirty job's events past its mark as an increment, then the
                    // marker, then the marks.
                    Op::Checkpoint => {
                        let ids: Vec<&str> = dirty.iter().filter(|id| mem.contains_key(*id)).map(|id| id.as_str()).collect();
                        increment(&store, &mem, &mut marks, &ids, last_seq);
                        marker = last_seq;
                        dirty.clear();
                    }
                    // A checkpoint that writes a base of every hot job.
                    Op::Base => {
                        base(&store, &mem, &mut marks, last_seq);
                        marker = last_seq;
                        dirty.clear();
                    }
                    // A checkpoint cut short: some parts written, no marker, no marks.
                    Op::TornCheckpoint(k) => {
                        let mut w = snaps::PartWriter::default();
                        for id in dirty.iter().take(usize::from(k)) {
                            let Some(rec) = mem.get(id) else { continue };
                            let m = marks.get(id).copied().unwrap_or(0);
                            let evs: Vec<CompactEvent> = rec.events.iter().filter(|e| e.seq > m).cloned().collect();
                            w.add(id, &evs).expect("add");
                        }
                        store.write_increment(w.finish().expect("finish")).expect("increment");
                    }
                    // A base cut short: its parts written, never switched to.
                    Op::TornBase => {
                        let no = store.begin_base();
                        let mut w = snaps::PartWriter::default();
                        for (id, rec) in &mem {
                            w.add(id, &rec.events).expect("add");
                        }
                        store.write_base_parts(no, 0, w.finish().expect("finish")).expect("parts");
                    }
                    Op::TornFold(j) => {
                        let job = format!("j{j}");
                        if let Some(rec) = mem.get(&job) {
                            let mut fw = [fold_write(&job, rec, summaries.get(&job).map_or(&[], |v| v))];
                            store.fold_write(&mut fw, &[]).expect("fold write");
                            summaries.insert(job.clone(), vec![fw[0].number]);
                            torn.insert(job);
                        }
                    }
                    Op::Fold(js) => {
                        let jobs: BTreeSet<String> =
                            js.iter().map(|j| format!("j{j}")).filter(|job| mem.contains_key(job)).collect();
                        let mut fw: Vec<FoldWrite> = jobs
                            .iter()
                            .map(|job| fold_write(job, &mem[job], summaries.get(job).map_or(&[], |v| v)))
                            .collect();
                        if fw.is_empty() {
                            continue;
                        }
                        store.fold_jobs(&mut fw, &[], last_seq).expect("fold");
                        for w in fw {
                            torn.remove(&w.job_id);
                            summaries.insert(w.job_id.clone(), vec![w.number]);
                            marks.remove(&w.job_id);
                            if let Some(rec) = mem.remove(&w.job_id) {
                                folded.insert(w.job_id.clone(), rec);
                            }
                            dirty.remove(&w.job_id);
                        }
                    }
                    Op::FoldKeptHot(j) => {
                        let job = format!("j{j}");
                        torn.remove(&job);
                        if let Some(rec) = mem.get(&job) {
                            let mut fw = [fold_write(&job, rec, summaries.get(&job).map_or(&[], |v| v))];
                            store.fold_jobs(&mut fw, &[], last_seq).expect("fold");
                            summaries.insert(job.clone(), vec![fw[0].number]);
                            // Its parts stay (a fold deletes nothing of them), and so does its mark.
                            {
                                // The late event that kept it hot (logged after the fold's copy).
                                n += 1;
                                let late = ev(&job, &format!("e{n}"), 1_000_000 + n as i64, Kind::NodeAssigned(Default::default()));
                                write(&store, &mut mem, &mut last_seq, std::slice::from_ref(&late));
                                dirty.insert(job.clone());
                                acked.entry(job.clone()).or_default().insert(late.event_id);
                            }
                        }
                    }
                    Op::Expire(j) => {
                        let job = format!("j{j}");
                        torn.remove(&job);
                        let numbers = summaries.remove(&job).unwrap_or_default();
                        marks.remove(&job);
                        if folded.remove(&job).is_some() {
                            let gone = ExpiredJob { job_id: job.clone(), seqs: Vec::new(), summaries: numbers.clone() };
                            store.delete_jobs(&[gone]).expect("delete");
                            acked.remove(&job);
                        }
                        if let Some(rec) = mem.remove(&job) {
                            let seqs = rec.events.iter().map(|e| e.seq).collect();
                            store
                                .delete_jobs(&[ExpiredJob { job_id: job.clone(), seqs, summaries: numbers }])
                                .expect("delete");
                            dirty.remove(&job);
                            acked.remove(&job);
                        }
                    }
                    Op::Restart | Op::TornAppend(_) => {
                        store.flush().expect("flush");
                        drop(store);
                        store = open(dir.path()).expect("reopen");
                        let r = store.restore().expect("restore");
                        for job in torn.clone() {
                            if r.summaries.iter().any(|(id, _, _)| *id == job) && !r.jobs.contains_key(&job) {
                                if let Some(rec) = mem.remove(&job) {
                                    folded.insert(job.clone(), rec);
                                }
                                torn.remove(&job);
                            }
                        }
                        // Sequences may be reused only when every event holding them was deleted (retention),
                        // never below a live event or the checkpoint marker.
                        let live = mem
                            .values()
                            .chain(folded.values())
                            .flat_map(|r| r.events.iter().map(|e| e.seq))
                            .max()
                            .unwrap_or(0);
                        let floor = live.max(marker);
                        prop_assert!(r.last_seq >= floor, "sequence went back: {} < {}", r.last_seq, floor);
                        let mut got: BTreeMap<String, BTreeSet<String>> = r
                            .jobs
                            .iter()
                            .map(|(id, rec)| {
                                let ids = rec
                                    .events
                                    .iter()
                                    .map(|e| store.event(e.seq).expect("read").expect("stored").event_id)
                                    .collect();
                                (id.clone(), ids)
                            })
                            .collect();
                        for (id, number, _) in &r.summaries {
                            let ids = store.folded_events(id, *number).expect("folded").into_iter().map(|(_, e)| e.event_id).collect();
                            prop_assert!(got.insert(id.clone(), ids).is_none(), "{} both hot and folded", id);
                        }
                        prop_assert_eq!(&got, &acked);
                        prop_assert_eq!(&r.jobs, &mem);
                        let summarized: BTreeSet<&String> = r.summaries.iter().map(|(id, _, _)| id).collect();
                        prop_assert_eq!(summarized, folded.keys().collect::<BTreeSet<_>>());
                        for (id, number, body) in &r.summaries {
                            prop_assert_eq!(body.as_slice(), id.as_bytes());
                            prop_assert_eq!(summaries.get(id), Some(&vec![*number]), "{}: the summary last written", id);
                        }
                        // The store holds one summary per job, the one last written; hot jobs' are stale.
                        let stored: BTreeMap<String, Vec<u64>> = store.summary_numbers().expect("numbers").into_iter().fold(
                            BTreeMap::new(),
                            |mut m, (id, n)| {
                                m.entry(id).or_insert_with(Vec::new).push(n);
                                m
                            },
                        );
                        prop_assert_eq!(&stored, &summaries);
                        for (id, numbers) in &r.stale_summaries {
                            prop_assert!(r.jobs.contains_key(id), "{}: stale summaries of a job not hot", id);
                            prop_assert_eq!(summaries.get(id), Some(numbers));
                        }
                        // Chunks belong to hot jobs only (a fold and retention delete them with the job's other snapshot).
                        for (id, through) in &r.snapshot_through {
                            let rec = r.jobs.get(id);
                            prop_assert!(rec.is_some(), "{}: parts of a job not hot", id);
                            prop_assert!(rec.is_some_and(|r| r.events.iter().any(|e| e.seq == *through)), "{}: through {}", id, through);
                        }
                        marks = r.snapshot_through;
                        mem = r.jobs;
                        dirty = r.dirty;
                        last_seq = r.last_seq;
                    }
                }
            }
        }
    }
}

fn stream_rec(cursor: u64, at_ms: i64) -> (u64, Vec<u8>) {
    let r = pb::StreamRecord {
        cursor,
        recorded_at: Some(ms_to_timestamp(at_ms)),
        job_id: format!("j{cursor}"),
        record: Some(pb::stream_record::Record::Progress(pb::Progress {})),
        ..Default::default()
    };
    (cursor, r.encode_to_vec())
}

#[test]
fn the_stream_tree_keeps_order_and_markers_across_reopens_and_trims_whole_blocks_but_the_newest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("db");
    {
        let store = Store::open(&path).expect("open");
        assert_eq!(store.stream_bounds().expect("bounds"), None);
        assert_eq!(store.stream_changes_through().expect("marker"), 0);
        let ev1 = encode_log_value(&ev("j", "e1", 1000, submitted()));
        // Block 1-2 with the log marker, block 3-4 with the changes marker, then a large block 5-104 (compressed),
        // one flush.
        store.append_durable(&[(1, ev1)]).expect("append");
        store.stream_put_events(&[stream_rec(1, 1000), stream_rec(2, 1000)], 1, None, 1000).expect("put events");
        store.stream_put(&[stream_rec(3, 2000), stream_rec(4, 3000)], Some(2), 3000).expect("put");
        let big: Vec<(u64, Vec<u8>)> = (5..=104).map(|c| stream_rec(c, 4000)).collect();
        store.stream_put(&big, None, 4000).expect("put");
        store.flush().expect("flush");
    }
    let store = Store::open(&path).expect("reopen");
    assert_eq!(store.stream_bounds().expect("bounds"), Some((1, 104)));
    assert_eq!(store.stream_changes_through().expect("marker"), 2);
    assert_eq!(store.stream_log_through().expect("log marker"), Some(1));
    let cursors = |after, limit| -> Vec<u64> {
        store.stream_read(after, limit).expect("read").iter().map(|r| r.cursor).collect()
    };
    assert_eq!(cursors(1, 3), vec![2, 3, 4], "whole blocks until the limit");
    assert_eq!(cursors(2, 1), vec![3, 4], "a block is read whole");
    assert_eq!(cursors(50, 1000), (51..=104).collect::<Vec<_>>(), "from the middle of a block");
    assert!(cursors(104, 10).is_empty());
    assert_eq!(cursors(0, 1000).len(), 104);
    // Blocks recorded before 3500 go (blocks 1-2 and 3-4); the newest block stays even when older than the cut.
    assert_eq!(store.stream_trim(3500, 1000).expect("trim"), 4);
    assert_eq!(store.stream_bounds().expect("bounds"), Some((5, 104)));
    assert_eq!(store.stream_trim(i64::MAX, 1000).expect("trim"), 0, "the newest block always stays");
    assert_eq!(cursors(0, 1).first(), Some(&5));
    // A damaged block names the tree and its key.
    raw_put(&store, "stream", &stream_key(105), b"\x02garbage");
    let err = store.stream_read(104, 10).expect_err("damaged");
    assert!(err.to_string().contains("stream"), "{err}");
    // A block holding other cursors than its key says is refused.
    let (_, value) = encode_stream_blocks(&[stream_rec(9, 1)], 1).expect("encode").remove(0);
    raw_put(&store, "stream", &stream_key(106), &value);
    assert!(store.stream_read(105, 10).is_err());
}

#[test]
fn a_folds_batched_read_matches_per_job_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let mut mem = BTreeMap::new();
    let mut seq = 0;
    // Interleaved jobs, so each job's events are scattered through the log.
    let mut events = Vec::new();
    for i in 0..40i64 {
        for job in ["a", "b", "c"] {
            events.push(ev(job, &format!("{job}{i}"), 1_000_000 + i * 1_000, submitted()));
        }
    }
    write(&store, &mut mem, &mut seq, &events);
    let c_seqs: Vec<u64> = mem["c"].events.iter().map(|e| e.seq).collect();
    let seqs: Vec<(String, Vec<u64>)> =
        mem.iter().map(|(id, r)| (id.clone(), r.events.iter().rev().map(|e| e.seq).collect())).collect();
    let wanted: Vec<(&str, &[u64])> = seqs.iter().map(|(id, s)| (id.as_str(), s.as_slice())).collect();
    let batched = store.jobs_events(&wanted).expect("batched read");
    for ((id, s), got) in seqs.iter().zip(&batched) {
        let mut one = store.job_events(id, s).expect("per-job read");
        one.sort_by_key(|(seq, _)| *seq);
        assert_eq!(got, &one, "job {id}");
        assert_eq!(got.len(), 40);
        assert!(got.windows(2).all(|w| w[0].0 < w[1].0), "in sequence order");
    }
    // Sparse sequences (read by key rather than by one range scan) give the same events.
    let a_seqs: Vec<u64> = mem["a"].events.iter().map(|e| e.seq).collect();
    let sparse = [a_seqs[0], a_seqs[39]];
    let got = store.jobs_events(&[("a", &sparse[..]), ("c", &c_seqs[..2])]).expect("sparse read");
    assert_eq!(got[0], store.job_events("a", &sparse).expect("per-job read"));
    assert_eq!(got[1], store.job_events("c", &c_seqs[..2]).expect("per-job read"));
    // A sequence the log does not hold is an error naming it.
    let err = store.jobs_events(&[("c", &[c_seqs[0], seq + 7][..])]).expect_err("missing");
    assert!(err.to_string().contains(&format!("seq {}", seq + 7)), "{err}");
}

#[test]
fn a_summary_lists_its_sequences_and_refuses_damage() {
    let v = summary_bytes(&[9, 3, 300, 3], b"body");
    let (seqs, body) = parse_summary(&v).expect("decode");
    assert_eq!(seqs, vec![3, 9, 300], "sorted, duplicates dropped");
    assert_eq!(body, b"body");
    // Damage is refused, naming why (a pack's checksum covers the rest).
    assert!(parse_summary(&[0xff, 0xff, 0x03]).expect_err("count").contains("sequences claimed"));
    assert!(parse_summary(&[2, 5, 0]).expect_err("repeat").contains("repeats"));
}

#[test]
fn a_folded_jobs_events_stay_in_the_log_until_retention_and_restore_does_not_replay_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = Store::open(dir.path()).expect("open");
    let mut mem = BTreeMap::new();
    let mut seq = 0;
    let mut events = Vec::new();
    for i in 0..30i64 {
        for job in ["a", "b"] {
            let kind = if i == 0 {
                submitted()
            } else {
                Kind::Checkpoint(pb::Checkpoint { step: i as u64, ..Default::default() })
            };
            events.push(ev(job, &format!("{job}{i}"), 1_000_000 + i * 1_000, kind));
        }
    }
    write(&store, &mut mem, &mut seq, &events);
    // Fold "a" without a checkpoint: all its events are in the log tail, and its summary lists them.
    let a_seqs: Vec<u64> = mem["a"].events.iter().map(|e| e.seq).collect();
    let mut fw =
        [FoldWrite { job_id: "a".into(), log_seqs: a_seqs.clone(), summary: b"a".to_vec(), ..Default::default() }];
    store.fold_jobs(&mut fw, &[], seq).expect("fold");
    let a_summary = fw[0].number;
    assert_eq!(a_summary, 1, "the first summary number");
    let folded = store.folded_events("a", a_summary).expect("folded events");
    assert_eq!(
        folded.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        a_seqs.iter().copied().collect::<BTreeSet<_>>().into_iter().collect::<Vec<_>>()
    );
    assert!(folded.iter().all(|(_, e)| e.job_id == "a"));
    // Restore: "a" is folded (not replayed into a hot record, not dirty), "b" is hot from the tail.
    drop(store);
    store = Store::open(dir.path()).expect("reopen");
    let r = store.restore().expect("restore");
    assert_eq!(r.summaries, vec![("a".to_string(), a_summary, b"a".to_vec())]);
    assert_eq!(r.jobs.keys().collect::<Vec<_>>(), vec!["b"]);
    assert!(!r.dirty.contains("a") && r.dirty.contains("b"));
    assert_eq!((r.folded, r.unfolded, r.replayed), (1, 0, 60));
    // A late event: "a" comes back hot with every event (those the summary lists, read from the log).
    let late = ev("a", "a-late", 2_000_000, Kind::NodeAssigned(Default::default()));
    write(&store, &mut mem, &mut seq, std::slice::from_ref(&late));
    drop(store);
    store = Store::open(dir.path()).expect("reopen");
    let r = store.restore().expect("restore");
    assert_eq!(r.unfolded, 1);
    assert_eq!(r.jobs["a"], mem["a"]);
    assert_eq!(r.stale_summaries, HashMap::from([("a".to_string(), vec![a_summary])]));
    assert!(r.dirty.contains("a"));
    // A damaged summary: the job is rebuilt from the whole log (checkpointed first, so no tail holds it).
    store.checkpoint(mem.iter().map(|(id, r)| (id.as_str(), r)), seq).expect("checkpoint");
    let mut fw = [FoldWrite {
        job_id: "b".into(),
        log_seqs: mem["b"].events.iter().map(|e| e.seq).collect(),
        summary: b"b".to_vec(),
        ..Default::default()
    }];
    store.fold_jobs(&mut fw, &[], seq).expect("fold b");
    // "b" is alone in its pack, keyed by its summary number; a damaged pack cannot say which jobs it held.
    let b_key = packs::pack_key(fw[0].number);
    let t = store.t().expect("open");
    let mut damaged = t.summaries.get(b_key).expect("get").expect("present").to_vec();
    let at = damaged.len() - 1;
    damaged[at] ^= 0xff;
    t.summaries.insert(b_key, damaged).expect("damage");
    t.db.flush().expect("flush");
    drop(t);
    for _ in 0..2 {
        // Every restart while the damaged pack exists finds the job in the log with no record or summary.
        drop(store);
        store = Store::open(dir.path()).expect("reopen");
        let r = store.restore().expect("restore");
        assert_eq!((r.replayed, r.folded), (0, 0));
        assert_eq!(r.jobs["b"], mem["b"], "rebuilt from the log");
        assert!(r.dirty.contains("b"));
        assert_eq!(r.lost_packs, vec![fw[0].number]);
        assert_eq!(r.jobs.keys().collect::<Vec<_>>(), vec!["a", "b"], "only jobs without a record or summary");
    }
    // Folded again (a new pack), "b" is folded at the next restart although the damaged pack is still there.
    let b_damaged = fw[0].number;
    let mut fw = [FoldWrite {
        job_id: "b".into(),
        log_seqs: mem["b"].events.iter().map(|e| e.seq).collect(),
        summary: b"b2".to_vec(),
        ..Default::default()
    }];
    store.fold_jobs(&mut fw, &[], seq).expect("refold b");
    assert!(fw[0].number > b_damaged);
    drop(store);
    store = Store::open(dir.path()).expect("reopen");
    let r = store.restore().expect("restore");
    assert_eq!(r.lost_packs, vec![b_damaged]);
    assert!(r.summaries.contains(&("b".to_string(), fw[0].number, b"b2".to_vec())));
    assert!(!r.jobs.contains_key("b") && !r.dirty.contains("b"));
    // Retention of a folded job kills its log entries with its summary.
    let mut fw = [FoldWrite {
        job_id: "a".into(),
        log_seqs: mem["a"].events.iter().map(|e| e.seq).collect(),
        summary: b"a".to_vec(),
        replaces: vec![a_summary],
        number: 0,
    }];
    store.fold_jobs(&mut fw, &[], seq).expect("refold");
    let refolded = fw[0].number;
    assert!(refolded > a_summary);
    assert!(store.folded_events("a", a_summary).expect("replaced").is_empty(), "the old summary went");
    assert_eq!(store.folded_events("a", refolded).expect("folded").len(), 31);
    let gone = ExpiredJob { job_id: "a".into(), seqs: Vec::new(), summaries: vec![refolded] };
    store.delete_jobs(&[gone]).expect("delete");
    assert!(store.folded_events("a", refolded).expect("gone").is_empty());
    assert!(store.summary_numbers().expect("numbers").iter().all(|(id, _)| id != "a"));
    for s in mem["a"].events.iter().map(|e| e.seq) {
        assert!(store.event(s).expect("read").is_none(), "seq {s} left the log");
    }
    for s in mem["b"].events.iter().map(|e| e.seq) {
        assert!(store.event(s).expect("read").is_some(), "seq {s} of b stays");
    }
}

/// The end time deletions for the memory budget reached is written with them, kept across a reopen, and left as
/// it is by other deletions.
#[test]
fn the_history_deleted_through_is_stored_with_the_deletion() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let (mem, _) = three_jobs(&store);
    assert_eq!(store.history_deleted_through().expect("read"), 0, "none yet");
    let mut ids = mem.iter().map(|(id, rec)| (id.clone(), rec.events.iter().map(|e| e.seq).collect::<Vec<_>>()));
    let (a, a_seqs) = ids.next().expect("a job");
    store.delete_jobs_noting(&[expired(&a, a_seqs)], Some(1_796_000_000_123)).expect("delete");
    let (b, b_seqs) = ids.next().expect("another job");
    store.delete_jobs(&[expired(&b, b_seqs)]).expect("delete");
    drop(store);
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(store.history_deleted_through().expect("read"), 1_796_000_000_123);
    let r = store.restore().expect("restore");
    assert_eq!(r.jobs.len(), mem.len() - 2, "both deletions stand");
}

/// The dictionary's next number is stored beside its entries (not read as one) and kept across a reopen.
#[test]
fn the_dictionary_next_number_is_kept_and_not_an_entry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    assert_eq!(store.dictionary_next().expect("read"), 0);
    let mut write = [FoldWrite { job_id: "j".into(), log_seqs: vec![1], summary: vec![1, 2, 3], ..Default::default() }];
    store.note_dictionary_next(7).expect("note");
    store.fold_write(&mut write, &[(6, vec![9, 9])]).expect("fold write");
    store.delete_dictionary(&[6]).expect("delete");
    drop(store);
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(store.dictionary_next().expect("read"), 7);
    assert!(store.load_dictionary().expect("entries").is_empty(), "the next number is no entry");
}

/// A store whose parts are sled values (as Startline 0.1.0 wrote them) restores them with the files' parts, and
/// the next base removes them from sled; a crash after a base's switch but before its superseded files are
/// removed leaves increments below the floor, which restore ignores and the next base removes.
#[test]
fn parts_in_sled_are_still_read_and_superseded_files_left_by_a_crash_are_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let (mut mem, mut seq) = three_jobs(&store);
    // Parts as 0.1.0 wrote them: a base in sled, and an increment in sled.
    let no = store.begin_base();
    let mut w = snaps::PartWriter::default();
    for (id, rec) in &mem {
        w.add(id, &rec.events).expect("add");
    }
    for (i, part) in w.finish().expect("finish").into_iter().enumerate() {
        raw_put(&store, "jobs", &snaps::base_key(no, i as u64), &part);
    }
    raw_put(&store, "jobs", BASE_KEY, &seal(&no.to_be_bytes()));
    store.finish_checkpoint(seq).expect("marker");
    write(&store, &mut mem, &mut seq, &[ev("a", "a9", 1_300_000, Kind::Done(pb::Done::default()))]);
    let mut w = snaps::PartWriter::default();
    w.add("a", &mem["a"].events).expect("add");
    let inc_no = store.begin_base();
    raw_put(&store, "jobs", &snaps::inc_key(inc_no), &w.finish().expect("finish").remove(0));
    store.finish_checkpoint(seq).expect("marker");
    // A new increment in a file joins them.
    write(&store, &mut mem, &mut seq, &[ev("c", "c9", 1_300_000, Kind::Done(pb::Done::default()))]);
    let mut marks = HashMap::new();
    marks.insert("c".to_string(), 0);
    increment(&store, &mem, &mut marks, &["c"], seq);
    drop(store);
    let store = Store::open(dir.path()).expect("reopen");
    let r = store.restore().expect("restore");
    assert!(r.rebuilt.is_none(), "{:?}", r.rebuilt);
    assert_eq!((r.jobs.clone(), r.replayed), (mem.clone(), 0), "sled's parts and the file's, nothing replayed");
    // A base: sled keeps no part, the files only the base.
    base(&store, &mem, &mut marks, seq);
    assert!(jobs_keys(&store, &[snaps::INC_PREFIX]).is_empty() && jobs_keys(&store, &[snaps::BASE_PREFIX]).is_empty());
    let (incs, bases) = part_files(&store);
    assert!(incs.is_empty() && bases.len() == 1, "{incs:?} {bases:?}");
    // A crash between the switch and the removal: an increment and a base from before the switch are still there.
    let floor = match store.t().expect("open").jobs.get(SNAP_FLOOR_KEY).expect("get") {
        Some(v) => base_number(&v).expect("floor"),
        None => panic!("no floor"),
    };
    let stale_inc = snaps::PartFile::Inc(floor - 1);
    let stale_base = snaps::PartFile::Base(bases[0].0 - 1, 0);
    let mut bogus = snaps::PartWriter::default();
    bogus.add("ghost", &mem["a"].events).expect("add");
    let bogus = bogus.finish().expect("finish").remove(0);
    for f in [&stale_inc, &stale_base] {
        std::fs::write(part_path(&store, f), &bogus).expect("stale file");
    }
    std::fs::write(store.path().join(SNAP_DIR).join("inc-00000000000000000999.part.tmp"), b"torn").expect("tmp");
    drop(store);
    let store = Store::open(dir.path()).expect("reopen");
    let r = store.restore().expect("restore");
    assert!(!r.jobs.contains_key("ghost"), "a superseded file's jobs are not restored");
    assert_eq!(r.jobs, mem);
    // The next base removes them.
    base(&store, &mem, &mut marks, seq);
    let (incs, bases) = part_files(&store);
    assert!(incs.is_empty() && bases.len() == 1, "{incs:?} {bases:?}");
    assert_eq!(store.restore().expect("restore").jobs, mem);
}
