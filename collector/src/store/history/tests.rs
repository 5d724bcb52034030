//! History files: written, read back column by column with Parquet's own reader, footers, crash leftovers.

use super::columns::Columns;
use super::*;
use crate::job::{event_id_hash, CompactEvent, EventKind, JobAttrs, Timeline};
use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, TimestampMillisecondType, UInt32Type};
use arrow_array::Array;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use startline_proto::pb;
use std::sync::Arc;

const T0: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z
const S: i64 = 1000;

fn attrs(kind: pb::PoolKind, pool: &str, gpus: u32) -> Arc<JobAttrs> {
    Arc::new(JobAttrs {
        pool_kind: kind,
        provider: "slurm".into(),
        pool: pool.into(),
        priority: pb::PriorityClass::Urgent,
        gpu_class: "h100".into(),
        gpu_count: gpus,
        node_count: 1,
        region: "eu".into(),
        team: "vision".into(),
        project: "p1".into(),
        chain_id: String::new(),
        chain_stage: String::new(),
        labels: [("owner".to_string(), "ana".to_string())].into_iter().collect(),
    })
}

fn e(id: &str, at: i64, kind: EventKind) -> CompactEvent {
    CompactEvent { at_ms: at, id_hash: event_id_hash(id), seq: 0, attempt: None, kind }
}

/// Submitted at T0 + `sub_s`, queued on capacity 60 s, assigned to `node`, preparing 30 s, first step, a
/// checkpoint saved in 5 s, done (succeeded) `run_s` after the first step.
fn ran(a: &Arc<JobAttrs>, sub_s: i64, run_s: i64, node: &str) -> Timeline {
    let t = T0 + sub_s * S;
    let nodes: Arc<[Arc<str>]> = vec![Arc::<str>::from(node)].into();
    Timeline::derive(&[
        e("s", t, EventKind::Submitted(a.clone())),
        e(
            "q",
            t,
            EventKind::Queued {
                reason: pb::WaitReason::Capacity,
                raw_reason: "Resources".into(),
                estimated_start: None,
            },
        ),
        e("n", t + 60 * S, EventKind::NodeAssigned { nodes }),
        e("p", t + 60 * S, EventKind::Preparing { phase: pb::PreparingPhase::ImagePull }),
        e("f", t + 90 * S, EventKind::FirstStep { step: 1, origin: pb::StepOrigin::TrainingProcess }),
        e("c", t + 100 * S, EventKind::Checkpoint { step: 50, save_ms: 5000 }),
        e("d", t + (90 + run_s) * S, EventKind::Done { outcome: pb::Outcome::Succeeded, exit_code: Some(0) }),
    ])
}

/// Submitted, queued on quota, cancelled after `wait_s` without starting.
fn cancelled(a: &Arc<JobAttrs>, sub_s: i64, wait_s: i64) -> Timeline {
    let t = T0 + sub_s * S;
    Timeline::derive(&[
        e("s", t, EventKind::Submitted(a.clone())),
        e(
            "q",
            t,
            EventKind::Queued { reason: pb::WaitReason::Quota, raw_reason: "quota".into(), estimated_start: None },
        ),
        e("d", t + wait_s * S, EventKind::Done { outcome: pb::Outcome::Cancelled, exit_code: None }),
    ])
}

fn read_all(path: &std::path::Path) -> arrow_array::RecordBatch {
    let f = std::fs::File::open(path).expect("open");
    let r = ParquetRecordBatchReaderBuilder::try_new(f).expect("reader").build().expect("build");
    let batches: Vec<_> = r.map(|b| b.expect("batch")).collect();
    arrow_select_concat(&batches)
}

fn arrow_select_concat(batches: &[arrow_array::RecordBatch]) -> arrow_array::RecordBatch {
    assert_eq!(batches.len(), 1, "one row group in these tests");
    batches[0].clone()
}

#[test]
fn a_day_is_written_and_read_back_exactly_by_parquets_own_reader() {
    let dir = tempfile::tempdir().expect("tempdir");
    let h = History::open(dir.path()).expect("open");
    let ded = attrs(pb::PoolKind::Dedicated, "a100", 8);
    let man = attrs(pb::PoolKind::Managed, "sm", 4);
    let jobs =
        [("j1", ran(&ded, 0, 3600, "node-1")), ("j2", cancelled(&man, 10, 600)), ("j3", ran(&man, 20, 60, "i-9"))];
    let mut cols = Columns::default();
    for (id, t) in &jobs {
        assert!(cols.push(id, t));
    }
    // A job that never ended has no row.
    let open = Timeline::derive(&[e("s", T0, EventKind::Submitted(ded.clone()))]);
    assert!(!cols.push("open", &open));
    assert_eq!(cols.len(), 3);
    let batch = cols.finish().expect("batch");
    let fp = Fingerprint { jobs: 3, hash: 0xfeed };
    let bytes = h.write_day(day_of(T0), &batch, fp).expect("write");
    let path = dir.path().join("history/end_date=2026-01-01/jobs.parquet");
    assert!(path.exists());
    assert_eq!(std::fs::metadata(&path).expect("meta").len(), bytes);
    assert_eq!(h.sealed().expect("sealed").get(&day_of(T0)), Some(&SealedDay { fingerprint: fp, bytes }));

    let b = read_all(&path);
    assert_eq!(b.num_rows(), 3);
    let s = |name: &str, i: usize| b.column_by_name(name).expect(name).as_string::<i32>().value(i).to_string();
    let i64s = |name: &str| b.column_by_name(name).expect(name).as_primitive::<Int64Type>().clone();
    assert_eq!(s("job_id", 0), "j1");
    assert_eq!(s("pool_kind", 0), "dedicated");
    assert_eq!(s("pool_kind", 1), "managed");
    assert_eq!(s("priority", 2), "urgent");
    assert_eq!(s("outcome", 1), "cancelled");
    assert_eq!(s("first_step_origin", 0), "training_process");
    assert!(b.column_by_name("first_step_origin").expect("col").is_null(1));
    assert_eq!(b.column_by_name("gpu_count").expect("col").as_primitive::<UInt32Type>().value(0), 8);
    let sub = b.column_by_name("submitted_at").expect("col").as_primitive::<TimestampMillisecondType>();
    assert_eq!(sub.value(1), T0 + 10 * S);
    let ended = b.column_by_name("ended_at").expect("col").as_primitive::<TimestampMillisecondType>();
    assert_eq!(ended.value(0), T0 + 3690 * S);
    // Time to first step: 90 s for the jobs that ran, none for the cancelled one.
    let ttfs = i64s("time_to_first_step_ms");
    assert_eq!((ttfs.value(0), ttfs.is_null(1), ttfs.value(2)), (90_000, true, 90_000));
    // GPU time by category, by hand: j1 8 GPUs, 60 s queued, 30 s preparing, 3600 s run of which 5 s saving.
    assert_eq!(i64s("waiting_gpu_ms").value(0), 60_000 * 8);
    assert_eq!(i64s("preparing_gpu_ms").value(0), 30_000 * 8);
    assert_eq!(i64s("checkpoint_gpu_ms").value(0), 5_000 * 8);
    assert_eq!(i64s("productive_gpu_ms").value(0), 3_595_000 * 8);
    assert_eq!(i64s("total_gpu_ms").value(0), 3_690_000 * 8);
    // j2: 4 GPUs waited 600 s on quota and nothing else.
    assert_eq!(i64s("waiting_gpu_ms").value(1), 600_000 * 4);
    assert_eq!(i64s("total_gpu_ms").value(1), 600_000 * 4);
    // The initial wait by segment, as a map.
    let waits = b.column_by_name("initial_wait_ms").expect("col").as_map();
    let w0 = waits.value(0);
    let keys: Vec<&str> = (0..w0.len()).map(|i| w0.column(0).as_string::<i32>().value(i)).collect();
    let vals: Vec<i64> = (0..w0.len()).map(|i| w0.column(1).as_primitive::<Int64Type>().value(i)).collect();
    // Every segment the job passed through, as the timeline keeps them (zero-length ones too).
    assert_eq!(keys, ["unreported", "queued:capacity", "assigned", "preparing:image_pull"]);
    assert_eq!(vals, [0, 60_000, 0, 30_000]);
    // Labels and nodes.
    let labels = b.column_by_name("labels").expect("col").as_map().value(2);
    assert_eq!(labels.column(0).as_string::<i32>().value(0), "owner");
    assert_eq!(labels.column(1).as_string::<i32>().value(0), "ana");
    let nodes = b.column_by_name("nodes").expect("col").as_list::<i32>();
    assert_eq!(nodes.value(2).as_string::<i32>().value(0), "i-9");
    assert_eq!(nodes.value(1).len(), 0);
}

#[test]
fn a_rewrite_replaces_the_day_and_crash_leftovers_and_unreadable_files_are_handled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let h = History::open(dir.path()).expect("open");
    let a = attrs(pb::PoolKind::Dedicated, "a100", 1);
    let mut cols = Columns::default();
    cols.push("j1", &ran(&a, 0, 10, "n"));
    let one = cols.finish().expect("batch");
    let day = day_of(T0);
    h.write_day(day, &one, Fingerprint { jobs: 1, hash: 1 }).expect("write");
    cols.push("j1", &ran(&a, 0, 10, "n"));
    cols.push("j2", &ran(&a, 5, 10, "n"));
    let two = cols.finish().expect("batch");
    h.write_day(day, &two, Fingerprint { jobs: 2, hash: 2 }).expect("rewrite");
    assert_eq!(read_all(&h.file_of(day)).num_rows(), 2);
    assert_eq!(h.sealed().expect("sealed")[&day].fingerprint, Fingerprint { jobs: 2, hash: 2 });

    // A crash between writing and renaming leaves a .tmp: the next open removes it, the sealed file stays.
    let tmp = h.file_of(day).with_extension("parquet.tmp");
    std::fs::write(&tmp, b"half a file").expect("tmp");
    let h = History::open(dir.path()).expect("reopen");
    assert!(!tmp.exists());
    assert_eq!(h.sealed().expect("sealed").len(), 1);

    // A damaged file is not served as sealed (the seal pass writes it again); a stray directory is ignored.
    std::fs::write(
        h.file_of(day + 1)
            .parent()
            .map(|p| {
                std::fs::create_dir_all(p).expect("dir");
                p.join(FILE)
            })
            .expect("path"),
        b"PAR1 not really",
    )
    .expect("junk");
    std::fs::create_dir_all(dir.path().join("history/something-else")).expect("dir");
    let sealed = h.sealed().expect("sealed");
    assert_eq!(sealed.keys().copied().collect::<Vec<_>>(), [day]);

    // A footer that disagrees with the rows is refused.
    let mut cols = Columns::default();
    cols.push("j1", &ran(&a, 0, 10, "n"));
    let b = cols.finish().expect("batch");
    h.write_day(day + 2, &b, Fingerprint { jobs: 5, hash: 1 }).expect("write");
    assert!(matches!(read_footer(&h.file_of(day + 2)), Err(HistoryError::Format { .. })));

    h.remove_day(day).expect("remove");
    h.remove_day(day).expect("removing twice is fine");
    assert!(!h.file_of(day).exists());
}

#[test]
fn dates_and_days_agree() {
    assert_eq!(date_of(day_of(T0)), "2026-01-01");
    assert_eq!(date_of(day_of(T0 - 1)), "2025-12-31");
    assert_eq!(day_of(-1), -1);
    assert_eq!(day_of_date("2026-01-01"), Some(day_of(T0)));
    assert_eq!(day_of_date("1969-12-31"), Some(-1));
    assert_eq!(day_of_date("2026-13-01"), None);
    for d in [-400, -1, 0, 1, 19_000, 20_454, 40_000] {
        assert_eq!(day_of_date(&date_of(d)), Some(d));
        assert_eq!(day_of(day_start_ms(d)), d);
    }
}

/// A day written in several batches is one file with the rows in order; a writer dropped before its commit (a
/// failed write, a stop) leaves the day's previous file and no partial file behind; a day with no rows gets none.
#[test]
fn a_day_written_in_batches_is_one_file_and_an_uncommitted_one_leaves_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let h = History::open(dir.path()).expect("open");
    let a = attrs(pb::PoolKind::Dedicated, "a100", 2);
    let day = day_of(T0);
    let batch = |ids: &[(&str, i64)]| {
        let mut cols = Columns::default();
        for (id, sub) in ids {
            cols.push(id, &ran(&a, *sub, 10, "n"));
        }
        cols.finish().expect("batch")
    };
    let mut w = h.begin_day(day).expect("begin");
    w.append(&batch(&[("a", 0), ("b", 60)])).expect("append");
    w.append(&batch(&[("c", 120)])).expect("append");
    w.append(&batch(&[])).expect("an empty batch");
    let bytes = w.commit(Fingerprint { jobs: 3, hash: 7 }).expect("commit");
    let b = read_all_batches(&h.file_of(day));
    let ids: Vec<String> =
        b.iter().flat_map(|b| (0..b.num_rows()).map(|i| b.column(0).as_string::<i32>().value(i).to_string())).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert_eq!(h.sealed().expect("sealed")[&day], SealedDay { fingerprint: Fingerprint { jobs: 3, hash: 7 }, bytes });

    let tmp = h.file_of(day).with_extension("parquet.tmp");
    let mut w = h.begin_day(day).expect("begin");
    w.append(&batch(&[("d", 0)])).expect("append");
    assert!(tmp.exists());
    drop(w);
    assert!(!tmp.exists(), "the partial file is removed");
    assert_eq!(h.sealed().expect("sealed")[&day].fingerprint.hash, 7, "the day's file is untouched");

    let w = h.begin_day(day + 1).expect("begin");
    assert_eq!(w.commit(Fingerprint { jobs: 0, hash: 0 }).expect("commit"), 0);
    assert!(!h.file_of(day + 1).exists());
}

fn read_all_batches(path: &std::path::Path) -> Vec<arrow_array::RecordBatch> {
    let f = std::fs::File::open(path).expect("open");
    ParquetRecordBatchReaderBuilder::try_new(f)
        .expect("reader")
        .build()
        .expect("build")
        .map(|b| b.expect("batch"))
        .collect()
}
