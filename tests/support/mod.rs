//! Support for integration tests against real .NET processes: the test-bed targets of
//! `tests/targets/<Name>/`, built by `make setup` into `.testbed/` (see `tests/targets/README.md`)
//! and run on the runtime [`runtime_major`] names (`CLRSCOPE_DOTNET`, default 10).
//!
//! ```ignore
//! mod support;
//! use support::Target;
//!
//! let mut cpu = Target::builder("CpuHot").args(["--split", "60,30,10"]).start();
//! let ready = cpu.ready().unwrap();            // the target's ready line, as JSON
//! let socket = cpu.diagnostic_socket().unwrap(); // /tmp/dotnet-diagnostic-PID-KEY-socket
//! // ... run clrscope against cpu.pid() ...
//! // dropping `cpu` kills the process
//! ```
//!
//! Only std and serde_json. A target's stdout is read by a background thread into a bounded channel;
//! when the channel is full (a test not reading a chatty target) lines are dropped and counted
//! ([`Target::dropped_lines`]) rather than ever blocking the target. Its stderr is kept (the last
//! 64 KiB) for error messages.
#![allow(dead_code)]

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod agent;
pub mod browser;
pub mod golden;
pub mod openapi;
pub mod peers;
pub mod postgres;
pub mod receiver;

/// How long [`TargetBuilder::start`] waits for the ready line: the Storefront service (ASP.NET
/// Core, Npgsql, its downstream) missed 30 s at a load average of 45.
pub const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// Capacity of the stdout channel, in lines.
pub const STDOUT_CHANNEL_LINES: usize = 16 * 1024;
const STDERR_KEEP_BYTES: usize = 64 * 1024;

/// The test-bed folder: `$CLRSCOPE_TESTBED_DIR`, else `<CARGO_MANIFEST_DIR>/.testbed`.
pub fn testbed_dir() -> PathBuf {
    match std::env::var_os("CLRSCOPE_TESTBED_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                Path::new(env!("CARGO_MANIFEST_DIR")).join(dir)
            }
        }
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join(".testbed"),
    }
}

/// The `dotnet` host of the test bed (`testbed_dir()/bin/dotnet`, a symlink made by `make setup` to
/// the test bed's own `dotnet` root, which holds every runtime of the matrix side by side).
///
/// Panics with "run `make setup` first" if it is missing.
pub fn dotnet_host() -> PathBuf {
    let host = testbed_dir().join("bin").join("dotnet");
    if !host.exists() {
        panic!(
            "no .NET host at {} (the .NET test bed is not installed): run `make setup` first",
            host.display()
        );
    }
    host
}

/// Whether the test bed is installed (the host and at least one compiled target exist).
pub fn testbed_available() -> bool {
    testbed_dir().join("bin").join("dotnet").exists()
}

/// The major version of the .NET runtime the targets run on: `CLRSCOPE_DOTNET` (8, 9, 10 or 11;
/// `make test-matrix` sets it), else 10. Panics on anything else, and on a version the test bed
/// did not install (`.testbed/runtimes.env`), so a test never runs on another runtime silently.
pub fn runtime_major() -> u32 {
    let major = match std::env::var("CLRSCOPE_DOTNET") {
        Ok(v) if !v.trim().is_empty() => v.trim().parse::<u32>().unwrap_or_else(|_| {
            panic!("CLRSCOPE_DOTNET={v:?}: give a .NET major version (8, 9, 10 or 11)")
        }),
        _ => DEFAULT_RUNTIME_MAJOR,
    };
    let installed = installed_runtimes();
    if !installed.is_empty()
        && !installed
            .iter()
            .any(|v| v.starts_with(&format!("{major}.")))
    {
        panic!(
            "CLRSCOPE_DOTNET={major}: the test bed has no .NET {major} runtime (it has {}); run `make setup`",
            installed.join(", ")
        );
    }
    major
}

/// The runtime the suite runs on unless `CLRSCOPE_DOTNET` says otherwise.
pub const DEFAULT_RUNTIME_MAJOR: u32 = 10;
/// The newest target framework the SDK builds; newer runtimes run its build rolled forward.
const NEWEST_BUILT_MAJOR: u32 = 10;

/// The `Microsoft.NETCore.App` versions the test bed installed (`RUNTIMES=` of `runtimes.env`).
pub fn installed_runtimes() -> Vec<String> {
    std::fs::read_to_string(testbed_dir().join("runtimes.env"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("RUNTIMES="))
        .map(|v| v.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// The full version of the runtime [`runtime_major`] names (e.g. `10.0.12`).
pub fn runtime_version() -> String {
    let major = runtime_major();
    installed_runtimes()
        .into_iter()
        .find(|v| v.starts_with(&format!("{major}.")))
        .unwrap_or_else(|| {
            panic!("no .NET {major} in the test bed's runtimes.env: run `make setup`")
        })
}

/// Whether the runtime under test marks samples of managed code as external, so that clrscope
/// estimates `cpu` from the kernel's per-thread CPU (dotnet/runtime#123996: CoreCLR 9.x;
/// docs/runtimes.md, "Sample kinds"): by the product's own rule, for the JIT-compiled targets.
pub fn sample_kinds_untrusted() -> bool {
    collector::samples::untrusted_kinds_of(&runtime_version(), false).is_some()
}

/// The shared framework directory of the runtime the targets run on
/// (`.testbed/dotnet/shared/Microsoft.NETCore.App/VERSION`).
pub fn shared_framework_dir() -> PathBuf {
    testbed_dir()
        .join("dotnet/shared/Microsoft.NETCore.App")
        .join(runtime_version())
}

/// The target framework folder of the build that runs on .NET `major` (`net10.0`, …).
fn target_framework(major: u32) -> String {
    format!("net{}.0", major.min(NEWEST_BUILT_MAJOR))
}

/// The compiled target `name` (`testbed_dir()/targets/NAME/TFM/NAME.dll`); panics with "run
/// `make setup` first" if it is missing.
pub fn target_dll(name: &str) -> PathBuf {
    target_dll_on(name, runtime_major())
}

/// [`target_dll`] of the build that runs on .NET `major`.
fn target_dll_on(name: &str, major: u32) -> PathBuf {
    let dll = testbed_dir()
        .join("targets")
        .join(name)
        .join(target_framework(major))
        .join(format!("{name}.dll"));
    if !dll.exists() {
        panic!(
            "no test-bed target {} (is there a tests/targets/{name}/{name}.csproj?): run `make setup` first",
            dll.display()
        );
    }
    dll
}

/// Panics unless the ready line's `runtime` is the version asked for (`want`, [`runtime_major`]
/// unless the builder said [`TargetBuilder::on_runtime`]): a roll-forward or a missing framework
/// must not turn a .NET 8 run into a .NET 10 one unnoticed.
fn check_runtime(name: &str, ready: &Value, want: u32) {
    let runtime = ready.get("runtime").and_then(Value::as_str).unwrap_or("");
    if !runtime.starts_with(&format!("{want}.")) {
        panic!("test-bed target {name} runs on .NET {runtime:?}, not the .NET {want} CLRSCOPE_DOTNET asked for");
    }
}

/// The folder where .NET puts diagnostic sockets: `$TMPDIR`, else `/tmp`.
pub fn diagnostic_socket_dir() -> PathBuf {
    match std::env::var_os("TMPDIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from("/tmp"),
    }
}

/// Every `dotnet-diagnostic-PID-KEY-socket` of `pid` in [`diagnostic_socket_dir`], sorted.
pub fn diagnostic_sockets(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("dotnet-diagnostic-{pid}-");
    let is_ours = |name: &str| {
        name.strip_prefix(prefix.as_str())
            .and_then(|rest| rest.strip_suffix("-socket"))
            .is_some_and(|key| !key.is_empty() && key.chars().all(|c| c.is_ascii_digit()))
    };
    let mut found: Vec<PathBuf> = match std::fs::read_dir(diagnostic_socket_dir()) {
        Ok(entries) => entries
            .filter_map(|e| e.ok())
            .filter(|e| is_ours(&e.file_name().to_string_lossy()))
            .map(|e| e.path())
            .collect(),
        Err(_) => Vec::new(),
    };
    found.sort();
    found
}

/// The diagnostic socket of `pid`, if there is one.
pub fn diagnostic_socket(pid: u32) -> Option<PathBuf> {
    diagnostic_sockets(pid).pop()
}

/// Polls for the diagnostic socket of `pid` until `timeout`.
pub fn wait_for_diagnostic_socket(pid: u32, timeout: Duration) -> Option<PathBuf> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(path) = diagnostic_socket(pid) {
            return Some(path);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Makes a diagnostic socket for `pid` that nobody listens on, named as a runtime in that process
/// would name its own (with the process's start time as the key), and returns its path: a
/// process that looks like a runtime gone deaf. The caller removes it.
pub fn deaf_socket(pid: u32) -> PathBuf {
    let start = collector::discovery::locate(Path::new("/proc"), pid)
        .expect("the process is alive")
        .start_time
        .expect("its start time is readable");
    let path = std::env::temp_dir().join(format!("dotnet-diagnostic-{pid}-{start}-socket"));
    let _ = std::fs::remove_file(&path);
    drop(std::os::unix::net::UnixListener::bind(&path).expect("binding the socket"));
    path
}

/// A test's scratch directory, `$TMP/clrscope-NAME-PID` (not created here; an earlier run's
/// leftover is removed). Dropping it removes the directory, unless the test is failing: then it
/// stays, for the evidence, and its path goes to stderr. Declare it before the agent or process
/// that writes into it, so that it is dropped after them.
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    pub fn new(name: &str) -> ScratchDir {
        let path = std::env::temp_dir().join(format!("clrscope-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        ScratchDir(path)
    }
}

impl std::ops::Deref for ScratchDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for ScratchDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!(
                "kept the failed test's scratch directory {}",
                self.0.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Whether a process `pid` exists (and is not a zombie).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => match stat.rfind(')') {
            Some(i) => !matches!(stat[i + 1..].trim_start().chars().next(), Some('Z' | 'X')),
            None => true,
        },
        Err(_) => false,
    }
}

/// A response of [`http_get`].
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    /// Header names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// The body as received (for binary answers such as pprof).
    pub bytes: Vec<u8>,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON (AsyncWeb answers with the request's JSON line).
    pub fn json(&self) -> Value {
        serde_json::from_str(self.body.trim())
            .unwrap_or_else(|e| panic!("response body is not JSON ({e}): {:?}", self.body))
    }
}

/// A minimal HTTP/1.1 GET to `127.0.0.1:port` (`path` may carry a query), with extra headers, for
/// talking to the AsyncWeb target without an HTTP client crate. `Connection: close`; no chunked
/// bodies. Panics on I/O errors.
pub fn http_get(port: u16, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    http_request(port, "GET", path, headers)
}

/// [`http_get`] with any method (no request body).
pub fn http_request(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    http_request_with_body(port, method, path, headers, &[])
}

/// [`http_request`] with a request body (sent with its `Content-Length`); a chunked answer is
/// decoded.
pub fn http_request_with_body(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> HttpResponse {
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || !matches!(method, "GET" | "HEAD") {
        request.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    let mut message = request.into_bytes();
    message.extend_from_slice(body);
    http_raw(port, &message, &format!("{method} {path}"))
}

/// Sends `message` (a whole HTTP/1.1 request, as written: any `Host`, no `Host`, …) to
/// `127.0.0.1:port` and reads the answer until the server closes; `what` names it in panics.
pub fn http_raw(port: u16, message: &[u8], what: &str) -> HttpResponse {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))
        .unwrap_or_else(|e| panic!("connect 127.0.0.1:{port}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .expect("set_read_timeout");
    stream
        .write_all(message)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .unwrap_or_else(|e| panic!("{what}: reading the response: {e}"));
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("{what}: malformed response {raw:?}"));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let bytes = raw[split + 4..].to_vec();
    let mut head_lines = head.split("\r\n");
    let status_line = head_lines.next().unwrap_or("");
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{what}: bad status line {status_line:?}"));
    let headers: Vec<(String, String)> = head_lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let bytes = if chunked { dechunk(&bytes) } else { bytes };
    HttpResponse {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
        bytes,
    }
}

/// The payload of a `Transfer-Encoding: chunked` body (as far as it is complete).
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line_end) = raw.windows(2).position(|w| w == b"\r\n") {
        let size_text = String::from_utf8_lossy(&raw[..line_end]);
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let Ok(size) = usize::from_str_radix(size_text, 16) else {
            break;
        };
        let start = line_end + 2;
        if size == 0 || raw.len() < start + size {
            break;
        }
        out.extend_from_slice(&raw[start..start + size]);
        raw = raw.get(start + size + 2..).unwrap_or_default();
    }
    out
}

pub mod sys {
    extern "C" {
        pub fn kill(pid: i32, sig: i32) -> i32;
        pub fn signal(sig: i32, handler: usize) -> usize;
    }
    pub const SIG_DFL: usize = 0;
    pub const SIGTERM: i32 = 15;
    pub const SIGINT: i32 = 2;
    pub const SIGSTOP: i32 = 19;
    pub const SIGCONT: i32 = 18;
}

/// Configures and starts a test-bed target: `Target::builder("CpuHot")`.
#[derive(Debug, Clone)]
pub struct TargetBuilder {
    name: String,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    env_removes: Vec<String>,
    current_dir: Option<PathBuf>,
    wrapper: Vec<String>,
    /// The .NET major version to run on; `None`: [`runtime_major`].
    runtime: Option<u32>,
    /// A NativeAOT build: its executable runs without the .NET host.
    native_aot: bool,
}

/// Where tests/testbed/setup.sh publishes the NativeAOT target `name` (.NET 10).
pub fn native_aot_executable(name: &str) -> PathBuf {
    let exe = testbed_dir()
        .join("targets")
        .join(name)
        .join("publish")
        .join(name);
    if !exe.exists() {
        panic!(
            "no NativeAOT test-bed target {}: run `make setup` (tests/testbed/setup.sh targets) first",
            exe.display()
        );
    }
    exe
}

impl TargetBuilder {
    /// The NativeAOT build of the target (`tests/targets/<name>`, published by setup.sh for .NET
    /// 10): its own executable, no `dotnet` host, always .NET 10.
    pub fn native_aot(mut self) -> Self {
        self.native_aot = true;
        self.runtime = Some(10);
        self
    }

    /// Runs on .NET `major` instead of [`runtime_major`]'s: for a benchmark that compares
    /// runtimes side by side in one run.
    pub fn on_runtime(mut self, major: u32) -> Self {
        self.runtime = Some(major);
        self
    }

    fn runtime(&self) -> u32 {
        self.runtime.unwrap_or_else(runtime_major)
    }

    /// One command-line argument for the target (after `NAME.dll`).
    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.args.push(a.into());
        self
    }

    /// Several command-line arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// An environment variable for the target (e.g. `DOTNET_DiagnosticPorts`, `OTEL_SERVICE_NAME`).
    pub fn env(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.envs.push((k.into(), v.into()));
        self
    }

    /// Removes an inherited environment variable.
    pub fn env_remove(mut self, k: impl Into<String>) -> Self {
        self.env_removes.push(k.into());
        self
    }

    /// The target's working directory (default: inherited).
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.current_dir = Some(dir.into());
        self
    }

    /// Runs the target under `wrapper` (a program and its arguments, before the .NET host's
    /// path): e.g. `unshare` to put it in namespaces of its own. [`Target::pid`] is then the
    /// wrapper's pid.
    pub fn wrapped_in<I, S>(mut self, wrapper: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.wrapper = wrapper.into_iter().map(Into::into).collect();
        self
    }

    /// The command that [`spawn`](Self::spawn) runs.
    pub fn command(&self) -> Command {
        let program = match self.native_aot {
            true => native_aot_executable(&self.name),
            false => dotnet_host(),
        };
        let mut cmd = match self.wrapper.split_first() {
            Some((wrapper, args)) => {
                let mut cmd = Command::new(wrapper);
                cmd.args(args).arg(program);
                cmd
            }
            None => Command::new(program),
        };
        let major = self.runtime();
        if !self.native_aot {
            cmd.arg(target_dll_on(&self.name, major));
        }
        cmd.args(&self.args);
        // A runtime newer than the newest build runs that build rolled forward to it.
        if major > NEWEST_BUILT_MAJOR {
            cmd.env("DOTNET_ROLL_FORWARD", "LatestMajor");
        }
        // The target exits by itself within a second if this process dies without dropping it.
        cmd.env("TESTBED_EXIT_WITH_PARENT", "1");
        for k in &self.env_removes {
            cmd.env_remove(k);
        }
        for (k, v) in &self.envs {
            cmd.env(k, v);
        }
        if let Some(dir) = &self.current_dir {
            cmd.current_dir(dir);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // A test run started in the background by a non-interactive shell (`make test &`, nohup)
        // ignores SIGINT, and ignored signals are inherited: the runtime would then never see
        // the Ctrl-C tests send. Targets start with SIGINT's default disposition.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                sys::signal(sys::SIGINT, sys::SIG_DFL);
                Ok(())
            });
        }
        cmd
    }

    /// Starts the target; does NOT wait for its ready line (see [`Target::wait_ready`]).
    pub fn spawn(self) -> Target {
        let mut cmd = self.command();
        let mut child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot start test-bed target {} ({:?}): {e}",
                self.name, cmd
            )
        });

        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = sync_channel::<String>(STDOUT_CHANNEL_LINES);
        let dropped = Arc::new(AtomicU64::new(0));
        let dropped_w = Arc::clone(&dropped);
        thread::Builder::new()
            .name(format!("{}-stdout", self.name))
            .spawn(move || {
                let mut reader = BufReader::new(stdout);
                let mut buf = Vec::new();
                let mut receiver_gone = false;
                loop {
                    buf.clear();
                    match reader.read_until(b'\n', &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                    if receiver_gone {
                        continue; // keep draining so the target never blocks on a full pipe
                    }
                    let line = String::from_utf8_lossy(&buf)
                        .trim_end_matches(['\n', '\r'])
                        .to_string();
                    match tx.try_send(line) {
                        Ok(()) => {}
                        Err(TrySendError::Full(_)) => {
                            dropped_w.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(TrySendError::Disconnected(_)) => receiver_gone = true,
                    }
                }
            })
            .expect("spawn stdout reader");

        let stderr_pipe = child.stderr.take().expect("piped stderr");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let stderr_w = Arc::clone(&stderr);
        thread::Builder::new()
            .name(format!("{}-stderr", self.name))
            .spawn(move || {
                let mut pipe = stderr_pipe;
                let mut chunk = [0u8; 8192];
                loop {
                    match pipe.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let mut buf = stderr_w.lock().unwrap_or_else(|p| p.into_inner());
                            buf.extend_from_slice(&chunk[..n]);
                            if buf.len() > STDERR_KEEP_BYTES {
                                let excess = buf.len() - STDERR_KEEP_BYTES;
                                buf.drain(..excess);
                            }
                        }
                    }
                }
            })
            .expect("spawn stderr reader");

        let runtime = self.runtime();
        Target {
            child,
            runtime,
            name: self.name,
            args: self.args,
            ready: None,
            lines,
            before_ready: Vec::new(),
            stderr,
            dropped,
            sockets: Vec::new(),
            exit: None,
        }
    }

    /// [`spawn`](Self::spawn) + [`Target::wait_ready`] with [`READY_TIMEOUT`] (90 s); panics with the
    /// target's stderr and output if no ready line comes.
    pub fn start(self) -> Target {
        let mut target = self.spawn();
        if target.wait_ready(READY_TIMEOUT).is_none() {
            let status = match target.child.try_wait() {
                Ok(Some(status)) => format!("it exited with {status}"),
                _ => format!("no ready line within {READY_TIMEOUT:?}"),
            };
            target.kill();
            // give the readers a moment to collect what the process wrote last
            thread::sleep(Duration::from_millis(50));
            panic!(
                "test-bed target {} {:?} did not become ready: {status}\n--- stdout before ready ---\n{}\n--- stderr ---\n{}",
                target.name,
                target.args,
                target.before_ready.join("\n"),
                target.stderr_text()
            );
        }
        target
    }
}

/// A running test-bed target process. Dropping it kills the process and waits for it.
pub struct Target {
    pub child: Child,
    /// The .NET major version it runs on.
    runtime: u32,
    name: String,
    args: Vec<String>,
    ready: Option<Value>,
    lines: Receiver<String>,
    before_ready: Vec<String>,
    stderr: Arc<Mutex<Vec<u8>>>,
    dropped: Arc<AtomicU64>,
    sockets: Vec<PathBuf>,
    exit: Option<ExitStatus>,
}

impl Target {
    /// `Target::builder("CpuHot")`: the target compiled from `tests/targets/CpuHot.cs`.
    pub fn builder(name: &str) -> TargetBuilder {
        TargetBuilder {
            name: name.to_string(),
            args: Vec::new(),
            envs: Vec::new(),
            env_removes: Vec::new(),
            current_dir: None,
            wrapper: Vec::new(),
            runtime: None,
            native_aot: false,
        }
    }

    /// The target's name ("CpuHot").
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the ready line (`{"ready":NAME,"pid":...}`) and returns it; `None` on timeout or if
    /// the target exits (closes stdout) first. Lines before it are kept for error messages. Once
    /// seen, returns it again at once.
    pub fn wait_ready(&mut self, timeout: Duration) -> Option<Value> {
        if let Some(ready) = &self.ready {
            return Some(ready.clone());
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => match serde_json::from_str::<Value>(&line) {
                    Ok(v) if v.get("ready").is_some() => {
                        check_runtime(&self.name, &v, self.runtime);
                        self.sockets = diagnostic_sockets(self.pid());
                        self.ready = Some(v.clone());
                        return Some(v);
                    }
                    _ => self.before_ready.push(line),
                },
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                    return None
                }
            }
        }
    }

    /// The ready line, once [`wait_ready`](Self::wait_ready) has seen it.
    pub fn ready(&self) -> Option<&Value> {
        self.ready.as_ref()
    }

    /// A fact from the ready line by JSON pointer, e.g. `ready_fact("/threads/0/tid")`.
    pub fn ready_fact(&self, pointer: &str) -> Option<&Value> {
        self.ready.as_ref().and_then(|r| r.pointer(pointer))
    }

    /// CPU time the kernel has accounted to each thread the ready line lists (`threads[].name`
    /// and `.tid`, as CpuHot prints them), in clock ticks: the ground truth a profile's split is
    /// judged against, whatever the machine's load made of the target's intended split.
    pub fn thread_cpu_ticks(&self) -> HashMap<String, u64> {
        self.threads()
            .into_iter()
            .map(|(name, tid)| (name, thread_cpu_ticks(self.pid(), tid)))
            .collect()
    }

    /// Time each thread the ready line lists has run or waited to run (`/proc/PID/task/TID/
    /// schedstat`: on the CPU plus on a run queue), in ns: what a sampler that stops every thread
    /// at once sees as "running", the ground truth of a profile that has no kernel figures (a
    /// trace file) on a loaded machine, where a busy thread spends part of its busy time waiting
    /// for a core.
    pub fn thread_runnable_ns(&self) -> HashMap<String, u64> {
        self.threads()
            .into_iter()
            .map(|(name, tid)| (name, thread_runnable_ns(self.pid(), tid)))
            .collect()
    }

    /// The threads the ready line lists: (name, tid).
    pub fn threads(&self) -> Vec<(String, u64)> {
        let threads = self
            .ready_fact("/threads")
            .and_then(Value::as_array)
            .expect("the ready line lists threads with their tids");
        threads
            .iter()
            .map(|t| {
                let name = t["name"].as_str().expect("thread name").to_string();
                (name, t["tid"].as_u64().expect("thread tid"))
            })
            .collect()
    }

    /// The next stdout line (after the ready line, if [`wait_ready`](Self::wait_ready) ran), or
    /// `None` on timeout or once the target closed stdout and every line was read.
    pub fn next_line(&mut self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }

    /// The next stdout line that is a JSON object, skipping others; `None` on timeout/end.
    pub fn next_json(&mut self, timeout: Duration) -> Option<Value> {
        self.wait_for_json(timeout, |_| true)
    }

    /// The next JSON stdout line for which `pred` holds (e.g. `|v| v.get("progress").is_some()`),
    /// skipping others; `None` on timeout/end.
    pub fn wait_for_json(
        &mut self,
        timeout: Duration,
        mut pred: impl FnMut(&Value) -> bool,
    ) -> Option<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).ok()?;
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if v.is_object() && pred(&v) {
                    return Some(v);
                }
            }
        }
    }

    /// Every stdout line already received and not yet read, without waiting.
    pub fn drain_lines(&mut self) -> Vec<String> {
        self.lines.try_iter().collect()
    }

    /// Stdout lines dropped because the channel was full (nobody reading).
    pub fn dropped_lines(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Stdout lines seen before the ready line.
    pub fn lines_before_ready(&self) -> &[String] {
        &self.before_ready
    }

    /// What the target wrote to stderr so far (the last 64 KiB).
    pub fn stderr_text(&self) -> String {
        let buf = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// The target's diagnostic socket (`$TMPDIR` or `/tmp`/`dotnet-diagnostic-PID-KEY-socket`).
    pub fn diagnostic_socket(&self) -> Option<PathBuf> {
        diagnostic_socket(self.pid())
    }

    /// Polls for the diagnostic socket until `timeout`.
    pub fn wait_diagnostic_socket(&self, timeout: Duration) -> Option<PathBuf> {
        wait_for_diagnostic_socket(self.pid(), timeout)
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.try_exit_status().is_none()
    }

    /// The exit status if the process has exited (reaps it), else `None`.
    pub fn try_exit_status(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.exit = Some(status);
            }
        }
        self.exit
    }

    /// Waits up to `timeout` for the process to exit by itself (e.g. after `--duration-seconds`).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit_status() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends SIGINT (the targets treat it as Ctrl-C and end cleanly, printing their exit line).
    pub fn interrupt(&mut self) {
        self.signal(sys::SIGINT);
    }

    /// SIGTERM, then waits up to `timeout` for the exit; SIGKILL if it has not exited by then.
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        self.signal(sys::SIGTERM);
        if let Some(status) = self.wait_exit(timeout) {
            self.remove_stale_sockets();
            return status;
        }
        self.kill();
        self.exit.expect("killed and reaped")
    }

    fn signal(&mut self, sig: i32) {
        if self.try_exit_status().is_none() {
            // SAFETY: kill(2) with the pid of our own, not yet reaped, child.
            unsafe {
                sys::kill(self.child.id() as i32, sig);
            }
        }
    }

    /// Kills the process (SIGKILL) and waits for it. Idempotent.
    pub fn kill(&mut self) {
        if self.try_exit_status().is_none() {
            let _ = self.child.kill();
            if let Ok(status) = self.child.wait() {
                self.exit = Some(status);
            }
        }
        self.remove_stale_sockets();
    }

    /// A killed runtime cannot remove its diagnostic socket and debugger pipes: remove the
    /// sockets it had at ready time, and the pipes of the same pid and key (the key, its start
    /// time, keeps a process that reuses the pid apart).
    fn remove_stale_sockets(&mut self) {
        for socket in self.sockets.drain(..) {
            let pipes = socket
                .file_name()
                .and_then(|name| name.to_str())
                .and_then(|name| name.strip_prefix("dotnet-diagnostic-"))
                .and_then(|name| name.strip_suffix("-socket"))
                .map(|pid_key| {
                    ["in", "out"]
                        .map(|end| socket.with_file_name(format!("clr-debug-pipe-{pid_key}-{end}")))
                });
            let _ = std::fs::remove_file(&socket);
            for pipe in pipes.into_iter().flatten() {
                let _ = std::fs::remove_file(pipe);
            }
        }
    }

    /// The command line the target runs with, for messages.
    pub fn describe(&self) -> String {
        let mut parts: Vec<OsString> = vec![format!("{}.dll", self.name).into()];
        parts.extend(self.args.iter().map(OsString::from));
        format!("{parts:?} (pid {})", self.pid())
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The kernel's CPU account of a target's threads ([`Target::threads`]), read every 50 ms on a
/// thread of its own until [`ThreadCpuLog::finish`]: the ground truth over whatever span a
/// profile turns out to cover, which a command's own start and stop would otherwise blur (on a
/// loaded machine the split drifts from second to second).
pub struct ThreadCpuLog {
    stop: Arc<AtomicBool>,
    reader: Option<thread::JoinHandle<Vec<Reading>>>,
}

/// (unix nanos, CPU ticks per thread name).
type Reading = (i64, HashMap<String, u64>);

impl ThreadCpuLog {
    pub fn start(target: &Target) -> Self {
        let (pid, threads) = (target.pid(), target.threads());
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let reader = thread::spawn(move || {
            let mut readings = Vec::new();
            loop {
                let last = stopped.load(Ordering::Relaxed);
                let ticks = threads
                    .iter()
                    .map(|(name, tid)| (name.clone(), thread_cpu_ticks(pid, *tid)))
                    .collect();
                readings.push((receiver::unix_nanos() as i64, ticks));
                if last {
                    return readings;
                }
                thread::sleep(Duration::from_millis(50));
            }
        });
        ThreadCpuLog {
            stop,
            reader: Some(reader),
        }
    }

    /// Stops reading: the readings so far.
    pub fn finish(mut self) -> CpuReadings {
        self.stop.store(true, Ordering::Relaxed);
        let reader = self.reader.take().expect("finished once");
        CpuReadings(reader.join().expect("the CPU reader does not panic"))
    }
}

impl Drop for ThreadCpuLog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What a [`ThreadCpuLog`] read.
pub struct CpuReadings(Vec<Reading>);

impl CpuReadings {
    /// Ticks each thread got between the readings nearest to `from` and to `until` (unix
    /// nanos), which the readings must span.
    pub fn between(&self, from: i64, until: i64) -> HashMap<String, u64> {
        let (first, last) = (self.0[0].0, self.0[self.0.len() - 1].0);
        assert!(
            first <= from && until <= last,
            "CPU read from {first} to {last}, asked for {from}..{until}"
        );
        let nearest = |t: i64| {
            &self
                .0
                .iter()
                .min_by_key(|(at, _)| (at - t).abs())
                .expect("readings")
                .1
        };
        let (start, end) = (nearest(from), nearest(until));
        end.iter()
            .map(|(name, ticks)| (name.clone(), ticks - start[name]))
            .collect()
    }
}

/// `go tool pprof -top` of one sample type: flat value per function name (times in seconds).
pub fn pprof_top(file: &Path, sample_index: &str) -> HashMap<String, f64> {
    pprof_table(file, sample_index, 0)
}

/// Like [`pprof_top`], but each function's cumulative value (its own and its callees').
pub fn pprof_cum(file: &Path, sample_index: &str) -> HashMap<String, f64> {
    pprof_table(file, sample_index, 3)
}

/// One column of `go tool pprof -top` by function: 0 flat, 3 cum.
fn pprof_table(file: &Path, sample_index: &str, column: usize) -> HashMap<String, f64> {
    let output = Command::new("go")
        .args(["tool", "pprof", "-top", "-nodecount=1000"])
        .arg(format!("-sample_index={sample_index}"))
        .arg(file)
        .output()
        .expect("go tool pprof (installed by `make setup`)");
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    let mut flat = HashMap::new();
    let mut in_table = false;
    for line in text.lines() {
        if line.trim_start().starts_with("flat") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        // flat flat% sum% cum cum% name…
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 6 {
            continue;
        }
        let value = fields[column];
        let name: Vec<&str> = fields[5..].to_vec();
        flat.insert(name.join(" "), parse_pprof_value(value));
    }
    assert!(!flat.is_empty(), "no rows in\n{text}");
    flat
}

/// pprof prints times with units (`1.23s`, `450ms`, `12us`) and counts bare.
pub fn parse_pprof_value(text: &str) -> f64 {
    for (unit, scale) in [("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9), ("s", 1.0)] {
        if let Some(number) = text.strip_suffix(unit) {
            return number.parse::<f64>().unwrap() * scale;
        }
    }
    text.parse().unwrap()
}

/// The span a pprof file says its samples cover, in unix nanos, as `go tool pprof -raw` reads
/// its `time_nanos` and `duration_nanos` (`Time: 2026-11-30 12:17:01.248587341 +0000 UTC` and
/// `Duration: 5.00`, the first four characters of Go's duration, in seconds for 1–999 s).
pub fn pprof_span(file: &Path) -> (i64, i64) {
    let output = Command::new("go")
        .args(["tool", "pprof", "-raw"])
        .arg(file)
        .output()
        .expect("go tool pprof (installed by `make setup`)");
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
            .trim()
            .to_string()
    };
    let time = field("Time:");
    // Go adds the zone's abbreviation after the offset.
    let (time, _zone) = time.rsplit_once(' ').unwrap();
    let start = chrono::DateTime::parse_from_str(time, "%Y-%m-%d %H:%M:%S%.f %z")
        .unwrap_or_else(|e| panic!("{time:?}: {e}"))
        .timestamp_nanos_opt()
        .unwrap();
    let seconds: f64 = field("Duration:")
        .parse()
        .expect("a duration of at least a second");
    (start, start + (seconds * 1e9) as i64)
}

/// Makes a CpuHot's spinning threads wait for a core: all of them onto the first CPU, `niced` at
/// nice 10. The kernel then runs them about 9:1 (CFS weights 1024 and 110), while the runtime's
/// sampler finds each in managed code at every tick: runnable is not running.
pub fn crowd_onto_one_core(target: &Target, niced: &str) {
    for (name, tid) in target.threads() {
        let tid = tid as libc::pid_t;
        // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and sched_setaffinity only read it.
        let pinned = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set)
        };
        assert_eq!(
            pinned,
            0,
            "pin {name} ({tid}): {}",
            std::io::Error::last_os_error()
        );
        if name == niced {
            // SAFETY: setpriority has no memory preconditions; on Linux a tid names one thread.
            let reniced = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10) };
            assert_eq!(
                reniced,
                0,
                "renice {name}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// User plus system CPU of one thread so far, in clock ticks (`/proc/PID/task/TID/stat` fields 14
/// and 15); 0 once the thread is gone.
pub fn thread_cpu_ticks(pid: u32, tid: u64) -> u64 {
    cpu_ticks(&format!("/proc/{pid}/task/{tid}/stat"))
}

/// Time one thread has spent on a CPU plus waiting on a run queue, in ns (the first two fields
/// of `/proc/PID/task/TID/schedstat`); 0 once the thread is gone.
pub fn thread_runnable_ns(pid: u32, tid: u64) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat"))
        .ok()
        .map(|stat| {
            stat.split_whitespace()
                .take(2)
                .filter_map(|n| n.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0)
}

/// User plus system CPU of a whole process so far (`/proc/PID/stat`; `self` for this one), in ms
/// (clock ticks of 10 ms: USER_HZ is 100 on Linux); 0 once it is gone.
pub fn process_cpu_ms(pid: &str) -> f64 {
    cpu_ticks(&format!("/proc/{pid}/stat")) as f64 * 10.0
}

/// `mean (min–max)` of a benchmark's repeated measurements, to three decimals.
pub fn mean_and_range(values: &[f64]) -> String {
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{mean:.3} ({min:.3}–{max:.3})")
}

/// utime + stime of a `stat` file of procfs, in clock ticks; 0 once it is gone.
fn cpu_ticks(path: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|stat| collector::discovery::parse_cpu_ticks(&stat))
        .unwrap_or(0)
}

/// How long ago process `pid` started, by the kernel: the uptime less its start time.
pub fn process_age(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the target runs");
    // Field 22, counted after the command's closing parenthesis (field 2 may hold spaces).
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    let start_ticks: f64 = after_comm.split(' ').nth(19).unwrap().parse().unwrap();
    let uptime = std::fs::read_to_string("/proc/uptime").unwrap();
    let uptime: f64 = uptime.split(' ').next().unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Duration::from_secs_f64((uptime - start_ticks / ticks_per_second).max(0.0))
}
