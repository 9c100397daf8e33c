//! A process's counters and meters out of the agent, against what the process recorded: the
//! `Meters` target's counter, up-down counter, observable gauge and histogram take known values
//! step by step; the OTLP metric points the agent exports (decoded by `tests/otlp/receiver.py`
//! on the official protos, over gRPC and HTTP), dotnet-monitor's `/livemetrics` (GET and POST)
//! and the CollectLiveMetrics rule action must carry exactly those values (sums exact, quantiles
//! within the runtime's own aggregation); with the receiver down, memory stays bounded, drops are
//! counted, and the queue is delivered when it is back.

use crate::support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::agent::{data_dir, peak_and_late_growth, Agent};
use support::receiver::{unix_nanos, Receiver};
use support::{http_request_with_body, HttpResponse, Target};

const METER: &str = "Clrscope.Test.Meters";

/// The agent's settings: one-second counters, the target's meter on top of the default
/// EventCounters, `exporters`, and `rules` egressing to `artifacts`.
fn settings(dir: &Path, exporters: Value, rules: Value) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("settings.json");
    let settings = json!({
        "GlobalCounter": {"IntervalSeconds": 1},
        "Metrics": {"Meters": [{"MeterName": METER}]},
        "Exporters": exporters,
        "Egress": {"FileSystem": {"artifacts": {"DirectoryPath": dir.join("artifacts")}}},
        "CollectionRules": rules,
    });
    std::fs::write(&path, settings.to_string()).unwrap();
    path
}

/// What the target recorded after each step (and before the first: step 0).
#[derive(Debug, Default, Clone)]
struct Recorded {
    orders: Vec<f64>,
    queue: Vec<f64>,
    temperature: Vec<f64>,
    latency_count: Vec<u64>,
    latency_sum: Vec<f64>,
}

impl Recorded {
    fn new() -> Recorded {
        Recorded {
            orders: vec![0.0],
            queue: vec![0.0],
            temperature: vec![20.0],
            latency_count: vec![0],
            latency_sum: vec![0.0],
        }
    }

    fn push(&mut self, step: &Value) {
        self.orders.push(step["orders_total"].as_f64().unwrap());
        self.queue.push(step["queue"].as_f64().unwrap());
        self.temperature.push(step["temperature"].as_f64().unwrap());
        self.latency_count
            .push(step["latency_count"].as_u64().unwrap());
        self.latency_sum.push(step["latency_sum"].as_f64().unwrap());
    }
}

/// One exported point of the target's meter, flattened.
#[derive(Debug, Clone)]
struct Point {
    metric: String,
    kind: String,
    temporality: Option<String>,
    monotonic: Option<bool>,
    unit: String,
    attributes: Value,
    start: u64,
    time: u64,
    value: f64,
    count: u64,
    quantiles: Vec<(f64, f64)>,
}

/// The points of process `pid`'s scope `scope` in the metrics requests of one transport, in
/// time order; also the scope versions seen.
fn points(
    requests: &[Value],
    transport: &str,
    pid: u32,
    scope: &str,
) -> (Vec<Point>, BTreeSet<String>) {
    let mut out = Vec::new();
    let mut versions = BTreeSet::new();
    for r in requests
        .iter()
        .filter(|r| r["kind"] == "otlp-metrics" && r["transport"] == transport)
    {
        for resource in r["resources"].as_array().unwrap() {
            if resource["attributes"]["process.pid"] != json!(pid) {
                continue;
            }
            for s in resource["scopes"].as_array().unwrap() {
                if s["name"] != scope {
                    continue;
                }
                versions.insert(s["version"].as_str().unwrap().to_string());
                for m in s["metrics"].as_array().unwrap() {
                    for p in m["points"].as_array().unwrap() {
                        out.push(Point {
                            metric: m["name"].as_str().unwrap().to_string(),
                            kind: m["type"].as_str().unwrap().to_string(),
                            temporality: m["temporality"].as_str().map(str::to_string),
                            monotonic: m["monotonic"].as_bool(),
                            unit: m["unit"].as_str().unwrap().to_string(),
                            attributes: p["attributes"].clone(),
                            start: p["start_time_unix_nano"].as_u64().unwrap(),
                            time: p["time_unix_nano"].as_u64().unwrap(),
                            value: p["value"]
                                .as_f64()
                                .unwrap_or(p["sum"].as_f64().unwrap_or(0.0)),
                            count: p["count"].as_u64().unwrap_or(0),
                            quantiles: p["quantiles"]
                                .as_array()
                                .map(|q| {
                                    q.iter()
                                        .map(|pair| {
                                            (pair[0].as_f64().unwrap(), pair[1].as_f64().unwrap())
                                        })
                                        .collect()
                                })
                                .unwrap_or_default(),
                        });
                    }
                }
            }
        }
    }
    out.sort_by_key(|p| p.time);
    (out, versions)
}

fn of<'a>(points: &'a [Point], metric: &str) -> Vec<&'a Point> {
    points.iter().filter(|p| p.metric == metric).collect()
}

/// Whether both transports have carried the final values of the counters and the gauge, and
/// several steps of the histogram.
fn complete(requests: &[Value], pid: u32, last: &Recorded) -> bool {
    ["grpc", "http"].iter().all(|transport| {
        let (points, _) = points(requests, transport, pid, METER);
        let final_of =
            |metric: &str, value: f64| of(&points, metric).iter().any(|p| p.value == value);
        final_of("meters.orders", *last.orders.last().unwrap())
            && final_of("meters.queue", *last.queue.last().unwrap())
            && final_of("meters.temperature", *last.temperature.last().unwrap())
            // .NET 8 was seen to stop publishing the histogram's values after a few steps on a
            // loaded machine (the /livemetrics session sees none either): three steps at least.
            && of(&points, "meters.latency")
                .iter()
                .any(|p| p.count >= 300)
    })
}

/// The records of a JSON text sequence (`\x1e` JSON `\n`).
fn json_seq(body: &str) -> Vec<Value> {
    body.split('\u{1e}')
        .filter(|r| !r.trim().is_empty())
        .map(|r| serde_json::from_str(r.trim_end()).unwrap_or_else(|e| panic!("{e}: {r:?}")))
        .collect()
}

/// A live-metrics timestamp (`2026-12-04T09:01:02.1234567+00:00`) as Unix nanoseconds.
fn timestamp_nanos(text: &str) -> u64 {
    chrono::DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|e| panic!("{e}: {text}"))
        .timestamp_nanos_opt()
        .unwrap() as u64
}

/// The exported point of `metric` published closest to `at` (the same publication reaches each
/// session with its own timestamp, microseconds apart).
fn nearest<'a>(points: &[&'a Point], at: u64) -> Option<&'a Point> {
    points
        .iter()
        .copied()
        .filter(|p| p.time.abs_diff(at) < 200_000_000)
        .min_by_key(|p| p.time.abs_diff(at))
}

/// Checks live-metrics records of the target's meter against the exported points: every value
/// is the one exported for the same publication. Returns how many records were matched.
fn check_live_records(records: &[Value], exported: &[Point], what: &str) -> usize {
    let mut matched = 0;
    for r in records.iter().filter(|r| r["provider"] == METER) {
        let at = timestamp_nanos(r["timestamp"].as_str().unwrap());
        let name = r["name"].as_str().unwrap();
        let series = of(exported, name);
        let Some(point) = nearest(&series, at) else {
            continue;
        };
        let value = r["value"].as_f64().unwrap();
        match name {
            "meters.orders" => {
                // A rate: the growth since the previous publication.
                assert_eq!(r["counterType"], "Rate", "{what}: {r}");
                assert_eq!(r["tags"], "kind=online", "{what}: {r}");
                let before = series
                    .iter()
                    .filter(|p| p.time < point.time)
                    .map(|p| p.value)
                    .next_back();
                if let Some(before) = before {
                    assert_eq!(value, point.value - before, "{what}: {r} against {point:?}");
                }
            }
            "meters.queue" | "meters.temperature" => {
                assert_eq!(r["counterType"], "Metric", "{what}: {r}");
                assert_eq!(value, point.value, "{what}: {r} against {point:?}");
            }
            "meters.latency" => {
                let tags = r["tags"].as_str().unwrap();
                let percentile: f64 = tags
                    .strip_prefix("Percentile=")
                    .unwrap_or_else(|| panic!("{what}: {r}"))
                    .parse()
                    .unwrap();
                let exported = point
                    .quantiles
                    .iter()
                    .find(|(q, _)| (q * 100.0 - percentile).abs() < 1e-9)
                    .map(|(_, v)| *v);
                assert_eq!(exported, Some(value), "{what}: {r} against {point:?}");
                assert_eq!(r["displayName"], "meters.latency (ms)");
            }
            other => panic!("{what}: an instrument the target does not have: {other}"),
        }
        matched += 1;
    }
    matched
}

/// `POST path` with a JSON body and the agent's token.
fn post(agent: &Agent, path: &str, body: &Value) -> HttpResponse {
    let auth = format!("Bearer {}", agent.token());
    http_request_with_body(
        agent.port,
        "POST",
        path,
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        body.to_string().as_bytes(),
    )
}

#[test]
fn meters_reach_otlp_livemetrics_and_rules_with_the_values_recorded() {
    let dir = data_dir("metrics-export");
    let receiver = Receiver::start(&dir.join("received"), 0, 0);
    let mut target = Target::builder("Meters")
        .args(["--steps", "8", "--step-ms", "1500"])
        .start();
    let pid = target.pid();
    let endpoint = |port: u16| format!("http://127.0.0.1:{port}");
    let config = settings(
        &dir,
        json!({
            "grpc": {"Kind": "otlp-grpc", "Endpoint": endpoint(receiver.grpc_port),
                     "Interval": "1s", "Signals": ["Metrics"]},
            "http": {"Kind": "otlp-http", "Endpoint": endpoint(receiver.http_port),
                     "Interval": "1s", "Signals": ["Metrics"]},
        }),
        json!({"LiveMetricsAtStart": {
            "Trigger": {"Type": "Startup"},
            "Actions": [{"Type": "CollectLiveMetrics", "Settings": {
                "IncludeDefaultProviders": false,
                "Meters": [{"MeterName": METER, "InstrumentNames": ["meters.orders", "meters.queue"]}],
                "Duration": "00:00:16", "Egress": "artifacts"}}]}}),
    );
    let agent = Agent::start(
        &dir.join("data"),
        &[
            "--pid",
            &pid.to_string(),
            "--config",
            config.to_str().unwrap(),
            "--log",
            "clrscope=info,exporter=info",
        ],
    );
    // The export's session listens before the live sessions begin: the target records once
    // every instrument is listened to, a histogram aggregates only what is recorded while its
    // session listens, and at load ~100 the agent's session was seen enabled only after a live
    // session had let the target take every step. (Meters and EventCounters share the session.)
    let mut requests = receiver.collect_until(Duration::from_secs(120), |got| {
        ["grpc", "http"]
            .iter()
            .all(|t| !points(got, t, pid, "System.Runtime").0.is_empty())
    });
    // GET (the Metrics section: System.Runtime and the meter) and POST (the meter only) while
    // the target records (~11 s), all three live sessions outlasting its steps: a histogram
    // interval was seen lost when another session of the shared aggregation ended in it.
    let live = std::thread::scope(|scope| {
        let get = scope.spawn(|| agent.get(&format!("/livemetrics?pid={pid}&durationSeconds=20")));
        let posted = scope.spawn(|| {
            post(
                &agent,
                &format!("/livemetrics?pid={pid}&durationSeconds=20"),
                &json!({"includeDefaultProviders": false, "meters": [{"meterName": METER}]}),
            )
        });
        let mut recorded = Recorded::new();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let line = target
                .next_json(deadline.saturating_duration_since(Instant::now()))
                .expect("the target's steps");
            if line.get("step").is_some() {
                recorded.push(&line);
            }
            if line.get("done").is_some() {
                break;
            }
        }
        (get.join().unwrap(), posted.join().unwrap(), recorded)
    });
    let (got, posted, recorded) = live;
    let deadline = Instant::now() + Duration::from_secs(90);
    while !complete(&requests, pid, &recorded) && Instant::now() < deadline {
        requests.extend(receiver.next(Duration::from_secs(1)));
    }
    let last_values = |transport: &str| -> Vec<(String, f64, u64)> {
        let (points, _) = points(&requests, transport, pid, METER);
        [
            "meters.orders",
            "meters.queue",
            "meters.temperature",
            "meters.latency",
        ]
        .iter()
        .filter_map(|m| {
            of(&points, m)
                .last()
                .map(|p| (m.to_string(), p.value, p.count))
        })
        .collect()
    };
    if !complete(&requests, pid, &recorded) {
        let (exported, _) = points(&requests, "grpc", pid, METER);
        let latency: Vec<(u64, u64)> = of(&exported, "meters.latency")
            .iter()
            .map(|p| (p.time / 1_000_000, p.count))
            .collect();
        let live: Vec<(String, f64)> = json_seq(&got.body)
            .iter()
            .filter(|r| r["name"] == "meters.latency" && r["tags"] == "Percentile=50")
            .map(|r| {
                (
                    r["timestamp"].as_str().unwrap().to_string(),
                    r["value"].as_f64().unwrap(),
                )
            })
            .collect();
        panic!(
            "the final values did not arrive over both transports: recorded {recorded:?}, last \
             exported over gRPC {:?}, over HTTP {:?}; latency (ms, count) {latency:?}; \
             /livemetrics p50 {live:?}; agent log:\n{}",
            last_values("grpc"),
            last_values("http"),
            agent.log()
        );
    }

    for transport in ["grpc", "http"] {
        let (points, versions) = points(&requests, transport, pid, METER);
        assert_eq!(
            versions,
            BTreeSet::from(["1.2.3".to_string()]),
            "{transport}"
        );
        let orders = of(&points, "meters.orders");
        let queue = of(&points, "meters.queue");
        let temperature = of(&points, "meters.temperature");
        let latency = of(&points, "meters.latency");
        eprintln!(
            "{transport}: {} orders, {} queue, {} temperature, {} latency points",
            orders.len(),
            queue.len(),
            temperature.len(),
            latency.len()
        );
        // The counter: a monotonic cumulative sum, every value a total the target reached, the
        // start time fixed and before every point.
        let start = orders[0].start;
        for p in &orders {
            assert_eq!(
                (
                    p.kind.as_str(),
                    p.temporality.as_deref(),
                    p.monotonic,
                    p.unit.as_str()
                ),
                ("sum", Some("cumulative"), Some(true), "{order}"),
                "{transport}: {p:?}"
            );
            assert_eq!(p.attributes, json!({"kind": "online"}));
            assert!(
                recorded.orders.contains(&p.value),
                "{transport}: {p:?} not in {:?}",
                recorded.orders
            );
            assert!(p.start == start && p.start < p.time, "{transport}: {p:?}");
        }
        assert!(orders.windows(2).all(|w| w[0].value <= w[1].value));
        for p in &queue {
            assert_eq!(
                (p.kind.as_str(), p.temporality.as_deref(), p.monotonic),
                ("sum", Some("cumulative"), Some(false)),
                "{transport}: {p:?}"
            );
            assert!(
                recorded.queue.contains(&p.value),
                "{transport}: {p:?} not in {:?}",
                recorded.queue
            );
        }
        for p in &temperature {
            assert_eq!((p.kind.as_str(), p.unit.as_str()), ("gauge", "Cel"));
            assert!(
                recorded.temperature.contains(&p.value),
                "{transport}: {p:?}"
            );
        }
        // The histogram: a summary whose count and sum are those of whole steps (exact), and,
        // over an interval that saw one whole step (1..=100), the runtime's p50/p95/p99.
        let mut one_step_intervals = 0;
        for (i, p) in latency.iter().enumerate() {
            assert_eq!(p.kind, "summary", "{transport}: {p:?}");
            let steps = recorded
                .latency_count
                .iter()
                .position(|&c| c == p.count)
                .unwrap_or_else(|| panic!("{transport}: count {} is no step's", p.count));
            assert_eq!(
                p.value, recorded.latency_sum[steps],
                "{transport}: the sum of {p:?}"
            );
            let before = if i == 0 { 0 } else { latency[i - 1].count };
            if p.count - before == 100 {
                one_step_intervals += 1;
                for (quantile, expected) in [(0.5, 50.0), (0.95, 95.0), (0.99, 99.0)] {
                    let value = p
                        .quantiles
                        .iter()
                        .find(|(q, _)| (q - quantile).abs() < 1e-9)
                        .map(|(_, v)| *v)
                        .unwrap_or_else(|| panic!("{transport}: no p{quantile} in {p:?}"));
                    // One rank either way, plus the aggregator's relative error.
                    assert!(
                        (value - expected).abs() <= 1.0 + expected * 0.01,
                        "{transport}: p{quantile} {value}, expected {expected}"
                    );
                }
            }
        }
        assert!(
            one_step_intervals >= 3,
            "{transport}: {one_step_intervals} one-step intervals"
        );
        // EventCounters: System.Runtime's CPU usage a gauge, its GC count a cumulative sum.
        let (runtime, _) = self::points(&requests, transport, pid, "System.Runtime");
        let cpu = of(&runtime, "cpu-usage");
        assert!(
            !cpu.is_empty() && cpu.iter().all(|p| p.kind == "gauge"),
            "{transport}"
        );
        let gcs = of(&runtime, "gen-0-gc-count");
        assert!(
            !gcs.is_empty()
                && gcs
                    .iter()
                    .all(|p| p.monotonic == Some(true)
                        && p.temporality.as_deref() == Some("cumulative")),
            "{transport}: {gcs:?}"
        );
    }
    let resource = requests
        .iter()
        .filter(|r| r["kind"] == "otlp-metrics")
        .flat_map(|r| r["resources"].as_array().unwrap())
        .find(|r| r["attributes"]["process.pid"] == json!(pid))
        .unwrap();
    let attached = agent.attached(pid).unwrap();
    assert_eq!(
        resource["attributes"]["service.name"],
        attached["service_name"]
    );
    assert!(resource["attributes"]["host.name"].as_str().is_some());

    // /livemetrics: dotnet-monitor's JSON sequence, the exported values publication for
    // publication.
    let (exported, _) = points(&requests, "grpc", pid, METER);
    for (response, what) in [(&got, "GET"), (&posted, "POST")] {
        assert_eq!(response.status, 200, "{what}: {}", response.body);
        assert_eq!(
            response.header("content-type"),
            Some("application/json-seq")
        );
        assert!(response
            .header("content-disposition")
            .is_some_and(|d| d.ends_with(".metrics.json")));
        let records = json_seq(&response.body);
        let matched = check_live_records(&records, &exported, what);
        eprintln!(
            "{what} /livemetrics: {} records, {matched} matched to exported points",
            records.len()
        );
        assert!(matched >= 20, "{what}: {matched} records matched");
        let providers: BTreeSet<&str> = records
            .iter()
            .map(|r| r["provider"].as_str().unwrap())
            .collect();
        if what == "GET" {
            assert!(providers.contains("System.Runtime"), "{providers:?}");
        } else {
            assert_eq!(providers, BTreeSet::from([METER]));
        }
        // dotnet-monitor's fields, in its order.
        for line in response.body.lines() {
            assert!(
                line.starts_with("\u{1e}{\"timestamp\":\"")
                    && line.ends_with(",\"meterTags\":null,\"instrumentTags\":null}"),
                "{line}"
            );
        }
    }

    // CollectLiveMetrics: an artifact of the two instruments asked for.
    let artifacts = dir.join("artifacts");
    let deadline = Instant::now() + Duration::from_secs(60);
    let file = loop {
        let found = std::fs::read_dir(&artifacts).ok().and_then(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .find(|p| p.to_string_lossy().ends_with(".metrics.json"))
        });
        if let Some(path) = found.filter(|_| agent.log().contains("artifact written")) {
            break path;
        }
        assert!(
            Instant::now() < deadline,
            "no live metrics artifact\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let records = json_seq(&std::fs::read_to_string(&file).unwrap());
    let names: BTreeSet<&str> = records
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(["meters.orders", "meters.queue"]),
        "{file:?}"
    );
    let matched = check_live_records(&records, &exported, "CollectLiveMetrics");
    assert!(
        matched >= 6,
        "CollectLiveMetrics: {matched} records matched"
    );
}

/// The receiver is down for a minute: the metrics queue stays within its byte budget (each
/// interval's points join the waiting request, so it is bytes, not requests, that run out), the
/// agent's memory flat, the points given up are counted under their signal, and what is queued
/// arrives once the receiver is back.
#[test]
fn a_metrics_receiver_outage_is_bounded_and_counted() {
    let dir = data_dir("metrics-outage");
    let out = dir.join("received");
    let mut receiver = Receiver::start_restartable(&out);
    let http_port = receiver.http_port;
    let target = Target::builder("Meters")
        .args(["--steps", "1000", "--step-ms", "1000"])
        .start();
    let pid = target.pid();
    let config = settings(
        &dir,
        json!({"outage": {"Kind": "otlp-http", "Endpoint": format!("http://127.0.0.1:{http_port}"),
                          "Interval": "1s", "MaxQueueBytes": "64KiB", "MaxRetryDelay": "2s",
                          "Timeout": "1s", "Signals": ["Metrics"]}}),
        json!({}),
    );
    let agent = Agent::start(
        &dir.join("data"),
        &[
            "--pid",
            &pid.to_string(),
            "--config",
            config.to_str().unwrap(),
        ],
    );
    receiver.collect_until(Duration::from_secs(60), |got| {
        got.iter().filter(|r| r["kind"] == "otlp-metrics").count() >= 3
    });
    receiver.kill();
    let before = agent.rss_kib();
    let down_at = Instant::now();
    let mut rss = Vec::new();
    let mut queued = Vec::new();
    while down_at.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_secs(3));
        rss.push(agent.rss_kib());
        queued.push(agent.metric("clrscope_export_queue_bytes", &["exporter=\"outage\""]));
    }
    let dropped = agent.metric(
        "clrscope_export_dropped_metric_points_total",
        &["reason=\"queue_full\""],
    );
    let dropped_requests = agent.metric(
        "clrscope_export_dropped_requests_total",
        &["reason=\"queue_full\""],
    );
    let (peak, late) = peak_and_late_growth(&rss);
    eprintln!(
        "metrics outage: RSS {before} KiB before, peak {peak} KiB, {late} KiB growth over the \
         second half ({rss:?}); queue bytes {queued:?}; dropped {dropped_requests} requests, {dropped} \
         metric points"
    );
    assert!(queued.iter().all(|&q| q <= 65_536.0), "{queued:?}");
    // ~60 one-second intervals of points, more than 64 KiB: the oldest went.
    assert!(
        dropped_requests >= 1.0 && dropped >= dropped_requests,
        "{}",
        agent.log()
    );
    assert!(
        peak <= before + 32 * 1024,
        "RSS {before} → {peak} KiB: {rss:?}"
    );
    assert!(late <= 4 * 1024, "RSS still growing: {rss:?}");

    let receiver = Receiver::start(&out, 0, http_port);
    // Only the queue holds points from before the receiver was back.
    let back_at = unix_nanos();
    let back = receiver.collect_until(Duration::from_secs(60), |got| {
        got.iter().filter(|r| r["kind"] == "otlp-metrics").count() >= 5
    });
    let oldest = back
        .iter()
        .flat_map(|r| points(std::slice::from_ref(r), "http", pid, METER).0)
        .map(|p| p.time)
        .min()
        .expect("points after the outage");
    assert!(oldest < back_at, "the queued points were lost");
}

/// Cumulative points start when the runtime began aggregating, not when the agent attached: the
/// counter session waits out a 20 s startup grace, and the `Meters` target counts from the moment
/// its instruments are first listened to (it says when: its ground truth). Every cumulative point
/// of the process (the meter's sums and summary, System.Runtime's sums) must start within 5 s of
/// that; before the fix they started at the attach, ~20 s early (a first rate 5x too low here).
#[test]
fn cumulative_points_start_when_the_runtime_began_counting() {
    let dir = data_dir("metrics-start");
    let receiver = Receiver::start(&dir.join("received"), 0, 0);
    let mut target = Target::builder("Meters")
        .args(["--steps", "6", "--step-ms", "1000"])
        .start();
    let pid = target.pid();
    let config = settings(
        &dir,
        json!({"http": {"Kind": "otlp-http",
                        "Endpoint": format!("http://127.0.0.1:{}", receiver.http_port),
                        "Interval": "1s", "Signals": ["Metrics"]}}),
        json!({}),
    );
    let agent = Agent::start(
        &dir.join("data"),
        &[
            "--pid",
            &pid.to_string(),
            "--config",
            config.to_str().unwrap(),
            "--startup-grace",
            "20s",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(180);
    let counting_from = loop {
        let line = target
            .next_json(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|| panic!("the target was never listened to:\n{}", agent.log()));
        if line["listened"] == true {
            break line["unix_ms"].as_u64().unwrap() * 1_000_000;
        }
    };
    let requests = receiver.collect_until(Duration::from_secs(120), |got| {
        let (meter, _) = points(got, "http", pid, METER);
        of(&meter, "meters.orders").len() >= 3
    });
    let mut cumulative = Vec::new();
    for scope in [METER, "System.Runtime"] {
        let (all, _) = points(&requests, "http", pid, scope);
        cumulative.extend(all.into_iter().filter(|p| p.kind != "gauge"));
    }
    assert!(
        cumulative.iter().any(|p| p.metric == "meters.orders")
            && cumulative.iter().any(|p| p.metric == "meters.latency"),
        "{cumulative:?}\n{}",
        agent.log()
    );
    let off: Vec<(String, i64)> = cumulative
        .iter()
        .map(|p| {
            (
                p.metric.clone(),
                (p.start as i64 - counting_from as i64) / 1_000_000,
            )
        })
        .filter(|(_, ms)| ms.abs() > 5_000)
        .collect();
    let starts: BTreeSet<i64> = cumulative
        .iter()
        .map(|p| (p.start as i64 - counting_from as i64) / 1_000_000)
        .collect();
    eprintln!(
        "{} cumulative points; starts (ms after the target's first count): {starts:?}",
        cumulative.len()
    );
    assert!(
        off.is_empty(),
        "points starting more than 5 s from the runtime's first count (ms): {off:?}"
    );
}
