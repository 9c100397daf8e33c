//! NetTrace V6 (perfview `NetTraceFormat.md`), written by newer tools such as
//! `dotnet-trace collect-linux`; the runtime itself still writes V4/V5 over EventPipe.
//!
//! Differences handled here: a `u32 0, u32 major, u32 minor` header instead of FastSerialization;
//! blocks framed by one `u32` (size in the low 24 bits, kind in the high 8) without alignment;
//! a Trace block with key/value properties; event headers that refer to a Thread table and a
//! LabelList table (activity ids, trace/span ids) instead of carrying thread and activity ids;
//! UTF-8 metadata rows; SequencePoints with cache-flush flags and varint thread entries.

use super::block::EventHeader;
use super::budget::{self, slot, Held, MemoryBudget, Meter};
use super::cursor::{Cursor, ReadFault, ReadResult};
use super::error::NettraceError;
use super::header::TraceInfo;
use super::time::SystemTime;
use profile::guid::Guid;
use std::collections::HashMap;

/// Block kinds of the V6 framing.
pub(crate) mod kind {
    pub const END_OF_STREAM: u8 = 0;
    pub const TRACE: u8 = 1;
    pub const EVENT: u8 = 2;
    pub const METADATA: u8 = 3;
    pub const SEQUENCE_POINT: u8 = 4;
    pub const STACK: u8 = 5;
    pub const THREAD: u8 = 6;
    pub const REMOVE_THREAD: u8 = 7;
    pub const LABEL_LIST: u8 = 8;
}

/// Size of an uncompressed V6 event header, EventSize included.
pub(crate) const UNCOMPRESSED_HEADER_SIZE: usize = 52;

/// Parses the V6 Trace block: SYSTEMTIME, i64 ticks, i64 frequency, i32 pointer size,
/// i32 count and that many (key, value) strings, charged to `budget`.
pub(crate) fn read_trace_block(
    body: &[u8],
    offset: u64,
    budget: &mut MemoryBudget,
) -> Result<TraceInfo, NettraceError> {
    let bad = |f: ReadFault| NettraceError::malformed("Trace", f.offset, f.reason);
    let mut c = Cursor::new(body, offset);
    let mut st = [0u16; 8];
    for v in &mut st {
        *v = c.u16().map_err(bad)?;
    }
    let sync_qpc = c.i64().map_err(bad)?;
    let freq = c.i64().map_err(bad)?;
    let pointer_size = c.i32().map_err(bad)?;
    let count = c.i32().map_err(bad)?;
    let mut meter = budget.meter();
    let properties = string_pairs(&mut c, &mut meter, count.max(0) as u32)
        .map_err(|f| budget.decode_error(&meter, Held::TraceProperties, offset, f, bad))?;
    budget.charge(
        Held::TraceProperties,
        budget::string_pairs(&properties),
        offset,
    )?;
    let prop = |name: &str| {
        properties
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.trim().parse::<u32>().ok())
            .unwrap_or(0)
    };
    let sync_time_utc = SystemTime {
        year: st[0],
        month: st[1],
        day_of_week: st[2],
        day: st[3],
        hour: st[4],
        minute: st[5],
        second: st[6],
        millisecond: st[7],
    };
    let (process_id, cpus, rate) = (
        prop("ProcessId"),
        prop("HardwareThreadCount"),
        prop("ExpectedCPUSamplingRate"),
    );
    TraceInfo::new(
        sync_time_utc,
        sync_qpc,
        freq,
        pointer_size,
        [process_id, cpus, rate],
        properties,
        6,
        offset,
    )
}

mod flags {
    pub const METADATA_ID: u8 = 1 << 0;
    pub const CAPTURE_THREAD_AND_SEQUENCE: u8 = 1 << 1;
    pub const THREAD_INDEX: u8 = 1 << 2;
    pub const STACK_ID: u8 = 1 << 3;
    pub const LABEL_LIST_ID: u8 = 1 << 4;
    pub const SORTED: u8 = 1 << 6;
    pub const DATA_LENGTH: u8 = 1 << 7;
}

/// Decodes a compressed V6 header in place over the previous one (raw indexes only; the
/// caller resolves thread and label references).
#[inline]
pub(crate) fn read_compressed_header(c: &mut Cursor<'_>, h: &mut EventHeader) -> ReadResult<()> {
    let f = c.u8()?;
    if f & flags::METADATA_ID != 0 {
        h.metadata_id = c.var_u32()?;
    }
    if f & flags::CAPTURE_THREAD_AND_SEQUENCE != 0 {
        h.sequence_number = h.sequence_number.wrapping_add(c.var_u32()?);
        h.capture_thread_index = c.var_u64()?;
        h.processor_number = c.var_u32()?;
    }
    // V6 always advances the sequence number by one (no metadata rows in event blocks).
    h.sequence_number = h.sequence_number.wrapping_add(1);
    if f & flags::THREAD_INDEX != 0 {
        h.thread_index = c.var_u64()?;
    }
    if f & flags::STACK_ID != 0 {
        h.stack_id = c.var_u32()?;
    }
    h.timestamp = h.timestamp.wrapping_add(c.var_u64()? as i64);
    if f & flags::LABEL_LIST_ID != 0 {
        h.label_list_id = c.var_u32()?;
    }
    h.is_sorted = f & flags::SORTED != 0;
    if f & flags::DATA_LENGTH != 0 {
        h.payload_size = c.var_u32()?;
    }
    Ok(())
}

/// Decodes an uncompressed V6 header; returns it and the blob length (EventSize + 4).
pub(crate) fn read_uncompressed_header(c: &mut Cursor<'_>) -> ReadResult<(EventHeader, usize)> {
    let start = c.offset();
    let event_size = c.u32()?;
    let raw_metadata = c.u32()?;
    let h = EventHeader {
        metadata_id: raw_metadata & 0x7fff_ffff,
        is_sorted: raw_metadata & 0x8000_0000 == 0,
        sequence_number: c.u32()?,
        thread_index: c.u64()?,
        capture_thread_index: c.u64()?,
        processor_number: c.u32()?,
        stack_id: c.u32()?,
        timestamp: c.i64()?,
        label_list_id: c.u32()?,
        payload_size: c.u32()?,
        ..EventHeader::default()
    };
    let total = (event_size as usize).saturating_add(4);
    if total < UNCOMPRESSED_HEADER_SIZE.saturating_add(h.payload_size as usize) {
        return Err(c.fault_at(
            start,
            format!(
                "EventSize {event_size} is too small for a 52-byte header and a {}-byte payload",
                h.payload_size
            ),
        ));
    }
    Ok((h, total))
}

/// What a V6 Thread block says about one thread.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadInfo {
    /// Index events use to refer to the thread.
    pub index: u64,
    /// Thread name.
    pub name: Option<String>,
    /// OS process id (V6 traces may span processes).
    pub os_process_id: Option<u64>,
    /// OS thread id.
    pub os_thread_id: Option<u64>,
    /// Other attributes.
    pub attributes: Vec<(String, String)>,
}

/// `count` (key, value) strings, paid for from `meter`.
fn string_pairs(
    c: &mut Cursor<'_>,
    meter: &mut Meter,
    count: u32,
) -> ReadResult<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    for _ in 0..count {
        pair(c, meter, &mut pairs)?;
    }
    Ok(pairs)
}

/// One (key, value) string pair pushed onto `pairs`, paid for from `meter`.
fn pair(
    c: &mut Cursor<'_>,
    meter: &mut Meter,
    pairs: &mut Vec<(String, String)>,
) -> ReadResult<()> {
    meter.spend(c, slot::<(String, String)>())?;
    let k = meter.utf8(c)?;
    pairs.push((k, meter.utf8(c)?));
    Ok(())
}

impl ThreadInfo {
    /// Heap bytes held, for the memory budget.
    fn held_bytes(&self) -> usize {
        self.name.as_ref().map_or(0, String::capacity) + budget::string_pairs(&self.attributes)
    }
}

/// Parses one Thread block row: `varuint64 index, (u8 kind, value)*`.
fn read_thread_row(mut row: Cursor<'_>, meter: &mut Meter) -> ReadResult<ThreadInfo> {
    let mut t = ThreadInfo {
        index: row.var_u64()?,
        ..ThreadInfo::default()
    };
    while !row.is_empty() {
        match row.u8()? {
            1 => t.name = Some(meter.utf8(&mut row)?),
            2 => t.os_process_id = Some(row.var_u64()?),
            3 => t.os_thread_id = Some(row.var_u64()?),
            4 => pair(&mut row, meter, &mut t.attributes)?,
            // Unknown entries have no length: the rest of the row is skipped.
            _ => break,
        }
    }
    Ok(t)
}

/// Parses RemoveThread / SequencePoint thread entries: `(varuint64 index, varuint32 seq)*`.
pub(crate) fn read_thread_sequences(
    c: &mut Cursor<'_>,
    count: Option<u32>,
) -> ReadResult<Vec<(u64, u32)>> {
    let mut out = Vec::new();
    match count {
        Some(n) => {
            for _ in 0..n {
                out.push((c.var_u64()?, c.var_u32()?));
            }
        }
        None => {
            while !c.is_empty() {
                out.push((c.var_u64()?, c.var_u32()?));
            }
        }
    }
    Ok(out)
}

/// The labels that apply to an event (V6 LabelList).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelList {
    /// Activity id.
    pub activity_id: Option<Guid>,
    /// Related activity id.
    pub related_activity_id: Option<Guid>,
    /// W3C trace id.
    pub trace_id: Option<[u8; 16]>,
    /// W3C span id.
    pub span_id: Option<u64>,
    /// Opcode override.
    pub opcode: Option<u8>,
    /// Keywords override.
    pub keywords: Option<u64>,
    /// Level override.
    pub level: Option<u8>,
    /// Version override.
    pub version: Option<u8>,
    /// String-valued labels.
    pub strings: Vec<(String, String)>,
    /// Integer-valued labels.
    pub integers: Vec<(String, i64)>,
}

impl LabelList {
    /// Heap bytes held, for the memory budget.
    fn held_bytes(&self) -> usize {
        budget::string_pairs(&self.strings)
            + self.integers.capacity() * std::mem::size_of::<(String, i64)>()
            + self
                .integers
                .iter()
                .map(|(k, _)| k.capacity())
                .sum::<usize>()
    }
}

/// Budget cost of a label list's place in the cache.
const LABEL_LIST_SLOT: usize = slot::<(u32, LabelList)>();

/// Label lists of the current sequence-point region (index 0 = the empty list).
#[derive(Debug, Default)]
pub(crate) struct LabelCache {
    lists: HashMap<u32, LabelList>,
}

impl LabelCache {
    /// Drops the region's lists, and their allocations: the budget no longer counts them.
    pub fn clear(&mut self) {
        self.lists = HashMap::new();
    }

    pub fn get(&self, id: u32) -> Option<&LabelList> {
        self.lists.get(&id)
    }

    /// Adds a LabelList block: `u32 firstIndex, u32 count`, then the lists; the high bit of a
    /// label's kind ends its list. Each list is charged to `budget` before it is stored.
    pub fn add_block(
        &mut self,
        mut c: Cursor<'_>,
        budget: &mut MemoryBudget,
    ) -> Result<(), NettraceError> {
        let bad = |f: ReadFault| NettraceError::malformed("LabelList block", f.offset, f.reason);
        let first = c.u32().map_err(bad)?;
        let count = c.u32().map_err(bad)?;
        for i in 0..count {
            let at = c.offset();
            let mut meter = budget.meter();
            let list = read_label_list(&mut c, &mut meter)
                .map_err(|f| budget.decode_error(&meter, Held::LabelLists, at, f, bad))?;
            budget.charge(Held::LabelLists, list.held_bytes() + LABEL_LIST_SLOT, at)?;
            if let Some(old) = self.lists.insert(first.wrapping_add(i), list) {
                budget.release(Held::LabelLists, old.held_bytes() + LABEL_LIST_SLOT);
            }
        }
        Ok(())
    }
}

/// One label list, its strings paid for from `meter`.
fn read_label_list(c: &mut Cursor<'_>, meter: &mut Meter) -> ReadResult<LabelList> {
    let mut list = LabelList::default();
    loop {
        let k = c.u8()?;
        match k & 0x7f {
            1 => list.activity_id = Some(c.guid()?),
            2 => list.related_activity_id = Some(c.guid()?),
            3 => list.trace_id = Some(c.array()?),
            4 => list.span_id = Some(c.u64()?),
            5 => pair(c, meter, &mut list.strings)?,
            6 => {
                meter.spend(c, slot::<(String, i64)>())?;
                let key = meter.utf8(c)?;
                let v = c.var_u64()?;
                list.integers
                    .push((key, (v >> 1) as i64 ^ -((v & 1) as i64)));
            }
            7 => list.opcode = Some(c.u8()?),
            8 => list.keywords = Some(c.u64()?),
            9 => list.level = Some(c.u8()?),
            10 => list.version = Some(c.u8()?),
            other => return Err(c.fault(format!("unknown label kind {other}"))),
        }
        if k & 0x80 != 0 {
            return Ok(list);
        }
    }
}

/// Thread rows currently in force.
#[derive(Debug, Default)]
pub(crate) struct ThreadTable {
    threads: HashMap<u64, ThreadInfo>,
}

/// Budget cost of a thread's place in the table.
const THREAD_SLOT: usize = slot::<(u64, ThreadInfo)>();

impl ThreadTable {
    /// Adds a Thread block: rows of `u16 size, varuint64 index, (u8 kind, value)*`, each
    /// charged to `budget` before it is stored.
    pub fn add_block(
        &mut self,
        mut c: Cursor<'_>,
        budget: &mut MemoryBudget,
    ) -> Result<(), NettraceError> {
        let bad = |f: ReadFault| NettraceError::malformed("Thread block", f.offset, f.reason);
        while !c.is_empty() {
            let at = c.offset();
            let size = c.u16().map_err(bad)?;
            let row = c.take(usize::from(size)).map_err(bad)?;
            let mut meter = budget.meter();
            let t = read_thread_row(row, &mut meter)
                .map_err(|f| budget.decode_error(&meter, Held::Threads, at, f, bad))?;
            budget.charge(Held::Threads, t.held_bytes() + THREAD_SLOT, at)?;
            if let Some(old) = self.threads.insert(t.index, t) {
                budget.release(Held::Threads, old.held_bytes() + THREAD_SLOT);
            }
        }
        Ok(())
    }

    pub fn remove(&mut self, index: u64, budget: &mut MemoryBudget) {
        if let Some(old) = self.threads.remove(&index) {
            budget.release(Held::Threads, old.held_bytes() + THREAD_SLOT);
        }
    }

    /// Drops every row, and the table's allocation: the budget no longer counts them.
    pub fn clear(&mut self) {
        self.threads = HashMap::new();
    }

    pub fn get(&self, index: u64) -> Option<&ThreadInfo> {
        self.threads.get(&index)
    }

    /// OS thread id for an index, or the index itself when the writer gave none.
    #[inline]
    pub fn os_thread_id(&self, index: u64) -> u64 {
        self.threads
            .get(&index)
            .and_then(|t| t.os_thread_id)
            .unwrap_or(index)
    }
}
