//! A new MonitorApiKey, as dotnet-monitor's `generatekey` makes it: an ECDSA P-384 key pair, a
//! random GUID as subject, the public key as a JWK (.NET's property names) in base64url, and an
//! ES384 JWT of `aud`, `exp`, `iss`, `sub`.

use p384::ecdsa::signature::Signer;
use p384::ecdsa::{Signature, SigningKey};
use profile::guid::Guid;
use rand_core::{OsRng, RngCore};
use serde_json::json;

use super::key::{encode_base64url, AUDIENCE, GENERATEKEY_ISSUER};

/// What `clrscope generatekey` prints: the token for clients, the subject and public key for the
/// agent's configuration.
#[derive(Debug, Clone)]
pub struct GeneratedKey {
    /// The JWT that goes after `Authorization: Bearer `.
    pub token: String,
    /// `Authentication:MonitorApiKey:Subject`.
    pub subject: String,
    /// `Authentication:MonitorApiKey:PublicKey`: the JWK, base64url.
    pub public_key: String,
}

/// A new key pair and a token that expires `expires_unix` (seconds); the private key is dropped.
pub fn generate_key(expires_unix: i64) -> GeneratedKey {
    let signing = SigningKey::random(&mut OsRng);
    let subject = guid();
    let header = json!({"alg": "ES384", "typ": "JWT"});
    let claims = json!({
        "aud": AUDIENCE,
        "exp": expires_unix,
        "iss": GENERATEKEY_ISSUER,
        "sub": subject,
    });
    let signed = format!(
        "{}.{}",
        encode_base64url(header.to_string().as_bytes()),
        encode_base64url(claims.to_string().as_bytes())
    );
    let signature: Signature = signing.sign(signed.as_bytes());
    let token = format!("{signed}.{}", encode_base64url(&signature.to_bytes()));

    let point = signing.verifying_key().to_encoded_point(false);
    let coordinate =
        |c: Option<&p384::FieldBytes>| c.map_or_else(String::new, |c| encode_base64url(c));
    // The shape .NET's JsonWebKey serializes to (what dotnet-monitor's generatekey prints), so
    // that either tool reads the other's keys.
    let jwk = json!({
        "AdditionalData": {},
        "Crv": "P-384",
        "KeyOps": [],
        "Kty": "EC",
        "X": coordinate(point.x()),
        "X5c": [],
        "Y": coordinate(point.y()),
        "KeySize": 384,
        "HasPrivateKey": false,
    });
    GeneratedKey {
        token,
        subject,
        public_key: encode_base64url(jwk.to_string().as_bytes()),
    }
}

/// A random (version 4) GUID from the operating system's generator.
fn guid() -> String {
    let mut bytes = [0u8; 16];
    OsRng.fill_bytes(&mut bytes);
    Guid::new_v4(bytes).to_string()
}
