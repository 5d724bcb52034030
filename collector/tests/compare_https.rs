//! `startline-collector compare` as a client of an HTTPS API with a bearer token: the real binary against a
//! small local HTTPS server (rustls, a certificate made here with rcgen) that answers like the collector's
//! `/api/v1/compare` when the token is right, 401 without one and 403 for a token without the read scope. The
//! token never appears in what the command prints.

use std::path::Path;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GOOD: &str = "tok-read-0123456789";
const NO_READ: &str = "tok-ingest-only-987";

/// Serves HTTPS on a free port; returns the address and the request heads seen.
async fn api_server(dir: &Path) -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).expect("cert");
    std::fs::write(dir.join("ca.pem"), ck.cert.pem()).expect("write ca");
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
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, seen) = (acceptor.clone(), seen.clone());
            tokio::spawn(async move {
                let Ok(mut s) = acceptor.accept(tcp).await else { return };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let head = loop {
                    let Ok(n) = s.read(&mut chunk).await else { return };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some((head, _)) = text.split_once("\r\n\r\n") {
                        break head.to_string();
                    }
                };
                seen.lock().expect("lock").push(head.clone());
                let auth = head
                    .lines()
                    .find_map(|l| l.strip_prefix("authorization: ").or_else(|| l.strip_prefix("Authorization: ")))
                    .map(str::to_string);
                let (status, body) = match auth.as_deref() {
                    Some(a) if a == format!("Bearer {GOOD}") => (
                        "200 OK",
                        r#"{"left":"pool_kind=managed","right":"pool_kind=dedicated","window_seconds":2592000,"groups":[]}"#
                            .to_string(),
                    ),
                    Some(a) if a == format!("Bearer {NO_READ}") => {
                        ("403 Forbidden", r#"{"error":"permission_denied","message":"needs scope read"}"#.into())
                    }
                    _ => ("401 Unauthorized", r#"{"error":"unauthenticated","message":"a token is required"}"#.into()),
                };
                let answer = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    (addr, heads)
}

/// Runs `compare` with `args` (and a clean environment for the STARTLINE_* variables); status, stdout, stderr.
async fn compare(args: Vec<String>, env: Vec<(&'static str, String)>) -> (bool, String, String) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_startline-collector"));
    cmd.arg("compare").args(args).arg("--format").arg("json");
    for v in ["STARTLINE_TOKEN", "STARTLINE_TOKEN_FILE", "STARTLINE_CA_FILE", "STARTLINE_API", "STARTLINE_CONFIG"] {
        cmd.env_remove(v);
    }
    cmd.envs(env);
    let out = cmd.output().await.expect("compare runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn compare_reads_an_https_api_with_a_token_and_explains_401_and_403() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (addr, heads) = api_server(dir.path()).await;
    let api = format!("https://127.0.0.1:{}", addr.port());
    let ca = dir.path().join("ca.pem").display().to_string();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{GOOD}\n")).expect("write token");

    // Token from a file, CA from a flag.
    let (ok, out, err) = compare(
        vec![
            "--api".into(),
            api.clone(),
            "--ca-file".into(),
            ca.clone(),
            "--token-file".into(),
            token_file.display().to_string(),
        ],
        vec![],
    )
    .await;
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["left"], "pool_kind=managed");
    let head = heads.lock().expect("lock").last().cloned().expect("a request");
    assert!(head.starts_with("GET /api/v1/compare?left=pool_kind%3Dmanaged&right=pool_kind%3Ddedicated"), "{head}");

    // Token and CA from the environment.
    let (ok, _, err) = compare(
        vec!["--api".into(), api.clone()],
        vec![("STARTLINE_TOKEN", GOOD.into()), ("STARTLINE_CA_FILE", ca.clone())],
    )
    .await;
    assert!(ok, "{err}");

    // No token: 401, with what to do.
    let (ok, _, err) = compare(vec!["--api".into(), api.clone(), "--ca-file".into(), ca.clone()], vec![]).await;
    assert!(!ok);
    assert!(err.contains("requires a token (401 Unauthorized)") && err.contains("--token-file"), "{err}");

    // A token without the read scope: 403, and the token is not printed.
    let (ok, out, err) = compare(
        vec!["--api".into(), api.clone(), "--ca-file".into(), ca.clone(), "--token".into(), NO_READ.into()],
        vec![],
    )
    .await;
    assert!(!ok);
    assert!(err.contains("not permitted to read (403 Forbidden)"), "{err}");
    assert!(!err.contains(NO_READ) && !out.contains(NO_READ), "{err}");

    // A wrong token: 401, not printed either.
    let (ok, _, err) = compare(
        vec!["--api".into(), api.clone(), "--ca-file".into(), ca.clone(), "--token".into(), "wrong-secret-x".into()],
        vec![],
    )
    .await;
    assert!(!ok);
    assert!(err.contains("refused the token (401 Unauthorized)") && !err.contains("wrong-secret-x"), "{err}");

    // Without the CA file the self-signed certificate is not trusted.
    let (ok, _, err) = compare(vec!["--api".into(), api.clone(), "--token".into(), GOOD.into()], vec![]).await;
    assert!(!ok);
    assert!(err.contains("cannot reach") && err.contains("certificate"), "{err}");
    assert!(!err.contains(GOOD), "{err}");
}
