//! CPU and wall profiles from the sampler's counted stacks and a process's code map.
//!
//! `cpu` counts samples of threads that were running managed code (cooperative mode), `wall`
//! counts every sample; each sample stands for one measured sampling period, so values are
//! nanoseconds of the thread's time.

use std::collections::HashMap;

use crate::{CodeMap, Frame, FrameKind, FunctionId, FunctionKind, ImageRange};
use collector::nettrace::events::KnownEvent;
use collector::nettrace::{Event, NettraceError, TraceInfo};
use collector::samples::SampleAggregator;
use collector::session::EventObserver;

use profile::labels;
use profile::{Function, LabelValue, Profile, ProfileBuilder, ValueType};

/// Which time profiles to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeProfiles {
    pub cpu: bool,
    pub wall: bool,
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

/// Turns a stream of events into time profiles: method and module events feed the code map,
/// sampler events the stack counts. Stacks are symbolized at the end, when the rundown has named
/// every method that was still loaded.
#[derive(Debug)]
pub struct Recorder {
    map: CodeMap,
    samples: SampleAggregator,
    /// Events whose payload did not decode, or that the code map rejected (malformed ranges);
    /// counted, not fatal.
    rejected: u64,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            map: CodeMap::new(),
            samples: SampleAggregator::new(0),
            rejected: 0,
        }
    }
}

impl Recorder {
    /// Tells the recorder the trace's facts (the sampler interval) once they are known.
    pub fn set_trace(&mut self, trace: &TraceInfo) {
        self.samples
            .set_expected_interval(trace.expected_cpu_sampling_rate);
    }

    /// The process's mapped images, so addresses in no known method still name their module.
    pub fn set_images(&mut self, images: Vec<ImageRange>) {
        self.map.set_images(images);
    }

    /// Takes one event; a payload that does not decode is an error (and is counted).
    pub fn observe(&mut self, event: &Event<'_>) -> Result<(), NettraceError> {
        let known = event.known().inspect_err(|_| self.rejected += 1)?;
        match known {
            Some(KnownEvent::ThreadSample(sample)) => self.samples.add(event, &sample),
            Some(known) => {
                let timestamp = event.header.timestamp as u64;
                if crate::nettrace::apply(&mut self.map, &known, timestamp).is_err() {
                    self.rejected += 1;
                }
            }
            None => {}
        }
        Ok(())
    }

    pub fn samples(&self) -> &SampleAggregator {
        &self.samples
    }

    pub fn code_map(&self) -> &CodeMap {
        &self.map
    }

    pub fn rejected_events(&self) -> u64 {
        self.rejected
    }

    pub fn profile(
        &self,
        types: TimeProfiles,
        thread_names: &HashMap<u64, String>,
    ) -> (Profile, Resolution) {
        time_profile(&self.samples, &self.map, types, thread_names)
    }
}

impl EventObserver for Recorder {
    fn on_event(&mut self, event: &Event<'_>) {
        // Counted in `rejected_events`; one bad payload must not end a recording.
        let _ = self.observe(event);
    }
}

/// Builds a profile with sample types `samples/count` then `cpu/nanoseconds` and/or
/// `wall/nanoseconds`, labelled `thread_id` and, where known, `thread_name`.
pub fn time_profile(
    samples: &SampleAggregator,
    map: &CodeMap,
    types: TimeProfiles,
    thread_names: &HashMap<u64, String>,
) -> (Profile, Resolution) {
    let period = samples.period_ns();
    let mut sample_types = vec![ValueType::new("samples", "count")];
    if types.cpu {
        sample_types.push(ValueType::new("cpu", "nanoseconds"));
    }
    if types.wall {
        sample_types.push(ValueType::new("wall", "nanoseconds"));
    }
    let period_kind = if types.cpu { "cpu" } else { "wall" };
    let mut builder = ProfileBuilder::new(
        sample_types,
        ValueType::new(period_kind, "nanoseconds"),
        period,
    );
    builder.set_default_sample_type(1.min(usize::from(types.cpu) + usize::from(types.wall)));
    if let Some((start, end)) = samples.time_range() {
        builder.set_time_range(start, end - start);
    }

    let mut namer = FrameNamer::default();
    // Stack order decides function and sample order: sort so equal input gives equal output.
    let mut stacks: Vec<_> = samples.stacks().collect();
    stacks.sort_unstable_by(|(a, _), (b, _)| {
        (a.thread_id, a.managed, &a.ips).cmp(&(b.thread_id, b.managed, &b.ips))
    });
    for (key, count) in stacks {
        if types.cpu && !types.wall && !key.managed {
            continue;
        }
        let stack = namer.stack(map, &key.ips, count, |f| builder.function(f));
        let count_i = count as i64;
        let mut values = vec![count_i];
        if types.cpu {
            values.push(if key.managed { count_i * period } else { 0 });
        }
        if types.wall {
            values.push(count_i * period);
        }
        builder.add(stack, thread_labels(key.thread_id, thread_names), &values);
    }
    (builder.build(), namer.resolution)
}

/// Labels `thread_id` and, where known, `thread_name`.
pub fn thread_labels(
    thread_id: u64,
    thread_names: &HashMap<u64, String>,
) -> Vec<(String, LabelValue)> {
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

/// Names the frames of raw stacks, each distinct frame once, and counts how well they resolved.
#[derive(Debug, Default)]
pub struct FrameNamer {
    /// Frames repeat across stacks: each distinct (function, offset) is named once.
    names: HashMap<(FunctionId, Option<u64>), u32>,
    frames: Vec<Frame>,
    pub resolution: Resolution,
}

impl FrameNamer {
    /// The function indices (leaf first) of a stack of IPs seen `weight` times; `intern` adds a
    /// function the namer has not named yet to the caller's table and returns its index.
    pub fn stack(
        &mut self,
        map: &CodeMap,
        ips: &[u64],
        weight: u64,
        mut intern: impl FnMut(Function) -> u32,
    ) -> Vec<u32> {
        map.symbolize_stack_into(ips, &mut self.frames);
        let mut stack = Vec::with_capacity(self.frames.len());
        for &frame in &self.frames {
            self.resolution.frames += weight;
            let offset = match frame.kind {
                FrameKind::Managed { .. } => {
                    self.resolution.methods += weight;
                    None
                }
                FrameKind::Unknown { offset, .. } => {
                    if is_managed_image(&map.function(frame.function).module) {
                        self.resolution.in_managed_image += weight;
                    } else {
                        self.resolution.native += weight;
                    }
                    Some(offset)
                }
                FrameKind::Unresolved => None,
            };
            let index = *self
                .names
                .entry((frame.function, offset))
                .or_insert_with(|| intern(function_of(map, frame)));
            stack.push(index);
        }
        stack
    }
}

/// .NET modules are `.dll` (or `.exe`) files; the runtime's own code lives in `.so` files.
fn is_managed_image(file_name: &str) -> bool {
    let lower = file_name.to_ascii_lowercase();
    lower.ends_with(".dll") || lower.ends_with(".exe")
}

fn function_of(map: &CodeMap, frame: Frame) -> Function {
    let function = map.function(frame.function);
    let name = match (frame.kind, function.kind) {
        (FrameKind::Managed { .. }, _) => function.display_name().to_string(),
        (_, FunctionKind::Unresolved) => "[unknown]".to_string(),
        _ => map.frame_label(frame),
    };
    Function {
        name,
        module: function.module.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use collector::nettrace::NettraceReader;

    fn record(fixture: &str) -> Recorder {
        let path = format!(
            "{}/../collector/tests/fixtures/{fixture}",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut reader = NettraceReader::new(std::fs::File::open(path).unwrap());
        let mut recorder = Recorder::default();
        while let Some(event) = reader.next_event().unwrap() {
            recorder.observe(&event).unwrap();
        }
        recorder.set_trace(reader.parser().trace().unwrap());
        recorder
    }

    #[test]
    fn cpu_profile_of_a_recorded_trace() {
        let recorder = record("cpuhot-jit-rundown.nettrace");
        let types = TimeProfiles {
            cpu: true,
            wall: true,
        };
        let (profile, resolution) = recorder.profile(types, &HashMap::new());
        assert!(resolution.method_percent() >= 99.0, "{resolution:?}");
        let period = profile.period;
        assert_eq!(period, recorder.samples().period_ns());
        let names: Vec<&str> = profile
            .sample_types
            .iter()
            .map(|t| t.kind.as_str())
            .collect();
        assert_eq!(names, ["samples", "cpu", "wall"]);
        assert_eq!(profile.default_sample_type, 1);

        // Self cpu per leaf function: the spinning method dominates.
        let mut self_cpu: HashMap<&str, i64> = HashMap::new();
        for sample in &profile.samples {
            let leaf = &profile.functions[sample.stack[0] as usize];
            *self_cpu.entry(leaf.name.as_str()).or_default() += sample.values[1];
        }
        let total: i64 = self_cpu.values().sum();
        let hot = self_cpu["CpuHot.Program.SpinAlpha(Spinner)"];
        assert!(hot * 100 / total >= 90, "{self_cpu:?}");
        assert_eq!(total, profile.total(1));
        // wall counts every sample, cpu only managed ones.
        assert!(profile.total(2) > profile.total(1));
        let hot_fn = profile
            .functions
            .iter()
            .find(|f| f.name.starts_with("CpuHot.Program.SpinAlpha"))
            .unwrap();
        assert_eq!(hot_fn.module, "CpuHot.dll");
    }
}
