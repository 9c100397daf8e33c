//! Writing a profile to a file: the format from `--format` or the file's extension, mode 0600.

use std::io::BufWriter;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::Context;
use exporter::Format;
use profile::Profile;
use symbolizer::profiles::Resolution;

/// Creates (or truncates) the file a command writes its output to, readable by this user only:
/// profiles, traces and heap snapshots name code and may carry data.
pub fn create_private(path: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))
}

/// The format `--format` names, else the one the file's extension asks for.
pub fn choose_format(path: &Path, format: Option<Format>) -> anyhow::Result<Format> {
    Ok(match format {
        Some(format) => format,
        None => Format::from_extension(path)?,
    })
}

/// Writes the profile and says on stderr what was written.
pub fn write_profile(
    profile: &Profile,
    resolution: &Resolution,
    path: &Path,
    format: Format,
) -> anyhow::Result<()> {
    let file = create_private(path)?;
    exporter::write(profile, format, BufWriter::new(file))
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!(
        "wrote {} ({format}): {}",
        path.display(),
        describe(profile, resolution)
    );
    Ok(())
}

/// The time profile types `record` and `convert` build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TimeType {
    /// Samples of threads running managed code.
    Cpu,
    /// Every sample, running or waiting.
    Wall,
}

pub fn time_profiles(types: &[TimeType]) -> symbolizer::profiles::TimeProfiles {
    symbolizer::profiles::TimeProfiles {
        cpu: types.contains(&TimeType::Cpu),
        wall: types.contains(&TimeType::Wall),
    }
}

/// A one-line account of a profile for the terminal.
fn describe(profile: &Profile, resolution: &Resolution) -> String {
    format!(
        "{} samples, period {:.3} ms, {} functions, {:.1}% of managed frames named by a method \
         ({} native runtime frames)",
        profile.total(0),
        profile.period as f64 / 1e6,
        profile.functions.len(),
        resolution.method_percent(),
        resolution.native
    )
}
