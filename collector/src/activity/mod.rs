//! Trace linkage: which span (W3C trace id, span id, operation name) was current on a thread at a
//! given time, from the events of one process, so that sampler events, which carry no activity id
//! of their own (`ep_write_sample_profile_event` passes none), can be joined to spans by thread and
//! time.
//!
//! # Where the answer comes from
//!
//! PerfView answers this in two layers: `ActivityComputer` keeps a per-thread stack of TPL "tasks"
//! built from `TaskScheduled`/`TaskStarted`, `TaskWaitBegin`/`TaskWaitEnd` and
//! `AwaitTaskContinuationScheduled` (a task created on thread A inherits A's current task as its
//! creator; a wait end or task start pushes it onto the thread that runs it), and
//! `StartStopActivityComputer` hangs EventSource start/stop activities on those tasks, keyed by
//! the EventSource activity id of the start event. That needs every hop to be a TPL task. On
//! .NET ≥ 5 it is not: an `await` on a `ValueTask` backed by an `IValueTaskSource` (sockets,
//! pipes, channels: most of ASP.NET Core's awaits) schedules the state machine box directly and
//! writes no TaskWait events, neither do plain thread-pool work items; and `TaskWaitEnd` is written
//! before the continuation restores its execution context, so its header carries the previous
//! activity id. Measured on AsyncWeb: TaskWait/Task events cost ~22 events per request against
//! ~12 for the signal used here, and still miss those hops.
//!
//! clrscope follows the runtime's own bookkeeping instead:
//!
//! - With TplEventSource's `TasksFlowActivityIds` keyword on, `ActivityTracker` gives every
//!   EventSource Start event a new activity id (a path under the current one) and keeps it in an
//!   `AsyncLocal`, which flows exactly like `Activity.Current` does. Its change callback sets the
//!   thread's activity id on every execution-context switch, start and stop
//!   (`ActivityTracker.ActivityChanging` → `EventSource.SetCurrentThreadActivityId`).
//! - `SetCurrentThreadActivityId` writes TplEventSource's `SetActivityId` event (keyword
//!   `DebugActivityId`) on the thread whose id changes: a [`ActivityEvent::ThreadSwitch`].
//! - DiagnosticSourceEventSource writes `ActivityStart`/`ActivityStop` (ActivitySource spans) or
//!   `Activity1Start`… (DiagnosticListener activities) as EventSource Start/Stop events, so the
//!   start event's header activity id is the span's EventSource activity id and its payload names
//!   the span: [`ActivityEvent::SpanStart`]/[`ActivityEvent::SpanStop`].
//!
//! So a thread's timeline of activity ids, mapped through the spans' start events, says which span
//! was innermost on it at any moment: synchronous nesting (each nested start switches to a child id,
//! each stop back to the parent's), async hops (the continuation's context switch) and thread reuse
//! (the switch back to no activity when the pool thread leaves the context) alike. Start and stop
//! events also move the timeline by themselves, so synchronous nesting still resolves when a trace
//! has no `SetActivityId` events (a runtime without the keyword, a trace taken by another tool).
//! [`crate::providers::linkage`] lists the providers a session needs.
//!
//! # Bounded
//!
//! [`SpanTracker`] keeps, per thread, the switches of the last [`TrackerLimits::retention`] (a
//! sample may be joined after the events that follow it have arrived, even from another session
//! of the same process: timestamps are the runtime's QPC ticks, shared by all its sessions), and
//! the spans still open or stopped within that window; open spans whose stop never came expire
//! after [`TrackerLimits::max_open_age`]. Counts of spans, threads and switches are capped.
//!
//! # Use
//!
//! Feed every event of the session carrying the linkage providers to [`SpanTracker::observe`]
//! and ask [`SpanTracker::span_at`] for each sample. A sample from a sampling session of its own
//! should wait until [`SpanTracker::latest_timestamp`] has passed it: the runtime flushes each
//! session's buffers on its own schedule.
//!
//! ```no_run
//! use collector::activity::SpanTracker;
//! use nettrace::{events::EventKind, NettraceReader};
//!
//! let mut tracker = SpanTracker::default();
//! let mut samples = Vec::new();
//! let mut reader = NettraceReader::new(std::fs::File::open("app.nettrace")?);
//! while let Some(event) = reader.next_event()? {
//!     // A payload that does not decode is counted in the stats; tracking goes on.
//!     let _ = tracker.observe(&event);
//!     if event.metadata.kind == EventKind::ThreadSample {
//!         samples.push((event.header.thread_id, event.header.timestamp));
//!     }
//! }
//! for (thread, timestamp) in samples {
//!     if let Some(span) = tracker.span_at(thread, timestamp) {
//!         println!("{thread} {} {} {}", span.trace_id, span.span_id, span.name);
//!     }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::session::EventObserver;
use nettrace::events::{DiagnosticSourceEvent, EventKind, KnownEvent};
use nettrace::{Event, NettraceError};
use profile::guid::Guid;
use profile::span::{Span, SpanId, TraceId};

/// One event of the tracker's input, decoded: what [`SpanTracker::observe`] takes from an event
/// and what tests and other feeders give [`SpanTracker::apply`]. Timestamps are QPC ticks,
/// threads OS thread ids, as the nettrace event headers carry them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActivityEvent {
    /// A span started on `thread`: its EventSource activity id is `activity` (the start event's
    /// activity id); `restore` is the id the thread had before (its related activity id), which
    /// the thread returns to when the span stops. `recorded` is false for a span the start says
    /// the app does not record (span export asks for its trace flags and whether its data was
    /// requested): it is followed, so that its thread's timeline stays right, but no sample or
    /// log is joined to it, as no backend gets it; they join the recorded span around it, if any.
    SpanStart {
        thread: u64,
        timestamp: i64,
        activity: Guid,
        restore: Guid,
        span: Span,
        recorded: bool,
    },
    /// A span stopped: by EventSource activity id, or by span id when the runtime could not find
    /// the activity in the stopping flow (its stop event then has a nil activity id).
    SpanStop {
        thread: u64,
        timestamp: i64,
        activity: Guid,
        span_id: Option<SpanId>,
    },
    /// `thread`'s EventSource activity id became `activity` (nil: none).
    ThreadSwitch {
        thread: u64,
        timestamp: i64,
        activity: Guid,
    },
}

/// Why an event the tracker reads could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LinkageError {
    /// The payload did not decode.
    #[error("linkage event payload: {0}")]
    Payload(#[from] NettraceError),
    /// A span start whose payload has no valid W3C ids (an activity in hierarchical id format, or
    /// a FilterAndPayloadSpecs that does not ask for `TraceId` and `SpanId`).
    #[error(
        "span start {source_name}/{operation} at {timestamp} has no W3C trace and span ids \
         (arguments {arguments:?})"
    )]
    NoW3cIds {
        source_name: String,
        operation: String,
        timestamp: i64,
        arguments: Vec<(String, String)>,
    },
}

/// Payload keys of the trace and span ids: clrscope's linkage spec names them `TraceId` and
/// `SpanId`; dotnet-monitor's `Http` profile `ActivityTraceId` and `ActivitySpanId`.
const TRACE_ID_KEYS: [&str; 2] = ["TraceId", "ActivityTraceId"];
const SPAN_ID_KEYS: [&str; 2] = ["SpanId", "ActivitySpanId"];

fn argument<'a>(event: &'a DiagnosticSourceEvent, keys: &[&str]) -> Option<&'a str> {
    keys.iter().find_map(|k| event.argument(k))
}

impl ActivityEvent {
    /// Decodes the events the tracker reads: DiagnosticSourceEventSource span starts and stops and
    /// TplEventSource `SetActivityId`; `Ok(None)` for every other event (decided from the
    /// metadata, without touching the payload).
    pub fn from_event(event: &Event<'_>) -> Result<Option<ActivityEvent>, LinkageError> {
        let relevant = match event.metadata.kind {
            EventKind::DiagnosticSource(kind) => kind.is_start() || kind.is_stop(),
            EventKind::ThreadActivityChange => true,
            _ => false,
        };
        if !relevant {
            return Ok(None);
        }
        let h = event.header;
        let (thread, timestamp) = (h.thread_id, h.timestamp);
        Ok(match event.known()? {
            Some(KnownEvent::ThreadActivityChange(change)) => Some(ActivityEvent::ThreadSwitch {
                thread,
                timestamp,
                activity: change.new_id,
            }),
            Some(KnownEvent::DiagnosticSource(ds)) if ds.kind.is_start() => {
                let ids = (
                    argument(&ds, &TRACE_ID_KEYS).and_then(TraceId::from_hex),
                    argument(&ds, &SPAN_ID_KEYS).and_then(SpanId::from_hex),
                );
                let (Some(trace_id), Some(span_id)) = ids else {
                    return Err(LinkageError::NoW3cIds {
                        operation: ds.event_name,
                        source_name: ds.source_name,
                        timestamp,
                        arguments: ds.arguments,
                    });
                };
                Some(ActivityEvent::SpanStart {
                    thread,
                    timestamp,
                    activity: h.activity_id,
                    restore: h.related_activity_id,
                    // Linkage alone does not ask whether: every span counts then.
                    recorded: ds.recorded().unwrap_or(true),
                    span: Span {
                        trace_id,
                        span_id,
                        name: operation_name(&ds.event_name).into(),
                    },
                })
            }
            Some(KnownEvent::DiagnosticSource(ds)) => Some(ActivityEvent::SpanStop {
                thread,
                timestamp,
                activity: h.activity_id,
                span_id: argument(&ds, &SPAN_ID_KEYS).and_then(SpanId::from_hex),
            }),
            _ => None,
        })
    }
}

/// ActivitySource events name the operation; DiagnosticListener activity events name the event,
/// `<operation>.Start` / `<operation>.Stop`.
fn operation_name(event_name: &str) -> &str {
    event_name
        .strip_suffix(".Start")
        .or_else(|| event_name.strip_suffix(".Stop"))
        .unwrap_or(event_name)
}

/// How much a [`SpanTracker`] keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackerLimits {
    /// How far behind the newest event [`SpanTracker::span_at`] still answers exactly.
    pub retention: Duration,
    /// An open span older than this is dropped: its stop was lost (dropped events, a session
    /// started after the stop's flow lost its id) and it must not pin memory for ever.
    pub max_open_age: Duration,
    /// Spans held at once (open, or stopped within `retention`).
    pub max_spans: usize,
    /// Threads with a timeline.
    pub max_threads: usize,
    /// Timeline entries (thread switches) over all threads.
    pub max_switches: usize,
}

impl Default for TrackerLimits {
    /// 10 s of history; ~100 k spans and 1 M switches at most (tens of MB in the worst case).
    fn default() -> Self {
        TrackerLimits {
            retention: Duration::from_secs(10),
            max_open_age: Duration::from_secs(600),
            max_spans: 1 << 17,
            max_threads: 1 << 12,
            max_switches: 1 << 20,
        }
    }
}

/// What a [`SpanTracker`] has seen and shed, for logs and `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrackerStats {
    pub spans_started: u64,
    pub spans_stopped: u64,
    /// Stops whose start never came within the retention (spans started before the session, or
    /// already shed).
    pub unmatched_stops: u64,
    /// Starts without an EventSource activity id: TasksFlowActivityIds off, or the runtime's
    /// activity depth limit (100) reached; such spans cannot be followed across threads.
    pub starts_without_activity_id: u64,
    /// Thread switches recorded.
    pub switches: u64,
    /// Events that could not be used ([`LinkageError`]).
    pub rejected_events: u64,
    /// Open spans dropped after `max_open_age`.
    pub expired_spans: u64,
    /// Open spans taken as stopped because a span of another trace started from within them:
    /// their stop was lost.
    pub abandoned_spans: u64,
    /// Spans, switches and threads dropped to stay within the caps.
    pub evicted_spans: u64,
    pub evicted_switches: u64,
    pub evicted_threads: u64,
}

/// Unrecorded spans nested in one another that [`SpanTracker::span_at`] looks through for a
/// recorded one around them.
const MAX_UNRECORDED_DEPTH: usize = 8;

#[derive(Debug)]
struct SpanEntry {
    span: Span,
    recorded: bool,
    restore: Guid,
    started: i64,
    stopped: Option<i64>,
}

/// How a stop that came before its start is matched when the start comes. A span's start and
/// stop are often written by different threads (an await in between), and the runtime flushes
/// each thread's buffer on its own, so across threads the stream is not in time order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum EarlyStop {
    Activity(Guid),
    Span(SpanId),
}

#[derive(Debug, Clone, Copy)]
struct Switch {
    timestamp: i64,
    activity: Guid,
}

/// Tracks the current span of every thread of one process; see the [module docs](self).
#[derive(Debug)]
pub struct SpanTracker {
    limits: TrackerLimits,
    /// QPC ticks per second of the process (1e9 on Linux), taken from the events' clock.
    ticks_per_second: i64,
    spans: HashMap<Guid, SpanEntry>,
    /// Earlier spans of an activity id a later span start took over, oldest first. The runtime
    /// gave a flow's successive spans one id after a lost stop left the flow on a stale span
    /// (measured on .NET 10 after a linkage session was renewed: 245 spans of one loop in 18 s,
    /// all one id); keyed by id alone, every sample of the earlier spans named the latest.
    reused: HashMap<Guid, Vec<SpanEntry>>,
    /// Span id → EventSource activity id, for stops without an activity id.
    by_span_id: HashMap<SpanId, Guid>,
    /// Stops seen before their start, with their time.
    early_stops: HashMap<EarlyStop, i64>,
    /// Per thread, switches in time order; the last one is the thread's current state.
    threads: HashMap<u64, VecDeque<Switch>>,
    switch_count: usize,
    latest: i64,
    since_sweep: usize,
    stats: TrackerStats,
}

/// Housekeeping runs every this many events: its cost is spread thin, and the state grows at most
/// this far past the caps between sweeps.
const SWEEP_EVERY: usize = 4096;

impl Default for SpanTracker {
    fn default() -> Self {
        SpanTracker::new(TrackerLimits::default())
    }
}

impl SpanTracker {
    pub fn new(limits: TrackerLimits) -> Self {
        SpanTracker {
            limits,
            ticks_per_second: 1_000_000_000,
            spans: HashMap::new(),
            reused: HashMap::new(),
            by_span_id: HashMap::new(),
            early_stops: HashMap::new(),
            threads: HashMap::new(),
            switch_count: 0,
            latest: i64::MIN,
            since_sweep: 0,
            stats: TrackerStats::default(),
        }
    }

    /// Takes one event of the process; events the tracker does not read are skipped cheaply.
    /// Errors are counted in [`TrackerStats::rejected_events`] as well as returned.
    pub fn observe(&mut self, event: &Event<'_>) -> Result<(), LinkageError> {
        match ActivityEvent::from_event(event) {
            Ok(Some(decoded)) => {
                self.ticks_per_second = event.clock.frequency();
                self.apply(decoded);
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(error) => {
                self.stats.rejected_events += 1;
                Err(error)
            }
        }
    }

    /// Takes one decoded event. A thread's own events should come in time order (they do within a
    /// nettrace stream: they share the thread's buffer; others are placed by time, at some cost);
    /// threads may interleave freely, a span's stop may even come before its start.
    pub fn apply(&mut self, event: ActivityEvent) {
        match event {
            ActivityEvent::SpanStart {
                thread,
                timestamp,
                activity,
                restore,
                span,
                recorded,
            } => {
                self.advance(timestamp);
                if activity.is_nil() {
                    self.stats.starts_without_activity_id += 1;
                    return;
                }
                self.stats.spans_started += 1;
                self.abandon_foreign_parent(restore, &span, timestamp);
                let stopped = self
                    .early_stops
                    .remove(&EarlyStop::Activity(activity))
                    .or_else(|| self.early_stops.remove(&EarlyStop::Span(span.span_id)));
                self.stats.spans_stopped += u64::from(stopped.is_some());
                self.by_span_id.insert(span.span_id, activity);
                let entry = SpanEntry {
                    span,
                    recorded,
                    restore,
                    started: timestamp,
                    stopped,
                };
                if let Some(earlier) = self.spans.insert(activity, entry) {
                    if earlier.span.span_id != self.spans[&activity].span.span_id {
                        tracing::debug!(%activity, "EventSource activity id reused by a new span");
                        self.reused.entry(activity).or_default().push(earlier);
                    }
                }
                self.switch(thread, timestamp, activity);
            }
            ActivityEvent::SpanStop {
                thread,
                timestamp,
                activity,
                span_id,
            } => {
                self.advance(timestamp);
                let key = Some(activity)
                    .filter(|a| self.spans.contains_key(a))
                    .or_else(|| span_id.and_then(|id| self.by_span_id.get(&id).copied()));
                if let Some(earlier) = key.and_then(|k| self.reused_entry(k, span_id)) {
                    // An earlier span of a reused id: the latest one, and threads, stay as they are.
                    let first = earlier.stopped.is_none();
                    earlier.stopped.get_or_insert(timestamp);
                    self.stats.spans_stopped += u64::from(first);
                    return;
                }
                let Some((key, entry)) = key.and_then(|k| self.spans.get_mut(&k).map(|e| (k, e)))
                else {
                    let early = match span_id {
                        _ if !activity.is_nil() => Some(EarlyStop::Activity(activity)),
                        Some(id) => Some(EarlyStop::Span(id)),
                        None => None,
                    };
                    match early {
                        Some(early) => _ = self.early_stops.insert(early, timestamp),
                        None => self.stats.unmatched_stops += 1,
                    }
                    return;
                };
                if entry.stopped.is_none() {
                    entry.stopped = Some(timestamp);
                    self.stats.spans_stopped += 1;
                }
                // Without SetActivityId events the stop is the only sign that the thread went
                // back to the parent; with them the switch came just before and this is a no-op.
                let restore = entry.restore;
                if self.current(thread) == Some(key) {
                    self.switch(thread, timestamp, restore);
                }
            }
            ActivityEvent::ThreadSwitch {
                thread,
                timestamp,
                activity,
            } => {
                self.advance(timestamp);
                self.switch(thread, timestamp, activity);
            }
        }
        self.since_sweep += 1;
        if self.since_sweep >= SWEEP_EVERY {
            self.sweep();
        }
    }

    /// The span current on `thread` at `timestamp` (QPC ticks, as in the sample's header), if any
    /// is known: `None` when the thread ran outside any span, or its state at that time is not
    /// known (before the first event seen on it, or older than the retention).
    pub fn span_at(&self, thread: u64, timestamp: i64) -> Option<&Span> {
        let switches = self.threads.get(&thread)?;
        let after = switches.partition_point(|s| s.timestamp <= timestamp);
        let current = switches.get(after.checked_sub(1)?)?;
        let entry = self.entry_at(&current.activity, timestamp)?;
        // A span stopped from another flow leaves its id on the threads of its own flow.
        match entry.stopped {
            Some(stopped) if stopped < timestamp => None,
            _ => self.recorded_from(entry, timestamp),
        }
    }

    /// `entry`'s span if the app records it, else that of the nearest recorded span around it
    /// that is still open at `timestamp`: where the app's own `Activity.Current` would be had
    /// the agent's listening not created the unrecorded one (at most [`MAX_UNRECORDED_DEPTH`]
    /// levels up).
    fn recorded_from<'a>(&'a self, mut entry: &'a SpanEntry, timestamp: i64) -> Option<&'a Span> {
        for _ in 0..MAX_UNRECORDED_DEPTH {
            if entry.recorded {
                return Some(&entry.span);
            }
            entry = self.entry_at(&entry.restore, timestamp)?;
            if entry.stopped.is_some_and(|stopped| stopped < timestamp) {
                return None;
            }
        }
        None
    }

    /// The span whose EventSource activity id is `activity`, if it was open at `timestamp`: how
    /// an event that carries its writer's activity id (a log message) finds its span.
    pub fn span_of_activity(&self, activity: &Guid, timestamp: i64) -> Option<&Span> {
        let entry = self.entry_at(activity, timestamp)?;
        match entry.stopped {
            Some(stopped) if stopped < timestamp => None,
            _ if entry.started > timestamp => None,
            _ => self.recorded_from(entry, timestamp),
        }
    }

    /// The span of `activity` at `timestamp`: the latest one to take the id, unless it started
    /// after `timestamp` and an earlier span of the id had started by then.
    fn entry_at(&self, activity: &Guid, timestamp: i64) -> Option<&SpanEntry> {
        let latest = self.spans.get(activity)?;
        if latest.started <= timestamp {
            return Some(latest);
        }
        let earlier = self.reused.get(activity).into_iter().flatten();
        Some(
            earlier
                .rev()
                .find(|e| e.started <= timestamp)
                .unwrap_or(latest),
        )
    }

    /// The earlier span of reused id `activity` that a stop of `span_id` ends, if it is not the
    /// latest one.
    fn reused_entry(&mut self, activity: Guid, span_id: Option<SpanId>) -> Option<&mut SpanEntry> {
        let span_id = span_id?;
        if self.spans.get(&activity)?.span.span_id == span_id {
            return None;
        }
        self.reused
            .get_mut(&activity)?
            .iter_mut()
            .rev()
            .find(|e| e.span.span_id == span_id)
    }

    /// The stream that fed the tracker ended (its session was stopped, renewed or lost) and a
    /// new one may follow: what happened in between is not seen, so a thread's span may have
    /// stopped unseen and the thread gone on to other work. From just after the newest event on,
    /// each thread runs no known span until its next event: samples there are left unlinked
    /// rather than joined to a span that may be over.
    pub fn stream_ended(&mut self) {
        if self.latest == i64::MIN {
            return;
        }
        let at = self.latest.saturating_add(1);
        let threads: Vec<u64> = self.threads.keys().copied().collect();
        for thread in threads {
            self.switch(thread, at, Guid::NIL);
        }
    }

    /// The newest event time seen (QPC ticks): samples up to about this time can be joined now;
    /// later ones may still gain switches from events not yet delivered.
    pub fn latest_timestamp(&self) -> Option<i64> {
        (self.latest != i64::MIN).then_some(self.latest)
    }

    pub fn stats(&self) -> TrackerStats {
        self.stats
    }

    /// Spans currently held (open, or stopped within the retention).
    pub fn span_count(&self) -> usize {
        self.spans.len()
    }

    /// Timeline entries currently held over all threads.
    pub fn switch_count(&self) -> usize {
        self.switch_count
    }

    /// A span that starts from within an open span of another trace means that the open span's
    /// flow outlived it: its stop was lost (dropped by the runtime, or written while another
    /// session had replaced the linkage providers' arguments), and the flow would otherwise be
    /// joined to it for good. It is taken as stopped now. Nested spans share their trace; a new
    /// trace started inside a span (a message handler with a remote parent) ends the outer
    /// span's linkage early, which loses samples but never names a wrong span.
    fn abandon_foreign_parent(&mut self, restore: Guid, span: &Span, timestamp: i64) {
        if let Some(parent) = self.spans.get_mut(&restore) {
            if parent.stopped.is_none() && parent.span.trace_id != span.trace_id {
                parent.stopped = Some(timestamp);
                self.stats.abandoned_spans += 1;
            }
        }
    }

    fn advance(&mut self, timestamp: i64) {
        self.latest = self.latest.max(timestamp);
    }

    fn current(&self, thread: u64) -> Option<Guid> {
        self.threads.get(&thread)?.back().map(|s| s.activity)
    }

    fn switch(&mut self, thread: u64, timestamp: i64, activity: Guid) {
        if !self.threads.contains_key(&thread) && self.threads.len() >= self.limits.max_threads {
            self.evict_idlest_thread();
        }
        let switches = self.threads.entry(thread).or_default();
        let Some(last) = switches.back() else {
            switches.push_back(Switch {
                timestamp,
                activity,
            });
            self.switch_count += 1;
            self.stats.switches += 1;
            return;
        };
        if last.activity == activity {
            return;
        }
        // A thread's events are in time order within one stream; should a feeder mix streams,
        // keep the timeline sorted rather than answer from a wrong entry.
        let at = if last.timestamp <= timestamp {
            switches.len()
        } else {
            tracing::debug!(thread, timestamp, "thread switch out of time order");
            switches.partition_point(|s| s.timestamp <= timestamp)
        };
        switches.insert(
            at,
            Switch {
                timestamp,
                activity,
            },
        );
        self.switch_count += 1;
        self.stats.switches += 1;
    }

    fn evict_idlest_thread(&mut self) {
        let idlest = self
            .threads
            .iter()
            .min_by_key(|(_, s)| s.back().map_or(i64::MIN, |s| s.timestamp))
            .map(|(&thread, _)| thread);
        if let Some(switches) = idlest.and_then(|thread| self.threads.remove(&thread)) {
            self.switch_count -= switches.len();
            self.stats.evicted_threads += 1;
        }
    }

    fn ticks(&self, d: Duration) -> i64 {
        let ticks = d.as_nanos() * self.ticks_per_second.max(1) as u128 / 1_000_000_000;
        i64::try_from(ticks).unwrap_or(i64::MAX)
    }

    /// Drops what the retention and the caps no longer cover.
    fn sweep(&mut self) {
        self.since_sweep = 0;
        let cutoff = self
            .latest
            .saturating_sub(self.ticks(self.limits.retention));
        let open_cutoff = self
            .latest
            .saturating_sub(self.ticks(self.limits.max_open_age));

        let mut expired = 0;
        self.spans.retain(|_, e| match e.stopped {
            Some(stopped) => stopped > cutoff,
            None => {
                let keep = e.started > open_cutoff;
                expired += u64::from(!keep);
                keep
            }
        });
        self.stats.expired_spans += expired;
        self.reused.retain(|_, earlier| {
            earlier.retain(|e| e.stopped.map_or(e.started > open_cutoff, |s| s > cutoff));
            !earlier.is_empty()
        });
        let spans = &self.spans;
        self.reused
            .retain(|activity, _| spans.contains_key(activity));
        let reused: usize = self.reused.values().map(Vec::len).sum();
        if reused > self.limits.max_spans {
            self.stats.evicted_spans += reused as u64;
            self.reused.clear();
        }
        self.stats.evicted_spans +=
            evict_oldest(&mut self.spans, self.limits.max_spans, |e| e.started);
        let spans = &self.spans;
        self.by_span_id.retain(|_, key| spans.contains_key(key));
        let before = self.early_stops.len();
        self.early_stops.retain(|_, &mut stopped| stopped > cutoff);
        let unmatched = before - self.early_stops.len()
            + evict_oldest(&mut self.early_stops, self.limits.max_spans, |&t| t) as usize;
        self.stats.unmatched_stops += unmatched as u64;

        // Keep each thread's switches from the last one at or before the cutoff onwards: they
        // answer every query within the retention. A thread whose only state is that old and
        // names no live span says nothing a missing thread would not.
        let mut kept = 0;
        self.threads.retain(|_, switches| {
            while switches.len() > 1 && switches[1].timestamp <= cutoff {
                switches.pop_front();
            }
            let stale = switches.len() == 1
                && switches[0].timestamp <= cutoff
                && !spans.contains_key(&switches[0].activity);
            kept += if stale { 0 } else { switches.len() };
            !stale
        });
        self.switch_count = kept;
        if self.switch_count > self.limits.max_switches {
            self.shed_switches();
        }
    }

    /// Over the cap within the retention (a very busy process): keep every thread's newest
    /// switches, an equal share each, half the cap in total so that sheds stay rare.
    fn shed_switches(&mut self) {
        let share = (self.limits.max_switches / 2 / self.threads.len().max(1)).max(1);
        let mut kept = 0;
        for switches in self.threads.values_mut() {
            let excess = switches.len().saturating_sub(share);
            switches.drain(..excess);
            self.stats.evicted_switches += excess as u64;
            kept += switches.len();
        }
        self.switch_count = kept;
    }
}

/// Removes the oldest entries (by `time`) beyond `max`; returns how many.
fn evict_oldest<K: Copy + Eq + std::hash::Hash, V>(
    map: &mut HashMap<K, V>,
    max: usize,
    time: impl Fn(&V) -> i64,
) -> u64 {
    let Some(excess) = map.len().checked_sub(max).filter(|&n| n > 0) else {
        return 0;
    };
    let mut by_age: Vec<(i64, K)> = map.iter().map(|(k, v)| (time(v), *k)).collect();
    by_age.select_nth_unstable_by_key(excess - 1, |&(t, _)| t);
    for (_, key) in &by_age[..excess] {
        map.remove(key);
    }
    excess as u64
}

impl EventObserver for SpanTracker {
    fn on_event(&mut self, event: &Event<'_>) {
        // Counted in `TrackerStats::rejected_events`; one bad event must not stop the tracking.
        let _ = self.observe(event);
    }
}

#[cfg(test)]
mod tests;
