//! Table and property tests of the job state machine.

use super::*;
use proptest::prelude::*;
use startline_proto::pb;
use std::sync::Arc;

const T0: i64 = 1_767_225_600_000;
const S: i64 = 1000;

fn attrs(gpus: u32) -> JobAttrs {
    JobAttrs {
        pool_kind: pb::PoolKind::Dedicated,
        provider: "slurm".into(),
        pool: "a100".into(),
        priority: pb::PriorityClass::Normal,
        gpu_class: "a100".into(),
        gpu_count: gpus,
        node_count: 1,
        region: "r1".into(),
        team: "t".into(),
        project: "p".into(),
        chain_id: String::new(),
        chain_stage: String::new(),
        labels: Default::default(),
    }
}

fn e(id: &str, at: i64, kind: EventKind) -> CompactEvent {
    CompactEvent { at_ms: at, id_hash: event_id_hash(id), seq: 0, attempt: None, kind }
}

fn sub(at: i64) -> CompactEvent {
    e("sub", at, EventKind::Submitted(std::sync::Arc::new(attrs(8))))
}

fn queued(id: &str, at: i64, reason: pb::WaitReason) -> CompactEvent {
    e(id, at, EventKind::Queued { reason, raw_reason: format!("raw-{id}").into(), estimated_start: None })
}

fn record(events: Vec<CompactEvent>) -> JobRecord {
    let mut r = JobRecord::default();
    for ev in events {
        r.insert(ev);
    }
    r
}

#[test]
fn splits_the_wait_before_the_first_step_into_segments() {
    let r = record(vec![
        sub(T0),
        queued("q", T0 + 10 * S, pb::WaitReason::Capacity),
        e("na", T0 + 60 * S, EventKind::NodeAssigned { nodes: [Arc::from("n1")].into() }),
        e("p1", T0 + 70 * S, EventKind::Preparing { phase: pb::PreparingPhase::ImagePull }),
        e("p2", T0 + 100 * S, EventKind::Preparing { phase: pb::PreparingPhase::DataStaging }),
        e("fs", T0 + 130 * S, EventKind::FirstStep { step: 1, origin: pb::StepOrigin::Unspecified }),
        e("ck", T0 + 1000 * S, EventKind::Checkpoint { step: 500, save_ms: 0 }),
        e("done", T0 + 2000 * S, EventKind::Done { outcome: pb::Outcome::Succeeded, exit_code: Some(0) }),
    ]);
    let t = &r.timeline;
    assert_eq!(t.state, JobState::Done);
    assert_eq!(t.time_to_first_step_ms(), Some(130 * S));
    let w: Vec<(String, i64)> = t.initial_wait_ms.iter().map(|(s, v)| (s.label(), *v)).collect();
    assert_eq!(
        w,
        vec![
            ("unreported".to_string(), 10 * S),
            ("queued:capacity".to_string(), 50 * S),
            ("assigned".to_string(), 10 * S),
            ("preparing:image_pull".to_string(), 30 * S),
            ("preparing:data_staging".to_string(), 30 * S),
        ]
    );
    assert_eq!(t.last_checkpoint, Some((T0 + 1000 * S, 500)));
    assert_eq!(t.outcome, Some(pb::Outcome::Succeeded));
    assert_eq!((t.runs, t.attempts, t.preemptions, t.lost_work_ms), (1, 1, 0, 0));
}

#[test]
fn preemption_without_checkpoint_loses_work_since_last_checkpoint() {
    let r = record(vec![
        sub(T0),
        e("fs", T0 + 100 * S, EventKind::FirstStep { step: 1, origin: pb::StepOrigin::Unspecified }),
        e("ck", T0 + 1000 * S, EventKind::Checkpoint { step: 900, save_ms: 0 }),
        e("pre", T0 + 1600 * S, EventKind::Preempted { checkpoint_saved: false }),
        e("rq", T0 + 1601 * S, EventKind::Requeued { resume_step: 900 }),
        queued("q2", T0 + 1602 * S, pb::WaitReason::Capacity),
        e("fs2", T0 + 2000 * S, EventKind::FirstStep { step: 901, origin: pb::StepOrigin::Unspecified }),
    ]);
    let t = &r.timeline;
    assert_eq!(t.state, JobState::Running);
    assert_eq!(t.lost_work_ms, 600 * S);
    assert!((t.lost_gpu_seconds() - 600.0 * 8.0).abs() < 1e-9);
    assert_eq!(t.requeue_wait_ms, 400 * S);
    assert_eq!((t.runs, t.attempts, t.preemptions), (2, 2, 1));
    assert_eq!(t.first_step_at, Some(T0 + 100 * S), "the first step is the first run's");
    assert_eq!(t.time_to_first_step_ms(), Some(100 * S));
}

#[test]
fn a_restart_from_an_older_checkpoint_loses_the_training_since_that_one() {
    // Checkpoints at steps 1000 (t=100 s) and 2000 (t=300 s); the step-2000 copy is corrupt, so the restart at
    // t=400 s resumes from step 1000: 300 s of training and 1000 steps are lost, not the 100 s since the last.
    let base = vec![
        sub(T0),
        e("fs", T0 + 10 * S, EventKind::FirstStep { step: 1, origin: pb::StepOrigin::Unspecified }),
        e("c1", T0 + 100 * S, EventKind::Checkpoint { step: 1000, save_ms: 0 }),
        e("c2", T0 + 300 * S, EventKind::Checkpoint { step: 2000, save_ms: 0 }),
    ];
    let with = |resume_step| {
        let mut v = base.clone();
        v.push(e("rs", T0 + 400 * S, EventKind::Restarted { resume_step }));
        record(v).timeline
    };
    let older = with(1000);
    assert_eq!((older.lost_work_ms, older.lost_steps), (300 * S, 1000));
    let newest = with(2000);
    assert_eq!((newest.lost_work_ms, newest.lost_steps), (100 * S, 0));
    // Between two checkpoints: resumed from the older one (step 1000 <= 1500 < 2000).
    assert_eq!(with(1500).lost_work_ms, 300 * S);
    // Older than every checkpoint of this run (scratch, or a previous run's): the whole run is lost.
    let scratch = with(0);
    assert_eq!((scratch.lost_work_ms, scratch.lost_steps), (390 * S, 2000));
}

#[test]
fn preemption_with_checkpoint_saved_loses_nothing_and_resume_from_scratch_loses_steps() {
    let saved = record(vec![
        sub(T0),
        e("fs", T0 + 10 * S, EventKind::FirstStep { step: 1, origin: pb::StepOrigin::Unspecified }),
        e("pre", T0 + 500 * S, EventKind::Preempted { checkpoint_saved: true }),
    ]);
    assert_eq!(saved.timeline.lost_work_ms, 0);
    assert_eq!(saved.timeline.state, JobState::Queued);
    assert_eq!(saved.timeline.current_wait.map(|w| w.0), Some(Segment::Queued(pb::WaitReason::PreemptionRecovery)));

    let lost = record(vec![
        sub(T0),
        e("fs", T0 + 10 * S, EventKind::FirstStep { step: 1, origin: pb::StepOrigin::Unspecified }),
        e("ck", T0 + 100 * S, EventKind::Checkpoint { step: 4000, save_ms: 0 }),
        e("nl", T0 + 500 * S, EventKind::NodeLost { node: Arc::from("n1") }),
        e("rs", T0 + 510 * S, EventKind::Restarted { resume_step: 0 }),
    ]);
    assert_eq!(lost.timeline.lost_work_ms, 400 * S);
    assert_eq!(lost.timeline.lost_steps, 4000);
    assert_eq!(lost.timeline.node_losses, 1);
}

#[test]
fn events_before_submitted_are_kept_and_applied_when_it_arrives() {
    let mut r = record(vec![
        queued("q", T0 + 5 * S, pb::WaitReason::Quota),
        e("fs", T0 + 60 * S, EventKind::FirstStep { step: 1, origin: pb::StepOrigin::Unspecified }),
    ]);
    assert_eq!(r.timeline.state, JobState::Unsubmitted);
    assert_eq!(r.timeline.time_to_first_step_ms(), None);
    r.insert(sub(T0));
    assert_eq!(r.timeline.state, JobState::Running);
    assert_eq!(r.timeline.time_to_first_step_ms(), Some(60 * S));
    assert_eq!(r.timeline.initial_wait_ms.get(&Segment::Queued(pb::WaitReason::Quota)), Some(&(55 * S)));
}

#[test]
fn done_absorbs_later_events() {
    let mut r = record(vec![
        sub(T0),
        e("d", T0 + 100 * S, EventKind::Done { outcome: pb::Outcome::Cancelled, exit_code: None }),
    ]);
    let before = r.timeline.clone();
    r.insert(e("fs", T0 + 200 * S, EventKind::FirstStep { step: 1, origin: pb::StepOrigin::Unspecified }));
    r.insert(queued("q", T0 + 300 * S, pb::WaitReason::Capacity));
    assert_eq!(r.timeline.state, JobState::Done);
    assert_eq!(r.timeline.first_step_at, None);
    assert_eq!(r.timeline.ignored_after_done, 2);
    assert_eq!(Timeline { ignored_after_done: 0, ..r.timeline.clone() }, before);
    // A job cancelled while waiting: the whole wait is accounted for.
    assert_eq!(r.timeline.initial_wait_ms.values().sum::<i64>(), 100 * S);
}

#[test]
fn events_stamped_before_submit_count_from_submit() {
    let r = record(vec![
        sub(T0),
        queued("q", T0 - 3 * S, pb::WaitReason::Priority),
        e("fs", T0 + 9 * S, EventKind::FirstStep { step: 1, origin: pb::StepOrigin::Unspecified }),
    ]);
    assert_eq!(r.timeline.first_queued_at, Some(T0));
    assert_eq!(r.timeline.initial_wait_ms.get(&Segment::Queued(pb::WaitReason::Priority)), Some(&(9 * S)));
    assert_eq!(r.timeline.initial_wait_ms.get(&Segment::Unreported), Some(&0));
}

#[test]
fn checkpoints_in_the_same_millisecond_keep_the_highest_step() {
    // Whatever their id hashes, two checkpoints stamped in one millisecond leave the higher step as the last.
    for (a, b) in [("c1", "c2"), ("c2", "c1"), ("x", "y"), ("y", "x")] {
        let r = record(vec![
            sub(T0),
            e("fs", T0 + S, EventKind::FirstStep { step: 1, origin: pb::StepOrigin::Unspecified }),
            e(a, T0 + 5 * S, EventKind::Checkpoint { step: 200, save_ms: 0 }),
            e(b, T0 + 5 * S, EventKind::Checkpoint { step: 300, save_ms: 0 }),
        ]);
        assert_eq!(r.timeline.last_checkpoint, Some((T0 + 5 * S, 300)), "{a} {b}");
    }
}

#[test]
fn duplicate_ids_are_detected_by_hash() {
    let mut r = record(vec![sub(T0)]);
    assert_eq!(r.insert(sub(T0)), InsertOutcome::SameHash { existing_seq: 0 });
    assert_eq!(r.events.len(), 1);
}

#[test]
fn long_records_index_colliding_hashes_and_keep_every_event() {
    // Distinct events whose id hashes collide are all kept and all found, with and without the index.
    let mut r = JobRecord::from_events(vec![sub(T0)]);
    for i in 0..40u64 {
        let mut ev = e(&format!("c{i}"), T0 + i as i64 * S, EventKind::Checkpoint { step: i, save_ms: 0 });
        ev.seq = 100 + i;
        if i % 10 == 0 {
            ev.id_hash = 42;
        }
        r.insert_unchecked(ev);
        let mut found: Vec<u64> = r.seqs_of_hash(42).collect();
        found.sort_unstable();
        let expected: Vec<u64> = (0..=i).filter(|j| j % 10 == 0).map(|j| 100 + j).collect();
        assert_eq!(found, expected, "after {i}");
        assert_eq!(r.seq_of_hash(event_id_hash(&format!("c{i}"))).is_some(), i % 10 != 0);
    }
    assert_eq!(r.seq_of_hash(7), None);
    assert_eq!(r.timeline, Timeline::derive(&r.events));
}

#[test]
fn a_record_with_events_set_directly_refolds_on_the_next_insert() {
    // As after deserializing: the events are there, the caches are not.
    let full = record(vec![
        sub(T0),
        e("fs", T0 + 10 * S, EventKind::FirstStep { step: 1, origin: pb::StepOrigin::Unspecified }),
        e("pre", T0 + 500 * S, EventKind::Preempted { checkpoint_saved: false }),
    ]);
    let mut r = JobRecord::default();
    r.events.clone_from(&full.events);
    assert_eq!(r.seq_of_hash(event_id_hash("fs")), Some(0));
    r.insert(e("fs2", T0 + 600 * S, EventKind::FirstStep { step: 2, origin: pb::StepOrigin::Unspecified }));
    assert_eq!(r.timeline, Timeline::derive(&r.events));
    assert_eq!((r.timeline.state, r.timeline.runs), (JobState::Running, 2));
    // Equality ignores the caches.
    let again = JobRecord::from_events(r.events.clone());
    assert_eq!(again, r);
}

// ---- first-step origins ----

fn fs(id: &str, at: i64, step: u64, origin: pb::StepOrigin) -> CompactEvent {
    e(id, at, EventKind::FirstStep { step, origin })
}

/// Every insertion order of `events` (all permutations: keep them few) gives the timeline of the canonical
/// derive, checked after each insert; returns that timeline.
fn same_in_every_order(events: &[CompactEvent]) -> Timeline {
    fn permute(prefix: &mut Vec<CompactEvent>, rest: &mut Vec<CompactEvent>, each: &mut dyn FnMut(&[CompactEvent])) {
        if rest.is_empty() {
            each(prefix);
            return;
        }
        for i in 0..rest.len() {
            let ev = rest.remove(i);
            prefix.push(ev);
            permute(prefix, rest, each);
            let ev = prefix.pop().expect("pushed");
            rest.insert(i, ev);
        }
    }
    let want = JobRecord::from_events(events.to_vec()).timeline;
    permute(&mut Vec::new(), &mut events.to_vec(), &mut |order| {
        let mut r = JobRecord::default();
        for ev in order {
            r.insert(ev.clone());
            assert_eq!(r.timeline, Timeline::derive(&r.events), "incremental after {:?}", ev.kind.name());
        }
        assert_eq!(r.timeline, want, "order {:?}", order.iter().map(|e| e.at_ms - T0).collect::<Vec<_>>());
    });
    want
}

/// The managed-endpoint case: the adapter sees the container start, the training process reports its first step
/// five minutes later. Figures by hand: submitted at 0, capacity wait 0..120 s, provisioning 120..200 s,
/// container start at 200 s, first step at 500 s.
#[test]
fn a_container_start_followed_by_the_training_process_first_step_is_preparing_until_it() {
    let events = vec![
        sub(T0),
        queued("q", T0, pb::WaitReason::Capacity),
        e("p", T0 + 120 * S, EventKind::Preparing { phase: pb::PreparingPhase::Provisioning }),
        fs("container", T0 + 200 * S, 0, pb::StepOrigin::ContainerStart),
        fs("trainer", T0 + 500 * S, 1, pb::StepOrigin::TrainingProcess),
    ];
    let t = same_in_every_order(&events);
    assert_eq!(t.state, JobState::Running);
    assert_eq!(t.first_step_at, Some(T0 + 500 * S));
    assert_eq!(t.time_to_first_step_ms(), Some(500 * S));
    assert_eq!(t.first_step_origin, Some(pb::StepOrigin::TrainingProcess));
    assert_eq!(t.runs, 1, "one run: the container start is not a second first step");
    assert_eq!(t.preparing_at, Some(T0 + 120 * S));
    let w: Vec<(String, i64)> = t.initial_wait_ms.iter().map(|(s, v)| (s.label(), *v)).collect();
    assert_eq!(
        w,
        vec![
            ("unreported".to_string(), 0),
            ("queued:capacity".to_string(), 120 * S),
            ("preparing:provisioning".to_string(), 80 * S),
            ("preparing:environment".to_string(), 300 * S),
        ]
    );

    // Before the training process reports, the container start is the first step, marked as such; between the
    // two the job is running by the container start.
    let early = JobRecord::from_events(events[..4].to_vec()).timeline;
    assert_eq!(early.state, JobState::Running);
    assert_eq!(early.time_to_first_step_ms(), Some(200 * S));
    assert_eq!(early.first_step_origin, Some(pb::StepOrigin::ContainerStart));

    // Without the container start: the same first step, the environment phase left out.
    let direct =
        JobRecord::from_events(vec![events[0].clone(), events[1].clone(), events[2].clone(), events[4].clone()]);
    assert_eq!(direct.timeline.first_step_at, t.first_step_at);
    assert_eq!(
        direct.timeline.initial_wait_ms.get(&Segment::Preparing(pb::PreparingPhase::Provisioning)),
        Some(&(380 * S))
    );
}

#[test]
fn first_step_origins_combine_by_strength_within_a_run() {
    use pb::StepOrigin::*;
    // (origins of the first steps at 100 s, 200 s and 300 s; expected first step time (s) and origin)
    let table: &[(&[pb::StepOrigin], i64, pb::StepOrigin)] = &[
        (&[ContainerStart], 100, ContainerStart),
        (&[SchedulerStart], 100, SchedulerStart),
        (&[Unspecified], 100, Unspecified),
        (&[TrainingProcess], 100, TrainingProcess),
        // A stronger origin later in the run supersedes.
        (&[ContainerStart, TrainingProcess], 200, TrainingProcess),
        (&[SchedulerStart, TrainingProcess], 200, TrainingProcess),
        (&[Unspecified, TrainingProcess], 200, TrainingProcess),
        (&[ContainerStart, Unspecified], 200, Unspecified),
        (&[ContainerStart, Unspecified, TrainingProcess], 300, TrainingProcess),
        // An equal or weaker origin later changes nothing: the earlier one started the run.
        (&[ContainerStart, SchedulerStart], 100, ContainerStart),
        (&[Unspecified, Unspecified], 100, Unspecified),
        (&[TrainingProcess, ContainerStart], 100, TrainingProcess),
        (&[TrainingProcess, Unspecified, ContainerStart], 100, TrainingProcess),
        (&[Unspecified, ContainerStart], 100, Unspecified),
        // A training-process step stamped before the container start (skewed clocks): it stands.
        (&[TrainingProcess, ContainerStart, TrainingProcess], 100, TrainingProcess),
    ];
    for &(origins, first_s, origin) in table {
        let mut events = vec![sub(T0)];
        for (i, o) in origins.iter().enumerate() {
            events.push(fs(&format!("f{i}"), T0 + (i as i64 + 1) * 100 * S, i as u64, *o));
        }
        let t = same_in_every_order(&events);
        assert_eq!(t.first_step_at, Some(T0 + first_s * S), "{origins:?}");
        assert_eq!(t.first_step_origin, Some(origin), "{origins:?}");
        assert_eq!(t.runs, 1, "{origins:?}");
        let environment = t.initial_wait_ms.get(&Segment::Preparing(pb::PreparingPhase::Environment)).copied();
        let superseded = first_s > 100;
        assert_eq!(environment, superseded.then_some((first_s - 100) * S), "{origins:?}");
    }
}

/// A run boundary between a container start and a training-process step keeps them in different runs: a spot
/// interruption before the trainer's first step leaves the first run started by the container.
#[test]
fn a_run_boundary_keeps_a_container_start_from_being_superseded() {
    let events = vec![
        sub(T0),
        fs("c1", T0 + 100 * S, 0, pb::StepOrigin::ContainerStart),
        e("x", T0 + 400 * S, EventKind::Preempted { checkpoint_saved: false }),
        e("rq", T0 + 410 * S, EventKind::Requeued { resume_step: 0 }),
        fs("c2", T0 + 600 * S, 0, pb::StepOrigin::ContainerStart),
        fs("t2", T0 + 900 * S, 1, pb::StepOrigin::TrainingProcess),
    ];
    let t = same_in_every_order(&events);
    assert_eq!(t.first_step_at, Some(T0 + 100 * S));
    assert_eq!(t.first_step_origin, Some(pb::StepOrigin::ContainerStart));
    assert_eq!(t.runs, 2);
    assert_eq!(t.lost_work_ms, 300 * S, "run 1, by the container start, until the interruption");
    // The requeue wait lasts from the interruption to the trainer's step of run 2 (the second container start is
    // preparing inside it).
    assert_eq!(t.requeue_wait_ms, 500 * S);
    assert_eq!(t.placements.len(), 0);
    assert_eq!(t.state, JobState::Running);
}

/// Snapshot parts written before origins existed hold `FirstStep { step }` as postcard variant 4: they read back
/// as unspecified, and an unspecified first step is still written that way; other origins round-trip.
#[test]
fn first_steps_are_stored_compatibly_with_parts_written_before_origins() {
    #[derive(serde::Serialize)]
    enum Old {
        _Submitted,
        _Queued,
        _NodeAssigned,
        _Preparing,
        FirstStep { step: u64 },
    }
    let old = postcard::to_stdvec(&(Some(3u32), Old::FirstStep { step: 77 })).expect("encode");
    let (attempt, kind): (Option<u32>, EventKind) = postcard::from_bytes(&old).expect("decode");
    assert_eq!((attempt, &kind), (Some(3), &EventKind::FirstStep { step: 77, origin: pb::StepOrigin::Unspecified }));
    assert_eq!(postcard::to_stdvec(&(Some(3u32), &kind)).expect("encode"), old);
    for origin in [pb::StepOrigin::TrainingProcess, pb::StepOrigin::ContainerStart, pb::StepOrigin::SchedulerStart] {
        let k = EventKind::FirstStep { step: 5, origin };
        let bytes = postcard::to_stdvec(&k).expect("encode");
        assert_eq!(bytes[0], 11, "written as the variant after every older one");
        assert_eq!(postcard::from_bytes::<EventKind>(&bytes).expect("decode"), k);
    }
    // Every other kind is written as before (its variant index and fields).
    let done = EventKind::Done { outcome: pb::Outcome::Failed, exit_code: Some(2) };
    assert_eq!(postcard::to_stdvec(&done).expect("encode")[0], 10);
    assert_eq!(postcard::from_bytes::<EventKind>(&postcard::to_stdvec(&done).expect("encode")).expect("decode"), done);
}

// ---- properties ----

fn arb_kind() -> impl Strategy<Value = EventKind> {
    prop_oneof![
        (1i32..=10, prop::option::of(0i64..100_000)).prop_map(|(r, est)| EventKind::Queued {
            reason: pb::WaitReason::try_from(r).unwrap_or(pb::WaitReason::Unknown),
            raw_reason: "".into(),
            estimated_start: est.map(|e| T0 + e)
        }),
        Just(EventKind::NodeAssigned { nodes: [Arc::from("n1")].into() }),
        (1i32..=5).prop_map(|p| EventKind::Preparing {
            phase: pb::PreparingPhase::try_from(p).unwrap_or(pb::PreparingPhase::Other)
        }),
        (0u64..10, 0i32..4).prop_map(|(step, o)| EventKind::FirstStep {
            step,
            origin: pb::StepOrigin::try_from(o).unwrap_or_default()
        }),
        (0u64..10_000, 0u32..600_000).prop_map(|(step, save_ms)| EventKind::Checkpoint { step, save_ms }),
        any::<bool>().prop_map(|checkpoint_saved| EventKind::Preempted { checkpoint_saved }),
        (0u64..5000).prop_map(|resume_step| EventKind::Requeued { resume_step }),
        (0u64..5000).prop_map(|resume_step| EventKind::Restarted { resume_step }),
        Just(EventKind::NodeLost { node: Arc::from("n1") }),
        (1i32..=5).prop_map(|o| EventKind::Done {
            outcome: pb::Outcome::try_from(o).unwrap_or(pb::Outcome::Failed),
            exit_code: None
        }),
    ]
}

/// A job's event set: a submitted plus up to 20 other events, at times within a day around the submit (some
/// stamped before it, as skewed clocks do), with unique ids.
fn arb_events() -> impl Strategy<Value = Vec<CompactEvent>> {
    (any::<bool>(), proptest::collection::vec((-600i64..86_400, arb_kind()), 0..20)).prop_map(|(with_sub, evs)| {
        let mut out: Vec<CompactEvent> =
            evs.into_iter().enumerate().map(|(i, (off, kind))| e(&format!("ev{i}"), T0 + off * S, kind)).collect();
        if with_sub {
            out.push(sub(T0));
        }
        out
    })
}

/// A richer event set for comparing incremental insertion with a full derive: several `submitted` (the first
/// one by canonical order wins), reported attempts, raw reasons that differ, many events in the same
/// millisecond, and up to 120 events (so long records keep an index and several fold marks in these tests).
fn arb_rich_events() -> impl Strategy<Value = Vec<CompactEvent>> {
    let one = (
        -20i64..400,
        prop_oneof![9 => arb_kind().prop_map(Some), 1 => Just(None)],
        proptest::option::of(1u32..6),
        0u8..4,
    );
    proptest::collection::vec(one, 0..120).prop_map(|evs| {
        evs.into_iter()
            .enumerate()
            .map(|(i, (off, kind, attempt, raw))| {
                let kind = match kind {
                    Some(EventKind::Queued { reason, .. }) => {
                        EventKind::Queued { reason, raw_reason: format!("raw{raw}").into(), estimated_start: None }
                    }
                    Some(k) => k,
                    None => EventKind::Submitted(std::sync::Arc::new(attrs(u32::from(raw) + 1))),
                };
                CompactEvent { attempt, ..e(&format!("r{i}"), T0 + off * S / 10, kind) }
            })
            .collect()
    })
}

/// Inserts `order`'s events one by one (a repeat is offered again and must be refused), checking after every
/// step that the record's timeline is exactly the full derive over its events and that the id index answers
/// like a scan.
fn insert_checking_every_step(order: &[CompactEvent]) -> Result<JobRecord, TestCaseError> {
    let mut r = JobRecord::default();
    for (step, ev) in order.iter().enumerate() {
        let outcome = r.insert(ev.clone());
        prop_assert_eq!(&r.timeline, &Timeline::derive(&r.events), "step {}", step);
        prop_assert!(r.events.windows(2).all(|w| w[0].sort_key() <= w[1].sort_key()), "step {}: order", step);
        let mut indexed: Vec<u64> = r.seqs_of_hash(ev.id_hash).collect();
        indexed.sort_unstable();
        let mut scanned: Vec<u64> = r.events.iter().filter(|x| x.id_hash == ev.id_hash).map(|x| x.seq).collect();
        scanned.sort_unstable();
        prop_assert_eq!(indexed, scanned, "step {}", step);
        if let InsertOutcome::SameHash { existing_seq } = outcome {
            prop_assert_eq!(existing_seq, ev.seq);
        }
    }
    Ok(r)
}

/// Gives each event a distinct log sequence (as the committer does).
fn with_seqs(mut events: Vec<CompactEvent>) -> Vec<CompactEvent> {
    for (i, ev) in events.iter_mut().enumerate() {
        ev.seq = i as u64 + 1;
    }
    events
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn timeline_ignores_arrival_order_and_duplicates(
        events in arb_events(),
        order in proptest::collection::vec(any::<prop::sample::Index>(), 0..60),
    ) {
        let canonical = JobRecord::from_events(events.clone());
        // Deliver in a scrambled order with repeats: each index picks an event (possibly again), then every
        // event once more so the set is complete.
        let mut delivered = JobRecord::default();
        for ix in &order {
            if !events.is_empty() {
                delivered.insert(events[ix.index(events.len())].clone());
            }
        }
        for ev in events.iter().rev() {
            delivered.insert(ev.clone());
        }
        prop_assert_eq!(&delivered.timeline, &canonical.timeline);
        prop_assert_eq!(&delivered.events, &canonical.events);
    }

    #[test]
    fn incremental_insertion_equals_full_derive_at_every_step(
        events in arb_rich_events().prop_map(with_seqs),
        order in proptest::collection::vec(any::<prop::sample::Index>(), 0..200),
    ) {
        // Random order with repeats, then every event once more so the set is complete.
        let mut delivered: Vec<CompactEvent> = Vec::new();
        if !events.is_empty() {
            delivered.extend(order.iter().map(|ix| events[ix.index(events.len())].clone()));
        }
        delivered.extend(events.iter().rev().cloned());
        let r = insert_checking_every_step(&delivered)?;
        let canonical = JobRecord::from_events(events);
        prop_assert_eq!(&r.timeline, &canonical.timeline);
        prop_assert_eq!(&r.events, &canonical.events);
    }

    #[test]
    fn mostly_in_order_insertion_equals_full_derive_at_every_step(
        events in arb_rich_events().prop_map(with_seqs),
        late in proptest::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 0..8),
        repeats in proptest::collection::vec(any::<prop::sample::Index>(), 0..10),
    ) {
        // The common case: events arrive in canonical order (each applied without refolding), with a few moved
        // later than where they belong (late events refold from a mark) and a few delivered twice.
        let mut order = JobRecord::from_events(events.clone()).events;
        if !order.is_empty() {
            for (from, to) in &late {
                let ev = order.remove(from.index(order.len()));
                let to = to.index(order.len() + 1);
                order.insert(to, ev);
            }
            for ix in &repeats {
                let ev = order[ix.index(order.len())].clone();
                let at = (ix.index(order.len()) + 3).min(order.len());
                order.insert(at, ev);
            }
        }
        let r = insert_checking_every_step(&order)?;
        prop_assert_eq!(&r.timeline, &JobRecord::from_events(events).timeline);
    }

    /// The managed-endpoint case under any arrival order: waits before the container start, the container start
    /// at `c`, the training process's first step `d` later, checkpoints after it, all delivered in a random order
    /// (the trainer's step before or after the container start, repeats included). The timeline is the same as
    /// the canonical one at every step, and its figures are the hand-computable ones: the first step is the
    /// trainer's, one run, the time between the two is `preparing:environment`.
    #[test]
    fn a_trainer_first_step_supersedes_the_container_start_in_any_arrival_order(
        before in proptest::collection::vec((0i64..600, 0usize..3), 0..6),
        c in 600i64..1200,
        d in 0i64..900,
        checkpoints in proptest::collection::vec(1i64..3600, 0..6),
        order in proptest::collection::vec(any::<prop::sample::Index>(), 0..30),
        trainer_first in any::<bool>(),
    ) {
        let mut events = vec![sub(T0)];
        for (i, (off, k)) in before.iter().enumerate() {
            let kind = match k {
                0 => EventKind::Queued { reason: pb::WaitReason::Capacity, raw_reason: "".into(), estimated_start: None },
                1 => EventKind::NodeAssigned { nodes: [Arc::from("n1")].into() },
                _ => EventKind::Preparing { phase: pb::PreparingPhase::ImagePull },
            };
            events.push(e(&format!("b{i}"), T0 + off * S, kind));
        }
        let container = fs("container", T0 + c * S, 0, pb::StepOrigin::ContainerStart);
        let trainer = fs("trainer", T0 + (c + d) * S, 1, pb::StepOrigin::TrainingProcess);
        for (i, off) in checkpoints.iter().enumerate() {
            events.push(e(&format!("ck{i}"), T0 + (c + d + off) * S, EventKind::Checkpoint { step: 100 * (i as u64 + 1), save_ms: 0 }));
        }
        let with_seq = with_seqs(events.iter().cloned().chain([container.clone(), trainer.clone()]).collect());
        let canonical = JobRecord::from_events(with_seq.clone()).timeline;
        // Delivery: random picks (repeats), then the two first steps in the chosen order, then everything.
        let mut delivered: Vec<CompactEvent> = order.iter().map(|ix| with_seq[ix.index(with_seq.len())].clone()).collect();
        let (cs, tp) = (with_seq[with_seq.len() - 2].clone(), with_seq[with_seq.len() - 1].clone());
        if trainer_first { delivered.extend([tp, cs]) } else { delivered.extend([cs, tp]) }
        delivered.extend(with_seq.iter().rev().cloned());
        let r = insert_checking_every_step(&delivered)?;
        prop_assert_eq!(&r.timeline, &canonical);
        let t = &canonical;
        prop_assert_eq!(t.first_step_at, Some(T0 + (c + d) * S));
        prop_assert_eq!(t.time_to_first_step_ms(), Some((c + d) * S));
        prop_assert_eq!(t.first_step_origin, Some(pb::StepOrigin::TrainingProcess));
        prop_assert_eq!(t.runs, 1);
        prop_assert_eq!(t.state, JobState::Running);
        // The container start opened preparing:environment, unless a tie at the same millisecond sorted the
        // trainer's step first (then the container start came while running and there is no such segment).
        let env = t.initial_wait_ms.get(&Segment::Preparing(pb::PreparingPhase::Environment)).copied();
        prop_assert!(env == Some(d * S) || (d == 0 && env.is_none()), "{:?}", env);
        prop_assert_eq!(t.initial_wait_ms.values().sum::<i64>(), (c + d) * S);
    }

    #[test]
    fn initial_wait_segments_add_up(events in arb_events()) {
        let t = JobRecord::from_events(events).timeline;
        let total: i64 = t.initial_wait_ms.values().sum();
        prop_assert!(t.initial_wait_ms.values().all(|v| *v >= 0));
        match (t.submitted_at, t.first_step_at, t.done_at) {
            (Some(s), Some(f), _) => prop_assert_eq!(total, f - s),
            (Some(s), None, Some(d)) => prop_assert_eq!(total, d - s),
            (Some(s), None, None) => {
                // Still waiting: closed segments plus the open one reach from submit to the open one's start.
                let (_, since) = t.current_wait.expect("a waiting job has an open segment");
                prop_assert_eq!(s + total, since);
            }
            (None, _, _) => prop_assert_eq!(total, 0),
        }
        prop_assert!(t.lost_work_ms >= 0 && t.requeue_wait_ms >= 0);
    }

    #[test]
    fn placements_open_and_end_with_the_runs(events in arb_events()) {
        // Oracle: walk the events in canonical order, counting assignments that open a placement.
        let mut sorted = events.clone();
        sorted.sort_by_key(|e| e.sort_key());
        let t = JobRecord::from_events(events).timeline;
        let Some(submitted) = t.submitted_at else { return Ok(()) };
        let (mut count, mut open, mut lost_named) = (0usize, false, 0usize);
        for ev in &sorted {
            match &ev.kind {
                EventKind::NodeAssigned { nodes } if !open && !nodes.is_empty() => (count, open) = (count + 1, true),
                EventKind::Restarted { .. } if open => count += 1,
                EventKind::NodeLost { node } => {
                    if open && !node.is_empty() {
                        lost_named += 1;
                    }
                    open = false;
                }
                EventKind::Queued { .. } | EventKind::Preempted { .. } | EventKind::Requeued { .. } => open = false,
                EventKind::Done { .. } => {
                    open = false;
                    break;
                }
                _ => {}
            }
        }
        prop_assert_eq!(t.placements.len(), count);
        prop_assert_eq!(t.placements.last().is_some_and(|p| p.end == PlacementEnd::Open), open);
        prop_assert_eq!(t.placements.iter().filter(|p| p.lost_node.is_some()).count(), lost_named);
        for (i, p) in t.placements.iter().enumerate() {
            prop_assert!(p.assigned_at >= submitted);
            prop_assert!(i + 1 == t.placements.len() || p.end != PlacementEnd::Open);
            prop_assert_eq!(p.ended_at.is_some(), p.end != PlacementEnd::Open);
            prop_assert!(p.ended_at.is_none_or(|e| e >= p.assigned_at));
            prop_assert!(p.first_step_at.is_none_or(|f| f >= p.assigned_at && p.ended_at.is_none_or(|e| f <= e)));
            if let Some(next) = t.placements.get(i + 1) {
                prop_assert!(next.assigned_at >= p.ended_at.unwrap_or(i64::MAX));
            }
        }
        prop_assert!(t.placements.iter().filter(|p| p.first_step_at.is_some()).count() <= t.runs as usize);
    }

    #[test]
    fn done_is_absorbing(events in arb_events(), later in proptest::collection::vec(arb_kind(), 1..5)) {
        let base = JobRecord::from_events(events.clone());
        if let Some(done_at) = base.timeline.done_at {
            let mut more = events;
            for (i, k) in later.into_iter().enumerate() {
                more.push(e(&format!("late{i}"), done_at + 1 + i as i64, k));
            }
            let after = JobRecord::from_events(more).timeline;
            prop_assert_eq!(after.state, JobState::Done);
            prop_assert_eq!(Timeline { ignored_after_done: base.timeline.ignored_after_done, ..after }, base.timeline);
        }
    }
}

// ---- GPU-time accounting ----

#[test]
fn goodput_splits_a_job_by_hand_computed_figures() {
    use goodput::account;
    let ck =
        |id: &str, at: i64, step: u64, save_s: u32| e(id, at, EventKind::Checkpoint { step, save_ms: save_s * 1000 });
    let r = record(vec![
        sub(T0),
        queued("q", T0, pb::WaitReason::Capacity),
        e("n", T0 + 100 * S, EventKind::NodeAssigned { nodes: [Arc::from("n1")].into() }),
        e("p", T0 + 110 * S, EventKind::Preparing { phase: pb::PreparingPhase::ImagePull }),
        e("f1", T0 + 130 * S, EventKind::FirstStep { step: 1, origin: pb::StepOrigin::Unspecified }),
        ck("c1", T0 + 530 * S, 500, 30),
        e("x", T0 + 830 * S, EventKind::Preempted { checkpoint_saved: false }),
        e("f2", T0 + 1030 * S, EventKind::FirstStep { step: 500, origin: pb::StepOrigin::Unspecified }),
        ck("c2", T0 + 1130 * S, 600, 10),
        e("d", T0 + 1330 * S, EventKind::Done { outcome: pb::Outcome::Failed, exit_code: Some(1) }),
    ]);
    let a = account(&r.timeline, T0 + 99_999 * S).expect("submitted");
    assert_eq!(a.total, 1330 * S);
    assert_eq!(a.waiting.get(&Segment::Queued(pb::WaitReason::Capacity)), Some(&(100 * S)));
    assert_eq!(a.waiting.get(&Segment::Assigned), Some(&(10 * S)));
    assert_eq!(a.preparing.get(&Segment::Preparing(pb::PreparingPhase::ImagePull)), Some(&(20 * S)));
    assert_eq!(a.requeue_wait, 200 * S);
    assert_eq!(a.checkpoint, 40 * S);
    assert_eq!(a.lost, 300 * S, "preempted 300 s after the last checkpoint, without saving");
    assert_eq!(a.failed, 200 * S, "failed 200 s after the last checkpoint");
    assert_eq!(a.productive, 460 * S);
    assert_eq!(a.by_category().iter().sum::<i64>(), a.total);
    assert_eq!(a.gpus, 8);

    // Still waiting at `now`: the open segment counts up to now.
    let waiting = record(vec![sub(T0), queued("q", T0 + 5 * S, pb::WaitReason::Quota)]);
    let a = account(&waiting.timeline, T0 + 65 * S).expect("submitted");
    assert_eq!(a.total, 65 * S);
    assert_eq!(a.waiting.get(&Segment::Queued(pb::WaitReason::Quota)), Some(&(60 * S)));
    assert_eq!(a.waiting.get(&Segment::Unreported), Some(&(5 * S)));
    assert_eq!(a.productive, 0);
    // Waiting again after a node loss: the open requeue wait counts up to now; the run before it is productive.
    let again = record(vec![
        sub(T0),
        e("f", T0 + 10 * S, EventKind::FirstStep { step: 1, origin: pb::StepOrigin::Unspecified }),
        e("l", T0 + 70 * S, EventKind::NodeLost { node: Arc::from("n1") }),
    ]);
    let a = account(&again.timeline, T0 + 100 * S).expect("submitted");
    assert_eq!((a.total, a.requeue_wait, a.lost, a.productive), (100 * S, 30 * S, 60 * S, 0));
    assert_eq!(a.by_category().iter().sum::<i64>(), a.total);
}

/// Whether the first step at `sorted[i]` (of `origin`) is superseded, the plain way: some later first step has a
/// stronger origin (training process > unspecified > container or scheduler start) and no queued, preempted,
/// node_lost, requeued, restarted or done lies between them.
fn oracle_superseded(sorted: &[&CompactEvent], i: usize, origin: pb::StepOrigin) -> bool {
    let rank = |o: pb::StepOrigin| match o {
        pb::StepOrigin::TrainingProcess => 3,
        pb::StepOrigin::Unspecified => 2,
        _ => 1,
    };
    for later in &sorted[i + 1..] {
        match later.kind {
            EventKind::FirstStep { origin: o, .. } if rank(o) > rank(origin) => return true,
            EventKind::Queued { .. }
            | EventKind::Preempted { .. }
            | EventKind::NodeLost { .. }
            | EventKind::Requeued { .. }
            | EventKind::Restarted { .. }
            | EventKind::Done { .. } => return false,
            _ => {}
        }
    }
    false
}

/// Run time the plain way: walk the events in canonical order (times clamped to the submit) and add up the
/// intervals between a run's first step (one no later first step supersedes) and whatever stopped it, up to
/// `end`.
fn oracle_run_ms(events: &[CompactEvent], now: i64) -> Option<(i64, i64)> {
    let mut sorted: Vec<&CompactEvent> = events.iter().collect();
    sorted.sort_by_key(|e| e.sort_key());
    let submitted = sorted.iter().find(|e| matches!(e.kind, EventKind::Submitted(_)))?.at_ms;
    let mut run = 0;
    let mut since: Option<i64> = None;
    let mut last = submitted;
    for (i, ev) in sorted.iter().enumerate() {
        let at = ev.at_ms.max(submitted);
        last = last.max(at);
        match ev.kind {
            EventKind::FirstStep { origin, .. } if since.is_none() && !oracle_superseded(&sorted, i, origin) => {
                since = Some(at)
            }
            EventKind::Queued { .. }
            | EventKind::Preempted { .. }
            | EventKind::NodeLost { .. }
            | EventKind::Requeued { .. }
            | EventKind::Restarted { .. } => {
                if let Some(s) = since.take() {
                    run += at - s;
                }
            }
            EventKind::Done { .. } => {
                if let Some(s) = since.take() {
                    run += at - s;
                }
                return Some((run, at - submitted));
            }
            _ => {}
        }
    }
    let end = now.max(last);
    if let Some(s) = since {
        run += end - s;
    }
    Some((run, end - submitted))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever the events and their order: the categories are never negative and add up exactly to the job's
    /// life; the time that is neither initial wait nor requeue wait equals the run time computed independently;
    /// checkpoint, lost and failed time never exceed what their events report.
    #[test]
    fn goodput_categories_partition_the_jobs_life(events in arb_events(), now_off in -600i64..200_000) {
        let now = T0 + now_off * S;
        let r = JobRecord::from_events(events.clone());
        let Some(a) = goodput::account(&r.timeline, now) else {
            prop_assert!(!events.iter().any(|e| matches!(e.kind, EventKind::Submitted(_))));
            return Ok(());
        };
        let parts = a.by_category();
        prop_assert!(parts.iter().all(|p| *p >= 0), "{:?}", a);
        prop_assert_eq!(parts.iter().sum::<i64>(), a.total, "{:?}", a);
        // Against the oracle when `now` is after every event (the collector's clock runs ahead of what it
        // accepted; with skewed stamps in the future an open job is accounted up to what its timeline knows).
        let latest = events.iter().map(|e| e.at_ms).max().unwrap_or(now);
        if now >= latest || r.timeline.done_at.is_some() {
            let (run, life) = oracle_run_ms(&events, now).expect("submitted");
            prop_assert_eq!(a.total, life);
            prop_assert_eq!(a.checkpoint + a.lost + a.failed + a.productive, run, "{:?}", a);
        }
        let saves: i64 = events.iter().map(|e| match e.kind { EventKind::Checkpoint { save_ms, .. } => i64::from(save_ms), _ => 0 }).sum();
        prop_assert!(a.checkpoint <= saves);
        prop_assert!(a.lost <= r.timeline.lost_work_ms && a.failed <= r.timeline.failed_work_ms);
        if r.timeline.outcome != Some(pb::Outcome::Failed) {
            prop_assert_eq!(a.failed, 0);
        }
    }
}

/// Wait totals behave as the map they replaced: segment order, `add` accumulates, `insert` and `extend` replace,
/// and they serialize as a map (the same bytes as `BTreeMap<Segment, i64>`).
#[test]
fn segment_totals_behave_as_a_map() {
    let q = |r| Segment::Queued(r);
    let mut t = SegmentTotals::default();
    t.add(q(pb::WaitReason::Quota), 5);
    t.add(Segment::Unreported, 1);
    t.add(q(pb::WaitReason::Quota), 7);
    t.insert(Segment::Assigned, 3);
    t.extend([(Segment::Assigned, 4), (Segment::Preparing(pb::PreparingPhase::ImagePull), 9)]);
    let want: std::collections::BTreeMap<Segment, i64> = [
        (Segment::Unreported, 1),
        (q(pb::WaitReason::Quota), 12),
        (Segment::Assigned, 4),
        (Segment::Preparing(pb::PreparingPhase::ImagePull), 9),
    ]
    .into_iter()
    .collect();
    assert_eq!(t.iter().copied().collect::<Vec<_>>(), want.iter().map(|(s, v)| (*s, *v)).collect::<Vec<_>>());
    assert_eq!(t.get(&q(pb::WaitReason::Quota)), Some(&12));
    assert_eq!(t.get(&q(pb::WaitReason::Capacity)), None);
    assert_eq!(t.values().sum::<i64>(), 26);
    let bytes = postcard::to_stdvec(&t).expect("serialize");
    assert_eq!(bytes, postcard::to_stdvec(&want).expect("serialize"));
    let back: SegmentTotals = postcard::from_bytes(&bytes).expect("deserialize");
    assert_eq!(back, t);
    t.clear();
    assert!(t.is_empty());
    assert_eq!(t.len(), 0);
}
