//! A `clrscope agent` for integration tests: started on a free loopback port, asked over HTTP,
//! killed on drop.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{http_get, HttpResponse};

/// A running `clrscope agent`, killed on drop, its stderr kept for failure messages.
pub struct Agent {
    child: Child,
    pub port: u16,
    log: Arc<Mutex<String>>,
}

impl Agent {
    pub fn start(data_dir: &Path, extra: &[&str]) -> Agent {
        // `--log clrscope=info` unless the test asks for another filter.
        let log: &[&str] = if extra.contains(&"--log") {
            &[]
        } else {
            &["--log", "clrscope=info"]
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_clrscope"))
            .args(["agent", "--urls", "http://127.0.0.1:0"])
            .args(log)
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start clrscope agent");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut first = String::new();
        stderr.read_line(&mut first).unwrap();
        let port = first
            .split("http://127.0.0.1:")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no API address in the agent's first line: {first:?}"));
        let log = Arc::new(Mutex::new(first));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        Agent { child, port, log }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory of the agent process (`VmRSS`), in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/PID/status")
    }

    pub fn get(&self, path: &str) -> HttpResponse {
        let response = http_get(self.port, path, &[]);
        assert_eq!(
            response.status,
            200,
            "GET {path}: {}\nagent log:\n{}",
            response.body,
            self.log()
        );
        response
    }

    pub fn processes(&self) -> Vec<Value> {
        self.get("/api/v1/processes")
            .json()
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    pub fn attached(&self, pid: u32) -> Option<Value> {
        self.processes()
            .into_iter()
            .find(|p| p["pid"] == u64::from(pid))
    }

    /// Waits until `pid` is attached (or, with `attached == false`, detached).
    pub fn wait_attached(&self, pid: u32, attached: bool, timeout: Duration) -> Option<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let found = self.attached(pid);
            if found.is_some() == attached {
                return found.or(Some(Value::Null));
            }
            if Instant::now() > deadline {
                panic!(
                    "pid {pid} not {} within {timeout:?}; agent log:\n{}",
                    if attached { "attached" } else { "detached" },
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `/api/v1/profile` as folded stacks: (stack root first, value).
    pub fn folded(&self, profile_type: &str, pid: u32, range: &str) -> Vec<(String, i64)> {
        let query = format!("{{process_id=\"{pid}\"}}");
        let path = format!(
            "/api/v1/profile?type={profile_type}&format=folded&query={}{range}",
            encode(&query)
        );
        self.get(&path)
            .body
            .lines()
            .filter_map(|line| {
                let (stack, value) = line.rsplit_once(' ')?;
                Some((stack.to_string(), value.parse().ok()?))
            })
            .collect()
    }

    /// Waits until the last minute of `profile_type` for `pid` holds at least `min_total`.
    pub fn wait_for_data(&self, profile_type: &str, pid: u32, min_total: i64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let total: i64 = self
                .folded(profile_type, pid, "")
                .iter()
                .map(|(_, v)| v)
                .sum();
            if total >= min_total {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "{profile_type} of pid {pid}: {total} < {min_total} after {timeout:?}; \
                     agent log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub fn data_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("clrscope-agent-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}
