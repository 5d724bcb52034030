//! The alert record (one alert and its lifecycle) and its stored codec: JSON bodies that the store seals with a
//! version and a checksum under the alert's key. The store only moves `(key, bytes)` pairs; this module alone
//! knows what the bytes mean.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One alert and its lifecycle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlertRecord {
    /// Identity: `job/<slo>/<job_id>` or `burn/<slo>/<severity>`.
    pub key: String,
    /// Alertmanager labels (identity for deduplication there).
    pub labels: BTreeMap<String, String>,
    /// Human-readable details.
    pub annotations: BTreeMap<String, String>,
    /// When it started firing (Unix ms).
    pub starts_at_ms: i64,
    /// When it resolved, if it has.
    pub resolved_at_ms: Option<i64>,
}

impl AlertRecord {
    /// Whether it is firing.
    pub fn firing(&self) -> bool {
        self.resolved_at_ms.is_none()
    }
}

/// A stored alert record that cannot be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The body is not the JSON of an alert record.
    #[error("not a valid alert record: {0}")]
    Json(#[from] serde_json::Error),
}

/// Encodes a record as stored: its key and its JSON body (the store adds version and checksum).
pub fn encode(a: &AlertRecord) -> Result<(String, Vec<u8>), RecordError> {
    Ok((a.key.clone(), serde_json::to_vec(a)?))
}

/// Encodes records as stored, in order.
pub fn encode_all(alerts: &[AlertRecord]) -> Result<Vec<(String, Vec<u8>)>, RecordError> {
    alerts.iter().map(encode).collect()
}

/// Decodes a stored body (already unsealed by the store).
pub fn decode(body: &[u8]) -> Result<AlertRecord, RecordError> {
    Ok(serde_json::from_slice(body)?)
}

/// What `Store::load_alerts` hands back: a `(key, body)` pair decoded by this module's codec.
impl TryFrom<(String, Vec<u8>)> for AlertRecord {
    type Error = RecordError;

    fn try_from((_key, body): (String, Vec<u8>)) -> Result<Self, Self::Error> {
        decode(&body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    fn record(key: &str, resolved_at_ms: Option<i64>) -> AlertRecord {
        AlertRecord {
            key: key.into(),
            labels: [("alertname".to_string(), "StartlineJobStartBreach".to_string())].into_iter().collect(),
            annotations: [("summary".to_string(), "waited 12m".to_string())].into_iter().collect(),
            starts_at_ms: 1_767_225_600_000,
            resolved_at_ms,
        }
    }

    #[test]
    fn a_record_round_trips_through_its_codec() {
        let a = record("job/urgent-start/slurm/a/1", Some(1_767_225_700_000));
        let (key, body) = encode(&a).expect("encode");
        assert_eq!(key, a.key);
        assert_eq!(decode(&body).expect("decode"), a);
    }

    #[test]
    fn records_round_trip_through_the_store_sealed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open");
        let alerts = vec![record("burn/urgent-start/page", None), record("job/urgent-start/slurm/a/1", Some(5))];
        store.save_alerts(&encode_all(&alerts).expect("encode")).expect("save");
        let raw: Vec<(String, Vec<u8>)> = store.load_alerts().expect("load raw");
        assert_eq!(raw.len(), 2);
        for (key, body) in &raw {
            assert_eq!(&decode(body).expect("decode").key, key, "the store hands back the unsealed body");
        }
        let back: Vec<AlertRecord> = store.load_alerts().expect("load");
        assert_eq!(back, alerts);
    }

    #[test]
    fn a_corrupt_body_is_a_clear_error() {
        let err = decode(b"{\"key\": 3").expect_err("corrupt");
        let text = err.to_string();
        assert!(text.starts_with("not a valid alert record: "), "{text}");
        let err = decode(br#"{"key":"k"}"#).expect_err("missing fields");
        assert!(err.to_string().contains("missing field"), "{err}");
    }
}
