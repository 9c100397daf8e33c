//! The one error type of the NetTrace parser and decoders.
//!
//! Every variant names the byte offset in the stream (counted from the first byte of the
//! "Nettrace" magic) so that a damaged file can be inspected with a hex dump at that spot.

use std::io;

/// What went wrong while reading a NetTrace stream or decoding an event payload.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NettraceError {
    /// The stream does not start with the `Nettrace` magic.
    #[error(
        "not a nettrace stream: offset 0 holds {found:02x?}, expected the ASCII magic \"Nettrace\""
    )]
    BadMagic {
        /// The first bytes actually read.
        found: Vec<u8>,
    },

    /// The stream uses a NetTrace major version this parser does not read.
    #[error("unsupported nettrace format at offset {offset}: {detail}")]
    UnsupportedFormat {
        /// Stream offset of the offending header.
        offset: u64,
        /// Which version was found and which are supported.
        detail: String,
    },

    /// A FastSerialization tag other than the one the format requires at this point.
    #[error(
        "malformed stream at offset {offset}: expected {expected}, found tag byte {found:#04x}"
    )]
    UnexpectedTag {
        /// Stream offset of the tag byte.
        offset: u64,
        /// The tag the format requires here.
        expected: &'static str,
        /// The byte found instead.
        found: u8,
    },

    /// An object type this parser does not know; its length cannot be known, so parsing stops.
    #[error("unknown object type {name:?} at offset {offset}: a newer writer? known types are Trace, MetadataBlock, EventBlock, StackBlock, SPBlock")]
    UnknownObject {
        /// Stream offset of the object's BeginObject tag.
        offset: u64,
        /// The type name, lossily decoded.
        name: String,
    },

    /// An object whose type declares a version this reader cannot read.
    #[error("{object} at offset {offset} has version {version} and requires reader version {min_reader_version}; this parser reads up to {supported}")]
    UnsupportedVersion {
        /// Object type name.
        object: &'static str,
        /// Stream offset of the object.
        offset: u64,
        /// The version written.
        version: i32,
        /// The minimum reader version written.
        min_reader_version: i32,
        /// The highest version this parser reads.
        supported: i32,
    },

    /// A block larger than [`ParserOptions::max_block_size`](super::ParserOptions::max_block_size).
    #[error("{object} at offset {offset} declares {size} bytes, above the limit of {limit} bytes (raise ParserOptions::max_block_size if the stream is genuine)")]
    BlockTooLarge {
        /// Object type name.
        object: &'static str,
        /// Stream offset of the object.
        offset: u64,
        /// The declared size.
        size: u64,
        /// The configured limit.
        limit: u64,
    },

    /// The input ended in the middle of an object.
    #[error("truncated {object} at offset {offset}: {detail}")]
    Truncated {
        /// What was being read ("EventBlock", "stream header", ...).
        object: &'static str,
        /// Stream offset where that object starts.
        offset: u64,
        /// How much was expected and how much arrived.
        detail: String,
    },

    /// Bytes that violate the format inside an object or event.
    #[error("malformed {object} at offset {offset}: {reason}")]
    Malformed {
        /// What was being read.
        object: &'static str,
        /// Stream offset of the offending bytes.
        offset: u64,
        /// What is wrong with them.
        reason: String,
    },

    /// An event refers to a metadata id that no earlier MetadataBlock defined.
    #[error("event at offset {offset} refers to metadata id {metadata_id}, which no earlier MetadataBlock defined")]
    UnknownMetadata {
        /// Stream offset of the event blob.
        offset: u64,
        /// The dangling id.
        metadata_id: u32,
    },

    /// Holding one more decoded item would take the parser past its memory budget
    /// ([`ParserOptions::memory_budget`](super::ParserOptions::memory_budget)).
    #[error("{what} at offset {offset} do not fit in the parser's memory budget of {limit} bytes (holding {held}); the stream is hostile or damaged, or a genuine one needs a higher budget (ParserOptions::memory_budget; clrscope: --nettrace-budget)")]
    OverBudget {
        /// What the item was: "metadata", "stacks", "threads", "label lists", "trace
        /// properties" or "sequence numbers".
        what: &'static str,
        /// Stream offset of the item.
        offset: u64,
        /// The budget in bytes.
        limit: u64,
        /// What the parser held, by kind, in bytes.
        held: String,
    },

    /// Holding one more item (or a larger input buffer) would take the parsers sharing a budget
    /// past it ([`ParserOptions::shared_budget`](super::ParserOptions::shared_budget)): this
    /// stream stops, the others go on.
    #[error("{what} at offset {offset} do not fit in the memory budget the agent's parsers share, {limit} bytes (all hold {held_all}, this stream {held_here}); this stream stops, the others go on: raise it if many streams need it (ParserOptions::shared_budget; clrscope agent: --nettrace-agent-budget)")]
    OverSharedBudget {
        /// What the item was, as in [`OverBudget`](NettraceError::OverBudget), or "input".
        what: &'static str,
        /// Stream offset of the item.
        offset: u64,
        /// The shared budget in bytes.
        limit: u64,
        /// What all the sharing parsers held, in bytes.
        held_all: u64,
        /// What this parser held, in bytes.
        held_here: u64,
    },

    /// An event payload does not match the layout its metadata or the runtime manifest describes.
    #[error("cannot decode {event} payload at offset {offset}: {reason}")]
    Payload {
        /// Provider and event name (or id).
        event: String,
        /// Stream offset of the payload byte that failed.
        offset: u64,
        /// What did not fit.
        reason: String,
    },

    /// Reading the underlying file or socket failed.
    #[error("reading the nettrace stream failed after {offset} bytes: {source}")]
    Io {
        /// Bytes successfully read before the failure.
        offset: u64,
        /// The I/O error.
        #[source]
        source: io::Error,
    },

    /// The parser was used again after it reported an error; its state is no longer meaningful.
    #[error("the parser stopped at offset {offset} after an earlier error: {reason}")]
    Stopped {
        /// Where the first error happened.
        offset: u64,
        /// The first error's message.
        reason: String,
    },
}

impl NettraceError {
    pub fn malformed(object: &'static str, offset: u64, reason: impl Into<String>) -> Self {
        NettraceError::Malformed {
            object,
            offset,
            reason: reason.into(),
        }
    }

    /// True when the stream asked for more memory than the parser's limits allow
    /// ([`OverBudget`](NettraceError::OverBudget), [`BlockTooLarge`](NettraceError::BlockTooLarge)):
    /// whoever feeds it should stop the stream rather than keep it flowing.
    pub fn is_over_limit(&self) -> bool {
        matches!(
            self,
            NettraceError::OverBudget { .. }
                | NettraceError::OverSharedBudget { .. }
                | NettraceError::BlockTooLarge { .. }
        )
    }

    /// The stream offset the error refers to, where it has one.
    pub fn offset(&self) -> Option<u64> {
        match self {
            NettraceError::BadMagic { .. } => Some(0),
            NettraceError::UnsupportedFormat { offset, .. }
            | NettraceError::UnexpectedTag { offset, .. }
            | NettraceError::UnknownObject { offset, .. }
            | NettraceError::UnsupportedVersion { offset, .. }
            | NettraceError::BlockTooLarge { offset, .. }
            | NettraceError::Truncated { offset, .. }
            | NettraceError::Malformed { offset, .. }
            | NettraceError::UnknownMetadata { offset, .. }
            | NettraceError::OverBudget { offset, .. }
            | NettraceError::OverSharedBudget { offset, .. }
            | NettraceError::Payload { offset, .. }
            | NettraceError::Io { offset, .. }
            | NettraceError::Stopped { offset, .. } => Some(*offset),
        }
    }
}
