//! One decoded event, borrowing its payload, metadata and stack from the parser.

use super::block::{EventHeader, StackCache, StackIdentity};
use super::error::NettraceError;
use super::events::{decode_known, EventKind, KnownEvent, PayloadReader, ThreadSample};
use super::metadata::EventMetadata;
use super::payload::{decode_payload, decode_payload_fields, NamedValue};
use super::time::Clock;
use super::v6::{LabelCache, LabelList, ThreadInfo, ThreadTable};

/// An event located in the parser's buffer; turned into an [`Event`] by the parser.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StagedEvent {
    pub metadata_index: usize,
    pub offset: u64,
    pub payload_offset: u64,
}

/// One event of the stream. Valid until the parser is fed or advanced again; copy out what
/// must outlive that (typed decoders return owned values).
#[derive(Debug, Clone, Copy)]
pub struct Event<'a> {
    /// The decompressed event header.
    pub header: &'a EventHeader,
    /// The metadata record the event refers to.
    pub metadata: &'a EventMetadata,
    /// Raw payload bytes.
    pub payload: &'a [u8],
    /// Stream offset of the event blob.
    pub offset: u64,
    /// Stream offset of the payload's first byte.
    pub payload_offset: u64,
    pub(crate) stacks: &'a StackCache,
    pub(crate) threads: &'a ThreadTable,
    pub(crate) labels: &'a LabelCache,
    pub clock: &'a Clock,
    pub(crate) pointer_size: u8,
}

impl<'a> Event<'a> {
    /// The event's stack (managed frames, leaf first), if it has one in the current
    /// sequence-point region.
    #[inline]
    pub fn stack(&self) -> Option<Stack<'a>> {
        if self.header.stack_id == 0 {
            return None;
        }
        self.stacks.get(self.header.stack_id).map(|bytes| Stack {
            bytes,
            pointer_size: self.pointer_size,
        })
    }

    /// Names the event's stack for as long as its id names the same frames (see
    /// [`StackIdentity`]); `None` when it has no stack.
    #[inline]
    pub fn stack_identity(&self) -> Option<StackIdentity> {
        (self.header.stack_id != 0).then(|| self.stacks.identity(self.header.stack_id))
    }

    /// V6: the Thread-table row of the thread the event is about (name, OS process and thread).
    pub fn thread(&self) -> Option<&'a ThreadInfo> {
        self.threads.get(self.header.thread_index)
    }

    /// V6: the event's labels (activity ids, W3C trace/span ids, key/values, overrides).
    pub fn labels(&self) -> Option<&'a LabelList> {
        if self.header.label_list_id == 0 {
            return None;
        }
        self.labels.get(self.header.label_list_id)
    }

    /// The event time as nanoseconds since the Unix epoch (UTC).
    #[inline]
    pub fn unix_nanos(&self) -> i64 {
        self.clock.unix_nanos(self.header.timestamp)
    }

    /// Width of pointer-typed payload fields and stack IPs in this trace.
    pub fn pointer_size(&self) -> u8 {
        self.pointer_size
    }

    /// Decodes the payload into named values using the stream's metadata. Native runtime
    /// events have no field descriptions: use [`known`](Event::known) for them.
    pub fn decode(&self) -> Result<Vec<NamedValue<'a>>, NettraceError> {
        decode_payload(
            &self.metadata.fields,
            self.payload,
            self.payload_offset,
            || self.metadata.display_name(),
        )
    }

    /// [`decode`](Event::decode) with only the fields `wanted` names (see
    /// [`decode_payload_fields`]).
    pub(crate) fn decode_fields(
        &self,
        wanted: fn(&str) -> bool,
    ) -> Result<Vec<NamedValue<'a>>, NettraceError> {
        decode_payload_fields(
            &self.metadata.fields,
            self.payload,
            self.payload_offset,
            || self.metadata.display_name(),
            wanted,
        )
    }

    /// Decodes the events clrscope knows (samples, method/module, allocation, exception,
    /// contention, counters, metrics, DiagnosticSource) into typed values; `Ok(None)` for others.
    pub fn known(&self) -> Result<Option<KnownEvent>, NettraceError> {
        decode_known(self)
    }

    /// The sample of a ThreadSample event (`Ok(None)` for other events): what
    /// [`known`](Event::known) gives for it, without building a [`KnownEvent`], for the
    /// thousands of samples a second a sampler window brings.
    pub fn thread_sample(&self) -> Result<Option<ThreadSample>, NettraceError> {
        if self.metadata.kind != EventKind::ThreadSample {
            return Ok(None);
        }
        ThreadSample::decode(PayloadReader::new(self)).map(Some)
    }
}

/// The instruction pointers of one stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stack<'a> {
    bytes: &'a [u8],
    pointer_size: u8,
}

impl<'a> Stack<'a> {
    /// The frames as the stream holds them (little-endian addresses of the trace's pointer size).
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Number of frames.
    pub fn len(&self) -> usize {
        self.bytes.len() / usize::from(self.pointer_size)
    }

    /// True for a stack with no frames.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The IPs, leaf frame first.
    pub fn ips(&self) -> impl ExactSizeIterator<Item = u64> + 'a {
        let wide = self.pointer_size == 8;
        self.bytes
            .chunks_exact(usize::from(self.pointer_size))
            .map(move |c| {
                if wide {
                    u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])
                } else {
                    u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                }
            })
    }

    /// The raw little-endian IP bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }
}
