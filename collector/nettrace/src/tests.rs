//! Stream-level tests: hand-written bytes, builder-made streams, truncation and corruption
//! sweeps, chunking equivalence, and the real .NET 8 fixtures in `collector/tests/fixtures`.

use super::events::{KnownEvent, SampleKind};
use super::testutil::{builder_stream, utf16z, EventSpec, MetadataRecord, StreamBuilder};
use super::*;
use profile::guid::Guid;

/// Hex with `//` comments and whitespace ignored.
fn hex(s: &str) -> Vec<u8> {
    let digits: String = s
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .flat_map(|l| l.chars().filter(|c| c.is_ascii_hexdigit()))
        .collect();
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
        .collect()
}

/// A complete minimal stream, byte by byte, offsets in the comments.
fn hand_written_stream() -> Vec<u8> {
    let mut s = hex("
        4e 65 74 74 72 61 63 65        // @0   \"Nettrace\"
        14 00 00 00                    // @8   i32 20
        21 46 61 73 74 53 65 72 69 61 6c 69 7a 61 74 69 6f 6e 2e 31  // \"!FastSerialization.1\"
        05                             // @32  BeginPrivateObject (Trace)
        05 01                          //      type: BeginPrivateObject, NullReference
        04 00 00 00  04 00 00 00       //      version 4, minReaderVersion 4
        05 00 00 00  54 72 61 63 65    //      name length 5, \"Trace\"
        06                             //      EndObject (type)
        ea 07 01 00 05 00 02 00        // @53  SyncTimeUTC 2026-01 (Friday) 02
        03 00 04 00 05 00 06 00        //      03:04:05.006
        e8 03 00 00 00 00 00 00        // @69  SyncTimeQPC 1000
        00 ca 9a 3b 00 00 00 00        //      QPCFrequency 1e9
        08 00 00 00  92 10 00 00       // @85  PointerSize 8, ProcessId 4242
        02 00 00 00  40 42 0f 00       //      NumberOfProcessors 2, ExpectedCPUSamplingRate 1 ms
        06                             // @101 EndObject (Trace)
        05 05 01 02 00 00 00 02 00 00 00 0d 00 00 00  // @102 MetadataBlock v2/2, name length 13
        4d 65 74 61 64 61 74 61 42 6c 6f 63 6b 06     //      \"MetadataBlock\", EndObject
        7d 00 00 00                    // @131 BlockSize 125
        00                             // @135 padding to offset 136
        14 00 01 00                    // @136 HeaderSize 20, Flags 1 (compressed)
        00 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00 // min/max timestamp
        80 00 66                       // @156 flags: payload size; timestamp delta 0; size 102
        01 00 00 00                    // @159 MetadataId 1
        ");
    s.extend(utf16z("Microsoft-DotNETCore-SampleProfiler")); // @163, 72 bytes
    s.extend(hex(
        "
        00 00 00 00                    // @235 EventId 0
        00 00                          //      EventName \"\"
        00 00 00 00 00 00 00 00        //      Keywords 0
        00 00 00 00  04 00 00 00       //      Version 0, Level 4
        00 00 00 00                    //      FieldCount 0 (minimum metadata)
        06                             // @261 EndObject
        05 05 01 02 00 00 00 02 00 00 00 0a 00 00 00  // @262 StackBlock
        53 74 61 63 6b 42 6c 6f 63 6b 06
        1c 00 00 00                    // @288 BlockSize 28, already aligned
        01 00 00 00  01 00 00 00       // @292 FirstId 1, Count 1
        10 00 00 00                    //      stack 1: 16 bytes
        00 10 00 00 00 7f 00 00        //      IP 0x7f0000001000 (leaf)
        00 20 00 00 00 7f 00 00        //      IP 0x7f0000002000
        06                             // @320 EndObject
        05 05 01 02 00 00 00 02 00 00 00 0a 00 00 00  // @321 EventBlock
        45 76 65 6e 74 42 6c 6f 63 6b 06
        22 00 00 00                    // @347 BlockSize 34
        00                             // @351 padding to 352
        14 00 01 00                    // @352 HeaderSize 20, compressed
        d0 07 00 00 00 00 00 00  d0 07 00 00 00 00 00 00 // min/max timestamp 2000
        cf                             // @372 flags: metadata, seq+capture, thread, stack, sorted, size
        01                             //      MetadataId 1
        00 07 01                       //      seq delta 0 (→ 1), capture thread 7, processor 1
        2b                             //      ThreadId 43
        01                             //      StackId 1
        d0 0f                          //      timestamp delta 2000
        04                             //      PayloadSize 4
        02 00 00 00                    // @382 Type = 2 (Managed)
        06                             // @386 EndObject
        05 05 01 02 00 00 00 02 00 00 00 07 00 00 00  // @387 SPBlock
        53 50 42 6c 6f 63 6b 06
        18 00 00 00                    // @410 BlockSize 24
        00 00                          // @414 padding to 416
        b8 0b 00 00 00 00 00 00        // @416 timestamp 3000
        01 00 00 00                    //      1 thread
        07 00 00 00 00 00 00 00  01 00 00 00 // thread 7, sequence 1
        06                             // @440 EndObject
        01                             // @441 NullReference: end of stream
        ",
    ));
    s
}

/// Everything observable about one event, owned, to compare parses.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    offset: u64,
    header: EventHeader,
    name: String,
    payload: Vec<u8>,
    stack: Option<Vec<u64>>,
    utc: i64,
    known: Option<String>,
}

fn seen(ev: &Event<'_>) -> Seen {
    Seen {
        offset: ev.offset,
        header: *ev.header,
        name: ev.metadata.display_name(),
        payload: ev.payload.to_vec(),
        stack: ev.stack().map(|s| s.ips().collect()),
        utc: ev.unix_nanos(),
        known: ev.known().map(|k| format!("{k:?}")).ok(),
    }
}

/// Parses `data` fed in `chunk`-sized pieces; returns the events and the final verdict.
fn parse_chunked(data: &[u8], chunk: usize) -> (Vec<Seen>, Result<(), NettraceError>, Parser) {
    let mut p = Parser::new();
    let mut out = Vec::new();
    for piece in data.chunks(chunk.max(1)) {
        if let Err(e) = p.feed(piece) {
            return (out, Err(e), p);
        }
        loop {
            match p.next_event() {
                Ok(Some(ev)) => out.push(seen(&ev)),
                Ok(None) => break,
                Err(e) => return (out, Err(e), p),
            }
        }
    }
    let r = p.finish();
    (out, r, p)
}

#[test]
fn hand_written_stream_parses() {
    let data = hand_written_stream();
    assert_eq!(data.len(), 442);
    let (events, r, p) = parse_chunked(&data, data.len());
    r.unwrap();
    let t = p.trace().unwrap();
    assert_eq!(
        (t.pointer_size, t.process_id, t.number_of_processors),
        (8, 4242, 2)
    );
    assert_eq!((t.sync_time_qpc, t.qpc_frequency), (1000, 1_000_000_000));
    assert_eq!(t.expected_cpu_sampling_rate, 1_000_000);
    assert_eq!(events.len(), 1);
    let e = &events[0];
    assert_eq!(e.offset, 372);
    assert_eq!(e.header.metadata_id, 1);
    assert_eq!(e.header.sequence_number, 1);
    assert_eq!((e.header.capture_thread_id, e.header.thread_id), (7, 43));
    assert_eq!(e.header.processor_number, 1);
    assert!(e.header.is_sorted);
    assert_eq!(e.stack, Some(vec![0x7f00_0000_1000, 0x7f00_0000_2000]));
    // 2026-01-02T03:04:05.006Z + (2000 - 1000) ns
    assert_eq!(e.utc, 1_767_323_045_006_001_000);
    assert_eq!(
        e.known.as_deref(),
        Some("Some(ThreadSample(ThreadSample { kind: Managed }))")
    );
    let st = p.stats();
    assert_eq!(
        (
            st.metadata_blocks,
            st.event_blocks,
            st.stack_blocks,
            st.sequence_points
        ),
        (1, 1, 1, 1)
    );
    assert_eq!(st.bytes_parsed, 442);
    assert_eq!(p.dropped_events(), 0);
    assert!(p.is_finished());
}

#[test]
fn one_byte_chunks_match_whole_buffer() {
    for data in [
        hand_written_stream(),
        builder_stream(true),
        builder_stream(false),
    ] {
        let (whole, r1, _) = parse_chunked(&data, data.len());
        r1.unwrap();
        for chunk in [1, 2, 3, 7, 64, 4096] {
            let (pieces, r2, _) = parse_chunked(&data, chunk);
            r2.unwrap();
            assert_eq!(pieces, whole, "chunk size {chunk}");
        }
    }
}

#[test]
fn every_truncation_is_a_clean_error() {
    for data in [
        hand_written_stream(),
        builder_stream(true),
        builder_stream(false),
    ] {
        let (all, full, _) = parse_chunked(&data, data.len());
        full.unwrap();
        for len in 0..data.len() {
            let (events, r, _) = parse_chunked(&data[..len], data.len().max(1));
            let e = r.expect_err("a cut stream must not finish cleanly");
            assert!(
                matches!(e, NettraceError::Truncated { .. }),
                "len {len}: {e}"
            );
            assert!(events.len() <= all.len());
            assert_eq!(events[..], all[..events.len()], "len {len}");
        }
    }
}

#[test]
fn truncated_block_message_names_sizes() {
    let data = hand_written_stream();
    let (_, r, _) = parse_chunked(&data[..360], 4096);
    assert_eq!(
        r.unwrap_err().to_string(),
        "truncated EventBlock at offset 321: header says 34 bytes, stream ended after 8"
    );
}

#[test]
fn trailing_input_is_ignored_and_finish_wants_drained_events() {
    let data = hand_written_stream();
    let mut p = Parser::new();
    p.feed(&data[..400]).unwrap();
    // The EventBlock is complete: its event is pending until read.
    assert!(p.finish().is_err());
    assert!(p.next_event().unwrap().is_some());
    assert!(p.next_event().unwrap().is_none());
    p.feed(&data[400..]).unwrap();
    assert!(p.next_event().unwrap().is_none());
    p.finish().unwrap();
    p.feed(b"garbage after the end").unwrap();
    assert!(p.next_event().unwrap().is_none());
    assert_eq!(p.bytes_fed(), data.len() as u64);
}

#[test]
fn corrupted_bytes_never_panic() {
    let data = builder_stream(true);
    // Every byte flipped to a few values: each parse ends Ok or Err, never panics.
    for i in 0..data.len() {
        for v in [0x00, 0x01, 0x05, 0x7f, 0x80, 0xff] {
            let mut d = data.clone();
            d[i] = v;
            let _ = parse_chunked(&d, 97);
        }
    }
    // Pseudo-random multi-byte damage.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..2000 {
        let mut d = data.clone();
        for _ in 0..4 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x as usize) % d.len();
            d[i] = (x >> 32) as u8;
        }
        let _ = parse_chunked(&d, 1 + (x as usize % 300));
    }
}

#[test]
fn builder_stream_compressed_equals_uncompressed() {
    let (c, rc, pc) = parse_chunked(&builder_stream(true), 1 << 20);
    let (u, ru, pu) = parse_chunked(&builder_stream(false), 1 << 20);
    rc.unwrap();
    ru.unwrap();
    let strip = |v: &[Seen]| {
        v.iter()
            .map(|s| Seen {
                offset: 0,
                ..s.clone()
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&c), strip(&u));
    assert_eq!(c.len(), 6);
    assert_eq!(c[0].stack, Some(vec![0x1000, 0x2000, 0x3000]));
    assert_eq!(c[1].stack, Some(vec![0x4000]));
    assert_eq!(c[4].stack, Some(vec![0x9000]), "ids restart after an SP");
    assert_eq!(c[5].stack, None);
    assert!(!c[2].header.is_sorted);
    assert_eq!(c[2].header.activity_id, Guid::from_fields(1, 2, 3, [4; 8]));
    assert_eq!(c[3].header.activity_id, Guid::NIL);
    assert_eq!(c[3].header.sequence_number, 5);
    for p in [&pc, &pu] {
        assert_eq!(p.dropped_events(), 5);
        let mut by: Vec<_> = p.dropped_events_by_thread().collect();
        by.sort();
        assert_eq!(by, vec![(7, 2), (8, 3)]);
    }
}

#[test]
fn dynamic_decoding_of_self_described_events() {
    let data = builder_stream(true);
    let mut p = Parser::new();
    p.feed(&data).unwrap();
    let mut works = Vec::new();
    while let Some(ev) = p.next_event().unwrap() {
        if ev.metadata.event_name == "Work" {
            let v = ev.decode().unwrap();
            works.push((
                find(&v, "Id").and_then(Value::as_i64),
                find(&v, "What").and_then(|v| v.as_str().map(str::to_owned)),
            ));
            assert!(ev.known().unwrap().is_none());
        }
    }
    assert_eq!(
        works,
        vec![
            (Some(42), Some("a".into())),
            (Some(-1), Some(String::new()))
        ]
    );
    assert_eq!(p.metadata().len(), 2);
    assert_eq!(p.metadata_by_id(2).unwrap().version, 1);
}

#[test]
fn pointer_size_4_stacks() {
    let mut b = StreamBuilder::new(4);
    b.metadata_block(
        &[MetadataRecord::new(1, "Microsoft-DotNETCore-SampleProfiler", 0, "").encode()],
        true,
    );
    b.stack_block(1, &[&[0x1234, 0xffff_fff0]]);
    b.event_block(
        &[EventSpec::new(1, 1, 3, 5000, 1u32.to_le_bytes().to_vec()).stack(1)],
        true,
    );
    let (ev, r, p) = parse_chunked(&b.finish(), 10);
    r.unwrap();
    assert_eq!(p.trace().unwrap().pointer_size, 4);
    assert_eq!(ev[0].stack, Some(vec![0x1234, 0xffff_fff0]));
}

#[test]
fn framing_errors_are_specific() {
    let msg = |d: &[u8]| parse_chunked(d, 1 << 20).1.unwrap_err().to_string();
    assert!(msg(b"NotTrace").starts_with("not a nettrace stream"));
    // A future major version: "Nettrace", u32 0, u32 major 7, u32 minor 0.
    let mut v7 = b"Nettrace".to_vec();
    v7.extend(hex("00000000 07000000 00000000"));
    assert!(msg(&v7).contains("major version 7"), "{}", msg(&v7));
    // NetPerf: Trace object version 3.
    let mut old = hand_written_stream();
    old[35] = 3;
    assert!(msg(&old).contains("NetPerf"), "{}", msg(&old));
    // Unknown object type name.
    let mut unk = hand_written_stream();
    unk[117] = b'X'; // "MetadataBlock" → "XetadataBlock"
    assert!(msg(&unk).contains("unknown object type \"XetadataBlock\" at offset 102"));
    // Wrong end tag after a block.
    let mut tag = hand_written_stream();
    tag[261] = 9;
    assert!(msg(&tag).contains("offset 261"), "{}", msg(&tag));
}

#[test]
fn block_size_limit_names_offset() {
    let data = hand_written_stream();
    let mut p = Parser::with_options(ParserOptions {
        max_block_size: 100,
        ..ParserOptions::default()
    });
    p.feed(&data).unwrap();
    let e = p.next_event().unwrap_err();
    assert_eq!(
        e.to_string(),
        "MetadataBlock at offset 102 declares 125 bytes, above the limit of 100 bytes (raise ParserOptions::max_block_size if the stream is genuine)"
    );
    // The parser stays stopped and says why.
    let again = p.next_event().unwrap_err();
    assert!(
        matches!(again, NettraceError::Stopped { offset: 102, .. }),
        "{again}"
    );
    assert!(p.feed(b"x").is_err());
}

#[test]
fn unknown_metadata_id_is_an_error() {
    let mut b = StreamBuilder::new(8);
    b.event_block(&[EventSpec::new(9, 1, 1, 10, vec![])], true);
    let e = parse_chunked(&b.finish(), 1 << 20).1.unwrap_err();
    assert!(
        matches!(e, NettraceError::UnknownMetadata { metadata_id: 9, .. }),
        "{e}"
    );
}

#[test]
fn payload_overrunning_its_block_is_malformed() {
    let mut data = hand_written_stream();
    data[381] = 0x40; // PayloadSize 64 in a 34-byte block
    let e = parse_chunked(&data, 1 << 20).1.unwrap_err();
    assert!(
        e.to_string().contains("runs past the end of its block"),
        "{e}"
    );
}

fn fixture(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `app.nettrace`: 1.2 s of a real .NET 8.0.4 app (see tests/fixtures/README.md): sampler,
/// runtime GC|Exception|Contention at Verbose, System.Runtime counters, Metrics, DiagnosticSource.
#[test]
fn real_app_trace_decodes_fully() {
    let data = fixture("app.nettrace");
    let (events, r, p) = parse_chunked(&data, 65536);
    r.unwrap();
    let t = p.trace().unwrap();
    assert_eq!((t.pointer_size, t.qpc_frequency), (8, 1_000_000_000));
    assert_eq!(p.stats().events as usize, events.len());
    let mut samples = 0;
    let mut managed_with_stack = 0;
    let (mut alloc, mut exc, mut cstart, mut cstop, mut counters, mut diag) = (0, 0, 0, 0, 0, 0);
    let mut metrics = Vec::new();
    let mut parser = Parser::new();
    parser.feed(&data).unwrap();
    while let Some(ev) = parser.next_event().unwrap() {
        // Every event's time lies within a minute of the trace's sync time.
        assert!((ev.unix_nanos() - t.sync_time_unix_nanos()).abs() < 60_000_000_000);
        let known = ev.known().unwrap();
        // The samples' own decoder says what the general one does, of every event.
        let sampled = match &known {
            Some(KnownEvent::ThreadSample(s)) => Some(*s),
            _ => None,
        };
        assert_eq!(ev.thread_sample().unwrap(), sampled);
        let Some(k) = known else {
            continue;
        };
        match k {
            KnownEvent::ThreadSample(s) => {
                samples += 1;
                if s.kind == SampleKind::Managed && ev.stack().is_some_and(|s| !s.is_empty()) {
                    managed_with_stack += 1;
                }
            }
            KnownEvent::AllocationTick(a) => {
                alloc += 1;
                assert_eq!(ev.metadata.version, 4);
                assert!(a.object_size.is_some() && a.type_name.is_some());
            }
            KnownEvent::ExceptionThrown(x) => {
                exc += 1;
                assert_eq!(x.exception_type, "System.InvalidOperationException");
                assert_eq!(x.message, "boom");
            }
            KnownEvent::ContentionStart(c) => {
                cstart += 1;
                assert!(c.lock_id.is_some());
            }
            KnownEvent::ContentionStop(c) => {
                cstop += 1;
                assert!(c.duration_ns.unwrap() >= 0.0);
            }
            KnownEvent::EventCounter(c) => {
                counters += 1;
                assert_eq!(c.provider, "System.Runtime");
                assert!(!c.name.is_empty());
            }
            KnownEvent::Metrics(m) => metrics.push(m),
            KnownEvent::DiagnosticSource(d) => {
                diag += 1;
                assert_eq!(d.source_name, "Clrscope.Listener");
                assert_eq!(d.argument("Path"), Some("/a"));
                assert_eq!(d.argument("Status"), Some("200"));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(samples > 1000, "{samples}");
    assert!(managed_with_stack > 20, "{managed_with_stack}");
    assert!(alloc > 0 && exc > 0 && cstart > 0 && cstop > 0);
    assert!(counters > 0 && diag > 0);
    use super::events::{MetricValue, MetricsEvent};
    let histogram = metrics.iter().find_map(|m| match m {
        MetricsEvent::Published(p) if p.instrument_name == "latency" => Some(p.value.clone()),
        _ => None,
    });
    let Some(MetricValue::Histogram {
        quantiles, count, ..
    }) = histogram
    else {
        panic!("no latency histogram in {metrics:?}")
    };
    assert_eq!(quantiles.len(), 3);
    assert!(count.unwrap() > 0);
    let counter = metrics.iter().find_map(|m| match m {
        MetricsEvent::Published(p) if p.instrument_name == "requests" => Some(p.clone()),
        _ => None,
    });
    let counter = counter.unwrap();
    assert_eq!(
        counter.tag_pairs().collect::<Vec<_>>(),
        vec![("route", "/a")]
    );
    assert_eq!(p.dropped_events(), 0);
}

/// `jit.nettrace`: a tiny .NET 8 app with runtime Jit|Loader|Exception at Verbose.
#[test]
fn real_jit_trace_has_method_loads() {
    let data = fixture("jit.nettrace");
    let mut r = NettraceReader::new(&data[..]);
    let mut loads = Vec::new();
    while let Some(ev) = r.next_event().unwrap() {
        if let Some(KnownEvent::Method(m)) = ev.known().unwrap() {
            loads.push(m);
        }
    }
    assert!(!loads.is_empty());
    for m in &loads {
        assert_eq!(m.kind, super::events::MethodEventKind::Load);
        assert!(m.is_jitted() && m.size > 0 && m.start_address != 0);
        assert!(!m.name.is_empty());
    }
}

#[test]
fn real_fixtures_one_byte_chunks_and_truncation() {
    let data = fixture("jit.nettrace");
    let (whole, r, _) = parse_chunked(&data, data.len());
    r.unwrap();
    let (bytes, r, _) = parse_chunked(&data, 1);
    r.unwrap();
    assert_eq!(whole, bytes);
    for len in (0..data.len()).step_by(61) {
        let (_, r, _) = parse_chunked(&data[..len], 4096);
        assert!(
            matches!(r, Err(NettraceError::Truncated { .. })),
            "len {len}"
        );
    }
}

#[tokio::test]
async fn async_reader_matches_sync_reader() {
    let data = fixture("app.nettrace");
    let mut sync = NettraceReader::new(&data[..]);
    let mut a = Vec::new();
    while let Some(ev) = sync.next_event().unwrap() {
        a.push(seen(&ev));
    }
    // A duplex pipe with a small buffer makes the reader see many short reads.
    let (mut tx, rx) = tokio::io::duplex(1000);
    let writer = {
        let data = data.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            tx.write_all(&data).await.unwrap();
        })
    };
    let mut r = AsyncNettraceReader::new(rx);
    let mut b = Vec::new();
    while let Some(ev) = r.next_event().await.unwrap() {
        b.push(seen(&ev));
    }
    writer.await.unwrap();
    assert_eq!(a, b);
    assert_eq!(r.parser().stats().events as usize, b.len());
}

#[test]
fn reader_reports_early_eof() {
    let data = fixture("jit.nettrace");
    let mut r = NettraceReader::new(&data[..data.len() - 10]);
    let e = loop {
        match r.next_event() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("a cut file must not end cleanly"),
            Err(e) => break e,
        }
    };
    assert!(matches!(e, NettraceError::Truncated { .. }), "{e}");
}

// ---- NetTrace V6 (perfview NetTraceFormat.md), streams built to the spec ----

use super::testutil::{utf8, v6_field, v6_metadata_row, V6Builder, V6Event};

fn hand_written_v6_stream() -> Vec<u8> {
    let mut s = hex("
        4e 65 74 74 72 61 63 65        // @0   \"Nettrace\"
        00 00 00 00  06 00 00 00  00 00 00 00 // @8 Reserved 0, MajorVersion 6, MinorVersion 0
        37 00 00 01                    // @20  block: size 55, kind 1 (Trace)
        ea 07 01 00 05 00 02 00 03 00 04 00 05 00 06 00 // SyncTimeUTC 2026-01-02 03:04:05.006
        e8 03 00 00 00 00 00 00        //      SyncTimeTicks 1000
        00 ca 9a 3b 00 00 00 00        //      TickFrequency 1e9
        08 00 00 00                    //      PointerSize 8
        01 00 00 00                    //      1 key/value
        09 50 72 6f 63 65 73 73 49 64  //      \"ProcessId\"
        04 34 32 34 32                 //      \"4242\"
        31 00 00 03                    // @79  block: size 49, kind 3 (Metadata)
        00 00                          //      HeaderSize 0
        2d 00                          //      row size 45
        01                             //      MetadataId 1
        23                             //      provider name, 35 bytes:
        ");
    s.extend(b"Microsoft-DotNETCore-SampleProfiler");
    s.extend(hex("
        00                             //      EventId 0
        00                             //      EventName \"\"
        00 00                          //      0 fields
        02 00  08 04                   //      optional metadata, 2 bytes: Level 4
        0e 00 00 06                    // @132 block: size 14, kind 6 (Thread)
        0c 00                          //      row size 12
        01                             //      index 1
        01 04 6d 61 69 6e              //      Name \"main\"
        02 92 21                       //      OSProcessId 4242
        03 2b                          //      OSThreadId 43
        1c 00 00 05                    // @150 block: size 28, kind 5 (Stack)
        01 00 00 00  01 00 00 00       //      FirstId 1, Count 1
        10 00 00 00                    //      16 bytes:
        00 10 00 00 00 7f 00 00  00 20 00 00 00 7f 00 00 // 0x7f0000001000, 0x7f0000002000
        19 00 00 08                    // @182 block: size 25, kind 8 (LabelList)
        01 00 00 00  01 00 00 00       //      firstIndex 1, count 1
        81                             //      ActivityId, last label of the list
        11 12 13 14 15 16 17 18 19 1a 1b 1c 1d 1e 1f 20
        23 00 00 02                    // @211 block: size 35, kind 2 (Event)
        14 00 01 00                    //      HeaderSize 20, compressed
        d0 07 00 00 00 00 00 00  d0 07 00 00 00 00 00 00 // min/max timestamp 2000
        df                             // @235 flags: all but RelatedActivityId
        01                             //      MetadataId 1
        00 01 00                       //      seq delta 0 (→ 1), CaptureThreadIndex 1, proc 0
        01                             //      ThreadIndex 1
        01                             //      StackId 1
        d0 0f                          //      timestamp delta 2000
        01                             //      LabelListId 1
        04                             //      PayloadSize 4
        02 00 00 00                    //      Type = Managed
        12 00 00 04                    // @250 block: size 18, kind 4 (SequencePoint)
        b8 0b 00 00 00 00 00 00        //      timestamp 3000
        00 00 00 00  01 00 00 00       //      flags 0, 1 thread
        01 01                          //      thread index 1, sequence 1
        00 00 00 00                    // @272 EndOfStream
        "));
    s
}

#[test]
fn v6_hand_written_stream_parses() {
    let data = hand_written_v6_stream();
    assert_eq!(data.len(), 276);
    let (events, r, p) = parse_chunked(&data, data.len());
    r.unwrap();
    let t = p.trace().unwrap();
    assert_eq!(
        (t.format_version, t.pointer_size, t.process_id),
        (6, 8, 4242)
    );
    assert_eq!(
        t.properties,
        vec![("ProcessId".to_owned(), "4242".to_owned())]
    );
    assert_eq!(events.len(), 1);
    let e = &events[0];
    assert_eq!(e.offset, 235);
    assert_eq!((e.header.thread_id, e.header.capture_thread_id), (43, 43));
    assert_eq!((e.header.thread_index, e.header.label_list_id), (1, 1));
    assert_eq!(e.header.sequence_number, 1);
    let mut act = [0u8; 16];
    for (i, b) in act.iter_mut().enumerate() {
        *b = 0x11 + i as u8;
    }
    assert_eq!(e.header.activity_id, Guid::from_bytes_le(act));
    assert_eq!(e.stack, Some(vec![0x7f00_0000_1000, 0x7f00_0000_2000]));
    assert_eq!(e.utc, 1_767_323_045_006_001_000);
    assert_eq!(
        e.known.as_deref(),
        Some("Some(ThreadSample(ThreadSample { kind: Managed }))")
    );
    assert_eq!(p.metadata_by_id(1).unwrap().level, 4);
    assert!(p.is_finished());
    // Thread and label rows are reachable from the event.
    let mut p = Parser::new();
    p.feed(&data).unwrap();
    let ev = p.next_event().unwrap().unwrap();
    let th = ev.thread().unwrap();
    assert_eq!(
        (th.name.as_deref(), th.os_process_id, th.os_thread_id),
        (Some("main"), Some(4242), Some(43))
    );
    assert_eq!(
        ev.labels().unwrap().activity_id,
        Some(Guid::from_bytes_le(act))
    );
}

/// Fields of every V6-only type, with the payload that encodes them.
fn v6_typed_fields() -> (Vec<Vec<u8>>, Vec<u8>) {
    let fields = vec![
        v6_field("vi", &[20]),
        v6_field("vu", &[21]),
        v6_field("fixed", &[22, 8, 3, 0]), // FixedLengthArray of 3 UInt16
        v6_field("c", &[23]),
        v6_field("rel", &[24, 6]),  // RelLoc of Byte
        v6_field("data", &[25, 8]), // DataLoc of UInt16
        v6_field("b", &[26]),
        v6_field("arr", &[19, 9]), // Array of Int32
        v6_field("s", &[18]),
    ];
    let mut p = Vec::new();
    p.push(0x03); // varint: zig-zag 3 → -2
    p.extend([0xac, 0x02]); // varuint 300
    for v in [1u16, 2, 3] {
        p.extend(v.to_le_bytes());
    }
    p.push(b'x');
    // RelLoc at payload offset 10: 2 bytes located 13 bytes after the field (which ends at 14).
    p.extend(((2u32 << 16) | 13).to_le_bytes());
    // DataLoc: 4 bytes (two u16) at payload offset 29.
    p.extend(((4u32 << 16) | 29).to_le_bytes());
    p.push(1); // Boolean8
    p.extend(1u16.to_le_bytes()); // array count
    p.extend(7i32.to_le_bytes());
    p.extend(utf16z("")); // empty string
    assert_eq!(p.len(), 27);
    p.extend([0xaa, 0xbb]); // @27: RelLoc target
    p.extend(5u16.to_le_bytes()); // @29: DataLoc target
    p.extend(6u16.to_le_bytes());
    (fields, p)
}

fn v6_builder_stream(compressed: bool) -> Vec<u8> {
    let mut b = V6Builder::new(8, &[("HardwareThreadCount", "2")]);
    let (fields, _) = v6_typed_fields();
    // Optional metadata: Version 1, Level 5, Keywords 0x10, OpCode 1, message template.
    let mut opt = vec![9, 1, 8, 5, 3];
    opt.extend(0x10u64.to_le_bytes());
    opt.extend([1, 1, 4]); // OpCode 1, then kind 4 (MessageTemplate):
    opt.extend(utf8("vi={vi}"));
    b.metadata(&[
        v6_metadata_row(1, "Microsoft-DotNETCore-SampleProfiler", 0, "", &[], &[]),
        v6_metadata_row(2, "My.Source", 9, "Typed", &fields, &opt),
    ]);
    b.threads(&[(1, "worker", 4242, 100), (2, "sampler", 4242, 7)]);
    b.block(5, &{
        let mut st = Vec::new();
        for v in [1u32, 1, 8] {
            st.extend(v.to_le_bytes());
        }
        st.extend(0xabcu64.to_le_bytes());
        st
    });
    let (_, typed_payload) = v6_typed_fields();
    let sample = |seq, ts| V6Event {
        metadata_id: 1,
        seq,
        thread_index: 1,
        capture_thread_index: 2,
        stack_id: 1,
        timestamp: ts,
        sorted: true,
        payload: 2u32.to_le_bytes().to_vec(),
        ..V6Event::default()
    };
    b.event_block(
        &[
            sample(1, 2000),
            V6Event {
                metadata_id: 2,
                seq: 1,
                thread_index: 1,
                capture_thread_index: 1,
                timestamp: 2001,
                payload: typed_payload,
                ..V6Event::default()
            },
            sample(4, 2002), // 2 and 3 dropped on the sampler thread
        ],
        compressed,
    );
    // RemoveThread: thread index 1 logged up to 3 but only 1 arrived → 2 dropped.
    b.block(7, &[1, 3]);
    // Sequence point that also flushes the metadata cache.
    let mut sp = 2100u64.to_le_bytes().to_vec();
    sp.extend(2u32.to_le_bytes());
    sp.extend(0u32.to_le_bytes());
    b.block(4, &sp);
    b.finish()
}

#[test]
fn v6_builder_streams_compressed_and_uncompressed() {
    let (c, rc, pc) = parse_chunked(&v6_builder_stream(true), 1 << 20);
    let (u, ru, pu) = parse_chunked(&v6_builder_stream(false), 1 << 20);
    rc.unwrap();
    ru.unwrap();
    let strip = |v: &[Seen]| {
        v.iter()
            .map(|s| Seen {
                offset: 0,
                ..s.clone()
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&c), strip(&u));
    assert_eq!(c.len(), 3);
    assert_eq!(
        (c[0].header.thread_id, c[0].header.capture_thread_id),
        (100, 7)
    );
    assert_eq!(c[0].stack, Some(vec![0xabc]));
    assert_eq!(c[2].header.sequence_number, 4);
    for p in [&pc, &pu] {
        assert_eq!(p.trace().unwrap().number_of_processors, 2);
        assert_eq!(p.dropped_events(), 4);
        assert!(
            p.metadata().is_empty(),
            "the sequence point flushed the metadata"
        );
    }
}

#[test]
fn v6_metadata_and_new_types_decode() {
    let data = v6_builder_stream(true);
    let mut p = Parser::new();
    p.feed(&data).unwrap();
    p.next_event().unwrap().unwrap();
    let ev = p.next_event().unwrap().unwrap();
    let m = ev.metadata;
    assert_eq!(
        (m.version, m.level, m.keywords, m.opcode),
        (1, 5, 0x10, Some(1))
    );
    assert_eq!(m.message_template.as_deref(), Some("vi={vi}"));
    let v = ev.decode().unwrap();
    let get = |n: &str| find(&v, n).cloned().unwrap();
    assert_eq!(get("vi"), Value::I64(-2));
    assert_eq!(get("vu"), Value::U64(300));
    assert_eq!(
        get("fixed"),
        Value::Array(vec![Value::U16(1), Value::U16(2), Value::U16(3)])
    );
    assert_eq!(get("c"), Value::U8(b'x'));
    assert_eq!(
        get("rel"),
        Value::Array(vec![Value::U8(0xaa), Value::U8(0xbb)])
    );
    assert_eq!(
        get("data"),
        Value::Array(vec![Value::U16(5), Value::U16(6)])
    );
    assert_eq!(get("b"), Value::Bool(true));
    assert_eq!(get("arr"), Value::Array(vec![Value::I32(7)]));
    assert_eq!(get("s"), Value::String(String::new()));
}

#[test]
fn v6_unknown_block_kinds_are_skipped() {
    let mut data = hand_written_v6_stream();
    // Insert a block of an unknown kind (0x42, 3 bytes) before the EventBlock at 211.
    let extra = hex("03 00 00 42  aa bb cc");
    data.splice(211..211, extra);
    let (events, r, _) = parse_chunked(&data, 5);
    r.unwrap();
    assert_eq!(events.len(), 1);
}

#[test]
fn v6_chunking_truncation_and_corruption() {
    for data in [
        hand_written_v6_stream(),
        v6_builder_stream(true),
        v6_builder_stream(false),
    ] {
        let (whole, r, _) = parse_chunked(&data, data.len());
        r.unwrap();
        let (bytes, r, _) = parse_chunked(&data, 1);
        r.unwrap();
        assert_eq!(whole, bytes);
        for len in 0..data.len() {
            let (_, r, _) = parse_chunked(&data[..len], 7);
            assert!(
                matches!(r, Err(NettraceError::Truncated { .. })),
                "len {len}: {r:?}"
            );
        }
        for i in 0..data.len() {
            for v in [0x00, 0x01, 0x7f, 0x80, 0xff] {
                let mut d = data.clone();
                d[i] = v;
                let _ = parse_chunked(&d, 13);
            }
        }
    }
}
