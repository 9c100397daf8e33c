//! Argument value parsers shared by several commands.

/// `30s`, `1500ms`, `2m`, `1h`, `7d`, `1m30s` or seconds; the agent's HTTP API reads the same.
pub use ui::parse_duration;

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
