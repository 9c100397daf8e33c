//! Events → named profiles: one stage, used by `record`, `convert`, `top` and the agent.
//!
//! A `ProcessSymbolizer` holds what one process's events say about its code (the code map, fed
//! by method and module events) and, with trace linkage, which span each thread ran. It turns a
//! sampler window's counted stacks into named time samples: each distinct frame named once per
//! output, stacks leaf first, labelled with their thread (and span), valued by the cpu/wall rule.
//! Two outputs fold them:
//! - [`recording`]: the cpu and/or wall [`Profile`](profile::Profile) of a recording (`record`,
//!   `convert`, `top`);
//! - [`process`]: the always-on profile of one process as store [`Batch`](profile::Batch)es
//!   (the agent), with its allocation, exception and lock profiles.
//!
//! # The cpu/wall rule
//! `cpu` counts samples of threads that were running managed code (cooperative mode), `wall`
//! counts every sample; each sample stands for one measured sampling period, so values are
//! nanoseconds of the thread's time.

pub mod process;
pub mod recording;

use std::collections::HashMap;

use collector::activity::{SpanTracker, TrackerLimits};
use collector::samples::{SampleAggregator, StackKey};
use nettrace::events::KnownEvent;
use nettrace::{Event, NettraceError};
use profile::labels;
use profile::span::Span;
use profile::{Function, LabelValue};

use crate::{CodeMap, Frame, FrameKind, FunctionId, FunctionKind, ImageRange};

/// Which time profiles to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeProfiles {
    pub cpu: bool,
    pub wall: bool,
}

impl TimeProfiles {
    /// Whether a sample belongs in these profiles: one without cpu time (a thread outside
    /// managed code, [`SampleAggregator::cpu_ns`]) is left out of a profile of cpu alone.
    fn include(self, has_cpu: bool) -> bool {
        has_cpu || self.wall || !self.cpu
    }
}

/// How well the frames of a profile resolved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resolution {
    /// Frames over all samples (a stack seen n times counts n times).
    pub frames: u64,
    /// Frames that resolved to a method.
    pub methods: u64,
    /// Frames inside a managed module image (`.dll`), no method known.
    pub in_managed_image: u64,
    /// Frames in native code (the runtime's `.so` files) between managed frames: not managed
    /// frames, so never nameable from method events.
    pub native: u64,
    /// Frames in no known code and no known image: code the map has not heard of, such as a
    /// native library loaded since the process's images were last read.
    pub unresolved: u64,
}

impl Resolution {
    /// Percentage of managed frames (all frames but native ones) named by a method.
    pub fn method_percent(&self) -> f64 {
        let managed = self.frames - self.native;
        if managed == 0 {
            return 100.0;
        }
        self.methods as f64 * 100.0 / managed as f64
    }
}

/// The samples of one distinct stack of a sampler window (one thread, one span), named.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TimeSample {
    /// Indices into the [`FunctionTable`] the stack was named into, leaf first.
    stack: Vec<u32>,
    /// `thread_id`, `thread_name` where known, and `trace_id`, `span_id`, `span_name` where
    /// the span is known.
    labels: Vec<(String, LabelValue)>,
    /// How many samples.
    count: u64,
    /// Nanoseconds of cpu time; `None` when the thread was not running managed code.
    cpu: Option<i64>,
    /// Nanoseconds of wall time.
    wall: i64,
}

/// A stack index of a sampler window and the span id its samples ran in.
type StackInSpan = (u32, Option<[u8; 8]>);

/// One process's code map, fed by its method and module events, and, with trace linkage, the
/// span each of its threads ran; see the module documentation.
#[derive(Debug)]
struct ProcessSymbolizer {
    map: CodeMap,
    spans: Option<SpanTracker>,
    /// Events whose payload did not decode, or that the code map refused (malformed ranges);
    /// counted, not fatal.
    rejected: u64,
}

impl ProcessSymbolizer {
    /// `linkage`: join samples to spans, keeping this much span history.
    fn new(linkage: Option<TrackerLimits>) -> Self {
        ProcessSymbolizer {
            map: CodeMap::new(),
            spans: linkage.map(SpanTracker::new),
            rejected: 0,
        }
    }

    /// The process's mapped images, so addresses in no known method still name their module.
    fn set_images(&mut self, images: Vec<ImageRange>) {
        self.map.set_images(images);
    }

    /// Takes one event: span events go to the span tracker, method and module events to the code
    /// map; any other known event is returned for the caller's own profiles. A payload that does
    /// not decode is an error; it and events the code map refuses are counted, not fatal.
    fn observe(&mut self, event: &Event<'_>) -> Result<Option<KnownEvent>, NettraceError> {
        if let Some(spans) = &mut self.spans {
            // Counted in the tracker's stats; one bad payload must not stop the profile.
            let _ = spans.observe(event);
        }
        match event.known().inspect_err(|_| self.rejected += 1)? {
            Some(
                known @ (KnownEvent::Method(_)
                | KnownEvent::Module(_)
                | KnownEvent::R2rEntryPoint(_)),
            ) => {
                let timestamp = event.header.timestamp as u64;
                if crate::nettrace::apply(&mut self.map, &known, timestamp).is_err() {
                    self.rejected += 1;
                }
                Ok(None)
            }
            other => Ok(other),
        }
    }

    /// The named samples of a sampler window in `types`, by the cpu/wall rule (`cpu` weighed by
    /// the kernel's CPU of each thread, where measured), sorted so equal input gives equal output. With trace linkage on and the window's sample times kept, a
    /// stack's samples split by the span their thread ran at each sample's time.
    fn time_samples(
        &self,
        samples: &SampleAggregator,
        types: TimeProfiles,
        thread_names: &HashMap<u64, String>,
        table: &mut FunctionTable,
    ) -> Vec<TimeSample> {
        let period = samples.weight_ns();
        self.stacks_in_spans(samples)
            .into_iter()
            .filter_map(|(key, span, count)| {
                let cpu = samples.cpu_ns(key, count);
                types
                    .include(cpu.is_some())
                    .then_some((key, span, count, cpu))
            })
            .map(|(key, span, count, cpu)| {
                let mut labels = thread_labels(key.thread_id, thread_names);
                if let Some(span) = span {
                    labels.extend([
                        (
                            labels::TRACE_ID.to_string(),
                            LabelValue::Str(span.trace_id.to_string()),
                        ),
                        (
                            labels::SPAN_ID.to_string(),
                            LabelValue::Str(span.span_id.to_string()),
                        ),
                        (
                            labels::SPAN_NAME.to_string(),
                            LabelValue::Str(span.name.to_string()),
                        ),
                    ]);
                }
                TimeSample {
                    stack: table.stack(&self.map, &key.ips, count),
                    labels,
                    count,
                    cpu,
                    wall: (count as i64).saturating_mul(period),
                }
            })
            .collect()
    }

    /// The window's stacks, split by the span each sample ran in when that is known, sorted by
    /// thread, mode, stack and span.
    fn stacks_in_spans<'a>(
        &self,
        samples: &'a SampleAggregator,
    ) -> Vec<(&'a StackKey, Option<Span>, u64)> {
        let mut groups: Vec<(&StackKey, Option<Span>, u64)> = match (&self.spans, samples.times()) {
            (Some(tracker), Some(times)) => {
                let mut keys: Vec<Option<&StackKey>> = Vec::new();
                for (index, key) in samples.stacks_by_index() {
                    let index = index as usize;
                    if keys.len() <= index {
                        keys.resize(index + 1, None);
                    }
                    keys[index] = Some(key);
                }
                let mut counts: HashMap<StackInSpan, (Option<Span>, u64)> = HashMap::new();
                for time in times {
                    let Some(Some(key)) = keys.get(time.stack as usize) else {
                        continue;
                    };
                    let span = tracker.span_at(key.thread_id, time.timestamp);
                    counts
                        .entry((time.stack, span.map(|s| s.span_id.0)))
                        .or_insert_with(|| (span.cloned(), 0))
                        .1 += 1;
                }
                counts
                    .into_iter()
                    .filter_map(|((stack, _), (span, count))| {
                        Some((keys[stack as usize]?, span, count))
                    })
                    .collect()
            }
            _ => samples
                .stacks()
                .map(|(key, count)| (key, None, count))
                .collect(),
        };
        groups.sort_unstable_by(|(a, sa, _), (b, sb, _)| {
            let span = |s: &Option<Span>| s.as_ref().map(|s| (s.trace_id, s.span_id));
            (a.thread_id, a.managed, &a.ips, span(sa)).cmp(&(
                b.thread_id,
                b.managed,
                &b.ips,
                span(sb),
            ))
        });
        groups
    }
}

/// Labels `thread_id` and, where known, `thread_name`.
fn thread_labels(thread_id: u64, thread_names: &HashMap<u64, String>) -> Vec<(String, LabelValue)> {
    let mut labels = vec![(
        labels::THREAD_ID.to_string(),
        LabelValue::Num(thread_id as i64),
    )];
    if let Some(name) = thread_names.get(&thread_id) {
        labels.push((
            labels::THREAD_NAME.to_string(),
            LabelValue::Str(name.clone()),
        ));
    }
    labels
}

/// The functions of one output (a profile, one cycle's batches), each distinct frame named
/// once, and how well the frames resolved.
#[derive(Debug, Default)]
struct FunctionTable {
    /// Frames repeat across stacks: each distinct (function, offset) is named once.
    indices: HashMap<(FunctionId, Option<u64>), u32>,
    functions: Vec<Function>,
    resolution: Resolution,
    /// One stack's frames, reused.
    frames: Vec<Frame>,
}

impl FunctionTable {
    /// The function indices (leaf first) of a stack of IPs seen `weight` times.
    fn stack(&mut self, map: &CodeMap, ips: &[u64], weight: u64) -> Vec<u32> {
        map.symbolize_stack_into(ips, &mut self.frames);
        let mut stack = Vec::with_capacity(self.frames.len());
        for &frame in &self.frames {
            self.resolution.frames += weight;
            // Frames of one function are told apart by their offset in an image, or by their
            // method's entry address for precompiled methods named from the image.
            let offset = match frame.kind {
                FrameKind::Managed { .. } => {
                    self.resolution.methods += weight;
                    None
                }
                FrameKind::ImageMethod { entry } => {
                    self.resolution.methods += weight;
                    Some(entry)
                }
                FrameKind::Unknown { offset, .. } => {
                    if crate::images::is_managed_image(&map.function(frame.function).module) {
                        self.resolution.in_managed_image += weight;
                    } else {
                        self.resolution.native += weight;
                    }
                    Some(offset)
                }
                FrameKind::Unresolved => {
                    self.resolution.unresolved += weight;
                    None
                }
            };
            let functions = &mut self.functions;
            let index = *self
                .indices
                .entry((frame.function, offset))
                .or_insert_with(|| {
                    functions.push(function_of(map, frame));
                    u32::try_from(functions.len() - 1).unwrap_or(u32::MAX)
                });
            stack.push(index);
        }
        stack
    }
}

fn function_of(map: &CodeMap, frame: Frame) -> Function {
    let function = map.function(frame.function);
    let name = match (map.method_name(frame), function.kind) {
        (Some(name), _) => name.to_string(),
        (None, FunctionKind::Unresolved) => labels::UNKNOWN_FRAME.to_string(),
        (None, _) => map.frame_label(frame),
    };
    Function {
        name,
        module: function.module.to_string(),
    }
}

/// A recorded trace of the collector's test fixtures.
#[cfg(test)]
fn fixture(name: &str) -> nettrace::NettraceReader<std::fs::File> {
    let path = format!(
        "{}/../collector/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    nettrace::NettraceReader::new(std::fs::File::open(path).unwrap())
}
