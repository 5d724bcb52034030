//! Time for the collector: the clock (wall time in Unix milliseconds, advanced by tokio's clock so that tests can
//! pause and advance time with `tokio::time::pause` and every deadline follows) and the text form of times
//! (RFC 3339 for output, RFC 3339 or Unix seconds for input). The clock is read only at the edges (ingest, the
//! alert loop, the API); domain code takes `now_ms` as an argument. Imports no other collector module.

use std::time::{Duration, UNIX_EPOCH};
use tokio::time::Instant;

/// A wall clock anchored once, advanced by tokio's monotonic clock.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin_ms: i64,
    origin: Instant,
}

impl Clock {
    /// Anchors to the system's wall clock now.
    pub fn system() -> Self {
        Clock { origin_ms: startline_proto::time::now_ms(), origin: Instant::now() }
    }

    /// Anchors to a given wall time (tests).
    pub fn starting_at(origin_ms: i64) -> Self {
        Clock { origin_ms, origin: Instant::now() }
    }

    /// Now, in Unix milliseconds.
    pub fn now_ms(&self) -> i64 {
        self.origin_ms + Instant::now().saturating_duration_since(self.origin).as_millis() as i64
    }

    /// The tokio instant at which the wall clock reads `ms` (now, if that is in the past).
    pub fn instant_at(&self, ms: i64) -> Instant {
        let now = self.now_ms();
        Instant::now() + std::time::Duration::from_millis((ms - now).max(0) as u64)
    }
}

/// Formats Unix milliseconds as RFC 3339 UTC with milliseconds.
pub fn format_ms(ms: i64) -> String {
    let t = if ms >= 0 {
        UNIX_EPOCH + Duration::from_millis(ms as u64)
    } else {
        UNIX_EPOCH - Duration::from_millis(ms.unsigned_abs())
    };
    humantime::format_rfc3339_millis(t).to_string()
}

/// Parses an RFC 3339 time (`2026-01-02T03:04:05Z`, `2026-01-02T05:04:05+02:00`: the offset is honoured) or Unix
/// seconds into Unix milliseconds (fractions below a millisecond are cut toward the earlier millisecond). A time
/// without an offset (`2026-01-02T03:04:05`, or a space for the `T`) is read as UTC, as before.
pub fn parse_time(s: &str) -> Result<i64, String> {
    if let Ok(secs) = s.parse::<i64>() {
        return secs.checked_mul(1000).ok_or_else(|| format!("{s:?} is out of range"));
    }
    let bad = || format!("{s:?} is not an RFC 3339 time like 2026-01-02T03:04:05Z or +02:00, or Unix seconds");
    let nanos = match time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339) {
        Ok(t) => t.unix_timestamp_nanos(),
        Err(_) => {
            let t = humantime::parse_rfc3339_weak(s).map_err(|_| bad())?;
            let d = t.duration_since(UNIX_EPOCH).map_err(|_| format!("{s:?} is before 1970"))?;
            i128::try_from(d.as_nanos()).map_err(|_| format!("{s:?} is out of range"))?
        }
    };
    if nanos < 0 {
        return Err(format!("{s:?} is before 1970"));
    }
    i64::try_from(nanos.div_euclid(1_000_000)).map_err(|_| format!("{s:?} is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_formats_and_parses_back() {
        let ms = 1_767_225_600_123;
        assert_eq!(format_ms(ms), "2026-01-01T00:00:00.123Z");
        assert_eq!(parse_time("2026-01-01T00:00:00Z"), Ok(1_767_225_600_000));
        assert_eq!(parse_time("1767225600"), Ok(1_767_225_600_000));
        assert!(parse_time("yesterday").is_err());
    }

    /// Offsets are honoured (values from `date -u -d '2026-01-01T00:00:00Z' +%s%3N`: 1767225600000, minus or
    /// plus the offset by hand); a time without one is UTC.
    #[test]
    fn offsets_are_honoured_and_a_time_without_one_is_utc() {
        let utc_midnight = 1_767_225_600_000;
        assert_eq!(parse_time("2026-01-01T02:00:00+02:00"), Ok(utc_midnight));
        assert_eq!(parse_time("2025-12-31T19:00:00-05:00"), Ok(utc_midnight));
        assert_eq!(parse_time("2026-01-01T05:45:00.1234567+05:45"), Ok(utc_midnight + 123));
        assert_eq!(parse_time("2026-01-01T00:00:00"), Ok(utc_midnight));
        assert_eq!(parse_time("2026-01-01 00:00:00"), Ok(utc_midnight));
        assert!(parse_time("1969-12-31T23:00:00Z").is_err());
        assert!(parse_time("2026-01-01T00:00:00+25:00").is_err());
    }
}
