//! The browser scripts of `tests/browser` (Debian Chromium through npm playwright-core, both
//! installed by `make setup`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

pub const CHROMIUM: &str = "/usr/bin/chromium";

/// Runs `tests/browser/SCRIPT CONFIG` under node and returns its report, the last line it printed.
pub fn node(script: &str, config: Value) -> Value {
    let modules = super::testbed_dir().join("node").join("node_modules");
    let script: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/browser")
        .join(script);
    assert!(Path::new(CHROMIUM).exists() && modules.join("playwright-core").exists());
    let output = Command::new("node")
        .arg(script)
        .arg(config.to_string())
        .env("NODE_PATH", modules)
        .stdin(Stdio::null())
        .output()
        .expect("node (installed by `make setup`)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap()
}
