//! One attached process: a long-lived light session, a duty-cycled sampler, and the store
//! batches they yield, until the process exits or the agent stops.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Context;
use collector::activity::{TrackerLimits, TrackerStats};
use collector::attached::AttachedProcess;
use collector::client::DiagnosticsClient;
use collector::connections::OtherConnections;
use collector::local::{LocalProcess, ProcessCpu, StatFiles, ThreadCpu};
use collector::providers::{self, level};
use collector::rules::options::ProcessFacts;
use collector::rules::state::RuleStates;
use collector::sampler::{SamplerControl, SamplerStep, MAX_WINDOW};
use collector::samples::{SampleAggregator, UntrustedKinds};
use collector::session::{self, EventObserver, ParsingWriter, Reading, SessionProgress};
use collector::signals::{
    LogsDemand, LogsFeed, ProcessSignals, SignalCollector, SpanLookup, SpanSource,
};
use collector::startup::{ResumeHold, ResumeHolds};
use collector::timer_grid;
use exporter::remote::otel_env::parse_pairs;
use ipc::{CollectTracing, CollectTracingVersion, ProviderConfig};
use nettrace::events::{EventKind, KnownEvent, ModuleEventKind};
use nettrace::{Event, NettraceError, ParserOptions};
use profile::guid::Guid;
use profile::labels;
use profile::span::Span;
use symbolizer::profiles::process::{Batches, EventProfiles, ProcessProfiler};
use symbolizer::ImageRange;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use ui::metrics::Counter;

use super::grace::StartupGrace;
use super::health::{GaugeGuard, Health};
use super::runtime_counters;
use super::writer::BatchSink;
use super::{rules, stopped, Agent, SignalSettings};

/// How long after a sampler window its stacks are named: methods compiled during the window are
/// announced on the light session, whose events arrive up to a few hundred milliseconds later.
const SYMBOLIZE_DELAY: Duration = Duration::from_secs(1);

/// How often a window waiting for a lagging light session looks again (then on the grid).
const CATCH_UP_POLL: Duration = Duration::from_millis(100);

/// Windows up to this long are read once they stop ([`Reading::AtStop`]): the default's,
/// and the allocation ticks after it. Longer ones (a boost, a long `--sample-window`) are read
/// as they stream, so that a process never holds more than this much of its samples for us.
const READ_AT_STOP_MAX: Duration = Duration::from_secs(3);

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

/// The long-lived sessions of a process, each parsed into the shared profiler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    /// Method and module events that name code, exceptions, contention, logs.
    Light,
    /// Trace linkage's span events and threads' activity ids: a session of their own, so that
    /// they can be enabled again without touching the light session.
    Linkage,
    /// A rundown's list of the code loaded so far: it names code like the light session, but its
    /// events, written at the rundown, say nothing of how far the light session has come.
    Rundown,
    /// `Microsoft-Extensions-Logging` at the union of what every consumer asks
    /// ([`collector::signals::LogsDemand`]): a session of its own, so that it can be started
    /// again with another union without touching the others.
    Logs,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Light => "light",
            Stream::Linkage => "linkage",
            Stream::Rundown => "rundown",
            Stream::Logs => "logs",
        }
    }
}

/// How far one long-lived session's stream has come, and what the runtime dropped from it.
#[derive(Debug)]
struct StreamProgress {
    /// Every event of the stream before this time (Unix ns) has been delivered: the newest time
    /// of an event the runtime marked sorted. The newest event's time says less: the runtime
    /// writes each flush thread by thread, so one thread's events can come seconds ahead of
    /// another's earlier ones (the method loads a window's first requests JIT-compiled).
    delivered_ns: AtomicI64,
    /// When it last delivered an event (ms since the profiler's start).
    seen_ms: AtomicU64,
    dropped: AtomicU64,
    /// When a drop was last logged (ms since the profiler's start; 0: never).
    drop_logged_ms: AtomicU64,
}

impl StreamProgress {
    /// Whether the stream has delivered every event up to `unix_nanos`, or has been quiet long
    /// enough ([`LIGHT_QUIET`]) that nothing is pending; `now_ms`: ms since the profiler's start.
    fn caught_up(&self, unix_nanos: i64, now_ms: u64) -> bool {
        let quiet_ms = now_ms.saturating_sub(self.seen_ms.load(Ordering::Relaxed));
        self.delivered_ns.load(Ordering::Relaxed) >= unix_nanos
            || Duration::from_millis(quiet_ms) >= LIGHT_QUIET
    }

    /// Counts an event of time `unix_nanos` as delivered, once the profiler has taken it in;
    /// `sorted`: the runtime marked it sorted (every earlier event has been written before it).
    fn delivered(&self, unix_nanos: i64, sorted: bool, now_ms: u64) {
        if sorted {
            self.delivered_ns.fetch_max(unix_nanos, Ordering::Relaxed);
        }
        self.seen_ms.store(now_ms, Ordering::Relaxed);
    }

    fn new() -> Arc<StreamProgress> {
        Arc::new(StreamProgress {
            delivered_ns: AtomicI64::new(i64::MIN),
            seen_ms: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            drop_logged_ms: AtomicU64::new(0),
        })
    }
}

/// The profiler shared between the long-lived sessions' observers and the sampling loop, and
/// where the process's mapped images are read from.
#[derive(Clone)]
struct SharedProfiler {
    profiler: Arc<Mutex<ProcessProfiler>>,
    /// The runtime's process on this machine, when proven: only then is its `/proc` read.
    local: Option<Arc<LocalProcess>>,
    /// A module loaded since `/proc/PID/maps` was last read: the next ReadyToRun entry point
    /// may lie in an image the code map does not know yet.
    images_stale: Arc<AtomicBool>,
    /// The mapped images the code map was last given, and when they were read.
    images: Arc<Mutex<MappedImages>>,
    light: Arc<StreamProgress>,
    /// With trace linkage: the linkage session's stream.
    linkage: Option<Arc<StreamProgress>>,
    /// When the linkage session last delivered a span start (ms since `started`).
    span_start_ms: Arc<AtomicU64>,
    logs: Arc<StreamProgress>,
    /// Where the logs session's events go.
    logs_feed: Arc<LogsFeed>,
    pid: u64,
    started: Instant,
}

impl SharedProfiler {
    fn new(
        profiler: ProcessProfiler,
        local: Option<LocalProcess>,
        pid: u64,
        signals: &ProcessSignals,
    ) -> Self {
        let linkage = profiler.spans().is_some().then(StreamProgress::new);
        let shared = SharedProfiler {
            profiler: Arc::new(Mutex::new(profiler)),
            local: local.map(Arc::new),
            images_stale: Arc::new(AtomicBool::new(false)),
            images: Arc::default(),
            light: StreamProgress::new(),
            linkage,
            span_start_ms: Arc::new(AtomicU64::new(0)),
            logs: StreamProgress::new(),
            logs_feed: Arc::new(LogsFeed::new(signals.clone())),
            pid,
            started: Instant::now(),
        };
        shared.refresh_images();
        shared
    }

    fn lock(&self) -> MutexGuard<'_, ProcessProfiler> {
        // The profiler's maps stay consistent between calls, so a panic cannot corrupt them.
        self.profiler.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn progress(&self, stream: Stream) -> Option<&StreamProgress> {
        match stream {
            Stream::Light => Some(&self.light),
            Stream::Linkage => self.linkage.as_deref(),
            Stream::Rundown => None,
            Stream::Logs => Some(&self.logs),
        }
    }

    /// The observer of one long-lived session's stream.
    fn observer(&self, stream: Stream) -> StreamObserver {
        StreamObserver {
            profiler: self.clone(),
            stream,
        }
    }

    /// Reads the process's mapped files again: modules and native libraries load all along (a
    /// listen-mode runtime is attached before its first assembly is mapped), and a frame in a
    /// file the map does not know would stay `[unknown]`. True when they changed.
    fn refresh_images(&self) -> bool {
        let mapped = self.images.lock().unwrap_or_else(|p| p.into_inner());
        self.read_images(mapped)
    }

    /// [`SharedProfiler::refresh_images`] with the images' lock held.
    fn read_images(&self, mut mapped: MutexGuard<'_, MappedImages>) -> bool {
        self.images_stale.store(false, Ordering::Relaxed);
        let now = Instant::now();
        if mapped.unresolved_seen {
            mapped.unresolved_read_at = Some(now);
            mapped.unresolved_seen = false;
        }
        mapped.read_at = Some(now);
        let Some(local) = self.local.as_deref() else {
            return false;
        };
        match symbolizer::reread_proc_maps(local, &mapped.known) {
            Ok(Some(images)) => {
                mapped.known = images.clone();
                self.lock().set_images(images);
                true
            }
            _ => false,
        }
    }

    /// [`SharedProfiler::refresh_images`] before a window is named, when [`images_due`] says
    /// its images may have changed: reading `/proc/PID/maps` for every window of every process
    /// was the largest share of a node agent's CPU. True when they were read and had changed.
    /// `unresolved` says the window about to be named had frames in no known code or image.
    fn refresh_images_if_due(&self, unresolved: bool) -> bool {
        let mut mapped = self.images.lock().unwrap_or_else(|p| p.into_inner());
        mapped.unresolved_seen |= unresolved;
        let since = |at: Option<Instant>| at.map_or(Duration::MAX, |at| at.elapsed());
        let due = images_due(
            self.images_stale.load(Ordering::Relaxed),
            mapped.unresolved_seen,
            since(mapped.read_at),
            since(mapped.unresolved_read_at),
        );
        due && self.read_images(mapped)
    }

    /// Waits until the long-lived sessions have delivered events up to `until_ns` (Unix ns), or
    /// have been quiet long enough that nothing is pending, at most [`MAX_CATCH_UP`]: names of
    /// code bound or compiled during a window, and the spans its threads ran, arrive there,
    /// late on a loaded machine.
    async fn caught_up(&self, until_ns: i64) {
        let deadline = Instant::now() + MAX_CATCH_UP;
        let streams = [Some(&self.light), self.linkage.as_ref()];
        loop {
            let now_ms = self.elapsed_ms();
            let done = streams
                .iter()
                .flatten()
                .all(|stream| stream.caught_up(until_ns, now_ms));
            if done || Instant::now() >= deadline {
                return;
            }
            timer_grid::sleep(CATCH_UP_POLL).await;
        }
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Keeps the light session's exceptions whose spans the linkage session's stream has come to
    /// ([`ProcessProfiler::release_exceptions`]).
    fn release_exceptions(&self) {
        if self.linkage.is_some() {
            self.release_exceptions_of(&mut self.lock());
        }
    }

    /// [`SharedProfiler::release_exceptions`] with the profiler's lock held.
    fn release_exceptions_of(&self, profiler: &mut ProcessProfiler) {
        let Some(linkage) = self.linkage.as_deref() else {
            return;
        };
        let now_ms = self.elapsed_ms();
        profiler.release_exceptions(&|unix_nanos| linkage.caught_up(unix_nanos, now_ms));
    }

    /// How long since the linkage session last delivered a span start (or since attaching).
    fn since_span_start(&self) -> Duration {
        Duration::from_millis(
            self.elapsed_ms()
                .saturating_sub(self.span_start_ms.load(Ordering::Relaxed)),
        )
    }

    /// The process's thread names by tid, when its `/proc` may be read.
    fn thread_names(&self) -> HashMap<u64, String> {
        self.local
            .as_deref()
            .map(LocalProcess::thread_names)
            .unwrap_or_default()
    }

    /// Whether its `/proc` shows it gone (or the pid taken by another process).
    fn exited(&self) -> bool {
        self.local
            .as_deref()
            .is_some_and(|local| local.verify().is_err())
    }

    /// Its threads' CPU time now, when its `/proc` may be read.
    fn thread_cpu(&self) -> Option<ThreadCpu> {
        self.local.as_deref().map(LocalProcess::thread_cpu)
    }

    /// The whole process's CPU time now ([`LocalProcess::process_cpu`]).
    fn process_cpu(&self, files: &mut StatFiles) -> Option<ProcessCpu> {
        self.local
            .as_deref()
            .and_then(|local| local.process_cpu(files))
    }

    /// The CPU time of its threads `tids` now ([`LocalProcess::thread_cpu_of`]), through `files`
    /// when given.
    fn thread_cpu_of(
        &self,
        tids: &[u64],
        earlier: Option<&ThreadCpu>,
        files: Option<&mut StatFiles>,
    ) -> Option<ThreadCpu> {
        self.local
            .as_deref()
            .map(|local| local.thread_cpu_of(tids, earlier, files))
    }
}

/// The process's span tracking, for a session of a request's own: weak, since the profiler
/// holds the process's signals, which hold this.
struct LightSpans {
    profiler: std::sync::Weak<Mutex<ProcessProfiler>>,
    /// The stream the spans come from: the linkage session's, else the light session's.
    spans_stream: Arc<StreamProgress>,
    started: Instant,
}

impl LightSpans {
    fn of(shared: &SharedProfiler) -> Self {
        LightSpans {
            profiler: Arc::downgrade(&shared.profiler),
            spans_stream: shared
                .linkage
                .clone()
                .unwrap_or_else(|| shared.light.clone()),
            started: shared.started,
        }
    }
}

impl SpanSource for LightSpans {
    /// As [`SharedProfiler::caught_up`], without the wait.
    fn caught_up(&self, unix_nanos: i64) -> bool {
        let now_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.spans_stream.caught_up(unix_nanos, now_ms)
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

/// A process's mapped images as last read.
#[derive(Default)]
struct MappedImages {
    known: Vec<ImageRange>,
    read_at: Option<Instant>,
    /// A window named since `read_at` had frames in no known code or image.
    unresolved_seen: bool,
    /// When unresolved frames last had the images read again.
    unresolved_read_at: Option<Instant>,
}

/// Without a module load, unresolved frames have the images read again at once, and then at most
/// this often while frames stay unresolved: code outside every file, such as the runtime's
/// stubs, is named by no reading ...
const MAPS_RECHECK_UNRESOLVED: Duration = Duration::from_secs(30);
/// ... and every window at least this often.
const MAPS_RECHECK: Duration = Duration::from_secs(300);

/// Whether a process's mapped images are read again before naming a window: after a module
/// load (its image is mapped), after [`MAPS_RECHECK`], or when frames went unresolved and the
/// last re-reading for unresolved frames is [`MAPS_RECHECK_UNRESOLVED`] ago. That bound runs
/// from the re-reading unresolved frames caused, not from any reading: a listen-mode runtime maps
/// its libraries after the attach-time reading, and its first window must see them.
fn images_due(
    module_loaded: bool,
    unresolved_seen: bool,
    since_read: Duration,
    since_unresolved_read: Duration,
) -> bool {
    module_loaded
        || since_read >= MAPS_RECHECK
        || (unresolved_seen && since_unresolved_read >= MAPS_RECHECK_UNRESOLVED)
}

/// Feeds one long-lived session's events to the shared profiler, and keeps that stream's
/// progress.
struct StreamObserver {
    profiler: SharedProfiler,
    stream: Stream,
}

impl EventObserver for StreamObserver {
    fn on_event(&mut self, event: &Event<'_>) {
        let shared = &self.profiler;
        if self.stream == Stream::Logs {
            shared
                .logs
                .seen_ms
                .store(shared.elapsed_ms(), Ordering::Relaxed);
            shared.logs_feed.on_event(event);
            return;
        }
        match event.metadata.kind {
            EventKind::Module(ModuleEventKind::Load) => {
                shared.images_stale.store(true, Ordering::Relaxed);
            }
            // An entry point names its module through the image that holds it.
            EventKind::R2rEntryPoint if shared.images_stale.load(Ordering::Relaxed) => {
                shared.refresh_images();
            }
            EventKind::DiagnosticSource(kind) if kind.is_start() => {
                shared
                    .span_start_ms
                    .store(shared.elapsed_ms(), Ordering::Relaxed);
            }
            _ => {}
        }
        let mut profiler = shared.lock();
        profiler.observe(event);
        if let Some(progress) = shared.progress(self.stream) {
            progress.delivered(
                event.unix_nanos(),
                event.header.is_sorted,
                shared.elapsed_ms(),
            );
        }
        shared.release_exceptions_of(&mut profiler);
    }

    fn on_dropped(&mut self, count: u64) {
        let shared = &self.profiler;
        let Some(progress) = shared.progress(self.stream) else {
            return;
        };
        let total = progress.dropped.fetch_add(count, Ordering::Relaxed) + count;
        // One line per burst: drops come in runs while the buffers stay full.
        let now = shared.elapsed_ms().max(1);
        let logged = progress.drop_logged_ms.load(Ordering::Relaxed);
        if logged == 0 || now.saturating_sub(logged) >= DROP_LOG_INTERVAL.as_millis() as u64 {
            progress.drop_logged_ms.store(now, Ordering::Relaxed);
            tracing::warn!(
                pid = shared.pid,
                session = self.stream.name(),
                dropped = total,
                "the runtime dropped events of a session (its buffers were full): code compiled \
                 meanwhile may stay unnamed, and spans unlinked until their threads' next events"
            );
        }
    }
}

/// At most one log line about dropped events per this long and process.
const DROP_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// With trace linkage, when no span has started for this long by the end of a sampler window,
/// the linkage providers are enabled again: another session may have replaced their arguments
/// (the runtime keeps one DiagnosticSourceEventSource configuration per process, and a session
/// that ends hands the provider the arguments it was started with).
const LINKAGE_QUIET: Duration = Duration::from_secs(2);

/// The shortest time between two starts of a long-lived session that ended while its process ran.
const SESSION_RESTART_PAUSE: Duration = Duration::from_secs(1);

/// ... and after the sessions' parsers together ran out of `--nettrace-agent-budget`: room comes
/// back as other sessions end, not at once.
const BUDGET_RESTART_PAUSE: Duration = Duration::from_secs(30);

/// How long a runtime whose light session ended may take to answer before it is taken as gone.
const ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Collects one sampler window's stacks; its other events (allocation ticks) go to the profiler.
struct WindowSamples {
    samples: SampleAggregator,
    profiler: SharedProfiler,
}

impl EventObserver for WindowSamples {
    fn on_event(&mut self, event: &Event<'_>) {
        match event.metadata.kind {
            // Thousands a window: decoded without building a KnownEvent.
            EventKind::ThreadSample => {
                if let Ok(Some(sample)) = event.thread_sample() {
                    self.samples.add(event, &sample);
                }
            }
            EventKind::AllocationTick => {
                if let Ok(Some(KnownEvent::AllocationTick(_))) = event.known() {
                    self.profiler.lock().observe(event);
                }
            }
            _ => {}
        }
    }
}

/// JIT/Loader events for the code map, plus the events of the switched-on event profiles and
/// exceptions: from attach, since only the runtime's own provider is enabled (no startup grace),
/// and with stack walks, which only exceptions and lock waits need (a runtime that cannot leave
/// them out per session walks them anyway). With trace linkage, exceptions are joined to the
/// span of the linkage session's stream once it has caught up with them
/// ([`SharedProfiler::release_exceptions`]). Log messages have a session of their own
/// ([`Stream::Logs`]).
fn light_session(events: EventProfiles, signals: &SignalSettings) -> CollectTracing {
    let mut keywords = providers::RUNTIME_JIT_LOADER_KEYWORDS;
    if events.exceptions || signals.exceptions() {
        keywords |= providers::RUNTIME_EXCEPTION_KEYWORD;
    }
    if events.locks {
        keywords |= providers::RUNTIME_CONTENTION_KEYWORD;
    }
    let stacks = keywords != providers::RUNTIME_JIT_LOADER_KEYWORDS;
    // Verbose: MethodLoadVerbose names methods.
    let session = vec![ProviderConfig::new(
        providers::RUNTIME,
        keywords,
        level::VERBOSE,
    )];
    CollectTracing::v2(session)
        .with_rundown(false)
        .with_stackwalk(stacks)
}

/// The linkage providers, without stack walks: a span event's stack is never read, and walking
/// it was most of linkage's cost on .NET 8 (BENCHMARKS.md, "Trace linkage").
fn linkage_session(linkage: &[ProviderConfig]) -> CollectTracing {
    CollectTracing::v2(linkage.to_vec())
        .with_rundown(false)
        .with_stackwalk(false)
}

/// Whether a session taken with `version` walks its events' stacks: before CollectTracing3 a
/// session cannot leave them out.
fn stack_walks(asked: bool, version: CollectTracingVersion) -> bool {
    asked || version < CollectTracingVersion::V3
}

/// Apart from the sampler's window, allocation ticks are taken after one window in this many, for
/// this many times its length: the same share of the process's time, at a fraction of the
/// sessions (each costs a start and a stop on connections of their own, on both sides). Three
/// puts two allocation windows in every minute of the default duty cycle (10 s periods).
const ALLOC_PERIODS_APART: u32 = 3;

/// The sampler, plus GC allocation ticks when `alloc` (see [`alloc_provider`]).
fn sampler_session(alloc: bool) -> CollectTracing {
    let mut session = vec![ProviderConfig::new(
        providers::SAMPLE_PROFILER,
        0,
        level::INFORMATIONAL,
    )];
    if alloc {
        session.push(alloc_provider());
    }
    CollectTracing::v2(session).with_rundown(false)
}

/// GC allocation ticks alone: see [`SamplingLoop::alloc_window`].
fn alloc_session() -> CollectTracing {
    CollectTracing::v2(vec![alloc_provider()]).with_rundown(false)
}

/// GCAllocationTick, a Verbose event of the GC keyword, for the alloc profiles. Each tick walks
/// the allocating thread's stack, on that thread, once per ~100 KB allocated: measured at 4–5 % of
/// an allocation-heavy service's CPU when always on (BENCHMARKS.md), so ticks are duty-cycled
/// with the sampler instead of riding the light session.
fn alloc_provider() -> ProviderConfig {
    ProviderConfig::new(
        providers::RUNTIME,
        providers::RUNTIME_GC_KEYWORD,
        level::VERBOSE,
    )
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
    // A malformed variable names no service (the app's own SDK would refuse it too).
    parse_pairs("OTEL_RESOURCE_ATTRIBUTES", get("OTEL_RESOURCE_ATTRIBUTES")?)
        .ok()?
        .remove("service.name")
        .filter(|v| !v.is_empty())
}

/// How long a listen-mode runtime waits for the sessions it is held for (the light session, and
/// those a rule or linkage needs) before it is resumed anyway.
const RESUME_HOLD_TIMEOUT: Duration = Duration::from_secs(10);

/// A listen-mode runtime may wait at startup for a tool (`DOTNET_DiagnosticPorts` suspends by
/// default): it is resumed once the light session is enabled (a suspended runtime writes no
/// stream: waiting for its first bytes only delayed the app by the timeout), so every method it
/// binds or compiles is announced there, and whatever else happens, before the runtime's task
/// ends. Where it waits, the sessions of `Startup` rules and linkage are enabled first too, as
/// dotnet-monitor does, so that they see the process from its first managed code.
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
        // Taken before the command: the runtime cannot run earlier. A startup trace's first
        // sample is compared with it (tests/suite/startup.rs).
        let asked = profile::clock::unix_nanos();
        match self.client.resume_runtime().await {
            Ok(()) => tracing::info!(pid = self.pid, resumed_unix_ns = asked, "runtime resumed"),
            Err(error) => tracing::debug!(pid = self.pid, %error, "resuming the runtime failed"),
        }
    }
}

/// Whether the runtime's `DOTNET_DiagnosticPorts` makes it wait for a ResumeRuntime at startup:
/// a port suspends unless tagged `nosuspend`.
fn waits_for_resume(environment: &[(String, String)]) -> bool {
    environment
        .iter()
        .filter(|(k, _)| k == "DOTNET_DiagnosticPorts")
        .flat_map(|(_, v)| v.split(';'))
        .filter(|port| !port.trim().is_empty())
        .any(|port| !port.split(',').skip(1).any(|tag| tag.trim() == "nosuspend"))
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
    let known_kinds = {
        let version = info.clr_product_version.as_deref().unwrap_or_default();
        match local.as_ref() {
            Some(local) => local.untrusted_kinds(version),
            None => collector::samples::untrusted_kinds_of(version, false),
        }
    };
    let grace = agent.settings.startup_grace.unwrap_or_else(|| {
        let version = info.clr_product_version.as_deref().unwrap_or_default();
        collector::startup::startup_grace(version)
    });
    let grace = StartupGrace::of(local.as_ref(), grace);
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
    // A runtime waiting to be resumed runs no managed code yet: the sessions of Startup rules
    // and linkage are enabled now, before it, where the runtime was seen not to hang then.
    let holds = ResumeHolds::default();
    let before_resume = (gate.pending
        && waits_for_resume(&environment)
        && collector::startup::sessions_before_resume(
            info.clr_product_version.as_deref().unwrap_or_default(),
        ))
    .then_some(&holds);
    let sampler =
        SamplerControl::new(agent.settings.duty).with_idle_below(agent.settings.idle_below);
    let rule_states = RuleStates::default();
    let mut signals = ProcessSignals::new(
        agent.settings.signals.limits,
        agent.settings.signals.logs.clone(),
        agent.settings.signals.share(),
    );
    if agent.settings.signals.spans.is_some() {
        signals = signals.with_spans();
    }
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
    let wait = grace.remaining();
    if !wait.is_zero() {
        tracing::info!(
            pid = target.pid,
            wait_s = wait.as_secs(),
            "the process has just started: its EventSources (runtime counters, trace linkage, logs, \
             collection rules) are enabled once it has run --startup-grace"
        );
    }
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
            service_name: &service,
            facts: ProcessFacts {
                pid: target.pid,
                name: &executable,
                command_line,
                managed_entry_point_assembly_name: &entry_assembly,
            },
            sampler: sampler.clone(),
            states: rule_states,
            signals: signals.clone(),
            grace,
            before_resume,
        },
        &agent.processes,
        &agent.incidents,
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
    // The resource of its exported logs, spans and metrics.
    let resource: std::sync::Arc<[(String, String)]> = series.clone().into();
    // Samples are joined to spans up to a whole (boosted) window plus the naming delay late.
    let linkage = agent.settings.linkage.is_some().then(|| TrackerLimits {
        retention: MAX_WINDOW + SYMBOLIZE_DELAY + Duration::from_secs(5),
        ..TrackerLimits::default()
    });
    if agent.exports.want_logs() || agent.exports.want_traces() {
        let exports = agent.exports.clone();
        let logs = exports.want_logs().then(|| signals.subscribe());
        let spans = exports.want_traces().then(|| signals.subscribe_spans());
        tokio::spawn(exports.forward_signals(
            resource.clone(),
            logs,
            signals.collected_logs().cloned(),
            spans,
            agent.settings.signals.spans.unwrap_or(0),
        ));
    }
    let profiler = SharedProfiler::new(
        ProcessProfiler::new(series, agent.settings.events, linkage)
            .with_signals(SignalCollector::new(signals.clone())),
        local,
        target.pid,
        &signals,
    );
    // A `/logs` session of its own joins its messages to the spans the light session tracks.
    signals.set_span_lookup(SpanLookup(Arc::new(LightSpans::of(&profiler))));

    // Fires when this function returns: the process's other tasks end with it.
    let (_detaching, detached) = tokio::sync::oneshot::channel::<()>();
    if let Some(config) = agent.settings.runtime_counters.clone() {
        let shutdown = agent.shutdown.clone();
        let stop = async move {
            tokio::select! {
                () = stopped(shutdown) => {}
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
                share: signals.share().clone(),
            },
            grace,
            stop,
        ));
    }
    let long = |stream, config, renew| LongSession {
        client: client.clone(),
        pid: target.pid,
        stream,
        config,
        parser: agent.settings.parser.clone(),
        profiler: profiler.clone(),
        shutdown: agent.shutdown.clone(),
        health: agent.health.clone(),
        renew,
    };
    let config = light_session(agent.settings.events, &agent.settings.signals);
    let mut light = tokio::spawn(run_long_session(
        long(Stream::Light, config, None),
        holds.hold(),
    ));
    let renew_linkage = agent
        .settings
        .linkage
        .as_ref()
        .map(|_| Arc::new(Notify::new()));
    let linkage = agent.settings.linkage.as_ref().map(|providers| {
        let config = linkage_session(providers);
        let session = long(Stream::Linkage, config, renew_linkage.clone());
        let shutdown = agent.shutdown.clone();
        let profiler = profiler.clone();
        let hold = before_resume.and_then(ResumeHolds::hold);
        tokio::spawn(async move {
            let linkage = async {
                if hold.is_some() || grace.wait_or(stopped(shutdown)).await {
                    let _ = run_long_session(session, hold).await;
                }
            };
            // Exceptions waiting for their spans are kept while both streams are quiet too.
            let ticking = async {
                loop {
                    timer_grid::sleep(LIGHT_QUIET).await;
                    profiler.release_exceptions();
                }
            };
            tokio::select! {
                () = linkage => {}
                never = ticking => never,
            }
            profiler.lock().release_exceptions(&|_| true);
        })
    });
    let logs = {
        let session = run_logs_session(
            long(Stream::Logs, CollectTracing::v2(Vec::new()), None),
            signals.logs_demand().clone(),
        );
        let shutdown = agent.shutdown.clone();
        // The logging EventSource is enabled once the grace has passed, as linkage's are.
        tokio::spawn(async move {
            if grace.wait_or(stopped(shutdown)).await {
                session.await;
            }
        })
    };
    // A session failing to start ends the wait too (its hold is dropped).
    if !holds.released(RESUME_HOLD_TIMEOUT).await {
        tracing::warn!(
            pid = target.pid,
            timeout_s = RESUME_HOLD_TIMEOUT.as_secs(),
            "sessions were not enabled in time; going on without them"
        );
    }
    gate.open().await;
    // Started after the light session, so code loaded in between is named by one or the other.
    let pid32 = u32::try_from(target.pid).unwrap_or(0);
    // As anyhow, so that its causes are described with it.
    let rundown = session::rundown(
        client,
        pid32,
        profiler.observer(Stream::Rundown),
        &agent.settings.parser,
    )
    .await;
    {
        let mut profiler = profiler.lock();
        profiler.rundown_done(rundown.is_ok());
        profiler.shrink_to_fit();
    }
    if let Err(error) = rundown.map_err(anyhow::Error::from) {
        tracing::warn!(pid = target.pid, error = %crate::describe(&error), "rundown failed; frames of code loaded before attaching stay unnamed until one succeeds (retried later, at longer intervals)");
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
        renew_linkage,
        published: Published::default(),
        cpu_at_last_stop: None,
        known_kinds,
        warned_kinds: false,
        stat_files: StatFiles::default(),
        dropped_events: HashMap::new(),
        idle_periods: 0,
        idle_period_start: None,
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
    for task in linkage.into_iter().chain([logs]) {
        if *agent.shutdown.borrow() {
            let _ = task.await;
        } else {
            task.abort();
        }
    }
    let names = profiler.thread_names();
    send(&agent.sink, profiler.lock().take_event_batches(&names), 0);
    agent.health.losses.remove(&target.pid.to_string());
    tracing::info!(pid = target.pid, "detached");
    result.map(|()| Outcome::Profiled)
}

/// One of a process's long-lived sessions.
struct LongSession {
    client: DiagnosticsClient,
    pid: u64,
    stream: Stream,
    config: CollectTracing,
    parser: ParserOptions,
    profiler: SharedProfiler,
    shutdown: watch::Receiver<bool>,
    health: Health,
    /// Stops the session and starts a new one at once (linkage: its providers' arguments are
    /// applied again when the new session enables them).
    renew: Option<Arc<Notify>>,
}

/// Runs a long-lived session until the agent stops or the process exits; `enabled` is released once
/// the runtime has enabled it. A session that ends while the runtime still answers (another
/// tool stopped it, its stream did not parse) is started again, so that names and spans keep
/// coming; what happened in between is lost, and counted.
async fn run_long_session(
    long: LongSession,
    mut enabled: Option<ResumeHold>,
) -> Result<session::SessionSummary, session::SessionError> {
    let _open = GaugeGuard::new(&long.health.sessions);
    let pid_label = long.pid.to_string();
    let name = long.stream.name();
    let pid = long.pid;
    // The loss series exist at 0 from the start: an alert's `increase()` sees no increase in a
    // series' first sample, so one that appeared only at the first restart would hide it.
    let restarts = long
        .health
        .losses
        .session_restarts
        .with(&[&pid_label, name]);
    long.health.losses.dropped_events.with(&[&pid_label, name]);
    let refreshes = (long.stream == Stream::Linkage)
        .then(|| long.health.losses.linkage_refreshes.with(&[&pid_label]));
    loop {
        let mut sink = ParsingWriter::with_options(
            tokio::io::sink(),
            long.profiler.observer(long.stream),
            long.parser.clone(),
        )
        .ending_on_error();
        let renew = long.renew.clone();
        let mut renewing = false;
        let stop = async {
            match renew {
                Some(renew) => tokio::select! {
                    () = stopped(long.shutdown.clone()) => {}
                    () = renew.notified() => renewing = true,
                },
                None => stopped(long.shutdown.clone()).await,
            }
        };
        let mut announced = false;
        let profiler = &long.profiler;
        let stream = long.stream;
        let on_enabled = |progress: SessionProgress| {
            if !std::mem::replace(&mut announced, true) {
                if stream == Stream::Linkage {
                    // A new linkage session is given the quiet time to see a span start.
                    profiler
                        .span_start_ms
                        .store(profiler.elapsed_ms(), Ordering::Relaxed);
                }
                // The id another tool would stop it by (StopTracing).
                tracing::info!(
                    pid,
                    session = name,
                    session_id = progress.session_id,
                    command = progress.version.name(),
                    stack_walks = stack_walks(long.config.request_stackwalk, progress.version),
                    "session enabled"
                );
                if let Some(enabled) = enabled.take() {
                    enabled.release();
                }
            }
        };
        let result = session::run_reading(
            &long.client,
            long.config.clone(),
            &mut sink,
            stop,
            STOP_TIMEOUT,
            on_enabled,
            Reading::OnTimerGrid,
        )
        .await;
        if *long.shutdown.borrow() || matches!(result, Err(session::SessionError::Start(_))) {
            return result;
        }
        if stream == Stream::Linkage {
            // Spans that stop before the next session is on are never seen to stop.
            profiler.lock().linkage_stream_ended();
        }
        if renewing {
            if let Some(refreshes) = &refreshes {
                refreshes.inc();
            }
            continue;
        }
        let alive = tokio::time::timeout(ALIVE_TIMEOUT, long.client.process_info()).await;
        if !matches!(alive, Ok(Ok(_))) {
            return result;
        }
        let reason = match &result {
            Ok(_) => "ended by the runtime (stopped by another tool?)".to_string(),
            Err(error) => error.to_string(),
        };
        restarts.inc();
        tracing::warn!(
            pid,
            session = name,
            %reason,
            "a long-lived session ended while the process runs; starting a new one (what it \
             would have reported in between is lost)"
        );
        let over_agent_budget = matches!(
            &result,
            Err(session::SessionError::OverLimit {
                source: NettraceError::OverSharedBudget { .. },
                ..
            })
        );
        let pause = if over_agent_budget {
            BUDGET_RESTART_PAUSE
        } else {
            SESSION_RESTART_PAUSE
        };
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = stopped(long.shutdown.clone()) => return result,
        }
    }
}

/// Where other tools' connections cannot be watched ([`other_session_ended`]), a logs session
/// quiet for this long is started again (doubling, up to [`LOGS_QUIET_MAX`], while sessions
/// started so bring nothing): when any other session with the logging provider ends, the runtime
/// turns the process's loggers off for every session, and only a session enabled anew turns them
/// on again; nothing tells a session that this happened. A renewal itself turns the loggers off
/// until its new session is enabled, so each costs what is logged meanwhile; 3 s would leave a
/// fresh `/logs` request after another tool's session blind for most of its window.
const LOGS_QUIET: Duration = Duration::from_secs(1);
const LOGS_QUIET_MAX: Duration = Duration::from_secs(64);
/// How often a logs session's quiet is looked at, and its messages waiting for their spans.
const LOGS_TICK: Duration = Duration::from_millis(100);

/// Why the process's logs session is started again (the `reason` of
/// `clrscope_logs_session_renewals_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogsRenewal {
    /// What it asks for changed ([`LogsDemand`]).
    Union,
    /// Another tool's connection to the runtime went away: if it was a session with the logging
    /// provider, its end turned the loggers off.
    OtherSession,
    /// It brought nothing for a while ([`LOGS_QUIET`]) where other connections cannot be
    /// watched: the fallback for an end not seen.
    Quiet,
}

impl LogsRenewal {
    const ALL: [LogsRenewal; 3] = [
        LogsRenewal::Union,
        LogsRenewal::OtherSession,
        LogsRenewal::Quiet,
    ];

    fn label(self) -> &'static str {
        match self {
            LogsRenewal::Union => "union",
            LogsRenewal::OtherSession => "other_session",
            LogsRenewal::Quiet => "quiet",
        }
    }
}

/// How a logs session is had: started by its run, or by a renewal back to back with the old
/// one's stop.
enum LogsStart {
    Fresh(CollectTracing),
    Started(session::Started),
}

/// How one logs session ended.
enum LogsEnd {
    /// It ended (the agent stops, the runtime ended it, it failed).
    Ended(Result<session::SessionSummary, session::SessionError>),
    /// It was stopped and `next` started back to back, for `reason`.
    Renewed {
        reason: LogsRenewal,
        next: Option<(u64, session::Started)>,
    },
}

/// Runs the process's logs session while anybody asks for logs, at the union of every demand
/// ([`LogsDemand`]): started again when the union changes (a wider one at once, a narrower one
/// later), when another tool's connection to the runtime goes away (where that cannot be
/// watched: when it has been quiet for a while, see [`LOGS_QUIET`]), and when it ends while the
/// process runs; until the agent stops or the process exits. Each start again is counted on
/// `/metrics` (`clrscope_logs_session_renewals_total`, by reason).
///
/// Why renewals: any session with `Microsoft-Extensions-Logging` that ends turns the app's
/// loggers off for every session. The runtime updates each provider of the ending session
/// (`config_enable_disable` → `provider_unset_config` in src/native/eventpipe/ep-config.c and
/// ep-provider.c) and calls the provider's callback without a session id;
/// `EventPipeEventProvider.HandleSessionEnable` passes that on as `Update` with session -1,
/// which `EventSource.DoCommand` turns into `Disable`, and `LoggingEventSource.OnEventCommand`
/// answers `Disable` with `SetFilterSpec(null)`: every EventSource logger at `None` until the
/// next session's `Enable`. So what the app logs from a session's end until a session is
/// enabled again is never handed on; the agent shortens that by enabling one at once.
async fn run_logs_session(long: LongSession, demand: Arc<LogsDemand>) {
    let pid_label = long.pid.to_string();
    let renewals = &long.health.losses.logs_renewals;
    // The series exist at 0 from the start (see run_long_session).
    for reason in LogsRenewal::ALL {
        renewals.with(&[&pid_label, reason.label()]);
    }
    let restarts = long
        .health
        .losses
        .session_restarts
        .with(&[&pid_label, Stream::Logs.name()]);
    let others = OtherConnections::new(&long.client, long.pid).map(|w| Arc::new(Mutex::new(w)));
    let mut quiet_after = LOGS_QUIET;
    let mut next: Option<(u64, session::Started)> = None;
    loop {
        let (generation, start) = match next.take() {
            Some((generation, started)) => (generation, LogsStart::Started(started)),
            None => match demand.session() {
                Some((generation, config)) => (generation, LogsStart::Fresh(config)),
                None => {
                    // Nobody asks: no session until somebody does.
                    tokio::select! {
                        () = demand.changed(0) => continue,
                        () = stopped(long.shutdown.clone()) => return,
                    }
                }
            },
        };
        let enabled_ms = AtomicU64::new(u64::MAX);
        let due = logs_renewal_due(
            &long,
            &demand,
            generation,
            &enabled_ms,
            quiet_after,
            others.as_ref(),
        );
        let end = logs_session_once(&long, &demand, generation, start, &enabled_ms, due).await;
        if *long.shutdown.borrow() {
            return;
        }
        let result = match end {
            LogsEnd::Renewed {
                reason,
                next: started,
            } => {
                renewals.with(&[&pid_label, reason.label()]).inc();
                let heard = long.profiler.logs.seen_ms.load(Ordering::Relaxed)
                    >= enabled_ms.load(Ordering::Relaxed);
                quiet_after = if reason == LogsRenewal::Quiet && !heard {
                    (quiet_after * 2).min(LOGS_QUIET_MAX)
                } else {
                    LOGS_QUIET
                };
                tracing::debug!(
                    pid = long.pid,
                    reason = reason.label(),
                    "the logs session started again"
                );
                if started.is_some() {
                    next = started;
                    continue;
                }
                Ok(None)
            }
            LogsEnd::Ended(result) => result.map(Some),
        };
        let alive = tokio::time::timeout(ALIVE_TIMEOUT, long.client.process_info()).await;
        if !matches!(alive, Ok(Ok(_))) {
            return;
        }
        if matches!(result, Ok(None)) {
            // Renewed, but nobody asks any more, or its start failed: started afresh.
            continue;
        }
        restarts.inc();
        let reason = match &result {
            Ok(_) => "ended by the runtime".to_string(),
            Err(error) => error.to_string(),
        };
        tracing::warn!(pid = long.pid, session = "logs", %reason, "the logs session ended while the process runs; starting a new one");
        tokio::select! {
            () = tokio::time::sleep(SESSION_RESTART_PAUSE) => {}
            () = stopped(long.shutdown.clone()) => return,
        }
    }
}

/// Runs one logs session until it ends or `renewal` ([`logs_renewal_due`]) says it is to be
/// started again; then stops it and starts the next back to back
/// ([`session::stop_then_start`]), so that the loggers its stop turns off are on again as soon
/// as the runtime can. `enabled_ms`: when the runtime enabled it (see [`logs_went_quiet`]).
async fn logs_session_once(
    long: &LongSession,
    demand: &LogsDemand,
    generation: u64,
    start: LogsStart,
    enabled_ms: &AtomicU64,
    renewal: impl Future<Output = LogsRenewal>,
) -> LogsEnd {
    let _open = GaugeGuard::new(&long.health.sessions);
    let mut sink = ParsingWriter::with_options(
        tokio::io::sink(),
        long.profiler.observer(Stream::Logs),
        long.parser.clone(),
    )
    .ending_on_error();
    let session_id = AtomicU64::new(0);
    let on_enabled = |p: SessionProgress| {
        if enabled_ms.load(Ordering::Relaxed) == u64::MAX {
            session_id.store(p.session_id, Ordering::Relaxed);
            enabled_ms.store(long.profiler.elapsed_ms(), Ordering::Relaxed);
            demand.enabled(generation);
            tracing::info!(
                pid = long.pid,
                session = "logs",
                session_id = p.session_id,
                command = p.version.name(),
                // Logs sessions never ask for stacks (`LogsDemand::session`).
                stack_walks = stack_walks(false, p.version),
                generation,
                "session enabled"
            );
        }
    };
    // Only the agent's stop stops it through its reading; a renewal stops it from here.
    let stop = stopped(long.shutdown.clone());
    let session = async {
        match start {
            LogsStart::Fresh(config) => {
                session::run_reading(
                    &long.client,
                    config,
                    &mut sink,
                    stop,
                    STOP_TIMEOUT,
                    on_enabled,
                    Reading::OnTimerGrid,
                )
                .await
            }
            LogsStart::Started(started) => {
                session::read_started(
                    &long.client,
                    started,
                    &mut sink,
                    stop,
                    STOP_TIMEOUT,
                    on_enabled,
                    Reading::OnTimerGrid,
                )
                .await
            }
        }
    };
    tokio::pin!(session);
    let run = async {
        let reason = tokio::select! {
            result = &mut session => return LogsEnd::Ended(result),
            reason = renewal => reason,
        };
        let running = session_id.load(Ordering::Relaxed);
        demand.ended();
        let Some((next_generation, config)) = demand.session() else {
            // Nobody asks any more: stopped, no next.
            let stop = long.client.stop_tracing(running, STOP_TIMEOUT);
            let (_, _) = tokio::join!(stop, tokio::time::timeout(STOP_TIMEOUT, &mut session));
            return LogsEnd::Renewed { reason, next: None };
        };
        let restart = session::stop_then_start(&long.client, running, STOP_TIMEOUT, config);
        // The old stream is read to its end meanwhile: the runtime flushes it before it answers.
        let drained = tokio::time::timeout(STOP_TIMEOUT, &mut session);
        let ((stopped, started), _) = tokio::join!(restart, drained);
        if let Err(error) = stopped {
            tracing::warn!(pid = long.pid, %error, "stopping the logs session to start it again");
        }
        let next = match started {
            Ok(started) => Some((next_generation, started)),
            Err(error) => {
                tracing::warn!(pid = long.pid, %error, "starting the logs session again");
                None
            }
        };
        LogsEnd::Renewed { reason, next }
    };
    // Records waiting for their spans are released while the session is quiet too.
    let ticking = async {
        let mut tick = tokio::time::interval(LOGS_TICK);
        loop {
            tick.tick().await;
            long.profiler.logs_feed.release(false);
        }
    };
    tokio::select! {
        end = run => end,
        never = ticking => never,
    }
}

/// Resolves with the reason once the logs session asking for `generation` is to be started
/// again, and the runtime has enabled it (it is stopped by its id): its union changed, or another
/// tool's session may have turned the loggers off ([`other_session_ended`]).
async fn logs_renewal_due(
    long: &LongSession,
    demand: &LogsDemand,
    generation: u64,
    enabled_ms: &AtomicU64,
    quiet_after: Duration,
    others: Option<&Arc<Mutex<OtherConnections>>>,
) -> LogsRenewal {
    let reason = tokio::select! {
        () = demand.changed(generation) => LogsRenewal::Union,
        reason = other_session_ended(long, enabled_ms, quiet_after, others) => reason,
    };
    while enabled_ms.load(Ordering::Relaxed) == u64::MAX {
        tokio::time::sleep(LOGS_TICK).await;
    }
    reason
}

/// Resolves once another tool's connection to the runtime went away (looked at every
/// [`LOGS_TICK`], see [`OtherConnections`]). Only where that cannot be watched (a runtime that
/// dials the agent, or the watch failed) once the session has been quiet for `quiet_after`: a
/// stream that delivers nothing for a second is, under load, mostly one whose delivery stalls
/// while the app still logs, and renewing it then loses what is logged between the stop and the
/// start (33 renewals cost the Storefront twin 35 of 16,194 records in 600 s).
async fn other_session_ended(
    long: &LongSession,
    enabled_ms: &AtomicU64,
    quiet_after: Duration,
    others: Option<&Arc<Mutex<OtherConnections>>>,
) -> LogsRenewal {
    if let Some(watch) = others {
        loop {
            tokio::time::sleep(LOGS_TICK).await;
            // /proc and netlink: off the async threads. Held in a mutex, the watch outlives a
            // look this future is dropped in.
            let watch = Arc::clone(watch);
            let looked = tokio::task::spawn_blocking(move || {
                watch.lock().unwrap_or_else(|p| p.into_inner()).look()
            })
            .await;
            match looked {
                Ok(Ok(true)) => return LogsRenewal::OtherSession,
                Ok(Ok(false)) | Err(_) => {}
                Ok(Err(error)) => {
                    tracing::warn!(pid = long.pid, %error, "cannot watch the runtime's diagnostics connections: another tool's session that ends is noticed by the logs session's quiet only");
                    break;
                }
            }
        }
    }
    logs_went_quiet(&long.profiler, enabled_ms, quiet_after).await;
    LogsRenewal::Quiet
}

/// Resolves once the logs session has delivered nothing for `quiet_after` since it was enabled
/// (`enabled_ms`, ms since the profiler's start; `u64::MAX` until then) or since its last event.
async fn logs_went_quiet(profiler: &SharedProfiler, enabled_ms: &AtomicU64, quiet_after: Duration) {
    let quiet_ms = u64::try_from(quiet_after.as_millis()).unwrap_or(u64::MAX);
    loop {
        tokio::time::sleep(LOGS_TICK).await;
        let enabled = enabled_ms.load(Ordering::Relaxed);
        if enabled == u64::MAX {
            continue;
        }
        let last = profiler.logs.seen_ms.load(Ordering::Relaxed).max(enabled);
        if profiler.elapsed_ms().saturating_sub(last) >= quiet_ms {
            return;
        }
    }
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
    /// Take allocation ticks: in a window of their own after one sampler window in
    /// [`ALLOC_PERIODS_APART`] (see
    /// [`SamplingLoop::alloc_window`]), or in the sampler's when boosted.
    alloc: bool,
    health: Health,
    parser: &'a ParserOptions,
    /// Renews the linkage session, when trace linkage is on.
    renew_linkage: Option<Arc<Notify>>,
    /// What was last added to the loss metrics.
    published: Published,
    /// The threads' CPU time when the last window stopped.
    cpu_at_last_stop: Option<ThreadCpu>,
    /// Why the runtime's sample kinds cannot be trusted, when its version says so
    /// ([`collector::samples::untrusted_kinds_of`]): each window's cpu is then estimated from
    /// the kernel's per-thread CPU.
    known_kinds: Option<UntrustedKinds>,
    /// Whether untrusted kinds were logged: once per process.
    warned_kinds: bool,
    /// The `stat` files the last window's reading read, kept open for the next.
    stat_files: StatFiles,
    /// This process's series of the dropped-events counter, by stream: looked up once, since a
    /// lookup builds the label values and searches every process's series.
    dropped_events: HashMap<&'static str, Counter>,
    /// Periods whose window was skipped, the process being idle, since its last window.
    idle_periods: u32,
    /// The start of the latest period whose window was skipped.
    idle_period_start: Option<Instant>,
}

/// The totals of a process's losses already added to `/metrics`.
#[derive(Debug, Default)]
struct Published {
    tracker: TrackerStats,
    light_dropped: u64,
    linkage_dropped: u64,
    logs_dropped: u64,
}

/// What became of a duty-cycled session.
enum Window<T> {
    /// It ran: what it took.
    Took(T),
    /// It failed because the process exited: the process's profiling ends.
    ProcessExited,
}

impl SamplingLoop<'_> {
    /// Samples by the duty cycle (or boost) and flushes event profiles once per period, until
    /// the agent stops.
    async fn run(mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        let mut period_start = timer_grid::floor(Instant::now());
        let mut refresh_names = true;
        // Sampler windows that had room for allocation ticks apart: one in ALLOC_PERIODS_APART
        // of them is followed by a window of allocation ticks, the first among them.
        let mut windows_with_room: u32 = 0;
        loop {
            if *self.shutdown.borrow() {
                return Ok(());
            }
            let now = Instant::now();
            let step = match self.sampler.step(period_start, now) {
                SamplerStep::Sample { boosted: false, .. } if self.skips_idle(period_start) => {
                    SamplerStep::Pause {
                        until: period_start + self.sampler.status().duty.period,
                    }
                }
                step => step,
            };
            match step {
                SamplerStep::Sample { until, boosted } => {
                    let now_ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    if refresh_names && self.profiler.lock().wants_rundown(now_ns) {
                        refresh_names = self.refresh_names().await;
                    }
                    // Before the window, so that a window is linked again once a loss is seen.
                    self.check_losses().await;
                    let opened = Instant::now();
                    let period = self.sampler.status().duty.period;
                    // Boosted, or without room in the period, ticks share the sampler's window.
                    let alloc_apart = self.alloc
                        && !boosted
                        && until.saturating_duration_since(opened) * (ALLOC_PERIODS_APART + 1)
                            <= period;
                    let alloc_after =
                        alloc_apart && windows_with_room.is_multiple_of(ALLOC_PERIODS_APART);
                    if alloc_apart {
                        windows_with_room = windows_with_room.wrapping_add(1);
                    }
                    // Skipped while idle, those periods are this window's too.
                    let periods = std::mem::take(&mut self.idle_periods) + 1;
                    match self.window(until, self.alloc && !alloc_apart).await {
                        Ok(Window::Took((mut samples, thread_names))) => {
                            self.sampler
                                .observe_window(samples.samples(), samples.ticks());
                            // Duty-cycled, the window stands for its whole period; boosted,
                            // windows follow each other and stand for themselves.
                            if !boosted {
                                samples.set_stands_for(period * periods);
                            }
                            self.symbolize_later(samples, thread_names);
                            if alloc_after {
                                let until = Instant::now() + opened.elapsed() * ALLOC_PERIODS_APART;
                                match self.alloc_window(until).await {
                                    Ok(Window::Took(_)) => {}
                                    Ok(Window::ProcessExited) => return Ok(()),
                                    Err(error) => {
                                        tracing::warn!(pid = self.pid, error = %crate::describe(&error), "allocation window failed; trying again after a later sampler window");
                                    }
                                }
                            }
                        }
                        // Its profiling ends as its sessions see it go.
                        Ok(Window::ProcessExited) => return Ok(()),
                        Err(error) => {
                            tracing::warn!(pid = self.pid, error = %crate::describe(&error), "sampler window failed; trying again next period");
                            self.pause(period_start + self.sampler.status().duty.period)
                                .await;
                            period_start = timer_grid::floor(Instant::now());
                        }
                    }
                    if boosted {
                        period_start = Instant::now();
                    }
                }
                SamplerStep::Pause { until } => {
                    // Thread names are read only for events to name: most processes have none.
                    if self.profiler.lock().has_event_samples() {
                        let threads = self.profiler.lock().event_sample_threads();
                        let names = self
                            .profiler
                            .thread_cpu_of(&threads, self.cpu_at_last_stop.as_ref(), None)
                            .map(|mut reading| reading.take_names())
                            .unwrap_or_default();
                        send(
                            &self.sink,
                            self.profiler.lock().take_event_batches(&names),
                            0,
                        );
                    }
                    if until <= now {
                        period_start = timer_grid::floor(now);
                        continue;
                    }
                    if self.pause(until).await {
                        period_start = until;
                    }
                }
            }
        }
    }

    /// Whether the window of the period starting at `period_start` is skipped, the process
    /// having run less than the sampler's idle share of a core since its last window stopped
    /// ([`SamplerControl::skips_idle_period`]). Asked again within the period, the answer stands.
    fn skips_idle(&mut self, period_start: Instant) -> bool {
        if self.idle_period_start == Some(period_start) {
            return true;
        }
        let last_stop = self.cpu_at_last_stop.as_ref().and_then(ThreadCpu::process);
        let cores = match (last_stop, self.profiler.process_cpu(&mut self.stat_files)) {
            (Some(then), Some(now)) => now.cores_since(then),
            _ => None,
        };
        let skips = self.sampler.skips_idle_period(cores, self.idle_periods);
        if skips {
            self.idle_periods += 1;
            self.idle_period_start = Some(period_start);
        }
        skips
    }

    /// Runs a rundown to name code the sampler found in managed images without a known method;
    /// false once a rundown names nothing new (ReadyToRun code only called from its own image is
    /// never listed), so it is not repeated for ever.
    async fn refresh_names(&self) -> bool {
        let before = self.profiler.lock().code_map().functions().len();
        let pid = u32::try_from(self.pid).unwrap_or(0);
        let rundown = session::rundown(
            self.client,
            pid,
            self.profiler.observer(Stream::Rundown),
            self.parser,
        )
        .await;
        {
            let mut profiler = self.profiler.lock();
            profiler.rundown_done(rundown.is_ok());
            profiler.shrink_to_fit();
        }
        if let Err(error) = rundown.map_err(anyhow::Error::from) {
            tracing::warn!(pid = self.pid, error = %crate::describe(&error), "refreshing method names failed; retried later, at longer intervals");
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

    /// Runs one sampler session until `until` or the agent's stop, with allocation ticks when
    /// `alloc`; its samples, and the names of the process's threads as it stopped.
    async fn window(
        &mut self,
        until: Instant,
        alloc: bool,
    ) -> anyhow::Result<Window<(SampleAggregator, HashMap<u64, String>)>> {
        let mut samples = SampleAggregator::new(0);
        if self.keep_times {
            samples = samples.keep_times();
        }
        if let Some(why) = &self.known_kinds {
            samples.distrust_kinds(why.clone());
        }
        let opened_unix_ms = profile::clock::unix_millis();
        // A window stands for the time since the last one stopped (its duty period), so each
        // thread's CPU is measured over that time: within the window itself the sampler's
        // suspensions hold threads back, less so outside it.
        let cpu_since = self
            .cpu_at_last_stop
            .take()
            .or_else(|| self.profiler.thread_cpu());
        let Window::Took(sink) = self
            .run_window(sampler_session(alloc), samples, until)
            .await?
        else {
            return Ok(Window::ProcessExited);
        };
        // When the target was sampled, on the wall clock: what benches/agent_overhead.py
        // lines up with the target's own throughput to see what a window costs.
        tracing::debug!(
            pid = self.pid,
            opened_unix_ms,
            closed_unix_ms = profile::clock::unix_millis(),
            "sampler window closed"
        );
        let interval = sink.parser().trace().map(|t| t.expected_cpu_sampling_rate);
        let (_, WindowSamples { mut samples, .. }) = sink.into_parts();
        if let Some(interval) = interval {
            samples.set_expected_interval(interval);
        }
        // Only the sampled threads are read: the ones whose samples are weighed and named, and
        // (a process's set of threads in managed code changing slowly) the next window's.
        let mut cpu_at_stop = self.profiler.thread_cpu_of(
            &samples.thread_ids(),
            cpu_since.as_ref(),
            Some(&mut self.stat_files),
        );
        if let (Some(since), Some(now)) = (&cpu_since, &cpu_at_stop) {
            samples.set_thread_cpu(&now.cores_since(since));
        }
        if !self.warned_kinds {
            self.warned_kinds = crate::live::warn_untrusted_kinds(self.pid, &samples);
        }
        // The next window reads the threads' times and places from it, not their names.
        let thread_names = cpu_at_stop
            .as_mut()
            .map(ThreadCpu::take_names)
            .unwrap_or_default();
        self.cpu_at_last_stop = cpu_at_stop;
        Ok(Window::Took((samples, thread_names)))
    }

    /// Takes allocation ticks until `until` or the agent's stop, in a session of their own right
    /// after the sampler's window (one in [`ALLOC_PERIODS_APART`]): the GC keyword they need also
    /// brings the GCSuspendEE and GCRestartEE events of every sampler tick (four events a tick,
    /// more than the samples), which the runtime would write and the agent parse for nothing.
    async fn alloc_window(
        &mut self,
        until: Instant,
    ) -> anyhow::Result<Window<ParsingWriter<tokio::io::Sink, WindowSamples>>> {
        self.run_window(alloc_session(), SampleAggregator::new(0), until)
            .await
    }

    /// Resolves at `until` or at the agent's stop.
    fn stop_at(&self, until: Instant) -> impl Future<Output = ()> + use<> {
        let shutdown = self.shutdown.clone();
        async move {
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                () = stopped(shutdown) => {}
            }
        }
    }

    /// Runs one duty-cycled session until `until` or the agent's stop: its samples into
    /// `samples`, its other events (allocation ticks) to the profiler.
    async fn run_window(
        &mut self,
        config: CollectTracing,
        samples: SampleAggregator,
        until: Instant,
    ) -> anyhow::Result<Window<ParsingWriter<tokio::io::Sink, WindowSamples>>> {
        let window = WindowSamples {
            samples,
            profiler: self.profiler.clone(),
        };
        let mut sink = ParsingWriter::with_options(tokio::io::sink(), window, self.parser.clone());
        let _open = GaugeGuard::new(&self.health.sessions);
        let stop = self.stop_at(until);
        let reading = if until.saturating_duration_since(Instant::now()) <= READ_AT_STOP_MAX {
            Reading::AtStop
        } else {
            Reading::AsItComes
        };
        let ran = session::run_reading(
            self.client,
            config,
            &mut sink,
            stop,
            STOP_TIMEOUT,
            |_| {},
            reading,
        )
        .await;
        let failed = match (ran, sink.error()) {
            (Err(error), _) => Some(anyhow::Error::new(error).context("sampling")),
            (Ok(_), Some(error)) => Some(anyhow::anyhow!(
                "the sampler's stream did not parse: {error}"
            )),
            (Ok(_), None) => None,
        };
        if let Some(error) = failed {
            if self.profiler.exited() {
                tracing::debug!(pid = self.pid, error = %crate::describe(&error), "a duty-cycled session failed: the process exited");
                return Ok(Window::ProcessExited);
            }
            return Err(error);
        }
        let dropped = sink.parser().dropped_events();
        // Added even when 0: the series exists before its first loss (see run_long_session).
        self.dropped_events_counter("sampler").add(dropped);
        Ok(Window::Took(sink))
    }

    /// Adds what the long-lived sessions and linkage lost since last time to `/metrics`; with
    /// trace linkage, renews its session when no span has started for [`LINKAGE_QUIET`], so that
    /// linkage comes back within one sampler period of losing its providers' arguments.
    async fn check_losses(&mut self) {
        for stream in [Stream::Light, Stream::Linkage, Stream::Logs] {
            let Some(progress) = self.profiler.progress(stream) else {
                continue;
            };
            let dropped = progress.dropped.load(Ordering::Relaxed);
            let published = match stream {
                Stream::Light => &mut self.published.light_dropped,
                Stream::Linkage => &mut self.published.linkage_dropped,
                Stream::Logs => &mut self.published.logs_dropped,
                Stream::Rundown => continue,
            };
            let delta = dropped - std::mem::replace(published, dropped);
            self.dropped_events_counter(stream.name()).add(delta);
        }
        let pid = self.pid.to_string();
        let losses = &self.health.losses;
        let Some(renew) = &self.renew_linkage else {
            return;
        };
        let stats = self.profiler.lock().spans().map(|t| t.stats());
        let mut switched_without_spans = false;
        if let Some(stats) = stats {
            let before = &self.published.tracker;
            switched_without_spans =
                stats.switches > before.switches && stats.spans_started == before.spans_started;
            losses.add_tracker(&pid, before, &stats);
            self.published.tracker = stats;
        }
        if self.profiler.since_span_start() < LINKAGE_QUIET {
            return;
        }
        if switched_without_spans {
            // Flows of spans move from thread to thread, but no span starts: the span events
            // are off (another session's end took the providers' arguments away).
            tracing::warn!(
                pid = self.pid,
                "trace linkage lost its span events while spans' flows went on; starting its \
                 session again"
            );
        } else {
            tracing::debug!(
                pid = self.pid,
                "no span started lately; renewing the linkage session"
            );
        }
        // A new session applies the providers' arguments again when it enables them.
        renew.notify_one();
    }

    /// This process's series of `clrscope_eventpipe_dropped_events_total` for `stream`.
    fn dropped_events_counter(&mut self, stream: &'static str) -> &Counter {
        let (family, pid) = (&self.health.losses.dropped_events, self.pid);
        self.dropped_events
            .entry(stream)
            .or_insert_with(|| family.with(&[&pid.to_string(), stream]))
    }

    /// Names the window's stacks once the light session has caught up, and stores them.
    fn symbolize_later(&self, samples: SampleAggregator, thread_names: HashMap<u64, String>) {
        if samples.samples() == 0 {
            return;
        }
        self.health.samples.add(samples.samples());
        let profiler = self.profiler.clone();
        let sink = self.sink.clone();
        let pid = self.pid;
        tokio::spawn(async move {
            timer_grid::sleep(SYMBOLIZE_DELAY).await;
            let window_end = samples.time_range().map_or(i64::MIN, |(_, end)| end);
            profiler.caught_up(window_end).await;
            profiler.refresh_images_if_due(false);
            let mut batches = profiler.lock().sample_batches(&samples, &thread_names);
            if batches.resolution.unresolved > 0 {
                // A library mapped since the last reading is named in this window already.
                if profiler.refresh_images_if_due(true) {
                    batches = profiler.lock().sample_batches(&samples, &thread_names);
                }
            }
            let light_latest = profiler.light.delivered_ns.load(Ordering::Relaxed);
            tracing::debug!(
                pid,
                samples = samples.samples(),
                named = format!("{:.1}%", batches.resolution.method_percent()),
                light_behind_ms = window_end.saturating_sub(light_latest) / 1_000_000,
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
    fn images_are_read_again_after_a_module_load_or_when_frames_went_unresolved() {
        let (moment, never) = (Duration::from_secs(1), Duration::MAX);
        assert!(images_due(true, false, moment, moment));
        assert!(!images_due(false, false, moment, moment));
        // The first unresolved frames since any reading have the images read at once ...
        assert!(images_due(false, true, moment, never));
        // ... and then at most every MAPS_RECHECK_UNRESOLVED.
        assert!(!images_due(false, true, moment, moment));
        assert!(images_due(false, true, moment, MAPS_RECHECK_UNRESOLVED));
        assert!(!images_due(false, false, MAPS_RECHECK_UNRESOLVED, never));
        assert!(images_due(false, false, MAPS_RECHECK, moment));
        // Never read yet.
        assert!(images_due(false, false, never, never));
    }

    #[test]
    fn a_stream_has_caught_up_only_when_every_earlier_event_has_come() {
        let progress = StreamProgress::new();
        let now_ms = 0;
        // One flush, written thread by thread: thread A's events up to the flush (its first one
        // marked sorted), then thread B's, older than A's last.
        progress.delivered(1_000, true, now_ms);
        progress.delivered(9_000, false, now_ms);
        assert!(
            !progress.caught_up(5_000, now_ms),
            "thread B's events before 5 µs have not come yet"
        );
        progress.delivered(2_000, true, now_ms);
        progress.delivered(4_000, false, now_ms);
        assert!(!progress.caught_up(5_000, now_ms));
        // The next flush: its oldest event is past the window, so nothing earlier is pending.
        progress.delivered(9_500, true, now_ms);
        assert!(progress.caught_up(5_000, now_ms));
        assert!(!progress.caught_up(9_600, now_ms));
        // A stream quiet for LIGHT_QUIET has nothing pending.
        let quiet_ms = u64::try_from(LIGHT_QUIET.as_millis()).unwrap();
        assert!(progress.caught_up(9_600, now_ms + quiet_ms));
    }

    #[test]
    fn a_runtime_waits_for_a_resume_unless_every_port_says_nosuspend() {
        let waits = |value: &str| waits_for_resume(&env(&[("DOTNET_DiagnosticPorts", value)]));
        assert!(waits("/run/clrscope.sock"));
        assert!(waits("/run/clrscope.sock,connect,suspend"));
        assert!(!waits("/run/clrscope.sock,nosuspend"));
        assert!(!waits("/run/clrscope.sock,connect,nosuspend"));
        assert!(waits("/a.sock,nosuspend;/b.sock"));
        assert!(!waits(""));
        assert!(!waits_for_resume(&env(&[("DOTNET_gcServer", "1")])));
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
    }
}
