//! Folded (collapsed) stacks: `root;caller;leaf value`, one line per distinct stack.
//!
//! The text format of Brendan Gregg's `stackcollapse-*` scripts, which `flamegraph.pl`, inferno
//! and Pyroscope's `/ingest` read. Lines are sorted so equal profiles give equal files; samples
//! that differ only in labels are added up, and stacks whose total is not positive are left out
//! (flame graphs have no room for them).
//!
//! Names are rewritten where the format would misread them:
//!
//! - `;` separates frames, so a `;` inside a name becomes `:`;
//! - a line ends at a newline, so control characters (newline, tab, …) become `\u{FFFD}` (`�`);
//! - readers take a trailing number after a space as a count (two of them as a differential
//!   flame graph), so a space before a trailing number becomes a no-break space (U+00A0);
//! - an empty or blank name, or an empty stack, becomes `[unknown]`, so its samples still count
//!   (readers trim lines, which would swallow a blank frame).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::Write;

use profile::Profile;

use profile::labels::UNKNOWN_FRAME;

use crate::{check, resolve_sample_type, ExportError, ExportOptions, ThreadKey};

/// Writes the profile's folded stacks for `options.sample_type` (default: the profile's default),
/// with a thread root frame per stack when `options.thread_label` is set.
pub fn write_folded(
    profile: &Profile,
    options: &ExportOptions,
    mut out: impl Write,
) -> Result<(), ExportError> {
    for (stack, value) in collapse(profile, options)? {
        writeln!(out, "{stack} {value}")?;
    }
    out.flush()?;
    Ok(())
}

/// Writes the differential folded stacks of a profile as `store::tsdb::diff` builds it (sample
/// type 0 the base, 1 the new values): `stack base new`, the input of differential flame graphs
/// (`flamegraph.pl`, inferno). Stacks with neither value positive are left out.
pub fn write_diff_folded(diff: &Profile, mut out: impl Write) -> Result<(), ExportError> {
    let columns = [
        resolve_sample_type(diff, Some(0))?,
        resolve_sample_type(diff, Some(1))?,
    ];
    for (stack, [base, new]) in collapse_columns(diff, None, columns)? {
        if base > 0 || new > 0 {
            writeln!(out, "{stack} {base} {new}")?;
        }
    }
    out.flush()?;
    Ok(())
}

/// Folded stack → total value, sorted by stack, totals positive. Totals saturate at `i64::MAX`.
pub(crate) fn collapse(
    profile: &Profile,
    options: &ExportOptions,
) -> Result<BTreeMap<String, i64>, ExportError> {
    let index = resolve_sample_type(profile, options.sample_type)?;
    let stacks = collapse_columns(profile, options.thread_label.as_deref(), [index])?;
    Ok(stacks
        .into_iter()
        .filter_map(|(stack, [total])| (total > 0).then_some((stack, total)))
        .collect())
}

/// Folded stack → totals of the sample types `columns` (valid indices), sorted by stack, with
/// a thread root frame per stack when `thread_label` is set. Totals saturate.
fn collapse_columns<const N: usize>(
    profile: &Profile,
    thread_label: Option<&str>,
    columns: [usize; N],
) -> Result<BTreeMap<String, [i64; N]>, ExportError> {
    check(profile)?;
    let names: Vec<Cow<str>> = profile
        .functions
        .iter()
        .map(|f| sanitize(&f.name))
        .collect();
    let mut stacks: BTreeMap<String, [i64; N]> = BTreeMap::new();
    let mut line = String::new();
    for sample in &profile.samples {
        line.clear();
        if let Some(label) = thread_label {
            line.push_str(&sanitize(&ThreadKey::of(sample, label).describe(label)));
            line.push(';');
        }
        if sample.stack.is_empty() {
            line.push_str(UNKNOWN_FRAME);
        }
        for (i, &f) in sample.stack.iter().rev().enumerate() {
            if i > 0 {
                line.push(';');
            }
            line.push_str(&names[f as usize]);
        }
        let totals = match stacks.get_mut(line.as_str()) {
            Some(totals) => totals,
            None => stacks.entry(line.clone()).or_insert([0; N]),
        };
        for (total, &column) in totals.iter_mut().zip(&columns) {
            *total = total.saturating_add(sample.values[column]);
        }
    }
    Ok(stacks)
}

/// A name as one frame of a folded line (see the module documentation for the rules).
fn sanitize(name: &str) -> Cow<'_, str> {
    if name.trim().is_empty() {
        return Cow::Borrowed(UNKNOWN_FRAME);
    }
    let trailing_number = name
        .rsplit_once(' ')
        .is_some_and(|(_, tail)| looks_like_count(tail));
    if !trailing_number && !name.chars().any(|c| c == ';' || c.is_control()) {
        return Cow::Borrowed(name);
    }
    let mut clean: String = name
        .chars()
        .map(|c| match c {
            ';' => ':',
            c if c.is_control() => '\u{FFFD}',
            c => c,
        })
        .collect();
    if trailing_number {
        if let Some(space) = clean.rfind(' ') {
            clean.replace_range(space..space + 1, "\u{A0}");
        }
    }
    Cow::Owned(clean)
}

/// Whether folded-stack readers would take `s` as a sample count: digits, optionally with a
/// fractional part.
fn looks_like_count(s: &str) -> bool {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    !int.is_empty()
        && int.bytes().all(|b| b.is_ascii_digit())
        && frac.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use profile::{Function, ProfileBuilder, ValueType};

    use super::*;

    #[test]
    fn diff_lines_carry_base_and_new() {
        let profile = |stacks: &[(&[&str], i64)]| {
            let cpu = || ValueType::new("cpu", "nanoseconds");
            let mut b = ProfileBuilder::new(vec![cpu()], cpu(), 1);
            for (names, value) in stacks {
                let stack = names
                    .iter()
                    .map(|name| {
                        b.function(Function {
                            name: name.to_string(),
                            module: "Shop.dll".into(),
                        })
                    })
                    .collect();
                b.add(stack, Vec::new(), &[*value]);
            }
            b.build()
        };
        let main = "Shop.Program.Main()";
        let base = profile(&[(&["Shop.Cart.Total()", main], 30), (&[main], 5)]);
        let new = profile(&[
            (&["Shop.Cart.Total()", main], 10),
            (&["Shop.Tax.Rate()", main], 7),
        ]);
        let mut out = Vec::new();
        write_diff_folded(&profile::diff(&base, &new, 0), &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "Shop.Program.Main() 5 0\n\
             Shop.Program.Main();Shop.Cart.Total() 30 10\n\
             Shop.Program.Main();Shop.Tax.Rate() 0 7\n"
        );
        assert!(matches!(
            write_diff_folded(&base, Vec::new()),
            Err(ExportError::SampleTypeOutOfRange { index: 1, .. })
        ));
    }

    #[test]
    fn names_that_would_break_a_line_are_rewritten_visibly() {
        assert_eq!(sanitize("A.B(System.Int32)"), "A.B(System.Int32)");
        assert_eq!(sanitize("A;B"), "A:B");
        assert_eq!(sanitize("A\nB\r\tC"), "A\u{FFFD}B\u{FFFD}\u{FFFD}C");
        assert_eq!(sanitize(""), UNKNOWN_FRAME);
        assert_eq!(sanitize(" \u{3000}"), UNKNOWN_FRAME);
        assert_eq!(sanitize("Worker 3"), "Worker\u{A0}3");
        assert_eq!(sanitize("Worker 3.5"), "Worker\u{A0}3.5");
        assert_eq!(sanitize("Take 3 items"), "Take 3 items");
        assert_eq!(sanitize("Ends with space "), "Ends with space ");
        assert_eq!(sanitize("Ünïcødé.Méthode(日本)"), "Ünïcødé.Méthode(日本)");
    }
}
