//! Core dumps, written by the runtime's own `createdump`.

use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::ArtifactError;
use crate::client::DiagnosticsClient;
use crate::ipc::{CoreDump, DumpType};

/// How long the runtime may take to write a dump unless the caller says otherwise: a full dump
/// of a large process takes minutes.
pub const DEFAULT_DUMP_TIMEOUT: Duration = Duration::from_secs(600);

/// What a dump holds (dotnet-monitor's `DumpType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DumpKind {
    /// Stacks and the modules' data, no heap (small).
    Mini,
    /// Mini plus the GC heaps: enough for heap analysis (dotnet-monitor's default).
    WithHeap,
    /// Mini with personal data removed: paths, strings.
    Triage,
    /// All process memory (as large as the process).
    Full,
}

impl DumpKind {
    pub const ALL: [DumpKind; 4] = [
        DumpKind::Mini,
        DumpKind::WithHeap,
        DumpKind::Triage,
        DumpKind::Full,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DumpKind::Mini => "Mini",
            DumpKind::WithHeap => "WithHeap",
            DumpKind::Triage => "Triage",
            DumpKind::Full => "Full",
        }
    }

    fn dump_type(self) -> DumpType {
        match self {
            DumpKind::Mini => DumpType::Normal,
            DumpKind::WithHeap => DumpType::WithHeap,
            DumpKind::Triage => DumpType::Triage,
            DumpKind::Full => DumpType::Full,
        }
    }
}

impl fmt::Display for DumpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A dump type name that is none of Mini, WithHeap, Triage, Full.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown dump type {0:?}; known: Mini, WithHeap, Triage, Full")]
pub struct UnknownDumpKind(pub String);

impl FromStr for DumpKind {
    type Err = UnknownDumpKind;

    /// Case-insensitive, as dotnet-monitor's enum binding; its numeric values 1–4 too.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let by_number = match s {
            "1" => Some(DumpKind::Full),
            "2" => Some(DumpKind::Mini),
            "3" => Some(DumpKind::WithHeap),
            "4" => Some(DumpKind::Triage),
            _ => None,
        };
        by_number
            .or_else(|| {
                DumpKind::ALL
                    .into_iter()
                    .find(|k| k.name().eq_ignore_ascii_case(s))
            })
            .ok_or_else(|| UnknownDumpKind(s.to_string()))
    }
}

impl<'de> Deserialize<'de> for DumpKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Asks the runtime behind `client` to write a `kind` dump at `path`, as the target sees it (in
/// its container, if it runs in one); the process is suspended meanwhile. The file is made 0600
/// when it is reachable from here: a dump holds the process's secrets.
pub async fn write_dump(
    client: &DiagnosticsClient,
    path: &Path,
    kind: DumpKind,
    timeout: Duration,
) -> Result<(), ArtifactError> {
    let path = std::path::absolute(path).map_err(|source| ArtifactError::File {
        what: "resolving",
        path: path.to_path_buf(),
        source,
    })?;
    let Some(text) = path.to_str() else {
        return Err(ArtifactError::File {
            what: "naming",
            path: path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not valid UTF-8"),
        });
    };
    client
        .write_dump(CoreDump::new(text, kind.dump_type()), timeout)
        .await
        .map_err(ArtifactError::Dump)?;
    // createdump writes with the target's umask.
    let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
    Ok(())
}

/// Removes the temporary dump however [`collect_dump`] ends (cancelled included).
struct TemporaryFile(PathBuf);

impl Drop for TemporaryFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Has the runtime write a `kind` dump into `temp_dir` (a folder the target and clrscope both
/// see, which the target's user may write), copies it into `out` and removes it; returns the
/// bytes copied.
pub async fn collect_dump<W: AsyncWrite + Unpin>(
    client: &DiagnosticsClient,
    kind: DumpKind,
    temp_dir: &Path,
    timeout: Duration,
    out: &mut W,
) -> Result<u64, ArtifactError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let name = format!(
        "clrscope-dump-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let temporary = TemporaryFile(temp_dir.join(name));
    write_dump(client, &temporary.0, kind, timeout).await?;
    let mut file = match tokio::fs::File::open(&temporary.0).await {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ArtifactError::DumpNotVisible {
                path: temporary.0.clone(),
            })
        }
        Err(source) => {
            return Err(ArtifactError::File {
                what: "opening the dump",
                path: temporary.0.clone(),
                source,
            })
        }
    };
    let bytes = tokio::io::copy(&mut file, out)
        .await
        .map_err(|source| ArtifactError::Write { bytes: 0, source })?;
    out.flush()
        .await
        .map_err(|source| ArtifactError::Write { bytes, source })?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_like_dotnet_monitor() {
        assert_eq!("withheap".parse(), Ok(DumpKind::WithHeap));
        assert_eq!("Mini".parse(), Ok(DumpKind::Mini));
        assert_eq!("4".parse(), Ok(DumpKind::Triage));
        assert!("Huge".parse::<DumpKind>().is_err());
    }
}
