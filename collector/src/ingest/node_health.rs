//! The `NodeHealthService` edge: validates node agents' GPU health readings, stores them durably (the store's
//! `node_health` tree) and adds them to the [`HealthBook`] the node report reads. Answers once the readings are
//! flushed; a bad reading fails the whole request with `INVALID_ARGUMENT` naming the field, storing nothing.

use crate::applier::health::HealthWriter;
use crate::job::nodes::Reading;
use crate::time::Clock;
use startline_proto::pb;
use startline_proto::time::timestamp_to_ms;
use tonic::{Request, Response, Status};

/// Readings per request at most.
pub const MAX_REPORTS: usize = 1000;
/// GPUs per reading at most.
pub const MAX_GPUS: usize = 64;
/// The service.
#[derive(Clone)]
pub struct NodeHealthIngest {
    /// Where readings go.
    pub writer: HealthWriter,
    /// The clock (skew check, retention).
    pub clock: Clock,
    /// How far ahead of the collector's clock a reading may be stamped.
    pub max_future_skew_ms: i64,
}

fn bad(field: String, why: &str) -> Status {
    Status::invalid_argument(format!("{field}: {why}"))
}

/// Checks one reading and sums it over its GPUs.
pub fn validate(i: usize, r: &pb::NodeHealth, now: i64, skew_ms: i64) -> Result<Reading, Status> {
    let f = |name: &str| format!("reports[{i}].{name}");
    if r.node.is_empty() || r.node.len() > 256 || r.node.chars().any(|c| c.is_control()) {
        return Err(bad(f("node"), "must be 1 to 256 bytes of printable characters"));
    }
    let at = r.observed_at.as_ref().map(timestamp_to_ms).ok_or_else(|| bad(f("observed_at"), "is required"))?;
    if at > now + skew_ms {
        return Err(bad(f("observed_at"), "is further ahead of the collector's clock than the allowed skew"));
    }
    if r.source.len() > 128 {
        return Err(bad(f("source"), "must be at most 128 bytes"));
    }
    if r.gpus.len() > MAX_GPUS {
        return Err(bad(f("gpus"), "at most 64 GPUs per reading"));
    }
    let mut out = Reading { at_ms: at, ecc_corrected: 0, ecc_uncorrected: 0, xid_errors: 0, gpus: r.gpus.len() as u32 };
    for (j, g) in r.gpus.iter().enumerate() {
        if g.uuid.len() > 128 {
            return Err(bad(f(&format!("gpus[{j}].uuid")), "must be at most 128 bytes"));
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

#[tonic::async_trait]
impl pb::node_health_service_server::NodeHealthService for NodeHealthIngest {
    async fn report(
        &self,
        request: Request<pb::ReportHealthRequest>,
    ) -> Result<Response<pb::ReportHealthResponse>, Status> {
        let req = request.into_inner();
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
        let accepted = readings.len() as u32;
        let writer = self.writer.clone();
        let stored = tokio::task::spawn_blocking(move || writer.write(readings, now))
            .await
            .map_err(|e| Status::unavailable(format!("storage task failed: {e}")))?
            .map_err(|e| Status::unavailable(format!("storage unavailable: {e}")))?;
        Ok(Response::new(pb::ReportHealthResponse { stored, accepted }))
    }
}
