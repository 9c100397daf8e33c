//! The time-series store: named profiles (the `profile` model's batches) in, queries out.
//!
//! - [`tsdb`]: the on-disk time series of profiles the agent writes and queries: columnar blocks,
//!   retention, compaction, and the queries behind every profile and flame-graph answer.
//! - [`incidents`]: rule firings and marks with the window of profiles around them, kept beside
//!   the blocks under the same retention.

pub mod incidents;
pub mod tsdb;
