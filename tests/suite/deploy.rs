//! `deploy/kubernetes/` without a cluster: the manifests parse (Debian python3-yaml, installed by
//! `make setup`), fit together (the app dials the socket the agent listens on, with `nosuspend`,
//! on a volume both mount; the key comes from the Secret's keys; the API stays on loopback;
//! limits are set), and the agent starts with exactly the sidecar's arguments and environment
//! (paths and ports moved to this machine's scratch space). The node agent's manifest is run
//! against a service in a pid and mount namespace of its own, as in another container.

use crate::support;

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use support::agent::{data_dir, ApiKey};
use support::http_get;

const PYTHON: &str = "/usr/bin/python3";

/// Every document of a YAML file, as JSON.
fn documents(file: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/kubernetes")
        .join(file);
    let output = Command::new(PYTHON)
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        ])
        .arg(&path)
        .output()
        .expect("python3 (Debian python3-yaml, installed by `make setup`)");
    assert!(
        output.status.success(),
        "{} does not parse: {}",
        path.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice::<Vec<Value>>(&output.stdout)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// The document of kind `kind` in `file`.
fn resource(file: &str, kind: &str) -> Value {
    documents(file)
        .into_iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {file}"))
}

/// A container's `args`, which must start with `agent`.
fn agent_args(container: &Value) -> Vec<String> {
    let args: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    assert_eq!(args[0], "agent");
    args
}

fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn env<'a>(container: &'a Value, name: &str) -> &'a Value {
    container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("no env {name} in {}", container["name"]))
}

/// The value after `flag` in `args`.
fn flag<'a>(args: &'a [String], flag: &str) -> &'a str {
    let at = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("no {flag} in {args:?}"));
    &args[at + 1]
}

/// The path a container mounts `volume` at.
fn mount<'a>(container: &'a Value, volume: &str) -> &'a str {
    container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == volume)
        .and_then(|m| m["mountPath"].as_str())
        .unwrap_or_else(|| panic!("{} does not mount {volume}", container["name"]))
}

#[test]
fn the_sidecar_manifest_fits_together_and_the_agent_starts_with_its_arguments() {
    let secret = &documents("apikey-secret.yaml")[0];
    assert_eq!(secret["kind"], "Secret");
    let deployment = resource("clrscope-sidecar.yaml", "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let app = container(pod, "app");
    let agent = container(pod, "clrscope");
    let args = agent_args(agent);

    // Listen mode on a socket of a volume both containers mount at the same place.
    let socket = flag(&args, "--diagnostic-port");
    assert!(args.iter().any(|a| a == "--no-connect"), "{args:?}");
    assert_eq!(
        env(app, "DOTNET_DiagnosticPorts")["value"],
        format!("{socket},nosuspend")
    );
    let diag = mount(agent, "diag");
    assert_eq!(mount(app, "diag"), diag);
    assert_eq!(Path::new(socket).parent().unwrap(), Path::new(diag));
    assert!(mount(agent, "profiles") == flag(&args, "--data-dir"));

    // The API on loopback; metrics on the port the pod declares and Prometheus is told.
    assert!(
        flag(&args, "--urls").starts_with("http://127.0.0.1:"),
        "{args:?}"
    );
    let metrics_port = flag(&args, "--metrics-urls").rsplit(':').next().unwrap();
    let declared = agent["ports"][0]["containerPort"].as_u64().unwrap();
    assert_eq!(metrics_port, declared.to_string());
    let annotations = &deployment["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/port"], metrics_port);

    // The key from the Secret's keys; limits set.
    for (variable, key) in [
        ("CLRSCOPE_Authentication__MonitorApiKey__Subject", "Subject"),
        (
            "CLRSCOPE_Authentication__MonitorApiKey__PublicKey",
            "PublicKey",
        ),
    ] {
        let from = &env(agent, variable)["valueFrom"]["secretKeyRef"];
        assert_eq!(from["name"], secret["metadata"]["name"]);
        assert_eq!(from["key"], key);
        assert!(
            secret["stringData"][key].is_string(),
            "the Secret has no {key}"
        );
    }
    for limit in ["cpu", "memory"] {
        assert!(
            agent["resources"]["limits"][limit].is_string(),
            "no {limit} limit"
        );
    }

    // The agent runs with these very arguments (paths and ports moved here) and this
    // environment, the Secret holding a key from generatekey.
    let scratch = data_dir("deploy");
    std::fs::create_dir_all(scratch.join("diag")).unwrap();
    let local: Vec<String> = args
        .iter()
        .map(|a| {
            a.replace(diag, &scratch.join("diag").display().to_string())
                .replace(
                    flag(&args, "--data-dir"),
                    &scratch.join("data").display().to_string(),
                )
                .replace(":52323", ":0")
                .replace(&format!(":{metrics_port}"), ":0")
        })
        .collect();
    let key = ApiKey::generate(&[]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .args(&local)
        .envs(key.env())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    let line = loop {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut stderr, &mut line).unwrap_or(0) == 0 {
            let _ = child.kill();
            panic!("the agent did not start with {local:?}:\n{log}");
        }
        log.push_str(&line);
        if line.contains("API on") {
            break line;
        }
    };
    let metrics: u16 = line
        .split("metrics http://0.0.0.0:")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("metrics not on every interface: {line}"));
    let answer = http_get(metrics, "/metrics", &[]);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(answer.status, 200);
    assert!(!log.contains("no usable API key"), "{log}");
}

/// The host pid of `wrapper`'s only child: the .NET process `unshare --fork` started.
fn child_pid(wrapper: u32) -> u32 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let children = std::fs::read_to_string(format!("/proc/{wrapper}/task/{wrapper}/children"))
            .unwrap_or_default();
        if let Some(pid) = children.split_whitespace().next() {
            return pid.parse().unwrap();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "unshare (pid {wrapper}) started no child"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn the_node_agent_manifest_profiles_a_process_in_another_container() {
    let daemonset = resource("clrscope-node-agent.yaml", "DaemonSet");
    let pod = &daemonset["spec"]["template"]["spec"];
    let agent = container(pod, "clrscope");
    let args = agent_args(agent);

    // Connect mode in the node's pid namespace, with the two capabilities it needs, as root.
    assert_eq!(pod["hostPID"], true);
    assert!(
        !args
            .iter()
            .any(|a| a == "--no-connect" || a == "--diagnostic-port"),
        "{args:?}"
    );
    let security = &agent["securityContext"];
    assert_eq!(security["runAsUser"], 0);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(
        security["capabilities"]["add"],
        serde_json::json!(["SYS_PTRACE", "DAC_OVERRIDE"])
    );
    // The store on the node, bounded; the API on loopback; metrics where Prometheus is told.
    assert_eq!(mount(agent, "profiles"), flag(&args, "--data-dir"));
    assert!(pod["volumes"][0]["hostPath"]["path"].is_string());
    assert!(args.iter().any(|a| a == "--retention-size"), "{args:?}");
    assert!(
        flag(&args, "--urls").starts_with("http://127.0.0.1:"),
        "{args:?}"
    );
    let metrics_port = flag(&args, "--metrics-urls").rsplit(':').next().unwrap();
    assert_eq!(
        daemonset["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"],
        metrics_port
    );
    for limit in ["cpu", "memory"] {
        assert!(
            agent["resources"]["limits"][limit].is_string(),
            "no {limit} limit"
        );
    }

    // A service in a "container" of its own: its own pid namespace (it is pid 1 there) and its
    // own /tmp, where its runtime puts the diagnostic socket, so the agent reaches it only
    // through /proc/PID/root. A test bed under /tmp (a checkout there) is bound back over the
    // new /tmp, by way of a tmpfs on /mnt that only this namespace sees.
    let testbed = support::testbed_dir();
    let service = support::Target::builder("CpuHot")
        .args(["--split", "70,30"])
        .wrapped_in([
            "unshare",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount",
            "--mount-proc",
            "--",
            "sh",
            "-c",
            "set -e; testbed=$1; shift; \
             mount -t tmpfs tmpfs /mnt && mkdir /mnt/testbed && mount --bind \"$testbed\" /mnt/testbed; \
             mount -t tmpfs -o mode=1777 tmpfs /tmp; \
             mkdir -p \"$testbed\" && mount --bind /mnt/testbed \"$testbed\"; \
             exec \"$@\"",
            "sh",
            testbed.to_str().expect("a UTF-8 test-bed path"),
        ])
        .start();
    let service_pid = child_pid(service.pid());
    let status = std::fs::read_to_string(format!("/proc/{service_pid}/status")).unwrap();
    let nspid = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
    assert!(
        nspid.ends_with("\t1"),
        "not pid 1 of its namespace: {nspid}"
    );
    let inside = Path::new(&format!("/proc/{service_pid}/root"))
        .join(support::diagnostic_socket_dir().strip_prefix("/").unwrap());
    let socket_inside = std::fs::read_dir(&inside)
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("dotnet-diagnostic-1-")
        });
    assert!(socket_inside, "no socket of pid 1 in {}", inside.display());
    assert!(
        support::diagnostic_sockets(service_pid).is_empty(),
        "the service's socket is visible outside its namespace"
    );

    // The agent with the manifest's arguments and environment (ports and the data directory
    // moved here), limited to this test's service: the machine runs other tests' .NET processes.
    let mut local = Vec::new();
    let mut rest = args[1..].iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--data-dir" => {
                rest.next();
            }
            "--urls" | "--metrics-urls" => {
                rest.next();
                local.extend([arg.clone(), "http://127.0.0.1:0".to_string()]);
            }
            _ => local.push(arg.clone()),
        }
    }
    local.extend(["--pid".to_string(), service_pid.to_string()]);
    let local: Vec<&str> = local.iter().map(String::as_str).collect();
    let scratch = data_dir("node-agent");
    let agent = support::agent::Agent::start(&scratch, &local);
    agent.wait_attached(service_pid, true, std::time::Duration::from_secs(30));
    agent.wait_for_data(
        "cpu",
        service_pid,
        500_000_000,
        std::time::Duration::from_secs(60),
    );
    let folded = agent.folded("cpu", service_pid, "");
    let total: i64 = folded.iter().map(|(_, v)| v).sum();
    let alpha: i64 = folded
        .iter()
        .filter(|(stack, _)| stack.contains("CpuHot.Program.SpinAlpha"))
        .map(|(_, v)| v)
        .sum();
    assert!(
        alpha * 100 / total >= 40,
        "SpinAlpha has {alpha} of {total} ns: {folded:?}"
    );
}
