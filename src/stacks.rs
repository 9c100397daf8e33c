//! `clrscope stacks`: every managed thread's stack at one moment (one sampler tick).

use std::io::Write;

use anyhow::Context;
use collector::client::DiagnosticsClient;
use collector::local::LocalProcess;
use serde::Serialize;

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
    let local = LocalProcess::of_runtime(&client, u64::from(args.pid)).await;
    let stacks = symbolizer::stacks::capture(&client, local.as_ref())
        .await
        .with_context(|| format!("the stacks of pid {}", args.pid))?;
    let threads: Vec<ThreadStack> = stacks
        .stacks
        .into_iter()
        .map(|stack| ThreadStack {
            thread_id: stack.thread_id,
            thread_name: stack.thread_name,
            state: if stack.managed { "managed" } else { "native" },
            frames: stack
                .frames
                .into_iter()
                .map(|frame| StackFrame {
                    function: frame.display,
                    module: frame.module,
                })
                .collect(),
        })
        .collect();

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
