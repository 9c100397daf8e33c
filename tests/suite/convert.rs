//! `clrscope convert` of a recorded fixture into every format, compared with golden files
//! (`CLRSCOPE_BLESS=1` rewrites them after a deliberate change).

use crate::support;

use std::path::Path;
use std::process::Command;

#[test]
fn golden_outputs_of_a_recorded_trace() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("collector/tests/fixtures/cpuhot-jit-rundown.nettrace");
    let dir = std::env::temp_dir().join(format!("clrscope-convert-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in [
        "cpuhot.pb.gz",
        "cpuhot.folded",
        "cpuhot.speedscope.json",
        "cpuhot.svg",
    ] {
        let out = dir.join(name);
        let output = Command::new(env!("CARGO_BIN_EXE_clrscope"))
            .arg("convert")
            .arg(&fixture)
            .args(["--types", "cpu,wall", "-o"])
            .arg(&out)
            .output()
            .unwrap();
        assert!(output.status.success(), "{name}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("% of managed frames named by a method"),
            "{stderr}"
        );
        support::golden::check_golden(
            Path::new("convert").join(name),
            &std::fs::read(&out).unwrap(),
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unknown_output_extension_is_refused_before_reading() {
    let output = Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .args(["convert", "no-such.nettrace", "-o", "profile.xyz"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("profile.xyz"), "{stderr}");
}
