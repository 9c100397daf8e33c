//! `clrscope stacks`: every managed thread's stack at one moment (one sampler tick).

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use collector::client::DiagnosticsClient;
use collector::ipc::{CollectTracing, ProviderConfig};
use collector::nettrace::events::{KnownEvent, SampleKind};
use collector::nettrace::AsyncNettraceReader;
use collector::providers::{self, level};
use collector::session;
use serde::Serialize;
use store::sampled::Recorder;
use symbolizer::FrameKind;

use crate::live;

/// Samples of one tick lie within microseconds; the next tick comes a sampler interval later.
const TICK_GAP_NS: i64 = 500_000;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The process.
    #[arg(long)]
    pid: u32,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct ThreadStack {
    thread_id: u64,
    thread_name: Option<String>,
    /// `managed`: running managed code; `native`: in native code, blocked or waiting.
    state: &'static str,
    /// Innermost first.
    frames: Vec<StackFrame>,
}

#[derive(Debug, Serialize)]
struct StackFrame {
    function: String,
    module: String,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let client = DiagnosticsClient::for_pid(args.pid)?;
    let mut recorder = Recorder::default();
    live::load_images(args.pid, &mut recorder);
    let names = live::thread_names(args.pid);
    // The sampler alone; the rundown at stop names every method the stacks point into.
    let config = CollectTracing::v2(vec![ProviderConfig::new(
        providers::SAMPLE_PROFILER,
        0,
        level::INFORMATIONAL,
    )])
    .with_rundown(true);
    let (session, _) = session::start(&client, config)
        .await
        .with_context(|| format!("starting the sampler in pid {}", args.pid))?;
    let session_id = session.id;
    let mut reader = AsyncNettraceReader::new(session.stream);

    let mut tick = Vec::new();
    let mut tick_at = None;
    let first_tick = async {
        while let Some(event) = reader.next_event().await? {
            let Some(KnownEvent::ThreadSample(sample)) = event.known()? else {
                continue;
            };
            let at = event.unix_nanos();
            let started = *tick_at.get_or_insert(at);
            if at - started > TICK_GAP_NS {
                break;
            }
            let ips: Vec<u64> = event.stack().map(|s| s.ips().collect()).unwrap_or_default();
            tick.push((event.header.thread_id, sample.kind, ips));
        }
        Ok::<_, anyhow::Error>(())
    };
    tokio::time::timeout(Duration::from_secs(10), first_tick)
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "no sampler tick from pid {} within 10 s: is it hung?",
                args.pid
            )
        })??;

    // Stop, and read the rest (the rundown) while the runtime answers.
    let drain = async {
        while let Some(event) = reader.next_event().await? {
            recorder.observe(&event)?;
        }
        Ok::<_, anyhow::Error>(())
    };
    let (stopped, drained) = tokio::join!(client.stop_tracing(session_id), drain);
    stopped?;
    drained.context("reading the rundown")?;

    let map = recorder.code_map();
    let mut threads: Vec<ThreadStack> = tick
        .into_iter()
        .map(|(thread_id, kind, ips)| ThreadStack {
            thread_id,
            thread_name: names.get(&thread_id).cloned(),
            state: if kind == SampleKind::Managed {
                "managed"
            } else {
                "native"
            },
            frames: map
                .symbolize_stack(&ips)
                .into_iter()
                .map(|frame| {
                    let function = map.function(frame.function);
                    StackFrame {
                        function: match frame.kind {
                            FrameKind::Managed { .. } => function.display_name().to_string(),
                            _ => map.frame_label(frame),
                        },
                        module: function.module.to_string(),
                    }
                })
                .collect(),
        })
        .collect();
    threads.sort_by_key(|t| t.thread_id);

    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &threads)?;
        writeln!(out)?;
        return Ok(());
    }
    for thread in &threads {
        let name = thread.thread_name.as_deref().unwrap_or("?");
        let state = match thread.state {
            "managed" => "running managed code",
            _ => "in native code or waiting",
        };
        writeln!(out, "Thread {} ({name}), {state}:", thread.thread_id)?;
        for frame in &thread.frames {
            if frame.module.is_empty() {
                writeln!(out, "    {}", frame.function)?;
            } else {
                writeln!(out, "    {}  [{}]", frame.function, frame.module)?;
            }
        }
        writeln!(out)?;
    }
    Ok(())
}
