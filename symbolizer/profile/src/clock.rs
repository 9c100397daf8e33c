//! The wall clock as Unix time, in the integer units profiles, events and the store carry.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, Unix nanoseconds (0 before 1970, saturating in 2262).
pub fn unix_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Now, Unix milliseconds (0 before 1970).
pub fn unix_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
