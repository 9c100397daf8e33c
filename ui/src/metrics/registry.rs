//! The registry: families of counters and gauges, and their snapshots.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// How many label sets one family keeps; beyond this, updates of new sets are dropped (counted).
pub const MAX_SERIES_PER_FAMILY: usize = 2000;

/// Label values are cut to this many characters.
pub const MAX_LABEL_VALUE_CHARS: usize = 128;

/// The family that counts label sets refused by full families, one series per such family.
const DROPPED_SERIES: &str = "clrscope_metric_series_dropped_total";

/// What kind of number a family holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (resets when the agent restarts): a whole number.
    Counter,
    /// Goes up and down: any `f64`.
    Gauge,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

/// Why a metric could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    #[error(
        "invalid metric name {0:?}: use ASCII letters, digits, `_` and `:`, not starting with a \
         digit"
    )]
    InvalidName(String),

    #[error(
        "invalid label name {label:?} for metric {metric}: use ASCII letters, digits and `_`, \
         not starting with a digit or `__`"
    )]
    InvalidLabel { metric: String, label: String },

    #[error(
        "metric {metric} is already registered as a {existing} with labels {existing_labels:?}; \
         register one name with one kind and one set of label names"
    )]
    Conflict {
        metric: String,
        existing: &'static str,
        existing_labels: Vec<String>,
    },
}

/// Where every component registers its metrics. Cloning shares the registry.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    families: Arc<Mutex<BTreeMap<String, Arc<FamilyCore>>>>,
}

#[derive(Debug)]
struct FamilyCore {
    name: String,
    help: String,
    kind: Kind,
    label_names: Vec<String>,
    /// Label values → the value: a counter's `u64`, or a gauge's `f64` bits.
    series: Mutex<BTreeMap<Vec<String>, Arc<AtomicU64>>>,
    /// Label sets refused because the family was full.
    dropped: AtomicU64,
}

impl FamilyCore {
    fn series(&self) -> MutexGuard<'_, BTreeMap<Vec<String>, Arc<AtomicU64>>> {
        // A panic while holding this lock leaves the map consistent (inserts and removes only).
        self.series.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cell(&self, values: &[&str]) -> Arc<AtomicU64> {
        assert_eq!(
            values.len(),
            self.label_names.len(),
            "metric {} takes the labels {:?}, given values {values:?}",
            self.name,
            self.label_names
        );
        let key: Vec<String> = values.iter().map(|v| bounded_value(v)).collect();
        let mut series = self.series();
        if let Some(cell) = series.get(&key) {
            return Arc::clone(cell);
        }
        let cell = Arc::new(AtomicU64::new(self.zero()));
        if series.len() >= MAX_SERIES_PER_FAMILY {
            if self.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::warn!(
                    metric = %self.name,
                    max = MAX_SERIES_PER_FAMILY,
                    "a metric has too many label sets; new ones are not exported (a label takes \
                     unbounded values?)"
                );
            }
            return cell;
        }
        series.insert(key, Arc::clone(&cell));
        cell
    }

    fn zero(&self) -> u64 {
        match self.kind {
            Kind::Counter => 0,
            Kind::Gauge => 0f64.to_bits(),
        }
    }

    fn snapshot(&self) -> FamilySnapshot {
        let series = self
            .series()
            .iter()
            .map(|(labels, cell)| {
                let raw = cell.load(Ordering::Relaxed);
                let value = match self.kind {
                    Kind::Counter => Value::Counter(raw),
                    Kind::Gauge => Value::Gauge(f64::from_bits(raw)),
                };
                SeriesSnapshot {
                    label_values: labels.clone(),
                    value,
                }
            })
            .collect();
        FamilySnapshot {
            name: self.name.clone(),
            help: self.help.clone(),
            kind: self.kind,
            label_names: self.label_names.clone(),
            series,
        }
    }
}

fn bounded_value(value: &str) -> String {
    match value.char_indices().nth(MAX_LABEL_VALUE_CHARS) {
        Some((cut, _)) => value[..cut].to_string(),
        None => value.to_string(),
    }
}

/// Prometheus' metric name rule: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
pub fn is_valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Prometheus' label name rule: `[a-zA-Z_][a-zA-Z0-9_]*`, `__` reserved.
pub fn is_valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    !name.starts_with("__")
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A counter: a whole number that only goes up. Cloning shares the value.
#[derive(Debug, Clone)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A gauge: a value that goes up and down. Cloning shares the value.
#[derive(Debug, Clone)]
pub struct Gauge(Arc<AtomicU64>);

impl Gauge {
    pub fn set(&self, value: f64) {
        self.0.store(value.to_bits(), Ordering::Relaxed);
    }

    pub fn add(&self, delta: f64) {
        // No atomic f64 add: retry until no other writer came in between.
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + delta).to_bits())
            });
    }

    pub fn inc(&self) {
        self.add(1.0);
    }

    pub fn dec(&self) {
        self.add(-1.0);
    }

    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// [`Counter`] or [`Gauge`]: what a [`Family`] hands out.
pub trait Metric: Clone {
    const KIND: Kind;
    #[doc(hidden)]
    fn from_cell(cell: Arc<AtomicU64>) -> Self;
}

impl Metric for Counter {
    const KIND: Kind = Kind::Counter;
    fn from_cell(cell: Arc<AtomicU64>) -> Self {
        Counter(cell)
    }
}

impl Metric for Gauge {
    const KIND: Kind = Kind::Gauge;
    fn from_cell(cell: Arc<AtomicU64>) -> Self {
        Gauge(cell)
    }
}

/// A metric with labels: one [`Counter`] or [`Gauge`] per set of label values. Cloning shares it.
#[derive(Debug)]
pub struct Family<M> {
    core: Arc<FamilyCore>,
    metric: PhantomData<M>,
}

impl<M> Clone for Family<M> {
    fn clone(&self) -> Self {
        Family {
            core: Arc::clone(&self.core),
            metric: PhantomData,
        }
    }
}

pub type CounterVec = Family<Counter>;
pub type GaugeVec = Family<Gauge>;

impl<M: Metric> Family<M> {
    /// The series of these label values (in the order of the family's label names), created at
    /// zero on first use. Panics if the number of values differs from the number of labels.
    pub fn with(&self, values: &[&str]) -> M {
        M::from_cell(self.core.cell(values))
    }

    /// Stops exporting the series of these label values (its process or rule is gone).
    pub fn remove(&self, values: &[&str]) {
        let key: Vec<String> = values.iter().map(|v| bounded_value(v)).collect();
        self.core.series().remove(&key);
    }

    /// Stops exporting every series of the family whose labels match `keep == false`.
    pub fn retain(&self, mut keep: impl FnMut(&[String]) -> bool) {
        self.core.series().retain(|labels, _| keep(labels));
    }
}

impl Registry {
    /// A counter without labels. Panics on an invalid name or a conflicting registration.
    pub fn counter(&self, name: &str, help: &str) -> Counter {
        self.counter_vec(name, help, &[]).with(&[])
    }

    /// A gauge without labels. Panics on an invalid name or a conflicting registration.
    pub fn gauge(&self, name: &str, help: &str) -> Gauge {
        self.gauge_vec(name, help, &[]).with(&[])
    }

    /// A counter per set of `labels` values. Panics on an invalid name or label, or a
    /// conflicting registration: names are the caller's constants.
    pub fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> CounterVec {
        self.try_counter_vec(name, help, labels)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// A gauge per set of `labels` values. Panics like [`Registry::counter_vec`].
    pub fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
        self.try_gauge_vec(name, help, labels)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Registry::counter_vec`] for names made at run time: errors instead of panics.
    pub fn try_counter_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<CounterVec, MetricsError> {
        self.family(name, help, labels)
    }

    /// [`Registry::gauge_vec`] for names made at run time: errors instead of panics.
    pub fn try_gauge_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<GaugeVec, MetricsError> {
        self.family(name, help, labels)
    }

    fn family<M: Metric>(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<Family<M>, MetricsError> {
        if !is_valid_metric_name(name) || name == DROPPED_SERIES {
            return Err(MetricsError::InvalidName(name.to_string()));
        }
        if let Some(label) = labels.iter().find(|l| !is_valid_label_name(l)) {
            return Err(MetricsError::InvalidLabel {
                metric: name.to_string(),
                label: label.to_string(),
            });
        }
        let mut families = self.families.lock().unwrap_or_else(|p| p.into_inner());
        let core = match families.get(name) {
            Some(existing) => {
                if existing.kind != M::KIND || existing.label_names != labels {
                    return Err(MetricsError::Conflict {
                        metric: name.to_string(),
                        existing: existing.kind.as_str(),
                        existing_labels: existing.label_names.clone(),
                    });
                }
                Arc::clone(existing)
            }
            None => {
                let core = Arc::new(FamilyCore {
                    name: name.to_string(),
                    help: help.to_string(),
                    kind: M::KIND,
                    label_names: labels.iter().map(|l| l.to_string()).collect(),
                    series: Mutex::default(),
                    dropped: AtomicU64::new(0),
                });
                families.insert(name.to_string(), Arc::clone(&core));
                core
            }
        };
        Ok(Family {
            core,
            metric: PhantomData,
        })
    }

    /// Unregisters the families that have no series left and that no handle holds: a family
    /// named at run time (a target's meter or instrument) goes with the last process that wrote
    /// it, so processes that come and go with new names do not pile up empty families.
    pub fn remove_unused_families(&self) {
        let mut families = self.families.lock().unwrap_or_else(|p| p.into_inner());
        // Handles are only made under this lock, so one held by the map alone stays unheld.
        families.retain(|_, core| Arc::strong_count(core) > 1 || !core.series().is_empty());
    }

    /// Every family's current values, sorted by name (series by label values), plus
    /// `clrscope_metric_series_dropped_total` when a family refused label sets.
    pub fn snapshot(&self) -> Vec<FamilySnapshot> {
        let families: Vec<Arc<FamilyCore>> = self
            .families
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let mut snapshot: Vec<FamilySnapshot> = families.iter().map(|f| f.snapshot()).collect();
        let dropped: Vec<SeriesSnapshot> = families
            .iter()
            .filter_map(|f| {
                let dropped = f.dropped.load(Ordering::Relaxed);
                (dropped > 0).then(|| SeriesSnapshot {
                    label_values: vec![f.name.clone()],
                    value: Value::Counter(dropped),
                })
            })
            .collect();
        if !dropped.is_empty() {
            let at = snapshot.partition_point(|f| f.name.as_str() < DROPPED_SERIES);
            snapshot.insert(
                at,
                FamilySnapshot {
                    name: DROPPED_SERIES.to_string(),
                    help: "New label sets a metric refused because it had too many".to_string(),
                    kind: Kind::Counter,
                    label_names: vec!["metric".to_string()],
                    series: dropped,
                },
            );
        }
        snapshot
    }
}

/// One family's values at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct FamilySnapshot {
    pub name: String,
    pub help: String,
    pub kind: Kind,
    pub label_names: Vec<String>,
    pub series: Vec<SeriesSnapshot>,
}

/// One series' value; `label_values` in the order of the family's `label_names`.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesSnapshot {
    pub label_values: Vec<String>,
    pub value: Value,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Counter(u64),
    Gauge(f64),
}

impl Value {
    pub fn as_f64(self) -> f64 {
        match self {
            Value::Counter(n) => n as f64,
            Value::Gauge(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_gauges_share_their_values_across_handles() {
        let registry = Registry::default();
        let a = registry.counter_vec("clrscope_x_total", "x", &["kind"]);
        let b = registry.counter_vec("clrscope_x_total", "x", &["kind"]);
        a.with(&["cpu"]).add(2);
        b.with(&["cpu"]).inc();
        b.with(&["wall"]).inc();
        let gauge = registry.gauge("clrscope_queue", "q");
        gauge.set(5.0);
        gauge.dec();
        gauge.add(0.5);
        let snapshot = registry.snapshot();
        assert_eq!(snapshot.len(), 2);
        assert_eq!(snapshot[0].name, "clrscope_queue");
        assert_eq!(snapshot[0].series[0].value, Value::Gauge(4.5));
        assert_eq!(snapshot[1].kind, Kind::Counter);
        let values: Vec<(Vec<String>, Value)> = snapshot[1]
            .series
            .iter()
            .map(|s| (s.label_values.clone(), s.value))
            .collect();
        assert_eq!(
            values,
            vec![
                (vec!["cpu".to_string()], Value::Counter(3)),
                (vec!["wall".to_string()], Value::Counter(1)),
            ]
        );
        a.remove(&["cpu"]);
        assert_eq!(registry.snapshot()[1].series.len(), 1);
    }

    #[test]
    fn conflicting_or_invalid_registrations_are_refused() {
        let registry = Registry::default();
        registry.counter_vec("clrscope_a_total", "a", &["rule"]);
        assert!(matches!(
            registry.try_gauge_vec("clrscope_a_total", "a", &["rule"]),
            Err(MetricsError::Conflict { .. })
        ));
        assert!(matches!(
            registry.try_counter_vec("clrscope_a_total", "a", &["other"]),
            Err(MetricsError::Conflict { .. })
        ));
        for bad in ["", "1abc", "a-b", "a b", DROPPED_SERIES] {
            assert!(
                registry.try_gauge_vec(bad, "", &[]).is_err(),
                "{bad:?} accepted"
            );
        }
        for bad in ["__x", "1a", "a.b", ""] {
            assert!(
                registry.try_gauge_vec("clrscope_b", "", &[bad]).is_err(),
                "label {bad:?} accepted"
            );
        }
    }

    #[test]
    fn a_full_family_drops_new_label_sets_and_counts_them() {
        let registry = Registry::default();
        let family = registry.counter_vec("clrscope_c_total", "c", &["id"]);
        for i in 0..MAX_SERIES_PER_FAMILY + 3 {
            family.with(&[&i.to_string()]).inc();
        }
        let snapshot = registry.snapshot();
        let ours = snapshot
            .iter()
            .find(|f| f.name == "clrscope_c_total")
            .unwrap();
        assert_eq!(ours.series.len(), MAX_SERIES_PER_FAMILY);
        let dropped = snapshot.iter().find(|f| f.name == DROPPED_SERIES).unwrap();
        assert_eq!(
            dropped.series,
            vec![SeriesSnapshot {
                label_values: vec!["clrscope_c_total".into()],
                value: Value::Counter(3),
            }]
        );
        // Existing series still count.
        family.with(&["0"]).inc();
        assert_eq!(family.with(&["0"]).get(), 2);
    }

    #[test]
    fn families_without_series_or_handles_are_removed() {
        let registry = Registry::default();
        let held = registry.gauge_vec("held_family", "held", &["process_id"]);
        let emptied = registry.gauge_vec("emptied_family", "emptied", &["process_id"]);
        let written = registry.gauge_vec("written_family", "written", &["process_id"]);
        emptied.with(&["1"]).set(1.0);
        emptied.remove(&["1"]);
        written.with(&["1"]).set(2.0);
        drop((emptied, written));
        registry.remove_unused_families();
        let names: Vec<String> = registry.snapshot().into_iter().map(|f| f.name).collect();
        assert_eq!(names, ["held_family", "written_family"]);
        drop(held);
        registry.remove_unused_families();
        let names: Vec<String> = registry.snapshot().into_iter().map(|f| f.name).collect();
        assert_eq!(names, ["written_family"]);
    }

    #[test]
    fn long_label_values_are_cut() {
        let registry = Registry::default();
        let family = registry.gauge_vec("clrscope_d", "d", &["v"]);
        let long = "é".repeat(MAX_LABEL_VALUE_CHARS + 10);
        family.with(&[&long]).set(1.0);
        let value = &registry.snapshot()[0].series[0].label_values[0];
        assert_eq!(value.chars().count(), MAX_LABEL_VALUE_CHARS);
        // The same long value finds the same series.
        assert_eq!(family.with(&[&long]).get(), 1.0);
    }
}
