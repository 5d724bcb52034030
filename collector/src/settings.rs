//! The shared vocabulary of configuration checks: a duration, a bounded count and a socket address read from a
//! settings field, each pushing one message (`<field>: <problem>`) onto the caller's error list and falling back
//! to a usable value, so that every section's `validate(&mut errors)` reports all problems at once with the same
//! wording. Imports no other collector module, so any module that owns a settings section can use it.

use std::net::SocketAddr;
use std::time::Duration;

/// A duration field: `default` when unset; a value below `min` or one that does not parse is reported.
pub fn duration(errs: &mut Vec<String>, name: &str, v: &Option<String>, default: Duration, min: Duration) -> Duration {
    match v {
        None => default,
        Some(s) => match humantime::parse_duration(s) {
            Ok(d) if d >= min => d,
            Ok(_) => {
                errs.push(format!("{name}: {s:?} is shorter than {}", humantime::format_duration(min)));
                default
            }
            Err(e) => {
                errs.push(format!("{name}: {s:?} is not a duration like \"5m\": {e}"));
                default
            }
        },
    }
}

/// A duration as a config value that [`duration`] reads back exactly: `"0s"`, `"90d"`, `"1h30m"`, `"250ms"`.
pub fn format_duration(d: Duration) -> String {
    let mut ms = d.as_millis();
    if ms == 0 {
        return "0s".to_string();
    }
    let mut out = String::new();
    for (unit, size) in [("d", 86_400_000u128), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)] {
        if ms >= size {
            out.push_str(&format!("{}{unit}", ms / size));
            ms %= size;
        }
    }
    out
}

/// A count field: `default` when unset; a value outside `lo..=hi` is reported (and returned as given).
pub fn range(errs: &mut Vec<String>, name: &str, v: Option<usize>, default: usize, lo: usize, hi: usize) -> usize {
    let x = v.unwrap_or(default);
    if !(lo..=hi).contains(&x) {
        errs.push(format!("{name}: {x} is outside {lo}..={hi}"));
    }
    x
}

/// A listen address field: `default` when unset; one that does not parse is reported.
pub fn socket_addr(errs: &mut Vec<String>, name: &str, v: &Option<String>, default: &str) -> SocketAddr {
    let s = v.as_deref().unwrap_or(default);
    s.parse().unwrap_or_else(|_| {
        errs.push(format!("{name}: {s:?} is not a socket address like 127.0.0.1:8080"));
        SocketAddr::from(([127, 0, 0, 1], 0))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unset_field_takes_its_default_without_error() {
        let mut errs = Vec::new();
        assert_eq!(duration(&mut errs, "a.b", &None, Duration::from_secs(2), Duration::ZERO), Duration::from_secs(2));
        assert_eq!(range(&mut errs, "a.c", None, 7, 1, 10), 7);
        assert_eq!(socket_addr(&mut errs, "a.d", &None, "127.0.0.1:9"), SocketAddr::from(([127, 0, 0, 1], 9)));
        assert!(errs.is_empty(), "{errs:?}");
    }

    #[test]
    fn formatted_durations_read_back_exactly() {
        for ms in [0u64, 1, 250, 1000, 2000, 60_000, 90 * 60_000, 86_400_000, 90 * 86_400_000, 93_784_005] {
            let d = Duration::from_millis(ms);
            let text = format_duration(d);
            let mut errs = Vec::new();
            assert_eq!(duration(&mut errs, "x", &Some(text.clone()), Duration::ZERO, Duration::ZERO), d, "{text}");
            assert!(errs.is_empty(), "{text}: {errs:?}");
        }
        assert_eq!(format_duration(Duration::from_secs(90 * 86_400)), "90d");
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m");
        assert_eq!(format_duration(Duration::from_millis(93_784_005)), "1d2h3m4s5ms");
    }

    #[test]
    fn bad_values_are_reported_with_the_field_name() {
        let mut errs = Vec::new();
        let min = Duration::from_secs(1);
        duration(&mut errs, "a.short", &Some("1ms".into()), min, min);
        duration(&mut errs, "a.word", &Some("soon".into()), min, min);
        range(&mut errs, "a.n", Some(0), 5, 1, 10);
        socket_addr(&mut errs, "a.addr", &Some("nowhere".into()), "127.0.0.1:1");
        assert_eq!(errs[0], "a.short: \"1ms\" is shorter than 1s");
        assert!(errs[1].starts_with("a.word: \"soon\" is not a duration like \"5m\": "), "{}", errs[1]);
        assert_eq!(errs[2], "a.n: 0 is outside 1..=10");
        assert_eq!(errs[3], "a.addr: \"nowhere\" is not a socket address like 127.0.0.1:8080");
        assert_eq!(errs.len(), 4);
    }
}
