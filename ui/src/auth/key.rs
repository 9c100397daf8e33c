//! The configured MonitorApiKey (a JWK, base64url) and the check of a bearer token against it,
//! following dotnet-monitor: a signed JWT (ES256/384/512 or RS256/384/512 only), signature by
//! the configured public key, audience `https://github.com/dotnet/dotnet-monitor`, issuer the
//! configured `Issuer` (default: generatekey's), lifetime (`exp` required, five minutes' clock
//! skew as Microsoft.IdentityModel allows), and `sub` equal to the configured `Subject`.

use base64::engine::general_purpose::{URL_SAFE_NO_PAD, URL_SAFE_NO_PAD_INDIFFERENT};
use base64::Engine;
use p256::ecdsa::signature::Verifier;
use serde_json::{Map, Value};

/// The audience every MonitorApiKey token carries.
pub const AUDIENCE: &str = "https://github.com/dotnet/dotnet-monitor";

/// The issuer `generatekey` writes, and the one expected unless `Issuer` is configured.
pub const GENERATEKEY_ISSUER: &str =
    "https://github.com/dotnet/dotnet-monitor/generatekey+MonitorApiKey";

/// The signing algorithms a token may use (public-key ones only, so that the configuration holds
/// nothing secret).
pub const ALGORITHMS: [&str; 6] = ["ES256", "ES384", "ES512", "RS256", "RS384", "RS512"];

/// How far `exp` and `nbf` may be off the agent's clock (Microsoft.IdentityModel's default).
pub const CLOCK_SKEW_SECONDS: i64 = 300;

/// Why the configured key cannot be used; the agent then refuses every token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    #[error(
        "Authentication:MonitorApiKey:Subject is not set: set it (and PublicKey) to what \
         `clrscope generatekey` printed"
    )]
    MissingSubject,

    #[error(
        "Authentication:MonitorApiKey:PublicKey is not set: set it (and Subject) to what \
         `clrscope generatekey` printed"
    )]
    MissingPublicKey,

    #[error(
        "Authentication:MonitorApiKey:PublicKey must be a JSON Web Key written as JSON and \
         base64url-encoded: {0}"
    )]
    NotAJwk(String),

    #[error(
        "Authentication:MonitorApiKey:PublicKey has key type {0:?}: it must be EC or RSA (a \
         public key, used only to verify tokens)"
    )]
    KeyType(String),

    #[error(
        "Authentication:MonitorApiKey:PublicKey is an EC key on curve {0:?}: use P-256, P-384 or \
         P-521"
    )]
    Curve(String),

    #[error("Authentication:MonitorApiKey:PublicKey is not a valid {kind} public key: {reason}")]
    InvalidKey { kind: &'static str, reason: String },

    #[error("{0}")]
    AzureAd(String),
}

/// Why a token was refused; each message says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    #[error(
        "no `Authorization: Bearer <token>` header: this API needs a MonitorApiKey token (`clrscope \
         generatekey` makes a key and its token; the agent is configured with its Subject and \
         PublicKey), or a Microsoft Entra ID token where Authentication:AzureAd is configured"
    )]
    Missing,

    #[error("the Authorization header is not `Bearer <token>`")]
    NotBearer,

    #[error("the bearer token is not a JWT (header.payload.signature, base64url): {0}")]
    Malformed(String),

    #[error("the token is signed with {0:?}; the agent accepts ES256, ES384, ES512, RS256, RS384 and RS512")]
    Algorithm(String),

    #[error("the token is signed with {alg}, which does not fit the configured {key} key")]
    KeyMismatch { alg: String, key: &'static str },

    #[error("the token's signature does not verify with the key it was checked against")]
    Signature,

    #[error("the token's audience is {found}, not {expected:?}")]
    Audience { found: String, expected: String },

    #[error("the token's issuer is {found}, not the configured {expected:?}")]
    Issuer { found: String, expected: String },

    #[error("the token has no expiry (`exp`); tokens must expire")]
    NoExpiry,

    #[error("the token expired {0} seconds ago")]
    Expired(i64),

    #[error("the token is not valid for another {0} seconds (`nbf`)")]
    NotYetValid(i64),

    #[error("the token's subject is {0}, not the configured Authentication:MonitorApiKey:Subject")]
    Subject(String),

    #[error("the token names no signing key (`kid`); Microsoft Entra ID tokens always do")]
    NoKeyId,

    #[error(
        "the token is signed by key {0:?}, which the issuer's JWKS does not list (not even after \
         fetching it again): a token of another tenant or issuer, or a forged one"
    )]
    UnknownKey(String),

    #[error("the issuer's signing keys could not be fetched: {0}")]
    Keys(String),

    #[error("the token's roles are {found}; the API needs role {required:?} (Authentication:AzureAd:RequiredRole)")]
    Role { found: String, required: String },
}

#[derive(Clone)]
pub(crate) enum PublicKey {
    P256(p256::ecdsa::VerifyingKey),
    P384(p384::ecdsa::VerifyingKey),
    P521(p521::ecdsa::VerifyingKey),
    Rsa(rsa::RsaPublicKey),
}

impl std::fmt::Debug for PublicKey {
    // p521's key has no Debug; the kind is what a log needs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} public key", self.kind())
    }
}

/// A string member of a JWK: .NET writes `Kty`, `Crv`, `X`… (its JsonWebKey serialized as is),
/// RFC 7517 `kty`…
fn jwk_field<'a>(jwk: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    jwk.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .and_then(|(_, v)| v.as_str())
}

impl PublicKey {
    /// The public key of a JWK (EC P-256/384/521 or RSA).
    pub(crate) fn from_jwk(jwk: &Map<String, Value>) -> Result<PublicKey, KeyError> {
        let field = |name: &str| jwk_field(jwk, name);
        let bytes = |name: &str, kind: &'static str| {
            let text = field(name).ok_or_else(|| KeyError::InvalidKey {
                kind,
                reason: format!("no `{name}`"),
            })?;
            decode_base64url(text).map_err(|reason| KeyError::InvalidKey {
                kind,
                reason: format!("`{name}`: {reason}"),
            })
        };
        let kty = field("kty").unwrap_or_default();
        Ok(if kty.eq_ignore_ascii_case("EC") {
            let crv = field("crv").unwrap_or_default();
            let kind = "EC";
            let mut point = vec![0x04];
            point.extend(bytes("x", kind)?);
            point.extend(bytes("y", kind)?);
            let invalid = |e: p256::ecdsa::Error| KeyError::InvalidKey {
                kind,
                reason: format!("x and y are not a point on {crv}: {e}"),
            };
            match crv {
                "P-256" => PublicKey::P256(
                    p256::ecdsa::VerifyingKey::from_sec1_bytes(&point).map_err(invalid)?,
                ),
                "P-384" => PublicKey::P384(
                    p384::ecdsa::VerifyingKey::from_sec1_bytes(&point).map_err(invalid)?,
                ),
                "P-521" => PublicKey::P521(
                    p521::ecdsa::VerifyingKey::from_sec1_bytes(&point).map_err(invalid)?,
                ),
                other => return Err(KeyError::Curve(other.to_string())),
            }
        } else if kty.eq_ignore_ascii_case("RSA") {
            let kind = "RSA";
            let n = rsa::BigUint::from_bytes_be(&bytes("n", kind)?);
            let e = rsa::BigUint::from_bytes_be(&bytes("e", kind)?);
            PublicKey::Rsa(
                rsa::RsaPublicKey::new(n, e).map_err(|e| KeyError::InvalidKey {
                    kind,
                    reason: e.to_string(),
                })?,
            )
        } else {
            return Err(KeyError::KeyType(kty.to_string()));
        })
    }

    fn kind(&self) -> &'static str {
        match self {
            PublicKey::P256(_) => "EC P-256",
            PublicKey::P384(_) => "EC P-384",
            PublicKey::P521(_) => "EC P-521",
            PublicKey::Rsa(_) => "RSA",
        }
    }

    /// Whether `signature` over `message` verifies with `alg` (already one of [`ALGORITHMS`]).
    pub(crate) fn verify(
        &self,
        alg: &str,
        message: &[u8],
        signature: &[u8],
    ) -> Result<(), TokenError> {
        let mismatch = || TokenError::KeyMismatch {
            alg: alg.to_string(),
            key: self.kind(),
        };
        let verified = match (self, alg) {
            (PublicKey::P256(key), "ES256") => p256::ecdsa::Signature::from_slice(signature)
                .is_ok_and(|s| key.verify(message, &s).is_ok()),
            (PublicKey::P384(key), "ES384") => p384::ecdsa::Signature::from_slice(signature)
                .is_ok_and(|s| key.verify(message, &s).is_ok()),
            (PublicKey::P521(key), "ES512") => p521::ecdsa::Signature::from_slice(signature)
                .is_ok_and(|s| key.verify(message, &s).is_ok()),
            (PublicKey::Rsa(key), "RS256") => verify_rsa::<sha2::Sha256>(key, message, signature),
            (PublicKey::Rsa(key), "RS384") => verify_rsa::<sha2::Sha384>(key, message, signature),
            (PublicKey::Rsa(key), "RS512") => verify_rsa::<sha2::Sha512>(key, message, signature),
            _ => return Err(mismatch()),
        };
        if verified {
            Ok(())
        } else {
            Err(TokenError::Signature)
        }
    }
}

fn verify_rsa<D>(key: &rsa::RsaPublicKey, message: &[u8], signature: &[u8]) -> bool
where
    D: sha2::Digest + rsa::pkcs8::AssociatedOid,
{
    let key = rsa::pkcs1v15::VerifyingKey::<D>::new(key.clone());
    rsa::pkcs1v15::Signature::try_from(signature).is_ok_and(|s| key.verify(message, &s).is_ok())
}

/// A configured MonitorApiKey: the public key tokens are checked against, the subject they must
/// name and the issuer they must come from.
#[derive(Debug, Clone)]
pub struct ApiKey {
    subject: String,
    issuer: String,
    key: PublicKey,
    /// The JWK held private key material (accepted, as dotnet-monitor does, with a warning).
    has_private_key: bool,
}

impl ApiKey {
    /// The key of `subject` and `public_key` (a base64url JWK), expecting tokens of `issuer`
    /// (default: [`GENERATEKEY_ISSUER`]).
    pub fn new(
        subject: Option<&str>,
        public_key: Option<&str>,
        issuer: Option<&str>,
    ) -> Result<ApiKey, KeyError> {
        let subject = subject
            .filter(|s| !s.is_empty())
            .ok_or(KeyError::MissingSubject)?;
        let public_key = public_key
            .filter(|s| !s.is_empty())
            .ok_or(KeyError::MissingPublicKey)?;
        let json = decode_base64url(public_key).map_err(KeyError::NotAJwk)?;
        let jwk: Map<String, Value> = serde_json::from_slice(&json)
            .map_err(|e| KeyError::NotAJwk(format!("not a JSON object: {e}")))?;
        let key = PublicKey::from_jwk(&jwk)?;
        let has_private_key = ["d", "p", "q", "dp", "dq", "qi"]
            .iter()
            .any(|name| jwk_field(&jwk, name).is_some_and(|v| !v.is_empty()));
        Ok(ApiKey {
            subject: subject.to_string(),
            issuer: issuer
                .filter(|i| !i.is_empty())
                .unwrap_or(GENERATEKEY_ISSUER)
                .to_string(),
            key,
            has_private_key,
        })
    }

    /// Whether the configured JWK carries private key material (it needs none).
    pub fn has_private_key(&self) -> bool {
        self.has_private_key
    }

    /// Checks a bearer `token` at `now_unix` (seconds).
    pub fn verify(&self, token: &str, now_unix: i64) -> Result<(), TokenError> {
        let jwt = Jwt::parse(token)?;
        self.key
            .verify(&jwt.alg, jwt.signed.as_bytes(), &jwt.signature)?;
        jwt.check_lifetime(now_unix)?;
        jwt.check_audience(AUDIENCE)?;
        if jwt.claim_str("iss") != Some(self.issuer.as_str()) {
            return Err(TokenError::Issuer {
                found: shown(jwt.claims.get("iss")),
                expected: self.issuer.clone(),
            });
        }
        if jwt.claim_str("sub") != Some(self.subject.as_str()) {
            return Err(TokenError::Subject(shown(jwt.claims.get("sub"))));
        }
        Ok(())
    }

    /// The issuer tokens of this key come from.
    pub(crate) fn issuer(&self) -> &str {
        &self.issuer
    }
}

/// A JWT split and decoded, its algorithm one of [`ALGORITHMS`]; the signature not yet checked.
pub(crate) struct Jwt<'a> {
    pub alg: String,
    pub header: Map<String, Value>,
    pub claims: Map<String, Value>,
    /// `header.payload`, what the signature covers.
    pub signed: &'a str,
    pub signature: Vec<u8>,
}

impl<'a> Jwt<'a> {
    pub fn parse(token: &'a str) -> Result<Jwt<'a>, TokenError> {
        let malformed = |what: &str| TokenError::Malformed(what.to_string());
        let mut parts = token.split('.');
        let (Some(header64), Some(payload64), Some(signature64), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(malformed("not three parts separated by dots"));
        };
        let object = |part: &str, name: &str| -> Result<Map<String, Value>, TokenError> {
            let bytes = decode_base64url(part)
                .map_err(|e| TokenError::Malformed(format!("its {name}: {e}")))?;
            serde_json::from_slice(&bytes)
                .map_err(|e| TokenError::Malformed(format!("its {name} is not a JSON object: {e}")))
        };
        let header = object(header64, "header")?;
        let claims = object(payload64, "payload")?;
        let signature =
            decode_base64url(signature64).map_err(|e| malformed(&format!("its signature: {e}")))?;
        let alg = header.get("alg").and_then(Value::as_str).unwrap_or("none");
        if !ALGORITHMS.contains(&alg) {
            return Err(TokenError::Algorithm(alg.to_string()));
        }
        Ok(Jwt {
            alg: alg.to_string(),
            header,
            claims,
            signed: &token[..header64.len() + 1 + payload64.len()],
            signature,
        })
    }

    pub fn claim_str(&self, name: &str) -> Option<&str> {
        self.claims.get(name).and_then(Value::as_str)
    }

    /// `exp` (required) and `nbf`, with [`CLOCK_SKEW_SECONDS`] either way.
    pub fn check_lifetime(&self, now_unix: i64) -> Result<(), TokenError> {
        let seconds = |name: &str| {
            self.claims
                .get(name)
                .and_then(Value::as_f64)
                .map(|v| v as i64)
        };
        let exp = seconds("exp").ok_or(TokenError::NoExpiry)?;
        if now_unix > exp + CLOCK_SKEW_SECONDS {
            return Err(TokenError::Expired(now_unix - exp));
        }
        if let Some(nbf) = seconds("nbf") {
            if now_unix < nbf - CLOCK_SKEW_SECONDS {
                return Err(TokenError::NotYetValid(nbf - now_unix));
            }
        }
        Ok(())
    }

    /// `aud` is `expected`, or a list holding it.
    pub fn check_audience(&self, expected: &str) -> Result<(), TokenError> {
        let ok = match self.claims.get("aud") {
            Some(Value::String(aud)) => aud == expected,
            Some(Value::Array(auds)) => auds.iter().any(|a| a.as_str() == Some(expected)),
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(TokenError::Audience {
                found: shown(self.claims.get("aud")),
                expected: expected.to_string(),
            })
        }
    }
}

/// A claim as the error shows it: JSON, or `missing`.
pub(crate) fn shown(value: Option<&Value>) -> String {
    value.map_or_else(|| "missing".to_string(), |v| v.to_string())
}

/// Base64url, with or without padding (JWTs have none; some tools pad the JWK).
pub(crate) fn decode_base64url(text: &str) -> Result<Vec<u8>, String> {
    URL_SAFE_NO_PAD_INDIFFERENT
        .decode(text)
        .map_err(|e| format!("not base64url ({e})"))
}

pub(crate) fn encode_base64url(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}
