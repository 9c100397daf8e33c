//! Live EventPipe sessions on real .NET 8 targets, parsed as they stream.

use crate::support;

use std::time::{Duration, Instant};

use collector::client::{DiagnosticsClient, DEFAULT_TIMEOUT};
use collector::providers::{self, level};
use ipc::{CollectTracing, ProviderConfig};
use nettrace::events::{KnownEvent, MethodEventKind, SampleKind};
use nettrace::{AsyncNettraceReader, Event, Value};
use support::Target;

/// Keywords of the runtime provider: Loader (0x8) | JIT (0x10).
const JIT_LOADER: u64 = 0x18;
const EXCEPTION_CONTENTION: u64 = 0x8000 | 0x4000;

/// Runs a session until `stop_after`, handing every event (and when it arrived, relative to the
/// session's start) to `on_event` while the stream is still flowing.
async fn record_live(
    pid: u32,
    providers: Vec<ProviderConfig>,
    rundown: bool,
    stop_after: Duration,
    mut on_event: impl FnMut(&Event<'_>, Duration),
) {
    let client = DiagnosticsClient::for_pid(pid).unwrap();
    let config = CollectTracing::v2(providers).with_rundown(rundown);
    let started = Instant::now();
    let session = client.start_tracing(config).await.unwrap();
    let stopper = {
        let client = client.clone();
        let id = session.id;
        tokio::spawn(async move {
            tokio::time::sleep(stop_after).await;
            client.stop_tracing(id, DEFAULT_TIMEOUT).await.unwrap();
        })
    };
    let mut reader = AsyncNettraceReader::new(session.stream);
    let deadline = stop_after + Duration::from_secs(60);
    tokio::time::timeout(deadline, async {
        while let Some(event) = reader.next_event().await.unwrap() {
            on_event(&event, started.elapsed());
        }
    })
    .await
    .expect("the session ends after StopTracing");
    stopper.await.unwrap();
}

fn field<'a>(event: &'a Event<'_>, name: &str) -> Option<Value<'a>> {
    event
        .decode()
        .unwrap()
        .into_iter()
        .find(|v| v.name == name)
        .map(|v| v.value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_arrive_while_the_session_runs_and_rundown_names_the_hot_method() {
    let target = Target::builder("CpuHot").args(["--split", "100"]).start();
    let mut first_sample = None;
    let (mut managed_with_stack, mut with_stack) = (0, 0);
    let mut rundown_names = Vec::new();
    let providers = vec![ProviderConfig::new(
        providers::SAMPLE_PROFILER,
        0,
        level::INFORMATIONAL,
    )];
    record_live(
        target.pid(),
        providers,
        true,
        Duration::from_secs(3),
        |event, at| match event.known().unwrap() {
            Some(KnownEvent::ThreadSample(sample)) => {
                first_sample.get_or_insert(at);
                if event.stack().is_some_and(|s| !s.is_empty()) {
                    with_stack += 1;
                    if sample.kind == SampleKind::Managed {
                        managed_with_stack += 1;
                    }
                }
            }
            Some(KnownEvent::Method(method)) if method.kind == MethodEventKind::DcEnd => {
                rundown_names.push(format!("{}.{}", method.namespace, method.name));
            }
            _ => {}
        },
    )
    .await;
    let first = first_sample.expect("ThreadSample events");
    eprintln!("first ThreadSample {first:?} after the session started");
    assert!(
        first < Duration::from_secs(1),
        "first sample arrived {first:?} after the session started"
    );
    if support::sample_kinds_untrusted() {
        // .NET 9 marks managed code external (dotnet/runtime#123996): the spinning thread's
        // samples arrive, but (nearly) none says managed. Should a 9.x release fix it, this fails
        // and the rule in `collector::samples::untrusted_kinds_of` must learn the version.
        assert!(with_stack > 300, "{with_stack} samples with stacks in 3 s");
        assert!(
            managed_with_stack * 100 < with_stack,
            "{managed_with_stack} of {with_stack} samples managed: is dotnet/runtime#123996 fixed?"
        );
    } else {
        assert!(
            managed_with_stack > 300,
            "{managed_with_stack} managed samples with stacks in 3 s"
        );
    }
    assert!(
        rundown_names
            .iter()
            .any(|n| n == "CpuHot.Program.SpinAlpha"),
        "rundown lacks the hot method among {} methods",
        rundown_names.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exceptions_contention_and_a_custom_event_source_decode() {
    let target = Target::builder("Faults").start();
    let mut exception_types = Vec::new();
    let (mut contention_starts, mut contention_stops) = (0, 0);
    let mut custom = Vec::new();
    let providers = vec![
        ProviderConfig::new(
            providers::RUNTIME,
            EXCEPTION_CONTENTION,
            level::INFORMATIONAL,
        ),
        ProviderConfig::new("Clrscope-Test-Faults", u64::MAX, level::VERBOSE),
    ];
    record_live(
        target.pid(),
        providers,
        false,
        Duration::from_secs(2),
        |event, _| match event.known().unwrap() {
            Some(KnownEvent::ExceptionThrown(e)) => exception_types.push(e.exception_type),
            Some(KnownEvent::ContentionStart(_)) => contention_starts += 1,
            Some(KnownEvent::ContentionStop(stop)) => {
                contention_stops += 1;
                assert!(stop.duration_ns.unwrap_or(0.0) >= 0.0);
            }
            None if event.metadata.provider_name == "Clrscope-Test-Faults" => {
                assert_eq!(event.metadata.event_name, "FaultInjected");
                let sequence = match field(event, "Sequence") {
                    Some(Value::I32(n)) => n,
                    other => panic!("Sequence is {other:?}"),
                };
                let kind = match field(event, "Kind") {
                    Some(Value::String(s)) => s,
                    other => panic!("Kind is {other:?}"),
                };
                let value = match field(event, "Value") {
                    Some(Value::F64(v)) => v,
                    other => panic!("Value is {other:?}"),
                };
                custom.push((sequence, kind, value));
            }
            _ => {}
        },
    )
    .await;
    assert!(
        exception_types
            .iter()
            .any(|t| t == "Faults.InjectedFaultException"),
        "{exception_types:?}"
    );
    assert!(exception_types
        .iter()
        .any(|t| t == "Faults.SecondaryFaultException"));
    assert!(contention_starts > 5 && contention_stops > 5);
    assert!(custom.len() > 20, "{} custom events", custom.len());
    for (sequence, kind, value) in &custom {
        // The target writes Value = Sequence * 0.5 and names the fault's kind.
        assert_eq!(*value, f64::from(*sequence) * 0.5);
        assert!(!kind.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_first_called_during_the_session_is_named_by_its_load_event() {
    let target = Target::builder("AsyncWeb").start();
    let port = target.ready_fact("/port").unwrap().as_u64().unwrap() as u16;
    let mut loaded = Vec::new();
    let providers = vec![ProviderConfig::new(
        providers::RUNTIME,
        JIT_LOADER,
        level::VERBOSE,
    )];
    let request = tokio::task::spawn_blocking(move || {
        // Let the session start before the first /bravo request JIT-compiles BravoHot.
        std::thread::sleep(Duration::from_millis(700));
        support::http_get(port, "/bravo", &[]).status
    });
    record_live(
        target.pid(),
        providers,
        false,
        Duration::from_secs(3),
        |event, _| {
            if let Some(KnownEvent::Method(method)) = event.known().unwrap() {
                if method.kind == MethodEventKind::Load {
                    loaded.push(format!("{}.{}", method.namespace, method.name));
                }
            }
        },
    )
    .await;
    assert_eq!(request.await.unwrap(), 200);
    assert!(
        loaded.iter().any(|m| m == "AsyncWeb.Handlers.BravoHot"),
        "BravoHot not among {} loads: {:?}",
        loaded.len(),
        loaded.iter().take(20).collect::<Vec<_>>()
    );
}

/// What a window's observer saw: when each sample arrived, and when the runtime took it.
#[derive(Default)]
struct Arrivals {
    arrived: Vec<Instant>,
    sampled_unix_nanos: Vec<i64>,
}

impl collector::session::EventObserver for Arrivals {
    fn on_event(&mut self, event: &Event<'_>) {
        if let Ok(Some(KnownEvent::ThreadSample(_))) = event.known() {
            self.arrived.push(Instant::now());
            self.sampled_unix_nanos.push(event.unix_nanos());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_is_read_once_stopped_and_keeps_every_sample() {
    let target = Target::builder("CpuHot").args(["--split", "100"]).start();
    let client = DiagnosticsClient::for_pid(target.pid()).unwrap();
    let providers = vec![ProviderConfig::new(
        providers::SAMPLE_PROFILER,
        0,
        level::INFORMATIONAL,
    )];
    let config = CollectTracing::v2(providers).with_rundown(false);
    let mut sink = collector::session::ParsingWriter::new(tokio::io::sink(), Arrivals::default());
    let window = Duration::from_secs(3);
    let stopped = std::sync::Arc::new(std::sync::Mutex::new(None));
    let (opened, opened_unix_nanos) = (Instant::now(), profile::clock::unix_nanos());
    let stop = {
        let stopped = stopped.clone();
        async move {
            tokio::time::sleep(window).await;
            *stopped.lock().unwrap() = Some((Instant::now(), profile::clock::unix_nanos()));
        }
    };
    let reading = collector::session::Reading::AtStop;
    let timeout = Duration::from_secs(60);
    let summary =
        collector::session::run_reading(&client, config, &mut sink, stop, timeout, |_| {}, reading)
            .await
            .unwrap();
    assert_eq!(summary.end, collector::session::SessionEnd::Stopped);
    assert!(sink.error().is_none(), "{:?}", sink.error());
    assert_eq!(sink.parser().dropped_events(), 0);
    let (stopped_at, stopped_unix_nanos) = stopped.lock().unwrap().expect("stopped");
    let (_, arrivals) = sink.into_parts();
    let samples = arrivals.arrived.len();
    eprintln!("{samples} samples in a {window:?} window, opened {opened:?}");
    // The process's main thread and its spinning ones, sampled every millisecond or so.
    assert!(samples > 1000, "{samples} samples in {window:?}");
    let early = arrivals
        .arrived
        .iter()
        .filter(|&&at| at < stopped_at)
        .count();
    assert_eq!(
        early, 0,
        "{early} of {samples} samples were read before the window stopped"
    );
    // Read at the end, the whole window is there: samples the runtime took from its first
    // second to its last.
    let first = *arrivals.sampled_unix_nanos.iter().min().unwrap();
    let last = *arrivals.sampled_unix_nanos.iter().max().unwrap();
    let second = 1_000_000_000;
    assert!(
        first < opened_unix_nanos + second,
        "first sample {} ms after the window opened",
        (first - opened_unix_nanos) / 1_000_000
    );
    assert!(
        last > stopped_unix_nanos - second,
        "last sample {} ms before the window stopped",
        (stopped_unix_nanos - last) / 1_000_000
    );
}
