//! The S3Storage provider: artifacts as objects named like the file, uploaded in parts of
//! `CopyBufferSize` bytes (one PUT when the artifact fits one part), so no more than a part is
//! held in memory and nothing touches the disk.

use std::sync::Arc;
use std::time::Duration;

use rusty_s3::actions::CreateMultipartUpload;
use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};
use tokio::io::AsyncReadExt;

use super::{EgressError, Input, S3Options};

/// S3's smallest part but the last, and dotnet-monitor's minimum `copyBufferSize`.
const MIN_PART: u64 = 5 << 20;
/// Parts larger than this buy nothing and cost memory per artifact in flight.
const MAX_PART: u64 = 256 << 20;
/// How long each signed request stays valid: longer than any one part takes to send.
const SIGNATURE_LIFETIME: Duration = Duration::from_secs(3600);
/// S3 allows at most this many parts.
const MAX_PARTS: u16 = 10_000;

#[derive(Debug, Clone)]
pub(super) struct S3Provider {
    bucket: Arc<Bucket>,
    credentials: Option<Arc<Credentials>>,
    part_size: usize,
    presigned_url_expiry: Option<Duration>,
    http: reqwest::Client,
}

impl S3Provider {
    pub(super) fn new(name: &str, options: &S3Options) -> Result<S3Provider, EgressError> {
        let invalid = |reason: String| EgressError::InvalidProvider {
            name: name.to_string(),
            reason,
        };
        if options.bucket_name.trim().is_empty() {
            return Err(invalid("bucketName is required".into()));
        }
        if options.use_kms_encryption || options.kms_encryption_key.is_some() {
            return Err(invalid(
                "SSE-KMS encryption (useKmsEncryption) is not supported; use the bucket's default \
                 encryption instead"
                    .into(),
            ));
        }
        if options.aws_profile_name.is_some() || options.aws_profile_path.is_some() {
            return Err(invalid(
                "AWS profile files are not read; give accessKeyId and secretAccessKey, or set \
                 AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the agent's environment"
                    .into(),
            ));
        }
        let credentials = match (&options.access_key_id, &options.secret_access_key) {
            (Some(key), Some(secret)) => Some(Credentials::new(key, secret)),
            (Some(_), None) => {
                return Err(invalid(
                    "accessKeyId is set but secretAccessKey is not; give both".into(),
                ))
            }
            // Anonymous when the environment has none either (a public or policy-open bucket).
            _ => Credentials::from_env(),
        };
        let region = options
            .region_name
            .clone()
            .filter(|r| !r.is_empty())
            .or_else(|| std::env::var("AWS_REGION").ok())
            .unwrap_or_else(|| "us-east-1".to_string());
        let endpoint = match options.endpoint.as_deref().map(str::trim) {
            Some(e) if !e.is_empty() => e.to_string(),
            _ => format!("https://s3.{region}.amazonaws.com"),
        };
        let endpoint = endpoint
            .parse()
            .map_err(|e| invalid(format!("endpoint {endpoint:?} is not a URL: {e}")))?;
        let style = if options.force_path_style {
            UrlStyle::Path
        } else {
            UrlStyle::VirtualHost
        };
        let bucket = Bucket::new(endpoint, style, options.bucket_name.clone(), region)
            .map_err(|e| invalid(format!("endpoint: {e}")))?;
        let part_size = match options.copy_buffer_size {
            None => MIN_PART,
            Some(n) if n < MIN_PART => {
                return Err(invalid(format!(
                    "copyBufferSize is {n} bytes; S3 parts are at least {MIN_PART} (5 MiB)"
                )))
            }
            Some(n) => n.min(MAX_PART),
        };
        let presigned_url_expiry = match options.pre_signed_url_expiry {
            Some(expiry) if !(60..=86_400).contains(&expiry.as_secs()) => {
                return Err(invalid(format!(
                    "preSignedUrlExpiry is {expiry:?}; it must be from 00:01:00 to 1.00:00:00"
                )))
            }
            expiry => expiry,
        };
        // HTTPS with ring's primitives and the system's root certificates; a provider someone
        // else installed for the process first is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| invalid(format!("HTTP client: {e}")))?;
        Ok(S3Provider {
            bucket: Arc::new(bucket),
            credentials: credentials.map(Arc::new),
            part_size: part_size as usize,
            presigned_url_expiry,
            http,
        })
    }

    /// The error of `action`; its reason never carries a pre-signed URL's query (credential,
    /// signature): it goes to the operation's status on the API and to the log.
    fn error(&self, action: &'static str, key: &str, reason: impl ToString) -> EgressError {
        EgressError::S3 {
            action,
            bucket: self.bucket.name().to_string(),
            key: key.to_string(),
            reason: super::redact_url_queries(&reason.to_string()),
        }
    }

    /// Sends a signed request; a non-2xx answer is an error carrying S3's message.
    async fn send(
        &self,
        action: &'static str,
        key: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, EgressError> {
        let response = request
            .send()
            .await
            .map_err(|e| self.error(action, key, super::transport_error(e)))?;
        if response.status().is_success() {
            return Ok(response);
        }
        Err(self.error(action, key, super::answer_error(response).await))
    }

    /// Uploads `input` as object `key`; returns dotnet-monitor's resource id for it.
    pub(super) async fn write(self, key: String, mut input: Input) -> Result<String, EgressError> {
        let credentials = self.credentials.as_deref();
        let mut part = Vec::with_capacity(self.part_size);
        let mut upload: Option<MultipartUpload> = None;
        let result = async {
            loop {
                // Reads until the part is full or the artifact ends.
                let room = (self.part_size - part.len()) as u64;
                (&mut input.reader)
                    .take(room)
                    .read_to_end(&mut part)
                    .await
                    .map_err(|e| self.error("read", &key, e))?;
                if part.len() < self.part_size {
                    break;
                }
                let multipart = match &mut upload {
                    Some(m) => m,
                    None => upload.insert(self.create_multipart(&key).await?),
                };
                let full = std::mem::replace(&mut part, Vec::with_capacity(self.part_size));
                self.upload_part(&key, multipart, full).await?;
            }
            input.end()?;
            match &mut upload {
                None => {
                    let url = self
                        .bucket
                        .put_object(credentials, &key)
                        .sign(SIGNATURE_LIFETIME);
                    self.send("PutObject", &key, self.http.put(url).body(part))
                        .await?;
                }
                Some(multipart) => {
                    if !part.is_empty() {
                        self.upload_part(&key, multipart, part).await?;
                    }
                    let action = self.bucket.complete_multipart_upload(
                        credentials,
                        &key,
                        &multipart.id,
                        multipart.etags.iter().map(String::as_str),
                    );
                    let url = action.sign(SIGNATURE_LIFETIME);
                    let body = action.body();
                    self.send(
                        "CompleteMultipartUpload",
                        &key,
                        self.http.post(url).body(body),
                    )
                    .await?;
                    multipart.completed = true;
                }
            }
            Ok(())
        }
        .await;
        if let Err(error) = result {
            if let Some(multipart) = upload.filter(|m| !m.completed) {
                let url = self
                    .bucket
                    .abort_multipart_upload(credentials, &key, &multipart.id)
                    .sign(SIGNATURE_LIFETIME);
                if let Err(abort) = self
                    .send("AbortMultipartUpload", &key, self.http.delete(url))
                    .await
                {
                    tracing::warn!(error = %abort, "the parts of a failed upload stay in the bucket until its lifecycle rules remove them");
                }
            }
            return Err(error);
        }
        tracing::info!(bucket = self.bucket.name(), %key, "artifact uploaded");
        Ok(match self.presigned_url_expiry {
            Some(expiry) => self
                .bucket
                .get_object(credentials, &key)
                .sign(expiry)
                .to_string(),
            None => format!("BucketName={}, Key={key}", self.bucket.name()),
        })
    }

    async fn create_multipart(&self, key: &str) -> Result<MultipartUpload, EgressError> {
        let url = self
            .bucket
            .create_multipart_upload(self.credentials.as_deref(), key)
            .sign(SIGNATURE_LIFETIME);
        let response = self
            .send("CreateMultipartUpload", key, self.http.post(url))
            .await?;
        let body = response
            .text()
            .await
            .map_err(|e| self.error("CreateMultipartUpload", key, e))?;
        let parsed = CreateMultipartUpload::parse_response(&body)
            .map_err(|e| self.error("CreateMultipartUpload", key, e))?;
        Ok(MultipartUpload {
            id: parsed.upload_id().to_string(),
            etags: Vec::new(),
            completed: false,
        })
    }

    async fn upload_part(
        &self,
        key: &str,
        multipart: &mut MultipartUpload,
        part: Vec<u8>,
    ) -> Result<(), EgressError> {
        let number = u16::try_from(multipart.etags.len() + 1)
            .ok()
            .filter(|&n| n <= MAX_PARTS)
            .ok_or_else(|| {
                self.error(
                    "UploadPart",
                    key,
                    format!("more than {MAX_PARTS} parts: raise copyBufferSize"),
                )
            })?;
        let url = self
            .bucket
            .upload_part(self.credentials.as_deref(), key, number, &multipart.id)
            .sign(SIGNATURE_LIFETIME);
        let response = self
            .send("UploadPart", key, self.http.put(url).body(part))
            .await?;
        let etag = response
            .headers()
            .get(reqwest::header::ETAG)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| self.error("UploadPart", key, "the answer has no ETag"))?;
        multipart.etags.push(etag.to_string());
        Ok(())
    }
}

/// A multipart upload in progress.
struct MultipartUpload {
    id: String,
    /// One per uploaded part, in order.
    etags: Vec<String>,
    completed: bool,
}
