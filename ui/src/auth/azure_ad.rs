//! Microsoft Entra ID (Azure AD) bearer tokens, as dotnet-monitor checks them
//! (`Authentication:AzureAd`, Microsoft.Identity.Web over JwtBearer): the authority is
//! `{Instance}/{TenantId}/v2.0`; its OpenID metadata (`/.well-known/openid-configuration`) names
//! the issuer and the JWKS whose keys sign tokens. A token passes when its `kid` is one of those
//! keys and the signature verifies (ES*/RS* only: `none` and HMAC are refused), it is within its
//! lifetime (five minutes' skew), its audience is `AppIdUri` (default `api://{ClientId}`), its
//! issuer is the metadata's (`{tenantid}` read from the token's `tid`), and its `roles` hold
//! `RequiredRole`.
//!
//! The keys are fetched over https when first needed, kept for [`KEYS_MAX_AGE`], and fetched
//! again when a token names a key they lack (key rotation), at most once per
//! [`REFRESH_AT_MOST_EVERY`], one fetch at a time, each answer at most [`MAX_DOCUMENT_BYTES`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Map, Value};
use tokio::sync::Mutex;

use super::key::{shown, Jwt, PublicKey, TokenError};

/// Where Entra ID is, unless `Instance` says otherwise.
pub const DEFAULT_INSTANCE: &str = "https://login.microsoftonline.com";
/// How long fetched keys are used before they are fetched again (Microsoft.IdentityModel's
/// automatic refresh is 12 h).
pub const KEYS_MAX_AGE: Duration = Duration::from_secs(12 * 3600);
/// The soonest the keys are fetched again for a token naming an unknown key, so that tokens
/// with made-up `kid`s cannot make the agent hammer the issuer.
pub const REFRESH_AT_MOST_EVERY: Duration = Duration::from_secs(10);
/// The largest metadata or JWKS document read.
pub const MAX_DOCUMENT_BYTES: usize = 1 << 20;
/// The most keys kept from a JWKS.
const MAX_KEYS: usize = 100;
/// How long one fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// `Authentication:AzureAd` (dotnet-monitor's `AzureAdOptions`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct AzureAdConfig {
    /// Default [`DEFAULT_INSTANCE`].
    pub instance: Option<String>,
    pub tenant_id: Option<String>,
    pub client_id: Option<String>,
    /// The audience tokens must name; default `api://{ClientId}`.
    pub app_id_uri: Option<String>,
    /// The app role a token's `roles` must hold.
    pub required_role: Option<String>,
    /// dotnet-monitor 7.1–8.0.1's Swagger UI scope: accepted, unused (there is no Swagger UI).
    pub swagger_scope: Option<String>,
    /// clrscope's own: a PEM file of CA certificates trusted, besides the system's, for the
    /// metadata and keys (an issuer with a private CA).
    pub ca_certificate_path: Option<PathBuf>,
}

/// The verifier of Entra ID tokens.
#[derive(Debug)]
pub struct AzureAd {
    metadata_url: String,
    audience: String,
    required_role: String,
    http: reqwest::Client,
    keys: Mutex<KeySet>,
}

#[derive(Debug, Default)]
struct KeySet {
    /// The metadata's `issuer` (may hold `{tenantid}`).
    issuer: String,
    keys: HashMap<String, PublicKey>,
    fetched: Option<Instant>,
}

impl AzureAd {
    /// The verifier `config` asks for; the error names the setting to fix.
    pub fn new(config: &AzureAdConfig) -> Result<AzureAd, String> {
        let required = |value: &Option<String>, key: &str| {
            value
                .as_deref()
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_string)
                .ok_or_else(|| format!("Authentication:AzureAd:{key} is required"))
        };
        let client_id = required(&config.client_id, "ClientId")?;
        let tenant = required(&config.tenant_id, "TenantId")?;
        let required_role = required(&config.required_role, "RequiredRole")?;
        let instance = config
            .instance
            .as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .unwrap_or(DEFAULT_INSTANCE)
            .trim_end_matches('/');
        if !instance.starts_with("https://") {
            return Err(format!(
                "Authentication:AzureAd:Instance is {instance:?}: the keys that sign tokens are \
                 fetched over https only"
            ));
        }
        let audience = config
            .app_id_uri
            .as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map_or_else(|| format!("api://{client_id}"), str::to_string);
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut http = reqwest::Client::builder()
            .https_only(true)
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::limited(3));
        if let Some(path) = &config.ca_certificate_path {
            let pem = std::fs::read(path).map_err(|e| {
                format!(
                    "Authentication:AzureAd:CaCertificatePath {}: {e}",
                    path.display()
                )
            })?;
            let certificates = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                format!(
                    "Authentication:AzureAd:CaCertificatePath {}: not PEM certificates: {e}",
                    path.display()
                )
            })?;
            http = http.tls_certs_merge(certificates);
        }
        let http = http
            .build()
            .map_err(|e| format!("Authentication:AzureAd: HTTP client: {e}"))?;
        Ok(AzureAd {
            metadata_url: format!("{instance}/{tenant}/v2.0/.well-known/openid-configuration"),
            audience,
            required_role,
            http,
            keys: Mutex::new(KeySet::default()),
        })
    }

    /// Checks a bearer `token` at `now_unix` (seconds).
    pub async fn verify(&self, token: &str, now_unix: i64) -> Result<(), TokenError> {
        let jwt = Jwt::parse(token)?;
        let kid = jwt
            .header
            .get("kid")
            .and_then(Value::as_str)
            .ok_or(TokenError::NoKeyId)?;
        let (key, issuer) = self.key(kid).await?;
        key.verify(&jwt.alg, jwt.signed.as_bytes(), &jwt.signature)?;
        jwt.check_lifetime(now_unix)?;
        jwt.check_audience(&self.audience)?;
        let expected = match jwt.claim_str("tid") {
            Some(tid) => issuer.replace("{tenantid}", tid),
            None => issuer,
        };
        if jwt.claim_str("iss") != Some(expected.as_str()) {
            return Err(TokenError::Issuer {
                found: shown(jwt.claims.get("iss")),
                expected,
            });
        }
        let has_role = match jwt.claims.get("roles") {
            Some(Value::Array(roles)) => roles
                .iter()
                .any(|r| r.as_str() == Some(self.required_role.as_str())),
            Some(Value::String(role)) => *role == self.required_role,
            _ => false,
        };
        if !has_role {
            return Err(TokenError::Role {
                found: shown(jwt.claims.get("roles")),
                required: self.required_role.clone(),
            });
        }
        Ok(())
    }

    /// The key `kid` and the issuer, fetching the keys when they are missing or old, or lack
    /// `kid` (and were not fetched within [`REFRESH_AT_MOST_EVERY`]).
    async fn key(&self, kid: &str) -> Result<(PublicKey, String), TokenError> {
        let mut set = self.keys.lock().await;
        let age = set.fetched.map(|t| t.elapsed());
        let stale = age.is_none_or(|a| a > KEYS_MAX_AGE);
        let unknown = !set.keys.contains_key(kid) && age.is_none_or(|a| a > REFRESH_AT_MOST_EVERY);
        if stale || unknown {
            match self.fetch().await {
                Ok(fresh) => *set = fresh,
                Err(reason) if set.fetched.is_some() => {
                    tracing::warn!(%reason, "the Entra ID signing keys could not be fetched again; the ones held are used");
                }
                Err(reason) => return Err(TokenError::Keys(reason)),
            }
        }
        match set.keys.get(kid) {
            Some(key) => Ok((key.clone(), set.issuer.clone())),
            None => Err(TokenError::UnknownKey(kid.to_string())),
        }
    }

    async fn fetch(&self) -> Result<KeySet, String> {
        let metadata = self.document(&self.metadata_url).await?;
        let field = |name: &str| {
            metadata
                .get(name)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| format!("{} has no {name:?}", self.metadata_url))
        };
        let issuer = field("issuer")?;
        let jwks_uri = field("jwks_uri")?;
        let jwks = self.document(&jwks_uri).await?;
        let mut keys = HashMap::new();
        for jwk in jwks
            .get("keys")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("{jwks_uri} has no \"keys\" list"))?
            .iter()
            .filter_map(Value::as_object)
            .take(MAX_KEYS)
        {
            let Some(kid) = jwk.get("kid").and_then(Value::as_str) else {
                continue;
            };
            // Encryption keys are not signing keys.
            if jwk
                .get("use")
                .and_then(Value::as_str)
                .is_some_and(|u| u != "sig")
            {
                continue;
            }
            match PublicKey::from_jwk(jwk) {
                Ok(key) => {
                    keys.insert(kid.to_string(), key);
                }
                Err(error) => tracing::warn!(kid, %error, "a JWKS key is skipped"),
            }
        }
        tracing::info!(keys = keys.len(), %jwks_uri, "fetched the Entra ID signing keys");
        Ok(KeySet {
            issuer,
            keys,
            fetched: Some(Instant::now()),
        })
    }

    /// A JSON object at `url`, at most [`MAX_DOCUMENT_BYTES`].
    async fn document(&self, url: &str) -> Result<Map<String, Value>, String> {
        let mut response = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| format!("GET {url}: {}", chain(&e)))?;
        if !response.status().is_success() {
            return Err(format!("GET {url}: HTTP {}", response.status()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| format!("GET {url}: {}", chain(&e)))?
        {
            if body.len() + chunk.len() > MAX_DOCUMENT_BYTES {
                return Err(format!("GET {url}: larger than {MAX_DOCUMENT_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        serde_json::from_slice(&body).map_err(|e| format!("GET {url}: not a JSON object: {e}"))
    }
}

/// An error with its causes (a TLS failure says why only in its source).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}
