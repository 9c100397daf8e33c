//! `GET /debug/pprof/profile?seconds=N`: the agent's own CPU profile, as Go's net/http/pprof
//! serves it, so that `go tool pprof http://…/debug/pprof/profile` (with the API's token)
//! profiles clrscope like anything else.
//!
//! Sampled by the `pprof` crate (`SIGPROF` at [`FREQUENCY`] Hz, every thread), written as gzip
//! pprof by [`exporter::pprof`] with sample types `samples/count` and `cpu/nanoseconds`, one
//! label `thread` per sample. One profile runs at a time (the signal timer is per process);
//! another request meanwhile gets 429.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::rejection::QueryRejection;
use axum::extract::Query;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use profile::{Function, LabelValue, Profile, ProfileBuilder, ValueType};
use serde::Deserialize;

use crate::error::ApiError;
use crate::server::ApiState;

/// Samples per second: a prime, as Go's profiler and pprof-rs's examples use, so that sampling
/// does not lock step with periodic work.
pub const FREQUENCY: i32 = 99;

/// Go's default profile length.
const DEFAULT_SECONDS: u64 = 30;

/// The longest profile a request may ask for.
const MAX_SECONDS: u64 = 300;

/// Whether a profile is running (only one can: the sampling signal is process-wide).
static PROFILING: AtomicBool = AtomicBool::new(false);

pub fn self_profile_routes() -> Router<ApiState> {
    Router::new().route("/debug/pprof/profile", get(profile))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    seconds: Option<u64>,
}

async fn profile(params: Result<Query<Params>, QueryRejection>) -> Result<Response, ApiError> {
    let Query(params) = params?;
    let seconds = params.seconds.unwrap_or(DEFAULT_SECONDS);
    if !(1..=MAX_SECONDS).contains(&seconds) {
        return Err(ApiError::InvalidParameter {
            name: "seconds",
            value: seconds.to_string(),
            reason: format!("profile for 1 to {MAX_SECONDS} seconds"),
        });
    }
    if PROFILING.swap(true, Ordering::AcqRel) {
        return Err(ApiError::Busy(
            "the agent is already profiling itself for another request; try again when it ends"
                .into(),
        ));
    }
    // The sampler's guard stays on one thread for the whole profile: a blocking one.
    let task = tokio::task::spawn_blocking(move || {
        let result = sample(Duration::from_secs(seconds));
        PROFILING.store(false, Ordering::Release);
        result
    });
    let profile = task
        .await
        .map_err(|e| ApiError::Internal(format!("the self-profile task failed: {e}")))??;
    let mut body = Vec::new();
    exporter::pprof::write_pprof(&profile, &mut body)?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"clrscope-cpu.pb.gz\"",
            ),
        ],
        body,
    )
        .into_response())
}

/// Samples every thread of the agent for `duration`.
fn sample(duration: Duration) -> Result<Profile, ApiError> {
    let failed = |e: pprof::Error| ApiError::Internal(format!("self-profiling failed: {e}"));
    let start = SystemTime::now();
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(FREQUENCY)
        // Unwinding through these from a signal handler can deadlock (pprof-rs's advice).
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
        .map_err(failed)?;
    std::thread::sleep(duration);
    let report = guard.report().build().map_err(failed)?;
    drop(guard);

    let period = 1_000_000_000 / i64::from(FREQUENCY);
    let mut builder = ProfileBuilder::new(
        vec![
            ValueType::new("samples", "count"),
            ValueType::new("cpu", "nanoseconds"),
        ],
        ValueType::new("cpu", "nanoseconds"),
        period,
    );
    builder.set_default_sample_type(1);
    let start_unix_nanos = start
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    builder.set_time_range(
        start_unix_nanos,
        i64::try_from(duration.as_nanos()).unwrap_or(i64::MAX),
    );
    for (frames, count) in &report.data {
        // Innermost frame first; within a frame, the inlined function first.
        let stack = frames
            .frames
            .iter()
            .flatten()
            .map(|symbol| {
                builder.function(Function {
                    name: symbol.name(),
                    module: String::new(),
                })
            })
            .collect();
        let count = i64::try_from(*count).unwrap_or(0);
        builder.add(
            stack,
            vec![(
                "thread".to_string(),
                LabelValue::Str(frames.thread_name.clone()),
            )],
            &[count, count * period],
        );
    }
    Ok(builder.build())
}
