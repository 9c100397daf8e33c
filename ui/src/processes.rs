//! Agent control: the attached processes and their samplers.
//!
//! | route | answer |
//! |---|---|
//! | `GET /api/v1/processes` | every attached process with its sampler state |
//! | `POST /api/v1/processes/{pid}/boost?duration=60s` | samples without pause for `duration` (default 60 s, at most 1 h) |
//! | `DELETE /api/v1/processes/{pid}/boost` | ends a boost early |
//! | `GET /api/v1/processes/{pid}/signals?level=Error&limit=50` | its recent exceptions and log messages at or above `level`, newest first, at most 4 MiB |

use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use collector::attached::{AttachedProcess, AttachedProcessStatus};
use collector::sampler::SamplerStatus;
use collector::signals::exceptions::exception_json;
use collector::signals::logs::record_json;
use collector::signals::{SignalKind, SignalShare};
use profile::budget::Hold;
use profile::log::LogLevel;
use profile::signal::{KeptException, KeptLog};
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
/// Most bytes one `/signals` answer takes, half for each list: the records that would take a
/// list past its half are left out, and the answer ends with `"truncated": true`.
pub const MAX_SIGNALS_ANSWER: usize = 4 << 20;
/// How much of the answer is rendered at a time.
const ANSWER_CHUNK: usize = 64 * 1024;

/// The web UI's panel beside the flame graph: the process's recent exceptions and log messages,
/// newest first, in the JSON of `/exceptions` and `/logs`; rendered as it is sent, at most
/// [`MAX_SIGNALS_ANSWER`] bytes.
async fn signals(
    State(state): State<ApiState>,
    pid: Result<Path<u64>, PathRejection>,
    params: Result<Query<SignalParams>, QueryRejection>,
) -> Result<Response, ApiError> {
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
    let exceptions: Vec<_> = signals.exceptions().into_iter().rev().take(limit).collect();
    let logs: Vec<_> = signals
        .logs_since(i64::MIN)
        .into_iter()
        .rev()
        .filter(|r| r.message.level >= level)
        .take(limit)
        .collect();
    let collected = signals.collected_logs().map(|s| s.log_level.name());
    let mut answer = SignalsAnswer {
        head: format!("{{\"logs_collected\":{}", serde_json::json!(collected)).into_bytes(),
        exceptions: exceptions.into_iter(),
        logs: logs.into_iter(),
        part: Part::Head,
        part_bytes: 0,
        truncated: false,
        share: signals.share().clone(),
    };
    let chunks = std::iter::from_fn(move || answer.next_chunk());
    let body = futures_util::stream::iter(chunks.map(Ok::<_, std::convert::Infallible>));
    let mut response = Response::new(Body::from_stream(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// Where a [`SignalsAnswer`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Head,
    Exceptions,
    Logs,
    Tail,
    Done,
}

/// `{"logs_collected":…,"exceptions":[…],"logs":[…],"truncated":…}`, rendered a chunk at a time
/// from the records taken when it was asked for; the chunk being built is charged to the
/// process's share of the signal budget (an answer it has no room for ends truncated, counted).
struct SignalsAnswer {
    head: Vec<u8>,
    exceptions: std::vec::IntoIter<KeptException>,
    logs: std::vec::IntoIter<KeptLog>,
    part: Part,
    /// Bytes of the current list so far.
    part_bytes: usize,
    truncated: bool,
    share: SignalShare,
}

impl SignalsAnswer {
    /// The next piece of the answer, `None` once it is complete.
    fn next_chunk(&mut self) -> Option<Vec<u8>> {
        if self.part == Part::Done {
            return None;
        }
        let mut chunk = Vec::new();
        let mut held = self.share.budget().hold_nothing();
        while chunk.len() < ANSWER_CHUNK && self.part != Part::Done {
            self.render_next(&mut chunk, &mut held);
        }
        Some(chunk)
    }

    /// Renders the next record, or the punctuation between the lists, into `out`, whose records
    /// `held` holds.
    fn render_next(&mut self, out: &mut Vec<u8>, held: &mut Hold) {
        let item = match self.part {
            Part::Head => {
                out.extend_from_slice(&std::mem::take(&mut self.head));
                out.extend_from_slice(b",\"exceptions\":[");
                self.part = Part::Exceptions;
                return;
            }
            Part::Exceptions => self.exceptions.next().map(|e| exception_json(&e)),
            Part::Logs => self.logs.next().map(|r| record_json(&r)),
            Part::Tail => {
                let tail = format!("],\"truncated\":{}}}", self.truncated);
                out.extend_from_slice(tail.as_bytes());
                self.part = Part::Done;
                return;
            }
            Part::Done => return,
        };
        let Some(item) = item else {
            return self.end_list(out);
        };
        let separator = usize::from(self.part_bytes > 0);
        let room = (MAX_SIGNALS_ANSWER / 2).saturating_sub(self.part_bytes + separator);
        let mut capped = CappedWriter {
            out: Vec::new(),
            room,
        };
        if serde_json::to_writer(&mut capped, &item).is_err() {
            // It would take its list past its half: the list ends here.
            self.truncated = true;
            return self.end_list(out);
        }
        if !held.resize(out.len() + separator + capped.out.len()) {
            // No room for the answer being built: it ends here.
            self.share.count_dropped(SignalKind::Answers, 1);
            self.truncated = true;
            self.end_list(out);
            if self.part == Part::Logs {
                self.end_list(out);
            }
            return;
        }
        if separator == 1 {
            out.push(b',');
        }
        out.extend_from_slice(&capped.out);
        self.part_bytes += separator + capped.out.len();
    }

    fn end_list(&mut self, out: &mut Vec<u8>) {
        self.part_bytes = 0;
        if self.part == Part::Exceptions {
            out.extend_from_slice(b"],\"logs\":[");
            self.part = Part::Logs;
        } else {
            self.part = Part::Tail;
        }
    }
}

/// A writer that refuses to take more than `room` bytes.
struct CappedWriter {
    out: Vec<u8>,
    room: usize,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + buf.len() > self.room {
            return Err(std::io::Error::other("over the answer's cap"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
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
