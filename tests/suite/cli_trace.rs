//! `clrscope trace` against real .NET 8 processes.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::Target;

fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("clrscope-trace-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn summary(path: &Path) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .args(["inspect", "--json"])
        .arg(path)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).unwrap()
}

fn count(summary: &Value, provider: &str, event: &str) -> u64 {
    summary["providers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["name"] == provider)
        .flat_map(|p| p["by_event"].as_array().unwrap().iter())
        .filter(|e| e["name"] == event)
        .map(|e| e["count"].as_u64().unwrap())
        .sum()
}

#[test]
fn cpu_profile_for_a_duration_writes_a_complete_private_file() {
    let target = Target::builder("CpuHot").args(["--split", "60,40"]).start();
    let dir = out_dir("duration");
    let file = dir.join("cpu.nettrace");
    let output = Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .args(["trace", "--pid", &target.pid().to_string()])
        .args(["--duration", "2s", "--profile", "Cpu", "-o"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("stopped"), "{stderr}");
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let summary = summary(&file);
    assert_eq!(summary["complete"], true);
    assert!(
        count(
            &summary,
            "Microsoft-DotNETCore-SampleProfiler",
            "ThreadSample"
        ) > 500
    );
    assert!(
        count(
            &summary,
            "Microsoft-Windows-DotNETRuntimeRundown",
            "MethodDCEndVerbose"
        ) > 100
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ctrl_c_stops_cleanly_with_rundown() {
    let target = Target::builder("Faults").start();
    let dir = out_dir("sigint");
    let file = dir.join("faults.nettrace");
    let trace = Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .args(["trace", "--pid", &target.pid().to_string()])
        .args([
            "--providers",
            "Microsoft-Windows-DotNETRuntime:0xC000:4",
            "--rundown",
            "-o",
        ])
        .arg(&file)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let status = Command::new("kill")
        .args(["-INT", &trace.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let stopped = Instant::now();
    let output = trace.wait_with_output().unwrap();
    assert!(output.status.success(), "{output:?}");
    assert!(stopped.elapsed() < Duration::from_secs(30));
    let summary = summary(&file);
    assert_eq!(summary["complete"], true);
    assert!(
        count(
            &summary,
            "Microsoft-Windows-DotNETRuntime",
            "ExceptionThrown"
        ) > 10
    );
    assert!(
        count(
            &summary,
            "Microsoft-Windows-DotNETRuntimeRundown",
            "MethodDCEndVerbose"
        ) > 0,
        "no rundown after Ctrl-C"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A session that cannot start (a socket nobody listens on, named as a runtime in a child
/// process of ours would name it) fails clearly and leaves no empty trace file behind.
#[test]
fn a_session_that_cannot_start_leaves_no_file() {
    let mut child = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = child.id();
    let socket = support::deaf_socket(pid);
    let dir = std::env::temp_dir().join(format!("clrscope-trace-nofile-{pid}"));
    std::fs::create_dir_all(&dir).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .args(["trace", "--pid", &pid.to_string(), "--duration", "1s"])
        .current_dir(&dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&socket);
    let _ = child.kill();
    let _ = child.wait();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("nobody listens"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn bad_arguments_name_the_problem() {
    let run = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_clrscope"))
            .args(args)
            .output()
            .unwrap();
        assert!(!output.status.success());
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let own = std::process::id().to_string();
    for (args, says) in [
        (
            &["trace", "--pid", &own, "--duration", "1s"][..],
            "no diagnostic socket",
        ),
        (
            &["trace", "--pid", "1", "--profile", "Disk"],
            "unknown trace profile",
        ),
        (
            &["trace", "--pid", "1", "--providers", "P:xyz"],
            "not a hex number",
        ),
        (
            &["trace", "--pid", "1", "--duration", "soon"],
            "invalid duration",
        ),
    ] {
        let stderr = run(args);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
