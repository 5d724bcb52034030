//! Notifiers: one task per target, fed by a bounded queue, posting through the target's own
//! [`reqwest::Client`] (TLS with the configured CA or the built-in roots, an optional client certificate, bearer
//! or basic auth and extra headers: `alert::config`). Alertmanager gets its API v2 (`POST /api/v2/alerts`,
//! firing alerts with `endsAt` three resend intervals ahead, resolved ones with `endsAt` at the resolve time); a
//! webhook gets a JSON document shaped like Alertmanager's own webhook payload. Failed posts are retried with
//! exponential backoff; a notifier that stays down only loses deliveries that the next resend repeats. Each
//! target counts its outcomes ([`NotifierStats`], exported as `startline.alerts.notifications`).

use super::config::{AlertConfig, NotifierAuth, NotifierTarget};
use super::{AlertRecord, AlertStats};
use crate::time::{format_ms, Clock};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What a target receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Alertmanager API v2 (the target's URL is the base; `/api/v2/alerts` is appended).
    Alertmanager,
    /// A generic JSON webhook (posted to the URL as given).
    Webhook,
}

/// Outcomes of one target's notifications.
#[derive(Debug, Default)]
pub struct NotifierStats {
    /// Notifications delivered (a 2xx answer).
    pub sent: AtomicU64,
    /// Attempts that failed (connection, TLS, timeout or a non-2xx answer such as 401); each is retried.
    pub failed: AtomicU64,
    /// Notifications given up after every attempt failed (the next resend repeats firing alerts).
    pub abandoned: AtomicU64,
    /// Notifications dropped because the target's queue was full.
    pub dropped: AtomicU64,
}

/// Queue capacity of each notifier.
pub const QUEUE: usize = 256;
/// Attempts per notification before it is given up.
pub const ATTEMPTS: u32 = 5;

/// Alertmanager's alert fingerprint: FNV-1a (64 bit) over the labels sorted by name, each name and value followed
/// by the byte 0xff, as 16 hex digits (Prometheus `model.LabelSet.Fingerprint`). Equal to the `fingerprint` the
/// Alertmanager API reports for the same labels (tested against a real Alertmanager).
pub fn fingerprint(labels: &std::collections::BTreeMap<String, String>) -> String {
    const OFFSET: u64 = 14_695_981_039_346_656_037;
    const PRIME: u64 = 1_099_511_628_211;
    let mut h = OFFSET;
    let mut add = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(PRIME);
        }
    };
    for (k, v) in labels {
        add(k.as_bytes());
        add(&[0xff]);
        add(v.as_bytes());
        add(&[0xff]);
    }
    format!("{h:016x}")
}

/// The link an alert points at: its dashboard view, else the collector's alert list.
fn generator_url(a: &AlertRecord, base_url: &str) -> String {
    a.annotations.get("dashboard_url").cloned().unwrap_or_else(|| format!("{base_url}/api/v1/alerts"))
}

/// Renders the Alertmanager API v2 body (`POST /api/v2/alerts`).
pub fn alertmanager_body(alerts: &[AlertRecord], now_ms: i64, resend: Duration, base_url: &str) -> Value {
    let ends_ahead = 3 * resend.as_millis() as i64;
    Value::Array(
        alerts
            .iter()
            .map(|a| {
                json!({
                    "labels": a.labels,
                    "annotations": a.annotations,
                    "startsAt": format_ms(a.starts_at_ms),
                    "endsAt": format_ms(a.resolved_at_ms.unwrap_or(now_ms + ends_ahead)),
                    "generatorURL": generator_url(a, base_url),
                })
            })
            .collect(),
    )
}

/// Renders the webhook body in Alertmanager's webhook format (version 4): a receiver that already takes
/// Alertmanager's webhooks takes Startline's unchanged. The alerts of one delivery form one group with no group
/// labels; `commonLabels` and `commonAnnotations` are the pairs every alert of it shares.
pub fn webhook_body(alerts: &[AlertRecord], base_url: &str) -> Value {
    use std::collections::BTreeMap;
    let status = if alerts.iter().any(AlertRecord::firing) { "firing" } else { "resolved" };
    let common = |pick: fn(&AlertRecord) -> &BTreeMap<String, String>| -> BTreeMap<String, String> {
        let mut it = alerts.iter();
        let Some(first) = it.next() else { return BTreeMap::new() };
        let mut c = pick(first).clone();
        for a in it {
            c.retain(|k, v| pick(a).get(k) == Some(v));
        }
        c
    };
    json!({
        "version": "4",
        "groupKey": "{}:{}",
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "startline",
        "groupLabels": {},
        "commonLabels": common(|a| &a.labels),
        "commonAnnotations": common(|a| &a.annotations),
        "externalURL": base_url,
        "alerts": alerts.iter().map(|a| json!({
            "status": if a.firing() { "firing" } else { "resolved" },
            "labels": a.labels,
            "annotations": a.annotations,
            "startsAt": format_ms(a.starts_at_ms),
            // Alertmanager's zero time for an alert that has not ended.
            "endsAt": a.resolved_at_ms.map_or_else(|| "0001-01-01T00:00:00Z".to_string(), format_ms),
            "generatorURL": generator_url(a, base_url),
            "fingerprint": fingerprint(&a.labels),
        })).collect::<Vec<_>>(),
    })
}

/// Starts one notifier task per configured target and records their counters in `stats` (a target whose name
/// was already there keeps its counters). Returns the task queues, in the order of `stats.notifiers`.
pub fn spawn_all(
    config: &AlertConfig,
    clock: Clock,
    default_base_url: &str,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
    stats_out: &AlertStats,
) -> Vec<mpsc::Sender<Vec<AlertRecord>>> {
    let before = stats_out.notifiers();
    let targets = config
        .alertmanagers
        .iter()
        .map(|t| (Kind::Alertmanager, t))
        .chain(config.webhooks.iter().map(|t| (Kind::Webhook, t)));
    let mut queues = Vec::new();
    let mut stats = Vec::new();
    for (kind, target) in targets {
        let s = before
            .iter()
            .find(|(name, _)| *name == target.name)
            .map_or_else(|| Arc::new(NotifierStats::default()), |(_, s)| s.clone());
        queues.push(spawn(
            kind,
            target.clone(),
            s.clone(),
            clock,
            config.resend_interval,
            config.external_url.clone().unwrap_or_else(|| default_base_url.to_string()),
            tasks,
            shutdown.clone(),
        ));
        stats.push((target.name.clone(), s));
    }
    *stats_out.notifiers.lock().unwrap_or_else(|p| p.into_inner()) = stats;
    queues
}

/// Why one post failed; the text names no URL query, header value or credential.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    /// Connecting, TLS, sending or reading failed, or the request timed out.
    #[error("{0}")]
    Transport(String),
    /// The target answered with a non-2xx status (401/403: check the credentials).
    #[error("http status {0}")]
    Status(u16),
}

/// POSTs `body` as JSON to `url` with the target's credentials and headers; Ok with the status when it is 2xx.
pub async fn post_json(target: &NotifierTarget, url: reqwest::Url, body: Vec<u8>) -> Result<u16, PostError> {
    let mut req = target
        .client
        .post(url)
        .headers(target.headers.clone())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body);
    req = match &target.auth {
        NotifierAuth::None => req,
        NotifierAuth::Bearer(t) => req.bearer_auth(t.expose()),
        NotifierAuth::Basic { username, password } => req.basic_auth(username, Some(password.expose())),
    };
    // reqwest's error text carries the URL; it is dropped (a webhook URL may hold a token in its query).
    let resp = req.send().await.map_err(|e| PostError::Transport(error_chain(e.without_url())))?;
    let status = resp.status().as_u16();
    if resp.status().is_success() {
        Ok(status)
    } else {
        Err(PostError::Status(status))
    }
}

/// An error with its sources ("error sending request: ... invalid peer certificate: UnknownIssuer").
fn error_chain(e: reqwest::Error) -> String {
    let mut out = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

/// Starts a notifier task; returns its queue.
#[allow(clippy::too_many_arguments)]
fn spawn(
    kind: Kind,
    target: NotifierTarget,
    stats: Arc<NotifierStats>,
    clock: Clock,
    resend: Duration,
    base_url: String,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> mpsc::Sender<Vec<AlertRecord>> {
    let (tx, mut rx) = mpsc::channel::<Vec<AlertRecord>>(QUEUE);
    let url = match kind {
        Kind::Alertmanager => {
            let mut u = target.url.clone();
            let base = u.path().trim_end_matches('/').to_string();
            u.set_path(&format!("{base}/api/v2/alerts"));
            u
        }
        Kind::Webhook => target.url.clone(),
    };
    let host = format!("{}://{}", url.scheme(), url.host_str().unwrap_or(""))
        + &url.port().map(|p| format!(":{p}")).unwrap_or_default();
    tasks.spawn(async move {
        loop {
            let alerts = tokio::select! {
                _ = shutdown.cancelled() => break,
                a = rx.recv() => match a { Some(a) => a, None => break },
            };
            let body = match kind {
                Kind::Alertmanager => alertmanager_body(&alerts, clock.now_ms(), resend, &base_url),
                Kind::Webhook => webhook_body(&alerts, &base_url),
            };
            let bytes = body.to_string().into_bytes();
            let mut delay = Duration::from_millis(200);
            for attempt in 1..=ATTEMPTS {
                match post_json(&target, url.clone(), bytes.clone()).await {
                    Ok(_) => {
                        stats.sent.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    Err(e) => {
                        stats.failed.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(notifier = %target.name, target = %host, attempt, error = %e, "notification failed");
                        if attempt == ATTEMPTS {
                            stats.abandoned.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = tokio::time::sleep(delay) => {}
                        }
                        delay = (delay * 2).min(Duration::from_secs(5));
                    }
                }
            }
        }
    });
    tx
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_webhook_body_is_alertmanagers_version_4() {
        let mut a = AlertRecord {
            key: "job/urgent-start/j1".into(),
            labels: [("alertname", "StartlineJobStartBreach"), ("slo", "urgent-start"), ("job_id", "j1")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            annotations: [("dashboard_url".to_string(), "https://s.example/#job/j1".to_string())].into(),
            starts_at_ms: 1_767_225_600_000,
            resolved_at_ms: None,
        };
        let mut b = a.clone();
        b.labels.insert("job_id".into(), "j2".into());
        b.annotations.clear();
        b.resolved_at_ms = Some(1_767_225_660_000);
        let v = webhook_body(&[a.clone(), b.clone()], "https://s.example");
        assert_eq!(v["version"], "4");
        assert_eq!(v["status"], "firing", "any firing alert makes the group firing");
        assert_eq!(v["externalURL"], "https://s.example");
        assert_eq!(
            v["commonLabels"],
            serde_json::json!({"alertname": "StartlineJobStartBreach", "slo": "urgent-start"})
        );
        assert_eq!(v["commonAnnotations"], serde_json::json!({}));
        assert_eq!(v["alerts"][0]["endsAt"], "0001-01-01T00:00:00Z");
        assert_eq!(v["alerts"][0]["generatorURL"], "https://s.example/#job/j1");
        assert_eq!(v["alerts"][1]["endsAt"], "2026-01-01T00:01:00.000Z");
        assert_eq!(v["alerts"][1]["generatorURL"], "https://s.example/api/v1/alerts");
        assert_ne!(v["alerts"][0]["fingerprint"], v["alerts"][1]["fingerprint"]);
        // Insertion order does not matter (labels are sorted by name); a changed value changes it.
        a.labels.insert("zz".into(), "1".into());
        let f1 = fingerprint(&a.labels);
        a.labels.insert("zz".into(), "2".into());
        assert_ne!(f1, fingerprint(&a.labels));
        assert_eq!(
            fingerprint(&std::collections::BTreeMap::new()),
            "cbf29ce484222325",
            "FNV-1a offset basis for no labels"
        );
    }

    use super::*;
    use crate::alert::config::{AlertsSection, TargetEntry};
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-purpose HTTPS server: answers every request with `status` and keeps each request's head.
    struct TlsServer {
        addr: std::net::SocketAddr,
        ca_file: std::path::PathBuf,
        heads: Arc<Mutex<Vec<String>>>,
        _dir: tempfile::TempDir,
    }

    async fn tls_server(status: u16) -> TlsServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).expect("cert");
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ck.cert.pem()).expect("write ca");
        let key = rustls_pki_types::PrivateKeyDer::Pkcs8(ck.key_pair.serialize_der().into());
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(vec![ck.cert.der().clone()], key)
            .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let heads = Arc::new(Mutex::new(Vec::new()));
        let h = heads.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, h) = (acceptor.clone(), h.clone());
                tokio::spawn(async move {
                    let Ok(mut s) = acceptor.accept(tcp).await else { return };
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    // Read the head and a Content-Length body.
                    loop {
                        let Ok(n) = s.read(&mut chunk).await else { return };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&buf).to_string();
                        if let Some((head, body)) = text.split_once("\r\n\r\n") {
                            let len = head
                                .lines()
                                .find_map(|l| {
                                    l.to_ascii_lowercase().strip_prefix("content-length:").map(str::to_string)
                                })
                                .and_then(|v| v.trim().parse::<usize>().ok())
                                .unwrap_or(0);
                            if body.len() >= len {
                                h.lock().expect("lock").push(head.to_string());
                                break;
                            }
                        }
                    }
                    let answer = format!("HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                    let _ = s.write_all(answer.as_bytes()).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        TlsServer { addr, ca_file, heads, _dir: dir }
    }

    fn hook_target(server: &TlsServer, token: &str, dir: &std::path::Path) -> NotifierTarget {
        let token_file = dir.join("token");
        std::fs::write(&token_file, token).expect("write token");
        let s: AlertsSection = toml::from_str(&format!(
            "webhook = [{{ url = \"https://127.0.0.1:{}/hook\", ca_file = \"{}\", bearer_token_file = \"{}\", headers = {{ \"X-Scope-OrgID\" = \"team-a\" }} }}]",
            server.addr.port(),
            server.ca_file.display(),
            token_file.display()
        ))
        .expect("parses");
        let mut errs = Vec::new();
        let mut c = s.validate(&mut errs);
        assert!(errs.is_empty(), "{errs:?}");
        c.webhooks.remove(0)
    }

    fn record() -> AlertRecord {
        AlertRecord {
            key: "job/urgent-start/j1".into(),
            labels: [("alertname".to_string(), "StartlineJobStartBreach".to_string())].into_iter().collect(),
            annotations: Default::default(),
            starts_at_ms: 1_767_225_600_000,
            resolved_at_ms: None,
        }
    }

    #[tokio::test]
    async fn webhook_posts_over_https_with_the_bearer_token_and_headers() {
        let server = tls_server(200).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let target = hook_target(&server, "tok-abc\n", dir.path());
        let url = target.url.clone();
        let status =
            post_json(&target, url, webhook_body(&[record()], "http://startline.test").to_string().into_bytes())
                .await
                .expect("posted");
        assert_eq!(status, 200);
        let heads = server.heads.lock().expect("lock").clone();
        assert_eq!(heads.len(), 1);
        let head = heads[0].to_ascii_lowercase();
        assert!(head.starts_with("post /hook http/1.1"), "{head}");
        assert!(head.contains("\r\nauthorization: bearer tok-abc\r\n"), "{head}");
        assert!(head.contains("\r\nx-scope-orgid: team-a\r\n"), "{head}");
        assert!(head.contains("\r\ncontent-type: application/json\r\n"), "{head}");
    }

    #[tokio::test]
    async fn an_unknown_ca_and_a_refusal_are_counted_failures_and_retried() {
        let server = tls_server(401).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let target = hook_target(&server, "wrong", dir.path());
        let err = post_json(&target, target.url.clone(), b"{}".to_vec()).await.expect_err("401");
        assert_eq!(err.to_string(), "http status 401");

        // Without the CA file the server's self-signed certificate is not trusted; the error names no URL.
        let plain = TargetEntry::from(format!("https://127.0.0.1:{}/hook?token=q", server.addr.port()).as_str())
            .validate("alerts.webhook[0]")
            .expect("valid");
        let err = post_json(&plain, plain.url.clone(), b"{}".to_vec()).await.expect_err("untrusted");
        let text = err.to_string();
        assert!(text.contains("certificate"), "{text}");
        assert!(!text.contains("token=q"), "{text}");

        // Through the task: every attempt fails and is counted, then the notification is given up.
        let stats = Arc::new(NotifierStats::default());
        let tasks = TaskTracker::new();
        let stop = CancellationToken::new();
        let tx = spawn(
            Kind::Webhook,
            target,
            stats.clone(),
            Clock::system(),
            Duration::from_secs(60),
            String::new(),
            &tasks,
            stop.clone(),
        );
        tx.send(vec![record()]).await.expect("queued");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while stats.abandoned.load(Ordering::Relaxed) == 0 {
            assert!(tokio::time::Instant::now() < deadline, "not given up: {stats:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(stats.failed.load(Ordering::Relaxed), u64::from(ATTEMPTS));
        assert_eq!(stats.sent.load(Ordering::Relaxed), 0);
        stop.cancel();
        tasks.close();
        tasks.wait().await;
    }
}
