//! dotnet-monitor's HTTP API: the same routes, query parameters, JSON shapes, file names and
//! status codes, so its clients and scripts work against clrscope.
//!
//! | route | parameters | answer |
//! |---|---|---|
//! | `GET /processes` | — | `[{pid, uid, name, isDefault}]` |
//! | `GET /process` | `pid`, `uid`, `name` | `{pid, uid, name, commandLine, operatingSystem, processArchitecture, managedEntryPointAssemblyName}` |
//! | `GET /env` | `pid`, `uid`, `name` | the environment, `{"NAME": "value", …}` |
//! | `GET /info` | — | `{version, runtimeVersion, diagnosticPortMode, diagnosticPortName, capabilities}` |
//! | `GET /trace` | process, `profile` (`Cpu,Http,Logs,Metrics,GcCollect`; default all but Logs), `durationSeconds` (30; -1 until stopped), `egressProvider`, `tags` | `<ts>_<pid>.nettrace` |
//! | `POST /trace` | as GET without `profile`; body `{providers: [{name, keywords, eventLevel, arguments}], requestRundown, bufferSizeInMB}` | `<ts>_<pid>.nettrace` |
//! | `GET /gcdump` | process, `egressProvider`, `tags` | `<ts>_<pid>.gcdump` |
//! | `GET /dump` | process, `type` (`Mini`, `Full`, `Triage`, `WithHeap`; default WithHeap), `egressProvider`, `tags` | `core_<ts>` (an ELF core) |
//! | `GET /stacks` | process, `egressProvider`, `tags`; format by `Accept`: `text/plain` (default), `application/json`, `application/speedscope+json` | `<ts>_<pid>.stacks.txt` / `.json` |
//! | `GET /livemetrics` | process, `durationSeconds` (30; -1 until stopped), `egressProvider`, `tags` | `<ts>_<pid>.metrics.json`, `application/json-seq`: the `Metrics` section's counters |
//! | `POST /livemetrics` | as GET; body `{includeDefaultProviders, providers: [{providerName, counterNames}], meters: [{meterName, instrumentNames}]}` | the same, of those counters |
//! | `GET /operations` | `pid`, `uid`, `name`, `tags` | `[OperationSummary]` |
//! | `GET /operations/{id}` | — | `OperationStatus` (201 once succeeded, as dotnet-monitor) |
//! | `DELETE /operations/{id}` | `stop` | cancels (200); `stop=true` ends a trace early, keeping it (202) |
//!
//! - **Process**: `pid`, `uid` (the runtime instance cookie) and `name` (the program's file
//!   name, e.g. `dotnet`) narrow the processes down, all given ones must match; with none, the
//!   one process there is, else 400 ("Unable to discover a target process." / "Unable to select
//!   a single target process because multiple target processes have been discovered.").
//!   The processes are every runtime the agent can reach — by their own diagnostic sockets
//!   (unless `--no-connect`) and by the listen socket — as dotnet-monitor lists every process
//!   it can reach; the agent's `--pid`/`--name`/`--command-line` filters choose what it
//!   profiles continuously, not what the API may reach. (dotnet-monitor's `DefaultProcess`
//!   filters are not read.)
//! - **Artifacts** stream back (200, `Content-Disposition: attachment; filename=…`) or, with
//!   `egressProvider`, go to that provider (202, `Location: …/operations/{id}`; the operation's
//!   `resourceLocation` says where the artifact is). Either way each is an operation: at most 1
//!   dump, 1 gcdump, 1 stacks and 3 traces (logs, live metrics) run at once, more get 429.
//! - **Errors** are `application/problem+json` with dotnet-monitor's codes: 400 for bad input,
//!   unresolved processes, failed diagnostics commands and egress errors; 429 over a limit.

mod artifacts;
mod operations;

pub use operations::{
    concurrency_limit, OperationError, OperationFilter, OperationHandle, OperationProcess,
    OperationState, OperationStatus, Operations, MAX_OPERATIONS, OPERATION_RETENTION,
};

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use collector::client::{DiagnosticsClient, DEFAULT_TIMEOUT};
use collector::listen::ListenServer;
use collector::local::LocalProcess;
use collector::processes::{reachable, ReachableProcess};
use exporter::egress::Egress;
use serde::Serialize;

use crate::error::ApiError;
use crate::server::ApiState;

/// How long each runtime may take to say who it is when processes are listed: a busy runtime on
/// a loaded node was seen to take more than 3 s; one that never answers delays a listing by this.
const PROCESS_INFO_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the API finds runtimes: their own sockets (connect mode) and the agent's listen socket.
#[derive(Clone, Default)]
pub struct ProcessDirectory {
    pub connect: bool,
    pub listen: Option<Arc<ListenServer>>,
}

impl fmt::Debug for ProcessDirectory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessDirectory")
            .field("connect", &self.connect)
            .field(
                "listen",
                &self.listen.as_ref().map(|l| l.path().to_path_buf()),
            )
            .finish()
    }
}

/// What dotnet-monitor's routes need beyond the store.
#[derive(Debug, Clone)]
pub struct MonitorState {
    pub directory: ProcessDirectory,
    pub egress: Egress,
    pub operations: Operations,
    /// Where runtimes write dumps before they are streamed or egressed: a folder the targets and
    /// the agent share (dotnet-monitor's `Storage:DumpTempFolder`).
    pub dump_temp_dir: PathBuf,
    /// The Metrics trace profile's EventCounter interval (dotnet-monitor's
    /// `GlobalCounter:IntervalSeconds`).
    pub counter_interval_seconds: u32,
    /// What `GET /livemetrics` collects: the agent's `Metrics` section.
    pub live_metrics: collector::counters::CounterSelection,
    /// The API's own URL (`scheme://address:port`, as it listens) for the absolute `Location`
    /// of operations; None (it listens on every interface, so no one address is its own) gives
    /// relative ones. Never the client's `Host`, which a client chooses.
    pub api_url: Option<String>,
    /// Limits of the parser that watches a trace's stream.
    pub parser: nettrace::ParserOptions,
    /// What requests about processes the agent does not profile charge what they queue to (a
    /// share of the agent's signal budget); an attached process's requests charge its own.
    pub signals: collector::signals::SignalShare,
}

impl Default for MonitorState {
    fn default() -> Self {
        MonitorState {
            directory: ProcessDirectory::default(),
            egress: Egress::default(),
            operations: Operations::default(),
            dump_temp_dir: std::env::temp_dir(),
            counter_interval_seconds: collector::counters::DEFAULT_INTERVAL_SECONDS,
            live_metrics: collector::artifacts::EventMetricsConfiguration::default()
                .selection(collector::counters::DEFAULT_INTERVAL_SECONDS),
            api_url: None,
            parser: nettrace::ParserOptions::default(),
            signals: collector::signals::SignalShare::unlimited(),
        }
    }
}

/// dotnet-monitor's routes, for [`crate::router`] to merge.
pub fn monitor_routes() -> Router<ApiState> {
    Router::new()
        .route("/processes", get(processes))
        .route("/process", get(process))
        .route("/env", get(environment))
        .route("/info", get(info))
        .route("/operations", get(operations_list))
        .route(
            "/operations/{id}",
            get(operation_status).delete(operation_cancel),
        )
        .merge(artifacts::routes())
}

pub(crate) type QueryPairs = Result<Query<Vec<(String, String)>>, QueryRejection>;

/// Query parameters by name, matched case-insensitively as ASP.NET binds them; unknown and
/// repeated ones are refused.
pub(crate) struct MonitorParams(Vec<(String, String)>);

impl MonitorParams {
    pub(crate) fn new(query: QueryPairs, allowed: &[&str]) -> Result<MonitorParams, ApiError> {
        let Query(pairs) = query?;
        for (i, (name, _)) in pairs.iter().enumerate() {
            if !allowed.iter().any(|a| a.eq_ignore_ascii_case(name)) {
                return Err(ApiError::BadRequest(format!(
                    "unknown query parameter `{name}`: this route takes {}",
                    if allowed.is_empty() {
                        "none".to_string()
                    } else {
                        allowed.join(", ")
                    }
                )));
            }
            if pairs[..i].iter().any(|(n, _)| n.eq_ignore_ascii_case(name)) {
                return Err(ApiError::BadRequest(format!(
                    "query parameter `{name}` is given more than once"
                )));
            }
        }
        Ok(MonitorParams(pairs))
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }

    pub(crate) fn process_key(&self) -> Result<ProcessKey, ApiError> {
        let pid = match self.get("pid") {
            None => None,
            Some(text) => Some(
                text.trim()
                    .parse()
                    .map_err(|_| ApiError::InvalidParameter {
                        name: "pid",
                        value: text.to_string(),
                        reason: "a process id is a whole number".into(),
                    })?,
            ),
        };
        Ok(ProcessKey {
            pid,
            uid: self
                .get("uid")
                .map(|u| u.trim().trim_matches(['{', '}']).to_ascii_lowercase()),
            name: self.get("name").map(str::to_string),
        })
    }

    /// `tags`: comma-separated, empty entries dropped.
    pub(crate) fn tags(&self) -> BTreeSet<String> {
        self.get("tags")
            .map(|t| {
                t.split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Which process a request names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ProcessKey {
    pid: Option<u64>,
    /// Lower case, without braces.
    uid: Option<String>,
    name: Option<String>,
}

/// A runtime the API can reach.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub pid: u64,
    pub uid: String,
    /// The program's file name (argv[0]), as dotnet-monitor names processes.
    pub name: String,
    pub command_line: String,
    pub operating_system: String,
    pub architecture: String,
    pub entry_assembly: Option<String>,
    /// The runtime's process on this machine, when proven (`/proc` is read only then).
    pub local: Option<LocalProcess>,
    pub client: DiagnosticsClient,
}

impl Target {
    /// `None` for a runtime that did not answer ProcessInfo.
    fn from_reachable(process: ReachableProcess) -> Option<Target> {
        let s = process.summary;
        if s.error.is_some() {
            return None;
        }
        let command_line = s.command_line.unwrap_or_default();
        let argv0 = command_line.split(' ').next().unwrap_or_default();
        Some(Target {
            pid: s.pid,
            uid: s.runtime_cookie.unwrap_or_default().to_ascii_lowercase(),
            name: argv0.rsplit('/').next().unwrap_or(argv0).to_string(),
            operating_system: s.os.unwrap_or_else(|| "unknown".into()),
            architecture: s.arch.unwrap_or_else(|| "unknown".into()),
            entry_assembly: s.entry_assembly,
            local: s
                .runtime_pid
                .and_then(|runtime_pid| LocalProcess::find(runtime_pid, s.pid, &command_line)),
            command_line,
            // Listing asks each runtime for a quick answer; what runs on a target afterwards
            // (a heap snapshot's StopTracing on a loaded node takes seconds) gets the usual wait.
            client: process.client.with_timeout(DEFAULT_TIMEOUT),
        })
    }

    fn matches(&self, key: &ProcessKey) -> bool {
        key.pid.is_none_or(|pid| pid == self.pid)
            && key.uid.as_deref().is_none_or(|uid| uid == self.uid)
            && key
                .name
                .as_deref()
                .is_none_or(|name| name.eq_ignore_ascii_case(&self.name))
    }

    pub(crate) fn operation_process(&self) -> OperationProcess {
        OperationProcess {
            pid: self.pid,
            uid: self.uid.clone(),
            name: self.name.clone(),
        }
    }
}

/// What a listing found: the runtimes that answered, and (pid, why) for those that did not.
#[derive(Default)]
struct Survey {
    answered: Vec<Target>,
    silent: Vec<(u64, String)>,
}

impl ProcessDirectory {
    /// Every runtime that answers.
    pub(crate) async fn targets(&self) -> Result<Vec<Target>, ApiError> {
        Ok(self.survey().await?.answered)
    }

    /// Every runtime found, those that answered as targets.
    async fn survey(&self) -> Result<Survey, ApiError> {
        let all = reachable(self.connect, self.listen.as_deref(), PROCESS_INFO_TIMEOUT)
            .await
            .map_err(|e| ApiError::Diagnostics(format!("listing processes: {e}")))?;
        let mut survey = Survey::default();
        for process in all {
            match &process.summary.error {
                Some(error) => survey.silent.push((process.summary.pid, error.clone())),
                None => survey.answered.extend(Target::from_reachable(process)),
            }
        }
        survey.answered.sort_by_key(|t| t.pid);
        // A runtime found through both its socket and the listen socket is one process.
        survey
            .answered
            .dedup_by(|a, b| a.uid == b.uid && !a.uid.is_empty());
        Ok(survey)
    }

    /// The one process `key` names (with no key: the only process there is).
    pub(crate) async fn resolve(&self, key: &ProcessKey) -> Result<Target, ApiError> {
        let survey = self.survey().await?;
        let mut matching: Vec<Target> = survey
            .answered
            .into_iter()
            .filter(|t| t.matches(key))
            .collect();
        let silent = key
            .pid
            .and_then(|pid| survey.silent.into_iter().find(|(p, _)| *p == pid));
        match (matching.len(), silent) {
            (0, Some((pid, error))) => Err(ApiError::Diagnostics(format!(
                "process {pid} has a diagnostics socket but did not say who it is within {} s \
                 ({error}): its runtime may be busy or shutting down; try again",
                PROCESS_INFO_TIMEOUT.as_secs()
            ))),
            (0, None) => Err(ApiError::ProcessSelection(
                "Unable to discover a target process.".into(),
            )),
            (1, _) => Ok(matching.remove(0)),
            _ => Err(ApiError::ProcessSelection(
                "Unable to select a single target process because multiple target processes \
                 have been discovered."
                    .into(),
            )),
        }
    }
}

/// `ProcessIdentifier`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ProcessIdentifier {
    pid: u64,
    uid: String,
    name: String,
    is_default: bool,
}

async fn processes(
    State(state): State<ApiState>,
    params: QueryPairs,
) -> Result<Json<Vec<ProcessIdentifier>>, ApiError> {
    MonitorParams::new(params, &[])?;
    let targets = state.monitor.directory.targets().await?;
    let only_one = targets.len() == 1;
    Ok(Json(
        targets
            .into_iter()
            .map(|t| ProcessIdentifier {
                pid: t.pid,
                uid: t.uid,
                name: t.name,
                is_default: only_one,
            })
            .collect(),
    ))
}

/// `ProcessInfo`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ProcessInfo {
    pid: u64,
    uid: String,
    name: String,
    command_line: String,
    operating_system: String,
    process_architecture: String,
    managed_entry_point_assembly_name: Option<String>,
}

const PROCESS_PARAMS: [&str; 3] = ["pid", "uid", "name"];

async fn process(
    State(state): State<ApiState>,
    params: QueryPairs,
) -> Result<Json<ProcessInfo>, ApiError> {
    let params = MonitorParams::new(params, &PROCESS_PARAMS)?;
    let t = state
        .monitor
        .directory
        .resolve(&params.process_key()?)
        .await?;
    Ok(Json(ProcessInfo {
        pid: t.pid,
        uid: t.uid,
        name: t.name,
        command_line: t.command_line,
        operating_system: t.operating_system,
        process_architecture: t.architecture,
        managed_entry_point_assembly_name: t.entry_assembly,
    }))
}

async fn environment(
    State(state): State<ApiState>,
    params: QueryPairs,
) -> Result<Json<BTreeMap<String, String>>, ApiError> {
    let params = MonitorParams::new(params, &PROCESS_PARAMS)?;
    let target = state
        .monitor
        .directory
        .resolve(&params.process_key()?)
        .await?;
    let environment =
        target.client.environment().await.map_err(|e| {
            ApiError::Diagnostics(format!("Unable to get process environment: {e}"))
        })?;
    Ok(Json(environment.into_iter().collect()))
}

/// `DotnetMonitorInfo`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Info {
    version: &'static str,
    /// dotnet-monitor's own .NET version; clrscope runs on none.
    runtime_version: Option<String>,
    diagnostic_port_mode: &'static str,
    diagnostic_port_name: Option<String>,
    capabilities: Vec<Capability>,
}

#[derive(Debug, Serialize)]
struct Capability {
    name: &'static str,
    enabled: bool,
}

async fn info(State(state): State<ApiState>, params: QueryPairs) -> Result<Json<Info>, ApiError> {
    MonitorParams::new(params, &[])?;
    let directory = &state.monitor.directory;
    let listen_only = directory.listen.is_some() && !directory.connect;
    Ok(Json(Info {
        version: env!("CARGO_PKG_VERSION"),
        runtime_version: None,
        diagnostic_port_mode: if listen_only { "Listen" } else { "Connect" },
        diagnostic_port_name: directory
            .listen
            .as_ref()
            .map(|l| l.path().display().to_string()),
        capabilities: vec![
            Capability {
                name: "exceptions",
                enabled: false,
            },
            Capability {
                name: "parameters",
                enabled: false,
            },
            Capability {
                name: "call_stacks",
                enabled: true,
            },
            Capability {
                name: "metrics",
                enabled: true,
            },
            Capability {
                name: "http_egress",
                enabled: true,
            },
        ],
    }))
}

async fn operations_list(
    State(state): State<ApiState>,
    params: QueryPairs,
) -> Result<Json<Vec<OperationStatus>>, ApiError> {
    let params = MonitorParams::new(params, &["pid", "uid", "name", "tags"])?;
    let key = params.process_key()?;
    let filter = OperationFilter {
        pid: key.pid,
        uid: key.uid,
        name: key.name,
        tags: params.tags(),
    };
    Ok(Json(state.monitor.operations.list(&filter)))
}

async fn operation_status(
    State(state): State<ApiState>,
    id: Result<Path<String>, PathRejection>,
    params: QueryPairs,
) -> Result<Response, ApiError> {
    MonitorParams::new(params, &[])?;
    let Path(id) = id?;
    let status = state.monitor.operations.status(&id)?;
    let code = if status.status == OperationState::Succeeded {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((code, Json(status)).into_response())
}

async fn operation_cancel(
    State(state): State<ApiState>,
    id: Result<Path<String>, PathRejection>,
    params: QueryPairs,
) -> Result<StatusCode, ApiError> {
    let params = MonitorParams::new(params, &["stop"])?;
    let Path(id) = id?;
    let stop = match params.get("stop") {
        None => false,
        Some(v) if v.eq_ignore_ascii_case("true") => true,
        Some(v) if v.eq_ignore_ascii_case("false") => false,
        Some(v) => {
            return Err(ApiError::InvalidParameter {
                name: "stop",
                value: v.to_string(),
                reason: "true or false".into(),
            })
        }
    };
    if stop {
        state.monitor.operations.stop(&id)?;
        Ok(StatusCode::ACCEPTED)
    } else {
        state.monitor.operations.cancel(&id)?;
        Ok(StatusCode::OK)
    }
}
