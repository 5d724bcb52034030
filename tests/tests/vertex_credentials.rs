//! The Vertex AI adapter's Google credentials (Application Default Credentials) against local servers speaking
//! Google's documented token protocols (no Google Cloud here; key and credential files from Google's own auth
//! library test data, `tests/fixtures/google`): a service account key file (`GOOGLE_APPLICATION_CREDENTIALS`; the
//! token endpoint verifies each JWT's RS256 signature with the key's public half and its claims), an
//! `authorized_user` file (refresh-token grant), an `external_account` file (STS token exchange, then service
//! account impersonation) and the metadata server (`GCE_METADATA_HOST`; requests without `Metadata-Flavor: Google`
//! are refused). The files' `token_uri`/`token_url` and `GCE_METADATA_HOST` point at the local servers.
//!
//! Every token lives 10 seconds. The local Vertex API accepts only tokens that were issued and have not expired
//! (401 `UNAUTHENTICATED` otherwise); each test runs until the adapter has used three successive tokens and
//! asserts that the API refused none and no poll failed: tokens are renewed before they expire.

use startline_tests::{binary, serve_http, wait_until, workspace_root, ChildGuard, HttpRequest};
use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const LIFE_S: u64 = 10;

fn fixture(name: &str) -> String {
    std::fs::read_to_string(workspace_root().join("tests/fixtures/google").join(name)).expect("fixture")
}

/// Tokens handed out: token -> expiry.
#[derive(Clone, Default)]
struct Tokens(Arc<Mutex<Vec<(String, Instant)>>>);

impl Tokens {
    fn issue(&self, source: &str) -> String {
        let mut all = self.0.lock().expect("tokens");
        let t = format!("ya29.{source}-{}", all.len() + 1);
        all.push((t.clone(), Instant::now() + Duration::from_secs(LIFE_S)));
        t
    }

    fn live(&self, t: &str) -> Result<(), String> {
        match self.0.lock().expect("tokens").iter().find(|(x, _)| x == t) {
            None => Err(format!("unknown token {t:?}")),
            Some((_, exp)) if Instant::now() > *exp => Err(format!("expired token {t}")),
            Some(_) => Ok(()),
        }
    }
}

#[derive(Default)]
struct Seen {
    tokens: Vec<String>,
    ok: usize,
    refused: Vec<String>,
}

/// A Vertex AI API listing the succeeded fixture job to calls with a live token.
fn vertex(tokens: Tokens, seen: Arc<Mutex<Seen>>) -> std::net::SocketAddr {
    let p = workspace_root().join("agent/src/provider/fixtures/vertex-customjob-succeeded.json");
    let job: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("json");
    serve_http(move |r| {
        let token = r.header("authorization").and_then(|a| a.strip_prefix("Bearer ")).unwrap_or("");
        let mut s = seen.lock().expect("seen");
        match tokens.live(token) {
            Err(why) => {
                s.refused.push(why);
                let e = serde_json::json!({"error": {"code": 401, "message": "Request had invalid authentication credentials.", "status": "UNAUTHENTICATED"}});
                (401, "application/json", e.to_string())
            }
            Ok(()) => {
                s.ok += 1;
                if !s.tokens.iter().any(|t| t == token) {
                    s.tokens.push(token.to_string());
                }
                (200, "application/json", serde_json::json!({"customJobs": [job]}).to_string())
            }
        }
    })
}

fn adapter(endpoint: &str, dir: &std::path::Path, env: &[(&str, String)]) -> (ChildGuard, std::net::SocketAddr) {
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], startline_tests::free_port()));
    let mut cmd = Command::new(binary("startline-agent"));
    cmd.args(["--collector", "http://127.0.0.1:9", "vertex", "--interval", "1s", "--project", "ml-prod"])
        .args(["--location", "europe-west4", "--endpoint", endpoint, "--metrics-listen", &metrics.to_string()])
        .arg("--spool")
        .arg(dir.join("spool"));
    for k in ["VERTEX_ACCESS_TOKEN", "STARTLINE_TOKEN_COMMAND", "GOOGLE_APPLICATION_CREDENTIALS", "GCE_METADATA_HOST"] {
        cmd.env_remove(k);
    }
    // No gcloud file: an empty configuration directory.
    cmd.env("HOME", dir).env("CLOUDSDK_CONFIG", dir.join("gcloud"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let log = std::fs::File::create(dir.join("adapter.log")).expect("log");
    let guard = ChildGuard(cmd.stdout(Stdio::null()).stderr(log).spawn().expect("adapter"));
    wait_until("the adapter's metrics", Duration::from_secs(30), || std::net::TcpStream::connect(metrics).is_ok());
    (guard, metrics)
}

fn poll_errors(metrics: std::net::SocketAddr, kind: &str) -> Option<f64> {
    let text = startline_tests::http_get_text(metrics, "/metrics").1;
    startline_agent::metrics::sample(
        &text,
        "startline_agent_poll_errors_total",
        &[("provider", "vertex"), ("kind", kind)],
    )
}

fn expect_three_tokens(seen: &Arc<Mutex<Seen>>, metrics: std::net::SocketAddr, what: &str, dir: &std::path::Path) {
    wait_or_log(&format!("{what}: three successive tokens"), Duration::from_secs(90), &dir.join("adapter.log"), || {
        seen.lock().expect("seen").tokens.len() >= 3
    });
    let s = seen.lock().expect("seen");
    assert!(s.refused.is_empty(), "{what}: calls refused: {:?}", s.refused);
    assert!(s.ok >= 6, "{what}: {} calls", s.ok);
    for kind in ["credentials", "http_status", "transport"] {
        assert_eq!(poll_errors(metrics, kind), Some(0.0), "{what}: polls failed ({kind})");
    }
}

/// Waits for `cond`; on timeout fails with the adapter's log.
fn wait_or_log(what: &str, timeout: Duration, log: &std::path::Path, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + timeout;
    while !cond() {
        if std::time::Instant::now() > deadline {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let tail: String =
                text.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
            panic!("timed out waiting for {what}; the adapter's log ends:\n{tail}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn form(body: &[u8]) -> HashMap<String, String> {
    let dec = |s: &str| -> String {
        let b = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'%' if i + 2 < b.len() => {
                    out.push(
                        u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or(""), 16).unwrap_or(b'?'),
                    );
                    i += 3;
                }
                b'+' => {
                    out.push(b' ');
                    i += 1;
                }
                c => {
                    out.push(c);
                    i += 1;
                }
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    String::from_utf8_lossy(body)
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (dec(k), dec(v)))
        .collect()
}

fn b64url(s: &str) -> Vec<u8> {
    base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, s).unwrap_or_default()
}

fn token_answer(token: String) -> (u16, &'static str, String) {
    let v = serde_json::json!({"access_token": token, "expires_in": LIFE_S, "token_type": "Bearer"});
    (200, "application/json", v.to_string())
}

fn oauth_error() -> (u16, &'static str, String) {
    (
        400,
        "application/json",
        r#"{"error": "invalid_grant", "error_description": "Invalid JWT Signature."}"#.to_string(),
    )
}

/// Checks a service account's JWT bearer grant: the RS256 signature with the published public key (PKCS#1),
/// then the claims.
fn check_jwt_grant(r: &HttpRequest, public_der: &[u8], token_uri: &str) -> Result<(), String> {
    let f = form(&r.body);
    if f.get("grant_type").map(String::as_str) != Some("urn:ietf:params:oauth:grant-type:jwt-bearer") {
        return Err("grant_type".into());
    }
    let jwt = f.get("assertion").ok_or("no assertion")?;
    let (input, sig) = jwt.rsplit_once('.').ok_or("not a JWT")?;
    ring::signature::UnparsedPublicKey::new(&ring::signature::RSA_PKCS1_2048_8192_SHA256, public_der)
        .verify(input.as_bytes(), &b64url(sig))
        .map_err(|_| "bad signature")?;
    let (header, claims) = input.split_once('.').ok_or("no claims")?;
    let header: serde_json::Value = serde_json::from_slice(&b64url(header)).map_err(|e| e.to_string())?;
    let c: serde_json::Value = serde_json::from_slice(&b64url(claims)).map_err(|e| e.to_string())?;
    let now = startline_proto::time::now_ms() / 1000;
    let iat = c["iat"].as_i64().unwrap_or(0);
    let good = header["alg"] == "RS256"
        && header["kid"] == "1"
        && c["iss"] == "service-account@example.com"
        && c["aud"] == token_uri
        && c["scope"].as_str().is_some_and(|s| s.contains("https://www.googleapis.com/auth/cloud-platform"))
        && (iat - now).abs() <= 60
        && c["exp"].as_i64() == Some(iat + 3600);
    if good {
        Ok(())
    } else {
        Err(format!("claims {c} header {header}"))
    }
}

#[test]
fn vertex_service_account_key_tokens_are_verified_and_renewed_before_they_expire() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pem = fixture("privatekey.pub");
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let public = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, body).expect("public key");
    let tokens = Tokens::default();
    let issuer = tokens.clone();
    let bad = Arc::new(AtomicUsize::new(0));
    let bad_grants = bad.clone();
    let uri = Arc::new(Mutex::new(String::new()));
    let token_uri = uri.clone();
    let token_server = serve_http(move |r| {
        let expected = token_uri.lock().expect("uri").clone();
        match check_jwt_grant(r, &public, &expected) {
            Ok(()) => token_answer(issuer.issue("sa")),
            Err(_) => {
                bad_grants.fetch_add(1, Ordering::SeqCst);
                oauth_error()
            }
        }
    });
    *uri.lock().expect("uri") = format!("http://{token_server}/token");
    let mut key: serde_json::Value = serde_json::from_str(&fixture("service_account.json")).expect("key");
    key["token_uri"] = format!("http://{token_server}/token").into();
    let key_file = dir.path().join("key.json");
    std::fs::write(&key_file, key.to_string()).expect("key file");
    let seen = Arc::new(Mutex::new(Seen::default()));
    let api = vertex(tokens, seen.clone());
    let (_a, metrics) = adapter(
        &format!("http://{api}"),
        dir.path(),
        &[("GOOGLE_APPLICATION_CREDENTIALS", key_file.display().to_string())],
    );
    expect_three_tokens(&seen, metrics, "service account", dir.path());
    assert_eq!(bad.load(Ordering::SeqCst), 0, "every JWT verified");
}

#[test]
fn vertex_metadata_server_tokens_need_the_metadata_flavor_header_and_are_renewed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = Tokens::default();
    let issuer = tokens.clone();
    let flavorless = Arc::new(AtomicUsize::new(0));
    let refused = flavorless.clone();
    let metadata = serve_http(move |r| {
        if r.header("metadata-flavor") != Some("Google") {
            refused.fetch_add(1, Ordering::SeqCst);
            return (403, "text/html", "Missing required header: Metadata-Flavor".into());
        }
        match r.path.as_str() {
            "/computeMetadata/v1/instance/service-accounts/default/token" => token_answer(issuer.issue("gke")),
            _ => (404, "text/html", "Not Found".into()),
        }
    });
    let seen = Arc::new(Mutex::new(Seen::default()));
    let api = vertex(tokens, seen.clone());
    let (_a, metrics) = adapter(&format!("http://{api}"), dir.path(), &[("GCE_METADATA_HOST", metadata.to_string())]);
    expect_three_tokens(&seen, metrics, "metadata server", dir.path());
    assert_eq!(flavorless.load(Ordering::SeqCst), 0);
}

#[test]
fn vertex_authorized_user_and_external_account_files_exchange_their_tokens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = Tokens::default();
    let issuer = tokens.clone();
    let refused = Arc::new(Mutex::new(Vec::<String>::new()));
    let refusals = refused.clone();
    let sts_tokens = Tokens::default();
    let sts_issued = sts_tokens.clone();
    let server = serve_http(move |r| {
        let f = form(&r.body);
        let get = |k: &str| f.get(k).map(String::as_str).unwrap_or("");
        let audience = "//iam.googleapis.com/projects/123/locations/global/workloadIdentityPools/pool/providers/oidc";
        let impersonate =
            "/v1/projects/-/serviceAccounts/vertex-reader@ml-prod.iam.gserviceaccount.com:generateAccessToken";
        let sts = r.header("authorization").and_then(|a| a.strip_prefix("Bearer ")).unwrap_or("");
        let json: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
        match r.path.as_str() {
            // authorized_user: the refresh-token grant with the file's client.
            "/oauth2/token"
                if get("grant_type") == "refresh_token"
                    && get("client_id") == "123"
                    && get("client_secret") == "secret"
                    && get("refresh_token") == "alabalaportocala" =>
            {
                return token_answer(issuer.issue("user"));
            }
            // external_account: Google STS's token exchange with the file's audience and the subject token.
            "/v1/token"
                if get("grant_type") == "urn:ietf:params:oauth:grant-type:token-exchange"
                    && get("audience") == audience
                    && get("subject_token_type") == "urn:ietf:params:oauth:token-type:jwt"
                    && get("requested_token_type") == "urn:ietf:params:oauth:token-type:access_token"
                    && get("subject_token") == "HEADER.SIMULATED_JWT_PAYLOAD.SIGNATURE" =>
            {
                let t = sts_issued.issue("sts");
                let v = serde_json::json!({"access_token": t, "issued_token_type": "urn:ietf:params:oauth:token-type:access_token", "token_type": "Bearer", "expires_in": LIFE_S});
                return (200, "application/json", v.to_string());
            }
            // Impersonation: generateAccessToken with the STS token.
            p if p == impersonate
                && sts_issued.live(sts).is_ok()
                && json["scope"][0] == "https://www.googleapis.com/auth/cloud-platform" =>
            {
                let expire =
                    humantime::format_rfc3339_seconds(std::time::SystemTime::now() + Duration::from_secs(LIFE_S));
                let v =
                    serde_json::json!({"accessToken": issuer.issue("impersonated"), "expireTime": expire.to_string()});
                return (200, "application/json", v.to_string());
            }
            _ => {}
        }
        refusals.lock().expect("refused").push(format!("{} {:?}", r.path, f));
        oauth_error()
    });
    // authorized_user, as gcloud writes it, found in CLOUDSDK_CONFIG; its token_uri pointed at the local server.
    let mut user: serde_json::Value = serde_json::from_str(&fixture("authorized_user.json")).expect("user");
    user["token_uri"] = format!("http://{server}/oauth2/token").into();
    std::fs::create_dir_all(dir.path().join("gcloud")).expect("gcloud dir");
    std::fs::write(dir.path().join("gcloud/application_default_credentials.json"), user.to_string()).expect("user");
    let seen = Arc::new(Mutex::new(Seen::default()));
    let api = vertex(tokens.clone(), seen.clone());
    let (a, metrics) = adapter(&format!("http://{api}"), dir.path(), &[]);
    expect_three_tokens(&seen, metrics, "authorized user", dir.path());
    drop(a);

    // external_account: a file-sourced JSON subject token, exchanged, then impersonated.
    let subject = dir.path().join("subject.json");
    std::fs::write(&subject, fixture("external_subject_token.json")).expect("subject");
    let external = serde_json::json!({
        "type": "external_account",
        "audience": "//iam.googleapis.com/projects/123/locations/global/workloadIdentityPools/pool/providers/oidc",
        "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        "token_url": format!("http://{server}/v1/token"),
        "service_account_impersonation_url": format!("http://{server}/v1/projects/-/serviceAccounts/vertex-reader@ml-prod.iam.gserviceaccount.com:generateAccessToken"),
        "credential_source": {"file": subject.display().to_string(), "format": {"type": "json", "subject_token_field_name": "access_token"}}
    });
    let file = dir.path().join("external.json");
    std::fs::write(&file, external.to_string()).expect("external");
    let seen = Arc::new(Mutex::new(Seen::default()));
    let api = vertex(tokens, seen.clone());
    let spool2 = dir.path().join("second");
    std::fs::create_dir_all(&spool2).expect("dir");
    let (_b, metrics) =
        adapter(&format!("http://{api}"), &spool2, &[("GOOGLE_APPLICATION_CREDENTIALS", file.display().to_string())]);
    expect_three_tokens(&seen, metrics, "external account", &spool2);
    assert!(refused.lock().expect("refused").is_empty(), "{:?}", refused.lock().expect("refused"));
}
