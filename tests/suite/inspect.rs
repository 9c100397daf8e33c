//! `clrscope inspect` on recorded fixtures: golden outputs (bless with `CLRSCOPE_BLESS=1`), and
//! damaged files that must be reported, never crash.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("collector/tests/fixtures")
}

fn inspect(path: &Path, json: bool) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_clrscope"));
    command.arg("inspect").arg(path);
    if json {
        command.arg("--json");
    }
    command.output().expect("run clrscope inspect")
}

/// The fixture folders: the first recordings (.NET 8.0.4) at the top, then one folder per runtime
/// of the matrix (`net8`, `net9`, …), recorded by `collector/tests/fixtures/record.sh`.
fn fixture_sets() -> Vec<PathBuf> {
    let mut sets = vec![fixtures()];
    let mut per_runtime: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    per_runtime.sort();
    assert!(
        per_runtime.len() >= 4,
        "per-runtime fixtures: {per_runtime:?}"
    );
    sets.extend(per_runtime);
    sets
}

/// The golden of `path`: `inspect/NAME.txt`, or `inspect/RUNTIME/NAME.txt` for a runtime's folder.
fn golden_of(path: &Path) -> PathBuf {
    let name = format!("{}.txt", path.file_stem().unwrap().to_str().unwrap());
    match path.parent().filter(|p| *p != fixtures()) {
        Some(runtime) => Path::new("inspect")
            .join(runtime.file_name().unwrap())
            .join(name),
        None => Path::new("inspect").join(name),
    }
}

#[test]
fn golden_inspect_outputs() {
    let mut checked = 0;
    for set in fixture_sets() {
        for entry in std::fs::read_dir(&set).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("nettrace") {
                continue;
            }
            let output = inspect(&path, false);
            assert!(output.status.success(), "{}: {output:?}", path.display());
            support::golden::check_golden(golden_of(&path), &output.stdout);
            checked += 1;
        }
    }
    assert!(checked >= 4 + 4 * 5, "only {checked} fixtures found");
}

#[test]
fn fixtures_hold_what_their_targets_did() {
    for set in fixture_sets() {
        check_fixture_set(&set);
    }
}

/// What each target did is in its recording, on every runtime: samples at the sampler's interval,
/// exceptions, contention and the app's own events, a rundown naming the methods.
fn check_fixture_set(set: &Path) {
    let json = |name: &str| -> serde_json::Value {
        let output = inspect(&set.join(name), true);
        assert!(output.status.success(), "{}/{name}", set.display());
        serde_json::from_slice(&output.stdout).unwrap()
    };
    let count = |summary: &serde_json::Value, provider: &str, event: &str| -> u64 {
        summary["providers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["name"] == provider)
            .flat_map(|p| p["by_event"].as_array().unwrap().iter())
            .filter(|e| e["name"] == event)
            .map(|e| e["count"].as_u64().unwrap())
            .sum()
    };
    let at = set.display();
    let samples = json("cpuhot-samples.nettrace");
    let sampled = count(
        &samples,
        "Microsoft-DotNETCore-SampleProfiler",
        "ThreadSample",
    );
    assert!(sampled > 100, "{at}: {sampled} samples");
    assert_eq!(samples["complete"], true, "{at}");
    assert_eq!(samples["trace"]["sampling_interval_ns"], 1_000_000, "{at}");

    let faults = json("faults.nettrace");
    let runtime = "Microsoft-Windows-DotNETRuntime";
    assert!(count(&faults, runtime, "ExceptionThrown") > 10, "{at}");
    assert!(count(&faults, runtime, "ContentionStart") > 5, "{at}");
    assert!(
        count(&faults, "Clrscope-Test-Faults", "FaultInjected") > 10,
        "{at}"
    );

    let rundown = json("cpuhot-jit-rundown.nettrace");
    let rundown_provider = "Microsoft-Windows-DotNETRuntimeRundown";
    assert!(
        count(&rundown, rundown_provider, "MethodDCEndVerbose") > 100,
        "{at}"
    );
    assert!(count(&rundown, runtime, "MethodLoadVerbose") > 0, "{at}");

    if set == fixtures() {
        return; // the first recordings (.NET 8.0.4) have no AsyncWeb: it was not ASP.NET Core then
    }
    // AsyncWeb on ASP.NET Core at 20 requests/s for 2.5 s: the framework's own hosting EventSource
    // and server-span events, and the app's histogram.
    let http = json("asyncweb-http-metrics.nettrace");
    let hosting = "Microsoft.AspNetCore.Hosting";
    let (starts, stops) = (
        count(&http, hosting, "RequestStart"),
        count(&http, hosting, "RequestStop"),
    );
    assert!(starts >= 20 && stops >= 20, "{at}: {starts} / {stops}");
    let diagnostic_source = "Microsoft-Diagnostics-DiagnosticSource";
    let server_spans = count(&http, diagnostic_source, "Activity1Start");
    assert!(server_spans >= 20, "{at}: {server_spans}");
    let metrics = "System.Diagnostics.Metrics";
    assert!(count(&http, metrics, "HistogramValuePublished") > 0, "{at}");

    // AsyncWeb's spans under the linkage providers: three per request (server, request, and the
    // inner span of every third), 30 requests/s for 1 s.
    let linkage = json("asyncweb-linkage.nettrace");
    let started = count(&linkage, diagnostic_source, "ActivityStart");
    assert!(started >= 50, "{at}: {started} spans started");
}

#[test]
fn damaged_files_are_reported_with_offset_and_exit_non_zero() {
    let original = std::fs::read(fixtures().join("faults.nettrace")).unwrap();
    let dir = std::env::temp_dir().join(format!("clrscope-inspect-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cut = dir.join("cut.nettrace");
    std::fs::write(&cut, &original[..original.len() * 2 / 3]).unwrap();
    let output = inspect(&cut, false);
    assert!(!output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stdout.contains("INCOMPLETE") && stdout.contains("damage: at offset"),
        "{stdout}"
    );
    assert!(stderr.contains("is damaged at offset"), "{stderr}");

    let not_a_trace = dir.join("readme.nettrace");
    std::fs::write(&not_a_trace, b"# this is markdown, not a trace\n").unwrap();
    let output = inspect(&not_a_trace, false);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("not a nettrace stream"));
    std::fs::remove_dir_all(&dir).unwrap();
}
