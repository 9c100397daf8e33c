//! Typed decoders against payloads laid out by hand from the manifest templates.

use super::*;
use crate::testutil::{scalar_fields, utf16z, EventSpec, MetadataRecord, StreamBuilder};
use crate::Parser;
use profile::guid::Guid;
use profile::log::LogLevel;

/// Decodes one event of `provider`/`id` (minimal metadata unless `name` is given).
fn decode_with(
    pointer_size: u32,
    provider: &str,
    id: u32,
    name: &str,
    version: u32,
    fields: Option<Vec<u8>>,
    payload: Vec<u8>,
) -> Result<Option<KnownEvent>, NettraceError> {
    let mut b = StreamBuilder::new(pointer_size);
    let mut m = MetadataRecord::new(1, provider, id, name).version(version);
    m = match fields {
        Some(f) => m.raw_fields(f),
        None => m.no_field_list(),
    };
    b.metadata_block(&[m.encode()], true);
    b.event_block(&[EventSpec::new(1, 1, 1, 10, payload)], true);
    let mut p = Parser::new();
    p.feed(&b.finish()).unwrap();
    let ev = p.next_event().unwrap().unwrap();
    ev.known()
}

fn runtime(id: u32, version: u32, payload: Vec<u8>) -> Result<Option<KnownEvent>, NettraceError> {
    decode_with(8, RUNTIME_PROVIDER, id, "", version, None, payload)
}

fn method_payload(version: u32) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend(0x1111u64.to_le_bytes()); // MethodID
    p.extend(0x2222u64.to_le_bytes()); // ModuleID
    p.extend(0x7f00_0000_4000u64.to_le_bytes()); // MethodStartAddress
    p.extend(0x80u32.to_le_bytes()); // MethodSize
    p.extend(0x0600_0001u32.to_le_bytes()); // MethodToken
    p.extend((0x8u32 | (4 << 7)).to_le_bytes()); // MethodFlags: Jitted, tier 1
    p.extend(utf16z("Ns.Type"));
    p.extend(utf16z("Run"));
    p.extend(utf16z("void  ()"));
    if version >= 1 {
        p.extend(3u16.to_le_bytes()); // ClrInstanceID
    }
    if version >= 2 {
        p.extend(9u64.to_le_bytes()); // ReJITID
    }
    p
}

#[test]
fn method_load_and_rundown_ids() {
    let Some(KnownEvent::Method(m)) = runtime(143, 2, method_payload(2)).unwrap() else {
        panic!()
    };
    assert_eq!(m.kind, MethodEventKind::Load);
    assert_eq!(
        (m.method_id, m.module_id, m.start_address),
        (0x1111, 0x2222, 0x7f00_0000_4000)
    );
    assert_eq!((m.size, m.token), (0x80, 0x0600_0001));
    assert_eq!((m.namespace.as_str(), m.name.as_str()), ("Ns.Type", "Run"));
    assert_eq!(m.signature, "void  ()");
    assert_eq!((m.clr_instance_id, m.rejit_id), (Some(3), Some(9)));
    assert!(m.is_jitted());
    // Tier bits 7-9 hold 4 (tier 1); the symbolizer interprets them.
    assert_eq!((m.flags >> 7) & 0x7, 4);
    // Version 0: no ClrInstanceID, no ReJITID.
    let Some(KnownEvent::Method(m)) = runtime(144, 0, method_payload(0)).unwrap() else {
        panic!()
    };
    assert_eq!(m.kind, MethodEventKind::Unload);
    assert_eq!((m.clr_instance_id, m.rejit_id), (None, None));
    // Rundown provider: 143/144 are DCStart/DCEnd.
    for (id, kind) in [
        (143, MethodEventKind::DcStart),
        (144, MethodEventKind::DcEnd),
    ] {
        let ev = decode_with(8, RUNDOWN_PROVIDER, id, "", 1, None, method_payload(1));
        let Some(KnownEvent::Method(m)) = ev.unwrap() else {
            panic!()
        };
        assert_eq!(m.kind, kind);
    }
    // A payload shorter than its version promises names the event, version and offset.
    let e = runtime(143, 2, method_payload(1)).unwrap_err().to_string();
    assert!(
        e.contains("Microsoft-Windows-DotNETRuntime/#143 (version 2)") && e.contains("offset"),
        "{e}"
    );
}

#[test]
fn module_events() {
    let mut p = Vec::new();
    p.extend(0xaaaau64.to_le_bytes()); // ModuleID
    p.extend(0xbbbbu64.to_le_bytes()); // AssemblyID
    p.extend(0x28u32.to_le_bytes()); // ModuleFlags: Manifest | ReadyToRun
    p.extend(0u32.to_le_bytes()); // Reserved1
    p.extend(utf16z("/app/App.dll"));
    p.extend(utf16z(""));
    p.extend(0u16.to_le_bytes()); // ClrInstanceID
    p.extend([7u8; 16]); // ManagedPdbSignature
    p.extend(1u32.to_le_bytes());
    p.extend(utf16z("/src/App.pdb"));
    p.extend([0u8; 16]); // NativePdbSignature
    p.extend(0u32.to_le_bytes());
    p.extend(utf16z(""));
    let Some(KnownEvent::Module(m)) = runtime(152, 2, p.clone()).unwrap() else {
        panic!()
    };
    assert_eq!(m.kind, ModuleEventKind::Load);
    assert_eq!((m.module_id, m.assembly_id), (0xaaaa, 0xbbbb));
    assert!(m.is_ready_to_run());
    assert_eq!(m.il_path, "/app/App.dll");
    let pdb = m.managed_pdb.unwrap();
    assert_eq!((pdb.age, pdb.build_path.as_str()), (1, "/src/App.pdb"));
    assert_eq!(pdb.signature, Guid::from_bytes_le([7; 16]));
    for (id, kind) in [
        (153, ModuleEventKind::DcStart),
        (154, ModuleEventKind::DcEnd),
    ] {
        let ev = decode_with(8, RUNDOWN_PROVIDER, id, "", 2, None, p.clone());
        let Some(KnownEvent::Module(m)) = ev.unwrap() else {
            panic!()
        };
        assert_eq!(m.kind, kind);
    }
    let Some(KnownEvent::Module(m)) = runtime(153, 2, p).unwrap() else {
        panic!()
    };
    assert_eq!(m.kind, ModuleEventKind::Unload);
}

#[test]
fn r2r_entry_point_events() {
    let mut p = Vec::new();
    p.extend(0x1111u64.to_le_bytes()); // MethodID
    p.extend(utf16z("System.Threading.Thread"));
    p.extend(utf16z("StartCallback"));
    p.extend(utf16z("instance void  ()"));
    p.extend(0x7f00_0010_2000u64.to_le_bytes()); // EntryPoint
    p.extend(0u16.to_le_bytes()); // ClrInstanceID
    let Some(KnownEvent::R2rEntryPoint(e)) = runtime(159, 0, p.clone()).unwrap() else {
        panic!()
    };
    assert_eq!((e.method_id, e.entry_point), (0x1111, 0x7f00_0010_2000));
    assert_eq!(
        (e.namespace.as_str(), e.name.as_str(), e.signature.as_str()),
        (
            "System.Threading.Thread",
            "StartCallback",
            "instance void  ()"
        )
    );
    // Cut before the entry point: an error, never a guessed address.
    assert!(runtime(159, 0, p[..p.len() - 6].to_vec()).is_err());
}

fn alloc_payload(version: u32, pointer: usize) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend(100_000u32.to_le_bytes()); // AllocationAmount
    p.extend(1u32.to_le_bytes()); // AllocationKind: Large
    if version >= 1 {
        p.extend(0u16.to_le_bytes());
    }
    if version >= 2 {
        p.extend(100_000u64.to_le_bytes()); // AllocationAmount64
        p.extend(&0x5555u64.to_le_bytes()[..pointer]); // TypeID
        p.extend(utf16z("System.Byte[]"));
        p.extend(2u32.to_le_bytes()); // HeapIndex
    }
    if version >= 3 {
        p.extend(&0x6666u64.to_le_bytes()[..pointer]); // Address
    }
    if version >= 4 {
        p.extend(85_000u64.to_le_bytes()); // ObjectSize
    }
    p
}

#[test]
fn allocation_tick_versions_and_pointer_sizes() {
    for pointer in [8u32, 4] {
        for version in [2, 3, 4] {
            let ev = decode_with(
                pointer,
                RUNTIME_PROVIDER,
                10,
                "",
                version,
                None,
                alloc_payload(version, pointer as usize),
            );
            let Some(KnownEvent::AllocationTick(a)) = ev.unwrap() else {
                panic!()
            };
            assert_eq!(a.kind, AllocationKind::Large);
            assert_eq!(a.bytes(), 100_000);
            assert_eq!(a.type_id, Some(0x5555));
            assert_eq!(a.type_name.as_deref(), Some("System.Byte[]"));
            assert_eq!(a.heap_index, Some(2));
            assert_eq!(a.address, (version >= 3).then_some(0x6666));
            assert_eq!(a.object_size, (version >= 4).then_some(85_000));
        }
    }
}

#[test]
fn exception_and_contention() {
    let mut p = Vec::new();
    p.extend(utf16z("System.InvalidOperationException"));
    p.extend(utf16z("boom"));
    p.extend(0x7f00_1234u64.to_le_bytes()); // ExceptionEIP
    p.extend(0x8013_1509u32.to_le_bytes()); // HRESULT
    p.extend(0x10u16.to_le_bytes()); // flags
    p.extend(0u16.to_le_bytes());
    let Some(KnownEvent::ExceptionThrown(x)) = runtime(80, 1, p).unwrap() else {
        panic!()
    };
    assert_eq!(x.exception_type, "System.InvalidOperationException");
    assert_eq!(
        (x.message.as_str(), x.eip, x.hresult),
        ("boom", 0x7f00_1234, 0x8013_1509)
    );

    let mut p = vec![0u8]; // ContentionFlags: managed
    p.extend(0u16.to_le_bytes());
    p.extend(0xa0u64.to_le_bytes()); // LockID
    p.extend(0xb0u64.to_le_bytes()); // AssociatedObjectID
    p.extend(77u64.to_le_bytes()); // LockOwnerThreadID
    let Some(KnownEvent::ContentionStart(c)) = runtime(81, 2, p).unwrap() else {
        panic!()
    };
    assert_eq!(
        (c.lock_id, c.associated_object_id, c.lock_owner_thread_id),
        (Some(0xa0), Some(0xb0), Some(77))
    );
    let Some(KnownEvent::ContentionStart(c)) = runtime(81, 1, vec![1, 0, 0]).unwrap() else {
        panic!()
    };
    assert_eq!((c.flags, c.lock_id), (1, None));

    let mut p = vec![0u8, 0, 0];
    p.extend(1500.0f64.to_le_bytes());
    let Some(KnownEvent::ContentionStop(c)) = runtime(91, 1, p).unwrap() else {
        panic!()
    };
    assert_eq!(c.duration_ns, Some(1500.0));
}

#[test]
fn thread_sample_kinds() {
    for (v, kind) in [
        (0, SampleKind::Error),
        (1, SampleKind::External),
        (2, SampleKind::Managed),
        (9, SampleKind::Other(9)),
    ] {
        let ev = decode_with(
            8,
            SAMPLE_PROFILER_PROVIDER,
            0,
            "",
            0,
            None,
            u32::to_le_bytes(v).to_vec(),
        );
        assert_eq!(
            ev.unwrap(),
            Some(KnownEvent::ThreadSample(ThreadSample { kind }))
        );
    }
    assert!(decode_with(8, SAMPLE_PROFILER_PROVIDER, 0, "", 0, None, vec![1]).is_err());
}

#[test]
fn unknown_runtime_events_are_none() {
    assert_eq!(runtime(1, 0, vec![1, 2, 3]).unwrap(), None);
    assert_eq!(
        EventKind::classify("Other", 143, ""),
        EventKind::Unknown,
        "ids only count on the runtime providers"
    );
}

#[test]
fn diagnostic_source_from_v4_metadata_without_fields() {
    // Old writers could not describe the Arguments array: the well-known layout applies.
    let mut p = utf16z("Microsoft.AspNetCore");
    p.extend(utf16z("Microsoft.AspNetCore.Hosting.HttpRequestIn.Start"));
    p.extend(2u16.to_le_bytes());
    for s in ["Path", "/api", "Method", "GET"] {
        p.extend(utf16z(s));
    }
    let ev = decode_with(
        8,
        DIAGNOSTIC_SOURCE_PROVIDER,
        3,
        "Activity1Start",
        0,
        Some(0i32.to_le_bytes().to_vec()),
        p,
    );
    let Some(KnownEvent::DiagnosticSource(d)) = ev.unwrap() else {
        panic!()
    };
    assert_eq!(d.kind, DiagnosticSourceKind::Activity1Start);
    assert!(d.kind.is_start() && !d.kind.is_stop());
    assert_eq!(d.source_name, "Microsoft.AspNetCore");
    assert_eq!(d.argument("Method"), Some("GET"));
    assert_eq!(d.arguments.len(), 2);
}

#[test]
fn tpl_set_activity_id() {
    let id = Guid::from_fields(0x1012, 0, 0, [0, 0, 0, 0, 0xdf, 0xba, 0x9d, 0x59]);
    let fields = scalar_fields(&[(17, "NewId")]);
    let ev = decode_with(
        8,
        TPL_PROVIDER,
        25,
        "SetActivityId",
        0,
        Some(fields.clone()),
        id.to_bytes_le().to_vec(),
    );
    assert_eq!(
        ev.unwrap(),
        Some(KnownEvent::ThreadActivityChange(ThreadActivityChange {
            new_id: id
        }))
    );
    // A short payload is an error naming the event, never a panic.
    let err = decode_with(
        8,
        TPL_PROVIDER,
        25,
        "SetActivityId",
        0,
        Some(fields),
        vec![1; 15],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("SetActivityId"), "{err}");
    // Other TPL events are not decoded.
    assert_eq!(
        EventKind::classify(TPL_PROVIDER, 10, "TaskWaitBegin"),
        EventKind::Unknown
    );
}

/// The real provider's events as each runtime of the matrix writes them (`tests/golden/logging/
/// layout-net<major>.json`, recorded from Microsoft.Extensions.Logging.EventSource by the suite's
/// `signals::the_real_providers_layout_matches_its_golden_file`): each event clrscope reads, laid out
/// as recorded with its recorded example's values, decodes to those values (the trace ids where
/// the runtime's package writes them); the Message event (struct and array fields) is not read.
#[test]
fn logging_events_from_the_golden_layouts() {
    let goldens = [
        include_str!("../../../../tests/golden/logging/layout-net8.json"),
        include_str!("../../../../tests/golden/logging/layout-net9.json"),
        include_str!("../../../../tests/golden/logging/layout-net10.json"),
        include_str!("../../../../tests/golden/logging/layout-net11.json"),
    ];
    for (major, text) in [8, 9, 10, 11].into_iter().zip(goldens) {
        let golden: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(golden["provider"], LOGGING_PROVIDER);
        let mut read = 0;
        for (name, event) in golden["events"].as_object().unwrap() {
            let what = format!(".NET {major} {name}");
            let fields: Vec<(&str, &str)> = event["fields"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f.as_str().unwrap().split_once(": ").unwrap())
                .collect();
            if EventKind::classify(LOGGING_PROVIDER, 0, name) == EventKind::Unknown {
                assert_eq!(name, "Message", "{what} is not read");
                continue;
            }
            read += 1;
            let example = &event["example"];
            // The example's placeholders as a run would have them.
            let trace_id = "0af7651916cd43dd8448eb211c80319c";
            let span_id = "b7ad6b7169203331";
            let value = |field: &str| -> Vec<u8> {
                let v = &example[field];
                if let Some(n) = v.as_i64() {
                    return (n as i32).to_le_bytes().to_vec();
                }
                let s = v
                    .as_str()
                    .unwrap_or_else(|| panic!("{what}: {field} = {v}"));
                match s {
                    "{scope id}" => 17i32.to_le_bytes().to_vec(),
                    "<32 hex>" => utf16z(trace_id),
                    "<16 hex>" => utf16z(span_id),
                    s => utf16z(&s.replace("{seq}", "708").replace("{span}", "177")),
                }
            };
            let list: Vec<(i32, &str)> = fields
                .iter()
                .map(|(n, t)| match *t {
                    "I32" => (9, *n),
                    "String" => (18, *n),
                    other => panic!("{what}: a field of type {other} to read"),
                })
                .collect();
            let payload = fields.iter().flat_map(|(n, _)| value(n)).collect();
            // On the wire the ids are TraceLogging's, assigned in order of first write.
            let decoded = decode_with(
                8,
                LOGGING_PROVIDER,
                read,
                name,
                event["version"].as_u64().unwrap() as u32,
                Some(scalar_fields(&list)),
                payload,
            )
            .unwrap()
            .unwrap_or_else(|| panic!("{what} did not decode"));
            let KnownEvent::Logging(logging) = decoded else {
                panic!("{what}: {decoded:?}")
            };
            match logging {
                LoggingEvent::Message(m) => {
                    assert_eq!(
                        (m.level, m.category.as_str(), m.event_id),
                        (LogLevel::Error, "Logs.Orders", 1004),
                        "{what}"
                    );
                    assert_eq!(
                        (m.event_name.as_str(), m.message.as_str()),
                        ("OrderLogged", "Order 708 for c1 costs 8.5"),
                        "{what}"
                    );
                    // The package of .NET 9 and later writes the Activity's ids; 8.x does not.
                    let ids = m
                        .trace
                        .map(|t| (t.trace_id.to_string(), t.span_id.to_string(), t.flags));
                    let expected =
                        (major >= 9).then(|| (trace_id.to_string(), span_id.to_string(), 1));
                    assert_eq!(ids, expected, "{what}");
                    if name == "MessageJson" {
                        let e = m.exception.unwrap();
                        assert_eq!(
                            (e.type_name.as_str(), e.message.as_str(), e.hresult),
                            (
                                "Logs.Payments.PaymentDeclinedException",
                                "declined #708",
                                Some(-2146233088)
                            ),
                            "{what}"
                        );
                        assert_eq!(
                            e.verbose_message,
                            "Logs.Payments.PaymentDeclinedException: declined #708"
                        );
                        let arguments: Vec<(&str, &str)> = m
                            .arguments
                            .iter()
                            .map(|(k, v)| (k.as_str(), v.as_str()))
                            .collect();
                        assert_eq!(
                            arguments,
                            [
                                ("OrderId", "708"),
                                ("Customer", "c1"),
                                ("Amount", "8.5"),
                                (
                                    "{OriginalFormat}",
                                    "Order {OrderId} for {Customer} costs {Amount}"
                                )
                            ],
                            "{what}"
                        );
                    }
                }
                LoggingEvent::ScopeStart {
                    id,
                    category,
                    values,
                } => {
                    assert_eq!((id, category.as_str()), (17, "Logs.Orders"), "{what}");
                    assert_eq!(values[0], ("Batch".to_string(), "177".to_string()));
                }
                LoggingEvent::ScopeStop { id, .. } => assert_eq!(id, 17, "{what}"),
            }
        }
        assert_eq!(read, 4, ".NET {major}: the events clrscope reads");
    }
    // A truncated payload is an error or no event, never a panic; a level of None is no message.
    let list = [(9, "Level"), (9, "FactoryID"), (18, "LoggerName")];
    let short = decode_with(
        8,
        LOGGING_PROVIDER,
        5,
        "MessageJson",
        0,
        Some(scalar_fields(&list)),
        vec![4, 0],
    );
    assert!(!matches!(short, Ok(Some(_))));
    let mut none_level = 6i32.to_le_bytes().to_vec();
    none_level.extend(1i32.to_le_bytes());
    none_level.extend(utf16z("x"));
    let none = decode_with(
        8,
        LOGGING_PROVIDER,
        5,
        "MessageJson",
        0,
        Some(scalar_fields(&list)),
        none_level,
    );
    assert_eq!(none.unwrap(), None);
}

/// Issue 44: what a target sends is cut before anything keeps or queues it: an exception's type
/// and message and a meter's texts as log text is, a meter's tags and a scope's values to the
/// arguments one event keeps.
#[test]
fn texts_a_target_sends_are_cut_as_log_text_is() {
    let long = "\u{20ac}".repeat(100_000);
    let cut = |text: &str| text.len() <= MAX_TEXT_BYTES && long.starts_with(text);
    let mut p = utf16z(&long);
    p.extend(utf16z(&long));
    p.extend(0x7f00_1234u64.to_le_bytes());
    p.extend([0; 8]);
    let Some(KnownEvent::ExceptionThrown(x)) = runtime(80, 1, p).unwrap() else {
        panic!()
    };
    assert!(
        cut(&x.exception_type) && cut(&x.message),
        "{}",
        x.message.len()
    );
    assert!(x.message.len() > MAX_TEXT_BYTES - 3);

    let names = [
        "sessionId",
        "meterName",
        "meterVersion",
        "instrumentName",
        "unit",
        "tags",
        "rate",
    ];
    let fields: Vec<(i32, &str)> = names.iter().map(|n| (18, *n)).collect();
    let tags = vec!["k=v"; 10_000].join(",");
    let payload = ["SHARED", "M", &long, &long, &long, &tags, "1"]
        .iter()
        .flat_map(|v| utf16z(v))
        .collect();
    let metric = decode_with(
        8,
        METRICS_PROVIDER,
        4,
        "CounterRateValuePublished",
        0,
        Some(scalar_fields(&fields)),
        payload,
    );
    let Some(KnownEvent::Metrics(MetricsEvent::Published(m))) = metric.unwrap() else {
        panic!()
    };
    assert!(cut(&m.meter_version) && cut(&m.instrument_name) && cut(&m.unit));
    assert!(m.tags.len() <= MAX_TEXT_BYTES);
    assert_eq!(m.tag_pairs().count(), MAX_ARGUMENTS);

    let values: serde_json::Map<String, serde_json::Value> = (0..30)
        .map(|i| (format!("v{i}"), "x".repeat(16_000).into()))
        .collect();
    let mut p = 1i32.to_le_bytes().to_vec();
    p.extend(1i32.to_le_bytes());
    p.extend(utf16z("Scopes"));
    p.extend(utf16z(&serde_json::Value::Object(values).to_string()));
    let list = [
        (9, "ID"),
        (9, "FactoryID"),
        (18, "LoggerName"),
        (18, "ArgumentsJson"),
    ];
    let scope = decode_with(
        8,
        LOGGING_PROVIDER,
        6,
        "ActivityJsonStart",
        0,
        Some(scalar_fields(&list)),
        p,
    );
    let Some(KnownEvent::Logging(LoggingEvent::ScopeStart { values, .. })) = scope.unwrap() else {
        panic!()
    };
    let total: usize = values.iter().map(|(k, v)| k.len() + v.len()).sum();
    assert_eq!(total, logging::MAX_ARGUMENTS_BYTES);
    assert_eq!(values[0].1.len(), 16_000);
}
