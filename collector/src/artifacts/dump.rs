//! Core dumps, written by the runtime's own `createdump`.

use std::ffi::CString;
use std::fmt;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::ArtifactError;
use crate::client::{DiagnosticsClient, RuntimeUser};
use ipc::{CoreDump, DumpType};

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

/// How long opening the dump the runtime wrote may take (a hung network file system).
const DUMP_OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long copying a dump out may take: a full dump of a large process to a slow client or
/// bucket takes a while, but a stalled copy must not hold the dump slot for ever.
const DUMP_COPY_TIMEOUT: Duration = Duration::from_secs(3600);
/// The dump's name inside its private directory.
const DUMP_FILE_NAME: &str = "dump";

/// Why a file where the runtime was to write its dump is not trusted as that dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UntrustedDump {
    /// A symbolic link (`O_NOFOLLOW` refused it).
    Link,
    /// A FIFO, socket or device: not something createdump writes.
    NotRegular,
    /// Owned by another user than the runtime's.
    Owner { owner: u32, runtime: u32 },
    /// A hard link to a file with other names.
    HardLinked { links: u64 },
}

impl fmt::Display for UntrustedDump {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UntrustedDump::Link => f.write_str("it is a symbolic link"),
            UntrustedDump::NotRegular => {
                f.write_str("it is not a regular file (a FIFO or device?)")
            }
            UntrustedDump::Owner { owner, runtime } => write!(
                f,
                "it is owned by uid {owner}, not by the runtime's uid {runtime}"
            ),
            UntrustedDump::HardLinked { links } => {
                write!(f, "it has {links} names (a hard link to another file)")
            }
        }
    }
}

/// Opens what should be the dump the runtime wrote, without following a link and without
/// blocking on a FIFO (`dir`: a directory descriptor `name` is relative to, or none for a
/// path), then checks it is a regular file of the runtime's user with one name and makes it
/// 0600 through the descriptor: a dump holds the process's secrets, and createdump writes it
/// with the target's umask. `Ok(None)`: nothing is there (the runtime wrote it in another
/// file system).
fn open_dump(
    dir: Option<&File>,
    path: &Path,
    user: RuntimeUser,
) -> Result<Option<File>, ArtifactError> {
    let flags =
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    let opened = match dir {
        Some(dir) => {
            let name = CString::new(DUMP_FILE_NAME).expect("no NUL in the dump's name");
            // SAFETY: a valid directory descriptor and a NUL-terminated name; the result is a
            // new descriptor we own or -1.
            let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) };
            if fd < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                // SAFETY: `fd` was just opened and is owned by nothing else.
                Ok(unsafe { File::from_raw_fd(fd) })
            }
        }
        None => std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags)
            .open(path),
    };
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(ArtifactError::UntrustedDump {
                path: path.to_path_buf(),
                reason: UntrustedDump::Link,
            })
        }
        Err(source) => {
            return Err(ArtifactError::File {
                what: "opening the dump",
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let meta = file.metadata().map_err(|source| ArtifactError::File {
        what: "examining the dump",
        path: path.to_path_buf(),
        source,
    })?;
    let untrusted = if !meta.file_type().is_file() {
        Some(UntrustedDump::NotRegular)
    } else if meta.uid() != user.uid {
        Some(UntrustedDump::Owner {
            owner: meta.uid(),
            runtime: user.uid,
        })
    } else if meta.nlink() != 1 {
        Some(UntrustedDump::HardLinked {
            links: meta.nlink(),
        })
    } else {
        None
    };
    if let Some(reason) = untrusted {
        return Err(ArtifactError::UntrustedDump {
            path: path.to_path_buf(),
            reason,
        });
    }
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(|source| ArtifactError::File {
            what: "making the dump private",
            path: path.to_path_buf(),
            source,
        })?;
    Ok(Some(file))
}

/// [`open_dump`] off the async threads, bounded by [`DUMP_OPEN_TIMEOUT`].
async fn open_dump_bounded(
    dir: Option<Arc<File>>,
    path: &Path,
    user: RuntimeUser,
) -> Result<Option<File>, ArtifactError> {
    let owned = path.to_path_buf();
    let opening = tokio::task::spawn_blocking(move || open_dump(dir.as_deref(), &owned, user));
    match tokio::time::timeout(DUMP_OPEN_TIMEOUT, opening).await {
        Ok(Ok(result)) => result,
        Ok(Err(join)) => Err(ArtifactError::File {
            what: "opening the dump",
            path: path.to_path_buf(),
            source: std::io::Error::other(join),
        }),
        Err(_) => Err(ArtifactError::File {
            what: "opening the dump",
            path: path.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {DUMP_OPEN_TIMEOUT:?}"),
            ),
        }),
    }
}

fn absolute_text(path: &Path) -> Result<(PathBuf, String), ArtifactError> {
    let path = std::path::absolute(path).map_err(|source| ArtifactError::File {
        what: "resolving",
        path: path.to_path_buf(),
        source,
    })?;
    let Some(text) = path.to_str().map(str::to_string) else {
        return Err(ArtifactError::File {
            what: "naming",
            path,
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not valid UTF-8"),
        });
    };
    Ok((path, text))
}

/// Asks the runtime behind `client` to write a `kind` dump at `path`, as the target sees it (in
/// its container, if it runs in one); the process is suspended meanwhile. When the file is
/// reachable from here it is checked to be the runtime's (see [`open_dump`]) and made 0600;
/// returns its size then, `None` when it is not reachable from here.
pub async fn write_dump(
    client: &DiagnosticsClient,
    path: &Path,
    kind: DumpKind,
    timeout: Duration,
) -> Result<Option<u64>, ArtifactError> {
    let (path, text) = absolute_text(path)?;
    let user = client.runtime_user().await.map_err(ArtifactError::Dump)?;
    client
        .write_dump(CoreDump::new(&text, kind.dump_type()), timeout)
        .await
        .map_err(ArtifactError::Dump)?;
    let file = open_dump_bounded(None, &path, user).await?;
    Ok(file.map(|f| f.metadata().map(|m| m.len()).unwrap_or(0)))
}

/// A directory only the agent and the runtime's user can enter, made for one dump and removed
/// with it however [`collect_dump`] ends (cancelled included). It is created by the agent
/// (`mkdir` fails on anything already there) and then given to the runtime's user so createdump
/// can write in it; the agent keeps a descriptor of it and opens the dump relative to that, so
/// renaming or replacing the directory afterwards cannot redirect what the agent reads.
struct DumpDirectory {
    path: PathBuf,
    dir: Arc<File>,
}

impl DumpDirectory {
    fn create(parent: &Path, user: RuntimeUser) -> Result<DumpDirectory, ArtifactError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let path = parent.join(format!(
            "clrscope-dump-{}-{nanos}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let file_error = |what, source| ArtifactError::File {
            what,
            path: path.clone(),
            source,
        };
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| file_error("creating the dump's directory", e))?;
        let made = (|| {
            let dir = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)?;
            // SAFETY: geteuid cannot fail.
            let me = unsafe { libc::geteuid() };
            let meta = dir.metadata()?;
            if !meta.is_dir() || meta.uid() != me {
                return Err(std::io::Error::other(
                    "replaced after it was created (is the parent directory shared and not sticky?)",
                ));
            }
            // The owner is all that matters in a 0700 directory; a user that is not root
            // could not give it away nor to a group of the target's anyway.
            if user.uid != me {
                std::os::unix::fs::fchown(&dir, Some(user.uid), None)?;
            }
            dir.set_permissions(std::fs::Permissions::from_mode(0o700))?;
            Ok(dir)
        })();
        match made {
            Ok(dir) => Ok(DumpDirectory {
                path,
                dir: Arc::new(dir),
            }),
            Err(e) => {
                let _ = std::fs::remove_dir(&path);
                Err(file_error("preparing the dump's directory", e))
            }
        }
    }

    fn dump_path(&self) -> PathBuf {
        self.path.join(DUMP_FILE_NAME)
    }
}

impl Drop for DumpDirectory {
    fn drop(&mut self) {
        let name = CString::new(DUMP_FILE_NAME).expect("no NUL in the dump's name");
        // SAFETY: a valid directory descriptor and a NUL-terminated name; unlinkat never
        // follows the last component.
        unsafe { libc::unlinkat(self.dir.as_raw_fd(), name.as_ptr(), 0) };
        // rmdir does not follow a link either; it fails if the target left other files in the
        // directory, which then stays (it is the target's own).
        if let Err(error) = std::fs::remove_dir(&self.path) {
            tracing::warn!(path = %self.path.display(), %error, "a dump's directory was left behind");
        }
    }
}

/// Has the runtime write a `kind` dump into a private directory made for it under `temp_dir`
/// (a folder the target and clrscope both see), copies it into `out` and removes it; returns
/// the bytes copied. Only a file that passes [`open_dump`]'s checks is read.
pub async fn collect_dump<W: AsyncWrite + Unpin>(
    client: &DiagnosticsClient,
    kind: DumpKind,
    temp_dir: &Path,
    timeout: Duration,
    out: &mut W,
) -> Result<u64, ArtifactError> {
    let user = client.runtime_user().await.map_err(ArtifactError::Dump)?;
    let (temp_dir, _) = absolute_text(temp_dir)?;
    let directory = DumpDirectory::create(&temp_dir, user)?;
    let path = directory.dump_path();
    let (_, text) = absolute_text(&path)?;
    client
        .write_dump(CoreDump::new(&text, kind.dump_type()), timeout)
        .await
        .map_err(ArtifactError::Dump)?;
    let Some(file) = open_dump_bounded(Some(directory.dir.clone()), &path, user).await? else {
        return Err(ArtifactError::DumpNotVisible { path });
    };
    // Copy the size the runtime wrote, no more: the target owns the file and could keep
    // appending to it.
    let size = file
        .metadata()
        .map_err(|source| ArtifactError::File {
            what: "examining the dump",
            path: path.clone(),
            source,
        })?
        .len();
    let mut source = tokio::fs::File::from_std(file).take(size);
    let copy = async {
        let bytes = tokio::io::copy(&mut source, out)
            .await
            .map_err(|source| ArtifactError::Write { bytes: 0, source })?;
        out.flush()
            .await
            .map_err(|source| ArtifactError::Write { bytes, source })?;
        Ok(bytes)
    };
    tokio::time::timeout(DUMP_COPY_TIMEOUT, copy)
        .await
        .map_err(|_| ArtifactError::Write {
            bytes: 0,
            source: std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the dump was not copied within {DUMP_COPY_TIMEOUT:?}"),
            ),
        })?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(result: Result<Option<File>, ArtifactError>) -> Option<UntrustedDump> {
        match result {
            Err(ArtifactError::UntrustedDump { reason, .. }) => Some(reason),
            _ => None,
        }
    }

    #[test]
    fn only_a_regular_file_of_the_runtimes_user_with_one_name_is_opened() {
        let me = std::fs::metadata("/proc/self").unwrap().uid();
        let user = RuntimeUser { uid: me };
        let parent =
            std::env::temp_dir().join(format!("clrscope-open-dump-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&parent);
        std::fs::create_dir_all(&parent).unwrap();
        let directory = DumpDirectory::create(&parent, user).unwrap();
        let dump = directory.dump_path();
        let open = || open_dump(Some(&directory.dir), &dump, user);
        assert!(open().unwrap().is_none(), "nothing there yet");

        std::fs::write(&dump, b"core").unwrap();
        std::fs::set_permissions(&dump, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(open().unwrap().is_some());
        let mode = std::fs::metadata(&dump).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600, "made private through the descriptor");

        let other_name = parent.join("other-name");
        std::fs::hard_link(&dump, &other_name).unwrap();
        assert_eq!(reason(open()), Some(UntrustedDump::HardLinked { links: 2 }));
        std::fs::remove_file(&other_name).unwrap();

        let stranger = RuntimeUser {
            uid: me.wrapping_add(1),
        };
        assert!(matches!(
            reason(open_dump(Some(&directory.dir), &dump, stranger)),
            Some(UntrustedDump::Owner { .. })
        ));
        std::fs::remove_file(&dump).unwrap();
        std::os::unix::fs::symlink(&other_name, &dump).unwrap();
        assert_eq!(reason(open()), Some(UntrustedDump::Link));

        let path = directory.path.clone();
        drop(directory);
        assert!(!path.exists(), "the directory goes with its dump");
        std::fs::remove_dir_all(&parent).unwrap();
    }

    #[test]
    fn kinds_parse_like_dotnet_monitor() {
        assert_eq!("withheap".parse(), Ok(DumpKind::WithHeap));
        assert_eq!("Mini".parse(), Ok(DumpKind::Mini));
        assert_eq!("4".parse(), Ok(DumpKind::Triage));
        assert!("Huge".parse::<DumpKind>().is_err());
    }
}
