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
