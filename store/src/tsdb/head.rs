//! The in-memory head block (dictionaries being interned, sample rows in Arrow builders), and
//! the interning that compaction and queries share with it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, ArrayBuilder, Int64Array, Int64Builder, UInt32Array, UInt32Builder};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;

use super::error::{Result, StoreError};
use super::model::Series;
use profile::ids::IdMap;
use profile::{Batch, Function, LabelValue};

/// Stack id of an empty stack (no frames).
pub(crate) const EMPTY_STACK: u32 = u32::MAX;
/// Parent of a root stack node.
pub(crate) const NO_PARENT: u32 = u32::MAX;

/// One node of the stack tree: a frame and the stack of its caller. A stack id is the id
/// of its leaf node, so stacks sharing callers share nodes and a repeated stack costs nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct StackNode {
    /// Earlier node id, or [`NO_PARENT`].
    pub parent: u32,
    pub function: u32,
}

/// The dictionaries sample rows refer to, the same shape in the head and in a block.
#[derive(Debug, Default, Clone)]
pub(crate) struct Dicts {
    pub functions: Vec<Function>,
    pub stacks: Vec<StackNode>,
    pub label_sets: Vec<Vec<(String, LabelValue)>>,
    /// Shared with the store's other blocks that list the same series ([`super::Store`]).
    pub series: Vec<Arc<Series>>,
}

impl Dicts {
    /// Orders the functions by name and module and renumbers the nodes' functions to match:
    /// names of one namespace then sit together, where zstd finds them (the names of a busy
    /// service's block take a quarter fewer bytes than in the order they were first seen).
    pub fn sort_functions(&mut self) {
        let mut order: Vec<usize> = (0..self.functions.len()).collect();
        order.sort_by(|&a, &b| {
            let (a, b) = (&self.functions[a], &self.functions[b]);
            (&a.name, &a.module).cmp(&(&b.name, &b.module))
        });
        let mut new_ids = vec![0u32; order.len()];
        for (new, &old) in order.iter().enumerate() {
            new_ids[old] = new as u32;
        }
        let mut functions = std::mem::take(&mut self.functions);
        self.functions = order
            .iter()
            .map(|&old| Function {
                name: std::mem::take(&mut functions[old].name),
                module: std::mem::take(&mut functions[old].module),
            })
            .collect();
        for node in &mut self.stacks {
            node.function = new_ids[node.function as usize];
        }
    }

    /// Renumbers the stack nodes breadth first, the children of a node together and ordered by
    /// function, and returns each old node's new id. Parents then never decrease, so the
    /// delta-encoded `stacks.parent` column costs a bit or two per node where interning order
    /// jumps back to an unrelated row for every new branch; parents still come before their
    /// children.
    pub fn breadth_first(&mut self) -> Vec<u32> {
        let nodes = &self.stacks;
        let parent = |i: u32| Some(nodes[i as usize].parent).filter(|&p| p != NO_PARENT);
        // Parents point to earlier nodes, so one pass finds every depth.
        let mut depth = vec![0u32; nodes.len()];
        for i in 0..nodes.len() {
            if let Some(p) = parent(i as u32) {
                depth[i] = depth[p as usize] + 1;
            }
        }
        let mut order: Vec<u32> = (0..nodes.len() as u32).collect();
        order.sort_by_key(|&i| depth[i as usize]);
        let mut new_ids = vec![0u32; nodes.len()];
        let mut start = 0;
        while start < order.len() {
            let level = depth[order[start] as usize];
            let len = order[start..]
                .iter()
                .take_while(|&&i| depth[i as usize] == level)
                .count();
            // The level above is numbered already: group by its new ids.
            let slice = &mut order[start..start + len];
            slice.sort_unstable_by_key(|&i| {
                (
                    parent(i).map_or(0, |p| new_ids[p as usize]),
                    nodes[i as usize].function,
                )
            });
            for (k, &i) in slice.iter().enumerate() {
                new_ids[i as usize] = (start + k) as u32;
            }
            start += len;
        }
        self.stacks = order
            .iter()
            .map(|&i| StackNode {
                parent: parent(i).map_or(NO_PARENT, |p| new_ids[p as usize]),
                function: nodes[i as usize].function,
            })
            .collect();
        new_ids
    }

    /// Function ids of a stack, leaf first. Ids were validated on load, and parents always
    /// point to earlier nodes, so the walk ends.
    pub fn resolve(&self, stack: u32, out: &mut Vec<u32>) {
        out.clear();
        let mut node = stack;
        while let Some(n) = self.stacks.get(node as usize) {
            out.push(n.function);
            node = n.parent;
        }
    }
}

/// Index of the `stack` column in [`samples_schema`].
const STACK_COLUMN: usize = 2;

/// Schema of the sample rows, in the head and in `samples.parquet`.
pub(crate) fn samples_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("series", DataType::UInt32, false),
        Field::new("time", DataType::Int64, false),
        Field::new("stack", DataType::UInt32, false),
        Field::new("labels", DataType::UInt32, false),
        Field::new("value", DataType::Int64, false),
    ]))
}

/// The columns of a batch with [`samples_schema`], typed.
pub(crate) struct SampleColumns<'a> {
    pub series: &'a UInt32Array,
    pub time: &'a Int64Array,
    pub stack: &'a UInt32Array,
    pub labels: &'a UInt32Array,
    pub value: &'a Int64Array,
}

impl<'a> SampleColumns<'a> {
    /// `None` when the batch does not have the samples schema.
    pub fn of(batch: &'a RecordBatch) -> Option<Self> {
        fn typed<'b, T: Array + 'static>(batch: &'b RecordBatch, name: &str) -> Option<&'b T> {
            batch.column_by_name(name)?.as_any().downcast_ref::<T>()
        }
        Some(SampleColumns {
            series: typed(batch, "series")?,
            time: typed(batch, "time")?,
            stack: typed(batch, "stack")?,
            labels: typed(batch, "labels")?,
            value: typed(batch, "value")?,
        })
    }
}

/// `rows` (with [`samples_schema`]) with each stack id replaced by its new id from
/// [`Dicts::breadth_first`].
pub(crate) fn renumber_stacks(rows: &RecordBatch, new_ids: &[u32]) -> RecordBatch {
    let columns = SampleColumns::of(rows).expect("a batch with the samples schema");
    let stacks: UInt32Array = columns
        .stack
        .values()
        .iter()
        .map(|&s| new_ids.get(s as usize).copied().unwrap_or(EMPTY_STACK))
        .collect();
    let mut arrays = rows.columns().to_vec();
    arrays[STACK_COLUMN] = Arc::new(stacks);
    RecordBatch::try_new(rows.schema(), arrays).expect("the same schema and length")
}

/// What a level's block is made with: the span and time resolution (nanoseconds) and the
/// sample labels it leaves out.
#[derive(Debug, Clone)]
pub(crate) struct Downsampling {
    pub resolution: i64,
    pub drop_labels: Vec<String>,
}

/// A level's block being made: the rows of the finer blocks of its span summed per series,
/// stack and label set, as their times all become the span's start. Inputs are read a few
/// series at a time (a pass, see [`LevelMerge::end_pass`]), so the sums held at once are
/// bounded by the rows of one pass, not by the millions a 10-minute span of a busy node holds.
pub(crate) struct LevelMerge<'a> {
    interner: Interner,
    /// One per input block, by its index in the slice given to [`LevelMerge::new`].
    inputs: Vec<Remap<'a>>,
    /// The current pass: sums by (series, stack, labels) ids in `interner`.
    sums: IdMap<(u32, u32, u32), i64>,
    /// The passes done, one row per sum.
    rows: Vec<(u32, u32, u32, i64)>,
}

impl<'a> LevelMerge<'a> {
    /// A merge of blocks with `inputs` as their dictionaries, leaving out the labels of
    /// `drop_labels`.
    pub fn new(inputs: &'a [Dicts], drop_labels: &'a [String]) -> Self {
        LevelMerge {
            interner: Interner::default(),
            inputs: inputs
                .iter()
                .map(|dicts| Remap::dropping(dicts, drop_labels))
                .collect(),
            sums: IdMap::default(),
            rows: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.sums.is_empty()
    }

    /// Adds the rows of input `input` (validated by the reader) whose series id `wanted`
    /// accepts: a row group may hold series of another pass.
    pub fn absorb(
        &mut self,
        input: usize,
        samples: &[RecordBatch],
        wanted: impl Fn(u32) -> bool,
    ) -> Result<()> {
        let remap = &mut self.inputs[input];
        for batch in samples {
            let Some(c) = SampleColumns::of(batch) else {
                continue;
            };
            for i in 0..batch.num_rows() {
                if !wanted(c.series.value(i)) {
                    continue;
                }
                let series = remap.series(&mut self.interner, c.series.value(i))?;
                let stack = remap.stack(&mut self.interner, c.stack.value(i))?;
                let labels = remap.label_set(&mut self.interner, c.labels.value(i))?;
                let sum = self.sums.entry((series, stack, labels)).or_insert(0);
                *sum = sum.saturating_add(c.value.value(i));
            }
        }
        Ok(())
    }

    /// Ends a pass: every input gave the rows of its series, so their sums are final. The table
    /// keeps its capacity for the next pass, which the pass budget bounds.
    pub fn end_pass(&mut self) {
        self.rows.extend(
            self.sums
                .drain()
                .map(|((series, stack, labels), value)| (series, stack, labels, value)),
        );
    }

    /// The block's dictionaries, stack nodes numbered breadth first, and its rows at `time`
    /// in block order (series, stack, labels).
    pub fn finish(mut self, time: i64) -> (Dicts, RecordBatch) {
        self.end_pass();
        let mut dicts = self.interner.dicts;
        dicts.sort_functions();
        let new_ids = dicts.breadth_first();
        let mut rows = self.rows;
        for row in &mut rows {
            row.1 = new_ids.get(row.1 as usize).copied().unwrap_or(EMPTY_STACK);
        }
        rows.sort_unstable();
        let column =
            |f: fn(&(u32, u32, u32, i64)) -> u32| -> UInt32Array { rows.iter().map(f).collect() };
        let batch = RecordBatch::try_new(
            samples_schema(),
            vec![
                Arc::new(column(|r| r.0)),
                Arc::new(Int64Array::from(vec![time; rows.len()])),
                Arc::new(column(|r| r.1)),
                Arc::new(column(|r| r.2)),
                Arc::new(rows.iter().map(|r| r.3).collect::<Int64Array>()),
            ],
        )
        .expect("the samples schema and equal lengths");
        (dicts, batch)
    }
}

/// Rough per-row and per-entry costs for the head's byte budget, hash maps included.
const ROW_BYTES: usize = 28;
const ENTRY_OVERHEAD: usize = 48;

/// Dictionaries being built and the maps that intern into them: the head's, a compaction's and
/// a query's, so equal functions, stacks and label sets get one id however many sources they
/// come from.
#[derive(Debug, Default)]
pub(crate) struct Interner {
    pub dicts: Dicts,
    function_ids: HashMap<Function, u32>,
    node_ids: IdMap<StackNode, u32>,
    label_set_ids: HashMap<Vec<(String, LabelValue)>, u32>,
    series_ids: HashMap<Arc<Series>, u32>,
    /// Estimated bytes of the dictionaries and their maps.
    pub bytes: usize,
}

impl Interner {
    fn id_for(len: usize, what: &'static str) -> Result<u32> {
        u32::try_from(len)
            .ok()
            .filter(|&id| id != u32::MAX)
            .ok_or(StoreError::TooMany { what })
    }

    pub fn intern_function(&mut self, function: &Function) -> Result<u32> {
        if let Some(&id) = self.function_ids.get(function) {
            return Ok(id);
        }
        let id = Self::id_for(self.dicts.functions.len(), "functions")?;
        self.bytes += function.name.len() + function.module.len() + 2 * ENTRY_OVERHEAD;
        self.dicts.functions.push(function.clone());
        self.function_ids.insert(function.clone(), id);
        Ok(id)
    }

    pub fn intern_node(&mut self, node: StackNode) -> Result<u32> {
        if let Some(&id) = self.node_ids.get(&node) {
            return Ok(id);
        }
        let id = Self::id_for(self.dicts.stacks.len(), "stack nodes")?;
        self.bytes += ENTRY_OVERHEAD;
        self.dicts.stacks.push(node);
        self.node_ids.insert(node, id);
        Ok(id)
    }

    /// The stack id of function ids given leaf first.
    pub fn intern_stack(&mut self, leaf_first: &[u32]) -> Result<u32> {
        let mut parent = NO_PARENT;
        for &function in leaf_first.iter().rev() {
            parent = self.intern_node(StackNode { parent, function })?;
        }
        Ok(if leaf_first.is_empty() {
            EMPTY_STACK
        } else {
            parent
        })
    }

    /// The id of a label set given sorted; it is copied only the first time it is seen.
    pub fn intern_label_set(&mut self, sorted: &[(String, LabelValue)]) -> Result<u32> {
        if let Some(&id) = self.label_set_ids.get(sorted) {
            return Ok(id);
        }
        let id = Self::id_for(self.dicts.label_sets.len(), "label sets")?;
        self.bytes += ENTRY_OVERHEAD * (1 + sorted.len())
            + sorted.iter().map(|(k, _)| k.len() + 16).sum::<usize>();
        self.dicts.label_sets.push(sorted.to_vec());
        self.label_set_ids.insert(sorted.to_vec(), id);
        Ok(id)
    }

    pub fn intern_series(&mut self, series: &Arc<Series>) -> Result<u32> {
        if let Some(&id) = self.series_ids.get(series) {
            return Ok(id);
        }
        let id = Self::id_for(self.dicts.series.len(), "series")?;
        self.bytes += ENTRY_OVERHEAD * 2;
        self.dicts.series.push(Arc::clone(series));
        self.series_ids.insert(Arc::clone(series), id);
        Ok(id)
    }
}

/// Marks an id of a [`Remap`] not looked up yet; interned ids never reach `u32::MAX`.
const UNMAPPED: u32 = u32::MAX;

/// Where the ids of one source's dictionaries (a block's, or the head's) land in an
/// [`Interner`], filled in as rows need them: each id is interned once per source, not once per
/// row, and a stack costs one lookup per node it does not share with a stack seen before.
/// The source's ids must be valid, as the block reader checks them.
pub(crate) struct Remap<'a> {
    from: &'a Dicts,
    /// Sample labels left out of the label sets mapped (downsampling).
    drop_labels: &'a [String],
    functions: Vec<u32>,
    nodes: Vec<u32>,
    label_sets: Vec<u32>,
    series: Vec<u32>,
    /// Nodes of the stack being mapped that are not mapped yet, leaf first.
    chain: Vec<u32>,
}

impl<'a> Remap<'a> {
    pub fn new(from: &'a Dicts) -> Self {
        Remap {
            from,
            drop_labels: &[],
            functions: vec![UNMAPPED; from.functions.len()],
            nodes: vec![UNMAPPED; from.stacks.len()],
            label_sets: vec![UNMAPPED; from.label_sets.len()],
            series: vec![UNMAPPED; from.series.len()],
            chain: Vec::new(),
        }
    }

    pub fn series(&mut self, into: &mut Interner, id: u32) -> Result<u32> {
        let slot = &mut self.series[id as usize];
        if *slot == UNMAPPED {
            *slot = into.intern_series(&self.from.series[id as usize])?;
        }
        Ok(*slot)
    }

    /// The same, but each label set mapped without the labels of `drop_labels`.
    pub fn dropping(from: &'a Dicts, drop_labels: &'a [String]) -> Self {
        Remap {
            drop_labels,
            ..Remap::new(from)
        }
    }

    pub fn label_set(&mut self, into: &mut Interner, id: u32) -> Result<u32> {
        let slot = &mut self.label_sets[id as usize];
        if *slot == UNMAPPED {
            let set = &self.from.label_sets[id as usize];
            *slot = if self.drop_labels.is_empty() {
                into.intern_label_set(set)?
            } else {
                let kept: Vec<_> = set
                    .iter()
                    .filter(|(key, _)| !self.drop_labels.contains(key))
                    .cloned()
                    .collect();
                into.intern_label_set(&kept)?
            };
        }
        Ok(*slot)
    }

    fn function(&mut self, into: &mut Interner, id: u32) -> Result<u32> {
        let slot = &mut self.functions[id as usize];
        if *slot == UNMAPPED {
            *slot = into.intern_function(&self.from.functions[id as usize])?;
        }
        Ok(*slot)
    }

    /// The ids in `into` of every stack node and every label set, by the source's ids.
    pub fn all(mut self, into: &mut Interner) -> Result<(Vec<u32>, Vec<u32>)> {
        // Parents come first, so each node maps with one lookup.
        for node in 0..self.nodes.len() as u32 {
            self.stack(into, node)?;
        }
        for set in 0..self.label_sets.len() as u32 {
            self.label_set(into, set)?;
        }
        Ok((self.nodes, self.label_sets))
    }

    /// The id in `into` of the stack whose leaf node is `id` ([`EMPTY_STACK`] stays empty).
    pub fn stack(&mut self, into: &mut Interner, id: u32) -> Result<u32> {
        // Up from the leaf to the first node already mapped; parents always point to earlier
        // nodes, so the walk ends.
        self.chain.clear();
        let mut parent = NO_PARENT;
        let mut node = id;
        while let Some(n) = self.from.stacks.get(node as usize) {
            let mapped = self.nodes[node as usize];
            if mapped != UNMAPPED {
                parent = mapped;
                break;
            }
            self.chain.push(node);
            node = n.parent;
        }
        // Then down again, interning each node under its mapped parent.
        for i in (0..self.chain.len()).rev() {
            let node = self.chain[i];
            let function = self.function(into, self.from.stacks[node as usize].function)?;
            parent = into.intern_node(StackNode { parent, function })?;
            self.nodes[node as usize] = parent;
        }
        // NO_PARENT and EMPTY_STACK are one value: a stack with no node is empty.
        Ok(parent)
    }
}

/// Samples not yet on disk.
#[derive(Debug)]
pub(crate) struct Head {
    pub interner: Interner,
    series: UInt32Builder,
    time: Int64Builder,
    stack: UInt32Builder,
    labels: UInt32Builder,
    value: Int64Builder,
    pub samples_appended: u64,
    /// Appended samples per batch timestamp, to credit each partition's block.
    pub appended_by_time: HashMap<i64, u64>,
    /// When the oldest unflushed batch arrived.
    pub since: Option<Instant>,
    pub min_time: i64,
    pub max_time: i64,
}

impl Head {
    pub fn new() -> Self {
        Head {
            interner: Interner::default(),
            series: UInt32Builder::new(),
            time: Int64Builder::new(),
            stack: UInt32Builder::new(),
            labels: UInt32Builder::new(),
            value: Int64Builder::new(),
            samples_appended: 0,
            appended_by_time: HashMap::new(),
            since: None,
            min_time: i64::MAX,
            max_time: i64::MIN,
        }
    }

    pub fn dicts(&self) -> &Dicts {
        &self.interner.dicts
    }

    pub fn rows(&self) -> usize {
        self.series.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows() == 0
    }

    /// Estimated memory of the head, for its byte budget.
    pub fn bytes(&self) -> usize {
        self.interner.bytes + self.rows() * ROW_BYTES
    }

    pub fn push_row(&mut self, series: u32, time: i64, stack: u32, labels: u32, value: i64) {
        self.series.append_value(series);
        self.time.append_value(time);
        self.stack.append_value(stack);
        self.labels.append_value(labels);
        self.value.append_value(value);
        self.min_time = self.min_time.min(time);
        self.max_time = self.max_time.max(time);
    }

    /// Adds a batch, merging its samples with equal stack and labels into one row.
    pub fn append(&mut self, batch: &Batch) -> Result<()> {
        let mut series_labels = batch.series.clone();
        series_labels.sort();
        if series_labels.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(StoreError::InvalidBatch(
                "a series label key appears twice".to_string(),
            ));
        }
        let nfunctions = batch.functions.len();
        for sample in &batch.samples {
            if let Some(bad) = sample.stack.iter().find(|&&f| f as usize >= nfunctions) {
                return Err(StoreError::InvalidBatch(format!(
                    "a stack refers to function {bad}, but the batch lists {nfunctions}"
                )));
            }
        }
        let interner = &mut self.interner;
        let series = interner.intern_series(&Arc::new(Series {
            profile_type: batch.profile_type.clone(),
            labels: series_labels,
        }))?;
        let mut function_ids = Vec::with_capacity(nfunctions);
        for function in &batch.functions {
            function_ids.push(interner.intern_function(function)?);
        }
        let mut rows: IdMap<(u32, u32), i64> = IdMap::default();
        let mut stack = Vec::new();
        let mut sorted = Vec::new();
        for sample in &batch.samples {
            stack.clear();
            stack.extend(sample.stack.iter().map(|&f| function_ids[f as usize]));
            let stack_id = interner.intern_stack(&stack)?;
            // The agent's labels come sorted (thread_id < thread_name < type): no copy then.
            let labels_id = if sample.labels.is_sorted() {
                interner.intern_label_set(&sample.labels)?
            } else {
                sorted.clone_from(&sample.labels);
                sorted.sort();
                interner.intern_label_set(&sorted)?
            };
            let sum = rows.entry((stack_id, labels_id)).or_insert(0);
            *sum = sum.saturating_add(sample.value);
        }
        let mut rows: Vec<_> = rows.into_iter().collect();
        rows.sort_unstable();
        for ((stack_id, labels_id), value) in rows {
            self.push_row(
                series,
                batch.timestamp_unix_nanos,
                stack_id,
                labels_id,
                value,
            );
        }
        self.samples_appended += batch.samples.len() as u64;
        *self
            .appended_by_time
            .entry(batch.timestamp_unix_nanos)
            .or_insert(0) += batch.samples.len() as u64;
        self.since.get_or_insert_with(Instant::now);
        Ok(())
    }

    /// Re-interns the rows of a block (validated by the reader) into this head: compaction.
    pub fn absorb(
        &mut self,
        dicts: &Dicts,
        samples: &[RecordBatch],
        samples_appended: u64,
    ) -> Result<()> {
        let mut remap = Remap::new(dicts);
        for batch in samples {
            let Some(c) = SampleColumns::of(batch) else {
                continue;
            };
            for i in 0..batch.num_rows() {
                let series = remap.series(&mut self.interner, c.series.value(i))?;
                let stack = remap.stack(&mut self.interner, c.stack.value(i))?;
                let labels = remap.label_set(&mut self.interner, c.labels.value(i))?;
                self.push_row(series, c.time.value(i), stack, labels, c.value.value(i));
            }
        }
        self.samples_appended += samples_appended;
        Ok(())
    }

    /// The rows so far as one Arrow batch, leaving the head as it is.
    pub fn record_batch(&self) -> RecordBatch {
        RecordBatch::try_new(
            samples_schema(),
            vec![
                Arc::new(self.series.finish_cloned()),
                Arc::new(self.time.finish_cloned()),
                Arc::new(self.stack.finish_cloned()),
                Arc::new(self.labels.finish_cloned()),
                Arc::new(self.value.finish_cloned()),
            ],
        )
        .expect("head columns match the samples schema and have equal lengths")
    }
}
