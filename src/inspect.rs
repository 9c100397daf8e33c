//! `clrscope inspect`: what a nettrace file holds, or how far a damaged one can be read.

use std::fmt::Write as _;
use std::io::{BufReader, Write};
use std::path::PathBuf;

use anyhow::Context;
use collector::inspect::{self, Inspection};

use crate::args::NettraceArgs;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A .nettrace file (from clrscope, dotnet-trace or dotnet-monitor).
    file: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    nettrace: NettraceArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let file = std::fs::File::open(&args.file)
        .with_context(|| format!("opening {}", args.file.display()))?;
    let summary = inspect::inspect(
        BufReader::with_capacity(1 << 20, file),
        args.nettrace.parser_options(),
    );
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &summary)?;
        writeln!(out)?;
    } else {
        out.write_all(render(&summary).as_bytes())?;
    }
    match &summary.damage {
        None => Ok(()),
        Some(damage) => anyhow::bail!(
            "{} is damaged{}: {} ({} events read before it)",
            args.file.display(),
            damage
                .offset
                .map(|o| format!(" at offset {o}"))
                .unwrap_or_default(),
            damage.reason,
            summary.events
        ),
    }
}

/// The text report; golden tests compare it byte for byte.
pub fn render(s: &Inspection) -> String {
    let mut text = String::new();
    let state = if s.complete { "complete" } else { "INCOMPLETE" };
    let _ = writeln!(text, "bytes: {} ({state})", s.bytes);
    if let Some(t) = &s.trace {
        let _ = writeln!(
            text,
            "trace: pid {}, {}-bit, {} processors, sampler interval {:.3} ms",
            t.process_id,
            u32::from(t.pointer_size) * 8,
            t.processors,
            f64::from(t.sampling_interval_ns) / 1e6
        );
        let _ = writeln!(
            text,
            "clock: synchronized {} at {} ticks/s",
            t.sync_time, t.qpc_frequency
        );
    }
    match (&s.first_event, &s.last_event, s.duration_seconds) {
        (Some(first), Some(last), Some(seconds)) => {
            let _ = writeln!(text, "time: {first} .. {last} ({seconds:.3} s)");
        }
        _ => {
            let _ = writeln!(text, "time: no events");
        }
    }
    let _ = writeln!(
        text,
        "events: {} ({} dropped by the runtime)",
        s.events, s.dropped_events
    );
    let _ = writeln!(
        text,
        "stacks: {} events with a stack, depth max {} mean {:.1}",
        s.stacks.events_with_stack, s.stacks.max_depth, s.stacks.mean_depth
    );
    let _ = writeln!(text, "providers: {}", s.providers.len());
    for provider in &s.providers {
        let _ = writeln!(text, "  {} ({} events)", provider.name, provider.events);
        for event in &provider.by_event {
            let _ = writeln!(
                text,
                "    {:>5}  {:<44} {}",
                event.id, event.name, event.count
            );
        }
    }
    if let Some(damage) = &s.damage {
        let at = damage
            .offset
            .map(|o| format!("offset {o}"))
            .unwrap_or_else(|| "unknown offset".into());
        let _ = writeln!(text, "damage: at {at}: {}", damage.reason);
    }
    text
}
