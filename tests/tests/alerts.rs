//! Alerting end to end: a real Alertmanager (Debian `prometheus-alertmanager`, started here on a free port,
//! installed by scripts/test.sh) routes Startline's per-job page to a webhook receiver; the receiver gets the
//! firing notification while the urgent job waits and the resolved one when it starts. The collector's own
//! webhook notifier and the SLO/alert API are checked on the same run. A second test crosses the deadline while
//! the collector is down (kill -9) and checks the page comes once after restart.

use startline_agent::uplink::{Publisher, UplinkSettings};
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_tests::{event, submitted, ChildGuard, Collector, HookServer};

use std::time::Duration;

fn start_alertmanager(dir: &std::path::Path, hook: &HookServer) -> (ChildGuard, String) {
    startline_tests::start_alertmanager(dir, hook)
}

fn collector_config(dir: &std::path::Path, am: Option<&str>, hook: &HookServer) -> std::path::PathBuf {
    let p = dir.join("collector.toml");
    let am_line = am.map(|u| format!("alertmanager = [\"{u}\"]\n")).unwrap_or_default();
    std::fs::write(
        &p,
        format!(
            r#"[[slo]]
name = "urgent-start"
threshold = "3s"
objective = 99
window = "1d"
[slo.selector]
priority = ["urgent"]

[alerts]
{am_line}webhook = ["http://{}/direct"]
evaluation_interval = "1s"
resend_interval = "2s"
"#,
            hook.addr
        ),
    )
    .expect("write collector config");
    p
}

fn job_label_is(v: &serde_json::Value, job: &str, status: &str) -> bool {
    v["status"] == status
        && v["alerts"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x["labels"]["job_id"] == job && x["status"] == status))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urgent_breach_pages_through_a_real_alertmanager_and_resolves_when_the_job_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hook = HookServer::start();
    let (_am, am_url) = start_alertmanager(dir.path(), &hook);
    let cfg = collector_config(dir.path(), Some(&am_url), &hook);
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf8")]);
    let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");

    let submit = startline_proto::time::now_ms();
    let job = "slurm/gpu/4242";
    up.send(vec![
        event(job, "s", submit, submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Urgent, 8)),
        event(
            job,
            "q",
            submit + 10,
            Kind::Queued(pb::Queued {
                reason: pb::WaitReason::Capacity as i32,
                raw_reason: "Resources".into(),
                message: String::new(),
                estimated_start: None,
                queue_position: None,
            }),
        ),
    ])
    .await
    .expect("send");
    up.flush().await.expect("flush");

    // Firing, while the job still waits: through Alertmanager, and directly.
    let h = hook.clone();
    let am_firing = tokio::task::spawn_blocking(move || {
        h.wait_for(Duration::from_secs(30), |p, v| p == "/am" && job_label_is(v, job, "firing"))
    })
    .await
    .expect("wait")
    .expect("alertmanager delivered the firing page");
    let alert = &am_firing["alerts"][0];
    assert_eq!(alert["labels"]["alertname"], "StartlineJobStartBreach");
    assert_eq!(alert["labels"]["priority"], "urgent");
    assert_eq!(alert["labels"]["pool"], "pool-a");
    assert_eq!(alert["annotations"]["waiting_reason"], "queued:capacity");
    assert_eq!(alert["annotations"]["raw_reason"], "Resources");
    let direct = hook
        .wait_for(Duration::from_secs(5), |p, v| p == "/direct" && job_label_is(v, job, "firing"))
        .expect("direct webhook");
    assert_eq!(direct["version"], "4", "Alertmanager's webhook format");

    // The API shows the firing page and the SLO's breach.
    let (_, alerts) = c.get("/api/v1/alerts?state=firing");
    assert!(alerts["alerts"].as_array().is_some_and(|a| a.iter().any(|x| x["labels"]["job_id"] == job)), "{alerts}");
    let (_, slo) = c.get("/api/v1/slos/urgent-start");
    assert_eq!(slo["status"]["bad"], 1);
    assert_eq!(slo["status"]["breached_waiting"], 1);

    // The job starts: resolved, through Alertmanager.
    up.send(vec![event(
        job,
        "f",
        startline_proto::time::now_ms(),
        Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() }),
    )])
    .await
    .expect("send");
    up.flush().await.expect("flush");
    let h = hook.clone();
    let resolved = tokio::task::spawn_blocking(move || {
        h.wait_for(Duration::from_secs(30), |p, v| p == "/am" && job_label_is(v, job, "resolved"))
    })
    .await
    .expect("wait");
    assert!(resolved.is_some(), "alertmanager delivered the resolved notification; got {:#?}", hook.received());
    let (_, alerts) = c.get("/api/v1/alerts?state=resolved");
    assert!(alerts["alerts"].as_array().is_some_and(|a| a.iter().any(|x| x["labels"]["job_id"] == job)));
    let (_, slo) = c.get("/api/v1/slos/urgent-start");
    assert_eq!(slo["status"]["breached_waiting"], 0);
    assert_eq!(slo["status"]["bad"], 1, "a job that started late stays a miss");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_crossed_while_the_collector_was_down_pages_once_after_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hook = HookServer::start();
    let cfg = collector_config(dir.path(), None, &hook);
    let args = ["--config", cfg.to_str().expect("utf8")];
    let db = dir.path().join("db");
    let job = "vertex/a3/77";
    {
        let c = Collector::start(&db, &args);
        let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");
        up.send(vec![event(
            job,
            "s",
            startline_proto::time::now_ms(),
            submitted(pb::PoolKind::Managed, pb::PriorityClass::Urgent, 8),
        )])
        .await
        .expect("send");
        up.flush().await.expect("flush");
        // Crash before the 3 s deadline.
        c.signal_and_wait("KILL");
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(hook.received().is_empty(), "nothing was sent before the crash");
    let c = Collector::start(&db, &args);
    let h2 = hook.clone();
    let fired = tokio::task::spawn_blocking(move || {
        h2.wait_for(Duration::from_secs(20), |_, v| job_label_is(v, job, "firing"))
    })
    .await
    .expect("wait");
    assert!(fired.is_some(), "the crossing missed while down is paged after restart");
    c.signal_and_wait("TERM");

    // Another restart while the job still waits: the same alert, never a new one.
    let c = Collector::start(&db, &args);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, alerts) = c.get("/api/v1/alerts");
    let list = alerts["alerts"].as_array().cloned().unwrap_or_default();
    assert_eq!(list.len(), 1, "{alerts}");
    let starts: std::collections::BTreeSet<String> = hook
        .received()
        .iter()
        .flat_map(|(_, v)| v["alerts"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a["startsAt"].as_str().map(str::to_string))
        .collect();
    assert_eq!(starts.len(), 1, "every notification is the same page: {starts:?}");
}
