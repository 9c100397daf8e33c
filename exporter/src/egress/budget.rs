//! The disk budget of the artifacts written to FileSystem providers: bytes are reserved before
//! they are written, and the oldest artifacts are deleted to make room, so the artifacts (those
//! being written included) never take more than the budget.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use collector::artifacts::ArtifactKind;

use super::EgressError;

/// Shared by every FileSystem provider; cloning shares.
#[derive(Debug, Clone)]
pub struct DiskBudget {
    inner: Arc<Mutex<Ledger>>,
}

#[derive(Debug)]
struct Ledger {
    max_bytes: u64,
    /// Bytes of the finished artifacts in `files`.
    used: u64,
    /// Bytes promised to artifacts being written.
    reserved: u64,
    /// Finished artifacts, oldest first: (modified, path, bytes).
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

    /// Bytes of finished artifacts plus those being written.
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
            if ledger.files.insert((modified, entry.path(), meta.len())) {
                ledger.used += meta.len();
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

    /// Turns `bytes` reserved into the finished artifact at `path`.
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

    #[test]
    fn oldest_artifacts_make_room_and_others_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let oldest = artifact(dir.path(), 1, 400);
        let middle = artifact(dir.path(), 2, 400);
        let newest = artifact(dir.path(), 3, 100);
        let notes = dir.path().join("notes.txt");
        std::fs::write(&notes, vec![0u8; 5000]).unwrap();

        let budget = DiskBudget::new(1000);
        budget.adopt_folder(dir.path()).unwrap();
        assert_eq!(budget.used_bytes(), 900);
        // 300 more: the oldest goes.
        budget.reserve(300).unwrap();
        assert!(!oldest.exists() && middle.exists() && newest.exists() && notes.exists());
        assert_eq!(budget.used_bytes(), 800);
        // Larger than the budget: refused, nothing reserved.
        assert!(matches!(
            budget.reserve(2000),
            Err(EgressError::OverBudget { .. })
        ));
        budget.release(300);
        assert_eq!(budget.used_bytes(), 500);
        // A finished artifact counts, and is evicted in turn.
        budget.reserve(500).unwrap();
        let fresh = artifact(dir.path(), 4, 500);
        budget.commit(fresh.clone(), 500);
        budget.reserve(400).unwrap();
        assert!(!middle.exists() && newest.exists() && fresh.exists());
        assert_eq!(budget.used_bytes(), 1000);
    }

    #[test]
    fn a_folder_over_budget_is_trimmed_when_adopted() {
        let dir = tempfile::tempdir().unwrap();
        let old = artifact(dir.path(), 1, 700);
        let new = artifact(dir.path(), 2, 700);
        let budget = DiskBudget::new(1000);
        budget.adopt_folder(dir.path()).unwrap();
        assert!(!old.exists() && new.exists());
        assert_eq!(budget.used_bytes(), 700);
    }
}
