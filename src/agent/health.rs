//! The agent's own health, as metrics on its [`Registry`] (served on `/metrics`).

use ui::metrics::{Counter, Gauge, Registry};

/// The handles the agent's tasks update.
#[derive(Debug, Clone)]
pub struct Health {
    pub processes_attached: Gauge,
    pub sessions: Gauge,
    pub samples: Counter,
    pub store: StoreHealth,
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
