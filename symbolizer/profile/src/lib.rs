//! clrscope's profile model: what every stage that reads or writes profiles shares.
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
//!
//! A leaf crate: it depends on nothing heavy (no Arrow, Parquet or tokio), so exporters and the
//! web API can use it without the store's columnar machinery.

pub mod batch;
pub mod clock;
pub mod diff;
pub mod ids;
pub mod labels;
pub mod model;
pub mod tree;

pub use batch::{Batch, BatchSample, ProfileType};
pub use diff::diff;
pub use model::{
    Function, FunctionIndex, FunctionTotals, LabelValue, Labels, Profile, ProfileBuilder, Sample,
    ValueType,
};
pub use tree::CallTree;
