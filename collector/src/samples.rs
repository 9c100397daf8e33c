//! Raw samples from the EventPipe sampler: stacks of instruction pointers per thread, counted,
//! with the sampling period measured from the sampler's own ticks.
//!
//! The sampler suspends the runtime, writes one ThreadSample per managed thread, resumes, then
//! sleeps its interval (1 ms by default), so the real period is the interval plus the walk time.
//! Samples of one tick share a timestamp to within microseconds; a gap larger than half the
//! interval starts a new tick. The measured period is the mean distance between ticks, so
//! `samples × period` is true time even when ticks are late or skipped.

use std::collections::HashMap;

use crate::nettrace::events::{SampleKind, ThreadSample};
use crate::nettrace::{Event, Stack, StackIdentity};

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

    /// Weighs each thread's `cpu` by the CPU the kernel gave it: `cores_by_thread` is the share of
    /// a core each thread ran over the time the window stands for, measured from `/proc`
    /// ([`crate::local::ThreadCpu`]). The runtime's sampler takes every thread that is in managed
    /// code, a runnable thread waiting for a core among them, so on an oversubscribed machine the
    /// samples show the CPU threads ask for, not what they got. A thread sampled in managed code
    /// at a larger share of ticks than the share of a core it ran is worth that much less a
    /// sample; none is worth more, since its CPU also counts native code, which `cpu` leaves out.
    pub fn set_thread_cpu(&mut self, cores_by_thread: &HashMap<u64, f64>) {
        let mut managed: HashMap<u64, u64> = HashMap::new();
        for (key, count) in self.stacks().filter(|(key, _)| key.managed) {
            *managed.entry(key.thread_id).or_default() += count;
        }
        let ticks = self.ticks.max(1) as f64;
        self.cpu_scale = managed
            .into_iter()
            .filter_map(|(thread_id, samples)| {
                let cores = cores_by_thread.get(&thread_id)?.max(0.0);
                let sampled = samples as f64 / ticks;
                (cores < sampled).then(|| (thread_id, cores / sampled))
            })
            .collect();
    }

    /// What one sample of `thread_id` in managed code is worth in CPU time: [`Self::weight_ns`],
    /// scaled to what the kernel ran the thread ([`Self::set_thread_cpu`]).
    pub fn cpu_weight_ns(&self, thread_id: u64) -> i64 {
        let weight = self.weight_ns();
        match self.cpu_scale.get(&thread_id) {
            Some(scale) => (weight as f64 * scale).round() as i64,
            None => weight,
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nettrace::events::KnownEvent;
    use crate::nettrace::NettraceReader;

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
        agg.set_thread_cpu(&HashMap::from([(spinner, sampled / 3.0)]));
        let scaled = agg.cpu_weight_ns(spinner);
        assert!((scaled - weight / 3).abs() <= 1, "{scaled} vs {weight} / 3");
        assert_eq!(agg.cpu_weight_ns(other), weight);
        // A thread that ran more than its managed samples show (native code too) is not raised.
        agg.set_thread_cpu(&HashMap::from([(spinner, 1.0), (other, 1.0)]));
        assert_eq!(agg.cpu_weight_ns(spinner), weight);
    }
}
