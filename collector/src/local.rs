//! Whether `/proc/<pid>` on this machine is a given runtime: the one decision every reader of a
//! target's `/proc` files (mapped images, thread names) goes through.
//!
//! A runtime's pid is the one it reports (listen mode: the pid inside its own pid namespace) or
//! the one its socket was found under; either may name another process here: a pid namespace
//! apart, or a pid reused after the runtime exited. A process is the runtime only when its
//! innermost pid (`NSpid` in `/proc/PID/status`) is the runtime's own pid and its command line is
//! the one the runtime reports, and exactly one process here is so; each later read checks that
//! the process has not been replaced since (its start time).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::client::DiagnosticsClient;
use crate::discovery::{parse_comm, parse_cpu_ticks, parse_nspid, parse_start_time};

/// At most this many bytes of one `/proc` file are read (`maps` of a big process is ~100 KB).
const MAX_PROC_FILE: u64 = 16 << 20;
/// The first read of a `/proc` file takes this much: a `stat` or `status` in one read (and one
/// more to see the end), where a growing buffer took six; a node agent reads thousands a minute.
const PROC_FILE_FIRST_READ: usize = 4096;
/// At most this many threads' names are read.
const MAX_THREADS: usize = 100_000;

/// A runtime's process, proven to be `/proc/<pid>` on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalProcess {
    /// The pid here.
    pub pid: u32,
    /// The command line: argv[0] as the runtime reports it, the arguments as `/proc` shows them.
    pub command_line: String,
    /// Field 22 of `/proc/PID/stat` when proven; a process with another start time is another.
    start_time: u64,
    /// In a pid namespace below this one: its threads' ids (as the runtime reports them) differ
    /// from their ids here.
    nested: bool,
}

impl LocalProcess {
    /// The process here that is the runtime whose own pid (ProcessInfo's, inside its pid
    /// namespace) is `runtime_pid` and whose command line is `reported_command_line`:
    /// `/proc/<pid_here>` (the pid the runtime was found under) when it is, else the one process
    /// here that is. `None` when none or several are.
    pub fn find(
        runtime_pid: u64,
        pid_here: u64,
        reported_command_line: &str,
    ) -> Option<LocalProcess> {
        Self::find_in(
            Path::new("/proc"),
            runtime_pid,
            pid_here,
            reported_command_line,
        )
    }

    /// Asks the runtime behind `client` who it is, then [`LocalProcess::find`]s it.
    pub async fn of_runtime(client: &DiagnosticsClient, pid_here: u64) -> Option<LocalProcess> {
        let info = client.process_info().await.ok()?;
        Self::find(info.pid, pid_here, &info.command_line)
    }

    /// [`LocalProcess::find`] with another procfs root (for tests).
    pub fn find_in(
        proc_root: &Path,
        runtime_pid: u64,
        pid_here: u64,
        reported_command_line: &str,
    ) -> Option<LocalProcess> {
        let runtime_pid = u32::try_from(runtime_pid).ok()?;
        for likely in [u32::try_from(pid_here).ok(), Some(runtime_pid)] {
            let found = likely
                .and_then(|pid| Self::prove(proc_root, pid, runtime_pid, reported_command_line));
            if found.is_some() {
                return found;
            }
        }
        // A runtime in another pid namespace: its pid here differs from the one it reports.
        let mut found = None;
        for entry in std::fs::read_dir(proc_root).ok()?.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            if let Some(candidate) = Self::prove(proc_root, pid, runtime_pid, reported_command_line)
            {
                if found.is_some() {
                    // Two namespaces each run this program as this pid: neither is proven.
                    return None;
                }
                found = Some(candidate);
            }
        }
        found
    }

    fn prove(
        proc_root: &Path,
        pid: u32,
        runtime_pid: u32,
        reported_command_line: &str,
    ) -> Option<LocalProcess> {
        let dir = proc_root.join(pid.to_string());
        let status = String::from_utf8(read_proc_file(&dir.join("status")).ok()?).ok()?;
        let nspids = parse_nspid(&status).unwrap_or_else(|| vec![pid]);
        let innermost = nspids.last().copied().unwrap_or(pid);
        if innermost != runtime_pid {
            return None;
        }
        let start_time = start_time(&dir)?;
        let command_line = same_command_line(
            &read_proc_file(&dir.join("cmdline")).ok()?,
            reported_command_line,
        )?;
        // Read again: the checks above were of one process, not of a pid reused in between.
        (self::start_time(&dir) == Some(start_time)).then_some(LocalProcess {
            pid,
            command_line,
            start_time,
            nested: nspids.len() > 1,
        })
    }

    /// `/proc/PID/<name>` (at most 16 MiB, not following links), when the process is still the
    /// runtime after reading it.
    pub fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        let dir = Path::new("/proc").join(self.pid.to_string());
        let bytes = read_proc_file(&dir.join(name))?;
        self.check(&dir)?;
        Ok(bytes)
    }

    /// Whether the process is a NativeAOT executable: its runtime is in the executable, so no
    /// `libcoreclr.so` is mapped (every CoreCLR process maps it). `None` when `maps` is unreadable.
    pub fn runs_native_aot(&self) -> Option<bool> {
        let maps = self.read("maps").ok()?;
        let needle = b"/libcoreclr.so";
        Some(!maps.windows(needle.len()).any(|w| w == needle))
    }

    /// What the runtime's sampler kinds are worth, by its product version (ProcessInfo's) and
    /// whether it is NativeAOT ([`crate::samples::untrusted_kinds_of`]).
    pub fn untrusted_kinds(&self, product_version: &str) -> Option<crate::samples::UntrustedKinds> {
        crate::samples::untrusted_kinds_of(product_version, self.runs_native_aot().unwrap_or(false))
    }

    /// Thread names by tid as the runtime reports it (the runtime names OS threads after
    /// managed ones); empty once the process is gone.
    pub fn thread_names(&self) -> HashMap<u64, String> {
        self.thread_cpu().names
    }

    /// The CPU time the kernel has accounted to each thread so far, and each thread's name, read
    /// now from `/proc/PID/task/*/stat`: two readings give the share of a core each thread ran
    /// between them ([`ThreadCpu::cores_since`]).
    pub fn thread_cpu(&self) -> ThreadCpu {
        let dir = Path::new("/proc").join(self.pid.to_string());
        let mut reading = ThreadCpu::new();
        let Ok(tasks) = std::fs::read_dir(dir.join("task")) else {
            return reading;
        };
        for task in tasks.take(MAX_THREADS).flatten() {
            let Some(tid_here) = task.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            let tid = if self.nested {
                let Some(tid) = read_proc_file(&task.path().join("status"))
                    .ok()
                    .and_then(|status| parse_nspid(&String::from_utf8_lossy(&status)))
                    .and_then(|nspids| nspids.last().copied())
                else {
                    continue;
                };
                u64::from(tid)
            } else {
                tid_here
            };
            if let Some(stat) = read_thread_stat(&task.path()) {
                reading.insert(tid, tid_here, stat);
            }
        }
        self.checked(&dir, reading)
    }

    /// [`thread_cpu`](Self::thread_cpu) of the threads `tids` alone (as the runtime reports
    /// them): a sampler window needs only the threads it sampled, the ones with managed frames,
    /// which on an idle service are a few of its dozens. In a nested pid namespace, `earlier` (a
    /// reading of this process) says where each thread is here; a thread it does not place, or
    /// whose place another thread took since, takes a reading of every thread.
    ///
    /// With `files`, each `stat` read stays open for the next reading (see [`StatFiles`]); the
    /// files of threads not in `tids` are closed.
    pub fn thread_cpu_of(
        &self,
        tids: &[u64],
        earlier: Option<&ThreadCpu>,
        mut files: Option<&mut StatFiles>,
    ) -> ThreadCpu {
        let dir = Path::new("/proc").join(self.pid.to_string());
        let tasks = dir.join("task");
        let mut reading = ThreadCpu::new();
        if let Some(files) = files.as_deref_mut() {
            files.readings += 1;
        }
        for &tid in tids.iter().take(MAX_THREADS) {
            let placed = match (self.nested, earlier) {
                (false, _) => Some((tid, None)),
                (true, Some(earlier)) => earlier
                    .here
                    .get(&tid)
                    .map(|&(tid_here, started)| (tid_here, Some(started))),
                (true, None) => None,
            };
            let Some((tid_here, started)) = placed else {
                return self.thread_cpu();
            };
            let task = tasks.join(tid_here.to_string());
            let stat = match files.as_deref_mut() {
                Some(files) => files.thread(&task, tid_here),
                None => read_thread_stat(&task),
            };
            match stat {
                Some(stat) if started.is_none_or(|started| started == stat.start_time) => {
                    reading.insert(tid, tid_here, stat);
                }
                // Gone, or another thread in its place: where the others are is read again.
                _ if self.nested => return self.thread_cpu(),
                _ => {}
            }
        }
        let Some(files) = files else {
            return self.checked(&dir, reading);
        };
        files.close_unread();
        // Read after the threads: none of them is another process's.
        match self.process_cpu(files) {
            Some(process) => {
                reading.process = Some(process);
                reading
            }
            None => ThreadCpu::new(),
        }
    }

    /// `reading`, when the process is still the runtime after it was taken; else empty.
    fn checked(&self, dir: &Path, reading: ThreadCpu) -> ThreadCpu {
        match self.check(dir) {
            Ok(()) => reading,
            Err(_) => ThreadCpu::new(),
        }
    }

    /// The CPU time the kernel has accounted to the whole process so far, from its `stat` file
    /// kept in `files`; `None` once the process is not the runtime any more (and then nothing of
    /// it is read again).
    pub fn process_cpu(&self, files: &mut StatFiles) -> Option<ProcessCpu> {
        let at = Instant::now();
        let dir = Path::new("/proc").join(self.pid.to_string());
        match files.process_stat(&dir) {
            Some(stat) if stat.start_time == self.start_time => Some(ProcessCpu {
                at,
                ticks: stat.ticks,
            }),
            _ => {
                *files = StatFiles::default();
                None
            }
        }
    }

    /// How long ago the process started: the system's uptime less the process's start time.
    pub fn age(&self) -> Option<Duration> {
        let uptime = read_proc_file(Path::new("/proc/uptime")).ok()?;
        let uptime: f64 = std::str::from_utf8(&uptime)
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        let started = self.start_time as f64 / clock_ticks_per_second()?;
        Duration::try_from_secs_f64((uptime - started).max(0.0)).ok()
    }

    /// Whether the pid is still the runtime's process: a caller that read `/proc/PID` files by
    /// other means checks afterwards.
    pub fn verify(&self) -> io::Result<()> {
        self.check(&Path::new("/proc").join(self.pid.to_string()))
    }

    fn check(&self, dir: &Path) -> io::Result<()> {
        if start_time(dir) == Some(self.start_time) {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("pid {} is no longer the runtime's process", self.pid),
            ))
        }
    }
}

/// Each thread's CPU time at one instant, in clock ticks, and its name, by tid as the runtime
/// reports it.
#[derive(Debug, Clone)]
pub struct ThreadCpu {
    at: Instant,
    ticks: HashMap<u64, u64>,
    names: HashMap<u64, String>,
    /// Each thread's tid here and start time: where [`LocalProcess::thread_cpu_of`] finds it
    /// again in a nested pid namespace, and whether it is still the same thread.
    here: HashMap<u64, (u64, u64)>,
    /// The whole process's CPU time, when the reading read it ([`StatFiles`] readings do).
    process: Option<ProcessCpu>,
}

/// The CPU time the kernel has accounted to a whole process at one instant
/// ([`LocalProcess::process_cpu`]).
#[derive(Debug, Clone, Copy)]
pub struct ProcessCpu {
    at: Instant,
    ticks: u64,
}

impl ProcessCpu {
    /// The share of one core the process ran from `earlier` to this reading (1.0: a whole core
    /// all the time).
    pub fn cores_since(&self, earlier: &ProcessCpu) -> Option<f64> {
        let seconds = self.at.saturating_duration_since(earlier.at).as_secs_f64();
        let ticks_per_second = clock_ticks_per_second().filter(|_| seconds > 0.0)?;
        let used = self.ticks.checked_sub(earlier.ticks)? as f64 / ticks_per_second;
        Some(used / seconds)
    }
}

/// What a thread's `stat` says of it.
struct ThreadStat {
    ticks: u64,
    name: String,
    start_time: u64,
}

/// `task/stat` of a thread's `/proc/PID/task/TID` directory.
fn read_thread_stat(task: &Path) -> Option<ThreadStat> {
    thread_stat_of(&open_proc_file(&task.join("stat")).ok()?)
}

/// What an open thread `stat` file says now.
fn thread_stat_of(file: &File) -> Option<ThreadStat> {
    let stat = read_from_start(file).ok()?;
    let stat = String::from_utf8_lossy(&stat);
    Some(ThreadStat {
        ticks: parse_cpu_ticks(&stat)?,
        name: parse_comm(&stat)?.to_string(),
        start_time: parse_start_time(&stat)?,
    })
}

/// The `stat` files a sampler window reads, kept open from one window to the next: its sampled
/// threads' and the process's own (read after the threads', to see that the process was not
/// replaced). Opening and closing them (the path walk through `/proc`) was nearly half of what a
/// node agent spent on reading them. A kept file stays its task's: once the thread or process
/// exits, reading it fails; a thread's is then opened again under its tid, which may be another
/// thread's by then, and the process is not read any more.
///
/// The files kept by all processes together are at most a quarter of the agent's limit on open
/// files ([`kept_files_allowed`]), so that sessions never run short of descriptors.
#[derive(Debug, Default)]
pub struct StatFiles {
    /// By tid here, with the reading that last read it.
    threads: HashMap<u64, (KeptFile, u64)>,
    process: Option<KeptFile>,
    /// Readings taken with these files so far.
    readings: u64,
}

/// Files all [`StatFiles`] keep open now.
static KEPT_FILES: AtomicUsize = AtomicUsize::new(0);

/// How many files [`StatFiles`] may keep open together: a quarter of the soft limit on open
/// files (`RLIMIT_NOFILE`), at most 16384.
fn kept_files_allowed() -> usize {
    static ALLOWED: OnceLock<usize> = OnceLock::new();
    *ALLOWED.get_or_init(|| {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct it is given.
        let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
        if read {
            usize::try_from(limit.rlim_cur / 4)
                .unwrap_or(usize::MAX)
                .min(16384)
        } else {
            0
        }
    })
}

/// A file kept open in one of [`KEPT_FILES`]' places, which it gives back when dropped.
#[derive(Debug)]
struct KeptFile(File);

impl KeptFile {
    /// Keeps `file` when the budget has a place for it.
    fn keep(file: File) -> Option<KeptFile> {
        if KEPT_FILES.fetch_add(1, Ordering::Relaxed) < kept_files_allowed() {
            return Some(KeptFile(file));
        }
        KEPT_FILES.fetch_sub(1, Ordering::Relaxed);
        None
    }
}

impl Drop for KeptFile {
    fn drop(&mut self) {
        KEPT_FILES.fetch_sub(1, Ordering::Relaxed);
    }
}

impl StatFiles {
    /// The thread `tid_here`'s stat (`task` is its `/proc/PID/task/TID`), from its kept file or
    /// a file opened now, which is kept while the budget allows.
    fn thread(&mut self, task: &Path, tid_here: u64) -> Option<ThreadStat> {
        if let Some((file, read_in)) = self.threads.get_mut(&tid_here) {
            if let Some(stat) = thread_stat_of(&file.0) {
                *read_in = self.readings;
                return Some(stat);
            }
            self.threads.remove(&tid_here);
        }
        let file = open_proc_file(&task.join("stat")).ok()?;
        let stat = thread_stat_of(&file)?;
        if let Some(kept) = KeptFile::keep(file) {
            self.threads.insert(tid_here, (kept, self.readings));
        }
        Some(stat)
    }

    /// Closes the files of threads the latest reading did not read.
    fn close_unread(&mut self) {
        let latest = self.readings;
        self.threads.retain(|_, (_, read_in)| *read_in == latest);
    }

    /// The process's `stat` (`dir` is its `/proc/PID`), from the kept file or one opened now;
    /// `None` once the process is gone.
    fn process_stat(&mut self, dir: &Path) -> Option<ProcessStat> {
        if let Some(file) = &self.process {
            let stat = process_stat_of(&file.0);
            if stat.is_none() {
                self.process = None;
            }
            return stat;
        }
        let file = open_proc_file(&dir.join("stat")).ok()?;
        let stat = process_stat_of(&file)?;
        self.process = KeptFile::keep(file);
        Some(stat)
    }
}

/// A `/proc` file's contents now, read from its start ([`MAX_PROC_FILE`] bytes at most): a kept
/// file is read again this way.
fn read_from_start(file: &File) -> io::Result<Vec<u8>> {
    let mut bytes = vec![0; PROC_FILE_FIRST_READ];
    let mut filled = 0;
    loop {
        if filled == bytes.len() {
            if filled as u64 >= MAX_PROC_FILE {
                break;
            }
            bytes.resize((2 * filled).min(MAX_PROC_FILE as usize), 0);
        }
        let n = file.read_at(&mut bytes[filled..], filled as u64)?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    bytes.truncate(filled);
    Ok(bytes)
}

impl ThreadCpu {
    fn new() -> Self {
        ThreadCpu {
            at: Instant::now(),
            ticks: HashMap::new(),
            names: HashMap::new(),
            here: HashMap::new(),
            process: None,
        }
    }

    fn insert(&mut self, tid: u64, tid_here: u64, stat: ThreadStat) {
        self.ticks.insert(tid, stat.ticks);
        self.names.insert(tid, stat.name);
        self.here.insert(tid, (tid_here, stat.start_time));
    }

    /// The whole process's CPU time at this reading, when it was read.
    pub fn process(&self) -> Option<&ProcessCpu> {
        self.process.as_ref()
    }

    /// Each thread's name at this reading.
    pub fn names(&self) -> &HashMap<u64, String> {
        &self.names
    }

    /// The names, taken out of the reading (which keeps the threads' CPU times and places).
    pub fn take_names(&mut self) -> HashMap<u64, String> {
        std::mem::take(&mut self.names)
    }

    /// The share of one core each thread ran from `earlier` to this reading (1.0: a whole core
    /// all the time), for threads in both readings.
    pub fn cores_since(&self, earlier: &ThreadCpu) -> HashMap<u64, f64> {
        let seconds = self.at.saturating_duration_since(earlier.at).as_secs_f64();
        let Some(ticks_per_second) = clock_ticks_per_second().filter(|_| seconds > 0.0) else {
            return HashMap::new();
        };
        let tick_seconds = 1.0 / ticks_per_second;
        self.ticks
            .iter()
            .filter_map(|(tid, &now)| {
                let before = *earlier.ticks.get(tid)?;
                let used = now.checked_sub(before)? as f64 * tick_seconds;
                Some((*tid, used / seconds))
            })
            .collect()
    }
}

/// The unit of `/proc`'s CPU and start times.
fn clock_ticks_per_second() -> Option<f64> {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then_some(ticks as f64)
}

/// Field 22 of `dir/stat` (a `/proc/PID` directory): the process's start time.
pub(crate) fn start_time(dir: &Path) -> Option<u64> {
    start_time_of(&open_proc_file(&dir.join("stat")).ok()?)
}

/// The start time an open `stat` file says now.
fn start_time_of(stat: &File) -> Option<u64> {
    parse_start_time(&String::from_utf8_lossy(&read_from_start(stat).ok()?))
}

/// What a process's `stat` says of it.
struct ProcessStat {
    start_time: u64,
    /// Its CPU time (user and system, all its threads) in clock ticks.
    ticks: u64,
}

/// What an open process `stat` file says now.
fn process_stat_of(file: &File) -> Option<ProcessStat> {
    let stat = read_from_start(file).ok()?;
    let stat = String::from_utf8_lossy(&stat);
    Some(ProcessStat {
        start_time: parse_start_time(&stat)?,
        ticks: parse_cpu_ticks(&stat)?,
    })
}

/// Reads a `/proc` file, [`MAX_PROC_FILE`] bytes at most, opened without following links (a
/// target can touch the files under its own `/proc`).
pub(crate) fn read_proc_file(path: &Path) -> io::Result<Vec<u8>> {
    read_from_start(&open_proc_file(path)?)
}

/// Opens a `/proc` file for reading without following links (a target can touch the files
/// under its own `/proc`).
fn open_proc_file(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// The command line to show when `/proc`'s (`raw`, NUL-separated) is the runtime's reported one.
///
/// The runtime reports argv[0] and the app's path resolved (a full path, links followed), `/proc`
/// shows them as typed: words are compared by their last path component. A runtime asked very
/// early in its startup reports argv[0] alone.
fn same_command_line(raw: &[u8], reported: &str) -> Option<String> {
    let args: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let file_name = |s: &str| s.rsplit('/').next().unwrap_or(s).to_string();
    let words = |text: &str| text.split_whitespace().map(file_name).collect::<Vec<_>>();
    let reported_argv0 = reported.split(' ').next().unwrap_or("");
    let same = if reported.trim() == reported_argv0 {
        file_name(args.first()?) == file_name(reported_argv0)
    } else {
        words(&args.join(" ")) == words(reported)
    };
    same.then(|| {
        std::iter::once(reported_argv0.to_string())
            .chain(args.into_iter().skip(1))
            .collect::<Vec<_>>()
            .join(" ")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// A fake procfs entry.
    fn process(root: &Path, pid: u32, nspid: &str, cmdline: &[&str], start: u64) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("status"), format!("Name:\tx\nNSpid:\t{nspid}\n")).unwrap();
        let stat = format!("{pid} (dotnet) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0");
        std::fs::write(dir.join("stat"), stat).unwrap();
        std::fs::write(dir.join("cmdline"), cmdline.join("\0") + "\0").unwrap();
    }

    fn root(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("clrscope-local-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn the_same_pid_with_the_same_program_is_the_runtime() {
        let root = root("same");
        process(&root, 42, "42", &["dotnet", "app.dll", "--x"], 7);
        let found = LocalProcess::find_in(&root, 42, 42, "/usr/bin/dotnet app.dll --x").unwrap();
        assert_eq!((found.pid, found.start_time), (42, 7));
        assert_eq!(found.command_line, "/usr/bin/dotnet app.dll --x");
        // Early in startup the runtime reports argv[0] alone.
        assert!(LocalProcess::find_in(&root, 42, 42, "/usr/bin/dotnet").is_some());
        // The app's path as typed, the runtime's resolved.
        process(&root, 43, "43", &["./dotnet", "bin/app.dll", "--x"], 8);
        assert!(LocalProcess::find_in(&root, 43, 43, "/opt/dotnet /srv/bin/app.dll --x").is_some());
        assert_eq!(
            LocalProcess::find_in(&root, 43, 43, "/opt/dotnet /srv/bin/app.dll --y"),
            None
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn another_program_under_the_pid_is_never_the_runtime() {
        let root = root("other");
        // pid 1 here is an init; the runtime is pid 1 in its own namespace.
        process(&root, 1, "1", &["/sbin/init"], 1);
        process(&root, 900, "900 1", &["dotnet", "app.dll"], 5);
        let found = LocalProcess::find_in(&root, 1, 1, "/usr/bin/dotnet app.dll").unwrap();
        assert_eq!(found.pid, 900, "the runtime in the other pid namespace");
        // The same program as pid 1 in two namespaces: neither is proven.
        process(&root, 901, "901 1", &["dotnet", "app.dll"], 6);
        assert_eq!(
            LocalProcess::find_in(&root, 1, 1, "/usr/bin/dotnet app.dll"),
            None
        );
        // Found under its pid here (connect mode), it is proven without a scan.
        assert_eq!(
            LocalProcess::find_in(&root, 1, 901, "/usr/bin/dotnet app.dll").map(|p| p.pid),
            Some(901)
        );
        // Our pid 30 is not the runtime that is pid 30 in another namespace.
        process(&root, 30, "30", &["dotnet", "other.dll"], 2);
        assert_eq!(
            LocalProcess::find_in(&root, 30, 30, "/usr/bin/dotnet app.dll"),
            None
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_process_that_is_another_innermost_pid_is_not_the_runtime() {
        let root = root("nested");
        // /proc/5 runs the program, but is pid 77 in its own namespace.
        process(&root, 5, "5 77", &["dotnet", "app.dll"], 3);
        assert_eq!(
            LocalProcess::find_in(&root, 5, 5, "/usr/bin/dotnet app.dll"),
            None
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn the_threads_asked_for_are_read_alone() {
        let pid = u64::from(std::process::id());
        let me = LocalProcess::find(pid, pid, &std::env::args().collect::<Vec<_>>().join(" "))
            .expect("this test process is itself");
        let (tid_sender, tid) = std::sync::mpsc::channel();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let named = std::thread::Builder::new()
            .name("asked-for".into())
            .spawn(move || {
                // SAFETY: gettid has no preconditions.
                tid_sender.send(unsafe { libc::gettid() } as u64).unwrap();
                stopped.recv().ok();
            })
            .unwrap();
        let tid = tid.recv().unwrap();
        let all = me.thread_cpu();
        assert!(all.names().len() > 1, "every thread: {:?}", all.names());
        let gone = u64::from(u32::MAX);
        let mut files = StatFiles::default();
        let asked = me.thread_cpu_of(&[tid, gone], Some(&all), Some(&mut files));
        assert_eq!(
            asked.names(),
            &HashMap::from([(tid, "asked-for".to_string())]),
            "the thread asked for, by its name; not the others, nor one that does not exist"
        );
        assert!(asked.cores_since(&all).contains_key(&tid));
        assert_eq!(
            files.threads.keys().collect::<Vec<_>>(),
            [&tid],
            "its file is kept"
        );
        assert!(files.process.is_some(), "the process's own stat is kept");
        let again = me.thread_cpu_of(&[tid], Some(&asked), Some(&mut files));
        assert_eq!(again.names(), asked.names(), "read from the kept files");
        me.thread_cpu_of(&[], Some(&asked), Some(&mut files));
        assert!(
            files.threads.is_empty(),
            "a thread not asked for has its file closed"
        );
        let replaced = LocalProcess {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(replaced
            .thread_cpu_of(&[tid], Some(&all), None)
            .names()
            .is_empty());
        assert!(
            replaced
                .thread_cpu_of(&[tid], Some(&all), Some(&mut StatFiles::default()))
                .names()
                .is_empty(),
            "nor through kept files"
        );
        stop.send(()).unwrap();
        named.join().unwrap();
    }

    /// A `sleep 60` child, once it is found as itself (until it has exec'd, its command line
    /// is still ours). The caller kills and reaps it.
    #[allow(clippy::zombie_processes)]
    fn sleeping_child() -> (std::process::Child, LocalProcess) {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = u64::from(child.id());
        let found = Instant::now();
        loop {
            if let Some(local) = LocalProcess::find(pid, pid, "sleep 60") {
                return (child, local);
            }
            if found.elapsed() > Duration::from_secs(60) {
                child.kill().ok();
                child.wait().ok();
                panic!("the child is never found");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_process_is_as_old_as_the_kernel_says() {
        let before = Instant::now();
        let (mut child, local) = sleeping_child();
        std::thread::sleep(Duration::from_millis(1500));
        let age = local.age().expect("an age");
        let bound = before.elapsed();
        child.kill().ok();
        child.wait().ok();
        // Start times count in clock ticks (10 ms), uptime in hundredths of a second.
        assert!(
            age >= Duration::from_millis(1450) && age <= bound + Duration::from_millis(30),
            "age {age:?}, spawned at most {bound:?} ago"
        );
    }

    #[test]
    fn a_replaced_process_is_not_read() {
        let pid = u64::from(std::process::id());
        let me = LocalProcess::find(pid, pid, &std::env::args().collect::<Vec<_>>().join(" "))
            .expect("this test process is itself");
        assert!(!me.read("maps").unwrap().is_empty());
        assert!(!me.thread_names().is_empty());
        let replaced = LocalProcess {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(replaced.read("maps").is_err());
        assert!(replaced.thread_names().is_empty());
    }

    #[test]
    fn a_kept_stat_file_is_read_again_until_its_thread_exits() {
        let (tid_sent, tid) = std::sync::mpsc::channel();
        let (exit, exit_now) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tid_sent
                .send(u64::from(unsafe { libc::gettid() } as u32))
                .unwrap();
            // Runs until told, so that its CPU time grows between the readings.
            while exit_now.try_recv().is_err() {
                std::hint::spin_loop();
            }
        });
        let tid = tid.recv().unwrap();
        let task = Path::new("/proc/self/task").join(tid.to_string());
        let mut files = StatFiles::default();
        let first = files.thread(&task, tid).expect("a live thread's stat");
        assert_eq!(files.threads.len(), 1, "the file is kept");
        let kept = files.threads[&tid].0 .0.as_raw_fd();
        let ticks_grew = (0..1000).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            files.thread(&task, tid).expect("read again").ticks > first.ticks
        });
        assert!(ticks_grew, "a spinning thread's CPU time never grew");
        assert_eq!(
            files.threads[&tid].0 .0.as_raw_fd(),
            kept,
            "read from the same file"
        );
        exit.send(()).unwrap();
        thread.join().unwrap();
        // Once the kernel has released the thread (a moment after `join` returns), its kept
        // file fails; under its tid there is nothing, or a thread started since (the other
        // tests' threads take freed tids at once).
        let released = (0..1000).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            files
                .thread(&task, tid)
                .is_none_or(|stat| stat.start_time != first.start_time)
        });
        assert!(
            released,
            "the exited thread's stat was still read after 10 s"
        );
    }

    #[test]
    fn a_kept_process_stat_fails_once_the_process_exits() {
        let (mut child, local) = sleeping_child();
        let pid = u64::from(child.id());
        let mut files = StatFiles::default();
        let alive = local.thread_cpu_of(&[pid], None, Some(&mut files));
        assert_eq!(alive.names().len(), 1, "its one thread is read");
        assert!(files.process.is_some(), "the process's stat is kept");
        child.kill().unwrap();
        child.wait().unwrap();
        // Reaped: its pid may be another process's by now, which the kept file never reads.
        let gone = local.thread_cpu_of(&[pid], Some(&alive), Some(&mut files));
        assert!(
            gone.names().is_empty(),
            "read after exit: {:?}",
            gone.names()
        );
        assert!(files.process.is_none(), "the failed file is closed");
        assert!(files.threads.is_empty(), "so is its thread's");
    }
}
