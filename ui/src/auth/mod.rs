//! Authentication of the API, compatible with dotnet-monitor's MonitorApiKey and Microsoft Entra
//! ID: every request but the web UI's files (which hold no data) needs `Authorization: Bearer
//! <JWT>`, a token signed by the key configured as `Authentication:MonitorApiKey:{Subject,
//! PublicKey}` (see [`key`] for exactly what is checked) or, with `Authentication:AzureAd`, an
//! Entra ID token (see [`azure_ad`]); both are accepted when both are configured. `clrscope generatekey` makes a key and its token
//! ([`generate_key`]).
//!
//! Auth is on unless the agent runs with `--no-auth`: without a usable key every request is
//! refused with 401 and a problem+json body that says how to configure one. A refused request
//! gets `WWW-Authenticate: Bearer` (with `error="invalid_token"` when a token was given). An
//! Entra ID token that is valid but lacks the required role gets 403 with
//! `error="insufficient_scope"` (RFC 6750 §3.1, and what dotnet-monitor answers). Each refusal's
//! advice fits the scheme its token was checked under.

mod azure_ad;
mod generate;
mod key;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

pub use azure_ad::{AzureAd, AzureAdConfig};
pub use generate::{generate_key, GeneratedKey};
pub use key::{ApiKey, KeyError, TokenError, ALGORITHMS, AUDIENCE, GENERATEKEY_ISSUER};

use crate::error::ApiError;
use crate::server::ApiState;

/// The `Authentication` section of settings.json (dotnet-monitor's keys).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct AuthenticationConfig {
    #[serde(default)]
    pub monitor_api_key: Option<MonitorApiKeyConfig>,
    /// Microsoft Entra ID tokens (alongside MonitorApiKey's when both are configured).
    #[serde(default)]
    pub azure_ad: Option<AzureAdConfig>,
}

/// `Authentication:MonitorApiKey`: what `clrscope generatekey` (or dotnet-monitor's) printed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct MonitorApiKeyConfig {
    pub subject: Option<String>,
    /// The JWK of the public key, base64url.
    pub public_key: Option<String>,
    /// The issuer tokens must name; default [`GENERATEKEY_ISSUER`].
    pub issuer: Option<String>,
}

/// What the API asks of a request.
#[derive(Debug, Clone)]
pub enum Authentication {
    /// `--no-auth`: nothing.
    Disabled,
    /// A token of this key.
    ApiKey(Arc<ApiKey>),
    /// A Microsoft Entra ID token, or one of the MonitorApiKey when one is configured too.
    AzureAd {
        azure_ad: Arc<AzureAd>,
        api_key: Option<Arc<ApiKey>>,
    },
    /// Auth is on but no usable key is configured: every request is refused, saying why.
    Unconfigured(Arc<KeyError>),
}

impl Authentication {
    /// Auth as `config` asks: its key and/or Entra ID, or [`Authentication::Unconfigured`] with
    /// the reason.
    pub fn from_config(config: &AuthenticationConfig) -> Authentication {
        let key = config.monitor_api_key.clone().unwrap_or_default();
        let api_key = ApiKey::new(
            key.subject.as_deref(),
            key.public_key.as_deref(),
            key.issuer.as_deref(),
        );
        match (&config.azure_ad, api_key) {
            (None, Ok(key)) => Authentication::ApiKey(Arc::new(key)),
            (None, Err(error)) => Authentication::Unconfigured(Arc::new(error)),
            (Some(azure_ad), api_key) => match AzureAd::new(azure_ad) {
                Ok(azure_ad) => Authentication::AzureAd {
                    azure_ad: Arc::new(azure_ad),
                    // A MonitorApiKey section that is there but unusable is a mistake to report.
                    api_key: match api_key {
                        Ok(key) => Some(Arc::new(key)),
                        Err(_) if config.monitor_api_key.is_none() => None,
                        Err(error) => return Authentication::Unconfigured(Arc::new(error)),
                    },
                },
                Err(reason) => Authentication::Unconfigured(Arc::new(KeyError::AzureAd(reason))),
            },
        }
    }

    /// Whether `authorization` (the header's value, if any) may call the API at `now_unix`.
    pub async fn check(&self, authorization: Option<&str>, now_unix: i64) -> Result<(), Refusal> {
        match self {
            Authentication::Disabled => Ok(()),
            Authentication::Unconfigured(error) => Err(Refusal::Unconfigured(Arc::clone(error))),
            Authentication::ApiKey(key) => key
                .verify(bearer(authorization)?, now_unix)
                .map_err(Refusal::Token),
            Authentication::AzureAd { azure_ad, api_key } => {
                let token = bearer(authorization)?;
                let Some(key) = api_key else {
                    return azure_ad
                        .verify(token, now_unix)
                        .await
                        .map_err(Refusal::EntraToken);
                };
                // The token's issuer tells which scheme's refusal explains it.
                let issuer = key::Jwt::parse(token)
                    .ok()
                    .and_then(|jwt| jwt.claim_str("iss").map(str::to_string));
                match key.verify(token, now_unix) {
                    Ok(()) => Ok(()),
                    Err(error) if issuer.as_deref() == Some(key.issuer()) => {
                        Err(Refusal::Token(error))
                    }
                    Err(_) => azure_ad
                        .verify(token, now_unix)
                        .await
                        .map_err(Refusal::EntraToken),
                }
            }
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer(authorization: Option<&str>) -> Result<&str, Refusal> {
    authorization
        .ok_or(Refusal::Token(TokenError::Missing))?
        .split_once(' ')
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .ok_or(Refusal::Token(TokenError::NotBearer))
}

/// Why a request may not call the API; the message gives the advice of the scheme the token
/// was checked under.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// No token, or a MonitorApiKey token refused.
    #[error("{}{}", .0, api_key_advice(.0))]
    Token(TokenError),

    /// A Microsoft Entra ID token refused.
    #[error("{}{}", .0, entra_advice(.0))]
    EntraToken(TokenError),

    #[error("{}", unconfigured(.0))]
    Unconfigured(Arc<KeyError>),
}

impl Refusal {
    /// Whether the caller is known but lacks the right (RFC 6750 `insufficient_scope`: 403, as
    /// dotnet-monitor's authorization policy answers), rather than unauthenticated (401).
    pub fn is_forbidden(&self) -> bool {
        matches!(self, Refusal::EntraToken(TokenError::Role { .. }))
    }
}

fn api_key_advice(error: &TokenError) -> &'static str {
    match error {
        TokenError::Expired(_) => ": make a new one with `clrscope generatekey`",
        TokenError::Signature | TokenError::KeyMismatch { .. } => {
            ": it was made with another key (make a new token with `clrscope generatekey` and \
             configure its key, or configure the key it belongs to)"
        }
        _ => "",
    }
}

fn entra_advice(error: &TokenError) -> &'static str {
    match error {
        TokenError::Expired(_) | TokenError::NotYetValid(_) => {
            ": request a new access token from Microsoft Entra ID (e.g. `az account \
             get-access-token --scope <AppIdUri>/.default`)"
        }
        TokenError::Signature | TokenError::KeyMismatch { .. } | TokenError::UnknownKey(_) => {
            ": request the token from the tenant configured as Authentication:AzureAd:TenantId"
        }
        TokenError::Audience { .. } => {
            ": request the token for the scope `<AppIdUri>/.default` (AppIdUri defaults to \
             api://<ClientId>)"
        }
        TokenError::Role { .. } => {
            ": assign that app role to the caller (user, group or managed identity) in the app \
             registration's enterprise application, then request a new token"
        }
        TokenError::Keys(_) => ": the issuer must be reachable from the agent; try again later",
        _ => "",
    }
}

fn unconfigured(error: &KeyError) -> String {
    match error {
        KeyError::AzureAd(reason) => format!(
            "the agent's Authentication:AzureAd configuration cannot be used ({reason}), so it \
             accepts no token: fix it and restart the agent"
        ),
        _ => format!(
            "the agent has authentication on but no usable API key ({error}); run `clrscope \
             generatekey` and configure its Subject and PublicKey (settings.json \
             Authentication:MonitorApiKey, or CLRSCOPE_Authentication__MonitorApiKey__Subject/\
             __PublicKey), or start the agent with --temp-apikey, or --no-auth on a trusted machine"
        ),
    }
}

/// The middleware over the whole router: requests for the web UI's files pass, every other
/// one (any API route, present or future, and unknown paths) needs a valid token.
pub(crate) async fn authenticate(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Response {
    if crate::web::is_public(request.uri().path()) {
        return next.run(request).await;
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match state.auth.check(authorization, now).await {
        Ok(()) => next.run(request).await,
        Err(refusal) => {
            let challenge = match refusal {
                Refusal::Token(TokenError::Missing) | Refusal::Unconfigured(_) => "Bearer",
                _ if refusal.is_forbidden() => "Bearer error=\"insufficient_scope\"",
                Refusal::Token(_) | Refusal::EntraToken(_) => "Bearer error=\"invalid_token\"",
            };
            let mut response = ApiError::Unauthorized(refusal).into_response();
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
            response
        }
    }
}

#[cfg(test)]
mod tests;
