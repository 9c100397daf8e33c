//! Query evaluation: the rows of each source (the head or a block) a query selects, merged into
//! one profile or one timeline.

use std::sync::{Arc, Mutex};

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
    pub fn new(series: &[Arc<Series>], query: &Query, labels: Option<Vec<u32>>) -> Self {
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

/// Fewest samples worth a thread of their own when a profile is spelled out.
const SAMPLES_PER_THREAD: usize = 50_000;

/// Values per stack of some label sets, each with its label set's id.
type LabelTables = Vec<(u32, IdMap<u32, i64>)>;

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
    /// Spelling out is most of a large answer's cost (a vector per sample), so the label
    /// tables are spelled out on up to `threads` threads.
    pub fn build(
        self,
        interner: &Interner,
        threads: usize,
        value_type: ValueType,
        start_unix_nanos: i64,
        duration_nanos: i64,
    ) -> Profile {
        let dicts = &interner.dicts;
        // The interner is shared with other queries: only the functions used go in the answer,
        // numbered in the interner's order. Marking each node's callers stops at the first one
        // marked already, so each node is visited once.
        let mut used_nodes = vec![false; dicts.stacks.len()];
        let mut used_functions = vec![false; dicts.functions.len()];
        for &node in self.samples.values().flat_map(IdMap::keys) {
            let mut node = node;
            while let Some(n) = dicts.stacks.get(node as usize) {
                if std::mem::replace(&mut used_nodes[node as usize], true) {
                    break;
                }
                used_functions[n.function as usize] = true;
                node = n.parent;
            }
        }
        drop(used_nodes);
        let mut index = vec![u32::MAX; dicts.functions.len()];
        let mut functions = Vec::new();
        for (f, _) in used_functions.iter().enumerate().filter(|(_, &used)| used) {
            index[f] = functions.len() as u32;
            functions.push(dicts.functions[f].clone());
        }
        // Tables dealt out so that each thread spells out about as many samples.
        let total: usize = self.samples.values().map(IdMap::len).sum();
        let threads = threads.clamp(1, total.div_ceil(SAMPLES_PER_THREAD).max(1));
        let mut shares: Vec<(usize, LabelTables)> = (0..threads).map(|_| (0, Vec::new())).collect();
        let mut tables: LabelTables = self.samples.into_iter().collect();
        tables.sort_unstable_by_key(|(labels, stacks)| (std::cmp::Reverse(stacks.len()), *labels));
        for table in tables {
            let share = shares
                .iter_mut()
                .min_by_key(|(len, _)| *len)
                .expect("at least one thread");
            share.0 += table.1.len();
            share.1.push(table);
        }
        // Behind a lock each, so a share whose thread could not start is spelled out here.
        let shares: Vec<Mutex<LabelTables>> = shares
            .into_iter()
            .map(|(_, tables)| Mutex::new(tables))
            .collect();
        let spell = |share: &Mutex<LabelTables>| -> Vec<Sample> {
            let tables = std::mem::take(&mut *share.lock().unwrap_or_else(|p| p.into_inner()));
            let mut stack = Vec::new();
            // A stack recurs in many label sets (once per thread): spelled out once, as a range
            // of `spelled`.
            let mut spelled = Vec::new();
            let mut ranges: IdMap<u32, (usize, usize)> = IdMap::default();
            let mut samples = Vec::with_capacity(tables.iter().map(|(_, t)| t.len()).sum());
            for (labels, stacks) in tables {
                let labels = Labels::from(dicts.label_sets[labels as usize].as_slice());
                // In node order, consecutive stacks share callers still in cache (nodes are
                // numbered as blocks list them, siblings together), where hash order walks each
                // stack from cold memory.
                let mut stacks: Vec<(u32, i64)> = stacks.into_iter().collect();
                stacks.sort_unstable_by_key(|&(node, _)| node);
                for (node, value) in stacks {
                    let (from, to) = *ranges.entry(node).or_insert_with(|| {
                        dicts.resolve(node, &mut stack);
                        let from = spelled.len();
                        spelled.extend(stack.iter().map(|&f| index[f as usize]));
                        (from, spelled.len())
                    });
                    samples.push(Sample {
                        stack: spelled[from..to].to_vec(),
                        values: vec![value],
                        labels: labels.clone(),
                    });
                }
            }
            samples
        };
        let samples = std::thread::scope(|scope| {
            let spell = &spell;
            let helpers: Vec<_> = shares[1..]
                .iter()
                .map(|share| {
                    std::thread::Builder::new()
                        .name("store-query".into())
                        .spawn_scoped(scope, move || spell(share))
                        .map_err(|_| share)
                })
                .collect();
            let mut samples = spell(&shares[0]);
            samples.reserve(total - samples.len());
            for helper in helpers {
                samples.extend(match helper {
                    Ok(thread) => thread
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                    // No thread to spare: this one spells that share out too.
                    Err(share) => spell(share),
                });
            }
            samples
        });
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
