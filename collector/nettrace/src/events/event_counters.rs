//! EventSource `EventCounters` events (`System.Runtime`, `Microsoft.AspNetCore.Hosting`, …):
//! self-describing, read by field name.

use crate::error::NettraceError;
use crate::payload::{NamedValue, Value};

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
    },
}

impl EventCounter {
    /// The payload fields [`EventCounter::decode`] reads; the others (`Series`, `Metadata`,
    /// `DisplayRateTimeScale`) are read past without decoding their text.
    pub(crate) fn wanted(field: &str) -> bool {
        matches!(
            field,
            "Name"
                | "DisplayName"
                | "DisplayUnits"
                | "CounterType"
                | "IntervalSec"
                | "Mean"
                | "StandardDeviation"
                | "Count"
                | "Min"
                | "Max"
                | "Increment"
        )
    }

    /// Reads the `Payload` struct in one pass over its fields, moving its strings out.
    pub(crate) fn decode(
        provider: &str,
        fields: Vec<NamedValue<'_>>,
        payload_offset: u64,
    ) -> Result<Self, NettraceError> {
        let Some(payload) = take_payload(fields) else {
            return Err(NettraceError::Payload {
                event: format!("{provider}/EventCounters"),
                offset: payload_offset,
                reason: "no struct field named Payload".into(),
            });
        };
        let (mut name, mut display_name, mut display_units) =
            (String::new(), String::new(), String::new());
        let mut counter_type = String::new();
        let mut interval_sec = None;
        let (mut mean, mut standard_deviation, mut count, mut min, mut max) =
            (None, None, None, None, None);
        let (mut increment, mut has_increment) = (None, false);
        for field in payload {
            let value = field.value;
            match field.name {
                "Name" => name = into_text(value),
                "DisplayName" => display_name = into_text(value),
                "DisplayUnits" => display_units = into_text(value),
                "CounterType" => counter_type = into_text(value),
                "IntervalSec" => interval_sec = value.as_f64(),
                "Mean" => mean = value.as_f64(),
                "StandardDeviation" => standard_deviation = value.as_f64(),
                "Count" => count = value.as_i64(),
                "Min" => min = value.as_f64(),
                "Max" => max = value.as_f64(),
                "Increment" => {
                    has_increment = true;
                    increment = value.as_f64();
                }
                _ => {}
            }
        }
        let value = if has_increment || counter_type == "Sum" {
            EventCounterValue::Increment { increment }
        } else {
            EventCounterValue::Mean {
                mean,
                standard_deviation,
                count,
                min,
                max,
            }
        };
        Ok(EventCounter {
            provider: provider.to_owned(),
            name,
            display_name,
            display_units,
            counter_type,
            interval_sec,
            value,
        })
    }
}

/// The fields of the struct named `Payload`: EventSource wraps the TraceLogging payload in an
/// unnamed struct, so one level down counts too. The first such field wins.
fn take_payload(fields: Vec<NamedValue<'_>>) -> Option<Vec<NamedValue<'_>>> {
    let mut nested = None;
    for field in fields {
        match field.value {
            Value::Struct(inner) if field.name == "Payload" => return Some(inner),
            Value::Struct(inner) if nested.is_none() => {
                nested = inner
                    .into_iter()
                    .find(|f| f.name == "Payload")
                    .map(|f| f.value);
            }
            _ => {}
        }
    }
    match nested {
        Some(Value::Struct(inner)) => Some(inner),
        _ => None,
    }
}

/// The text of a value, cut as log text is ([`super::MAX_TEXT_BYTES`]); empty when it is not
/// text.
fn into_text(value: Value<'_>) -> String {
    match value {
        Value::String(s) if s.len() > super::MAX_TEXT_BYTES => super::bounded(&s),
        Value::String(s) => s,
        _ => String::new(),
    }
}
