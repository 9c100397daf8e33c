//! The agent's listeners against hostile clients (issue 18): foreign `Host` names (DNS
//! rebinding), cross-site browser requests, `Location` headers, connections that send nothing
//! or trickle their headers, and more connections than the cap. The agent runs in listen mode on
//! a socket no runtime dials, so it holds no connection but the test's.

use crate::support;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::agent::{data_dir, Agent, ApiKey};
use support::{http_raw, http_request, http_request_with_body, HttpResponse, ScratchDir};

/// An agent on free loopback ports that profiles nothing, with `key` (None: `--no-auth`), after
/// its data folder (bound first, the folder outlives the agent).
fn agent(name: &str, key: Option<ApiKey>, extra: &[&str]) -> (ScratchDir, Agent) {
    let dir = data_dir(name);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("diag.sock");
    let mut args = vec![
        "--no-connect",
        "--diagnostic-port",
        socket.to_str().unwrap(),
        "--no-runtime-metrics",
    ];
    if key.is_none() {
        args.push("--no-auth");
    }
    args.extend_from_slice(extra);
    let args: Vec<String> = args.into_iter().map(str::to_string).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Agent::start_with_key(&dir, &args, key);
    (dir, agent)
}

/// `GET path` with exactly `host` as its Host (and the agent's token, if any).
fn get_with_host(agent: &Agent, port: u16, path: &str, host: &str) -> HttpResponse {
    let auth = agent
        .key
        .as_ref()
        .map(|k| format!("Authorization: Bearer {}\r\n", k.token))
        .unwrap_or_default();
    let message = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n");
    http_raw(
        port,
        message.as_bytes(),
        &format!("GET {path} (Host: {host})"),
    )
}

fn expect(response: &HttpResponse, status: u16, what: &str, agent: &Agent) {
    agent.expect_status(response.clone(), status, what);
}

#[test]
fn a_foreign_host_is_refused_with_and_without_auth() {
    for key in [None, Some(ApiKey::generate(&[]))] {
        let authenticated = key.is_some();
        let (_dir, agent) = agent("hostile-host", key, &[]);
        for (port, path) in [
            (agent.port, "/api/v1/processes"),
            (agent.port, "/"),
            (agent.metrics_port, "/metrics"),
        ] {
            for host in [
                "rebind.evil.example",
                "rebind.evil.example:52323",
                "127.0.0.1.evil.example",
            ] {
                let refused = get_with_host(&agent, port, path, host);
                expect(
                    &refused,
                    400,
                    &format!("{path} with Host {host} (auth {authenticated})"),
                    &agent,
                );
                assert_eq!(
                    refused.header("content-type"),
                    Some("application/problem+json")
                );
                let problem = refused.json();
                assert_eq!(
                    problem["type"], "urn:clrscope:problem:foreign-host",
                    "{problem}"
                );
                assert!(
                    problem["detail"].as_str().unwrap().contains("AllowedHosts"),
                    "{problem}"
                );
            }
            for host in [
                format!("127.0.0.1:{port}"),
                format!("localhost:{port}"),
                "localhost".into(),
            ] {
                let allowed = get_with_host(&agent, port, path, &host);
                expect(&allowed, 200, &format!("{path} with Host {host}"), &agent);
            }
        }
    }
    // A configured name is answered.
    let (_dir, agent) = agent(
        "hostile-host-allowed",
        None,
        &["--allowed-hosts", "clrscope.example;*.svc.local"],
    );
    for host in ["clrscope.example", "agent.ns.svc.local:52323"] {
        expect(
            &get_with_host(&agent, agent.port, "/api/v1/processes", host),
            200,
            host,
            &agent,
        );
    }
    expect(
        &get_with_host(&agent, agent.port, "/api/v1/processes", "svc.local"),
        400,
        "svc.local",
        &agent,
    );
}

#[test]
fn cross_site_requests_that_change_state_are_refused() {
    for key in [None, Some(ApiKey::generate(&[]))] {
        let (_dir, agent) = agent("hostile-origin", key.clone(), &[]);
        let port = agent.port;
        let bearer = key.as_ref().map(|k| format!("Bearer {}", k.token));
        let send = |method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]| {
            let mut headers = headers.to_vec();
            if let Some(bearer) = &bearer {
                headers.push(("Authorization", bearer));
            }
            http_request_with_body(port, method, path, &headers, body)
        };
        // A page on another site: a form-like text/plain POST (no preflight) that would boost
        // the sampler for an hour, and a DELETE.
        let evil = [
            ("Origin", "http://evil.example"),
            ("Content-Type", "text/plain"),
        ];
        for (method, path) in [
            ("POST", "/api/v1/processes/1/boost?duration=1h"),
            ("DELETE", "/operations/00000000-0000-0000-0000-000000000000"),
            ("POST", "/querier.v1.QuerierService/ProfileTypes"),
        ] {
            let refused = send(method, path, &evil, b"x");
            expect(
                &refused,
                403,
                &format!("{method} {path} from evil.example"),
                &agent,
            );
            assert_eq!(
                refused.json()["type"],
                "urn:clrscope:problem:cross-site-request"
            );
        }
        let fetch_metadata = [
            ("Sec-Fetch-Site", "cross-site"),
            ("Content-Type", "text/plain"),
        ];
        let refused = send("POST", "/api/v1/processes/1/boost", &fetch_metadata, b"x");
        expect(&refused, 403, "Sec-Fetch-Site: cross-site", &agent);
        // Another local web app (another port) is another origin.
        let local = [
            ("Origin", "http://127.0.0.1:3000"),
            ("Content-Type", "text/plain"),
        ];
        expect(
            &send("POST", "/api/v1/processes/1/boost", &local, b"x"),
            403,
            "port 3000",
            &agent,
        );
        // A GET that starts work, from an <img> on another site.
        let image = [
            ("Sec-Fetch-Site", "cross-site"),
            ("Sec-Fetch-Mode", "no-cors"),
        ];
        expect(
            &send("GET", "/dump?pid=1", &image, b""),
            403,
            "cross-site GET /dump",
            &agent,
        );

        // The web UI's own requests, and clients that are not browsers, go through.
        let own_origin = format!("http://127.0.0.1:{port}");
        let json = ("Content-Type", "application/json");
        for headers in [
            vec![json],
            vec![json, ("Origin", own_origin.as_str())],
            vec![
                json,
                ("Sec-Fetch-Site", "same-origin"),
                ("Origin", own_origin.as_str()),
            ],
        ] {
            let answer = send(
                "POST",
                "/querier.v1.QuerierService/ProfileTypes",
                &headers,
                b"{}",
            );
            expect(
                &answer,
                200,
                &format!("same-origin POST {headers:?}"),
                &agent,
            );
        }
        // A link to the web UI from another site still opens it.
        let navigation = [
            ("Sec-Fetch-Site", "cross-site"),
            ("Sec-Fetch-Mode", "navigate"),
        ];
        expect(
            &send("GET", "/", &navigation, b""),
            200,
            "cross-site navigation to /",
            &agent,
        );
    }
}

/// Reads from `stream` until the server closes it (EOF or reset) or `timeout` passes; whether
/// it closed. The client keeps writing `trickle` one byte at a time every `every`, if given.
fn wait_closed(
    stream: &mut TcpStream,
    trickle: Option<(&[u8], Duration)>,
    timeout: Duration,
) -> bool {
    let deadline = Instant::now() + timeout;
    let mut next = 0;
    let step = trickle.map_or(Duration::from_millis(200), |(_, every)| every);
    stream.set_read_timeout(Some(step)).unwrap();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
        if let Some((bytes, _)) = trickle {
            if next < bytes.len() {
                if stream.write_all(&bytes[next..=next]).is_err() {
                    return true;
                }
                next += 1;
            }
        }
    }
    false
}

#[test]
fn idle_and_slow_header_connections_are_closed_after_their_timeouts() {
    let (_dir, agent) = agent(
        "hostile-timeouts",
        None,
        &[
            "--request-headers-timeout",
            "2s",
            "--keep-alive-timeout",
            "3s",
        ],
    );
    for port in [agent.port, agent.metrics_port] {
        // Headers one byte every 300 ms: 400 bytes would take two minutes.
        let mut slow = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let head = format!(
            "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Pad: {}\r\n\r\n",
            "a".repeat(340)
        );
        let closed = wait_closed(
            &mut slow,
            Some((head.as_bytes(), Duration::from_millis(300))),
            Duration::from_secs(90),
        );
        assert!(
            closed,
            "port {port}: a slow header was never cut off; agent log:\n{}",
            agent.log()
        );

        // A connection that sends nothing.
        let mut idle = TcpStream::connect(("127.0.0.1", port)).unwrap();
        assert!(
            wait_closed(&mut idle, None, Duration::from_secs(90)),
            "port {port}: an idle connection stayed open; agent log:\n{}",
            agent.log()
        );

        // A keep-alive connection after its answer.
        let mut kept = TcpStream::connect(("127.0.0.1", port)).unwrap();
        kept.write_all(
            format!("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").as_bytes(),
        )
        .unwrap();
        let mut first = [0u8; 12];
        kept.read_exact(&mut first).unwrap();
        assert_eq!(&first, b"HTTP/1.1 200", "port {port}");
        assert!(
            wait_closed(&mut kept, None, Duration::from_secs(90)),
            "port {port}: an idle keep-alive connection stayed open"
        );
    }
    // The agent still answers.
    expect(
        &http_request(agent.port, "GET", "/api/v1/processes", &[]),
        200,
        "after",
        &agent,
    );
}

/// The agent's open sockets (its listeners, its listen-mode socket and its connections).
fn agent_sockets(agent: &Agent) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", agent.pid()))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"))
        })
        .count()
}

#[test]
fn the_connection_cap_holds_and_the_api_still_answers() {
    const CAP: usize = 8;
    const FLOOD: usize = 100;
    let (_dir, agent) = agent(
        "hostile-cap",
        Some(ApiKey::generate(&[])),
        &["--max-connections", &CAP.to_string()],
    );
    let baseline = agent_sockets(&agent);
    for port in [agent.port, agent.metrics_port] {
        let mut flood: Vec<TcpStream> = (0..FLOOD)
            .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
            .collect();
        // Half of them trickle a header.
        for stream in flood.iter_mut().step_by(2) {
            stream.write_all(b"GET /metrics HTTP/1.1\r\nHo").unwrap();
        }
        // Accepted in order: once this is answered, every connection above has been accepted.
        let answer = if port == agent.port {
            agent.request("GET", "/api/v1/processes")
        } else {
            http_request(port, "GET", "/metrics", &[])
        };
        expect(&answer, 200, &format!("port {port} under a flood"), &agent);
        // Connections over the cap are closed (as their tasks end, so wait for it).
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut open = agent_sockets(&agent);
        while open > baseline + CAP && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            open = agent_sockets(&agent);
        }
        assert!(
            open <= baseline + CAP,
            "port {port}: {open} sockets with {FLOOD} clients, cap {CAP}, {baseline} before"
        );
        // The clients leave; so do their connections.
        drop(flood);
        let deadline = Instant::now() + Duration::from_secs(60);
        while agent_sockets(&agent) > baseline {
            assert!(
                Instant::now() < deadline,
                "connections stayed open after their clients left"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The bytes the server side of the connection from `client_port` to `server_port` has not
/// read yet (its receive queue in /proc/net/tcp); None before the connection is there.
fn server_unread(server_port: u16, client_port: u16) -> Option<u32> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let port = |field: &str| u16::from_str_radix(field.rsplit(':').next()?, 16).ok();
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.len() > 4
            && port(fields[1]) == Some(server_port)
            && port(fields[2]) == Some(client_port))
        .then(|| u32::from_str_radix(fields[4].rsplit(':').next()?, 16).ok())
        .flatten()
    })
}

/// Waits until `condition` holds for the server side of `client`'s connection to `port`.
fn wait_unread(port: u16, client: &TcpStream, condition: impl Fn(u32) -> bool, what: &str) {
    let client_port = client.local_addr().unwrap().port();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !server_unread(port, client_port).is_some_and(&condition) {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn at_the_cap_a_new_connection_waits_while_every_connection_is_answering() {
    let (_dir, agent) = agent("hostile-cap-busy", None, &["--max-connections", "1"]);
    let port = agent.port;
    // The only slot answers a request whose body has not all come: in flight, not idle, so it
    // cannot be closed for the next connection, which waits.
    let mut busy = TcpStream::connect(("127.0.0.1", port)).unwrap();
    busy.write_all(
        format!(
            "POST /querier.v1.QuerierService/ProfileTypes HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
             Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{"
        )
        .as_bytes(),
    )
    .unwrap();
    wait_unread(
        port,
        &busy,
        |unread| unread == 0,
        "the agent never read the first request",
    );
    let mut waiting = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let request = format!(
        "GET /api/v1/processes HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    );
    waiting.write_all(request.as_bytes()).unwrap();
    // Its request stays in the kernel, unread, while the first is in flight.
    wait_unread(
        port,
        &waiting,
        |unread| unread as usize == request.len(),
        "the second request was read",
    );
    // ... and gets no answer (a second is a long time to a server that is not holding it back).
    waiting
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let early = waiting.read(&mut [0u8; 64]);
    assert!(
        early
            .as_ref()
            .is_err_and(|e| matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)),
        "the second connection was answered while the only slot was busy: {early:?}"
    );
    busy.write_all(b"}").unwrap();
    let mut first = Vec::new();
    busy.read_to_end(&mut first).unwrap();
    assert!(
        first.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&first)
    );
    waiting
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut second = Vec::new();
    waiting.read_to_end(&mut second).unwrap();
    assert!(
        second.starts_with(b"HTTP/1.1 200"),
        "{}\nagent log:\n{}",
        String::from_utf8_lossy(&second),
        agent.log()
    );
}
