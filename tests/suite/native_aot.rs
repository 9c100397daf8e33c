//! Issue 46 (4): the Storefront service published with NativeAOT (tests/targets/StorefrontAot,
//! .NET 10, EventSourceSupport on), and what clrscope reads of it out of process: the diagnostic
//! port and `ps`, EventPipe's events (GC, exceptions, counters, meters, logs, activities), and a
//! CPU profile whose frames are named from the executable's own symbol table. Each check is
//! judged against what the service counts itself (`/admin/stats`) or against its binary. The
//! table in docs/runtimes.md ("NativeAOT") cites these tests.

use crate::support;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output};

use nettrace::events::KnownEvent;
use nettrace::NettraceReader;
use serde_json::Value;
use support::{ScratchDir, Target};

fn clrscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .args(args)
        .output()
        .expect("run clrscope")
}

/// The NativeAOT service (frontend and its own downstream), exceptions on every 5th coupon.
fn start_service() -> Target {
    Target::builder("StorefrontAot")
        .native_aot()
        .args(["--behaviour", "exception_every=5"])
        .start()
}

/// Load on every route of the service for `seconds`, from the (JIT) load generator.
fn load_in_background(front: &Target, seconds: u32) -> Target {
    let ready = front.ready().unwrap();
    let url = ready["url"].as_str().expect("url").to_string();
    let grpc = ready["grpc_url"].as_str().expect("grpc_url").to_string();
    Target::builder("StorefrontLoad")
        .args(["--target", &url, "--grpc-target", &grpc, "--rps", "40"])
        .args(["--duration-seconds", &seconds.to_string()])
        .start()
}

/// The service's own totals (GET /admin/stats).
fn stats(front: &Target) -> Value {
    let port = front.ready().unwrap()["port"].as_u64().expect("port") as u16;
    support::http_get(port, "/admin/stats", &[]).json()
}

#[test]
fn the_diagnostic_port_answers_and_ps_lists_the_service() {
    let front = start_service();
    let output = clrscope(&["ps", "--json"]);
    assert!(output.status.success(), "{output:?}");
    let rows: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    let row = rows
        .iter()
        .find(|r| r["pid"] == u64::from(front.pid()))
        .unwrap_or_else(|| panic!("pid {} missing from {rows:#?}", front.pid()));
    assert_eq!(row["error"], Value::Null, "{row}");
    assert_eq!(row["transport"], "connect", "{row}");
    let version = row["runtime_version"].as_str().unwrap_or_default();
    let printed = front.ready().unwrap()["runtime"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        version, printed,
        "ProcessInfo's version is the one the app prints: {row}"
    );
    let command_line = row["command_line"].as_str().unwrap_or_default();
    assert!(
        command_line.contains("publish/StorefrontAot"),
        "the executable, no dotnet host: {row}"
    );
    eprintln!("ps row of the NativeAOT service: {row}");
}

/// Counts of the events a trace holds, by `provider/event`, and the ExceptionThrown events by
/// exception type and message.
fn event_counts(file: &Path) -> (HashMap<String, u64>, HashMap<(String, String), u64>) {
    let mut reader = NettraceReader::new(std::fs::File::open(file).unwrap());
    let (mut counts, mut exceptions) = (HashMap::new(), HashMap::new());
    while let Some(event) = reader.next_event().unwrap() {
        // NativeAOT's runtime events carry no names in their metadata: by id then.
        let key = match event.metadata.event_name.is_empty() {
            true => format!(
                "{}/#{}",
                event.metadata.provider_name, event.metadata.event_id
            ),
            false => format!(
                "{}/{}",
                event.metadata.provider_name, event.metadata.event_name
            ),
        };
        *counts.entry(key).or_insert(0u64) += 1;
        if let Ok(Some(KnownEvent::ExceptionThrown(thrown))) = event.known() {
            *exceptions
                .entry((thrown.exception_type, thrown.message))
                .or_insert(0u64) += 1;
        }
    }
    (counts, exceptions)
}

fn count(counts: &HashMap<String, u64>, key: &str) -> u64 {
    counts.get(key).copied().unwrap_or(0)
}

fn delta(before: &Value, after: &Value, key: &str) -> u64 {
    after[key].as_u64().unwrap() - before[key].as_u64().unwrap()
}

/// One EventPipe session of the service under load: the runtime's GC and exception events, the
/// `System.Runtime` event counters, the service's meters, its log messages and its activities
/// all arrive, each no more often than the service itself counts between the stats read before
/// the session and after it.
#[test]
fn eventpipe_carries_gc_exceptions_counters_meters_logs_and_activities() {
    let front = start_service();
    let _load = load_in_background(&front, 40);
    let dir = ScratchDir::new("native-aot-trace");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("signals.nettrace");
    let providers = [
        // GC (0x1) and exceptions (0x8000) at Informational.
        "Microsoft-Windows-DotNETRuntime:0x8001:4",
        "System.Runtime:0:4:EventCounterIntervalSec=1",
        "System.Diagnostics.Metrics:0x3:4:Metrics=Storefront",
        "Microsoft-Extensions-Logging:0x4:4",
        "Microsoft-Diagnostics-DiagnosticSource:0x3:5:FilterAndPayloadSpecs=[AS]Storefront/Start-",
    ]
    .join(",");
    let before = stats(&front);
    let output = clrscope(&[
        "trace",
        "--pid",
        &front.pid().to_string(),
        "--duration",
        "8s",
        "--no-rundown",
        "--providers",
        &providers,
        "-o",
        file.to_str().unwrap(),
    ]);
    let after = stats(&front);
    assert!(output.status.success(), "{output:?}");
    let (counts, exceptions) = event_counts(&file);
    eprintln!("events of the NativeAOT service: {counts:?}\nexceptions: {exceptions:?}");
    eprintln!("stats before: {before}\nafter: {after}");

    // GCStart is the runtime's event 1.
    let gcs = count(&counts, "Microsoft-Windows-DotNETRuntime/#1");
    let collections = |stats: &Value| stats["gc_collections"][0].as_u64().unwrap();
    let collected = collections(&after) - collections(&before);
    assert!(
        gcs > 0 && gcs <= collected,
        "{gcs} GCStart events, the service counted {collected} collections"
    );
    // One exception is seen again at each await it passes (ExceptionDispatchInfo rethrows it):
    // each throw's message is its own ("… (lookup N)").
    let thrown = exceptions
        .keys()
        .filter(|(kind, _)| kind == "Storefront.Pricing.CouponServiceException")
        .count() as u64;
    let counted = delta(&before, &after, "coupon_exceptions");
    assert!(
        thrown > 0 && thrown <= counted,
        "{thrown} coupon service exceptions traced, the service counted {counted}"
    );
    assert!(
        count(&counts, "System.Runtime/EventCounters") > 0,
        "{counts:?}"
    );
    let meters: u64 = counts
        .iter()
        .filter(|(k, _)| k.starts_with("System.Diagnostics.Metrics/") && k.contains("Published"))
        .map(|(_, n)| n)
        .sum();
    assert!(meters > 0, "no meter values: {counts:?}");
    let logged = count(&counts, "Microsoft-Extensions-Logging/FormattedMessage");
    assert!(logged > 0, "no log messages: {counts:?}");
    let activities = count(
        &counts,
        "Microsoft-Diagnostics-DiagnosticSource/ActivityStart",
    );
    assert!(activities > 0, "no activities: {counts:?}");
}

/// The fraction of frames, weighted by the folded profile's values (wall nanoseconds), named by
/// a function (not `module!+0x…` or `[unknown]`); the total weight; some unnamed examples.
fn named_share(folded: &str) -> (f64, u64, Vec<String>) {
    let (mut frames, mut unnamed) = (0u64, 0u64);
    let mut examples = Vec::new();
    for line in folded.lines() {
        let Some((stack, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let value: u64 = value.parse().unwrap();
        for frame in stack.split(';') {
            frames += value;
            if frame.contains("!+0x") || frame.contains("[unknown]") {
                unnamed += value;
                if examples.len() < 10 && !examples.iter().any(|e| e == frame) {
                    examples.push(frame.to_string());
                }
            }
        }
    }
    let share = 1.0 - unnamed as f64 / frames.max(1) as f64;
    (share, frames, examples)
}

/// The SampleProfiler runs in NativeAOT and its stacks are named from the executable's symbol
/// table: at least 99 % of the frames of a profile of the service under load have a name, and
/// the hot route's method (`RecommendationEngine.ScoreCandidates`, what the service measures as
/// its CPU) is among them. NativeAOT's samples do not say whether the thread ran managed code
/// (none is of the managed kind before .NET 11, dotnet/runtime#125217), so `--types cpu` is the
/// kernel's per-thread CPU spread over each thread's stacks, with a warning that says so
/// (docs/runtimes.md, "Sample kinds"); the hot method is in it.
#[test]
fn profile_frames_are_named_from_the_executable() {
    let front = start_service();
    let _load = load_in_background(&front, 40);
    let dir = ScratchDir::new("native-aot-record");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("wall.folded");
    let output = clrscope(&[
        "record",
        "--pid",
        &front.pid().to_string(),
        "--duration",
        "6s",
        "--types",
        "wall",
        "-o",
        file.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{output:?}");
    let folded = std::fs::read_to_string(&file).unwrap();
    let (share, frames, examples) = named_share(&folded);
    eprintln!(
        "NativeAOT wall profile: {frames} frame-ns, {:.2} % named; unnamed e.g. {examples:?}",
        share * 100.0
    );
    // At least a second of frames (several threads over 6 s hold far more).
    assert!(
        frames > 1_000_000_000,
        "too few frames to judge: {frames} ns"
    );
    assert!(
        share >= 0.99,
        "{:.2} % of frames named (99 % asked); unnamed e.g. {examples:?}",
        share * 100.0
    );
    assert!(
        folded.contains("Storefront.Recommendations.RecommendationEngine.ScoreCandidates"),
        "the hot method is not named:\n{}",
        folded.lines().take(20).collect::<Vec<_>>().join("\n")
    );

    let cpu_file = dir.join("cpu.folded");
    let output = clrscope(&[
        "record",
        "--pid",
        &front.pid().to_string(),
        "--duration",
        "4s",
        "--types",
        "cpu",
        "-o",
        cpu_file.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("NativeAOT") && stderr.contains("estimated"),
        "no warning of the estimate: {stderr}"
    );
    let cpu = std::fs::read_to_string(&cpu_file).unwrap();
    assert!(
        cpu.contains("Storefront.Recommendations.RecommendationEngine.ScoreCandidates"),
        "the hot method is not in the cpu profile:\n{}",
        cpu.lines().take(20).collect::<Vec<_>>().join("\n")
    );
}
