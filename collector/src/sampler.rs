//! When the continuous sampler samples: a duty cycle, and a boost that overrides it.
//!
//! The EventPipe sampler suspends the runtime every millisecond while a session with the
//! SampleProfiler provider exists, and that interval cannot be changed over IPC on .NET ≤ 10.
//! A low rate therefore comes from sampling for a short window out of every period (the duty
//! cycle) with no sampler session in between. A boost samples without pause until a deadline.
//!
//! Every tick suspends the process and walks each of its managed threads, so what a window costs
//! grows with their number: a process with more than [`WINDOW_THREADS`] of them gets a window
//! shorter in proportion (each tick brings more samples, so a window's samples stay about as
//! many). Measured in BENCHMARKS.md, "Agent overhead", 2c: a 1 s window every 10 s cost one
//! managed worker 0.3 % of its throughput, and 1.9 % with 100 more (idle) threads.
//!
//! A process that barely ran since its last window (below [`IDLE_BELOW`] of a core) is idle: its
//! windows come one period in [`IDLE_PERIODS`], each standing for the periods skipped before it.
//! Its CPU profile keeps its totals (samples are weighed by the CPU the kernel measured over the
//! whole span) from fewer samples, and its wall profile comes from fewer, longer-standing windows.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

/// The longest one sampling window may last, boosted or not: windows are the unit in which
/// samples are symbolized and stored, so this bounds both memory and how stale the store is.
pub const MAX_WINDOW: Duration = Duration::from_secs(10);

/// Sampled threads per tick up to which the duty cycle's window is used whole.
pub const WINDOW_THREADS: u64 = 16;

/// The shortest window a high thread count shrinks a window to (a configured window shorter than
/// this stays as it is).
pub const MIN_SCALED_WINDOW: Duration = Duration::from_millis(100);

/// A process that ran less than this share of one core since its last window stopped is idle
/// (1 %: a window of it would weigh about ten milliseconds of CPU).
pub const IDLE_BELOW: f64 = 0.01;

/// An idle process is sampled one period in this many, its window standing for all of them: at
/// the default 10-s period a minute still holds two of its windows. Most pods of a node are idle,
/// and a window costs the agent about as much for an idle process as for a busy one (the runtime
/// walks every thread at every tick, busy or not).
pub const IDLE_PERIODS: u32 = 3;

/// Sample for `window` out of every `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DutyCycle {
    #[serde(with = "duration_ms", rename = "window_ms")]
    pub window: Duration,
    #[serde(with = "duration_ms", rename = "period_ms")]
    pub period: Duration,
}

/// Why a duty cycle was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DutyCycleError {
    #[error(
        "the sampling window must be at least 10 ms (got {0:?}): the sampler ticks every 1 ms"
    )]
    WindowTooShort(Duration),
    #[error("the sampling window ({window:?}) must not be longer than the period ({period:?})")]
    WindowLongerThanPeriod { window: Duration, period: Duration },
    #[error(
        "the sampling window must be at most {max:?} (got {0:?}); use a boost to sample without \
         pause",
        max = MAX_WINDOW
    )]
    WindowTooLong(Duration),
}

impl DutyCycle {
    /// 1 s out of every 10 s: about 100 samples per second per thread on average, the rate
    /// continuous profilers commonly use, at a tenth of the sampler's full-time cost.
    pub const DEFAULT: DutyCycle = DutyCycle {
        window: Duration::from_secs(1),
        period: Duration::from_secs(10),
    };

    pub fn new(window: Duration, period: Duration) -> Result<DutyCycle, DutyCycleError> {
        if window < Duration::from_millis(10) {
            return Err(DutyCycleError::WindowTooShort(window));
        }
        if window > MAX_WINDOW {
            return Err(DutyCycleError::WindowTooLong(window));
        }
        if window > period {
            return Err(DutyCycleError::WindowLongerThanPeriod { window, period });
        }
        Ok(DutyCycle { window, period })
    }

    /// The share of time the sampler runs, 0 to 1.
    pub fn fraction(&self) -> f64 {
        self.window.as_secs_f64() / self.period.as_secs_f64()
    }

    /// The window for a process whose ticks sample `threads` threads each: the whole window up
    /// to [`WINDOW_THREADS`], shorter in proportion beyond, not below [`MIN_SCALED_WINDOW`].
    pub fn window_for(&self, threads: u64) -> Duration {
        if threads <= WINDOW_THREADS {
            return self.window;
        }
        let scaled = self.window.mul_f64(WINDOW_THREADS as f64 / threads as f64);
        scaled.max(MIN_SCALED_WINDOW.min(self.window))
    }
}

impl Default for DutyCycle {
    fn default() -> Self {
        DutyCycle::DEFAULT
    }
}

mod duration_ms {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// What the sampler of one process does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SamplerStep {
    /// Sample until this instant.
    Sample { until: Instant, boosted: bool },
    /// Sample nothing until this instant (or until a boost arrives).
    Pause { until: Instant },
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct ControlState {
    duty: DutyCycle,
    boosted_until: Option<Instant>,
    /// Threads sampled per tick in the last window (0 before the first).
    threads: u64,
    /// Below this share of a core a process is idle ([`IDLE_BELOW`]; 0: never).
    idle_below: f64,
    /// Whether the process was idle when last asked ([`SamplerControl::skips_idle_period`]).
    idle: bool,
}

impl ControlState {
    fn window(&self) -> Duration {
        self.duty.window_for(self.threads)
    }
}

/// The sampler settings of one process, shared between its sampling loop and whoever may change
/// them (the HTTP API, collection rules). Cloning shares.
#[derive(Debug, Clone)]
pub struct SamplerControl {
    state: Arc<watch::Sender<ControlState>>,
}

/// What [`SamplerControl::status`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SamplerStatus {
    pub duty: DutyCycle,
    /// The window used now: the duty cycle's, shorter for a process with many threads.
    #[serde(with = "duration_ms", rename = "window_ms")]
    pub window: Duration,
    /// Threads sampled per tick in the last window (0 before the first).
    pub threads_per_tick: u64,
    /// Seconds of boost left, if boosted.
    pub boost_seconds_left: Option<f64>,
    /// Below this share of a core (in percent) since its last window the process is idle, and
    /// sampled one period in [`IDLE_PERIODS`]; 0: never idle.
    pub idle_below_percent: f64,
    /// Whether the process was idle at the start of this period.
    pub idle: bool,
    /// An idle process is sampled one period in this many ([`IDLE_PERIODS`]).
    pub idle_periods: u32,
}

impl SamplerControl {
    pub fn new(duty: DutyCycle) -> Self {
        SamplerControl {
            state: Arc::new(watch::Sender::new(ControlState {
                duty,
                boosted_until: None,
                threads: 0,
                idle_below: IDLE_BELOW,
                idle: false,
            })),
        }
    }

    /// Counts a process as idle below `share` of a core instead of [`IDLE_BELOW`]; 0 samples
    /// every period.
    pub fn with_idle_below(self, share: f64) -> Self {
        self.state.send_modify(|s| s.idle_below = share.max(0.0));
        self
    }

    /// Whether the window of a period starting now is skipped: the process ran `cores` of a core
    /// since its last window stopped (`None`: not measured, never idle), and the windows of
    /// `skipped` periods were skipped since. An idle process is sampled one period in
    /// [`IDLE_PERIODS`]; a busy one, or a boosted one, every period.
    pub fn skips_idle_period(&self, cores: Option<f64>, skipped: u32) -> bool {
        let mut skips = false;
        // send_if_modified: a pausing loop waits on changes, and this is not one it needs.
        self.state.send_if_modified(|s| {
            s.idle = cores.is_some_and(|cores| cores < s.idle_below);
            skips = s.idle && skipped + 1 < IDLE_PERIODS;
            false
        });
        skips
    }

    /// Samples without pause for `duration` from now; a longer boost already running is kept.
    pub fn boost(&self, duration: Duration) {
        let until = Instant::now() + duration;
        self.state.send_modify(|s| {
            s.boosted_until = Some(s.boosted_until.map_or(until, |u| u.max(until)));
        });
    }

    /// Records what the last window sampled: `samples` thread stacks in `ticks` ticks. The next
    /// windows are sized for that many threads per tick.
    pub fn observe_window(&self, samples: u64, ticks: u64) {
        if ticks > 0 {
            let threads = samples.div_ceil(ticks);
            // send_if_modified: a pausing loop waits on changes, and this is not one it needs.
            self.state.send_if_modified(|s| {
                s.threads = threads;
                false
            });
        }
    }

    /// Ends a boost early.
    pub fn cancel_boost(&self) {
        self.state.send_modify(|s| s.boosted_until = None);
    }

    pub fn status(&self) -> SamplerStatus {
        let state = *self.state.borrow();
        let now = Instant::now();
        SamplerStatus {
            duty: state.duty,
            window: state.window(),
            threads_per_tick: state.threads,
            boost_seconds_left: state
                .boosted_until
                .filter(|&u| u > now)
                .map(|u| (u - now).as_secs_f64()),
            idle_below_percent: state.idle_below * 100.0,
            idle: state.idle,
            idle_periods: IDLE_PERIODS,
        }
    }

    /// The step to take at `now`, given when the current period started.
    pub fn step(&self, period_start: Instant, now: Instant) -> SamplerStep {
        let state = *self.state.borrow();
        plan(state, period_start, now)
    }

    /// Resolves when the settings change (a boost arrives); pending forever if nobody can change
    /// them any more.
    pub async fn changed(&self) {
        let mut rx = self.state.subscribe();
        rx.borrow_and_update();
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

fn plan(state: ControlState, period_start: Instant, now: Instant) -> SamplerStep {
    if let Some(until) = state.boosted_until.filter(|&u| u > now) {
        return SamplerStep::Sample {
            until: until.min(now + MAX_WINDOW),
            boosted: true,
        };
    }
    let window_end = period_start + state.window();
    if now < window_end {
        return SamplerStep::Sample {
            until: window_end,
            boosted: false,
        };
    }
    SamplerStep::Pause {
        until: period_start + state.duty.period,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn duty_cycle_checks() {
        assert!(DutyCycle::new(Duration::from_millis(5), secs(1)).is_err());
        assert!(DutyCycle::new(secs(2), secs(1)).is_err());
        assert!(DutyCycle::new(secs(11), secs(60)).is_err());
        let duty = DutyCycle::new(secs(1), secs(4)).unwrap();
        assert_eq!(duty.fraction(), 0.25);
        assert_eq!(DutyCycle::default().fraction(), 0.1);
    }

    #[test]
    fn samples_the_window_then_pauses_to_the_end_of_the_period() {
        let t0 = Instant::now();
        let control = SamplerControl::new(DutyCycle::new(secs(1), secs(10)).unwrap());
        assert_eq!(
            control.step(t0, t0),
            SamplerStep::Sample {
                until: t0 + secs(1),
                boosted: false
            }
        );
        assert_eq!(
            control.step(t0, t0 + secs(1)),
            SamplerStep::Pause {
                until: t0 + secs(10)
            }
        );
    }

    #[test]
    fn many_threads_shorten_the_window_in_proportion() {
        let duty = DutyCycle::DEFAULT;
        assert_eq!(duty.window_for(0), secs(1));
        assert_eq!(duty.window_for(WINDOW_THREADS), secs(1));
        assert_eq!(
            duty.window_for(4 * WINDOW_THREADS),
            Duration::from_millis(250)
        );
        assert_eq!(duty.window_for(10_000), MIN_SCALED_WINDOW);
        let short = DutyCycle::new(Duration::from_millis(50), secs(10)).unwrap();
        assert_eq!(short.window_for(10_000), Duration::from_millis(50));

        let t0 = Instant::now();
        let control = SamplerControl::new(duty);
        // 101 threads walked on each of 1,000 ticks: 1 s × 16/101.
        control.observe_window(101_000, 1_000);
        let status = control.status();
        assert_eq!(status.threads_per_tick, 101);
        assert_eq!(status.window, Duration::from_secs(1).mul_f64(16.0 / 101.0));
        assert_eq!(
            control.step(t0, t0),
            SamplerStep::Sample {
                until: t0 + status.window,
                boosted: false
            }
        );
        // A window with no ticks (the process stopped) changes nothing.
        control.observe_window(0, 0);
        assert_eq!(control.status().threads_per_tick, 101);
    }

    #[test]
    fn an_idle_process_is_sampled_one_period_in_three() {
        let control = SamplerControl::new(DutyCycle::default());
        let window_in = |cores: Option<f64>| -> Vec<bool> {
            let mut skipped = 0;
            (0..7)
                .map(|_| {
                    let skips = control.skips_idle_period(cores, skipped);
                    skipped = if skips { skipped + 1 } else { 0 };
                    !skips
                })
                .collect()
        };
        let (sampled, skipped) = (true, false);
        assert_eq!(
            window_in(Some(0.002)),
            [skipped, skipped, sampled, skipped, skipped, sampled, skipped]
        );
        assert!(control.status().idle);
        assert_eq!(control.status().idle_below_percent, 1.0);
        // Busy, or not measured: every period.
        assert_eq!(window_in(Some(0.01)), [sampled; 7]);
        assert!(!control.status().idle);
        assert_eq!(window_in(None), [sampled; 7]);
        // Once it runs, the next period is sampled, however many were skipped.
        assert!(control.skips_idle_period(Some(0.0), 0));
        assert!(!control.skips_idle_period(Some(0.5), 1));

        let never = SamplerControl::new(DutyCycle::default()).with_idle_below(0.0);
        assert!(!never.skips_idle_period(Some(0.0), 0));
        assert_eq!(never.status().idle_below_percent, 0.0);
    }

    #[tokio::test]
    async fn a_boost_samples_in_bounded_windows_until_it_ends() {
        let control = SamplerControl::new(DutyCycle::default());
        let waiter = {
            let control = control.clone();
            tokio::spawn(async move { control.changed().await })
        };
        tokio::task::yield_now().await;
        control.boost(secs(25));
        waiter.await.unwrap();
        let now = Instant::now();
        let period_start = now - secs(5);
        match control.step(period_start, now) {
            SamplerStep::Sample { until, boosted } => {
                assert!(boosted);
                assert_eq!(until, now + MAX_WINDOW);
            }
            other => panic!("{other:?}"),
        }
        let left = control.status().boost_seconds_left.unwrap();
        assert!(left > 24.0 && left <= 25.0, "{left}");
        // A shorter boost does not cut a longer one.
        control.boost(secs(1));
        assert!(control.status().boost_seconds_left.unwrap() > 24.0);
        control.cancel_boost();
        assert_eq!(control.status().boost_seconds_left, None);
        assert!(matches!(
            control.step(period_start, now),
            SamplerStep::Pause { .. }
        ));
    }
}
