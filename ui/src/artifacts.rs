//! Collecting one diagnostic artifact of a runtime into any writer: the one implementation behind
//! the HTTP API's `/trace`, `/gcdump`, `/dump`, `/stacks`, `/logs`, `/exceptions` and `/livemetrics`
//! (streamed back or egressed) and the collection rules' CollectTrace, CollectGCDump, CollectDump,
//! CollectStacks, CollectLogs, CollectExceptions and CollectLiveMetrics actions
//! (egressed). `collector::artifacts` takes each from the runtime, `symbolizer::stacks` names
//! stacks, and an egressed artifact ends with [`Upload::conclude`](exporter::egress::Upload::conclude).
//!
//! ```no_run
//! # async fn demo(egress: exporter::egress::Egress, client: collector::client::DiagnosticsClient) -> Result<(), exporter::egress::EgressError> {
//! use collector::artifacts::StackFormat;
//! use ui::artifacts::{Artifact, ArtifactSource};
//! let artifact = Artifact::Stacks(StackFormat::PlainText);
//! let source = ArtifactSource { client: &client, pid: 42, local: None };
//! let name = artifact.kind().file_name(source.pid, std::time::SystemTime::now());
//! let mut upload = egress.start("artifacts", &name, &Default::default())?;
//! let written = artifact.write(source, &mut upload, std::future::pending(), None).await;
//! println!("at {}", upload.conclude(written).await?);
//! # Ok(()) }
//! ```

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use collector::artifacts::{
    collect_dump, collect_gcdump, collect_trace, write_gcdump_async, write_live_metrics,
    ArtifactError, DumpKind, LiveMetricsRequest, StackFormat, TraceRequest, DEFAULT_DUMP_TIMEOUT,
};
use collector::client::DiagnosticsClient;
use collector::gcdump::SnapshotOptions;
use collector::local::LocalProcess;
use collector::signals::{
    write_demanded_logs, write_exceptions, write_logs, ExceptionFormat, ExceptionsRequest,
    LogFormat, LogsRequest,
};
use collector::startup::ResumeHold;
use profile::artifact::ArtifactKind;
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// One artifact to collect, and how.
#[derive(Debug)]
pub enum Artifact {
    /// A `.nettrace`, for the request's duration, until its stopping event, or until stopped.
    Trace(TraceRequest),
    /// A heap snapshot, written as a `.gcdump`.
    GcDump(SnapshotOptions),
    /// A core dump, which the runtime writes into `temp_dir` first (a folder it shares with the
    /// agent, dotnet-monitor's `Storage:DumpTempFolder`).
    Dump { kind: DumpKind, temp_dir: PathBuf },
    /// Every managed thread's stack at one moment.
    Stacks(StackFormat),
    /// A process's log messages, from its logs session.
    Logs(LogsRequest),
    /// Counter and meter values as they are published, from a counter session of its own.
    LiveMetrics(LiveMetricsRequest),
    /// A process's kept first-chance exceptions, filtered.
    Exceptions(ExceptionsRequest),
}

/// The runtime an artifact is collected from.
#[derive(Debug, Clone, Copy)]
pub struct ArtifactSource<'a> {
    pub client: &'a DiagnosticsClient,
    /// The process id the runtime is known by (in file names and a gcdump's header).
    pub pid: u64,
    /// The runtime's process on this machine, when proven: stacks then name frames in its mapped
    /// files and its threads.
    pub local: Option<&'a LocalProcess>,
}

impl Artifact {
    /// The kind, which gives the file name and the concurrency limit.
    pub fn kind(&self) -> ArtifactKind {
        match self {
            Artifact::Trace(_) => ArtifactKind::Trace,
            Artifact::GcDump(_) => ArtifactKind::GcDump,
            Artifact::Dump { .. } => ArtifactKind::Dump,
            Artifact::Stacks(format) => ArtifactKind::Stacks {
                plain_text: *format == StackFormat::PlainText,
            },
            Artifact::Logs(request) => ArtifactKind::Logs {
                plain_text: request.format == LogFormat::Text,
            },
            Artifact::LiveMetrics(_) => ArtifactKind::LiveMetrics,
            Artifact::Exceptions(request) => ArtifactKind::Exceptions {
                plain_text: request.format == ExceptionFormat::Text,
            },
        }
    }

    /// The media type of the artifact's bytes.
    pub fn content_type(&self) -> &'static str {
        match self {
            Artifact::Stacks(format) => format.content_type(),
            Artifact::Logs(request) => request.format.content_type(),
            Artifact::LiveMetrics(_) => "application/json-seq",
            Artifact::Exceptions(request) => request.format.content_type(),
            _ => "application/octet-stream",
        }
    }

    /// A dump is written by the runtime's createdump, which cannot be called off: a cancelled
    /// dump is discarded once written, so its temporary file does not outlive the operation.
    pub fn cancellable_midway(&self) -> bool {
        !matches!(self, Artifact::Dump { .. })
    }

    /// Collects the artifact from `source` into `out` and flushes it; `stop` ends a trace early.
    /// `hold` (a runtime waiting to be resumed for it) is released once a trace's session is
    /// enabled, at once for the other artifacts.
    pub async fn write<W: AsyncWrite + Unpin + Send>(
        &self,
        source: ArtifactSource<'_>,
        out: &mut W,
        stop: impl Future<Output = ()>,
        hold: Option<ResumeHold>,
    ) -> Result<(), ArtifactError> {
        let client = source.client;
        let mut hold = hold;
        if !matches!(self, Artifact::Trace(_)) {
            drop(hold.take());
        }
        let written = match self {
            Artifact::Trace(request) => {
                let enabled = |_| drop(hold.take());
                let summary = collect_trace(client, request, out, stop, enabled).await?;
                if let Some(error) = &summary.parse_error {
                    tracing::warn!(%error, "a trace's stream did not parse; it is kept as the runtime sent it");
                }
                summary.session.bytes
            }
            Artifact::GcDump(options) => {
                let pid = u32::try_from(source.pid).unwrap_or(0);
                let snapshot = collect_gcdump(client, pid, *options, |_| {}).await?;
                write_gcdump_async(Arc::new(snapshot), out).await?
            }
            Artifact::Dump { kind, temp_dir } => {
                collect_dump(client, *kind, temp_dir, DEFAULT_DUMP_TIMEOUT, out).await?
            }
            Artifact::Stacks(format) => {
                let stacks = symbolizer::stacks::capture(client, source.local).await?;
                let text = stacks.render(*format);
                out.write_all(text.as_bytes())
                    .await
                    .map_err(|source| ArtifactError::Write { bytes: 0, source })?;
                text.len() as u64
            }
            // What the always-on collection does not cover, the process's logs session is made
            // to ask for, for as long as the request runs.
            Artifact::Logs(request) => match request.signals.check_logs(&request.settings) {
                Ok(()) => write_logs(request, out, stop).await,
                Err(why) => {
                    tracing::debug!(%why, "logs asked of the process's logs session");
                    write_demanded_logs(request, out, stop).await
                }
            }
            .map_err(|source| ArtifactError::Write { bytes: 0, source })?,
            Artifact::Exceptions(request) => write_exceptions(request, out)
                .await
                .map_err(|source| ArtifactError::Write { bytes: 0, source })?,
            Artifact::LiveMetrics(request) => {
                write_live_metrics(client, request, out, stop).await?
            }
        };
        out.flush().await.map_err(|source| ArtifactError::Write {
            bytes: written,
            source,
        })
    }
}
