//! A raw EventPipe trace, written as the runtime streams it, stopped by a duration, a stopping
//! event or the caller.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use tokio::io::AsyncWrite;
use tokio::sync::Notify;

use super::ArtifactError;
use crate::client::DiagnosticsClient;
use crate::providers::{level, SessionProviders, TraceProfile};
use crate::session::{self, EventObserver, ParsingWriter, SessionEnd, SessionProgress};
use ipc::{CollectTracing, ProviderConfig, DEFAULT_RUNDOWN_KEYWORD};
use nettrace::{Event, ParserOptions, Value};

/// How long the runtime may take to send the rundown and end the stream after StopTracing.
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// What to trace and when to stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRequest {
    pub session: SessionProviders,
    /// The runtime's buffer for the session, in MB (events are dropped when it is full).
    pub buffer_mb: u32,
    /// `None`: until the caller's stop (or the stopping event).
    pub duration: Option<Duration>,
    pub stopping_event: Option<StoppingEvent>,
    /// How long to wait for the rundown after stopping.
    pub stop_timeout: Duration,
    /// Limits of the parser that watches the stream; a stream past them ends the trace.
    pub parser: ParserOptions,
}

impl TraceRequest {
    /// A trace of `session`'s providers, with the runtime's default buffer, until stopped.
    pub fn new(session: SessionProviders) -> Result<TraceRequest, ArtifactError> {
        if session.providers.is_empty() {
            return Err(ArtifactError::NoProviders);
        }
        Ok(TraceRequest {
            session,
            buffer_mb: CollectTracing::DEFAULT_BUFFER_MB,
            duration: None,
            stopping_event: None,
            stop_timeout: DEFAULT_STOP_TIMEOUT,
            parser: ParserOptions::default(),
        })
    }

    /// dotnet-monitor's profiles combined; `counter_interval_seconds` paces the Metrics profile's
    /// EventCounters (its `GlobalCounter:IntervalSeconds`, 5 by default).
    pub fn profiles(
        profiles: &[TraceProfile],
        counter_interval_seconds: u32,
    ) -> Result<TraceRequest, ArtifactError> {
        let mut session = SessionProviders::default();
        for &profile in profiles {
            session.add_profile(profile, counter_interval_seconds)?;
        }
        TraceRequest::new(session)
    }

    /// dotnet-monitor's custom trace (`POST /trace`'s body, CollectTrace's `Providers`).
    pub fn custom(configuration: &EventPipeConfiguration) -> Result<TraceRequest, ArtifactError> {
        let mut session = SessionProviders::default();
        for provider in &configuration.providers {
            session.add(provider.to_config())?;
        }
        if configuration.request_rundown {
            session.rundown_keyword = DEFAULT_RUNDOWN_KEYWORD;
        }
        let mut request = TraceRequest::new(session)?;
        request.buffer_mb = configuration.buffer_size_in_mb;
        Ok(request)
    }

    pub fn with_duration(mut self, duration: Option<Duration>) -> Self {
        self.duration = duration;
        self
    }

    pub fn with_parser(mut self, parser: ParserOptions) -> Self {
        self.parser = parser;
        self
    }

    pub fn with_stopping_event(mut self, event: Option<StoppingEvent>) -> Self {
        self.stopping_event = event;
        self
    }

    fn config(&self) -> CollectTracing {
        CollectTracing::v2(self.session.providers.clone())
            .with_rundown_keyword(self.session.rundown_keyword)
            .with_circular_buffer_mb(self.buffer_mb)
    }
}

/// dotnet-monitor's `EventPipeConfiguration`: the body of `POST /trace`. Names are read in
/// camelCase (the HTTP API's) or PascalCase (settings.json's).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventPipeConfiguration {
    #[serde(alias = "Providers")]
    pub providers: Vec<EventPipeProvider>,
    /// Default true: the rundown names the methods in the trace's stacks.
    #[serde(
        alias = "RequestRundown",
        default = "default_true",
        deserialize_with = "settings::lenient::boolean"
    )]
    pub request_rundown: bool,
    /// 1..=1024, default 256.
    #[serde(
        rename = "bufferSizeInMB",
        alias = "BufferSizeInMB",
        alias = "BufferSizeMegabytes",
        alias = "bufferSizeMegabytes",
        default = "default_buffer_mb",
        deserialize_with = "buffer_mb"
    )]
    pub buffer_size_in_mb: u32,
}

fn default_true() -> bool {
    true
}

fn default_buffer_mb() -> u32 {
    CollectTracing::DEFAULT_BUFFER_MB
}

/// One provider of a custom trace, as dotnet-monitor reads it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventPipeProvider {
    #[serde(alias = "Name")]
    pub name: String,
    /// A hex (`0x…`) or decimal string, or a number; default every keyword.
    #[serde(
        alias = "Keywords",
        default = "all_keywords",
        deserialize_with = "keywords"
    )]
    pub keywords: u64,
    /// `LogAlways`, `Critical`, `Error`, `Warning`, `Informational`, `Verbose` or 0–5; default
    /// Verbose.
    #[serde(
        alias = "EventLevel",
        default = "verbose",
        deserialize_with = "event_level"
    )]
    pub event_level: u32,
    #[serde(alias = "Arguments", default)]
    pub arguments: Option<BTreeMap<String, String>>,
}

impl EventPipeProvider {
    pub fn to_config(&self) -> ProviderConfig {
        let config = ProviderConfig::new(self.name.clone(), self.keywords, self.event_level);
        match &self.arguments {
            Some(arguments) => {
                let pairs: Vec<(&str, &str)> = arguments
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                config.with_arguments(crate::providers::encode_arguments(&pairs))
            }
            None => config,
        }
    }
}

fn all_keywords() -> u64 {
    u64::MAX
}

fn verbose() -> u32 {
    level::VERBOSE
}

/// A JSON number, or a string holding one (environment variables arrive as strings).
#[derive(Deserialize)]
#[serde(untagged)]
enum NumberOrText {
    Number(u64),
    Text(String),
}

fn keywords<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    use serde::de::Error;
    match NumberOrText::deserialize(d)? {
        NumberOrText::Number(n) => Ok(n),
        NumberOrText::Text(text) => {
            let t = text.trim();
            let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                Some(hex) => u64::from_str_radix(hex, 16).ok(),
                // dotnet-monitor reads decimal keywords as a signed 64-bit number.
                None => t
                    .parse::<u64>()
                    .ok()
                    .or_else(|| t.parse::<i64>().ok().map(|n| n as u64)),
            };
            parsed.ok_or_else(|| {
                D::Error::custom(format!(
                    "keywords {text:?} are neither a hex (0x…) nor a decimal number"
                ))
            })
        }
    }
}

fn event_level<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    use serde::de::Error;
    let invalid = |text: &str| {
        D::Error::custom(format!(
            "event level {text:?} is not one of LogAlways, Critical, Error, Warning, \
             Informational, Verbose or 0-5"
        ))
    };
    match NumberOrText::deserialize(d)? {
        NumberOrText::Number(n) if n <= u64::from(level::VERBOSE) => Ok(n as u32),
        NumberOrText::Number(n) => Err(invalid(&n.to_string())),
        NumberOrText::Text(text) => match text.trim().to_ascii_lowercase().as_str() {
            "logalways" | "0" => Ok(level::LOG_ALWAYS),
            "critical" | "1" => Ok(level::CRITICAL),
            "error" | "2" => Ok(level::ERROR),
            "warning" | "3" => Ok(level::WARNING),
            "informational" | "4" => Ok(level::INFORMATIONAL),
            "verbose" | "5" => Ok(level::VERBOSE),
            _ => Err(invalid(&text)),
        },
    }
}

fn buffer_mb<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    match settings::lenient::number::<D, u32>(d)? {
        n @ 1..=1024 => Ok(n),
        n => Err(serde::de::Error::custom(format!(
            "the buffer size is 1 to 1024 MB, not {n}"
        ))),
    }
}

/// CollectTrace's `StoppingEvent`: the trace ends once this event is seen (or its duration has
/// elapsed). Events are matched by provider and event name (both case-insensitive, the name as
/// the event's metadata spells it) and, when given, payload fields whose text equals the value.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct StoppingEvent {
    #[serde(alias = "providerName")]
    pub provider_name: String,
    #[serde(alias = "eventName")]
    pub event_name: String,
    #[serde(alias = "payloadFilter", default)]
    pub payload_filter: BTreeMap<String, String>,
}

impl StoppingEvent {
    pub fn matches(&self, event: &Event<'_>) -> bool {
        let metadata = event.metadata;
        if !metadata
            .provider_name
            .eq_ignore_ascii_case(&self.provider_name)
            || !metadata.event_name.eq_ignore_ascii_case(&self.event_name)
        {
            return false;
        }
        if self.payload_filter.is_empty() {
            return true;
        }
        let Ok(fields) = event.decode() else {
            return false;
        };
        self.payload_filter.iter().all(|(name, expected)| {
            fields
                .iter()
                .find(|f| f.name == name)
                .is_some_and(|f| value_is(&f.value, expected))
        })
    }
}

/// Whether a payload value reads as `expected` (numbers by value, booleans as True/False).
fn value_is(value: &Value<'_>, expected: &str) -> bool {
    let expected = expected.trim();
    match value {
        Value::String(s) => s == expected,
        Value::Bool(b) => expected.eq_ignore_ascii_case(if *b { "true" } else { "false" }),
        Value::F32(_) | Value::F64(_) => {
            matches!((value.as_f64(), expected.parse::<f64>()), (Some(a), Ok(b)) if a == b)
        }
        _ => matches!((value.as_i64(), expected.parse::<i64>()), (Some(a), Ok(b)) if a == b),
    }
}

/// Why a trace ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceEnd {
    /// Its duration elapsed.
    Duration,
    /// The stopping event was seen.
    StoppingEvent,
    /// The caller's stop future completed.
    Stopped,
    /// The runtime ended the stream: the process exited, or another tool stopped the session.
    EndedByRuntime,
}

/// What a finished trace holds.
#[derive(Debug, Clone)]
pub struct TraceSummary {
    pub session: session::SessionSummary,
    pub end: TraceEnd,
    pub events: u64,
    /// Events the runtime dropped because its buffer was full.
    pub dropped_events: u64,
    /// Why the stream stopped parsing, if it did (the artifact still holds every byte).
    pub parse_error: Option<String>,
}

/// Where a running trace stands, for progress displays.
#[derive(Debug, Clone, Copy)]
pub struct TraceProgress {
    pub session: SessionProgress,
    pub events: u64,
}

/// Counts events and watches for the stopping event.
struct TraceObserver {
    events: Arc<AtomicU64>,
    stopping: Option<(StoppingEvent, Arc<Notify>)>,
}

impl EventObserver for TraceObserver {
    fn on_event(&mut self, event: &Event<'_>) {
        self.events.fetch_add(1, Ordering::Relaxed);
        if let Some((stopping, seen)) = &self.stopping {
            if stopping.matches(event) {
                seen.notify_one();
            }
        }
    }
}

/// Traces the runtime behind `client` into `out` until the request's duration, its stopping
/// event or `stop`, whichever comes first, then waits for the rundown. Dropping the returned
/// future ends the session (the runtime stops a session whose reader has gone) and leaves `out`
/// without the end of the stream.
pub async fn collect_trace<W: AsyncWrite + Unpin>(
    client: &DiagnosticsClient,
    request: &TraceRequest,
    out: &mut W,
    stop: impl Future<Output = ()>,
    mut progress: impl FnMut(TraceProgress),
) -> Result<TraceSummary, ArtifactError> {
    let events = Arc::new(AtomicU64::new(0));
    let seen = Arc::new(Notify::new());
    let observer = TraceObserver {
        events: events.clone(),
        stopping: request
            .stopping_event
            .clone()
            .map(|event| (event, seen.clone())),
    };
    let mut writer = ParsingWriter::with_options(out, observer, request.parser.clone());
    let reason = Mutex::new(None);
    let stop_any = async {
        let duration = async {
            match request.duration {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let end = tokio::select! {
            () = duration => TraceEnd::Duration,
            () = seen.notified() => TraceEnd::StoppingEvent,
            () = stop => TraceEnd::Stopped,
        };
        *reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(end);
    };
    let summary = session::run(
        client,
        request.config(),
        &mut writer,
        stop_any,
        request.stop_timeout,
        |session| {
            progress(TraceProgress {
                session,
                events: events.load(Ordering::Relaxed),
            })
        },
    )
    .await
    .map_err(ArtifactError::Trace)?;
    let end = match summary.end {
        SessionEnd::EndedByRuntime => TraceEnd::EndedByRuntime,
        SessionEnd::Stopped => reason
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
            .unwrap_or(TraceEnd::Stopped),
    };
    Ok(TraceSummary {
        session: summary,
        end,
        events: events.load(Ordering::Relaxed),
        dropped_events: writer.parser().dropped_events(),
        parse_error: writer.error().map(ToString::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn custom_configuration_reads_dotnet_monitor_json() {
        let body = r#"{
            "providers": [
                {"name": "Microsoft-Windows-DotNETRuntime", "eventLevel": "Informational", "keywords": "0x14C14FCCBD"},
                {"Name": "My-Source", "Arguments": {"a": "b"}},
                {"name": "Other", "eventLevel": 2, "keywords": "255"}
            ],
            "requestRundown": false,
            "bufferSizeInMB": "64"
        }"#;
        let config: EventPipeConfiguration = serde_json::from_str(body).unwrap();
        assert_eq!(config.providers[0].keywords, 0x14C14FCCBD);
        assert_eq!(config.providers[0].event_level, level::INFORMATIONAL);
        assert_eq!(config.providers[1].keywords, u64::MAX);
        assert_eq!(config.providers[1].event_level, level::VERBOSE);
        assert_eq!(config.providers[2].keywords, 255);
        assert_eq!(config.providers[2].event_level, level::ERROR);
        assert!(!config.request_rundown);
        assert_eq!(config.buffer_size_in_mb, 64);
        let request = TraceRequest::custom(&config).unwrap();
        assert_eq!(request.session.rundown_keyword, 0);
        assert_eq!(request.buffer_mb, 64);
        assert_eq!(
            request.session.providers[1].arguments.as_deref(),
            Some("a=b")
        );

        let defaults: EventPipeConfiguration =
            serde_json::from_str(r#"{"providers":[{"name":"X"}]}"#).unwrap();
        assert!(defaults.request_rundown);
        assert_eq!(defaults.buffer_size_in_mb, 256);
        for bad in [
            r#"{"providers":[{"name":"X","keywords":"0xZZ"}]}"#,
            r#"{"providers":[{"name":"X","eventLevel":"Loud"}]}"#,
            r#"{"providers":[{"name":"X"}],"bufferSizeInMB":0}"#,
        ] {
            assert!(
                serde_json::from_str::<EventPipeConfiguration>(bad).is_err(),
                "{bad}"
            );
        }
        let empty: EventPipeConfiguration = serde_json::from_str(r#"{"providers":[]}"#).unwrap();
        assert!(matches!(
            TraceRequest::custom(&empty),
            Err(ArtifactError::NoProviders)
        ));
    }

    #[test]
    fn payload_values_compare_as_text() {
        assert!(value_is(&Value::String("GET".into()), "GET"));
        assert!(!value_is(&Value::String("GET".into()), "get"));
        assert!(value_is(&Value::I32(404), "404"));
        assert!(value_is(&Value::U64(7), " 7 "));
        assert!(value_is(&Value::Bool(true), "True"));
        assert!(value_is(&Value::F64(1.5), "1.5"));
        assert!(!value_is(&Value::I32(404), "500"));
    }
}
