//! `clrscope`: command-line wiring only; the work lives in the crates.

mod agent;
mod args;
mod convert;
mod dump;
mod gcdump;
mod generatekey;
mod incident;
mod inspect;
mod live;
mod output;
mod ps;
mod record;
mod stacks;
mod top;
mod trace;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use tracing_subscriber::EnvFilter;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// `clrscope --version`: the package version and the git revision it was built from (build.rs).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("BUILD_REVISION"), ")");

#[derive(Debug, Parser)]
#[command(
    name = "clrscope",
    version = VERSION,
    about = "Continuous profiler and incident capture for .NET on Linux"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Log filter, e.g. `info` or `collector=debug` (also read from RUST_LOG).
    #[arg(long, global = true, env = "RUST_LOG", default_value = "warn")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List .NET processes with a diagnostic port.
    Ps(ps::Args),
    /// Record a raw EventPipe trace (.nettrace), like dotnet-trace.
    Trace(trace::Args),
    /// Summarize a .nettrace file: header, providers, event counts, stacks, time range.
    Inspect(inspect::Args),
    /// Profile a process: cpu and wall time per managed function, as pprof, folded, speedscope or SVG.
    Record(record::Args),
    /// Turn a .nettrace file into a profile (pprof, folded, speedscope or SVG).
    Convert(convert::Args),
    /// Live view of the hottest functions of a process, refreshed every second.
    Top(top::Args),
    /// Every managed thread's current stack (one sampler tick).
    Stacks(stacks::Args),
    /// A core dump of a process, written by the runtime (Mini, WithHeap, Triage or Full).
    Dump(dump::Args),
    /// Heap snapshot of a process as a .gcdump file (`gcdump report FILE`: its type histogram).
    Gcdump(gcdump::Args),
    /// Profile every .NET process continuously into a local store, and serve queries.
    Agent(Box<agent::Args>),
    /// The incidents an agent recorded (rule firings and marks): list them, or export one as a
    /// self-contained HTML bundle.
    Incident(incident::Args),
    /// A new API key for the agent: its settings (Subject, PublicKey) and the bearer token for
    /// clients, as dotnet-monitor's generatekey prints them.
    Generatekey(generatekey::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // A reader that went away (`clrscope ps | head`) is not an error worth reporting.
        Err(error) if is_broken_pipe(&error) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", describe(&error));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    init_logging(cli.log_format, &cli.log)?;
    let runtime = match &cli.command {
        Command::Agent(args) => agent::runtime(args)?,
        _ => tokio::runtime::Runtime::new()?,
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Ps(args) => ps::run(args).await,
            Command::Trace(args) => trace::run(args).await,
            Command::Inspect(args) => inspect::run(args),
            Command::Record(args) => record::run(args).await,
            Command::Convert(args) => convert::run(args),
            Command::Top(args) => top::run(args).await,
            Command::Stacks(args) => stacks::run(args).await,
            Command::Dump(args) => dump::run(args).await,
            Command::Gcdump(args) => gcdump::run(args).await,
            Command::Agent(args) => agent::run(*args).await,
            Command::Incident(args) => incident::run(args),
            Command::Generatekey(args) => generatekey::run(args),
        }
    });
    // A blocking task left behind at the agent's stop deadline (a store writer still waiting)
    // must not hold the exit, as dropping the runtime would.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}

fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The error and its causes on one line; a cause already spelled out by the message above it is
/// not repeated (most library errors show their source's text in their own). Every message that
/// reports an error, on the terminal or in the agent's log, is written with it.
pub(crate) fn describe(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

fn init_logging(format: LogFormat, filter: &str) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(filter)
        .map_err(|e| anyhow::anyhow!("invalid --log filter {filter:?}: {e}"))?;
    // Colours only for a person at a terminal: a log file or journal gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::describe;
    use collector::client::ClientError;
    use collector::session::SessionError;

    #[test]
    fn an_error_is_described_with_each_cause_once() {
        // The chain an exited process leaves: each library error shows its source's text too.
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let error = anyhow::Error::new(SessionError::Stop(ClientError::Io {
            command: "StopTracing",
            source: reset,
        }))
        .context("sampling");
        let text = describe(&error);
        assert_eq!(text.matches("connection reset").count(), 1, "{text}");
        assert_eq!(text.matches("StopTracing").count(), 1, "{text}");
        assert!(
            text.starts_with("sampling: stopping the session: StopTracing: "),
            "{text}"
        );
        // Causes no message above spells out are kept.
        let error = anyhow::anyhow!("connection reset").context("the window");
        assert_eq!(describe(&error), "the window: connection reset");
    }
}
