//! OTLP metrics (`opentelemetry.proto.metrics.v1`) from the runtime's counters: what the agent
//! reads of a process's EventCounters and System.Diagnostics.Metrics instruments, as the data
//! point types and temporality OpenTelemetry gives those instruments.
//!
//! | published by the runtime | OTLP |
//! |---|---|
//! | meter `Counter`, `ObservableCounter` (rate, and the running total on .NET ≥ 8) | `Sum`, monotonic, cumulative: the total |
//! | meter `UpDownCounter`, `ObservableUpDownCounter` (rate, and the value on .NET ≥ 8) | `Sum`, not monotonic, cumulative: the value |
//! | meter `ObservableGauge` / `Gauge` (last value) | `Gauge` |
//! | meter `Histogram` (p50, p95, p99 of the interval; its count and sum) | `Summary`: those quantiles, count and sum cumulative |
//! | `EventCounter`, `PollingCounter` (mean of the interval) | `Gauge` |
//! | `IncrementingEventCounter`, `IncrementingPollingCounter` (growth in the interval) | `Sum`, monotonic, cumulative |
//!
//! .NET 8 publishes no histogram buckets, only three percentiles estimated over each interval,
//! so a histogram is a `Summary` (as Prometheus summaries are), not an OTLP `Histogram`.
//! Cumulative points start when the runtime began aggregating for the agent's counter session
//! ([`Cumulative::begin`]: the start of the metrics source's first interval, else of the first
//! EventCounter payload's), not when the agent attached: the session waits out the startup
//! grace. Where the runtime publishes only the interval's growth (EventCounters, histograms'
//! count and sum, counters before .NET 8) the agent adds them up from there.
//!
//! One request holds a `ResourceMetrics` per process (the resource of its profiles:
//! `service.name`, `process.pid`, `host.name`), a `ScopeMetrics` per meter or EventSource (name
//! and meter version), a `Metric` per instrument with every tag set's points.

use std::collections::HashMap;
use std::sync::Arc;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    metric, number_data_point, summary_data_point, AggregationTemporality, Gauge, Metric,
    NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, Summary, SummaryDataPoint,
};
use profile::counter::{CounterSample, CounterValue};

use crate::otlp::{any_string, resource};

/// One value of one instrument's tag set, ready for OTLP.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricPoint {
    /// The meter or EventSource: the instrumentation scope.
    pub scope: String,
    /// The meter's version ("" for EventSources).
    pub scope_version: String,
    pub name: String,
    pub unit: String,
    pub tags: Vec<(String, String)>,
    /// Where a cumulative value counts from, Unix nanoseconds.
    pub start_unix_nanos: i64,
    /// When the runtime published it.
    pub unix_nanos: i64,
    pub value: PointValue,
}

/// A point's value by OTLP data type.
#[derive(Debug, Clone, PartialEq)]
pub enum PointValue {
    /// A cumulative sum since the start time.
    Sum {
        value: f64,
        monotonic: bool,
    },
    Gauge(f64),
    /// Count and sum cumulative since the start time; quantiles (0–1) of the last interval.
    Summary {
        count: u64,
        sum: f64,
        quantiles: Vec<(f64, f64)>,
    },
}

/// A point of a process, for an exporter that sends metrics.
#[derive(Debug, Clone)]
pub struct MetricExport {
    /// The process's series labels (`service_name`, `process_id`, `host_name`): the resource.
    pub series: Arc<[(String, String)]>,
    pub point: MetricPoint,
}

/// What one series adds up where the runtime publishes only the growth of an interval.
#[derive(Debug, Clone, Copy, Default)]
struct Running {
    total: f64,
    count: u64,
}

/// A series: meter (or EventSource), instrument, tags.
type SeriesKey = (String, String, Vec<(String, String)>);

/// One process's counter values made cumulative: the state of the series the runtime publishes
/// as deltas, at most `max_series` of them.
#[derive(Debug)]
pub struct Cumulative {
    /// Where every cumulative value counts from, once known.
    start_unix_nanos: Option<i64>,
    max_series: usize,
    running: HashMap<SeriesKey, Running>,
}

impl Cumulative {
    /// Cumulative values count from when the runtime began aggregating: see [`Cumulative::begin`].
    pub fn new(max_series: usize) -> Cumulative {
        Cumulative {
            start_unix_nanos: None,
            max_series,
            running: HashMap::new(),
        }
    }

    /// The runtime's metrics source began an interval at `unix_nanos`: the first one is when it
    /// began aggregating for the session, where the running totals it publishes count from.
    pub fn begin(&mut self, unix_nanos: i64) {
        self.start_unix_nanos.get_or_insert(unix_nanos);
    }

    /// Where values count from: [`Cumulative::begin`]'s, else (a session of EventCounters
    /// alone) the start of the first sample's interval.
    fn start(&mut self, sample: &CounterSample) -> i64 {
        *self.start_unix_nanos.get_or_insert_with(|| {
            let interval = sample.interval_seconds.unwrap_or(0.0) * 1e9;
            sample.unix_nanos.saturating_sub(interval as i64)
        })
    }

    /// Adds an interval's growth to its series' running state; `None` when that is a new series
    /// past `max_series`.
    fn add(&mut self, sample: &CounterSample, total: f64, count: u64) -> Option<Running> {
        let key = (
            sample.provider.clone(),
            sample.name.clone(),
            sample.tags.clone(),
        );
        let full = self.running.len() >= self.max_series;
        let running = match self.running.get_mut(&key) {
            Some(running) => running,
            None if full => return None,
            None => self.running.entry(key).or_default(),
        };
        running.total += total;
        running.count = running.count.saturating_add(count);
        Some(*running)
    }

    /// The OTLP point of a published value; `None` for a new delta-published series past the
    /// limit (the caller counts it).
    pub fn point(&mut self, sample: &CounterSample) -> Option<MetricPoint> {
        let value = match &sample.value {
            CounterValue::Mean { mean, .. } => PointValue::Gauge(*mean),
            CounterValue::Gauge { value } => PointValue::Gauge(*value),
            CounterValue::Increment { increment } => PointValue::Sum {
                value: self.add(sample, *increment, 0)?.total,
                monotonic: true,
            },
            CounterValue::Counter { rate, total } => PointValue::Sum {
                value: match total {
                    Some(total) => *total,
                    None => self.add(sample, *rate, 0)?.total,
                },
                monotonic: true,
            },
            CounterValue::UpDownCounter { rate, value } => PointValue::Sum {
                value: match value {
                    Some(value) => *value,
                    None => self.add(sample, *rate, 0)?.total,
                },
                monotonic: false,
            },
            CounterValue::Histogram {
                quantiles,
                count,
                sum,
            } => {
                let count = count.and_then(|c| u64::try_from(c).ok()).unwrap_or(0);
                let running =
                    self.add(sample, sum.filter(|s| s.is_finite()).unwrap_or(0.0), count)?;
                PointValue::Summary {
                    count: running.count,
                    sum: running.total,
                    quantiles: quantiles
                        .iter()
                        .map(|q| (q.percentile / 100.0, q.value))
                        .collect(),
                }
            }
        };
        Some(MetricPoint {
            scope: sample.provider.clone(),
            scope_version: sample.version.clone(),
            name: sample.name.clone(),
            unit: sample.unit.clone(),
            tags: sample.tags.clone(),
            start_unix_nanos: self.start(sample),
            unix_nanos: sample.unix_nanos,
            value,
        })
    }
}

fn nanos(unix_nanos: i64) -> u64 {
    u64::try_from(unix_nanos).unwrap_or(0)
}

fn attributes(tags: &[(String, String)]) -> Vec<KeyValue> {
    tags.iter()
        .map(|(key, value)| KeyValue {
            key: key.clone(),
            value: Some(any_string(value)),
            ..KeyValue::default()
        })
        .collect()
}

/// An empty metric of the point's data type, to which points of its kind are added.
fn empty_metric(point: &MetricPoint) -> Metric {
    let data = match &point.value {
        PointValue::Sum { monotonic, .. } => metric::Data::Sum(Sum {
            data_points: Vec::new(),
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
            is_monotonic: *monotonic,
        }),
        PointValue::Gauge(_) => metric::Data::Gauge(Gauge::default()),
        PointValue::Summary { .. } => metric::Data::Summary(Summary::default()),
    };
    Metric {
        name: point.name.clone(),
        unit: point.unit.clone(),
        data: Some(data),
        ..Metric::default()
    }
}

/// Adds the point to `metric` when it is of the metric's data type; else gives it back.
fn add_point(metric: &mut Metric, point: &MetricPoint) -> bool {
    let number = |value: f64| NumberDataPoint {
        attributes: attributes(&point.tags),
        start_time_unix_nano: nanos(point.start_unix_nanos),
        time_unix_nano: nanos(point.unix_nanos),
        value: Some(number_data_point::Value::AsDouble(value)),
        ..NumberDataPoint::default()
    };
    match (&mut metric.data, &point.value) {
        (Some(metric::Data::Sum(sum)), PointValue::Sum { value, monotonic })
            if sum.is_monotonic == *monotonic =>
        {
            sum.data_points.push(number(*value));
        }
        (Some(metric::Data::Gauge(gauge)), PointValue::Gauge(value)) => {
            let mut point = number(*value);
            // A gauge is a value at a time, not over a span.
            point.start_time_unix_nano = 0;
            gauge.data_points.push(point);
        }
        (
            Some(metric::Data::Summary(summary)),
            PointValue::Summary {
                count,
                sum,
                quantiles,
            },
        ) => summary.data_points.push(SummaryDataPoint {
            attributes: attributes(&point.tags),
            start_time_unix_nano: nanos(point.start_unix_nanos),
            time_unix_nano: nanos(point.unix_nanos),
            count: *count,
            sum: *sum,
            quantile_values: quantiles
                .iter()
                .map(|&(quantile, value)| summary_data_point::ValueAtQuantile { quantile, value })
                .collect(),
            flags: 0,
        }),
        _ => return false,
    }
    true
}

/// One request for `points`: a resource per process, a scope per meter (and version), a metric
/// per instrument and data type, points in their order.
pub fn metrics_request(points: &[MetricExport]) -> ExportMetricsServiceRequest {
    // ((meter, version), metrics) per process, in first-seen order.
    type Scope = ((String, String), Vec<Metric>);
    type Process = (Arc<[(String, String)]>, Vec<Scope>);
    let mut resources: Vec<Process> = Vec::new();
    for export in points {
        let point = &export.point;
        let at = match resources.iter().position(|(s, _)| s == &export.series) {
            Some(at) => at,
            None => {
                resources.push((export.series.clone(), Vec::new()));
                resources.len() - 1
            }
        };
        let scopes = &mut resources[at].1;
        let scope_key = (point.scope.clone(), point.scope_version.clone());
        let scope = match scopes.iter().position(|(k, _)| k == &scope_key) {
            Some(s) => s,
            None => {
                scopes.push((scope_key, Vec::new()));
                scopes.len() - 1
            }
        };
        let metrics = &mut scopes[scope].1;
        let added = metrics
            .iter_mut()
            .filter(|m| m.name == point.name && m.unit == point.unit)
            .any(|m| add_point(m, point));
        if !added {
            let mut metric = empty_metric(point);
            add_point(&mut metric, point);
            metrics.push(metric);
        }
    }
    ExportMetricsServiceRequest {
        resource_metrics: resources
            .into_iter()
            .map(|(series, scopes)| ResourceMetrics {
                resource: Some(resource(&series)),
                scope_metrics: scopes
                    .into_iter()
                    .map(|((name, version), metrics)| ScopeMetrics {
                        scope: Some(InstrumentationScope {
                            name,
                            version,
                            ..InstrumentationScope::default()
                        }),
                        metrics,
                        ..ScopeMetrics::default()
                    })
                    .collect(),
                ..ResourceMetrics::default()
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profile::counter::Percentile;
    use prost::Message;

    fn sample(name: &str, t: i64, value: CounterValue) -> CounterSample {
        CounterSample {
            unix_nanos: t,
            provider: "Shop".into(),
            name: name.into(),
            display_name: String::new(),
            version: "1.2".into(),
            unit: "ms".into(),
            tags: vec![("route".into(), "/a".into())],
            interval_seconds: None,
            value,
        }
    }

    #[test]
    fn deltas_add_up_and_totals_pass_through() {
        let mut cumulative = Cumulative::new(2);
        cumulative.begin(100);
        // Only the first interval's start counts.
        cumulative.begin(150);
        let histogram = |count, sum| CounterValue::Histogram {
            quantiles: vec![Percentile {
                percentile: 95.0,
                value: 9.5,
            }],
            count: Some(count),
            sum: Some(sum),
        };
        cumulative
            .point(&sample("h", 200, histogram(3, 30.0)))
            .unwrap();
        let second = cumulative
            .point(&sample("h", 300, histogram(2, 5.0)))
            .unwrap();
        assert_eq!(
            second.value,
            PointValue::Summary {
                count: 5,
                sum: 35.0,
                quantiles: vec![(0.95, 9.5)]
            }
        );
        assert_eq!((second.start_unix_nanos, second.unix_nanos), (100, 300));
        let total = cumulative
            .point(&sample(
                "c",
                300,
                CounterValue::Counter {
                    rate: 1.0,
                    total: Some(41.0),
                },
            ))
            .unwrap();
        assert_eq!(
            total.value,
            PointValue::Sum {
                value: 41.0,
                monotonic: true
            }
        );
        // A second delta series fits, a third does not.
        let mut grow = |name: &str| {
            cumulative.point(&sample(name, 1, CounterValue::Increment { increment: 2.0 }))
        };
        assert!(grow("gc").is_some());
        assert!(grow("another").is_none());
    }

    #[test]
    fn without_an_interval_start_values_count_from_the_first_samples_interval() {
        let mut cumulative = Cumulative::new(10);
        let mut first = sample(
            "gc",
            5_000_000_000,
            CounterValue::Increment { increment: 2.0 },
        );
        first.interval_seconds = Some(2.0);
        let point = cumulative.point(&first).unwrap();
        assert_eq!(point.start_unix_nanos, 3_000_000_000);
        let later = cumulative
            .point(&sample(
                "gc",
                7_000_000_000,
                CounterValue::Increment { increment: 1.0 },
            ))
            .unwrap();
        assert_eq!(later.start_unix_nanos, 3_000_000_000);
    }

    #[test]
    fn points_group_by_process_meter_and_instrument() {
        let series: Arc<[(String, String)]> = vec![
            ("process_id".to_string(), "42".to_string()),
            ("service_name".to_string(), "shop".to_string()),
        ]
        .into();
        let mut cumulative = Cumulative::new(10);
        cumulative.begin(100);
        let mut points = Vec::new();
        for (t, total) in [(200, 3.0), (300, 7.0)] {
            let p = cumulative
                .point(&sample(
                    "orders",
                    t,
                    CounterValue::Counter {
                        rate: 0.0,
                        total: Some(total),
                    },
                ))
                .unwrap();
            points.push(MetricExport {
                series: series.clone(),
                point: p,
            });
        }
        let gauge = cumulative
            .point(&sample(
                "temperature",
                300,
                CounterValue::Gauge { value: 21.5 },
            ))
            .unwrap();
        points.push(MetricExport {
            series: series.clone(),
            point: gauge,
        });
        let request = metrics_request(&points);
        let request =
            ExportMetricsServiceRequest::decode(request.encode_to_vec().as_slice()).unwrap();
        assert_eq!(request.resource_metrics.len(), 1);
        let scope = &request.resource_metrics[0].scope_metrics[0];
        let s = scope.scope.as_ref().unwrap();
        assert_eq!((s.name.as_str(), s.version.as_str()), ("Shop", "1.2"));
        assert_eq!(scope.metrics.len(), 2);
        let Some(metric::Data::Sum(sum)) = &scope.metrics[0].data else {
            panic!("{:?}", scope.metrics[0])
        };
        assert!(sum.is_monotonic);
        assert_eq!(
            sum.aggregation_temporality,
            AggregationTemporality::Cumulative as i32
        );
        let values: Vec<_> = sum.data_points.iter().map(|p| p.value).collect();
        assert_eq!(
            values,
            [
                Some(number_data_point::Value::AsDouble(3.0)),
                Some(number_data_point::Value::AsDouble(7.0))
            ]
        );
        assert!(sum
            .data_points
            .iter()
            .all(|p| p.start_time_unix_nano == 100));
        assert!(matches!(
            scope.metrics[1].data,
            Some(metric::Data::Gauge(_))
        ));
        let attributes = &request.resource_metrics[0]
            .resource
            .as_ref()
            .unwrap()
            .attributes;
        assert_eq!(attributes[0].key, "process.pid");
    }
}
