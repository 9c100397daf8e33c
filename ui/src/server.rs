//! The router and its shared state (the server loop is [`crate::listener`]).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::ops::Deref;
use std::sync::{Arc, RwLock, RwLockReadGuard};

use axum::http::{Method, Uri};
use axum::middleware::from_fn_with_state;
use axum::Router;
use collector::attached::AttachedProcesses;
use store::incidents::Incidents;
use store::tsdb::{QueryControl, Store};
use tower_http::trace::TraceLayer;

use crate::admission::{Admission, CancelOnDrop, QueryLimits, RouteClass};
use crate::auth::{authenticate, Authentication};
use crate::collection_rules::collection_rule_routes;
use crate::error::ApiError;
use crate::events::event_routes;
use crate::incidents::incident_routes;
use crate::metrics::{metrics_routes, Registry};
use crate::monitor::{monitor_routes, MonitorState};
use crate::processes::process_routes;
use crate::querier::querier_routes;
use crate::query::query_routes;
use crate::selfprofile::self_profile_routes;
use crate::web::web_routes;

/// Where the agent serves its API and UI unless told otherwise: loopback only, so nothing is
/// exposed beyond the node until the operator asks for it.
pub const DEFAULT_API_ADDR: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 52323));

/// What every handler can reach. Cloned per request (all fields are shared handles).
#[derive(Debug, Clone)]
pub struct ApiState {
    /// The agent's store: its writer appends under the write lock, queries take the read lock.
    pub store: Arc<RwLock<Store>>,
    /// The processes the agent profiles, for the process routes; empty without an agent.
    pub processes: AttachedProcesses,
    /// dotnet-monitor's routes: where runtimes are found, egress, operations.
    pub monitor: MonitorState,
    /// How many store queries of each route class run and wait at most (a burst of requests
    /// cannot start more store scans, and their memory, than allowed, nor queue without bound).
    pub admission: Admission,
    /// The agent's metrics, for `/metrics`; empty without an agent.
    pub metrics: Registry,
    /// What a request needs to be answered: by default a token, of no key (every request is
    /// refused until a key is configured with [`ApiState::with_auth`]).
    pub auth: Authentication,
    /// The store's incidents (their own lock: listing them never waits for the store's).
    pub incidents: Incidents,
}

impl ApiState {
    /// State over `store`, admitting queries within the default [`QueryLimits`].
    pub fn new(store: Arc<RwLock<Store>>) -> ApiState {
        let metrics = Registry::default();
        let incidents = match store.read() {
            Ok(store) => store.incidents().clone(),
            Err(poisoned) => poisoned.into_inner().incidents().clone(),
        };
        ApiState {
            incidents,
            store,
            processes: AttachedProcesses::default(),
            monitor: MonitorState::default(),
            admission: Admission::new(QueryLimits::default(), &metrics),
            metrics,
            auth: Authentication::Unconfigured(Arc::new(crate::auth::KeyError::MissingSubject)),
        }
    }

    /// The same state, listing and controlling the agent's `processes`.
    pub fn with_processes(self, processes: AttachedProcesses) -> ApiState {
        ApiState { processes, ..self }
    }

    /// The same state, authenticating requests as `auth` says.
    pub fn with_auth(self, auth: Authentication) -> ApiState {
        ApiState { auth, ..self }
    }

    /// The same state, serving the agent's `metrics` (the admission's among them) on
    /// `/metrics`.
    pub fn with_metrics(self, metrics: Registry) -> ApiState {
        ApiState {
            admission: Admission::new(self.admission.limits(), &metrics),
            metrics,
            ..self
        }
    }

    /// The same state, admitting store queries within `limits`.
    pub fn with_query_limits(self, limits: QueryLimits) -> ApiState {
        ApiState {
            admission: Admission::new(limits, &self.metrics),
            ..self
        }
    }

    /// The same state, serving dotnet-monitor's routes with `monitor`.
    pub fn with_monitor(self, monitor: MonitorState) -> ApiState {
        ApiState { monitor, ..self }
    }

    /// Runs `query` on the blocking thread pool with the store's read guard, once `class`
    /// admits it ([`crate::admission`]), so the async runtime never waits on the store. `query`
    /// drops the guard as soon as it has read what it needs, so that writing the answer does
    /// not hold up the store's writer. If the request goes away meanwhile (its client closed
    /// the connection), the store query stops before its next block.
    pub(crate) async fn query<T, F>(&self, class: RouteClass, query: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(StoreReader<'_>) -> Result<T, ApiError> + Send + 'static,
    {
        let running = self.admission.admit(class).await?;
        let control = QueryControl::default();
        let cancel_on_drop = CancelOnDrop::new(&control);
        let store = Arc::clone(&self.store);
        let task = tokio::task::spawn_blocking(move || {
            let answer = match store.read() {
                Ok(store) => query(StoreReader {
                    store,
                    control: control.clone(),
                }),
                Err(_) => Err(ApiError::Unavailable(
                    "its writer panicked while holding it; restart the agent".into(),
                )),
            };
            // The slot is held until the answer is written, even if the client has gone away.
            running.finish(&control);
            answer
        });
        let answer = task
            .await
            .map_err(|e| ApiError::Internal(format!("the query task failed: {e}")))?;
        cancel_on_drop.disarm();
        answer
    }
}

/// The store as a query reads it: under the read lock, with the control that cancels the
/// query when its request goes away (every [`store::tsdb::Query`] made from it carries it).
pub(crate) struct StoreReader<'a> {
    store: RwLockReadGuard<'a, Store>,
    pub(crate) control: QueryControl,
}

impl Deref for StoreReader<'_> {
    type Target = Store;

    fn deref(&self) -> &Store {
        &self.store
    }
}

/// The whole API: [`query_routes`], [`querier_routes`] (Pyroscope's, for Grafana),
/// [`process_routes`], [`event_routes`], [`incident_routes`], dotnet-monitor's routes ([`monitor_routes`]), `/metrics`,
/// `/debug/pprof/profile` and the web UI ([`web_routes`]), with problem+json answers for unknown
/// routes and methods, and request tracing. The auth layer ([`crate::auth`]) wraps everything,
/// the fallbacks included, and lets only the web UI's files (which hold no data) through without
/// a token: a route added here is covered without more.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .merge(query_routes())
        .merge(querier_routes())
        .merge(process_routes())
        .merge(event_routes())
        .merge(incident_routes())
        .merge(metrics_routes())
        .merge(self_profile_routes())
        .merge(collection_rule_routes())
        .merge(monitor_routes())
        .merge(web_routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(from_fn_with_state(state.clone(), authenticate))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
}

pub(crate) async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
}
