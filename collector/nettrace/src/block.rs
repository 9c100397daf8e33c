//! The bodies of the four block objects: event blob headers (compressed and not), the stack
//! cache fed by StackBlocks, and SPBlock sequence points.

use super::budget::{slot, Held, MemoryBudget};
use super::cursor::{Cursor, ReadFault, ReadResult};
use super::error::NettraceError;
use profile::guid::Guid;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Header of one event blob, after decompression.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventHeader {
    /// Which metadata record describes the event (0 inside MetadataBlocks).
    pub metadata_id: u32,
    /// Per-capture-thread counter, used to detect dropped events.
    pub sequence_number: u32,
    /// The thread the event is about (for ThreadSample: the sampled thread). V6: the OS thread
    /// id from the Thread table, or the thread index if the table gives none.
    pub thread_id: u64,
    /// The thread that wrote the event (for ThreadSample: the sampler thread); V6 as above.
    pub capture_thread_id: u64,
    /// Processor the capture thread ran on.
    pub processor_number: u32,
    /// Stack id into the current sequence-point region's stacks; 0 = no stack.
    pub stack_id: u32,
    /// QPC ticks.
    pub timestamp: i64,
    /// Activity id of the writing thread (all zeros for ThreadSample).
    pub activity_id: Guid,
    /// Related (parent) activity id.
    pub related_activity_id: Guid,
    /// Every later event in the stream has a timestamp ≥ this one's.
    pub is_sorted: bool,
    /// Payload length in bytes.
    pub payload_size: u32,
    /// V6: index of `thread_id` in the Thread table (0 in V4/V5).
    pub thread_index: u64,
    /// V6: index of `capture_thread_id` in the Thread table (0 in V4/V5).
    pub capture_thread_index: u64,
    /// V6: label list of the event (0 = none; always 0 in V4/V5).
    pub label_list_id: u32,
}

/// Size of an uncompressed V4 header, EventSize included.
pub(crate) const UNCOMPRESSED_HEADER_SIZE: usize = 80;

mod flags {
    pub const METADATA_ID: u8 = 1 << 0;
    pub const CAPTURE_THREAD_AND_SEQUENCE: u8 = 1 << 1;
    pub const THREAD_ID: u8 = 1 << 2;
    pub const STACK_ID: u8 = 1 << 3;
    pub const ACTIVITY_ID: u8 = 1 << 4;
    pub const RELATED_ACTIVITY_ID: u8 = 1 << 5;
    pub const SORTED: u8 = 1 << 6;
    pub const DATA_LENGTH: u8 = 1 << 7;
}

/// Decodes a compressed header in place: `h` holds the previous event's header of the same
/// block (all zeros at block start) and becomes this event's.
#[inline]
pub(crate) fn read_compressed_header(c: &mut Cursor<'_>, h: &mut EventHeader) -> ReadResult<()> {
    let f = c.u8()?;
    if f & flags::METADATA_ID != 0 {
        h.metadata_id = c.var_u32()?;
    }
    if f & flags::CAPTURE_THREAD_AND_SEQUENCE != 0 {
        // The writer stores `seq - prev - 1` in 32-bit arithmetic; metadata records carry -1.
        h.sequence_number = h.sequence_number.wrapping_add(c.var_u32()?).wrapping_add(1);
        h.capture_thread_id = c.var_u64()?;
        h.processor_number = c.var_u32()?;
    } else if h.metadata_id != 0 {
        h.sequence_number = h.sequence_number.wrapping_add(1);
    }
    if f & flags::THREAD_ID != 0 {
        h.thread_id = c.var_u64()?;
    }
    if f & flags::STACK_ID != 0 {
        h.stack_id = c.var_u32()?;
    }
    h.timestamp = h.timestamp.wrapping_add(c.var_u64()? as i64);
    if f & flags::ACTIVITY_ID != 0 {
        h.activity_id = c.guid()?;
    }
    if f & flags::RELATED_ACTIVITY_ID != 0 {
        h.related_activity_id = c.guid()?;
    }
    h.is_sorted = f & flags::SORTED != 0;
    if f & flags::DATA_LENGTH != 0 {
        h.payload_size = c.var_u32()?;
    }
    Ok(())
}

/// Decodes an uncompressed header; returns it and the byte length of the whole blob
/// (EventSize + 4, which includes the writer's padding to 4 bytes).
pub(crate) fn read_uncompressed_header(c: &mut Cursor<'_>) -> ReadResult<(EventHeader, usize)> {
    let start = c.offset();
    let event_size = c.u32()?;
    let raw_metadata = c.u32()?;
    let h = EventHeader {
        metadata_id: raw_metadata & 0x7fff_ffff,
        // The runtime sets the high bit when the event is *not* sorted.
        is_sorted: raw_metadata & 0x8000_0000 == 0,
        sequence_number: c.u32()?,
        thread_id: c.u64()?,
        capture_thread_id: c.u64()?,
        processor_number: c.u32()?,
        stack_id: c.u32()?,
        timestamp: c.i64()?,
        activity_id: c.guid()?,
        related_activity_id: c.guid()?,
        payload_size: c.u32()?,
        ..EventHeader::default()
    };
    let total = (event_size as usize).saturating_add(4);
    let needed = UNCOMPRESSED_HEADER_SIZE.saturating_add(h.payload_size as usize);
    if total < needed {
        return Err(ReadFault {
            offset: start,
            reason: format!(
                "EventSize {event_size} is too small for an 80-byte header and a {}-byte payload",
                h.payload_size
            ),
        });
    }
    Ok((h, total))
}

/// Parses the EventBlock/MetadataBlock header; returns whether headers are compressed.
pub(crate) fn read_event_block_header(c: &mut Cursor<'_>) -> ReadResult<bool> {
    let at = c.offset();
    let header_size = c.u16()?;
    if header_size < 20 {
        return Err(ReadFault {
            offset: at,
            reason: format!("block header size {header_size} is below the minimum of 20"),
        });
    }
    let flags = c.u16()?;
    // Min/max timestamps and any future header fields: not needed to read the events.
    c.skip(usize::from(header_size) - 4)?;
    Ok(flags & 1 != 0)
}

/// Stacks of the current sequence-point region, copied out of StackBlocks.
///
/// Ids restart after every sequence point, so the cache is cleared there. Ids within a region are
/// handed out consecutively, so they index a vector; anything else goes to a map.
#[derive(Debug)]
pub(crate) struct StackCache {
    bytes: Vec<u8>,
    base_id: u32,
    ranges: Vec<(u32, u32)>,
    scattered: HashMap<u32, (u32, u32)>,
    count: u64,
    /// This cache among all of the program's (see [`StackIdentity`]).
    instance: u64,
    /// Changes whenever an id may come to name other frames: at a sequence point, and when a
    /// stream defines an id a second time.
    generation: u64,
}

/// Names one stack of one stream for as long as the same id names the same frames: two events
/// with equal identities have equal stacks, so a consumer can remember what it made of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StackIdentity {
    instance: u64,
    generation: u64,
    id: u32,
}

impl StackIdentity {
    /// The stream's stack id: dense from the region's first, so fit to index a small table.
    pub fn id(&self) -> u32 {
        self.id
    }
}

impl Default for StackCache {
    fn default() -> Self {
        static INSTANCES: AtomicU64 = AtomicU64::new(0);
        StackCache {
            bytes: Vec::new(),
            base_id: 0,
            ranges: Vec::new(),
            scattered: HashMap::new(),
            count: 0,
            instance: INSTANCES.fetch_add(1, Ordering::Relaxed),
            generation: 0,
        }
    }
}

impl StackCache {
    /// Drops the region's stacks, and their allocations: the budget no longer counts them.
    pub fn clear(&mut self) {
        self.bytes = Vec::new();
        self.ranges = Vec::new();
        self.scattered = HashMap::new();
        self.base_id = 0;
        self.generation += 1;
    }

    /// The identity of stack `id` as it is now defined.
    #[inline]
    pub fn identity(&self, id: u32) -> StackIdentity {
        StackIdentity {
            instance: self.instance,
            generation: self.generation,
            id,
        }
    }

    /// Stacks added since the parser started.
    pub fn total_stacks(&self) -> u64 {
        self.count
    }

    /// Adds a StackBlock body: `u32 firstId, u32 count`, then `count × (u32 size, size bytes)`;
    /// each stack is charged to `budget` before it is copied.
    pub fn add_block(
        &mut self,
        mut c: Cursor<'_>,
        pointer_size: u8,
        budget: &mut MemoryBudget,
    ) -> Result<(), NettraceError> {
        /// A stack's place: its range in the vector or the map.
        const STACK_SLOT: usize = slot::<(u32, (u32, u32))>();
        let bad = |f: ReadFault| NettraceError::malformed("StackBlock", f.offset, f.reason);
        let first_id = c.u32().map_err(bad)?;
        let count = c.u32().map_err(bad)?;
        let mut id = first_id;
        for _ in 0..count {
            let at = c.offset();
            let size = c.u32().map_err(bad)?;
            let ips = c.bytes(size as usize).map_err(bad)?;
            if size % u32::from(pointer_size) != 0 {
                return Err(bad(ReadFault {
                    offset: at,
                    reason: format!(
                        "stack {id} is {size} bytes, not a multiple of the pointer size {pointer_size}"
                    ),
                }));
            }
            // Twice the bytes: the vector they are copied into grows by doubling.
            budget.charge(Held::Stacks, 2 * ips.len() + STACK_SLOT, at)?;
            let start = u32::try_from(self.bytes.len()).map_err(|_| {
                bad(ReadFault {
                    offset: at,
                    reason: "stack cache above 4 GiB".into(),
                })
            })?;
            self.bytes.extend_from_slice(ips);
            let range = (start, size);
            if self.ranges.is_empty() && self.scattered.is_empty() {
                self.base_id = id;
            }
            if self.scattered.is_empty()
                && id.wrapping_sub(self.base_id) as usize == self.ranges.len()
            {
                self.ranges.push(range);
            } else if self.scattered.insert(id, range).is_some() {
                self.generation += 1;
            }
            id = id.wrapping_add(1);
            self.count += 1;
        }
        if !c.is_empty() {
            return Err(bad(c.fault(format!(
                "{} bytes left after the {count} stacks the header announced",
                c.remaining()
            ))));
        }
        Ok(())
    }

    /// The raw IP bytes of stack `id`, if a StackBlock of this region defined it.
    #[inline]
    pub fn get(&self, id: u32) -> Option<&[u8]> {
        let idx = id.wrapping_sub(self.base_id) as usize;
        let (start, len) = match self.ranges.get(idx) {
            Some(r) => *r,
            None => *self.scattered.get(&id)?,
        };
        self.bytes
            .get(start as usize..start as usize + len as usize)
    }
}

/// Parses an SPBlock body: `i64 timestamp, u32 count, count × (u64 thread, u32 seq)`, and
/// returns the `(capture thread id, last sequence number)` pairs. The timestamp (a sort barrier)
/// is not needed: events are delivered in stream order.
pub(crate) fn read_sequence_point(mut c: Cursor<'_>) -> ReadResult<Vec<(u64, u32)>> {
    c.skip(8)?;
    let count = c.u32()?;
    if count as usize > c.remaining() / 12 {
        return Err(c.fault(format!(
            "{count} threads announced but only {} bytes follow",
            c.remaining()
        )));
    }
    let mut threads = Vec::with_capacity(count as usize);
    for _ in 0..count {
        threads.push((c.u64()?, c.u32()?));
    }
    Ok(threads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compressed_header_rules() {
        // flags: metadata id + capture/seq + thread + stack + sorted + payload size
        let bytes = [
            0b1100_1111, // flags
            0x05,        // metadata id 5
            0x00,        // seq delta 0 -> prev(0) + 0 + 1 = 1
            0x2a,        // capture thread 42
            0x03,        // proc 3
            0x2b,        // thread 43
            0x07,        // stack 7
            0x90,
            0x03, // timestamp delta 400
            0x04, // payload size 4
        ];
        let mut h = EventHeader::default();
        let mut c = Cursor::new(&bytes, 0);
        read_compressed_header(&mut c, &mut h).unwrap();
        assert!(c.is_empty());
        assert_eq!(
            (
                h.metadata_id,
                h.sequence_number,
                h.capture_thread_id,
                h.processor_number
            ),
            (5, 1, 42, 3)
        );
        assert_eq!(
            (h.thread_id, h.stack_id, h.timestamp, h.payload_size),
            (43, 7, 400, 4)
        );
        assert!(h.is_sorted);
        // Next event: only a timestamp delta; the sequence number still advances by one.
        let mut c = Cursor::new(&[0x00, 0x0a], 0);
        read_compressed_header(&mut c, &mut h).unwrap();
        assert_eq!(
            (h.sequence_number, h.timestamp, h.is_sorted),
            (2, 410, false)
        );
        // Metadata record (id 0) as the runtime writes it: seq delta 0xFFFFFFFF wraps to 0.
        let mut m = EventHeader::default();
        let mut c = Cursor::new(&[0x02, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x00, 0x00, 0x00], 0);
        read_compressed_header(&mut c, &mut m).unwrap();
        assert_eq!(m.sequence_number, 0);
    }

    #[test]
    fn stack_cache_consecutive_and_scattered() {
        let mut body = Vec::new();
        body.extend(1u32.to_le_bytes());
        body.extend(2u32.to_le_bytes());
        body.extend(8u32.to_le_bytes());
        body.extend(0x1111u64.to_le_bytes());
        body.extend(0u32.to_le_bytes()); // empty stack
        let mut s = StackCache::default();
        let mut budget = MemoryBudget::new(1 << 20);
        s.add_block(Cursor::new(&body, 0), 8, &mut budget).unwrap();
        assert_eq!(s.get(1).unwrap(), 0x1111u64.to_le_bytes());
        assert_eq!(s.get(2).unwrap(), b"");
        assert!(s.get(3).is_none());
        assert!(s.get(0).is_none());
        let mut body = Vec::new();
        body.extend(10u32.to_le_bytes());
        body.extend(1u32.to_le_bytes());
        body.extend(4u32.to_le_bytes());
        body.extend(0x2222u32.to_le_bytes());
        s.add_block(Cursor::new(&body, 0), 4, &mut budget).unwrap();
        assert_eq!(s.get(10).unwrap(), 0x2222u32.to_le_bytes());
        s.clear();
        assert!(s.get(1).is_none());
        // Count larger than the body: an error, not an allocation.
        let mut body = Vec::new();
        body.extend(1u32.to_le_bytes());
        body.extend(u32::MAX.to_le_bytes());
        assert!(s.add_block(Cursor::new(&body, 0), 8, &mut budget).is_err());
    }

    #[test]
    fn a_stack_identity_changes_when_its_id_may_name_other_frames() {
        let block = |first: u32, ip: u32| {
            let mut body = Vec::new();
            body.extend(first.to_le_bytes());
            body.extend(1u32.to_le_bytes());
            body.extend(4u32.to_le_bytes());
            body.extend(ip.to_le_bytes());
            body
        };
        let mut budget = MemoryBudget::new(1 << 20);
        let mut s = StackCache::default();
        s.add_block(Cursor::new(&block(1, 0x10), 0), 4, &mut budget)
            .unwrap();
        let first = s.identity(1);
        s.add_block(Cursor::new(&block(2, 0x20), 0), 4, &mut budget)
            .unwrap();
        assert_eq!(
            s.identity(1),
            first,
            "a new id leaves the others as they were"
        );
        // Ids restart after a sequence point.
        s.clear();
        s.add_block(Cursor::new(&block(1, 0x30), 0), 4, &mut budget)
            .unwrap();
        let after_clear = s.identity(1);
        assert_ne!(after_clear, first);
        // A hostile stream defines an id again.
        s.add_block(Cursor::new(&block(9, 0x40), 0), 4, &mut budget)
            .unwrap();
        let nine = s.identity(9);
        s.add_block(Cursor::new(&block(9, 0x50), 0), 4, &mut budget)
            .unwrap();
        assert_eq!(s.get(9).unwrap(), 0x50u32.to_le_bytes());
        assert_ne!(s.identity(9), nine);
        // Another stream's cache never shares an identity.
        assert_ne!(
            StackCache::default().identity(1),
            StackCache::default().identity(1)
        );
    }

    #[test]
    fn sequence_point_count_is_bounded_by_body() {
        let mut body = Vec::new();
        body.extend(5i64.to_le_bytes());
        body.extend(1_000_000u32.to_le_bytes());
        assert!(read_sequence_point(Cursor::new(&body, 0)).is_err());
    }
}
