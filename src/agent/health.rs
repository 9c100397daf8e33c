//! The agent's own health, as metrics on its [`Registry`] (served on `/metrics`).

use std::time::Duration;

use ui::metrics::{Counter, Gauge, Registry};

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
}

/// The agent process's own CPU and memory, for alerts on the agent itself.
#[derive(Debug, Clone)]
pub struct OwnUsage {
    resident_bytes: Gauge,
    cpu_seconds: Gauge,
    memory_limit_bytes: Gauge,
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
            own: OwnUsage {
                resident_bytes: registry.gauge(
                    "clrscope_agent_resident_memory_bytes",
                    "Resident memory of the agent process",
                ),
                cpu_seconds: registry.gauge(
                    "clrscope_agent_cpu_seconds",
                    "CPU time the agent process has used since it started (user and system)",
                ),
                memory_limit_bytes: registry.gauge(
                    "clrscope_agent_memory_limit_bytes",
                    "The memory limit of the agent's cgroup (memory.max); 0 when it has none",
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

impl OwnUsage {
    /// Reads the agent's usage every few seconds until `stop` resolves.
    pub async fn watch(self, stop: impl std::future::Future<Output = ()>) {
        let mut tick = tokio::time::interval(SELF_WATCH_INTERVAL);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = tick.tick() => self.read(),
            }
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
        // utime and stime, fields 14 and 15, after the parenthesised command name.
        if let Some(cpu_ticks) = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|t| {
                let mut fields = t.rsplit_once(')')?.1.split_whitespace().skip(11);
                let user: f64 = fields.next()?.parse().ok()?;
                let system: f64 = fields.next()?.parse().ok()?;
                Some(user + system)
            })
        {
            if ticks > 0 {
                self.cpu_seconds.set(cpu_ticks / ticks as f64);
            }
        }
        self.memory_limit_bytes
            .set(cgroup_memory_limit().unwrap_or(0) as f64);
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
