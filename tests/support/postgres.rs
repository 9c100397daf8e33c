//! A PostgreSQL server for one test: Debian's `postgresql` (installed by `make setup`), a cluster of
//! its own made by `initdb` in `testbed_dir()/postgres/NAME-PID/`, listening on a unix socket in that
//! folder only (no TCP port), trusted local connections as user `postgres`. PostgreSQL refuses to run
//! as root: as root, the server runs as the `postgres` user the package created. Dropping it stops
//! the server (a fast shutdown, then SIGKILL) and removes the folder.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::testbed_dir;

/// How long [`Postgres::start`] waits for the server to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Postgres {
    child: Child,
    dir: PathBuf,
    bin: PathBuf,
}

impl Postgres {
    /// initdb + postgres in `testbed_dir()/postgres/NAME-PID`; waits until the server is ready
    /// (its `postmaster.pid` says so). Panics with the server's log if it does not get there.
    pub fn start(name: &str) -> Postgres {
        let bin = server_bin_dir();
        let dir = testbed_dir()
            .join("postgres")
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let owner = server_user();
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        }
        let data = dir.join("data");
        let init = as_owner(Command::new(bin.join("initdb")), owner)
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C"])
            .args(["--no-sync", "--no-instructions"])
            .output()
            .expect("run initdb");
        assert!(
            init.status.success(),
            "initdb {}: {}",
            data.display(),
            String::from_utf8_lossy(&init.stderr)
        );
        let log = std::fs::File::create(dir.join("server.log")).unwrap();
        // No TCP listener: the socket in DIR is the only way in. Durability is of no use to a test.
        let mut server = as_owner(Command::new(bin.join("postgres")), owner);
        // A test process killed before its drop still stops the server (a fast shutdown). Set after
        // the uid change (std runs pre_exec last), which would clear it.
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            server.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGINT);
                Ok(())
            });
        }
        let child = server
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(&dir)
            .args(["-c", "listen_addresses=", "-c", "fsync=off"])
            .args(["-c", "synchronous_commit=off", "-c", "full_page_writes=off"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start postgres");
        let mut server = Postgres { child, dir, bin };
        server.wait_ready();
        server
    }

    /// The folder of the server's unix socket (what Npgsql's `Host=` and `psql -h` take).
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// An Npgsql connection string for the `postgres` database.
    pub fn connection_string(&self) -> String {
        format!(
            "Host={};Username=postgres;Database=postgres",
            self.dir.display()
        )
    }

    /// `psql -At -c SQL`: the answer's rows, `|` between columns. Panics on an SQL error.
    pub fn query(&self, sql: &str) -> String {
        let output = Command::new(self.bin.join("psql"))
            .arg("-h")
            .arg(&self.dir)
            .args([
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
            ])
            .args(["-c", sql])
            .output()
            .expect("run psql");
        assert!(
            output.status.success(),
            "psql -c {sql:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    /// What the server logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    fn wait_ready(&mut self) {
        let pid_file = self.dir.join("data/postmaster.pid");
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            // Line 8 of postmaster.pid is the server's state; "ready" once it accepts connections.
            let state = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|text| text.lines().nth(7).map(|l| l.trim().to_string()));
            if state.as_deref() == Some("ready") {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "postgres exited with {status} before it was ready:\n{}",
                    self.log()
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "postgres not ready within {READY_TIMEOUT:?} (state {state:?}):\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SIGINT is PostgreSQL's fast shutdown: clients are disconnected, the server exits.
            // SAFETY: kill(2) on our own, not yet reaped, child.
            unsafe {
                libc::kill(self.child.id() as libc::pid_t, libc::SIGINT);
            }
            let deadline = Instant::now() + Duration::from_secs(15);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "kept the PostgreSQL folder {} (server.log)",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The newest `/usr/lib/postgresql/VERSION/bin` (Debian's layout; `make setup` installs it).
fn server_bin_dir() -> PathBuf {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!("no /usr/lib/postgresql/*/bin/initdb (Debian postgresql): run `make setup` first")
    })
}

/// The uid and gid the server runs as when this process is root (PostgreSQL will not run as root):
/// the `postgres` user's; `None` when not root (the server runs as this user).
fn server_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    // SAFETY: getpwnam with a NUL-terminated name; the fields are copied out at once.
    let entry = unsafe { libc::getpwnam(c"postgres".as_ptr()) };
    assert!(
        !entry.is_null(),
        "running as root, and there is no `postgres` user to run PostgreSQL as (Debian's postgresql package makes it: run `make setup`)"
    );
    // SAFETY: a non-null passwd entry from getpwnam.
    Some(unsafe { ((*entry).pw_uid, (*entry).pw_gid) })
}

fn as_owner(mut command: Command, owner: Option<(u32, u32)>) -> Command {
    if let Some((uid, gid)) = owner {
        command.uid(uid).gid(gid);
    }
    command
}
