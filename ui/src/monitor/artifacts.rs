//! The artifact routes: `/trace`, `/gcdump`, `/dump`, `/stacks`, `/logs`, `/exceptions`,
//! `/livemetrics`, streamed back or egressed.

use std::time::{Duration, SystemTime};

use crate::artifacts::{Artifact, ArtifactSource};
use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use collector::artifacts::{
    ArtifactError, DumpKind, EventMetricsConfiguration, EventPipeConfiguration, LiveMetricsRequest,
    StackFormat, TraceRequest,
};
use collector::gcdump::SnapshotOptions;
use collector::providers::TraceProfile;
use collector::signals::{
    ExceptionFormat, ExceptionsFilters, ExceptionsRequest, LogFormat, LogsRequest, LogsSettings,
    ProcessSignals,
};
use exporter::egress::{ArtifactOrigin, Upload};
use profile::log::LogLevel;
use tokio::io::{AsyncReadExt, AsyncWrite};
use tokio::sync::oneshot;

use super::{MonitorParams, OperationHandle, QueryPairs, Target};
use crate::error::ApiError;
use crate::server::ApiState;

/// How many bytes of a streamed artifact may wait for the client.
const STREAM_PIPE_BYTES: usize = 256 * 1024;
/// How much of a streamed artifact is sent at a time.
const STREAM_CHUNK: usize = 64 * 1024;
/// How long a heap snapshot may take (dotnet-monitor has no limit; a hung runtime should not
/// hold the gcdump slot for ever).
const GCDUMP_TIMEOUT: Duration = Duration::from_secs(300);
/// dotnet-monitor's default trace duration.
const DEFAULT_TRACE_SECONDS: i64 = 30;

const ARTIFACT_PARAMS: [&str; 5] = ["pid", "uid", "name", "egressProvider", "tags"];

pub(super) fn routes() -> Router<ApiState> {
    Router::new()
        .route("/trace", get(trace).post(trace_custom))
        .route("/gcdump", get(gcdump))
        .route("/dump", get(dump))
        .route("/stacks", get(stacks))
        .route("/logs", get(logs).post(logs_custom))
        .route("/exceptions", get(exceptions).post(exceptions_custom))
        .route("/livemetrics", get(live_metrics).post(live_metrics_custom))
}

/// The runtime behind `target`, as an artifact's source.
fn source(target: &Target) -> ArtifactSource<'_> {
    ArtifactSource {
        client: &target.client,
        pid: target.pid,
        local: target.local.as_ref(),
    }
}

/// Collects `artifact` into `out` until it ends or the operation is cancelled (`None`).
async fn run_job<W: AsyncWrite + Unpin + Send>(
    artifact: &Artifact,
    target: &Target,
    out: &mut W,
    handle: &OperationHandle,
) -> Option<Result<(), ArtifactError>> {
    let written = artifact.write(source(target), out, handle.stop_requested(), None);
    if artifact.cancellable_midway() {
        tokio::select! {
            result = written => Some(result),
            () = handle.cancelled() => None,
        }
    } else {
        let result = written.await;
        (!handle.is_cancelled()).then_some(result)
    }
}

/// Collects an egressed artifact to its end and records the outcome in its operation.
async fn run_egressed(
    artifact: Artifact,
    target: Target,
    mut upload: Upload,
    handle: OperationHandle,
) {
    match run_job(&artifact, &target, &mut upload, &handle).await {
        // Cancelled: the operation says so already; the partial artifact goes.
        None => {
            let _ = upload.abort().await;
        }
        Some(written) => match upload.conclude(written).await {
            Ok(location) => handle.succeed(Some(location)),
            Err(error) => {
                let message = error.to_string();
                tracing::warn!(operation = handle.id(), %message, "egressing an artifact failed");
                handle.fail(message);
            }
        },
    }
}

/// `{api_url}/operations/{id}`: absolute, as dotnet-monitor's `Location` headers are, when the
/// API has one URL of its own.
fn operation_url(api_url: Option<&str>, id: &str) -> String {
    format!("{}/operations/{id}", api_url.unwrap_or_default())
}

/// Resolves the process, registers the operation, then streams the artifact back or sends it
/// to the egress provider.
async fn collect(
    state: ApiState,
    params: MonitorParams,
    artifact: Artifact,
) -> Result<Response, ApiError> {
    let target = state
        .monitor
        .directory
        .resolve(&params.process_key()?)
        .await?;
    collect_from(state, params, target, artifact).await
}

/// [`collect`] from a resolved process.
async fn collect_from(
    state: ApiState,
    params: MonitorParams,
    target: Target,
    artifact: Artifact,
) -> Result<Response, ApiError> {
    let monitor = &state.monitor;
    let kind = artifact.kind();
    let provider = params.get("egressProvider").map(str::to_string);
    if let Some(name) = &provider {
        monitor.egress.check(name)?;
    }
    let handle = monitor.operations.start(
        kind,
        target.operation_process(),
        provider.clone(),
        params.tags(),
    )?;
    let location = operation_url(monitor.api_url.as_deref(), handle.id());
    let file_name = kind.file_name(target.pid, SystemTime::now());
    if let Some(name) = provider {
        let mut origin = ArtifactOrigin {
            pid: target.pid,
            runtime_cookie: Some(target.uid.clone()).filter(|uid| !uid.is_empty()),
            ..ArtifactOrigin::default()
        };
        if monitor.egress.needs_environment(&name) {
            origin.environment = target.client.environment().await.unwrap_or_else(|error| {
                tracing::warn!(pid = target.pid, %error, "cannot read the environment for blob metadata");
                Vec::new()
            });
        }
        let upload = monitor.egress.start(&name, &file_name, &origin)?;
        tokio::spawn(run_egressed(artifact, target, upload, handle));
        return Ok((StatusCode::ACCEPTED, [(header::LOCATION, location)]).into_response());
    }

    let content_type = artifact.content_type();
    let (mut writer, mut reader) = tokio::io::duplex(STREAM_PIPE_BYTES);
    let (done, outcome) = oneshot::channel::<Result<(), String>>();
    tokio::spawn(async move {
        let result = run_job(&artifact, &target, &mut writer, &handle).await;
        // The body ends here: complete, or cut short if the artifact failed midway.
        drop(writer);
        match result {
            None => {}
            Some(Ok(())) => {
                handle.succeed(None);
                let _ = done.send(Ok(()));
            }
            Some(Err(error)) => {
                let message = error.to_string();
                tracing::warn!(operation = handle.id(), %message, "collecting an artifact failed");
                handle.fail(message.clone());
                let _ = done.send(Err(message));
            }
        }
    });
    // Answer once the artifact has begun, so a failure to start is an error answer (400), not
    // an empty 200.
    let mut first = vec![0u8; STREAM_CHUNK];
    let n = reader.read(&mut first).await.unwrap_or(0);
    first.truncate(n);
    if n == 0 {
        if let Ok(Err(message)) = outcome.await {
            return Err(ApiError::Diagnostics(message));
        }
    }
    let rest = futures_util::stream::unfold(Some(reader), |reader| async move {
        let mut reader = reader?;
        let mut chunk = vec![0u8; STREAM_CHUNK];
        match reader.read(&mut chunk).await {
            Ok(0) => None,
            Ok(n) => {
                chunk.truncate(n);
                Some((Ok::<_, std::io::Error>(chunk), Some(reader)))
            }
            Err(e) => Some((Err(e), None)),
        }
    });
    let body = futures_util::StreamExt::chain(
        futures_util::stream::iter((!first.is_empty()).then_some(Ok::<_, std::io::Error>(first))),
        rest,
    );
    let disposition = format!("attachment; filename={file_name}");
    let mut response = Response::new(Body::from_stream(body));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Ok(value) = HeaderValue::from_str(&disposition) {
        headers.insert(header::CONTENT_DISPOSITION, value);
    }
    if let Ok(value) = HeaderValue::from_str(&location) {
        headers.insert(header::LOCATION, value);
    }
    Ok(response)
}

/// `durationSeconds`: default 30, -1 for until stopped.
fn trace_duration(params: &MonitorParams) -> Result<Option<Duration>, ApiError> {
    let seconds = match params.get("durationSeconds") {
        None => DEFAULT_TRACE_SECONDS,
        Some(text) => text
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|&s| (-1..=i64::from(i32::MAX)).contains(&s))
            .ok_or_else(|| ApiError::InvalidParameter {
                name: "durationSeconds",
                value: text.to_string(),
                reason: "whole seconds from -1 (until stopped) to 2147483647".into(),
            })?,
    };
    Ok(u64::try_from(seconds).ok().map(Duration::from_secs))
}

async fn trace(State(state): State<ApiState>, params: QueryPairs) -> Result<Response, ApiError> {
    let allowed = [&ARTIFACT_PARAMS[..], &["profile", "durationSeconds"]].concat();
    let params = MonitorParams::new(params, &allowed)?;
    let profiles: Vec<TraceProfile> = match params.get("profile") {
        None => TraceProfile::DEFAULT.to_vec(),
        Some(list) => list
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .map(|p| {
                p.parse()
                    .map_err(|e: collector::providers::ProviderSpecError| {
                        ApiError::InvalidParameter {
                            name: "profile",
                            value: list.to_string(),
                            reason: e.to_string(),
                        }
                    })
            })
            .collect::<Result<_, _>>()?,
    };
    let request = TraceRequest::profiles(&profiles, state.monitor.counter_interval_seconds)
        .map_err(|e| ApiError::BadRequest(e.to_string()))?
        .with_duration(trace_duration(&params)?)
        .with_parser(state.monitor.parser.clone());
    collect(state, params, Artifact::Trace(request)).await
}

async fn trace_custom(
    State(state): State<ApiState>,
    params: QueryPairs,
    body: Result<Json<EventPipeConfiguration>, JsonRejection>,
) -> Result<Response, ApiError> {
    let allowed = [&ARTIFACT_PARAMS[..], &["durationSeconds"]].concat();
    let params = MonitorParams::new(params, &allowed)?;
    let Json(configuration) = body.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let request = TraceRequest::custom(&configuration)
        .map_err(|e| ApiError::BadRequest(e.to_string()))?
        .with_duration(trace_duration(&params)?)
        .with_parser(state.monitor.parser.clone());
    collect(state, params, Artifact::Trace(request)).await
}

/// The process's signals, which the agent keeps while it is attached.
fn signals_of(state: &ApiState, target: &Target) -> Result<ProcessSignals, ApiError> {
    state.processes.signals_of(&target.uid).ok_or_else(|| {
        ApiError::BadRequest(format!(
            "process {} is not attached to the agent: its logs and exceptions come from the \
                 agent's session with it (check the agent's --pid/--name filters)",
            target.pid
        ))
    })
}

fn log_format(headers: &HeaderMap) -> Result<LogFormat, ApiError> {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    LogFormat::from_accept(accept).ok_or_else(|| {
        ApiError::BadRequest(
            "Accept: application/x-ndjson, application/json-seq or text/plain".to_string(),
        )
    })
}

/// Streams (or egresses) the logs `settings` select, as dotnet-monitor's `/logs`.
async fn collect_logs(
    state: ApiState,
    headers: &HeaderMap,
    params: MonitorParams,
    settings: LogsSettings,
) -> Result<Response, ApiError> {
    let format = log_format(headers)?;
    let target = state
        .monitor
        .directory
        .resolve(&params.process_key()?)
        .await?;
    let signals = signals_of(&state, &target)?;
    let request = LogsRequest {
        signals,
        settings,
        format,
        duration: trace_duration(&params)?,
        before: Duration::ZERO,
    };
    collect_from(state, params, target, Artifact::Logs(request)).await
}

async fn logs(
    State(state): State<ApiState>,
    headers: HeaderMap,
    params: QueryPairs,
) -> Result<Response, ApiError> {
    let allowed = [&ARTIFACT_PARAMS[..], &["durationSeconds", "level"]].concat();
    let params = MonitorParams::new(params, &allowed)?;
    let level = match params.get("level") {
        None => None,
        Some(text) => Some(
            LogLevel::parse(text).ok_or_else(|| ApiError::InvalidParameter {
                name: "level",
                value: text.to_string(),
                reason: "Trace, Debug, Information, Warning, Error or Critical".into(),
            })?,
        ),
    };
    let settings = LogsSettings::for_level(level);
    collect_logs(state, &headers, params, settings).await
}

async fn logs_custom(
    State(state): State<ApiState>,
    headers: HeaderMap,
    params: QueryPairs,
    body: Result<Json<LogsSettings>, JsonRejection>,
) -> Result<Response, ApiError> {
    let allowed = [&ARTIFACT_PARAMS[..], &["durationSeconds"]].concat();
    let params = MonitorParams::new(params, &allowed)?;
    let Json(settings) = body.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    collect_logs(state, &headers, params, settings).await
}

/// Live metrics of `selection` for `durationSeconds`, streamed as dotnet-monitor's JSON
/// sequence (or egressed); the values waiting for the reader are charged to the process's share
/// of the signal budget.
async fn collect_live_metrics(
    state: ApiState,
    params: MonitorParams,
    selection: collector::counters::CounterSelection,
) -> Result<Response, ApiError> {
    let duration = trace_duration(&params)?;
    let target = state
        .monitor
        .directory
        .resolve(&params.process_key()?)
        .await?;
    let share = match state.processes.signals_of(&target.uid) {
        Some(signals) => signals.share().clone(),
        None => state.monitor.signals.clone(),
    };
    let request = LiveMetricsRequest {
        selection,
        duration,
        share,
    };
    collect_from(state, params, target, Artifact::LiveMetrics(request)).await
}

/// `GET /livemetrics`: the agent's `Metrics` section (its default providers and meters).
async fn live_metrics(
    State(state): State<ApiState>,
    params: QueryPairs,
) -> Result<Response, ApiError> {
    let allowed = [&ARTIFACT_PARAMS[..], &["durationSeconds"]].concat();
    let params = MonitorParams::new(params, &allowed)?;
    let selection = state.monitor.live_metrics.clone();
    collect_live_metrics(state, params, selection).await
}

/// `POST /livemetrics`: the providers and meters of an `EventMetricsConfiguration` body.
async fn live_metrics_custom(
    State(state): State<ApiState>,
    params: QueryPairs,
    body: Result<Json<EventMetricsConfiguration>, JsonRejection>,
) -> Result<Response, ApiError> {
    let allowed = [&ARTIFACT_PARAMS[..], &["durationSeconds"]].concat();
    let params = MonitorParams::new(params, &allowed)?;
    let Json(configuration) = body.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let selection = configuration.selection(state.monitor.counter_interval_seconds);
    collect_live_metrics(state, params, selection).await
}

/// Streams (or egresses) the process's kept first-chance exceptions that `filters` select, oldest
/// first, as dotnet-monitor's `/exceptions`: plain text unless `Accept` asks for JSON.
async fn collect_exceptions(
    state: ApiState,
    headers: &HeaderMap,
    params: MonitorParams,
    filters: ExceptionsFilters,
) -> Result<Response, ApiError> {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = ExceptionFormat::from_accept(accept).ok_or_else(|| {
        ApiError::BadRequest(
            "Accept: application/x-ndjson, application/json-seq or text/plain".to_string(),
        )
    })?;
    let target = state
        .monitor
        .directory
        .resolve(&params.process_key()?)
        .await?;
    let signals = signals_of(&state, &target)?;
    if signals.limits().max_exceptions == 0 {
        return Err(ApiError::BadRequest(
            "the agent keeps no exceptions: start it with --exception-history N".to_string(),
        ));
    }
    let request = ExceptionsRequest {
        signals,
        filters,
        format,
    };
    collect_from(state, params, target, Artifact::Exceptions(request)).await
}

async fn exceptions(
    State(state): State<ApiState>,
    headers: HeaderMap,
    params: QueryPairs,
) -> Result<Response, ApiError> {
    let params = MonitorParams::new(params, &ARTIFACT_PARAMS)?;
    collect_exceptions(state, &headers, params, ExceptionsFilters::default()).await
}

async fn exceptions_custom(
    State(state): State<ApiState>,
    headers: HeaderMap,
    params: QueryPairs,
    body: Result<Json<ExceptionsFilters>, JsonRejection>,
) -> Result<Response, ApiError> {
    let params = MonitorParams::new(params, &ARTIFACT_PARAMS)?;
    let Json(filters) = body.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    collect_exceptions(state, &headers, params, filters).await
}

async fn gcdump(State(state): State<ApiState>, params: QueryPairs) -> Result<Response, ApiError> {
    let params = MonitorParams::new(params, &ARTIFACT_PARAMS)?;
    let options = SnapshotOptions {
        timeout: GCDUMP_TIMEOUT,
    };
    collect(state, params, Artifact::GcDump(options)).await
}

async fn dump(State(state): State<ApiState>, params: QueryPairs) -> Result<Response, ApiError> {
    let allowed = [&ARTIFACT_PARAMS[..], &["type"]].concat();
    let params = MonitorParams::new(params, &allowed)?;
    let kind = match params.get("type") {
        None => DumpKind::WithHeap,
        Some(text) => text
            .parse()
            .map_err(
                |e: collector::artifacts::UnknownDumpKind| ApiError::InvalidParameter {
                    name: "type",
                    value: text.to_string(),
                    reason: e.to_string(),
                },
            )?,
    };
    let temp_dir = state.monitor.dump_temp_dir.clone();
    collect(state, params, Artifact::Dump { kind, temp_dir }).await
}

async fn stacks(
    State(state): State<ApiState>,
    headers: HeaderMap,
    params: QueryPairs,
) -> Result<Response, ApiError> {
    let params = MonitorParams::new(params, &ARTIFACT_PARAMS)?;
    let format = stack_format(&headers);
    collect(state, params, Artifact::Stacks(format)).await
}

/// The stacks' format from `Accept`, as dotnet-monitor picks it: an exact media type first
/// (text, then JSON, then speedscope), then a wildcard that covers one; plain text otherwise.
fn stack_format(headers: &HeaderMap) -> StackFormat {
    let accepted: Vec<String> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|m| {
            m.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .collect();
    let formats = [
        StackFormat::PlainText,
        StackFormat::Json,
        StackFormat::Speedscope,
    ];
    let covers = |range: &str, media: &str| {
        range == "*/*"
            || range
                .strip_suffix("/*")
                .is_some_and(|top| media.split('/').next() == Some(top))
    };
    formats
        .into_iter()
        .find(|f| accepted.iter().any(|a| a == f.content_type()))
        .or_else(|| {
            formats
                .into_iter()
                .find(|f| accepted.iter().any(|a| covers(a, f.content_type())))
        })
        .unwrap_or(StackFormat::PlainText)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn stack_formats_follow_accept() {
        assert_eq!(stack_format(&HeaderMap::new()), StackFormat::PlainText);
        assert_eq!(stack_format(&accept("application/json")), StackFormat::Json);
        assert_eq!(
            stack_format(&accept("application/speedscope+json")),
            StackFormat::Speedscope
        );
        assert_eq!(
            stack_format(&accept("application/json, text/plain;q=0.5")),
            StackFormat::PlainText
        );
        assert_eq!(stack_format(&accept("application/*")), StackFormat::Json);
        assert_eq!(stack_format(&accept("*/*")), StackFormat::PlainText);
    }
}
