//! One attached process: a long-lived light session, a duty-cycled sampler, and the store
//! batches they yield, until the process exits or the agent stops.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Context;
use collector::activity::Span;
use collector::activity::TrackerLimits;
use collector::attached::AttachedProcess;
use collector::client::DiagnosticsClient;
use collector::ipc::{CollectTracing, ProviderConfig};
use collector::local::LocalProcess;
use collector::nettrace::events::{EventKind, KnownEvent, ModuleEventKind};
use collector::nettrace::Guid;
use collector::nettrace::{Event, ParserOptions};
use collector::providers::{self, level};
use collector::rules::options::ProcessFacts;
use collector::rules::state::RuleStates;
use collector::sampler::{SamplerControl, SamplerStep, MAX_WINDOW};
use collector::samples::SampleAggregator;
use collector::session::{self, EventObserver, ParsingWriter, SessionProgress};
use collector::signals::{ProcessSignals, SignalCollector, SpanLookup, SpanSource};
use profile::labels;
use symbolizer::profiles::process::{Batches, EventProfiles, ProcessProfiler};
use tokio::sync::watch;
use tokio::time::Instant;

use super::health::{GaugeGuard, Health};
use super::runtime_counters;
use super::writer::BatchSink;
use super::{rules, Agent, SignalSettings};

/// How long after a sampler window its stacks are named: methods compiled during the window are
/// announced on the light session, whose events arrive up to a few hundred milliseconds later.
const SYMBOLIZE_DELAY: Duration = Duration::from_secs(1);

/// A light session that delivered nothing for this long has nothing pending: a window waiting
/// for it to catch up is named now.
const LIGHT_QUIET: Duration = Duration::from_secs(1);

/// The longest a window waits for a lagging light session (a loaded machine, a burst of startup
/// events) before it is named with what is known.
const MAX_CATCH_UP: Duration = Duration::from_secs(30);

/// How long the runtime may take to end a stopped session's stream.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A runtime to profile and how it was found.
pub struct Target {
    pub client: DiagnosticsClient,
    /// The pid as seen from the agent (listen mode: the pid the runtime advertised).
    pub pid: u64,
    /// `connect` or `listen`.
    pub transport: &'static str,
}

/// How a process's profiling ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The filters exclude it.
    Filtered,
    /// The same runtime is already attached (found through another transport).
    AlreadyAttached,
    /// It ran until the process exited or the agent stopped.
    Profiled,
}

/// The profiler shared between the light session's observer and the sampling loop, and where
/// the process's mapped images are read from.
#[derive(Clone)]
struct SharedProfiler {
    profiler: Arc<Mutex<ProcessProfiler>>,
    /// The runtime's process on this machine, when proven: only then is its `/proc` read.
    local: Option<Arc<LocalProcess>>,
    /// A module loaded since `/proc/PID/maps` was last read: the next ReadyToRun entry point
    /// may lie in an image the code map does not know yet.
    images_stale: Arc<AtomicBool>,
    /// How far the light session's stream has come: its newest event's time (Unix ns), and when
    /// it last delivered one (ms since `started`).
    light_latest_ns: Arc<AtomicI64>,
    light_seen_ms: Arc<AtomicU64>,
    started: Instant,
}

impl SharedProfiler {
    fn new(profiler: ProcessProfiler, local: Option<LocalProcess>) -> Self {
        let shared = SharedProfiler {
            profiler: Arc::new(Mutex::new(profiler)),
            local: local.map(Arc::new),
            images_stale: Arc::new(AtomicBool::new(false)),
            light_latest_ns: Arc::new(AtomicI64::new(i64::MIN)),
            light_seen_ms: Arc::new(AtomicU64::new(0)),
            started: Instant::now(),
        };
        shared.refresh_images();
        shared
    }

    fn lock(&self) -> MutexGuard<'_, ProcessProfiler> {
        // The profiler's maps stay consistent between calls, so a panic cannot corrupt them.
        self.profiler.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads the process's mapped files again: modules and native libraries load all along (a
    /// listen-mode runtime is attached before its first assembly is mapped), and a frame in a
    /// file the map does not know would stay `[unknown]`.
    fn refresh_images(&self) {
        self.images_stale.store(false, Ordering::Relaxed);
        if let Some(Ok(images)) = self.local.as_deref().map(symbolizer::read_proc_maps) {
            self.lock().set_images(images);
        }
    }

    /// Waits until the light session has delivered events up to `until_ns` (Unix ns), or has
    /// been quiet long enough that nothing is pending, at most [`MAX_CATCH_UP`]: names of code
    /// bound or compiled during a window arrive there, late on a loaded machine.
    async fn light_caught_up(&self, until_ns: i64) {
        let deadline = Instant::now() + MAX_CATCH_UP;
        loop {
            let quiet_ms = u64::try_from(self.started.elapsed().as_millis())
                .unwrap_or(u64::MAX)
                .saturating_sub(self.light_seen_ms.load(Ordering::Relaxed));
            if self.light_latest_ns.load(Ordering::Relaxed) >= until_ns
                || Duration::from_millis(quiet_ms) >= LIGHT_QUIET
                || Instant::now() >= deadline
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The process's thread names by tid, when its `/proc` may be read.
    fn thread_names(&self) -> HashMap<u64, String> {
        self.local
            .as_deref()
            .map(LocalProcess::thread_names)
            .unwrap_or_default()
    }
}

/// The light session's span tracking, for a session of a request's own: weak, since the
/// profiler holds the process's signals, which hold this.
struct LightSpans {
    profiler: std::sync::Weak<Mutex<ProcessProfiler>>,
    light_latest_ns: Arc<AtomicI64>,
    light_seen_ms: Arc<AtomicU64>,
    started: Instant,
}

impl LightSpans {
    fn of(shared: &SharedProfiler) -> Self {
        LightSpans {
            profiler: Arc::downgrade(&shared.profiler),
            light_latest_ns: shared.light_latest_ns.clone(),
            light_seen_ms: shared.light_seen_ms.clone(),
            started: shared.started,
        }
    }
}

impl SpanSource for LightSpans {
    /// As [`SharedProfiler::light_caught_up`], without the wait.
    fn caught_up(&self, unix_nanos: i64) -> bool {
        let quiet_ms = u64::try_from(self.started.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_sub(self.light_seen_ms.load(Ordering::Relaxed));
        self.light_latest_ns.load(Ordering::Relaxed) >= unix_nanos
            || Duration::from_millis(quiet_ms) >= LIGHT_QUIET
    }

    fn span(&self, activity: Guid, thread: u64, timestamp: i64) -> Option<Span> {
        let profiler = self.profiler.upgrade()?;
        let profiler = profiler.lock().unwrap_or_else(|p| p.into_inner());
        let spans = profiler.spans()?;
        spans
            .span_of_activity(&activity, timestamp)
            .or_else(|| spans.span_at(thread, timestamp))
            .cloned()
    }
}

impl EventObserver for SharedProfiler {
    fn on_event(&mut self, event: &Event<'_>) {
        match event.metadata.kind {
            EventKind::Module(ModuleEventKind::Load) => {
                self.images_stale.store(true, Ordering::Relaxed);
            }
            // An entry point names its module through the image that holds it.
            EventKind::R2rEntryPoint if self.images_stale.load(Ordering::Relaxed) => {
                self.refresh_images();
            }
            _ => {}
        }
        self.light_latest_ns
            .fetch_max(event.unix_nanos(), Ordering::Relaxed);
        let seen_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.light_seen_ms.store(seen_ms, Ordering::Relaxed);
        self.lock().observe(event);
    }
}

/// Collects one sampler window's stacks; its other events (allocation ticks) go to the profiler.
struct WindowSamples {
    samples: SampleAggregator,
    profiler: SharedProfiler,
}

impl EventObserver for WindowSamples {
    fn on_event(&mut self, event: &Event<'_>) {
        match event.known() {
            Ok(Some(KnownEvent::ThreadSample(sample))) => self.samples.add(event, &sample),
            Ok(Some(KnownEvent::AllocationTick(_))) => self.profiler.lock().observe(event),
            _ => {}
        }
    }
}

/// JIT/Loader events for the code map, plus the events of the switched-on event profiles and,
/// with trace linkage, the span and context-switch events.
fn light_session(
    events: EventProfiles,
    linkage: Option<&[ProviderConfig]>,
    signals: &SignalSettings,
) -> CollectTracing {
    let mut keywords = providers::RUNTIME_JIT_LOADER_KEYWORDS;
    if events.exceptions || signals.exceptions() {
        keywords |= providers::RUNTIME_EXCEPTION_KEYWORD;
    }
    if events.locks {
        keywords |= providers::RUNTIME_CONTENTION_KEYWORD;
    }
    // Verbose: MethodLoadVerbose names methods.
    let mut session = vec![ProviderConfig::new(
        providers::RUNTIME,
        keywords,
        level::VERBOSE,
    )];
    if let Some(linkage) = linkage {
        session.extend(linkage.iter().cloned());
    }
    if let Some(logs) = &signals.logs {
        session.push(logs.provider());
    }
    CollectTracing::v2(session).with_rundown(false)
}

/// The sampler, plus GC allocation ticks when the alloc profiles are on. Each tick walks the
/// allocating thread's stack, on that thread, once per ~100 KB allocated: measured at 4–5 % of an
/// allocation-heavy service's CPU when always on (BENCHMARKS.md), so ticks are duty-cycled with
/// the sampler instead of riding the light session.
fn sampler_session(alloc: bool) -> CollectTracing {
    let mut session = vec![ProviderConfig::new(
        providers::SAMPLE_PROFILER,
        0,
        level::INFORMATIONAL,
    )];
    if alloc {
        // GCAllocationTick is a Verbose event of the GC keyword.
        session.push(ProviderConfig::new(
            providers::RUNTIME,
            providers::RUNTIME_GC_KEYWORD,
            level::VERBOSE,
        ));
    }
    CollectTracing::v2(session).with_rundown(false)
}

/// The service name OpenTelemetry SDKs in the process would report: `OTEL_SERVICE_NAME`, else
/// `service.name` in `OTEL_RESOURCE_ATTRIBUTES` (percent-decoded).
pub fn service_name(environment: &[(String, String)]) -> Option<String> {
    let get = |key: &str| {
        environment
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
    };
    if let Some(name) = get("OTEL_SERVICE_NAME") {
        return Some(name.to_string());
    }
    get("OTEL_RESOURCE_ATTRIBUTES")?
        .split(',')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| key.trim() == "service.name")
        .map(|(_, value)| percent_decode(value.trim()))
        .filter(|v| !v.is_empty())
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// How long a listen-mode runtime waits for its light session to start streaming before it is
/// resumed anyway.
const LIGHT_SESSION_START_TIMEOUT: Duration = Duration::from_secs(10);

/// A listen-mode runtime may wait at startup for a tool (`DOTNET_DiagnosticPorts` suspends by
/// default): it is resumed once the light session streams, so every method it binds or compiles
/// is announced there, and whatever else happens, before the runtime's task ends.
struct StartupGate<'a> {
    client: &'a DiagnosticsClient,
    pid: u64,
    pending: bool,
}

impl StartupGate<'_> {
    /// Lets the runtime run, once (a runtime that did not wait answers all the same).
    async fn open(&mut self) {
        if !std::mem::take(&mut self.pending) {
            return;
        }
        if let Err(error) = self.client.resume_runtime().await {
            tracing::debug!(pid = self.pid, %error, "resuming the runtime failed");
        }
    }
}

/// Profiles one process until it exits or the agent stops.
pub async fn profile(target: Target, agent: Arc<Agent>) -> anyhow::Result<Outcome> {
    let mut gate = StartupGate {
        client: &target.client,
        pid: target.pid,
        pending: target.transport == "listen",
    };
    let result = attach(&target, agent, &mut gate).await;
    gate.open().await;
    result
}

async fn attach(
    target: &Target,
    agent: Arc<Agent>,
    gate: &mut StartupGate<'_>,
) -> anyhow::Result<Outcome> {
    let client = &target.client;
    let info = client
        .process_info()
        .await
        .context("asking the runtime who it is (ProcessInfo)")?;
    // The executable's name: what dotnet-monitor's ProcessName filters compare (`dotnet` for a
    // framework-dependent app).
    let executable = {
        let argv0 = info.command_line.split(' ').next().unwrap_or("");
        argv0.rsplit('/').next().unwrap_or(argv0).to_string()
    };
    let name = info
        .managed_entrypoint_assembly_name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| executable.clone());
    // Listen mode: the pid the runtime advertised is from its own pid namespace.
    let local = LocalProcess::find(info.pid, target.pid, &info.command_line);
    let command_line = local
        .as_ref()
        .map_or(info.command_line.as_str(), |l| l.command_line.as_str());
    if !agent
        .settings
        .filters
        .accept(target.pid, &name, command_line)
    {
        return Ok(Outcome::Filtered);
    }
    let environment = match client.environment().await {
        Ok(environment) => environment,
        Err(error) => {
            tracing::warn!(pid = target.pid, %error, "cannot read the environment; service_name falls back to the process name");
            Vec::new()
        }
    };
    let service = service_name(&environment).unwrap_or_else(|| name.clone());
    let sampler = SamplerControl::new(agent.settings.duty);
    let rule_states = RuleStates::default();
    let signals = ProcessSignals::new(
        agent.settings.signals.limits,
        agent.settings.signals.logs.clone(),
    );
    let Some(_registration) = agent.processes.register(AttachedProcess {
        pid: target.pid,
        name: name.clone(),
        service_name: service.clone(),
        command_line: command_line.to_string(),
        runtime_version: info.clr_product_version.clone(),
        runtime_cookie: info.runtime_cookie.to_string(),
        transport: target.transport,
        attached_unix_ms: profile::clock::unix_millis(),
        sampler: sampler.clone(),
        rules: rule_states.clone(),
        signals: signals.clone(),
    }) else {
        return Ok(Outcome::AlreadyAttached);
    };
    let _attached = GaugeGuard::new(&agent.health.processes_attached);
    tracing::info!(pid = target.pid, %name, service = %service, transport = target.transport, "attached");
    let entry_assembly = info
        .managed_entrypoint_assembly_name
        .clone()
        .unwrap_or_default();
    let cookie = info.runtime_cookie.to_string();
    // Dropped when the process's profiling ends: rule tasks still running are aborted then.
    let _rules = rules::start(
        &agent.settings.rules,
        rules::RuleTarget {
            client,
            pid: target.pid,
            local: local.as_ref(),
            runtime_cookie: &cookie,
            facts: ProcessFacts {
                pid: target.pid,
                name: &executable,
                command_line,
                managed_entry_point_assembly_name: &entry_assembly,
            },
            sampler: sampler.clone(),
            states: rule_states,
            signals: signals.clone(),
        },
        &agent.processes,
        &agent.shutdown,
    );

    let series = vec![
        (
            labels::HOST_NAME.to_string(),
            agent.settings.host_name.clone(),
        ),
        (labels::PROCESS_ID.to_string(), target.pid.to_string()),
        (labels::SERVICE_NAME.to_string(), service.clone()),
    ];
    // The resource of its exported logs and metrics.
    let resource: std::sync::Arc<[(String, String)]> = series.clone().into();
    // Samples are joined to spans up to a whole (boosted) window plus the naming delay late.
    let linkage = agent.settings.linkage.is_some().then(|| TrackerLimits {
        retention: MAX_WINDOW + SYMBOLIZE_DELAY + Duration::from_secs(5),
        ..TrackerLimits::default()
    });
    if agent.exports.want_logs() {
        tokio::spawn(
            agent
                .exports
                .clone()
                .forward_logs(resource.clone(), signals.subscribe()),
        );
    }
    let profiler = SharedProfiler::new(
        ProcessProfiler::new(series, agent.settings.events, linkage)
            .with_signals(SignalCollector::new(signals.clone())),
        local,
    );
    // A `/logs` session of its own joins its messages to the spans the light session tracks.
    signals.set_span_lookup(SpanLookup(Arc::new(LightSpans::of(&profiler))));

    // Fires when this function returns: the process's other tasks end with it.
    let (_detaching, detached) = tokio::sync::oneshot::channel::<()>();
    if let Some(config) = agent.settings.runtime_counters.clone() {
        let mut shutdown = agent.shutdown.clone();
        let stop = async move {
            tokio::select! {
                _ = shutdown.wait_for(|stop| *stop) => {}
                _ = detached => {}
            }
        };
        tokio::spawn(runtime_counters::export(
            client.clone(),
            config,
            agent.metrics.clone(),
            agent.exports.clone(),
            runtime_counters::CountedProcess {
                pid: target.pid,
                service: service.clone(),
                series: resource,
            },
            stop,
        ));
    }
    let (streaming, started_streaming) = tokio::sync::oneshot::channel::<()>();
    let mut light = {
        let client = client.clone();
        let mut sink = ParsingWriter::with_options(
            tokio::io::sink(),
            profiler.clone(),
            agent.settings.parser.clone(),
        );
        let config = light_session(
            agent.settings.events,
            agent.settings.linkage.as_deref(),
            &agent.settings.signals,
        );
        let mut shutdown = agent.shutdown.clone();
        let sessions = agent.health.sessions.clone();
        let mut streaming = Some(streaming);
        tokio::spawn(async move {
            let _open = GaugeGuard::new(&sessions);
            let stop = async {
                let _ = shutdown.wait_for(|stop| *stop).await;
            };
            let first_bytes = |_: SessionProgress| {
                if let Some(streaming) = streaming.take() {
                    let _ = streaming.send(());
                }
            };
            session::run(&client, config, &mut sink, stop, STOP_TIMEOUT, first_bytes).await
        })
    };
    // A session failing to start ends the wait too (its sender is dropped).
    let _ = tokio::time::timeout(LIGHT_SESSION_START_TIMEOUT, started_streaming).await;
    gate.open().await;
    // Started after the light session, so code loaded in between is named by one or the other.
    let pid32 = u32::try_from(target.pid).unwrap_or(0);
    // As anyhow, so `{:#}` shows the error's causes.
    let rundown = session::rundown(client, pid32, profiler.clone()).await;
    if let Err(error) = rundown.map_err(anyhow::Error::from) {
        tracing::warn!(pid = target.pid, error = %format!("{error:#}"), "rundown failed; frames of code loaded before attaching stay unnamed");
    }

    let sampling = SamplingLoop {
        client,
        pid: target.pid,
        sampler,
        profiler: profiler.clone(),
        sink: agent.sink.clone(),
        shutdown: agent.shutdown.clone(),
        keep_times: agent.settings.linkage.is_some(),
        alloc: agent.settings.events.alloc,
        health: agent.health.clone(),
        parser: &agent.settings.parser,
    };
    let result = tokio::select! {
        result = sampling.run() => result,
        ended = &mut light => {
            match ended {
                Ok(Ok(_)) => tracing::info!(pid = target.pid, "process exited"),
                Ok(Err(error)) => tracing::info!(pid = target.pid, %error, "session ended; detaching"),
                Err(error) => tracing::warn!(pid = target.pid, %error, "light session task failed"),
            }
            Ok(())
        }
    };
    if !light.is_finished() {
        // The agent is stopping: the light session stops on the same signal.
        let _ = light.await;
    }
    let names = profiler.thread_names();
    send(&agent.sink, profiler.lock().take_event_batches(&names), 0);
    tracing::info!(pid = target.pid, "detached");
    result.map(|()| Outcome::Profiled)
}

/// `period_nanos`: what each sample of sampled batches stands for; 0 for event batches.
fn send(sink: &BatchSink, batches: Batches, period_nanos: i64) {
    for batch in batches.batches {
        sink.send(batch, period_nanos);
    }
}

struct SamplingLoop<'a> {
    client: &'a DiagnosticsClient,
    pid: u64,
    sampler: SamplerControl,
    profiler: SharedProfiler,
    sink: BatchSink,
    shutdown: watch::Receiver<bool>,
    /// Keep each sample's time, to join it to the span its thread ran.
    keep_times: bool,
    /// Take allocation ticks during sampler windows.
    alloc: bool,
    health: Health,
    parser: &'a ParserOptions,
}

impl SamplingLoop<'_> {
    /// Samples by the duty cycle (or boost) and flushes event profiles once per period, until
    /// the agent stops.
    async fn run(mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        let mut period_start = Instant::now();
        let mut refresh_names = true;
        loop {
            if *self.shutdown.borrow() {
                return Ok(());
            }
            let now = Instant::now();
            match self.sampler.step(period_start, now) {
                SamplerStep::Sample { until, boosted } => {
                    let now_ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    if refresh_names && self.profiler.lock().wants_rundown(now_ns) {
                        refresh_names = self.refresh_names().await;
                    }
                    match self.window(until).await {
                        Ok(mut samples) => {
                            self.sampler
                                .observe_window(samples.samples(), samples.ticks());
                            // Duty-cycled, the window stands for its whole period; boosted,
                            // windows follow each other and stand for themselves.
                            if !boosted {
                                samples.set_stands_for(self.sampler.status().duty.period);
                            }
                            self.symbolize_later(samples);
                        }
                        Err(error) => {
                            tracing::warn!(pid = self.pid, error = %format!("{error:#}"), "sampler window failed; trying again next period");
                            self.pause(period_start + self.sampler.status().duty.period)
                                .await;
                            period_start = Instant::now();
                        }
                    }
                    if boosted {
                        period_start = Instant::now();
                    }
                }
                SamplerStep::Pause { until } => {
                    let names = self.profiler.thread_names();
                    send(
                        &self.sink,
                        self.profiler.lock().take_event_batches(&names),
                        0,
                    );
                    if until <= now {
                        period_start = now;
                        continue;
                    }
                    if self.pause(until).await {
                        period_start = until;
                    }
                }
            }
        }
    }

    /// Runs a rundown to name code the sampler found in managed images without a known method;
    /// false once a rundown names nothing new (ReadyToRun code only called from its own image is
    /// never listed), so it is not repeated for ever.
    async fn refresh_names(&self) -> bool {
        let before = self.profiler.lock().code_map().functions().len();
        let pid = u32::try_from(self.pid).unwrap_or(0);
        let rundown = session::rundown(self.client, pid, self.profiler.clone()).await;
        if let Err(error) = rundown.map_err(anyhow::Error::from) {
            tracing::warn!(pid = self.pid, error = %format!("{error:#}"), "refreshing method names failed");
            return true;
        }
        let named = self.profiler.lock().code_map().functions().len() - before;
        tracing::info!(pid = self.pid, named, "refreshed method names (rundown)");
        named > 0
    }

    /// Waits until `until`, a boost or the agent's stop; true if the time ran out.
    async fn pause(&mut self, until: Instant) -> bool {
        tokio::select! {
            () = tokio::time::sleep_until(until) => true,
            () = self.sampler.changed() => false,
            _ = self.shutdown.changed() => false,
        }
    }

    /// Runs one sampler session until `until` or the agent's stop.
    async fn window(&mut self, until: Instant) -> anyhow::Result<SampleAggregator> {
        let mut samples = SampleAggregator::new(0);
        if self.keep_times {
            samples = samples.keep_times();
        }
        let window = WindowSamples {
            samples,
            profiler: self.profiler.clone(),
        };
        let mut sink = ParsingWriter::with_options(tokio::io::sink(), window, self.parser.clone());
        let mut shutdown = self.shutdown.clone();
        let _open = GaugeGuard::new(&self.health.sessions);
        let opened_unix_ms = profile::clock::unix_millis();
        let stop = async {
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                _ = shutdown.wait_for(|stop| *stop) => {}
            }
        };
        session::run(
            self.client,
            sampler_session(self.alloc),
            &mut sink,
            stop,
            STOP_TIMEOUT,
            |_| {},
        )
        .await
        .context("sampling")?;
        // When the target was sampled, on the wall clock: what benches/agent_overhead.py
        // lines up with the target's own throughput to see what a window costs.
        tracing::debug!(
            pid = self.pid,
            opened_unix_ms,
            closed_unix_ms = profile::clock::unix_millis(),
            "sampler window closed"
        );
        if let Some(error) = sink.error() {
            anyhow::bail!("the sampler's stream did not parse: {error}");
        }
        let interval = sink.parser().trace().map(|t| t.expected_cpu_sampling_rate);
        let (_, WindowSamples { mut samples, .. }) = sink.into_parts();
        if let Some(interval) = interval {
            samples.set_expected_interval(interval);
        }
        Ok(samples)
    }

    /// Names the window's stacks once the light session has caught up, and stores them.
    fn symbolize_later(&self, samples: SampleAggregator) {
        if samples.samples() == 0 {
            return;
        }
        self.health.samples.add(samples.samples());
        let profiler = self.profiler.clone();
        let sink = self.sink.clone();
        let pid = self.pid;
        tokio::spawn(async move {
            tokio::time::sleep(SYMBOLIZE_DELAY).await;
            if let Some((_, window_end)) = samples.time_range() {
                profiler.light_caught_up(window_end).await;
            }
            profiler.refresh_images();
            let names = profiler.thread_names();
            let batches = profiler.lock().sample_batches(&samples, &names);
            tracing::debug!(
                pid,
                samples = samples.samples(),
                named = format!("{:.1}%", batches.resolution.method_percent()),
                "sampler window stored"
            );
            send(&sink, batches, samples.weight_ns());
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn service_name_follows_opentelemetry() {
        assert_eq!(service_name(&env(&[])), None);
        assert_eq!(
            service_name(&env(&[(
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=prod,service.name=shop%20api"
            ),])),
            Some("shop api".to_string())
        );
        assert_eq!(
            service_name(&env(&[
                ("OTEL_SERVICE_NAME", "checkout"),
                ("OTEL_RESOURCE_ATTRIBUTES", "service.name=other"),
            ])),
            Some("checkout".to_string())
        );
        assert_eq!(
            service_name(&env(&[
                ("OTEL_SERVICE_NAME", " "),
                ("OTEL_RESOURCE_ATTRIBUTES", "a=b")
            ])),
            None
        );
        assert_eq!(percent_decode("a%2Cb%zz%"), "a,b%zz%");
    }
}
