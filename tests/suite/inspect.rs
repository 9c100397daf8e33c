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

#[test]
fn golden_inspect_outputs() {
    let mut checked = 0;
    for entry in std::fs::read_dir(fixtures()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("nettrace") {
            continue;
        }
        let output = inspect(&path, false);
        assert!(output.status.success(), "{}: {output:?}", path.display());
        let name = path.file_stem().unwrap().to_str().unwrap();
        let golden = Path::new("inspect").join(format!("{name}.txt"));
        support::golden::check_golden(&golden, &output.stdout);
        checked += 1;
    }
    assert!(checked >= 6, "only {checked} fixtures found");
}

#[test]
fn fixtures_hold_what_their_targets_did() {
    let json = |name: &str| -> serde_json::Value {
        let output = inspect(&fixtures().join(name), true);
        assert!(output.status.success());
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
    let samples = json("cpuhot-samples.nettrace");
    assert!(
        count(
            &samples,
            "Microsoft-DotNETCore-SampleProfiler",
            "ThreadSample"
        ) > 100
    );
    assert_eq!(samples["complete"], true);
    assert_eq!(samples["trace"]["sampling_interval_ns"], 1_000_000);

    let faults = json("faults.nettrace");
    let runtime = "Microsoft-Windows-DotNETRuntime";
    assert!(count(&faults, runtime, "ExceptionThrown") > 10);
    assert!(count(&faults, runtime, "ContentionStart") > 5);
    assert!(count(&faults, "Clrscope-Test-Faults", "FaultInjected") > 10);

    let rundown = json("cpuhot-jit-rundown.nettrace");
    let rundown_provider = "Microsoft-Windows-DotNETRuntimeRundown";
    assert!(count(&rundown, rundown_provider, "MethodDCEndVerbose") > 100);
    assert!(count(&rundown, runtime, "MethodLoadVerbose") > 0);
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
