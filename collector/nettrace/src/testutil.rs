//! Test-only writer that builds NetTrace streams to the spec (NetTraceFormat_v5.md) and the way
//! the runtime writes them (ep-block.c): object framing, 4-byte alignment from the stream start,
//! compressed headers with the runtime's delta rules, uncompressed headers with padded EventSize.
//!
//! Written against the crate's public API only, so that integration tests can include it too
//! (`collector/nettrace/tests/nettrace_budget.rs`); other crates' tests use it through the
//! `testutil` feature.

use crate::EventHeader;
use profile::guid::Guid;

pub fn utf16z(s: &str) -> Vec<u8> {
    let mut v: Vec<u8> = s.encode_utf16().flat_map(u16::to_le_bytes).collect();
    v.extend([0, 0]);
    v
}

/// One metadata record (payload of a MetadataBlock blob).
pub struct MetadataRecord {
    id: u32,
    provider: String,
    event_id: u32,
    name: String,
    keywords: u64,
    version: u32,
    level: u32,
    fields: Option<Vec<u8>>,
    tags: Vec<u8>,
}

impl MetadataRecord {
    pub fn new(id: u32, provider: &str, event_id: u32, name: &str) -> Self {
        MetadataRecord {
            id,
            provider: provider.into(),
            event_id,
            name: name.into(),
            keywords: 0,
            version: 0,
            level: 4,
            fields: Some(0i32.to_le_bytes().to_vec()),
            tags: Vec::new(),
        }
    }
    pub fn version(mut self, v: u32) -> Self {
        self.version = v;
        self
    }
    pub fn level(mut self, l: u32) -> Self {
        self.level = l;
        self
    }
    pub fn keywords(mut self, k: u64) -> Self {
        self.keywords = k;
        self
    }
    /// The V1 field list bytes, count included.
    pub fn raw_fields(mut self, f: Vec<u8>) -> Self {
        self.fields = Some(f);
        self
    }
    /// No field count at all (some writers end the record after the level).
    pub fn no_field_list(mut self) -> Self {
        self.fields = None;
        self
    }
    pub fn opcode_tag(mut self, op: u8) -> Self {
        self.tags.extend(1i32.to_le_bytes());
        self.tags.push(1);
        self.tags.push(op);
        self
    }
    /// A V2Params tag; `body` starts with the V2 field count.
    pub fn v2_params_tag(mut self, body: Vec<u8>) -> Self {
        self.tags.extend((body.len() as i32).to_le_bytes());
        self.tags.push(2);
        self.tags.extend(body);
        self
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend(self.id.to_le_bytes());
        v.extend(utf16z(&self.provider));
        v.extend(self.event_id.to_le_bytes());
        v.extend(utf16z(&self.name));
        v.extend(self.keywords.to_le_bytes());
        v.extend(self.version.to_le_bytes());
        v.extend(self.level.to_le_bytes());
        if let Some(f) = &self.fields {
            v.extend(f);
        }
        v.extend(&self.tags);
        v
    }
}

/// A V1 field list from `(TypeCode, name)` pairs of scalar fields.
pub fn scalar_fields(fields: &[(i32, &str)]) -> Vec<u8> {
    let mut v = (fields.len() as i32).to_le_bytes().to_vec();
    for (code, name) in fields {
        v.extend(code.to_le_bytes());
        v.extend(utf16z(name));
    }
    v
}

/// One event to write.
#[derive(Debug, Clone, Default)]
pub struct EventSpec {
    pub header: EventHeader,
    pub payload: Vec<u8>,
}

impl EventSpec {
    #[allow(clippy::field_reassign_with_default)]
    pub fn new(metadata_id: u32, seq: u32, capture_thread: u64, ts: i64, payload: Vec<u8>) -> Self {
        // Field by field: `EventHeader` is non-exhaustive outside the crate.
        let mut header = EventHeader::default();
        header.metadata_id = metadata_id;
        header.sequence_number = seq;
        header.thread_id = capture_thread;
        header.capture_thread_id = capture_thread;
        header.timestamp = ts;
        header.is_sorted = true;
        header.payload_size = payload.len() as u32;
        EventSpec { header, payload }
    }
    pub fn stack(mut self, id: u32) -> Self {
        self.header.stack_id = id;
        self
    }
    pub fn thread(mut self, tid: u64) -> Self {
        self.header.thread_id = tid;
        self
    }
    pub fn activity(mut self, a: Guid, related: Guid) -> Self {
        self.header.activity_id = a;
        self.header.related_activity_id = related;
        self
    }
    pub fn unsorted(mut self) -> Self {
        self.header.is_sorted = false;
        self
    }
}

fn var(v: &mut Vec<u8>, mut x: u64) {
    while x >= 0x80 {
        v.push((x as u8) | 0x80);
        x >>= 7;
    }
    v.push(x as u8);
}

fn encode_compressed(out: &mut Vec<u8>, e: &EventSpec, last: &mut EventHeader) {
    let h = &e.header;
    let mut flags = 0u8;
    let mut body = Vec::new();
    if h.metadata_id != last.metadata_id {
        var(&mut body, u64::from(h.metadata_id));
        flags |= 1;
    }
    if h.is_sorted {
        flags |= 0x40;
    }
    let step = u32::from(h.metadata_id != 0);
    if last.sequence_number.wrapping_add(step) != h.sequence_number
        || last.capture_thread_id != h.capture_thread_id
        || last.processor_number != h.processor_number
    {
        var(
            &mut body,
            u64::from(
                h.sequence_number
                    .wrapping_sub(last.sequence_number)
                    .wrapping_sub(1),
            ),
        );
        var(&mut body, h.capture_thread_id);
        var(&mut body, u64::from(h.processor_number));
        flags |= 2;
    }
    if h.thread_id != last.thread_id {
        var(&mut body, h.thread_id);
        flags |= 4;
    }
    if h.stack_id != last.stack_id {
        var(&mut body, u64::from(h.stack_id));
        flags |= 8;
    }
    var(&mut body, h.timestamp.wrapping_sub(last.timestamp) as u64);
    if h.activity_id != last.activity_id {
        body.extend(h.activity_id.to_bytes_le());
        flags |= 0x10;
    }
    if h.related_activity_id != last.related_activity_id {
        body.extend(h.related_activity_id.to_bytes_le());
        flags |= 0x20;
    }
    if h.payload_size != last.payload_size {
        var(&mut body, u64::from(h.payload_size));
        flags |= 0x80;
    }
    out.push(flags);
    out.extend(body);
    out.extend(&e.payload);
    *last = *h;
}

fn encode_uncompressed(out: &mut Vec<u8>, e: &EventSpec) {
    let h = &e.header;
    let unpadded = 80 + e.payload.len();
    let padded = unpadded.div_ceil(4) * 4;
    out.extend(((padded - 4) as u32).to_le_bytes());
    out.extend((h.metadata_id | if h.is_sorted { 0 } else { 0x8000_0000 }).to_le_bytes());
    out.extend(h.sequence_number.to_le_bytes());
    out.extend(h.thread_id.to_le_bytes());
    out.extend(h.capture_thread_id.to_le_bytes());
    out.extend(h.processor_number.to_le_bytes());
    out.extend(h.stack_id.to_le_bytes());
    out.extend(h.timestamp.to_le_bytes());
    out.extend(h.activity_id.to_bytes_le());
    out.extend(h.related_activity_id.to_bytes_le());
    out.extend((e.payload.len() as u32).to_le_bytes());
    out.extend(&e.payload);
    out.resize(out.len() + padded - unpadded, 0);
}

/// Builds a whole stream.
pub struct StreamBuilder {
    pub buf: Vec<u8>,
    pointer_size: u32,
}

impl StreamBuilder {
    /// Magic, FastSerialization header and a Trace object: sync time 2026-01-02T03:04:05.006Z
    /// at QPC 1000, frequency 1e9 (Linux), pid 4242, 2 CPUs, 1 ms sampling.
    pub fn new(pointer_size: u32) -> Self {
        let mut b = StreamBuilder {
            buf: Vec::new(),
            pointer_size,
        };
        b.buf.extend(b"Nettrace");
        b.buf.extend(20u32.to_le_bytes());
        b.buf.extend(b"!FastSerialization.1");
        b.begin_object("Trace", 4, 4);
        for v in [2026u16, 1, 5, 2, 3, 4, 5, 6] {
            b.buf.extend(v.to_le_bytes());
        }
        b.buf.extend(1000i64.to_le_bytes());
        b.buf.extend(1_000_000_000i64.to_le_bytes());
        b.buf.extend(pointer_size.to_le_bytes());
        b.buf.extend(4242u32.to_le_bytes());
        b.buf.extend(2u32.to_le_bytes());
        b.buf.extend(1_000_000u32.to_le_bytes());
        b.buf.push(6);
        b
    }

    pub fn begin_object(&mut self, name: &str, version: i32, min: i32) {
        self.buf.extend([5, 5, 1]);
        self.buf.extend(version.to_le_bytes());
        self.buf.extend(min.to_le_bytes());
        self.buf.extend((name.len() as i32).to_le_bytes());
        self.buf.extend(name.as_bytes());
        self.buf.push(6);
    }

    /// A block object: type header, size, padding to a 4-byte stream offset, body, EndObject.
    pub fn block(&mut self, name: &str, body: &[u8]) {
        self.begin_object(name, 2, 2);
        self.buf.extend((body.len() as u32).to_le_bytes());
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
        self.buf.extend(body);
        self.buf.push(6);
    }

    fn event_block_body(events: &[EventSpec], compressed: bool) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend(20u16.to_le_bytes());
        body.extend(u16::from(compressed).to_le_bytes());
        let min = events.iter().map(|e| e.header.timestamp).min().unwrap_or(0);
        let max = events.iter().map(|e| e.header.timestamp).max().unwrap_or(0);
        body.extend(min.to_le_bytes());
        body.extend(max.to_le_bytes());
        let mut last = EventHeader::default();
        for e in events {
            if compressed {
                encode_compressed(&mut body, e, &mut last);
            } else {
                encode_uncompressed(&mut body, e);
            }
        }
        body
    }

    pub fn metadata_block(&mut self, records: &[Vec<u8>], compressed: bool) -> &mut Self {
        let events: Vec<EventSpec> = records
            .iter()
            .map(|r| {
                let mut e = EventSpec::new(0, 0, 0, 0, r.clone());
                e.header.thread_id = 0;
                e
            })
            .collect();
        let body = Self::event_block_body(&events, compressed);
        self.block("MetadataBlock", &body);
        self
    }

    pub fn event_block(&mut self, events: &[EventSpec], compressed: bool) -> &mut Self {
        let body = Self::event_block_body(events, compressed);
        self.block("EventBlock", &body);
        self
    }

    pub fn stack_block(&mut self, first_id: u32, stacks: &[&[u64]]) -> &mut Self {
        let mut body = Vec::new();
        body.extend(first_id.to_le_bytes());
        body.extend((stacks.len() as u32).to_le_bytes());
        for s in stacks {
            body.extend((s.len() as u32 * self.pointer_size).to_le_bytes());
            for ip in *s {
                if self.pointer_size == 8 {
                    body.extend(ip.to_le_bytes());
                } else {
                    body.extend((*ip as u32).to_le_bytes());
                }
            }
        }
        self.block("StackBlock", &body);
        self
    }

    pub fn sequence_point(&mut self, ts: i64, threads: &[(u64, u32)]) -> &mut Self {
        let mut body = Vec::new();
        body.extend(ts.to_le_bytes());
        body.extend((threads.len() as u32).to_le_bytes());
        for (t, s) in threads {
            body.extend(t.to_le_bytes());
            body.extend(s.to_le_bytes());
        }
        self.block("SPBlock", &body);
        self
    }

    pub fn finish(&mut self) -> Vec<u8> {
        self.buf.push(1);
        std::mem::take(&mut self.buf)
    }
}

/// Writes V6 streams (perfview NetTraceFormat.md, "Current Version 6").
pub struct V6Builder {
    pub buf: Vec<u8>,
}

pub fn utf8(s: &str) -> Vec<u8> {
    let mut v = Vec::new();
    var(&mut v, s.len() as u64);
    v.extend(s.as_bytes());
    v
}

/// One V6 field description: `u16 size, string name, type bytes`.
pub fn v6_field(name: &str, ty: &[u8]) -> Vec<u8> {
    let mut body = utf8(name);
    body.extend(ty);
    let mut v = (body.len() as u16).to_le_bytes().to_vec();
    v.extend(body);
    v
}

/// A V6 metadata row (without its u16 size): fields are whole `v6_field`s, `optional` the
/// optional-metadata entries.
pub fn v6_metadata_row(
    id: u32,
    provider: &str,
    event_id: u32,
    name: &str,
    fields: &[Vec<u8>],
    optional: &[u8],
) -> Vec<u8> {
    let mut v = Vec::new();
    var(&mut v, u64::from(id));
    v.extend(utf8(provider));
    var(&mut v, u64::from(event_id));
    v.extend(utf8(name));
    v.extend((fields.len() as u16).to_le_bytes());
    for f in fields {
        v.extend(f);
    }
    v.extend((optional.len() as u16).to_le_bytes());
    v.extend(optional);
    v
}

/// One V6 event row for `V6Builder::event_block`.
#[derive(Debug, Clone, Default)]
pub struct V6Event {
    pub metadata_id: u32,
    pub seq: u32,
    pub thread_index: u64,
    pub capture_thread_index: u64,
    pub stack_id: u32,
    pub timestamp: i64,
    pub label_list_id: u32,
    pub sorted: bool,
    pub payload: Vec<u8>,
}

impl V6Builder {
    /// Header and a Trace block (2026-01-02T03:04:05.006Z at tick 1000, 1e9 ticks/s).
    pub fn new(pointer_size: u32, properties: &[(&str, &str)]) -> Self {
        let mut b = V6Builder { buf: Vec::new() };
        b.buf.extend(b"Nettrace");
        b.buf.extend(0u32.to_le_bytes());
        b.buf.extend(6u32.to_le_bytes());
        b.buf.extend(0u32.to_le_bytes());
        let mut t = Vec::new();
        for v in [2026u16, 1, 5, 2, 3, 4, 5, 6] {
            t.extend(v.to_le_bytes());
        }
        t.extend(1000i64.to_le_bytes());
        t.extend(1_000_000_000i64.to_le_bytes());
        t.extend(pointer_size.to_le_bytes());
        t.extend((properties.len() as i32).to_le_bytes());
        for (k, v) in properties {
            t.extend(utf8(k));
            t.extend(utf8(v));
        }
        b.block(1, &t);
        b
    }

    pub fn block(&mut self, kind: u8, body: &[u8]) -> &mut Self {
        self.buf
            .extend(((u32::from(kind) << 24) | body.len() as u32).to_le_bytes());
        self.buf.extend(body);
        self
    }

    pub fn metadata(&mut self, rows: &[Vec<u8>]) -> &mut Self {
        let mut body = 0u16.to_le_bytes().to_vec(); // empty header
        for r in rows {
            body.extend((r.len() as u16).to_le_bytes());
            body.extend(r);
        }
        self.block(3, &body)
    }

    /// Thread rows: `(index, name, os pid, os tid)`.
    pub fn threads(&mut self, rows: &[(u64, &str, u64, u64)]) -> &mut Self {
        let mut body = Vec::new();
        for (index, name, pid, tid) in rows {
            let mut row = Vec::new();
            var(&mut row, *index);
            row.push(1);
            row.extend(utf8(name));
            row.push(2);
            var(&mut row, *pid);
            row.push(3);
            var(&mut row, *tid);
            body.extend((row.len() as u16).to_le_bytes());
            body.extend(row);
        }
        self.block(6, &body)
    }

    pub fn event_block(&mut self, events: &[V6Event], compressed: bool) -> &mut Self {
        let mut body = Vec::new();
        body.extend(20u16.to_le_bytes());
        body.extend(u16::from(compressed).to_le_bytes());
        body.extend([0u8; 16]);
        let mut last = V6Event::default();
        for e in events {
            if compressed {
                let mut flags = 0u8;
                let mut h = Vec::new();
                if e.metadata_id != last.metadata_id {
                    var(&mut h, u64::from(e.metadata_id));
                    flags |= 1;
                }
                if last.seq.wrapping_add(1) != e.seq
                    || last.capture_thread_index != e.capture_thread_index
                {
                    var(
                        &mut h,
                        u64::from(e.seq.wrapping_sub(last.seq).wrapping_sub(1)),
                    );
                    var(&mut h, e.capture_thread_index);
                    var(&mut h, 0);
                    flags |= 2;
                }
                if e.thread_index != last.thread_index {
                    var(&mut h, e.thread_index);
                    flags |= 4;
                }
                if e.stack_id != last.stack_id {
                    var(&mut h, u64::from(e.stack_id));
                    flags |= 8;
                }
                var(&mut h, e.timestamp.wrapping_sub(last.timestamp) as u64);
                if e.label_list_id != last.label_list_id {
                    var(&mut h, u64::from(e.label_list_id));
                    flags |= 0x10;
                }
                if e.sorted {
                    flags |= 0x40;
                }
                if e.payload.len() != last.payload.len() {
                    var(&mut h, e.payload.len() as u64);
                    flags |= 0x80;
                }
                body.push(flags);
                body.extend(h);
            } else {
                body.extend(((48 + e.payload.len()) as u32).to_le_bytes());
                body.extend((e.metadata_id | if e.sorted { 0 } else { 0x8000_0000 }).to_le_bytes());
                body.extend(e.seq.to_le_bytes());
                body.extend(e.thread_index.to_le_bytes());
                body.extend(e.capture_thread_index.to_le_bytes());
                body.extend(0u32.to_le_bytes());
                body.extend(e.stack_id.to_le_bytes());
                body.extend(e.timestamp.to_le_bytes());
                body.extend(e.label_list_id.to_le_bytes());
                body.extend((e.payload.len() as u32).to_le_bytes());
            }
            body.extend(&e.payload);
            last = e.clone();
        }
        self.block(2, &body)
    }

    pub fn finish(&mut self) -> Vec<u8> {
        self.block(0, &[]);
        std::mem::take(&mut self.buf)
    }
}

/// A builder stream with two metadata records, stacks, two event blocks around a sequence
/// point, activity ids, unsorted events and a dropped-event gap.
pub fn builder_stream(compressed: bool) -> Vec<u8> {
    let mut b = StreamBuilder::new(8);
    let sample = MetadataRecord::new(1, "Microsoft-DotNETCore-SampleProfiler", 0, "")
        .no_field_list()
        .encode();
    let custom = MetadataRecord::new(2, "My.Source", 5, "Work")
        .version(1)
        .raw_fields(scalar_fields(&[(9, "Id"), (18, "What")]))
        .encode();
    b.metadata_block(&[sample, custom], compressed);
    b.stack_block(1, &[&[0x1000, 0x2000, 0x3000], &[0x4000]]);
    let work = |id: i32, what: &str| {
        let mut p = id.to_le_bytes().to_vec();
        p.extend(utf16z(what));
        p
    };
    let act = Guid::from_fields(1, 2, 3, [4; 8]);
    b.event_block(
        &[
            EventSpec::new(1, 1, 7, 2000, 2u32.to_le_bytes().to_vec())
                .thread(100)
                .stack(1),
            EventSpec::new(1, 2, 7, 2010, 1u32.to_le_bytes().to_vec())
                .thread(101)
                .stack(2),
            EventSpec::new(2, 1, 8, 2005, work(42, "a"))
                .activity(act, Guid::NIL)
                .unsorted(),
            // Sequence 5 after 2 on thread 7: two events dropped.
            EventSpec::new(1, 5, 7, 2020, 2u32.to_le_bytes().to_vec())
                .thread(100)
                .stack(1),
        ],
        compressed,
    );
    // Thread 8 logged up to 4 but only 1 arrived: three more dropped.
    b.sequence_point(2100, &[(7, 5), (8, 4)]);
    // Stack ids restart: id 1 is now a different stack.
    b.stack_block(1, &[&[0x9000]]);
    b.event_block(
        &[
            EventSpec::new(1, 6, 7, 2200, 2u32.to_le_bytes().to_vec())
                .thread(100)
                .stack(1),
            EventSpec::new(2, 5, 8, 2201, work(-1, "")),
        ],
        compressed,
    );
    b.finish()
}
