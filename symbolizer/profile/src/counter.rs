//! Counter samples: one published value of an EventCounter or a System.Diagnostics.Metrics
//! instrument, as the agent reads, serves and exports it.

use serde::Serialize;

/// One published value of a counter or instrument (for meters: of one tag set).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CounterSample {
    /// When the runtime published it (the end of its interval), Unix nanoseconds.
    pub unix_nanos: i64,
    /// The EventSource (`System.Runtime`) or meter (`AsyncWeb`) it belongs to.
    pub provider: String,
    /// Counter or instrument name, e.g. `cpu-usage`, `asyncweb.request.duration`.
    pub name: String,
    /// An EventCounter's display name (`CPU Usage`); "" for meters.
    pub display_name: String,
    /// The meter's version; "" for EventCounters and unversioned meters.
    pub version: String,
    /// Display units of an EventCounter (`%`, `MB`), or the instrument's unit (`ms`); may be "".
    pub unit: String,
    /// A meter measurement's tags, in the order published; empty for EventCounters.
    pub tags: Vec<(String, String)>,
    /// The interval the value covers, in seconds, when the runtime says.
    pub interval_seconds: Option<f64>,
    pub value: CounterValue,
}

/// A published value, by kind of counter or instrument.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CounterValue {
    /// EventCounter / PollingCounter: the mean of what was recorded in the interval (for a
    /// polling counter, the one polled value). A gauge.
    Mean {
        mean: f64,
        min: Option<f64>,
        max: Option<f64>,
        count: Option<i64>,
    },
    /// IncrementingEventCounter / IncrementingPollingCounter: how much it grew in the interval.
    Increment { increment: f64 },
    /// Meter Counter / ObservableCounter: growth in the interval, and the running total (.NET ≥ 8).
    Counter { rate: f64, total: Option<f64> },
    /// Meter UpDownCounter: change in the interval, and the current value (.NET ≥ 8).
    UpDownCounter { rate: f64, value: Option<f64> },
    /// Meter Gauge / ObservableGauge: the last observed value.
    Gauge { value: f64 },
    /// Meter Histogram: the percentiles the runtime estimates over the interval (50, 95, 99),
    /// and, on .NET ≥ 8, the number and sum of the measurements.
    Histogram {
        quantiles: Vec<Percentile>,
        count: Option<i64>,
        sum: Option<f64>,
    },
}

/// One percentile estimate of a histogram.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentile {
    /// 0 to 100, e.g. 95.
    pub percentile: f64,
    pub value: f64,
}

impl CounterValue {
    /// The single number dotnet-monitor's EventCounter and EventMeter triggers compare: the mean,
    /// the increment, a counter's rate, an up-down counter's value (else its rate), a gauge's
    /// value; `None` for a histogram (pick a [`percentile`](Self::percentile)).
    pub fn value(&self) -> Option<f64> {
        match self {
            CounterValue::Mean { mean, .. } => Some(*mean),
            CounterValue::Increment { increment } => Some(*increment),
            CounterValue::Counter { rate, .. } => Some(*rate),
            CounterValue::UpDownCounter { rate, value } => Some(value.unwrap_or(*rate)),
            CounterValue::Gauge { value } => Some(*value),
            CounterValue::Histogram { .. } => None,
        }
    }

    /// A histogram's estimate of `percentile` (0–100), if published.
    pub fn percentile(&self, percentile: f64) -> Option<f64> {
        match self {
            CounterValue::Histogram { quantiles, .. } => quantiles
                .iter()
                .find(|q| (q.percentile - percentile).abs() < 1e-9)
                .map(|q| q.value),
            _ => None,
        }
    }
}
