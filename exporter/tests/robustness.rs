//! Odd profiles: every writer either writes a file its readers accept or returns an error that
//! says what is wrong; none panics.

use exporter::pprof::{encode_pprof, proto};
use exporter::{write_with_options, ExportError, ExportOptions, Format};
use profile::labels::THREAD_ID as THREAD_ID_LABEL;
use profile::{Function, LabelValue, Profile, ProfileBuilder, Sample, ValueType};
use prost::Message;

const FORMATS: [Format; 4] = [
    Format::Pprof,
    Format::Folded,
    Format::Speedscope,
    Format::Svg,
];

fn cpu_builder() -> ProfileBuilder {
    let mut b = ProfileBuilder::new(
        vec![
            ValueType::new("samples", "count"),
            ValueType::new("cpu", "nanoseconds"),
        ],
        ValueType::new("cpu", "nanoseconds"),
        1_000_000,
    );
    b.set_default_sample_type(1);
    b
}

fn function(name: &str, module: &str) -> Function {
    Function {
        name: name.into(),
        module: module.into(),
    }
}

fn options(thread_label: bool) -> ExportOptions {
    ExportOptions {
        thread_label: thread_label.then(|| THREAD_ID_LABEL.to_string()),
        ..ExportOptions::default()
    }
}

fn export(
    profile: &Profile,
    format: Format,
    options: &ExportOptions,
) -> Result<String, ExportError> {
    let mut out = Vec::new();
    write_with_options(profile, format, options, &mut out)?;
    Ok(match format {
        Format::Pprof => format!("{:?}", decode(&encode_pprof(profile)?)),
        _ => String::from_utf8(out).expect("text formats are UTF-8"),
    })
}

fn decode(bytes: &[u8]) -> proto::Profile {
    proto::Profile::decode(bytes).expect("pprof decodes")
}

#[test]
fn an_empty_profile_writes_empty_files_but_no_svg() {
    let empty = cpu_builder().build();
    for thread_label in [false, true] {
        let options = options(thread_label);
        let p = decode(&encode_pprof(&empty).unwrap());
        assert!(p.sample.is_empty() && p.function.is_empty() && p.mapping.is_empty());
        assert_eq!(p.string_table[p.default_sample_type as usize], "cpu");
        assert_eq!(export(&empty, Format::Folded, &options).unwrap(), "");
        let json: serde_json::Value =
            serde_json::from_str(&export(&empty, Format::Speedscope, &options).unwrap()).unwrap();
        let profiles = json["profiles"].as_array().unwrap();
        assert_eq!(profiles.len(), 2, "one empty profile per sample type");
        assert_eq!(profiles[1]["name"], "cpu (nanoseconds)");
        assert_eq!(profiles[1]["samples"].as_array().unwrap().len(), 0);
        let err = export(&empty, Format::Svg, &options).unwrap_err();
        assert!(matches!(err, ExportError::NothingToDraw { .. }));
        assert!(err.to_string().contains("cpu (nanoseconds)"), "{err}");
    }
}

#[test]
fn a_profile_without_sample_types_is_a_valid_pprof_and_an_error_elsewhere() {
    let mut profile = ProfileBuilder::new(vec![], ValueType::new("", ""), 0).build();
    let p = decode(&encode_pprof(&profile).unwrap());
    assert!(p.sample_type.is_empty());
    assert_eq!(p.default_sample_type, 0);
    for format in [Format::Folded, Format::Speedscope, Format::Svg] {
        let err = export(&profile, format, &ExportOptions::default()).unwrap_err();
        assert!(
            matches!(err, ExportError::SampleTypeOutOfRange { .. }),
            "{format}"
        );
        assert!(err.to_string().contains("are: none"), "{err}");
    }
    // Samples with no values fit a profile with no sample types.
    profile.functions.push(function("A", "a.dll"));
    profile.samples.push(Sample {
        stack: vec![0],
        values: vec![],
        labels: Vec::new().into(),
    });
    assert_eq!(decode(&encode_pprof(&profile).unwrap()).sample.len(), 1);
}

#[test]
fn inconsistent_profiles_are_refused_with_the_reason() {
    let mut b = cpu_builder();
    let a = b.function(function("A", "a.dll"));
    b.add(vec![a], vec![], &[1, 1_000_000]);
    let good = b.build();

    let mut missing_function = good.clone();
    missing_function.samples[0].stack.push(7);
    let mut short_values = good.clone();
    short_values.samples[0].values.pop();
    let mut bad_default = good.clone();
    bad_default.default_sample_type = 2;

    for format in FORMATS {
        let err = export(&missing_function, format, &options(true)).unwrap_err();
        assert!(
            matches!(
                err,
                ExportError::FunctionIndex {
                    sample: 0,
                    function: 7,
                    functions: 1
                }
            ),
            "{format}: {err}"
        );
        let err = export(&short_values, format, &options(true)).unwrap_err();
        assert!(
            matches!(
                err,
                ExportError::ValueCount {
                    sample: 0,
                    got: 1,
                    expected: 2
                }
            ),
            "{format}: {err}"
        );
        let err = export(&bad_default, format, &options(false)).unwrap_err();
        assert!(
            err.to_string().contains(
                "sample type 2 does not exist; the profile's 2 sample types are: \
                           0: samples (count), 1: cpu (nanoseconds)"
            ),
            "{format}: {err}"
        );
    }
    let too_far = ExportOptions {
        sample_type: Some(5),
        ..ExportOptions::default()
    };
    for format in [Format::Folded, Format::Speedscope, Format::Svg] {
        assert!(matches!(
            export(&good, format, &too_far),
            Err(ExportError::SampleTypeOutOfRange { index: 5, .. })
        ));
    }
}

#[test]
fn empty_stacks_unicode_and_hostile_names_survive_every_format() {
    let mut b = cpu_builder();
    let names = [
        "Ünïcødé.Méthode(日本語, System.String)",
        "Evil;Name\nWith\r\nBreaks\t<tag attr=\"x\"> & 'quotes'",
        "",
        "Lambda 42",
        "\u{0}\u{1b}[31mred",
        "  ",
    ];
    let functions: Vec<u32> = names
        .iter()
        .map(|n| b.function(function(n, "Mödule.dll")))
        .collect();
    let thread = |n: LabelValue| vec![(THREAD_ID_LABEL.to_string(), n)];
    b.add(
        functions.clone(),
        thread(LabelValue::Num(1)),
        &[1, 1_000_000],
    );
    b.add(vec![], thread(LabelValue::Num(1)), &[2, 2_000_000]);
    b.add(
        vec![functions[3]],
        thread(LabelValue::Str("worker;1\nx".into())),
        &[1, 1_000_000],
    );
    b.add(vec![functions[1]], vec![], &[1, 1_000_000]);
    b.add(vec![functions[5]], vec![], &[1, 1_000_000]);
    let profile = b.build();

    for format in FORMATS {
        for thread_label in [false, true] {
            let out = export(&profile, format, &options(thread_label))
                .unwrap_or_else(|e| panic!("{format}: {e}"));
            match format {
                Format::Folded => {
                    assert_eq!(out.lines().count(), if thread_label { 5 } else { 4 });
                    for line in out.lines() {
                        let (stack, count) = line.rsplit_once(' ').unwrap();
                        count.parse::<u64>().unwrap();
                        assert!(!stack.is_empty());
                        assert!(!stack.split(';').any(str::is_empty), "{line}");
                        assert!(!stack.chars().any(char::is_control), "{line:?}");
                    }
                    assert!(out.contains("Evil:Name\u{FFFD}With"));
                    assert!(out.contains("Lambda\u{A0}42 1000000\n"));
                    if thread_label {
                        assert!(out.contains("thread_id=1;[unknown] 2000000\n"));
                        assert!(out.contains("no thread_id;[unknown] 1000000\n"));
                    } else {
                        // The empty stack and the blank name.
                        assert!(out.contains("\n[unknown] 3000000\n"));
                    }
                    if thread_label {
                        assert!(out.contains("thread_id=worker:1\u{FFFD}x;Lambda\u{A0}42"));
                        assert!(out.contains("no thread_id;Evil:Name"));
                    }
                }
                Format::Speedscope => {
                    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
                    let frames = json["shared"]["frames"].as_array().unwrap();
                    assert_eq!(frames[0]["name"], names[0], "names kept as they are");
                    assert_eq!(frames[1]["name"], names[1]);
                    assert_eq!(frames[0]["file"], "Mödule.dll");
                    let profiles = json["profiles"].as_array().unwrap();
                    assert_eq!(profiles.len(), if thread_label { 6 } else { 2 });
                }
                Format::Svg => {
                    assert!(out.starts_with("<?xml"));
                    assert!(out.contains("Ünïcødé.Méthode(日本語, System.String)"));
                    assert!(out.contains("&lt;tag attr=&quot;x&quot;&gt; &amp; &apos;quotes&apos;"));
                    assert!(!out.contains('\u{1b}'));
                }
                Format::Pprof => {
                    let p = decode(&encode_pprof(&profile).unwrap());
                    assert!(p.string_table.iter().any(|s| s == names[1]));
                    assert!(p.sample.iter().any(|s| s.location_id.is_empty()));
                }
            }
        }
    }
}

#[test]
fn huge_and_negative_values_neither_overflow_nor_reach_viewers() {
    let mut b = cpu_builder();
    let f: Vec<u32> = (0..4)
        .map(|i| b.function(function(&format!("F{i}"), "m.dll")))
        .collect();
    for &leaf in &f {
        b.add(vec![leaf], vec![], &[i64::MAX, i64::MAX]);
        b.add(vec![leaf, f[0]], vec![], &[i64::MAX, i64::MAX]);
    }
    // Another sample of the stack `F1` (other labels): folded adds them up, saturating.
    b.add(
        vec![f[1]],
        vec![("x".into(), LabelValue::Num(1))],
        &[i64::MAX, i64::MAX],
    );
    b.add(vec![f[2], f[1]], vec![], &[-5, -5]);
    b.add(vec![f[3], f[2]], vec![], &[0, 0]);
    b.add(vec![f[3], f[1]], vec![], &[i64::MIN, i64::MIN]);
    let profile = b.build();

    for format in FORMATS {
        for thread_label in [false, true] {
            export(&profile, format, &options(thread_label))
                .unwrap_or_else(|e| panic!("{format}: {e}"));
        }
    }
    let folded = export(&profile, Format::Folded, &ExportOptions::default()).unwrap();
    assert!(folded.contains(&format!("F1 {}\n", i64::MAX)), "{folded}");
    assert!(!folded.contains("F1;F2 ") && !folded.contains("F2;F3") && !folded.contains("F1;F3"));
    assert!(!folded.contains('-'));

    let json: serde_json::Value = serde_json::from_str(
        &export(&profile, Format::Speedscope, &ExportOptions::default()).unwrap(),
    )
    .unwrap();
    for p in json["profiles"].as_array().unwrap() {
        assert_eq!(p["endValue"], i64::MAX, "the total saturates");
        assert!(p["weights"]
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w.as_i64().unwrap() > 0));
    }

    let svg = export(&profile, Format::Svg, &ExportOptions::default()).unwrap();
    assert!(svg.contains("F3 ("), "the huge values are drawn, scaled");
}
