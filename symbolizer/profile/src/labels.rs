//! The names of the labels profiles carry, written by the stage that turns events into profiles
//! and read by the store, the exporters and the API: one definition, so a writer and its readers
//! cannot drift apart.
//!
//! Series labels name the source of a whole batch; sample labels vary per sample. All are bounded:
//! never a raw path or a user id.

/// Series label: the service, from `OTEL_SERVICE_NAME`/`OTEL_RESOURCE_ATTRIBUTES`, else the process name.
pub const SERVICE_NAME: &str = "service_name";
/// Series label: the process id (in the agent's pid namespace).
pub const PROCESS_ID: &str = "process_id";
/// Series label: the host the agent runs on.
pub const HOST_NAME: &str = "host_name";

/// Sample label: the managed thread's OS thread id.
pub const THREAD_ID: &str = "thread_id";
/// Sample label: the thread's name, where the runtime reported one.
pub const THREAD_NAME: &str = "thread_name";
/// Sample label: the W3C trace id (32 hex digits) of the span current on the thread.
pub const TRACE_ID: &str = "trace_id";
/// Sample label: the W3C span id (16 hex digits) of the span current on the thread.
pub const SPAN_ID: &str = "span_id";
/// Sample label: the display name of that span.
pub const SPAN_NAME: &str = "span_name";
/// Sample label: the allocated or thrown type of an `alloc_*` or `exception` sample.
pub const TYPE: &str = "type";

/// The frame of a sample whose stack is empty or whose name is blank.
pub const UNKNOWN_FRAME: &str = "[unknown]";
/// The frame that stands for the callees a flame graph cut below a kept node.
pub const OTHER_FRAME: &str = "other";
