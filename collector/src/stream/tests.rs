//! Unit tests of the stream's records, job changes, filters and live hub.

use super::*;
use crate::job::{event_id_hash, CompactEvent, EventKind, JobRecord};
use crate::slo::{assess, SloDef};
use startline_proto::pb;

const T0: i64 = 1_767_225_600_000;

fn attrs(pool: &str, team: &str, priority: pb::PriorityClass) -> JobAttrs {
    JobAttrs {
        pool_kind: pb::PoolKind::Dedicated,
        provider: "slurm".into(),
        pool: pool.into(),
        priority,
        gpu_class: "a100".into(),
        gpu_count: 8,
        node_count: 1,
        region: "r1".into(),
        team: team.into(),
        project: "p".into(),
        chain_id: String::new(),
        chain_stage: String::new(),
        labels: Default::default(),
    }
}

fn ev(id: &str, at: i64, kind: EventKind) -> CompactEvent {
    CompactEvent { at_ms: at, id_hash: event_id_hash(id), seq: 0, attempt: None, kind }
}

#[test]
fn an_event_record_built_from_stored_bytes_decodes_as_the_same_message() {
    let event = pb::LifecycleEvent {
        job_id: "slurm/a100/42".into(),
        event_id: "e1".into(),
        source: "adapter".into(),
        occurred_at: Some(startline_proto::time::ms_to_timestamp(T0)),
        ..Default::default()
    };
    let subject = Subject::job("slurm/a100/42", Some(&attrs("a100", "vision", pb::PriorityClass::Urgent)));
    let rec = event_record(7, T0 + 5, &subject, 99, &event.encode_to_vec());
    assert_eq!((rec.cursor, rec.kind), (7, KIND_EVENT));
    let back = pb::StreamRecord::decode(&*rec.bytes).expect("decodes");
    assert_eq!(back.cursor, 7);
    assert_eq!(back.recorded_at, Some(startline_proto::time::ms_to_timestamp(T0 + 5)));
    assert_eq!((back.job_id.as_str(), back.pool.as_str(), back.team.as_str()), ("slurm/a100/42", "a100", "vision"));
    assert_eq!(back.priority, pb::PriorityClass::Urgent as i32);
    match back.record {
        Some(pb::stream_record::Record::Event(a)) => {
            assert_eq!(a.seq, 99);
            assert_eq!(a.event, Some(event));
        }
        other => panic!("not an event record: {other:?}"),
    }
}

#[test]
fn job_changes_report_state_segment_outcome_and_each_slo_decision_once() {
    let def = SloDef::defaults().remove(0);
    assert_eq!(def.name, "urgent-start");
    let name = |i: u16| if i == 0 { "urgent-start".to_string() } else { format!("slo{i}") };
    let a = std::sync::Arc::new(attrs("a100", "t", pb::PriorityClass::Urgent));
    let steps = [
        ev("sub", T0, EventKind::Submitted(a)),
        ev(
            "q",
            T0 + 10_000,
            EventKind::Queued {
                reason: pb::WaitReason::Capacity,
                raw_reason: "Resources".into(),
                estimated_start: None,
            },
        ),
        ev(
            "q2",
            T0 + 20_000,
            EventKind::Queued {
                reason: pb::WaitReason::Capacity,
                raw_reason: "Resources".into(),
                estimated_start: None,
            },
        ),
        ev("fs", T0 + 300_000, EventKind::FirstStep { step: 1, origin: startline_proto::pb::StepOrigin::Unspecified }),
        ev("ck", T0 + 400_000, EventKind::Checkpoint { step: 100, save_ms: 0 }),
        ev("done", T0 + 900_000, EventKind::Done { outcome: pb::Outcome::Succeeded, exit_code: Some(0) }),
    ];
    let mut rec = JobRecord::default();
    let mut before: Option<JobView> = None;
    let mut got = Vec::new();
    for (i, e) in steps.into_iter().enumerate() {
        let at = e.at_ms;
        rec.insert(e);
        let contribs: Vec<_> = assess(0, &def, &rec.timeline, at).into_iter().collect();
        let after = JobView::of(&rec.timeline, &contribs);
        got.push(change(before.as_ref(), &after, i as u64 + 1, name));
        before = Some(after);
    }
    let c = |i: usize| got[i].clone();
    let first = c(0).expect("submitted is a change");
    assert_eq!(
        (first.previous_state.as_str(), first.state.as_str(), first.segment.as_str()),
        ("", "queued", "unreported")
    );
    let q = c(1).expect("queued for capacity is a segment change");
    assert_eq!((q.previous_segment.as_str(), q.segment.as_str()), ("unreported", "queued:capacity"));
    assert_eq!(q.event_seq, 2);
    assert_eq!(c(2), None, "a second queued for the same reason changes nothing a subscriber sees");
    let started = c(3).expect("first step");
    assert_eq!(
        (started.previous_state.as_str(), started.state.as_str(), started.segment.as_str()),
        ("queued", "running", "")
    );
    assert_eq!(started.slo_decisions.len(), 1);
    assert_eq!(started.slo_decisions[0].slo, "urgent-start");
    assert_eq!(started.slo_decisions[0].verdict, "good");
    assert_eq!(started.slo_decisions[0].time_to_first_step_seconds, Some(300.0));
    assert_eq!(c(4), None, "a checkpoint changes nothing a subscriber sees");
    let done = c(5).expect("done");
    assert_eq!((done.state.as_str(), done.outcome.as_str()), ("done", "succeeded"));
    assert!(done.slo_decisions.is_empty(), "the decision was made once, at the first step");
    let r = resync(before.as_ref().expect("view"), name);
    assert!(r.resync);
    assert_eq!((r.previous_state.as_str(), r.state.as_str(), r.outcome.as_str()), ("", "done", "succeeded"));
    assert_eq!(r.slo_decisions.len(), 1);
}

#[test]
fn a_job_that_ends_without_starting_is_a_bad_decision() {
    let def = SloDef::defaults().remove(1);
    assert_eq!(def.name, "normal-start");
    let a = std::sync::Arc::new(attrs("a100", "t", pb::PriorityClass::Normal));
    let mut rec = JobRecord::default();
    rec.insert(ev("sub", T0, EventKind::Submitted(a)));
    let c0: Vec<_> = assess(0, &def, &rec.timeline, T0).into_iter().collect();
    let before = JobView::of(&rec.timeline, &c0);
    rec.insert(ev("done", T0 + 60_000, EventKind::Done { outcome: pb::Outcome::Failed, exit_code: Some(1) }));
    let c1: Vec<_> = assess(0, &def, &rec.timeline, T0 + 60_000).into_iter().collect();
    let ch = change(Some(&before), &JobView::of(&rec.timeline, &c1), 2, |_| "normal-start".into()).expect("change");
    assert_eq!(ch.outcome, "failed");
    assert_eq!(ch.slo_decisions.len(), 1);
    assert_eq!(ch.slo_decisions[0].verdict, "bad");
    assert_eq!(ch.slo_decisions[0].time_to_first_step_seconds, None);
}

fn record(cursor: u64, job: &str, pool: &str, team: &str, kind: u8) -> pb::StreamRecord {
    let subject = Subject { job_id: job.into(), pool: pool.into(), priority: 2, team: team.into() };
    let r = match kind {
        KIND_EVENT => event_record(cursor, T0, &subject, cursor, &[]),
        KIND_CHANGE => change_record(cursor, T0, &subject, pb::JobChange::default()),
        _ => alert_record(
            cursor,
            T0,
            &AlertNote {
                key: "k".into(),
                labels: [("job_id".to_string(), job.to_string()), ("pool".to_string(), pool.to_string())].into(),
                annotations: Default::default(),
                starts_at_ms: T0,
                resolved_at_ms: None,
            },
        ),
    };
    pb::StreamRecord::decode(&*r.bytes).expect("decodes")
}

#[test]
fn filters_combine_and_bad_ones_name_their_field() {
    let req = |f: fn(&mut pb::SubscribeRequest)| {
        let mut r = pb::SubscribeRequest::default();
        f(&mut r);
        Filter::of(&r)
    };
    let all = req(|_| {}).expect("empty filter");
    assert!(all.matches(&record(1, "slurm/1", "a100", "t", KIND_EVENT)));
    assert!(all.matches(&record(2, "", "", "", KIND_ALERT)));
    let f = req(|r| {
        r.pools = vec!["a100".into(), "h100".into()];
        r.job_id_prefix = "slurm/".into();
        r.kinds = vec!["change".into(), "alert".into()];
    })
    .expect("valid");
    assert!(f.matches(&record(1, "slurm/1", "h100", "t", KIND_CHANGE)));
    assert!(f.matches(&record(1, "slurm/1", "a100", "t", KIND_ALERT)), "alerts match on their labels");
    assert!(!f.matches(&record(1, "slurm/1", "a100", "t", KIND_EVENT)), "kind");
    assert!(!f.matches(&record(1, "vertex/1", "a100", "t", KIND_CHANGE)), "prefix");
    assert!(!f.matches(&record(1, "slurm/1", "l4", "t", KIND_CHANGE)), "pool");
    let t = req(|r| {
        r.teams = vec!["vision".into()];
        r.priorities = vec![1];
    })
    .expect("valid");
    assert!(!t.matches(&record(1, "slurm/1", "a100", "vision", KIND_CHANGE)), "priority 2 is not 1");
    let err = |f: fn(&mut pb::SubscribeRequest)| req(f).expect_err("refused").0;
    assert_eq!(err(|r| r.priorities = vec![0]), "priorities[0]");
    assert_eq!(err(|r| r.priorities = vec![1, 7]), "priorities[1]");
    assert_eq!(err(|r| r.kinds = vec!["events".into()]), "kinds[0]");
    assert_eq!(err(|r| r.pools = vec![String::new()]), "pools[0]");
    assert_eq!(err(|r| r.teams = vec!["t".into(); 65]), "teams");
    assert_eq!(err(|r| r.job_id_prefix = "x".repeat(513)), "job_id_prefix");
}

fn recs(cursors: std::ops::Range<u64>) -> Arc<[Rec]> {
    cursors.map(|c| Rec { cursor: c, kind: KIND_EVENT, bytes: Arc::from(&[][..]) }).collect::<Vec<_>>().into()
}

#[tokio::test]
async fn a_slow_subscriber_is_ended_with_the_first_cursor_it_missed_and_others_get_everything() {
    let hub = Hub::default();
    let mut slow = hub.subscribe(100);
    let mut fast = hub.subscribe(1000);
    assert_eq!(hub.subscribers(), 2);
    hub.publish(recs(1..61));
    let first = fast.recv().await.expect("batch");
    assert_eq!(first.len(), 60);
    hub.publish(recs(61..121)); // slow holds 60 + 60 > 100: ended
    assert_eq!(hub.subscribers(), 1);
    hub.publish(recs(121..131));
    let mut got: Vec<u64> = first.iter().map(|r| r.cursor).collect();
    for _ in 0..2 {
        got.extend(fast.recv().await.expect("batch").iter().map(|r| r.cursor));
    }
    assert_eq!(got, (1..131).collect::<Vec<_>>());
    // The slow one still receives what it was handed, then learns where it stopped.
    assert_eq!(slow.recv().await.expect("queued batch").len(), 60);
    assert_eq!(slow.recv().await.err(), Some(Ended::Overflow { first_missed: 61 }));
    hub.close();
    assert_eq!(fast.recv().await.err(), Some(Ended::Closed));
}

#[test]
fn settings_validate_and_write_back() {
    let mut errs = Vec::new();
    let s = StreamSection {
        retention: Some("2h".into()),
        subscriber_buffer: Some(10),
        max_subscribers: Some(0),
        progress_interval: Some("soon".into()),
        ..Default::default()
    }
    .validate(&mut errs);
    assert_eq!(errs.len(), 3, "{errs:?}");
    assert!(errs.iter().any(|e| e.starts_with("stream.subscriber_buffer")));
    assert!(errs.iter().any(|e| e.starts_with("stream.max_subscribers")));
    assert!(errs.iter().any(|e| e.starts_with("stream.progress_interval")));
    assert_eq!(s.retention, Duration::from_secs(7200));
    let mut none = Vec::new();
    assert_eq!(StreamSection::of(&s).validate(&mut none), s);
    assert!(none.is_empty());
    // The estimate sweep: at least a second, or 0s for none; a bad value is named and the default kept.
    let interval = |v: &str| {
        let mut errs = Vec::new();
        let s = StreamSection { expected_start_interval: Some(v.into()), ..Default::default() }.validate(&mut errs);
        (s.expected_start_interval, errs)
    };
    assert_eq!(interval("0s"), (Duration::ZERO, vec![]));
    assert_eq!(interval("90s"), (Duration::from_secs(90), vec![]));
    let (kept, errs) = interval("500ms");
    assert_eq!(kept, Duration::from_secs(60));
    assert_eq!(errs, ["stream.expected_start_interval: 500ms must be at least 1s (or 0s: off)"]);
    let (kept, errs) = interval("often");
    assert_eq!(kept, Duration::from_secs(60));
    assert!(errs.len() == 1 && errs[0].starts_with("stream.expected_start_interval"), "{errs:?}");
    let off = StreamSettings { expected_start_interval: Duration::ZERO, ..StreamSettings::default() };
    assert_eq!(StreamSection::of(&off).validate(&mut none), off);
}
