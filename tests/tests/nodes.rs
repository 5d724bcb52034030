//! Suspect nodes end to end: jobs placed on 21 nodes of one pool over real gRPC, one node losing most of its jobs;
//! `/api/v1/nodes` figures and the binomial verdict compared with values computed here by direct summation; the
//! `StartlineNodeSuspect` alert and the `startline_nodes_suspect` gauge; and a real node agent reporting GPU health
//! from a fake `nvidia-smi` (a shell script: there is no GPU here) whose correctable ECC count then climbs.

use startline_agent::uplink::{Publisher, UplinkSettings};
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_tests::{event, http_get_text, wait_until, Collector, NodeAgent};
use std::time::Duration;

const MIN: i64 = 60_000;

fn job(t: i64, id: &str, node: &str, ok: bool) -> Vec<pb::LifecycleEvent> {
    let mut evs = vec![
        event(id, "s", t, startline_tests::submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Normal, 8)),
        event(id, "a", t + MIN, Kind::NodeAssigned(pb::NodeAssigned { nodes: vec![node.into()], gpu_ids: vec![] })),
        event(id, "f", t + 3 * MIN, Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })),
    ];
    if !ok {
        evs.push(event(
            id,
            "l",
            t + 20 * MIN,
            Kind::NodeLost(pb::NodeLost { node: node.into(), message: String::new() }),
        ));
    }
    let outcome = if ok { pb::Outcome::Succeeded } else { pb::Outcome::Failed };
    evs.push(event(id, "d", t + 30 * MIN, Kind::Done(pb::Done { outcome: outcome as i32, ..Default::default() })));
    evs
}

/// `P[Binom(m, p) >= k]` by direct summation.
fn tail(m: u64, k: u64, p: f64) -> f64 {
    let choose = |n: u64, r: u64| (0..r).fold(1.0f64, |c, i| c * (n - i) as f64 / (i + 1) as f64);
    (k..=m).map(|j| choose(m, j) * p.powi(j as i32) * (1.0 - p).powi((m - j) as i32)).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_loses_jobs_and_a_node_with_climbing_ecc_errors_are_flagged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        "[alerts]\nevaluation_interval = \"1s\"\n[nodes]\nevaluation_interval = \"1s\"\necc_corrected_threshold = 100\n",
    )
    .expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf8")]);
    let t0 = startline_tests::ago(2 * 86_400);
    let mut evs = Vec::new();
    // 20 healthy nodes, 10 jobs each; one job on ok-00 fails (not a loss). The bad node loses 6 of its 10.
    let mut n = 0;
    for i in 0..20 {
        for j in 0..10 {
            n += 1;
            let mut e = job(t0 + n * MIN, &format!("j{n}"), &format!("ok-{i:02}"), true);
            if i == 0 && j == 0 {
                let last = e.len() - 1;
                e[last].kind = Some(Kind::Done(pb::Done { outcome: pb::Outcome::Failed as i32, ..Default::default() }));
            }
            evs.extend(e);
        }
    }
    for j in 0..10 {
        n += 1;
        evs.extend(job(t0 + n * MIN, &format!("bad{j}"), "bad-node", j >= 6));
    }
    let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");
    up.send(evs).await.expect("send");
    up.flush().await.expect("flush");

    let (status, d) = c.get("/api/v1/nodes");
    assert_eq!(status, 200, "{d}");
    assert_eq!(d["total"], 21);
    let top = &d["nodes"][0];
    assert_eq!(top["node"], "bad-node");
    assert_eq!(top["suspect"], true);
    assert_eq!(top["reasons"], serde_json::json!(["failure_rate"]));
    assert_eq!((top["placements"].as_u64(), top["lost"].as_u64(), top["bad"].as_u64()), (Some(10), Some(6), Some(6)));
    assert_eq!((top["succeeded"].as_u64(), top["started"].as_u64()), (Some(4), Some(10)));
    // The rest of the pool: 1 bad of 200, smoothed (1 + 1) / (200 + 2).
    let p0 = 2.0 / 202.0;
    assert!((top["pool_rate"].as_f64().expect("rate") - p0).abs() < 1e-12, "{top}");
    let want = tail(10, 6, p0);
    let got = top["p_value"].as_f64().expect("p");
    assert!((got - want).abs() <= 1e-9 * want, "p-value {got} vs {want}");
    assert!((top["threshold"].as_f64().expect("t") - 0.01 / 21.0).abs() < 1e-15);
    assert_eq!(top["startup_p50_seconds"].as_f64(), Some(120.0));
    assert_eq!(d["pools"][0]["placements"], 210);
    assert_eq!(d["pools"][0]["bad"], 7);
    assert_eq!(d["pools"][0]["suspects"], 1);
    let ok00 = d["nodes"].as_array().expect("nodes").iter().find(|r| r["node"] == "ok-00").expect("ok-00");
    assert_eq!(
        (ok00["failed"].as_u64(), ok00["suspect"].as_bool()),
        (Some(1), Some(false)),
        "one failure is not enough"
    );
    let (_, only) = c.get("/api/v1/nodes?suspect=true");
    assert_eq!(only["total"], 1);
    let (status, detail) = c.get("/api/v1/nodes/bad-node");
    assert_eq!(status, 200, "{detail}");
    let jobs: Vec<&str> =
        detail["incidents"].as_array().expect("incidents").iter().filter_map(|i| i["job_id"].as_str()).collect();
    assert_eq!(jobs, vec!["bad5", "bad4", "bad3", "bad2", "bad1", "bad0"], "newest first");
    assert_eq!(c.get("/api/v1/nodes/nowhere").0, 404);
    assert_eq!(c.get("/api/v1/nodes?suspect=maybe").0, 400);

    // The alert and the gauge (the alert loop judges nodes every second here).
    wait_until("StartlineNodeSuspect fires", Duration::from_secs(20), || {
        let (_, a) = c.get("/api/v1/alerts");
        a.to_string().contains("StartlineNodeSuspect") && a.to_string().contains("bad-node")
    });
    let (_, metrics) = http_get_text(c.http, "/metrics");
    let gauge = metrics.lines().find(|l| l.starts_with("startline_nodes_suspect{pool=\"pool-a\""));
    assert!(gauge.is_some_and(|l| l.ends_with(" 1")), "{metrics}");

    // GPU health from a node agent running a fake nvidia-smi whose counters come from a file.
    let counters = dir.path().join("ecc");
    std::fs::write(&counters, "3 0").expect("counters");
    let smi = dir.path().join("nvidia-smi");
    std::fs::write(
        &smi,
        format!(
            "#!/bin/sh\n# Fake nvidia-smi: answers --query-gpu with two GPUs.\nread c u < {}\necho \"0, GPU-aaaa, $c, $u, 41\"\necho \"1, GPU-bbbb, [N/A], [N/A], 39\"\n",
            counters.display()
        ),
    )
    .expect("script");
    std::fs::set_permissions(&smi, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let _agent = NodeAgent::start_with(
        &[&c.endpoint()],
        &dir.path().join("spool"),
        &["--gpu-health-interval", "300ms", "--nvidia-smi", smi.to_str().expect("utf8"), "--node-name", "gpu-7"],
    );
    wait_until("the first health reading", Duration::from_secs(20), || {
        c.get("/api/v1/nodes/gpu-7").1["latest_health"]["ecc_corrected_total"] == 3
    });
    let (_, d) = c.get("/api/v1/nodes/gpu-7");
    assert_eq!(d["latest_health"]["gpus"], 2);
    assert_eq!(d["rows"][0]["suspect"], false, "{d}");
    std::fs::write(&counters, "503 0").expect("counters");
    wait_until("the climb is judged", Duration::from_secs(20), || {
        let (_, d) = c.get("/api/v1/nodes?suspect=true");
        d["nodes"].as_array().is_some_and(|n| n.iter().any(|r| r["node"] == "gpu-7"))
    });
    let (_, d) = c.get("/api/v1/nodes/gpu-7");
    assert_eq!(d["rows"][0]["health"]["ecc_corrected"], 500, "{d}");
    assert_eq!(d["rows"][0]["reasons"], serde_json::json!(["ecc_corrected"]));

    // A bad reading is refused with the field named, and nothing of its batch is kept.
    let mut client =
        pb::node_health_service_client::NodeHealthServiceClient::connect(c.endpoint()).await.expect("connect");
    let now = startline_proto::time::ms_to_timestamp(startline_proto::time::now_ms());
    let good = pb::NodeHealth { node: "gpu-8".into(), observed_at: Some(now), ..Default::default() };
    let bad = pb::NodeHealth { node: String::new(), observed_at: Some(now), ..Default::default() };
    let err = client.report(pb::ReportHealthRequest { reports: vec![good, bad] }).await.expect_err("refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().starts_with("reports[1].node:"), "{}", err.message());
    assert_eq!(c.get("/api/v1/nodes/gpu-8").0, 404, "the good reading of a refused batch is not kept");
}

/// A token restricted to one cluster cannot mark another cluster's node suspect: health readings are held to the
/// identity's `node_prefixes` and `sources` (the whole request refused with `PERMISSION_DENIED` naming the reading's
/// field, nothing stored), and events naming a node outside its prefixes are rejected one by one naming the field.
/// Nor can it slip past a prefix with `..` segments or invisible characters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readings_and_event_nodes_are_held_to_the_identitys_node_prefixes_and_sources() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token = "stl_node_scope_test_token_a";
    let reader = "stl_node_scope_test_token_r";
    let hash = |t: &str| startline_collector::auth::TokenHash::of(t).to_config();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[auth.identity]]\nname = \"cluster-a\"\ntoken_hashes = [\"{}\"]\nscopes = [\"ingest\"]\n\
             job_id_prefixes = [\"a/\"]\nsources = [\"agent-a\"]\nnode_prefixes = [\"a-\"]\n\
             [[auth.identity]]\nname = \"reader\"\ntoken_hashes = [\"{}\"]\nscopes = [\"read\"]\n",
            hash(token),
            hash(reader)
        ),
    )
    .expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf8")]);
    let authed = |m: &mut tonic::metadata::MetadataMap| {
        m.insert("authorization", format!("Bearer {token}").parse().expect("metadata"));
    };
    let now = startline_proto::time::ms_to_timestamp(startline_proto::time::now_ms());
    let reading = |node: &str, source: &str| pb::NodeHealth {
        node: node.into(),
        observed_at: Some(now),
        source: source.into(),
        gpus: vec![pb::GpuHealth { ecc_corrected: Some(50_000), ..Default::default() }],
    };
    let mut client =
        pb::node_health_service_client::NodeHealthServiceClient::connect(c.endpoint()).await.expect("connect");
    let report = |reports: Vec<pb::NodeHealth>| {
        let mut r = tonic::Request::new(pb::ReportHealthRequest { reports });
        authed(r.metadata_mut());
        r
    };
    // Another cluster's node, or a source the identity may not use: refused whole, naming the reading's field.
    for (reports, field) in [
        (vec![reading("a-gpu-1", "agent-a"), reading("b-gpu-1", "agent-a")], "reports[1].node"),
        (vec![reading("a-gpu-1", "agent-b")], "reports[0].source"),
        (vec![reading("a-gpu-1", "")], "reports[0].source"),
    ] {
        let err = client.report(report(reports)).await.expect_err("not permitted");
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
        assert!(err.message().starts_with(&format!("{field}:")), "{}", err.message());
        assert!(err.message().contains("cluster-a"), "{}", err.message());
    }
    let bearer = format!("Bearer {reader}");
    let nodes = |path: &str| {
        let (status, _, body) = startline_tests::http_request(c.http, "GET", path, &[("authorization", &bearer)], "");
        (status, body)
    };
    assert_eq!(nodes("/api/v1/nodes/b-gpu-1").0, 404, "nothing of a refused request is stored");
    assert_eq!(nodes("/api/v1/nodes/a-gpu-1").0, 404, "nothing of a refused request is stored");
    // Its own node and source: stored.
    let ok = client.report(report(vec![reading("a-gpu-1", "agent-a")])).await.expect("permitted").into_inner();
    assert_eq!(ok.accepted, 1);
    assert_eq!(nodes("/api/v1/nodes/a-gpu-1").0, 200);

    // Events: a job of its own placed on another cluster's node is rejected naming the node field.
    let t = startline_proto::time::now_ms() - 3_600_000;
    let mut evs = job(t, "a/1", "b-gpu-2", false);
    evs.extend(job(t, "a/2", "a-gpu-2", true));
    for e in &mut evs {
        e.source = "agent-a".into();
    }
    let mut r = tonic::Request::new(pb::PublishRequest { batch_seq: 1, events: evs });
    authed(r.metadata_mut());
    let mut ingest =
        pb::ingest_service_client::IngestServiceClient::connect(c.endpoint()).await.expect("connect ingest");
    let ack = ingest.publish_batch(r).await.expect("acked").into_inner();
    let refused: Vec<(u32, &str)> = ack.rejections.iter().map(|r| (r.index, r.field.as_str())).collect();
    assert_eq!(refused, vec![(1, "node_assigned.nodes[0]"), (3, "node_lost.node")], "{ack:?}");
    assert_eq!(ack.accepted, 3 + 4, "{ack:?}");

    // Ids are checked before prefixes, on their one spelling: `a/../b/1` does not pass the prefix `a/`, nor does
    // a node `a-x/../b-1` pass `a-`; invisible characters (a Hangul filler, a Braille blank, a variation
    // selector, a no-break space) are refused in every id.
    let sub = |job: &str, id: &str, source: &str| {
        let mut e =
            event(job, id, t, startline_tests::submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Normal, 8));
        e.source = source.into();
        e
    };
    let evs = vec![
        sub("a/../b/1", "s", "agent-a"),
        sub("a/./1", "s", "agent-a"),
        sub("a//1", "s", "agent-a"),
        sub("a/x\u{3164}", "s", "agent-a"),
        sub("a/3", "s\u{2800}", "agent-a"),
        sub("a/4", "s", "agent-a\u{FE0F}"),
        sub("a/5\u{00A0}", "s", "agent-a"),
        sub("a/6", "s", "agent-a"),
    ];
    let mut r = tonic::Request::new(pb::PublishRequest { batch_seq: 2, events: evs });
    authed(r.metadata_mut());
    let ack = ingest.publish_batch(r).await.expect("acked").into_inner();
    let refused: Vec<(u32, &str)> = ack.rejections.iter().map(|r| (r.index, r.field.as_str())).collect();
    assert_eq!(
        refused,
        vec![(0, "job_id"), (1, "job_id"), (2, "job_id"), (3, "job_id"), (4, "event_id"), (5, "source"), (6, "job_id")],
        "{ack:?}"
    );
    assert!(ack.rejections[0].reason.contains("\"..\" path segment"), "{ack:?}");
    assert!(ack.rejections[3].reason.contains("U+3164"), "{ack:?}");
    assert_eq!(ack.accepted, 1, "{ack:?}");
    let err = client.report(report(vec![reading("a-x/../b-1", "agent-a")])).await.expect_err("unnormalized node");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("reports[0].node:"), "{}", err.message());
    let err = client.report(report(vec![reading("a-gpu\u{2800}", "agent-a")])).await.expect_err("invisible node");
    assert!(err.message().contains("U+2800"), "{}", err.message());
}
