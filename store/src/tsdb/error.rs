//! One error type for the store, each variant saying what to do about it.

use std::path::PathBuf;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The file system refused an operation.
    #[error("{path}: {source} (check that the data directory exists, is writable by this user and the disk is not full)")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Another store (another agent) has the data directory open.
    #[error("data directory {dir} is in use by another clrscope agent (it holds the lock on {lock}): stop that agent, or give this one another --data-dir")]
    Locked { dir: PathBuf, lock: PathBuf },
    /// A block on disk cannot be read; it is skipped, the rest of the store keeps working.
    #[error("block {path} is damaged ({reason}); it is skipped: move or delete that directory to silence this")]
    CorruptBlock { path: PathBuf, reason: String },
    /// A block written by a newer, incompatible clrscope.
    #[error("block {path} has format version {found}, but this clrscope reads major versions 1 to {supported}: upgrade clrscope or move the block away")]
    UnsupportedVersion {
        path: PathBuf,
        found: String,
        supported: u32,
    },
    /// Writing a Parquet file failed.
    #[error("writing {path}: {source} (is the disk full?)")]
    Parquet {
        path: PathBuf,
        #[source]
        source: parquet::errors::ParquetError,
    },
    /// The caller handed in a batch that cannot be stored.
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// More distinct functions, stack nodes or label sets than 32-bit ids can count.
    #[error("more than 2^32-1 {what} in one head, block or query: flush more often or narrow the query's time range")]
    TooMany { what: &'static str },
    /// A series selector that does not parse.
    #[error("invalid selector {input:?}: {reason}; expected e.g. {{service_name=\"api\",process_id=\"42\"}}")]
    InvalidSelector { input: String, reason: String },
    /// A query that cannot be answered as asked.
    #[error("invalid query: {0}")]
    InvalidQuery(String),
    /// The data directory could be changed by another user: refused rather than trusted.
    #[error(
        "data directory {dir} {problem}: another user could plant or replace blocks; give the \
         agent a directory of its own (e.g. `install -d -m 0700 {dir}` as the agent's user)",
        dir = dir.display()
    )]
    UnsafeDataDir { dir: PathBuf, problem: String },
    /// The query's [`super::QueryControl`] was cancelled (its client went away).
    #[error("the query was cancelled before it finished")]
    Cancelled,
    /// Options that make no sense.
    #[error("invalid store options: {0}")]
    InvalidOptions(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Attaches the path to an I/O error.
pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> StoreError {
    let path = path.into();
    move |source| StoreError::Io { path, source }
}

pub(crate) fn corrupt(path: impl Into<PathBuf>, reason: impl std::fmt::Display) -> StoreError {
    StoreError::CorruptBlock {
        path: path.into(),
        reason: reason.to_string(),
    }
}
