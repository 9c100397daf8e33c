//! A `clrscope agent` for integration tests: started on a free loopback port, asked over HTTP,
//! killed on drop.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{http_request, HttpResponse, ScratchDir};

/// A key made by `clrscope generatekey`: what the agent is configured with, and the token.
#[derive(Debug, Clone)]
pub struct ApiKey {
    pub subject: String,
    pub public_key: String,
    /// The JWT (what follows `Bearer `).
    pub token: String,
}

impl ApiKey {
    /// Runs `clrscope generatekey -o MachineJson` with `extra` arguments (e.g. `-e 1s`).
    pub fn generate(extra: &[&str]) -> ApiKey {
        let output = Command::new(env!("CARGO_BIN_EXE_clrscope"))
            .args(["generatekey", "-o", "MachineJson"])
            .args(extra)
            .output()
            .expect("run clrscope generatekey");
        assert!(output.status.success(), "generatekey: {output:?}");
        let json: Value = serde_json::from_slice(&output.stdout).expect("MachineJson is JSON");
        let key = &json["Authentication"]["MonitorApiKey"];
        let header = json["AuthorizationHeader"].as_str().unwrap();
        ApiKey {
            subject: key["Subject"].as_str().unwrap().to_string(),
            public_key: key["PublicKey"].as_str().unwrap().to_string(),
            token: header.strip_prefix("Bearer ").unwrap().to_string(),
        }
    }

    /// The environment variables that configure the agent with this key, as `generatekey -o
    /// Shell` prints them.
    pub fn env(&self) -> [(&'static str, &str); 2] {
        [
            (
                "CLRSCOPE_Authentication__MonitorApiKey__Subject",
                &self.subject,
            ),
            (
                "CLRSCOPE_Authentication__MonitorApiKey__PublicKey",
                &self.public_key,
            ),
        ]
    }
}

/// A running `clrscope agent`, killed on drop, its stderr kept for failure messages.
pub struct Agent {
    child: Child,
    /// The API and web UI.
    pub port: u16,
    /// The metrics listener (`/metrics` without authentication).
    pub metrics_port: u16,
    /// The key the agent was configured with, if any; its token goes with every request of
    /// [`Agent::get`] and [`Agent::request`].
    pub key: Option<ApiKey>,
    log: Arc<Mutex<String>>,
}

impl Agent {
    /// [`Agent::start`] for one process, configured by `settings` (written to
    /// `dir/settings.json`), its data in `dir/data`.
    pub fn for_pid_with_settings(dir: &Path, pid: u32, settings: &str, extra: &[&str]) -> Agent {
        let config = dir.join("settings.json");
        std::fs::write(&config, settings).unwrap();
        let pid = pid.to_string();
        let mut args = vec!["--pid", &pid, "--config", config.to_str().unwrap()];
        args.extend_from_slice(extra);
        Agent::start(&dir.join("data"), &args)
    }

    /// Starts an agent as a user runs one: with a key `clrscope generatekey` made, configured
    /// through its environment variables; requests send its token.
    pub fn start(data_dir: &Path, extra: &[&str]) -> Agent {
        Agent::start_with_key(data_dir, extra, Some(ApiKey::generate(&[])))
    }

    /// [`Agent::start`] with a given key, or none configured.
    pub fn start_with_key(data_dir: &Path, extra: &[&str], key: Option<ApiKey>) -> Agent {
        Agent::start_with_env(data_dir, extra, key, &[])
    }

    /// [`Agent::start_with_key`] with more environment variables. The API and metrics listen on
    /// free loopback ports unless `extra` gives `--urls` or `--metrics-urls`; the log filter is
    /// `clrscope=info` unless it gives `--log`; EventSources are enabled at once unless it gives
    /// `--startup-grace`.
    pub fn start_with_env(
        data_dir: &Path,
        extra: &[&str],
        key: Option<ApiKey>,
        env: &[(&str, &Path)],
    ) -> Agent {
        let mut command = Command::new(env!("CARGO_BIN_EXE_clrscope"));
        command.arg("agent");
        for (flag, default) in [
            ("--urls", "http://127.0.0.1:0"),
            ("--metrics-urls", "http://127.0.0.1:0"),
            ("--log", "clrscope=info"),
            // Targets start just before their agent: without this, counters, trace linkage and
            // rules would wait for the default grace (a test of its own checks it).
            ("--startup-grace", "0s"),
        ] {
            if !extra.contains(&flag) {
                command.args([flag, default]);
            }
        }
        let mut child = command
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra)
            .envs(key.iter().flat_map(ApiKey::env))
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start clrscope agent");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        // Warnings may come first; the line naming the addresses comes once it listens.
        let mut head = String::new();
        let started = loop {
            let mut line = String::new();
            if stderr.read_line(&mut line).unwrap_or(0) == 0 {
                let _ = child.kill();
                panic!("the agent ended before it listened; its log:\n{head}");
            }
            head.push_str(&line);
            if line.contains("API on") {
                break line;
            }
        };
        let port_after = |prefix: &str| -> u16 {
            started
                .split(prefix)
                .nth(1)
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("no {prefix}PORT in the agent's line: {started:?}"))
        };
        let port = port_after("://127.0.0.1:");
        let metrics_port = port_after("metrics http://127.0.0.1:");
        let log = Arc::new(Mutex::new(head));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        Agent {
            child,
            port,
            metrics_port,
            key,
            log,
        }
    }

    /// The token of the agent's key; panics if it was started without one.
    pub fn token(&self) -> &str {
        &self
            .key
            .as_ref()
            .expect("an agent started with a key")
            .token
    }

    /// `method path` to the API with the token (if the agent has a key), whatever the answer.
    pub fn request(&self, method: &str, path: &str) -> HttpResponse {
        match &self.key {
            Some(key) => http_request(
                self.port,
                method,
                path,
                &[("Authorization", &format!("Bearer {}", key.token))],
            ),
            None => http_request(self.port, method, path, &[]),
        }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory of the agent process (`VmRSS`), in KiB.
    pub fn rss_kib(&self) -> u64 {
        self.status_kib("VmRSS:")
    }

    /// The agent's resident memory every `every` for `duration` (e.g. while a receiver is down),
    /// in KiB.
    pub fn rss_kib_over(&self, duration: Duration, every: Duration) -> Vec<u64> {
        let started = Instant::now();
        let mut rss = Vec::new();
        while started.elapsed() < duration {
            std::thread::sleep(every);
            rss.push(self.rss_kib());
        }
        rss
    }

    /// The sum of the samples of the agent's `/metrics` family `name` whose labels include every
    /// one of `labels` (e.g. `reason="queue_full"`).
    pub fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        super::http_get(self.metrics_port, "/metrics", &[])
            .body
            .lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
                    && labels.iter().all(|want| l.contains(want))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// The agent's peak resident memory so far (`VmHWM`), in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        self.status_kib("VmHWM:")
    }

    fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{field} in /proc/PID/status"))
    }

    /// `response`, after checking its status is `status`; else panics with its body and the
    /// agent's log.
    pub fn expect_status(&self, response: HttpResponse, status: u16, what: &str) -> HttpResponse {
        assert_eq!(
            response.status,
            status,
            "{what}: {}\nagent log:\n{}",
            response.body,
            self.log()
        );
        response
    }

    /// `GET path` with the token; panics unless the answer is 200.
    pub fn get(&self, path: &str) -> HttpResponse {
        let response = self.request("GET", path);
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

impl Agent {
    /// Sends SIGTERM and waits up to `timeout` for the agent to exit: its status, or `None` if it
    /// still runs (the drop kills it then).
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { super::sys::kill(self.child.id() as i32, super::sys::SIGTERM) };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
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

/// An agent's data folder, `$TMP/clrscope-agent-NAME-PID`, removed when the test passes.
pub fn data_dir(name: &str) -> ScratchDir {
    ScratchDir::new(&format!("agent-{name}"))
}

/// `go tool pprof -REPORT` of a pprof file, as text.
pub fn go_pprof(report: &str, pprof: &[u8], name: &str) -> String {
    let path = std::env::temp_dir().join(format!(
        "clrscope-agent-{name}-{}.pb.gz",
        std::process::id()
    ));
    std::fs::write(&path, pprof).unwrap();
    let output = Command::new("go")
        .args(["tool", "pprof", &format!("-{report}")])
        .arg(&path)
        .output()
        .expect("go tool pprof (installed by `make setup`)");
    let _ = std::fs::remove_file(&path);
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// One sample of `go tool pprof -traces`: its labels, frames (leaf first) and value in ms.
pub struct TracedSample {
    pub labels: HashMap<String, String>,
    pub frames: Vec<String>,
    pub millis: f64,
}

/// The samples of a pprof file, through `go tool pprof -traces`.
pub fn pprof_traces(pprof: &[u8], name: &str) -> Vec<TracedSample> {
    let text = go_pprof("traces", pprof, name);
    let mut samples = Vec::new();
    for block in text.split("-----------+").skip(1) {
        let mut sample = TracedSample {
            labels: HashMap::new(),
            frames: Vec::new(),
            millis: 0.0,
        };
        for line in block.lines().skip(1) {
            let trimmed = line.trim();
            if trimmed.is_empty() {
                continue;
            }
            if sample.frames.is_empty() {
                if let Some((key, value)) = trimmed.split_once(":  ") {
                    sample
                        .labels
                        .insert(key.trim().to_string(), value.trim().to_string());
                    continue;
                }
                // "  751.36ms   Leaf.Frame(...)" (indented by the value's width): the value,
                // then the leaf frame.
                let (value, frame) = trimmed.split_once(char::is_whitespace).unwrap();
                sample.millis = parse_millis(value);
                sample.frames.push(frame.trim().to_string());
            } else {
                sample.frames.push(trimmed.to_string());
            }
        }
        // The listing ends with a separator line too.
        if !sample.frames.is_empty() {
            samples.push(sample);
        }
    }
    samples
}

fn parse_millis(value: &str) -> f64 {
    let split = value
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(value.len());
    let number: f64 = value[..split].parse().unwrap_or(0.0);
    match &value[split..] {
        "s" => number * 1000.0,
        "us" | "µs" => number / 1000.0,
        "ns" => number / 1e6,
        _ => number,
    }
}

/// The peak of `rss` and how much it still grew over its second half (0 when flat): what a
/// bounded queue looks like while its receiver is down.
pub fn peak_and_late_growth(rss: &[u64]) -> (u64, u64) {
    let peak = rss.iter().copied().max().unwrap_or(0);
    let second_half = &rss[rss.len() / 2..];
    let late =
        second_half.iter().copied().max().unwrap_or(0) - second_half.first().copied().unwrap_or(0);
    (peak, late)
}
