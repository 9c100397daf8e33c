//! Every command in README.md runs as written.
//!
//! Each ```sh block of the README is run, in order, as one bash script (`set -eu`: a failing
//! command fails the block; a pipeline counts its last command, as in a terminal) in a
//! scratch folder that has the test bed at `.testbed` and the `clrscope` under test first on
//! `PATH`. A block the README marks with `<!-- readme-test: skip: REASON -->` on the line before
//! its fence (an interactive or long-running one, e.g. `make demo`) is not run; a reason is
//! required. Background jobs a block starts (`&`) are killed with its process group when it ends,
//! and targets exit with their parent shell (`TESTBED_EXIT_WITH_PARENT`). Text in backticks in a
//! command's `#` comment is a claim about what the block prints: the block's output must hold it.
//! Needs `make setup`.

use crate::support;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest a block may run.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(420);
const SKIP_MARKER: &str = "<!-- readme-test: skip:";

struct Block {
    line: usize,
    script: String,
    skip: Option<String>,
}

impl Block {
    /// What the comments claim the block prints: the backticked parts of each line's ` # …`.
    fn claims(&self) -> Vec<&str> {
        self.script
            .lines()
            .filter_map(|line| line.split_once(" # ").map(|(_, comment)| comment))
            .flat_map(|comment| comment.split('`').skip(1).step_by(2))
            .filter(|claim| !claim.is_empty())
            .collect()
    }
}

/// The ```sh blocks of `markdown`, each with the reason it is skipped, if it is.
fn shell_blocks(markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut lines = markdown.lines().enumerate().peekable();
    let mut previous = "";
    while let Some((number, line)) = lines.next() {
        let fence = line.trim_start();
        if let Some(info) = fence.strip_prefix("```") {
            let mut script = String::new();
            for (_, body) in lines.by_ref() {
                if body.trim_start().starts_with("```") {
                    break;
                }
                script.push_str(body);
                script.push('\n');
            }
            if info.trim() == "sh" {
                let skip = previous
                    .trim()
                    .strip_prefix(SKIP_MARKER)
                    .map(|rest| rest.trim_end_matches("-->").trim().to_string());
                if let Some(reason) = &skip {
                    assert!(
                        !reason.is_empty(),
                        "README.md:{}: a skipped block needs a reason",
                        number + 1
                    );
                }
                blocks.push(Block {
                    line: number + 1,
                    script,
                    skip,
                });
            }
            previous = "";
            continue;
        }
        if !line.trim().is_empty() {
            previous = line;
        }
    }
    blocks
}

/// Kills the process group `pgid` (the block's shell and everything it started).
fn kill_group(pgid: u32) {
    unsafe {
        support::sys::kill(-(pgid as i32), 15);
    }
    std::thread::sleep(Duration::from_millis(300));
    unsafe {
        support::sys::kill(-(pgid as i32), 9);
    }
}

fn run_block(block: &Block, dir: &Path, path_var: &str) {
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(format!("set -eu\n{}", block.script))
        .current_dir(dir)
        .env("PATH", path_var)
        .env("TESTBED_EXIT_WITH_PARENT", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("start bash");
    let pgid = child.id();
    // Read both pipes on threads, so a chatty block never blocks on a full pipe.
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut s).ok();
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = Vec::new();
        std::io::Read::read_to_end(&mut stderr, &mut s).ok();
        s
    });
    let deadline = Instant::now() + BLOCK_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // Background jobs keep the pipes open: end them before reading to the end.
    kill_group(pgid);
    let _ = child.wait();
    let stdout = String::from_utf8_lossy(&out.join().unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&err.join().unwrap()).into_owned();
    let report = format!(
        "README.md:{}: the block\n{}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        block.line, block.script
    );
    match status {
        None => panic!("{report}\ndid not finish within {BLOCK_TIMEOUT:?}"),
        Some(status) if !status.success() => panic!("{report}\nfailed: {status}"),
        Some(_) => {}
    }
    for claim in block.claims() {
        assert!(
            stdout.contains(claim) || stderr.contains(claim),
            "{report}\nthe README says it prints `{claim}`; it did not"
        );
    }
    eprintln!("README.md:{}: ok", block.line);
}

#[test]
fn every_readme_command_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let blocks = shell_blocks(&readme);
    let runnable = blocks.iter().filter(|b| b.skip.is_none()).count();
    assert!(runnable >= 2, "README.md has {runnable} runnable sh blocks");
    support::dotnet_host(); // the blocks use the test bed: say so early if it is missing

    let dir = support::ScratchDir::new("readme");
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(support::testbed_dir(), dir.join(".testbed")).unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_clrscope")).parent().unwrap();
    let path_var = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for block in &blocks {
        match &block.skip {
            Some(reason) => eprintln!("README.md:{}: skipped ({reason})", block.line),
            None => run_block(block, &dir, &path_var),
        }
    }
}

#[test]
fn backticks_in_comments_are_claims() {
    let block = Block {
        line: 1,
        script: "go tool pprof -top x | head   # `File: A.dll`, then `B`\nls # none\n".into(),
        skip: None,
    };
    assert_eq!(block.claims(), ["File: A.dll", "B"]);
}
