//! The disk budget of the artifacts written to FileSystem providers: bytes are reserved before
//! they are written, and the oldest artifacts are deleted to make room, so the artifacts (those
//! being written included) never take more than the budget. Each file is charged what it takes
//! on disk ([`charge`]: whole blocks, at least one), so that many small files cannot fill a disk
//! the budget says is nearly empty.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use profile::artifact::ArtifactKind;

use super::EgressError;

/// The unit files take on disk (ext4's and XFS's usual block): a file is charged whole blocks.
pub const FILE_BLOCK_BYTES: u64 = 4096;

/// What a file of `bytes` is charged: rounded up to whole [`FILE_BLOCK_BYTES`], at least one
/// block (an empty file still takes an inode and a directory entry).
pub fn charge(bytes: u64) -> u64 {
    bytes
        .div_ceil(FILE_BLOCK_BYTES)
        .max(1)
        .saturating_mul(FILE_BLOCK_BYTES)
}

/// Shared by every FileSystem provider; cloning shares.
#[derive(Debug, Clone)]
pub struct DiskBudget {
    inner: Arc<Mutex<Ledger>>,
}

#[derive(Debug)]
struct Ledger {
    max_bytes: u64,
    /// Bytes charged to the finished artifacts in `files`.
    used: u64,
    /// Bytes promised to artifacts being written.
    reserved: u64,
    /// Finished artifacts, oldest first: (modified, path, bytes charged).
    files: BTreeSet<(SystemTime, PathBuf, u64)>,
}

impl DiskBudget {
    pub fn new(max_bytes: u64) -> DiskBudget {
        DiskBudget {
            inner: Arc::new(Mutex::new(Ledger {
                max_bytes,
                used: 0,
                reserved: 0,
                files: BTreeSet::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Ledger> {
        // Every change below leaves the ledger consistent before anything can panic.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn max_bytes(&self) -> u64 {
        self.lock().max_bytes
    }

    /// Bytes charged to finished artifacts plus those being written.
    pub fn used_bytes(&self) -> u64 {
        let ledger = self.lock();
        ledger.used + ledger.reserved
    }

    /// Counts the artifacts already in `dir` (files named as clrscope and dotnet-monitor name
    /// artifacts; other files are never counted nor deleted), then evicts the oldest if they
    /// exceed the budget. A missing folder holds nothing.
    pub fn adopt_folder(&self, dir: &Path) -> Result<(), EgressError> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => {
                return Err(EgressError::Io {
                    what: "listing",
                    path: dir.to_path_buf(),
                    source,
                })
            }
        };
        let mut ledger = self.lock();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if !ArtifactKind::is_artifact_file_name(name) {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            let charged = charge(meta.len());
            if ledger.files.insert((modified, entry.path(), charged)) {
                ledger.used += charged;
            }
        }
        ledger.make_room(0);
        Ok(())
    }

    /// Promises `bytes` more to an artifact being written, deleting the oldest finished
    /// artifacts as needed; fails when even with none left they would not fit.
    pub fn reserve(&self, bytes: u64) -> Result<(), EgressError> {
        let mut ledger = self.lock();
        if !ledger.make_room(bytes) {
            return Err(EgressError::OverBudget {
                max_bytes: ledger.max_bytes,
                in_flight: ledger.reserved,
            });
        }
        ledger.reserved += bytes;
        Ok(())
    }

    /// Gives back bytes reserved for an artifact that was not kept.
    pub fn release(&self, bytes: u64) {
        let mut ledger = self.lock();
        ledger.reserved = ledger.reserved.saturating_sub(bytes);
    }

    /// Turns `bytes` reserved (the file's [`charge`]) into the finished artifact at `path`.
    pub fn commit(&self, path: PathBuf, bytes: u64) {
        let mut ledger = self.lock();
        ledger.reserved = ledger.reserved.saturating_sub(bytes);
        ledger.used += bytes;
        let modified = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .unwrap_or_else(|_| SystemTime::now());
        ledger.files.insert((modified, path, bytes));
    }
}

impl Ledger {
    /// Deletes the oldest artifacts until `bytes` more fit; false if they cannot.
    fn make_room(&mut self, bytes: u64) -> bool {
        // Beyond what evicting every finished artifact could free: fail without evicting any.
        if self.reserved.saturating_add(bytes) > self.max_bytes {
            return false;
        }
        while self.used + self.reserved + bytes > self.max_bytes {
            let Some((modified, path, size)) = self.files.pop_first() else {
                return false;
            };
            self.used = self.used.saturating_sub(size);
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    tracing::info!(path = %path.display(), bytes = size, "deleted the oldest artifact to stay within the disk budget")
                }
                // Someone else removed it: its bytes are free all the same.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => {
                    // Still counted, so the budget is not overrun; it is tried again later.
                    tracing::warn!(path = %path.display(), %error, "cannot delete an artifact to stay within the disk budget");
                    self.used += size;
                    self.files.insert((modified, path, size));
                    return false;
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn artifact(dir: &Path, seconds: u64, bytes: usize) -> PathBuf {
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000 + seconds);
        let path = dir.join(ArtifactKind::Trace.file_name(1, at));
        std::fs::write(&path, vec![0u8; bytes]).unwrap();
        let file = std::fs::File::options().write(true).open(&path).unwrap();
        file.set_modified(at).unwrap();
        path
    }

    const B: u64 = FILE_BLOCK_BYTES;

    #[test]
    fn files_are_charged_whole_blocks() {
        assert_eq!(charge(0), B);
        assert_eq!(charge(1), B);
        assert_eq!(charge(B), B);
        assert_eq!(charge(B + 1), 2 * B);
    }

    #[test]
    fn oldest_artifacts_make_room_and_others_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let oldest = artifact(dir.path(), 1, 4 * B as usize);
        let middle = artifact(dir.path(), 2, 4 * B as usize);
        let newest = artifact(dir.path(), 3, 100);
        let notes = dir.path().join("notes.txt");
        std::fs::write(&notes, vec![0u8; 50_000]).unwrap();

        let budget = DiskBudget::new(10 * B);
        budget.adopt_folder(dir.path()).unwrap();
        assert_eq!(budget.used_bytes(), 9 * B);
        // 3 blocks more: the oldest goes.
        budget.reserve(3 * B).unwrap();
        assert!(!oldest.exists() && middle.exists() && newest.exists() && notes.exists());
        assert_eq!(budget.used_bytes(), 8 * B);
        // Larger than the budget: refused, nothing reserved.
        assert!(matches!(
            budget.reserve(20 * B),
            Err(EgressError::OverBudget { .. })
        ));
        budget.release(3 * B);
        assert_eq!(budget.used_bytes(), 5 * B);
        // A finished artifact counts, and is evicted in turn.
        budget.reserve(5 * B).unwrap();
        let fresh = artifact(dir.path(), 4, 5 * B as usize);
        budget.commit(fresh.clone(), 5 * B);
        budget.reserve(4 * B).unwrap();
        assert!(!middle.exists() && newest.exists() && fresh.exists());
        assert_eq!(budget.used_bytes(), 10 * B);
    }

    #[test]
    fn small_files_are_charged_a_block_each() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<_> = (0..5).map(|i| artifact(dir.path(), i, 10)).collect();
        let budget = DiskBudget::new(3 * B);
        budget.adopt_folder(dir.path()).unwrap();
        // 50 bytes of content, but five files: the two oldest go.
        assert!(!files[0].exists() && !files[1].exists() && files[2].exists());
        assert_eq!(budget.used_bytes(), 3 * B);
    }

    #[test]
    fn a_folder_over_budget_is_trimmed_when_adopted() {
        let dir = tempfile::tempdir().unwrap();
        let old = artifact(dir.path(), 1, 7 * B as usize);
        let new = artifact(dir.path(), 2, 7 * B as usize);
        let budget = DiskBudget::new(10 * B);
        budget.adopt_folder(dir.path()).unwrap();
        assert!(!old.exists() && new.exists());
        assert_eq!(budget.used_bytes(), 7 * B);
    }
}
