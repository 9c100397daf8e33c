//! A bounds-checked little-endian reader over one slice, which knows the stream offset of its
//! first byte so that every failure can name where in the stream it happened.

use profile::guid::Guid;

/// Why a read failed; turned into a [`NettraceError`](super::NettraceError) by the caller, who
/// knows what object was being read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReadFault {
    /// Stream offset of the first byte that could not be read.
    pub offset: u64,
    /// What was wrong.
    pub reason: String,
}

pub(crate) type ReadResult<T> = Result<T, ReadFault>;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
    base: u64,
}

impl<'a> Cursor<'a> {
    /// `base` is the stream offset of `data[0]`.
    pub fn new(data: &'a [u8], base: u64) -> Self {
        Cursor { data, pos: 0, base }
    }

    pub fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.pos == self.data.len()
    }

    pub fn rest(&self) -> &'a [u8] {
        &self.data[self.pos..]
    }

    pub fn fault_at(&self, offset: u64, reason: impl Into<String>) -> ReadFault {
        ReadFault {
            offset,
            reason: reason.into(),
        }
    }

    pub fn fault(&self, reason: impl Into<String>) -> ReadFault {
        ReadFault {
            offset: self.offset(),
            reason: reason.into(),
        }
    }

    pub fn bytes(&mut self, n: usize) -> ReadResult<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.fault(format!("needs {n} bytes, only {} left", self.remaining())));
        }
        let out = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    /// A sub-cursor over the next `n` bytes, which this cursor then skips.
    pub fn take(&mut self, n: usize) -> ReadResult<Cursor<'a>> {
        let base = self.offset();
        let data = self.bytes(n)?;
        Ok(Cursor::new(data, base))
    }

    pub fn array<const N: usize>(&mut self) -> ReadResult<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    #[inline]
    pub fn u8(&mut self) -> ReadResult<u8> {
        Ok(self.array::<1>()?[0])
    }

    pub fn u16(&mut self) -> ReadResult<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub fn i16(&mut self) -> ReadResult<i16> {
        Ok(i16::from_le_bytes(self.array()?))
    }

    pub fn u32(&mut self) -> ReadResult<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub fn i32(&mut self) -> ReadResult<i32> {
        Ok(i32::from_le_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> ReadResult<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub fn i64(&mut self) -> ReadResult<i64> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    pub fn f32(&mut self) -> ReadResult<f32> {
        Ok(f32::from_le_bytes(self.array()?))
    }

    pub fn f64(&mut self) -> ReadResult<f64> {
        Ok(f64::from_le_bytes(self.array()?))
    }

    pub fn guid(&mut self) -> ReadResult<Guid> {
        Ok(Guid::from_bytes_le(self.array()?))
    }

    /// A pointer-sized value (4 or 8 bytes, as the trace header says).
    pub fn pointer(&mut self, pointer_size: u8) -> ReadResult<u64> {
        if pointer_size == 4 {
            self.u32().map(u64::from)
        } else {
            self.u64()
        }
    }

    /// LEB128, at most 5 bytes, as the runtime writes 32-bit header fields.
    #[inline]
    pub fn var_u32(&mut self) -> ReadResult<u32> {
        match self.one_byte_varint() {
            Some(b) => Ok(u32::from(b)),
            None => self.long_var_u32(),
        }
    }

    /// LEB128, at most 10 bytes.
    #[inline]
    pub fn var_u64(&mut self) -> ReadResult<u64> {
        match self.one_byte_varint() {
            Some(b) => Ok(u64::from(b)),
            None => self.var_u64_limited(10),
        }
    }

    /// The next varint when it takes one byte, as most of an event header's do (deltas, ids,
    /// sizes below 128): read without the loop.
    #[inline]
    fn one_byte_varint(&mut self) -> Option<u8> {
        let b = *self.data.get(self.pos)?;
        if b & 0x80 != 0 {
            return None;
        }
        self.pos += 1;
        Some(b)
    }

    #[inline(never)]
    fn long_var_u32(&mut self) -> ReadResult<u32> {
        let start = self.offset();
        let v = self.var_u64_limited(5)?;
        u32::try_from(v).map_err(|_| ReadFault {
            offset: start,
            reason: format!("varint {v} does not fit in 32 bits"),
        })
    }

    /// `max_bytes` is 10 at most: the tenth byte's bits land at 63 (bits beyond 64 are dropped,
    /// as the reference reader does; only the length is bounded).
    #[inline(never)]
    fn var_u64_limited(&mut self, max_bytes: usize) -> ReadResult<u64> {
        let rest = self.data.get(self.pos..).unwrap_or(&[]);
        let bytes = &rest[..rest.len().min(max_bytes)];
        let mut value: u64 = 0;
        for (i, &b) in bytes.iter().enumerate() {
            value |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                self.pos += i + 1;
                return Ok(value);
            }
        }
        if bytes.len() < max_bytes {
            return Err(ReadFault {
                offset: self.offset() + bytes.len() as u64,
                reason: "varint runs past the end".into(),
            });
        }
        Err(self.fault(format!("varint longer than {max_bytes} bytes")))
    }

    /// A NUL-terminated UTF-16LE string, without the terminator; the raw code units are kept
    /// so that callers decide whether to allocate.
    pub fn utf16z(&mut self) -> ReadResult<Utf16<'a>> {
        let rest = self.rest();
        let mut i = 0;
        while i + 1 < rest.len() {
            if rest[i] == 0 && rest[i + 1] == 0 {
                let s = Utf16(&rest[..i]);
                self.pos += i + 2;
                return Ok(s);
            }
            i += 2;
        }
        Err(self.fault("UTF-16 string has no NUL terminator before the end"))
    }

    /// A V6 string: varuint32 byte length, then UTF-8 (invalid sequences become U+FFFD).
    pub fn utf8(&mut self) -> ReadResult<String> {
        let n = self.var_u32()?;
        let b = self.bytes(n as usize)?;
        Ok(String::from_utf8_lossy(b).into_owned())
    }

    pub fn skip(&mut self, n: usize) -> ReadResult<()> {
        self.bytes(n).map(|_| ())
    }
}

/// Raw UTF-16LE code units of a string in the stream (no terminator).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Utf16<'a>(&'a [u8]);

impl Utf16<'_> {
    /// Number of UTF-16 code units.
    pub fn units(self) -> usize {
        self.0.len() / 2
    }

    /// Decodes, replacing unpaired surrogates with U+FFFD.
    pub fn to_string_lossy(self) -> String {
        // Names of methods, types and counters are nearly always ASCII: one byte per unit,
        // without decoding character by character.
        let mut ascii = Vec::with_capacity(self.units());
        ascii.extend(
            self.0
                .chunks_exact(2)
                .map_while(|c| (c[0] < 0x80 && c[1] == 0).then_some(c[0])),
        );
        if ascii.len() == self.units() {
            if let Ok(text) = String::from_utf8(ascii) {
                return text;
            }
        }
        let units = self
            .0
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]));
        char::decode_utf16(units)
            .map(|r| r.unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints() {
        let mut c = Cursor::new(&[0x7f, 0x80, 0x01, 0xff, 0xff, 0xff, 0xff, 0x0f], 10);
        assert_eq!(c.var_u32().unwrap(), 127);
        assert_eq!(c.var_u32().unwrap(), 128);
        assert_eq!(c.var_u32().unwrap(), u32::MAX);
        assert!(c.is_empty());
        let mut c = Cursor::new(&[0x80, 0x80], 10);
        let e = c.var_u64().unwrap_err();
        assert_eq!(e.offset, 12);
        let mut c = Cursor::new(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x01], 0);
        assert!(c.var_u32().is_err(), "6-byte varint is not a u32");
        let ten = [
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x05,
        ];
        let mut c = Cursor::new(&ten, 0);
        assert_eq!(c.var_u64().unwrap(), u64::MAX, "bits past 64 are dropped");
        assert_eq!(c.var_u64().unwrap(), 5);
        let mut c = Cursor::new(&[0x80; 11], 0);
        let e = c.var_u64().unwrap_err();
        assert!(e.reason.contains("longer than 10"), "{}", e.reason);
        assert_eq!(c.offset(), 0, "a failed read moves nothing");
    }

    #[test]
    fn strings() {
        let mut c = Cursor::new(&[b'h', 0, b'i', 0, 0, 0, 1], 0);
        let s = c.utf16z().unwrap();
        assert_eq!(s.to_string_lossy(), "hi");
        assert_eq!(c.remaining(), 1);
        let mut c = Cursor::new(&[b'h', 0, b'i'], 0);
        assert!(c.utf16z().is_err());
    }

    #[test]
    fn strings_past_ascii_decode_as_utf16() {
        let utf16 =
            |text: &[u16]| -> Vec<u8> { text.iter().flat_map(|u| u.to_le_bytes()).collect() };
        let decoded = |bytes: &[u8]| Utf16(bytes).to_string_lossy();
        assert_eq!(decoded(&utf16(&[0x61, 0xe9, 0x62])), "aéb");
        assert_eq!(decoded(&utf16(&[0x61, 0x100, 0x62])), "aĀb");
        // A byte ≥ 0x80 in an ASCII position is not taken for UTF-8.
        assert_eq!(decoded(&utf16(&[0x61, 0x80])), "a\u{80}");
        assert_eq!(decoded(&utf16(&[0xd83d, 0xde00])), "😀");
        assert_eq!(decoded(&utf16(&[0x61, 0xd800, 0x62])), "a\u{fffd}b");
        assert_eq!(decoded(&[]), "");
    }
}
