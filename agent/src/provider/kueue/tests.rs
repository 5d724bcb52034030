//! Kueue adapter tests over Workload, Pod and Event objects in the shapes Kueue's and Kubernetes' documentation
//! show (`tests/fixtures/kueue/`, validated against Kueue's Workload CRD by `tests/tests/kueue.rs`).

use super::*;

fn fixture(name: &str) -> Value {
    let text = match name {
        "workload-pending-quota.json" => include_str!("../../../../tests/fixtures/kueue/workload-pending-quota.json"),
        "workload-inadmissible.json" => include_str!("../../../../tests/fixtures/kueue/workload-inadmissible.json"),
        "workload-admission-check-pending.json" => {
            include_str!("../../../../tests/fixtures/kueue/workload-admission-check-pending.json")
        }
        "workload-admitted.json" => include_str!("../../../../tests/fixtures/kueue/workload-admitted.json"),
        "workload-evicted.json" => include_str!("../../../../tests/fixtures/kueue/workload-evicted.json"),
        "workload-finished.json" => include_str!("../../../../tests/fixtures/kueue/workload-finished.json"),
        "pod-unschedulable.json" => include_str!("../../../../tests/fixtures/kueue/pod-unschedulable.json"),
        "pod-container-creating.json" => include_str!("../../../../tests/fixtures/kueue/pod-container-creating.json"),
        "event-pulling.json" => include_str!("../../../../tests/fixtures/kueue/event-pulling.json"),
        "workload-gpu-pending.json" => include_str!("../../../../tests/fixtures/kueue/workload-gpu-pending.json"),
        "workload-gpu-admitted.json" => include_str!("../../../../tests/fixtures/kueue/workload-gpu-admitted.json"),
        "workload-gpu-finished.json" => include_str!("../../../../tests/fixtures/kueue/workload-gpu-finished.json"),
        "workload-gpu-deleted.json" => include_str!("../../../../tests/fixtures/kueue/workload-gpu-deleted.json"),
        "workload-podsready-timeout-backoff.json" => {
            include_str!("../../../../tests/fixtures/kueue/workload-podsready-timeout-backoff.json")
        }
        "workload-podsready-timeout-backoff-finished.json" => {
            include_str!("../../../../tests/fixtures/kueue/workload-podsready-timeout-backoff-finished.json")
        }
        "resourceflavor-gpu.json" => include_str!("../../../../tests/fixtures/kueue/resourceflavor-gpu.json"),
        "localqueue-user-queue.json" => include_str!("../../../../tests/fixtures/kueue/localqueue-user-queue.json"),
        other => panic!("no fixture {other}"),
    };
    serde_json::from_str(text).expect("json")
}

fn workload(name: &str) -> Workload {
    parse_workload(&fixture(name)).expect("workload")
}

fn pod(name: &str, pod_name: &str) -> Pod {
    let mut v = fixture(name);
    v["metadata"]["name"] = pod_name.into();
    parse_pod(&v).expect("pod")
}

fn mapping() -> Mapping {
    Mapping {
        cluster: "gke-eu".into(),
        urgent_priority_classes: vec!["high-priority".into()],
        team_label: Some("team".into()),
        ..Default::default()
    }
}

fn ms(s: &str) -> i64 {
    startline_proto::rfc3339::parse_ms(s).expect("time")
}

fn kinds(evs: &[pb::LifecycleEvent]) -> Vec<String> {
    evs.iter()
        .map(|e| match e.kind.as_ref() {
            Some(Kind::Submitted(_)) => "submitted".into(),
            Some(Kind::Queued(q)) => format!("queued:{:?}:{}", q.reason(), q.raw_reason),
            Some(Kind::NodeAssigned(_)) => "node_assigned".into(),
            Some(Kind::Preparing(p)) => format!("preparing:{:?}", p.phase()),
            Some(Kind::FirstStep(_)) => "first_step".into(),
            Some(Kind::Preempted(_)) => "preempted".into(),
            Some(Kind::Requeued(_)) => "requeued".into(),
            Some(Kind::Done(d)) => format!("done:{:?}", d.outcome()),
            _ => "other".into(),
        })
        .collect()
}

fn at(e: &pb::LifecycleEvent) -> i64 {
    startline_proto::time::timestamp_to_ms(e.occurred_at.as_ref().expect("time"))
}

#[test]
fn the_documented_workload_parses_with_conditions_by_type() {
    let w = workload("workload-evicted.json");
    assert_eq!((w.namespace.as_str(), w.job_name.as_str(), w.owner_kind.as_str()), ("team-a", "sample-job", "Job"));
    assert_eq!((w.queue_name.as_str(), w.priority_class.as_str()), ("team-a-queue", "high-priority"));
    assert_eq!(w.pod_sets.len(), 1);
    assert_eq!((w.pod_sets[0].count, w.pod_sets[0].gpus_per_pod), (2, 4));
    // The Evicted condition is not first in the list; it is found by type.
    let e = w.conditions.get("Evicted").expect("evicted");
    assert!(e.status && e.reason == "Preempted");
    assert_eq!(e.at_ms, ms("2024-03-21T14:10:00Z"));
    let admitted = workload("workload-admitted.json");
    assert_eq!(
        (admitted.cluster_queue.as_str(), admitted.flavors.as_slice()),
        ("cluster-queue", &["h100".to_string()][..])
    );
    // v1beta2 names the priority class by reference.
    let mut v2 = fixture("workload-pending-quota.json");
    v2["apiVersion"] = "kueue.x-k8s.io/v1beta2".into();
    v2["spec"].as_object_mut().expect("spec").remove("priorityClassName");
    v2["spec"]["priorityClassRef"] =
        serde_json::json!({"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": "urgent"});
    assert_eq!(parse_workload(&v2).expect("v2").priority_class, "urgent");
}

#[test]
fn a_pod_belongs_to_its_jobset_then_kubeflow_job_then_job() {
    let p = pod("pod-unschedulable.json", "p");
    assert_eq!((p.job_name.as_str(), p.gpus), ("sample-job", 4));
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    assert_eq!(
        pod_job_name(&labels(&[
            ("batch.kubernetes.io/job-name", "llama-workers-0"),
            ("jobset.sigs.k8s.io/jobset-name", "llama")
        ])),
        Some("llama".into())
    );
    assert_eq!(pod_job_name(&labels(&[("training.kubeflow.org/job-name", "bert")])), Some("bert".into()));
    assert_eq!(pod_job_name(&labels(&[("app", "web")])), None);
    assert!(parse_pod(&serde_json::json!({"metadata": {"name": "web-1", "labels": {"app": "web"}}})).is_none());
    let e = parse_pull_event(&fixture("event-pulling.json")).expect("pull");
    assert_eq!((e.pod.as_str(), e.at_ms), ("sample-job-0-x7k2p", ms("2024-03-21T13:58:02Z")));
}

#[test]
fn quota_reasons_map_to_quota_misconfigured_or_hold() {
    use pb::WaitReason::*;
    let m = "couldn't assign flavors to pod set main: insufficient unused quota for cpu in flavor default-flavor, 1 more needed";
    assert_eq!(quota_wait_reason("Pending", m), Quota);
    assert_eq!(quota_wait_reason("WaitingForQuota", ""), Quota);
    assert_eq!(quota_wait_reason("Inadmissible", "LocalQueue user-queue doesn't exist"), Misconfigured);
    assert_eq!(quota_wait_reason("Inadmissible", "ClusterQueue cluster-queue is inactive"), Misconfigured);
    assert_eq!(quota_wait_reason("NoMatchingFlavor", ""), Misconfigured);
    assert_eq!(
        quota_wait_reason(
            "Pending",
            "couldn't assign flavors to pod set main: flavor h100 doesn't match node affinity"
        ),
        Misconfigured
    );
    assert_eq!(quota_wait_reason("Suspended", ""), DependencyOrHold);
    assert_eq!(quota_wait_reason("TopologyPlacementFailed", ""), Capacity);
}

#[test]
fn gpu_class_from_node_labels() {
    let l = |k: &str, v: &str| -> BTreeMap<String, String> { [(k.to_string(), v.to_string())].into() };
    assert_eq!(gpu_class(&l("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")), "h100");
    assert_eq!(gpu_class(&l("cloud.google.com/gke-accelerator", "nvidia-l4")), "l4");
    assert_eq!(gpu_class(&l("cloud.google.com/gke-accelerator", "nvidia-a100-80gb")), "a100");
    assert_eq!(gpu_class(&l("karpenter.k8s.aws/instance-gpu-name", "l40s")), "l40s");
    assert_eq!(gpu_class(&l("kubernetes.io/arch", "amd64")), "");
}

/// Runs the diff over successive states, carrying the memory, and returns every event.
fn replay(m: &Mapping, states: &[(JobObjects, i64)]) -> (Vec<pb::LifecycleEvent>, JobMemory) {
    let mut mem = JobMemory::default();
    let mut all = Vec::new();
    for (objs, now) in states {
        let (evs, new) = diff(m, "team-a", "sample-job", objs, &Lookups::default(), &mem, *now);
        all.extend(evs);
        mem = new;
    }
    (all, mem)
}

#[test]
fn a_kueue_job_goes_through_quota_provisioning_capacity_pull_eviction_and_finish() {
    let m = Mapping { first_step_on_start: true, ..mapping() };
    let pending = workload("workload-pending-quota.json");
    let checks = workload("workload-admission-check-pending.json");
    let admitted = workload("workload-admitted.json");
    let evicted = workload("workload-evicted.json");
    let finished = workload("workload-finished.json");
    let unsched = pod("pod-unschedulable.json", "sample-job-0-x7k2p");
    let unsched1 = pod("pod-unschedulable.json", "sample-job-1-q9z8d");
    let bound = pod("pod-container-creating.json", "sample-job-0-x7k2p");
    let mut bound1 = pod("pod-container-creating.json", "sample-job-1-q9z8d");
    bound1.scheduled.as_mut().expect("scheduled").at_ms = ms("2024-03-21T13:58:04Z");
    let pull = parse_pull_event(&fixture("event-pulling.json")).expect("pull");
    // The second attempt's pods, created after the eviction.
    let mut again = bound.clone();
    again.name = "sample-job-0-r2d2c".into();
    again.created_ms = ms("2024-03-21T14:20:01Z");
    again.scheduled.as_mut().expect("s").at_ms = ms("2024-03-21T14:21:00Z");
    let mut again1 = again.clone();
    again1.name = "sample-job-1-c3p0x".into();
    let now = ms("2024-03-21T16:00:00Z");
    fn objs<'a>(w: &'a Workload, pods: Vec<&'a Pod>, pulls: Vec<&'a PullEvent>) -> JobObjects<'a> {
        JobObjects { workload: Some(w), workload_deleted: false, pods, pulls }
    }
    // Each state seen twice (a relist, a replayed watch): nothing doubles.
    let states: Vec<(JobObjects, i64)> = vec![
        (objs(&pending, vec![], vec![]), now),
        (objs(&pending, vec![], vec![]), now),
        (objs(&checks, vec![], vec![]), now),
        (objs(&admitted, vec![&unsched, &unsched1], vec![]), now),
        (objs(&admitted, vec![&bound, &unsched1], vec![&pull]), now),
        (objs(&admitted, vec![&bound, &bound1], vec![&pull]), now),
        (objs(&admitted, vec![&bound, &bound1], vec![&pull]), now),
        (objs(&evicted, vec![], vec![]), now),
        (objs(&finished, vec![&again, &again1], vec![&pull]), now),
        (objs(&finished, vec![&again, &again1], vec![&pull]), now),
    ];
    let (evs, mem) = replay(&m, &states);
    assert_eq!(
        kinds(&evs),
        [
            "submitted",
            "queued:Quota:Pending",
            "submitted",
            "preparing:Provisioning",
            "queued:Capacity:Unschedulable",
            "node_assigned",
            "preparing:ImagePull",
            "preempted",
            "requeued",
            "queued:Quota:Pending",
            "node_assigned",
            "first_step",
            "done:Succeeded",
        ]
    );
    assert!(mem.done);
    let times: Vec<i64> = evs.iter().map(at).collect();
    assert_eq!(times[0], ms("2024-03-21T13:40:00Z"), "submitted at creation");
    assert_eq!(times[1], ms("2024-03-21T13:43:00Z"), "quota wait at the condition's transition");
    assert_eq!(times[2], ms("2024-03-21T13:50:00Z"), "the admission's ClusterQueue, learned at quota reservation");
    assert_eq!(times[3], ms("2024-03-21T13:50:00Z"));
    assert_eq!(times[4], ms("2024-03-21T13:55:02Z"));
    assert_eq!(times[5], ms("2024-03-21T13:58:04Z"), "assigned when the last of the two pods is bound");
    assert_eq!(times[6], ms("2024-03-21T13:58:02Z"));
    assert_eq!(times[7], ms("2024-03-21T14:10:00Z"));
    assert_eq!(times[10], ms("2024-03-21T14:21:00Z"), "the second attempt's binding");
    assert_eq!(times[11], ms("2024-03-21T14:23:00Z"), "PodsReady");
    assert_eq!(times[12], ms("2024-03-21T15:30:00Z"));
    match evs[0].kind.as_ref() {
        Some(Kind::Submitted(s)) => {
            assert_eq!((s.gpu_count, s.node_count, s.gpu_class.as_str()), (8, 2, "h100"));
            assert_eq!(
                (s.pool.as_str(), s.team.as_str(), s.priority()),
                ("team-a-queue", "vision", pb::PriorityClass::Urgent)
            );
            assert_eq!(s.pool_kind(), pb::PoolKind::Dedicated);
        }
        other => panic!("{other:?}"),
    }
    match evs[1].kind.as_ref() {
        Some(Kind::Queued(q)) => {
            assert!(q.message.starts_with("couldn't assign flavors to pod set main") && q.estimated_start.is_none())
        }
        other => panic!("{other:?}"),
    }
    match evs[2].kind.as_ref() {
        Some(Kind::Submitted(s)) => assert_eq!((s.pool.as_str(), s.gpu_class.as_str()), ("cluster-queue", "h100")),
        other => panic!("{other:?}"),
    }
    match evs[4].kind.as_ref() {
        Some(Kind::Queued(q)) => {
            assert!(q.message.starts_with("0/4 nodes are available: 4 Insufficient nvidia.com/gpu"))
        }
        other => panic!("{other:?}"),
    }
    match evs[7].kind.as_ref() {
        Some(Kind::Preempted(p)) => {
            assert_eq!(p.reason, "Preempted: Preempted to accommodate a higher priority Workload")
        }
        other => panic!("{other:?}"),
    }
    assert!(evs.iter().all(|e| e.job_id == "k8s/gke-eu/team-a/sample-job"));
    let ids: std::collections::BTreeSet<&str> = evs.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids.len(), evs.len(), "distinct ids");
    // Memory lost: the same objects give the same ids (the eviction's state: its preemption, requeue and wait).
    let (again_evs, _) = replay(&m, &states[7..8].iter().map(|(o, n)| (o.clone(), *n)).collect::<Vec<_>>());
    assert!(again_evs.iter().all(|e| ids.contains(e.event_id.as_str())), "deterministic ids");
}

/// Kubernetes writes `Z`, but an RFC 3339 offset is honoured: a wait that began at 12:00+02:00 began at 10:00 UTC
/// (it used to be read as 12:00 UTC, two hours late, and a `-05:00` time did not parse at all).
#[test]
fn offset_times_in_a_workload_are_dated_in_utc() {
    // `date -u -d 2024-01-01T09:00:00Z +%s%3N` and `date -u -d 2024-01-01T10:00:00Z +%s%3N`.
    const NINE_UTC: i64 = 1_704_099_600_000;
    const TEN_UTC: i64 = 1_704_103_200_000;
    let mut v = fixture("workload-pending-quota.json");
    v["metadata"]["creationTimestamp"] = "2024-01-01T04:00:00-05:00".into();
    v["status"]["conditions"][0]["lastTransitionTime"] = "2024-01-01T12:00:00+02:00".into();
    let w = parse_workload(&v).expect("workload");
    assert_eq!(w.created_ms, NINE_UTC, "04:00-05:00 is 09:00 UTC");
    assert_eq!(w.conditions.get("QuotaReserved").expect("condition").at_ms, TEN_UTC, "12:00+02:00 is 10:00 UTC");
    let (evs, _) = replay(&mapping(), &[(JobObjects { workload: Some(&w), ..Default::default() }, TEN_UTC + 60_000)]);
    assert_eq!(kinds(&evs), ["submitted", "queued:Quota:Pending"]);
    assert_eq!((at(&evs[0]), at(&evs[1])), (NINE_UTC, TEN_UTC));
}

#[test]
fn an_inadmissible_workload_is_misconfigured_with_kueues_message_and_a_deleted_one_is_cancelled() {
    let w = workload("workload-inadmissible.json");
    let now = ms("2024-03-21T14:00:00Z");
    let (evs, mem) = replay(
        &mapping(),
        &[
            (JobObjects { workload: Some(&w), ..Default::default() }, now),
            (JobObjects { workload: Some(&w), workload_deleted: true, ..Default::default() }, now),
        ],
    );
    assert_eq!(kinds(&evs), ["submitted", "queued:Misconfigured:Inadmissible", "done:Cancelled"]);
    match evs[1].kind.as_ref() {
        Some(Kind::Queued(q)) => assert_eq!(q.message, "LocalQueue team-a-queue doesn't exist"),
        other => panic!("{other:?}"),
    }
    assert_eq!(at(&evs[2]), now);
    assert!(mem.done);
}

#[test]
fn the_pool_is_the_cluster_queue_from_flags_admission_or_the_local_queue_object() {
    let w = workload("workload-pending-quota.json");
    let pool = |m: &Mapping, look: &Lookups| match diff(
        m,
        "team-a",
        "sample-job",
        &JobObjects { workload: Some(&w), ..Default::default() },
        look,
        &JobMemory::default(),
        0,
    )
    .0[0]
        .kind
        .as_ref()
    {
        Some(Kind::Submitted(s)) => s.pool.clone(),
        other => panic!("{other:?}"),
    };
    let mut m = mapping();
    let look = Lookups { cluster_queue: Some("cq-from-lq".into()), ..Default::default() };
    assert_eq!(pool(&m, &look), "cq-from-lq");
    m.queues.insert("team-a/team-a-queue".into(), "cq-flag".into());
    assert_eq!(pool(&m, &look), "cq-flag");
    let a = workload("workload-admitted.json");
    let (evs, _) = diff(
        &mapping(),
        "team-a",
        "sample-job",
        &JobObjects { workload: Some(&a), ..Default::default() },
        &Lookups::default(),
        &JobMemory::default(),
        0,
    );
    assert!(matches!(evs[0].kind.as_ref(), Some(Kind::Submitted(s)) if s.pool == "cluster-queue"));
}

#[test]
fn a_plain_job_is_followed_on_pod_signals_alone() {
    let m = Mapping { first_step_on_start: true, ..mapping() };
    let unsched = pod("pod-unschedulable.json", "sample-job-0-x7k2p");
    let mut running = pod("pod-container-creating.json", "sample-job-0-x7k2p");
    running.ready = Some(Condition {
        status: true,
        reason: String::new(),
        message: String::new(),
        at_ms: ms("2024-03-21T14:00:00Z"),
    });
    let mut ended = running.clone();
    ended.phase = "Succeeded".into();
    ended.finished_ms = Some(ms("2024-03-21T15:00:00Z"));
    let now = ms("2024-03-21T16:00:00Z");
    fn o(p: &Pod) -> JobObjects<'_> {
        JobObjects { pods: vec![p], ..Default::default() }
    }
    let (evs, mem) = replay(&m, &[(o(&unsched), now), (o(&running), now), (o(&ended), now)]);
    assert_eq!(
        kinds(&evs),
        ["submitted", "queued:Capacity:Unschedulable", "node_assigned", "first_step", "done:Succeeded"]
    );
    assert_eq!(at(&evs[0]), ms("2024-03-21T13:55:01Z"), "the first pod's creation");
    assert_eq!(at(&evs[4]), ms("2024-03-21T15:00:00Z"));
    assert!(matches!(evs[0].kind.as_ref(), Some(Kind::Submitted(s)) if s.pool == "plain" && s.gpu_count == 4));
    assert!(mem.done);
}

#[test]
fn a_queue_position_rides_on_queued_and_a_move_sends_a_new_one() {
    let w = workload("workload-pending-quota.json");
    let m = mapping();
    let t0 = ms("2024-03-21T14:00:00Z");
    let objs = JobObjects { workload: Some(&w), ..Default::default() };
    let mut mem = JobMemory::default();
    let mut all = Vec::new();
    // Positions seen on successive looks: the first rides on the wait's Queued; 40 -> 38 is under a fifth (not
    // news); 38 -> 25 is; inside the first ten every change is; the same position twice sends nothing.
    for (i, p) in [40u64, 38, 25, 25, 9, 8, 0].into_iter().enumerate() {
        let look = Lookups { position: Some(p), ..Default::default() };
        let (evs, new) = diff(&m, "team-a", "sample-job", &objs, &look, &mem, t0 + i as i64 * 60_000);
        all.extend(evs);
        mem = new;
    }
    let positions: Vec<(Option<u32>, i64)> = all
        .iter()
        .filter_map(|e| match e.kind.as_ref() {
            Some(Kind::Queued(q)) => Some((q.queue_position, at(e))),
            _ => None,
        })
        .collect();
    let first_at = positions[0].1;
    assert_eq!(
        positions,
        [
            (Some(40), first_at),
            (Some(25), t0 + 2 * 60_000),
            (Some(9), t0 + 4 * 60_000),
            (Some(8), t0 + 5 * 60_000),
            (Some(0), t0 + 6 * 60_000)
        ]
    );
    let ids: std::collections::BTreeSet<&str> = all.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids.len(), all.len(), "every event has its own id");
    // Every Queued keeps the wait's reason; the message says the position.
    for e in &all {
        if let Some(Kind::Queued(q)) = e.kind.as_ref() {
            assert_eq!(q.raw_reason, "Pending");
            assert!(q.message.ends_with(&format!("(position {} in ClusterQueue)", q.queue_position.unwrap_or(99))));
        }
    }
    // Replaying the same looks against the final memory sends nothing again.
    let look = Lookups { position: Some(0), ..Default::default() };
    assert!(diff(&m, "team-a", "sample-job", &objs, &look, &mem, t0 + 3_600_000).0.is_empty());
}

#[test]
fn position_moves_worth_reporting() {
    use super::position_moved;
    assert!(position_moved(None, 500));
    assert!(!position_moved(Some(500), 500));
    assert!(!position_moved(Some(500), 450), "a tenth of a long queue");
    assert!(position_moved(Some(500), 400), "a fifth");
    assert!(position_moved(Some(12), 9), "into the first ten");
    assert!(position_moved(Some(3), 2));
    assert!(position_moved(Some(2), 7), "backwards too (a higher-priority Workload arrived)");
}

/// The GPU job of Kueue's provisioning example: its pod template names no GPU model; Kueue picks the flavor (and
/// so the class) at admission, and the flavor's node labels say which GPU it is.
fn gpu_flavor_labels() -> BTreeMap<String, String> {
    string_map(&fixture("resourceflavor-gpu.json")["spec"]["nodeLabels"])
}

fn submitted_of(e: &pb::LifecycleEvent) -> &pb::Submitted {
    match e.kind.as_ref() {
        Some(Kind::Submitted(s)) => s,
        other => panic!("not submitted: {other:?}"),
    }
}

/// Submitted goes out when the Workload is created, before admission picks the flavor, so the GPU class (and,
/// while the LocalQueue could not be read, the ClusterQueue) was missing from every job. The admission brings
/// them: a `submitted` with the job's attributes as now known, dated at the quota reservation, updates the job.
#[test]
fn the_gpu_class_and_cluster_queue_learned_at_admission_reach_the_job() {
    let m = mapping();
    let pending = workload("workload-gpu-pending.json");
    let admitted = workload("workload-gpu-admitted.json");
    assert_eq!(admitted.flavors.first().map(String::as_str), Some("tas-gpu-default"), "the GPU's flavor first");
    let id = |w: &Workload| (w.namespace.clone(), w.job_name.clone());
    let (ns, job) = id(&pending);
    let now = ms("2024-05-03T20:10:00Z");
    // Pending, the LocalQueue not readable (yet): the LocalQueue's name and no class.
    let objs = JobObjects { workload: Some(&pending), ..Default::default() };
    let (evs, mem) = diff(&m, &ns, &job, &objs, &Lookups::default(), &JobMemory::default(), now);
    assert_eq!(kinds(&evs), ["submitted", "queued:Quota:Pending"]);
    let s = submitted_of(&evs[0]);
    assert_eq!((s.pool.as_str(), s.gpu_class.as_str(), s.gpu_count, s.node_count), ("user-queue", "", 3, 3));
    // Admitted to the GPU flavor: one update with the ClusterQueue and the class from the flavor's node labels.
    let look = Lookups { flavor_labels: gpu_flavor_labels(), ..Default::default() };
    let objs = JobObjects { workload: Some(&admitted), ..Default::default() };
    let (evs, mem) = diff(&m, &ns, &job, &objs, &look, &mem, now);
    assert_eq!(kinds(&evs), ["submitted"]);
    let s = submitted_of(&evs[0]);
    assert_eq!((s.pool.as_str(), s.gpu_class.as_str(), s.gpu_count), ("cluster-queue", "t4", 3));
    assert_eq!(at(&evs[0]), ms("2024-05-03T20:01:59Z"), "dated at the quota reservation");
    assert_eq!(evs[0].job_id, "k8s/gke-eu/default/sample-job-8c7d2");
    assert!(evs[0].event_id.ends_with(&format!(":attributes:{}", ms("2024-05-03T20:01:59Z"))));
    startline_proto::validate::validate_event(&evs[0], i64::MAX / 4, &Default::default()).expect("valid");
    // Seen again (a relist, a restart with the memory): nothing more.
    assert!(diff(&m, &ns, &job, &objs, &look, &mem, now + 60_000).0.is_empty());
    // The flavor not readable either: the class from the pods, which Kueue gave the flavor's node labels.
    let mut pod = pod("pod-container-creating.json", "sample-job-8c7d2-0-abcde");
    pod.node_selector = gpu_flavor_labels();
    let (_, mem1) = diff(
        &m,
        &ns,
        &job,
        &JobObjects { workload: Some(&pending), ..Default::default() },
        &Lookups::default(),
        &JobMemory::default(),
        now,
    );
    let objs = JobObjects { workload: Some(&admitted), pods: vec![&pod], ..Default::default() };
    let (evs, _) = diff(&m, &ns, &job, &objs, &Lookups::default(), &mem1, now);
    assert_eq!(submitted_of(&evs[0]).gpu_class, "t4");
    // A flavor named for its GPU says the class by its name alone.
    let mut h100 = admitted.clone();
    h100.flavors = vec!["h100-80gb".into(), "default-flavor".into()];
    let (evs, _) = diff(
        &m,
        &ns,
        &job,
        &JobObjects { workload: Some(&h100), ..Default::default() },
        &Lookups::default(),
        &mem1,
        now,
    );
    assert_eq!(submitted_of(&evs[0]).gpu_class, "h100");
    // Evicted (the admission gone), nothing better known: the attributes sent stand, no update.
    let mut evicted = pending.clone();
    evicted.conditions.get_mut("QuotaReserved").expect("quota").at_ms = ms("2024-05-03T20:40:00Z");
    let (evs, _) = diff(
        &m,
        &ns,
        &job,
        &JobObjects { workload: Some(&evicted), ..Default::default() },
        &Lookups::default(),
        &mem,
        now,
    );
    assert!(!kinds(&evs).contains(&"submitted".to_string()), "{:?}", kinds(&evs));
}

#[test]
fn a_flavor_name_spells_a_gpu_class_only_as_a_word() {
    assert_eq!(gpu_class_named("h100"), "h100");
    assert_eq!(gpu_class_named("spot-A100-80gb"), "a100");
    assert_eq!(gpu_class_named("nvidia-tesla-t4"), "t4");
    assert_eq!(gpu_class_named("default-flavor"), "");
    assert_eq!(gpu_class_named("pool4"), "", "not a word of its own");
    assert_eq!(gpu_class_named("tas-gpu-default"), "");
}

/// The pool is the ClusterQueue the quota is shared in: before admission the LocalQueue object's
/// `spec.clusterQueue` (Kueue's documented LocalQueue), once admitted `status.admission.clusterQueue`.
#[test]
fn the_pool_is_the_local_queues_cluster_queue_before_admission_and_the_admissions_after() {
    let m = mapping();
    let lq = fixture("localqueue-user-queue.json");
    let cq = lq["spec"]["clusterQueue"].as_str().map(str::to_string);
    let pending = workload("workload-gpu-pending.json");
    let (ns, job) = (pending.namespace.clone(), pending.job_name.clone());
    let now = ms("2024-05-03T20:10:00Z");
    let look = Lookups { cluster_queue: cq.clone(), ..Default::default() };
    let (evs, mem) = diff(
        &m,
        &ns,
        &job,
        &JobObjects { workload: Some(&pending), ..Default::default() },
        &look,
        &JobMemory::default(),
        now,
    );
    assert_eq!(submitted_of(&evs[0]).pool, "cluster-queue", "from the LocalQueue object");
    // Admitted to another ClusterQueue than the LocalQueue pointed at when it was read: the admission's wins.
    let mut admitted = workload("workload-gpu-admitted.json");
    admitted.cluster_queue = "gpu-cluster-queue".into();
    let look = Lookups { cluster_queue: cq, flavor_labels: gpu_flavor_labels(), ..Default::default() };
    let (evs, _) =
        diff(&m, &ns, &job, &JobObjects { workload: Some(&admitted), ..Default::default() }, &look, &mem, now);
    let s = submitted_of(&evs[0]);
    assert_eq!((s.pool.as_str(), s.gpu_class.as_str()), ("gpu-cluster-queue", "t4"));
    // First seen admitted: one submitted with everything, no update.
    let (evs, _) = diff(
        &m,
        &ns,
        &job,
        &JobObjects { workload: Some(&admitted), ..Default::default() },
        &look,
        &JobMemory::default(),
        now,
    );
    assert_eq!(kinds(&evs).iter().filter(|k| *k == "submitted").count(), 1);
    assert_eq!(submitted_of(&evs[0]).pool, "gpu-cluster-queue");
}

/// After an eviction for the PodsReady timeout Kueue holds the Workload back (`requeueState.requeueAt`) before
/// requeueing it; its `QuotaReserved=False` carries the eviction's message. That backoff used to be reported as
/// a quota wait; it is recovery from the eviction, until the requeue, and the quota wait begins at the requeue.
#[test]
fn a_requeue_backoff_after_a_pods_ready_timeout_is_not_a_quota_wait() {
    let m = mapping();
    let admitted = workload("workload-gpu-admitted.json");
    let backoff = workload("workload-podsready-timeout-backoff.json");
    let after = workload("workload-podsready-timeout-backoff-finished.json");
    assert_eq!((backoff.requeue_at_ms, backoff.requeue_count), (Some(ms("2024-05-03T20:33:00Z")), Some(1)));
    let (ns, job) = (admitted.namespace.clone(), admitted.job_name.clone());
    let now = ms("2024-05-03T20:40:00Z");
    let mut mem = JobMemory::default();
    let mut all = Vec::new();
    let pending = workload("workload-gpu-pending.json");
    for w in [&pending, &admitted, &backoff, &backoff, &after, &after] {
        let (evs, next) = diff(
            &m,
            &ns,
            &job,
            &JobObjects { workload: Some(w), ..Default::default() },
            &Lookups::default(),
            &mem,
            now,
        );
        all.extend(evs);
        mem = next;
    }
    assert_eq!(
        kinds(&all),
        [
            "submitted",
            "queued:Quota:Pending",
            "submitted",
            "preempted",
            "queued:PreemptionRecovery:PodsReadyTimeout",
            "requeued",
            "queued:Quota:Pending"
        ]
    );
    let all = all.split_off(2);
    let times: Vec<i64> = all.iter().map(at).collect();
    assert_eq!(times[1], ms("2024-05-03T20:31:59Z"), "evicted");
    assert_eq!(times[2], ms("2024-05-03T20:32:00Z"), "the backoff, from when Kueue stopped the job");
    assert_eq!(times[3], ms("2024-05-03T20:33:00Z"), "requeued when the backoff finished");
    assert_eq!(times[4], ms("2024-05-03T20:33:00Z"), "the quota wait begins at the requeue, not at the eviction");
    let Some(Kind::Queued(q)) = &all[2].kind else { panic!("queued") };
    assert!(q.message.contains("Exceeded the PodsReady timeout"), "{}", q.message);
    assert!(
        q.message.contains("requeued at 2024-05-03T20:33:00") && q.message.ends_with("(backoff requeue 1)"),
        "{}",
        q.message
    );
    let Some(Kind::Preempted(p)) = &all[1].kind else { panic!("preempted") };
    assert!(p.reason.starts_with("PodsReadyTimeout: "), "{}", p.reason);
    for e in &all {
        startline_proto::validate::validate_event(e, i64::MAX / 4, &Default::default()).expect("valid");
    }
}

/// A Workload deleted while the adapter was down comes back as the DELETED watch event's object (replayed from
/// the persisted resourceVersion): its `deletionTimestamp` dates the end, not the moment the adapter saw it.
#[test]
fn a_deleted_workload_is_dated_by_its_deletion_timestamp() {
    let m = mapping();
    let running = workload("workload-gpu-finished.json");
    let mut running = running.clone();
    running.conditions.remove("Finished");
    let deleted = workload("workload-gpu-deleted.json");
    assert_eq!(deleted.deleted_ms, Some(ms("2024-05-03T20:30:00Z")));
    let (ns, job) = (deleted.namespace.clone(), deleted.job_name.clone());
    let seen = ms("2024-05-03T23:00:00Z");
    let (_, mem) = diff(
        &m,
        &ns,
        &job,
        &JobObjects { workload: Some(&running), ..Default::default() },
        &Lookups::default(),
        &JobMemory::default(),
        seen,
    );
    let objs = JobObjects { workload: Some(&deleted), workload_deleted: true, ..Default::default() };
    let (evs, mem) = diff(&m, &ns, &job, &objs, &Lookups::default(), &mem, seen);
    assert_eq!(kinds(&evs), ["done:Cancelled"]);
    assert_eq!(at(&evs[0]), ms("2024-05-03T20:30:00Z"), "the deletion, not the adapter's restart");
    assert!(mem.done);
    // Finished before it was deleted: the Finished condition dates it (and says how it ended).
    let finished = workload("workload-gpu-finished.json");
    let (evs, _) = diff(
        &m,
        &ns,
        &job,
        &JobObjects { workload: Some(&finished), workload_deleted: true, ..Default::default() },
        &Lookups::default(),
        &JobMemory::default(),
        seen,
    );
    let done = evs.iter().find(|e| matches!(e.kind, Some(Kind::Done(_)))).expect("done");
    assert_eq!(at(done), ms("2024-05-03T21:10:00Z"));
}

/// The adapter is down from before admission until after the job finished: on its return the Workload says only
/// where it is now. The transitions its conditions date are rebuilt (marked `reconstructed:` in their event ids
/// and in their messages): the admission ends the quota wait (the pods, gone with the finished job, were never
/// seen: preparing from the admission), the first step at `PodsReady`, the end at `Finished`.
#[test]
fn an_outage_from_before_admission_to_after_the_finish_is_rebuilt_from_the_conditions() {
    let m = Mapping { first_step_on_start: true, ..mapping() };
    let pending = workload("workload-gpu-pending.json");
    let finished = workload("workload-gpu-finished.json");
    let (ns, job) = (pending.namespace.clone(), pending.job_name.clone());
    let look = Lookups { flavor_labels: gpu_flavor_labels(), ..Default::default() };
    let (before, mem) = diff(
        &m,
        &ns,
        &job,
        &JobObjects { workload: Some(&pending), ..Default::default() },
        &Lookups::default(),
        &JobMemory::default(),
        ms("2024-05-03T20:00:30Z"),
    );
    assert_eq!(kinds(&before), ["submitted", "queued:Quota:Pending"]);
    let back = ms("2024-05-03T23:00:00Z");
    let objs = JobObjects { workload: Some(&finished), ..Default::default() };
    let (evs, mem) = diff(&m, &ns, &job, &objs, &look, &mem, back);
    assert_eq!(kinds(&evs), ["submitted", "preparing:Other", "first_step", "done:Succeeded"]);
    let times: Vec<i64> = evs.iter().map(at).collect();
    assert_eq!(times[0], ms("2024-05-03T20:01:59Z"), "the class learned at the reservation");
    assert_eq!(times[1], ms("2024-05-03T20:01:59Z"), "admitted: the quota wait ends");
    assert_eq!(times[2], ms("2024-05-03T20:04:30Z"), "PodsReady");
    assert_eq!(times[3], ms("2024-05-03T21:10:00Z"), "Finished");
    assert!(evs[1].event_id.contains(":reconstructed:admitted:"), "{}", evs[1].event_id);
    let Some(Kind::Preparing(p)) = &evs[1].kind else { panic!("preparing") };
    assert!(p.message.ends_with(RECONSTRUCTED), "{}", p.message);
    assert!(mem.done);
    // Nothing seen at all before the end: the quota wait too, from the Workload's creation to the reservation.
    let (evs, _) = diff(&m, &ns, &job, &objs, &look, &JobMemory::default(), back);
    assert_eq!(kinds(&evs), ["submitted", "queued:Quota:", "preparing:Other", "first_step", "done:Succeeded"]);
    assert_eq!(at(&evs[1]), ms("2024-05-03T20:00:00Z"));
    assert!(evs[1].event_id.contains(":reconstructed:queued:"));
    // The same objects again (a replayed watch, a relist): the same ids, nothing new.
    let (again, _) = diff(&m, &ns, &job, &objs, &look, &JobMemory::default(), back + 60_000);
    let ids = |v: &[pb::LifecycleEvent]| v.iter().map(|e| e.event_id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&again), ids(&evs));
    // Seen live (its pods bound, pulled): nothing is rebuilt.
    let (_, mem) = diff(
        &m,
        &ns,
        &job,
        &JobObjects { workload: Some(&pending), ..Default::default() },
        &look,
        &JobMemory::default(),
        back,
    );
    let mut bound = pod("pod-container-creating.json", "sample-job-8c7d2-0-abcde");
    bound.created_ms = ms("2024-05-03T20:02:00Z");
    bound.scheduled.as_mut().expect("scheduled").at_ms = ms("2024-05-03T20:02:30Z");
    let mut pods: Vec<Pod> = Vec::new();
    for i in 0..3 {
        let mut p = bound.clone();
        p.name = format!("sample-job-8c7d2-{i}-abcde");
        pods.push(p);
    }
    let objs = JobObjects { workload: Some(&finished), pods: pods.iter().collect(), ..Default::default() };
    let (evs, _) = diff(&m, &ns, &job, &objs, &look, &mem, back);
    assert!(evs.iter().all(|e| !e.event_id.contains("reconstructed")), "{:?}", kinds(&evs));
    assert!(kinds(&evs).contains(&"node_assigned".to_string()));
}

/// A job whose Workload and pods are gone from the first complete listing after a restart, with no deletion
/// replayed (the saved watch position was compacted, or never saved): cancelled, dated when noticed, and said so.
#[test]
fn a_job_gone_while_the_adapter_was_away_without_a_trace_ends_when_noticed() {
    let m = mapping();
    let pending = workload("workload-gpu-pending.json");
    let (ns, job) = (pending.namespace.clone(), pending.job_name.clone());
    let (_, mem) = diff(
        &m,
        &ns,
        &job,
        &JobObjects { workload: Some(&pending), ..Default::default() },
        &Lookups::default(),
        &JobMemory::default(),
        ms("2024-05-03T20:00:30Z"),
    );
    let id = startline_id(&m, &ns, &job);
    let noticed = ms("2024-05-03T23:00:00Z");
    let (evs, mem) = vanished(&m, &id, &mem, noticed);
    assert_eq!(kinds(&evs), ["done:Cancelled"]);
    assert_eq!((at(&evs[0]), evs[0].event_id.clone()), (noticed, format!("{id}:done")));
    let Some(Kind::Done(d)) = &evs[0].kind else { panic!("done") };
    assert!(d.message.contains("time unknown"), "{}", d.message);
    assert!(mem.done);
    assert!(vanished(&m, &id, &mem, noticed + 1).0.is_empty(), "once");
    assert!(vanished(&m, &id, &JobMemory::default(), noticed).0.is_empty(), "never reported: nothing to end");
}
