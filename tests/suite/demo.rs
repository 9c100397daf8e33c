//! `make demo` keeps working: `tests/testbed/demo.sh` in its check mode (`DEMO_CHECK=1`) brings
//! up the agent with the demo's settings and Bookstore under load, and exits 0 only if, within
//! its 2 minutes, both rules fired, both artifacts were written and the profile shows the CSV
//! export's hot path. Run here on free ports and in a scratch folder, so it does not clash with
//! a demo someone keeps open or with the other tests. Needs `make setup`.

use crate::support;

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// demo.sh waits at most 2 minutes for the rules; starting and stopping take a few seconds more.
const DEMO_TIMEOUT: Duration = Duration::from_secs(240);

#[test]
fn make_demo_fires_both_rules_and_shows_the_hot_path() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = support::agent::data_dir("demo");
    let log_path = dir.with_extension("log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = Command::new("bash")
        .arg(root.join("tests/testbed/demo.sh"))
        .env("DEMO_CHECK", "1")
        .env("DEMO_PORT", "0")
        .env("DEMO_METRICS_PORT", "0")
        .env("DEMO_DIR", dir.as_os_str())
        .env("CLRSCOPE", env!("CARGO_BIN_EXE_clrscope"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .process_group(0)
        .spawn()
        .expect("start bash tests/testbed/demo.sh");
    let deadline = Instant::now() + DEMO_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    if status.is_none() {
        // Its trap stops Bookstore and the agent on TERM; KILL whatever is left.
        unsafe { support::sys::kill(-(child.id() as i32), support::sys::SIGTERM) };
        std::thread::sleep(Duration::from_secs(6));
        unsafe { support::sys::kill(-(child.id() as i32), 9) };
        let _ = child.wait();
    }
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    let agent_log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    match status {
        Some(status) if status.success() => {
            assert!(output.contains("check passed"), "{output}");
            eprintln!("{output}");
        }
        Some(status) => panic!(
            "demo.sh failed ({status}):\n{output}\n--- agent log ---\n{agent_log}"
        ),
        None => panic!(
            "demo.sh did not finish within {DEMO_TIMEOUT:?}:\n{output}\n--- agent log ---\n{agent_log}"
        ),
    }
}
