//! Timestamps: the protocol carries `google.protobuf.Timestamp`; inside Startline time is Unix milliseconds (`i64`).

/// Converts a protobuf timestamp to Unix milliseconds, rounding towards negative infinity.
pub fn timestamp_to_ms(ts: &prost_types::Timestamp) -> i64 {
    ts.seconds.saturating_mul(1000).saturating_add(i64::from(ts.nanos).div_euclid(1_000_000))
}

/// Converts Unix milliseconds to a protobuf timestamp.
pub fn ms_to_timestamp(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        // The remainder is in 0..1000, so the product fits in i32.
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

/// The current wall-clock time in Unix milliseconds. Only edges (ingest, agents) call this; domain code takes
/// time as an argument.
pub fn now_ms() -> i64 {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_including_negative_times() {
        for ms in [0, 1, 999, 1000, 1_700_000_000_123, -1, -1001] {
            assert_eq!(timestamp_to_ms(&ms_to_timestamp(ms)), ms);
        }
    }
}
