//! The collector's HTTP API as a fuzz target: random request lines (`METHOD target`) through the real axum router
//! ([`startline_collector::api::router`]) in-process, over an index of jobs in every state with their events in a
//! real sled store. The query parsers (filters, time windows, selectors, pagination, durations) are private to
//! their handlers, so they are driven through the router; the public ones ([`parse_query`], [`parse_time`],
//! [`Selector::parse`]) are also called directly on every decoded parameter.
//!
//! Properties: no 5xx (the API documents 4xx for every client error, and 503 only for storage failures, which
//! cannot happen here); every error body is a JSON object with an `error` string; every `/api/` success is
//! JSON; `compare.svg` is an SVG image.

use super::mutate::{self, pick};
use super::{Outcome, Target};
use crate::crashtrial::Rng;
use axum::body::Body;
use axum::http::{header, Method, Request, Uri};
use startline_collector::api::extract::parse_query;
use startline_collector::api::{router, ApiState};
use startline_collector::compare::Selector;
use startline_collector::index::labels::{LabelLimiter, LabelSettings};
use startline_collector::index::{JobIndex, SharedIndex};
use startline_collector::job::{CompactEvent, JobRecord};
use startline_collector::slo::{SloDef, SloEngine};
use startline_collector::store::{encode_log_value, Store};
use startline_collector::time::parse_time;
use startline_proto::pb::{self, lifecycle_event::Kind};
use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use tower::ServiceExt;

/// Largest response body read, bytes (a bigger one is a finding).
const MAX_BODY: usize = 64 << 20;

/// Query parameter names the API knows (and a few it does not).
const PARAMS: &[&str] = &[
    "pool_kind",
    "provider",
    "pool",
    "priority",
    "state",
    "submitted_after",
    "submitted_before",
    "limit",
    "page_token",
    "left",
    "right",
    "by",
    "window",
    "format",
    "x",
];

/// Values worth trying for any parameter.
const VALUES: &[&str] = &[
    "managed",
    "dedicated",
    "urgent",
    "normal",
    "queued",
    "running",
    "done",
    "unsubmitted",
    "slurm",
    "sagemaker",
    "gpu",
    "1",
    "0",
    "100",
    "1000",
    "1001",
    "-1",
    "18446744073709551616",
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775",
    "-9223372036854776",
    "2026-01-02T03:04:05Z",
    "2026-01-02T03:04:05.123456789+01:00",
    "2026-01-02 03:04:05",
    "1969-12-31T23:59:59Z",
    "0000-01-01T00:00:00Z",
    "9999-12-31T23:59:59Z",
    "30d",
    "1m",
    "59s",
    "1h",
    "400d",
    "401d",
    "1h 30m",
    "5000000000000000000ns",
    "99999999999999999999d",
    "1y",
    "pool_kind=managed",
    "pool_kind=dedicated,gpu_class=h100",
    "provider=slurm,region=site-a",
    "pool_kind=",
    "=",
    ",,,",
    "gpu_class",
    "region",
    "slurm/cluster-a/17",
    "",
    "%00",
    "%FF",
    "%C3%28",
    "%E2%80%AE",
    "%2F",
    "+",
    "%",
];

/// Paths the API serves (job ids and SLO names are added from the index).
const PATHS: &[&str] = &[
    "/api/v1/jobs",
    "/api/v1/slos",
    "/api/v1/slos/urgent-start",
    "/api/v1/slos/normal-start",
    "/api/v1/slos/nope",
    "/api/v1/alerts",
    "/api/v1/overview",
    "/api/v1/compare",
    "/api/v1/compare.svg",
    "/api/v1/jobs/",
    "/api/v1/",
    "/healthz",
    "/readyz",
    "/metrics",
    "/",
    "/dashboard",
    "/api/v2/jobs",
    "//api/v1/jobs",
    "/api/v1/jobs/%FF",
    "/api/v1/jobs/a%2Fb",
];

const METHODS: &[&str] =
    &["GET", "GET", "GET", "GET", "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "BREW"];

/// The API router over a fixed index.
pub struct Http {
    rt: tokio::runtime::Runtime,
    app: axum::Router,
    job_ids: Vec<String>,
    tokens: Vec<Vec<u8>>,
    _dir: tempfile::TempDir,
}

/// One job's lifecycle, cut after `stage` events (so every state occurs), with varied attributes.
fn lifecycle(i: usize, now: i64) -> Vec<pb::LifecycleEvent> {
    let job = match i % 5 {
        0 => format!("slurm/cluster-a/{}", 1000 + i),
        1 => format!("sagemaker/123456789012/train-{i}"),
        2 => format!("vertex/ml-prod/europe-west4/{}", 9_000_000 + i),
        3 => format!("slurm/cluster-b/{}_{}", 500 + i, i % 7),
        _ => format!("kubernetes/ns/pod-\u{e9}-{i}"),
    };
    let managed = i % 5 == 1 || i % 5 == 2;
    let submitted = now - (i as i64 % 40) * 86_400_000 - (i as i64 * 7_919 % 3_600) * 1000;
    // Waits from zero (first step at submit) to days.
    let wait = [0, 1_000, 60_000, 600_000, 3_600_000, 86_400_000 * 3][i % 6];
    let mut evs = super::targets::protocol_events(&job, submitted);
    if let Some(Kind::Submitted(s)) = evs[0].kind.as_mut() {
        s.pool_kind = if managed { pb::PoolKind::Managed } else { pb::PoolKind::Dedicated } as i32;
        s.provider = job.split('/').next().unwrap_or("slurm").to_string();
        s.pool = ["gpu", "ml.p5.48xlarge", "a3-highgpu-8g", "gpu-urgent"][i % 4].into();
        s.priority = if i % 3 == 0 { pb::PriorityClass::Urgent } else { pb::PriorityClass::Normal } as i32;
        s.gpu_class = ["h100", "a100", "l4"][i % 3].into();
        s.region = ["site-a", "us-east-1", "europe-west4"][i % 3].into();
    }
    for (k, e) in evs.iter_mut().enumerate().skip(1) {
        let at = submitted + if k >= 4 { wait + (k as i64 - 4) * 60_000 } else { wait * k as i64 / 4 };
        e.occurred_at = Some(startline_proto::time::ms_to_timestamp(at));
    }
    // Keep the first `stage` events: unsubmitted (no submitted), queued, assigned, preparing, running, done...
    let stage = [0, 1, 2, 3, 4, 5, 6, 7, 8, 11, 11, 11][i % 12];
    if stage == 0 {
        evs.remove(0);
        evs.truncate(2);
    } else {
        evs.truncate(stage);
        if stage == 11 && i % 2 == 0 {
            // Most jobs that end do not lose nodes or get preempted.
            evs.retain(|e| !matches!(e.kind, Some(Kind::Preempted(_) | Kind::Requeued(_) | Kind::NodeLost(_))));
        }
    }
    evs
}

impl Http {
    /// Builds the index (about 240 jobs in every state, plus the adapters' jobs from the captured payloads), the
    /// store with their events, and the router.
    pub fn new() -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let store = Store::open(dir.path()).map_err(|e| format!("store: {e}"))?;
        let now = startline_proto::time::now_ms();
        let mut events: Vec<pb::LifecycleEvent> = (0..240).flat_map(|i| lifecycle(i, now)).collect();
        events.extend(super::targets::adapter_events());
        let mut entries = Vec::new();
        let mut by_job: BTreeMap<String, Vec<CompactEvent>> = BTreeMap::new();
        for (i, ev) in events.iter().enumerate() {
            let seq = i as u64 + 1;
            entries.push((seq, encode_log_value(ev)));
            if let Some(c) = CompactEvent::from_pb(ev, seq) {
                by_job.entry(ev.job_id.clone()).or_default().push(c);
            }
        }
        store.append_durable(&entries).map_err(|e| format!("store append: {e}"))?;
        let last_seq = entries.len() as u64;
        let jobs: BTreeMap<String, JobRecord> =
            by_job.into_iter().map(|(id, evs)| (id, JobRecord::from_events(evs))).collect();
        let job_ids: Vec<String> = jobs.keys().cloned().collect();
        let limiter = LabelLimiter::new(&LabelSettings { max_values_per_label: 50, ..Default::default() });
        let index = JobIndex::new(jobs, last_seq, SloEngine::new(SloDef::defaults()), limiter);
        let board = startline_collector::alert::AlertBoard::default();
        for (k, resolved) in [("job/urgent-start/slurm/cluster-a/1000", None), ("burn/normal-start/page", Some(now))] {
            board.insert(startline_collector::alert::AlertRecord {
                key: k.into(),
                labels: BTreeMap::from([("alertname".into(), "StartlineUrgentStart".into())]),
                annotations: BTreeMap::from([("summary".into(), "waited \u{2265} 10 min".into())]),
                starts_at_ms: now - 600_000,
                resolved_at_ms: resolved,
            });
        }
        let state = ApiState {
            index: SharedIndex::new(index),
            store,
            ready: Arc::new(AtomicBool::new(true)),
            health: Arc::new(startline_collector::health::Health::default()),
            max_page_size: 1000,
            clock: startline_collector::time::Clock::system(),
            board,
            telemetry: None,
            auth: std::sync::Arc::new(startline_collector::auth::Auth::open()),
            sessions: Default::default(),
            reload: None,
            cost: Default::default(),
            final_stages: Default::default(),
            nodes: Default::default(),
            node_health: Default::default(),
            chain_slos: Default::default(),
            reads: startline_collector::api::reads::ReadGate::new(4),
            backups: Default::default(),
        };
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| format!("runtime: {e}"))?;
        let mut tokens: Vec<Vec<u8>> = PARAMS.iter().map(|p| format!("&{p}=").into_bytes()).collect();
        tokens.extend(VALUES.iter().map(|v| v.as_bytes().to_vec()));
        Ok(Http { rt, app: router(state), job_ids, tokens, _dir: dir })
    }

    /// The class of a path: its route, with ids and names replaced.
    fn route(path: &str) -> &'static str {
        const EXACT: &[&str] = &[
            "/api/v1/jobs",
            "/api/v1/slos",
            "/api/v1/alerts",
            "/api/v1/overview",
            "/api/v1/compare",
            "/api/v1/compare.svg",
            "/healthz",
            "/readyz",
            "/metrics",
            "/",
            "/dashboard",
        ];
        if let Some(r) = EXACT.iter().find(|r| **r == path) {
            return r;
        }
        if path.starts_with("/api/v1/jobs/") {
            "/api/v1/jobs/{id}"
        } else if path.starts_with("/api/v1/slos/") {
            "/api/v1/slos/{name}"
        } else {
            "other"
        }
    }

    fn random_request(&self, rng: &mut Rng) -> Vec<u8> {
        let method = if rng.chance(0.9) { "GET" } else { pick(rng, METHODS) };
        let path = if rng.chance(0.3) && !self.job_ids.is_empty() {
            format!("/api/v1/jobs/{}", crate::path_escape(pick(rng, &self.job_ids).as_str()))
        } else {
            pick(rng, PATHS).to_string()
        };
        let mut q = Vec::new();
        for _ in 0..rng.range(0, 4) {
            q.push(format!("{}={}", pick(rng, PARAMS), pick(rng, VALUES)));
        }
        let target = if q.is_empty() { path } else { format!("{path}?{}", q.join("&")) };
        format!("{method} {target}").into_bytes()
    }
}

impl Target for Http {
    fn name(&self) -> &'static str {
        "http"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        // The requests the dashboard, the README and the tests make.
        let mut out: Vec<Vec<u8>> = [
            "GET /api/v1/jobs",
            "GET /api/v1/jobs?state=queued&limit=50",
            "GET /api/v1/jobs?pool_kind=managed&priority=urgent&submitted_after=2026-01-01T00:00:00Z",
            "GET /api/v1/jobs?provider=slurm&pool=gpu&submitted_before=1900000000&limit=2&page_token=slurm%2Fcluster-a%2F1000",
            "GET /api/v1/slos",
            "GET /api/v1/slos/urgent-start?window=7d",
            "GET /api/v1/alerts?state=firing",
            "GET /api/v1/overview?window=24h",
            "GET /api/v1/compare?left=pool_kind=managed&right=pool_kind=dedicated&by=gpu_class&window=30d",
            "GET /api/v1/compare.svg?left=provider%3Dsagemaker&right=pool_kind%3Ddedicated%2Cgpu_class%3Dh100",
            "GET /healthz",
            "GET /readyz",
            "GET /metrics",
            "GET /dashboard",
            "POST /api/v1/jobs",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
        for id in self.job_ids.iter().step_by(37) {
            out.push(format!("GET /api/v1/jobs/{}", crate::path_escape(id)).into_bytes());
        }
        out
    }

    fn mutate(&self, rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
        match rng.range(0, 9) {
            0 => *input = self.random_request(rng),
            1..=3 => {
                // Add, replace or drop one query parameter.
                let text = String::from_utf8_lossy(input).into_owned();
                let (head, query) = text.split_once('?').unwrap_or((&text, ""));
                let mut pairs: Vec<String> = query.split('&').filter(|p| !p.is_empty()).map(str::to_string).collect();
                let value = |rng: &mut Rng| {
                    if rng.chance(0.2) {
                        crate::query_escape(pick::<&str>(rng, mutate::TEXT_TOKENS))
                    } else {
                        pick(rng, VALUES).to_string()
                    }
                };
                match rng.range(0, 3) {
                    0 if !pairs.is_empty() => {
                        let i = rng.range(0, pairs.len() as u64 - 1) as usize;
                        let key = pairs[i].split('=').next().unwrap_or("").to_string();
                        pairs[i] = format!("{key}={}", value(rng));
                    }
                    1 if !pairs.is_empty() => {
                        let i = rng.range(0, pairs.len() as u64 - 1) as usize;
                        if rng.chance(0.5) {
                            pairs.remove(i);
                        } else {
                            let p = pairs[i].clone();
                            pairs.push(p);
                        }
                    }
                    2 => pairs.push(format!("{}={}", "x".repeat(*pick(rng, &[1usize, 4000, 9000])), value(rng))),
                    _ => pairs.push(format!("{}={}", pick(rng, PARAMS), value(rng))),
                }
                *input =
                    if pairs.is_empty() { head.into() } else { format!("{head}?{}", pairs.join("&")) }.into_bytes();
            }
            _ => mutate::bytes(rng, input, corpus, &self.tokens),
        }
    }

    fn run(&mut self, input: &[u8]) -> Result<Outcome, String> {
        let (method, target) = match input.iter().position(|b| *b == b' ') {
            Some(i) => (&input[..i], &input[i + 1..]),
            None => (&b"GET"[..], input),
        };
        let Ok(method) = Method::from_bytes(method) else {
            return Ok(Outcome::Rejected("bad method (hyper answers 400)".into()));
        };
        let Ok(uri) = Uri::try_from(target) else {
            return Ok(Outcome::Rejected("bad request target (hyper answers 400)".into()));
        };
        if let Some(q) = uri.query() {
            if let Ok(params) = parse_query(q) {
                for v in params.values() {
                    let _ = parse_time(v);
                    let _ = Selector::parse(v);
                }
            }
        }
        let path = uri.path().to_string();
        let route = Self::route(&path);
        let head = method == Method::HEAD;
        let req =
            Request::builder().method(method).uri(uri).body(Body::empty()).map_err(|e| format!("request: {e}"))?;
        let app = self.app.clone();
        let (status, content_type, body) = self.rt.block_on(async move {
            let resp = app.oneshot(req).await.map_err(|e| format!("router: {e}"))?;
            let status = resp.status();
            let ct = resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
            let body = axum::body::to_bytes(resp.into_body(), MAX_BODY)
                .await
                .map_err(|e| format!("{status} {route}: body unreadable or over {MAX_BODY} bytes: {e}"))?;
            Ok::<_, String>((status, ct, body))
        })?;
        let show = || String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        if status.is_server_error() {
            return Err(format!("{status} for {route}: {}", show()));
        }
        let json = || serde_json::from_slice::<serde_json::Value>(&body).ok();
        if status.is_client_error() {
            let ok = content_type.starts_with("application/json")
                && (head || json().is_some_and(|v| v.get("error").is_some_and(|e| e.is_string())));
            if !ok {
                return Err(format!("{status} for {route} is not a JSON error ({content_type:?}): {}", show()));
            }
            return Ok(Outcome::Rejected(format!("{} {route}", status.as_u16())));
        }
        if status.is_success() && !head {
            if route == "/api/v1/compare.svg" {
                if !content_type.starts_with("image/svg+xml") || !body.windows(4).any(|w| w == b"<svg") {
                    return Err(format!("compare.svg answered {content_type:?}: {}", show()));
                }
            } else if path.starts_with("/api/") && (!content_type.starts_with("application/json") || json().is_none()) {
                return Err(format!("{status} for {route} is not JSON ({content_type:?}): {}", show()));
            }
        }
        Ok(Outcome::Accepted(format!("{} {route}", status.as_u16())))
    }
}
