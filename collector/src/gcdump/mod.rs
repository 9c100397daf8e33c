//! Heap snapshots ("gcdumps"): the objects of a live process, their types and references, taken
//! over EventPipe as dotnet-gcdump takes them.
//!
//! - [`snapshot`] induces a full blocking GC and assembles the heap walk it reports into a
//!   [`HeapGraph`] (compact arrays, for heaps of millions of objects);
//! - [`HeapGraph::histogram`] counts objects and shallow bytes per type.

mod collect;
mod events;
mod graph;

use std::time::Duration;

pub use collect::{snapshot, SnapshotOptions, SnapshotProgress, HEAP_SNAPSHOT_KEYWORDS};
pub use graph::{HeapGraph, Histogram, TypeStats};

use crate::client::ClientError;
use crate::nettrace::NettraceError;
use crate::session::SessionError;

/// Why a heap snapshot could not be taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GcDumpError {
    #[error("starting the heap snapshot session: {0}")]
    Session(#[source] SessionError),
    #[error("stopping the heap snapshot session: {0}")]
    Stop(#[source] ClientError),
    #[error("reading the heap snapshot events: {0}")]
    Stream(#[from] NettraceError),
    #[error(
        "the runtime closed the session before the induced GC ended (did the process exit, or \
         did another tool stop the session?)"
    )]
    EndedEarly,
    #[error(
        "no complete heap snapshot within {timeout:?} ({seen}); a large heap needs a longer \
         --timeout"
    )]
    Timeout { timeout: Duration, seen: String },
    #[error("the heap snapshot is incomplete: {0}; try again")]
    Incomplete(String),
    #[error("the heap graph is inconsistent: {0}")]
    InvalidGraph(String),
}
