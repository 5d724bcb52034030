//! In-process router tests: every route answered by [`super::router`] over a small fixed index (hot and folded
//! jobs in every state, two SLOs, two alerts) with a fixed clock, no socket.
//!
//! Each answer is compared byte for byte (status, then body) with a golden file in `api/golden/`, captured from
//! the API as it answered before its responses were typed: any change to a field name, nesting, value type,
//! null versus absent, number formatting or key order fails here. Values that grow with the clock
//! (`waiting_seconds` and the open initial-wait segment of a waiting job) are masked first.
//! `STARTLINE_BLESS=1` rewrites the golden files (only when an answer is meant to change).

use super::{router, ApiState};
use crate::alert::{AlertBoard, AlertRecord};
use crate::index::labels::{LabelLimiter, LabelSettings};
use crate::index::{JobIndex, SharedIndex};
use crate::job::{CompactEvent, JobRecord};
use crate::slo::{SloDef, SloEngine};
use crate::store::{encode_log_value, FoldWrite, Store};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_proto::time::ms_to_timestamp;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use tower::ServiceExt;

/// The state's clock: 2026-03-10T12:00:00Z.
const NOW: i64 = 1_773_144_000_000;
const MIN: i64 = 60_000;
const HOUR: i64 = 3_600_000;

struct Fixture {
    state: ApiState,
    _dir: tempfile::TempDir,
}

fn ev(job: &str, n: usize, at: i64, kind: Kind) -> pb::LifecycleEvent {
    pb::LifecycleEvent {
        event_id: format!("{job}#{n}"),
        job_id: job.into(),
        attempt: if n > 6 { Some(2) } else { None },
        source: "test".into(),
        occurred_at: Some(ms_to_timestamp(at)),
        kind: Some(kind),
    }
}

#[allow(clippy::too_many_arguments)]
fn submitted(kind: pb::PoolKind, provider: &str, pool: &str, prio: pb::PriorityClass, gpu: &str, region: &str) -> Kind {
    Kind::Submitted(pb::Submitted {
        pool_kind: kind as i32,
        provider: provider.into(),
        pool: pool.into(),
        priority: prio as i32,
        gpu_class: gpu.into(),
        gpu_count: 8,
        node_count: 1,
        region: region.into(),
        team: "research".into(),
        project: "llm".into(),
        ..Default::default()
    })
}

fn queued(reason: pb::WaitReason, raw: &str) -> Kind {
    Kind::Queued(pb::Queued {
        reason: reason as i32,
        raw_reason: raw.into(),
        message: "waiting".into(),
        estimated_start: None,
        queue_position: None,
    })
}

fn assigned() -> Kind {
    Kind::NodeAssigned(pb::NodeAssigned { nodes: vec!["node-1".into()], gpu_ids: vec!["0".into(), "1".into()] })
}

fn preparing(phase: pb::PreparingPhase) -> Kind {
    Kind::Preparing(pb::Preparing { phase: phase as i32, message: "pulling".into() })
}

fn first_step(step: u64, origin: pb::StepOrigin) -> Kind {
    Kind::FirstStep(pb::FirstStep { step, origin: origin as i32 })
}

fn done(outcome: pb::Outcome, exit_code: Option<i32>) -> Kind {
    Kind::Done(pb::Done { outcome: outcome as i32, exit_code, message: "bye".into() })
}

/// The jobs: every state, every event kind, managed and dedicated, urgent and normal.
fn events() -> Vec<pb::LifecycleEvent> {
    use pb::{Outcome, PoolKind::*, PreparingPhase, PriorityClass::*, WaitReason};
    let mut out = Vec::new();
    let mut job = |id: &str, kinds: Vec<(i64, Kind)>| {
        for (n, (at, k)) in kinds.into_iter().enumerate() {
            out.push(ev(id, n + 1, at, k));
        }
    };
    // Ended 5 h ago after a 15-minute wait; folded below.
    let t = NOW - 8 * HOUR;
    job(
        "slurm/cluster-a/100",
        vec![
            (t, submitted(Dedicated, "slurm", "gpu", Urgent, "h100", "site-a")),
            (t, queued(WaitReason::Capacity, "Resources")),
            (t + 10 * MIN, assigned()),
            (t + 11 * MIN, preparing(PreparingPhase::ImagePull)),
            // Reported by the training process (its node agent).
            (t + 15 * MIN, first_step(0, pb::StepOrigin::TrainingProcess)),
            (t + HOUR, Kind::Checkpoint(pb::Checkpoint { step: 500, uri: "s3://ck/500".into(), save_seconds: 12.5 })),
            (t + 3 * HOUR, done(Outcome::Succeeded, Some(0))),
        ],
    );
    // Managed, normal, with labels and a chain; preempted, requeued and restarted, then failed.
    let t = NOW - 6 * HOUR;
    let mut sub = submitted(Managed, "sagemaker", "ml.p5.48xlarge", Normal, "a100", "us-east-1");
    if let Kind::Submitted(s) = &mut sub {
        s.chain_id = "chain-7".into();
        s.chain_stage = "pretrain".into();
        s.labels = HashMap::from([("owner".into(), "ana".into()), ("exp".into(), "e42".into())]);
    }
    job(
        "sagemaker/123/train-2",
        vec![
            (t, sub),
            (t + MIN, queued(WaitReason::Provisioning, "Starting")),
            (t + 20 * MIN, preparing(PreparingPhase::DataStaging)),
            // The adapter saw the container start; nothing in the container reported the first step.
            (t + 45 * MIN, first_step(1, pb::StepOrigin::ContainerStart)),
            (t + 2 * HOUR, Kind::Preempted(pb::Preempted { reason: "spot".into(), checkpoint_saved: false })),
            (t + 2 * HOUR + MIN, Kind::Requeued(pb::Requeued { resume_step: 0 })),
            (t + 3 * HOUR, Kind::Restarted(pb::Restarted { resume_step: 0 })),
            (
                t + 3 * HOUR + 5 * MIN,
                Kind::NodeLost(pb::NodeLost { node: "ip-10-0-0-1".into(), message: "gone".into() }),
            ),
            (t + 4 * HOUR, done(Outcome::Failed, Some(137))),
        ],
    );
    // Running since 30 minutes ago.
    let t = NOW - 2 * HOUR;
    job(
        "slurm/cluster-b/7",
        vec![
            (t, submitted(Dedicated, "slurm", "gpu-urgent", Normal, "h100", "site-a")),
            (t, queued(WaitReason::Priority, "Priority")),
            (t + 80 * MIN, assigned()),
            // From an agent older than first-step origins.
            (t + 90 * MIN, first_step(0, pb::StepOrigin::Unspecified)),
        ],
    );
    // Managed, urgent, running after a short wait.
    let t = NOW - 3 * HOUR;
    job(
        "vertex/ml-prod/9000001",
        vec![
            (t, submitted(Managed, "vertex", "a3-highgpu-8g", Urgent, "h100", "europe-west4")),
            (t + MIN, queued(WaitReason::Capacity, "STOCKOUT")),
            (t + 30 * MIN, first_step(0, pb::StepOrigin::TrainingProcess)),
        ],
    );
    // Still queued (its wait counts up to the wall clock).
    let t = NOW - 20 * MIN;
    job(
        "slurm/cluster-a/200",
        vec![
            (t, submitted(Dedicated, "slurm", "gpu", Urgent, "a100", "site-a")),
            (t, queued(WaitReason::Quota, "QOSMaxGRESPerUser")),
        ],
    );
    // Never submitted (no attributes), so never done either.
    job(
        "kubernetes/ns/pod-x",
        vec![(NOW - HOUR, queued(WaitReason::Unknown, "")), (NOW - 30 * MIN, done(Outcome::Cancelled, None))],
    );
    out
}

/// The job folded by the fixture.
const FOLDED: &str = "slurm/cluster-a/100";
/// A job left hot.
const HOT: &str = "sagemaker/123/train-2";

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(dir.path()).expect("store");
    let mut entries = Vec::new();
    let mut by_job: BTreeMap<String, Vec<CompactEvent>> = BTreeMap::new();
    for (i, e) in events().iter().enumerate() {
        let seq = i as u64 + 1;
        entries.push((seq, encode_log_value(e)));
        by_job.entry(e.job_id.clone()).or_default().push(CompactEvent::from_pb(e, seq).expect("has kind"));
    }
    store.append_durable(&entries).expect("append");
    let last_seq = entries.len() as u64;
    let jobs: BTreeMap<String, JobRecord> =
        by_job.into_iter().map(|(id, evs)| (id, JobRecord::from_events(evs))).collect();
    // Room for every value, so that gauges (the overview's oldest waits) keep real pool names, not `other`.
    let limiter = LabelLimiter::new(&LabelSettings { max_values_per_label: 50, ..Default::default() });
    let mut index =
        JobIndex::new_at(jobs, Default::default(), last_seq, SloEngine::new(SloDef::defaults()), limiter, NOW);
    // Fold one ended job as the applier does: summary (listing its log entries) written, row in memory.
    let seqs: Vec<u64> = index.jobs[FOLDED].rec.events.iter().map(|e| e.seq).collect();
    let row = index.fold(FOLDED, 0).expect("ended job folds");
    let mut write = [FoldWrite { job_id: FOLDED.into(), log_seqs: seqs, summary: row.encode(), ..Default::default() }];
    store.fold_jobs(&mut write, &index.cold.dict.unpersisted(), last_seq).expect("fold");
    // The row points at the summary the store numbered, as the applier's rows do (replacing the row keeps its
    // attribute set named: removing it first would free the entry).
    index.cold.insert(FOLDED, row.with_summary(write[0].number));
    assert!(index.folded(FOLDED).is_some() && index.jobs.contains_key(HOT));
    let board = AlertBoard::default();
    for (key, started, resolved) in [
        ("job/urgent-start/slurm/cluster-a/200", NOW - 10 * MIN, None),
        ("burn/normal-start/page", NOW - 2 * HOUR, Some(NOW - HOUR)),
    ] {
        board.insert(AlertRecord {
            key: key.into(),
            labels: BTreeMap::from([("alertname".into(), "StartlineUrgentStart".into()), ("slo".into(), "x".into())]),
            annotations: BTreeMap::from([("summary".into(), "waited \u{2265} 10 min".into())]),
            starts_at_ms: started,
            resolved_at_ms: resolved,
        });
    }
    let state = ApiState {
        index: SharedIndex::new(index),
        store,
        ready: Arc::new(AtomicBool::new(true)),
        health: Arc::new(crate::health::Health::default()),
        max_page_size: 3,
        reads: super::reads::ReadGate::new(2),
        backups: Default::default(),
        clock: crate::time::Clock::starting_at(NOW),
        board,
        telemetry: None,
        auth: std::sync::Arc::new(crate::auth::Auth::open()),
        sessions: Default::default(),
        reload: None,
        cost: Arc::new(cost_model()),
        final_stages: Arc::new(vec!["quantize".to_string()]),
        nodes: Default::default(),
        node_health: Default::default(),
        chain_slos: Default::default(),
    };
    Fixture { state, _dir: dir }
}

/// Prices for the fixture's pools: managed per use, the dedicated `gpu` pool amortised, `ml-prod` unpriced.
fn cost_model() -> crate::compare::cost::CostModel {
    let s: crate::compare::cost::CostSection = toml::from_str(
        "[[price]]\nmatch = \"pool_kind=managed,provider=sagemaker\"\nper_gpu_hour = 4.0\n\
         [[dedicated]]\npool = \"gpu\"\ngpus = 16\nper_gpu_hour = 1.25\n",
    )
    .expect("toml");
    let mut errs = Vec::new();
    let m = s.validate(&mut errs);
    assert!(errs.is_empty(), "{errs:?}");
    m
}

/// One request through the router: status, content type and body text.
async fn call(state: &ApiState, method: &str, uri: &str) -> (StatusCode, String, String) {
    let req = Request::builder().method(method).uri(uri).body(Body::empty()).expect("request");
    let res = router(state.clone()).oneshot(req).await.expect("infallible");
    let status = res.status();
    let ctype =
        res.headers().get(axum::http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let body = res.into_body().collect().await.expect("body").to_bytes();
    (status, ctype, String::from_utf8(body.to_vec()).expect("utf-8"))
}

/// Replaces the value after each `"key":` (a number, or an object without nested objects) with `"<wall>"`.
fn mask(body: &str, key: &str) -> String {
    let pat = format!("\"{key}\":");
    let mut out = String::with_capacity(body.len());
    let mut rest = body;
    while let Some(i) = rest.find(&pat) {
        out.push_str(&rest[..i + pat.len()]);
        rest = &rest[i + pat.len()..];
        let end = if rest.starts_with('{') { rest.find('}').map(|j| j + 1) } else { rest.find([',', '}', ']']) }
            .expect("value ends");
        if &rest[..end] != "null" {
            out.push_str("\"<wall>\"");
        } else {
            out.push_str("null");
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Compares an answer with its golden file (`STARTLINE_BLESS=1` writes it instead).
fn golden(name: &str, status: StatusCode, ctype: &str, body: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/api/golden").join(name);
    let got = format!("{} {ctype}\n{body}\n", status.as_u16());
    if std::env::var_os("STARTLINE_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().expect("dir")).expect("golden dir");
        std::fs::write(&path, &got).expect("write golden");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(got == want, "{name} changed\n--- want\n{want}\n--- got\n{got}");
}

/// Calls `uri`, checks the status, compares with the golden file (after masking wall-clock values) and returns
/// the parsed body.
async fn check(f: &Fixture, name: &str, uri: &str, want: StatusCode) -> serde_json::Value {
    let (status, ctype, body) = call(&f.state, "GET", uri).await;
    assert_eq!(status, want, "{uri}: {body}");
    assert_eq!(ctype, "application/json", "{uri}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    golden(name, status, &ctype, &mask(&body, "waiting_seconds"));
    v
}

/// An error answer: status, golden body, and the one `error` field.
async fn check_error(f: &Fixture, name: &str, uri: &str, want: StatusCode) -> String {
    let v = check(f, name, uri, want).await;
    let obj = v.as_object().expect("object");
    assert_eq!(obj.len(), 1, "{uri}: {v}");
    obj["error"].as_str().expect("error text").to_string()
}

fn ids(v: &serde_json::Value) -> Vec<&str> {
    v["jobs"].as_array().expect("jobs").iter().map(|j| j["job_id"].as_str().expect("id")).collect()
}

#[tokio::test(start_paused = true)]
async fn jobs_listing_filters_and_pages() {
    let f = fixture();
    // The default page (100) is not capped by the configured maximum (3 here).
    let v = check(&f, "jobs_all.json", "/api/v1/jobs?order=job_id", StatusCode::OK).await;
    assert_eq!(ids(&v).len(), 6);
    assert!(v["next_page_token"].is_null());
    let v = check(&f, "jobs_page1.json", "/api/v1/jobs?order=job_id&limit=3", StatusCode::OK).await;
    assert_eq!(ids(&v), ["kubernetes/ns/pod-x", "sagemaker/123/train-2", "slurm/cluster-a/100"]);
    assert_eq!(v["next_page_token"], "slurm/cluster-a/100");
    let v = check(
        &f,
        "jobs_page2.json",
        "/api/v1/jobs?order=job_id&limit=3&page_token=slurm%2Fcluster-a%2F100",
        StatusCode::OK,
    )
    .await;
    assert_eq!(ids(&v), ["slurm/cluster-a/200", "slurm/cluster-b/7", "vertex/ml-prod/9000001"]);
    assert!(v["next_page_token"].is_null());
    let v = check(&f, "jobs_limit1.json", "/api/v1/jobs?order=job_id&limit=1", StatusCode::OK).await;
    assert_eq!(v["next_page_token"], "kubernetes/ns/pod-x");
    let v =
        check(&f, "jobs_managed.json", "/api/v1/jobs?order=job_id&pool_kind=managed&priority=urgent", StatusCode::OK)
            .await;
    assert_eq!(ids(&v), ["vertex/ml-prod/9000001"]);
    let v = check(&f, "jobs_queued.json", "/api/v1/jobs?order=job_id&state=queued", StatusCode::OK).await;
    assert_eq!(ids(&v), ["slurm/cluster-a/200"]);
    assert!(v["jobs"][0]["waiting_seconds"].as_f64().is_some_and(|s| s > 0.0));
    let v = check(
        &f,
        "jobs_provider_time.json",
        "/api/v1/jobs?order=job_id&provider=slurm&pool=gpu&submitted_after=2026-03-10T00:00:00Z&submitted_before=1773142000",
        StatusCode::OK,
    )
    .await;
    assert_eq!(ids(&v), ["slurm/cluster-a/100"]);
    let v = check(&f, "jobs_done.json", "/api/v1/jobs?order=job_id&state=done", StatusCode::OK).await;
    assert_eq!(ids(&v), ["sagemaker/123/train-2", "slurm/cluster-a/100"]);
    let v = check(&f, "jobs_unsubmitted.json", "/api/v1/jobs?order=job_id&state=unsubmitted", StatusCode::OK).await;
    assert_eq!(ids(&v), ["kubernetes/ns/pod-x"]);
    // A job without attributes has no attribute fields at all; nulls stay nulls.
    let j = &v["jobs"][0];
    assert!(j.get("pool").is_none() && j["first_step_at"].is_null() && j["current_wait"].is_null());
    // Attribute filters (gpu_class, region, team, project) against the full listing's own attribute fields.
    let all = check(&f, "jobs_all.json", "/api/v1/jobs?order=job_id", StatusCode::OK).await;
    let with = |field: &str, value: &str| -> Vec<String> {
        all["jobs"]
            .as_array()
            .map(|js| {
                js.iter().filter(|j| j[field] == value).filter_map(|j| j["job_id"].as_str().map(String::from)).collect()
            })
            .unwrap_or_default()
    };
    let h100 = with("gpu_class", "h100");
    assert!(!h100.is_empty() && h100.len() < 6, "a discriminating fixture: {h100:?}");
    let v = check(&f, "jobs_gpu_class.json", "/api/v1/jobs?order=job_id&gpu_class=h100", StatusCode::OK).await;
    assert_eq!(ids(&v), h100);
    let v = check(&f, "jobs_team_region.json", "/api/v1/jobs?order=job_id&team=research&region=site-a", StatusCode::OK)
        .await;
    let want: Vec<String> =
        with("region", "site-a").into_iter().filter(|id| with("team", "research").contains(id)).collect();
    assert!(!want.is_empty());
    assert_eq!(ids(&v), want);
    let v = check(&f, "jobs_project.json", "/api/v1/jobs?order=job_id&project=llm&team=nobody", StatusCode::OK).await;
    assert!(ids(&v).is_empty());
}

/// Listings in every order, hot and folded, paged with every limit: the pages, concatenated, are the model's order
/// of the same jobs (sorted here from the job-id listing's own fields: submit or end time, jobs without one last,
/// then job id), every page holds at most `limit`, and the default is newest submitted first.
#[tokio::test(start_paused = true)]
async fn listings_in_time_order_page_through_exactly_the_models_order() {
    let jobs = many_job_records();
    let dir = tempfile::tempdir().expect("tempdir");
    for fold in [false, true] {
        let state = state_over(&jobs, fold, &dir);
        for filter in ["", "state=done", "pool_kind=managed", "team=vision&state=queued", "pool=nothing"] {
            let all = pages(&state, &format!("order=job_id&{filter}"), 50).await;
            for (order, field) in [("submitted_at", "submitted_at"), ("ended_at", "done_at")] {
                for desc in [true, false] {
                    let mut want: Vec<(bool, String, String)> = all
                        .iter()
                        .map(|j| {
                            let key = j[field].as_str().map(str::to_string);
                            (key.is_none(), key.unwrap_or_default(), j["job_id"].as_str().expect("id").to_string())
                        })
                        .collect();
                    want.sort_by(|a, b| {
                        let key = if desc { b.1.cmp(&a.1) } else { a.1.cmp(&b.1) };
                        a.0.cmp(&b.0).then(key).then_with(|| a.2.cmp(&b.2))
                    });
                    let want: Vec<String> = want.into_iter().map(|w| w.2).collect();
                    for limit in [1, 7, 50] {
                        let got = pages(&state, &format!("order={order}&desc={desc}&{filter}"), limit).await;
                        let got: Vec<String> =
                            got.iter().map(|j| j["job_id"].as_str().expect("id").to_string()).collect();
                        assert_eq!(got, want, "fold {fold}, {filter:?}, order {order}, desc {desc}, limit {limit}");
                    }
                }
            }
            // The default: newest submitted first.
            let default = pages(&state, filter, 7).await;
            let newest = pages(&state, &format!("order=submitted_at&desc=true&{filter}"), 7).await;
            assert_eq!(default, newest, "{filter:?}");
        }
    }
}

/// Every job of a listing, following its page tokens; each page holds at most `limit`.
async fn pages(state: &ApiState, query: &str, limit: usize) -> Vec<serde_json::Value> {
    let (mut token, mut out) = (None::<String>, Vec::new());
    for _ in 0..1000 {
        let mut uri = format!("/api/v1/jobs?limit={limit}&{query}");
        if let Some(t) = &token {
            uri.push_str(&format!("&page_token={}", escape(t)));
        }
        let (status, _, body) = call(state, "GET", &uri).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        let page = v["jobs"].as_array().expect("jobs").clone();
        assert!(page.len() <= limit, "{uri}");
        out.extend(page);
        match v["next_page_token"].as_str() {
            Some(t) => token = Some(t.to_string()),
            None => return out,
        }
    }
    panic!("{query}: more than 1000 pages");
}

/// Percent-encodes a query value.
fn escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn jobs_listing_errors() {
    let f = fixture();
    let e = check_error(&f, "err_jobs_unknown_param.json", "/api/v1/jobs?colour=red", StatusCode::BAD_REQUEST).await;
    assert_eq!(e, "colour: unknown query parameter");
    let e =
        check_error(&f, "err_jobs_bad_time.json", "/api/v1/jobs?submitted_after=yesterday", StatusCode::BAD_REQUEST)
            .await;
    assert!(e.starts_with("submitted_after: "), "{e}");
    let e = check_error(&f, "err_jobs_limit.json", "/api/v1/jobs?limit=4", StatusCode::BAD_REQUEST).await;
    assert_eq!(e, "limit: must be an integer in 1..=3");
    check_error(&f, "err_jobs_limit0.json", "/api/v1/jobs?limit=0", StatusCode::BAD_REQUEST).await;
    check_error(&f, "err_jobs_state.json", "/api/v1/jobs?state=sleeping", StatusCode::BAD_REQUEST).await;
    check_error(&f, "err_jobs_pool_kind.json", "/api/v1/jobs?pool_kind=cloud", StatusCode::BAD_REQUEST).await;
    check_error(&f, "err_jobs_twice.json", "/api/v1/jobs?limit=1&limit=2", StatusCode::BAD_REQUEST).await;
    check_error(&f, "err_jobs_percent.json", "/api/v1/jobs?pool=%G1", StatusCode::BAD_REQUEST).await;
    let e = check_error(&f, "err_jobs_order.json", "/api/v1/jobs?order=priority", StatusCode::BAD_REQUEST).await;
    assert_eq!(e, "order: \"priority\" is not one of submitted_at, ended_at, job_id");
    let e = check_error(&f, "err_jobs_desc.json", "/api/v1/jobs?desc=yes", StatusCode::BAD_REQUEST).await;
    assert_eq!(e, "desc: \"yes\" is not true or false");
    // A token of another order, or made up, is refused naming the parameter.
    let e = check_error(
        &f,
        "err_jobs_token.json",
        "/api/v1/jobs?page_token=slurm%2Fcluster-a%2F100",
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert!(e.starts_with("page_token: "), "{e}");
    check_error(&f, "err_jobs_token_key.json", "/api/v1/jobs?page_token=soon.job", StatusCode::BAD_REQUEST).await;
}

#[tokio::test(start_paused = true)]
async fn job_detail_hot_folded_and_unknown() {
    let f = fixture();
    let v = check(&f, "job_hot.json", "/api/v1/jobs/sagemaker/123/train-2", StatusCode::OK).await;
    assert_eq!(v["job_id"], HOT);
    assert_eq!(v["attributes"]["labels"]["owner"], "ana");
    assert_eq!(v["events"].as_array().map(Vec::len), Some(9));
    assert_eq!(v["timeline"]["preemptions"], 1);
    let v = check(&f, "job_folded.json", "/api/v1/jobs/slurm/cluster-a/100", StatusCode::OK).await;
    assert_eq!(v["outcome"], "succeeded");
    assert_eq!(v["events"].as_array().map(Vec::len), Some(7));
    assert_eq!(v["timeline"]["milestones"]["last_checkpoint"]["step"], 500);
    let v = check(&f, "job_running.json", "/api/v1/jobs/vertex/ml-prod/9000001", StatusCode::OK).await;
    assert_eq!(v["state"], "running");
    let v = check(&f, "job_no_attrs.json", "/api/v1/jobs/kubernetes/ns/pod-x", StatusCode::OK).await;
    assert!(v["attributes"].is_null() && v.get("provider").is_none());
    // A waiting job: its open segment and wait grow with the clock (masked, though the state's clock is fixed here).
    let (status, ctype, body) = call(&f.state, "GET", "/api/v1/jobs/slurm/cluster-a/200").await;
    assert_eq!(status, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert!(v["timeline"]["initial_wait_seconds"]["queued:quota"].as_f64().is_some_and(|s| s >= 1200.0), "{v}");
    golden("job_waiting.json", status, &ctype, &mask(&mask(&body, "waiting_seconds"), "initial_wait_seconds"));
    let e = check_error(&f, "err_job_unknown.json", "/api/v1/jobs/slurm/nope", StatusCode::NOT_FOUND).await;
    assert_eq!(e, "job \"slurm/nope\" is not known");
}

/// `NOW` plus `ms`, as the API writes times.
fn at(ms: i64) -> String {
    crate::time::format_ms(NOW + ms)
}

#[tokio::test(start_paused = true)]
async fn a_waiting_job_has_an_expected_start() {
    let f = fixture();
    // slurm/cluster-a/200 (pool gpu, urgent, a100, 8 GPUs, quota) has waited 20 minutes. No narrower group has 20
    // jobs: the pool's is used, job 100 (started after 15 minutes) and this one (censored at 20). S = 1/2 after 15
    // minutes and never lower: every quantile is the constant-hazard tail from 20 minutes, lambda = 1 start / 35
    // minutes at risk: 20 min + ln(1 / (1 - q)) x 2,100,000 ms (rounded up), i.e. now + 221,258 ms (q 0.1),
    // 1,455,610 ms (median), 4,835,429 ms (q 0.9).
    let v = check(&f, "jobs_queued.json", "/api/v1/jobs?state=queued", StatusCode::OK).await;
    let e = &v["jobs"][0]["expected_start"];
    assert_eq!(e["at"], at(1_455_610), "{e}");
    assert_eq!(e["low"], at(221_258));
    assert_eq!(e["high"], at(4_835_429));
    assert_eq!((e["basis"].as_str(), e["comparable_jobs"].as_u64()), (Some("history"), Some(2)));
    assert_eq!(e["interval"], 0.8);
    assert_eq!(e["waited_seconds"], 1200.0);
    assert_eq!(
        e["group"],
        serde_json::json!({"gpu_class": null, "gpus": null, "pool": "gpu", "priority": null, "reason": null})
    );
    // The detail says the same (no queue position here); a running or ended job has none.
    let (_, _, body) = call(&f.state, "GET", "/api/v1/jobs/slurm/cluster-a/200").await;
    let d: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(&d["expected_start"], e);
    for job in ["vertex/ml-prod/9000001", FOLDED, HOT] {
        let (_, _, body) = call(&f.state, "GET", &format!("/api/v1/jobs/{job}")).await;
        let d: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert!(d["expected_start"].is_null(), "{job}: {d}");
    }
}

#[tokio::test(start_paused = true)]
async fn advice_ranks_the_pools_that_can_run_a_job() {
    let f = fixture();
    let v =
        check(&f, "advice.json", "/api/v1/advice?gpus=8&gpu_class=h100&priority=urgent&duration=12h", StatusCode::OK)
            .await;
    // h100 jobs of 8 GPUs ran in gpu, gpu-urgent and a3-highgpu-8g (the sagemaker pool's are a100). Each pool's
    // group: gpu has job 100 (started after 15 minutes) and job 200 (waiting 20): S(15 min) = 1/2, so the 10th
    // percentile and the median are 15 minutes, the 90th the tail from 20 minutes with r = 1/2 / 1:
    // 20 min + ln(5) x 2,100,000 ms -> 4,579,820 ms. The other two have one started job each (30 and 90 minutes).
    let pools: Vec<&str> = v["pools"].as_array().expect("pools").iter().filter_map(|p| p["pool"].as_str()).collect();
    assert_eq!(pools, ["gpu", "a3-highgpu-8g", "gpu-urgent"]);
    let gpu = &v["pools"][0];
    let e = &gpu["expected_start"];
    assert_eq!(
        (e["low"].clone(), e["at"].clone(), e["high"].clone()),
        (at(15 * MIN).into(), at(15 * MIN).into(), at(4_579_820).into())
    );
    assert_eq!(e["waited_seconds"], 0.0);
    // Amortised at 1.25: 8 GPUs x 12 h = 120, the 15-minute wait 8 x 0.25 x 1.25 = 2.5.
    assert_eq!(gpu["cost"]["model"], "amortised");
    assert_eq!((gpu["cost"]["run"].as_f64(), gpu["cost"]["waiting"].as_f64()), (Some(120.0), Some(2.5)));
    assert_eq!(gpu["cost"]["total"].as_f64(), Some(122.5));
    // Jobs 100 (succeeded) and 200 (waiting): 2 jobs, 1 ended, none failed.
    assert_eq!((gpu["jobs"].as_u64(), gpu["failure_rate"].as_f64()), (Some(2), Some(0.0)));
    assert_eq!(v["pools"][1]["expected_start"]["at"], at(30 * MIN));
    assert_eq!(v["pools"][1]["cost"]["model"], "unpriced");
    assert_eq!(v["pools"][2]["expected_start"]["at"], at(90 * MIN));
    // More GPUs than any pool ran or has: only a dedicated pool with the capacity (gpu has 16).
    let v = check(&f, "advice_16.json", "/api/v1/advice?gpus=16&gpu_class=h100&duration=1h", StatusCode::OK).await;
    let pools: Vec<&str> = v["pools"].as_array().expect("pools").iter().filter_map(|p| p["pool"].as_str()).collect();
    assert_eq!(pools, ["gpu"]);
    for (name, uri, want) in [
        ("err_advice_gpus.json", "/api/v1/advice?gpus=0&gpu_class=h100&duration=1h", "gpus: "),
        ("err_advice_missing.json", "/api/v1/advice?gpu_class=h100&duration=1h", "gpus: required"),
        ("err_advice_duration.json", "/api/v1/advice?gpus=1&gpu_class=h100&duration=5s", "duration: "),
        ("err_advice_priority.json", "/api/v1/advice?gpus=1&gpu_class=h100&duration=1h&priority=low", "priority: "),
        ("err_advice_class.json", "/api/v1/advice?gpus=1&duration=1h", "gpu_class: required"),
        ("err_advice_param.json", "/api/v1/advice?gpus=1&gpu_class=h100&duration=1h&colour=red", "colour: "),
    ] {
        let e = check_error(&f, name, uri, StatusCode::BAD_REQUEST).await;
        assert!(e.starts_with(want), "{uri}: {e}");
    }
}

#[tokio::test(start_paused = true)]
async fn slos_and_alerts() {
    let f = fixture();
    let v = check(&f, "slos.json", "/api/v1/slos", StatusCode::OK).await;
    assert_eq!(v["slos"].as_array().map(Vec::len), Some(2));
    assert_eq!(v["as_of"], "2026-03-10T12:00:00.000Z");
    let v = check(&f, "slo_urgent.json", "/api/v1/slos/urgent-start", StatusCode::OK).await;
    assert_eq!(v["name"], "urgent-start");
    assert!(v["status"]["time_to_first_step_seconds"].is_object());
    check(&f, "slo_urgent_7d.json", "/api/v1/slos/urgent-start?window=7d", StatusCode::OK).await;
    // Normal jobs that started: sagemaker/123/train-2 (its container start) and slurm/cluster-b/7 (an older
    // agent's); over the last hour only the latter, started at 11:30.
    let sources = |v: &serde_json::Value| {
        let s = &v["first_step_sources"];
        [&s["training_process"], &s["container_start"], &s["scheduler_start"], &s["unspecified"]]
            .map(|n| n.as_u64().expect("count"))
    };
    let all = check(&f, "slos.json", "/api/v1/slos", StatusCode::OK).await;
    assert_eq!(sources(&all["slos"][0]["status"]), [2, 0, 0, 0], "urgent: slurm/cluster-a/100 and vertex, trainers");
    assert_eq!(sources(&all["slos"][1]["status"]), [0, 1, 0, 1]);
    let v = check(&f, "slo_normal_1h.json", "/api/v1/slos/normal-start?window=1h", StatusCode::OK).await;
    assert_eq!(sources(&v["status"]), [0, 0, 0, 1]);
    check_error(&f, "err_slo_unknown.json", "/api/v1/slos/nope", StatusCode::NOT_FOUND).await;
    check_error(&f, "err_slo_window.json", "/api/v1/slos/urgent-start?window=soon", StatusCode::BAD_REQUEST).await;
    check_error(&f, "err_slo_window_long.json", "/api/v1/slos/urgent-start?window=300d", StatusCode::BAD_REQUEST).await;
    check_error(&f, "err_slo_param.json", "/api/v1/slos/urgent-start?x=1", StatusCode::BAD_REQUEST).await;
    let v = check(&f, "slo_history.json", "/api/v1/slos/urgent-start/history?range=1d&step=6h", StatusCode::OK).await;
    let points = v["points"].as_array().expect("points");
    assert_eq!(points.len(), 5);
    assert_eq!(points[4]["at"], "2026-03-10T12:00:00.000Z");
    // The last point is the status now.
    let now = check(&f, "slo_urgent.json", "/api/v1/slos/urgent-start", StatusCode::OK).await;
    for k in ["good", "bad", "compliance", "error_budget_remaining"] {
        assert_eq!(points[4][k], now["status"][k], "{k}");
    }
    check_error(
        &f,
        "err_slo_history_range.json",
        "/api/v1/slos/urgent-start/history?range=90d",
        StatusCode::BAD_REQUEST,
    )
    .await;
    check_error(
        &f,
        "err_slo_history_step.json",
        "/api/v1/slos/urgent-start/history?range=7d&step=1m",
        StatusCode::BAD_REQUEST,
    )
    .await;
    check_error(&f, "err_slo_history_unknown.json", "/api/v1/slos/nope/history", StatusCode::NOT_FOUND).await;
    let v = check(&f, "alerts.json", "/api/v1/alerts", StatusCode::OK).await;
    assert_eq!(v["alerts"].as_array().map(Vec::len), Some(2));
    let v = check(&f, "alerts_firing.json", "/api/v1/alerts?state=firing", StatusCode::OK).await;
    assert!(v["alerts"][0]["resolved_at"].is_null());
    check(&f, "alerts_resolved.json", "/api/v1/alerts?state=resolved", StatusCode::OK).await;
    check_error(&f, "err_alerts_state.json", "/api/v1/alerts?state=open", StatusCode::BAD_REQUEST).await;
    check_error(&f, "err_alerts_param.json", "/api/v1/alerts?since=1", StatusCode::BAD_REQUEST).await;
}

#[tokio::test(start_paused = true)]
async fn overview_and_compare() {
    let f = fixture();
    let v = check(&f, "overview.json", "/api/v1/overview", StatusCode::OK).await;
    assert_eq!(v["window_seconds"], 86_400);
    assert_eq!(v["waiting_total"], 1);
    check(&f, "overview_6h.json", "/api/v1/overview?window=6h", StatusCode::OK).await;
    check_error(&f, "err_overview_window.json", "/api/v1/overview?window=1m", StatusCode::BAD_REQUEST).await;
    check_error(&f, "err_overview_param.json", "/api/v1/overview?by=pool", StatusCode::BAD_REQUEST).await;
    let v = check(&f, "compare.json", "/api/v1/compare", StatusCode::OK).await;
    // Managed: sagemaker's container start, vertex's trainer; dedicated: slurm/cluster-a/100's trainer,
    // slurm/cluster-b/7 unspecified (slurm/cluster-a/200 still waits). Different sources: flagged.
    let all = &v["groups"][0];
    let l = &all["left"]["first_step_sources"];
    let r = &all["right"]["first_step_sources"];
    assert_eq!((l["training_process"].as_u64(), l["container_start"].as_u64()), (Some(1), Some(1)));
    assert_eq!((r["training_process"].as_u64(), r["unspecified"].as_u64()), (Some(1), Some(1)));
    assert_eq!(all["difference"]["first_step_sources_differ"], true);
    check(
        &f,
        "compare_by_gpu.json",
        "/api/v1/compare?left=provider%3Dslurm&right=&by=gpu_class&window=7d",
        StatusCode::OK,
    )
    .await;
    check_error(&f, "err_compare_by.json", "/api/v1/compare?by=colour", StatusCode::BAD_REQUEST).await;
    check_error(&f, "err_compare_left.json", "/api/v1/compare?left=colour%3Dred", StatusCode::BAD_REQUEST).await;
    check_error(&f, "err_compare_window.json", "/api/v1/compare?window=1s", StatusCode::BAD_REQUEST).await;
    let (status, ctype, body) = call(&f.state, "GET", "/api/v1/compare.svg?window=1d").await;
    assert_eq!((status, ctype.as_str()), (StatusCode::OK, "image/svg+xml"));
    assert!(body.starts_with("<svg"), "{body}");
    golden("compare.svg", status, &ctype, &body);
    check_error(&f, "err_compare_svg.json", "/api/v1/compare.svg?right=gpu%3D", StatusCode::BAD_REQUEST).await;
}

#[tokio::test(start_paused = true)]
async fn health_readiness_and_fallbacks() {
    let f = fixture();
    check(&f, "healthz.json", "/healthz", StatusCode::OK).await;
    check(&f, "readyz.json", "/readyz", StatusCode::OK).await;
    check_error(&f, "err_metrics_disabled.json", "/metrics", StatusCode::NOT_FOUND).await;
    check_error(&f, "err_unknown_route.json", "/api/v2/jobs", StatusCode::NOT_FOUND).await;
    let (status, ctype, body) = call(&f.state, "POST", "/api/v1/jobs").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    golden("err_method.json", status, &ctype, &body);
    let (status, ctype, _) = call(&f.state, "GET", "/dashboard").await;
    assert_eq!((status, ctype.as_str()), (StatusCode::OK, "text/html; charset=utf-8"));
    // Not ready yet, then unhealthy.
    f.state.ready.store(false, std::sync::atomic::Ordering::Relaxed);
    check(&f, "readyz_starting.json", "/readyz", StatusCode::SERVICE_UNAVAILABLE).await;
    f.state.ready.store(true, std::sync::atomic::Ordering::Relaxed);
    f.state.health.committer_died();
    check(&f, "healthz_unhealthy.json", "/healthz", StatusCode::SERVICE_UNAVAILABLE).await;
    check(&f, "readyz_unhealthy.json", "/readyz", StatusCode::SERVICE_UNAVAILABLE).await;
}

/// Every route the router declares is in the OpenAPI document with its method, and every documented operation
/// is answered by a handler (not the unknown-route fallback).
#[tokio::test(start_paused = true)]
async fn the_openapi_document_lists_every_route() {
    let source = include_str!("mod.rs");
    let documented = super::openapi::operations();
    let mut declared = Vec::new();
    for line in source.lines().map(str::trim).filter(|l| l.starts_with(".route(\"")) {
        let path = line.split('"').nth(1).expect("route path");
        let path = path.replace("{*", "{");
        for method in ["get", "post"] {
            if line.contains(&format!("{method}(")) || line.contains(&format!("routing::{method}(")) {
                declared.push((method, path.clone()));
            }
        }
    }
    assert!(declared.len() >= 18, "{declared:?}");
    // The JSON ingest route is the ingest edge's, merged onto the same listener (`app`); documented here too.
    declared.push(("post", crate::ingest::http::PATH.to_string()));
    for (m, p) in &declared {
        assert!(documented.iter().any(|(dm, dp)| dm == m && dp == p), "{m} {p} is routed but not documented");
    }
    for (m, p) in &documented {
        assert!(declared.iter().any(|(dm, dp)| dm == m && dp == p), "{m} {p} is documented but not routed");
    }
    let f = fixture();
    for (m, p) in documented.iter().filter(|(_, p)| *p != crate::ingest::http::PATH) {
        let uri = p
            .replace("{job_id}", "slurm/cluster-a/100")
            .replace("{name}", "urgent-start")
            .replace("{chain_id}", "no/such/chain");
        let (status, _, body) = call(&f.state, &m.to_uppercase(), &uri).await;
        assert!(
            !body.contains("no such endpoint") && !body.contains("is not allowed on"),
            "{m} {uri}: {status} {body}"
        );
    }
    let (status, ctype, body) = call(&f.state, "GET", "/api/v1/openapi.json").await;
    assert_eq!((status, ctype.as_str()), (StatusCode::OK, "application/json"));
    let doc: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(doc["openapi"], "3.1.0");
    let job = &doc["components"]["schemas"]["Job"];
    assert!(job["properties"]["time_to_first_step_seconds"].is_object(), "{job}");
    // Written as null, so required; omitted when absent, so not required.
    let required: Vec<&str> = job["required"].as_array().expect("required").iter().filter_map(|v| v.as_str()).collect();
    assert!(required.contains(&"time_to_first_step_seconds") && !required.contains(&"events"), "{required:?}");
}

#[tokio::test(start_paused = true)]
async fn goodput_accounts_hot_and_folded_jobs() {
    let f = fixture();
    let v = check(&f, "goodput.json", "/api/v1/goodput", StatusCode::OK).await;
    let t = &v["total"];
    let parts: f64 = ["waiting", "preparing", "requeue_wait", "checkpoint", "lost", "failed", "productive"]
        .iter()
        .map(|c| t[format!("{c}_gpu_hours")].as_f64().expect("hours"))
        .sum();
    let total = t["total_gpu_hours"].as_f64().expect("total");
    assert!(total > 0.0 && (parts - total).abs() < 1e-9 * total, "{parts} vs {total}");
    let groups: f64 =
        v["groups"].as_array().expect("groups").iter().map(|g| g["total_gpu_hours"].as_f64().unwrap_or(0.0)).sum();
    assert!((groups - total).abs() < 1e-9 * total);
    check(&f, "goodput_team_7d.json", "/api/v1/goodput?by=team&window=7d", StatusCode::OK).await;
    check_error(&f, "err_goodput_by.json", "/api/v1/goodput?by=colour", StatusCode::BAD_REQUEST).await;
    check_error(&f, "err_goodput_window.json", "/api/v1/goodput?window=1m", StatusCode::BAD_REQUEST).await;
}

#[tokio::test(start_paused = true)]
async fn cost_prices_per_use_and_amortised_pools() {
    let f = fixture();
    let v = check(&f, "cost.json", "/api/v1/cost", StatusCode::OK).await;
    assert_eq!(v["configured"], true);
    let pools = v["pools"].as_array().expect("pools");
    let pool = |name: &str| pools.iter().find(|p| p["pool"] == name).unwrap_or_else(|| panic!("{name}: {v}"));
    // The dedicated `gpu` pool: 16 GPUs x 1.25 for as long as the collector holds jobs (the fixture's first job
    // was submitted 8 h before now), whatever its jobs did.
    assert_eq!(v["covered_seconds"], 8 * 3600);
    let gpu = pool("gpu");
    assert_eq!((gpu["model"].as_str(), gpu["cost"].as_f64()), (Some("amortised"), Some(16.0 * 8.0 * 1.25)));
    let useful = gpu["productive_gpu_hours"].as_f64().expect("useful");
    let utilisation = gpu["useful_utilisation"].as_f64().expect("utilisation");
    assert!((utilisation - useful / (16.0 * 8.0)).abs() < 1e-12, "{utilisation}");
    // A per-use pool costs what its jobs held at its price.
    for p in pools.iter().filter(|p| p["model"] == "per_use") {
        let held = p["held_gpu_hours"].as_f64().expect("held");
        assert!((p["cost"].as_f64().expect("cost") - 4.0 * held).abs() < 1e-9, "{p}");
    }
    check(&f, "cost_1d.json", "/api/v1/cost?window=1d", StatusCode::OK).await;
    check_error(&f, "err_cost_window.json", "/api/v1/cost?window=forever", StatusCode::BAD_REQUEST).await;
}

/// Many jobs over 40 hours: four pools (managed and dedicated), two priorities, three teams, waits of 1 to
/// 300 minutes; most done, some running or still queued.
fn many_jobs() -> Vec<pb::LifecycleEvent> {
    use pb::{Outcome, PoolKind::*, PriorityClass::*, WaitReason};
    let pools = [
        (Managed, "sagemaker", "ml.p5"),
        (Managed, "vertex", "a3-high"),
        (Dedicated, "slurm", "gpu"),
        (Dedicated, "slurm", "gpu-b"),
    ];
    let mut out = Vec::new();
    for i in 0..240i64 {
        let (kind, provider, pool) = pools[(i % 4) as usize];
        let prio = [Normal, Urgent][(i % 3 % 2) as usize];
        let id = format!("{provider}/{pool}/{:04}", (i * 37) % 1000);
        let t = NOW - 40 * HOUR + i * 10 * MIN;
        let wait = (i * 7919) % 300 * MIN + MIN;
        let mut sub = submitted(kind, provider, pool, prio, ["h100", "a100"][(i % 2) as usize], "site-a");
        if let Kind::Submitted(s) = &mut sub {
            s.team = ["nlp", "vision", "speech"][(i % 5 % 3) as usize].into();
        }
        let mut kinds = vec![(t, sub), (t, queued(WaitReason::Capacity, "Resources"))];
        if t + wait < NOW {
            kinds.push((t + wait, first_step(0, pb::StepOrigin::try_from((i % 4) as i32).unwrap_or_default())));
            let end = t + wait + (i % 11) * 20 * MIN;
            if end < NOW {
                kinds.push((end, done([Outcome::Succeeded, Outcome::Failed][(i % 2) as usize], Some(0))));
            }
        } else if i % 9 == 0 {
            kinds.push((NOW - MIN, done(Outcome::Cancelled, None)));
        }
        for (n, (at, k)) in kinds.into_iter().enumerate() {
            out.push(ev(&id, n + 1, at, k));
        }
    }
    out
}

/// [`many_jobs`] as records, each event numbered in order.
fn many_job_records() -> BTreeMap<String, JobRecord> {
    let mut by_job: BTreeMap<String, Vec<CompactEvent>> = BTreeMap::new();
    for (i, e) in many_jobs().iter().enumerate() {
        by_job.entry(e.job_id.clone()).or_default().push(CompactEvent::from_pb(e, i as u64 + 1).expect("kind"));
    }
    by_job.into_iter().map(|(id, evs)| (id, JobRecord::from_events(evs))).collect()
}

/// An API over `jobs`, every done job folded when `fold` (rows only: no store behind them).
fn state_over(jobs: &BTreeMap<String, JobRecord>, fold: bool, dir: &tempfile::TempDir) -> ApiState {
    let store = Store::open(&dir.path().join(if fold { "folded" } else { "hot" })).expect("store");
    let limiter = LabelLimiter::new(&LabelSettings { max_values_per_label: 50, ..Default::default() });
    let mut index =
        JobIndex::new_at(jobs.clone(), Default::default(), 0, SloEngine::new(SloDef::defaults()), limiter, NOW);
    if fold {
        let done: Vec<String> =
            index.jobs.iter().filter(|(_, h)| h.rec.timeline.done_at.is_some()).map(|(k, _)| k.clone()).collect();
        for id in done {
            index.fold(&id, 0);
        }
    }
    let mut state = fixture().state;
    state.index = SharedIndex::new(index);
    state.store = store;
    state.max_page_size = 50;
    state
}

/// Listings and the overview read folded jobs from their rows (skipping rows that cannot match, and never filling
/// in a timeline for the overview): the answers must be exactly those of the same jobs all held hot.
#[tokio::test(start_paused = true)]
async fn listings_and_overview_answer_the_same_for_folded_and_hot_jobs() {
    let jobs = many_job_records();
    let dir = tempfile::tempdir().expect("tempdir");
    let hot = state_over(&jobs, false, &dir);
    let folded = state_over(&jobs, true, &dir);
    let n_folded = folded.index.read().cold.len();
    assert!(n_folded > 100 && folded.index.read().jobs.len() > 20, "{n_folded} folded: a mixed index");
    let filters = [
        "",
        "state=done",
        "state=running",
        "pool=gpu",
        "provider=vertex&state=done",
        "pool_kind=managed&priority=urgent",
        "team=vision",
        "submitted_after=2026-03-09T12:00:00Z",
        "submitted_before=2026-03-09T06:00:00Z&pool_kind=dedicated",
        "gpu_class=a100&state=done&team=nlp",
        "pool=nothing",
    ];
    for filter in filters {
        // Every page of 7, following the tokens.
        let (mut token, mut pages, mut seen) = (None::<String>, 0, 0);
        loop {
            let mut uri = format!("/api/v1/jobs?limit=7&{filter}");
            if let Some(t) = &token {
                uri.push_str(&format!("&page_token={}", t.replace('/', "%2F")));
            }
            let (s1, _, a) = call(&hot, "GET", &uri).await;
            let (s2, _, b) = call(&folded, "GET", &uri).await;
            assert_eq!((s1, s2), (StatusCode::OK, StatusCode::OK), "{uri}: {a}");
            assert_eq!(a, b, "{uri}");
            let v: serde_json::Value = serde_json::from_str(&a).expect("json");
            seen += ids(&v).len();
            pages += 1;
            match v["next_page_token"].as_str() {
                Some(t) => token = Some(t.to_string()),
                None => break,
            }
        }
        assert!(pages >= 1 && seen <= jobs.len(), "{filter}: {seen} jobs over {pages} pages");
        if filter.is_empty() {
            assert_eq!(seen, jobs.len(), "the unfiltered listing lists every job");
        }
    }
    for uri in ["/api/v1/overview", "/api/v1/overview?window=6h", "/api/v1/overview?window=30d"] {
        let (s1, _, a) = call(&hot, "GET", uri).await;
        let (s2, _, b) = call(&folded, "GET", uri).await;
        assert_eq!((s1, s2), (StatusCode::OK, StatusCode::OK), "{uri}: {a}");
        assert_eq!(a, b, "{uri}");
        let v: serde_json::Value = serde_json::from_str(&a).expect("json");
        let done = v["jobs_by_state"]["done"].as_u64().unwrap_or(0);
        assert!(done >= n_folded as u64, "{uri}: folded jobs count as done");
        assert!(!v["ttfs_by_pool"].as_array().expect("pools").is_empty(), "{uri}: started jobs in the window");
    }
}

/// The fixture with identities `a` and `b` (read), `i` (ingest only) and `root` (admin), tokens `tok-<name>`, and
/// sessions under `login`.
fn with_identities(f: &Fixture, login: super::auth::LoginSettings) -> ApiState {
    let id = |name: &str, scope: &str| {
        format!(
            "[[identity]]\nname = \"{name}\"\ntoken_hashes = [\"{}\"]\nscopes = [\"{scope}\"]\n",
            crate::auth::TokenHash::of(&format!("tok-{name}")).to_config()
        )
    };
    let text = [id("a", "read"), id("b", "read"), id("i", "ingest"), id("root", "admin")].concat();
    let section: crate::auth::config::AuthSection = toml::from_str(&text).expect("auth toml");
    let mut errs = Vec::new();
    let cfg = section.validate(&mut errs, false);
    assert!(errs.is_empty(), "{errs:?}");
    let mut state = f.state.clone();
    state.auth = Arc::new(crate::auth::Auth::new(cfg.keyring(), false, false));
    state.sessions = Arc::new(super::auth::Sessions::new(login));
    state
}

/// One request with headers and a body from a client address (the connection's `Peer`): status, headers, body.
async fn send(
    state: &ApiState,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: &str,
    from: &str,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let mut req = Request::builder().method(method).uri(uri).header("host", "collector.test:8080");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut req = req.body(Body::from(body.to_string())).expect("request");
    let peer = crate::auth::Peer { remote: Some(from.parse().expect("addr")), cert_names: Arc::from([]), tls: false };
    req.extensions_mut().insert(peer);
    let res = router(state.clone()).oneshot(req).await.expect("infallible");
    let (status, headers) = (res.status(), res.headers().clone());
    let body = res.into_body().collect().await.expect("body").to_bytes();
    (status, headers, String::from_utf8(body.to_vec()).expect("utf-8"))
}

const FORM: (&str, &str) = ("content-type", "application/x-www-form-urlencoded");

/// Logs in with `token`; the session cookie on success.
async fn login_as(state: &ApiState, token: &str, from: &str) -> Result<String, (StatusCode, String)> {
    let (status, headers, body) = send(state, "POST", "/login", &[FORM], &format!("token={token}"), from).await;
    if status != StatusCode::SEE_OTHER {
        return Err((status, body));
    }
    let cookie = headers.get("set-cookie").and_then(|v| v.to_str().ok()).expect("cookie");
    Ok(cookie.split(';').next().expect("name=value").to_string())
}

async fn cookie_works(state: &ApiState, cookie: &str) -> bool {
    send(state, "GET", "/api/v1/alerts", &[("cookie", cookie)], "", "192.0.2.99:1").await.0 == StatusCode::OK
}

/// Logging in over and over with one read token ends only that identity's own oldest sessions: another
/// identity's session lives on (it used to be evicted once 10,000 sessions were open).
#[tokio::test]
async fn one_identitys_logins_never_evict_another_identitys_session() {
    let f = fixture();
    let settings = super::auth::LoginSettings {
        logins_per_identity_per_minute: 0,
        failures_per_minute: 0,
        max_sessions_per_identity: 5,
        ..Default::default()
    };
    let state = with_identities(&f, settings);
    let b = login_as(&state, "tok-b", "192.0.2.2:1").await.expect("b logs in");
    let mut a = Vec::new();
    for _ in 0..10_100 {
        a.push(login_as(&state, "tok-a", "192.0.2.1:1").await.expect("a logs in"));
    }
    assert!(cookie_works(&state, &b).await, "b's session survived a's 10,100 logins");
    assert_eq!(state.sessions.open_sessions("a"), 5);
    assert_eq!(state.sessions.open_sessions("b"), 1);
    // a's newest five work; its older ones were ended (its own, oldest first).
    for c in &a[a.len() - 5..] {
        assert!(cookie_works(&state, c).await);
    }
    assert!(!cookie_works(&state, &a[a.len() - 6]).await);
    assert!(!cookie_works(&state, &a[0]).await);
}

/// Failed logins are throttled per client address (429 with Retry-After and a JSON error, even for a good token
/// then), and logins per identity, whatever the address; another address and another identity are unaffected.
#[tokio::test]
async fn logins_are_throttled_per_client_address_and_per_identity() {
    let f = fixture();
    let settings =
        super::auth::LoginSettings { failures_per_minute: 3, logins_per_identity_per_minute: 4, ..Default::default() };
    let state = with_identities(&f, settings);
    for _ in 0..3 {
        let (status, _) = login_as(&state, "tok-wrong", "198.51.100.7:4000").await.expect_err("unknown token");
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    for token in ["tok-wrong", "tok-a"] {
        let (status, headers, body) =
            send(&state, "POST", "/login", &[FORM], &format!("token={token}"), "198.51.100.7:4001").await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
        let retry: u64 = headers.get("retry-after").and_then(|v| v.to_str().ok()?.parse().ok()).expect("Retry-After");
        assert!((1..=60).contains(&retry), "{retry}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert!(v["error"].as_str().expect("error").contains("http.login_failures_per_minute"), "{body}");
    }
    // An IPv6 client is keyed by its /64: another address of the same /64 is throttled with it.
    for _ in 0..3 {
        let _ = login_as(&state, "tok-wrong", "[2001:db8:1:2::1]:1").await;
    }
    assert_eq!(
        login_as(&state, "tok-a", "[2001:db8:1:2::ffff]:1").await.expect_err("same /64").0,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another address is not held back.
    login_as(&state, "tok-a", "203.0.113.1:1").await.expect("another address");
    // Identity a: 4 logins a minute from anywhere (one above), then 429 naming the key; b is unaffected.
    for i in 0..3 {
        login_as(&state, "tok-a", &format!("203.0.113.{}:1", 10 + i)).await.expect("within a's logins");
    }
    let (status, body) = login_as(&state, "tok-a", "203.0.113.50:1").await.expect_err("a over its logins");
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(body.contains("logins_per_identity_per_minute"), "{body}");
    login_as(&state, "tok-b", "203.0.113.50:1").await.expect("b logs in");
    // A token without read proves its identity: its logins count too.
    for i in 0..4 {
        let from = format!("203.0.113.{}:1", 60 + i);
        assert_eq!(login_as(&state, "tok-i", &from).await.expect_err("no read").0, StatusCode::UNAUTHORIZED);
    }
    let (status, body) = login_as(&state, "tok-i", "203.0.113.70:1").await.expect_err("i over its logins");
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(state.auth.stats.rate_limited.load(std::sync::atomic::Ordering::Relaxed) >= 5);
}

/// A state-changing request a browser sends from another origin is refused with 403 JSON before it reaches its
/// route (login, logout, the admin reload); the collector's own origin, a listed one and clients that send no
/// Origin (curl) pass; GETs are not checked.
#[tokio::test]
async fn cross_origin_state_changing_requests_are_refused() {
    let f = fixture();
    let settings = super::auth::LoginSettings {
        allowed_origins: vec!["https://startline.example.com".into()],
        ..Default::default()
    };
    let state = with_identities(&f, settings);
    let from = "192.0.2.30:1";
    let root = ("authorization", "Bearer tok-root");
    for (method, uri, extra, body) in [
        ("POST", "/login", Some(FORM), "token=tok-a"),
        ("POST", "/logout", None, ""),
        ("POST", "/api/v1/admin/reload", Some(root), ""),
    ] {
        for origin in [
            vec![("origin", "https://evil.example")],
            vec![("origin", "null")],
            vec![("origin", "http://collector.test:8081")],
            vec![("sec-fetch-site", "cross-site")],
            vec![("sec-fetch-site", "same-site")],
        ] {
            let mut h = origin.clone();
            h.extend(extra);
            let (status, _, text) = send(&state, method, uri, &h, body, from).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{method} {uri} {origin:?}: {text}");
            let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
            assert!(v["error"].as_str().expect("error").starts_with("cross-origin request refused"), "{text}");
        }
        for origin in [
            vec![("origin", "http://collector.test:8080")],
            vec![("origin", "HTTP://Collector.Test:8080")],
            vec![("origin", "https://startline.example.com")],
            vec![("sec-fetch-site", "same-origin")],
            vec![],
        ] {
            let mut h = origin.clone();
            h.extend(extra);
            let (status, _, text) = send(&state, method, uri, &h, body, from).await;
            assert_ne!(status, StatusCode::FORBIDDEN, "{method} {uri} {origin:?}: {text}");
        }
    }
    let (status, _, _) = send(
        &state,
        "GET",
        "/api/v1/alerts",
        &[("origin", "https://evil.example"), ("authorization", "Bearer tok-a")],
        "",
        from,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "reads are not origin-checked (CORS keeps their answers from the page)");
    assert!(state.auth.stats.origin.load(std::sync::atomic::Ordering::Relaxed) >= 15);
}

/// A job's detail pages its events: the pages, followed by `events_next_offset`, hold exactly the events of the
/// unpaged answer in the same order, for a hot and a folded job; bad page parameters are refused naming the field.
#[tokio::test(start_paused = true)]
async fn job_detail_pages_its_events() {
    let f = fixture();
    for (job, limit) in [(HOT, 4usize), ("slurm/cluster-a/100", 3), (HOT, 1), (HOT, 9)] {
        let (status, _, body) = call(&f.state, "GET", &format!("/api/v1/jobs/{job}")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let whole: serde_json::Value = serde_json::from_str(&body).expect("json");
        let all = whole["events"].as_array().expect("events").clone();
        assert_eq!(whole["events_total"].as_u64(), Some(all.len() as u64));
        assert!(whole.get("events_next_offset").is_none(), "one page holds a small job: {whole}");
        let (mut offset, mut paged, mut pages) = (0u64, Vec::new(), 0);
        loop {
            let uri = format!("/api/v1/jobs/{job}?events_limit={limit}&events_offset={offset}");
            let (status, _, body) = call(&f.state, "GET", &uri).await;
            assert_eq!(status, StatusCode::OK, "{uri}: {body}");
            let v: serde_json::Value = serde_json::from_str(&body).expect("json");
            let page = v["events"].as_array().expect("events");
            assert!(page.len() <= limit, "{uri}");
            assert_eq!(v["events_total"].as_u64(), Some(all.len() as u64), "{uri}");
            assert_eq!(v["timeline"], whole["timeline"], "every page carries the whole timeline: {uri}");
            paged.extend(page.iter().cloned());
            pages += 1;
            match v["events_next_offset"].as_u64() {
                Some(next) => {
                    assert_eq!(next, offset + limit as u64, "{uri}");
                    offset = next;
                }
                None => break,
            }
        }
        assert_eq!(paged, all, "{job} in pages of {limit}");
        assert_eq!(pages, all.len().div_ceil(limit).max(1), "{job} in pages of {limit}");
    }
    let (status, _, body) = call(&f.state, "GET", &format!("/api/v1/jobs/{HOT}?events_limit=0")).await;
    assert_eq!(status, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!((v["events"].as_array().map(Vec::len), v["events_next_offset"].as_u64()), (Some(0), Some(0)));
    for (q, field) in [("events_limit=10001", "events_limit"), ("events_offset=-2", "events_offset"), ("foo=1", "foo")]
    {
        let (status, ctype, body) = call(&f.state, "GET", &format!("/api/v1/jobs/{HOT}?{q}")).await;
        assert_eq!((status, ctype.as_str()), (StatusCode::BAD_REQUEST, "application/json"), "{q}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert!(v["error"].as_str().is_some_and(|e| e.contains(field)), "{q}: {body}");
    }
}

/// Compare and goodput keep `all` (or `total`) and the `limit` largest groups, and say how many there were; the
/// kept groups are exactly the unlimited answer's largest ones, unchanged.
#[tokio::test(start_paused = true)]
async fn grouped_answers_keep_their_largest_groups_within_limit() {
    let jobs = many_job_records();
    let dir = tempfile::tempdir().expect("tempdir");
    let state = state_over(&jobs, false, &dir);
    let get = |uri: String| {
        let state = state.clone();
        async move {
            let (status, _, body) = call(&state, "GET", &uri).await;
            assert_eq!(status, StatusCode::OK, "{uri}: {body}");
            serde_json::from_str::<serde_json::Value>(&body).expect("json")
        }
    };
    let side = "left=&right=pool_kind%3Ddedicated&by=pool&window=7d";
    let whole = get(format!("/api/v1/compare?{side}")).await;
    let groups = whole["groups"].as_array().expect("groups");
    assert_eq!((groups.len(), whole["groups_total"].as_u64(), whole["truncated"].as_bool()), (5, Some(4), Some(false)));
    let size =
        |g: &serde_json::Value| g["left"]["jobs"].as_u64().unwrap_or(0) + g["right"]["jobs"].as_u64().unwrap_or(0);
    let mut largest: Vec<&serde_json::Value> = groups[1..].iter().collect();
    largest.sort_by_key(|g| std::cmp::Reverse(size(g)));
    for limit in 1..=3usize {
        let cut = get(format!("/api/v1/compare?{side}&limit={limit}")).await;
        let kept = cut["groups"].as_array().expect("groups");
        assert_eq!(
            (kept.len(), cut["groups_total"].as_u64(), cut["truncated"].as_bool()),
            (limit + 1, Some(4), Some(true))
        );
        assert_eq!(kept[0], groups[0], "`all` still counts every job");
        let want: BTreeSet<&str> = largest[..limit].iter().map(|g| g["group"].as_str().expect("name")).collect();
        let got: BTreeSet<&str> = kept[1..].iter().map(|g| g["group"].as_str().expect("name")).collect();
        assert_eq!(got, want, "limit {limit}");
        for g in &kept[1..] {
            assert!(groups.contains(g), "a kept group is unchanged: {g}");
        }
    }
    let whole = get("/api/v1/goodput?by=pool&window=7d".to_string()).await;
    let cut = get("/api/v1/goodput?by=pool&window=7d&limit=2".to_string()).await;
    assert_eq!((whole["groups_total"].as_u64(), whole["truncated"].as_bool()), (Some(4), Some(false)));
    assert_eq!((cut["groups_total"].as_u64(), cut["truncated"].as_bool()), (Some(4), Some(true)));
    assert_eq!(cut["groups"].as_array().map(|g| g.to_vec()), whole["groups"].as_array().map(|g| g[..2].to_vec()));
    assert_eq!(cut["total"], whole["total"]);
    for uri in ["/api/v1/compare?limit=0", "/api/v1/compare?limit=1001", "/api/v1/goodput?limit=x"] {
        let (status, _, body) = call(&state, "GET", uri).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}");
        assert!(body.contains("limit"), "{uri}: {body}");
    }
}
