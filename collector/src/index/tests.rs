//! Index tests: scans over hot and folded jobs, folding and unfolding.

use super::*;

#[test]
fn chunked_scan_visits_every_job_once_in_order() {
    let mut idx = JobIndex::default();
    for i in 0..7 {
        idx.jobs.insert(format!("j{i}"), HotJob::default());
    }
    let shared = SharedIndex::new(idx);
    for chunk in [1, 2, 3, 7, 8, 100] {
        let mut seen = Vec::new();
        shared.for_each_job(chunk, |k, _| seen.push(k.to_string()));
        let want: Vec<String> = (0..7).map(|i| format!("j{i}")).collect();
        assert_eq!(seen, want, "chunk {chunk}");
        // Resuming after a key, and stopping early.
        let mut part = Vec::new();
        shared.scan_from(Some("j2"), chunk, |k, _| {
            part.push(k.to_string());
            part.len() < 3
        });
        assert_eq!(part, ["j3", "j4", "j5"], "chunk {chunk}");
    }
}

/// Event number `seq` (its id hash too) of kind `kind`, `m` minutes after 2026-01-01.
fn minute_event(seq: u64, m: i64, kind: crate::job::EventKind) -> CompactEvent {
    CompactEvent { at_ms: 1_767_225_600_000 + m * 60_000, id_hash: seq, seq, attempt: None, kind }
}

#[test]
fn scans_fill_a_folded_jobs_placements_only_when_asked() {
    use crate::job::{EventKind, JobAttrs};
    use startline_proto::pb;
    let ev = minute_event;
    let mut attrs = JobAttrs::unknown();
    attrs.pool = "p".into();
    let events = vec![
        ev(1, 0, EventKind::Submitted(Arc::new(attrs))),
        ev(2, 5, EventKind::NodeAssigned { nodes: vec![Arc::from("n1"), Arc::from("n2")].into() }),
        ev(3, 6, EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified }),
        ev(4, 60, EventKind::Done { outcome: pb::Outcome::Succeeded, exit_code: Some(0) }),
    ];
    let mut idx = JobIndex::default();
    idx.jobs.insert("j".into(), HotJob { rec: JobRecord::from_events(events), ..HotJob::default() });
    let hot = idx.jobs["j"].rec.timeline.clone();
    assert_eq!(hot.placements.len(), 1, "{:?}", hot.placements);
    assert!(idx.fold("j", 1).is_some());
    let shared = SharedIndex::new(idx);
    let mut light = None;
    shared.for_each_job(10, |_, r| light = Some((r.timeline.clone(), r.folded)));
    let (light, folded) = light.expect("visited");
    assert!(folded);
    assert!(light.placements.is_empty(), "a plain scan skips placements");
    assert_eq!(Timeline { placements: hot.placements.clone(), ..light }, hot, "everything else is the job's");
    let mut full = None;
    shared.for_each_job_with_placements(10, |_, r| full = Some(r.timeline.clone()));
    assert_eq!(full.expect("visited"), hot);
}

/// The unordered scan visits every job exactly once, hot or folded, at any chunk size and any mix: folded jobs
/// are shown to `pre` once each and reach `f` only when it accepts them (checked against the ordered scan).
#[test]
fn unordered_scan_visits_every_job_once_at_any_chunk_size() {
    use crate::job::{EventKind, JobAttrs};
    use startline_proto::pb;
    let done_job = |n: u64| {
        let ev = minute_event;
        JobRecord::from_events(vec![
            ev(n * 10 + 1, 0, EventKind::Submitted(Arc::new(JobAttrs::unknown()))),
            ev(n * 10 + 2, 6, EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified }),
            ev(n * 10 + 3, 60, EventKind::Done { outcome: pb::Outcome::Succeeded, exit_code: Some(0) }),
        ])
    };
    // Mixes: all hot, all folded, alternating, runs of each, a few of one among many of the other.
    let mixes: Vec<Box<dyn Fn(u64) -> bool>> = vec![
        Box::new(|_| false),
        Box::new(|_| true),
        Box::new(|i| i % 2 == 0),
        Box::new(|i| (i / 7) % 2 == 0),
        Box::new(|i| i % 11 == 3),
        Box::new(|i| i % 11 != 3),
    ];
    for (m, folded) in mixes.iter().enumerate() {
        let mut idx = JobIndex::default();
        for i in 0..50u64 {
            let id = format!("job-{:03}", (i * 37) % 50);
            idx.jobs.insert(id.clone(), HotJob { rec: done_job(i), ..HotJob::default() });
            if folded(i) {
                assert!(idx.fold(&id, 1).is_some());
            }
        }
        let shared = SharedIndex::new(idx);
        let mut want = Vec::new();
        shared.for_each_job(1000, |k, r| want.push((k.to_string(), r.folded)));
        for chunk in [1, 2, 3, 5, 7, 49, 50, 51, 1000] {
            let mut got = Vec::new();
            let mut shown = Vec::new();
            shared.scan_unordered(
                chunk,
                false,
                |k, _| {
                    shown.push(k.to_string());
                    // Every third folded job is handled in `pre` alone.
                    shown.len() % 3 != 0
                },
                |k, r| got.push((k.to_string(), r.folded)),
            );
            let mut handled: Vec<(String, bool)> = got.clone();
            for (i, k) in shown.iter().enumerate() {
                if (i + 1) % 3 == 0 {
                    handled.push((k.clone(), true));
                }
            }
            handled.sort();
            assert_eq!(handled, want, "mix {m}, chunk {chunk}");
            let mut shown_sorted = shown.clone();
            shown_sorted.sort();
            shown_sorted.dedup();
            assert_eq!(shown_sorted.len(), shown.len(), "mix {m}, chunk {chunk}: a folded job shown twice");
            assert_eq!(shown.len(), want.iter().filter(|(_, f)| *f).count(), "mix {m}, chunk {chunk}");
        }
    }
}

mod fold_model {
    //! Folding and unfolding interleaved at random with deliveries in any order (with duplicates) and
    //! restarts: every job's timeline and every SLO count must equal the all-in-memory derivation from the
    //! same set of events.
    use super::*;
    use crate::index::labels::LabelSettings;
    use crate::job::{event_id_hash, EventKind, JobAttrs};
    use crate::slo::def::SloDef;
    use proptest::prelude::*;
    use startline_proto::pb;

    const T0: i64 = 1_767_225_600_000;
    const MIN: i64 = 60_000;

    fn attrs(urgent: bool) -> Arc<JobAttrs> {
        let mut a = JobAttrs::unknown();
        a.priority = if urgent { pb::PriorityClass::Urgent } else { pb::PriorityClass::Normal };
        a.pool_kind = pb::PoolKind::Dedicated;
        a.pool = "p".into();
        Arc::new(a)
    }

    /// The events of job `j`: a plausible lifecycle with random times, some of them optional (a container start
    /// before the first step, which is superseded when the first step's origin is stronger).
    fn job_events(j: u8) -> impl Strategy<Value = Vec<CompactEvent>> {
        (
            any::<bool>(),
            0i64..40,
            prop::option::of(0i64..40),
            prop::option::of(0i64..80),
            0u8..4,
            any::<bool>(),
            (prop::option::of(0i64..5), 0i32..4),
        )
            .prop_map(move |(urgent, q, fs, done, outcome, preempt, (container, origin))| {
                let id = |n: u32| event_id_hash(&format!("j{j}-{n}"));
                let at = |m: i64| T0 + i64::from(j) * MIN + m * MIN;
                let mut v = vec![
                    CompactEvent {
                        at_ms: at(0),
                        id_hash: id(0),
                        seq: 0,
                        attempt: None,
                        kind: EventKind::Submitted(attrs(urgent)),
                    },
                    CompactEvent {
                        at_ms: at(q),
                        id_hash: id(1),
                        seq: 0,
                        attempt: None,
                        kind: EventKind::Queued {
                            reason: pb::WaitReason::Capacity,
                            raw_reason: "Resources".into(),
                            estimated_start: None,
                        },
                    },
                ];
                if let Some(f) = fs {
                    if let Some(c) = container {
                        v.push(CompactEvent {
                            at_ms: at(q + f - c),
                            id_hash: id(5),
                            seq: 0,
                            attempt: None,
                            kind: EventKind::FirstStep { step: 0, origin: pb::StepOrigin::ContainerStart },
                        });
                    }
                    v.push(CompactEvent {
                        at_ms: at(q + f),
                        id_hash: id(2),
                        seq: 0,
                        attempt: None,
                        kind: EventKind::FirstStep {
                            step: 1,
                            origin: pb::StepOrigin::try_from(origin).unwrap_or_default(),
                        },
                    });
                    if preempt {
                        v.push(CompactEvent {
                            at_ms: at(q + f + 3),
                            id_hash: id(3),
                            seq: 0,
                            attempt: None,
                            kind: EventKind::Preempted { checkpoint_saved: false },
                        });
                    }
                }
                if let Some(d) = done {
                    let outcome =
                        [pb::Outcome::Succeeded, pb::Outcome::Failed, pb::Outcome::Cancelled, pb::Outcome::Preempted]
                            [usize::from(outcome)];
                    v.push(CompactEvent {
                        at_ms: at(q + d),
                        id_hash: id(4),
                        seq: 0,
                        attempt: None,
                        kind: EventKind::Done { outcome, exit_code: Some(1) },
                    });
                }
                v
            })
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// Deliver event `i` (modulo the count) of the whole set; delivering one twice is a duplicate.
        Deliver(usize),
        /// Fold job `j` if it is hot and ended.
        Fold(u8),
        /// Rebuild the index from its hot records and folded rows (a restart).
        Restart,
        /// Advance the clock past deadlines.
        Tick,
        /// Install SLO set `k` (a reload): the counts must equal those of an index built with it from scratch.
        ReplaceSlos(u8),
    }

    /// SLO set 0 is the built-in pair; set 1 has a tighter urgent SLO and an any-priority one that does not page.
    fn slo_set(k: u8) -> Vec<SloDef> {
        if k % 2 == 0 {
            return SloDef::defaults();
        }
        let mut tight = SloDef::defaults().remove(0);
        tight.name = "urgent-tight".into();
        tight.threshold_ms = 3 * MIN;
        let mut any = SloDef::defaults().remove(1);
        any.name = "any-start".into();
        any.selector.priority.clear();
        any.threshold_ms = 20 * MIN;
        any.exclude_cancelled = false;
        vec![any, tight]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => any::<usize>().prop_map(Op::Deliver),
            3 => (0u8..4).prop_map(Op::Fold),
            1 => Just(Op::Restart),
            1 => Just(Op::Tick),
            1 => (0u8..2).prop_map(Op::ReplaceSlos),
        ]
    }

    fn fresh(hot: BTreeMap<String, JobRecord>, cold: ColdJobs, now: i64) -> JobIndex {
        fresh_with(hot, cold, now, SloDef::defaults())
    }

    fn fresh_with(hot: BTreeMap<String, JobRecord>, cold: ColdJobs, now: i64, defs: Vec<SloDef>) -> JobIndex {
        JobIndex::new_at(hot, cold, 0, SloEngine::new(defs), LabelLimiter::new(&LabelSettings::default()), now)
    }

    /// Every job's timeline, hot or folded.
    fn timelines(idx: &JobIndex) -> BTreeMap<String, Timeline> {
        let mut out: BTreeMap<String, Timeline> =
            idx.jobs.iter().map(|(k, h)| (k.clone(), h.rec.timeline.clone())).collect();
        for (k, row) in &idx.cold.rows {
            out.insert(k.to_string(), idx.cold.timeline(row));
        }
        out
    }

    fn counts(idx: &JobIndex, now: i64) -> Vec<(u64, u64, Option<i64>)> {
        (0..idx.slo.defs().len())
            .map(|i| {
                let c = idx.slo.counts(i, now, 400 * 86_400_000);
                (c.good, c.bad, idx.slo.next_deadline())
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
        #[test]
        fn folds_and_unfolds_never_change_timelines_or_slo_counts(
            j0 in job_events(0),
            more in (job_events(1), job_events(2), job_events(3)),
            ops in prop::collection::vec(op(), 1..80),
        ) {
            let mut all: Vec<(String, CompactEvent)> = Vec::new();
            for (j, evs) in [j0, more.0, more.1, more.2].into_iter().enumerate() {
                all.extend(evs.into_iter().map(|e| (format!("j{j}"), e)));
            }
            let mut now = T0 + 10 * MIN;
            let mut idx = fresh(BTreeMap::new(), ColdJobs::default(), now);
            // The oracle: the set of delivered events per job.
            let mut delivered: BTreeMap<String, Vec<CompactEvent>> = BTreeMap::new();
            let mut seq = 0u64;
            let mut slos = 0u8;
            for op in ops {
                match op {
                    Op::Deliver(i) => {
                        let (job, ev) = &all[i % all.len()];
                        let have = delivered.entry(job.clone()).or_default();
                        if have.iter().any(|e| e.id_hash == ev.id_hash) {
                            continue; // a duplicate: the applier answers it without touching the index
                        }
                        seq += 1;
                        let mut ev = ev.clone();
                        ev.seq = seq;
                        have.push(ev.clone());
                        if let Some(summary) = idx.folded(job).map(|r| r.summary()) {
                            // The store holds exactly the events delivered before the fold.
                            let archived: Vec<CompactEvent> = have.iter().filter(|e| e.seq != seq).cloned().collect();
                            prop_assert!(idx.unfold(job, archived, now));
                            // Its summary stays in the store until the next fold replaces it.
                            prop_assert_eq!(idx.stale_summaries.get(job), Some(&vec![summary]));
                        }
                        idx.insert(job, ev, now);
                    }
                    Op::Fold(j) => {
                        let job = format!("j{j}");
                        let done = idx.jobs.get(&job).is_some_and(|h| h.rec.timeline.state == crate::job::JobState::Done);
                        let folded = idx.fold(&job, seq).is_some();
                        prop_assert_eq!(folded, done);
                        if folded {
                            prop_assert_eq!(idx.folded(&job).map(|r| r.summary()), Some(seq));
                            prop_assert!(!idx.stale_summaries.contains_key(&job));
                        }
                    }
                    Op::Restart => {
                        let hot = std::mem::take(&mut idx.jobs).into_iter().map(|(k, h)| (k, JobRecord::from_events(h.rec.events))).collect();
                        let cold = std::mem::take(&mut idx.cold);
                        idx = fresh_with(hot, cold, now, slo_set(slos));
                    }
                    Op::Tick => {
                        now += 7 * MIN;
                        idx.advance_deadlines(now);
                    }
                    Op::ReplaceSlos(k) => {
                        slos = k;
                        let generation = idx.slo_generation;
                        idx.replace_slos(slo_set(k), now);
                        prop_assert_eq!(idx.slo_generation, generation + 1);
                    }
                }
                // Against the oracle: timelines from all delivered events, and the counts of an index that never
                // folded anything.
                let want: BTreeMap<String, Timeline> = delivered
                    .iter()
                    .map(|(k, evs)| (k.clone(), JobRecord::from_events(evs.clone()).timeline))
                    .collect();
                prop_assert_eq!(&timelines(&idx), &want);
                let plain = fresh_with(
                    delivered.iter().map(|(k, evs)| (k.clone(), JobRecord::from_events(evs.clone()))).collect(),
                    ColdJobs::default(),
                    now,
                    slo_set(slos),
                );
                prop_assert_eq!(counts(&idx, now), counts(&plain, now));
                // A folded job contributes what it contributed hot.
                for (k, row) in &idx.cold.rows {
                    let t = idx.cold.timeline(row);
                    let mut a = Vec::new();
                    idx.slo.assess_into(&t, now, &mut a);
                    let mut b = Vec::new();
                    plain.slo.assess_into(&plain.jobs[&**k].rec.timeline, now, &mut b);
                    prop_assert_eq!(a, b);
                }
            }
        }
    }

    /// Folded rows share one copy of each node name (by insert and by a restart's sorted load), read back the
    /// same timelines, and the memory estimate returns to the shared names once every row is gone.
    #[test]
    fn folded_rows_share_node_names_and_a_sorted_load_reads_back_the_same() {
        let placed = |id: u64, nodes: &[&str]| {
            let names: Arc<[Arc<str>]> = nodes.iter().map(|n| Arc::<str>::from(*n)).collect();
            JobRecord::from_events(vec![
                CompactEvent {
                    at_ms: T0,
                    id_hash: id,
                    seq: id,
                    attempt: None,
                    kind: EventKind::Submitted(attrs(true)),
                },
                CompactEvent {
                    at_ms: T0 + MIN,
                    id_hash: id + 1,
                    seq: id + 1,
                    attempt: None,
                    kind: EventKind::NodeAssigned { nodes: names },
                },
                CompactEvent {
                    at_ms: T0 + 2 * MIN,
                    id_hash: id + 2,
                    seq: id + 2,
                    attempt: None,
                    kind: EventKind::NodeLost { node: "gpu-2".into() },
                },
                CompactEvent {
                    at_ms: T0 + 3 * MIN,
                    id_hash: id + 3,
                    seq: id + 3,
                    attempt: None,
                    kind: EventKind::Done { outcome: pb::Outcome::Failed, exit_code: Some(1) },
                },
            ])
        };
        let recs: Vec<(String, JobRecord)> = (0..40u64)
            .map(|i| (format!("job-{i:03}"), placed(i * 10, if i % 2 == 0 { &["gpu-1", "gpu-2"] } else { &["gpu-2"] })))
            .collect();
        let mut one_by_one = ColdJobs::default();
        let mut rows = Vec::new();
        let mut sorted = ColdJobs::default();
        for (i, (id, rec)) in recs.iter().enumerate() {
            let n = one_by_one.dict.intern(rec.timeline.attrs.as_ref().expect("attrs"));
            sorted.dict.intern(rec.timeline.attrs.as_ref().expect("attrs"));
            let row = cold::Folded::of(&rec.timeline, n).expect("done").with_summary(i as u64 + 1);
            // What a restart reads: the stored body decoded, with its own copy of every name.
            let read = cold::Folded::decode(&row.encode()).expect("decodes").with_summary(row.summary());
            rows.push((Box::<str>::from(id.as_str()), read));
            one_by_one.insert(id, row);
        }
        let packed = |c: &mut ColdJobs, rows: Vec<(Box<str>, cold::Folded)>| -> Vec<(Box<str>, cold::Row)> {
            rows.into_iter().map(|(id, f)| (id, c.pack(&f))).collect()
        };
        let for_sorted = packed(&mut sorted, rows.clone());
        assert!(sorted.load(for_sorted).is_empty(), "one summary per job: none superseded");
        let mut unsorted = ColdJobs::default();
        unsorted.dict.intern(recs[0].1.timeline.attrs.as_ref().expect("attrs"));
        // Fold order is not job order; and a job with two summaries (a failed fold's write kept) keeps the newer.
        rows.reverse();
        let older = rows[3].1.clone().with_summary(0);
        rows.insert(0, (rows[3].0.clone(), older));
        let for_unsorted = packed(&mut unsorted, rows);
        let superseded = unsorted.load(for_unsorted);
        assert_eq!(superseded, vec![(recs[36].0.clone(), 0)]);
        assert_eq!(unsorted.rows[recs[36].0.as_str()].summary(), 37);
        for cold in [&one_by_one, &sorted, &unsorted] {
            assert_eq!(cold.len(), recs.len());
            let mut first: BTreeMap<String, Arc<str>> = BTreeMap::new();
            for ((id, rec), (key, row)) in recs.iter().zip(&cold.rows) {
                assert_eq!(id.as_str(), &**key);
                let t = cold.timeline(row);
                assert_eq!(t, rec.timeline, "{id}");
                for p in &t.placements {
                    for n in p.nodes.iter().chain(p.lost_node.iter()) {
                        let shared = first.entry(n.to_string()).or_insert_with(|| n.clone());
                        assert!(Arc::ptr_eq(shared, n), "{id}: node {n} is a copy, not the shared name");
                    }
                }
            }
            assert_eq!(first.len(), 2, "two distinct nodes");
        }
        assert_eq!(sorted.bytes(), one_by_one.bytes());
        assert_eq!(unsorted.bytes(), one_by_one.bytes());
        let names_only = {
            let mut c = ColdJobs::default();
            c.insert("x", cold::Folded::of(&recs[0].1.timeline, 0).expect("done"));
            let row = c.remove("x").expect("there");
            drop(row);
            c.bytes()
        };
        for (id, _) in &recs {
            sorted.remove(id).expect("there");
        }
        assert_eq!(sorted.bytes(), names_only, "only the shared names are left");
        assert!(names_only > 0);
    }

    #[test]
    fn a_summary_survives_its_codec() {
        let events = vec![
            CompactEvent { at_ms: T0, id_hash: 1, seq: 1, attempt: None, kind: EventKind::Submitted(attrs(true)) },
            CompactEvent {
                at_ms: T0 + MIN / 2,
                id_hash: 5,
                seq: 5,
                attempt: None,
                kind: EventKind::NodeAssigned { nodes: [Arc::from("gpu-1"), Arc::from("gpu-2")].into() },
            },
            CompactEvent {
                at_ms: T0 + MIN,
                id_hash: 2,
                seq: 2,
                attempt: None,
                kind: EventKind::FirstStep { step: 5, origin: startline_proto::pb::StepOrigin::Unspecified },
            },
            CompactEvent {
                at_ms: T0 + 2 * MIN,
                id_hash: 3,
                seq: 3,
                attempt: None,
                kind: EventKind::Checkpoint { step: 9, save_ms: 4_000 },
            },
            CompactEvent {
                at_ms: T0 + 3 * MIN,
                id_hash: 4,
                seq: 4,
                attempt: None,
                kind: EventKind::Done { outcome: pb::Outcome::Failed, exit_code: Some(1) },
            },
        ];
        let rec = JobRecord::from_events(events);
        let mut cold = ColdJobs::default();
        let n = cold.dict.intern(rec.timeline.attrs.as_ref().expect("attrs"));
        let row = cold::Folded::of(&rec.timeline, n).expect("done");
        assert_eq!((rec.timeline.checkpoint_save_ms, rec.timeline.failed_work_ms), (4_000, MIN));
        let back = cold::Folded::decode(&row.encode()).expect("decodes");
        assert_eq!(back, row);
        // Kept in memory packed, it unpacks to the same row and fills in the same timeline.
        cold.insert("j", back.clone());
        assert_eq!(cold.unpack(&cold.rows["j"]), back);
        assert_eq!(cold.timeline(&cold.rows["j"]), rec.timeline);
        assert_eq!(back.placements_len(), 1);
        // A format this build does not know (earlier ones included), and garbage, are refused with a reason.
        for format in [1, 2, 9] {
            let mut bad = row.encode();
            bad[0] = format;
            assert!(cold::Folded::decode(&bad).expect_err("unknown format").contains("format"), "format {format}");
        }
        assert!(cold::Folded::decode(&[3, 0xff]).is_err());
        // The dictionary round-trips through its stored entries.
        let d = cold::Dictionary::load(cold.dict.unpersisted()).expect("loads");
        assert_eq!(d.get(n), cold.dict.get(n));
    }
}

#[test]
fn sources_replaying_a_backlog_are_told_from_live_ones() {
    const NOW: i64 = 1_767_225_600_000;
    let mut m = SourceMarks::default();
    // A live node agent: events as they happen.
    m.note(1, NOW - 200, NOW);
    assert!(!m.catching_up(1, NOW + 100));
    // An adapter's poll reporting five minutes of transitions at once, the newest recent: live (small slack).
    m.note(2, NOW - 50_000, NOW);
    m.note(2, NOW - 1_000, NOW);
    assert!(!m.catching_up(2, NOW + 100));
    // A spool draining: events hours old, batches back to back.
    for i in 0..10 {
        m.note(3, NOW - 3_600_000 + i * 300_000, NOW + i * 100);
        assert!(m.catching_up(3, NOW + i * 100 + 50), "batch {i}");
    }
    // ...right up to the present: still a replay while it sends (an hour of events in a second)...
    m.note(3, NOW + 900, NOW + 1_000);
    assert!(m.catching_up(3, NOW + 1_100));
    // ...until it goes quiet.
    assert!(!m.catching_up(3, NOW + 1_000 + SourceMarks::QUIET_MS));
    // A later live burst of the same source is live again.
    m.note(3, NOW + 60_000, NOW + 60_000);
    assert!(!m.catching_up(3, NOW + 60_100));
    // Unknown sources (events replayed from the store after a restart) are live.
    assert!(!m.catching_up(99, NOW));
}
