//! The API under load, against a real agent profiling real .NET processes, its store also
//! holding hours of history: a route class whose running and waiting queries are at their
//! bounds refuses more with 503 and `Retry-After` while the other classes answer and ingestion
//! goes on; a query whose client goes away stops reading the store (judged by the agent's own
//! counters of blocks read and cancelled queries, not by time).

use crate::support;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use profile::{Batch, BatchSample, Function, LabelValue, ProfileType};
use store::tsdb::{Store, StoreOptions};
use support::agent::{data_dir, encode, Agent};
use support::{http_request, ScratchDir, Target};

const SECOND: i64 = 1_000_000_000;
const MINUTE: i64 = 60 * SECOND;
/// The service of the written history, apart from the live targets'.
const HISTORY_SERVICE: &str = "history";
/// One block per minute of history.
const HISTORY_BLOCKS: i64 = 240;
/// Distinct stacks per minute of history: each block costs a query real work to merge.
const STACKS_PER_BLOCK: usize = 600;
/// Generous for a machine at load 10 running a debug build.
const TIMEOUT: Duration = Duration::from_secs(180);

fn unix_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// xorshift64: the same history every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// An agent's data folder holding [`HISTORY_BLOCKS`] minutes of a busy service's cpu profile, the
/// newest an hour old, written as an agent would have written it, through the store.
fn data_dir_with_history(name: &str) -> ScratchDir {
    let dir = data_dir(name);
    let mut store =
        Store::open(dir.to_path_buf(), StoreOptions::default()).expect("open the history");
    let functions: Vec<Function> = (0..400)
        .map(|i| Function {
            name: format!("History.Service.Handler{}.Step{}()", i / 20, i % 20),
            module: "History.dll".into(),
        })
        .collect();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let start = unix_nanos() - 60 * MINUTE - HISTORY_BLOCKS * MINUTE;
    for minute in 0..HISTORY_BLOCKS {
        let samples = (0..STACKS_PER_BLOCK)
            .map(|_| BatchSample {
                stack: (0..8 + rng.below(12))
                    .map(|_| rng.below(functions.len()) as u32)
                    .collect(),
                value: 1_000_000 * (1 + rng.below(20) as i64),
                labels: vec![(
                    "thread_id".into(),
                    LabelValue::Num(1000 + rng.below(16) as i64),
                )],
            })
            .collect();
        let batch = Batch {
            series: vec![
                ("service_name".into(), HISTORY_SERVICE.into()),
                ("process_id".into(), "7".into()),
                ("host_name".into(), "node-1".into()),
            ],
            profile_type: ProfileType::known("cpu").unwrap(),
            timestamp_unix_nanos: start + minute * MINUTE,
            functions: functions.clone(),
            samples,
        };
        store.append(&batch).expect("append history");
        store.flush().expect("flush history");
    }
    // One block per minute, plus the coarser copies of the closed 10-minute spans and hours.
    assert!(store.blocks().len() as i64 > HISTORY_BLOCKS);
    dir
}

/// The flame graph query of the whole history, as pprof (every sample label kept): the
/// slowest profile query there is.
fn history_query() -> String {
    format!(
        "/api/v1/profile?type=cpu&format=pprof&from=now-6h&query={}",
        encode(&format!("{{service_name=\"{HISTORY_SERVICE}\"}}"))
    )
}

/// A request sent on its own connection, its answer read later.
struct Pending {
    stream: TcpStream,
    what: String,
}

impl Pending {
    fn send(agent: &Agent, path: &str) -> Pending {
        let mut stream = TcpStream::connect(("127.0.0.1", agent.port)).expect("connect");
        stream.set_read_timeout(Some(TIMEOUT)).unwrap();
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {}\r\n\
             Connection: close\r\n\r\n",
            agent.port,
            agent.token()
        );
        stream.write_all(request.as_bytes()).expect("send");
        Pending {
            stream,
            what: path.to_string(),
        }
    }

    /// The status and head of the answer (the body read and dropped).
    fn answer(mut self) -> (u16, String) {
        let mut raw = Vec::new();
        self.stream
            .read_to_end(&mut raw)
            .unwrap_or_else(|e| panic!("{}: {e}", self.what));
        let head_end = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or(raw.len());
        let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{}: no status in {head:?}", self.what));
        let body = String::from_utf8_lossy(&raw[(head_end + 4).min(raw.len())..]).into_owned();
        (status, format!("{head}\n{body}"))
    }
}

/// One value of the agent's `/metrics` (0 when the series does not exist yet).
fn metric(agent: &Agent, series: &str) -> f64 {
    let text = http_request(agent.metrics_port, "GET", "/metrics", &[]).body;
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

fn by_class(name: &str, class: &str) -> String {
    format!("{name}{{route_class=\"{class}\"}}")
}

fn wait_until(agent: &Agent, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {TIMEOUT:?}; agent log:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Two live targets and an agent profiling only them, its data folder `dir` (with the history).
fn agent_with_targets(dir: &Path, extra: &[&str]) -> (Agent, Vec<Target>) {
    let targets = vec![
        Target::builder("CpuHot")
            .args(["--split", "60,40", "--cores", "0.2"])
            .start(),
        Target::builder("AsyncWeb")
            .args(["--self-load", "20", "--no-request-lines"])
            .start(),
    ];
    let pids: Vec<String> = targets.iter().map(|t| t.pid().to_string()).collect();
    let mut args: Vec<&str> = extra.to_vec();
    for pid in &pids {
        args.extend(["--pid", pid]);
    }
    let agent = Agent::start(dir, &args);
    for target in &targets {
        agent.wait_attached(target.pid(), true, TIMEOUT);
    }
    agent.wait_for_data("cpu", targets[0].pid(), 1, TIMEOUT);
    (agent, targets)
}

/// The agent's own counters of what ingestion lost stay at 0.
fn assert_nothing_lost(agent: &Agent) {
    for counter in [
        "clrscope_store_dropped_batches_total",
        "clrscope_store_write_errors_total",
    ] {
        assert_eq!(metric(agent, counter), 0.0, "{counter}");
    }
}

#[test]
fn a_full_route_class_refuses_with_retry_after_while_others_answer() {
    if !support::testbed_available() {
        return;
    }
    let dir = data_dir_with_history("api-load-admission");
    let (agent, targets) = agent_with_targets(
        &dir,
        &["--max-running-queries", "1", "--max-queued-queries", "1"],
    );
    let samples_before = metric(&agent, "clrscope_samples_total");
    // All sent before the first can end: one runs, one waits, the rest are refused at once.
    let connections: Vec<Pending> = (0..6)
        .map(|_| Pending::send(&agent, &history_query()))
        .collect();
    let rejected = by_class("clrscope_api_queries_rejected_total", "profile");
    wait_until(&agent, "profile queries refused", || {
        metric(&agent, &rejected) >= 1.0
    });
    // The other classes have slots of their own: admitted, and answered.
    let series = format!(
        "/api/v1/series?type=cpu&from=now-5m&query={}",
        encode(&format!("{{process_id=\"{}\"}}", targets[0].pid()))
    );
    for path in [
        series.as_str(),
        "/api/v1/labels",
        "/api/v1/profile-types",
        "/api/v1/processes",
    ] {
        let (status, text) = Pending::send(&agent, path).answer();
        assert_eq!(
            status, 200,
            "{path} while profile queries are refused: {text}"
        );
    }
    let answers: Vec<(u16, String)> = connections.into_iter().map(Pending::answer).collect();
    let refused: Vec<&String> = answers
        .iter()
        .filter(|(status, _)| *status == 503)
        .map(|(_, text)| text)
        .collect();
    let answered = answers.iter().filter(|(status, _)| *status == 200).count();
    assert_eq!(
        answered + refused.len(),
        answers.len(),
        "only 200 or 503: {answers:?}"
    );
    assert!(
        answered >= 2,
        "the running and the waiting query answer: {answers:?}"
    );
    assert!(!refused.is_empty(), "{answers:?}");
    for text in &refused {
        assert!(text.contains("retry-after: 1\r\n"), "{text}");
        assert!(text.contains("urn:clrscope:problem:overloaded"), "{text}");
        assert!(text.contains("Queries:MaxRunning"), "{text}");
    }
    assert_eq!(metric(&agent, &rejected), refused.len() as f64);
    for class in ["series", "catalog"] {
        let series = by_class("clrscope_api_queries_rejected_total", class);
        assert_eq!(metric(&agent, &series), 0.0, "{series}");
    }
    // Ingestion went on: samples taken meanwhile, stored, nothing dropped.
    let after_burst = unix_nanos() / 1_000_000;
    let stored_since = format!(
        "/api/v1/series?type=cpu&step=1h&from={after_burst}&query={}",
        encode(&format!("{{process_id=\"{}\"}}", targets[0].pid()))
    );
    wait_until(&agent, "cpu samples stored after the burst", || {
        let points = agent.get(&stored_since).json()["points"].clone();
        points[0][1].as_i64().unwrap_or(0) > 0
    });
    assert!(metric(&agent, "clrscope_samples_total") > samples_before);
    assert_nothing_lost(&agent);
}

#[test]
fn a_query_whose_client_goes_away_stops_reading_blocks() {
    if !support::testbed_available() {
        return;
    }
    let dir = data_dir_with_history("api-load-cancel");
    let (agent, _targets) = agent_with_targets(&dir, &[]);
    let blocks_read = by_class("clrscope_api_query_blocks_read_total", "profile");
    let running = by_class("clrscope_api_queries_running", "profile");
    let cancelled = by_class("clrscope_api_queries_cancelled_total", "profile");

    // Answered in full, the query reads the blocks that cover the history (coarser copies where
    // they hold whole spans of the range).
    let started = Instant::now();
    let (status, text) = Pending::send(&agent, &history_query()).answer();
    assert_eq!(status, 200, "{text}");
    let full = metric(&agent, &blocks_read);
    assert!(full > 0.0, "blocks a whole query reads: {full}");
    eprintln!(
        "the whole query took {:?} over {full} blocks",
        started.elapsed()
    );

    // Asked again, and the client goes away once it is at work: admitted, and the agent has
    // spent a second of CPU since (a fraction of what the whole query took; the two targets'
    // profiling alone takes the agent a few percent of a core).
    let pending = Pending::send(&agent, &history_query());
    wait_until(&agent, "the second query running", || {
        metric(&agent, &running) == 1.0
    });
    let cpu_ms = || support::process_cpu_ms(&agent.pid().to_string());
    let cpu_at_start = cpu_ms();
    wait_until(&agent, "the second query at work", || {
        cpu_ms() > cpu_at_start + 1000.0
    });
    pending.stream.shutdown(Shutdown::Both).unwrap();
    drop(pending);
    wait_until(&agent, "the abandoned query stopped", || {
        metric(&agent, &running) == 0.0
    });
    assert_eq!(metric(&agent, &cancelled), 1.0);
    let abandoned = metric(&agent, &blocks_read) - full;
    eprintln!("the abandoned query read {abandoned} of {full} blocks");
    assert!(
        abandoned < full,
        "the abandoned query read {abandoned} blocks, as many as a whole one"
    );
    // The agent goes on answering.
    agent.get("/api/v1/labels");
    assert_nothing_lost(&agent);
}
