//! Each format on a realistic profile: golden files (`CLRSCOPE_BLESS=1` rewrites them) and checks
//! that readers of the format would accept the output.

mod common;

use std::collections::BTreeMap;
use std::io::Read;

use common::{check_golden, cpu_hot, PERIOD};
use exporter::pprof::{encode_pprof, proto, write_pprof};
use exporter::{write, write_with_options, ExportOptions, Format};
use profile::labels::THREAD_ID as THREAD_ID_LABEL;
use prost::Message;
use quick_xml::events::Event;
use serde_json::Value;

fn written(format: Format, options: &ExportOptions) -> Vec<u8> {
    let mut out = Vec::new();
    write_with_options(&cpu_hot(), format, options, &mut out).unwrap();
    out
}

fn per_thread() -> ExportOptions {
    ExportOptions {
        thread_label: Some(THREAD_ID_LABEL.to_string()),
        ..ExportOptions::default()
    }
}

fn decoded() -> proto::Profile {
    proto::Profile::decode(encode_pprof(&cpu_hot()).unwrap().as_slice()).unwrap()
}

#[test]
fn pprof_golden() {
    check_golden(
        "cpu_hot.pprof.txt",
        format!("{:#?}\n", decoded()).as_bytes(),
    );
}

#[test]
fn folded_golden() {
    check_golden(
        "cpu_hot.folded",
        &written(Format::Folded, &ExportOptions::default()),
    );
    check_golden(
        "cpu_hot.per_thread.folded",
        &written(Format::Folded, &per_thread()),
    );
    let samples = ExportOptions {
        sample_type: Some(0),
        ..ExportOptions::default()
    };
    check_golden("cpu_hot.samples.folded", &written(Format::Folded, &samples));
}

#[test]
fn speedscope_golden() {
    let mut out = Vec::new();
    write(&cpu_hot(), Format::Speedscope, &mut out).unwrap();
    // The version changes with every release; the file should not.
    let version = concat!("clrscope@", env!("CARGO_PKG_VERSION"));
    let out = String::from_utf8(out)
        .unwrap()
        .replace(version, "clrscope@VERSION");
    check_golden("cpu_hot.speedscope.json", out.as_bytes());
}

#[test]
fn svg_golden() {
    let mut out = Vec::new();
    write(&cpu_hot(), Format::Svg, &mut out).unwrap();
    check_golden("cpu_hot.svg", &out);
}

#[test]
fn pprof_decodes_to_the_same_names_totals_and_labels() {
    let profile = cpu_hot();
    let p = decoded();
    let s = |i: i64| p.string_table[i as usize].as_str();
    assert_eq!(p.string_table[0], "");

    let types: Vec<_> = p
        .sample_type
        .iter()
        .map(|t| (s(t.r#type), s(t.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    assert_eq!(s(p.default_sample_type), "cpu");
    let period_type = p.period_type.unwrap();
    assert_eq!(
        (s(period_type.r#type), s(period_type.unit)),
        ("cpu", "nanoseconds")
    );
    assert_eq!(p.period, PERIOD);
    assert_eq!(p.time_nanos, profile.start_unix_nanos);
    assert_eq!(p.duration_nanos, profile.duration_nanos);

    for i in 0..2 {
        let total: i64 = p.sample.iter().map(|x| x.value[i]).sum();
        assert_eq!(total, profile.total(i));
    }
    assert_eq!(profile.total(0), 17);

    // Ids are unique and nonzero; each location names one function.
    let functions: BTreeMap<u64, &proto::Function> = p.function.iter().map(|f| (f.id, f)).collect();
    let locations: BTreeMap<u64, &proto::Location> = p.location.iter().map(|l| (l.id, l)).collect();
    let mappings: BTreeMap<u64, &proto::Mapping> = p.mapping.iter().map(|m| (m.id, m)).collect();
    assert_eq!(functions.len(), profile.functions.len());
    assert_eq!(locations.len(), profile.functions.len());
    assert!(
        !functions.contains_key(&0) && !locations.contains_key(&0) && !mappings.contains_key(&0)
    );
    let frame = |location: u64| {
        let l = locations[&location];
        assert_eq!(l.line.len(), 1);
        let f = functions[&l.line[0].function_id];
        let module = if l.mapping_id == 0 {
            ""
        } else {
            assert!(mappings[&l.mapping_id].has_functions);
            s(mappings[&l.mapping_id].filename)
        };
        assert_eq!(s(f.filename), module);
        if module.is_empty() {
            assert_eq!(f.system_name, f.name);
        } else {
            assert_eq!(s(f.system_name), format!("{module}!{}", s(f.name)));
        }
        (s(f.name), module)
    };
    let modules: Vec<_> = p.mapping.iter().map(|m| s(m.filename)).collect();
    assert_eq!(
        modules,
        [
            "CpuHot.dll",
            "System.Linq.dll",
            "System.Private.CoreLib.dll"
        ]
    );

    for (original, decoded) in profile.samples.iter().zip(&p.sample) {
        assert_eq!(decoded.value, original.values);
        let stack: Vec<_> = decoded.location_id.iter().map(|&l| frame(l)).collect();
        let expected: Vec<_> = original
            .stack
            .iter()
            .map(|&f| {
                let f = &profile.functions[f as usize];
                (f.name.as_str(), f.module.as_str())
            })
            .collect();
        assert_eq!(stack, expected, "leaf first, like the profile");
        let labels: Vec<String> = decoded
            .label
            .iter()
            .map(|l| {
                if l.str != 0 {
                    format!("{}={}", s(l.key), s(l.str))
                } else {
                    format!("{}=#{}", s(l.key), l.num)
                }
            })
            .collect();
        let thread = if labels[0] == "thread_id=#101" {
            "Main"
        } else {
            ".NET TP Worker"
        };
        assert_eq!(labels[1], format!("thread_name={thread}"));
    }
    let leaf_names: Vec<_> = p
        .sample
        .iter()
        .filter_map(|x| x.location_id.first())
        .map(|&l| frame(l).0)
        .collect();
    assert!(leaf_names.contains(&"CpuHot.Program.SpinAlpha()"));
    assert!(leaf_names.contains(
        &"System.Linq.Enumerable.Sum(System.Collections.Generic.IEnumerable<System.Int32>)"
    ));
}

#[test]
fn pprof_file_is_gzip_of_the_encoded_profile() {
    let mut file = Vec::new();
    write_pprof(&cpu_hot(), &mut file).unwrap();
    assert_eq!(&file[..2], &[0x1f, 0x8b], "gzip magic");
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(file.as_slice())
        .read_to_end(&mut plain)
        .unwrap();
    assert_eq!(plain, encode_pprof(&cpu_hot()).unwrap());
    let mut again = Vec::new();
    write(&cpu_hot(), Format::Pprof, &mut again).unwrap();
    assert_eq!(again, file, "the same profile gives the same bytes");
}

#[test]
fn folded_lines_are_root_first_sorted_and_add_up() {
    let text = String::from_utf8(written(Format::Folded, &ExportOptions::default())).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut sorted = lines.clone();
    sorted.sort();
    assert_eq!(lines, sorted);
    assert!(
        lines.contains(&"CpuHot.Program.Main(System.String[]);CpuHot.Program.SpinAlpha() 50000000")
    );
    let total: i64 = lines
        .iter()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<i64>().unwrap())
        .sum();
    assert_eq!(total, cpu_hot().total(1));
    // The native sample has no cpu time: it is not a line of the cpu profile.
    assert!(!text.contains("StartCallback();[unknown] "));

    let threads = String::from_utf8(written(Format::Folded, &per_thread())).unwrap();
    assert!(threads
        .lines()
        .all(|l| l.starts_with("thread_id=101;") || l.starts_with("thread_id=202;")));
    assert!(
        threads.contains("thread_id=202;[unknown] 10000000\n"),
        "{threads}"
    );
}

/// Checks the fields that speedscope's schema requires, and their types.
fn assert_speedscope_schema(file: &Value) {
    assert_eq!(
        file["$schema"],
        "https://www.speedscope.app/file-format-schema.json"
    );
    let frames = file["shared"]["frames"].as_array().expect("shared.frames");
    for frame in frames {
        assert!(frame["name"].is_string(), "{frame}");
        assert!(frame.get("file").is_none_or(Value::is_string), "{frame}");
    }
    let profiles = file["profiles"].as_array().expect("profiles");
    for p in profiles {
        assert_eq!(p["type"], "sampled");
        assert!(p["name"].is_string());
        let unit = p["unit"].as_str().unwrap();
        assert!([
            "none",
            "nanoseconds",
            "microseconds",
            "milliseconds",
            "seconds",
            "bytes"
        ]
        .contains(&unit));
        let start = p["startValue"].as_f64().unwrap();
        let end = p["endValue"].as_f64().unwrap();
        assert!(end >= start);
        let samples = p["samples"].as_array().unwrap();
        let weights = p["weights"].as_array().unwrap();
        assert_eq!(samples.len(), weights.len());
        for stack in samples {
            for index in stack.as_array().unwrap() {
                assert!((index.as_u64().unwrap() as usize) < frames.len());
            }
        }
        assert!(weights.iter().all(|w| w.as_f64().unwrap() > 0.0));
        let total: f64 = weights.iter().map(|w| w.as_f64().unwrap()).sum();
        assert_eq!(total, end - start);
    }
    // Optional, but ours always carries them.
    assert!(file["name"].is_string());
    assert!(file["exporter"].as_str().unwrap().starts_with("clrscope@"));
    assert!((file["activeProfileIndex"].as_u64().unwrap() as usize) < profiles.len());
}

#[test]
fn speedscope_matches_the_schema_with_one_profile_per_type_and_thread() {
    let mut out = Vec::new();
    write(&cpu_hot(), Format::Speedscope, &mut out).unwrap();
    let file: Value = serde_json::from_slice(&out).unwrap();
    assert_speedscope_schema(&file);
    let names: Vec<&str> = file["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "samples (count) · thread_id=101 (Main)",
            "samples (count) · thread_id=202 (.NET TP Worker)",
            "cpu (nanoseconds) · thread_id=101 (Main)",
            "cpu (nanoseconds) · thread_id=202 (.NET TP Worker)",
        ]
    );
    let profiles = file["profiles"].as_array().unwrap();
    assert_eq!(profiles[0]["unit"], "none");
    assert_eq!(profiles[2]["unit"], "nanoseconds");
    // The busiest thread of the default (cpu) sample type opens first.
    assert_eq!(file["activeProfileIndex"], 2);
    assert_eq!(profiles[2]["endValue"], 10 * PERIOD);
    // Root first: Main, then SpinAlpha.
    let frames = file["shared"]["frames"].as_array().unwrap();
    let first = profiles[2]["samples"][0].as_array().unwrap();
    assert_eq!(
        frames[first[0].as_u64().unwrap() as usize]["name"],
        "CpuHot.Program.Main(System.String[])"
    );
    assert_eq!(
        frames[first[0].as_u64().unwrap() as usize]["file"],
        "CpuHot.dll"
    );

    let merged = ExportOptions {
        sample_type: Some(1),
        title: Some("CpuHot 01:08".into()),
        ..ExportOptions::default()
    };
    let file: Value = serde_json::from_slice(&written(Format::Speedscope, &merged)).unwrap();
    assert_speedscope_schema(&file);
    assert_eq!(file["name"], "CpuHot 01:08");
    assert_eq!(file["profiles"].as_array().unwrap().len(), 1);
    assert_eq!(file["profiles"][0]["name"], "cpu (nanoseconds)");
    assert_eq!(file["profiles"][0]["endValue"], cpu_hot().total(1));
}

/// Parses the whole document, failing on any XML error (mismatched tags, bad attributes, unknown
/// entities); returns the root element's name.
fn assert_well_formed_xml(xml: &str) -> String {
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut depth = 0usize;
    let mut root = None;
    loop {
        let event = reader
            .read_event()
            .unwrap_or_else(|e| panic!("not well-formed at {}: {e}", reader.buffer_position()));
        let check_attributes = |e: &quick_xml::events::BytesStart| {
            for attribute in e.attributes() {
                attribute
                    .unwrap()
                    .normalized_value(quick_xml::XmlVersion::Implicit1_0)
                    .unwrap();
            }
        };
        match event {
            Event::Start(e) => {
                check_attributes(&e);
                if depth == 0 {
                    assert!(root.is_none(), "one root element");
                    root = Some(String::from_utf8(e.name().as_ref().to_vec()).unwrap());
                }
                depth += 1;
            }
            Event::Empty(e) => check_attributes(&e),
            Event::End(_) => depth -= 1,
            Event::GeneralRef(r) => {
                if r.is_char_ref() {
                    assert!(r.resolve_char_ref().unwrap().is_some());
                } else {
                    let name = r.decode().unwrap();
                    assert!(
                        ["lt", "gt", "amp", "quot", "apos"].contains(&name.as_ref()),
                        "&{name};"
                    );
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    assert_eq!(depth, 0, "every element closed");
    root.expect("a root element")
}

#[test]
fn svg_is_well_formed_and_names_the_functions() {
    let svg = String::from_utf8(written(Format::Svg, &ExportOptions::default())).unwrap();
    assert_eq!(assert_well_formed_xml(&svg), "svg");
    for expected in [
        ">cpu (nanoseconds)<",
        "CpuHot.Program.SpinAlpha()",
        "CpuHot.Program.Main(System.String[])",
        "System.Linq.Enumerable.Sum(System.Collections.Generic.IEnumerable&lt;System.Int32&gt;)",
        "nanoseconds",
    ] {
        assert!(svg.contains(expected), "{expected} missing");
    }

    let svg = String::from_utf8(written(Format::Svg, &per_thread())).unwrap();
    assert_eq!(assert_well_formed_xml(&svg), "svg");
    assert!(svg.contains("thread_id=202"));

    let samples = ExportOptions {
        sample_type: Some(0),
        title: Some("CpuHot samples".into()),
        ..ExportOptions::default()
    };
    let svg = String::from_utf8(written(Format::Svg, &samples)).unwrap();
    assert!(svg.contains(">CpuHot samples<"));
    assert!(
        svg.contains("(17 samples, 100%)"),
        "count name from the sample type"
    );
}

#[test]
fn formats_come_from_extensions_and_names() {
    for (path, format) in [
        ("out.pb.gz", Format::Pprof),
        ("/tmp/x/cpu.PPROF", Format::Pprof),
        ("cpu.pb", Format::Pprof),
        ("stacks.folded", Format::Folded),
        ("stacks.txt", Format::Folded),
        ("trace.speedscope.json", Format::Speedscope),
        ("trace.json", Format::Speedscope),
        ("flame.svg", Format::Svg),
    ] {
        assert_eq!(Format::from_extension(path).unwrap(), format, "{path}");
    }
    for path in ["out", "out.gz", "out.nettrace", "svg", ""] {
        let message = Format::from_extension(path).unwrap_err().to_string();
        assert!(
            message.contains(".pb.gz") && message.contains("format"),
            "{message}"
        );
    }
    for format in [
        Format::Pprof,
        Format::Folded,
        Format::Speedscope,
        Format::Svg,
    ] {
        assert_eq!(format.to_string().parse::<Format>().unwrap(), format);
    }
    assert_eq!("SVG".parse::<Format>().unwrap(), Format::Svg);
    let message = "otlp".parse::<Format>().unwrap_err().to_string();
    assert!(message.contains("otlp") && message.contains("pprof, folded, speedscope or svg"));
}
