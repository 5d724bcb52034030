//! The uplink's credentials and TLS against a real tonic server on loopback: certificates made at test time
//! (rcgen), the bearer token in the `authorization` metadata, a wrong CA, and credential refusals.

use startline_agent::auth::TokenSource;
use startline_agent::uplink::{Publisher, TlsFiles, UplinkError, UplinkSettings};
use startline_proto::pb::{self, ingest_service_server::IngestService, ingest_service_server::IngestServiceServer};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

/// A collector stand-in: records each call's `authorization`, refuses calls whose token is not `accept`
/// (with `UNAUTHENTICATED`), and acknowledges every batch of the others.
#[derive(Clone)]
struct Recorder {
    seen: Arc<Mutex<Vec<Option<String>>>>,
    accept: Option<&'static str>,
}

impl Recorder {
    fn check<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let auth = req.metadata().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string);
        self.seen.lock().expect("lock").push(auth.clone());
        match self.accept {
            Some(token) if auth.as_deref() != Some(&format!("Bearer {token}")) => {
                Err(Status::unauthenticated("unknown token"))
            }
            _ => Ok(()),
        }
    }
}

fn ack(req: &pb::PublishRequest) -> pb::PublishAck {
    pb::PublishAck { batch_seq: req.batch_seq, accepted: req.events.len() as u32, ..Default::default() }
}

#[tonic::async_trait]
impl IngestService for Recorder {
    type PublishStream = ReceiverStream<Result<pb::PublishAck, Status>>;

    async fn publish(
        &self,
        request: Request<Streaming<pb::PublishRequest>>,
    ) -> Result<Response<Self::PublishStream>, Status> {
        self.check(&request)?;
        let mut incoming = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            while let Ok(Some(req)) = incoming.message().await {
                if tx.send(Ok(ack(&req))).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn publish_batch(&self, request: Request<pb::PublishRequest>) -> Result<Response<pb::PublishAck>, Status> {
        self.check(&request)?;
        Ok(Response::new(ack(request.get_ref())))
    }
}

/// A CA, and a server certificate it signed for `localhost` and `127.0.0.1`: (CA PEM, cert PEM, key PEM).
fn ca_and_server_cert() -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "startline test CA");
    let ca = ca_params.self_signed(&ca_key).expect("CA");
    let key = rcgen::KeyPair::generate().expect("server key");
    let params = rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).expect("params");
    let cert = params.signed_by(&key, &ca, &ca_key).expect("server cert");
    (ca.pem(), cert.pem(), key.serialize_pem())
}

/// Starts the recorder on 127.0.0.1:0, over TLS when `tls` holds (cert PEM, key PEM); returns its port.
async fn start(recorder: Recorder, tls: Option<(String, String)>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let mut builder = Server::builder();
    if let Some((cert, key)) = tls {
        builder =
            builder.tls_config(ServerTlsConfig::new().identity(Identity::from_pem(cert, key))).expect("server TLS");
    }
    let router = builder.add_service(IngestServiceServer::new(recorder));
    tokio::spawn(router.serve_with_incoming(TcpListenerStream::new(listener)));
    port
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

fn event(i: u32) -> pb::LifecycleEvent {
    pb::LifecycleEvent { event_id: format!("e{i}"), job_id: "j/1".into(), source: "test".into(), ..Default::default() }
}

fn fast(mut s: UplinkSettings) -> UplinkSettings {
    s.backoff_initial = Duration::from_millis(20);
    s.backoff_max = Duration::from_millis(100);
    s
}

#[tokio::test]
async fn tls_with_a_ca_file_carries_the_bearer_token_to_the_collector() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, cert, key) = ca_and_server_cert();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let port = start(Recorder { seen: seen.clone(), accept: Some("stl_uplink_token") }, Some((cert, key))).await;
    let mut settings = fast(UplinkSettings::new(format!("https://localhost:{port}")));
    settings.tls = TlsFiles { ca_file: Some(write(dir.path(), "ca.pem", &ca)), ..Default::default() };
    settings.token = Some(TokenSource::File(write(dir.path(), "token", "stl_uplink_token\n")));
    settings.give_up_after = Some(Duration::from_secs(10));
    let mut up = Publisher::new(settings).expect("publisher");
    up.send(vec![event(1), event(2)]).await.expect("send");
    up.send(vec![event(3)]).await.expect("send");
    up.flush().await.expect("acknowledged over TLS");
    assert_eq!(up.totals().accepted, 3);
    assert_eq!(up.totals().auth_failures, 0);
    let seen = seen.lock().expect("lock").clone();
    assert!(!seen.is_empty());
    assert!(seen.iter().all(|a| a.as_deref() == Some("Bearer stl_uplink_token")), "{seen:?}");
}

#[tokio::test]
async fn a_collector_certificate_from_another_ca_fails_with_a_certificate_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, cert, key) = ca_and_server_cert();
    let (other_ca, _, _) = ca_and_server_cert();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let port = start(Recorder { seen: seen.clone(), accept: None }, Some((cert, key))).await;
    let mut settings = fast(UplinkSettings::new(format!("https://127.0.0.1:{port}")));
    settings.tls = TlsFiles { ca_file: Some(write(dir.path(), "other-ca.pem", &other_ca)), ..Default::default() };
    settings.token = Some(TokenSource::File(write(dir.path(), "token", "stl_never_sent")));
    settings.give_up_after = Some(Duration::from_millis(500));
    let mut up = Publisher::new(settings).expect("publisher");
    up.send(vec![event(1)]).await.expect("send queues");
    let err = up.flush().await.expect_err("the certificate is not trusted");
    let text = err.to_string();
    assert!(matches!(err, UplinkError::GaveUp { .. }), "{text}");
    assert!(text.to_lowercase().contains("certificate"), "the cause is named: {text}");
    assert!(!text.contains("stl_never_sent"), "{text}");
    assert!(seen.lock().expect("lock").is_empty(), "no call reached the server");
}

#[tokio::test]
async fn credential_refusals_are_retried_while_spooled_and_a_rotated_token_file_is_picked_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let port = start(Recorder { seen: seen.clone(), accept: Some("stl_new") }, None).await;
    let token_file = write(dir.path(), "token", "stl_old");
    let mut settings = fast(UplinkSettings::new(format!("http://127.0.0.1:{port}")));
    settings.token = Some(TokenSource::File(token_file.clone()));
    assert!(settings.retry_auth_failures, "the default: retry, as the spooled modes need");
    let mut up = Publisher::new(settings).expect("publisher");
    let rotate = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::fs::write(&token_file, "stl_new\n").expect("rotate");
    });
    up.send(vec![event(1)]).await.expect("send");
    up.send(vec![event(2), event(3)]).await.expect("send");
    tokio::time::timeout(Duration::from_secs(10), up.flush()).await.expect("in time").expect("delivered");
    rotate.await.expect("rotated");
    assert_eq!(up.totals().accepted, 3, "nothing lost");
    assert!(up.totals().auth_failures >= 2, "refused while the old token was in the file: {:?}", up.totals());
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.first().cloned().flatten().as_deref(), Some("Bearer stl_old"));
    assert_eq!(seen.last().cloned().flatten().as_deref(), Some("Bearer stl_new"));
}

#[tokio::test]
async fn without_retries_a_credential_refusal_stops_the_publisher_without_the_token_in_the_error() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let port = start(Recorder { seen, accept: Some("stl_right") }, None).await;
    let mut settings = fast(UplinkSettings::new(format!("http://127.0.0.1:{port}")));
    settings.token = Some(TokenSource::Static(startline_agent::auth::Secret::new("stl_wrong_one")));
    settings.retry_auth_failures = false;
    let mut up = Publisher::new(settings).expect("publisher");
    up.send(vec![event(1)]).await.expect("send");
    match up.flush().await {
        Err(e @ UplinkError::Refused(_)) => {
            let text = e.to_string();
            assert!(text.contains("unknown token") && !text.contains("stl_wrong_one"), "{text}");
        }
        other => panic!("expected a refusal: {other:?}"),
    }
    assert_eq!(up.totals().auth_failures, 1);
}

#[test]
fn unusable_credentials_and_tls_files_are_startup_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let with = |endpoint: &str, edit: &dyn Fn(&mut UplinkSettings)| {
        let mut s = UplinkSettings::new(endpoint);
        edit(&mut s);
        Publisher::new(s).err().map(|e| e.to_string())
    };
    let empty = write(dir.path(), "empty", "\n");
    let err = with("http://127.0.0.1:1", &|s| s.token = Some(TokenSource::File(empty.clone()))).expect("empty token");
    assert!(err.contains("empty"), "{err}");
    let missing = dir.path().join("missing");
    let err = with("http://127.0.0.1:1", &|s| s.token = Some(TokenSource::File(missing.clone()))).expect("missing");
    assert!(err.contains("missing"), "{err}");
    let ca = write(dir.path(), "ca.pem", "-----BEGIN CERTIFICATE-----\n");
    let err = with("http://127.0.0.1:1", &|s| s.tls.ca_file = Some(ca.clone())).expect("CA with http");
    assert!(err.contains("https://"), "{err}");
    let not_pem = write(dir.path(), "not.pem", "hello");
    let err = with("https://127.0.0.1:1", &|s| s.tls.ca_file = Some(not_pem.clone())).expect("not PEM");
    assert!(err.contains("no PEM certificate"), "{err}");
    let err = with("https://127.0.0.1:1", &|s| s.tls.client_cert = Some(ca.clone())).expect("cert without key");
    assert!(err.contains("--client-key"), "{err}");
    assert!(with("https://127.0.0.1:1", &|_| {}).is_none(), "https with the webpki roots");
}
