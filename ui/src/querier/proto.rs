//! The messages of Pyroscope's `querier.v1` and `types.v1` packages that the querier routes
//! read and write, typed by hand (no build script, no protoc) with the field numbers of
//! grafana/pyroscope's `api/querier/v1/querier.proto` and `api/types/v1/types.proto`. Fields
//! clrscope does not read are left out of requests (protobuf skips them, JSON ignores them).
//!
//! Each message also has its proto3 JSON mapping, which Connect uses for `application/json`:
//! lowerCamelCase names (the proto names are accepted too), 64-bit integers as decimal strings
//! (numbers accepted), enums by name (numbers accepted), default values written out.
//! `google.v1.Profile`, the answer of `SelectMergeProfile`, is the exporter's pprof message
//! ([`exporter::pprof::proto::Profile`]: the same fields and numbers); its JSON is [`pprof_json`].

use exporter::pprof::proto as pprof;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// types.v1

#[derive(Clone, PartialEq, Eq, prost::Message, Serialize)]
pub struct LabelPair {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, Eq, prost::Message, Serialize)]
pub struct ProfileType {
    #[prost(string, tag = "1")]
    #[serde(rename = "ID")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "4")]
    #[serde(rename = "sampleType")]
    pub sample_type: String,
    #[prost(string, tag = "5")]
    #[serde(rename = "sampleUnit")]
    pub sample_unit: String,
    #[prost(string, tag = "6")]
    #[serde(rename = "periodType")]
    pub period_type: String,
    #[prost(string, tag = "7")]
    #[serde(rename = "periodUnit")]
    pub period_unit: String,
}

#[derive(Clone, PartialEq, Eq, prost::Message, Serialize)]
pub struct Labels {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<LabelPair>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub struct Series {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<LabelPair>,
    #[prost(message, repeated, tag = "2")]
    pub points: Vec<Point>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub struct Point {
    #[prost(double, tag = "1")]
    pub value: f64,
    /// Unix milliseconds.
    #[prost(int64, tag = "2")]
    #[serde(serialize_with = "int64::write")]
    pub timestamp: i64,
}

#[derive(Clone, PartialEq, Eq, prost::Message, Deserialize)]
#[serde(default)]
pub struct LabelValuesRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, repeated, tag = "2")]
    pub matchers: Vec<String>,
    #[prost(int64, tag = "3")]
    #[serde(deserialize_with = "int64::read")]
    pub start: i64,
    #[prost(int64, tag = "4")]
    #[serde(deserialize_with = "int64::read")]
    pub end: i64,
}

#[derive(Clone, PartialEq, Eq, prost::Message, Deserialize)]
#[serde(default)]
pub struct LabelNamesRequest {
    #[prost(string, repeated, tag = "1")]
    pub matchers: Vec<String>,
    #[prost(int64, tag = "2")]
    #[serde(deserialize_with = "int64::read")]
    pub start: i64,
    #[prost(int64, tag = "3")]
    #[serde(deserialize_with = "int64::read")]
    pub end: i64,
}

/// The answer of both `LabelNames` and `LabelValues`.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize)]
pub struct Names {
    #[prost(string, repeated, tag = "1")]
    pub names: Vec<String>,
}

/// Only its presence is read: clrscope cannot focus on a call site yet.
#[derive(Clone, PartialEq, Eq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StackTraceSelector {
    #[prost(message, repeated, tag = "1")]
    #[serde(alias = "call_site")]
    pub call_site: Vec<Location>,
}

#[derive(Clone, PartialEq, Eq, prost::Message, Deserialize)]
#[serde(default)]
pub struct Location {
    #[prost(string, tag = "1")]
    pub name: String,
}

// ---------------------------------------------------------------------------------------------
// querier.v1

#[derive(Clone, PartialEq, Eq, prost::Message, Deserialize)]
#[serde(default)]
pub struct ProfileTypesRequest {
    #[prost(int64, tag = "1")]
    #[serde(deserialize_with = "int64::read")]
    pub start: i64,
    #[prost(int64, tag = "2")]
    #[serde(deserialize_with = "int64::read")]
    pub end: i64,
}

#[derive(Clone, PartialEq, Eq, prost::Message, Serialize)]
pub struct ProfileTypesResponse {
    #[prost(message, repeated, tag = "1")]
    #[serde(rename = "profileTypes")]
    pub profile_types: Vec<ProfileType>,
}

#[derive(Clone, PartialEq, Eq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SeriesRequest {
    #[prost(string, repeated, tag = "1")]
    pub matchers: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    #[serde(alias = "label_names")]
    pub label_names: Vec<String>,
    #[prost(int64, tag = "3")]
    #[serde(deserialize_with = "int64::read")]
    pub start: i64,
    #[prost(int64, tag = "4")]
    #[serde(deserialize_with = "int64::read")]
    pub end: i64,
}

#[derive(Clone, PartialEq, Eq, prost::Message, Serialize)]
pub struct SeriesResponse {
    #[prost(message, repeated, tag = "2")]
    #[serde(rename = "labelsSet")]
    pub labels_set: Vec<Labels>,
}

/// `ProfileFormat`: what `SelectMergeStacktraces` answers with.
pub const PROFILE_FORMATS: &[&str] = &[
    "PROFILE_FORMAT_UNSPECIFIED",
    "PROFILE_FORMAT_FLAMEGRAPH",
    "PROFILE_FORMAT_TREE",
    "PROFILE_FORMAT_DOT",
    "PROFILE_FORMAT_PPROF",
];
pub const PROFILE_FORMAT_FLAMEGRAPH: i32 = 1;

#[derive(Clone, PartialEq, Eq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SelectMergeStacktracesRequest {
    #[prost(string, tag = "1")]
    #[serde(rename = "profileTypeID", alias = "profile_typeID")]
    pub profile_type_id: String,
    #[prost(string, tag = "2")]
    #[serde(alias = "label_selector")]
    pub label_selector: String,
    #[prost(int64, tag = "3")]
    #[serde(deserialize_with = "int64::read")]
    pub start: i64,
    #[prost(int64, tag = "4")]
    #[serde(deserialize_with = "int64::read")]
    pub end: i64,
    #[prost(int64, optional, tag = "5")]
    #[serde(alias = "max_nodes", deserialize_with = "int64::read_optional")]
    pub max_nodes: Option<i64>,
    #[prost(int32, tag = "6")]
    #[serde(deserialize_with = "profile_format")]
    pub format: i32,
    #[prost(message, optional, tag = "7")]
    #[serde(alias = "stack_trace_selector")]
    pub stack_trace_selector: Option<StackTraceSelector>,
    #[prost(string, repeated, tag = "8")]
    #[serde(alias = "profile_id_selector")]
    pub profile_id_selector: Vec<String>,
    #[prost(string, repeated, tag = "10")]
    #[serde(alias = "trace_id_selector")]
    pub trace_id_selector: Vec<String>,
    #[prost(string, repeated, tag = "11")]
    #[serde(alias = "span_selector")]
    pub span_selector: Vec<String>,
}

/// The answer of `SelectMergeStacktraces` (only its flame graph: clrscope answers no other
/// format) and of `SelectMergeSpanProfile`, whose message has the same first field.
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub struct FlameGraphResponse {
    #[prost(message, optional, tag = "1")]
    pub flamegraph: Option<FlameGraph>,
}

#[derive(Clone, PartialEq, Eq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SelectMergeSpanProfileRequest {
    #[prost(string, tag = "1")]
    #[serde(rename = "profileTypeID", alias = "profile_typeID")]
    pub profile_type_id: String,
    #[prost(string, tag = "2")]
    #[serde(alias = "label_selector")]
    pub label_selector: String,
    #[prost(string, repeated, tag = "3")]
    #[serde(alias = "span_selector")]
    pub span_selector: Vec<String>,
    #[prost(int64, tag = "4")]
    #[serde(deserialize_with = "int64::read")]
    pub start: i64,
    #[prost(int64, tag = "5")]
    #[serde(deserialize_with = "int64::read")]
    pub end: i64,
    #[prost(int64, optional, tag = "6")]
    #[serde(alias = "max_nodes", deserialize_with = "int64::read_optional")]
    pub max_nodes: Option<i64>,
    #[prost(int32, tag = "7")]
    #[serde(deserialize_with = "profile_format")]
    pub format: i32,
}

#[derive(Clone, PartialEq, Eq, prost::Message, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FlameGraph {
    #[prost(string, repeated, tag = "1")]
    pub names: Vec<String>,
    #[prost(message, repeated, tag = "2")]
    pub levels: Vec<Level>,
    #[prost(int64, tag = "3")]
    #[serde(serialize_with = "int64::write")]
    pub total: i64,
    #[prost(int64, tag = "4")]
    #[serde(serialize_with = "int64::write")]
    pub max_self: i64,
}

#[derive(Clone, PartialEq, Eq, prost::Message, Serialize)]
pub struct Level {
    #[prost(int64, repeated, tag = "1")]
    #[serde(serialize_with = "int64::write_all")]
    pub values: Vec<i64>,
}

#[derive(Clone, PartialEq, Eq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SelectMergeProfileRequest {
    #[prost(string, tag = "1")]
    #[serde(rename = "profileTypeID", alias = "profile_typeID")]
    pub profile_type_id: String,
    #[prost(string, tag = "2")]
    #[serde(alias = "label_selector")]
    pub label_selector: String,
    #[prost(int64, tag = "3")]
    #[serde(deserialize_with = "int64::read")]
    pub start: i64,
    #[prost(int64, tag = "4")]
    #[serde(deserialize_with = "int64::read")]
    pub end: i64,
    #[prost(int64, optional, tag = "5")]
    #[serde(alias = "max_nodes", deserialize_with = "int64::read_optional")]
    pub max_nodes: Option<i64>,
    #[prost(message, optional, tag = "6")]
    #[serde(alias = "stack_trace_selector")]
    pub stack_trace_selector: Option<StackTraceSelector>,
    #[prost(string, repeated, tag = "7")]
    #[serde(alias = "profile_id_selector")]
    pub profile_id_selector: Vec<String>,
    #[prost(string, repeated, tag = "8")]
    #[serde(alias = "trace_id_selector")]
    pub trace_id_selector: Vec<String>,
}

/// `types.v1.TimeSeriesAggregationType`.
pub const AGGREGATIONS: &[&str] = &[
    "TIME_SERIES_AGGREGATION_TYPE_SUM",
    "TIME_SERIES_AGGREGATION_TYPE_AVERAGE",
];
/// `types.v1.ExemplarType`.
pub const EXEMPLAR_TYPES: &[&str] = &[
    "EXEMPLAR_TYPE_UNSPECIFIED",
    "EXEMPLAR_TYPE_NONE",
    "EXEMPLAR_TYPE_INDIVIDUAL",
    "EXEMPLAR_TYPE_SPAN",
];

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SelectSeriesRequest {
    #[prost(string, tag = "1")]
    #[serde(rename = "profileTypeID", alias = "profile_typeID")]
    pub profile_type_id: String,
    #[prost(string, tag = "2")]
    #[serde(alias = "label_selector")]
    pub label_selector: String,
    #[prost(int64, tag = "3")]
    #[serde(deserialize_with = "int64::read")]
    pub start: i64,
    #[prost(int64, tag = "4")]
    #[serde(deserialize_with = "int64::read")]
    pub end: i64,
    #[prost(string, repeated, tag = "5")]
    #[serde(alias = "group_by")]
    pub group_by: Vec<String>,
    /// Seconds.
    #[prost(double, tag = "6")]
    pub step: f64,
    #[prost(int32, optional, tag = "7")]
    #[serde(deserialize_with = "aggregation")]
    pub aggregation: Option<i32>,
    #[prost(message, optional, tag = "8")]
    #[serde(alias = "stack_trace_selector")]
    pub stack_trace_selector: Option<StackTraceSelector>,
    #[prost(int64, optional, tag = "9")]
    #[serde(deserialize_with = "int64::read_optional")]
    pub limit: Option<i64>,
    /// Read so that a request naming one is valid; clrscope keeps no exemplars.
    #[prost(int32, tag = "10")]
    #[serde(alias = "exemplar_type", deserialize_with = "exemplar_type")]
    pub exemplar_type: i32,
}

#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub struct SelectSeriesResponse {
    #[prost(message, repeated, tag = "1")]
    pub series: Vec<Series>,
}

// ---------------------------------------------------------------------------------------------
// JSON details

/// proto3 JSON for 64-bit integers: written as strings, read from strings or numbers.
mod int64 {
    use serde::de::{self, Deserializer, Visitor};
    use serde::ser::{SerializeSeq, Serializer};

    pub fn write<S: Serializer>(value: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(value)
    }

    pub fn write_all<S: Serializer>(values: &[i64], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(values.len()))?;
        for value in values {
            seq.serialize_element(&value.to_string())?;
        }
        seq.end()
    }

    struct Int64;

    impl Visitor<'_> for Int64 {
        type Value = i64;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a 64-bit integer, as a number or a decimal string")
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<i64, E> {
            Ok(v)
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<i64, E> {
            i64::try_from(v).map_err(|_| E::custom(format!("{v} is out of the int64 range")))
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<i64, E> {
            // proto3 JSON allows exponent notation for integral values.
            if v.fract() == 0.0 && v.abs() < 9.2e18 {
                Ok(v as i64)
            } else {
                Err(E::custom(format!("{v} is not a 64-bit integer")))
            }
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<i64, E> {
            v.parse()
                .map_err(|_| E::custom(format!("{v:?} is not a 64-bit integer")))
        }
    }

    pub fn read<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        d.deserialize_any(Int64)
    }

    pub fn read_optional<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        read(d).map(Some)
    }
}

/// An enum value given by name (one of `names`, whose position is its number) or by number.
fn enum_value<'de, D: serde::Deserializer<'de>>(
    d: D,
    what: &str,
    names: &[&str],
) -> Result<i32, D::Error> {
    use serde::de::Error;
    match Value::deserialize(d)? {
        Value::Number(n) => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| D::Error::custom(format!("{n} is not a {what}"))),
        Value::String(s) => names
            .iter()
            .position(|&name| name == s)
            .map(|i| i as i32)
            .ok_or_else(|| {
                D::Error::custom(format!("unknown {what} {s:?}: one of {}", names.join(", ")))
            }),
        other => Err(D::Error::custom(format!("{other} is not a {what}"))),
    }
}

fn profile_format<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    enum_value(d, "ProfileFormat", PROFILE_FORMATS)
}

fn aggregation<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i32>, D::Error> {
    enum_value(d, "TimeSeriesAggregationType", AGGREGATIONS).map(Some)
}

fn exemplar_type<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    enum_value(d, "ExemplarType", EXEMPLAR_TYPES)
}

/// The proto3 JSON of a `google.v1.Profile` (fields pprof added later, which that message
/// lacks, are left out so that readers of Pyroscope's schema accept it).
pub fn pprof_json(p: &pprof::Profile) -> Value {
    let s = |n: i64| n.to_string();
    let u = |n: u64| n.to_string();
    let value_type = |t: &pprof::ValueType| json!({"type": s(t.r#type), "unit": s(t.unit)});
    json!({
        "sampleType": p.sample_type.iter().map(value_type).collect::<Vec<_>>(),
        "sample": p.sample.iter().map(|sample| json!({
            "locationId": sample.location_id.iter().map(|&n| u(n)).collect::<Vec<_>>(),
            "value": sample.value.iter().map(|&n| s(n)).collect::<Vec<_>>(),
            "label": sample.label.iter().map(|l| json!({
                "key": s(l.key), "str": s(l.str), "num": s(l.num), "numUnit": s(l.num_unit),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "mapping": p.mapping.iter().map(|m| json!({
            "id": u(m.id),
            "memoryStart": u(m.memory_start),
            "memoryLimit": u(m.memory_limit),
            "fileOffset": u(m.file_offset),
            "filename": s(m.filename),
            "buildId": s(m.build_id),
            "hasFunctions": m.has_functions,
            "hasFilenames": m.has_filenames,
            "hasLineNumbers": m.has_line_numbers,
            "hasInlineFrames": m.has_inline_frames,
        })).collect::<Vec<_>>(),
        "location": p.location.iter().map(|l| json!({
            "id": u(l.id),
            "mappingId": u(l.mapping_id),
            "address": u(l.address),
            "line": l.line.iter().map(|line| json!({
                "functionId": u(line.function_id), "line": s(line.line),
            })).collect::<Vec<_>>(),
            "isFolded": l.is_folded,
        })).collect::<Vec<_>>(),
        "function": p.function.iter().map(|f| json!({
            "id": u(f.id),
            "name": s(f.name),
            "systemName": s(f.system_name),
            "filename": s(f.filename),
            "startLine": s(f.start_line),
        })).collect::<Vec<_>>(),
        "stringTable": p.string_table,
        "dropFrames": s(p.drop_frames),
        "keepFrames": s(p.keep_frames),
        "timeNanos": s(p.time_nanos),
        "durationNanos": s(p.duration_nanos),
        "periodType": p.period_type.as_ref().map(value_type),
        "period": s(p.period),
        "comment": p.comment.iter().map(|&n| s(n)).collect::<Vec<_>>(),
        "defaultSampleType": s(p.default_sample_type),
    })
}
