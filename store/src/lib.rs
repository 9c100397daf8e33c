//! The system of record: the canonical profile model and its columnar time series on disk.
//!
//! - [`profile`]: the profile every exporter reads.
//! - [`continuous`]: the always-on profile of one process, as store batches.
//! - [`sampled`]: cpu and wall profiles from the EventPipe sampler's stacks.
//! - [`tsdb`]: the on-disk time series of profiles the agent writes and queries.

pub mod continuous;
pub mod profile;
pub mod sampled;
pub mod tsdb;
