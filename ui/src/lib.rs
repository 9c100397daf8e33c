//! The agent's HTTP surface: dotnet-monitor-compatible API, profile queries, metrics and the web UI.
//!
//! So far: the profile query API over the agent's [`store::tsdb::Store`] ([`query_routes`]),
//! the attached processes with their samplers ([`processes`]), their attach/detach events
//! ([`event_routes`]), dotnet-monitor's API ([`monitor`]: `/processes`, `/trace`, `/dump`, …,
//! `/operations`), the artifacts those routes and the collection rules collect ([`artifacts`]),
//! and the web UI at `/` ([`web_routes`], files embedded from `ui/web/`).
//! The agent owns the store behind an `Arc<RwLock<Store>>` (its writer appends, queries read)
//! and serves it with
//!
//! ```no_run
//! # async fn agent(store: std::sync::Arc<std::sync::RwLock<store::tsdb::Store>>) -> std::io::Result<()> {
//! let listener = tokio::net::TcpListener::bind(ui::DEFAULT_API_ADDR).await?;
//! let router = ui::router(ui::ApiState::new(store));
//! let options = ui::ServeOptions::default();
//! ui::serve(listener, router, options, async { tokio::signal::ctrl_c().await.ok(); }).await
//! # }
//! ```
//!
//! Queries run on the blocking thread pool under the store's read lock, admitted per route class
//! with bounded running and waiting queries ([`admission`]: 503 with `Retry-After` past them),
//! and stop when their client goes away; the async runtime never waits on the store.
//!
//! # Routes
//!
//! All `GET` (but the boost routes of [`processes`] and the Connect methods of the querier); `ui/API.md` has examples. Errors are
//! RFC 7807 `application/problem+json` (`{type, title, status, detail}`), unknown routes (404)
//! and methods (405) included.
//!
//! | route | parameters | answer |
//! |---|---|---|
//! | `/api/v1/profile-types` | — | `[{"name":"cpu","unit":"nanoseconds"}, …]`, the types stored |
//! | `/api/v1/labels` | — | series label names, sorted |
//! | `/api/v1/labels/{name}/values` | — | that label's values in the whole store, sorted |
//! | `/api/v1/series` | `type`, `query`, `from`, `until`, `step`, `span_id`, `trace_id` | `{"unit", "step_ms", "points": [[unix_ms, total], …]}` |
//! | `/api/v1/profile` | `type`, `query`, `from`, `until`, `format`, `span_id`, `trace_id` | the merged profile |
//! | `/api/v1/diff` | `type`, `query`, `base_from`, `base_until`, `from`, `until`, `format`, `span_id`, `trace_id` | the base range against the new one |
//! | `/api/v1/events` | `query`, `from`, `until` | `[{"unix_ms", "kind": "attached"\|"detached", "pid", …}]` |
//! | `/api/v1/incidents…` | see [`incidents`] | incidents, marks (`POST`), their diffs and bundles |
//! | `/collectionrules`, `/collectionrules/{name}` | `pid`, `uid`, `name` | dotnet-monitor's rule states ([`collection_rule_routes`]) |
//! | `/`, `/ui/{file}` | — | the web UI |
//! | `POST /querier.v1.QuerierService/{method}` | a Connect request | Pyroscope's query API for Grafana ([`querier_routes`]) |
//!
//! - `type` (required): a profile type, e.g. `cpu`; one the store holds or one clrscope records
//!   (an unknown name is refused with the list).
//! - `query`: series selector, `{service_name="api",process_id="42"}`; default: every series.
//! - `from`, `until`: `now`, `now-5m`, Unix milliseconds or RFC 3339; `from` inclusive, `until`
//!   exclusive. Default `until` is now; default `from` is 1 h before `until` for `/series`, 1 min
//!   for `/profile` and `/diff`. `base_until` defaults to `from` and `base_from` to the same length
//!   before it, so a bare `/diff` compares the last minute with the one before.
//! - `step`: `10s`, `1m`, … (whole milliseconds); default 10 s, longer when the range would
//!   give more than 1000 points. More than [`store::tsdb::MAX_SERIES_POINTS`] points is refused.
//! - `span_id`, `trace_id`: keep only samples carrying that sample label.
//! - `format`: `/profile` takes `json` (default: the flame-graph tree of [`exporter::tree`]),
//!   `pprof` (gzip, `application/octet-stream`, downloaded as `TYPE.pb.gz`), `folded`
//!   (`text/plain`), `svg` (`image/svg+xml`) and `speedscope` (`application/json`); `/diff` takes
//!   `json` (every node with `base_self`/`base_total` too), `pprof` (sample types `base` and
//!   `new`) and `folded` (`stack base new` lines).
//! - A route refuses parameters it does not take, and any given twice.

pub mod admission;
pub mod artifacts;
pub mod auth;
pub mod bundle;
mod collection_rules;
mod error;
mod events;
pub mod hosts;
pub mod incidents;
pub mod listener;
pub mod metrics;
pub mod monitor;
pub mod processes;
mod querier;
mod query;
mod selfprofile;
mod server;
pub mod time;
pub mod tls;
mod web;

pub use auth::Authentication;
pub use collection_rules::collection_rule_routes;
pub use error::{ApiError, PROBLEM_JSON};
pub use events::event_routes;
pub use hosts::AllowedHosts;
pub use incidents::incident_routes;
pub use listener::{serve, ConnectionLimits, ServeOptions};
pub use metrics::{metrics_router, metrics_routes};
pub use monitor::{monitor_routes, MonitorState, ProcessDirectory};
pub use processes::process_routes;
pub use querier::querier_routes;
pub use query::query_routes;
pub use server::{router, ApiState, DEFAULT_API_ADDR};
pub use web::web_routes;
