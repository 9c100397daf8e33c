//! Microsoft Entra ID (Azure AD) bearer tokens, as dotnet-monitor checks them
//! (`Authentication:AzureAd`, Microsoft.Identity.Web over JwtBearer): the authority is
//! `{Instance}/{TenantId}/v2.0`; its OpenID metadata (`/.well-known/openid-configuration`) names
//! the issuer and the JWKS whose keys sign tokens. A token passes when its `kid` is one of those
//! keys and the signature verifies (ES*/RS* only: `none` and HMAC are refused), it is within its
//! lifetime (five minutes' skew), its audience is `AppIdUri` (default `api://{ClientId}`), its
//! issuer is the metadata's (`{tenantid}` read from the token's `tid`), and its `roles` hold
//! `RequiredRole`.
//!
//! The keys are fetched over https when first needed, kept for [`KEYS_MAX_AGE`] (then fetched
//! again in the background while the held ones stay in use), and fetched again when a token names
//! a key they lack (key rotation). Fetches run one at a time, within [`FETCH_TIMEOUT`], at most
//! once per [`REFRESH_AT_MOST_EVERY`] whether they succeed or fail, that wait doubling with each
//! failure up to [`MAX_BACKOFF`]; each answer is at most [`MAX_DOCUMENT_BYTES`]. A token whose
//! key is held never waits on a fetch.
//!
//! `TenantId` must name one tenant. Microsoft.Identity.Web, under dotnet-monitor, takes
//! `common`, `organizations` or `consumers` and then accepts the issuer of whatever tenant the
//! token names (`{tenantid}` from its `tid`): any tenant that consents to a multi-tenant app
//! registration can give its own users the required role, so such a token opens the API to
//! outsiders. The agent refuses those values (every request is refused, saying so, and the start
//! logs it) rather than hand a diagnostics API (dumps, traces) to every Entra ID tenant.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
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
/// `TenantId`s that are not one tenant (Entra ID's multi-tenant authorities).
const MULTI_TENANT: [&str; 3] = ["common", "organizations", "consumers"];
/// How long one fetch (metadata and JWKS) may take: only tokens with a key not held wait on it.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest wait between fetches while the issuer keeps failing.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

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
    /// Held only to read or replace, never across a fetch.
    cache: std::sync::Mutex<Cache>,
    /// Serializes fetches.
    fetching: Mutex<()>,
}

/// The keys held and when fetches may run.
#[derive(Debug, Default)]
struct Cache {
    keys: Arc<KeySet>,
    /// When the last fetch began, successful or not.
    attempted: Option<Instant>,
    /// Failed fetches since the last good one (each doubles the wait before the next).
    failures: u32,
    last_failure: String,
}

impl Cache {
    /// The wait after the last attempt before another: [`REFRESH_AT_MOST_EVERY`], doubled per
    /// failure up to [`MAX_BACKOFF`], so that an issuer failing (or tokens with made-up `kid`s)
    /// cannot make the agent hammer it.
    fn backoff(&self) -> Duration {
        let doublings = self.failures.saturating_sub(1).min(8);
        (REFRESH_AT_MOST_EVERY * 2u32.pow(doublings)).min(MAX_BACKOFF)
    }

    fn may_fetch(&self) -> bool {
        self.attempted.is_none_or(|t| t.elapsed() >= self.backoff())
    }

    /// Whether a fetch may run now; if so, it counts from now.
    fn begin_fetch(&mut self) -> bool {
        let may = self.may_fetch();
        if may {
            self.attempted = Some(Instant::now());
        }
        may
    }
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
        if MULTI_TENANT.iter().any(|m| tenant.eq_ignore_ascii_case(m)) {
            return Err(format!(
                "Authentication:AzureAd:TenantId is {tenant:?}, which accepts tokens from every \
                 Entra ID tenant (any tenant's admin can grant the required role): set it to your \
                 own tenant's ID (a GUID, or its domain such as contoso.onmicrosoft.com)"
            ));
        }
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
            .connect_timeout(FETCH_TIMEOUT)
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
            cache: std::sync::Mutex::new(Cache::default()),
            fetching: Mutex::new(()),
        })
    }

    /// Checks a bearer `token` at `now_unix` (seconds).
    pub async fn verify(self: &Arc<Self>, token: &str, now_unix: i64) -> Result<(), TokenError> {
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

    /// The key `kid` and the issuer. Keys held are used at once: a token never waits on a fetch
    /// when its key is cached (old keys are refreshed in the background). A `kid` not held waits
    /// for one fetch, if [`Cache::may_fetch`] allows one now.
    async fn key(self: &Arc<Self>, kid: &str) -> Result<(PublicKey, String), TokenError> {
        let held = |cache: &Cache| {
            cache
                .keys
                .keys
                .get(kid)
                .map(|key| (key.clone(), cache.keys.issuer.clone()))
        };
        {
            let cache = self.lock_cache();
            if let Some(found) = held(&cache) {
                let old = cache
                    .keys
                    .fetched
                    .is_none_or(|t| t.elapsed() > KEYS_MAX_AGE);
                if old && cache.may_fetch() {
                    let this = Arc::clone(self);
                    tokio::spawn(async move { this.refresh().await });
                }
                return Ok(found);
            }
        }
        let failure = self.refresh().await;
        let cache = self.lock_cache();
        match held(&cache) {
            Some(found) => Ok(found),
            None if cache.keys.fetched.is_none() => Err(TokenError::Keys(
                failure.unwrap_or_else(|| cache.last_failure.clone()),
            )),
            None => Err(TokenError::UnknownKey(kid.to_string())),
        }
    }

    /// Fetches the keys if no fetch ran within the limit, one fetch at a time; the reason when
    /// this call's fetch failed.
    async fn refresh(&self) -> Option<String> {
        let _one_at_a_time = self.fetching.lock().await;
        if !self.lock_cache().begin_fetch() {
            return None;
        }
        let result = match tokio::time::timeout(FETCH_TIMEOUT, self.fetch()).await {
            Ok(result) => result,
            Err(_) => Err(format!(
                "{} and its JWKS did not answer within {} s",
                self.metadata_url,
                FETCH_TIMEOUT.as_secs()
            )),
        };
        let mut cache = self.lock_cache();
        match result {
            Ok(fresh) => {
                cache.keys = Arc::new(fresh);
                cache.failures = 0;
                None
            }
            Err(reason) => {
                cache.failures = cache.failures.saturating_add(1);
                tracing::warn!(
                    %reason,
                    retry_in_s = cache.backoff().as_secs(),
                    "the Entra ID signing keys could not be fetched; keys held (if any) are used"
                );
                cache.last_failure.clone_from(&reason);
                Some(reason)
            }
        }
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        // The cache is replaced whole, so a panic elsewhere cannot leave it half-written.
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
            .map_err(|e| format!("GET {url}: {}", exporter::error_chain(&e)))?;
        if !response.status().is_success() {
            return Err(format!("GET {url}: HTTP {}", response.status()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| format!("GET {url}: {}", exporter::error_chain(&e)))?
        {
            if body.len() + chunk.len() > MAX_DOCUMENT_BYTES {
                return Err(format!("GET {url}: larger than {MAX_DOCUMENT_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        serde_json::from_slice(&body).map_err(|e| format!("GET {url}: not a JSON object: {e}"))
    }
}
