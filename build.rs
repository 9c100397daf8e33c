//! Stamps the `clrscope` binary with the git revision it was built from, for `clrscope --version`,
//! as `BUILD_REVISION` (not `CLRSCOPE_…`: cargo passes it to the processes tests run, and the
//! agent reads `CLRSCOPE_…` variables as its configuration).
//!
//! The revision is `$GIT_REVISION` when set (a container build, which has no `.git`, passes
//! it in), else `git rev-parse` of the source tree, else "unknown revision" (a source tarball, or
//! no git installed): the build never fails for want of git.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=GIT_REVISION");
    let revision = match std::env::var("GIT_REVISION") {
        Ok(given) if !given.trim().is_empty() => format!("git {}", given.trim()),
        _ => git_revision().map_or_else(|| "unknown revision".to_string(), |r| format!("git {r}")),
    };
    println!("cargo:rustc-env=BUILD_REVISION={revision}");
}

/// The checked-out commit (12 hex digits), asking cargo to build again when it moves.
fn git_revision() -> Option<String> {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let git = |args: &[&str]| -> Option<String> {
        let output = Command::new("git")
            .arg("-C")
            .arg(&manifest_dir)
            .args(args)
            .output()
            .ok()?;
        let text = String::from_utf8(output.stdout).ok()?;
        (output.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
    };
    let revision = git(&["rev-parse", "--short=12", "HEAD"])?;
    // HEAD names the branch; the branch's ref (loose, or packed) names the commit. A worktree has
    // its own HEAD and shares the refs.
    let head = git(&["rev-parse", "--path-format=absolute", "--git-path", "HEAD"]);
    let common = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]);
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    let mut watched: Vec<PathBuf> = head.into_iter().map(PathBuf::from).collect();
    if let Some(common) = common {
        let common = Path::new(&common);
        watched.push(common.join("packed-refs"));
        if let Some(branch) = branch {
            watched.push(common.join(branch));
        }
    }
    for path in watched.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    Some(revision)
}
