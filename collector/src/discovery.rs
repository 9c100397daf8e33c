//! Connect-mode discovery: where a runtime's default diagnostic socket is.
//!
//! A .NET runtime listens on `{TMPDIR or /tmp}/dotnet-diagnostic-{pid}-{key}-socket`, where `pid` is
//! its pid *inside its own pid namespace* and `key` is its start time in clock ticks since boot
//! (field 22 of `/proc/PID/stat`). To reach a runtime in a container we look through
//! `/proc/PID/root`, which needs the same user or CAP_SYS_PTRACE.
//!
//! A socket is trusted only when its owner is the process's user: anyone can create a file named
//! `dotnet-diagnostic-{pid}-…-socket` in a shared `/tmp`, and a process listening on it would
//! otherwise be taken for another user's runtime ([`socket_trusted`]).
//!
//! A socket whose key is not the process's start time was left by an earlier process that had the
//! same pid (a runtime killed before it could remove its socket): it is not this process's, and
//! connecting to it would only be refused. Sockets pile up where runtimes are SIGKILLed, and pids
//! are reused, so a process that is not .NET at all may find one with its pid. Only when the
//! start time cannot be read does the newest socket of the pid stand in.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The longest path a Unix socket address holds (`sun_path`, including the NUL).
const SUN_PATH_MAX: usize = 108;

/// Why a process's diagnostic socket could not be found.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiscoveryError {
    #[error("no process with pid {pid} (is it still running?)")]
    NoSuchProcess { pid: u32 },
    #[error(
        "no diagnostic socket for pid {pid} under {dir}: is it a .NET ≥5 process with diagnostics \
         enabled (DOTNET_EnableDiagnostics not 0), and can this user see its /tmp?"
    )]
    NoSocket { pid: u32, dir: PathBuf },
    #[error(
        "cannot look into {path} for pid {pid}: {source}; run clrscope as the target's user or \
         as root (CAP_SYS_PTRACE), and for containers share the pid namespace (`hostPID`/`pid: host`)"
    )]
    Access {
        pid: u32,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "refusing {path} for pid {pid}: the socket is owned by uid {owner} but the process runs \
         as uid {}; another user's process may have planted it", match uid { Some(uid) => uid.to_string(), None => "unknown".into() }
    )]
    UntrustedSocket {
        pid: u32,
        path: PathBuf,
        owner: u32,
        uid: Option<u32>,
    },
    #[error("cannot list {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// How a process's default diagnostic socket is reached from here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessLocation {
    /// The pid as this tool sees it.
    pub pid: u32,
    /// The pid inside the process's own pid namespace: the number in its socket name and the one
    /// ProcessInfo returns.
    pub namespace_pid: u32,
    /// The directory its runtime creates its socket in, as seen from here.
    pub socket_dir: PathBuf,
    /// Field 22 of `/proc/PID/stat`: the runtime's disambiguation key on Linux.
    pub start_time: Option<u64>,
    /// The process's effective uid (`Uid:` of `/proc/PID/status`), as this tool's user namespace
    /// sees it, like the owners of the files it lists.
    pub uid: Option<u32>,
}

/// A diagnostic socket found for a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiagnosticSocket {
    pub pid: u32,
    pub namespace_pid: u32,
    pub path: PathBuf,
}

impl DiagnosticSocket {
    /// Socket paths longer than `sun_path` cannot be connected to; say so up front.
    pub fn path_too_long(&self) -> bool {
        self.path.as_os_str().len() >= SUN_PATH_MAX
    }
}

/// Reads how to reach `pid`'s socket from `/proc`.
pub fn locate(proc_root: &Path, pid: u32) -> Result<ProcessLocation, DiscoveryError> {
    let proc_dir = proc_root.join(pid.to_string());
    let status = match crate::local::read_proc_file(&proc_dir.join("status")) {
        Ok(status) => String::from_utf8_lossy(&status).into_owned(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(DiscoveryError::NoSuchProcess { pid })
        }
        Err(source) => {
            return Err(DiscoveryError::Access {
                pid,
                path: proc_dir.join("status"),
                source,
            })
        }
    };
    let ns_pids = parse_nspid(&status).unwrap_or_else(|| vec![pid]);
    let uid = parse_effective_uid(&status);
    let namespace_pid = ns_pids.last().copied().unwrap_or(pid);
    let in_other_namespace = ns_pids.len() > 1;

    // The target's own TMPDIR decides where its runtime put the socket. When its environment is
    // unreadable (another user), fall back to ours, as the official client does.
    let tmp_dir = crate::local::read_proc_file(&proc_dir.join("environ"))
        .ok()
        .and_then(|environ| environ_var(&environ, b"TMPDIR"))
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or_else(own_tmp_dir);
    let socket_dir = if in_other_namespace {
        let relative = tmp_dir.strip_prefix("/").unwrap_or(&tmp_dir);
        proc_dir.join("root").join(relative)
    } else {
        tmp_dir
    };
    let start_time = crate::local::start_time(&proc_dir);
    Ok(ProcessLocation {
        pid,
        namespace_pid,
        socket_dir,
        start_time,
        uid,
    })
}

/// Finds the diagnostic socket of one process.
pub fn find_socket(pid: u32) -> Result<DiagnosticSocket, DiscoveryError> {
    find_socket_in(Path::new("/proc"), pid)
}

/// [`find_socket`] with another procfs root (for tests).
pub fn find_socket_in(proc_root: &Path, pid: u32) -> Result<DiagnosticSocket, DiscoveryError> {
    let location = locate(proc_root, pid)?;
    let entries =
        list_sockets(&location.socket_dir, |p| p == location.namespace_pid).map_err(|source| {
            match source.kind() {
                io::ErrorKind::PermissionDenied => DiscoveryError::Access {
                    pid,
                    path: location.socket_dir.clone(),
                    source,
                },
                _ => DiscoveryError::NoSocket {
                    pid,
                    dir: location.socket_dir.clone(),
                },
            }
        })?;
    if let Some(socket) = pick_socket(&location, &entries) {
        return Ok(socket);
    }
    match entries
        .iter()
        .find(|entry| entry.pid == location.namespace_pid && !socket_trusted(&location, entry))
    {
        Some(untrusted) => Err(DiscoveryError::UntrustedSocket {
            pid,
            path: untrusted.path.clone(),
            owner: untrusted.owner,
            uid: location.uid,
        }),
        None => Err(DiscoveryError::NoSocket {
            pid,
            dir: location.socket_dir,
        }),
    }
}

/// Every process under `proc_root` that has a diagnostic socket, with problems reported per process.
///
/// Each socket directory is listed once, however many processes share it.
pub fn scan(proc_root: &Path) -> Result<Vec<DiagnosticSocket>, DiscoveryError> {
    Scanner::new(proc_root).scan()
}

/// [`scan`] again and again (the agent's discovery): a process's location is read once for each
/// process (its pid and start time), not on every scan, and a known pid's start time is read
/// again every [`RECHECK_SCANS`] scans, so a scan of a node reads a `/proc` file for a fifth of
/// its processes.
#[derive(Debug)]
pub struct Scanner {
    proc_root: PathBuf,
    /// Where each process seen last time is reached, by pid.
    located: HashMap<u32, ProcessLocation>,
    scans: u64,
}

/// A known pid's start time is read again on one scan in this many (staggered by pid), which is
/// how late a process that took over an exited one's pid is located. Reading every process's
/// `stat` on every scan, which makes the kernel add up the CPU time of all its threads, was most
/// of a node agent's discovery.
pub const RECHECK_SCANS: u64 = 5;

impl Scanner {
    pub fn new(proc_root: &Path) -> Scanner {
        Scanner {
            proc_root: proc_root.to_path_buf(),
            located: HashMap::new(),
            scans: 0,
        }
    }

    /// Every process that has a diagnostic socket now.
    pub fn scan(&mut self) -> Result<Vec<DiagnosticSocket>, DiscoveryError> {
        let pids = list_pids(&self.proc_root)?;
        let mut located = HashMap::with_capacity(pids.len());
        self.scans += 1;
        for pid in pids {
            // A pid whose start time is unchanged is the same process: its location stands.
            let recheck = (u64::from(pid) + self.scans).is_multiple_of(RECHECK_SCANS);
            let known = self.located.remove(&pid).filter(|known| {
                known.start_time.is_some()
                    && (!recheck
                        || crate::local::start_time(&self.proc_root.join(pid.to_string()))
                            == known.start_time)
            });
            // Processes that vanish or hide mid-scan are simply not .NET processes we can reach.
            if let Some(location) = known.or_else(|| locate(&self.proc_root, pid).ok()) {
                located.insert(pid, location);
            }
        }
        self.located = located;
        // Only the sockets of pids located in a directory are looked at: a shared `/tmp` can
        // hold thousands that SIGKILLed runtimes left.
        let mut wanted: HashMap<&Path, HashSet<u32>> = HashMap::new();
        for location in self.located.values() {
            wanted
                .entry(&location.socket_dir)
                .or_default()
                .insert(location.namespace_pid);
        }
        let listings: HashMap<&Path, Vec<SocketEntry>> = wanted
            .into_iter()
            .map(|(dir, pids)| {
                let entries = list_sockets(dir, |pid| pids.contains(&pid)).unwrap_or_default();
                (dir, entries)
            })
            .collect();
        let mut found: Vec<DiagnosticSocket> = self
            .located
            .values()
            .filter_map(|location| pick_socket(location, listings.get(&*location.socket_dir)?))
            .collect();
        found.sort_by_key(|socket| socket.pid);
        Ok(found)
    }
}

/// A `dotnet-diagnostic-{pid}-{key}-socket` socket (not a link to one).
#[derive(Debug, Clone, PartialEq, Eq)]
struct SocketEntry {
    pid: u32,
    key: u64,
    path: PathBuf,
    modified: Option<SystemTime>,
    /// The socket file's owner.
    owner: u32,
}

/// The sockets in `dir` of the pids `wanted` says.
fn list_sockets(dir: &Path, wanted: impl Fn(u32) -> bool) -> io::Result<Vec<SocketEntry>> {
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let Some((pid, key)) = parse_socket_name(&entry.file_name()) else {
            continue;
        };
        if !wanted(pid) {
            continue;
        }
        // `DirEntry::metadata` does not follow links: a link named like a socket is skipped.
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        if !meta.file_type().is_socket() {
            continue;
        }
        entries.push(SocketEntry {
            pid,
            key,
            path: entry.path(),
            modified: meta.modified().ok(),
            owner: meta.uid(),
        });
    }
    Ok(entries)
}

/// The one rule for trusting a diagnostic socket: its owner is the process's user. The runtime
/// creates its socket as the process's user, so any other owner means someone else made it; a
/// process whose uid is unreadable is not trusted.
fn socket_trusted(location: &ProcessLocation, entry: &SocketEntry) -> bool {
    location.uid == Some(entry.owner)
}

fn pick_socket(location: &ProcessLocation, entries: &[SocketEntry]) -> Option<DiagnosticSocket> {
    entries
        .iter()
        .filter(|entry| entry.pid == location.namespace_pid && socket_trusted(location, entry))
        .filter(|entry| location.start_time.is_none_or(|start| entry.key == start))
        .max_by_key(|entry| entry.modified)
        .map(|entry| DiagnosticSocket {
            pid: location.pid,
            namespace_pid: location.namespace_pid,
            path: entry.path.clone(),
        })
}

fn list_pids(proc_root: &Path) -> Result<Vec<u32>, DiscoveryError> {
    let read = fs::read_dir(proc_root).map_err(|source| DiscoveryError::Io {
        path: proc_root.to_path_buf(),
        source,
    })?;
    let mut pids: Vec<u32> = read
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    Ok(pids)
}

fn own_tmp_dir() -> PathBuf {
    std::env::var_os("TMPDIR")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"))
}

/// Parses `dotnet-diagnostic-{pid}-{key}-socket` into `(pid, key)`.
fn parse_socket_name(name: &OsStr) -> Option<(u32, u64)> {
    let name = name.to_str()?;
    let rest = name
        .strip_prefix("dotnet-diagnostic-")?
        .strip_suffix("-socket")?;
    let (pid, key) = rest.split_once('-')?;
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(pid) || !all_digits(key) {
        return None;
    }
    Some((pid.parse().ok()?, key.parse().ok()?))
}

/// The `NSpid:` line of `/proc/PID/status`: the pid in each nested namespace, outermost first.
pub(crate) fn parse_nspid(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let pids: Option<Vec<u32>> = line.split_whitespace().map(|p| p.parse().ok()).collect();
    pids.filter(|p| !p.is_empty())
}

/// The effective uid in the `Uid:` line of `/proc/PID/status` (real, effective, saved, fs).
fn parse_effective_uid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Field 22 (`starttime`) of `/proc/PID/stat`, read after the last `)` since `comm` may hold spaces.
pub(crate) fn parse_start_time(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Fields after `comm` start at field 3 (state); starttime is field 22.
    after_comm.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` or `/proc/PID/task/TID/stat`, in clock
/// ticks: the CPU time the kernel accounted to the process or thread so far.
pub fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace().skip(14 - 3);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    user.checked_add(system)
}

/// Field 2 (`comm`) of a `/proc/PID/stat` or `/proc/PID/task/TID/stat`: the name the
/// `comm` file holds, between the first `(` and the last `)` since it may hold either.
pub(crate) fn parse_comm(stat: &str) -> Option<&str> {
    stat.get(stat.find('(')? + 1..stat.rfind(')')?)
}

/// One variable of a NUL-separated `/proc/PID/environ`.
fn environ_var(environ: &[u8], name: &[u8]) -> Option<PathBuf> {
    environ.split(|&b| b == 0).find_map(|entry| {
        let value = entry.strip_prefix(name)?.strip_prefix(b"=")?;
        Some(PathBuf::from(OsStr::from_bytes(value)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn socket_names() {
        let parse = |s: &str| parse_socket_name(OsStr::new(s));
        assert_eq!(
            parse("dotnet-diagnostic-4242-123456-socket"),
            Some((4242, 123456))
        );
        assert_eq!(parse("dotnet-diagnostic-4242--socket"), None);
        assert_eq!(parse("dotnet-diagnostic-42a-1-socket"), None);
        assert_eq!(parse("dotnet-diagnostic-dsrouter-42-1-socket"), None);
        assert_eq!(parse("dotnet-diagnostic-1-2-3-socket"), None);
        assert_eq!(parse("dotnet-diagnostic-99999999999-1-socket"), None);
        assert_eq!(parse("clr-debug-pipe-42-1-in"), None);
    }

    #[test]
    fn nspid_lines() {
        assert_eq!(
            parse_nspid("Name:\tdotnet\nNSpid:\t81234\t1\n"),
            Some(vec![81234, 1])
        );
        assert_eq!(parse_nspid("NSpid:\t77\n"), Some(vec![77]));
        assert_eq!(parse_nspid("Name:\tx\n"), None);
        assert_eq!(parse_nspid("NSpid:\t\n"), None);
        assert_eq!(parse_nspid("NSpid:\tabc\n"), None);
    }

    #[test]
    fn stat_fields_skip_names_with_spaces_and_parens() {
        let stat =
            "4242 (my (odd) app) S 1 4242 4242 0 -1 4194560 1 0 0 0 5 2 0 0 20 0 7 0 987654 1 2";
        assert_eq!(parse_start_time(stat), Some(987654));
        assert_eq!(parse_start_time("4242 (short) S 1 2"), None);
        assert_eq!(parse_start_time("no paren"), None);
        assert_eq!(parse_cpu_ticks(stat), Some(5 + 2));
        assert_eq!(parse_cpu_ticks("4242 (short) S 1 2"), None);
        assert_eq!(parse_cpu_ticks("no paren"), None);
    }

    #[test]
    fn environ_lookup() {
        let environ = b"PATH=/bin\0TMPDIR=/var/tmp/x\0TMPDIRX=no\0";
        assert_eq!(
            environ_var(environ, b"TMPDIR"),
            Some(PathBuf::from("/var/tmp/x"))
        );
        assert_eq!(environ_var(environ, b"HOME"), None);
    }

    /// Builds a fake procfs entry for one process.
    fn fake_proc(root: &Path, pid: u32, nspid: &str, tmpdir: Option<&Path>, start: u64) {
        let dir = root.join(pid.to_string());
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("status"),
            format!(
                "Name:\tdotnet\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nNSpid:\t{nspid}\n",
                uid = own_euid()
            ),
        )
        .unwrap();
        let environ = tmpdir
            .map(|t| format!("A=b\0TMPDIR={}\0", t.display()))
            .unwrap_or_default();
        fs::write(dir.join("environ"), environ).unwrap();
        let fields: Vec<String> = (3..=21).map(|i| i.to_string()).collect();
        fs::write(
            dir.join("stat"),
            format!("{pid} (dotnet) {} {start} 0 0", fields.join(" ")),
        )
        .unwrap();
    }

    /// This test's effective uid, the owner of the sockets it binds.
    fn own_euid() -> u32 {
        fs::metadata("/proc/self").unwrap().uid()
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("clrscope-discovery-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn prefers_socket_matching_start_time_over_newer_stale_one() {
        let base = temp_dir("start-time");
        let proc_root = base.join("proc");
        let tmp = base.join("tmp");
        fs::create_dir_all(&tmp).unwrap();
        fake_proc(&proc_root, 500, "500", Some(&tmp), 1111);
        let _right = UnixListener::bind(tmp.join("dotnet-diagnostic-500-1111-socket")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let _stale = UnixListener::bind(tmp.join("dotnet-diagnostic-500-999-socket")).unwrap();
        let _other = UnixListener::bind(tmp.join("dotnet-diagnostic-501-1-socket")).unwrap();

        let found = find_socket_in(&proc_root, 500).unwrap();
        assert_eq!(found.path, tmp.join("dotnet-diagnostic-500-1111-socket"));
        assert_eq!(found.namespace_pid, 500);
        // Only an earlier process's socket left: this process has none.
        fs::remove_file(tmp.join("dotnet-diagnostic-500-1111-socket")).unwrap();
        assert!(matches!(
            find_socket_in(&proc_root, 500),
            Err(DiscoveryError::NoSocket { pid: 500, .. })
        ));
        assert!(scan(&proc_root).unwrap().is_empty());
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn container_process_is_found_through_its_root_with_its_namespace_pid() {
        let base = temp_dir("container");
        let proc_root = base.join("proc");
        fake_proc(&proc_root, 7000, "7000\t1", Some(Path::new("/scratch")), 5);
        let inside = proc_root.join("7000/root/scratch");
        fs::create_dir_all(&inside).unwrap();
        let _sock = UnixListener::bind(inside.join("dotnet-diagnostic-1-5-socket")).unwrap();

        let found = find_socket_in(&proc_root, 7000).unwrap();
        assert_eq!(found.pid, 7000);
        assert_eq!(found.namespace_pid, 1);
        assert_eq!(found.path, inside.join("dotnet-diagnostic-1-5-socket"));

        let all = scan(&proc_root).unwrap();
        assert_eq!(all, vec![found]);
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_scanner_locates_each_process_once_until_its_start_time_changes() {
        let base = temp_dir("scanner");
        let proc_root = base.join("proc");
        let (first, second) = (base.join("first"), base.join("second"));
        fs::create_dir_all(&first).unwrap();
        fs::create_dir_all(&second).unwrap();
        fake_proc(&proc_root, 800, "800", Some(&first), 3);
        let _in_first = UnixListener::bind(first.join("dotnet-diagnostic-800-3-socket")).unwrap();
        let _in_second = UnixListener::bind(second.join("dotnet-diagnostic-800-4-socket")).unwrap();
        let mut scanner = Scanner::new(&proc_root);
        let found = scanner.scan().unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].path, first.join("dotnet-diagnostic-800-3-socket"));

        // The same process (same start time): its environment is not read again.
        fake_proc(&proc_root, 800, "800", Some(&second), 3);
        assert_eq!(scanner.scan().unwrap(), found);
        // Another process under the pid: located anew within RECHECK_SCANS scans.
        fake_proc(&proc_root, 800, "800", Some(&second), 4);
        let found = (0..RECHECK_SCANS)
            .map(|_| scanner.scan().unwrap())
            .last()
            .unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].path, second.join("dotnet-diagnostic-800-4-socket"));
        // Gone: forgotten.
        fs::remove_dir_all(proc_root.join("800")).unwrap();
        assert!(scanner.scan().unwrap().is_empty());
        assert!(scanner.located.is_empty());
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn comm_of_a_stat_line() {
        assert_eq!(parse_comm("12 (dotnet) S 1 2"), Some("dotnet"));
        assert_eq!(parse_comm("12 (a) (b)) R 1"), Some("a) (b)"));
        assert_eq!(parse_comm("12 () S"), Some(""));
        assert_eq!(parse_comm("12 dotnet S"), None);
        assert_eq!(parse_comm("12 )x( S"), None);
    }

    #[test]
    fn missing_process_and_missing_socket_are_told_apart() {
        let base = temp_dir("missing");
        let proc_root = base.join("proc");
        let tmp = base.join("tmp");
        fs::create_dir_all(&tmp).unwrap();
        fake_proc(&proc_root, 42, "42", Some(&tmp), 1);
        assert!(matches!(
            find_socket_in(&proc_root, 43),
            Err(DiscoveryError::NoSuchProcess { pid: 43 })
        ));
        let err = find_socket_in(&proc_root, 42).unwrap_err();
        assert!(matches!(err, DiscoveryError::NoSocket { pid: 42, .. }));
        assert!(err.to_string().contains(&tmp.display().to_string()));
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn uid_lines() {
        assert_eq!(parse_effective_uid("Uid:\t1000\t0\t0\t0\n"), Some(0));
        assert_eq!(parse_effective_uid("Uid:\t1000\n"), None);
        assert_eq!(parse_effective_uid("Name:\tx\n"), None);
    }

    #[test]
    fn a_socket_of_another_user_or_a_link_is_not_trusted() {
        let base = temp_dir("spoof");
        let proc_root = base.join("proc");
        let tmp = base.join("tmp");
        fs::create_dir_all(&tmp).unwrap();
        fake_proc(&proc_root, 600, "600", Some(&tmp), 7);
        let planted = tmp.join("dotnet-diagnostic-600-7-socket");
        let _listener = UnixListener::bind(&planted).unwrap();
        let other = own_euid().wrapping_add(1);
        std::os::unix::fs::lchown(&planted, Some(other), None).unwrap();

        let err = find_socket_in(&proc_root, 600).unwrap_err();
        assert!(
            matches!(&err, DiscoveryError::UntrustedSocket { owner, .. } if *owner == other),
            "{err}"
        );
        assert!(err.to_string().contains("planted"), "{err}");
        assert!(scan(&proc_root).unwrap().is_empty());

        // A link named like a socket, to a socket this user owns, is no socket either.
        fs::remove_file(&planted).unwrap();
        let real = base.join("real.sock");
        let _real = UnixListener::bind(&real).unwrap();
        std::os::unix::fs::symlink(&real, &planted).unwrap();
        assert!(matches!(
            find_socket_in(&proc_root, 600),
            Err(DiscoveryError::NoSocket { .. })
        ));
        fs::remove_dir_all(&base).unwrap();
    }
}
