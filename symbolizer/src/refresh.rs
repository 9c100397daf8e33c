//! When to ask the runtime for another rundown.
//!
//! ReadyToRun methods only appear in a rundown once their entry point is bound, so samples in R2R
//! code that ran for the first time after the last rundown land as `module!+0xOFFSET`. Another
//! rundown fixes that but costs the target a full enumeration of its code heaps, so the agent asks
//! for one only when misses keep coming, and never more often than a minimum interval. A rundown
//! that failed (a target too busy to answer in time) is retried at twice the interval each time,
//! up to [`MAX_BACKOFF`] times it, so a starved target is not asked for the same heavy work every
//! minute.

/// The most a failed rundown stretches the interval by.
pub const MAX_BACKOFF: u64 = 32;

/// A pure rate limiter: the caller reports misses and asks with its own clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RundownRefreshPolicy {
    min_interval_ns: u64,
    min_misses: u64,
    pending_misses: u64,
    last_refresh_ns: Option<u64>,
    /// Multiplies `min_interval_ns`: 1, doubled by each failed refresh.
    backoff: u64,
}

impl RundownRefreshPolicy {
    /// `min_interval_ns`: least time between two refreshes; `min_misses`: misses (frames with
    /// [`crate::FrameKind::Unknown`] and `in_r2r_image`) needed to justify one (at least 1).
    pub fn new(min_interval_ns: u64, min_misses: u64) -> Self {
        Self {
            min_interval_ns,
            min_misses: min_misses.max(1),
            pending_misses: 0,
            last_refresh_ns: None,
            backoff: 1,
        }
    }

    /// The refresh last started failed: the next waits twice as long as this one did.
    pub fn record_failure(&mut self) {
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    /// The refresh last started succeeded: back to the plain interval.
    pub fn record_success(&mut self) {
        self.backoff = 1;
    }

    /// Counts misses seen since the last refresh.
    pub fn record_misses(&mut self, count: u64) {
        self.pending_misses = self.pending_misses.saturating_add(count);
    }

    /// Misses counted since the last refresh.
    pub fn pending_misses(&self) -> u64 {
        self.pending_misses
    }

    /// Returns true when a refresh should start now, and then starts a new interval. `now_ns` is a
    /// monotonic clock; a clock that goes backwards is treated as "no time has passed".
    pub fn should_refresh(&mut self, now_ns: u64) -> bool {
        if self.pending_misses < self.min_misses {
            return false;
        }
        if let Some(last) = self.last_refresh_ns {
            if now_ns.saturating_sub(last) < self.min_interval_ns.saturating_mul(self.backoff) {
                return false;
            }
        }
        self.last_refresh_ns = Some(now_ns);
        self.pending_misses = 0;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn needs_enough_misses() {
        let mut policy = RundownRefreshPolicy::new(60 * SEC, 10);
        policy.record_misses(9);
        assert!(!policy.should_refresh(0));
        policy.record_misses(1);
        assert!(policy.should_refresh(0));
        assert_eq!(policy.pending_misses(), 0);
    }

    #[test]
    fn respects_the_interval() {
        let mut policy = RundownRefreshPolicy::new(60 * SEC, 1);
        policy.record_misses(5);
        assert!(policy.should_refresh(100 * SEC));
        policy.record_misses(5);
        assert!(!policy.should_refresh(159 * SEC));
        assert_eq!(
            policy.pending_misses(),
            5,
            "misses are kept until the refresh"
        );
        assert!(policy.should_refresh(160 * SEC));
    }

    #[test]
    fn clock_going_backwards_does_not_refresh() {
        let mut policy = RundownRefreshPolicy::new(SEC, 1);
        policy.record_misses(1);
        assert!(policy.should_refresh(50 * SEC));
        policy.record_misses(1);
        assert!(!policy.should_refresh(10 * SEC));
    }

    #[test]
    fn failures_stretch_the_interval_until_a_success() {
        let mut policy = RundownRefreshPolicy::new(60 * SEC, 1);
        policy.record_misses(3);
        assert!(policy.should_refresh(0));
        let mut at = 0;
        for backoff in [2, 4, 8, 16, 32, 32] {
            policy.record_failure();
            policy.record_misses(3);
            assert!(!policy.should_refresh(at + backoff * 60 * SEC - 1));
            at += backoff * 60 * SEC;
            assert!(policy.should_refresh(at), "after {backoff} intervals");
        }
        policy.record_success();
        policy.record_misses(1);
        assert!(policy.should_refresh(at + 60 * SEC));
    }

    #[test]
    fn zero_min_misses_still_needs_one() {
        let mut policy = RundownRefreshPolicy::new(0, 0);
        assert!(!policy.should_refresh(0));
        policy.record_misses(u64::MAX);
        policy.record_misses(u64::MAX);
        assert!(policy.should_refresh(0));
    }
}
