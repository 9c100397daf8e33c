//! dotnet-monitor's live metrics (`/livemetrics`, the CollectLiveMetrics action): a counter
//! session of its own for a while, each published value one JSON record of a JSON text sequence
//! (RFC 7464, `application/json-seq`) as dotnet-monitor's `JsonCounterLogger` writes it:
//!
//! ```text
//! \x1e{"timestamp":"2026-12-04T09:01:02.1234567+00:00","provider":"System.Runtime","name":"cpu-usage","displayName":"CPU Usage (%)","unit":"%","counterType":"Metric","tags":"","value":3.2,"meterTags":null,"instrumentTags":null}\n
//! ```
//!
//! - `counterType` is `Rate` for what grows (EventCounter increments, meter counters: `value` is
//!   the growth over the interval, `displayName` says `(unit / N sec)`), else `Metric`;
//! - an up-down counter's `value` is its current value, a gauge's its last observation;
//! - a histogram gives one record per percentile, `Percentile=50` (95, 99) appended to `tags`;
//! - `meterTags` and `instrumentTags` are `null`: they come from the metrics source's
//!   instrument-publishing events, which this session does not ask for.

use std::future::Future;
use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::ArtifactError;
use crate::client::DiagnosticsClient;
use crate::counters::{
    self, CounterSelection, CounterSessionConfig, CounterUpdate, DEFAULT_EVENT_COUNTER_SOURCES,
};
use crate::signals::SignalShare;
use profile::counter::{CounterSample, CounterValue};

/// Updates waiting to be written; a client slower than the runtime loses the excess (logged).
const UPDATES_QUEUE: usize = 1024;

/// dotnet-monitor's `EventMetricsConfiguration`: the `POST /livemetrics` body.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EventMetricsConfiguration {
    /// `System.Runtime`, `Microsoft.AspNetCore.Hosting`, `Grpc.AspNetCore.Server` (default true).
    #[serde(default = "yes")]
    pub include_default_providers: bool,
    #[serde(default)]
    pub providers: Vec<EventMetricsProvider>,
    #[serde(default)]
    pub meters: Vec<EventMetricsMeter>,
}

fn yes() -> bool {
    true
}

impl Default for EventMetricsConfiguration {
    /// An empty body: the default providers only.
    fn default() -> Self {
        EventMetricsConfiguration {
            include_default_providers: true,
            providers: Vec::new(),
            meters: Vec::new(),
        }
    }
}

/// An EventCounter source and which of its counters (none: all).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EventMetricsProvider {
    pub provider_name: String,
    #[serde(default)]
    pub counter_names: Vec<String>,
}

/// A System.Diagnostics.Metrics meter and which of its instruments (none: all).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EventMetricsMeter {
    pub meter_name: String,
    #[serde(default)]
    pub instrument_names: Vec<String>,
}

impl EventMetricsConfiguration {
    /// The counters it asks for, published every `interval_seconds` (which must be the agent's
    /// global interval: on .NET ≥ 8 all metrics listeners of a process share one aggregation).
    pub fn selection(&self, interval_seconds: u32) -> CounterSelection {
        let mut session = CounterSessionConfig::new(interval_seconds);
        if self.include_default_providers {
            for source in DEFAULT_EVENT_COUNTER_SOURCES {
                session = session.with_event_counters(source);
            }
        }
        let mut counter_names = Vec::new();
        for provider in &self.providers {
            session = session.with_event_counters(&provider.provider_name);
            if !provider.counter_names.is_empty() {
                counter_names.push((
                    provider.provider_name.clone(),
                    provider.counter_names.clone(),
                ));
            }
        }
        for meter in &self.meters {
            let instruments: Vec<&str> =
                meter.instrument_names.iter().map(String::as_str).collect();
            session = session.with_meter(&meter.meter_name, &instruments);
        }
        CounterSelection {
            session,
            counter_names,
        }
    }
}

/// Live metrics to write: what to listen to, for how long (`None`: until stopped), and the
/// process's share of the signal budget that the updates waiting for the writer are charged to.
#[derive(Debug, Clone)]
pub struct LiveMetricsRequest {
    pub selection: CounterSelection,
    pub duration: Option<Duration>,
    pub share: SignalShare,
}

/// Runs the request's counter session and writes its values to `out` as they are published,
/// until its duration is over, `stop` fires or the process ends; returns the bytes written.
pub async fn write_live_metrics<W: AsyncWrite + Unpin>(
    client: &DiagnosticsClient,
    request: &LiveMetricsRequest,
    out: &mut W,
    stop: impl Future<Output = ()>,
) -> Result<u64, ArtifactError> {
    let (updates, mut received) = mpsc::channel(UPDATES_QUEUE);
    let end = async {
        match request.duration {
            Some(d) => tokio::select! {
                () = tokio::time::sleep(d) => {}
                () = stop => {}
            },
            None => stop.await,
        }
    };
    let session = counters::run(
        client,
        &request.selection.session,
        end,
        updates,
        &request.share,
    );
    tokio::pin!(session);
    let mut written = 0u64;
    let mut text = String::new();
    let mut ended = None;
    loop {
        let update = tokio::select! {
            result = &mut session, if ended.is_none() => {
                ended = Some(result);
                continue;
            }
            update = received.recv() => update,
        };
        let Some(update) = update else { break };
        match &*update {
            CounterUpdate::Sample(sample) if request.selection.accepts(sample) => {
                text.clear();
                write_records(
                    sample,
                    request.selection.session.interval_seconds,
                    &mut text,
                );
                out.write_all(text.as_bytes())
                    .await
                    .map_err(|source| ArtifactError::Write {
                        bytes: written,
                        source,
                    })?;
                out.flush().await.map_err(|source| ArtifactError::Write {
                    bytes: written,
                    source,
                })?;
                written += text.len() as u64;
            }
            CounterUpdate::Sample(_) | CounterUpdate::IntervalStart { .. } => {}
            // dotnet-monitor logs these and writes nothing.
            CounterUpdate::MetricsError { message } => {
                tracing::warn!(%message, "live metrics: the runtime's metrics source reported an error")
            }
        }
    }
    match ended {
        Some(Err(error)) => Err(ArtifactError::Trace(error)),
        _ => Ok(written),
    }
}

/// A number as .NET prints a double: `5`, not `5.0`.
fn number(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        value.to_string()
    }
}

/// The records of one published value (one per percentile for a histogram), each `\x1e` JSON
/// `\n`.
pub fn write_records(sample: &CounterSample, interval_seconds: u32, out: &mut String) {
    let base = if sample.display_name.is_empty() {
        sample.name.as_str()
    } else {
        sample.display_name.as_str()
    };
    let mut unit = sample.unit.clone();
    let tags: Vec<String> = sample
        .tags
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let tags = tags.join(",");
    let rate = |value: f64, unit: &str| {
        // EventCounters say the interval they measured (a float), meters use the session's.
        let interval = match sample.interval_seconds {
            Some(seconds) => (seconds as f32).to_string(),
            None => interval_seconds.to_string(),
        };
        let units = if unit.is_empty() { "Count" } else { unit };
        (format!("{base} ({units} / {interval} sec)"), "Rate", value)
    };
    let metric = |value: f64, unit: &str| {
        let display = if unit.is_empty() {
            base.to_string()
        } else {
            format!("{base} ({unit})")
        };
        (display, "Metric", value)
    };
    let records: Vec<((String, &str, f64), String)> = match &sample.value {
        CounterValue::Mean { mean, .. } => vec![(metric(*mean, &unit), tags)],
        CounterValue::Increment { increment } => {
            if unit.is_empty() {
                unit = "count".into();
            }
            vec![(rate(*increment, &unit), tags)]
        }
        CounterValue::Counter { rate: r, .. } => vec![(rate(*r, &unit), tags)],
        CounterValue::UpDownCounter { rate: r, value } => {
            vec![(metric(value.unwrap_or(*r), &unit), tags)]
        }
        CounterValue::Gauge { value } => vec![(metric(*value, &unit), tags)],
        CounterValue::Histogram { quantiles, .. } => quantiles
            .iter()
            .map(|q| {
                let percentile = format!("Percentile={}", number(q.percentile));
                let tags = if tags.is_empty() {
                    percentile
                } else {
                    format!("{tags},{percentile}")
                };
                (metric(q.value, &unit), tags)
            })
            .collect(),
    };
    let at = profile::utc::format(sample.unix_nanos, profile::utc::Form::DotNetJson);
    let text = |s: &str| serde_json::Value::from(s).to_string();
    for ((display_name, counter_type, value), tags) in records {
        // In JsonCounterLogger's order, numbers as .NET writes them (`3`, not `3.0`).
        out.push('\u{1e}');
        out.push_str(&format!(
            "{{\"timestamp\":{},\"provider\":{},\"name\":{},\"displayName\":{},\"unit\":{},\
             \"counterType\":{},\"tags\":{},\"value\":{},\"meterTags\":null,\
             \"instrumentTags\":null}}\n",
            text(&at),
            text(&sample.provider),
            text(&sample.name),
            text(&display_name),
            text(&unit),
            text(counter_type),
            text(&tags),
            number(if value.is_finite() { value } else { 0.0 }),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profile::counter::Percentile;

    fn sample(provider: &str, name: &str, unit: &str, value: CounterValue) -> CounterSample {
        CounterSample {
            unix_nanos: 1_764_838_862_123_456_700,
            provider: provider.into(),
            name: name.into(),
            display_name: String::new(),
            version: String::new(),
            unit: unit.into(),
            tags: vec![("route".into(), "/a".into())],
            interval_seconds: None,
            value,
        }
    }

    fn records(sample: &CounterSample) -> Vec<serde_json::Value> {
        let mut text = String::new();
        write_records(sample, 5, &mut text);
        // dotnet-monitor's field order.
        let order = [
            "timestamp",
            "provider",
            "name",
            "displayName",
            "unit",
            "counterType",
            "tags",
            "value",
            "meterTags",
            "instrumentTags",
        ];
        for line in text.lines() {
            let at: Vec<usize> = order
                .iter()
                .map(|k| line.find(&format!("\"{k}\":")).expect(k))
                .collect();
            assert!(at.windows(2).all(|w| w[0] < w[1]), "{line}");
        }
        text.split_terminator('\n')
            .map(|line| {
                let json = line.strip_prefix('\u{1e}').expect("a record separator");
                serde_json::from_str(json).unwrap()
            })
            .collect()
    }

    #[test]
    fn records_have_dotnet_monitors_fields() {
        let counter = records(&sample(
            "Shop",
            "orders",
            "{order}",
            CounterValue::Counter {
                rate: 3.0,
                total: Some(10.0),
            },
        ));
        assert_eq!(
            counter[0],
            serde_json::json!({
                "timestamp": "2025-12-04T09:01:02.1234567+00:00",
                "provider": "Shop", "name": "orders",
                "displayName": "orders ({order} / 5 sec)", "unit": "{order}",
                "counterType": "Rate", "tags": "route=/a", "value": 3,
                "meterTags": null, "instrumentTags": null,
            })
        );
        let histogram = records(&sample(
            "Shop",
            "latency",
            "ms",
            CounterValue::Histogram {
                quantiles: [50.0, 95.0, 99.0]
                    .iter()
                    .map(|&p| Percentile {
                        percentile: p,
                        value: p * 2.0,
                    })
                    .collect(),
                count: Some(7),
                sum: Some(70.0),
            },
        ));
        let tags: Vec<&str> = histogram
            .iter()
            .map(|r| r["tags"].as_str().unwrap())
            .collect();
        assert_eq!(
            tags,
            [
                "route=/a,Percentile=50",
                "route=/a,Percentile=95",
                "route=/a,Percentile=99"
            ]
        );
        assert_eq!(histogram[1]["value"], 190);
        assert_eq!(histogram[1]["displayName"], "latency (ms)");
        let mut cpu = sample(
            "System.Runtime",
            "cpu-usage",
            "%",
            CounterValue::Mean {
                mean: 1.5,
                min: None,
                max: None,
                count: None,
            },
        );
        cpu.display_name = "CPU Usage".into();
        cpu.tags.clear();
        cpu.unix_nanos = 1_764_838_862_000_000_000;
        let cpu = records(&cpu);
        assert_eq!(cpu[0]["displayName"], "CPU Usage (%)");
        assert_eq!(cpu[0]["timestamp"], "2025-12-04T09:01:02+00:00");
        assert_eq!(cpu[0]["tags"], "");
        let mut gcs = sample(
            "System.Runtime",
            "gen-0-gc-count",
            "",
            CounterValue::Increment { increment: 2.0 },
        );
        gcs.interval_seconds = Some(f64::from(4.9998f32));
        let gcs = records(&gcs);
        assert_eq!(gcs[0]["displayName"], "gen-0-gc-count (count / 4.9998 sec)");
        assert_eq!(gcs[0]["unit"], "count");
    }

    #[test]
    fn bodies_read_like_dotnet_monitors() {
        let config: EventMetricsConfiguration = serde_json::from_str(
            r#"{"includeDefaultProviders": false,
                "providers": [{"providerName": "System.Runtime", "counterNames": ["cpu-usage"]}],
                "meters": [{"meterName": "Shop", "instrumentNames": ["orders"]}]}"#,
        )
        .unwrap();
        let selection = config.selection(2);
        assert_eq!(selection.session.interval_seconds, 2);
        assert_eq!(selection.session.event_counter_sources, ["System.Runtime"]);
        let wanted = |provider: &str, name: &str| {
            selection.accepts(&sample(
                provider,
                name,
                "",
                CounterValue::Gauge { value: 1.0 },
            ))
        };
        assert!(wanted("System.Runtime", "cpu-usage"));
        assert!(!wanted("System.Runtime", "working-set"));
        assert!(wanted("Shop", "orders"));
        assert!(!wanted("Shop", "refunds"));
        assert!(!wanted("Someone.Elses", "orders"));
        let defaults: EventMetricsConfiguration = serde_json::from_str("{}").unwrap();
        assert_eq!(defaults.selection(5).session.event_counter_sources.len(), 3);
        assert!(serde_json::from_str::<EventMetricsConfiguration>(r#"{"meter": []}"#).is_err());
    }
}
