//! Writing a [`HeapGraph`] as a `.gcdump` file that PerfView and dotnet-gcdump's readers open:
//! a FastSerialization stream (`perfview:src/FastSerialization/FastSerialization.cs`) whose entry
//! object is a `GCHeapDump` (version 10) holding a `Graphs.MemoryGraph`
//! (`src/HeapDump/GCHeapDump.cs`, `src/MemoryGraph/graph.cs`, `MemoryGraph.cs`).
//!
//! The object graph gets one extra node, the root (`[.NET Roots]`, address 0), whose children are
//! the rooted objects: a memory graph has exactly one root.

use std::io::{self, Write};

use super::format::{
    tag, DumpInfo, GCHEAPDUMP_MIN_READER, GCHEAPDUMP_TYPE, GCHEAPDUMP_VERSION, MEMORY_GRAPH_TYPE,
    MEMORY_GRAPH_VERSION, ROOT_TYPE_NAME, SIGNATURE,
};
use super::graph::HeapGraph;

/// .NET ticks (100 ns) at the Unix epoch, for `DateTime.Ticks`.
const UNIX_EPOCH_TICKS: i64 = 621_355_968_000_000_000;

/// Writes the snapshot; `out` should be buffered.
pub fn write_gcdump<W: Write>(graph: &HeapGraph, info: &DumpInfo, out: W) -> io::Result<()> {
    let nodes = graph.node_count();
    if nodes >= i32::MAX as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{nodes} objects do not fit a .gcdump file's 32-bit node indices"),
        ));
    }
    let (blob, offsets, type_sizes) = node_blob(graph)?;
    let mut w = Out { inner: out, at: 0 };
    w.string(Some(SIGNATURE))?;

    // GCHeapDump
    w.begin_object(GCHEAPDUMP_TYPE, GCHEAPDUMP_VERSION, GCHEAPDUMP_MIN_READER)?;
    {
        // Graphs.MemoryGraph (Graph.ToStream, then MemoryGraph's part)
        w.begin_object(MEMORY_GRAPH_TYPE, MEMORY_GRAPH_VERSION, 0)?;
        let total: u64 = (0..nodes).map(|i| graph.size(i).min(i32::MAX as u64)).sum();
        w.i64(total as i64)?;
        w.i32(nodes as i32)?; // RootIndex: the extra node after the objects
        w.i32(type_sizes.len() as i32)?;
        for (i, &size) in type_sizes.iter().enumerate() {
            let name = graph
                .type_names
                .get(i)
                .map_or(ROOT_TYPE_NAME, String::as_str);
            w.string(Some(name))?;
            w.i32(size)?;
            w.string(None)?; // ModuleName: not known from the heap walk
        }
        w.i32(offsets.len() as i32)?;
        for &offset in &offsets {
            w.u32(offset)?;
        }
        w.i32(i32::try_from(blob.len()).map_err(|_| too_large("node blob"))?)?;
        w.bytes(&blob)?;
        w.i32(offsets.len() as i32)?;
        for i in 0..nodes {
            w.i64(graph.address(i) as i64)?;
        }
        w.i64(0)?; // the root node
        w.tag(tag::BYTE)?;
        w.bytes(&[u8::from(graph.pointer_size == 8)])?; // Is64Bit
        w.tag(tag::END_OBJECT)?;
    }
    w.bytes(&[u8::from(graph.pointer_size == 8)])?;
    w.f32(1.0)?; // AverageCountMultiplier: every object is in the graph (no sampling)
    w.f32(1.0)?; // AverageSizeMultiplier
    w.tag(tag::NULL_REFERENCE)?; // JSHeapInfo
    w.tag(tag::NULL_REFERENCE)?; // DotNetHeapInfo
    w.string(Some(&format!(
        "{} objects, {} references, {} roots",
        nodes,
        graph.edge_count(),
        graph.roots().len()
    )))?; // CollectionLog
    w.i64(UNIX_EPOCH_TICKS.saturating_add(info.collected_unix_nanos / 100))?;
    w.string(Some(&info.machine_name))?;
    w.string(Some(&info.process_name))?;
    w.i32(info.process_id as i32)?;
    w.i64(0)?; // TotalProcessCommit: not measured
    w.i64(0)?; // TotalProcessWorkingSet: not measured
    w.i32(0)?; // CountMultipliersByType: none
               // Tagged InteropInfo: a skippable region (forward reference 0) holding null.
    w.tag(tag::SKIP_REGION)?;
    w.i32(0)?;
    w.tag(tag::NULL_REFERENCE)?;
    let region_end = w.label()?;
    w.tag(tag::STRING)?;
    w.string(Some(&info.creation_tool))?;
    w.tag(tag::END_OBJECT)?;

    // End of objects, then the forward-reference table and the trailer pointing at it.
    w.tag(tag::END_OBJECT)?;
    let table = w.label()?;
    w.i32(1)?;
    w.u32(region_end)?;
    let trailer = w.label()?;
    w.u32(table)?;
    w.u32(trailer)?;
    w.inner.flush()
}

/// The node records (type and size, children as index deltas; the root last), their offsets in
/// the blob, and each type's size as the graph format records it (the first node's; -1 unused).
fn node_blob(graph: &HeapGraph) -> io::Result<(Vec<u8>, Vec<u32>, Vec<i32>)> {
    let nodes = graph.node_count();
    let root_type = graph.type_names.len();
    let mut type_sizes = vec![-1i32; root_type + 1];
    let mut blob = Vec::with_capacity(nodes * 4);
    let mut offsets = Vec::with_capacity(nodes + 1);
    let mut record = |index: usize,
                      type_index: usize,
                      size: i32,
                      children: &mut dyn Iterator<Item = usize>,
                      count: usize|
     -> io::Result<()> {
        offsets.push(u32::try_from(blob.len()).map_err(|_| too_large("node blob"))?);
        let typed = (type_index as i32) << 1;
        if type_sizes[type_index] < 0 {
            type_sizes[type_index] = size;
        }
        if type_sizes[type_index] == size {
            write_compressed_int(&mut blob, typed);
        } else {
            write_compressed_int(&mut blob, typed | 1);
            write_compressed_int(&mut blob, size);
        }
        write_compressed_int(&mut blob, count as i32);
        for child in children {
            write_compressed_int(&mut blob, child as i32 - index as i32);
        }
        Ok(())
    };
    for i in 0..nodes {
        let refs = graph.references(i);
        let size = graph.size(i).min(i32::MAX as u64) as i32;
        let mut children = refs.iter().map(|&c| c as usize);
        record(
            i,
            graph.node_type(i) as usize,
            size,
            &mut children,
            refs.len(),
        )?;
    }
    let roots = graph.roots();
    record(
        nodes,
        root_type,
        0,
        &mut roots.iter().map(|&c| c as usize),
        roots.len(),
    )?;
    Ok((blob, offsets, type_sizes))
}

fn too_large(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("the {what} exceeds the 2 GiB a .gcdump file can address"),
    )
}

/// The output with its position: FastSerialization labels are 32-bit stream offsets.
struct Out<W> {
    inner: W,
    at: u64,
}

impl<W: Write> Out<W> {
    fn bytes(&mut self, b: &[u8]) -> io::Result<()> {
        self.inner.write_all(b)?;
        self.at += b.len() as u64;
        Ok(())
    }
    fn tag(&mut self, t: u8) -> io::Result<()> {
        self.bytes(&[t])
    }
    fn i32(&mut self, v: i32) -> io::Result<()> {
        self.bytes(&v.to_le_bytes())
    }
    fn u32(&mut self, v: u32) -> io::Result<()> {
        self.bytes(&v.to_le_bytes())
    }
    fn i64(&mut self, v: i64) -> io::Result<()> {
        self.bytes(&v.to_le_bytes())
    }
    fn f32(&mut self, v: f32) -> io::Result<()> {
        self.bytes(&v.to_le_bytes())
    }
    fn label(&self) -> io::Result<u32> {
        u32::try_from(self.at).map_err(|_| too_large("file"))
    }
    fn string(&mut self, s: Option<&str>) -> io::Result<()> {
        let mut encoded = Vec::new();
        let units = s.map(|s| encode_string(s, &mut encoded));
        self.i32(units.map_or(-1, |n| n as i32))?;
        self.bytes(&encoded)
    }
    /// BeginObject, then the object's type written in full (each type is written once per
    /// file here, so never as a back reference).
    fn begin_object(&mut self, type_name: &str, version: i32, min_reader: i32) -> io::Result<()> {
        self.tag(tag::BEGIN_OBJECT)?;
        self.tag(tag::BEGIN_OBJECT)?;
        self.tag(tag::NULL_REFERENCE)?; // the type of a type
        self.i32(version)?;
        self.i32(min_reader)?;
        self.string(Some(type_name))?;
        self.tag(tag::END_OBJECT)
    }
}

/// `Node.WriteCompressedInt`: a signed value in 1 to 5 bytes, high groups first, 0x80 on every
/// byte but the last.
fn write_compressed_int(out: &mut Vec<u8>, value: i32) {
    let fits = |bits: u32| (value << (32 - bits)) >> (32 - bits) == value;
    let len = match () {
        () if fits(7) => 1,
        () if fits(14) => 2,
        () if fits(21) => 3,
        () if fits(28) => 4,
        () => 5,
    };
    for group in (1..len).rev() {
        out.push(((value >> (7 * group)) | 0x80) as u8);
    }
    out.push((value & 0x7f) as u8);
}

/// FastSerialization's string body: each UTF-16 code unit as 1 to 3 UTF-8-style bytes (a
/// surrogate pair as two 3-byte units, as .NET writes them); returns the number of code units.
fn encode_string(s: &str, out: &mut Vec<u8>) -> usize {
    let mut units = 0;
    for c in s.encode_utf16() {
        units += 1;
        if c <= 0x7f {
            out.push(c as u8);
        } else if c <= 0x7ff {
            out.push(0xc0 | (c >> 6) as u8);
            out.push(0x80 | (c & 0x3f) as u8);
        } else {
            out.push(0xe0 | (c >> 12) as u8);
            out.push(0x80 | ((c >> 6) & 0x3f) as u8);
            out.push(0x80 | (c & 0x3f) as u8);
        }
    }
    units
}
