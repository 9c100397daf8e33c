//! Times as text, in UTC: the one formatter of every form clrscope writes a time in (chrono
//! underneath; .NET's seven-digit fractions by hand, as chrono writes 3, 6 or 9).

use std::time::{SystemTime, UNIX_EPOCH};

use chrono::{DateTime, SecondsFormat};

/// The written forms of a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// RFC 3339 with microseconds: `2026-11-18T11:06:40.123456Z` (reports, operation times).
    Micros,
    /// RFC 3339 with as many fractional digits as the time needs (3, 6 or 9), for messages.
    Auto,
    /// .NET's round-trip ("o") form: seven fractional digits, as .NET writes exception times.
    DotNet,
    /// .NET's round-trip time as System.Text.Json writes a `DateTime`
    /// (`2026-12-04T09:01:02.1234567+00:00`): the fraction without trailing zeros (none when
    /// zero), UTC as `+00:00`; dotnet-monitor's live metrics.
    DotNetJson,
    /// .NET's universal sortable ("u") form, `2024-01-02 03:04:05Z`: dotnet-monitor's log times.
    Universal,
    /// `yyyyMMdd_HHmmss_fff`, dotnet-monitor's file-name time stamp.
    FileName,
}

/// `unix_nanos` written in `form`.
pub fn format(unix_nanos: i64, form: Form) -> String {
    let time = DateTime::from_timestamp_nanos(unix_nanos);
    match form {
        Form::Micros => time.to_rfc3339_opts(SecondsFormat::Micros, true),
        Form::Auto => time.to_rfc3339_opts(SecondsFormat::AutoSi, true),
        // chrono writes 3, 6 or 9 fractional digits, not .NET's 7.
        Form::DotNet => format!(
            "{}.{:07}Z",
            time.format("%Y-%m-%dT%H:%M:%S"),
            unix_nanos.rem_euclid(1_000_000_000) / 100
        ),
        Form::DotNetJson => {
            let mut text = time.format("%Y-%m-%dT%H:%M:%S").to_string();
            let ticks = unix_nanos.rem_euclid(1_000_000_000) / 100;
            if ticks != 0 {
                let fraction = format!("{ticks:07}");
                text.push('.');
                text.push_str(fraction.trim_end_matches('0'));
            }
            text.push_str("+00:00");
            text
        }
        Form::Universal => time.format("%Y-%m-%d %H:%M:%SZ").to_string(),
        Form::FileName => time.format("%Y%m%d_%H%M%S_%3f").to_string(),
    }
}

/// A system time as Unix nanoseconds (times before 1970 as 1970).
pub fn unix_nanos(at: SystemTime) -> i64 {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_nanos()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_dates() {
        let rfc3339 = |n| format(n, Form::Micros);
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            rfc3339(1_795_000_000_123_456_789),
            "2026-11-18T11:06:40.123456Z"
        );
        assert_eq!(
            rfc3339(951_782_400_000_000_000),
            "2000-02-29T00:00:00.000000Z"
        );
        assert_eq!(rfc3339(-1_000), "1969-12-31T23:59:59.999999Z");
    }

    #[test]
    fn file_name_stamps_follow_dotnet_monitor() {
        let file_timestamp = |at| format(unix_nanos(at), Form::FileName);
        // 2024-02-29 13:05:09.042 UTC
        let at = UNIX_EPOCH + Duration::from_millis(1_709_211_909_042);
        assert_eq!(file_timestamp(at), "20240229_130509_042");
        assert_eq!(file_timestamp(UNIX_EPOCH), "19700101_000000_000");
    }
}
