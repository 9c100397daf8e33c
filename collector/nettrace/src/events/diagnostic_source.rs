//! DiagnosticSourceEventSource (`Microsoft-Diagnostics-DiagnosticSource`): DiagnosticListener
//! writes and Activity start/stops forwarded to EventPipe, as dotnet-monitor uses them for the
//! ASP.NET Core request triggers. Every event has `SourceName`, `EventName` (or `ActivityName`)
//! and `Arguments`, an array of `{Key, Value}` string pairs selected by the listener's
//! `FilterAndPayloadSpecs`.

use crate::payload::{NamedValue, Value};

/// Which DiagnosticSourceEventSource event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiagnosticSourceKind {
    /// `Event`: a plain DiagnosticListener write.
    Event,
    /// `Activity1Start`.
    Activity1Start,
    /// `Activity1Stop`.
    Activity1Stop,
    /// `Activity2Start`.
    Activity2Start,
    /// `Activity2Stop`.
    Activity2Stop,
    /// `RecursiveActivity1Start`.
    RecursiveActivity1Start,
    /// `RecursiveActivity1Stop`.
    RecursiveActivity1Stop,
    /// `ActivityStart` (ActivitySource activities, .NET 5+).
    ActivityStart,
    /// `ActivityStop`.
    ActivityStop,
}

impl DiagnosticSourceKind {
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "Event" => DiagnosticSourceKind::Event,
            "Activity1Start" => DiagnosticSourceKind::Activity1Start,
            "Activity1Stop" => DiagnosticSourceKind::Activity1Stop,
            "Activity2Start" => DiagnosticSourceKind::Activity2Start,
            "Activity2Stop" => DiagnosticSourceKind::Activity2Stop,
            "RecursiveActivity1Start" => DiagnosticSourceKind::RecursiveActivity1Start,
            "RecursiveActivity1Stop" => DiagnosticSourceKind::RecursiveActivity1Stop,
            "ActivityStart" => DiagnosticSourceKind::ActivityStart,
            "ActivityStop" => DiagnosticSourceKind::ActivityStop,
            _ => return None,
        })
    }

    /// True for the Start events.
    pub fn is_start(&self) -> bool {
        matches!(
            self,
            DiagnosticSourceKind::Activity1Start
                | DiagnosticSourceKind::Activity2Start
                | DiagnosticSourceKind::RecursiveActivity1Start
                | DiagnosticSourceKind::ActivityStart
        )
    }

    /// True for the Stop events.
    pub fn is_stop(&self) -> bool {
        matches!(
            self,
            DiagnosticSourceKind::Activity1Stop
                | DiagnosticSourceKind::Activity2Stop
                | DiagnosticSourceKind::RecursiveActivity1Stop
                | DiagnosticSourceKind::ActivityStop
        )
    }
}

/// A DiagnosticSourceEventSource event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiagnosticSourceEvent {
    /// Which event.
    pub kind: DiagnosticSourceKind,
    /// DiagnosticListener (or ActivitySource) name, e.g. `Microsoft.AspNetCore`.
    pub source_name: String,
    /// Event name, e.g. `Microsoft.AspNetCore.Hosting.HttpRequestIn.Start`.
    pub event_name: String,
    /// The selected payload properties, in order.
    pub arguments: Vec<(String, String)>,
}

impl DiagnosticSourceEvent {
    /// Reads by position: the second field is `EventName` or `ActivityName` depending on the event.
    pub(crate) fn decode(kind: DiagnosticSourceKind, f: &[NamedValue<'_>]) -> Self {
        let text = |i: usize| {
            f.get(i)
                .and_then(|v| v.value.as_str())
                .unwrap_or_default()
                .to_owned()
        };
        let arguments = match f.get(2).map(|v| &v.value) {
            Some(Value::Array(items)) => items
                .iter()
                .map(|kv| {
                    let s = |n: &str| kv.field(n).and_then(Value::as_str).unwrap_or_default();
                    (s("Key").to_owned(), s("Value").to_owned())
                })
                .collect(),
            _ => Vec::new(),
        };
        DiagnosticSourceEvent {
            kind,
            source_name: text(0),
            event_name: text(1),
            arguments,
        }
    }

    /// The value of argument `key`.
    pub fn argument(&self, key: &str) -> Option<&str> {
        self.arguments
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the app records the activity: its sampled flag, from `Recorded`
    /// (`Activity.Recorded`, `True` or `False`: what clrscope's specs ask for, a bool's
    /// `ToString()` being a constant) or from `ActivityTraceFlags` (`None` or `Recorded`, a flags
    /// enum: what dotnet-monitor's specs ask for, in force when its session replaced clrscope's),
    /// and, when asked for, `IsAllDataRequested`: an activity that only exists because the
    /// agent's `Propagate` vote made the runtime create it (no listener in the app samples its
    /// source) inherits its parent's sampled flag but no listener asked for its data, so nothing
    /// in the app records it. `None` when neither flag was asked for.
    pub fn recorded(&self) -> Option<bool> {
        let flag = match (
            self.argument("Recorded"),
            self.argument("ActivityTraceFlags"),
        ) {
            (Some(recorded), _) => recorded == "True",
            (None, Some(flags)) => flags.contains("Recorded"),
            (None, None) => return None,
        };
        Some(flag && self.argument("IsAllDataRequested") != Some("False"))
    }
}
