//! `clrscope gcdump`: a heap snapshot of a live process as a `.gcdump` file (PerfView's format),
//! and `clrscope gcdump report`: the type histogram of such a file.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use collector::artifacts::{collect_gcdump, write_gcdump_async};
use collector::client::DiagnosticsClient;
use collector::gcdump::{self, Histogram, SnapshotOptions, SnapshotProgress};
use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use serde::Serialize;
use settings::parse_duration;

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// The process whose heap to snapshot (it is paused for one full blocking GC).
    #[arg(long, required = true)]
    pid: Option<u32>,
    /// Output file; default `clrscope-PID-UNIXTIME.gcdump`.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Give up if the snapshot is not complete by then (large heaps take longer).
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    timeout: Duration,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Objects and bytes per type in a .gcdump file, largest first.
    Report(ReportArgs),
}

#[derive(Debug, clap::Args)]
struct ReportArgs {
    /// A .gcdump file (from clrscope, dotnet-gcdump or PerfView).
    file: PathBuf,
    /// How many types to list.
    #[arg(long, default_value_t = 20)]
    top: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    match (args.command, args.pid) {
        (Some(Command::Report(report_args)), _) => report(report_args),
        (None, Some(pid)) => collect(pid, args.output, args.timeout).await,
        (None, None) => anyhow::bail!("give --pid PID to take a snapshot, or `report FILE`"),
    }
}

async fn collect(pid: u32, output: Option<PathBuf>, timeout: Duration) -> anyhow::Result<()> {
    let started = Instant::now();
    let client = DiagnosticsClient::for_pid(pid)?;
    let output = output.unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        PathBuf::from(format!("clrscope-{pid}-{}.gcdump", now.as_secs()))
    });

    let bar = ProgressBar::new_spinner();
    bar.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("valid template"));
    bar.enable_steady_tick(Duration::from_millis(200));
    bar.set_message(format!("pid {pid}: inducing a full GC"));
    let show = |p: SnapshotProgress| {
        let phase = if p.draining {
            "GC done, draining"
        } else {
            "walking the heap"
        };
        bar.set_message(format!(
            "pid {pid}: {} objects in {:.1} s · {phase}",
            p.objects,
            p.elapsed.as_secs_f64()
        ));
    };
    let result = collect_gcdump(&client, pid, SnapshotOptions { timeout }, show).await;
    bar.finish_and_clear();
    let snapshot = Arc::new(result.with_context(|| format!("heap snapshot of pid {pid}"))?);

    let file = crate::output::create_private(&output)?;
    let mut out = tokio::io::BufWriter::with_capacity(1 << 20, tokio::fs::File::from_std(file));
    write_gcdump_async(snapshot.clone(), &mut out)
        .await
        .with_context(|| format!("writing {}", output.display()))?;
    let graph = &snapshot.graph;
    let histogram = graph.histogram();
    eprintln!(
        "wrote {}: {} objects ({}), {} references, {} types, {} roots ({:.1} s)",
        output.display(),
        histogram.objects,
        HumanBytes(histogram.bytes),
        graph.edge_count(),
        histogram.types.len(),
        graph.roots().len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// What `report --json` prints.
#[derive(Debug, Serialize)]
struct Report<'a> {
    file: &'a Path,
    process_id: u32,
    process_name: &'a str,
    machine_name: &'a str,
    collected_unix_nanos: i64,
    creation_tool: &'a str,
    references: usize,
    roots: usize,
    #[serde(flatten)]
    histogram: &'a Histogram,
}

fn report(args: ReportArgs) -> anyhow::Result<()> {
    let bytes =
        std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let dump = gcdump::read_gcdump(&bytes).with_context(|| format!("{}", args.file.display()))?;
    let mut histogram = dump.graph.histogram();
    histogram.truncate(args.top);
    let mut out = std::io::stdout().lock();
    if args.json {
        let report = Report {
            file: &args.file,
            process_id: dump.info.process_id,
            process_name: &dump.info.process_name,
            machine_name: &dump.info.machine_name,
            collected_unix_nanos: dump.info.collected_unix_nanos,
            creation_tool: &dump.info.creation_tool,
            references: dump.graph.edge_count(),
            roots: dump.graph.roots().len(),
            histogram: &histogram,
        };
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(
        out,
        "{}: pid {} ({}) on {}{}\n{} objects, {} ({} bytes), {} references, {} roots\n",
        args.file.display(),
        dump.info.process_id,
        dump.info.process_name,
        dump.info.machine_name,
        match dump.info.creation_tool.as_str() {
            "" => String::new(),
            tool => format!(", by {tool}"),
        },
        histogram.objects,
        HumanBytes(histogram.bytes),
        histogram.bytes,
        dump.graph.edge_count(),
        dump.graph.roots().len(),
    )?;
    writeln!(out, "{:>12} {:>14} {:>6}  type", "count", "bytes", "%")?;
    for row in &histogram.types {
        let share = if histogram.bytes == 0 {
            0.0
        } else {
            row.bytes as f64 * 100.0 / histogram.bytes as f64
        };
        writeln!(
            out,
            "{:>12} {:>14} {:>5.1}%  {}",
            row.count, row.bytes, share, row.name
        )?;
    }
    Ok(())
}
