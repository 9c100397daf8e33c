//! The agent next to hostile targets (issue 18): a fake runtime (`support/fake_runtime.py`)
//! that speaks the diagnostics IPC protocol as user `nobody` (when the test runs as root, through
//! `setpriv`) plants a symbolic link or a FIFO where the agent asked for a dump, names its socket
//! after another user's process, or answers every session with a crafted nettrace stream. Each
//! time the agent must answer with a clear error, stay up, keep its peak RSS under 256 MiB, and
//! read or change no file outside its own directories.

use crate::support;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use support::agent::{data_dir, Agent};
use support::ScratchDir;

/// The most the agent may hold at its peak, whatever a target sends.
const PEAK_RSS_LIMIT_KIB: u64 = 256 * 1024;
/// `nobody` on Debian and most distributions.
const NOBODY: u32 = 65534;

fn running_as_root() -> bool {
    std::fs::metadata("/proc/self").unwrap().uid() == 0
}

/// The command that runs Python as `nobody`: `setpriv` and the system's Python (a user's own,
/// e.g. pyenv's under /root, is out of nobody's reach) when the test is root and has both; else
/// `python3` as the test's own user.
fn python_as_nobody() -> Option<Command> {
    let (setpriv, python) = (Path::new("/usr/bin/setpriv"), Path::new("/usr/bin/python3"));
    if !(running_as_root() && setpriv.exists() && python.exists()) {
        return None;
    }
    let mut command = Command::new(setpriv);
    command
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(python);
    Some(command)
}

/// A scratch directory the fake runtime (as `nobody`) can write: its TMPDIR, holding its socket
/// and a copy of its script.
fn scratch(name: &str) -> ScratchDir {
    let dir = ScratchDir::new(&format!("hostile-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    if running_as_root() {
        std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let script = dir.join("fake_runtime.py");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/fake_runtime.py"),
        &script,
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    dir
}

/// The fake runtime, killed on drop.
struct FakeRuntime {
    child: Child,
    lines: mpsc::Receiver<String>,
}

/// Any other process the test starts, killed on drop.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl FakeRuntime {
    /// Starts `fake_runtime.py` in `dir` with `args`, and waits until it listens.
    fn start(dir: &Path, args: &[&str], extra_env: &[(&str, &str)]) -> FakeRuntime {
        let mut command = python_as_nobody().unwrap_or_else(|| Command::new("python3"));
        let mut child = command
            .arg(dir.join("fake_runtime.py"))
            .args(["--socket-dir", dir.to_str().unwrap()])
            .args(args)
            .env("TMPDIR", dir)
            .envs(extra_env.iter().copied())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start python3 fake_runtime.py");
        let lines = forward_lines(child.stdout.take().unwrap());
        let runtime = FakeRuntime { child, lines };
        let ready = runtime.next_line(Duration::from_secs(60));
        assert!(
            ready.as_deref().is_some_and(|l| l.starts_with("ready ")),
            "the fake runtime did not start: {ready:?}"
        );
        runtime
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn next_line(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }
}

impl Drop for FakeRuntime {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn forward_lines(stdout: ChildStdout) -> mpsc::Receiver<String> {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                return;
            }
        }
    });
    receive
}

/// An agent that profiles only `pid` (connect mode) and has runtime counters on, so every kind
/// of session it starts meets the target.
fn agent_for(dir: &Path, pid: u32) -> Agent {
    Agent::start(dir, &["--pid", &pid.to_string(), "--rescan-interval", "1s"])
}

/// A root-only file's identity and state: what must not change.
#[derive(Debug, PartialEq)]
struct FileState {
    mode: u32,
    uid: u32,
    ctime: (i64, i64),
    content: Vec<u8>,
}

fn file_state(path: &Path) -> FileState {
    let meta = std::fs::symlink_metadata(path).unwrap();
    FileState {
        mode: meta.mode(),
        uid: meta.uid(),
        ctime: (meta.ctime(), meta.ctime_nsec()),
        content: std::fs::read(path).unwrap(),
    }
}

/// A secret only root reads (0640 root:root, so a chmod to 0600 would show).
fn root_secret(dir: &Path) -> PathBuf {
    let secret = dir.join("secret");
    std::fs::write(&secret, b"ROOT-ONLY-SECRET").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o640)).unwrap();
    secret
}

/// The agent's dump directories left in its temp directory.
fn dump_directories() -> usize {
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("clrscope-dump-")
        })
        .count()
}

fn expect_up_and_small(agent: &Agent, what: &str) -> u64 {
    let processes = agent.get("/api/v1/processes");
    assert_eq!(processes.status, 200, "{what}: the agent stopped answering");
    let peak = agent.peak_rss_kib();
    assert!(
        peak < PEAK_RSS_LIMIT_KIB,
        "{what}: the agent's peak RSS is {peak} KiB; log:\n{}",
        agent.log()
    );
    eprintln!("{what}: agent VmHWM {peak} KiB");
    peak
}

#[test]
fn a_planted_link_or_fifo_is_refused_as_the_dump() {
    let dir = scratch("dump");
    // The secret lives in a root-only directory: nobody cannot reach it but through the agent.
    let vault = dir.join("vault");
    std::fs::create_dir(&vault).unwrap();
    std::fs::set_permissions(&vault, std::fs::Permissions::from_mode(0o700)).unwrap();
    let secret = root_secret(&vault);
    let before = file_state(&secret);
    let dumps_before = dump_directories();

    let link = format!("symlink:{}", secret.display());
    for (plant, refusal) in [
        (link.as_str(), "it is a symbolic link"),
        ("fifo", "it is not a regular file"),
    ] {
        let runtime = FakeRuntime::start(&dir, &["--dump", plant], &[]);
        let data = data_dir("hostile-dump");
        let agent = agent_for(&data, runtime.pid());
        let started = Instant::now();
        let answer = agent.request("GET", &format!("/dump?pid={}&type=Mini", runtime.pid()));
        let body = answer.body.clone();
        assert_eq!(answer.status, 400, "{plant}: {body}\nlog:\n{}", agent.log());
        assert!(body.contains(refusal), "{plant}: {body}");
        assert!(!body.contains("ROOT-ONLY-SECRET"), "{plant}: {body}");
        eprintln!("{plant}: refused in {:?}: {body}", started.elapsed());
        let asked = runtime
            .next_line(Duration::from_secs(5))
            .unwrap_or_default();
        assert!(
            asked.starts_with("dump "),
            "the runtime was not asked: {asked:?}"
        );
        // The next dump is not refused as "too many" (the slot was freed) and the runtime's
        // directory is gone.
        let again = agent.request("GET", &format!("/dump?pid={}&type=Mini", runtime.pid()));
        assert_eq!(again.status, 400, "{plant}, again: {:?}", again.body);
        expect_up_and_small(&agent, plant);
        assert_eq!(
            dump_directories(),
            dumps_before,
            "{plant}: a dump directory was left"
        );
    }
    assert_eq!(
        file_state(&secret),
        before,
        "the secret was read or changed"
    );

    // A genuine dump still comes back whole, through the directory given to nobody.
    let runtime = FakeRuntime::start(&dir, &["--dump", "ok"], &[]);
    let data = data_dir("hostile-dump-ok");
    let agent = agent_for(&data, runtime.pid());
    let answer = agent.request("GET", &format!("/dump?pid={}&type=Mini", runtime.pid()));
    assert_eq!(
        answer.status,
        200,
        "{:?}\nlog:\n{}",
        answer.body,
        agent.log()
    );
    assert_eq!(answer.body, "FAKE-DUMP".repeat(100));
    assert_eq!(dump_directories(), dumps_before);
}

#[test]
fn a_socket_planted_for_another_users_process_is_not_trusted() {
    if python_as_nobody().is_none() {
        eprintln!("skipped: needs root and setpriv to plant a socket as another user");
        return;
    }
    let dir = scratch("spoof");
    // A root process that is no .NET runtime, its TMPDIR where nobody can write.
    let victim = KillOnDrop(
        Command::new("sleep")
            .arg("300")
            .env("TMPDIR", dir.as_os_str())
            .spawn()
            .unwrap(),
    );
    let victim_pid = victim.0.id();
    let runtime = FakeRuntime::start(
        &dir,
        &["--as-pid", &victim_pid.to_string(), "--dump", "ok"],
        &[],
    );

    let clrscope = env!("CARGO_BIN_EXE_clrscope");
    let ps = Command::new(clrscope).arg("ps").output().unwrap();
    let listed = String::from_utf8_lossy(&ps.stdout).to_string();
    assert!(
        !listed
            .lines()
            .any(|l| l.split_whitespace().next() == Some(&victim_pid.to_string())),
        "ps lists the spoofed process:\n{listed}"
    );
    let one = Command::new(clrscope)
        .args(["ps", "--pid", &victim_pid.to_string()])
        .output()
        .unwrap();
    let refusal = String::from_utf8_lossy(&one.stderr).to_string();
    assert!(!one.status.success());
    assert!(
        refusal.contains("owned by uid 65534") && refusal.contains("runs as uid 0"),
        "{refusal}"
    );

    let data = data_dir("hostile-spoof");
    let agent = agent_for(&data, victim_pid);
    let answer = agent.request("GET", &format!("/dump?pid={victim_pid}"));
    assert_ne!(answer.status, 200);
    assert!(
        runtime.next_line(Duration::from_millis(500)).is_none(),
        "the agent sent a command to the planted socket"
    );
    assert!(agent.attached(victim_pid).is_none());
    expect_up_and_small(&agent, "spoofed socket");
}

/// A crafted stream from `benches/hostile_nettrace.py`.
fn crafted_stream(dir: &Path, kind: &str, mib: u32) -> PathBuf {
    let path = dir.join(format!("{kind}.nettrace"));
    let made = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/hostile_nettrace.py"))
        .args([kind, &mib.to_string(), path.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(made.success());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path
}

#[test]
fn crafted_nettrace_sessions_end_with_an_error_and_the_agent_stays_small() {
    let dir = scratch("nettrace");
    for (kind, mib, error) in [
        ("labels", 16, "memory budget"),
        ("metadata", 16, "memory budget"),
        ("stacks", 16, "memory budget"),
        ("counts", 1, "malformed"),
    ] {
        let stream = crafted_stream(&dir, kind, mib);
        let runtime = FakeRuntime::start(&dir, &["--trace", stream.to_str().unwrap()], &[]);
        let data = data_dir("hostile-nettrace");
        let agent = agent_for(&data, runtime.pid());
        let deadline = Instant::now() + Duration::from_secs(120);
        while !agent.log().contains(error) {
            assert!(
                Instant::now() < deadline,
                "{kind}: no {error:?} error in the agent's log:\n{}",
                agent.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        // Let it meet the stream a few more times (every session, every rescan).
        std::thread::sleep(Duration::from_secs(5));
        let peak = expect_up_and_small(&agent, kind);
        eprintln!("crafted {kind} ({mib} MiB per session): peak {peak} KiB");
        let _ = std::fs::remove_file(&stream);
    }
}
