//! `clrscope ps` against real .NET 8 processes.

use crate::support;

use std::process::Command;

use serde_json::Value;
use support::Target;

fn clrscope(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .args(args)
        .output()
        .expect("run clrscope")
}

fn row_for(rows: &[Value], pid: u32) -> &Value {
    rows.iter()
        .find(|row| row["pid"] == u64::from(pid))
        .unwrap_or_else(|| panic!("pid {pid} missing from {rows:#?}"))
}

#[test]
fn lists_two_running_targets_with_their_facts() {
    let cpu = Target::builder("CpuHot").args(["--split", "100"]).start();
    let faults = Target::builder("Faults").start();

    let output = clrscope(&["ps", "--json"]);
    assert!(output.status.success(), "{output:?}");
    let rows: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();

    for (target, name) in [(&cpu, "CpuHot"), (&faults, "Faults")] {
        let row = row_for(&rows, target.pid());
        assert_eq!(row["name"], name);
        assert_eq!(row["transport"], "connect");
        assert_eq!(row["error"], Value::Null);
        let command_line = row["command_line"].as_str().unwrap();
        assert!(command_line.contains(&format!("{name}.dll")), "{row}");
        let version = row["runtime_version"].as_str().unwrap();
        assert_eq!(version, support::runtime_version(), "{row}");
        assert_eq!(row["os"], "Linux");
        let socket = row["socket"].as_str().unwrap();
        assert!(
            socket.contains(&format!("dotnet-diagnostic-{}-", target.pid())),
            "{row}"
        );
    }

    let table = clrscope(&["ps"]);
    assert!(table.status.success());
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(text.starts_with("PID"), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{} ", cpu.pid())))
        .unwrap_or_else(|| panic!("no row for CpuHot in\n{text}"));
    assert!(
        line.contains("CpuHot") && line.contains(&support::runtime_version()),
        "{line}"
    );
}

#[test]
fn one_pid_and_a_pid_that_is_not_dotnet() {
    let cpu = Target::builder("CpuHot").args(["--split", "100"]).start();
    let pid = cpu.pid().to_string();
    let output = clrscope(&["ps", "--pid", &pid, "--json"]);
    assert!(output.status.success(), "{output:?}");
    let rows: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["pid"], u64::from(cpu.pid()));

    // Our own test process is not a .NET process: the error names the cause and the fix.
    let own = std::process::id().to_string();
    let output = clrscope(&["ps", "--pid", &own]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no diagnostic socket for pid"), "{stderr}");
}

#[test]
fn a_stale_socket_is_listed_with_the_reason() {
    // A socket file whose process is alive but not listening on it: we fake it with a live
    // process of ours (this test) and a socket nobody accepts on, named with this process's
    // start time as a runtime names its own (a socket with another key is an earlier process's).
    let pid = std::process::id();
    let path = support::deaf_socket(pid);
    let output = clrscope(&["ps", "--json"]);
    let _ = std::fs::remove_file(&path);
    assert!(output.status.success(), "{output:?}");
    let rows: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    let row = row_for(&rows, pid);
    let error = row["error"].as_str().unwrap();
    assert!(error.contains("nobody listens"), "{error}");
}

#[test]
fn lists_and_resumes_a_runtime_that_dials_the_listen_socket() {
    let dir = std::env::temp_dir().join(format!("clrscope-ps-listen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("ps.sock");
    // Suspended at startup until a tool resumes it: `ps` must do that while it listens.
    let mut target = Target::builder("CpuHot")
        .args(["--split", "100"])
        .env("DOTNET_DiagnosticPorts", socket.to_str().unwrap())
        .spawn();
    let output = clrscope(&[
        "ps",
        "--diagnostic-port",
        socket.to_str().unwrap(),
        "--listen-seconds",
        "4",
        "--json",
    ]);
    assert!(output.status.success(), "{output:?}");
    let rows: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    let row = rows
        .iter()
        .find(|row| row["pid"] == u64::from(target.pid()) && row["transport"] == "listen")
        .unwrap_or_else(|| panic!("no listen row for {} in {rows:#?}", target.pid()));
    assert_eq!(row["name"], "CpuHot");
    assert_eq!(row["socket"], socket.to_str().unwrap());
    assert!(target
        .wait_ready(std::time::Duration::from_secs(30))
        .is_some());
    assert!(!socket.exists(), "ps removes its socket when it is done");
    std::fs::remove_dir_all(&dir).unwrap();
}
