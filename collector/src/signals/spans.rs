//! Finished spans out of process: the `ActivityStop` events of DiagnosticSourceEventSource, with the
//! fields [`crate::providers::linkage`] asks for when spans are exported, read into
//! [`SpanRecord`]s.
//!
//! Every value arrives as the app's `ToString()` of it: ids as hex, `Kind` and `Status` as enum
//! names, times as .NET ticks, tags as `KeyValuePair.ToString()` joined by `,`
//! (`[key, value],[key2, value2]`, no escaping), so tag values are text whatever their type in
//! the app, and a value holding `], [` cannot be told from two tags. .NET 8 gives no way to read
//! a span's events or links (their items have no `ToString()` of their own).

use nettrace::dotnet_ticks_to_unix_nanos;
use nettrace::events::DiagnosticSourceEvent;
use profile::span::{
    Span, SpanId, SpanKind, SpanRecord, SpanStatus, TraceId, MAX_SPAN_TAGS, MAX_SPAN_TEXT,
};

/// Why an `ActivityStop` could not be read as a span.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpanError {
    #[error(
        "span stop {source_name}/{operation} lacks {field} (the session's FilterAndPayloadSpecs \
         did not ask for it: another session may have replaced the agent's specs)"
    )]
    Missing {
        source_name: String,
        operation: String,
        field: &'static str,
    },
    #[error("span stop {source_name}/{operation}: {field} {value:?} is not valid")]
    Invalid {
        source_name: String,
        operation: String,
        field: &'static str,
        value: String,
    },
}

/// The span an `ActivityStop` carries; `Ok(None)` when the span was not recorded (only
/// propagated: the app's own tracing did not sample it) or the event is no ActivitySource
/// stop.
pub fn from_stop(event: &DiagnosticSourceEvent) -> Result<Option<SpanRecord>, SpanError> {
    use nettrace::events::DiagnosticSourceKind;
    if event.kind != DiagnosticSourceKind::ActivityStop {
        return Ok(None);
    }
    let missing = |field: &'static str| SpanError::Missing {
        source_name: event.source_name.clone(),
        operation: event.event_name.clone(),
        field,
    };
    let invalid = |field: &'static str, value: &str| SpanError::Invalid {
        source_name: event.source_name.clone(),
        operation: event.event_name.clone(),
        field,
        value: value.chars().take(64).collect(),
    };
    let get = |field: &'static str| event.argument(field).ok_or_else(|| missing(field));
    if !event.recorded().ok_or_else(|| missing("Recorded"))? {
        return Ok(None);
    }
    let text = get("TraceId")?;
    let trace_id = TraceId::from_hex(text).ok_or_else(|| invalid("TraceId", text))?;
    let text = get("SpanId")?;
    let span_id = SpanId::from_hex(text).ok_or_else(|| invalid("SpanId", text))?;
    // All zeros (a root span) reads as none.
    let parent_span_id = event.argument("ParentSpanId").and_then(SpanId::from_hex);
    let text = get("Kind")?;
    let kind = SpanKind::parse(text).ok_or_else(|| invalid("Kind", text))?;
    let text = get("Status")?;
    let status = SpanStatus::parse(text).ok_or_else(|| invalid("Status", text))?;
    let ticks = |field: &'static str| -> Result<i64, SpanError> {
        let text = get(field)?;
        text.parse::<i64>()
            .ok()
            .filter(|t| *t >= 0)
            .ok_or_else(|| invalid(field, text))
    };
    let start_unix_nanos = dotnet_ticks_to_unix_nanos(ticks("StartTimeTicks")?);
    let duration_nanos = ticks("DurationTicks")?.saturating_mul(100);
    let own = |field: &str| event.argument(field).unwrap_or_default().to_string();
    let mut budget = MAX_SPAN_TEXT
        .saturating_sub(event.event_name.len() + event.source_name.len())
        .saturating_sub(own("DisplayName").len() + own("StatusDescription").len());
    let (tags, dropped_tags) = parse_tags(event.argument("Tags").unwrap_or(""), &mut budget);
    Ok(Some(SpanRecord {
        span: Span {
            trace_id,
            span_id,
            name: event.event_name.as_str().into(),
        },
        parent_span_id,
        display_name: own("DisplayName"),
        kind,
        start_unix_nanos,
        duration_nanos,
        status,
        status_description: own("StatusDescription"),
        trace_state: own("TraceStateString"),
        source_name: event.source_name.as_str().into(),
        source_version: own("ActivitySourceVersion"),
        tags,
        dropped_tags,
    }))
}

/// `[k, v],[k2, v2]` (`KeyValuePair<string, object>.ToString()` joined by `,`) into pairs, while
/// they fit [`MAX_SPAN_TAGS`] and `budget` bytes; returns them and how many were left out. An
/// item that is not `[key, value]` counts as dropped.
fn parse_tags(text: &str, budget: &mut usize) -> (Vec<(String, String)>, u32) {
    let mut tags = Vec::new();
    let mut dropped = 0u32;
    if text.is_empty() {
        return (tags, dropped);
    }
    // Items are split at `],[`: the only separator `*Enumerate` writes between two pairs.
    let inner = text.strip_prefix('[').unwrap_or(text);
    let inner = inner.strip_suffix(']').unwrap_or(inner);
    for item in inner.split("],[") {
        let Some((key, value)) = item.split_once(", ") else {
            dropped = dropped.saturating_add(1);
            continue;
        };
        let size = key.len() + value.len();
        if tags.len() >= MAX_SPAN_TAGS || size > *budget || key.is_empty() {
            dropped = dropped.saturating_add(1);
            continue;
        }
        *budget -= size;
        tags.push((key.to_string(), value.to_string()));
    }
    (tags, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nettrace::events::DiagnosticSourceKind;

    fn stop(arguments: &[(&str, &str)]) -> DiagnosticSourceEvent {
        DiagnosticSourceEvent {
            kind: DiagnosticSourceKind::ActivityStop,
            source_name: "shop".into(),
            event_name: "shop.checkout".into(),
            arguments: arguments
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    const FULL: [(&str, &str); 12] = [
        ("TraceId", "0af7651916cd43dd8448eb211c80319c"),
        ("SpanId", "b7ad6b7169203331"),
        ("ParentSpanId", "0000000000000000"),
        ("Recorded", "True"),
        ("Kind", "Server"),
        ("DisplayName", "GET /checkout"),
        // 2024-01-02T03:04:05Z and 1.5 ms.
        ("StartTimeTicks", "638397614450000000"),
        ("DurationTicks", "15000"),
        ("Status", "Error"),
        ("StatusDescription", "out of stock"),
        ("Tags", "[http.method, GET],[shop.items, 3],[note, a, b]"),
        ("ActivitySourceVersion", "1.2.3"),
    ];

    #[test]
    fn a_recorded_stop_is_a_whole_span() {
        let span = from_stop(&stop(&FULL)).unwrap().unwrap();
        assert_eq!(span.span.span_id.to_string(), "b7ad6b7169203331");
        assert_eq!(&*span.span.name, "shop.checkout");
        assert_eq!(span.parent_span_id, None);
        assert_eq!(span.kind, SpanKind::Server);
        assert_eq!(span.status, SpanStatus::Error);
        assert_eq!(span.start_unix_nanos, 1_704_164_645_000_000_000);
        assert_eq!(span.duration_nanos, 1_500_000);
        assert_eq!(span.end_unix_nanos(), 1_704_164_645_001_500_000);
        assert_eq!(
            span.tags,
            [
                ("http.method".to_string(), "GET".to_string()),
                ("shop.items".into(), "3".into()),
                // A value holding ", " stays whole: only the first one splits.
                ("note".into(), "a, b".into()),
            ]
        );
        assert_eq!(
            (&*span.source_name, span.source_version.as_str()),
            ("shop", "1.2.3")
        );
    }

    #[test]
    fn unrecorded_and_incomplete_stops() {
        let mut unrecorded = FULL;
        unrecorded[3].1 = "False";
        assert_eq!(from_stop(&stop(&unrecorded)), Ok(None));
        // Sampled flag inherited from a recorded parent, but no listener in the app asked for
        // the data: the activity exists only because the agent's session voted Propagate.
        let mut leaf = FULL.to_vec();
        leaf.push(("IsAllDataRequested", "False"));
        assert_eq!(from_stop(&stop(&leaf)), Ok(None));
        leaf.last_mut().unwrap().1 = "True";
        assert!(from_stop(&stop(&leaf)).unwrap().is_some());
        // dotnet-monitor's specs, when its session replaced clrscope's, ask for the flags.
        let mut flags = FULL;
        flags[3] = ("ActivityTraceFlags", "Recorded");
        assert!(from_stop(&stop(&flags)).unwrap().is_some());
        flags[3].1 = "None";
        assert_eq!(from_stop(&stop(&flags)), Ok(None));
        // Linkage's own stops carry only the ids: another session's specs are in force.
        let short = stop(&FULL[..4]);
        assert!(matches!(
            from_stop(&short),
            Err(SpanError::Missing { field: "Kind", .. })
        ));
        let mut bad = FULL;
        bad[7].1 = "-5";
        assert!(matches!(
            from_stop(&stop(&bad)),
            Err(SpanError::Invalid {
                field: "DurationTicks",
                ..
            })
        ));
    }

    #[test]
    fn tags_are_bounded() {
        let many: Vec<String> = (0..200).map(|i| format!("[k{i}, v]")).collect();
        let mut budget = MAX_SPAN_TEXT;
        let (tags, dropped) = parse_tags(&many.join(","), &mut budget);
        assert_eq!((tags.len(), dropped), (MAX_SPAN_TAGS, 72));
        let mut small = 5;
        let (tags, dropped) = parse_tags("[ab, cd],[ef, gh],[junk]", &mut small);
        assert_eq!((tags.len(), dropped), (1, 2));
        assert_eq!(parse_tags("", &mut small), (Vec::new(), 0));
    }
}
