//! The incremental parser: bytes in (any chunking), events out as soon as their block is whole.
//!
//! Framing (format V4/V5): `"Nettrace"`, `i32 20 "!FastSerialization.1"`, then objects, each
//! `BeginPrivateObject(5) [type: 5 NullReference(1) i32 version, i32 minReaderVersion, i32 len,
//! name, EndObject(6)] body EndObject(6)`, then `NullReference(1)` at the end. Block bodies are
//! `i32 size`, zero padding to a 4-byte stream offset, and `size` bytes. Format V6 (see
//! [`v6`](super::v6)) replaces all of this with `u32 0, u32 6, u32 minor` and blocks framed by one
//! `u32` (kind in the high byte, size in the low 24 bits); the version is told apart by the
//! `u32` after the magic (20 or 0).
//!
//! Memory: the parser keeps the unconsumed input (at most one block plus whatever one `feed`
//! call brought), and charges everything it decodes and keeps (metadata records, the stacks of
//! the current sequence-point region, V6 threads and label lists, trace properties) to one
//! memory budget, item by item before storing it ([`ParserOptions`]). Events borrow their
//! payload from the input buffer.
//!
//! Events come out in stream order. The runtime sorts only per capture thread; a consumer that
//! needs global time order sorts between sequence points (every event between two of them has a
//! timestamp between theirs) or uses `EventHeader::is_sorted` as a streaming watermark.

use super::block::{
    read_compressed_header, read_event_block_header, read_sequence_point, read_uncompressed_header,
    EventHeader, StackCache, UNCOMPRESSED_HEADER_SIZE,
};
use super::budget::{self, Held, MemoryBudget, Meter};
use super::cursor::{Cursor, ReadFault};
use super::error::NettraceError;
use super::event::{Event, StagedEvent};
use super::header::{TraceInfo, TRACE_OBJECT_SIZE};
use super::metadata::{parse_metadata, parse_metadata_v6, EventMetadata};
use super::sequence::DropTracker;
use super::time::Clock;
use super::v6::{self, LabelCache, ThreadTable};
use profile::budget::SharedBudget;
use std::collections::HashMap;

const MAGIC: &[u8; 8] = b"Nettrace";
/// The input buffer is shrunk back once it is twice as large as what it holds and this.
const IDLE_INPUT_CAPACITY: usize = 4 << 10;
const SERIALIZATION_MAGIC: &[u8; 20] = b"!FastSerialization.1";
const TAG_NULL_REFERENCE: u8 = 1;
const TAG_BEGIN_PRIVATE_OBJECT: u8 = 5;
const TAG_END_OBJECT: u8 = 6;
/// Longest object type name we accept ("MetadataBlock" is the longest known).
const MAX_TYPE_NAME: usize = 64;
/// Budget cost of a metadata record's place: its vector slot and its index entry.
const METADATA_SLOT: usize = budget::slot::<EventMetadata>() + budget::slot::<(u32, usize)>();

/// Decodes one metadata record (V4 "record" or V6 "row", at stream offset `at`) with `parse`,
/// paying as it goes from `budget`, and charges the record to it.
fn decode_metadata(
    budget: &mut MemoryBudget,
    parse: fn(Cursor<'_>, &mut Meter) -> Result<EventMetadata, ReadFault>,
    body: Cursor<'_>,
    (object, what, at): (&'static str, &'static str, u64),
) -> Result<EventMetadata, NettraceError> {
    let mut meter = budget.meter();
    let m = parse(body, &mut meter).map_err(|f| {
        budget.decode_error(&meter, Held::Metadata, at, f, |f| {
            NettraceError::malformed(
                object,
                f.offset,
                format!("{} ({what} at offset {at})", f.reason),
            )
        })
    })?;
    budget.charge(Held::Metadata, m.held_bytes() + METADATA_SLOT, at)?;
    Ok(m)
}

/// Limits that keep memory bounded whatever the input says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParserOptions {
    /// Largest block body accepted. The runtime writes blocks of about 100 KiB
    /// (`ep_event_block_alloc(100*1024)` in `ep-block.c`); the default leaves ten times that.
    pub max_block_size: usize,
    /// Most bytes of decoded state the parser holds at once: metadata records, the stacks of the
    /// current sequence-point region, V6 threads and label lists, trace properties and the
    /// per-thread sequence numbers. Every item is charged before it is stored; a stream that
    /// needs more fails with [`NettraceError::OverBudget`]. The input buffer (one block plus
    /// one fed chunk) comes on top.
    pub memory_budget: usize,
    /// A budget this parser shares with others (an agent's parsers of every process's
    /// sessions): its decoded state and its input buffer are charged there too, and a stream
    /// that does not fit fails with [`NettraceError::OverSharedBudget`].
    pub shared_budget: Option<SharedBudget>,
}

impl ParserOptions {
    /// The default [`memory_budget`](ParserOptions::memory_budget). Genuine sessions hold far
    /// less (100 KB for an 8 MB trace of a busy web service, BENCHMARKS.md "Hostile input:
    /// nettrace budget"): stacks are released at every sequence point, which the runtime writes
    /// after every 10 MB of buffers (`sequence_point_alloc_budget` in `ep-session.c`).
    pub const DEFAULT_MEMORY_BUDGET: usize = 32 << 20;

    /// The defaults with another memory budget.
    pub fn with_memory_budget(memory_budget: usize) -> Self {
        ParserOptions {
            memory_budget,
            ..ParserOptions::default()
        }
    }
}

impl Default for ParserOptions {
    fn default() -> Self {
        ParserOptions {
            max_block_size: 1 << 20,
            memory_budget: Self::DEFAULT_MEMORY_BUDGET,
            shared_budget: None,
        }
    }
}

/// Counters of what the parser has seen so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParserStats {
    /// Bytes of the stream fully parsed (offset of the next unparsed object).
    pub bytes_parsed: u64,
    /// MetadataBlock objects.
    pub metadata_blocks: u64,
    /// EventBlock objects.
    pub event_blocks: u64,
    /// StackBlock objects.
    pub stack_blocks: u64,
    /// SPBlock objects.
    pub sequence_points: u64,
    /// Events delivered.
    pub events: u64,
    /// Stacks read from StackBlocks.
    pub stacks: u64,
    /// Metadata records read.
    pub metadata_records: u64,
    /// Smallest event timestamp (QPC) seen, or `i64::MAX` before the first event.
    pub min_timestamp: i64,
    /// Largest event timestamp (QPC) seen, or `i64::MIN` before the first event.
    pub max_timestamp: i64,
    /// Most bytes of decoded state held at once, against
    /// [`ParserOptions::memory_budget`].
    pub peak_memory: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Magic,
    SerializationHeader,
    /// V4/V5: FastSerialization objects.
    Objects,
    /// V6: size/kind-framed blocks.
    Blocks,
    End,
}

/// The kinds of V4/V5 objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    Trace,
    EventBlock,
    MetadataBlock,
    StackBlock,
    SequencePointBlock,
}

impl ObjectKind {
    /// The type name the stream gives it.
    pub fn name(self) -> &'static str {
        match self {
            ObjectKind::Trace => "Trace",
            ObjectKind::EventBlock => "EventBlock",
            ObjectKind::MetadataBlock => "MetadataBlock",
            ObjectKind::StackBlock => "StackBlock",
            ObjectKind::SequencePointBlock => "SPBlock",
        }
    }

    pub(crate) fn from_name(name: &[u8]) -> Option<Self> {
        Some(match name {
            b"Trace" => ObjectKind::Trace,
            b"EventBlock" => ObjectKind::EventBlock,
            b"MetadataBlock" => ObjectKind::MetadataBlock,
            b"StackBlock" => ObjectKind::StackBlock,
            b"SPBlock" => ObjectKind::SequencePointBlock,
            _ => return None,
        })
    }
}

/// What the parser waits for, to explain a truncation if the input ends here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    /// A fixed-size header: `needed` bytes from `offset`.
    Bytes {
        object: &'static str,
        offset: u64,
        needed: u64,
    },
    /// A block whose size is known.
    Block {
        object: &'static str,
        offset: u64,
        body_start: u64,
        body_size: u64,
    },
}

/// Iteration state inside one EventBlock.
#[derive(Debug, Clone, Copy)]
struct EventBlockCursor {
    pos: u64,
    end: u64,
    after: u64,
    compressed: bool,
    v6: bool,
}

enum Step {
    Continue,
    NeedMore(Pending),
}

/// Push-style NetTrace parser. Feed it bytes with [`feed`](Parser::feed) and take events with
/// [`next_event`](Parser::next_event) until it returns `None`; at the end of input call
/// [`finish`](Parser::finish) to learn whether the stream was complete.
#[derive(Debug)]
pub struct Parser {
    opts: ParserOptions,
    buf: Vec<u8>,
    /// Stream offset of `buf[0]`.
    buf_base: u64,
    /// Stream offset of the next unparsed byte (object granularity).
    pos: u64,
    state: State,
    trace: Option<TraceInfo>,
    clock: Clock,
    pointer_size: u8,
    metadata: Vec<EventMetadata>,
    metadata_index: HashMap<u32, usize>,
    last_metadata: Option<(u32, usize)>,
    stacks: StackCache,
    threads: ThreadTable,
    labels: LabelCache,
    drops: DropTracker,
    budget: MemoryBudget,
    block: Option<EventBlockCursor>,
    /// Header of the current event; also the delta base for the next compressed header.
    header: EventHeader,
    pending: Option<Pending>,
    stats: ParserStats,
    failed: Option<(u64, String)>,
}

impl Default for Parser {
    fn default() -> Self {
        Parser::new()
    }
}

impl Parser {
    /// A parser with default limits.
    pub fn new() -> Self {
        Parser::with_options(ParserOptions::default())
    }

    /// A parser with the given limits.
    pub fn with_options(opts: ParserOptions) -> Self {
        Parser {
            buf: Vec::new(),
            buf_base: 0,
            pos: 0,
            state: State::Magic,
            trace: None,
            clock: Clock::new(0, 0, 1_000_000_000),
            pointer_size: 8,
            metadata: Vec::new(),
            metadata_index: HashMap::new(),
            last_metadata: None,
            stacks: StackCache::default(),
            threads: ThreadTable::default(),
            labels: LabelCache::default(),
            drops: DropTracker::default(),
            budget: MemoryBudget::new(opts.memory_budget).sharing(opts.shared_budget.clone()),
            opts,
            block: None,
            header: EventHeader::default(),
            pending: None,
            stats: ParserStats {
                min_timestamp: i64::MAX,
                max_timestamp: i64::MIN,
                ..ParserStats::default()
            },
            failed: None,
        }
    }

    /// Appends input. Already-consumed input is discarded first, so memory stays at about one
    /// block plus the chunk. Call [`next_event`](Parser::next_event) until `None` after each feed.
    /// Input after the end-of-stream marker is ignored.
    pub fn feed(&mut self, data: &[u8]) -> Result<(), NettraceError> {
        self.check_failed()?;
        if self.is_finished() {
            // Nothing follows the end-of-stream marker; trailing bytes are not kept.
            return Ok(());
        }
        let keep_from = self.block.map_or(self.pos, |b| b.pos);
        let drop = usize::try_from(keep_from - self.buf_base).unwrap_or(usize::MAX);
        if drop > 0 && drop >= self.buf.len() / 2 {
            let drop = drop.min(self.buf.len());
            self.buf.drain(..drop);
            self.buf_base += drop as u64;
        }
        let needed = self.buf.len() + data.len();
        if self.buf.capacity() > needed.max(IDLE_INPUT_CAPACITY) * 2 {
            // A burst (startup, a rundown) grew the buffer; a long-lived session mostly brings a
            // few events at a time, and a node agent holds one such buffer per session.
            self.buf.shrink_to(needed.max(IDLE_INPUT_CAPACITY));
        }
        self.buf.reserve(data.len());
        let end = self.buf_base + needed as u64;
        if let Err(error) = self.budget.set_input(self.buf.capacity(), end) {
            // Nothing more is taken in: the stream stops here.
            self.failed = Some((end, error.to_string()));
            return Err(error);
        }
        self.buf.extend_from_slice(data);
        Ok(())
    }

    /// The next complete event, or `None` when more input is needed (or the stream ended).
    pub fn next_event(&mut self) -> Result<Option<Event<'_>>, NettraceError> {
        match self.advance()? {
            Some(st) => Ok(Some(self.make_event(st))),
            None => Ok(None),
        }
    }

    /// Declares the end of input: `Ok` if the stream ended with its end-of-stream tag, else an
    /// error saying what was cut off. Call it once `next_event` has returned `None`.
    pub fn finish(&self) -> Result<(), NettraceError> {
        self.check_failed()?;
        if self.state == State::End {
            return Ok(());
        }
        if self.block.is_some() {
            return Err(NettraceError::malformed(
                "stream",
                self.pos,
                "finish() called before next_event() returned None: events are still unread",
            ));
        }
        let available = self.buf_base + self.buf.len() as u64;
        match self.pending {
            Some(Pending::Block {
                object,
                offset,
                body_start,
                body_size,
            }) => Err(NettraceError::Truncated {
                object,
                offset,
                detail: format!(
                    "header says {body_size} bytes, stream ended after {}",
                    available.saturating_sub(body_start).min(body_size)
                ),
            }),
            Some(Pending::Bytes {
                object,
                offset,
                needed,
            }) => Err(NettraceError::Truncated {
                object,
                offset,
                detail: format!(
                    "needs {needed} bytes, stream ended after {}",
                    available.saturating_sub(offset)
                ),
            }),
            None => Err(NettraceError::Truncated {
                object: "stream",
                offset: self.pos,
                detail: "ended without the end-of-stream tag".into(),
            }),
        }
    }

    /// True once the end-of-stream tag has been read.
    pub fn is_finished(&self) -> bool {
        self.state == State::End && self.block.is_none()
    }

    /// The Trace object, once read.
    pub fn trace(&self) -> Option<&TraceInfo> {
        self.trace.as_ref()
    }

    /// All metadata records read so far, in stream order.
    pub fn metadata(&self) -> &[EventMetadata] {
        &self.metadata
    }

    /// The metadata record with this id.
    pub fn metadata_by_id(&self, id: u32) -> Option<&EventMetadata> {
        self.metadata_index.get(&id).map(|&i| &self.metadata[i])
    }

    /// Events the runtime dropped so far, from sequence-number gaps.
    pub fn dropped_events(&self) -> u64 {
        self.drops.total()
    }

    /// `(capture thread id, dropped events)` for every thread that dropped events.
    pub fn dropped_events_by_thread(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.drops.by_thread()
    }

    /// Counters of blocks, events and bytes seen.
    pub fn stats(&self) -> ParserStats {
        ParserStats {
            bytes_parsed: self.pos,
            stacks: self.stacks.total_stacks(),
            peak_memory: self.budget.peak() as u64,
            ..self.stats
        }
    }

    /// Total bytes fed so far.
    pub fn bytes_fed(&self) -> u64 {
        self.buf_base + self.buf.len() as u64
    }

    fn check_failed(&self) -> Result<(), NettraceError> {
        match &self.failed {
            Some((offset, reason)) => Err(NettraceError::Stopped {
                offset: *offset,
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Runs the state machine up to the next event; the event is returned as offsets so that
    /// the caller can borrow the buffer afterwards.
    pub(crate) fn advance(&mut self) -> Result<Option<StagedEvent>, NettraceError> {
        self.check_failed()?;
        match self.advance_inner() {
            Ok(ev) => Ok(ev),
            Err(e) => {
                self.failed = Some((e.offset().unwrap_or(self.pos), e.to_string()));
                Err(e)
            }
        }
    }

    pub(crate) fn make_event(&self, st: StagedEvent) -> Event<'_> {
        let start = (st.payload_offset - self.buf_base) as usize;
        Event {
            header: &self.header,
            metadata: &self.metadata[st.metadata_index],
            payload: &self.buf[start..start + self.header.payload_size as usize],
            offset: st.offset,
            payload_offset: st.payload_offset,
            stacks: &self.stacks,
            threads: &self.threads,
            labels: &self.labels,
            clock: &self.clock,
            pointer_size: self.pointer_size,
        }
    }

    fn advance_inner(&mut self) -> Result<Option<StagedEvent>, NettraceError> {
        loop {
            if let Some(b) = &self.block {
                if b.pos < b.end {
                    return self.next_in_block().map(Some);
                }
                self.pos = b.after;
                self.block = None;
            }
            let step = match self.state {
                State::Magic => self.read_magic()?,
                State::SerializationHeader => self.read_serialization_header()?,
                State::Objects => self.read_object()?,
                State::Blocks => self.read_v6_block()?,
                State::End => return Ok(None),
            };
            match step {
                Step::Continue => self.pending = None,
                Step::NeedMore(p) => {
                    self.pending = Some(p);
                    return Ok(None);
                }
            }
        }
    }

    /// Unparsed bytes from stream offset `at`.
    #[inline]
    fn avail(&self, at: u64) -> &[u8] {
        let i = at
            .checked_sub(self.buf_base)
            .and_then(|d| usize::try_from(d).ok())
            .unwrap_or(usize::MAX);
        self.buf.get(i..).unwrap_or(&[])
    }

    fn read_magic(&mut self) -> Result<Step, NettraceError> {
        let a = self.avail(0);
        let n = a.len().min(MAGIC.len());
        if a[..n] != MAGIC[..n] {
            return Err(NettraceError::BadMagic {
                found: a[..n].to_vec(),
            });
        }
        if n < MAGIC.len() {
            return Ok(Step::NeedMore(Pending::Bytes {
                object: "stream header",
                offset: 0,
                needed: 8,
            }));
        }
        self.pos = 8;
        self.state = State::SerializationHeader;
        Ok(Step::Continue)
    }

    /// After the magic: `i32 20 "!FastSerialization.1"` (V4/V5) or `u32 0, u32 major,
    /// u32 minor` (V6).
    fn read_serialization_header(&mut self) -> Result<Step, NettraceError> {
        let a = self.avail(self.pos);
        if a.len() < 4 {
            return Ok(Step::NeedMore(Pending::Bytes {
                object: "stream header",
                offset: self.pos,
                needed: 4,
            }));
        }
        let len = u32::from_le_bytes([a[0], a[1], a[2], a[3]]);
        if len == 0 {
            if a.len() < 12 {
                return Ok(Step::NeedMore(Pending::Bytes {
                    object: "stream header",
                    offset: self.pos,
                    needed: 12,
                }));
            }
            let major = u32::from_le_bytes([a[4], a[5], a[6], a[7]]);
            if major != 6 {
                return Err(NettraceError::UnsupportedFormat {
                    offset: self.pos + 4,
                    detail: format!(
                        "NetTrace major version {major}; this parser reads V4/V5 and V6"
                    ),
                });
            }
            // Minor versions are compatible by definition.
            self.pos += 12;
            self.state = State::Blocks;
            return Ok(Step::Continue);
        }
        if len as usize != SERIALIZATION_MAGIC.len() {
            return Err(self.unsupported_serialization(len));
        }
        if a.len() < 24 {
            return Ok(Step::NeedMore(Pending::Bytes {
                object: "stream header",
                offset: self.pos,
                needed: 24,
            }));
        }
        if &a[4..24] != SERIALIZATION_MAGIC {
            return Err(self.unsupported_serialization(20));
        }
        self.pos += 24;
        self.state = State::Objects;
        Ok(Step::Continue)
    }

    fn unsupported_serialization(&self, len: u32) -> NettraceError {
        NettraceError::UnsupportedFormat {
            offset: self.pos,
            detail: format!(
                "expected the FastSerialization header (i32 20, \"!FastSerialization.1\") or a V6 version header (u32 0), found {len}"
            ),
        }
    }

    /// One V6 block: `u32 (kind << 24 | size)` then `size` bytes.
    fn read_v6_block(&mut self) -> Result<Step, NettraceError> {
        let start = self.pos;
        let a = self.avail(start);
        if a.len() < 4 {
            return Ok(Step::NeedMore(Pending::Bytes {
                object: "block header",
                offset: start,
                needed: 4,
            }));
        }
        let word = u32::from_le_bytes([a[0], a[1], a[2], a[3]]);
        let (kind, size) = ((word >> 24) as u8, u64::from(word & 0x00ff_ffff));
        let object = match kind {
            v6::kind::END_OF_STREAM => "EndOfStream block",
            v6::kind::TRACE => "Trace",
            v6::kind::EVENT => "EventBlock",
            v6::kind::METADATA => "MetadataBlock",
            v6::kind::SEQUENCE_POINT => "SequencePoint block",
            v6::kind::STACK => "StackBlock",
            v6::kind::THREAD => "Thread block",
            v6::kind::REMOVE_THREAD => "RemoveThread block",
            v6::kind::LABEL_LIST => "LabelList block",
            _ => "unknown block",
        };
        if size > self.opts.max_block_size as u64 {
            return Err(NettraceError::BlockTooLarge {
                object,
                offset: start,
                size,
                limit: self.opts.max_block_size as u64,
            });
        }
        let body_start = start + 4;
        let body_end = body_start + size;
        if (a.len() as u64) < 4 + size {
            return Ok(Step::NeedMore(Pending::Block {
                object,
                offset: start,
                body_start,
                body_size: size,
            }));
        }
        if kind == v6::kind::END_OF_STREAM {
            self.pos = body_end;
            self.state = State::End;
            return Ok(Step::Continue);
        }
        if kind != v6::kind::TRACE && self.trace.is_none() {
            return Err(NettraceError::malformed(
                object,
                start,
                "block before the Trace block",
            ));
        }
        let i0 = (body_start - self.buf_base) as usize;
        let i1 = (body_end - self.buf_base) as usize;
        let bad = |f: ReadFault| NettraceError::malformed(object, f.offset, f.reason);
        match kind {
            v6::kind::TRACE => {
                if self.trace.is_some() {
                    return Err(NettraceError::malformed(
                        object,
                        start,
                        "a second Trace block",
                    ));
                }
                let info = v6::read_trace_block(&self.buf[i0..i1], body_start, &mut self.budget)?;
                self.clock = info.clock;
                self.pointer_size = info.pointer_size;
                self.trace = Some(info);
            }
            v6::kind::EVENT => {
                let mut c = Cursor::new(&self.buf[i0..i1], body_start);
                let compressed = read_event_block_header(&mut c).map_err(bad)?;
                self.stats.event_blocks += 1;
                self.block = Some(EventBlockCursor {
                    pos: c.offset(),
                    end: body_end,
                    after: body_end,
                    compressed,
                    v6: true,
                });
                self.header = EventHeader::default();
                return Ok(Step::Continue);
            }
            v6::kind::METADATA => {
                self.stats.metadata_blocks += 1;
                let mut c = Cursor::new(&self.buf[i0..i1], body_start);
                let header_size = c.u16().map_err(bad)?;
                c.skip(usize::from(header_size)).map_err(bad)?;
                let mut rows = Vec::new();
                while !c.is_empty() {
                    let row_at = c.offset();
                    let size = c.u16().map_err(bad)?;
                    let row = c.take(usize::from(size)).map_err(bad)?;
                    rows.push(decode_metadata(
                        &mut self.budget,
                        parse_metadata_v6,
                        row,
                        ("metadata row", "row", row_at),
                    )?);
                }
                for m in rows {
                    self.add_metadata(m);
                }
            }
            v6::kind::SEQUENCE_POINT => {
                self.stats.sequence_points += 1;
                let mut c = Cursor::new(&self.buf[i0..i1], body_start);
                c.skip(8).map_err(bad)?;
                let flags = c.u32().map_err(bad)?;
                let count = c.u32().map_err(bad)?;
                let threads = v6::read_thread_sequences(&mut c, Some(count)).map_err(bad)?;
                self.on_sequence_point(&threads, start)?;
                self.stacks.clear();
                self.labels.clear();
                self.budget.release_all(Held::Stacks);
                self.budget.release_all(Held::LabelLists);
                if flags & 1 != 0 {
                    self.threads.clear();
                    self.budget.release_all(Held::Threads);
                }
                if flags & 2 != 0 {
                    self.metadata = Vec::new();
                    self.metadata_index = HashMap::new();
                    self.last_metadata = None;
                    self.budget.release_all(Held::Metadata);
                }
            }
            v6::kind::STACK => {
                self.stats.stack_blocks += 1;
                let c = Cursor::new(&self.buf[i0..i1], body_start);
                self.stacks
                    .add_block(c, self.pointer_size, &mut self.budget)?;
            }
            v6::kind::THREAD => {
                let c = Cursor::new(&self.buf[i0..i1], body_start);
                self.threads.add_block(c, &mut self.budget)?;
            }
            v6::kind::REMOVE_THREAD => {
                let mut c = Cursor::new(&self.buf[i0..i1], body_start);
                for (thread, seq) in v6::read_thread_sequences(&mut c, None).map_err(bad)? {
                    self.drops.on_sequence_point(thread, seq);
                    self.threads.remove(thread, &mut self.budget);
                }
            }
            v6::kind::LABEL_LIST => {
                let c = Cursor::new(&self.buf[i0..i1], body_start);
                self.labels.add_block(c, &mut self.budget)?;
            }
            // Unknown kinds are skippable by design (added in minor versions).
            _ => {}
        }
        self.pos = body_end;
        Ok(Step::Continue)
    }

    fn read_object(&mut self) -> Result<Step, NettraceError> {
        let start = self.pos;
        let a = self.avail(start);
        let Some(&tag) = a.first() else {
            return Ok(Step::NeedMore(Pending::Bytes {
                object: "object",
                offset: start,
                needed: 1,
            }));
        };
        if tag == TAG_NULL_REFERENCE {
            self.pos += 1;
            self.state = State::End;
            return Ok(Step::Continue);
        }
        if tag != TAG_BEGIN_PRIVATE_OBJECT {
            return Err(NettraceError::UnexpectedTag {
                offset: start,
                expected: "BeginPrivateObject (5) or the end-of-stream NullReference (1)",
                found: tag,
            });
        }
        // Type header: 5 5 1 i32 version i32 minReaderVersion i32 nameLen name 6
        const FIXED: usize = 15;
        let need_header = |needed: usize| {
            Ok(Step::NeedMore(Pending::Bytes {
                object: "object header",
                offset: start,
                needed: needed as u64,
            }))
        };
        for (i, (want, what)) in [
            (
                TAG_BEGIN_PRIVATE_OBJECT,
                "BeginPrivateObject (5) of the type",
            ),
            (TAG_NULL_REFERENCE, "NullReference (1) as the type's type"),
        ]
        .into_iter()
        .enumerate()
        {
            match a.get(1 + i) {
                Some(&b) if b != want => {
                    return Err(NettraceError::UnexpectedTag {
                        offset: start + 1 + i as u64,
                        expected: what,
                        found: b,
                    })
                }
                Some(_) => {}
                None => return need_header(FIXED),
            }
        }
        if a.len() < FIXED {
            return need_header(FIXED);
        }
        let le = |i: usize| i32::from_le_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]]);
        let (version, min_reader, name_len) = (le(3), le(7), le(11));
        let name_len = match usize::try_from(name_len) {
            Ok(n) if n <= MAX_TYPE_NAME => n,
            _ => {
                return Err(NettraceError::malformed(
                    "object header",
                    start + 11,
                    format!("type name length {name_len} is not in 0..={MAX_TYPE_NAME}"),
                ))
            }
        };
        let header_len = FIXED + name_len + 1;
        if a.len() < header_len {
            return need_header(header_len);
        }
        let name = &a[FIXED..FIXED + name_len];
        if a[header_len - 1] != TAG_END_OBJECT {
            return Err(NettraceError::UnexpectedTag {
                offset: start + header_len as u64 - 1,
                expected: "EndObject (6) after the type name",
                found: a[header_len - 1],
            });
        }
        let Some(kind) = ObjectKind::from_name(name) else {
            return Err(NettraceError::UnknownObject {
                offset: start,
                name: String::from_utf8_lossy(name).into_owned(),
            });
        };
        let body_at = start + header_len as u64;
        if kind == ObjectKind::Trace {
            return self.read_trace_object(start, body_at, version, min_reader);
        }
        if self.trace.is_none() {
            return Err(NettraceError::malformed(
                kind.name(),
                start,
                "block before the Trace object",
            ));
        }
        if min_reader > 2 {
            return Err(NettraceError::UnsupportedVersion {
                object: kind.name(),
                offset: start,
                version,
                min_reader_version: min_reader,
                supported: 2,
            });
        }
        let a = self.avail(body_at);
        if a.len() < 4 {
            return Ok(Step::NeedMore(Pending::Bytes {
                object: kind.name(),
                offset: start,
                needed: header_len as u64 + 4,
            }));
        }
        let size = u32::from_le_bytes([a[0], a[1], a[2], a[3]]);
        if size as usize > self.opts.max_block_size {
            return Err(NettraceError::BlockTooLarge {
                object: kind.name(),
                offset: start,
                size: u64::from(size),
                limit: self.opts.max_block_size as u64,
            });
        }
        let after_size = body_at + 4;
        // Padding aligns the body to a 4-byte offset from the start of the stream.
        let body_start = after_size + ((4 - after_size % 4) % 4);
        let body_end = body_start + u64::from(size);
        let pending = Pending::Block {
            object: kind.name(),
            offset: start,
            body_start,
            body_size: u64::from(size),
        };
        let a = self.avail(body_end);
        let Some(&end_tag) = a.first() else {
            return Ok(Step::NeedMore(pending));
        };
        if end_tag != TAG_END_OBJECT {
            return Err(NettraceError::UnexpectedTag {
                offset: body_end,
                expected: "EndObject (6) after the block (the block size is wrong or the block is damaged)",
                found: end_tag,
            });
        }
        self.read_block(kind, start, body_start, body_end)?;
        Ok(Step::Continue)
    }

    fn read_trace_object(
        &mut self,
        start: u64,
        body_at: u64,
        version: i32,
        min_reader: i32,
    ) -> Result<Step, NettraceError> {
        if self.trace.is_some() {
            return Err(NettraceError::malformed(
                "Trace",
                start,
                "a second Trace object",
            ));
        }
        if version < 4 {
            return Err(NettraceError::UnsupportedFormat {
                offset: start,
                detail: format!(
                    "Trace object version {version} is the old NetPerf format (.NET Core 2.x); NetTrace is version 4"
                ),
            });
        }
        if min_reader > 4 {
            return Err(NettraceError::UnsupportedVersion {
                object: "Trace",
                offset: start,
                version,
                min_reader_version: min_reader,
                supported: 4,
            });
        }
        let a = self.avail(body_at);
        if a.len() < TRACE_OBJECT_SIZE + 1 {
            return Ok(Step::NeedMore(Pending::Bytes {
                object: "Trace",
                offset: start,
                needed: body_at - start + TRACE_OBJECT_SIZE as u64 + 1,
            }));
        }
        if a[TRACE_OBJECT_SIZE] != TAG_END_OBJECT {
            return Err(NettraceError::UnexpectedTag {
                offset: body_at + TRACE_OBJECT_SIZE as u64,
                expected: "EndObject (6) after the Trace fields",
                found: a[TRACE_OBJECT_SIZE],
            });
        }
        let info = TraceInfo::parse(&a[..TRACE_OBJECT_SIZE], body_at)?;
        self.clock = info.clock;
        self.pointer_size = info.pointer_size;
        self.trace = Some(info);
        self.pos = body_at + TRACE_OBJECT_SIZE as u64 + 1;
        Ok(Step::Continue)
    }

    fn read_block(
        &mut self,
        kind: ObjectKind,
        start: u64,
        body_start: u64,
        body_end: u64,
    ) -> Result<(), NettraceError> {
        let object = kind.name();
        let bad = |f: ReadFault| NettraceError::malformed(object, f.offset, f.reason);
        let i0 = (body_start - self.buf_base) as usize;
        let i1 = (body_end - self.buf_base) as usize;
        let after = body_end + 1;
        match kind {
            ObjectKind::EventBlock => {
                let mut c = Cursor::new(&self.buf[i0..i1], body_start);
                let compressed = read_event_block_header(&mut c).map_err(bad)?;
                self.stats.event_blocks += 1;
                self.block = Some(EventBlockCursor {
                    pos: c.offset(),
                    end: body_end,
                    after,
                    compressed,
                    v6: false,
                });
                // Compressed headers are deltas from the previous event of the same block.
                self.header = EventHeader::default();
                // `pos` moves past the block once its last event has been read.
                return Ok(());
            }
            ObjectKind::MetadataBlock => {
                self.stats.metadata_blocks += 1;
                self.read_metadata_block(i0, i1, body_start)?;
            }
            ObjectKind::StackBlock => {
                self.stats.stack_blocks += 1;
                let c = Cursor::new(&self.buf[i0..i1], body_start);
                self.stacks
                    .add_block(c, self.pointer_size, &mut self.budget)?;
            }
            ObjectKind::SequencePointBlock => {
                self.stats.sequence_points += 1;
                let threads =
                    read_sequence_point(Cursor::new(&self.buf[i0..i1], body_start)).map_err(bad)?;
                self.on_sequence_point(&threads, start)?;
                // Stack ids restart after every sequence point.
                self.stacks.clear();
                self.budget.release_all(Held::Stacks);
            }
            ObjectKind::Trace => {
                return Err(NettraceError::malformed(
                    "Trace",
                    start,
                    "Trace object framed as a block",
                ))
            }
        }
        self.pos = after;
        Ok(())
    }

    fn read_metadata_block(
        &mut self,
        i0: usize,
        i1: usize,
        body_start: u64,
    ) -> Result<(), NettraceError> {
        let bad = |f: ReadFault| NettraceError::malformed("MetadataBlock", f.offset, f.reason);
        let mut c = Cursor::new(&self.buf[i0..i1], body_start);
        let compressed = read_event_block_header(&mut c).map_err(bad)?;
        let mut prev = EventHeader::default();
        let mut records = Vec::new();
        while !c.is_empty() {
            let blob_at = c.offset();
            let payload = if compressed {
                read_compressed_header(&mut c, &mut prev).map_err(bad)?;
                c.take(prev.payload_size as usize).map_err(bad)?
            } else {
                let mut blob = c;
                let (h, total) = read_uncompressed_header(&mut blob).map_err(bad)?;
                let payload = blob.take(h.payload_size as usize).map_err(bad)?;
                c.skip(total).map_err(bad)?;
                payload
            };
            records.push(decode_metadata(
                &mut self.budget,
                parse_metadata,
                payload,
                ("metadata record", "record", blob_at),
            )?);
        }
        for m in records {
            self.add_metadata(m);
        }
        Ok(())
    }

    /// Stores a record already charged to the budget.
    fn add_metadata(&mut self, m: EventMetadata) {
        self.stats.metadata_records += 1;
        self.last_metadata = None;
        // A redefinition replaces the earlier record: the newest description wins.
        match self.metadata_index.get(&m.metadata_id) {
            Some(&i) => {
                let old = std::mem::replace(&mut self.metadata[i], m);
                self.budget
                    .release(Held::Metadata, old.held_bytes() + METADATA_SLOT);
            }
            None => {
                self.metadata_index
                    .insert(m.metadata_id, self.metadata.len());
                self.metadata.push(m);
            }
        }
    }

    /// A sequence point's thread list: drops it reveals, and the threads it no longer lists
    /// (they have exited) forgotten.
    fn on_sequence_point(
        &mut self,
        threads: &[(u64, u32)],
        offset: u64,
    ) -> Result<(), NettraceError> {
        for &(thread, seq) in threads {
            self.drops.on_sequence_point(thread, seq);
        }
        self.drops.keep_only(threads);
        self.budget.release_all(Held::SequenceNumbers);
        self.budget.charge(
            Held::SequenceNumbers,
            self.drops.threads() * DropTracker::THREAD_COST,
            offset,
        )
    }

    /// Decodes the event at the block cursor into `self.header`.
    #[inline]
    fn next_in_block(&mut self) -> Result<StagedEvent, NettraceError> {
        let bad = |f: ReadFault| NettraceError::malformed("EventBlock", f.offset, f.reason);
        let Some(b) = self.block.as_mut() else {
            return Err(NettraceError::malformed(
                "EventBlock",
                self.pos,
                "no block is open",
            ));
        };
        let i0 = (b.pos - self.buf_base) as usize;
        let i1 = (b.end - self.buf_base) as usize;
        let mut c = Cursor::new(&self.buf[i0..i1], b.pos);
        let offset = b.pos;
        let h = &mut self.header;
        let payload_offset = if b.compressed {
            if b.v6 {
                v6::read_compressed_header(&mut c, h).map_err(bad)?;
            } else {
                read_compressed_header(&mut c, h).map_err(bad)?;
            }
            let payload_offset = c.offset();
            if h.payload_size as usize > c.remaining() {
                return Err(NettraceError::malformed(
                    "EventBlock",
                    payload_offset,
                    format!(
                        "event payload of {} bytes runs past the end of its block at offset {}",
                        h.payload_size, b.end
                    ),
                ));
            }
            b.pos = payload_offset + u64::from(h.payload_size);
            payload_offset
        } else {
            let (header, total, header_size) = if b.v6 {
                let (h, t) = v6::read_uncompressed_header(&mut c).map_err(bad)?;
                (h, t, v6::UNCOMPRESSED_HEADER_SIZE)
            } else {
                let (h, t) = read_uncompressed_header(&mut c).map_err(bad)?;
                (h, t, UNCOMPRESSED_HEADER_SIZE)
            };
            if total > i1 - i0 {
                return Err(NettraceError::malformed(
                    "EventBlock",
                    offset,
                    format!(
                        "event of {total} bytes runs past the end of its block at offset {}",
                        b.end
                    ),
                ));
            }
            *h = header;
            b.pos = offset + total as u64;
            offset + header_size as u64
        };
        let drop_key = if b.v6 {
            // V6 headers carry table indexes: resolve them to OS thread ids and activity ids.
            h.thread_id = self.threads.os_thread_id(h.thread_index);
            h.capture_thread_id = self.threads.os_thread_id(h.capture_thread_index);
            let labels = self.labels.get(h.label_list_id);
            h.activity_id = labels.and_then(|l| l.activity_id).unwrap_or_default();
            h.related_activity_id = labels
                .and_then(|l| l.related_activity_id)
                .unwrap_or_default();
            h.capture_thread_index
        } else {
            h.capture_thread_id
        };
        let metadata_index = match self.last_metadata {
            Some((id, i)) if id == h.metadata_id => i,
            _ => match self.metadata_index.get(&h.metadata_id) {
                Some(&i) => {
                    self.last_metadata = Some((h.metadata_id, i));
                    i
                }
                None => {
                    return Err(NettraceError::UnknownMetadata {
                        offset,
                        metadata_id: h.metadata_id,
                    })
                }
            },
        };
        let known_threads = self.drops.threads();
        self.drops.on_event(drop_key, h.sequence_number);
        if self.drops.threads() != known_threads {
            self.budget
                .charge(Held::SequenceNumbers, DropTracker::THREAD_COST, offset)?;
        }
        self.stats.events += 1;
        self.stats.min_timestamp = self.stats.min_timestamp.min(h.timestamp);
        self.stats.max_timestamp = self.stats.max_timestamp.max(h.timestamp);
        Ok(StagedEvent {
            metadata_index,
            offset,
            payload_offset,
        })
    }
}
