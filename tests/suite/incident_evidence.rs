//! Issue 49: what an incident shows besides the CPU diff, on the real Storefront, judged against
//! the counts the service reports (`GET /admin/stats`). An exception storm switched on under load
//! makes an exception-count rule fire, and the incident lists the service's exception type first
//! among those new or grown, with counts that match the service's within the window's edges, on
//! the API and on the incident page in Chromium. Each incident made, by a rule or a mark, reaches
//! the OTLP receiver (the official protos) as one log record naming it, with a link back. With a
//! slow dependency (the downstream's reservation tail) switched on and marked, the incident's
//! slowest spans are the slow reservations, as many as the service counted.

use crate::storefront::{fact, load, port, set_behaviour, start_pair};
use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use support::agent::{data_dir, Agent};
use support::browser::{node, CHROMIUM};
use support::receiver::{scoped_items, Receiver};
use support::{http_get, http_request_with_body, Target};

const COUPON_EXCEPTION: &str = "Storefront.Pricing.CouponServiceException";
const COUPON_LOOKUP: &str = "Storefront.Pricing.CouponService.Lookup";
/// Coupon lookups a second, and every how many one throws with the storm on: 10 throws a second.
const RPS: u32 = 20;
const EXCEPTION_EVERY: u32 = 2;
/// The agent's flush interval: a batch of counted exceptions is stamped once per flush, so a
/// window's edge may put up to one flush of throws on the other side.
const FLUSH: Duration = Duration::from_secs(2);

fn unix_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1000.0
}

fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < deadline, "{what} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The service's counts (`/admin/stats`) every 200 ms: (unix ms, the value at `pointer`).
struct StatsLedger {
    points: Arc<Mutex<Vec<(f64, f64)>>>,
    stop: Arc<AtomicBool>,
}

impl StatsLedger {
    fn start(front: &Target, pointer: &'static str) -> StatsLedger {
        let port = port(front);
        let points = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (out, done) = (points.clone(), stop.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let t0 = unix_ms();
                // A refused connection under load is skipped: the next point comes 200 ms later.
                let count = std::panic::catch_unwind(|| {
                    http_get(port, "/admin/stats", &[])
                        .json()
                        .pointer(pointer)?
                        .as_f64()
                });
                let t1 = unix_ms();
                // The count is taken somewhere within the round trip: a long one pairs loosely.
                if let Some(count) = count.ok().flatten().filter(|_| t1 - t0 <= 1000.0) {
                    out.lock().unwrap().push(((t0 + t1) / 2.0, count));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        StatsLedger { points, stop }
    }

    /// The count at `t` (ms), interpolated.
    fn at(&self, t: f64) -> f64 {
        let points = self.points.lock().unwrap();
        assert!(points.len() >= 2, "the service answered /admin/stats");
        let i = points
            .partition_point(|p| p.0 < t)
            .clamp(1, points.len() - 1);
        let (a, b) = (points[i - 1], points[i]);
        let f = ((t - a.0) / (b.0 - a.0)).clamp(0.0, 1.0);
        a.1 + f * (b.1 - a.1)
    }

    /// How much the count grew over `[from, until)` ms.
    fn over(&self, from: f64, until: f64) -> f64 {
        self.at(until) - self.at(from)
    }
}

impl Drop for StatsLedger {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// `POST /api/v1/incidents`: a mark on `pid` now; the incident it made or joined.
fn mark(agent: &Agent, pid: u32, note: &str) -> Value {
    let body = json!({"pids": [pid], "note": note}).to_string();
    let auth = format!("Bearer {}", agent.token());
    let headers = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    let path = "/api/v1/incidents";
    let answer = http_request_with_body(agent.port, "POST", path, &headers, body.as_bytes());
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.json()
}

/// StorefrontLoad against `front` at `rps` with `mix` for `seconds`, in the background.
fn background_load(front: &Target, rps: u32, mix: &str, seconds: u32) -> Target {
    Target::builder("StorefrontLoad")
        .args(["--target", &fact(front, "/url")])
        .args(["--grpc-target", &fact(front, "/grpc_url")])
        .args(["--rps", &rps.to_string(), "--mix", mix])
        .args(["--duration-seconds", &seconds.to_string()])
        .start()
}

/// An agent on `pid` with `rules`, incident windows of 40 s before and 20 s after, exporting
/// `signals` to `receiver` every second, with `extra` arguments.
fn agent_with_rules(
    dir: &std::path::Path,
    pid: u32,
    rules: Value,
    (receiver, signals): (&Receiver, &[&str]),
    extra: &[&str],
) -> Agent {
    std::fs::create_dir_all(dir).unwrap();
    let settings = dir.join("settings.json");
    let exporter = json!({"Kind": "otlp-grpc", "Interval": "1s", "Signals": signals,
        "Endpoint": format!("http://127.0.0.1:{}", receiver.grpc_port)});
    let config = json!({"CollectionRules": rules, "GlobalCounter": {"IntervalSeconds": 1},
        "Exporters": {"receiver": exporter}});
    std::fs::write(&settings, config.to_string()).unwrap();
    let flush = format!("{}s", FLUSH.as_secs());
    let pid = format!("--pid={pid}");
    let mut args = vec![
        "--config",
        settings.to_str().unwrap(),
        "--incident-before",
        "40s",
        "--incident-after",
        "20s",
        "--flush-interval",
        &flush,
        &pid,
    ];
    args.extend_from_slice(extra);
    Agent::start(&dir.join("data"), &args)
}

/// The incident records the receiver got (scope `clrscope.incidents`), waiting until `count`
/// came and then two export intervals more for any extra one.
fn incident_records(receiver: &Receiver, count: usize) -> Vec<(Value, Value)> {
    let records = |got: &[Value]| -> Vec<(Value, Value)> {
        scoped_items(got, "otlp-logs", "grpc", "records")
            .into_iter()
            .filter(|r| r.scope == "clrscope.incidents")
            .map(|r| (r.item.clone(), r.resource.clone()))
            .collect()
    };
    let mut got =
        receiver.collect_until(Duration::from_secs(60), |got| records(got).len() >= count);
    let quiet = Instant::now() + Duration::from_secs(3);
    while let Some(more) = receiver.next(quiet.saturating_duration_since(Instant::now())) {
        got.push(more);
    }
    records(&got)
}

/// One incident record as `incident` says: its attributes, its resource, its link.
fn check_incident_record(record: &(Value, Value), incident: &Value, rules: &str) {
    let (item, resource) = record;
    let id = incident["id"].as_u64().unwrap();
    let process = &incident["processes"][0];
    let attribute = |key: &str| {
        item["attributes"][key]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(attribute("incident.id"), id.to_string(), "{item}");
    assert_eq!(attribute("incident.rules"), rules, "{item}");
    assert_eq!(
        attribute("incident.process_ids"),
        process["pid"].to_string(),
        "{item}"
    );
    assert_eq!(
        attribute("incident.service_names"),
        process["service_name"],
        "{item}"
    );
    for key in ["onset_unix_ms", "from_unix_ms"] {
        assert_eq!(
            attribute(&format!("incident.{key}")),
            incident[key].to_string(),
            "{item}"
        );
    }
    let link = format!("/#view=incidents&incident={id}");
    assert_eq!(attribute("incident.link"), link, "{item}");
    assert!(item["body"].as_str().unwrap().ends_with(&link), "{item}");
    assert_eq!(item["severity_text"], "Warning", "{item}");
    assert_eq!(resource["process.pid"], process["pid"], "{resource}");
    assert_eq!(
        resource["service.name"], process["service_name"],
        "{resource}"
    );
}

#[test]
fn an_exception_storm_lists_the_thrown_type_first_with_the_services_count() {
    let front = Target::builder("Storefront").start();
    load(&front, 30, "coupon:1", 5, false); // through the JIT's tiers
    let pid = front.pid();
    let dir = data_dir("incident-exceptions");
    // The runtime's exception counter a second, over 3 s: quiet before the storm, ~10 (and
    // the rethrows of the request pipeline) during.
    let rules = json!({"ExceptionStorm": {
        "Filters": [{"Key": "ProcessId", "Value": pid.to_string()}],
        "Trigger": {"Type": "EventCounter", "Settings": {
            "ProviderName": "System.Runtime", "CounterName": "exception-count",
            "GreaterThan": 4, "SlidingWindowDuration": "00:00:03"}},
        "Limits": {"ActionCount": 1}
    }});
    let receiver = Receiver::start(&dir.join("received"), 0, 0);
    let agent = agent_with_rules(&dir, pid, rules, (&receiver, &["Logs"]), &[]);
    agent.wait_attached(pid, true, Duration::from_secs(30));
    let ledger = StatsLedger::start(&front, "/coupon_exceptions");
    let runtime_thrown = StatsLedger::start(&front, "/exceptions_thrown");

    let _load = background_load(&front, RPS, "coupon:1", 300);
    std::thread::sleep(Duration::from_secs(25)); // "before": lookups without exceptions
    assert_eq!(
        agent.get(&format!("/api/v1/incidents?pid={pid}")).json(),
        json!([]),
        "the rule fired before the storm: {}",
        agent.log()
    );
    set_behaviour(&front, &format!("exception_every={EXCEPTION_EVERY}"));
    let incident = wait_for(Duration::from_secs(120), "an incident", || {
        let list = agent.get(&format!("/api/v1/incidents?pid={pid}&rule=ExceptionStorm"));
        list.json().as_array()?.first().cloned()
    });
    // The storm goes on for 15 s after the firing, then stops well inside the window, so the
    // window's end cuts no throws.
    std::thread::sleep(Duration::from_secs(15));
    set_behaviour(&front, "exception_every=0");
    let id = incident["id"].as_u64().unwrap();
    let until = incident["until_unix_ms"].as_f64().unwrap();
    wait_for(Duration::from_secs(120), "the window to close", || {
        (unix_ms() > until + 3.0 * FLUSH.as_millis() as f64).then_some(())
    });

    let answer = agent
        .get(&format!("/api/v1/incidents/{id}/exceptions?limit=5"))
        .json();
    let ms = |key: &str| answer[key].as_f64().unwrap();
    let first = &answer["exceptions"][0];
    let count = |key: &str| first[key].as_f64().unwrap();
    let (before_from, onset, during_until) = (
        ms("before_from_unix_ms"),
        ms("during_from_unix_ms"),
        ms("during_until_unix_ms"),
    );
    // Made: the service's count of its coupon failures; thrown: the runtime's first-chance
    // count in the process (an await passes each failure on, throwing it again).
    let made = (
        ledger.over(before_from, onset),
        ledger.over(onset, during_until),
    );
    let thrown = (
        runtime_thrown.over(before_from, onset),
        runtime_thrown.over(onset, during_until),
    );
    let rate = EXCEPTION_EVERY as f64 / RPS as f64 * 1000.0; // failures a second
    let edge = 2.0 * rate * (FLUSH.as_secs_f64() + 1.0);
    eprintln!(
        "incident {id}: {answer}\nthe service made {:.1} {COUPON_EXCEPTION} before the onset and \
         {:.1} during, and the runtime threw {:.1} exceptions of every type before and {:.1} \
         during; the agent counted {} and {} ({} thrown at {})",
        made.0,
        made.1,
        thrown.0,
        thrown.1,
        first["before"],
        first["during"],
        first["thrown_at_count"],
        first["thrown_at"],
    );
    assert_eq!(first["type_name"], COUPON_EXCEPTION, "{answer}");
    assert!(
        first["thrown_at"]
            .as_str()
            .unwrap()
            .starts_with(COUPON_LOOKUP),
        "{answer}"
    );
    // Every throw of the window is counted on one side or the other, the onset's edge may put
    // up to a flush of them on the wrong side, and the window's end cuts none (the storm ended
    // inside it).
    let all = ms("before_total") + ms("during_total");
    assert!(
        (all - (thrown.0 + thrown.1)).abs() <= 1.0,
        "{all} throws counted in the window against the runtime's {}: {answer}",
        thrown.0 + thrown.1
    );
    assert!((ms("during_total") - thrown.1).abs() <= edge, "{answer}");
    // Those from Lookup are the failures the service made.
    assert!(
        (count("thrown_at_count") - made.1).abs() <= edge / 2.0,
        "{answer}"
    );
    assert!(count("thrown_at_count") >= 100.0, "{answer}");

    // The incident page in Chromium shows the same row first.
    let page = node(
        "incident.cjs",
        json!({"url": format!("http://127.0.0.1:{}", agent.port), "token": agent.token(),
               "incident": id, "artifacts": &*dir, "chromium": CHROMIUM, "exceptions": true}),
    );
    assert_eq!(page["errors"], json!([]), "{page}");
    let row = &page["exceptions"][0];
    assert_eq!(row[0], COUPON_EXCEPTION, "{page}");
    assert_eq!(row[1], first["before"].to_string(), "{page}");
    assert_eq!(row[2], first["during"].to_string(), "{page}");
    assert!(row[3].as_str().unwrap().contains(COUPON_LOOKUP), "{page}");

    // One record of the incident reached the log backend.
    let records = incident_records(&receiver, 1);
    assert_eq!(records.len(), 1, "{records:?}");
    check_incident_record(&records[0], &incident, "ExceptionStorm");
    let trigger = records[0].0["attributes"]["incident.trigger"]
        .as_str()
        .unwrap();
    assert!(trigger.contains("exception-count > 4"), "{trigger}");
}

/// A mark set through the API makes an incident, exported once; a second mark within its
/// window joins it and exports nothing more.
#[test]
fn a_marked_incident_is_exported_once_as_an_otlp_log_record() {
    let front = Target::builder("Storefront").start();
    let pid = front.pid();
    let dir = data_dir("incident-otlp");
    let receiver = Receiver::start(&dir.join("received"), 0, 0);
    let agent = agent_with_rules(&dir, pid, json!({}), (&receiver, &["Logs"]), &[]);
    agent.wait_attached(pid, true, Duration::from_secs(30));
    let incident = mark(&agent, pid, "deploy 4711");
    let joined = mark(&agent, pid, "still slow");
    assert_eq!(joined["id"], incident["id"], "{joined}");
    let records = incident_records(&receiver, 1);
    assert_eq!(records.len(), 1, "{records:?}");
    check_incident_record(&records[0], &incident, "mark");
    assert_eq!(
        records[0].0["attributes"]["incident.trigger"],
        "deploy 4711"
    );
}

/// Reservations slower than this are the tail; the others take next to nothing.
const TAIL_MS: u32 = 400;
/// Every how many reservations one is slow, and checkouts a second: one slow every 4 s, so a
/// minute's 15 slow reservations and their 15 server spans fit in the 32 kept a minute.
const TAIL_EVERY: u32 = 40;
const CHECKOUT_RPS: u32 = 10;

#[test]
#[ignore = "not passing yet: the agent sees next to no finished span of the plain downstream \
            Storefront with --trace-linkage and a Traces exporter (1 span in 60 s under 10 \
            checkouts a second: 1 kept, 1 exported to the receiver, so not the keeping); an \
            AspNetRequestDuration rule beside trace linkage never fired (30 slow reservations \
            in 120 s), so the incident is a mark"]
fn a_slow_dependency_shows_its_slow_reservations_as_the_slowest_spans() {
    let (down, front) = start_pair(&[], &[]);
    load(&front, 20, "checkout:1", 5, false); // through the JIT's tiers
    let pid = down.pid();
    let dir = data_dir("incident-spans");
    // The incident is a mark set at the switch: a request-duration rule (AspNetRequestDuration)
    // never fired beside trace linkage (30 slow reservations in 120 s), which spans need; both
    // configure the process-wide DiagnosticSourceEventSource.
    let receiver = Receiver::start(&dir.join("received"), 0, 0);
    let signals: &[&str] = &["Traces"];
    let agent = agent_with_rules(
        &dir,
        pid,
        json!({}),
        (&receiver, signals),
        &["--trace-linkage"],
    );
    agent.wait_attached(pid, true, Duration::from_secs(30));
    let slow = StatsLedger::start(&down, "/slow_reservations");
    let _load = background_load(&front, CHECKOUT_RPS, "checkout:1", 300);
    std::thread::sleep(Duration::from_secs(30)); // "before": no tail
    set_behaviour(
        &down,
        &format!("inventory_tail_ms={TAIL_MS}&inventory_tail_every={TAIL_EVERY}"),
    );
    let incident = mark(&agent, pid, "inventory tail on");
    std::thread::sleep(Duration::from_secs(15));
    set_behaviour(&down, "inventory_tail_ms=0");
    let id = incident["id"].as_u64().unwrap();
    let until = incident["until_unix_ms"].as_f64().unwrap();
    wait_for(Duration::from_secs(120), "the window to close", || {
        (unix_ms() > until + 2000.0).then_some(())
    });

    let answer = agent
        .get(&format!("/api/v1/incidents/{id}/spans?limit=1000"))
        .json();
    let during = &answer["during"];
    let spans = during["spans"].as_array().unwrap();
    let ms = |v: &Value| v.as_f64().unwrap();
    let truth = slow.over(ms(&during["from_unix_ms"]), ms(&during["until_unix_ms"]));
    let slow_reserves: Vec<&Value> = spans
        .iter()
        .filter(|s| s["name"] == "inventory.reserve" && s["tags"]["inventory.slow"] == "True")
        .collect();
    eprintln!(
        "incident {id}: {} spans ended during, {} kept slowest listed, {} of them slow \
         reservations; the service counted {truth:.1} slow reservations; first {}",
        during["seen"],
        spans.len(),
        slow_reserves.len(),
        spans.first().unwrap_or(&Value::Null)
    );
    assert_eq!(answer["attached"], true, "{answer}");
    assert!(truth >= 3.0, "{answer}");
    // A reservation the service counts at an edge of the window may end on the other side.
    assert!(
        (slow_reserves.len() as f64 - truth).abs() <= 1.0,
        "{} slow reservations listed against the service's {truth}: {answer}",
        slow_reserves.len()
    );
    assert!(
        ms(&spans[0]["duration_ms"]) >= f64::from(TAIL_MS),
        "{answer}"
    );
    for span in &slow_reserves {
        assert!(ms(&span["duration_ms"]) >= f64::from(TAIL_MS), "{span}");
    }
    // Before the switch no reservation was slow.
    let before = answer["before"]["spans"].as_array().unwrap();
    assert!(
        before
            .iter()
            .all(|s| ms(&s["duration_ms"]) < f64::from(TAIL_MS)),
        "{answer}"
    );

    // The page lists the same slowest span first.
    let page = node(
        "incident.cjs",
        json!({"url": format!("http://127.0.0.1:{}", agent.port), "token": agent.token(),
               "incident": id, "artifacts": &*dir, "chromium": CHROMIUM, "spans": true}),
    );
    assert_eq!(page["errors"], json!([]), "{page}");
    assert_eq!(page["spans"][0]["name"], spans[0]["name"], "{page}");
    let shown: f64 = page["spans"][0]["duration_ms"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (shown - ms(&spans[0]["duration_ms"])).abs() < 0.006,
        "{page}"
    );
    assert_eq!(
        page["spans"].as_array().unwrap().len(),
        spans.len().min(20),
        "{page}"
    );
}
