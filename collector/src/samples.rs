//! Raw samples from the EventPipe sampler: stacks of instruction pointers per thread, counted,
//! with the sampling period measured from the sampler's own ticks.
//!
//! The sampler suspends the runtime, writes one ThreadSample per managed thread, resumes, then
//! sleeps its interval (1 ms by default), so the real period is the interval plus the walk time.
//! Samples of one tick share a timestamp to within microseconds; a gap larger than half the
//! interval starts a new tick. The measured period is the mean distance between ticks, so
//! `samples × period` is true time even when ticks are late or skipped.

use std::collections::HashMap;

use nettrace::events::{SampleKind, ThreadSample};
use nettrace::{Event, Stack, StackIdentity};

/// The sampler interval assumed when the trace does not state one (the runtime's default).
pub const DEFAULT_INTERVAL_NS: i64 = 1_000_000;

/// Whether a sample taken at `at_ns` starts a new tick of a sampler ticking every `interval_ns`,
/// the previous sample having been taken at `previous_ns` (all Unix nanoseconds): the rule that
/// groups samples into ticks, for counting them here and for taking one tick's stacks
/// ([`crate::artifacts::collect_stack_tick`]).
pub fn starts_tick(previous_ns: Option<i64>, at_ns: i64, interval_ns: i64) -> bool {
    previous_ns.is_none_or(|previous| at_ns.saturating_sub(previous) > interval_ns / 2)
}

/// The raw stack of one thread in one ThreadSample event: what samples are counted by, and what
/// one tick's stacks are.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StackKey {
    pub thread_id: u64,
    /// The thread ran managed code (cooperative mode) when suspended; else it was in native code,
    /// blocked or waiting (preemptive mode).
    pub managed: bool,
    /// Instruction pointers, leaf first; empty when the event has no stack.
    pub ips: Box<[u64]>,
}

impl StackKey {
    /// The sampled thread's stack: `event` is the ThreadSample event, `sample` its payload.
    pub fn of(event: &Event<'_>, sample: &ThreadSample) -> StackKey {
        StackKey {
            thread_id: event.header.thread_id,
            managed: sample.kind == SampleKind::Managed,
            ips: event.stack().map(|s| s.ips().collect()).unwrap_or_default(),
        }
    }
}

/// A fast hash of a sample's thread, mode and raw stack bytes (FxHash's mixing, a word at a
/// time): the aggregator's first look-up, confirmed by comparing the stack itself.
fn stack_hash(thread_id: u64, managed: bool, bytes: &[u8]) -> u64 {
    const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;
    let mix = |hash: u64, word: u64| (hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    let mut hash = mix(mix(0, thread_id), u64::from(managed));
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        hash = mix(
            hash,
            u64::from_le_bytes(word.try_into().unwrap_or_default()),
        );
    }
    for &byte in words.remainder() {
        hash = mix(hash, u64::from(byte));
    }
    hash
}

/// Slots of [`SampleAggregator::remembered`].
const REMEMBERED_STACKS: usize = 256;

/// A stack id of the stream, and the stack of `keys` it named for one thread and mode.
#[derive(Debug, Clone, Copy)]
struct RememberedStack {
    stack: StackIdentity,
    thread_id: u64,
    managed: bool,
    index: u32,
}

/// When one sample was taken: an index into [`SampleAggregator::stacks_by_index`] and the
/// sample's raw timestamp (the runtime's QPC ticks, shared by all sessions of one process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleTime {
    pub stack: u32,
    pub timestamp: i64,
}

/// Counts the sampler's stacks and measures its period.
#[derive(Debug, Default)]
pub struct SampleAggregator {
    /// The distinct stacks, in the order first seen; their indices index `counts`.
    keys: Vec<StackKey>,
    /// A stack's index by the hash of its thread, mode and frames ([`stack_hash`]): a sample
    /// of a stack seen before is counted without building its key, which on a process with
    /// many waiting threads is nearly every sample.
    by_hash: HashMap<u64, u32>,
    /// Stacks whose hash an earlier different stack holds in `by_hash`.
    collided: HashMap<StackKey, u32>,
    /// The index the stream's stack ids last led to, by thread and mode: a waiting thread is
    /// sampled with the same stack id tick after tick, counted then without hashing its frames.
    /// Direct-mapped ([`REMEMBERED_STACKS`] slots); empty until the first sample.
    remembered: Vec<Option<RememberedStack>>,
    counts: Vec<u64>,
    /// Every sample's time, when asked for ([`SampleAggregator::keep_times`]).
    times: Option<Vec<SampleTime>>,
    samples: u64,
    ticks: u64,
    interval_ns: i64,
    last_sample_ns: Option<i64>,
    first_tick_ns: Option<i64>,
    last_tick_ns: Option<i64>,
    /// The stretch of time the window's samples stand for, when longer than the window.
    stands_for_ns: Option<i64>,
    /// By thread: the fraction of its managed samples that the kernel's CPU accounting bears
    /// out, for threads sampled in managed code more often than they ran
    /// ([`SampleAggregator::set_thread_cpu`]).
    cpu_scale: HashMap<u64, f64>,
    /// Why the samples' kinds cannot tell CPU, once known: from the runtime's version
    /// ([`SampleAggregator::distrust_kinds`]) or from the kernel's figures
    /// ([`SampleAggregator::set_thread_cpu`]).
    untrusted_kinds: Option<UntrustedKinds>,
    /// `cpu_scale` weighs every sample of a thread (the kernel's CPU spread over its samples),
    /// not only those in managed code: set when the kinds are untrusted and the kernel measured.
    cpu_estimated: bool,
}

/// The runtime issue of samplers that mark managed code as external: CoreCLR since .NET 9
/// (SuspendAllThreads ported from NativeAOT), fixed in 10.0 by dotnet/runtime#124084; NativeAOT
/// has its own, dotnet/runtime#125217, fixed for .NET 11 by #125764.
pub const UNTRUSTED_KINDS_ISSUE: &str = "dotnet/runtime#123996";

/// A share of a core above which a thread counts as busy when judging the kinds from the data.
const BUSY_CORES: f64 = 0.25;
/// Samples a busy thread needs before its kinds are judged.
const BUSY_MIN_SAMPLES: u64 = 20;
/// The share of busy threads' samples marked managed below which the kinds are not believed:
/// on .NET 9.0.20 a thread spinning in managed code got 3 of 10,076 (0.03 %); on runtimes that
/// mark them right, such a thread is managed in nearly every sample.
const BUSY_MIN_MANAGED_SHARE: f64 = 0.01;

/// Why the sampler's kinds (managed or external code) cannot tell which samples are CPU.
#[derive(Debug, Clone, PartialEq)]
pub enum UntrustedKinds {
    /// A runtime known to mark managed code external ([`untrusted_kinds_of`]).
    KnownRuntime { runtime: String },
    /// Threads the kernel ran at least [`BUSY_CORES`] of a core were sampled in managed code at
    /// under [`BUSY_MIN_MANAGED_SHARE`] of their samples.
    Observed {
        busy_threads: usize,
        busy_cores: f64,
        managed: u64,
        samples: u64,
    },
}

impl std::fmt::Display for UntrustedKinds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UntrustedKinds::KnownRuntime { runtime } => write!(
                f,
                "runtime {runtime} marks samples of managed code as external ({UNTRUSTED_KINDS_ISSUE})"
            ),
            UntrustedKinds::Observed {
                busy_threads,
                busy_cores,
                managed,
                samples,
            } => write!(
                f,
                "{busy_threads} thread(s) ran {busy_cores:.2} cores but only {managed} of their \
                 {samples} samples were marked managed: the runtime's sampler marks managed code \
                 as external (as in {UNTRUSTED_KINDS_ISSUE})"
            ),
        }
    }
}

/// Whether the runtime `product_version` (ProcessInfo's `clr_product_version`, e.g. `9.0.20`
/// or `10.0.12+abc`) is known to mark samples of managed code external: CoreCLR 9.x (no
/// release/9.0 backport), 10.0.0–10.0.3 (the fix, #124084, merged 2026-02-06, came with the
/// next servicing release, 10.0.4) and NativeAOT before 11 (#125217). Measured here: 9.0.20 and
/// NativeAOT 10.0.12 affected, CoreCLR 8.0.31, 10.0.12 and 11.0.0 not.
pub fn untrusted_kinds_of(product_version: &str, native_aot: bool) -> Option<UntrustedKinds> {
    let core = product_version.split(['+', '-']).next().unwrap_or("");
    let mut parts = core.split('.').map(|p| p.trim().parse::<u32>().ok());
    let (major, _minor, patch) = (
        parts.next()??,
        parts.next().flatten(),
        parts.next().flatten(),
    );
    let affected = if native_aot {
        major <= 10
    } else {
        major == 9 || (major == 10 && patch.is_none_or(|patch| patch < 4))
    };
    affected.then(|| UntrustedKinds::KnownRuntime {
        runtime: format!(
            "{}{product_version}",
            if native_aot { "NativeAOT " } else { "" }
        ),
    })
}

impl SampleAggregator {
    /// `expected_interval_ns` is the trace's stated sampler interval (0 if unknown).
    pub fn new(expected_interval_ns: u32) -> Self {
        let interval_ns = match i64::from(expected_interval_ns) {
            0 => DEFAULT_INTERVAL_NS,
            n => n,
        };
        SampleAggregator {
            interval_ns,
            ..Default::default()
        }
    }

    /// Also keeps when each sample was taken (16 bytes per sample), so samples can be joined to
    /// what else happened on their thread at that time.
    pub fn keep_times(mut self) -> Self {
        self.times = Some(Vec::new());
        self
    }

    /// Sets the sampler interval the trace states (its Trace object), once it is known.
    pub fn set_expected_interval(&mut self, interval_ns: u32) {
        if interval_ns > 0 {
            self.interval_ns = i64::from(interval_ns);
        }
    }

    /// Adds one ThreadSample event. Samples without a stack count toward ticks but not stacks.
    pub fn add(&mut self, event: &Event<'_>, sample: &ThreadSample) {
        let at = event.unix_nanos();
        if starts_tick(self.last_sample_ns, at, self.interval_ns) {
            self.ticks += 1;
            self.first_tick_ns.get_or_insert(at);
            self.last_tick_ns = Some(at);
        }
        self.last_sample_ns = Some(at);
        let Some(stack) = event.stack().filter(|s| !s.is_empty()) else {
            return;
        };
        self.samples += 1;
        let thread_id = event.header.thread_id;
        let managed = sample.kind == SampleKind::Managed;
        let identity = event.stack_identity();
        let slot = identity.map(|identity| {
            (identity.id() as usize ^ thread_id as usize ^ usize::from(managed)) % REMEMBERED_STACKS
        });
        let remembered = slot
            .and_then(|slot| self.remembered.get(slot).copied().flatten())
            .filter(|r| {
                Some(r.stack) == identity && r.thread_id == thread_id && r.managed == managed
            });
        let index = match remembered {
            Some(remembered) => remembered.index,
            None => {
                let index = self.index_of(event, sample, stack);
                if let (Some(slot), Some(stack)) = (slot, identity) {
                    if self.remembered.is_empty() {
                        self.remembered = vec![None; REMEMBERED_STACKS];
                    }
                    self.remembered[slot] = Some(RememberedStack {
                        stack,
                        thread_id,
                        managed,
                        index,
                    });
                }
                index
            }
        };
        self.counts[index as usize] += 1;
        if let Some(times) = &mut self.times {
            times.push(SampleTime {
                stack: index,
                timestamp: event.header.timestamp,
            });
        }
    }

    /// The index of a sample's stack in `keys`, added if new.
    fn index_of(&mut self, event: &Event<'_>, sample: &ThreadSample, stack: Stack<'_>) -> u32 {
        let thread_id = event.header.thread_id;
        let managed = sample.kind == SampleKind::Managed;
        let hash = stack_hash(thread_id, managed, stack.bytes());
        match self.by_hash.get(&hash) {
            Some(&index) => {
                let key = &self.keys[index as usize];
                if key.thread_id == thread_id
                    && key.managed == managed
                    && key.ips.iter().copied().eq(stack.ips())
                {
                    index
                } else {
                    self.insert_collided(StackKey::of(event, sample))
                }
            }
            None => {
                let index = self.push_key(StackKey::of(event, sample));
                self.by_hash.insert(hash, index);
                index
            }
        }
    }

    fn push_key(&mut self, key: StackKey) -> u32 {
        self.keys.push(key);
        self.counts.push(0);
        u32::try_from(self.keys.len() - 1).unwrap_or(u32::MAX)
    }

    fn insert_collided(&mut self, key: StackKey) -> u32 {
        if let Some(&index) = self.collided.get(&key) {
            return index;
        }
        let index = self.push_key(key.clone());
        self.collided.insert(key, index);
        index
    }

    /// Samples with a stack.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    pub fn ticks(&self) -> u64 {
        self.ticks
    }

    /// The measured sampling period: the mean distance between ticks, or the stated interval
    /// when fewer than two ticks were seen.
    pub fn period_ns(&self) -> i64 {
        match (self.first_tick_ns, self.last_tick_ns) {
            (Some(first), Some(last)) if self.ticks >= 2 && last > first => {
                (last - first) / (self.ticks as i64 - 1)
            }
            _ => self.interval_ns,
        }
    }

    /// Says that the window's samples stand for `stretch` of the process's time: a duty-cycled
    /// sampler's window stands for its whole period (1 s sampled of every 10 s stands for 10 s).
    pub fn set_stands_for(&mut self, stretch: std::time::Duration) {
        self.stands_for_ns = i64::try_from(stretch.as_nanos()).ok();
    }

    /// What one sample is worth, in nanoseconds of the process's time: the measured period,
    /// scaled by the stretch the window stands for over the time its ticks span (never below the
    /// period). Continuous sampling (`record`, `top`, a boost) is worth the period itself.
    pub fn weight_ns(&self) -> i64 {
        let period = self.period_ns();
        let (Some(stretch), Some((first, end))) = (self.stands_for_ns, self.time_range()) else {
            return period;
        };
        let sampled = end.saturating_sub(first);
        if sampled <= 0 || stretch <= sampled {
            return period;
        }
        let weight = i128::from(period) * i128::from(stretch) / i128::from(sampled);
        i64::try_from(weight).unwrap_or(i64::MAX)
    }

    /// Says the samples' kinds cannot be trusted (the runtime is known to mark managed code
    /// external, [`untrusted_kinds_of`]): their CPU is estimated from the kernel's figures
    /// ([`Self::set_thread_cpu`]), or not given without them.
    pub fn distrust_kinds(&mut self, why: UntrustedKinds) {
        self.untrusted_kinds = Some(why);
    }

    /// Without the kernel's figures (a file): `(managed, samples)` when at least
    /// [`BUSY_MIN_SAMPLES`] samples were taken and under [`BUSY_MIN_MANAGED_SHARE`] of them are
    /// marked managed. An idle process looks the same, so this is a doubt, not a finding.
    pub fn few_managed(&self) -> Option<(u64, u64)> {
        let managed: u64 = self
            .stacks()
            .filter(|(k, _)| k.managed)
            .map(|(_, n)| n)
            .sum();
        (self.samples >= BUSY_MIN_SAMPLES
            && (managed as f64) < BUSY_MIN_MANAGED_SHARE * self.samples as f64)
            .then_some((managed, self.samples))
    }

    /// Why the samples' kinds cannot tell CPU, if they cannot.
    pub fn untrusted_kinds(&self) -> Option<&UntrustedKinds> {
        self.untrusted_kinds.as_ref()
    }

    /// Whether `cpu` is the kernel's per-thread CPU spread over each thread's samples rather
    /// than the samples in managed code.
    pub fn cpu_estimated(&self) -> bool {
        self.cpu_estimated
    }

    /// Weighs each thread's `cpu` by the CPU the kernel gave it: `cores_by_thread` is the share of
    /// a core each thread ran over the time the window stands for, measured from `/proc`
    /// ([`crate::local::ThreadCpu`]). The runtime's sampler takes every thread that is in managed
    /// code, a runnable thread waiting for a core among them, so on an oversubscribed machine the
    /// samples show the CPU threads ask for, not what they got. A thread sampled in managed code
    /// at a larger share of ticks than the share of a core it ran is worth that much less a
    /// sample; none is worth more, since its CPU also counts native code, which `cpu` leaves out.
    ///
    /// Where the kinds cannot be trusted (said before, or seen here: busy threads never sampled
    /// in managed code), each thread's kernel CPU is spread over all its samples instead.
    pub fn set_thread_cpu(&mut self, cores_by_thread: &HashMap<u64, f64>) {
        let mut managed: HashMap<u64, u64> = HashMap::new();
        let mut all: HashMap<u64, u64> = HashMap::new();
        for (key, count) in self.stacks() {
            *all.entry(key.thread_id).or_default() += count;
            if key.managed {
                *managed.entry(key.thread_id).or_default() += count;
            }
        }
        if self.untrusted_kinds.is_none() {
            self.untrusted_kinds = kinds_contradict_kernel(&managed, &all, cores_by_thread);
        }
        let ticks = self.ticks.max(1) as f64;
        self.cpu_estimated = self.untrusted_kinds.is_some();
        self.cpu_scale = if self.cpu_estimated {
            all.into_iter()
                .filter_map(|(thread_id, samples)| {
                    let cores = cores_by_thread.get(&thread_id)?.max(0.0);
                    Some((thread_id, cores * ticks / samples.max(1) as f64))
                })
                .collect()
        } else {
            managed
                .into_iter()
                .filter_map(|(thread_id, samples)| {
                    let cores = cores_by_thread.get(&thread_id)?.max(0.0);
                    let sampled = samples as f64 / ticks;
                    (cores < sampled).then(|| (thread_id, cores / sampled))
                })
                .collect()
        };
    }

    /// The CPU time of `count` samples of `key`, in nanoseconds, or `None` when they are no CPU:
    /// samples in managed code worth [`Self::weight_ns`] each, scaled to what the kernel ran the
    /// thread ([`Self::set_thread_cpu`]); where the kinds are untrusted, every sample of a thread
    /// the kernel ran carries its share of that thread's CPU, and without the kernel's figures
    /// none is CPU.
    pub fn cpu_ns(&self, key: &StackKey, count: u64) -> Option<i64> {
        let scale = if self.cpu_estimated {
            Some(*self.cpu_scale.get(&key.thread_id).filter(|s| **s > 0.0)?)
        } else if key.managed && self.untrusted_kinds.is_none() {
            self.cpu_scale.get(&key.thread_id).copied()
        } else {
            return None;
        };
        let weight = self.weight_ns() as f64 * scale.unwrap_or(1.0);
        Some((count as f64 * weight).round() as i64)
    }

    /// The time the ticks span, Unix nanoseconds: (first tick, last tick + one period).
    pub fn time_range(&self) -> Option<(i64, i64)> {
        let first = self.first_tick_ns?;
        let last = self.last_tick_ns?;
        Some((first, last.saturating_add(self.period_ns())))
    }

    /// Each distinct stack with its sample count, in the order first seen.
    pub fn stacks(&self) -> impl Iterator<Item = (&StackKey, u64)> {
        self.keys.iter().zip(self.counts.iter().copied())
    }

    /// Each distinct stack with its index (what [`SampleTime::stack`] refers to).
    pub fn stacks_by_index(&self) -> impl Iterator<Item = (u32, &StackKey)> {
        self.keys
            .iter()
            .enumerate()
            .map(|(index, key)| (u32::try_from(index).unwrap_or(u32::MAX), key))
    }

    /// Every sample's stack and time, in arrival order, if [`keep_times`](Self::keep_times) was
    /// asked for.
    pub fn times(&self) -> Option<&[SampleTime]> {
        self.times.as_deref()
    }

    /// Distinct thread ids seen.
    pub fn thread_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.keys.iter().map(|k| k.thread_id).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

/// The kinds seen contradicting the kernel: threads it ran at least [`BUSY_CORES`] of a core
/// (with [`BUSY_MIN_SAMPLES`] samples) were marked managed at under [`BUSY_MIN_MANAGED_SHARE`]
/// of their samples. A thread busy in native code (a P/Invoke) is external on every runtime, so
/// this also fires for a process whose only busy threads run native code; its estimate (the
/// kernel's CPU over their stacks) is then right all the same.
fn kinds_contradict_kernel(
    managed: &HashMap<u64, u64>,
    all: &HashMap<u64, u64>,
    cores_by_thread: &HashMap<u64, f64>,
) -> Option<UntrustedKinds> {
    let (mut busy_threads, mut busy_cores, mut in_managed, mut samples) = (0, 0.0, 0, 0);
    for (thread_id, &count) in all {
        let cores = cores_by_thread.get(thread_id).copied().unwrap_or(0.0);
        if cores >= BUSY_CORES && count >= BUSY_MIN_SAMPLES {
            busy_threads += 1;
            busy_cores += cores;
            samples += count;
            in_managed += managed.get(thread_id).copied().unwrap_or(0);
        }
    }
    (busy_threads > 0 && (in_managed as f64) < BUSY_MIN_MANAGED_SHARE * samples as f64).then_some(
        UntrustedKinds::Observed {
            busy_threads,
            busy_cores,
            managed: in_managed,
            samples,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use nettrace::events::KnownEvent;
    use nettrace::NettraceReader;

    /// Samples counted through remembered stack ids come to what counting every sample's own
    /// frames gives, over traces of real runtimes with many sequence points (ids restart).
    #[test]
    fn remembered_stacks_count_as_the_frames_do() {
        let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
        let mut traces = 0;
        for entry in std::fs::read_dir(fixtures).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("nettrace") {
                continue;
            }
            let mut reader = NettraceReader::new(std::fs::File::open(&path).unwrap());
            let mut agg = SampleAggregator::new(1_000_000);
            let mut naive: HashMap<StackKey, u64> = HashMap::new();
            // Fixtures of damaged streams end early; what came before still counts.
            while let Ok(Some(event)) = reader.next_event() {
                if let Ok(Some(KnownEvent::ThreadSample(sample))) = event.known() {
                    agg.add(&event, &sample);
                    if event.stack().is_some_and(|s| !s.is_empty()) {
                        *naive.entry(StackKey::of(&event, &sample)).or_default() += 1;
                    }
                }
            }
            if naive.is_empty() {
                continue;
            }
            traces += 1;
            let counted: HashMap<StackKey, u64> =
                agg.stacks().map(|(key, n)| (key.clone(), n)).collect();
            assert_eq!(counted, naive, "{}", path.display());
        }
        assert!(traces >= 2, "fixtures with samples: {traces}");
    }

    #[test]
    fn period_is_measured_from_a_real_trace() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/cpuhot-samples.nettrace"
        );
        let mut reader = NettraceReader::new(std::fs::File::open(path).unwrap());
        let mut agg = SampleAggregator::new(1_000_000).keep_times();
        let mut events = 0;
        while let Some(event) = reader.next_event().unwrap() {
            if let Some(KnownEvent::ThreadSample(sample)) = event.known().unwrap() {
                agg.add(&event, &sample);
                events += 1;
            }
        }
        // Recorded on a loaded 2-core machine: the sampler ticked late, 171 times in about 1 s
        // (one spinning thread plus the main thread waiting).
        assert_eq!(agg.ticks(), 171);
        assert_eq!(events, 342);
        let (first, end) = agg.time_range().unwrap();
        let period = agg.period_ns();
        let spanned = (agg.ticks() as i64 - 1) * period;
        assert!((end - first - period - spanned).abs() < 1_000);
        assert!(
            (5_000_000..7_000_000).contains(&period),
            "period {period} ns"
        );
        assert_eq!(agg.thread_ids().len(), 2);
        let managed: u64 = agg
            .stacks()
            .filter(|(k, _)| k.managed)
            .map(|(_, n)| n)
            .sum();
        assert!(managed > 150, "{managed} managed samples");

        // The kept times account for every counted sample, stack by stack, in time order.
        let times = agg.times().unwrap();
        assert_eq!(times.len() as u64, agg.samples());
        assert!(times.windows(2).all(|w| w[0].timestamp <= w[1].timestamp));
        let mut per_stack: HashMap<u32, u64> = HashMap::new();
        for t in times {
            *per_stack.entry(t.stack).or_default() += 1;
        }
        let counts: HashMap<&StackKey, u64> = agg.stacks().collect();
        for (index, key) in agg.stacks_by_index() {
            assert_eq!(per_stack[&index], counts[key]);
        }

        // Worth the period while sampled without pause; a window that stands for a stretch ten
        // times the time it spans is worth ten periods a sample.
        assert_eq!(agg.weight_ns(), period);
        agg.set_stands_for(std::time::Duration::from_nanos((end - first) as u64 / 2));
        assert_eq!(agg.weight_ns(), period, "never below the period");
        agg.set_stands_for(std::time::Duration::from_nanos((end - first) as u64 * 10));
        let weight = agg.weight_ns();
        assert!((weight - 10 * period).abs() <= 10, "{weight} vs {period}");

        // The spinning thread was in managed code at nearly every tick: had the kernel run it
        // for a third of a core, each of its samples is worth a third of the weight, over
        // whatever share of ticks it was sampled at; the thread it did not measure is unchanged.
        let mut managed_by_thread: HashMap<u64, u64> = HashMap::new();
        for (key, count) in agg.stacks().filter(|(key, _)| key.managed) {
            *managed_by_thread.entry(key.thread_id).or_default() += count;
        }
        let (&spinner, &spun) = managed_by_thread.iter().max_by_key(|(_, &n)| n).unwrap();
        let other = *agg.thread_ids().iter().find(|&&t| t != spinner).unwrap();
        let sampled = spun as f64 / agg.ticks() as f64;
        let key_of = |thread: u64| {
            agg.stacks()
                .map(|(key, _)| key.clone())
                .find(|key| key.thread_id == thread && key.managed == (thread == spinner))
                .unwrap()
        };
        let (spinning, waiting) = (key_of(spinner), key_of(other));
        agg.set_thread_cpu(&HashMap::from([(spinner, sampled / 3.0)]));
        assert!(agg.untrusted_kinds().is_none() && !agg.cpu_estimated());
        let scaled = agg.cpu_ns(&spinning, 3).unwrap();
        assert!((scaled - weight).abs() <= 1, "{scaled} vs {weight}");
        assert_eq!(
            agg.cpu_ns(&waiting, 1),
            None,
            "a waiting thread's sample is no CPU"
        );
        // A thread that ran more than its managed samples show (native code too) is not raised.
        agg.set_thread_cpu(&HashMap::from([(spinner, 1.0), (other, 1.0)]));
        assert_eq!(agg.cpu_ns(&spinning, 1), Some(weight));
    }

    fn aggregate(path: &str) -> SampleAggregator {
        let mut reader = NettraceReader::new(std::fs::File::open(path).unwrap());
        let mut agg = SampleAggregator::new(1_000_000);
        while let Some(event) = reader.next_event().unwrap() {
            if let Some(KnownEvent::ThreadSample(sample)) = event.known().unwrap() {
                agg.add(&event, &sample);
            }
        }
        agg
    }

    /// CpuHot spinning one thread in managed code for 1 s, recorded on each runtime of the test
    /// bed: given the kernel's figure for it (a whole core), .NET 9.0.20's kinds are found
    /// untrusted and the thread's CPU comes from the kernel; on the others its managed samples
    /// give it. Either way the CPU is the core the spinner ran over the time sampled.
    #[test]
    fn kinds_are_judged_against_the_kernel_on_each_runtime() {
        let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
        for (runtime, untrusted) in [
            ("net8", false),
            ("net9", true),
            ("net10", false),
            ("net11", false),
        ] {
            let mut agg = aggregate(&format!("{fixtures}/{runtime}/cpuhot-samples.nettrace"));
            // The spinner's leaf moves about its loop; a waiting thread keeps one stack.
            let mut stacks: HashMap<u64, usize> = HashMap::new();
            for (key, _) in agg.stacks() {
                *stacks.entry(key.thread_id).or_default() += 1;
            }
            let (&spinner, _) = stacks.iter().max_by_key(|(_, &n)| n).unwrap();
            let cores: HashMap<u64, f64> = agg
                .thread_ids()
                .into_iter()
                .map(|t| (t, if t == spinner { 1.0 } else { 0.0 }))
                .collect();
            agg.set_thread_cpu(&cores);
            assert_eq!(
                agg.untrusted_kinds().is_some(),
                untrusted,
                "{runtime}: {:?}",
                agg.untrusted_kinds()
            );
            assert_eq!(agg.cpu_estimated(), untrusted, "{runtime}");
            let cpu: i64 = agg.stacks().filter_map(|(k, n)| agg.cpu_ns(k, n)).sum();
            let managed: u64 = agg
                .stacks()
                .filter(|(k, _)| k.managed && k.thread_id == spinner)
                .map(|(_, n)| n)
                .sum();
            let weight = agg.weight_ns() as f64;
            // Untrusted: the kernel's core over every tick; else the managed samples, which a
            // core of kernel CPU does not scale down.
            let expected = if untrusted {
                agg.ticks() as f64 * weight
            } else {
                managed as f64 * weight
            };
            assert!(
                (cpu as f64 - expected).abs() <= agg.stacks().count() as f64,
                "{runtime}: cpu {cpu} ns, expected {expected} ns ({managed} managed samples)"
            );
            // Only the spinner has CPU: the idle threads' samples carry none.
            assert!(agg
                .stacks()
                .filter(|(k, _)| k.thread_id != spinner)
                .all(|(k, n)| agg.cpu_ns(k, n).unwrap_or(0) == 0));
        }
    }

    /// On untrusted kinds a thread's kernel CPU is spread over its samples, whatever their kind:
    /// half a core over the time sampled, in proportion to each stack's samples; without the
    /// kernel's figures no sample is CPU.
    #[test]
    fn untrusted_kinds_spread_the_kernels_cpu_over_a_threads_samples() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/net9/cpuhot-samples.nettrace"
        );
        let mut agg = aggregate(path);
        agg.distrust_kinds(untrusted_kinds_of("9.0.20", false).unwrap());
        assert!(agg.stacks().all(|(k, n)| agg.cpu_ns(k, n).is_none()));
        let threads = agg.thread_ids();
        let half: HashMap<u64, f64> = threads.iter().map(|&t| (t, 0.5)).collect();
        agg.set_thread_cpu(&half);
        assert!(agg.cpu_estimated());
        let weight = agg.weight_ns() as f64;
        for &thread in &threads {
            let samples: u64 = agg
                .stacks()
                .filter(|(k, _)| k.thread_id == thread)
                .map(|(_, n)| n)
                .sum();
            let cpu: i64 = agg
                .stacks()
                .filter(|(k, _)| k.thread_id == thread)
                .map(|(k, n)| {
                    let cpu = agg.cpu_ns(k, n).unwrap();
                    let share = n as f64 / samples as f64;
                    let expected = 0.5 * agg.ticks() as f64 * weight * share;
                    assert!((cpu as f64 - expected).abs() <= 1.0, "{cpu} vs {expected}");
                    cpu
                })
                .sum();
            let expected = 0.5 * agg.ticks() as f64 * weight;
            assert!((cpu as f64 - expected).abs() <= agg.stacks().count() as f64);
        }
    }

    #[test]
    fn runtimes_known_to_mark_managed_code_external() {
        for (version, aot, affected) in [
            ("8.0.31", false, false),
            ("9.0.0", false, true),
            ("9.0.20", false, true),
            ("10.0.0-rc.2.25502.107", false, true),
            ("10.0.3", false, true),
            ("10.0.4", false, false),
            ("10.0.12+abc", false, false),
            ("11.0.0", false, false),
            ("10.0.12", true, true),
            ("11.0.0", true, false),
            ("", false, false),
        ] {
            let found = untrusted_kinds_of(version, aot);
            assert_eq!(found.is_some(), affected, "{version} aot={aot}: {found:?}");
        }
        let why = untrusted_kinds_of("10.0.12", true).unwrap().to_string();
        assert!(
            why.contains("NativeAOT 10.0.12") && why.contains(UNTRUSTED_KINDS_ISSUE),
            "{why}"
        );
    }
}
