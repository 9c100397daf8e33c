//! Packaging: `clrscope --version` names the git revision, and the Dockerfile's image runs the
//! agent as a non-root user with arguments the binary accepts. (No container runtime here: the
//! Dockerfile is read, and its command run with this build's binary.)

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn version_names_the_package_and_the_git_revision() {
    let output = Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let version = String::from_utf8(output.stdout).unwrap();
    // What build.rs saw: the override, else the checkout's HEAD, else no git at all.
    let expected = match option_env!("GIT_REVISION") {
        Some(given) if !given.trim().is_empty() => format!("git {}", given.trim()),
        _ => Command::new("git")
            .arg("-C")
            .arg(root())
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| format!("git {}", String::from_utf8_lossy(&o.stdout).trim()))
            .unwrap_or_else(|| "unknown revision".to_string()),
    };
    assert_eq!(
        version,
        format!("clrscope {} ({expected})\n", env!("CARGO_PKG_VERSION"))
    );
}

/// The Dockerfile's instructions, continuation lines joined, comments dropped.
fn instructions() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        if let Some(part) = line.strip_suffix('\\') {
            current.push_str(part);
            current.push(' ');
            continue;
        }
        current.push_str(line);
        let (keyword, rest) = current.split_once(' ').unwrap_or((&current, ""));
        out.push((keyword.to_ascii_uppercase(), rest.trim().to_string()));
        current.clear();
    }
    out
}

#[test]
fn the_image_runs_the_agent_as_non_root_with_arguments_it_accepts() {
    let all = instructions();
    let stages = all.iter().filter(|(k, _)| k == "FROM").count();
    assert!(stages >= 2, "a multi-stage build: {all:?}");
    // the runtime stage: everything after the last FROM
    let last_from = all.iter().rposition(|(k, _)| k == "FROM").unwrap();
    let runtime = &all[last_from..];
    let get = |keyword: &str| -> Vec<&str> {
        runtime
            .iter()
            .filter(|(k, _)| k == keyword)
            .map(|(_, v)| v.as_str())
            .collect()
    };
    let user = get("USER");
    let user = user.last().expect("a USER in the runtime stage");
    assert!(
        !["root", "0"].contains(&user.split(':').next().unwrap()),
        "runs as {user}"
    );
    let exposed: Vec<&str> = get("EXPOSE")
        .iter()
        .flat_map(|e| e.split_whitespace())
        .collect();
    for port in ["52323", "52325"] {
        assert!(exposed.contains(&port), "EXPOSE {exposed:?}");
    }
    let exec_form = |keyword: &str| -> Vec<String> {
        let value = get(keyword);
        let value = value.last().unwrap_or_else(|| panic!("no {keyword}"));
        serde_json::from_str(value)
            .unwrap_or_else(|e| panic!("{keyword} {value} is not an exec-form JSON array: {e}"))
    };
    let entrypoint = exec_form("ENTRYPOINT");
    assert!(entrypoint[0].ends_with("/clrscope"), "{entrypoint:?}");
    let mut command = exec_form("CMD");
    assert_eq!(command[0], "agent", "{command:?}");

    // Run that command with this build's binary; only the ports (0: any free one) and the data
    // directory (a scratch one) change, and a pid filter keeps it away from other processes.
    let dir = std::env::temp_dir().join(format!("clrscope-image-cmd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut saw = (false, false);
    for i in 1..command.len() {
        match command[i - 1].as_str() {
            flag @ ("--urls" | "--metrics-urls") => {
                saw.0 |= flag == "--urls";
                let (address, _port) = command[i].rsplit_once(':').expect("URL HOST:PORT");
                command[i] = format!("{address}:0");
            }
            "--data-dir" => {
                command[i] = dir.display().to_string();
                saw.1 = true;
            }
            _ => {}
        }
    }
    assert_eq!(
        saw,
        (true, true),
        "CMD names --urls and --data-dir: {command:?}"
    );
    let mut agent = Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .args(&command)
        .args(["--pid", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(agent.stderr.take().unwrap());
    // warnings (e.g. about binding beyond loopback) may come first
    let mut first = String::new();
    while stderr.read_line(&mut first).unwrap_or(0) > 0 && !first.contains("API on http://") {}
    let started = first.contains("API on http://");
    // keep reading, so the agent's last words never meet a closed pipe
    let rest = std::thread::spawn(move || {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut rest).ok();
        rest
    });
    unsafe {
        kill(agent.id() as i32, 15);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = agent.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let rest = rest.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        started,
        "the image's command did not start the agent: {first}{rest}"
    );
    assert!(status.success(), "{status}: {first}{rest}");
}

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}
