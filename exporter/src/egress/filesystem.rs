//! The FileSystem provider: artifacts as files in a folder, within the disk budget.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use profile::artifact::ArtifactKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::budget::charge;
use super::{DiskBudget, EgressError, FileSystemOptions, Input};

/// Bytes copied at a time unless `CopyBufferSize` says otherwise (.NET's stream copy default).
const DEFAULT_COPY_BUFFER: usize = 81_920;
/// A larger buffer buys nothing and costs memory per artifact in flight.
const MAX_COPY_BUFFER: usize = 16 << 20;

#[derive(Debug, Clone)]
pub(super) struct FileSystemProvider {
    directory: PathBuf,
    intermediate: Option<PathBuf>,
    copy_buffer: usize,
    budget: DiskBudget,
}

fn create_private_dir(path: &Path) -> Result<(), EgressError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|source| EgressError::Io {
            what: "creating the egress folder",
            path: path.to_path_buf(),
            source,
        })
}

impl FileSystemProvider {
    pub(super) fn new(
        name: &str,
        options: &FileSystemOptions,
        budget: DiskBudget,
    ) -> Result<FileSystemProvider, EgressError> {
        if options.directory_path.as_os_str().is_empty() {
            return Err(EgressError::InvalidProvider {
                name: name.to_string(),
                reason: "DirectoryPath is required".into(),
            });
        }
        let copy_buffer = match options.copy_buffer_size {
            None => DEFAULT_COPY_BUFFER,
            Some(0) => {
                return Err(EgressError::InvalidProvider {
                    name: name.to_string(),
                    reason: "CopyBufferSize must be at least 1".into(),
                })
            }
            Some(n) => usize::try_from(n)
                .unwrap_or(MAX_COPY_BUFFER)
                .min(MAX_COPY_BUFFER),
        };
        budget.adopt_folder(&options.directory_path)?;
        if let Some(dir) = &options.intermediate_directory_path {
            remove_stale_partials(dir);
        }
        Ok(FileSystemProvider {
            directory: options.directory_path.clone(),
            intermediate: options.intermediate_directory_path.clone(),
            copy_buffer,
            budget,
        })
    }

    /// Copies `input` into `<DirectoryPath>/<file_name>` (through a file of its own in
    /// `IntermediateDirectoryPath` when set); returns the final path.
    pub(super) async fn write(
        self,
        file_name: String,
        mut input: Input,
    ) -> Result<String, EgressError> {
        if file_name.contains('/') || file_name.starts_with('.') {
            return Err(EgressError::InvalidProvider {
                name: file_name,
                reason: "an artifact name is a plain file name".into(),
            });
        }
        create_private_dir(&self.directory)?;
        let target = self.directory.join(&file_name);
        let writing = match &self.intermediate {
            Some(dir) => {
                create_private_dir(dir)?;
                dir.join(intermediate_name(&file_name))
            }
            None => target.clone(),
        };
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&writing)
            .map_err(|source| EgressError::Io {
                what: "creating",
                path: writing.clone(),
                source,
            })?;
        let mut partial = Partial {
            path: writing.clone(),
            reserved: 0,
            budget: self.budget.clone(),
        };
        // The file takes a block (and an inode) from its creation on.
        self.budget.reserve(charge(0))?;
        partial.reserved = charge(0);
        let mut file = tokio::fs::File::from_std(file);
        let mut written = 0u64;
        let mut buf = vec![0u8; self.copy_buffer];
        let io = |what, source| EgressError::Io {
            what,
            path: writing.clone(),
            source,
        };
        loop {
            let n = input
                .reader
                .read(&mut buf)
                .await
                .map_err(|e| io("reading the artifact for", e))?;
            if n == 0 {
                break;
            }
            written += n as u64;
            let more = charge(written) - partial.reserved;
            if more > 0 {
                self.budget.reserve(more)?;
                partial.reserved += more;
            }
            file.write_all(&buf[..n])
                .await
                .map_err(|e| io("writing", e))?;
        }
        input.end()?;
        file.flush().await.map_err(|e| io("writing", e))?;
        file.sync_all().await.map_err(|e| io("syncing", e))?;
        drop(file);
        if writing != target {
            std::fs::rename(&writing, &target).map_err(|source| EgressError::Io {
                what: "moving the artifact into the egress folder from",
                path: writing.clone(),
                source,
            })?;
        }
        let bytes = partial.keep();
        self.budget.commit(target.clone(), bytes);
        tracing::info!(path = %target.display(), bytes, "artifact written");
        Ok(target.display().to_string())
    }
}

/// Deletes the partial artifacts an agent that died mid-write left in `dir`.
fn remove_stale_partials(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(artifact) = name
            .strip_suffix(".partial")
            .and_then(|rest| rest.rsplit_once('.'))
            .map(|(artifact, _)| artifact)
        else {
            continue;
        };
        if ArtifactKind::is_artifact_file_name(artifact) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// A unique name in the intermediate folder (dotnet-monitor uses a random file name there).
fn intermediate_name(file_name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "{file_name}.{}-{nanos}-{}.partial",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The file being written: deleted, and its reservation given back, unless kept.
struct Partial {
    path: PathBuf,
    reserved: u64,
    budget: DiskBudget,
}

impl Partial {
    /// The file is complete: returns its bytes, still reserved, for the caller to commit.
    fn keep(mut self) -> u64 {
        self.path = PathBuf::new();
        std::mem::take(&mut self.reserved)
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if self.path.as_os_str().is_empty() {
            return;
        }
        let _ = std::fs::remove_file(&self.path);
        self.budget.release(self.reserved);
    }
}
