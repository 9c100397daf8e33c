use p256::ecdsa::signature::Signer;
use rand_core::OsRng;
use rsa::pkcs8::DecodePrivateKey;
use rsa::traits::PublicKeyParts;
use serde_json::{json, Value};

use super::key::{decode_base64url, encode_base64url};
use super::*;

const NOW: i64 = 1_800_000_000;
const SUBJECT: &str = "ae5473b6-8dad-498d-b915-53b9c684000e";
/// A 2048-bit RSA key made for these tests only (`openssl genrsa 2048 | openssl pkcs8 -topk8`).
const RSA_KEY: &str = include_str!("test-rsa-key.pem");

fn claims(exp: i64) -> Value {
    json!({"aud": AUDIENCE, "exp": exp, "iss": GENERATEKEY_ISSUER, "sub": SUBJECT})
}

/// A JWT of `header` and `claims`, signed by `sign`.
fn jwt(header: Value, claims: &Value, sign: impl Fn(&[u8]) -> Vec<u8>) -> String {
    let signed = format!(
        "{}.{}",
        encode_base64url(header.to_string().as_bytes()),
        encode_base64url(claims.to_string().as_bytes())
    );
    let signature = sign(signed.as_bytes());
    format!("{signed}.{}", encode_base64url(&signature))
}

/// The RFC 7517 (lower-case) JWK of an EC point, base64url.
fn ec_jwk(crv: &str, point: &[u8]) -> String {
    let half = (point.len() - 1) / 2;
    let jwk = json!({
        "kty": "EC",
        "crv": crv,
        "x": encode_base64url(&point[1..1 + half]),
        "y": encode_base64url(&point[1 + half..]),
    });
    encode_base64url(jwk.to_string().as_bytes())
}

/// A key of each algorithm: (alg, configured key, signer).
/// Signs a message: the signature's bytes as a JWT carries them.
type Sign = Box<dyn Fn(&[u8]) -> Vec<u8>>;

fn keys() -> Vec<(&'static str, ApiKey, Sign)> {
    let mut keys: Vec<(&'static str, ApiKey, Sign)> = Vec::new();
    let config = |jwk: String| ApiKey::new(Some(SUBJECT), Some(&jwk), None).unwrap();

    macro_rules! ec_signer {
        ($alg:literal, $crv:literal, $curve:ident) => {{
            let signing = $curve::ecdsa::SigningKey::random(&mut OsRng);
            let point = $curve::ecdsa::VerifyingKey::from(&signing).to_encoded_point(false);
            keys.push((
                $alg,
                config(ec_jwk($crv, point.as_bytes())),
                Box::new(move |m| {
                    let s: $curve::ecdsa::Signature = signing.sign(m);
                    s.to_bytes().to_vec()
                }),
            ));
        }};
    }
    ec_signer!("ES256", "P-256", p256);
    ec_signer!("ES384", "P-384", p384);
    ec_signer!("ES512", "P-521", p521);

    let private = rsa::RsaPrivateKey::from_pkcs8_pem(RSA_KEY).unwrap();
    let public = private.to_public_key();
    let jwk = json!({
        "kty": "RSA",
        "n": encode_base64url(&public.n().to_bytes_be()),
        "e": encode_base64url(&public.e().to_bytes_be()),
    });
    let jwk = encode_base64url(jwk.to_string().as_bytes());
    macro_rules! rsa_signer {
        ($alg:literal, $digest:ty) => {{
            let signing = rsa::pkcs1v15::SigningKey::<$digest>::new(private.clone());
            keys.push((
                $alg,
                config(jwk.clone()),
                Box::new(move |m| {
                    use rsa::signature::SignatureEncoding;
                    signing.sign(m).to_vec()
                }),
            ));
        }};
    }
    rsa_signer!("RS256", sha2::Sha256);
    rsa_signer!("RS384", sha2::Sha384);
    rsa_signer!("RS512", sha2::Sha512);
    keys
}

#[test]
fn each_algorithm_verifies_and_any_change_is_refused() {
    let keys = keys();
    for (alg, key, sign) in &keys {
        let header = json!({"alg": alg, "typ": "JWT"});
        let token = jwt(header.clone(), &claims(NOW + 60), sign);
        assert_eq!(key.verify(&token, NOW), Ok(()), "{alg}");

        // Another payload under the same signature.
        let (signed, signature) = token.rsplit_once('.').unwrap();
        let (head, _) = signed.split_once('.').unwrap();
        let mut other = claims(NOW + 60);
        other["sub"] = json!("someone-else");
        let forged = format!(
            "{head}.{}.{signature}",
            encode_base64url(other.to_string().as_bytes())
        );
        assert_eq!(
            key.verify(&forged, NOW),
            Err(TokenError::Signature),
            "{alg}"
        );

        // The other keys refuse it: another curve, or not EC at all. (The RS* entries share one
        // RSA key, which verifies each of their tokens, as any RSA key takes RS256/384/512.)
        for (other_alg, other_key, _) in &keys {
            if other_alg == alg || (alg.starts_with("RS") && other_alg.starts_with("RS")) {
                continue;
            }
            let refused = other_key.verify(&token, NOW).unwrap_err();
            assert!(
                matches!(
                    refused,
                    TokenError::KeyMismatch { .. } | TokenError::Signature
                ),
                "{alg} token on the {other_alg} key: {refused:?}"
            );
        }
    }
}

#[test]
fn claims_are_checked_as_dotnet_monitor_does() {
    let keys = keys();
    let (_, key, sign) = &keys[1];
    let header = json!({"alg": "ES384", "typ": "JWT"});
    let check = |claims: &Value| key.verify(&jwt(header.clone(), claims, sign), NOW);

    // Expired, within and past the five minutes' skew.
    assert_eq!(check(&claims(NOW - 60)), Ok(()));
    assert_eq!(
        check(&claims(NOW - key::CLOCK_SKEW_SECONDS - 1)),
        Err(TokenError::Expired(key::CLOCK_SKEW_SECONDS + 1))
    );
    let mut no_exp = claims(0);
    no_exp.as_object_mut().unwrap().remove("exp");
    assert_eq!(check(&no_exp), Err(TokenError::NoExpiry));
    let mut later = claims(NOW + 3600);
    later["nbf"] = json!(NOW + 3600);
    assert_eq!(check(&later), Err(TokenError::NotYetValid(3600)));

    let mut wrong = claims(NOW + 60);
    wrong["sub"] = json!("other");
    assert_eq!(check(&wrong), Err(TokenError::Subject("\"other\"".into())));
    let mut wrong = claims(NOW + 60);
    wrong["aud"] = json!(["x", AUDIENCE]);
    assert_eq!(check(&wrong), Ok(()));
    wrong["aud"] = json!("https://example.com");
    assert!(matches!(check(&wrong), Err(TokenError::Audience { .. })));
    let mut wrong = claims(NOW + 60);
    wrong["iss"] = json!("me");
    assert!(matches!(check(&wrong), Err(TokenError::Issuer { .. })));

    // A configured issuer replaces generatekey's.
    let signing = p384::ecdsa::SigningKey::random(&mut OsRng);
    let jwk = ec_jwk(
        "P-384",
        signing.verifying_key().to_encoded_point(false).as_bytes(),
    );
    let theirs = ApiKey::new(Some(SUBJECT), Some(&jwk), Some("me")).unwrap();
    let sign_theirs = |m: &[u8]| {
        let s: p384::ecdsa::Signature = signing.sign(m);
        s.to_bytes().to_vec()
    };
    let mut own = claims(NOW + 60);
    own["iss"] = json!("me");
    assert_eq!(
        theirs.verify(&jwt(header.clone(), &own, sign_theirs), NOW),
        Ok(())
    );
    assert!(matches!(
        theirs.verify(&jwt(header.clone(), &claims(NOW + 60), sign_theirs), NOW),
        Err(TokenError::Issuer { .. })
    ));

    // Unsigned or symmetric tokens never pass.
    for alg in ["none", "HS256", "PS256"] {
        let token = jwt(json!({"alg": alg}), &claims(NOW + 60), sign);
        assert_eq!(
            key.verify(&token, NOW),
            Err(TokenError::Algorithm(alg.into()))
        );
    }
    for bad in ["", "a.b", "a.b.c.d", "!!!.e30.e30", "e30.e30.e30"] {
        assert!(
            matches!(
                key.verify(bad, NOW),
                Err(TokenError::Malformed(_) | TokenError::Algorithm(_))
            ),
            "{bad:?}"
        );
    }
}

#[test]
fn a_generated_key_verifies_its_own_token_and_has_dotnets_shape() {
    let generated = generate_key(NOW + 7 * 24 * 3600);
    let key = ApiKey::new(Some(&generated.subject), Some(&generated.public_key), None).unwrap();
    assert!(!key.has_private_key());
    assert_eq!(key.verify(&generated.token, NOW), Ok(()));
    assert!(matches!(
        key.verify(&generated.token, NOW + 8 * 24 * 3600),
        Err(TokenError::Expired(_))
    ));
    let jwk: Value =
        serde_json::from_slice(&decode_base64url(&generated.public_key).unwrap()).unwrap();
    assert_eq!(jwk["Kty"], "EC");
    assert_eq!(jwk["Crv"], "P-384");
    assert_eq!(jwk["KeySize"], 384);
    assert_eq!(jwk["HasPrivateKey"], false);
    let header: Value = serde_json::from_slice(
        &decode_base64url(generated.token.split('.').next().unwrap()).unwrap(),
    )
    .unwrap();
    assert_eq!(header, json!({"alg": "ES384", "typ": "JWT"}));
    let guid = &generated.subject;
    assert_eq!(guid.len(), 36);
    assert_eq!(guid.as_bytes()[14], b'4');
    // Another key does not accept this token.
    let other = generate_key(NOW + 60);
    let other = ApiKey::new(Some(&generated.subject), Some(&other.public_key), None).unwrap();
    assert_eq!(
        other.verify(&generated.token, NOW),
        Err(TokenError::Signature)
    );
}

#[test]
fn bad_key_configurations_say_what_is_wrong() {
    let new =
        |subject: Option<&str>, key: Option<&str>| ApiKey::new(subject, key, None).unwrap_err();
    let b64 = |v: Value| encode_base64url(v.to_string().as_bytes());
    assert_eq!(new(None, Some("x")), KeyError::MissingSubject);
    assert_eq!(new(Some(""), Some("x")), KeyError::MissingSubject);
    assert_eq!(new(Some("s"), None), KeyError::MissingPublicKey);
    assert!(matches!(new(Some("s"), Some("!!")), KeyError::NotAJwk(_)));
    assert!(matches!(
        new(Some("s"), Some(&b64(json!([1])))),
        KeyError::NotAJwk(_)
    ));
    assert_eq!(
        new(
            Some("s"),
            Some(&b64(json!({"kty": "oct", "k": "c2VjcmV0"})))
        ),
        KeyError::KeyType("oct".into())
    );
    assert_eq!(
        new(
            Some("s"),
            Some(&b64(
                json!({"kty": "EC", "crv": "secp256k1", "x": "AA", "y": "AA"})
            ))
        ),
        KeyError::Curve("secp256k1".into())
    );
    assert!(matches!(
        new(
            Some("s"),
            Some(&b64(
                json!({"kty": "EC", "crv": "P-256", "x": "AA", "y": "AA"})
            ))
        ),
        KeyError::InvalidKey { kind: "EC", .. }
    ));
    assert!(matches!(
        new(Some("s"), Some(&b64(json!({"Kty": "RSA", "E": "AQAB"})))),
        KeyError::InvalidKey { kind: "RSA", .. }
    ));
    // A JWK with its private part is accepted, and said to be one.
    let signing = p256::ecdsa::SigningKey::random(&mut OsRng);
    let point = signing.verifying_key().to_encoded_point(false);
    let mut jwk: Value =
        serde_json::from_slice(&decode_base64url(&ec_jwk("P-256", point.as_bytes())).unwrap())
            .unwrap();
    jwk["d"] = json!(encode_base64url(&signing.to_bytes()));
    let key = ApiKey::new(Some("s"), Some(&b64(jwk)), None).unwrap();
    assert!(key.has_private_key());
}

#[tokio::test]
async fn the_header_must_carry_a_bearer_token() {
    let generated = generate_key(NOW + 60);
    let config = AuthenticationConfig {
        azure_ad: None,
        monitor_api_key: Some(MonitorApiKeyConfig {
            subject: Some(generated.subject.clone()),
            public_key: Some(generated.public_key.clone()),
            issuer: None,
        }),
    };
    let auth = Authentication::from_config(&config);
    let bearer = format!("Bearer {}", generated.token);
    assert_eq!(auth.check(Some(&bearer), NOW).await, Ok(()));
    assert_eq!(
        auth.check(Some(&format!("bearer  {}", generated.token)), NOW)
            .await,
        Ok(())
    );
    assert_eq!(
        auth.check(None, NOW).await,
        Err(Refusal::Token(TokenError::Missing))
    );
    assert_eq!(
        auth.check(Some(&generated.token), NOW).await,
        Err(Refusal::Token(TokenError::NotBearer))
    );
    assert_eq!(
        auth.check(Some("Basic dXNlcjpwYXNz"), NOW).await,
        Err(Refusal::Token(TokenError::NotBearer))
    );
    assert_eq!(Authentication::Disabled.check(None, NOW).await, Ok(()));
    let unconfigured = Authentication::from_config(&AuthenticationConfig::default());
    let refusal = unconfigured.check(Some(&bearer), NOW).await.unwrap_err();
    assert!(
        refusal.to_string().contains("clrscope generatekey"),
        "{refusal}"
    );
}
