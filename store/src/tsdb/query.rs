//! Query evaluation over one source (the head or a block): row filtering and merging.

use std::collections::HashMap;

use arrow::record_batch::RecordBatch;

use super::head::{Dicts, SampleColumns};
use super::model::Query;
use crate::profile::{FunctionIndex, ProfileBuilder};

/// Calls `row(time, stack, labels, value)` for each row of the selected series, inside the
/// time range, whose sample labels match.
fn for_each_row(
    dicts: &Dicts,
    batches: &[RecordBatch],
    query: &Query,
    mut row: impl FnMut(i64, u32, u32, i64),
) {
    let series: Vec<bool> = dicts
        .series
        .iter()
        .map(|s| s.matches(&query.profile_type, &query.matchers))
        .collect();
    if !series.contains(&true) {
        return;
    }
    let label_sets: Vec<bool> = dicts
        .label_sets
        .iter()
        .map(|l| query.sample_labels_match(l))
        .collect();
    for batch in batches {
        // Columns were validated when the block was read; a mismatch here skips the batch.
        let Some(columns) = SampleColumns::of(batch) else {
            continue;
        };
        let (s, t, st, l, v) = (
            columns.series,
            columns.time,
            columns.stack,
            columns.labels,
            columns.value,
        );
        let rows = s
            .values()
            .iter()
            .zip(t.values())
            .zip(st.values())
            .zip(l.values())
            .zip(v.values());
        for ((((&s, &t), &st), &l), &v) in rows {
            if series.get(s as usize) == Some(&true)
                && t >= query.from
                && t < query.until
                && label_sets.get(l as usize) == Some(&true)
            {
                row(t, st, l, v);
            }
        }
    }
}

/// Adds the matching rows of one source to a profile being built.
pub(crate) fn merge_into(
    builder: &mut ProfileBuilder,
    dicts: &Dicts,
    batches: &[RecordBatch],
    query: &Query,
) {
    let mut sums: HashMap<(u32, u32), i64> = HashMap::new();
    for_each_row(dicts, batches, query, |_, stack, labels, value| {
        *sums.entry((stack, labels)).or_insert(0) += value;
    });
    let mut sums: Vec<_> = sums.into_iter().collect();
    sums.sort_unstable();
    let mut function_map: Vec<Option<FunctionIndex>> = vec![None; dicts.functions.len()];
    let mut ids = Vec::new();
    for ((stack, labels), value) in sums {
        dicts.resolve(stack, &mut ids);
        let stack: Vec<FunctionIndex> = ids
            .iter()
            .map(|&f| {
                *function_map[f as usize]
                    .get_or_insert_with(|| builder.function(dicts.functions[f as usize].clone()))
            })
            .collect();
        let labels = dicts.label_sets[labels as usize].clone();
        builder.add(stack, labels, &[value]);
    }
}

/// Adds the matching rows of one source to per-step totals starting at `query.from`.
pub(crate) fn add_timeline(
    totals: &mut [i64],
    step: i64,
    dicts: &Dicts,
    batches: &[RecordBatch],
    query: &Query,
) {
    for_each_row(dicts, batches, query, |time, _, _, value| {
        let at = (i128::from(time) - i128::from(query.from)) / i128::from(step);
        if let Some(t) = usize::try_from(at).ok().and_then(|i| totals.get_mut(i)) {
            *t += value;
        }
    });
}
