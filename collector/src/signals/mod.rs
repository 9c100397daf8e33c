//! Logs and exceptions as first-class signals of an attached process: decoded once from its
//! sessions (`Microsoft-Extensions-Logging` messages from its logs session, which asks for what
//! every consumer asks: [`demand`]; the runtime's `ExceptionThrown_V1` from its light session), kept
//! in a bounded history per process and fanned out live, for the three consumers: the API (`/logs`,
//! `/exceptions`), the collection rules (`CollectLogs` with the seconds before a trigger, exception
//! counts) and OTLP export. Finished spans (with trace linkage, when an exporter sends traces) are
//! fanned out live too, on a feed of their own, for OTLP export, and the slowest of each minute
//! are kept for incidents ([`slowest`]).
//!
//! Every record, scope and queued value is charged to the process's share of the agent's signal
//! budget ([`SignalShare`]) while anything holds it; log records are kept by the time they
//! arrived, not the time the target stamped on them.

pub mod budget;
pub mod demand;
pub mod exceptions;
pub mod logs;
pub mod slowest;
pub mod spans;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::sync::broadcast;

pub use budget::{SignalKind, SignalShare};
pub use demand::{DemandGuard, LogsDemand};
pub use exceptions::{ExceptionFilter, ExceptionFormat, ExceptionsFilters};
pub use logs::{LogFormat, LogsSettings, ScopeTracker};
use nettrace::events::{ExceptionThrown, LoggingEvent};
use nettrace::Event;
use profile::budget::{Charged, Hold};
use profile::exception::{ExceptionFrame, ExceptionRecord};
use profile::log::{IdsFrom, LogRecord};
use profile::signal::{KeptException, KeptLog, Signal};
use profile::span::Span;
use profile::span::SpanRecord;
pub use spans::SpanError;

/// How much of each signal a process keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignalLimits {
    /// Exceptions kept, newest last (dotnet-monitor keeps 1,000 by default too).
    pub max_exceptions: usize,
    /// How long log records are kept (the pre-trigger window of `CollectLogs`).
    pub log_retention: Duration,
    /// Log records kept at most, whatever their age.
    pub max_logs: usize,
    /// Records a live reader (`/logs`, an exporter) may fall behind before it loses the oldest.
    pub live_capacity: usize,
}

impl Default for SignalLimits {
    fn default() -> Self {
        SignalLimits {
            max_exceptions: 1000,
            log_retention: Duration::from_secs(30),
            max_logs: 100_000,
            live_capacity: 8192,
        }
    }
}

#[derive(Debug, Default)]
struct History {
    /// With the time each arrived (Unix nanoseconds, the agent's clock), oldest first.
    logs: VecDeque<(i64, KeptLog)>,
    exceptions: VecDeque<(i64, KeptException)>,
    /// What the kept records hold of the process's share.
    kept_bytes: usize,
    next_exception_id: u64,
    logs_total: u64,
    exceptions_total: u64,
    /// The last exception thrown on each thread, for [`ExceptionRecord::inner_id`].
    last_on_thread: HashMap<u64, u64>,
}

/// Threads remembered for inner-exception linkage.
const MAX_THREADS: usize = 4096;

impl History {
    fn keep_log(&mut self, arrived: i64, record: KeptLog) {
        self.kept_bytes += record.held_bytes();
        self.logs.push_back((arrived, record));
    }

    fn pop_log(&mut self) -> bool {
        let Some((_, record)) = self.logs.pop_front() else {
            return false;
        };
        self.kept_bytes -= record.held_bytes();
        true
    }

    fn keep_exception(&mut self, arrived: i64, record: KeptException) {
        self.kept_bytes += record.held_bytes();
        self.exceptions.push_back((arrived, record));
    }

    fn pop_exception(&mut self) -> bool {
        let Some((_, record)) = self.exceptions.pop_front() else {
            return false;
        };
        self.kept_bytes -= record.held_bytes();
        true
    }

    /// Lets the oldest record of `kind` go, else the oldest of the other kind (a flood of log
    /// records takes the room of other log records first, not the exceptions'); what it was.
    fn let_go_oldest(&mut self, kind: SignalKind) -> Option<SignalKind> {
        use SignalKind::{Exceptions, Logs};
        let order = if kind == Exceptions {
            [Exceptions, Logs]
        } else {
            [Logs, Exceptions]
        };
        order.into_iter().find(|&k| {
            if k == Exceptions {
                self.pop_exception()
            } else {
                self.pop_log()
            }
        })
    }

    /// Lets the log records go that arrived longer than the retention before `now`.
    fn expire_logs(&mut self, now: i64, limits: &SignalLimits) {
        let retention = i64::try_from(limits.log_retention.as_nanos()).unwrap_or(i64::MAX);
        let horizon = now.saturating_sub(retention);
        while self.logs.front().is_some_and(|(at, _)| *at < horizon) {
            self.pop_log();
        }
    }
}

/// Where the process's logs session ([`LogsFeed`]) finds the spans its messages were logged in:
/// the process's span tracker, which lives with its profiler and learns spans from another
/// session, whose stream may run behind the logs session's.
pub trait SpanSource: Send + Sync {
    /// Whether the tracking session has delivered its events up to `unix_nanos` (or has been
    /// quiet long enough that nothing is pending): spans begun by then are known.
    fn caught_up(&self, unix_nanos: i64) -> bool;
    /// The span EventSource activity `activity` was in at raw event timestamp `timestamp`, else
    /// the span `thread` ran then.
    fn span(&self, activity: profile::guid::Guid, thread: u64, timestamp: i64) -> Option<Span>;
}

/// A shared [`SpanSource`].
#[derive(Clone)]
pub struct SpanLookup(pub Arc<dyn SpanSource>);

impl std::fmt::Debug for SpanLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpanLookup")
    }
}

/// One process's logs and exceptions. Cloning shares.
#[derive(Debug, Clone)]
pub struct ProcessSignals {
    history: Arc<Mutex<History>>,
    live: LiveFeed<Signal>,
    /// Finished spans, on a feed of their own: a burst of spans must not push log records out
    /// of a slow reader's reach, and each loss is counted for its signal.
    live_spans: LiveFeed<Arc<SpanRecord>>,
    limits: SignalLimits,
    /// What everything kept or queued is charged to.
    share: SignalShare,
    /// What the always-on collection keeps and exports, and what every consumer asks.
    demand: Arc<LogsDemand>,
    /// Set once the process's profiler (and its span tracker, with linkage on) exists.
    spans: Arc<OnceLock<SpanLookup>>,
    /// Whether finished spans are read from the session's span stops, for export.
    export_spans: bool,
    /// The slowest finished spans of each recent minute.
    slowest: Arc<Mutex<slowest::SlowestSpans>>,
}

/// Exceptions kept at the default limits, no logs, no budget.
impl Default for ProcessSignals {
    fn default() -> Self {
        ProcessSignals::new(SignalLimits::default(), None, SignalShare::unlimited())
    }
}

impl ProcessSignals {
    pub fn new(limits: SignalLimits, logs: Option<LogsSettings>, share: SignalShare) -> Self {
        ProcessSignals {
            history: Arc::default(),
            live: LiveFeed::default(),
            live_spans: LiveFeed::default(),
            limits,
            share,
            demand: LogsDemand::new(logs),
            spans: Arc::default(),
            export_spans: false,
            slowest: Arc::default(),
        }
    }

    /// Also read finished spans (the session's linkage providers must ask for them:
    /// [`crate::providers::linkage`] with `spans`).
    pub fn with_spans(mut self) -> Self {
        self.export_spans = true;
        self
    }

    /// Hands a finished span to the live readers, keeping it if it is among its minute's slowest.
    pub fn push_span(&self, record: SpanRecord) {
        let record = Arc::new(record);
        self.slowest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .offer(&record);
        self.live_spans.send(record);
    }

    /// The slowest kept spans that ended in `[from, until)` (Unix nanoseconds), at most `limit`.
    pub fn slowest_spans(&self, from: i64, until: i64, limit: usize) -> slowest::Slowest {
        let kept = self.slowest.lock().unwrap_or_else(|p| p.into_inner());
        kept.slowest(from, until, limit)
    }

    /// Finished spans from now on; a reader that falls [`SignalLimits::live_capacity`] behind
    /// is told how many it lost.
    pub fn subscribe_spans(&self) -> broadcast::Receiver<Arc<SpanRecord>> {
        self.live_spans.subscribe(self.limits.live_capacity)
    }

    /// Gives the process's span lookup to sessions started later; the first one given stays.
    pub fn set_span_lookup(&self, lookup: SpanLookup) {
        let _ = self.spans.set(lookup);
    }

    pub fn span_lookup(&self) -> Option<&SpanLookup> {
        self.spans.get()
    }

    fn lock(&self) -> MutexGuard<'_, History> {
        // Records are pushed whole: a panic elsewhere cannot leave one half-written.
        self.history.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The logs the always-on collection keeps and exports, if any.
    pub fn collected_logs(&self) -> Option<&LogsSettings> {
        self.demand.base()
    }

    /// Every consumer's demand for the process's logs, which its logs session serves.
    pub fn logs_demand(&self) -> &Arc<LogsDemand> {
        &self.demand
    }

    pub fn limits(&self) -> SignalLimits {
        self.limits
    }

    /// The process's share of the signal budget.
    pub fn share(&self) -> &SignalShare {
        &self.share
    }

    /// Holds `bytes` for a record of `kind` (logs or exceptions) to keep, letting the oldest
    /// kept records go, of its kind first, while the history would take more than half the
    /// process's share (the rest is for scopes, rings, queued values and answers) or the share
    /// has no room; `None`, counted, when nothing left to let go makes room. A record let go
    /// early counts as dropped too.
    fn make_room(&self, kind: SignalKind, bytes: usize) -> Option<Hold> {
        let history_limit = self.share.budget().limit() / 2;
        loop {
            let mut h = self.lock();
            if h.kept_bytes.saturating_add(bytes) <= history_limit {
                if let Some(hold) = self.share.try_hold(bytes) {
                    return Some(hold);
                }
            }
            match h.let_go_oldest(kind) {
                Some(let_go) => self.share.count_dropped(let_go, 1),
                None => {
                    self.share.count_dropped(kind, 1);
                    return None;
                }
            }
        }
    }

    /// `record`, charged to the process's share (see [`ProcessSignals::make_room`]).
    pub fn charge_log(&self, record: LogRecord) -> Option<Charged<LogRecord>> {
        let hold = self.make_room(SignalKind::Logs, budget::log_bytes(&record))?;
        Some(Charged::new(record, hold))
    }

    /// A charged record of the logs session ([`ProcessSignals::charge_log`]): kept for the
    /// retention, by the time it arrives, when the always-on collection selects it, and handed to
    /// the live readers, each of which picks its own.
    pub fn push_log(&self, record: Charged<LogRecord>) {
        let record = Arc::new(record);
        let kept = self.limits.max_logs > 0
            && self
                .collected_logs()
                .is_some_and(|c| c.accepts(&record.message.category, record.message.level));
        if kept {
            let mut h = self.lock();
            h.logs_total += 1;
            let now = profile::clock::unix_nanos();
            h.expire_logs(now, &self.limits);
            if h.logs.len() >= self.limits.max_logs {
                h.pop_log();
            }
            h.keep_log(now, record.clone());
        }
        self.live.send(Signal::Log(record));
    }

    /// Keeps an exception (with a history of more than 0), giving it its id and its inner
    /// exception, and hands it to the live readers; its id, or `None` when it does not fit in
    /// the process's share (counted). A rethrow (`throw;`) raises the same exception object
    /// again: it is reported once, as dotnet-monitor does, and gets the id it had (the event has
    /// no object identity; the last one thrown on the thread, of the same type and message, is
    /// taken to be it).
    pub fn push_exception(&self, mut record: ExceptionRecord) -> Option<u64> {
        if let Some(id) = self.rethrown(&record) {
            return Some(id);
        }
        let bytes = budget::exception_bytes(&record);
        let hold = self.make_room(SignalKind::Exceptions, bytes)?;
        let record = {
            let mut h = self.lock();
            let previous = h.last_on_thread.get(&record.thread_id).copied();
            h.next_exception_id += 1;
            h.exceptions_total += 1;
            record.id = h.next_exception_id;
            if record.flags & profile::exception::FLAG_HAS_INNER != 0 {
                record.inner_id = previous;
            }
            if h.last_on_thread.len() >= MAX_THREADS && previous.is_none() {
                h.last_on_thread.clear();
            }
            h.last_on_thread.insert(record.thread_id, record.id);
            let record = Arc::new(Charged::new(record, hold));
            if self.limits.max_exceptions > 0 {
                while h.exceptions.len() >= self.limits.max_exceptions {
                    h.pop_exception();
                }
                h.keep_exception(profile::clock::unix_nanos(), record.clone());
            }
            record
        };
        let id = record.id;
        self.live.send(Signal::Exception(record));
        Some(id)
    }

    /// The id of the kept exception `record` rethrows, if it is a rethrow of the last one thrown
    /// on its thread.
    fn rethrown(&self, record: &ExceptionRecord) -> Option<u64> {
        if record.flags & profile::exception::FLAG_RETHROWN == 0 {
            return None;
        }
        let h = self.lock();
        let previous = h.last_on_thread.get(&record.thread_id).copied()?;
        h.exceptions
            .iter()
            .rev()
            .map(|(_, e)| e)
            .find(|e| e.id == previous)
            .filter(|e| e.type_name == record.type_name && e.message == record.message)
            .map(|e| e.id)
    }

    /// The kept log records that arrived at or after `since_unix_nanos`, oldest first.
    pub fn logs_since(&self, since_unix_nanos: i64) -> Vec<KeptLog> {
        let mut h = self.lock();
        h.expire_logs(profile::clock::unix_nanos(), &self.limits);
        h.logs
            .iter()
            .filter(|(arrived, _)| *arrived >= since_unix_nanos)
            .map(|(_, record)| record.clone())
            .collect()
    }

    /// The kept exceptions, oldest first.
    pub fn exceptions(&self) -> Vec<KeptException> {
        let h = self.lock();
        h.exceptions.iter().map(|(_, e)| e.clone()).collect()
    }

    /// Log records and exceptions seen since the process attached.
    pub fn totals(&self) -> (u64, u64) {
        let h = self.lock();
        (h.logs_total, h.exceptions_total)
    }

    /// Records from now on; a reader that falls [`SignalLimits::live_capacity`] behind is told
    /// how many it lost (`RecvError::Lagged`).
    pub fn subscribe(&self) -> broadcast::Receiver<Signal> {
        self.live.subscribe(self.limits.live_capacity)
    }
}

/// A broadcast feed made at its first reader: a channel holds a slot per record of its capacity
/// from the start (8192 slots, ~0.3 MB), which a node agent would pay for every process although
/// most are never read live.
#[derive(Debug, Clone)]
struct LiveFeed<T>(Arc<OnceLock<broadcast::Sender<T>>>);

impl<T> Default for LiveFeed<T> {
    fn default() -> Self {
        LiveFeed(Arc::default())
    }
}

impl<T: Clone> LiveFeed<T> {
    /// Hands `record` to the readers; without a reader nobody is reading live, and it is dropped.
    fn send(&self, record: T) {
        if let Some(sender) = self.0.get() {
            let _ = sender.send(record);
        }
    }

    fn subscribe(&self, capacity: usize) -> broadcast::Receiver<T> {
        self.0
            .get_or_init(|| broadcast::channel(capacity.max(1)).0)
            .subscribe()
    }
}

/// Why a process's kept logs cannot serve a request (a request's own session then serves it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogsUnavailable {
    #[error("the agent collects no logs: start it with --logs LEVEL (Trace … Critical)")]
    NotCollected,
    #[error(
        "logs at {asked:?} were asked for, but the agent collects {collected:?} and above: \
         ask for {collected:?} or higher, or start the agent with --logs {asked:?}"
    )]
    BelowCollected {
        asked: profile::log::LogLevel,
        collected: profile::log::LogLevel,
    },
    #[error(
        "UseAppFilters is {asked}, but the agent collects with UseAppFilters {collected}: the \
         app's own filters cannot be applied or undone afterwards"
    )]
    AppFilters { asked: bool, collected: bool },
}

/// Whether a session collecting `collected` (`None`: no logs) receives every record `asked`
/// selects: at `asked`'s lowest level or below, with the app's filters on or off as `asked` says
/// (they act inside the app, so records cannot be filtered by them, or unfiltered, afterwards).
pub fn check_covered(
    collected: Option<&LogsSettings>,
    asked: &LogsSettings,
) -> Result<(), LogsUnavailable> {
    let collected = collected.ok_or(LogsUnavailable::NotCollected)?;
    if asked.lowest_level() < collected.lowest_level() {
        return Err(LogsUnavailable::BelowCollected {
            asked: asked.lowest_level(),
            collected: collected.lowest_level(),
        });
    }
    if asked.use_app_filters != collected.use_app_filters {
        return Err(LogsUnavailable::AppFilters {
            asked: asked.use_app_filters,
            collected: collected.use_app_filters,
        });
    }
    Ok(())
}

impl ProcessSignals {
    /// Whether the kept and live records hold every record `settings` select
    /// ([`check_covered`] by the process's always-on session).
    pub fn check_logs(&self, settings: &LogsSettings) -> Result<(), LogsUnavailable> {
        check_covered(self.collected_logs(), settings)
    }
}

/// Logs to write out: the kept records of `before` back, then the live ones for `duration`.
#[derive(Debug, Clone)]
pub struct LogsRequest {
    pub signals: ProcessSignals,
    pub settings: LogsSettings,
    pub format: LogFormat,
    /// `None`: until stopped.
    pub duration: Option<Duration>,
    /// How far back the kept records are included (`CollectLogs`' pre-trigger; zero for `/logs`).
    pub before: Duration,
}

/// Renders `record` into `text` (cleared first) when the live feed brings it anew: logged since
/// `since`, not already written from the history and accepted by the request's filters.
fn render_new(
    request: &LogsRequest,
    seen: &std::collections::HashSet<usize>,
    since: i64,
    record: &KeptLog,
    text: &mut String,
) -> bool {
    // A record logged before the window that the feed brings only now (it waited for its span,
    // or a session restarted for this request delivered the old session's last ones) is not in it.
    if record.unix_nanos < since
        || seen.contains(&(Arc::as_ptr(record) as usize))
        || !request
            .settings
            .accepts(&record.message.category, record.message.level)
    {
        return false;
    }
    text.clear();
    request.format.write(record, text);
    true
}

/// Rendered text written out once it reaches this many bytes.
const WRITE_CHUNK: usize = 64 * 1024;

/// Writes `request`'s records to `out` until its duration is over or `stop` fires; returns the
/// bytes written. A reader that falls behind the live feed loses the oldest records, counted in
/// the log (never buffered without bound).
pub async fn write_logs<W: tokio::io::AsyncWrite + Unpin>(
    request: &LogsRequest,
    out: &mut W,
    stop: impl std::future::Future<Output = ()>,
) -> Result<u64, std::io::Error> {
    use tokio::io::AsyncWriteExt;
    let mut live = request.signals.subscribe();
    let started = profile::clock::unix_nanos();
    let since = started - i64::try_from(request.before.as_nanos()).unwrap_or(i64::MAX);
    let kept = request.signals.logs_since(since);
    // Records already written from the history, so the live feed does not repeat them.
    let seen: std::collections::HashSet<usize> =
        kept.iter().map(|r| Arc::as_ptr(r) as usize).collect();
    let mut text = String::new();
    let mut written = 0u64;
    for record in &kept {
        if request
            .settings
            .accepts(&record.message.category, record.message.level)
        {
            request.format.write(record, &mut text);
        }
        // The history is written as it is rendered, never built whole.
        if text.len() >= WRITE_CHUNK {
            out.write_all(text.as_bytes()).await?;
            written += text.len() as u64;
            text.clear();
        }
    }
    out.write_all(text.as_bytes()).await?;
    written += text.len() as u64;
    out.flush().await?;
    let deadline = async {
        match request.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    tokio::pin!(stop);
    let mut lost = 0u64;
    let timed_out = loop {
        let record = tokio::select! {
            () = &mut deadline => break true,
            () = &mut stop => break false,
            received = live.recv() => match received {
                Ok(Signal::Log(record)) => record,
                Ok(Signal::Exception(_)) => continue,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    lost += n;
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => break false,
            },
        };
        if !render_new(request, &seen, since, &record, &mut text) {
            continue;
        }
        out.write_all(text.as_bytes()).await?;
        written += text.len() as u64;
        // Each record reaches the reader as it happens, as dotnet-monitor streams them.
        out.flush().await?;
    };
    // Records logged within the window may still come: those waiting for their spans (at most
    // MAX_SPAN_WAIT). At the window's end they are waited for, until one logged after it comes;
    // stopped, only those already on the feed are written.
    let end = profile::clock::unix_nanos();
    let tail = if timed_out {
        MAX_SPAN_WAIT + Duration::from_secs(1)
    } else {
        Duration::ZERO
    };
    let tail_end = tokio::time::Instant::now() + tail;
    loop {
        let record = match tokio::time::timeout_at(tail_end, live.recv()).await {
            Err(_) => break,
            Ok(Ok(Signal::Log(record))) => record,
            Ok(Ok(Signal::Exception(_))) => continue,
            Ok(Err(broadcast::error::RecvError::Lagged(n))) => {
                lost += n;
                continue;
            }
            Ok(Err(broadcast::error::RecvError::Closed)) => break,
        };
        if record.unix_nanos >= end {
            break;
        }
        if !render_new(request, &seen, since, &record, &mut text) {
            continue;
        }
        out.write_all(text.as_bytes()).await?;
        written += text.len() as u64;
    }
    if lost > 0 {
        tracing::warn!(
            lost,
            "a logs reader fell behind the live feed; its oldest records were dropped"
        );
    }
    out.flush().await?;
    Ok(written)
}

/// How far past a message the span tracking's stream must have come before the message is
/// joined: a stream brings each thread's events in order, but blocks of different threads out of
/// order (a span's start may come after another thread's later event).
pub const SPAN_CATCH_UP_MARGIN: i64 = 1_000_000_000;
/// How long a message of the logs session (or an exception of the light session) waits for the
/// span tracking to catch up.
pub const MAX_SPAN_WAIT: Duration = Duration::from_secs(3);
/// Messages (or exceptions) waiting for their span at most; past it the oldest is written
/// without waiting.
pub const MAX_WAITING: usize = 16_384;
/// How long a request waits for the logs session to ask for what it needs.
const DEMAND_APPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// A message of the logs session waiting for the span tracking.
struct Waiting {
    /// Charged to the process's share while it waits.
    record: Charged<LogRecord>,
    /// The activity outside its scopes, its thread and raw timestamp.
    outside: profile::guid::Guid,
    thread: u64,
    at: i64,
    arrived: std::time::Instant,
}

/// The process's logs session's messages: decoded, joined to their scopes, and, when the event
/// carries no ids of its own, to the span trace linkage saw them in once its session (another
/// stream, which may run behind) has caught up with them (at most [`MAX_SPAN_WAIT`] later);
/// then handed to the process's signals, in order.
#[derive(Debug)]
pub struct LogsFeed(Mutex<FeedState>);

struct FeedState {
    collector: SignalCollector,
    /// Oldest first.
    waiting: VecDeque<Waiting>,
    /// Records handed on before the span tracking had caught up with them, so without the ids
    /// it would have guessed.
    unjoined: u64,
}

impl std::fmt::Debug for FeedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeedState")
            .field("waiting", &self.waiting.len())
            .finish()
    }
}

impl LogsFeed {
    pub fn new(signals: ProcessSignals) -> LogsFeed {
        LogsFeed(Mutex::new(FeedState {
            collector: SignalCollector::new(signals),
            waiting: VecDeque::new(),
            unjoined: 0,
        }))
    }

    fn lock(&self) -> MutexGuard<'_, FeedState> {
        // Records move whole from the queue to the signals: a panic cannot leave one half-moved.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An event of the logs session.
    pub fn on_event(&self, event: &Event<'_>) {
        let Ok(Some(nettrace::events::KnownEvent::Logging(logging))) = event.known() else {
            return;
        };
        let mut feed = self.lock();
        if let Some((record, outside)) = feed.collector.log(event, logging) {
            feed.waiting.push_back(Waiting {
                record,
                outside,
                thread: event.header.thread_id,
                at: event.header.timestamp,
                arrived: std::time::Instant::now(),
            });
        }
        feed.release(false);
    }

    /// Hands on the waiting records whose spans are known by now (or that waited long enough),
    /// in order; with `all`, every one. Called as events come and on a timer, so that records
    /// of a quiet session are released too.
    pub fn release(&self, all: bool) {
        self.lock().release(all);
    }
}

impl FeedState {
    /// Hands on the records that are ready, in order. A record's span is looked up only once
    /// the span tracking has caught up with it: before that, the thread's newest switch seen may
    /// be to a span that has ended since, and its ids would be wrong ones; one released by time
    /// or room goes without ids, counted.
    fn release(&mut self, all: bool) {
        let spans = self.collector.signals().span_lookup().cloned();
        while let Some(first) = self.waiting.front() {
            let caught_up = spans.as_ref().is_none_or(|s| {
                s.0.caught_up(first.record.unix_nanos + SPAN_CATCH_UP_MARGIN)
            });
            let ready = all
                || caught_up
                || first.record.span.is_some()
                || self.waiting.len() > MAX_WAITING
                || first.arrived.elapsed() >= MAX_SPAN_WAIT;
            if !ready {
                break;
            }
            let Some(mut w) = self.waiting.pop_front() else {
                break;
            };
            if w.record.span.is_none() && caught_up {
                w.record.span = spans
                    .as_ref()
                    .and_then(|s| s.0.span(w.outside, w.thread, w.at));
                w.record.ids_from = w.record.span.as_ref().map(|_| IdsFrom::Linkage);
            } else if w.record.span.is_none() && spans.is_some() {
                self.unjoined += 1;
                if self.unjoined.is_power_of_two() {
                    tracing::warn!(
                        records = self.unjoined,
                        wait_s = MAX_SPAN_WAIT.as_secs(),
                        "trace linkage is behind the logs session; log records are exported without the span ids it would infer"
                    );
                }
            }
            self.collector.signals.push_log(w.record);
        }
    }
}

/// Writes the logs `request` selects as [`write_logs`] does, having first made the process's logs
/// session ask for them: its demand joins the union the session asks for ([`LogsDemand`]),
/// which starts the session again if the union must widen; this waits until it has (at most
/// [`DEMAND_APPLY_TIMEOUT`]), and the demand lasts until the request ends. Used when the always-on
/// collection does not cover the request ([`ProcessSignals::check_logs`]); as dotnet-monitor's
/// `/logs`, it serves the messages logged from then on.
pub async fn write_demanded_logs<W: tokio::io::AsyncWrite + Unpin>(
    request: &LogsRequest,
    out: &mut W,
    stop: impl std::future::Future<Output = ()>,
) -> Result<u64, std::io::Error> {
    let demand = request.signals.logs_demand().add(request.settings.clone());
    if tokio::time::timeout(DEMAND_APPLY_TIMEOUT, demand.applied())
        .await
        .is_err()
    {
        tracing::warn!(
            "the logs session did not start with what a logs request asks within {}s; \
             serving what it delivers",
            DEMAND_APPLY_TIMEOUT.as_secs()
        );
    }
    let written = write_logs(request, out, stop).await;
    drop(demand);
    written
}

/// The kept exceptions to write out, as dotnet-monitor's `/exceptions` and `CollectExceptions`
/// write its history: a snapshot at the time of asking, filtered.
#[derive(Debug, Clone)]
pub struct ExceptionsRequest {
    pub signals: ProcessSignals,
    pub filters: ExceptionsFilters,
    pub format: ExceptionFormat,
}

/// Writes `request`'s exceptions to `out`, oldest first; returns the bytes written.
pub async fn write_exceptions<W: tokio::io::AsyncWrite + Unpin>(
    request: &ExceptionsRequest,
    out: &mut W,
) -> Result<u64, std::io::Error> {
    use tokio::io::AsyncWriteExt;
    let mut text = String::new();
    let mut written = 0u64;
    let records: Vec<KeptException> = request
        .signals
        .exceptions()
        .into_iter()
        .filter(|r| request.filters.selects(r))
        .collect();
    // Text nests each inner exception from those written before it (as dotnet-monitor's).
    let mut prior: HashMap<u64, &ExceptionRecord> = HashMap::new();
    for record in &records {
        match request.format {
            ExceptionFormat::Text => exceptions::write_text_with(record, &prior, &mut text),
            format => format.write(record, &mut text),
        }
        prior.insert(record.id, record);
        // A history of 1,000 exceptions with deep stacks is megabytes: written in pieces.
        if text.len() >= WRITE_CHUNK {
            out.write_all(text.as_bytes()).await?;
            written += text.len() as u64;
            text.clear();
        }
    }
    out.write_all(text.as_bytes()).await?;
    written += text.len() as u64;
    out.flush().await?;
    Ok(written)
}

/// Turns a process's logging and exception events into records: scopes tracked, spans joined.
/// The caller names the throwing stack and looks spans up (it holds the code map and the span
/// tracker).
#[derive(Debug)]
pub struct SignalCollector {
    signals: ProcessSignals,
    scopes: ScopeTracker,
    unreadable_spans: u64,
}

impl SignalCollector {
    pub fn new(signals: ProcessSignals) -> Self {
        SignalCollector {
            signals,
            scopes: ScopeTracker::default(),
            unreadable_spans: 0,
        }
    }

    pub fn signals(&self) -> &ProcessSignals {
        &self.signals
    }

    /// A logging event, for [`LogsFeed`], which joins messages to spans later (the span tracking
    /// runs in another session): the message's record, charged to the process's share, its span
    /// only if the event carries one, and the activity outside its scopes. Scope events, messages
    /// no consumer asks for and those that do not fit give `None`.
    fn log(
        &mut self,
        event: &Event<'_>,
        logging: LoggingEvent,
    ) -> Option<(Charged<LogRecord>, profile::guid::Guid)> {
        // A target may send what was not asked for: nothing is kept of it.
        if !self.signals.demand.wanted() {
            return None;
        }
        let header = event.header;
        match logging {
            LoggingEvent::ScopeStart { values, .. } => {
                let bytes = budget::scope_bytes(&values);
                // A scope that does not fit is left out of the records logged in it.
                if let Some(values) = self
                    .signals
                    .share
                    .charged(SignalKind::Scopes, values, bytes)
                {
                    let values = Arc::new(values);
                    self.scopes
                        .start(header.activity_id, header.related_activity_id, values);
                }
                None
            }
            LoggingEvent::ScopeStop { .. } => {
                self.scopes.stop(header.activity_id);
                None
            }
            LoggingEvent::Message(message) => {
                // What the process-wide filters let through beyond what any consumer asks (a
                // session of another tool's may have widened them) is not taken.
                if !self
                    .signals
                    .demand
                    .accepts(&message.category, message.level)
                {
                    return None;
                }
                let (scopes, outside) = self.scopes.resolve(header.activity_id);
                let span = message.trace.map(|t| Span {
                    trace_id: t.trace_id,
                    span_id: t.span_id,
                    name: Arc::from(""),
                });
                let ids_from = message.trace.map(|t| IdsFrom::Event { flags: t.flags });
                let record = LogRecord {
                    unix_nanos: event.unix_nanos(),
                    message,
                    scopes,
                    span,
                    ids_from,
                };
                Some((self.signals.charge_log(record)?, outside))
            }
        }
    }

    /// A DiagnosticSourceEventSource span stop: a finished span when spans are collected and it
    /// was recorded. Stops without the span's fields are counted and logged once in a while.
    pub fn span_stop(&mut self, stop: &nettrace::events::DiagnosticSourceEvent) {
        if !self.signals.export_spans {
            return;
        }
        match spans::from_stop(stop) {
            Ok(Some(record)) => self.signals.push_span(record),
            Ok(None) => {}
            Err(error) => {
                self.unreadable_spans += 1;
                if self.unreadable_spans.is_power_of_two() {
                    tracing::warn!(%error, count = self.unreadable_spans, "span stops that cannot be exported");
                }
            }
        }
    }

    /// The record of an `ExceptionThrown_V1` with its named stack (innermost first), not joined
    /// to a span yet: the caller looks it up once the span tracking has caught up with it.
    pub fn exception_record(
        event: &Event<'_>,
        thrown: ExceptionThrown,
        frames: Vec<ExceptionFrame>,
    ) -> ExceptionRecord {
        ExceptionRecord {
            id: 0,
            unix_nanos: event.unix_nanos(),
            thread_id: event.header.thread_id,
            type_name: thrown.exception_type,
            message: thrown.message,
            hresult: thrown.hresult,
            flags: thrown.flags,
            inner_id: None,
            frames,
            span: None,
        }
    }

    /// Keeps an exception's record (see [`SignalCollector::exception_record`]).
    pub fn exception(&mut self, record: ExceptionRecord) {
        self.signals.push_exception(record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nettrace::events::{KnownEvent, LOGGING_PROVIDER};
    use nettrace::testutil::{scalar_fields, utf16z, EventSpec, MetadataRecord, StreamBuilder};
    use nettrace::Parser;
    use profile::budget::SharedBudget;
    use profile::guid::Guid;
    use profile::log::LogLevel;

    fn guid(n: u8) -> Guid {
        let mut bytes = [0; 16];
        bytes[0] = n;
        Guid::from_bytes_le(bytes)
    }

    /// Issue 44's stream: 16 nested scopes of 30 values of 16,000 characters, then `messages`
    /// messages inside them, stamped by the target at its start.
    fn scoped_messages(messages: u32) -> Vec<u8> {
        let start = scalar_fields(&[
            (9, "ID"),
            (9, "FactoryID"),
            (18, "LoggerName"),
            (18, "ArgumentsJson"),
        ]);
        let message = scalar_fields(&[
            (9, "Level"),
            (9, "FactoryID"),
            (18, "LoggerName"),
            (9, "EventId"),
            (18, "EventName"),
            (18, "ExceptionJson"),
            (18, "ArgumentsJson"),
            (18, "FormattedMessage"),
        ]);
        let mut b = StreamBuilder::new(8);
        b.metadata_block(
            &[
                MetadataRecord::new(1, LOGGING_PROVIDER, 6, "ActivityJsonStart")
                    .raw_fields(start)
                    .encode(),
                MetadataRecord::new(2, LOGGING_PROVIDER, 5, "MessageJson")
                    .raw_fields(message)
                    .encode(),
            ],
            true,
        );
        let mut seq = 0;
        for depth in 0..16u8 {
            let values: serde_json::Map<String, serde_json::Value> = (0..30)
                .map(|i| (format!("v{depth}.{i}"), "x".repeat(16_000).into()))
                .collect();
            let mut p = i32::from(depth).to_le_bytes().to_vec();
            p.extend(1i32.to_le_bytes());
            p.extend(utf16z("Scopes"));
            p.extend(utf16z(&serde_json::Value::Object(values).to_string()));
            seq += 1;
            let e = EventSpec::new(1, seq, 7, 1000, p).activity(guid(depth + 1), guid(depth));
            b.event_block(&[e], true);
        }
        for n in 0..messages {
            let mut p = 2i32.to_le_bytes().to_vec();
            p.extend(1i32.to_le_bytes());
            p.extend(utf16z("Scopes"));
            p.extend(1i32.to_le_bytes());
            for text in ["Inside", "", "{}", &format!("message {n}")] {
                p.extend(utf16z(text));
            }
            seq += 1;
            let e = EventSpec::new(2, seq, 7, 1000, p).activity(guid(16), guid(15));
            b.event_block(&[e], true);
        }
        b.finish()
    }

    /// Feeds `stream`'s logging events to `signals` as the process's logs session would.
    fn collect(signals: &ProcessSignals, stream: &[u8]) {
        let feed = LogsFeed::new(signals.clone());
        let mut parser = Parser::new();
        parser.feed(stream).unwrap();
        while let Some(event) = parser.next_event().unwrap() {
            feed.on_event(&event);
        }
        feed.release(true);
    }

    fn trace_logs() -> Option<LogsSettings> {
        Some(LogsSettings::for_level(Some(LogLevel::Trace)))
    }

    #[test]
    fn records_share_their_scopes_and_stay_within_the_share() {
        let stream = scoped_messages(100);
        let agent = SharedBudget::new(64 << 20);
        let share = SignalShare::new(agent.share(16 << 20));
        let signals = ProcessSignals::new(SignalLimits::default(), trace_logs(), share.clone());
        collect(&signals, &stream);
        let logs = signals.logs_since(i64::MIN);
        assert_eq!(logs.len(), 100);
        assert_eq!(logs[0].scopes.len(), 16);
        // Kept once: every record holds the same values.
        assert!(Arc::ptr_eq(&logs[0].scopes[15], &logs[99].scopes[15]));
        // 16 scopes of at most MAX_ARGUMENTS_BYTES, plus a few hundred bytes per record.
        let scopes = 16 * nettrace::events::MAX_TEXT_BYTES * 5;
        assert!(agent.held() < scopes + 100 * 1024, "{}", agent.held());
        drop(logs);

        // A share with room for the scopes and a few records: the oldest records go, counted.
        let scopes_only = SignalShare::unlimited();
        let signals = ProcessSignals::new(SignalLimits::default(), trace_logs(), scopes_only);
        let mut collector = SignalCollector::new(signals.clone());
        let mut parser = Parser::new();
        parser.feed(&stream).unwrap();
        while let Some(event) = parser.next_event().unwrap() {
            if let Ok(Some(KnownEvent::Logging(logging))) = event.known() {
                if matches!(logging, LoggingEvent::ScopeStart { .. }) {
                    assert!(collector.log(&event, logging).is_none());
                }
            }
        }
        let scope_bytes = signals.share().budget().held();
        let small = SignalShare::new(agent.share(scope_bytes + 20_000));
        let signals = ProcessSignals::new(SignalLimits::default(), trace_logs(), small.clone());
        collect(&signals, &stream);
        let kept = signals.logs_since(i64::MIN);
        assert!(!kept.is_empty() && kept.len() < 100, "{}", kept.len());
        assert_eq!(kept.last().unwrap().message.message, "message 99");
        assert_eq!(small.dropped(SignalKind::Logs), 100 - kept.len() as u64);
        assert_eq!(small.dropped(SignalKind::Scopes), 0);
        assert!(small.budget().held() <= scope_bytes + 20_000);
    }

    /// A span tracker whose stream is (or is not) caught up, and which names the same span for
    /// any lookup: the one a thread's newest switch seen points at.
    struct Tracker {
        caught_up: bool,
    }

    impl SpanSource for Tracker {
        fn caught_up(&self, _unix_nanos: i64) -> bool {
            self.caught_up
        }

        fn span(&self, _activity: Guid, _thread: u64, _timestamp: i64) -> Option<Span> {
            Some(Span {
                trace_id: profile::span::TraceId::from_hex("0af7651916cd43dd8448eb211c80319c")?,
                span_id: profile::span::SpanId::from_hex("00f067aa0ba902b7")?,
                name: "seen".into(),
            })
        }
    }

    /// Issue 45 (checking a guess at .NET 8's records without ids): a record the span tracking has
    /// not caught up with is handed on without inferred ids, not with those of the span its
    /// thread was last seen in; once caught up, it gets them.
    #[test]
    fn records_get_no_inferred_ids_before_linkage_catches_up() {
        for caught_up in [false, true] {
            let signals = ProcessSignals::new(
                SignalLimits::default(),
                trace_logs(),
                SignalShare::unlimited(),
            );
            signals.set_span_lookup(SpanLookup(Arc::new(Tracker { caught_up })));
            collect(&signals, &scoped_messages(3));
            let logs = signals.logs_since(i64::MIN);
            assert_eq!(logs.len(), 3);
            for record in &logs {
                assert_eq!(record.span.is_some(), caught_up, "{:?}", record.span);
                let inferred = caught_up.then_some(IdsFrom::Linkage);
                assert_eq!(record.ids_from, inferred);
            }
        }
    }

    #[test]
    fn the_history_takes_at_most_half_the_share() {
        let share = SignalShare::new(SharedBudget::new(64 << 10));
        let signals = ProcessSignals::new(SignalLimits::default(), trace_logs(), share.clone());
        collect(&signals, &scoped_messages(100));
        // The scopes (1 MiB) did not fit: the records came without them.
        assert_eq!(share.dropped(SignalKind::Scopes), 16);
        let kept = signals.logs_since(i64::MIN);
        assert!(kept.iter().all(|r| r.scopes.is_empty()));
        let history: usize = kept.iter().map(|r| r.held_bytes()).sum();
        assert!(history <= 32 << 10 && history > 24 << 10, "{history}");
        // What the history does not take is there for the rest.
        assert!(share.budget().hold(30 << 10).is_some());
    }

    #[test]
    fn nothing_is_kept_of_logs_nobody_asked_for() {
        let share = SignalShare::unlimited();
        let signals = ProcessSignals::new(SignalLimits::default(), None, share.clone());
        collect(&signals, &scoped_messages(10));
        assert!(signals.logs_since(i64::MIN).is_empty());
        assert_eq!(share.budget().held(), 0);
    }

    #[test]
    fn logs_are_kept_by_the_time_they_arrived_not_the_targets_stamp() {
        let limits = SignalLimits {
            log_retention: Duration::from_millis(200),
            ..SignalLimits::default()
        };
        let signals = ProcessSignals::new(limits, trace_logs(), SignalShare::unlimited());
        // Stamped by the target in 2026-01-02, whatever the time now.
        collect(&signals, &scoped_messages(3));
        assert_eq!(signals.logs_since(i64::MIN).len(), 3);
        std::thread::sleep(Duration::from_millis(300));
        assert!(signals.logs_since(i64::MIN).is_empty());
    }

    /// A rethrow raises the same exception object again: one record, as dotnet-monitor reports
    /// each exception object once; a new exception of the same type is a record of its own.
    #[test]
    fn a_rethrow_is_the_exception_it_rethrows() {
        let signals = ProcessSignals::default();
        let thrown = |flags: u16, message: &str| ExceptionRecord {
            id: 0,
            unix_nanos: 0,
            thread_id: 7,
            type_name: "System.TimeoutException".into(),
            message: message.into(),
            hresult: 0,
            flags,
            inner_id: None,
            frames: Vec::new(),
            span: None,
        };
        let first = signals.push_exception(thrown(0, "late"));
        assert!(first.is_some());
        assert_eq!(
            signals.push_exception(thrown(profile::exception::FLAG_RETHROWN, "late")),
            first
        );
        let other = signals.push_exception(thrown(profile::exception::FLAG_RETHROWN, "later"));
        assert_ne!(other, first);
        assert_eq!(signals.exceptions().len(), 2);
        assert_eq!(signals.totals().1, 2);
    }
}
