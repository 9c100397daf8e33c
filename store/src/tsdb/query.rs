//! Query evaluation: the rows of each source (the head or a block) a query selects, merged into
//! one profile or one timeline.

use arrow::record_batch::RecordBatch;

use super::error::Result;
use super::head::{Dicts, IdMap, Interner, Remap, SampleColumns};
use super::model::Query;
use crate::profile::{Labels, Profile, Sample, ValueType};

/// Calls `row(time, stack, labels, value)` for each row of the selected series, inside the
/// time range, whose sample labels match; stops at the first error.
fn for_each_row(
    dicts: &Dicts,
    batches: &[RecordBatch],
    query: &Query,
    mut row: impl FnMut(i64, u32, u32, i64) -> Result<()>,
) -> Result<()> {
    let series: Vec<bool> = dicts
        .series
        .iter()
        .map(|s| s.matches(&query.profile_type, &query.matchers))
        .collect();
    if !series.contains(&true) {
        return Ok(());
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
                row(t, st, l, v)?;
            }
        }
    }
    Ok(())
}

/// Values per stack, one table per label set (the index).
type Sums = Vec<IdMap<u32, i64>>;

/// A profile merged from several sources, each with dictionaries of its own.
///
/// Stacks and label sets are re-interned into one [`Interner`] for the query, so a sample is
/// keyed by two integers (stack, label set) rather than by a vector of functions and a vector
/// of labels, each source's ids are looked up once rather than once per row, and a stack is
/// spelled out as a vector only once, when the profile is built.
///
/// Values are kept in one table per label set: while a source's samples of one label set
/// (one thread, say) are added, only that table is touched, a fraction of the answer that
/// stays in cache, where one table for all would be probed at random across the whole answer.
/// Tables are iterated in their (deterministic) hash order: any fixed order keeps answers
/// stable, and sorting millions of samples would cost more.
#[derive(Default)]
pub(crate) struct ProfileMerge {
    interner: Interner,
    samples: Sums,
    /// Per-source sums, kept between sources so their tables keep their capacity.
    scratch: Sums,
}

impl ProfileMerge {
    /// Adds the matching rows of one source.
    pub fn add(&mut self, dicts: &Dicts, batches: &[RecordBatch], query: &Query) -> Result<()> {
        // A sample's rows recur once per sampler window in a block: they are summed per source
        // first, in tables that stay in cache, so the query's are probed once per distinct
        // sample of the source rather than once per row.
        let mut sums = std::mem::take(&mut self.scratch);
        if sums.len() < dicts.label_sets.len() {
            sums.resize_with(dicts.label_sets.len(), IdMap::default);
        }
        for_each_row(dicts, batches, query, |_, stack, labels, value| {
            let sum = sums[labels as usize].entry(stack).or_insert(0);
            *sum = sum.saturating_add(value);
            Ok(())
        })?;
        // The answer's id of each label set with rows, cut down to the labels the query keeps.
        let mut labels = vec![0; sums.len()];
        for (l, stacks) in sums.iter().enumerate().take(dicts.label_sets.len()) {
            if !stacks.is_empty() {
                let kept = query.sample_labels.keep(&dicts.label_sets[l]);
                labels[l] = self.interner.intern_label_set(&kept)?;
            }
        }
        let added = self.add_sums(dicts, &labels, &mut sums);
        self.scratch = sums;
        added
    }

    /// Adds another merge's samples: the partial answers of the threads of one query.
    pub fn absorb(&mut self, mut other: ProfileMerge) -> Result<()> {
        let from = &other.interner.dicts;
        let labels = (0..other.samples.len())
            .map(|l| self.interner.intern_label_set(&from.label_sets[l]))
            .collect::<Result<Vec<_>>>()?;
        self.add_sums(from, &labels, &mut other.samples)
    }

    /// Moves values per stack and label set, given in `dicts`' stack ids and as answer label
    /// set ids by `labels`, into the answer.
    fn add_sums(&mut self, dicts: &Dicts, labels: &[u32], sums: &mut Sums) -> Result<()> {
        let mut remap = Remap::new(dicts);
        for (&labels, stacks) in labels.iter().zip(sums.iter_mut()) {
            if stacks.is_empty() {
                continue;
            }
            let labels = labels as usize;
            if self.samples.len() <= labels {
                self.samples.resize_with(labels + 1, IdMap::default);
            }
            let table = &mut self.samples[labels];
            for (stack, value) in stacks.drain() {
                let sum = table
                    .entry(remap.stack(&mut self.interner, stack)?)
                    .or_insert(0);
                *sum = sum.saturating_add(value);
            }
        }
        Ok(())
    }

    /// The profile of everything added: one sample type, per-sample labels kept.
    ///
    /// `period` is 0 ("unknown"): stored values are already totals in the profile type's unit
    /// (each sample worth the sampler period measured in its window, which varies from window
    /// to window and process to process), so nothing needs scaling and no single period is
    /// true of a merged range.
    pub fn build(
        self,
        value_type: ValueType,
        start_unix_nanos: i64,
        duration_nanos: i64,
    ) -> Profile {
        let mut dicts = self.interner.dicts;
        let label_sets: Vec<Labels> = std::mem::take(&mut dicts.label_sets)
            .into_iter()
            .map(Labels::from)
            .collect();
        let mut stack = Vec::new();
        let mut samples = Vec::with_capacity(self.samples.iter().map(IdMap::len).sum());
        for (labels, stacks) in self.samples.into_iter().enumerate() {
            for (node, value) in stacks {
                dicts.resolve(node, &mut stack);
                samples.push(Sample {
                    stack: stack.clone(),
                    values: vec![value],
                    labels: label_sets[labels].clone(),
                });
            }
        }
        Profile {
            sample_types: vec![value_type.clone()],
            default_sample_type: 0,
            period_type: value_type,
            period: 0,
            functions: dicts.functions,
            samples,
            start_unix_nanos,
            duration_nanos,
        }
    }
}

/// Adds the matching rows of one source to per-step totals starting at `query.from`.
pub(crate) fn add_timeline(
    totals: &mut [i64],
    step: i64,
    dicts: &Dicts,
    batches: &[RecordBatch],
    query: &Query,
) -> Result<()> {
    for_each_row(dicts, batches, query, |time, _, _, value| {
        let at = (i128::from(time) - i128::from(query.from)) / i128::from(step);
        if let Some(t) = usize::try_from(at).ok().and_then(|i| totals.get_mut(i)) {
            *t = t.saturating_add(value);
        }
        Ok(())
    })
}
