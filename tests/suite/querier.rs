//! Grafana's view of the agent: `tests/querier/client.cjs`, a Connect client generated from
//! Pyroscope's querier/types protos with npm's buf and @bufbuild/protoc-gen-es and run with
//! @connectrpc/connect-node (all installed by `make setup`), calls every querier method the
//! Pyroscope data source uses against `clrscope agent` profiling AsyncWeb under load with trace
//! linkage, in binary protobuf and in JSON. Its answers must equal each other and what the
//! agent's own query API (`/api/v1/...`) says of the same range: the flame graph's total and
//! hottest function, the timeline's sum, the pprof's values, one span's samples.

use crate::support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use support::agent::{data_dir, encode, Agent};
use support::{testbed_dir, Target};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Runs the client (see its header) and returns its report.
fn run_client(config: &Value) -> Value {
    let modules = testbed_dir().join("node").join("node_modules");
    for package in [
        "@connectrpc/connect-node",
        "@bufbuild/protoc-gen-es",
        "@bufbuild/buf",
    ] {
        assert!(
            modules.join(package).exists(),
            "npm {package} is missing under {}: run `make setup`",
            modules.display()
        );
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/querier/client.cjs");
    let output = Command::new("node")
        .arg(script)
        .arg(config.to_string())
        .env("NODE_PATH", &modules)
        .stdin(Stdio::null())
        .output()
        .expect("node (installed by `make setup`)");
    assert!(
        output.status.success(),
        "the Connect client failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the client prints one JSON report")
}

/// Self value per function name, and the total, of a Pyroscope flame graph (proto3 JSON).
fn flame_graph_selfs(graph: &Value) -> (HashMap<String, i64>, i64) {
    let names: Vec<&str> = graph["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    let int = |v: &Value| v.as_str().unwrap().parse::<i64>().unwrap();
    let mut selfs = HashMap::new();
    // Level 0 is the root, `total`.
    for level in &graph["levels"].as_array().unwrap()[1..] {
        let values: Vec<i64> = level["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(int)
            .collect();
        assert_eq!(values.len() % 4, 0, "a level holds 4 numbers per node");
        for node in values.chunks(4) {
            *selfs
                .entry(names[node[3] as usize].to_string())
                .or_default() += node[2];
        }
    }
    (selfs, int(&graph["total"]))
}

/// Self value per function name, and the total, of the agent's own JSON tree.
fn tree_selfs(tree: &Value) -> (HashMap<String, i64>, i64) {
    let mut selfs = HashMap::new();
    let mut pending = vec![&tree["root"]];
    while let Some(node) = pending.pop() {
        if node["name"] != "total" || node.get("module").is_some() {
            *selfs
                .entry(node["name"].as_str().unwrap().to_string())
                .or_default() += node["self"].as_i64().unwrap();
        }
        pending.extend(node["children"].as_array().unwrap());
    }
    (selfs, tree["total"].as_i64().unwrap())
}

fn hottest(selfs: &HashMap<String, i64>) -> (&str, i64) {
    selfs
        .iter()
        .max_by_key(|(_, &v)| v)
        .map(|(k, &v)| (k.as_str(), v))
        .expect("a function with samples")
}

/// The agent's JSON tree of `query` over `[from, until)` ms, plus `extra` parameters.
fn store_tree(agent: &Agent, query: &str, from: i64, until: i64, extra: &str) -> Value {
    agent
        .get(&format!(
            "/api/v1/profile?type=cpu&query={}&from={from}&until={until}{extra}",
            encode(query)
        ))
        .json()
}

fn generated_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("querier-gen");
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn a_grafana_connect_client_reads_what_the_store_holds() {
    let mut web = Target::builder("AsyncWeb")
        .args(["--self-load", "40"])
        .start();
    let dir = data_dir("querier");
    let pid = web.pid();
    let pid_arg = format!("--pid={pid}");
    let start = unix_ms();
    let agent = Agent::start(
        &dir,
        &[pid_arg.as_str(), "--trace-linkage", "--sample-period", "2s"],
    );
    agent.wait_for_data("cpu", pid, 400_000_000, Duration::from_secs(60));
    let logged_spans: Vec<String> = web
        .drain_lines()
        .iter()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|request| request["span_id"].as_str().map(str::to_string))
        .collect();
    // No more samples after this: every answer below is about the same data.
    web.kill();
    let selector = format!("{{process_id=\"{pid}\"}}");
    let until = {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = -1;
        loop {
            std::thread::sleep(Duration::from_secs(2));
            let total = store_tree(&agent, &selector, start, unix_ms(), "")["total"]
                .as_i64()
                .unwrap();
            if total == last || Instant::now() > deadline {
                break unix_ms();
            }
            last = total;
        }
    };
    let store = store_tree(&agent, &selector, start, until, "");
    let (store_selfs, store_total) = tree_selfs(&store);
    let (store_top, _) = hottest(&store_selfs);
    eprintln!("store: total {store_total} ns, hottest {store_top}");

    // Spans with samples, and what the store holds for them.
    let mut spans = Vec::new();
    let mut span_total = 0;
    for span in logged_spans.iter().rev() {
        let total = store_tree(&agent, &selector, start, until, &format!("&span_id={span}"))
            ["total"]
            .as_i64()
            .unwrap();
        if total > 0 {
            spans.push(span.clone());
            span_total += total;
        }
        if spans.len() == 3 {
            break;
        }
    }
    assert!(!spans.is_empty(), "no logged span has samples");

    let report = run_client(&json!({
        "url": format!("http://127.0.0.1:{}", agent.port),
        "token": agent.token(),
        "genDir": generated_dir(),
        "profileTypeID": CPU,
        "labelSelector": selector,
        "start": start,
        "end": until,
        "spans": spans,
    }));
    assert_eq!(
        report["binary"], report["json"],
        "binary protobuf and JSON answers differ"
    );
    let answers = &report["binary"];
    let answer = |name: &str| {
        let a = &answers[name];
        assert!(a.get("error").is_none(), "{name}: {a}");
        a
    };

    // Profile types, also as the data source's health check asks.
    for name in ["health", "profileTypes"] {
        let types = answer(name)["profileTypes"].as_array().unwrap();
        assert!(
            types.contains(&json!({
                "ID": CPU, "name": "process_cpu", "sampleType": "cpu",
                "sampleUnit": "nanoseconds", "periodType": "cpu", "periodUnit": "nanoseconds",
            })),
            "{name}: {types:?}"
        );
    }
    // Labels and series.
    let names = &answer("labelNames")["names"];
    for name in [
        "service_name",
        "process_id",
        "host_name",
        "__name__",
        "__profile_type__",
    ] {
        assert!(names.as_array().unwrap().contains(&json!(name)), "{names}");
    }
    assert_eq!(answer("labelNamesSelected")["names"], *names);
    assert_eq!(
        answer("serviceNames")["names"],
        agent.get("/api/v1/labels/service_name/values").json()
    );
    assert_eq!(answer("processIds")["names"], json!([pid.to_string()]));
    let label_sets = answer("series")["labelsSet"].as_array().unwrap();
    assert!(!label_sets.is_empty());
    for set in label_sets {
        let labels = set["labels"].as_array().unwrap();
        assert!(labels.contains(&json!({"name": "process_id", "value": pid.to_string()})));
        assert!(labels.iter().any(|l| l["name"] == "__profile_type__"));
    }

    // Timelines: grouped by process, and in total; their points add up to the flame graph's.
    for (name, labels, step_ms) in [
        (
            "selectSeries",
            json!([{"name": "process_id", "value": pid.to_string()}]),
            1000,
        ),
        ("selectSeriesTotal", json!([]), 5000),
    ] {
        let series = answer(name)["series"].as_array().unwrap();
        assert_eq!(series.len(), 1, "{name}: {series:?}");
        // proto3 JSON leaves an empty list out.
        let got = series[0].get("labels").cloned().unwrap_or(json!([]));
        assert_eq!(got, labels, "{name}");
        let points = series[0]["points"].as_array().unwrap();
        let times: Vec<i64> = points
            .iter()
            .map(|p| p["timestamp"].as_str().unwrap().parse().unwrap())
            .collect();
        assert_eq!(times[0], start, "{name}");
        assert!(times.windows(2).all(|w| w[1] - w[0] == step_ms), "{name}");
        let sum: f64 = points
            .iter()
            .map(|p| p["value"].as_f64().unwrap_or(0.0))
            .sum();
        assert_eq!(sum as i64, store_total, "{name}");
    }

    // The flame graph: the store's total and hottest function.
    let graph = &answer("flameGraph")["flamegraph"];
    assert_eq!(graph["names"][0], "total");
    let (selfs, total) = flame_graph_selfs(graph);
    assert_eq!(total, store_total);
    assert_eq!(
        selfs, store_selfs,
        "every function's self value as the store has it"
    );
    let (top, top_self) = hottest(&selfs);
    assert_eq!(top, store_top);
    // The largest self value of one node: at most the hottest function's (which may sum several).
    let max_self: i64 = graph["maxSelf"].as_str().unwrap().parse().unwrap();
    assert!(0 < max_self && max_self <= top_self, "maxSelf {max_self}");
    eprintln!(
        "flame graph: {} names, hottest {top} ({top_self} ns)",
        selfs.len()
    );

    // Cut to 8 nodes: the rest summed into "other", the total kept.
    let cut = &answer("flameGraphCut")["flamegraph"];
    let (cut_selfs, cut_total) = flame_graph_selfs(cut);
    assert_eq!(cut_total, store_total);
    assert!(cut_selfs.contains_key("other"), "{cut}");
    let nodes: usize = cut["levels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["values"].as_array().unwrap().len() / 4)
        .sum();
    assert!(nodes < selfs.len(), "{nodes} nodes after the cut");

    // Spans: both span methods give the store's samples of those spans.
    for name in ["spanFlameGraph", "spanStacktraces"] {
        let (_, total) = flame_graph_selfs(&answer(name)["flamegraph"]);
        assert_eq!(total, span_total, "{name}");
    }

    // pprof (google.v1.Profile): every sample of the range, the hottest function named.
    let pprof = answer("pprof");
    let strings: Vec<&str> = pprof["stringTable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let sample_type = &pprof["sampleType"][0];
    let string = |v: &Value| strings[v.as_str().unwrap().parse::<usize>().unwrap()];
    assert_eq!(
        (string(&sample_type["type"]), string(&sample_type["unit"])),
        ("cpu", "nanoseconds")
    );
    let pprof_total: i64 = pprof["sample"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["value"][0].as_str().unwrap().parse::<i64>().unwrap())
        .sum();
    assert_eq!(pprof_total, store_total);
    assert!(strings.contains(&store_top));

    // Failures come back as Connect errors that say what to change.
    let error = &answers["unknownType"]["error"];
    assert_eq!(error["code"], "InvalidArgument", "{error}");
    assert!(error["message"]
        .as_str()
        .unwrap()
        .contains("unknown profile type"));
    let error = &answers["badSelector"]["error"];
    assert_eq!(error["code"], "InvalidArgument", "{error}");
    assert!(error["message"].as_str().unwrap().contains("only equality"));
}
