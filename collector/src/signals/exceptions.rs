//! First-chance exceptions out of process, from the runtime's own `ExceptionThrown_V1` events and
//! their stacks (dotnet-monitor needs an in-process startup hook for this), in dotnet-monitor's
//! `/exceptions` formats.

use std::fmt::Write as _;

use serde::Deserialize;

use profile::exception::ExceptionRecord;
use profile::utc;

/// dotnet-monitor's `ExceptionFilter`: an exception matches when every field given equals its
/// value (ordinal): the throwing (top) frame's method name without parameters, its type and its
/// module, and the exception's type.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExceptionFilter {
    #[serde(default, alias = "MethodName", rename = "methodName")]
    pub method_name: Option<String>,
    #[serde(default, alias = "TypeName", rename = "typeName")]
    pub type_name: Option<String>,
    #[serde(default, alias = "ModuleName", rename = "moduleName")]
    pub module_name: Option<String>,
    #[serde(default, alias = "ExceptionType", rename = "exceptionType")]
    pub exception_type: Option<String>,
}

impl ExceptionFilter {
    /// As dotnet-monitor's `ShouldInclude`: the frame's fields are checked only when the stack
    /// has a frame.
    fn includes(&self, record: &ExceptionRecord) -> bool {
        let same = |want: &Option<String>, have: &str| {
            want.as_deref()
                .filter(|w| !w.is_empty())
                .is_none_or(|w| w == have)
        };
        let frame_matches = record.frames.first().is_none_or(|top| {
            let (type_name, method) = split_method(&top.method_name);
            same(&self.method_name, method_name_only(method))
                && same(&self.type_name, type_name)
                && same(&self.module_name, &top.module_name)
        });
        frame_matches && same(&self.exception_type, &record.type_name)
    }

    /// As dotnet-monitor's `ShouldExclude`: a filter with no field set excludes nothing, and
    /// without a frame only the exception type counts.
    fn excludes(&self, record: &ExceptionRecord) -> bool {
        let mut verdict: Option<bool> = None;
        let mut check = |want: &Option<String>, have: &str| {
            if let Some(w) = want.as_deref().filter(|w| !w.is_empty()) {
                if verdict != Some(false) {
                    verdict = Some(w == have);
                }
            }
        };
        if let Some(top) = record.frames.first() {
            let (type_name, method) = split_method(&top.method_name);
            check(&self.method_name, method_name_only(method));
            check(&self.module_name, &top.module_name);
            check(&self.type_name, type_name);
        }
        check(&self.exception_type, &record.type_name);
        verdict.unwrap_or(false)
    }
}

/// dotnet-monitor's `ExceptionsConfiguration` (`POST /exceptions`' body, `CollectExceptions`'
/// `Filters`): an exception is left out when it matches any `exclude` filter, or when `include`
/// has filters and it matches none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExceptionsFilters {
    #[serde(default, alias = "Include")]
    pub include: Vec<ExceptionFilter>,
    #[serde(default, alias = "Exclude")]
    pub exclude: Vec<ExceptionFilter>,
}

impl ExceptionsFilters {
    pub fn selects(&self, record: &ExceptionRecord) -> bool {
        if self.exclude.iter().any(|f| f.excludes(record)) {
            return false;
        }
        self.include.is_empty() || self.include.iter().any(|f| f.includes(record))
    }
}

/// `Method` of `Method(args)`.
fn method_name_only(method: &str) -> &str {
    method.split('(').next().unwrap_or(method)
}

/// The parameter types of `Method(int, Dictionary<string, int>)`: commas inside `<>` or `[]`
/// do not separate.
fn parameter_types(method: &str) -> Vec<&str> {
    let Some(open) = method.find('(') else {
        return Vec::new();
    };
    let inner = &method[open + 1..];
    let inner = inner.strip_suffix(')').unwrap_or(inner);
    let mut types = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '<' | '[' | '(' => depth += 1,
            '>' | ']' | ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                types.push(inner[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    let last = inner[start..].trim();
    if !last.is_empty() {
        types.push(last);
    }
    types
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

    /// As [`super::logs::LogFormat::from_accept`], but plain text without an `Accept`, as
    /// dotnet-monitor's `/exceptions`.
    pub fn from_accept(accept: Option<&str>) -> Option<ExceptionFormat> {
        use super::logs::LogFormat;
        if accept.is_none_or(|a| a.trim().is_empty()) {
            return Some(ExceptionFormat::Text);
        }
        LogFormat::from_accept(accept).map(|f| match f {
            LogFormat::NdJson => ExceptionFormat::NdJson,
            LogFormat::JsonSeq => ExceptionFormat::JsonSeq,
            LogFormat::Text => ExceptionFormat::Text,
        })
    }

    /// One record, terminated (in text, without its inner exception: see [`write_text_with`]).
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
            ExceptionFormat::Text => write_text_with(record, &Default::default(), out),
        }
    }
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
/// `message`, `activity`, `innerExceptions`, `stack` (its `JsonPropertyName`; the C# property is
/// `CallStack`) with `threadId`, `threadName` (null: not known out of process) and frames of
/// `methodName`, `parameterTypes`, `typeName` and `moduleName`), plus each frame's `fullName`,
/// `hresult`, `flags`, `traceId` and `spanId`.
pub fn exception_json(record: &ExceptionRecord) -> serde_json::Value {
    let frames: Vec<serde_json::Value> = record
        .frames
        .iter()
        .map(|f| {
            let (type_name, method) = split_method(&f.method_name);
            serde_json::json!({
                "methodName": method_name_only(method),
                "parameterTypes": parameter_types(method),
                "typeName": type_name,
                "moduleName": &*f.module_name,
                "fullName": &*f.method_name,
            })
        })
        .collect();
    let mut value = serde_json::json!({
        "id": record.id,
        "timestamp": utc::format(record.unix_nanos, utc::Form::DotNet),
        "typeName": record.type_name,
        "moduleName": record.frames.first().map(|f| &*f.module_name).unwrap_or(""),
        "message": record.message,
        "innerExceptions": record.inner_id.map(|id| vec![serde_json::json!({"id": id})]).unwrap_or_default(),
        "stack": {"threadId": record.thread_id, "threadName": null, "frames": frames},
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

/// dotnet-monitor's text layout (`ExceptionsOperation.WriteTextInstance`, after .NET's own):
/// `First chance exception at <time>`, `Type: message`, its inner exception nested as ` ---> Type:
/// message` with its frames and `   --- End of inner exception stack trace ---` (or, when the inner
/// one is not among those written before, `   --- The inner exception was not included in the
/// filter ---`), then `   at ...`, then `Activity ID: <W3C id>` when it was thrown in a span.
/// `prior`: the records written before it (filtered), by id.
pub fn write_text_with(
    record: &ExceptionRecord,
    prior: &std::collections::HashMap<u64, &ExceptionRecord>,
    out: &mut String,
) {
    let _ = writeln!(
        out,
        "First chance exception at {}",
        utc::format(record.unix_nanos, utc::Form::DotNet)
    );
    write_type_and_message(record, out);
    write_inner_and_frames(record, prior, out, 0);
    if let Some(span) = &record.span {
        let _ = write!(
            out,
            "\nActivity ID: 00-{}-{}-01",
            span.trace_id, span.span_id
        );
    }
    out.push_str("\n\n");
}

fn write_type_and_message(record: &ExceptionRecord, out: &mut String) {
    out.push_str(&record.type_name);
    if !record.message.is_empty() {
        let _ = write!(out, ": {}", record.message);
    }
}

/// Nesting deeper than this is cut (each level is an exception written before).
const MAX_INNER_DEPTH: usize = 16;

fn write_inner_and_frames(
    record: &ExceptionRecord,
    prior: &std::collections::HashMap<u64, &ExceptionRecord>,
    out: &mut String,
    depth: usize,
) {
    if let Some(inner) = record.inner_id {
        match prior.get(&inner).filter(|_| depth < MAX_INNER_DEPTH) {
            Some(inner) => {
                out.push_str("\n ---> ");
                write_type_and_message(inner, out);
                write_inner_and_frames(inner, prior, out, depth + 1);
                out.push_str("\n   --- End of inner exception stack trace ---");
            }
            None => out.push_str("\n   --- The inner exception was not included in the filter ---"),
        }
    }
    for frame in &record.frames {
        let _ = write!(out, "\n   at {}", frame.method_name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profile::exception::{ExceptionFrame, FLAG_HAS_INNER, FLAG_NESTED};
    use std::sync::Arc;

    #[test]
    fn filters_follow_dotnet_monitors_include_and_exclude() {
        let record = |type_name: &str, method: &str| ExceptionRecord {
            id: 1,
            unix_nanos: 0,
            thread_id: 1,
            type_name: type_name.into(),
            message: String::new(),
            hresult: 0,
            flags: 0,
            inner_id: None,
            frames: vec![ExceptionFrame {
                method_name: method.into(),
                module_name: "Logs.dll".into(),
            }],
            span: None,
        };
        let timeout = record(
            "System.TimeoutException",
            "Logs.Payments.Gateway.Connect(long)",
        );
        let declined = record("Logs.Declined", "Logs.Payments.Gateway.Charge(long)");
        let filters: ExceptionsFilters = serde_json::from_value(serde_json::json!({
            "include": [{"methodName": "Connect", "typeName": "Logs.Payments.Gateway"}],
        }))
        .unwrap();
        assert!(filters.selects(&timeout) && !filters.selects(&declined));
        // Every field given must match: the module differs.
        let filters: ExceptionsFilters = serde_json::from_value(serde_json::json!({
            "Include": [{"MethodName": "Connect", "ModuleName": "Other.dll"}],
        }))
        .unwrap();
        assert!(!filters.selects(&timeout));
        // Exclude wins over include; an empty exclude filter excludes nothing.
        let filters: ExceptionsFilters = serde_json::from_value(serde_json::json!({
            "include": [{"moduleName": "Logs.dll"}],
            "exclude": [{"exceptionType": "System.TimeoutException"}, {}],
        }))
        .unwrap();
        assert!(!filters.selects(&timeout) && filters.selects(&declined));
        assert!(ExceptionsFilters::default().selects(&timeout));
        assert!(serde_json::from_value::<ExceptionsFilters>(
            serde_json::json!({"include": [{"method": "x"}]})
        )
        .is_err());
    }

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
        assert_eq!(v["stack"]["frames"][0]["methodName"], "Connect");
        assert_eq!(
            v["stack"]["frames"][0]["parameterTypes"],
            serde_json::json!(["long"])
        );
        assert_eq!(
            parameter_types("Put(Dictionary<string, int>, int[,], )"),
            ["Dictionary<string, int>", "int[,]"]
        );
        assert!(parameter_types("Run()").is_empty());
        assert_eq!(v["stack"]["frames"][0]["typeName"], "Logs.Payments.Gateway");
        assert_eq!(v["innerExceptions"][0]["id"], 6);
        assert_eq!(v["timestamp"], "2023-11-14T22:13:20.1234567Z");
        let mut text = String::new();
        ExceptionFormat::Text.write(&record, &mut text);
        assert!(text.contains("System.TimeoutException: connect timed out #1\n   --- The inner exception was not included in the filter ---\n   at Logs.Payments.Gateway.Connect(long)\n"));
    }

    /// As dotnet-monitor and .NET print them: the inner exception nested with ` ---> `.
    #[test]
    fn text_nests_the_inner_exception() {
        let frame = |m: &str| ExceptionFrame {
            method_name: m.into(),
            module_name: "Logs.dll".into(),
        };
        let timeout = Arc::new(ExceptionRecord {
            id: 1,
            unix_nanos: 1_700_000_000_000_000_000,
            thread_id: 42,
            type_name: "System.TimeoutException".into(),
            message: "connect timed out #1".into(),
            hresult: 0,
            flags: 0,
            inner_id: None,
            frames: vec![frame("Logs.Payments.Gateway.Connect(long)")],
            span: None,
        });
        let declined = Arc::new(ExceptionRecord {
            id: 2,
            type_name: "Logs.Payments.PaymentDeclinedException".into(),
            message: "payment declined #1".into(),
            flags: FLAG_HAS_INNER,
            inner_id: Some(1),
            frames: vec![frame("Logs.Payments.Gateway.Charge(long)")],
            ..(*timeout).clone()
        });
        let mut text = String::new();
        let prior = std::collections::HashMap::from([(1, &*timeout)]);
        write_text_with(&timeout, &Default::default(), &mut text);
        write_text_with(&declined, &prior, &mut text);
        assert_eq!(
            text,
            "First chance exception at 2023-11-14T22:13:20.0000000Z\n\
             System.TimeoutException: connect timed out #1\n   at Logs.Payments.Gateway.Connect(long)\n\n\
             First chance exception at 2023-11-14T22:13:20.0000000Z\n\
             Logs.Payments.PaymentDeclinedException: payment declined #1\n \
             ---> System.TimeoutException: connect timed out #1\n   at Logs.Payments.Gateway.Connect(long)\n   \
             --- End of inner exception stack trace ---\n   at Logs.Payments.Gateway.Charge(long)\n\n"
        );
    }
}
