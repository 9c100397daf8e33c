//! First-chance exceptions out of process, from the runtime's own `ExceptionThrown_V1` events and
//! their stacks (dotnet-monitor needs an in-process startup hook for this), in dotnet-monitor's
//! `/exceptions` formats.

use std::fmt::Write as _;

use crate::activity::Span;

/// `ExceptionFlags` bit: the exception has an inner exception.
pub const FLAG_HAS_INNER: u16 = 0x1;
/// `ExceptionFlags` bit: thrown while another was being handled.
pub const FLAG_NESTED: u16 = 0x2;
/// `ExceptionFlags` bit: rethrown (`throw;`).
pub const FLAG_RETHROWN: u16 = 0x4;

/// One named frame of a throwing stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExceptionFrame {
    /// The C#-style method name, `Type.Method(args)`, or `[unknown]`.
    pub method_name: String,
    /// The module's file name, empty when unknown.
    pub module_name: String,
}

/// One thrown exception.
#[derive(Debug, Clone, PartialEq)]
pub struct ExceptionRecord {
    /// Unique within its process, increasing.
    pub id: u64,
    pub unix_nanos: i64,
    pub thread_id: u64,
    pub type_name: String,
    pub message: String,
    pub hresult: u32,
    pub flags: u16,
    /// The exception thrown just before on the same thread, when this one says it has an inner
    /// exception: how wrapping code (`catch (E e) { throw new F(.., e); }`) runs. An inference:
    /// the runtime's event does not name the inner exception.
    pub inner_id: Option<u64>,
    /// The throwing stack, innermost first.
    pub frames: Vec<ExceptionFrame>,
    /// The span it was thrown in, when trace linkage is on.
    pub span: Option<Span>,
}

/// How `/exceptions` writes records, by `Accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExceptionFormat {
    NdJson,
    JsonSeq,
    Text,
}

impl ExceptionFormat {
    pub fn content_type(self) -> &'static str {
        match self {
            ExceptionFormat::NdJson => "application/x-ndjson",
            ExceptionFormat::JsonSeq => "application/json-seq",
            ExceptionFormat::Text => "text/plain",
        }
    }

    /// As [`super::logs::LogFormat::from_accept`].
    pub fn from_accept(accept: Option<&str>) -> Option<ExceptionFormat> {
        use super::logs::LogFormat;
        LogFormat::from_accept(accept).map(|f| match f {
            LogFormat::NdJson => ExceptionFormat::NdJson,
            LogFormat::JsonSeq => ExceptionFormat::JsonSeq,
            LogFormat::Text => ExceptionFormat::Text,
        })
    }

    /// One record, terminated.
    pub fn write(self, record: &ExceptionRecord, out: &mut String) {
        match self {
            ExceptionFormat::NdJson => {
                out.push_str(&exception_json(record).to_string());
                out.push('\n');
            }
            ExceptionFormat::JsonSeq => {
                out.push('\u{1e}');
                out.push_str(&exception_json(record).to_string());
                out.push('\n');
            }
            ExceptionFormat::Text => write_text(record, out),
        }
    }
}

/// .NET's round-trip ("o") form in UTC: seven fractional digits.
fn iso8601(unix_nanos: i64) -> String {
    let seconds = chrono::DateTime::from_timestamp_nanos(unix_nanos).format("%Y-%m-%dT%H:%M:%S");
    format!(
        "{seconds}.{:07}Z",
        unix_nanos.rem_euclid(1_000_000_000) / 100
    )
}

/// `Namespace.Type` and `Method` of a display name `Namespace.Type.Method(args)`.
fn split_method(display: &str) -> (&str, &str) {
    let head = display.split('(').next().unwrap_or(display);
    match head.rfind('.') {
        Some(dot) => (&display[..dot], &display[dot + 1..]),
        None => ("", display),
    }
}

/// dotnet-monitor's `ExceptionInstance` fields (`id`, `timestamp`, `typeName`, `moduleName`,
/// `message`, `activity`, `innerExceptions`, `stack`), plus `hresult`, `flags`, `traceId` and `spanId`.
pub fn exception_json(record: &ExceptionRecord) -> serde_json::Value {
    let frames: Vec<serde_json::Value> = record
        .frames
        .iter()
        .map(|f| {
            let (type_name, method) = split_method(&f.method_name);
            serde_json::json!({
                "methodName": method,
                "typeName": type_name,
                "moduleName": f.module_name,
                "fullName": f.method_name,
            })
        })
        .collect();
    let mut value = serde_json::json!({
        "id": record.id,
        "timestamp": iso8601(record.unix_nanos),
        "typeName": record.type_name,
        "moduleName": record.frames.first().map(|f| f.module_name.as_str()).unwrap_or(""),
        "message": record.message,
        "innerExceptions": record.inner_id.map(|id| vec![serde_json::json!({"id": id})]).unwrap_or_default(),
        "stack": {"threadId": record.thread_id, "frames": frames},
        "hresult": format!("0x{:08X}", record.hresult),
        "flags": record.flags,
    });
    if let Some(span) = &record.span {
        value["activity"] = serde_json::json!({
            "id": format!("00-{}-{}-01", span.trace_id, span.span_id),
            "idFormat": "W3C",
        });
        value["traceId"] = span.trace_id.to_string().into();
        value["spanId"] = span.span_id.to_string().into();
    }
    value
}

/// dotnet-monitor's text layout: `First chance exception at <time>`, `Type: message`, `   at ...`.
fn write_text(record: &ExceptionRecord, out: &mut String) {
    let _ = writeln!(
        out,
        "First chance exception at {}",
        iso8601(record.unix_nanos)
    );
    let _ = writeln!(out, "{}: {}", record.type_name, record.message);
    for frame in &record.frames {
        let _ = writeln!(out, "   at {}", frame.method_name);
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_text_name_the_stack() {
        let record = ExceptionRecord {
            id: 7,
            unix_nanos: 1_700_000_000_123_456_700,
            thread_id: 42,
            type_name: "System.TimeoutException".into(),
            message: "connect timed out #1".into(),
            hresult: 0x80131505,
            flags: FLAG_NESTED,
            inner_id: Some(6),
            frames: vec![ExceptionFrame {
                method_name: "Logs.Payments.Gateway.Connect(long)".into(),
                module_name: "Logs.dll".into(),
            }],
            span: None,
        };
        let v = exception_json(&record);
        assert_eq!(v["stack"]["frames"][0]["methodName"], "Connect(long)");
        assert_eq!(v["stack"]["frames"][0]["typeName"], "Logs.Payments.Gateway");
        assert_eq!(v["innerExceptions"][0]["id"], 6);
        assert_eq!(v["timestamp"], "2023-11-14T22:13:20.1234567Z");
        let mut text = String::new();
        ExceptionFormat::Text.write(&record, &mut text);
        assert!(text.contains("System.TimeoutException: connect timed out #1\n   at Logs.Payments.Gateway.Connect(long)\n"));
    }
}
