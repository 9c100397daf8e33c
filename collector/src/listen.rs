//! Listen mode: runtimes started with `DOTNET_DiagnosticPorts=<our socket>` dial us.
//!
//! Each runtime connects, sends a 34-byte `ADVR_V1` advertisement and then waits for one command
//! on that connection; after every command it dials again. We keep the advertised connections per
//! runtime instance (its cookie) and hand out one per command. A runtime whose idle connection
//! closes, and that does not dial again within [`GONE_AFTER`], has gone.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{broadcast, Notify, Semaphore};
use tokio::task::JoinHandle;

use crate::client::{DiagnosticsClient, Endpoint, RuntimeUser};
use ipc::{Advertise, ProtocolError, RuntimeCookie, ADVERTISE_LEN};

/// A runtime with no idle connection for this long, after its last one closed, is gone.
pub const GONE_AFTER: Duration = Duration::from_secs(2);
/// How long a new connection may take to send its advertisement.
const ADVERTISE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often idle connections are checked for a runtime that exited.
const SWEEP_EVERY: Duration = Duration::from_millis(200);
/// A runtime keeps one advertised connection; a few more are tolerated, never an unbounded queue.
const MAX_IDLE_PER_RUNTIME: usize = 4;
/// Connections still owing their advertisement, at most.
const MAX_PENDING_HANDSHAKES: usize = 64;
/// Attach/detach notices kept for slow subscribers before the oldest are lost.
const EVENT_CAPACITY: usize = 256;

/// Why listen mode failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ListenError {
    #[error(
        "another process already listens on {path}; stop it or choose another --diagnostic-port"
    )]
    InUse { path: PathBuf },
    #[error("{path} exists and is not a socket; refusing to replace it")]
    NotASocket { path: PathBuf },
    #[error("cannot listen on {path}: {source}")]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("runtime {cookie} (pid {pid}) has gone")]
    RuntimeGone { cookie: RuntimeCookie, pid: u64 },
    #[error(
        "runtime {cookie} (pid {pid}): its connection's peer credentials are unreadable; \
         refusing to trust files it writes"
    )]
    NoPeerCredentials { cookie: RuntimeCookie, pid: u64 },
    #[error("runtime {cookie} (pid {pid}) offered no connection within {timeout:?}")]
    NoConnection {
        cookie: RuntimeCookie,
        pid: u64,
        timeout: Duration,
    },
}

/// A runtime known to the listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeInfo {
    pub cookie: RuntimeCookie,
    /// The pid the runtime advertised: its pid inside its own pid namespace.
    pub pid: u64,
}

/// What happened to the listener's runtimes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeEvent {
    Attached(RuntimeInfo),
    Detached(RuntimeInfo),
}

/// How many runtimes a listener keeps unless told otherwise: far above one node's .NET processes,
/// low enough that a process advertising made-up runtimes cannot grow the pool without end.
pub const DEFAULT_MAX_RUNTIMES: usize = 512;

/// Options for [`ListenServer::bind`].
#[derive(Debug, Clone, Copy)]
pub struct ListenOptions {
    /// Send ResumeRuntime to each runtime when it first dials in, so a runtime that waits for a
    /// tool at startup (`suspend`, the default) goes on. Turn off to set up sessions first.
    pub resume_on_attach: bool,
    /// The most runtimes kept at once; a new one beyond it is refused (and logged).
    pub max_runtimes: usize,
}

impl Default for ListenOptions {
    fn default() -> Self {
        ListenOptions {
            resume_on_attach: true,
            max_runtimes: DEFAULT_MAX_RUNTIMES,
        }
    }
}

struct RuntimeEntry {
    pid: u64,
    /// The peer credentials of its first connection; later connections claiming its cookie must
    /// come from the same user, or another process could slip its connections into the pool.
    user: Option<RuntimeUser>,
    idle: VecDeque<UnixStream>,
    /// When the runtime last had an idle connection (or had one taken).
    last_seen: Instant,
}

struct Shared {
    runtimes: Mutex<HashMap<RuntimeCookie, RuntimeEntry>>,
    /// Woken whenever a connection is added, so waiting commands look again.
    changed: Notify,
    events: broadcast::Sender<RuntimeEvent>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RuntimeCookie, RuntimeEntry>> {
        // A panic while holding the lock cannot leave the map inconsistent: keep going.
        self.runtimes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The listening socket and the pool of runtimes that dialled it.
///
/// Dropping it stops accepting, closes every pooled connection and removes the socket file.
pub struct ListenServer {
    path: PathBuf,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl ListenServer {
    /// Listens on `path` (mode 0600). A stale socket file left by a dead listener is replaced; a
    /// live listener or a file that is not a socket is an error.
    pub async fn bind(path: impl AsRef<Path>, options: ListenOptions) -> Result<Self, ListenError> {
        let path = path.as_ref().to_path_buf();
        let listener = bind_private(&path).await?;
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        let shared = Arc::new(Shared {
            runtimes: Mutex::new(HashMap::new()),
            changed: Notify::new(),
            events,
        });
        let tasks = vec![
            tokio::spawn(accept_loop(listener, shared.clone(), options)),
            tokio::spawn(sweep_loop(shared.clone())),
        ];
        tracing::info!(path = %path.display(), "listening for runtimes");
        Ok(ListenServer {
            path,
            shared,
            tasks,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Attach and detach notices from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<RuntimeEvent> {
        self.shared.events.subscribe()
    }

    /// The runtimes connected now.
    pub fn runtimes(&self) -> Vec<RuntimeInfo> {
        let mut list: Vec<RuntimeInfo> = self
            .shared
            .lock()
            .iter()
            .map(|(&cookie, entry)| RuntimeInfo {
                cookie,
                pid: entry.pid,
            })
            .collect();
        list.sort_by_key(|info| info.pid);
        list
    }

    /// A handle for sending commands to one runtime.
    pub fn runtime(&self, info: RuntimeInfo) -> RuntimeHandle {
        RuntimeHandle {
            info,
            shared: self.shared.clone(),
        }
    }

    /// A client for one runtime (commands go over its advertised connections).
    pub fn client(&self, info: RuntimeInfo) -> DiagnosticsClient {
        DiagnosticsClient::new(Endpoint::Listen(self.runtime(info)))
    }

    /// Waits until a runtime with this advertised pid is connected.
    pub async fn wait_for_pid(&self, pid: u64, timeout: Duration) -> Option<RuntimeInfo> {
        let mut events = self.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(info) = self.runtimes().into_iter().find(|r| r.pid == pid) {
                return Some(info);
            }
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Err(_) => return None,
                Ok(Err(broadcast::error::RecvError::Closed)) => return None,
                Ok(_) => continue,
            }
        }
    }
}

impl Drop for ListenServer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        self.shared.lock().clear();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One runtime in the pool; cheap to clone.
#[derive(Clone)]
pub struct RuntimeHandle {
    info: RuntimeInfo,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for RuntimeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeHandle")
            .field("info", &self.info)
            .finish()
    }
}

impl RuntimeHandle {
    pub fn info(&self) -> RuntimeInfo {
        self.info
    }

    /// Who the runtime runs as, from its first connection's peer credentials.
    pub fn user(&self) -> Result<RuntimeUser, ListenError> {
        let runtimes = self.shared.lock();
        let entry = runtimes
            .get(&self.info.cookie)
            .ok_or(ListenError::RuntimeGone {
                cookie: self.info.cookie,
                pid: self.info.pid,
            })?;
        entry.user.ok_or(ListenError::NoPeerCredentials {
            cookie: self.info.cookie,
            pid: self.info.pid,
        })
    }

    /// Takes one advertised connection for a command, waiting up to `timeout` for the runtime to
    /// dial again if none is idle.
    pub async fn take_connection(&self, timeout: Duration) -> Result<UnixStream, ListenError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Register interest before looking, so a connection added in between still wakes us.
            let changed = self.shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut runtimes = self.shared.lock();
                let Some(entry) = runtimes.get_mut(&self.info.cookie) else {
                    return Err(ListenError::RuntimeGone {
                        cookie: self.info.cookie,
                        pid: self.info.pid,
                    });
                };
                while let Some(stream) = entry.idle.pop_front() {
                    if is_open(&stream) {
                        entry.last_seen = Instant::now();
                        return Ok(stream);
                    }
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(ListenError::NoConnection {
                    cookie: self.info.cookie,
                    pid: self.info.pid,
                    timeout,
                });
            }
        }
    }
}

/// Binds under a temporary name, restricts it to 0600, then renames it into place, so the socket
/// is never reachable with looser permissions.
async fn bind_private(path: &Path) -> Result<UnixListener, ListenError> {
    let bind_error = |source| ListenError::Bind {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if UnixStream::connect(path).await.is_ok() {
                return Err(ListenError::InUse {
                    path: path.to_path_buf(),
                });
            }
            std::fs::remove_file(path).map_err(bind_error)?;
        }
        Ok(_) => {
            return Err(ListenError::NotASocket {
                path: path.to_path_buf(),
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(bind_error(e)),
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.exists() {
            std::fs::create_dir_all(parent).map_err(bind_error)?;
            std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o700))
                .map_err(bind_error)?;
        }
    }
    let file_name = path
        .file_name()
        .ok_or_else(|| bind_error(io::Error::other("the path has no file name")))?;
    let mut staging_name = std::ffi::OsString::from(".");
    staging_name.push(file_name);
    staging_name.push(format!(".{}.tmp", std::process::id()));
    let staging = path.with_file_name(staging_name);
    let _ = std::fs::remove_file(&staging);
    let listener = UnixListener::bind(&staging).map_err(bind_error)?;
    let placed = std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&staging, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&staging);
        return Err(bind_error(e));
    }
    Ok(listener)
}

async fn accept_loop(listener: UnixListener, shared: Arc<Shared>, options: ListenOptions) {
    let handshakes = Arc::new(Semaphore::new(MAX_PENDING_HANDSHAKES));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a runtime connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = handshakes.clone().try_acquire_owned() else {
            tracing::warn!("too many connections without an advertisement; dropping one");
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match read_advertisement(stream).await {
                Ok((advertise, stream)) => admit(&shared, advertise, stream, options),
                Err(e) => tracing::warn!(error = %e, "a connection sent no valid advertisement"),
            }
        });
    }
}

#[derive(Debug, thiserror::Error)]
enum HandshakeError {
    #[error("reading the advertisement: {0}")]
    Io(#[from] io::Error),
    #[error("no advertisement within {ADVERTISE_TIMEOUT:?}")]
    Timeout,
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
}

async fn read_advertisement(
    mut stream: UnixStream,
) -> Result<(Advertise, UnixStream), HandshakeError> {
    let mut bytes = [0u8; ADVERTISE_LEN];
    tokio::time::timeout(ADVERTISE_TIMEOUT, stream.read_exact(&mut bytes))
        .await
        .map_err(|_| HandshakeError::Timeout)??;
    Ok((Advertise::decode(&bytes)?, stream))
}

fn admit(shared: &Arc<Shared>, advertise: Advertise, stream: UnixStream, options: ListenOptions) {
    let info = RuntimeInfo {
        cookie: advertise.cookie,
        pid: advertise.pid,
    };
    let user = RuntimeUser::of(&stream).ok();
    let is_new = {
        let mut runtimes = shared.lock();
        let is_new = !runtimes.contains_key(&info.cookie);
        if is_new && runtimes.len() >= options.max_runtimes {
            tracing::warn!(
                pid = info.pid,
                cookie = %info.cookie,
                max_runtimes = options.max_runtimes,
                "refusing a runtime: the listener already holds its most runtimes \
                 (--max-runtimes); is a process advertising made-up runtimes?"
            );
            return;
        }
        let entry = runtimes.entry(info.cookie).or_insert_with(|| RuntimeEntry {
            pid: info.pid,
            user,
            idle: VecDeque::new(),
            last_seen: Instant::now(),
        });
        if entry.user != user || entry.pid != info.pid {
            tracing::warn!(
                pid = info.pid,
                cookie = %info.cookie,
                "refusing a connection that claims a known runtime's cookie from another \
                 process or user"
            );
            return;
        }
        if entry.idle.len() >= MAX_IDLE_PER_RUNTIME {
            entry.idle.pop_front();
        }
        entry.idle.push_back(stream);
        entry.last_seen = Instant::now();
        is_new
    };
    shared.changed.notify_waiters();
    if !is_new {
        return;
    }
    tracing::info!(pid = info.pid, cookie = %info.cookie, "runtime attached");
    let _ = shared.events.send(RuntimeEvent::Attached(info));
    if options.resume_on_attach {
        let client = DiagnosticsClient::new(Endpoint::Listen(RuntimeHandle {
            info,
            shared: shared.clone(),
        }));
        tokio::spawn(async move {
            if let Err(e) = client.resume_runtime().await {
                tracing::warn!(pid = info.pid, error = %e, "resuming the runtime failed");
            }
        });
    }
}

/// Drops closed idle connections and forgets runtimes that stopped dialling in.
async fn sweep_loop(shared: Arc<Shared>) {
    let mut ticker = tokio::time::interval(SWEEP_EVERY);
    loop {
        ticker.tick().await;
        let now = Instant::now();
        let mut gone = Vec::new();
        shared.lock().retain(|&cookie, entry| {
            let before = entry.idle.len();
            entry.idle.retain(is_open);
            if entry.idle.len() != before || !entry.idle.is_empty() {
                entry.last_seen = now;
            }
            let alive = !entry.idle.is_empty() || now.duration_since(entry.last_seen) < GONE_AFTER;
            if !alive {
                gone.push(RuntimeInfo {
                    cookie,
                    pid: entry.pid,
                });
            }
            alive
        });
        for info in gone {
            tracing::info!(pid = info.pid, cookie = %info.cookie, "runtime detached");
            let _ = shared.events.send(RuntimeEvent::Detached(info));
        }
    }
}

/// An idle advertised connection is open while reading it would block: the runtime sends nothing
/// until it gets a command, so end-of-stream or stray bytes both mean it is unusable.
fn is_open(stream: &UnixStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A test's folder, removed on drop unless the test failed.
    struct TempDir(PathBuf);

    impl Drop for TempDir {
        fn drop(&mut self) {
            if !std::thread::panicking() {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    /// A socket path `name` in a fresh folder of its own, and the folder (bound first, it
    /// outlives the server).
    fn temp_socket(name: &str) -> (TempDir, PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("clrscope-listen-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        (TempDir(dir), path)
    }

    async fn fake_runtime(path: &Path, cookie: u8, pid: u64) -> UnixStream {
        let mut stream = UnixStream::connect(path).await.unwrap();
        let advertise = Advertise {
            cookie: RuntimeCookie([cookie; 16]),
            pid,
        };
        stream.write_all(&advertise.encode()).await.unwrap();
        stream
    }

    #[tokio::test]
    async fn socket_is_private_and_stale_file_is_replaced() {
        let (_dir, path) = temp_socket("private.sock");
        // A socket file nobody listens on, as a crashed agent leaves behind.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let server = ListenServer::bind(&path, ListenOptions::default())
            .await
            .unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        let second = ListenServer::bind(&path, ListenOptions::default()).await;
        assert!(matches!(second, Err(ListenError::InUse { .. })));
        drop(server);
        assert!(!path.exists());
    }

    #[tokio::test]
    async fn refuses_to_replace_a_regular_file() {
        let (_dir, path) = temp_socket("regular-file");
        std::fs::write(&path, b"keep me").unwrap();
        let result = ListenServer::bind(&path, ListenOptions::default()).await;
        assert!(matches!(result, Err(ListenError::NotASocket { .. })));
        assert_eq!(std::fs::read(&path).unwrap(), b"keep me");
    }

    #[tokio::test]
    async fn pools_connections_and_drops_a_runtime_that_hangs_up() {
        let (_dir, path) = temp_socket("pool.sock");
        let options = ListenOptions {
            resume_on_attach: false,
            ..ListenOptions::default()
        };
        let server = ListenServer::bind(&path, options).await.unwrap();
        let mut events = server.subscribe();
        let runtime_side = fake_runtime(&path, 7, 4242).await;
        let info = server
            .wait_for_pid(4242, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(info.cookie, RuntimeCookie([7; 16]));
        assert_eq!(events.recv().await.unwrap(), RuntimeEvent::Attached(info));

        // Taking the one idle connection leaves none; the next take waits for a new dial.
        let handle = server.runtime(info);
        let taken = handle
            .take_connection(Duration::from_secs(1))
            .await
            .unwrap();
        drop(taken);
        let waiting = tokio::spawn({
            let handle = handle.clone();
            async move { handle.take_connection(Duration::from_secs(5)).await }
        });
        let _again = fake_runtime(&path, 7, 4242).await;
        assert!(waiting.await.unwrap().is_ok());

        // The runtime exits: its connections close and it is dropped from the pool.
        drop(runtime_side);
        drop(_again);
        let detached = tokio::time::timeout(GONE_AFTER * 3, events.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(detached, RuntimeEvent::Detached(info));
        assert!(server.runtimes().is_empty());
        assert!(matches!(
            handle.take_connection(Duration::from_millis(10)).await,
            Err(ListenError::RuntimeGone { .. })
        ));
    }

    #[tokio::test]
    async fn garbage_advertisement_is_not_admitted() {
        let (_dir, path) = temp_socket("garbage.sock");
        let server = ListenServer::bind(&path, ListenOptions::default())
            .await
            .unwrap();
        let mut stream = UnixStream::connect(&path).await.unwrap();
        stream.write_all(&[0xAB; ADVERTISE_LEN]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(server.runtimes().is_empty());
    }

    #[tokio::test]
    async fn a_connection_claiming_a_known_cookie_for_another_pid_is_refused() {
        let (_dir, path) = temp_socket("claim.sock");
        let options = ListenOptions {
            resume_on_attach: false,
            ..ListenOptions::default()
        };
        let server = ListenServer::bind(&path, options).await.unwrap();
        let _real = fake_runtime(&path, 9, 500).await;
        let info = server
            .wait_for_pid(500, Duration::from_secs(5))
            .await
            .unwrap();
        let handle = server.runtime(info);
        drop(
            handle
                .take_connection(Duration::from_secs(1))
                .await
                .unwrap(),
        );
        // Another process claims the cookie: its connection must not join the pool.
        let _impostor = fake_runtime(&path, 9, 501).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(matches!(
            handle.take_connection(Duration::from_millis(200)).await,
            Err(ListenError::NoConnection { .. })
        ));
        assert_eq!(server.runtimes(), vec![info]);
        let me = std::fs::metadata("/proc/self").unwrap();
        assert_eq!(
            handle.user().unwrap().uid,
            std::os::unix::fs::MetadataExt::uid(&me)
        );
    }

    #[tokio::test]
    async fn runtimes_beyond_the_cap_are_refused() {
        let (_dir, path) = temp_socket("cap.sock");
        let options = ListenOptions {
            resume_on_attach: false,
            max_runtimes: 2,
        };
        let server = ListenServer::bind(&path, options).await.unwrap();
        let _first = fake_runtime(&path, 1, 101).await;
        let _second = fake_runtime(&path, 2, 102).await;
        for pid in [101, 102] {
            assert!(server
                .wait_for_pid(pid, Duration::from_secs(5))
                .await
                .is_some());
        }
        let _third = fake_runtime(&path, 3, 103).await;
        assert!(server
            .wait_for_pid(103, Duration::from_millis(500))
            .await
            .is_none());
        assert_eq!(server.runtimes().len(), 2);
    }
}
