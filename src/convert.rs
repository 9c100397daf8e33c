//! `clrscope convert`: a profile from a recorded nettrace file (clrscope, dotnet-trace or
//! dotnet-monitor), named by the trace's own method events and rundown.

use std::collections::HashMap;
use std::io::BufReader;
use std::path::PathBuf;

use anyhow::Context;
use exporter::Format;
use nettrace::NettraceReader;
use symbolizer::profiles::recording::Recorder;

use crate::args::NettraceArgs;
use crate::output::{self, TimeType};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The .nettrace file.
    input: PathBuf,
    /// Output file; its extension picks the format unless --format is given.
    #[arg(short, long)]
    output: PathBuf,
    /// Output format: pprof, folded, speedscope or svg.
    #[arg(long)]
    format: Option<Format>,
    /// Profile types, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "cpu")]
    types: Vec<TimeType>,
    #[command(flatten)]
    nettrace: NettraceArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let format = output::choose_format(&args.output, args.format)?;
    let file = std::fs::File::open(&args.input)
        .with_context(|| format!("opening {}", args.input.display()))?;
    let mut reader = NettraceReader::with_options(
        BufReader::with_capacity(1 << 20, file),
        args.nettrace.parser_options(),
    );
    let mut recorder = Recorder::default();
    loop {
        match reader.next_event() {
            Ok(Some(event)) => {
                // A payload that does not decode is counted and skipped.
                let _ = recorder.observe(&event);
            }
            Ok(None) => break,
            Err(e) => {
                // What was read before the damage still makes a profile.
                tracing::warn!(error = %e, "the trace is damaged; converting what precedes it");
                eprintln!("warning: {}: {e}", args.input.display());
                break;
            }
        }
    }
    if let Some(trace) = reader.parser().trace() {
        recorder.set_trace(trace);
    }
    let types = output::time_profiles(&args.types);
    if let (true, Some((managed, samples))) = (types.cpu, recorder.samples().few_managed()) {
        // No kernel figures in a file: the estimate `record` makes cannot be made here.
        eprintln!(
            "warning: {}: only {managed} of {samples} samples are marked as running managed code. \
             If the process was busy, its runtime marks managed code as external \
             ({issue}: CoreCLR 9.x and 10.0 before 10.0.4, NativeAOT before 11), and a file holds \
             no per-thread CPU from the kernel, so convert cannot estimate cpu: the cpu profile \
             holds only the samples marked managed. The wall profile (--types wall) is exact; \
             `clrscope record` on the live process estimates cpu from the kernel.",
            args.input.display(),
            issue = collector::samples::UNTRUSTED_KINDS_ISSUE,
        );
    }
    let (profile, resolution) = recorder.profile(types, &HashMap::new());
    if profile.samples.is_empty() && recorder.samples().samples() > 0 {
        anyhow::bail!(
            "{}: none of its {} samples is marked as running managed code, so it has no cpu \
             profile (see the warning above): convert it with --types wall",
            args.input.display(),
            recorder.samples().samples()
        );
    }
    if profile.samples.is_empty() {
        anyhow::bail!(
            "{} holds no sampler events with stacks (was Microsoft-DotNETCore-SampleProfiler enabled?)",
            args.input.display()
        );
    }
    output::write_profile(&profile, &resolution, &args.output, format)
}
