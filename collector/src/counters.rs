//! Runtime counters: EventSource `EventCounters` (`System.Runtime`, `Microsoft.AspNetCore.Hosting`,
//! …) and System.Diagnostics.Metrics instruments, as one stream of typed [`CounterSample`]s.
//!
//! A counter session is an ordinary EventPipe session whose providers
//! [`CounterSessionConfig::providers`] builds the way dotnet-monitor's `MetricSourceConfiguration`
//! does: each EventCounter source with the `EventCounterIntervalSec` argument, and the
//! `System.Diagnostics.Metrics` source with the TimeSeriesValues keyword and its `SessionId`,
//! `Metrics`, `RefreshInterval`, `MaxTimeSeries`, `MaxHistograms` arguments. The runtime then
//! publishes one event per counter (per tag set for meters) every interval.
//!
//! ```no_run
//! use collector::client::DiagnosticsClient;
//! use collector::counters::{self, CounterSessionConfig, CounterUpdate};
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = DiagnosticsClient::for_pid(42)?;
//! let config = CounterSessionConfig::new(5)
//!     .with_event_counters("System.Runtime")
//!     .with_meter("AsyncWeb", &[]);
//! let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
//! let stop = tokio::time::sleep(std::time::Duration::from_secs(30));
//! let share = collector::signals::SignalShare::unlimited();
//! let session =
//!     tokio::spawn(async move { counters::run(&client, &config, stop, tx, &share).await });
//! while let Some(update) = rx.recv().await {
//!     if let CounterUpdate::Sample(s) = &*update {
//!         println!("{} {} {:?} = {:?}", s.provider, s.name, s.tags, s.value.value());
//!     }
//! }
//! session.await??;
//! # Ok(()) }
//! ```
//!
//! Several sessions of one process may ask for counters at once: EventCounters then publish at
//! the shortest interval any session asked for (each sample says its own interval), and on
//! .NET ≥ 8 every metrics session joins the runtime's one `SHARED` aggregation, which must be
//! configured alike (same refresh interval and limits) or the runtime reports an error instead
//! of values.

use std::future::Future;
use std::mem::size_of;
use std::sync::OnceLock;
use std::time::Duration;

use profile::counter::{CounterSample, CounterValue, Percentile};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::client::DiagnosticsClient;
use crate::providers::{encode_arguments, level};
use crate::session::{self, EventObserver, ParsingWriter, Reading, SessionError, SessionSummary};
use crate::signals::{SignalKind, SignalShare};
use ipc::{CollectTracing, ProviderConfig};
use nettrace::events::{
    EventCounterValue, KnownEvent, MetricValue, MetricsEvent, METRICS_PROVIDER,
};
use nettrace::{Event, NettraceError, ParserOptions};
use profile::budget::{string_pairs, Charged};

/// dotnet-monitor's `GlobalCounter:IntervalSeconds` default.
pub const DEFAULT_INTERVAL_SECONDS: u32 = 5;
/// dotnet-monitor's `GlobalCounter:MaxHistograms` default.
pub const DEFAULT_MAX_HISTOGRAMS: u32 = 20;
/// dotnet-monitor's `GlobalCounter:MaxTimeSeries` default.
pub const DEFAULT_MAX_TIME_SERIES: u32 = 1000;
/// The metrics session every listener shares on .NET ≥ 8.
pub const SHARED_SESSION_ID: &str = "SHARED";
/// MetricsEventSource's TimeSeriesValues keyword: the periodic values.
const TIME_SERIES_VALUES_KEYWORD: u64 = 0x2;
/// Keywords for EventCounter sources. EventCounters are written with no keyword, but on .NET 8
/// a source enabled with keywords 0 writes nothing through EventPipe (see
/// [`crate::providers::parse_provider`]), so every bit is asked for, as dotnet-counters does.
const EVENT_COUNTER_KEYWORDS: u64 = u64::MAX;
/// How long the runtime may take to end a stopped counter session (no rundown is asked for).
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// One System.Diagnostics.Metrics meter to listen to, and which of its instruments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeterSelection {
    pub meter: String,
    /// Instrument names; empty means every instrument of the meter.
    pub instruments: Vec<String>,
}

/// What a counter session enables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterSessionConfig {
    /// How often values are published, in seconds (1 to 86400).
    pub interval_seconds: u32,
    /// EventSources whose EventCounters to enable, e.g. `System.Runtime`.
    pub event_counter_sources: Vec<String>,
    /// Meters to enable; none means no metrics provider at all.
    pub meters: Vec<MeterSelection>,
    /// `SessionId` argument: [`SHARED_SESSION_ID`] on .NET ≥ 8 (the default); a unique id on
    /// older runtimes, which allow one metrics session per process.
    pub metrics_session_id: String,
    pub max_histograms: u32,
    pub max_time_series: u32,
    /// Limits of the parser that reads the session's stream.
    pub parser: ParserOptions,
    /// When the stream is read: on the timer grid ([`Reading::OnTimerGrid`]), values arrive
    /// up to a grid step later, and an agent of many processes wakes once for all of them.
    pub reading: Reading,
}

/// The agent's `GlobalCounter:MaxHistograms` and `MaxTimeSeries`, set once at its start, so that
/// every counter session asks for the same: on .NET ≥ 8 a process's metrics listeners share one
/// aggregation, which refuses a listener asking for other limits.
static GLOBAL_LIMITS: OnceLock<(u32, u32)> = OnceLock::new();

/// Sets the histogram and time-series limits every later [`CounterSessionConfig::new`] asks the
/// runtime for; false if they were set already (the first setting stays).
pub fn set_global_limits(max_histograms: u32, max_time_series: u32) -> bool {
    GLOBAL_LIMITS.set((max_histograms, max_time_series)).is_ok()
}

impl CounterSessionConfig {
    /// No sources yet; values every `interval_seconds` (clamped to 1..=86400); the agent's limits
    /// ([`set_global_limits`]), else dotnet-monitor's defaults.
    pub fn new(interval_seconds: u32) -> Self {
        let (max_histograms, max_time_series) = GLOBAL_LIMITS
            .get()
            .copied()
            .unwrap_or((DEFAULT_MAX_HISTOGRAMS, DEFAULT_MAX_TIME_SERIES));
        CounterSessionConfig {
            interval_seconds: interval_seconds.clamp(1, 86_400),
            event_counter_sources: Vec::new(),
            meters: Vec::new(),
            metrics_session_id: SHARED_SESSION_ID.to_string(),
            max_histograms,
            max_time_series,
            parser: ParserOptions::default(),
            reading: Reading::AsItComes,
        }
    }

    /// Reads the session's stream as `reading` says (see [`CounterSessionConfig::reading`]).
    pub fn read(mut self, reading: Reading) -> Self {
        self.reading = reading;
        self
    }

    /// Adds an EventSource's EventCounters (once).
    pub fn with_event_counters(mut self, source: &str) -> Self {
        if !self
            .event_counter_sources
            .iter()
            .any(|s| s.eq_ignore_ascii_case(source))
        {
            self.event_counter_sources.push(source.to_string());
        }
        self
    }

    /// Adds a meter, with some of its instruments or (`&[]`) all of them.
    pub fn with_meter(mut self, meter: &str, instruments: &[&str]) -> Self {
        self.meters.push(MeterSelection {
            meter: meter.to_string(),
            instruments: instruments.iter().map(|i| i.to_string()).collect(),
        });
        self
    }

    /// The providers of the session.
    pub fn providers(&self) -> Vec<ProviderConfig> {
        let interval = self.interval_seconds.to_string();
        let mut providers: Vec<ProviderConfig> = self
            .event_counter_sources
            .iter()
            .map(|source| {
                ProviderConfig::new(source, EVENT_COUNTER_KEYWORDS, level::INFORMATIONAL)
                    .with_arguments(encode_arguments(&[(
                        "EventCounterIntervalSec",
                        interval.as_str(),
                    )]))
            })
            .collect();
        if !self.meters.is_empty() {
            // `Meter` or `Meter\Instrument`, comma-separated (MetricsEventSource's spec syntax).
            let metrics = self
                .meters
                .iter()
                .flat_map(|m| {
                    if m.instruments.is_empty() {
                        vec![m.meter.clone()]
                    } else {
                        m.instruments
                            .iter()
                            .map(|i| format!("{}\\{i}", m.meter))
                            .collect()
                    }
                })
                .collect::<Vec<_>>()
                .join(",");
            let histograms = self.max_histograms.to_string();
            let series = self.max_time_series.to_string();
            providers.push(
                ProviderConfig::new(
                    METRICS_PROVIDER,
                    TIME_SERIES_VALUES_KEYWORD,
                    level::INFORMATIONAL,
                )
                .with_arguments(encode_arguments(&[
                    ("SessionId", self.metrics_session_id.as_str()),
                    ("Metrics", metrics.as_str()),
                    ("RefreshInterval", interval.as_str()),
                    ("MaxTimeSeries", series.as_str()),
                    ("MaxHistograms", histograms.as_str()),
                ])),
            );
        }
        providers
    }

    /// The session request: these providers, no rundown (counters need no method names), no
    /// stack walks (a counter payload's stack is never read).
    pub fn collect_tracing(&self) -> CollectTracing {
        CollectTracing::v2(self.providers())
            .with_rundown(false)
            .with_stackwalk(false)
    }
}

/// EventCounter sources dotnet-monitor collects by default (`Metrics:IncludeDefaultProviders`,
/// a live-metrics request's `includeDefaultProviders`).
pub const DEFAULT_EVENT_COUNTER_SOURCES: [&str; 3] = [
    "System.Runtime",
    "Microsoft.AspNetCore.Hosting",
    "Grpc.AspNetCore.Server",
];

/// A counter session and which of its values to keep: the agent's `Metrics` section, a
/// `/livemetrics` request, a CollectLiveMetrics action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterSelection {
    pub session: CounterSessionConfig,
    /// Per EventCounter source, the counters to keep (`CounterNames`); a source not listed
    /// keeps every counter (EventCounters cannot be enabled one by one).
    pub counter_names: Vec<(String, Vec<String>)>,
}

impl CounterSelection {
    /// Whether `sample` is one this selection asked for. On .NET ≥ 8 every client of the shared
    /// metrics session sees every client's instruments, so meters are filtered here too.
    pub fn accepts(&self, sample: &CounterSample) -> bool {
        let same = |a: &str, b: &str| a.eq_ignore_ascii_case(b);
        if self
            .session
            .event_counter_sources
            .iter()
            .any(|s| same(s, &sample.provider))
        {
            return self
                .counter_names
                .iter()
                .find(|(source, _)| same(source, &sample.provider))
                .is_none_or(|(_, names)| names.contains(&sample.name));
        }
        self.session.meters.iter().any(|m| {
            same(&m.meter, &sample.provider)
                && (m.instruments.is_empty() || m.instruments.contains(&sample.name))
        })
    }
}

/// What a counter session yields.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CounterUpdate {
    Sample(Box<CounterSample>),
    /// The metrics source begins reporting an interval (its values follow): when the interval
    /// began, Unix nanoseconds. The first one a session sees begins when the runtime began
    /// aggregating for it, which is where its running totals count from.
    IntervalStart {
        unix_nanos: i64,
    },
    /// The metrics source refused or stopped something: a callback failed, another session holds
    /// the metrics source (runtime < 8), a MaxTimeSeries / MaxHistograms limit was reached.
    MetricsError {
        message: String,
    },
}

impl CounterUpdate {
    /// The heap bytes it holds, as it waits for its reader.
    pub fn held_bytes(&self) -> usize {
        size_of::<Self>()
            + match self {
                CounterUpdate::Sample(s) => {
                    let quantiles = match &s.value {
                        CounterValue::Histogram { quantiles, .. } => {
                            quantiles.capacity() * size_of::<Percentile>()
                        }
                        _ => 0,
                    };
                    size_of::<CounterSample>()
                        + s.provider.capacity()
                        + s.name.capacity()
                        + s.display_name.capacity()
                        + s.version.capacity()
                        + s.unit.capacity()
                        + string_pairs(&s.tags)
                        + quantiles
                }
                CounterUpdate::MetricsError { message } => message.capacity(),
                CounterUpdate::IntervalStart { .. } => 0,
            }
    }
}

/// Turns the events of a counter session into [`CounterUpdate`]s, keeping only metrics values
/// of its own metrics session (other tools' sessions may run in the same process).
#[derive(Debug, Clone)]
pub struct CounterDecoder {
    metrics_session_id: String,
}

impl CounterDecoder {
    pub fn new(config: &CounterSessionConfig) -> Self {
        CounterDecoder {
            metrics_session_id: config.metrics_session_id.clone(),
        }
    }

    /// The update an event carries; `Ok(None)` for events that are not counter values (or
    /// belong to another metrics session), an error for a damaged payload.
    pub fn decode(&self, event: &Event<'_>) -> Result<Option<CounterUpdate>, NettraceError> {
        Ok(self.update(event.known()?, event.unix_nanos()))
    }

    fn update(&self, known: Option<KnownEvent>, unix_nanos: i64) -> Option<CounterUpdate> {
        Some(match known {
            Some(KnownEvent::EventCounter(c)) => {
                let value = match c.value {
                    EventCounterValue::Mean {
                        mean,
                        min,
                        max,
                        count,
                        ..
                    } => CounterValue::Mean {
                        mean: finite(mean)?,
                        min,
                        max,
                        count,
                    },
                    EventCounterValue::Increment { increment, .. } => CounterValue::Increment {
                        increment: finite(increment)?,
                    },
                };
                CounterUpdate::Sample(Box::new(CounterSample {
                    unix_nanos,
                    provider: c.provider,
                    name: c.name,
                    display_name: c.display_name,
                    version: String::new(),
                    unit: c.display_units,
                    tags: Vec::new(),
                    interval_seconds: c.interval_sec.filter(|s| s.is_finite() && *s > 0.0),
                    value,
                }))
            }
            Some(KnownEvent::Metrics(MetricsEvent::Published(p))) => {
                if p.session_id != self.metrics_session_id {
                    return None;
                }
                let tags = p
                    .tag_pairs()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                let value = match p.value {
                    MetricValue::CounterRate { rate, value } => CounterValue::Counter {
                        rate: finite(rate)?,
                        total: value,
                    },
                    MetricValue::UpDownCounterRate { rate, value } => CounterValue::UpDownCounter {
                        rate: finite(rate)?,
                        value,
                    },
                    MetricValue::Gauge { last_value } => CounterValue::Gauge {
                        value: finite(last_value)?,
                    },
                    MetricValue::Histogram {
                        quantiles,
                        count,
                        sum,
                    } => CounterValue::Histogram {
                        quantiles: quantiles
                            .iter()
                            .filter(|q| q.value.is_finite() && (0.0..=1.0).contains(&q.quantile))
                            .map(|q| Percentile {
                                // 0.95 → 95, without 94.99999 artefacts
                                percentile: (q.quantile * 1e6).round() / 1e4,
                                value: q.value,
                            })
                            .collect(),
                        count,
                        sum,
                    },
                };
                CounterUpdate::Sample(Box::new(CounterSample {
                    unix_nanos,
                    provider: p.meter_name,
                    name: p.instrument_name,
                    display_name: String::new(),
                    version: p.meter_version,
                    unit: p.unit,
                    tags,
                    interval_seconds: None,
                    value,
                }))
            }
            Some(KnownEvent::Metrics(MetricsEvent::CollectionStart {
                session_id,
                interval_start_unix_nanos: Some(unix_nanos),
            })) if session_id == self.metrics_session_id => {
                CounterUpdate::IntervalStart { unix_nanos }
            }
            // MultipleSessionsNotSupportedError (no message) goes to every session and names the
            // one that holds the source: when that is ours, another tool (dotnet-counters, whose
            // sessions are never SHARED) was refused, and our values go on.
            Some(KnownEvent::Metrics(MetricsEvent::Error {
                session_id,
                message,
            })) if (session_id == self.metrics_session_id) != message.is_empty() => {
                CounterUpdate::MetricsError {
                    message: if message.is_empty() {
                        format!(
                            "another metrics session ({session_id}) holds the process's \
                             System.Diagnostics.Metrics source; meters are not reported"
                        )
                    } else {
                        message
                    },
                }
            }
            Some(KnownEvent::Metrics(MetricsEvent::TimeSeriesLimitReached { session_id }))
                if session_id == self.metrics_session_id =>
            {
                CounterUpdate::MetricsError {
                    message: "MaxTimeSeries reached: further tag sets are not reported".into(),
                }
            }
            Some(KnownEvent::Metrics(MetricsEvent::HistogramLimitReached { session_id }))
                if session_id == self.metrics_session_id =>
            {
                CounterUpdate::MetricsError {
                    message: "MaxHistograms reached: further histograms are not reported".into(),
                }
            }
            _ => return None,
        })
    }
}

/// `Some(v)` when `v` is a finite number; a counter without a usable value is no sample.
fn finite(v: Option<f64>) -> Option<f64> {
    v.filter(|v| v.is_finite())
}

/// An [`EventObserver`] that hands each update to a callback; damaged payloads are counted and
/// skipped.
pub struct CounterObserver<F> {
    decoder: CounterDecoder,
    on_update: F,
    damaged: u64,
}

impl<F: FnMut(CounterUpdate)> CounterObserver<F> {
    pub fn new(decoder: CounterDecoder, on_update: F) -> Self {
        CounterObserver {
            decoder,
            on_update,
            damaged: 0,
        }
    }

    /// Events whose payload did not decode.
    pub fn damaged(&self) -> u64 {
        self.damaged
    }
}

impl<F: FnMut(CounterUpdate)> EventObserver for CounterObserver<F> {
    fn on_event(&mut self, event: &Event<'_>) {
        match self.decoder.decode(event) {
            Ok(Some(update)) => (self.on_update)(update),
            Ok(None) => {}
            Err(_) => self.damaged += 1,
        }
    }
}

/// Queues `update` for its reader, charged to `share` while it waits; false, counted as a
/// [`SignalKind::LiveMetrics`] dropped, when the share has no room or the queue is full.
fn queue(
    update: CounterUpdate,
    updates: &mpsc::Sender<Charged<CounterUpdate>>,
    share: &SignalShare,
) -> bool {
    let bytes = update.held_bytes();
    let Some(update) = share.charged(SignalKind::LiveMetrics, update, bytes) else {
        return false;
    };
    let queued = updates.try_send(update).is_ok();
    if !queued {
        share.count_dropped(SignalKind::LiveMetrics, 1);
    }
    queued
}

/// Runs a counter session until `stop` resolves or the process ends, sending each update into
/// the bounded `updates` channel, charged to `share` while it waits there; when the receiver
/// falls behind or the share has no room, updates are dropped (counted as
/// [`SignalKind::LiveMetrics`], and logged once per session) rather than buffered.
pub async fn run(
    client: &DiagnosticsClient,
    config: &CounterSessionConfig,
    stop: impl Future<Output = ()>,
    updates: mpsc::Sender<Charged<CounterUpdate>>,
    share: &SignalShare,
) -> Result<SessionSummary, SessionError> {
    let mut warned = false;
    let share = share.clone();
    let observer = CounterObserver::new(CounterDecoder::new(config), move |update| {
        if !queue(update, &updates, &share) && !warned {
            warned = true;
            tracing::warn!(
                "counter updates are dropped: their consumer falls behind, or the process's \
                 signal budget is full (clrscope_signals_dropped_total)"
            );
        }
    });
    let mut sink = ParsingWriter::with_options(tokio::io::sink(), observer, config.parser.clone());
    let (collect, timeout) = (config.collect_tracing(), STOP_TIMEOUT);
    let reading = config.reading;
    let summary =
        session::run_reading(client, collect, &mut sink, stop, timeout, |_| {}, reading).await?;
    if let Some(error) = sink.error() {
        tracing::warn!(%error, "the counter session's stream stopped parsing");
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nettrace::testutil::{scalar_fields, utf16z, EventSpec, MetadataRecord, StreamBuilder};
    use nettrace::Parser;

    #[test]
    fn updates_waiting_for_their_reader_are_charged_and_dropped_past_the_share() {
        let update = |n: usize| {
            CounterUpdate::Sample(Box::new(CounterSample {
                unix_nanos: 0,
                provider: "M".into(),
                name: "x".repeat(10_000 + n),
                display_name: String::new(),
                version: String::new(),
                unit: String::new(),
                tags: Vec::new(),
                interval_seconds: None,
                value: CounterValue::Gauge { value: 1.0 },
            }))
        };
        let agent = profile::budget::SharedBudget::new(1 << 20);
        let share = SignalShare::new(agent.share(100_000));
        let (updates, mut received) = mpsc::channel(1024);
        let queued = (0..50)
            .filter(|&n| queue(update(n), &updates, &share))
            .count();
        assert!((8..10).contains(&queued), "{queued}");
        assert!(agent.held() <= 100_000);
        assert_eq!(share.dropped(SignalKind::LiveMetrics), 50 - queued as u64);
        // Read, it gives its bytes back.
        let first = received.try_recv().unwrap();
        let held = agent.held();
        drop(first);
        assert!(agent.held() < held - 10_000);
        assert!(queue(update(0), &updates, &share));
    }

    #[test]
    fn providers_are_asked_like_dotnet_monitor() {
        let config = CounterSessionConfig::new(2)
            .with_event_counters("System.Runtime")
            .with_event_counters("system.runtime")
            .with_meter("AsyncWeb", &["asyncweb.request.duration"])
            .with_meter("Other", &[]);
        let providers = config.providers();
        assert_eq!(providers.len(), 2);
        assert_eq!(providers[0].name, "System.Runtime");
        assert_eq!(
            providers[0].arguments.as_deref(),
            Some("EventCounterIntervalSec=2")
        );
        let metrics = &providers[1];
        assert_eq!(
            (metrics.name.as_str(), metrics.keywords),
            (METRICS_PROVIDER, 0x2)
        );
        assert_eq!(
            metrics.arguments.as_deref(),
            Some(
                "SessionId=SHARED;Metrics=AsyncWeb\\asyncweb.request.duration,Other;\
                 RefreshInterval=2;MaxTimeSeries=1000;MaxHistograms=20"
            )
        );
        let session = config.collect_tracing();
        assert_eq!(session.rundown_keyword, 0);
        assert_eq!(CounterSessionConfig::new(0).interval_seconds, 1);
    }

    /// A self-describing field list of strings (TypeCode 18).
    fn string_fields(names: &[&str]) -> Vec<u8> {
        let fields: Vec<(i32, &str)> = names.iter().map(|n| (18, *n)).collect();
        scalar_fields(&fields)
    }

    fn strings(values: &[&str]) -> Vec<u8> {
        values.iter().flat_map(|v| utf16z(v)).collect()
    }

    /// The fields of a MetricsEventSource value event, the last one `value_field`.
    fn published_fields(value_field: &str) -> Vec<u8> {
        string_fields(&[
            "sessionId",
            "meterName",
            "meterVersion",
            "instrumentName",
            "unit",
            "tags",
            value_field,
        ])
    }

    fn decode_all(stream: &[u8], decoder: &CounterDecoder) -> Vec<CounterUpdate> {
        let mut parser = Parser::new();
        parser.feed(stream).unwrap();
        let mut out = Vec::new();
        while let Some(event) = parser.next_event().unwrap() {
            if let Some(update) = decoder.decode(&event).unwrap() {
                out.push(update);
            }
        }
        out
    }

    #[test]
    fn histograms_become_percentiles_of_their_own_session() {
        let meta = MetadataRecord::new(1, METRICS_PROVIDER, 9, "HistogramValuePublished")
            .raw_fields(published_fields("quantiles"));
        let ours = strings(&[
            "SHARED",
            "AsyncWeb",
            "",
            "asyncweb.request.duration",
            "ms",
            "kind=alpha,status=200",
            "0.5=12.5;0.95=230;0.99=400",
        ]);
        let theirs = strings(&["other", "AsyncWeb", "", "x", "ms", "", "0.5=1"]);
        let stream = StreamBuilder::new(8)
            .metadata_block(&[meta.encode()], true)
            .event_block(
                &[
                    EventSpec::new(1, 1, 7, 100, ours),
                    EventSpec::new(1, 2, 7, 200, theirs),
                ],
                true,
            )
            .finish();
        let config = CounterSessionConfig::new(5).with_meter("AsyncWeb", &[]);
        let updates = decode_all(&stream, &CounterDecoder::new(&config));
        assert_eq!(updates.len(), 1, "the other session's value is not ours");
        let CounterUpdate::Sample(s) = &updates[0] else {
            panic!("{updates:?}")
        };
        assert_eq!(
            (s.provider.as_str(), s.name.as_str(), s.unit.as_str()),
            ("AsyncWeb", "asyncweb.request.duration", "ms")
        );
        assert_eq!(
            s.tags,
            [
                ("kind".to_string(), "alpha".to_string()),
                ("status".to_string(), "200".to_string())
            ]
        );
        assert_eq!(s.value.percentile(95.0), Some(230.0));
        assert_eq!(s.value.percentile(50.0), Some(12.5));
        assert_eq!(s.value.percentile(90.0), None);
        assert_eq!(s.value.value(), None);
    }

    #[test]
    fn an_interval_start_of_our_session_says_when_it_began() {
        // CollectionStart(string sessionId, DateTime intervalStartTime, DateTime intervalEndTime)
        let meta = MetadataRecord::new(1, METRICS_PROVIDER, 2, "CollectionStart").raw_fields(
            scalar_fields(&[
                (18, "sessionId"),
                (16, "intervalStartTime"),
                (16, "intervalEndTime"),
            ]),
        );
        // 2026-01-01T00:00:00Z as FILETIME, and one second later.
        let start: i64 = 134_116_992_000_000_000;
        let payload = |session: &str| {
            let mut p = utf16z(session);
            p.extend(start.to_le_bytes());
            p.extend((start + 10_000_000).to_le_bytes());
            p
        };
        let stream = StreamBuilder::new(8)
            .metadata_block(&[meta.encode()], true)
            .event_block(
                &[
                    EventSpec::new(1, 1, 7, 100, payload("other")),
                    EventSpec::new(1, 2, 7, 200, payload("SHARED")),
                ],
                true,
            )
            .finish();
        let config = CounterSessionConfig::new(1).with_meter("M", &[]);
        let updates = decode_all(&stream, &CounterDecoder::new(&config));
        assert_eq!(
            updates,
            [CounterUpdate::IntervalStart {
                unix_nanos: 1_767_225_600_000_000_000
            }]
        );
    }

    #[test]
    fn a_refused_session_is_an_error_only_when_it_is_ours() {
        // MultipleSessionsNotSupportedError(string runningSessionId), sent to every session.
        let meta =
            MetadataRecord::new(1, METRICS_PROVIDER, 15, "MultipleSessionsNotSupportedError")
                .raw_fields(scalar_fields(&[(18, "runningSessionId")]));
        let stream = StreamBuilder::new(8)
            .metadata_block(&[meta.encode()], true)
            .event_block(
                &[
                    // dotnet-counters started while we held the source: it was refused, not us.
                    EventSpec::new(1, 1, 7, 100, utf16z("SHARED")),
                    // dotnet-counters held the source when we asked.
                    EventSpec::new(1, 2, 7, 200, utf16z("6634fb08")),
                ],
                true,
            )
            .finish();
        let config = CounterSessionConfig::new(1).with_meter("M", &[]);
        let updates = decode_all(&stream, &CounterDecoder::new(&config));
        assert_eq!(
            updates,
            [CounterUpdate::MetricsError {
                message: "another metrics session (6634fb08) holds the process's \
                          System.Diagnostics.Metrics source; meters are not reported"
                    .into()
            }]
        );
    }

    #[test]
    fn damaged_and_foreign_events_yield_nothing_or_errors() {
        // A histogram whose quantiles are garbage still decodes, with no percentiles.
        let meta = MetadataRecord::new(1, METRICS_PROVIDER, 9, "HistogramValuePublished")
            .raw_fields(published_fields("quantiles"));
        let garbage = strings(&["SHARED", "M", "", "h", "", "=,=", "x=y;0.5=;=1;2=3"]);
        // A gauge with a non-numeric value is no sample.
        let gauge = MetadataRecord::new(2, METRICS_PROVIDER, 7, "GaugeValuePublished")
            .raw_fields(published_fields("lastValue"));
        let nan = strings(&["SHARED", "M", "", "g", "", "", "NaN"]);
        let truncated = vec![0x41, 0];
        let stream = StreamBuilder::new(8)
            .metadata_block(&[meta.encode(), gauge.encode()], true)
            .event_block(
                &[
                    EventSpec::new(1, 1, 7, 100, garbage),
                    EventSpec::new(2, 2, 7, 110, nan),
                    EventSpec::new(2, 3, 7, 120, truncated),
                ],
                true,
            )
            .finish();
        let decoder = CounterDecoder::new(&CounterSessionConfig::new(5));
        let mut parser = Parser::new();
        parser.feed(&stream).unwrap();
        let mut results = Vec::new();
        while let Some(event) = parser.next_event().unwrap() {
            results.push(decoder.decode(&event));
        }
        assert_eq!(results.len(), 3);
        let Ok(Some(CounterUpdate::Sample(h))) = &results[0] else {
            panic!("{:?}", results[0])
        };
        assert_eq!(
            h.value,
            CounterValue::Histogram {
                quantiles: vec![],
                count: None,
                sum: None
            }
        );
        assert!(matches!(results[1], Ok(None)), "{:?}", results[1]);
        assert!(
            results[2].is_err(),
            "a cut payload is an error, not a panic"
        );
    }
}
