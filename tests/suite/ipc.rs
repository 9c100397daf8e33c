//! The IPC client against real .NET 8 runtimes, in both transports.

use crate::support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use collector::client::{ClientError, DiagnosticsClient, DEFAULT_TIMEOUT};
use collector::discovery;
use collector::listen::{ListenOptions, ListenServer, RuntimeEvent};
use ipc::{CollectTracing, CoreDump, DumpType, Hresult, PerfMapType, ProviderConfig};
use support::{ScratchDir, Target};
use tokio::io::AsyncReadExt;

const READY: Duration = Duration::from_secs(30);

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// A socket path `NAME.sock` in a fresh folder of its own, and the folder (bound first, it
/// outlives what listens there).
fn private_socket(name: &str) -> (ScratchDir, PathBuf) {
    let dir = ScratchDir::new(&format!("it-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.sock"));
    (dir, path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_info_and_environment_over_the_default_socket() {
    let target = Target::builder("CpuHot")
        .args(["--split", "50,50"])
        .env("CLRSCOPE_TEST_MARKER", "marker-value=with equals")
        .start();
    let socket = discovery::find_socket(target.pid()).expect("socket of a running target");
    assert!(socket
        .path
        .to_string_lossy()
        .contains(&format!("dotnet-diagnostic-{}-", target.pid())));

    let client = DiagnosticsClient::for_socket(&socket.path);
    let info = client.process_info().await.unwrap();
    assert_eq!(info.pid, u64::from(target.pid()));
    assert!(info.command_line.contains("CpuHot.dll"), "{info:?}");
    assert_eq!(info.os, "Linux");
    assert!(info
        .clr_product_version
        .as_deref()
        .unwrap()
        .starts_with(&support::runtime_version()));
    assert_eq!(
        info.managed_entrypoint_assembly_name.as_deref(),
        Some("CpuHot")
    );

    let env = client.environment().await.unwrap();
    let marker = env
        .iter()
        .find(|(name, _)| name == "CLRSCOPE_TEST_MARKER")
        .map(|(_, value)| value.as_str());
    assert_eq!(marker, Some("marker-value=with equals"));

    // A variable set over IPC is visible in the next environment read.
    client
        .set_environment_variable("CLRSCOPE_SET_OVER_IPC", "yes")
        .await
        .unwrap();
    let env = client.environment().await.unwrap();
    assert!(env.contains(&("CLRSCOPE_SET_OVER_IPC".into(), "yes".into())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn perf_map_is_written_on_request_and_stops_on_disable() {
    let target = Target::builder("CpuHot").args(["--split", "100"]).start();
    let map = PathBuf::from(format!("/tmp/perf-{}.map", target.pid()));
    let _ = std::fs::remove_file(&map);
    let client = DiagnosticsClient::for_pid(target.pid()).unwrap();
    client.enable_perf_map(PerfMapType::PerfMap).await.unwrap();
    // Enabling after start-up replays the methods already jitted, the hot one among them. Up to
    // .NET 10 the file holds them when the command is answered; .NET 11 answers first and fills
    // it after (0 lines at the answer, measured): wait for it.
    let started = Instant::now();
    let text = loop {
        let text = std::fs::read_to_string(&map).unwrap_or_default();
        if text.contains("SpinAlpha") || started.elapsed() > Duration::from_secs(30) {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!(
        "perf map held the hot method {:?} after the answer",
        started.elapsed()
    );
    assert!(
        text.contains("SpinAlpha"),
        "perf map lacks the hot method after 30 s: {} lines, those of CpuHot: {:?}",
        text.lines().count(),
        text.lines()
            .filter(|l| l.contains("CpuHot"))
            .collect::<Vec<_>>()
    );
    client.disable_perf_map().await.unwrap();
    let _ = std::fs::remove_file(&map);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventpipe_session_streams_nettrace_until_stopped() {
    let target = Target::builder("CpuHot").args(["--split", "100"]).start();
    let client = DiagnosticsClient::for_pid(target.pid()).unwrap();
    let sampler = ProviderConfig::new("Microsoft-DotNETCore-SampleProfiler", 0, 5);
    let mut session = client
        .start_tracing(CollectTracing::v2(vec![sampler]).with_rundown(false))
        .await
        .unwrap();
    let mut magic = [0u8; 8];
    tokio::time::timeout(
        Duration::from_secs(10),
        session.stream.read_exact(&mut magic),
    )
    .await
    .expect("stream starts")
    .unwrap();
    assert_eq!(&magic, b"Nettrace");

    // The runtime flushes the session into the stream before it answers StopTracing: read both.
    let mut rest = Vec::new();
    let (stopped, read) = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::join!(
            client.stop_tracing(session.id, DEFAULT_TIMEOUT),
            session.stream.read_to_end(&mut rest)
        )
    })
    .await
    .expect("the stream ends after StopTracing");
    stopped.unwrap();
    read.unwrap();
    assert!(
        rest.len() > 100,
        "only {} bytes after the magic",
        rest.len()
    );

    // .NET 8 acknowledges stopping a session that has already ended (it does not check the id),
    // so a second stop from a racing caller is harmless.
    client
        .stop_tracing(session.id, DEFAULT_TIMEOUT)
        .await
        .expect("stopping an ended session is acknowledged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_command_error_is_explained() {
    use ipc::CollectTracingVersion;
    // The first CollectTracing version the runtime under test does not know (docs/runtimes.md).
    let unknown = match support::runtime_major() {
        8 => CollectTracingVersion::V3,
        9 => CollectTracingVersion::V5,
        10 => CollectTracingVersion::V6,
        major => {
            eprintln!(
                "not run on .NET {major}: it knows every CollectTracing version clrscope speaks (1-6)"
            );
            return;
        }
    };
    let target = Target::builder("CpuHot").args(["--split", "100"]).start();
    let client = DiagnosticsClient::for_pid(target.pid()).unwrap();
    let sampler = ProviderConfig::new("Microsoft-DotNETCore-SampleProfiler", 0, 5);
    let mut config = CollectTracing::v2(vec![sampler]).with_rundown(false);
    config.version = unknown;
    let error = client.start_tracing(config).await.unwrap_err();
    assert!(error.is_unknown_command(), "{error}");
    match &error {
        ClientError::Server { hresult, .. } => assert_eq!(*hresult, Hresult::UNKNOWN_COMMAND),
        other => panic!("{other}"),
    }
    assert!(error.to_string().contains("UNKNOWN_COMMAND"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_mode_holds_a_suspended_runtime_until_resumed() {
    let (_dir, path) = private_socket("suspend");
    let server = ListenServer::bind(
        &path,
        ListenOptions {
            resume_on_attach: false,
            ..ListenOptions::default()
        },
    )
    .await
    .unwrap();
    let mut events = server.subscribe();
    let mut target = Target::builder("CpuHot")
        .args(["--split", "100"])
        .env("DOTNET_DiagnosticPorts", path.to_str().unwrap())
        .spawn();
    let pid = u64::from(target.pid());
    let info = server
        .wait_for_pid(pid, READY)
        .await
        .expect("the runtime dials the listen socket");
    assert_eq!(events.recv().await.unwrap(), RuntimeEvent::Attached(info));

    // Suspended at startup: no managed code runs, so no ready line.
    assert!(blocking(|| target.wait_ready(Duration::from_secs(2))).is_none());

    let client = server.client(info);
    let process = client.process_info().await.unwrap();
    assert_eq!(process.pid, pid);
    assert_eq!(process.runtime_cookie, info.cookie);
    client.resume_runtime().await.unwrap();
    assert!(blocking(|| target.wait_ready(READY)).is_some());

    // Every command uses up a connection; the runtime's next advertisement serves the next one.
    for _ in 0..3 {
        let env = client.environment().await.unwrap();
        assert!(env.iter().any(|(name, _)| name == "DOTNET_DiagnosticPorts"));
    }
    assert_eq!(server.runtimes(), vec![info]);

    target.kill();
    let detached = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let RuntimeEvent::Detached(gone) = events.recv().await.unwrap() {
                return gone;
            }
        }
    })
    .await
    .expect("an exited runtime is dropped from the pool");
    assert_eq!(detached, info);
    assert!(server.runtimes().is_empty());
    assert!(client.process_info().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_mode_resumes_on_attach_by_default() {
    let (_dir, path) = private_socket("resume");
    let server = ListenServer::bind(&path, ListenOptions::default())
        .await
        .unwrap();
    let mut target = Target::builder("CpuHot")
        .args(["--split", "100"])
        .env("DOTNET_DiagnosticPorts", path.to_str().unwrap())
        .spawn();
    assert!(blocking(|| target.wait_ready(READY)).is_some());
    assert!(server
        .wait_for_pid(u64::from(target.pid()), READY)
        .await
        .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nosuspend_port_starts_at_once_without_a_listener() {
    let (_dir, path) = private_socket("nobody-listens");
    let mut target = Target::builder("CpuHot")
        .args(["--split", "100"])
        .env(
            "DOTNET_DiagnosticPorts",
            format!("{},nosuspend", path.display()),
        )
        .spawn();
    assert!(blocking(|| target.wait_ready(READY)).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triage_core_dump_through_the_runtime() {
    let target = Target::builder("CpuHot").args(["--split", "100"]).start();
    let dir = ScratchDir::new("dump");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("triage.dmp");
    let client = DiagnosticsClient::for_pid(target.pid()).unwrap();
    let dump = CoreDump::new(path.to_str().unwrap(), DumpType::Triage);
    client
        .write_dump(dump, Duration::from_secs(120))
        .await
        .unwrap();
    let bytes = std::fs::read(&path).expect("createdump wrote the file");
    assert_eq!(&bytes[..4], b"\x7fELF", "a core file is an ELF image");
}
