//! The 20-byte header that starts every IPC message, in both directions.

use super::wire::{escape_bytes, Reader};
use super::ProtocolError;

/// Size of the header: 14 magic + u16 size + u8 set + u8 id + u16 reserved.
pub const HEADER_LEN: usize = 20;

/// `"DOTNET_IPC_V1"` and its NUL.
pub const IPC_MAGIC: &[u8; 14] = b"DOTNET_IPC_V1\0";

/// Largest message the u16 `size` field can describe, header included.
pub const MAX_MESSAGE_LEN: usize = u16::MAX as usize;

/// Command sets (the first byte of a command).
pub mod command_set {
    pub const DUMP: u8 = 0x01;
    pub const EVENTPIPE: u8 = 0x02;
    pub const PROFILER: u8 = 0x03;
    pub const PROCESS: u8 = 0x04;
    /// Replies from the runtime.
    pub const SERVER: u8 = 0xFF;
}

/// Command ids of the server set: the two kinds of reply.
pub mod server_id {
    pub const OK: u8 = 0x00;
    pub const ERROR: u8 = 0xFF;
}

/// An IPC message header. `size` counts the header itself plus the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub size: u16,
    pub command_set: u8,
    pub command_id: u8,
}

/// What a reply header says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyKind {
    /// The command succeeded; the payload is command-specific.
    Ok,
    /// The command failed; decode the payload with [`decode_error`](super::decode_error).
    Error,
}

impl Header {
    /// Header of a message carrying `payload_len` bytes, or an error if it cannot fit a message.
    pub(crate) fn for_payload(
        request: &'static str,
        (command_set, command_id): (u8, u8),
        payload_len: usize,
    ) -> Result<Header, ProtocolError> {
        let size = HEADER_LEN.saturating_add(payload_len);
        let size = u16::try_from(size).map_err(|_| ProtocolError::MessageTooLarge {
            request,
            size,
            max: MAX_MESSAGE_LEN,
        })?;
        Ok(Header {
            size,
            command_set,
            command_id,
        })
    }

    /// Decodes the first 20 bytes of `bytes`; the reserved field is ignored.
    pub fn decode(bytes: &[u8]) -> Result<Header, ProtocolError> {
        // Check what magic there is first: a short reply from a peer that is not a runtime at
        // all should say "bad magic", not "truncated".
        let seen = &bytes[..bytes.len().min(IPC_MAGIC.len())];
        if !IPC_MAGIC.starts_with(seen) {
            return Err(ProtocolError::BadMagic {
                what: "IPC header",
                expected: "DOTNET_IPC_V1\\0",
                found: escape_bytes(seen),
            });
        }
        if bytes.len() < HEADER_LEN {
            return Err(ProtocolError::Truncated {
                what: "IPC header",
                needed: HEADER_LEN,
                available: bytes.len(),
            });
        }
        let mut r = Reader::new(bytes);
        r.bytes(IPC_MAGIC.len(), "IPC header magic")?;
        let size = r.u16("IPC header size")?;
        let command_set = r.array::<1>("IPC header command set")?[0];
        let command_id = r.array::<1>("IPC header command id")?[0];
        r.u16("IPC header reserved")?;
        if usize::from(size) < HEADER_LEN {
            return Err(ProtocolError::SizeBelowHeader { size });
        }
        Ok(Header {
            size,
            command_set,
            command_id,
        })
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[..14].copy_from_slice(IPC_MAGIC);
        out[14..16].copy_from_slice(&self.size.to_le_bytes());
        out[16] = self.command_set;
        out[17] = self.command_id;
        // out[18..20]: reserved, zero
        out
    }

    /// Bytes of payload that follow the header (0 for a nonsensical `size` below 20).
    pub fn payload_len(&self) -> usize {
        usize::from(self.size).saturating_sub(HEADER_LEN)
    }

    pub fn is_error(&self) -> bool {
        (self.command_set, self.command_id) == (command_set::SERVER, server_id::ERROR)
    }

    pub fn is_ok(&self) -> bool {
        (self.command_set, self.command_id) == (command_set::SERVER, server_id::OK)
    }

    /// Classifies a reply, rejecting headers that are not a server reply at all.
    pub fn reply_kind(&self) -> Result<ReplyKind, ProtocolError> {
        if self.is_ok() {
            Ok(ReplyKind::Ok)
        } else if self.is_error() {
            Ok(ReplyKind::Error)
        } else {
            Err(ProtocolError::UnexpectedReply {
                command_set: self.command_set,
                command_id: self.command_id,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ipc-protocol.md, "Messages": the generic OK message with an empty payload.
    const GENERIC_OK: [u8; 20] = [
        b'D', b'O', b'T', b'N', b'E', b'T', b'_', b'I', b'P', b'C', b'_', b'V', b'1',
        0x00, // magic
        0x14, 0x00, // size = 20
        0xFF, // command_set = Server
        0x00, // command_id = OK
        0x00, 0x00, // reserved
    ];

    #[test]
    fn decodes_generic_ok_from_the_doc() {
        let h = Header::decode(&GENERIC_OK).unwrap();
        assert_eq!(
            h,
            Header {
                size: 20,
                command_set: 0xFF,
                command_id: 0x00
            }
        );
        assert!(h.is_ok());
        assert!(!h.is_error());
        assert_eq!(h.payload_len(), 0);
        assert_eq!(h.reply_kind().unwrap(), ReplyKind::Ok);
        assert_eq!(h.encode(), GENERIC_OK);
    }

    /// ipc-protocol.md, "Errors": the header of the BAD_ENCODING error reply. The doc's table
    /// says size 28 with an 8-byte error code, but the runtime (`ds_ipc_message_send_error`)
    /// sends an i32, so real error replies have size 24; the header decodes either way.
    #[test]
    fn decodes_error_header() {
        let bytes = [
            b'D', b'O', b'T', b'N', b'E', b'T', b'_', b'I', b'P', b'C', b'_', b'V', b'1',
            0x00, // magic
            0x18, 0x00, // size = 24
            0xFF, 0xFF, // Server / Error
            0x00, 0x00, // reserved
        ];
        let h = Header::decode(&bytes).unwrap();
        assert!(h.is_error());
        assert_eq!(h.payload_len(), 4);
        assert_eq!(h.reply_kind().unwrap(), ReplyKind::Error);
    }

    #[test]
    fn rejects_bad_magic_short_input_and_small_size() {
        let mut bad = GENERIC_OK;
        bad[0] = b'X';
        assert!(matches!(
            Header::decode(&bad),
            Err(ProtocolError::BadMagic { .. })
        ));
        for n in 0..HEADER_LEN {
            assert!(matches!(
                Header::decode(&GENERIC_OK[..n]),
                Err(ProtocolError::Truncated { .. })
            ));
        }
        let mut small = GENERIC_OK;
        small[14] = 19;
        assert!(matches!(
            Header::decode(&small),
            Err(ProtocolError::SizeBelowHeader { size: 19 })
        ));
    }

    #[test]
    fn reply_kind_rejects_requests() {
        let h = Header {
            size: 20,
            command_set: command_set::PROCESS,
            command_id: 0x00,
        };
        assert!(matches!(
            h.reply_kind(),
            Err(ProtocolError::UnexpectedReply {
                command_set: 0x04,
                command_id: 0x00
            })
        ));
        assert_eq!(Header { size: 3, ..h }.payload_len(), 0);
    }
}
