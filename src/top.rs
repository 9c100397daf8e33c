//! `clrscope top`: the hottest functions of a live process, refreshed every second.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use collector::client::{DiagnosticsClient, DEFAULT_TIMEOUT};
use collector::local::LocalProcess;
use collector::session::rundown;
use nettrace::{AsyncNettraceReader, ParserOptions};
use settings::parse_duration;
use symbolizer::profiles::recording::Recorder;
use symbolizer::profiles::TimeProfiles;
use symbolizer::RundownRefreshPolicy;

use crate::live;
use crate::output::TimeType;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The process.
    #[arg(long)]
    pid: u32,
    /// What to rank by: cpu (running managed code) or wall (all threads, waiting included).
    #[arg(long, value_enum, default_value = "cpu")]
    r#type: TimeType,
    /// Rows to show.
    #[arg(long, default_value_t = 25)]
    rows: usize,
    /// Refresh interval.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    interval: Duration,
    /// Stop after this long (default: until Ctrl-C).
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let client = DiagnosticsClient::for_pid(args.pid)?;
    let mut recorder = Recorder::default();
    let local = LocalProcess::of_runtime(&client, u64::from(args.pid)).await;
    live::distrust_known_kinds(&client, local.as_ref(), &mut recorder).await;
    // Each thread's CPU since attach, to weigh its samples by (and to estimate it from where
    // the runtime's sample kinds cannot be trusted).
    let cpu_at_attach = local.as_ref().map(LocalProcess::thread_cpu);
    let mut warned = false;
    let session = live::attach(&client, args.pid, local.as_ref(), &mut recorder).await?;
    let session_id = session.id;
    let mut reader = AsyncNettraceReader::new(session.stream);
    let types = TimeProfiles {
        cpu: args.r#type == TimeType::Cpu,
        wall: args.r#type == TimeType::Wall,
    };
    let terminal = std::io::stdout().is_terminal();
    // ReadyToRun code first run after attach has no JIT event: when frames land in a managed
    // image without a known method, a fresh rundown names it (at most every 10 s).
    let mut refresh = RundownRefreshPolicy::new(10_000_000_000, 1);
    let mut misses_seen = 0;
    let started = Instant::now();
    let mut ticker = tokio::time::interval(args.interval);
    ticker.tick().await;
    let deadline = async {
        match args.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            event = reader.next_event() => match event? {
                Some(event) => {
                    // A payload that does not decode is counted by the recorder and skipped.
                    let _ = recorder.observe(&event);
                }
                None => anyhow::bail!("pid {} ended the session (did it exit?)", args.pid),
            },
            _ = ticker.tick() => {
                if let (Some(local), Some(since)) = (&local, &cpu_at_attach) {
                    recorder.set_thread_cpu(&local.thread_cpu().cores_since(since));
                }
                if !warned {
                    warned = live::warn_untrusted_kinds(u64::from(args.pid), recorder.samples());
                }
                let misses = draw(&recorder, types, &args, local.as_ref(), started.elapsed(), terminal)?;
                refresh.record_misses(misses.saturating_sub(misses_seen));
                misses_seen = misses;
                if refresh.should_refresh(started.elapsed().as_nanos() as u64) {
                    rundown(&client, args.pid, &mut recorder, &ParserOptions::default()).await?;
                }
            }
            () = &mut deadline => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    // The runtime flushes into the stream before it answers: keep reading while it stops.
    let drain = async { while let Ok(Some(_)) = reader.next_event().await {} };
    let (stopped, ()) = tokio::join!(client.stop_tracing(session_id, DEFAULT_TIMEOUT), drain);
    stopped?;
    Ok(())
}

/// Draws one frame; returns how many sampled frames lie in managed images without a known method.
fn draw(
    recorder: &Recorder,
    types: TimeProfiles,
    args: &Args,
    local: Option<&LocalProcess>,
    elapsed: Duration,
    terminal: bool,
) -> anyhow::Result<u64> {
    let names = local.map(LocalProcess::thread_names).unwrap_or_default();
    let (profile, resolution) = recorder.profile(types, &names);
    let value_type = 1;
    let total = profile.total(value_type).max(1) as f64;
    let mut out = std::io::stdout().lock();
    if terminal {
        // Home the cursor and clear the screen: one frame per refresh.
        write!(out, "\x1b[H\x1b[2J")?;
    }
    writeln!(
        out,
        "clrscope top: pid {} · {} {} samples in {:.0} s · period {:.2} ms · Ctrl-C quits",
        args.pid,
        profile.total(0),
        profile.sample_types[value_type].kind,
        elapsed.as_secs_f64(),
        profile.period as f64 / 1e6
    )?;
    writeln!(out, "{:>7} {:>7}  FUNCTION", "SELF%", "TOTAL%")?;
    for row in profile.function_totals(value_type).iter().take(args.rows) {
        let function = &profile.functions[row.function as usize];
        writeln!(
            out,
            "{:>6.1}% {:>6.1}%  {}",
            row.self_value as f64 * 100.0 / total,
            row.total_value as f64 * 100.0 / total,
            function.name
        )?;
    }
    if !terminal {
        writeln!(out)?;
    }
    out.flush()?;
    Ok(resolution.in_managed_image)
}
