//! Heap snapshots of real .NET 8 processes: the library and `clrscope gcdump`.

use crate::support;

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use collector::client::DiagnosticsClient;
use collector::gcdump::{self, SnapshotOptions};
use serde_json::Value;
use support::Target;

const KEPT: [(&str, u64); 3] = [
    ("Alloc.SmallNode", 100_000),
    ("Alloc.MediumRecord", 25_000),
    ("Alloc.LargeBlob", 1_000),
];

fn alloc_target() -> Target {
    Target::builder("Alloc")
        .args(["--keep", "100000,25000,1000", "--churn-per-second", "0"])
        .start()
}

fn instance_bytes(target: &Target, name: &str) -> u64 {
    target
        .ready_fact(&format!("/instance_bytes/{name}"))
        .and_then(|v| v.as_u64())
        .unwrap_or_else(|| panic!("no instance_bytes of {name} in {:?}", target.ready()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_counts_exactly_the_kept_objects() {
    let target = alloc_target();
    let client = DiagnosticsClient::for_pid(target.pid()).unwrap();
    let graph = gcdump::snapshot(&client, SnapshotOptions::default(), |_| {})
        .await
        .unwrap();
    let histogram = graph.histogram();
    for (name, count) in KEPT {
        let row = histogram
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing from {:?}", &histogram.types[..10]));
        assert_eq!(row.count, count, "{name}");
        assert_eq!(row.bytes, count * instance_bytes(&target, name), "{name}");
    }
    // Each LargeBlob owns one byte[4096]; the three holder arrays reference every kept object.
    let blobs = histogram.get("System.Byte[]").unwrap();
    assert!(blobs.count >= 1_000, "{blobs:?}");
    assert!(graph.edge_count() as u64 >= 100_000 + 25_000 + 1_000);
    assert!(!graph.roots().is_empty());
    eprintln!(
        "{} objects, {} references, {} roots, top: {:?}",
        graph.node_count(),
        graph.edge_count(),
        graph.roots().len(),
        &histogram.types[..5]
    );
}

fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("clrscope-gcdump-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn clrscope(args: &[&OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .args(args)
        .output()
        .unwrap()
}

fn report_json(file: &Path) -> Value {
    let output = clrscope(&[
        "gcdump".as_ref(),
        "report".as_ref(),
        file.as_os_str(),
        "--json".as_ref(),
        "--top".as_ref(),
        "1000".as_ref(),
    ]);
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn cli_writes_a_private_gcdump_that_report_reads_back() {
    let target = alloc_target();
    let dir = out_dir("cli");
    let file = dir.join("alloc.gcdump");
    let pid = target.pid().to_string();
    let output = clrscope(&[
        "gcdump".as_ref(),
        "--pid".as_ref(),
        pid.as_ref(),
        "-o".as_ref(),
        file.as_os_str(),
    ]);
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("wrote"), "{stderr}");
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let report = report_json(&file);
    assert_eq!(report["process_id"], target.pid());
    assert_eq!(report["process_name"], "Alloc");
    let types = report["types"].as_array().unwrap();
    for (name, count) in KEPT {
        let row = types
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing from {report}"));
        assert_eq!(row["count"], count, "{name}");
        assert_eq!(
            row["bytes"],
            count * instance_bytes(&target, name),
            "{name}"
        );
    }
    // Sorted by size, and the rows add up to the totals.
    let bytes: Vec<u64> = types.iter().map(|t| t["bytes"].as_u64().unwrap()).collect();
    assert!(bytes.windows(2).all(|w| w[0] >= w[1]), "{bytes:?}");
    assert_eq!(bytes.iter().sum::<u64>(), report["bytes"].as_u64().unwrap());

    let text = clrscope(&[
        "gcdump".as_ref(),
        "report".as_ref(),
        file.as_os_str(),
        "--top".as_ref(),
        "3".as_ref(),
    ]);
    assert!(text.status.success(), "{text:?}");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("Alloc.SmallNode"), "{text}");
    let rows = text.lines().skip_while(|l| !l.ends_with("  type")).skip(1);
    assert_eq!(rows.count(), 3, "{text}");

    // A truncated file and a file that is not a gcdump fail with a message, not a panic.
    let bytes = std::fs::read(&file).unwrap();
    let truncated = dir.join("truncated.gcdump");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let garbage = dir.join("garbage.gcdump");
    std::fs::write(
        &garbage,
        b"{\"this is\": \"not a heap snapshot at all, only json\"}",
    )
    .unwrap();
    for (bad, expected) in [(&truncated, "truncated"), (&garbage, "not a .gcdump file")] {
        let output = clrscope(&["gcdump".as_ref(), "report".as_ref(), bad.as_os_str()]);
        assert_eq!(output.status.code(), Some(1), "{output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.starts_with("error: "), "{stderr}");
        assert!(stderr.contains(expected), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn cli_explains_a_missing_process() {
    let output = clrscope(&["gcdump".as_ref(), "--pid".as_ref(), "999999".as_ref()]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("999999"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_is_a_clear_error_and_leaves_the_process_usable() {
    let target = alloc_target();
    let client = DiagnosticsClient::for_pid(target.pid()).unwrap();
    let too_short = SnapshotOptions {
        timeout: std::time::Duration::from_millis(1),
    };
    let error = gcdump::snapshot(&client, too_short, |_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(error, gcdump::GcDumpError::Timeout { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("--timeout"), "{error}");
    // Our session was stopped: the next snapshot works.
    let graph = gcdump::snapshot(&client, SnapshotOptions::default(), |_| {})
        .await
        .unwrap();
    // The timed-out walk may still have been running when its session stopped, naming types for
    // nobody: the runtime names a type once, so this snapshot must have asked again.
    let histogram = graph.histogram();
    let unnamed: Vec<_> = histogram
        .types
        .iter()
        .filter(|t| t.name.starts_with("<unnamed type"))
        .collect();
    assert!(unnamed.is_empty(), "types without names: {unnamed:?}");
    let blobs = histogram.get("Alloc.LargeBlob").map(|t| t.count);
    assert_eq!(
        blobs,
        Some(1_000),
        "{} objects, {} bytes; largest types: {:?}",
        histogram.objects,
        histogram.bytes,
        &histogram.types[..histogram.types.len().min(8)]
    );
}

/// The kept types' counts in a `.gcdump` file, and its types without a name.
fn kept_and_unnamed(file: &Path) -> (Vec<(String, u64)>, usize) {
    let report = report_json(file);
    let types = report["types"].as_array().unwrap();
    let count = |name: &str| {
        types
            .iter()
            .find(|t| t["name"] == name)
            .map_or(0, |t| t["count"].as_u64().unwrap())
    };
    let kept = KEPT
        .iter()
        .map(|(name, _)| (name.to_string(), count(name)))
        .collect();
    let unnamed = types
        .iter()
        .filter(|t| t["name"].as_str().unwrap().starts_with("<unnamed type"))
        .count();
    (kept, unnamed)
}

/// 20 gcdumps through the agent, beside its own sessions on the runtime (the code map, trace
/// linkage's exceptions, the sampler's allocation windows) and its logs session: one from a
/// Startup rule, five from a Schedule rule, then 14 from `GET /gcdump`. Each names every type and
/// counts exactly the objects the target keeps. Before the fix, a snapshot's stop left the
/// runtime believing its Type keyword on (EventPipe reckons a stopping session's keywords with
/// the session still counted), so the next walks named nothing (4 of 6 API gcdumps, every retry
/// too), and the stop's own induced GC was walked into the file (twice the objects).
#[test]
fn agent_gcdumps_name_every_type_beside_the_agents_sessions() {
    let target = Target::builder("Alloc")
        .args(["--keep", "100000,25000,1000"])
        .start();
    let pid = target.pid();
    let dir = out_dir("agent");
    let artifacts = dir.join("artifacts");
    let rule = |trigger: serde_json::Value, count: u32| {
        serde_json::json!({
            "Filters": [{"Key": "ProcessId", "Value": pid.to_string()}],
            "Trigger": trigger,
            "Actions": [{"Type": "CollectGCDump", "Settings": {"Egress": "artifacts"}}],
            "Limits": {"ActionCount": count}
        })
    };
    let settings = serde_json::json!({
        "Egress": {"FileSystem": {"artifacts": {"DirectoryPath": artifacts}}},
        "CollectionRules": {
            "AtStartup": rule(serde_json::json!({"Type": "Startup"}), 1),
            "Every7s": rule(serde_json::json!({"Type": "Schedule",
                "Settings": {"Interval": "00:00:07"}}), 5),
        },
    });
    let agent = support::agent::Agent::for_pid_with_settings(
        &dir,
        pid,
        &settings.to_string(),
        &["--trace-linkage", "--logs", "Information"],
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let ruled = loop {
        let ruled: Vec<PathBuf> = std::fs::read_dir(&artifacts)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|e| e == "gcdump"))
                    .collect()
            })
            .unwrap_or_default();
        if ruled.len() >= 6 || std::time::Instant::now() > deadline {
            break ruled;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    assert_eq!(ruled.len(), 6, "{ruled:?}\n{}", agent.log());
    let mut files = ruled;
    // One gcdump runs at a time: a request while the last rule's file is written gets 429.
    for n in 0..14 {
        let answer = loop {
            let answer = agent.request("GET", &format!("/gcdump?pid={pid}"));
            if answer.status != 429 {
                break answer;
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
        };
        assert_eq!(answer.status, 200, "{}\n{}", answer.body, agent.log());
        let file = dir.join(format!("api-{n}.gcdump"));
        std::fs::write(&file, &answer.bytes).unwrap();
        files.push(file);
    }
    let expected: Vec<(String, u64)> = KEPT.iter().map(|(n, c)| (n.to_string(), *c)).collect();
    let judged: Vec<_> = files
        .iter()
        .map(|file| {
            let (kept, unnamed) = kept_and_unnamed(file);
            let name = file.file_name().unwrap().to_string_lossy().into_owned();
            (name, kept, unnamed)
        })
        .collect();
    let wrong: Vec<_> = judged
        .iter()
        .filter(|(_, kept, unnamed)| *kept != expected || *unnamed > 0)
        .collect();
    eprintln!(
        "{} of {} gcdumps named and exact",
        judged.len() - wrong.len(),
        judged.len()
    );
    assert!(
        wrong.is_empty(),
        "gcdumps with unnamed types or other counts than {expected:?}: {wrong:?}\n{}",
        agent.log()
    );
}

/// An ASP.NET Core service runs server GC (the Web SDK's default), whose GC starts on one thread
/// and ends on another: the stream is in order per thread only, and on .NET 8 every snapshot read
/// the induced GC's end before its start and waited for an end already passed until it timed out.
/// Three snapshots in a row, each complete.
#[test]
fn a_server_gc_service_is_snapshotted_every_time() {
    let target = Target::builder("AsyncWeb")
        .args(["--self-load", "2", "--no-request-lines"])
        .start();
    let dir = out_dir("server-gc");
    let pid = target.pid().to_string();
    for i in 0..3 {
        let file = dir.join(format!("web-{i}.gcdump"));
        let output = clrscope(&[
            "gcdump".as_ref(),
            "--pid".as_ref(),
            pid.as_ref(),
            "--timeout".as_ref(),
            "60s".as_ref(),
            "-o".as_ref(),
            file.as_os_str(),
        ]);
        assert!(output.status.success(), "snapshot {i}: {output:?}");
        let report = report_json(&file);
        let types = report["types"].as_array().unwrap();
        assert!(
            types.iter().any(|t| t["name"]
                .as_str()
                .unwrap()
                .starts_with("Microsoft.AspNetCore.")),
            "snapshot {i} holds no ASP.NET Core type: {report}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
