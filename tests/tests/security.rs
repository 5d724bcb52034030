//! Authentication, authorization and TLS against a real collector process: certificates made at test time
//! (rcgen), gRPC over TLS with tokens and with client certificates (mTLS), every HTTP route with no, a wrong,
//! a wrong-scope and a right token, per-event job-id and source restrictions, rate limits, reloads on SIGHUP and
//! through the admin route (a removed token fails at once), certificate rotation without dropping an open
//! connection, and no token in the log.

use startline_proto::pb::{self, ingest_service_client::IngestServiceClient};
use startline_tests::pki::{Issued, TestCa};
use startline_tests::{ago, event, submitted, Collector};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::Code;

struct Tokens {
    cluster_a: String,
    reader: String,
    admin: String,
    limited: String,
    python: String,
}

fn hash(t: &str) -> String {
    startline_collector::auth::TokenHash::of(t).to_config()
}

fn token() -> String {
    startline_collector::auth::generate_token().expect("token")
}

fn config(dir: &Path, server: &Issued, clients_ca: &Path, t: &Tokens, with_reader: bool, metrics: &str) -> String {
    let reader = if with_reader {
        format!("[[auth.identity]]\nname = \"reader\"\ntoken_hashes = [\"{}\"]\nscopes = [\"read\"]\n", hash(&t.reader))
    } else {
        String::new()
    };
    format!(
        r#"[store]
path = "{db}"
[tls]
cert_file = "{cert}"
key_file = "{key}"
client_ca_file = "{ca}"
client_certs = "optional"
[auth]
metrics = "{metrics}"
[[auth.identity]]
name = "cluster-a"
token_hashes = ["{a}"]
scopes = ["ingest"]
job_id_prefixes = ["slurm/cluster-a/"]
sources = ["slurm-adapter/cluster-a"]
[[auth.identity]]
name = "agents-a"
cert_names = ["node-agent.cluster-a.example"]
scopes = ["ingest"]
job_id_prefixes = ["slurm/cluster-a/"]
{reader}
[[auth.identity]]
name = "admin"
token_hashes = ["{admin}"]
scopes = ["admin"]
[[auth.identity]]
name = "limited"
token_hashes = ["{limited}"]
scopes = ["ingest"]
rate_per_second = 1
burst = 5
[[auth.identity]]
name = "python"
token_hashes = ["{python}"]
scopes = ["ingest"]
job_id_prefixes = ["vertex/"]
"#,
        db = dir.join("db").display(),
        cert = server.cert_file.display(),
        key = server.key_file.display(),
        ca = clients_ca.display(),
        a = hash(&t.cluster_a),
        admin = hash(&t.admin),
        limited = hash(&t.limited),
        python = hash(&t.python),
    )
}

async fn channel(c: &Collector, ca: &Path, client: Option<&Issued>) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(ca).expect("ca")))
        .domain_name("localhost");
    if let Some(id) = client {
        let cert = std::fs::read(&id.cert_file).expect("cert");
        let key = std::fs::read(&id.key_file).expect("key");
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Endpoint::from_shared(format!("https://{}", c.grpc)).expect("uri").tls_config(tls)?.connect().await
}

fn batch(events: Vec<pb::LifecycleEvent>, token: Option<&str>) -> tonic::Request<pb::PublishRequest> {
    let mut r = tonic::Request::new(pb::PublishRequest { batch_seq: 1, events });
    if let Some(t) = token {
        r.metadata_mut().insert("authorization", format!("Bearer {t}").parse().expect("metadata"));
    }
    r
}

fn job(job: &str, source: &str) -> Vec<pb::LifecycleEvent> {
    let mut e =
        event(job, &format!("{job}-s"), ago(60), submitted(pb::PoolKind::Dedicated, pb::PriorityClass::Normal, 8));
    e.source = source.into();
    vec![e]
}

async fn publish(
    ch: &Channel,
    events: Vec<pb::LifecycleEvent>,
    token: Option<&str>,
) -> Result<pb::PublishAck, tonic::Status> {
    IngestServiceClient::new(ch.clone()).publish_batch(batch(events, token)).await.map(|r| r.into_inner())
}

fn https(ca: &Path) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(ca).expect("ca")).expect("ca pem");
    reqwest::Client::builder()
        .add_root_certificate(ca)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

async fn status(http: &reqwest::Client, c: &Collector, method: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let url = format!("https://localhost:{}{path}", c.http.port());
    let mut req = if method == "POST" { http.post(url) } else { http.get(url) };
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.expect("https request");
    let s = r.status().as_u16();
    (s, r.text().await.unwrap_or_default())
}

/// Waits until `check` holds (a reload is applied on a background task).
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(15);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const READ_ROUTES: &[&str] = &[
    "/api/v1/jobs",
    "/api/v1/jobs/slurm/cluster-a/1",
    "/api/v1/slos",
    "/api/v1/slos/urgent-start",
    "/api/v1/alerts",
    "/api/v1/overview",
    "/api/v1/compare?left=pool_kind%3Dmanaged&right=pool_kind%3Ddedicated",
    "/api/v1/compare.svg?left=pool_kind%3Dmanaged&right=pool_kind%3Ddedicated",
    "/",
    "/dashboard",
    "/no/such/route",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_path_checks_identity_scope_and_restrictions_over_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let server_ca = TestCa::new(d, "server");
    let clients_ca = TestCa::new(d, "clients");
    let other_ca = TestCa::new(d, "other");
    let server = server_ca.server("collector");
    let agent_cert = clients_ca.client("agent", &["node-agent.cluster-a.example"]);
    let stranger_cert = other_ca.client("stranger", &["node-agent.cluster-a.example"]);
    let unknown_cert = clients_ca.client("unknown", &["someone-else.example"]);
    let t = Tokens { cluster_a: token(), reader: token(), admin: token(), limited: token(), python: token() };
    let cfg = d.join("collector.toml");
    std::fs::write(&cfg, config(d, &server, &clients_ca.ca_file, &t, true, "open")).expect("config");
    let cfg_arg = cfg.display().to_string();
    let c = Collector::start(&d.join("db"), &["--config", &cfg_arg]);
    let ca = &server_ca.ca_file;

    // gRPC: plaintext is refused (the listener speaks TLS only).
    let plain = Endpoint::from_shared(c.endpoint()).expect("uri").connect().await;
    if let Ok(ch) = plain {
        let e = publish(&ch, job("slurm/cluster-a/0", "slurm-adapter/cluster-a"), Some(&t.cluster_a)).await;
        assert!(e.is_err(), "a plaintext request was answered: {e:?}");
    }
    let ch = channel(&c, ca, None).await.expect("tls channel");
    // Health needs no credentials.
    let mut health = tonic_health::pb::health_client::HealthClient::new(ch.clone());
    let h = health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.expect("health");
    assert_eq!(h.into_inner().status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
    // (path x credentials) -> status.
    let ok_events = || job("slurm/cluster-a/1", "slurm-adapter/cluster-a");
    let e = publish(&ch, ok_events(), None).await.expect_err("no token");
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let e = publish(&ch, ok_events(), Some("stl_wrong")).await.expect_err("wrong token");
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let e = publish(&ch, ok_events(), Some(&t.reader)).await.expect_err("read scope");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("\"reader\"") && e.message().contains("ingest"), "{}", e.message());
    let ack = publish(&ch, ok_events(), Some(&t.cluster_a)).await.expect("right token");
    assert_eq!((ack.accepted, ack.rejections.len()), (1, 0));
    // Per event: another cluster's job and a forged source are rejected; the rest of the batch is kept.
    let mut mixed = job("slurm/cluster-b/424242", "slurm-adapter/cluster-a");
    mixed.extend(job("slurm/cluster-a/2", "slurm-adapter/cluster-b"));
    mixed.extend(job("slurm/cluster-a/3", "slurm-adapter/cluster-a"));
    let ack = publish(&ch, mixed, Some(&t.cluster_a)).await.expect("mixed batch");
    assert_eq!(ack.accepted, 1);
    let r: Vec<(u32, &str, bool)> =
        ack.rejections.iter().map(|r| (r.index, r.field.as_str(), r.reason.contains("not permitted"))).collect();
    assert_eq!(r, vec![(0, "job_id", true), (1, "source", true)]);
    // mTLS: a client certificate from the clients' CA proves its identity without a token.
    let mtls = channel(&c, ca, Some(&agent_cert)).await.expect("mtls channel");
    let ack = publish(&mtls, job("slurm/cluster-a/4", "node-agent/n1"), None).await.expect("by certificate");
    assert_eq!(ack.accepted, 1);
    let ack = publish(&mtls, job("slurm/cluster-b/4", "node-agent/n1"), None).await.expect("by certificate");
    assert_eq!(ack.rejections[0].field, "job_id");
    // A certificate the clients' CA did not sign fails the handshake; one it signed for an unknown name is
    // authenticated by TLS but proves no identity.
    match channel(&c, ca, Some(&stranger_cert)).await {
        Err(_) => {}
        Ok(ch) => assert!(publish(&ch, ok_events(), None).await.is_err(), "a stranger's certificate was accepted"),
    }
    let unknown = channel(&c, ca, Some(&unknown_cert)).await.expect("signed by the clients' CA");
    let e = publish(&unknown, ok_events(), None).await.expect_err("unknown certificate name");
    assert_eq!(e.code(), Code::Unauthenticated);
    // Rate limit: a burst of 5, then RESOURCE_EXHAUSTED with a retry hint, nothing stored.
    let five: Vec<_> = (0..5).flat_map(|i| job(&format!("limited/{i}"), "x")).collect();
    assert_eq!(publish(&ch, five.clone(), Some(&t.limited)).await.expect("burst").accepted, 5);
    let more: Vec<_> = (5..10).flat_map(|i| job(&format!("limited/{i}"), "x")).collect();
    let e = publish(&ch, more, Some(&t.limited)).await.expect_err("over the rate");
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(e.metadata().get("retry-after-ms").is_some(), "{e:?}");

    // HTTP: every route x credentials.
    let http = https(ca);
    for route in READ_ROUTES {
        let (s, body) = status(&http, &c, "GET", route, None).await;
        assert_eq!(s, 401, "{route} without a token: {body}");
        assert!(body.starts_with('{') && body.contains("authentication required"), "{route}: {body}");
        assert_eq!(status(&http, &c, "GET", route, Some("stl_wrong")).await.0, 401, "{route} wrong token");
        assert_eq!(status(&http, &c, "GET", route, Some(&t.cluster_a)).await.0, 403, "{route} ingest scope");
        let (s, body) = status(&http, &c, "GET", route, Some(&t.reader)).await;
        let want = if route.starts_with("/no/") { 404 } else { 200 };
        assert_eq!(s, want, "{route} with a read token: {body}");
        assert_eq!(status(&http, &c, "GET", route, Some(&t.admin)).await.0, want, "{route} admin implies read");
    }
    let (_, job_body) = status(&http, &c, "GET", "/api/v1/jobs/slurm/cluster-a/1", Some(&t.reader)).await;
    assert!(job_body.contains("slurm/cluster-a/1"), "{job_body}");
    for open in ["/healthz", "/readyz", "/metrics", "/login"] {
        assert_eq!(status(&http, &c, "GET", open, None).await.0, 200, "{open} is open");
    }
    // A browser without a session is sent to the login page.
    let r = http
        .get(format!("https://localhost:{}/", c.http.port()))
        .header("accept", "text/html")
        .send()
        .await
        .expect("get /");
    assert_eq!((r.status().as_u16(), r.headers()["location"].to_str().ok()), (303, Some("/login")));
    // Login: a read token opens a session cookie (HttpOnly, SameSite=Strict, Secure over TLS) that reads the API.
    let url = format!("https://localhost:{}/login", c.http.port());
    let r = http.post(&url).form(&[("token", t.cluster_a.as_str())]).send().await.expect("login");
    assert_eq!(r.status().as_u16(), 401, "an ingest token cannot log into the dashboard");
    let r = http.post(&url).form(&[("token", t.reader.as_str())]).send().await.expect("login");
    assert_eq!(r.status().as_u16(), 303);
    let cookie = r.headers()["set-cookie"].to_str().expect("cookie").to_string();
    for attr in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/"] {
        assert!(cookie.contains(attr), "{attr} missing in {cookie}");
    }
    assert!(!cookie.contains(&t.reader), "the cookie holds the token");
    let session = cookie.split(';').next().expect("pair").to_string();
    let with_cookie = |path: &str| {
        http.get(format!("https://localhost:{}{path}", c.http.port())).header("cookie", session.clone()).send()
    };
    assert_eq!(with_cookie("/api/v1/overview").await.expect("get").status().as_u16(), 200);
    // Admin route: only admin.
    assert_eq!(status(&http, &c, "POST", "/api/v1/admin/reload", Some(&t.reader)).await.0, 403);
    assert_eq!(status(&http, &c, "POST", "/api/v1/admin/reload", None).await.0, 401);
    let (s, body) = status(&http, &c, "POST", "/api/v1/admin/reload", Some(&t.admin)).await;
    assert_eq!(s, 200, "{body}");
    assert!(body.contains("\"identities\":6"), "{body}");

    // Python grpcio over TLS with a token (a foreign client).
    let root = startline_tests::workspace_root();
    let gen = d.join("gen");
    std::fs::create_dir_all(&gen).expect("gen");
    let out = std::process::Command::new("python3")
        .arg(root.join("tests/python/foreign_client.py"))
        .arg(format!("localhost:{}", c.grpc.port()))
        .arg(root.join("proto/proto"))
        .arg(&gen)
        .arg("vertex/proj/tls")
        .env("STARTLINE_CA_FILE", ca)
        .env("STARTLINE_TOKEN", &t.python)
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "python client over TLS failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json report");
    assert_eq!(report["health"], "SERVING");
    assert_eq!(report["unary"]["accepted"], 5, "{report}");

    // Reload on SIGHUP: the reader's token is removed and /metrics now needs read. Its token and its dashboard
    // session fail from then on; nothing else changes.
    std::fs::write(&cfg, config(d, &server, &clients_ca.ca_file, &t, false, "read")).expect("config");
    let pid = c.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-HUP", &pid]).status().expect("kill").success());
    eventually("the reader's token is revoked", || async {
        status(&http, &c, "GET", "/api/v1/jobs", Some(&t.reader)).await.0 == 401
    })
    .await;
    assert_eq!(
        with_cookie("/api/v1/overview").await.expect("get").status().as_u16(),
        401,
        "session of a revoked token"
    );
    assert_eq!(status(&http, &c, "GET", "/metrics", None).await.0, 401, "metrics now need read");
    let (s, metrics) = status(&http, &c, "GET", "/metrics", Some(&t.admin)).await;
    assert_eq!(s, 200);
    for reason in ["missing", "unknown", "scope", "rate_limited", "not_permitted"] {
        let line = metrics
            .lines()
            .find(|l| {
                l.starts_with("startline_collector_auth_refusals_total") && l.contains(&format!("reason=\"{reason}\""))
            })
            .unwrap_or_else(|| panic!("no refusal count for {reason}"));
        let n: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).expect("value");
        assert!(n >= 1.0, "{line}");
    }
    assert!(gauge_is(&metrics, "startline_collector_auth_insecure", "0"), "exposed without auth is reported");
    assert_eq!(
        publish(&ch, job("slurm/cluster-a/5", "slurm-adapter/cluster-a"), Some(&t.cluster_a))
            .await
            .expect("kept")
            .accepted,
        1
    );

    // Certificate rotation: a new server certificate from a new CA. The open connection keeps working; new
    // connections get the new certificate.
    let new_ca = TestCa::new(&d.join("rotated").tap_mkdir(), "server2");
    let rotated = new_ca.server("collector");
    std::fs::copy(&rotated.key_file, &server.key_file).expect("key");
    std::fs::copy(&rotated.cert_file, &server.cert_file).expect("cert");
    let pid = c.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-HUP", &pid]).status().expect("kill").success());
    let new_ca_file = new_ca.ca_file.clone();
    eventually("new connections get the rotated certificate", || async {
        match channel(&c, &new_ca_file, None).await {
            Ok(ch) => {
                publish(&ch, job("slurm/cluster-a/6", "slurm-adapter/cluster-a"), Some(&t.cluster_a)).await.is_ok()
            }
            Err(_) => false,
        }
    })
    .await;
    let ack = publish(&ch, job("slurm/cluster-a/7", "slurm-adapter/cluster-a"), Some(&t.cluster_a)).await;
    assert_eq!(ack.expect("the connection opened before the rotation still works").accepted, 1);
    assert!(
        channel(&c, ca, None).await.is_err()
            || publish(&channel(&c, ca, None).await.expect("ch"), ok_events(), Some(&t.cluster_a)).await.is_err(),
        "a new connection still got the old certificate"
    );

    // No token, in any form, in the log.
    let log = std::fs::read_to_string(&c.log).expect("log");
    assert!(log.contains("request refused"), "refusals are logged:\n{log}");
    for secret in [&t.cluster_a, &t.reader, &t.admin, &t.limited, &t.python] {
        assert!(!log.contains(secret.as_str()), "a token is in the log");
        assert!(!log.contains(&secret[4..20]), "part of a token is in the log");
    }
}

trait TapMkdir {
    fn tap_mkdir(self) -> PathBuf;
}

impl TapMkdir for PathBuf {
    fn tap_mkdir(self) -> PathBuf {
        std::fs::create_dir_all(&self).expect("mkdir");
        self
    }
}

#[test]
fn a_collector_on_a_public_address_without_auth_refuses_to_start_unless_insecure() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[store]\ncache_mib = 16\n").expect("config");
    let cfg_arg = cfg.display().to_string();
    let (why, log) = match Collector::try_start_on(&dir.path().join("db"), "0.0.0.0:0", &["--config", &cfg_arg]) {
        Err(e) => e,
        Ok(_) => panic!("started on 0.0.0.0 without auth"),
    };
    assert!(log.contains("grpc.listen: 0.0.0.0:0 is reachable beyond this host"), "{why}\n{log}");
    std::fs::write(&cfg, "[auth]\ninsecure = true\n").expect("config");
    let c = Collector::start_on(&dir.path().join("db2"), "0.0.0.0:0", &["--config", &cfg_arg]);
    let (s, _) = startline_tests::http_get_text(([127, 0, 0, 1], c.http.port()).into(), "/metrics");
    assert_eq!(s, 200);
    let (_, metrics) = startline_tests::http_get_text(([127, 0, 0, 1], c.http.port()).into(), "/metrics");
    assert!(gauge_is(&metrics, "startline_collector_auth_insecure", "1"), "{metrics}");
    let log = std::fs::read_to_string(&c.log).expect("log");
    assert!(log.contains("NO authentication"), "{log}");
}

#[test]
fn the_secure_example_config_starts_with_real_certificates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let ca = TestCa::new(d, "example");
    let server = ca.server("collector");
    let clients = TestCa::new(d, "clients");
    let root = startline_tests::workspace_root();
    let example = std::fs::read_to_string(root.join("deploy/collector.example.toml")).expect("example");
    let text = example
        .replace("/etc/startline/tls/collector.crt", &server.cert_file.display().to_string())
        .replace("/etc/startline/tls/collector.key", &server.key_file.display().to_string())
        .replace("/etc/startline/tls/clients-ca.crt", &clients.ca_file.display().to_string());
    let cfg = d.join("example.toml");
    std::fs::write(&cfg, text).expect("config");
    let cfg_arg = cfg.display().to_string();
    // Ports and the data directory from flags, as an operator's unit file would; everything else as shipped.
    let c = Collector::start(&d.join("db"), &["--config", &cfg_arg]);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let http = https(&ca.ca_file);
        assert_eq!(status(&http, &c, "GET", "/readyz", None).await.0, 200);
        assert_eq!(status(&http, &c, "GET", "/api/v1/jobs", None).await.0, 401);
        let ch = channel(&c, &ca.ca_file, None).await.expect("tls");
        let e = publish(&ch, job("slurm/cluster-a/1", "slurm-adapter/cluster-a"), Some("stl_not-configured")).await;
        assert_eq!(e.expect_err("unknown token").code(), Code::Unauthenticated);
    });
}

fn gauge_is(metrics: &str, name: &str, value: &str) -> bool {
    metrics.lines().any(|l| l.starts_with(name) && l.ends_with(&format!(" {value}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_uplink_proves_its_identity_with_a_client_certificate_when_one_is_required() {
    use startline_agent::uplink::{Publisher, TlsFiles, UplinkSettings};
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let server_ca = TestCa::new(d, "server");
    let clients_ca = TestCa::new(d, "clients");
    let server = server_ca.server("collector");
    let agent = clients_ca.client("agent", &["node-agent.cluster-a.example"]);
    let quota_token = token();
    let cfg = d.join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\nclient_ca_file = \"{}\"\nclient_certs = \"required\"\n\
             [[auth.identity]]\nname = \"agents-a\"\ncert_names = [\"node-agent.cluster-a.example\"]\n\
             scopes = [\"ingest\"]\njob_id_prefixes = [\"slurm/cluster-a/\"]\nevents_per_day = 3\n\
             [[auth.identity]]\nname = \"quota\"\ntoken_hashes = [\"{}\"]\nscopes = [\"ingest\"]\n",
            server.cert_file.display(),
            server.key_file.display(),
            clients_ca.ca_file.display(),
            hash(&quota_token)
        ),
    )
    .expect("config");
    let c = Collector::start(&d.join("db"), &["--config", &cfg.display().to_string()]);
    let endpoint = format!("https://localhost:{}", c.grpc.port());
    let settings = |client: bool| {
        let mut s = UplinkSettings::new(endpoint.clone());
        s.give_up_after = Some(Duration::from_secs(3));
        s.backoff_max = Duration::from_millis(200);
        s.tls = TlsFiles {
            ca_file: Some(server_ca.ca_file.clone()),
            client_cert: client.then(|| agent.cert_file.clone()),
            client_key: client.then(|| agent.key_file.clone()),
        };
        s
    };
    // With the certificate: its identity (prefix restricted), no token.
    let mut up = Publisher::new(settings(true)).expect("publisher");
    let mut evs = job("slurm/cluster-a/1", "node-agent/n1");
    evs.extend(job("slurm/cluster-b/1", "node-agent/n1"));
    up.send(evs).await.expect("send");
    up.flush().await.expect("flush");
    let t = up.totals();
    assert_eq!((t.accepted, t.rejected), (1, 1));
    assert_eq!(t.rejections[0].field, "job_id");
    // The daily quota of 3 events counts every event offered (the rejected one too): one more fits, then a
    // batch is refused whole.
    let ch = channel(&c, &server_ca.ca_file, Some(&agent)).await.expect("mtls");
    assert_eq!(publish(&ch, job("slurm/cluster-a/2", "node-agent/n1"), None).await.expect("within quota").accepted, 1);
    let e = publish(&ch, job("slurm/cluster-a/9", "node-agent/n1"), None).await.expect_err("over quota");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("daily event quota"), "{}", e.message());
    assert!(e.metadata().get("retry-after-ms").is_some());
    // Without a certificate the handshake fails, whatever token is sent: nothing gets in.
    let mut s = settings(false);
    s.token = Some(startline_agent::auth::TokenSource::Static(startline_agent::auth::Secret::new(quota_token.clone())));
    let mut up = Publisher::new(s).expect("publisher");
    let sent = async {
        up.send(job("slurm/cluster-a/5", "x")).await?;
        up.flush().await
    };
    assert!(sent.await.is_err(), "a client without a certificate got in");
    assert_eq!(up.totals().accepted, 0);
}
