//! Diagnostics commands over either transport.
//!
//! Each connection carries exactly one command, so every call opens (connect mode) or takes from
//! the pool (listen mode) a fresh connection, sends the request, and reads the reply. Commands whose
//! reply is followed by a stream (EventPipe sessions) hand the connection to the caller.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::discovery::{self, DiscoveryError};
use crate::listen::{ListenError, RuntimeHandle};
use ipc::{
    self, CollectTracing, CollectTracingVersion, CoreDump, EnvironmentHeader, Header, Hresult,
    PerfMapType, ProcessInfo, ProtocolError, Request, HEADER_LEN,
};

/// How long a command may take to get its reply unless the caller says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a diagnostics command failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    #[error("{}", connect_message(path, source))]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Listen(#[from] ListenError),
    #[error("{command}: connection to the runtime failed: {source}")]
    Io {
        command: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{command}: the runtime closed the connection before replying (did it exit?)")]
    Closed { command: &'static str },
    #[error("{command}: the runtime's reply is malformed: {source}")]
    Protocol {
        command: &'static str,
        #[source]
        source: ProtocolError,
    },
    #[error("{command}: the runtime refused: {hresult}{}", detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Server {
        command: &'static str,
        hresult: Hresult,
        detail: Option<String>,
    },
    #[error(
        "{command}: no reply within {timeout:?} (is the runtime suspended in a debugger or hung?)"
    )]
    Timeout {
        command: &'static str,
        timeout: Duration,
    },
    #[error("{command}: unexpected reply command {set:#04x}/{id:#04x}")]
    UnexpectedReply {
        command: &'static str,
        set: u8,
        id: u8,
    },
}

impl ClientError {
    /// True when the runtime does not know the command (an older runtime than the command needs).
    pub fn is_unknown_command(&self) -> bool {
        matches!(self, ClientError::Server { hresult, .. } if *hresult == Hresult::UNKNOWN_COMMAND)
    }
}

fn connect_message(path: &Path, source: &io::Error) -> String {
    let path = path.display();
    match source.kind() {
        io::ErrorKind::NotFound => {
            format!("diagnostic socket {path} is gone: the process has exited")
        }
        io::ErrorKind::ConnectionRefused => format!(
            "nobody listens on {path}: a stale socket left by a process that exited \
             (safe to delete)"
        ),
        io::ErrorKind::PermissionDenied => {
            format!("permission denied on {path}: run clrscope as the target's user or as root")
        }
        _ => format!("cannot connect to {path}: {source}"),
    }
}

/// Where a runtime is reached.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// The runtime listens on this socket (its default port, or a `listen` port).
    Socket(PathBuf),
    /// The runtime dialled our listen socket; commands use its advertised connections.
    Listen(RuntimeHandle),
}

/// Who a runtime runs as, from its connection's peer credentials: the kernel's word, which the
/// runtime cannot forge (unlike anything it says over the protocol). Files the runtime writes for
/// us must be owned by `uid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeUser {
    pub uid: u32,
}

impl RuntimeUser {
    /// The peer credentials of a connection to (or from) the runtime.
    pub fn of(stream: &UnixStream) -> io::Result<RuntimeUser> {
        let cred = stream.peer_cred()?;
        Ok(RuntimeUser { uid: cred.uid() })
    }
}

/// An EventPipe session started by [`DiagnosticsClient::start_tracing`]: the nettrace stream
/// follows on `stream` until the session is stopped on another connection.
#[derive(Debug)]
pub struct EventPipeSession {
    pub id: u64,
    pub stream: UnixStream,
}

/// Sends diagnostics commands to one runtime. Clones share what the runtime was found not to
/// know ([`DiagnosticsClient::collect_tracing_unknown`]), so a process is asked once.
#[derive(Debug, Clone)]
pub struct DiagnosticsClient {
    endpoint: Endpoint,
    timeout: Duration,
    /// The command id of the lowest CollectTracing version the runtime answered "unknown
    /// command" to; 0 until one did.
    collect_unknown: Arc<AtomicU8>,
}

impl DiagnosticsClient {
    pub fn new(endpoint: Endpoint) -> Self {
        DiagnosticsClient {
            endpoint,
            timeout: DEFAULT_TIMEOUT,
            collect_unknown: Arc::default(),
        }
    }

    /// The runtime's diagnostics socket, when the agent dials it.
    pub fn socket_path(&self) -> Option<&Path> {
        match &self.endpoint {
            Endpoint::Socket(path) => Some(path),
            Endpoint::Listen(_) => None,
        }
    }

    /// Whether the runtime answered "unknown command" to `version` or an older one before: it
    /// does not know `version` either.
    pub fn collect_tracing_unknown(&self, version: CollectTracingVersion) -> bool {
        let lowest = self.collect_unknown.load(Ordering::Relaxed);
        lowest != 0 && version.command_id() >= lowest
    }

    /// Remembers that the runtime answered "unknown command" to `version`; true when that was
    /// not known yet.
    pub fn learn_collect_tracing_unknown(&self, version: CollectTracingVersion) -> bool {
        let id = version.command_id();
        self.collect_unknown
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |lowest| {
                (lowest == 0 || id < lowest).then_some(id)
            })
            .is_ok()
    }

    /// A client for the runtime listening on `path`.
    pub fn for_socket(path: impl Into<PathBuf>) -> Self {
        Self::new(Endpoint::Socket(path.into()))
    }

    /// A client for the runtime of process `pid`, found through its default socket.
    pub fn for_pid(pid: u32) -> Result<Self, ClientError> {
        Ok(Self::for_socket(discovery::find_socket(pid)?.path))
    }

    /// Sets how long each command may wait for its reply.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Process facts, asking with the newest ProcessInfo the runtime knows (3, then 2, then 1).
    pub async fn process_info(&self) -> Result<ProcessInfo, ClientError> {
        type Decode = fn(&[u8]) -> Result<ProcessInfo, ProtocolError>;
        let attempts: [(Request, Decode); 3] = [
            (Request::ProcessInfo3, ProcessInfo::decode_v3),
            (Request::ProcessInfo2, ProcessInfo::decode_v2),
            (Request::ProcessInfo, ProcessInfo::decode_v1),
        ];
        let mut last_error = None;
        for (request, decode) in attempts {
            match self.exchange(&request, self.timeout).await {
                Ok((_, payload)) => {
                    return decode(&payload).map_err(|source| ClientError::Protocol {
                        command: request.name(),
                        source,
                    })
                }
                Err(e) if e.is_unknown_command() => last_error = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last_error.expect("at least one ProcessInfo attempt ran"))
    }

    /// The target's environment variables, `NAME=value` split at the first `=`.
    pub async fn environment(&self) -> Result<Vec<(String, String)>, ClientError> {
        let request = Request::ProcessEnvironment;
        let command = request.name();
        let (mut stream, payload) = self.exchange(&request, self.timeout).await?;
        let header = EnvironmentHeader::decode(&payload)
            .map_err(|source| ClientError::Protocol { command, source })?;
        // The codec has capped the length, so allocating it is safe.
        let mut continuation = vec![0; header.continuation_len as usize];
        read_exact(&mut stream, &mut continuation, command, self.timeout).await?;
        ipc::decode_environment(&continuation)
            .map_err(|source| ClientError::Protocol { command, source })
    }

    /// Lets a runtime that waits for a diagnostics tool at startup go on; harmless otherwise.
    pub async fn resume_runtime(&self) -> Result<(), ClientError> {
        self.status_command(Request::ResumeRuntime, self.timeout)
            .await
    }

    pub async fn set_environment_variable(
        &self,
        name: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<(), ClientError> {
        let request = Request::SetEnvironmentVariable {
            name: name.into(),
            value: value.into(),
        };
        self.status_command(request, self.timeout).await
    }

    pub async fn enable_perf_map(&self, kind: PerfMapType) -> Result<(), ClientError> {
        self.status_command(Request::EnablePerfMap(kind), self.timeout)
            .await
    }

    pub async fn disable_perf_map(&self) -> Result<(), ClientError> {
        self.status_command(Request::DisablePerfMap, self.timeout)
            .await
    }

    /// Starts an EventPipe session; the nettrace stream follows on the returned connection.
    pub async fn start_tracing(
        &self,
        config: CollectTracing,
    ) -> Result<EventPipeSession, ClientError> {
        let request = Request::CollectTracing(config);
        let command = request.name();
        let (stream, payload) = self.exchange(&request, self.timeout).await?;
        let id = ipc::decode_session_id(&payload)
            .map_err(|source| ClientError::Protocol { command, source })?;
        Ok(EventPipeSession { id, stream })
    }

    /// Stops an EventPipe session, waiting up to `timeout` for the reply. The runtime writes the
    /// rundown (if asked) and flushes the stream before it replies, so a session with a rundown
    /// needs longer than other commands, and its stream must be read meanwhile.
    pub async fn stop_tracing(
        &self,
        session_id: u64,
        timeout: Duration,
    ) -> Result<(), ClientError> {
        let request = Request::StopTracing { session_id };
        let command = request.name();
        let (_, payload) = self.exchange(&request, timeout).await?;
        ipc::decode_session_id(&payload)
            .map(drop)
            .map_err(|source| ClientError::Protocol { command, source })
    }

    /// Stops one session and starts another back to back: both requests are written before
    /// either reply is read, the stop's first, so that the runtime's diagnostics server, which
    /// takes connections one at a time in the order they came, enables the new session right
    /// after it disabled the old one, without a round trip to the agent between. (On a runtime
    /// that dialled us, each connection is one it offered, so the start waits for the stop's
    /// turn.) The old session's stream must be read meanwhile: the runtime flushes it before it
    /// answers the stop.
    pub async fn stop_then_start_tracing(
        &self,
        session_id: u64,
        stop_timeout: Duration,
        config: CollectTracing,
    ) -> (
        Result<(), ClientError>,
        Result<EventPipeSession, ClientError>,
    ) {
        let stop = Request::StopTracing { session_id };
        let stop_sent = self.send(&stop).await;
        let start = Request::CollectTracing(config);
        let start_sent = self.send(&start).await;
        let stopped = async {
            let (_, payload) = Self::reply(stop_sent?, stop.name(), stop_timeout).await?;
            ipc::decode_session_id(&payload)
                .map(drop)
                .map_err(|source| ClientError::Protocol {
                    command: stop.name(),
                    source,
                })
        };
        let started = async {
            let (stream, payload) = Self::reply(start_sent?, start.name(), self.timeout).await?;
            let id = ipc::decode_session_id(&payload).map_err(|source| ClientError::Protocol {
                command: start.name(),
                source,
            })?;
            Ok(EventPipeSession { id, stream })
        };
        tokio::join!(stopped, started)
    }

    /// Who the runtime runs as (see [`RuntimeUser`]).
    pub async fn runtime_user(&self) -> Result<RuntimeUser, ClientError> {
        let io = |source| ClientError::Io {
            command: "peer credentials",
            source,
        };
        match &self.endpoint {
            Endpoint::Socket(_) => RuntimeUser::of(&self.open().await?).map_err(io),
            Endpoint::Listen(runtime) => Ok(runtime.user()?),
        }
    }

    /// Asks the runtime to write a core dump (through `createdump`); this can take minutes. A
    /// runtime that does not know the request's version is asked again with the older ones.
    pub async fn write_dump(
        &self,
        mut dump: CoreDump,
        timeout: Duration,
    ) -> Result<(), ClientError> {
        loop {
            match self
                .status_command(Request::GenerateCoreDump(dump.clone()), timeout)
                .await
            {
                Err(e) if e.is_unknown_command() && dump.version > 1 => dump.version -= 1,
                done => return done,
            }
        }
    }

    /// A command whose OK reply carries only an HRESULT.
    async fn status_command(&self, request: Request, timeout: Duration) -> Result<(), ClientError> {
        let command = request.name();
        let (_, payload) = self.exchange(&request, timeout).await?;
        let hresult = ipc::decode_status(&payload)
            .map_err(|source| ClientError::Protocol { command, source })?;
        if hresult.is_success() {
            Ok(())
        } else {
            Err(ClientError::Server {
                command,
                hresult,
                detail: None,
            })
        }
    }

    async fn open(&self) -> Result<UnixStream, ClientError> {
        match &self.endpoint {
            Endpoint::Socket(path) => {
                UnixStream::connect(path)
                    .await
                    .map_err(|source| ClientError::Connect {
                        path: path.clone(),
                        source,
                    })
            }
            Endpoint::Listen(runtime) => Ok(runtime.take_connection(self.timeout).await?),
        }
    }

    /// Sends one request and reads its reply header and payload; server errors become `Err`.
    async fn exchange(
        &self,
        request: &Request,
        timeout: Duration,
    ) -> Result<(UnixStream, Vec<u8>), ClientError> {
        let stream = self.send(request).await?;
        Self::reply(stream, request.name(), timeout).await
    }

    /// Opens a connection and writes one request on it.
    async fn send(&self, request: &Request) -> Result<UnixStream, ClientError> {
        let command = request.name();
        let message = request
            .encode()
            .map_err(|source| ClientError::Protocol { command, source })?;
        let mut stream = self.open().await?;
        tokio::time::timeout(self.timeout, stream.write_all(&message))
            .await
            .map_err(|_| ClientError::Timeout {
                command,
                timeout: self.timeout,
            })?
            .map_err(|source| io_error(command, source))?;
        Ok(stream)
    }

    /// Reads the reply to the request sent on `stream`; server errors become `Err`.
    async fn reply(
        mut stream: UnixStream,
        command: &'static str,
        timeout: Duration,
    ) -> Result<(UnixStream, Vec<u8>), ClientError> {
        let reply = async {
            let mut header_bytes = [0u8; HEADER_LEN];
            read_exact_untimed(&mut stream, &mut header_bytes, command).await?;
            let header = Header::decode(&header_bytes)
                .map_err(|source| ClientError::Protocol { command, source })?;
            let mut payload = vec![0u8; header.payload_len()];
            read_exact_untimed(&mut stream, &mut payload, command).await?;
            Ok::<_, ClientError>((header, payload))
        };
        let (header, payload) = tokio::time::timeout(timeout, reply)
            .await
            .map_err(|_| ClientError::Timeout { command, timeout })??;
        check_reply(command, &header, &payload)?;
        Ok((stream, payload))
    }
}

fn check_reply(command: &'static str, header: &Header, payload: &[u8]) -> Result<(), ClientError> {
    if header.is_ok() {
        return Ok(());
    }
    if header.is_error() {
        let error = ipc::decode_error(payload)
            .map_err(|source| ClientError::Protocol { command, source })?;
        return Err(ClientError::Server {
            command,
            hresult: error.hresult,
            detail: error.message,
        });
    }
    Err(ClientError::UnexpectedReply {
        command,
        set: header.command_set,
        id: header.command_id,
    })
}

fn io_error(command: &'static str, source: io::Error) -> ClientError {
    if source.kind() == io::ErrorKind::UnexpectedEof {
        ClientError::Closed { command }
    } else {
        ClientError::Io { command, source }
    }
}

async fn read_exact_untimed(
    stream: &mut UnixStream,
    buf: &mut [u8],
    command: &'static str,
) -> Result<(), ClientError> {
    stream
        .read_exact(buf)
        .await
        .map(drop)
        .map_err(|source| io_error(command, source))
}

async fn read_exact(
    stream: &mut UnixStream,
    buf: &mut [u8],
    command: &'static str,
    timeout: Duration,
) -> Result<(), ClientError> {
    tokio::time::timeout(timeout, read_exact_untimed(stream, buf, command))
        .await
        .map_err(|_| ClientError::Timeout { command, timeout })?
}
