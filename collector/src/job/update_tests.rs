//! Attributes updated by later `submitted` events: table and property tests (`super::update`).

use super::*;
use proptest::prelude::*;
use startline_proto::pb;
use std::sync::Arc;

const T0: i64 = 1_767_225_600_000;
const S: i64 = 1000;

fn attrs(pool: &str, gpu_class: &str) -> JobAttrs {
    JobAttrs {
        pool_kind: pb::PoolKind::Dedicated,
        provider: "kueue".into(),
        pool: pool.into(),
        priority: pb::PriorityClass::Normal,
        gpu_class: gpu_class.into(),
        gpu_count: 8,
        node_count: 2,
        region: "europe-west4".into(),
        team: "vision".into(),
        project: String::new(),
        chain_id: String::new(),
        chain_stage: String::new(),
        labels: [("workload".to_string(), "job-sample-job-7f2c1".to_string())].into(),
    }
}

fn e(id: &str, at: i64, kind: EventKind) -> CompactEvent {
    CompactEvent { at_ms: at, id_hash: event_id_hash(id), seq: 0, attempt: None, kind }
}

fn sub(id: &str, at: i64, a: JobAttrs) -> CompactEvent {
    e(id, at, EventKind::Submitted(Arc::new(a)))
}

fn record(events: &[CompactEvent]) -> JobRecord {
    let mut r = JobRecord::default();
    for ev in events {
        r.insert(ev.clone());
    }
    r
}

#[test]
fn a_later_submitted_sets_the_gpu_class_and_pool_learned_at_admission() {
    // Submitted at the Workload's creation without a class and with the LocalQueue's name (its ClusterQueue not
    // readable yet); the update comes at admission.
    let first = sub("s", T0, attrs("team-a-queue", ""));
    let update = sub("s2", T0 + 600 * S, attrs("cluster-queue", "t4"));
    let queued = e(
        "q",
        T0 + 10 * S,
        EventKind::Queued { reason: pb::WaitReason::Quota, raw_reason: "Pending".into(), estimated_start: None },
    );
    let r = record(&[update.clone(), queued.clone(), first.clone()]);
    let a = r.timeline.attrs.as_deref().expect("attrs");
    assert_eq!((a.pool.as_str(), a.gpu_class.as_str()), ("cluster-queue", "t4"));
    assert_eq!(r.timeline.submitted_at, Some(T0), "the submit time stays the first's");
    assert_eq!(r.timeline.initial_wait_ms.iter().count(), 1, "an update is no transition");
    // A later submitted that leaves a field empty or zero keeps the earlier value; labels go as a whole.
    let mut sparse = attrs("", "");
    sparse.gpu_count = 0;
    sparse.team = "vision-2".into();
    sparse.labels = Default::default();
    let r = record(&[first.clone(), update.clone(), sub("s3", T0 + 700 * S, sparse)]);
    let a = r.timeline.attrs.as_deref().expect("attrs");
    assert_eq!((a.pool.as_str(), a.gpu_class.as_str(), a.gpu_count), ("cluster-queue", "t4", 8));
    assert_eq!((a.team.as_str(), a.labels.len()), ("vision-2", 1));
    // After `done` an update changes nothing (done is terminal), like any other event.
    let done = e("d", T0 + 300 * S, EventKind::Done { outcome: pb::Outcome::Cancelled, exit_code: None });
    let r = record(&[first.clone(), done, update]);
    assert_eq!(r.timeline.attrs.as_deref().map(|a| a.gpu_class.as_str()), Some(""));
    assert_eq!(r.timeline.ignored_after_done, 1);
    // The same attributes again: the first's shared value is kept (not a copy).
    let again = sub("s4", T0 + S, attrs("team-a-queue", ""));
    let r = record(&[first.clone(), again]);
    let EventKind::Submitted(orig) = &first.kind else { unreachable!() };
    assert_eq!(r.timeline.attrs.as_deref(), Some(&**orig));
}

fn arb_attrs() -> impl Strategy<Value = JobAttrs> {
    (
        prop::sample::select(vec!["", "lq", "cq-a", "cq-b"]),
        prop::sample::select(vec!["", "t4", "h100"]),
        0u32..3,
        prop::sample::select(vec![
            pb::PriorityClass::Unspecified,
            pb::PriorityClass::Normal,
            pb::PriorityClass::Urgent,
        ]),
        proptest::option::of(prop::sample::select(vec!["a", "b"])),
    )
        .prop_map(|(pool, class, gpus, priority, label)| JobAttrs {
            pool_kind: pb::PoolKind::Dedicated,
            provider: "kueue".into(),
            pool: pool.into(),
            priority,
            gpu_class: class.into(),
            gpu_count: gpus,
            node_count: 1,
            region: String::new(),
            team: String::new(),
            project: String::new(),
            chain_id: String::new(),
            chain_stage: String::new(),
            labels: label.map(|l| [("k".to_string(), l.to_string())].into()).unwrap_or_default(),
        })
}

fn arb_events() -> impl Strategy<Value = Vec<CompactEvent>> {
    let one = (0i64..600, 0u8..4, arb_attrs()).prop_map(|(t, k, a)| (t, k, a));
    proptest::collection::vec(one, 1..14).prop_map(|evs| {
        evs.into_iter()
            .enumerate()
            .map(|(i, (t, k, a))| {
                let at = T0 + t * S;
                let id = format!("e{i}");
                match k {
                    0 | 1 => sub(&id, at, a),
                    2 => e(
                        &id,
                        at,
                        EventKind::Queued {
                            reason: pb::WaitReason::Quota,
                            raw_reason: "Pending".into(),
                            estimated_start: None,
                        },
                    ),
                    _ => e(&id, at, EventKind::Done { outcome: pb::Outcome::Succeeded, exit_code: None }),
                }
            })
            .collect()
    })
}

/// The rule, written the plain way: over the events in canonical order, the first `submitted` gives the
/// attributes and each later one before the first `done` (stamped before the submit, it still ends the job)
/// replaces what it sets.
fn oracle(events: &[CompactEvent]) -> Option<JobAttrs> {
    let mut sorted: Vec<&CompactEvent> = events.iter().collect();
    sorted.sort_by_key(|e| e.sort_key());
    let mut out: Option<JobAttrs> = None;
    let mut done = false;
    for ev in sorted {
        match &ev.kind {
            EventKind::Submitted(a) if out.is_none() => out = Some((**a).clone()),
            EventKind::Submitted(a) if !done => {
                let o = out.as_mut().expect("set");
                let pick = |old: &mut String, new: &String| {
                    if !new.is_empty() {
                        old.clone_from(new)
                    }
                };
                pick(&mut o.pool, &a.pool);
                pick(&mut o.gpu_class, &a.gpu_class);
                if a.gpu_count > 0 {
                    o.gpu_count = a.gpu_count;
                }
                if a.priority != pb::PriorityClass::Unspecified {
                    o.priority = a.priority;
                }
                if !a.labels.is_empty() {
                    o.labels.clone_from(&a.labels);
                }
            }
            EventKind::Done { .. } => done = true,
            _ => {}
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The attributes follow the rule whatever order the events arrive in, inserted one by one (the record's
    /// incremental fold) or derived at once.
    #[test]
    fn updated_attributes_are_a_function_of_the_set_of_events(
        events in arb_events(),
        order in proptest::collection::vec(any::<prop::sample::Index>(), 0..40),
    ) {
        let mut shuffled = events.clone();
        for (i, ix) in order.iter().enumerate() {
            let n = shuffled.len();
            shuffled.swap(i % n, ix.index(n));
        }
        let mut sorted = events.clone();
        sorted.sort_by_key(|e| e.sort_key());
        let derived = Timeline::derive(&sorted);
        let mut r = JobRecord::default();
        for ev in &shuffled {
            r.insert(ev.clone());
            let mut so_far: Vec<CompactEvent> = r.events.clone();
            so_far.sort_by_key(|e| e.sort_key());
            prop_assert_eq!(&r.timeline, &Timeline::derive(&so_far), "incremental equals derive at every step");
        }
        prop_assert_eq!(&r.timeline, &derived);
        prop_assert_eq!(derived.attrs.as_deref().cloned(), oracle(&events));
    }
}
