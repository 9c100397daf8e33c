//! `clrscope trace`: a raw EventPipe trace of one process, written as the runtime streams it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use collector::artifacts::{collect_trace, TraceEnd, TraceProgress, TraceRequest};
use collector::client::DiagnosticsClient;
use collector::providers::{self, SessionProviders, TraceProfile};
use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use ipc::{CollectTracing, DEFAULT_RUNDOWN_KEYWORD};
use settings::parse_duration;
use tokio::io::BufWriter;
use tokio::sync::Notify;

use crate::args::NettraceArgs;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The process to trace.
    #[arg(long)]
    pid: u32,
    /// How long to trace (e.g. 10s, 2m); without it, until Ctrl-C.
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// dotnet-monitor trace profiles, comma-separated: Cpu, Http, Logs, Metrics, GcCollect.
    /// Without --profile and --providers: Cpu,Http,Metrics,GcCollect (dotnet-monitor's default).
    #[arg(long, value_delimiter = ',')]
    profile: Vec<TraceProfile>,
    /// Providers in dotnet-trace's syntax, comma-separated:
    /// `Name[:keywords[:level[:key=value;...]]]`, keywords in hex. Omitted keywords enable every
    /// event (for the runtime's own providers: TraceEvent's default set); level defaults to
    /// Informational.
    #[arg(long)]
    providers: Option<String>,
    /// Ask for rundown at the end (method and module names, needed to name frames). Default: on
    /// when a profile or provider set asks for it.
    #[arg(long, overrides_with = "no_rundown")]
    rundown: bool,
    /// No rundown at the end.
    #[arg(long)]
    no_rundown: bool,
    /// The runtime's buffer for this session, in MB (events are dropped when it is full).
    #[arg(long, default_value_t = CollectTracing::DEFAULT_BUFFER_MB)]
    buffer_mb: u32,
    /// Interval of EventCounters enabled by the Metrics profile, in seconds.
    #[arg(long, default_value_t = 5)]
    counter_interval: u32,
    /// How long to wait for the rundown after stopping.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    stop_timeout: Duration,
    /// Output file; default `clrscope-PID-UNIXTIME.nettrace`.
    #[arg(short, long)]
    output: Option<PathBuf>,
    #[command(flatten)]
    nettrace: NettraceArgs,
}

impl Args {
    fn session_providers(&self) -> anyhow::Result<SessionProviders> {
        let mut session = SessionProviders::default();
        let profiles: &[TraceProfile] = if self.profile.is_empty() && self.providers.is_none() {
            &TraceProfile::DEFAULT
        } else {
            &self.profile
        };
        for &profile in profiles {
            session.add_profile(profile, self.counter_interval)?;
        }
        if let Some(list) = &self.providers {
            let explicit = providers::parse_providers(list)?;
            if !explicit.is_empty() && session.rundown_keyword == 0 {
                // Explicit providers get the usual rundown, as dotnet-trace and dotnet-monitor do.
                session.rundown_keyword = DEFAULT_RUNDOWN_KEYWORD;
            }
            for provider in explicit {
                session.add(provider)?;
            }
        }
        if session.providers.is_empty() {
            anyhow::bail!("no providers: give --profile or --providers");
        }
        if self.no_rundown {
            session.rundown_keyword = 0;
        } else if self.rundown && session.rundown_keyword == 0 {
            session.rundown_keyword = DEFAULT_RUNDOWN_KEYWORD;
        }
        Ok(session)
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut request = TraceRequest::new(args.session_providers()?)?
        .with_duration(args.duration)
        .with_parser(args.nettrace.parser_options());
    request.buffer_mb = args.buffer_mb;
    request.stop_timeout = args.stop_timeout;
    let client = DiagnosticsClient::for_pid(args.pid)?;
    let output = args.output.clone().unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        PathBuf::from(format!("clrscope-{}-{now}.nettrace", args.pid))
    });
    let file = crate::output::create_private(&output)?;
    let mut out = BufWriter::with_capacity(256 * 1024, tokio::fs::File::from_std(file));

    let bar = ProgressBar::new_spinner();
    bar.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("valid template"));
    bar.enable_steady_tick(Duration::from_millis(200));
    let show = |p: TraceProgress| {
        let phase = if p.session.stopping {
            "stopping, collecting rundown".to_string()
        } else {
            match args.duration {
                Some(d) => format!(
                    "{:.0} s left",
                    d.saturating_sub(p.session.elapsed).as_secs_f64()
                ),
                None => "Ctrl-C to stop".to_string(),
            }
        };
        bar.set_message(format!(
            "pid {}: {} events, {} in {:.1} s · {phase}",
            args.pid,
            p.events,
            HumanBytes(p.session.bytes),
            p.session.elapsed.as_secs_f64()
        ));
    };

    // The first Ctrl-C stops the trace (the rundown follows); a second one abandons it.
    let stop_requested = Arc::new(Notify::new());
    let stop = {
        let stop_requested = stop_requested.clone();
        async move {
            let _ = tokio::signal::ctrl_c().await;
            stop_requested.notify_one();
        }
    };
    let abort = async {
        stop_requested.notified().await;
        let _ = tokio::signal::ctrl_c().await;
    };
    let result = tokio::select! {
        result = collect_trace(&client, &request, &mut out, stop, show) => result,
        () = abort => {
            bar.finish_and_clear();
            anyhow::bail!("aborted: {} is incomplete (it lacks the end of the stream and the rundown)", output.display());
        }
    };
    bar.finish_and_clear();
    if result.is_err() && out.buffer().is_empty() {
        // The session never sent a byte: no file rather than an empty one.
        if std::fs::metadata(&output).is_ok_and(|m| m.len() == 0) {
            let _ = std::fs::remove_file(&output);
        }
    }
    let summary = result.with_context(|| format!("tracing pid {}", args.pid))?;
    let how = match summary.end {
        TraceEnd::Duration | TraceEnd::Stopped | TraceEnd::StoppingEvent => "stopped",
        TraceEnd::EndedByRuntime => "ended by the runtime (did the process exit?)",
    };
    if let Some(error) = &summary.parse_error {
        tracing::warn!(%error, "the stream did not parse; the file holds it as the runtime sent it");
    }
    eprintln!(
        "wrote {} events ({}, {} dropped by the runtime) to {} ({:.1} s, session {:#x} via {}, {how})",
        summary.events,
        HumanBytes(summary.session.bytes),
        summary.dropped_events,
        output.display(),
        summary.session.elapsed.as_secs_f64(),
        summary.session.session_id,
        summary.session.version.name(),
    );
    Ok(())
}
