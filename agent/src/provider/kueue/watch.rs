//! The Kueue adapter's shell: a kube-rs client ([`kube::Api`] over [`DynamicObject`], so both Workload API
//! versions and core objects are read as the JSON the pure core parses) and a list + watch loop of its own per
//! resource (Workloads, Pods, Pod `Pulling` Events), chosen over `kube_runtime::watcher` because the adapter
//! persists each resource's resourceVersion and resumes from it after a restart:
//!
//! 1. list (paged, 500 a page) -> the resource's cache is replaced;
//! 2. watch from a resourceVersion with bookmarks (the persisted one once after a start, so changes made while the
//!    adapter was down are replayed in order; then the last one seen), re-watching when the server ends the
//!    stream;
//! 3. `410 Gone` (an HTTP answer or an `ERROR` watch event: the version was compacted) -> relist from 1.
//!
//! Every update goes through one bounded channel to one task that owns the caches, diffs the affected jobs
//! ([`super::diff`]), spools the events, saves the memories and then the resourceVersions (`@cursor/kueue/<resource>`
//! in the adapter's memory tree: an opaque string, so [`MemoryStore::put_state`] rather than the numeric
//! [`MemoryStore::set_cursor`]). A crash after spooling re-derives the same event ids. Nothing is diffed before
//! every resource's first list arrived, so a pod is never mistaken for a plain job's before its Workload is known.

use super::{
    diff, parse_pod, parse_pull_event, parse_workload, JobObjects, Lookups, Mapping, Pod, PullEvent, Workload,
};
use crate::metrics::{Metrics, PollErrorKind, Provider};
use crate::provider::{MemoryStore, PollError, PollReport};
use futures_util::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, WatchEvent, WatchParams};
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;
use tokio::sync::mpsc;

/// The resources followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resource {
    /// Kueue Workloads.
    Workloads,
    /// Pods.
    Pods,
    /// core/v1 Events with reason `Pulling` about Pods.
    Events,
}

impl Resource {
    /// The name in cursors and logs.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Workloads => "workloads",
            Resource::Pods => "pods",
            Resource::Events => "events",
        }
    }
}

/// What the watch loops send the diffing task.
#[derive(Debug)]
pub enum Update {
    /// A complete list: the resource's cache becomes these objects.
    Listed(Resource, Vec<Value>, String),
    /// An object added or modified.
    Applied(Resource, Value, String),
    /// An object deleted.
    Deleted(Resource, Value, String),
    /// A bookmark: nothing changed up to this version.
    Bookmark(Resource, String),
    /// A list or watch failed (it is retried).
    Failed(Resource, PollError),
}

/// What the adapter follows and how.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The Workload API version (`v1beta1`, served by every Kueue release since 0.3; or `v1beta2`).
    pub api_version: String,
    /// Only this namespace (None: all).
    pub namespace: Option<String>,
    /// Follow pods of Jobs without a Workload.
    pub plain_jobs: bool,
    /// Ask the visibility API for a pending Workload's position in its ClusterQueue.
    pub visibility: bool,
    /// How often the positions of Workloads waiting for quota are read again (a move sends a new Queued).
    pub position_interval: Duration,
    /// Wait after a failed list or watch.
    pub retry: Duration,
}

fn api(client: &kube::Client, s: &Settings, r: &ApiResource) -> Api<DynamicObject> {
    match &s.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, r),
        None => Api::all_with(client.clone(), r),
    }
}

fn resource(r: Resource, s: &Settings) -> ApiResource {
    let (group, version, kind, plural) = match r {
        Resource::Workloads => ("kueue.x-k8s.io", s.api_version.as_str(), "Workload", "workloads"),
        Resource::Pods => ("", "v1", "Pod", "pods"),
        Resource::Events => ("", "v1", "Event", "events"),
    };
    let api_version = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    ApiResource { group: group.into(), version: version.into(), api_version, kind: kind.into(), plural: plural.into() }
}

fn kube_error(r: Resource, e: &kube::Error) -> PollError {
    let kind = match e {
        kube::Error::Api(a) if a.code == 429 => PollErrorKind::Throttled,
        kube::Error::Api(_) => PollErrorKind::HttpStatus,
        kube::Error::SerdeError(_) => PollErrorKind::Parse,
        _ => PollErrorKind::Transport,
    };
    PollError::new(kind, format!("{}: {e}", r.name()))
}

fn gone(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(a) if a.code == 410)
}

async fn list_all(api: &Api<DynamicObject>, fields: Option<&str>) -> Result<(Vec<Value>, String), kube::Error> {
    let mut items = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut lp = ListParams::default().limit(500);
        if let Some(f) = fields {
            lp = lp.fields(f);
        }
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = api.list(&lp).await?;
        for o in page.items {
            items.push(serde_json::to_value(o).map_err(kube::Error::SerdeError)?);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => token = Some(c),
            None => return Ok((items, page.metadata.resource_version.unwrap_or_default())),
        }
    }
}

/// Lists and watches one resource until `stop`, sending every change to `tx`. `resume` is the persisted
/// resourceVersion: after the first list, the first watch starts there.
pub async fn follow(
    client: kube::Client,
    s: Settings,
    r: Resource,
    mut resume: Option<String>,
    tx: mpsc::Sender<Update>,
    stop: tokio_util::sync::CancellationToken,
) {
    let api = api(&client, &s, &resource(r, &s));
    let fields = (r == Resource::Events).then_some("involvedObject.kind=Pod,reason=Pulling");
    let pause = |stop: tokio_util::sync::CancellationToken| async move {
        tokio::select! {
            _ = tokio::time::sleep(s.retry) => false,
            _ = stop.cancelled() => true,
        }
    };
    'relist: loop {
        let listed = tokio::select! {
            l = list_all(&api, fields) => l,
            _ = stop.cancelled() => return,
        };
        let mut rv = match listed {
            Ok((items, rv)) => {
                if tx.send(Update::Listed(r, items, rv.clone())).await.is_err() {
                    return;
                }
                resume.take().filter(|v| !v.is_empty()).unwrap_or(rv)
            }
            Err(e) => {
                let _ = tx.send(Update::Failed(r, kube_error(r, &e))).await;
                if pause(stop.clone()).await {
                    return;
                }
                continue 'relist;
            }
        };
        loop {
            let mut wp = WatchParams::default().timeout(290);
            if let Some(f) = fields {
                wp = wp.fields(f);
            }
            let stream = tokio::select! {
                w = api.watch(&wp, &rv) => w,
                _ = stop.cancelled() => return,
            };
            let stream = match stream {
                Ok(s) => s,
                Err(e) if gone(&e) => {
                    tracing::info!(resource = r.name(), rv, "resourceVersion expired (410): relisting");
                    continue 'relist;
                }
                Err(e) => {
                    let _ = tx.send(Update::Failed(r, kube_error(r, &e))).await;
                    if pause(stop.clone()).await {
                        return;
                    }
                    continue;
                }
            };
            let mut stream = std::pin::pin!(stream);
            loop {
                let next = tokio::select! {
                    n = stream.next() => n,
                    _ = stop.cancelled() => return,
                };
                let update = match next {
                    None => break,
                    Some(Ok(WatchEvent::Added(o) | WatchEvent::Modified(o))) => {
                        rv = o.metadata.resource_version.clone().unwrap_or(rv);
                        match serde_json::to_value(o) {
                            Ok(v) => Update::Applied(r, v, rv.clone()),
                            Err(e) => Update::Failed(r, PollError::new(PollErrorKind::Parse, e.to_string())),
                        }
                    }
                    Some(Ok(WatchEvent::Deleted(o))) => {
                        rv = o.metadata.resource_version.clone().unwrap_or(rv);
                        match serde_json::to_value(o) {
                            Ok(v) => Update::Deleted(r, v, rv.clone()),
                            Err(e) => Update::Failed(r, PollError::new(PollErrorKind::Parse, e.to_string())),
                        }
                    }
                    Some(Ok(WatchEvent::Bookmark(b))) => {
                        rv = b.metadata.resource_version;
                        Update::Bookmark(r, rv.clone())
                    }
                    Some(Ok(WatchEvent::Error(e))) if e.code == 410 => {
                        tracing::info!(resource = r.name(), rv, "watch says 410 Gone: relisting");
                        continue 'relist;
                    }
                    Some(Ok(WatchEvent::Error(e))) => {
                        let e = kube::Error::Api(e);
                        let _ = tx.send(Update::Failed(r, kube_error(r, &e))).await;
                        break;
                    }
                    Some(Err(e)) => {
                        let _ = tx.send(Update::Failed(r, kube_error(r, &e))).await;
                        break;
                    }
                };
                if tx.send(update).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The caches the diffing task keeps: the current objects, by `namespace/name`.
#[derive(Default)]
pub struct Caches {
    /// Workloads.
    pub workloads: HashMap<String, Workload>,
    /// Job pods.
    pub pods: HashMap<String, Pod>,
    /// The first image pull of each pod (`namespace/pod`).
    pub pulls: HashMap<String, PullEvent>,
    /// Jobs whose Workload was deleted since the last diff.
    pub deleted: BTreeSet<(String, String)>,
    /// Resources listed at least once.
    pub listed: BTreeSet<&'static str>,
}

fn key(v: &Value) -> String {
    format!(
        "{}/{}",
        v["metadata"]["namespace"].as_str().unwrap_or("default"),
        v["metadata"]["name"].as_str().unwrap_or("")
    )
}

impl Caches {
    /// Applies an update; returns the jobs `(namespace, job name)` it touched.
    pub fn apply(&mut self, u: &Update) -> BTreeSet<(String, String)> {
        let mut touched = BTreeSet::new();
        match u {
            Update::Listed(r, items, _) => {
                self.listed.insert(r.name());
                match r {
                    Resource::Workloads => {
                        let old = std::mem::take(&mut self.workloads);
                        for v in items {
                            if let Some(w) = parse_workload(v) {
                                touched.insert((w.namespace.clone(), w.job_name.clone()));
                                self.workloads.insert(key(v), w);
                            }
                        }
                        // Gone while the watch was away: deleted. Its last state is kept for one diff (it may
                        // say Finished, or when the deletion was asked for).
                        for (k, w) in old {
                            if k.starts_with("@deleted/") {
                                self.workloads.insert(k, w);
                            } else if !self.workloads.contains_key(&k) {
                                let job = (w.namespace.clone(), w.job_name.clone());
                                self.deleted.insert(job.clone());
                                touched.insert(job);
                                self.workloads.insert(format!("@deleted/{k}"), w);
                            }
                        }
                    }
                    Resource::Pods => {
                        let old = std::mem::take(&mut self.pods);
                        touched.extend(old.values().map(|p| (p.namespace.clone(), p.job_name.clone())));
                        for v in items {
                            if let Some(p) = parse_pod(v) {
                                touched.insert((p.namespace.clone(), p.job_name.clone()));
                                self.pods.insert(key(v), p);
                            }
                        }
                    }
                    Resource::Events => {
                        self.pulls.clear();
                        for v in items {
                            self.add_pull(v, &mut touched);
                        }
                    }
                }
            }
            Update::Applied(r, v, _) => match r {
                Resource::Workloads => {
                    if let Some(w) = parse_workload(v) {
                        touched.insert((w.namespace.clone(), w.job_name.clone()));
                        self.workloads.insert(key(v), w);
                    }
                }
                Resource::Pods => {
                    if let Some(p) = parse_pod(v) {
                        touched.insert((p.namespace.clone(), p.job_name.clone()));
                        self.pods.insert(key(v), p);
                    }
                }
                Resource::Events => self.add_pull(v, &mut touched),
            },
            Update::Deleted(r, v, _) => match r {
                Resource::Workloads => {
                    if let Some(w) = self.workloads.remove(&key(v)).or_else(|| parse_workload(v)) {
                        // The final state counts (it may say Finished).
                        let last = parse_workload(v).unwrap_or(w);
                        let job = (last.namespace.clone(), last.job_name.clone());
                        self.workloads.insert(format!("@deleted/{}", key(v)), last);
                        self.deleted.insert(job.clone());
                        touched.insert(job);
                    }
                }
                Resource::Pods => {
                    if let Some(p) = self.pods.remove(&key(v)) {
                        touched.insert((p.namespace, p.job_name));
                    }
                }
                // An expired event says nothing new: the first pull was already seen.
                Resource::Events => {}
            },
            Update::Bookmark(..) | Update::Failed(..) => {}
        }
        touched
    }

    fn add_pull(&mut self, v: &Value, touched: &mut BTreeSet<(String, String)>) {
        let Some(e) = parse_pull_event(v) else { return };
        let pod_key = format!("{}/{}", e.namespace, e.pod);
        if let Some(p) = self.pods.get(&pod_key) {
            touched.insert((p.namespace.clone(), p.job_name.clone()));
        }
        let earlier = self.pulls.get(&pod_key).is_none_or(|x| e.at_ms < x.at_ms);
        if earlier {
            self.pulls.insert(pod_key, e);
        }
    }

    /// The jobs whose Workload waits for quota (not finished).
    pub fn waiting_for_quota(&self) -> BTreeSet<(String, String)> {
        self.workloads
            .iter()
            .filter(|(k, w)| {
                !k.starts_with("@deleted/")
                    && w.conditions.get("QuotaReserved").is_some_and(|c| !c.status)
                    && w.conditions.get("Finished").is_none_or(|c| !c.status)
            })
            .map(|(_, w)| (w.namespace.clone(), w.job_name.clone()))
            .collect()
    }

    /// Every resource has been listed once.
    pub fn ready(&self) -> bool {
        self.listed.len() == 3
    }

    /// Every job the caches know.
    pub fn jobs(&self) -> BTreeSet<(String, String)> {
        let mut out: BTreeSet<(String, String)> =
            self.workloads.values().map(|w| (w.namespace.clone(), w.job_name.clone())).collect();
        out.extend(self.pods.values().map(|p| (p.namespace.clone(), p.job_name.clone())));
        out
    }
}

/// Reads LocalQueues, ResourceFlavors and the visibility API, with caches: a LocalQueue's ClusterQueue and a
/// flavor's node labels, once read, for the process's life; a failed read (not found yet, not allowed, the API
/// server away) is tried again after [`LOOKUP_RETRY`], so one failure does not settle a job's pool or class.
pub struct Lookup {
    client: kube::Client,
    api_version: String,
    visibility: bool,
    queues: HashMap<(String, String), Cached<String>>,
    flavors: HashMap<String, Cached<std::collections::BTreeMap<String, String>>>,
    visibility_warned: bool,
    /// The last pending-workloads listing of each ClusterQueue, and when it was read.
    positions: HashMap<String, (tokio::time::Instant, Value)>,
}

/// How long one ClusterQueue's pending-workloads listing answers position questions.
pub const POSITIONS_FRESH: Duration = Duration::from_secs(2);

/// How long a failed LocalQueue or ResourceFlavor read stands before it is tried again.
pub const LOOKUP_RETRY: Duration = Duration::from_secs(30);

/// A lookup's answer: read, or failed at an instant (tried again after [`LOOKUP_RETRY`]).
enum Cached<T> {
    Read(T),
    Failed(tokio::time::Instant),
}

impl<T: Clone> Cached<T> {
    /// The answer to use without asking again: `Some(Some(v))` read, `Some(None)` failed recently, `None` ask.
    fn usable(&self) -> Option<Option<T>> {
        match self {
            Cached::Read(v) => Some(Some(v.clone())),
            Cached::Failed(at) if at.elapsed() < LOOKUP_RETRY => Some(None),
            Cached::Failed(_) => None,
        }
    }
}

impl Lookup {
    /// Lookups through `client`.
    pub fn new(client: kube::Client, s: &Settings) -> Lookup {
        Lookup {
            client,
            api_version: s.api_version.clone(),
            visibility: s.visibility,
            queues: HashMap::new(),
            flavors: HashMap::new(),
            visibility_warned: false,
            positions: HashMap::new(),
        }
    }

    async fn get(&self, path: &str) -> Result<Value, kube::Error> {
        let req = http::Request::get(path).body(Vec::new()).map_err(kube::Error::HttpError)?;
        self.client.request::<Value>(req).await
    }

    /// The ClusterQueue of a LocalQueue (None when it cannot be read).
    pub async fn cluster_queue(&mut self, namespace: &str, lq: &str) -> Option<String> {
        if lq.is_empty() {
            return None;
        }
        let k = (namespace.to_string(), lq.to_string());
        if let Some(v) = self.queues.get(&k).and_then(Cached::usable) {
            return v;
        }
        let path = format!("/apis/kueue.x-k8s.io/{}/namespaces/{namespace}/localqueues/{lq}", self.api_version);
        let cq = match self.get(&path).await {
            Ok(v) => v["spec"]["clusterQueue"].as_str().filter(|c| !c.is_empty()).map(str::to_string),
            Err(e) => {
                tracing::debug!(error = %e, "localqueue not readable");
                None
            }
        };
        let entry = match &cq {
            Some(c) => Cached::Read(c.clone()),
            None => Cached::Failed(tokio::time::Instant::now()),
        };
        self.queues.insert(k, entry);
        cq
    }

    /// A ResourceFlavor's `spec.nodeLabels`.
    pub async fn flavor_labels(&mut self, flavor: &str) -> std::collections::BTreeMap<String, String> {
        if let Some(v) = self.flavors.get(flavor).and_then(Cached::usable) {
            return v.unwrap_or_default();
        }
        let path = format!("/apis/kueue.x-k8s.io/{}/resourceflavors/{flavor}", self.api_version);
        let (labels, entry) = match self.get(&path).await {
            Ok(v) => {
                let labels = super::string_map(&v["spec"]["nodeLabels"]);
                (labels.clone(), Cached::Read(labels))
            }
            Err(e) => {
                tracing::debug!(error = %e, "resourceflavor not readable");
                (Default::default(), Cached::Failed(tokio::time::Instant::now()))
            }
        };
        self.flavors.insert(flavor.to_string(), entry);
        labels
    }

    /// A pending Workload's position in its ClusterQueue, from `visibility.kueue.x-k8s.io/v1beta1`. One listing
    /// per ClusterQueue serves every Workload asking within [`POSITIONS_FRESH`].
    pub async fn position(&mut self, cq: &str, namespace: &str, workload: &str) -> Option<u64> {
        if !self.visibility || cq.is_empty() {
            return None;
        }
        let find = |v: &Value| {
            v["items"].as_array()?.iter().find_map(|i| {
                (i["metadata"]["name"].as_str() == Some(workload)
                    && i["metadata"]["namespace"].as_str() == Some(namespace))
                .then(|| i["positionInClusterQueue"].as_u64())
                .flatten()
            })
        };
        if let Some((at, v)) = self.positions.get(cq) {
            if at.elapsed() < POSITIONS_FRESH {
                return find(v);
            }
        }
        let path = format!("/apis/visibility.kueue.x-k8s.io/v1beta1/clusterqueues/{cq}/pendingworkloads?limit=1000");
        match self.get(&path).await {
            Ok(v) => {
                let p = find(&v);
                self.positions.insert(cq.to_string(), (tokio::time::Instant::now(), v));
                p
            }
            Err(e) => {
                if !self.visibility_warned {
                    self.visibility_warned = true;
                    tracing::warn!(error = %e, "Kueue's visibility API is not readable: queued events carry no position");
                }
                None
            }
        }
    }
}

/// Diffs the touched jobs against their memories and records the events.
#[allow(clippy::too_many_arguments)]
pub async fn diff_jobs(
    m: &Mapping,
    s: &Settings,
    caches: &mut Caches,
    lookup: &mut Lookup,
    touched: &BTreeSet<(String, String)>,
    spool: &crate::spool::Spool,
    memory: &MemoryStore,
    report: &mut PollReport,
    now_ms: i64,
) -> Result<(), PollError> {
    for (ns, job) in touched {
        let id = super::startline_id(m, ns, job);
        let mem = memory.get(&id);
        if mem.done {
            continue;
        }
        let workload = caches
            .workloads
            .iter()
            .filter(|(k, w)| !k.starts_with("@deleted/") && w.namespace == *ns && w.job_name == *job)
            .map(|(_, w)| w)
            .max_by_key(|w| w.created_ms)
            .or_else(|| {
                caches
                    .workloads
                    .iter()
                    .filter(|(k, w)| k.starts_with("@deleted/") && w.namespace == *ns && w.job_name == *job)
                    .map(|(_, w)| w)
                    .max_by_key(|w| w.created_ms)
            });
        let deleted = caches.deleted.contains(&(ns.clone(), job.clone()))
            && !caches
                .workloads
                .iter()
                .any(|(k, w)| !k.starts_with("@deleted/") && w.namespace == *ns && w.job_name == *job);
        if workload.is_none() && !s.plain_jobs {
            continue;
        }
        let pods: Vec<&Pod> = caches.pods.values().filter(|p| p.namespace == *ns && p.job_name == *job).collect();
        let pulls: Vec<&PullEvent> =
            pods.iter().filter_map(|p| caches.pulls.get(&format!("{ns}/{}", p.name))).collect();
        let mut look = Lookups::default();
        if let Some(w) = workload {
            // Read (from the caches, mostly) at every diff: a pool or class learned after the submit is sent as an
            // update of the job's attributes.
            let flagged =
                m.queues.contains_key(&w.queue_name) || m.queues.contains_key(&format!("{ns}/{}", w.queue_name));
            if w.cluster_queue.is_empty() && !flagged {
                look.cluster_queue = lookup.cluster_queue(ns, &w.queue_name).await;
            }
            if let Some(f) = w.flavors.first() {
                look.flavor_labels = lookup.flavor_labels(f).await;
            }
        }
        // A Workload waiting for quota: its place in the ClusterQueue (one visibility call per queue, cached).
        let waiting_for_quota = workload.is_some_and(|w| {
            w.conditions.get("QuotaReserved").is_some_and(|c| !c.status)
                && w.conditions.get("Finished").is_none_or(|c| !c.status)
        });
        if waiting_for_quota && s.visibility {
            if let Some(w) = workload {
                let cq = m
                    .queues
                    .get(&w.queue_name)
                    .cloned()
                    .or(look.cluster_queue.clone())
                    .or_else(|| Some(w.cluster_queue.clone()).filter(|c| !c.is_empty()));
                let cq = match cq {
                    Some(c) => Some(c),
                    None => lookup.cluster_queue(ns, &w.queue_name).await,
                };
                look.position = match cq {
                    Some(c) => lookup.position(&c, ns, &w.name).await,
                    None => None,
                };
            }
        }
        let objs = JobObjects { workload, workload_deleted: deleted, pods: pods.clone(), pulls: pulls.clone() };
        let (events, new_mem) = diff(m, ns, job, &objs, &look, &mem, now_ms);
        crate::provider::record(spool, memory, &id, &mem, events, &new_mem, report)?;
    }
    // Deleted Workloads are diffed once (their final state), then forgotten.
    for (ns, job) in touched {
        if caches.deleted.remove(&(ns.clone(), job.clone())) {
            caches.workloads.retain(|k, w| !(k.starts_with("@deleted/") && w.namespace == *ns && w.job_name == *job));
        }
    }
    Ok(())
}

/// Where the sweep of jobs gone while the adapter was away stands ([`sweep_vanished`]).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Sweep {
    /// Waiting for the first Workload listing.
    Listing,
    /// Waiting for the watch to reach the listing's resourceVersion.
    After(String),
    /// Caught up: sweep at the next diff.
    Due,
    /// Done for this process.
    Done,
}

/// Whether resourceVersion `v` is at or past `listed`. resourceVersions are opaque, but the API server's are
/// etcd revisions (numbers); anything else counts as caught up.
fn at_or_past(v: &str, listed: &str) -> bool {
    match (v.parse::<u64>(), listed.parse::<u64>()) {
        (Ok(a), Ok(b)) => a >= b,
        _ => true,
    }
}

/// Ends the jobs of the adapter's memory (not done, of its cluster and namespace) whose Workload and pods are
/// all absent from the caches ([`super::vanished`]). Jobs just touched by the caches are left to the diff.
fn sweep_vanished(
    m: &Mapping,
    s: &Settings,
    caches: &Caches,
    memory: &MemoryStore,
    spool: &crate::spool::Spool,
    report: &mut PollReport,
    now_ms: i64,
) -> Result<(), PollError> {
    let present: BTreeSet<String> = caches.jobs().iter().map(|(ns, job)| super::startline_id(m, ns, job)).collect();
    let prefix = format!("k8s/{}/", m.cluster);
    for (id, mem) in memory.entries() {
        let Some(rest) = id.strip_prefix(&prefix) else { continue };
        let in_scope = s.namespace.as_deref().is_none_or(|ns| rest.split('/').next() == Some(ns));
        if mem.done || !in_scope || present.contains(&id) {
            continue;
        }
        let (events, new_mem) = super::vanished(m, &id, &mem, now_ms);
        crate::provider::record(spool, memory, &id, &mem, events, &new_mem, report)?;
    }
    crate::provider::flush(memory)
}

/// The cursor key of a resource's persisted resourceVersion.
pub fn cursor_key(r: Resource) -> String {
    format!("@cursor/kueue/{}", r.name())
}

/// Runs the adapter until `stop`.
pub async fn run(
    m: Mapping,
    s: Settings,
    client: kube::Client,
    spool: crate::spool::Spool,
    memory: MemoryStore,
    metrics: Metrics,
    stop: tokio_util::sync::CancellationToken,
) {
    metrics.register_provider(Provider::Kueue);
    let (tx, mut rx) = mpsc::channel::<Update>(1024);
    let mut tasks = Vec::new();
    for r in [Resource::Workloads, Resource::Pods, Resource::Events] {
        let resume: Option<String> = memory.get_state(&cursor_key(r));
        tasks.push(tokio::spawn(follow(client.clone(), s.clone(), r, resume, tx.clone(), stop.clone())));
    }
    drop(tx);
    let mut caches = Caches::default();
    let mut lookup = Lookup::new(client, &s);
    let mut pending: BTreeSet<(String, String)> = BTreeSet::new();
    let mut sweep = Sweep::Listing;
    // Each resource's latest resourceVersion not saved yet: saved once the updates up to it are diffed and their
    // events spooled. Kept across batches that are not diffed (before every resource's first listing, or after a
    // failed one): those used to lose theirs, so a restart had no position to resume the Workload watch from and
    // what happened while the adapter was down was not replayed.
    let mut unsaved: HashMap<Resource, String> = HashMap::new();
    // Queue positions move without any object changing: Workloads waiting for quota are looked at again on a tick.
    let mut tick = tokio::time::interval(s.position_interval.max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tick.reset();
    loop {
        let first = tokio::select! {
            u = rx.recv() => match u {
                Some(u) => Some(u),
                None => break,
            },
            _ = tick.tick(), if s.visibility => None,
            _ = stop.cancelled() => break,
        };
        let started = tokio::time::Instant::now();
        if first.is_none() {
            pending.extend(caches.waiting_for_quota());
        }
        let mut batch: Vec<Update> = first.into_iter().collect();
        while !batch.is_empty() && batch.len() < 512 {
            match rx.try_recv() {
                Ok(u) => batch.push(u),
                Err(_) => break,
            }
        }
        for u in &batch {
            // The Workload watch has caught up with the first listing once it delivers anything at or past the
            // listing's resourceVersion: a resumed watch has replayed what happened while the adapter was away.
            match u {
                Update::Listed(Resource::Workloads, _, v) if sweep == Sweep::Listing => sweep = Sweep::After(v.clone()),
                Update::Applied(Resource::Workloads, _, v)
                | Update::Deleted(Resource::Workloads, _, v)
                | Update::Bookmark(Resource::Workloads, v) => {
                    if let Sweep::After(listed) = &sweep {
                        if at_or_past(v, listed) {
                            sweep = Sweep::Due;
                        }
                    }
                }
                _ => {}
            }
            match u {
                Update::Failed(r, e) => {
                    metrics.poll_failed(Provider::Kueue, started.elapsed(), e.kind);
                    tracing::warn!(adapter = "kueue", resource = r.name(), kind = e.kind.label(), error = %e, "list/watch failed; retrying");
                }
                Update::Listed(r, _, v)
                | Update::Applied(r, _, v)
                | Update::Deleted(r, _, v)
                | Update::Bookmark(r, v) => {
                    unsaved.insert(*r, v.clone());
                }
            }
            pending.extend(caches.apply(u));
        }
        if !caches.ready() {
            continue;
        }
        let mut report = PollReport::default();
        let now = startline_proto::time::now_ms();
        if sweep == Sweep::Due {
            // Caught up after a start: jobs followed before it whose objects are all gone ended while the adapter
            // was away (a deletion the resumed watch replayed is dated properly; one it could not replay, because
            // the saved position was compacted or never saved, would otherwise stay open for good).
            sweep = match sweep_vanished(&m, &s, &caches, &memory, &spool, &mut report, now) {
                Ok(()) => Sweep::Done,
                Err(e) => {
                    tracing::warn!(adapter = "kueue", error = %e, "recording jobs gone while away failed");
                    Sweep::Due
                }
            };
        }
        let touched = std::mem::take(&mut pending);
        let result = async {
            diff_jobs(&m, &s, &mut caches, &mut lookup, &touched, &spool, &memory, &mut report, now).await?;
            for (r, v) in &unsaved {
                memory
                    .put_state(&cursor_key(*r), v)
                    .map_err(|e| PollError::new(PollErrorKind::Spool, e.to_string()))?;
            }
            crate::provider::flush(&memory)
        }
        .await;
        match result {
            Ok(()) => {
                unsaved.clear();
                report.jobs = caches.jobs().len();
                metrics.poll_succeeded(
                    Provider::Kueue,
                    started.elapsed(),
                    report.jobs,
                    &report.events,
                    std::time::SystemTime::now(),
                );
                if !report.events.is_empty() {
                    tracing::info!(adapter = "kueue", events = report.events.len(), "transitions spooled");
                }
            }
            Err(e) => {
                // Nothing is lost: the jobs are diffed again with the next update (memories move only after
                // their events are spooled).
                metrics.poll_failed(Provider::Kueue, started.elapsed(), e.kind);
                tracing::warn!(adapter = "kueue", error = %e, "recording transitions failed");
                pending.extend(touched);
            }
        }
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// A kube client for `api_server` (no credentials, or a bearer token), or from the environment (`KUBECONFIG`,
/// `~/.kube/config`, or the pod's service account) when None.
pub async fn client(api_server: Option<&str>, token: Option<String>) -> Result<kube::Client, String> {
    let mut config = match api_server {
        Some(url) => kube::Config::new(url.parse().map_err(|e| format!("--api-server {url}: {e}"))?),
        None => kube::Config::infer().await.map_err(|e| format!("no Kubernetes configuration found: {e}"))?,
    };
    if let Some(t) = token {
        config.auth_info.token = Some(t.into());
    }
    config.read_timeout = Some(Duration::from_secs(330));
    kube::Client::try_from(config).map_err(|e| format!("cannot build the Kubernetes client: {e}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_watch_has_caught_up_with_a_listing_at_or_past_its_resource_version() {
        use super::at_or_past;
        assert!(at_or_past("7", "7") && at_or_past("12", "7"));
        assert!(!at_or_past("3", "7"), "a replayed event from before the listing");
        assert!(at_or_past("opaque", "7"), "not a number: counted as caught up");
    }
}
