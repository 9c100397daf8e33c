//! The agent's `/metrics` against the real Prometheus tools (Debian `prometheus`, installed by
//! `make setup`): `promtool check metrics` accepts the exposition, and a Prometheus server
//! scraping the metrics listener sees the target `up`, the agent's health numbers and the
//! profiled process's runtime counters; and `go tool pprof` reads the agent's own CPU profile.

use crate::support;

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::agent::{data_dir, encode, Agent};
use support::{http_get, ScratchDir, Target};

/// A `prometheus` server, killed on drop.
struct Prometheus {
    child: Child,
    port: u16,
    /// Its config and storage: removed once the server is killed (fields drop after `drop`).
    _dir: ScratchDir,
}

impl Prometheus {
    /// Scrapes `127.0.0.1:target_port/metrics` every second.
    fn start(target_port: u16) -> Prometheus {
        let dir = data_dir("prometheus");
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  \
                 - job_name: clrscope\n    static_configs:\n      \
                 - targets: ['127.0.0.1:{target_port}']\n"
            ),
        )
        .unwrap();
        // A free port for its web API (the race with other tests binding it is harmless: the
        // server would fail to start and the test say so).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian prometheus, installed by `make setup`)");
        Prometheus {
            child,
            port,
            _dir: dir,
        }
    }

    /// The values of an instant query's vector result.
    fn query(&self, expr: &str) -> Vec<f64> {
        let url = format!("/api/v1/query?query={}", encode(expr));
        let response = http_get(self.port, &url, &[]);
        if response.status != 200 {
            return Vec::new();
        }
        let body: Value = response.json();
        body["data"]["result"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["value"][1].as_str()?.parse().ok())
            .collect()
    }

    /// Polls `expr` until `accept` holds for its values.
    fn wait_for(&self, expr: &str, accept: impl Fn(&[f64]) -> bool) -> Vec<f64> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let port_open = std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok();
            let values = if port_open {
                self.query(expr)
            } else {
                Vec::new()
            };
            if accept(&values) {
                return values;
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus: {expr} = {values:?} after 60 s"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `promtool check metrics` on `text`: its exit status and what it said.
fn promtool_check(text: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian prometheus, installed by `make setup`)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), said)
}

#[test]
fn prometheus_scrapes_the_agents_health_and_promtool_accepts_it() {
    let cpuhot = Target::builder("CpuHot").args(["--split", "70,30"]).start();
    let dir = data_dir("metrics");
    let pid = format!("--pid={}", cpuhot.pid());
    let agent = Agent::start(
        &dir,
        &[&pid, "--sample-period", "2s", "--flush-interval", "2s"],
    );
    agent.wait_for_data("cpu", cpuhot.pid(), 500_000_000, Duration::from_secs(60));

    // The target's runtime counters, published every 5 s, named as dotnet-monitor names them.
    let pid_label = format!("process_id=\"{}\"", cpuhot.pid());
    let has_counters = |text: &str| {
        text.lines()
            .any(|l| l.starts_with("systemruntime_working_set_bytes{") && l.contains(&pid_label))
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let scrape = loop {
        let scrape = http_get(agent.metrics_port, "/metrics", &[]);
        if has_counters(&scrape.body) || Instant::now() > deadline {
            break scrape;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        has_counters(&scrape.body),
        "{}\n{}",
        scrape.body,
        agent.log()
    );
    assert_eq!(scrape.status, 200);
    assert_eq!(
        scrape.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let (valid, said) = promtool_check(&scrape.body);
    assert!(valid, "promtool check metrics: {said}\n{}", scrape.body);
    // The agent's heap, against what the kernel says of the whole process: in use ≤ what the
    // allocator holds ≤ the most the process ever had resident.
    let gauge = |name: &str| {
        scrape
            .body
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name}:\n{}", scrape.body))
    };
    let heap_in_use = gauge("clrscope_agent_heap_allocated_bytes");
    let heap_resident = gauge("clrscope_agent_heap_resident_bytes");
    let peak_resident = agent.peak_rss_kib() as f64 * 1024.0;
    assert!(
        heap_in_use > 0.0 && heap_in_use <= heap_resident && heap_resident <= peak_resident,
        "heap in use {heap_in_use}, allocator resident {heap_resident}, peak RSS {peak_resident}"
    );
    // The same numbers on the API listener, behind the token.
    assert_eq!(http_get(agent.port, "/metrics", &[]).status, 401);
    assert!(agent
        .get("/metrics")
        .body
        .contains("# TYPE clrscope_samples_total counter"));

    let prometheus = Prometheus::start(agent.metrics_port);
    prometheus.wait_for("up{job=\"clrscope\"}", |v| v == [1.0]);
    prometheus.wait_for("clrscope_processes_attached", |v| v == [1.0]);
    prometheus.wait_for("clrscope_samples_total", |v| v.len() == 1 && v[0] > 0.0);
    prometheus.wait_for("clrscope_eventpipe_sessions", |v| {
        v.len() == 1 && v[0] >= 1.0
    });
    prometheus.wait_for("clrscope_store_flushes_total", |v| {
        v.len() == 1 && v[0] >= 1.0
    });
    prometheus.wait_for("clrscope_store_bytes", |v| v.len() == 1 && v[0] > 0.0);
    let cpu = format!("systemruntime_cpu_usage_ratio{{{pid_label}}}");
    prometheus.wait_for(&cpu, |v| v.len() == 1 && v[0] > 0.0);
    drop(prometheus);

    // A process's series leave with it, and so do the families no other process writes (a
    // target's own meters would otherwise leave their HELP and TYPE lines behind for good).
    drop(cpuhot);
    let deadline = Instant::now() + Duration::from_secs(30);
    let family = "# TYPE systemruntime_working_set_bytes gauge";
    loop {
        let body = http_get(agent.metrics_port, "/metrics", &[]).body;
        if !has_counters(&body) && !body.contains(family) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the exited process's counters or their families stay:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Enabling an EventSource while a .NET 8 app starts can deadlock it (dotnet/runtime#118014):
/// the runtime counters of a process found a moment after it started come only once it has run
/// `--startup-grace`, by the kernel's clock, and then they do come.
#[test]
fn runtime_counters_wait_until_the_process_has_run_the_startup_grace() {
    const GRACE: Duration = Duration::from_secs(20);
    let target = Target::builder("CpuHot").start();
    let dir = data_dir("startup-grace");
    let pid = format!("--pid={}", target.pid());
    let agent = Agent::start(&dir, &[&pid, "--startup-grace", "20s"]);
    let series = format!(
        "systemruntime_working_set_bytes{{process_id=\"{}\"",
        target.pid()
    );
    let deadline = Instant::now() + GRACE + Duration::from_secs(90);
    let mut youngest_scrape = None;
    let first_seen_at = loop {
        let scrape = http_get(agent.metrics_port, "/metrics", &[]);
        // Measured after the scrape: a session enabled before it was enabled younger than this.
        let age = support::process_age(target.pid());
        youngest_scrape.get_or_insert(age);
        if scrape.body.lines().any(|l| l.starts_with(&series)) {
            break age;
        }
        assert!(
            Instant::now() < deadline,
            "no runtime counters by age {age:?}; agent log:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let youngest = youngest_scrape.unwrap();
    assert!(
        youngest < GRACE,
        "the first scrape came at age {youngest:?}: nothing was checked before the grace"
    );
    assert!(
        first_seen_at >= GRACE,
        "runtime counters on /metrics at age {first_seen_at:?}, before the {GRACE:?} grace;\n{}",
        agent.log()
    );
    assert!(
        agent.log().contains("the process has just started"),
        "the agent says why it waits:\n{}",
        agent.log()
    );
}

#[test]
fn go_tool_pprof_reads_the_agents_own_cpu_profile() {
    let dir = data_dir("selfprofile");
    let agent = Agent::start(&dir, &["--pid=999999999"]);
    let path = "/debug/pprof/profile?seconds=3";
    assert_eq!(http_get(agent.port, path, &[]).status, 401);
    // Work for the agent while it profiles itself: queries, answered on its thread pool.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        let port = agent.port;
        let auth = format!("Bearer {}", agent.token());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                http_get(port, "/metrics", &[("Authorization", &auth)]);
                http_get(port, "/api/v1/labels", &[("Authorization", &auth)]);
            }
        })
    };
    let rss_before = agent.rss_kib();
    let profile = agent.get(path);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    load.join().unwrap();
    // Naming the frames keeps nothing: the binary's DWARF tables, parsed and kept by the
    // `backtrace` crate's resolver, took 340 MB.
    let rss_after = agent.rss_kib();
    eprintln!("agent RSS {rss_before} KiB before the profile, {rss_after} KiB after");
    assert!(
        rss_after < rss_before + 64 * 1024,
        "the self-profile left the agent at {rss_after} KiB of RSS, from {rss_before} KiB"
    );
    let file = dir.with_extension("pb.gz");
    std::fs::write(&file, &profile.bytes).unwrap();
    let top = Command::new("go")
        .args(["tool", "pprof", "-top", "-sample_index=cpu"])
        .arg(&file)
        .output()
        .expect("go tool pprof (installed by `make setup`)");
    let text = String::from_utf8_lossy(&top.stdout);
    assert!(top.status.success(), "{top:?}");
    assert!(text.contains("Type: cpu"), "{text}");
    // Some of the time went to the agent's own code, named.
    assert!(
        text.lines()
            .any(|l| l.contains("ui::") || l.contains("axum::") || l.contains("hyper::")),
        "{text}"
    );
    let _ = std::fs::remove_file(&file);
}

/// The names of the agent's metrics (`clrscope_…`) and of the runtime's that it exports
/// (`systemruntime_…`, `systemnethttp_…`) in a PromQL expression.
fn queried_metrics(expr: &str, into: &mut std::collections::BTreeSet<String>) {
    let prefixes = ["clrscope_", "systemruntime_", "systemnethttp_"];
    for token in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if prefixes.iter().any(|p| token.starts_with(p)) {
            into.insert(token.to_string());
        }
    }
}

/// Every PromQL expression of a Grafana dashboard: panel targets and template variables.
fn dashboard_exprs(value: &Value, into: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr" | "definition", Value::String(expr)) => into.push(expr.clone()),
                    _ => dashboard_exprs(value, into),
                }
            }
        }
        Value::Array(values) => values.iter().for_each(|v| dashboard_exprs(v, into)),
        _ => {}
    }
}

/// deploy/prometheus's alert rules pass `promtool check rules`, their unit tests
/// (`promtool test rules`) fire each alert on a bad series and stay silent on a healthy one, and
/// every metric the rules and deploy/grafana's dashboard query is one a real agent exports.
#[test]
fn alerts_and_the_dashboard_query_what_the_agent_exports() {
    let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    for args in [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts.test.yml"],
    ] {
        let output = Command::new("promtool")
            .args(args)
            .current_dir(deploy.join("prometheus"))
            .output()
            .expect("promtool (Debian prometheus, installed by `make setup`)");
        assert!(output.status.success(), "promtool {args:?}: {output:?}");
    }
    let mut queried = std::collections::BTreeSet::new();
    let rules = std::fs::read_to_string(deploy.join("prometheus/alerts.yml")).unwrap();
    for line in rules.lines() {
        if let Some(expr) = line.trim().strip_prefix("expr:") {
            // Only this line is read: a block scalar would hide its metrics from the check.
            assert!(
                !expr.trim_start().starts_with(['>', '|']),
                "write each alert's expr on one line: {line}"
            );
            queried_metrics(expr, &mut queried);
        }
    }
    let dashboard: Value = serde_json::from_slice(
        &std::fs::read(deploy.join("grafana/clrscope-dashboard.json")).unwrap(),
    )
    .unwrap();
    let mut exprs = Vec::new();
    dashboard_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 10, "{exprs:?}");
    exprs.iter().for_each(|e| queried_metrics(e, &mut queried));
    assert!(queried.len() >= 12, "{queried:?}");

    // An agent with what makes each of them exist: a target calling out over HTTP, the
    // System.Net.Http meter, trace linkage (its loss counters) and an exporter (to a closed
    // port; every signal's drop counters).
    let web = Target::builder("AsyncWeb")
        .args(["--self-load", "20"])
        .start();
    let dir = data_dir("alerts");
    let pid = format!("--pid={}", web.pid());
    let agent = Agent::start_with_env(
        &dir,
        &[&pid, "--meter", "System.Net.Http", "--trace-linkage"],
        Some(support::agent::ApiKey::generate(&[])),
        &[
            ("CLRSCOPE_Exporters__backend__Kind", "otlp-http".as_ref()),
            (
                "CLRSCOPE_Exporters__backend__Endpoint",
                "http://127.0.0.1:9".as_ref(),
            ),
        ],
    );
    let exported = |text: &str, name: &str| {
        text.lines().any(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let missing = loop {
        let scrape = http_get(agent.metrics_port, "/metrics", &[]).body;
        let missing: Vec<&String> = queried.iter().filter(|n| !exported(&scrape, n)).collect();
        if missing.is_empty() || Instant::now() > deadline {
            break missing;
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    assert!(
        missing.is_empty(),
        "queried but never exported: {missing:?}\n{}",
        agent.log()
    );
}
