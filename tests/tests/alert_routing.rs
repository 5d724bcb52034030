//! Startline's alerts in a real Alertmanager (Debian's `prometheus-alertmanager`) configured with the shipped
//! example `deploy/alertmanager/alertmanager.yml` (its receivers pointed at a local receiver, its waits shortened):
//! a burn-rate page inhibits the per-job pages of the same SLO; every alert carries the static labels, the team,
//! runbook and dashboard links under `alerts.external_url`; Alertmanager's own fingerprints equal Startline's;
//! the collector's webhook speaks Alertmanager's webhook format (version 4).

use startline_agent::uplink::{Publisher, UplinkSettings};
use startline_collector::alert::notify::fingerprint;
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_tests::{event, http_get, start_alertmanager_with, wait_until, workspace_root, Collector, HookServer};
use std::collections::BTreeMap;
use std::time::Duration;

const EXTERNAL: &str = "https://startline.example.com";

fn labels_of(a: &serde_json::Value) -> BTreeMap<String, String> {
    a["labels"]
        .as_object()
        .map(|o| o.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burn_rate_page_inhibits_job_pages_in_a_real_alertmanager_with_the_shipped_example() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hook = HookServer::start();
    let example =
        std::fs::read_to_string(workspace_root().join("deploy/alertmanager/alertmanager.yml")).expect("example");
    let am_config = example
        .replace("http://oncall-bridge.example.internal:9000/alerts", &format!("http://{}/oncall", hook.addr))
        .replace("http://ticket-bridge.example.internal:9000/alerts", &format!("http://{}/tickets", hook.addr))
        .replace("group_wait: 30s", "group_wait: 2s")
        .replace("group_wait: 10s", "group_wait: 2s")
        .replace("group_interval: 5m", "group_interval: 1s");
    let (_am, am_url) = start_alertmanager_with(dir.path(), &am_config);
    let cfg = dir.path().join("collector.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"[[slo]]
name = "urgent-start"
threshold = "10m"
objective = 99
window = "1d"
selector = {{ priority = ["urgent"] }}

[alerts]
alertmanager = ["{am_url}"]
webhook = ["http://{}/direct"]
evaluation_interval = "1s"
resend_interval = "2s"
external_url = "{EXTERNAL}/"
labels = {{ cluster = "eu-1" }}
runbook_urls = {{ StartlineJobStartBreach = "https://wiki.example.com/startline#breach", StartlineSLOBurnRate = "https://wiki.example.com/startline#burn" }}
"#,
            hook.addr
        ),
    )
    .expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf-8")]);
    let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");

    // Six urgent jobs submitted 20 minutes ago, still waiting: six job pages, and every decided job is bad, so
    // the SLO burns far past the paging rates.
    let submit = startline_proto::time::now_ms() - 20 * 60_000;
    let mut events = Vec::new();
    for i in 0..6 {
        let job = format!("slurm/gpu/{i}");
        let mut s = startline_tests::submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Urgent, 8);
        if let Kind::Submitted(sub) = &mut s {
            sub.team = "nlp".into();
        }
        events.push(event(&job, "s", submit + i, s));
        events.push(event(
            &job,
            "q",
            submit + 100 + i,
            Kind::Queued(pb::Queued {
                reason: pb::WaitReason::Capacity as i32,
                raw_reason: "Resources".into(),
                ..Default::default()
            }),
        ));
    }
    up.send(events).await.expect("send");
    up.flush().await.expect("flush");

    // Alertmanager holds the burn-rate page active and the six job pages suppressed by it.
    let am: std::net::SocketAddr = am_url.trim_start_matches("http://").parse().expect("am addr");
    let mut alerts = Vec::new();
    let h = tokio::task::spawn_blocking(move || {
        wait_until("the burn page active and the job pages inhibited", Duration::from_secs(60), || {
            let (_, v) = http_get(am, "/api/v2/alerts");
            alerts = v.as_array().cloned().unwrap_or_default();
            let burn = alerts.iter().any(|a| {
                a["labels"]["alertname"] == "StartlineSLOBurnRate"
                    && a["labels"]["severity"] == "page"
                    && a["status"]["state"] == "active"
            });
            let inhibited = alerts
                .iter()
                .filter(|a| {
                    a["labels"]["alertname"] == "StartlineJobStartBreach" && a["status"]["state"] == "suppressed"
                })
                .count();
            burn && inhibited == 6
        });
        alerts
    });
    let alerts = h.await.expect("wait");
    let burn = alerts
        .iter()
        .find(|a| a["labels"]["alertname"] == "StartlineSLOBurnRate" && a["labels"]["severity"] == "page")
        .expect("burn page");
    let burn_fp = burn["fingerprint"].as_str().expect("fingerprint").to_string();
    for a in &alerts {
        let labels = labels_of(a);
        // Alertmanager's fingerprint of the labels Startline sent is Startline's own.
        assert_eq!(a["fingerprint"].as_str(), Some(fingerprint(&labels).as_str()), "{a}");
        assert_eq!(labels.get("cluster").map(String::as_str), Some("eu-1"), "static label: {a}");
        if labels["alertname"] == "StartlineJobStartBreach" {
            assert_eq!(a["status"]["inhibitedBy"], serde_json::json!([burn_fp]), "{a}");
            assert_eq!(labels.get("team").map(String::as_str), Some("nlp"));
            let job = &labels["job_id"];
            assert_eq!(a["annotations"]["dashboard_url"], format!("{EXTERNAL}/#job/{job}"));
            assert_eq!(a["generatorURL"], format!("{EXTERNAL}/#job/{job}"), "the page links to the job's timeline");
            assert_eq!(a["annotations"]["runbook_url"], "https://wiki.example.com/startline#breach");
        } else {
            assert_eq!(a["annotations"]["dashboard_url"], format!("{EXTERNAL}/#slos"));
            assert_eq!(a["annotations"]["runbook_url"], "https://wiki.example.com/startline#burn");
        }
    }
    // The on-call receiver got the burn-rate page and none of the inhibited job pages.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let oncall: Vec<serde_json::Value> =
        hook.received().into_iter().filter(|(p, _)| p == "/oncall").map(|(_, v)| v).collect();
    assert!(
        oncall.iter().any(|v| v["commonLabels"]["alertname"] == "StartlineSLOBurnRate"),
        "burn page delivered: {oncall:?}"
    );
    assert!(
        oncall
            .iter()
            .flat_map(|v| v["alerts"].as_array().cloned().unwrap_or_default())
            .all(|a| a["labels"]["alertname"] != "StartlineJobStartBreach"),
        "no inhibited job page delivered: {oncall:?}"
    );

    // The collector's own webhook: Alertmanager's webhook format, version 4, the same fingerprints.
    let direct = hook
        .wait_for(Duration::from_secs(10), |p, v| {
            p == "/direct"
                && v["alerts"].as_array().is_some_and(|a| a.iter().any(|x| x["labels"]["job_id"] == "slurm/gpu/0"))
        })
        .expect("direct webhook");
    assert_eq!(direct["version"], "4");
    assert_eq!(direct["externalURL"], EXTERNAL);
    assert_eq!(direct["receiver"], "startline");
    assert_eq!(direct["commonLabels"]["cluster"], "eu-1");
    for a in direct["alerts"].as_array().expect("alerts") {
        let am_same = alerts.iter().find(|x| x["labels"] == a["labels"]).expect("the same alert in Alertmanager");
        assert_eq!(a["fingerprint"], am_same["fingerprint"]);
        if a["status"] == "firing" {
            assert_eq!(a["endsAt"], "0001-01-01T00:00:00Z");
        }
    }
}
