//! The agent's authentication end to end, with the real `clrscope generatekey` and `clrscope
//! agent`: every route of the API (from `docs/openapi.json`, which tests/openapi.rs keeps equal
//! to the router, so that a route added there is checked without anyone listing it here)
//! answers 401 to every method without a token, with a token of another key and with an expired
//! token, and something else with the token of the configured key; the metrics listener's
//! `/metrics` and the web UI's files need none. Also: an agent with
//! auth on and no key refuses everything and says how to configure one; `--no-auth` warns.

use crate::support;

use std::time::{SystemTime, UNIX_EPOCH};

use support::agent::{data_dir, Agent, ApiKey};
use support::{http_request, openapi, HttpResponse};

/// No process has this pid: the agent attaches to nothing, so routes that act on a process
/// answer quickly (with an error, which is all this test needs beyond "not 401").
const NO_SUCH_PID: &str = "--pid=999999999";

const METHODS: [&str; 4] = ["GET", "POST", "PUT", "DELETE"];

/// Every route that needs a token, as `docs/openapi.json` lists them (tests/openapi.rs keeps
/// it equal to what the router serves, so a new route is checked here as soon as it exists),
/// with its parameters filled in, and a path no route has (the fallback is covered too).
fn api_routes() -> Vec<String> {
    let doc = openapi::document();
    let mut routes: Vec<String> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, item)| !item.as_object().unwrap().values().all(openapi::is_public))
        .map(|(path, item)| openapi::concrete(path, item))
        .collect();
    for known in [
        "/api/v1/profile",
        "/api/v1/processes",
        "/metrics",
        "/debug/pprof/profile",
    ] {
        assert!(
            routes.iter().any(|r| r.starts_with(known)),
            "{known} not found in {routes:?}"
        );
    }
    routes.push("/no-such-route".to_string());
    routes
}

fn problem_detail(response: &HttpResponse) -> String {
    assert_eq!(
        response.header("content-type"),
        Some("application/problem+json")
    );
    response.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[test]
fn every_api_route_needs_the_configured_keys_token() {
    let routes = api_routes();
    let dir = data_dir("auth-routes");
    let agent = Agent::start(&dir, &[NO_SUCH_PID]);
    let token = agent.token().to_string();
    let other_key = ApiKey::generate(&[]);

    // An agent configured with a key whose token has expired (made in-process: generatekey only
    // makes tokens that expire in the future, and checks allow five minutes of clock skew).
    let expired = ui::auth::generate_key(unix_now() - 3600);
    let expired_agent = Agent::start_with_key(
        &dir.join("expired"),
        &[NO_SUCH_PID],
        Some(ApiKey {
            subject: expired.subject.clone(),
            public_key: expired.public_key.clone(),
            token: expired.token.clone(),
        }),
    );

    let mut checked = 0;
    for route in &routes {
        for method in METHODS {
            let what = format!("{method} {route}");
            let bare = http_request(agent.port, method, route, &[]);
            assert_eq!(bare.status, 401, "{what} without a token: {}", bare.body);
            assert_eq!(bare.header("www-authenticate"), Some("Bearer"), "{what}");
            assert!(
                problem_detail(&bare).contains("Authorization: Bearer"),
                "{what}: {}",
                bare.body
            );

            let other = format!("Bearer {}", other_key.token);
            let wrong = http_request(agent.port, method, route, &[("Authorization", &other)]);
            assert_eq!(wrong.status, 401, "{what} with another key's token");
            assert_eq!(
                wrong.header("www-authenticate"),
                Some("Bearer error=\"invalid_token\"")
            );
            assert!(
                problem_detail(&wrong).contains("signature"),
                "{}",
                wrong.body
            );

            let old = format!("Bearer {}", expired.token);
            let late = http_request(
                expired_agent.port,
                method,
                route,
                &[("Authorization", &old)],
            );
            assert_eq!(late.status, 401, "{what} with an expired token");
            assert!(problem_detail(&late).contains("expired"), "{}", late.body);

            let good = format!("Bearer {token}");
            let answered = http_request(agent.port, method, route, &[("Authorization", &good)]);
            assert_ne!(
                answered.status,
                401,
                "{what} with the configured key's token: {}\nagent log:\n{}",
                answered.body,
                agent.log()
            );
            checked += 1;
        }
    }
    println!(
        "{checked} (method, route) pairs of {} routes checked",
        routes.len()
    );

    // What needs no token: the web UI's files, and /metrics on the metrics listener.
    for file in ["/", "/ui/main.js"] {
        assert_eq!(
            http_request(agent.port, "GET", file, &[]).status,
            200,
            "{file}"
        );
    }
    let metrics = http_request(agent.metrics_port, "GET", "/metrics", &[]);
    assert_eq!(metrics.status, 200, "{}", metrics.body);
    assert!(
        metrics.body.contains("clrscope_processes_attached"),
        "{}",
        metrics.body
    );
    let elsewhere = http_request(agent.metrics_port, "GET", "/api/v1/processes", &[]);
    assert_eq!(
        elsewhere.status, 404,
        "the metrics listener serves /metrics only"
    );
}

#[test]
fn without_a_key_every_request_is_refused_and_the_log_says_how_to_configure_one() {
    let dir = data_dir("auth-unconfigured");
    let agent = Agent::start_with_key(&dir, &[NO_SUCH_PID], None);
    let refused = agent.request("GET", "/api/v1/processes");
    assert_eq!(refused.status, 401);
    let detail = problem_detail(&refused);
    assert!(detail.contains("clrscope generatekey"), "{detail}");
    assert!(detail.contains("--temp-apikey"), "{detail}");
    let log = agent.log();
    assert!(
        log.contains("every API request is refused") && log.contains("no usable API key"),
        "{log}"
    );
}

#[test]
fn no_auth_answers_anyone_and_warns() {
    let dir = data_dir("auth-none");
    let agent = Agent::start_with_key(&dir, &[NO_SUCH_PID, "--no-auth"], None);
    assert_eq!(agent.request("GET", "/api/v1/processes").status, 200);
    assert!(
        agent.log().contains("Authentication has been disabled"),
        "{}",
        agent.log()
    );
}

#[test]
fn a_temporary_key_is_printed_and_accepted() {
    let dir = data_dir("auth-temp");
    let agent = Agent::start_with_key(&dir, &[NO_SUCH_PID, "--temp-apikey"], None);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let token = loop {
        let log = agent.log();
        if let Some(line) = log
            .lines()
            .find(|l| l.starts_with("Authorization: Bearer "))
        {
            break line["Authorization: Bearer ".len()..].to_string();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no token printed:\n{log}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let auth = format!("Bearer {token}");
    let answer = http_request(
        agent.port,
        "GET",
        "/api/v1/processes",
        &[("Authorization", &auth)],
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(agent.request("GET", "/api/v1/processes").status, 401);
}

/// Decodes unpadded base64url (a JWT's parts).
fn base64url(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'-' => 62,
        b'_' => 63,
        _ => panic!("not base64url: {c}"),
    };
    let mut bits = 0u32;
    let mut held = 0;
    let mut out = Vec::new();
    for c in text.bytes() {
        bits = (bits << 6) | u32::from(value(c));
        held += 6;
        if held >= 8 {
            held -= 8;
            out.push((bits >> held) as u8);
        }
    }
    out
}

#[test]
fn a_temporary_key_can_go_to_a_private_file_with_a_shorter_expiry() {
    use std::os::unix::fs::PermissionsExt;
    let dir = data_dir("auth-temp-file");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("token");
    let agent = Agent::start_with_key(
        &dir,
        &[
            NO_SUCH_PID,
            "--temp-apikey",
            "--temp-apikey-expiry",
            "1h",
            "--temp-apikey-file",
            file.to_str().unwrap(),
        ],
        None,
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !agent.log().contains("its token is in") {
        assert!(std::time::Instant::now() < deadline, "{}", agent.log());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let token = std::fs::read_to_string(&file).unwrap().trim().to_string();
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(!agent.log().contains(&token), "the token is in the log");
    let auth = format!("Bearer {token}");
    let answer = http_request(
        agent.port,
        "GET",
        "/api/v1/processes",
        &[("Authorization", &auth)],
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let claims: serde_json::Value =
        serde_json::from_slice(&base64url(token.split('.').nth(1).unwrap())).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let left = claims["exp"].as_i64().unwrap() - now;
    assert!((3500..=3600).contains(&left), "expires in {left} s");
}

#[test]
fn https_serves_the_configured_certificate_and_still_asks_for_the_token() {
    let dir = data_dir("auth-tls");
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl");
    assert!(made.status.success(), "{made:?}");
    // Kestrel's keys, as environment variables.
    let agent = Agent::start_with_env(
        &dir.join("data"),
        &[NO_SUCH_PID, "--urls", "https://127.0.0.1:0"],
        Some(ApiKey::generate(&[])),
        &[
            ("CLRSCOPE_Kestrel__Certificates__Default__Path", &cert),
            ("CLRSCOPE_Kestrel__Certificates__Default__KeyPath", &key),
        ],
    );
    let curl = |auth: Option<String>| {
        let mut command = std::process::Command::new("curl");
        command
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
            .arg(&cert);
        if let Some(auth) = auth {
            command.args(["-H", &auth]);
        }
        let out = command
            .arg(format!("https://127.0.0.1:{}/api/v1/processes", agent.port))
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(curl(None), "401");
    assert_eq!(
        curl(Some(format!("Authorization: Bearer {}", agent.token()))),
        "200"
    );
    assert!(agent.log().contains("API on https://"), "{}", agent.log());
}
