//! Targets' runtime counters on the agent's metrics: per attached process, one counter session
//! ([`collector::counters`]) of dotnet-monitor's default sources (`System.Runtime`,
//! `Microsoft.AspNetCore.Hosting`, `Grpc.AspNetCore.Server`) and the meters asked for, every
//! value a gauge named as dotnet-monitor names it on its `/metrics` (`systemruntime_cpu_usage_ratio`,
//! `systemruntime_working_set_bytes`, …, so existing dashboards keep working), labelled
//! `process_id` and `service_name`, plus a meter's tags and a histogram's `quantile`. A process's
//! series go away when it does.
//!
//! Meter, instrument and tag names and values come from the target, which may be hostile: one
//! process keeps [`MAX_SERIES_PER_PROCESS`] series at most, and what it loses over that is
//! counted in `clrscope_runtime_series_dropped_total{process_id}`.
//!
//! The same values go, as OTLP metric points ([`exporter::otlp_metrics`]), to the exporters that
//! send `Metrics`.

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use collector::client::DiagnosticsClient;
use collector::counters::{self, CounterSelection, CounterUpdate};
use collector::session::Reading;
use collector::signals::SignalShare;
use exporter::otlp_metrics::{Cumulative, MetricExport};
use hashbrown::HashTable;
use profile::counter::{CounterSample, CounterValue};
use tokio::sync::mpsc;
use ui::metrics::{Counter, CounterVec, Gauge, GaugeVec, Registry};

use super::export::ExportTaps;
use super::grace::StartupGrace;

/// Name endings that mean a histogram's parts or a counter, which promtool refuses on gauges.
const NOT_FOR_GAUGES: [&str; 4] = ["_count", "_sum", "_bucket", "_total"];

/// The most series one process's counters make, over all their families: dotnet-monitor's
/// defaults make under a hundred.
pub const MAX_SERIES_PER_PROCESS: usize = 1000;

/// Counts a process's samples refused by [`MAX_SERIES_PER_PROCESS`].
const DROPPED_SERIES: &str = "clrscope_runtime_series_dropped_total";

/// Updates waiting to be recorded; the session drops (and logs) updates past this.
const UPDATES_QUEUE: usize = 1024;

/// The process a counter session reads.
pub struct CountedProcess {
    pub pid: u64,
    pub service: String,
    /// Its series labels: the resource of its OTLP points.
    pub series: Arc<[(String, String)]>,
    /// Its share of the signal budget, which the values waiting to be recorded are charged to.
    pub share: SignalShare,
}

/// Records one process's counters from the end of its startup grace until its session ends
/// (the process exited) or `stop` completes (the agent detaches), then removes its series;
/// offers them to the exporters that send metrics.
pub async fn export(
    client: DiagnosticsClient,
    config: CounterSelection,
    registry: Registry,
    exports: ExportTaps,
    process: CountedProcess,
    grace: StartupGrace,
    stop: impl Future<Output = ()> + Send + 'static,
) {
    let (updates, mut received) = mpsc::channel(UPDATES_QUEUE);
    // A node agent reads every process's counters when it wakes for its sampling anyway.
    let session_config = config.session.clone().read(Reading::OnTimerGrid);
    let share = process.share.clone();
    let session = tokio::spawn(async move {
        let mut stop = std::pin::pin!(stop);
        if !grace.wait_or(&mut stop).await {
            return None;
        }
        Some(counters::run(&client, &session_config, stop, updates, &share).await)
    });
    let pid = process.pid;
    let mut recorder = Recorder::new(registry, pid, process.service);
    let mut cumulative = exports
        .want_metrics()
        .then(|| Cumulative::new(MAX_SERIES_PER_PROCESS));
    while let Some(update) = received.recv().await {
        match &*update {
            CounterUpdate::IntervalStart { unix_nanos } => {
                if let Some(cumulative) = &mut cumulative {
                    cumulative.begin(*unix_nanos);
                }
            }
            CounterUpdate::Sample(sample) if config.accepts(sample) => {
                recorder.record(sample);
                if let Some(cumulative) = &mut cumulative {
                    match cumulative.point(sample) {
                        Some(point) => exports.offer_metric(&MetricExport {
                            series: process.series.clone(),
                            point,
                        }),
                        None => recorder.count_dropped(),
                    }
                }
            }
            CounterUpdate::Sample(_) => {}
            CounterUpdate::MetricsError { message } => {
                tracing::warn!(pid, %message, "the runtime's metrics source reported an error")
            }
        }
    }
    match session.await {
        Ok(Some(Ok(_)) | None) => {}
        Ok(Some(Err(error))) => tracing::info!(pid, %error, "the counter session ended"),
        Err(error) => tracing::warn!(pid, %error, "the counter session's task failed"),
    }
    recorder.forget();
}

/// Writes one process's samples into the registry.
struct Recorder {
    registry: Registry,
    /// `process_id`, `service_name`: the first two labels of every series.
    process: [String; 2],
    /// The families this process wrote to, by name.
    families: HashMap<String, GaugeVec>,
    /// Every series this process made, found by the sample that makes it: a value costs a hash
    /// and a compare, not the Prometheus names and labels it was made with.
    series: HashTable<Series>,
    series_hasher: RandomState,
    /// The family of [`DROPPED_SERIES`], and this process's series in it.
    dropped_family: CounterVec,
    dropped: Counter,
}

/// A series of one process: what identifies its samples, and its gauge.
struct Series {
    provider: String,
    name: String,
    unit: String,
    tags: Vec<(String, String)>,
    /// A histogram's percentile (`f64` bits).
    percentile: Option<u64>,
    /// `None` when the series cannot be exported.
    gauge: Option<Gauge>,
    /// Turns the runtime's unit into the Prometheus base unit.
    scale: f64,
}

impl Series {
    fn identity(&self) -> SampleIdentity<'_> {
        SampleIdentity {
            provider: &self.provider,
            name: &self.name,
            unit: &self.unit,
            tags: &self.tags,
            percentile: self.percentile,
        }
    }
}

/// What makes a sample's value one series: everything its family name and labels come from.
#[derive(PartialEq, Hash)]
struct SampleIdentity<'a> {
    provider: &'a str,
    name: &'a str,
    unit: &'a str,
    tags: &'a [(String, String)],
    percentile: Option<u64>,
}

impl<'a> SampleIdentity<'a> {
    fn of(sample: &'a CounterSample, percentile: Option<f64>) -> Self {
        SampleIdentity {
            provider: &sample.provider,
            name: &sample.name,
            unit: &sample.unit,
            tags: &sample.tags,
            percentile: percentile.map(f64::to_bits),
        }
    }
}

impl Recorder {
    fn new(registry: Registry, pid: u64, service: String) -> Recorder {
        let dropped_family = registry.counter_vec(
            DROPPED_SERIES,
            "Runtime counter samples not exported because their process already has \
             MAX_SERIES_PER_PROCESS series (meter, instrument or tag names without bound?)",
            &["process_id"],
        );
        let pid = pid.to_string();
        let dropped = dropped_family.with(&[&pid]);
        Recorder {
            registry,
            process: [pid, service],
            families: HashMap::new(),
            series: HashTable::new(),
            series_hasher: RandomState::new(),
            dropped_family,
            dropped,
        }
    }

    /// Whether this process may make one more series; counts the refusal when not.
    fn room_for_new_series(&self) -> bool {
        if self.series.len() < MAX_SERIES_PER_PROCESS {
            return true;
        }
        self.count_dropped();
        false
    }

    /// Counts a sample refused for a new series past [`MAX_SERIES_PER_PROCESS`] (on /metrics or
    /// in the OTLP export).
    fn count_dropped(&self) {
        if self.dropped.get() == 0 {
            tracing::warn!(
                pid = %self.process[0],
                max = MAX_SERIES_PER_PROCESS,
                "a process's runtime counters make too many series; new ones are not exported \
                 (counted in {DROPPED_SERIES})"
            );
        }
        self.dropped.inc();
    }

    fn record(&mut self, sample: &CounterSample) {
        match &sample.value {
            CounterValue::Histogram { quantiles, .. } => {
                for quantile in quantiles {
                    self.record_value(sample, Some(quantile.percentile), quantile.value);
                }
            }
            other => {
                if let Some(value) = other.value() {
                    self.record_value(sample, None, value);
                }
            }
        }
    }

    /// Sets the series of `sample` (and `percentile`, of a histogram) to `value`.
    fn record_value(&mut self, sample: &CounterSample, percentile: Option<f64>, value: f64) {
        let hash = self
            .series_hasher
            .hash_one(SampleIdentity::of(sample, percentile));
        let known = self.series.find(hash, |series| {
            series.identity() == SampleIdentity::of(sample, percentile)
        });
        if let Some(series) = known {
            if let Some(gauge) = &series.gauge {
                gauge.set(value * series.scale);
            }
        } else if let Some((gauge, scale)) = self.new_series(sample, percentile, hash) {
            gauge.set(value * scale);
        }
    }

    /// Makes the series of `sample` (and `percentile`, of a histogram): its family's name and
    /// labels as dotnet-monitor names them, within [`MAX_SERIES_PER_PROCESS`]. A series that
    /// cannot be exported (its name is taken by a family of other labels: an instrument whose
    /// measurements carry different tag sets) is remembered too, so that it is refused once.
    fn new_series(
        &mut self,
        sample: &CounterSample,
        percentile: Option<f64>,
        hash: u64,
    ) -> Option<(Gauge, f64)> {
        if !self.room_for_new_series() {
            return None;
        }
        let (unit, scale) = prometheus_unit(&sample.unit);
        let name = prometheus_name(&sample.provider, &sample.name, unit);
        let mut tags: Vec<(String, &str)> = sample
            .tags
            .iter()
            .map(|(k, v)| {
                let key = label_name(k);
                // Not to be confused with the labels the agent adds.
                if ["process_id", "service_name", "quantile"].contains(&key.as_str()) {
                    (format!("tag_{key}"), v.as_str())
                } else {
                    (key, v.as_str())
                }
            })
            .collect();
        tags.sort();
        // `a.b` and `a_b` both become `a_b`: one label, the first value.
        tags.dedup_by(|a, b| a.0 == b.0);
        let quantile = percentile.map(|p| (p / 100.0).to_string());
        let mut labels: Vec<&str> = vec!["process_id", "service_name"];
        labels.extend(tags.iter().map(|(k, _)| k.as_str()));
        let mut label_values: Vec<&str> = self.process.iter().map(String::as_str).collect();
        label_values.extend(tags.iter().map(|(_, v)| *v));
        if let Some(quantile) = &quantile {
            labels.push("quantile");
            label_values.push(quantile);
        }
        let unit_text = if sample.unit.is_empty() {
            "no unit"
        } else {
            &sample.unit
        };
        // The runtime reports the interval it measured (4.9998 s for a 5 s request); meters
        // report none.
        let help = match sample.interval_seconds {
            Some(interval) if interval > 0.0 => format!(
                "{} {} of the process ({unit_text}), every {:.1} s",
                sample.provider, sample.name, interval
            ),
            _ => format!(
                "{} {} of the process ({unit_text})",
                sample.provider, sample.name
            ),
        };
        let gauge = match self.registry.try_gauge_vec(&name, &help, &labels) {
            Ok(family) => {
                let gauge = family.with(&label_values);
                self.families.entry(name).or_insert(family);
                Some(gauge)
            }
            Err(error) => {
                tracing::debug!(%error, "a runtime counter is not exported");
                None
            }
        };
        let series = Series {
            provider: sample.provider.clone(),
            name: sample.name.clone(),
            unit: sample.unit.clone(),
            tags: sample.tags.clone(),
            percentile: percentile.map(f64::to_bits),
            gauge: gauge.clone(),
            scale,
        };
        let hasher = &self.series_hasher;
        self.series
            .insert_unique(hash, series, |s| hasher.hash_one(s.identity()));
        gauge.map(|gauge| (gauge, scale))
    }

    /// Removes this process's series from every family it wrote.
    fn forget(self) {
        for family in self.families.values() {
            family.retain(|labels| labels.first() != Some(&self.process[0]));
        }
        self.dropped_family.remove(&[&self.process[0]]);
        let registry = self.registry.clone();
        drop(self);
        registry.remove_unused_families();
    }
}

/// The base unit suffix and the factor to it: dotnet-monitor's (`%` → `ratio`, `B` and `MB`
/// → `bytes`, `count` → none) plus times in seconds and OpenTelemetry's `By`, `s`, `{thing}`
/// annotations (none). Other units are kept as written.
fn prometheus_unit(unit: &str) -> (&str, f64) {
    match unit {
        "" | "count" | "1" => ("", 1.0),
        u if u.starts_with('{') => ("", 1.0),
        "%" => ("ratio", 1.0),
        "B" | "By" => ("bytes", 1.0),
        "KB" | "kB" | "KBy" => ("bytes", 1e3),
        "MB" | "MBy" => ("bytes", 1e6),
        "GB" | "GBy" => ("bytes", 1e9),
        "s" | "sec" => ("seconds", 1.0),
        "ms" => ("seconds", 1e-3),
        "us" | "μs" => ("seconds", 1e-6),
        "ns" => ("seconds", 1e-9),
        other => (other, 1.0),
    }
}

/// dotnet-monitor's metric name, made to pass `promtool check metrics`: the provider
/// lower-cased without the characters a name cannot hold, `_`, the counter's name in
/// snake_case, `_unit` in base units. A gauge may not end in `_count`, `_sum`, `_bucket` or
/// `_total` (those mean histograms and counters), so that suffix goes: dotnet-monitor's
/// `systemruntime_gen_0_gc_count` is `systemruntime_gen_0_gc` here.
fn prometheus_name(provider: &str, name: &str, unit: &str) -> String {
    let mut text: String = provider
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if text.is_empty() || text.starts_with(|c: char| c.is_ascii_digit()) {
        text.insert(0, '_');
    }
    let provider_len = text.len();
    text.push('_');
    text.push_str(&snake_case(name));
    while let Some(stripped) = NOT_FOR_GAUGES
        .iter()
        .find_map(|suffix| text.strip_suffix(suffix))
        .filter(|stripped| stripped.len() > provider_len)
    {
        text = stripped.to_string();
    }
    // A counter named just `count`: nothing left to strip down to.
    if NOT_FOR_GAUGES.iter().any(|suffix| text.ends_with(suffix)) {
        text.push_str("_value");
    }
    if !unit.is_empty() {
        text.push('_');
        text.push_str(&snake_case(unit));
    }
    text
}

/// `cpu-usage` → `cpu_usage`, `requestDuration` → `request_duration`, `http.route` →
/// `http_route`: lower case, words joined by one `_`.
fn snake_case(text: &str) -> String {
    let mut snake = String::with_capacity(text.len() + 4);
    let mut previous: Option<char> = None;
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            if c.is_ascii_uppercase()
                && previous.is_some_and(|p| p.is_ascii_lowercase() || p.is_ascii_digit())
            {
                snake.push('_');
            }
            snake.push(c.to_ascii_lowercase());
        } else if !snake.is_empty() && !snake.ends_with('_') {
            snake.push('_');
        }
        previous = Some(c);
    }
    let trimmed = snake.trim_end_matches('_');
    if trimmed.is_empty() {
        "x".to_string()
    } else {
        trimmed.to_string()
    }
}

/// A tag as a label name: snake_case, not starting with a digit.
fn label_name(text: &str) -> String {
    let mut name = snake_case(text);
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, 'x');
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;
    use ui::metrics::is_valid_metric_name;

    fn meter_sample(instrument: &str, tag: &str) -> CounterSample {
        CounterSample {
            unix_nanos: 0,
            provider: "Hostile".into(),
            name: instrument.into(),
            display_name: String::new(),
            version: String::new(),
            unit: String::new(),
            tags: vec![("route".into(), tag.into())],
            interval_seconds: Some(1.0),
            value: CounterValue::Mean {
                mean: 1.0,
                min: None,
                max: None,
                count: None,
            },
        }
    }

    /// The series of `registry` labelled with process `pid`, and its dropped count.
    fn process_series(registry: &Registry, pid: &str) -> (usize, f64) {
        let mut series = 0;
        let mut dropped = 0.0;
        for family in registry.snapshot() {
            for s in &family.series {
                if s.label_values.first().map(String::as_str) != Some(pid) {
                    continue;
                }
                if family.name == DROPPED_SERIES {
                    dropped = s.value.as_f64();
                } else {
                    series += 1;
                }
            }
        }
        (series, dropped)
    }

    #[test]
    fn a_process_with_unbounded_names_keeps_the_cap_and_counts_the_rest() {
        let registry = Registry::default();
        let mut recorder = Recorder::new(registry.clone(), 77, "svc".into());
        // New tag values in one family, then new instrument names: both make series.
        for i in 0..MAX_SERIES_PER_PROCESS {
            recorder.record(&meter_sample("requests", &format!("/r{i}")));
        }
        for i in 0..500 {
            recorder.record(&meter_sample(&format!("made_up_{i}"), "/"));
        }
        assert_eq!(
            process_series(&registry, "77"),
            (MAX_SERIES_PER_PROCESS, 500.0)
        );
        // Known series still update.
        recorder.record(&meter_sample("requests", "/r0"));
        assert_eq!(process_series(&registry, "77").1, 500.0);
        recorder.forget();
        assert_eq!(process_series(&registry, "77"), (0, 0.0));
    }

    #[test]
    fn an_instrument_measured_with_other_tags_keeps_its_first_series() {
        let registry = Registry::default();
        let mut recorder = Recorder::new(registry.clone(), 78, "svc".into());
        let mut first = meter_sample("requests", "/a");
        recorder.record(&first);
        // The same instrument with one more tag: its family takes other labels, so the value
        // is refused (this panicked the counter task when the family came from the cache).
        let mut more_tags = meter_sample("requests", "/a");
        more_tags.tags.push(("status".into(), "500".into()));
        recorder.record(&more_tags);
        recorder.record(&more_tags);
        assert_eq!(process_series(&registry, "78"), (1, 0.0));
        // The first series still takes its new values.
        first.value = CounterValue::Mean {
            mean: 7.0,
            min: None,
            max: None,
            count: None,
        };
        recorder.record(&first);
        let value = registry
            .snapshot()
            .into_iter()
            .filter(|family| family.name.starts_with("hostile_requests"))
            .flat_map(|family| family.series)
            .map(|series| series.value.as_f64())
            .collect::<Vec<_>>();
        assert_eq!(value, [7.0]);
    }

    #[test]
    fn names_are_dotnet_monitors_made_lint_clean() {
        let name = |p, n, u| {
            let (unit, _) = prometheus_unit(u);
            prometheus_name(p, n, unit)
        };
        for (provider, counter, unit, expected) in [
            (
                "System.Runtime",
                "cpu-usage",
                "%",
                "systemruntime_cpu_usage_ratio",
            ),
            (
                "System.Runtime",
                "working-set",
                "MB",
                "systemruntime_working_set_bytes",
            ),
            (
                "System.Runtime",
                "gen-0-gc-count",
                "",
                "systemruntime_gen_0_gc",
            ),
            (
                "System.Runtime",
                "time-in-jit",
                "ms",
                "systemruntime_time_in_jit_seconds",
            ),
            (
                "AsyncWeb",
                "asyncweb.requestDuration",
                "ms",
                "asyncweb_asyncweb_request_duration_seconds",
            ),
        ] {
            assert_eq!(name(provider, counter, unit), expected);
        }
        assert_eq!(name("M", "requests.total", "{request}"), "m_requests");
        assert_eq!(prometheus_unit("ms").1, 1e-3);
        for (p, n) in [("!@#", "1x"), ("9lives", "a b"), ("", ""), ("x", "_count")] {
            let made = name(p, n, "");
            assert!(
                is_valid_metric_name(&made) && !made.ends_with("_count"),
                "{made:?}"
            );
        }
        assert_eq!(label_name("http.route"), "http_route");
        assert_eq!(label_name("__x"), "x");
        assert_eq!(label_name("9a"), "x9a");
    }
}
