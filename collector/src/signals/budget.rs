//! What a process's signals cost: every record kept or queued for a reader is charged to the
//! process's share of the agent's signal budget ([`profile::budget::SharedBudget`]) before it is
//! kept, and gives its bytes back when the last of it goes; what does not fit is dropped and
//! counted by kind.

use std::mem::size_of;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use profile::budget::{string_pairs, Charged, Hold, SharedBudget};
use profile::exception::{ExceptionFrame, ExceptionRecord};
use profile::log::{LogRecord, ScopeValues};

/// What a process's share is charged for, and counts drops of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SignalKind {
    /// Log records: the history and the live readers' queues.
    Logs,
    /// First-chance exceptions: the history and the live readers' queues.
    Exceptions,
    /// The values of open logging scopes (kept once, shared by the records logged in them).
    Scopes,
    /// Blocks of pre-trigger rings.
    Rings,
    /// Counter and meter values queued for a reader (`/livemetrics`, CollectLiveMetrics, the
    /// agent's own `/metrics`).
    LiveMetrics,
    /// Answers being built (`/api/v1/processes/{pid}/signals`).
    Answers,
}

impl SignalKind {
    pub const ALL: [SignalKind; 6] = [
        SignalKind::Logs,
        SignalKind::Exceptions,
        SignalKind::Scopes,
        SignalKind::Rings,
        SignalKind::LiveMetrics,
        SignalKind::Answers,
    ];

    /// The `signal` label of `clrscope_signals_dropped_total`.
    pub fn name(self) -> &'static str {
        match self {
            SignalKind::Logs => "logs",
            SignalKind::Exceptions => "exceptions",
            SignalKind::Scopes => "scopes",
            SignalKind::Rings => "rings",
            SignalKind::LiveMetrics => "live_metrics",
            SignalKind::Answers => "answers",
        }
    }
}

/// A process's share of the agent's signal budget, and what it dropped for want of room.
/// Cloning shares.
#[derive(Debug, Clone)]
pub struct SignalShare {
    budget: SharedBudget,
    dropped: Arc<[AtomicU64; SignalKind::ALL.len()]>,
}

impl SignalShare {
    pub fn new(budget: SharedBudget) -> Self {
        SignalShare {
            budget,
            dropped: Arc::default(),
        }
    }

    /// A share without a limit (a command-line tool's, a test's).
    pub fn unlimited() -> Self {
        SignalShare::new(SharedBudget::unlimited())
    }

    pub fn budget(&self) -> &SharedBudget {
        &self.budget
    }

    /// Holds `bytes` for a `kind` of signal; `None`, counted as one `kind` dropped, when they do
    /// not fit.
    pub fn charge(&self, kind: SignalKind, bytes: usize) -> Option<Hold> {
        let hold = self.budget.hold(bytes);
        if hold.is_none() {
            self.count_dropped(kind, 1);
        }
        hold
    }

    /// `value`, charged for `bytes` as a `kind` of signal (see [`SignalShare::charge`]).
    pub fn charged<T>(&self, kind: SignalKind, value: T, bytes: usize) -> Option<Charged<T>> {
        Some(Charged::new(value, self.charge(kind, bytes)?))
    }

    /// Holds `bytes`, counting nothing when they do not fit (the caller makes room and asks
    /// again).
    pub(crate) fn try_hold(&self, bytes: usize) -> Option<Hold> {
        self.budget.hold(bytes)
    }

    pub fn count_dropped(&self, kind: SignalKind, count: u64) {
        self.dropped[kind as usize].fetch_add(count, Ordering::Relaxed);
    }

    /// How many `kind` were dropped (refused, or let go early) for want of room.
    pub fn dropped(&self, kind: SignalKind) -> u64 {
        self.dropped[kind as usize].load(Ordering::Relaxed)
    }
}

/// What a kept record costs besides its text: its `Arc` (two counts) and [`Charged`] wrapper.
const ARC_OVERHEAD: usize = 2 * size_of::<usize>();

/// The bytes a log record holds, its scopes' values not included (they are charged once, as
/// [`SignalKind::Scopes`]).
pub fn log_bytes(record: &LogRecord) -> usize {
    let m = &record.message;
    let exception = m.exception.as_ref().map_or(0, |e| {
        e.type_name.capacity() + e.message.capacity() + e.verbose_message.capacity()
    });
    size_of::<Charged<LogRecord>>()
        + ARC_OVERHEAD
        + m.category.capacity()
        + m.event_name.capacity()
        + m.message.capacity()
        + exception
        + string_pairs(&m.arguments)
        + record.scopes.capacity() * size_of::<ScopeValues>()
        + record.span.as_ref().map_or(0, |s| s.name.len())
}

/// The bytes a scope's values hold.
pub fn scope_bytes(values: &Vec<(String, String)>) -> usize {
    size_of::<Charged<Vec<(String, String)>>>() + ARC_OVERHEAD + string_pairs(values)
}

/// The bytes an exception holds, its frames' names not included (shared with the code map).
pub fn exception_bytes(record: &ExceptionRecord) -> usize {
    size_of::<Charged<ExceptionRecord>>()
        + ARC_OVERHEAD
        + record.type_name.capacity()
        + record.message.capacity()
        + record.frames.capacity() * size_of::<ExceptionFrame>()
}
