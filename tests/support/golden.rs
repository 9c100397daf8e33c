//! The golden-file check every test tree of the workspace uses: the root crate's tests through
//! `support`, `exporter`'s through a `#[path]` include of this file. `CARGO_MANIFEST_DIR` is the
//! including crate's, so each compares against its own `tests/golden`.

use std::path::Path;

/// Compares `actual` with `tests/golden/<relative>`, or rewrites that file when the environment
/// has `CLRSCOPE_BLESS=1` (after a deliberate change of output; review the diff before committing
/// it). On a mismatch the output is left beside the golden file, named as it plus `.actual`.
pub fn check_golden(relative: impl AsRef<Path>, actual: &[u8]) {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(relative);
    let mut actual_path = golden.clone().into_os_string();
    actual_path.push(".actual");
    // A leftover from an earlier failure would only mislead.
    let _ = std::fs::remove_file(&actual_path);
    if std::env::var_os("CLRSCOPE_BLESS").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(golden.parent().unwrap()).unwrap();
        std::fs::write(&golden, actual).unwrap();
        return;
    }
    let expected = std::fs::read(&golden).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}; run with CLRSCOPE_BLESS=1 to create it",
            golden.display()
        )
    });
    if expected != actual {
        std::fs::write(&actual_path, actual).unwrap();
        panic!(
            "{} differs from the output (written to {}); if the change is intended, rerun with \
             CLRSCOPE_BLESS=1 and review the diff",
            golden.display(),
            Path::new(&actual_path).display()
        );
    }
}
