//! Values as people write them in settings and on the command line: durations, sizes, and the
//! serde helpers each crate's configuration section uses. One parser per notation, so a duration
//! or a size reads the same in `settings.json`, an environment variable, a command-line argument
//! and an HTTP query parameter.
//!
//! The agent reads a dotnet-monitor-style `settings.json` overlaid with `CLRSCOPE_` environment
//! variables (the binary's `agent::config` builds that tree). Environment values are always
//! strings, and dotnet-monitor's own files often quote numbers too (.NET configuration is
//! string-typed), so a section's numeric, boolean, duration and size fields deserialize through
//! [`lenient`], which takes `5` as well as `"5"`:
//!
//! ```
//! use std::time::Duration;
//!
//! #[derive(serde::Deserialize)]
//! #[serde(rename_all = "PascalCase", deny_unknown_fields)]
//! struct Limits {
//!     #[serde(default, deserialize_with = "settings::lenient::opt_number")]
//!     action_count: Option<u32>,
//!     #[serde(default, deserialize_with = "settings::lenient::opt_duration")]
//!     rule_duration: Option<Duration>,
//! }
//!
//! let limits: Limits =
//!     serde_json::from_str(r#"{"ActionCount": "5", "RuleDuration": "00:05:00"}"#).unwrap();
//! assert_eq!(limits.action_count, Some(5));
//! assert_eq!(limits.rule_duration, Some(Duration::from_secs(300)));
//! ```

use std::time::Duration;

/// Parses `30s`, `1500ms`, `2m`, `1h`, `7d`, `1m30s` or a bare number of seconds (`2.5`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let invalid =
        || format!("invalid duration {text:?}: use e.g. 30s, 1500ms, 2m, 1h, 7d or 1m30s");
    if let Ok(seconds) = text.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).map_err(|_| invalid());
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let (number, tail) = rest.split_at(digits);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let value: f64 = number.parse().map_err(|_| invalid())?;
        let seconds = match unit {
            "ms" => value / 1000.0,
            "s" => value,
            "m" => value * 60.0,
            "h" => value * 3600.0,
            "d" => value * 86400.0,
            _ => return Err(invalid()),
        };
        total += Duration::try_from_secs_f64(seconds).map_err(|_| invalid())?;
        rest = tail;
    }
    if text.is_empty() {
        return Err(invalid());
    }
    Ok(total)
}

/// Parses a .NET `TimeSpan` as dotnet-monitor's settings write them: `[d.]hh:mm[:ss[.fffffff]]`,
/// e.g. `00:00:30`, `1.02:00:00`, `00:00:00.5`. Negative spans are refused: no setting takes one.
pub fn parse_timespan(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let invalid =
        || format!("invalid TimeSpan {text:?}: use [d.]hh:mm:ss[.fffffff], e.g. 00:01:30");
    let mut parts = text.split(':');
    let (Some(first), Some(minutes)) = (parts.next(), parts.next()) else {
        return Err(invalid());
    };
    let seconds = parts.next().unwrap_or("0");
    if parts.next().is_some() {
        return Err(invalid());
    }
    let (days, hours) = match first.split_once('.') {
        Some((days, hours)) => (days, hours),
        None => ("0", first),
    };
    let whole = |digits: &str, max: u64| -> Result<u64, String> {
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid());
        }
        digits
            .parse::<u64>()
            .ok()
            .filter(|&v| v <= max)
            .ok_or_else(invalid)
    };
    let (seconds, fraction) = seconds.split_once('.').unwrap_or((seconds, ""));
    let nanos = if fraction.is_empty() {
        0
    } else if fraction.len() > 7 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    } else {
        // Ticks of 100 ns, as many digits as given.
        fraction.parse::<u64>().map_err(|_| invalid())? * 10u64.pow(9 - fraction.len() as u32)
    };
    let total_seconds = whole(days, 10_675_199)? * 86_400
        + whole(hours, 23)? * 3_600
        + whole(minutes, 59)? * 60
        + whole(seconds, 59)?;
    Ok(Duration::new(total_seconds, nanos as u32))
}

/// A duration in either notation: a .NET `TimeSpan` (`00:00:30`, what dotnet-monitor's settings
/// use) when it has a colon, else [`parse_duration`]'s (`30s`, `2.5`).
pub fn parse_setting_duration(text: &str) -> Result<Duration, String> {
    if text.contains(':') {
        parse_timespan(text)
    } else {
        parse_duration(text)
    }
}

/// Parses a size: a number of bytes, or one with a unit `KB`/`MB`/`GB`/`TB` (powers of 1000) or
/// `KiB`/`MiB`/`GiB`/`TiB` (powers of 1024), e.g. `512MiB`, `2GB`, `1.5GiB`.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let invalid = || format!("invalid size {text:?}: use e.g. 1GiB, 500MB or 1048576");
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| invalid())?;
    let scale: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return Err(invalid()),
    };
    let bytes = value * scale;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(invalid());
    }
    Ok(bytes as u64)
}

/// `deserialize_with` helpers that take a value as JSON writes it or as a string. Use the `opt_`
/// forms with `#[serde(default)]` for settings that may be absent.
pub mod lenient {
    use std::fmt::Display;
    use std::str::FromStr;
    use std::time::Duration;

    use serde::de::{Deserializer, Error};
    use serde::Deserialize;

    /// A scalar as JSON has it, or as text (from the environment or a quoted value).
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Scalar {
        Bool(bool),
        Unsigned(u64),
        Signed(i64),
        Float(f64),
        Text(String),
    }

    impl Scalar {
        fn text(self) -> String {
            match self {
                Scalar::Bool(b) => b.to_string(),
                Scalar::Unsigned(n) => n.to_string(),
                Scalar::Signed(n) => n.to_string(),
                Scalar::Float(n) => n.to_string(),
                Scalar::Text(t) => t,
            }
        }
    }

    fn parsed<'de, D, T>(
        deserializer: D,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<T, D::Error>
    where
        D: Deserializer<'de>,
    {
        let text = Scalar::deserialize(deserializer)?.text();
        parse(text.trim()).map_err(D::Error::custom)
    }

    fn from_str<T>(text: &str) -> Result<T, String>
    where
        T: FromStr,
        T::Err: Display,
    {
        text.parse::<T>()
            .map_err(|e| format!("invalid value {text:?}: {e}"))
    }

    /// A number (any `FromStr` type: integers, floats), written `5` or `"5"`.
    pub fn number<'de, D, T>(deserializer: D) -> Result<T, D::Error>
    where
        D: Deserializer<'de>,
        T: FromStr,
        T::Err: Display,
    {
        parsed(deserializer, from_str::<T>)
    }

    pub fn opt_number<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: FromStr,
        T::Err: Display,
    {
        number(deserializer).map(Some)
    }

    /// A list of numbers, each written `5` or `"5"`.
    pub fn numbers<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: FromStr,
        T::Err: Display,
    {
        Vec::<Scalar>::deserialize(deserializer)?
            .into_iter()
            .map(|item| from_str(item.text().trim()).map_err(D::Error::custom))
            .collect()
    }

    /// `true`/`false` in any letter case, as JSON booleans or strings.
    pub fn boolean<'de, D>(deserializer: D) -> Result<bool, D::Error>
    where
        D: Deserializer<'de>,
    {
        parsed(deserializer, |text| {
            match text.to_ascii_lowercase().as_str() {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err(format!("invalid boolean {text:?}: use true or false")),
            }
        })
    }

    pub fn opt_boolean<'de, D>(deserializer: D) -> Result<Option<bool>, D::Error>
    where
        D: Deserializer<'de>,
    {
        boolean(deserializer).map(Some)
    }

    /// A duration: a .NET `TimeSpan` (`"00:00:30"`), `"30s"`-style text, or a number of seconds.
    pub fn duration<'de, D>(deserializer: D) -> Result<Duration, D::Error>
    where
        D: Deserializer<'de>,
    {
        parsed(deserializer, super::parse_setting_duration)
    }

    pub fn opt_duration<'de, D>(deserializer: D) -> Result<Option<Duration>, D::Error>
    where
        D: Deserializer<'de>,
    {
        duration(deserializer).map(Some)
    }

    /// A size: a number of bytes or text with a unit (`"1GiB"`, `"500MB"`).
    pub fn bytes<'de, D>(deserializer: D) -> Result<u64, D::Error>
    where
        D: Deserializer<'de>,
    {
        parsed(deserializer, super::parse_bytes)
    }

    pub fn opt_bytes<'de, D>(deserializer: D) -> Result<Option<u64>, D::Error>
    where
        D: Deserializer<'de>,
    {
        bytes(deserializer).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2.5"), Ok(Duration::from_millis(2500)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86400)));
        for bad in ["", "s", "10x", "-1", "1m30", "abc"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn timespans() {
        assert_eq!(parse_timespan("00:00:30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_timespan("00:01"), Ok(Duration::from_secs(60)));
        assert_eq!(
            parse_timespan("1.02:03:04"),
            Ok(Duration::from_secs(93_784))
        );
        assert_eq!(parse_timespan("00:00:00.5"), Ok(Duration::from_millis(500)));
        assert_eq!(
            parse_timespan("00:00:01.0000001"),
            Ok(Duration::new(1, 100))
        );
        for bad in [
            "",
            "30",
            "00:60:00",
            "24:00:00",
            "-00:00:01",
            "00:00:00.12345678",
            "a:b:c",
            "00:00:00:00",
            "00::00",
        ] {
            assert!(parse_timespan(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            parse_setting_duration("00:00:10"),
            Ok(Duration::from_secs(10))
        );
        assert_eq!(parse_setting_duration("10s"), Ok(Duration::from_secs(10)));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("500MB"), Ok(500_000_000));
        assert_eq!(parse_bytes("1.5KiB"), Ok(1536));
        for bad in ["", "GiB", "1XB", "-1", "1e400"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[derive(serde::Deserialize, Debug, PartialEq)]
    #[serde(rename_all = "PascalCase")]
    struct Section {
        #[serde(default, deserialize_with = "lenient::opt_number")]
        count: Option<u32>,
        #[serde(default, deserialize_with = "lenient::opt_number")]
        ratio: Option<f64>,
        #[serde(default, deserialize_with = "lenient::opt_boolean")]
        enabled: Option<bool>,
        #[serde(default, deserialize_with = "lenient::opt_duration")]
        window: Option<Duration>,
        #[serde(default, deserialize_with = "lenient::opt_bytes")]
        budget: Option<u64>,
        #[serde(default, deserialize_with = "lenient::numbers")]
        pids: Vec<u32>,
    }

    #[test]
    fn lenient_values() {
        let typed: Section = serde_json::from_str(
            r#"{"Count": 5, "Ratio": 0.5, "Enabled": true, "Window": 30, "Budget": 1024, "Pids": [1, 2]}"#,
        )
        .unwrap();
        let text: Section = serde_json::from_str(
            r#"{"Count": "5", "Ratio": "0.5", "Enabled": "True", "Window": "00:00:30", "Budget": "1KiB", "Pids": ["1", 2]}"#,
        )
        .unwrap();
        assert_eq!(typed, text);
        assert_eq!(typed.window, Some(Duration::from_secs(30)));
        let empty: Section = serde_json::from_str("{}").unwrap();
        assert_eq!(empty.count, None);
        for bad in [
            r#"{"Count": "-1"}"#,
            r#"{"Count": "five"}"#,
            r#"{"Enabled": "yes"}"#,
            r#"{"Window": "soon"}"#,
            r#"{"Budget": "lots"}"#,
            r#"{"Pids": ["x"]}"#,
        ] {
            let error = serde_json::from_str::<Section>(bad)
                .unwrap_err()
                .to_string();
            assert!(error.contains("invalid"), "{bad}: {error}");
        }
    }
}
