//! Microsoft Entra credentials against a local server speaking the documented token protocols (no Azure here):
//! workload identity (the client-credentials grant with the federated token file as a JWT client assertion, the
//! file re-read for every token so a rotated projected token is used) and managed identity (the instance metadata
//! service, which refuses requests without `Metadata: true`). Tokens live 2 seconds; the ARM listing accepts only
//! live tokens, so the client must renew before expiry without a failed call.

use super::*;
use std::sync::{Arc, Mutex};

/// Issued tokens (token, expiry) and refusals (why).
#[derive(Clone, Default)]
struct Entra {
    issued: Arc<Mutex<Vec<(String, std::time::Instant)>>>,
    used: Arc<Mutex<Vec<String>>>,
    refused: Arc<Mutex<Vec<String>>>,
    assertion: Arc<Mutex<String>>,
}

impl Entra {
    fn issue(&self) -> Value {
        let mut all = self.issued.lock().expect("issued");
        let t = format!("eyJ0eXAi.entra-{}", all.len() + 1);
        all.push((t.clone(), std::time::Instant::now() + std::time::Duration::from_secs(2)));
        serde_json::json!({"token_type": "Bearer", "expires_in": 2, "ext_expires_in": 2, "access_token": t})
    }

    fn refuse(&self, why: String) -> axum::response::Response {
        use axum::response::IntoResponse;
        self.refused.lock().expect("refused").push(why);
        let e = serde_json::json!({"error": "invalid_client", "error_description": "AADSTS700016"});
        (axum::http::StatusCode::UNAUTHORIZED, axum::Json(e)).into_response()
    }
}

fn form_pairs(body: &str) -> HashMap<String, String> {
    let dec = |s: &str| {
        let mut out = Vec::new();
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'%' if i + 2 < b.len() => {
                    out.push(u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or(""), 16).unwrap_or(0));
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
    body.split('&').filter_map(|kv| kv.split_once('=')).map(|(k, v)| (dec(k), dec(v))).collect()
}

async fn server(entra: Entra) -> std::net::SocketAddr {
    use axum::response::IntoResponse;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = axum::Router::new().fallback(
        move |method: axum::http::Method, uri: axum::http::Uri, headers: axum::http::HeaderMap, body: String| {
            let entra = entra.clone();
            async move {
                let path = uri.path().to_string();
                let q = form_pairs(uri.query().unwrap_or(""));
                if path == "/tenant-1/oauth2/v2.0/token" && method == axum::http::Method::POST {
                    let f = form_pairs(&body);
                    let get = |k: &str| f.get(k).map(String::as_str).unwrap_or("");
                    let expected = entra.assertion.lock().expect("assertion").clone();
                    if get("grant_type") != "client_credentials"
                        || get("client_id") != "client-1"
                        || get("client_assertion_type") != "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
                        || get("client_assertion") != expected
                        || get("scope") != "https://management.azure.com/.default"
                    {
                        return entra.refuse(format!("bad grant {f:?}"));
                    }
                    return axum::Json(entra.issue()).into_response();
                }
                if path == "/metadata/identity/oauth2/token" {
                    if headers.get("metadata").and_then(|v| v.to_str().ok()) != Some("true")
                        || q.get("resource").map(String::as_str) != Some("https://management.azure.com/")
                        || !q.contains_key("api-version")
                    {
                        return entra.refuse(format!("bad IMDS request {q:?}"));
                    }
                    return axum::Json(entra.issue()).into_response();
                }
                let token = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|a| a.strip_prefix("Bearer "))
                    .unwrap_or("")
                    .to_string();
                let live = entra
                    .issued
                    .lock()
                    .expect("issued")
                    .iter()
                    .any(|(t, exp)| *t == token && std::time::Instant::now() < *exp);
                if !live {
                    return entra.refuse(format!("ARM call with a dead token {token:?}"));
                }
                let mut used = entra.used.lock().expect("used");
                if !used.contains(&token) {
                    used.push(token);
                }
                axum::Json(serde_json::json!({"value": []})).into_response()
            }
        },
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

fn ws() -> Workspace {
    Workspace { subscription: "sub-1".into(), resource_group: "ml-rg".into(), workspace: "ml-ws".into() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_identity_reads_the_rotated_federated_token_and_renews_before_expiry() {
    let entra = Entra::default();
    let addr = server(entra.clone()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("azure-identity-token");
    std::fs::write(&file, "federated-token-1\n").expect("token file");
    *entra.assertion.lock().expect("assertion") = "federated-token-1".into();
    let credential = Credential::WorkloadIdentity {
        authority: format!("http://{addr}"),
        tenant: "tenant-1".into(),
        client_id: "client-1".into(),
        token_file: file.clone(),
    };
    let client = Client::new(&format!("http://{addr}"), None, &ws(), credential).expect("client");
    let started = std::time::Instant::now();
    let mut rotated = false;
    while started.elapsed() < std::time::Duration::from_millis(5_500) {
        if !rotated && started.elapsed() > std::time::Duration::from_secs(2) {
            // The kubelet rotates the projected token; Entra accepts only the new one from now on.
            std::fs::write(&file, "federated-token-2\n").expect("rotate");
            *entra.assertion.lock().expect("assertion") = "federated-token-2".into();
            rotated = true;
        }
        client.list(0).await.expect("every listing succeeds");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(entra.refused.lock().expect("refused").is_empty(), "{:?}", entra.refused.lock().expect("refused"));
    let used = entra.used.lock().expect("used").len();
    assert!(used >= 3, "tokens used: {used}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_identity_asks_imds_with_the_metadata_header_and_renews_before_expiry() {
    let entra = Entra::default();
    let addr = server(entra.clone()).await;
    let credential = Credential::ManagedIdentity { endpoint: format!("http://{addr}"), client_id: None };
    let client = Client::new(&format!("http://{addr}"), None, &ws(), credential).expect("client");
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_millis(4_500) {
        client.list(0).await.expect("every listing succeeds");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(entra.refused.lock().expect("refused").is_empty(), "{:?}", entra.refused.lock().expect("refused"));
    assert!(entra.used.lock().expect("used").len() >= 2);
}
