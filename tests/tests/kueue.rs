//! The Kueue adapter (`startline-agent kueue`) against a local Kubernetes API server of this test (no real one
//! can run here) that implements what the adapter uses: list (with resourceVersion), watch (chunked JSON lines,
//! `ADDED`/`MODIFIED`/`DELETED`, `BOOKMARK`s, an `ERROR` event with `410 Gone` for a compacted version and the
//! relist that must follow), LocalQueue and ResourceFlavor reads and Kueue's visibility API, over the Workload,
//! Pod and Event objects of `tests/fixtures/kueue/` (shapes from Kueue's and Kubernetes' documentation; the
//! Workloads validated here against Kueue's own CRD schema). Times in the fixtures (2024-03-21) are moved to the
//! last hours, keeping their spacing.
//!
//! One job walks quota wait -> provisioning -> pods unschedulable -> bound -> image pull -> eviction -> requeue ->
//! readmission -> first steps from two workers' node agents (ids from the downward-API variables) -> finished,
//! across an adapter restart (the pods were bound while it was down: the replayed watch brings the intermediate
//! states) and a compaction (410, relist); every transition reaches the collector exactly once.

use serde_json::{json, Value};
use startline_tests::{binary, free_port, http_get_text, wait_until, workspace_root, ChildGuard, Collector, NodeAgent};
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn fixture(name: &str) -> Value {
    let p = workspace_root().join("tests/fixtures/kueue").join(name);
    serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("json")
}

const FIXTURE_T0: &str = "2024-03-21T13:40:00Z";

fn ms_of(s: &str) -> Option<i64> {
    let t = humantime::parse_rfc3339_weak(s.trim_end_matches('Z')).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as i64)
}

fn rfc3339(ms: i64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(ms as u64)).to_string()
}

/// Moves every timestamp of the fixture by `shift` ms.
fn shifted(mut v: Value, shift: i64) -> Value {
    fn walk(v: &mut Value, shift: i64) {
        match v {
            Value::String(s) if s.len() == 20 && s.ends_with('Z') && s.starts_with("2024-") => {
                if let Some(ms) = ms_of(s) {
                    *s = rfc3339(ms + shift);
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| walk(x, shift)),
            Value::Object(o) => o.values_mut().for_each(|x| walk(x, shift)),
            _ => {}
        }
    }
    walk(&mut v, shift);
    v
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Res {
    Workloads,
    Pods,
    Events,
}

/// The API server's state.
#[derive(Default)]
struct Store {
    rv: u64,
    objects: BTreeMap<(Res, String), Value>,
    log: Vec<(u64, Res, &'static str, Value)>,
    /// Versions below this are compacted: a watch from one gets 410.
    compacted: u64,
    /// Bumped to end every open watch.
    epoch: u64,
    /// New watches wait while true.
    paused: bool,
    /// (resource, list or watch, resourceVersion asked) of each request.
    requests: Vec<(Res, &'static str, String)>,
    /// The other job's position in its ClusterQueue, as the visibility API answers it (the sample job is next).
    position: u64,
    /// Further objects read by path (LocalQueues, ResourceFlavors): GET answers them, 404 otherwise.
    paths: BTreeMap<String, Value>,
}

#[derive(Clone, Default)]
struct Api(Arc<Mutex<Store>>);

fn obj_key(v: &Value) -> String {
    format!("{}/{}", v["metadata"]["namespace"].as_str().unwrap_or(""), v["metadata"]["name"].as_str().unwrap_or(""))
}

impl Api {
    fn set(&self, r: Res, mut v: Value) {
        let mut s = self.0.lock().expect("lock");
        s.rv += 1;
        let rv = s.rv;
        v["metadata"]["resourceVersion"] = rv.to_string().into();
        let k = (r, obj_key(&v));
        let kind = if s.objects.contains_key(&k) { "MODIFIED" } else { "ADDED" };
        s.objects.insert(k, v.clone());
        s.log.push((rv, r, kind, v));
    }

    fn delete(&self, r: Res, key: &str) {
        let mut s = self.0.lock().expect("lock");
        if let Some(mut v) = s.objects.remove(&(r, key.to_string())) {
            s.rv += 1;
            let rv = s.rv;
            v["metadata"]["resourceVersion"] = rv.to_string().into();
            s.log.push((rv, r, "DELETED", v));
        }
    }

    fn requests(&self, r: Res, what: &str) -> usize {
        self.0.lock().expect("lock").requests.iter().filter(|(x, w, _)| *x == r && *w == what).count()
    }
}

fn res_of(path: &str) -> Option<Res> {
    match path {
        "/apis/kueue.x-k8s.io/v1beta1/workloads" => Some(Res::Workloads),
        "/api/v1/pods" => Some(Res::Pods),
        "/api/v1/events" => Some(Res::Events),
        _ => None,
    }
}

async fn handle(
    axum::extract::State(api): axum::extract::State<Api>,
    uri: axum::http::Uri,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let path = uri.path().to_string();
    let query: BTreeMap<String, String> = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect();
    let json = |status: u16, v: Value| {
        (
            axum::http::StatusCode::from_u16(status).expect("status"),
            [("content-type", "application/json")],
            v.to_string(),
        )
            .into_response()
    };
    if let Some(v) = api.0.lock().expect("lock").paths.get(&path).cloned() {
        return json(200, v);
    }
    if path == "/apis/kueue.x-k8s.io/v1beta1/namespaces/team-a/localqueues/team-a-queue" {
        return json(
            200,
            json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
            "metadata": {"name": "team-a-queue", "namespace": "team-a"}, "spec": {"clusterQueue": "cluster-queue"}}),
        );
    }
    if path == "/apis/kueue.x-k8s.io/v1beta1/resourceflavors/h100" {
        return json(
            200,
            json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor",
            "metadata": {"name": "h100"}, "spec": {"nodeLabels": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}}}),
        );
    }
    if path == "/apis/visibility.kueue.x-k8s.io/v1beta1/clusterqueues/cluster-queue/pendingworkloads" {
        let position = api.0.lock().expect("lock").position;
        // The shape of Kueue's PendingWorkloadsSummary (site: monitor pending workloads on demand).
        return json(
            200,
            json!({"kind": "PendingWorkloadsSummary", "apiVersion": "visibility.kueue.x-k8s.io/v1beta1",
            "metadata": {"creationTimestamp": null}, "items": [
                {"metadata": {"name": "job-other-job-1a2b3", "namespace": "team-a", "creationTimestamp": null},
                 "priority": 1000, "localQueueName": "team-a-queue", "positionInClusterQueue": position, "positionInLocalQueue": position},
                {"metadata": {"name": "job-sample-job-7f2c1", "namespace": "team-a", "creationTimestamp": null},
                 "priority": 1000, "localQueueName": "team-a-queue", "positionInClusterQueue": 1, "positionInLocalQueue": 1}]}),
        );
    }
    let Some(r) = res_of(&path) else {
        return json(
            404,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
        );
    };
    let watch = query.get("watch").is_some_and(|w| w == "true" || w == "1");
    let asked = query.get("resourceVersion").cloned().unwrap_or_default();
    if !watch {
        let mut s = api.0.lock().expect("lock");
        s.requests.push((r, "list", asked));
        let items: Vec<Value> = s.objects.iter().filter(|((x, _), _)| *x == r).map(|(_, v)| v.clone()).collect();
        return json(
            200,
            json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
        );
    }
    let from: u64 = asked.parse().unwrap_or(0);
    let bookmarks = query.get("allowWatchBookmarks").is_some_and(|b| b == "true");
    // Wait out a pause (the test is changing objects behind the adapter's back).
    loop {
        let paused = api.0.lock().expect("lock").paused;
        if !paused {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (epoch, too_old) = {
        let mut s = api.0.lock().expect("lock");
        s.requests.push((r, "watch", asked.clone()));
        (s.epoch, from < s.compacted)
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(64);
    tokio::spawn(async move {
        if too_old {
            let status = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "message": format!("too old resource version: {from}"), "reason": "Expired", "code": 410}});
            let _ = tx.send(Ok(format!("{status}\n"))).await;
            return;
        }
        let mut sent = from;
        let mut ticks = 0u32;
        loop {
            let (batch, rv, over) = {
                let s = api.0.lock().expect("lock");
                let batch: Vec<String> = s
                    .log
                    .iter()
                    .filter(|(v, x, _, _)| *v > sent && *x == r)
                    .map(|(_, _, t, o)| json!({"type": t, "object": o}).to_string())
                    .collect();
                (batch, s.rv, s.epoch != epoch)
            };
            if over {
                return;
            }
            for line in batch {
                if tx.send(Ok(format!("{line}\n"))).await.is_err() {
                    return;
                }
            }
            sent = rv;
            ticks += 1;
            if bookmarks && ticks % 10 == 0 {
                let kind = match r {
                    Res::Workloads => ("kueue.x-k8s.io/v1beta1", "Workload"),
                    Res::Pods => ("v1", "Pod"),
                    Res::Events => ("v1", "Event"),
                };
                let b = json!({"type": "BOOKMARK", "object": {"apiVersion": kind.0, "kind": kind.1,
                    "metadata": {"resourceVersion": rv.to_string(), "annotations": {"k8s.io/initial-events-end": "true"}}}});
                if tx.send(Ok(format!("{b}\n"))).await.is_err() {
                    return;
                }
            }
            // The server ends a watch now and then (as API servers do at their timeout).
            if ticks >= 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let body = axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    axum::response::Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(body)
        .expect("response")
}

fn start_api(api: &Api) -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr");
    let api = api.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            let app = axum::Router::new().fallback(handle).with_state(api);
            let _ = axum::serve(listener, app).await;
        });
    });
    addr
}

fn adapter(collector: &str, api: std::net::SocketAddr, spool: &std::path::Path, metrics: u16) -> ChildGuard {
    ChildGuard(
        Command::new(binary("startline-agent"))
            .args(["--collector", collector, "kueue", "--metrics-listen", &format!("127.0.0.1:{metrics}")])
            .args(["--api-server", &format!("http://{api}"), "--cluster", "c1", "--retry", "200ms"])
            .args(["--position-interval", "300ms"])
            .args(["--urgent-priority-class", "high-priority", "--team-label", "team", "--region", "europe-west4"])
            .arg("--spool")
            .arg(spool)
            .env_remove("KUBECONFIG")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("adapter"),
    )
}

const JOB: &str = "/api/v1/jobs/k8s/c1/team-a/sample-job";

fn adapter_events(c: &Collector) -> Vec<(String, Value)> {
    c.get(JOB).1["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e["source"] == "kueue-adapter/c1")
        .map(|e| (e["kind"].as_str().unwrap_or("").to_string(), e))
        .collect()
}

fn has(c: &Collector, kind: &str, n: usize) -> bool {
    adapter_events(c).iter().filter(|(k, _)| k == kind).count() >= n
}

#[test]
fn workload_fixtures_validate_against_kueues_crd() {
    // Kueue's CRDs for Workloads, LocalQueues and ResourceFlavors (each from Kueue's repository, see their headers).
    let crds: Vec<std::ffi::OsString> = ["workloads", "localqueues", "resourceflavors"]
        .iter()
        .flat_map(|c| {
            let p = workspace_root().join(format!("tests/fixtures/kueue/kueue.x-k8s.io_{c}.yaml"));
            [std::ffi::OsString::from("--crd"), p.into_os_string()]
        })
        .collect();
    let run = |yaml: &str| -> Vec<Value> {
        let mut child = Command::new("python3")
            .arg(workspace_root().join("tests/python/validate_k8s.py"))
            .args(["--k8s", "1.30.0"])
            .args(&crds)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 with kubernetes-validate, jsonschema and PyYAML (scripts/test.sh installs them)");
        use std::io::Write;
        child.stdin.take().expect("stdin").write_all(yaml.as_bytes()).expect("write");
        let out = child.wait_with_output().expect("validator");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).expect("json");
        v["results"].as_array().expect("results").clone()
    };
    let mut n = 0;
    for e in std::fs::read_dir(workspace_root().join("tests/fixtures/kueue")).expect("fixtures") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "json") {
            let results = run(&std::fs::read_to_string(&p).expect("read"));
            assert_eq!(results.len(), 1, "{}", p.display());
            assert!(results[0]["errors"].as_array().expect("errors").is_empty(), "{}: {}", p.display(), results[0]);
            let file = p.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_default();
            if file.starts_with("workload-") {
                assert_eq!(results[0]["version"], "crd kueue.x-k8s.io/v1beta1", "{}: checked by the CRD", p.display());
                n += 1;
            }
            if file.starts_with("localqueue-") || file.starts_with("resourceflavor-") {
                assert_eq!(results[0]["version"], "crd kueue.x-k8s.io/v1beta2", "{}: checked by the CRD", p.display());
            }
        }
    }
    assert!(n >= 6, "every Workload state of the scenario");
    // The guard: the CRD's schema rejects a malformed Workload.
    let mut broken = fixture("workload-admitted.json");
    broken["spec"]["podSets"][0]["count"] = "two".into();
    broken["status"]["conditions"][0]["status"] = "Maybe".into();
    let r = run(&broken.to_string());
    assert!(r[0]["errors"].as_array().expect("errors").len() >= 2, "{}", r[0]);
}

#[test]
fn a_kueue_job_is_followed_through_list_watch_a_restart_and_a_relist_exactly_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    // Whole seconds: the objects' timestamps have no fraction.
    let shift = (startline_proto::time::now_ms() - 3 * 3_600_000 - ms_of(FIXTURE_T0).expect("t0")) / 1000 * 1000;
    let f = |name: &str| shifted(fixture(name), shift);
    let api = Api::default();
    let addr = start_api(&api);
    api.set(Res::Workloads, f("workload-pending-quota.json"));
    let mut other = f("workload-inadmissible.json");
    other["metadata"]["name"] = "job-other-job-1a2b3".into();
    other["metadata"]["ownerReferences"][0]["name"] = "other-job".into();
    api.set(Res::Workloads, other);
    let spool = dir.path().join("spool");

    // 1. Quota wait, with Kueue's message and the position from the visibility API.
    let mut first = adapter(&c.endpoint(), addr, &spool, free_port());
    wait_until("the quota wait", Duration::from_secs(60), || c.get(JOB).1["state"] == "queued");
    let (_, j) = c.get(JOB);
    assert_eq!(
        (j["pool"].as_str(), j["team"].as_str(), j["priority"].as_str()),
        (Some("cluster-queue"), Some("vision"), Some("urgent"))
    );
    assert_eq!(
        (j["gpu_count"].as_u64(), j["gpu_class"].as_str(), j["provider"].as_str()),
        (Some(8), Some("h100"), Some("kueue"))
    );
    let q = &adapter_events(&c).into_iter().find(|(k, _)| k == "queued").expect("queued").1;
    assert_eq!((q["detail"]["reason"].as_str(), q["detail"]["raw_reason"].as_str()), (Some("quota"), Some("Pending")));
    let msg = q["detail"]["message"].as_str().unwrap_or("");
    assert!(msg.starts_with("couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor h100, 4 more needed"), "{msg}");
    assert!(msg.ends_with("(position 1 in ClusterQueue)"), "{msg}");
    assert_eq!(q["detail"]["queue_position"], 1);
    wait_until("the misconfigured job", Duration::from_secs(30), || {
        c.get("/api/v1/jobs/k8s/c1/team-a/other-job").1["current_wait"]["reason"] == "misconfigured"
            || c.get("/api/v1/jobs/k8s/c1/team-a/other-job").1["events"]
                .as_array()
                .is_some_and(|e| e.iter().any(|e| e["detail"]["reason"] == "misconfigured"))
    });

    // The other job's place in the queue moves while nothing else changes (positions are read on a tick): a
    // new Queued with the same reason and the new position, dated when it was seen.
    let other_queued = || -> Vec<Value> {
        c.get("/api/v1/jobs/k8s/c1/team-a/other-job").1["events"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e["kind"] == "queued")
            .collect()
    };
    assert_eq!(other_queued()[0]["detail"]["queue_position"], 0);
    api.0.lock().expect("lock").position = 3;
    wait_until("the position move", Duration::from_secs(30), || other_queued().len() == 2);
    let moved = &other_queued()[1];
    assert_eq!(
        (moved["detail"]["queue_position"].as_u64(), moved["detail"]["reason"].as_str()),
        (Some(3), Some("misconfigured"))
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(other_queued().len(), 2, "an unchanged position sends nothing");

    // 2. Quota reserved, the ProvisioningRequest check pending; then admitted with both pods unschedulable.
    api.set(Res::Workloads, f("workload-admission-check-pending.json"));
    wait_until("provisioning", Duration::from_secs(30), || c.get(JOB).1["state"] == "preparing");
    api.set(Res::Workloads, f("workload-admitted.json"));
    let pod = |fixture_name: &str, name: &str| {
        let mut p = f(fixture_name);
        p["metadata"]["name"] = name.into();
        p
    };
    api.set(Res::Pods, pod("pod-unschedulable.json", "sample-job-0-x7k2p"));
    api.set(Res::Pods, pod("pod-unschedulable.json", "sample-job-1-q9z8d"));
    wait_until("the capacity wait", Duration::from_secs(30), || has(&c, "queued", 2));

    // 3. The adapter stops; while it is down the pods are bound and the image pulled; it comes back and the watch
    //    from its persisted resourceVersions replays what it missed.
    let _ = first.0.kill();
    let _ = first.0.wait();
    let watches_before = api.requests(Res::Pods, "watch");
    let persisted_from = api.0.lock().expect("lock").rv;
    let mut bound1 = pod("pod-container-creating.json", "sample-job-1-q9z8d");
    api.set(Res::Pods, pod("pod-container-creating.json", "sample-job-0-x7k2p"));
    bound1["status"]["conditions"][4]["lastTransitionTime"] =
        rfc3339(ms_of("2024-03-21T13:58:04Z").expect("t") + shift).into();
    api.set(Res::Pods, bound1);
    api.set(Res::Events, f("event-pulling.json"));
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let second = adapter(&c.endpoint(), addr, &spool, metrics.port());
    wait_until("the image pull", Duration::from_secs(60), || has(&c, "preparing", 2));
    assert!(has(&c, "node_assigned", 1));
    {
        let s = api.0.lock().expect("lock");
        let resumed: Vec<u64> = s
            .requests
            .iter()
            .filter(|(r, w, _)| *r == Res::Pods && *w == "watch")
            .skip(watches_before)
            .filter_map(|(_, _, v)| v.parse().ok())
            .collect();
        assert!(resumed.first().is_some_and(|v| *v <= persisted_from), "the first watch after the restart resumes from the persisted version: {resumed:?} (store at {persisted_from})");
    }

    // 4. Compaction behind the adapter's back: its watches end, the job is evicted and requeued, the versions it
    //    knows are compacted: 410, relist.
    let lists_before = api.requests(Res::Workloads, "list");
    {
        let mut s = api.0.lock().expect("lock");
        s.paused = true;
        s.epoch += 1;
    }
    std::thread::sleep(Duration::from_millis(300));
    api.set(Res::Workloads, f("workload-evicted.json"));
    api.delete(Res::Pods, "team-a/sample-job-0-x7k2p");
    api.delete(Res::Pods, "team-a/sample-job-1-q9z8d");
    {
        let mut s = api.0.lock().expect("lock");
        s.compacted = s.rv;
        s.paused = false;
    }
    wait_until("the eviction and requeue", Duration::from_secs(60), || {
        has(&c, "preempted", 1) && has(&c, "requeued", 1)
    });
    assert!(api.requests(Res::Workloads, "list") > lists_before, "a relist after 410");
    wait_until("the second quota wait", Duration::from_secs(30), || has(&c, "queued", 3));

    // 5. Readmitted; two new pods bound; each worker's node agent reports its first step under the job's id (from
    //    the downward-API variables); then Kueue says Finished.
    let mut readmitted = f("workload-finished.json");
    readmitted["status"]["conditions"].as_array_mut().expect("conditions").retain(|c| c["type"] != "Finished");
    api.set(Res::Workloads, readmitted);
    for (name, at) in [("sample-job-0-r2d2c", "2024-03-21T14:21:00Z"), ("sample-job-1-c3p0x", "2024-03-21T14:21:30Z")] {
        let mut p = pod("pod-container-creating.json", name);
        p["metadata"]["creationTimestamp"] = rfc3339(ms_of("2024-03-21T14:20:01Z").expect("t") + shift).into();
        p["status"]["conditions"][4]["lastTransitionTime"] = rfc3339(ms_of(at).expect("t") + shift).into();
        api.set(Res::Pods, p);
    }
    wait_until("the second assignment", Duration::from_secs(30), || has(&c, "node_assigned", 2));
    let node = NodeAgent::start(&[&c.endpoint()], &dir.path().join("node-spool"));
    let first_step_at = |worker: &str, at: i64| {
        let out = Command::new(binary("startline-agent"))
            .args(["emit", "first_step", "--agent", &format!("http://{}", node.addr), "-f", "step=1"])
            .args(["-f", &format!("occurred_at={}", rfc3339(at))])
            .env_clear()
            .env("STARTLINE_CLUSTER", "c1")
            .env("STARTLINE_K8S_NAMESPACE", "team-a")
            .env("STARTLINE_K8S_JOBSET_NAME", "")
            .env("STARTLINE_K8S_KUBEFLOW_JOB_NAME", "")
            .env("STARTLINE_K8S_JOB_NAME", "sample-job")
            .env("POD_NAMESPACE", "team-a")
            .env("POD_NAME", worker)
            .output()
            .expect("emit");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    let step0 = ms_of("2024-03-21T14:23:00Z").expect("t") + shift;
    first_step_at("sample-job-1-c3p0x", step0 + 20_000);
    first_step_at("sample-job-0-r2d2c", step0);
    wait_until("running", Duration::from_secs(30), || c.get(JOB).1["state"] == "running");
    api.set(Res::Workloads, f("workload-finished.json"));
    wait_until("done", Duration::from_secs(30), || c.get(JOB).1["state"] == "done");

    let (_, j) = c.get(JOB);
    assert_eq!(j["outcome"], "succeeded");
    let kinds: Vec<String> = adapter_events(&c).into_iter().map(|(k, _)| k).collect();
    let count = |k: &str| kinds.iter().filter(|x| *x == k).count();
    assert_eq!(
        (
            count("submitted"),
            count("queued"),
            count("preparing"),
            count("node_assigned"),
            count("preempted"),
            count("requeued"),
            count("done")
        ),
        (1, 3, 2, 2, 1, 1, 1),
        "each transition once: {kinds:?}"
    );
    let events = j["events"].as_array().expect("events");
    let firsts: Vec<&Value> = events.iter().filter(|e| e["kind"] == "first_step").collect();
    assert_eq!(firsts.len(), 2, "both workers' first steps on the job's one timeline");
    assert!(firsts.iter().all(|e| e["source"].as_str().is_some_and(|s| s.starts_with("node-agent/"))));
    let ms = |v: &Value| {
        v.as_str()
            .and_then(|s| humantime::parse_rfc3339(s).ok())
            .map(|t| t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64))
    };
    let m = &j["timeline"]["milestones"];
    assert_eq!(ms(&m["first_step"]), Some(step0), "the first worker's first step is the job's");
    assert_eq!(ms(&m["submitted"]), Some(ms_of(FIXTURE_T0).expect("t0") + shift));
    assert_eq!(
        ms(&m["node_assigned"]),
        Some(ms_of("2024-03-21T13:58:04Z").expect("t") + shift),
        "the last of the first two pods bound"
    );
    let w = &j["timeline"]["initial_wait_seconds"];
    for seg in ["queued:quota", "preparing:provisioning", "queued:capacity", "preparing:image_pull"] {
        assert!(w[seg].is_number(), "{seg}: {w}");
    }
    assert_eq!(j["timeline"]["preemptions"], 1);

    let text = http_get_text(metrics, "/metrics").1;
    let last = startline_agent::metrics::sample(
        &text,
        "startline_agent_last_successful_poll_timestamp_seconds",
        &[("provider", "kueue")],
    );
    assert!(last.is_some_and(|t| t > 0.0), "{text}");
    let transitions = startline_agent::metrics::sample(
        &text,
        "startline_agent_transitions_total",
        &[("provider", "kueue"), ("kind", "done")],
    );
    assert!(transitions.is_some_and(|n| n >= 1.0), "{text}");
    drop(second);
}

fn ms_value(v: &Value) -> Option<i64> {
    v.as_str()
        .and_then(|s| humantime::parse_rfc3339(s).ok())
        .map(|t| t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64))
}

/// A GPU job as Kueue's provisioning example writes it (no GPU model in its pod template): the class comes with
/// the flavor Kueue admits it to, after `submitted` went out. The update reaches the collector's job, and an SLO
/// selecting that class covers the job. The pool is the LocalQueue's ClusterQueue before admission (read from the
/// LocalQueue object), and the admission's ClusterQueue once admitted when the LocalQueue could not be read.
#[test]
fn attributes_learned_at_admission_reach_the_collectors_job_and_slo_selectors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("collector.toml");
    std::fs::write(
        &cfg,
        "[[slo]]\nname = \"t4-start\"\nthreshold = \"10h\"\nobjective = 95\nwindow = \"2d\"\nselector = { gpu_class = [\"t4\"] }\n",
    )
    .expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf8")]);
    // Three hours back: the whole history, up to the finish (20:00 -> 21:10), lies in the past.
    let shift =
        (startline_proto::time::now_ms() - 3 * 3_600_000 - ms_of("2024-05-03T20:00:00Z").expect("t0")) / 1000 * 1000;
    let f = |name: &str| shifted(fixture(name), shift);
    let api = Api::default();
    let addr = start_api(&api);
    {
        // Kueue's LocalQueue and the GPU flavor, where the adapter reads them (v1beta1 paths, its default).
        let mut s = api.0.lock().expect("lock");
        let mut lq = fixture("localqueue-user-queue.json");
        lq["apiVersion"] = "kueue.x-k8s.io/v1beta1".into();
        s.paths.insert("/apis/kueue.x-k8s.io/v1beta1/namespaces/default/localqueues/user-queue".into(), lq);
        let mut flavor = fixture("resourceflavor-gpu.json");
        flavor["apiVersion"] = "kueue.x-k8s.io/v1beta1".into();
        s.paths.insert("/apis/kueue.x-k8s.io/v1beta1/resourceflavors/tas-gpu-default".into(), flavor);
    }
    // Job A on the readable LocalQueue; job B on one that cannot be read (404).
    let job_b = |mut w: Value| {
        w["metadata"]["name"] = "job-sample-job-b-1d2e3".into();
        w["metadata"]["ownerReferences"][0]["name"] = "sample-job-b".into();
        w["spec"]["queueName"] = "unreadable-queue".into();
        w
    };
    api.set(Res::Workloads, f("workload-gpu-pending.json"));
    api.set(Res::Workloads, job_b(f("workload-gpu-pending.json")));
    let spool = dir.path().join("spool");
    let _adapter = adapter(&c.endpoint(), addr, &spool, free_port());
    let a = "/api/v1/jobs/k8s/c1/default/sample-job-8c7d2";
    let b = "/api/v1/jobs/k8s/c1/default/sample-job-b";
    wait_until("both jobs queued", Duration::from_secs(60), || {
        c.get(a).1["state"] == "queued" && c.get(b).1["state"] == "queued"
    });
    let (_, ja) = c.get(a);
    assert_eq!((ja["pool"].as_str(), ja["gpu_class"].as_str()), (Some("cluster-queue"), Some("")), "before admission");
    assert_eq!(c.get(b).1["pool"], "unreadable-queue", "only the LocalQueue's name is known");
    assert_eq!(c.get("/api/v1/slos/t4-start").1["status"]["pending"], 0, "no class yet: not covered");

    // Admitted to the GPU flavor.
    api.set(Res::Workloads, f("workload-gpu-admitted.json"));
    api.set(Res::Workloads, job_b(f("workload-gpu-admitted.json")));
    wait_until("the class from the admitted flavor", Duration::from_secs(60), || {
        c.get(a).1["gpu_class"] == "t4" && c.get(b).1["gpu_class"] == "t4"
    });
    let (_, jb) = c.get(b);
    assert_eq!(jb["pool"], "cluster-queue", "the admission's ClusterQueue");
    assert_eq!(
        ms_value(&c.get(a).1["timeline"]["milestones"]["submitted"]),
        Some(ms_of("2024-05-03T20:00:00Z").expect("t") + shift),
        "the submit time is the Workload's creation still"
    );
    let slo = c.get("/api/v1/slos/t4-start").1;
    assert_eq!(slo["status"]["pending"], 2, "the SLO selecting the class covers both jobs: {slo}");
    let listed = c.get("/api/v1/jobs?gpu_class=t4").1;
    assert_eq!(listed["jobs"].as_array().map(Vec::len), Some(2), "{listed}");

    // Running and finished: decided good under the class's SLO.
    api.set(Res::Workloads, f("workload-gpu-finished.json"));
    wait_until("done", Duration::from_secs(60), || c.get(a).1["state"] == "done");
    let (_, ja) = c.get(a);
    assert_eq!((ja["gpu_class"].as_str(), ja["pool"].as_str()), (Some("t4"), Some("cluster-queue")));
    let submitted: Vec<Value> =
        adapter_events_of(&c, a).into_iter().filter(|(k, _)| k == "submitted").map(|(_, e)| e).collect();
    assert_eq!(submitted.len(), 2, "the submit and one update: {submitted:?}");
}

fn adapter_events_of(c: &Collector, job: &str) -> Vec<(String, Value)> {
    c.get(job).1["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e["source"] == "kueue-adapter/c1")
        .map(|e| (e["kind"].as_str().unwrap_or("").to_string(), e))
        .collect()
}

fn adapter_with(
    collector: &str,
    api: std::net::SocketAddr,
    spool: &std::path::Path,
    metrics: u16,
    extra: &[&str],
) -> ChildGuard {
    ChildGuard(
        Command::new(binary("startline-agent"))
            .args(["--collector", collector, "kueue", "--metrics-listen", &format!("127.0.0.1:{metrics}")])
            .args(["--api-server", &format!("http://{api}"), "--cluster", "c1", "--retry", "200ms"])
            .args(["--position-interval", "300ms", "--team-label", "team"])
            .args(extra)
            .arg("--spool")
            .arg(spool)
            .env_remove("KUBECONFIG")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("adapter"),
    )
}

/// The adapter is stopped while job A waits for quota and job B runs. While it is down A is admitted, runs and
/// finishes, and B is deleted. Restarted, it resumes its watch from its persisted resourceVersion: A's
/// intermediate transitions are rebuilt from its conditions' times (the admission ends the quota wait, the first
/// step at PodsReady, the end at Finished; the rebuilt ones marked `reconstructed:` in their ids), and B ends at
/// its deletionTimestamp, not when the adapter came back.
#[test]
fn jobs_that_moved_on_while_the_adapter_was_down_are_rebuilt_from_their_conditions() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let c = Collector::start(&dir.join("db"), &[]);
    let t = |s: &str| ms_of(s).expect("time");
    let shift = (startline_proto::time::now_ms() - 3 * 3_600_000 - t("2024-05-03T20:00:00Z")) / 1000 * 1000;
    let f = |name: &str| shifted(fixture(name), shift);
    let api = Api::default();
    let addr = start_api(&api);
    {
        let mut s = api.0.lock().expect("lock");
        let mut lq = fixture("localqueue-user-queue.json");
        lq["apiVersion"] = "kueue.x-k8s.io/v1beta1".into();
        s.paths.insert("/apis/kueue.x-k8s.io/v1beta1/namespaces/default/localqueues/user-queue".into(), lq);
        let mut flavor = fixture("resourceflavor-gpu.json");
        flavor["apiVersion"] = "kueue.x-k8s.io/v1beta1".into();
        s.paths.insert("/apis/kueue.x-k8s.io/v1beta1/resourceflavors/tas-gpu-default".into(), flavor);
    }
    let job_b = |mut w: Value| {
        w["metadata"]["name"] = "job-sample-job-b-1d2e3".into();
        w["metadata"]["ownerReferences"][0]["name"] = "sample-job-b".into();
        w
    };
    let mut running = f("workload-gpu-finished.json");
    running["status"]["conditions"].as_array_mut().expect("conditions").retain(|c| c["type"] != "Finished");
    api.set(Res::Workloads, f("workload-gpu-pending.json"));
    api.set(Res::Workloads, job_b(running.clone()));
    let spool = dir.join("spool");
    let a = "/api/v1/jobs/k8s/c1/default/sample-job-8c7d2";
    let b = "/api/v1/jobs/k8s/c1/default/sample-job-b";
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut first = adapter_with(&c.endpoint(), addr, &spool, metrics.port(), &["--first-step-on-start"]);
    wait_until("A queued, B running", Duration::from_secs(60), || {
        c.get(a).1["state"] == "queued" && c.get(b).1["state"] == "running"
    });
    // Counted once the batch's watch positions are saved (the collector may have the events before that).
    wait_until("the first adapter saved its watch positions", Duration::from_secs(30), || {
        startline_agent::metrics::sample(
            &http_get_text(metrics, "/metrics").1,
            "startline_agent_transitions_total",
            &[("provider", "kueue"), ("kind", "first_step")],
        )
        .is_some_and(|n| n >= 1.0)
    });
    let _ = first.0.kill();
    let _ = first.0.wait();

    // While the adapter is down.
    api.set(Res::Workloads, f("workload-gpu-admitted.json"));
    api.set(Res::Workloads, running);
    api.set(Res::Workloads, f("workload-gpu-finished.json"));
    api.set(Res::Workloads, job_b(f("workload-gpu-deleted.json")));
    api.delete(Res::Workloads, "default/job-sample-job-b-1d2e3");
    let back = startline_proto::time::now_ms();

    let _second = adapter_with(&c.endpoint(), addr, &spool, free_port(), &["--first-step-on-start"]);
    let done =
        wait_until_quiet(Duration::from_secs(60), || c.get(a).1["state"] == "done" && c.get(b).1["state"] == "done");
    assert!(done, "A: {}\nB: {}", c.get(a).1, c.get(b).1);
    let at = |s: &str| Some(t(s) + shift);

    let (_, ja) = c.get(a);
    let m = &ja["timeline"]["milestones"];
    assert_eq!(ms_value(&m["submitted"]), at("2024-05-03T20:00:00Z"));
    assert_eq!(ms_value(&m["first_step"]), at("2024-05-03T20:04:30Z"), "PodsReady, not the adapter's return");
    assert_eq!(ms_value(&m["done"]), at("2024-05-03T21:10:00Z"));
    let w = &ja["timeline"]["initial_wait_seconds"];
    assert_eq!(
        w["queued:quota"].as_f64(),
        Some((t("2024-05-03T20:01:59Z") - t("2024-05-03T20:00:05Z")) as f64 / 1000.0),
        "{w}"
    );
    assert_eq!(
        w["preparing:other"].as_f64(),
        Some((t("2024-05-03T20:04:30Z") - t("2024-05-03T20:01:59Z")) as f64 / 1000.0),
        "{w}"
    );
    assert_eq!((ja["outcome"].as_str(), ja["gpu_class"].as_str()), (Some("succeeded"), Some("t4")));
    let rebuilt: Vec<String> = adapter_events_of(&c, a)
        .into_iter()
        .filter_map(|(_, e)| e["event_id"].as_str().filter(|id| id.contains(":reconstructed:")).map(str::to_string))
        .collect();
    assert_eq!(rebuilt.len(), 1, "the admission, marked: {rebuilt:?}");

    let (_, jb) = c.get(b);
    assert_eq!(jb["outcome"], "cancelled");
    assert_eq!(ms_value(&jb["timeline"]["milestones"]["done"]), at("2024-05-03T20:30:00Z"), "the deletion time");
    assert!(ms_value(&jb["timeline"]["milestones"]["done"]).is_some_and(|d| d < back));
}

fn wait_until_quiet(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + limit;
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}
