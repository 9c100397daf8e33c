//! The cpu and wall profiles of a recording (`record`, `convert`, `top`): the events of one
//! session (or file) in, one [`Profile`] out.

use std::collections::HashMap;

use collector::samples::SampleAggregator;
use collector::session::EventObserver;
use nettrace::events::KnownEvent;
use nettrace::{Event, NettraceError, TraceInfo};
use profile::{Profile, ProfileBuilder, ProfileType, ValueType};

use super::{FunctionTable, ProcessSymbolizer, Resolution, TimeProfiles};
use crate::{CodeMap, ImageRange};

/// Turns a stream of events into time profiles: method and module events feed the code map,
/// sampler events the stack counts. Stacks are symbolized at the end, when the rundown has named
/// every method that was still loaded.
#[derive(Debug)]
pub struct Recorder {
    symbolizer: ProcessSymbolizer,
    samples: SampleAggregator,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            symbolizer: ProcessSymbolizer::new(None),
            samples: SampleAggregator::new(0),
        }
    }
}

impl Recorder {
    /// Tells the recorder the trace's facts (the sampler interval) once they are known.
    pub fn set_trace(&mut self, trace: &TraceInfo) {
        self.samples
            .set_expected_interval(trace.expected_cpu_sampling_rate);
    }

    /// The share of a core each thread ran while sampled, measured from `/proc`: weighs its `cpu`
    /// ([`SampleAggregator::set_thread_cpu`]). Call once every sample is in.
    pub fn set_thread_cpu(&mut self, cores_by_thread: &HashMap<u64, f64>) {
        self.samples.set_thread_cpu(cores_by_thread);
    }

    /// Says the sampler's kinds cannot be trusted ([`SampleAggregator::distrust_kinds`]).
    pub fn distrust_kinds(&mut self, why: collector::samples::UntrustedKinds) {
        self.samples.distrust_kinds(why);
    }

    /// The process's mapped images, so addresses in no known method still name their module.
    pub fn set_images(&mut self, images: Vec<ImageRange>) {
        self.symbolizer.set_images(images);
    }

    /// Takes one event; a payload that does not decode is an error (and is counted).
    pub fn observe(&mut self, event: &Event<'_>) -> Result<(), NettraceError> {
        if let Some(KnownEvent::ThreadSample(sample)) = self.symbolizer.observe(event)? {
            self.samples.add(event, &sample);
        }
        Ok(())
    }

    pub fn samples(&self) -> &SampleAggregator {
        &self.samples
    }

    pub fn code_map(&self) -> &CodeMap {
        &self.symbolizer.map
    }

    /// Events whose payload did not decode, or that the code map refused.
    pub fn rejected_events(&self) -> u64 {
        self.symbolizer.rejected
    }

    /// A profile with sample types `samples/count` then `cpu/nanoseconds` and/or
    /// `wall/nanoseconds`, labelled `thread_id` and, where known, `thread_name`.
    pub fn profile(
        &self,
        types: TimeProfiles,
        thread_names: &HashMap<u64, String>,
    ) -> (Profile, Resolution) {
        let mut table = FunctionTable::default();
        let samples = self
            .symbolizer
            .time_samples(&self.samples, types, thread_names, &mut table);

        let time_type = |name: &str| {
            let known = ProfileType::known(name).expect("a known profile type");
            ValueType::new(known.name, known.unit)
        };
        let mut sample_types = vec![ValueType::new("samples", "count")];
        if types.cpu {
            sample_types.push(time_type("cpu"));
        }
        if types.wall {
            sample_types.push(time_type("wall"));
        }
        let period_type = time_type(if types.cpu { "cpu" } else { "wall" });
        let mut builder = ProfileBuilder::new(sample_types, period_type, self.samples.period_ns());
        builder.set_default_sample_type(1.min(usize::from(types.cpu) + usize::from(types.wall)));
        if let Some((start, end)) = self.samples.time_range() {
            builder.set_time_range(start, end - start);
        }

        // The table names each distinct frame; the profile merges frames that read the same.
        let indices: Vec<u32> = table
            .functions
            .into_iter()
            .map(|function| builder.function(function))
            .collect();
        for mut sample in samples {
            for function in &mut sample.stack {
                *function = indices[*function as usize];
            }
            let mut values = vec![sample.count as i64];
            if types.cpu {
                values.push(sample.cpu.unwrap_or(0));
            }
            if types.wall {
                values.push(sample.wall);
            }
            builder.add(sample.stack, sample.labels, &values);
        }
        (builder.build(), table.resolution)
    }
}

impl EventObserver for Recorder {
    fn on_event(&mut self, event: &Event<'_>) {
        // Counted in `rejected_events`; one bad payload must not end a recording.
        let _ = self.observe(event);
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixture;
    use super::*;

    fn record(name: &str) -> Recorder {
        let mut reader = fixture(name);
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
