//! OTLP push: the collector, configured with `[metrics] otlp_endpoint`, exports its metrics over OTLP/gRPC to a
//! receiver started here (opentelemetry-proto's MetricsService server; no OpenTelemetry Collector can be
//! installed here, and Debian's Prometheus 2.42 has no OTLP receiver). The pushed values match the API. A second
//! receiver speaks TLS and requires a client certificate (certificates made here with rcgen): the collector,
//! given `otlp_ca_file`, a client certificate, a bearer token file and `otlp_headers`, pushes to it and the
//! token and tenant header arrive as gRPC metadata.

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use startline_agent::uplink::{Publisher, UplinkSettings};
use startline_proto::pb::{self, lifecycle_event::Kind};
use startline_tests::{ago, event, submitted, Collector};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<ExportMetricsServiceRequest>>>, Arc<Mutex<Vec<(String, String)>>>);

#[tonic::async_trait]
impl MetricsService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let metadata = request.metadata();
        let pick = |k: &str| metadata.get(k).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let seen = (pick("authorization"), pick("x-scope-orgid"));
        if let Ok(mut v) = self.1.lock() {
            v.push(seen);
        }
        if let Ok(mut v) = self.0.lock() {
            v.push(request.into_inner());
        }
        Ok(tonic::Response::new(ExportMetricsServiceResponse { partial_success: None }))
    }
}

/// The latest pushed sum of a counter's data points.
fn pushed_sum(r: &Receiver, name: &str) -> Option<f64> {
    use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value;
    last_metric(r, name, |d| match d {
        Data::Sum(s) => Some(
            s.data_points
                .iter()
                .map(|p| match p.value {
                    Some(Value::AsInt(i)) => i as f64,
                    Some(Value::AsDouble(d)) => d,
                    None => 0.0,
                })
                .sum(),
        ),
        _ => None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_pushed_over_otlp_grpc() {
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(MetricsServiceServer::new(receiver.clone()))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, format!("[metrics]\notlp_endpoint = \"http://{addr}\"\notlp_interval = \"1s\"\n"))
        .expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf8")]);
    let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");
    let mut evs = Vec::new();
    for i in 0..3 {
        let j = format!("otlp/{i}");
        evs.push(event(&j, "s", ago(100), submitted(pb::PoolKind::Managed, pb::PriorityClass::Normal, 1)));
        evs.push(event(&j, "f", ago(50), Kind::FirstStep(pb::FirstStep { step: 1, ..Default::default() })));
    }
    up.send(evs).await.expect("send");
    up.flush().await.expect("flush");

    let mut got = None;
    for _ in 0..100 {
        got = pushed_sum(&receiver, "startline.jobs.started");
        if got == Some(3.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(got, Some(3.0), "the pushed started-jobs counter matches the 3 started jobs");
    assert_eq!(pushed_sum(&receiver, "startline.collector.events"), Some(6.0));
    // Histograms go out base-2 exponential on OTLP (Prometheus keeps explicit buckets): 3 starts of 50 s each.
    let (kind, count, sum): (&str, u64, f64) =
        last_metric(&receiver, "startline.jobs.time_to_first_step", |d| match d {
            Data::ExponentialHistogram(h) => Some((
                "exponential",
                h.data_points.iter().map(|p| p.count).sum(),
                h.data_points.iter().filter_map(|p| p.sum).sum(),
            )),
            Data::Histogram(h) => Some((
                "explicit",
                h.data_points.iter().map(|p| p.count).sum(),
                h.data_points.iter().filter_map(|p| p.sum).sum(),
            )),
            _ => None,
        })
        .expect("time to first step pushed");
    assert_eq!((kind, count), ("exponential", 3));
    assert!((sum - 150.0).abs() < 1.0, "{sum}");
    // Additive "now" values are non-monotonic sums (up-down counters), not gauges.
    let monotonic = last_metric(&receiver, "startline.slo.jobs", |d| match d {
        Data::Sum(s) => Some(s.is_monotonic),
        _ => None,
    });
    assert_eq!(monotonic, Some(false));
    server.abort();
}

/// What `pick` reads from the latest pushed metric called `name`.
fn last_metric<T>(r: &Receiver, name: &str, pick: impl Fn(&Data) -> Option<T>) -> Option<T> {
    let reqs = r.0.lock().ok()?;
    let mut last = None;
    for req in reqs.iter() {
        for rm in &req.resource_metrics {
            for sm in &rm.scope_metrics {
                for m in sm.metrics.iter().filter(|m| m.name == name) {
                    if let Some(v) = m.data.as_ref().and_then(&pick) {
                        last = Some(v);
                    }
                }
            }
        }
    }
    last
}

/// A CA and two certificates it signs: the receiver's (for 127.0.0.1) and the collector's client certificate.
/// Written as PEM files into `dir`: ca.pem, server.pem, server.key, client.pem, client.key.
fn write_certificates(dir: &std::path::Path) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "startline test ca");
    let ca = ca_params.self_signed(&ca_key).expect("ca cert");
    let signed = |names: Vec<String>, cn: &str| {
        let key = KeyPair::generate().expect("key");
        let mut p = CertificateParams::new(names).expect("params");
        p.distinguished_name.push(DnType::CommonName, cn);
        (p.signed_by(&key, &ca, &ca_key).expect("signed"), key)
    };
    let (server, server_key) = signed(vec!["127.0.0.1".into(), "localhost".into()], "otlp receiver");
    let (client, client_key) = signed(vec!["startline-collector".into()], "startline-collector");
    for (name, pem) in [
        ("ca.pem", ca.pem()),
        ("server.pem", server.pem()),
        ("server.key", server_key.serialize_pem()),
        ("client.pem", client.pem()),
        ("client.key", client_key.serialize_pem()),
    ] {
        std::fs::write(dir.join(name), pem).expect("write pem");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_pushed_over_otlp_with_tls_a_client_certificate_and_headers() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_certificates(dir.path());
    let read = |n: &str| std::fs::read(dir.path().join(n)).expect("read pem");
    let tls = tonic::transport::ServerTlsConfig::new()
        .identity(tonic::transport::Identity::from_pem(read("server.pem"), read("server.key")))
        .client_ca_root(tonic::transport::Certificate::from_pem(read("ca.pem")));
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .tls_config(tls)
            .expect("server tls")
            .add_service(MetricsServiceServer::new(receiver.clone()))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    std::fs::write(dir.path().join("token"), "otlp-secret-token\n").expect("token");
    let p = |n: &str| dir.path().join(n).display().to_string();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[metrics]\notlp_endpoint = \"https://127.0.0.1:{}\"\notlp_interval = \"1s\"\notlp_ca_file = \"{}\"\n\
             otlp_client_cert_file = \"{}\"\notlp_client_key_file = \"{}\"\notlp_bearer_token_file = \"{}\"\n\
             otlp_headers = {{ \"X-Scope-OrgID\" = \"team-a\" }}\n",
            addr.port(),
            p("ca.pem"),
            p("client.pem"),
            p("client.key"),
            p("token")
        ),
    )
    .expect("config");
    let c = Collector::start(&dir.path().join("db"), &["--config", cfg.to_str().expect("utf8")]);
    let mut up = Publisher::new(UplinkSettings::new(c.endpoint())).expect("publisher");
    up.send(vec![event("otlp-tls/1", "s", ago(100), submitted(pb::PoolKind::Managed, pb::PriorityClass::Normal, 1))])
        .await
        .expect("send");
    up.flush().await.expect("flush");

    let mut got = None;
    for _ in 0..100 {
        got = pushed_sum(&receiver, "startline.collector.events");
        if got == Some(1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(got, Some(1.0), "pushed over TLS with the client certificate");
    let seen = receiver.1.lock().expect("lock").clone();
    assert!(!seen.is_empty());
    for (auth, org) in &seen {
        assert_eq!(auth, "Bearer otlp-secret-token");
        assert_eq!(org, "team-a");
    }
    server.abort();
}
