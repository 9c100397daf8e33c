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
mod process;
mod rules;
mod writer;

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{bail, Context};
use collector::attached::AttachedProcesses;
use collector::metrics::Registry;
use collector::sampler::DutyCycle;
use exporter::egress::{Egress, EgressConfig};
use store::continuous::EventProfiles;
use store::tsdb::{Store, StoreOptions};
use tokio::sync::watch;

use crate::args::{parse_bytes, parse_duration};
use config::{AgentConfig, ConfigSources};
use writer::BatchSink;

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
    /// Where the HTTP API listens: http://HOST:PORT (port 0 picks a free one). Binding beyond
    /// loopback exposes the profiles to the network. [default: http://127.0.0.1:52323]
    /// [config: Urls]
    #[arg(long, value_name = "URL")]
    urls: Option<String>,
    /// Where profiles are stored (created 0700). [default: ./clrscope-data]
    /// [config: Store:DataDirectory]
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// How often to look for new processes. [default: 3s] [config: Profiling:RescanInterval]
    #[arg(long, value_parser = parse_duration)]
    rescan_interval: Option<Duration>,
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
    /// Sample for this long in every --sample-period (at most 10s). [default: 1s]
    /// [config: Profiling:SampleWindow]
    #[arg(long, value_parser = parse_duration)]
    sample_window: Option<Duration>,
    /// The sampler runs for --sample-window out of every period. The runtime's sampler pauses the
    /// process every millisecond while it runs, so this ratio is what keeps overhead low.
    /// [default: 10s] [config: Profiling:SamplePeriod]
    #[arg(long, value_parser = parse_duration)]
    sample_period: Option<Duration>,
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
    /// Delete profiles older than this. [default: 7d] [config: Store:Retention]
    #[arg(long, value_parser = parse_duration)]
    retention: Option<Duration>,
    /// Delete the oldest profiles while the store is larger than this. [default: 1GiB]
    /// [config: Store:RetentionSize]
    #[arg(long, value_parser = parse_bytes)]
    retention_size: Option<u64>,
    /// How long new profiles may stay in memory before they are written (at most 10s): what a
    /// crash can lose. [default: 10s] [config: Store:FlushInterval]
    #[arg(long, value_parser = parse_duration)]
    flush_interval: Option<Duration>,
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
    connect: bool,
    data_dir: PathBuf,
    rescan_interval: Duration,
    duty: DutyCycle,
    events: EventProfiles,
    filters: Filters,
    linkage: Option<Vec<collector::ipc::ProviderConfig>>,
    store: StoreOptions,
    exporters: export::ExportersConfig,
    egress: EgressConfig,
    rules: Vec<collector::rules::options::CollectionRule>,
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
                .unwrap_or(Duration::from_secs(1)),
            self.sample_period
                .or(profiling.sample_period)
                .unwrap_or(Duration::from_secs(10)),
        )?;
        let trace_sources = if self.trace_sources.is_empty() {
            profiling.trace_sources.clone()
        } else {
            self.trace_sources
        };
        let linkage = if self.trace_linkage || profiling.trace_linkage == Some(true) {
            let sources: Vec<&str> = trace_sources.iter().map(String::as_str).collect();
            Some(collector::providers::linkage(&sources).context("--trace-source")?)
        } else if !trace_sources.is_empty() {
            bail!("--trace-source (Profiling:TraceSources) needs --trace-linkage (Profiling:TraceLinkage)");
        } else {
            None
        };
        let store = &config.store;
        Ok(Resolved {
            urls: self
                .urls
                .or_else(|| config.urls.clone())
                .unwrap_or_else(|| "http://127.0.0.1:52323".to_string()),
            listen_socket,
            connect,
            data_dir: self
                .data_dir
                .or_else(|| store.data_directory.clone())
                .unwrap_or_else(|| PathBuf::from("./clrscope-data")),
            rescan_interval: self
                .rescan_interval
                .or(profiling.rescan_interval)
                .unwrap_or(Duration::from_secs(3)),
            duty,
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
            store: StoreOptions {
                flush_interval: self
                    .flush_interval
                    .or(store.flush_interval)
                    .unwrap_or(Duration::from_secs(10)),
                retention_age: self
                    .retention
                    .or(store.retention)
                    .unwrap_or(Duration::from_secs(7 * 86_400)),
                retention_bytes: self
                    .retention_size
                    .or(store.retention_size)
                    .unwrap_or(1 << 30),
                ..StoreOptions::default()
            },
            exporters: config.exporters,
            egress: config.egress.clone(),
            rules: collector::rules::options::compile(
                &config.collection_rules,
                &config.collection_rule_defaults,
            )
            .map_err(|e| anyhow::anyhow!("configuration key {e}"))?,
        })
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

/// What every per-process task is configured with.
#[derive(Debug, Clone)]
pub struct Settings {
    pub duty: DutyCycle,
    pub events: EventProfiles,
    pub filters: Filters,
    pub host_name: String,
    /// The providers that join samples to the spans their threads ran, when linkage is on.
    pub linkage: Option<Vec<collector::ipc::ProviderConfig>>,
    /// Collection rules and their egress.
    pub rules: rules::RuleSettings,
}

/// What the agent's tasks share.
pub struct Agent {
    pub settings: Settings,
    pub processes: AttachedProcesses,
    pub sink: BatchSink,
    /// Turns true once when the agent stops.
    pub shutdown: watch::Receiver<bool>,
}

/// `http://HOST:PORT` or `HOST:PORT` to a socket address: HOST an IP address, `localhost`, or
/// `+`/`*` for every interface (as dotnet-monitor's and ASP.NET Core's URLs write it).
fn parse_url(url: &str) -> anyhow::Result<std::net::SocketAddr> {
    if url.starts_with("https://") {
        anyhow::bail!("--urls {url}: TLS is not supported yet; use http:// on loopback");
    }
    let authority = url
        .strip_prefix("http://")
        .unwrap_or(url)
        .trim_end_matches('/');
    let authority = match authority.rsplit_once(':') {
        Some(("localhost", port)) => format!("127.0.0.1:{port}"),
        Some(("+" | "*", port)) => format!("0.0.0.0:{port}"),
        _ => authority.to_string(),
    };
    authority.parse().with_context(|| {
        format!("--urls {url}: expected http://IP:PORT, e.g. http://127.0.0.1:52323 (one URL)")
    })
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let settings = args.resolve()?;
    let api_addr = parse_url(&settings.urls)?;
    let store = Store::open(&settings.data_dir, settings.store.clone())
        .with_context(|| format!("opening the store in {}", settings.data_dir.display()))?;
    for problem in store.problems() {
        tracing::warn!(path = %problem.path.display(), "skipping an unreadable block: {}", problem.message);
    }
    let store = Arc::new(RwLock::new(store));
    let listener = tokio::net::TcpListener::bind(api_addr)
        .await
        .with_context(|| {
            format!("binding the HTTP API to {api_addr} (is another agent running?)")
        })?;
    let api_addr = listener.local_addr()?;
    if !api_addr.ip().is_loopback() {
        tracing::warn!(%api_addr, "the HTTP API listens beyond loopback without authentication: anyone who can reach it can read the profiles");
    }
    // One Egress (one disk budget) for the API's artifacts and the rules'.
    let egress = Egress::new(&settings.egress).context("the Egress configuration")?;
    let rules = rules::RuleSettings {
        rules: settings.rules,
        counter_interval_seconds: collector::counters::DEFAULT_INTERVAL_SECONDS,
        egress: egress.clone(),
    };
    rules.check_egress()?;
    let metrics = Registry::default();
    let (taps, mut exporting) =
        export::spawn(&settings.exporters, &metrics).context("starting the exporters")?;
    let (sink, writer) = writer::spawn(store.clone(), taps).context("starting the store writer")?;
    let (stop, shutdown) = watch::channel(false);
    let agent = Arc::new(Agent {
        settings: Settings {
            duty: settings.duty,
            events: settings.events,
            filters: settings.filters,
            host_name: host_name(),
            linkage: settings.linkage,
            rules,
        },
        processes: AttachedProcesses::default(),
        sink,
        shutdown,
    });

    let listen = match &settings.listen_socket {
        Some(path) => Some(Arc::new(discover::bind_listen(path).await?)),
        None => None,
    };
    let api = {
        let monitor = ui::MonitorState {
            directory: ui::ProcessDirectory {
                connect: settings.connect,
                listen: listen.clone(),
            },
            egress,
            ..ui::MonitorState::default()
        };
        let state = ui::ApiState::new(store.clone())
            .with_processes(agent.processes.clone())
            .with_monitor(monitor);
        let mut shutdown = agent.shutdown.clone();
        let stopped = async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        };
        tokio::spawn(ui::serve(listener, ui::router(state), stopped))
    };
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
        "clrscope agent: API on http://{api_addr}; profiling {} ({:.0}% duty: {:?} every {:?}); \
         data in {}",
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

    export::log_started(&settings.exporters);

    stop_signal.await;
    eprintln!("clrscope agent: stopping (sessions end, the store is flushed)");
    let _ = stop.send(true);
    if let Ok(Err(error)) = api.await {
        tracing::warn!(%error, "the HTTP API ended with an error");
    }
    while let Some(result) = tasks.join_next().await {
        if let Ok(Err(error)) = result {
            tracing::warn!(error = %format!("{error:#}"), "discovery ended with an error");
        }
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
    tokio::task::spawn_blocking(move || writer.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the store writer panicked"))?;
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
    use super::parse_url;

    #[test]
    fn urls() {
        let addr = |url: &str| {
            parse_url(url)
                .map(|a| a.to_string())
                .map_err(|e| e.to_string())
        };
        assert_eq!(addr("http://127.0.0.1:52323").unwrap(), "127.0.0.1:52323");
        assert_eq!(addr("http://localhost:0/").unwrap(), "127.0.0.1:0");
        assert_eq!(addr("http://+:52323").unwrap(), "0.0.0.0:52323");
        assert_eq!(addr("*:1").unwrap(), "0.0.0.0:1");
        assert_eq!(addr("http://[::1]:80").unwrap(), "[::1]:80");
        assert!(addr("http://a:1;http://b:2")
            .unwrap_err()
            .contains("one URL"));
        assert!(addr("https://127.0.0.1:1").unwrap_err().contains("TLS"));
    }
}
