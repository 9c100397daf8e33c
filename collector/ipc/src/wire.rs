//! Primitive little-endian readers and writers of the IPC payload encoding.
//!
//! Every read is bounds-checked and returns [`ProtocolError::Truncated`] instead of panicking;
//! nothing here allocates more than the bytes actually present in the input.

use super::ProtocolError;

/// A cursor over an untrusted byte slice.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// Takes the next `n` bytes, or fails naming `what` without consuming anything.
    pub(crate) fn bytes(
        &mut self,
        n: usize,
        what: &'static str,
    ) -> Result<&'a [u8], ProtocolError> {
        match self.buf.split_at_checked(n) {
            Some((head, tail)) => {
                self.buf = tail;
                Ok(head)
            }
            None => Err(ProtocolError::Truncated {
                what,
                needed: n,
                available: self.buf.len(),
            }),
        }
    }

    pub(crate) fn array<const N: usize>(
        &mut self,
        what: &'static str,
    ) -> Result<[u8; N], ProtocolError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N, what)?);
        Ok(out)
    }

    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, ProtocolError> {
        self.array(what).map(u16::from_le_bytes)
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, ProtocolError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, ProtocolError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Reads a protocol string: u32 count of UTF-16 code units including the terminating NUL,
    /// then the units; a count of 0 is the empty (null) string.
    pub(crate) fn string(&mut self, what: &'static str) -> Result<String, ProtocolError> {
        let count = self.u32(what)?;
        if count == 0 {
            return Ok(String::new());
        }
        // `count` is attacker-controlled: compare it with what is present before using it.
        let needed = (count as usize)
            .checked_mul(2)
            .ok_or(ProtocolError::Truncated {
                what,
                needed: usize::MAX,
                available: self.buf.len(),
            })?;
        let raw = self.bytes(needed, what)?;
        let (text, nul) = raw.split_at(needed - 2);
        if nul != [0, 0] {
            return Err(ProtocolError::MissingNul { what });
        }
        let units = text
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]));
        char::decode_utf16(units)
            .collect::<Result<String, _>>()
            .map_err(|_| ProtocolError::InvalidUtf16 { what })
    }
}

/// Builds a payload in the protocol's little-endian encoding.
#[derive(Default)]
pub(crate) struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    pub(crate) fn into_inner(self) -> Vec<u8> {
        self.buf
    }

    pub(crate) fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    pub(crate) fn bool(&mut self, v: bool) {
        self.buf.push(u8::from(v));
    }

    pub(crate) fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }

    pub(crate) fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }

    /// Writes `s` NUL-terminated (so `""` is count 1 plus a NUL, not count 0).
    ///
    /// Callers validate with [`check_string`] first; the count cannot overflow for anything that
    /// fits a 64 KiB message, and an oversized message is rejected after encoding.
    pub(crate) fn string(&mut self, s: &str) {
        let units: Vec<u16> = s.encode_utf16().chain(std::iter::once(0)).collect();
        self.u32(u32::try_from(units.len()).unwrap_or(u32::MAX));
        for u in units {
            self.bytes(&u.to_le_bytes());
        }
    }

    /// Writes `None` as count 0 (the protocol's null string) and `Some` NUL-terminated.
    pub(crate) fn opt_string(&mut self, s: Option<&str>) {
        match s {
            None => self.u32(0),
            Some(s) => self.string(s),
        }
    }
}

/// Rejects interior NULs: the runtime reads these strings as C strings and would cut them short.
pub(crate) fn check_string(
    request: &'static str,
    field: &str,
    s: &str,
) -> Result<(), ProtocolError> {
    if s.contains('\0') {
        return Err(ProtocolError::InvalidRequest {
            request,
            reason: format!(
                "{field} contains a NUL character, which the runtime would cut the string at"
            ),
        });
    }
    Ok(())
}

/// Renders magic bytes for an error message without trusting them to be text.
pub(crate) fn escape_bytes(b: &[u8]) -> String {
    b.iter()
        .flat_map(|&c| std::ascii::escape_default(c))
        .map(char::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_little_endian_integers() {
        let mut r = Reader::new(&[0x34, 0x12, 0x78, 0x56, 0x34, 0x12, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(r.u16("a").unwrap(), 0x1234);
        assert_eq!(r.u32("b").unwrap(), 0x1234_5678);
        assert_eq!(r.u64("c").unwrap(), 0x0807_0605_0403_0201);
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn truncated_read_names_field_and_consumes_nothing() {
        let mut r = Reader::new(&[1, 2, 3]);
        match r.u32("field") {
            Err(ProtocolError::Truncated {
                what,
                needed,
                available,
            }) => {
                assert_eq!((what, needed, available), ("field", 4, 3));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(r.remaining(), 3);
    }

    #[test]
    fn string_forms() {
        // count 0: the null string
        assert_eq!(Reader::new(&[0, 0, 0, 0]).string("s").unwrap(), "");
        // count 1: just the NUL
        assert_eq!(Reader::new(&[1, 0, 0, 0, 0, 0]).string("s").unwrap(), "");
        // "hé" + NUL: 'h' = 0x0068, 'é' = 0x00E9
        let b = [3, 0, 0, 0, 0x68, 0, 0xE9, 0, 0, 0];
        assert_eq!(Reader::new(&b).string("s").unwrap(), "hé");
        // U+1F600 as a surrogate pair D83D DE00
        let b = [3, 0, 0, 0, 0x3D, 0xD8, 0x00, 0xDE, 0, 0];
        assert_eq!(Reader::new(&b).string("s").unwrap(), "\u{1F600}");
    }

    #[test]
    fn string_errors() {
        // no NUL at the end
        let b = [2, 0, 0, 0, 0x68, 0, 0x69, 0];
        assert!(matches!(
            Reader::new(&b).string("s"),
            Err(ProtocolError::MissingNul { .. })
        ));
        // lone high surrogate
        let b = [2, 0, 0, 0, 0x3D, 0xD8, 0, 0];
        assert!(matches!(
            Reader::new(&b).string("s"),
            Err(ProtocolError::InvalidUtf16 { .. })
        ));
        // count far beyond the input must fail without allocating it
        let b = [0xFF, 0xFF, 0xFF, 0xFF, 0, 0];
        assert!(matches!(
            Reader::new(&b).string("s"),
            Err(ProtocolError::Truncated { .. })
        ));
    }

    #[test]
    fn writer_strings() {
        let mut w = Writer::default();
        w.string("");
        w.opt_string(None);
        w.opt_string(Some("A"));
        assert_eq!(
            w.into_inner(),
            [
                1, 0, 0, 0, 0, 0, // "" = count 1, NUL
                0, 0, 0, 0, // None = count 0
                2, 0, 0, 0, 0x41, 0, 0, 0, // "A" = count 2, 'A', NUL
            ]
        );
    }
}
