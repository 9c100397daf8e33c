//! Logs and exceptions out of process: the `Logs` target logs through the real
//! Microsoft.Extensions.Logging and its EventSource provider (the package of the runtime it runs
//! on), inside spans, and throws nested exceptions from known methods; the agent serves them on
//! `/logs` and `/exceptions`. Everything is judged against what the target prints it did.

use crate::support;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::agent::{data_dir, Agent};
use support::receiver::{profile_link_span_ids, scoped_items};
use support::{http_request, http_request_with_body, HttpResponse, Target};

/// What the target reported: each span's id by the sequences or episode it covered, and its
/// totals.
#[derive(Default)]
struct Reported {
    /// Message sequence → span id of the `Logs.Batch` span it was logged in.
    batch_span_of: HashMap<u64, String>,
    /// Span id → trace id, as the target printed them.
    trace_of: HashMap<String, String>,
    /// Episode → span id of its `Logs.Charge` span.
    charge_span_of: HashMap<u64, String>,
    episodes: u64,
}

impl Reported {
    fn absorb(&mut self, target: &mut Target) {
        for line in target.drain_lines() {
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            match v["span"].as_str() {
                Some("Logs.Batch") => {
                    let id = v["span_id"].as_str().unwrap().to_string();
                    let trace = v["trace_id"].as_str().unwrap().to_string();
                    self.trace_of.insert(id.clone(), trace);
                    for seq in v["first"].as_u64().unwrap()..=v["last"].as_u64().unwrap() {
                        self.batch_span_of.insert(seq, id.clone());
                    }
                }
                Some("Logs.Charge") => {
                    let id = v["span_id"].as_str().unwrap().to_string();
                    self.charge_span_of
                        .insert(v["episode"].as_u64().unwrap(), id);
                }
                _ => {}
            }
            if let Some(n) = v.pointer("/totals/episodes").and_then(Value::as_u64) {
                self.episodes = n;
            }
        }
    }
}

/// `POST path` with a JSON body.
fn post(agent: &Agent, path: &str, accept: &str, body: &str) -> HttpResponse {
    let auth = format!("Bearer {}", agent.token());
    http_request_with_body(
        agent.port,
        "POST",
        path,
        &[
            ("Authorization", &auth),
            ("Accept", accept),
            ("Content-Type", "application/json"),
        ],
        body.as_bytes(),
    )
}

fn get(agent: &Agent, path: &str, accept: &str) -> HttpResponse {
    let auth = format!("Bearer {}", agent.token());
    http_request(
        agent.port,
        "GET",
        path,
        &[("Authorization", &auth), ("Accept", accept)],
    )
}

/// Where the records' ids come from on this runtime: the events' own (the logging package of .NET
/// 9 and later writes them), else trace linkage's inference.
fn ids_from() -> &'static str {
    if support::runtime_major() >= 9 {
        "event"
    } else {
        "linkage"
    }
}

/// The share of messages logged in a span that must carry its ids: every one where the event
/// carries them; inferred, 95 %.
fn min_linked() -> f64 {
    if support::runtime_major() >= 9 {
        1.0
    } else {
        0.95
    }
}

/// The level the target gives message `seq` (its cycle of ten).
fn level_of(seq: u64) -> &'static str {
    [
        "Trace",
        "Debug",
        "Information",
        "Information",
        "Information",
        "Information",
        "Warning",
        "Warning",
        "Error",
        "Critical",
    ][(seq % 10) as usize]
}

fn rank(level: &str) -> usize {
    [
        "Trace",
        "Debug",
        "Information",
        "Warning",
        "Error",
        "Critical",
    ]
    .iter()
    .position(|l| *l == level)
    .unwrap()
}

#[test]
fn logs_and_exceptions_out_of_process() {
    let mut target = Target::builder("Logs")
        .args([
            "--messages-per-second",
            "100",
            "--span-size",
            "5",
            "--exceptions-per-second",
            "10",
        ])
        .start();
    let pid = target.pid();
    let dir = data_dir("signals");
    let agent = Agent::start(
        &dir,
        &[
            "--pid",
            &pid.to_string(),
            "--trace-linkage",
            "--trace-source",
            "Logs",
            "--logs",
            "Debug",
        ],
    );
    agent
        .wait_attached(pid, true, Duration::from_secs(60))
        .expect("the agent attaches");
    let mut reported = Reported::default();

    // Exceptions come from attach (the light session); one in a span says linkage's session
    // runs too, and with it the target's spans (its ActivitySource has no other listener).
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        reported.absorb(&mut target);
        let r = get(
            &agent,
            &format!("/exceptions?pid={pid}"),
            "application/x-ndjson",
        );
        if r.status == 200 && r.body.lines().count() >= 4 && r.body.contains("\"spanId\"") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no exceptions: {} {}\n{}",
            r.status,
            r.body,
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // /logs?level=Information for 4 s, as NDJSON: every message at or above the level logged
    // in the window, with dotnet-monitor's fields, in its span.
    let logs = get(
        &agent,
        &format!("/logs?pid={pid}&durationSeconds=4&level=Information"),
        "application/x-ndjson",
    );
    let logs = agent.expect_status(logs, 200, "GET /logs");
    assert_eq!(logs.header("content-type"), Some("application/x-ndjson"));
    std::thread::sleep(Duration::from_millis(500));
    reported.absorb(&mut target);
    let records: Vec<Value> = logs
        .body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(records.len() > 100, "{} records", records.len());
    let mut sequences = HashSet::new();
    let (mut in_span, mut right_span, mut scoped) = (0, 0, 0);
    for r in &records {
        let level = r["LogLevel"].as_str().unwrap();
        assert!(rank(level) >= rank("Information"), "{r}");
        let seq: u64 = r["State"]["OrderId"].as_str().unwrap().parse().unwrap();
        assert!(sequences.insert(seq), "message {seq} twice");
        assert_eq!(level, level_of(seq), "{r}");
        assert_eq!(r["EventId"], 1000 + rank(level) as u64);
        assert_eq!(r["EventName"], "OrderLogged");
        let category = if seq.is_multiple_of(2) {
            "Logs.Orders"
        } else {
            "Logs.Payments"
        };
        assert_eq!(r["Category"], category);
        let message = format!("Order {seq} for c{} costs {}.5", seq % 7, seq % 100);
        assert_eq!(r["Message"], message.as_str());
        assert_eq!(r["State"]["Message"], message.as_str());
        assert_eq!(
            r["State"]["{OriginalFormat}"],
            "Order {OrderId} for {Customer} costs {Amount}"
        );
        let ts = r["Timestamp"].as_str().unwrap();
        assert!(
            ts.len() == 20 && ts.ends_with('Z') && &ts[10..11] == " ",
            "{ts}"
        );
        if rank(level) >= rank("Error") {
            assert_eq!(
                r["Exception"],
                format!("Logs.Payments.PaymentDeclinedException: declined #{seq}").as_str()
            );
        } else {
            assert!(r.get("Exception").is_none(), "{r}");
        }
        scoped += usize::from(r.get("Scopes").is_some());
        if let Some(expected) = reported.batch_span_of.get(&seq) {
            in_span += 1;
            if let Some(span_id) = r["SpanId"].as_str() {
                assert_eq!(span_id, expected, "message {seq} carries another span's id");
                assert_eq!(r["TraceId"], reported.trace_of[expected].as_str(), "{r}");
                assert_eq!(r["IdsFrom"], ids_from(), "{r}");
                right_span += 1;
            }
        }
    }
    // Complete: every message at Information or above between the first and the last received.
    let (first, last) = (
        *sequences.iter().min().unwrap(),
        *sequences.iter().max().unwrap(),
    );
    let expected: HashSet<u64> = (first..=last)
        .filter(|&s| rank(level_of(s)) >= rank("Information"))
        .collect();
    let missing: Vec<_> = expected.difference(&sequences).collect();
    assert!(missing.is_empty(), "missing messages {missing:?}");
    assert!(
        last - first >= 300,
        "{first}..{last}: the window covers 4 s at 100/s"
    );
    assert!(in_span > 100, "{in_span} messages in reported spans");
    let linked = right_span as f64 / in_span as f64;
    assert!(
        linked >= min_linked(),
        "{right_span} of {in_span} messages carry their span's ids"
    );
    assert!(scoped > 0, "no message carries its scope");
    println!("logs: {} records ({first}..{last}), {right_span}/{in_span} with their span ids, {scoped} scoped", records.len());

    // The same as an RFC 7464 JSON text sequence, from what the agent's own session keeps (the
    // app's filters on, Warning is above its Debug), and as text.
    let seq = post(
        &agent,
        &format!("/logs?pid={pid}&durationSeconds=2"),
        "application/json-seq",
        r#"{"logLevel": "Warning", "useAppFilters": true}"#,
    );
    let seq = agent.expect_status(seq, 200, "GET /logs json-seq");
    assert_eq!(seq.header("content-type"), Some("application/json-seq"));
    let texts: Vec<&str> = seq.body.split('\u{1e}').filter(|t| !t.is_empty()).collect();
    assert!(texts.len() > 50, "{} json-seq records", texts.len());
    for text in texts {
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(rank(v["LogLevel"].as_str().unwrap()) >= rank("Warning"));
    }
    let text = get(
        &agent,
        &format!("/logs?pid={pid}&durationSeconds=2&level=Error"),
        "text/plain",
    );
    let text = agent.expect_status(text, 200, "GET /logs text");
    assert!(
        text.body.contains(" fail: Logs.") && text.body.contains(" crit: Logs."),
        "{}",
        text.body
    );
    assert!(text.body.contains("[1004][OrderLogged]\n"), "{}", text.body);
    assert!(
        text.body.contains("\n      Order ") && !text.body.contains(" info: "),
        "{}",
        text.body
    );
    // Below the level the agent collects (Trace; it collects Debug), with FilterSpecs: a session
    // of the request's own serves it, as dotnet-monitor serves every /logs. Logs.Orders at every
    // level, Logs.Payments at the default level (Critical) its spec leaves open, each message
    // once, none missing in the window.
    let own = post(
        &agent,
        &format!("/logs?pid={pid}&durationSeconds=3"),
        "application/x-ndjson",
        r#"{"logLevel": "Critical", "filterSpecs": {"Logs.Orders": "Trace", "Logs.Pay*": null}, "useAppFilters": false}"#,
    );
    let own = agent.expect_status(own, 200, "POST /logs below the collected level");
    let mut got = HashSet::new();
    let mut traces = 0;
    for line in own.body.lines() {
        let r: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let seq: u64 = r["State"]["OrderId"].as_str().unwrap().parse().unwrap();
        let level = r["LogLevel"].as_str().unwrap();
        assert_eq!(level, level_of(seq), "{r}");
        if seq.is_multiple_of(2) {
            assert_eq!(r["Category"], "Logs.Orders");
        } else {
            assert_eq!(level, "Critical", "Logs.Payments below Critical: {r}");
        }
        traces += usize::from(level == "Trace");
        assert!(got.insert(seq), "message {seq} twice");
    }
    let (lo, hi) = (*got.iter().min().unwrap(), *got.iter().max().unwrap());
    let missing: Vec<u64> = (lo..=hi)
        .filter(|&s| (s.is_multiple_of(2) || level_of(s) == "Critical") && !got.contains(&s))
        .collect();
    assert!(missing.is_empty(), "missing {missing:?} of {lo}..={hi}");
    assert!(
        hi - lo >= 200 && traces >= 20,
        "{lo}..={hi}, {traces} at Trace"
    );
    println!(
        "own session: {} records ({lo}..={hi}), {traces} at Trace",
        got.len()
    );
    // GET below the collected level too.
    let trace = get(
        &agent,
        &format!("/logs?pid={pid}&durationSeconds=2&level=Trace"),
        "application/x-ndjson",
    );
    let trace = agent.expect_status(trace, 200, "GET /logs?level=Trace");
    assert!(
        trace.body.contains(r#""LogLevel":"Trace""#),
        "{}",
        &trace.body[..trace.body.len().min(2000)]
    );

    // /exceptions: each episode's two exceptions, exactly once, named, nested, in their span.
    reported.absorb(&mut target);
    let upto = reported.episodes;
    let deadline = Instant::now() + Duration::from_secs(60);
    let exceptions: Vec<Value> = loop {
        let r = get(
            &agent,
            &format!("/exceptions?pid={pid}"),
            "application/x-ndjson",
        );
        let r = agent.expect_status(r, 200, "GET /exceptions");
        let all: Vec<Value> = r
            .body
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if all
            .iter()
            .any(|e| e["message"] == format!("payment declined #{upto}").as_str())
        {
            break all;
        }
        assert!(Instant::now() < deadline, "episode {upto} never listed");
        std::thread::sleep(Duration::from_millis(300));
    };
    reported.absorb(&mut target);
    let episode = |e: &Value, prefix: &str| -> Option<u64> {
        e["message"].as_str()?.strip_prefix(prefix)?.parse().ok()
    };
    let mut timeouts: HashMap<u64, &Value> = HashMap::new();
    let mut declined: HashMap<u64, &Value> = HashMap::new();
    // Exceptions thrown before the attach rundown named the code compiled earlier lack those
    // frames: counted, and none may be among the newest; a named throwing frame is the first.
    let mut unnamed = Vec::new();
    for e in &exceptions {
        let (n, thrown_in) = match e["typeName"].as_str().unwrap() {
            "System.TimeoutException" => {
                let n = episode(e, "connect timed out #").unwrap();
                assert!(timeouts.insert(n, e).is_none(), "timeout #{n} twice");
                (n, "Logs.Payments.Gateway.Connect(")
            }
            "Logs.Payments.PaymentDeclinedException" => {
                let n = episode(e, "payment declined #").unwrap();
                assert!(declined.insert(n, e).is_none(), "declined #{n} twice");
                (n, "Logs.Payments.Gateway.Charge(")
            }
            other => panic!("unexpected exception {other}: {e}"),
        };
        assert!(e["stack"]["threadName"].is_null(), "{e}");
        let frames: Vec<&str> = e["stack"]["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["fullName"].as_str().unwrap())
            .collect();
        if !frames.first().is_some_and(|f| f.starts_with(thrown_in)) {
            assert!(
                !frames
                    .iter()
                    .any(|f| f.starts_with("Logs.Payments.Gateway.")),
                "{frames:?}"
            );
            unnamed.push(n);
            continue;
        }
        assert!(
            frames
                .iter()
                .any(|f| f.starts_with("Logs.Program.ChargeOnce(")),
            "{frames:?}"
        );
    }
    assert!(
        unnamed.iter().all(|&n| n + 20 < upto),
        "newest exceptions unnamed: {unnamed:?} of ..={upto}"
    );
    let first = *declined.keys().min().unwrap();
    let (mut spans, mut right) = (0, 0);
    for n in first + 1..=upto {
        let (Some(t), Some(d)) = (timeouts.get(&n), declined.get(&n)) else {
            panic!("episode {n} of {first}..={upto} is missing");
        };
        assert_eq!(
            d["innerExceptions"][0]["id"], t["id"],
            "episode {n}: the inner exception"
        );
        if let Some(expected) = reported.charge_span_of.get(&n) {
            spans += 1;
            if let Some(id) = d["spanId"].as_str() {
                assert_eq!(id, expected, "episode {n}: another span's id");
                assert_eq!(t["spanId"].as_str(), Some(id));
                right += 1;
            }
        }
    }
    assert!(upto - first >= 20, "{first}..={upto}");
    assert!(
        right as f64 >= 0.95 * spans as f64,
        "{right} of {spans} exceptions in their span"
    );
    println!("exceptions: episodes {first}..={upto} exact, {right}/{spans} with their span ids, {} thrown before the rundown named their stack", unnamed.len());
    let text = get(&agent, &format!("/exceptions?pid={pid}"), "text/plain");
    assert!(
        text.body.contains("First chance exception at "),
        "{}",
        text.body
    );
    assert!(text
        .body
        .contains("System.TimeoutException: connect timed out #"));
    assert!(text.body.contains("\n   at Logs.Payments.Gateway.Connect("));
    // Each decline nests its timeout, as .NET and dotnet-monitor print them.
    assert!(
        text.body.contains(
            "\n ---> System.TimeoutException: connect timed out #"
        ) && text
            .body
            .contains("\n   --- End of inner exception stack trace ---\n   at Logs.Payments.Gateway.Charge("),
        "{}",
        &text.body[..text.body.len().min(3000)]
    );
    // POST /exceptions with dotnet-monitor's filters: the throwing frame's method and type
    // include the timeouts alone (and, as dotnet-monitor's, exceptions with no frame, which the
    // frame's fields cannot rule out: those thrown before the rundown named their code);
    // excluding their type leaves the declines alone.
    let include = post(
        &agent,
        &format!("/exceptions?pid={pid}"),
        "application/x-ndjson",
        r#"{"include": [{"methodName": "Connect", "typeName": "Logs.Payments.Gateway"}]}"#,
    );
    let include = agent.expect_status(include, 200, "POST /exceptions include");
    let types: HashSet<String> = include
        .body
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| {
            e["stack"]["frames"]
                .as_array()
                .is_some_and(|f| !f.is_empty())
        })
        .map(|e| e["typeName"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        types,
        HashSet::from(["System.TimeoutException".to_string()])
    );
    let exclude = post(
        &agent,
        &format!("/exceptions?pid={pid}"),
        "application/x-ndjson",
        r#"{"exclude": [{"exceptionType": "System.TimeoutException"}]}"#,
    );
    let exclude = agent.expect_status(exclude, 200, "POST /exceptions exclude");
    assert!(
        exclude.body.lines().count() > 20 && !exclude.body.contains("System.TimeoutException\""),
        "{}",
        exclude.body
    );

    // The web UI's panel: the newest exceptions and error logs, with their spans.
    let recent = agent
        .get(&format!(
            "/api/v1/processes/{pid}/signals?level=Error&limit=10"
        ))
        .json();
    assert_eq!(recent["logs_collected"], "Debug");
    let logs = recent["logs"].as_array().unwrap();
    let exceptions = recent["exceptions"].as_array().unwrap();
    assert_eq!((logs.len(), exceptions.len()), (10, 10), "{recent}");
    assert!(
        logs.iter()
            .all(|r| rank(r["LogLevel"].as_str().unwrap()) >= rank("Error")),
        "{recent}"
    );
    assert!(
        logs.windows(2)
            .all(|w| w[0]["UnixNanos"].as_i64() >= w[1]["UnixNanos"].as_i64()),
        "newest first"
    );
    assert!(
        exceptions
            .windows(2)
            .all(|w| w[0]["id"].as_u64() > w[1]["id"].as_u64()),
        "newest first"
    );
    assert!(
        exceptions.iter().any(|e| e["spanId"].is_string()),
        "{recent}"
    );
}

/// The sequence whose messages the layout golden keeps as examples: an Error (8 of the cycle of
/// ten) of `Logs.Orders`, customer `c1`, amount `8.5` (every 700th message: once a second at 700/s;
/// not the 8th, whose number would be mistaken for other digits).
fn example_sequence(seq: u64) -> bool {
    seq % 700 == 8 && seq > 8
}

/// A field type as the golden files name it.
fn type_name(ty: &nettrace::FieldType) -> String {
    use nettrace::FieldType;
    match ty {
        FieldType::Struct(fields) => {
            let inner: Vec<String> = fields
                .iter()
                .map(|f| format!("{}: {}", f.name, type_name(&f.ty)))
                .collect();
            format!("Struct {{{}}}", inner.join(", "))
        }
        FieldType::Array(element) => format!("Array<{}>", type_name(element)),
        other => format!("{other:?}"),
    }
}

/// A decoded value as the golden files keep it, its run-dependent parts replaced: W3C ids by
/// their shape, the example's sequence by `{seq}`, a scope's span number by `{span}`.
fn golden_value(field: &str, value: &nettrace::Value<'_>, seq: &str) -> Value {
    use nettrace::Value as V;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    match value {
        V::String(s) if field == "ActivityTraceId" && hex(s, 32) => "<32 hex>".into(),
        V::String(s) if field == "ActivitySpanId" && hex(s, 16) => "<16 hex>".into(),
        V::String(s) if !seq.is_empty() => s.replace(seq, "{seq}").into(),
        V::String(s) => match serde_json::from_str::<Value>(s) {
            // A scope's ArgumentsJson: its span number varies.
            Ok(Value::Object(mut o)) if o.contains_key("Batch") => {
                o.insert("Batch".into(), "{span}".into());
                Value::Object(o).to_string().into()
            }
            _ => s.clone().into(),
        },
        V::I32(_) if field == "ID" => "{scope id}".into(),
        V::I32(n) => (*n).into(),
        V::Struct(fields) => fields
            .iter()
            .map(|f| (f.name.to_string(), golden_value(f.name, &f.value, seq)))
            .collect::<serde_json::Map<_, _>>()
            .into(),
        V::Array(items) => items
            .iter()
            .map(|v| golden_value("", v, seq))
            .collect::<Vec<_>>()
            .into(),
        other => format!("{other:?}").into(),
    }
}

/// Keeps, per `Microsoft-Extensions-Logging` event name, its metadata and one example: for
/// messages, the example sequence's; for scopes, the first.
#[derive(Default)]
struct LoggingLayout(std::collections::BTreeMap<String, Value>);

impl collector::session::EventObserver for LoggingLayout {
    fn on_event(&mut self, event: &nettrace::Event<'_>) {
        let m = event.metadata;
        if m.provider_name != "Microsoft-Extensions-Logging" || self.0.contains_key(&m.event_name) {
            return;
        }
        let fields = event.decode().expect("the real provider's events decode");
        let text = |name: &str| {
            fields
                .iter()
                .find(|f| f.name == name)
                .and_then(|f| f.value.as_str())
                .map(str::to_string)
        };
        // A message's sequence: its OrderId argument (in ArgumentsJson, or Message's Arguments).
        let order_id = text("ArgumentsJson")
            .and_then(|json| serde_json::from_str::<Value>(&json).ok())
            .and_then(|v| v["OrderId"].as_str().map(str::to_string))
            .or_else(|| {
                let arguments = fields.iter().find(|f| f.name == "Arguments")?;
                let nettrace::Value::Array(pairs) = &arguments.value else {
                    return None;
                };
                pairs.iter().find_map(|pair| {
                    (pair.field("Key")?.as_str()? == "OrderId")
                        .then(|| pair.field("Value")?.as_str().map(str::to_string))?
                })
            })
            .or_else(|| {
                let text = text("FormattedMessage")?;
                let rest = text.strip_prefix("Order ")?;
                Some(rest.split(' ').next()?.to_string())
            });
        let is_message = fields.iter().any(|f| f.name == "Level");
        let seq = match order_id {
            Some(id) if id.parse().is_ok_and(example_sequence) => id,
            _ if is_message => return,
            _ => String::new(),
        };
        let example: serde_json::Map<String, Value> = fields
            .iter()
            .map(|f| (f.name.to_string(), golden_value(f.name, &f.value, &seq)))
            .collect();
        let layout = serde_json::json!({
            "version": m.version,
            "keywords": format!("{:#x}", m.keywords),
            "level": m.level,
            "opcode": m.opcode,
            "fields": m
                .fields
                .iter()
                .map(|f| format!("{}: {}", f.name, type_name(&f.ty)))
                .collect::<Vec<_>>(),
            "example": example,
        });
        self.0.insert(m.event_name.clone(), layout);
    }
}

/// The real provider's events on this runtime, as the EventPipe metadata describes them and with
/// an example of each, against `tests/golden/logging/layout-net<major>.json` (`CLRSCOPE_BLESS=1`
/// records it anew; the decoder's unit test reads every runtime's): the `Logs` target logs through
/// Microsoft.Extensions.Logging's EventSource provider with every keyword on (the ids on the wire
/// are TraceLogging's, assigned in order of first write, so events are named, not numbered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_providers_layout_matches_its_golden_file() {
    use ipc::{CollectTracing, ProviderConfig};
    let major = support::runtime_major();
    let target = Target::builder("Logs")
        .args([
            "--messages-per-second",
            "700",
            "--span-size",
            "4",
            "--exceptions-per-second",
            "0",
            "--no-span-lines",
        ])
        .start();
    let client = collector::client::DiagnosticsClient::for_pid(target.pid()).unwrap();
    // Message (0x2), FormattedMessage (0x4) and the JSON events (0x8), every level.
    let config = CollectTracing::v2(vec![ProviderConfig::new(
        "Microsoft-Extensions-Logging",
        0xE,
        5,
    )
    .with_arguments("FilterSpecs=\"Logs*:Trace\"")])
    .with_rundown(false);
    let mut sink =
        collector::session::ParsingWriter::new(tokio::io::sink(), LoggingLayout::default());
    let wanted = [
        "ActivityJsonStart",
        "ActivityJsonStop",
        "FormattedMessage",
        "MessageJson",
    ];
    collector::session::run(
        &client,
        config,
        &mut sink,
        tokio::time::sleep(Duration::from_secs(4)),
        Duration::from_secs(120),
        |_| {},
    )
    .await
    .expect("the session runs");
    assert!(sink.error().is_none(), "{:?}", sink.error());
    let (_, LoggingLayout(seen)) = sink.into_parts();
    for name in wanted {
        assert!(seen.contains_key(name), "{name} never written: {seen:?}");
    }
    let golden = serde_json::json!({
        "recorded_from": format!(
            "tests/targets/Logs on .NET {major}: Microsoft.Extensions.Logging.EventSource {}",
            target.ready_fact("/provider/version").unwrap().as_str().unwrap()
        ),
        "provider": "Microsoft-Extensions-Logging",
        "guid": target.ready_fact("/provider/guid").unwrap(),
        "events": seen,
    });
    let mut text = serde_json::to_string_pretty(&golden).unwrap();
    text.push('\n');
    support::golden::check_golden(format!("logging/layout-net{major}.json"), text.as_bytes());
}

/// `yyyyMMdd_HHmmss_fff` (a file name's time stamp, UTC) as Unix milliseconds.
fn file_stamp_ms(stamp: &str) -> i64 {
    let n = |r: std::ops::Range<usize>| stamp[r].parse::<i64>().unwrap();
    let (y, mo, d) = (n(0..4), n(4..6), n(6..8));
    // Days from civil (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if mo > 2 { mo - 3 } else { mo + 9 }) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    ((days * 24 + n(9..11)) * 60 + n(11..13)) * 60_000 + n(13..15) * 1000 + n(16..19)
}

/// A rule on the runtime's own exception counter collects the logs of the 10 s before it fired
/// and the 2 s after, through FileSystem egress: every Information-or-above message of that
/// span, as NDJSON.
#[test]
fn an_exception_count_rule_collects_the_logs_before_it() {
    let mut target = Target::builder("Logs")
        .args([
            "--messages-per-second",
            "100",
            "--exceptions-per-second",
            "20",
            "--exceptions-after-seconds",
            "20",
            "--no-span-lines",
        ])
        .start();
    let pid = target.pid();
    let dir = data_dir("signals-rule");
    let artifacts = dir.join("artifacts");
    std::fs::create_dir_all(dir.join("config")).unwrap();
    let config = dir.join("config/settings.json");
    let settings = serde_json::json!({
        "Egress": {"FileSystem": {"artifacts": {"DirectoryPath": artifacts}}},
        "CollectionRules": {"Exceptions": {
            "Trigger": {"Type": "EventCounter", "Settings": {
                "ProviderName": "System.Runtime", "CounterName": "exception-count",
                "GreaterThan": 10, "SlidingWindowDuration": "00:00:01"}},
            "Actions": [{"Type": "CollectLogs", "Settings": {
                "DefaultLevel": "Information", "UseAppFilters": true, "Duration": "00:00:02",
                "Format": "NewlineDelimitedJson",
                "PreTriggerSeconds": 10, "Egress": "artifacts"}},
                {"Type": "CollectExceptions", "Settings": {
                "Format": "NewlineDelimitedJson", "Egress": "artifacts",
                "Filters": {"Include": [{"ExceptionType": "System.TimeoutException"}]}}}],
            "Limits": {"ActionCount": 1}}}
    });
    std::fs::write(&config, settings.to_string()).unwrap();
    let agent = Agent::start(
        &dir.join("store"),
        &[
            "--pid",
            &pid.to_string(),
            "--logs",
            "Information",
            "--log",
            "clrscope=info,exporter=info",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    agent
        .wait_attached(pid, true, Duration::from_secs(60))
        .expect("attached");
    let attached_ms = profile_clock_ms();
    // The target starts throwing 20 s after its ready line; the rule fires soon after.
    let deadline = Instant::now() + Duration::from_secs(120);
    let file = loop {
        let done = std::fs::read_dir(&artifacts).ok().and_then(|d| {
            d.filter_map(Result::ok).map(|e| e.path()).find(|p| {
                p.extension().is_some_and(|x| x == "json")
                    && !p.to_string_lossy().ends_with(".exceptions.json")
            })
        });
        // FileSystem egress without an intermediate folder writes in place: done once logged
        // (the logs, 2 s long, after the exceptions, written at once).
        if let Some(path) = done.filter(|_| agent.log().matches("artifact written").count() >= 2) {
            break path;
        }
        assert!(
            Instant::now() < deadline,
            "no logs collected\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(300));
        let _ = target.drain_lines();
    };
    let name = file.file_name().unwrap().to_str().unwrap().to_string();
    let fired_ms = file_stamp_ms(&name[..19]);
    let body = std::fs::read_to_string(&file).unwrap();
    let records: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let at_ms = |r: &Value| r["UnixNanos"].as_i64().unwrap() / 1_000_000;
    let first = records.iter().map(at_ms).min().unwrap();
    let last = records.iter().map(at_ms).max().unwrap();
    assert!(
        fired_ms - attached_ms > 12_000,
        "the rule fired {} ms after attaching",
        fired_ms - attached_ms
    );
    assert!(
        first <= fired_ms - 9_500,
        "the first record is {} ms before the trigger",
        fired_ms - first
    );
    assert!(
        last >= fired_ms + 1_000,
        "the last record is {} ms after the trigger",
        last - fired_ms
    );
    let sequences: HashSet<u64> = records
        .iter()
        .map(|r| r["State"]["OrderId"].as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(sequences.len(), records.len(), "a message twice");
    let (lo, hi) = (
        *sequences.iter().min().unwrap(),
        *sequences.iter().max().unwrap(),
    );
    let missing: Vec<u64> = (lo..=hi)
        .filter(|&s| rank(level_of(s)) >= rank("Information") && !sequences.contains(&s))
        .collect();
    assert!(missing.is_empty(), "missing {missing:?}");
    println!(
        "CollectLogs: {} records from {} ms before to {} ms after the trigger",
        records.len(),
        fired_ms - first,
        last - fired_ms
    );

    // CollectExceptions, at the same firing: the kept history thrown before it, only the
    // timeouts the filter includes, every episode from the first kept to the last, once.
    let deadline = Instant::now() + Duration::from_secs(60);
    let exceptions = loop {
        let file = std::fs::read_dir(&artifacts).ok().and_then(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .find(|p| p.to_string_lossy().ends_with(".exceptions.json"))
        });
        if let Some(file) = file.filter(|_| agent.log().matches("artifact written").count() >= 2) {
            break file;
        }
        assert!(
            Instant::now() < deadline,
            "no exceptions collected\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let body = std::fs::read_to_string(&exceptions).unwrap();
    let mut episodes = Vec::new();
    for line in body.lines() {
        let e: Value = serde_json::from_str(line).unwrap_or_else(|err| panic!("{err}: {line}"));
        assert_eq!(e["typeName"], "System.TimeoutException", "{e}");
        let n: u64 = e["message"]
            .as_str()
            .unwrap()
            .strip_prefix("connect timed out #")
            .unwrap()
            .parse()
            .unwrap();
        let at_ms = chrono::DateTime::parse_from_rfc3339(e["timestamp"].as_str().unwrap())
            .unwrap()
            .timestamp_millis();
        assert!(
            at_ms <= fired_ms + 1_000,
            "thrown {} ms after the trigger",
            at_ms - fired_ms
        );
        episodes.push((n, at_ms));
    }
    // The agent was attached before the first throw, so the history starts at episode #1. How
    // many follow depends on where the counter's interval fell when throwing began (the rule
    // needs > 10 exceptions, two per episode, within one interval) and on how far the exception
    // session trails the counters (9 in each of four runs here; the old floor of 10 was luck).
    let numbers: Vec<u64> = episodes.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        numbers.first(),
        Some(&1),
        "the history's first timeout: {body}"
    );
    let expected: Vec<u64> = (numbers[0]..numbers[0] + numbers.len() as u64).collect();
    assert_eq!(numbers, expected, "episodes missing or repeated");
    let earliest = episodes.iter().map(|(_, at)| *at).min().unwrap();
    assert!(earliest < fired_ms - 300, "nothing from before the trigger");
    println!(
        "CollectExceptions: {} timeouts (episodes {}..={}), from {} ms before the trigger",
        episodes.len(),
        numbers[0],
        numbers[numbers.len() - 1],
        fired_ms - earliest
    );
}

fn profile_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// OTLP logs over gRPC and HTTP to a receiver built on the official protos (PyPI
/// opentelemetry-proto + grpcio): severities, bodies, attributes, trace and span ids equal to
/// what the target printed, exceptions with `exception.*`; and the profiles the same agent
/// exports link samples to those same spans.
#[test]
fn logs_and_exceptions_reach_an_otlp_receiver() {
    let dir = data_dir("signals-otlp");
    let receiver = support::receiver::Receiver::start(&dir.join("received"), 0, 0);
    let mut target = Target::builder("Logs")
        .args([
            "--messages-per-second",
            "100",
            "--span-size",
            "5",
            "--exceptions-per-second",
            "10",
        ])
        .start();
    let pid = target.pid();
    std::fs::create_dir_all(dir.join("config")).unwrap();
    let config = dir.join("config/settings.json");
    let endpoint = |port: u16| format!("http://127.0.0.1:{port}");
    let settings = serde_json::json!({"Exporters": {
        "grpc": {"Kind": "otlp-grpc", "Endpoint": endpoint(receiver.grpc_port), "Interval": "2s",
                 "Signals": ["Profiles", "Logs"]},
        "http": {"Kind": "otlp-http", "Endpoint": endpoint(receiver.http_port), "Interval": "2s",
                 "Compression": "none", "Signals": ["Logs"]}}});
    std::fs::write(&config, settings.to_string()).unwrap();
    let agent = Agent::start(
        &dir.join("store"),
        &[
            "--pid",
            &pid.to_string(),
            "--logs",
            "Information",
            "--trace-linkage",
            "--trace-source",
            "Logs",
            "--sample-period",
            "2s",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    let mut reported = Reported::default();
    let got = receiver.collect_until(Duration::from_secs(120), |got| {
        reported.absorb(&mut target);
        let enough = |t| {
            let records = scoped_items(got, "otlp-logs", t, "records");
            records
                .iter()
                .filter(|r| r.scope.starts_with("Logs."))
                .count()
                >= 400
                && records
                    .iter()
                    .filter(|r| r.scope == "clrscope.exceptions")
                    .count()
                    >= 40
        };
        let linked_profile = got
            .iter()
            .any(|r| r["kind"] == "otlp" && r.to_string().contains("\"span_id\":\""));
        enough("grpc") && enough("http") && linked_profile
    });
    std::thread::sleep(Duration::from_millis(500));
    reported.absorb(&mut target);
    // No profiles over the exporter that sends only logs.
    assert!(!got
        .iter()
        .any(|r| r["kind"] == "otlp" && r["transport"] == "http"));
    for transport in ["grpc", "http"] {
        let records = scoped_items(&got, "otlp-logs", transport, "records");
        let (mut logs, mut in_span, mut right) = (0, 0, 0);
        let (mut exceptions, mut thrown_in_span, mut exception_spans, mut unnamed) = (0, 0, 0, 0);
        for record in &records {
            let (resource, scope, r) = (record.resource, record.scope, record.item);
            assert_eq!(resource["service.name"], "Logs");
            assert_eq!(resource["process.pid"], pid);
            let a = &r["attributes"];
            if scope == "clrscope.exceptions" {
                exceptions += 1;
                assert_eq!(r["severity_number"], 17);
                let ty = a["exception.type"].as_str().unwrap();
                let message = a["exception.message"].as_str().unwrap();
                assert_eq!(r["body"], format!("{ty}: {message}").as_str());
                let (episode, thrown_in): (u64, _) = match ty {
                    "System.TimeoutException" => (
                        message
                            .strip_prefix("connect timed out #")
                            .unwrap()
                            .parse()
                            .unwrap(),
                        "Connect(",
                    ),
                    "Logs.Payments.PaymentDeclinedException" => (
                        message
                            .strip_prefix("payment declined #")
                            .unwrap()
                            .parse()
                            .unwrap(),
                        "Charge(",
                    ),
                    other => panic!("{other}"),
                };
                // Exceptions thrown while the agent's attach rundown has not yet named the code
                // compiled before it lack those frames (counted, bounded below); a named throwing
                // frame is always the first.
                let stack = a["exception.stacktrace"].as_str().unwrap();
                if !stack.starts_with(&format!("   at Logs.Payments.Gateway.{thrown_in}")) {
                    assert!(!stack.contains("Logs.Payments.Gateway."), "{stack}");
                    unnamed += 1;
                }
                if let Some(expected) = reported.charge_span_of.get(&episode) {
                    thrown_in_span += 1;
                    if r["span_id"].as_str() == Some(expected.as_str()) {
                        exception_spans += 1;
                    } else {
                        assert_eq!(r["span_id"], "", "episode {episode}: another span's id");
                    }
                }
                continue;
            }
            logs += 1;
            let seq: u64 = a["OrderId"].as_str().unwrap().parse().unwrap();
            let level = level_of(seq);
            assert!(rank(level) >= rank("Information"));
            assert_eq!(r["severity_text"], level);
            assert_eq!(r["severity_number"], 1 + 4 * rank(level) as u64);
            assert_eq!(
                scope,
                if seq.is_multiple_of(2) {
                    "Logs.Orders"
                } else {
                    "Logs.Payments"
                }
            );
            assert_eq!(
                r["body"],
                format!("Order {seq} for c{} costs {}.5", seq % 7, seq % 100).as_str()
            );
            assert_eq!(
                a["message.template"],
                "Order {OrderId} for {Customer} costs {Amount}"
            );
            assert_eq!(a["event.id"], 1000 + rank(level) as u64);
            if rank(level) >= rank("Error") {
                assert_eq!(
                    a["exception.type"],
                    "Logs.Payments.PaymentDeclinedException"
                );
            }
            if let Some(expected) = reported.batch_span_of.get(&seq) {
                in_span += 1;
                let span = r["span_id"].as_str().unwrap();
                if !span.is_empty() {
                    assert_eq!(span, expected, "message {seq}: another span's id");
                    assert_eq!(r["trace_id"], reported.trace_of[expected].as_str());
                    assert_eq!(a["clrscope.ids_from"], ids_from(), "{r}");
                    assert_eq!(r["flags"], 1, "{r}");
                    right += 1;
                }
            }
        }
        assert!(
            in_span >= 300,
            "{transport}: {in_span} messages in reported spans"
        );
        assert!(
            right as f64 >= min_linked() * in_span as f64,
            "{transport}: {right} of {in_span} with their span ids"
        );
        assert!(
            exception_spans as f64 >= 0.95 * thrown_in_span as f64,
            "{transport}: {exception_spans} of {thrown_in_span}; the agent counted {} events \
             the runtime dropped, {} session restarts, {} linkage renewals, {} abandoned spans",
            agent.metric("clrscope_eventpipe_dropped_events_total", &[]),
            agent.metric("clrscope_session_restarts_total", &[]),
            agent.metric("clrscope_linkage_refreshes_total", &[]),
            agent.metric("clrscope_linkage_total", &["abandoned_spans"]),
        );
        assert!(
            unnamed as f64 <= 0.1 * exceptions as f64,
            "{transport}: {unnamed} of {exceptions} stacks unnamed"
        );
        println!("OTLP logs over {transport}: {logs} records, {right}/{in_span} with their span ids; {exceptions} exceptions, {exception_spans}/{thrown_in_span} with their span ids, {unnamed} thrown before the rundown named their stack");
    }
    // The profiles' links name the same spans the logs carry.
    let batch_spans: HashSet<&String> = reported.batch_span_of.values().collect();
    let linked = profile_link_span_ids(&got)
        .into_iter()
        .filter(|id| batch_spans.contains(&id.to_string()))
        .count();
    assert!(linked > 0, "no profile sample links to a Logs.Batch span");
    println!("profiles: {linked} samples linked to the logs' Logs.Batch spans");
}

/// The target's ground truth from its progress lines: the last sequence logged, and the
/// Information-or-above sequences its logger refused (not handed to the EventSource).
#[derive(Default)]
struct Refused {
    last_sequence: u64,
    ranges: Vec<(u64, u64)>,
}

impl Refused {
    fn absorb(&mut self, target: &mut Target) {
        for line in target.drain_lines() {
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if v["progress"] != "Logs" {
                continue;
            }
            self.last_sequence = v["totals"]["last_sequence"].as_u64().unwrap();
            for range in v["not_enabled"].as_array().unwrap() {
                let (a, b) = (range[0].as_u64().unwrap(), range[1].as_u64().unwrap());
                self.ranges.push((a, b));
            }
        }
    }

    fn refused(&self, seq: u64) -> bool {
        self.ranges.iter().any(|&(a, b)| (a..=b).contains(&seq))
    }

    fn count(&self) -> u64 {
        self.ranges.iter().map(|(a, b)| b - a + 1).sum()
    }
}

/// The most messages the loggers hand on, per renewal of the agent's logs session, that reach no
/// session ([`otlp_logs_survive_other_sessions_on_the_provider`]).
const MISSING_PER_RENEWAL: f64 = 8.0;
/// The most Information-or-above messages (of 100 a second) the loggers refuse after one
/// session's end until the agent's next session is enabled.
const MAX_REFUSED_STRETCH: u64 = 80;

/// Issue 44 item 5: with `--logs Information` feeding OTLP, `/logs` requests at Warning, at Debug
/// and with filter specs come and go, and another tool's session with the provider (`clrscope
/// trace`) starts and stops, over and over (`CLRSCOPE_LOGS_SHARING_SECONDS`, default 60; the
/// issue's run is 600). OTLP must receive every Information-or-above message the target's logger
/// handed to the EventSource exactly once; what it did not hand on (the runtime turns every
/// logger off when any session with the provider ends, until a session is enabled anew) is
/// counted from the target's own report, and each of those is near the end of another tool's
/// session or a restart of the agent's.
#[test]
fn otlp_logs_survive_other_sessions_on_the_provider() {
    let seconds: u64 = std::env::var("CLRSCOPE_LOGS_SHARING_SECONDS")
        .ok()
        .map_or(60, |s| {
            s.parse().expect("CLRSCOPE_LOGS_SHARING_SECONDS: seconds")
        });
    let dir = data_dir("signals-sharing");
    let (receiver, mut target, agent) = logs_to_otlp(&dir, "100", &[], "1s");
    let pid = target.pid();
    let mut truth = Refused::default();
    let mut got: Vec<Value> = Vec::new();
    let started = Instant::now();
    let (mut requests, mut traces) = (0, 0);
    let mut step = 0;
    while started.elapsed() < Duration::from_secs(seconds) {
        match step % 5 {
            0 => {
                let r = get(
                    &agent,
                    &format!("/logs?pid={pid}&durationSeconds=3&level=Warning"),
                    "application/x-ndjson",
                );
                let r = agent.expect_status(r, 200, "GET /logs?level=Warning");
                assert!(r.body.lines().count() > 50, "{}", r.body.len());
                assert!(r.body.lines().all(|l| {
                    let v: Value = serde_json::from_str(l).unwrap();
                    rank(v["LogLevel"].as_str().unwrap()) >= rank("Warning")
                }));
                requests += 1;
            }
            1 => {
                let r = get(
                    &agent,
                    &format!("/logs?pid={pid}&durationSeconds=3&level=Debug"),
                    "application/x-ndjson",
                );
                let r = agent.expect_status(r, 200, "GET /logs?level=Debug");
                assert!(r.body.contains(r#""LogLevel":"Debug""#), "{}", r.body.len());
                requests += 1;
            }
            2 => {
                let r = post(
                    &agent,
                    &format!("/logs?pid={pid}&durationSeconds=3"),
                    "application/x-ndjson",
                    r#"{"logLevel": "Critical", "filterSpecs": {"Logs.Orders": "Trace"}, "useAppFilters": false}"#,
                );
                let r = agent.expect_status(r, 200, "POST /logs with filter specs");
                assert!(r.body.contains(r#""LogLevel":"Trace""#), "{}", r.body.len());
                requests += 1;
            }
            3 => {
                // Another tool's session with the provider: its end turns the loggers off.
                let out = std::process::Command::new(env!("CARGO_BIN_EXE_clrscope"))
                    .args([
                        "trace",
                        "--pid",
                        &pid.to_string(),
                        "--providers",
                        "Microsoft-Extensions-Logging:0x8:5",
                        "--no-rundown",
                        "--duration",
                        "3s",
                        "-o",
                    ])
                    .arg(dir.join(format!("other-{traces}.nettrace")))
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                traces += 1;
            }
            _ => std::thread::sleep(Duration::from_secs(3)),
        }
        step += 1;
        truth.absorb(&mut target);
        got.extend(receiver.drain());
    }
    // Everything logged by now reaches the receiver within a few export intervals.
    std::thread::sleep(Duration::from_secs(2));
    truth.absorb(&mut target);
    let upto = truth.last_sequence;
    let received = |got: &[Value]| -> HashMap<u64, u32> {
        let mut counts = HashMap::new();
        for record in scoped_items(got, "otlp-logs", "grpc", "records") {
            if let Some(seq) = record.item["attributes"]["OrderId"].as_str() {
                *counts.entry(seq.parse().unwrap()).or_insert(0) += 1;
            }
        }
        counts
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let counts = loop {
        got.extend(receiver.drain());
        let counts = received(&got);
        let missing = (1..=upto)
            .filter(|&s| rank(level_of(s)) >= rank("Information") && !truth.refused(s))
            .filter(|s| !counts.contains_key(s))
            .count();
        if missing == 0 || Instant::now() > deadline {
            break counts;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let (mut expected, mut missing, mut twice) = (0, Vec::new(), Vec::new());
    for s in 1..=upto {
        let n = counts.get(&s).copied().unwrap_or(0);
        if n > 1 {
            twice.push(s);
        }
        if rank(level_of(s)) < rank("Information") {
            assert_eq!(n, 0, "message {s} is below Information");
            continue;
        }
        if truth.refused(s) {
            assert_eq!(n, 0, "message {s} was refused by the logger, yet received");
        } else {
            expected += 1;
            if n == 0 {
                missing.push(s);
            }
        }
    }
    let renewals = |reason: &str| {
        agent.metric(
            "clrscope_logs_session_renewals_total",
            &[&format!("reason=\"{reason}\"")],
        )
    };
    // What the logger refused once the agent's session had been enabled: stretches after a
    // session with the provider ended (another tool's, or the agent's own renewal).
    // A stretch: refused ranges apart only by messages below Information; its size counts the
    // Information-or-above messages in it.
    let first_received = counts.keys().min().copied().unwrap_or(u64::MAX);
    let mut ranges: Vec<(u64, u64)> = truth.ranges.clone();
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64, u64)> = Vec::new();
    for (a, b) in ranges.into_iter().filter(|&(a, _)| a > first_received) {
        match merged.last_mut() {
            Some((_, end, n)) if (*end + 1..a).all(|s| rank(level_of(s)) < rank("Information")) => {
                *end = b;
                *n += b - a + 1;
            }
            _ => merged.push((a, b, b - a + 1)),
        }
    }
    let mut stretches: Vec<u64> = merged.iter().map(|&(_, _, n)| n).collect();
    stretches.sort_unstable();
    let refused_after: u64 = stretches.iter().sum();
    let report = format!(
        "{upto} messages logged in {:.0} s ({requests} /logs requests, {traces} other sessions); \
         {expected} at Information or above handed to the EventSource, {} of them received; {} \
         refused by the logger, {refused_after} of them after the first received in {} \
         stretches (sizes {stretches:?}); renewals: {} union, {} other session, {} quiet",
        started.elapsed().as_secs_f64(),
        expected - missing.len(),
        truth.count(),
        stretches.len(),
        renewals("union"),
        renewals("other_session"),
        renewals("quiet"),
    );
    println!("{report}");
    assert!(
        twice.is_empty(),
        "received more than once: {twice:?}; {report}"
    );
    // Each renewal (the agent's stop and start, sent back to back) loses what the loggers
    // hand on between the old session leaving the provider and their `Disable`: a few
    // messages each (beside two busy loops at load ~40: 32 in 11 renewals in 120 s, 45 in 43
    // in 600 s).
    let renewed = renewals("union") + renewals("other_session") + renewals("quiet");
    assert!(
        missing.len() as f64 <= MISSING_PER_RENEWAL * renewed,
        "{} missing: {missing:?}; {report}",
        missing.len()
    );
    // Each other tool's session end is seen on the diagnostics socket and answered at once.
    assert!(renewals("other_session") >= traces as f64, "{report}");
    // What the loggers refuse after a session's end, until the agent's next session is
    // enabled: seen within ~100 ms, enabled back to back (600 s beside two busy loops: 35
    // stretches of 1-56, median 14); before, ~1.2 s each (65-114 messages at this rate).
    assert!(
        stretches.last().is_none_or(|&n| n <= MAX_REFUSED_STRETCH),
        "{report}"
    );
    assert!(stretches.len() as f64 <= renewed, "{report}");
    assert!(traces >= 2 && requests >= 6, "{report}");
}

/// What an OTLP receiver got of a Logs target's messages, by sequence.
struct Delivery {
    /// The last message logged when asked.
    upto: u64,
    /// The first received (messages before the agent's session was enabled are refused by the
    /// logger or missed).
    first: u64,
    /// Information-or-above messages from `first` to `upto`.
    expected: Vec<u64>,
    /// Of those, not received (after waiting up to 60 s for them).
    missing: Vec<u64>,
    /// Received more than once.
    twice: Vec<u64>,
}

/// Waits (up to 60 s) until `receiver` has every Information-or-above message the target logged
/// up to now that its logger did not refuse, and says what it got.
fn delivered_once(receiver: &support::receiver::Receiver, truth: &Refused) -> Delivery {
    let upto = truth.last_sequence;
    let mut got: Vec<Value> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (counts, first) = loop {
        got.extend(receiver.drain());
        let mut counts: HashMap<u64, u32> = HashMap::new();
        for record in scoped_items(&got, "otlp-logs", "grpc", "records") {
            if let Some(seq) = record.item["attributes"]["OrderId"].as_str() {
                *counts.entry(seq.parse().unwrap()).or_insert(0) += 1;
            }
        }
        let first = counts.keys().min().copied().unwrap_or(u64::MAX);
        let expected = |s: &u64| rank(level_of(*s)) >= rank("Information") && !truth.refused(*s);
        if (first..=upto)
            .filter(expected)
            .all(|s| counts.contains_key(&s))
            || Instant::now() > deadline
        {
            break (counts, first);
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let expected: Vec<u64> = (first..=upto)
        .filter(|&s| rank(level_of(s)) >= rank("Information"))
        .collect();
    let missing = expected
        .iter()
        .copied()
        .filter(|s| !counts.contains_key(s))
        .collect();
    let twice = counts
        .iter()
        .filter(|(_, &n)| n > 1)
        .map(|(&s, _)| s)
        .collect();
    Delivery {
        upto,
        first,
        expected,
        missing,
        twice,
    }
}

/// Issue 45 (the twin's logs beside two CPU hogs lost 2.7 %): a backend slower than the export
/// interval had its requests queued, and the queue of 8 requests dropped the oldest, whatever
/// its 16 MiB byte budget held. An interval's records now join the request still waiting. A
/// receiver that takes 1 s per call and a 200 ms interval (five requests a second for the one
/// it answers): every Information-or-above message the target logged for
/// `CLRSCOPE_SLOW_BACKEND_SECONDS` (default 20) at 100 a second arrives exactly once, and
/// `/metrics` counts no log record dropped (before the fix: drops from the third second on).
#[test]
fn a_slow_backend_gets_every_log_record() {
    let seconds: u64 = std::env::var("CLRSCOPE_SLOW_BACKEND_SECONDS")
        .ok()
        .map_or(20, |s| {
            s.parse().expect("CLRSCOPE_SLOW_BACKEND_SECONDS: seconds")
        });
    let dir = data_dir("signals-slow-backend");
    let (receiver, mut target, agent) =
        logs_to_otlp(&dir, "100", &["--answer-delay", "1"], "200ms");
    let mut truth = Refused::default();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_millis(500));
        truth.absorb(&mut target);
    }
    let Delivery {
        upto,
        first,
        expected,
        missing,
        twice,
    } = delivered_once(&receiver, &truth);
    let dropped = agent.metric("clrscope_export_dropped_log_records_total", &[]);
    let requests = agent.metric("clrscope_export_sent_requests_total", &[]);
    let report = format!(
        "{upto} messages logged, {} at Information or above from the first received ({first}) \
         in {requests} requests, missing {} (first {:?}), received twice {twice:?}, refused by \
         the logger {:?}, dropped by the agent {dropped}",
        expected.len(),
        missing.len(),
        missing.first(),
        truth.ranges,
    );
    println!("{report}");
    assert!(expected.len() as u64 >= seconds * 30, "{report}");
    assert!(
        missing.is_empty() && twice.is_empty() && dropped == 0.0,
        "{report}"
    );
}

/// A Logs target writing `messages_per_second` (no exceptions, no span lines), and an agent
/// collecting its Information-or-above logs into an OTLP/gRPC receiver (started with
/// `receiver_args`) every `interval`; their files in `dir`, which the caller holds until they
/// are dropped.
fn logs_to_otlp(
    dir: &std::path::Path,
    messages_per_second: &str,
    receiver_args: &[&str],
    interval: &str,
) -> (support::receiver::Receiver, Target, Agent) {
    let receiver =
        support::receiver::Receiver::start_with(&dir.join("received"), 0, 0, receiver_args);
    let target = Target::builder("Logs")
        .args([
            "--messages-per-second",
            messages_per_second,
            "--exceptions-per-second",
            "0",
            "--no-span-lines",
        ])
        .start();
    let pid = target.pid();
    std::fs::create_dir_all(dir.join("config")).unwrap();
    let config = dir.join("config/settings.json");
    let settings = serde_json::json!({"Exporters": {
        "grpc": {"Kind": "otlp-grpc", "Endpoint": format!("http://127.0.0.1:{}", receiver.grpc_port),
                 "Interval": interval, "Signals": ["Logs"]}}});
    std::fs::write(&config, settings.to_string()).unwrap();
    let agent = Agent::start(
        &dir.join("store"),
        &[
            "--pid",
            &pid.to_string(),
            "--logs",
            "Information",
            "--no-exceptions",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    agent
        .wait_attached(pid, true, Duration::from_secs(60))
        .expect("attached");
    (receiver, target, agent)
}

/// Issue 45 (the twin's logs): where nothing else connects to the runtime, the agent's logs
/// session is never started again, however quiet the app: a renewal turns the app's loggers off
/// until its new session is enabled, so each costs what is logged meanwhile (the twin lost 35 of
/// 16,194 records to 33 renewals for quiet in 600 s). A target logging one message every 2 s for
/// `CLRSCOPE_QUIET_LOGS_SECONDS` (default 20): OTLP receives every Information-or-above message
/// its logger handed on exactly once, the logger refused none after the first received, and
/// `/metrics` counts no renewal (before the fix: one each time the stream was quiet for 1 s,
/// doubling while none brought anything).
#[test]
fn a_quiet_app_keeps_its_logs_session() {
    let seconds: u64 = std::env::var("CLRSCOPE_QUIET_LOGS_SECONDS")
        .ok()
        .map_or(20, |s| {
            s.parse().expect("CLRSCOPE_QUIET_LOGS_SECONDS: seconds")
        });
    let dir = data_dir("signals-quiet-logs");
    let (receiver, mut target, agent) = logs_to_otlp(&dir, "0.5", &[], "1s");
    let mut truth = Refused::default();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_millis(500));
        truth.absorb(&mut target);
    }
    let Delivery {
        upto,
        first,
        expected,
        missing,
        twice,
    } = delivered_once(&receiver, &truth);
    let renewals = |reason: &str| {
        agent.metric(
            "clrscope_logs_session_renewals_total",
            &[&format!("reason=\"{reason}\"")],
        )
    };
    let report = format!(
        "{upto} messages logged, {} at Information or above from the first received ({first}), \
         missing {missing:?}, received twice {twice:?}, refused by the logger {:?}; renewals: {} \
         union, {} other session, {} quiet",
        expected.len(),
        truth.ranges,
        renewals("union"),
        renewals("other_session"),
        renewals("quiet"),
    );
    println!("{report}");
    assert!(expected.len() >= 3, "{report}");
    assert!(missing.is_empty() && twice.is_empty(), "{report}");
    assert!(
        truth.ranges.iter().all(|&(_, b)| b < first),
        "the logger refused messages after the agent's session was enabled: {report}"
    );
    for reason in ["union", "other_session", "quiet"] {
        assert_eq!(renewals(reason), 0.0, "{report}");
    }
}

/// Issue 44 (7): with trace linkage, exceptions went to the linkage session, which waits out the
/// startup grace, so a fresh process's first 30 s of exceptions were lost. They come in the light
/// session from attach: within the grace, `/exceptions` holds every exception the target threw
/// from the first one the agent saw on, and none it did not throw.
#[test]
fn exceptions_come_from_the_first_second_with_linkage() {
    const GRACE: Duration = Duration::from_secs(30);
    let mut target = Target::builder("Faults")
        .args([
            "--exceptions-per-second",
            "20",
            "--secondary-per-second",
            "0",
            "--lock-episodes-per-second",
            "0",
        ])
        .start();
    let pid = target.pid();
    let dir = data_dir("exceptions-first-second");
    let pid_arg = format!("--pid={pid}");
    let agent = Agent::start(
        &dir,
        &[&pid_arg, "--trace-linkage", "--startup-grace", "30s"],
    );
    agent
        .wait_attached(pid, true, Duration::from_secs(20))
        .expect("the agent attaches");
    // Each exception's message carries its sequence number: what was kept is judged by number.
    let kept = || -> Vec<u64> {
        let r = get(
            &agent,
            &format!("/exceptions?pid={pid}"),
            "application/x-ndjson",
        );
        assert_eq!(r.status, 200, "{}", r.body);
        r.body
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|e| {
                e["message"]
                    .as_str()?
                    .strip_prefix("injected fault #")?
                    .parse()
                    .ok()
            })
            .collect()
    };
    // Those thrown before the agent's first exception may be missed (its session was not on);
    // from the first one seen on, 60 in a row (3 s) must be kept, each once.
    const IN_A_ROW: u64 = 60;
    loop {
        let age = support::process_age(pid);
        let mut sequences = kept();
        let count = sequences.len();
        sequences.sort_unstable();
        sequences.dedup();
        assert_eq!(
            count,
            sequences.len(),
            "an exception kept twice: {sequences:?}"
        );
        let first = sequences.first().copied();
        let gaps: Vec<u64> = first
            .map(|first| {
                (first..first + IN_A_ROW)
                    .filter(|n| sequences.binary_search(n).is_err())
                    .collect()
            })
            .unwrap_or_default();
        if first.is_some() && gaps.is_empty() {
            eprintln!("at age {age:?}: {count} kept from #{first:?} on, {IN_A_ROW} in a row");
            break;
        }
        assert!(
            age < GRACE - Duration::from_secs(2),
            "at age {age:?}: {count} exceptions kept from #{first:?}, missing {gaps:?};\n{}",
            agent.log()
        );
        target.drain_lines();
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Issue 46 (1), through the agent: its linkage and logs sessions ask for no stack walks, which a
/// .NET 9+ runtime grants (CollectTracing3) and .NET 8 answers "unknown command" to, once per
/// process (logged at debug), its sessions then taken as CollectTracing2; the light session keeps
/// its stacks (exceptions). Either way logs and exceptions still come, joined to their spans.
#[test]
fn linkage_and_logs_sessions_ask_for_no_stacks() {
    let target = Target::builder("Logs")
        .args([
            "--messages-per-second",
            "50",
            "--span-size",
            "5",
            "--exceptions-per-second",
            "5",
        ])
        .start();
    let pid = target.pid();
    let dir = data_dir("no-stacks");
    let pid_arg = format!("--pid={pid}");
    let agent = Agent::start(
        &dir,
        &[
            &pid_arg,
            "--trace-linkage",
            "--trace-source",
            "Logs",
            "--logs",
            "Information",
            "--log",
            "clrscope=info,collector::session=debug",
        ],
    );
    agent
        .wait_attached(pid, true, Duration::from_secs(60))
        .expect("the agent attaches");
    let path = format!("/api/v1/processes/{pid}/signals?limit=10");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let recent = agent.get(&path).json();
        let linked = |kind: &str, id: &str| {
            recent[kind]
                .as_array()
                .is_some_and(|r| r.iter().any(|r| r[id].is_string()))
        };
        if linked("logs", "SpanId") && linked("exceptions", "spanId") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no logs and exceptions in spans: {recent}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let log = agent.log();
    let enabled = |session: &str| {
        log.lines()
            .find(|l| {
                l.contains("session enabled") && l.contains(&format!("session=\"{session}\""))
            })
            .unwrap_or_else(|| panic!("no {session} session enabled:\n{log}"))
            .to_string()
    };
    let offers = support::runtime_major() >= 9;
    for session in ["linkage", "logs"] {
        let line = enabled(session);
        let expected = if offers {
            "command=\"CollectTracing3\" stack_walks=false"
        } else {
            "command=\"CollectTracing2\" stack_walks=true"
        };
        assert!(line.contains(expected), "{line}");
    }
    assert!(enabled("light").contains("stack_walks=true"));
    let fallbacks = log
        .matches("the runtime does not know this CollectTracing version")
        .count();
    assert_eq!(fallbacks, usize::from(!offers), "{log}");
}
