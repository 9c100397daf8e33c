//! What one profiling interval of one process produced, in the form the store appends and the
//! exporters push: batches of samples of one profile type.

use serde::{Deserialize, Serialize};

use crate::model::{Function, LabelValue};

/// A profile type as Pyroscope names it: what is measured and in which unit.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProfileType {
    pub name: String,
    pub unit: String,
}

impl ProfileType {
    /// The names of the profile types the collector produces, which [`ProfileType::known`]
    /// accepts; for messages that list them.
    pub const KNOWN_NAMES: [&'static str; 7] = [
        "cpu",
        "wall",
        "alloc_samples",
        "alloc_size",
        "exception",
        "lock_count",
        "lock_time",
    ];

    /// The profile types the collector produces, by name ([`ProfileType::KNOWN_NAMES`]), so
    /// every writer uses one unit.
    pub fn known(name: &str) -> Option<ProfileType> {
        let unit = match name {
            "cpu" | "wall" | "lock_time" => "nanoseconds",
            "alloc_samples" | "exception" | "lock_count" => "count",
            "alloc_size" => "bytes",
            _ => return None,
        };
        Some(ProfileType {
            name: name.to_string(),
            unit: unit.to_string(),
        })
    }
}

/// One sample of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchSample {
    /// Indices into [`Batch::functions`], leaf first.
    pub stack: Vec<u32>,
    pub value: i64,
    /// Per-sample labels such as `thread_id`, `trace_id`, `span_id`, `span_name`; any order.
    pub labels: Vec<(String, LabelValue)>,
}

/// What one profiling interval of one series produced; the unit of the store's `Store::append`.
///
/// Functions are listed once per batch and samples refer to them by index, which is how the
/// sampler already holds them and keeps appends free of per-frame string copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// `service_name`, `process_id`, `host_name` and any others; any order, keys unique.
    pub series: Vec<(String, String)>,
    pub profile_type: ProfileType,
    /// When the interval was taken, Unix nanoseconds.
    pub timestamp_unix_nanos: i64,
    pub functions: Vec<Function>,
    pub samples: Vec<BatchSample>,
}
