//! `GET /debug/pprof/profile?seconds=N`: the agent's own CPU profile, as Go's net/http/pprof
//! serves it, so that `go tool pprof http://…/debug/pprof/profile` (with the API's token)
//! profiles clrscope like anything else.
//!
//! Sampled by [`sampler`] (`SIGPROF` at [`FREQUENCY`] Hz of the process's CPU time, every
//! thread), named from the executable's symbol table ([`code_names`]), written as gzip
//! pprof by [`exporter::pprof`] with sample types `samples/count` and `cpu/nanoseconds`, one
//! label `thread` per sample. One profile runs at a time (the signal timer is per process);
//! another request meanwhile gets 429.

mod sampler;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::rejection::QueryRejection;
use axum::extract::Query;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use profile::{Function, LabelValue, Profile, ProfileBuilder, ValueType};
use serde::Deserialize;

use crate::error::ApiError;
use crate::server::ApiState;

/// Samples per second: a prime, as Go's profiler and pprof-rs's examples use, so that sampling
/// does not lock step with periodic work.
pub const FREQUENCY: u32 = 99;

/// Go's default profile length.
const DEFAULT_SECONDS: u64 = 30;

/// The longest profile a request may ask for.
const MAX_SECONDS: u64 = 300;

/// Whether a profile is running (only one can: the sampling signal is process-wide).
static PROFILING: AtomicBool = AtomicBool::new(false);

pub fn self_profile_routes() -> Router<ApiState> {
    Router::new().route("/debug/pprof/profile", get(profile))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    seconds: Option<u64>,
}

async fn profile(params: Result<Query<Params>, QueryRejection>) -> Result<Response, ApiError> {
    let Query(params) = params?;
    let seconds = params.seconds.unwrap_or(DEFAULT_SECONDS);
    if !(1..=MAX_SECONDS).contains(&seconds) {
        return Err(ApiError::InvalidParameter {
            name: "seconds",
            value: seconds.to_string(),
            reason: format!("profile for 1 to {MAX_SECONDS} seconds"),
        });
    }
    if PROFILING.swap(true, Ordering::AcqRel) {
        return Err(ApiError::Busy(
            "the agent is already profiling itself for another request; try again when it ends"
                .into(),
        ));
    }
    // The sampler's guard stays on one thread for the whole profile: a blocking one.
    let task = tokio::task::spawn_blocking(move || {
        let result = sample(Duration::from_secs(seconds));
        PROFILING.store(false, Ordering::Release);
        result
    });
    let profile = task
        .await
        .map_err(|e| ApiError::Internal(format!("the self-profile task failed: {e}")))??;
    let mut body = Vec::new();
    exporter::pprof::write_pprof(&profile, &mut body)?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"clrscope-cpu.pb.gz\"",
            ),
        ],
        body,
    )
        .into_response())
}

/// Samples every thread of the agent for `duration`.
fn sample(duration: Duration) -> Result<Profile, ApiError> {
    let start = SystemTime::now();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let images = symbolizer::parse_proc_maps(&maps);
    let collected = sampler::sample(FREQUENCY, duration, &unwind_blocked(&images))
        .map_err(|e| ApiError::Internal(format!("self-profiling failed: {e}")))?;
    if collected.dropped > 0 {
        tracing::warn!(
            dropped = collected.dropped,
            kept = collected.samples.len(),
            "the self-profile kept its first samples only"
        );
    }

    let period = 1_000_000_000 / i64::from(FREQUENCY);
    let mut builder = ProfileBuilder::new(
        vec![
            ValueType::new("samples", "count"),
            ValueType::new("cpu", "nanoseconds"),
        ],
        ValueType::new("cpu", "nanoseconds"),
        period,
    );
    builder.set_default_sample_type(1);
    let start_unix_nanos = start
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    builder.set_time_range(
        start_unix_nanos,
        i64::try_from(duration.as_nanos()).unwrap_or(i64::MAX),
    );
    // A return address points past its call: looked up one byte back, but the interrupted one.
    let lookup = |depth: usize, address: u64| {
        if depth == 0 {
            address
        } else {
            address.saturating_sub(1)
        }
    };
    let addresses: BTreeSet<u64> = collected
        .samples
        .iter()
        .flat_map(|s| s.addresses.iter().enumerate().map(|(d, &a)| lookup(d, a)))
        .collect();
    let names = code_names(&images, &addresses);
    let mut threads: HashMap<u32, String> = HashMap::new();
    for sample in &collected.samples {
        let stack = sample
            .addresses
            .iter()
            .enumerate()
            .map(|(depth, &address)| {
                let address = lookup(depth, address);
                let name = names
                    .get(&address)
                    .cloned()
                    .unwrap_or_else(|| format!("{address:#x}"));
                builder.function(Function {
                    name,
                    module: String::new(),
                })
            })
            .collect();
        let thread = threads
            .entry(sample.thread_id)
            .or_insert_with(|| thread_name(sample.thread_id))
            .clone();
        builder.add(
            stack,
            vec![("thread".to_string(), LabelValue::Str(thread))],
            &[1, period],
        );
    }
    Ok(builder.build())
}

/// The name a thread of this process has now (`comm`), or its id once it has ended.
fn thread_name(tid: u32) -> String {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
        .map(|name| name.trim_end().to_string())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| tid.to_string())
}

/// Code a sampled thread must not be unwound from: the C library, the unwinder, the dynamic
/// loader and the vDSO take locks there, or have no unwind tables, that unwinding would need.
fn unwind_blocked(images: &[symbolizer::ImageRange]) -> Vec<(u64, u64)> {
    const BLOCKED: [&str; 4] = ["libc", "libgcc", "pthread", "ld-linux"];
    let mut ranges: Vec<(u64, u64)> = images
        .iter()
        .filter(|image| {
            let file = image.path.rsplit('/').next().unwrap_or(&image.path);
            BLOCKED.iter().any(|b| file.contains(b))
        })
        .map(|image| (image.start, image.end))
        .collect();
    // SAFETY: getauxval has no preconditions.
    let vdso = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) };
    if vdso != 0 {
        // Two pages on x86_64 and arm64.
        ranges.push((vdso, vdso + 2 * 4096));
    }
    ranges
}

/// Names of the code at `addresses`: from the executable's symbol table for the agent's own code
/// (a Rust name without its hash), the file name in brackets for other images (`[libc.so.6]`).
/// Not from DWARF: the `backtrace` crate's resolver parses this binary's line tables on first use
/// and keeps them for the life of the process (~120 MB here), where the symbol table is read once
/// per profile and dropped. Inlined functions go unnamed, which a profile of the agent can spare.
fn code_names(
    images: &[symbolizer::ImageRange],
    addresses: &BTreeSet<u64>,
) -> HashMap<u64, String> {
    let exe = std::fs::read_link("/proc/self/exe").ok();
    let exe = exe.as_ref().map(|p| {
        let p = p.to_string_lossy();
        p.strip_suffix(" (deleted)").unwrap_or(&p).to_string()
    });
    let mut names = HashMap::new();
    for image in images {
        let inside: Vec<u64> = addresses.range(image.start..image.end).copied().collect();
        if inside.is_empty() {
            continue;
        }
        if exe.as_deref() == Some(image.path.as_str()) {
            if let Err(e) = name_from_symbols(image.start, &inside, &mut names) {
                tracing::warn!(error = %e, "the agent's symbol table could not be read; its frames are addresses");
            }
        } else {
            let file = image.path.rsplit('/').next().unwrap_or(&image.path);
            for address in inside {
                names.insert(address, format!("[{file}]"));
            }
        }
    }
    names
}

/// Names `addresses` (sorted, all in the executable, which is mapped from `image_start`) from
/// the executable's function symbols.
fn name_from_symbols(
    image_start: u64,
    addresses: &[u64],
    names: &mut HashMap<u64, String>,
) -> Result<(), String> {
    use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};
    // Through the link, so a binary replaced on disk since it started is still the one read.
    let file = std::fs::File::open("/proc/self/exe").map_err(|e| format!("/proc/self/exe: {e}"))?;
    let cache = object::ReadCache::new(file);
    let elf = object::File::parse(&cache).map_err(|e| format!("/proc/self/exe: {e}"))?;
    let lowest = elf.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff;
    let bias = image_start.wrapping_sub(lowest);
    for symbol in elf.symbols() {
        if symbol.kind() != SymbolKind::Text || symbol.size() == 0 {
            continue;
        }
        let start = symbol.address().wrapping_add(bias);
        let end = start.saturating_add(symbol.size());
        let first = addresses.partition_point(|&a| a < start);
        let within = addresses[first..].iter().take_while(|&&a| a < end);
        let mut name = None;
        for &address in within {
            let name = name.get_or_insert_with(|| {
                let raw = String::from_utf8_lossy(symbol.name_bytes().unwrap_or_default());
                match rustc_demangle::try_demangle(&raw) {
                    Ok(demangled) => format!("{demangled:#}"),
                    Err(_) => raw.into_owned(),
                }
            });
            names.insert(address, name.clone());
        }
    }
    Ok(())
}
