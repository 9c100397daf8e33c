//! The in-memory head block: dictionaries being interned and sample rows in Arrow builders.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, ArrayBuilder, Int64Array, Int64Builder, UInt32Array, UInt32Builder};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;

use super::error::{Result, StoreError};
use super::model::{Batch, Series};
use crate::profile::{Function, LabelValue};

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
    pub series: Vec<Series>,
}

impl Dicts {
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

/// Rough per-row and per-entry costs for the head's byte budget, hash maps included.
const ROW_BYTES: usize = 28;
const ENTRY_OVERHEAD: usize = 48;

/// Samples not yet on disk.
#[derive(Debug)]
pub(crate) struct Head {
    pub dicts: Dicts,
    function_ids: HashMap<Function, u32>,
    node_ids: HashMap<StackNode, u32>,
    label_set_ids: HashMap<Vec<(String, LabelValue)>, u32>,
    series_ids: HashMap<Series, u32>,
    series: UInt32Builder,
    time: Int64Builder,
    stack: UInt32Builder,
    labels: UInt32Builder,
    value: Int64Builder,
    pub samples_appended: u64,
    /// Appended samples per batch timestamp, to credit each partition's block.
    pub appended_by_time: HashMap<i64, u64>,
    pub bytes: usize,
    /// When the oldest unflushed batch arrived.
    pub since: Option<Instant>,
    pub min_time: i64,
    pub max_time: i64,
}

impl Head {
    pub fn new() -> Self {
        Head {
            dicts: Dicts::default(),
            function_ids: HashMap::new(),
            node_ids: HashMap::new(),
            label_set_ids: HashMap::new(),
            series_ids: HashMap::new(),
            series: UInt32Builder::new(),
            time: Int64Builder::new(),
            stack: UInt32Builder::new(),
            labels: UInt32Builder::new(),
            value: Int64Builder::new(),
            samples_appended: 0,
            appended_by_time: HashMap::new(),
            bytes: 0,
            since: None,
            min_time: i64::MAX,
            max_time: i64::MIN,
        }
    }

    pub fn rows(&self) -> usize {
        self.series.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows() == 0
    }

    fn id_for(len: usize, what: &str) -> Result<u32> {
        u32::try_from(len)
            .ok()
            .filter(|&id| id != u32::MAX)
            .ok_or_else(|| StoreError::InvalidBatch(format!("more than 2^32-1 {what} in one head")))
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

    /// The stack id of function ids given leaf first.
    pub fn intern_stack(&mut self, leaf_first: &[u32]) -> Result<u32> {
        let mut parent = NO_PARENT;
        for &function in leaf_first.iter().rev() {
            let node = StackNode { parent, function };
            parent = match self.node_ids.get(&node) {
                Some(&id) => id,
                None => {
                    let id = Self::id_for(self.dicts.stacks.len(), "stack nodes")?;
                    self.bytes += ENTRY_OVERHEAD;
                    self.dicts.stacks.push(node);
                    self.node_ids.insert(node, id);
                    id
                }
            };
        }
        Ok(if leaf_first.is_empty() {
            EMPTY_STACK
        } else {
            parent
        })
    }

    pub fn intern_label_set(&mut self, set: Vec<(String, LabelValue)>) -> Result<u32> {
        if let Some(&id) = self.label_set_ids.get(&set) {
            return Ok(id);
        }
        let id = Self::id_for(self.dicts.label_sets.len(), "label sets")?;
        self.bytes +=
            ENTRY_OVERHEAD * (1 + set.len()) + set.iter().map(|(k, _)| k.len() + 16).sum::<usize>();
        self.dicts.label_sets.push(set.clone());
        self.label_set_ids.insert(set, id);
        Ok(id)
    }

    pub fn intern_series(&mut self, series: Series) -> Result<u32> {
        if let Some(&id) = self.series_ids.get(&series) {
            return Ok(id);
        }
        let id = Self::id_for(self.dicts.series.len(), "series")?;
        self.bytes += ENTRY_OVERHEAD * 2;
        self.dicts.series.push(series.clone());
        self.series_ids.insert(series, id);
        Ok(id)
    }

    pub fn push_row(&mut self, series: u32, time: i64, stack: u32, labels: u32, value: i64) {
        self.series.append_value(series);
        self.time.append_value(time);
        self.stack.append_value(stack);
        self.labels.append_value(labels);
        self.value.append_value(value);
        self.bytes += ROW_BYTES;
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
        let series = self.intern_series(Series {
            profile_type: batch.profile_type.clone(),
            labels: series_labels,
        })?;
        let mut function_ids = Vec::with_capacity(nfunctions);
        for function in &batch.functions {
            function_ids.push(self.intern_function(function)?);
        }
        let mut rows: HashMap<(u32, u32), i64> = HashMap::new();
        let mut stack = Vec::new();
        for sample in &batch.samples {
            stack.clear();
            stack.extend(sample.stack.iter().map(|&f| function_ids[f as usize]));
            let stack_id = self.intern_stack(&stack)?;
            let mut labels = sample.labels.clone();
            labels.sort();
            let labels_id = self.intern_label_set(labels)?;
            *rows.entry((stack_id, labels_id)).or_insert(0) += sample.value;
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
        let mut functions: Vec<Option<u32>> = vec![None; dicts.functions.len()];
        let mut stacks: HashMap<u32, u32> = HashMap::new();
        let mut label_sets: Vec<Option<u32>> = vec![None; dicts.label_sets.len()];
        let mut series: Vec<Option<u32>> = vec![None; dicts.series.len()];
        let mut ids = Vec::new();
        for batch in samples {
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
            for i in 0..batch.num_rows() {
                let (s, st, l) = (s.value(i) as usize, st.value(i), l.value(i) as usize);
                let series_id = match series[s] {
                    Some(id) => id,
                    None => *series[s].insert(self.intern_series(dicts.series[s].clone())?),
                };
                let stack_id = match stacks.get(&st) {
                    Some(&id) => id,
                    None => {
                        dicts.resolve(st, &mut ids);
                        for f in ids.iter_mut() {
                            let slot = &mut functions[*f as usize];
                            *f = match *slot {
                                Some(id) => id,
                                None => *slot
                                    .insert(self.intern_function(&dicts.functions[*f as usize])?),
                            };
                        }
                        let id = self.intern_stack(&ids)?;
                        stacks.insert(st, id);
                        id
                    }
                };
                let labels_id = match label_sets[l] {
                    Some(id) => id,
                    None => {
                        *label_sets[l].insert(self.intern_label_set(dicts.label_sets[l].clone())?)
                    }
                };
                self.push_row(series_id, t.value(i), stack_id, labels_id, v.value(i));
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
