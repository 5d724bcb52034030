//! The SageMaker adapter's AWS credentials, resolved by the AWS SDK's own chain (`aws-config`) from each source a
//! deployment uses, against local servers speaking each source's documented protocol (no AWS here; payload shapes
//! from the SDK's recorded traffic, `tests/fixtures/aws`). The SDK is pointed at them the documented way:
//! `AWS_ENDPOINT_URL_STS` (web identity, EKS IRSA), `AWS_CONTAINER_CREDENTIALS_FULL_URI` with
//! `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE` (EKS Pod Identity) and `AWS_EC2_METADATA_SERVICE_ENDPOINT` (IMDSv2).
//!
//! Every credential the servers hand out expires 12 seconds later. The local SageMaker server checks every call's
//! SigV4 signature with AWS's own signer (`aws-sigv4`) and the secret of the access key it names, refuses keys
//! that are unknown or expired (`ExpiredTokenException`), and records which key signed; each test runs until the
//! adapter has signed with three successive keys, and asserts that no signature was wrong, no call used expired
//! credentials and no poll failed: the adapter renews before expiry, without a restart.

use startline_tests::{
    binary, serve_http, serve_http_with_headers, wait_until, workspace_root, ChildGuard, HttpRequest,
};
use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// How long each handed-out credential lives.
const LIFE: Duration = Duration::from_secs(12);

fn fixture(name: &str) -> String {
    std::fs::read_to_string(workspace_root().join("tests/fixtures/aws").join(name)).expect("fixture")
}

fn sagemaker_fixture(name: &str) -> serde_json::Value {
    let p = workspace_root().join("agent/src/provider/fixtures").join(name);
    serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("json")
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// One issued credential.
#[derive(Clone)]
struct Issued {
    secret: String,
    token: String,
    expires: SystemTime,
}

/// The credentials a source handed out, by access key id, numbered in order.
#[derive(Clone, Default)]
struct Issuer(Arc<Mutex<Vec<(String, Issued)>>>);

impl Issuer {
    /// A new credential for `source`: (access key, secret, session token, expiry).
    fn issue(&self, source: &str) -> (String, Issued) {
        let mut all = self.0.lock().expect("issuer");
        let n = all.len() + 1;
        let key = format!("ASIA{}{n:04}", source.to_ascii_uppercase());
        let issued = Issued {
            secret: format!("{source}-secret-{n}"),
            token: format!("{source}-session-{n}"),
            expires: SystemTime::now() + LIFE,
        };
        all.push((key.clone(), issued.clone()));
        (key, issued)
    }

    fn get(&self, key: &str) -> Option<Issued> {
        self.0.lock().expect("issuer").iter().find(|(k, _)| k == key).map(|(_, i)| i.clone())
    }
}

/// What the SageMaker server saw.
#[derive(Default)]
struct Seen {
    /// Calls whose signature verified, by access key, in order of first use.
    keys: Vec<String>,
    verified: usize,
    /// Calls refused: why.
    refused: Vec<String>,
}

fn header_value<'a>(r: &'a HttpRequest, name: &str) -> &'a str {
    r.header(name).unwrap_or("")
}

/// Checks `r`'s SigV4 signature with `aws-sigv4` (AWS's signer) and the issued secret; Err says why not.
fn verify(r: &HttpRequest, issuer: &Issuer) -> Result<String, String> {
    let auth = header_value(r, "authorization");
    let cred = auth.split("Credential=").nth(1).and_then(|c| c.split('/').next()).ok_or("no Credential")?;
    let issued = issuer.get(cred).ok_or_else(|| format!("unknown access key {cred}"))?;
    if SystemTime::now() > issued.expires {
        return Err(format!("expired access key {cred}"));
    }
    if header_value(r, "x-amz-security-token") != issued.token {
        return Err(format!("wrong session token for {cred}"));
    }
    let signed: Vec<&str> = auth
        .split("SignedHeaders=")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .ok_or("no SignedHeaders")?
        .split(';')
        .collect();
    let date = header_value(r, "x-amz-date");
    let time = humantime::parse_rfc3339(&format!(
        "{}-{}-{}T{}:{}:{}Z",
        date.get(0..4).unwrap_or(""),
        date.get(4..6).unwrap_or(""),
        date.get(6..8).unwrap_or(""),
        date.get(9..11).unwrap_or(""),
        date.get(11..13).unwrap_or(""),
        date.get(13..15).unwrap_or("")
    ))
    .map_err(|e| format!("x-amz-date {date:?}: {e}"))?;
    // aws-sigv4 adds x-amz-date and x-amz-security-token itself; the request's other signed headers go in.
    let headers: Vec<(&str, &str)> = signed
        .iter()
        .filter(|h| !matches!(**h, "x-amz-date" | "x-amz-security-token"))
        .map(|h| (*h, header_value(r, h)))
        .collect();
    let identity = aws_credential_types::Credentials::new(
        cred,
        issued.secret.clone(),
        Some(issued.token.clone()),
        Some(issued.expires),
        "test",
    )
    .into();
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name("sagemaker")
        .time(time)
        .settings(aws_sigv4::http_request::SigningSettings::default())
        .build()
        .map_err(|e| e.to_string())?
        .into();
    let uri = format!("http://{}{}", header_value(r, "host"), r.path);
    let request = aws_sigv4::http_request::SignableRequest::new(
        &r.method,
        uri,
        headers.into_iter(),
        aws_sigv4::http_request::SignableBody::Bytes(&r.body),
    )
    .map_err(|e| e.to_string())?;
    let expected = aws_sigv4::http_request::sign(request, &params).map_err(|e| e.to_string())?;
    let got = auth.split("Signature=").nth(1).unwrap_or("");
    if got != expected.signature() {
        return Err(format!("bad signature from {cred}"));
    }
    Ok(cred.to_string())
}

/// A SageMaker API that answers the completed fixture job to calls signed with a live issued key.
fn sagemaker(issuer: Issuer, seen: Arc<Mutex<Seen>>) -> std::net::SocketAddr {
    let job = sagemaker_fixture("sagemaker-describe-completed.json");
    serve_http(move |r| match verify(r, &issuer) {
        Err(why) => {
            seen.lock().expect("seen").refused.push(why.clone());
            let code = if why.starts_with("expired") { "ExpiredTokenException" } else { "InvalidSignatureException" };
            (403, "application/x-amz-json-1.1", serde_json::json!({"__type": code, "message": why}).to_string())
        }
        Ok(key) => {
            let mut s = seen.lock().expect("seen");
            s.verified += 1;
            if !s.keys.contains(&key) {
                s.keys.push(key);
            }
            let answer = match header_value(r, "x-amz-target") {
                "SageMaker.ListTrainingJobs" => serde_json::json!({"TrainingJobSummaries": [
                    {"TrainingJobName": job["TrainingJobName"], "TrainingJobStatus": "Completed", "CreationTime": job["CreationTime"]}
                ]}),
                _ => job.clone(),
            };
            (200, "application/x-amz-json-1.1", answer.to_string())
        }
    })
}

/// The adapter with only `env` as its AWS configuration (no keys, no profile files, no instance metadata unless
/// given), serving its metrics on a free port.
fn adapter(endpoint: &str, dir: &std::path::Path, env: &[(&str, String)]) -> (ChildGuard, std::net::SocketAddr) {
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], startline_tests::free_port()));
    let mut cmd = Command::new(binary("startline-agent"));
    cmd.args(["--collector", "http://127.0.0.1:9", "sagemaker", "--interval", "1s", "--region", "us-east-1"])
        .args(["--metrics-listen", &metrics.to_string(), "--endpoint", endpoint, "--namespace", "123456789012"])
        .arg("--spool")
        .arg(dir.join("spool"));
    for k in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
        "AWS_EC2_METADATA_SERVICE_ENDPOINT",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_STS",
    ] {
        cmd.env_remove(k);
    }
    cmd.env("HOME", dir)
        .env("AWS_CONFIG_FILE", dir.join("no-config"))
        .env("AWS_SHARED_CREDENTIALS_FILE", dir.join("no-credentials"))
        .env("AWS_EC2_METADATA_DISABLED", "true");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let log = std::fs::File::create(dir.join("adapter.log")).expect("log");
    let child = cmd.stdout(Stdio::null()).stderr(log).spawn().expect("adapter");
    let guard = ChildGuard(child);
    wait_until("the adapter's metrics", Duration::from_secs(30), || std::net::TcpStream::connect(metrics).is_ok());
    (guard, metrics)
}

fn poll_errors(metrics: std::net::SocketAddr, kind: &str) -> Option<f64> {
    let text = startline_tests::http_get_text(metrics, "/metrics").1;
    startline_agent::metrics::sample(
        &text,
        "startline_agent_poll_errors_total",
        &[("provider", "sagemaker"), ("kind", kind)],
    )
}

/// Runs until the SageMaker server saw three keys; then checks that every call verified and no poll failed.
fn expect_three_rotations(seen: &Arc<Mutex<Seen>>, metrics: std::net::SocketAddr, what: &str, dir: &std::path::Path) {
    wait_or_log(&format!("{what}: three successive keys"), Duration::from_secs(90), &dir.join("adapter.log"), || {
        seen.lock().expect("seen").keys.len() >= 3
    });
    let s = seen.lock().expect("seen");
    assert!(s.refused.is_empty(), "{what}: calls refused: {:?}", s.refused);
    assert!(s.verified >= 6, "{what}: {} calls", s.verified);
    for kind in ["credentials", "http_status", "transport"] {
        assert_eq!(poll_errors(metrics, kind), Some(0.0), "{what}: polls failed ({kind})");
    }
}

/// EKS IRSA: the projected token file and the role go to STS `AssumeRoleWithWebIdentity` (the local STS checks
/// the action, the role, the session name and that the token is the file's), whose XML answer carries
/// credentials valid for 12 s.
#[test]
fn sagemaker_web_identity_credentials_are_renewed_through_sts_before_they_expire() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("token.jwt");
    // As the kubelet writes a projected token: the JWT alone, no newline.
    std::fs::write(&token_file, fixture("web-identity-token.jwt").trim()).expect("token");
    let issuer = Issuer::default();
    let sts_issuer = issuer.clone();
    let template = fixture("sts-assume-role-with-web-identity.xml");
    let expected_token = fixture("web-identity-token.jwt").trim().to_string();
    let sts_calls = Arc::new(AtomicUsize::new(0));
    let calls = sts_calls.clone();
    let sts = serve_http(move |r| {
        calls.fetch_add(1, Ordering::SeqCst);
        let form: HashMap<String, String> = url_form(&r.body);
        let get = |k: &str| form.get(k).map(String::as_str).unwrap_or("");
        let ok = r.method == "POST"
            && get("Action") == "AssumeRoleWithWebIdentity"
            && get("Version") == "2011-06-15"
            && get("RoleArn") == "arn:aws:iam::123456789012:role/startline-sagemaker-reader"
            && get("RoleSessionName") == "startline"
            && get("WebIdentityToken") == expected_token;
        if !ok {
            let e = format!("<ErrorResponse><Error><Type>Sender</Type><Code>InvalidIdentityToken</Code><Message>refused: {form:?}</Message></Error></ErrorResponse>");
            return (400, "text/xml", e);
        }
        let (key, i) = sts_issuer.issue("sts");
        let xml = template
            .replace("<AccessKeyId>AKIDTEST</AccessKeyId>", &format!("<AccessKeyId>{key}</AccessKeyId>"))
            .replace(
                "<SecretAccessKey>SECRETKEYTEST</SecretAccessKey>",
                &format!("<SecretAccessKey>{}</SecretAccessKey>", i.secret),
            )
            .replace(
                "<SessionToken>SESSIONTOKEN_TEST</SessionToken>",
                &format!("<SessionToken>{}</SessionToken>", i.token),
            )
            .replace(
                "<Expiration>2021-08-16T20:52:53Z</Expiration>",
                &format!("<Expiration>{}</Expiration>", rfc3339(i.expires)),
            );
        (200, "text/xml", xml)
    });
    let seen = Arc::new(Mutex::new(Seen::default()));
    let api = sagemaker(issuer, seen.clone());
    let (_adapter, metrics) = adapter(
        &format!("http://{api}"),
        dir.path(),
        &[
            ("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/startline-sagemaker-reader".into()),
            ("AWS_WEB_IDENTITY_TOKEN_FILE", token_file.display().to_string()),
            ("AWS_ROLE_SESSION_NAME", "startline".into()),
            ("AWS_ENDPOINT_URL_STS", format!("http://{sts}")),
        ],
    );
    expect_three_rotations(&seen, metrics, "web identity", dir.path());
    assert!(sts_calls.load(Ordering::SeqCst) >= 3);
}

/// EKS Pod Identity: `AWS_CONTAINER_CREDENTIALS_FULL_URI` with the authorization token read from
/// `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE`. The token file is rotated during the test and the endpoint then
/// accepts only the new token, so the adapter must read the file again for each fetch.
#[test]
fn sagemaker_pod_identity_credentials_follow_a_rotated_authorization_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("eks-pod-identity-token");
    std::fs::write(&token_file, "pod-identity-token-1").expect("token");
    let current = Arc::new(Mutex::new("pod-identity-token-1".to_string()));
    let issuer = Issuer::default();
    let (endpoint_issuer, endpoint_token) = (issuer.clone(), current.clone());
    let template: serde_json::Value = serde_json::from_str(&fixture("container-credentials.json")).expect("json");
    let refused_auth = Arc::new(AtomicUsize::new(0));
    let refused = refused_auth.clone();
    let endpoint = serve_http(move |r| {
        if r.path != "/v1/credentials" || header_value(r, "authorization") != *endpoint_token.lock().expect("token") {
            refused.fetch_add(1, Ordering::SeqCst);
            return (401, "application/json", r#"{"Message":"invalid authorization token"}"#.to_string());
        }
        let (key, i) = endpoint_issuer.issue("pod");
        let mut v = template.clone();
        v["AccessKeyId"] = key.into();
        v["SecretAccessKey"] = i.secret.into();
        v["Token"] = i.token.into();
        v["Expiration"] = rfc3339(i.expires).into();
        (200, "application/json", v.to_string())
    });
    let seen = Arc::new(Mutex::new(Seen::default()));
    let api = sagemaker(issuer, seen.clone());
    let (_adapter, metrics) = adapter(
        &format!("http://{api}"),
        dir.path(),
        &[
            ("AWS_CONTAINER_CREDENTIALS_FULL_URI", format!("http://{endpoint}/v1/credentials")),
            ("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", token_file.display().to_string()),
        ],
    );
    wait_or_log("the first key", Duration::from_secs(60), &dir.path().join("adapter.log"), || {
        !seen.lock().expect("seen").keys.is_empty()
    });
    // The kubelet rotates the projected token: the file changes, the old token stops working.
    std::fs::write(&token_file, "pod-identity-token-2").expect("rotate");
    *current.lock().expect("token") = "pod-identity-token-2".into();
    expect_three_rotations(&seen, metrics, "pod identity", dir.path());
    assert_eq!(refused_auth.load(Ordering::SeqCst), 0, "every fetch carried the file's current token");
}

/// EC2 IMDSv2: a session token from `PUT /latest/api/token` first (the server refuses any GET without a token it
/// issued, and the token request without its TTL header), then the role name, then the role's credentials. The
/// metadata service fails (500) for the first seconds: the adapter's polls fail with kind `credentials`, it keeps
/// running, and once the service answers it signs with the role's credentials.
#[test]
fn sagemaker_instance_role_credentials_come_from_imdsv2_and_a_failing_source_is_retried() {
    let dir = tempfile::tempdir().expect("tempdir");
    let issuer = Issuer::default();
    let imds_issuer = issuer.clone();
    let template: serde_json::Value = serde_json::from_str(&fixture("imds-security-credentials.json")).expect("json");
    let failing = Arc::new(AtomicBool::new(true));
    let down = failing.clone();
    let sessions = Arc::new(Mutex::new(Vec::<String>::new()));
    let (issued_sessions, refused) = (sessions.clone(), Arc::new(AtomicUsize::new(0)));
    let refused_gets = refused.clone();
    // IMDS answers in text with the token's TTL in a header, as EC2 does.
    let ttl = || vec![("x-aws-ec2-metadata-token-ttl-seconds".to_string(), "21600".to_string())];
    let imds = serve_http_with_headers(move |r| {
        if down.load(Ordering::SeqCst) {
            return (500, "text/plain", Vec::new(), "Internal Server Error".into());
        }
        if r.method == "PUT" && r.path == "/latest/api/token" {
            if r.header("x-aws-ec2-metadata-token-ttl-seconds").is_none() {
                return (400, "text/plain", Vec::new(), "missing TTL".into());
            }
            let mut s = issued_sessions.lock().expect("sessions");
            let t = format!("AQAEA-session-{}", s.len() + 1);
            s.push(t.clone());
            return (200, "text/plain", ttl(), t);
        }
        let session = header_value(r, "x-aws-ec2-metadata-token");
        if !issued_sessions.lock().expect("sessions").iter().any(|t| t == session) {
            refused_gets.fetch_add(1, Ordering::SeqCst);
            return (401, "text/plain", Vec::new(), "Unauthorized".into());
        }
        match r.path.as_str() {
            "/latest/meta-data/iam/security-credentials/" => {
                (200, "text/plain", ttl(), "startline-sagemaker-reader".into())
            }
            "/latest/meta-data/iam/security-credentials/startline-sagemaker-reader" => {
                let (key, i) = imds_issuer.issue("imds");
                let mut v = template.clone();
                v["AccessKeyId"] = key.into();
                v["SecretAccessKey"] = i.secret.into();
                v["Token"] = i.token.into();
                v["LastUpdated"] = rfc3339(SystemTime::now()).into();
                v["Expiration"] = rfc3339(i.expires).into();
                (200, "text/plain", ttl(), v.to_string())
            }
            _ => (404, "text/plain", Vec::new(), "Not Found".into()),
        }
    });
    let seen = Arc::new(Mutex::new(Seen::default()));
    let api = sagemaker(issuer, seen.clone());
    let (mut adapter, metrics) = adapter(
        &format!("http://{api}"),
        dir.path(),
        &[
            ("AWS_EC2_METADATA_DISABLED", "false".into()),
            ("AWS_EC2_METADATA_SERVICE_ENDPOINT", format!("http://{imds}")),
        ],
    );
    wait_or_log("polls failing on credentials", Duration::from_secs(60), &dir.path().join("adapter.log"), || {
        poll_errors(metrics, "credentials").is_some_and(|n| n >= 2.0)
    });
    assert!(adapter.0.try_wait().expect("wait").is_none(), "the adapter keeps running");
    assert!(seen.lock().expect("seen").verified == 0, "nothing was signed without credentials");
    failing.store(false, Ordering::SeqCst);
    let failed_before = poll_errors(metrics, "credentials").unwrap_or(0.0);
    wait_or_log("the instance role's three keys", Duration::from_secs(90), &dir.path().join("adapter.log"), || {
        seen.lock().expect("seen").keys.len() >= 3
    });
    let s = seen.lock().expect("seen");
    assert!(s.refused.is_empty(), "calls refused: {:?}", s.refused);
    assert!(poll_errors(metrics, "credentials").unwrap_or(0.0) <= failed_before + 1.0, "polls work again");
    assert_eq!(refused.load(Ordering::SeqCst), 0, "every metadata GET carried a session token");
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

/// `application/x-www-form-urlencoded` pairs.
fn url_form(body: &[u8]) -> HashMap<String, String> {
    let dec = |s: &str| -> String {
        let b = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'%' if i + 2 < b.len() => {
                    let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                    out.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
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
