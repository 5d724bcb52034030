//! The Alertmanager notifier over TLS with basic auth, against a real Alertmanager (Debian
//! `prometheus-alertmanager`) started with `--web.config.file`: `tls_server_config` with a certificate made here
//! (rcgen) and `basic_auth_users` with a bcrypt hash made here (`htpasswd -nbB`, Debian `apache2-utils`; both
//! installed by scripts/test.sh).
//!
//! The collector starts with the right CA file and a password Alertmanager does not accept yet: every post is
//! refused with 401, counted in `startline_alerts_notifications_total{result="failed"}`, and retried. Then
//! Alertmanager's web config is rewritten with the collector's password (Alertmanager reads that file on every
//! request): the next resend delivers the page, which is then visible in `/api/v2/alerts` over TLS with auth.
//! Nothing was lost while the credentials were wrong.

use startline_agent::uplink::{Publisher, UplinkSettings};
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_tests::{event, free_port, http_get_text, submitted, ChildGuard, Collector};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const USER: &str = "startline";
const PASSWORD: &str = "collector-pa55";

/// A bcrypt hash of `password` (cost 4: these tests check many requests, not the hash's strength).
fn bcrypt_hash(password: &str) -> String {
    let out = Command::new("htpasswd")
        .args(["-nbBC", "4", USER, password])
        .output()
        .expect("htpasswd runs (scripts/test.sh installs apache2-utils)");
    assert!(out.status.success(), "htpasswd: {}", String::from_utf8_lossy(&out.stderr));
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    line.split_once(':').map(|(_, h)| h.to_string()).expect("user:hash")
}

fn write_web_config(dir: &Path, password: &str) {
    // Written to a temporary name and renamed, so Alertmanager never reads half a file.
    let tmp = dir.join("web.yml.tmp");
    std::fs::write(
        &tmp,
        format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\nbasic_auth_users:\n  {USER}: '{}'\n",
            dir.join("am.pem").display(),
            dir.join("am.key").display(),
            bcrypt_hash(password)
        ),
    )
    .expect("write web config");
    std::fs::rename(&tmp, dir.join("web.yml")).expect("rename web config");
}

/// A client of Alertmanager's API over TLS (trusting only the test CA) with basic auth.
#[derive(Clone)]
struct AmClient {
    base: String,
    client: reqwest::Client,
    password: String,
}

impl AmClient {
    async fn get(&self, path: &str) -> Result<(u16, String), String> {
        let resp = self
            .client
            .get(format!("{}{path}", self.base))
            .basic_auth(USER, Some(&self.password))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        Ok((status, resp.text().await.map_err(|e| e.to_string())?))
    }
}

fn start_alertmanager(dir: &Path) -> (ChildGuard, u16) {
    let cfg = dir.join("alertmanager.yml");
    std::fs::write(
        &cfg,
        "route:\n  receiver: blackhole\n  group_wait: 0s\n  group_interval: 1s\n  repeat_interval: 1h\nreceivers:\n  - name: blackhole\n",
    )
    .expect("write am config");
    let port = free_port();
    let child = Command::new("prometheus-alertmanager")
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!("--storage.path={}", dir.join("am-data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg(format!("--web.config.file={}", dir.join("web.yml").display()))
        .arg("--cluster.listen-address=")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("am.log")).expect("am log"))
        .spawn()
        .expect("prometheus-alertmanager runs (scripts/test.sh installs it)");
    (ChildGuard(child), port)
}

/// The collector's notifier counter for `result`, summed over targets.
fn notifications(c: &Collector, result: &str) -> f64 {
    let (_, text) = http_get_text(c.http, "/metrics");
    text.lines()
        .filter(|l| {
            l.starts_with("startline_alerts_notifications_total{") && l.contains(&format!("result=\"{result}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn has_job_alert(body: &str, job: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.as_array().cloned())
        .is_some_and(|a| a.iter().any(|x| x["labels"]["job_id"] == job))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_reach_alertmanager_over_tls_with_basic_auth_and_a_wrong_password_is_retried_not_lost() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()]).expect("cert");
    std::fs::write(d.join("am.pem"), ck.cert.pem()).expect("write cert");
    std::fs::write(d.join("am.key"), ck.key_pair.serialize_pem()).expect("write key");
    std::fs::write(d.join("password"), format!("{PASSWORD}\n")).expect("write password");
    // Alertmanager first accepts another password than the collector's.
    write_web_config(d, "not-the-collector-s");
    let (_am, port) = start_alertmanager(d);
    let base = format!("https://127.0.0.1:{port}");
    let client = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ck.cert.pem().as_bytes()).expect("ca"))
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let mut am = AmClient { base, client, password: "not-the-collector-s".into() };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok((200, _)) = am.get("/-/ready").await {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "alertmanager not ready: {}",
            std::fs::read_to_string(d.join("am.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // TLS and auth are really on: plain HTTP and a wrong password are refused.
    assert_eq!(AmClient { password: "nope".into(), ..am.clone() }.get("/api/v2/alerts").await.map(|r| r.0), Ok(401));
    let plain = AmClient { base: format!("http://127.0.0.1:{port}"), ..am.clone() }.get("/api/v2/alerts").await;
    assert!(!matches!(plain, Ok((200, _))), "plain http is not served: {plain:?}");

    let cfg = d.join("collector.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"[[slo]]
name = "urgent-start"
threshold = "3s"
objective = 99
window = "1d"
[slo.selector]
priority = ["urgent"]

[alerts]
alertmanager = [{{ url = "https://127.0.0.1:{port}", ca_file = "{}", basic_auth = {{ username = "{USER}", password_file = "{}" }}, timeout = "5s" }}]
evaluation_interval = "1s"
resend_interval = "2s"
"#,
            d.join("am.pem").display(),
            d.join("password").display()
        ),
    )
    .expect("write collector config");
    let c = Collector::start(&d.join("db"), &["--config", cfg.to_str().expect("utf8")]);
    let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");
    let job = "slurm/tls/77";
    let submit = startline_proto::time::now_ms();
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

    // Wrong password: refused (401), counted, retried; the page is firing in the collector, absent in Alertmanager.
    let deadline = Instant::now() + Duration::from_secs(30);
    while notifications(&c, "failed") < 2.0 {
        assert!(Instant::now() < deadline, "no failed notification counted: {}", http_get_text(c.http, "/metrics").1);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(notifications(&c, "sent"), 0.0);
    let (_, alerts) = c.get("/api/v1/alerts?state=firing");
    assert!(alerts["alerts"].as_array().is_some_and(|a| a.iter().any(|x| x["labels"]["job_id"] == job)), "{alerts}");
    let (status, body) = am.get("/api/v2/alerts").await.expect("am api");
    assert_eq!(status, 200);
    assert!(!has_job_alert(&body, job), "{body}");
    let log = std::fs::read_to_string(&c.log).unwrap_or_default();
    assert!(log.contains("http status 401"), "the refusal is logged: {log}");
    assert!(!log.contains(PASSWORD), "the password is never logged");

    // Alertmanager now accepts the collector's password: the next resend delivers the page.
    write_web_config(d, PASSWORD);
    am.password = PASSWORD.into();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok((200, body)) = am.get("/api/v2/alerts").await {
            if has_job_alert(&body, job) {
                let v: serde_json::Value = serde_json::from_str(&body).expect("json");
                let a = v.as_array().and_then(|a| a.iter().find(|x| x["labels"]["job_id"] == job).cloned());
                let a = a.expect("the page");
                assert_eq!(a["labels"]["alertname"], "StartlineJobStartBreach");
                assert_eq!(a["status"]["state"], "active");
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the page never reached alertmanager: {}",
            http_get_text(c.http, "/metrics").1
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(notifications(&c, "sent") >= 1.0);
    let log = std::fs::read_to_string(&c.log).unwrap_or_default();
    assert!(!log.contains(PASSWORD), "the password is never logged");
}
