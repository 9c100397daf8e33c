//! Argument value parsers shared by several commands.

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
    fn sizes() {
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("500MB"), Ok(500_000_000));
        assert_eq!(parse_bytes("1.5KiB"), Ok(1536));
        for bad in ["", "GiB", "1XB", "-1", "1e400"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?} accepted");
        }
    }
}
