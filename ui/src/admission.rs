//! Admission of store queries: each route class runs at most so many queries at once and lets
//! at most so many wait; past that a request is refused at once (503 with `Retry-After`), so
//! a crowd of clients cannot queue work without bound, and one class (many flame graphs over
//! long ranges) cannot hold up another (timelines, filter lists). A query whose client goes
//! away stops: waiting, it leaves the queue; running, its store query is cancelled before its
//! next block ([`store::tsdb::QueryControl`]).
//!
//! Routes answered from memory (processes, events, signals) are not store queries and are not
//! admitted here; dotnet-monitor's artifact routes have their own limits (429).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde::Deserialize;
use settings::lenient;
use store::tsdb::QueryControl;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;
use crate::metrics::{Counter, Gauge, Registry};

/// Queries of one route class that may wait for a running one to end, unless configured.
pub const DEFAULT_MAX_QUEUED: usize = 64;

/// What a refused request is told to wait before it tries again (`Retry-After`, seconds).
pub const RETRY_AFTER_SECONDS: u64 = 1;

/// The kinds of store query admitted separately: the label of the admission metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteClass {
    /// What the store holds: profile types, label names and values, series lists
    /// (`/api/v1/profile-types`, `/api/v1/labels…`; the querier's `ProfileTypes`,
    /// `LabelNames`, `LabelValues`, `Series`).
    Catalog,
    /// Timelines: `/api/v1/series`, the querier's `SelectSeries`.
    Series,
    /// Merged profiles and flame graphs: `/api/v1/profile`, `/api/v1/diff`, the querier's
    /// `SelectMerge*`.
    Profile,
}

impl RouteClass {
    pub const ALL: [RouteClass; 3] = [RouteClass::Catalog, RouteClass::Series, RouteClass::Profile];

    pub fn as_str(self) -> &'static str {
        match self {
            RouteClass::Catalog => "catalog",
            RouteClass::Series => "series",
            RouteClass::Profile => "profile",
        }
    }
}

/// How many queries of each route class run and wait at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryLimits {
    /// Queries of one class running at once (each reads the store on up to
    /// [`store::tsdb::MAX_QUERY_THREADS`] threads).
    pub max_running: usize,
    /// Queries of one class waiting for a running one to end; one more is refused.
    pub max_queued: usize,
}

impl Default for QueryLimits {
    /// As many running queries per class as there are cores, [`DEFAULT_MAX_QUEUED`] waiting.
    fn default() -> Self {
        QueryLimits {
            max_running: std::thread::available_parallelism().map_or(1, |n| n.get()),
            max_queued: DEFAULT_MAX_QUEUED,
        }
    }
}

/// The `Queries` section of settings.json (clrscope's own).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct QueriesConfig {
    #[serde(default, deserialize_with = "lenient::opt_number")]
    pub max_running: Option<usize>,
    #[serde(default, deserialize_with = "lenient::opt_number")]
    pub max_queued: Option<usize>,
}

/// The gates of every route class. Cloning shares them.
#[derive(Debug, Clone)]
pub struct Admission {
    limits: QueryLimits,
    gates: Arc<[Arc<Gate>; 3]>,
}

#[derive(Debug)]
struct Gate {
    permits: Arc<Semaphore>,
    waiting: AtomicUsize,
    limits: QueryLimits,
    running_now: Gauge,
    queued_now: Gauge,
    admitted: Counter,
    rejected: Counter,
    cancelled: Counter,
    blocks_read: Counter,
}

impl Admission {
    /// Gates of `limits` for every class, their numbers on `registry`.
    pub fn new(limits: QueryLimits, registry: &Registry) -> Admission {
        let label = ["route_class"];
        let running_now = registry.gauge_vec(
            "clrscope_api_queries_running",
            "Store queries of the API running now, by route class",
            &label,
        );
        let queued_now = registry.gauge_vec(
            "clrscope_api_queries_queued",
            "Store queries of the API waiting for a running one of their route class to end",
            &label,
        );
        let admitted = registry.counter_vec(
            "clrscope_api_queries_total",
            "Store queries of the API that started running, by route class",
            &label,
        );
        let rejected = registry.counter_vec(
            "clrscope_api_queries_rejected_total",
            "Store queries of the API refused with 503 because their route class had as many \
             running and waiting as allowed (Queries:MaxRunning, Queries:MaxQueued)",
            &label,
        );
        let cancelled = registry.counter_vec(
            "clrscope_api_queries_cancelled_total",
            "Store queries of the API whose client went away before the answer, counted once \
             they stopped (left the queue, or stopped reading blocks)",
            &label,
        );
        let blocks_read = registry.counter_vec(
            "clrscope_api_query_blocks_read_total",
            "Store blocks the API's queries read, by route class, counted when a query ends",
            &label,
        );
        let gate = |class: RouteClass| {
            let label = [class.as_str()];
            Arc::new(Gate {
                permits: Arc::new(Semaphore::new(limits.max_running)),
                waiting: AtomicUsize::new(0),
                limits,
                running_now: running_now.with(&label),
                queued_now: queued_now.with(&label),
                admitted: admitted.with(&label),
                rejected: rejected.with(&label),
                cancelled: cancelled.with(&label),
                blocks_read: blocks_read.with(&label),
            })
        };
        Admission {
            limits,
            gates: Arc::new(RouteClass::ALL.map(gate)),
        }
    }

    pub fn limits(&self) -> QueryLimits {
        self.limits
    }

    /// Waits for a running slot of `class`, or refuses at once when its queue is full. Dropping
    /// the future while it waits (the client went away) leaves the queue, counted as cancelled.
    pub(crate) async fn admit(&self, class: RouteClass) -> Result<Running, ApiError> {
        let gate = &self.gates[class as usize];
        if let Ok(permit) = Arc::clone(&gate.permits).try_acquire_owned() {
            return Ok(Running::new(gate, permit));
        }
        if gate.waiting.fetch_add(1, Ordering::Relaxed) >= gate.limits.max_queued {
            gate.waiting.fetch_sub(1, Ordering::Relaxed);
            gate.rejected.inc();
            return Err(ApiError::Overloaded {
                class: class.as_str(),
                max_running: gate.limits.max_running,
                max_queued: gate.limits.max_queued,
                retry_after: RETRY_AFTER_SECONDS,
            });
        }
        let mut waiting = Waiting {
            gate,
            admitted: false,
        };
        gate.queued_now.inc();
        let permit = Arc::clone(&gate.permits)
            .acquire_owned()
            .await
            .map_err(|_| ApiError::Unavailable("the agent is shutting down".into()))?;
        waiting.admitted = true;
        drop(waiting);
        Ok(Running::new(gate, permit))
    }
}

/// A query in a class's queue; leaving it without a slot means its client went away.
struct Waiting<'a> {
    gate: &'a Gate,
    admitted: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.gate.waiting.fetch_sub(1, Ordering::Relaxed);
        self.gate.queued_now.dec();
        if !self.admitted {
            self.gate.cancelled.inc();
        }
    }
}

/// A running slot of a class, held until the query's store work has ended.
#[derive(Debug)]
pub(crate) struct Running {
    gate: Arc<Gate>,
    _permit: OwnedSemaphorePermit,
}

impl Running {
    fn new(gate: &Arc<Gate>, permit: OwnedSemaphorePermit) -> Running {
        gate.admitted.inc();
        gate.running_now.inc();
        Running {
            gate: Arc::clone(gate),
            _permit: permit,
        }
    }

    /// Counts what the query did (its blocks; whether its client had gone away) and frees the
    /// slot: the counters are up to date before the running gauge falls.
    pub(crate) fn finish(self, control: &QueryControl) {
        self.gate.blocks_read.add(control.blocks_read());
        if control.is_cancelled() {
            self.gate.cancelled.inc();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.gate.running_now.dec();
    }
}

/// Cancels a query when the request that asked for it is dropped before it ends: hyper drops a
/// request's handler when its client closes the connection.
pub(crate) struct CancelOnDrop(Option<QueryControl>);

impl CancelOnDrop {
    pub(crate) fn new(control: &QueryControl) -> CancelOnDrop {
        CancelOnDrop(Some(control.clone()))
    }

    /// The query ended with its request still there.
    pub(crate) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(control) = self.0.take() {
            control.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_running: usize, max_queued: usize) -> QueryLimits {
        QueryLimits {
            max_running,
            max_queued,
        }
    }

    fn value(registry: &Registry, name: &str, class: &str) -> f64 {
        registry
            .snapshot()
            .iter()
            .filter(|f| f.name == name)
            .flat_map(|f| &f.series)
            .find(|s| s.label_values == [class])
            .map_or(0.0, |s| s.value.as_f64())
    }

    #[tokio::test]
    async fn a_full_class_refuses_while_others_admit() {
        let registry = Registry::default();
        let admission = Admission::new(limits(1, 1), &registry);
        let running = admission.admit(RouteClass::Profile).await.unwrap();
        let queued = tokio::spawn({
            let admission = admission.clone();
            async move { admission.admit(RouteClass::Profile).await.map(drop) }
        });
        while value(&registry, "clrscope_api_queries_queued", "profile") < 1.0 {
            tokio::task::yield_now().await;
        }
        let refused = admission.admit(RouteClass::Profile).await.unwrap_err();
        assert!(
            matches!(
                refused,
                ApiError::Overloaded {
                    class: "profile",
                    ..
                }
            ),
            "{refused:?}"
        );
        assert_eq!(refused.retry_after(), Some(RETRY_AFTER_SECONDS));
        // Another class has slots of its own.
        drop(admission.admit(RouteClass::Series).await.unwrap());
        running.finish(&QueryControl::default());
        queued.await.unwrap().unwrap();
        assert_eq!(
            value(&registry, "clrscope_api_queries_rejected_total", "profile"),
            1.0
        );
        assert_eq!(
            value(&registry, "clrscope_api_queries_total", "profile"),
            2.0
        );
        assert_eq!(
            value(&registry, "clrscope_api_queries_running", "profile"),
            0.0
        );
    }

    #[tokio::test]
    async fn a_waiter_that_goes_away_leaves_the_queue() {
        let registry = Registry::default();
        let admission = Admission::new(limits(1, 1), &registry);
        let running = admission.admit(RouteClass::Catalog).await.unwrap();
        let waiter = tokio::spawn({
            let admission = admission.clone();
            async move { admission.admit(RouteClass::Catalog).await.map(drop) }
        });
        while value(&registry, "clrscope_api_queries_queued", "catalog") < 1.0 {
            tokio::task::yield_now().await;
        }
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
        assert_eq!(
            value(&registry, "clrscope_api_queries_queued", "catalog"),
            0.0
        );
        assert_eq!(
            value(&registry, "clrscope_api_queries_cancelled_total", "catalog"),
            1.0
        );
        // Its place in the queue is free again.
        let next = tokio::spawn({
            let admission = admission.clone();
            async move { admission.admit(RouteClass::Catalog).await.map(drop) }
        });
        while value(&registry, "clrscope_api_queries_queued", "catalog") < 1.0 {
            tokio::task::yield_now().await;
        }
        drop(running);
        next.await.unwrap().unwrap();
    }
}
