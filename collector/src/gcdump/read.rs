//! Reading a `.gcdump` file, written from the format's description (FastSerialization's tags and
//! trailer, GCHeapDump version ≥ 9, Graphs.MemoryGraph) rather than from the writer, so a round
//! trip checks both. Every count is checked against the bytes left before it is used, so a
//! truncated or damaged file is an error that says where, never a panic or a huge allocation.

use std::collections::HashMap;

use super::format::{tag, DumpInfo, GCHEAPDUMP_TYPE, MEMORY_GRAPH_TYPE, SIGNATURE};
use super::graph::HeapGraph;
use super::GcDumpError;

/// .NET ticks (100 ns since 0001-01-01) at the Unix epoch.
const UNIX_EPOCH_TICKS: i64 = 621_355_968_000_000_000;

/// A `.gcdump` file's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcDumpFile {
    /// The objects. Pseudo-nodes (address 0: the root and root categories) are not objects;
    /// the objects they reference are the graph's roots.
    pub graph: HeapGraph,
    pub info: DumpInfo,
}

/// Parses a whole `.gcdump` file.
pub fn read_gcdump(data: &[u8]) -> Result<GcDumpFile, GcDumpError> {
    let mut r = Reader {
        data,
        at: 0,
        types: HashMap::new(),
    };
    let sig_len = r.i32("the signature")?;
    if sig_len != SIGNATURE.len() as i32
        || r.take(SIGNATURE.len(), "the signature")? != SIGNATURE.as_bytes()
    {
        return Err(GcDumpError::NotGcDump);
    }
    // A file cut short loses its trailer first: say so rather than where a label points.
    let forward_refs = forward_reference_table(data).map_err(|_| GcDumpError::Truncated {
        offset: data.len() as u64,
        what: "the trailer that ends every .gcdump (the file is cut short or damaged)".into(),
    })?;

    let (name, version, _) = r.object_start()?;
    if name != GCHEAPDUMP_TYPE {
        return Err(r.unsupported(format!("the file holds a {name:?}, not a GCHeapDump")));
    }
    if version < 9 {
        return Err(r.unsupported(format!(
            "GCHeapDump version {version} (only 9 and later are read)"
        )));
    }
    let raw = read_memory_graph(&mut r)?;
    let is_64 = r.u8("Is64Bit")? != 0;
    r.take(8, "the count and size multipliers")?;
    skip_heap_info(&mut r, "JSHeapInfo")?;
    skip_heap_info(&mut r, "DotNetHeapInfo")?;
    r.string("CollectionLog")?;
    let ticks = r.i64("TimeCollected")?;
    let machine_name = r.string("MachineName")?.unwrap_or_default();
    let process_name = r.string("ProcessName")?.unwrap_or_default();
    let process_id = r.i32("ProcessID")? as u32;
    r.take(16, "the process commit and working set")?;
    let multipliers = r.count(4, "CountMultipliersByType")?;
    r.take(multipliers * 4, "CountMultipliersByType")?;
    let mut creation_tool = None;
    // Tagged fields added after version 8: InteropInfo (a skippable region), CreationTool.
    loop {
        match r.u8("a tagged field")? {
            tag::END_OBJECT => break,
            tag::SKIP_REGION => {
                let index = r.i32("a skip region")?;
                let end = usize::try_from(index)
                    .ok()
                    .and_then(|i| forward_refs.get(i))
                    .ok_or_else(|| {
                        r.malformed(format!("forward reference {index} is not defined"))
                    })?;
                r.goto(*end as usize)?;
            }
            tag::STRING => creation_tool = r.string("CreationTool")?,
            other => r.skip_tagged(other)?,
        }
    }

    let graph = raw.into_graph(if is_64 { 8 } else { 4 }, &r)?;
    Ok(GcDumpFile {
        graph,
        info: DumpInfo {
            process_id,
            process_name,
            machine_name,
            collected_unix_nanos: ticks.saturating_sub(UNIX_EPOCH_TICKS).saturating_mul(100),
            creation_tool: creation_tool.unwrap_or_default(),
        },
    })
}

/// The trailer's forward-reference table: the last 4 bytes locate the trailer, whose first label
/// locates the table (`i32 count`, then one 4-byte stream label per forward reference).
fn forward_reference_table(data: &[u8]) -> Result<Vec<u32>, GcDumpError> {
    let mut r = Reader {
        data,
        at: 0,
        types: HashMap::new(),
    };
    r.goto(data.len().saturating_sub(4))?;
    let trailer = r.i32("the trailer label")?;
    r.goto(usize::try_from(trailer).map_err(|_| r.malformed("negative trailer label".into()))?)?;
    let table = r.i32("the forward reference table label")?;
    r.goto(usize::try_from(table).map_err(|_| r.malformed("negative table label".into()))?)?;
    let count = r.count(4, "the forward reference table")?;
    (0..count)
        .map(|_| r.i32("a forward reference").map(|v| v as u32))
        .collect()
}

/// JSHeapInfo (no fields) or DotNetHeapInfo (`i64 SizeOfAllSegments, i32 count`, then that many
/// GCHeapDumpSegment objects of 6 or, from version 1, 7 `i64` bounds), or null: read past, since
/// the histogram does not use them.
fn skip_heap_info(r: &mut Reader<'_>, expected: &str) -> Result<(), GcDumpError> {
    if r.null(expected)? {
        return Ok(());
    }
    let (name, _, _) = r.object_start()?;
    if name != expected {
        return Err(r.unsupported(format!("a {name:?} where a {expected} belongs")));
    }
    if expected == "DotNetHeapInfo" {
        r.i64("SizeOfAllSegments")?;
        let segments = r.count(1, "the segment list")?;
        for _ in 0..segments {
            if r.null("a segment")? {
                continue;
            }
            let (name, version, _) = r.object_start()?;
            if name != "GCHeapDumpSegment" {
                return Err(r.unsupported(format!("a {name:?} in the segment list")));
            }
            r.take(if version >= 1 { 56 } else { 48 }, "a segment")?;
            r.object_end()?;
        }
    }
    r.object_end()
}

/// A MemoryGraph as stored, before its nodes are decoded.
struct RawGraph<'a> {
    root: i32,
    type_names: Vec<String>,
    type_sizes: Vec<i32>,
    offsets: Vec<u32>,
    blob: &'a [u8],
    blob_at: usize,
    addresses: Vec<u64>,
}

fn read_memory_graph<'a>(r: &mut Reader<'a>) -> Result<RawGraph<'a>, GcDumpError> {
    let (name, _, min_reader) = r.object_start()?;
    if name != MEMORY_GRAPH_TYPE {
        return Err(r.unsupported(format!("a graph of type {name:?}")));
    }
    if min_reader >= 1 {
        return Err(r.unsupported("a graph with deferred types (.NET Native)".into()));
    }
    r.i64("the total size")?;
    let root = r.i32("RootIndex")?;
    // Each type is at least two 4-byte string lengths and a 4-byte size.
    let types = r.count(12, "the type table")?;
    let mut type_names = Vec::with_capacity(types);
    let mut type_sizes = Vec::with_capacity(types);
    for _ in 0..types {
        type_names.push(r.string("a type name")?.unwrap_or_default());
        type_sizes.push(r.i32("a type size")?);
        r.string("a module name")?;
    }
    let nodes = r.count(4, "the node table")?;
    let offsets = (0..nodes)
        .map(|_| r.i32("a node offset").map(|v| v as u32))
        .collect::<Result<Vec<_>, _>>()?;
    let blob_len = r.count(1, "the node blob")?;
    let blob_at = r.at;
    let blob = r.take(blob_len, "the node blob")?;
    let addresses = r.count(8, "the address table")?;
    if addresses != nodes {
        return Err(r.malformed(format!("{nodes} nodes but {addresses} addresses")));
    }
    let addresses = (0..nodes)
        .map(|_| r.i64("an address").map(|v| v as u64))
        .collect::<Result<Vec<_>, _>>()?;
    r.object_end()?;
    Ok(RawGraph {
        root,
        type_names,
        type_sizes,
        offsets,
        blob,
        blob_at,
        addresses,
    })
}

impl RawGraph<'_> {
    /// Decodes every node record and keeps the objects (nonzero address); the children of
    /// pseudo-nodes become the roots.
    fn into_graph(self, pointer_size: u8, r: &Reader<'_>) -> Result<HeapGraph, GcDumpError> {
        let n = self.offsets.len();
        if self.root < 0 || self.root as usize >= n {
            return Err(r.malformed(format!("root node {} of {n}", self.root)));
        }
        let mut new_index = vec![u32::MAX; n];
        let mut next = 0u32;
        for (i, &address) in self.addresses.iter().enumerate() {
            if address != 0 {
                new_index[i] = next;
                next += 1;
            }
        }
        let objects = next as usize;
        let mut addresses = Vec::with_capacity(objects);
        let mut sizes = Vec::with_capacity(objects);
        let mut types = Vec::with_capacity(objects);
        let mut edge_counts = Vec::with_capacity(objects);
        let mut edges = Vec::new();
        let mut roots = Vec::new();
        for i in 0..n {
            let mut c = BlobCursor {
                blob: self.blob,
                at: self.offsets[i] as usize,
                base: self.blob_at,
            };
            let type_and_size = c.compressed_int()?;
            let type_index = usize::try_from(type_and_size >> 1)
                .ok()
                .filter(|&t| t < self.type_names.len())
                .ok_or_else(|| c.malformed(format!("node {i} has type {}", type_and_size >> 1)))?;
            let size = if type_and_size & 1 != 0 {
                c.compressed_int()?
            } else {
                self.type_sizes[type_index]
            };
            let children = c.compressed_int()?;
            if children < 0 || children as usize > self.blob.len() {
                return Err(c.malformed(format!("node {i} has {children} children")));
            }
            let is_object = new_index[i] != u32::MAX;
            let before = edges.len();
            for _ in 0..children {
                let child = i as i64 + i64::from(c.compressed_int()?);
                let child = usize::try_from(child)
                    .ok()
                    .filter(|&ch| ch < n)
                    .ok_or_else(|| c.malformed(format!("node {i} references node {child}")))?;
                match (is_object, new_index[child]) {
                    (_, u32::MAX) => {}
                    (true, target) => edges.push(target),
                    (false, target) => roots.push(target),
                }
            }
            if is_object {
                addresses.push(self.addresses[i]);
                sizes.push(
                    u64::try_from(size)
                        .map_err(|_| c.malformed(format!("node {i} has size {size}")))?,
                );
                types.push(type_index as u32);
                edge_counts.push((edges.len() - before) as u32);
            }
        }
        roots.sort_unstable();
        roots.dedup();
        HeapGraph::new(
            pointer_size,
            self.type_names,
            addresses,
            sizes,
            types,
            &edge_counts,
            edges,
            roots,
        )
    }
}

/// The node blob: `Node.ReadCompressedInt` values.
struct BlobCursor<'a> {
    blob: &'a [u8],
    at: usize,
    /// File offset of the blob, for messages.
    base: usize,
}

impl BlobCursor<'_> {
    fn byte(&mut self) -> Result<u8, GcDumpError> {
        let b = *self.blob.get(self.at).ok_or(GcDumpError::Truncated {
            offset: (self.base + self.at) as u64,
            what: "a node record".into(),
        })?;
        self.at += 1;
        Ok(b)
    }

    /// First byte: 7 bits, sign-extended; while the high bit is set, 7 more bits follow (the
    /// fifth byte adds all its bits).
    fn compressed_int(&mut self) -> Result<i32, GcDumpError> {
        let b = self.byte()?;
        let mut value = (i32::from(b) << 25) >> 25;
        if b & 0x80 == 0 {
            return Ok(value);
        }
        for _ in 0..3 {
            let b = self.byte()?;
            value = value.wrapping_shl(7).wrapping_add(i32::from(b & 0x7f));
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        let b = self.byte()?;
        Ok(value.wrapping_shl(7).wrapping_add(i32::from(b)))
    }

    fn malformed(&self, reason: String) -> GcDumpError {
        GcDumpError::Malformed {
            offset: (self.base + self.at) as u64,
            reason,
        }
    }
}

/// FastSerialization primitives over the whole file.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
    /// Types read so far by the stream label of their definition, for back references:
    /// (name, version, minimum reader version).
    types: HashMap<u32, (String, i32, i32)>,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GcDumpError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.data.len());
        let Some(end) = end else {
            return Err(GcDumpError::Truncated {
                offset: self.data.len() as u64,
                what: what.into(),
            });
        };
        let bytes = &self.data[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn goto(&mut self, at: usize) -> Result<(), GcDumpError> {
        if at > self.data.len() {
            return Err(self.malformed(format!(
                "a stream label points at byte {at}, past the end ({})",
                self.data.len()
            )));
        }
        self.at = at;
        Ok(())
    }

    fn u8(&mut self, what: &str) -> Result<u8, GcDumpError> {
        Ok(self.take(1, what)?[0])
    }

    fn i32(&mut self, what: &str) -> Result<i32, GcDumpError> {
        let b = self.take(4, what)?;
        Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn i64(&mut self, what: &str) -> Result<i64, GcDumpError> {
        let b = self.take(8, what)?;
        let mut a = [0; 8];
        a.copy_from_slice(b);
        Ok(i64::from_le_bytes(a))
    }

    /// An i32 count of entries of at least `entry_size` bytes, checked against the bytes left.
    fn count(&mut self, entry_size: usize, what: &str) -> Result<usize, GcDumpError> {
        let count = self.i32(what)?;
        let count = usize::try_from(count)
            .map_err(|_| self.malformed(format!("{what} has {count} entries")))?;
        if count.saturating_mul(entry_size) > self.data.len() - self.at {
            return Err(GcDumpError::Truncated {
                offset: self.data.len() as u64,
                what: format!("{what} ({count} entries)"),
            });
        }
        Ok(count)
    }

    /// `i32` UTF-16 length (-1: null), then each code unit in 1 to 3 UTF-8-style bytes.
    fn string(&mut self, what: &str) -> Result<Option<String>, GcDumpError> {
        let len = self.i32(what)?;
        if len < 0 {
            return Ok(None);
        }
        let len = len as usize;
        if len > self.data.len() - self.at {
            return Err(GcDumpError::Truncated {
                offset: self.data.len() as u64,
                what: what.into(),
            });
        }
        let mut units = Vec::with_capacity(len);
        for _ in 0..len {
            let b = u16::from(self.u8(what)?);
            let unit = if b < 0x80 {
                b
            } else if b < 0xe0 {
                (b & 0x1f) << 6 | u16::from(self.u8(what)? & 0x3f)
            } else {
                let hi = (b & 0xf) << 12 | u16::from(self.u8(what)? & 0x3f) << 6;
                hi | u16::from(self.u8(what)? & 0x3f)
            };
            units.push(unit);
        }
        Ok(Some(String::from_utf16_lossy(&units)))
    }

    /// `BeginObject`, then the object's type: a `SerializationType` written in full the first
    /// time (`BeginObject, NullReference, i32 version, i32 minimumReaderVersion, string name,
    /// EndObject`), later as `ObjectReference` and the label of that definition.
    fn object_start(&mut self) -> Result<(String, i32, i32), GcDumpError> {
        self.expect(tag::BEGIN_OBJECT, "an object")?;
        let label = self.at as u32;
        match self.u8("an object's type")? {
            tag::BEGIN_OBJECT => {}
            tag::OBJECT_REFERENCE => {
                let target = self.i32("a type reference")? as u32;
                return self.types.get(&target).cloned().ok_or_else(|| {
                    self.malformed(format!("a type reference to byte {target}, not a type"))
                });
            }
            other => return Err(self.malformed(format!("tag {other} where a type begins"))),
        }
        self.expect(tag::NULL_REFERENCE, "the type of a type")?;
        let version = self.i32("a type version")?;
        let min_reader = self.i32("a type's minimum reader version")?;
        let name = self.string("a type name")?.unwrap_or_default();
        self.expect(tag::END_OBJECT, "the end of a type")?;
        self.types
            .insert(label, (name.clone(), version, min_reader));
        Ok((name, version, min_reader))
    }

    /// Tagged fields newer than this reader, then the object's `EndObject`.
    fn object_end(&mut self) -> Result<(), GcDumpError> {
        loop {
            match self.u8("the end of an object")? {
                tag::END_OBJECT => return Ok(()),
                other => self.skip_tagged(other)?,
            }
        }
    }

    /// A `NullReference` tag (consumed), or not (nothing consumed).
    fn null(&mut self, what: &str) -> Result<bool, GcDumpError> {
        let is_null = self.u8(what)? == tag::NULL_REFERENCE;
        if !is_null {
            self.at -= 1;
        }
        Ok(is_null)
    }

    fn expect(&mut self, expected: u8, what: &str) -> Result<(), GcDumpError> {
        match self.u8(what)? {
            t if t == expected => Ok(()),
            t => {
                self.at -= 1;
                Err(self.malformed(format!(
                    "tag {t} where {what} was expected (tag {expected})"
                )))
            }
        }
    }

    /// Skips one tagged value of a kind this reader does not use.
    fn skip_tagged(&mut self, t: u8) -> Result<(), GcDumpError> {
        let n = match t {
            tag::BYTE => 1,
            tag::INT16 => 2,
            tag::INT32 => 4,
            tag::INT64 => 8,
            tag::STRING => {
                self.string("a tagged string")?;
                return Ok(());
            }
            tag::BLOB => self.count(1, "a tagged blob")?,
            other => {
                self.at -= 1;
                return Err(self.malformed(format!("unexpected tag {other}")));
            }
        };
        self.take(n, "a tagged value")?;
        Ok(())
    }

    fn malformed(&self, reason: String) -> GcDumpError {
        GcDumpError::Malformed {
            offset: self.at as u64,
            reason,
        }
    }

    fn unsupported(&self, reason: String) -> GcDumpError {
        GcDumpError::Unsupported {
            offset: self.at as u64,
            reason,
        }
    }
}
