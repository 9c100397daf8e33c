//! OpenTelemetry traces out of process on a real .NET 8 runtime: the `AsyncWeb` target serves
//! requests under load inside spans of its own (tags, status, an await that resumes on another
//! thread, a nested span) and of its ASP.NET Core hosting stand-in, and prints every span's ids,
//! tags and measured duration; the agent exports them as OTLP spans to a receiver built on the
//! official protos (PyPI opentelemetry-proto + grpcio), over gRPC (configured in settings) and
//! HTTP (configured by OpenTelemetry's environment variables). Everything is judged against what
//! the target printed.

mod support;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::agent::{data_dir, peak_and_late_growth, Agent};
use support::receiver::{profile_link_span_ids, scoped_items, unix_nanos, Receiver, Scoped};
use support::Target;

/// OTLP `SpanKind` values.
const INTERNAL: u64 = 1;
const SERVER: u64 = 2;
const HOSTING_SPAN: &str = "Microsoft.AspNetCore.Hosting.HttpRequestIn";

/// The spans of the `otlp-traces` requests in `got` received over `transport`.
fn exported_spans<'a>(got: &'a [Value], transport: &str) -> Vec<Scoped<'a>> {
    scoped_items(got, "otlp-traces", transport, "spans")
}

/// The request lines the target printed (requests of a known kind only).
fn absorb(target: &mut Target, requests: &mut Vec<Value>) {
    for line in target.drain_lines() {
        if let Ok(v) = serde_json::from_str::<Value>(&line) {
            if v["request"].is_u64() && v["kind"].is_string() {
                requests.push(v);
            }
        }
    }
}

/// A span the target printed: its id, name and parent, the milliseconds the target's Stopwatch
/// measured around it, and its own `Activity.Duration`.
struct Printed {
    id: String,
    name: &'static str,
    parent: String,
    around_ms: f64,
    duration_ms: f64,
}

/// The spans of one request line.
fn spans_of(request: &Value) -> Vec<Printed> {
    let text = |key: &str| request[key].as_str().unwrap_or("").to_string();
    let kind = text("kind");
    let name = match kind.as_str() {
        "alpha" => "AsyncWeb.Alpha",
        "bravo" => "AsyncWeb.Bravo",
        _ => "AsyncWeb.Charlie",
    };
    let ms = |key: &str| request[key].as_f64().unwrap();
    let mut spans = vec![
        Printed {
            id: text("hosting_span_id"),
            name: HOSTING_SPAN,
            parent: text("parent_span_id"),
            around_ms: ms("hosting_ms"),
            duration_ms: ms("hosting_duration_ms"),
        },
        Printed {
            id: text("span_id"),
            name,
            parent: text("hosting_span_id"),
            around_ms: ms("span_ms"),
            duration_ms: ms("span_duration_ms"),
        },
    ];
    if let Some(inner) = request["inner_span_id"].as_str() {
        spans.push(Printed {
            id: inner.to_string(),
            name: "AsyncWeb.Charlie.Inner",
            parent: text("span_id"),
            around_ms: ms("inner_span_ms"),
            duration_ms: ms("inner_span_duration_ms"),
        });
    }
    spans
}

fn settings(dir: &Path, exporters: Value) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("settings.json");
    std::fs::write(&path, json!({ "Exporters": exporters }).to_string()).unwrap();
    path
}

/// Every span AsyncWeb recorded under load arrives once over each transport, with its parent,
/// name, kind, tags, status and a duration within 1 ms of what the target measured around it;
/// spans whose request resumed on another thread are complete; every profile sample link names
/// an exported span.
#[test]
fn asyncweb_spans_reach_an_otlp_receiver() {
    let dir = data_dir("traces-otlp");
    let receiver = Receiver::start_with(
        &dir.join("received"),
        0,
        0,
        &["--traces-path", "/custom/traces"],
    );
    let mut target = Target::builder("AsyncWeb")
        .args([
            "--self-load",
            "100",
            "--self-load-paths",
            "alpha,bravo,charlie",
            "--alpha-ms",
            "2",
            "--charlie-ms",
            "2",
        ])
        .start();
    let pid = target.pid();
    let config = settings(
        &dir.join("config"),
        json!({"grpc": {"Kind": "otlp-grpc",
                        "Endpoint": format!("http://127.0.0.1:{}", receiver.grpc_port),
                        "Interval": "2s", "Signals": ["Profiles", "Traces"]}}),
    );
    // The HTTP exporter comes from OpenTelemetry's variables: a signal endpoint is used as it is.
    let traces_url = format!("http://127.0.0.1:{}/custom/traces", receiver.http_port);
    let agent = Agent::start_with_env(
        &dir.join("store"),
        &[
            "--pid",
            &pid.to_string(),
            "--trace-linkage",
            "--sample-period",
            "2s",
            "--config",
            config.to_str().unwrap(),
        ],
        None,
        &[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", Path::new(&traces_url)),
            (
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                Path::new("x-tenant=team%201"),
            ),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                Path::new("deployment.environment=test,service.name=not-this-one"),
            ),
        ],
    );
    // Requests the agent saw from their start: those after the first exported span.
    let mut requests: Vec<Value> = Vec::new();
    let attached_at = Instant::now();
    let mut first_exported: Option<usize> = None;
    let got = receiver.collect_until(Duration::from_secs(180), |got| {
        absorb(&mut target, &mut requests);
        if first_exported.is_none() && !exported_spans(got, "grpc").is_empty() {
            // Anything printed from now on started after the agent listened (plus a margin).
            first_exported = Some(requests.len() + 50);
        }
        let Some(from) = first_exported else {
            return false;
        };
        if requests.len() < from + 400 {
            return false;
        }
        ["grpc", "http"].iter().all(|t| {
            let ids: HashSet<&str> = exported_spans(got, t)
                .iter()
                .map(|e| e.item["span_id"].as_str().unwrap())
                .collect();
            requests[from..from + 400]
                .iter()
                .flat_map(spans_of)
                .all(|p| ids.contains(p.id.as_str()))
        })
    });
    let from = first_exported.unwrap();
    let judged = &requests[from..from + 400];
    // The profiles received so far link spans that have all ended by now: one more interval
    // brings their spans.
    let profiles_before = got.len();
    std::thread::sleep(Duration::from_secs(5));
    let mut got = got;
    got.extend(receiver.drain());

    for transport in ["grpc", "http"] {
        let spans = exported_spans(&got, transport);
        let mut by_id: HashMap<&str, Vec<&Scoped>> = HashMap::new();
        for e in &spans {
            by_id
                .entry(e.item["span_id"].as_str().unwrap())
                .or_default()
                .push(e);
        }
        let (mut checked, mut switched, mut worst_ms) = (0, 0, 0f64);
        for request in judged {
            for Printed {
                id,
                name,
                parent,
                around_ms,
                duration_ms,
            } in spans_of(request)
            {
                let copies = &by_id[id.as_str()];
                assert_eq!(
                    copies.len(),
                    1,
                    "{transport}: span {id} ({name}) arrived {} times",
                    copies.len()
                );
                let e = copies[0];
                let s = e.item;
                assert_eq!(s["name"], name, "{transport}: {s}");
                assert_eq!(s["parent_span_id"], parent.as_str(), "{transport}: {s}");
                assert_eq!(s["trace_id"], request["trace_id"], "{transport}: {s}");
                assert_eq!(s["flags"].as_u64().unwrap() & 1, 1);
                assert_eq!(e.resource["service.name"], "AsyncWeb");
                assert_eq!(e.resource["process.pid"], pid);
                let nanos = s["end_time_unix_nano"].as_u64().unwrap()
                    - s["start_time_unix_nano"].as_u64().unwrap();
                let exported_ms = nanos as f64 / 1e6;
                let off = (duration_ms - exported_ms).abs();
                worst_ms = worst_ms.max(off);
                assert!(
                    off <= 1.0,
                    "{transport}: {name} {id}: exported {exported_ms:.4} ms, the target's span lasted {duration_ms:.4} ms"
                );
                // The target's Stopwatch ran from before the start to after the stop.
                assert!(
                    exported_ms <= around_ms + 0.1,
                    "{transport}: {name} {id}: exported {exported_ms:.4} ms, longer than the {around_ms:.3} ms around it"
                );
                assert_eq!(s["events"], 0);
                assert_eq!(s["links"], 0);
                if name == HOSTING_SPAN {
                    assert_eq!(s["kind"], SERVER);
                    assert_eq!(e.scope, "Microsoft.AspNetCore");
                } else if name == "AsyncWeb.Charlie.Inner" {
                    assert_eq!(s["kind"], INTERNAL);
                    assert_eq!(s["attributes"], json!({"asyncweb.part": "inner"}));
                    assert_eq!(s["status_code"], 0);
                } else {
                    assert_eq!(e.scope, "AsyncWeb");
                    assert_eq!(s["kind"], INTERNAL);
                    assert_eq!(s["attributes"], request["span_tags"], "{transport}: {s}");
                    assert_eq!(request["span_status"], "Ok");
                    assert_eq!(s["status_code"], 1);
                    if request["switched_thread"] == true {
                        switched += 1;
                    }
                }
                checked += 1;
            }
        }
        assert!(
            switched >= 300,
            "{transport}: only {switched} requests resumed on another thread"
        );
        println!(
            "OTLP traces over {transport}: {checked} spans of {} requests each once with their parent, \
             name, kind, tags and status; {switched} resumed on another thread; durations within \
             {worst_ms:.3} ms of the target's",
            judged.len()
        );
    }
    // The HTTP exporter took OpenTelemetry's variables: headers and resource attributes, the
    // process's own service.name kept.
    let http = got
        .iter()
        .find(|r| r["kind"] == "otlp-traces" && r["transport"] == "http")
        .unwrap();
    assert_eq!(http["path"], "/custom/traces");
    assert_eq!(http["headers"]["x-tenant"], "team 1");
    let resource = &http["resources"][0]["attributes"];
    assert_eq!(resource["deployment.environment"], "test");
    assert_eq!(resource["service.name"], "AsyncWeb");
    // No profiles over the environment's exporter: it sends traces only (others have no
    // endpoint).
    assert!(!got
        .iter()
        .any(|r| r["kind"] == "otlp" && r["transport"] == "http"));

    // Every profile sample link names an exported span.
    let exported: HashSet<&str> = exported_spans(&got, "grpc")
        .iter()
        .map(|e| e.item["span_id"].as_str().unwrap())
        .collect();
    let links = profile_link_span_ids(&got[..profiles_before]);
    let missing: Vec<&&str> = links.iter().filter(|id| !exported.contains(**id)).collect();
    assert!(!links.is_empty(), "no profile sample is linked to a span");
    assert!(
        missing.is_empty(),
        "{} of {} profile links name no exported span: {:?}",
        missing.len(),
        links.len(),
        &missing[..missing.len().min(10)]
    );
    println!(
        "profiles: {} sample links, {} to exported spans (attached {:?} ago)",
        links.len(),
        links.len() - missing.len(),
        attached_at.elapsed()
    );
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A counter of the agent's `/metrics`, summed over the series whose labels contain all of
/// `labels`.
fn metric(agent: &Agent, name: &str, labels: &[&str]) -> f64 {
    let text = support::http_get(agent.metrics_port, "/metrics", &[]).body;
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The receiver is down for two minutes under a steady stream of spans: the agent's memory stays
/// bounded, the spans it gives up are counted as spans (`clrscope_export_dropped_spans_total`),
/// and the queued requests are delivered when the receiver is back.
#[test]
fn an_outage_of_the_trace_receiver_costs_bounded_memory() {
    let dir = data_dir("traces-outage");
    let out = dir.join("received");
    let mut receiver = Receiver::start(&out, 0, 0);
    let http_port = receiver.http_port;
    let target = Target::builder("AsyncWeb")
        .args(["--self-load", "100", "--no-request-lines"])
        .start();
    let config = settings(
        &dir,
        json!({"outage": {"Kind": "otlp-http",
                          "Endpoint": format!("http://127.0.0.1:{http_port}"),
                          "Interval": "2s", "QueueSize": "4", "MaxRetryDelay": "4s",
                          "Timeout": "2s", "Signals": ["Traces"]}}),
    );
    let agent = Agent::start(
        &dir.join("data"),
        &[
            &format!("--pid={}", target.pid()),
            "--trace-linkage",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    receiver.collect_until(Duration::from_secs(60), |got| {
        got.iter().filter(|r| r["kind"] == "otlp-traces").count() >= 2
    });
    let before = agent.rss_kib();
    receiver.kill();
    let outage_end = unix_nanos() + 120_000_000_000;
    let rss = agent.rss_kib_over(Duration::from_secs(120), Duration::from_secs(5));
    let dropped = metric(
        &agent,
        "clrscope_export_dropped_spans_total",
        &["exporter=\"outage\"", "reason=\"queue_full\""],
    );
    let dropped_samples = metric(&agent, "clrscope_export_dropped_samples_total", &[]);
    let (peak, late) = peak_and_late_growth(&rss);
    eprintln!(
        "trace outage: RSS {before} KiB before, peak {peak} KiB, growth over the second minute \
         {late} KiB; {dropped} spans dropped (queue_full)"
    );
    // ~200 spans/s for 2 minutes, 4 requests of 2 s kept: most dropped, counted as spans.
    assert!(dropped >= 10_000.0, "{dropped} spans counted as dropped");
    assert_eq!(dropped_samples, 0.0, "span drops counted as samples");
    assert!(
        peak <= before + 64 * 1024,
        "RSS grew from {before} KiB to {peak} KiB during the outage: {rss:?}"
    );
    assert!(late <= 8 * 1024, "RSS still growing: {rss:?}");

    let receiver = Receiver::start(&out, 0, http_port);
    let back = receiver.collect_until(Duration::from_secs(60), |got| {
        got.iter().filter(|r| r["kind"] == "otlp-traces").count() >= 5
    });
    let oldest = exported_spans(&back, "http")
        .iter()
        .map(|e| e.item["start_time_unix_nano"].as_u64().unwrap())
        .min()
        .unwrap();
    assert!(
        oldest < outage_end,
        "the first spans after the outage are from after it: queued requests were lost"
    );
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
}
