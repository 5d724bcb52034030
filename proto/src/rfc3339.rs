//! RFC 3339 timestamps, the one parser and one formatter of the agent and the JSON form ([`crate::json`]): every
//! adapter reads provider times with
//! [`parse_ms`] (or [`json_ms`] for a JSON field), and every time the agent writes as text goes through
//! [`format_ms`]. Times are Unix milliseconds (`i64`), as in the protocol's helpers
//! ([`crate::time`]).
//!
//! # Parsing ([`parse_ms`])
//! The grammar is RFC 3339's `date-time` (section 5.6), checked by the `time` crate:
//! `YYYY-MM-DDTHH:MM:SS[.fraction](Z|+hh:mm|-hh:mm)`, years 0000 to 9999.
//! - **The offset is required and honoured**: `Z`, `z`, or any `+hh:mm`/`-hh:mm` (hours up to 23, minutes up to
//!   59; `-00:00` is UTC). `10:00:00+02:00` is 08:00 UTC. A time without an offset is refused (`None`), not read
//!   as UTC: RFC 3339 requires one, and every payload the adapters read carries one (Kubernetes and Vertex AI
//!   send `Z`, Azure ML `Z` or `+00:00`; see the fixtures), so a missing offset is a local time of unknown zone.
//! - **Fractional seconds**: any number of digits (Azure sends seven, Kubernetes `MicroTime` six, others nine);
//!   digits past the ninth are ignored. The result is **truncated toward the earlier millisecond** (floor,
//!   never rounded), also before 1970: `…:12.1239Z` is `…:12.123`, `1969-12-31T23:59:59.9999Z` is `-1`.
//! - **Separator**: `T`, `t`, or a space (RFC 3339 section 5.6 allows a space "for readability"); nothing else.
//! - A leap second (`23:59:60`, only at the end of a month in UTC) is the millisecond before the next minute.
//! - Anything else (empty text, surrounding whitespace, trailing characters, an impossible date or time such as
//!   February 30 or `24:00:00`, an offset without its minutes) is `None`. Parsing never panics.
//!
//! # Formatting ([`format_ms`])
//! `YYYY-MM-DDTHH:MM:SS.mmmZ`: UTC, always exactly three fractional digits (what `tail` prints, what `emit`
//! stamps, what the Vertex AI list filter sends). A time outside RFC 3339's years (before 0000 or after 9999)
//! is clamped to the first or last millisecond of that range, so the output is always valid RFC 3339 and
//! [`parse_ms`] reads it back.

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// `0000-01-01T00:00:00.000Z`, the earliest time RFC 3339 can write, in Unix milliseconds.
pub const MIN_MS: i64 = -62_167_219_200_000;
/// `9999-12-31T23:59:59.999Z`, the latest time RFC 3339 can write, in Unix milliseconds.
pub const MAX_MS: i64 = 253_402_300_799_999;

/// Parses RFC 3339 text into Unix milliseconds (see the module's rules); `None` when it is not RFC 3339.
pub fn parse_ms(s: &str) -> Option<i64> {
    // `time` accepts any single byte between the date and the time; RFC 3339 allows `T`, `t` or a space only.
    if !matches!(s.as_bytes().get(10), Some(b'T' | b't' | b' ')) {
        return None;
    }
    let at = OffsetDateTime::parse(s, &Rfc3339).ok()?;
    i64::try_from(at.unix_timestamp_nanos().div_euclid(1_000_000)).ok()
}

/// [`parse_ms`] of a JSON string; `None` for anything else (absent, `null`, a number, an object).
pub fn json_ms(v: &serde_json::Value) -> Option<i64> {
    parse_ms(v.as_str()?)
}

/// Formats Unix milliseconds as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC), clamped to [`MIN_MS`]..=[`MAX_MS`].
pub fn format_ms(ms: i64) -> String {
    let ms = ms.clamp(MIN_MS, MAX_MS);
    // Within the clamp `time` represents every second, so the fallback is never taken.
    let t = OffsetDateTime::from_unix_timestamp(ms.div_euclid(1000)).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        ms.rem_euclid(1000)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Expected values are Unix milliseconds computed outside this module, with GNU date on the UTC instant each
    // case names: `date -u -d 2024-03-05T08:11:12Z +%s%3N` (for times before 1970 `%s%3N` misprints, so those
    // are written out by hand in their comment).
    const T_10_11_12: i64 = 1_709_633_472_000; // 2024-03-05T10:11:12Z

    #[test]
    fn parses_offsets_fractions_and_separators() {
        let cases: &[(&str, i64, &str)] = &[
            ("2024-03-05T10:11:12Z", T_10_11_12, "Z"),
            ("2024-03-05T10:11:12+02:00", 1_709_626_272_000, "+02:00 is 2 hours earlier in UTC: 08:11:12Z"),
            ("2024-03-05T10:11:12-05:00", 1_709_651_472_000, "-05:00 is 5 hours later in UTC: 15:11:12Z"),
            ("2024-03-05T10:11:12+05:45", 1_709_612_772_000, "+05:45 (Nepal): 04:26:12Z"),
            ("2024-03-05T10:11:12+00:00", T_10_11_12, "+00:00 is UTC"),
            ("2024-03-05T10:11:12-00:00", T_10_11_12, "-00:00 (unknown local offset) is UTC"),
            ("2024-03-05T10:11:12.1234567Z", 1_709_633_472_123, "seven digits (Azure), truncated"),
            ("2024-03-05T10:11:12.123456789Z", 1_709_633_472_123, "nanoseconds (Kubernetes), truncated"),
            ("2024-03-05T10:11:12.123456Z", 1_709_633_472_123, "microseconds (Kubernetes MicroTime)"),
            ("2024-03-05T10:11:12.9999999Z", 1_709_633_472_999, "truncated, not rounded up to the next second"),
            ("2024-03-05T10:11:12.5Z", 1_709_633_472_500, "one digit"),
            ("2024-03-05T10:11:12.1234567891Z", 1_709_633_472_123, "digits past the ninth are ignored"),
            ("2024-03-05T10:11:12.1234567+02:00", 1_709_626_272_123, "fraction and offset"),
            ("2024-03-05t10:11:12.123z", 1_709_633_472_123, "lowercase t and z"),
            ("2024-03-05 10:11:12Z", T_10_11_12, "a space separator (RFC 3339 5.6 note)"),
            ("2024-03-01T01:00:00+02:00", 1_709_247_600_000, "the offset moves the date back: 2024-02-29T23:00:00Z"),
            ("2023-12-31T22:00:00-05:00", 1_704_078_000_000, "the offset moves the year on: 2024-01-01T03:00:00Z"),
            ("2016-12-31T23:59:60Z", 1_483_228_799_999, "a leap second is 23:59:59.999"),
            ("1970-01-01T00:00:00Z", 0, "the epoch"),
            ("1969-12-31T23:59:59.9999Z", -1, "before 1970 truncation is still toward the earlier ms: -1 s + 999 ms"),
            ("0000-01-01T00:00:00Z", MIN_MS, "the first RFC 3339 time (62167219200 s before the epoch)"),
            ("9999-12-31T23:59:59.999Z", MAX_MS, "the last RFC 3339 millisecond"),
        ];
        for &(text, want, why) in cases {
            assert_eq!(parse_ms(text), Some(want), "{text}: {why}");
        }
    }

    #[test]
    fn refuses_what_is_not_rfc3339() {
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            ("2024-03-05T10:11:12", "no offset: RFC 3339 requires one, a local time of unknown zone is not UTC"),
            ("2024-03-05", "a date alone"),
            ("2024-03-05T10:11Z", "no seconds"),
            ("2024-03-05T10:11:12+02", "offset without minutes"),
            ("2024-03-05T10:11:12+0200", "offset without a colon"),
            ("2024-03-05T10:11:12+24:00", "offset hour 24"),
            ("2024-03-05T10:11:12+05:60", "offset minute 60"),
            ("2024-03-05T10:11:12.Z", "a point without digits"),
            ("2024-03-05T10:11:12,5Z", "a comma fraction"),
            ("2024-03-05X10:11:12Z", "a separator other than T, t or space"),
            ("2024-03-05\u{e9}10:11:12Z", "a multi-byte separator"),
            ("2024-03-05T10:11:12Z ", "trailing space"),
            (" 2024-03-05T10:11:12Z", "leading space"),
            ("2024-03-05T10:11:12ZZ", "trailing characters"),
            ("2024-03-05T10:11:12Z+02:00", "two offsets"),
            ("2024-02-30T00:00:00Z", "February 30"),
            ("2023-02-29T00:00:00Z", "February 29 of a common year"),
            ("2024-13-01T00:00:00Z", "month 13"),
            ("2024-00-01T00:00:00Z", "month 0"),
            ("2024-03-00T00:00:00Z", "day 0"),
            ("2024-03-05T24:00:00Z", "hour 24"),
            ("2024-03-05T10:60:00Z", "minute 60"),
            ("2024-03-05T23:59:60Z", "a leap second not at the end of a month"),
            ("24-03-05T10:11:12Z", "a two-digit year"),
            ("+2024-03-05T10:11:12Z", "a signed year"),
            ("2024-3-5T10:11:12Z", "unpadded month and day"),
            ("\u{ff12}024-03-05T10:11:12Z", "a non-ASCII digit"),
            ("yesterday", "words"),
            ("1709633472", "Unix seconds"),
        ];
        for &(text, why) in cases {
            assert_eq!(parse_ms(text), None, "{text:?}: {why}");
        }
    }

    #[test]
    fn json_fields_parse_only_as_strings() {
        assert_eq!(json_ms(&serde_json::json!("2024-03-05T10:11:12+02:00")), Some(1_709_626_272_000));
        for v in [serde_json::json!(null), serde_json::json!(1_709_633_472), serde_json::json!({"t": "x"})] {
            assert_eq!(json_ms(&v), None, "{v}");
        }
    }

    #[test]
    fn formats_utc_with_milliseconds() {
        let cases: &[(i64, &str)] = &[
            (0, "1970-01-01T00:00:00.000Z"),
            (1_767_225_600_123, "2026-01-01T00:00:00.123Z"),
            (951_827_696_007, "2000-02-29T12:34:56.007Z"),
            (T_10_11_12, "2024-03-05T10:11:12.000Z"),
            (-1, "1969-12-31T23:59:59.999Z"),
            (MIN_MS, "0000-01-01T00:00:00.000Z"),
            (MAX_MS, "9999-12-31T23:59:59.999Z"),
            (MIN_MS - 1, "0000-01-01T00:00:00.000Z"),
            (MAX_MS + 1, "9999-12-31T23:59:59.999Z"),
            (i64::MIN, "0000-01-01T00:00:00.000Z"),
            (i64::MAX, "9999-12-31T23:59:59.999Z"),
        ];
        for &(ms, want) in cases {
            assert_eq!(format_ms(ms), want, "{ms}");
        }
    }

    proptest! {
        /// Whatever the formatter writes the parser reads back to the same millisecond.
        #[test]
        fn format_then_parse_is_the_identity(ms in MIN_MS..=MAX_MS) {
            let text = format_ms(ms);
            prop_assert_eq!(text.len(), 24, "{}", text);
            prop_assert_eq!(parse_ms(&text), Some(ms), "{}", text);
        }

        /// The same instant written in any offset (by the `time` crate's own RFC 3339 formatter) is the same
        /// millisecond.
        #[test]
        fn any_offset_names_the_same_instant(ms in 0i64..=4_102_444_800_000, offset_min in -1439i32..=1439) {
            let utc = OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).expect("in range");
            let offset = time::UtcOffset::from_whole_seconds(offset_min * 60).expect("offset");
            let text = utc.to_offset(offset).format(&Rfc3339).expect("format");
            prop_assert_eq!(parse_ms(&text), Some(ms), "{}", text);
        }

        /// Garbage and near-misses are `None` or a time, never a panic.
        #[test]
        fn never_panics(s in any::<String>(),
                        near in "[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt x][0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{0,12})?([Zz]|[+-][0-9]{2}:?[0-9]{0,2})?") {
            let _ = parse_ms(&s);
            let _ = parse_ms(&near);
        }
    }
}
