//! Log records: `Microsoft.Extensions.Logging` levels and messages as the logging events carry
//! them, and a message as the agent keeps, serves and exports it.

use std::sync::Arc;

use crate::budget::Charged;
use crate::span::{Span, SpanId, TraceId};

/// `Microsoft.Extensions.Logging.LogLevel`, as the events carry it (0 = Trace … 5 = Critical).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum LogLevel {
    Trace,
    Debug,
    Information,
    Warning,
    Error,
    Critical,
}

impl LogLevel {
    /// Every level, lowest first.
    pub const ALL: [LogLevel; 6] = [
        LogLevel::Trace,
        LogLevel::Debug,
        LogLevel::Information,
        LogLevel::Warning,
        LogLevel::Error,
        LogLevel::Critical,
    ];

    /// From the number the events carry; `None` (LogLevel.None, 6) and out-of-range values are no level.
    pub fn from_number(n: i64) -> Option<LogLevel> {
        usize::try_from(n)
            .ok()
            .and_then(|i| Self::ALL.get(i).copied())
    }

    /// From its name (any case) or number, as FilterSpecs and dotnet-monitor's `level` take it.
    pub fn parse(text: &str) -> Option<LogLevel> {
        let text = text.trim();
        if let Ok(n) = text.parse::<i64>() {
            return Self::from_number(n);
        }
        Self::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(text))
    }

    /// The name, as `LogLevel.ToString()` writes it.
    pub fn name(self) -> &'static str {
        match self {
            LogLevel::Trace => "Trace",
            LogLevel::Debug => "Debug",
            LogLevel::Information => "Information",
            LogLevel::Warning => "Warning",
            LogLevel::Error => "Error",
            LogLevel::Critical => "Critical",
        }
    }

    /// The four-letter abbreviation of the console formatter (dotnet-monitor's text format).
    pub fn short_name(self) -> &'static str {
        match self {
            LogLevel::Trace => "trce",
            LogLevel::Debug => "dbug",
            LogLevel::Information => "info",
            LogLevel::Warning => "warn",
            LogLevel::Error => "fail",
            LogLevel::Critical => "crit",
        }
    }

    /// OpenTelemetry's severity number (TRACE=1, DEBUG=5, INFO=9, WARN=13, ERROR=17, FATAL=21).
    pub fn severity_number(self) -> i32 {
        1 + 4 * self as i32
    }
}

/// An exception attached to a log message (`ExceptionJson`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LoggedException {
    pub type_name: String,
    pub message: String,
    /// `HResult`, which the event writes as a decimal string.
    pub hresult: Option<i32>,
    /// `Exception.ToString()`: type, message, inner exceptions and stack.
    pub verbose_message: String,
}

/// One `ILogger.Log` call.
#[derive(Debug, Clone, PartialEq)]
pub struct LogMessage {
    pub level: LogLevel,
    pub factory_id: i32,
    /// The logger's category (`LoggerName`).
    pub category: String,
    pub event_id: i32,
    pub event_name: String,
    /// The formatted message (`FormattedMessage`; .NET ≥ 5 on MessageJson).
    pub message: String,
    pub exception: Option<LoggedException>,
    /// The structured arguments in order, `{OriginalFormat}` included, values as strings.
    pub arguments: Vec<(String, String)>,
    /// The W3C context the event carries itself (packages of .NET ≥ 9, with a current Activity).
    pub trace: Option<EventTrace>,
}

/// The `ActivityTraceId`, `ActivitySpanId` and `ActivityTraceFlags` of a message event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventTrace {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// W3C trace flags (1: sampled/recorded).
    pub flags: u8,
}

impl EventTrace {
    /// From the three fields as the event writes them (`ActivityTraceFlags` as a number: "1"; or
    /// as the enum's name); none when the ids are empty (no Activity) or malformed.
    pub fn read(trace_id: &str, span_id: &str, flags: &str) -> Option<EventTrace> {
        let flags = match flags.trim() {
            "Recorded" => 1,
            "None" | "" => 0,
            number => number.parse().ok()?,
        };
        Some(EventTrace {
            trace_id: TraceId::from_hex(trace_id)?,
            span_id: SpanId::from_hex(span_id)?,
            flags,
        })
    }
}

/// Where a record's trace and span ids came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdsFrom {
    /// The event's own `ActivityTraceId`, `ActivitySpanId` and `ActivityTraceFlags` (the
    /// logging package of .NET 9 and later), with those flags.
    Event { flags: u8 },
    /// Trace linkage: the span the message's EventSource activity, else its thread, was in when
    /// it was logged (packages that write no ids: 8.x).
    Linkage,
}

impl IdsFrom {
    /// As `/logs` (`IdsFrom`) and OTLP (`clrscope.ids_from`) name it.
    pub fn name(self) -> &'static str {
        match self {
            IdsFrom::Event { .. } => "event",
            IdsFrom::Linkage => "linkage",
        }
    }
}

/// The values of one `BeginScope`, kept once (charged to the process's signal budget) and shared
/// by every record logged inside it.
pub type ScopeValues = Arc<Charged<Vec<(String, String)>>>;

/// One log message as clrscope keeps and serves it.
#[derive(Debug, Clone, PartialEq)]
pub struct LogRecord {
    pub unix_nanos: i64,
    pub message: LogMessage,
    /// The values of the scopes open around it, outermost first.
    pub scopes: Vec<ScopeValues>,
    /// The span it was logged in: from the event itself (.NET ≥ 9), else trace linkage.
    pub span: Option<Span>,
    /// Where `span`'s ids came from; `Some` exactly when `span` is.
    pub ids_from: Option<IdsFrom>,
}
