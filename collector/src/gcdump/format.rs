//! Names and numbers of the `.gcdump` format (FastSerialization + PerfView's GCHeapDump and
//! MemoryGraph), shared by the writer and the reader; the encodings themselves are each side's own.

/// The stream's first string.
pub(crate) const SIGNATURE: &str = "!FastSerialization.1";
/// Entry object type (no namespace) and the version PerfView writes: 10, readable by readers of
/// version 8 and up.
pub(crate) const GCHEAPDUMP_TYPE: &str = "GCHeapDump";
pub(crate) const GCHEAPDUMP_VERSION: i32 = 10;
pub(crate) const GCHEAPDUMP_MIN_READER: i32 = 8;
/// The graph object; version 1, and minimum reader version 0 because no deferred types are used.
pub(crate) const MEMORY_GRAPH_TYPE: &str = "Graphs.MemoryGraph";
pub(crate) const MEMORY_GRAPH_VERSION: i32 = 1;
/// The type of the root node, named as dotnet-gcdump names it.
pub(crate) const ROOT_TYPE_NAME: &str = "[.NET Roots]";

/// FastSerialization tags (`Tags` in FastSerialization.cs).
pub(crate) mod tag {
    pub const NULL_REFERENCE: u8 = 1;
    pub const OBJECT_REFERENCE: u8 = 2;
    pub const BEGIN_OBJECT: u8 = 4;
    pub const END_OBJECT: u8 = 6;
    pub const BYTE: u8 = 8;
    pub const INT16: u8 = 9;
    pub const INT32: u8 = 10;
    pub const INT64: u8 = 11;
    pub const SKIP_REGION: u8 = 12;
    pub const STRING: u8 = 13;
    pub const BLOB: u8 = 14;
}

/// What a `.gcdump` file says about where its snapshot came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpInfo {
    pub process_id: u32,
    pub process_name: String,
    pub machine_name: String,
    /// When the snapshot was taken (file precision: 100 ns).
    pub collected_unix_nanos: i64,
    /// The tool that wrote the file.
    pub creation_tool: String,
}
