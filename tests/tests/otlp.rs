//! OTLP push: the collector, configured with `[metrics] otlp_endpoint`, exports its metrics over OTLP/gRPC to a
//! receiver started here (opentelemetry-proto's MetricsService server; no OpenTelemetry Collector can be
//! installed here, and Debian's Prometheus 2.42 has no OTLP receiver). The pushed values match the API.

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
struct Receiver(Arc<Mutex<Vec<ExportMetricsServiceRequest>>>);

#[tonic::async_trait]
impl MetricsService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        if let Ok(mut v) = self.0.lock() {
            v.push(request.into_inner());
        }
        Ok(tonic::Response::new(ExportMetricsServiceResponse { partial_success: None }))
    }
}

/// The latest pushed sum of a counter's data points.
fn pushed_sum(r: &Receiver, name: &str) -> Option<f64> {
    let reqs = r.0.lock().ok()?;
    let mut last = None;
    for req in reqs.iter() {
        for rm in &req.resource_metrics {
            for sm in &rm.scope_metrics {
                for m in sm.metrics.iter().filter(|m| m.name == name) {
                    if let Some(Data::Sum(s)) = &m.data {
                        let total: f64 = s
                            .data_points
                            .iter()
                            .map(|p| match p.value {
                                Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsInt(i)) => {
                                    i as f64
                                }
                                Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsDouble(
                                    d,
                                )) => d,
                                None => 0.0,
                            })
                            .sum();
                        last = Some(total);
                    }
                }
            }
        }
    }
    last
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
        evs.push(event(&j, "f", ago(50), Kind::FirstStep(pb::FirstStep { step: 1 })));
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
    server.abort();
}
