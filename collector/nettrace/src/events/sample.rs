//! SampleProfiler ThreadSample: provider `Microsoft-DotNETCore-SampleProfiler`, event id 0,
//! minimal metadata, payload a single `u32 Type` (runtime `ep-sample-profiler.c`; TraceEvent
//! `SampleProfilerTraceEventParser`). The stack is the event's stack; `thread_id` in the header
//! is the sampled thread.

use super::PayloadReader;
use crate::error::NettraceError;

/// What the sampled thread was doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleKind {
    /// The runtime could not classify the thread (Type 0).
    Error,
    /// Preemptive mode: native code, blocking call, P/Invoke (Type 1). Wall time only.
    External,
    /// Cooperative mode: running managed code (Type 2). Counts as CPU.
    Managed,
    /// A value this decoder does not know.
    Other(u32),
}

/// One ThreadSample event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadSample {
    /// The sample's classification.
    pub kind: SampleKind,
}

impl ThreadSample {
    pub(crate) fn decode(mut r: PayloadReader<'_>) -> Result<Self, NettraceError> {
        let kind = match r.u32()? {
            0 => SampleKind::Error,
            1 => SampleKind::External,
            2 => SampleKind::Managed,
            other => SampleKind::Other(other),
        };
        Ok(ThreadSample { kind })
    }
}
