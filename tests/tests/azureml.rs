//! The Azure ML adapter's real client against a local server that replays Microsoft Entra ID's token endpoint
//! (client-credentials grant) and Azure Machine Learning's documented REST answers: the ARM job list
//! (api-version 2024-04-01, paged with `nextLink`, newest first), one job, one compute and the run history (no
//! Azure subscription is reachable here). A job goes Preparing, Queued, Running, Completed across polls, in
//! Azure's order, with the adapter restarted in between; the collector's timeline holds each transition once,
//! the start and end at the run history's times. Also: a job that drops off the listed pages is fetched by name
//! until it ends; paging stops at the first page older than the lookback; a revoked token is replaced without
//! losing the poll; every fourth ARM call is throttled (429) and retried on its own, so no poll fails.

use startline_tests::{
    binary, free_port, http_get_text, serve_http, wait_until, workspace_root, ChildGuard, Collector,
};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SUB: &str = "00000000-1111-2222-3333-444444444444";
const WS: &str = "/subscriptions/00000000-1111-2222-3333-444444444444/resourceGroups/ml-rg/providers/Microsoft.MachineLearningServices/workspaces/ml-ws";

fn fixture(name: &str) -> serde_json::Value {
    let p = workspace_root().join("agent/src/provider/fixtures").join(name);
    serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("json")
}

fn rfc3339(ms: i64) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(ms as u64)).to_string()
}

/// What the replay saw.
#[derive(Default)]
struct Seen {
    /// (path and query, authorization header) of every ARM and run-history request.
    requests: Vec<(String, String)>,
    /// Bodies of token requests.
    token_forms: Vec<String>,
}

struct Replay {
    stage: Arc<AtomicUsize>,
    seen: Arc<Mutex<Seen>>,
    created: i64,
    /// (start, end) the run history reports: the moments the replay first served Running and Completed.
    times: Arc<Mutex<(Option<i64>, Option<i64>)>>,
}

fn job(base: &serde_json::Value, name: &str, status: &str, created: i64, tags: serde_json::Value) -> serde_json::Value {
    let mut j = base.clone();
    j["name"] = name.into();
    j["id"] = format!("{WS}/jobs/{name}").into();
    j["properties"]["status"] = status.into();
    j["properties"]["displayName"] = name.into();
    j["properties"]["tags"] = tags;
    j["systemData"]["createdAt"] = rfc3339(created).into();
    j["systemData"]["lastModifiedAt"] = rfc3339(created + 1000).into();
    j
}

fn replay_server(r: &Replay) -> std::net::SocketAddr {
    let (stage, seen, created, times) = (r.stage.clone(), r.seen.clone(), r.created, r.times.clone());
    let base = fixture("azureml-job-command.json");
    let compute = fixture("azureml-compute.json");
    let run = fixture("azureml-run-history.json");
    let issued = AtomicUsize::new(0);
    let arm_calls = AtomicUsize::new(0);
    // When the job completes, every token issued so far is revoked (a credential rotation): the adapter gets a
    // 401, must fetch a new token and finish the poll.
    let revoked_up_to: Mutex<Option<usize>> = Mutex::new(None);
    serve_http(move |req| {
        let path = req.path.clone();
        if path.ends_with("/oauth2/v2.0/token") {
            let form = String::from_utf8_lossy(&req.body).to_string();
            if let Ok(mut s) = seen.lock() {
                s.token_forms.push(form.clone());
            }
            if !form.contains("client_secret=s3cr3t") || !path.starts_with("/tenant-1/") {
                let e = r#"{"error":"invalid_client","error_description":"AADSTS7000215: Invalid client secret provided."}"#;
                return (401, "application/json", e.to_string());
            }
            let n = issued.fetch_add(1, Ordering::SeqCst) + 1;
            let t = serde_json::json!({"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": format!("tok-{n}")});
            return (200, "application/json", t.to_string());
        }
        let auth = req.header("authorization").unwrap_or("").to_string();
        if let Ok(mut s) = seen.lock() {
            s.requests.push((path.clone(), auth.clone()));
        }
        let st = stage.load(Ordering::SeqCst);
        let n: usize = auth.strip_prefix("Bearer tok-").and_then(|n| n.parse().ok()).unwrap_or(0);
        let cutoff = {
            let mut r = revoked_up_to.lock().expect("lock");
            if st >= 3 && r.is_none() {
                *r = Some(issued.load(Ordering::SeqCst));
            }
            *r
        };
        if n == 0 || cutoff.is_some_and(|c| n <= c) {
            let e = r#"{"error":{"code":"ExpiredAuthenticationToken","message":"The access token expiry UTC time is earlier than current UTC time."}}"#;
            return (401, "application/json", e.to_string());
        }
        if arm_calls.fetch_add(1, Ordering::SeqCst) % 4 == 3 {
            let e = r#"{"error":{"code":"TooManyRequests","message":"The request is being throttled."}}"#;
            return (429, "application/json", e.to_string());
        }
        let main_status = ["Preparing", "Queued", "Running", "Completed"][st.min(3)];
        let (start, end) = {
            let mut t = times.lock().expect("lock");
            let now = startline_proto::time::now_ms();
            if st >= 2 && t.0.is_none() {
                t.0 = Some(now);
            }
            if st >= 3 && t.1.is_none() {
                t.1 = Some(now);
            }
            *t
        };
        let urgent = serde_json::json!({"team": "nlp", "startline-priority": "urgent"});
        let a = job(&base, "sft-a", main_status, created, urgent);
        let b = job(&base, "sft-b", "Canceled", created + 60_000, serde_json::json!({"team": "vision"}));
        let d_status = if st == 0 { "Queued" } else { "Completed" };
        let d = job(&base, "sft-d", d_status, created - 60_000, serde_json::json!({}));
        let old = job(&base, "old-c", "Completed", created - 10 * 86_400_000, serde_json::json!({}));
        let jobs_path = format!("{WS}/jobs?api-version=2024-04-01&listViewType=All");
        let answer = if path == jobs_path {
            // Page 1, newest first; D only while it is queued (later it falls off the listed pages).
            let mut page = vec![b, a];
            if st == 0 {
                page.push(d);
            }
            serde_json::json!({"value": page, "nextLink": format!("http://{}{jobs_path}&$skipToken=p2", req.header("host").unwrap_or(""))})
        } else if path.ends_with("&$skipToken=p2") {
            serde_json::json!({"value": [old], "nextLink": format!("http://{}{jobs_path}&$skipToken=p3", req.header("host").unwrap_or(""))})
        } else if path.ends_with("&$skipToken=p3") {
            serde_json::json!({"value": []})
        } else if path == format!("{WS}/jobs/sft-d?api-version=2024-04-01") {
            d
        } else if path == format!("{WS}/computes/h100-cluster?api-version=2024-04-01") {
            compute.clone()
        } else if let Some(name) = path.strip_prefix(&format!("/history/v1.0{WS}/runs/")) {
            let mut r = run.clone();
            r["runId"] = name.into();
            if name == "sft-a" {
                r["startTimeUtc"] = start.map(rfc3339).into();
                r["endTimeUtc"] = end.map(rfc3339).into();
            } else {
                r["startTimeUtc"] = rfc3339(created + 60_000).into();
                r["endTimeUtc"] = rfc3339(created + 120_000).into();
            }
            r
        } else {
            return (404, "application/json", r#"{"error":{"code":"NotFound","message":"not found"}}"#.to_string());
        };
        (200, "application/json", answer.to_string())
    })
}

fn adapter(
    collector: &str,
    endpoint: &str,
    spool: &std::path::Path,
    secret: &std::path::Path,
    metrics: u16,
) -> ChildGuard {
    ChildGuard(
        Command::new(binary("startline-agent"))
            .args(["--collector", collector, "azureml", "--metrics-listen", &format!("127.0.0.1:{metrics}")])
            .args([
                "--subscription",
                SUB,
                "--resource-group",
                "ml-rg",
                "--workspace",
                "ml-ws",
                "--region",
                "westeurope",
            ])
            .args(["--endpoint", endpoint, "--history-endpoint", endpoint, "--authority-host", endpoint])
            .args(["--tenant", "tenant-1", "--client-id", "client-1", "--interval", "1s"])
            .arg("--client-secret-file")
            .arg(secret)
            .arg("--spool")
            .arg(spool)
            .env_remove("AZURE_ACCESS_TOKEN")
            .env_remove("AZURE_CLIENT_SECRET")
            .env_remove("AZURE_FEDERATED_TOKEN_FILE")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("adapter"),
    )
}

#[test]
fn azure_ml_jobs_are_followed_through_a_replayed_api_across_an_adapter_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let created = startline_proto::time::now_ms() - 30 * 60_000;
    let r = Replay {
        stage: Arc::new(AtomicUsize::new(0)),
        seen: Arc::new(Mutex::new(Seen::default())),
        created,
        times: Arc::new(Mutex::new((None, None))),
    };
    let endpoint = format!("http://{}", replay_server(&r));
    let spool = dir.path().join("spool");
    let secret = dir.path().join("client-secret");
    std::fs::write(&secret, "s3cr3t\n").expect("secret");
    let job = "/api/v1/jobs/azureml/ml-rg/ml-ws/sft-a";

    let mut first = adapter(&c.endpoint(), &endpoint, &spool, &secret, free_port());
    wait_until("the preparing job", Duration::from_secs(30), || c.get(job).1["state"] == "preparing");
    wait_until("the queued job D", Duration::from_secs(30), || {
        c.get("/api/v1/jobs/azureml/ml-rg/ml-ws/sft-d").1["state"] == "queued"
    });
    r.stage.store(1, Ordering::SeqCst);
    wait_until("the queued job", Duration::from_secs(30), || c.get(job).1["state"] == "queued");
    let _ = first.0.kill();
    let _ = first.0.wait();
    r.stage.store(2, Ordering::SeqCst);
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let _second = adapter(&c.endpoint(), &endpoint, &spool, &secret, metrics.port());
    wait_until("the running job", Duration::from_secs(30), || c.get(job).1["state"] == "running");
    r.stage.store(3, Ordering::SeqCst);
    wait_until("the job to be done", Duration::from_secs(30), || c.get(job).1["state"] == "done");

    let (_, j) = c.get(job);
    assert_eq!((j["outcome"].as_str(), j["priority"].as_str()), (Some("succeeded"), Some("urgent")));
    assert_eq!(
        (j["gpu_count"].as_u64(), j["gpu_class"].as_str(), j["pool"].as_str(), j["region"].as_str()),
        (Some(16), Some("h100"), Some("h100-cluster"), Some("westeurope")),
        "2 nodes of the compute's STANDARD_ND96ISR_H100_V5"
    );
    let m = &j["timeline"]["milestones"];
    let ms = |v: &serde_json::Value| {
        v.as_str()
            .and_then(|s| humantime::parse_rfc3339(s).ok())
            .map(|t| t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64))
    };
    let (start, end) = *r.times.lock().expect("times");
    let (start, end) = (start.expect("served running"), end.expect("served completed"));
    assert_eq!(ms(&m["submitted"]), Some(created));
    assert_eq!(ms(&m["first_step"]), Some(start), "start from the run history");
    assert_eq!(ms(&m["done"]), Some(end), "end from the run history");
    assert_eq!(j["time_to_first_step_seconds"].as_f64(), Some((start - created) as f64 / 1000.0));
    let w = &j["timeline"]["initial_wait_seconds"];
    assert!(w["preparing:image_pull"].is_number() && w["queued:capacity"].is_number(), "Azure's order kept: {w}");
    let ids: Vec<&str> =
        j["events"].as_array().expect("events").iter().filter_map(|e| e["event_id"].as_str()).collect();
    assert_eq!(ids.len(), 5, "submitted, preparing, queued, first step, done, each once: {ids:?}");

    let (_, b) = c.get("/api/v1/jobs/azureml/ml-rg/ml-ws/sft-b");
    assert_eq!((b["outcome"].as_str(), b["team"].as_str()), (Some("cancelled"), Some("vision")));
    wait_until("job D, fetched by name after it left the pages", Duration::from_secs(30), || {
        c.get("/api/v1/jobs/azureml/ml-rg/ml-ws/sft-d").1["outcome"] == "succeeded"
    });
    assert_eq!(c.get("/api/v1/jobs/azureml/ml-rg/ml-ws/old-c").0, 404, "older than the lookback: not followed");

    let seen = r.seen.lock().expect("seen");
    assert!(seen.token_forms.iter().all(|f| f.contains("grant_type=client_credentials")
        && f.contains("client_id=client-1")
        && f.contains("scope=https%3A%2F%2Fmanagement.azure.com%2F.default")));
    assert!(
        seen.token_forms.len() >= 3,
        "a token per adapter start and one after the revocation: {}",
        seen.token_forms.len()
    );
    assert!(seen.requests.iter().all(|(_, a)| a.starts_with("Bearer tok-")), "every call carried a token");
    assert!(!seen.requests.iter().any(|(p, _)| p.ends_with("$skipToken=p3")), "paging stops at the first old page");
    assert!(seen.requests.iter().any(|(p, _)| p.ends_with("$skipToken=p2")));
    drop(seen);

    let scrape = || http_get_text(metrics, "/metrics").1;
    wait_until("a retried call", Duration::from_secs(30), || {
        startline_agent::metrics::sample(
            &scrape(),
            "startline_agent_provider_call_retries_total",
            &[("provider", "azureml"), ("kind", "throttled")],
        )
        .is_some_and(|n| n > 0.0)
    });
    let text = scrape();
    for k in ["throttled", "http_status", "transport"] {
        let n = startline_agent::metrics::sample(
            &text,
            "startline_agent_poll_errors_total",
            &[("provider", "azureml"), ("kind", k)],
        );
        assert_eq!(n, Some(0.0), "{k}: {text}");
    }
}
