//! The Schedule trigger (clrscope's own; dotnet-monitor has none): a rule that fires every
//! `Interval` from the moment it is applied, or at the times a cron expression names, in UTC.

use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};

/// When a Schedule trigger fires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Schedule {
    /// Every interval, counted from the rule's start (the first firing is one interval in).
    Every(Duration),
    /// At the times of a cron expression (5 fields, or 6 with seconds first), in UTC.
    Cron(Box<croner::Cron>),
}

impl Schedule {
    /// Parses a cron expression: `minute hour day-of-month month day-of-week`, optionally with a
    /// seconds field first; the error says what is wrong with it.
    pub fn cron(expression: &str) -> Result<Schedule, String> {
        let cron: croner::Cron = expression.parse().map_err(|e| format!("{e}"))?;
        // An expression no date matches (`0 0 31 2 *`) would never fire: say so now.
        let probe = DateTime::<Utc>::from(SystemTime::UNIX_EPOCH);
        cron.find_next_occurrence(&probe, false)
            .map_err(|e| format!("it names no time that exists ({e})"))?;
        Ok(Schedule::Cron(Box::new(cron)))
    }

    /// The first firing strictly after `now` for a rule applied at `since`; `None` when there is
    /// none (a cron expression whose times have all passed).
    pub fn next_after(&self, now: SystemTime, since: SystemTime) -> Option<SystemTime> {
        match self {
            Schedule::Every(interval) => {
                let elapsed = now.duration_since(since).unwrap_or(Duration::ZERO);
                let ticks = elapsed.as_nanos() / interval.as_nanos().max(1) + 1;
                let offset = interval.checked_mul(u32::try_from(ticks).ok()?)?;
                since.checked_add(offset)
            }
            Schedule::Cron(cron) => {
                let now = DateTime::<Utc>::from(now);
                cron.find_next_occurrence(&now, false)
                    .ok()
                    .map(SystemTime::from)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn intervals_count_from_the_rules_start_and_skip_missed_ticks() {
        let every = Schedule::Every(Duration::from_secs(20));
        let start = at(1_000_003);
        assert_eq!(every.next_after(start, start), Some(at(1_000_023)));
        assert_eq!(every.next_after(at(1_000_022), start), Some(at(1_000_023)));
        // Exactly on a tick: the next one (the tick itself has fired).
        assert_eq!(every.next_after(at(1_000_023), start), Some(at(1_000_043)));
        // An action that overran two ticks: the next one still on the grid.
        assert_eq!(every.next_after(at(1_000_070), start), Some(at(1_000_083)));
        // A clock set back before the start: the first tick.
        assert_eq!(every.next_after(at(5), start), Some(at(1_000_023)));
    }

    #[test]
    fn cron_expressions_are_read_in_utc_with_optional_seconds() {
        // 2023-11-14T22:13:20Z.
        let now = at(1_700_000_000);
        let quarter = Schedule::cron("*/15 * * * *").unwrap();
        // Next quarter hour: 22:15:00.
        assert_eq!(quarter.next_after(now, now), Some(at(1_700_000_100)));
        let daily = Schedule::cron("30 2 * * *").unwrap();
        // 2023-11-15T02:30:00Z.
        assert_eq!(daily.next_after(now, now), Some(at(1_700_015_400)));
        let seconds = Schedule::cron("*/20 * * * * *").unwrap();
        assert_eq!(seconds.next_after(now, now), Some(at(1_700_000_020)));
        assert!(Schedule::cron("every hour").is_err());
        assert!(Schedule::cron("61 * * * *").is_err());
        assert!(Schedule::cron("0 0 31 2 *").is_err());
    }
}
