//! The diagnostics IPC wire protocol of the .NET runtime, as a pure codec: functions over byte
//! slices, no I/O. The transport (connect or listen mode, `collector::client`) reads and writes
//! the bytes. A crate of its own that depends on no workspace crate.
//!
//! One connection carries one command:
//!
//! 1. (listen mode only) the runtime sends an [`Advertise`] (34 bytes);
//! 2. the client sends a [`Request`] (`Request::encode` gives the whole message);
//! 3. the runtime replies with a 20-byte [`Header`] and `header.payload_len()` bytes of payload:
//!    an error ([`decode_error`]) or an OK whose payload depends on the command
//!    ([`ProcessInfo`], [`decode_session_id`], [`decode_status`], [`EnvironmentHeader`]);
//! 4. some commands continue on the same connection: the nettrace stream after CollectTracing,
//!    the environment block after ProcessEnvironment ([`decode_environment`]).
//!
//! Decoders treat their input as hostile: every length is checked against the bytes present,
//! errors are returned rather than panics, and no count read from the input sizes an allocation
//! beyond what the input itself holds.
//!
//! The layouts follow the runtime's `src/native/eventpipe/ds-*.c` where it and the protocol doc
//! (dotnet/diagnostics `ipc-protocol.md`) disagree; the tests name each such place.

mod advertise;
mod collect;
mod error;
mod header;
mod hresult;
mod reply;
mod request;
mod wire;

#[cfg(test)]
mod tests;

pub use advertise::{Advertise, RuntimeCookie, ADVERTISE_LEN, ADVERTISE_MAGIC};
pub use collect::{
    BufferMode, CollectTracing, CollectTracingVersion, EventFilter, ProviderConfig, TraceFormat,
    DEFAULT_RUNDOWN_KEYWORD, MAX_LEVEL, MAX_PROVIDERS,
};
pub use error::ProtocolError;
pub use header::{
    command_set, server_id, Header, ReplyKind, HEADER_LEN, IPC_MAGIC, MAX_MESSAGE_LEN,
};
pub use hresult::{Hresult, ServerError};
pub use reply::{
    decode_environment, decode_error, decode_session_id, decode_status, EnvironmentHeader,
    ProcessInfo, MAX_ENVIRONMENT_LEN,
};
pub use request::{CoreDump, DumpType, PerfMapType, Request};
