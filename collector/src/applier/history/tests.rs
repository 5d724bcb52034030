//! The seal pass against a model: random sequences of jobs ending on random days, folds, late events (a folded
//! job unfolded with its events, as the applier does), deletions and passes at moving clocks; after every pass
//! each day's file holds exactly the model's jobs of that day with their end and time to first step, read back
//! with Parquet's own reader.

use super::*;
use crate::index::JobIndex;
use crate::job::{event_id_hash, CompactEvent, EventKind, JobAttrs};
use crate::store::history::{date_of, SealStats, FILE};
use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, TimestampMillisecondType};
use arrow_array::Array;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use proptest::prelude::*;
use startline_proto::pb;
use std::collections::BTreeSet;
use std::sync::atomic::AtomicU64;

const DAY: i64 = 86_400_000;
/// 2026-01-01T00:00:00Z
const T0: i64 = 1_767_225_600_000;

fn attrs() -> Arc<JobAttrs> {
    Arc::new(JobAttrs {
        pool_kind: pb::PoolKind::Managed,
        provider: "sagemaker".into(),
        pool: "ml.p4d".into(),
        priority: pb::PriorityClass::Normal,
        gpu_class: "a100".into(),
        gpu_count: 8,
        node_count: 1,
        region: "us-east-1".into(),
        team: "nlp".into(),
        project: String::new(),
        chain_id: String::new(),
        chain_stage: String::new(),
        labels: Default::default(),
    })
}

fn ev(id: &str, seq: u64, at: i64, kind: EventKind) -> CompactEvent {
    CompactEvent { at_ms: at, id_hash: event_id_hash(id), seq, attempt: None, kind }
}

#[derive(Debug, Clone)]
enum Op {
    /// A job submitted on day `day` (0..6) at `minute`, starting after `ttfs_s` seconds (0: never starts), ended
    /// `run_min` minutes after that.
    Add { day: u8, minute: u16, ttfs_s: u16, run_min: u16 },
    /// Folds the n-th job if it is hot and ended.
    Fold(usize),
    /// Folds every hot job (as a fold pass after `fold_after`).
    FoldAll,
    /// A late checkpoint event for the n-th job (unfolding it first if folded).
    Late(usize),
    /// Deletes the n-th job.
    Delete(usize),
    /// A seal pass at day `day` (0..9) + 2 h.
    Pass(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6, 0u16..1440, 0u16..3000, 1u16..2000)
            .prop_map(|(day, minute, ttfs_s, run_min)| Op::Add { day, minute, ttfs_s, run_min }),
        2 => (0usize..64).prop_map(Op::Fold),
        1 => Just(Op::FoldAll),
        1 => (0usize..64).prop_map(Op::Late),
        1 => (0usize..64).prop_map(Op::Delete),
        2 => (0u8..9).prop_map(Op::Pass),
    ]
}

/// The model: each job's events; whether it is folded.
#[derive(Default)]
struct Model {
    jobs: Vec<(String, Vec<CompactEvent>, bool)>,
    seq: u64,
    next_id: usize,
}

fn read(path: &std::path::Path) -> Vec<(String, i64, Option<i64>)> {
    let f = std::fs::File::open(path).expect("open");
    let mut out = Vec::new();
    for b in ParquetRecordBatchReaderBuilder::try_new(f).expect("reader").build().expect("build") {
        let b = b.expect("batch");
        let ids = b.column_by_name("job_id").expect("job_id").as_string::<i32>().clone();
        let ended = b.column_by_name("ended_at").expect("ended_at").as_primitive::<TimestampMillisecondType>().clone();
        let ttfs = b.column_by_name("time_to_first_step_ms").expect("ttfs").as_primitive::<Int64Type>().clone();
        for i in 0..b.num_rows() {
            out.push((ids.value(i).to_string(), ended.value(i), (!ttfs.is_null(i)).then(|| ttfs.value(i))));
        }
    }
    out
}

/// Runs `ops`; days are written in ranges of at most `cap` jobs (1-4 here: many ranges per day and per scan).
fn run(ops: Vec<Op>, folding: bool, cap: u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let history = History::open(dir.path()).expect("open");
    let index = SharedIndex::new(JobIndex::default());
    let stats = Arc::new(SealStats::default());
    let mut m = Model::default();
    let settings = HistorySettings { seal_after: Duration::from_secs(3600), seal_interval: Duration::from_secs(1) };
    for op in ops {
        match op {
            Op::Add { day, minute, ttfs_s, run_min } => {
                let id = format!("job-{}", m.next_id);
                m.next_id += 1;
                let sub = T0 + i64::from(day) * DAY + i64::from(minute) * 60_000;
                let mut evs = vec![ev("s", m.seq + 1, sub, EventKind::Submitted(attrs()))];
                let mut end = sub + i64::from(run_min) * 60_000;
                if ttfs_s > 0 {
                    let fs = sub + i64::from(ttfs_s) * 1000;
                    evs.push(ev(
                        "f",
                        m.seq + 2,
                        fs,
                        EventKind::FirstStep { step: 1, origin: pb::StepOrigin::TrainingProcess },
                    ));
                    end += i64::from(ttfs_s) * 1000;
                }
                let outcome = if ttfs_s > 0 { pb::Outcome::Succeeded } else { pb::Outcome::Cancelled };
                evs.push(ev("d", m.seq + 3, end, EventKind::Done { outcome, exit_code: None }));
                m.seq += 3;
                let mut idx = index.write();
                for e in &evs {
                    idx.insert(&id, e.clone(), T0);
                }
                m.jobs.push((id, evs, false));
            }
            Op::Fold(n) => {
                if !folding {
                    continue;
                }
                let Some((id, _, folded)) = m.jobs.get_mut(n) else { continue };
                if !*folded {
                    m.seq += 1;
                    *folded = index.write().fold(id, m.seq).is_some();
                }
            }
            Op::FoldAll => {
                if !folding {
                    continue;
                }
                for (id, _, folded) in m.jobs.iter_mut().filter(|j| !j.2) {
                    m.seq += 1;
                    *folded = index.write().fold(id, m.seq).is_some();
                }
            }
            Op::Late(n) => {
                let Some((id, evs, folded)) = m.jobs.get_mut(n) else { continue };
                let mut idx = index.write();
                if *folded {
                    assert!(idx.unfold(id, evs.clone(), T0));
                    *folded = false;
                }
                let at = evs[0].at_ms + 1000;
                m.seq += 1;
                let e = ev(&format!("late-{}", m.seq), m.seq, at, EventKind::Checkpoint { step: 1, save_ms: 10 });
                idx.insert(id, e.clone(), T0);
                evs.push(e);
            }
            Op::Delete(n) => {
                if n < m.jobs.len() {
                    let (id, _, _) = m.jobs.remove(n);
                    assert!(index.write().remove(&id, T0).is_some());
                }
            }
            Op::Pass(day) => {
                let now = T0 + i64::from(day) * DAY + 2 * 3_600_000;
                let pass = SealPass {
                    index: index.clone(),
                    history: history.clone(),
                    settings,
                    retention: None,
                    folding,
                    now,
                    busy: Arc::new(AtomicBool::new(true)),
                    stop: Arc::new(AtomicBool::new(false)),
                    stats: stats.clone(),
                    collect_max: cap,
                };
                pass.run().expect("pass");
                check(&history, &m, now, folding);
            }
        }
    }
}

/// Every sealable day (ended an hour before `now`; while folding, with all its jobs folded) has a file with
/// exactly its jobs; no file exists for a day without jobs.
fn check(history: &History, m: &Model, now: i64, folding: bool) {
    let last = day_of(now - 3_600_000) - 1;
    let mut want: BTreeMap<i64, Vec<(String, i64, Option<i64>)>> = BTreeMap::new();
    let mut hot_days = BTreeSet::new();
    for (id, evs, folded) in &m.jobs {
        let t = Timeline::derive(&{
            let mut e = evs.clone();
            e.sort_by_key(|e| (e.at_ms, e.kind.rank(), e.id_hash));
            e
        });
        let done = t.done_at.expect("every model job ended");
        let day = day_of(done);
        if folding && !folded {
            hot_days.insert(day);
        }
        want.entry(day).or_default().push((id.clone(), done, t.time_to_first_step_ms()));
    }
    for (day, jobs) in &mut want {
        let path = history.file_of(*day);
        if *day > last || hot_days.contains(day) {
            continue; // not sealable yet: whatever an earlier pass wrote may stand
        }
        jobs.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        assert!(path.exists(), "day {} has no file", date_of(*day));
        assert_eq!(&read(&path), jobs, "day {}", date_of(*day));
        CHECKED.fetch_add(1, Ordering::Relaxed);
    }
    for entry in std::fs::read_dir(history.dir()).expect("dir") {
        let p = entry.expect("entry").path().join(FILE);
        let Some(day) = (0..12).map(|d| day_of(T0) + d).find(|d| history.file_of(*d) == p) else {
            panic!("unexpected file {p:?}");
        };
        if day <= last && !hot_days.contains(&day) {
            assert!(want.contains_key(&day), "file for {} which has no job", date_of(day));
        }
    }
}

/// Days whose file was compared with the model, over all cases (the folding test must compare some).
static CHECKED: AtomicU64 = AtomicU64::new(0);

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn sealed_days_hold_exactly_their_jobs_through_late_events_and_deletions(ops in prop::collection::vec(op(), 1..60), cap in 1u64..5) {
        run(ops, false, cap);
    }

    #[test]
    fn with_folding_a_day_is_sealed_once_its_jobs_folded_and_again_after_each_refold(ops in prop::collection::vec(op(), 1..60), cap in 1u64..5) {
        run(ops, true, cap);
    }
}

#[test]
fn the_folding_sequences_compare_files() {
    // Run here too (proptest's cases above run in another test): the sequences must reach sealable, folded days.
    CHECKED.store(0, Ordering::Relaxed);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases: 24, ..ProptestConfig::default() });
    runner
        .run(&(prop::collection::vec(op(), 20..60), 1u64..5), |(ops, cap)| {
            run(ops, true, cap);
            Ok(())
        })
        .expect("sequences");
    assert!(CHECKED.load(Ordering::Relaxed) >= 10, "only {} days compared", CHECKED.load(Ordering::Relaxed));
}

/// Retention removes whole files by age; a day the folded-row budget deleted jobs from keeps its file.
#[test]
fn retention_removes_whole_days_and_the_memory_budget_never_shrinks_a_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let history = History::open(dir.path()).expect("open");
    let index = SharedIndex::new(JobIndex::default());
    for (i, day) in [0i64, 1, 2].iter().enumerate() {
        let id = format!("j{i}");
        let sub = T0 + day * DAY + 3_600_000;
        let mut idx = index.write();
        idx.insert(&id, ev("s", 1, sub, EventKind::Submitted(attrs())), T0);
        idx.insert(
            &id,
            ev("d", 2, sub + 60_000, EventKind::Done { outcome: pb::Outcome::Failed, exit_code: Some(1) }),
            T0,
        );
    }
    let pass = |now: i64, retention: Option<Duration>| SealPass {
        index: index.clone(),
        history: history.clone(),
        settings: HistorySettings::default(),
        retention,
        folding: false,
        now,
        busy: Arc::new(AtomicBool::new(true)),
        stop: Arc::new(AtomicBool::new(false)),
        stats: Arc::new(SealStats::default()),
        collect_max: COLLECT_MAX,
    };
    let r = pass(T0 + 3 * DAY + 7_200_000, None).run().expect("pass");
    assert_eq!(r.written, vec![day_of(T0), day_of(T0) + 1, day_of(T0) + 2]);
    // Nothing changed: nothing written.
    assert_eq!(pass(T0 + 3 * DAY + 7_300_000, None).run().expect("pass"), SealReport::default());
    // A file removed or damaged by hand is written again by the next pass.
    std::fs::remove_file(history.file_of(day_of(T0) + 1)).expect("remove by hand");
    std::fs::write(history.file_of(day_of(T0) + 2), b"PAR1 damaged").expect("damage by hand");
    let r = pass(T0 + 3 * DAY + 7_350_000, None).run().expect("pass");
    assert_eq!(r.written, vec![day_of(T0) + 1, day_of(T0) + 2]);
    assert_eq!(read(&history.file_of(day_of(T0) + 2)).len(), 1);
    // The budget deleted day 0's and day 1's jobs from memory (through day 1's end): their files stay.
    {
        let mut idx = index.write();
        idx.remove("j0", T0);
        idx.remove("j1", T0);
        idx.deleted.over_budget_through_ms = T0 + DAY + 3_660_000;
    }
    assert_eq!(pass(T0 + 3 * DAY + 7_400_000, None).run().expect("pass"), SealReport::default());
    assert!(history.file_of(day_of(T0)).exists() && history.file_of(day_of(T0) + 1).exists());
    // A day older than the retention goes whole, frozen or not.
    let r = pass(T0 + 3 * DAY + 7_500_000, Some(Duration::from_secs(2 * 86_400))).run().expect("pass");
    assert_eq!(r.removed, vec![day_of(T0)]);
    assert!(!history.file_of(day_of(T0)).exists());
    assert_eq!(read(&history.file_of(day_of(T0) + 2)).len(), 1);
}

/// A day is written in ranges of whole hours of at most `COLLECT_MAX` jobs (an hour holding more alone), the last
/// range of each day marked; ranges are scanned together up to the cap.
#[test]
fn days_are_cut_into_hour_ranges_and_scans_under_the_collection_cap() {
    let mut big = DayPrint::default();
    big.hours[0] = 30_000;
    big.hours[1] = 20_000;
    big.hours[2] = 1;
    big.hours[5] = 80_000;
    big.hours[23] = 10;
    let mut small = DayPrint::default();
    small.hours[12] = 5;
    let prints: BTreeMap<i64, DayPrint> = [(1, big), (2, small)].into_iter().collect();
    let r = ranges(&[1, 2], &prints, 50_000);
    let got: Vec<(i64, usize, usize, u64, bool)> = r.iter().map(|r| (r.day, r.from, r.to, r.jobs, r.last)).collect();
    assert_eq!(
        got,
        [
            (1, 0, 2, 50_000, false),
            (1, 2, 5, 1, false),
            (1, 5, 6, 80_000, false),
            (1, 6, 24, 10, true),
            (2, 0, 24, 5, true)
        ]
    );
    // Every hour of each day in exactly one range, in order.
    for d in [1, 2] {
        let hours: Vec<usize> = r.iter().filter(|r| r.day == d).flat_map(|r| r.from..r.to).collect();
        assert_eq!(hours, (0..24).collect::<Vec<_>>());
    }
    let sizes: Vec<Vec<u64>> = scans(&r, 50_000).iter().map(|g| g.iter().map(|r| r.jobs).collect()).collect();
    assert_eq!(sizes, [vec![50_000], vec![1], vec![80_000], vec![10, 5]]);
    assert!(scans(&[], 50_000).is_empty());
}
