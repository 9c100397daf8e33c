//! clrscope's model: the profiles and the other signals (spans, logs, exceptions, counter
//! samples) every stage that reads, keeps or writes them shares.
//!
//! - [`model`]: a profile as pprof shapes it (sample types, a function table, samples with a
//!   stack of function indices and labels), and the builder that merges equal samples.
//! - [`batch`]: what one profiling interval of one process produced: the unit the store appends
//!   and the exporters push.
//! - [`labels`]: the names of the labels and of the synthetic frames.
//! - [`tree`]: the call tree a flame graph draws, cut to its largest nodes; the one
//!   representation every flame-graph consumer reads.
//! - [`diff`]: two profiles side by side, for differential flame graphs.
//! - [`clock`]: the wall clock in the units profiles carry.
//! - [`ids`]: hash maps keyed by the ids a program made itself.
//! - [`span`]: W3C trace and span ids, the span a sample or record was in, finished spans.
//! - [`log`]: log levels, messages and the log records the agent keeps.
//! - [`exception`]: first-chance exceptions as the agent keeps them.
//! - [`counter`]: EventCounter and meter values as typed samples.
//! - [`signal`]: kept log and exception records as live readers receive them.
//! - [`budget`]: the memory budgets parsers and kept signals are charged to.
//! - [`guid`]: GUIDs as the event stream carries them, and provider GUIDs from names.
//! - [`artifact`]: the kinds of diagnostic artifact and dotnet-monitor's file names for them.
//! - [`utc`]: times as text, in UTC, in every form clrscope writes one.
//!
//! A leaf crate: it depends on nothing heavy (no Arrow, Parquet or tokio), so exporters and the
//! web API can use it without the store's columnar machinery.

pub mod artifact;
pub mod batch;
pub mod budget;
pub mod clock;
pub mod counter;
pub mod diff;
pub mod exception;
pub mod guid;
pub mod ids;
pub mod labels;
pub mod log;
pub mod model;
pub mod signal;
pub mod span;
pub mod tree;
pub mod utc;

pub use batch::{Batch, BatchSample, ProfileType};
pub use diff::diff;
pub use model::{
    Function, FunctionIndex, FunctionTotals, LabelValue, Labels, Profile, ProfileBuilder, Sample,
    ValueType,
};
pub use tree::CallTree;
