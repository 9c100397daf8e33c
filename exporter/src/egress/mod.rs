//! Artifact egress: where traces, dumps, gcdumps and stacks go when they are not streamed back,
//! configured as dotnet-monitor's `Egress` section ([`EgressConfig`]).
//!
//! - `FileSystem`: into `DirectoryPath` (through `IntermediateDirectoryPath` when set), files
//!   0600 and folders 0700, under one [`DiskBudget`] for all such folders: the oldest artifacts
//!   are deleted to make room, so a rule that fires for ever never fills the disk;
//! - `S3Storage`: into a bucket of AWS S3 or an S3-compatible server (multipart upload in
//!   `CopyBufferSize` parts, nothing on disk);
//! - `AzureBlobStorage`: into a container of an Azure Storage account (blocks of `CopyBufferSize`
//!   committed at the end, so nothing is under the blob's name until it is whole; Shared Key or
//!   SAS; a queue message per blob).
//!
//! An artifact is written through an [`Upload`], an [`AsyncWrite`] that
//! [`Artifact::write`](crate::artifacts::Artifact::write) (or any writer of bytes) writes into,
//! then [`Upload::conclude`] keeps it or gives it up (see [`crate::artifacts`]).
//!
//! Dropping an [`Upload`] without finishing it cancels it: the partial file is deleted, the
//! multipart upload aborted.

mod azure;
mod budget;
mod config;
mod filesystem;
mod s3;

pub use budget::DiskBudget;
pub use config::{
    AzureBlobOptions, DiskBudgetOptions, EgressConfig, FileSystemOptions, S3Options,
    DEFAULT_DISK_BUDGET_BYTES,
};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::task::JoinHandle;

/// How many bytes may wait between the collector and the provider: enough to keep both busy.
const PIPE_BYTES: usize = 256 * 1024;

/// `text` with the query string of every http(s) URL in it replaced by `?<redacted>`: a
/// pre-signed S3 URL carries its access key id, signature and expiry there, and an error's
/// message ends up in API answers and logs.
fn redact_url_queries(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = ["http://", "https://"]
        .iter()
        .filter_map(|scheme| rest.find(scheme))
        .min()
    {
        out.push_str(&rest[..start]);
        let url = &rest[start..];
        let end = url
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | ')'))
            .unwrap_or(url.len());
        match url[..end].find('?') {
            Some(query) => {
                out.push_str(&url[..query]);
                out.push_str("?<redacted>");
            }
            None => out.push_str(&url[..end]),
        }
        rest = &url[end..];
    }
    out.push_str(rest);
    out
}

/// How much of an error answer without a `<Message>` (a proxy's page, say) is kept.
const MAX_ERROR_BODY: usize = 512;

/// A storage service's error answer as an error's text: its status and [`error_message`].
async fn answer_error(response: reqwest::Response) -> String {
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    format!("HTTP {status}: {}", error_message(&body))
}

/// The message of an S3 or Azure Storage error answer (XML with a `<Message>`), else the start of
/// the answer.
fn error_message(body: &str) -> &str {
    body.split("<Message>")
        .nth(1)
        .and_then(|rest| rest.split("</Message>").next())
        .unwrap_or_else(|| {
            let text = body.trim();
            let mut end = text.len().min(MAX_ERROR_BODY);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            &text[..end]
        })
}

/// A request that got no answer, with its causes ("error sending request: client error
/// (Connect): tcp connect error: Connection refused"), without the URL reqwest's message names,
/// query string and all.
fn transport_error(error: reqwest::Error) -> String {
    crate::error_chain(&error.without_url())
}

/// Where an artifact comes from: what an Azure blob's metadata says of it (dotnet-monitor's
/// `DotnetMonitor_*` keys and the provider's `Metadata`, read from the target's environment).
#[derive(Debug, Clone, Default)]
pub struct ArtifactOrigin {
    pub pid: u64,
    /// The runtime instance cookie (the API's `uid`), when known.
    pub runtime_cookie: Option<String>,
    /// The collection rule action that collected it.
    pub rule: Option<RuleActionOrigin>,
    /// The target's environment variables, read only when the provider needs them
    /// ([`Egress::needs_environment`]).
    pub environment: Vec<(String, String)>,
}

/// A collection rule action, by rule name, index in its action list, and action name.
#[derive(Debug, Clone)]
pub struct RuleActionOrigin {
    pub rule: String,
    pub action_index: usize,
    pub action: String,
}

/// Why an artifact could not be egressed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EgressError {
    #[error("no egress provider named {name:?}; configured: {known}")]
    UnknownProvider { name: String, known: String },
    #[error("egress provider {name:?}: {reason}")]
    InvalidProvider { name: String, reason: String },
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the artifact does not fit the disk budget of {max_bytes} bytes ({in_flight} bytes are \
         being written by other artifacts); raise Egress:DiskBudget:MaxBytes or egress large \
         artifacts to S3"
    )]
    OverBudget { max_bytes: u64, in_flight: u64 },
    #[error("S3 {action} of {key:?} in bucket {bucket:?}: {reason}")]
    S3 {
        action: &'static str,
        bucket: String,
        key: String,
        reason: String,
    },
    #[error("Azure Blob Storage {action} of {blob:?}: {reason}")]
    AzureBlob {
        action: &'static str,
        /// `<container>/<blob name>`.
        blob: String,
        reason: String,
    },
    #[error("the upload was cancelled")]
    Cancelled,
    /// The artifact had no bytes: nothing was collected, and nothing is written (empty files
    /// would only fill the egress folder).
    #[error("nothing was collected (an empty artifact), so no artifact was written")]
    Empty,
    #[error("the upload task failed: {0}")]
    Task(String),
    /// The artifact could not be collected (the upload was given up).
    #[error(transparent)]
    Artifact(Box<dyn std::error::Error + Send + Sync>),
}

/// A configured provider.
#[derive(Debug)]
enum Provider {
    FileSystem(filesystem::FileSystemProvider),
    S3(s3::S3Provider),
    AzureBlob(Box<azure::AzureBlobProvider>),
}

/// The configured providers by name, and the FileSystem providers' disk budget. Cloning shares.
#[derive(Debug, Clone)]
pub struct Egress {
    providers: Arc<BTreeMap<String, Provider>>,
    budget: DiskBudget,
}

/// No providers, the default disk budget.
impl Default for Egress {
    fn default() -> Self {
        Egress {
            providers: Arc::new(BTreeMap::new()),
            budget: DiskBudget::new(DEFAULT_DISK_BUDGET_BYTES),
        }
    }
}

impl Egress {
    /// Checks every provider's settings and counts the artifacts already in the FileSystem
    /// providers' folders against the budget (deleting the oldest if they exceed it).
    pub fn new(config: &EgressConfig) -> Result<Egress, EgressError> {
        let budget = DiskBudget::new(config.disk_budget.max_bytes);
        let mut providers = BTreeMap::new();
        for (name, options) in &config.file_system {
            let provider = filesystem::FileSystemProvider::new(name, options, budget.clone())?;
            providers.insert(name.clone(), Provider::FileSystem(provider));
        }
        let mut add = |name: &String, provider: Provider| {
            if providers.contains_key(name) {
                return Err(EgressError::InvalidProvider {
                    name: name.clone(),
                    reason: "the name is used by another provider too; names must be unique".into(),
                });
            }
            providers.insert(name.clone(), provider);
            Ok(())
        };
        for (name, options) in &config.s3_storage {
            add(name, Provider::S3(s3::S3Provider::new(name, options)?))?;
        }
        for (name, options) in &config.azure_blob_storage {
            let provider = azure::AzureBlobProvider::new(name, options, &config.properties)?;
            add(name, Provider::AzureBlob(Box::new(provider)))?;
        }
        Ok(Egress {
            providers: Arc::new(providers),
            budget,
        })
    }

    pub fn budget(&self) -> &DiskBudget {
        &self.budget
    }

    pub fn provider_names(&self) -> impl Iterator<Item = &str> {
        self.providers.keys().map(String::as_str)
    }

    /// Whether `provider` is configured; the error names the ones that are.
    pub fn check(&self, provider: &str) -> Result<(), EgressError> {
        if self.providers.contains_key(provider) {
            return Ok(());
        }
        let known: Vec<&str> = self.provider_names().collect();
        Err(EgressError::UnknownProvider {
            name: provider.to_string(),
            known: if known.is_empty() {
                "none (add Egress:FileSystem:<name>:DirectoryPath, Egress:S3Storage:<name> or \
                 Egress:AzureBlobStorage:<name> to settings.json)"
                    .to_string()
            } else {
                known.join(", ")
            },
        })
    }

    /// Whether `provider` writes the target's environment into what it stores (an Azure Blob
    /// provider with `Metadata`): then the caller reads it into [`ArtifactOrigin::environment`].
    pub fn needs_environment(&self, provider: &str) -> bool {
        matches!(self.providers.get(provider), Some(Provider::AzureBlob(p)) if p.needs_environment())
    }

    /// Starts writing the artifact `file_name`, collected from `origin`, to provider `provider`.
    pub fn start(
        &self,
        provider: &str,
        file_name: &str,
        origin: &ArtifactOrigin,
    ) -> Result<Upload, EgressError> {
        self.check(provider)?;
        let target = &self.providers[provider];
        let (writer, reader) = tokio::io::duplex(PIPE_BYTES);
        let cancelled = Arc::new(AtomicBool::new(false));
        let input = Input {
            reader,
            cancelled: cancelled.clone(),
        };
        let task = match target {
            Provider::FileSystem(p) => tokio::spawn(p.clone().write(file_name.to_string(), input)),
            Provider::S3(p) => tokio::spawn(p.clone().write(file_name.to_string(), input)),
            Provider::AzureBlob(p) => {
                let metadata = p.metadata(origin);
                tokio::spawn((**p).clone().write(file_name.to_string(), metadata, input))
            }
        };
        Ok(Upload {
            writer: Some(writer),
            cancelled,
            task: Some(task),
            written: 0,
        })
    }
}

/// What a provider reads the artifact from: the bytes, and whether the writer gave up.
struct Input {
    reader: DuplexStream,
    cancelled: Arc<AtomicBool>,
}

impl Input {
    /// The end of the artifact: `Ok` if the writer finished it, `Cancelled` if it gave up.
    fn end(&self) -> Result<(), EgressError> {
        if self.cancelled.load(Ordering::Acquire) {
            Err(EgressError::Cancelled)
        } else {
            Ok(())
        }
    }
}

/// An artifact being egressed; write it, then [`finish`](Upload::finish) or
/// [`abort`](Upload::abort). Dropped unfinished, it is cancelled.
#[derive(Debug)]
pub struct Upload {
    writer: Option<DuplexStream>,
    cancelled: Arc<AtomicBool>,
    task: Option<JoinHandle<Result<String, EgressError>>>,
    /// Bytes written so far.
    written: u64,
}

impl Upload {
    /// Ends the artifact and waits until the provider has it; returns where it is (a path;
    /// dotnet-monitor's `BucketName=…, Key=…` or a pre-signed URL for S3; the blob's URL).
    /// An artifact with no bytes is given up: [`EgressError::Empty`].
    pub async fn finish(mut self) -> Result<String, EgressError> {
        if self.written == 0 {
            self.abort().await?;
            return Err(EgressError::Empty);
        }
        if let Some(mut writer) = self.writer.take() {
            // A provider that failed has closed its end; its own error says why.
            let _ = writer.shutdown().await;
        }
        self.join().await
    }

    /// Finishes the upload if its artifact was `written` whole, else gives it up (nothing partial
    /// stays). Returns where the artifact is, or why it is not there: the upload's own failure
    /// (e.g. over the disk budget) explains a failed write best.
    pub async fn conclude<E>(self, written: Result<(), E>) -> Result<String, EgressError>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        match written {
            Ok(()) => self.finish().await,
            Err(error) => Err(match self.abort().await {
                Err(egress) => egress,
                Ok(()) => EgressError::Artifact(Box::new(error)),
            }),
        }
    }

    /// Gives the artifact up (the partial file is deleted, the multipart upload aborted). Returns
    /// the provider's own error if it had failed before, which explains a failed write best.
    pub async fn abort(mut self) -> Result<(), EgressError> {
        self.cancelled.store(true, Ordering::Release);
        self.writer = None;
        match self.join().await {
            Ok(_) | Err(EgressError::Cancelled) => Ok(()),
            Err(error) => Err(error),
        }
    }

    async fn join(&mut self) -> Result<String, EgressError> {
        let task = self.task.take().expect("an upload is joined once");
        task.await
            .map_err(|e| EgressError::Task(e.to_string()))
            .and_then(|result| result)
    }

    fn writer(&mut self) -> std::io::Result<&mut DuplexStream> {
        self.writer.as_mut().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the upload has ended")
        })
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        if self.task.is_some() {
            // The provider sees the end of the input with the flag set, and cleans up.
            self.cancelled.store(true, Ordering::Release);
        }
    }
}

impl AsyncWrite for Upload {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let written = match self.writer() {
            Ok(writer) => Pin::new(writer).poll_write(cx, buf),
            Err(e) => return Poll::Ready(Err(e)),
        };
        if let Poll::Ready(Ok(n)) = written {
            self.written += n as u64;
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.writer() {
            Ok(writer) => Pin::new(writer).poll_flush(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.writer() {
            Ok(writer) => Pin::new(writer).poll_shutdown(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn folder_egress(dir: &std::path::Path, max_bytes: u64) -> Egress {
        let config: EgressConfig = serde_json::from_value(serde_json::json!({
            "FileSystem": {"local": {
                "DirectoryPath": dir.join("out"),
                "IntermediateDirectoryPath": dir.join("partial"),
                "CopyBufferSize": 1000,
            }},
            "DiskBudget": {"MaxBytes": max_bytes},
        }))
        .unwrap();
        Egress::new(&config).unwrap()
    }

    fn name(seconds: u64) -> String {
        profile::artifact::ArtifactKind::Trace
            .file_name(7, UNIX_EPOCH + Duration::from_secs(1_700_000_000 + seconds))
    }

    fn files(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    #[tokio::test]
    async fn folder_uploads_finish_abort_and_keep_to_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        // Files are charged whole 4 KiB blocks: 6000 bytes take 8192.
        let egress = folder_egress(dir.path(), 20_000);

        let mut upload = egress
            .start("local", &name(1), &ArtifactOrigin::default())
            .unwrap();
        upload.write_all(&[1u8; 6000]).await.unwrap();
        let location = upload.finish().await.unwrap();
        assert_eq!(std::fs::read(&location).unwrap(), vec![1u8; 6000]);
        assert_eq!(files(&dir.path().join("out")), [name(1)]);

        // Given up: nothing stays, in either folder.
        let mut upload = egress
            .start("local", &name(2), &ArtifactOrigin::default())
            .unwrap();
        upload.write_all(&[2u8; 3000]).await.unwrap();
        upload.abort().await.unwrap();
        assert_eq!(files(&dir.path().join("out")), [name(1)]);
        assert!(files(&dir.path().join("partial")).is_empty());
        assert_eq!(egress.budget().used_bytes(), 8192);

        // Nothing written: no file, and the upload says nothing was collected.
        let upload = egress
            .start("local", &name(7), &ArtifactOrigin::default())
            .unwrap();
        assert!(matches!(upload.finish().await, Err(EgressError::Empty)));
        assert_eq!(files(&dir.path().join("out")), [name(1)]);
        assert!(files(&dir.path().join("partial")).is_empty());
        assert_eq!(egress.budget().used_bytes(), 8192);

        // Dropped unfinished: cancelled too.
        let mut upload = egress
            .start("local", &name(3), &ArtifactOrigin::default())
            .unwrap();
        upload.write_all(&[3u8; 100]).await.unwrap();
        drop(upload);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(files(&dir.path().join("partial")).is_empty());

        // 12000 more (12288 charged) do not fit beside the first: it is evicted.
        let mut upload = egress
            .start("local", &name(4), &ArtifactOrigin::default())
            .unwrap();
        upload.write_all(&[4u8; 12_000]).await.unwrap();
        upload.finish().await.unwrap();
        assert_eq!(files(&dir.path().join("out")), [name(4)]);

        // Larger than the whole budget: the writer is cut off, the upload says why.
        let mut upload = egress
            .start("local", &name(5), &ArtifactOrigin::default())
            .unwrap();
        let written = upload.write_all(&[5u8; 30_000]).await;
        let error = match written {
            Ok(()) => upload.finish().await.unwrap_err(),
            Err(_) => upload.abort().await.unwrap_err(),
        };
        assert!(matches!(error, EgressError::OverBudget { .. }), "{error}");
        assert!(files(&dir.path().join("partial")).is_empty());
        assert!(egress.budget().used_bytes() <= 20_000);

        assert!(matches!(
            egress.start("elsewhere", &name(6), &ArtifactOrigin::default()),
            Err(EgressError::UnknownProvider { .. })
        ));
    }

    #[test]
    fn url_queries_are_redacted() {
        let presigned = "error sending request for url (http://127.0.0.1:9/b/k.gcdump?\
                         X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAEXAMPLE%2F20250101\
                         &X-Amz-Signature=abc123): refused; see https://docs.example/x";
        assert_eq!(
            redact_url_queries(presigned),
            "error sending request for url (http://127.0.0.1:9/b/k.gcdump?<redacted>): refused; \
             see https://docs.example/x"
        );
        assert_eq!(redact_url_queries("no url here"), "no url here");
        assert_eq!(
            redact_url_queries("'https://h/p?q=1' and http://h2?x"),
            "'https://h/p?<redacted>' and http://h2?<redacted>"
        );
    }
}
