//! The messages of Pyroscope's `querier.v1` and `types.v1` packages that the querier routes
//! read and write, generated (`wire/`) from `tests/querier/proto`, the `.proto` files with
//! grafana/pyroscope's names and field numbers, which the querier test's Connect client is
//! generated from too: `tests/suite/wire_types.rs` generates them and says how to regenerate.
//!
//! Each message also has its proto3 JSON mapping, which Connect uses for `application/json`:
//! lowerCamelCase names (the proto names are accepted too), 64-bit integers as decimal strings
//! (numbers accepted), enums by name (numbers accepted), default values written out; the
//! generated serde attributes call [`json`]. `google.v1.Profile`, the answer of
//! `SelectMergeProfile`, is the exporter's pprof message ([`exporter::pprof::proto::Profile`]:
//! the same fields and numbers); its JSON is [`pprof_json`].

use exporter::pprof::proto as pprof;
use serde_json::{json, Value};

pub mod types {
    pub mod v1 {
        include!("wire/types.v1.rs");
    }
}

pub mod querier {
    pub mod v1 {
        include!("wire/querier.v1.rs");
    }
}

// ---------------------------------------------------------------------------------------------
// JSON details

/// The proto3 JSON mapping's readers and writers that the generated serde attributes name.
pub mod json {
    /// proto3 JSON for 64-bit integers: written as strings, read from strings or numbers.
    pub mod int64 {
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

    /// Enums by name (their proto name, e.g. `PROFILE_FORMAT_FLAMEGRAPH`) or by number.
    pub mod enumeration {
        use serde::de::{Deserialize, Deserializer, Error};
        use serde_json::Value;

        /// A generated enum: its proto name and the names of its values.
        pub trait ProtoEnum: TryFrom<i32> {
            const NAME: &'static str;
            fn value_name(&self) -> &'static str;

            /// The names in number order (the enums here number their values from 0 on).
            fn names() -> Vec<&'static str> {
                (0..)
                    .map_while(|n| Self::try_from(n).ok())
                    .map(|e| e.value_name())
                    .collect()
            }
        }

        macro_rules! proto_enum {
            ($($rust:ty => $name:literal),*) => {$(
                impl ProtoEnum for $rust {
                    const NAME: &'static str = $name;
                    fn value_name(&self) -> &'static str {
                        self.as_str_name()
                    }
                }
            )*};
        }

        proto_enum!(
            super::super::querier::v1::ProfileFormat => "ProfileFormat",
            super::super::types::v1::TimeSeriesAggregationType => "TimeSeriesAggregationType",
            super::super::types::v1::ExemplarType => "ExemplarType"
        );

        pub fn read<'de, D: Deserializer<'de>, E: ProtoEnum>(d: D) -> Result<i32, D::Error> {
            let what = E::NAME;
            match Value::deserialize(d)? {
                Value::Number(n) => n
                    .as_i64()
                    .and_then(|n| i32::try_from(n).ok())
                    .ok_or_else(|| D::Error::custom(format!("{n} is not a {what}"))),
                Value::String(s) => {
                    let names = E::names();
                    names
                        .iter()
                        .position(|&name| name == s)
                        .map(|i| i as i32)
                        .ok_or_else(|| {
                            D::Error::custom(format!(
                                "unknown {what} {s:?}: one of {}",
                                names.join(", ")
                            ))
                        })
                }
                other => Err(D::Error::custom(format!("{other} is not a {what}"))),
            }
        }

        pub fn read_optional<'de, D: Deserializer<'de>, E: ProtoEnum>(
            d: D,
        ) -> Result<Option<i32>, D::Error> {
            read::<D, E>(d).map(Some)
        }
    }
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
