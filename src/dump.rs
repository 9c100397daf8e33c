//! `clrscope dump`: a core dump of a process, written by the runtime's own `createdump`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use collector::artifacts::{write_dump, DumpKind};
use collector::client::DiagnosticsClient;
use indicatif::ProgressBar;
use settings::parse_duration;

/// What the dump holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// Stacks and the modules' data, no heap (small).
    Mini,
    /// Mini plus the GC heaps: enough for heap analysis.
    #[value(alias = "withheap")]
    WithHeap,
    /// Mini with personal data removed: paths, strings.
    Triage,
    /// All process memory (as large as the process).
    Full,
}

impl From<Kind> for DumpKind {
    fn from(kind: Kind) -> DumpKind {
        match kind {
            Kind::Mini => DumpKind::Mini,
            Kind::WithHeap => DumpKind::WithHeap,
            Kind::Triage => DumpKind::Triage,
            Kind::Full => DumpKind::Full,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The process.
    #[arg(long)]
    pid: u32,
    /// What the dump holds.
    #[arg(long = "type", value_enum, ignore_case = true, default_value = "full")]
    kind: Kind,
    /// Output file. The target's runtime writes it, so the path is as the target sees it (inside
    /// its container, if it runs in one); a relative path is made absolute from here.
    #[arg(short, long)]
    output: PathBuf,
    /// How long the runtime may take.
    #[arg(long, value_parser = parse_duration, default_value = "10m")]
    timeout: Duration,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let client = DiagnosticsClient::for_pid(args.pid)?;
    let path = std::path::absolute(&args.output)
        .with_context(|| format!("resolving {}", args.output.display()))?;
    let bar = ProgressBar::new_spinner();
    bar.enable_steady_tick(Duration::from_millis(200));
    bar.set_message(format!(
        "pid {}: writing a {:?} dump (the process is suspended meanwhile)",
        args.pid, args.kind
    ));
    let started = Instant::now();
    let result = write_dump(&client, &path, args.kind.into(), args.timeout).await;
    bar.finish_and_clear();
    let written = result.with_context(|| format!("dumping pid {}", args.pid))?;
    if let Some(bytes) = written {
        eprintln!(
            "wrote {} ({:.1} MB, {:?}) in {:.1} s",
            path.display(),
            bytes as f64 / 1e6,
            args.kind,
            started.elapsed().as_secs_f64()
        );
    } else {
        eprintln!(
            "the runtime wrote {} inside the target's file system ({:.1} s)",
            path.display(),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
