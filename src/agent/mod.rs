//! `clrscope agent`: profiles every .NET process it can reach, continuously, into the store.
//!
//! Tasks and the channels between them:
//! - discovery ([`discover`]): rescans for default diagnostic sockets (connect mode) and accepts
//!   runtimes that dial `--diagnostic-port` (listen mode); starts one task per runtime;
//! - per process ([`process`]): a light session plus a duty-cycled sampler, turned into store
//!   batches, which go into a bounded queue;
//! - the store writer ([`writer`]): the only thread that writes the store;
//! - the exporters ([`export`]): the same batches, sent to OTLP and Pyroscope backends;
//! - per process and collection rule ([`rules`]): the rule's trigger sessions and actions, and
//!   the pre-trigger ring of its CollectTrace actions with `PreTriggerSeconds`.

pub mod config;
mod discover;
mod export;
mod grace;
mod health;
mod incident_log;
mod process;
mod rules;
mod runtime_counters;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use collector::attached::AttachedProcesses;
use collector::counters::{
    CounterSelection, CounterSessionConfig, DEFAULT_EVENT_COUNTER_SOURCES, DEFAULT_INTERVAL_SECONDS,
};
use collector::rules::options::{ActionKind, CollectionRule};
use collector::sampler::DutyCycle;
use collector::signals::{check_covered, LogsSettings, SignalLimits, SignalShare};
use exporter::egress::{Egress, EgressConfig};
use exporter::remote::ExportSignal;
use nettrace::ParserOptions;
use profile::budget::SharedBudget;
use settings::{parse_bytes, parse_duration};
use store::incidents::{self, IncidentWindow, Incidents};
use store::tsdb::{Store, StoreOptions};
use symbolizer::profiles::process::EventProfiles;
use tokio::sync::watch;
use ui::admission::QueryLimits;
use ui::metrics::Registry;

use crate::args::NettraceArgs;
use config::{AgentConfig, ConfigSources, MetricsConfig};
use health::Health;
use writer::BatchSink;

/// Spans per second exported per process unless `--trace-rate-limit` says otherwise.
const DEFAULT_TRACE_RATE_LIMIT: u32 = 1000;
// The defaults of the flags below whose value is the agent's own (others come from the crate
// that owns the setting). clap's help shows each as `[default: …]` in its doc comment, which
// clap reads as literal text: `tests::the_help_shows_the_defaults_resolve_uses` checks they agree.
const DEFAULT_URLS: &str = "http://127.0.0.1:52323";
const DEFAULT_DATA_DIR: &str = "./clrscope-data";
const DEFAULT_RESCAN_INTERVAL: Duration = Duration::from_secs(3);
const DEFAULT_SAMPLE_WINDOW: Duration = Duration::from_secs(1);
const DEFAULT_SAMPLE_PERIOD: Duration = Duration::from_secs(10);
const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_secs(10);
const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 86_400);
const DEFAULT_FULL_DETAIL_RETENTION: Duration = Duration::from_secs(86_400);
const DEFAULT_RETENTION_SIZE: u64 = 1 << 30;

/// Command-line settings. Each flag overrides the configuration's key of the same meaning
/// (`config` module: settings.json, key-per-file directory, environment); flags that are not
/// given fall back to it, then to the defaults shown.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A settings.json (dotnet-monitor's keys where clrscope has the feature).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// A key-per-file configuration directory (e.g. a mounted Secret): file names are keys
    /// (`Section__Key`), contents values.
    #[arg(long, value_name = "DIR")]
    config_dir: Option<PathBuf>,
    /// Also accept runtimes that dial this socket (start them with
    /// DOTNET_DiagnosticPorts=PATH,nosuspend or ,suspend). [config: DiagnosticPort]
    #[arg(long, value_name = "PATH")]
    diagnostic_port: Option<PathBuf>,
    /// Do not look for processes' own diagnostic sockets; only accept runtimes on the listen
    /// socket.
    #[arg(long)]
    no_connect: bool,
    /// Runtimes the listen socket holds at most; another one dialling in is refused and logged
    /// (a process advertising made-up runtimes cannot grow the agent without end).
    /// [default: 512]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_runtimes: Option<u32>,
    /// Where the HTTP API listens: http://HOST:PORT (port 0 picks a free one). Binding beyond
    /// loopback exposes the profiles to the network. [default: http://127.0.0.1:52323]
    /// [config: Urls]
    #[arg(long, value_name = "URL")]
    urls: Option<String>,
    /// Where Prometheus scrapes /metrics, without authentication (numbers only; the API serves
    /// /metrics too, behind its authentication); `none` to serve it only there.
    /// [default: http://127.0.0.1:52325] [config: Metrics:Endpoints]
    #[arg(long, value_name = "URL")]
    metrics_urls: Option<String>,
    /// Host names the listeners answer to besides their own address and localhost
    /// (repeatable; `;` separates names too; `*.example.com` for subdomains, `*` for any). A
    /// request naming another `Host` gets 400: a web page cannot read the API by pointing its
    /// own name at it (DNS rebinding). [config: AllowedHosts]
    #[arg(long = "allowed-hosts", value_name = "NAMES")]
    allowed_hosts: Vec<String>,
    /// Connections each listener (API, metrics) holds at most; at the cap, the connection that
    /// has waited longest without a request is closed for a new one. [default: 256]
    /// [config: Kestrel:Limits:MaxConcurrentConnections]
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
    /// Close a connection that has no request in flight and sent nothing for this long.
    /// [default: 130s] [config: Kestrel:Limits:KeepAliveTimeout]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    keep_alive_timeout: Option<Duration>,
    /// Close a connection whose request head (or TLS handshake) is not complete this long after
    /// its first byte. [default: 10s] [config: Kestrel:Limits:RequestHeadersTimeout]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    request_headers_timeout: Option<Duration>,
    /// Store queries of each route class (catalog, series, profile) the API runs at once.
    /// [default: the number of cores] [config: Queries:MaxRunning]
    #[arg(long, value_name = "N")]
    max_running_queries: Option<usize>,
    /// Store queries of each route class that may wait for a running one; one more is refused
    /// with 503 and Retry-After. [default: 64] [config: Queries:MaxQueued]
    #[arg(long, value_name = "N")]
    max_queued_queries: Option<usize>,
    /// Turn authentication off: anyone who can reach the API can read the profiles and take
    /// dumps. Logs a warning; for a trusted machine only.
    #[arg(long, conflicts_with = "temp_apikey")]
    no_auth: bool,
    /// Generate an API key at start and print its token to stderr (where logs collected from
    /// stderr keep it), instead of the configured one (Authentication:MonitorApiKey). The key
    /// lives until the agent stops; the token is refused after --temp-apikey-expiry.
    #[arg(long)]
    temp_apikey: bool,
    /// How long a --temp-apikey token is accepted (dotnet-monitor's is 7 days).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "7d",
          requires = "temp_apikey")]
    temp_apikey_expiry: Duration,
    /// Write the --temp-apikey token to this file (created 0600; an existing file must be this
    /// user's own regular file) instead of printing it.
    #[arg(long, value_name = "FILE", requires = "temp_apikey")]
    temp_apikey_file: Option<PathBuf>,
    /// Where profiles are stored (created 0700). [default: ./clrscope-data]
    /// [config: Store:DataDirectory]
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Threads that run the agent's sessions, parsing and HTTP (queries run on a pool of their
    /// own). One keeps up with a full node (110 processes at ~2 % of a core); more only hand
    /// events to each other, which cost a node agent more CPU than it saved.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    worker_threads: u16,
    /// How often to look for new processes. [default: 3s] [config: Profiling:RescanInterval]
    #[arg(long, value_parser = parse_duration)]
    rescan_interval: Option<Duration>,
    /// How long a process runs before sessions that enable its EventSources start (runtime
    /// counters, trace linkage, logs, collection rules): on .NET 8 to 10, enabling an EventSource
    /// while the app starts can deadlock it for good (dotnet/runtime#105682, #119014). Sampling,
    /// code names and the runtime's own events start at once. [default: by the process's runtime:
    /// 30s on .NET 8, 9 and 10, 0 on 11 and later (docs/runtimes.md, "Startup hang")] [config:
    /// Profiling:StartupGrace]
    #[arg(long, value_parser = parse_duration)]
    startup_grace: Option<Duration>,
    /// Only profile these pids (repeatable). [config: Profiling:ProcessIds]
    #[arg(long = "pid", value_name = "PID")]
    pids: Vec<u64>,
    /// Only profile processes with this name: entry assembly, else executable (repeatable).
    /// [config: Profiling:ProcessNames]
    #[arg(long = "name", value_name = "NAME")]
    names: Vec<String>,
    /// Only profile processes whose command line contains this text (repeatable).
    /// [config: Profiling:CommandLines]
    #[arg(long = "command-line", value_name = "TEXT")]
    command_lines: Vec<String>,
    /// Sample for this long in every --sample-period (at most 10s); a process whose ticks walk
    /// more than 16 threads gets a window shorter in proportion (at least 100ms). [default: 1s]
    /// [config: Profiling:SampleWindow]
    #[arg(long, value_parser = parse_duration)]
    sample_window: Option<Duration>,
    /// The sampler runs for --sample-window out of every period. The runtime's sampler pauses the
    /// process every millisecond while it runs, so this ratio is what keeps overhead low.
    /// [default: 10s] [config: Profiling:SamplePeriod]
    #[arg(long, value_parser = parse_duration)]
    sample_period: Option<Duration>,
    /// A process that ran less than this percent of one core since its last window is idle, and
    /// sampled one period in 3, its window standing for all three; it is sampled again at the
    /// next period once it runs more. 0 samples every process every period. [default: 1]
    /// [config: Profiling:SampleIdleBelow]
    #[arg(long, value_name = "PERCENT", value_parser = parse_idle_percent)]
    sample_idle_below: Option<f64>,
    /// No alloc_samples/alloc_size profiles (GC allocation ticks, taken during sampler windows).
    /// [config: Profiling:Alloc = false]
    #[arg(long)]
    no_alloc: bool,
    /// No exception profile. [config: Profiling:Exceptions = false]
    #[arg(long)]
    no_exceptions: bool,
    /// No lock_count/lock_time profiles (monitor contention). [config: Profiling:Locks = false]
    #[arg(long)]
    no_locks: bool,
    /// Tag cpu and wall samples with the trace and span their thread ran. Off by default: the
    /// DiagnosticSource span and TPL context-switch events it needs cost 0.1–0.3 ms of CPU per
    /// request on .NET 8 (BENCHMARKS.md, "Trace linkage"), and listening to every ActivitySource
    /// makes libraries create spans they otherwise skip. [config: Profiling:TraceLinkage]
    #[arg(long)]
    trace_linkage: bool,
    /// With trace linkage, follow only the spans of these ActivitySources (repeatable), so
    /// libraries the service does not trace itself are left alone; default: every source.
    /// [config: Profiling:TraceSources]
    #[arg(long = "trace-source", value_name = "NAME")]
    trace_sources: Vec<String>,
    /// With trace linkage and an exporter sending Traces: the most spans per second exported
    /// per process; the rest are dropped, counted. [default: 1000]
    /// [config: Profiling:TraceRateLimit]
    #[arg(long, value_name = "N")]
    trace_rate_limit: Option<u32>,
    /// Collect the targets' Microsoft.Extensions.Logging messages at this level and above
    /// (Trace, Debug, Information, Warning, Error, Critical), the app's own filters kept, all
    /// the time: for CollectLogs' seconds before a trigger, OTLP logs, the web UI, and /logs
    /// requests it covers (others get a session of their own); off by default: the app then
    /// formats each message for the agent (BENCHMARKS.md, "Logs and exceptions").
    /// [config: Profiling:Logs]
    #[arg(long, value_name = "LEVEL", value_parser = parse_log_level)]
    logs: Option<profile::log::LogLevel>,
    /// How many first-chance exceptions to keep per process for /exceptions and
    /// CollectExceptions (0: none) [default: 1000]. [config: Profiling:ExceptionHistory]
    #[arg(long, value_name = "N")]
    exception_history: Option<usize>,
    /// Also put this System.Diagnostics.Metrics meter's instruments on /metrics (repeatable).
    /// System.Runtime's and ASP.NET Core's counters are there unless
    /// Metrics:IncludeDefaultProviders is false. [config: Metrics:Meters]
    #[arg(long = "meter", value_name = "NAME")]
    meters: Vec<String>,
    /// Do not read the targets' runtime counters (a counter session per process) for /metrics.
    /// [config: Metrics:Enabled = false, which also turns the metrics listener off]
    #[arg(long, conflicts_with = "meters")]
    no_runtime_metrics: bool,
    /// Delete profiles older than this. [default: 7d] [config: Store:Retention]
    #[arg(long, value_parser = parse_duration)]
    retention: Option<Duration>,
    /// Keep profiles at full time detail (one-minute blocks) this long; older ones are kept
    /// at 10-minute resolution for 3 days, then at 1 hour. [default: 1d]
    /// [config: Store:FullDetailRetention]
    #[arg(long, value_parser = parse_duration)]
    full_detail_retention: Option<Duration>,
    /// Delete the oldest profiles while the store is larger than this. [default: 1GiB]
    /// [config: Store:RetentionSize]
    #[arg(long, value_parser = parse_bytes)]
    retention_size: Option<u64>,
    /// How long new profiles may stay in memory before they are written (at most 10s): what a
    /// crash can lose. [default: 10s] [config: Store:FlushInterval]
    #[arg(long, value_parser = parse_duration)]
    flush_interval: Option<Duration>,
    /// An incident's window starts this long before its first cause (a rule firing or a mark).
    /// [default: 10m] [config: Store:IncidentBefore]
    #[arg(long, value_parser = parse_duration)]
    incident_before: Option<Duration>,
    /// An incident's window ends this long after its last cause; a cause within the window
    /// joins the incident. [default: 5m] [config: Store:IncidentAfter]
    #[arg(long, value_parser = parse_duration)]
    incident_after: Option<Duration>,
    /// Per session: the limit a target's stream may make the agent hold.
    #[command(flatten)]
    nettrace: NettraceArgs,
    /// Most memory the parsers of all sessions together may hold (decoded state and input
    /// buffers), e.g. 128MiB: a session that would take them past it is stopped (logged, and
    /// counted in clrscope_nettrace_budget_refusals_total) while the others go on.
    /// [default: 64MiB] [config: Profiling:NettraceAgentBudget]
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes)]
    nettrace_agent_budget: Option<u64>,
    /// Most memory the signals the agent keeps and queues for all processes may hold together:
    /// log and exception history, logging scopes, pre-trigger rings, live metrics waiting for
    /// their reader, /signals answers being built. What does not fit is dropped, counted in
    /// clrscope_signals_dropped_total. [default: 64MiB] [config: Profiling:SignalBudget]
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes)]
    signal_budget: Option<u64>,
    /// Most of --signal-budget one process's signals may hold; its log and exception history
    /// takes at most half, letting its oldest records go. [default: 16MiB]
    /// [config: Profiling:SignalProcessBudget]
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes)]
    signal_process_budget: Option<u64>,
}

/// What all sessions' parsers may hold together unless `--nettrace-agent-budget` says otherwise:
/// twice one session's default budget, while genuine sessions hold well under 1 MB each
/// (BENCHMARKS.md, "A full node").
const DEFAULT_NETTRACE_AGENT_BUDGET: u64 = 64 << 20;
/// What the kept and queued signals of all processes may hold together unless `--signal-budget`
/// says otherwise: with the parsers' budget and the agent's own ~30 MiB, a node agent stays
/// under 256 MiB whatever its targets send (tests/suite/hostile_targets.rs).
const DEFAULT_SIGNAL_BUDGET: u64 = 64 << 20;
/// One process's share of the signal budget unless `--signal-process-budget` says otherwise:
/// 30 s of logs at a few hundred messages per second and 1,000 exceptions fit in its half for
/// history.
const DEFAULT_SIGNAL_PROCESS_BUDGET: u64 = 16 << 20;

/// A size from the command line or the configuration, as memory counts it.
fn bytes_usize(bytes: u64) -> usize {
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

fn parse_log_level(text: &str) -> Result<profile::log::LogLevel, String> {
    profile::log::LogLevel::parse(text).ok_or_else(|| {
        format!(
            "unknown log level {text:?}: use Trace, Debug, Information, Warning, Error or Critical"
        )
    })
}

/// A repeatable flag's values, else the configuration's list.
fn or_config<T: Clone>(flag: Vec<T>, config: &[T]) -> Vec<T> {
    if flag.is_empty() {
        config.to_vec()
    } else {
        flag
    }
}

/// The agent's settings once flags, configuration and defaults are merged.
#[derive(Debug)]
struct Resolved {
    urls: String,
    listen_socket: Option<PathBuf>,
    /// The most runtimes the listen socket holds.
    max_runtimes: usize,
    connect: bool,
    data_dir: PathBuf,
    rescan_interval: Duration,
    startup_grace: Option<Duration>,
    duty: DutyCycle,
    /// The share of a core below which a process is idle (`--sample-idle-below`).
    idle_below: f64,
    events: EventProfiles,
    filters: Filters,
    linkage: Option<Vec<ipc::ProviderConfig>>,
    signals: SignalSettings,
    store: StoreOptions,
    /// Where /metrics is served without authentication, if anywhere.
    metrics_urls: Option<String>,
    /// The connection limits and allowed host names of both listeners.
    limits: ui::ConnectionLimits,
    /// How many store queries of each route class run and wait at most.
    query_limits: QueryLimits,
    allowed_hosts: ui::AllowedHosts,
    /// The `Metrics` section's counters: on /metrics and OTLP (unless off), and what
    /// `GET /livemetrics` and CollectLiveMetrics without settings collect.
    metrics_selection: CounterSelection,
    runtime_metrics: bool,
    /// `GlobalCounter:IntervalSeconds`.
    counter_interval_seconds: u32,
    auth: AuthSource,
    kestrel: ui::tls::KestrelConfig,
    exporters: export::ExportersConfig,
    egress: EgressConfig,
    rules: Vec<collector::rules::options::CollectionRule>,
    parser: ParserOptions,
}

/// Where the API key comes from.
#[derive(Debug)]
enum AuthSource {
    /// `--no-auth`.
    Off,
    /// `--temp-apikey`: a key whose token expires after `expiry`, written to `file` if given.
    Temporary {
        expiry: Duration,
        file: Option<PathBuf>,
    },
    Configured(Box<ui::auth::AuthenticationConfig>),
}

impl Args {
    /// Reads the configuration and merges it under the flags.
    fn resolve(self) -> anyhow::Result<Resolved> {
        let config = AgentConfig::load(ConfigSources {
            file: self.config.as_deref(),
            dir: self.config_dir.as_deref(),
        })?;
        let profiling = &config.profiling;
        let (config_socket, config_connect) = match &config.diagnostic_port {
            Some(port) => port.listen_socket()?,
            None => (None, true),
        };
        let (listen_socket, connect) = match self.diagnostic_port {
            Some(path) => (Some(path), !self.no_connect),
            None => (config_socket, config_connect && !self.no_connect),
        };
        if !connect && listen_socket.is_none() {
            bail!(
                "--no-connect leaves the agent nothing to profile: give --diagnostic-port PATH \
                 (or DiagnosticPort in the configuration) for runtimes to dial"
            );
        }
        let duty = DutyCycle::new(
            self.sample_window
                .or(profiling.sample_window)
                .unwrap_or(DEFAULT_SAMPLE_WINDOW),
            self.sample_period
                .or(profiling.sample_period)
                .unwrap_or(DEFAULT_SAMPLE_PERIOD),
        )?;
        let trace_sources = if self.trace_sources.is_empty() {
            profiling.trace_sources.clone()
        } else {
            self.trace_sources
        };
        let mut exporters = config.exporters.clone();
        let from_env =
            exporter::remote::otel_env::exporters_from_env(|name| std::env::var(name).ok())
                .context("the OpenTelemetry exporter environment (OTEL_EXPORTER_OTLP_*)")?;
        for (name, exporter) in from_env {
            if exporters.contains_key(&name) {
                bail!("Exporters:{name} is configured and OTEL_EXPORTER_OTLP_* makes an exporter of that name too: rename the configured one");
            }
            exporters.insert(name, exporter);
        }
        let traces_to = exporters
            .iter()
            .find(|(_, e)| e.sends(ExportSignal::Traces))
            .map(|(name, _)| name.clone());
        let linkage_on = self.trace_linkage || profiling.trace_linkage == Some(true);
        let spans = linkage_on && traces_to.is_some();
        let linkage = if linkage_on {
            let sources: Vec<&str> = trace_sources.iter().map(String::as_str).collect();
            Some(collector::providers::linkage(&sources, spans).context("--trace-source")?)
        } else if !trace_sources.is_empty() {
            bail!("--trace-source (Profiling:TraceSources) needs --trace-linkage (Profiling:TraceLinkage)");
        } else {
            if let Some(name) = &traces_to {
                tracing::warn!(exporter = %name, "the exporter sends traces, but trace linkage is off: no spans will be sent (start the agent with --trace-linkage)");
            }
            None
        };
        let trace_rate_limit = self
            .trace_rate_limit
            .or(profiling.trace_rate_limit)
            .unwrap_or(DEFAULT_TRACE_RATE_LIMIT);
        let store = &config.store;
        let metrics = &config.metrics;
        let metrics_on = metrics.enabled != Some(false);
        if metrics.metric_count.is_some() {
            tracing::warn!("Metrics:MetricCount is read but not used: /metrics shows each value's latest sample");
        }
        let metrics_urls = match self.metrics_urls.or_else(|| metrics.endpoints.clone()) {
            Some(url) if url == "none" => None,
            Some(url) => Some(url),
            None => metrics_on.then(|| ui::metrics::DEFAULT_METRICS_URL.to_string()),
        };
        let counter_interval_seconds = config
            .global_counter
            .interval_seconds
            .unwrap_or(DEFAULT_INTERVAL_SECONDS);
        if !(1..=86_400).contains(&counter_interval_seconds) {
            bail!("GlobalCounter:IntervalSeconds must be from 1 to 86400");
        }
        global_counter_limits(&config.global_counter)?;
        let mut parser = self.nettrace.parser_options();
        let agent_budget = self
            .nettrace_agent_budget
            .or(profiling.nettrace_agent_budget)
            .unwrap_or(DEFAULT_NETTRACE_AGENT_BUDGET);
        parser.shared_budget = Some(SharedBudget::new(bytes_usize(agent_budget)));
        let mut metrics_selection =
            metrics_selection(metrics, &self.meters, counter_interval_seconds);
        metrics_selection.session.parser = parser.clone();
        let kestrel_limits = &config.kestrel.limits;
        let limits = ui::ConnectionLimits {
            max_connections: self
                .max_connections
                .or(kestrel_limits.max_concurrent_connections)
                .unwrap_or(ui::listener::DEFAULT_MAX_CONNECTIONS),
            keep_alive_timeout: self
                .keep_alive_timeout
                .or(kestrel_limits.keep_alive_timeout)
                .unwrap_or(ui::listener::DEFAULT_KEEP_ALIVE_TIMEOUT),
            request_headers_timeout: self
                .request_headers_timeout
                .or(kestrel_limits.request_headers_timeout)
                .unwrap_or(ui::listener::DEFAULT_REQUEST_HEADERS_TIMEOUT),
        };
        if limits.max_connections == 0 {
            bail!("--max-connections (Kestrel:Limits:MaxConcurrentConnections) must be at least 1");
        }
        if limits.keep_alive_timeout.is_zero() || limits.request_headers_timeout.is_zero() {
            bail!(
                "--keep-alive-timeout and --request-headers-timeout (Kestrel:Limits:\
                 KeepAliveTimeout, RequestHeadersTimeout) must be longer than zero"
            );
        }
        let defaults = QueryLimits::default();
        let query_limits = QueryLimits {
            max_running: self
                .max_running_queries
                .or(config.queries.max_running)
                .unwrap_or(defaults.max_running),
            max_queued: self
                .max_queued_queries
                .or(config.queries.max_queued)
                .unwrap_or(defaults.max_queued),
        };
        if query_limits.max_running == 0 {
            bail!("--max-running-queries (Queries:MaxRunning) must be at least 1");
        }
        let allowed_hosts = if self.allowed_hosts.is_empty() {
            ui::AllowedHosts::parse(config.allowed_hosts.as_slice())
        } else {
            ui::AllowedHosts::parse(&self.allowed_hosts)
        }?;
        let auth = if self.no_auth {
            AuthSource::Off
        } else if self.temp_apikey {
            AuthSource::Temporary {
                expiry: self.temp_apikey_expiry,
                file: self.temp_apikey_file,
            }
        } else {
            AuthSource::Configured(Box::new(config.authentication.clone()))
        };
        Ok(Resolved {
            parser,
            urls: self
                .urls
                .or_else(|| config.urls.clone())
                .unwrap_or_else(|| DEFAULT_URLS.to_string()),
            listen_socket,
            max_runtimes: self
                .max_runtimes
                .map_or(collector::listen::DEFAULT_MAX_RUNTIMES, |n| n as usize),
            connect,
            data_dir: self
                .data_dir
                .or_else(|| store.data_directory.clone())
                .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
            rescan_interval: self
                .rescan_interval
                .or(profiling.rescan_interval)
                .unwrap_or(DEFAULT_RESCAN_INTERVAL),
            startup_grace: self.startup_grace.or(profiling.startup_grace),
            duty,
            idle_below: match self.sample_idle_below.or(profiling.sample_idle_below) {
                Some(percent) => check_idle_percent(percent)
                    .map_err(|error| anyhow::anyhow!("Profiling:SampleIdleBelow: {error}"))?,
                None => collector::sampler::IDLE_BELOW * 100.0,
            } / 100.0,
            events: EventProfiles {
                alloc: !self.no_alloc && profiling.alloc != Some(false),
                exceptions: !self.no_exceptions && profiling.exceptions != Some(false),
                locks: !self.no_locks && profiling.locks != Some(false),
            },
            filters: Filters {
                pids: or_config(self.pids, &profiling.process_ids),
                names: or_config(self.names, &profiling.process_names),
                command_lines: or_config(self.command_lines, &profiling.command_lines),
            },
            linkage,
            signals: SignalSettings {
                logs: self.logs.or(profiling.logs).map(|level| LogsSettings {
                    log_level: level,
                    ..LogsSettings::default()
                }),
                limits: SignalLimits {
                    max_exceptions: self
                        .exception_history
                        .or(profiling.exception_history)
                        .unwrap_or(DEFAULT_EXCEPTION_HISTORY),
                    ..SignalLimits::default()
                },
                spans: spans.then_some(trace_rate_limit),
                budget: SharedBudget::new(bytes_usize(
                    self.signal_budget
                        .or(profiling.signal_budget)
                        .unwrap_or(DEFAULT_SIGNAL_BUDGET),
                )),
                process_budget: bytes_usize(
                    self.signal_process_budget
                        .or(profiling.signal_process_budget)
                        .unwrap_or(DEFAULT_SIGNAL_PROCESS_BUDGET),
                ),
            },
            store: StoreOptions {
                flush_interval: self
                    .flush_interval
                    .or(store.flush_interval)
                    .unwrap_or(DEFAULT_FLUSH_INTERVAL),
                retention_age: self
                    .retention
                    .or(store.retention)
                    .unwrap_or(DEFAULT_RETENTION),
                full_detail_age: self
                    .full_detail_retention
                    .or(store.full_detail_retention)
                    .unwrap_or(DEFAULT_FULL_DETAIL_RETENTION),
                retention_bytes: self
                    .retention_size
                    .or(store.retention_size)
                    .unwrap_or(DEFAULT_RETENTION_SIZE),
                incident_window: IncidentWindow {
                    before: self
                        .incident_before
                        .or(store.incident_before)
                        .unwrap_or(incidents::DEFAULT_BEFORE),
                    after: self
                        .incident_after
                        .or(store.incident_after)
                        .unwrap_or(incidents::DEFAULT_AFTER),
                },
                ..StoreOptions::default()
            },
            metrics_urls,
            limits,
            query_limits,
            allowed_hosts,
            metrics_selection,
            runtime_metrics: metrics_on && !self.no_runtime_metrics,
            counter_interval_seconds,
            auth,
            kestrel: config.kestrel.clone(),
            exporters,
            egress: config.egress.clone(),
            rules: collector::rules::options::compile(
                &config.collection_rules,
                &config.collection_rule_defaults,
            )
            .map_err(|e| anyhow::anyhow!("configuration key {e}"))?,
        })
    }
}

/// `GlobalCounter:MaxHistograms` and `MaxTimeSeries`, checked, for every counter session.
fn global_counter_limits(config: &config::GlobalCounterConfig) -> anyhow::Result<()> {
    let histograms = config
        .max_histograms
        .unwrap_or(collector::counters::DEFAULT_MAX_HISTOGRAMS);
    let series = config
        .max_time_series
        .unwrap_or(collector::counters::DEFAULT_MAX_TIME_SERIES);
    if !(1..=100_000).contains(&histograms) {
        bail!("GlobalCounter:MaxHistograms must be from 1 to 100000");
    }
    if !(1..=1_000_000).contains(&series) {
        bail!("GlobalCounter:MaxTimeSeries must be from 1 to 1000000");
    }
    collector::counters::set_global_limits(histograms, series);
    Ok(())
}

/// The counter session of the `Metrics` section and `--meter` flags: dotnet-monitor's default
/// sources unless `IncludeDefaultProviders` is false, `Providers`, `Meters`.
fn metrics_selection(
    metrics: &MetricsConfig,
    meters: &[String],
    interval_seconds: u32,
) -> CounterSelection {
    let mut session = CounterSessionConfig::new(interval_seconds);
    if metrics.include_default_providers != Some(false) {
        for source in DEFAULT_EVENT_COUNTER_SOURCES {
            session = session.with_event_counters(source);
        }
    }
    let mut counter_names = Vec::new();
    for provider in &metrics.providers {
        session = session.with_event_counters(&provider.provider_name);
        if !provider.counter_names.is_empty() {
            counter_names.push((
                provider.provider_name.clone(),
                provider.counter_names.clone(),
            ));
        }
    }
    for meter in &metrics.meters {
        let instruments: Vec<&str> = meter.instrument_names.iter().map(String::as_str).collect();
        session = session.with_meter(&meter.meter_name, &instruments);
    }
    for meter in meters {
        session = session.with_meter(meter, &[]);
    }
    CounterSelection {
        session,
        counter_names,
    }
}

/// Which processes to profile: each non-empty list must have a match.
#[derive(Debug, Clone, Default)]
pub struct Filters {
    pids: Vec<u64>,
    names: Vec<String>,
    command_lines: Vec<String>,
}

impl Filters {
    pub fn is_empty(&self) -> bool {
        self.pids.is_empty() && self.names.is_empty() && self.command_lines.is_empty()
    }

    /// False when the pid filter alone excludes `pid`.
    pub fn may_accept_pid(&self, pid: u64) -> bool {
        self.pids.is_empty() || self.pids.contains(&pid)
    }

    pub fn accept(&self, pid: u64, name: &str, command_line: &str) -> bool {
        self.may_accept_pid(pid)
            && (self.names.is_empty() || self.names.iter().any(|n| n == name))
            && (self.command_lines.is_empty()
                || self.command_lines.iter().any(|c| command_line.contains(c)))
    }
}

/// Exceptions kept per process unless `--exception-history` says otherwise (dotnet-monitor keeps
/// 1,000 too).
const DEFAULT_EXCEPTION_HISTORY: usize = 1000;

/// `--sample-idle-below`: a percent of one core, 0 to 100.
fn parse_idle_percent(text: &str) -> Result<f64, String> {
    let percent: f64 = text
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("{text:?} is not a percent of one core (e.g. 1 or 0.5)"))?;
    check_idle_percent(percent)
}

/// A percent of one core from the command line or the configuration, checked.
fn check_idle_percent(percent: f64) -> Result<f64, String> {
    if !(0.0..=100.0).contains(&percent) {
        return Err(format!(
            "{percent} is not a percent of one core from 0 to 100 (0: sample every process every period)"
        ));
    }
    Ok(percent)
}

/// What every per-process task is configured with.
#[derive(Debug, Clone)]
pub struct Settings {
    pub duty: DutyCycle,
    /// The share of a core below which a process is idle ([`collector::sampler::SamplerControl::with_idle_below`]).
    pub idle_below: f64,
    /// How long a process runs before sessions that enable its EventSources start; `None`: by
    /// its runtime's version ([`collector::startup::startup_grace`]).
    pub startup_grace: Option<Duration>,
    pub events: EventProfiles,
    pub filters: Filters,
    pub host_name: String,
    /// The providers that join samples to the spans their threads ran, when linkage is on.
    pub linkage: Option<Vec<ipc::ProviderConfig>>,
    /// Which logs and how many exceptions each process keeps.
    pub signals: SignalSettings,
    /// The counter session whose values go on /metrics, unless that is off.
    pub runtime_counters: Option<CounterSelection>,
    /// Collection rules and their egress.
    pub rules: rules::RuleSettings,
    /// Limits of the parsers that read the targets' streams (`--nettrace-budget`).
    pub parser: ParserOptions,
}

/// The logs and exceptions each process's light session collects.
#[derive(Debug, Clone)]
pub struct SignalSettings {
    /// `None`: no logs.
    pub logs: Option<LogsSettings>,
    /// `max_exceptions` 0: no exceptions.
    pub limits: SignalLimits,
    /// Finished spans are read and exported, at most this many per second per process.
    pub spans: Option<u32>,
    /// What every process's kept and queued signals are charged to (`--signal-budget`).
    pub budget: SharedBudget,
    /// Each process's share of it (`--signal-process-budget`).
    pub process_budget: usize,
}

impl SignalSettings {
    pub fn exceptions(&self) -> bool {
        self.limits.max_exceptions > 0
    }

    /// A new share of the signal budget, for one process.
    pub fn share(&self) -> SignalShare {
        SignalShare::new(self.budget.share(self.process_budget))
    }

    /// Keeps logs long enough for the longest CollectLogs `PreTriggerSeconds`; refuses a
    /// pre-trigger the always-on session cannot serve (a CollectLogs without one starts a session
    /// of its own when it fires, as dotnet-monitor's does), and a CollectExceptions without an
    /// exception history.
    fn for_rules(mut self, rules: &[CollectionRule]) -> anyhow::Result<SignalSettings> {
        for rule in rules {
            for action in &rule.actions {
                match &action.kind {
                    ActionKind::CollectLogs {
                        pre_trigger,
                        settings,
                        ..
                    } if !pre_trigger.is_zero() => {
                        if let Err(why) = check_covered(self.logs.as_ref(), settings) {
                            bail!(
                                "collection rule {:?}, action {:?}: PreTriggerSeconds needs the \
                                 messages the agent keeps, but {why}",
                                rule.name,
                                action.name
                            );
                        }
                        let needed = *pre_trigger + Duration::from_secs(5);
                        self.limits.log_retention = self.limits.log_retention.max(needed);
                    }
                    ActionKind::CollectExceptions { .. } if !self.exceptions() => bail!(
                        "collection rule {:?}, action {:?}: CollectExceptions writes the \
                         exceptions the agent keeps, but --exception-history is 0",
                        rule.name,
                        action.name
                    ),
                    _ => {}
                }
            }
        }
        Ok(self)
    }
}

/// What the agent's tasks share.
pub struct Agent {
    pub settings: Settings,
    pub processes: AttachedProcesses,
    pub sink: BatchSink,
    /// Every component's metrics, served on `/metrics`: register yours on it (see
    /// [`ui::metrics`]).
    pub metrics: Registry,
    /// The agent's own metrics.
    pub health: Health,
    /// Turns true once when the agent stops.
    pub shutdown: watch::Receiver<bool>,
    /// The exporters' taps, for the processes' log records and exceptions.
    pub exports: export::ExportTaps,
    /// The store's incidents, which rule firings make.
    pub incidents: Incidents,
}

/// A listener address: `http://HOST:PORT`, `https://HOST:PORT` or `HOST:PORT` (http), HOST an
/// IP address, `localhost`, or `+` or `*` for every interface (as Kestrel and dotnet-monitor
/// read them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ListenUrl {
    tls: bool,
    addr: std::net::SocketAddr,
}

fn parse_url(flag: &str, url: &str) -> anyhow::Result<ListenUrl> {
    let (tls, authority) = match url.split_once("://") {
        Some(("http", rest)) => (false, rest),
        Some(("https", rest)) => (true, rest),
        Some((scheme, _)) => {
            anyhow::bail!("{flag} {url}: unknown scheme {scheme}: use http or https")
        }
        None => (false, url),
    };
    let authority = authority.trim_end_matches('/');
    let authority = match authority.rsplit_once(':') {
        Some(("localhost", port)) => format!("127.0.0.1:{port}"),
        Some(("+" | "*", port)) => format!("0.0.0.0:{port}"),
        _ => authority.to_string(),
    };
    let addr = authority.parse().with_context(|| {
        format!("{flag} {url}: expected http://IP:PORT, e.g. http://127.0.0.1:52323")
    })?;
    Ok(ListenUrl { tls, addr })
}

/// What the API asks of a request: `--no-auth`, `--temp-apikey` or the configured key; with
/// `--temp-apikey`, also the token to print.
fn authentication(
    source: &AuthSource,
    tls: bool,
    api_addr: std::net::SocketAddr,
) -> (ui::Authentication, Option<String>) {
    let config = match source {
        AuthSource::Off => {
            tracing::warn!(
            "WARNING: Authentication has been disabled (--no-auth). Anyone who can reach the API \
             can read the profiles and take dumps; this is not intended for production."
        );
            if !api_addr.ip().is_loopback() {
                tracing::warn!(%api_addr, "the API listens beyond loopback without authentication");
            }
            return (ui::Authentication::Disabled, None);
        }
        AuthSource::Temporary { expiry, .. } => Err(*expiry),
        AuthSource::Configured(config) => Ok(config),
    };
    let mut token = None;
    let auth = match config {
        Ok(config) => ui::Authentication::from_config(config),
        Err(expiry) => {
            let expires = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64)
                + expiry.as_secs() as i64;
            let key = ui::auth::generate_key(expires);
            token = Some(key.token.clone());
            match ui::auth::ApiKey::new(Some(&key.subject), Some(&key.public_key), None) {
                Ok(key) => ui::Authentication::ApiKey(Arc::new(key)),
                Err(error) => ui::Authentication::Unconfigured(Arc::new(error)),
            }
        }
    };
    match &auth {
        ui::Authentication::Unconfigured(error) => tracing::warn!(
            "every API request is refused: {}",
            ui::auth::Refusal::Unconfigured(Arc::clone(error))
        ),
        ui::Authentication::ApiKey(key) if key.has_private_key() => tracing::warn!(
            "Authentication:MonitorApiKey:PublicKey holds private key material; the agent only \
             needs the public key: remove the private parts (d, p, q, dp, dq, qi)"
        ),
        _ => {}
    }
    if !tls && !api_addr.ip().is_loopback() {
        tracing::warn!(
            %api_addr,
            "WARNING: Authentication is enabled over insecure http transport beyond loopback: \
             tokens can be read on the network. Use https (Kestrel:Certificates:Default) in \
             production."
        );
    }
    (auth, token)
}

/// Writes `bytes` to `path`, readable by this user only: created 0600 without following a link;
/// an existing file must be this user's regular file, and is truncated and made 0600 through its
/// descriptor.
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if !meta.is_file() || meta.uid() != me {
        bail!("not a regular file of this user: refusing to write a secret into it");
    }
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.set_len(0)?;
    file.write_all(bytes)?;
    Ok(())
}

/// Resolves once the agent stops.
async fn stopped(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// The async runtime the agent runs on: `--worker-threads` workers.
pub fn runtime(args: &Args) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::from(args.worker_threads))
        .enable_all()
        .build()
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let settings = args.resolve()?;
    let api_url = parse_url("--urls", &settings.urls)?;
    let store = Store::open(&settings.data_dir, settings.store.clone())
        .with_context(|| format!("opening the store in {}", settings.data_dir.display()))?;
    for problem in store.problems() {
        tracing::warn!(path = %problem.path.display(), "skipping an unreadable block: {}", problem.message);
    }
    let incidents = store.incidents().clone();
    let store = Arc::new(RwLock::new(store));
    let listener = tokio::net::TcpListener::bind(api_url.addr)
        .await
        .with_context(|| {
            format!(
                "binding the HTTP API to {} (is another agent running?)",
                api_url.addr
            )
        })?;
    let api_addr = listener.local_addr()?;
    let (auth, temp_token) = authentication(&settings.auth, api_url.tls, api_addr);
    let scheme = if api_url.tls { "https" } else { "http" };
    let serve_options = ui::ServeOptions {
        limits: settings.limits,
        allowed_hosts: settings.allowed_hosts.clone(),
        tls: None,
    };
    let api_options = ui::ServeOptions {
        tls: match api_url.tls {
            true => Some(
                settings
                    .kestrel
                    .server_config()
                    .with_context(|| format!("--urls {}", settings.urls))?,
            ),
            false => None,
        },
        ..serve_options.clone()
    };
    // One Egress (one disk budget) for the API's artifacts and the rules'.
    let egress = Egress::new(&settings.egress).context("the Egress configuration")?;
    let rules = rules::RuleSettings {
        rules: settings.rules,
        counter_interval_seconds: settings.counter_interval_seconds,
        live_metrics: settings.metrics_selection.clone(),
        egress: egress.clone(),
        parser: settings.parser.clone(),
    };
    rules.check_egress()?;
    if !settings.runtime_metrics
        && settings
            .exporters
            .values()
            .any(|e| e.sends(exporter::remote::ExportSignal::Metrics))
    {
        tracing::warn!(
            "an exporter sends Metrics but the runtime counters are off (Metrics:Enabled false or \
             --no-runtime-metrics): it will send none"
        );
    }
    let signals = settings.signals.for_rules(&rules.rules)?;
    let metrics = Registry::default();
    let health = Health::register(&metrics);
    let metrics_listener = match &settings.metrics_urls {
        None => None,
        Some(url) => {
            let ListenUrl { tls, addr } = parse_url("--metrics-urls", url)?;
            if tls {
                bail!("--metrics-urls {url}: /metrics is served over http only");
            }
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding /metrics to {addr} (--metrics-urls)"))?;
            Some(listener)
        }
    };
    let (taps, mut exporting) =
        export::spawn(&settings.exporters, &metrics).context("starting the exporters")?;
    let exports = taps.clone();
    incident_log::export_incidents(&incidents, taps.clone(), host_name());
    let (sink, writer) = writer::spawn(store.clone(), health.store.clone(), taps)
        .context("starting the store writer")?;
    let (stop, shutdown) = watch::channel(false);
    let agent = Arc::new(Agent {
        settings: Settings {
            duty: settings.duty,
            idle_below: settings.idle_below,
            startup_grace: settings.startup_grace,
            events: settings.events,
            filters: settings.filters,
            host_name: host_name(),
            linkage: settings.linkage,
            signals,
            runtime_counters: settings
                .runtime_metrics
                .then(|| settings.metrics_selection.clone()),
            rules,
            parser: settings.parser.clone(),
        },
        processes: AttachedProcesses::default(),
        sink,
        metrics,
        health,
        shutdown,
        exports,
        incidents,
    });

    let listen = match &settings.listen_socket {
        Some(path) => Some(Arc::new(
            discover::bind_listen(path, settings.max_runtimes).await?,
        )),
        None => None,
    };
    let on_stop = || stopped(agent.shutdown.clone());
    let api = {
        let monitor = ui::MonitorState {
            directory: ui::ProcessDirectory {
                connect: settings.connect,
                listen: listen.clone(),
            },
            egress,
            api_url: (!api_addr.ip().is_unspecified()).then(|| format!("{scheme}://{api_addr}")),
            parser: settings.parser,
            counter_interval_seconds: settings.counter_interval_seconds,
            live_metrics: settings.metrics_selection.clone(),
            signals: agent.settings.signals.share(),
            ..ui::MonitorState::default()
        };
        let state = ui::ApiState::new(store.clone())
            .with_processes(agent.processes.clone())
            .with_monitor(monitor)
            .with_metrics(agent.metrics.clone())
            .with_query_limits(settings.query_limits)
            .with_auth(auth);
        let router = ui::router(state);
        tokio::spawn(ui::serve(listener, router, api_options, on_stop()))
    };
    let metrics_addr = match metrics_listener {
        Some(listener) => {
            let addr = listener.local_addr()?;
            let router = ui::metrics_router(agent.metrics.clone());
            tokio::spawn(ui::serve(listener, router, serve_options, on_stop()));
            format!("http://{addr}/metrics")
        }
        None => "only on the API".to_string(),
    };
    tokio::spawn(agent.health.clone().watch(
        agent.settings.parser.shared_budget.clone(),
        agent.settings.signals.budget.clone(),
        agent.processes.clone(),
        on_stop(),
    ));
    let filtered = !agent.settings.filters.is_empty();
    let mut tasks = tokio::task::JoinSet::new();
    if settings.connect {
        tasks.spawn(discover::connect_mode(
            agent.clone(),
            settings.rescan_interval,
        ));
    }
    if let Some(server) = listen {
        tasks.spawn(discover::listen_mode(agent.clone(), server));
    }
    let stop_signal = stop_signal()?;
    eprintln!(
        "clrscope agent: API on {scheme}://{api_addr}; metrics {metrics_addr}; profiling {} \
         ({:.0}% duty: {:?} every {:?}); data in {}",
        match (&settings.listen_socket, settings.connect) {
            (Some(p), false) => format!("runtimes dialling {}", p.display()),
            (Some(p), true) => format!(".NET processes and runtimes dialling {}", p.display()),
            (None, _) => ".NET processes".to_string(),
        } + if filtered {
            " that match the filters"
        } else {
            ""
        },
        agent.settings.duty.fraction() * 100.0,
        agent.settings.duty.window,
        agent.settings.duty.period,
        settings.data_dir.display()
    );
    if let Some(token) = temp_token {
        let file = match &settings.auth {
            AuthSource::Temporary { file, .. } => file.as_deref(),
            _ => None,
        };
        match file {
            Some(path) => {
                write_private(path, format!("{token}\n").as_bytes())
                    .with_context(|| format!("--temp-apikey-file {}", path.display()))?;
                eprintln!(
                    "clrscope agent: generated a one-time API key (--temp-apikey); its token is \
                     in {} (send it as `Authorization: Bearer TOKEN`)",
                    path.display()
                );
            }
            None => eprintln!(
                "clrscope agent: generated a one-time API key (--temp-apikey); use the following \
                 header for authorization:\nAuthorization: Bearer {token}"
            ),
        }
    }

    export::log_started(&settings.exporters);

    stop_signal.await;
    eprintln!("clrscope agent: stopping (sessions end, the store is flushed)");
    let _ = stop.send(true);
    let sessions_ended = async {
        if let Ok(Err(error)) = api.await {
            tracing::warn!(%error, "the HTTP API ended with an error");
        }
        while let Some(result) = tasks.join_next().await {
            if let Ok(Err(error)) = result {
                tracing::warn!(error = %crate::describe(&error), "discovery ended with an error");
            }
        }
    };
    if tokio::time::timeout(STOP_DEADLINE, sessions_ended)
        .await
        .is_err()
    {
        // A runtime that stopped answering (or a client holding a connection open) must not keep
        // the agent from stopping: the processes' tasks are dropped with their sessions' last
        // windows, and the store keeps what it was given.
        tracing::warn!(
            deadline_s = STOP_DEADLINE.as_secs(),
            "sessions had not ended by the stop deadline; stopping without them"
        );
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
    let dropped = agent.sink.dropped();
    if dropped > 0 {
        tracing::warn!(
            dropped,
            "profile batches were dropped because the store fell behind"
        );
    }
    // The writer ends once the last sink is gone: ours, and the per-process tasks' (which the
    // discovery tasks waited for).
    drop(agent);
    match tokio::time::timeout(
        STOP_DEADLINE,
        tokio::task::spawn_blocking(move || writer.join()),
    )
    .await
    {
        Ok(joined) => joined?.map_err(|_| anyhow::anyhow!("the store writer panicked"))?,
        Err(_) => tracing::warn!(
            deadline_s = STOP_DEADLINE.as_secs(),
            "the store writer had not finished by the stop deadline; its last batches are lost"
        ),
    }
    // The exporters end once the last batch sink is gone, after sending what they hold.
    let exported = async { while exporting.join_next().await.is_some() {} };
    if tokio::time::timeout(export::SHUTDOWN_GRACE + Duration::from_secs(1), exported)
        .await
        .is_err()
    {
        tracing::warn!("the exporters did not finish in time; their last profiles are lost");
    }
    Ok(())
}

/// How long each step of stopping (sessions ending, then the store writer) may take before the
/// agent goes on without it: within a supervisor's usual grace (Kubernetes gives 30 s) for both.
pub const STOP_DEADLINE: Duration = Duration::from_secs(12);

/// Listens for SIGINT and SIGTERM from now on, so that a supervisor signalling as soon as the
/// agent says it is up never meets the default action (an exit without flushing the store);
/// the future resolves on the first of them.
fn stop_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_that_need_kept_signals_are_checked_at_start() {
        let compile = |actions: serde_json::Value| {
            collector::rules::options::compile(
                &serde_json::from_value(serde_json::json!({"R": {
                    "Trigger": {"Type": "Startup"}, "Actions": actions}}))
                .unwrap(),
                &Default::default(),
            )
            .unwrap()
        };
        let signals = |logs: Option<LogLevel>, max_exceptions| SignalSettings {
            logs: logs.map(|log_level| LogsSettings {
                log_level,
                ..LogsSettings::default()
            }),
            limits: SignalLimits {
                max_exceptions,
                ..SignalLimits::default()
            },
            spans: None,
            budget: SharedBudget::unlimited(),
            process_budget: usize::MAX,
        };
        use profile::log::LogLevel;
        let pre = compile(serde_json::json!([{"Type": "CollectLogs", "Settings": {
            "Egress": "e", "DefaultLevel": "Information", "PreTriggerSeconds": 60}}]));
        // Kept: the retention grows to cover the seconds before the trigger.
        let kept = signals(Some(LogLevel::Debug), 10).for_rules(&pre).unwrap();
        assert_eq!(kept.limits.log_retention, Duration::from_secs(65));
        let error = signals(None, 10).for_rules(&pre).unwrap_err().to_string();
        assert!(error.contains("--logs"), "{error}");
        let error = signals(Some(LogLevel::Warning), 10)
            .for_rules(&pre)
            .unwrap_err()
            .to_string();
        assert!(error.contains("Warning"), "{error}");
        // Without PreTriggerSeconds a session of the action's own serves it.
        let own =
            compile(serde_json::json!([{"Type": "CollectLogs", "Settings": {"Egress": "e"}}]));
        assert!(signals(None, 10).for_rules(&own).is_ok());
        let exceptions = compile(
            serde_json::json!([{"Type": "CollectExceptions", "Settings": {"Egress": "e"}}]),
        );
        assert!(signals(None, 10).for_rules(&exceptions).is_ok());
        let error = signals(None, 0)
            .for_rules(&exceptions)
            .unwrap_err()
            .to_string();
        assert!(error.contains("--exception-history"), "{error}");
    }

    /// Every `[default: …]` the agent's help shows is what `resolve` makes of no flag and no
    /// configuration (the doc comments spell the defaults out; resolve uses the constants).
    #[test]
    fn the_help_shows_the_defaults_resolve_uses() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let command = <Cli as clap::CommandFactory>::command();
        let help = |id: &str| {
            let arg = command.get_arguments().find(|a| a.get_id() == id);
            let arg = arg.unwrap_or_else(|| panic!("no argument {id}"));
            arg.get_long_help().or(arg.get_help()).unwrap().to_string()
        };
        let shown = |id: &str| {
            let help = help(id);
            let start = help
                .find("[default: ")
                .unwrap_or_else(|| panic!("{id}: {help}"));
            help[start + 10..].split(']').next().unwrap().to_string()
        };
        let duration = |id: &str| parse_duration(&shown(id)).unwrap();
        let bytes = |id: &str| bytes_usize(parse_bytes(&shown(id)).unwrap());
        let number = |id: &str| shown(id).parse::<f64>().unwrap();
        let resolved = <Cli as clap::Parser>::try_parse_from(["agent"])
            .unwrap()
            .args
            .resolve()
            .unwrap();
        assert_eq!(shown("urls"), resolved.urls);
        assert_eq!(Some(shown("metrics_urls")), resolved.metrics_urls);
        assert_eq!(number("max_runtimes"), resolved.max_runtimes as f64);
        assert_eq!(
            number("max_connections"),
            resolved.limits.max_connections as f64
        );
        assert_eq!(
            duration("keep_alive_timeout"),
            resolved.limits.keep_alive_timeout
        );
        let headers_timeout = resolved.limits.request_headers_timeout;
        assert_eq!(duration("request_headers_timeout"), headers_timeout);
        assert_eq!(
            number("max_queued_queries"),
            resolved.query_limits.max_queued as f64
        );
        assert_eq!(PathBuf::from(shown("data_dir")), resolved.data_dir);
        assert_eq!(duration("rescan_interval"), resolved.rescan_interval);
        assert_eq!(duration("sample_window"), resolved.duty.window);
        assert_eq!(duration("sample_period"), resolved.duty.period);
        assert_eq!(number("sample_idle_below"), resolved.idle_below * 100.0);
        assert_eq!(number("trace_rate_limit"), DEFAULT_TRACE_RATE_LIMIT as f64);
        let max_exceptions = resolved.signals.limits.max_exceptions;
        assert_eq!(number("exception_history"), max_exceptions as f64);
        assert_eq!(duration("retention"), resolved.store.retention_age);
        assert_eq!(
            duration("full_detail_retention"),
            resolved.store.full_detail_age
        );
        assert_eq!(
            bytes("retention_size") as u64,
            resolved.store.retention_bytes
        );
        assert_eq!(duration("flush_interval"), resolved.store.flush_interval);
        let incident_window = resolved.store.incident_window;
        assert_eq!(duration("incident_before"), incident_window.before);
        assert_eq!(duration("incident_after"), incident_window.after);
        assert_eq!(bytes("nettrace_budget"), resolved.parser.memory_budget);
        let agent_budget = resolved.parser.shared_budget.as_ref().unwrap().limit();
        assert_eq!(bytes("nettrace_agent_budget"), agent_budget);
        assert_eq!(bytes("signal_budget"), resolved.signals.budget.limit());
        assert_eq!(
            bytes("signal_process_budget"),
            resolved.signals.process_budget
        );
        // Defaults described rather than given as a value; every other one is checked above.
        let described = ["max_running_queries", "startup_grace"];
        let checked = 24;
        let shown_defaults = command
            .get_arguments()
            .filter(|a| help(a.get_id().as_str()).contains("[default: "))
            .filter(|a| !described.contains(&a.get_id().as_str()))
            .count();
        assert_eq!(
            shown_defaults, checked,
            "a default the help shows is not checked here"
        );
    }

    #[test]
    fn listen_urls_read_like_kestrels() {
        let url = |text: &str| parse_url("--urls", text).map(|u| (u.tls, u.addr.to_string()));
        assert_eq!(
            url("http://127.0.0.1:52323").unwrap(),
            (false, "127.0.0.1:52323".into())
        );
        assert_eq!(
            url("https://localhost:1/").unwrap(),
            (true, "127.0.0.1:1".into())
        );
        assert_eq!(
            url("http://+:52325").unwrap(),
            (false, "0.0.0.0:52325".into())
        );
        assert_eq!(url("*:0").unwrap(), (false, "0.0.0.0:0".into()));
        assert_eq!(url("http://[::1]:80").unwrap(), (false, "[::1]:80".into()));
        for bad in [
            "ftp://127.0.0.1:1",
            "http://example.com:80",
            "http://127.0.0.1",
            "http://a:1;http://b:2",
        ] {
            assert!(url(bad).is_err(), "{bad:?} accepted");
        }
    }
}
