//! The workspace's crate graph keeps its shape (issue 48): each crate depends only on the
//! workspace crates its row allows, and no crate holds more than 30 % of the production lines.
//! What does not hold yet is listed as a known exception, which the test also checks is still
//! true, so an exception fixed must leave the list and a new violation fails.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Each workspace crate and the workspace crates it may depend on (normal dependencies; tests
/// may use any). The model leaf (`profile`) and the settings parsers depend on none;
/// `nettrace` and `ipc`, once split out of `collector`, on the model leaf only.
const ALLOWED: &[(&str, &[&str])] = &[
    ("profile", &[]),
    ("settings", &[]),
    ("nettrace", &["profile"]),
    ("ipc", &["profile"]),
    ("collector", &["profile", "settings", "nettrace", "ipc"]),
    ("symbolizer", &["profile", "collector", "nettrace"]),
    ("store", &["profile"]),
    ("exporter", &["profile", "settings"]),
    (
        "ui",
        &[
            "profile",
            "settings",
            "nettrace",
            "collector",
            "symbolizer",
            "store",
            "exporter",
        ],
    ),
    (
        "clrscope",
        &[
            "profile",
            "settings",
            "nettrace",
            "ipc",
            "collector",
            "symbolizer",
            "store",
            "exporter",
            "ui",
        ],
    ),
];

/// Dependencies the rules forbid that main still has, to be removed.
const KNOWN_EDGES: &[(&str, &str)] = &[];

/// The most of the workspace's production lines one crate may hold.
const MAX_SHARE: f64 = 0.30;
/// Crates over that share today, to be split.
const KNOWN_LARGE: &[&str] = &[];

struct Crate {
    deps: BTreeSet<String>,
    src: PathBuf,
}

/// The workspace's crates from `cargo metadata`: their workspace dependencies and source folder.
fn workspace() -> BTreeMap<String, Crate> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = metadata["packages"].as_array().unwrap();
    let names: BTreeSet<&str> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null() && names.contains(d["name"].as_str().unwrap()))
                .map(|d| d["name"].as_str().unwrap().to_string())
                .collect();
            let manifest = Path::new(p["manifest_path"].as_str().unwrap());
            let src = manifest.parent().unwrap().join("src");
            (p["name"].as_str().unwrap().to_string(), Crate { deps, src })
        })
        .collect()
}

/// Lines of code under `dir`: neither blank nor comments, and not in a file's trailing
/// `#[cfg(test)]` module.
fn production_lines(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut lines = 0;
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            lines += production_lines(&path);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            lines += text
                .lines()
                .map(str::trim)
                .take_while(|l| *l != "#[cfg(test)]")
                .filter(|l| !l.is_empty() && !l.starts_with("//"))
                .count();
        }
    }
    lines
}

#[test]
fn each_crate_depends_only_on_the_crates_its_layer_allows() {
    let crates = workspace();
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut violations = Vec::new();
    for (name, krate) in &crates {
        let Some(allowed) = allowed.get(name.as_str()) else {
            violations.push(format!("{name} is not in ALLOWED: give it a row"));
            continue;
        };
        for dep in &krate.deps {
            let known = KNOWN_EDGES.contains(&(name.as_str(), dep.as_str()));
            if !allowed.contains(&dep.as_str()) && !known {
                violations.push(format!(
                    "{name} depends on {dep}, which its row does not allow"
                ));
            }
        }
    }
    for (from, to) in KNOWN_EDGES {
        if !crates.get(*from).is_some_and(|c| c.deps.contains(*to)) {
            violations.push(format!(
                "{from} no longer depends on {to}: take it off KNOWN_EDGES"
            ));
        }
    }
    assert!(violations.is_empty(), "{violations:#?}");
}

#[test]
fn no_crate_holds_more_than_30_percent_of_the_production_lines() {
    let lines: BTreeMap<String, usize> = workspace()
        .into_iter()
        .map(|(name, krate)| (name, production_lines(&krate.src)))
        .collect();
    let total: usize = lines.values().sum();
    let share = |name: &str| lines[name] as f64 / total as f64;
    let report: Vec<String> = lines
        .iter()
        .map(|(name, n)| format!("{name} {n} ({:.1} %)", 100.0 * share(name)))
        .collect();
    eprintln!("production lines: {total}: {}", report.join(", "));
    let mut violations = Vec::new();
    for name in lines.keys() {
        let known = KNOWN_LARGE.contains(&name.as_str());
        if share(name) > MAX_SHARE && !known {
            violations.push(format!("{name} holds {:.1} %", 100.0 * share(name)));
        }
        if known && share(name) <= MAX_SHARE {
            violations.push(format!(
                "{name} is within the share now: take it off KNOWN_LARGE"
            ));
        }
    }
    assert!(violations.is_empty(), "{violations:#?}");
}
