//! The .NET processes reachable from here, with what their runtimes say about themselves.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::client::DiagnosticsClient;
use crate::discovery::{self, DiagnosticSocket, DiscoveryError};
use crate::listen::ListenServer;
use ipc::ProcessInfo;

/// One row of `clrscope ps`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessSummary {
    /// The pid as seen from here (for listen-mode runtimes, the pid they advertised).
    pub pid: u64,
    /// The entry assembly's name, else the kernel's process name.
    pub name: String,
    pub command_line: Option<String>,
    /// The entry assembly's name as the runtime reports it (ProcessInfo2+).
    pub entry_assembly: Option<String>,
    /// The runtime's product version, e.g. `8.0.4+2d7eea25…`.
    pub runtime_version: Option<String>,
    pub os: Option<String>,
    pub arch: Option<String>,
    pub runtime_identifier: Option<String>,
    pub runtime_cookie: Option<String>,
    /// The pid the runtime reports for itself (inside its own pid namespace).
    #[serde(skip)]
    pub runtime_pid: Option<u64>,
    /// `connect` (we dial the runtime's socket) or `listen` (the runtime dialled ours).
    pub transport: &'static str,
    pub socket: PathBuf,
    /// Why the runtime could not be asked, when it could not.
    pub error: Option<String>,
}

impl ProcessSummary {
    fn new(pid: u64, name: String, transport: &'static str, socket: PathBuf) -> Self {
        ProcessSummary {
            pid,
            name,
            command_line: None,
            entry_assembly: None,
            runtime_version: None,
            os: None,
            arch: None,
            runtime_identifier: None,
            runtime_cookie: None,
            runtime_pid: None,
            transport,
            socket,
            error: None,
        }
    }

    fn fill(&mut self, info: ProcessInfo) {
        if let Some(entry) = info
            .managed_entrypoint_assembly_name
            .filter(|n| !n.is_empty())
        {
            self.name = entry.clone();
            self.entry_assembly = Some(entry);
        }
        self.command_line = Some(info.command_line);
        self.runtime_version = info.clr_product_version;
        self.os = Some(info.os);
        self.arch = Some(info.arch);
        self.runtime_identifier = info.runtime_identifier;
        self.runtime_cookie = Some(info.runtime_cookie.to_string());
        self.runtime_pid = Some(info.pid);
    }
}

/// A process [`reachable`] found: what its runtime says, and a client to send it commands.
#[derive(Debug, Clone)]
pub struct ReachableProcess {
    pub summary: ProcessSummary,
    pub client: DiagnosticsClient,
}

/// Lists every process with a default diagnostic socket, asking each runtime for its facts.
pub async fn list_connect(timeout: Duration) -> Result<Vec<ProcessSummary>, DiscoveryError> {
    Ok(reachable_connect(timeout)
        .await?
        .into_iter()
        .map(|p| p.summary)
        .collect())
}

/// One process by pid; discovery problems come back as an error.
pub async fn describe_pid(pid: u32, timeout: Duration) -> Result<ProcessSummary, DiscoveryError> {
    Ok(describe_socket(discovery::find_socket(pid)?, timeout)
        .await
        .summary)
}

/// The runtimes that dialled `server`, each asked for its facts.
pub async fn list_listen(server: &ListenServer, timeout: Duration) -> Vec<ProcessSummary> {
    reachable_listen(server, timeout)
        .await
        .into_iter()
        .map(|p| p.summary)
        .collect()
}

/// The processes with a default diagnostic socket (`connect`) and those that dialled `listen`,
/// each asked for its facts (a runtime that did not answer has [`ProcessSummary::error`] set).
pub async fn reachable(
    connect: bool,
    listen: Option<&ListenServer>,
    timeout: Duration,
) -> Result<Vec<ReachableProcess>, DiscoveryError> {
    let mut all = if connect {
        reachable_connect(timeout).await?
    } else {
        Vec::new()
    };
    if let Some(server) = listen {
        all.extend(reachable_listen(server, timeout).await);
    }
    Ok(all)
}

async fn reachable_connect(timeout: Duration) -> Result<Vec<ReachableProcess>, DiscoveryError> {
    let sockets = discovery::scan(Path::new("/proc"))?;
    let queries = sockets
        .into_iter()
        .map(|socket| describe_socket(socket, timeout));
    Ok(spawn_all(queries).await)
}

async fn reachable_listen(server: &ListenServer, timeout: Duration) -> Vec<ReachableProcess> {
    let queries = server.runtimes().into_iter().map(|info| {
        let client = server.client(info).with_timeout(timeout);
        let mut summary = ProcessSummary::new(
            info.pid,
            String::new(),
            "listen",
            server.path().to_path_buf(),
        );
        async move {
            match client.process_info().await {
                Ok(process) => summary.fill(process),
                Err(e) => summary.error = Some(e.to_string()),
            }
            ReachableProcess { summary, client }
        }
    });
    spawn_all(queries).await
}

async fn describe_socket(socket: DiagnosticSocket, timeout: Duration) -> ReachableProcess {
    let comm = Path::new("/proc").join(socket.pid.to_string()).join("comm");
    let name = crate::local::read_proc_file(&comm)
        .map(|comm| String::from_utf8_lossy(&comm).trim_end().to_string())
        .unwrap_or_default();
    let mut summary =
        ProcessSummary::new(u64::from(socket.pid), name, "connect", socket.path.clone());
    let client = DiagnosticsClient::for_socket(&socket.path).with_timeout(timeout);
    if socket.path_too_long() {
        summary.error = Some(format!(
            "socket path is longer than a Unix socket address allows ({} bytes)",
            socket.path.as_os_str().len()
        ));
        return ReachableProcess { summary, client };
    }
    match client.process_info().await {
        Ok(info) if info.pid != u64::from(socket.namespace_pid) => {
            summary.error = Some(format!(
                "the socket belongs to pid {} (its namespace pid), not {}: a stale socket",
                info.pid, socket.namespace_pid
            ));
        }
        Ok(info) => summary.fill(info),
        Err(e) => summary.error = Some(e.to_string()),
    }
    ReachableProcess { summary, client }
}

/// Runs the futures concurrently and returns their outputs in order.
async fn spawn_all<F>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut outputs = Vec::with_capacity(handles.len());
    for handle in handles {
        match handle.await {
            Ok(output) => outputs.push(output),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    outputs
}
