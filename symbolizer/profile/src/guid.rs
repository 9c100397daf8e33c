//! GUIDs as they appear in the stream, provider GUIDs derived from provider names, and random
//! GUIDs for the ids the agent hands out (operation ids, key subjects, Pyroscope sample ids).
//!
//! NetTrace metadata carries only provider *names*; exporters and ETW-minded tools want GUIDs.
//! The runtime's native providers have fixed GUIDs from their manifest; every EventSource gets a
//! name-based GUID (RFC 4122 version 5 style, SHA-1 over a fixed namespace plus the upper-cased
//! name in UTF-16 big-endian), computed the same way EventSource itself does.

use sha1::{Digest, Sha1};
use std::fmt;

/// A GUID stored in its Windows in-memory layout (first three fields little-endian).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Guid([u8; 16]);

impl Guid {
    /// The all-zero GUID (no activity, unknown provider).
    pub const NIL: Guid = Guid([0; 16]);

    /// From the 16 bytes as they lie in the stream.
    pub const fn from_bytes_le(bytes: [u8; 16]) -> Self {
        Guid(bytes)
    }

    /// From the textual fields, `{d1-d2-d3-d4[0..2]-d4[2..8]}`.
    pub const fn from_fields(d1: u32, d2: u16, d3: u16, d4: [u8; 8]) -> Self {
        let a = d1.to_le_bytes();
        let b = d2.to_le_bytes();
        let c = d3.to_le_bytes();
        Guid([
            a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d4[0], d4[1], d4[2], d4[3], d4[4],
            d4[5], d4[6], d4[7],
        ])
    }

    /// The bytes in stream (little-endian fields) order.
    pub const fn to_bytes_le(&self) -> [u8; 16] {
        self.0
    }

    /// True for the all-zero GUID.
    pub fn is_nil(&self) -> bool {
        self.0 == [0; 16]
    }

    /// A random (version 4) GUID made of `random`, 16 random bytes; written as .NET's
    /// `Guid.ToString("D")`, lower-case with hyphens.
    pub fn new_v4(random: [u8; 16]) -> Guid {
        let mut g = random;
        // Version 4 in the high nibble of the third field (byte 7 in little-endian layout),
        // variant 10 in the top bits of the fourth.
        g[7] = (g[7] & 0x0f) | 0x40;
        g[8] = (g[8] & 0x3f) | 0x80;
        Guid(g)
    }

    /// The GUID an EventSource named `name` registers under.
    pub fn from_event_source_name(name: &str) -> Guid {
        // The EventSource naming namespace {482C2DB2-C390-47C8-87F8-1A15BFC130FB}, big-endian.
        const NAMESPACE: [u8; 16] = [
            0x48, 0x2c, 0x2d, 0xb2, 0xc3, 0x90, 0x47, 0xc8, 0x87, 0xf8, 0x1a, 0x15, 0xbf, 0xc1,
            0x30, 0xfb,
        ];
        let mut sha = Sha1::new();
        sha.update(NAMESPACE);
        // EventSource upper-cases with invariant culture over UTF-16 code units; Unicode simple
        // upper-casing of each char gives the same result for the names providers use.
        for c in name.chars().flat_map(char::to_uppercase) {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                sha.update(u.to_be_bytes());
            }
        }
        let hash = sha.finalize();
        let mut g = [0u8; 16];
        g.copy_from_slice(&hash[..16]);
        // Version 5 in the high nibble of the third field (byte 7 in little-endian layout).
        g[7] = (g[7] & 0x0f) | 0x50;
        Guid(g)
    }

    /// The provider GUID for a provider name: the manifest GUID of the runtime's native
    /// providers, else the EventSource name-derived GUID.
    pub fn for_provider(name: &str) -> Guid {
        KNOWN_PROVIDERS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, g)| *g)
            .unwrap_or_else(|| Guid::from_event_source_name(name))
    }
}

/// Native (manifest) providers whose GUIDs are not name-derived.
const KNOWN_PROVIDERS: &[(&str, Guid)] = &[
    (
        "Microsoft-DotNETCore-SampleProfiler",
        Guid::from_fields(
            0x3c530d44,
            0x97ae,
            0x513a,
            [0x1e, 0x6d, 0x78, 0x3e, 0x8f, 0x8e, 0x03, 0xa9],
        ),
    ),
    (
        "Microsoft-Windows-DotNETRuntime",
        Guid::from_fields(
            0xe13c0d23,
            0xccbc,
            0x4e12,
            [0x93, 0x1b, 0xd9, 0xcc, 0x2e, 0xee, 0x27, 0xe4],
        ),
    ),
    (
        "Microsoft-Windows-DotNETRuntimeRundown",
        Guid::from_fields(
            0xa669021c,
            0xc450,
            0x4609,
            [0xa0, 0x35, 0x5a, 0xf5, 0x9a, 0xf4, 0xdf, 0x18],
        ),
    ),
    (
        "Microsoft-Windows-DotNETRuntimePrivate",
        Guid::from_fields(
            0x763fd754,
            0x7086,
            0x4dfe,
            [0x95, 0xeb, 0xc0, 0x1a, 0x46, 0xfa, 0xf4, 0xca],
        ),
    ),
    (
        "Microsoft-Windows-DotNETRuntimeStress",
        Guid::from_fields(
            0xcc2bcbba,
            0x16b6,
            0x4cf3,
            [0x89, 0x90, 0xd7, 0x4c, 0x2e, 0x8a, 0xf5, 0x00],
        ),
    ),
    (
        "System.Threading.Tasks.TplEventSource",
        Guid::from_fields(
            0x2e5dba47,
            0xa3d2,
            0x4d16,
            [0x8e, 0xe0, 0x66, 0x71, 0xff, 0xdc, 0xd7, 0xb5],
        ),
    ),
];

impl fmt::Display for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        write!(
            f,
            "{:08x}-{:04x}-{:04x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
            u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            u16::from_le_bytes([b[4], b[5]]),
            u16::from_le_bytes([b[6], b[7]]),
            b[8],
            b[9],
            b[10],
            b[11],
            b[12],
            b[13],
            b[14],
            b[15]
        )
    }
}

impl fmt::Debug for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Guid({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Published GUIDs of well-known EventSources (dotnet-trace / TraceEvent provider lists).
    #[test]
    fn event_source_guids_match_published_ones() {
        for (name, expected) in [
            (
                "Microsoft-Diagnostics-DiagnosticSource",
                "adb401e1-5296-51f8-c125-5fda75826144",
            ),
            ("System.Runtime", "49592c0f-5a05-516d-aa4b-a64e02026c89"),
            (
                "System.Diagnostics.Metrics",
                "20752bc4-c151-50f5-f27b-df92d8af5a61",
            ),
        ] {
            assert_eq!(Guid::for_provider(name).to_string(), expected, "{name}");
        }
        // Case-insensitive, like EventSource.
        assert_eq!(
            Guid::from_event_source_name("system.runtime"),
            Guid::from_event_source_name("System.Runtime")
        );
    }

    #[test]
    fn manifest_providers() {
        // The sampler's GUID is fixed in the runtime (sampleprofiler.cpp), not name-derived.
        assert_eq!(
            Guid::for_provider("Microsoft-DotNETCore-SampleProfiler").to_string(),
            "3c530d44-97ae-513a-1e6d-783e8f8e03a9"
        );
        assert_eq!(
            Guid::for_provider("Microsoft-Windows-DotNETRuntime").to_string(),
            "e13c0d23-ccbc-4e12-931b-d9cc2eee27e4"
        );
        assert_eq!(
            Guid::for_provider("Microsoft-Windows-DotNETRuntimeRundown").to_string(),
            "a669021c-c450-4609-a035-5af59af4df18"
        );
    }

    #[test]
    fn random_guids_have_the_version_4_shape() {
        for random in [[0u8; 16], [0xff; 16]] {
            let id = Guid::new_v4(random).to_string();
            assert_eq!(id.len(), 36);
            assert_eq!(&id[14..15], "4");
            assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"));
        }
        assert_eq!(
            Guid::new_v4([0; 16]).to_string(),
            "00000000-0000-4000-8000-000000000000"
        );
    }
}
