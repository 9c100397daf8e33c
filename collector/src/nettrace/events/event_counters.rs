//! EventSource `EventCounters` events (`System.Runtime`, `Microsoft.AspNetCore.Hosting`, …):
//! self-describing, read by field name.

use crate::nettrace::error::NettraceError;
use crate::nettrace::payload::{find, find_number, find_text, NamedValue, Value};

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
        let counter_type = find_text(p, "CounterType");
        let value = if find(p, "Increment").is_some() || counter_type == "Sum" {
            EventCounterValue::Increment {
                increment: find_number(p, "Increment"),
                display_rate_time_scale: find_text(p, "DisplayRateTimeScale"),
            }
        } else {
            EventCounterValue::Mean {
                mean: find_number(p, "Mean"),
                standard_deviation: find_number(p, "StandardDeviation"),
                count: find(p, "Count").and_then(Value::as_i64),
                min: find_number(p, "Min"),
                max: find_number(p, "Max"),
            }
        };
        Ok(EventCounter {
            provider: provider.to_owned(),
            name: find_text(p, "Name"),
            display_name: find_text(p, "DisplayName"),
            display_units: find_text(p, "DisplayUnits"),
            counter_type,
            series: find_text(p, "Series"),
            metadata: find_text(p, "Metadata"),
            interval_sec: find_number(p, "IntervalSec"),
            value,
        })
    }
}
