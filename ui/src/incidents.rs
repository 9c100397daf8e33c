//! The incident routes ([`store::incidents`]):
//!
//! | route | answer |
//! |---|---|
//! | `GET /api/v1/incidents?pid=&service_name=&rule=&from=&until=` | the incidents, newest first |
//! | `POST /api/v1/incidents` `{"pids":[…], "time":…, "note":…}` | marks a time on processes: the incident it made or joined |
//! | `GET /api/v1/incidents/{id}` | one incident |
//! | `GET /api/v1/incidents/{id}/diff?type=&pid=&limit=` | the flame-graph diff, functions ranked by growth of their share |
//! | `GET /api/v1/incidents/{id}/exceptions?pid=&limit=` | the exception types new or grown in the window, with their counts |
//! | `GET /api/v1/incidents/{id}/spans?pid=&limit=` | the slowest spans before and during, while the process is attached |
//! | `GET /api/v1/incidents/{id}/bundle` | the portable bundle ([`crate::bundle`]) |

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use collector::signals::slowest::SLOWEST_PER_MINUTE;
use profile::clock::unix_nanos;
use profile::span::SpanRecord;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use store::incidents::{
    incident_diff, incident_exceptions, CauseKind, DiffProfiles, Incident, IncidentCause,
    IncidentDiff, IncidentExceptions, IncidentFilter, IncidentProcess, MAX_PROCESSES,
};
use store::tsdb::{QueryControl, Store};

use crate::admission::RouteClass;
use crate::bundle::{self, BundleParts};
use crate::error::ApiError;
use crate::query::{profile_type, Params, QueryPairs};
use crate::server::ApiState;
use crate::time::parse_time;

const MILLISECOND: i64 = 1_000_000;
/// Functions a diff lists unless `limit` says otherwise.
pub const DEFAULT_DIFF_FUNCTIONS: usize = 50;
/// Most functions a diff lists.
pub const MAX_DIFF_FUNCTIONS: usize = 10_000;
/// Exception types an incident's exceptions list unless `limit` says otherwise.
pub const DEFAULT_EXCEPTION_TYPES: usize = 20;
/// Spans each side of an incident's slowest spans lists unless `limit` says otherwise.
pub const DEFAULT_SLOW_SPANS: usize = 20;
/// Longest note a mark keeps, in bytes.
pub const MAX_NOTE_BYTES: usize = 1024;

pub fn incident_routes() -> Router<ApiState> {
    Router::new()
        .route("/api/v1/incidents", get(list).post(mark))
        .route("/api/v1/incidents/{id}", get(show))
        .route("/api/v1/incidents/{id}/diff", get(diff))
        .route("/api/v1/incidents/{id}/exceptions", get(exceptions))
        .route("/api/v1/incidents/{id}/spans", get(spans))
        .route("/api/v1/incidents/{id}/bundle", get(bundle_route))
}

async fn list(
    State(state): State<ApiState>,
    params: QueryPairs,
) -> Result<Json<Vec<Incident>>, ApiError> {
    let params = Params::new(params, &["pid", "service_name", "rule", "from", "until"])?;
    let now = unix_nanos();
    let time = |name| -> Result<Option<i64>, ApiError> {
        match params.get(name) {
            None => Ok(None),
            Some(_) => Ok(Some(params.time(name, now, now)?.div_euclid(MILLISECOND))),
        }
    };
    let filter = IncidentFilter {
        pid: pid_param(&params)?,
        service_name: params.get("service_name").map(str::to_string),
        rule: params.get("rule").map(str::to_string),
        from_unix_ms: time("from")?,
        until_unix_ms: time("until")?,
    };
    Ok(Json(state.incidents.list(&filter)))
}

fn pid_param(params: &Params) -> Result<Option<u64>, ApiError> {
    params
        .get("pid")
        .map(|p| {
            p.parse::<u64>().map_err(|_| ApiError::InvalidParameter {
                name: "pid",
                value: p.to_string(),
                reason: "expected a process id".into(),
            })
        })
        .transpose()
}

/// `POST /api/v1/incidents`: `time` as the other routes take it (default now).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MarkRequest {
    pids: Vec<u64>,
    #[serde(default)]
    time: Option<String>,
    #[serde(default)]
    note: Option<String>,
}

async fn mark(
    State(state): State<ApiState>,
    body: Result<Json<MarkRequest>, JsonRejection>,
) -> Result<Json<Incident>, ApiError> {
    let Json(request) = body.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    if request.pids.is_empty() || request.pids.len() > MAX_PROCESSES {
        return Err(ApiError::BadRequest(format!(
            "`pids` names 1 to {MAX_PROCESSES} attached processes (GET /processes lists them)"
        )));
    }
    if request
        .note
        .as_ref()
        .is_some_and(|n| n.len() > MAX_NOTE_BYTES)
    {
        return Err(ApiError::BadRequest(format!(
            "`note` is longer than {MAX_NOTE_BYTES} bytes"
        )));
    }
    let now = unix_nanos();
    let at = match &request.time {
        None => now,
        Some(text) => parse_time(text, now).map_err(|reason| ApiError::InvalidParameter {
            name: "time",
            value: text.clone(),
            reason,
        })?,
    };
    let mut processes = Vec::new();
    for &pid in &request.pids {
        let process = state
            .processes
            .by_pid(pid)
            .ok_or(ApiError::ProcessNotFound { pid })?;
        processes.push(IncidentProcess {
            pid,
            service_name: process.service_name,
        });
    }
    let cause = IncidentCause {
        unix_ms: at.div_euclid(MILLISECOND),
        kind: CauseKind::Mark,
        rule: None,
        note: request.note,
        trigger: None,
        trigger_from_unix_ms: None,
        processes,
    };
    let incidents = state.incidents.clone();
    let incident = tokio::task::spawn_blocking(move || incidents.record(cause))
        .await
        .map_err(|e| ApiError::Internal(format!("the incident task failed: {e}")))??;
    Ok(Json(incident))
}

fn incident(state: &ApiState, id: Result<Path<u64>, PathRejection>) -> Result<Incident, ApiError> {
    let Path(id) = id?;
    state
        .incidents
        .get(id)
        .ok_or(ApiError::IncidentNotFound { id })
}

async fn show(
    State(state): State<ApiState>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<Incident>, ApiError> {
    Ok(Json(incident(&state, id)?))
}

/// The process of `incident` a diff is of: `pid`, or its first.
fn diff_pid(incident: &Incident, pid: Option<u64>) -> Result<u64, ApiError> {
    match pid {
        None => Ok(incident.processes[0].pid),
        Some(pid) if incident.processes.iter().any(|p| p.pid == pid) => Ok(pid),
        Some(pid) => Err(ApiError::InvalidParameter {
            name: "pid",
            value: pid.to_string(),
            reason: format!("incident {} does not concern that process", incident.id),
        }),
    }
}

/// The diff of `pid` in `type_name`, the one query every caller of an incident's diff runs.
pub fn diff_of(
    store: &Store,
    incident: &Incident,
    pid: u64,
    type_name: &str,
    limit: usize,
    control: &QueryControl,
) -> Result<(IncidentDiff, DiffProfiles), ApiError> {
    let profile_type = profile_type(store, type_name)?;
    let now_ms = unix_nanos().div_euclid(MILLISECOND);
    Ok(incident_diff(
        store,
        incident,
        pid,
        &profile_type,
        now_ms,
        limit,
        control,
    )?)
}

async fn diff(
    State(state): State<ApiState>,
    id: Result<Path<u64>, PathRejection>,
    params: QueryPairs,
) -> Result<Json<IncidentDiff>, ApiError> {
    let params = Params::new(params, &["type", "pid", "limit"])?;
    let incident = incident(&state, id)?;
    let pid = diff_pid(&incident, pid_param(&params)?)?;
    let type_name = params.get("type").unwrap_or("cpu").to_string();
    let limit = limit_param(&params, DEFAULT_DIFF_FUNCTIONS, "functions")?;
    let answer = state
        .query(RouteClass::Profile, move |store| {
            let (diff, _) = diff_of(&store, &incident, pid, &type_name, limit, &store.control)?;
            Ok(diff)
        })
        .await?;
    Ok(Json(answer))
}

/// `limit`: 1 to [`MAX_DIFF_FUNCTIONS`] `things`, `default` when not given.
fn limit_param(params: &Params, default: usize, things: &str) -> Result<usize, ApiError> {
    let Some(text) = params.get("limit") else {
        return Ok(default);
    };
    text.parse::<usize>()
        .ok()
        .filter(|n| (1..=MAX_DIFF_FUNCTIONS).contains(n))
        .ok_or_else(|| ApiError::InvalidParameter {
            name: "limit",
            value: text.to_string(),
            reason: format!("a number of {things} from 1 to {MAX_DIFF_FUNCTIONS}"),
        })
}

/// The exception types of one process that are new or grew: the store's `exception` profile
/// (every throw counted) before and during, by the `type` label.
async fn exceptions(
    State(state): State<ApiState>,
    id: Result<Path<u64>, PathRejection>,
    params: QueryPairs,
) -> Result<Json<IncidentExceptions>, ApiError> {
    let params = Params::new(params, &["pid", "limit"])?;
    let incident = incident(&state, id)?;
    let pid = diff_pid(&incident, pid_param(&params)?)?;
    let limit = limit_param(&params, DEFAULT_EXCEPTION_TYPES, "exception types")?;
    let answer = state
        .query(RouteClass::Profile, move |store| {
            let now_ms = unix_nanos().div_euclid(MILLISECOND);
            let control = store.control.clone();
            Ok(incident_exceptions(
                &store, &incident, pid, now_ms, limit, &control,
            )?)
        })
        .await?;
    Ok(Json(answer))
}

/// One side of [`SlowSpans`].
#[derive(Debug, Serialize)]
struct SlowSide {
    from_unix_ms: i64,
    until_unix_ms: i64,
    /// Spans that ended in the minutes the side touches, kept or not.
    seen: u64,
    /// Slowest first.
    spans: Vec<Value>,
}

/// The answer of `GET /api/v1/incidents/{id}/spans`.
#[derive(Debug, Serialize)]
struct SlowSpans {
    incident: u64,
    pid: u64,
    /// Whether the process is attached: the spans are kept in memory, with the process.
    attached: bool,
    kept_per_minute: usize,
    before: SlowSide,
    during: SlowSide,
}

fn span_json(span: &SpanRecord) -> Value {
    let tags: serde_json::Map<String, Value> = span
        .tags
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    json!({
        "trace_id": span.span.trace_id.to_string(),
        "span_id": span.span.span_id.to_string(),
        "parent_span_id": span.parent_span_id.map(|id| id.to_string()),
        "name": span.display_name,
        "source": &*span.source_name,
        "kind": format!("{:?}", span.kind),
        "status": format!("{:?}", span.status),
        "start_unix_ms": span.start_unix_nanos.div_euclid(MILLISECOND),
        "duration_ms": span.duration_nanos as f64 / MILLISECOND as f64,
        "tags": tags,
    })
}

/// The slowest finished spans of one process before and during an incident: the slowest
/// [`SLOWEST_PER_MINUTE`] of each minute the agent keeps while the process is attached.
async fn spans(
    State(state): State<ApiState>,
    id: Result<Path<u64>, PathRejection>,
    params: QueryPairs,
) -> Result<Json<SlowSpans>, ApiError> {
    let params = Params::new(params, &["pid", "limit"])?;
    let incident = incident(&state, id)?;
    let pid = diff_pid(&incident, pid_param(&params)?)?;
    let limit = limit_param(&params, DEFAULT_SLOW_SPANS, "spans")?;
    let (before, during) = incident.ranges(unix_nanos().div_euclid(MILLISECOND));
    let process = state.processes.by_pid(pid);
    let side = |(from, until): (i64, i64)| {
        let kept = process.as_ref().map(|p| {
            p.signals
                .slowest_spans(from * MILLISECOND, until * MILLISECOND, limit)
        });
        let kept = kept.unwrap_or_default();
        SlowSide {
            from_unix_ms: from,
            until_unix_ms: until,
            seen: kept.seen,
            spans: kept.spans.iter().map(|s| span_json(s)).collect(),
        }
    };
    Ok(Json(SlowSpans {
        incident: incident.id,
        pid,
        attached: process.is_some(),
        kept_per_minute: SLOWEST_PER_MINUTE,
        before: side(before),
        during: side(during),
    }))
}

async fn bundle_route(
    State(state): State<ApiState>,
    id: Result<Path<u64>, PathRejection>,
    params: QueryPairs,
) -> Result<Response, ApiError> {
    Params::new(params, &[])?;
    let incident = incident(&state, id)?;
    let signals = bundle::signals(&state.processes, &incident);
    let file_name = bundle::file_name(&incident);
    let body = state
        .query(RouteClass::Profile, move |store| {
            let parts = BundleParts::collect(&store, &incident, &store.control)?;
            drop(store);
            Ok(bundle::write(&incident, &parts, &signals))
        })
        .await?;
    let disposition = format!("attachment; filename=\"{file_name}\"");
    let headers = [
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        ),
        (
            header::CONTENT_DISPOSITION,
            HeaderValue::try_from(disposition)
                .map_err(|e| ApiError::Internal(format!("the bundle's file name: {e}")))?,
        ),
    ];
    Ok((headers, body).into_response())
}
