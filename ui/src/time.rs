//! Durations and points in time as people type them, for the HTTP API and the command line.

use std::time::Duration;

use chrono::DateTime;

use settings::parse_duration;

/// A duration in nanoseconds, saturating at `i64::MAX` (292 years).
pub fn duration_nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// Parses a point in time into Unix nanoseconds: `now`, `now-5m` (any [`parse_duration`]
/// duration), integer Unix milliseconds (`1764464880000`) or RFC 3339
/// (`2025-11-30T01:08:00Z`, `2025-11-30T02:08:00.5+01:00`).
pub fn parse_time(text: &str, now_unix_nanos: i64) -> Result<i64, String> {
    let text = text.trim();
    let invalid = |why: &str| {
        format!(
            "invalid time {text:?}{why}: use now, now-5m, Unix milliseconds \
             (e.g. 1764464880000) or RFC 3339 (e.g. 2025-11-30T01:08:00Z)"
        )
    };
    let out_of_range = || invalid(" (out of range)");
    if text == "now" {
        return Ok(now_unix_nanos);
    }
    if let Some(ago) = text.strip_prefix("now-") {
        let ago = parse_duration(ago).map_err(|e| invalid(&format!(" ({e})")))?;
        return now_unix_nanos
            .checked_sub(duration_nanos(ago))
            .ok_or_else(out_of_range);
    }
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<i64>()
            .ok()
            .and_then(|ms| ms.checked_mul(1_000_000))
            .ok_or_else(out_of_range);
    }
    DateTime::parse_from_rfc3339(text)
        .map_err(|_| invalid(""))?
        .timestamp_nanos_opt()
        .ok_or_else(out_of_range)
}

#[cfg(test)]
mod tests {
    use super::*;
    use profile::utc;

    #[test]
    fn times() {
        // 2025-11-30T01:08:00Z
        const T: i64 = 1_764_464_880_000_000_000;
        let now = T + 3_600_000_000_000;
        assert_eq!(parse_time("now", now), Ok(now));
        assert_eq!(parse_time(" now-1h ", now), Ok(T));
        assert_eq!(parse_time("now-1m30s", now), Ok(now - 90_000_000_000));
        assert_eq!(parse_time("1764464880000", now), Ok(T));
        assert_eq!(parse_time("2025-11-30T01:08:00Z", now), Ok(T));
        assert_eq!(
            parse_time("2025-11-30T02:08:00.5+01:00", now),
            Ok(T + 500_000_000)
        );
        assert_eq!(
            utc::format(T + 500_000_000, utc::Form::Auto),
            "2025-11-30T01:08:00.500Z"
        );
        for bad in [
            "",
            "now-",
            "now+5m",
            "now-5x",
            "yesterday",
            "-5",
            "2025-11-30",
            "1.5",
        ] {
            let e = parse_time(bad, now).unwrap_err();
            assert!(e.contains("RFC 3339"), "{bad:?}: {e}");
        }
        assert!(parse_time("99999999999999999", now)
            .unwrap_err()
            .contains("out of range"));
        assert!(parse_time("9999-01-01T00:00:00Z", now)
            .unwrap_err()
            .contains("out of range"));
    }
}
