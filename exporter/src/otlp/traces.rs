//! OTLP traces (`opentelemetry.proto.trace.v1`): the finished spans of attached processes, one
//! `ResourceSpans` per process (the resource of its profiles and logs), one `ScopeSpans` per
//! ActivitySource and version (the instrumentation scope, as OpenTelemetry .NET reports it).
//!
//! A span's name is its `DisplayName` (OpenTelemetry .NET's choice; it is the operation name unless
//! the app set another), its attributes its tags, each value the text the app's `ToString()` gave
//! (DiagnosticSourceEventSource sends no types). Status, kind and times map one to one; events and
//! links are never present (.NET 8 cannot send them out of process).

use std::sync::Arc;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::trace::v1::{
    span, status, ResourceSpans, ScopeSpans, Span as OtlpSpan, Status,
};
use profile::span::{SpanKind, SpanRecord, SpanStatus};

use super::{any_string, attribute, resource};

/// One finished span of a process, for an exporter that sends traces.
#[derive(Debug, Clone)]
pub struct SpanExport {
    /// The process's series labels (`service_name`, `process_id`, `host_name`): the resource.
    pub series: Arc<[(String, String)]>,
    pub span: Arc<SpanRecord>,
}

/// W3C trace flags of every exported span: sampled (only recorded spans are exported).
const SAMPLED: u32 = 0x1;

fn span_kind(kind: SpanKind) -> span::SpanKind {
    match kind {
        SpanKind::Internal => span::SpanKind::Internal,
        SpanKind::Server => span::SpanKind::Server,
        SpanKind::Client => span::SpanKind::Client,
        SpanKind::Producer => span::SpanKind::Producer,
        SpanKind::Consumer => span::SpanKind::Consumer,
    }
}

fn otlp_span(record: &SpanRecord) -> OtlpSpan {
    let (code, message) = match record.status {
        SpanStatus::Unset => (status::StatusCode::Unset, ""),
        SpanStatus::Ok => (status::StatusCode::Ok, ""),
        // The proto keeps the description for errors only.
        SpanStatus::Error => (
            status::StatusCode::Error,
            record.status_description.as_str(),
        ),
    };
    let name = if record.display_name.is_empty() {
        record.span.name.to_string()
    } else {
        record.display_name.clone()
    };
    OtlpSpan {
        trace_id: record.span.trace_id.0.to_vec(),
        span_id: record.span.span_id.0.to_vec(),
        trace_state: record.trace_state.clone(),
        parent_span_id: record
            .parent_span_id
            .map(|id| id.0.to_vec())
            .unwrap_or_default(),
        flags: SAMPLED,
        name,
        kind: span_kind(record.kind) as i32,
        start_time_unix_nano: u64::try_from(record.start_unix_nanos).unwrap_or(0),
        end_time_unix_nano: u64::try_from(record.end_unix_nanos()).unwrap_or(0),
        attributes: record
            .tags
            .iter()
            .map(|(key, value)| attribute(key, any_string(value)))
            .collect(),
        dropped_attributes_count: record.dropped_tags,
        status: Some(Status {
            message: message.to_string(),
            code: code as i32,
        }),
        ..OtlpSpan::default()
    }
}

/// One request for `spans`: a resource per process, a scope per ActivitySource and version, spans
/// in their order.
pub fn traces_request(spans: &[SpanExport]) -> ExportTraceServiceRequest {
    // (resource, [((source, version), spans)]) in first-seen order: few of each per request.
    type Scopes = Vec<((Arc<str>, String), Vec<OtlpSpan>)>;
    type Resources = Vec<(Arc<[(String, String)]>, Scopes)>;
    let mut resources: Resources = Vec::new();
    for export in spans {
        let at = match resources.iter().position(|(s, _)| s == &export.series) {
            Some(at) => at,
            None => {
                resources.push((export.series.clone(), Vec::new()));
                resources.len() - 1
            }
        };
        let record = &export.span;
        let scopes = &mut resources[at].1;
        let scope = scopes
            .iter()
            .position(|((name, version), _)| {
                *name == record.source_name && *version == record.source_version
            })
            .unwrap_or_else(|| {
                let key = (record.source_name.clone(), record.source_version.clone());
                scopes.push((key, Vec::new()));
                scopes.len() - 1
            });
        scopes[scope].1.push(otlp_span(record));
    }
    ExportTraceServiceRequest {
        resource_spans: resources
            .into_iter()
            .map(|(series, scopes)| ResourceSpans {
                resource: Some(resource(&series)),
                scope_spans: scopes
                    .into_iter()
                    .map(|((name, version), spans)| ScopeSpans {
                        scope: Some(InstrumentationScope {
                            name: name.to_string(),
                            version,
                            ..InstrumentationScope::default()
                        }),
                        spans,
                        ..ScopeSpans::default()
                    })
                    .collect(),
                ..ResourceSpans::default()
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profile::span::{Span, SpanId, TraceId};
    use prost::Message;

    fn record(span: &str, source: &str, status: SpanStatus) -> SpanRecord {
        SpanRecord {
            span: Span {
                trace_id: TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap(),
                span_id: SpanId::from_hex(span).unwrap(),
                name: "op".into(),
            },
            parent_span_id: SpanId::from_hex("00f067aa0ba902b7"),
            display_name: String::new(),
            kind: SpanKind::Client,
            start_unix_nanos: 1_000,
            duration_nanos: 500,
            status,
            status_description: "boom".into(),
            trace_state: String::new(),
            source_name: source.into(),
            source_version: "1.0".into(),
            tags: vec![("http.method".into(), "GET".into())],
            dropped_tags: 2,
        }
    }

    #[test]
    fn spans_group_by_process_and_source() {
        let shop: Arc<[(String, String)]> = vec![("service_name".into(), "shop".into())].into();
        let other: Arc<[(String, String)]> = vec![("service_name".into(), "other".into())].into();
        let export = |series: &Arc<[(String, String)]>, r: SpanRecord| SpanExport {
            series: series.clone(),
            span: Arc::new(r),
        };
        let request = traces_request(&[
            export(&shop, record("b7ad6b7169203331", "a", SpanStatus::Error)),
            export(&other, record("b7ad6b7169203332", "a", SpanStatus::Ok)),
            export(&shop, record("b7ad6b7169203333", "b", SpanStatus::Unset)),
            export(&shop, record("b7ad6b7169203334", "a", SpanStatus::Unset)),
        ]);
        let request =
            ExportTraceServiceRequest::decode(request.encode_to_vec().as_slice()).unwrap();
        assert_eq!(request.resource_spans.len(), 2);
        let shop = &request.resource_spans[0];
        let key = &shop.resource.as_ref().unwrap().attributes[0];
        assert_eq!(key.key, "service.name");
        let scopes: Vec<(&str, usize)> = shop
            .scope_spans
            .iter()
            .map(|s| (s.scope.as_ref().unwrap().name.as_str(), s.spans.len()))
            .collect();
        assert_eq!(scopes, [("a", 2), ("b", 1)]);
        let span = &shop.scope_spans[0].spans[0];
        assert_eq!(span.name, "op");
        assert_eq!(span.kind, span::SpanKind::Client as i32);
        assert_eq!(
            (span.start_time_unix_nano, span.end_time_unix_nano),
            (1_000, 1_500)
        );
        assert_eq!(
            span.parent_span_id,
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        let status = span.status.as_ref().unwrap();
        assert_eq!((status.code, status.message.as_str()), (2, "boom"));
        assert_eq!(span.dropped_attributes_count, 2);
        assert_eq!(span.attributes[0].key, "http.method");
        // The description is an error's only.
        let unset = &shop.scope_spans[0].spans[1].status.as_ref().unwrap();
        assert_eq!((unset.code, unset.message.as_str()), (0, ""));
    }
}
