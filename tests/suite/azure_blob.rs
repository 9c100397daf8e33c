//! Egress to Azure Blob Storage against Azurite (the Azure Storage emulator, npm `azurite`, which
//! `make setup` installs into .testbed/node), started by each test on free ports of 127.0.0.1:
//! blobs hold exactly what a FileSystem egress of the same bytes holds, with Shared Key and with
//! a SAS; a queue message names each blob; the agent's `/gcdump`, `/dump` and a rule's
//! CollectTrace land as blobs; a 1 GiB dump streams through with the agent's RSS bounded; and an
//! Azurite stopped mid-upload fails the upload after its retries, leaving nothing under the
//! blob's name; a real artifact (`/exceptions`) egressed as a blob and into a folder holds the
//! same bytes, and the blob carries dotnet-monitor's metadata (read back with curl).

use crate::support;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use exporter::egress::{ArtifactOrigin, Egress, EgressConfig, EgressError};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use support::agent::{data_dir, Agent};
use support::{http_request, testbed_dir, HttpResponse, ScratchDir, Target};
use tokio::io::AsyncWriteExt;

/// Azurite's well-known account and key (its docs and `src/common/utils/constants.ts`).
const ACCOUNT: &str = "devstoreaccount1";
const KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Azurite's blob and queue services, storing under a fresh folder; killed on drop (and then the
/// folder removed).
struct Azurite {
    child: Option<Child>,
    blob_port: u16,
    queue_port: u16,
    location: ScratchDir,
}

impl Azurite {
    fn start(name: &str) -> Azurite {
        let location = data_dir(&format!("azurite-{name}"));
        let mut azurite = Azurite {
            child: None,
            blob_port: free_port(),
            queue_port: free_port(),
            location,
        };
        azurite.run();
        azurite
    }

    fn run(&mut self) {
        let bin = testbed_dir().join("node/node_modules/.bin/azurite");
        assert!(
            bin.exists(),
            "azurite is not installed at {}: run `make setup`",
            bin.display()
        );
        std::fs::create_dir_all(&self.location).unwrap();
        let child = Command::new(bin)
            .args(["--silent", "--disableTelemetry", "--location"])
            .arg(self.location.as_os_str())
            .args(["--blobHost", "127.0.0.1", "--blobPort"])
            .arg(self.blob_port.to_string())
            .args(["--queueHost", "127.0.0.1", "--queuePort"])
            .arg(self.queue_port.to_string())
            .args(["--tableHost", "127.0.0.1", "--tablePort"])
            .arg(free_port().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start azurite");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        for port in [self.blob_port, self.queue_port] {
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(Instant::now() < deadline, "azurite did not start");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn blob_uri(&self) -> String {
        format!("http://127.0.0.1:{}/{ACCOUNT}", self.blob_port)
    }

    fn queue_uri(&self) -> String {
        format!("http://127.0.0.1:{}/{ACCOUNT}", self.queue_port)
    }

    /// An account SAS (version 2018-11-09) for the blob and queue services, all permissions,
    /// valid for a day: learn.microsoft.com/rest/api/storageservices/create-account-sas.
    fn sas(&self) -> String {
        let (permissions, services, types, version) = ("rwdlacup", "bq", "sco", "2018-11-09");
        let expiry =
            chrono::DateTime::<chrono::Utc>::from(SystemTime::now() + Duration::from_secs(86_400))
                .format("%Y-%m-%dT%H:%M:%SZ")
                .to_string();
        let to_sign = format!(
            "{ACCOUNT}\n{permissions}\n{services}\n{types}\n\n{expiry}\n\nhttp\n{version}\n"
        );
        let mut mac = Hmac::<Sha256>::new_from_slice(&STANDARD.decode(KEY).unwrap()).unwrap();
        mac.update(to_sign.as_bytes());
        let signature = STANDARD.encode(mac.finalize().into_bytes());
        let encode = |s: &str| {
            s.bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                        (b as char).to_string()
                    }
                    _ => format!("%{b:02X}"),
                })
                .collect::<String>()
        };
        format!(
            "sv={version}&ss={services}&srt={types}&sp={permissions}&se={}&spr=http&sig={}",
            encode(&expiry),
            encode(&signature)
        )
    }

    /// `GET /<account>/<path>?<SAS>&<query>` on the blob (or queue) service.
    fn get(&self, queue: bool, path: &str, query: &str) -> HttpResponse {
        let port = if queue {
            self.queue_port
        } else {
            self.blob_port
        };
        let mut target = format!("/{ACCOUNT}/{path}?{}", self.sas());
        if !query.is_empty() {
            target.push('&');
            target.push_str(query);
        }
        http_request(port, "GET", &target, &[])
    }

    /// The blob at `url` (what an egress answered), or its status if it is not there.
    fn blob(&self, url: &str) -> Result<Vec<u8>, u16> {
        let path = url
            .strip_prefix(&format!("{}/", self.blob_uri()))
            .unwrap_or_else(|| panic!("{url} is not under {}", self.blob_uri()));
        assert!(!url.contains('?'), "the answer carries a query: {url}");
        let response = self.get(false, path, "");
        if response.status == 200 {
            Ok(response.bytes)
        } else {
            Err(response.status)
        }
    }

    /// The texts of the messages on `queue` (peeked, base64-decoded as dotnet-monitor encodes).
    fn messages(&self, queue: &str) -> Vec<String> {
        let response = self.get(
            true,
            &format!("{queue}/messages"),
            "peekonly=true&numofmessages=32",
        );
        assert_eq!(response.status, 200, "{}", response.body);
        response
            .body
            .split("<MessageText>")
            .skip(1)
            .filter_map(|rest| rest.split("</MessageText>").next())
            .map(|text| String::from_utf8(STANDARD.decode(text).unwrap()).unwrap())
            .collect()
    }
}

/// The metadata of the blob at `url` as Azurite answers it to curl (`HEAD`, the `x-ms-meta-*`
/// headers), names lower-cased (the Blob service matches them without regard to case).
fn blob_metadata(azurite: &Azurite, url: &str) -> std::collections::BTreeMap<String, String> {
    let out = Command::new("curl")
        .args(["-sS", "--head", "--fail"])
        .arg(format!("{url}?{}", azurite.sas()))
        .output()
        .expect("curl");
    assert!(out.status.success(), "curl: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            let name = name.trim().to_ascii_lowercase();
            let key = name.strip_prefix("x-ms-meta-")?;
            Some((key.to_string(), value.trim().to_string()))
        })
        .collect()
}

impl Drop for Azurite {
    fn drop(&mut self) {
        self.stop();
    }
}

fn egress(config: Value) -> Egress {
    let config: EgressConfig = serde_json::from_value(config).unwrap();
    Egress::new(&config).unwrap()
}

/// Bytes that compress badly and differ at every offset.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| rng.u8(..)).collect()
}

/// Writes `bytes` to `provider` as artifact `name` in pieces; returns where it went, or why not.
async fn upload(
    egress: &Egress,
    provider: &str,
    name: &str,
    bytes: &[u8],
) -> Result<String, EgressError> {
    let mut upload = egress
        .start(provider, name, &ArtifactOrigin::default())
        .unwrap();
    let mut written = Ok(());
    for piece in bytes.chunks(100_000) {
        written = upload.write_all(piece).await;
        if written.is_err() {
            break;
        }
    }
    match written {
        Ok(()) => upload.finish().await,
        Err(_) => match upload.abort().await {
            Ok(()) => panic!("the write failed but the upload did not"),
            Err(error) => Err(error),
        },
    }
}

fn artifact_name(seconds: u64) -> String {
    profile::artifact::ArtifactKind::GcDump.file_name(
        4242,
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + seconds),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blobs_hold_what_a_folder_holds_with_shared_key_and_sas() {
    let azurite = Azurite::start("bytes");
    let dir = data_dir("azure-bytes-folder");
    let egress = egress(json!({
        "FileSystem": {"folder": {"DirectoryPath": &*dir}},
        "AzureBlobStorage": {
            "keyed": {
                "accountUri": azurite.blob_uri(),
                "containerName": "artifacts",
                "accountKeyName": "StorageKey",
                "queueName": "announced",
                "queueAccountUri": azurite.queue_uri(),
                "CopyBufferSize": 1 << 20,
            },
            "signed": {
                "AccountUri": azurite.blob_uri(),
                "ContainerName": "artifacts",
                "BlobPrefix": "incidents/node-7",
                "SharedAccessSignature": format!("?{}", azurite.sas()),
                "QueueName": "announced",
                "QueueAccountUri": azurite.queue_uri(),
            },
        },
        "Properties": {"StorageKey": KEY},
    }));
    // 9.5 blocks of 1 MiB, one block of the default 4 MiB and a bit, and nothing at all.
    let cases = [
        ("keyed", noise((19 << 19) + 123, 1), artifact_name(1)),
        ("signed", noise((4 << 20) + 5, 2), artifact_name(2)),
    ];
    // An artifact with no bytes is not written anywhere (issue 44, item 10).
    let empty = upload(&egress, "keyed", &artifact_name(3), &[]).await;
    assert_eq!(format!("{empty:?}"), "Err(Empty)", "an empty artifact");
    let mut blob_names = Vec::new();
    for (provider, bytes, name) in &cases {
        let path = upload(&egress, "folder", name, bytes).await.unwrap();
        let url = upload(&egress, provider, name, bytes).await.unwrap();
        let expected_path = match *provider {
            "keyed" => format!("artifacts/{name}"),
            _ => format!("artifacts/incidents/node-7/{name}"),
        };
        assert_eq!(url, format!("{}/{expected_path}", azurite.blob_uri()));
        let blob = azurite.blob(&url).unwrap();
        let file = std::fs::read(&path).unwrap();
        assert_eq!(blob.len(), file.len(), "{url}");
        assert!(blob == file, "{url} differs from {path}");
        assert_eq!(blob, *bytes);
        blob_names.push(expected_path.trim_start_matches("artifacts/").to_string());
        let _ = std::fs::remove_file(&path);
    }
    // A message per blob, naming it.
    assert_eq!(azurite.messages("announced"), blob_names);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_cut_off_mid_way_retries_fails_clearly_and_leaves_no_blob() {
    let mut azurite = Azurite::start("cut");
    let egress = egress(json!({"AzureBlobStorage": {"blob": {
        "accountUri": azurite.blob_uri(),
        "containerName": "artifacts",
        "sharedAccessSignature": azurite.sas(),
        "copyBufferSize": 1 << 20,
        "maxRetries": 2,
    }}}));
    let name = artifact_name(10);
    let bytes = noise(8 << 20, 3);
    let mut upload = egress
        .start("blob", &name, &ArtifactOrigin::default())
        .unwrap();
    upload.write_all(&bytes[..3 << 20]).await.unwrap();
    // Two blocks are in (the third may be on its way): the service goes away.
    let deadline = Instant::now() + Duration::from_secs(60);
    while count_uncommitted(&azurite, &name) < 2 {
        assert!(Instant::now() < deadline, "no blocks reached azurite");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Uploaded blocks are not the blob: nothing is under its name until they are committed.
    let url = format!("{}/artifacts/{name}", azurite.blob_uri());
    assert_eq!(azurite.blob(&url), Err(404));
    // The clock starts before the service goes away: a block in flight fails, and its first
    // back-off starts, while `stop` is still waiting for Azurite to exit.
    let started = Instant::now();
    azurite.stop();
    let written = upload.write_all(&bytes[3 << 20..]).await;
    let error = match written {
        Ok(()) => upload.finish().await.unwrap_err(),
        Err(_) => upload.abort().await.unwrap_err(),
    };
    let message = error.to_string();
    eprintln!(
        "failed after {:.3} s: {message}",
        started.elapsed().as_secs_f64()
    );
    assert!(matches!(error, EgressError::AzureBlob { .. }), "{message}");
    assert!(message.contains("Put Block"), "{message}");
    assert!(message.contains("3 attempts"), "{message}");
    assert!(!message.contains("sig="), "the SAS leaked: {message}");
    // Two back-offs (0.8 s, 1.6 s) passed before it gave up.
    assert!(
        started.elapsed() >= Duration::from_millis(2400),
        "{message}"
    );

    // Back up (a killed Azurite may have lost what it had not saved yet): still no blob.
    azurite.run();
    assert_eq!(azurite.blob(&url), Err(404));
    let listing = azurite.get(false, "artifacts", "restype=container&comp=list");
    assert!(!listing.body.contains(&name), "{}", listing.body);
}

/// The blocks of `name` uploaded but not committed.
fn count_uncommitted(azurite: &Azurite, name: &str) -> usize {
    let response = azurite.get(
        false,
        &format!("artifacts/{name}"),
        "comp=blocklist&blocklisttype=uncommitted",
    );
    if response.status != 200 {
        return 0;
    }
    response.body.matches("<Block>").count()
}

/// A settings.json in `dir` with Azure Blob providers `keyed` (Shared Key, queue) and `signed`
/// (SAS), and a rule collecting a 5 s trace into `keyed` once the process is attached.
fn agent_settings(dir: &Path, azurite: &Azurite, pid: u32) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("settings.json");
    let settings = json!({
        "Egress": {"AzureBlobStorage": {
            "keyed": {
                "accountUri": azurite.blob_uri(),
                "containerName": "artifacts",
                "accountKey": KEY,
                "queueName": "announced",
                "queueAccountUri": azurite.queue_uri(),
            },
            "signed": {
                "accountUri": azurite.blob_uri(),
                "containerName": "dumps",
                "sharedAccessSignature": azurite.sas(),
                "copyBufferSize": "8MiB",
            },
        }},
        "CollectionRules": {"TraceAtStart": {
            "Filters": [{"Key": "ProcessId", "Value": pid.to_string()}],
            "Trigger": {"Type": "Startup"},
            "Actions": [{"Type": "CollectTrace", "Settings": {
                "Profile": "Cpu", "Duration": "00:00:05", "Egress": "keyed"}}]
        }}
    });
    std::fs::write(&path, settings.to_string()).unwrap();
    path
}

/// An agent with its data and [`agent_settings`] in `dir`.
fn start_agent(dir: &Path, azurite: &Azurite, pid: u32) -> Agent {
    let config = agent_settings(dir, azurite, pid);
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

/// Starts `route` as an operation and waits for it; returns its final status.
fn run_operation(agent: &Agent, route: &str, watch: impl FnMut()) -> Value {
    let accepted = agent.expect_status(agent.request("GET", route), 202, route);
    let location = accepted
        .header("location")
        .expect("a Location header")
        .to_string();
    let id = location.rsplit('/').next().unwrap().to_string();
    let mut watch = watch;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        watch();
        let status = agent.request("GET", &format!("/operations/{id}")).json();
        if status["status"] != "Running" && status["status"] != "Stopping" {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "{route}: still {status}; agent log:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn clrscope_gcdump_objects(bytes: &[u8]) -> u64 {
    let path = std::env::temp_dir().join(format!("clrscope-azure-{}.gcdump", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    let report = Command::new(env!("CARGO_BIN_EXE_clrscope"))
        .args(["gcdump", "report", "--json", path.to_str().unwrap()])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(report.status.success(), "{report:?}");
    let report: Value = serde_json::from_slice(&report.stdout).unwrap();
    report["objects"].as_u64().unwrap()
}

fn is_elf_core(bytes: &[u8]) -> bool {
    bytes.len() > 64 && bytes[..4] == *b"\x7fELF" && u16::from_le_bytes([bytes[16], bytes[17]]) == 4
}

#[test]
fn the_agents_gcdump_dump_and_rule_trace_land_as_blobs() {
    let azurite = Azurite::start("agent");
    let target = Target::builder("Alloc").start();
    let pid = target.pid();
    let dir = data_dir("azure-agent");
    let agent = start_agent(&dir, &azurite, pid);
    agent.wait_attached(pid, true, Duration::from_secs(120));

    let gcdump = run_operation(
        &agent,
        &format!("/gcdump?pid={pid}&egressProvider=keyed"),
        || {},
    );
    assert_eq!(gcdump["status"], "Succeeded", "{gcdump}");
    let url = gcdump["resourceLocation"].as_str().unwrap();
    assert!(url.ends_with(&format!("_{pid}.gcdump")), "{url}");
    assert!(clrscope_gcdump_objects(&azurite.blob(url).unwrap()) > 1000);

    let dump = run_operation(
        &agent,
        &format!("/dump?pid={pid}&type=WithHeap&egressProvider=signed"),
        || {},
    );
    assert_eq!(dump["status"], "Succeeded", "{dump}");
    let url = dump["resourceLocation"].as_str().unwrap();
    assert!(
        url.starts_with(&format!("{}/dumps/core_", azurite.blob_uri())),
        "{url}"
    );
    let core = azurite.blob(url).unwrap();
    assert!(
        core.len() > 8 << 20 && is_elf_core(&core),
        "{} bytes",
        core.len()
    );

    // The rule's trace: a nettrace blob, announced on the queue like the gcdump.
    let deadline = Instant::now() + Duration::from_secs(180);
    let trace = loop {
        let messages = azurite.messages("announced");
        if let Some(trace) = messages.iter().find(|m| m.ends_with(".nettrace")) {
            break trace.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no trace announced: {messages:?}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let bytes = azurite
        .blob(&format!("{}/artifacts/{trace}", azurite.blob_uri()))
        .unwrap();
    assert!(
        bytes.starts_with(b"Nettrace"),
        "{trace}: {:?}",
        &bytes[..16.min(bytes.len())]
    );
    // The rule's blob says which rule and action made it, as dotnet-monitor's does.
    let metadata = blob_metadata(
        &azurite,
        &format!("{}/artifacts/{trace}", azurite.blob_uri()),
    );
    assert_eq!(
        metadata
            .get("dotnetmonitor_collectionrulename")
            .map(String::as_str),
        Some("TraceAtStart"),
        "{metadata:?}"
    );
    assert_eq!(
        metadata
            .get("dotnetmonitor_actionlistindex")
            .map(String::as_str),
        Some("0")
    );
    assert_eq!(
        metadata.get("dotnetmonitor_actionname").map(String::as_str),
        Some("Action1")
    );
    assert_eq!(
        metadata.get("dotnetmonitor_artifactsource_processid"),
        Some(&pid.to_string())
    );
    let messages = azurite.messages("announced");
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert!(
        messages
            .iter()
            .any(|m| m.ends_with(&format!("_{pid}.gcdump"))),
        "{messages:?}"
    );
}

/// A Full dump of a process holding 1 GiB goes up in 4 MiB blocks: the agent's resident memory
/// stays under 128 MiB throughout (sampled every 100 ms).
#[test]
fn a_1_gib_dump_streams_with_the_agents_rss_bounded() {
    let azurite = Azurite::start("large");
    let target = Target::builder("Alloc")
        .args([
            "--keep",
            "1000,1000,1024",
            "--blob-bytes",
            "1048576",
            "--churn-per-second",
            "0",
        ])
        .start();
    let pid = target.pid();
    let dir = data_dir("azure-large");
    let agent = start_agent(&dir, &azurite, pid);
    agent.wait_attached(pid, true, Duration::from_secs(120));
    let mut peak_kib = 0;
    let started = Instant::now();
    let dump = run_operation(
        &agent,
        &format!("/dump?pid={pid}&type=Full&egressProvider=keyed"),
        || peak_kib = peak_kib.max(agent.rss_kib()),
    );
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(dump["status"], "Succeeded", "{dump}\n{}", agent.log());
    let url = dump["resourceLocation"].as_str().unwrap();
    let path = url
        .strip_prefix(&format!("{}/", azurite.blob_uri()))
        .unwrap();
    let head = http_request(
        azurite.blob_port,
        "HEAD",
        &format!("/{ACCOUNT}/{path}?{}", azurite.sas()),
        &[],
    );
    assert_eq!(head.status, 200);
    let bytes: u64 = head.header("content-length").unwrap().parse().unwrap();
    eprintln!(
        "{bytes} bytes in {seconds:.1} s ({:.0} MiB/s); agent RSS peak {} MiB",
        bytes as f64 / seconds / 1048576.0,
        peak_kib / 1024
    );
    assert!(bytes >= 1 << 30, "the dump has {bytes} bytes");
    assert!(peak_kib < 128 * 1024, "agent RSS reached {peak_kib} KiB");
}

/// A real artifact egressed both ways holds the same bytes: the `Logs` target throws 30 episodes
/// (60 exceptions), from 5 s after it started, and stops, so its exception history no longer
/// changes; `/exceptions` egressed
/// into a folder and as a blob are then equal. The blob carries dotnet-monitor's metadata: the
/// built-in `DotnetMonitor_*` keys and each `Metadata` name whose environment variable the target
/// has (one it lacks is left out).
#[test]
fn exceptions_egressed_as_a_blob_equal_the_folders_and_carry_metadata() {
    let azurite = Azurite::start("metadata");
    let mut target = Target::builder("Logs")
        .args([
            "--messages-per-second",
            "0",
            "--exceptions-per-second",
            "20",
            "--exceptions-total",
            "30",
            "--exceptions-after-seconds",
            "5",
            "--no-span-lines",
        ])
        .env("CLRSCOPE_TEST_TEAM", "payments-7")
        .start();
    let pid = target.pid();
    let dir = data_dir("azure-metadata-config");
    std::fs::create_dir_all(&dir).unwrap();
    let folder = data_dir("azure-metadata-folder");
    let config = dir.join("settings.json");
    let settings = json!({"Egress": {
        "FileSystem": {"folder": {"DirectoryPath": &*folder}},
        "AzureBlobStorage": {"keyed": {
            "accountUri": azurite.blob_uri(),
            "containerName": "exceptions",
            "accountKey": KEY,
            "metadata": {"Team": "CLRSCOPE_TEST_TEAM", "Missing": "CLRSCOPE_TEST_NOT_SET"},
        }},
    }});
    std::fs::write(&config, settings.to_string()).unwrap();
    let data = data_dir("azure-metadata");
    let agent = Agent::start(
        &data,
        &[
            "--pid",
            &pid.to_string(),
            "--config",
            config.to_str().unwrap(),
        ],
    );
    agent.wait_attached(pid, true, Duration::from_secs(120));
    // All 30 episodes thrown, and the listing no longer changes (those thrown before the agent
    // attached, if it was slow, are not in it).
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut episodes = 0;
    let mut last_count = usize::MAX;
    let count = loop {
        for line in target.drain_lines() {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if let Some(n) = v.pointer("/totals/episodes").and_then(Value::as_u64) {
                    episodes = n;
                }
            }
        }
        let listed = agent.request("GET", &format!("/exceptions?pid={pid}"));
        let count = listed.body.matches("First chance exception at ").count();
        if episodes == 30 && count == last_count && count >= 20 {
            break count;
        }
        last_count = count;
        assert!(
            Instant::now() < deadline,
            "{episodes} episodes, {count} exceptions listed\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(1000));
    };
    let to_folder = run_operation(
        &agent,
        &format!("/exceptions?pid={pid}&egressProvider=folder"),
        || {},
    );
    assert_eq!(to_folder["status"], "Succeeded", "{to_folder}");
    let path = to_folder["resourceLocation"].as_str().unwrap().to_string();
    let to_blob = run_operation(
        &agent,
        &format!("/exceptions?pid={pid}&egressProvider=keyed"),
        || {},
    );
    assert_eq!(to_blob["status"], "Succeeded", "{to_blob}");
    let url = to_blob["resourceLocation"].as_str().unwrap();
    assert!(url.ends_with(&format!("_{pid}.exceptions.txt")), "{url}");
    let file = std::fs::read(&path).unwrap();
    let blob = azurite.blob(url).unwrap();
    let text = String::from_utf8_lossy(&file);
    assert_eq!(
        text.matches("First chance exception at ").count(),
        count,
        "{text}"
    );
    assert!(
        blob == file,
        "{url} ({} bytes) differs from {path} ({} bytes)",
        blob.len(),
        file.len()
    );
    println!(
        "/exceptions: {count} exceptions, {} bytes, equal as a blob and as a file",
        blob.len()
    );

    let metadata = blob_metadata(&azurite, url);
    let uid = agent.request("GET", "/processes").json();
    let uid = uid
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap()["uid"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        metadata.get("team").map(String::as_str),
        Some("payments-7"),
        "{metadata:?}"
    );
    assert_eq!(
        metadata.get("dotnetmonitor_artifactsource_processid"),
        Some(&pid.to_string())
    );
    assert_eq!(
        metadata
            .get("dotnetmonitor_artifactsource_runtimeinstancecookie")
            .map(|c| c.to_ascii_lowercase()),
        Some(uid)
    );
    assert!(!metadata.contains_key("missing"), "{metadata:?}");
    assert!(
        !metadata.contains_key("dotnetmonitor_collectionrulename"),
        "an API request is no rule: {metadata:?}"
    );
}
