//! The system of record: the canonical profile model and its columnar time series on disk.
//!
//! - [`profile`]: the profile every exporter reads.

pub mod profile;
