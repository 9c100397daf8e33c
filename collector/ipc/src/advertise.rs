//! The runtime instance cookie and the ADVR_V1 message a runtime sends when it dials a
//! `connect` diagnostic port (listen mode for us).

use std::fmt;

use super::wire::{escape_bytes, Reader};
use super::ProtocolError;

/// Size of an ADVR_V1 message: 8 magic + 16 cookie + u64 pid + u16 reserved.
pub const ADVERTISE_LEN: usize = 34;

/// `"ADVR_V1"` and its NUL.
pub const ADVERTISE_MAGIC: &[u8; 8] = b"ADVR_V1\0";

/// The runtime instance cookie: a random GUID per runtime, unique across pid namespaces, so it
/// tells two processes with the same pid in different containers apart.
///
/// Stored as the 16 bytes on the wire (a Windows `GUID` in memory: Data1..Data3 little-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RuntimeCookie(pub [u8; 16]);

impl fmt::Display for RuntimeCookie {
    /// The usual GUID text, as .NET's `Guid.ToString()` prints it, so it matches what other
    /// tools (dotnet-monitor, dotnet-trace) show for the same process.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        let d1 = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let d2 = u16::from_le_bytes([b[4], b[5]]);
        let d3 = u16::from_le_bytes([b[6], b[7]]);
        write!(
            f,
            "{d1:08x}-{d2:04x}-{d3:04x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
            b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]
        )
    }
}

/// What a runtime says first on a connection it opened to us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advertise {
    pub cookie: RuntimeCookie,
    /// The pid in the runtime's own pid namespace.
    pub pid: u64,
}

impl Advertise {
    /// Decodes the first 34 bytes of `bytes`; the trailing reserved u16 is ignored.
    pub fn decode(bytes: &[u8]) -> Result<Advertise, ProtocolError> {
        let seen = &bytes[..bytes.len().min(ADVERTISE_MAGIC.len())];
        if !ADVERTISE_MAGIC.starts_with(seen) {
            return Err(ProtocolError::BadMagic {
                what: "advertise message",
                expected: "ADVR_V1\\0",
                found: escape_bytes(seen),
            });
        }
        if bytes.len() < ADVERTISE_LEN {
            return Err(ProtocolError::Truncated {
                what: "advertise message",
                needed: ADVERTISE_LEN,
                available: bytes.len(),
            });
        }
        let mut r = Reader::new(bytes);
        r.bytes(ADVERTISE_MAGIC.len(), "advertise magic")?;
        let cookie = RuntimeCookie(r.array("advertise runtime cookie")?);
        let pid = r.u64("advertise pid")?;
        r.u16("advertise reserved")?;
        Ok(Advertise { cookie, pid })
    }

    pub fn encode(&self) -> [u8; ADVERTISE_LEN] {
        let mut out = [0u8; ADVERTISE_LEN];
        out[..8].copy_from_slice(ADVERTISE_MAGIC);
        out[8..24].copy_from_slice(&self.cookie.0);
        out[24..32].copy_from_slice(&self.pid.to_le_bytes());
        // out[32..34]: reserved, zero
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ipc-protocol.md, "Advertise Protocol": cookie 123e4567-e89b-12d3-a456-426614174000,
    /// pid 12345.
    const DOC_EXAMPLE: [u8; 34] = [
        b'A', b'D', b'V', b'R', b'_', b'V', b'1', 0x00, // magic "ADVR_V1\0"
        0x67, 0x45, 0x3E, 0x12, // Data1 0x123e4567, little-endian
        0x9B, 0xE8, // Data2 0xe89b
        0xD3, 0x12, // Data3 0x12d3
        0xA4, 0x56, 0x42, 0x66, 0x14, 0x17, 0x40, 0x00, // Data4, as written
        0x39, 0x30, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // pid 12345 = 0x3039
        0x00, 0x00, // reserved
    ];

    #[test]
    fn decodes_doc_example() {
        let a = Advertise::decode(&DOC_EXAMPLE).unwrap();
        assert_eq!(a.pid, 12345);
        assert_eq!(a.cookie.to_string(), "123e4567-e89b-12d3-a456-426614174000");
        assert_eq!(a.encode(), DOC_EXAMPLE);
    }

    #[test]
    fn every_truncation_fails() {
        for n in 0..ADVERTISE_LEN {
            assert!(matches!(
                Advertise::decode(&DOC_EXAMPLE[..n]),
                Err(ProtocolError::Truncated { .. })
            ));
        }
    }

    #[test]
    fn rejects_an_ipc_header() {
        // A runtime never sends an IPC message first; a peer that does is not a runtime.
        let e = Advertise::decode(b"DOTNET_IPC_V1\0\x14\0\xff\0\0\0").unwrap_err();
        assert!(matches!(e, ProtocolError::BadMagic { .. }));
        assert!(e.to_string().contains("DOTNET_"), "{e}");
    }

    #[test]
    fn cookie_display_is_lowercase() {
        let c = RuntimeCookie([0xAB; 16]);
        assert_eq!(c.to_string(), "abababab-abab-abab-abab-abababababab");
    }
}
