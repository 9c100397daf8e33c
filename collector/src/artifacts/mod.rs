//! Collecting diagnostic artifacts from a live runtime, as library calls the CLI, the HTTP API and
//! collection-rule actions share:
//!
//! - [`collect_trace`]: a raw EventPipe trace (`.nettrace`) of dotnet-monitor's profiles or of
//!   explicit providers, for a duration, until a stopping event, or until the caller stops it;
//! - [`collect_gcdump`] then [`write_gcdump_async`]: a heap snapshot as a `.gcdump` file;
//! - [`write_dump`] (the runtime writes a core dump to a path) and [`collect_dump`] (the same,
//!   copied into any writer and the temporary file removed);
//! - [`ArtifactKind`]: the file names dotnet-monitor gives each kind of artifact.
//!
//! - [`collect_stack_tick`]: every thread's stack at one moment (one sampler tick), with the
//!   rundown events that name their methods; `symbolizer::stacks` turns them into named stacks
//!   and dotnet-monitor's `/stacks` formats (the code map lives there).
//!
//! Every function writes into an [`AsyncWrite`](tokio::io::AsyncWrite)
//! the caller chooses (a file, an HTTP body, an egress upload); none keeps a whole artifact in
//! memory but the heap graph of a gcdump.
//!
//! ```no_run
//! # async fn demo(client: collector::client::DiagnosticsClient) -> Result<(), collector::artifacts::ArtifactError> {
//! use collector::artifacts::{collect_trace, TraceRequest};
//! use collector::providers::TraceProfile;
//! let request = TraceRequest::profiles(&TraceProfile::DEFAULT, 5)?
//!     .with_duration(Some(std::time::Duration::from_secs(10)));
//! let mut file = tokio::fs::File::create("/tmp/t.nettrace").await.unwrap();
//! let summary = collect_trace(&client, &request, &mut file, std::future::pending(), |_| {}).await?;
//! # Ok(()) }
//! ```

mod dump;
mod gcdump;
mod livemetrics;
mod stacks;
mod trace;

pub use dump::{
    collect_dump, write_dump, DumpKind, UnknownDumpKind, UntrustedDump, DEFAULT_DUMP_TIMEOUT,
};
pub use gcdump::{collect_gcdump, write_gcdump_async, HeapSnapshot};
pub use livemetrics::{
    write_live_metrics, write_records as write_live_metric_records, EventMetricsConfiguration,
    EventMetricsMeter, EventMetricsProvider, LiveMetricsRequest,
};
pub use stacks::{collect_stack_tick, StackFormat};
pub use trace::{
    collect_trace, EventPipeConfiguration, EventPipeProvider, StoppingEvent, TraceEnd,
    TraceProgress, TraceRequest, TraceSummary, DEFAULT_STOP_TIMEOUT,
};

use std::path::PathBuf;

use crate::client::ClientError;
use crate::gcdump::GcDumpError;
use crate::providers::ProviderSpecError;
use crate::session::SessionError;

/// Why an artifact could not be collected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArtifactError {
    #[error(transparent)]
    Providers(#[from] ProviderSpecError),
    #[error("no providers: give a profile (Cpu, Http, Logs, Metrics, GcCollect) or providers")]
    NoProviders,
    #[error("tracing: {0}")]
    Trace(#[source] SessionError),
    #[error("heap snapshot: {0}")]
    GcDump(#[from] GcDumpError),
    #[error("dump: {0}")]
    Dump(#[source] ClientError),
    #[error("no sampler tick within {0:?}: is the runtime hung or suspended?")]
    NoSamplerTick(std::time::Duration),
    #[error("reading the stream: {0}")]
    Stream(#[source] nettrace::NettraceError),
    #[error("stopping the session: {0}")]
    Stop(#[source] ClientError),
    #[error("asking the runtime who it is: {0}")]
    ProcessInfo(#[source] ClientError),
    #[error(
        "the runtime wrote no dump at {}: it runs in another file system (a container); give it \
         a folder it shares with clrscope", path.display()
    )]
    DumpNotVisible { path: PathBuf },
    #[error(
        "refusing {} as the dump: {reason}; something other than the runtime put it there (the \
         target itself, if it is hostile)", path.display()
    )]
    UntrustedDump {
        path: PathBuf,
        reason: UntrustedDump,
    },
    #[error("{what} {}: {source}", path.display())]
    File {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing the artifact after {bytes} bytes: {source}")]
    Write {
        bytes: u64,
        #[source]
        source: std::io::Error,
    },
}
