//! Collection rules on a real .NET 8 target (AsyncWeb: ASP.NET Core's hosting DiagnosticSource
//! events, the `AsyncWeb` meter), driven by a settings.json as a dotnet-monitor user writes it:
//! rules fire under load, write their artifacts through FileSystem egress, report dotnet-monitor's
//! `/collectionrules` JSON, mark the web UI's timeline, capture the seconds before their trigger,
//! and stay within the artifacts' disk budget however often they fire.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nettrace::NettraceReader;
use serde_json::{json, Value};
use support::agent::{data_dir, Agent};
use support::{ScratchDir, Target};

/// A settings.json with one FileSystem egress provider `artifacts` into `artifacts`.
fn settings(dir: &Path, artifacts: &Path, rules: Value, budget: Option<u64>) -> PathBuf {
    let mut egress = json!({"FileSystem": {"artifacts": {"DirectoryPath": artifacts}}});
    if let Some(bytes) = budget {
        egress["DiskBudget"] = json!({"MaxBytes": bytes});
    }
    let file = dir.join("settings.json");
    std::fs::create_dir_all(dir).unwrap();
    let settings = json!({"Egress": egress, "CollectionRules": rules});
    std::fs::write(&file, serde_json::to_vec_pretty(&settings).unwrap()).unwrap();
    file
}

/// An agent profiling `pid` with `rules`, after its data folder (bound first, the folder outlives
/// the agent); and where its artifacts go.
fn start_agent(
    name: &str,
    pid: u32,
    rules: Value,
    budget: Option<u64>,
) -> (ScratchDir, Agent, PathBuf) {
    let dir = data_dir(name);
    let artifacts = dir.join("artifacts");
    let config = settings(&dir.join("config"), &artifacts, rules, budget);
    let agent = Agent::start(
        &dir.join("store"),
        &[
            &format!("--pid={pid}"),
            "--config",
            config.to_str().unwrap(),
        ],
    );
    (dir, agent, artifacts)
}

fn artifacts(dir: &Path) -> Vec<(String, u64)> {
    let mut files: Vec<(String, u64)> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| {
                    let meta = e.metadata().ok()?;
                    meta.is_file()
                        .then(|| (e.file_name().to_string_lossy().into_owned(), meta.len()))
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// Polls `/collectionrules` (through [`Agent::get`], which authenticates where the agent asks
/// for it) until `done` accepts it.
fn wait_rules(agent: &Agent, pid: u32, timeout: Duration, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + timeout;
    agent.wait_attached(pid, true, timeout);
    loop {
        let rules = agent.get(&format!("/collectionrules?pid={pid}")).json();
        if done(&rules) {
            return rules;
        }
        if Instant::now() > deadline {
            panic!(
                "rules not done after {timeout:?}: {rules}\nagent log:\n{}",
                agent.log()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// This process only (tests run side by side), by every key dotnet-monitor filters on: the
/// executable is `dotnet`, the entry assembly `AsyncWeb`.
fn filters(pid: u32) -> Value {
    json!([
        {"Key": "ProcessId", "Value": pid.to_string()},
        {"ProcessName": "dotnet"},
        {"Key": "ManagedEntryPointAssemblyName", "Value": "asyncweb"},
        {"Key": "CommandLine", "Value": "AsyncWeb.dll", "MatchType": "Contains"}
    ])
}

/// The seed's rules: slow /alpha requests (AspNetRequestDuration, hosting DiagnosticSource
/// events) and the request-duration histogram's p95 (EventMeter), each once per hour.
#[test]
fn the_seed_rules_fire_write_one_artifact_each_and_throttle() {
    let web = Target::builder("AsyncWeb")
        .args([
            "--self-load",
            "4",
            "--self-load-paths",
            "alpha,bravo",
            "--alpha-ms",
            "250",
            "--no-request-lines",
        ])
        .start();
    let pid = web.pid();
    let once_an_hour = json!({"ActionCount": 1, "ActionCountSlidingWindowDuration": "01:00:00"});
    let rules = json!({
        "SlowAlpha": {
            "Filters": filters(pid),
            "Trigger": {"Type": "AspNetRequestDuration", "Settings": {
                "RequestCount": "5", "RequestDuration": "00:00:00.200",
                "SlidingWindowDuration": "00:01:00", "IncludePaths": ["/alpha"]}},
            "Actions": [{"Type": "CollectGCDump", "Settings": {"Egress": "artifacts"}}],
            "Limits": once_an_hour
        },
        "SlowP95": {
            "Filters": filters(pid),
            "Trigger": {"Type": "EventMeter", "Settings": {
                "MeterName": "AsyncWeb", "InstrumentName": "asyncweb.request.duration",
                "HistogramPercentile": 95, "GreaterThan": 200,
                "SlidingWindowDuration": "00:00:01"}},
            "Actions": [{"Type": "CollectTrace", "Settings": {
                "Profile": "Cpu", "Duration": "00:00:02", "Egress": "artifacts"}}],
            "Limits": once_an_hour
        }
    });
    let (_data, agent, dir) = start_agent("rules-seed", pid, rules, None);
    let states = wait_rules(&agent, pid, Duration::from_secs(120), |rules| {
        rules
            .as_object()
            .is_some_and(|r| r.len() == 2 && r.values().all(|s| s["state"] == "Throttled"))
    });
    let reason = "This collection rule is temporarily throttled because the ActionCountLimit \
                  has been reached within the ActionCountSlidingWindowDuration.";
    assert_eq!(
        states,
        json!({
            "SlowAlpha": {"state": "Throttled", "stateReason": reason},
            "SlowP95": {"state": "Throttled", "stateReason": reason},
        })
    );
    let detail = agent
        .get(&format!("/collectionrules/SlowAlpha?pid={pid}"))
        .json();
    let keys: Vec<&str> = detail
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut expected = [
        "actionCountLimit",
        "actionCountSlidingWindowDurationLimit",
        "lifetimeOccurrences",
        "ruleFinishedCountdown",
        "slidingWindowDurationCountdown",
        "slidingWindowOccurrences",
        "state",
        "stateReason",
    ];
    expected.sort();
    assert_eq!(keys, expected);
    assert_eq!(detail["lifetimeOccurrences"], 1);
    assert_eq!(detail["actionCountLimit"], 1);
    assert_eq!(detail["actionCountSlidingWindowDurationLimit"], "01:00:00");
    assert!(
        detail["slidingWindowDurationCountdown"]
            .as_str()
            .is_some_and(|c| c.starts_with("00:5")),
        "{detail}"
    );
    assert_eq!(detail["ruleFinishedCountdown"], Value::Null);

    // One artifact each, with dotnet-monitor's names (the trace completes after its duration).
    let deadline = Instant::now() + Duration::from_secs(60);
    let files = loop {
        let files = artifacts(&dir);
        let done = files
            .iter()
            .filter(|(n, size)| *size > 0 && !n.starts_with('.'))
            .count()
            >= 2;
        if done || Instant::now() > deadline {
            break files;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(files.len(), 2, "{names:?}\nagent log:\n{}", agent.log());
    assert!(
        names.iter().any(|n| n.ends_with(&format!("_{pid}.gcdump"))),
        "{names:?}"
    );
    assert!(
        names
            .iter()
            .any(|n| n.ends_with(&format!("_{pid}.nettrace"))),
        "{names:?}"
    );

    // The firings are on the timeline.
    let events = agent.get("/api/v1/events?from=now-10m").json();
    let fired: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "collection_rule_triggered" && e["pid"] == u64::from(pid))
        .filter_map(|e| e["rule"].as_str())
        .collect();
    assert!(
        fired.contains(&"SlowAlpha") && fired.contains(&"SlowP95"),
        "{events}"
    );
}

/// The time span of a nettrace file's events, Unix nanoseconds.
fn event_span(file: &Path) -> (i64, i64, u64) {
    let mut reader = NettraceReader::new(std::fs::File::open(file).unwrap());
    let (mut first, mut last, mut count) = (i64::MAX, i64::MIN, 0u64);
    while let Some(event) = reader.next_event().unwrap() {
        let t = event.unix_nanos();
        first = first.min(t);
        last = last.max(t);
        count += 1;
    }
    reader.parser().finish().unwrap();
    (first, last, count)
}

#[test]
fn a_pre_trigger_trace_starts_ten_seconds_before_its_trigger() {
    let web = Target::builder("AsyncWeb")
        .args(["--self-load", "5", "--no-request-lines"])
        .start();
    let pid = web.pid();
    // 80 requests at 5/s: the trigger fires about 16 s after the rule is applied, with more
    // than 10 s of ring behind it.
    let rules = json!({
        "Before": {
            "Filters": filters(pid),
            "Trigger": {"Type": "AspNetRequestCount", "Settings": {
                "RequestCount": 80, "SlidingWindowDuration": "00:01:00"}},
            "Actions": [{"Type": "CollectTrace", "Settings": {
                "Profile": "Cpu", "Duration": "00:00:03", "PreTriggerSeconds": 10,
                "Egress": "artifacts"}}],
            "Limits": {"ActionCount": 1}
        }
    });
    let (_data, agent, dir) = start_agent("rules-pretrigger", pid, rules, None);
    wait_rules(&agent, pid, Duration::from_secs(120), |rules| {
        rules["Before"]["state"] == "Finished"
    });
    let events = agent.get("/api/v1/events?from=now-10m").json();
    let trigger_ms = events
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "collection_rule_triggered" && e["rule"] == "Before")
        .and_then(|e| e["unix_ms"].as_i64())
        .unwrap_or_else(|| panic!("no firing event: {events}"));
    let files = artifacts(&dir);
    assert_eq!(files.len(), 1, "{files:?}");
    let trace = dir.join(&files[0].0);
    assert!(files[0].0.ends_with(&format!("_{pid}.nettrace")));

    let (first, last, count) = event_span(&trace);
    let before = (trigger_ms * 1_000_000 - first) as f64 / 1e9;
    let after = (last - trigger_ms * 1_000_000) as f64 / 1e9;
    eprintln!("{count} events from {before:.1} s before the trigger to {after:.1} s after");
    assert!(
        before >= 9.0,
        "the trace starts only {before:.1} s before the trigger"
    );
    assert!(
        after >= 2.0,
        "the trace ends {after:.1} s after the trigger"
    );

    let inspect = Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .arg("inspect")
        .arg(&trace)
        .output()
        .unwrap();
    assert!(inspect.status.success(), "{inspect:?}");
    let pprof = dir.join("before.pb.gz");
    // A file of a runtime that marks managed code external (.NET 9, dotnet/runtime#123996) has
    // no cpu to convert (no kernel figures in a file to estimate it from): its wall profile.
    let types = if support::sample_kinds_untrusted() {
        "wall"
    } else {
        "cpu"
    };
    let convert = Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .arg("convert")
        .arg(&trace)
        .args(["--types", types, "-o"])
        .arg(&pprof)
        .output()
        .unwrap();
    assert!(convert.status.success(), "{convert:?}");
    let top = Command::new("go")
        .args(["tool", "pprof", "-top"])
        .arg(&pprof)
        .output()
        .expect("go tool pprof (installed by `make setup`)");
    assert!(top.status.success(), "{top:?}");
    let text = String::from_utf8_lossy(&top.stdout);
    assert!(
        text.contains("AsyncWeb"),
        "the rundown names the service's frames:\n{text}"
    );
}

/// A rule that fires on every request, with no effective ActionCount, writes a gcdump each time;
/// the egress folder never holds more than the disk budget. `RULES_SOAK_SECONDS` sets how
/// long (30 s here; the 5-minute run is in BENCHMARKS.md).
#[test]
fn a_rule_firing_every_second_stays_within_the_disk_budget() {
    let seconds: u64 = std::env::var("RULES_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let budget: u64 = 3 << 20;
    let web = Target::builder("AsyncWeb")
        .args(["--self-load", "2", "--no-request-lines"])
        .start();
    let pid = web.pid();
    let rules = json!({
        "Always": {
            "Filters": filters(pid),
            "Trigger": {"Type": "AspNetRequestCount", "Settings": {
                "RequestCount": 1, "SlidingWindowDuration": "00:00:01"}},
            "Actions": [{"Type": "CollectGCDump", "Settings": {"Egress": "artifacts"}}],
            "Limits": {"ActionCount": 1000000}
        }
    });
    let (_data, agent, dir) = start_agent("rules-budget", pid, rules, Some(budget));
    let started = Instant::now();
    let mut most = 0u64;
    while started.elapsed() < Duration::from_secs(seconds) {
        let used: u64 = artifacts(&dir).iter().map(|(_, size)| size).sum();
        most = most.max(used);
        assert!(
            used <= budget,
            "{used} bytes of artifacts > budget {budget}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let detail = agent
        .get(&format!("/collectionrules/Always?pid={pid}"))
        .json();
    let fired = detail["lifetimeOccurrences"].as_u64().unwrap();
    let kept = artifacts(&dir).len();
    eprintln!(
        "{fired} firings in {seconds} s; {kept} gcdumps kept; at most {most} of {budget} bytes used"
    );
    assert!(
        fired as f64 >= seconds as f64 / 4.0,
        "only {fired} firings in {seconds} s"
    );
    assert!(
        most > budget / 2,
        "the budget was never approached ({most} bytes): nothing evicted"
    );
}

/// Milliseconds of the day of an artifact name's `yyyyMMdd_HHmmss_fff` timestamp.
fn name_millis_of_day(name: &str) -> i64 {
    let digits = |range: std::ops::Range<usize>| name[range].parse::<i64>().unwrap();
    ((digits(9..11) * 60 + digits(11..13)) * 60 + digits(13..15)) * 1000 + digits(16..19)
}

/// A Schedule trigger (clrscope's own): a gcdump every 20 s, ActionCount 5. Two minutes hold six
/// ticks; the limit stops the rule after five, each named for its tick (exactly 20 s apart) and
/// marked on the timeline, and no sixth follows.
#[test]
fn a_scheduled_gcdump_every_20_seconds_keeps_to_its_limits() {
    let target = Target::builder("Alloc").start();
    let pid = target.pid();
    let rules = json!({"Every20s": {
        "Filters": [{"Key": "ProcessId", "Value": pid.to_string()}],
        "Trigger": {"Type": "Schedule", "Settings": {"Interval": "00:00:20"}},
        "Actions": [{"Type": "CollectGCDump", "Settings": {"Egress": "artifacts"}}],
        "Limits": {"ActionCount": 5}
    }});
    let (_data, agent, dir) = start_agent("rules-schedule", pid, rules, None);
    wait_rules(&agent, pid, Duration::from_secs(120), |rules| {
        rules.get("Every20s").is_some()
    });
    let applied = Instant::now();
    let finished = wait_rules(&agent, pid, Duration::from_secs(300), |rules| {
        rules["Every20s"]["state"] == "Finished"
    });
    eprintln!(
        "finished {:.1} s after the rule was seen applied: {finished}",
        applied.elapsed().as_secs_f64()
    );
    // The rest of the two minutes: nothing more comes.
    if let Some(left) = Duration::from_secs(130).checked_sub(applied.elapsed()) {
        std::thread::sleep(left);
    }
    let gcdumps: Vec<String> = artifacts(&dir)
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| name.ends_with(&format!("_{pid}.gcdump")))
        .collect();
    assert_eq!(gcdumps.len(), 5, "{gcdumps:?}\n{}", agent.log());
    let gaps: Vec<i64> = gcdumps
        .windows(2)
        .map(|w| (name_millis_of_day(&w[1]) - name_millis_of_day(&w[0])).rem_euclid(86_400_000))
        .collect();
    assert!(
        gaps.iter().all(|&gap| gap == 20_000),
        "{gaps:?} ms between {gcdumps:?}"
    );
    let events = agent.get("/api/v1/events?from=now-10m").json();
    let fired = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["kind"] == "collection_rule_triggered"
                && e["pid"] == u64::from(pid)
                && e["rule"] == "Every20s"
        })
        .count();
    assert_eq!(fired, 5, "{events}");
}

/// What the files of `dir` take: (files, bytes, bytes as the disk budget charges them — whole
/// 4 KiB blocks, at least one a file —, bytes of the blocks the filesystem gave them).
fn on_disk(dir: &Path) -> (usize, u64, u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let charge = |bytes: u64| bytes.div_ceil(4096).max(1) * 4096;
    let mut total = (0, 0, 0, 0);
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_file() {
            total.0 += 1;
            total.1 += meta.len();
            total.2 += charge(meta.len());
            total.3 += meta.blocks() * 512;
        }
    }
    total
}

/// A Schedule rule every second for 30 s writing CollectExceptions on a target that throws
/// nothing the rule asks for: no file (an action that collects nothing writes none). Beside it,
/// small non-empty exception artifacts every second under a budget of eight blocks: the files on
/// disk, counted as the budget counts them (a block each at least) and as the filesystem does
/// (`st_blocks`), stay within it, and the oldest are evicted.
#[test]
fn scheduled_exceptions_write_no_empty_files_and_small_files_are_charged_a_block() {
    let seconds = 30;
    let budget: u64 = 8 * 4096;
    let faults = |per_second: &str| {
        Target::builder("Faults")
            .args([
                "--exceptions-per-second",
                per_second,
                "--secondary-per-second",
                "0",
                "--lock-episodes-per-second",
                "0",
            ])
            .start()
    };
    let (quiet, throwing) = (faults("1"), faults("2"));
    let rule = |pid: u32, include: &str| {
        json!({"EverySecond": {
            "Filters": [{"Key": "ProcessId", "Value": pid.to_string()}],
            "Trigger": {"Type": "Schedule", "Settings": {"Interval": "00:00:01"}},
            "Actions": [{"Type": "CollectExceptions", "Settings": {"Egress": "artifacts",
                "Filters": {"Include": [{"ExceptionType": include}]}}}],
            "Limits": {"ActionCount": 1000000}
        }})
    };
    // The quiet target throws, but nothing of the type the rule collects.
    let (_d1, empty_agent, empty_dir) = start_agent(
        "rules-no-empty",
        quiet.pid(),
        rule(quiet.pid(), "Never.ThrownException"),
        None,
    );
    let (_d2, budget_agent, budget_dir) = {
        let dir = data_dir("rules-block-budget");
        let artifacts = dir.join("artifacts");
        let rules = rule(throwing.pid(), "Faults.InjectedFaultException");
        let config = settings(&dir.join("config"), &artifacts, rules, Some(budget));
        let agent = Agent::start(
            &dir.join("store"),
            &[
                &format!("--pid={}", throwing.pid()),
                // A few exceptions a file: well under a block each.
                "--exception-history",
                "2",
                "--config",
                config.to_str().unwrap(),
            ],
        );
        (dir, agent, artifacts)
    };
    for (agent, pid) in [(&empty_agent, quiet.pid()), (&budget_agent, throwing.pid())] {
        wait_rules(agent, pid, Duration::from_secs(120), |rules| {
            rules.get("EverySecond").is_some()
        });
    }
    let started = Instant::now();
    let (mut most_files, mut most_charged, mut most_blocks) = (0, 0, 0);
    while started.elapsed() < Duration::from_secs(seconds) {
        let empty = on_disk(&empty_dir);
        assert_eq!(empty.0, 0, "files written for nothing collected: {empty:?}");
        let (files, _, charged, blocks) = on_disk(&budget_dir);
        (most_files, most_charged, most_blocks) = (
            most_files.max(files),
            most_charged.max(charged),
            most_blocks.max(blocks),
        );
        assert!(
            charged <= budget && blocks <= budget,
            "{files} files charged {charged} bytes, {blocks} bytes of blocks > budget {budget}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let fired = |agent: &Agent, pid: u32| {
        agent
            .get(&format!("/collectionrules/EverySecond?pid={pid}"))
            .json()["lifetimeOccurrences"]
            .as_u64()
            .unwrap()
    };
    let (quiet_fired, throwing_fired) = (
        fired(&empty_agent, quiet.pid()),
        fired(&budget_agent, throwing.pid()),
    );
    let (files, bytes, charged, blocks) = on_disk(&budget_dir);
    eprintln!(
        "quiet: {quiet_fired} firings, {} files; budget {budget}: {throwing_fired} firings, \
         {files} files now ({bytes} bytes, charged {charged}, {blocks} bytes of blocks), at most \
         {most_files} files, {most_charged} charged, {most_blocks} of blocks",
        on_disk(&empty_dir).0
    );
    assert!(quiet_fired >= seconds / 3, "only {quiet_fired} firings");
    assert!(
        throwing_fired >= seconds / 3,
        "only {throwing_fired} firings"
    );
    // Evictions happened: far more firings than files kept, and the files are not empty.
    assert!(throwing_fired as usize > most_files + 5 && files > 0 && bytes >= files as u64);
}
