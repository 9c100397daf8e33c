//! The Storefront sample service (tests/targets/Storefront, its load generator StorefrontLoad and its
//! OpenTelemetry twin StorefrontOtel), checked against what is measured outside it: the load
//! generator's counts and latencies, the kernel's CPU accounts in /proc, the rows in the database as
//! the database answers, and what the real OTLP receiver decoded. Each behaviour switch is shown to do
//! what it says by those measures, not by the service's say-so. Needs `make setup` (the runtimes, the
//! targets, Debian's PostgreSQL, the receiver's Python packages).

use crate::support;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::postgres::Postgres;
use support::receiver::{scoped_items, Receiver};
use support::{http_get, http_request, http_request_with_body, Target};

/// The routes of the load generator and the labels the service counts them under.
const LABELS: [(&str, &str); 9] = [
    ("catalog", "catalog"),
    ("product", "product"),
    ("cart", "cart"),
    ("checkout", "checkout"),
    ("recommend", "recommend"),
    ("coupon", "coupon"),
    ("report", "report"),
    ("health", "health"),
    ("grpc", "grpc.catalog"),
];

pub(crate) fn port(t: &Target) -> u16 {
    t.ready_fact("/port").and_then(Value::as_u64).expect("port") as u16
}

pub(crate) fn fact(t: &Target, pointer: &str) -> String {
    t.ready_fact(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no {pointer} in {:?}", t.ready()))
        .to_string()
}

/// A downstream instance (SQLite), then a frontend calling it with ARGS.
pub(crate) fn start_pair(front_args: &[&str], down_args: &[&str]) -> (Target, Target) {
    let down = Target::builder("Storefront")
        .args(["--role", "downstream"])
        .args(down_args.iter().copied())
        .start();
    let front = Target::builder("Storefront")
        .args(["--downstream", &fact(&down, "/url")])
        .args(["--downstream-grpc", &fact(&down, "/grpc_url")])
        .args(front_args.iter().copied())
        .start();
    (down, front)
}

/// GET /admin/stats: the service's totals.
fn stats(t: &Target) -> Value {
    let r = http_get(port(t), "/admin/stats", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// POST /admin/behaviour?QUERY; the knobs it answers with.
pub(crate) fn set_behaviour(t: &Target, query: &str) -> Value {
    let r = http_request(port(t), "POST", &format!("/admin/behaviour?{query}"), &[]);
    assert_eq!(r.status, 200, "{query}: {}", r.body);
    r.json()
}

/// What one run of the load generator said.
pub(crate) struct Load {
    pub(crate) exit: Value,
    pub(crate) requests: Vec<Value>,
}

impl Load {
    pub(crate) fn route(&self, route: &str) -> &Value {
        &self.exit["routes"][route]
    }

    pub(crate) fn count(&self, field: &str) -> u64 {
        self.exit[field]
            .as_u64()
            .unwrap_or_else(|| panic!("{field} in {}", self.exit))
    }

    pub(crate) fn status(&self, code: &str) -> u64 {
        self.exit["status"][code].as_u64().unwrap_or(0)
    }
}

/// Runs StorefrontLoad against FRONT for SECONDS at RPS with MIX; waits for its exit line.
pub(crate) fn load(front: &Target, rps: u32, mix: &str, seconds: u32, request_lines: bool) -> Load {
    let mut args = vec![
        "--target".to_string(),
        fact(front, "/url"),
        "--grpc-target".to_string(),
        fact(front, "/grpc_url"),
        "--rps".to_string(),
        rps.to_string(),
        "--mix".to_string(),
        mix.to_string(),
        "--duration-seconds".to_string(),
        seconds.to_string(),
    ];
    if request_lines {
        args.push("--request-lines".to_string());
    }
    let mut generator = Target::builder("StorefrontLoad").args(args).start();
    let mut requests = Vec::new();
    let timeout = Duration::from_secs(seconds as u64 + 90);
    let exit = generator
        .wait_for_json(timeout, |v| {
            if v.get("request").is_some() {
                requests.push(v.clone());
            }
            v.get("exit").is_some()
        })
        .unwrap_or_else(|| {
            panic!(
                "StorefrontLoad gave no exit line within {timeout:?}: {}",
                generator.stderr_text()
            )
        });
    assert_eq!(generator.dropped_lines(), 0, "StorefrontLoad lines dropped");
    Load { exit, requests }
}

/// A stretch of load with the service's totals and its process CPU (from /proc) around it.
struct Phase {
    load: Load,
    cpu_ms: f64,
    before: Value,
    after: Value,
}

impl Phase {
    fn run(front: &Target, rps: u32, mix: &str, seconds: u32) -> Phase {
        let pid = front.pid().to_string();
        let before = stats(front);
        let cpu_before = support::process_cpu_ms(&pid);
        let load = load(front, rps, mix, seconds, true);
        let cpu_ms = support::process_cpu_ms(&pid) - cpu_before;
        let after = stats(front);
        Phase {
            load,
            cpu_ms,
            before,
            after,
        }
    }

    /// How much a total of the service's stats grew over the phase.
    fn delta(&self, pointer: &str) -> f64 {
        let value = |v: &Value| v.pointer(pointer).and_then(Value::as_f64).unwrap_or(0.0);
        value(&self.after) - value(&self.before)
    }

    /// The service's CPU per answered request, ms.
    fn cpu_per_request(&self) -> f64 {
        self.cpu_ms / self.load.count("completed") as f64
    }
}

/// Waits until the service is quiet (under 30 ms of CPU in a second): after a warm-up the JIT goes on
/// recompiling hot methods in the background for a few seconds, which a CPU-per-request figure must
/// not include.
fn settle(t: &Target) {
    let pid = t.pid().to_string();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let before = support::process_cpu_ms(&pid);
        std::thread::sleep(Duration::from_secs(1));
        let used = support::process_cpu_ms(&pid) - before;
        if used <= 30.0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the service never went quiet (last second: {used} ms of CPU)"
        );
    }
}

#[test]
fn serves_every_route_and_calls_its_downstream() {
    let (mut down, mut front) = start_pair(&["--request-lines"], &["--request-lines"]);
    let ready = front.ready().unwrap().clone();
    assert_eq!(ready["role"], "frontend");
    assert_eq!(ready["database"]["kind"], "sqlite");
    assert_eq!(ready["downstream"]["self"], false);
    let providers: Vec<&str> = ready["logger_providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    for provider in ["ConsoleLoggerProvider", "EventSourceLoggerProvider"] {
        assert!(
            providers.iter().any(|p| p.ends_with(provider)),
            "{provider} in {providers:?}"
        );
    }
    // The named thread is what the kernel calls it.
    for (name, tid) in front.threads() {
        let comm = std::fs::read_to_string(format!("/proc/{}/task/{tid}/comm", front.pid()))
            .unwrap_or_else(|e| panic!("thread {name} ({tid}): {e}"));
        assert_eq!(comm.trim_end(), name);
    }

    // Each route answers as it says, one by one.
    let p = port(&front);
    let product = http_get(p, "/api/products/7", &[]).json();
    assert_eq!(product["id"], 7);
    assert!(product["discountedCents"].as_i64() <= product["priceCents"].as_i64());
    assert_eq!(http_get(p, "/api/products/9999", &[]).status, 404);
    assert_eq!(http_get(p, "/health", &[]).body, "ok");
    assert_eq!(
        http_get(p, "/api/coupons/SAVE10", &[]).json()["percentOff"],
        10
    );
    assert_eq!(http_get(p, "/api/coupons/NOPE", &[]).status, 404);
    assert_eq!(http_get(p, "/api/reports/sales", &[]).json()["rows"], 200);
    let lamps = http_get(p, "/api/products?q=lamp", &[]).json();
    assert!(lamps.as_array().is_some_and(|l| !l.is_empty()
        && l.iter()
            .all(|x| x["name"].as_str().unwrap().to_lowercase().contains("lamp"))));
    let order = http_request_with_body(
        p,
        "POST",
        "/api/orders",
        &[("Content-Type", "application/json")],
        br#"{"productId":5,"quantity":2,"coupon":"SAVE10"}"#,
    );
    assert_eq!(order.status, 200, "{}", order.body);
    assert_eq!(order.json()["quantity"], 2);

    // Then every route, gRPC included, under load: the service counts exactly what was sent.
    let front_before = stats(&front);
    let down_before = stats(&down);
    let run = load(
        &front,
        40,
        "catalog:3,product:3,cart:2,checkout:2,recommend:1,coupon:1,report:1,health:1,grpc:2",
        5,
        true,
    );
    assert_eq!(run.count("failed"), 0, "{}", run.exit);
    assert_eq!(run.count("completed"), run.count("sent"), "{}", run.exit);
    let front_after = stats(&front);
    let down_after = stats(&down);
    let grew = |before: &Value, after: &Value, pointer: &str| {
        after.pointer(pointer).and_then(Value::as_u64).unwrap_or(0)
            - before.pointer(pointer).and_then(Value::as_u64).unwrap_or(0)
    };
    for (route, label) in LABELS {
        let sent = run.route(route)["sent"].as_u64().unwrap();
        let served = grew(
            &front_before,
            &front_after,
            &format!("/requests/{label}/count"),
        );
        assert_eq!(
            served, sent,
            "route {route} (label {label}): sent {sent}, served {served}"
        );
    }
    // Every order made the downstream check stock once and reserve once.
    let checkouts = run.route("checkout")["sent"].as_u64().unwrap();
    assert!(checkouts >= 15, "{}", run.exit);
    assert_eq!(
        grew(&front_before, &front_after, "/orders_placed"),
        checkouts
    );
    assert_eq!(grew(&down_before, &down_after, "/reservations"), checkouts);
    assert_eq!(grew(&down_before, &down_after, "/stock_checks"), checkouts);
    assert_eq!(
        grew(&down_before, &down_after, "/requests/reserve/count"),
        checkouts
    );

    // The rows are in the database, as SQLite itself counts them (the order above and the load's).
    let database = fact(&front, "/database/location");
    let rows = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute('select count(*) from orders').fetchone()[0])",
            &database,
        ])
        .output()
        .expect("python3 sqlite3");
    assert!(rows.status.success(), "{rows:?}");
    let rows: u64 = String::from_utf8_lossy(&rows.stdout)
        .trim()
        .parse()
        .unwrap();
    assert_eq!(rows, front_after["orders_placed"].as_u64().unwrap());

    // Trace context: every generated request reached the frontend with the generator's trace id and
    // parent, and each checkout's calls reached the downstream in the same trace.
    let front_lines = lines_with(&mut front, "request");
    let down_lines = lines_with(&mut down, "request");
    let by_trace: HashMap<&str, &Value> = front_lines
        .iter()
        .map(|l| (l["trace_id"].as_str().unwrap(), l))
        .collect();
    assert_eq!(run.requests.len() as u64, run.count("sent"));
    for sent in &run.requests {
        let trace = sent["trace_id"].as_str().unwrap();
        let seen = by_trace
            .get(trace)
            .unwrap_or_else(|| panic!("the frontend logged no request of trace {trace}: {sent}"));
        assert_eq!(
            seen["parent_span_id"], sent["parent_span_id"],
            "{seen} for {sent}"
        );
        assert_eq!(seen["status"], sent["status"], "{seen} for {sent}");
    }
    let checkout_traces: HashSet<&str> = front_lines
        .iter()
        .filter(|l| l["route"] == "checkout")
        .map(|l| l["trace_id"].as_str().unwrap())
        .collect();
    for route in ["reserve", "grpc.inventory"] {
        let calls: Vec<&Value> = down_lines.iter().filter(|l| l["route"] == route).collect();
        assert_eq!(calls.len(), checkout_traces.len(), "{route} calls");
        for call in calls {
            assert!(
                checkout_traces.contains(call["trace_id"].as_str().unwrap())
                    && call["parent_span_id"].is_string(),
                "{route} call outside a checkout's trace: {call}"
            );
        }
    }
}

/// Every line of T received so far that has KEY.
fn lines_with(t: &mut Target, key: &str) -> Vec<Value> {
    t.drain_lines()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v.get(key).is_some())
        .collect()
}

#[test]
fn postgres_holds_the_orders() {
    let db = Postgres::start("storefront");
    let front = Target::builder("Storefront")
        .args(["--postgres", &db.connection_string()])
        .start();
    let ready = front.ready().unwrap();
    assert_eq!(ready["database"]["kind"], "postgresql");
    let version = db.query("SHOW server_version");
    assert_eq!(ready["database"]["server_version"], version.as_str());
    assert_eq!(db.query("SELECT count(*) FROM products"), "200");

    let run = load(
        &front,
        20,
        "catalog:1,product:1,checkout:2,grpc:1",
        4,
        false,
    );
    assert_eq!(run.count("failed"), 0, "{}", run.exit);
    let checkouts = run.route("checkout")["sent"].as_u64().unwrap();
    let instance = fact(&front, "/database/instance");
    let rows = db.query(&format!(
        "SELECT count(*), coalesce(sum(quantity), 0) FROM orders WHERE instance = '{instance}'"
    ));
    let (count, quantity) = rows.split_once('|').unwrap();
    assert_eq!(count.parse::<u64>().unwrap(), checkouts, "{rows}");
    // The generator orders 1 + k % 3 items with its k-th checkout.
    let want: u64 = (0..checkouts).map(|k| 1 + k % 3).sum();
    assert_eq!(quantity.parse::<u64>().unwrap(), want, "{rows}");
    assert_eq!(stats(&front)["orders_placed"].as_u64(), Some(checkouts));
}

#[test]
fn hot_endpoint_and_cpu_regression_cost_what_proc_measures() {
    let front = Target::builder("Storefront").start();
    // Warm-up: every method of the two routes through the JIT's tiers (instrumented, then optimized).
    load(&front, 30, "recommend:1,product:1", 10, false);

    // 10 requests/s of 20 ms of CPU: a fifth of a core, which a loaded machine still gives. The
    // baseline is measured on both sides of the switch and the lower taken: what the JIT still
    // recompiles in the background lands in whichever phase comes first.
    let (cool, hot) = switched(&front, "hot_ms=1", "hot_ms=20", 10, "recommend:1", 6);
    let extra = hot.cpu_per_request() - cool.cpu_per_request();
    eprintln!(
        "recommend: {:.2} -> {:.2} CPU ms per request (hot_ms 1 -> 20); p50 {} -> {} ms",
        cool.cpu_per_request(),
        hot.cpu_per_request(),
        cool.load.route("recommend")["p50"],
        hot.load.route("recommend")["p50"]
    );
    assert!(
        (19.0 * 0.8..=19.0 * 1.3).contains(&extra),
        "hot_ms 1 -> 20 should cost ~19 ms of CPU more per request; /proc says {extra:.2}"
    );
    // A request cannot take less wall time than the CPU it burns.
    assert!(hot.load.route("recommend")["p50"].as_f64().unwrap() >= 20.0);
    // The engine's own account is within what the kernel charged the process.
    assert!(hot.delta("/hot_cpu_ms") <= hot.cpu_ms + 20.0);

    let (before, regressed) = switched(
        &front,
        "regression=off",
        "regression=on&regression_ms=5",
        30,
        "product:1",
        5,
    );
    let extra = regressed.cpu_per_request() - before.cpu_per_request();
    eprintln!(
        "product: {:.2} -> {:.2} CPU ms per request (regression off -> on, 5 ms)",
        before.cpu_per_request(),
        regressed.cpu_per_request()
    );
    assert!(
        (5.0 * 0.8..=5.0 * 1.4).contains(&extra),
        "the regression should cost ~5 ms of CPU more per product request; /proc says {extra:.2}"
    );
    assert_eq!(
        regressed.delta("/pricing_evaluations") as u64,
        regressed.load.count("completed")
    );
}

/// Phases of MIX with knobs OFF, ON, then OFF again, once the service is quiet: the cheaper of the
/// OFF phases (by CPU per request), and the ON phase.
fn switched(
    front: &Target,
    off: &str,
    on: &str,
    rps: u32,
    mix: &str,
    seconds: u32,
) -> (Phase, Phase) {
    settle(front);
    set_behaviour(front, off);
    let first = Phase::run(front, rps, mix, seconds);
    set_behaviour(front, on);
    let switched_on = Phase::run(front, rps, mix, seconds);
    set_behaviour(front, off);
    let last = Phase::run(front, rps, mix, seconds);
    let baseline = if first.cpu_per_request() <= last.cpu_per_request() {
        first
    } else {
        last
    };
    (baseline, switched_on)
}

#[test]
fn exceptions_and_allocations_as_switched() {
    let front = Target::builder("Storefront").start();
    load(&front, 30, "coupon:1,report:1", 4, false); // warm-up

    set_behaviour(&front, "exception_every=4");
    let failing = Phase::run(&front, 40, "coupon:1", 4);
    let lookups = failing.load.count("sent");
    let errors = failing.load.status("500");
    assert_eq!(
        failing.load.count("failed"),
        errors,
        "{}",
        failing.load.exit
    );
    assert!(
        errors.abs_diff(lookups / 4) <= 1,
        "{errors} failures in {lookups} lookups with exception_every=4"
    );
    assert_eq!(failing.delta("/coupon_exceptions") as u64, errors);
    assert!(failing.delta("/exceptions_thrown") as u64 >= errors);
    // ASP.NET Core logged each one, with its type and the method that threw (console: stderr).
    let stderr = front.stderr_text();
    assert!(
        stderr.contains("Storefront.Pricing.CouponServiceException: coupon service unavailable")
            && stderr.contains("at Storefront.Pricing.CouponService.Lookup"),
        "no exception log in the service's stderr:\n{stderr}"
    );
    set_behaviour(&front, "exception_every=0");
    let healthy = load(&front, 40, "coupon:1", 2, false);
    assert_eq!(healthy.count("failed"), 0, "{}", healthy.exit);

    let light = Phase::run(&front, 10, "report:1", 3);
    set_behaviour(&front, "report_rows=20000");
    let heavy = Phase::run(&front, 10, "report:1", 3);
    let per_request = |p: &Phase| p.delta("/allocated_bytes") / p.load.count("completed") as f64;
    eprintln!(
        "report: {:.0} -> {:.0} bytes allocated per request (200 -> 20000 rows); gen0 GCs {} -> {}",
        per_request(&light),
        per_request(&heavy),
        light.delta("/gc_collections/0"),
        heavy.delta("/gc_collections/0")
    );
    assert!(per_request(&heavy) >= 50.0 * per_request(&light));
    assert!(per_request(&heavy) >= 20000.0 * 300.0);
    assert!(heavy.delta("/gc_collections/0") > light.delta("/gc_collections/0"));
}

#[test]
fn lock_convoy_shows_in_the_janitor_cpu_and_the_contention_count() {
    let front = Target::builder("Storefront").start();
    let (_, janitor) = front.threads().into_iter().next().expect("CartJanitor");
    load(&front, 30, "cart:1", 3, false); // warm-up

    let janitor_ticks = |phase: &dyn Fn() -> Phase| {
        let before = support::thread_cpu_ticks(front.pid(), janitor);
        let p = phase();
        (p, support::thread_cpu_ticks(front.pid(), janitor) - before)
    };
    let (calm, calm_ticks) = janitor_ticks(&|| Phase::run(&front, 30, "cart:1", 5));
    set_behaviour(&front, "lock_hold_ms=8&lock_period_ms=16");
    let (convoy, convoy_ticks) = janitor_ticks(&|| Phase::run(&front, 30, "cart:1", 5));
    let carts = convoy.load.count("completed") as f64;
    eprintln!(
        "carts: janitor {calm_ticks} -> {convoy_ticks} CPU ticks; contentions {} -> {} for {carts} requests; p99 {} -> {} ms",
        calm.delta("/lock_contentions"),
        convoy.delta("/lock_contentions"),
        calm.load.route("cart")["p99"],
        convoy.load.route("cart")["p99"]
    );
    // Holding the lock for 8 of every 16 ms is up to half a core (less on a loaded machine): the
    // kernel charged the janitor thread at least most of the 8 ms of each hold it counted.
    let holds = convoy.delta("/janitor_compactions");
    assert!(
        convoy_ticks >= 10 * calm_ticks.max(1) && convoy_ticks as f64 * 10.0 >= 0.8 * 8.0 * holds,
        "janitor CPU ticks {calm_ticks} -> {convoy_ticks} for {holds} holds of 8 ms"
    );
    // Requests that arrive while it holds the lock wait for it: about half of them.
    assert!(
        convoy.delta("/lock_contentions") >= 0.15 * carts,
        "{} contentions for {carts} cart requests",
        convoy.delta("/lock_contentions")
    );
    assert!(convoy.delta("/lock_contentions") >= 5.0 * calm.delta("/lock_contentions").max(1.0));
    assert_eq!(convoy.load.count("failed"), 0);
}

#[test]
fn slow_dependency_tail_shows_at_the_load_generator() {
    let (down, front) = start_pair(&[], &[]);
    load(&front, 20, "checkout:1", 3, false); // warm-up

    let usual = Phase::run(&front, 20, "checkout:1", 4);
    set_behaviour(&down, "inventory_tail_ms=400&inventory_tail_every=5");
    let down_before = stats(&down);
    let tail = Phase::run(&front, 20, "checkout:1", 5);
    let slow = stats(&down)["slow_reservations"].as_u64().unwrap()
        - down_before["slow_reservations"].as_u64().unwrap();
    let checkouts = tail.load.count("completed");
    let p = |phase: &Phase, q: &str| phase.load.route("checkout")[q].as_f64().unwrap();
    let p90 = |phase: &Phase| phase.load.exit["latency_ms"]["p90"].as_f64().unwrap();
    eprintln!(
        "checkout: p50 {} -> {} ms, p90 {} -> {} ms, p99 {} -> {} ms; {slow} slow of {checkouts}",
        p(&usual, "p50"),
        p(&tail, "p50"),
        p90(&usual),
        p90(&tail),
        p(&usual, "p99"),
        p(&tail, "p99")
    );
    assert_eq!(tail.load.count("failed"), 0, "{}", tail.load.exit);
    assert!(
        slow.abs_diff(checkouts / 5) <= 1,
        "{slow} slow of {checkouts}"
    );
    // One checkout in five waits 400 ms for its reservation: the generator sees each of them.
    let waited = tail
        .load
        .requests
        .iter()
        .filter(|r| r["latency_ms"].as_f64().unwrap() >= 400.0)
        .count() as u64;
    assert!(
        waited >= slow,
        "{waited} checkouts took 400 ms or more, {slow} reservations did"
    );
    assert!(p90(&tail) >= 400.0, "{}", tail.load.exit);
}

#[test]
fn otel_twin_exports_spans_metrics_and_logs() {
    let scratch = support::ScratchDir::new("storefront-otel");
    let receiver = Receiver::start(&scratch, 0, 0);
    let front = Target::builder("StorefrontOtel")
        .args(["--request-lines", "--behaviour", "exception_every=3"])
        .args([
            "--otlp-endpoint",
            &format!("http://127.0.0.1:{}", receiver.grpc_port),
        ])
        .env("OTEL_METRIC_EXPORT_INTERVAL", "1000")
        .env("OTEL_BSP_SCHEDULE_DELAY", "200")
        .env("OTEL_BLRP_SCHEDULE_DELAY", "200")
        .start();
    let otel = &front.ready().unwrap()["opentelemetry"];
    assert_eq!(otel["protocol"], "grpc", "{otel}");
    // 1.21.0 has no net8.0/net9.0 build: those targets carry 1.20.1 (StorefrontOtel.csproj).
    let sdk = if support::runtime_major() >= 10 {
        "1.21.0+"
    } else {
        "1.20.1+"
    };
    assert!(otel["sdk"].as_str().unwrap().starts_with(sdk), "{otel}");

    let run = load(&front, 20, "catalog:2,checkout:2,coupon:1,grpc:1", 4, true);
    let sent = run.count("sent");
    let errors = run.status("500");
    assert!(errors > 0 && run.count("failed") == errors, "{}", run.exit);
    let totals = stats(&front);
    let orders = totals["orders_placed"].as_u64().unwrap();
    let thrown = totals["coupon_exceptions"].as_u64().unwrap();
    assert_eq!(thrown, errors, "coupon failures: the generator's 500s");
    // Every checkout answered; those with a coupon may have met a failing lookup (a 500).
    let checkouts = run.route("checkout")["completed"].as_u64().unwrap();

    let sent_traces: HashMap<&str, &Value> = run
        .requests
        .iter()
        .map(|r| (r["trace_id"].as_str().unwrap(), r))
        .collect();
    // Everything the SDK should have exported by now; it exports as it goes.
    let got = collect_until_complete(&receiver, Duration::from_secs(90), |got| {
        let servers = scoped_items(got, "otlp-traces", "grpc", "spans")
            .iter()
            .filter(|s| sent_traces.contains_key(s.item["trace_id"].as_str().unwrap()))
            .filter(|s| s.item["kind"] == 2 && s.scope == "Microsoft.AspNetCore")
            .filter(|s| {
                let sent = sent_traces[s.item["trace_id"].as_str().unwrap()];
                s.item["parent_span_id"] == sent["parent_span_id"]
            })
            .count() as u64;
        let order_logs = order_records(got).len() as u64;
        let exception_logs = exception_records(got).len() as u64;
        let placed = orders_placed_metric(got);
        let durations = latest_histogram_count(got, "http.server.request.duration", "/api/orders");
        let mut missing = Vec::new();
        if servers < sent {
            missing.push(format!("{servers} of {sent} server spans"));
        }
        if order_logs < orders {
            missing.push(format!("{order_logs} of {orders} order records"));
        }
        if exception_logs < thrown {
            missing.push(format!("{exception_logs} of {thrown} exception records"));
        }
        if placed != Some(orders) {
            missing.push(format!("storefront.orders.placed {placed:?}, not {orders}"));
        }
        if durations < Some(checkouts) {
            missing.push(format!(
                "/api/orders durations {durations:?} of {checkouts}"
            ));
        }
        missing
    });

    // Spans: one server span per generated request, in its trace, a child of its traceparent; its
    // ids are the ones the service saw (Activity.Current), and the route's own span is its child.
    let spans = scoped_items(&got, "otlp-traces", "grpc", "spans");
    let by_id: HashMap<&str, &support::receiver::Scoped> = spans
        .iter()
        .map(|s| (s.item["span_id"].as_str().unwrap(), s))
        .collect();
    assert_eq!(by_id.len(), spans.len(), "a span exported twice");
    let mut front = front;
    let service_lines = lines_with(&mut front, "request");
    for line in service_lines
        .iter()
        .filter(|l| sent_traces.contains_key(l["trace_id"].as_str().unwrap()))
    {
        let server = by_id
            .get(line["span_id"].as_str().unwrap())
            .unwrap_or_else(|| panic!("no exported span for the service's request {line}"));
        assert_eq!(server.item["trace_id"], line["trace_id"]);
        assert_eq!(server.item["kind"], 2);
        if let Some(app) = line["app_span_id"].as_str() {
            let own = by_id
                .get(app)
                .unwrap_or_else(|| panic!("the route's span {app} was not exported: {line}"));
            assert_eq!(own.scope, "Storefront");
            assert_eq!(own.item["parent_span_id"], line["span_id"]);
        }
    }
    // A checkout's trace holds the reservation's client span and the downstream's server span.
    let checkout_traces: HashSet<&str> = run
        .requests
        .iter()
        .filter(|r| r["route"] == "checkout" && r["status"] == 200)
        .map(|r| r["trace_id"].as_str().unwrap())
        .collect();
    assert_eq!(checkout_traces.len() as u64, orders);
    for trace in &checkout_traces {
        let in_trace: Vec<&Value> = spans
            .iter()
            .filter(|s| s.item["trace_id"] == *trace)
            .map(|s| s.item)
            .collect();
        let reserve_server = in_trace
            .iter()
            .find(|s| s["kind"] == 2 && s["name"] == "POST /api/inventory/reserve")
            .unwrap_or_else(|| panic!("no reservation server span in trace {trace}: {in_trace:?}"));
        let client = by_id[reserve_server["parent_span_id"].as_str().unwrap()];
        assert_eq!(client.item["kind"], 3, "{}", client.item);
        assert!(in_trace.iter().any(|s| s["name"] == "checkout.place_order"));
    }

    // Metrics: the SDK's counts are the generator's and the service's.
    assert_eq!(orders_placed_metric(&got), Some(orders));
    let orders_route = latest_histogram_count(&got, "http.server.request.duration", "/api/orders");
    assert_eq!(
        orders_route,
        Some(checkouts),
        "http.server.request.duration count for /api/orders"
    );

    // Logs: the order lines with their trace, and each unhandled exception with type and stack.
    let order_logs = order_records(&got);
    assert_eq!(order_logs.len() as u64, orders);
    for record in &order_logs {
        assert_eq!(record.item["severity_number"], 9, "{}", record.item);
        assert!(checkout_traces.contains(record.item["trace_id"].as_str().unwrap()));
        assert!(
            record.item["attributes"]["OrderId"].is_i64(),
            "{}",
            record.item
        );
    }
    let exceptions = exception_records(&got);
    assert_eq!(exceptions.len() as u64, thrown);
    for record in &exceptions {
        let attributes = &record.item["attributes"];
        assert_eq!(record.item["severity_number"], 17, "{}", record.item);
        let stack = attributes["exception.stacktrace"].as_str().unwrap_or("");
        assert!(
            stack.starts_with(
                "Storefront.Pricing.CouponServiceException: coupon service unavailable"
            ) && stack.contains("at Storefront.Pricing.CouponService.Lookup("),
            "{}",
            record.item
        );
        assert!(sent_traces.contains_key(record.item["trace_id"].as_str().unwrap()));
    }
}

/// Collects what RECEIVER decodes until MISSING (what is still missing from it, in words) is empty;
/// panics after TIMEOUT with what is.
fn collect_until_complete(
    receiver: &Receiver,
    timeout: Duration,
    missing: impl Fn(&[Value]) -> Vec<String>,
) -> Vec<Value> {
    let deadline = Instant::now() + timeout;
    let mut got = Vec::new();
    loop {
        let still = missing(&got);
        if still.is_empty() {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "after {timeout:?} the receiver still lacks: {}",
            still.join("; ")
        );
        let until = Instant::now() + Duration::from_millis(500);
        while let Some(v) = receiver.next(until.saturating_duration_since(Instant::now())) {
            got.push(v);
        }
    }
}

/// The "Order … placed" records the SDK exported (category Storefront.Ordering.Checkout).
fn order_records(got: &[Value]) -> Vec<support::receiver::Scoped<'_>> {
    scoped_items(got, "otlp-logs", "grpc", "records")
        .into_iter()
        .filter(|r| r.scope == "Storefront.Ordering.Checkout")
        .filter(|r| {
            r.item["body"]
                .as_str()
                .is_some_and(|b| b.starts_with("Order {OrderId} placed"))
        })
        .collect()
}

/// The records of the coupon failures ASP.NET Core logged (Kestrel's unhandled-exception record).
/// The SDK's exception.type is the type's short name; its stack trace starts with the full one.
fn exception_records(got: &[Value]) -> Vec<support::receiver::Scoped<'_>> {
    scoped_items(got, "otlp-logs", "grpc", "records")
        .into_iter()
        .filter(|r| r.scope == "Microsoft.AspNetCore.Server.Kestrel")
        .filter(|r| r.item["attributes"]["exception.type"] == "CouponServiceException")
        .collect()
}

/// The latest cumulative total of storefront.orders.placed over its attribute sets.
fn orders_placed_metric(got: &[Value]) -> Option<u64> {
    let metrics = scoped_items(got, "otlp-metrics", "grpc", "metrics");
    let last = metrics
        .iter()
        .rfind(|m| m.scope == "Storefront" && m.item["name"] == "storefront.orders.placed")?;
    assert_eq!(last.item["temporality"], "cumulative");
    Some(
        last.item["points"]
            .as_array()?
            .iter()
            .filter_map(|p| p["value"].as_u64())
            .sum(),
    )
}

/// The latest count of histogram NAME's points with http.route ROUTE.
fn latest_histogram_count(got: &[Value], name: &str, route: &str) -> Option<u64> {
    let metrics = scoped_items(got, "otlp-metrics", "grpc", "metrics");
    let last = metrics.iter().rfind(|m| m.item["name"] == name)?;
    Some(
        last.item["points"]
            .as_array()?
            .iter()
            .filter(|p| p["attributes"]["http.route"] == route)
            .filter_map(|p| p["count"].as_u64())
            .sum(),
    )
}
