//! The AzureBlobStorage provider, as dotnet-monitor's: artifacts as block blobs named
//! `<BlobPrefix>/<file name>` in `ContainerName` (created if missing), through the Blob service's
//! REST API. The artifact goes up in blocks of `CopyBufferSize` bytes (Put Block, each retried
//! with back-off), so no more than a block is in memory; the blob exists under its name only
//! once Put Block List commits them all, so a failed upload leaves nothing there (its uncommitted
//! blocks are discarded by the service after a week). Requests carry a SAS (tried first, as
//! dotnet-monitor does) or a Shared Key signature. With `QueueName` and `QueueAccountUri`, a
//! message holding the blob's name (base64, as dotnet-monitor's queue client writes it) follows
//! each upload.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use reqwest::{Method, StatusCode, Url};
use sha2::Sha256;
use tokio::io::AsyncReadExt;

use super::{ArtifactOrigin, AzureBlobOptions, EgressError, Input};

/// dotnet-monitor's default buffer, and the Azure SDK's block size for streams.
const DEFAULT_BLOCK: u64 = 4 << 20;
/// Larger blocks buy nothing and cost memory per artifact in flight.
const MAX_BLOCK: u64 = 100 << 20;
/// A block blob has at most this many committed blocks.
const MAX_BLOCKS: usize = 50_000;
/// The REST API version requests ask for (x-ms-version).
const API_VERSION: &str = "2021-12-02";
/// The Azure SDK's default retry policy: 3 retries, exponential from 0.8 s, at most 1 min.
const DEFAULT_RETRIES: u32 = 3;
const MAX_RETRIES: u32 = 10;
const FIRST_BACKOFF: Duration = Duration::from_millis(800);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// How long a request may go without a byte moving before it is given up (and retried).
const READ_TIMEOUT: Duration = Duration::from_secs(120);

/// How a request proves it may act on the account.
#[derive(Clone)]
enum Credential {
    /// `Authorization: SharedKey <account>:<HMAC-SHA256 of the request>`.
    SharedKey { account: String, key: Arc<[u8]> },
    /// A SAS token, the URL's query.
    Sas(Arc<str>),
}

impl std::fmt::Debug for Credential {
    // Never the key or the signature.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::SharedKey { account, .. } => write!(f, "SharedKey({account})"),
            Credential::Sas(_) => f.write_str("SAS"),
        }
    }
}

/// One storage service of an account (blob or queue) and how to reach it.
#[derive(Debug, Clone)]
struct Service {
    /// The account URI without query, e.g. `https://acct.blob.core.windows.net/` or
    /// `http://127.0.0.1:10000/devstoreaccount1`.
    base: Url,
    credential: Credential,
}

impl Service {
    /// `base/<segments…>?<SAS>&<query>`.
    fn url(&self, segments: &[&str], query: &[(&str, &str)]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty();
            for segment in segments {
                path.extend(segment.split('/'));
            }
        }
        if let Credential::Sas(sas) = &self.credential {
            url.set_query(Some(sas));
        }
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        url
    }

    /// The request, dated now and signed (Shared Key) or carrying its SAS already in `url`.
    fn request(
        &self,
        http: &reqwest::Client,
        method: Method,
        url: Url,
        headers: &[(&str, String)],
        body: Bytes,
    ) -> Result<reqwest::Request, String> {
        let date = DateTime::<Utc>::from(SystemTime::now())
            .format("%a, %d %b %Y %H:%M:%S GMT")
            .to_string();
        let mut builder = http
            .request(method, url)
            .header("x-ms-date", date)
            .header("x-ms-version", API_VERSION)
            .header(reqwest::header::CONTENT_LENGTH, body.len());
        for (name, value) in headers {
            builder = builder.header(*name, value);
        }
        let mut request = builder.body(body).build().map_err(|e| e.to_string())?;
        if let Credential::SharedKey { account, key } = &self.credential {
            let signature = shared_key_signature(&request, account, key);
            let value = format!("SharedKey {account}:{signature}");
            request.headers_mut().insert(
                reqwest::header::AUTHORIZATION,
                value
                    .parse()
                    .map_err(|_| "the account name is not a header value")?,
            );
        }
        Ok(request)
    }
}

/// The Shared Key signature of `request` (learn.microsoft.com/rest/api/storageservices/
/// authorize-with-shared-key, Blob, Queue and File services): HMAC-SHA256 over the verb, the
/// standard headers (Content-Length empty when 0), the `x-ms-*` headers sorted, and the resource
/// with its query parameters sorted.
fn shared_key_signature(request: &reqwest::Request, account: &str, key: &[u8]) -> String {
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    };
    let length = match header("content-length") {
        "0" => "",
        other => other,
    };
    let mut text = format!(
        "{}\n{}\n{}\n{}\n{}\n{}\n\n{}\n{}\n{}\n{}\n{}\n",
        request.method(),
        header("content-encoding"),
        header("content-language"),
        length,
        header("content-md5"),
        header("content-type"),
        header("if-modified-since"),
        header("if-match"),
        header("if-none-match"),
        header("if-unmodified-since"),
        header("range"),
    );
    let mut ms: Vec<(String, &str)> = request
        .headers()
        .iter()
        .filter(|(name, _)| name.as_str().starts_with("x-ms-"))
        .map(|(name, value)| {
            (
                name.as_str().to_string(),
                value.to_str().unwrap_or_default(),
            )
        })
        .collect();
    ms.sort();
    for (name, value) in ms {
        text.push_str(&format!("{name}:{}\n", value.trim()));
    }
    text.push_str(&format!("/{account}{}", request.url().path()));
    let mut query: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in request.url().query_pairs() {
        query
            .entry(name.to_lowercase())
            .or_default()
            .push(value.into_owned());
    }
    for (name, mut values) in query {
        values.sort();
        text.push_str(&format!("\n{name}:{}", values.join(",")));
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(text.as_bytes());
    STANDARD.encode(mac.finalize().into_bytes())
}

/// The account an account URI names: the first label of `<account>.blob.core.windows.net`, or
/// the first path segment of an IP-addressed (emulator) URI such as Azurite's
/// `http://127.0.0.1:10000/devstoreaccount1`.
fn account_name(url: &Url) -> Option<String> {
    let host = url.host_str()?;
    let path_style = host == "localhost"
        || host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok();
    let name = if path_style {
        url.path_segments()?.next()?
    } else {
        url.host_str()?.split('.').next()?
    };
    (!name.is_empty()).then(|| name.to_string())
}

/// One request to make: its service, what it does (for errors and logs), and its parts.
struct Call<'a> {
    service: &'a Service,
    action: &'static str,
    method: Method,
    url: Url,
    headers: &'a [(&'a str, String)],
    body: Bytes,
}

/// Where the queue message about each blob goes.
#[derive(Debug, Clone)]
struct Queue {
    service: Service,
    name: String,
}

#[derive(Debug, Clone)]
pub(super) struct AzureBlobProvider {
    blob: Service,
    container: String,
    prefix: Option<String>,
    block_size: usize,
    max_retries: u32,
    queue: Option<Queue>,
    /// `Metadata`: blob metadata name → the target's environment variable giving its value.
    metadata: BTreeMap<String, String>,
    http: reqwest::Client,
}

impl AzureBlobProvider {
    pub(super) fn new(
        name: &str,
        options: &AzureBlobOptions,
        properties: &BTreeMap<String, String>,
    ) -> Result<AzureBlobProvider, EgressError> {
        let invalid = |reason: String| EgressError::InvalidProvider {
            name: name.to_string(),
            reason,
        };
        // A value given directly, or by the name of an Egress:Properties entry.
        let secret = |value: &Option<String>, by_name: &Option<String>, key: &str| {
            if let Some(v) = value.as_deref().map(str::trim).filter(|v| !v.is_empty()) {
                return Ok(Some(v.to_string()));
            }
            match by_name.as_deref().filter(|n| !n.is_empty()) {
                None => Ok(None),
                Some(n) => properties
                    .get(n)
                    .map(|v| Some(v.trim().to_string()))
                    .ok_or_else(|| {
                        invalid(format!(
                            "{key}Name is {n:?}, but Egress:Properties has no such entry"
                        ))
                    }),
            }
        };
        if options.container_name.trim().is_empty() {
            return Err(invalid("containerName is required".into()));
        }
        for (key, variable) in &options.metadata {
            // Metadata names are C# identifiers (the Blob service's rule).
            let identifier = key
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !identifier {
                return Err(invalid(format!(
                    "metadata name {key:?} is not a C# identifier (letters, digits and '_', not \
                     starting with a digit), as blob metadata names must be"
                )));
            }
            if variable.trim().is_empty() {
                return Err(invalid(format!(
                    "metadata {key:?} names no environment variable"
                )));
            }
        }
        let sas = secret(
            &options.shared_access_signature,
            &options.shared_access_signature_name,
            "SharedAccessSignature",
        )?;
        let key = secret(
            &options.account_key,
            &options.account_key_name,
            "AccountKey",
        )?;
        let queue_sas = secret(
            &options.queue_shared_access_signature,
            &options.queue_shared_access_signature_name,
            "QueueSharedAccessSignature",
        )?;
        let managed = options
            .managed_identity_client_id
            .as_deref()
            .is_some_and(|c| !c.is_empty())
            || options.use_workload_identity_from_environment;
        let service = |uri: &str, key_name: &str, sas: Option<&String>| {
            let mut base: Url = uri
                .trim()
                .parse()
                .map_err(|e| invalid(format!("{key_name} {uri:?} is not a URL: {e}")))?;
            if !matches!(base.scheme(), "http" | "https") {
                return Err(invalid(format!("{key_name} must be an http(s) URL")));
            }
            // A SAS written into the URI counts as the SAS (the SDK's clients read it there).
            let inline_sas = base.query().filter(|q| !q.is_empty()).map(str::to_string);
            base.set_query(None);
            base.set_fragment(None);
            let credential =
                match (sas.cloned().or(inline_sas), &key) {
                    (Some(sas), _) => Credential::Sas(sas.trim_start_matches('?').into()),
                    (None, Some(key)) => {
                        let key = STANDARD.decode(key).map_err(|e| {
                            invalid(format!(
                            "AccountKey is not base64 ({e}): give the key as the portal shows it"
                        ))
                        })?;
                        let account = account_name(&base).ok_or_else(|| {
                            invalid(format!("{key_name} {uri:?} names no storage account"))
                        })?;
                        Credential::SharedKey {
                            account,
                            key: key.into(),
                        }
                    }
                    (None, None) if managed => {
                        return Err(invalid(
                            "managed or workload identity (ManagedIdentityClientId, \
                         UseWorkloadIdentityFromEnvironment) is not supported: give \
                         SharedAccessSignature or AccountKey"
                                .into(),
                        ))
                    }
                    (None, None) => return Err(invalid(
                        "no credential: give SharedAccessSignature (or SharedAccessSignatureName) \
                         or AccountKey (or AccountKeyName)"
                            .into(),
                    )),
                };
            Ok(Service { base, credential })
        };
        let blob = service(&options.account_uri, "accountUri", sas.as_ref())?;
        let queue = match (
            options.queue_name.as_deref().filter(|q| !q.is_empty()),
            options
                .queue_account_uri
                .as_deref()
                .filter(|q| !q.is_empty()),
        ) {
            (Some(queue), Some(uri)) => Some(Queue {
                service: service(uri, "queueAccountUri", queue_sas.as_ref().or(sas.as_ref()))?,
                name: queue.to_string(),
            }),
            (None, None) => None,
            _ => {
                return Err(invalid(
                    "queueName and queueAccountUri go together: give both or neither".into(),
                ))
            }
        };
        let block_size = match options.copy_buffer_size {
            None => DEFAULT_BLOCK,
            Some(0) => return Err(invalid("copyBufferSize must be at least 1 byte".into())),
            Some(n) => n.min(MAX_BLOCK),
        };
        let max_retries = options.max_retries.unwrap_or(DEFAULT_RETRIES);
        if max_retries > MAX_RETRIES {
            return Err(invalid(format!(
                "maxRetries is {max_retries}; at most {MAX_RETRIES}"
            )));
        }
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(READ_TIMEOUT)
            .build()
            .map_err(|e| invalid(format!("HTTP client: {e}")))?;
        Ok(AzureBlobProvider {
            blob,
            container: options.container_name.trim().to_string(),
            prefix: options
                .blob_prefix
                .as_deref()
                .map(|p| p.trim_matches('/'))
                .filter(|p| !p.is_empty())
                .map(str::to_string),
            block_size: block_size as usize,
            max_retries,
            queue,
            metadata: options.metadata.clone(),
            http,
        })
    }

    pub(super) fn needs_environment(&self) -> bool {
        !self.metadata.is_empty()
    }

    /// The blob's metadata for an artifact from `origin`: dotnet-monitor's built-in
    /// `DotnetMonitor_*` keys, then each `Metadata` name whose environment variable the target
    /// has (a built-in key wins over a `Metadata` name that repeats it). A value that cannot be
    /// an HTTP header value (control or non-ASCII characters) is left out, with a warning.
    pub(super) fn metadata(&self, origin: &ArtifactOrigin) -> Vec<(String, String)> {
        let mut metadata: BTreeMap<String, String> = BTreeMap::new();
        for (key, variable) in &self.metadata {
            match origin.environment.iter().find(|(name, _)| name == variable) {
                Some((_, value)) => {
                    metadata.insert(key.clone(), value.trim().to_string());
                }
                None => {
                    tracing::debug!(%key, %variable, "the target has no such environment variable; no metadata")
                }
            }
        }
        let mut builtin = vec![(
            "DotnetMonitor_ArtifactSource_ProcessId",
            origin.pid.to_string(),
        )];
        if let Some(cookie) = &origin.runtime_cookie {
            builtin.push((
                "DotnetMonitor_ArtifactSource_RuntimeInstanceCookie",
                cookie.clone(),
            ));
        }
        if let Some(rule) = &origin.rule {
            builtin.push(("DotnetMonitor_CollectionRuleName", rule.rule.clone()));
            builtin.push((
                "DotnetMonitor_ActionListIndex",
                rule.action_index.to_string(),
            ));
            builtin.push(("DotnetMonitor_ActionName", rule.action.clone()));
        }
        for (key, value) in builtin {
            // Metadata names match without regard to case in the Blob service.
            metadata.retain(|k, _| !k.eq_ignore_ascii_case(key));
            metadata.insert(key.to_string(), value);
        }
        metadata
            .into_iter()
            .filter(|(key, value)| {
                let fits = value.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b));
                if !fits {
                    tracing::warn!(%key, "a blob metadata value has characters an HTTP header cannot carry; left out");
                }
                fits
            })
            .map(|(key, value)| (format!("x-ms-meta-{key}"), value))
            .collect()
    }

    /// The error of `action` on `blob`; its reason never carries a URL's query (a SAS).
    fn error(&self, action: &'static str, blob: &str, reason: impl ToString) -> EgressError {
        EgressError::AzureBlob {
            action,
            blob: format!("{}/{blob}", self.container),
            reason: super::redact_url_queries(&reason.to_string()),
        }
    }

    /// Sends a request, trying again (with back-off) after a transport error or an answer that
    /// says to (408, 429, 5xx); returns the last answer, whatever its status.
    async fn send(&self, blob: &str, call: Call<'_>) -> Result<reqwest::Response, EgressError> {
        let Call {
            service,
            action,
            method,
            url,
            headers,
            body,
        } = call;
        let mut attempt = 0u32;
        loop {
            let request = service
                .request(
                    &self.http,
                    method.clone(),
                    url.clone(),
                    headers,
                    body.clone(),
                )
                .map_err(|e| self.error(action, blob, e))?;
            let reason = match self.http.execute(request).await {
                Ok(response) if !retriable(response.status()) => return Ok(response),
                Ok(response) => super::answer_error(response).await,
                Err(error) => super::transport_error(error),
            };
            if attempt >= self.max_retries {
                let tries = attempt + 1;
                return Err(self.error(
                    action,
                    blob,
                    format!("{reason} ({tries} attempts; Egress:AzureBlobStorage:<name>:MaxRetries is {})", self.max_retries),
                ));
            }
            let delay = FIRST_BACKOFF
                .saturating_mul(1 << attempt.min(16))
                .min(MAX_BACKOFF);
            attempt += 1;
            tracing::warn!(
                action,
                blob = %format!("{}/{blob}", self.container),
                attempt,
                reason = %super::redact_url_queries(&reason),
                "an Azure Storage request failed; trying again in {delay:?}"
            );
            tokio::time::sleep(delay).await;
        }
    }

    /// [`send`](Self::send), then a non-2xx answer is an error carrying the service's message.
    async fn send_ok(&self, blob: &str, call: Call<'_>) -> Result<reqwest::Response, EgressError> {
        let action = call.action;
        let response = self.send(blob, call).await?;
        if response.status().is_success() {
            return Ok(response);
        }
        Err(self.error(action, blob, super::answer_error(response).await))
    }

    /// Creates `segments` (a container or queue) unless it exists; a SAS may lack the account
    /// permission this takes (403), and then the resource is assumed to exist, as dotnet-monitor
    /// does.
    async fn ensure_exists(
        &self,
        service: &Service,
        action: &'static str,
        blob: &str,
        url: Url,
    ) -> Result<(), EgressError> {
        let call = Call {
            service,
            action,
            method: Method::PUT,
            url,
            headers: &[],
            body: Bytes::new(),
        };
        let response = self.send(blob, call).await?;
        let status = response.status();
        let sas = matches!(service.credential, Credential::Sas(_));
        if status.is_success()
            || status == StatusCode::CONFLICT
            || (sas && status == StatusCode::FORBIDDEN)
        {
            return Ok(());
        }
        Err(self.error(action, blob, super::answer_error(response).await))
    }

    /// Uploads `input` as the blob `<prefix>/<file_name>` with the `x-ms-meta-*` headers
    /// `metadata` ([`metadata`](Self::metadata)); returns the blob's URL (without SAS).
    pub(super) async fn write(
        self,
        file_name: String,
        metadata: Vec<(String, String)>,
        mut input: Input,
    ) -> Result<String, EgressError> {
        let blob = match &self.prefix {
            Some(prefix) => format!("{prefix}/{file_name}"),
            None => file_name,
        };
        let container_url = self
            .blob
            .url(&[&self.container], &[("restype", "container")]);
        self.ensure_exists(&self.blob, "Create Container", &blob, container_url)
            .await?;
        // Distinct from the ids of any earlier, failed upload of the same name.
        let upload = fastrand::u64(..);
        let mut ids = Vec::new();
        loop {
            let mut block = Vec::with_capacity(self.block_size);
            (&mut input.reader)
                .take(self.block_size as u64)
                .read_to_end(&mut block)
                .await
                .map_err(|e| self.error("read", &blob, e))?;
            if block.is_empty() {
                break;
            }
            if ids.len() == MAX_BLOCKS {
                return Err(self.error(
                    "Put Block",
                    &blob,
                    format!("more than {MAX_BLOCKS} blocks: raise CopyBufferSize"),
                ));
            }
            let full = block.len() == self.block_size;
            let id = STANDARD.encode(format!("{upload:016x}-{:08}", ids.len()));
            let url = self.blob.url(
                &[&self.container, &blob],
                &[("comp", "block"), ("blockid", &id)],
            );
            let call = Call {
                service: &self.blob,
                action: "Put Block",
                method: Method::PUT,
                url,
                headers: &[],
                body: Bytes::from(block),
            };
            self.send_ok(&blob, call).await?;
            ids.push(id);
            if !full {
                break;
            }
        }
        input.end()?;
        let mut list = String::from(r#"<?xml version="1.0" encoding="utf-8"?><BlockList>"#);
        for id in &ids {
            list.push_str(&format!("<Latest>{id}</Latest>"));
        }
        list.push_str("</BlockList>");
        let url = self
            .blob
            .url(&[&self.container, &blob], &[("comp", "blocklist")]);
        // Put Block List sets the blob's properties and metadata as it commits.
        let headers: Vec<(&str, String)> = [(
            "x-ms-blob-content-type",
            "application/octet-stream".to_string(),
        )]
        .into_iter()
        .chain(
            metadata
                .iter()
                .map(|(name, value)| (name.as_str(), value.clone())),
        )
        .collect();
        let call = Call {
            service: &self.blob,
            action: "Put Block List",
            method: Method::PUT,
            url,
            headers: &headers,
            body: Bytes::from(list),
        };
        self.send_ok(&blob, call).await?;
        let mut location = self.blob.url(&[&self.container, &blob], &[]);
        location.set_query(None);
        tracing::info!(%location, blocks = ids.len(), "artifact uploaded");
        if let Some(queue) = &self.queue {
            // As dotnet-monitor: the blob is there; a failed message is logged, not an error.
            if let Err(error) = self.announce(queue, &blob).await {
                tracing::warn!(%error, queue = %queue.name, "the queue message about a blob was not sent");
            }
        }
        Ok(location.to_string())
    }

    /// Puts a message holding `blob`'s name (base64) on the queue, creating it if missing.
    async fn announce(&self, queue: &Queue, blob: &str) -> Result<(), EgressError> {
        let url = queue.service.url(&[&queue.name], &[]);
        self.ensure_exists(&queue.service, "Create Queue", blob, url)
            .await?;
        let message = format!(
            "<QueueMessage><MessageText>{}</MessageText></QueueMessage>",
            STANDARD.encode(blob)
        );
        let url = queue.service.url(&[&queue.name, "messages"], &[]);
        let call = Call {
            service: &queue.service,
            action: "Put Message",
            method: Method::POST,
            url,
            headers: &[],
            body: Bytes::from(message),
        };
        self.send_ok(blob, call).await?;
        Ok(())
    }
}

/// Whether an answer says to try again (the Azure SDK's list: timeouts, throttling, server errors).
fn retriable(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 429 | 500 | 502 | 503 | 504)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn account_names_come_from_the_host_or_the_emulators_path() {
        let name = |uri: &str| account_name(&uri.parse().unwrap());
        assert_eq!(
            name("https://acct.blob.core.windows.net/").as_deref(),
            Some("acct")
        );
        assert_eq!(
            name("http://127.0.0.1:10000/devstoreaccount1").as_deref(),
            Some("devstoreaccount1")
        );
        assert_eq!(name("http://127.0.0.1:10000/"), None);
    }

    /// The example of Microsoft's Shared Key page, re-signed: the string to sign it gives is what
    /// this builds (checked through the signature of a known key).
    #[test]
    fn shared_key_signs_the_canonical_request() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::new();
        let mut request = http
            .get("https://myaccount.blob.core.windows.net/mycontainer?restype=container&comp=metadata&timeout=20")
            .header("x-ms-date", "Fri, 26 Jun 2015 23:39:12 GMT")
            .header("x-ms-version", "2015-02-21")
            .build()
            .unwrap();
        request
            .headers_mut()
            .insert("content-length", "0".parse().unwrap());
        let key = b"key";
        let expected = "GET\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:Fri, 26 Jun 2015 23:39:12 GMT\n\
                        x-ms-version:2015-02-21\n/myaccount/mycontainer\ncomp:metadata\n\
                        restype:container\ntimeout:20";
        let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
        mac.update(expected.as_bytes());
        assert_eq!(
            shared_key_signature(&request, "myaccount", key),
            STANDARD.encode(mac.finalize().into_bytes())
        );
    }
}
