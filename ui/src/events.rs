//! `GET /api/v1/events`: what happened to the profiled processes, for markers on a timeline.
//!
//! So far the processes attaching and detaching ([`collector::attached::ProcessEvent`]), as the
//! agent recorded them since it started. The answer is a list of objects with `unix_ms` and
//! `kind`, so that later kinds (collection rules firing) add objects of their own shape to the
//! same list and a viewer draws every kind it knows.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use collector::attached::ProcessEvent;
use store::tsdb::parse_selector;

use crate::error::ApiError;
use crate::query::{Params, QueryPairs, SERIES_SPAN};
use crate::server::ApiState;
use profile::clock::unix_nanos;

const MILLISECOND: i64 = 1_000_000;

pub fn event_routes() -> Router<ApiState> {
    Router::new().route("/api/v1/events", get(events))
}

/// The events in `[from, until)` (default: the last hour) of the processes `query` selects.
/// Events carry the `service_name` and `process_id` labels; a matcher on any other label does
/// not filter them (a process is on the agent's host, and thread labels belong to samples).
async fn events(
    State(state): State<ApiState>,
    params: QueryPairs,
) -> Result<Json<Vec<ProcessEvent>>, ApiError> {
    let params = Params::new(params, &["query", "from", "until"])?;
    let matchers = parse_selector(params.get("query").unwrap_or_default())?;
    let now = unix_nanos();
    let (from, until) = params.range(["from", "until"], now, SERIES_SPAN, now)?;
    let keep = |event: &ProcessEvent| {
        matchers.iter().all(|(name, value)| match name.as_str() {
            "service_name" => event.service_name == *value,
            "process_id" => event.pid.to_string() == *value,
            _ => true,
        })
    };
    Ok(Json(state.processes.events(
        ceil_ms(from),
        ceil_ms(until),
        keep,
    )))
}

/// The first whole millisecond at or after `unix_nanos`: an event at millisecond `m` is at
/// or after `t` nanoseconds exactly when `m >= ceil_ms(t)`.
fn ceil_ms(unix_nanos: i64) -> i64 {
    unix_nanos.div_euclid(MILLISECOND) + i64::from(unix_nanos.rem_euclid(MILLISECOND) != 0)
}
