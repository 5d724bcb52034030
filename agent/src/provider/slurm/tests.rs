//! Table tests of the Slurm adapter's parse + diff over captured payloads (real `squeue --json` and
//! `sacct --json` from Slurm 22.05, and a 23.02-shaped copy), including restart with a persisted memory.

use super::*;

const SQUEUE_2205: &str = include_str!("../fixtures/squeue-22.05.json");
const SQUEUE_2302: &str = include_str!("../fixtures/squeue-23.02.json");
const SACCT_2205: &str = include_str!("../fixtures/sacct-22.05.json");
const NOW: i64 = 1_796_011_800_000;

fn mapping() -> Mapping {
    Mapping {
        urgent_partitions: vec!["urgent".into()],
        urgent_qos: vec![],
        site: "dc1".into(),
        gpu_class: "a100".into(),
        first_step_on_start: false,
        cluster: "c".into(),
    }
}

fn kinds(evs: &[pb::LifecycleEvent]) -> Vec<String> {
    evs.iter()
        .map(|e| match e.kind.as_ref() {
            Some(Kind::Submitted(_)) => "submitted".to_string(),
            Some(Kind::Queued(q)) => format!("queued:{}", q.raw_reason),
            Some(Kind::NodeAssigned(_)) => "node_assigned".into(),
            Some(Kind::FirstStep(_)) => "first_step".into(),
            Some(Kind::Requeued(_)) => "requeued".into(),
            Some(Kind::NodeLost(_)) => "node_lost".into(),
            Some(Kind::Done(d)) => format!("done:{:?}:{:?}", d.outcome(), d.exit_code),
            _ => "other".into(),
        })
        .collect()
}

#[test]
fn parses_squeue_22_05() {
    let jobs = parse_squeue(SQUEUE_2205).expect("parse");
    assert_eq!(jobs.len(), 6);
    let by: BTreeMap<&str, &SlurmJob> = jobs.iter().map(|j| (j.id.as_str(), j)).collect();
    assert_eq!((by["1"].state.as_str(), by["1"].start, by["1"].gpus), ("RUNNING", Some(1_796_011_786), 1));
    assert_eq!(by["1"].end, None, "a running job's end_time is only its limit");
    assert_eq!((by["3"].state.as_str(), by["3"].reason.as_str(), by["3"].start), ("PENDING", "Resources", None));
    assert_eq!(by["4"].reason, "Priority");
    assert_eq!(by["5"].reason, "Dependency");
    assert_eq!((by["6"].state.as_str(), by["6"].exit_code), ("FAILED", Some(3)), "raw wait status 768 is exit 3");
    assert_eq!(by["6"].cluster, "startline");
    assert_eq!(by["1"].nodes, ["vm"]);
}

#[test]
fn the_23_02_shapes_parse_to_the_same_jobs() {
    assert_eq!(parse_squeue(SQUEUE_2302).expect("parse"), parse_squeue(SQUEUE_2205).expect("parse"));
}

#[test]
fn parses_sacct_22_05() {
    let jobs = parse_sacct(SACCT_2205).expect("parse");
    let by: BTreeMap<&str, &SlurmJob> = jobs.iter().map(|j| (j.id.as_str(), j)).collect();
    assert_eq!(
        (by["1"].state.as_str(), by["1"].start, by["1"].end, by["1"].gpus),
        ("COMPLETED", Some(1_796_011_786), Some(1_796_011_790), 1)
    );
    assert_eq!((by["3"].state.as_str(), by["3"].end), ("RUNNING", None));
    assert_eq!(by["6"].state, "FAILED");
    // The sacct 22.05 quirk: a failed job's exit code reads as success there.
    assert_eq!(by["6"].exit_code, Some(0));
    // Merged with the live view, the failed job keeps exit 3.
    let merged = merge(parse_squeue(SQUEUE_2205).expect("squeue"), jobs.clone());
    let six = merged.iter().find(|j| j.id == "6").expect("job 6");
    assert_eq!(six.exit_code, Some(3));
}

#[test]
fn a_job_goes_through_its_transitions_once() {
    let m = mapping();
    let mut j = SlurmJob {
        id: "42".into(),
        cluster: "c".into(),
        state: "PENDING".into(),
        reason: "Resources".into(),
        submit: 1_796_011_000,
        partition: "urgent".into(),
        gpus: 2,
        ..Default::default()
    };
    let (e1, m1) = diff(&m, &j, &JobMemory::default(), NOW);
    assert_eq!(kinds(&e1), ["submitted", "queued:Resources"]);
    assert_eq!(
        e1[1].occurred_at.as_ref().map(startline_proto::time::timestamp_to_ms),
        Some(1_796_011_000_000),
        "first reason at submit"
    );
    let Some(Kind::Submitted(s)) = &e1[0].kind else { panic!("submitted") };
    assert_eq!((s.priority(), s.gpu_count, s.pool.as_str()), (pb::PriorityClass::Urgent, 2, "urgent"));
    assert!(startline_proto::validate::validate_event(&e1[0], NOW, &Default::default()).is_ok());
    // The same view again: nothing.
    let (again, m1b) = diff(&m, &j, &m1, NOW + 1000);
    assert!(again.is_empty());
    assert_eq!(m1b, m1);
    // Reason changes: dated at the poll that saw it.
    j.reason = "Priority".into();
    let (e2, m2) = diff(&m, &j, &m1, NOW + 5000);
    assert_eq!(kinds(&e2), ["queued:Priority"]);
    assert_eq!(e2[0].occurred_at.as_ref().map(startline_proto::time::timestamp_to_ms), Some(NOW + 5000));
    // Starts, then completes.
    j.state = "RUNNING".into();
    j.reason = "None".into();
    j.start = Some(1_796_011_900);
    j.nodes = vec!["n1".into()];
    let (e3, m3) = diff(&m, &j, &m2, NOW + 9000);
    assert_eq!(kinds(&e3), ["node_assigned"]);
    j.state = "COMPLETED".into();
    j.end = Some(1_796_012_000);
    j.exit_code = Some(0);
    let (e4, m4) = diff(&m, &j, &m3, NOW + 99_000);
    assert_eq!(kinds(&e4), ["done:Succeeded:Some(0)"]);
    assert!(m4.done);
    let ids: std::collections::BTreeSet<String> = [e1, e2, e3, e4].concat().into_iter().map(|e| e.event_id).collect();
    assert_eq!(ids.len(), 5, "every transition has its own id");
}

#[test]
fn restart_with_persisted_memory_neither_repeats_nor_misses() {
    let m = Mapping { first_step_on_start: true, ..mapping() };
    let mut j = SlurmJob {
        id: "7".into(),
        cluster: "c".into(),
        state: "PENDING".into(),
        reason: "Priority".into(),
        submit: 1_796_011_000,
        ..Default::default()
    };
    let (first, mem) = diff(&m, &j, &JobMemory::default(), NOW);
    // Persist and restore (as the shell does through sled).
    let stored = serde_json::to_vec(&mem).expect("encode");
    let restored: JobMemory = serde_json::from_slice(&stored).expect("decode");
    // While the adapter was down the job started and ended.
    j.state = "COMPLETED".into();
    j.start = Some(1_796_011_500);
    j.end = Some(1_796_011_600);
    let (after, _) = diff(&m, &j, &restored, NOW + 60_000);
    assert_eq!(kinds(&after), ["node_assigned", "first_step", "done:Succeeded:None"], "no repeats, no gaps");
    // With the memory lost, the same transitions come back with the same ids: duplicates, not new events.
    let (lost, _) = diff(&m, &j, &JobMemory::default(), NOW + 60_000);
    let all_ids: std::collections::BTreeSet<String> =
        first.iter().chain(after.iter()).map(|e| e.event_id.clone()).collect();
    assert!(lost.iter().all(|e| all_ids.contains(&e.event_id)), "{:?}", kinds(&lost));
}

#[test]
fn requeue_starts_a_new_attempt_and_node_fail_reports_the_loss() {
    let m = mapping();
    let mut j = SlurmJob {
        id: "9".into(),
        cluster: "c".into(),
        state: "RUNNING".into(),
        submit: 1_796_011_000,
        start: Some(1_796_011_010),
        ..Default::default()
    };
    let (_, mem) = diff(&m, &j, &JobMemory::default(), NOW);
    j.state = "PENDING".into();
    j.reason = "BeginTime".into();
    j.restarts = 1;
    j.start = None;
    let (e, mem) = diff(&m, &j, &mem, NOW + 1000);
    assert_eq!(kinds(&e), ["requeued", "queued:BeginTime"]);
    assert_eq!(e[1].attempt, Some(2));
    j.state = "NODE_FAIL".into();
    j.start = Some(1_796_011_100);
    j.end = Some(1_796_011_200);
    let (e, _) = diff(&m, &j, &mem, NOW + 2000);
    assert_eq!(kinds(&e), ["node_assigned", "node_lost", "done:Failed:None"]);
}

#[test]
fn reasons_map_onto_the_closed_taxonomy() {
    use pb::WaitReason as W;
    for (raw, want) in [
        ("Resources", W::Capacity),
        ("Priority", W::Priority),
        ("QOSMaxGRESPerUser", W::Quota),
        ("AssocGrpGRES", W::Quota),
        ("Dependency", W::DependencyOrHold),
        ("JobHeldUser", W::DependencyOrHold),
        ("ReqNodeNotAvail", W::Misconfigured),
        ("SomethingNew", W::Unknown),
    ] {
        assert_eq!(map_reason(raw), want, "{raw}");
    }
}

#[test]
fn out_of_range_times_and_restart_counts_neither_overflow_nor_flood() {
    // Found by startline-fuzz: a submit time of i64::MAX seconds overflowed `* 1000` (a panic in debug builds),
    // and restart_cnt 4000000000 made one diff loop (and allocate) four billion `requeued` events.
    let mut v: serde_json::Value = serde_json::from_str(SQUEUE_2205).expect("json");
    let mut job = v["jobs"][0].clone();
    job["submit_time"] = i64::MAX.into();
    job["start_time"] = i64::MAX.into();
    job["end_time"] = i64::MAX.into();
    job["restart_cnt"] = 4_000_000_000u64.into();
    v["jobs"] = serde_json::json!([job]);
    let jobs = parse_squeue(&v.to_string()).expect("parsed");
    let (e, mem) = diff(&mapping(), &jobs[0], &JobMemory::default(), NOW);
    let requeued = e.iter().filter(|e| matches!(e.kind, Some(Kind::Requeued(_)))).count();
    assert_eq!(requeued, MAX_REQUEUES_PER_POLL as usize);
    assert_eq!(mem.restarts, 4_000_000_000, "attempts keep Slurm's numbering");
    assert_eq!(e.last().and_then(|e| e.attempt), Some(4_000_000_001));
    let at = startline_proto::time::timestamp_to_ms(e[0].occurred_at.as_ref().expect("time"));
    assert_eq!(at, i64::MAX, "saturated, then refused by validation as in the future");
    assert!(startline_proto::validate::validate_event(&e[0], NOW, &Default::default()).is_err());
    assert!(diff(&mapping(), &jobs[0], &mem, NOW + 1000).0.is_empty(), "nothing twice");
    // The largest count Slurm could report as a u32: the attempt saturates instead of overflowing.
    let mut j = jobs[0].clone();
    j.restarts = u32::MAX;
    let (e, _) = diff(&mapping(), &j, &JobMemory::default(), NOW);
    assert_eq!(e.last().and_then(|e| e.attempt), Some(u32::MAX));
}

fn at(e: &pb::LifecycleEvent) -> i64 {
    e.occurred_at.as_ref().map(startline_proto::time::timestamp_to_ms).unwrap_or(0)
}

fn queued_of(e: &pb::LifecycleEvent) -> &pb::Queued {
    match e.kind.as_ref() {
        Some(Kind::Queued(q)) => q,
        other => panic!("not queued: {other:?}"),
    }
}

/// Job 3 of the captured 22.05 squeue payload (pending on Resources), edited into another shape.
fn squeue_with(edit: impl Fn(&mut serde_json::Value)) -> String {
    let mut v: serde_json::Value = serde_json::from_str(SQUEUE_2205).expect("json");
    let mut job = v["jobs"][2].clone();
    edit(&mut job);
    v["jobs"] = serde_json::json!([job]);
    v.to_string()
}

#[test]
fn array_task_strings_expand_with_steps_throttles_caps_and_cuts() {
    assert_eq!(array_tasks("0-2", 100), [0, 1, 2]);
    assert_eq!(array_tasks("0-9%2", 100), (0..10).collect::<Vec<u32>>());
    assert_eq!(array_tasks("1,3,5-7", 100), [1, 3, 5, 6, 7]);
    assert_eq!(array_tasks("1-9:4", 100), [1, 5, 9]);
    assert_eq!(array_tasks("[4-5]", 100), [4, 5]);
    assert_eq!(array_tasks("0-1000000", 5), [0, 1, 2, 3, 4]);
    // squeue cut the string at its buffer: the last item may be partial and is left out.
    assert_eq!(array_tasks("0,2,4,6,8,10,1...", 100), [0, 2, 4, 6, 8, 10]);
    assert_eq!(array_tasks("x,3,4-y,5:0,7", 100), [3, 7]);
    assert!(array_tasks("", 100).is_empty());
    // sacct 22.05 prints the pending tasks as a hex bitmap (seen on real Slurm: `0x7` for 0-2).
    assert_eq!(array_tasks("0x7", 100), [0, 1, 2]);
    assert_eq!(array_tasks("0xA0", 100), [5, 7]);
    assert_eq!(array_tasks("0x12", 1), [1]);
    assert_eq!(array_tasks("4294967295", 100), [u32::MAX], "no overflow at the top");
}

#[test]
fn a_pending_array_record_is_one_job_per_task_and_never_a_job_of_its_own() {
    // 22.05: array_job_id set, array_task_id null, array_task_string "0-2" (the record's own job_id is the
    // array's).
    let p2205 = squeue_with(|j| {
        j["job_id"] = 20.into();
        j["array_job_id"] = 20.into();
        j["array_task_string"] = "0-2".into();
    });
    let jobs = parse_squeue(&p2205).expect("parse");
    let ids: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(ids, ["20_0", "20_1", "20_2"]);
    assert!(jobs.iter().all(|j| j.state == "PENDING" && j.reason == "Resources" && j.submit == 1_796_011_786));
    // 23.02+: the task id is an unset number; a throttle.
    let p2302 = squeue_with(|j| {
        j["job_id"] = 30.into();
        j["array_job_id"] = serde_json::json!({"set": true, "infinite": false, "number": 30});
        j["array_task_id"] = serde_json::json!({"set": false, "infinite": false, "number": 0});
        j["array_task_string"] = "0-9%2".into();
        j["job_state"] = serde_json::json!(["PENDING"]);
        j["state_reason"] = "JobArrayTaskLimit".into();
    });
    let jobs = parse_squeue(&p2302).expect("parse");
    assert_eq!(jobs.len(), 10);
    assert_eq!((jobs[9].id.as_str(), jobs[9].reason.as_str()), ("30_9", "JobArrayTaskLimit"));
    // A task that split out (its own record) keeps its id; the rest stay in the shrunken meta-record.
    let running = squeue_with(|j| {
        j["job_id"] = 20.into();
        j["array_job_id"] = 20.into();
        j["array_task_id"] = 0.into();
        j["job_state"] = "RUNNING".into();
        j["state_reason"] = "None".into();
        j["start_time"] = 1_796_011_800.into();
        j["nodes"] = "vm".into();
    });
    let task0 = parse_squeue(&running).expect("parse");
    assert_eq!((task0[0].id.as_str(), task0[0].start), ("20_0", Some(1_796_011_800)));
    // Through diff: each task is a job with its own id, submitted and queued; task 0 then starts and ends.
    let m = mapping();
    let all = parse_squeue(&p2205).expect("parse");
    let mut mems = BTreeMap::new();
    for j in &all {
        let (e, mem) = diff(&m, j, &JobMemory::default(), NOW);
        assert_eq!(kinds(&e), ["submitted", "queued:Resources"], "{}", j.id);
        assert_eq!(e[0].job_id, format!("slurm/c/{}", j.id).replace("slurm/c/", "slurm/startline/"));
        mems.insert(j.id.clone(), mem);
    }
    assert!(!mems.contains_key("20"), "no job for the meta-record");
    let (e, mem) = diff(&m, &task0[0], &mems["20_0"], NOW + 1000);
    assert_eq!(kinds(&e), ["node_assigned"]);
    let mut done = task0[0].clone();
    done.state = "COMPLETED".into();
    done.end = Some(1_796_011_900);
    assert_eq!(kinds(&diff(&m, &done, &mem, NOW + 2000).0), ["done:Succeeded:Some(0)"]);
}

#[test]
fn a_pending_array_in_sacct_is_one_job_per_task_too() {
    let mut v: serde_json::Value = serde_json::from_str(SACCT_2205).expect("json");
    let mut job = v["jobs"][0].clone();
    job["job_id"] = 40.into();
    job["array"]["job_id"] = 40.into();
    job["array"]["task"] = "0xA".into();
    job["state"] = serde_json::json!({"current": "PENDING", "reason": "Priority"});
    job["time"]["start"] = 0.into();
    v["jobs"] = serde_json::json!([job]);
    let jobs = parse_sacct(&v.to_string()).expect("parse");
    let ids: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(ids, ["40_1", "40_3"]);
    assert_eq!((jobs[0].start, jobs[0].end), (None, None));
}

#[test]
fn eligible_time_splits_the_wait_exactly_in_both_shapes() {
    let m = mapping();
    // 22.05: eligible 10 s after submit (a begin time or dependency), now waiting on Resources.
    let p = squeue_with(|j| j["eligible_time"] = 1_796_011_796.into());
    let job = parse_squeue(&p).expect("parse").remove(0);
    assert_eq!(job.eligible, Some(1_796_011_796));
    let p23 = squeue_with(|j| {
        j["eligible_time"] = serde_json::json!({"set": true, "infinite": false, "number": 1_796_011_796});
    });
    assert_eq!(parse_squeue(&p23).expect("parse")[0].eligible, Some(1_796_011_796));
    let (e, _) = diff(&m, &job, &JobMemory::default(), NOW);
    assert_eq!(kinds(&e), ["submitted", "queued:eligible_time", "queued:Resources"]);
    assert_eq!(queued_of(&e[1]).reason(), pb::WaitReason::DependencyOrHold);
    assert_eq!(at(&e[1]), 1_796_011_786_000, "the ineligible part from submit");
    assert_eq!(at(&e[2]), 1_796_011_796_000, "the resource wait from eligible_time, not the poll");
    for ev in &e {
        assert!(startline_proto::validate::validate_event(ev, NOW, &Default::default()).is_ok());
    }
    // Eligible a second after submit (an array on real 22.05): no ineligible phase.
    let mut array_task = job.clone();
    array_task.eligible = Some(array_task.submit + 1);
    assert_eq!(kinds(&diff(&m, &array_task, &JobMemory::default(), NOW).0), ["submitted", "queued:Resources"]);
    // Seen waiting on its dependency first (no eligible_time yet), then on Resources: dated at eligible_time.
    let mut j = SlurmJob {
        id: "50".into(),
        cluster: "c".into(),
        state: "PENDING".into(),
        reason: "Dependency".into(),
        submit: 1_796_011_000,
        ..Default::default()
    };
    let (e1, mem) = diff(&m, &j, &JobMemory::default(), NOW);
    assert_eq!(kinds(&e1), ["submitted", "queued:Dependency"]);
    assert_eq!(at(&e1[1]), 1_796_011_000_000);
    j.reason = "Resources".into();
    j.eligible = Some(1_796_011_500);
    let (e2, mem) = diff(&m, &j, &mem, NOW);
    assert_eq!(kinds(&e2), ["queued:Resources"]);
    assert_eq!(at(&e2[0]), 1_796_011_500_000);
    // Resources -> Priority: no eligibility boundary between them, dated at the poll.
    j.reason = "Priority".into();
    let (e3, _) = diff(&m, &j, &mem, NOW + 7000);
    assert_eq!(at(&e3[0]), NOW + 7000);
    // A begin time still ahead (eligible in the future) is no boundary yet; a plain job is eligible at submit.
    let mut later = job.clone();
    later.eligible = Some(NOW / 1000 + 600);
    assert_eq!(kinds(&diff(&m, &later, &JobMemory::default(), NOW).0), ["submitted", "queued:Resources"]);
    let plain = parse_squeue(SQUEUE_2205).expect("parse").into_iter().find(|j| j.id == "3").expect("job 3");
    assert_eq!(plain.eligible, Some(plain.submit));
    assert_eq!(kinds(&diff(&m, &plain, &JobMemory::default(), NOW).0), ["submitted", "queued:Resources"]);
}

#[test]
fn configuring_is_node_assigned_then_provisioning_and_the_first_step_waits_for_it() {
    let m = Mapping { first_step_on_start: true, ..mapping() };
    let running = |state: serde_json::Value| {
        squeue_with(move |j| {
            j["job_state"] = state.clone();
            j["state_reason"] = "None".into();
            j["start_time"] = 1_796_011_800.into();
            j["nodes"] = "vm".into();
        })
    };
    let j22 = parse_squeue(&running("CONFIGURING".into())).expect("parse").remove(0);
    let j23 = parse_squeue(&running(serde_json::json!(["RUNNING", "CONFIGURING"]))).expect("parse").remove(0);
    assert_eq!(j22, j23, "both shapes read the same");
    assert_eq!((j22.state.as_str(), j22.configuring, j22.end), ("RUNNING", true, None));
    let (e, mem) = diff(&m, &j22, &JobMemory::default(), NOW);
    assert_eq!(kinds(&e), ["submitted", "node_assigned", "other"]);
    let Some(Kind::Preparing(p)) = &e[2].kind else { panic!("preparing") };
    assert_eq!(p.phase(), pb::PreparingPhase::Provisioning);
    assert_eq!((at(&e[1]), at(&e[2])), (1_796_011_800_000, 1_796_011_800_000));
    // Configured: Slurm re-dated the start to the end of the power-up, which is the first step.
    let mut up = j22.clone();
    up.configuring = false;
    up.start = Some(1_796_011_890);
    let (e, _) = diff(&m, &up, &mem, NOW + 90_000);
    assert_eq!(kinds(&e), ["first_step"]);
    assert_eq!(at(&e[0]), 1_796_011_890_000);
}

#[test]
fn the_estimated_start_rides_on_queued_and_a_move_over_a_minute_sends_a_new_one() {
    let m = mapping();
    let est = NOW / 1000 + 3600;
    let p = squeue_with(|j| j["start_time"] = est.into());
    let mut j = parse_squeue(&p).expect("parse").remove(0);
    assert_eq!((j.estimated_start, j.start), (Some(est), None), "a pending start_time is an estimate");
    let (e, mem) = diff(&m, &j, &JobMemory::default(), NOW);
    assert_eq!(kinds(&e), ["submitted", "queued:Resources"]);
    let got = queued_of(&e[1]).estimated_start.as_ref().map(startline_proto::time::timestamp_to_ms);
    assert_eq!(got, Some(est * 1000));
    // Moves by 30 s: nothing; by 5 minutes: a new queued with the same reason, dated at the poll.
    j.estimated_start = Some(est + 30);
    let (e, mem) = diff(&m, &j, &mem, NOW + 10_000);
    assert!(e.is_empty(), "{:?}", kinds(&e));
    j.estimated_start = Some(est + 300);
    let (e, mem) = diff(&m, &j, &mem, NOW + 20_000);
    assert_eq!(kinds(&e), ["queued:Resources"]);
    assert_eq!(queued_of(&e[0]).reason(), pb::WaitReason::Capacity);
    let got = queued_of(&e[0]).estimated_start.as_ref().map(startline_proto::time::timestamp_to_ms);
    assert_eq!((at(&e[0]), got), (NOW + 20_000, Some((est + 300) * 1000)));
    assert!(startline_proto::validate::validate_event(&e[0], NOW + 20_000, &Default::default()).is_ok());
    // The same again: nothing. A past value (squeue clamps an overdue estimate to its clock) is no estimate.
    assert!(diff(&m, &j, &mem, NOW + 30_000).0.is_empty());
    j.estimated_start = Some(NOW / 1000 - 5);
    let (e, _) = diff(&m, &j, &JobMemory::default(), NOW);
    assert_eq!(queued_of(&e[1]).estimated_start, None);
    // The captured payload's pending jobs carry Slurm's own (far) estimate.
    let three = parse_squeue(SQUEUE_2205).expect("parse").into_iter().find(|j| j.id == "3").expect("job 3");
    assert_eq!(three.estimated_start, Some(1_827_547_786));
}

#[test]
fn a_vanished_job_is_given_up_after_the_grace_as_cancelled_with_outcome_unknown() {
    let mut state = AdapterState::default();
    state.open.insert("slurm/c/7".into(), "7".into());
    state.open.insert("slurm/c/8".into(), "8".into());
    let grace = 600_000;
    let seen8: BTreeSet<String> = ["slurm/c/8".to_string()].into();
    let answered7: BTreeSet<String> = ["slurm/c/7".to_string()].into();
    // First missed at NOW; accounting answered without it.
    assert!(track_vanished(&mut state, &seen8, &answered7, NOW, grace).is_empty());
    assert_eq!(state.missing.get("slurm/c/7"), Some(&NOW));
    assert!(track_vanished(&mut state, &seen8, &answered7, NOW + grace - 1, grace).is_empty());
    assert_eq!(track_vanished(&mut state, &seen8, &answered7, NOW + grace, grace), [("slurm/c/7".to_string(), NOW)]);
    // Seen again before that: no longer missing.
    let both: BTreeSet<String> = ["slurm/c/7".to_string(), "slurm/c/8".to_string()].into();
    assert!(track_vanished(&mut state, &both, &BTreeSet::new(), NOW + grace, grace).is_empty());
    assert!(state.missing.is_empty());
    // Accounting not answering: three graces.
    assert!(track_vanished(&mut state, &seen8, &BTreeSet::new(), NOW, grace).is_empty());
    assert!(track_vanished(&mut state, &seen8, &BTreeSet::new(), NOW + 2 * grace, grace).is_empty());
    assert_eq!(track_vanished(&mut state, &seen8, &BTreeSet::new(), NOW + 3 * grace, grace).len(), 1);
    // The event: done, cancelled (no unknown outcome in the protocol), dated at the first miss, valid.
    let mem = JobMemory { emitted: ["submitted".to_string(), "queued:1".to_string()].into(), ..Default::default() };
    let (e, after) = vanished("slurm/c/7", &mem, NOW);
    assert_eq!(kinds(&e), ["done:Cancelled:None"]);
    assert_eq!((e[0].event_id.as_str(), e[0].source.as_str(), at(&e[0])), ("slurm/c/7:done", "slurm-adapter/c", NOW));
    let Some(Kind::Done(d)) = &e[0].kind else { panic!("done") };
    assert!(d.message.contains("outcome unknown"), "{}", d.message);
    assert!(after.done);
    assert!(startline_proto::validate::validate_event(&e[0], NOW, &Default::default()).is_ok());
    // The same id as a real done: should the job turn up later, its done is a duplicate.
    let j = SlurmJob {
        id: "7".into(),
        cluster: "c".into(),
        state: "COMPLETED".into(),
        submit: 1_796_011_000,
        end: Some(1_796_011_100),
        ..Default::default()
    };
    let (real, _) = diff(&mapping(), &j, &JobMemory::default(), NOW);
    assert!(real.iter().any(|r| r.event_id == e[0].event_id));
    assert!(diff(&mapping(), &j, &after, NOW).0.iter().all(|r| !matches!(r.kind, Some(Kind::Done(_)))));
}

#[test]
fn the_sacct_window_replaces_a_configured_starttime() {
    let cmd: Vec<String> = "sacct --json --allusers --starttime now-2days -S x --starttime=y -Sz -j"
        .split(' ')
        .map(String::from)
        .collect();
    assert_eq!(sacct_base(&cmd), ["sacct", "--json", "--allusers", "-j"]);
    let w = sacct_window(&sacct_base(&cmd[..3]), 1_796_011_786_999);
    assert_eq!(w, ["sacct", "--json", "--allusers", "--starttime", "uts1796011786"]);
}
