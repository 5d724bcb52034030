//! The API contract: the OpenAPI 3.1 document a collector serves at `/api/v1/openapi.json` is valid (PyPI's
//! openapi-spec-validator), and real answers of every documented route, made here against collectors fed by
//! the simulator (successes, each kind of 4xx, auth refusals on a collector with `[auth]`), validate against it
//! (jsonschema, tests/python/validate_openapi.py). The document is generated from the response structs, so a
//! handler that answers something its struct does not say, or a route missing from the document, fails here.

use startline_tests::{binary, http_request, workspace_root, Collector};
use std::process::Command;

/// Recorded answers, in the shape validate_openapi.py reads.
struct Recorder {
    examples: Vec<serde_json::Value>,
}

impl Recorder {
    /// Calls `url` (an instance of the documented `path`), records the answer and returns its status and body.
    fn call(
        &mut self,
        c: &Collector,
        method: &str,
        path: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, String) {
        let (status, ctype, text) = http_request(c.http, method, url, headers, body);
        self.examples.push(serde_json::json!({
            "method": method.to_ascii_lowercase(),
            "path": path,
            "url": url,
            "status": status,
            "content_type": ctype,
            "body": text,
            "undocumented_param_expected": false,
        }));
        (status, text)
    }

    fn get(&mut self, c: &Collector, path: &str, url: &str, want: u16) -> serde_json::Value {
        let (status, body) = self.call(c, "GET", path, url, &[], "");
        assert_eq!(status, want, "GET {url}: {body}");
        serde_json::from_str(&body).unwrap_or(serde_json::Value::Null)
    }
}

#[test]
fn every_route_answers_as_its_openapi_document_says() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(&dir.path().join("db"), &[]);
    let sim = Command::new(binary("startline-agent"))
        .args(["--collector", &c.endpoint(), "simulate", "--history", "2d", "--seed", "11", "--jobs-per-hour", "30"])
        .output()
        .expect("simulator");
    assert!(sim.status.success(), "{}", String::from_utf8_lossy(&sim.stderr));

    let mut r = Recorder { examples: Vec::new() };
    let doc = r.get(&c, "/api/v1/openapi.json", "/api/v1/openapi.json", 200);
    assert_eq!(doc["openapi"], "3.1.0");

    // Jobs: pages, every filter, each state, a job of each state in detail, errors.
    let page = r.get(&c, "/api/v1/jobs", "/api/v1/jobs?limit=5", 200);
    let token = page["next_page_token"].as_str().expect("more than one page").to_string();
    r.get(&c, "/api/v1/jobs", &format!("/api/v1/jobs?limit=5&page_token={token}"), 200);
    r.get(
        &c,
        "/api/v1/jobs",
        "/api/v1/jobs?pool_kind=managed&priority=urgent&submitted_after=2020-01-01T00:00:00Z&limit=3",
        200,
    );
    for state in ["queued", "assigned", "preparing", "running", "done"] {
        let list = r.get(&c, "/api/v1/jobs", &format!("/api/v1/jobs?state={state}&limit=2"), 200);
        for j in list["jobs"].as_array().expect("jobs") {
            let id = j["job_id"].as_str().expect("id");
            r.get(&c, "/api/v1/jobs/{job_id}", &format!("/api/v1/jobs/{id}"), 200);
        }
    }
    r.get(&c, "/api/v1/jobs", "/api/v1/jobs?state=sleeping", 400);
    r.get(&c, "/api/v1/jobs", "/api/v1/jobs?limit=0", 400);
    r.get(&c, "/api/v1/jobs/{job_id}", "/api/v1/jobs/no/such/job", 404);

    // SLOs, their history, alerts.
    let slos = r.get(&c, "/api/v1/slos", "/api/v1/slos", 200);
    for s in slos["slos"].as_array().expect("slos") {
        let name = s["name"].as_str().expect("name");
        r.get(&c, "/api/v1/slos/{name}", &format!("/api/v1/slos/{name}?window=1d"), 200);
        let h = r.get(&c, "/api/v1/slos/{name}/history", &format!("/api/v1/slos/{name}/history"), 200);
        assert!(h["points"].as_array().is_some_and(|p| p.len() > 100), "{h}");
        r.get(&c, "/api/v1/slos/{name}/history", &format!("/api/v1/slos/{name}/history?range=2d&step=1h"), 200);
        r.get(&c, "/api/v1/slos/{name}/history", &format!("/api/v1/slos/{name}/history?step=later"), 400);
        r.get(&c, "/api/v1/slos/{name}", &format!("/api/v1/slos/{name}?window=10y"), 400);
    }
    r.get(&c, "/api/v1/slos/{name}", "/api/v1/slos/nope", 404);
    r.get(&c, "/api/v1/slos/{name}/history", "/api/v1/slos/nope/history", 404);
    for state in ["firing", "resolved", "all"] {
        r.get(&c, "/api/v1/alerts", &format!("/api/v1/alerts?state={state}"), 200);
    }
    r.get(&c, "/api/v1/alerts", "/api/v1/alerts?state=open", 400);

    // Chains: a two-stage chain, sent over gRPC.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        use startline_proto::pb::{self, lifecycle_event::Kind};
        let sub = |stage: &str| {
            Kind::Submitted(pb::Submitted {
                pool_kind: pb::PoolKind::Managed as i32,
                provider: "sagemaker".into(),
                pool: "p".into(),
                priority: pb::PriorityClass::Normal as i32,
                gpu_count: 1,
                chain_id: "fix/42".into(),
                chain_stage: stage.into(),
                ..Default::default()
            })
        };
        let t = startline_tests::ago(7200);
        let done = Kind::Done(pb::Done { outcome: pb::Outcome::Succeeded as i32, ..Default::default() });
        let evs = vec![
            startline_tests::event("fix/train", "s", t, sub("train")),
            startline_tests::event(
                "fix/train",
                "f",
                t + 60_000,
                Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() }),
            ),
            startline_tests::event("fix/train", "d", t + 600_000, done),
            startline_tests::event("fix/eval", "s", t + 900_000, sub("evaluate")),
        ];
        let mut up =
            startline_agent::uplink::Publisher::new(startline_agent::uplink::UplinkSettings::new(c.endpoint()))
                .expect("publisher");
        up.send(evs).await.expect("send");
        up.flush().await.expect("flush");
    });
    // Nodes: the simulated fleet's placements.
    let nodes = r.get(&c, "/api/v1/nodes", "/api/v1/nodes", 200);
    let node = nodes["nodes"][0]["node"].as_str().expect("the simulated fleet placed jobs on nodes").to_string();
    r.get(&c, "/api/v1/nodes/{node}", &format!("/api/v1/nodes/{node}?window=2d"), 200);
    r.get(&c, "/api/v1/nodes", "/api/v1/nodes?suspect=true&pool=a100&window=2d", 200);
    r.get(&c, "/api/v1/nodes", "/api/v1/nodes?suspect=perhaps", 400);
    // Pages, the name filter (which also finds managed instances) and bad paging parameters.
    let page = r.get(&c, "/api/v1/nodes", "/api/v1/nodes?limit=5&offset=0", 200);
    assert!(page["next_offset"].as_u64() == Some(5), "more than 5 nodes listed: {page}");
    r.get(&c, "/api/v1/nodes", "/api/v1/nodes?name=-I-&offset=5&limit=1000", 200);
    r.get(&c, "/api/v1/nodes", "/api/v1/nodes?limit=0", 400);
    r.get(&c, "/api/v1/nodes", "/api/v1/nodes?offset=-3", 400);
    r.get(&c, "/api/v1/nodes/{node}", "/api/v1/nodes/nowhere", 404);

    let chains = r.get(&c, "/api/v1/chains", "/api/v1/chains", 200);
    assert_eq!(chains["total"], 1, "{chains}");
    r.get(&c, "/api/v1/chains", "/api/v1/chains?state=open&window=7d", 200);
    r.get(&c, "/api/v1/chains", "/api/v1/chains?state=late", 400);
    r.get(&c, "/api/v1/chains/{chain_id}", "/api/v1/chains/fix/42", 200);
    r.get(&c, "/api/v1/chains/{chain_id}", "/api/v1/chains/no/such", 404);

    // GPU time.
    let g = r.get(&c, "/api/v1/goodput", "/api/v1/goodput", 200);
    assert!(g["total"]["jobs"].as_u64().is_some_and(|n| n > 0), "{g}");
    for by in ["team", "pool", "chain_stage"] {
        r.get(&c, "/api/v1/goodput", &format!("/api/v1/goodput?by={by}&window=7d"), 200);
    }
    r.get(&c, "/api/v1/goodput", "/api/v1/goodput?by=colour", 400);
    let cost = r.get(&c, "/api/v1/cost", "/api/v1/cost", 200);
    assert_eq!(cost["configured"], false, "no [cost] here: every pool unpriced");
    r.get(&c, "/api/v1/cost", "/api/v1/cost?window=7d", 200);
    r.get(&c, "/api/v1/cost", "/api/v1/cost?window=1s", 400);

    // Overview and comparison.
    r.get(&c, "/api/v1/overview", "/api/v1/overview", 200);
    r.get(&c, "/api/v1/overview", "/api/v1/overview?window=7d", 200);
    r.get(&c, "/api/v1/overview", "/api/v1/overview?window=1s", 400);
    r.get(&c, "/api/v1/compare", "/api/v1/compare", 200);
    r.get(&c, "/api/v1/compare", "/api/v1/compare?by=gpu_class&window=7d", 200);
    r.get(&c, "/api/v1/compare", "/api/v1/compare?left=pool_kind%3Dmanaged%2Cpriority%3Durgent&by=pool", 200);
    r.get(&c, "/api/v1/compare", "/api/v1/compare?left=colour%3Dblue", 400);
    // Placement advice: every pool that ran a100 jobs, and the parameters refused by name.
    r.get(&c, "/api/v1/advice", "/api/v1/advice?gpus=8&gpu_class=a100&priority=normal&duration=12h", 200);
    r.get(&c, "/api/v1/advice", "/api/v1/advice?gpus=8&gpu_class=a100&priority=urgent&duration=2h&window=7d", 200);
    r.get(&c, "/api/v1/advice", "/api/v1/advice?gpu_class=a100&priority=normal&duration=12h", 400);
    r.get(&c, "/api/v1/advice", "/api/v1/advice?gpus=8&gpu_class=a100&priority=normal&duration=soon", 400);
    let (status, _) = r.call(&c, "GET", "/api/v1/compare.svg", "/api/v1/compare.svg?by=region", &[], "");
    assert_eq!(status, 200);

    // Meta and dashboard routes (open, no `[auth]`).
    for p in ["/metrics", "/healthz", "/readyz", "/", "/dashboard"] {
        let (status, _) = r.call(&c, "GET", p, p, &[], "");
        assert_eq!(status, 200, "{p}");
    }
    let (status, _) = r.call(&c, "GET", "/login", "/login", &[], "");
    assert_eq!(status, 303, "no [auth]: nothing to log in to");
    let (status, _) = r.call(&c, "POST", "/logout", "/logout", &[], "");
    assert_eq!(status, 303);
    // Without a config file there is nothing to reload.
    let (status, body) = r.call(&c, "POST", "/api/v1/admin/reload", "/api/v1/admin/reload", &[], "");
    assert_eq!(status, 409, "{body}");
    // Backups: none yet (404), a relative target refused (400), one started (202), its state until done (200), a
    // target that is not empty refused (400).
    let (status, body) = r.call(&c, "GET", "/api/v1/admin/backup", "/api/v1/admin/backup", &[], "");
    assert_eq!(status, 404, "{body}");
    let json = [("Content-Type", "application/json")];
    let (status, body) =
        r.call(&c, "POST", "/api/v1/admin/backup", "/api/v1/admin/backup", &json, r#"{"to": "relative/dir"}"#);
    assert_eq!(status, 400, "{body}");
    let to = dir.path().join("backup");
    let req = serde_json::json!({ "to": to }).to_string();
    let (status, body) = r.call(&c, "POST", "/api/v1/admin/backup", "/api/v1/admin/backup", &json, &req);
    assert_eq!(status, 202, "{body}");
    startline_tests::wait_until("the backup", std::time::Duration::from_secs(30), || {
        let (s, b) = startline_tests::http_get_text(c.http, "/api/v1/admin/backup");
        s == 200 && b.contains(r#""state":"done""#)
    });
    let (status, body) = r.call(&c, "GET", "/api/v1/admin/backup", "/api/v1/admin/backup", &[], "");
    assert_eq!((status, body.contains(r#""state":"done""#)), (200, true), "{body}");
    let (status, body) = r.call(&c, "POST", "/api/v1/admin/backup", "/api/v1/admin/backup", &json, &req);
    assert_eq!((status, body.contains("not empty")), (400, true), "{body}");
    // JSON ingest: stored (and the same request again: duplicates), a field refused, not JSON, a wrong type.
    let ev = r#"{"kind": "first_step", "job_id": "sagemaker/acct/openapi-1", "source": "training-process/h1",
                 "step": 1, "occurred_at": "2026-01-01T00:00:00Z"}"#;
    let (status, body) = r.call(&c, "POST", "/api/v1/events", "/api/v1/events", &json, ev);
    assert_eq!(status, 200, "{body}");
    let (status, body) = r.call(&c, "POST", "/api/v1/events", "/api/v1/events", &json, ev);
    assert_eq!((status, body.contains(r#""duplicates":1"#)), (200, true), "{body}");
    let bad = r#"{"events": [{"kind": "first_step", "job_id": "j", "source": "s", "step": -1}]}"#;
    let (status, body) = r.call(&c, "POST", "/api/v1/events", "/api/v1/events", &json, bad);
    assert_eq!((status, body.contains(r#""field":"events[0].step""#)), (400, true), "{body}");
    let (status, _) = r.call(&c, "POST", "/api/v1/events", "/api/v1/events", &json, "{not json");
    assert_eq!(status, 400);
    let (status, _) = r.call(&c, "POST", "/api/v1/events", "/api/v1/events", &[("Content-Type", "text/plain")], ev);
    assert_eq!(status, 415);
    // An unknown query parameter is refused with 400 (not documented, on purpose).
    r.get(&c, "/api/v1/overview", "/api/v1/overview?colour=blue", 400);
    if let Some(last) = r.examples.last_mut() {
        last["undocumented_param_expected"] = serde_json::Value::Bool(true);
    }

    // A collector with `[auth]`: refusals, a login, a reload.
    let reader = startline_collector::auth::generate_token().expect("token");
    let admin = startline_collector::auth::generate_token().expect("token");
    let fleet = startline_collector::auth::generate_token().expect("token");
    let hash = |t: &str| startline_collector::auth::TokenHash::of(t).to_config();
    let cfg = dir.path().join("collector.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[auth.identity]]\nname = \"reader\"\ntoken_hashes = [\"{}\"]\nscopes = [\"read\"]\n\
             [[auth.identity]]\nname = \"admin\"\ntoken_hashes = [\"{}\"]\nscopes = [\"admin\"]\n\
             [[auth.identity]]\nname = \"fleet\"\ntoken_hashes = [\"{}\"]\nscopes = [\"ingest\"]\n\
             [[cost.price]]\nmatch = \"pool_kind=managed\"\nper_gpu_hour = 4.0\n\
             [[cost.dedicated]]\npool = \"a100\"\ngpus = 64\nper_gpu_hour = 1.5\n",
            hash(&reader),
            hash(&admin),
            hash(&fleet)
        ),
    )
    .expect("config");
    let a = Collector::start(&dir.path().join("db-auth"), &["--config", &cfg.display().to_string()]);
    let bearer = |t: &str| format!("Bearer {t}");
    let (status, _) = r.call(&a, "GET", "/api/v1/slos", "/api/v1/slos", &[], "");
    assert_eq!(status, 401);
    let (status, _) = r.call(&a, "GET", "/api/v1/jobs", "/api/v1/jobs", &[("Authorization", "Bearer nope")], "");
    assert_eq!(status, 401);
    let (status, _) =
        r.call(&a, "POST", "/api/v1/admin/reload", "/api/v1/admin/reload", &[("Authorization", &bearer(&reader))], "");
    assert_eq!(status, 403);
    let (status, body) =
        r.call(&a, "POST", "/api/v1/admin/reload", "/api/v1/admin/reload", &[("Authorization", &bearer(&admin))], "");
    assert_eq!(status, 200, "{body}");
    let (status, _) = r.call(&a, "GET", "/login", "/login", &[], "");
    assert_eq!(status, 200);
    let ev = r#"{"kind": "first_step", "job_id": "vertex/p/l/1", "source": "training-process/h1", "step": 1}"#;
    let (status, _) =
        r.call(&a, "POST", "/api/v1/events", "/api/v1/events", &[("Content-Type", "application/json")], ev);
    assert_eq!(status, 401);
    let as_reader = [("Content-Type", "application/json"), ("Authorization", &bearer(&reader))];
    let (status, _) = r.call(&a, "POST", "/api/v1/events", "/api/v1/events", &as_reader, ev);
    assert_eq!(status, 403, "a read identity may not publish");
    // Priced pools (this collector has [cost]; fed a little history first so every model shows up).
    let sim = Command::new(binary("startline-agent"))
        .args([
            "--collector",
            &a.endpoint(),
            "--token",
            &fleet,
            "simulate",
            "--history",
            "6h",
            "--seed",
            "3",
            "--jobs-per-hour",
            "20",
        ])
        .output()
        .expect("simulator");
    assert!(sim.status.success(), "{}", String::from_utf8_lossy(&sim.stderr));
    let (status, body) = r.call(&a, "GET", "/api/v1/cost", "/api/v1/cost", &[("Authorization", &bearer(&reader))], "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"amortised\"") && body.contains("\"per_use\""), "{body}");
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    let (status, _) = r.call(&a, "POST", "/login", "/login", &form, &format!("token={reader}"));
    assert_eq!(status, 303);
    let (status, body) = r.call(&a, "POST", "/login", "/login", &form, "token=wrong");
    assert_eq!(status, 401);
    assert!(body.contains("<form"), "the login form answers a wrong token with the form again: {body}");
    let (status, _) = r.call(&a, "POST", "/login", "/login", &form, "token=");
    assert_eq!(status, 400);

    let out = dir.path().join("openapi.json");
    std::fs::write(&out, serde_json::to_vec(&doc).expect("json")).expect("write doc");
    let ex = dir.path().join("examples.json");
    std::fs::write(&ex, serde_json::to_vec(&r.examples).expect("json")).expect("write examples");
    let v = Command::new("python3")
        .arg(workspace_root().join("tests/python/validate_openapi.py"))
        .arg(&out)
        .arg(&ex)
        .output()
        .expect("python3 (scripts/test.sh installs openapi-spec-validator)");
    let report = format!("{}{}", String::from_utf8_lossy(&v.stdout), String::from_utf8_lossy(&v.stderr));
    assert!(v.status.success(), "{report}");
    assert!(report.contains(" 0 failures"), "{report}");
    eprintln!("{report}");
}
