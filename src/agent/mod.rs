//! `clrscope agent`: profiles every .NET process it can reach, continuously, into the store.
//!
//! Tasks and the channels between them:
//! - discovery ([`discover`]): rescans for default diagnostic sockets (connect mode) and accepts
//!   runtimes that dial `--diagnostic-port` (listen mode); starts one task per runtime;
//! - per process ([`process`]): a light session plus a duty-cycled sampler, turned into store
//!   batches, which go into a bounded queue;
//! - the store writer ([`writer`]): the only thread that writes the store.

mod discover;
mod process;
mod writer;

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use collector::attached::AttachedProcesses;
use collector::sampler::DutyCycle;
use store::continuous::EventProfiles;
use store::tsdb::{Store, StoreOptions};
use tokio::sync::watch;

use crate::args::{parse_bytes, parse_duration};
use writer::BatchSink;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Also accept runtimes that dial this socket (start them with
    /// DOTNET_DiagnosticPorts=PATH,nosuspend or ,suspend).
    #[arg(long, value_name = "PATH")]
    diagnostic_port: Option<PathBuf>,
    /// Do not look for processes' own diagnostic sockets; only accept runtimes on
    /// --diagnostic-port.
    #[arg(long, requires = "diagnostic_port")]
    no_connect: bool,
    /// Where the HTTP API listens: http://HOST:PORT (port 0 picks a free one). Binding beyond
    /// loopback exposes the profiles to the network.
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:52323")]
    urls: String,
    /// Where profiles are stored (created 0700).
    #[arg(long, value_name = "DIR", default_value = "./clrscope-data")]
    data_dir: PathBuf,
    /// How often to look for new processes.
    #[arg(long, value_parser = parse_duration, default_value = "3s")]
    rescan_interval: Duration,
    /// Only profile these pids (repeatable).
    #[arg(long = "pid", value_name = "PID")]
    pids: Vec<u64>,
    /// Only profile processes with this name: entry assembly, else executable (repeatable).
    #[arg(long = "name", value_name = "NAME")]
    names: Vec<String>,
    /// Only profile processes whose command line contains this text (repeatable).
    #[arg(long = "command-line", value_name = "TEXT")]
    command_lines: Vec<String>,
    /// Sample for this long in every --sample-period (at most 10s).
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    sample_window: Duration,
    /// The sampler runs for --sample-window out of every period. The runtime's sampler pauses the
    /// process every millisecond while it runs, so this ratio is what keeps overhead low.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    sample_period: Duration,
    /// No alloc_samples/alloc_size profiles (GC allocation ticks, taken during sampler windows).
    #[arg(long)]
    no_alloc: bool,
    /// No exception profile.
    #[arg(long)]
    no_exceptions: bool,
    /// No lock_count/lock_time profiles (monitor contention).
    #[arg(long)]
    no_locks: bool,
    /// Tag cpu and wall samples with the trace and span their thread ran. Off by default: the
    /// DiagnosticSource span and TPL context-switch events it needs cost 0.1–0.3 ms of CPU per
    /// request on .NET 8 (BENCHMARKS.md, "Trace linkage"), and listening to every ActivitySource
    /// makes libraries create spans they otherwise skip.
    #[arg(long)]
    trace_linkage: bool,
    /// With --trace-linkage, follow only the spans of these ActivitySources (repeatable), so
    /// libraries the service does not trace itself are left alone; default: every source.
    #[arg(long = "trace-source", value_name = "NAME", requires = "trace_linkage")]
    trace_sources: Vec<String>,
    /// Delete profiles older than this.
    #[arg(long, value_parser = parse_duration, default_value = "7d")]
    retention: Duration,
    /// Delete the oldest profiles while the store is larger than this.
    #[arg(long, value_parser = parse_bytes, default_value = "1GiB")]
    retention_size: u64,
    /// How long new profiles may stay in memory before they are written (at most 10s): what a
    /// crash can lose.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    flush_interval: Duration,
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
}

/// What the agent's tasks share.
pub struct Agent {
    pub settings: Settings,
    pub processes: AttachedProcesses,
    pub sink: BatchSink,
    /// Turns true once when the agent stops.
    pub shutdown: watch::Receiver<bool>,
}

/// `http://HOST:PORT` or `HOST:PORT` to a socket address (HOST an IP address or `localhost`).
fn parse_url(url: &str) -> anyhow::Result<std::net::SocketAddr> {
    if url.starts_with("https://") {
        anyhow::bail!("--urls {url}: TLS is not supported yet; use http:// on loopback");
    }
    let authority = url
        .strip_prefix("http://")
        .unwrap_or(url)
        .trim_end_matches('/');
    let authority = authority.replace("localhost", "127.0.0.1");
    authority.parse().with_context(|| {
        format!("--urls {url}: expected http://IP:PORT, e.g. http://127.0.0.1:52323")
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
    let duty = DutyCycle::new(args.sample_window, args.sample_period)?;
    let api_addr = parse_url(&args.urls)?;
    let linkage = if args.trace_linkage {
        let sources: Vec<&str> = args.trace_sources.iter().map(String::as_str).collect();
        Some(collector::providers::linkage(&sources).context("--trace-source")?)
    } else {
        None
    };
    let options = StoreOptions {
        flush_interval: args.flush_interval,
        retention_age: args.retention,
        retention_bytes: args.retention_size,
        ..StoreOptions::default()
    };
    let store = Store::open(&args.data_dir, options)
        .with_context(|| format!("opening the store in {}", args.data_dir.display()))?;
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
    let (sink, writer) = writer::spawn(store.clone()).context("starting the store writer")?;
    let (stop, shutdown) = watch::channel(false);
    let agent = Arc::new(Agent {
        settings: Settings {
            duty,
            events: EventProfiles {
                alloc: !args.no_alloc,
                exceptions: !args.no_exceptions,
                locks: !args.no_locks,
            },
            filters: Filters {
                pids: args.pids,
                names: args.names,
                command_lines: args.command_lines,
            },
            host_name: host_name(),
            linkage,
        },
        processes: AttachedProcesses::default(),
        sink,
        shutdown,
    });

    let api = {
        let state = ui::ApiState::new(store.clone()).with_processes(agent.processes.clone());
        let mut shutdown = agent.shutdown.clone();
        let stopped = async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        };
        tokio::spawn(ui::serve(listener, ui::router(state), stopped))
    };
    let filtered = !agent.settings.filters.is_empty();
    let mut tasks = tokio::task::JoinSet::new();
    if !args.no_connect {
        tasks.spawn(discover::connect_mode(agent.clone(), args.rescan_interval));
    }
    if let Some(path) = &args.diagnostic_port {
        let server = discover::bind_listen(path).await?;
        tasks.spawn(discover::listen_mode(agent.clone(), server));
    }
    eprintln!(
        "clrscope agent: API on http://{api_addr}; profiling {} ({:.0}% duty: {:?} every {:?}); \
         data in {}",
        match (&args.diagnostic_port, args.no_connect) {
            (Some(p), true) => format!("runtimes dialling {}", p.display()),
            (Some(p), false) => format!(".NET processes and runtimes dialling {}", p.display()),
            (None, _) => ".NET processes".to_string(),
        } + if filtered {
            " that match the filters"
        } else {
            ""
        },
        duty.fraction() * 100.0,
        duty.window,
        duty.period,
        args.data_dir.display()
    );

    wait_for_stop_signal().await?;
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
    Ok(())
}

async fn wait_for_stop_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("listening for Ctrl-C")?,
        _ = terminate.recv() => {}
    }
    Ok(())
}
