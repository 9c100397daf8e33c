//! The agent's metrics: its own numbers (health, rule firings, exporter queues, targets' runtime
//! counters) as counters and gauges that any component registers and updates in one
//! [`Registry`], and `GET /metrics`, which serves them in the Prometheus text exposition format
//! (version 0.0.4) on the metrics listener without authentication ([`metrics_router`]) and on
//! the API listener behind it ([`metrics_routes`]), as dotnet-monitor serves it on both.
//!
//! # Registering and updating
//!
//! The agent owns one [`Registry`] and hands a clone (a shared handle) to each component it
//! starts. A component registers its metrics once, when it starts, and keeps the handles;
//! updating a handle is one atomic operation, no lock and no allocation.
//!
//! ```
//! use ui::metrics::Registry;
//!
//! let registry = Registry::default();
//! // No labels: one series.
//! let queued = registry.gauge("clrscope_export_queue_profiles", "Profiles waiting to be exported");
//! queued.set(3.0);
//! // Labels: one series per label value set, created on first use.
//! let firings = registry.counter_vec(
//!     "clrscope_rule_firings_total",
//!     "Collection rule triggers that started the rule's actions",
//!     &["rule"],
//! );
//! let high_cpu = firings.with(&["HighCpu"]); // keep this handle on a hot path
//! high_cpu.inc();
//! assert_eq!(high_cpu.get(), 1);
//! // A series that will never change again (its process exited) is removed.
//! firings.remove(&["HighCpu"]);
//! ```
//!
//! Registering a name again with the same kind and label names returns the same family, so
//! per-process tasks can each register what they update. Registering it with another kind or
//! other label names is a bug and panics; [`Registry::try_counter_vec`] and
//! [`Registry::try_gauge_vec`] return the error instead, for names built at run time.
//!
//! # Names and labels
//!
//! - Prefix `clrscope_`; a counter's name ends in `_total`; units in the name (`_bytes`,
//!   `_seconds`), base units only. Help text says what is counted, in one sentence.
//! - Counters count up from zero (whole numbers: events, bytes); gauges are any `f64`.
//! - Label values must come from a small set: a rule name, a profile type, a process id.
//!   Never a path, a URL, a user id or a message. A family keeps at most
//!   [`MAX_SERIES_PER_FAMILY`] series; past it new label sets are not recorded and are counted in
//!   `clrscope_metric_series_dropped_total{metric}`. Label values longer than
//!   [`MAX_LABEL_VALUE_CHARS`] are cut.

mod registry;

use axum::extract::{FromRef, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::error::ApiError;
use crate::server::{method_not_allowed, ApiState};

pub use registry::{
    is_valid_label_name, is_valid_metric_name, Counter, CounterVec, Family, FamilySnapshot, Gauge,
    GaugeVec, Kind, Metric, MetricsError, Registry, SeriesSnapshot, Value, MAX_LABEL_VALUE_CHARS,
    MAX_SERIES_PER_FAMILY,
};

/// The media type Prometheus asks for and parses.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Where the agent serves `/metrics` without authentication unless told otherwise.
pub const DEFAULT_METRICS_URL: &str = "http://127.0.0.1:52325";

impl FromRef<ApiState> for Registry {
    fn from_ref(state: &ApiState) -> Registry {
        state.metrics.clone()
    }
}

/// `/metrics` for the API listener (where the auth layer covers it).
pub fn metrics_routes() -> Router<ApiState> {
    Router::new().route("/metrics", get(metrics))
}

/// The metrics listener's whole router: `/metrics` and nothing else (404 elsewhere), no
/// authentication: it shows numbers only.
pub fn metrics_router(registry: Registry) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .fallback(metrics_only)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(registry)
}

async fn metrics(State(registry): State<Registry>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, PROMETHEUS_TEXT)],
        prometheus_text(&registry.snapshot()),
    )
}

async fn metrics_only(uri: axum::http::Uri) -> ApiError {
    ApiError::OnlyMetrics {
        path: uri.path().to_string(),
    }
}

/// The families as Prometheus text: `# HELP`, `# TYPE`, then one line per series.
pub fn prometheus_text(families: &[FamilySnapshot]) -> String {
    let mut text = String::new();
    for family in families {
        text.push_str(&format!(
            "# HELP {} {}\n# TYPE {} {}\n",
            family.name,
            escape(&family.help, false),
            family.name,
            family.kind.as_str()
        ));
        for series in &family.series {
            text.push_str(&family.name);
            if !family.label_names.is_empty() {
                let labels: Vec<String> = family
                    .label_names
                    .iter()
                    .zip(&series.label_values)
                    .map(|(name, value)| format!("{name}=\"{}\"", escape(value, true)))
                    .collect();
                text.push('{');
                text.push_str(&labels.join(","));
                text.push('}');
            }
            text.push(' ');
            text.push_str(&number(series.value));
            text.push('\n');
        }
    }
    text
}

/// Backslash and newline escaped (help text); double quotes too (label values).
fn escape(text: &str, quotes: bool) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '\n' => escaped.push_str("\\n"),
            '"' if quotes => escaped.push_str("\\\""),
            c => escaped.push(c),
        }
    }
    escaped
}

fn number(value: Value) -> String {
    match value {
        Value::Counter(n) => n.to_string(),
        Value::Gauge(v) if v.is_nan() => "NaN".into(),
        Value::Gauge(v) if v == f64::INFINITY => "+Inf".into(),
        Value::Gauge(v) if v == f64::NEG_INFINITY => "-Inf".into(),
        Value::Gauge(v) => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_render_as_prometheus_text() {
        let registry = Registry::default();
        registry
            .counter_vec("clrscope_samples_total", "Stack samples taken", &["kind"])
            .with(&["cpu"])
            .add(42);
        registry
            .gauge_vec("clrscope_odd", "Help with \\ and\nnewline", &["v"])
            .with(&["a\"b\\c\nd"])
            .set(f64::NAN);
        registry.gauge("clrscope_store_bytes", "Bytes").set(1.5e6);
        assert_eq!(
            prometheus_text(&registry.snapshot()),
            "# HELP clrscope_odd Help with \\\\ and\\nnewline\n\
             # TYPE clrscope_odd gauge\n\
             clrscope_odd{v=\"a\\\"b\\\\c\\nd\"} NaN\n\
             # HELP clrscope_samples_total Stack samples taken\n\
             # TYPE clrscope_samples_total counter\n\
             clrscope_samples_total{kind=\"cpu\"} 42\n\
             # HELP clrscope_store_bytes Bytes\n\
             # TYPE clrscope_store_bytes gauge\n\
             clrscope_store_bytes 1500000\n"
        );
    }
}
