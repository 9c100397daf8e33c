//! Pyroscope's querier API over Connect's JSON codec, against the real server over a real
//! store: what each method answers, the flame graph's cut, and Connect errors. (The binary
//! codec and a real Connect client: `tests/querier.rs` at the workspace root.)

use std::net::Ipv4Addr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use profile::{Batch, BatchSample, ProfileType};
use profile::{Function, LabelValue};
use serde_json::{json, Value};
use store::tsdb::{Store, StoreOptions};
use tokio::net::TcpListener;
use ui::ApiState;

/// 2025-11-30T01:08:00Z in Unix ms.
const T0_MS: i64 = 1_764_464_880_000;
const MS: i64 = 1_000_000;
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const SPAN: &str = "00f067aa0ba902b7";

/// A shop's cpu and wall time: `Main → Handle → Tax` (70 ms), `Main → Handle → Json` (20 ms)
/// and `Main → Save` (10 ms, in span [`SPAN`]) every 10 s for a minute.
async fn start() -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        retention_age: Duration::from_secs(100 * 365 * 24 * 3600),
        ..StoreOptions::default()
    };
    let mut store = Store::open(dir.path().join("data"), options).unwrap();
    let functions: Vec<Function> = [
        "Shop.Main()",
        "Shop.Handle()",
        "Shop.Tax()",
        "Shop.Json()",
        "Shop.Save()",
    ]
    .iter()
    .map(|name| Function {
        name: name.to_string(),
        module: "Shop.dll".to_string(),
    })
    .collect();
    let sample = |stack: Vec<u32>, ms: i64, span: bool| BatchSample {
        stack,
        value: ms * MS,
        labels: if span {
            vec![("span_id".to_string(), LabelValue::Str(SPAN.to_string()))]
        } else {
            Vec::new()
        },
    };
    for i in 0..6 {
        for profile_type in ["cpu", "wall"] {
            store
                .append(&Batch {
                    series: vec![
                        ("service_name".into(), "shop".into()),
                        ("process_id".into(), "42".into()),
                    ],
                    profile_type: ProfileType::known(profile_type).unwrap(),
                    timestamp_unix_nanos: (T0_MS + i * 10_000) * MS,
                    functions: functions.clone(),
                    samples: vec![
                        sample(vec![2, 1, 0], 70, false),
                        sample(vec![3, 1, 0], 20, false),
                        sample(vec![4, 0], 10, true),
                    ],
                })
                .unwrap();
        }
    }
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    // Without authentication: the router's auth is ui/tests/api.rs's and tests/auth.rs's subject.
    let state = ApiState::new(Arc::new(RwLock::new(store))).with_auth(ui::Authentication::Disabled);
    let router = ui::router(state);
    tokio::spawn(ui::serve(
        listener,
        router,
        ui::ServeOptions::default(),
        std::future::pending(),
    ));
    (url, dir)
}

/// An HTTP client. reqwest is built with rustls and no default crypto provider (the exporters
/// choose theirs), so the process needs one installed before a client is made.
fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// POSTs `body` to a querier method; the status, content type and body.
async fn call(url: &str, method: &str, content_type: &str, body: &str) -> (u16, String, Value) {
    let response = http_client()
        .post(format!("{url}/querier.v1.QuerierService/{method}"))
        .header("Content-Type", content_type)
        .header("Connect-Protocol-Version", "1")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_string();
    let body = response.bytes().await.unwrap();
    let json = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("{method}: {e}: {}", String::from_utf8_lossy(&body)));
    (status, content_type, json)
}

async fn ok(url: &str, method: &str, request: Value) -> Value {
    let (status, content_type, body) =
        call(url, method, "application/json", &request.to_string()).await;
    assert_eq!(
        (status, content_type.as_str()),
        (200, "application/json"),
        "{method}: {body}"
    );
    body
}

/// A range covering the minute, as strings the way Connect's JSON writes 64-bit integers.
fn range() -> Value {
    json!({"start": T0_MS.to_string(), "end": (T0_MS + 60_000).to_string()})
}

fn with(mut base: Value, extra: Value) -> Value {
    base.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    base
}

#[tokio::test]
async fn types_labels_and_series() {
    let (url, _dir) = start().await;
    let types = ok(&url, "ProfileTypes", json!({})).await;
    assert_eq!(
        types["profileTypes"],
        json!([
            {"ID": CPU, "name": "process_cpu", "sampleType": "cpu", "sampleUnit": "nanoseconds",
             "periodType": "cpu", "periodUnit": "nanoseconds"},
            {"ID": "wall:wall:nanoseconds:wall:nanoseconds", "name": "wall", "sampleType": "wall",
             "sampleUnit": "nanoseconds", "periodType": "wall", "periodUnit": "nanoseconds"},
        ])
    );
    let names = ok(&url, "LabelNames", json!({"matchers": ["{}"]})).await;
    assert_eq!(
        names["names"],
        json!([
            "__name__",
            "__period_type__",
            "__period_unit__",
            "__profile_type__",
            "__type__",
            "__unit__",
            "process_id",
            "service_name"
        ])
    );
    let values = ok(
        &url,
        "LabelValues",
        json!({"name": "__name__", "matchers": ["{service_name=\"shop\"}"]}),
    )
    .await;
    assert_eq!(values["names"], json!(["process_cpu", "wall"]));
    let none = ok(
        &url,
        "LabelValues",
        json!({"name": "service_name", "matchers": ["{service_name=\"other\"}"]}),
    )
    .await;
    assert_eq!(none["names"], json!([]));
    let series = ok(
        &url,
        "Series",
        json!({"matchers": ["{__name__=\"wall\"}"], "labelNames": ["service_name", "__name__"]}),
    )
    .await;
    assert_eq!(
        series["labelsSet"],
        json!([{"labels": [{"name": "__name__", "value": "wall"}, {"name": "service_name", "value": "shop"}]}])
    );
}

#[tokio::test]
async fn timelines_group_and_step() {
    let (url, _dir) = start().await;
    let request = with(
        range(),
        json!({"profileTypeID": CPU, "labelSelector": "{}", "step": 20, "groupBy": ["service_name"]}),
    );
    let answer = ok(&url, "SelectSeries", request).await;
    let point = |t: i64| json!({"value": 200.0 * MS as f64, "timestamp": t.to_string()});
    assert_eq!(
        answer["series"],
        json!([{
            "labels": [{"name": "service_name", "value": "shop"}],
            "points": [point(T0_MS), point(T0_MS + 20_000), point(T0_MS + 40_000)],
        }])
    );
    // A selector naming another profile type selects nothing.
    let request = with(
        range(),
        json!({"profileTypeID": CPU, "labelSelector": "{__name__=\"wall\"}", "step": 20}),
    );
    assert_eq!(ok(&url, "SelectSeries", request).await["series"], json!([]));
}

#[tokio::test]
async fn flame_graphs_cut_and_filter_by_span() {
    let (url, _dir) = start().await;
    let request = with(
        range(),
        json!({"profileTypeID": CPU, "labelSelector": "{service_name=\"shop\"}"}),
    );
    let whole = ok(&url, "SelectMergeStacktraces", request.clone()).await;
    let graph = &whole["flamegraph"];
    let ms = |n: i64| (n * 6 * MS).to_string();
    assert_eq!(graph["total"], ms(100));
    assert_eq!(graph["maxSelf"], ms(70));
    assert_eq!(
        graph["names"],
        json!([
            "total",
            "Shop.Main()",
            "Shop.Handle()",
            "Shop.Tax()",
            "Shop.Json()",
            "Shop.Save()"
        ])
    );
    // [offset from the previous node's end, total, self, name], largest child first.
    let level = |nodes: &[[i64; 4]]| {
        let values: Vec<String> = nodes
            .iter()
            .flat_map(|n| [n[0] * 6 * MS, n[1] * 6 * MS, n[2] * 6 * MS, n[3]])
            .map(|v| v.to_string())
            .collect();
        json!({ "values": values })
    };
    assert_eq!(
        graph["levels"],
        json!([
            level(&[[0, 100, 0, 0]]),
            level(&[[0, 100, 0, 1]]),
            level(&[[0, 90, 0, 2], [0, 10, 10, 5]]),
            level(&[[0, 70, 70, 3], [0, 20, 20, 4]]),
        ])
    );
    // Two nodes: Main and Handle; Handle's children and Save summed into "other".
    let cut = ok(
        &url,
        "SelectMergeStacktraces",
        with(request.clone(), json!({"maxNodes": "2"})),
    )
    .await;
    assert_eq!(
        cut["flamegraph"]["names"],
        json!(["total", "Shop.Main()", "Shop.Handle()", "other"])
    );
    assert_eq!(
        cut["flamegraph"]["levels"],
        json!([
            level(&[[0, 100, 0, 0]]),
            level(&[[0, 100, 0, 1]]),
            level(&[[0, 90, 0, 2], [0, 10, 10, 3]]),
            level(&[[0, 90, 90, 3]]),
        ])
    );
    // One span's samples, by either method.
    for (method, extra) in [
        (
            "SelectMergeSpanProfile",
            json!({"spanSelector": [SPAN.to_uppercase()]}),
        ),
        ("SelectMergeStacktraces", json!({"spanSelector": [SPAN]})),
    ] {
        let span = ok(&url, method, with(request.clone(), extra)).await;
        assert_eq!(span["flamegraph"]["total"], ms(10), "{method}");
        assert_eq!(
            span["flamegraph"]["names"],
            json!(["total", "Shop.Main()", "Shop.Save()"])
        );
    }
    // pprof: the same samples, numbers as strings.
    let pprof = ok(&url, "SelectMergeProfile", request).await;
    let total: i64 = pprof["sample"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["value"][0].as_str().unwrap().parse::<i64>().unwrap())
        .sum();
    assert_eq!(total, 600 * MS);
    assert!(pprof["stringTable"]
        .as_array()
        .unwrap()
        .contains(&json!("Shop.Tax()")));
}

#[tokio::test]
async fn failures_are_connect_errors() {
    let (url, _dir) = start().await;
    let request = with(range(), json!({"profileTypeID": CPU}));
    let cases = [
        (
            "SelectMergeStacktraces",
            "application/json",
            "{\"start\": \"x\"}",
            400,
            "invalid_argument",
            "not valid JSON",
        ),
        (
            "SelectMergeStacktraces",
            "application/proto",
            "\u{1}",
            400,
            "invalid_argument",
            "not a valid message",
        ),
        (
            "SelectMergeStacktraces",
            "text/plain",
            "{}",
            415,
            "unimplemented",
            "application/proto",
        ),
        (
            "SelectMergeStacktraces",
            "application/json",
            "{\"profileTypeID\": \"cpu\"}",
            400,
            "invalid_argument",
            "e.g. process_cpu",
        ),
    ];
    for (method, content_type, body, status, code, message) in cases {
        let (got, _, error) = call(&url, method, content_type, body).await;
        assert_eq!(
            (got, error["code"].as_str().unwrap()),
            (status, code),
            "{method} {body}: {error}"
        );
        assert!(
            error["message"].as_str().unwrap().contains(message),
            "{error}"
        );
    }
    let json_cases = [
        (json!({"start": "2", "end": "1"}), "empty time range"),
        (
            json!({"format": "PROFILE_FORMAT_TREE"}),
            "PROFILE_FORMAT_TREE is not supported",
        ),
        (json!({"maxNodes": "-1"}), "max_nodes -1 is out of range"),
        (json!({"spanSelector": ["xyz"]}), "16 hex digits"),
        (json!({"labelSelector": "{a!=\"b\"}"}), "only equality"),
        (json!({"labelSelector": "{a=~\"b.*\"}"}), "only equality"),
    ];
    for (extra, message) in json_cases {
        let body = with(request.clone(), extra).to_string();
        let (status, _, error) =
            call(&url, "SelectMergeStacktraces", "application/json", &body).await;
        assert!(status >= 400, "{body}");
        assert!(
            error["message"].as_str().unwrap().contains(message),
            "{body}: {error}"
        );
    }
}
