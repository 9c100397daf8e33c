//! The always-on profile of one process (the agent): events from its sessions in, store batches
//! out.
//!
//! A [`ProcessProfiler`] holds the process's code map (fed by the light session's JIT/Loader
//! events and by rundowns) and counts the stacks of the light session's allocation, exception and
//! contention events. Sampler windows arrive as [`SampleAggregator`]s. Both turn into
//! [`Batch`]es with frames named once per batch, ready for the store's `Store::append`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Instant;

use collector::activity::{SpanTracker, TrackerLimits};
use collector::samples::SampleAggregator;
use collector::signals::{SignalCollector, SPAN_CATCH_UP_MARGIN};
use nettrace::events::KnownEvent;
use nettrace::Event;
use profile::exception::{ExceptionFrame, ExceptionRecord};
use profile::labels;
use profile::{Batch, BatchSample, LabelValue, ProfileType};

use super::{thread_labels, FunctionTable, ProcessSymbolizer, Resolution, TimeProfiles};
use crate::{CodeMap, ImageRange, RundownRefreshPolicy};

/// Distinct event stacks kept between two [`ProcessProfiler::take_event_batches`]; events past it
/// are counted in [`ProcessProfiler::dropped_events`], so a storm of distinct stacks cannot
/// exhaust memory.
pub const MAX_EVENT_STACKS: usize = 50_000;

/// Threads whose ContentionStart waits for its Stop; the runtime emits a Stop for each Start, so
/// only a broken stream (or a session started mid-wait) leaves more.
const MAX_OPEN_CONTENTIONS: usize = 4_096;

/// A rundown is asked for when this many sampled frames fell in a managed image without a known
/// method (ReadyToRun code the live session never named), or, until a rundown has succeeded, in
/// no known code at all (code JIT-compiled before attaching) ...
const RUNDOWN_MIN_MISSES: u64 = 100;
/// ... and the last rundown is at least this old.
const RUNDOWN_MIN_INTERVAL_NS: u64 = 60_000_000_000;

/// Which event profiles the light session feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventProfiles {
    /// `alloc_samples` and `alloc_size` from GCAllocationTick, labelled `type`.
    pub alloc: bool,
    /// `exception` from ExceptionThrown, labelled `type`.
    pub exceptions: bool,
    /// `lock_count` and `lock_time` from ContentionStart/Stop, at the waiter's stack.
    pub locks: bool,
}

impl Default for EventProfiles {
    fn default() -> Self {
        EventProfiles {
            alloc: true,
            exceptions: true,
            locks: true,
        }
    }
}

/// Which of the [`EventProfiles`] an event counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum EventProfileKind {
    Alloc,
    Exception,
    Lock,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct EventKey {
    kind: EventProfileKind,
    /// The allocated or thrown type.
    type_name: Option<Box<str>>,
    thread_id: u64,
    ips: Box<[u64]>,
}

#[derive(Debug, Clone, Copy, Default)]
struct EventTotals {
    count: i64,
    /// Bytes (alloc) or nanoseconds (lock).
    amount: i64,
}

#[derive(Debug)]
struct OpenContention {
    at: i64,
    ips: Box<[u64]>,
}

/// What one cycle of one process produced: its batches and how well their frames resolved.
#[derive(Debug, Default)]
pub struct Batches {
    pub batches: Vec<Batch>,
    pub resolution: Resolution,
}

/// See the module documentation.
#[derive(Debug)]
pub struct ProcessProfiler {
    series: Vec<(String, String)>,
    profiles: EventProfiles,
    symbolizer: ProcessSymbolizer,
    events: HashMap<EventKey, EventTotals>,
    /// When the first event still in `events` happened, Unix nanoseconds.
    events_since: Option<i64>,
    /// The ContentionStart of each thread waiting for a lock.
    contention_starts: HashMap<u64, OpenContention>,
    dropped_events: u64,
    refresh: RundownRefreshPolicy,
    /// A rundown has succeeded: code loaded before attaching is named (later code is named by
    /// the light session's method events).
    named_loaded_code: bool,
    /// Logs and exceptions for the API, the rules and OTLP, when collected.
    signals: Option<SignalCollector>,
    /// With trace linkage: exceptions waiting for the span tracking (another session's stream,
    /// which may run behind) to catch up with them, oldest first.
    waiting_exceptions: VecDeque<WaitingException>,
}

/// An exception of the light session waiting for its span.
#[derive(Debug)]
struct WaitingException {
    record: ExceptionRecord,
    /// Its raw timestamp, as the span tracker keeps them.
    at: i64,
    arrived: Instant,
}

/// Frames of a throwing stack kept at most.
const MAX_EXCEPTION_FRAMES: usize = 128;
/// Exceptions waiting for their span at most (each up to ~36 KB: texts are cut at 16 KiB); past
/// it the oldest is kept without waiting.
const MAX_WAITING_EXCEPTIONS: usize = 512;
/// How long an exception waits for the linkage stream to catch up: longer than a log message
/// (they are few, and were joined exactly when they came in linkage's own stream), since that
/// stream runs seconds behind on a loaded machine.
const MAX_EXCEPTION_SPAN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl ProcessProfiler {
    /// `series`: the labels of every batch (`service_name`, `process_id`, `host_name`);
    /// `linkage`: join samples to spans, keeping this much span history.
    pub fn new(
        series: Vec<(String, String)>,
        profiles: EventProfiles,
        linkage: Option<TrackerLimits>,
    ) -> Self {
        ProcessProfiler {
            series,
            profiles,
            symbolizer: ProcessSymbolizer::new(linkage),
            events: HashMap::new(),
            events_since: None,
            contention_starts: HashMap::new(),
            dropped_events: 0,
            refresh: RundownRefreshPolicy::new(RUNDOWN_MIN_INTERVAL_NS, RUNDOWN_MIN_MISSES),
            named_loaded_code: false,
            signals: None,
            waiting_exceptions: VecDeque::new(),
        }
    }

    /// Also keep the process's log messages and exceptions (named stacks, spans) in `collector`.
    pub fn with_signals(mut self, collector: SignalCollector) -> Self {
        self.signals = Some(collector);
        self
    }

    /// The span tracker, when trace linkage is on.
    pub fn spans(&self) -> Option<&SpanTracker> {
        self.symbolizer.spans.as_ref()
    }

    /// The linkage session's stream ended ([`SpanTracker::stream_ended`]).
    pub fn linkage_stream_ended(&mut self) {
        if let Some(spans) = &mut self.symbolizer.spans {
            spans.stream_ended();
        }
    }

    pub fn series(&self) -> &[(String, String)] {
        &self.series
    }

    /// The process's mapped images, so addresses in no known method still name their module.
    pub fn set_images(&mut self, images: Vec<ImageRange>) {
        self.symbolizer.set_images(images);
    }

    pub fn code_map(&self) -> &CodeMap {
        &self.symbolizer.map
    }

    /// Events with a distinct stack that did not fit under [`MAX_EVENT_STACKS`].
    pub fn dropped_events(&self) -> u64 {
        self.dropped_events
    }

    /// Events whose payload did not decode or that the code map refused.
    pub fn rejected_events(&self) -> u64 {
        self.symbolizer.rejected
    }

    /// Takes one event of the light session or of a rundown.
    pub fn observe(&mut self, event: &Event<'_>) {
        // A payload that does not decode is counted in `rejected_events`.
        let Ok(Some(known)) = self.symbolizer.observe(event) else {
            return;
        };
        let thread = event.header.thread_id;
        let known = match known {
            // Log messages come from the process's logs session (collector::signals::LogsFeed).
            KnownEvent::Logging(_) => return,
            KnownEvent::ExceptionThrown(thrown) => {
                if self.signals.is_some() {
                    let frames = self.exception_frames(event);
                    let record = SignalCollector::exception_record(event, thrown.clone(), frames);
                    self.waiting_exceptions.push_back(WaitingException {
                        record,
                        at: event.header.timestamp,
                        arrived: Instant::now(),
                    });
                    if self.symbolizer.spans.is_none() {
                        self.release_exceptions(&|_| true);
                    }
                }
                KnownEvent::ExceptionThrown(thrown)
            }
            KnownEvent::DiagnosticSource(stop) if stop.kind.is_stop() => {
                if let Some(collector) = &mut self.signals {
                    collector.span_stop(&stop);
                }
                return;
            }
            other => other,
        };
        let (kind, type_name, amount) = match known {
            KnownEvent::AllocationTick(tick) if self.profiles.alloc => {
                let bytes = tick
                    .allocation_amount64
                    .unwrap_or(u64::from(tick.allocation_amount));
                (
                    EventProfileKind::Alloc,
                    tick.type_name,
                    i64::try_from(bytes).unwrap_or(i64::MAX),
                )
            }
            KnownEvent::ExceptionThrown(thrown) if self.profiles.exceptions => {
                (EventProfileKind::Exception, Some(thrown.exception_type), 0)
            }
            KnownEvent::ContentionStart(_) if self.profiles.locks => {
                // The runtime gives ContentionStop no stack: keep the waiter's stack from here.
                if let Some(stack) = event.stack().filter(|s| !s.is_empty()) {
                    if self.contention_starts.len() < MAX_OPEN_CONTENTIONS {
                        let start = OpenContention {
                            at: event.unix_nanos(),
                            ips: stack.ips().collect(),
                        };
                        self.contention_starts.insert(thread, start);
                    }
                }
                return;
            }
            KnownEvent::ContentionStop(stop) if self.profiles.locks => {
                let Some(start) = self.contention_starts.remove(&thread) else {
                    return;
                };
                let waited = match stop.duration_ns {
                    Some(ns) => ns.max(0.0) as i64,
                    None => event.unix_nanos().saturating_sub(start.at).max(0),
                };
                let key = EventKey {
                    kind: EventProfileKind::Lock,
                    type_name: None,
                    thread_id: thread,
                    ips: start.ips,
                };
                self.count(key, waited, start.at);
                return;
            }
            _ => return,
        };
        let Some(stack) = event.stack().filter(|s| !s.is_empty()) else {
            return;
        };
        let ips: Vec<u64> = stack.ips().collect();
        let ips = match kind {
            EventProfileKind::Exception => self.symbolizer.map.throw_site(&ips),
            _ => ips,
        };
        let key = EventKey {
            kind,
            type_name: type_name.map(String::into_boxed_str),
            thread_id: thread,
            ips: ips.into(),
        };
        self.count(key, amount, event.unix_nanos());
    }

    /// Keeps the waiting exceptions whose spans are known by now, in order, joined to them:
    /// `caught_up(unix_nanos)` says whether the span tracking's stream has come that far. One
    /// that waited [`MAX_EXCEPTION_SPAN_WAIT`] is kept with what is known. Called as events of the light
    /// and linkage sessions come, and on a timer.
    pub fn release_exceptions(&mut self, caught_up: &dyn Fn(i64) -> bool) {
        let Some(collector) = &mut self.signals else {
            return;
        };
        let spans = self.symbolizer.spans.as_ref();
        while let Some(first) = self.waiting_exceptions.front() {
            let ready = spans.is_none()
                || self.waiting_exceptions.len() > MAX_WAITING_EXCEPTIONS
                || first.arrived.elapsed() >= MAX_EXCEPTION_SPAN_WAIT
                || caught_up(first.record.unix_nanos.saturating_add(SPAN_CATCH_UP_MARGIN));
            if !ready {
                break;
            }
            let Some(mut waiting) = self.waiting_exceptions.pop_front() else {
                break;
            };
            waiting.record.span = spans
                .and_then(|spans| spans.span_at(waiting.record.thread_id, waiting.at))
                .cloned();
            collector.exception(waiting.record);
        }
    }

    /// The managed frames of an event's stack, named, innermost first.
    fn exception_frames(&self, event: &Event<'_>) -> Vec<ExceptionFrame> {
        let Some(stack) = event.stack() else {
            return Vec::new();
        };
        let ips: Vec<u64> = stack.ips().collect();
        let map = &self.symbolizer.map;
        map.symbolize_stack(&map.throw_site(&ips))
            .into_iter()
            .filter(|frame| matches!(frame.kind, crate::FrameKind::Managed { .. }))
            .take(MAX_EXCEPTION_FRAMES)
            .map(|frame| {
                let function = map.function(frame.function);
                ExceptionFrame {
                    method_name: function.names().shared_display().clone(),
                    module_name: function.module.clone(),
                }
            })
            .collect()
    }

    fn count(&mut self, key: EventKey, amount: i64, at_unix_nanos: i64) {
        let full = self.events.len() >= MAX_EVENT_STACKS;
        match self.events.get_mut(&key) {
            Some(totals) => {
                totals.count += 1;
                totals.amount = totals.amount.saturating_add(amount);
            }
            None if full => {
                self.dropped_events += 1;
                return;
            }
            None => {
                self.events.insert(key, EventTotals { count: 1, amount });
            }
        }
        self.events_since.get_or_insert(at_unix_nanos);
    }

    /// Whether event profiles counted anything since [`ProcessProfiler::take_event_batches`]
    /// was last called.
    pub fn has_event_samples(&self) -> bool {
        self.events_since.is_some()
    }

    /// The threads of the event profiles' samples counted since
    /// [`ProcessProfiler::take_event_batches`] was last called: the threads whose names they need.
    pub fn event_sample_threads(&self) -> Vec<u64> {
        let threads: HashSet<u64> = self.events.keys().map(|key| key.thread_id).collect();
        threads.into_iter().collect()
    }

    /// The batches of the event profiles counted since the last call, then starts afresh.
    pub fn take_event_batches(&mut self, thread_names: &HashMap<u64, String>) -> Batches {
        let events = std::mem::take(&mut self.events);
        let Some(timestamp) = self.events_since.take() else {
            return Batches::default();
        };
        let mut table = FunctionTable::default();
        let mut by_type: HashMap<&'static str, Vec<BatchSample>> = HashMap::new();
        // Sorted so equal input gives equal batches.
        let mut events: Vec<_> = events.into_iter().collect();
        events.sort_unstable_by(|(a, _), (b, _)| {
            (a.kind as u8, &a.type_name, a.thread_id, &a.ips).cmp(&(
                b.kind as u8,
                &b.type_name,
                b.thread_id,
                &b.ips,
            ))
        });
        for (key, totals) in events {
            let stack = table.stack(&self.symbolizer.map, &key.ips, totals.count as u64);
            let mut labels = thread_labels(key.thread_id, thread_names);
            if let Some(type_name) = key.type_name {
                labels.push((labels::TYPE.to_string(), LabelValue::Str(type_name.into())));
            }
            let mut push = |profile_type: &'static str, value: i64| {
                by_type.entry(profile_type).or_default().push(BatchSample {
                    stack: stack.clone(),
                    value,
                    labels: labels.clone(),
                });
            };
            match key.kind {
                EventProfileKind::Alloc => {
                    push("alloc_samples", totals.count);
                    push("alloc_size", totals.amount);
                }
                EventProfileKind::Exception => push("exception", totals.count),
                EventProfileKind::Lock => {
                    push("lock_count", totals.count);
                    push("lock_time", totals.amount);
                }
            }
        }
        let mut types: Vec<_> = by_type.into_iter().collect();
        types.sort_unstable_by_key(|(name, _)| *name);
        self.finish(table, timestamp, types)
    }

    /// The `cpu` and `wall` batches of one sampler window, by the cpu/wall rule. With trace
    /// linkage on and the window's sample times kept, each sample also carries the span its
    /// thread ran at that time (`trace_id`, `span_id`, `span_name`).
    pub fn sample_batches(
        &mut self,
        samples: &SampleAggregator,
        thread_names: &HashMap<u64, String>,
    ) -> Batches {
        let Some((timestamp, _)) = samples.time_range() else {
            return Batches::default();
        };
        let mut table = FunctionTable::default();
        let both = TimeProfiles {
            cpu: true,
            wall: true,
        };
        let mut cpu = Vec::new();
        let mut wall = Vec::new();
        for sample in self
            .symbolizer
            .time_samples(samples, both, thread_names, &mut table)
        {
            let batch_sample = |value| BatchSample {
                stack: sample.stack.clone(),
                value,
                labels: sample.labels.clone(),
            };
            if let Some(value) = sample.cpu {
                cpu.push(batch_sample(value));
            }
            wall.push(batch_sample(sample.wall));
        }
        let batches = self.finish(table, timestamp, vec![("cpu", cpu), ("wall", wall)]);
        // Until a rundown has named the code loaded before attaching, code the map has not heard
        // of may be that code (methods JIT-compiled before the light session started).
        let unnamed_jit = match self.named_loaded_code {
            true => 0,
            false => batches.resolution.unresolved,
        };
        self.refresh
            .record_misses(batches.resolution.in_managed_image + unnamed_jit);
        batches
    }

    /// Whether code the sampler saw unnamed is worth a rundown to name it;
    /// `now_ns` is a monotonic clock.
    pub fn wants_rundown(&mut self, now_ns: u64) -> bool {
        self.refresh.should_refresh(now_ns)
    }

    /// How the rundown [`Self::wants_rundown`] asked for went: a failed one is retried later
    /// and later (see [`crate::refresh`]).
    pub fn rundown_done(&mut self, succeeded: bool) {
        match succeeded {
            true => self.refresh.record_success(),
            false => self.refresh.record_failure(),
        }
        self.named_loaded_code |= succeeded;
    }

    /// Gives back the room the code map's tables grew beyond what they hold (call after a
    /// rundown; see [`CodeMap::shrink_to_fit`]).
    pub fn shrink_to_fit(&mut self) {
        self.symbolizer.map.shrink_to_fit();
    }

    fn finish(
        &self,
        table: FunctionTable,
        timestamp_unix_nanos: i64,
        types: Vec<(&'static str, Vec<BatchSample>)>,
    ) -> Batches {
        let batches = types
            .into_iter()
            .filter(|(_, samples)| !samples.is_empty())
            .map(|(name, samples)| Batch {
                series: self.series.clone(),
                profile_type: ProfileType::known(name).expect("a known profile type"),
                timestamp_unix_nanos,
                functions: table.functions.clone(),
                samples,
            })
            .collect();
        Batches {
            batches,
            resolution: table.resolution,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixture;
    use super::*;

    fn series() -> Vec<(String, String)> {
        vec![
            ("service_name".into(), "test".into()),
            ("process_id".into(), "1".into()),
        ]
    }

    fn top_leaf(batch: &Batch) -> (String, i64) {
        let mut by_leaf: HashMap<&str, i64> = HashMap::new();
        for s in &batch.samples {
            *by_leaf
                .entry(&batch.functions[s.stack[0] as usize].name)
                .or_default() += s.value;
        }
        let (name, value) = by_leaf.into_iter().max_by_key(|(_, v)| *v).unwrap();
        (name.to_string(), value)
    }

    #[test]
    fn sampler_window_becomes_cpu_and_wall_batches() {
        let mut reader = fixture("cpuhot-jit-rundown.nettrace");
        let mut profiler = ProcessProfiler::new(series(), EventProfiles::default(), None);
        let mut samples = SampleAggregator::new(0);
        while let Some(event) = reader.next_event().unwrap() {
            match event.known() {
                Ok(Some(KnownEvent::ThreadSample(s))) => samples.add(&event, &s),
                _ => profiler.observe(&event),
            }
        }
        let out = profiler.sample_batches(&samples, &HashMap::new());
        let names: Vec<&str> = out
            .batches
            .iter()
            .map(|b| b.profile_type.name.as_str())
            .collect();
        assert_eq!(names, ["cpu", "wall"]);
        assert!(
            out.resolution.method_percent() >= 99.0,
            "{:?}",
            out.resolution
        );
        let cpu = &out.batches[0];
        assert_eq!(cpu.series, series());
        let total: i64 = cpu.samples.iter().map(|s| s.value).sum();
        let (hot, value) = top_leaf(cpu);
        assert_eq!(hot, "CpuHot.Program.SpinAlpha(Spinner)");
        assert!(value * 100 / total >= 90);
        let wall_total: i64 = out.batches[1].samples.iter().map(|s| s.value).sum();
        assert!(wall_total > total);
        assert_eq!(
            cpu.timestamp_unix_nanos,
            samples.time_range().unwrap().0,
            "a batch is stamped with its first sample"
        );
    }

    #[test]
    fn code_unheard_of_asks_for_a_rundown_until_one_succeeds() {
        // Samples alone: no method events, no images, so no frame resolves (as code JIT-compiled
        // before attaching, when the attach-time rundown failed).
        let samples_only = || {
            let mut reader = fixture("cpuhot-jit-rundown.nettrace");
            let mut samples = SampleAggregator::new(0);
            while let Some(event) = reader.next_event().unwrap() {
                if let Ok(Some(KnownEvent::ThreadSample(s))) = event.known() {
                    samples.add(&event, &s);
                }
            }
            samples
        };
        let mut failed = ProcessProfiler::new(series(), EventProfiles::default(), None);
        failed.rundown_done(false);
        let out = failed.sample_batches(&samples_only(), &HashMap::new());
        assert!(
            out.resolution.unresolved >= RUNDOWN_MIN_MISSES,
            "{:?}",
            out.resolution
        );
        assert!(
            failed.wants_rundown(0),
            "no rundown has named loaded code yet"
        );

        let mut named = ProcessProfiler::new(series(), EventProfiles::default(), None);
        named.rundown_done(true);
        named.sample_batches(&samples_only(), &HashMap::new());
        assert!(
            !named.wants_rundown(0),
            "after a rundown, code in no image is native code, which a rundown does not name"
        );
    }

    #[test]
    fn exceptions_and_locks_become_typed_batches_once() {
        let mut reader = fixture("faults.nettrace");
        let mut profiler = ProcessProfiler::new(series(), EventProfiles::default(), None);
        while let Some(event) = reader.next_event().unwrap() {
            profiler.observe(&event);
        }
        let out = profiler.take_event_batches(&HashMap::new());
        let by_name: HashMap<&str, &Batch> = out
            .batches
            .iter()
            .map(|b| (b.profile_type.name.as_str(), b))
            .collect();
        let exception = by_name["exception"];
        let types: std::collections::BTreeSet<String> = exception
            .samples
            .iter()
            .flat_map(|s| &s.labels)
            .filter(|(k, _)| k == "type")
            .map(|(_, v)| format!("{v:?}"))
            .collect();
        assert!(
            types
                .iter()
                .any(|t| t.contains("Faults.InjectedFaultException")),
            "{types:?}"
        );
        let lock_time: i64 = by_name["lock_time"].samples.iter().map(|s| s.value).sum();
        let lock_count: i64 = by_name["lock_count"].samples.iter().map(|s| s.value).sum();
        assert!(
            lock_count > 0 && lock_time > lock_count * 1_000,
            "{lock_count} {lock_time}"
        );
        assert!(profiler
            .take_event_batches(&HashMap::new())
            .batches
            .is_empty());
    }

    #[test]
    fn samples_carry_the_span_their_thread_ran() {
        for runtime in ["net8", "net9", "net10", "net11"] {
            samples_carry_the_span_of(runtime);
        }
    }

    /// The linkage fixture recorded from AsyncWeb (ASP.NET Core) on `runtime`.
    fn samples_carry_the_span_of(runtime: &str) {
        let mut reader = fixture(&format!("{runtime}/asyncweb-linkage.nettrace"));
        let linkage = Some(TrackerLimits::default());
        let mut profiler = ProcessProfiler::new(series(), EventProfiles::default(), linkage);
        let mut samples = SampleAggregator::new(0).keep_times();
        while let Some(event) = reader.next_event().unwrap() {
            match event.known() {
                Ok(Some(KnownEvent::ThreadSample(s))) => samples.add(&event, &s),
                _ => profiler.observe(&event),
            }
        }
        let requests = std::fs::read_to_string(format!(
            "{}/../collector/tests/fixtures/{runtime}/asyncweb-linkage.requests.jsonl",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        let out = profiler.sample_batches(&samples, &HashMap::new());
        let wall = out
            .batches
            .iter()
            .find(|b| b.profile_type.name == "wall")
            .unwrap();
        let label = |s: &BatchSample, name: &str| {
            s.labels
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| match v {
                    LabelValue::Str(text) => text.clone(),
                    LabelValue::Num(n) => n.to_string(),
                })
        };
        let spanned: Vec<&BatchSample> = wall
            .samples
            .iter()
            .filter(|s| label(s, "span_id").is_some())
            .collect();
        assert!(!spanned.is_empty());
        for sample in &spanned {
            let span_id = label(sample, "span_id").unwrap();
            let trace_id = label(sample, "trace_id").unwrap();
            // Every span the samples name is a request the target logged (or its hosting span).
            assert!(
                requests.contains(&span_id) && requests.contains(&trace_id),
                "{runtime}: {span_id} / {trace_id} not among the requests"
            );
            assert!(label(sample, "span_name").is_some_and(|n| !n.is_empty()));
        }
        // Splitting by span keeps every sample.
        let total: i64 = wall.samples.iter().map(|s| s.value).sum();
        assert_eq!(total, samples.samples() as i64 * samples.period_ns());
    }

    #[test]
    fn switched_off_profiles_count_nothing() {
        let mut reader = fixture("faults.nettrace");
        let off = EventProfiles {
            alloc: false,
            exceptions: false,
            locks: false,
        };
        let mut profiler = ProcessProfiler::new(series(), off, None);
        while let Some(event) = reader.next_event().unwrap() {
            profiler.observe(&event);
        }
        assert!(profiler
            .take_event_batches(&HashMap::new())
            .batches
            .is_empty());
    }
}
