//! Google access tokens for the Vertex AI adapter: Application Default Credentials as Google's client libraries
//! find them, plus the adapter's own fixed token and token command; each token is cached and fetched again
//! shortly before it expires ([`super::renew_after`]).
//!
//! Application Default Credentials, in Google's order:
//! 1. `GOOGLE_APPLICATION_CREDENTIALS`: a JSON credentials file;
//! 2. the gcloud file `application_default_credentials.json` in `CLOUDSDK_CONFIG`, else `~/.config/gcloud`
//!    (written by `gcloud auth application-default login`);
//! 3. the metadata server of GCE, GKE (workload identity), Cloud Run...: `GET
//!    http://<GCE_METADATA_HOST or metadata.google.internal>/computeMetadata/v1/instance/service-accounts/default/token`
//!    with `Metadata-Flavor: Google`.
//!
//! Credentials files by `type`:
//! - `service_account` (a key file): a JWT (RS256, signed with the file's `private_key`, PKCS#8 or PKCS#1 PEM;
//!   `iss` the `client_email`, `aud` the `token_uri`, the `cloud-platform` scope, one hour) exchanged at the file's
//!   `token_uri` (grant `urn:ietf:params:oauth:grant-type:jwt-bearer`);
//! - `authorized_user` (gcloud's user login): its `refresh_token` exchanged at `token_uri` (default
//!   `https://oauth2.googleapis.com/token`, grant `refresh_token`);
//! - `external_account` (workload identity federation): the subject token read from `credential_source.file` or
//!   fetched from `credential_source.url` (text, or the JSON field `format.subject_token_field_name`), exchanged
//!   at `token_url` (Google STS, grant `urn:ietf:params:oauth:grant-type:token-exchange`), then, when the file
//!   has a `service_account_impersonation_url`, exchanged again there for the service account's token.
//!   AWS-sourced and executable-sourced subject tokens are not built.
//!
//! A failure is a [`PollErrorKind::Credentials`] error naming the source and the answer; the next poll tries again.

use super::PollError;
use crate::auth::Secret;
use crate::metrics::PollErrorKind;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The scope asked for: Vertex AI's REST API accepts `cloud-platform`.
pub const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// Google's OAuth 2.0 token endpoint (authorized_user files without a `token_uri`).
pub const GOOGLE_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";
/// The metadata server's host when `GCE_METADATA_HOST` is not set.
pub const METADATA_HOST: &str = "metadata.google.internal";

/// A service account key (`type: service_account`).
pub struct ServiceAccount {
    client_email: String,
    key_id: String,
    token_uri: String,
    key: ring::signature::RsaKeyPair,
}

impl std::fmt::Debug for ServiceAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccount")
            .field("client_email", &self.client_email)
            .field("token_uri", &self.token_uri)
            .finish_non_exhaustive()
    }
}

/// Where the subject token of an `external_account` comes from.
#[derive(Debug, Clone)]
pub enum SubjectSource {
    /// A file, read again for each exchange (a projected token is rotated in place).
    File(PathBuf),
    /// A URL, with these headers.
    Url(String, Vec<(String, String)>),
}

/// An `external_account` file (workload identity federation).
#[derive(Debug, Clone)]
pub struct ExternalAccount {
    audience: String,
    subject_token_type: String,
    token_url: String,
    source: SubjectSource,
    /// None: the token is text; Some(field): a JSON object's field.
    json_field: Option<String>,
    impersonation_url: Option<String>,
}

/// Where access tokens come from.
#[derive(Debug)]
pub enum Source {
    /// A fixed token (`VERTEX_ACCESS_TOKEN`; tests and short runs): never renewed.
    Static(Secret),
    /// A command printing a token (`--token-command`), run again before each poll.
    Command(Vec<String>),
    /// A service account key file.
    ServiceAccount(Box<ServiceAccount>),
    /// A user's refresh token.
    AuthorizedUser {
        /// OAuth client id.
        client_id: String,
        /// OAuth client secret.
        client_secret: Secret,
        /// The refresh token.
        refresh_token: Secret,
        /// Token endpoint.
        token_uri: String,
    },
    /// Workload identity federation.
    ExternalAccount(Box<ExternalAccount>),
    /// The metadata server at this host (`host[:port]`).
    Metadata(String),
}

impl Source {
    /// A short name for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Source::Static(_) => "fixed token",
            Source::Command(_) => "token command",
            Source::ServiceAccount(_) => "service account key",
            Source::AuthorizedUser { .. } => "authorized user",
            Source::ExternalAccount(_) => "external account",
            Source::Metadata(_) => "metadata server",
        }
    }

    /// Application Default Credentials from `env`: `GOOGLE_APPLICATION_CREDENTIALS`, else gcloud's file (if it
    /// exists), else the metadata server. A credentials file that cannot be read or used is an error (not a
    /// silent fall-through to the next source).
    pub fn application_default(env: &HashMap<String, String>) -> Result<Source, String> {
        let get = |k: &str| env.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
        if let Some(p) = get("GOOGLE_APPLICATION_CREDENTIALS") {
            return Source::from_file(Path::new(p)).map_err(|e| format!("GOOGLE_APPLICATION_CREDENTIALS: {e}"));
        }
        let gcloud = match (get("CLOUDSDK_CONFIG"), get("HOME")) {
            (Some(dir), _) => Some(PathBuf::from(dir)),
            (None, Some(home)) => Some(Path::new(home).join(".config/gcloud")),
            (None, None) => None,
        };
        if let Some(file) = gcloud.map(|d| d.join("application_default_credentials.json")).filter(|f| f.is_file()) {
            return Source::from_file(&file);
        }
        Ok(Source::Metadata(get("GCE_METADATA_HOST").unwrap_or(METADATA_HOST).to_string()))
    }

    /// A credentials file.
    pub fn from_file(path: &Path) -> Result<Source, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
        Source::from_json(&v).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// A credentials file's content.
    pub fn from_json(v: &Value) -> Result<Source, String> {
        let field = |k: &str| v[k].as_str().filter(|s| !s.is_empty()).ok_or_else(|| format!("no {k:?}"));
        match v["type"].as_str().unwrap_or_default() {
            "service_account" => {
                use rustls_pki_types::pem::PemObject;
                let pem = field("private_key")?;
                let der = rustls_pki_types::PrivateKeyDer::from_pem_slice(pem.as_bytes())
                    .map_err(|e| format!("private_key is not a PEM key: {e}"))?;
                let key = match &der {
                    rustls_pki_types::PrivateKeyDer::Pkcs8(k) => {
                        ring::signature::RsaKeyPair::from_pkcs8(k.secret_pkcs8_der())
                    }
                    rustls_pki_types::PrivateKeyDer::Pkcs1(k) => {
                        ring::signature::RsaKeyPair::from_der(k.secret_pkcs1_der())
                    }
                    _ => return Err("private_key is not an RSA key".into()),
                }
                .map_err(|e| format!("private_key: {e}"))?;
                Ok(Source::ServiceAccount(Box::new(ServiceAccount {
                    client_email: field("client_email")?.to_string(),
                    key_id: v["private_key_id"].as_str().unwrap_or_default().to_string(),
                    token_uri: v["token_uri"].as_str().unwrap_or(GOOGLE_TOKEN_URI).to_string(),
                    key,
                })))
            }
            "authorized_user" => Ok(Source::AuthorizedUser {
                client_id: field("client_id")?.to_string(),
                client_secret: Secret::new(field("client_secret")?),
                refresh_token: Secret::new(field("refresh_token")?),
                token_uri: v["token_uri"].as_str().unwrap_or(GOOGLE_TOKEN_URI).to_string(),
            }),
            "external_account" => {
                let cs = &v["credential_source"];
                let source = if let Some(f) = cs["file"].as_str() {
                    SubjectSource::File(PathBuf::from(f))
                } else if let Some(u) = cs["url"].as_str() {
                    let headers = cs["headers"]
                        .as_object()
                        .map(|h| h.iter().filter_map(|(k, x)| Some((k.clone(), x.as_str()?.to_string()))).collect())
                        .unwrap_or_default();
                    SubjectSource::Url(u.to_string(), headers)
                } else if cs["environment_id"].is_string() || cs["executable"].is_object() {
                    return Err("external_account: only file- and URL-sourced subject tokens are supported".into());
                } else {
                    return Err("external_account: credential_source has no file or url".into());
                };
                let json_field = match cs["format"]["type"].as_str() {
                    Some("json") => Some(
                        cs["format"]["subject_token_field_name"]
                            .as_str()
                            .ok_or("credential_source.format: no subject_token_field_name")?
                            .to_string(),
                    ),
                    _ => None,
                };
                Ok(Source::ExternalAccount(Box::new(ExternalAccount {
                    audience: field("audience")?.to_string(),
                    subject_token_type: field("subject_token_type")?.to_string(),
                    token_url: v["token_url"].as_str().unwrap_or("https://sts.googleapis.com/v1/token").to_string(),
                    source,
                    json_field,
                    impersonation_url: v["service_account_impersonation_url"].as_str().map(str::to_string),
                })))
            }
            other => Err(format!(
                "credentials of type {other:?} are not supported (service_account, authorized_user, external_account)"
            )),
        }
    }
}

fn b64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
}

/// The signed JWT a service account exchanges for an access token, issued at `now_s` (Unix seconds).
pub fn service_account_jwt(sa: &ServiceAccount, now_s: i64) -> Result<String, String> {
    let header = serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": sa.key_id});
    let claims = serde_json::json!({
        "iss": sa.client_email,
        "scope": SCOPE,
        "aud": sa.token_uri,
        "iat": now_s,
        "exp": now_s + 3600,
    });
    let signing_input = format!("{}.{}", b64(header.to_string().as_bytes()), b64(claims.to_string().as_bytes()));
    let mut sig = vec![0u8; sa.key.public().modulus_len()];
    sa.key
        .sign(&ring::signature::RSA_PKCS1_SHA256, &ring::rand::SystemRandom::new(), signing_input.as_bytes(), &mut sig)
        .map_err(|e| format!("cannot sign the JWT: {e}"))?;
    Ok(format!("{signing_input}.{}", b64(&sig)))
}

fn form(pairs: &[(&str, &str)]) -> String {
    fn enc(s: &str) -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect()
    }
    pairs.iter().map(|(k, v)| format!("{}={}", enc(k), enc(v))).collect::<Vec<_>>().join("&")
}

/// Access tokens from a [`Source`], cached until shortly before they expire.
pub struct GoogleCredentials {
    source: Source,
    http: reqwest::Client,
    cached: tokio::sync::Mutex<Option<(Secret, Instant)>>,
}

impl GoogleCredentials {
    /// Tokens from `source`.
    pub fn new(source: Source) -> Result<GoogleCredentials, String> {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().map_err(|e| e.to_string())?;
        Ok(GoogleCredentials { source, http, cached: tokio::sync::Mutex::new(None) })
    }

    /// The source's name.
    pub fn source_name(&self) -> &'static str {
        self.source.name()
    }

    /// A token to call with now: the cached one until its renewal time, else a new one. A fixed token is not
    /// cached (nothing to renew) and a token command runs every time (it may have its own cache, as `gcloud` does).
    pub async fn token(&self) -> Result<Secret, PollError> {
        let mut cached = self.cached.lock().await;
        if let Some((t, renew_at)) = cached.as_ref() {
            if Instant::now() < *renew_at {
                return Ok(t.clone());
            }
        }
        let asked = Instant::now();
        let (token, lifetime) = self
            .fetch()
            .await
            .map_err(|e| PollError::new(PollErrorKind::Credentials, format!("google {}: {e}", self.source.name())))?;
        if let Some(life) = lifetime {
            *cached = Some((token.clone(), asked + super::renew_after(life)));
        }
        Ok(token)
    }

    /// Drops the cached token (the API refused it).
    pub async fn forget(&self) {
        *self.cached.lock().await = None;
    }

    /// A new token and how long it is good for (None: do not cache).
    async fn fetch(&self) -> Result<(Secret, Option<Duration>), String> {
        match &self.source {
            Source::Static(t) => Ok((t.clone(), None)),
            Source::Command(cmd) => {
                let (prog, args) = cmd.split_first().ok_or("empty token command")?;
                let out =
                    tokio::process::Command::new(prog).args(args).output().await.map_err(|e| format!("{prog}: {e}"))?;
                if !out.status.success() {
                    return Err(format!("{prog} exited {}", out.status));
                }
                Ok((Secret::new(String::from_utf8_lossy(&out.stdout).trim()), None))
            }
            Source::ServiceAccount(sa) => {
                let jwt = service_account_jwt(sa, startline_proto::time::now_ms().div_euclid(1000))?;
                let body = form(&[("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"), ("assertion", &jwt)]);
                self.oauth(self.http.post(&sa.token_uri), body).await
            }
            Source::AuthorizedUser { client_id, client_secret, refresh_token, token_uri } => {
                let body = form(&[
                    ("grant_type", "refresh_token"),
                    ("client_id", client_id),
                    ("client_secret", client_secret.expose()),
                    ("refresh_token", refresh_token.expose()),
                ]);
                self.oauth(self.http.post(token_uri), body).await
            }
            Source::ExternalAccount(ea) => self.external(ea).await,
            Source::Metadata(host) => {
                let url = format!("http://{host}/computeMetadata/v1/instance/service-accounts/default/token");
                let v = self.json(self.http.get(&url).header("Metadata-Flavor", "Google")).await?;
                token_answer(&v)
            }
        }
    }

    /// POSTs a form to an OAuth 2.0 token endpoint; reads `access_token` and `expires_in`.
    async fn oauth(&self, req: reqwest::RequestBuilder, body: String) -> Result<(Secret, Option<Duration>), String> {
        let v = self.json(req.header("content-type", "application/x-www-form-urlencoded").body(body)).await?;
        token_answer(&v)
    }

    /// Sends `req`; a 2xx JSON answer, else an error with the status and the start of the body.
    async fn json(&self, req: reqwest::RequestBuilder) -> Result<Value, String> {
        let resp = req.send().await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| e.to_string())?;
        if !(200..300).contains(&status) {
            return Err(format!("answered {status}: {}", text.chars().take(300).collect::<String>()));
        }
        serde_json::from_str(&text).map_err(|e| format!("answered invalid JSON: {e}"))
    }

    async fn external(&self, ea: &ExternalAccount) -> Result<(Secret, Option<Duration>), String> {
        let raw = match &ea.source {
            SubjectSource::File(p) => std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?,
            SubjectSource::Url(u, headers) => {
                let mut req = self.http.get(u);
                for (k, v) in headers {
                    req = req.header(k.as_str(), v.as_str());
                }
                let resp = req.send().await.map_err(|e| format!("{u}: {e}"))?;
                let status = resp.status().as_u16();
                let text = resp.text().await.map_err(|e| format!("{u}: {e}"))?;
                if !(200..300).contains(&status) {
                    return Err(format!("{u} answered {status}"));
                }
                text
            }
        };
        let subject = match &ea.json_field {
            None => raw.trim().to_string(),
            Some(f) => serde_json::from_str::<Value>(&raw)
                .ok()
                .and_then(|v| v[f.as_str()].as_str().map(str::to_string))
                .ok_or_else(|| format!("the subject token has no JSON field {f:?}"))?,
        };
        let body = form(&[
            ("grant_type", "urn:ietf:params:oauth:grant-type:token-exchange"),
            ("audience", &ea.audience),
            ("scope", SCOPE),
            ("requested_token_type", "urn:ietf:params:oauth:token-type:access_token"),
            ("subject_token", &subject),
            ("subject_token_type", &ea.subject_token_type),
        ]);
        let (sts_token, life) = self.oauth(self.http.post(&ea.token_url), body).await?;
        let Some(url) = &ea.impersonation_url else { return Ok((sts_token, life)) };
        let v = self
            .json(
                self.http
                    .post(url)
                    .bearer_auth(sts_token.expose())
                    .json(&serde_json::json!({"scope": [SCOPE], "lifetime": "3600s"})),
            )
            .await
            .map_err(|e| format!("impersonation: {e}"))?;
        let token = v["accessToken"].as_str().ok_or("impersonation: no accessToken in the answer")?;
        let expires = v["expireTime"].as_str().and_then(startline_proto::rfc3339::parse_ms);
        let life =
            expires.map(|at| Duration::from_millis(u64::try_from(at - startline_proto::time::now_ms()).unwrap_or(0)));
        Ok((Secret::new(token), Some(life.unwrap_or(Duration::from_secs(300)))))
    }
}

/// `access_token` and `expires_in` (seconds; 5 minutes when missing) of a token answer.
fn token_answer(v: &Value) -> Result<(Secret, Option<Duration>), String> {
    let token = v["access_token"].as_str().filter(|t| !t.is_empty()).ok_or("no access_token in the answer")?;
    let secs = v["expires_in"].as_u64().or_else(|| v["expires_in"].as_str().and_then(|s| s.parse().ok()));
    Ok((Secret::new(token), Some(Duration::from_secs(secs.unwrap_or(300)))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// The JWT of Google's own test key verifies with the public half Google publishes beside it
    /// (google-auth-library-python's tests/data).
    #[test]
    fn the_service_account_jwt_verifies_with_the_keys_public_half() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/google");
        let Source::ServiceAccount(sa) = Source::from_file(&dir.join("service_account.json")).expect("key file") else {
            panic!("a service account")
        };
        let jwt = service_account_jwt(&sa, 1_800_000_000).expect("jwt");
        let (input, sig) = jwt.rsplit_once('.').expect("three parts");
        // "-----BEGIN RSA PUBLIC KEY-----": a PKCS#1 RSAPublicKey, the form ring verifies with.
        let pem = std::fs::read_to_string(dir.join("privatekey.pub")).expect("public key");
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        let der = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, body).expect("pem body");
        let sig = base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, sig).expect("b64");
        let public = ring::signature::UnparsedPublicKey::new(&ring::signature::RSA_PKCS1_2048_8192_SHA256, der);
        public.verify(input.as_bytes(), &sig).expect("signature");
        let claims: Value = serde_json::from_slice(
            &base64::Engine::decode(
                &base64::engine::general_purpose::URL_SAFE_NO_PAD,
                input.split('.').nth(1).unwrap_or(""),
            )
            .expect("claims"),
        )
        .expect("json");
        assert_eq!(claims["iss"], "service-account@example.com");
        assert_eq!(claims["aud"], "https://accounts.google.com/o/oauth2/token");
        assert_eq!((claims["iat"].as_i64(), claims["exp"].as_i64()), (Some(1_800_000_000), Some(1_800_003_600)));
    }

    #[test]
    fn application_default_credentials_are_found_in_googles_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Nothing configured: the metadata server, at GCE_METADATA_HOST when set.
        let s = Source::application_default(&env(&[("HOME", dir.path().to_str().unwrap_or("/"))])).expect("adc");
        assert!(matches!(&s, Source::Metadata(h) if h == METADATA_HOST), "{s:?}");
        let s = Source::application_default(&env(&[("GCE_METADATA_HOST", "127.0.0.1:8080")])).expect("adc");
        assert!(matches!(&s, Source::Metadata(h) if h == "127.0.0.1:8080"), "{s:?}");
        // gcloud's file in CLOUDSDK_CONFIG comes before the metadata server.
        let user = serde_json::json!({"type": "authorized_user", "client_id": "123", "client_secret": "secret", "refresh_token": "alabalaportocala"});
        std::fs::write(dir.path().join("application_default_credentials.json"), user.to_string()).expect("write");
        let s =
            Source::application_default(&env(&[("CLOUDSDK_CONFIG", dir.path().to_str().unwrap_or("/"))])).expect("adc");
        assert!(matches!(&s, Source::AuthorizedUser { token_uri, .. } if token_uri == GOOGLE_TOKEN_URI), "{s:?}");
        // GOOGLE_APPLICATION_CREDENTIALS first; a broken file is an error naming the variable, not a fall-through.
        let e = Source::application_default(&env(&[
            ("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/key.json"),
            ("CLOUDSDK_CONFIG", dir.path().to_str().unwrap_or("/")),
        ]))
        .expect_err("missing file");
        assert!(e.starts_with("GOOGLE_APPLICATION_CREDENTIALS: /nonexistent/key.json"), "{e}");
        let e =
            Source::from_json(&serde_json::json!({"type": "impersonated_service_account"})).expect_err("unsupported");
        assert!(e.contains("not supported"), "{e}");
    }
}
