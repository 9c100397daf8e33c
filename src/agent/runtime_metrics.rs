//! Targets' runtime counters on the agent's metrics: per attached process, one counter session
//! ([`collector::counters`]) of dotnet-monitor's default sources (`System.Runtime`,
//! `Microsoft.AspNetCore.Hosting`, `Grpc.AspNetCore.Server`) and the meters asked for, every
//! value a gauge named as dotnet-monitor names it on its `/metrics` (`systemruntime_cpu_usage_ratio`,
//! `systemruntime_working_set_bytes`, …, so existing dashboards keep working), labelled
//! `process_id` and `service_name`, plus a meter's tags and a histogram's `quantile`. A process's
//! series go away when it does.

use std::collections::HashMap;
use std::future::Future;

use collector::client::DiagnosticsClient;
use collector::counters::{self, CounterSample, CounterUpdate, CounterValue};
use collector::metrics::{GaugeVec, Registry};
use tokio::sync::mpsc;

use super::RuntimeMetrics;

/// EventCounter sources dotnet-monitor collects by default (`Metrics:IncludeDefaultProviders`).
pub const DEFAULT_SOURCES: [&str; 3] = [
    "System.Runtime",
    "Microsoft.AspNetCore.Hosting",
    "Grpc.AspNetCore.Server",
];

/// Updates waiting to be recorded; the session drops (and logs) updates past this.
const UPDATES_QUEUE: usize = 1024;

/// Records one process's counters until its session ends (the process exited) or `stop`
/// completes (the agent detaches), then removes its series.
pub async fn export(
    client: DiagnosticsClient,
    config: RuntimeMetrics,
    registry: Registry,
    pid: u64,
    service: String,
    stop: impl Future<Output = ()> + Send + 'static,
) {
    let (updates, mut received) = mpsc::channel(UPDATES_QUEUE);
    let session_config = config.session;
    let session =
        tokio::spawn(async move { counters::run(&client, &session_config, stop, updates).await });
    let mut recorder = Recorder {
        registry,
        counter_names: config.counter_names,
        process: [pid.to_string(), service],
        families: HashMap::new(),
    };
    while let Some(update) = received.recv().await {
        match update {
            CounterUpdate::Sample(sample) => recorder.record(&sample),
            CounterUpdate::MetricsError { message } => {
                tracing::warn!(pid, %message, "the runtime's metrics source reported an error")
            }
        }
    }
    match session.await {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => tracing::info!(pid, %error, "the counter session ended"),
        Err(error) => tracing::warn!(pid, %error, "the counter session's task failed"),
    }
    recorder.forget();
}

/// Writes one process's samples into the registry.
struct Recorder {
    registry: Registry,
    /// `process_id`, `service_name`: the first two labels of every series.
    process: [String; 2],
    /// Per source, the only counters to keep.
    counter_names: Vec<(String, Vec<String>)>,
    /// The families this process wrote to, by name.
    families: HashMap<String, GaugeVec>,
}

impl Recorder {
    fn record(&mut self, sample: &CounterSample) {
        let wanted = self
            .counter_names
            .iter()
            .find(|(source, _)| source.eq_ignore_ascii_case(&sample.provider))
            .is_none_or(|(_, names)| names.iter().any(|n| *n == sample.name));
        if !wanted {
            return;
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
        let values: Vec<(Option<String>, f64)> = match &sample.value {
            CounterValue::Histogram { quantiles, .. } => quantiles
                .iter()
                .map(|q| (Some((q.percentile / 100.0).to_string()), q.value))
                .collect(),
            other => other.value().map(|v| (None, v)).into_iter().collect(),
        };
        let Some((quantile, _)) = values.first() else {
            return;
        };
        let mut labels: Vec<&str> = vec!["process_id", "service_name"];
        labels.extend(tags.iter().map(|(k, _)| k.as_str()));
        if quantile.is_some() {
            labels.push("quantile");
        }
        let family = match self.families.get(&name) {
            Some(family) => family.clone(),
            None => {
                let help = format!(
                    "{} {} of the process ({}), every {} s",
                    sample.provider,
                    sample.name,
                    if sample.unit.is_empty() { "no unit" } else { &sample.unit },
                    sample.interval_seconds.unwrap_or(0.0)
                );
                match self.registry.try_gauge_vec(&name, &help, &labels) {
                    Ok(family) => {
                        self.families.insert(name.clone(), family.clone());
                        family
                    }
                    Err(error) => {
                        tracing::debug!(%error, "a runtime counter is not exported");
                        return;
                    }
                }
            }
        };
        for (quantile, value) in values {
            let mut label_values: Vec<&str> = self.process.iter().map(String::as_str).collect();
            label_values.extend(tags.iter().map(|(_, v)| *v));
            if let Some(quantile) = &quantile {
                label_values.push(quantile);
            }
            if label_values.len() == labels.len() {
                family.with(&label_values).set(value * scale);
            }
        }
    }

    /// Removes this process's series from every family it wrote.
    fn forget(self) {
        for family in self.families.values() {
            family.retain(|labels| labels.first() != Some(&self.process[0]));
        }
    }
}

/// dotnet-monitor's unit suffix and scale: `%` → `ratio`, `B` and `MB` → `bytes` (MB × 10⁶),
/// `count` → none, others as published.
fn prometheus_unit(unit: &str) -> (&str, f64) {
    match unit {
        "" | "count" => ("", 1.0),
        "%" => ("ratio", 1.0),
        "B" => ("bytes", 1.0),
        "MB" => ("bytes", 1e6),
        other => (other, 1.0),
    }
}

/// dotnet-monitor's metric name: the provider lower-cased without the characters a name cannot
/// hold, `_`, the counter's name with those characters as `_`, and `_unit` if any.
fn prometheus_name(provider: &str, name: &str, unit: &str) -> String {
    let mut text: String = provider
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if text.is_empty() || text.starts_with(|c: char| c.is_ascii_digit()) {
        text.insert(0, '_');
    }
    text.push('_');
    text.push_str(&label_name(name));
    if !unit.is_empty() {
        text.push('_');
        text.push_str(&label_name(unit));
    }
    text
}

/// A tag or name with every character a label name cannot hold as `_`.
fn label_name(text: &str) -> String {
    let mut name: String = text
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) || name.starts_with("__") {
        name.insert(0, 'x');
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;
    use collector::metrics::is_valid_metric_name;

    #[test]
    fn names_are_dotnet_monitors() {
        let name = |p, n, u| {
            let (unit, _) = prometheus_unit(u);
            prometheus_name(p, n, unit)
        };
        assert_eq!(name("System.Runtime", "cpu-usage", "%"), "systemruntime_cpu_usage_ratio");
        assert_eq!(name("System.Runtime", "working-set", "MB"), "systemruntime_working_set_bytes");
        assert_eq!(name("System.Runtime", "gen-0-gc-count", ""), "systemruntime_gen_0_gc_count");
        assert_eq!(name("AsyncWeb", "asyncweb.request.duration", "ms"), "asyncweb_asyncweb_request_duration_ms");
        for (p, n) in [("!@#", "1x"), ("9lives", "a b"), ("", "")] {
            let made = name(p, n, "");
            assert!(is_valid_metric_name(&made), "{made:?}");
        }
        assert_eq!(label_name("http.route"), "http_route");
        assert_eq!(label_name("__x"), "x__x");
    }
}
