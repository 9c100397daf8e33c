//! What a node agent shares between the many processes it profiles, and the memory budget all of
//! their streams' parsers share, against real .NET 8 processes.

use crate::support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use collector::client::DiagnosticsClient;
use collector::session::{self, EventObserver};
use nettrace::events::{KnownEvent, MethodEventKind};
use nettrace::{Event, ParserOptions};
use support::agent::{data_dir, Agent};
use support::Target;
use symbolizer::profiles::process::{EventProfiles, ProcessProfiler};
use symbolizer::{CodeMap, FrameKind};

/// A process's code map fed by a rundown, and the rundown's own method events as the runtime
/// wrote them: the ground truth of what each address is called.
struct Rundown {
    profiler: ProcessProfiler,
    /// (start address, namespace, name, signature) of every method with code.
    methods: Vec<(u64, String, String, String)>,
}

impl EventObserver for Rundown {
    fn on_event(&mut self, event: &Event<'_>) {
        if let Ok(Some(KnownEvent::Method(m))) = event.known() {
            if m.kind == MethodEventKind::DcEnd && m.size > 0 {
                self.methods
                    .push((m.start_address, m.namespace, m.name, m.signature));
            }
        }
        self.profiler.observe(event);
    }
}

async fn rundown_of(pid: u32) -> Rundown {
    let client = DiagnosticsClient::for_pid(pid).unwrap();
    let mut rundown = Rundown {
        profiler: ProcessProfiler::new(Vec::new(), EventProfiles::default(), None),
        methods: Vec::new(),
    };
    session::rundown(&client, pid, &mut rundown, &ParserOptions::default())
        .await
        .unwrap();
    rundown
}

/// For every method of the rundown: the code map names its code as the runtime's own strings
/// say; returns the code map's function of each method's start, by (namespace, name, signature).
fn check_names(
    rundown: &Rundown,
) -> HashMap<(String, String, String), &symbolizer::CodeMapFunction> {
    let map: &CodeMap = rundown.profiler.code_map();
    let mut functions = HashMap::new();
    for (start, namespace, name, signature) in &rundown.methods {
        let frame = map.symbolize(*start);
        assert!(
            matches!(frame.kind, FrameKind::Managed { .. }),
            "{namespace}.{name} at {start:#x}: {frame:?}"
        );
        let function = map.function(frame.function);
        // Reused code memory may hold a newer method at the same start; the rundown lists each
        // version once, so a mismatch would be a naming error, not a race.
        assert_eq!(
            (function.namespace(), function.name(), function.signature()),
            (namespace.as_str(), name.as_str(), signature.as_str()),
            "the code at {start:#x}"
        );
        functions.insert(
            (namespace.clone(), name.clone(), signature.clone()),
            function,
        );
    }
    functions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framework_names_are_shared_between_processes_and_name_code_as_the_runtime_does() {
    let cpuhot = Target::builder("CpuHot").args(["--split", "100"]).start();
    let faults = Target::builder("Faults").start();
    let a = rundown_of(cpuhot.pid()).await;
    let b = rundown_of(faults.pid()).await;
    assert!(
        a.methods.len() > 500 && b.methods.len() > 500,
        "rundowns of {} and {} methods",
        a.methods.len(),
        b.methods.len()
    );
    let named_a = check_names(&a);
    let named_b = check_names(&b);
    // Each process's own hot code is there under its own name.
    assert!(named_a
        .values()
        .any(|f| f.display_name().starts_with("CpuHot.Program.SpinAlpha(")));
    assert!(named_b
        .values()
        .any(|f| f.display_name().starts_with("Faults.Program.")));
    // The framework's methods both processes run are held once.
    let mut both = 0;
    for (key, fa) in &named_a {
        let Some(fb) = named_b.get(key) else {
            continue;
        };
        // Equal names are held once, also those of code compiled into each app (the test
        // bed's common `Testbed.*`), which are other methods in other modules.
        assert!(Arc::ptr_eq(fa.names(), fb.names()), "{key:?} is held twice");
        both += usize::from(fa.module == fb.module);
    }
    let corelib = named_a
        .iter()
        .filter(|(key, f)| named_b.contains_key(*key) && &*f.module == "System.Private.CoreLib.dll")
        .count();
    eprintln!(
        "{} and {} methods named; {both} in both processes, {corelib} of them System.Private.CoreLib's",
        named_a.len(),
        named_b.len()
    );
    assert!(
        corelib > 300,
        "only {corelib} CoreLib methods in both processes"
    );
    // The processes' own code is not shared: Faults never runs CpuHot's.
    assert!(!named_b.keys().any(|(ns, _, _)| ns.starts_with("CpuHot.")));
}

#[test]
fn an_agent_wide_nettrace_budget_stops_the_sessions_over_it_and_leaves_the_target_well() {
    let cpuhot = Target::builder("CpuHot")
        .args(["--split", "60,30,10"])
        .start();
    let dir = data_dir("agent-budget");
    let pid = cpuhot.pid().to_string();
    // Less than one chunk of any stream: every session's parser is refused at its first bytes.
    let agent = Agent::start(&dir, &["--pid", &pid, "--nettrace-agent-budget", "4KiB"]);
    agent.wait_attached(cpuhot.pid(), true, Duration::from_secs(30));
    let deadline = Instant::now() + Duration::from_secs(90);
    while agent.metric("clrscope_nettrace_budget_refusals_total", &[]) < 2.0 {
        assert!(
            Instant::now() < deadline,
            "no session refused; agent log:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let log = agent.log();
    assert!(
        log.contains("--nettrace-agent-budget"),
        "the log does not say which limit stopped the sessions:\n{log}"
    );
    // The agent goes on: it still lists the process and answers.
    assert!(agent.attached(cpuhot.pid()).is_some(), "{}", agent.log());
    drop(agent);
    // The sessions were stopped in the runtime, not abandoned: the target runs on and a new
    // session samples it, its split as the kernel measures it.
    assert!(support::process_alive(cpuhot.pid()));
    let cpu = support::ThreadCpuLog::start(&cpuhot);
    let file = std::env::temp_dir().join(format!("clrscope-budget-{pid}.pb.gz"));
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .args([
            "record",
            "--pid",
            &pid,
            "--duration",
            "5s",
            "--types",
            "cpu",
            "-o",
        ])
        .arg(&file)
        .status()
        .unwrap();
    let cpu = cpu.finish();
    assert!(status.success());
    // The kernel's account over the span the samples cover, not the seconds of attach and
    // rundown around it: at load the split drifts from one second to the next.
    let (from, until) = support::pprof_span(&file);
    let used = cpu.between(from, until);
    let flat = support::pprof_top(&file, "cpu");
    let _ = std::fs::remove_file(&file);
    let spin = |thread: &str| -> f64 {
        flat.iter()
            .filter(|(f, _)| f.starts_with(&format!("CpuHot.Program.{thread}(")))
            .map(|(_, v)| v)
            .sum()
    };
    let threads = ["SpinAlpha", "SpinBravo", "SpinCharlie"];
    let profiled: f64 = threads.iter().map(|t| spin(t)).sum();
    let kernel: f64 = threads.iter().map(|t| used[*t] as f64).sum();
    assert!(profiled > 0.0 && kernel > 0.0, "{flat:?}");
    for thread in threads {
        let share = 100.0 * spin(thread) / profiled;
        let truth = 100.0 * used[thread] as f64 / kernel;
        eprintln!("{thread}: {share:.1} % recorded, {truth:.1} % by the kernel");
        assert!(
            (share - truth).abs() <= 5.0,
            "{thread}: {share:.1} % recorded, {truth:.1} % by the kernel"
        );
    }
}
