//! Microsoft Entra ID authentication (`Authentication:AzureAd`, dotnet-monitor's keys) against a
//! local OpenID issuer this test runs over https (its own CA and key pairs, metadata and JWKS):
//! tokens of the right audience and role pass, alongside the MonitorApiKey's; wrong audience,
//! wrong issuer, expired, unknown `kid`, `alg` none and HS256 keyed with the public key get 401
//! with a reason, a missing role 403, each with Entra ID's advice; a rotated key (new `kid`) is
//! picked up without a restart. An issuer that hangs delays no token whose key is held; one
//! that fails is not asked more than once per 10 s however many tokens come; a multi-tenant
//! `TenantId` is refused.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use p256::ecdsa::signature::Signer;
use rsa::pkcs8::DecodePrivateKey;
use rsa::traits::PublicKeyParts;
use serde_json::{json, Value};
use support::agent::{data_dir, Agent};
use support::http_request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TENANT: &str = "0000aaaa-11bb-cccc-dd22-eeeeee333333";
const CLIENT: &str = "clrscope-test-app";
const ROLE: &str = "Diagnostics.Reader";
/// The RSA key of the ui crate's auth tests (made for tests only).
const RSA_KEY: &str = include_str!("../../ui/src/auth/test-rsa-key.pem");

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A CA and a server certificate for 127.0.0.1 it signed, made with the openssl CLI.
fn certificates(dir: &Path) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    run(&[
        &["req", "-x509"][..],
        &ec,
        &[
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=clrscope test CA",
        ],
    ]
    .concat());
    run(&[
        &["req"][..],
        &ec,
        &[
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    ]
    .concat());
    std::fs::write(
        dir.join("ext.cnf"),
        "basicConstraints=critical,CA:FALSE\nsubjectAltName=IP:127.0.0.1\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
}

/// How the issuer answers.
const SERVE: u8 = 0;
/// HTTP 500 to every request.
const FAIL: u8 = 1;
/// Never answers (until the client gives up and closes the connection).
const HANG: u8 = 2;

/// The issuer: serves its metadata and the JWKS it is given, over https on a free port. Like
/// Entra ID, it also answers for the multi-tenant `common` authority, whose issuer holds
/// `{tenantid}`.
struct Issuer {
    port: u16,
    jwks: Arc<Mutex<Value>>,
    fetches: Arc<AtomicUsize>,
    /// [`SERVE`], [`FAIL`] or [`HANG`].
    mode: Arc<AtomicU8>,
    /// Every request received.
    requests: Arc<AtomicUsize>,
    /// Requests held unanswered whose connection the client still has open.
    hanging: Arc<AtomicUsize>,
}

impl Issuer {
    fn start(dir: &Path) -> Issuer {
        use rustls::pki_types::pem::PemObject;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let certs: Vec<_> =
            rustls::pki_types::CertificateDer::pem_file_iter(dir.join("server.pem"))
                .unwrap()
                .map(Result::unwrap)
                .collect();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let issuer = Issuer {
            port,
            jwks: Arc::new(Mutex::new(json!({"keys": []}))),
            fetches: Arc::new(AtomicUsize::new(0)),
            mode: Arc::new(AtomicU8::new(SERVE)),
            requests: Arc::new(AtomicUsize::new(0)),
            hanging: Arc::new(AtomicUsize::new(0)),
        };
        let shared = issuer.shared();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let (acceptor, shared) = (acceptor.clone(), shared.shared());
                    tokio::spawn(async move {
                        let Ok(tls) = acceptor.accept(stream).await else {
                            return;
                        };
                        shared.answer(tls).await;
                    });
                }
            });
        });
        issuer
    }

    /// Another handle on the same counters and keys.
    fn shared(&self) -> Issuer {
        Issuer {
            port: self.port,
            jwks: self.jwks.clone(),
            fetches: self.fetches.clone(),
            mode: self.mode.clone(),
            requests: self.requests.clone(),
            hanging: self.hanging.clone(),
        }
    }

    async fn answer(&self, mut tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>) {
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => request.extend_from_slice(&buf[..n]),
            }
        }
        self.requests.fetch_add(1, Ordering::SeqCst);
        let (status, body) = match self.mode.load(Ordering::SeqCst) {
            FAIL => ("500 Internal Server Error", json!({"error": "down"})),
            HANG => {
                self.hanging.fetch_add(1, Ordering::SeqCst);
                // Held until the client closes the connection.
                while !matches!(tls.read(&mut buf).await, Ok(0) | Err(_)) {}
                self.hanging.fetch_sub(1, Ordering::SeqCst);
                return;
            }
            _ => ("200 OK", self.document(&String::from_utf8_lossy(&request))),
        };
        let body = body.to_string();
        let answer = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = tls.write_all(answer.as_bytes()).await;
        let _ = tls.shutdown().await;
    }

    /// The metadata or JWKS `request` asks for, of [`TENANT`] or of `common`.
    fn document(&self, request: &str) -> Value {
        let path = request.split_whitespace().nth(1).unwrap_or_default();
        let root = format!("https://127.0.0.1:{}", self.port);
        for (tenant, issued_by) in [(TENANT, TENANT), ("common", "{tenantid}")] {
            if path == format!("/{tenant}/v2.0/.well-known/openid-configuration") {
                return json!({"issuer": format!("{root}/{issued_by}/v2.0"),
                    "jwks_uri": format!("{root}/{tenant}/discovery/v2.0/keys")});
            }
            if path == format!("/{tenant}/discovery/v2.0/keys") {
                self.fetches.fetch_add(1, Ordering::SeqCst);
                return self.jwks.lock().unwrap().clone();
            }
        }
        json!({})
    }

    fn issuer(&self) -> String {
        format!("https://127.0.0.1:{}/{TENANT}/v2.0", self.port)
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn jwt(header: &Value, claims: &Value, sign: impl Fn(&[u8]) -> Vec<u8>) -> String {
    let signed = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let signature = sign(signed.as_bytes());
    format!("{signed}.{}", b64(&signature))
}

#[test]
fn entra_id_tokens_are_checked_against_the_issuers_keys() {
    let dir = data_dir("entra-id");
    std::fs::create_dir_all(&dir).unwrap();
    certificates(&dir);
    let issuer = Issuer::start(&dir);

    let rsa_key = rsa::RsaPrivateKey::from_pkcs8_pem(RSA_KEY).unwrap();
    let rsa_public = rsa_key.to_public_key();
    let rsa_jwk = json!({"kty": "RSA", "use": "sig", "kid": "rsa-1",
        "n": b64(&rsa_public.n().to_bytes_be()), "e": b64(&rsa_public.e().to_bytes_be())});
    *issuer.jwks.lock().unwrap() = json!({"keys": [rsa_jwk]});
    let rs256 = |kid: &str, claims: &Value| {
        let signer = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(rsa_key.clone());
        jwt(
            &json!({"alg": "RS256", "typ": "JWT", "kid": kid}),
            claims,
            |m| {
                use rsa::signature::SignatureEncoding;
                signer.sign(m).to_vec()
            },
        )
    };
    let claims = |change: &dyn Fn(&mut Value)| {
        let mut claims = json!({
            "aud": format!("api://{CLIENT}"), "iss": issuer.issuer(), "tid": TENANT,
            "iat": now() - 60, "nbf": now() - 60, "exp": now() + 3600, "roles": [ROLE],
        });
        change(&mut claims);
        claims
    };

    let settings = dir.join("settings.json");
    std::fs::write(
        &settings,
        json!({"Authentication": {"AzureAd": {
            "Instance": format!("https://127.0.0.1:{}", issuer.port),
            "TenantId": TENANT, "ClientId": CLIENT, "RequiredRole": ROLE,
            "CaCertificatePath": dir.join("ca.pem"),
        }}})
        .to_string(),
    )
    .unwrap();
    let agent = Agent::start(
        &dir.join("store"),
        &["--pid=999999999", "--config", settings.to_str().unwrap()],
    );
    let call = |token: &str| {
        let auth = format!("Bearer {token}");
        http_request(agent.port, "GET", "/processes", &[("Authorization", &auth)])
    };

    let good = rs256("rsa-1", &claims(&|_| {}));
    let response = call(&good);
    assert_eq!(response.status, 200, "{}\n{}", response.body, agent.log());
    // The MonitorApiKey's token works alongside.
    assert_eq!(call(agent.token()).status, 200);

    let refused = |token: &str, reason: &str| {
        let response = call(token);
        assert_eq!(response.status, 401, "{reason}: {}", response.body);
        assert!(
            response.body.contains(reason),
            "expected {reason:?} in {}",
            response.body
        );
    };
    refused(
        &rs256("rsa-1", &claims(&|c| c["aud"] = json!("api://another-app"))),
        "audience",
    );
    refused(
        &rs256(
            "rsa-1",
            &claims(&|c| c["iss"] = json!("https://login.example/other/v2.0")),
        ),
        "issuer",
    );
    // Authenticated but without the role: 403 insufficient_scope (RFC 6750 §3.1), as
    // dotnet-monitor answers, with Entra ID's advice.
    let no_role = call(&rs256(
        "rsa-1",
        &claims(&|c| c["roles"] = json!(["Other.Role"])),
    ));
    assert_eq!(no_role.status, 403, "{}", no_role.body);
    assert!(
        no_role.body.contains("Diagnostics.Reader")
            && no_role.body.contains("assign that app role"),
        "{}",
        no_role.body
    );
    assert!(no_role
        .headers
        .iter()
        .any(|(k, v)| k == "www-authenticate" && v.contains("insufficient_scope")));
    // An expired Entra ID token: advice for Entra ID, not MonitorApiKey's.
    let expired = call(&rs256("rsa-1", &claims(&|c| c["exp"] = json!(now() - 600))));
    assert_eq!(expired.status, 401);
    assert!(
        expired.body.contains("expired")
            && expired.body.contains("Microsoft Entra ID")
            && !expired.body.contains("generatekey"),
        "{}",
        expired.body
    );
    // Within .NET's five minutes of clock skew: still good.
    assert_eq!(
        call(&rs256("rsa-1", &claims(&|c| c["exp"] = json!(now() - 120)))).status,
        200
    );
    refused(&rs256("rsa-unknown", &claims(&|_| {})), "does not list");
    let unsigned = format!(
        "{}.{}.",
        b64(json!({"alg": "none", "kid": "rsa-1"})
            .to_string()
            .as_bytes()),
        b64(claims(&|_| {}).to_string().as_bytes())
    );
    refused(&unsigned, "\\\"none\\\"");
    // HS256 keyed with the public key (the classic confusion attack).
    let public_pem = {
        use rsa::pkcs8::EncodePublicKey;
        rsa_public
            .to_public_key_pem(rsa::pkcs8::LineEnding::LF)
            .unwrap()
    };
    let hs256 = jwt(
        &json!({"alg": "HS256", "kid": "rsa-1"}),
        &claims(&|_| {}),
        |m| {
            let mut mac = Hmac::<sha2::Sha256>::new_from_slice(public_pem.as_bytes()).unwrap();
            mac.update(m);
            mac.finalize().into_bytes().to_vec()
        },
    );
    refused(&hs256, "HS256");

    // Rotation: the issuer now signs with a new P-256 key; the agent fetches the keys again for
    // the unknown kid (at most every 10 s), without a restart.
    let ec_key = p256::ecdsa::SigningKey::random(&mut rand_core::OsRng);
    let point = p256::ecdsa::VerifyingKey::from(&ec_key).to_encoded_point(false);
    let ec_jwk = json!({"kty": "EC", "use": "sig", "kid": "ec-2", "crv": "P-256",
        "x": b64(point.x().unwrap()), "y": b64(point.y().unwrap())});
    *issuer.jwks.lock().unwrap() = json!({"keys": [ec_jwk]});
    let fetched_before = issuer.fetches.load(Ordering::SeqCst);
    let rotated = jwt(
        &json!({"alg": "ES256", "kid": "ec-2"}),
        &claims(&|_| {}),
        |m| {
            let s: p256::ecdsa::Signature = ec_key.sign(m);
            s.to_bytes().to_vec()
        },
    );
    let started = Instant::now();
    loop {
        let response = call(&rotated);
        if response.status == 200 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "rotation not picked up: {}",
            response.body
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!(
        "rotation picked up after {:.1} s; JWKS fetched {} times in all",
        started.elapsed().as_secs_f64(),
        issuer.fetches.load(Ordering::SeqCst)
    );
    assert!(issuer.fetches.load(Ordering::SeqCst) > fetched_before);
    // The retired key's tokens now fail; made-up kids do not make the agent hammer the issuer.
    let fetched = issuer.fetches.load(Ordering::SeqCst);
    for i in 0..20 {
        refused(
            &rs256(&format!("made-up-{i}"), &claims(&|_| {})),
            "does not list",
        );
    }
    assert!(
        issuer.fetches.load(Ordering::SeqCst) <= fetched + 1,
        "{} fetches",
        issuer.fetches.load(Ordering::SeqCst) - fetched
    );
}

/// What the tests below share: the issuer (serving one RSA key, `rsa-1`) and its key.
struct Fixture {
    dir: support::ScratchDir,
    issuer: Issuer,
    rsa_key: rsa::RsaPrivateKey,
}

impl Fixture {
    fn new(name: &str) -> Fixture {
        let dir = data_dir(name);
        std::fs::create_dir_all(&dir).unwrap();
        certificates(&dir);
        let issuer = Issuer::start(&dir);
        let rsa_key = rsa::RsaPrivateKey::from_pkcs8_pem(RSA_KEY).unwrap();
        let public = rsa_key.to_public_key();
        *issuer.jwks.lock().unwrap() = json!({"keys": [{"kty": "RSA", "use": "sig", "kid": "rsa-1",
            "n": b64(&public.n().to_bytes_be()), "e": b64(&public.e().to_bytes_be())}]});
        Fixture {
            dir,
            issuer,
            rsa_key,
        }
    }

    /// An agent whose `Authentication:AzureAd` names `tenant`.
    fn agent(&self, tenant: &str) -> Agent {
        let settings = self.dir.join("settings.json");
        std::fs::write(
            &settings,
            json!({"Authentication": {"AzureAd": {
                "Instance": format!("https://127.0.0.1:{}", self.issuer.port),
                "TenantId": tenant, "ClientId": CLIENT, "RequiredRole": ROLE,
                "CaCertificatePath": self.dir.join("ca.pem"),
            }}})
            .to_string(),
        )
        .unwrap();
        Agent::start(
            &self.dir.join("store"),
            &["--pid=999999999", "--config", settings.to_str().unwrap()],
        )
    }

    /// A good token of tenant `tid`, signed by `kid` (the RSA key whatever it is called).
    fn token(&self, kid: &str, tid: &str) -> String {
        let claims = json!({
            "aud": format!("api://{CLIENT}"),
            "iss": format!("https://127.0.0.1:{}/{tid}/v2.0", self.issuer.port), "tid": tid,
            "iat": now() - 60, "nbf": now() - 60, "exp": now() + 3600, "roles": [ROLE],
        });
        let signer = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(self.rsa_key.clone());
        jwt(
            &json!({"alg": "RS256", "typ": "JWT", "kid": kid}),
            &claims,
            |m| {
                use rsa::signature::SignatureEncoding;
                signer.sign(m).to_vec()
            },
        )
    }
}

fn call(agent: &Agent, token: &str) -> support::HttpResponse {
    let auth = format!("Bearer {token}");
    http_request(agent.port, "GET", "/processes", &[("Authorization", &auth)])
}

fn wait_for(what: &str, timeout: Duration, done: impl Fn() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < timeout, "not {what} after {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The issuer hangs: a fetch for an unknown `kid` is held open, and meanwhile a token whose key
/// the agent holds is answered (while that fetch is still open: it does not wait on it). Then the
/// issuer answers 500 to a flood of tokens with made-up `kid`s: it is asked at most once per
/// 10 s, and the held key keeps working.
#[test]
fn a_hanging_or_failing_issuer_neither_delays_held_keys_nor_is_hammered() {
    let fixture = Fixture::new("entra-id-issuer-down");
    let agent = fixture.agent(TENANT);
    let good = fixture.token("rsa-1", TENANT);
    let first = call(&agent, &good);
    assert_eq!(first.status, 200, "{}\n{}", first.body, agent.log());

    fixture.issuer.mode.store(HANG, Ordering::SeqCst);
    let prober = {
        let (port, token) = (agent.port, fixture.token("rsa-rotated", TENANT));
        let (requests, before) = (
            fixture.issuer.requests.clone(),
            fixture.issuer.requests.load(Ordering::SeqCst),
        );
        std::thread::spawn(move || {
            // Refused at once while the refresh limit holds; the first call after it fetches,
            // and is held until the agent gives that fetch up.
            let mut statuses = Vec::new();
            while requests.load(Ordering::SeqCst) == before && statuses.len() < 400 {
                let auth = format!("Bearer {token}");
                let response = http_request(port, "GET", "/processes", &[("Authorization", &auth)]);
                statuses.push(response.status);
                std::thread::sleep(Duration::from_millis(100));
            }
            statuses
        })
    };
    wait_for(
        "a fetch held by the issuer",
        Duration::from_secs(60),
        || fixture.issuer.hanging.load(Ordering::SeqCst) > 0,
    );
    let during = call(&agent, &good);
    let still_open = fixture.issuer.hanging.load(Ordering::SeqCst);
    assert_eq!(during.status, 200, "{}", during.body);
    assert!(
        still_open > 0,
        "the held key's token was answered only after the hanging fetch ended"
    );
    let statuses = prober.join().unwrap();
    assert!(statuses.iter().all(|&s| s == 401), "{statuses:?}");
    eprintln!(
        "a held key answered while the issuer hung ({} probes before the fetch)",
        statuses.len()
    );
    // The agent gives the hanging fetch up (its timeout), closing the connection.
    wait_for(
        "the hanging fetch given up",
        Duration::from_secs(120),
        || fixture.issuer.hanging.load(Ordering::SeqCst) == 0,
    );

    fixture.issuer.mode.store(FAIL, Ordering::SeqCst);
    let before = fixture.issuer.requests.load(Ordering::SeqCst);
    let started = Instant::now();
    let flooders: Vec<_> = (0..2)
        .map(|thread| {
            let (port, tokens): (u16, Vec<String>) = (
                agent.port,
                (0..10)
                    .map(|i| fixture.token(&format!("made-up-{thread}-{i}"), TENANT))
                    .collect(),
            );
            std::thread::spawn(move || {
                let mut sent = 0usize;
                let started = Instant::now();
                while started.elapsed() < Duration::from_secs(25) {
                    let auth = format!("Bearer {}", tokens[sent % tokens.len()]);
                    let response =
                        http_request(port, "GET", "/processes", &[("Authorization", &auth)]);
                    assert_eq!(response.status, 401, "{}", response.body);
                    sent += 1;
                    // Paced (~50/s per thread, 40x the refresh limit's fetches): back-to-back
                    // signature checks of a debug agent took both cores from the tests beside it.
                    std::thread::sleep(Duration::from_millis(20));
                }
                sent
            })
        })
        .collect();
    // The held key works throughout.
    let mut good_calls = 0;
    while started.elapsed() < Duration::from_secs(25) {
        let response = call(&agent, &good);
        assert_eq!(response.status, 200, "{}", response.body);
        good_calls += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    let sent: usize = flooders.into_iter().map(|t| t.join().unwrap()).sum();
    let elapsed = started.elapsed().as_secs();
    let asked = fixture.issuer.requests.load(Ordering::SeqCst) - before;
    eprintln!(
        "issuer answering 500: {sent} tokens with unknown kids in {elapsed} s made {asked} issuer \
         requests; {good_calls} calls with the held key all 200"
    );
    assert!(sent > 20, "only {sent} requests sent");
    assert!(
        asked as u64 <= elapsed / 10 + 1,
        "{asked} issuer requests in {elapsed} s from {sent} tokens"
    );
}

/// `TenantId` `common` would take any tenant's token (the issuer is `{tenantid}`'s): the agent
/// refuses the configuration, saying why, and such a token gets 401.
#[test]
fn a_multi_tenant_tenant_id_is_refused() {
    let fixture = Fixture::new("entra-id-common");
    let agent = fixture.agent("common");
    let outsider = fixture.token("rsa-1", "ffffffff-0000-1111-2222-333333333333");
    let response = call(&agent, &outsider);
    assert_eq!(response.status, 401, "{}", response.body);
    assert!(
        response.body.contains("TenantId is \\\"common\\\"")
            && response.body.contains("every Entra ID tenant"),
        "{}",
        response.body
    );
    assert!(
        agent.log().contains("every Entra ID tenant"),
        "the start does not say so:\n{}",
        agent.log()
    );
    assert_eq!(fixture.issuer.requests.load(Ordering::SeqCst), 0);
}
