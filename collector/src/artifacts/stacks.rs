//! Every managed thread's stack at one moment: one tick of the runtime's sampler, then the
//! rundown that names the methods those stacks point into.

use std::time::Duration;

use super::ArtifactError;
use crate::client::DiagnosticsClient;
use crate::ipc::{CollectTracing, ProviderConfig};
use crate::nettrace::events::{KnownEvent, SampleKind};
use crate::nettrace::{AsyncNettraceReader, NettraceError};
use crate::providers::{self, level};
use crate::session::{self, EventObserver};

/// Samples of one tick lie within microseconds; the next tick comes a sampler interval later.
const TICK_GAP_NS: i64 = 500_000;
/// A live runtime's sampler ticks every millisecond; one that sends nothing for this long is hung.
const TICK_TIMEOUT: Duration = Duration::from_secs(10);

/// One thread's stack in the tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadSample {
    pub thread_id: u64,
    /// Running managed code (else in native code, blocked or waiting).
    pub managed: bool,
    /// Instruction pointers, innermost first.
    pub ips: Vec<u64>,
}

/// Takes one sampler tick of the runtime behind `client`, then stops the session and hands every
/// event of its rundown to `rundown` (feed them to a code map to name the stacks' methods).
pub async fn collect_stack_tick(
    client: &DiagnosticsClient,
    mut rundown: impl EventObserver,
) -> Result<Vec<ThreadSample>, ArtifactError> {
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
            tick.push(ThreadSample {
                thread_id: event.header.thread_id,
                managed: sample.kind == SampleKind::Managed,
                ips: event.stack().map(|s| s.ips().collect()).unwrap_or_default(),
            });
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
    let (stopped, drained) = tokio::join!(client.stop_tracing(session_id), drain);
    stopped.map_err(ArtifactError::Stop)?;
    drained.map_err(ArtifactError::Stream)?;
    Ok(tick)
}
