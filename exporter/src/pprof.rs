//! pprof: the `perftools.profiles.Profile` protocol buffer, gzip-compressed on disk.
//!
//! What `go tool pprof`, Pyroscope and Grafana read. The layout is the canonical profile's:
//!
//! - every function becomes one `Function` (id = index + 1) whose `name` is its name, whose
//!   `filename` is its module file (`System.Linq.dll`), since managed frames carry no source
//!   file, and whose `system_name` is `module!name` (`System.Linq.dll!System.Linq.Enumerable.Sum(…)`),
//!   the PerfView/WinDbg spelling. .NET has no mangled name, and a `system_name` equal to `name`
//!   would make `go tool pprof` take the name for demangled C++ and drop its parameter list,
//!   merging overloads;
//! - every function also becomes one `Location` (same id) with a single `Line` naming it: frames
//!   are symbolized already and have no address worth keeping;
//! - every distinct module becomes one `Mapping` with `has_functions` set, so pprof shows the
//!   module and does not try to symbolize addresses from a file it does not have; functions
//!   without a module get no mapping (`mapping_id` 0). pprof takes the first mapping for the
//!   main binary (`File:` in its header), so the application's busiest module comes first
//!   ([`main_module`]);
//! - labels become sample labels: strings as `str`, numbers (thread ids, …) as `num`. pprof
//!   encodes `Num(0)` and `Str("")` as absent values, so its readers drop those labels;
//! - `default_sample_type` is, as the proto says, the string index of that sample type's *name*.

use std::collections::HashMap;
use std::io::Write;

use flate2::write::GzEncoder;
use flate2::Compression;
use profile::{LabelValue, Profile};
use prost::Message;

use crate::{check, resolve_sample_type, ExportError};

/// The messages of pprof's `profile.proto`, generated from `exporter/proto/profile.proto`
/// (`tests/suite/wire_types.rs` generates them and says how to regenerate). String fields are
/// indices into `Profile::string_table`.
pub mod proto {
    include!("wire/perftools.profiles.rs");
}

/// Writes the profile as a gzip-compressed pprof file (`.pb.gz`), as pprof requires on disk.
pub fn write_pprof(profile: &Profile, out: impl Write) -> Result<(), ExportError> {
    let bytes = encode_pprof(profile)?;
    // flate2's default gzip header has no file name and a zero mtime: equal input, equal bytes.
    let mut gz = GzEncoder::new(out, Compression::default());
    gz.write_all(&bytes)?;
    gz.finish()?.flush()?;
    Ok(())
}

/// The uncompressed protocol buffer, for carriers that compress on their own (HTTP bodies).
pub fn encode_pprof(profile: &Profile) -> Result<Vec<u8>, ExportError> {
    Ok(to_proto(profile)?.encode_to_vec())
}

/// The pprof message for a profile, for callers that embed it in another message.
/// The module pprof should call the program: of the modules that are not .NET's own (`System.*`,
/// `Microsoft.*`, the runtime's `.so` files), the one on the stacks of the most sampled value
/// (the default sample type). `None` when only .NET's own modules appear.
fn main_module(profile: &Profile) -> Option<&str> {
    let is_dotnets_own = |module: &str| {
        module.is_empty()
            || module.starts_with("System.")
            || module.starts_with("Microsoft.")
            || module == "netstandard.dll"
            || module == "mscorlib.dll"
            || module.ends_with(".so")
    };
    let value_index = profile.default_sample_type;
    let mut totals: HashMap<&str, i64> = HashMap::new();
    let mut seen: Vec<&str> = Vec::new();
    for sample in &profile.samples {
        // Negative values (a diff) count for nothing; sums saturate rather than overflow.
        let value = sample.values.get(value_index).copied().unwrap_or(0).max(0);
        seen.clear();
        for &f in &sample.stack {
            let Some(function) = profile.functions.get(f as usize) else {
                continue;
            };
            let module = function.module.as_str();
            if !is_dotnets_own(module) && !seen.contains(&module) {
                seen.push(module);
                let total = totals.entry(module).or_default();
                *total = total.saturating_add(value);
            }
        }
    }
    // Ties go to the name that sorts first, so equal input gives equal output.
    totals
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(a.0)))
        .map(|(module, _)| module)
}

pub fn to_proto(profile: &Profile) -> Result<proto::Profile, ExportError> {
    check(profile)?;
    let mut strings = StringTable::default();

    let sample_type = profile
        .sample_types
        .iter()
        .map(|t| proto::ValueType {
            r#type: strings.index(&t.kind),
            unit: strings.index(&t.unit),
        })
        .collect();
    let period_type = Some(proto::ValueType {
        r#type: strings.index(&profile.period_type.kind),
        unit: strings.index(&profile.period_type.unit),
    });
    // An empty profile may have no sample type at all; then there is no default to name.
    let default_sample_type = if profile.sample_types.is_empty() {
        0
    } else {
        let index = resolve_sample_type(profile, None)?;
        strings.index(&profile.sample_types[index].kind)
    };

    let mut mapping: Vec<proto::Mapping> = Vec::new();
    let mut mapping_ids: HashMap<&str, u64> = HashMap::new();
    if let Some(main) = main_module(profile) {
        mapping_ids.insert(main, 1);
        mapping.push(proto::Mapping {
            id: 1,
            filename: strings.index(main),
            has_functions: true,
            ..proto::Mapping::default()
        });
    }
    let mut function = Vec::with_capacity(profile.functions.len());
    let mut location = Vec::with_capacity(profile.functions.len());
    for (id, f) in (1u64..).zip(&profile.functions) {
        let name = strings.index(&f.name);
        let filename = strings.index(&f.module);
        let system_name = if f.module.is_empty() {
            name
        } else {
            strings.index(&format!("{}!{}", f.module, f.name))
        };
        let mapping_id = if f.module.is_empty() {
            0
        } else {
            *mapping_ids.entry(&f.module).or_insert_with(|| {
                let id = mapping.len() as u64 + 1;
                mapping.push(proto::Mapping {
                    id,
                    filename,
                    has_functions: true,
                    ..proto::Mapping::default()
                });
                id
            })
        };
        function.push(proto::Function {
            id,
            name,
            system_name,
            filename,
            start_line: 0,
        });
        location.push(proto::Location {
            id,
            mapping_id,
            address: 0,
            line: vec![proto::Line {
                function_id: id,
                line: 0,
                column: 0,
            }],
            is_folded: false,
        });
    }

    let sample = profile
        .samples
        .iter()
        .map(|s| proto::Sample {
            location_id: s.stack.iter().map(|&f| u64::from(f) + 1).collect(),
            value: s.values.clone(),
            label: s
                .labels
                .iter()
                .map(|(key, value)| {
                    let key = strings.index(key);
                    match value {
                        LabelValue::Str(v) => proto::Label {
                            key,
                            str: strings.index(v),
                            ..proto::Label::default()
                        },
                        LabelValue::Num(n) => proto::Label {
                            key,
                            num: *n,
                            ..proto::Label::default()
                        },
                    }
                })
                .collect(),
        })
        .collect();

    Ok(proto::Profile {
        sample_type,
        sample,
        mapping,
        location,
        function,
        string_table: strings.table,
        time_nanos: profile.start_unix_nanos,
        duration_nanos: profile.duration_nanos,
        period_type,
        period: profile.period,
        default_sample_type,
        ..proto::Profile::default()
    })
}

/// pprof's string table: each string once, `""` at index 0 as the format requires.
struct StringTable {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Default for StringTable {
    fn default() -> Self {
        StringTable {
            table: vec![String::new()],
            index: HashMap::from([(String::new(), 0)]),
        }
    }
}

impl StringTable {
    fn index(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}
