//! The profiles receiver of `tests/otlp/receiver.py` (official OTLP protos on grpcio, Pyroscope's
//! push messages, `/ingest`), run as a child process and killed on drop.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{sync_channel, Receiver as Lines};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::testbed_dir;

/// A running receiver: its ports and the requests it decoded, one JSON value each.
pub struct Receiver {
    child: Child,
    pub grpc_port: u16,
    pub http_port: u16,
    lines: Lines<Value>,
    stderr: PathBuf,
}

impl Receiver {
    /// Starts the receiver on the given ports (0: free ones), saving pprof files in `out_dir`.
    pub fn start(out_dir: &Path, grpc_port: u16, http_port: u16) -> Receiver {
        Receiver::start_with(out_dir, grpc_port, http_port, &[])
    }

    /// Starts the receiver with an HTTP port it can be started on again after [`Self::kill`]: a
    /// free port below the kernel's ephemeral range, which no other process's bind to port 0 or
    /// outgoing connection takes while the receiver is down (a port from that range was taken
    /// during a 60 s outage in a loaded suite run, and the restarted receiver could not bind it).
    pub fn start_restartable(out_dir: &Path) -> Receiver {
        let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
            .unwrap_or(32768);
        let low = ephemeral_low.saturating_sub(12_000).max(1024);
        let span = ephemeral_low - low;
        let seed = std::process::id() as u64
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::from(d.subsec_nanos()));
        let port = (0..span)
            .map(|i| low + ((seed + u64::from(i) * 7919) % u64::from(span)) as u16)
            .find(|&port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
            .expect("a free port below the ephemeral range");
        Receiver::start(out_dir, 0, port)
    }

    pub fn start_with(out_dir: &Path, grpc_port: u16, http_port: u16, extra: &[&str]) -> Receiver {
        let peers = testbed_dir().join("pypeers");
        assert!(
            peers.join(".installed").exists(),
            "no {} (the receiver's Python packages): run `make setup` first",
            peers.display()
        );
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/otlp/receiver.py");
        std::fs::create_dir_all(out_dir).unwrap();
        let stderr = out_dir.join(format!("receiver-{grpc_port}-{http_port}.stderr"));
        let mut child = Command::new("python3")
            .arg(&script)
            .arg("--out-dir")
            .arg(out_dir)
            .args(["--grpc-port", &grpc_port.to_string()])
            .args(["--http-port", &http_port.to_string()])
            .args(extra)
            .env("PYTHONPATH", &peers)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("start python3 tests/otlp/receiver.py");
        let (tx, lines) = sync_channel(100_000);
        let stdout = BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                match serde_json::from_str::<Value>(&line) {
                    Ok(value) => {
                        if tx.send(value).is_err() {
                            break;
                        }
                    }
                    Err(e) => eprintln!("receiver printed a non-JSON line ({e}): {line}"),
                }
            }
        });
        let mut receiver = Receiver {
            child,
            grpc_port: 0,
            http_port: 0,
            lines,
            stderr,
        };
        let ready = receiver
            .next(Duration::from_secs(30))
            .unwrap_or_else(|| panic!("the receiver did not start: {}", receiver.stderr_text()));
        receiver.grpc_port = ready["grpc_port"].as_u64().unwrap() as u16;
        receiver.http_port = ready["http_port"].as_u64().unwrap() as u16;
        receiver
    }

    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The next decoded request, if one comes within `timeout`.
    pub fn next(&self, timeout: Duration) -> Option<Value> {
        self.lines.recv_timeout(timeout).ok()
    }

    /// Every request decoded so far.
    pub fn drain(&self) -> Vec<Value> {
        self.lines.try_iter().collect()
    }

    /// Collects requests until `done` says the collection is complete, or panics after
    /// `timeout` with what came.
    pub fn collect_until(
        &self,
        timeout: Duration,
        mut done: impl FnMut(&[Value]) -> bool,
    ) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        let mut got = Vec::new();
        while !done(&got) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let kinds: Vec<String> = got
                    .iter()
                    .map(|v| format!("{}/{}", v["kind"], v["transport"]))
                    .collect();
                panic!(
                    "the receiver did not get what was expected within {timeout:?}; got {kinds:?}; \
                     receiver stderr:\n{}",
                    self.stderr_text()
                );
            }
            if let Some(value) = self.next(left.min(Duration::from_secs(1))) {
                got.push(value);
            }
        }
        got
    }

    /// Stops the receiver now, as a crash or an outage would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One item of the OTLP requests a receiver decoded (a span, a log record, a metric), with the
/// name of its instrumentation scope and its resource's attributes.
pub struct Scoped<'a> {
    pub item: &'a Value,
    pub scope: &'a str,
    pub resource: &'a Value,
}

/// The items under `field` (`spans`, `records`, `metrics`) of every request of `kind`
/// (`otlp-traces`, `otlp-logs`, `otlp-metrics`) received over `transport`.
pub fn scoped_items<'a>(
    got: &'a [Value],
    kind: &str,
    transport: &str,
    field: &str,
) -> Vec<Scoped<'a>> {
    let mut items = Vec::new();
    for request in got
        .iter()
        .filter(|r| r["kind"] == kind && r["transport"] == transport)
    {
        for resource in request["resources"].as_array().unwrap() {
            for scope in resource["scopes"].as_array().unwrap() {
                let name = scope["name"].as_str().unwrap();
                items.extend(scope[field].as_array().unwrap().iter().map(|item| Scoped {
                    item,
                    scope: name,
                    resource: &resource["attributes"],
                }));
            }
        }
    }
    items
}

/// The span ids the samples of the profiles (`otlp` requests) in `got` are linked to.
pub fn profile_link_span_ids(got: &[Value]) -> Vec<&str> {
    got.iter()
        .filter(|r| r["kind"] == "otlp")
        .flat_map(|r| r["resources"].as_array().unwrap())
        .flat_map(|res| res["profiles"].as_array().unwrap())
        .flat_map(|p| p["samples"].as_array().unwrap())
        .filter_map(|s| s["link"]["span_id"].as_str())
        .collect()
}

/// When the first of `got` was received, in Unix nanoseconds.
pub fn first_received(got: &[Value]) -> u64 {
    got.iter()
        .filter_map(|r| r["received_unix_nano"].as_u64())
        .min()
        .expect("requests with their receipt time")
}

/// Now, in nanoseconds since the Unix epoch (the unit of OTLP timestamps).
pub fn unix_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}
