//! The `NodeHealthService` edge: validates node agents' GPU health readings, stores them durably (the store's
//! `node_health` tree) and adds them to the [`HealthBook`](crate::index::nodes::HealthBook) the node report reads.
//! Answers once the readings are flushed; a bad reading fails the whole request with `INVALID_ARGUMENT` naming the
//! field, storing nothing.
//!
//! The same rules as ingest: [`NodeHealthServer`] serves `Report` with [`CheckedCodec`], so readings, GPUs per
//! reading and XID errors per GPU are counted before the request is decoded ([`check_report`]) and undecodable
//! bytes are `INVALID_ARGUMENT` without decoder detail; the caller's identity must be permitted each reading's
//! node (its `node_prefixes`) and source (its `sources`), else the whole request is `PERMISSION_DENIED` naming the
//! reading's field (counted as `not_permitted`).

use super::codec::{check_report, single_message, CheckedCodec, MALFORMED_REPORT};
use super::guard::Caller;
use crate::applier::health::HealthWriter;
use crate::auth::{Auth, Identity};
use crate::job::nodes::Reading;
use crate::time::Clock;
use startline_proto::pb::{self, node_health_service_server::NodeHealthService};
use startline_proto::time::timestamp_to_ms;
use std::convert::Infallible;
use std::sync::Arc;
use tonic::codegen::{http, Body, BoxFuture, Context, Poll, StdError};
use tonic::{Request, Response, Status, Streaming};

use super::codec::{MAX_GPUS, MAX_REPORTS};

/// The service.
#[derive(Clone)]
pub struct NodeHealthIngest {
    /// Where readings go.
    pub writer: HealthWriter,
    /// The clock (skew check, retention).
    pub clock: Clock,
    /// How far ahead of the collector's clock a reading may be stamped.
    pub max_future_skew_ms: i64,
    /// Identities' refusal counts (`not_permitted`).
    pub auth: Arc<Auth>,
}

fn bad(field: String, why: &str) -> Status {
    Status::invalid_argument(format!("{field}: {why}"))
}

/// Checks one reading and sums it over its GPUs.
pub fn validate(i: usize, r: &pb::NodeHealth, now: i64, skew_ms: i64) -> Result<Reading, Status> {
    let f = |name: &str| format!("reports[{i}].{name}");
    // The id rule events' node names follow (visible characters, no `.`/`..`/empty path segments).
    let id = |field: String, value: &str, max: usize, path: bool| {
        startline_proto::validate::check_id(&field, value, max, path)
            .map_err(|e| Status::invalid_argument(e.to_string()))
    };
    id(f("node"), &r.node, 256, true)?;
    let at = r.observed_at.as_ref().map(timestamp_to_ms).ok_or_else(|| bad(f("observed_at"), "is required"))?;
    if at > now + skew_ms {
        return Err(bad(f("observed_at"), "is further ahead of the collector's clock than the allowed skew"));
    }
    if !r.source.is_empty() {
        id(f("source"), &r.source, 128, false)?;
    }
    if r.gpus.len() > MAX_GPUS {
        return Err(bad(f("gpus"), "at most 64 GPUs per reading"));
    }
    let mut out = Reading { at_ms: at, ecc_corrected: 0, ecc_uncorrected: 0, xid_errors: 0, gpus: r.gpus.len() as u32 };
    for (j, g) in r.gpus.iter().enumerate() {
        if !g.uuid.is_empty() {
            id(f(&format!("gpus[{j}].uuid")), &g.uuid, 128, false)?;
        }
        if g.xid_errors.len() > 64 {
            return Err(bad(f(&format!("gpus[{j}].xid_errors")), "at most 64 per reading"));
        }
        if g.temperature_c.is_some_and(|t| !t.is_finite()) {
            return Err(bad(f(&format!("gpus[{j}].temperature_c")), "must be finite"));
        }
        out.ecc_corrected = out.ecc_corrected.saturating_add(g.ecc_corrected.unwrap_or(0));
        out.ecc_uncorrected = out.ecc_uncorrected.saturating_add(g.ecc_uncorrected.unwrap_or(0));
        out.xid_errors += g.xid_errors.len() as u64;
    }
    Ok(out)
}

/// Whether `identity` may report reading `i`: its node within the identity's `node_prefixes` and its source among
/// its `sources`; `Err` names the reading's field (`PERMISSION_DENIED`).
pub fn permitted(identity: &Identity, i: usize, r: &pb::NodeHealth) -> Result<(), Status> {
    let why = if !identity.permits_node(&r.node) {
        Some(("node", &r.node, "node_prefixes"))
    } else if !identity.permits_source(&r.source) {
        Some(("source", &r.source, "sources"))
    } else {
        None
    };
    match why {
        None => Ok(()),
        Some((field, value, key)) => Err(Status::permission_denied(format!(
            "reports[{i}].{field}: {value:?} is not permitted for identity {:?} (see its {key})",
            identity.name
        ))),
    }
}

/// The first node an event names that `identity` may not report on (`node_assigned.nodes[i]`, `node_lost.node`):
/// the field's path, for a per-event rejection.
pub fn event_node_refused(identity: &Identity, ev: &pb::LifecycleEvent) -> Option<String> {
    use pb::lifecycle_event::Kind;
    if identity.node_prefixes.is_empty() {
        return None;
    }
    match ev.kind.as_ref()? {
        Kind::NodeAssigned(n) => {
            n.nodes.iter().position(|x| !identity.permits_node(x)).map(|i| format!("node_assigned.nodes[{i}]"))
        }
        Kind::NodeLost(n) if !n.node.is_empty() && !identity.permits_node(&n.node) => Some("node_lost.node".into()),
        _ => None,
    }
}

#[tonic::async_trait]
impl NodeHealthService for NodeHealthIngest {
    async fn report(
        &self,
        request: Request<pb::ReportHealthRequest>,
    ) -> Result<Response<pb::ReportHealthResponse>, Status> {
        let caller = request.extensions().get::<Caller>().map(|c| c.0.clone());
        let req = request.into_inner();
        // Counted before decoding by the codec; checked again for callers that bypass it (tests, other codecs).
        if req.reports.len() > MAX_REPORTS {
            return Err(bad("reports".into(), "at most 1000 readings per request"));
        }
        let now = self.clock.now_ms();
        let readings = req
            .reports
            .iter()
            .enumerate()
            .map(|(i, r)| validate(i, r, now, self.max_future_skew_ms).map(|x| (r.node.clone(), x)))
            .collect::<Result<Vec<_>, Status>>()?;
        if let Some(identity) = &caller {
            if let Some(refused) = req.reports.iter().enumerate().find_map(|(i, r)| permitted(identity, i, r).err()) {
                crate::health::IngestStats::add(&self.auth.stats.not_permitted, 1);
                tracing::warn!(identity = %identity.name, "health readings refused: {}", refused.message());
                return Err(refused);
            }
        }
        let accepted = readings.len() as u32;
        let writer = self.writer.clone();
        let stored = tokio::task::spawn_blocking(move || writer.write(readings, now))
            .await
            .map_err(|e| Status::unavailable(format!("storage task failed: {e}")))?
            .map_err(|e| Status::unavailable(format!("storage unavailable: {e}")))?;
        Ok(Response::new(pb::ReportHealthResponse { stored, accepted }))
    }
}

/// `startline.v1.NodeHealthService` over HTTP/2 with [`CheckedCodec`] in place of the plain prost codec: `Report`
/// is served as a one-message client stream (the same bytes on the wire as unary), so every refusal of its
/// message (over a cap, undecodable, over `grpc.max_message_bytes`, a malformed frame) is the collector's answer,
/// not tonic's wording.
#[derive(Clone)]
pub struct NodeHealthServer {
    inner: Arc<NodeHealthIngest>,
    max_message_bytes: usize,
}

impl NodeHealthServer {
    /// Serves `ingest`, refusing messages over `max_message_bytes` from their length prefix.
    pub fn new(ingest: NodeHealthIngest, max_message_bytes: usize) -> Self {
        NodeHealthServer { inner: Arc::new(ingest), max_message_bytes }
    }
}

impl tonic::server::NamedService for NodeHealthServer {
    const NAME: &'static str = pb::node_health_service_server::SERVICE_NAME;
}

/// `Report`: one request, one answer.
struct ReportMethod(Arc<NodeHealthIngest>, usize);

impl tonic::server::ClientStreamingService<pb::ReportHealthRequest> for ReportMethod {
    type Response = pb::ReportHealthResponse;
    type Future = BoxFuture<Response<pb::ReportHealthResponse>, Status>;

    fn call(&mut self, request: Request<Streaming<pb::ReportHealthRequest>>) -> Self::Future {
        let (inner, max) = (self.0.clone(), self.1);
        Box::pin(async move {
            let (metadata, extensions, mut stream) = request.into_parts();
            let req = single_message(&mut stream, "ReportHealthRequest", max).await?;
            inner.report(Request::from_parts(metadata, extensions, req)).await
        })
    }
}

impl<B> tonic::codegen::Service<http::Request<B>> for NodeHealthServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let max = self.max_message_bytes;
        let codec =
            CheckedCodec::<pb::ReportHealthResponse, pb::ReportHealthRequest>::new(check_report, MALFORMED_REPORT);
        let mut grpc = tonic::server::Grpc::new(codec).apply_max_message_size_config(Some(max), Some(max));
        let inner = self.inner.clone();
        match req.uri().path() {
            "/startline.v1.NodeHealthService/Report" => {
                Box::pin(async move { Ok(grpc.client_streaming(ReportMethod(inner, max), req).await) })
            }
            _ => Box::pin(async move { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::lifecycle_event::Kind;

    fn cluster_a() -> Identity {
        Identity {
            name: "cluster-a".into(),
            job_id_prefixes: vec!["a/".into()],
            sources: vec!["agent-a".into()],
            node_prefixes: vec!["a-".into()],
            ..Identity::anonymous()
        }
    }

    #[test]
    fn readings_are_held_to_the_identitys_node_prefixes_and_sources() {
        let id = cluster_a();
        let r = |node: &str, source: &str| pb::NodeHealth {
            node: node.into(),
            source: source.into(),
            ..Default::default()
        };
        assert!(permitted(&id, 0, &r("a-gpu-1", "agent-a")).is_ok());
        for (reading, field) in [
            (r("b-gpu-1", "agent-a"), "reports[3].node"),
            (r("a-gpu-1", "agent-b"), "reports[3].source"),
            (r("a-gpu-1", ""), "reports[3].source"),
        ] {
            let e = permitted(&id, 3, &reading).expect_err("not permitted");
            assert_eq!(e.code(), tonic::Code::PermissionDenied);
            assert!(e.message().starts_with(&format!("{field}:")), "{}", e.message());
        }
        // No restriction: anything goes.
        assert!(permitted(&Identity::anonymous(), 0, &r("b-gpu-1", "")).is_ok());
    }

    #[test]
    fn event_node_fields_are_held_to_the_identitys_node_prefixes() {
        let id = cluster_a();
        let ev = |kind| pb::LifecycleEvent { job_id: "a/1".into(), kind: Some(kind), ..Default::default() };
        let assigned = |nodes: &[&str]| {
            ev(Kind::NodeAssigned(pb::NodeAssigned {
                nodes: nodes.iter().map(|n| n.to_string()).collect(),
                gpu_ids: vec![],
            }))
        };
        assert_eq!(event_node_refused(&id, &assigned(&["a-1", "a-2"])), None);
        assert_eq!(event_node_refused(&id, &assigned(&["a-1", "b-2"])).as_deref(), Some("node_assigned.nodes[1]"));
        let lost = |node: &str| ev(Kind::NodeLost(pb::NodeLost { node: node.into(), message: String::new() }));
        assert_eq!(event_node_refused(&id, &lost("b-1")).as_deref(), Some("node_lost.node"));
        assert_eq!(event_node_refused(&id, &lost("")), None, "a loss without a node names none");
        assert_eq!(event_node_refused(&Identity::anonymous(), &lost("b-1")), None);
    }
}
