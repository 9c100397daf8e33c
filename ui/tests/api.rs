//! The query API end to end: the real server on a loopback port over a real store in a temporary
//! directory (blocks on disk and the in-memory head), asked over HTTP.

use std::collections::HashMap;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use collector::attached::{AttachedProcess, AttachedProcesses};
use collector::sampler::{DutyCycle, SamplerControl};
use exporter::pprof::proto;
use profile::{Batch, BatchSample, ProfileType};
use profile::{Function, LabelValue};
use prost::Message;
use serde_json::Value;
use store::tsdb::{Query, QueryControl, SampleLabels, Store, StoreOptions};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use ui::{ApiState, DEFAULT_API_ADDR, PROBLEM_JSON};

/// 2025-11-30T01:08:00Z: the incident minute, in Unix nanoseconds.
const T0: i64 = 1_764_464_880_000_000_000;
const T0_MS: i64 = T0 / 1_000_000;
const SECOND: i64 = 1_000_000_000;
/// Sampling period: 1 ms in nanoseconds.
const PERIOD: i64 = 1_000_000;

const MAIN: &str = "Microsoft.AspNetCore.Server.Kestrel.Core.Internal.Http.HttpProtocol.ProcessRequests<TContext>(Microsoft.AspNetCore.Hosting.Server.IHttpApplication<TContext>)";
const HANDLER: &str = "Shop.Checkout.CheckoutController.PlaceOrder(Shop.Checkout.OrderRequest)";
const TAX: &str = "Shop.Checkout.PriceCalculator.ComputeTax(Shop.Checkout.Order)";
const SERIALIZE: &str = "System.Text.Json.JsonSerializer.Serialize<Shop.Checkout.Order>(Shop.Checkout.Order, System.Text.Json.JsonSerializerOptions)";
const SAVE: &str = "Shop.Checkout.OrderRepository.SaveAsync(Shop.Checkout.Order)";
const STOCK: &str = "Shop.Inventory.StockService.Reserve(System.Guid, int)";

const SPAN: &str = "00f067aa0ba902b7";
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

fn function(name: &str) -> Function {
    let module = if name.starts_with("Shop.Inventory") {
        "Shop.Inventory.dll"
    } else if name.starts_with("Shop.") {
        "Shop.Checkout.dll"
    } else if name.starts_with("System.Text.Json") {
        "System.Text.Json.dll"
    } else {
        "Microsoft.AspNetCore.Server.Kestrel.Core.dll"
    };
    Function {
        name: name.to_string(),
        module: module.to_string(),
    }
}

/// One 10 s batch of a service: `(leaf, samples)` under `MAIN → HANDLER`; `SAVE` samples carry
/// the request's span.
fn batch(service: &str, profile_type: &str, time: i64, leaves: &[(&str, i64)]) -> Batch {
    let mut functions = vec![function(MAIN), function(HANDLER)];
    let samples = leaves
        .iter()
        .enumerate()
        .map(|(i, &(leaf, count))| {
            functions.push(function(leaf));
            let mut labels = vec![("thread_id".to_string(), LabelValue::Num(4100 + i as i64))];
            if leaf == SAVE {
                labels.push(("span_id".into(), LabelValue::Str(SPAN.into())));
                labels.push(("trace_id".into(), LabelValue::Str(TRACE.into())));
            }
            BatchSample {
                stack: vec![functions.len() as u32 - 1, 1, 0],
                value: count * PERIOD,
                labels,
            }
        })
        .collect();
    Batch {
        series: vec![
            ("service_name".into(), service.into()),
            ("process_id".into(), "4242".into()),
            ("host_name".into(), "node-1".into()),
        ],
        profile_type: ProfileType::known(profile_type).expect("a known type"),
        timestamp_unix_nanos: time,
        functions,
        samples,
    }
}

/// Checkout cpu in the incident minute: tax computation hot.
const MINUTE_1: [(&str, i64); 3] = [(TAX, 70), (SERIALIZE, 20), (SAVE, 10)];
/// The minute after: serialization hot, tax cheap.
const MINUTE_2: [(&str, i64); 3] = [(TAX, 10), (SERIALIZE, 90), (SAVE, 10)];

/// An HTTP client. reqwest is built with rustls and no default crypto provider (the exporters
/// choose theirs), so the process needs one installed before a client is made.
fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

struct Server {
    url: String,
    client: reqwest::Client,
    store: Arc<RwLock<Store>>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
    _dir: tempfile::TempDir,
}

/// A store with two minutes of checkout cpu (the first flushed to a block, the second in the
/// head), checkout wall time, inventory cpu, and a batch 5 s ago; served on 127.0.0.1:0.
async fn start() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        retention_age: Duration::from_secs(100 * 365 * 24 * 3600),
        ..StoreOptions::default()
    };
    let mut store = Store::open(dir.path().join("data"), options).unwrap();
    for i in 0..6 {
        let t = T0 + i * 10 * SECOND;
        store
            .append(&batch("checkout", "cpu", t, &MINUTE_1))
            .unwrap();
        store
            .append(&batch("checkout", "wall", t, &[(SAVE, 400)]))
            .unwrap();
        store
            .append(&batch("inventory", "cpu", t, &[(STOCK, 30)]))
            .unwrap();
    }
    store.flush().unwrap();
    assert!(!store.blocks().is_empty());
    for i in 6..12 {
        let t = T0 + i * 10 * SECOND;
        store
            .append(&batch("checkout", "cpu", t, &MINUTE_2))
            .unwrap();
    }
    let now = profile::clock::unix_nanos();
    store
        .append(&batch("checkout", "cpu", now - 5 * SECOND, &[(TAX, 3)]))
        .unwrap();
    serve(Arc::new(RwLock::new(store)), dir).await
}

async fn serve(store: Arc<RwLock<Store>>, dir: tempfile::TempDir) -> Server {
    serve_state(ApiState::new(store), dir).await
}

/// Serves `state` with authentication on, as the agent does: the test's client holds a token
/// of a key `generatekey` made, and sends it with every request.
async fn serve_state(state: ApiState, dir: tempfile::TempDir) -> Server {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let store = Arc::clone(&state.store);
    let expires = profile::clock::unix_nanos() / 1_000_000_000 + 3600;
    let key = ui::auth::generate_key(expires);
    let auth = ui::auth::ApiKey::new(Some(&key.subject), Some(&key.public_key), None).unwrap();
    let router = ui::router(state.with_auth(ui::Authentication::ApiKey(Arc::new(auth))));
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {}", key.token).parse().unwrap(),
    );
    let task = tokio::spawn(ui::serve(
        listener,
        router,
        ui::ServeOptions::default(),
        async {
            rx.await.ok();
        },
    ));
    Server {
        url: format!("http://{addr}"),
        client: reqwest::Client::builder()
            .default_headers(headers)
            .build()
            .unwrap(),
        store,
        shutdown: Some(tx),
        task: Some(task),
        _dir: dir,
    }
}

struct Answer {
    status: u16,
    content_type: String,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!("{e}: {}", String::from_utf8_lossy(&self.body));
        })
    }

    /// The body as a gzip-compressed pprof profile.
    fn pprof(&self) -> proto::Profile {
        let mut bytes = Vec::new();
        flate2::read::GzDecoder::new(self.body.as_slice())
            .read_to_end(&mut bytes)
            .unwrap();
        proto::Profile::decode(bytes.as_slice()).unwrap()
    }

    /// The sum of a series answer's points.
    fn points_sum(&self) -> i64 {
        let body = self.json();
        let points = body["points"].as_array().unwrap();
        points.iter().map(|p| p[1].as_i64().unwrap()).sum()
    }

    fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap()
    }

    /// Checks a problem+json answer and returns its detail.
    fn problem(&self, status: u16, kind: &str) -> String {
        assert_eq!(self.status, status, "{}", self.text());
        assert_eq!(self.content_type, PROBLEM_JSON);
        let p = self.json();
        assert_eq!(p["status"], status);
        assert_eq!(p["type"], format!("urn:clrscope:problem:{kind}"));
        assert!(p["title"].as_str().is_some_and(|t| !t.is_empty()));
        p["detail"].as_str().unwrap().to_string()
    }
}

impl Server {
    async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        params: &[(&str, &str)],
    ) -> Answer {
        let response = self
            .client
            .request(method, format!("{}{path}", self.url))
            .query(params)
            .send()
            .await
            .unwrap();
        Answer {
            status: response.status().as_u16(),
            content_type: response
                .headers()
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default(),
            headers: response.headers().clone(),
            body: response.bytes().await.unwrap().to_vec(),
        }
    }

    async fn get(&self, path: &str, params: &[(&str, &str)]) -> Answer {
        self.request(reqwest::Method::GET, path, params).await
    }

    /// The store's own answer, to compare the API against.
    fn total(&self, query: &Query) -> i64 {
        self.store.read().unwrap().profile(query).unwrap().total(0)
    }

    async fn stop(mut self) {
        self.shutdown.take().unwrap().send(()).unwrap();
        self.task.take().unwrap().await.unwrap().unwrap();
    }
}

fn cpu_query(from: i64, until: i64) -> Query {
    Query {
        from,
        until,
        profile_type: ProfileType::known("cpu").unwrap(),
        matchers: vec![("service_name".into(), "checkout".into())],
        sample_matchers: Vec::new(),
        sample_labels: SampleLabels::All,
        control: QueryControl::default(),
    }
}

fn ms(unix_nanos: i64) -> String {
    (unix_nanos / 1_000_000).to_string()
}

const CHECKOUT: &str = "{service_name=\"checkout\"}";

/// `type=cpu`, checkout, the first minute (RFC 3339 and Unix ms mixed), and `extra`.
fn minute_1<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut params = vec![
        ("type", "cpu"),
        ("query", CHECKOUT),
        ("from", "2025-11-30T01:08:00Z"),
        ("until", "1764464940000"),
    ];
    params.extend_from_slice(extra);
    params
}

/// Follows the first (hottest) child from `node` down to a leaf.
fn hottest_path(node: &Value) -> Vec<String> {
    let mut path = Vec::new();
    let mut node = node;
    while let Some(child) = node["children"].as_array().and_then(|c| c.first()) {
        path.push(child["name"].as_str().unwrap().to_string());
        node = child;
    }
    path
}

#[test]
fn the_default_address_is_loopback_only() {
    assert_eq!(
        DEFAULT_API_ADDR,
        SocketAddr::from((Ipv4Addr::LOCALHOST, 52323))
    );
}

#[tokio::test]
async fn profile_types_labels_and_values() {
    let server = start().await;
    let types = server.get("/api/v1/profile-types", &[]).await;
    assert_eq!(types.status, 200);
    assert_eq!(types.content_type, "application/json");
    assert_eq!(
        types.json(),
        serde_json::json!([
            {"name": "cpu", "unit": "nanoseconds"},
            {"name": "wall", "unit": "nanoseconds"}
        ])
    );
    let labels = server.get("/api/v1/labels", &[]).await;
    assert_eq!(
        labels.json(),
        serde_json::json!(["host_name", "process_id", "service_name"])
    );
    let services = server.get("/api/v1/labels/service_name/values", &[]).await;
    assert_eq!(
        services.json(),
        serde_json::json!(["checkout", "inventory"])
    );
    let none = server.get("/api/v1/labels/pod_name/values", &[]).await;
    assert_eq!((none.status, none.json()), (200, serde_json::json!([])));
    server.stop().await;
}

#[tokio::test]
async fn series_points_add_up_to_the_stored_totals() {
    let server = start().await;
    let from = T0;
    let until = T0 + 120 * SECOND;
    let answer = server
        .get(
            "/api/v1/series",
            &[
                ("type", "cpu"),
                ("query", CHECKOUT),
                ("from", &ms(from)),
                ("until", &ms(until)),
                ("step", "10s"),
            ],
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let body = answer.json();
    assert_eq!(body["unit"], "nanoseconds");
    assert_eq!(body["step_ms"], 10_000);
    let points: Vec<(i64, i64)> = serde_json::from_value(body["points"].clone()).unwrap();
    assert_eq!(points.len(), 12);
    let per_batch = |leaves: &[(&str, i64)]| leaves.iter().map(|l| l.1).sum::<i64>() * PERIOD;
    for (i, &(t, v)) in points.iter().enumerate() {
        assert_eq!(t, T0_MS + i as i64 * 10_000);
        let minute = if i < 6 { &MINUTE_1 } else { &MINUTE_2 };
        assert_eq!(v, per_batch(minute), "point {i}");
    }
    let sum: i64 = points.iter().map(|p| p.1).sum();
    assert_eq!(sum, server.total(&cpu_query(from, until)));

    // Relative times and the default step (10 s): the batch 5 s ago is in the last points.
    let recent = server
        .get(
            "/api/v1/series",
            &[("type", "cpu"), ("query", CHECKOUT), ("from", "now-5m")],
        )
        .await;
    let body = recent.json();
    assert_eq!(body["step_ms"], 10_000);
    assert_eq!(body["points"].as_array().unwrap().len(), 30);
    assert_eq!(recent.points_sum(), 3 * PERIOD);

    // A day without a step: the default grows so there are at most 1000 points.
    let day = server
        .get("/api/v1/series", &[("type", "cpu"), ("from", "now-24h")])
        .await
        .json();
    assert_eq!(day["step_ms"], 87_000);
    assert_eq!(day["points"].as_array().unwrap().len(), 994);

    // The widest range times can name neither overflows nor loses a sample.
    let (from, until) = ("1678-01-01T00:00:00Z", "2262-01-01T00:00:00Z");
    let all = [("type", "cpu"), ("from", from), ("until", until)];
    let wide = server.get("/api/v1/series", &all).await;
    let everything = Query {
        matchers: Vec::new(),
        ..cpu_query(i64::MIN, i64::MAX)
    };
    assert_eq!(wide.points_sum(), server.total(&everything));
    assert_eq!(server.get("/api/v1/diff", &all).await.status, 200);
    server.stop().await;
}

#[tokio::test]
async fn pprof_decodes_with_the_hot_function_on_top() {
    let server = start().await;
    let answer = server
        .get("/api/v1/profile", &minute_1(&[("format", "pprof")]))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.content_type, "application/octet-stream");
    assert_eq!(
        answer.headers["content-disposition"],
        "attachment; filename=\"cpu.pb.gz\""
    );
    let p = answer.pprof();
    let string = |i: i64| p.string_table[i as usize].as_str();
    assert_eq!(string(p.sample_type[0].r#type), "cpu");
    assert_eq!(string(p.sample_type[0].unit), "nanoseconds");
    // Location ids equal function ids in clrscope's pprof.
    let mut self_values: HashMap<&str, i64> = HashMap::new();
    for s in &p.sample {
        let function = &p.function[s.location_id[0] as usize - 1];
        *self_values.entry(string(function.name)).or_default() += s.value[0];
    }
    let top = self_values.iter().max_by_key(|(_, &v)| v).unwrap();
    assert_eq!((*top.0, *top.1), (TAX, 6 * 70 * PERIOD));
    let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(total, server.total(&cpu_query(T0, T0 + 60 * SECOND)));
    // pprof keeps the sample labels (a flame graph drops them).
    assert!(p
        .sample
        .iter()
        .all(|s| s.label.iter().any(|l| string(l.key) == "thread_id")));
    server.stop().await;
}

#[tokio::test]
async fn json_tree_totals_match_the_store() {
    let server = start().await;
    let answer = server.get("/api/v1/profile", &minute_1(&[])).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.content_type, "application/json");
    let tree = answer.json();
    let total = server.total(&cpu_query(T0, T0 + 60 * SECOND));
    assert_eq!(total, 6 * 100 * PERIOD);
    assert_eq!(tree["unit"], "nanoseconds");
    assert_eq!(tree["total"], total);
    assert_eq!(tree["root"]["name"], "total");
    assert_eq!(tree["root"]["total"], total);
    assert_eq!(hottest_path(&tree["root"]), [MAIN, HANDLER, TAX]);
    let handler = &tree["root"]["children"][0]["children"][0];
    assert_eq!(handler["module"], "Shop.Checkout.dll");
    let children: Vec<(&str, i64)> = handler["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["total"].as_i64().unwrap()))
        .collect();
    assert_eq!(
        children,
        [
            (TAX, 420 * PERIOD),
            (SERIALIZE, 120 * PERIOD),
            (SAVE, 60 * PERIOD)
        ]
    );

    // Without from/until: the last minute, which holds the batch of 5 s ago.
    let recent = server
        .get("/api/v1/profile", &[("type", "cpu"), ("query", CHECKOUT)])
        .await
        .json();
    assert_eq!(recent["total"], 3 * PERIOD);
    server.stop().await;
}

#[tokio::test]
async fn sample_label_filters_keep_one_span() {
    let server = start().await;
    for (key, value) in [("span_id", SPAN), ("trace_id", TRACE)] {
        let tree = server
            .get("/api/v1/profile", &minute_1(&[(key, value)]))
            .await
            .json();
        assert_eq!(tree["total"], 60 * PERIOD, "{key}");
        assert_eq!(hottest_path(&tree["root"]), [MAIN, HANDLER, SAVE]);
    }
    let none = server
        .get(
            "/api/v1/profile",
            &minute_1(&[("span_id", "ffffffffffffffff")]),
        )
        .await
        .json();
    assert_eq!(none["total"], 0);
    let series = server
        .get(
            "/api/v1/series",
            &minute_1(&[("span_id", SPAN), ("step", "1m")]),
        )
        .await
        .json();
    assert_eq!(series["points"], serde_json::json!([[T0_MS, 60 * PERIOD]]));
    server.stop().await;
}

#[tokio::test]
async fn folded_svg_and_speedscope() {
    let server = start().await;
    let folded = server
        .get("/api/v1/profile", &minute_1(&[("format", "folded")]))
        .await;
    assert_eq!(folded.status, 200);
    assert_eq!(folded.content_type, "text/plain; charset=utf-8");
    let text = folded.text();
    let line = format!("{MAIN};{HANDLER};{TAX} {}", 420 * PERIOD);
    assert!(text.lines().any(|l| l == line), "{text}");
    let sum: i64 = text
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<i64>().unwrap())
        .sum();
    assert_eq!(sum, 600 * PERIOD);

    let svg = server
        .get("/api/v1/profile", &minute_1(&[("format", "svg")]))
        .await;
    assert_eq!(svg.status, 200);
    assert_eq!(svg.content_type, "image/svg+xml");
    let text = svg.text();
    assert!(text.contains("<svg"));
    assert!(text.contains("ComputeTax"));

    let speedscope = server
        .get("/api/v1/profile", &minute_1(&[("format", "SpeedScope")]))
        .await;
    assert_eq!(speedscope.status, 200);
    assert_eq!(speedscope.content_type, "application/json");
    let file = speedscope.json();
    assert_eq!(
        file["$schema"],
        "https://www.speedscope.app/file-format-schema.json"
    );
    let frames = file["shared"]["frames"].as_array().unwrap();
    assert!(frames.iter().any(|f| f["name"] == TAX));
    // One profile per thread: the query kept the thread labels for it.
    assert!(file["profiles"].as_array().unwrap().len() > 1, "{file}");
    server.stop().await;
}

#[tokio::test]
async fn max_nodes_cuts_the_tree_and_shows_the_rest_as_other() {
    let server = start().await;
    let folded = server
        .get(
            "/api/v1/profile",
            &minute_1(&[("format", "folded"), ("max_nodes", "3")]),
        )
        .await;
    assert_eq!(folded.status, 200);
    let mut lines: Vec<String> = folded.text().lines().map(str::to_string).collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            format!("{MAIN};{HANDLER};{TAX} {}", 420 * PERIOD),
            format!("{MAIN};{HANDLER};other {}", 180 * PERIOD),
        ]
    );
    for (value, format) in [("0", "json"), ("many", "json"), ("10", "pprof")] {
        let refused = server
            .get(
                "/api/v1/profile",
                &minute_1(&[("format", format), ("max_nodes", value)]),
            )
            .await;
        assert_eq!(refused.status, 400, "max_nodes={value} format={format}");
        assert!(refused.text().contains("max_nodes"), "{}", refused.text());
    }
    server.stop().await;
}

#[tokio::test]
async fn diff_shows_what_changed() {
    let server = start().await;
    let minutes = [
        ("type", "cpu"),
        ("query", CHECKOUT),
        ("base_from", "2025-11-30T01:08:00Z"),
        ("base_until", "2025-11-30T01:09:00Z"),
        ("from", "2025-11-30T01:09:00Z"),
        ("until", "2025-11-30T01:10:00Z"),
    ];
    let tree = server.get("/api/v1/diff", &minutes).await;
    assert_eq!(tree.status, 200, "{}", tree.text());
    let tree = tree.json();
    assert_eq!(
        (tree["base_total"].as_i64(), tree["total"].as_i64()),
        (Some(600 * PERIOD), Some(660 * PERIOD))
    );
    let handler = &tree["root"]["children"][0]["children"][0];
    let change: HashMap<&str, (i64, i64)> = handler["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let base = c["base_total"].as_i64().unwrap();
            (
                c["name"].as_str().unwrap(),
                (base, c["total"].as_i64().unwrap()),
            )
        })
        .collect();
    assert_eq!(change[SERIALIZE], (120 * PERIOD, 540 * PERIOD));
    assert_eq!(change[TAX], (420 * PERIOD, 60 * PERIOD));
    assert_eq!(change[SAVE], (60 * PERIOD, 60 * PERIOD));
    assert_eq!(hottest_path(&tree["root"]), [MAIN, HANDLER, SERIALIZE]);

    // Without a base range: the minute before `from`, so the same comparison.
    let implied: Vec<_> = minutes
        .iter()
        .filter(|(k, _)| !k.starts_with("base_"))
        .copied()
        .collect();
    assert_eq!(server.get("/api/v1/diff", &implied).await.json(), tree);

    let folded = server
        .get(
            "/api/v1/diff",
            &[&minutes[..], &[("format", "folded")]].concat(),
        )
        .await;
    assert_eq!(folded.content_type, "text/plain; charset=utf-8");
    let line = format!(
        "{MAIN};{HANDLER};{SERIALIZE} {} {}",
        120 * PERIOD,
        540 * PERIOD
    );
    assert!(
        folded.text().lines().any(|l| l == line),
        "{}",
        folded.text()
    );

    let pprof = server
        .get(
            "/api/v1/diff",
            &[&minutes[..], &[("format", "pprof")]].concat(),
        )
        .await;
    assert_eq!(
        pprof.headers["content-disposition"],
        "attachment; filename=\"cpu-diff.pb.gz\""
    );
    let p = pprof.pprof();
    let kinds: Vec<&str> = p
        .sample_type
        .iter()
        .map(|t| p.string_table[t.r#type as usize].as_str())
        .collect();
    assert_eq!(kinds, ["base", "new"]);
    let totals = |i: usize| p.sample.iter().map(|s| s.value[i]).sum::<i64>();
    assert_eq!((totals(0), totals(1)), (600 * PERIOD, 660 * PERIOD));
    server.stop().await;
}

/// `(path, parameters, status, problem type, phrases the detail must contain)`.
type ErrorCase<'a> = (
    &'a str,
    Vec<(&'a str, &'a str)>,
    u16,
    &'a str,
    &'a [&'a str],
);

#[tokio::test]
async fn errors_are_problem_json_that_say_what_to_change() {
    let server = start().await;
    let cpu = |extra: &[(&'static str, &'static str)]| [&[("type", "cpu")], extra].concat();
    let backwards = [&minute_1(&[])[..3], &[("until", "2025-11-30T01:07:00Z")]].concat();
    let empty_2020 = cpu(&[
        ("from", "2020-01-01T00:00:00Z"),
        ("until", "2020-01-02T00:00:00Z"),
        ("format", "svg"),
    ]);
    let cases: Vec<ErrorCase> = vec![
        (
            "/api/v1/profile",
            vec![("query", CHECKOUT)],
            400,
            "missing-parameter",
            &["type=cpu"],
        ),
        (
            "/api/v1/series",
            vec![("type", "cpuu")],
            400,
            "unknown-profile-type",
            &[
                "\"cpuu\"",
                "the store holds cpu, wall",
                "also records alloc_samples, alloc_size",
            ],
        ),
        (
            "/api/v1/profile",
            cpu(&[("query", "{service_name=checkout}")]),
            400,
            "invalid-selector",
            &["double quotes"],
        ),
        (
            "/api/v1/profile",
            backwards,
            400,
            "empty-range",
            &["from=2025-11-30T01:08:00Z is not before until=2025-11-30T01:07:00Z"],
        ),
        (
            "/api/v1/profile",
            cpu(&[("from", "yesterday")]),
            400,
            "invalid-parameter",
            &["from=\"yesterday\"", "now-5m", "RFC 3339"],
        ),
        (
            "/api/v1/diff",
            cpu(&[("base_until", "later")]),
            400,
            "invalid-parameter",
            &["base_until=\"later\""],
        ),
        (
            "/api/v1/profile",
            minute_1(&[("format", "flamegraph")]),
            400,
            "unknown-format",
            &["\"flamegraph\"", "json, pprof, folded, svg, speedscope"],
        ),
        (
            "/api/v1/diff",
            minute_1(&[("format", "svg")]),
            400,
            "unknown-format",
            &["this route answers in json, pprof, folded"],
        ),
        (
            "/api/v1/series",
            cpu(&[("from", "now-24h"), ("step", "1ms")]),
            400,
            "invalid-query",
            &["86400000 points asked for, at most 1000000: use a larger step"],
        ),
        (
            "/api/v1/series",
            cpu(&[("step", "0s")]),
            400,
            "invalid-parameter",
            &["positive whole number of milliseconds"],
        ),
        (
            "/api/v1/series",
            cpu(&[("step", "1.5ms")]),
            400,
            "invalid-parameter",
            &["whole number of milliseconds"],
        ),
        (
            "/api/v1/series",
            cpu(&[("step", "soon")]),
            400,
            "invalid-parameter",
            &["e.g. 30s"],
        ),
        (
            "/api/v1/profile",
            minute_1(&[("span", SPAN)]),
            400,
            "bad-request",
            &["unknown query parameter `span`", "span_id, trace_id"],
        ),
        (
            "/api/v1/profile",
            minute_1(&[("type", "wall")]),
            400,
            "bad-request",
            &["`type` is given more than once"],
        ),
        (
            "/api/v1/labels",
            vec![("query", CHECKOUT)],
            400,
            "bad-request",
            &["no query parameters"],
        ),
        (
            "/api/v1/profile",
            empty_2020,
            404,
            "no-data",
            &["widen the time range"],
        ),
        (
            "/api/v1/flamegraph",
            vec![],
            404,
            "not-found",
            &["GET /api/v1/flamegraph", "/api/v1/"],
        ),
        (
            "/index.html",
            vec![],
            404,
            "not-found",
            &["GET /index.html", "web UI is at /"],
        ),
    ];
    for (path, params, status, kind, phrases) in cases {
        let detail = server.get(path, &params).await.problem(status, kind);
        for phrase in phrases {
            assert!(detail.contains(phrase), "{path} {params:?}: {detail}");
        }
    }
    let detail = server
        .request(reqwest::Method::POST, "/api/v1/profile", &[])
        .await
        .problem(405, "method-not-allowed");
    assert!(
        detail.contains("POST is not allowed on /api/v1/profile"),
        "{detail}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_store_whose_writer_panicked_answers_503() {
    let server = start().await;
    let store = Arc::clone(&server.store);
    std::thread::spawn(move || {
        let _writing = store.write().unwrap();
        panic!("writer failed mid-append (expected by this test)");
    })
    .join()
    .unwrap_err();
    let detail = server
        .get("/api/v1/labels", &[])
        .await
        .problem(503, "unavailable");
    assert!(detail.contains("restart the agent"), "{detail}");
    server.stop().await;
}

#[tokio::test]
async fn shutdown_stops_accepting_connections() {
    let server = start().await;
    let url = server.url.clone();
    assert_eq!(server.get("/api/v1/labels", &[]).await.status, 200);
    server.stop().await;
    let refused = http_client()
        .get(format!("{url}/api/v1/labels"))
        .send()
        .await;
    assert!(refused.is_err_and(|e| e.is_connect()));
}

#[tokio::test]
async fn events_mark_processes_attaching_and_detaching() {
    let processes = AttachedProcesses::default();
    let process = |pid: u64, service: &str, attached_unix_ms: i64| AttachedProcess {
        pid,
        name: "Shop".into(),
        service_name: service.into(),
        command_line: "dotnet Shop.dll".into(),
        runtime_version: Some("8.0.4".into()),
        runtime_cookie: format!("cookie-{pid}"),
        transport: "connect",
        attached_unix_ms,
        sampler: SamplerControl::new(DutyCycle::default()),
        rules: Default::default(),
        signals: Default::default(),
    };
    let checkout = processes
        .register(process(7, "checkout", T0_MS + 1000))
        .unwrap();
    let _inventory = processes
        .register(process(8, "inventory", T0_MS + 2000))
        .unwrap();
    drop(checkout);
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("data"), StoreOptions::default()).unwrap();
    let state = ApiState::new(Arc::new(RwLock::new(store))).with_processes(processes);
    let server = serve_state(state, dir).await;
    let from = T0_MS.to_string();
    let kinds = |answer: Answer| -> Vec<(String, u64)> {
        assert_eq!(answer.status, 200, "{}", answer.text());
        let events = answer.json();
        events
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["kind"].as_str().unwrap().to_string(),
                    e["pid"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let all = server.get("/api/v1/events", &[("from", &from)]).await;
    assert_eq!(all.json()[0]["unix_ms"], T0_MS + 1000);
    assert_eq!(all.json()[0]["service_name"], "checkout");
    assert_eq!(
        kinds(all),
        [
            ("attached".into(), 7),
            ("attached".into(), 8),
            ("detached".into(), 7)
        ]
    );
    let checkout = server
        .get("/api/v1/events", &[("from", &from), ("query", CHECKOUT)])
        .await;
    assert_eq!(
        kinds(checkout),
        [("attached".into(), 7), ("detached".into(), 7)]
    );
    // Series labels events do not carry filter nothing; the range is half-open.
    let until = (T0_MS + 2000).to_string();
    let early = server
        .get(
            "/api/v1/events",
            &[
                ("from", &from),
                ("until", &until),
                ("query", "{process_id=\"7\",host_name=\"node-1\"}"),
            ],
        )
        .await;
    assert_eq!(kinds(early), [("attached".into(), 7)]);
    // The default range is the last hour: the 2025 events are older.
    assert!(kinds(server.get("/api/v1/events", &[]).await)
        .iter()
        .all(|(kind, _)| kind == "detached"));
    let detail = server
        .get("/api/v1/events", &[("type", "cpu")])
        .await
        .problem(400, "bad-request");
    assert!(detail.contains("takes query, from, until"), "{detail}");
    server.stop().await;
}

#[tokio::test]
async fn the_web_ui_is_served_with_its_modules() {
    let server = start().await;
    let page = server.get("/", &[]).await;
    assert_eq!(page.status, 200);
    assert_eq!(page.content_type, "text/html; charset=utf-8");
    let policy = page.headers["content-security-policy"].to_str().unwrap();
    assert!(policy.contains("default-src 'self'"), "{policy}");
    assert!(page.text().contains("src=\"/ui/main.js\""));
    let module = server.get("/ui/main.js", &[]).await;
    assert_eq!(module.status, 200);
    assert_eq!(module.content_type, "text/javascript; charset=utf-8");
    assert_eq!(module.headers["x-content-type-options"], "nosniff");
    assert_eq!(
        server.get("/ui/style.css", &[]).await.content_type,
        "text/css; charset=utf-8"
    );
    server
        .get("/ui/../Cargo.toml", &[])
        .await
        .problem(404, "not-found");
    server
        .get("/ui/missing.js", &[])
        .await
        .problem(404, "not-found");
    server.stop().await;
}
