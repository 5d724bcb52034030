//! The two other gRPC services' request paths: `NodeHealthService.Report` ([`Health`]: the collector's pre-decode
//! count of readings, GPUs and XID errors, decoding, each reading's validation and the identity's node and source
//! rule) and `StreamService.Subscribe` ([`Subscribe`]: the pre-decode count of filter values, decoding and the
//! filter's own checks). Both run the exact functions the collector's codec runs ([`checked_decode`] with
//! [`check_report`] / [`check_subscribe`]) on each input.
//!
//! Properties, besides no panic, no hang and bounded memory: every refusal of the codec is `INVALID_ARGUMENT` in
//! the collector's words (a field path or `message:`, never decoder text); a request the pre-decode count lets
//! through decodes to counts within the caps; a request it refuses for a cap really is over that cap once decoded
//! (or does not decode at all).

use super::mutate::{self, pick};
use super::targets::NOW;
use super::{Outcome, Target};
use crate::crashtrial::Rng;
use prost::Message;
use startline_collector::auth::Identity;
use startline_collector::ingest::codec::{
    check_report, check_subscribe, checked_decode, MALFORMED_REPORT, MALFORMED_SUBSCRIBE, MAX_FILTER_VALUES, MAX_GPUS,
    MAX_REPORTS, MAX_XIDS,
};
use startline_collector::ingest::node_health::{permitted, validate};
use startline_proto::pb;
use startline_proto::time::ms_to_timestamp;
use tonic::{Code, Status};

/// A refusal must be `INVALID_ARGUMENT` naming a field or the message, without decoder detail.
fn check_refusal(status: &Status, fields: &[&str]) -> Result<(), String> {
    if status.code() != Code::InvalidArgument {
        return Err(format!("refused with {:?}: {}", status.code(), status.message()));
    }
    let m = status.message();
    if !m.starts_with("message: ") && !fields.iter().any(|f| m.starts_with(f)) {
        return Err(format!("refusal names no field: {m}"));
    }
    let lower = m.to_ascii_lowercase();
    for leak in ["decodeerror", "varint", "wire type", "buffer", "invalid tag", "prost", "failed to decode"] {
        if lower.contains(leak) {
            return Err(format!("refusal leaks decoder detail {leak:?}: {m}"));
        }
    }
    Ok(())
}

fn text(rng: &mut Rng) -> String {
    match rng.range(0, 8) {
        0 => String::new(),
        1 => "a".repeat(*pick(rng, &[128usize, 129, 256, 257, 1000])),
        2 => "gpu\u{0}1".into(),
        3 => "gpu\u{200b}1".into(),
        4 => "b-gpu-1".into(),
        5 => "agent-b".into(),
        6 => "\u{3164}".into(),
        _ => format!("a-gpu-{}", rng.next_u64() % 100),
    }
}

/// `NodeHealthService.Report` requests as the collector takes them.
pub struct Health {
    identity: Identity,
}

impl Health {
    /// The target: readings judged for an identity restricted to nodes `a-` and source `agent-a`.
    pub fn new() -> Self {
        let identity = Identity {
            name: "cluster-a".into(),
            sources: vec!["agent-a".into()],
            node_prefixes: vec!["a-".into()],
            ..Identity::anonymous()
        };
        Health { identity }
    }

    fn reading(node: &str, gpus: u32, at_ms: i64) -> pb::NodeHealth {
        pb::NodeHealth {
            node: node.into(),
            observed_at: Some(ms_to_timestamp(at_ms)),
            source: "agent-a".into(),
            gpus: (0..gpus)
                .map(|g| pb::GpuHealth {
                    index: g,
                    uuid: format!("GPU-{g:08x}"),
                    ecc_corrected: Some(u64::from(g) * 3),
                    ecc_uncorrected: Some(0),
                    xid_errors: if g == 1 { vec![79, 48] } else { Vec::new() },
                    temperature_c: Some(41.5),
                })
                .collect(),
        }
    }
}

impl Default for Health {
    fn default() -> Self {
        Self::new()
    }
}

impl Target for Health {
    fn name(&self) -> &'static str {
        "node_health"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        let one = pb::ReportHealthRequest { reports: vec![Self::reading("a-gpu-001", 8, NOW - 60_000)] };
        let many = pb::ReportHealthRequest {
            reports: (0..40).map(|n| Self::reading(&format!("a-gpu-{n:03}"), 4, NOW - 1000 * n)).collect(),
        };
        let other = pb::ReportHealthRequest { reports: vec![Self::reading("b-gpu-001", 2, NOW)] };
        vec![one.encode_to_vec(), many.encode_to_vec(), other.encode_to_vec(), Vec::new()]
    }

    fn mutate(&self, rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
        match rng.range(0, 9) {
            0..=4 => {
                let Ok(mut req) = pb::ReportHealthRequest::decode(input.as_slice()) else {
                    return mutate::bytes(rng, input, corpus, &[]);
                };
                let n = req.reports.len();
                match rng.range(0, 7) {
                    0 if n > 0 => {
                        let copies = *pick(rng, &[1usize, 10, MAX_REPORTS, MAX_REPORTS + 1]);
                        // Copies without their GPUs: the count is what is under test, not the bytes.
                        let mut r = req.reports[rng.range(0, n as u64 - 1) as usize].clone();
                        r.gpus.clear();
                        let room = (64 << 10) / r.encoded_len().max(1);
                        req.reports.extend(std::iter::repeat_n(r, copies.min(room)));
                    }
                    1 if n > 0 => {
                        let r = &mut req.reports[rng.range(0, n as u64 - 1) as usize];
                        let g = r.gpus.first().cloned().unwrap_or_default();
                        r.gpus = vec![g; *pick(rng, &[0usize, 1, MAX_GPUS, MAX_GPUS + 1])];
                    }
                    2 if n > 0 => {
                        let r = &mut req.reports[rng.range(0, n as u64 - 1) as usize];
                        if let Some(g) = r.gpus.first_mut() {
                            g.xid_errors = vec![79; *pick(rng, &[0usize, 1, MAX_XIDS, MAX_XIDS + 1])];
                            g.temperature_c = *pick(rng, &[None, Some(f64::NAN), Some(f64::INFINITY), Some(-40.0)]);
                            g.uuid = text(rng);
                        }
                    }
                    3 if n > 0 => req.reports[rng.range(0, n as u64 - 1) as usize].node = text(rng),
                    4 if n > 0 => req.reports[rng.range(0, n as u64 - 1) as usize].source = text(rng),
                    5 if n > 0 => {
                        let seconds = *pick(rng, &[i64::MIN, -1, 0, NOW / 1000, NOW / 1000 + 301, i64::MAX]);
                        let at =
                            if rng.chance(0.2) { None } else { Some(prost_types::Timestamp { seconds, nanos: 0 }) };
                        req.reports[rng.range(0, n as u64 - 1) as usize].observed_at = at;
                    }
                    _ => req.reports.push(Self::reading(&text(rng), rng.range(0, 3) as u32, NOW)),
                }
                *input = req.encode_to_vec();
            }
            5..=7 => match mutate::protobuf(rng, input, 0) {
                Some(b) => *input = b,
                None => mutate::bytes(rng, input, corpus, &[]),
            },
            _ => mutate::bytes(rng, input, corpus, &[]),
        }
    }

    fn run(&mut self, input: &[u8]) -> Result<Outcome, String> {
        let checked = checked_decode::<pb::ReportHealthRequest>(input, check_report, MALFORMED_REPORT);
        let plain = pb::ReportHealthRequest::decode(input);
        let req = match (checked, plain) {
            (Ok(req), _) => req,
            (Err(status), plain) => {
                check_refusal(&status, &["reports"])?;
                let m = status.message();
                if m == MALFORMED_REPORT {
                    return Ok(Outcome::Rejected("malformed".into()));
                }
                // Refused for a cap: decoded, the request must really be over it.
                if let Ok(req) = plain {
                    if within_caps(&req) {
                        return Err(format!("the count refused a request within every cap: {m}"));
                    }
                }
                let cap = if m.contains("xid_errors") {
                    "xid_errors"
                } else if m.contains("gpus") {
                    "gpus"
                } else {
                    "reports"
                };
                return Ok(Outcome::Rejected(format!("over the {cap} cap")));
            }
        };
        if !within_caps(&req) {
            return Err(format!("the count let through a request over a cap ({} readings)", req.reports.len()));
        }
        for (i, r) in req.reports.iter().enumerate() {
            if let Err(s) = validate(i, r, NOW, 300_000) {
                let field = s.message().split(':').next().unwrap_or("").to_string();
                let class = field.split('.').skip(1).map(|p| p.split('[').next().unwrap_or(p)).collect::<Vec<_>>();
                return Ok(Outcome::Rejected(format!("invalid {}", class.join("."))));
            }
        }
        for (i, r) in req.reports.iter().enumerate() {
            if let Err(s) = permitted(&self.identity, i, r) {
                if s.code() != Code::PermissionDenied || !s.message().starts_with(&format!("reports[{i}].")) {
                    return Err(format!("a refused reading is answered {:?}: {}", s.code(), s.message()));
                }
                let field = if s.message().contains("].node:") { "node" } else { "source" };
                return Ok(Outcome::Rejected(format!("not permitted {field}")));
            }
        }
        Ok(Outcome::Accepted(if req.reports.is_empty() { "empty".into() } else { "stored".into() }))
    }
}

fn within_caps(req: &pb::ReportHealthRequest) -> bool {
    req.reports.len() <= MAX_REPORTS
        && req.reports.iter().all(|r| r.gpus.len() <= MAX_GPUS && r.gpus.iter().all(|g| g.xid_errors.len() <= MAX_XIDS))
}

/// `StreamService.Subscribe` requests as the collector takes them: the pre-decode count, then the filter.
#[derive(Default)]
pub struct Subscribe;

impl Subscribe {
    /// The target.
    pub fn new() -> Self {
        Subscribe
    }
}

const FILTER_FIELDS: &[&str] = &["pools", "priorities", "teams", "kinds", "job_id_prefix"];

impl Target for Subscribe {
    fn name(&self) -> &'static str {
        "subscribe"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        let full = pb::SubscribeRequest {
            after_cursor: Some(41),
            from_oldest: false,
            pools: vec!["a100".into(), "h100-spot".into()],
            priorities: vec![1, 2],
            teams: vec!["research".into()],
            job_id_prefix: "slurm/cluster-a/".into(),
            kinds: vec!["event".into(), "change".into(), "alert".into()],
        };
        let oldest = pb::SubscribeRequest { from_oldest: true, ..Default::default() };
        vec![full.encode_to_vec(), oldest.encode_to_vec(), Vec::new()]
    }

    fn mutate(&self, rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
        match rng.range(0, 9) {
            0..=4 => {
                let Ok(mut req) = pb::SubscribeRequest::decode(input.as_slice()) else {
                    return mutate::bytes(rng, input, corpus, &[]);
                };
                let count = *pick(rng, &[0usize, 1, MAX_FILTER_VALUES, MAX_FILTER_VALUES + 1, 5000]);
                match rng.range(0, 6) {
                    0 => req.pools = vec![text(rng); count],
                    1 => req.teams = vec![text(rng); count],
                    2 => req.priorities = vec![*pick(rng, &[0, 1, 2, 3, -1, i32::MAX]); count],
                    3 => req.kinds = vec![pick(rng, &["event", "change", "alert", "", "x"]).to_string(); count],
                    4 => req.job_id_prefix = text(rng),
                    5 => req.after_cursor = *pick(rng, &[None, Some(0), Some(u64::MAX)]),
                    _ => req.from_oldest = !req.from_oldest,
                }
                *input = req.encode_to_vec();
            }
            5..=7 => match mutate::protobuf(rng, input, 0) {
                Some(b) => *input = b,
                None => mutate::bytes(rng, input, corpus, &[]),
            },
            _ => mutate::bytes(rng, input, corpus, &[]),
        }
    }

    fn run(&mut self, input: &[u8]) -> Result<Outcome, String> {
        let checked = checked_decode::<pb::SubscribeRequest>(input, check_subscribe, MALFORMED_SUBSCRIBE);
        let lists = |r: &pb::SubscribeRequest| [r.pools.len(), r.priorities.len(), r.teams.len(), r.kinds.len()];
        let req = match checked {
            Ok(req) => req,
            Err(status) => {
                check_refusal(&status, FILTER_FIELDS)?;
                if status.message() == MALFORMED_SUBSCRIBE {
                    return Ok(Outcome::Rejected("malformed".into()));
                }
                if let Ok(req) = pb::SubscribeRequest::decode(input) {
                    if lists(&req).iter().all(|&n| n <= MAX_FILTER_VALUES) {
                        return Err(format!("the count refused a request within its caps: {}", status.message()));
                    }
                }
                let field = status.message().split(':').next().unwrap_or("").to_string();
                return Ok(Outcome::Rejected(format!("over the {field} cap")));
            }
        };
        if lists(&req).iter().any(|&n| n > MAX_FILTER_VALUES) {
            return Err(format!("the count let through lists of {:?}", lists(&req)));
        }
        match startline_collector::stream::Filter::of(&req) {
            Ok(_) => Ok(Outcome::Accepted(if req.from_oldest { "from oldest".into() } else { "filter".into() })),
            Err((field, _)) => {
                let class = field.split('[').next().unwrap_or(&field).to_string();
                if !FILTER_FIELDS.contains(&class.as_str()) {
                    return Err(format!("the filter refused an unknown field {field:?}"));
                }
                Ok(Outcome::Rejected(format!("invalid {class}")))
            }
        }
    }
}
