//! The nodes listing over a demo-sized fleet in process: 8,000 one-off managed instances in three pools, 320
//! dedicated nodes in two, one dedicated node losing most of its jobs and one instance reporting an XID error.
//! Every figure below is counted by hand from how the fleet is built.

use super::super::{router, ApiState};
use super::{list_query, ListQuery, PAGE};
use crate::index::labels::{LabelLimiter, LabelSettings};
use crate::index::nodes::HealthBook;
use crate::index::{JobIndex, SharedIndex};
use crate::job::nodes::Reading;
use crate::job::{CompactEvent, JobRecord};
use crate::slo::{SloDef, SloEngine};
use crate::store::Store;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_proto::time::ms_to_timestamp;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use tower::ServiceExt;

/// The state's clock: 2026-03-10T12:00:00Z.
const NOW: i64 = 1_773_144_000_000;
const MIN: i64 = 60_000;
const HOUR: i64 = 3_600_000;

/// Managed pools: name, provider, instances (one job each).
const MANAGED: [(&str, &str, u64); 3] = [("sm", "sagemaker", 4000), ("vx", "vertex", 2500), ("az", "azureml", 1500)];
/// The instance that reports an XID error.
const SICK_INSTANCE: &str = "vx-i-0000002a";
/// The dedicated node that loses 6 of its 8 jobs.
const BAD_NODE: &str = "ded-137";

fn instance(pool: &str, i: u64) -> String {
    format!("{pool}-i-{i:08x}")
}

fn ded(n: u64) -> String {
    format!("ded-{n:03}")
}

/// How a job ends on its node.
#[derive(Clone, Copy, PartialEq)]
enum End {
    Ok,
    Failed,
    Lost,
}

struct Fleet {
    events: Vec<pb::LifecycleEvent>,
    t: i64,
}

impl Fleet {
    fn job(&mut self, kind: pb::PoolKind, provider: &str, pool: &str, node: &str, end: End) {
        let id = format!("{pool}/{}", self.events.len());
        // Jobs every 30 s, from 6 days before the clock: all inside the 7-day window.
        self.t += 30_000;
        let t = self.t;
        let mut kinds = vec![
            (
                t,
                Kind::Submitted(pb::Submitted {
                    pool_kind: kind as i32,
                    provider: provider.into(),
                    pool: pool.into(),
                    priority: pb::PriorityClass::Normal as i32,
                    gpu_count: 8,
                    node_count: 1,
                    team: "research".into(),
                    ..Default::default()
                }),
            ),
            (t + MIN, Kind::NodeAssigned(pb::NodeAssigned { nodes: vec![node.into()], gpu_ids: vec![] })),
            (t + 3 * MIN, Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })),
        ];
        if end == End::Lost {
            kinds.push((t + 20 * MIN, Kind::NodeLost(pb::NodeLost { node: node.into(), message: String::new() })));
        }
        let outcome = if end == End::Ok { pb::Outcome::Succeeded } else { pb::Outcome::Failed };
        kinds.push((t + 30 * MIN, Kind::Done(pb::Done { outcome: outcome as i32, ..Default::default() })));
        for (n, (at, k)) in kinds.into_iter().enumerate() {
            self.events.push(pb::LifecycleEvent {
                event_id: format!("{id}#{n}"),
                job_id: id.clone(),
                attempt: None,
                source: "test".into(),
                occurred_at: Some(ms_to_timestamp(at)),
                kind: Some(k),
            });
        }
    }
}

fn fleet() -> Vec<pb::LifecycleEvent> {
    let mut f = Fleet { events: Vec::new(), t: NOW - 6 * 24 * HOUR };
    for (pool, provider, n) in MANAGED {
        for i in 0..n {
            // Every tenth job fails (i % 10 == 3), every 25th is lost with its instance (i % 25 == 7): never both.
            let end = match (i % 10, i % 25) {
                (3, _) => End::Failed,
                (_, 7) => End::Lost,
                _ => End::Ok,
            };
            f.job(pb::PoolKind::Managed, provider, pool, &instance(pool, i), end);
        }
    }
    // a100: 300 nodes, 4 jobs each; the first job of every third node fails. ded-137 (137 % 3 = 2) instead runs
    // 8 jobs and loses 6 of them.
    for n in 0..300 {
        if ded(n) == BAD_NODE {
            for j in 0..8 {
                f.job(pb::PoolKind::Dedicated, "slurm", "a100", BAD_NODE, if j < 6 { End::Lost } else { End::Ok });
            }
            continue;
        }
        for j in 0..4 {
            let end = if n % 3 == 0 && j == 0 { End::Failed } else { End::Ok };
            f.job(pb::PoolKind::Dedicated, "slurm", "a100", &ded(n), end);
        }
    }
    // h100: 20 nodes, 2 jobs each, none failing.
    for n in 0..20 {
        for _ in 0..2 {
            f.job(pb::PoolKind::Dedicated, "slurm", "h100", &format!("h100-{n:02}"), End::Ok);
        }
    }
    f.events
}

fn state(dir: &std::path::Path) -> ApiState {
    let store = Store::open(dir).expect("store");
    let mut by_job: BTreeMap<String, Vec<CompactEvent>> = BTreeMap::new();
    let events = fleet();
    for (i, e) in events.iter().enumerate() {
        by_job.entry(e.job_id.clone()).or_default().push(CompactEvent::from_pb(e, i as u64 + 1).expect("has kind"));
    }
    let jobs: BTreeMap<String, JobRecord> =
        by_job.into_iter().map(|(id, evs)| (id, JobRecord::from_events(evs))).collect();
    let limiter = LabelLimiter::new(&LabelSettings::default());
    let index = JobIndex::new_at(
        jobs,
        Default::default(),
        events.len() as u64,
        SloEngine::new(SloDef::defaults()),
        limiter,
        NOW,
    );
    let health = HealthBook::default();
    let xid = Reading { at_ms: NOW - HOUR, ecc_corrected: 0, ecc_uncorrected: 0, xid_errors: 1, gpus: 8 };
    assert!(health.record(SICK_INSTANCE, xid));
    ApiState {
        index: SharedIndex::new(index),
        store,
        ready: Arc::new(AtomicBool::new(true)),
        health: Arc::new(crate::health::Health::default()),
        max_page_size: 100,
        reads: super::super::reads::ReadGate::new(2),
        backups: Default::default(),
        clock: crate::time::Clock::starting_at(NOW),
        board: Default::default(),
        telemetry: None,
        auth: Arc::new(crate::auth::Auth::open()),
        sessions: Default::default(),
        reload: None,
        cost: Default::default(),
        final_stages: Arc::new(Vec::new()),
        nodes: Default::default(),
        node_health: health,
        chain_slos: Default::default(),
    }
}

async fn get(s: &ApiState, uri: &str) -> (StatusCode, Value) {
    let req = Request::builder().uri(uri).body(Body::empty()).expect("request");
    let res = router(s.clone()).oneshot(req).await.expect("infallible");
    let status = res.status();
    let body = res.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&body).expect("JSON"))
}

fn names(v: &Value) -> Vec<String> {
    v["nodes"].as_array().expect("nodes").iter().map(|n| n["node"].as_str().expect("name").to_string()).collect()
}

/// The order the listing must follow, built by hand: the two suspects (the losing node's p-value is tiny, the
/// instance's is 1), the 100 a100 nodes with one failure (equal p-values, so by name), then every node without a
/// failure (p = 1) by pool and name.
fn expected_order() -> Vec<String> {
    let mut v = vec![BAD_NODE.to_string(), SICK_INSTANCE.to_string()];
    v.extend((0..300).filter(|n| n % 3 == 0).map(ded));
    v.extend((0..300).filter(|n| n % 3 != 0 && ded(*n) != BAD_NODE).map(ded));
    v.extend((0..20).map(|n| format!("h100-{n:02}")));
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demo_sized_fleet_answers_a_bounded_first_page_with_the_suspect_on_top() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = state(dir.path());
    let (status, d) = get(&s, "/api/v1/nodes").await;
    assert_eq!(status, StatusCode::OK, "{d}");
    // 320 dedicated nodes and the suspect instance are listed; the other 7,999 instances are summed up.
    assert_eq!(d["total"], 321);
    assert_eq!(d["grouped_instances"], 7999);
    assert_eq!((d["offset"].as_u64(), d["limit"].as_u64(), d["next_offset"].as_u64()), (Some(0), Some(100), Some(100)));
    assert_eq!(d["nodes"].as_array().map(Vec::len), Some(PAGE));
    let want = expected_order();
    assert_eq!(names(&d), want[..PAGE].to_vec());
    let top = &d["nodes"][0];
    assert_eq!((top["suspect"].as_bool(), top["reasons"].clone()), (Some(true), json!(["failure_rate"])));
    assert_eq!(
        (top["placements"].as_u64(), top["lost"].as_u64(), top["pool_kind"].as_str()),
        (Some(8), Some(6), Some("dedicated"))
    );
    // The rest of a100: 100 failures in 299 x 4 placements, smoothed (100 + 1) / (1196 + 2); the tail
    // P[Binom(8, p0) >= 6] summed here term by term.
    let p0: f64 = 101.0 / 1198.0;
    let tail: f64 = (6..=8u32)
        .map(|j| {
            let c = [28.0, 8.0, 1.0][(j - 6) as usize];
            c * p0.powi(j as i32) * (1.0 - p0).powi(8 - j as i32)
        })
        .sum();
    let got = top["p_value"].as_f64().expect("p");
    assert!((got - tail).abs() <= 1e-9 * tail, "p-value {got} vs {tail}");
    assert!((top["threshold"].as_f64().expect("t") - 0.01 / 300.0).abs() < 1e-15);
    let sick = &d["nodes"][1];
    assert_eq!((sick["pool"].as_str(), sick["pool_kind"].as_str()), (Some("vx"), Some("managed")));
    assert_eq!(sick["reasons"], json!(["xid"]));

    // Per pool, by name: nodes, placements, failures and losses as built.
    let pools = d["pools"].as_array().expect("pools");
    let keys = ["pool", "kind", "grouped", "nodes", "placements", "failed", "lost", "suspects"];
    let got: Vec<Value> =
        pools.iter().map(|p| keys.iter().map(|k| p[*k].clone()).collect::<Vec<Value>>().into()).collect();
    assert_eq!(
        got,
        vec![
            json!(["a100", "dedicated", false, 300, 299 * 4 + 8, 100, 6, 1]),
            // 1500 jobs: i % 10 == 3 for 150 of them, i % 25 == 7 for 60.
            json!(["az", "managed", true, 1500, 1500, 150, 60, 0]),
            json!(["h100", "dedicated", false, 20, 40, 0, 0, 0]),
            json!(["sm", "managed", true, 4000, 4000, 400, 160, 0]),
            json!(["vx", "managed", true, 2500, 2500, 250, 100, 1]),
        ]
    );
    let sm = &pools[3];
    assert_eq!((sm["failed_rate"].as_f64(), sm["lost_rate"].as_f64()), (Some(0.1), Some(0.04)));
    assert_eq!(sm["bad"], 560);
    assert!((sm["bad_rate"].as_f64().expect("rate") - 0.14).abs() < 1e-15);

    // Every page in turn gives the whole order once.
    let mut seen = Vec::new();
    let mut offset = Some(0);
    while let Some(o) = offset {
        let (status, p) = get(&s, &format!("/api/v1/nodes?offset={o}&limit=37")).await;
        assert_eq!(status, StatusCode::OK, "{p}");
        assert_eq!(p["total"], 321);
        assert!(p["nodes"].as_array().map_or(0, Vec::len) <= 37);
        seen.extend(names(&p));
        offset = p["next_offset"].as_u64();
    }
    assert_eq!(seen, want);
    let (_, past) = get(&s, "/api/v1/nodes?offset=5000").await;
    assert_eq!((past["nodes"].as_array().map(Vec::len), past["total"].as_u64()), (Some(0), Some(321)));
    assert!(past.get("next_offset").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_filters_find_suspects_pools_and_instances_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = state(dir.path());
    let (_, d) = get(&s, "/api/v1/nodes?suspect=true").await;
    assert_eq!(names(&d), vec![BAD_NODE, SICK_INSTANCE]);
    assert_eq!(d["total"], 2);
    assert_eq!(d["pools"].as_array().map(Vec::len), Some(5), "pools are not filtered by suspect");
    // A pool: only its nodes and its row.
    let (_, d) = get(&s, "/api/v1/nodes?pool=h100&limit=1000").await;
    assert_eq!(d["total"], 20);
    assert_eq!(d["grouped_instances"], 0);
    assert_eq!(d["pools"].as_array().map(|p| p.len()), Some(1));
    // A grouped pool: its suspect instance only, and the rest counted.
    let (_, d) = get(&s, "/api/v1/nodes?pool=vx").await;
    assert_eq!(names(&d), vec![SICK_INSTANCE]);
    assert_eq!(d["grouped_instances"], 2499);
    // A name (case does not matter) finds instances too: sm's instances 0x100..0x10f, those that failed or were
    // lost first (0x101 = 257 is lost, 0x107 = 263 failed; their p-value is the pool's rate, the others' 1).
    let (_, d) = get(&s, "/api/v1/nodes?name=SM-I-0000010").await;
    let mut want: Vec<String> = [0x101, 0x107].map(|i| instance("sm", i)).to_vec();
    want.extend((0x100..0x110).filter(|i| ![0x101, 0x107].contains(i)).map(|i| instance("sm", i)));
    assert_eq!(names(&d), want);
    // "ded-13": ded-130..ded-139, ded-137 first (suspect), then those with a failure (132, 135, 138), then the rest.
    let (_, d) = get(&s, "/api/v1/nodes?name=ded-13&suspect=false").await;
    let mut want: Vec<String> = vec![BAD_NODE.into()];
    want.extend([132, 135, 138].map(ded));
    want.extend([130, 131, 133, 134, 136, 139].map(ded));
    assert_eq!(names(&d), want);
    let (_, d) = get(&s, "/api/v1/nodes?name=&pool=az").await;
    assert_eq!(
        (d["total"].as_u64(), d["grouped_instances"].as_u64()),
        (Some(0), Some(1500)),
        "an empty name filters nothing"
    );
}

#[tokio::test]
async fn bad_parameters_are_refused_naming_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = state(dir.path());
    for (uri, field) in [
        ("/api/v1/nodes?limit=0", "limit:"),
        ("/api/v1/nodes?limit=1001", "limit:"),
        ("/api/v1/nodes?limit=ten", "limit:"),
        ("/api/v1/nodes?offset=-1", "offset:"),
        ("/api/v1/nodes?offset=1.5", "offset:"),
        ("/api/v1/nodes?suspect=yes", "suspect:"),
        ("/api/v1/nodes?window=5m", "window:"),
        ("/api/v1/nodes?page=2", "page:"),
    ] {
        let (status, v) = get(&s, uri).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {v}");
        let msg = v["error"].as_str().expect("error text");
        assert!(msg.starts_with(field), "{uri}: {msg}");
    }
}

#[test]
fn the_query_defaults_and_reads_every_parameter() {
    let q = |pairs: &[(&str, &str)]| {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        list_query(&m, 86_400_000).ok()
    };
    assert_eq!(
        q(&[]),
        Some(ListQuery { window_ms: 86_400_000, pool: None, name: None, only_suspect: false, offset: 0, limit: 100 })
    );
    assert_eq!(
        q(&[
            ("window", "2d"),
            ("pool", "a100"),
            ("name", "Node-1"),
            ("suspect", "true"),
            ("offset", "40"),
            ("limit", "1000")
        ]),
        Some(ListQuery {
            window_ms: 2 * 86_400_000,
            pool: Some("a100".into()),
            name: Some("node-1".into()),
            only_suspect: true,
            offset: 40,
            limit: 1000
        })
    );
}
