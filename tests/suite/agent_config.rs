//! `clrscope agent --config`: settings from a file, a key-per-file directory and the environment
//! reach the running agent, and a bad value stops it with the key's path.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn agent() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_clrscope"));
    command.arg("agent").env_remove("RUST_LOG");
    command
}

#[test]
fn file_directory_and_environment_configure_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("from-secret");
    let settings = dir.path().join("settings.json");
    std::fs::write(
        &settings,
        r#"{
          "Logging": {"LogLevel": {"Default": "Warning"}},
          "Urls": "http://127.0.0.1:0",
          "Profiling": {"SampleWindow": "00:00:02", "SamplePeriod": "20s", "ProcessIds": ["1"]},
          "Store": {"DataDirectory": "/nonexistent/overridden"},
          "Metrics": {"Endpoints": "http://127.0.0.1:0", "IncludeDefaultProviders": "false"}
        }"#,
    )
    .unwrap();
    let secret = dir.path().join("secret");
    std::fs::create_dir(&secret).unwrap();
    std::fs::write(
        secret.join("Store__DataDirectory"),
        format!("{}\n", data.display()),
    )
    .unwrap();
    let mut child = agent()
        .arg("--config")
        .arg(&settings)
        .arg("--config-dir")
        .arg(&secret)
        .env("CLRSCOPE_PROFILING__SAMPLEPERIOD", "40s")
        // Another tool's variable under the agent's prefix (the test bed's runtime choice).
        .env("CLRSCOPE_DOTNET", "10")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // The warning about `Logging` comes first, then the agent's line.
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    let first = loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap() == 0 {
            panic!("the agent stopped: {log}");
        }
        log.push_str(&line);
        if line.starts_with("clrscope agent: API on") {
            break line;
        }
    };
    // Stopped before anything is judged, so that a failing check leaves no agent behind.
    child.kill().unwrap();
    child.wait().unwrap();
    // The file's unknown section is named; the environment's is another tool's business.
    assert!(log.contains("section") && log.contains("Logging"), "{log}");
    assert!(!log.contains("DOTNET"), "{log}");
    // The window from the file, the period from the environment, the data directory from the
    // key-per-file directory over the file's.
    assert!(first.contains("API on http://127.0.0.1:"), "{first}");
    assert!(first.contains("metrics http://127.0.0.1:"), "{first}");
    assert!(first.contains("(5% duty: 2s every 40s)"), "{first}");
    assert!(first.contains("that match the filters"), "{first}");
    assert!(
        first.contains(&format!("data in {}", data.display())),
        "{first}"
    );
    assert!(data.join("LOCK").exists());
}

#[test]
fn a_bad_value_stops_the_agent_naming_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let settings = dir.path().join("settings.json");
    std::fs::write(&settings, r#"{"Store": {"Retention": "forever"}}"#).unwrap();
    let output = agent()
        .arg("--config")
        .arg(&settings)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("configuration key Store:Retention") && stderr.contains("\"forever\""),
        "{stderr}"
    );
    assert!(!dir.path().join("data").exists(), "nothing started");

    let output = agent()
        .arg("--config")
        .arg(dir.path().join("missing.json"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("missing.json"), "{stderr}");
}
