//! Trigger conditions as dotnet-monitor evaluates them (Microsoft.Diagnostics.Monitoring.EventPipe
//! `Triggers/**`), fed with what the trigger's session yields: counter samples, and the
//! `Microsoft.AspNetCore` HttpRequestIn start/stop activities forwarded by
//! DiagnosticSourceEventSource. Pure state machines over event times; the engine runs the
//! sessions and restarts a trigger (fresh state) after each firing, as dotnet-monitor does.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use super::options::{CounterSource, PathFilter, ThresholdTrigger, Trigger};
use nettrace::events::{DiagnosticSourceEvent, DiagnosticSourceKind};
use profile::counter::CounterSample;

/// The DiagnosticListener whose HttpRequestIn activity the ASP.NET triggers watch.
pub const ASPNETCORE_LISTENER: &str = "Microsoft.AspNetCore";
/// How often, at most, open requests are checked for having run too long.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(9);
/// Points of a sliding window closer than this are merged (dotnet-monitor's `SlidingWindow`).
const MERGE_INTERVAL_NANOS: i64 = 1_000_000_000;
/// Most requests an AspNetRequestDuration trigger tracks at once; beyond it new starts are not
/// tracked (a process with this many requests in flight is counted by the ones it has).
const MAX_OPEN_REQUESTS: usize = 100_000;
/// Most points a sliding window holds (merged per second, so a day's window needs 86400).
const MAX_WINDOW_POINTS: usize = 86_400;

/// Something a trigger looks at.
#[derive(Debug, Clone, Copy)]
pub enum TriggerInput<'a> {
    Counter(&'a CounterSample),
    Request(&'a RequestEvent),
    /// Time passes (the wall clock, so hung requests are found without any event arriving).
    Heartbeat {
        unix_nanos: i64,
    },
}

/// An ASP.NET Core request starting or stopping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestEvent {
    pub unix_nanos: i64,
    pub stop: bool,
    /// `Activity.Id`, which pairs a stop with its start.
    pub activity_id: String,
    pub path: String,
    /// Stops only.
    pub status_code: Option<u16>,
    /// Stops only: `Activity.Duration` in 100 ns ticks.
    pub duration_ticks: Option<i64>,
}

impl RequestEvent {
    /// The request an `Activity1Start`/`Activity1Stop` of the `Microsoft.AspNetCore` listener
    /// describes (argument names as the trigger's FilterAndPayloadSpecs select them).
    pub fn from_diagnostic_source(e: &DiagnosticSourceEvent, unix_nanos: i64) -> Option<Self> {
        let stop = match e.kind {
            DiagnosticSourceKind::Activity1Start => false,
            DiagnosticSourceKind::Activity1Stop => true,
            _ => return None,
        };
        if e.source_name != ASPNETCORE_LISTENER {
            return None;
        }
        let arg = |key: &str| {
            e.arguments
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(key))
                .map(|(_, v)| v.as_str())
        };
        Some(RequestEvent {
            unix_nanos,
            stop,
            activity_id: arg("ActivityId").unwrap_or_default().to_string(),
            path: arg("Path").unwrap_or_default().to_string(),
            status_code: arg("StatusCode").and_then(|s| s.trim().parse().ok()),
            duration_ticks: arg("ActivityDuration").and_then(|s| s.trim().parse().ok()),
        })
    }
}

/// Timestamps within a window, merged per second, as dotnet-monitor's `SlidingWindow` keeps
/// them.
#[derive(Debug, Default)]
struct SlidingWindow {
    window_nanos: i64,
    points: VecDeque<(i64, u32)>,
    count: u64,
}

impl SlidingWindow {
    fn new(window: Duration) -> Self {
        SlidingWindow {
            window_nanos: i64::try_from(window.as_nanos()).unwrap_or(i64::MAX),
            ..SlidingWindow::default()
        }
    }

    fn add(&mut self, t: i64) {
        self.count += 1;
        match self.points.back_mut() {
            Some((last, n)) if t.saturating_sub(*last) < MERGE_INTERVAL_NANOS => {
                *n += 1;
                return;
            }
            _ => self.points.push_back((t, 1)),
        }
        while let Some(&(first, n)) = self.points.front() {
            if t.saturating_sub(first) > self.window_nanos || self.points.len() > MAX_WINDOW_POINTS
            {
                self.points.pop_front();
                self.count -= u64::from(n);
            } else {
                break;
            }
        }
    }
}

/// The state of one trigger between firings.
#[derive(Debug)]
pub struct TriggerState {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    /// Startup and Schedule: nothing to observe; the engine offers the first input when their
    /// time has come.
    Timed,
    RequestCount {
        needed: u64,
        paths: PathFilter,
        window: SlidingWindow,
    },
    RequestDuration {
        needed: u64,
        threshold_ticks: i64,
        paths: PathFilter,
        window: SlidingWindow,
        /// Activity id → start time of requests still running.
        open: HashMap<String, i64>,
        last_heartbeat: i64,
    },
    ResponseStatus {
        needed: u64,
        codes: Vec<(u16, u16)>,
        paths: PathFilter,
        window: SlidingWindow,
    },
    Threshold {
        trigger: ThresholdTrigger,
        /// The interval the session asked for, used until samples say theirs.
        interval_nanos: i64,
        latest: Option<i64>,
        target: Option<i64>,
    },
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

impl TriggerState {
    /// A fresh trigger; `counter_interval` is what its counter session publishes at.
    pub fn new(trigger: &Trigger, counter_interval: Duration) -> Self {
        let kind = match trigger {
            Trigger::Startup | Trigger::Schedule(_) => Kind::Timed,
            Trigger::AspNetRequestCount {
                request_count,
                window,
                paths,
            } => Kind::RequestCount {
                needed: u64::from(*request_count),
                paths: paths.clone(),
                window: SlidingWindow::new(*window),
            },
            Trigger::AspNetRequestDuration {
                request_count,
                request_duration,
                window,
                paths,
            } => Kind::RequestDuration {
                needed: u64::from(*request_count),
                threshold_ticks: nanos(*request_duration) / 100,
                paths: paths.clone(),
                window: SlidingWindow::new(*window),
                open: HashMap::new(),
                last_heartbeat: i64::MIN,
            },
            Trigger::AspNetResponseStatus {
                status_codes,
                response_count,
                window,
                paths,
            } => Kind::ResponseStatus {
                needed: u64::from(*response_count),
                codes: status_codes.clone(),
                paths: paths.clone(),
                window: SlidingWindow::new(*window),
            },
            Trigger::Threshold(t) => Kind::Threshold {
                trigger: t.clone(),
                interval_nanos: nanos(counter_interval),
                latest: None,
                target: None,
            },
        };
        TriggerState { kind }
    }

    /// Feeds one input; true when the trigger's condition is satisfied.
    pub fn observe(&mut self, input: TriggerInput<'_>) -> bool {
        match (&mut self.kind, input) {
            (Kind::Timed, _) => true,
            (
                Kind::RequestCount {
                    needed,
                    paths,
                    window,
                },
                TriggerInput::Request(r),
            ) => {
                if !r.stop && paths.matches(&r.path) {
                    window.add(r.unix_nanos);
                }
                window.count >= *needed
            }
            (
                Kind::ResponseStatus {
                    needed,
                    codes,
                    paths,
                    window,
                },
                TriggerInput::Request(r),
            ) => {
                let Some(code) = r.status_code.filter(|_| r.stop) else {
                    return false;
                };
                if paths.matches(&r.path)
                    && codes.iter().any(|(lo, hi)| (*lo..=*hi).contains(&code))
                {
                    window.add(r.unix_nanos);
                }
                window.count >= *needed
            }
            (
                Kind::RequestDuration {
                    needed,
                    threshold_ticks,
                    paths,
                    window,
                    open,
                    ..
                },
                TriggerInput::Request(r),
            ) => {
                if !r.stop {
                    // The path is on the start; the stop pairs by activity id.
                    if paths.matches(&r.path) && open.len() < MAX_OPEN_REQUESTS {
                        open.insert(r.activity_id.clone(), r.unix_nanos);
                    }
                    return false;
                }
                let Some(started) = open.remove(&r.activity_id) else {
                    // Counted by a heartbeat already, or not one of ours.
                    return false;
                };
                let ticks = r
                    .duration_ticks
                    .unwrap_or_else(|| r.unix_nanos.saturating_sub(started) / 100);
                if ticks >= *threshold_ticks {
                    window.add(r.unix_nanos);
                }
                window.count >= *needed
            }
            (
                Kind::RequestDuration {
                    needed,
                    threshold_ticks,
                    window,
                    open,
                    last_heartbeat,
                    ..
                },
                TriggerInput::Heartbeat { unix_nanos },
            ) => {
                if unix_nanos.saturating_sub(*last_heartbeat) <= nanos(HEARTBEAT_EVERY) {
                    return false;
                }
                *last_heartbeat = unix_nanos;
                let threshold = threshold_ticks.saturating_mul(100);
                let before = open.len();
                open.retain(|_, started| unix_nanos.saturating_sub(*started) < threshold);
                for _ in open.len()..before {
                    // A request still running past the threshold counts once, now.
                    window.add(unix_nanos);
                }
                window.count >= *needed
            }
            (
                Kind::Threshold {
                    trigger,
                    interval_nanos,
                    latest,
                    target,
                },
                TriggerInput::Counter(sample),
            ) => {
                let Some(value) = watched_value(&trigger.source, sample) else {
                    return false;
                };
                let interval = sample
                    .interval_seconds
                    .map_or(*interval_nanos, |s| (s * 1e9) as i64);
                let t = sample.unix_nanos;
                let window = nanos(trigger.window);
                if !trigger.passes(value) {
                    // The series broke.
                    *latest = None;
                    *target = None;
                    return false;
                }
                match (*latest, *target) {
                    (Some(last), Some(_))
                        if (last as f64 + 1.5 * *interval_nanos as f64) >= t as f64 =>
                    {
                        *latest = Some(t);
                    }
                    _ => {
                        // First passing value, or one after a gap (a dropped interval): the
                        // series starts at the beginning of this value's interval.
                        *latest = Some(t);
                        *target = Some(t.saturating_sub(interval).saturating_add(window));
                    }
                }
                matches!((*latest, *target), (Some(l), Some(g)) if l >= g)
            }
            _ => false,
        }
    }
}

/// The value of `sample` the trigger compares, if the sample is the watched counter.
fn watched_value(source: &CounterSource, sample: &CounterSample) -> Option<f64> {
    match source {
        CounterSource::EventCounter { provider, counter } => (sample.tags.is_empty()
            && sample.provider.eq_ignore_ascii_case(provider)
            && sample.name.eq_ignore_ascii_case(counter))
        .then(|| sample.value.value())
        .flatten(),
        CounterSource::Meter {
            meter,
            instrument,
            percentile,
        } => {
            if !(sample.provider == *meter && sample.name == *instrument) {
                return None;
            }
            // A histogram without HistogramPercentile is compared at its median.
            sample
                .value
                .value()
                .or_else(|| sample.value.percentile(f64::from(percentile.unwrap_or(50))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profile::counter::{CounterValue, Percentile};

    const S: i64 = 1_000_000_000;

    fn start(t: i64, id: &str, path: &str) -> RequestEvent {
        RequestEvent {
            unix_nanos: t,
            stop: false,
            activity_id: id.into(),
            path: path.into(),
            status_code: None,
            duration_ticks: None,
        }
    }

    fn stop(t: i64, id: &str, status: u16, ms: i64) -> RequestEvent {
        RequestEvent {
            unix_nanos: t,
            stop: true,
            activity_id: id.into(),
            path: String::new(),
            status_code: Some(status),
            duration_ticks: Some(ms * 10_000),
        }
    }

    fn duration_trigger(count: u32) -> TriggerState {
        TriggerState::new(
            &Trigger::AspNetRequestDuration {
                request_count: count,
                request_duration: Duration::from_millis(200),
                window: Duration::from_secs(60),
                paths: PathFilter {
                    include: vec!["/alpha".into()],
                    exclude: vec![],
                },
            },
            Duration::from_secs(5),
        )
    }

    #[test]
    fn slow_requests_on_included_paths_fire_the_duration_trigger() {
        let mut t = duration_trigger(2);
        assert!(!t.observe(TriggerInput::Request(&start(S, "a", "/alpha"))));
        assert!(!t.observe(TriggerInput::Request(&start(S, "b", "/bravo"))));
        assert!(
            !t.observe(TriggerInput::Request(&stop(2 * S, "b", 200, 900))),
            "excluded path"
        );
        assert!(!t.observe(TriggerInput::Request(&stop(2 * S, "a", 200, 250))));
        assert!(!t.observe(TriggerInput::Request(&start(3 * S, "c", "/alpha"))));
        assert!(
            !t.observe(TriggerInput::Request(&stop(3 * S, "c", 200, 199))),
            "fast"
        );
        assert!(!t.observe(TriggerInput::Request(&start(4 * S, "d", "/alpha"))));
        // Still running 10 s later: a heartbeat counts it.
        assert!(t.observe(TriggerInput::Heartbeat { unix_nanos: 14 * S }));
        // Its stop is not counted twice.
        let mut t = duration_trigger(2);
        t.observe(TriggerInput::Request(&start(S, "a", "/alpha")));
        assert!(!t.observe(TriggerInput::Heartbeat { unix_nanos: 20 * S }));
        assert!(!t.observe(TriggerInput::Request(&stop(21 * S, "a", 200, 20_000))));
    }

    #[test]
    fn status_and_count_triggers_use_a_sliding_window() {
        let mut status = TriggerState::new(
            &Trigger::AspNetResponseStatus {
                status_codes: vec![(500, 599)],
                response_count: 2,
                window: Duration::from_secs(10),
                paths: PathFilter::default(),
            },
            Duration::from_secs(5),
        );
        assert!(!status.observe(TriggerInput::Request(&stop(S, "a", 500, 1))));
        assert!(!status.observe(TriggerInput::Request(&stop(2 * S, "b", 404, 1))));
        // 20 s later the first 500 has left the window.
        assert!(!status.observe(TriggerInput::Request(&stop(22 * S, "c", 503, 1))));
        assert!(status.observe(TriggerInput::Request(&stop(23 * S, "d", 599, 1))));

        let mut count = TriggerState::new(
            &Trigger::AspNetRequestCount {
                request_count: 3,
                window: Duration::from_secs(60),
                paths: PathFilter::default(),
            },
            Duration::from_secs(5),
        );
        assert!(!count.observe(TriggerInput::Request(&start(S, "a", "/x"))));
        assert!(!count.observe(TriggerInput::Request(&start(S, "b", "/x"))));
        assert!(count.observe(TriggerInput::Request(&start(S + 1, "c", "/x"))));
    }

    fn p95(t: i64, value: f64) -> CounterSample {
        CounterSample {
            unix_nanos: t,
            provider: "AsyncWeb".into(),
            name: "asyncweb.request.duration".into(),
            display_name: String::new(),
            version: String::new(),
            unit: "ms".into(),
            tags: vec![],
            interval_seconds: None,
            value: CounterValue::Histogram {
                quantiles: vec![Percentile {
                    percentile: 95.0,
                    value,
                }],
                count: None,
                sum: None,
            },
        }
    }

    #[test]
    fn thresholds_must_hold_for_the_whole_window() {
        let trigger = Trigger::Threshold(ThresholdTrigger {
            source: CounterSource::Meter {
                meter: "AsyncWeb".into(),
                instrument: "asyncweb.request.duration".into(),
                percentile: Some(95),
            },
            greater_than: Some(100.0),
            less_than: None,
            window: Duration::from_secs(10),
        });
        let mut t = TriggerState::new(&trigger, Duration::from_secs(5));
        // Interval 5 s, window 10 s: the first passing value covers 5 s, the second reaches 10.
        assert!(!t.observe(TriggerInput::Counter(&p95(5 * S, 150.0))));
        assert!(t.observe(TriggerInput::Counter(&p95(10 * S, 150.0))));
        let mut t = TriggerState::new(&trigger, Duration::from_secs(5));
        assert!(!t.observe(TriggerInput::Counter(&p95(5 * S, 150.0))));
        assert!(
            !t.observe(TriggerInput::Counter(&p95(10 * S, 100.0))),
            "not strictly greater"
        );
        assert!(!t.observe(TriggerInput::Counter(&p95(15 * S, 150.0))));
        // A gap longer than 1.5 intervals restarts the series.
        assert!(!t.observe(TriggerInput::Counter(&p95(30 * S, 150.0))));
        assert!(t.observe(TriggerInput::Counter(&p95(35 * S, 150.0))));
        // Other instruments are ignored.
        let mut other = p95(40 * S, 1.0);
        other.name = "asyncweb.requests".into();
        assert!(!t.observe(TriggerInput::Counter(&other)));
    }
}
