//! Microsoft Entra ID authentication (`Authentication:AzureAd`, dotnet-monitor's keys) against a
//! local OpenID issuer this test runs over https (its own CA and key pairs, metadata and JWKS):
//! tokens of the right audience and role pass, alongside the MonitorApiKey's; wrong audience,
//! wrong issuer, missing role, expired, unknown `kid`, `alg` none and HS256 keyed with the public
//! key get 401 with a reason; a rotated key (new `kid`) is picked up without a restart.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// The issuer: serves its metadata and the JWKS it is given, over https on a free port.
struct Issuer {
    port: u16,
    jwks: Arc<Mutex<Value>>,
    fetches: Arc<AtomicUsize>,
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
        let jwks = Arc::new(Mutex::new(json!({"keys": []})));
        let fetches = Arc::new(AtomicUsize::new(0));
        let (served, counted) = (jwks.clone(), fetches.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let Ok((stream, _)) = listener.accept().await else { continue };
                    let (acceptor, served, counted) = (acceptor.clone(), served.clone(), counted.clone());
                    tokio::spawn(async move {
                        let Ok(mut tls) = acceptor.accept(stream).await else { return };
                        let mut request = Vec::new();
                        let mut buf = [0u8; 4096];
                        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                            match tls.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => request.extend_from_slice(&buf[..n]),
                            }
                        }
                        let request = String::from_utf8_lossy(&request);
                        let path = request.split_whitespace().nth(1).unwrap_or_default();
                        let base = format!("https://127.0.0.1:{port}/{TENANT}");
                        let body = if path == format!("/{TENANT}/v2.0/.well-known/openid-configuration") {
                            json!({"issuer": format!("{base}/v2.0"), "jwks_uri": format!("{base}/discovery/v2.0/keys")})
                        } else if path == format!("/{TENANT}/discovery/v2.0/keys") {
                            counted.fetch_add(1, Ordering::SeqCst);
                            served.lock().unwrap().clone()
                        } else {
                            json!({})
                        }
                        .to_string();
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = tls.write_all(answer.as_bytes()).await;
                        let _ = tls.shutdown().await;
                    });
                }
            });
        });
        Issuer {
            port,
            jwks,
            fetches,
        }
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
    refused(
        &rs256("rsa-1", &claims(&|c| c["roles"] = json!(["Other.Role"]))),
        "Diagnostics.Reader",
    );
    refused(
        &rs256(
            "rsa-1",
            &claims(&|c| {
                c["exp"] = json!(now() - 600);
            }),
        ),
        "expired",
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
