//! The web UI in a real browser: `tests/browser/webui.cjs` drives Debian Chromium through npm
//! playwright-core (both installed by `make setup`) against `clrscope agent` profiling CpuHot
//! `--split 60,30,10` with authentication on (a key from `clrscope generatekey`): the token
//! prompt, then timeline, drag, flame graph, search, sandwich, compare, export, process list,
//! each API call checked to carry the token, and the 50 000-node benchmark. Screenshots, the
//! downloaded pprof and the report go to `target/webui/`.

use crate::support;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use support::agent::{data_dir, Agent};
use support::{sys, testbed_dir, Target};

const CHROMIUM: &str = "/usr/bin/chromium";
/// The script gives up after 90 s by itself; this is for a script that hangs anyway.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(150);

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// Where the screenshots go: `target/webui/` (git-ignored).
fn artifacts_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("webui");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `node tests/browser/webui.cjs CONFIG`, in a process group of its own that is ended on drop,
/// so neither node nor the Chromium it started outlives the test.
struct Browser(Child);

impl Browser {
    /// Runs one phase of the script (see its header); its output goes to `artifacts/PHASE-*.txt`.
    fn run(config: &Value, artifacts: &Path) -> Browser {
        let phase = config["phase"].as_str().unwrap();
        let modules = testbed_dir().join("node").join("node_modules");
        for needed in [modules.join("playwright-core"), PathBuf::from(CHROMIUM)] {
            assert!(
                needed.exists(),
                "{} is missing: run `make setup` (it installs Chromium and playwright-core)",
                needed.display()
            );
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/webui.cjs");
        let child = std::os::unix::process::CommandExt::process_group(
            Command::new("node")
                .arg(script)
                .arg(config.to_string())
                .env("NODE_PATH", modules)
                .stdin(Stdio::null())
                .stdout(File::create(artifacts.join(format!("{phase}-stdout.txt"))).unwrap())
                .stderr(File::create(artifacts.join(format!("{phase}-stderr.txt"))).unwrap()),
            0,
        )
        .spawn()
        .expect("node (installed by `make setup`)");
        Browser(child)
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + BROWSER_TIMEOUT;
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the browser test ran longer than {BROWSER_TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            // SIGTERM first: Playwright then closes the browser it started.
            // SAFETY: kill(2) of the process group of our own, not yet reaped, child.
            unsafe { sys::kill(-(self.0.id() as i32), sys::SIGTERM) };
            std::thread::sleep(Duration::from_secs(2));
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn the_web_ui_in_chromium_shows_browses_compares_and_exports_a_profile() {
    let cpuhot = Target::builder("CpuHot")
        .args(["--split", "60,30,10"])
        .start();
    let dir = data_dir("webui");
    let pid = format!("--pid={}", cpuhot.pid());
    let from = unix_ms() - 1000;
    let agent = Agent::start(&dir, &[&pid, "--sample-period", "2s"]);
    agent.wait_attached(cpuhot.pid(), true, Duration::from_secs(15));
    // Three sampled seconds, one per sampler window: both halves of the window hold samples.
    agent.wait_for_data("cpu", cpuhot.pid(), 3_000_000_000, Duration::from_secs(60));
    let until = unix_ms() + 1000;

    let artifacts = artifacts_dir();
    let phase = |phase: &str| {
        let config = json!({
            "phase": phase,
            "url": format!("http://127.0.0.1:{}", agent.port),
            "token": agent.token(),
            "from": from,
            "until": until,
            "artifacts": artifacts,
            "chromium": CHROMIUM,
        });
        let status = Browser::run(&config, &artifacts).wait();
        let read = |what: &str| {
            std::fs::read_to_string(artifacts.join(format!("{phase}-{what}.txt")))
                .unwrap_or_default()
        };
        assert!(
            status.success(),
            "{}\n{}agent log:\n{}",
            read("stderr"),
            read("stdout"),
            agent.log()
        );
        let report: Value = serde_json::from_str(read("stdout").lines().last().unwrap()).unwrap();
        println!("web UI {phase}: {}", report["checks"]);
        report
    };
    let report = phase("acceptance");
    // The benchmark gets both cores but for the idle agent, which serves the page.
    drop(cpuhot);
    let benchmark = phase("benchmark");
    println!("50 000-node flame graphs: {}", benchmark["benchmark"]);

    // The pprof the page downloaded is one `go tool pprof` reads, SpinAlpha on top.
    let pprof = report["pprof"].as_str().unwrap();
    let top = Command::new("go")
        .args(["tool", "pprof", "-top", pprof])
        .output()
        .expect("go tool pprof (installed by `make setup`)");
    let text = String::from_utf8_lossy(&top.stdout);
    assert!(top.status.success(), "{top:?}");
    let first = text
        .lines()
        .find(|l| l.contains("CpuHot.Program.Spin"))
        .unwrap_or_default();
    assert!(first.contains("SpinAlpha"), "{text}");
}
