//! `clrscope record`: a cpu and/or wall profile of a live process.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use collector::client::DiagnosticsClient;
use collector::local::LocalProcess;
use collector::session::{self, EventObserver, ParsingWriter, SessionProgress};
use exporter::Format;
use indicatif::{ProgressBar, ProgressStyle};
use settings::parse_duration;
use symbolizer::profiles::recording::Recorder;

use crate::live;
use crate::output::{self, TimeType};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The process to profile.
    #[arg(long)]
    pid: u32,
    /// How long to sample (e.g. 30s, 2m); Ctrl-C stops early and still writes the profile.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    duration: Duration,
    /// Profile types, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "cpu")]
    types: Vec<TimeType>,
    /// Output file; its extension picks the format unless --format is given
    /// (.pb.gz/.pprof: pprof, .folded/.txt: folded stacks, .speedscope.json/.json: speedscope, .svg).
    #[arg(short, long)]
    output: PathBuf,
    /// Output format: pprof, folded, speedscope or svg.
    #[arg(long)]
    format: Option<Format>,
}

/// Counts samples for the progress line while the recorder takes every event.
struct Counting {
    recorder: Recorder,
    samples: Arc<AtomicU64>,
}

impl EventObserver for Counting {
    fn on_event(&mut self, event: &nettrace::Event<'_>) {
        self.recorder.on_event(event);
        self.samples
            .store(self.recorder.samples().samples(), Ordering::Relaxed);
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    // Fail on a bad output name before profiling for half a minute.
    let format = output::choose_format(&args.output, args.format)?;
    let client = DiagnosticsClient::for_pid(args.pid)?;
    let mut recorder = Recorder::default();
    let local = LocalProcess::of_runtime(&client, u64::from(args.pid)).await;
    live::load_images(local.as_ref(), &mut recorder);
    live::distrust_known_kinds(&client, local.as_ref(), &mut recorder).await;
    let thread_names_now = || {
        local
            .as_ref()
            .map(LocalProcess::thread_names)
            .unwrap_or_default()
    };
    let mut thread_names = thread_names_now();

    // Live JIT/Loader events name code compiled while we sample; the rundown at the end names
    // everything else that is loaded, ReadyToRun code included.
    let config = live::sampling_session(true);

    let samples = Arc::new(AtomicU64::new(0));
    let mut sink = ParsingWriter::new(
        tokio::io::sink(),
        Counting {
            recorder,
            samples: samples.clone(),
        },
    );
    let bar = ProgressBar::new_spinner();
    bar.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("valid template"));
    bar.enable_steady_tick(Duration::from_millis(200));
    let duration = args.duration;
    let show = |p: SessionProgress| {
        let phase = if p.stopping {
            "collecting method names (rundown)".to_string()
        } else {
            format!(
                "{:.0} s left",
                duration.saturating_sub(p.elapsed).as_secs_f64()
            )
        };
        bar.set_message(format!(
            "pid {}: {} samples · {phase}",
            args.pid,
            samples.load(Ordering::Relaxed)
        ));
    };
    let cpu_before = local.as_ref().map(LocalProcess::thread_cpu);
    let mut cpu_at_stop = None;
    let stop = async {
        tokio::select! {
            () = tokio::time::sleep(duration) => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        // When sampling stops, not after the rundown that follows.
        cpu_at_stop = local.as_ref().map(LocalProcess::thread_cpu);
    };
    let summary = session::run(
        &client,
        config,
        &mut sink,
        stop,
        Duration::from_secs(120),
        show,
    )
    .await
    .with_context(|| format!("profiling pid {}", args.pid));
    bar.finish_and_clear();
    summary?;
    if let Some(error) = sink.error() {
        anyhow::bail!("the runtime's stream did not parse: {error}");
    }
    let trace = sink.parser().trace().cloned();
    let (_, Counting { mut recorder, .. }) = sink.into_parts();
    if let Some(trace) = &trace {
        recorder.set_trace(trace);
    }
    if let (Some(before), Some(after)) = (&cpu_before, &cpu_at_stop) {
        recorder.set_thread_cpu(&after.cores_since(before));
    }
    live::warn_untrusted_kinds(u64::from(args.pid), recorder.samples());
    // Threads that started while sampling are named now; ones that ended keep their earlier name.
    thread_names.extend(thread_names_now());

    let (profile, resolution) = recorder.profile(output::time_profiles(&args.types), &thread_names);
    if profile.samples.is_empty() {
        anyhow::bail!(
            "no samples of pid {} in {:.1} s: is it running managed code?",
            args.pid,
            duration.as_secs_f64()
        );
    }
    output::write_profile(&profile, &resolution, &args.output, format)
}
