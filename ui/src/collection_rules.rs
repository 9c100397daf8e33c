//! dotnet-monitor's collection rule routes, with its JSON shapes:
//!
//! | route | answer |
//! |---|---|
//! | `GET /collectionrules?pid=&uid=&name=` | `{ruleName: {state, stateReason}}` for the process |
//! | `GET /collectionrules/{name}?pid=&uid=&name=` | `{state, stateReason, lifetimeOccurrences, slidingWindowOccurrences, actionCountLimit, actionCountSlidingWindowDurationLimit, slidingWindowDurationCountdown, ruleFinishedCountdown}` |
//!
//! The process is picked by `pid`, `uid` (the runtime instance cookie) or `name` (any that are
//! given must match); with none, the only attached process (dotnet-monitor's default process
//! without `DefaultProcess` filters). A rule not applied to the process is a 400, as there.

use std::collections::BTreeMap;
use std::time::SystemTime;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use collector::attached::AttachedProcess;
use collector::rules::state::{CollectionRuleDescription, CollectionRuleDetailedDescription};

use crate::error::ApiError;
use crate::query::{Params, QueryPairs};
use crate::server::ApiState;

pub fn collection_rule_routes() -> Router<ApiState> {
    Router::new()
        .route("/collectionrules", get(list))
        .route("/collectionrules/{name}", get(detail))
}

/// The process `pid`/`uid`/`name` select, or the only attached one.
fn process(state: &ApiState, params: &Params) -> Result<AttachedProcess, ApiError> {
    let pid = params
        .get("pid")
        .map(|p| {
            p.parse::<u64>().map_err(|_| ApiError::InvalidParameter {
                name: "pid",
                value: p.to_string(),
                reason: "expected a process id".into(),
            })
        })
        .transpose()?;
    let uid = params.get("uid");
    let name = params.get("name");
    let matching: Vec<AttachedProcess> = state
        .processes
        .list()
        .into_iter()
        .map(|p| p.process)
        .filter(|p| {
            pid.is_none_or(|pid| p.pid == pid)
                && uid.is_none_or(|uid| p.runtime_cookie.eq_ignore_ascii_case(uid))
                && name.is_none_or(|name| p.name.eq_ignore_ascii_case(name))
        })
        .collect();
    let chosen = pid.is_some() || uid.is_some() || name.is_some();
    match (matching.len(), chosen) {
        (1, _) => Ok(matching.into_iter().next().expect("one process")),
        (0, true) => Err(ApiError::BadRequest(
            "no attached process matches pid/uid/name; GET /processes lists them".into(),
        )),
        (0, false) => Err(ApiError::BadRequest(
            "Unable to discover a target process.".into(),
        )),
        (_, _) => Err(ApiError::BadRequest(
            "more than one process matches: give pid, uid or name (GET /processes lists them)"
                .into(),
        )),
    }
}

async fn list(
    State(state): State<ApiState>,
    query: QueryPairs,
) -> Result<Json<BTreeMap<String, CollectionRuleDescription>>, ApiError> {
    let params = Params::new(query, &["pid", "uid", "name"])?;
    let process = process(&state, &params)?;
    Ok(Json(process.rules.descriptions(SystemTime::now())))
}

async fn detail(
    State(state): State<ApiState>,
    name: Result<Path<String>, PathRejection>,
    query: QueryPairs,
) -> Result<Json<CollectionRuleDetailedDescription>, ApiError> {
    let Path(rule) = name?;
    let params = Params::new(query, &["pid", "uid", "name"])?;
    let process = process(&state, &params)?;
    process
        .rules
        .detailed(&rule, SystemTime::now())
        .map(Json)
        .ok_or_else(|| {
            ApiError::BadRequest(format!(
                "The collection rule '{rule}' could not be found for the specified process."
            ))
        })
}
