//! System.Diagnostics.Metrics events: the meters' instruments as MetricsEventSource publishes
//! them (self-describing EventSource events, read by field name).
//!
//! MetricsEventSource (runtime `System/Diagnostics/Metrics/MetricsEventSource.cs`) publishes
//! values as strings: `rate`, `value`, `lastValue`, `quantiles` (`"0.5=1.2;0.95=3"`), `tags`
//! (`"k=v,k2=v2"`). Fields added by later versions (`value` on counters, `count`/`sum` on
//! histograms) are `None` when absent.

use super::bounded;
use crate::filetime_to_unix_nanos;
use crate::payload::{find, find_number, NamedValue, Value};

/// MetricsEventSource events, by event name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsEventKind {
    /// CollectionStart: the values of one interval follow.
    CollectionStart,
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
            "CollectionStart" => MetricsEventKind::CollectionStart,
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
    /// The values of an interval follow: when the interval began (the first interval begins when
    /// the source's aggregation did), Unix nanoseconds; `None` without the field.
    CollectionStart {
        session_id: String,
        interval_start_unix_nanos: Option<i64>,
    },
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
    /// The tags split into `(key, value)` pairs, at most [`super::MAX_ARGUMENTS`].
    pub fn tag_pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.tags
            .split(',')
            .filter(|t| !t.is_empty())
            .map(|t| t.split_once('=').unwrap_or((t, "")))
            .take(super::MAX_ARGUMENTS)
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

/// The text of field `name` (empty when absent), cut as log text is: names, units and tags are
/// queued for readers ([`super::MAX_TEXT_BYTES`]).
fn text(fields: &[NamedValue<'_>], name: &str) -> String {
    find(fields, name)
        .and_then(Value::as_str)
        .map(bounded)
        .unwrap_or_default()
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
            MetricsEventKind::CollectionStart => MetricsEvent::CollectionStart {
                session_id: text(f, "sessionId"),
                interval_start_unix_nanos: match find(f, "intervalStartTime") {
                    Some(Value::DateTime(filetime)) => Some(filetime_to_unix_nanos(*filetime)),
                    _ => None,
                },
            },
            MetricsEventKind::CounterRate => published(MetricValue::CounterRate {
                rate: find_number(f, "rate"),
                value: find_number(f, "value"),
            }),
            MetricsEventKind::UpDownCounterRate => published(MetricValue::UpDownCounterRate {
                rate: find_number(f, "rate"),
                value: find_number(f, "value"),
            }),
            MetricsEventKind::Gauge => published(MetricValue::Gauge {
                last_value: find_number(f, "lastValue"),
            }),
            MetricsEventKind::Histogram => published(MetricValue::Histogram {
                quantiles: parse_quantiles(&text(f, "quantiles")),
                count: find(f, "count").and_then(Value::as_i64),
                sum: find_number(f, "sum"),
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
