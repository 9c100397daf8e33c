//! The agent's own health, as metrics on its [`Registry`] (served on `/metrics`).

use std::time::Duration;

use collector::activity::TrackerStats;
use collector::attached::AttachedProcesses;
use collector::signals::SignalKind;
use profile::budget::SharedBudget;
use ui::metrics::{Counter, CounterVec, Gauge, Registry};

/// How often the agent reads its own CPU time and memory.
const SELF_WATCH_INTERVAL: Duration = Duration::from_secs(5);

/// The handles the agent's tasks update.
#[derive(Debug, Clone)]
pub struct Health {
    pub processes_attached: Gauge,
    pub sessions: Gauge,
    pub samples: Counter,
    pub store: StoreHealth,
    pub own: OwnUsage,
    pub losses: LossMetrics,
}

/// What the agent lost of a process's event streams, and what linkage lost with it; by
/// `process_id`.
#[derive(Debug, Clone)]
pub struct LossMetrics {
    /// Events the runtime dropped (full buffers), by `session` (`light`, `sampler`).
    pub dropped_events: CounterVec,
    /// Long-lived sessions started again after ending while the process ran, by `session`.
    pub session_restarts: CounterVec,
    /// Times the linkage session was renewed because no span had started for a while.
    pub linkage_refreshes: CounterVec,
    pub logs_renewals: CounterVec,
    /// The span tracker's counters, by `what`.
    pub linkage: CounterVec,
    /// Signals dropped for want of room in the process's share of the signal budget, by
    /// `signal` ([`SignalKind::name`]).
    pub signals_dropped: CounterVec,
}

impl LossMetrics {
    /// Adds what the tracker counted since `before`.
    pub fn add_tracker(&self, pid: &str, before: &TrackerStats, now: &TrackerStats) {
        let deltas = [
            ("spans_started", now.spans_started - before.spans_started),
            ("spans_stopped", now.spans_stopped - before.spans_stopped),
            (
                "starts_without_activity_id",
                now.starts_without_activity_id - before.starts_without_activity_id,
            ),
            (
                "unmatched_stops",
                now.unmatched_stops - before.unmatched_stops,
            ),
            (
                "abandoned_spans",
                now.abandoned_spans - before.abandoned_spans,
            ),
            ("expired_spans", now.expired_spans - before.expired_spans),
            ("evicted_spans", now.evicted_spans - before.evicted_spans),
            (
                "evicted_switches",
                now.evicted_switches - before.evicted_switches,
            ),
            (
                "evicted_threads",
                now.evicted_threads - before.evicted_threads,
            ),
            (
                "rejected_events",
                now.rejected_events - before.rejected_events,
            ),
        ];
        for (what, delta) in deltas {
            self.linkage.with(&[pid, what]).add(delta);
        }
    }

    /// Reads what each attached process's share of the signal budget dropped; warns when it
    /// dropped more.
    fn read_signal_drops(&self, processes: &AttachedProcesses) {
        for attached in processes.list() {
            let process = &attached.process;
            let (pid, share) = (process.pid.to_string(), process.signals.share());
            let mut dropped = Vec::new();
            for kind in SignalKind::ALL {
                let counter = self.signals_dropped.with(&[&pid, kind.name()]);
                let more = share.dropped(kind).saturating_sub(counter.get());
                if more > 0 {
                    counter.add(more);
                    dropped.push(format!("{more} {}", kind.name()));
                }
            }
            if !dropped.is_empty() {
                tracing::warn!(
                    pid = process.pid,
                    dropped = %dropped.join(", "),
                    held_bytes = share.budget().held(),
                    limit_bytes = share.budget().limit(),
                    "signals were dropped for want of room in the process's share of the signal \
                     budget: raise --signal-process-budget (and --signal-budget) if genuine \
                     signals need it"
                );
            }
        }
    }

    /// Stops exporting a detached process's series.
    pub fn remove(&self, pid: &str) {
        for family in [
            &self.dropped_events,
            &self.session_restarts,
            &self.linkage_refreshes,
            &self.logs_renewals,
            &self.linkage,
            &self.signals_dropped,
        ] {
            family.retain(|labels| labels.first().map(String::as_str) != Some(pid));
        }
    }
}

/// The agent process's own CPU and memory, for alerts on the agent itself.
#[derive(Debug, Clone)]
pub struct OwnUsage {
    resident_bytes: Gauge,
    heap_allocated_bytes: Gauge,
    heap_resident_bytes: Gauge,
    cpu_seconds: Gauge,
    memory_limit_bytes: Gauge,
    nettrace_held_bytes: Gauge,
    nettrace_refusals: Counter,
    signal_held_bytes: Gauge,
}

/// What the store writer reports.
#[derive(Debug, Clone)]
pub struct StoreHealth {
    pub bytes: Gauge,
    pub blocks: Gauge,
    pub flushes: Counter,
    pub write_errors: Counter,
    pub dropped_batches: Counter,
}

impl Health {
    pub fn register(registry: &Registry) -> Health {
        Health {
            processes_attached: registry.gauge(
                "clrscope_processes_attached",
                "Processes the agent profiles now",
            ),
            sessions: registry.gauge(
                "clrscope_eventpipe_sessions",
                "EventPipe sessions the agent has open in its targets now",
            ),
            samples: registry.counter(
                "clrscope_samples_total",
                "Thread stack samples the sampler took",
            ),
            losses: LossMetrics {
                dropped_events: registry.counter_vec(
                    "clrscope_eventpipe_dropped_events_total",
                    "Events the runtime dropped from the agent's sessions (its buffers were full), \
                     by session: light (names, events), linkage (spans) or sampler",
                    &["process_id", "session"],
                ),
                session_restarts: registry.counter_vec(
                    "clrscope_session_restarts_total",
                    "Long-lived sessions (light, linkage) started again after ending while the \
                     process ran (stopped by another tool, or a stream that did not parse); their \
                     events in between are lost",
                    &["process_id", "session"],
                ),
                linkage_refreshes: registry.counter_vec(
                    "clrscope_linkage_refreshes_total",
                    "Times the trace linkage session was started again because no span had \
                     started for a while (another session's end may have taken its providers' \
                     arguments away)",
                    &["process_id"],
                ),
                logs_renewals: registry.counter_vec(
                    "clrscope_logs_session_renewals_total",
                    "Times a process's logs session was started again, by reason: union (what the \
                     agent's consumers of logs ask together changed), other_session (another tool's \
                     connection to the runtime went away: its session's end may have turned the \
                     process's loggers off), quiet (nothing for a while where those connections \
                     cannot be watched)",
                    &["process_id", "reason"],
                ),
                linkage: registry.counter_vec(
                    "clrscope_linkage_total",
                    "Trace linkage's span tracker, by what: spans_started, spans_stopped, \
                     starts_without_activity_id (not joined to samples: the runtime gave the \
                     span no EventSource activity id), unmatched_stops (stops without their start), abandoned_spans (stops lost: a \
                     span of another trace started inside), expired_spans (open too long), \
                     evicted_spans, evicted_switches, evicted_threads (over the caps), \
                     rejected_events (did not decode)",
                    &["process_id", "what"],
                ),
                signals_dropped: registry.counter_vec(
                    "clrscope_signals_dropped_total",
                    "Signals dropped for want of room in the process's share of the signal budget \
                     (--signal-process-budget, --signal-budget), refused or let go early, by \
                     signal: logs, exceptions (records), scopes (logging scopes), rings \
                     (pre-trigger ring blocks), live_metrics (values waiting for their reader), \
                     answers (/signals answers cut short)",
                    &["process_id", "signal"],
                ),
            },
            own: OwnUsage {
                resident_bytes: registry.gauge(
                    "clrscope_agent_resident_memory_bytes",
                    "Resident memory of the agent process",
                ),
                heap_allocated_bytes: registry.gauge(
                    "clrscope_agent_heap_allocated_bytes",
                    "Bytes of the agent's heap in use (allocated and not yet freed)",
                ),
                heap_resident_bytes: registry.gauge(
                    "clrscope_agent_heap_resident_bytes",
                    "Resident bytes the agent's allocator holds: the heap in use, freed pages \
                     it keeps for reuse, and its own metadata",
                ),
                cpu_seconds: registry.gauge(
                    "clrscope_agent_cpu_seconds",
                    "CPU time the agent process has used since it started (user and system)",
                ),
                memory_limit_bytes: registry.gauge(
                    "clrscope_agent_memory_limit_bytes",
                    "The memory limit of the agent's cgroup (memory.max); 0 when it has none",
                ),
                nettrace_held_bytes: registry.gauge(
                    "clrscope_nettrace_held_bytes",
                    "Memory the parsers of all sessions hold now (decoded state and input \
                     buffers), against --nettrace-agent-budget",
                ),
                nettrace_refusals: registry.counter(
                    "clrscope_nettrace_budget_refusals_total",
                    "Sessions stopped because their parser would have taken all parsers past \
                     --nettrace-agent-budget",
                ),
                signal_held_bytes: registry.gauge(
                    "clrscope_signal_held_bytes",
                    "Memory the signals kept and queued for all processes hold now (log and \
                     exception history, logging scopes, pre-trigger rings, live metrics waiting \
                     for their reader, answers being built), against --signal-budget",
                ),
            },
            store: StoreHealth {
                bytes: registry.gauge("clrscope_store_bytes", "Bytes of profile blocks on disk"),
                blocks: registry.gauge("clrscope_store_blocks", "Profile blocks on disk"),
                flushes: registry.counter(
                    "clrscope_store_flushes_total",
                    "Times the store wrote its in-memory profiles to a block",
                ),
                write_errors: registry.counter(
                    "clrscope_store_write_errors_total",
                    "Appends, flushes and retention runs of the store that failed",
                ),
                dropped_batches: registry.counter(
                    "clrscope_store_dropped_batches_total",
                    "Profile batches dropped because the store writer's queue was full",
                ),
            },
        }
    }
}

impl Health {
    /// Reads the agent's usage, what its parsers hold of `parsers`, what the signals hold of
    /// `signals` and what each process's share of it dropped, every few seconds until `stop`
    /// resolves.
    pub async fn watch(
        self,
        parsers: Option<SharedBudget>,
        signals: SharedBudget,
        processes: AttachedProcesses,
        stop: impl std::future::Future<Output = ()>,
    ) {
        let mut tick = tokio::time::interval(SELF_WATCH_INTERVAL);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = tick.tick() => {
                    self.own.read();
                    if let Some(budget) = &parsers {
                        self.own.read_budget(budget);
                    }
                    self.own.signal_held_bytes.set(signals.held() as f64);
                    self.losses.read_signal_drops(&processes);
                }
            }
        }
    }
}

impl OwnUsage {
    fn read_budget(&self, budget: &SharedBudget) {
        self.nettrace_held_bytes.set(budget.held() as f64);
        let refused = budget
            .refusals()
            .saturating_sub(self.nettrace_refusals.get());
        if refused > 0 {
            self.nettrace_refusals.add(refused);
            tracing::warn!(
                refused,
                held_bytes = budget.held(),
                limit_bytes = budget.limit(),
                "the sessions' parsers together reached --nettrace-agent-budget: the sessions \
                 that asked for more were stopped (their processes' logs say which); raise it if \
                 genuine streams need it"
            );
        }
    }

    fn read(&self) {
        // SAFETY: sysconf has no preconditions.
        let (page, ticks) = unsafe {
            (
                libc::sysconf(libc::_SC_PAGESIZE),
                libc::sysconf(libc::_SC_CLK_TCK),
            )
        };
        if let Some(pages) = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|t| t.split_whitespace().nth(1)?.parse::<f64>().ok())
        {
            self.resident_bytes.set(pages * page as f64);
        }
        if let Some(cpu_ticks) = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|stat| collector::discovery::parse_cpu_ticks(&stat))
        {
            if ticks > 0 {
                self.cpu_seconds.set(cpu_ticks as f64 / ticks as f64);
            }
        }
        self.memory_limit_bytes
            .set(cgroup_memory_limit().unwrap_or(0) as f64);
        // The allocator's statistics are a snapshot taken when its epoch advances. They tell a
        // growing heap from an allocator that keeps what was freed.
        if tikv_jemalloc_ctl::epoch::advance().is_ok() {
            if let Ok(allocated) = tikv_jemalloc_ctl::stats::allocated::read() {
                self.heap_allocated_bytes.set(allocated as f64);
            }
            if let Ok(resident) = tikv_jemalloc_ctl::stats::resident::read() {
                self.heap_resident_bytes.set(resident as f64);
            }
        }
    }
}

/// `memory.max` of this process's cgroup (v2); `None` without a limit or without cgroup v2.
fn cgroup_memory_limit() -> Option<u64> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = membership.lines().find_map(|l| l.strip_prefix("0::"))?;
    let limit = std::fs::read_to_string(format!("/sys/fs/cgroup{path}/memory.max")).ok()?;
    limit.trim().parse().ok()
}

/// Counts one (process, session) on a gauge for as long as it lives.
pub struct GaugeGuard(Gauge);

impl GaugeGuard {
    pub fn new(gauge: &Gauge) -> GaugeGuard {
        gauge.inc();
        GaugeGuard(gauge.clone())
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}
