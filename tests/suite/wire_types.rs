//! The protobuf messages clrscope reads and writes are generated from the `.proto` files in the
//! repository with prost-build and protox (no protoc) and checked in, so a build needs neither.
//! This test generates them again into a temporary folder and fails on any difference from the
//! checked-in files. After changing a `.proto` file or this generator, write them anew with
//!
//! ```sh
//! CLRSCOPE_BLESS=1 cargo test --test suite -- wire_types::
//! ```
//!
//! The querier's messages also carry their proto3 JSON mapping (what Connect speaks for
//! `application/json`), derived here from the descriptors once for every message:
//! [`json_mapping`].

use std::collections::{BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};

/// One generated folder: the `.proto` files it comes from (relative to `include`) and where the
/// generated files live.
struct WireTypes {
    include: &'static str,
    protos: &'static [&'static str],
    out: &'static str,
    configure: fn(&mut prost_build::Config, &FileDescriptorSet),
}

const SETS: &[WireTypes] = &[
    WireTypes {
        include: "exporter/proto",
        protos: &["profile.proto"],
        out: "exporter/src/wire",
        configure: |_, _| {},
    },
    WireTypes {
        include: "tests/otlp",
        protos: &["push.proto"],
        out: "exporter/src/wire",
        configure: |_, _| {},
    },
    WireTypes {
        include: "tests/querier/proto",
        protos: &["querier/v1/querier.proto"],
        out: "ui/src/querier/wire",
        configure: |config, fds| {
            // SelectMergeProfile answers with the exporter's pprof message (the same fields).
            config.extern_path(".google.v1", "::exporter::pprof::proto");
            json_mapping(config, fds);
        },
    },
];

/// Fields clrscope neither fills nor reads: left out of the JSON it writes and reads (protobuf
/// decodes them and nothing looks).
const UNUSED_FIELDS: &[&str] = &[
    ".types.v1.Point.annotations",
    ".types.v1.Point.exemplars",
    ".types.v1.StackTraceSelector.go_pgo",
    ".querier.v1.SelectMergeStacktracesResponse.tree",
    ".querier.v1.SelectMergeStacktracesResponse.dot",
    ".querier.v1.SelectMergeStacktracesResponse.pprof",
    ".querier.v1.SelectMergeSpanProfileResponse.tree",
];

/// Where the generated querier messages and the JSON helpers their attributes name live
/// (`ui/src/querier/proto.rs`).
const WIRE: &str = "crate::querier::proto";
const JSON: &str = "crate::querier::proto::json";

fn generate(root: &Path, out: &Path) {
    for set in SETS {
        let include = root.join(set.include);
        let fds = protox::compile(set.protos.iter().map(|p| include.join(p)), [&include])
            .unwrap_or_else(|e| panic!("{}: {e}", set.include));
        let dir = out.join(set.out);
        std::fs::create_dir_all(&dir).unwrap();
        let mut config = prost_build::Config::new();
        config.out_dir(&dir);
        (set.configure)(&mut config, &fds);
        config.compile_fds(fds).unwrap();
    }
}

/// The proto3 JSON mapping as serde attributes: messages reachable from a method's request are
/// read (`Deserialize`, every field optional, by its JSON name or its proto name), those
/// reachable from an answer written (`Serialize`, every field written, by its JSON name);
/// 64-bit integers as decimal strings (numbers read too), enums read by name or number.
fn json_mapping(config: &mut prost_build::Config, fds: &FileDescriptorSet) {
    let messages = all_messages(fds);
    let service = fds.file.iter().flat_map(|f| &f.service).next().unwrap();
    let requests = service.method.iter().map(|m| m.input_type().to_string());
    let answers = service.method.iter().map(|m| m.output_type().to_string());
    let read = reachable(&messages, requests);
    let written = reachable(&messages, answers);
    for (name, message) in &messages {
        let reads = read.contains(name);
        if !reads && !written.contains(name) {
            continue;
        }
        assert!(
            !(reads && written.contains(name)),
            "{name} is both read and written"
        );
        config.type_attribute(
            name,
            if reads {
                "#[derive(serde::Deserialize)]\n#[serde(default)]"
            } else {
                "#[derive(serde::Serialize)]"
            },
        );
        for field in &message.field {
            let path = format!("{name}.{}", field.name());
            let attribute = if UNUSED_FIELDS.contains(&path.as_str()) {
                "#[serde(skip)]".to_string()
            } else if reads {
                read_attribute(field)
            } else {
                write_attribute(field)
            };
            config.field_attribute(path, attribute);
        }
    }
}

fn read_attribute(field: &prost_types::FieldDescriptorProto) -> String {
    let mut parts = vec![format!("rename = {:?}", field.json_name())];
    if field.json_name() != field.name() {
        parts.push(format!("alias = {:?}", field.name()));
    }
    let optional = field.proto3_optional();
    let reader = match field.r#type() {
        Type::Int64 if optional => Some(format!("{JSON}::int64::read_optional")),
        Type::Int64 => Some(format!("{JSON}::int64::read")),
        Type::Enum => {
            let rust = field.type_name().replace('.', "::");
            let function = if optional { "read_optional" } else { "read" };
            Some(format!(
                "{JSON}::enumeration::{function}::<_, {WIRE}{rust}>"
            ))
        }
        _ => None,
    };
    if let Some(reader) = reader {
        parts.push(format!("deserialize_with = {reader:?}"));
    }
    format!("#[serde({})]", parts.join(", "))
}

fn write_attribute(field: &prost_types::FieldDescriptorProto) -> String {
    let mut parts = vec![format!("rename = {:?}", field.json_name())];
    if field.r#type() == Type::Int64 {
        let writer = if field.label() == Label::Repeated {
            "write_all"
        } else {
            "write"
        };
        parts.push(format!("serialize_with = \"{JSON}::int64::{writer}\""));
    }
    format!("#[serde({})]", parts.join(", "))
}

/// Every message by its full name (`.querier.v1.SeriesRequest`).
fn all_messages(fds: &FileDescriptorSet) -> Vec<(String, &DescriptorProto)> {
    fds.file
        .iter()
        .flat_map(|file| {
            file.message_type
                .iter()
                .map(move |m| (format!(".{}.{}", file.package(), m.name()), m))
        })
        .collect()
}

/// The messages `roots` name and those their used fields reach (extern ones excluded).
fn reachable(
    messages: &[(String, &DescriptorProto)],
    roots: impl Iterator<Item = String>,
) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut queue: VecDeque<String> = roots.collect();
    while let Some(name) = queue.pop_front() {
        let Some((_, message)) = messages.iter().find(|(n, _)| *n == name) else {
            continue;
        };
        if !seen.insert(name.clone()) {
            continue;
        }
        for field in &message.field {
            let path = format!("{name}.{}", field.name());
            if field.r#type() == Type::Message && !UNUSED_FIELDS.contains(&path.as_str()) {
                queue.push_back(field.type_name().to_string());
            }
        }
    }
    seen
}

/// Every file of `dir`, by name, with its bytes.
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<_> = walk(dir)
        .into_iter()
        .map(|path| {
            let bytes = std::fs::read(&path).unwrap();
            (path.strip_prefix(dir).unwrap().to_path_buf(), bytes)
        })
        .collect();
    files.sort();
    files
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flat_map(|entry| {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path)
            } else {
                vec![path]
            }
        })
        .collect()
}

#[test]
fn the_checked_in_wire_types_are_generated_from_the_protos() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fresh = tempfile::tempdir().unwrap();
    generate(root, fresh.path());
    let bless = std::env::var_os("CLRSCOPE_BLESS").is_some();
    let mut stale = Vec::new();
    let outs: BTreeSet<&str> = SETS.iter().map(|s| s.out).collect();
    for out in outs {
        let (generated, checked_in) = (files(&fresh.path().join(out)), files(&root.join(out)));
        if generated == checked_in {
            continue;
        }
        stale.push(out);
        if bless {
            let _ = std::fs::remove_dir_all(root.join(out));
            for (name, bytes) in &generated {
                std::fs::create_dir_all(root.join(out).join(name).parent().unwrap()).unwrap();
                std::fs::write(root.join(out).join(name), bytes).unwrap();
            }
        }
    }
    assert!(
        bless || stale.is_empty(),
        "{stale:?} differ from what the .proto files generate: run \
         `CLRSCOPE_BLESS=1 cargo test --test suite -- wire_types::` and commit the result"
    );
}
