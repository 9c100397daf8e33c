//! `Microsoft-Extensions-Logging`: the EventSource of `EventSourceLogger`, which every ASP.NET Core
//! host registers (dotnet/runtime `src/libraries/Microsoft.Extensions.Logging.EventSource/src/
//! LoggingEventSource.cs`). It is self-describing and read by field name:
//!
//! | id | event | fields |
//! |---|---|---|
//! | 1 | FormattedMessage | Level, FactoryID, LoggerName, EventId, EventName, FormattedMessage |
//! | 5 | MessageJson | Level, FactoryID, LoggerName, EventId, EventName, ExceptionJson, ArgumentsJson, FormattedMessage |
//! | 6 | ActivityJsonStart | ID, FactoryID, LoggerName, ArgumentsJson (a `BeginScope`) |
//! | 7 | ActivityJsonStop | ID, FactoryID, LoggerName |
//!
//! The Microsoft.Extensions.Logging.EventSource package of .NET 9 and later (the assembly the app
//! loads decides, not the runtime) appends `ActivityTraceId`, `ActivitySpanId` and
//! `ActivityTraceFlags` to events 1, 2 and 5 (empty strings without a W3C `Activity`); 8.x sends
//! none. Events 2–4 (Message, ActivityStart, ActivityStop: struct and array fields) are not read:
//! clrscope enables the JSON keyword only. `tests/golden/logging/layout-net<major>.json` holds what
//! each runtime of the matrix writes, recorded from the real provider.

use super::{bounded, head, MAX_ARGUMENTS, MAX_TEXT_BYTES};
use crate::payload::{find, NamedValue, Value};
use profile::log::{EventTrace, LogLevel, LogMessage, LoggedException};

/// Provider name of `LoggingEventSource`.
pub const LOGGING_PROVIDER: &str = "Microsoft-Extensions-Logging";

/// Most bytes the arguments (or scope values) of one event keep together, keys and values: the
/// values past it are cut, the arguments after them left out.
pub const MAX_ARGUMENTS_BYTES: usize = 4 * MAX_TEXT_BYTES;

/// A decoded `Microsoft-Extensions-Logging` event.
#[derive(Debug, Clone, PartialEq)]
pub enum LoggingEvent {
    /// FormattedMessage or MessageJson.
    Message(LogMessage),
    /// ActivityJsonStart: `BeginScope` with these values.
    ScopeStart {
        id: i32,
        category: String,
        values: Vec<(String, String)>,
    },
    /// ActivityJsonStop.
    ScopeStop { id: i32, category: String },
}

/// Which logging event, by name (the ids are fixed too, but names survive a reordering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoggingEventKind {
    FormattedMessage,
    MessageJson,
    ScopeStart,
    ScopeStop,
}

impl LoggingEventKind {
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "FormattedMessage" => LoggingEventKind::FormattedMessage,
            "MessageJson" => LoggingEventKind::MessageJson,
            "ActivityJsonStart" | "ActivityJson/Start" => LoggingEventKind::ScopeStart,
            "ActivityJsonStop" | "ActivityJson/Stop" => LoggingEventKind::ScopeStop,
            _ => return None,
        })
    }
}

/// A flat JSON object's members as strings (numbers and booleans as written), in the object's
/// order, at most [`MAX_ARGUMENTS`] of at most [`MAX_ARGUMENTS_BYTES`] together; anything else (not
/// JSON, not an object) gives none.
fn json_pairs(text: &str) -> Vec<(String, String)> {
    /// The members in order (a `serde_json::Map` would sort them by key), within the budget.
    struct Ordered(Vec<(String, String)>);
    impl<'de> serde::Deserialize<'de> for Ordered {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Members;
            impl<'de> serde::de::Visitor<'de> for Members {
                type Value = Ordered;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> Result<Ordered, A::Error> {
                    let mut left = MAX_ARGUMENTS_BYTES;
                    let mut pairs = Vec::new();
                    while let Some((k, v)) = map.next_entry::<String, serde_json::Value>()? {
                        if pairs.len() == MAX_ARGUMENTS || left == 0 {
                            continue;
                        }
                        let value = match v {
                            serde_json::Value::String(s) => s,
                            serde_json::Value::Null => String::new(),
                            other => other.to_string(),
                        };
                        let key = head(&k, MAX_TEXT_BYTES.min(left)).to_owned();
                        left -= key.len();
                        let value = head(&value, MAX_TEXT_BYTES.min(left)).to_owned();
                        left -= value.len();
                        pairs.push((key, value));
                    }
                    Ok(Ordered(pairs))
                }
            }
            d.deserialize_map(Members)
        }
    }
    serde_json::from_str::<Ordered>(text)
        .map(|o| o.0)
        .unwrap_or_default()
}

fn logged_exception(text: &str) -> Option<LoggedException> {
    let pairs = json_pairs(text);
    let get = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    let type_name = get("TypeName").filter(|t| !t.is_empty())?;
    Some(LoggedException {
        type_name,
        message: get("Message").unwrap_or_default(),
        hresult: get("HResult").and_then(|h| h.trim().parse().ok()),
        verbose_message: get("VerboseMessage").unwrap_or_default(),
    })
}

impl LoggingEvent {
    /// Reads by field name, so the .NET 9 fields (and any later ones) are found where they are;
    /// a missing field reads as empty. A `Level` that is no level (None, out of range) makes no
    /// message.
    pub(crate) fn decode(kind: LoggingEventKind, fields: &[NamedValue<'_>]) -> Option<Self> {
        let raw = |name: &str| find(fields, name).and_then(Value::as_str);
        let text = |name: &str| raw(name).map(bounded);
        let number = |name: &str| find(fields, name).and_then(Value::as_i64);
        let int = |name: &str| {
            number(name)
                .and_then(|n| i32::try_from(n).ok())
                .unwrap_or(0)
        };
        let category = text("LoggerName").unwrap_or_default();
        Some(match kind {
            LoggingEventKind::FormattedMessage | LoggingEventKind::MessageJson => {
                let level = LogLevel::from_number(number("Level")?)?;
                let trace = match (raw("ActivityTraceId"), raw("ActivitySpanId")) {
                    (Some(t), Some(s)) => {
                        EventTrace::read(t, s, raw("ActivityTraceFlags").unwrap_or(""))
                    }
                    _ => None,
                };
                LoggingEvent::Message(LogMessage {
                    level,
                    factory_id: int("FactoryID"),
                    category,
                    event_id: int("EventId"),
                    event_name: text("EventName").unwrap_or_default(),
                    message: text("FormattedMessage").unwrap_or_default(),
                    exception: raw("ExceptionJson").and_then(logged_exception),
                    arguments: raw("ArgumentsJson").map(json_pairs).unwrap_or_default(),
                    trace,
                })
            }
            LoggingEventKind::ScopeStart => LoggingEvent::ScopeStart {
                id: int("ID"),
                category,
                values: raw("ArgumentsJson").map(json_pairs).unwrap_or_default(),
            },
            LoggingEventKind::ScopeStop => LoggingEvent::ScopeStop {
                id: int("ID"),
                category,
            },
        })
    }
}
