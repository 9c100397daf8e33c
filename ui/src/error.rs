//! Why a request failed, answered as an RFC 7807 `application/problem+json` body.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use exporter::ExportError;
use serde::Serialize;
use store::tsdb::StoreError;

/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Why a request failed; each variant's message says what to change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    #[error("missing query parameter `{name}`: {hint}")]
    MissingParameter {
        name: &'static str,
        hint: &'static str,
    },

    #[error("invalid query parameter {name}={value:?}: {reason}")]
    InvalidParameter {
        name: &'static str,
        value: String,
        reason: String,
    },

    /// The query string or path did not fit the route (an unknown parameter, bad encoding).
    #[error("{0}")]
    BadRequest(String),

    #[error("unknown profile type {name:?}: {known}")]
    UnknownProfileType { name: String, known: String },

    #[error("unsupported format {format:?}: this route answers in {formats}")]
    UnknownFormat {
        format: String,
        formats: &'static str,
    },

    #[error(
        "empty time range: {from_name}={from} is not before {until_name}={until}; \
         give {from_name} earlier than {until_name}"
    )]
    EmptyRange {
        from_name: &'static str,
        from: String,
        until_name: &'static str,
        until: String,
    },

    #[error(transparent)]
    Store(#[from] StoreError),

    #[error(transparent)]
    Export(#[from] ExportError),

    #[error(
        "no route for {method} {path}; profile queries are under /api/v1/: profile-types, \
         labels, labels/{{name}}/values, series, profile, diff; attached processes under \
         /api/v1/processes, their events under /api/v1/events; dotnet-monitor's routes are \
         /processes, /process, /env, /info, /trace, /gcdump, /dump, /stacks, /operations, \
         /collectionrules; Pyroscope's querier for Grafana under /querier.v1.QuerierService/; \
         the web UI is at /"
    )]
    NotFound { method: String, path: String },

    #[error(
        "no route for {path}: this listener serves only GET /metrics; the API and the web UI \
         are on the agent's --urls"
    )]
    OnlyMetrics { path: String },

    #[error("no attached process has pid {pid}; GET /api/v1/processes lists them")]
    ProcessNotFound { pid: u64 },

    /// No process, or more than one, matches what the request names (dotnet-monitor's messages).
    #[error("{0}")]
    ProcessSelection(String),

    #[error(
        "Rate limit reached: at most {limit} {kind} operation(s) run at once; wait for the \
         running one to end (GET /operations) or cancel it (DELETE /operations/{{id}})"
    )]
    TooManyRequests { kind: &'static str, limit: usize },

    #[error("Operation not found: no operation {id} (finished operations are kept for an hour)")]
    OperationNotFound { id: String },

    #[error("no incident {id}: GET /api/v1/incidents lists those kept (the store's retention removes old ones)")]
    IncidentNotFound { id: u64 },

    #[error("Operation is not running: {id} is {state:?}")]
    OperationNotRunning {
        id: String,
        state: crate::monitor::OperationState,
    },

    /// The runtime refused or failed a diagnostics command.
    #[error("{0}")]
    Diagnostics(String),

    #[error(transparent)]
    Egress(#[from] exporter::egress::EgressError),

    #[error("{method} is not allowed on {path}: ui/API.md lists the methods each route answers")]
    MethodNotAllowed { method: String, path: String },

    /// No valid token: see [`crate::auth`].
    #[error("{0}")]
    Unauthorized(#[from] crate::auth::Refusal),

    /// The `Host` is not the listener's: see [`crate::hosts`].
    #[error(
        "Host {host:?} is not a name this agent answers to (a guard against DNS rebinding): \
         call it as {allowed}, or add the name to AllowedHosts (--allowed-hosts)"
    )]
    ForeignHost { host: String, allowed: String },

    /// A browser request from another site: see [`crate::hosts`].
    #[error(
        "a request from another web site ({reason}) may not call this route: the agent answers \
         such requests only from its own web UI, or from clients that are not browsers"
    )]
    CrossSite { reason: String },

    /// A one-at-a-time operation is already running.
    #[error("{0}")]
    Busy(String),

    /// A route class's queries run and wait as many as allowed: see [`crate::admission`].
    #[error(
        "too many {class} queries at once: {max_running} run and {max_queued} wait at most \
         (Queries:MaxRunning, Queries:MaxQueued); retry after {retry_after} s"
    )]
    Overloaded {
        class: &'static str,
        max_running: usize,
        max_queued: usize,
        retry_after: u64,
    },

    /// The store cannot be read: its writer panicked or the agent is shutting down.
    #[error("the profile store is unavailable: {0}")]
    Unavailable(String),

    /// A bug: a query failed in a way no request can cause.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// The HTTP status answering the problem.
    pub(crate) fn status(&self) -> StatusCode {
        self.kind().0
    }

    /// Seconds a client should wait before trying again (`Retry-After`), when waiting helps.
    pub(crate) fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::Overloaded { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// The HTTP status and the `type` slug and `title` of the problem.
    fn kind(&self) -> (StatusCode, &'static str, &'static str) {
        use StatusCode as S;
        match self {
            ApiError::MissingParameter { .. } => (
                S::BAD_REQUEST,
                "missing-parameter",
                "Missing query parameter",
            ),
            ApiError::InvalidParameter { .. } => (
                S::BAD_REQUEST,
                "invalid-parameter",
                "Invalid query parameter",
            ),
            ApiError::BadRequest(_) => (S::BAD_REQUEST, "bad-request", "Bad request"),
            ApiError::UnknownProfileType { .. } => (
                S::BAD_REQUEST,
                "unknown-profile-type",
                "Unknown profile type",
            ),
            ApiError::UnknownFormat { .. } => (
                S::BAD_REQUEST,
                "unknown-format",
                "Unsupported output format",
            ),
            ApiError::EmptyRange { .. } => (S::BAD_REQUEST, "empty-range", "Empty time range"),
            ApiError::Store(StoreError::InvalidSelector { .. }) => {
                (S::BAD_REQUEST, "invalid-selector", "Invalid label selector")
            }
            ApiError::Store(StoreError::InvalidQuery(_)) => {
                (S::BAD_REQUEST, "invalid-query", "Invalid query")
            }
            // Only a request that has gone away is cancelled: no one reads this.
            ApiError::Store(StoreError::Cancelled) => {
                (S::SERVICE_UNAVAILABLE, "cancelled", "Query cancelled")
            }
            ApiError::Store(_) => (S::INTERNAL_SERVER_ERROR, "store-error", "Store error"),
            ApiError::Export(ExportError::NothingToDraw { .. }) => {
                (S::NOT_FOUND, "no-data", "No samples to draw")
            }
            ApiError::Export(_) => (
                S::INTERNAL_SERVER_ERROR,
                "export-error",
                "Profile could not be written",
            ),
            ApiError::NotFound { .. } | ApiError::OnlyMetrics { .. } => {
                (S::NOT_FOUND, "not-found", "Not found")
            }
            ApiError::ProcessNotFound { .. } => {
                (S::NOT_FOUND, "process-not-found", "Process not attached")
            }
            ApiError::ProcessSelection(_) => (
                S::BAD_REQUEST,
                "process-selection",
                "Target process not found",
            ),
            ApiError::TooManyRequests { .. } => (
                S::TOO_MANY_REQUESTS,
                "too-many-requests",
                "Too many requests",
            ),
            ApiError::OperationNotFound { .. } => {
                (S::BAD_REQUEST, "operation-not-found", "Operation not found")
            }
            ApiError::IncidentNotFound { .. } => {
                (S::NOT_FOUND, "incident-not-found", "Incident not found")
            }
            ApiError::OperationNotRunning { .. } => (
                S::BAD_REQUEST,
                "operation-not-running",
                "Operation not running",
            ),
            ApiError::Diagnostics(_) => (
                S::BAD_REQUEST,
                "diagnostics-error",
                "Diagnostics command failed",
            ),
            ApiError::Egress(_) => (S::BAD_REQUEST, "egress-error", "Egress failed"),
            ApiError::MethodNotAllowed { .. } => (
                S::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
            ),
            ApiError::Busy(_) => (S::TOO_MANY_REQUESTS, "busy", "Too many requests"),
            ApiError::Unauthorized(refusal) if refusal.is_forbidden() => {
                (S::FORBIDDEN, "forbidden", "Forbidden")
            }
            ApiError::Unauthorized(_) => (S::UNAUTHORIZED, "unauthorized", "Unauthorized"),
            ApiError::ForeignHost { .. } => (S::BAD_REQUEST, "foreign-host", "Host not allowed"),
            ApiError::CrossSite { .. } => (
                S::FORBIDDEN,
                "cross-site-request",
                "Cross-site request refused",
            ),
            ApiError::Internal(_) => (S::INTERNAL_SERVER_ERROR, "internal-error", "Internal error"),
            ApiError::Overloaded { .. } => {
                (S::SERVICE_UNAVAILABLE, "overloaded", "Too many queries")
            }
            ApiError::Unavailable(_) => (
                S::SERVICE_UNAVAILABLE,
                "unavailable",
                "Profile store unavailable",
            ),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::BadRequest(rejection.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::BadRequest(rejection.body_text())
    }
}

/// An RFC 7807 problem details object.
#[derive(Debug, Serialize)]
struct Problem {
    r#type: String,
    title: &'static str,
    status: u16,
    detail: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, slug, title) = self.kind();
        let detail = self.to_string();
        let retry_after = self.retry_after();
        if let ApiError::Overloaded { .. } = self {
            // Expected under load, and counted (clrscope_api_queries_rejected_total).
            tracing::debug!(status = status.as_u16(), "{detail}");
        } else if status.is_server_error() {
            tracing::error!(status = status.as_u16(), "{detail}");
        } else {
            tracing::debug!(status = status.as_u16(), "{detail}");
        }
        let problem = Problem {
            r#type: format!("urn:clrscope:problem:{slug}"),
            title,
            status: status.as_u16(),
            detail,
        };
        // A struct of strings and a number always serializes.
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        let mut response = (status, [(header::CONTENT_TYPE, PROBLEM_JSON)], body).into_response();
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, seconds.into());
        }
        response
    }
}
