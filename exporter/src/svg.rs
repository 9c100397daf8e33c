//! An interactive flame graph SVG (search, zoom), drawn by inferno from the folded stacks.
//!
//! Colours come from a hash of each function name (inferno's `deterministic` option, FNV), so
//! equal profiles give byte-equal SVGs and a function keeps its colour across graphs; byte
//! profiles use the memory palette, others the classic "hot" one.

use std::io::Write;

use inferno::flamegraph::color::BasicPalette;
use inferno::flamegraph::{self, Palette};
use profile::Profile;

use crate::{describe_sample_type, folded, resolve_sample_type, ExportError, ExportOptions};

/// The largest total inferno is given: it adds counts up as `u64` (overflowing past that) and
/// lays them out as `f64` (exact up to 2^53). Larger profiles are scaled down to fit and the
/// counts shown are scaled back up with inferno's `factor`.
const MAX_TOTAL: u128 = 1 << 53;

/// Writes a flame graph of `options.sample_type` (default: the profile's default), titled with
/// that sample type (`cpu (nanoseconds)`) unless `options.title` says otherwise.
///
/// A profile with nothing to draw is an error ([`ExportError::NothingToDraw`]) rather than an
/// empty picture, which would look like a broken file.
pub fn write_svg(
    profile: &Profile,
    options: &ExportOptions,
    out: impl Write,
) -> Result<(), ExportError> {
    let stacks = folded::collapse(profile, options)?;
    let sample_type = &profile.sample_types[resolve_sample_type(profile, options.sample_type)?];

    let total: u128 = stacks.values().map(|&v| v as u128).sum();
    let divisor = total.div_ceil(MAX_TOTAL).max(1);
    let lines: Vec<String> = stacks
        .iter()
        .filter_map(|(stack, &value)| {
            let count = value as u128 / divisor;
            (count > 0).then(|| format!("{stack} {count}"))
        })
        .collect();
    if lines.is_empty() {
        return Err(ExportError::NothingToDraw {
            sample_type: describe_sample_type(sample_type),
        });
    }

    let mut opt = flamegraph::Options::default();
    opt.title = options
        .title
        .clone()
        .unwrap_or_else(|| describe_sample_type(sample_type));
    // "12 samples" reads better than "12 count"; other units name themselves.
    opt.count_name = if sample_type.unit == "count" {
        sample_type.kind.clone()
    } else {
        sample_type.unit.clone()
    };
    opt.deterministic = true;
    opt.colors = Palette::Basic(if sample_type.unit == "bytes" {
        BasicPalette::Mem
    } else {
        BasicPalette::Hot
    });
    opt.factor = divisor as f64;
    flamegraph::from_lines(&mut opt, lines.iter().map(String::as_str), out)?;
    Ok(())
}
