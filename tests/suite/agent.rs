//! `clrscope agent` against real .NET 8 processes: designed profiles come out of its store through
//! its HTTP API; processes that start late, exit and restart are followed; a SIGKILL loses at most
//! the unflushed head.

use crate::support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use support::agent::{data_dir, encode, go_pprof, pprof_traces, Agent, TracedSample};
use support::Target;

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

/// `go tool pprof -REPORT` of a pprof body (`tags`: the label values; `traces`: every sample).
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
    // Room for allocation ticks in a window of their own, after every other sampler window.
    args.extend([
        "--sample-window",
        "600ms",
        "--sample-period",
        "2s",
        "--flush-interval",
        "2s",
    ]);
    let agent = Agent::start(&dir, &args);
    let started_ms = unix_ms();

    for target in [&cpuhot, &alloc, &faults] {
        let process = agent
            .wait_attached(target.pid(), true, Duration::from_secs(15))
            .unwrap();
        assert_eq!(process["service_name"], target.name(), "{process}");
        assert_eq!(process["transport"], "connect");
    }
    // Sampler windows of 0.6 s every 2 s, over which CpuHot's threads get the CPU the kernel
    // accounts to them (the designed split, unless other work on the machine skews it).
    let cpu_before = thread_cpu_ms(&mut cpuhot);
    agent.wait_for_data("cpu", cpuhot.pid(), 8_000_000_000, Duration::from_secs(60));
    let cpu_after = thread_cpu_ms(&mut cpuhot);
    let cpu = agent.folded("cpu", cpuhot.pid(), "");
    // Where the runtime marks managed code external (.NET 9, dotnet/runtime#123996) cpu is each
    // thread's kernel CPU spread over its stacks, the sleeping ones of CpuHot's duty cycle too
    // (docs/runtimes.md, "Sample kinds"): there a thread's share is its Spin method's inclusive
    // share, elsewhere the method's own (leaf) share.
    let shares = if support::sample_kinds_untrusted() {
        let total: i64 = cpu.iter().map(|(_, v)| v).sum();
        ["Alpha", "Bravo", "Charlie"]
            .iter()
            .map(|t| {
                let method = format!("CpuHot.Program.Spin{t}");
                let share = containing(&cpu, &format!("{method}(")) as f64 * 100.0;
                (method, share / total as f64)
            })
            .collect()
    } else {
        leaf_shares(&cpu)
    };
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
    eprintln!(
        "allocations: {:.1} % of {total} sampled allocations in Alloc.Program.ChurnBatch (the only allocating loop after start)",
        100.0 * churn as f64 / total.max(1) as f64
    );
    assert!(churn * 100 >= total * 90, "{churn} of {total}: {allocs:?}");
    let query = encode(&format!("{{process_id=\"{}\"}}", alloc.pid()));
    let pprof = agent.get(&format!(
        "/api/v1/profile?type=alloc_size&format=pprof&query={query}"
    ));
    let tags = go_pprof("tags", &pprof.bytes, "alloc");
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
    let tags = go_pprof("tags", &pprof.bytes, "exception");
    assert!(tags.contains("Faults.InjectedFaultException"), "{tags}");
    assert!(tags.contains("Faults.SecondaryFaultException"), "{tags}");

    agent.wait_for_data("lock_count", faults.pid(), 10, Duration::from_secs(30));
    let locks = agent.folded("lock_count", faults.pid(), "");
    let lock_total: i64 = locks.iter().map(|(_, v)| v).sum();
    // Waiters contend in ContendGate; on a loaded machine the holder's own `lock` can also find
    // the gate still held by a waiter the OS descheduled between its Enter and Exit (real
    // contention, in HoldLock). Nothing else of the process contends.
    let gate = containing(&locks, "Faults.Program.ContendGate");
    let holder = containing(&locks, "Faults.Program.HoldLock");
    assert!(
        gate > 0 && (gate + holder) * 100 >= lock_total * 95,
        "{gate} in ContendGate, {holder} in HoldLock, of {lock_total}: {locks:?}"
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
    let boost = agent.request(
        "POST",
        &format!("/api/v1/processes/{}/boost?duration=30s", cpuhot.pid()),
    );
    assert_eq!(boost.status, 200, "{}", boost.body);
    let left = boost.json()["sampler"]["boost_seconds_left"]
        .as_f64()
        .unwrap();
    assert!(left > 25.0 && left <= 30.0, "{}", boost.body);
    let cancel = agent.request(
        "DELETE",
        &format!("/api/v1/processes/{}/boost", cpuhot.pid()),
    );
    assert_eq!(cancel.json()["sampler"]["boost_seconds_left"], Value::Null);
    // CpuHot's ticks walk a handful of threads (3 spinning, main, the runtime's own): the
    // window is not shortened for it.
    let sampler = &cancel.json()["sampler"];
    let threads = sampler["threads_per_tick"].as_u64().unwrap();
    assert!((3..16).contains(&threads), "{sampler}");
    assert_eq!(
        sampler["window_ms"], sampler["duty"]["window_ms"],
        "{sampler}"
    );
    assert_eq!(
        agent.request("POST", "/api/v1/processes/1/boost").status,
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
    // Alone it exits within a second; with the other tests of this file's targets and agents
    // on 2 cores it once took more than 10 s.
    first
        .wait_exit(Duration::from_secs(30))
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
    let _ = std::fs::remove_file(&socket);
}

#[test]
fn samples_carry_the_span_of_the_request_they_ran_for() {
    let mut web = Target::builder("AsyncWeb")
        .args(["--self-load", "40"])
        .start();
    let dir = data_dir("linkage");
    let pid = format!("--pid={}", web.pid());
    let agent = Agent::start(
        &dir,
        &[pid.as_str(), "--trace-linkage", "--sample-period", "2s"],
    );
    agent.wait_for_data("cpu", web.pid(), 400_000_000, Duration::from_secs(60));
    let query = encode(&format!("{{process_id=\"{}\"}}", web.pid()));
    let pprof = agent.get(&format!(
        "/api/v1/profile?type=cpu&format=pprof&query={query}"
    ));
    let samples = pprof_traces(&pprof.bytes, "linkage");

    // The target logs every request's span (the AsyncWeb.Alpha/Bravo span its hot method runs in).
    let mut kinds: HashMap<String, String> = HashMap::new();
    for line in web.drain_lines() {
        if let Ok(request) = serde_json::from_str::<Value>(&line) {
            if let (Some(kind), Some(span)) =
                (request["kind"].as_str(), request["span_id"].as_str())
            {
                kinds.insert(span.to_string(), kind.to_string());
            }
        }
    }
    for (kind, method) in [
        ("alpha", "AsyncWeb.Handlers.AlphaHot"),
        ("bravo", "AsyncWeb.Handlers.BravoHot"),
    ] {
        let inside: Vec<&TracedSample> = samples
            .iter()
            .filter(|s| s.frames.iter().any(|f| f.starts_with(method)))
            .collect();
        let all: f64 = inside.iter().map(|s| s.millis).sum();
        let with_span: f64 = inside
            .iter()
            .filter(|s| s.labels.contains_key("span_id"))
            .map(|s| s.millis)
            .sum();
        let right: f64 = inside
            .iter()
            .filter(|s| {
                s.labels
                    .get("span_id")
                    .and_then(|id| kinds.get(id))
                    .map(String::as_str)
                    == Some(kind)
            })
            .map(|s| s.millis)
            .sum();
        let (precision, recall) = (right * 100.0 / with_span, with_span * 100.0 / all);
        eprintln!("{method}: {all:.1} ms of cpu, precision {precision:.1}%, recall {recall:.1}%");
        assert!(all > 0.0, "no samples in {method}");
        assert!(
            precision >= 90.0 && recall >= 80.0,
            "{method}: precision {precision:.1}%, recall {recall:.1}%"
        );
    }

    // The profile of one span holds that span's samples and nothing else.
    let (span_id, _) = samples
        .iter()
        .filter_map(|s| Some((s.labels.get("span_id")?.clone(), s.millis)))
        .fold(HashMap::<String, f64>::new(), |mut m, (id, ms)| {
            *m.entry(id).or_default() += ms;
            m
        })
        .into_iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .expect("some sample carries a span");
    let one = agent.get(&format!(
        "/api/v1/profile?type=cpu&format=pprof&query={query}&span_id={span_id}"
    ));
    let traced = pprof_traces(&one.bytes, "one-span");
    assert!(!traced.is_empty());
    for sample in &traced {
        assert_eq!(
            sample.labels.get("span_id"),
            Some(&span_id),
            "{:?} {:?}",
            sample.labels,
            sample.frames
        );
        assert!(sample.labels.contains_key("trace_id") && sample.labels.contains_key("span_name"));
    }
}

/// The share of frames, weighted by sample value, that are unnamed: `[unknown]` (an address in
/// no known code or file) and `Module.dll!+0xOFFSET` (in a managed image, in no known method).
/// The runtime's native code is named by its file (`libcoreclr.so!+0x…`, see docs/profiles.md).
fn unnamed_share(samples: &[TracedSample]) -> (f64, Vec<String>) {
    let (mut frames, mut unnamed) = (0.0, 0.0);
    let mut examples = Vec::new();
    for sample in samples {
        for frame in &sample.frames {
            frames += sample.millis;
            let in_managed_image = frame
                .split_once("!+0x")
                .is_some_and(|(module, _)| module.ends_with(".dll") || module.ends_with(".exe"));
            if frame == "[unknown]" || in_managed_image {
                unnamed += sample.millis;
                if examples.len() < 10 && !examples.contains(frame) {
                    examples.push(frame.clone());
                }
            }
        }
    }
    (unnamed / frames.max(f64::MIN_POSITIVE), examples)
}

/// An agent in listen mode only (2 s sampler period) on a socket of its own beside `dir`, with
/// `extra` arguments: the agent and the socket runtimes dial.
fn listen_agent(dir: &Path, extra: &[&str]) -> (Agent, PathBuf) {
    let socket = dir.with_extension("sock");
    let mut args = vec![
        "--no-connect",
        "--diagnostic-port",
        socket.to_str().unwrap(),
        "--sample-period",
        "2s",
    ];
    args.extend_from_slice(extra);
    let agent = Agent::start(&dir.join("agent"), &args);
    (agent, socket)
}

#[test]
fn listen_mode_names_every_frame() {
    let dir = data_dir("listen-named");
    let (agent, socket) = listen_agent(
        &dir,
        &["--log", "clrscope=info,clrscope::agent::process=debug"],
    );
    let socket_arg = socket.to_str().unwrap();
    // DOTNET_DiagnosticPorts suspends the runtime at startup until the agent resumes it: the
    // ReadyToRun code of its startup and of the thread pool runs only after the agent is there,
    // and no rundown at attach lists it.
    let shop = Target::builder("Bookstore")
        .args(["--self-load", "10"])
        .env("DOTNET_DiagnosticPorts", socket_arg)
        .start();
    let query = encode(&format!("{{process_id=\"{}\"}}", shop.pid()));
    // The first window on its own (taken while the runtime starts), then every window.
    agent.wait_for_data("wall", shop.pid(), 1, Duration::from_secs(90));
    let first_until = unix_ms();
    let first = format!("&until={first_until}");
    let (share, examples) = unnamed_share(&pprof_traces(
        &agent
            .get(&format!(
                "/api/v1/profile?type=wall&format=pprof&query={query}{first}"
            ))
            .bytes,
        "listen-named-first",
    ));
    assert!(
        share <= 0.005,
        "first window: {:.2} % of wall frames unnamed, e.g. {examples:?}; agent log:\n{}",
        share * 100.0,
        agent.log()
    );
    eprintln!(
        "first window: {:.2} % of wall frames unnamed",
        share * 100.0
    );
    wait_for_window_after(&agent, shop.pid(), first_until);
    for (profile_type, min_total) in [("wall", 1), ("cpu", 50_000_000)] {
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        while agent
            .folded(profile_type, shop.pid(), "")
            .iter()
            .map(|(_, v)| v)
            .sum::<i64>()
            < min_total
        {
            assert!(
                std::time::Instant::now() < deadline,
                "no {profile_type} data"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        let pprof = agent.get(&format!(
            "/api/v1/profile?type={profile_type}&format=pprof&query={query}"
        ));
        let samples = pprof_traces(&pprof.bytes, &format!("listen-named-{profile_type}"));
        assert!(!samples.is_empty(), "{profile_type}: no samples");
        let (share, examples) = unnamed_share(&samples);
        assert!(
            share <= 0.005,
            "{profile_type}: {:.2} % of frames unnamed, e.g. {examples:?}; agent log:\n{}",
            share * 100.0,
            agent.log()
        );
    }
    drop(agent);
    let _ = std::fs::remove_file(&socket);
}

#[test]
fn listen_mode_cpu_split_holds_against_the_kernel() {
    let dir = data_dir("listen-split");
    let (agent, socket) = listen_agent(&dir, &[]);
    let socket_arg = socket.to_str().unwrap();
    let cpuhot = Target::builder("CpuHot")
        .args(["--split", "60,30,10"])
        .env("DOTNET_DiagnosticPorts", socket_arg)
        .start();
    agent.wait_for_data("cpu", cpuhot.pid(), 1, Duration::from_secs(90));
    // The stretch: from now until the kernel has given the spinning threads 30 s of CPU, which a
    // loaded machine may take longer to give than an idle one.
    let from = unix_ms();
    let before = cpuhot.thread_cpu_ticks();
    let threads = ["SpinAlpha", "SpinBravo", "SpinCharlie"];
    let used = |now: &HashMap<String, u64>, thread: &str| (now[thread] - before[thread]) as f64;
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    let after = loop {
        let now = cpuhot.thread_cpu_ticks();
        if threads.iter().map(|t| used(&now, t)).sum::<f64>() >= 3000.0 {
            break now;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "CpuHot got too little CPU"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let until = unix_ms();
    wait_for_window_after(&agent, cpuhot.pid(), until);
    let folded = agent.folded("cpu", cpuhot.pid(), &format!("&from={from}&until={until}"));
    let profiled = |thread: &str| {
        let method = format!("CpuHot.Program.{thread}(");
        folded
            .iter()
            .filter(|(stack, _)| stack.contains(&method))
            .map(|(_, v)| *v as f64)
            .sum::<f64>()
    };
    let (profile_total, kernel_total): (f64, f64) = (
        threads.iter().map(|t| profiled(t)).sum(),
        threads.iter().map(|t| used(&after, t)).sum(),
    );
    assert!(
        profile_total > 0.0,
        "no spinning in the profile: {folded:?}"
    );
    for thread in threads {
        let (percent, kernel) = (
            profiled(thread) * 100.0 / profile_total,
            used(&after, thread) * 100.0 / kernel_total,
        );
        eprintln!("{thread}: {percent:.1} % of the profile, {kernel:.1} % by the kernel");
        assert!(
            (percent - kernel).abs() <= 3.0,
            "{thread}: {percent:.1} % of the listen-mode profile, {kernel:.1} % of the kernel's CPU"
        );
    }
    drop(agent);
    let _ = std::fs::remove_file(&socket);
}

/// Waits until the agent stored a window of `pid` that started after `after_ms`, so every
/// window before it is stored too.
fn wait_for_window_after(agent: &Agent, pid: u32, after_ms: u128) {
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while agent
        .folded("wall", pid, &format!("&from={}", after_ms + 1))
        .is_empty()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no window after {after_ms}; agent log:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// What was measured of one spinning thread over one stretch of time, in seconds.
#[derive(Debug)]
struct Spin {
    /// The agent's cpu and wall time of the thread's spin method.
    cpu: f64,
    wall: f64,
    /// The kernel's CPU time of its thread.
    kernel: f64,
    /// The stretch's length.
    elapsed: f64,
}

/// [`Spin`] of each of CpuHot's `threads` (`SpinAlpha`, ...) over one stretch of time from now,
/// through `during` (which starts anything the stretch needs) for `millis`.
fn spin_seconds(
    agent: &Agent,
    spinner: &Target,
    threads: &[&str],
    during: impl FnOnce(),
    millis: u64,
) -> Vec<Spin> {
    let clock_ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let from_ms = unix_ms();
    let before = spinner.thread_cpu_ticks();
    during();
    std::thread::sleep(Duration::from_millis(millis));
    let after = spinner.thread_cpu_ticks();
    let until_ms = unix_ms();
    wait_for_window_after(agent, spinner.pid(), until_ms);
    let range = format!("&from={from_ms}&until={until_ms}");
    let (cpu, wall) = (
        agent.folded("cpu", spinner.pid(), &range),
        agent.folded("wall", spinner.pid(), &range),
    );
    threads
        .iter()
        .map(|thread| {
            let method = format!("CpuHot.Program.{thread}");
            Spin {
                cpu: containing(&cpu, &method) as f64 / 1e9,
                wall: containing(&wall, &method) as f64 / 1e9,
                kernel: (after[*thread] - before[*thread]) as f64 / clock_ticks,
                elapsed: (until_ms - from_ms) as f64 / 1e3,
            }
        })
        .collect()
}

/// A thread that spins without pause reads as the time it spun, at the default duty cycle's 10 %
/// (a 200 ms window every 2 s, so that a minute holds many windows) and during a boost: its wall
/// time is the stretch's length, and its cpu time the kernel's CPU time of it (which, with other
/// work on the machine, is less than the wall time it spent runnable in managed code).
fn assert_spin_true(spin: &Spin, what: &str) {
    eprintln!("{what}: {spin:?}");
    assert!(
        (spin.wall - spin.elapsed).abs() <= 0.1 * spin.elapsed,
        "{what}: wall {spin:?}"
    );
    assert!(
        (spin.cpu - spin.kernel).abs() <= 0.1 * spin.kernel,
        "{what}: cpu {spin:?}"
    );
}

/// An agent profiling `pid` alone at the default duty cycle's 10 %, in 200-ms windows every 2 s so
/// that a minute holds many windows; its data in `dir`.
fn agent_sampling_200ms_every_2s(dir: &Path, pid: u32, extra: &[&str]) -> Agent {
    let pid_arg = format!("--pid={pid}");
    let mut args = vec![
        pid_arg.as_str(),
        "--sample-window",
        "200ms",
        "--sample-period",
        "2s",
    ];
    args.extend_from_slice(extra);
    Agent::start(dir, &args)
}

#[test]
fn totals_estimate_real_time_at_any_duty_cycle() {
    // One thread, busy the whole of every window: CPU-bound without pause.
    let spinner = Target::builder("CpuHot")
        .args(["--split", "1", "--cores", "1"])
        .start();
    let dir = data_dir("spinning");
    let agent = agent_sampling_200ms_every_2s(&dir, spinner.pid(), &[]);
    agent.wait_for_data("cpu", spinner.pid(), 1, Duration::from_secs(60));
    let duty = spin_seconds(&agent, &spinner, &["SpinAlpha"], || {}, 40_000);
    assert_spin_true(&duty[0], "duty cycle");
    // Boosted windows cover the boost exactly; the stretch ends just after it.
    let boost = || {
        let boost = agent.request(
            "POST",
            &format!("/api/v1/processes/{}/boost?duration=40s", spinner.pid()),
        );
        agent.expect_status(boost, 200, "boost");
    };
    let boosted = spin_seconds(&agent, &spinner, &["SpinAlpha"], boost, 40_500);
    assert_spin_true(&boosted[0], "boosted");
}

/// A process that barely runs (below 1 % of a core) is sampled one period in three, and each of
/// its windows stands for the periods skipped before it: its waiting main thread's wall time is
/// still the stretch's length on the clock.
#[test]
fn an_idle_process_is_sampled_one_period_in_three_and_its_wall_time_holds() {
    let meters = Target::builder("Meters")
        .args(["--no-wait", "--steps", "1000", "--step-ms", "60000"])
        .start();
    let dir = data_dir("idle");
    let agent = agent_sampling_200ms_every_2s(
        &dir,
        meters.pid(),
        &["--log", "clrscope=info,clrscope::agent::process=debug"],
    );
    // Idle once its start-up (JIT, the agent's own sessions starting) is over.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while agent
        .attached(meters.pid())
        .is_none_or(|process| process["sampler"]["idle"] != true)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "never idle: {:?}; agent log:\n{}",
            agent.attached(meters.pid()),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let from_ms = unix_ms();
    std::thread::sleep(Duration::from_secs(48));
    let until_ms = unix_ms();
    wait_for_window_after(&agent, meters.pid(), until_ms);

    // One window in three periods; a period in which the process ran more has its own.
    let periods = (until_ms - from_ms) / 2000;
    let windows = window_openings(&agent.log(), meters.pid())
        .into_iter()
        .filter(|opened| (from_ms..until_ms).contains(opened))
        .count() as u128;
    assert!(
        windows >= 2 && windows * 2 <= periods,
        "{windows} windows in {periods} periods; agent log:\n{}",
        agent.log()
    );
    // Its windows come every 6 s and stand for 6 s each: the stretch's edges cut one at most.
    let range = format!("&from={from_ms}&until={until_ms}");
    let wall = containing(
        &agent.folded("wall", meters.pid(), &range),
        "Meters.Program.Main",
    );
    let wall = wall as f64 / 1e9;
    let elapsed = (until_ms - from_ms) as f64 / 1e3;
    eprintln!("idle: {windows} windows in {periods} periods; main thread's wall {wall:.1} s of {elapsed:.1} s");
    assert!(
        (wall - elapsed).abs() <= 6.0 + 0.1 * elapsed,
        "main thread's wall {wall:.1} s over {elapsed:.1} s ({windows} windows)"
    );
}

/// When each sampler window of `pid` opened (Unix ms), from the agent's debug log.
fn window_openings(log: &str, pid: u32) -> Vec<u128> {
    let pid = format!("pid={pid} ");
    log.lines()
        .filter(|line| line.contains("sampler window closed") && line.contains(&pid))
        .filter_map(|line| {
            let (_, rest) = line.split_once("opened_unix_ms=")?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .collect()
}

/// A thread waiting for a core is still in managed code to the runtime's sampler, so on an
/// oversubscribed node `cpu` showed the CPU threads ask for, not what they got. Two threads spin
/// on one core, one at nice 10, so the kernel runs them about 9:1 while the sampler finds both
/// in managed code at most ticks: each one's `cpu` is the CPU time the kernel gave it.
#[test]
fn cpu_follows_the_kernel_when_threads_wait_for_a_core() {
    let cpuhot = Target::builder("CpuHot")
        .args(["--split", "50,50", "--cores", "2"])
        .start();
    support::crowd_onto_one_core(&cpuhot, "SpinBravo");
    let dir = data_dir("crowded");
    let pid_arg = format!("--pid={}", cpuhot.pid());
    let agent = Agent::start(&dir, &[&pid_arg, "--sample-period", "2s"]);
    agent.wait_for_data("cpu", cpuhot.pid(), 1, Duration::from_secs(60));
    let threads = ["SpinAlpha", "SpinBravo"];
    let spins = spin_seconds(&agent, &cpuhot, &threads, || {}, 30_000);
    let (alpha, bravo) = (&spins[0], &spins[1]);
    assert!(
        alpha.kernel >= 3.0 * bravo.kernel,
        "the threads were not crowded onto one core: {spins:?}"
    );
    for (thread, spin) in threads.iter().zip(&spins) {
        eprintln!("{thread}: {spin:?}");
        assert!(
            (spin.cpu - spin.kernel).abs() <= 0.15 * spin.kernel + 0.2,
            "{thread}: {spin:?}"
        );
    }
}

/// A listen-mode runtime in a pid namespace of its own (pid 1 there, as in a container) is
/// profiled, and what the agent reads of `/proc` is that process's (its thread names), never
/// this machine's pid 1.
#[test]
fn listen_mode_reads_the_proc_of_a_runtime_in_another_pid_namespace() {
    let dir = data_dir("listen-pidns");
    let socket = dir.with_extension("sock");
    let socket_arg = socket.to_str().unwrap();
    let agent = Agent::start(
        &dir.join("agent"),
        &[
            "--no-connect",
            "--diagnostic-port",
            socket_arg,
            "--sample-period",
            "2s",
        ],
    );
    let service = Target::builder("CpuHot")
        .args(["--split", "70,30"])
        .env("DOTNET_DiagnosticPorts", socket_arg)
        .wrapped_in([
            "unshare",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount",
            "--mount-proc",
            "--",
        ])
        .start();
    // The runtime advertises its own pid: 1.
    agent.wait_attached(1, true, Duration::from_secs(30));
    agent.wait_for_data("cpu", 1, 200_000_000, Duration::from_secs(90));
    let query = encode("{process_id=\"1\"}");
    let pprof = agent.get(&format!(
        "/api/v1/profile?type=cpu&format=pprof&query={query}"
    ));
    let samples = pprof_traces(&pprof.bytes, "listen-pidns");
    let spin = samples
        .iter()
        .find(|s| {
            s.frames
                .iter()
                .any(|f| f.starts_with("CpuHot.Program.SpinAlpha"))
        })
        .expect("SpinAlpha sampled");
    assert_eq!(
        spin.labels.get("thread_name").map(String::as_str),
        Some("SpinAlpha"),
        "the thread's name read from the runtime's own /proc entry: {:?}",
        spin.labels
    );
    drop(service);
    drop(agent);
    let _ = std::fs::remove_file(&socket);
}

/// Neither a runtime that stops answering (frozen here with SIGSTOP, as a debugger or a cgroup
/// freezer does) nor a client in the middle of a long `/logs` stream keeps the agent from
/// stopping: on SIGTERM it is gone within its two stop deadlines (12 s each) and the exporters'
/// 5 s. Before the deadlines it answered the stream to its end (300 s here).
#[test]
fn an_agent_asked_to_stop_waits_for_no_runtime_and_no_client() {
    use std::io::{Read, Write};
    let dir = data_dir("stop-bounded");
    let streamed = Target::builder("Logs")
        .args(["--messages-per-second", "100"])
        .start();
    let frozen = Target::builder("Bookstore")
        .args(["--self-load", "10"])
        .start();
    let (streamed_pid, frozen_pid) = (streamed.pid(), frozen.pid());
    let mut agent = Agent::start(
        &dir,
        &[
            "--pid",
            &streamed_pid.to_string(),
            "--pid",
            &frozen_pid.to_string(),
            "--trace-linkage",
            "--startup-grace",
            "0s",
        ],
    );
    agent.wait_for_data("wall", frozen_pid, 1, Duration::from_secs(90));
    let mut client = std::net::TcpStream::connect(("127.0.0.1", agent.port)).unwrap();
    write!(
        client,
        "GET /logs?pid={streamed_pid}&level=Information&durationSeconds=300 HTTP/1.1\r\n\
         Host: 127.0.0.1:{}\r\nAuthorization: Bearer {}\r\n\r\n",
        agent.port,
        agent.token()
    )
    .unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut head = [0u8; 12];
    client.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200", "the /logs stream did not start");
    // SAFETY: kill(2) on a target this test started.
    unsafe { support::sys::kill(frozen_pid as i32, support::sys::SIGSTOP) };
    let status = agent.terminate(Duration::from_secs(60));
    // SAFETY: as above; the target is killed on drop either way.
    unsafe { support::sys::kill(frozen_pid as i32, support::sys::SIGCONT) };
    assert!(
        status.is_some_and(|s| s.success()),
        "the agent, asked to stop beside a frozen runtime and a /logs stream, ended with \
         {status:?} (None: still running after 60 s):\n{}",
        agent.log()
    );
}
