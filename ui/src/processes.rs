//! Agent control: the attached processes and their samplers.
//!
//! | route | answer |
//! |---|---|
//! | `GET /api/v1/processes` | every attached process with its sampler state |
//! | `POST /api/v1/processes/{pid}/boost?duration=60s` | samples without pause for `duration` (default 60 s, at most 1 h) |
//! | `DELETE /api/v1/processes/{pid}/boost` | ends a boost early |
//! | `GET /api/v1/processes/{pid}/signals?level=Error&limit=50` | its recent exceptions and log messages at or above `level`, newest first |

use std::time::Duration;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use collector::attached::{AttachedProcess, AttachedProcessStatus};
use collector::nettrace::events::LogLevel;
use collector::sampler::SamplerStatus;
use collector::signals::exceptions::exception_json;
use collector::signals::logs::record_json;
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::server::ApiState;
use settings::parse_duration;

/// How long one boost may last: the sampler's full-time cost is worth paying for an incident,
/// not for good.
pub const MAX_BOOST: Duration = Duration::from_secs(3600);
const DEFAULT_BOOST: Duration = Duration::from_secs(60);

pub fn process_routes() -> Router<ApiState> {
    Router::new()
        .route("/api/v1/processes", get(list))
        .route(
            "/api/v1/processes/{pid}/boost",
            post(boost).delete(cancel_boost),
        )
        .route("/api/v1/processes/{pid}/signals", get(signals))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignalParams {
    level: Option<String>,
    limit: Option<usize>,
}

/// Most records of each kind one answer carries.
const MAX_SIGNALS: usize = 1000;

/// The web UI's panel beside the flame graph: the process's recent exceptions and log messages,
/// newest first, in the JSON of `/exceptions` and `/logs`.
async fn signals(
    State(state): State<ApiState>,
    pid: Result<Path<u64>, PathRejection>,
    params: Result<Query<SignalParams>, QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let process = attached(&state, pid)?;
    let Query(params) = params?;
    let level = match params.level.as_deref() {
        None => LogLevel::Error,
        Some(text) => LogLevel::parse(text).ok_or_else(|| ApiError::InvalidParameter {
            name: "level",
            value: text.to_string(),
            reason: "Trace, Debug, Information, Warning, Error or Critical".into(),
        })?,
    };
    let limit = params.limit.unwrap_or(50).min(MAX_SIGNALS);
    let signals = &process.signals;
    let exceptions: Vec<_> = signals
        .exceptions()
        .iter()
        .rev()
        .take(limit)
        .map(|e| exception_json(e))
        .collect();
    let logs: Vec<_> = signals
        .logs_since(i64::MIN)
        .iter()
        .rev()
        .filter(|r| r.message.level >= level)
        .take(limit)
        .map(|r| record_json(r))
        .collect();
    Ok(Json(serde_json::json!({
        "logs_collected": signals.collected_logs().map(|s| s.log_level.name()),
        "exceptions": exceptions,
        "logs": logs,
    })))
}

async fn list(State(state): State<ApiState>) -> Json<Vec<AttachedProcessStatus>> {
    Json(state.processes.list())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BoostParams {
    duration: Option<String>,
}

#[derive(Debug, Serialize)]
struct BoostAnswer {
    pid: u64,
    sampler: SamplerStatus,
}

fn attached(
    state: &ApiState,
    pid: Result<Path<u64>, PathRejection>,
) -> Result<AttachedProcess, ApiError> {
    let Path(pid) = pid?;
    state
        .processes
        .by_pid(pid)
        .ok_or(ApiError::ProcessNotFound { pid })
}

async fn boost(
    State(state): State<ApiState>,
    pid: Result<Path<u64>, PathRejection>,
    params: Result<Query<BoostParams>, QueryRejection>,
) -> Result<Json<BoostAnswer>, ApiError> {
    let process = attached(&state, pid)?;
    let Query(params) = params?;
    let duration = match params.duration {
        None => DEFAULT_BOOST,
        Some(text) => {
            let invalid = |reason: String| ApiError::InvalidParameter {
                name: "duration",
                value: text.clone(),
                reason,
            };
            let duration = parse_duration(&text).map_err(invalid)?;
            if duration.is_zero() || duration > MAX_BOOST {
                return Err(invalid(format!(
                    "a boost lasts more than 0 s and at most {} s",
                    MAX_BOOST.as_secs()
                )));
            }
            duration
        }
    };
    process.sampler.boost(duration);
    tracing::info!(
        pid = process.pid,
        seconds = duration.as_secs_f64(),
        "sampler boosted"
    );
    Ok(Json(BoostAnswer {
        pid: process.pid,
        sampler: process.sampler.status(),
    }))
}

async fn cancel_boost(
    State(state): State<ApiState>,
    pid: Result<Path<u64>, PathRejection>,
) -> Result<Json<BoostAnswer>, ApiError> {
    let process = attached(&state, pid)?;
    process.sampler.cancel_boost();
    Ok(Json(BoostAnswer {
        pid: process.pid,
        sampler: process.sampler.status(),
    }))
}
