//! Heap snapshots ("gcdumps"): the objects of a live process, their types and references, taken
//! over EventPipe as dotnet-gcdump takes them.
//!
//! - [`snapshot`] induces a full blocking GC and assembles the heap walk it reports into a
//!   [`HeapGraph`] (compact arrays, for heaps of millions of objects);
//! - [`HeapGraph::histogram`] counts objects and shallow bytes per type;
//! - [`write_gcdump`] stores a graph as a `.gcdump` file PerfView opens, and [`read_gcdump`]
//!   reads such files back.

mod collect;
mod events;
mod format;
mod graph;
mod read;
mod write;

use std::time::Duration;

pub use collect::{snapshot, SnapshotOptions, SnapshotProgress, HEAP_SNAPSHOT_KEYWORDS};
pub use format::DumpInfo;
pub use graph::{HeapGraph, Histogram, TypeStats};
pub use read::{read_gcdump, GcDumpFile};
pub use write::write_gcdump;

use crate::client::ClientError;
use crate::session::SessionError;
use nettrace::NettraceError;

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
    #[error("not a .gcdump file (it does not start with the FastSerialization signature)")]
    NotGcDump,
    #[error("the .gcdump file is truncated: it ends at byte {offset} while reading {what}")]
    Truncated { offset: u64, what: String },
    #[error("the .gcdump file is damaged at byte {offset}: {reason}")]
    Malformed { offset: u64, reason: String },
    #[error(
        "the .gcdump file holds {reason} at byte {offset}, which clrscope cannot read; open it \
         in PerfView"
    )]
    Unsupported { offset: u64, reason: String },
}

#[cfg(test)]
mod tests;
