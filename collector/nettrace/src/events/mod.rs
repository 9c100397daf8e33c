//! Typed decoders for the events clrscope builds profiles and triggers from.
//!
//! Native runtime events carry no field descriptions in the stream, so their layouts come from
//! the runtime manifest (`src/coreclr/vm/ClrEtwAll.man`, as read by TraceEvent's
//! `ClrTraceEventParser`): ids and layouts are documented on each type. EventSource events
//! (EventCounters, meters, DiagnosticSource) are self-describing and are read by field name, so
//! later versions that append fields still decode; TPL's `SetActivityId` has one fixed field.

mod diagnostic_source;
mod event_counters;
mod logging;
mod meters;
mod runtime;
mod sample;
mod tpl;

pub use diagnostic_source::{DiagnosticSourceEvent, DiagnosticSourceKind};
pub use event_counters::{EventCounter, EventCounterValue};
pub use logging::{LoggingEvent, LoggingEventKind, LOGGING_PROVIDER};
pub use meters::{
    InstrumentEvent, InstrumentEventKind, MetricPublished, MetricValue, MetricsEvent,
    MetricsEventKind, Quantile,
};
pub use runtime::{
    AllocationKind, ContentionStart, ContentionStop, ExceptionThrown, GcAllocationTick,
    MethodEvent, MethodEventKind, ModuleEvent, ModuleEventKind, PdbInfo, R2rEntryPointEvent,
};
pub use sample::{SampleKind, ThreadSample};
pub use tpl::ThreadActivityChange;

use super::cursor::{Cursor, ReadFault};
use super::error::NettraceError;
use super::event::Event;

/// Longest text kept of one field of an event the agent keeps or queues (a log message and its
/// arguments, an exception's type and message, a counter's or meter's names, unit and tags), in
/// bytes: a field is not a blob.
pub const MAX_TEXT_BYTES: usize = 16 * 1024;

/// Most arguments, scope values or tags kept of one event.
pub const MAX_ARGUMENTS: usize = 64;

/// The longest start of `text` of at most `max` bytes that ends on a character boundary.
pub(crate) fn head(text: &str, max: usize) -> &str {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `text` cut to at most [`MAX_TEXT_BYTES`], as kept.
pub(crate) fn bounded(text: &str) -> String {
    head(text, MAX_TEXT_BYTES).to_owned()
}

/// Provider of the runtime's native events.
pub const RUNTIME_PROVIDER: &str = "Microsoft-Windows-DotNETRuntime";
/// Provider of the runtime's rundown events (method/module enumeration at session end).
pub const RUNDOWN_PROVIDER: &str = "Microsoft-Windows-DotNETRuntimeRundown";
/// Provider of the EventPipe sampler.
pub const SAMPLE_PROFILER_PROVIDER: &str = "Microsoft-DotNETCore-SampleProfiler";
/// EventSource behind System.Diagnostics.Metrics instruments.
pub const METRICS_PROVIDER: &str = "System.Diagnostics.Metrics";
/// EventSource bridging DiagnosticSource/Activity events.
pub const DIAGNOSTIC_SOURCE_PROVIDER: &str = "Microsoft-Diagnostics-DiagnosticSource";
/// The Task Parallel Library's EventSource.
pub const TPL_PROVIDER: &str = "System.Threading.Tasks.TplEventSource";

/// A decoded event of a kind clrscope knows.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum KnownEvent {
    /// SampleProfiler ThreadSample (id 0).
    ThreadSample(ThreadSample),
    /// MethodLoadVerbose / MethodUnloadVerbose / MethodDCStartVerbose / MethodDCEndVerbose.
    Method(MethodEvent),
    /// ModuleLoad / ModuleUnload / ModuleDCStart / ModuleDCEnd.
    Module(ModuleEvent),
    /// R2RGetEntryPoint: a ReadyToRun method's code was bound.
    R2rEntryPoint(R2rEntryPointEvent),
    /// GCAllocationTick (V2–V4).
    AllocationTick(GcAllocationTick),
    /// ExceptionThrown_V1.
    ExceptionThrown(ExceptionThrown),
    /// ContentionStart (V1/V2).
    ContentionStart(ContentionStart),
    /// ContentionStop (V0/V1).
    ContentionStop(ContentionStop),
    /// An EventSource `EventCounters` event.
    EventCounter(EventCounter),
    /// A System.Diagnostics.Metrics event.
    Metrics(MetricsEvent),
    /// A DiagnosticSourceEventSource event.
    DiagnosticSource(DiagnosticSourceEvent),
    /// TplEventSource `SetActivityId`: the writing thread's EventSource activity id changes.
    ThreadActivityChange(ThreadActivityChange),
    /// A `Microsoft-Extensions-Logging` message or scope.
    Logging(LoggingEvent),
}

/// Which typed decoder applies to an event, decided once per metadata record
/// ([`EventMetadata::kind`](super::EventMetadata::kind)), so consumers can filter events
/// without decoding payloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum EventKind {
    /// No typed decoder: use [`Event::decode`](super::Event::decode) if self-describing.
    #[default]
    Unknown,
    /// SampleProfiler ThreadSample.
    ThreadSample,
    /// A method load/unload/rundown event.
    Method(MethodEventKind),
    /// A module load/unload/rundown event.
    Module(ModuleEventKind),
    /// R2RGetEntryPoint.
    R2rEntryPoint,
    /// GCAllocationTick.
    AllocationTick,
    /// ExceptionThrown_V1.
    ExceptionThrown,
    /// ContentionStart.
    ContentionStart,
    /// ContentionStop.
    ContentionStop,
    /// EventSource EventCounters.
    EventCounters,
    /// A System.Diagnostics.Metrics event.
    Metrics(MetricsEventKind),
    /// A DiagnosticSourceEventSource event.
    DiagnosticSource(DiagnosticSourceKind),
    /// TplEventSource `SetActivityId`.
    ThreadActivityChange,
    /// A `Microsoft-Extensions-Logging` event.
    Logging(LoggingEventKind),
}

impl EventKind {
    pub(crate) fn classify(provider: &str, event_id: u32, event_name: &str) -> EventKind {
        match provider {
            SAMPLE_PROFILER_PROVIDER if event_id == 0 => EventKind::ThreadSample,
            // Ids: ClrTraceEventParser registrations / ClrEtwAll.man (runtime provider).
            RUNTIME_PROVIDER => match event_id {
                10 => EventKind::AllocationTick,
                80 => EventKind::ExceptionThrown,
                81 => EventKind::ContentionStart,
                91 => EventKind::ContentionStop,
                143 => EventKind::Method(MethodEventKind::Load),
                144 => EventKind::Method(MethodEventKind::Unload),
                152 => EventKind::Module(ModuleEventKind::Load),
                153 => EventKind::Module(ModuleEventKind::Unload),
                159 => EventKind::R2rEntryPoint,
                _ => EventKind::Unknown,
            },
            // Rundown provider: the same method ids mean DCStart/DCEnd; modules shift by one.
            RUNDOWN_PROVIDER => match event_id {
                143 => EventKind::Method(MethodEventKind::DcStart),
                144 => EventKind::Method(MethodEventKind::DcEnd),
                153 => EventKind::Module(ModuleEventKind::DcStart),
                154 => EventKind::Module(ModuleEventKind::DcEnd),
                _ => EventKind::Unknown,
            },
            METRICS_PROVIDER => MetricsEventKind::from_name(event_name)
                .map_or(EventKind::Unknown, EventKind::Metrics),
            DIAGNOSTIC_SOURCE_PROVIDER => DiagnosticSourceKind::from_name(event_name)
                .map_or(EventKind::Unknown, EventKind::DiagnosticSource),
            LOGGING_PROVIDER => LoggingEventKind::from_name(event_name)
                .map_or(EventKind::Unknown, EventKind::Logging),
            TPL_PROVIDER if event_id == tpl::SET_ACTIVITY_ID_EVENT => {
                EventKind::ThreadActivityChange
            }
            _ if event_name == "EventCounters" => EventKind::EventCounters,
            _ => EventKind::Unknown,
        }
    }
}

pub(crate) fn decode_known(ev: &Event<'_>) -> Result<Option<KnownEvent>, NettraceError> {
    let m = ev.metadata;
    let r = || PayloadReader::new(ev);
    Ok(Some(match m.kind {
        EventKind::Unknown => return Ok(None),
        EventKind::ThreadSample => KnownEvent::ThreadSample(ThreadSample::decode(r())?),
        EventKind::Method(kind) => KnownEvent::Method(MethodEvent::decode(kind, r())?),
        EventKind::Module(kind) => KnownEvent::Module(ModuleEvent::decode(kind, r())?),
        EventKind::R2rEntryPoint => KnownEvent::R2rEntryPoint(R2rEntryPointEvent::decode(r())?),
        EventKind::AllocationTick => KnownEvent::AllocationTick(GcAllocationTick::decode(r())?),
        EventKind::ExceptionThrown => KnownEvent::ExceptionThrown(ExceptionThrown::decode(r())?),
        EventKind::ContentionStart => KnownEvent::ContentionStart(ContentionStart::decode(r())?),
        EventKind::ContentionStop => KnownEvent::ContentionStop(ContentionStop::decode(r())?),
        EventKind::EventCounters => KnownEvent::EventCounter(EventCounter::decode(
            &m.provider_name,
            ev.decode_fields(EventCounter::wanted)?,
            ev.payload_offset,
        )?),
        EventKind::Metrics(kind) => KnownEvent::Metrics(MetricsEvent::decode(kind, &ev.decode()?)),
        EventKind::DiagnosticSource(kind) => {
            KnownEvent::DiagnosticSource(DiagnosticSourceEvent::decode(kind, &ev.decode()?))
        }
        EventKind::ThreadActivityChange => {
            KnownEvent::ThreadActivityChange(ThreadActivityChange::decode(r())?)
        }
        EventKind::Logging(kind) => match LoggingEvent::decode(kind, &ev.decode()?) {
            Some(event) => KnownEvent::Logging(event),
            None => return Ok(None),
        },
    }))
}

/// Reads a manifest-laid-out payload, turning short reads into errors that name the event,
/// its version and the offset.
pub struct PayloadReader<'a> {
    c: Cursor<'a>,
    /// Event version from the metadata: decides which trailing fields exist.
    pub version: u32,
    pub pointer_size: u8,
    event: &'a Event<'a>,
}

impl<'a> PayloadReader<'a> {
    pub fn new(event: &'a Event<'a>) -> Self {
        PayloadReader {
            c: Cursor::new(event.payload, event.payload_offset),
            version: event.metadata.version,
            pointer_size: event.pointer_size(),
            event,
        }
    }

    fn err(&self, f: ReadFault) -> NettraceError {
        NettraceError::Payload {
            event: format!(
                "{} (version {})",
                self.event.metadata.display_name(),
                self.version
            ),
            offset: f.offset,
            reason: f.reason,
        }
    }

    /// Bytes left in the payload, to bound counts read from it before allocating.
    pub fn remaining(&self) -> usize {
        self.c.remaining()
    }

    pub fn u8(&mut self) -> Result<u8, NettraceError> {
        self.c.u8().map_err(|f| self.err(f))
    }
    pub fn u16(&mut self) -> Result<u16, NettraceError> {
        self.c.u16().map_err(|f| self.err(f))
    }
    pub fn u32(&mut self) -> Result<u32, NettraceError> {
        self.c.u32().map_err(|f| self.err(f))
    }
    pub fn u64(&mut self) -> Result<u64, NettraceError> {
        self.c.u64().map_err(|f| self.err(f))
    }
    pub fn f64(&mut self) -> Result<f64, NettraceError> {
        self.c.f64().map_err(|f| self.err(f))
    }
    pub fn guid(&mut self) -> Result<profile::guid::Guid, NettraceError> {
        self.c.guid().map_err(|f| self.err(f))
    }
    pub fn pointer(&mut self) -> Result<u64, NettraceError> {
        let ps = self.pointer_size;
        self.c.pointer(ps).map_err(|f| self.err(f))
    }
    pub fn string(&mut self) -> Result<String, NettraceError> {
        self.c
            .utf16z()
            .map(|s| s.to_string_lossy())
            .map_err(|f| self.err(f))
    }
}

#[cfg(test)]
mod tests;
