//! `clrscope stacks` and `clrscope top` against real .NET 8 processes.

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

#[test]
fn stacks_show_every_spinning_thread_in_its_method() {
    let target = Target::builder("CpuHot")
        .args(["--split", "34,33,33", "--cores", "3"])
        .start();
    let pid = target.pid().to_string();
    let output = clrscope(&["stacks", "--pid", &pid, "--json"]);
    assert!(output.status.success(), "{output:?}");
    let threads: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    for name in ["SpinAlpha", "SpinBravo", "SpinCharlie"] {
        let thread = threads
            .iter()
            .find(|t| t["thread_name"] == name)
            .unwrap_or_else(|| panic!("no thread {name} in {threads:#?}"));
        let frames = thread["frames"].as_array().unwrap();
        // Busy in its spin method or sleeping between windows: either way its method is on the stack.
        assert!(
            frames
                .iter()
                .any(|f| f["function"] == format!("CpuHot.Program.{name}(Spinner)")),
            "{thread:#}"
        );
        assert!(frames
            .iter()
            .all(|f| !f["function"].as_str().unwrap().starts_with("[unknown]")));
    }
    let text = clrscope(&["stacks", "--pid", &pid]);
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("(SpinAlpha)") && text.contains("    CpuHot.Program."),
        "{text}"
    );
}

#[test]
fn top_ranks_the_hottest_method_first() {
    let target = Target::builder("CpuHot").args(["--split", "80,20"]).start();
    let pid = target.pid().to_string();
    let output = clrscope(&["top", "--pid", &pid, "--duration", "3s", "--rows", "5"]);
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    // Not a terminal: one plain frame per refresh. The last frame ranks by self time.
    let last = text.rsplit("clrscope top:").next().unwrap();
    let rows: Vec<&str> = last.lines().skip(2).filter(|l| !l.is_empty()).collect();
    assert!(rows.len() <= 5, "{text}");
    if support::sample_kinds_untrusted() {
        // Where the runtime marks managed code external (.NET 9, dotnet/runtime#123996) each
        // thread's kernel CPU is spread over all its stacks, its Thread.Sleep and the spin loop's
        // callees included: no self ranking can hold there, and top says it estimates.
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("dotnet/runtime#123996"),
            "no warning of the estimate: {stderr}"
        );
        return;
    }
    assert!(
        rows.first()
            .is_some_and(|r| r.ends_with("CpuHot.Program.SpinAlpha(Spinner)")),
        "{text}"
    );
}
