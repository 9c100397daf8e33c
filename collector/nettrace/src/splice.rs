//! A NetTrace V4/V5 stream as its raw objects, without decoding events, and a writer that frames
//! such objects into a new, valid stream: what keeping and re-cutting a session's recent blocks
//! needs (a pre-trigger ring buffer).
//!
//! A block's body is aligned to 4 bytes *of the stream offset*, so a block moved to another
//! offset is re-padded by [`ObjectWriter`]; bodies themselves are copied unchanged. Event and
//! sequence-point blocks carry their QPC time range, which [`RawObject::time_range`] reads from
//! the block header.

use std::io::{self, Write};

use super::error::NettraceError;
use super::header::{TraceInfo, TRACE_OBJECT_SIZE};
pub use super::reader::ObjectKind;

const MAGIC: &[u8; 8] = b"Nettrace";
const SERIALIZATION_MAGIC: &[u8; 20] = b"!FastSerialization.1";
const TAG_NULL_REFERENCE: u8 = 1;
const TAG_BEGIN_PRIVATE_OBJECT: u8 = 5;
const TAG_END_OBJECT: u8 = 6;
/// Stream header: magic, i32 20, "!FastSerialization.1".
const STREAM_HEADER_LEN: usize = 8 + 4 + 20;

/// One object: its kind, type versions and body (a block's body without size and padding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawObject {
    pub kind: ObjectKind,
    pub version: i32,
    pub min_reader_version: i32,
    pub body: Vec<u8>,
}

impl RawObject {
    /// An event or sequence-point block's QPC time range (`min, max`); `None` for other kinds
    /// or a body too short to say.
    pub fn time_range(&self) -> Option<(i64, i64)> {
        let b = &self.body;
        let i64_at = |i: usize| Some(i64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?));
        match self.kind {
            // i16 header size, i16 flags, i64 min, i64 max
            ObjectKind::EventBlock => Some((i64_at(4)?, i64_at(12)?)),
            ObjectKind::SequencePointBlock => i64_at(0).map(|t| (t, t)),
            _ => None,
        }
    }

    /// The Trace object's fields (clock, pointer size, pid), if this is it.
    pub fn trace_info(&self) -> Option<TraceInfo> {
        (self.kind == ObjectKind::Trace)
            .then(|| TraceInfo::parse(&self.body, 0).ok())
            .flatten()
    }

    /// Bytes it takes in memory (for budgets).
    pub fn size(&self) -> usize {
        self.body.len() + std::mem::size_of::<RawObject>()
    }
}

/// Cuts a V4/V5 stream, fed in any chunking, into [`RawObject`]s. Memory: the unconsumed input
/// (at most one object plus a chunk), objects of at most `max_object` bytes.
#[derive(Debug)]
pub struct ObjectSplitter {
    buf: Vec<u8>,
    /// Stream offset of `buf[0]`.
    base: u64,
    /// Offset into `buf` of the next unread byte.
    at: usize,
    header_read: bool,
    finished: bool,
    max_object: usize,
}

impl ObjectSplitter {
    /// `max_object`: the largest block body accepted (the runtime writes ~100 KB blocks).
    pub fn new(max_object: usize) -> Self {
        ObjectSplitter {
            buf: Vec::new(),
            base: 0,
            at: 0,
            header_read: false,
            finished: false,
            max_object,
        }
    }

    /// True once the end-of-stream tag was read.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    pub fn feed(&mut self, data: &[u8]) {
        if self.finished {
            return;
        }
        if self.at > 0 && self.at >= self.buf.len() / 2 {
            self.buf.drain(..self.at);
            self.base += self.at as u64;
            self.at = 0;
        }
        self.buf.extend_from_slice(data);
    }

    fn malformed(&self, at: usize, reason: impl Into<String>) -> NettraceError {
        NettraceError::malformed("stream", self.base + at as u64, reason)
    }

    /// The next whole object, `None` when more input is needed or the stream ended.
    pub fn next_object(&mut self) -> Result<Option<RawObject>, NettraceError> {
        if self.finished {
            return Ok(None);
        }
        let a = &self.buf[self.at..];
        if !self.header_read {
            if a.len() < STREAM_HEADER_LEN {
                return Ok(None);
            }
            if &a[..8] != MAGIC
                || a[8..12] != 20u32.to_le_bytes()
                || &a[12..32] != SERIALIZATION_MAGIC
            {
                return Err(self.malformed(
                    self.at,
                    "not a NetTrace V4/V5 stream (magic and FastSerialization header)",
                ));
            }
            self.header_read = true;
            self.at += STREAM_HEADER_LEN;
            return self.next_object();
        }
        let Some(&tag) = a.first() else {
            return Ok(None);
        };
        if tag == TAG_NULL_REFERENCE {
            self.finished = true;
            self.at += 1;
            return Ok(None);
        }
        // 5 5 1 i32 version i32 minReader i32 nameLen name 6
        if a.len() < 15 {
            return Ok(None);
        }
        if a[..3]
            != [
                TAG_BEGIN_PRIVATE_OBJECT,
                TAG_BEGIN_PRIVATE_OBJECT,
                TAG_NULL_REFERENCE,
            ]
        {
            return Err(self.malformed(self.at, "expected an object header (5 5 1)"));
        }
        let le = |i: usize| i32::from_le_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]]);
        let (version, min_reader_version, name_len) = (le(3), le(7), le(11));
        let name_len = usize::try_from(name_len)
            .ok()
            .filter(|n| *n <= 64)
            .ok_or_else(|| self.malformed(self.at + 11, "bad object type name length"))?;
        let header_len = 15 + name_len + 1;
        if a.len() < header_len {
            return Ok(None);
        }
        let kind = ObjectKind::from_name(&a[15..15 + name_len])
            .filter(|_| a[header_len - 1] == TAG_END_OBJECT)
            .ok_or_else(|| self.malformed(self.at, "unknown object type"))?;
        let body_at = self.at + header_len;
        let (body_start, body_len) = if kind == ObjectKind::Trace {
            (body_at, TRACE_OBJECT_SIZE)
        } else {
            let Some(size) = self.buf.get(body_at..body_at + 4) else {
                return Ok(None);
            };
            let size = u32::from_le_bytes([size[0], size[1], size[2], size[3]]) as usize;
            if size > self.max_object {
                return Err(self.malformed(
                    body_at,
                    format!("block of {size} bytes is larger than {}", self.max_object),
                ));
            }
            let after_size = self.base + body_at as u64 + 4;
            let padding = ((4 - after_size % 4) % 4) as usize;
            (body_at + 4 + padding, size)
        };
        let end = body_start + body_len;
        let Some(&end_tag) = self.buf.get(end) else {
            return Ok(None);
        };
        if end_tag != TAG_END_OBJECT {
            return Err(self.malformed(end, "expected EndObject (6) after the object"));
        }
        let object = RawObject {
            kind,
            version,
            min_reader_version,
            body: self.buf[body_start..end].to_vec(),
        };
        self.at = end + 1;
        Ok(Some(object))
    }
}

/// Writes objects as a NetTrace V4/V5 stream: the header on creation, each object framed (and
/// its block re-padded) at the current offset, the end tag on [`finish`](Self::finish).
#[derive(Debug)]
pub struct ObjectWriter<W: Write> {
    out: W,
    offset: u64,
}

impl<W: Write> ObjectWriter<W> {
    pub fn new(mut out: W) -> io::Result<Self> {
        out.write_all(MAGIC)?;
        out.write_all(&20u32.to_le_bytes())?;
        out.write_all(SERIALIZATION_MAGIC)?;
        Ok(ObjectWriter {
            out,
            offset: STREAM_HEADER_LEN as u64,
        })
    }

    /// Bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.offset
    }

    /// The output, e.g. to move a buffer's bytes on (offsets keep counting).
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.out
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.offset += bytes.len() as u64;
        Ok(())
    }

    pub fn write(&mut self, object: &RawObject) -> io::Result<()> {
        let name = object.kind.name().as_bytes();
        let mut header = vec![
            TAG_BEGIN_PRIVATE_OBJECT,
            TAG_BEGIN_PRIVATE_OBJECT,
            TAG_NULL_REFERENCE,
        ];
        header.extend(object.version.to_le_bytes());
        header.extend(object.min_reader_version.to_le_bytes());
        header.extend((name.len() as i32).to_le_bytes());
        header.extend(name);
        header.push(TAG_END_OBJECT);
        self.put(&header)?;
        if object.kind != ObjectKind::Trace {
            self.put(&(object.body.len() as u32).to_le_bytes())?;
            let padding = ((4 - self.offset % 4) % 4) as usize;
            self.put(&[0u8; 3][..padding])?;
        }
        self.put(&object.body)?;
        self.put(&[TAG_END_OBJECT])
    }

    /// Writes the end-of-stream tag and returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.put(&[TAG_NULL_REFERENCE])?;
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{EventSpec, MetadataRecord, StreamBuilder};
    use crate::Parser;

    fn sample_stream() -> Vec<u8> {
        let meta = MetadataRecord::new(1, "P", 1, "E");
        StreamBuilder::new(8)
            .metadata_block(&[meta.encode()], true)
            .stack_block(1, &[&[0x10, 0x20]])
            .event_block(
                &[
                    EventSpec::new(1, 1, 7, 2000, vec![1, 2, 3]).stack(1),
                    EventSpec::new(1, 2, 7, 3000, vec![4]),
                ],
                true,
            )
            .sequence_point(3500, &[(7, 2)])
            .event_block(&[EventSpec::new(1, 3, 7, 4000, vec![5])], true)
            .finish()
    }

    fn events(stream: &[u8]) -> Vec<(i64, Vec<u8>, usize)> {
        let mut p = Parser::new();
        p.feed(stream).unwrap();
        let mut out = Vec::new();
        while let Some(e) = p.next_event().unwrap() {
            out.push((
                e.header.timestamp,
                e.payload.to_vec(),
                e.stack().map_or(0, |s| s.len()),
            ));
        }
        p.finish().unwrap();
        out
    }

    #[test]
    fn split_and_rewritten_at_new_offsets_stays_valid() {
        let stream = sample_stream();
        let mut splitter = ObjectSplitter::new(1 << 20);
        let mut objects = Vec::new();
        for chunk in stream.chunks(7) {
            splitter.feed(chunk);
            while let Some(o) = splitter.next_object().unwrap() {
                objects.push(o);
            }
        }
        assert!(splitter.is_finished());
        let kinds: Vec<ObjectKind> = objects.iter().map(|o| o.kind).collect();
        use ObjectKind::*;
        assert_eq!(
            kinds,
            [
                Trace,
                MetadataBlock,
                StackBlock,
                EventBlock,
                SequencePointBlock,
                EventBlock
            ]
        );
        assert_eq!(objects[3].time_range(), Some((2000, 3000)));
        assert_eq!(objects[4].time_range(), Some((3500, 3500)));
        assert_eq!(objects[0].trace_info().unwrap().process_id, 4242);

        // Same objects, rewritten: identical events.
        let mut w = ObjectWriter::new(Vec::new()).unwrap();
        for o in &objects {
            w.write(o).unwrap();
        }
        let rewritten = w.finish().unwrap();
        assert_eq!(events(&rewritten), events(&stream));

        // Without the first event block (so every later block moves): still valid.
        let mut w = ObjectWriter::new(Vec::new()).unwrap();
        for (i, o) in objects.iter().enumerate() {
            if i != 3 {
                w.write(o).unwrap();
            }
        }
        let cut = w.finish().unwrap();
        assert_eq!(events(&cut), [(4000, vec![5], 0)]);
    }

    #[test]
    fn damage_is_an_error() {
        let mut stream = sample_stream();
        stream[33] = 9;
        let mut s = ObjectSplitter::new(1 << 20);
        s.feed(&stream);
        let mut result = Ok(None);
        for _ in 0..10 {
            result = s.next_object();
            if !matches!(result, Ok(Some(_))) {
                break;
            }
        }
        assert!(result.is_err(), "{result:?}");
        let mut s = ObjectSplitter::new(1 << 20);
        s.feed(b"Nettrace\0\0\0\0\x06\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0");
        assert!(s.next_object().is_err(), "V6 is refused");
    }
}
