//! `clrscope agent` against real .NET 8 processes: designed profiles come out of its store through
//! its HTTP API; processes that start late, exit and restart are followed; a SIGKILL loses at most
//! the unflushed head.

mod support;

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use support::agent::{data_dir, encode, Agent};
use support::{http_request, Target};

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// Percent of the total per leaf function (the part of the frame before its argument list).
fn leaf_shares(folded: &[(String, i64)]) -> HashMap<String, f64> {
    let total: i64 = folded.iter().map(|(_, v)| v).sum();
    let mut shares = HashMap::new();
    for (stack, value) in folded {
        let leaf = stack.rsplit(';').next().unwrap_or("");
        let leaf = leaf.split('(').next().unwrap_or(leaf).to_string();
        *shares.entry(leaf).or_default() += *value as f64 * 100.0 / total as f64;
    }
    shares
}

/// CpuHot's latest progress line: CPU milliseconds per thread so far, as the kernel accounts them.
fn thread_cpu_ms(cpuhot: &mut Target) -> HashMap<String, f64> {
    cpuhot.drain_lines();
    let progress = cpuhot
        .wait_for_json(Duration::from_secs(5), |v| v.get("progress").is_some())
        .expect("CpuHot progress line");
    progress["cpu_ms"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_f64().unwrap()))
        .collect()
}

/// Sum of the samples whose stack mentions `frame`.
fn containing(folded: &[(String, i64)], frame: &str) -> i64 {
    folded
        .iter()
        .filter(|(stack, _)| stack.contains(frame))
        .map(|(_, v)| v)
        .sum()
}

/// `go tool pprof -tags` of a pprof body: the label values it lists.
fn pprof_tags(pprof: &[u8], name: &str) -> String {
    let path = std::env::temp_dir().join(format!(
        "clrscope-agent-{name}-{}.pb.gz",
        std::process::id()
    ));
    std::fs::write(&path, pprof).unwrap();
    let output = Command::new("go")
        .args(["tool", "pprof", "-tags"])
        .arg(&path)
        .output()
        .expect("go tool pprof (installed by `make setup`)");
    let _ = std::fs::remove_file(&path);
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn three_targets_profiled_continuously_and_kept_across_a_kill() {
    let mut cpuhot = Target::builder("CpuHot")
        .args(["--split", "60,30,10"])
        .start();
    let alloc = Target::builder("Alloc").start();
    let faults = Target::builder("Faults").start();
    let dir = data_dir("three");
    // Other tests' targets run beside these: profile only ours.
    let pids: Vec<String> = [&cpuhot, &alloc, &faults]
        .iter()
        .map(|t| format!("--pid={}", t.pid()))
        .collect();
    let mut args: Vec<&str> = pids.iter().map(String::as_str).collect();
    args.extend(["--sample-period", "2s", "--flush-interval", "2s"]);
    let agent = Agent::start(&dir, &args);
    let started_ms = unix_ms();

    for target in [&cpuhot, &alloc, &faults] {
        let process = agent
            .wait_attached(target.pid(), true, Duration::from_secs(15))
            .unwrap();
        assert_eq!(process["service_name"], target.name(), "{process}");
        assert_eq!(process["transport"], "connect");
    }
    // Sampler windows of ~1 s every 2 s, over which CpuHot's threads get the CPU the kernel
    // accounts to them (the designed split, unless other work on the machine skews it).
    let cpu_before = thread_cpu_ms(&mut cpuhot);
    agent.wait_for_data("cpu", cpuhot.pid(), 8_000_000_000, Duration::from_secs(60));
    let cpu_after = thread_cpu_ms(&mut cpuhot);
    let cpu = agent.folded("cpu", cpuhot.pid(), "");
    let shares = leaf_shares(&cpu);
    let accounted: f64 = cpu_after.iter().map(|(k, v)| v - cpu_before[k]).sum();
    for (thread, designed) in [("Alpha", 60.0), ("Bravo", 30.0), ("Charlie", 10.0)] {
        let method = format!("CpuHot.Program.Spin{thread}");
        let share = shares.get(&method).copied().unwrap_or(0.0);
        let key = format!("Spin{thread}");
        let kernel = (cpu_after[&key] - cpu_before[&key]) * 100.0 / accounted;
        assert!(
            (share - kernel).abs() <= 5.0,
            "{method}: {share:.1}% of cpu, {kernel:.1}% by the kernel's accounting (designed \
             {designed}%): {shares:?}"
        );
    }

    agent.wait_for_data("alloc_samples", alloc.pid(), 20, Duration::from_secs(30));
    let allocs = agent.folded("alloc_samples", alloc.pid(), "");
    let total: i64 = allocs.iter().map(|(_, v)| v).sum();
    let churn = containing(&allocs, "Alloc.Program.ChurnBatch");
    assert!(churn * 100 >= total * 90, "{churn} of {total}: {allocs:?}");
    let query = encode(&format!("{{process_id=\"{}\"}}", alloc.pid()));
    let pprof = agent.get(&format!(
        "/api/v1/profile?type=alloc_size&format=pprof&query={query}"
    ));
    let tags = pprof_tags(&pprof.bytes, "alloc");
    assert!(tags.contains("Alloc.ChurnItem"), "{tags}");

    agent.wait_for_data("exception", faults.pid(), 30, Duration::from_secs(30));
    let exceptions = agent.folded("exception", faults.pid(), "");
    assert!(
        containing(&exceptions, "Faults.Program.ThrowInjected") > 0,
        "{exceptions:?}"
    );
    assert!(
        containing(&exceptions, "Faults.Program.ThrowSecondary") > 0,
        "{exceptions:?}"
    );
    let query = encode(&format!("{{process_id=\"{}\"}}", faults.pid()));
    let pprof = agent.get(&format!(
        "/api/v1/profile?type=exception&format=pprof&query={query}"
    ));
    let tags = pprof_tags(&pprof.bytes, "exception");
    assert!(tags.contains("Faults.InjectedFaultException"), "{tags}");
    assert!(tags.contains("Faults.SecondaryFaultException"), "{tags}");

    agent.wait_for_data("lock_count", faults.pid(), 10, Duration::from_secs(30));
    let locks = agent.folded("lock_count", faults.pid(), "");
    let lock_total: i64 = locks.iter().map(|(_, v)| v).sum();
    let gate = containing(&locks, "Faults.Program.ContendGate");
    assert!(
        gate * 100 >= lock_total * 90,
        "{gate} of {lock_total}: {locks:?}"
    );
    let lock_time: i64 = agent
        .folded("lock_time", faults.pid(), "")
        .iter()
        .map(|(_, v)| v)
        .sum();
    // Each contention waits about the holder's 5 ms.
    assert!(
        lock_time >= lock_total * 1_000_000,
        "{lock_time} ns for {lock_total} waits"
    );

    // A boost through the API, and back.
    let boost = http_request(
        agent.port,
        "POST",
        &format!("/api/v1/processes/{}/boost?duration=30s", cpuhot.pid()),
        &[],
    );
    assert_eq!(boost.status, 200, "{}", boost.body);
    let left = boost.json()["sampler"]["boost_seconds_left"]
        .as_f64()
        .unwrap();
    assert!(left > 25.0 && left <= 30.0, "{}", boost.body);
    let cancel = http_request(
        agent.port,
        "DELETE",
        &format!("/api/v1/processes/{}/boost", cpuhot.pid()),
        &[],
    );
    assert_eq!(cancel.json()["sampler"]["boost_seconds_left"], Value::Null);
    assert_eq!(
        http_request(agent.port, "POST", "/api/v1/processes/1/boost", &[]).status,
        404
    );

    // What was flushed before a SIGKILL is still there after a restart. Samples older than a few
    // flush intervals (plus the symbolization delay) are on disk.
    let until_ms = unix_ms() - 8_000;
    let range = format!("&from={started_ms}&until={until_ms}");
    let before = agent.folded("cpu", cpuhot.pid(), &range);
    assert!(!before.is_empty());
    drop(agent); // SIGKILL
    let agent = Agent::start(&dir, &args);
    let after = agent.folded("cpu", cpuhot.pid(), &range);
    let sorted = |mut v: Vec<(String, i64)>| {
        v.sort();
        v
    };
    assert_eq!(sorted(after), sorted(before), "agent log:\n{}", agent.log());
    assert!(!agent.log().contains("unreadable block"), "{}", agent.log());

    // The restarted agent picks the running processes up again.
    agent.wait_attached(cpuhot.pid(), true, Duration::from_secs(15));
    cpuhot.kill();
    agent.wait_attached(cpuhot.pid(), false, Duration::from_secs(15));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn processes_that_start_late_exit_and_restart_are_followed() {
    let dir = data_dir("follow");
    let socket = dir.with_extension("sock");
    // Other tests' CpuHot processes run beside these: a split of our own tells ours apart.
    let split = ["--split", "55,45"];
    let connect = Agent::start(
        &dir.join("connect"),
        &[
            "--command-line=--split 55,45",
            "--rescan-interval",
            "1s",
            "--sample-period",
            "2s",
        ],
    );
    let socket_arg = socket.to_str().unwrap();
    let listen = Agent::start(
        &dir.join("listen"),
        &[
            "--no-connect",
            "--diagnostic-port",
            socket_arg,
            "--sample-period",
            "2s",
        ],
    );

    // Started after the agents: one found by its own socket, one dialling the listen socket.
    let mut first = Target::builder("CpuHot").args(split).start();
    let dialling = Target::builder("Tiering")
        .env("DOTNET_DiagnosticPorts", format!("{socket_arg},nosuspend"))
        .start();
    connect.wait_attached(first.pid(), true, Duration::from_secs(15));
    let process = listen
        .wait_attached(dialling.pid(), true, Duration::from_secs(15))
        .unwrap();
    assert_eq!(process["transport"], "listen", "{process}");
    assert!(
        listen.attached(first.pid()).is_none(),
        "listen-only agent dialled out"
    );
    connect.wait_for_data("cpu", first.pid(), 500_000_000, Duration::from_secs(30));
    listen.wait_for_data("wall", dialling.pid(), 500_000_000, Duration::from_secs(30));

    // It exits, and comes back as a new process: the agent lets go and attaches again.
    let first_pid = first.pid();
    first.interrupt();
    first
        .wait_exit(Duration::from_secs(10))
        .expect("CpuHot exits on Ctrl-C");
    connect.wait_attached(first_pid, false, Duration::from_secs(15));
    let restarted = Target::builder("CpuHot").args(split).start();
    connect.wait_attached(restarted.pid(), true, Duration::from_secs(15));
    connect.wait_for_data("cpu", restarted.pid(), 500_000_000, Duration::from_secs(30));
    let pids = connect.get("/api/v1/labels/process_id/values").json();
    for pid in [first_pid, restarted.pid()] {
        assert!(
            pids.as_array()
                .unwrap()
                .contains(&Value::from(pid.to_string())),
            "{pids}"
        );
    }
    assert_eq!(connect.processes().len(), 1, "{:?}", connect.processes());
    drop(connect);
    drop(listen);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&socket);
}
