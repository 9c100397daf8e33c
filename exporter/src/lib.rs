//! Profile and artifact egress: pprof, OTLP Profiles, Pyroscope push, folded, speedscope, SVG;
//! and [`egress`], where diagnostic artifacts (which `ui::artifacts` collects) are written:
//! folders within a disk budget, or S3.
//!
//! The file writers here read the canonical [`profile::Profile`] and write one format each:
//!
//! - [`pprof`]: gzip-compressed `perftools.profiles.Profile`, for `go tool pprof`, Pyroscope, Grafana;
//! - [`folded`]: Brendan Gregg's collapsed stacks, for `flamegraph.pl`, inferno and scripts;
//! - [`speedscope`]: speedscope's JSON file format, for <https://www.speedscope.app>;
//! - [`svg`]: an interactive flame graph drawn by inferno;
//! - [`tree`]: a JSON flame-graph tree, root first, for the agent's web UI, and the same tree as
//!   Pyroscope's flame graph levels ([`tree::flame_graph`]) for Grafana.
//!
//! The agent's exporters read its store batches instead, which keep each window's time and each
//! sample's trace link:
//!
//! - [`otlp`]: OTLP Profiles requests (`ExportProfilesServiceRequest`, proto v1.10);
//! - [`pyroscope`]: pprof profiles labelled for Pyroscope's push API and `/ingest`;
//! - [`remote`]: the exporters' settings and their clients (gRPC, HTTP, TLS).
//!
//! [`write()`] picks the writer of a file format from a [`Format`], which
//! [`Format::from_extension`] derives from an output path the way `clrscope record -o FILE`
//! needs. The JSON tree is no file format (`.json` means speedscope) and has a differential
//! variant, so it is called directly: [`tree::write_tree`], [`tree::write_diff_tree`].
//! Differential folded stacks (`stack base new`) come from [`folded::write_diff_folded`].
//!
//! Every writer checks the profile first (see [`ExportError`]): a profile whose samples point at
//! missing functions or carry the wrong number of values is refused with an error instead of
//! producing a file that a viewer would reject, or crashing.

use std::fmt;
use std::io::Write;
use std::path::Path;
use std::str::FromStr;

use profile::labels;
use profile::{LabelValue, Profile, Sample, ValueType};

pub mod egress;
pub mod folded;
pub mod otlp;
pub mod otlp_metrics;
pub mod pprof;
pub mod pyroscope;
pub mod remote;
pub mod speedscope;
pub mod svg;
pub mod tree;

/// Why a profile could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    #[error("writing the profile failed: {0}")]
    Io(#[from] std::io::Error),

    #[error(
        "sample {sample} has {got} values but the profile has {expected} sample types; \
         the code that built the profile must give every sample one value per sample type"
    )]
    ValueCount {
        sample: usize,
        got: usize,
        expected: usize,
    },

    #[error(
        "sample {sample} refers to function {function} but the profile has {functions} functions; \
         the code that built the profile must add functions before samples use them"
    )]
    FunctionIndex {
        sample: usize,
        function: u32,
        functions: usize,
    },

    #[error(
        "sample type {index} does not exist; the profile's {count} sample types are: {available}"
    )]
    SampleTypeOutOfRange {
        index: usize,
        count: usize,
        available: String,
    },

    #[error(
        "nothing to draw: no sample has a positive {sample_type} value; \
         widen the time range or choose another sample type"
    )]
    NothingToDraw { sample_type: String },

    #[error("unknown profile format `{0}`: use pprof, folded, speedscope or svg")]
    UnknownFormat(String),

    #[error(
        "cannot tell the profile format from the file name `{0}`: end it with .pb.gz, .pprof, .pb \
         (pprof), .folded, .txt (folded), .speedscope.json, .json (speedscope) or .svg, \
         or give the format explicitly"
    )]
    UnknownExtension(String),
}

/// An output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    Pprof,
    Folded,
    Speedscope,
    Svg,
}

impl Format {
    /// The format a file name asks for, by its extension (case-insensitive).
    pub fn from_extension(path: impl AsRef<Path>) -> Result<Format, ExportError> {
        let path = path.as_ref();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_ascii_lowercase())
            .unwrap_or_default();
        // Longest suffixes first, so `.speedscope.json` is not mistaken for another JSON.
        const SUFFIXES: [(&str, Format); 8] = [
            (".speedscope.json", Format::Speedscope),
            (".pb.gz", Format::Pprof),
            (".pprof", Format::Pprof),
            (".pb", Format::Pprof),
            (".folded", Format::Folded),
            (".txt", Format::Folded),
            (".json", Format::Speedscope),
            (".svg", Format::Svg),
        ];
        SUFFIXES
            .iter()
            .find(|(suffix, _)| name.ends_with(suffix))
            .map(|&(_, format)| format)
            .ok_or_else(|| ExportError::UnknownExtension(path.display().to_string()))
    }

    /// The name `FromStr` accepts and `Display` prints.
    pub fn name(self) -> &'static str {
        match self {
            Format::Pprof => "pprof",
            Format::Folded => "folded",
            Format::Speedscope => "speedscope",
            Format::Svg => "svg",
        }
    }
}

impl FromStr for Format {
    type Err = ExportError;

    fn from_str(s: &str) -> Result<Format, ExportError> {
        [
            Format::Pprof,
            Format::Folded,
            Format::Speedscope,
            Format::Svg,
        ]
        .into_iter()
        .find(|f| f.name().eq_ignore_ascii_case(s))
        .ok_or_else(|| ExportError::UnknownFormat(s.to_string()))
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Choices for the formats that show one view of a profile (folded, speedscope, SVG).
///
/// pprof ignores them: it carries every sample type and every label.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportOptions {
    /// Index into `Profile::sample_types` of the values to show. `None`: the profile's default
    /// sample type for folded and SVG; every sample type, one profile each, for speedscope.
    pub sample_type: Option<usize>,
    /// Key of the label that tells threads apart (usually [`labels::THREAD_ID`]). `Some`: folded and
    /// SVG put a root frame `key=value` above each stack (`no key` where a sample lacks the label),
    /// and speedscope writes one profile per label value. `None`: threads are merged.
    pub thread_label: Option<String>,
    /// SVG title and speedscope file name. `None`: derived from the sample type.
    pub title: Option<String>,
}

impl ExportOptions {
    /// The defaults [`write()`] uses for a format: per-thread profiles for speedscope, whose viewer
    /// lists profiles side by side (as `dotnet-trace convert --format speedscope` does); merged
    /// threads elsewhere.
    pub fn defaults_for(format: Format) -> ExportOptions {
        ExportOptions {
            thread_label: (format == Format::Speedscope).then(|| labels::THREAD_ID.to_string()),
            ..ExportOptions::default()
        }
    }
}

/// An error and its causes, `: `-separated: reqwest's and rustls' own messages hide why (a TLS
/// failure or a refused connection says so only in a source).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Writes `profile` in `format` with that format's default options ([`ExportOptions::defaults_for`]).
pub fn write(profile: &Profile, format: Format, out: impl Write) -> Result<(), ExportError> {
    write_with_options(profile, format, &ExportOptions::defaults_for(format), out)
}

/// Writes `profile` in `format`; `options` apply to the formats that show one view of it.
pub fn write_with_options(
    profile: &Profile,
    format: Format,
    options: &ExportOptions,
    out: impl Write,
) -> Result<(), ExportError> {
    match format {
        Format::Pprof => pprof::write_pprof(profile, out),
        Format::Folded => folded::write_folded(profile, options, out),
        Format::Speedscope => speedscope::write_speedscope(profile, options, out),
        Format::Svg => svg::write_svg(profile, options, out),
    }
}

/// Refuses a profile whose samples do not fit its sample types and functions, so that the
/// writers can index without checks and never write a file that viewers reject.
fn check(profile: &Profile) -> Result<(), ExportError> {
    for (i, sample) in profile.samples.iter().enumerate() {
        if sample.values.len() != profile.sample_types.len() {
            return Err(ExportError::ValueCount {
                sample: i,
                got: sample.values.len(),
                expected: profile.sample_types.len(),
            });
        }
        if let Some(&function) = sample
            .stack
            .iter()
            .find(|&&f| f as usize >= profile.functions.len())
        {
            return Err(ExportError::FunctionIndex {
                sample: i,
                function,
                functions: profile.functions.len(),
            });
        }
    }
    Ok(())
}

/// The sample type `requested`, or the profile's default, checked against the profile.
fn resolve_sample_type(profile: &Profile, requested: Option<usize>) -> Result<usize, ExportError> {
    let index = requested.unwrap_or(profile.default_sample_type);
    if index < profile.sample_types.len() {
        return Ok(index);
    }
    let available = if profile.sample_types.is_empty() {
        "none".to_string()
    } else {
        profile
            .sample_types
            .iter()
            .enumerate()
            .map(|(i, t)| format!("{i}: {}", describe_sample_type(t)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(ExportError::SampleTypeOutOfRange {
        index,
        count: profile.sample_types.len(),
        available,
    })
}

/// `cpu (nanoseconds)`: how titles and profile names show a sample type.
fn describe_sample_type(sample_type: &ValueType) -> String {
    format!("{} ({})", sample_type.kind, sample_type.unit)
}

/// Which thread a sample belongs to under `ExportOptions::thread_label`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum ThreadKey<'a> {
    Value(&'a LabelValue),
    /// Sorts after every value, so samples without the label come last.
    Missing,
}

impl<'a> ThreadKey<'a> {
    fn of(sample: &'a Sample, label: &str) -> ThreadKey<'a> {
        sample
            .labels
            .iter()
            .find(|(key, _)| key == label)
            .map_or(ThreadKey::Missing, |(_, value)| ThreadKey::Value(value))
    }

    /// `thread_id=1234`, or `no thread_id`.
    fn describe(&self, label: &str) -> String {
        match self {
            ThreadKey::Value(LabelValue::Num(n)) => format!("{label}={n}"),
            ThreadKey::Value(LabelValue::Str(s)) => format!("{label}={s}"),
            ThreadKey::Missing => format!("no {label}"),
        }
    }
}
