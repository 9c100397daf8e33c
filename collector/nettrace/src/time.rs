//! Event timestamps → UTC.
//!
//! Events carry raw QPC ticks (on Linux: `clock_gettime(CLOCK_MONOTONIC)` in ns, frequency 1e9).
//! The Trace object pairs one QPC value with the wall-clock time at which it was taken, so
//! `utc = sync_utc + (qpc - sync_qpc) / frequency`.

/// A Windows SYSTEMTIME as the Trace object stores it (all fields UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SystemTime {
    /// Year, e.g. 2026.
    pub year: u16,
    /// Month, 1–12.
    pub month: u16,
    /// Day of week, 0 = Sunday (informational; not used for conversion).
    pub day_of_week: u16,
    /// Day of month, 1–31.
    pub day: u16,
    /// Hour, 0–23.
    pub hour: u16,
    /// Minute, 0–59.
    pub minute: u16,
    /// Second, 0–59 (60 tolerated for a leap second).
    pub second: u16,
    /// Millisecond, 0–999.
    pub millisecond: u16,
}

impl SystemTime {
    /// Nanoseconds since the Unix epoch, or `None` if a field is out of range or the time does
    /// not fit i64 nanoseconds (before 1677 or after 2262).
    pub fn to_unix_nanos(&self) -> Option<i64> {
        let valid = (1..=12).contains(&self.month)
            && (1..=31).contains(&self.day)
            && self.hour < 24
            && self.minute < 60
            && self.second <= 60
            && self.millisecond < 1000
            && (1601..=9999).contains(&self.year);
        if !valid {
            return None;
        }
        let days = days_from_civil(
            i64::from(self.year),
            i64::from(self.month),
            i64::from(self.day),
        );
        let secs = days * 86_400
            + i64::from(self.hour) * 3600
            + i64::from(self.minute) * 60
            + i64::from(self.second);
        secs.checked_mul(1_000_000_000)?
            .checked_add(i64::from(self.millisecond) * 1_000_000)
    }
}

/// Days from 1970-01-01 to the given proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Converts QPC ticks of one trace to Unix nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    sync_unix_nanos: i64,
    sync_qpc: i64,
    frequency: i64,
}

impl Clock {
    /// `frequency` must be positive (checked when the Trace object is parsed).
    pub(crate) fn new(sync_unix_nanos: i64, sync_qpc: i64, frequency: i64) -> Self {
        Clock {
            sync_unix_nanos,
            sync_qpc,
            frequency: frequency.max(1),
        }
    }

    /// UTC time of a QPC timestamp, in nanoseconds since the Unix epoch (saturating).
    #[inline]
    pub fn unix_nanos(&self, qpc: i64) -> i64 {
        let delta = i128::from(qpc) - i128::from(self.sync_qpc);
        let nanos = if self.frequency == 1_000_000_000 {
            delta
        } else {
            delta * 1_000_000_000 / i128::from(self.frequency)
        };
        let t = i128::from(self.sync_unix_nanos) + nanos;
        t.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
    }

    /// QPC ticks per second.
    pub fn frequency(&self) -> i64 {
        self.frequency
    }

    /// A QPC duration in nanoseconds.
    pub fn duration_nanos(&self, qpc_delta: i64) -> i64 {
        let n = i128::from(qpc_delta) * 1_000_000_000 / i128::from(self.frequency);
        n.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
    }
}

/// Windows FILETIME (100 ns ticks since 1601-01-01 UTC), as EventSource writes `DateTime`
/// payload fields, to Unix nanoseconds (saturating).
pub fn filetime_to_unix_nanos(filetime: i64) -> i64 {
    const EPOCH_DIFF_TICKS: i128 = 116_444_736_000_000_000;
    let n = (i128::from(filetime) - EPOCH_DIFF_TICKS) * 100;
    n.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// .NET `DateTime.Ticks` (100 ns since 0001-01-01 UTC) to Unix nanoseconds (saturating).
pub fn dotnet_ticks_to_unix_nanos(ticks: i64) -> i64 {
    const UNIX_EPOCH_TICKS: i128 = 621_355_968_000_000_000;
    let n = (i128::from(ticks) - UNIX_EPOCH_TICKS) * 100;
    n.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systemtime_to_unix() {
        let t = SystemTime {
            year: 1970,
            month: 1,
            day: 1,
            ..Default::default()
        };
        assert_eq!(t.to_unix_nanos(), Some(0));
        // 2026-11-30T11:39:29.540Z
        let t = SystemTime {
            year: 2026,
            month: 11,
            day_of_week: 1,
            day: 30,
            hour: 11,
            minute: 39,
            second: 29,
            millisecond: 540,
        };
        assert_eq!(t.to_unix_nanos(), Some(1_796_038_769_540_000_000));
        assert_eq!(SystemTime::default().to_unix_nanos(), None);
        // Found by the nettrace_parse fuzz target: a valid SYSTEMTIME past 2262 overflowed.
        let far = SystemTime {
            year: 9999,
            month: 12,
            day: 31,
            ..Default::default()
        };
        assert_eq!(far.to_unix_nanos(), None);
        let early = SystemTime {
            year: 1601,
            month: 1,
            day: 1,
            ..Default::default()
        };
        assert_eq!(early.to_unix_nanos(), None);
    }

    #[test]
    fn clock() {
        let c = Clock::new(1_000_000_000, 500, 1_000_000_000);
        assert_eq!(c.unix_nanos(1500), 1_000_001_000);
        assert_eq!(c.unix_nanos(0), 999_999_500);
        let c = Clock::new(0, 0, 10_000_000); // 100 ns ticks, as on Windows
        assert_eq!(c.unix_nanos(3), 300);
        assert_eq!(c.duration_nanos(10), 1000);
        assert_eq!(c.unix_nanos(i64::MAX), i64::MAX, "saturates");
    }

    #[test]
    fn filetime() {
        assert_eq!(filetime_to_unix_nanos(116_444_736_000_000_000), 0);
        assert_eq!(filetime_to_unix_nanos(116_444_736_000_000_001), 100);
    }
}
