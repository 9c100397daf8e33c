//! Damaged copies of the real fixtures: cut at event boundaries and corrupted at random, the
//! parser must end with a clean error (never a panic) and keep every event before the damage.

use std::path::Path;

use nettrace::{NettraceError, Parser};

/// The first recordings and those of each runtime (`net8/`, `net9/`, …).
fn fixtures() -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let entries = |dir: &Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect()
    };
    let mut all: Vec<_> = entries(&dir)
        .into_iter()
        .flat_map(|p| if p.is_dir() { entries(&p) } else { vec![p] })
        .filter(|p| p.extension().is_some_and(|e| e == "nettrace"))
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .collect();
    all.sort();
    assert!(all.len() >= 6, "fixtures missing");
    all
}

/// Event offsets and the final result of parsing `data` in 64 KiB chunks.
fn parse(data: &[u8]) -> (Vec<u64>, Result<(), NettraceError>) {
    let mut parser = Parser::new();
    let mut offsets = Vec::new();
    for chunk in data.chunks(64 * 1024) {
        if let Err(e) = parser.feed(chunk) {
            return (offsets, Err(e));
        }
        loop {
            match parser.next_event() {
                Ok(Some(event)) => {
                    offsets.push(event.offset);
                    let _ = event.known();
                    let _ = event.decode();
                    let _ = event.stack().map(|s| s.ips().count());
                }
                Ok(None) => break,
                Err(e) => return (offsets, Err(e)),
            }
        }
    }
    let result = parser.finish();
    (offsets, result)
}

#[test]
fn cuts_at_event_boundaries_are_truncation_errors() {
    for (name, data) in fixtures() {
        let (offsets, complete) = parse(&data);
        complete.unwrap_or_else(|e| panic!("{name}: {e}"));
        // At most ~200 cuts per file keep this quick in debug builds.
        let step = (offsets.len() / 200).max(1);
        for &at in offsets.iter().step_by(step) {
            for cut in [at, at + 1] {
                let (before, result) = parse(&data[..cut as usize]);
                assert!(
                    matches!(result, Err(NettraceError::Truncated { .. })),
                    "{name} cut at {cut}: {result:?}"
                );
                assert_eq!(before[..], offsets[..before.len()], "{name} cut at {cut}");
            }
        }
    }
}

#[test]
fn random_corruption_never_panics() {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for (_, data) in fixtures() {
        for _ in 0..40 {
            let mut damaged = data.clone();
            for _ in 0..1 + next() % 8 {
                let at = (next() % damaged.len() as u64) as usize;
                damaged[at] = next() as u8;
            }
            let _ = parse(&damaged);
        }
    }
}

/// Inputs on which fuzzing once found a panic (see collector/fuzz/README.md); the first byte picks
/// the fuzzer's chunk size, the rest is the stream.
#[test]
fn fuzz_regressions_parse_without_panic() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions/nettrace_parse");
    let mut ran = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let input = std::fs::read(entry.unwrap().path()).unwrap();
        if let Some((_, stream)) = input.split_first() {
            let _ = parse(stream);
            ran += 1;
        }
    }
    assert!(ran > 0);
}
