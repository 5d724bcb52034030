//! `startline-agent eta JOB_ID`: when a waiting job is expected to start, from the collector's
//! `GET /api/v1/jobs/{job_id}` (its `expected_start`), told in one line.
//!
//! [`fetch`] reads the job over HTTP(S) with the agent's bearer token and TLS files; [`line`] writes the
//! answer: for a waiting job its expected start, the 80% interval, how long it has waited and what the
//! estimate rests on; for a job that started, when; for one that ended, how. Times are UTC, to the minute
//! (truncated, as a clock shows them), with the date when it is not the day of `now`.

use crate::auth::Secret;
use crate::uplink::TlsFiles;
use serde_json::Value;
use startline_proto::rfc3339::{format_ms, parse_ms};
use std::time::Duration;

/// The exit code of `eta` for a job the collector does not know.
pub const EXIT_UNKNOWN_JOB: u8 = 3;

/// Why `eta` has no answer. Messages never hold the token.
#[derive(Debug, thiserror::Error)]
pub enum EtaError {
    /// The collector answered 404: it has no such job.
    #[error("job {0:?} is not known to the collector")]
    UnknownJob(String),
    /// The collector answered another error status.
    #[error("the collector answered {status}: {message}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// Its `error` field, else the body.
        message: String,
    },
    /// The collector could not be reached, or its answer was not JSON.
    #[error("cannot reach the collector's API at {api}: {reason}")]
    Unreachable {
        /// The API's base URL.
        api: String,
        /// Why.
        reason: String,
    },
    /// A TLS file could not be read or is not PEM.
    #[error("{0}")]
    Tls(String),
    /// The job's answer lacks a field the line needs.
    #[error("the collector's answer has no usable {0:?}")]
    Field(&'static str),
}

/// An HTTP client that verifies the API with `tls.ca_file` (else the webpki roots) and presents the client
/// certificate when both its files are given.
pub fn client(tls: &TlsFiles) -> Result<reqwest::Client, EtaError> {
    let read = |p: &std::path::PathBuf, what: &str| {
        std::fs::read(p).map_err(|e| EtaError::Tls(format!("cannot read {what} {}: {e}", p.display())))
    };
    let mut b = reqwest::Client::builder().timeout(Duration::from_secs(30));
    if let Some(p) = &tls.ca_file {
        let pem = read(p, "CA file")?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| EtaError::Tls(format!("CA file {}: {e}", p.display())))?;
        if certs.is_empty() {
            return Err(EtaError::Tls(format!("CA file {} holds no PEM certificate", p.display())));
        }
        b = b.tls_built_in_root_certs(false);
        for c in certs {
            b = b.add_root_certificate(c);
        }
    }
    match (&tls.client_cert, &tls.client_key) {
        (Some(c), Some(k)) => {
            let mut pem = read(k, "client key")?;
            pem.push(b'\n');
            pem.extend(read(c, "client certificate")?);
            let id = reqwest::Identity::from_pem(&pem)
                .map_err(|e| EtaError::Tls(format!("client certificate {} / key {}: {e}", c.display(), k.display())))?;
            b = b.identity(id);
        }
        (None, None) => {}
        _ => return Err(EtaError::Tls("a client certificate needs both --client-cert and --client-key".into())),
    }
    b.build().map_err(|e| EtaError::Tls(e.to_string()))
}

/// `GET {api}/api/v1/jobs/{job_id}` (the id's reserved characters escaped, its `/` kept), the job as JSON.
pub async fn fetch(http: &reqwest::Client, api: &str, token: Option<&Secret>, job_id: &str) -> Result<Value, EtaError> {
    let api = api.trim_end_matches('/');
    let unreachable = |reason: String| EtaError::Unreachable { api: api.to_string(), reason };
    // Only the job itself: its events are not needed.
    let mut req = http.get(format!("{api}/api/v1/jobs/{}?events_limit=0", path_escape(job_id)));
    if let Some(t) = token {
        req = req.bearer_auth(t.expose());
    }
    let resp = req.send().await.map_err(|e| unreachable(e.to_string()))?;
    let status = resp.status().as_u16();
    let body = resp.text().await.map_err(|e| unreachable(e.to_string()))?;
    match status {
        200 => serde_json::from_str(&body).map_err(|e| unreachable(format!("the answer is not JSON: {e}"))),
        404 => Err(EtaError::UnknownJob(job_id.to_string())),
        _ => {
            let message = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or(body);
            Err(EtaError::Refused { status, message })
        }
    }
}

/// A job id as a URL path: unreserved characters and `/` as they are, every other byte percent-escaped.
fn path_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The one line `eta` prints for `job` (an answer of `GET /api/v1/jobs/{job_id}`) at `now_ms`.
pub fn line(job: &Value, now_ms: i64) -> Result<String, EtaError> {
    let id = job["job_id"].as_str().ok_or(EtaError::Field("job_id"))?;
    let state = job["state"].as_str().ok_or(EtaError::Field("state"))?;
    let time = |field: &'static str| -> Result<Option<i64>, EtaError> {
        match &job[field] {
            Value::Null => Ok(None),
            v => v.as_str().and_then(parse_ms).map(Some).ok_or(EtaError::Field(field)),
        }
    };
    match state {
        "running" => {
            let mut s = format!("{id}: running");
            if let Some(at) = time("first_step_at")? {
                s += &format!(", started at {}", clock(at, now_ms));
            }
            if let Some(w) = job["time_to_first_step_seconds"].as_f64() {
                s += &format!(" after waiting {}", span(w));
            }
            Ok(s)
        }
        "done" => {
            let mut s = format!("{id}: ended");
            if let Some(at) = time("done_at")? {
                s += &format!(" at {}", clock(at, now_ms));
            }
            if let Some(o) = job["outcome"].as_str() {
                s += &format!(" ({o})");
            }
            match time("first_step_at")? {
                Some(at) => s += &format!(", started at {}", clock(at, now_ms)),
                None => s += ", never started",
            }
            Ok(s)
        }
        _ => {
            let e = &job["expected_start"];
            if e.is_null() {
                let mut s = format!("{id}: {state}");
                if let Some(w) = job["waiting_seconds"].as_f64() {
                    s += &format!(", waited {}", span(w));
                }
                s += ", no expected start (no comparable jobs started and no scheduler estimate)";
                return Ok(s);
            }
            let at = e["at"].as_str().and_then(parse_ms).ok_or(EtaError::Field("expected_start.at"))?;
            let low = e["low"].as_str().and_then(parse_ms).ok_or(EtaError::Field("expected_start.low"))?;
            let high = e["high"].as_str().and_then(parse_ms).ok_or(EtaError::Field("expected_start.high"))?;
            let interval = e["interval"].as_f64().ok_or(EtaError::Field("expected_start.interval"))?;
            let waited = e["waited_seconds"].as_f64().ok_or(EtaError::Field("expected_start.waited_seconds"))?;
            let basis = e["basis"].as_str().ok_or(EtaError::Field("expected_start.basis"))?;
            let jobs = e["comparable_jobs"].as_u64().ok_or(EtaError::Field("expected_start.comparable_jobs"))?;
            let mut s = format!(
                "{id}: expected start {} ({:.0}%: {}-{}), waited {}, basis {basis}",
                clock(at, now_ms),
                interval * 100.0,
                clock_bare(low, now_ms),
                clock_bare(high, now_ms),
                span(waited)
            );
            if jobs > 0 {
                s += &format!(" ({} comparable job{})", thousands(jobs), if jobs == 1 { "" } else { "s" });
            }
            Ok(s)
        }
    }
}

/// `HH:MM UTC`, with the date first when `ms` is not on the day of `now_ms`.
fn clock(ms: i64, now_ms: i64) -> String {
    format!("{} UTC", clock_bare(ms, now_ms))
}

/// `HH:MM` (truncated to the minute), `YYYY-MM-DD HH:MM` when `ms` is not on the day of `now_ms`.
fn clock_bare(ms: i64, now_ms: i64) -> String {
    let full = format_ms(ms.div_euclid(60_000) * 60_000);
    // "YYYY-MM-DDTHH:MM:SS.sssZ"
    let (date, hm) = (&full[..10], &full[11..16]);
    if ms.div_euclid(86_400_000) == now_ms.div_euclid(86_400_000) {
        hm.to_string()
    } else {
        format!("{date} {hm}")
    }
}

/// A duration in whole units, truncated: `42s`, `42m`, `3h05m`, `2d04h`.
fn span(seconds: f64) -> String {
    let s = if seconds.is_finite() && seconds > 0.0 { seconds as u64 } else { 0 };
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m", s / 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// `1204` as `1,204`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // 2026-12-06T14:00:00Z
    const NOW: i64 = 1_796_565_600_000;

    #[test]
    fn the_clock_is_utc_to_the_minute_with_the_date_off_today() {
        assert_eq!(format_ms(NOW), "2026-12-06T14:00:00.000Z");
        assert_eq!(clock(NOW + 20 * 60_000 + 59_999, NOW), "14:20 UTC");
        assert_eq!(clock(NOW - 14 * 3_600_000, NOW), "00:00 UTC");
        assert_eq!(clock(NOW + 10 * 3_600_000, NOW), "2026-12-07 00:00 UTC");
        assert_eq!(clock(NOW - 14 * 3_600_000 - 1, NOW), "2026-12-05 23:59 UTC");
    }

    #[test]
    fn spans_and_counts_read_as_people_write_them() {
        assert_eq!(span(0.0), "0s");
        assert_eq!(span(59.9), "59s");
        assert_eq!(span(42.0 * 60.0 + 30.0), "42m");
        assert_eq!(span(3.0 * 3600.0 + 5.0 * 60.0), "3h05m");
        assert_eq!(span(2.0 * 86_400.0 + 4.0 * 3600.0 + 59.0), "2d04h");
        assert_eq!(span(f64::NAN), "0s");
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1204), "1,204");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn a_waiting_job_gets_its_expected_start_interval_wait_and_basis() {
        let job = json!({
            "job_id": "slurm/c/123", "state": "queued", "waiting_seconds": 2520.0,
            "expected_start": {
                "at": "2026-12-06T14:20:31.000Z", "low": "2026-12-06T13:50:00.000Z",
                "high": "2026-12-06T15:40:59.999Z", "interval": 0.8, "basis": "history+scheduler",
                "comparable_jobs": 1204, "group": null, "waited_seconds": 2520.4
            }
        });
        assert_eq!(
            line(&job, NOW).expect("line"),
            "slurm/c/123: expected start 14:20 UTC (80%: 13:50-15:40), waited 42m, basis history+scheduler \
             (1,204 comparable jobs)"
        );
        let mut sched = job.clone();
        sched["expected_start"]["basis"] = json!("scheduler");
        sched["expected_start"]["comparable_jobs"] = json!(0);
        sched["expected_start"]["high"] = json!("2026-12-07T01:00:00.000Z");
        assert_eq!(
            line(&sched, NOW).expect("line"),
            "slurm/c/123: expected start 14:20 UTC (80%: 13:50-2026-12-07 01:00), waited 42m, basis scheduler"
        );
        let none = json!({"job_id": "j", "state": "preparing", "waiting_seconds": 65.0, "expected_start": null});
        assert_eq!(
            line(&none, NOW).expect("line"),
            "j: preparing, waited 1m, no expected start (no comparable jobs started and no scheduler estimate)"
        );
    }

    #[test]
    fn a_started_or_ended_job_says_so() {
        let running = json!({"job_id": "j", "state": "running", "first_step_at": "2026-12-06T13:05:00.000Z",
            "time_to_first_step_seconds": 600.0, "expected_start": null});
        assert_eq!(line(&running, NOW).expect("line"), "j: running, started at 13:05 UTC after waiting 10m");
        let done = json!({"job_id": "j", "state": "done", "first_step_at": "2026-12-05T23:00:00.000Z",
            "done_at": "2026-12-06T01:00:00.000Z", "outcome": "succeeded"});
        assert_eq!(
            line(&done, NOW).expect("line"),
            "j: ended at 01:00 UTC (succeeded), started at 2026-12-05 23:00 UTC"
        );
        let never =
            json!({"job_id": "j", "state": "done", "first_step_at": null, "done_at": null, "outcome": "cancelled"});
        assert_eq!(line(&never, NOW).expect("line"), "j: ended (cancelled), never started");
    }

    #[test]
    fn a_malformed_answer_names_the_field() {
        let e = line(&json!({"job_id": "j", "state": "queued", "expected_start": {"at": "soon"}}), NOW);
        assert!(matches!(e, Err(EtaError::Field("expected_start.at"))), "{e:?}");
        assert!(matches!(line(&json!({"state": "queued"}), NOW), Err(EtaError::Field("job_id"))));
        let e = line(&json!({"job_id": "j", "state": "running", "first_step_at": 5}), NOW);
        assert!(matches!(e, Err(EtaError::Field("first_step_at"))), "{e:?}");
    }

    #[test]
    fn job_ids_keep_their_slashes_in_the_path() {
        assert_eq!(path_escape("slurm/c/123"), "slurm/c/123");
        assert_eq!(path_escape("k8s/ns/a b?#%"), "k8s/ns/a%20b%3F%23%25");
    }
}
