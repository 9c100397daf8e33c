//! The export pipeline: every configured exporter (settings `Exporters.<name>`) gets the
//! agent's batches as they are made and sends them to its backend once per interval.
//!
//! Why batches and not store queries: a batch is one sampler window (or event interval) of one
//! process with every sample label, so the export keeps what a merged store query would lose:
//! the time of each window (each value is stamped with it) and the trace link of each sample
//! (`trace_id`/`span_id`), and costs no disk reads. What a backend gets is exactly what the
//! store gets, window for window.
//!
//! Per exporter, memory is bounded at every stage, and everything given up is counted (metrics
//! `clrscope_export_*{exporter}`) and logged:
//!
//! 1. a channel of [`CHANNEL_BATCHES`] batches from the per-process tasks: when full (the
//!    exporter's task stalled), batches are dropped (`reason="channel_full"`); spans past a
//!    process's `--trace-rate-limit` are dropped before it (`reason="rate_limited"`);
//! 2. the batches of the current interval, at most [`MAX_PENDING_SAMPLES`] samples: past it
//!    batches are dropped (`reason="interval_full"`); log records and metric points likewise
//!    ([`MAX_PENDING_LOG_RECORDS`], [`MAX_PENDING_METRIC_POINTS`]);
//! 3. a queue of prepared requests, at most `MaxQueueBytes` bytes (and `QueueSize` requests,
//!    when set), while the backend is slow or down. An interval's logs, spans or metric points
//!    join the last waiting request of their signal while the two fit in one request
//!    ([`exporter::remote::MAX_MERGED_BYTES`]), so a backend that falls behind gets fewer,
//!    larger requests rather than a longer queue; past a limit, the oldest request is dropped
//!    (`reason="queue_full"`), so the newest data survives an outage;
//! 4. one request in flight, retried while the backend is unreachable or overloaded, waits
//!    doubling from 1 s to `MaxRetryDelay` with jitter (half to all of the wait); a request the
//!    backend refuses (4xx, `InvalidArgument`) is dropped at once (`reason="rejected"`).
//!
//! What was given up is logged once per interval, by signal, with the reasons.
//!
//! At shutdown the last interval is prepared and each queued request gets one attempt within
//! [`SHUTDOWN_GRACE`]; what is left is dropped (`reason="shutdown"`).
//!
//! Log records and spans take the same path, with channels and interval caps of their own
//! ([`CHANNEL_LOG_RECORDS`], [`MAX_PENDING_LOG_RECORDS`], [`CHANNEL_SPANS`],
//! [`MAX_PENDING_SPANS`]) and one queue per exporter for all its signals; what is given up is
//! counted per signal (`clrscope_export_dropped_{samples,log_records,spans}_total`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Context;
use exporter::otlp::traces::SpanExport;
use exporter::otlp::{ExportBatch, LogExport};
use exporter::otlp_metrics::MetricExport;
use exporter::remote::{Client, ExportSignal, ExporterConfig, Prepared};
use profile::span::SpanRecord;
use tokio::sync::{broadcast, mpsc, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;
use ui::metrics::{Counter, Gauge, Registry};

/// The `Exporters` section of settings.json: exporters by name.
pub type ExportersConfig = BTreeMap<String, ExporterConfig>;

/// Batches waiting for an exporter's task.
pub const CHANNEL_BATCHES: usize = 1024;
/// Samples of batches held for one interval (about 40 MB at most).
pub const MAX_PENDING_SAMPLES: usize = 200_000;
/// Log records and exceptions waiting for an exporter's task.
pub const CHANNEL_LOG_RECORDS: usize = 8192;
/// Log records and exceptions held for one interval.
pub const MAX_PENDING_LOG_RECORDS: usize = 50_000;
/// Spans waiting for an exporter's task.
pub const CHANNEL_SPANS: usize = 8192;
/// Spans held for one interval (a few hundred bytes each).
pub const MAX_PENDING_SPANS: usize = 50_000;
/// Metric points waiting for an exporter's task.
pub const CHANNEL_METRIC_POINTS: usize = 8192;
/// Metric points held for one interval.
pub const MAX_PENDING_METRIC_POINTS: usize = 50_000;
/// Defaults of the settings.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(15);
pub const DEFAULT_MAX_QUEUE_BYTES: u64 = 16 << 20;
pub const DEFAULT_MAX_RETRY_DELAY: Duration = Duration::from_secs(30);
const FIRST_RETRY_DELAY: Duration = Duration::from_secs(1);
/// How long a stopping agent gives its exporters to send what they hold.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Where the per-process tasks hand batches to the exporters. Cloning shares the channels.
#[derive(Debug, Clone, Default)]
pub struct ExportTaps(Vec<Tap>);

#[derive(Debug, Clone)]
struct Tap {
    /// Profile batches; open while the agent runs (its closing ends the exporter's task), used
    /// when the exporter sends profiles.
    channel: mpsc::Sender<ExportBatch>,
    profiles: bool,
    /// Log records and exceptions, when it sends logs.
    logs: Option<mpsc::Sender<LogExport>>,
    /// Finished spans, when it sends traces.
    traces: Option<mpsc::Sender<SpanExport>>,
    /// Runtime counter values, when it sends metrics.
    metric_points: Option<mpsc::Sender<MetricExport>>,
    metrics: Arc<ExportMetrics>,
}

impl ExportTaps {
    /// Whether any exporter sends logs.
    pub fn want_logs(&self) -> bool {
        self.0.iter().any(|tap| tap.logs.is_some())
    }

    /// Whether any exporter sends traces.
    pub fn want_traces(&self) -> bool {
        self.0.iter().any(|tap| tap.traces.is_some())
    }

    /// Forwards a process's log records, exceptions and finished spans (at most
    /// `spans_per_second`, in bursts of as many) to the exporters that send them until the
    /// process's signals are gone; a forwarder that falls behind loses the oldest, counted.
    pub async fn forward_signals(
        self,
        series: Arc<[(String, String)]>,
        mut logs: Option<broadcast::Receiver<profile::signal::Signal>>,
        collected: Option<collector::signals::LogsSettings>,
        mut spans: Option<broadcast::Receiver<Arc<SpanRecord>>>,
        spans_per_second: u32,
    ) {
        use tokio::sync::broadcast::error::RecvError;
        let mut limiter = RateLimiter::new(spans_per_second);
        while logs.is_some() || spans.is_some() {
            tokio::select! {
                signal = async { Some(logs.as_mut()?.recv().await) }, if logs.is_some() => match signal {
                    // The live feed has what every consumer of the process's logs asks: the
                    // always-on collection exports what it selects.
                    Some(Ok(profile::signal::Signal::Log(record)))
                        if !collected.as_ref().is_some_and(|c| {
                            c.accepts(&record.message.category, record.message.level)
                        }) => {}
                    Some(Ok(signal)) => self.offer_log(&LogExport {
                        series: series.clone(),
                        signal,
                    }),
                    Some(Err(RecvError::Lagged(lost))) => {
                        for tap in self.0.iter().filter(|t| t.logs.is_some()) {
                            tap.metrics.drop_items(ExportSignal::Logs, "channel_full", lost);
                        }
                    }
                    Some(Err(RecvError::Closed)) | None => logs = None,
                },
                span = async { Some(spans.as_mut()?.recv().await) }, if spans.is_some() => match span {
                    Some(Ok(span)) => {
                        if limiter.admit(Instant::now()) {
                            self.offer_span(&series, span);
                        } else {
                            self.drop_spans("rate_limited", 1);
                        }
                    }
                    Some(Err(RecvError::Lagged(lost))) => self.drop_spans("channel_full", lost),
                    Some(Err(RecvError::Closed)) | None => spans = None,
                },
            }
        }
    }

    fn drop_spans(&self, reason: &'static str, spans: u64) {
        for tap in self.0.iter().filter(|t| t.traces.is_some()) {
            tap.metrics.drop_items(ExportSignal::Traces, reason, spans);
        }
    }

    /// Offers a finished span to every exporter that sends traces, without waiting.
    fn offer_span(&self, series: &Arc<[(String, String)]>, span: Arc<SpanRecord>) {
        for tap in &self.0 {
            let Some(traces) = &tap.traces else { continue };
            let export = SpanExport {
                series: series.clone(),
                span: span.clone(),
            };
            if let Err(mpsc::error::TrySendError::Full(_)) = traces.try_send(export) {
                tap.metrics
                    .drop_items(ExportSignal::Traces, "channel_full", 1);
            }
        }
    }

    /// Offers a log record or exception to every exporter that sends logs, without waiting.
    pub fn offer_log(&self, record: &LogExport) {
        for tap in &self.0 {
            let Some(logs) = &tap.logs else { continue };
            if let Err(mpsc::error::TrySendError::Full(_)) = logs.try_send(record.clone()) {
                tap.metrics
                    .drop_items(ExportSignal::Logs, "channel_full", 1);
            }
        }
    }

    /// Whether any exporter sends metrics.
    pub fn want_metrics(&self) -> bool {
        self.0.iter().any(|tap| tap.metric_points.is_some())
    }

    /// Offers a metric point to every exporter that sends metrics, without waiting.
    pub fn offer_metric(&self, point: &MetricExport) {
        for tap in &self.0 {
            let Some(points) = &tap.metric_points else {
                continue;
            };
            if let Err(mpsc::error::TrySendError::Full(_)) = points.try_send(point.clone()) {
                tap.metrics
                    .drop_items(ExportSignal::Metrics, "channel_full", 1);
            }
        }
    }

    /// Offers a batch to every exporter that sends profiles, without waiting.
    pub fn offer(&self, batch: &ExportBatch) {
        for tap in &self.0 {
            if !tap.profiles {
                continue;
            }
            if let Err(mpsc::error::TrySendError::Full(batch)) = tap.channel.try_send(batch.clone())
            {
                let samples = batch.batch.samples.len() as u64;
                tap.metrics
                    .drop_items(ExportSignal::Profiles, "channel_full", samples);
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The numbers of one exporter, registered under `exporter=<name>`.
#[derive(Debug)]
struct ExportMetrics {
    queue_requests: Gauge,
    queue_bytes: Gauge,
    sent_requests: Counter,
    sent_bytes: Counter,
    /// Items the backend accepted, per signal (samples, log records, spans).
    sent_items: BTreeMap<ExportSignal, Counter>,
    failed_attempts: Counter,
    dropped_batches_channel: Counter,
    dropped_requests: BTreeMap<&'static str, Counter>,
    /// Items given up, per signal and reason.
    dropped_items: BTreeMap<(ExportSignal, &'static str), Counter>,
}

/// Why data was given up, the `reason` label of the drop counters.
const DROP_REASONS: [&str; 6] = [
    "channel_full",
    "interval_full",
    "rate_limited",
    "queue_full",
    "rejected",
    "shutdown",
];

/// What a signal's items are, and the names of its sent and dropped counters.
fn item_metrics(signal: ExportSignal) -> (&'static str, &'static str, &'static str) {
    match signal {
        ExportSignal::Profiles => (
            "Profile samples (one per stack and batch)",
            "clrscope_export_sent_samples_total",
            "clrscope_export_dropped_samples_total",
        ),
        ExportSignal::Logs => (
            "Log records and exceptions",
            "clrscope_export_sent_log_records_total",
            "clrscope_export_dropped_log_records_total",
        ),
        ExportSignal::Traces => (
            "Spans",
            "clrscope_export_sent_spans_total",
            "clrscope_export_dropped_spans_total",
        ),
        ExportSignal::Metrics => (
            "Runtime counter values (OTLP data points)",
            "clrscope_export_sent_metric_points_total",
            "clrscope_export_dropped_metric_points_total",
        ),
    }
}

impl ExportMetrics {
    fn register(registry: &Registry, exporter: &str) -> ExportMetrics {
        let gauge = |name: &str, help: &str| {
            registry
                .gauge_vec(name, help, &["exporter"])
                .with(&[exporter])
        };
        let counter = |name: &str, help: &str| {
            registry
                .counter_vec(name, help, &["exporter"])
                .with(&[exporter])
        };
        let dropped_requests = registry.counter_vec(
            "clrscope_export_dropped_requests_total",
            "Export requests given up, by reason (queue_full, rejected, shutdown)",
            &["exporter", "reason"],
        );
        let mut sent_items = BTreeMap::new();
        let mut dropped_items = BTreeMap::new();
        for signal in ExportSignal::ALL {
            let (items, sent, dropped) = item_metrics(signal);
            sent_items.insert(
                signal,
                counter(sent, &format!("{items} the backend accepted")),
            );
            let help = format!(
                "{items} given up before reaching the backend, by reason \
                 (channel_full, interval_full, rate_limited, queue_full, rejected, shutdown)"
            );
            let family = registry.counter_vec(dropped, &help, &["exporter", "reason"]);
            for reason in DROP_REASONS {
                dropped_items.insert((signal, reason), family.with(&[exporter, reason]));
            }
        }
        ExportMetrics {
            queue_requests: gauge(
                "clrscope_export_queue_requests",
                "Export requests waiting to be sent (the one being sent included)",
            ),
            queue_bytes: gauge(
                "clrscope_export_queue_bytes",
                "Bytes of export requests waiting to be sent",
            ),
            sent_requests: counter(
                "clrscope_export_sent_requests_total",
                "Export requests the backend accepted",
            ),
            sent_bytes: counter(
                "clrscope_export_sent_bytes_total",
                "Bytes of export requests the backend accepted (encoded, before compression)",
            ),
            sent_items,
            failed_attempts: counter(
                "clrscope_export_failed_attempts_total",
                "Attempts to send an export request that failed (each retry counts)",
            ),
            dropped_batches_channel: counter(
                "clrscope_export_dropped_batches_total",
                "Profile batches dropped because the exporter's task did not keep up",
            ),
            dropped_requests: DROP_REASONS
                .iter()
                .map(|&r| (r, dropped_requests.with(&[exporter, r])))
                .collect(),
            dropped_items,
        }
    }

    fn drop_items(&self, signal: ExportSignal, reason: &'static str, items: u64) {
        if signal == ExportSignal::Profiles && reason == "channel_full" {
            self.dropped_batches_channel.inc();
        }
        if let Some(c) = self.dropped_items.get(&(signal, reason)) {
            c.add(items);
        }
    }

    /// Counts a request given up, and what it carried under its signal.
    fn drop_request(&self, reason: &'static str, request: &Prepared) {
        if let Some(c) = self.dropped_requests.get(reason) {
            c.inc();
        }
        self.drop_items(request.signal, reason, request.values);
    }

    /// What the drop counters hold now.
    fn drop_totals(&self) -> DropTotals {
        DropTotals {
            requests: self.dropped_requests.values().map(Counter::get).sum(),
            items: self
                .dropped_items
                .iter()
                .map(|(&key, counter)| (key, counter.get()))
                .collect(),
        }
    }

    fn sent(&self, request: &Prepared) {
        self.sent_requests.inc();
        self.sent_bytes.add(request.bytes as u64);
        if let Some(c) = self.sent_items.get(&request.signal) {
            c.add(request.values);
        }
    }
}

/// The drop counters of one exporter at one time: what the next report compares with.
#[derive(Debug, Default)]
struct DropTotals {
    requests: u64,
    items: BTreeMap<(ExportSignal, &'static str), u64>,
}

/// Lets through at most `per_second` events a second, in bursts of up to that many (a token
/// bucket); 0 lets nothing through.
#[derive(Debug)]
struct RateLimiter {
    per_second: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl RateLimiter {
    fn new(per_second: u32) -> RateLimiter {
        RateLimiter {
            per_second: f64::from(per_second),
            tokens: f64::from(per_second),
            last: None,
        }
    }

    fn admit(&mut self, now: Instant) -> bool {
        if let Some(last) = self.last {
            let refill = now.saturating_duration_since(last).as_secs_f64() * self.per_second;
            self.tokens = (self.tokens + refill).min(self.per_second);
        }
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// One exporter's settings with the defaults filled in.
#[derive(Debug, Clone)]
struct Limits {
    interval: Duration,
    /// Requests queued at most, when set; `max_queue_bytes` is the budget either way.
    queue_size: Option<usize>,
    max_queue_bytes: u64,
    max_retry_delay: Duration,
}

impl Limits {
    fn of(config: &ExporterConfig) -> anyhow::Result<Limits> {
        let limits = Limits {
            interval: config.interval.unwrap_or(DEFAULT_INTERVAL),
            queue_size: config.queue_size,
            max_queue_bytes: config.max_queue_bytes.unwrap_or(DEFAULT_MAX_QUEUE_BYTES),
            max_retry_delay: config.max_retry_delay.unwrap_or(DEFAULT_MAX_RETRY_DELAY),
        };
        anyhow::ensure!(
            limits.interval >= Duration::from_millis(100),
            "Interval must be at least 100ms"
        );
        anyhow::ensure!(limits.queue_size != Some(0), "QueueSize must be at least 1");
        anyhow::ensure!(
            limits.max_retry_delay >= FIRST_RETRY_DELAY,
            "MaxRetryDelay must be at least 1s"
        );
        Ok(limits)
    }
}

/// The requests waiting for the backend, oldest first.
#[derive(Debug, Default)]
struct Queue {
    requests: VecDeque<Prepared>,
    bytes: u64,
    /// The front request is being sent: overflow drops the next oldest instead.
    front_in_flight: bool,
}

struct Shared {
    name: String,
    limits: Limits,
    queue: Mutex<Queue>,
    ready: Notify,
    metrics: Arc<ExportMetrics>,
}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update_gauges(&self, queue: &Queue) {
        self.metrics.queue_requests.set(queue.requests.len() as f64);
        self.metrics.queue_bytes.set(queue.bytes as f64);
    }

    /// Queues a request: into the last waiting request of its signal while both fit in one
    /// (a backend that is behind gets fewer, larger requests) and the queue in its budget, else
    /// at the back; then drops the oldest requests (never the one in flight) while over a limit.
    fn push(&self, request: Prepared) {
        let mut queue = self.queue();
        queue.bytes += request.bytes as u64;
        let first_waiting = usize::from(queue.front_in_flight);
        // Over budget, the new request stays apart, so that dropping the oldest keeps it.
        let last_of_signal = (queue.bytes <= self.limits.max_queue_bytes)
            .then(|| {
                queue
                    .requests
                    .iter()
                    .rposition(|r| r.signal == request.signal)
            })
            .flatten()
            .filter(|&at| at >= first_waiting);
        let unmerged = match last_of_signal {
            Some(at) => queue.requests[at].merge(request),
            None => Some(request),
        };
        if let Some(request) = unmerged {
            queue.requests.push_back(request);
        }
        while self.over_limits(&queue) && first_waiting + 1 < queue.requests.len() {
            let Some(old) = queue.requests.remove(first_waiting) else {
                break;
            };
            queue.bytes -= old.bytes as u64;
            self.metrics.drop_request("queue_full", &old);
        }
        self.update_gauges(&queue);
        drop(queue);
        self.ready.notify_one();
    }

    fn over_limits(&self, queue: &Queue) -> bool {
        queue.bytes > self.limits.max_queue_bytes
            || self
                .limits
                .queue_size
                .is_some_and(|size| queue.requests.len() > size)
    }

    /// Logs once what was given up since `last` (rate-limited spans aside: that limit is the
    /// user's), by signal, with the reasons; `last` becomes now.
    fn report_drops(&self, last: &mut DropTotals) {
        let now = self.metrics.drop_totals();
        let mut items = BTreeMap::<ExportSignal, u64>::new();
        let mut reasons = std::collections::BTreeSet::new();
        for (&(signal, reason), &n) in &now.items {
            let grown = n.saturating_sub(last.items.get(&(signal, reason)).copied().unwrap_or(0));
            if grown > 0 && reason != "rate_limited" {
                *items.entry(signal).or_default() += grown;
                reasons.insert(reason);
            }
        }
        let requests = now.requests.saturating_sub(last.requests);
        *last = now;
        if items.is_empty() && requests == 0 {
            return;
        }
        let (queued, queued_bytes) = {
            let queue = self.queue();
            (queue.requests.len(), queue.bytes)
        };
        let items = |signal| items.get(&signal).copied().unwrap_or(0);
        tracing::warn!(
            exporter = %self.name,
            requests,
            samples = items(ExportSignal::Profiles),
            log_records = items(ExportSignal::Logs),
            spans = items(ExportSignal::Traces),
            metric_points = items(ExportSignal::Metrics),
            reasons = %reasons.into_iter().collect::<Vec<_>>().join(","),
            queued,
            queued_bytes,
            max_queue_bytes = self.limits.max_queue_bytes,
            "export data was given up in the last interval (the clrscope_export_dropped_* metrics count it by reason)"
        );
    }
}

/// Starts one task pair per exporter; returns the taps for the batch sink and the tasks, which
/// end once every tap is dropped and what they hold is sent (or [`SHUTDOWN_GRACE`] passed).
pub fn spawn(
    config: &ExportersConfig,
    registry: &Registry,
) -> anyhow::Result<(ExportTaps, JoinSet<()>)> {
    let mut taps = Vec::new();
    let mut tasks = JoinSet::new();
    for (name, exporter) in config {
        let context = || format!("Exporters:{name}");
        let client = Client::new(exporter).with_context(context)?;
        let limits = Limits::of(exporter).with_context(context)?;
        let metrics = Arc::new(ExportMetrics::register(registry, name));
        let (channel, batches) = mpsc::channel(CHANNEL_BATCHES);
        let (logs, log_records) = if exporter.sends(ExportSignal::Logs) {
            let (sender, receiver) = mpsc::channel(CHANNEL_LOG_RECORDS);
            (Some(sender), Some(receiver))
        } else {
            (None, None)
        };
        let (traces, spans) = if exporter.sends(ExportSignal::Traces) {
            let (sender, receiver) = mpsc::channel(CHANNEL_SPANS);
            (Some(sender), Some(receiver))
        } else {
            (None, None)
        };
        let (metric_points, metric_receiver) = if exporter.sends(ExportSignal::Metrics) {
            let (sender, receiver) = mpsc::channel(CHANNEL_METRIC_POINTS);
            (Some(sender), Some(receiver))
        } else {
            (None, None)
        };
        let shared = Arc::new(Shared {
            name: name.clone(),
            limits,
            queue: Mutex::default(),
            ready: Notify::new(),
            metrics: metrics.clone(),
        });
        let (done_tx, done_rx) = tokio::sync::watch::channel(false);
        tasks.spawn(collect(
            shared.clone(),
            client.clone(),
            batches,
            Receivers {
                log_records,
                spans,
                metric_points: metric_receiver,
            },
            done_tx,
        ));
        tasks.spawn(send(shared, client, done_rx));
        taps.push(Tap {
            channel,
            profiles: exporter.sends(ExportSignal::Profiles),
            logs,
            traces,
            metric_points,
            metrics,
        });
    }
    Ok((ExportTaps(taps), tasks))
}

/// Says where profiles, logs and metrics go; after the agent's first line, which names its API address.
pub fn log_started(config: &ExportersConfig) {
    for (name, exporter) in config {
        let signals: Vec<&str> = exporter.signals.iter().map(|s| s.name()).collect();
        tracing::info!(
            exporter = %name,
            kind = exporter.kind.name(),
            endpoint = %exporter.endpoint,
            signals = %signals.join(","),
            "exporting"
        );
    }
}

/// The channels of an exporter's other signals, when it sends them.
struct Receivers {
    log_records: Option<mpsc::Receiver<LogExport>>,
    metric_points: Option<mpsc::Receiver<MetricExport>>,
    spans: Option<mpsc::Receiver<SpanExport>>,
}

/// Gathers batches (and log records, and spans) and prepares one interval's requests at a time.
async fn collect(
    shared: Arc<Shared>,
    client: Client,
    mut batches: mpsc::Receiver<ExportBatch>,
    Receivers {
        mut log_records,
        mut spans,
        mut metric_points,
    }: Receivers,
    done: tokio::sync::watch::Sender<bool>,
) {
    let mut pending_points: Vec<MetricExport> = Vec::new();
    let mut pending_logs: Vec<LogExport> = Vec::new();
    let mut pending_spans: Vec<SpanExport> = Vec::new();
    let prepare_signals =
        |logs: &mut Vec<LogExport>, spans: &mut Vec<SpanExport>, points: &mut Vec<MetricExport>| {
            let requests = [
                client.prepare_logs(&std::mem::take(logs)),
                client.prepare_traces(&std::mem::take(spans)),
                client.prepare_metrics(&std::mem::take(points)),
            ];
            for request in requests.into_iter().flatten() {
                shared.push(request);
            }
        };
    let interval = shared.limits.interval;
    let mut ticks = tokio::time::interval_at(Instant::now() + interval, interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pending: Vec<ExportBatch> = Vec::new();
    let mut pending_samples = 0usize;
    let mut dropped = DropTotals::default();
    let prepare = |pending: &mut Vec<ExportBatch>, samples: &mut usize| {
        let batches = std::mem::take(pending);
        *samples = 0;
        if batches.is_empty() {
            return;
        }
        // Encoding is CPU work of milliseconds (BENCHMARKS.md, "Export"); not worth a thread hop.
        let cpu = thread_cpu();
        let requests = client.prepare(&batches);
        let cpu = thread_cpu().saturating_sub(cpu);
        tracing::debug!(
            exporter = %shared.name,
            batches = batches.len(),
            requests = requests.len(),
            bytes = requests.iter().map(|r| r.bytes).sum::<usize>(),
            cpu_us = cpu.as_micros() as u64,
            "export requests prepared"
        );
        for request in requests {
            shared.push(request);
        }
    };
    loop {
        tokio::select! {
            batch = batches.recv() => match batch {
                Some(batch) => {
                    let samples = batch.batch.samples.len();
                    if pending_samples + samples > MAX_PENDING_SAMPLES {
                        shared.metrics.drop_items(ExportSignal::Profiles, "interval_full", samples as u64);
                    } else {
                        pending_samples += samples;
                        pending.push(batch);
                    }
                }
                None => break,
            },
            record = async { log_records.as_mut()?.recv().await }, if log_records.is_some() => match record {
                Some(record) if pending_logs.len() < MAX_PENDING_LOG_RECORDS => pending_logs.push(record),
                Some(_) => shared.metrics.drop_items(ExportSignal::Logs, "interval_full", 1),
                None => log_records = None,
            },
            span = async { spans.as_mut()?.recv().await }, if spans.is_some() => match span {
                Some(span) if pending_spans.len() < MAX_PENDING_SPANS => pending_spans.push(span),
                Some(_) => shared.metrics.drop_items(ExportSignal::Traces, "interval_full", 1),
                None => spans = None,
            },
            point = async { metric_points.as_mut()?.recv().await }, if metric_points.is_some() => match point {
                Some(point) if pending_points.len() < MAX_PENDING_METRIC_POINTS => pending_points.push(point),
                Some(_) => shared.metrics.drop_items(ExportSignal::Metrics, "interval_full", 1),
                None => metric_points = None,
            },
            _ = ticks.tick() => {
                prepare(&mut pending, &mut pending_samples);
                prepare_signals(&mut pending_logs, &mut pending_spans, &mut pending_points);
                shared.report_drops(&mut dropped);
            }
        }
    }
    prepare(&mut pending, &mut pending_samples);
    prepare_signals(&mut pending_logs, &mut pending_spans, &mut pending_points);
    shared.report_drops(&mut dropped);
    let _ = done.send(true);
}

/// CPU time of the calling thread (what preparing a request costs, whatever else runs).
fn thread_cpu() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given, which lives on this stack.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// The next wait after `failures` failed attempts in a row: doubling from 1 s up to the
/// maximum, then a random half to all of it, so agents restarted together do not retry in step.
fn backoff(failures: u32, max: Duration, asked: Option<Duration>) -> Duration {
    let doubled = FIRST_RETRY_DELAY.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    let ceiling = doubled.min(max);
    let jittered = ceiling.mul_f64(0.5 + fastrand::f64() * 0.5);
    match asked {
        Some(asked) => jittered.max(asked.min(max)),
        None => jittered,
    }
}

/// Sends queued requests oldest first, retrying while the backend is unreachable.
async fn send(shared: Arc<Shared>, client: Client, mut done: tokio::sync::watch::Receiver<bool>) {
    let mut failures = 0u32;
    // Set once the collector has prepared its last requests (or is gone).
    let mut deadline: Option<Instant> = None;
    loop {
        if deadline.is_none() && *done.borrow() {
            deadline = Some(Instant::now() + SHUTDOWN_GRACE);
        }
        let front = {
            let mut queue = shared.queue();
            let front = queue.requests.front().cloned();
            queue.front_in_flight = front.is_some();
            front
        };
        let Some(request) = front else {
            if deadline.is_some() {
                return;
            }
            tokio::select! {
                () = shared.ready.notified() => {}
                _ = done.changed() => deadline = Some(Instant::now() + SHUTDOWN_GRACE),
            }
            continue;
        };
        let result = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, client.send(&request))
                .await
                .unwrap_or_else(|_| {
                    Err(exporter::remote::SendError {
                        retryable: true,
                        retry_after: None,
                        message: "no time left: the agent is stopping".into(),
                    })
                }),
            None => client.send(&request).await,
        };
        // Whether the request leaves the queue: sent, refused, or no time left to retry it.
        let done_with = match &result {
            Ok(_) => true,
            Err(error) => !error.retryable || deadline.is_some(),
        };
        {
            let mut queue = shared.queue();
            queue.front_in_flight = false;
            if done_with {
                finish_front(&shared, &mut queue);
            }
        }
        match result {
            Ok(_) => {
                shared.metrics.sent(&request);
                if failures > 0 {
                    tracing::info!(exporter = %shared.name, failed_attempts = failures, "the backend takes profiles again");
                }
                failures = 0;
            }
            Err(error) if done_with => {
                shared.metrics.failed_attempts.inc();
                let reason = if error.retryable {
                    "shutdown"
                } else {
                    "rejected"
                };
                shared.metrics.drop_request(reason, &request);
                tracing::warn!(exporter = %shared.name, signal = request.signal.name(), items = request.values, %error, reason, "an export request was dropped");
            }
            Err(error) => {
                shared.metrics.failed_attempts.inc();
                failures += 1;
                let wait = backoff(failures, shared.limits.max_retry_delay, error.retry_after);
                if failures == 1 {
                    tracing::warn!(exporter = %shared.name, %error, retry_in = ?wait, "the backend did not take profiles; retrying (queued requests are kept up to MaxQueueBytes)");
                } else {
                    tracing::debug!(exporter = %shared.name, %error, failures, retry_in = ?wait, "retrying");
                }
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    _ = done.changed() => deadline = Some(Instant::now() + SHUTDOWN_GRACE),
                }
            }
        }
    }
}

/// Removes the request that was just sent (or given up) from the front of the queue.
fn finish_front(shared: &Shared, queue: &mut Queue) {
    if let Some(front) = queue.requests.pop_front() {
        queue.bytes -= front.bytes as u64;
    }
    shared.update_gauges(queue);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_maximum_with_jitter() {
        let max = Duration::from_secs(30);
        for _ in 0..100 {
            let first = backoff(1, max, None);
            assert!(first >= Duration::from_millis(500) && first <= Duration::from_secs(1));
            let fourth = backoff(4, max, None);
            assert!(fourth >= Duration::from_secs(4) && fourth <= Duration::from_secs(8));
            let late = backoff(40, max, None);
            assert!(late >= Duration::from_secs(15) && late <= max);
            assert!(backoff(1, max, Some(Duration::from_secs(20))) >= Duration::from_secs(20));
        }
    }
}
