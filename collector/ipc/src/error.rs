//! Errors of the IPC codec. Every message names what was being read and what to do about it,
//! because these end up in front of an SRE who cannot see the bytes.

/// A message could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// The first bytes are not the expected magic: the peer is not a .NET diagnostic port.
    #[error(
        "bad magic in {what}: expected {expected:?}, found {found:?}; the peer is not a .NET \
         diagnostic port, or it speaks a protocol version this tool does not know"
    )]
    BadMagic {
        what: &'static str,
        expected: &'static str,
        found: String,
    },

    /// The input ends before the field it promises.
    #[error(
        "truncated {what}: needs {needed} bytes, only {available} available; the connection \
         was probably cut (did the target process exit?) or the peer sent a malformed reply"
    )]
    Truncated {
        what: &'static str,
        needed: usize,
        available: usize,
    },

    /// A header's `size` field is smaller than the header itself.
    #[error(
        "IPC header declares a message of {size} bytes, less than the 20-byte header; the peer \
         sent a malformed message"
    )]
    SizeBelowHeader { size: u16 },

    /// An encoded request would not fit the u16 `size` field of the header.
    #[error(
        "{request} request would be {size} bytes, over the protocol limit of {max}; use fewer \
         or shorter providers, arguments or paths"
    )]
    MessageTooLarge {
        request: &'static str,
        size: usize,
        max: usize,
    },

    /// A string is not valid UTF-16.
    #[error("{what} is not valid UTF-16 (unpaired surrogate); the peer sent a malformed string")]
    InvalidUtf16 { what: &'static str },

    /// A non-empty string does not end with the NUL the protocol requires.
    #[error("{what} is not NUL-terminated; the peer sent a malformed string")]
    MissingNul { what: &'static str },

    /// A header that should be a server reply (command set 0xFF, id 0x00 or 0xFF) is not one.
    #[error(
        "expected a server reply (OK 0xFF/0x00 or error 0xFF/0xFF), got command \
         0x{command_set:02X}/0x{command_id:02X}; the peer is not a .NET runtime, or it is \
         newer than this tool"
    )]
    UnexpectedReply { command_set: u8, command_id: u8 },

    /// A ProcessEnvironment reply announces more bytes than any real environment holds.
    #[error(
        "ProcessEnvironment reply announces {len} bytes of environment, over the {max}-byte \
         limit; refusing to read it (a hostile or broken peer?)"
    )]
    EnvironmentTooLarge { len: u32, max: u32 },

    /// A request has options the runtime would reject or silently misread.
    #[error("invalid {request} request: {reason}")]
    InvalidRequest {
        request: &'static str,
        reason: String,
    },
}
