//! clrscope beside the tools .NET engineers already trust, on the real Storefront under load (with
//! PostgreSQL) and two busy loops beside it: `dotnet-trace` collecting the same providers from the
//! same process at the same time, TraceEvent (PerfView's library, tests/peers/TraceEventReader)
//! reading both files, and `dotnet-trace ps` listing the same processes. Needs `make setup`.

use crate::support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;
use support::peers::{dotnet_tool, json_of, trace_event};
use support::postgres::Postgres;
use support::{ScratchDir, Target};

/// The providers both tools are given, in dotnet-trace's syntax (which `clrscope trace` takes too):
/// the sampler, the runtime's GC, loader, JIT and exception events, and ASP.NET Core's hosting
/// EventSource (its events TraceEvent reads from the trace's metadata).
const PROVIDERS: &str = "Microsoft-DotNETCore-SampleProfiler:0x0:5,\
Microsoft-Windows-DotNETRuntime:0x8019:4,\
Microsoft.AspNetCore.Hosting:0x0:4";
const RUNDOWN: &str = "Microsoft-Windows-DotNETRuntimeRundown";
/// How long dotnet-trace traces; clrscope's session is 10 s longer, so it spans dotnet-trace's
/// (which starts seconds later: the tool starts its own runtime first).
const TRACE_SECONDS: u64 = 20;
/// What is cut from each end of the interval both sessions were on: enabling and disabling a
/// session's providers is not one instant for every thread.
const EDGE_SECONDS: f64 = 1.0;
/// PerfView's fold pattern for the managed GC poll, whose leaf frames clrscope leaves out of every
/// stack on purpose (docs/runtimes.md, "GC poll in loops"): a PerfView user folds it the same way.
const GC_POLL_FOLD: &str = "PollGC";

/// Two `sh` busy loops, killed on drop: the suite's load beside a test.
struct Hogs(Vec<Child>);

impl Hogs {
    fn start() -> Hogs {
        Hogs(
            (0..2)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .spawn()
                        .expect("start a busy loop")
                })
                .collect(),
        )
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The Storefront on PostgreSQL with its downstream, and StorefrontLoad sending it a mix for
/// `seconds`. Dropped in reverse: the load, the services, then the database.
struct Service {
    load: Target,
    front: Target,
    _down: Target,
    _db: Postgres,
}

fn fact(t: &Target, pointer: &str) -> String {
    t.ready_fact(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no {pointer} in {:?}", t.ready()))
        .to_string()
}

impl Service {
    fn start(name: &str, seconds: u32) -> Service {
        let db = Postgres::start(name);
        let down = Target::builder("Storefront")
            .args(["--role", "downstream"])
            .start();
        let front = Target::builder("Storefront")
            .args(["--postgres", &db.connection_string()])
            .args(["--downstream", &fact(&down, "/url")])
            .args(["--downstream-grpc", &fact(&down, "/grpc_url")])
            // CPU in a function of the service's own, and exceptions for the runtime's events.
            .args(["--behaviour", "hot_ms=20,exception_every=5"])
            .start();
        let load = Target::builder("StorefrontLoad")
            .args(["--target", &fact(&front, "/url")])
            .args(["--grpc-target", &fact(&front, "/grpc_url")])
            .args(["--rps", "40"])
            .args([
                "--mix",
                "catalog:2,product:4,cart:2,checkout:3,recommend:3,coupon:2,report:1",
            ])
            .args(["--duration-seconds", &seconds.to_string()])
            .start();
        Service {
            load,
            front,
            _down: down,
            _db: db,
        }
    }
}

/// `clrscope inspect --json FILE`.
fn inspect(file: &Path) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .args(["inspect", "--json"])
        .arg(file)
        .output()
        .unwrap();
    json_of("clrscope inspect", &output)
}

/// The runtime's GCDynamicEvent, whose payloads TraceEvent's GCDynamicTraceEventParser decodes
/// where it knows them, as events with ids of its own above 0xFF00 (`GC/CommittedUsage`: 0xFFF4);
/// the runtime's own ids are below 400.
const GC_DYNAMIC_EVENT: u64 = 39;
const RUNTIME: &str = "Microsoft-Windows-DotNETRuntime";
const GC_START: u64 = 1;

/// (provider, event id as the runtime wrote it) -> count, from TraceEvent's reading.
fn trace_event_counts(reading: &Value) -> BTreeMap<(String, u64), u64> {
    let mut counts = BTreeMap::new();
    for e in reading["by_event"].as_array().unwrap() {
        let provider = e["provider"].as_str().unwrap().to_string();
        let mut id = e["id"].as_u64().unwrap();
        if provider == RUNTIME && id > 0xFF00 {
            id = GC_DYNAMIC_EVENT;
        }
        *counts.entry((provider, id)).or_default() += e["count"].as_u64().unwrap();
    }
    counts
}

/// (provider, event id) -> count, from `clrscope inspect`.
fn inspect_counts(summary: &Value) -> BTreeMap<(String, u64), u64> {
    let mut counts = BTreeMap::new();
    for provider in summary["providers"].as_array().unwrap() {
        let name = provider["name"].as_str().unwrap();
        for event in provider["by_event"].as_array().unwrap() {
            *counts
                .entry((name.to_string(), event["id"].as_u64().unwrap()))
                .or_default() += event["count"].as_u64().unwrap();
        }
    }
    counts
}

/// Both tools on one process at once, for TRACE_SECONDS, with the same providers and rundown.
fn trace_both(pid: u32, dir: &Path) -> (PathBuf, PathBuf) {
    let ours = dir.join("clrscope.nettrace");
    let theirs = dir.join("dotnet-trace.nettrace");
    let clrscope = Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .args(["trace", "--pid", &pid.to_string(), "--providers", PROVIDERS])
        .args([
            "--rundown",
            "--duration",
            &format!("{}s", TRACE_SECONDS + 10),
            "-o",
        ])
        .arg(&ours)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let dotnet_trace = dotnet_tool("dotnet-trace")
        .args(["collect", "-p", &pid.to_string(), "--providers", PROVIDERS])
        .args(["--duration", &format!("00:00:00:{TRACE_SECONDS:02}"), "-o"])
        .arg(&theirs)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ours_out = clrscope.wait_with_output().unwrap();
    let theirs_out = dotnet_trace.wait_with_output().unwrap();
    assert!(ours_out.status.success(), "clrscope trace: {ours_out:?}");
    assert!(theirs_out.status.success(), "dotnet-trace: {theirs_out:?}");
    (ours, theirs)
}

#[test]
fn trace_agrees_with_dotnet_trace_and_trace_event() {
    let _hogs = Hogs::start();
    let mut service = Service::start("peers-trace", TRACE_SECONDS as u32 + 90);
    let dir = ScratchDir::new("peers-trace");
    std::fs::create_dir_all(&dir).unwrap();
    let (ours, theirs) = trace_both(service.front.pid(), &dir);
    assert!(
        service.load.is_running(),
        "the load ended before the traces"
    );

    let te_ours = trace_event("events", &ours);
    let te_theirs = trace_event("events", &theirs);
    let (in_ours, in_theirs) = (inspect(&ours), inspect(&theirs));
    same_events(&ours, &theirs, &te_ours, &te_theirs, &in_ours);
    for (file, te, summary) in [
        (&ours, &te_ours, &in_ours),
        (&theirs, &te_theirs, &in_theirs),
    ] {
        assert_eq!(summary["complete"], true, "{}", file.display());
        assert_eq!(
            inspect_counts(summary),
            trace_event_counts(te),
            "clrscope inspect and TraceEvent count {} differently",
            file.display()
        );
        // A runtime that marks managed code external (.NET 9, dotnet/runtime#123996) gives
        // TraceEvent and clrscope alike (nearly) no managed sample: no cpu profile to compare,
        // and a file holds no kernel figures to estimate one from (docs/runtimes.md).
        if !support::sample_kinds_untrusted() {
            same_cpu_profile(file, &dir);
        }
    }
}

/// A reading's time field, in ticks of the runtime's clock (the same in both files).
fn ticks(reading: &Value, field: &str) -> u64 {
    reading[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {}", reading["file"]))
}

/// TraceEvent reads the same providers, event names and payload fields from both files, and the
/// same number of each event while both sessions were on. Two sessions on one process are sent
/// the same events: the files differ only before the later one started, after the earlier one
/// stopped, and in the rundown each session gets at its stop (of the methods alive then). So the
/// counts are compared in [later first event + EDGE_SECONDS, earlier rundown start −
/// EDGE_SECONDS], where they may differ only by the events either session lost (a full buffer:
/// the runtime says how many, TraceEvent's `events_lost`) and by events whose two copies lie on
/// either side of an end of that window ([`EdgeCopies`]). Times are the runtime's clock ticks,
/// which every session's file shares (their UTC mappings differ by up to a millisecond).
fn same_events(ours: &Path, theirs: &Path, te_ours: &Value, te_theirs: &Value, summary: &Value) {
    assert_eq!(te_ours["providers"], te_theirs["providers"]);
    let frequency = summary["trace"]["qpc_frequency"].as_u64().unwrap() as f64;
    let edge = (EDGE_SECONDS * frequency) as u64;
    let from = ticks(te_ours, "first").max(ticks(te_theirs, "first")) + edge;
    let until = ticks(te_ours, "rundown_from").min(ticks(te_theirs, "rundown_from")) - edge;
    let both_on = until.saturating_sub(from) as f64 / frequency;
    assert!(
        both_on >= 5.0,
        "the sessions were on together for {both_on:.1} s only"
    );
    let window = |file: &Path| {
        let output = support::peers::trace_event_command()
            .args(["events"])
            .arg(file)
            .args([from.to_string(), until.to_string()])
            .output()
            .unwrap();
        json_of("TraceEventReader", &output)
    };
    let (w_ours, w_theirs) = (window(ours), window(theirs));
    let copies = EdgeCopies::of(ours, theirs, (from, until), edge / 2);
    let lost =
        te_ours["events_lost"].as_u64().unwrap() + te_theirs["events_lost"].as_u64().unwrap();
    let kinds = |v: &Value| -> BTreeMap<(String, u64), Value> {
        v["by_event"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let key = (
                    e["provider"].as_str().unwrap().to_string(),
                    e["id"].as_u64().unwrap(),
                );
                (key, e.clone())
            })
            .collect()
    };
    let (a, b) = (kinds(&w_ours), kinds(&w_theirs));
    let gcs = |kinds: &BTreeMap<(String, u64), Value>| {
        kinds
            .get(&(RUNTIME.to_string(), GC_START))
            .map_or(0, |e| e["in_window"].as_u64().unwrap())
    };
    let gcs = gcs(&a).max(gcs(&b));
    let mut in_window = 0;
    for key in a.keys().chain(b.keys()).collect::<BTreeSet<_>>() {
        let n = |kinds: &BTreeMap<(String, u64), Value>| {
            kinds
                .get(key)
                .map_or(0, |e| e["in_window"].as_u64().unwrap())
        };
        let (n_a, n_b) = (n(&a), n(&b));
        // TraceEvent's ids above 0xFF00 are GCDynamicEvent's, as the file names it.
        let written = if key.0 == RUNTIME && key.1 > 0xFF00 {
            (RUNTIME.to_string(), GC_DYNAMIC_EVENT)
        } else {
            (key.0.clone(), key.1)
        };
        let (straddling, unpaired) = copies.count(&written);
        eprintln!(
            "{key:?}: in {both_on:.1} s both were on, clrscope's session {n_a}, dotnet-trace's \
             {n_b} ({straddling} with copies either side of an end, {unpaired} in one file only)"
        );
        in_window += n_a;
        match (a.get(key), b.get(key)) {
            (Some(x), Some(y)) => {
                assert_eq!(x["name"], y["name"], "{key:?}");
                assert_eq!(x["payload"], y["payload"], "{key:?}: payload fields");
            }
            _ => assert!(
                key.0 != RUNDOWN,
                "{key:?}: a rundown event in one file only"
            ),
        }
        // Measured, not explained: once in four runs on .NET 10 one session got a GCDynamicEvent
        // more than the other within one GC (1 and 2, every other GC event equal). Bounded: one
        // per GC while both were on.
        let dynamic = key.0 == RUNTIME && (key.1 == GC_DYNAMIC_EVENT || key.1 > 0xFF00);
        let bound = lost + if dynamic { gcs } else { 0 };
        assert!(
            n_a.abs_diff(n_b) <= bound + straddling,
            "{key:?}: while both were on, clrscope's session got {n_a}, dotnet-trace's {n_b} (may differ by {}: {lost} lost, {gcs} GCs, {straddling} with copies either side of an end)",
            bound + straddling
        );
        // What the window's ends cannot explain: an event in one session's file only.
        assert!(
            unpaired <= bound,
            "{key:?}: {unpaired} events in one session's file only while both were on (may be {bound}: {lost} lost, {gcs} GCs)"
        );
    }
    assert!(
        in_window >= 1000,
        "only {in_window} events while both were on"
    );
}

/// Each session's copy of an event is stamped when it is written to that session
/// (`ep_event_instance_init` takes the time for each session's buffer), one session after the
/// other, so the copies differ by the writer's time in between: 50 ns typically, and up to 35 ms
/// measured with the writer preempted beside two CPU hogs (a Loader event 21 ms before the window
/// in clrscope's file, 13 ms into it in dotnet-trace's). A fixed window then counts such an event
/// in one file only. Copies are paired here, as clrscope reads both files (which `inspect` and
/// TraceEvent count alike, checked for each file): per thread and event, each writer writes one
/// event to every session before its next, so in time order the two files' copies alternate,
/// the same session's first. Per event (provider, id): pairs whose copies lie on either side of
/// the window's `from` or `until`, and events in the window without a copy in the other file.
#[derive(Default)]
struct EdgeCopies {
    straddling: BTreeMap<(String, u64), u64>,
    unpaired: BTreeMap<(String, u64), u64>,
}

/// (thread, provider, event id) -> the times of that thread's events of that kind.
type Streams = HashMap<(u64, String, u64), Vec<i64>>;

/// One thread's events of one kind in both files: (time, whether in clrscope's), in time order.
type Copies = Vec<(i64, bool)>;

impl EdgeCopies {
    /// `margin`: how far beyond the window both sessions were surely on (less than the edge cut
    /// off it), so that copies are paired across its ends.
    fn of(ours: &Path, theirs: &Path, (from, until): (u64, u64), margin: u64) -> EdgeCopies {
        let (lo, hi) = (from.saturating_sub(margin) as i64, (until + margin) as i64);
        let (a, b) = (streams(ours, lo, hi), streams(theirs, lo, hi));
        let mut merged: Vec<(Copies, (String, u64))> = Vec::new();
        for (key, times) in &a {
            let mut m: Copies = times.iter().map(|&t| (t, true)).collect();
            m.extend(b.get(key).into_iter().flatten().map(|&t| (t, false)));
            m.sort_unstable();
            merged.push((m, (key.1.clone(), key.2)));
        }
        for (key, times) in b.iter().filter(|(k, _)| !a.contains_key(*k)) {
            let m = times.iter().map(|&t| (t, false)).collect();
            merged.push((m, (key.1.clone(), key.2)));
        }
        let ours_first = ours_written_first(merged.iter().map(|(m, _)| m.as_slice()));
        let in_window = |t: i64| t >= from as i64 && t <= until as i64;
        let mut copies = EdgeCopies::default();
        for (m, kind) in merged {
            let mut i = 0;
            while i < m.len() {
                let (t, side) = m[i];
                match m.get(i + 1) {
                    Some(&(u, other)) if side == ours_first && other != side => {
                        if in_window(t) != in_window(u) {
                            *copies.straddling.entry(kind.clone()).or_default() += 1;
                        }
                        i += 2;
                    }
                    _ => {
                        if in_window(t) {
                            *copies.unpaired.entry(kind.clone()).or_default() += 1;
                        }
                        i += 1;
                    }
                }
            }
        }
        copies
    }

    /// (pairs straddling an end, events without a copy in the window) of one kind.
    fn count(&self, kind: &(String, u64)) -> (u64, u64) {
        let n = |m: &BTreeMap<(String, u64), u64>| m.get(kind).copied().unwrap_or(0);
        (n(&self.straddling), n(&self.unpaired))
    }
}

/// Whether clrscope's session is written each event before dotnet-trace's: the copies of one
/// event lie nanoseconds apart, the next event of the same thread and kind a tick or more later.
fn ours_written_first<'a>(merged: impl Iterator<Item = &'a [(i64, bool)]>) -> bool {
    let (mut ours_then_theirs, mut theirs_then_ours) = (Vec::new(), Vec::new());
    for m in merged {
        for w in m.windows(2).filter(|w| w[0].1 != w[1].1) {
            let gap = w[1].0 - w[0].0;
            if w[0].1 {
                ours_then_theirs.push(gap);
            } else {
                theirs_then_ours.push(gap);
            }
        }
    }
    let median = |v: &mut Vec<i64>| {
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(i64::MAX)
    };
    median(&mut ours_then_theirs) <= median(&mut theirs_then_ours)
}

/// The events of `file` in `[lo, hi]`, per thread and kind, in time order.
fn streams(file: &Path, lo: i64, hi: i64) -> Streams {
    let reader = std::io::BufReader::new(std::fs::File::open(file).unwrap());
    let mut reader = nettrace::NettraceReader::new(reader);
    let mut streams = Streams::new();
    while let Some(e) = reader.next_event().unwrap() {
        let t = e.header.timestamp;
        if t >= lo && t <= hi {
            let key = (
                e.header.thread_id,
                e.metadata.provider_name.clone(),
                u64::from(e.metadata.event_id),
            );
            streams.entry(key).or_default().push(t);
        }
    }
    for times in streams.values_mut() {
        times.sort_unstable();
    }
    streams
}

/// The part of a frame name both readers agree on. TraceEvent writes
/// `Module!Ns.Outer+Inner`1[System.__Canon].Method(args)` and `?!?` for an address in no known
/// code; clrscope `Ns.Outer.Inner<System.__Canon>.Method(args)` and `[unknown]`. Both become
/// `Ns.Outer.Inner.Method` (compiler-made names such as `<Main>d__0` keep their brackets).
fn function_key(name: &str, trace_event: bool) -> String {
    if trace_event && name == "?!?" {
        return "[unknown]".to_string();
    }
    let name = match name.split_once('!') {
        Some((_, rest)) if trace_event => rest,
        _ => name,
    };
    let mut key = String::with_capacity(name.len());
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '(' => break,
            '+' => key.push('.'),
            // Generic arity and arguments: `1[...] (TraceEvent), <...> after a name (clrscope).
            '`' | '[' if trace_event => skip_group(&mut chars, c),
            '<' if key.ends_with(|p: char| p.is_alphanumeric() || p == '_') => {
                skip_group(&mut chars, c)
            }
            _ => key.push(c),
        }
    }
    key.trim().to_string()
}

/// Skips what follows an opening `[` or `<` up to its match, or a backtick's arity and its `[...]`.
fn skip_group(chars: &mut std::iter::Peekable<std::str::Chars<'_>>, open: char) {
    if open == '`' {
        while chars.peek().is_some_and(char::is_ascii_digit) {
            chars.next();
        }
        if chars.peek() == Some(&'[') {
            chars.next();
            skip_group(chars, '[');
        }
        return;
    }
    let close = if open == '[' { ']' } else { '>' };
    let mut depth = 1;
    for c in chars.by_ref() {
        if c == open {
            depth += 1;
        } else if c == close {
            depth -= 1;
            if depth == 0 {
                return;
            }
        }
    }
}

/// Per function, (inclusive, exclusive) in percent of all managed samples.
type Shares = HashMap<String, (f64, f64)>;

/// TraceEvent's CPU stacks of FILE.
fn trace_event_shares(file: &Path) -> Shares {
    let output = support::peers::trace_event_command()
        .arg("cpu")
        .arg(file)
        .arg(GC_POLL_FOLD)
        .output()
        .unwrap();
    let reading = json_of("TraceEventReader", &output);
    let total = reading["managed_samples"].as_f64().unwrap();
    assert!(
        total >= 500.0,
        "{} managed samples in {}",
        total,
        file.display()
    );
    let mut shares = Shares::new();
    for f in reading["functions"].as_array().unwrap() {
        let inclusive = 100.0 * f["inclusive"].as_f64().unwrap() / total;
        let exclusive = 100.0 * f["exclusive"].as_f64().unwrap() / total;
        let key = function_key(f["name"].as_str().unwrap(), true);
        match shares.get_mut(&key) {
            // Several of TraceEvent's frames under one key (generic instantiations): their
            // exclusive counts add up, their inclusive ones may not (one stack can hold two).
            Some(share) => *share = (f64::NAN, share.1 + exclusive),
            None => {
                shares.insert(key, (inclusive, exclusive));
            }
        }
    }
    shares
}

/// `clrscope convert FILE -o cpu.folded`, read back: a frame's inclusive share counts each stack
/// holding it once.
fn clrscope_shares(file: &Path, dir: &Path) -> Shares {
    let folded = dir.join(format!(
        "{}.folded",
        file.file_stem().unwrap().to_str().unwrap()
    ));
    let output = Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .arg("convert")
        .arg(file)
        .arg("-o")
        .arg(&folded)
        .output()
        .unwrap();
    assert!(output.status.success(), "clrscope convert: {output:?}");
    let text = std::fs::read_to_string(&folded).unwrap();
    let mut by_function: HashMap<String, (f64, f64)> = HashMap::new();
    let mut total = 0.0;
    for line in text.lines() {
        let (stack, value) = line.rsplit_once(' ').unwrap();
        let value: f64 = value.parse().unwrap();
        total += value;
        let frames: Vec<String> = stack.split(';').map(|f| function_key(f, false)).collect();
        let distinct: BTreeSet<&String> = frames.iter().collect();
        for frame in distinct {
            by_function.entry(frame.clone()).or_default().0 += value;
        }
        by_function
            .entry(frames.last().unwrap().clone())
            .or_default()
            .1 += value;
    }
    by_function
        .into_iter()
        .map(|(k, (i, e))| (k, (100.0 * i / total, 100.0 * e / total)))
        .collect()
}

/// The top functions of FILE's CPU profile, by `clrscope convert` and by TraceEvent's stacks, agree
/// within a point of the samples, inclusive and exclusive: the ten largest of either reader, with
/// the GC poll folded into its caller on TraceEvent's side as clrscope does.
fn same_cpu_profile(file: &Path, dir: &Path) {
    let theirs = trace_event_shares(file);
    let ours = clrscope_shares(file, dir);
    let top = |shares: &Shares, pick: fn(&(f64, f64)) -> f64| -> Vec<String> {
        let mut names: Vec<(&String, f64)> = shares
            .iter()
            // TraceEvent's `Module!?` (an address in a module but no method) has no match.
            .filter(|(name, _)| !name.ends_with('?'))
            .map(|(name, s)| (name, pick(s)))
            .collect();
        names.retain(|(_, share)| !share.is_nan());
        names.sort_by(|x, y| y.1.total_cmp(&x.1));
        names.into_iter().take(10).map(|(n, _)| n.clone()).collect()
    };
    for (what, pick) in [
        (
            "inclusive",
            (|s: &(f64, f64)| s.0) as fn(&(f64, f64)) -> f64,
        ),
        ("exclusive", |s: &(f64, f64)| s.1),
    ] {
        let names: BTreeSet<String> = top(&theirs, pick)
            .into_iter()
            .chain(top(&ours, pick))
            .collect();
        for name in names {
            let t = theirs.get(&name).map_or(0.0, pick);
            let o = ours.get(&name).map_or(0.0, pick);
            if t.is_nan() {
                eprintln!(
                    "{}: {what} {name}: several TraceEvent frames, clrscope {o:.2} %",
                    file.display()
                );
                continue;
            }
            eprintln!(
                "{}: {what} {name}: TraceEvent {t:.2} %, clrscope {o:.2} %",
                file.display()
            );
            assert!(
                (t - o).abs() <= 1.0,
                "{}: {what} share of {name}: TraceEvent {t:.2} %, clrscope convert {o:.2} %",
                file.display()
            );
        }
    }
}

/// A row of `clrscope ps --json`.
struct OurRow {
    name: String,
    entry_assembly: Option<String>,
    command_line: Option<String>,
    error: Option<String>,
}

fn clrscope_ps() -> BTreeMap<u64, OurRow> {
    let output = Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .args(["ps", "--json"])
        .output()
        .unwrap();
    let text = |v: &Value| v.as_str().map(str::to_string);
    json_of("clrscope ps", &output)
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let our = OurRow {
                name: row["name"].as_str().unwrap().to_string(),
                entry_assembly: text(&row["entry_assembly"]),
                command_line: text(&row["command_line"]),
                error: text(&row["error"]),
            };
            (row["pid"].as_u64().unwrap(), our)
        })
        .collect()
}

/// `dotnet-trace ps`: per pid, the rest of its line after the pid (`NAME PATH COMMAND-LINE`, in
/// columns padded with spaces; PATH is empty where the tool cannot read it).
fn dotnet_trace_ps() -> BTreeMap<u64, String> {
    // dotnet-trace 10.0.750501 fails whole ("Process has exited, so the requested information is
    // not available", from its sort by name) when a listed process exits while it lists: on a
    // machine where other runs start and stop processes, ask again.
    let mut output = dotnet_tool("dotnet-trace").arg("ps").output().unwrap();
    for _ in 0..5 {
        if output.status.success() {
            break;
        }
        output = dotnet_tool("dotnet-trace").arg("ps").output().unwrap();
    }
    assert!(output.status.success(), "dotnet-trace ps: {output:?}");
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| {
            let (pid, rest) = line.trim_start().split_once(' ')?;
            Some((pid.parse().ok()?, rest.trim().to_string()))
        })
        .collect()
}

/// Whether anything accepts connections on one of `pid`'s diagnostic sockets (a runtime does; a
/// socket file left by a process that is gone does not).
fn socket_answers(pid: u32) -> bool {
    support::diagnostic_sockets(pid)
        .iter()
        .any(|socket| std::os::unix::net::UnixStream::connect(socket).is_ok())
}

/// `clrscope ps` and `dotnet-trace ps` list the same .NET processes, and say the same of each. The
/// two name a process differently by design: dotnet-trace by the kernel's name (`dotnet` for
/// every app the host runs), clrscope by the entry assembly the runtime reports (the kernel's name
/// when it reports none); each is checked against its source. dotnet-trace's command line is the
/// kernel's (`/proc/PID/cmdline`, argv[0] as the process was started, through a symlink or not,
/// and left out where it is the executable's path);
/// the runtime's, which clrscope prints, starts with the host's real path, which dotnet-trace
/// prints in its PATH column, and for an app started by its apphost names the app's .dll after it
/// (dotnet-trace's own process shows this): apart from that .dll, the two are the same.
/// Whether the process has the CoreCLR runtime mapped (what makes its ProcessInfo answer the
/// runtime's own rather than whatever speaks the protocol on its socket).
fn loads_coreclr(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .is_ok_and(|maps| maps.contains("/libcoreclr.so"))
}

/// What `/proc` says of a process, as both listings print it.
struct ProcFacts {
    comm: String,
    exe: String,
    args: Vec<String>,
}

/// `None` once the process has ended.
fn proc_facts(pid: u64) -> Option<ProcFacts> {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args = cmdline
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    Some(ProcFacts {
        comm,
        exe: exe.to_str()?.to_owned(),
        args,
    })
}

#[test]
fn ps_lists_what_dotnet_trace_lists() {
    let _hogs = Hogs::start();
    let service = Service::start("peers-ps", 90);
    let before = clrscope_ps();
    let theirs = dotnet_trace_ps();
    let after = clrscope_ps();
    // Processes of other runs come and go: judge those listed (and answering) from before
    // dotnet-trace's listing to after it.
    let stable: Vec<u64> = before
        .iter()
        .filter(|(pid, row)| {
            row.error.is_none() && after.get(pid).is_some_and(|r| r.error.is_none())
        })
        .map(|(pid, _)| *pid)
        .collect();
    for ours in [service.front.pid(), service.load.pid()] {
        assert!(
            stable.contains(&u64::from(ours)),
            "clrscope ps lacks {ours}"
        );
    }
    for pid in &stable {
        let row = &before[pid];
        let line = theirs
            .get(pid)
            .unwrap_or_else(|| panic!("dotnet-trace ps has no {pid} ({})", row.name));
        // Another run's process may end after the second listing: it can no longer be judged.
        let Some(ProcFacts { comm, exe, args }) = proc_facts(*pid) else {
            assert!(
                ![service.front.pid(), service.load.pid()].contains(&(*pid as u32)),
                "our service {pid} ended"
            );
            eprintln!("{pid} ended before it could be compared");
            continue;
        };
        let exe = exe.as_str();
        // dotnet-trace leaves argv[0] out when it is the executable's path (already in PATH).
        let printed = if args.first().map(String::as_str) == Some(exe) {
            &args[1..]
        } else {
            &args[..]
        };
        let want = format!("{}  {exe}  {}", comm.trim(), printed.join(" "));
        let squeeze = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        assert_eq!(squeeze(line), squeeze(&want), "dotnet-trace ps of {pid}");
        // clrscope names a process by its entry assembly; one without (the hostile-target tests'
        // fake runtimes, which run beside) by its kernel name.
        assert_eq!(
            &row.name,
            row.entry_assembly.as_deref().unwrap_or(comm.trim()),
            "clrscope ps of {pid}"
        );
        // The runtime's line is the executable's path, then, for an app started by its own
        // apphost (not `dotnet`), the app's .dll the host resolved, then the arguments. Only a
        // real runtime's answer is held to /proc: the hostile tests' fake runtimes beside this
        // one answer what they like.
        if !loads_coreclr(*pid) {
            continue;
        }
        let line = row.command_line.as_deref().unwrap_or("");
        // The host hands the runtime the app's path with its links resolved (`.testbed` may be
        // a link to another checkout's), where /proc keeps the path as typed.
        let resolved: Vec<String> = args[1..]
            .iter()
            .map(|a| {
                std::fs::canonicalize(a)
                    .ok()
                    .and_then(|p| p.to_str().map(str::to_owned))
                    .unwrap_or_else(|| a.clone())
            })
            .collect();
        let middle = line
            .strip_prefix(exe)
            .and_then(|l| {
                l.strip_suffix(args[1..].join(" ").as_str())
                    .or_else(|| l.strip_suffix(resolved.join(" ").as_str()))
            })
            .map(str::trim);
        assert!(
            middle.is_some_and(|m| m.is_empty() || (!m.contains(' ') && m.ends_with(".dll"))),
            "{pid}: clrscope's command line {line:?} against dotnet-trace's PATH {exe:?} and arguments {:?}",
            &args[1..]
        );
    }
    eprintln!("{} processes listed alike: {stable:?}", stable.len());
    // And each that dotnet-trace listed, still running after clrscope's second listing and
    // answering on its socket, is in that listing.
    for (pid, line) in &theirs {
        if support::process_alive(*pid as u32) && socket_answers(*pid as u32) {
            assert!(after.contains_key(pid), "clrscope ps has no {pid} ({line})");
        }
    }
}

#[test]
fn function_names_of_both_readers_meet() {
    let cases = [
        (
            "System.Private.CoreLib!System.Runtime.CompilerServices.AsyncTaskMethodBuilder`1+AsyncStateMachineBox`1[System.Threading.Tasks.VoidTaskResult,System.__Canon].MoveNext(class System.Threading.Thread)",
            "System.Runtime.CompilerServices.AsyncTaskMethodBuilder<System.Threading.Tasks.VoidTaskResult>.AsyncStateMachineBox<System.__Canon>.MoveNext(Thread)",
        ),
        (
            "Microsoft.AspNetCore.Server.Kestrel.Core!Microsoft.AspNetCore.Server.Kestrel.Core.Internal.Http.HttpProtocol+<ProcessRequests>d__237`1[System.__Canon].MoveNext()",
            "Microsoft.AspNetCore.Server.Kestrel.Core.Internal.Http.HttpProtocol.<ProcessRequests>d__237<System.__Canon>.MoveNext()",
        ),
        (
            "System.Private.CoreLib!System.Runtime.CompilerServices.AsyncMethodBuilderCore.Start[System.__Canon](!!0&)",
            "System.Runtime.CompilerServices.AsyncMethodBuilderCore.Start<System.__Canon>(ref !!0)",
        ),
        ("?!?", "[unknown]"),
    ];
    for (trace_event, clrscope) in cases {
        assert_eq!(
            function_key(trace_event, true),
            function_key(clrscope, false),
            "{trace_event}"
        );
    }
    assert_eq!(
        function_key(
            "CpuHot!CpuHot.Program+<>c__DisplayClass6_0.<Body>b__0()",
            true
        ),
        "CpuHot.Program.<>c__DisplayClass6_0.<Body>b__0"
    );
}

/// What runtime arrays may grow by between two snapshots of a still heap (see below).
const GROWN_ARRAY_BYTES: u64 = 16 * 1024;

/// Per type name: (objects, bytes).
type Histogram = BTreeMap<String, (u64, u64)>;

/// The types of a `types` array (`name`, `count`, `bytes`), names through `name`, rows of one name
/// added up.
fn histogram_of(reading: &Value, name: fn(&str) -> String) -> Histogram {
    let mut out = Histogram::new();
    for t in reading["types"].as_array().unwrap() {
        let row = out.entry(name(t["name"].as_str().unwrap())).or_default();
        row.0 += t["count"].as_u64().unwrap();
        row.1 += t["bytes"].as_u64().unwrap();
    }
    out
}

/// `clrscope gcdump report --json` of every type in FILE.
fn clrscope_gcdump_report(file: &Path) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .args(["gcdump", "report", "--top", "1000000", "--json"])
        .arg(file)
        .output()
        .unwrap();
    json_of("clrscope gcdump report", &output)
}

/// `dotnet-gcdump report FILE`: the header's heap bytes, and per line (one per type of the file's
/// graph: `OBJECT-BYTES  COUNT  NAME  [MODULE]`) the name, the count and the object size it shows
/// (the size of one object of the type, not a total).
fn dotnet_gcdump_report(file: &Path) -> (u64, Vec<(String, u64, u64)>) {
    let output = dotnet_tool("dotnet-gcdump")
        .arg("report")
        .arg(file)
        .output()
        .unwrap();
    assert!(output.status.success(), "dotnet-gcdump report: {output:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    let number = |s: &str| s.replace(',', "").parse::<u64>().ok();
    let mut heap_bytes = None;
    let mut rows = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(n) = line.strip_suffix("GC Heap bytes") {
            heap_bytes = number(n.trim());
            continue;
        }
        let mut parts = line.splitn(3, char::is_whitespace);
        let (Some(size), Some(rest)) = (parts.next().and_then(number), parts.next()) else {
            continue;
        };
        let rest = format!("{rest} {}", parts.next().unwrap_or(""))
            .trim()
            .to_string();
        let Some((count, name)) = rest
            .split_once(char::is_whitespace)
            .and_then(|(c, n)| Some((number(c)?, n.trim())))
        else {
            continue;
        };
        // The module, when the file names one, follows two spaces in brackets.
        let name = match name.rsplit_once("  [") {
            Some((name, module)) if module.ends_with(']') => name,
            _ => name,
        };
        rows.push((name.to_string(), count, size));
    }
    (
        heap_bytes.expect("dotnet-gcdump report printed no heap bytes"),
        rows,
    )
}

/// One `.gcdump` read three ways agrees exactly: clrscope's report, PerfView's reader, and
/// `dotnet-gcdump report` (whose per-line size is one object's: between the type's smallest and
/// largest as PerfView's reader finds them).
fn same_reading(file: &Path) -> Histogram {
    let ours = clrscope_gcdump_report(file);
    let perfview = support::peers::perfview_gcdump(file);
    let name = |n: &str| n.to_string();
    let histogram = histogram_of(&perfview, name);
    assert_eq!(
        histogram_of(&ours, name),
        histogram,
        "{}: clrscope gcdump report and PerfView's reader",
        file.display()
    );
    assert_eq!(ours["objects"], perfview["objects"], "{}", file.display());
    assert_eq!(ours["bytes"], perfview["bytes"], "{}", file.display());
    let sizes: BTreeMap<&str, (u64, u64)> = perfview["types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let size = |k: &str| t[k].as_u64().unwrap();
            (
                t["name"].as_str().unwrap(),
                (size("min_size"), size("max_size")),
            )
        })
        .collect();
    let (heap_bytes, rows) = dotnet_gcdump_report(file);
    assert_eq!(
        heap_bytes,
        perfview["bytes"].as_u64().unwrap(),
        "{}",
        file.display()
    );
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for (name, count, size) in rows {
        let (min, max) = sizes[name.as_str()];
        assert!(
            (min..=max).contains(&size),
            "{}: dotnet-gcdump report shows {name} at {size} bytes an object, PerfView's reader {min}..={max}",
            file.display()
        );
        *counts.entry(name).or_default() += count;
    }
    let want: BTreeMap<String, u64> = histogram.iter().map(|(n, r)| (n.clone(), r.0)).collect();
    assert_eq!(counts, want, "{}: dotnet-gcdump report", file.display());
    histogram
}

/// A type name as dotnet-gcdump writes it: PerfView's reader rewrites the runtime's name (the
/// generic arity goes, `[`/`]` become `<`/`>`, then `<>` becomes `[]`) and files arrays and strings
/// over 1 KB under a size class (` (Bytes > 1K)`), which is left out here; clrscope writes the
/// runtime's name as the runtime gave it.
fn perfview_type_name(name: &str) -> String {
    let name = match name.rsplit_once(" (Bytes > ") {
        Some((name, class)) if class.ends_with(')') => name,
        _ => name,
    };
    let mut out = String::with_capacity(name.len());
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '`' if chars.peek().is_some_and(char::is_ascii_digit) => {
                while chars.peek().is_some_and(char::is_ascii_digit) {
                    chars.next();
                }
            }
            '[' => out.push('<'),
            ']' => out.push('>'),
            _ => out.push(c),
        }
    }
    out.replace("<>", "[]")
}

/// The heap of the Alloc target, still (no churn thread): `clrscope gcdump` then `dotnet-gcdump
/// collect`. Each file reads alike in clrscope, PerfView's reader and `dotnet-gcdump report`
/// (exact), and the two snapshots hold the same objects per type: the kept ones exactly as the
/// target reports them, every type exactly but one. Between the two snapshots the heap is not
/// quite still: the target prints its elapsed seconds every second, and .NET (8 and later) keeps
/// the string of every number under 300 it formatted (UInt32ToDecStr's small-number cache), so
/// up to one System.String (of 2–3 digits: 26–28 bytes) per second between the two may be new.
/// The first diagnostic session a process sees makes objects of its own (EventSource manifests by
/// reflection, dynamic methods) that die later, so one snapshot of each tool goes first, unjudged.
/// And the runtime may replace one of its arrays by a larger one between the snapshots: twice in
/// seven pairs on .NET 10 a System.Int32[] of 3,120 bytes was one of 6,192 in the second (the
/// same count; which array, not found yet). So a runtime array type may hold up to
/// GROWN_ARRAY_BYTES more in the later snapshot, with the same count.
#[test]
fn gcdump_agrees_with_dotnet_gcdump_and_perfviews_reader() {
    let _hogs = Hogs::start();
    let kept = [
        ("Alloc.SmallNode", 100_000u64),
        ("Alloc.MediumRecord", 25_000),
        ("Alloc.LargeBlob", 1_000),
    ];
    let target = Target::builder("Alloc")
        .args(["--keep", "100000,25000,1000", "--churn-per-second", "0"])
        .start();
    let pid = target.pid().to_string();
    let dir = ScratchDir::new("peers-gcdump");
    std::fs::create_dir_all(&dir).unwrap();
    let clrscope = |file: &Path| {
        let output = Command::new(env!("CARGO_BIN_EXE_clrscope"))
            .args(["gcdump", "--pid", &pid, "--timeout", "120s", "-o"])
            .arg(file)
            .output()
            .unwrap();
        assert!(output.status.success(), "clrscope gcdump: {output:?}");
    };
    let dotnet_gcdump = |file: &Path| {
        let output = dotnet_tool("dotnet-gcdump")
            .args(["collect", "-p", &pid, "--timeout", "120", "-o"])
            .arg(file)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(output.status.success(), "dotnet-gcdump collect: {output:?}");
    };
    clrscope(&dir.join("first-clrscope.gcdump"));
    dotnet_gcdump(&dir.join("first-dotnet-gcdump.gcdump"));
    let (ours, theirs) = (
        dir.join("clrscope.gcdump"),
        dir.join("dotnet-gcdump.gcdump"),
    );
    let started = std::time::Instant::now();
    clrscope(&ours);
    dotnet_gcdump(&theirs);
    let seconds = started.elapsed().as_secs() + 1;

    let canonical = |h: &Histogram| -> Histogram {
        let mut out = Histogram::new();
        for (name, (count, bytes)) in h {
            let row = out.entry(perfview_type_name(name)).or_default();
            row.0 += count;
            row.1 += bytes;
        }
        out
    };
    let a = canonical(&same_reading(&ours));
    let b = canonical(&same_reading(&theirs));
    for (name, count) in kept {
        let size = target
            .ready_fact(&format!("/instance_bytes/{name}"))
            .and_then(Value::as_u64)
            .unwrap();
        assert_eq!(
            a.get(name),
            Some(&(count, count * size)),
            "clrscope's {name}"
        );
        assert_eq!(
            b.get(name),
            Some(&(count, count * size)),
            "dotnet-gcdump's {name}"
        );
    }
    let (mut strings, mut grown) = ((0, 0), 0);
    for name in a.keys().chain(b.keys()).collect::<BTreeSet<_>>() {
        let (x, y) = (a.get(name).copied(), b.get(name).copied());
        if name == "System.String" {
            let (x, y) = (x.unwrap_or_default(), y.unwrap_or_default());
            strings = (x.0.abs_diff(y.0), x.1.abs_diff(y.1));
            continue;
        }
        match (x, y) {
            // A runtime array the same count of which holds more bytes: one replaced by a larger.
            (Some(x), Some(y)) if name.ends_with("[]") && x.0 == y.0 && x.1 <= y.1 => {
                grown += y.1 - x.1;
            }
            _ => assert_eq!(x, y, "{name}: clrscope's snapshot, then dotnet-gcdump's"),
        }
    }
    eprintln!(
        "{} types, {} objects alike; System.String differs by {} objects, {} bytes in {seconds} s; arrays grew by {grown} bytes",
        a.len(),
        a.values().map(|r| r.0).sum::<u64>(),
        strings.0,
        strings.1
    );
    assert!(grown <= GROWN_ARRAY_BYTES, "arrays grew by {grown} bytes");
    assert!(
        strings.0 <= seconds && strings.1 <= 28 * seconds,
        "System.String differs by {strings:?} (objects, bytes) over {seconds} s"
    );
}

#[test]
fn perfview_names_types_as_dotnet_gcdump_writes_them() {
    for (runtime, perfview) in [
        (
            "System.Collections.Generic.Dictionary`2[System.String,System.Object]",
            "System.Collections.Generic.Dictionary<System.String,System.Object>",
        ),
        (
            "Entry[System.Int32,System.Collections.Generic.List`1[System.String]][]",
            "Entry<System.Int32,System.Collections.Generic.List<System.String>>[]",
        ),
        ("<>c__DisplayClass9_0", "[]c__DisplayClass9_0"),
        ("System.String[,]", "System.String<,>"),
        ("System.Byte[] (Bytes > 1K)", "System.Byte[]"),
    ] {
        assert_eq!(perfview_type_name(runtime), perfview, "{runtime}");
        assert_eq!(perfview_type_name(perfview), perfview, "{perfview}");
    }
}

/// Per (provider, counter name without its unit), the publications in order: (seconds since the
/// Unix epoch as the tool stamped them, value).
type Series = BTreeMap<(String, String), Vec<(f64, f64)>>;

/// `CPU Usage (%)` -> `CPU Usage`: the name without the unit, which the two tools write
/// differently for rates (dotnet-counters `Count / 1 sec`, clrscope the interval measured).
fn without_unit(name: &str) -> &str {
    match name.rsplit_once(" (") {
        Some((name, unit)) if unit.ends_with(')') => name,
        _ => name,
    }
}

fn unix_seconds(text: &str) -> f64 {
    chrono::DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|e| panic!("{e}: {text}"))
        .timestamp_nanos_opt()
        .unwrap() as f64
        / 1e9
}

/// The EventCounters of a `/livemetrics` answer (a JSON text sequence): their records have no
/// `meterTags`.
fn livemetrics_series(body: &str) -> Series {
    let mut out = Series::new();
    for text in body.split('\u{1e}').filter(|r| !r.trim().is_empty()) {
        let r: Value = serde_json::from_str(text.trim_end()).unwrap();
        if !r["meterTags"].is_null() {
            continue;
        }
        let key = (
            r["provider"].as_str().unwrap().to_string(),
            without_unit(r["displayName"].as_str().unwrap()).to_string(),
        );
        let at = unix_seconds(r["timestamp"].as_str().unwrap());
        out.entry(key)
            .or_default()
            .push((at, r["value"].as_f64().unwrap()));
    }
    out
}

/// `dotnet-counters collect --format json`'s events.
fn dotnet_counters_series(file: &Path) -> Series {
    let text = std::fs::read_to_string(file).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let mut out = Series::new();
    for e in doc["Events"].as_array().unwrap() {
        let key = (
            e["provider"].as_str().unwrap().to_string(),
            without_unit(e["name"].as_str().unwrap()).to_string(),
        );
        let at = unix_seconds(e["timestamp"].as_str().unwrap());
        out.entry(key)
            .or_default()
            .push((at, e["value"].as_f64().unwrap()));
    }
    out
}

fn same_value(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

/// How late dotnet-counters may stamp a value after the runtime published it: it stamps a value
/// when its writer flushes it, seen up to an interval and a half after the publication (at load
/// 40); four intervals of slack.
const STAMP_LAG_SECONDS: f64 = 4.0;

/// How many publications of each counter both tools must have seen.
const OVERLAP: usize = 8;

/// Where `theirs` (dotnet-counters' run of one counter) meets `ours` (clrscope's): the shift `d`
/// (their i-th is our i+d-th) at which every publication both have is the same value, theirs
/// stamped at most STAMP_LAG_SECONDS after ours (and not before it, beyond clock rounding), and
/// at least OVERLAP of them. Either run may begin or end first: a session starts when its tool
/// has attached, and each tool's writer flushes at its stop.
fn aligned(ours: &[(f64, f64)], theirs: &[(f64, f64)]) -> Option<(isize, usize)> {
    let (m, n) = (ours.len() as isize, theirs.len() as isize);
    (1 - n..m).find_map(|d| {
        let pairs: Vec<_> = (0..n)
            .filter(|i| (0..m).contains(&(i + d)))
            .map(|i| (theirs[i as usize], ours[(i + d) as usize]))
            .collect();
        let alike = pairs.len() >= OVERLAP
            && pairs.iter().all(|(t, o)| {
                same_value(t.1, o.1) && t.0 >= o.0 - 0.05 && t.0 - o.0 <= STAMP_LAG_SECONDS
            });
        alike.then_some((d, pairs.len()))
    })
}

/// The runtime's System.Runtime EventCounters of the Storefront under load, read at once by
/// clrscope (its agent's `/livemetrics` and `/metrics`) and by `dotnet-counters collect`, both
/// every second. EventCounters publish each value once, to every session, at the shortest
/// interval asked for: both tools get the same publications, so each counter's values are the
/// same sequence where both runs overlap, rates (the increment over the interval the runtime
/// measured) included. They are matched as sequences, not by time: dotnet-counters stamps a value
/// when its writer flushes it, not when the runtime published it. `/metrics` shows the latest: every value scraped is one
/// of them (GC heap size, MB in the counter, bytes in Prometheus).
///
/// The app's own meters are not compared this way: dotnet-counters (10.0.750501) opens its
/// `System.Diagnostics.Metrics` session under a unique id, never the runtime's SHARED one, and the
/// runtime lets one such session aggregate at a time, refusing any other
/// (MultipleSessionsNotSupportedError) — two tools cannot read one process's meters at once.
#[test]
fn runtime_counters_agree_with_dotnet_counters() {
    let _hogs = Hogs::start();
    let service = Service::start("peers-counters", 120);
    let pid = service.front.pid();
    let dir = support::agent::data_dir("peers-counters");
    std::fs::create_dir_all(&dir).unwrap();
    let agent = support::agent::Agent::for_pid_with_settings(
        &dir,
        pid,
        r#"{"GlobalCounter": {"IntervalSeconds": 1}}"#,
        &[],
    );
    let file = dir.join("dotnet-counters.json");
    // The agent has attached the process once its own counters are on /metrics (a debug agent
    // beside load 40 was seen to take 50 s): only then the live session.
    let attached = std::time::Instant::now();
    while agent.metric("systemruntime_gc_heap_size_bytes", &[]) <= 0.0 {
        assert!(
            attached.elapsed() < std::time::Duration::from_secs(180),
            "the agent published no runtime counters of {pid}"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let (live, scraped) = std::thread::scope(|scope| {
        let live = scope.spawn(|| agent.get(&format!("/livemetrics?pid={pid}&durationSeconds=60")));
        // The live session first, dotnet-counters (which starts its own runtime first) after: a
        // live session was seen to publish its first values 16 s after the request (debug agent,
        // load 40), so the two runs overlap for some 20 s of dotnet-counters' 30.
        std::thread::sleep(std::time::Duration::from_secs(5));
        let mut counters = dotnet_tool("dotnet-counters")
            .args(["collect", "-p", &pid.to_string(), "--format", "json"])
            .args([
                "--refresh-interval",
                "1",
                "--counters",
                r"EventCounters\System.Runtime",
            ])
            .args(["--duration", "00:00:00:30", "-o"])
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut scraped = Vec::new();
        while counters.try_wait().unwrap().is_none() {
            let heap = agent.metric("systemruntime_gc_heap_size_bytes", &[]);
            scraped.push(heap);
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
        let output = counters.wait_with_output().unwrap();
        assert!(output.status.success(), "dotnet-counters: {output:?}");
        (live.join().unwrap(), scraped)
    });
    assert_eq!(live.status, 200, "{}", live.body);
    let ours = livemetrics_series(&live.body);
    let theirs = dotnet_counters_series(&file);
    assert!(
        theirs.len() >= 15,
        "dotnet-counters wrote {:?}",
        theirs.keys()
    );
    for (key, run) in &theirs {
        let mine = ours.get(key).unwrap_or_else(|| {
            panic!(
                "{key:?}: not in clrscope's /livemetrics ({:?})",
                ours.keys()
            )
        });
        assert!(
            run.len() >= 10,
            "{key:?}: {} values from dotnet-counters",
            run.len()
        );
        let (shift, alike) = aligned(mine, run).unwrap_or_else(|| {
            panic!("{key:?}: dotnet-counters' {run:?} does not meet clrscope's {mine:?}")
        });
        eprintln!(
            "{key:?}: {alike} publications alike (dotnet-counters' i-th is clrscope's i{shift:+}-th)"
        );
    }
    let heap = &ours[&("System.Runtime".to_string(), "GC Heap Size".to_string())];
    let scraped: Vec<f64> = scraped.into_iter().filter(|v| *v > 0.0).collect();
    assert!(scraped.len() >= 10, "{scraped:?}");
    for value in &scraped {
        assert!(
            heap.iter().any(|(_, mb)| same_value(mb * 1e6, *value)),
            "/metrics' GC heap size {value} is none of the published {heap:?}"
        );
    }
    eprintln!(
        "/metrics: {} scrapes, each a published GC heap size",
        scraped.len()
    );
}
