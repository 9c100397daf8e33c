//! Spans: W3C trace and span ids, a span as the profile labels and log records name it, and a
//! finished span as the agent records and exports it.

use std::fmt;
use std::sync::Arc;

/// A W3C trace id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TraceId(pub [u8; 16]);

/// A W3C span id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpanId(pub [u8; 8]);

/// Parses exactly `N * 2` hex digits; all-zero ids are W3C's "invalid" and are refused too
/// (`Activity.TraceId` of a hierarchical-format activity reads as zeros).
fn parse_hex_id<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != N * 2 {
        return None;
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; N];
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    out.iter().any(|&b| b != 0).then_some(out)
}

fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    bytes.iter().try_for_each(|b| write!(f, "{b:02x}"))
}

impl TraceId {
    /// From 32 hex digits, as `ActivityTraceId.ToString()` writes them; `None` if malformed or zero.
    pub fn from_hex(text: &str) -> Option<TraceId> {
        parse_hex_id(text).map(TraceId)
    }
}

impl SpanId {
    /// From 16 hex digits, as `ActivitySpanId.ToString()` writes them; `None` if malformed or zero.
    pub fn from_hex(text: &str) -> Option<SpanId> {
        parse_hex_id(text).map(SpanId)
    }
}

/// Lowercase hex, the W3C `traceparent` form (and the form of the `trace_id` label).
impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

/// Lowercase hex (the form of the `span_id` label).
impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

/// A span as the profile labels name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// The activity's operation name (bounded by code, unlike display names that may hold paths).
    pub name: Arc<str>,
}

/// Tags kept per span (OpenTelemetry's default attribute count limit); the rest are counted.
pub const MAX_SPAN_TAGS: usize = 128;
/// Bytes of text (names, tags, description) kept per span; past it tags are dropped, counted.
pub const MAX_SPAN_TEXT: usize = 16 * 1024;

/// `Activity.Kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    Internal,
    Server,
    Client,
    Producer,
    Consumer,
}

impl SpanKind {
    pub fn parse(text: &str) -> Option<SpanKind> {
        Some(match text {
            "Internal" => SpanKind::Internal,
            "Server" => SpanKind::Server,
            "Client" => SpanKind::Client,
            "Producer" => SpanKind::Producer,
            "Consumer" => SpanKind::Consumer,
            _ => return None,
        })
    }
}

/// `Activity.Status` (`ActivityStatusCode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanStatus {
    Unset,
    Ok,
    Error,
}

impl SpanStatus {
    pub fn parse(text: &str) -> Option<SpanStatus> {
        Some(match text {
            "Unset" => SpanStatus::Unset,
            "Ok" => SpanStatus::Ok,
            "Error" => SpanStatus::Error,
            _ => return None,
        })
    }
}

/// A finished, recorded span of an attached process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanRecord {
    /// Trace and span ids and the operation name, as profile sample links and logs name them.
    pub span: Span,
    /// `None` for a root span.
    pub parent_span_id: Option<SpanId>,
    /// `Activity.DisplayName` (the operation name unless the app set one).
    pub display_name: String,
    pub kind: SpanKind,
    pub start_unix_nanos: i64,
    pub duration_nanos: i64,
    pub status: SpanStatus,
    pub status_description: String,
    /// W3C `tracestate`, empty when none.
    pub trace_state: String,
    /// The ActivitySource: the span's instrumentation scope.
    pub source_name: Arc<str>,
    pub source_version: String,
    /// `Activity.TagObjects`, each value as its `ToString()`, at most [`MAX_SPAN_TAGS`].
    pub tags: Vec<(String, String)>,
    /// Tags beyond the limits.
    pub dropped_tags: u32,
}

impl SpanRecord {
    pub fn end_unix_nanos(&self) -> i64 {
        self.start_unix_nanos.saturating_add(self.duration_nanos)
    }
}
