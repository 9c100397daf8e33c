//! Attaching to a live process with every frame nameable.

use anyhow::Context;
use collector::client::{DiagnosticsClient, EventPipeSession};
use collector::local::LocalProcess;
use collector::providers::{self, level};
use collector::samples::SampleAggregator;
use collector::session;
use ipc::{CollectTracing, ProviderConfig};
use nettrace::ParserOptions;
use symbolizer::profiles::recording::Recorder;

/// The sampler plus live JIT/Loader events at Verbose; `rundown` adds the rundown at its end.
pub fn sampling_session(rundown: bool) -> CollectTracing {
    CollectTracing::v2(vec![
        ProviderConfig::new(providers::SAMPLE_PROFILER, 0, level::INFORMATIONAL),
        ProviderConfig::new(
            providers::RUNTIME,
            providers::RUNTIME_JIT_LOADER_KEYWORDS,
            level::VERBOSE,
        ),
    ])
    .with_rundown(rundown)
}

/// Starts a sampling session, then runs a rundown-only session into `recorder`: code loaded
/// before now is named by the rundown, code loaded later by the live session's JIT events, and
/// starting the live session first leaves no gap between the two.
pub async fn attach(
    client: &DiagnosticsClient,
    pid: u32,
    local: Option<&LocalProcess>,
    recorder: &mut Recorder,
) -> anyhow::Result<EventPipeSession> {
    load_images(local, recorder);
    let (live, _) = session::start(client, sampling_session(false))
        .await
        .with_context(|| format!("starting the sampler in pid {pid}"))?;
    session::rundown(client, pid, &mut *recorder, &ParserOptions::default()).await?;
    Ok(live)
}

/// The process's mapped files, so addresses outside any known method still name their module.
pub fn load_images(local: Option<&LocalProcess>, recorder: &mut Recorder) {
    if let Some(Ok(images)) = local.map(symbolizer::read_proc_maps) {
        recorder.set_images(images);
    }
}

/// Tells `recorder` when the process's runtime is known to mark samples of managed code as
/// external ([`collector::samples::untrusted_kinds_of`]; NativeAOT told by its maps).
pub async fn distrust_known_kinds(
    client: &DiagnosticsClient,
    local: Option<&LocalProcess>,
    recorder: &mut Recorder,
) {
    let Ok(info) = client.process_info().await else {
        return;
    };
    let version = info.clr_product_version.unwrap_or_default();
    let why = match local {
        Some(local) => local.untrusted_kinds(&version),
        None => collector::samples::untrusted_kinds_of(&version, false),
    };
    if let Some(why) = why {
        recorder.distrust_kinds(why);
    }
}

/// Logs, at warn, why the samples' kinds were not believed and what `cpu` is instead; nothing
/// when they were. The caller logs it once per process.
pub fn warn_untrusted_kinds(pid: u64, samples: &SampleAggregator) -> bool {
    let Some(why) = samples.untrusted_kinds() else {
        return false;
    };
    if samples.cpu_estimated() {
        tracing::warn!(
            pid,
            "{why}: cpu is estimated from the kernel's per-thread CPU, spread over each thread's \
             sampled stacks (docs/runtimes.md, \"Sample kinds\"); wall is exact"
        );
    } else {
        tracing::warn!(
            pid,
            "{why}: the kernel's per-thread CPU could not be read (the process is not on this \
             machine), so cpu cannot be estimated and counts no sample; wall is exact"
        );
    }
    true
}
