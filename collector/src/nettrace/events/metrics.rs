//! EventCounters and System.Diagnostics.Metrics events (both self-describing EventSource
//! events, read by field name).
//!
//! MetricsEventSource (runtime `System/Diagnostics/Metrics/MetricsEventSource.cs`) publishes
//! values as strings: `rate`, `value`, `lastValue`, `quantiles` (`"0.5=1.2;0.95=3"`), `tags`
//! (`"k=v,k2=v2"`). Fields added by later versions (`value` on counters, `count`/`sum` on
//! histograms) are `None` when absent.

use crate::nettrace::error::NettraceError;
use crate::nettrace::payload::{find, NamedValue, Value};

/// MetricsEventSource events, by event name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsEventKind {
    /// CounterRateValuePublished.
    CounterRate,
    /// UpDownCounterRateValuePublished.
    UpDownCounterRate,
    /// GaugeValuePublished.
    Gauge,
    /// HistogramValuePublished.
    Histogram,
    /// BeginInstrumentReporting.
    BeginInstrumentReporting,
    /// EndInstrumentReporting.
    EndInstrumentReporting,
    /// InstrumentPublished.
    InstrumentPublished,
    /// Error.
    Error,
    /// ObservableInstrumentCallbackError.
    ObservableInstrumentCallbackError,
    /// MultipleSessionsNotSupportedError.
    MultipleSessionsNotSupportedError,
    /// TimeSeriesLimitReached.
    TimeSeriesLimitReached,
    /// HistogramLimitReached.
    HistogramLimitReached,
}

impl MetricsEventKind {
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "CounterRateValuePublished" => MetricsEventKind::CounterRate,
            "UpDownCounterRateValuePublished" => MetricsEventKind::UpDownCounterRate,
            "GaugeValuePublished" => MetricsEventKind::Gauge,
            "HistogramValuePublished" => MetricsEventKind::Histogram,
            "BeginInstrumentReporting" => MetricsEventKind::BeginInstrumentReporting,
            "EndInstrumentReporting" => MetricsEventKind::EndInstrumentReporting,
            "InstrumentPublished" => MetricsEventKind::InstrumentPublished,
            "Error" => MetricsEventKind::Error,
            "ObservableInstrumentCallbackError" => {
                MetricsEventKind::ObservableInstrumentCallbackError
            }
            "MultipleSessionsNotSupportedError" => {
                MetricsEventKind::MultipleSessionsNotSupportedError
            }
            "TimeSeriesLimitReached" => MetricsEventKind::TimeSeriesLimitReached,
            "HistogramLimitReached" => MetricsEventKind::HistogramLimitReached,
            _ => return None,
        })
    }
}

/// A decoded System.Diagnostics.Metrics event.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum MetricsEvent {
    /// A measurement: CounterRate/UpDownCounterRate/Gauge/HistogramValuePublished.
    Published(MetricPublished),
    /// An instrument starts or stops being reported, or was published.
    Instrument(InstrumentEvent),
    /// The source reports an error (Error, ObservableInstrumentCallbackError,
    /// MultipleSessionsNotSupportedError): `session_id` and message.
    Error {
        /// Session the error concerns (the running session for MultipleSessionsNotSupported).
        session_id: String,
        /// Message ("" when the event carries none).
        message: String,
    },
    /// The MaxTimeSeries limit was hit: further series are not reported.
    TimeSeriesLimitReached {
        /// Session id.
        session_id: String,
    },
    /// The MaxHistograms limit was hit.
    HistogramLimitReached {
        /// Session id.
        session_id: String,
    },
}

/// One published measurement of an instrument for one tag set.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricPublished {
    /// The `SessionId` the listener passed in its filter arguments.
    pub session_id: String,
    /// Meter name.
    pub meter_name: String,
    /// Meter version.
    pub meter_version: String,
    /// Instrument name.
    pub instrument_name: String,
    /// Unit.
    pub unit: String,
    /// Tags as sent, `k=v,k2=v2`; see [`MetricPublished::tag_pairs`].
    pub tags: String,
    /// The value.
    pub value: MetricValue,
}

impl MetricPublished {
    /// The tags split into `(key, value)` pairs.
    pub fn tag_pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.tags
            .split(',')
            .filter(|t| !t.is_empty())
            .map(|t| t.split_once('=').unwrap_or((t, "")))
    }
}

/// The measured value(s), by instrument kind.
#[derive(Debug, Clone, PartialEq)]
pub enum MetricValue {
    /// Counter: `rate` is the delta over the interval, `value` the running total (V1+).
    CounterRate {
        /// Delta over the interval.
        rate: Option<f64>,
        /// Cumulative value.
        value: Option<f64>,
    },
    /// UpDownCounter: same shape as a counter.
    UpDownCounterRate {
        /// Delta over the interval.
        rate: Option<f64>,
        /// Cumulative value.
        value: Option<f64>,
    },
    /// Gauge (observable or not): last observed value.
    Gauge {
        /// Last value.
        last_value: Option<f64>,
    },
    /// Histogram: quantiles, and count/sum from V1.
    Histogram {
        /// Quantile estimates.
        quantiles: Vec<Quantile>,
        /// Number of measurements in the interval (V1+).
        count: Option<i64>,
        /// Sum of the measurements (V1+).
        sum: Option<f64>,
    },
}

/// One quantile estimate of a histogram.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quantile {
    /// Quantile in 0..=1.
    pub quantile: f64,
    /// Estimated value.
    pub value: f64,
}

/// What happened to an instrument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstrumentEventKind {
    /// BeginInstrumentReporting: values for it will follow.
    BeginReporting,
    /// EndInstrumentReporting: no more values.
    EndReporting,
    /// InstrumentPublished: it exists (InstrumentPublishing keyword).
    Published,
}

/// An instrument description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstrumentEvent {
    /// Which event.
    pub kind: InstrumentEventKind,
    /// Session id.
    pub session_id: String,
    /// Meter name.
    pub meter_name: String,
    /// Meter version.
    pub meter_version: String,
    /// Instrument name.
    pub instrument_name: String,
    /// CLR type name of the instrument, e.g. ``Histogram`1``.
    pub instrument_type: String,
    /// Unit.
    pub unit: String,
    /// Description.
    pub description: String,
}

fn text(fields: &[NamedValue<'_>], name: &str) -> String {
    find(fields, name)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn number(fields: &[NamedValue<'_>], name: &str) -> Option<f64> {
    find(fields, name).and_then(Value::as_f64)
}

fn parse_quantiles(s: &str) -> Vec<Quantile> {
    s.split(';')
        .filter_map(|q| {
            let (k, v) = q.split_once('=')?;
            Some(Quantile {
                quantile: k.trim().parse().ok()?,
                value: v.trim().parse().ok()?,
            })
        })
        .collect()
}

impl MetricsEvent {
    pub(crate) fn decode(kind: MetricsEventKind, f: &[NamedValue<'_>]) -> Self {
        let published = |value| {
            MetricsEvent::Published(MetricPublished {
                session_id: text(f, "sessionId"),
                meter_name: text(f, "meterName"),
                meter_version: text(f, "meterVersion"),
                instrument_name: text(f, "instrumentName"),
                unit: text(f, "unit"),
                tags: text(f, "tags"),
                value,
            })
        };
        let instrument = |kind| {
            MetricsEvent::Instrument(InstrumentEvent {
                kind,
                session_id: text(f, "sessionId"),
                meter_name: text(f, "meterName"),
                meter_version: text(f, "meterVersion"),
                instrument_name: text(f, "instrumentName"),
                instrument_type: text(f, "instrumentType"),
                unit: text(f, "unit"),
                description: text(f, "description"),
            })
        };
        match kind {
            MetricsEventKind::CounterRate => published(MetricValue::CounterRate {
                rate: number(f, "rate"),
                value: number(f, "value"),
            }),
            MetricsEventKind::UpDownCounterRate => published(MetricValue::UpDownCounterRate {
                rate: number(f, "rate"),
                value: number(f, "value"),
            }),
            MetricsEventKind::Gauge => published(MetricValue::Gauge {
                last_value: number(f, "lastValue"),
            }),
            MetricsEventKind::Histogram => published(MetricValue::Histogram {
                quantiles: parse_quantiles(&text(f, "quantiles")),
                count: find(f, "count").and_then(Value::as_i64),
                sum: number(f, "sum"),
            }),
            MetricsEventKind::BeginInstrumentReporting => {
                instrument(InstrumentEventKind::BeginReporting)
            }
            MetricsEventKind::EndInstrumentReporting => {
                instrument(InstrumentEventKind::EndReporting)
            }
            MetricsEventKind::InstrumentPublished => instrument(InstrumentEventKind::Published),
            MetricsEventKind::Error | MetricsEventKind::ObservableInstrumentCallbackError => {
                MetricsEvent::Error {
                    session_id: text(f, "sessionId"),
                    message: text(f, "errorMessage"),
                }
            }
            MetricsEventKind::MultipleSessionsNotSupportedError => MetricsEvent::Error {
                session_id: text(f, "runningSessionId"),
                message: String::new(),
            },
            MetricsEventKind::TimeSeriesLimitReached => MetricsEvent::TimeSeriesLimitReached {
                session_id: text(f, "sessionId"),
            },
            MetricsEventKind::HistogramLimitReached => MetricsEvent::HistogramLimitReached {
                session_id: text(f, "sessionId"),
            },
        }
    }
}

/// One EventCounters event: an EventSource counter's value over one interval. The payload is a
/// single struct field `Payload`, whose fields depend on the counter type.
#[derive(Debug, Clone, PartialEq)]
pub struct EventCounter {
    /// The EventSource that owns the counter (e.g. `System.Runtime`).
    pub provider: String,
    /// Counter name, e.g. `cpu-usage`.
    pub name: String,
    /// Display name.
    pub display_name: String,
    /// Display units.
    pub display_units: String,
    /// `Mean` or `Sum` as sent.
    pub counter_type: String,
    /// `Interval=1000` and the like.
    pub series: String,
    /// Counter metadata string.
    pub metadata: String,
    /// Length of the interval in seconds.
    pub interval_sec: Option<f64>,
    /// The value.
    pub value: EventCounterValue,
}

/// The statistic an EventCounter carries.
#[derive(Debug, Clone, PartialEq)]
pub enum EventCounterValue {
    /// EventCounter / PollingCounter: statistics of the interval.
    Mean {
        /// Mean.
        mean: Option<f64>,
        /// Standard deviation.
        standard_deviation: Option<f64>,
        /// Number of values.
        count: Option<i64>,
        /// Minimum.
        min: Option<f64>,
        /// Maximum.
        max: Option<f64>,
    },
    /// IncrementingEventCounter / IncrementingPollingCounter: growth over the interval.
    Increment {
        /// Increment over the interval.
        increment: Option<f64>,
        /// Time scale for rate display, e.g. `00:00:01`.
        display_rate_time_scale: String,
    },
}

impl EventCounter {
    pub(crate) fn decode(
        provider: &str,
        fields: &[NamedValue<'_>],
        payload_offset: u64,
    ) -> Result<Self, NettraceError> {
        // EventSource wraps the TraceLogging payload in an unnamed struct: look one level down too.
        let payload = find(fields, "Payload")
            .or_else(|| fields.iter().find_map(|f| f.value.field("Payload")));
        let Some(Value::Struct(p)) = payload else {
            return Err(NettraceError::Payload {
                event: format!("{provider}/EventCounters"),
                offset: payload_offset,
                reason: "no struct field named Payload".into(),
            });
        };
        let p = p.as_slice();
        let counter_type = text(p, "CounterType");
        let value = if find(p, "Increment").is_some() || counter_type == "Sum" {
            EventCounterValue::Increment {
                increment: number(p, "Increment"),
                display_rate_time_scale: text(p, "DisplayRateTimeScale"),
            }
        } else {
            EventCounterValue::Mean {
                mean: number(p, "Mean"),
                standard_deviation: number(p, "StandardDeviation"),
                count: find(p, "Count").and_then(Value::as_i64),
                min: number(p, "Min"),
                max: number(p, "Max"),
            }
        };
        Ok(EventCounter {
            provider: provider.to_owned(),
            name: text(p, "Name"),
            display_name: text(p, "DisplayName"),
            display_units: text(p, "DisplayUnits"),
            counter_type,
            series: text(p, "Series"),
            metadata: text(p, "Metadata"),
            interval_sec: number(p, "IntervalSec"),
            value,
        })
    }
}
