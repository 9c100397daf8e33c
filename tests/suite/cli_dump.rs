//! `clrscope dump` against a real .NET 8 process: core files `readelf` accepts, of each kind.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use support::Target;

#[test]
fn mini_and_full_dumps_are_core_files_of_their_kind() {
    let target = Target::builder("Alloc").start();
    let dir = std::env::temp_dir().join(format!("clrscope-dump-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pid = target.pid().to_string();
    let mut sizes = Vec::new();
    for kind in ["mini", "full"] {
        let file = dir.join(format!("{kind}.core"));
        let output = Command::new(env!("CARGO_BIN_EXE_clrscope"))
            .args(["dump", "--pid", &pid, "--type", kind, "-o"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(output.status.success(), "{kind}: {output:?}");
        let header = Command::new("readelf")
            .arg("-h")
            .arg(&file)
            .output()
            .unwrap();
        assert!(header.status.success(), "{kind}: {header:?}");
        let text = String::from_utf8_lossy(&header.stdout);
        assert!(text.contains("CORE (Core file)"), "{kind}: {text}");
        let meta = std::fs::metadata(&file).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{kind}");
        sizes.push(meta.len());
    }
    // A full dump holds all memory, including the ~10 MB of objects Alloc keeps alive; a mini
    // dump leaves the heap out.
    assert!(
        sizes[1] > sizes[0] + 10_000_000,
        "mini {} B, full {} B",
        sizes[0],
        sizes[1]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
