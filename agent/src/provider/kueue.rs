//! The Kubernetes/Kueue adapter (`startline-agent kueue`). Pure core: [`parse_workload`], [`parse_pod`] and
//! [`parse_pull_event`] read Kueue Workloads (`kueue.x-k8s.io` v1beta1 or v1beta2: both are served by current
//! Kueue, v1beta2 is stored), core/v1 Pods and core/v1 Events (image `Pulling`) as the API server serves them,
//! and [`diff`] turns one job's objects plus its memory into lifecycle events. Shell: [`watch`] (kube-rs
//! client, own list + watch loop) and [`run`].
//!
//! # Job identity
//! One Startline job per Workload's owner: `k8s/<cluster>/<namespace>/<owner name>`, the owner being the
//! Workload's controller (`ownerReferences`: a Job, JobSet, PyTorchJob, ...; a Workload without one is its own
//! owner). Pods carry the same name in a label (`jobset.sigs.k8s.io/jobset-name`, then
//! `training.kubeflow.org/job-name`, then `batch.kubernetes.io/job-name` or the legacy `job-name`), so
//! [`pod_job_name`] finds the job of a pod, and the node agent inside every pod derives the same id from the
//! downward API ([`crate::node::job_from_env`]). A name reused after its job was deleted is the same job id.
//!
//! # Transitions (conditions are read by type, never by position)
//! - `submitted` at the Workload's `creationTimestamp`: pool = the ClusterQueue (`--queue LQ=CQ`, else the
//!   admission's, else the LocalQueue object's `spec.clusterQueue`, else the LocalQueue name), team = a
//!   configured label or the namespace, urgent when the priority class is listed, GPUs = Σ pod sets × count ×
//!   (`nvidia.com/gpu`/`amd.com/gpu`, requests or limits), GPU class from the flavor's node labels or the pod
//!   template's nodeSelector;
//! - `QuotaReserved=False` -> `queued` (quota, or misconfigured for `Inadmissible`, `NoMatchingFlavor`,
//!   `Misconfigured`, `ExceedsMaxQuota`; dependency_or_hold for `Suspended`, `OnHold`) with Kueue's reason and
//!   message kept raw, dated at the condition's `lastTransitionTime`; Kueue's position in the ClusterQueue (from
//!   the visibility API, when reachable) is `queue_position` and appended to the message, and a move of it
//!   ([`position_moved`]) sends a new `queued` with the same reason, dated when seen. `estimated_start` stays
//!   unset: Kueue gives a position, not a time;
//! - quota reserved with an admission check `Pending` (e.g. ProvisioningRequest) -> `preparing:provisioning`;
//! - pods `PodScheduled=False/Unschedulable` -> `queued:capacity` with the scheduler's message;
//! - every expected pod (Σ pod set counts) bound -> `node_assigned` at the last binding;
//! - a `Pulling` event of a pod -> `preparing:image_pull` at the first pull;
//! - `Evicted=True` -> `preempted` (reason `<Reason>: <message>`: Preempted, PodsReadyTimeout, NodeFailures, ...);
//!   `Requeued=True` after an eviction -> `requeued`;
//! - `Finished=True` -> `done` (Succeeded -> succeeded, Failed -> failed, others -> cancelled); a Workload deleted
//!   before it finished -> `done` cancelled;
//! - with `--first-step-on-start` (jobs without a node agent): `PodsReady=True` (or, without Kueue, every pod
//!   ready) -> `first_step`.
//!
//! Each attempt's pod-level transitions are keyed by the eviction that began it (`<key>:<eviction ms>`), every
//! wait by its condition's transition time, so re-reading the same objects (a relist, a replayed watch, an
//! adapter restart) gives the same event ids.
//!
//! Plain Kubernetes Jobs/JobSets without Kueue (`--plain-jobs`): pods with a job label and no Workload are
//! followed on pod signals alone (submitted at the first pod's creation, capacity, node_assigned, image pull,
//! first step with `--first-step-on-start`, done when every pod ended: the last pod to end decides the outcome).

pub mod watch;

use super::JobMemory;
use serde_json::Value;
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_proto::rfc3339::json_ms;
use std::collections::{BTreeMap, HashMap};

/// GPU resource names counted in pod specs.
pub const GPU_RESOURCES: [&str; 2] = ["nvidia.com/gpu", "amd.com/gpu"];

/// Pod labels naming the job a pod belongs to, most specific first (a JobSet's pods also carry their child Job's
/// name).
pub const JOB_LABELS: [&str; 4] =
    ["jobset.sigs.k8s.io/jobset-name", "training.kubeflow.org/job-name", "batch.kubernetes.io/job-name", "job-name"];

/// One status condition.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Condition {
    /// `status` is "True".
    pub status: bool,
    /// `reason`.
    pub reason: String,
    /// `message`.
    pub message: String,
    /// `lastTransitionTime`, Unix ms.
    pub at_ms: i64,
}

/// One pod set of a Workload.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodSet {
    /// `name`.
    pub name: String,
    /// `count`.
    pub count: u32,
    /// GPUs one pod asks for.
    pub gpus_per_pod: u32,
    /// The pod template's nodeSelector.
    pub node_selector: BTreeMap<String, String>,
}

/// An admission check's state.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AdmissionCheck {
    /// `name`.
    pub name: String,
    /// `state` (Pending, Ready, Retry, Rejected).
    pub state: String,
    /// `message`.
    pub message: String,
    /// `lastTransitionTime`, Unix ms.
    pub at_ms: i64,
}

/// A Workload as the adapter sees it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Workload {
    /// Namespace.
    pub namespace: String,
    /// Workload name.
    pub name: String,
    /// The owner's name (the job), or the Workload's own name.
    pub job_name: String,
    /// The owner's kind (Job, JobSet, PyTorchJob, ...; empty without an owner).
    pub owner_kind: String,
    /// `creationTimestamp`, Unix ms.
    pub created_ms: i64,
    /// `spec.queueName` (the LocalQueue).
    pub queue_name: String,
    /// `spec.priorityClassName` (v1beta1) or `spec.priorityClassRef.name` (v1beta2), else the pod template's.
    pub priority_class: String,
    /// Pod sets.
    pub pod_sets: Vec<PodSet>,
    /// Conditions by type.
    pub conditions: HashMap<String, Condition>,
    /// `status.admission.clusterQueue`.
    pub cluster_queue: String,
    /// Flavors assigned (any resource of any pod set): those of GPU resources first, then the others, each once.
    pub flavors: Vec<String>,
    /// `status.admissionChecks`.
    pub admission_checks: Vec<AdmissionCheck>,
    /// Metadata labels merged over the first pod set's template labels.
    pub labels: BTreeMap<String, String>,
    /// `metadata.deletionTimestamp`: when the Workload's deletion was asked for (Unix ms).
    pub deleted_ms: Option<i64>,
    /// `status.requeueState.requeueAt`: the end of a requeue backoff (after a PodsReady timeout), Unix ms.
    pub requeue_at_ms: Option<i64>,
    /// `status.requeueState.count`: backoff requeues so far.
    pub requeue_count: Option<u64>,
}

/// A pod as the adapter sees it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Pod {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// The job it belongs to ([`pod_job_name`]).
    pub job_name: String,
    /// `creationTimestamp`, Unix ms.
    pub created_ms: i64,
    /// `spec.nodeName`.
    pub node: String,
    /// `status.phase`.
    pub phase: String,
    /// `PodScheduled` condition.
    pub scheduled: Option<Condition>,
    /// `Ready` condition.
    pub ready: Option<Condition>,
    /// When the pod's last container ended (terminated `finishedAt`), for ended pods.
    pub finished_ms: Option<i64>,
    /// GPUs the pod asks for.
    pub gpus: u32,
    /// `spec.nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// `spec.priorityClassName`.
    pub priority_class: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

/// An image pull started for a pod (a core/v1 Event with reason `Pulling`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PullEvent {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// When the pull began (`firstTimestamp`, else `eventTime`), Unix ms.
    pub at_ms: i64,
    /// The event's message (`Pulling image "..."`).
    pub message: String,
}

fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|o| o.iter().filter_map(|(k, x)| Some((k.clone(), x.as_str()?.to_string()))).collect())
        .unwrap_or_default()
}

fn conditions(v: &Value) -> HashMap<String, Condition> {
    let mut out = HashMap::new();
    for c in v.as_array().into_iter().flatten() {
        let Some(t) = c["type"].as_str() else { continue };
        out.insert(
            t.to_string(),
            Condition {
                status: c["status"].as_str() == Some("True"),
                reason: c["reason"].as_str().unwrap_or("").to_string(),
                message: c["message"].as_str().unwrap_or("").to_string(),
                at_ms: json_ms(&c["lastTransitionTime"]).unwrap_or(0),
            },
        );
    }
    out
}

/// A Kubernetes quantity as a whole count (GPUs are integers; "2", 2 and "2.0" are 2).
fn quantity(v: &Value) -> u32 {
    match v {
        Value::Number(n) => n.as_u64().map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
        Value::String(s) => s.trim().parse::<f64>().map_or(0, |f| f.max(0.0) as u32),
        _ => 0,
    }
}

/// GPUs a pod spec asks for: per container the larger of requests and limits (a GPU limit alone implies the
/// request), summed over containers; an init container may need more than that sum, and the pod gets the larger.
pub fn pod_spec_gpus(spec: &Value) -> u32 {
    let per = |c: &Value| -> u32 {
        GPU_RESOURCES
            .iter()
            .map(|r| quantity(&c["resources"]["requests"][r]).max(quantity(&c["resources"]["limits"][r])))
            .sum()
    };
    let main: u32 = spec["containers"].as_array().into_iter().flatten().map(per).sum();
    let init = spec["initContainers"].as_array().into_iter().flatten().map(per).max().unwrap_or(0);
    main.max(init)
}

/// The job a pod belongs to, from its labels.
pub fn pod_job_name(labels: &BTreeMap<String, String>) -> Option<String> {
    JOB_LABELS.iter().find_map(|l| labels.get(*l).filter(|v| !v.is_empty()).cloned())
}

/// Parses a Workload (v1beta1 or v1beta2).
pub fn parse_workload(v: &Value) -> Option<Workload> {
    let md = &v["metadata"];
    let name = md["name"].as_str()?.to_string();
    let owner = md["ownerReferences"]
        .as_array()
        .and_then(|refs| refs.iter().find(|r| r["controller"].as_bool() == Some(true)).or_else(|| refs.first()));
    let pod_sets: Vec<PodSet> = v["spec"]["podSets"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| PodSet {
            name: p["name"].as_str().unwrap_or("").to_string(),
            count: p["count"].as_u64().map_or(1, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            gpus_per_pod: pod_spec_gpus(&p["template"]["spec"]),
            node_selector: string_map(&p["template"]["spec"]["nodeSelector"]),
        })
        .collect();
    let first_template = &v["spec"]["podSets"][0]["template"];
    let mut labels = string_map(&first_template["metadata"]["labels"]);
    labels.extend(string_map(&md["labels"]));
    let priority_class = v["spec"]["priorityClassName"]
        .as_str()
        .or(v["spec"]["priorityClassRef"]["name"].as_str())
        .or(first_template["spec"]["priorityClassName"].as_str())
        .unwrap_or("")
        .to_string();
    // The GPU's flavor names the GPU class; `cpu` and `memory` usually sit in a plain default flavor (and sort
    // first), so GPU resources' flavors come first.
    let mut flavors: Vec<String> = Vec::new();
    for gpu_first in [true, false] {
        for a in v["status"]["admission"]["podSetAssignments"].as_array().into_iter().flatten() {
            for (resource, f) in a["flavors"].as_object().into_iter().flatten() {
                let Some(f) = f.as_str() else { continue };
                if GPU_RESOURCES.contains(&resource.as_str()) == gpu_first && !flavors.iter().any(|x| x == f) {
                    flavors.push(f.to_string());
                }
            }
        }
    }
    Some(Workload {
        namespace: md["namespace"].as_str().unwrap_or("default").to_string(),
        job_name: owner.and_then(|o| o["name"].as_str()).unwrap_or(&name).to_string(),
        owner_kind: owner.and_then(|o| o["kind"].as_str()).unwrap_or("").to_string(),
        name,
        created_ms: json_ms(&md["creationTimestamp"])?,
        queue_name: v["spec"]["queueName"].as_str().unwrap_or("").to_string(),
        priority_class,
        pod_sets,
        conditions: conditions(&v["status"]["conditions"]),
        cluster_queue: v["status"]["admission"]["clusterQueue"].as_str().unwrap_or("").to_string(),
        flavors,
        admission_checks: v["status"]["admissionChecks"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| AdmissionCheck {
                name: c["name"].as_str().unwrap_or("").to_string(),
                state: c["state"].as_str().unwrap_or("").to_string(),
                message: c["message"].as_str().unwrap_or("").to_string(),
                at_ms: json_ms(&c["lastTransitionTime"]).unwrap_or(0),
            })
            .collect(),
        labels,
        deleted_ms: json_ms(&md["deletionTimestamp"]),
        requeue_at_ms: json_ms(&v["status"]["requeueState"]["requeueAt"]),
        requeue_count: v["status"]["requeueState"]["count"].as_u64(),
    })
}

/// Parses a Pod; None for a pod without a job label (not a job's pod) or without a creation time.
pub fn parse_pod(v: &Value) -> Option<Pod> {
    let md = &v["metadata"];
    let labels = string_map(&md["labels"]);
    let job_name = pod_job_name(&labels)?;
    let conds = conditions(&v["status"]["conditions"]);
    let finished_ms = v["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| json_ms(&c["state"]["terminated"]["finishedAt"]))
        .max();
    Some(Pod {
        namespace: md["namespace"].as_str().unwrap_or("default").to_string(),
        name: md["name"].as_str()?.to_string(),
        job_name,
        created_ms: json_ms(&md["creationTimestamp"])?,
        node: v["spec"]["nodeName"].as_str().unwrap_or("").to_string(),
        phase: v["status"]["phase"].as_str().unwrap_or("").to_string(),
        scheduled: conds.get("PodScheduled").cloned(),
        ready: conds.get("Ready").cloned(),
        finished_ms,
        gpus: pod_spec_gpus(&v["spec"]),
        node_selector: string_map(&v["spec"]["nodeSelector"]),
        priority_class: v["spec"]["priorityClassName"].as_str().unwrap_or("").to_string(),
        labels,
    })
}

/// Parses a core/v1 Event; Some only for a `Pulling` event of a Pod.
pub fn parse_pull_event(v: &Value) -> Option<PullEvent> {
    let o = &v["involvedObject"];
    if v["reason"].as_str() != Some("Pulling") || o["kind"].as_str() != Some("Pod") {
        return None;
    }
    Some(PullEvent {
        namespace: o["namespace"].as_str().or(v["metadata"]["namespace"].as_str()).unwrap_or("default").to_string(),
        pod: o["name"].as_str()?.to_string(),
        at_ms: json_ms(&v["firstTimestamp"])
            .or_else(|| json_ms(&v["eventTime"]))
            .or_else(|| json_ms(&v["metadata"]["creationTimestamp"]))?,
        message: v["message"].as_str().unwrap_or("").to_string(),
    })
}

/// GPU classes recognised in node label values (GPU feature discovery's `nvidia.com/gpu.product`, GKE's
/// `cloud.google.com/gke-accelerator`, Karpenter's `karpenter.k8s.aws/instance-gpu-name`, ...), most specific
/// first.
const GPU_CLASSES: [&str; 22] = [
    "gb300", "gb200", "b300", "b200", "h200", "h100", "h800", "gh200", "a100", "a800", "l40s", "l40", "a10g", "a10",
    "l4", "t4", "v100", "p100", "mi355x", "mi325x", "mi300x", "mi250x",
];

/// Node label keys that name a GPU model.
pub const GPU_CLASS_LABELS: [&str; 5] = [
    "nvidia.com/gpu.product",
    "cloud.google.com/gke-accelerator",
    "karpenter.k8s.aws/instance-gpu-name",
    "amd.com/gpu.product-name",
    "startline.dev/gpu-class",
];

/// The GPU class named by node labels or a nodeSelector (empty when none).
pub fn gpu_class(labels: &BTreeMap<String, String>) -> String {
    if let Some(c) = labels.get("startline.dev/gpu-class") {
        return c.to_ascii_lowercase();
    }
    for key in GPU_CLASS_LABELS {
        let Some(v) = labels.get(key) else { continue };
        let v = v.to_ascii_lowercase();
        if let Some(c) = GPU_CLASSES.iter().find(|c| v.contains(*c)) {
            return (*c).to_string();
        }
    }
    String::new()
}

/// The GPU class a ResourceFlavor's name spells (`h100`, `a100-80gb`, `nvidia-tesla-t4`, `spot-l4`): a
/// `-`/`_`/`.`-separated word of the name that is a known class. Empty when none is (`default-flavor`).
pub fn gpu_class_named(name: &str) -> String {
    let name = name.to_ascii_lowercase();
    name.split(|c: char| !c.is_ascii_alphanumeric())
        .find_map(|word| GPU_CLASSES.iter().find(|c| **c == word))
        .map(|c| (*c).to_string())
        .unwrap_or_default()
}

/// How Kubernetes objects map onto Startline's attributes.
#[derive(Debug, Clone, Default)]
pub struct Mapping {
    /// The cluster's name in job ids.
    pub cluster: String,
    /// Region reported for every job.
    pub region: String,
    /// LocalQueue -> ClusterQueue (`--queue LQ=CQ`; an `LQ` may be `namespace/LQ`).
    pub queues: HashMap<String, String>,
    /// Priority classes whose jobs are urgent.
    pub urgent_priority_classes: Vec<String>,
    /// Label holding the team (default: the namespace).
    pub team_label: Option<String>,
    /// Report `PodsReady` (pods ready, without Kueue) as the first step.
    pub first_step_on_start: bool,
}

/// What the shell looked up for a job besides its objects.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Lookups {
    /// The ClusterQueue of the Workload's LocalQueue, read from the LocalQueue object.
    pub cluster_queue: Option<String>,
    /// Node labels of the first assigned flavor, a GPU resource's if any (`spec.nodeLabels` of the
    /// ResourceFlavor).
    pub flavor_labels: BTreeMap<String, String>,
    /// The Workload's position in its ClusterQueue (visibility API), when known.
    pub position: Option<u64>,
}

/// The pool: the ClusterQueue, from `--queue` (operator's word), else the admission, else the LocalQueue
/// object's `spec.clusterQueue`; `plain` for a job without a Workload. None while only the LocalQueue's name is
/// known.
fn resolved_pool(m: &Mapping, namespace: &str, wl: Option<&Workload>, look: &Lookups) -> Option<String> {
    let Some(w) = wl else { return Some("plain".to_string()) };
    m.queues
        .get(&format!("{namespace}/{}", w.queue_name))
        .or_else(|| m.queues.get(&w.queue_name))
        .cloned()
        .or_else(|| Some(w.cluster_queue.clone()).filter(|c| !c.is_empty()))
        .or_else(|| look.cluster_queue.clone().filter(|c| !c.is_empty()))
}

/// The GPU class as known now: the node labels of the admitted GPU flavor, else its name, else the pod sets'
/// nodeSelectors, else the pods' (Kueue adds the flavor's node labels to them at admission). Empty before
/// admission unless the job names its GPU itself.
fn gpu_class_now(wl: Option<&Workload>, pod_sets: &[PodSet], pods: &[&Pod], look: &Lookups) -> String {
    let mut class = gpu_class(&look.flavor_labels);
    if class.is_empty() {
        class = wl.and_then(|w| w.flavors.first()).map(|f| gpu_class_named(f)).unwrap_or_default();
    }
    if class.is_empty() {
        class = pod_sets.iter().map(|p| gpu_class(&p.node_selector)).find(|c| !c.is_empty()).unwrap_or_default();
    }
    if class.is_empty() {
        class = pods.iter().map(|p| gpu_class(&p.node_selector)).find(|c| !c.is_empty()).unwrap_or_default();
    }
    class
}

/// What [`JobMemory::attributes`] holds for the attributes a `submitted` carried.
fn attributes_key(pool: &str, class: &str) -> String {
    format!("{pool}\u{1f}{class}")
}

/// The job's `submitted` with `pool` and `class`.
fn submitted_kind(
    m: &Mapping,
    namespace: &str,
    wl: Option<&Workload>,
    objs: &JobObjects,
    pod_sets: &[PodSet],
    pool: &str,
    class: &str,
) -> Kind {
    let gpu_count: u32 = pod_sets.iter().map(|p| p.gpus_per_pod.saturating_mul(p.count)).sum();
    let node_count: u32 = pod_sets.iter().map(|p| p.count).sum::<u32>().max(1);
    let labels_src = wl.map(|w| w.labels.clone()).or_else(|| objs.pods.first().map(|p| p.labels.clone()));
    let labels_src = labels_src.unwrap_or_default();
    let priority = wl
        .map(|w| w.priority_class.clone())
        .filter(|p| !p.is_empty())
        .or_else(|| objs.pods.first().map(|p| p.priority_class.clone()))
        .unwrap_or_default();
    let urgent = !priority.is_empty() && m.urgent_priority_classes.contains(&priority);
    let team = m.team_label.as_ref().and_then(|l| labels_src.get(l).cloned()).unwrap_or_else(|| namespace.to_string());
    let mut labels: HashMap<String, String> = HashMap::new();
    labels.insert("namespace".into(), namespace.to_string());
    if let Some(w) = wl {
        if !w.owner_kind.is_empty() {
            labels.insert("kind".into(), w.owner_kind.clone());
        }
        if !w.queue_name.is_empty() {
            labels.insert("local_queue".into(), super::free_text(&w.queue_name, 256));
        }
        labels.insert("workload".into(), super::free_text(&w.name, 256));
    }
    if !priority.is_empty() {
        labels.insert("priority_class".into(), super::free_text(&priority, 256));
    }
    Kind::Submitted(pb::Submitted {
        pool_kind: pb::PoolKind::Dedicated as i32,
        provider: "kueue".into(),
        pool: super::attribute(pool, 128),
        priority: if urgent { pb::PriorityClass::Urgent } else { pb::PriorityClass::Normal } as i32,
        gpu_class: super::attribute(class, 64),
        gpu_count,
        node_count,
        region: m.region.clone(),
        team: super::attribute(&team, 64),
        labels,
        ..Default::default()
    })
}

/// A Queued for a quota wait: Kueue's reason and raw message, and the queue position when known.
fn quota_queued(reason: &str, message: &str, position: Option<u64>) -> Kind {
    let mut text = super::free_text(message, 900);
    if let Some(p) = position {
        text = format!("{text} (position {p} in ClusterQueue)");
    }
    Kind::Queued(pb::Queued {
        reason: quota_wait_reason(reason, message) as i32,
        raw_reason: super::free_text(reason, 256),
        message: text,
        estimated_start: None,
        queue_position: position.map(|p| u32::try_from(p).unwrap_or(u32::MAX)),
    })
}

/// Whether a queue position moved enough to report: any change within the first [`POSITION_EXACT`] places, else a
/// move of at least a fifth (a long queue shuffling by a place or two is not news; approaching the head is).
pub fn position_moved(last: Option<u64>, now: u64) -> bool {
    match last {
        None => true,
        Some(l) if l == now => false,
        Some(l) => now < POSITION_EXACT || l < POSITION_EXACT || l.abs_diff(now) * 5 >= l,
    }
}

/// Positions below this are reported on every change.
pub const POSITION_EXACT: u64 = 10;

/// The Startline job id of `job_name` in `namespace`: `k8s/<cluster>/<namespace>/<job name>`.
pub fn startline_id(m: &Mapping, namespace: &str, job_name: &str) -> String {
    crate::jobid::kubernetes(&m.cluster, namespace, job_name)
}

/// One job's objects.
#[derive(Debug, Clone, Default)]
pub struct JobObjects<'a> {
    /// Its Workload (None: a plain job, or pods seen before their Workload).
    pub workload: Option<&'a Workload>,
    /// The Workload was deleted (before it finished).
    pub workload_deleted: bool,
    /// Its pods.
    pub pods: Vec<&'a Pod>,
    /// Image pulls of its pods.
    pub pulls: Vec<&'a PullEvent>,
}

/// The Startline wait reason of a `QuotaReserved=False` reason (with the message for the deprecated `Pending`).
pub fn quota_wait_reason(reason: &str, message: &str) -> pb::WaitReason {
    match reason {
        "Inadmissible" | "NoMatchingFlavor" | "Misconfigured" | "ExceedsMaxQuota" => pb::WaitReason::Misconfigured,
        "Suspended" | "OnHold" => pb::WaitReason::DependencyOrHold,
        "TopologyPlacementFailed" => pb::WaitReason::Capacity,
        "Pending" => {
            // Kueue before KEP-10852 says everything with "Pending"; its messages tell a flavor mismatch (no flavor
            // can ever fit) from a quota wait.
            let m = message.to_ascii_lowercase();
            if m.contains("doesn't match")
                || m.contains("untolerated taint")
                || m.contains("no flavor")
                || m.contains("exceeds the maximum")
            {
                pb::WaitReason::Misconfigured
            } else {
                pb::WaitReason::Quota
            }
        }
        _ => pb::WaitReason::Quota,
    }
}

/// The end of a job the adapter followed whose Workload and pods are gone from its first complete listing after a
/// start: deleted while the adapter was away and not replayed to it (its saved watch position was compacted away,
/// or not saved before it stopped). Cancelled, dated when noticed: no object is left to say when.
pub fn vanished(m: &Mapping, job_id: &str, mem: &JobMemory, now_ms: i64) -> (Vec<pb::LifecycleEvent>, JobMemory) {
    let mut mem = mem.clone();
    let mut out = Vec::new();
    if mem.done || !mem.emitted.contains("submitted") {
        return (out, mem);
    }
    let message = "its Workload and pods were gone when the adapter came back (deleted while it was away; time \
                   unknown: dated when noticed)";
    super::emit_once(
        &mut out,
        &mut mem,
        job_id,
        &format!("kueue-adapter/{}", m.cluster),
        "done",
        now_ms,
        Kind::Done(pb::Done { outcome: pb::Outcome::Cancelled as i32, exit_code: None, message: message.into() }),
    );
    mem.done = true;
    (out, mem)
}

/// What [`reconstruct`] adds to each message.
pub const RECONSTRUCTED: &str = "(reconstructed from the Workload's conditions: the adapter did not see it happen)";

/// The current attempt's transitions the conditions date but the adapter never saw (see [`diff`]). Only what the
/// adapter cannot have seen: a wait of an attempt it first saw already reserved (`watched_attempt` false: it
/// was away, or started, before the reservation), and the pods' part of an attempt that is over (finished or
/// evicted) without one of its pods seen (its pods are gone):
/// - quota reserved (`QuotaReserved=True`), the attempt not watched before and no wait seen: `queued:quota` from
///   the attempt's start (the Workload's creation, or its requeue) to the reservation, when there is time between;
/// - admission checks passed between reservation and admission (`Admitted` later than `QuotaReserved`), none
///   seen pending, the attempt not watched before or over: `preparing:provisioning` from the reservation;
/// - admitted and over, with none of its pods or pod-level transitions seen: `preparing:other` from the
///   admission, so the time until the first step (or the end) is not counted as the quota wait.
fn reconstruct(
    mem: &mut JobMemory,
    emit: &mut impl FnMut(&mut JobMemory, &str, i64, Kind),
    wl: Option<&Workload>,
    pods: &[&&Pod],
    epoch: i64,
    created: i64,
    watched_attempt: bool,
) {
    let Some(w) = wl else { return };
    let cond = |t: &str| w.conditions.get(t);
    let Some(q) = cond("QuotaReserved").filter(|c| c.status && c.at_ms >= epoch) else { return };
    let seen_since = |mem: &JobMemory, prefixes: &[&str], from: i64| {
        mem.emitted.iter().any(|k| prefixes.iter().any(|p| ms_of_key(k, p).is_some_and(|at| at >= from)))
    };
    let requeued = cond("Requeued").filter(|r| r.status && r.at_ms >= epoch).map(|r| r.at_ms);
    let start = requeued.unwrap_or(epoch).max(created);
    let reserved = q.at_ms.max(created);
    let over =
        cond("Finished").is_some_and(|f| f.status) || cond("Evicted").is_some_and(|e| e.status && e.at_ms >= reserved);
    if !watched_attempt
        && reserved > start
        && !seen_since(mem, &["queued:", "backoff:", "reconstructed:queued:"], start)
    {
        let cq =
            if w.cluster_queue.is_empty() { String::new() } else { format!(" in ClusterQueue {}", w.cluster_queue) };
        emit(
            mem,
            &format!("reconstructed:queued:{start}"),
            start,
            Kind::Queued(pb::Queued {
                reason: pb::WaitReason::Quota as i32,
                raw_reason: String::new(),
                message: super::free_text(
                    &format!(
                        "waiting for quota until {}{cq} {RECONSTRUCTED}",
                        startline_proto::rfc3339::format_ms(reserved)
                    ),
                    1024,
                ),
                estimated_start: None,
                queue_position: None,
            }),
        );
    }
    let Some(a) = cond("Admitted").filter(|c| c.status && c.at_ms >= epoch) else { return };
    let admitted = a.at_ms.max(reserved);
    if admitted > reserved
        && (over || !watched_attempt)
        && !seen_since(mem, &["provisioning:", "reconstructed:provisioning:"], reserved)
    {
        emit(
            mem,
            &format!("reconstructed:provisioning:{reserved}"),
            reserved,
            Kind::Preparing(pb::Preparing {
                phase: pb::PreparingPhase::Provisioning as i32,
                message: super::free_text(&format!("admission checks until the admission {RECONSTRUCTED}"), 1024),
            }),
        );
    }
    let pods_seen = !pods.is_empty()
        || ["capacity:", "node_assigned:", "image_pull:"].iter().any(|p| mem.emitted.contains(&format!("{p}{epoch}")));
    if over && !pods_seen {
        emit(
            mem,
            &format!("reconstructed:admitted:{admitted}"),
            admitted,
            Kind::Preparing(pb::Preparing {
                phase: pb::PreparingPhase::Other as i32,
                message: super::free_text(
                    &format!("admitted; the pods' scheduling, image pulls and start not seen {RECONSTRUCTED}"),
                    1024,
                ),
            }),
        );
    }
}

fn ms_of_key(key: &str, prefix: &str) -> Option<i64> {
    key.strip_prefix(prefix)?.split(':').next()?.parse().ok()
}

/// The events one job's objects imply beyond its memory, and the new memory.
pub fn diff(
    m: &Mapping,
    namespace: &str,
    job_name: &str,
    objs: &JobObjects,
    look: &Lookups,
    mem: &JobMemory,
    now_ms: i64,
) -> (Vec<pb::LifecycleEvent>, JobMemory) {
    // Seen before this diff (whether the current attempt was watched before its quota reservation).
    let seen_before = mem.emitted.clone();
    let mut mem = mem.clone();
    let mut out = Vec::new();
    if mem.done {
        return (out, mem);
    }
    let job = startline_id(m, namespace, job_name);
    let source = format!("kueue-adapter/{}", m.cluster);
    let mut emit = |mem: &mut JobMemory, key: &str, at: i64, kind: Kind| {
        super::emit_once(&mut out, mem, &job, &source, key, at, kind)
    };
    let wl = objs.workload;
    let first_pod = objs.pods.iter().map(|p| p.created_ms).min();
    let Some(created) = wl.map(|w| w.created_ms).or(first_pod) else { return (out, mem) };

    // submitted
    let pod_sets: Vec<PodSet> = match wl {
        Some(w) => w.pod_sets.clone(),
        None => objs
            .pods
            .iter()
            .map(|p| PodSet {
                name: p.name.clone(),
                count: 1,
                gpus_per_pod: p.gpus,
                node_selector: p.node_selector.clone(),
            })
            .collect(),
    };
    let expected_pods: u32 = pod_sets.iter().map(|p| p.count).sum::<u32>().max(1);
    let pool = resolved_pool(m, namespace, wl, look);
    let class = gpu_class_now(wl, &pod_sets, &objs.pods, look);
    let submitted = |pool: &str, class: &str| submitted_kind(m, namespace, wl, objs, &pod_sets, pool, class);
    if !mem.emitted.contains("submitted") {
        // The LocalQueue's name when its ClusterQueue is not known yet (an update follows once it is).
        let pool = pool.clone().or_else(|| wl.map(|w| w.queue_name.clone())).unwrap_or_default();
        emit(&mut mem, "submitted", created, submitted(&pool, &class));
        mem.attributes = Some(attributes_key(&pool, &class));
    } else {
        // Attributes learned after the submit: Kueue picks the flavor (and so the GPU class) at admission, and
        // the admission names the ClusterQueue. A `submitted` with the job's attributes as now known updates
        // them at the collector; what was sent is never replaced by something less known.
        let (sent_pool, sent_class) = mem.attributes.as_deref().and_then(|a| a.split_once('\u{1f}')).unzip();
        let pool_now = pool.or_else(|| sent_pool.map(str::to_string));
        let class_now = if class.is_empty() { sent_class.unwrap_or("").to_string() } else { class };
        if let Some(pool_now) = pool_now {
            let key = attributes_key(&pool_now, &class_now);
            if mem.attributes.as_deref() != Some(key.as_str()) {
                let admitted = wl.and_then(|w| w.conditions.get("QuotaReserved")).filter(|c| c.status);
                // Dated when Kueue admitted the Workload (else now), after the submit so it sorts as an update.
                let at = admitted.map_or(now_ms, |q| q.at_ms).max(created + 1);
                emit(&mut mem, &format!("attributes:{at}"), at, submitted(&pool_now, &class_now));
                mem.attributes = Some(key);
            }
        }
    }

    let cond = |t: &str| wl.and_then(|w| w.conditions.get(t));
    // The attempt: pod-level transitions after the last eviction belong to the new attempt.
    let mut epoch = mem.emitted.iter().filter_map(|k| ms_of_key(k, "preempted:")).max().unwrap_or(0);
    if let Some(e) = cond("Evicted").filter(|c| c.status) {
        if !mem.emitted.contains(&format!("preempted:{}", e.at_ms)) {
            let reason = if e.message.is_empty() { e.reason.clone() } else { format!("{}: {}", e.reason, e.message) };
            emit(
                &mut mem,
                &format!("preempted:{}", e.at_ms.max(created)),
                e.at_ms.max(created),
                Kind::Preempted(pb::Preempted { reason: super::free_text(&reason, 1024), checkpoint_saved: false }),
            );
            epoch = epoch.max(e.at_ms.max(created));
        }
    }
    if let Some(r) = cond("Requeued").filter(|c| c.status) {
        if epoch > 0 && r.at_ms >= epoch {
            emit(&mut mem, &format!("requeued:{epoch}"), r.at_ms, Kind::Requeued(pb::Requeued { resume_step: 0 }));
        }
    }

    // A requeue backoff: evicted for the PodsReady timeout, the Workload is held back until
    // `status.requeueState.requeueAt` (`Requeued=False` with the eviction's reason), then requeued
    // (`Requeued=True/BackoffFinished`). Its `QuotaReserved=False` says the eviction's message, but the wait is
    // Kueue's backoff, not quota: recovery from the eviction, until the requeue.
    let finished = cond("Finished").is_some_and(|f| f.status);
    let backoff = cond("Evicted").filter(|e| {
        e.status
            && e.reason == "PodsReadyTimeout"
            && cond("Requeued").is_none_or(|r| !r.status)
            && cond("QuotaReserved").is_none_or(|q| !q.status)
            && !finished
    });
    if let Some(e) = backoff {
        // After the eviction (the preemption sorts first), when Kueue marked the Workload not requeued.
        let stopped = cond("Requeued").map_or(0, |r| r.at_ms);
        let at = stopped.max(e.at_ms + 1).max(created);
        let until = wl.and_then(|w| w.requeue_at_ms);
        let mut message = format!("requeue backoff after the eviction ({})", e.message);
        if let Some(u) = until {
            message.push_str(&format!("; requeued at {}", startline_proto::rfc3339::format_ms(u)));
        }
        if let Some(n) = wl.and_then(|w| w.requeue_count) {
            message.push_str(&format!(" (backoff requeue {n})"));
        }
        emit(
            &mut mem,
            &format!("backoff:{at}"),
            at,
            Kind::Queued(pb::Queued {
                reason: pb::WaitReason::PreemptionRecovery as i32,
                raw_reason: "PodsReadyTimeout".into(),
                message: super::free_text(&message, 1024),
                estimated_start: None,
                queue_position: None,
            }),
        );
    }

    // Quota waits (none during a backoff; after a requeue, from the requeue on).
    let requeued_at = cond("Requeued").filter(|r| r.status).map_or(0, |r| r.at_ms);
    if let Some(q) = cond("QuotaReserved").filter(|c| !c.status && !finished && backoff.is_none()) {
        let reason = if q.reason.is_empty() { "Pending" } else { q.reason.as_str() };
        let at = q.at_ms.max(created).max(requeued_at);
        let key = format!("queued:{at}:{reason}");
        if !mem.emitted.contains(&key) {
            // A new reason without a new transition time (same False status) began now, not at the old time.
            let at = if mem.reason_at_ms == at && !mem.reason.is_empty() && mem.reason != reason {
                now_ms.max(at)
            } else {
                at
            };
            emit(&mut mem, &key, at, quota_queued(reason, &q.message, look.position));
            mem.reason = reason.to_string();
            mem.reason_at_ms = q.at_ms.max(created).max(requeued_at);
            mem.reasons_seen += 1;
            mem.queue_position = look.position;
        } else if let Some(p) = look.position.filter(|p| position_moved(mem.queue_position, *p)) {
            // Same wait, a new place in the queue: a new Queued with the same reason, dated now.
            emit(&mut mem, &format!("{key}:position:{p}"), now_ms.max(at), quota_queued(reason, &q.message, Some(p)));
            mem.queue_position = Some(p);
        }
    }
    // Admission checks pending after quota reservation: provisioning.
    if let Some(q) = cond("QuotaReserved").filter(|c| c.status) {
        let pending: Vec<&AdmissionCheck> =
            wl.into_iter().flat_map(|w| w.admission_checks.iter()).filter(|c| c.state == "Pending").collect();
        if !pending.is_empty() {
            let names: Vec<&str> = pending.iter().map(|c| c.name.as_str()).collect();
            let at = q.at_ms.max(created);
            emit(
                &mut mem,
                &format!("provisioning:{at}"),
                at,
                Kind::Preparing(pb::Preparing {
                    phase: pb::PreparingPhase::Provisioning as i32,
                    message: super::free_text(&format!("admission checks pending: {}", names.join(", ")), 1024),
                }),
            );
        }
    }

    // Pod-level signals of the current attempt.
    let pods: Vec<&&Pod> = objs.pods.iter().filter(|p| p.created_ms >= epoch).collect();
    if let Some(u) = pods
        .iter()
        .filter_map(|p| p.scheduled.as_ref())
        .filter(|s| !s.status && s.reason == "Unschedulable")
        .min_by_key(|s| s.at_ms)
    {
        emit(
            &mut mem,
            &format!("capacity:{epoch}"),
            u.at_ms.max(created),
            Kind::Queued(pb::Queued {
                reason: pb::WaitReason::Capacity as i32,
                raw_reason: "Unschedulable".into(),
                message: super::free_text(&u.message, 1024),
                estimated_start: None,
                queue_position: None,
            }),
        );
    }
    let bound: Vec<(&str, i64)> = pods
        .iter()
        .filter_map(|p| p.scheduled.as_ref().filter(|s| s.status).map(|s| (p.node.as_str(), s.at_ms)))
        .collect();
    let all_bound = bound.len() as u32 >= expected_pods && !bound.is_empty();
    if all_bound {
        let at = bound.iter().map(|b| b.1).max().unwrap_or(created).max(created);
        let mut nodes: Vec<String> = bound.iter().map(|b| b.0.to_string()).filter(|n| !n.is_empty()).collect();
        nodes.sort();
        nodes.dedup();
        emit(
            &mut mem,
            &format!("node_assigned:{epoch}"),
            at,
            Kind::NodeAssigned(pb::NodeAssigned { nodes, gpu_ids: Vec::new() }),
        );
    }
    let names: Vec<&str> = pods.iter().map(|p| p.name.as_str()).collect();
    if let Some(pull) =
        objs.pulls.iter().filter(|e| names.contains(&e.pod.as_str()) && e.at_ms >= epoch).min_by_key(|e| e.at_ms)
    {
        if mem.emitted.iter().any(|k| k.starts_with("node_assigned:")) || all_bound {
            emit(
                &mut mem,
                &format!("image_pull:{epoch}"),
                pull.at_ms.max(created),
                Kind::Preparing(pb::Preparing {
                    phase: pb::PreparingPhase::ImagePull as i32,
                    message: super::free_text(&pull.message, 1024),
                }),
            );
        }
    }
    // Rebuilt from the conditions' transition times when the adapter missed the states themselves (it was down
    // while the job was admitted, started or finished; on its return the Workload says only where it is now).
    // Each such event is marked: its key (and event id) starts with `reconstructed:` and its message says so.
    let watched_attempt =
        seen_before.contains("submitted") && (epoch == 0 || seen_before.contains(&format!("preempted:{epoch}")));
    reconstruct(&mut mem, &mut emit, wl, &pods, epoch, created, watched_attempt);

    if m.first_step_on_start {
        let ready_at = match cond("PodsReady") {
            Some(r) if r.status && r.at_ms >= epoch => Some(r.at_ms),
            Some(_) => None,
            None => {
                let ready: Vec<i64> =
                    pods.iter().filter_map(|p| p.ready.as_ref().filter(|r| r.status).map(|r| r.at_ms)).collect();
                (ready.len() as u32 >= expected_pods).then(|| ready.iter().copied().max().unwrap_or(created))
            }
        };
        if let Some(at) = ready_at {
            emit(&mut mem, &format!("first_step:{epoch}"), at.max(created), super::container_start());
        }
    }

    // The end.
    let done = if let Some(f) = cond("Finished").filter(|c| c.status) {
        let outcome = match f.reason.as_str() {
            "Succeeded" => pb::Outcome::Succeeded,
            "Failed" => pb::Outcome::Failed,
            _ => pb::Outcome::Cancelled,
        };
        let what = if f.message.is_empty() { f.reason.clone() } else { format!("{}: {}", f.reason, f.message) };
        Some((outcome, f.at_ms, what))
    } else if objs.workload_deleted {
        // Dated when the deletion was asked for (the object a DELETED watch event carries, also one replayed after
        // an adapter restart, says so); when seen only if the object is gone without its last state.
        match wl.and_then(|w| w.deleted_ms) {
            Some(at) => Some((pb::Outcome::Cancelled, at, "workload deleted before it finished".to_string())),
            None => Some((
                pb::Outcome::Cancelled,
                now_ms,
                "workload deleted before it finished (time unknown: dated when seen)".to_string(),
            )),
        }
    } else if wl.is_none()
        && !objs.pods.is_empty()
        && objs.pods.iter().all(|p| matches!(p.phase.as_str(), "Succeeded" | "Failed"))
    {
        let last = objs.pods.iter().max_by_key(|p| p.finished_ms.unwrap_or(p.created_ms));
        let outcome =
            if last.is_some_and(|p| p.phase == "Succeeded") { pb::Outcome::Succeeded } else { pb::Outcome::Failed };
        let at = last.and_then(|p| p.finished_ms).unwrap_or(now_ms);
        Some((outcome, at, format!("every pod ended; the last {}", last.map_or("", |p| p.phase.as_str()))))
    } else {
        None
    };
    if let Some((outcome, at, message)) = done {
        emit(
            &mut mem,
            "done",
            at.max(created),
            Kind::Done(pb::Done {
                outcome: outcome as i32,
                exit_code: None,
                message: super::free_text(&message, 1024),
            }),
        );
        mem.done = true;
    }
    (out, mem)
}

#[cfg(test)]
mod tests;
