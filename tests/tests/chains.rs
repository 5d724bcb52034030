//! Chains over real gRPC: jobs sharing a `chain_id` (train -> evaluate -> merge (retried) -> quantize) sent to a
//! collector with `[chains] final_stages = ["quantize"]`, and the API's time to artifact, gaps, stages, critical
//! path and per-kind percentiles compared with figures worked out by hand from the events sent.

use startline_agent::uplink::{Publisher, UplinkSettings};
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_tests::{event, Collector};

const MIN: i64 = 60_000;

fn submitted(chain: &str, stage: &str) -> Kind {
    Kind::Submitted(pb::Submitted {
        pool_kind: pb::PoolKind::Dedicated as i32,
        provider: "slurm".into(),
        pool: "a100".into(),
        priority: pb::PriorityClass::Normal as i32,
        gpu_class: "a100".into(),
        gpu_count: 8,
        node_count: 1,
        region: "dc".into(),
        chain_id: chain.into(),
        chain_stage: stage.into(),
        ..Default::default()
    })
}

/// One member: submitted at `sub`, first step at `first`, done (`outcome`) at `done`, minutes after `t0`.
fn member(
    t0: i64,
    chain: &str,
    job: &str,
    stage: &str,
    (sub, first, done): (i64, i64, i64),
    outcome: pb::Outcome,
) -> Vec<pb::LifecycleEvent> {
    vec![
        event(job, "s", t0 + sub * MIN, submitted(chain, stage)),
        event(job, "f", t0 + first * MIN, Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })),
        event(job, "d", t0 + done * MIN, Kind::Done(pb::Done { outcome: outcome as i32, ..Default::default() })),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chains_account_for_time_to_artifact_gaps_and_the_critical_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[chains]\nfinal_stages = [\"quantize\"]\n").expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf8")]);
    let t0 = startline_tests::ago(3 * 86_400);
    let ok = pb::Outcome::Succeeded;
    let mut evs = Vec::new();
    // Chain "release/1": train 0-100 (first step 20), idle 10, evaluate 110-130 (115), merge fails 130-140 (132),
    // idle 10, merge again 150-170 (160), idle 5, quantize 175-200 (180).
    let r1 = "release/1";
    evs.extend(member(t0, r1, "r1/train", "train", (0, 20, 100), ok));
    evs.extend(member(t0, r1, "r1/eval", "evaluate", (110, 115, 130), ok));
    evs.extend(member(t0, r1, "r1/merge-a", "merge", (130, 132, 140), pb::Outcome::Failed));
    evs.extend(member(t0, r1, "r1/merge-b", "merge", (150, 160, 170), ok));
    evs.extend(member(t0, r1, "r1/quantize", "quantize", (175, 180, 200), ok));
    // Two more complete chains of the same kind taking 300 and 400 minutes, and one still open (no quantize).
    for (id, len) in [("release/2", 300), ("release/3", 400)] {
        let base = t0 + 60 * MIN;
        evs.extend(member(base, id, &format!("{id}/t"), "train", (0, 1, len / 2), ok));
        evs.extend(member(base, id, &format!("{id}/e"), "evaluate", (len / 2, len / 2 + 1, len * 3 / 4), ok));
        evs.extend(member(base, id, &format!("{id}/m"), "merge", (len * 3 / 4, len * 3 / 4 + 1, len - 20), ok));
        evs.extend(member(base, id, &format!("{id}/q"), "quantize", (len - 20, len - 19, len), ok));
    }
    evs.extend(member(t0, "release/4", "r4/train", "train", (0, 5, 50), ok));
    // The stream interleaves chains; order does not matter.
    evs.reverse();
    let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");
    up.send(evs).await.expect("send");
    up.flush().await.expect("flush");

    let (status, d) = c.get("/api/v1/chains/release/1");
    assert_eq!(status, 200, "{d}");
    assert_eq!(d["complete"], true);
    assert_eq!(d["kind"], "train>evaluate>merge>quantize");
    assert_eq!(d["span_seconds"].as_f64(), Some(200.0 * 60.0));
    assert_eq!(d["gap_seconds"].as_f64(), Some(25.0 * 60.0));
    assert_eq!(d["jobs"], 5);
    let gaps: Vec<f64> =
        d["gaps"].as_array().expect("gaps").iter().map(|g| g["seconds"].as_f64().unwrap_or(0.0)).collect();
    assert_eq!(gaps, [600.0, 600.0, 300.0]);
    let path: Vec<(String, f64, f64, f64)> = d["critical_path"]
        .as_array()
        .expect("path")
        .iter()
        .map(|s| {
            let f = |k: &str| s[k].as_f64().unwrap_or(-1.0) / 60.0;
            (
                s["job_id"].as_str().unwrap_or("").to_string(),
                f("gap_before_seconds"),
                f("wait_seconds"),
                f("run_seconds"),
            )
        })
        .collect();
    let want: Vec<(String, f64, f64, f64)> = [
        ("r1/train", 0.0, 20.0, 80.0),
        ("r1/eval", 10.0, 5.0, 15.0),
        ("r1/merge-a", 0.0, 2.0, 8.0),
        ("r1/merge-b", 10.0, 10.0, 10.0),
        ("r1/quantize", 5.0, 5.0, 20.0),
    ]
    .iter()
    .map(|(j, a, b, c)| (j.to_string(), *a, *b, *c))
    .collect();
    assert_eq!(path, want);
    let merge = d["stages"].as_array().and_then(|s| s.iter().find(|x| x["stage"] == "merge")).expect("merge stage");
    assert_eq!((merge["jobs"].as_u64(), merge["run_seconds"].as_f64()), (Some(2), Some(18.0 * 60.0)));

    // The listing: newest first, the open one included; percentiles of the three complete ones (200, 300, 400 min:
    // nearest rank p50 = 300, p90 = p99 = max = 400).
    let (_, l) = c.get("/api/v1/chains");
    assert_eq!(l["total"], 4);
    let kind = l["by_kind"]
        .as_array()
        .and_then(|k| k.iter().find(|x| x["kind"] == "train>evaluate>merge>quantize"))
        .expect("kind");
    assert_eq!(
        (kind["complete"].as_u64(), kind["p50"].as_f64(), kind["p99"].as_f64()),
        (Some(3), Some(18_000.0), Some(24_000.0))
    );
    let open = l["by_kind"].as_array().and_then(|k| k.iter().find(|x| x["kind"] == "train")).expect("open kind");
    assert_eq!((open["open"].as_u64(), open["complete"].as_u64(), open["p50"].is_null()), (Some(1), Some(0), true));
    let (_, only_open) = c.get("/api/v1/chains?state=open");
    let ids: Vec<&str> =
        only_open["chains"].as_array().expect("chains").iter().filter_map(|x| x["chain_id"].as_str()).collect();
    assert_eq!(ids, ["release/4"]);
    let (status, e) = c.get("/api/v1/chains/nope");
    assert_eq!(status, 404, "{e}");
    let (status, _) = c.get("/api/v1/chains?state=late");
    assert_eq!(status, 400);
}
