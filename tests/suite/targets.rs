//! The test-bed targets themselves (tests/targets/*.cs on a real .NET runtime): each starts, prints a
//! truthful ready line, has a diagnostic socket, and is gone once its `Target` is dropped.
//! Needs `make setup`.

use crate::support;

use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use support::{http_get, http_request, process_alive, Target};

/// Checks shared by every target: the ready line's name, pid and runtime, and the diagnostic socket.
fn check_common(target: &Target, name: &str) -> PathBuf {
    let ready = target.ready().expect("ready line");
    assert_eq!(ready["ready"], name, "{ready}");
    assert_eq!(ready["pid"].as_u64(), Some(target.pid() as u64), "{ready}");
    let runtime = ready["runtime"].as_str().expect("runtime version");
    let major: u32 = runtime.split('.').next().unwrap().parse().unwrap();
    assert!(major >= 8, "runtime {runtime}");

    let socket = target
        .wait_diagnostic_socket(Duration::from_secs(5))
        .unwrap_or_else(|| panic!("no diagnostic socket for pid {}", target.pid()));
    let file_name = socket.file_name().unwrap().to_string_lossy().into_owned();
    let key = file_name
        .strip_prefix(&format!("dotnet-diagnostic-{}-", target.pid()))
        .and_then(|k| k.strip_suffix("-socket"))
        .unwrap_or_else(|| panic!("socket name {file_name}"));
    assert!(key.parse::<u64>().is_ok(), "socket key {key:?}");
    let meta = std::fs::metadata(&socket).unwrap();
    assert!(
        meta.file_type().is_socket(),
        "{} is not a socket",
        socket.display()
    );
    socket
}

/// Drops the target and checks that the process and its diagnostic socket are gone.
fn check_drop_kills(target: Target, socket: PathBuf) {
    let pid = target.pid();
    assert!(process_alive(pid));
    drop(target);
    assert!(!process_alive(pid), "pid {pid} still running after drop");
    assert!(
        !socket.exists(),
        "{} left behind after drop",
        socket.display()
    );
}

fn thread_comm(pid: u32, tid: u64) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .unwrap_or_else(|e| panic!("thread {tid} of {pid}: {e}"))
        .trim_end()
        .to_string()
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn cpuhot_threads_split_and_socket() {
    let mut t = Target::builder("CpuHot")
        .args(["--split", "60,30,10", "--duration-seconds", "60"])
        .start();
    let socket = check_common(&t, "CpuHot");
    let ready = t.ready().unwrap().clone();
    assert_eq!(ready["split"], serde_json::json!([60, 30, 10]));
    assert_eq!(ready["tid_source"], "gettid");
    let threads = ready["threads"].as_array().unwrap();
    let expected = [
        ("SpinAlpha", 0.6, 60.0),
        ("SpinBravo", 0.3, 30.0),
        ("SpinCharlie", 0.1, 10.0),
    ];
    assert_eq!(threads.len(), expected.len());
    for (th, (name, share, busy)) in threads.iter().zip(expected) {
        assert_eq!(th["name"], name);
        assert_eq!(th["method"], format!("CpuHot.Program.{name}"));
        assert!((th["share"].as_f64().unwrap() - share).abs() < 1e-9, "{th}");
        assert!(
            (th["busy_ms_per_window"].as_f64().unwrap() - busy).abs() < 1e-9,
            "{th}"
        );
        // the OS thread id is real and the OS thread carries the name
        let tid = th["tid"].as_u64().unwrap();
        assert_ne!(tid, t.pid() as u64);
        assert_eq!(thread_comm(t.pid(), tid), name);
    }

    // the busy time follows the split (busy_ms is wall time in the busy loops, which is what a
    // managed-CPU sampler sees even on a loaded machine)
    let progress = t
        .wait_for_json(secs(10), |v| v["elapsed_s"].as_u64() == Some(1))
        .expect("progress line at 1 s");
    let busy = &progress["busy_ms"];
    let (a, b, c) = (
        busy["SpinAlpha"].as_f64().unwrap(),
        busy["SpinBravo"].as_f64().unwrap(),
        busy["SpinCharlie"].as_f64().unwrap(),
    );
    let total = a + b + c;
    assert!(total > 300.0, "{progress}");
    assert!((a / total - 0.6).abs() < 0.1, "{progress}");
    assert!((b / total - 0.3).abs() < 0.1, "{progress}");
    assert!((c / total - 0.1).abs() < 0.07, "{progress}");

    check_drop_kills(t, socket);
}

#[test]
fn cpuhot_exits_cleanly_after_duration_and_on_ctrl_c() {
    let mut t = Target::builder("CpuHot")
        .args(["--split", "1", "--duration-seconds", "0.5"])
        .start();
    let exit = t
        .wait_for_json(secs(10), |v| v.get("exit").is_some())
        .expect("exit line");
    assert_eq!(exit["exit"], "CpuHot");
    let status = t.wait_exit(secs(10)).expect("exited");
    assert!(status.success(), "{status}");

    let mut t = Target::builder("CpuHot").args(["--split", "1"]).start();
    t.interrupt();
    assert!(t
        .wait_for_json(secs(10), |v| v.get("exit").is_some())
        .is_some());
    let status = t.wait_exit(secs(10)).expect("exited on SIGINT");
    assert!(status.success(), "{status}");
}

#[test]
fn alloc_keeps_known_objects_and_churns() {
    let mut t = Target::builder("Alloc")
        .args([
            "--keep",
            "1000,500,10",
            "--blob-bytes",
            "1000",
            "--churn-per-second",
            "20000",
            "--duration-seconds",
            "60",
        ])
        .start();
    let socket = check_common(&t, "Alloc");
    let ready = t.ready().unwrap().clone();
    assert_eq!(
        ready["kept"],
        serde_json::json!({"Alloc.SmallNode": 1000, "Alloc.MediumRecord": 500, "Alloc.LargeBlob": 10})
    );
    assert_eq!(ready["blob_arrays"], 10);
    assert_eq!(ready["kept_objects"], 1000 + 500 + 2 * 10 + 3);
    let sizes = &ready["instance_bytes"];
    // 64-bit layouts (header + method table + fields, 8-byte aligned)
    assert_eq!(sizes["Alloc.SmallNode"], 40, "{sizes}");
    assert_eq!(sizes["Alloc.MediumRecord"], 80, "{sizes}");
    assert_eq!(sizes["Alloc.LargeBlob"], 40, "{sizes}");
    assert_eq!(sizes["Alloc.ChurnItem"], 40, "{sizes}");
    assert_eq!(sizes["System.Byte[]"], 1024, "{sizes}"); // 24 + 1000, aligned
    assert_eq!(ready["churn"]["type"], "Alloc.ChurnItem");
    let churn_tid = ready["churn"]["tid"].as_u64().unwrap();
    assert_eq!(thread_comm(t.pid(), churn_tid), "AllocChurn");

    let progress = t
        .wait_for_json(secs(10), |v| v.get("progress").is_some())
        .expect("progress line");
    let churned = progress["churn_allocated"].as_u64().unwrap();
    assert!((10_000..=30_000).contains(&churned), "{progress}");
    check_drop_kills(t, socket);
}

#[test]
fn alloc_million_live_objects() {
    let t = Target::builder("Alloc")
        .args([
            "--million",
            "--churn-per-second",
            "0",
            "--duration-seconds",
            "60",
        ])
        .start();
    let socket = check_common(&t, "Alloc");
    let ready = t.ready().unwrap();
    assert_eq!(ready["kept"]["Alloc.SmallNode"], 1_000_000);
    assert!(ready["kept_objects"].as_u64().unwrap() > 1_000_000);
    assert!(ready["churn"]["tid"].is_null());
    check_drop_kills(t, socket);
}

fn is_hex(v: &Value, len: usize) -> bool {
    v.as_str()
        .is_some_and(|s| s.len() == len && s.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Checks the facts every HTTP target (AsyncWeb, Bookstore) states about its server (ASP.NET Core
/// on Kestrel, of the runtime's major version) and the hosting events it emits; returns its port.
fn check_web_ready(target: &Target) -> u16 {
    let ready = target.ready().expect("ready line");
    let port = ready["port"].as_u64().unwrap() as u16;
    assert_eq!(ready["url"], format!("http://127.0.0.1:{port}/"));
    assert_eq!(ready["server"], "Kestrel");
    let major = |key: &str| ready[key].as_str().and_then(|v| v.split('.').next());
    assert_eq!(major("aspnetcore"), major("runtime"), "{ready}");
    assert_eq!(ready["diagnostic_listener"], "Microsoft.AspNetCore");
    assert_eq!(
        ready["hosting_activity"],
        "Microsoft.AspNetCore.Hosting.HttpRequestIn"
    );
    assert_eq!(
        ready["hosting_event_source"],
        "Microsoft.AspNetCore.Hosting"
    );
    assert_eq!(ready["id_format"], "W3C");
    port
}

#[test]
fn asyncweb_serves_spans_and_switches_threads() {
    let mut t = Target::builder("AsyncWeb")
        .args(["--duration-seconds", "60"])
        .start();
    let socket = check_common(&t, "AsyncWeb");
    let port = check_web_ready(&t);
    assert_eq!(t.ready().unwrap()["meter"], "AsyncWeb");

    for kind in ["alpha", "bravo"] {
        let resp = http_get(port, &format!("/{kind}"), &[]);
        assert_eq!(resp.status, 200, "{resp:?}");
        let body = resp.json();
        let line = t
            .wait_for_json(secs(10), |v| v.get("request").is_some())
            .expect("request line");
        assert_eq!(line, body, "the response body is the request line");
        assert_eq!(line["kind"], kind);
        assert_eq!(line["path"], format!("/{kind}"));
        assert!(is_hex(&line["trace_id"], 32), "{line}");
        assert!(is_hex(&line["span_id"], 16), "{line}");
        assert!(is_hex(&line["hosting_span_id"], 16), "{line}");
        assert_ne!(line["span_id"], line["hosting_span_id"]);
        assert!(line["parent_span_id"].is_null());
        // ASP.NET Core's server span stops after the response: its own line, which holds the
        // pipeline the first middleware timed inside it
        let hosting = t
            .wait_for_json(secs(10), |v| v["hosting"] == line["request"])
            .expect("hosting line");
        assert_eq!(hosting["hosting_span_id"], line["hosting_span_id"]);
        assert_eq!(hosting["trace_id"], line["trace_id"]);
        let pipeline_ms = hosting["pipeline_ms"].as_f64().unwrap();
        assert!(
            pipeline_ms >= line["span_ms"].as_f64().unwrap(),
            "{hosting} {line}"
        );
        assert!(
            hosting["hosting_duration_ms"].as_f64().unwrap() + 0.001 >= pipeline_ms,
            "{hosting}"
        );
        assert!(line["inner_span_id"].is_null(), "{line}");
        // the continuation after the await runs on another thread-pool thread
        assert_eq!(line["switched_thread"], true, "{line}");
        assert_ne!(line["tid_before"], line["tid_after"]);
        assert_ne!(line["thread_before"], line["thread_after"]);
        for key in ["tid_before", "tid_after"] {
            let tid = line[key].as_u64().unwrap();
            assert!(
                std::path::Path::new(&format!("/proc/{}/task/{tid}", t.pid())).exists(),
                "{key} {tid} is not a thread of {}",
                t.pid()
            );
        }
    }

    // /charlie: an inner span nested in the request's span, after the await
    let body = http_get(port, "/charlie", &[]).json();
    assert_eq!(body["kind"], "charlie");
    assert!(is_hex(&body["inner_span_id"], 16), "{body}");
    assert_ne!(body["inner_span_id"], body["span_id"]);
    assert_eq!(body["switched_thread"], true, "{body}");
    t.wait_for_json(secs(10), |v| v.get("request").is_some())
        .expect("request line");

    // an incoming W3C traceparent is honoured, ?status sets the status code
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let parent = "b7ad6b7169203331";
    let resp = http_get(
        port,
        "/bravo?status=503",
        &[("traceparent", &format!("00-{trace}-{parent}-01"))],
    );
    assert_eq!(resp.status, 503);
    let body = resp.json();
    assert_eq!(body["trace_id"], trace);
    assert_eq!(body["parent_span_id"], parent);
    assert_eq!(body["status"], 503);

    let resp = http_get(port, "/nope", &[]);
    assert_eq!(resp.status, 404);
    assert!(resp.json()["kind"].is_null());

    check_drop_kills(t, socket);
}

#[test]
fn asyncweb_self_load() {
    let mut t = Target::builder("AsyncWeb")
        .args([
            "--self-load",
            "40",
            "--no-request-lines",
            "--duration-seconds",
            "60",
        ])
        .start();
    let socket = check_common(&t, "AsyncWeb");
    // the first requests are slow (JIT of the HTTP stacks on both sides): wait for 20 answers
    let progress = t
        .wait_for_json(secs(20), |v| {
            v.get("progress").is_some() && v["self_load"]["ok"].as_u64() >= Some(20)
        })
        .expect("20 self-load requests answered within 20 s");
    let load = &progress["self_load"];
    assert_eq!(load["failed"], 0, "{progress}");
    let requests = &progress["requests"];
    assert!(requests["alpha"].as_u64().unwrap() >= 10, "{progress}");
    assert!(requests["bravo"].as_u64().unwrap() >= 10, "{progress}");
    assert_eq!(t.dropped_lines(), 0);
    check_drop_kills(t, socket);
}

#[test]
fn bookstore_endpoints_behave() {
    let mut t = Target::builder("Bookstore")
        .args([
            "--books",
            "50",
            "--payment-ms",
            "1",
            "--payment-slow-ms",
            "150",
            "--payment-slow-every",
            "2",
            "--leak-kb",
            "64",
            "--leak-limit-mb",
            "1",
            "--duration-seconds",
            "60",
        ])
        .start();
    let socket = check_common(&t, "Bookstore");
    let port = check_web_ready(&t);
    let ready = t.ready().unwrap().clone();
    assert_eq!(ready["meter"], "Bookstore.Ordering");
    assert_eq!(ready["histogram"], "bookstore.payment.duration");
    assert_eq!(
        ready["endpoints"]["GET /reports/sales.csv"],
        "Bookstore.Reports.SalesReport.ExportCsv"
    );
    let request_line = |t: &mut Target, route: &str| {
        t.wait_for_json(secs(10), |v| v["route"] == route)
            .unwrap_or_else(|| panic!("no request line for {route}"))
    };

    // the catalogue, searchable, and one book
    let all = http_get(port, "/books", &[]).json();
    assert_eq!(all["books"].as_array().unwrap().len(), 50, "{all}");
    let line = request_line(&mut t, "books");
    assert_eq!(line["status"], 200);
    assert!(is_hex(&line["trace_id"], 32), "{line}");
    assert!(is_hex(&line["span_id"], 16), "{line}");
    assert!(is_hex(&line["hosting_span_id"], 16), "{line}");
    let found = http_get(port, "/books?q=KNUTH", &[]).json();
    let found = found["books"].as_array().unwrap();
    assert!(!found.is_empty() && found.len() < 50);
    assert!(found
        .iter()
        .all(|b| b["author"].as_str().unwrap().contains("Knuth")));
    let book = http_get(port, "/books/7", &[]);
    assert_eq!(book.status, 200);
    assert_eq!(book.json()["id"], 7);
    assert_eq!(http_get(port, "/books/51", &[]).status, 404);

    // the report: a header, one line per row, a total
    let report = http_get(port, "/reports/sales.csv?rows=120", &[]);
    assert_eq!(report.status, 200);
    assert_eq!(report.header("content-type"), Some("text/csv"));
    let rows: Vec<&str> = report.body.lines().collect();
    assert_eq!(rows.len(), 1 + 120 + 1, "{}", report.body);
    assert!(rows[0].starts_with("order_id,placed_at,customer,title"));
    assert!(rows[121].starts_with("total,"));
    assert_eq!(http_get(port, "/reports/sales.csv?rows=0", &[]).status, 400);

    // payments: every 2nd is slow, and a span of its own under the request's
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let traceparent = format!("00-{trace}-b7ad6b7169203331-01");
    let mut slow = 0;
    for _ in 0..2 {
        let paid = http_request(
            port,
            "POST",
            "/orders?book=3&quantity=2",
            &[("traceparent", &traceparent)], // (Content-Length: 0 comes with any POST)
        );
        assert_eq!(paid.status, 200, "{paid:?}");
        let receipt = paid.json();
        assert_eq!(receipt["status"], "paid");
        assert_eq!(receipt["quantity"], 2);
        if receipt["slow_payment"] == true {
            slow += 1;
            assert!(
                receipt["payment_ms"].as_f64().unwrap() >= 140.0,
                "{receipt}"
            );
        }
        let line = request_line(&mut t, "order");
        assert_eq!(line["trace_id"], trace);
    }
    assert_eq!(slow, 1);
    assert_eq!(http_get(port, "/orders", &[]).status, 405);

    // the leak grows per request up to its limit (1 MiB = 16 requests of 64 KiB)
    for user in 0..20 {
        let answer = http_get(port, &format!("/recommendations?user={user}"), &[]).json();
        assert_eq!(answer["books"].as_array().unwrap().len(), 5);
    }
    let progress = t
        .wait_for_json(secs(10), |v| {
            v.get("progress").is_some() && v["requests"]["recommend"] == 20
        })
        .expect("a progress line after the 20 recommendations");
    assert_eq!(progress["leaked_bytes"], 1 << 20, "{progress}");
    assert_eq!(progress["payments"]["count"], 2, "{progress}");
    assert_eq!(progress["payments"]["slow"], 1, "{progress}");
    assert_eq!(progress["requests"]["report"], 2, "{progress}"); // the 400 counts too

    assert_eq!(http_get(port, "/health", &[]).body, "ok\n");
    assert_eq!(http_get(port, "/nope", &[]).status, 404);
    check_drop_kills(t, socket);
}

#[test]
fn bookstore_self_load_mix_is_bounded() {
    let mut t = Target::builder("Bookstore")
        .args([
            "--self-load",
            "20",
            "--self-load-seconds",
            "4",
            "--self-load-mix",
            "books:2,order:1,report:1,recommend:1",
            "--report-rows",
            "200",
            "--payment-ms",
            "1",
            "--no-request-lines",
            "--duration-seconds",
            "60",
        ])
        .start();
    let socket = check_common(&t, "Bookstore");
    let ready = t.ready().unwrap().clone();
    assert_eq!(ready["self_load_seconds"], 4.0);
    assert_eq!(
        ready["self_load_mix"],
        serde_json::json!({"books": 2, "order": 1, "report": 1, "recommend": 1})
    );
    // the load stops after 4 s: the totals stop moving
    let settled = t
        .wait_for_json(secs(30), |v| {
            v.get("progress").is_some() && v["elapsed_s"].as_u64() >= Some(8)
        })
        .expect("progress at 8 s");
    let load = &settled["self_load"];
    let sent = load["sent"].as_u64().unwrap();
    assert!((40..=100).contains(&sent), "{settled}");
    assert_eq!(load["failed"], 0, "{settled}");
    assert_eq!(load["ok"], load["sent"], "{settled}");
    let requests = &settled["requests"];
    for route in ["books", "order", "report", "recommend"] {
        assert!(requests[route].as_u64().unwrap() >= 5, "{route}: {settled}");
    }
    let later = t
        .wait_for_json(secs(10), |v| v.get("progress").is_some())
        .expect("a later progress line");
    assert_eq!(later["self_load"]["sent"], sent, "{later}");
    check_drop_kills(t, socket);
}

#[test]
fn faults_rates_and_event_source() {
    let mut t = Target::builder("Faults")
        .args([
            "--exceptions-per-second",
            "50",
            "--secondary-per-second",
            "10",
            "--duration-seconds",
            "60",
        ])
        .start();
    let socket = check_common(&t, "Faults");
    let ready = t.ready().unwrap().clone();
    let injected = &ready["exceptions"]["Faults.InjectedFaultException"];
    assert_eq!(injected["per_second"], 50.0);
    assert_eq!(injected["base"], "System.InvalidOperationException");
    assert_eq!(
        thread_comm(t.pid(), injected["tid"].as_u64().unwrap()),
        "FaultInjector"
    );
    let secondary = &ready["exceptions"]["Faults.SecondaryFaultException"];
    assert_eq!(secondary["base"], "System.ArgumentException");
    let source = &ready["event_source"];
    assert_eq!(source["name"], "Clrscope-Test-Faults");
    assert_eq!(source["events"][0]["id"], 1);
    assert_eq!(source["events"][0]["name"], "FaultInjected");
    assert_eq!(
        source["events"][0]["fields"],
        serde_json::json!(["Sequence", "Kind", "Value"])
    );
    assert_eq!(source["guid"].as_str().unwrap().len(), 36);
    assert_eq!(ready["lock"]["contentions_per_second"], 40.0);

    // paced against a clock: after 2 s, about 2 s worth (the first throws are slow, hence the slack)
    let progress = t
        .wait_for_json(secs(10), |v| v["elapsed_s"].as_u64() == Some(2))
        .expect("progress line at 2 s");
    let totals = &progress["totals"];
    let n = totals["exceptions"]["Faults.InjectedFaultException"]
        .as_u64()
        .unwrap();
    assert!((75..=125).contains(&n), "{progress}");
    let n = totals["exceptions"]["Faults.SecondaryFaultException"]
        .as_u64()
        .unwrap();
    assert!((15..=25).contains(&n), "{progress}");
    assert!(
        totals["lock_episodes"].as_u64().unwrap() >= 20,
        "{progress}"
    );
    assert!(totals["contentions"].as_u64().unwrap() >= 20, "{progress}");

    t.interrupt();
    let exit = t
        .wait_for_json(secs(10), |v| v.get("exit").is_some())
        .expect("exit line after Ctrl-C");
    assert!(exit["totals"]["events"].as_u64().unwrap() >= 50, "{exit}");
    assert!(t.wait_exit(secs(10)).expect("exited").success());
    // a clean exit removes the socket itself
    assert!(!socket.exists());
}

#[test]
fn throughput_counts_operations_and_blocks_idle_threads() {
    let mut t = Target::builder("Throughput")
        .args([
            "--threads",
            "2",
            "--blocked-threads",
            "3",
            "--duration-seconds",
            "3",
        ])
        .start();
    let socket = check_common(&t, "Throughput");
    let ready = t.ready().unwrap().clone();
    // the same operations give the same result on every run
    assert_eq!(ready["op_checksum"], -6949901295532620184_i64, "{ready}");
    let workers = ready["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 2, "{ready}");
    let blocked = ready["blocked"].as_array().unwrap();
    assert_eq!(blocked.len(), 3, "{ready}");
    for th in workers.iter().chain(blocked) {
        let name = th["name"].as_str().unwrap();
        assert_eq!(thread_comm(t.pid(), th["tid"].as_u64().unwrap()), name);
    }
    // blocked threads sleep; they do not spin
    for th in blocked {
        let tid = th["tid"].as_u64().unwrap();
        let stat = std::fs::read_to_string(format!("/proc/{}/task/{tid}/stat", t.pid())).unwrap();
        let state = stat
            .rsplit(')')
            .next()
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap();
        assert_eq!(state, "S", "{} {stat}", th["name"]);
    }

    let progress = t
        .wait_for_json(secs(10), |v| v["elapsed_s"].as_u64() == Some(1))
        .expect("progress line at 1 s");
    assert!(progress["ops"].as_u64().unwrap() > 0, "{progress}");
    assert!(
        progress["allocated_bytes"].as_i64().unwrap() > 0,
        "{progress}"
    );
    let exit = t
        .wait_for_json(secs(10), |v| v.get("exit").is_some())
        .expect("exit line");
    let per_worker = exit["per_worker"].as_array().unwrap();
    let sum: u64 = per_worker.iter().map(|n| n.as_u64().unwrap()).sum();
    assert!(sum >= exit["total_ops"].as_u64().unwrap(), "{exit}");
    assert!(t.wait_exit(secs(10)).expect("exited").success());
    assert!(!socket.exists());
}

/// Activities runs its iterations at the rate asked, and its DiagnosticListener-only activities
/// are what its header says: the child under the span and recorded (inherited flags), the marked
/// root recorded, the other root not.
#[test]
fn activities_runs_spans_and_diagnostic_listener_activities() {
    let mut t = Target::builder("Activities")
        .args(["--legacy", "--spans-per-second", "100", "--tags", "2"])
        .start();
    let socket = check_common(&t, "Activities");
    let progress = t
        .wait_for_json(secs(20), |v| v["elapsed_s"].as_u64() >= Some(3))
        .expect("3 s of progress");
    // Paced from the start: 3 s at 100 a second, give or take the first and last step.
    let done = progress["iterations"].as_u64().unwrap();
    assert!((270..=360).contains(&done), "{progress}");
    let line = t
        .wait_for_json(secs(5), |v| v["iteration"].is_u64())
        .expect("an iteration line");
    assert!(is_hex(&line["span_id"], 16), "{line}");
    let i = line["iteration"].as_u64().unwrap().to_string();
    assert_eq!(
        line["span_tags"],
        serde_json::json!({"activities.i0": i, "activities.i1": "value-1"})
    );
    let legacy = &line["legacy"];
    assert_eq!(legacy["child"]["parent_span_id"], line["span_id"], "{line}");
    assert_eq!(legacy["child"]["trace_id"], line["trace_id"], "{line}");
    // From .NET 11 an activity whose trace id the runtime generated carries the W3C level 2
    // random flag, ActivityTraceFlags.RandomTraceId (dotnet/runtime#124851), and the child
    // inherits it with its trace id.
    let (recorded, unrecorded) = if support::runtime_major() >= 11 {
        ("Recorded, RandomTraceId", "RandomTraceId")
    } else {
        ("Recorded", "None")
    };
    assert_eq!(legacy["child"]["flags"], recorded, "{line}");
    assert_eq!(legacy["root"]["flags"], recorded, "{line}");
    assert_eq!(legacy["root"]["parent_span_id"], Value::Null, "{line}");
    assert_eq!(legacy["unrecorded"]["flags"], unrecorded, "{line}");
    assert_eq!(t.dropped_lines(), 0);
    check_drop_kills(t, socket);
}
