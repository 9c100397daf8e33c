//! Issue 46 (3): whether enabling the agent's EventSources while a process starts can still hang
//! it, on the runtime the suite runs on. The `Startup` target does at once, on several threads,
//! the first uses behind the known deadlocks (thread pool, timers, `ArrayPool`, a Meter, an
//! ActivitySource, the EventSource logger), then beats every 50 ms from the thread pool; each run
//! starts it suspended in listen mode, resumes it, and enables the agent's sessions (alone and
//! all together) a few milliseconds later. A run whose process never becomes ready, stops beating
//! or never answers the session's start is a hang.

use crate::support;

use nettrace::events::{KnownEvent, SampleKind};
use nettrace::NettraceReader;
use serde_json::json;
use support::agent::{data_dir, Agent};

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use collector::client::DiagnosticsClient;
use collector::counters::{CounterSessionConfig, DEFAULT_EVENT_COUNTER_SOURCES};
use collector::listen::{ListenOptions, ListenServer};
use collector::providers;
use collector::session;
use collector::signals::LogsSettings;
use ipc::CollectTracing;
use support::{ScratchDir, Target};

/// How long a starting process may take to print its ready line, and between two beats, before
/// it is taken as hung: far beyond a start on a loaded machine (~0.1–3 s).
const HANG: Duration = Duration::from_secs(30);
/// Beats a run waits for after the ready line (1 s of them).
const BEATS: u64 = 20;
/// When the sessions are enabled, after the runtime is resumed: across the target's start
/// (ready 0.2–1.5 s after it was spawned on a loaded machine).
const DELAYS_MS: [u64; 10] = [0, 1, 2, 5, 10, 20, 50, 100, 200, 400];

/// The EventSource sessions the agent starts on a process with its features on (the light
/// session and the sampler enable only the runtime's native providers): the runtime's event
/// counters (`System.Runtime` and dotnet-monitor's other default sources), meters
/// (`System.Diagnostics.Metrics`), trace linkage with span export, and the logs.
fn agent_sessions() -> Vec<(&'static str, CollectTracing)> {
    let mut counters = CounterSessionConfig::new(1);
    for source in DEFAULT_EVENT_COUNTER_SOURCES {
        counters = counters.with_event_counters(source);
    }
    let meters = CounterSessionConfig::new(1)
        .with_meter("Startup", &[])
        .collect_tracing();
    let linkage = CollectTracing::v2(providers::linkage(&[], true).unwrap())
        .with_rundown(false)
        .with_stackwalk(false);
    let logs = CollectTracing::v2(vec![LogsSettings::default().provider()])
        .with_rundown(false)
        .with_stackwalk(false);
    vec![
        ("event counters", counters.collect_tracing()),
        ("meters", meters),
        ("linkage", linkage),
        ("logs", logs),
    ]
}

/// A `Startup` rule's CPU trace (the `Cpu` profile: the sampler and the runtime's own provider,
/// no EventSource): started before the resume by the agent where the runtime waits for it.
fn cpu_trace_session() -> CollectTracing {
    CollectTracing::v2(providers::TraceProfile::Cpu.providers(1))
}

/// When the sessions are enabled: after the resume, or before it (the runtime waiting in listen
/// mode; each session's start answered before ResumeRuntime is sent).
#[derive(Debug, Clone, Copy)]
enum When {
    AfterResume(Duration),
    BeforeResume,
}

/// What one start did.
#[derive(Debug)]
enum Run {
    /// Ready after this long, then beating.
    Alive(Duration),
    /// What stopped: no ready line, no beat, or no answer to a session's start.
    Hung(String),
}

/// Starts the target suspended on `socket`, resumes it, enables `sessions` after `delay`, and
/// watches it start.
async fn one_start(
    server: &ListenServer,
    socket: &Path,
    sessions: &[CollectTracing],
    when: When,
) -> Run {
    let mut target = Target::builder("Startup")
        .env("DOTNET_DiagnosticPorts", socket.to_str().unwrap())
        .spawn();
    let spawned = Instant::now();
    let pid = u64::from(target.pid());
    let Some(info) = server.wait_for_pid(pid, HANG).await else {
        return Run::Hung("never dialled the listen socket".into());
    };
    let client = server.client(info);
    if let When::AfterResume(delay) = when {
        client.resume_runtime().await.expect("ResumeRuntime");
        tokio::time::sleep(delay).await;
    }
    let (stop_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let mut enabled = Vec::new();
    let runs: Vec<_> = sessions
        .iter()
        .map(|config| {
            let (client, config) = (client.clone(), config.clone());
            let mut stop = stop_tx.subscribe();
            let (on, was_enabled) = tokio::sync::oneshot::channel();
            enabled.push(was_enabled);
            tokio::spawn(async move {
                let stop = async move {
                    let _ = stop.recv().await;
                };
                run_session(&client, config, stop, on).await
            })
        })
        .collect();
    if let When::BeforeResume = when {
        // A session that fails to start drops its sender: the resume goes ahead.
        for was_enabled in enabled {
            let _ = tokio::time::timeout(HANG, was_enabled).await;
        }
        client.resume_runtime().await.expect("ResumeRuntime");
    }
    let watched = tokio::task::block_in_place(|| watch(&mut target, spawned));
    let _ = stop_tx.send(());
    let mut outcome = watched;
    for run in runs {
        if let Err(error) = run.await.unwrap() {
            outcome = match outcome {
                Run::Alive(_) => Run::Hung(format!("a session: {error}")),
                Run::Hung(why) => Run::Hung(format!("{why}; a session: {error}")),
            };
        }
    }
    if let Run::Hung(why) = outcome {
        outcome = Run::Hung(format!("{why}; {}", thread_states(target.pid())));
    }
    target.kill();
    outcome
}

/// A session until `stop`; its start fails if the runtime does not answer it.
async fn run_session(
    client: &DiagnosticsClient,
    config: CollectTracing,
    stop: impl std::future::Future<Output = ()>,
    enabled: tokio::sync::oneshot::Sender<()>,
) -> Result<(), String> {
    let mut sink = tokio::io::sink();
    let mut enabled = Some(enabled);
    let run = session::run(client, config, &mut sink, stop, HANG, |_| {
        if let Some(enabled) = enabled.take() {
            let _ = enabled.send(());
        }
    });
    match tokio::time::timeout(HANG * 2, run).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err("no end".into()),
    }
}

/// How many of a process's threads sleep, and where (`wchan`): a deadlocked process has every
/// thread asleep, those of the deadlock in `futex_wait`.
fn thread_states(pid: u32) -> String {
    let mut waits: std::collections::BTreeMap<String, usize> = Default::default();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten();
    for task in tasks.flatten() {
        let wchan = std::fs::read_to_string(task.path().join("wchan")).unwrap_or_default();
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        let state = stat.rsplit(')').next().unwrap_or("").trim().chars().next();
        *waits
            .entry(format!("{}:{wchan}", state.unwrap_or('?')))
            .or_default() += 1;
    }
    format!("threads (state:wchan): {waits:?}")
}

/// Waits for the ready line and [`BEATS`] beats, each within [`HANG`].
fn watch(target: &mut Target, spawned: Instant) -> Run {
    if target.wait_ready(HANG).is_none() {
        return Run::Hung(format!("no ready line; stderr: {}", target.stderr_text()));
    }
    let ready = spawned.elapsed();
    for beat in 1..=BEATS {
        if target
            .wait_for_json(HANG, |v| v["beat"].as_u64().is_some())
            .is_none()
        {
            return Run::Hung(format!("stopped beating before beat {beat}"));
        }
    }
    Run::Alive(ready)
}

/// A listen-mode server on a socket in a scratch folder that keeps each runtime suspended.
async fn suspending_server(name: &str) -> (ScratchDir, PathBuf, ListenServer) {
    let dir = ScratchDir::new(name);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("startup.sock");
    let options = ListenOptions {
        resume_on_attach: false,
        ..ListenOptions::default()
    };
    let server = ListenServer::bind(&socket, options).await.unwrap();
    (dir, socket, server)
}

/// Each session alone, then all of them together.
fn alone_and_together(
    sessions: Vec<(&'static str, CollectTracing)>,
) -> Vec<(String, Vec<CollectTracing>)> {
    let mut cases: Vec<(String, Vec<CollectTracing>)> = sessions
        .iter()
        .map(|(name, config)| (name.to_string(), vec![config.clone()]))
        .collect();
    cases.push((
        "all together".into(),
        sessions.into_iter().map(|(_, c)| c).collect(),
    ));
    cases
}

/// Every agent session alone and all of them together, enabled at each of [`DELAYS_MS`] after
/// the runtime's resume, `CLRSCOPE_STARTUP_ROUNDS` times (default 2): the hangs found, reported
/// per case, and judged against the runtime's startup grace ([`collector::startup`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enabling_eventsources_at_startup() {
    let rounds: usize = std::env::var("CLRSCOPE_STARTUP_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2);
    let (_dir, socket, server) = suspending_server("it-startup").await;
    let cases = alone_and_together(agent_sessions());
    let mut hangs = Vec::new();
    let mut runs = 0;
    for _ in 0..rounds {
        for (name, configs) in &cases {
            for delay in DELAYS_MS {
                let when = When::AfterResume(Duration::from_millis(delay));
                let run = one_start(&server, &socket, configs, when).await;
                runs += 1;
                let major = support::runtime_major();
                match run {
                    Run::Alive(ready) => {
                        eprintln!(".NET {major}: {name}, +{delay} ms: ready after {ready:?}");
                    }
                    Run::Hung(why) => {
                        eprintln!(".NET {major}: {name}, +{delay} ms: HUNG: {why}");
                        hangs.push(format!("{name}, +{delay} ms: {why}"));
                    }
                }
            }
        }
    }
    eprintln!(
        ".NET {}: {} hangs in {runs} starts",
        support::runtime_version(),
        hangs.len()
    );
    let grace = collector::startup::startup_grace(&support::runtime_version());
    assert!(
        hangs.is_empty() || !grace.is_zero(),
        ".NET {} hangs when EventSources are enabled at startup, but its startup grace is 0:\n{}",
        support::runtime_version(),
        hangs.join("\n")
    );
}

/// Every agent session alone, a `Startup` rule's CPU trace, and all of them together, each
/// enabled while the runtime waits in listen mode and answered before it is resumed, as the agent
/// does for the sessions a rule or linkage needs (`CLRSCOPE_STARTUP_ROUNDS` × 10 starts per
/// case, default 1): the hangs found, per case, judged against
/// [`collector::startup::sessions_before_resume`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enabling_eventsources_before_the_resume() {
    let rounds: usize = std::env::var("CLRSCOPE_STARTUP_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1);
    let (_dir, socket, server) = suspending_server("it-startup-before").await;
    let mut sessions = agent_sessions();
    sessions.push(("cpu trace", cpu_trace_session()));
    let cases = alone_and_together(sessions);
    let major = support::runtime_major();
    let mut hangs = Vec::new();
    let mut runs = 0;
    for _ in 0..rounds * 10 {
        for (name, configs) in &cases {
            match one_start(&server, &socket, configs, When::BeforeResume).await {
                Run::Alive(ready) => {
                    eprintln!(".NET {major}: {name}, before the resume: ready after {ready:?}");
                }
                Run::Hung(why) => {
                    eprintln!(".NET {major}: {name}, before the resume: HUNG: {why}");
                    hangs.push(format!("{name}: {why}"));
                }
            }
            runs += 1;
        }
    }
    eprintln!(
        ".NET {}: {} hangs in {runs} starts with the sessions enabled before the resume",
        support::runtime_version(),
        hangs.len()
    );
    assert!(
        hangs.is_empty()
            || !collector::startup::sessions_before_resume(&support::runtime_version()),
        ".NET {} hangs when EventSources are enabled before the resume, but the agent enables \
         them then:\n{}",
        support::runtime_version(),
        hangs.join("\n")
    );
}

/// The first ThreadSample of a trace and its first sample of managed code, Unix ns.
fn first_samples(file: &Path) -> (Option<i64>, Option<i64>) {
    let mut reader = NettraceReader::new(std::fs::File::open(file).unwrap());
    let (mut any, mut managed) = (None::<i64>, None::<i64>);
    while let Some(event) = reader.next_event().unwrap() {
        if let Ok(Some(KnownEvent::ThreadSample(sample))) = event.known() {
            let t = event.unix_nanos();
            any = Some(any.map_or(t, |a| a.min(t)));
            if sample.kind == SampleKind::Managed {
                managed = Some(managed.map_or(t, |m| m.min(t)));
            }
        }
    }
    (any, managed)
}

/// The `resumed_unix_ns` of the agent's "runtime resumed" line for `pid`.
fn resumed_at(log: &str, pid: u32) -> Option<i64> {
    log.lines()
        .filter(|l| l.contains("runtime resumed") && l.contains(&format!("pid={pid}")))
        .find_map(|l| {
            l.split("resumed_unix_ns=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
}

/// Issue 46: a `Startup` rule in listen mode with a suspended runtime traces the process from its
/// resume: the agent enables the rule's trace before it resumes the runtime (the startup grace,
/// 30 s here, does not hold it back), so the trace's first sample comes before the app's first
/// code (`main_unix_ns`, its Program's static constructor), five starts of five; each first
/// sample's distance from the resume the agent logs is printed. Before this, the trace began
/// once the grace ended, 30 s later.
#[test]
fn a_startup_rule_traces_from_the_resume() {
    let version = support::runtime_version();
    if !collector::startup::sessions_before_resume(&version) {
        eprintln!(".NET {version}: sessions are not started before the resume; nothing to check");
        return;
    }
    let dir = data_dir("startup-rule");
    let artifacts = dir.join("artifacts");
    let config = dir.join("settings.json");
    std::fs::create_dir_all(&dir).unwrap();
    let rules = json!({"StartupTrace": {
        "Filters": [{"Key": "ManagedEntryPointAssemblyName", "Value": "Startup"}],
        "Trigger": {"Type": "Startup"},
        "Actions": [{"Type": "CollectTrace", "Settings": {
            "Profile": "Cpu", "Duration": "00:00:03", "Egress": "artifacts"}}]
    }});
    let settings = json!({
        "Egress": {"FileSystem": {"artifacts": {"DirectoryPath": artifacts}}},
        "CollectionRules": rules,
    });
    std::fs::write(&config, serde_json::to_vec_pretty(&settings).unwrap()).unwrap();
    let socket = dir.join("agent.sock");
    let agent = Agent::start(
        &dir.join("store"),
        &[
            "--no-connect",
            "--diagnostic-port",
            socket.to_str().unwrap(),
            "--startup-grace",
            "30s",
            // The engine's "collection rule action completed" line is the collector's.
            "--log",
            "clrscope=info,collector::rules=info",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    let mut offsets = Vec::new();
    for run in 1..=5 {
        let mut target = Target::builder("Startup")
            .args(["--threads", "2"])
            .env("DOTNET_DiagnosticPorts", socket.to_str().unwrap())
            .spawn();
        let ready = target.wait_ready(HANG).expect("the target's ready line");
        let main_ns = ready["main_unix_ns"].as_i64().expect("main_unix_ns");
        let pid = target.pid();
        let deadline = Instant::now() + Duration::from_secs(120);
        let completed = |log: &str| log.matches("collection rule action completed").count() >= run;
        while !completed(&agent.log()) {
            assert!(
                Instant::now() < deadline,
                "run {run}: the rule's trace did not complete; agent log:\n{}",
                agent.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        target.kill();
        let name = std::fs::read_dir(&artifacts)
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().contains(&format!("_{pid}.nettrace")))
            .unwrap_or_else(|| panic!("run {run}: no trace of pid {pid} in {artifacts:?}"));
        let (first, first_managed) = first_samples(&name);
        let resumed = resumed_at(&agent.log(), pid)
            .unwrap_or_else(|| panic!("run {run}: no resume logged for {pid}:\n{}", agent.log()));
        let first = first.unwrap_or_else(|| panic!("run {run}: the trace holds no sample"));
        let ms = |t: i64| (t - resumed) as f64 / 1e6;
        eprintln!(
            ".NET {version} run {run}: first sample {:+.1} ms after the resume, first managed \
             sample {:+.1} ms, the app's first code (main_unix_ns) {:+.1} ms",
            ms(first),
            first_managed.map_or(f64::NAN, ms),
            ms(main_ns),
        );
        offsets.push((ms(first), ms(main_ns)));
    }
    // The runtime starts its sampler only once it runs again (EventPipe finishes its start after
    // the resume): the first sample follows the resume by the runtime's own start, 15–125 ms on
    // this loaded machine. What the trace must hold is the app's first code.
    assert!(
        offsets.iter().all(|(first, main)| first <= main),
        ".NET {version}: (first sample, app's first code) {offsets:?} ms from the resume: a trace \
         began after the app's first code"
    );
}
