//! Request encoders against hand-written messages.

use super::samples::MAGIC;
use crate::*;

/// MAGIC followed by the rest of the header and the payload.
fn message(rest: &[u8]) -> Vec<u8> {
    [&MAGIC[..], rest].concat()
}

fn provider(name: &str, keywords: u64, level: u32) -> ProviderConfig {
    ProviderConfig::new(name, keywords, level)
}

#[test]
fn requests_without_payload() {
    // (request, command_set, command_id)
    let cases = [
        (Request::ProcessInfo, 0x04, 0x00),
        (Request::ResumeRuntime, 0x04, 0x01),
        (Request::ProcessEnvironment, 0x04, 0x02),
        (Request::ProcessInfo2, 0x04, 0x04),
        (Request::DisablePerfMap, 0x04, 0x06),
        (Request::ProcessInfo3, 0x04, 0x08),
    ];
    for (req, set, id) in cases {
        assert_eq!(
            req.encode().unwrap(),
            message(&[
                0x14, 0x00, // size = 20
                set, id, // command
                0x00, 0x00, // reserved
            ]),
            "{}",
            req.name()
        );
        assert_eq!(req.command(), (set, id));
    }
}

#[test]
fn set_environment_variable() {
    let req = Request::SetEnvironmentVariable {
        name: "OTEL".into(),
        value: "x=1".into(),
    };
    assert_eq!(
        req.encode().unwrap(),
        message(&[
            0x2E, 0x00, // size = 46
            0x04, 0x03, // Process / SetEnvironmentVariable
            0x00, 0x00, // reserved
            5, 0, 0, 0, // name: 5 units incl. NUL
            b'O', 0, b'T', 0, b'E', 0, b'L', 0, 0, 0, // "OTEL\0"
            4, 0, 0, 0, // value: 4 units
            b'x', 0, b'=', 0, b'1', 0, 0, 0, // "x=1\0"
        ])
    );
}

#[test]
fn enable_perf_map() {
    assert_eq!(
        Request::EnablePerfMap(PerfMapType::PerfMap)
            .encode()
            .unwrap(),
        message(&[
            0x18, 0x00, // size = 24
            0x04, 0x05, // Process / EnablePerfMap
            0x00, 0x00, // reserved
            3, 0, 0, 0, // u32 perfMapType = PERFMAP
        ])
    );
}

#[test]
fn stop_tracing() {
    assert_eq!(
        Request::StopTracing {
            session_id: 0x0102_0304_0506_0708
        }
        .encode()
        .unwrap(),
        message(&[
            0x1C, 0x00, // size = 28
            0x02, 0x01, // EventPipe / StopTracing
            0x00, 0x00, // reserved
            0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // u64 sessionId
        ])
    );
}

/// ipc-protocol.md, "Payloads": the CollectTracing example, byte for byte (size 80).
#[test]
fn collect_tracing_v1_doc_example() {
    let req = Request::CollectTracing(CollectTracing {
        version: CollectTracingVersion::V1,
        circular_buffer_mb: 250,
        format: TraceFormat::NetTrace,
        request_rundown: true,
        rundown_keyword: DEFAULT_RUNDOWN_KEYWORD,
        request_stackwalk: true,
        providers: vec![provider("MyEventSource", 100, 2)],
        buffer_mode: BufferMode::Drop,
    });
    assert_eq!(req.name(), "CollectTracing");
    assert_eq!(
        req.encode().unwrap(),
        message(&[
            0x50, 0x00, // size = 80
            0x02, 0x02, // EventPipe / CollectTracing
            0x00, 0x00, // reserved
            250, 0, 0, 0, // circularBufferMB
            1, 0, 0, 0, // format = NetTrace
            1, 0, 0, 0, // n providers
            100, 0, 0, 0, 0, 0, 0, 0, // keywords
            2, 0, 0, 0, // logLevel
            14, 0, 0, 0, // provider_name length
            b'M', 0, b'y', 0, b'E', 0, b'v', 0, b'e', 0, b'n', 0, b't', 0, // "MyEvent"
            b'S', 0, b'o', 0, b'u', 0, b'r', 0, b'c', 0, b'e', 0, 0, 0, // "Source\0"
            0, 0, 0, 0, // arguments length = 0
        ])
    );
}

#[test]
fn collect_tracing_v2() {
    let c = CollectTracing::v2(vec![
        provider("P", 0xF000_0000_0000, 5).with_arguments(""), // empty, as the official client sends
    ])
    .with_rundown(false);
    assert_eq!(c.lowest_version(), CollectTracingVersion::V2);
    assert_eq!(
        Request::CollectTracing(c).encode().unwrap(),
        message(&[
            0x3B, 0x00, // size = 59
            0x02, 0x03, // EventPipe / CollectTracing2
            0x00, 0x00, // reserved
            0x00, 0x01, 0, 0, // circularBufferMB = 256
            1, 0, 0, 0, // format = NetTrace
            0, // requestRundown = false
            1, 0, 0, 0, // n providers
            0, 0, 0, 0, 0, 0xF0, 0, 0, // keywords 0xF00000000000
            5, 0, 0, 0, // level Verbose
            2, 0, 0, 0, b'P', 0, 0, 0, // name "P"
            1, 0, 0, 0, 0, 0, // arguments "" = count 1, NUL
        ])
    );
}

#[test]
fn collect_tracing_v3() {
    let c = CollectTracing::v2(vec![provider("P", 1, 4)])
        .with_stackwalk(false)
        .with_lowest_version();
    assert_eq!(c.version, CollectTracingVersion::V3);
    assert_eq!(
        Request::CollectTracing(c).encode().unwrap(),
        message(&[
            0x3A, 0x00, // size = 58
            0x02, 0x04, // EventPipe / CollectTracing3
            0x00, 0x00, // reserved
            0x00, 0x01, 0, 0, // circularBufferMB = 256
            1, 0, 0, 0, // format = NetTrace
            1, // requestRundown = true
            0, // requestStackwalk = false
            1, 0, 0, 0, // n providers
            1, 0, 0, 0, 0, 0, 0, 0, // keywords
            4, 0, 0, 0, // level Informational
            2, 0, 0, 0, b'P', 0, 0, 0, // name "P"
            0, 0, 0, 0, // arguments: null
        ])
    );
}

#[test]
fn collect_tracing_v4() {
    let c = CollectTracing::v2(vec![provider("P", 1, 4)])
        .with_rundown_keyword(0x18)
        .with_lowest_version();
    assert_eq!(c.version, CollectTracingVersion::V4);
    assert_eq!(
        Request::CollectTracing(c).encode().unwrap(),
        message(&[
            0x41, 0x00, // size = 65
            0x02, 0x05, // EventPipe / CollectTracing4
            0x00, 0x00, // reserved
            0x00, 0x01, 0, 0, // circularBufferMB = 256
            1, 0, 0, 0, // format = NetTrace
            0x18, 0, 0, 0, 0, 0, 0, 0, // rundownKeyword = Loader | Jit
            1, // requestStackwalk = true
            1, 0, 0, 0, // n providers
            1, 0, 0, 0, 0, 0, 0, 0, // keywords
            4, 0, 0, 0, // level
            2, 0, 0, 0, b'P', 0, 0, 0, // name "P"
            0, 0, 0, 0, // arguments: null
        ])
    );
}

#[test]
fn collect_tracing_v5() {
    let c = CollectTracing::v2(vec![
        provider("P", 1, 4).with_event_filter(EventFilter::only(vec![1, 2])),
        provider("Q", 2, 4),
    ])
    .with_lowest_version();
    assert_eq!(c.version, CollectTracingVersion::V5);
    assert_eq!(
        Request::CollectTracing(c).encode().unwrap(),
        message(&[
            0x6F, 0x00, // size = 111
            0x02, 0x06, // EventPipe / CollectTracing5
            0x00, 0x00, // reserved
            0, 0, 0, 0, // session_type = streaming
            0x00, 0x01, 0, 0, // circularBufferMB = 256
            1, 0, 0, 0, // format = NetTrace
            0x39, 0x01, 0x02, 0x80, 0, 0, 0, 0, // rundownKeyword = 0x80020139
            1, // requestStackwalk = true
            2, 0, 0, 0, // n providers
            // provider P
            1, 0, 0, 0, 0, 0, 0, 0, // keywords
            4, 0, 0, 0, // level
            2, 0, 0, 0, b'P', 0, 0, 0, // name "P"
            0, 0, 0, 0, // arguments: null
            1, // event_filter.enable = only these ids
            2, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, // event_ids [1, 2]
            // provider Q
            2, 0, 0, 0, 0, 0, 0, 0, // keywords
            4, 0, 0, 0, // level
            2, 0, 0, 0, b'Q', 0, 0, 0, // name "Q"
            0, 0, 0, 0, // arguments: null
            0, // event_filter.enable = false ...
            0, 0, 0, 0, // ... with no ids: all events
        ])
    );
}

/// The doc's event_filter examples: enable=0 with [4, 5] is `0, 2, 4, 5`.
#[test]
fn collect_tracing_v5_deny_filter_matches_doc() {
    let c = CollectTracing::v2(vec![
        provider("P", 1, 4).with_event_filter(EventFilter::except(vec![4, 5]))
    ])
    .with_lowest_version();
    let bytes = Request::CollectTracing(c).encode().unwrap();
    let filter = [
        0, // enable = 0 (deny list)
        2, 0, 0, 0, 4, 0, 0, 0, 5, 0, 0, 0, // event_ids [4, 5]
    ];
    assert!(bytes.ends_with(&filter));
}

#[test]
fn collect_tracing_v6() {
    let c = CollectTracing::v2(vec![provider("P", 1, 4)])
        .with_rundown(false)
        .with_buffer_mode(BufferMode::Block)
        .with_lowest_version();
    assert_eq!(c.version, CollectTracingVersion::V6);
    assert_eq!(
        Request::CollectTracing(c).encode().unwrap(),
        message(&[
            0x4E, 0x00, // size = 78
            0x02, 0x07, // EventPipe / CollectTracing6
            0x00, 0x00, // reserved
            0, 0, 0, 0, // session_type = streaming
            0x00, 0x01, 0, 0, // circularBufferMB = 256
            1, 0, 0, 0, // format = NetTrace
            0, 0, 0, 0, 0, 0, 0, 0, // rundownKeyword = 0 (none)
            1, // requestStackwalk = true
            1, 0, 0, 0, // n providers
            1, 0, 0, 0, 0, 0, 0, 0, // keywords
            4, 0, 0, 0, // level
            2, 0, 0, 0, b'P', 0, 0, 0, // name "P"
            0, 0, 0, 0, // arguments: null
            0, 0, 0, 0, 0, // event_filter: none (enable 0, count 0)
            1, 0, 0, 0, // sessionBufferMode = Block
        ])
    );
}

#[test]
fn lowest_version_follows_the_official_client() {
    use CollectTracingVersion as V;
    let base = CollectTracing::v2(vec![provider("P", 1, 4)]);
    assert_eq!(base.lowest_version(), V::V2);
    // Rundown off and the default keyword are both expressible by V2.
    assert_eq!(base.clone().with_rundown(false).lowest_version(), V::V2);
    assert_eq!(
        base.clone()
            .with_rundown_keyword(DEFAULT_RUNDOWN_KEYWORD)
            .lowest_version(),
        V::V2
    );
    assert_eq!(
        base.clone()
            .with_rundown_keyword(0)
            .with_stackwalk(false)
            .lowest_version(),
        V::V3
    );
    assert_eq!(
        base.clone()
            .with_rundown_keyword(1)
            .with_stackwalk(false)
            .lowest_version(),
        V::V4
    );
    let filtered = CollectTracing::v2(vec![
        provider("P", 1, 4).with_event_filter(EventFilter::only(vec![]))
    ]);
    assert_eq!(filtered.lowest_version(), V::V5);
    assert_eq!(
        filtered
            .with_buffer_mode(BufferMode::Block)
            .lowest_version(),
        V::V6
    );
}

#[test]
fn collect_tracing_rejects_what_the_runtime_or_version_would_not_take() {
    let base = CollectTracing::v2(vec![provider("P", 1, 4)]);
    let reason = |c: CollectTracing| match Request::CollectTracing(c).encode() {
        Err(ProtocolError::InvalidRequest { reason, .. }) => reason,
        other => panic!("{other:?}"),
    };
    assert!(reason(base.clone().with_stackwalk(false)).contains("needs CollectTracing3"));
    assert!(reason(base.clone().with_rundown_keyword(8)).contains("needs CollectTracing4"));
    assert!(
        reason(base.clone().with_buffer_mode(BufferMode::Block)).contains("needs CollectTracing6")
    );
    assert!(reason(base.clone().with_circular_buffer_mb(0)).contains("circular_buffer_mb"));
    assert!(reason(CollectTracing::v2(vec![])).contains("0 providers"));
    assert!(reason(CollectTracing::v2(vec![provider("", 1, 4)])).contains("empty name"));
    assert!(reason(CollectTracing::v2(vec![provider("P", 1, 6)])).contains("level 6"));
    let mut c = base.clone();
    c.request_rundown = false; // without touching rundown_keyword
    assert!(reason(c).contains("disagree"));
    let mut v1 = base.clone().with_rundown(false);
    v1.version = CollectTracingVersion::V1;
    assert!(reason(v1).contains("needs CollectTracing2"));
    let nul = CollectTracing::v2(vec![provider("P", 1, 4).with_arguments("a=b\0c")]);
    assert!(reason(nul).contains("NUL"));
}

#[test]
fn generate_core_dump_versions() {
    let v3 = CoreDump {
        flags: CoreDump::LOGGING_ENABLED | CoreDump::CRASH_REPORT_ENABLED,
        ..CoreDump::new("/d", DumpType::Full)
    };
    assert_eq!(
        Request::GenerateCoreDump(v3.clone()).name(),
        "GenerateCoreDump3"
    );
    assert_eq!(
        Request::GenerateCoreDump(v3.clone()).encode().unwrap(),
        message(&[
            0x26, 0x00, // size = 38
            0x01, 0x03, // Dump / GenerateCoreDump3
            0x00, 0x00, // reserved
            3, 0, 0, 0, b'/', 0, b'd', 0, 0, 0, // dumpName "/d"
            4, 0, 0, 0, // dumpType = Full
            5, 0, 0, 0, // flags = LoggingEnabled | CrashReportEnabled
        ])
    );
    let v2 = CoreDump {
        version: 2,
        dump_type: DumpType::Triage,
        flags: CoreDump::VERBOSE_LOGGING_ENABLED,
        ..v3.clone()
    };
    assert_eq!(
        Request::GenerateCoreDump(v2).encode().unwrap(),
        message(&[
            0x26, 0x00, // size = 38
            0x01, 0x02, // Dump / GenerateCoreDump2
            0x00, 0x00, // reserved
            3, 0, 0, 0, b'/', 0, b'd', 0, 0, 0, // dumpName "/d"
            3, 0, 0, 0, // dumpType = Triage
            2, 0, 0, 0, // flags = VerboseLoggingEnabled
        ])
    );
    let v1 = CoreDump {
        version: 1,
        dump_type: DumpType::WithHeap,
        flags: 1,
        ..v3.clone()
    };
    assert_eq!(
        Request::GenerateCoreDump(v1.clone()).encode().unwrap(),
        message(&[
            0x26, 0x00, // size = 38
            0x01, 0x01, // Dump / GenerateCoreDump
            0x00, 0x00, // reserved
            3, 0, 0, 0, b'/', 0, b'd', 0, 0, 0, // dumpName "/d"
            2, 0, 0, 0, // dumpType = WithHeap
            1, 0, 0, 0, // diagnostics = true (a bool sent as u32)
        ])
    );
    let too_many_flags = CoreDump { flags: 4, ..v1 };
    assert!(Request::GenerateCoreDump(too_many_flags).encode().is_err());
    let bad_version = CoreDump { version: 4, ..v3 };
    assert!(Request::GenerateCoreDump(bad_version).encode().is_err());
}

#[test]
fn apply_startup_hook() {
    assert_eq!(
        Request::ApplyStartupHook { path: "/h".into() }
            .encode()
            .unwrap(),
        message(&[
            0x1E, 0x00, // size = 30
            0x04, 0x07, // Process / ApplyStartupHook
            0x00, 0x00, // reserved
            3, 0, 0, 0, b'/', 0, b'h', 0, 0, 0, // startupHookPath "/h"
        ])
    );
    assert!(Request::ApplyStartupHook {
        path: String::new()
    }
    .encode()
    .is_err());
}

#[test]
fn oversized_message_is_rejected() {
    let req = Request::SetEnvironmentVariable {
        name: "N".into(),
        value: "v".repeat(40_000),
    };
    match req.encode() {
        Err(ProtocolError::MessageTooLarge { request, size, max }) => {
            assert_eq!(request, "SetEnvironmentVariable");
            assert_eq!(max, 65535);
            assert_eq!(size, 20 + 4 + 4 + 4 + 40_001 * 2);
        }
        other => panic!("{other:?}"),
    }
    // The largest message that fits is accepted: 20 + 8 (name "N") + 4 + 2 * units = 65535
    // has no integer solution, so check 65534.
    let fits = Request::SetEnvironmentVariable {
        name: "N".into(),
        value: "v".repeat((65534 - 20 - 8 - 4) / 2 - 1),
    };
    assert_eq!(fits.encode().unwrap().len(), 65534);
}
