//! Every managed thread's stack at one moment: one tick of the runtime's sampler, then the
//! rundown that names the methods those stacks point into; and the formats they are written in
//! (`symbolizer::stacks` names and writes them).

use std::time::Duration;

use super::ArtifactError;
use crate::client::DiagnosticsClient;
use crate::providers::{self, level};
use crate::samples::{starts_tick, StackKey, DEFAULT_INTERVAL_NS};
use crate::session::{self, EventObserver};
use ipc::{CollectTracing, ProviderConfig};
use nettrace::{AsyncNettraceReader, NettraceError};

/// The formats of dotnet-monitor's `/stacks` (and of its CollectStacks action's `Format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StackFormat {
    PlainText,
    Json,
    Speedscope,
}

impl StackFormat {
    pub fn content_type(self) -> &'static str {
        match self {
            StackFormat::PlainText => "text/plain",
            StackFormat::Json => "application/json",
            StackFormat::Speedscope => "application/speedscope+json",
        }
    }
}

/// A live runtime's sampler ticks every millisecond; one that sends nothing for this long is hung.
const TICK_TIMEOUT: Duration = Duration::from_secs(10);

/// How long StopTracing may take: the runtime lists its code (the rundown) before it replies.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// Takes one sampler tick of the runtime behind `client` (one stack per sampled thread), then
/// stops the session and hands every event of its rundown to `rundown` (feed them to a code map
/// to name the stacks' methods).
pub async fn collect_stack_tick(
    client: &DiagnosticsClient,
    mut rundown: impl EventObserver,
) -> Result<Vec<StackKey>, ArtifactError> {
    let config = CollectTracing::v2(vec![ProviderConfig::new(
        providers::SAMPLE_PROFILER,
        0,
        level::INFORMATIONAL,
    )])
    .with_rundown(true);
    let (session, _) = session::start(client, config)
        .await
        .map_err(ArtifactError::Trace)?;
    let session_id = session.id;
    let mut reader = AsyncNettraceReader::new(session.stream);

    let mut tick = Vec::new();
    let mut previous_ns = None;
    let first_tick = async {
        while let Some(event) = reader.next_event().await? {
            let Some(sample) = event.thread_sample()? else {
                continue;
            };
            let at = event.unix_nanos();
            // The next tick has begun: the first is whole.
            if !tick.is_empty() && starts_tick(previous_ns, at, DEFAULT_INTERVAL_NS) {
                break;
            }
            previous_ns = Some(at);
            tick.push(StackKey::of(&event, &sample));
        }
        Ok::<_, NettraceError>(())
    };
    tokio::time::timeout(TICK_TIMEOUT, first_tick)
        .await
        .map_err(|_| ArtifactError::NoSamplerTick(TICK_TIMEOUT))?
        .map_err(ArtifactError::Stream)?;

    // The runtime writes the rundown before it answers StopTracing: read while it does.
    let drain = async {
        while let Some(event) = reader.next_event().await? {
            rundown.on_event(&event);
        }
        Ok::<_, NettraceError>(())
    };
    let (stopped, drained) = tokio::join!(client.stop_tracing(session_id, STOP_TIMEOUT), drain);
    stopped.map_err(ArtifactError::Stop)?;
    drained.map_err(ArtifactError::Stream)?;
    Ok(tick)
}
