//! Microsoft's own diagnostics tools and libraries, installed by `make setup` into the test bed: the
//! dotnet tools `dotnet-trace`, `dotnet-counters` and `dotnet-gcdump` (`testbed_dir()/tools`) and the
//! TraceEvent reader built from `tests/peers/TraceEventReader` (`testbed_dir()/peers`). The suite
//! compares clrscope with what they write and read (tests/suite/peers.rs).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use super::{dotnet_host, testbed_dir};

/// `dotnet-trace`, `dotnet-counters` or `dotnet-gcdump` of the test bed, run on the test bed's own
/// runtimes (its apphost finds them through `DOTNET_ROOT`). Panics with "run `make setup`" if missing.
pub fn dotnet_tool(name: &str) -> Command {
    let tool = testbed_dir().join("tools").join(name);
    assert!(
        tool.exists(),
        "no {} (Microsoft's diagnostics tools are not installed): run `make setup` first",
        tool.display()
    );
    let mut command = Command::new(tool);
    command
        .env("DOTNET_ROOT", testbed_dir().join("dotnet"))
        .env("DOTNET_CLI_TELEMETRY_OPTOUT", "1")
        .env("DOTNET_NOLOGO", "1");
    command
}

fn reader_dll() -> PathBuf {
    let dll = testbed_dir().join("peers/TraceEventReader/TraceEventReader.dll");
    assert!(
        dll.exists(),
        "no {} (the TraceEvent reader is not built): run `make setup` first",
        dll.display()
    );
    dll
}

/// What TraceEvent reads from `file`: `events` (per provider and event id: name, count, payload
/// field names) or `cpu` (managed-code samples through TraceLog's stack source: per function,
/// inclusive and exclusive counts). Panics with the reader's stderr if it fails.
pub fn trace_event(mode: &str, file: &Path) -> Value {
    let output = trace_event_command()
        .arg(mode)
        .arg(file)
        .output()
        .expect("run the TraceEvent reader");
    json_of("TraceEventReader", &output)
}

/// The TraceEvent reader's command, for arguments beyond [`trace_event`]'s (a time window, a fold
/// pattern: see tests/peers/TraceEventReader/Program.cs).
pub fn trace_event_command() -> Command {
    let mut command = Command::new(dotnet_host());
    command.arg(reader_dll());
    command
}

/// dotnet-gcdump's own assembly in the test bed's tool store: it compiles in PerfView's heap graph
/// (`GCHeapDump`, `MemoryGraph`), the reader of `.gcdump` files that TraceEvent's package lacks.
pub fn dotnet_gcdump_dll() -> PathBuf {
    let store = testbed_dir().join("tools/.store/dotnet-gcdump");
    let found = walk(&store, "dotnet-gcdump.dll");
    found.unwrap_or_else(|| {
        panic!(
            "no dotnet-gcdump.dll under {}: run `make setup` first",
            store.display()
        )
    })
}

fn walk(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = walk(&path, name) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|n| n == name) {
            return Some(path);
        }
    }
    None
}

/// What PerfView's reader (through the TraceEvent reader's `gcdump` mode) reads from a `.gcdump`:
/// per type name `count`, `bytes`, `min_size`, `max_size`; `objects`, `bytes`, `pseudo_nodes`.
pub fn perfview_gcdump(file: &Path) -> Value {
    let output = trace_event_command()
        .arg("gcdump")
        .arg(file)
        .arg(dotnet_gcdump_dll())
        .output()
        .expect("run the TraceEvent reader");
    json_of("TraceEventReader gcdump", &output)
}

/// The JSON a peer printed; panics with its stderr unless it exited 0.
pub fn json_of(what: &str, output: &Output) -> Value {
    assert!(
        output.status.success(),
        "{what} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{what} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}
