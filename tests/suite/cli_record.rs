//! `clrscope record` and `convert` against real .NET 8 processes, read back by `go tool pprof`.

use crate::support;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output};

use support::{pprof_top, ScratchDir, Target};

fn clrscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .args(args)
        .output()
        .expect("run clrscope")
}

/// Runs `clrscope trace` with these arguments on another thread, so a second session can watch
/// the same seconds as the one the test runs in the foreground.
fn trace_beside(args: &[&str]) -> std::thread::JoinHandle<Output> {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    std::thread::spawn(move || {
        let args: Vec<&str> = std::iter::once("trace")
            .chain(args.iter().map(String::as_str))
            .collect();
        clrscope(&args)
    })
}

fn out_dir(name: &str) -> ScratchDir {
    let dir = ScratchDir::new(&format!("record-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn path_str(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Folded stacks: total per frame name, counting each frame once per line.
fn folded_frames(file: &Path) -> HashMap<String, u64> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut totals = HashMap::new();
    for line in text.lines() {
        let (stack, value) = line.rsplit_once(' ').unwrap();
        let value: u64 = value.parse().unwrap();
        let mut seen = std::collections::HashSet::new();
        for frame in stack.split(';') {
            if seen.insert(frame) {
                *totals.entry(frame.to_string()).or_default() += value;
            }
        }
    }
    totals
}

fn method_percent(stderr: &[u8]) -> f64 {
    let text = String::from_utf8_lossy(stderr);
    let at = text
        .find("% of managed frames named")
        .unwrap_or_else(|| panic!("no resolution figure in {text}"));
    let start = text[..at].rfind(' ').unwrap() + 1;
    text[start..at].parse().unwrap()
}

#[test]
fn cpu_split_holds_and_pprof_reads_the_file() {
    let target = Target::builder("CpuHot")
        .args(["--split", "60,30,10"])
        .start();
    let dir = out_dir("split");
    let file = dir.join("cpu.pb.gz");
    let pid = target.pid().to_string();
    let cpu = support::ThreadCpuLog::start(&target);
    let output = clrscope(&[
        "record",
        "--pid",
        &pid,
        "--duration",
        "6s",
        "-o",
        path_str(&file),
    ]);
    let cpu = cpu.finish();
    assert!(output.status.success(), "{output:?}");
    // The truth is what the kernel gave each thread while the profile's samples were taken: on a
    // loaded machine it is not the split CpuHot intends, nor the split of the seconds around.
    let (from, until) = support::pprof_span(&file);
    let cpu = cpu.between(from, until);
    let used = |name: &str| cpu[name] as f64;
    let accounted = used("SpinAlpha") + used("SpinBravo") + used("SpinCharlie");
    assert!(accounted > 0.0, "no CPU accounted to CpuHot's threads");

    // Where the runtime marks managed code external (.NET 9, dotnet/runtime#123996) cpu is each
    // thread's kernel CPU spread over all its stacks: CpuHot's threads alternate spinning and
    // sleeping, so part of it lands on their Thread.Sleep stacks, all under their Spin method.
    // There each thread's whole cpu (the Spin method's cumulative value) is what must follow the
    // kernel; elsewhere the Spin method's own (flat) time must.
    let untrusted = support::sample_kinds_untrusted();
    if untrusted {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("dotnet/runtime#123996") && stderr.contains("estimated"),
            "no warning of the estimate: {stderr}"
        );
    }
    let flat = if untrusted {
        support::pprof_cum(&file, "cpu")
    } else {
        pprof_top(&file, "cpu")
    };
    let spin = |name: &str| {
        flat.iter()
            .filter(|(f, _)| f.starts_with(&format!("CpuHot.Program.{name}(")))
            .map(|(_, v)| v)
            .sum::<f64>()
    };
    let (alpha, bravo, charlie) = (spin("SpinAlpha"), spin("SpinBravo"), spin("SpinCharlie"));
    let total = alpha + bravo + charlie;
    assert!(total > 0.0, "{flat:?}");
    // In seconds too: the CPU the kernel gave the threads, not the time they spent runnable in
    // managed code, which with other work on the machine is more.
    let clock_ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let kernel_seconds = accounted / clock_ticks;
    eprintln!("cpu of the spinning threads: {total:.2} s, {kernel_seconds:.2} s by the kernel");
    assert!(
        (total - kernel_seconds).abs() <= 0.1 * kernel_seconds,
        "{total:.2} s of cpu, {kernel_seconds:.2} s by the kernel: {flat:?}"
    );
    for (share, thread, designed) in [
        (alpha, "SpinAlpha", 60.0),
        (bravo, "SpinBravo", 30.0),
        (charlie, "SpinCharlie", 10.0),
    ] {
        let percent = share * 100.0 / total;
        let kernel = used(thread) * 100.0 / accounted;
        assert!(
            (percent - kernel).abs() <= 5.0,
            "{thread}: {percent:.1}% of the profile, {kernel:.1}% by the kernel's accounting \
             (designed {designed}%): {flat:?}"
        );
    }
}

#[test]
fn frames_of_every_target_resolve() {
    let targets: [(&str, &[&str]); 5] = [
        ("CpuHot", &["--split", "50,50"]),
        ("Alloc", &["--churn-per-second", "2000000"]),
        ("AsyncWeb", &["--self-load", "50"]),
        // Enough exceptions that its throw and catch paths (precompiled CoreLib code) run often.
        ("Faults", &["--exceptions-per-second", "2000"]),
        ("Tiering", &["--late-start-ms", "500"]),
    ];
    let dir = out_dir("resolve");
    for (name, args) in targets {
        let target = Target::builder(name).args(args.iter().copied()).start();
        let pid = target.pid().to_string();
        for types in ["cpu", "wall"] {
            let file = dir.join(format!("{name}-{types}.folded"));
            let output = clrscope(&[
                "record",
                "--pid",
                &pid,
                "--duration",
                "2s",
                "--types",
                types,
                "-o",
                path_str(&file),
            ]);
            assert!(output.status.success(), "{name}: {output:?}");
            let percent = method_percent(&output.stderr);
            eprintln!("{name} {types}: {percent:.2}% of managed frames named");
            // Precompiled code no rundown names (e.g. the socket engine's epoll wait, which only
            // other precompiled code calls) is named from its image (see README, "Frames").
            assert!(
                percent >= 99.5,
                "{name} {types}: only {percent}% of managed frames named"
            );
        }
    }
}

/// Precompiled code no event names (only other precompiled code calls it) is named from the image
/// itself. Judged against the runtime: every precompiled method a rundown names must get the same
/// name from the image at its first and last instruction.
#[test]
fn ready_to_run_methods_are_named_as_the_runtime_names_them() {
    use nettrace::events::{KnownEvent, MethodEventKind};
    use symbolizer::{CodeMap, OptimizationTier};

    let target = Target::builder("AsyncWeb")
        .args(["--self-load", "20"])
        .start();
    let dir = out_dir("r2r-names");
    let trace = dir.join("rundown.nettrace");
    let pid = target.pid().to_string();
    let output = clrscope(&[
        "trace",
        "--pid",
        &pid,
        "--duration",
        "1s",
        "--profile",
        "Cpu",
        "-o",
        path_str(&trace),
    ]);
    assert!(output.status.success(), "{output:?}");
    // The target is this machine's pid, started with this command line.
    let own_pid = u64::from(target.pid());
    let command_line = std::fs::read(format!("/proc/{own_pid}/cmdline")).unwrap();
    let command_line = String::from_utf8_lossy(&command_line).replace('\0', " ");
    let local =
        collector::local::LocalProcess::find(own_pid, own_pid, command_line.trim_end()).unwrap();
    let images = symbolizer::read_proc_maps(&local).unwrap();
    let named: Vec<_> = images.iter().filter(|i| i.methods.is_some()).collect();
    assert!(
        named
            .iter()
            .any(|i| i.path.ends_with("System.Private.CoreLib.dll")),
        "no method table read for CoreLib: {images:?}"
    );

    // The runtime's names, from its rundown alone.
    let mut rundown = CodeMap::new();
    rundown.set_images(images.iter().map(|i| symbolizer::ImageRange {
        methods: None,
        ..i.clone()
    }));
    let mut precompiled = Vec::new();
    let mut reader = nettrace::NettraceReader::new(std::fs::File::open(&trace).unwrap());
    while let Some(event) = reader.next_event().unwrap() {
        let Ok(Some(known)) = event.known() else {
            continue;
        };
        if let KnownEvent::Method(m) = &known {
            if m.kind == MethodEventKind::DcEnd
                && m.size > 0
                && OptimizationTier::from_method_flags(m.flags) == OptimizationTier::ReadyToRun
            {
                precompiled.push((m.start_address, m.size));
            }
        }
        let _ = symbolizer::nettrace::apply(&mut rundown, &known, event.header.timestamp as u64);
    }

    // Generic instantiations are left to the runtime's events (the image lists them by signature,
    // not by MethodDef): the image names none of them, and must not name them wrongly.
    let (mut compared, mut unnamed, mut mismatches) = (0, 0, Vec::new());
    for &(start, size) in &precompiled {
        let Some(image) = named.iter().find(|i| i.start <= start && start < i.end) else {
            continue;
        };
        let methods = image.methods.as_ref().unwrap();
        for ip in [start, start + u64::from(size) - 1] {
            let runtime = rundown
                .function(rundown.symbolize(ip).function)
                .display_name();
            match methods.method_at(ip - image.start) {
                Some((_, ours)) if ours == runtime => compared += 1,
                Some((_, ours)) => {
                    mismatches.push(format!("{ip:#x}: runtime {runtime:?}, image {ours:?}"))
                }
                None => unnamed += 1,
            }
        }
    }
    eprintln!(
        "{} precompiled methods in the rundown: {compared} addresses named alike, {} differ, \
         {unnamed} left to the runtime",
        precompiled.len(),
        mismatches.len()
    );
    assert!(
        compared >= 1000,
        "too few precompiled methods named alike: {compared}"
    );
    assert!(
        mismatches.is_empty(),
        "{} of {compared} differ, e.g. {:#?}",
        mismatches.len(),
        &mismatches[..mismatches.len().min(20)]
    );
}

#[test]
fn late_tiered_and_framework_methods_resolve() {
    let mut target = Target::builder("Tiering")
        .args(["--late-start-ms", "1500"])
        .start();
    let dir = out_dir("tiering");
    let folded = dir.join("tiering.folded");
    let trace = dir.join("jit.nettrace");
    let pid = target.pid().to_string();
    // A second session beside the recording watches the JIT, to prove LateHelper was compiled
    // (tier 0) and promoted (tier 1) while the recording ran.
    let jit_trace = trace_beside(&[
        "--pid",
        &pid,
        "--duration",
        "5s",
        "--no-rundown",
        "--providers",
        "Microsoft-Windows-DotNETRuntime:0x18:5",
        "-o",
        path_str(&trace),
    ]);
    let output = clrscope(&[
        "record",
        "--pid",
        &pid,
        "--duration",
        "5s",
        "-o",
        path_str(&folded),
    ]);
    assert!(output.status.success(), "{output:?}");
    let traced = jit_trace.join().unwrap();
    assert!(traced.status.success(), "{traced:?}");
    assert!(target
        .wait_for_json(std::time::Duration::from_secs(1), |j| j
            .get("late_started")
            .is_some())
        .is_some());

    let frames = folded_frames(&folded);
    let has = |prefix: &str| frames.keys().any(|f| f.starts_with(prefix));
    assert!(has("Tiering.Program.LateLoop("), "{frames:?}");
    assert!(has("Tiering.Program.LateHelper(int)"), "{frames:?}");
    assert!(has("System.Linq.Enumerable."), "{frames:?}");

    let loads = jit_loads(&trace, "LateHelper");
    assert!(
        loads >= 2,
        "LateHelper compiled {loads} time(s) while recording"
    );
}

#[test]
fn ready_to_run_framework_code_resolves() {
    // Without tiering, hot framework methods keep running their ReadyToRun code.
    let target = Target::builder("Tiering")
        .args(["--late-start-ms", "600000"])
        .env("DOTNET_TieredCompilation", "0")
        .start();
    let dir = out_dir("r2r");
    let folded = dir.join("r2r.folded");
    let pid = target.pid().to_string();
    let output = clrscope(&[
        "record",
        "--pid",
        &pid,
        "--duration",
        "3s",
        "-o",
        path_str(&folded),
    ]);
    assert!(output.status.success(), "{output:?}");
    let frames = folded_frames(&folded);
    let linq = |f: &str| f.starts_with("System.Linq.");
    let named: u64 = frames
        .iter()
        .filter(|(f, _)| linq(f) && !f.starts_with("System.Linq.dll!"))
        .map(|(_, v)| v)
        .sum();
    let unnamed: Vec<&String> = frames
        .keys()
        .filter(|f| f.starts_with("System.Linq.dll!"))
        .collect();
    let all: u64 = frames
        .iter()
        .filter(|(f, _)| f.starts_with("Tiering.Program.LinqLoop("))
        .map(|(_, v)| v)
        .sum();
    // The JIT inlines part of the LINQ chain into LinqLoop; the rest runs System.Linq's R2R code
    // (4.6–10 % of the loop's samples in suite runs, depending on what was inlined).
    assert!(
        named * 50 > all,
        "named System.Linq frames in {named} of {all}: {frames:?}"
    );
    assert!(unnamed.is_empty(), "unnamed System.Linq code: {unnamed:?}");
    assert!(method_percent(&output.stderr) >= 99.0);
}

#[test]
fn convert_of_a_trace_gives_the_same_top_functions_as_record() {
    let target = Target::builder("CpuHot")
        .args(["--split", "60,30,10"])
        .start();
    let dir = out_dir("convert");
    let trace = dir.join("cpu.nettrace");
    let recorded = dir.join("recorded.folded");
    let converted = dir.join("converted.folded");
    let pid = target.pid().to_string();
    let cpu_before = target.thread_cpu_ticks();
    let runnable_before = target.thread_runnable_ns();
    // Both sessions watch the same seconds of the same process; 8 s, so that their start under
    // load (a second with two hogs) is a small part of the kernel's window around both.
    let tracing = trace_beside(&[
        "--pid",
        &pid,
        "--duration",
        "8s",
        "--profile",
        "Cpu",
        "-o",
        path_str(&trace),
    ]);
    let output = clrscope(&[
        "record",
        "--pid",
        &pid,
        "--duration",
        "8s",
        "-o",
        path_str(&recorded),
    ]);
    assert!(output.status.success(), "{output:?}");
    let traced = tracing.join().unwrap();
    let cpu_after = target.thread_cpu_ticks();
    let runnable_after = target.thread_runnable_ns();
    assert!(traced.status.success(), "{traced:?}");
    let output = clrscope(&["convert", path_str(&trace), "-o", path_str(&converted)]);
    assert!(output.status.success(), "{output:?}");
    // Where the runtime marks managed code external (.NET 9, dotnet/runtime#123996) a file holds
    // nothing to estimate cpu from (the kernel's per-thread CPU is read live): convert must say
    // so, and only `record` is judged against the kernel.
    let untrusted = support::sample_kinds_untrusted();
    if untrusted {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("cannot estimate cpu") && stderr.contains("dotnet/runtime#123996"),
            "convert did not warn: {stderr}"
        );
    }

    let shares = |file: &Path| -> Vec<(String, f64)> {
        let frames = folded_frames(file);
        let mut spin: Vec<(String, u64)> = frames
            .into_iter()
            .filter(|(f, _)| f.starts_with("CpuHot.Program.Spin"))
            .collect();
        let total: u64 = spin.iter().map(|(_, v)| v).sum();
        spin.sort_by_key(|(_, v)| std::cmp::Reverse(*v));
        spin.into_iter()
            .map(|(f, v)| (f, v as f64 * 100.0 / total as f64))
            .collect()
    };
    // Two sessions sample at different instants, so each is judged against what the kernel
    // measured of each thread over both (on a loaded machine not the split CpuHot intends), not
    // against the other. `record` estimates CPU from the kernel's per-thread CPU; a trace file has
    // no such figures, so convert's samples show where the threads were when the runtime stopped
    // them all: running or waiting for a core (a busy thread preempted by the hogs is still in
    // its busy loop), which the kernel's schedstat measures.
    let (a, b) = (shares(&recorded), shares(&converted));
    let cpu = |thread: &str| (cpu_after[thread] - cpu_before[thread]) as f64;
    let runnable = |thread: &str| (runnable_after[thread] - runnable_before[thread]) as f64;
    type Truth<'a> = &'a dyn Fn(&str) -> f64;
    let mut judged = vec![("record", &a, &cpu as Truth)];
    if !untrusted {
        judged.push(("convert", &b, &runnable));
    }
    for (profile, shares, truth) in judged {
        let accounted = truth("SpinAlpha") + truth("SpinBravo") + truth("SpinCharlie");
        assert!(accounted > 0.0, "no time accounted to CpuHot's threads");
        assert_eq!(shares.len(), 3, "{profile}: {shares:?}");
        for (function, percent) in shares {
            let thread = function
                .trim_start_matches("CpuHot.Program.")
                .trim_end_matches("(Spinner)");
            let kernel = truth(thread) * 100.0 / accounted;
            assert!(
                (percent - kernel).abs() <= 5.0,
                "{profile}: {function} {percent:.1}% of the profile, {kernel:.1}% by the \
                 kernel's accounting; record {a:?}, convert {b:?}"
            );
        }
    }
}

/// How many MethodLoadVerbose events name `method` in a trace.
fn jit_loads(trace: &Path, method: &str) -> usize {
    use nettrace::events::{KnownEvent, MethodEventKind};
    let mut reader = nettrace::NettraceReader::new(std::fs::File::open(trace).unwrap());
    let mut loads = 0;
    while let Some(event) = reader.next_event().unwrap() {
        if let Some(KnownEvent::Method(m)) = event.known().unwrap() {
            if m.kind == MethodEventKind::Load && m.name == method {
                loads += 1;
            }
        }
    }
    loads
}
