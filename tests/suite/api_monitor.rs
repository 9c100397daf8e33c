//! The agent's dotnet-monitor API against real .NET 8 processes: process routes and their JSON,
//! streamed artifacts that clrscope's own readers open, egress to a folder (within its disk
//! budget) and to an S3-compatible server (moto), operations, concurrency limits and
//! cancellation.

use crate::support;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::agent::{data_dir, Agent};
use support::{http_raw, http_request, http_request_with_body, testbed_dir, HttpResponse, Target};

fn clrscope(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .args(args)
        .output()
        .expect("run clrscope")
}

/// `method path` with the agent's token (and `headers`).
fn request(agent: &Agent, method: &str, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    let auth = format!("Bearer {}", agent.token());
    let mut headers = headers.to_vec();
    headers.push(("Authorization", &auth));
    http_request(agent.port, method, path, &headers)
}

/// `GET path`, expecting `status`.
fn get(agent: &Agent, path: &str, status: u16) -> HttpResponse {
    expect(request(agent, "GET", path, &[]), status, path, agent)
}

fn expect(response: HttpResponse, status: u16, what: &str, agent: &Agent) -> HttpResponse {
    agent.expect_status(response, status, what)
}

/// A settings.json for the agent, in `dir`; returns its path.
fn settings(dir: &Path, settings: Value) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("settings.json");
    std::fs::write(&path, settings.to_string()).unwrap();
    path
}

/// An agent profiling `pid` only, with the settings.json at `config`.
fn agent_with_config(dir: &Path, pid: u32, config: &Path) -> Agent {
    Agent::start(
        dir,
        &[
            "--pid",
            &pid.to_string(),
            "--config",
            config.to_str().unwrap(),
        ],
    )
}

/// The operation id in a `Location: http://host/operations/{id}`.
fn operation_id(response: &HttpResponse) -> String {
    let location = response.header("location").expect("a Location header");
    assert!(
        location.starts_with("http://127.0.0.1:") && location.contains("/operations/"),
        "{location}"
    );
    location.rsplit('/').next().unwrap().to_string()
}

/// Polls `/operations/{id}` until it leaves Running; returns its status.
fn wait_operation(agent: &Agent, id: &str, timeout: Duration) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let response = request(agent, "GET", &format!("/operations/{id}"), &[]);
        let status = response.json();
        if status["status"] != "Running" && status["status"] != "Stopping" {
            // dotnet-monitor answers 201 for a succeeded operation.
            let code = if status["status"] == "Succeeded" {
                201
            } else {
                200
            };
            assert_eq!(response.status, code, "{status}");
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "operation {id} still {status} after {timeout:?}; agent log:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn write_temp(name: &str, bytes: &[u8]) -> PathBuf {
    let path = std::env::temp_dir().join(format!("clrscope-api-{}-{name}", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    path
}

/// `clrscope gcdump report --json` of a file: its object count.
fn gcdump_objects(path: &Path) -> u64 {
    let report = clrscope(&["gcdump", "report", "--json", path.to_str().unwrap()]);
    assert!(report.status.success(), "{report:?}");
    let report: Value = serde_json::from_slice(&report.stdout).unwrap();
    report["objects"].as_u64().unwrap()
}

/// An ELF core file: the ELF magic and `e_type` ET_CORE.
fn is_elf_core(bytes: &[u8]) -> bool {
    bytes.len() > 64 && bytes[..4] == *b"\x7fELF" && u16::from_le_bytes([bytes[16], bytes[17]]) == 4
}

/// `<yyyyMMdd_HHmmss_fff>_<pid>.<ext>`.
fn assert_artifact_name(name: &str, pid: u32, ext: &str) {
    let (ts, rest) = name.split_at(19);
    assert!(
        ts.bytes().enumerate().all(|(i, c)| if i == 8 || i == 15 {
            c == b'_'
        } else {
            c.is_ascii_digit()
        }),
        "{name}"
    );
    assert_eq!(rest, format!("_{pid}.{ext}"), "{name}");
}

fn attachment_name(response: &HttpResponse) -> String {
    let disposition = response
        .header("content-disposition")
        .expect("Content-Disposition");
    disposition
        .strip_prefix("attachment; filename=")
        .unwrap_or_else(|| panic!("{disposition}"))
        .to_string()
}

#[test]
fn process_routes_answer_with_dotnet_monitors_shapes() {
    let target = Target::builder("CpuHot")
        .args(["--split", "50,50", "--cores", "2"])
        .start();
    let pid = target.pid();
    let dir = data_dir("monitor-process");
    let agent = Agent::start(&dir, &["--pid", &pid.to_string()]);

    let processes = get(&agent, "/processes", 200).json();
    let ours = processes
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} not in {processes}"))
        .clone();
    assert_eq!(ours["name"], "dotnet");
    assert_eq!(ours["uid"].as_str().unwrap().len(), 36);
    assert!(ours["isDefault"].is_boolean());
    let uid = ours["uid"].as_str().unwrap();

    let process = get(&agent, &format!("/process?uid={uid}"), 200).json();
    assert_eq!(process["pid"], pid);
    assert_eq!(process["uid"], uid);
    assert!(process["operatingSystem"]
        .as_str()
        .unwrap()
        .eq_ignore_ascii_case("linux"));
    assert!(process["commandLine"]
        .as_str()
        .unwrap()
        .contains("CpuHot.dll"));
    assert_eq!(process["managedEntryPointAssemblyName"], "CpuHot");
    assert!(process["processArchitecture"].is_string());

    let env = get(&agent, &format!("/env?pid={pid}"), 200).json();
    assert_eq!(env["TESTBED_EXIT_WITH_PARENT"], "1");

    let info = get(&agent, "/info", 200).json();
    assert_eq!(info["diagnosticPortMode"], "Connect");
    assert!(info["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["name"] == "call_stacks" && c["enabled"] == true));

    // No such process: 400 with a problem body, as dotnet-monitor answers.
    let missing = get(&agent, "/process?pid=999999999", 400);
    assert_eq!(
        missing.header("content-type"),
        Some("application/problem+json")
    );
    assert!(missing.json()["detail"]
        .as_str()
        .unwrap()
        .contains("Unable to discover a target process."));

    // Stacks: plain text by default, JSON and speedscope by Accept.
    let text = get(&agent, &format!("/stacks?pid={pid}"), 200);
    assert_artifact_name(&attachment_name(&text), pid, "stacks.txt");
    assert!(text.body.contains("Thread: (0x"), "{}", text.body);
    assert!(
        text.body.contains("CpuHot.dll!CpuHot.Program.Spin"),
        "{}",
        text.body
    );
    let json = expect(
        request(
            &agent,
            "GET",
            &format!("/stacks?pid={pid}"),
            &[("Accept", "application/json")],
        ),
        200,
        "/stacks as JSON",
        &agent,
    );
    assert_eq!(json.header("content-type"), Some("application/json"));
    let stacks = json.json();
    let frames: Vec<&Value> = stacks["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["frames"].as_array().unwrap())
        .collect();
    assert!(
        frames.iter().any(|f| f["methodName"] == "SpinAlpha"
            && f["typeName"] == "CpuHot.Program"
            && f["moduleName"] == "CpuHot.dll"
            && f["methodToken"].as_u64().unwrap() > 0x0600_0000),
        "{stacks}"
    );
    let speedscope = expect(
        request(
            &agent,
            "GET",
            &format!("/stacks?pid={pid}"),
            &[("Accept", "application/speedscope+json")],
        ),
        200,
        "/stacks as speedscope",
        &agent,
    )
    .json();
    assert_eq!(
        speedscope["$schema"],
        "https://www.speedscope.app/file-format-schema.json"
    );
    assert!(!speedscope["profiles"].as_array().unwrap().is_empty());
}

#[test]
fn the_default_process_is_the_only_one() {
    let dir = data_dir("monitor-default");
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("listen.sock");
    let agent = Agent::start(
        &dir,
        &[
            "--no-connect",
            "--diagnostic-port",
            socket.to_str().unwrap(),
        ],
    );
    let none = get(&agent, "/process", 400);
    assert!(none.body.contains("Unable to discover a target process."));
    let target = Target::builder("CpuHot")
        .args(["--split", "100", "--cores", "1"])
        .env(
            "DOTNET_DiagnosticPorts",
            format!("{},nosuspend", socket.display()),
        )
        .start();
    let deadline = Instant::now() + Duration::from_secs(20);
    let process = loop {
        let response = request(&agent, "GET", "/process", &[]);
        if response.status == 200 {
            break response.json();
        }
        assert!(Instant::now() < deadline, "{}", response.body);
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(process["pid"], target.pid());
    let info = get(&agent, "/info", 200).json();
    assert_eq!(info["diagnosticPortMode"], "Listen");
    assert_eq!(info["diagnosticPortName"], socket.display().to_string());
    let processes = get(&agent, "/processes", 200).json();
    assert_eq!(processes[0]["isDefault"], true);
}

#[test]
fn artifacts_stream_back_and_open() {
    let target = Target::builder("Alloc").start();
    let pid = target.pid();
    let dir = data_dir("monitor-stream");
    let agent = Agent::start(&dir, &["--pid", &pid.to_string()]);

    let trace = expect(
        request(
            &agent,
            "GET",
            &format!("/trace?pid={pid}&profile=Cpu,GcCollect&durationSeconds=2"),
            &[],
        ),
        200,
        "/trace",
        &agent,
    );
    assert_eq!(
        trace.header("content-type"),
        Some("application/octet-stream")
    );
    assert!(trace.header("location").is_some());
    assert_artifact_name(&attachment_name(&trace), pid, "nettrace");
    let path = write_temp("stream.nettrace", &trace.bytes);
    let inspect = clrscope(&["inspect", "--json", path.to_str().unwrap()]);
    assert!(inspect.status.success(), "{inspect:?}");
    let summary: Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert!(
        summary
            .to_string()
            .contains("Microsoft-DotNETCore-SampleProfiler"),
        "{summary}"
    );
    let _ = std::fs::remove_file(&path);

    // A custom trace: dotnet-monitor's POST body.
    let body = json!({
        "providers": [{"name": "Microsoft-Windows-DotNETRuntime", "keywords": "0x1", "eventLevel": "Verbose"}],
        "requestRundown": false,
        "bufferSizeInMB": 16
    });
    let custom = expect(
        http_request_with_body(
            agent.port,
            "POST",
            &format!("/trace?pid={pid}&durationSeconds=1"),
            &[
                ("Content-Type", "application/json"),
                ("Authorization", &format!("Bearer {}", agent.token())),
            ],
            body.to_string().as_bytes(),
        ),
        200,
        "POST /trace",
        &agent,
    );
    let path = write_temp("custom.nettrace", &custom.bytes);
    let inspect = clrscope(&["inspect", "--json", path.to_str().unwrap()]);
    assert!(inspect.status.success(), "{inspect:?}");
    assert!(String::from_utf8_lossy(&inspect.stdout).contains("GCAllocationTick"));
    let _ = std::fs::remove_file(&path);

    let gcdump = get(&agent, &format!("/gcdump?pid={pid}"), 200);
    assert_artifact_name(&attachment_name(&gcdump), pid, "gcdump");
    let path = write_temp("stream.gcdump", &gcdump.bytes);
    assert!(gcdump_objects(&path) > 1000);
    let _ = std::fs::remove_file(&path);

    let dump = get(&agent, &format!("/dump?pid={pid}&type=Mini"), 200);
    assert!(attachment_name(&dump).starts_with("core_"));
    assert!(is_elf_core(&dump.bytes), "{} bytes", dump.bytes.len());

    // Bad input: 400 problem+json.
    for bad in [
        format!("/dump?pid={pid}&type=Huge"),
        format!("/trace?pid={pid}&profile=Everything"),
        format!("/trace?pid={pid}&durationSeconds=-2"),
        format!("/gcdump?pid={pid}&egressProvider=nowhere"),
    ] {
        let response = get(&agent, &bad, 400);
        assert_eq!(
            response.header("content-type"),
            Some("application/problem+json")
        );
    }
}

/// Files in `dir` and their total size.
fn folder(dir: &Path) -> (Vec<String>, u64) {
    let mut names = Vec::new();
    let mut bytes = 0;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            names.push(entry.file_name().to_string_lossy().into_owned());
            bytes += entry.metadata().map(|m| m.len()).unwrap_or(0);
        }
    }
    names.sort();
    (names, bytes)
}

#[test]
fn egress_to_a_folder_limits_and_cancellation() {
    let target = Target::builder("Alloc").start();
    let pid = target.pid();
    let dir = data_dir("monitor-egress");
    let out = dir.join("artifacts");
    let config = settings(
        &dir,
        json!({"Egress": {"FileSystem": {"local": {
            "DirectoryPath": out,
            "IntermediateDirectoryPath": dir.join("partial"),
        }}}}),
    );
    let agent = agent_with_config(&dir, pid, &config);

    let accepted = expect(
        request(
            &agent,
            "GET",
            &format!("/gcdump?pid={pid}&egressProvider=local&tags=a,b"),
            &[],
        ),
        202,
        "/gcdump to egress",
        &agent,
    );
    let id = operation_id(&accepted);
    let done = wait_operation(&agent, &id, Duration::from_secs(60));
    assert_eq!(done["status"], "Succeeded", "{done}");
    assert_eq!(done["egressProviderName"], "local");
    assert_eq!(done["process"]["pid"], pid);
    let location = PathBuf::from(done["resourceLocation"].as_str().unwrap());
    assert_eq!(location.parent(), Some(out.as_path()));
    assert_artifact_name(
        location.file_name().unwrap().to_str().unwrap(),
        pid,
        "gcdump",
    );
    assert!(gcdump_objects(&location) > 1000);
    let tagged = get(&agent, "/operations?tags=b", 200).json();
    assert!(tagged
        .as_array()
        .unwrap()
        .iter()
        .any(|o| o["operationId"] == id));

    let dump = expect(
        request(
            &agent,
            "GET",
            &format!("/dump?pid={pid}&type=Mini&egressProvider=local"),
            &[],
        ),
        202,
        "/dump to egress",
        &agent,
    );
    let done = wait_operation(&agent, &operation_id(&dump), Duration::from_secs(120));
    assert_eq!(done["status"], "Succeeded", "{done}");
    let core = std::fs::read(done["resourceLocation"].as_str().unwrap()).unwrap();
    assert!(is_elf_core(&core));

    // Three traces run at once; a fourth is refused with 429.
    let running: Vec<String> = (0..3)
        .map(|i| {
            let response = expect(
                request(
                    &agent,
                    "GET",
                    &format!(
                        "/trace?pid={pid}&profile=Cpu&durationSeconds=120&egressProvider=local"
                    ),
                    &[],
                ),
                202,
                &format!("trace {i}"),
                &agent,
            );
            operation_id(&response)
        })
        .collect();
    let refused = get(&agent, &format!("/trace?pid={pid}&profile=Cpu"), 429);
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    std::thread::sleep(Duration::from_secs(2));
    // One stops early and keeps its trace; the others are cancelled and leave nothing.
    expect(
        request(
            &agent,
            "DELETE",
            &format!("/operations/{}?stop=true", running[0]),
            &[],
        ),
        202,
        "stop",
        &agent,
    );
    for id in &running[1..] {
        expect(
            request(&agent, "DELETE", &format!("/operations/{id}"), &[]),
            200,
            "cancel",
            &agent,
        );
        let status = wait_operation(&agent, id, Duration::from_secs(5));
        assert_eq!(status["status"], "Cancelled", "{status}");
        expect(
            request(&agent, "DELETE", &format!("/operations/{id}"), &[]),
            400,
            "cancel twice",
            &agent,
        );
    }
    let stopped = wait_operation(&agent, &running[0], Duration::from_secs(60));
    assert_eq!(stopped["status"], "Succeeded", "{stopped}");
    let trace = stopped["resourceLocation"].as_str().unwrap();
    let inspect = clrscope(&["inspect", trace]);
    assert!(inspect.status.success(), "{inspect:?}");

    // The folder holds the gcdump, the dump and the stopped trace; nothing is left in the
    // intermediate folder.
    std::thread::sleep(Duration::from_millis(500));
    let (names, _) = folder(&out);
    assert_eq!(names.len(), 3, "{names:?}");
    assert_eq!(folder(&dir.join("partial")).0, Vec::<String>::new());
    let unknown = expect(
        request(
            &agent,
            "GET",
            "/operations/00000000-0000-0000-0000-000000000000",
            &[],
        ),
        400,
        "unknown operation",
        &agent,
    );
    assert!(unknown.body.contains("Operation not found"));
}

#[test]
fn the_disk_budget_is_never_exceeded() {
    let target = Target::builder("Alloc").start();
    let pid = target.pid();
    let dir = data_dir("monitor-budget");
    let out = dir.join("artifacts");
    // Room for two or three traces of a second; ten are written.
    let budget: u64 = 600_000;
    let config = settings(
        &dir,
        json!({"Egress": {
            "FileSystem": {"local": {"DirectoryPath": out}},
            "DiskBudget": {"MaxBytes": budget.to_string()},
        }}),
    );
    let agent = agent_with_config(&dir, pid, &config);
    // Watch the folder the whole time.
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let out = out.clone();
        let watching = watching.clone();
        std::thread::spawn(move || {
            let mut largest = 0;
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                largest = largest.max(folder(&out).1);
                std::thread::sleep(Duration::from_millis(5));
            }
            largest
        })
    };
    let mut succeeded = Vec::new();
    // Whether the last trace failed for the budget: a trace is charged as it is written, so one
    // that outgrows the whole budget has made room by deleting every older artifact first.
    let mut last_failed = false;
    for i in 0..10 {
        let response = expect(
            request(
                &agent,
                "GET",
                &format!("/trace?pid={pid}&profile=Cpu&durationSeconds=1&egressProvider=local"),
                &[],
            ),
            202,
            &format!("trace {i}"),
            &agent,
        );
        let status = wait_operation(&agent, &operation_id(&response), Duration::from_secs(60));
        last_failed = status["status"] != "Succeeded";
        if !last_failed {
            succeeded.push(status["resourceLocation"].as_str().unwrap().to_string());
        } else {
            // A trace larger than the whole budget fails; that is the budget at work too.
            assert!(
                status["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("disk budget"),
                "{status}"
            );
        }
    }
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    let largest = watcher.join().unwrap();
    assert!(
        largest <= budget,
        "the folder reached {largest} bytes > {budget}"
    );
    assert!(succeeded.len() >= 5, "{succeeded:?}");
    let (names, bytes) = folder(&out);
    assert!(bytes <= budget);
    // The newest is kept (unless a later one outgrew the budget), the oldest went.
    let newest = succeeded.last().unwrap();
    assert!(
        last_failed || Path::new(newest).exists(),
        "{newest} was deleted: {names:?}"
    );
    assert!(!Path::new(&succeeded[0]).exists(), "{names:?}");
}

/// moto's S3 server on a free port, killed on drop.
struct Moto {
    child: Child,
    port: u16,
}

impl Moto {
    fn start() -> Moto {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let peers = testbed_dir().join("pypeers");
        assert!(
            peers.join("moto").exists(),
            "moto is not installed in {}: run `make setup`",
            peers.display()
        );
        let child = Command::new("python3")
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .env("PYTHONPATH", &peers)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "moto did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        Moto { child, port }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A signed request's path and query on moto (which refuses anonymous reads).
fn signed<'a>(action: impl rusty_s3::S3Action<'a>) -> String {
    let url = action.sign(Duration::from_secs(600));
    format!("{}?{}", url.path(), url.query().unwrap_or_default())
}

#[test]
fn egress_to_s3_lands_objects_named_as_artifacts() {
    let moto = Moto::start();
    let bucket_name = "clrscope-artifacts";
    let endpoint = format!("http://127.0.0.1:{}", moto.port).parse().unwrap();
    let bucket =
        rusty_s3::Bucket::new(endpoint, rusty_s3::UrlStyle::Path, bucket_name, "us-east-1")
            .unwrap();
    let credentials = rusty_s3::Credentials::new("test", "test");
    expect_status(
        http_request(
            moto.port,
            "PUT",
            &signed(bucket.create_bucket(&credentials)),
            &[],
        ),
        200,
        "creating the bucket",
    );
    let target = Target::builder("Alloc").start();
    let pid = target.pid();
    let dir = data_dir("monitor-s3");
    let config = settings(
        &dir,
        json!({"Egress": {"S3Storage": {
            "bucket": {
                "endpoint": format!("http://127.0.0.1:{}", moto.port),
                "bucketName": bucket_name,
                "regionName": "us-east-1",
                "accessKeyId": "test",
                "secretAccessKey": "test",
                "forcePathStyle": true,
            },
            "presigned": {
                "endpoint": format!("http://127.0.0.1:{}", moto.port),
                "bucketName": bucket_name,
                "accessKeyId": "test",
                "secretAccessKey": "test",
                "forcePathStyle": true,
                "preSignedUrlExpiry": "00:10:00",
            },
        }}}),
    );
    let agent = agent_with_config(&dir, pid, &config);

    // With PreSignedUrlExpiry the answer is a GET URL that needs no other credential.
    let route = format!("/gcdump?pid={pid}&egressProvider=presigned");
    let accepted = expect(request(&agent, "GET", &route, &[]), 202, "gcdump", &agent);
    let done = wait_operation(&agent, &operation_id(&accepted), Duration::from_secs(120));
    assert_eq!(done["status"], "Succeeded", "{done}");
    let url = done["resourceLocation"].as_str().unwrap();
    let path_and_query = url
        .strip_prefix(&format!("http://127.0.0.1:{}", moto.port))
        .unwrap_or_else(|| panic!("{url}"));
    assert!(path_and_query.contains("X-Amz-Signature="), "{url}");
    let object = expect_status(
        http_request(moto.port, "GET", path_and_query, &[]),
        200,
        "the pre-signed URL",
    );
    let path = write_temp("s3-presigned.gcdump", &object.bytes);
    assert!(gcdump_objects(&path) > 1000);
    let _ = std::fs::remove_file(&path);

    // A gcdump fits one part (PutObject); a dump takes several (multipart upload).
    for (route, what) in [
        (format!("/gcdump?pid={pid}&egressProvider=bucket"), "gcdump"),
        (
            format!("/dump?pid={pid}&type=WithHeap&egressProvider=bucket"),
            "dump",
        ),
    ] {
        let accepted = expect(request(&agent, "GET", &route, &[]), 202, what, &agent);
        let done = wait_operation(&agent, &operation_id(&accepted), Duration::from_secs(120));
        assert_eq!(done["status"], "Succeeded", "{done}");
        let location = done["resourceLocation"].as_str().unwrap();
        let key = location
            .strip_prefix(&format!("BucketName={bucket_name}, Key="))
            .unwrap_or_else(|| panic!("{location}"));
        let object = expect_status(
            http_request(
                moto.port,
                "GET",
                &signed(bucket.get_object(Some(&credentials), key)),
                &[],
            ),
            200,
            key,
        );
        if what == "gcdump" {
            assert_artifact_name(key, pid, "gcdump");
            let path = write_temp("s3.gcdump", &object.bytes);
            assert!(gcdump_objects(&path) > 1000);
            let _ = std::fs::remove_file(&path);
        } else {
            assert!(key.starts_with("core_"), "{key}");
            assert!(object.bytes.len() > 5 << 20, "{} bytes", object.bytes.len());
            assert!(is_elf_core(&object.bytes));
        }
    }
}

fn expect_status(response: HttpResponse, status: u16, what: &str) -> HttpResponse {
    assert_eq!(response.status, status, "{what}: {}", response.body);
    response
}

#[test]
fn location_names_the_apis_own_url_never_the_clients_host() {
    let target = Target::builder("Alloc").start();
    let pid = target.pid();
    let dir = data_dir("monitor-location");
    let config = settings(
        &dir,
        json!({"Egress": {"FileSystem": {"local": {"DirectoryPath": dir.join("out")}}}}),
    );
    let agent = agent_with_config(&dir, pid, &config);
    // `localhost` is a Host the agent answers to, but not the address it listens on.
    let message = format!(
        "GET /gcdump?pid={pid}&egressProvider=local HTTP/1.1\r\nHost: localhost:{}\r\n\
         Authorization: Bearer {}\r\nConnection: close\r\n\r\n",
        agent.port,
        agent.token()
    );
    let accepted = http_raw(
        agent.port,
        message.as_bytes(),
        "GET /gcdump (Host: localhost)",
    );
    let accepted = expect(accepted, 202, "gcdump to egress", &agent);
    let location = accepted.header("location").expect("a Location header");
    let id = location.rsplit('/').next().unwrap();
    assert_eq!(
        location,
        format!("http://127.0.0.1:{}/operations/{id}", agent.port)
    );
    wait_operation(&agent, id, Duration::from_secs(120));
}

#[test]
fn a_failed_s3_upload_keeps_its_credentials_out_of_answers_and_logs() {
    let access_key = "AKIACLRSCOPELEAKTEST";
    let secret_key = "clrscope-secret-never-shown";
    // A port nothing listens on: the upload really fails, at connect.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let target = Target::builder("Alloc").start();
    let pid = target.pid();
    let dir = data_dir("monitor-s3-failure");
    let config = settings(
        &dir,
        json!({"Egress": {"S3Storage": {"bucket": {
            "endpoint": format!("http://127.0.0.1:{closed}"),
            "bucketName": "clrscope-artifacts",
            "regionName": "us-east-1",
            "accessKeyId": access_key,
            "secretAccessKey": secret_key,
            "forcePathStyle": true,
        }}}}),
    );
    let agent = agent_with_config(&dir, pid, &config);
    let route = format!("/gcdump?pid={pid}&egressProvider=bucket");
    let accepted = expect(request(&agent, "GET", &route, &[]), 202, "gcdump", &agent);
    let id = operation_id(&accepted);
    let done = wait_operation(&agent, &id, Duration::from_secs(120));
    assert_eq!(done["status"], "Failed", "{done}");
    let listed = get(&agent, "/operations", 200).body;
    for (what, text) in [
        ("the operation", done.to_string()),
        ("the operation list", listed),
        ("the agent's log", agent.log()),
    ] {
        for secret in [
            "X-Amz-Signature",
            "X-Amz-Credential",
            access_key,
            secret_key,
        ] {
            assert!(!text.contains(secret), "{what} holds {secret}:\n{text}");
        }
    }
    // The cause is still there.
    let message = done["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("Connection refused"), "{done}");
}

/// A `sleep` child killed on drop, with a diagnostics socket nobody answers on.
struct DeafProcess {
    child: Child,
    socket: PathBuf,
}

impl Drop for DeafProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

#[test]
fn a_named_process_that_does_not_answer_is_not_called_missing() {
    let dir = data_dir("monitor-deaf");
    std::fs::create_dir_all(&dir).unwrap();
    let child = Command::new("sleep").arg("600").spawn().unwrap();
    let pid = child.id();
    let deaf = DeafProcess {
        socket: support::deaf_socket(pid),
        child,
    };
    let agent = Agent::start(&dir, &["--pid", "1"]);
    // A runtime busy past the listing's wait (seen on a loaded node) and a deaf one look alike
    // to the API: the answer must say the process did not answer, not that there is none.
    let answer = get(&agent, &format!("/process?pid={pid}"), 400);
    let detail = answer.json()["detail"].as_str().unwrap().to_string();
    assert!(
        detail.contains(&format!(
            "process {pid} has a diagnostics socket but did not say who it is"
        )),
        "{detail}"
    );
    let processes = get(&agent, "/processes", 200).json();
    assert!(
        !processes
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pid"] == u64::from(pid)),
        "{processes}"
    );
    // A pid with no socket at all is still missing.
    drop(deaf);
    let missing = get(&agent, &format!("/process?pid={pid}"), 400);
    assert!(missing
        .body
        .contains("Unable to discover a target process."));
}
