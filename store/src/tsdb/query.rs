//! Query evaluation: the rows of each source (the head or a block) a query selects, merged into
//! one profile or one timeline.

use arrow::record_batch::RecordBatch;

use super::error::Result;
use super::head::{Interner, SampleColumns, EMPTY_STACK};
use super::model::{Query, Series};
use profile::ids::IdMap;
use profile::{Labels, Profile, Sample, ValueType};

/// In [`Selection`]'s label sets: rows with this label set are not selected.
pub(crate) const SKIP: u32 = u32::MAX;

/// Which rows of one source a query takes, by the source's ids.
pub(crate) struct Selection {
    series: Vec<bool>,
    /// Per label set: the answer's label set its rows are merged under (the query may keep
    /// fewer labels), or [`SKIP`] when the query's sample matchers exclude it. `None`: every
    /// label set, as it is (a timeline without sample matchers, which needs no dictionary).
    labels: Option<Vec<u32>>,
    /// Time spans whose rows are not selected: those downsampled blocks answer for (the head's
    /// rows of a span a level's block holds already came late and are counted there).
    excluded: Vec<(i64, i64)>,
}

impl Selection {
    pub fn new(series: &[Series], query: &Query, labels: Option<Vec<u32>>) -> Self {
        Selection {
            series: series
                .iter()
                .map(|s| s.matches(&query.profile_type, &query.matchers))
                .collect(),
            labels,
            excluded: Vec::new(),
        }
    }

    pub fn excluding(mut self, spans: &[(i64, i64)]) -> Self {
        self.excluded = spans.to_vec();
        self
    }
}

/// Calls `row(time, stack, labels, value)` for each row of the selected series, inside the
/// time range, whose label set is selected (`labels` is the source's label set id); stops at
/// the first error.
pub(crate) fn for_each_row(
    selection: &Selection,
    batches: &[RecordBatch],
    query: &Query,
    mut row: impl FnMut(i64, u32, u32, i64) -> Result<()>,
) -> Result<()> {
    if !selection.series.contains(&true) {
        return Ok(());
    }
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
            if selection.series.get(s as usize) == Some(&true)
                && t >= query.from
                && t < query.until
                && (selection.excluded.is_empty()
                    || !selection.excluded.iter().any(|&(s, e)| s <= t && t < e))
                && selection
                    .labels
                    .as_ref()
                    .is_none_or(|labels| labels.get(l as usize).is_some_and(|&l| l != SKIP))
            {
                row(t, st, l, v)?;
            }
        }
    }
    Ok(())
}

/// Values per stack, one table per label set.
type Sums = Vec<IdMap<u32, i64>>;

/// A profile merged from several sources, in the ids of one [`Interner`] (a cache epoch's), into
/// which each source's ids are translated: a sample is keyed by two integers (stack, label set)
/// rather than by a vector of functions and a vector of labels, and a stack is spelled out as a
/// vector only once, when the profile is built.
///
/// Values are kept in one table per label set: while a source's samples of one label set
/// (one thread, say) are added, only that table is touched, a fraction of the answer that
/// stays in cache, where one table for all would be probed at random across the whole answer.
/// Tables are iterated in their (deterministic) hash order: any fixed order keeps answers
/// stable, and sorting millions of samples would cost more.
#[derive(Default)]
pub(crate) struct ProfileMerge {
    /// By the answer's label set.
    samples: IdMap<u32, IdMap<u32, i64>>,
    /// Per-source sums by the source's label set, kept between sources so their tables keep
    /// their capacity.
    scratch: Sums,
}

impl ProfileMerge {
    /// Adds the selected rows of one source whose stack node ids translate by `nodes`.
    pub fn add(
        &mut self,
        selection: &Selection,
        nodes: &[u32],
        batches: &[RecordBatch],
        query: &Query,
    ) -> Result<()> {
        // A sample's rows recur once per sampler window in a block: they are summed per source
        // first, in tables that stay in cache, so the answer's are probed once per distinct
        // sample of the source rather than once per row.
        // Without the answer's label set for each of the source's, rows have nowhere to go
        // (only timelines select that way).
        let Some(labels) = &selection.labels else {
            return Ok(());
        };
        let mut sums = std::mem::take(&mut self.scratch);
        if sums.len() < labels.len() {
            sums.resize_with(labels.len(), IdMap::default);
        }
        for_each_row(selection, batches, query, |_, stack, labels, value| {
            let sum = sums[labels as usize].entry(stack).or_insert(0);
            *sum = sum.saturating_add(value);
            Ok(())
        })?;
        for (&labels, stacks) in labels.iter().zip(sums.iter_mut()) {
            if stacks.is_empty() {
                continue;
            }
            let table = self.samples.entry(labels).or_default();
            for (stack, value) in stacks.drain() {
                let node = nodes.get(stack as usize).copied().unwrap_or(EMPTY_STACK);
                let sum = table.entry(node).or_insert(0);
                *sum = sum.saturating_add(value);
            }
        }
        self.scratch = sums;
        Ok(())
    }

    /// Adds another merge's samples (in the same ids): the partial answers of one query's
    /// threads.
    pub fn absorb(&mut self, other: ProfileMerge) {
        for (labels, stacks) in other.samples {
            let table = self.samples.entry(labels).or_default();
            for (node, value) in stacks {
                let sum = table.entry(node).or_insert(0);
                *sum = sum.saturating_add(value);
            }
        }
    }

    /// The profile of everything added, spelled out from `interner` (the one ids refer to):
    /// one sample type, and the sample labels the query kept (see [`Profile::of_totals`]).
    pub fn build(
        self,
        interner: &Interner,
        value_type: ValueType,
        start_unix_nanos: i64,
        duration_nanos: i64,
    ) -> Profile {
        let dicts = &interner.dicts;
        // The interner is shared with other queries: only the functions used go in the answer.
        let mut index = vec![u32::MAX; dicts.functions.len()];
        let mut functions = Vec::new();
        let mut stack = Vec::new();
        let mut samples = Vec::with_capacity(self.samples.values().map(IdMap::len).sum());
        for (labels, stacks) in self.samples {
            let labels = Labels::from(dicts.label_sets[labels as usize].as_slice());
            // In node order, consecutive stacks share callers still in cache (nodes are numbered
            // as blocks list them, siblings together), where hash order walks each stack from
            // cold memory: with millions of distinct stacks this walk was most of the build.
            let mut stacks: Vec<(u32, i64)> = stacks.into_iter().collect();
            stacks.sort_unstable_by_key(|&(node, _)| node);
            for (node, value) in stacks {
                dicts.resolve(node, &mut stack);
                for f in stack.iter_mut() {
                    let slot = &mut index[*f as usize];
                    if *slot == u32::MAX {
                        *slot = functions.len() as u32;
                        functions.push(dicts.functions[*f as usize].clone());
                    }
                    *f = *slot;
                }
                samples.push(Sample {
                    stack: stack.clone(),
                    values: vec![value],
                    labels: labels.clone(),
                });
            }
        }
        Profile::of_totals(
            value_type,
            functions,
            samples,
            start_unix_nanos,
            duration_nanos,
        )
    }
}

/// Adds the selected rows of one source to per-step totals starting at `query.from`.
pub(crate) fn add_timeline(
    totals: &mut [i64],
    step: i64,
    selection: &Selection,
    batches: &[RecordBatch],
    query: &Query,
) -> Result<()> {
    for_each_row(selection, batches, query, |time, _, _, value| {
        let at = (i128::from(time) - i128::from(query.from)) / i128::from(step);
        if let Some(t) = usize::try_from(at).ok().and_then(|i| totals.get_mut(i)) {
            *t = t.saturating_add(value);
        }
        Ok(())
    })
}
