//! Flame-graph queries: the selected samples merged as one call tree and cut to the nodes a
//! flame graph can show, without spelling out every stack.
//!
//! [`super::Store::profile`] translates every stack node of every block into one dictionary
//! and returns one sample per distinct stack: with millions of distinct stacks that is millions
//! of vectors nobody will look at one by one, since a flame graph shows a few thousand boxes.
//! Here each source (a block or the head) is folded in its own ids instead:
//!
//! 1. its selected rows are summed per stack node (`self`), then carried up to the callers
//!    (`total`); parents come before children in every source, so one backward pass does it;
//! 2. only nodes whose total reaches `source total / (max_nodes × PRUNE_FACTOR)` are merged into
//!    the answer's tree, keyed by (parent, function): a node's total never exceeds its caller's,
//!    so the kept nodes of a source are a tree rooted at its roots;
//! 3. once every source is in, the answer keeps its `max_nodes` largest nodes (as Pyroscope's
//!    `max_nodes`), and what was cut below a kept node shows as a child `other`.
//!
//! Totals of the kept nodes are exact except for what sources cut in step 2: a node misses at
//! most `total / (max_nodes × PRUNE_FACTOR)` of the answer's total over all sources, a quarter
//! of the smallest box a `max_nodes` flame graph could draw; that mass stays in its caller
//! and shows under `other`.

use std::collections::HashMap;

use arrow::record_batch::RecordBatch;

use super::error::Result;
use super::head::{Dicts, IdMap, NO_PARENT};
use super::model::Query;
use super::query::{for_each_row, merged_profile, Selection, SKIP};
use crate::profile::{Function, Labels, Profile, Sample, ValueType};

/// How much finer than the answer's cut a source's cut is (see the module docs).
const PRUNE_FACTOR: i64 = 4;

/// The name of the node that stands for the callees cut below a kept node.
pub const OTHER_FRAME: &str = "other";

/// Parent id of the answer's top-level nodes.
const ROOT: u32 = u32::MAX;
const UNMAPPED: u32 = u32::MAX;

/// The answer's call tree while sources are added; node ids in insertion order, so parents come
/// before children.
#[derive(Default)]
pub(crate) struct TreeMerge {
    function_ids: HashMap<Function, u32>,
    functions: Vec<Function>,
    node_ids: IdMap<(u32, u32), u32>,
    parent: Vec<u32>,
    function: Vec<u32>,
    self_value: Vec<i64>,
    total: Vec<i64>,
    /// Samples with an empty stack.
    unknown: i64,
    /// Everything added, kept nodes or not.
    grand_total: i64,
    /// Per-source buffers, kept so their capacity is reused.
    scratch: Scratch,
}

#[derive(Default)]
struct Scratch {
    self_value: Vec<i64>,
    total: Vec<i64>,
    ids: Vec<u32>,
    functions: Vec<u32>,
}

impl TreeMerge {
    fn intern_function(&mut self, function: &Function) -> u32 {
        if let Some(&id) = self.function_ids.get(function) {
            return id;
        }
        let id = self.functions.len() as u32;
        self.functions.push(function.clone());
        self.function_ids.insert(function.clone(), id);
        id
    }

    /// The node for `function` called from `parent`, its values added to.
    fn add_node(&mut self, parent: u32, function: u32, self_value: i64, total: i64) -> u32 {
        let next = self.parent.len() as u32;
        let id = *self.node_ids.entry((parent, function)).or_insert(next);
        if id == next {
            self.parent.push(parent);
            self.function.push(function);
            self.self_value.push(0);
            self.total.push(0);
        }
        let i = id as usize;
        self.self_value[i] = self.self_value[i].saturating_add(self_value);
        self.total[i] = self.total[i].saturating_add(total);
        id
    }

    /// Adds the rows of one source (`dicts` and the `rows` that refer to them) the query selects.
    pub fn add(
        &mut self,
        dicts: &Dicts,
        rows: &[RecordBatch],
        query: &Query,
        max_nodes: usize,
    ) -> Result<()> {
        let labels = (!query.sample_matchers.is_empty()).then(|| {
            let keep = |set: &Vec<_>| {
                if query.sample_labels_match(set) {
                    0
                } else {
                    SKIP
                }
            };
            dicts.label_sets.iter().map(keep).collect()
        });
        let selection = Selection::new(&dicts.series, query, labels);
        let mut scratch = std::mem::take(&mut self.scratch);
        let nodes = dicts.stacks.len();
        let self_value = &mut scratch.self_value;
        self_value.clear();
        self_value.resize(nodes, 0);
        let mut unknown = 0i64;
        for_each_row(&selection, rows, query, |_, stack, _, value| {
            match self_value.get_mut(stack as usize) {
                Some(sum) => *sum = sum.saturating_add(value),
                // EMPTY_STACK (ids were checked when the block was read).
                None => unknown = unknown.saturating_add(value),
            }
            Ok(())
        })?;
        let total = &mut scratch.total;
        total.clear();
        total.extend_from_slice(self_value);
        let mut source_total = unknown;
        for i in (0..nodes).rev() {
            match dicts.stacks[i].parent {
                NO_PARENT => source_total = source_total.saturating_add(total[i]),
                p => total[p as usize] = total[p as usize].saturating_add(total[i]),
            }
        }
        self.unknown = self.unknown.saturating_add(unknown);
        self.grand_total = self.grand_total.saturating_add(source_total);
        let cut = (source_total / (max_nodes as i64).saturating_mul(PRUNE_FACTOR)).max(1);
        let ids = &mut scratch.ids;
        ids.clear();
        ids.resize(nodes, UNMAPPED);
        let functions = &mut scratch.functions;
        functions.clear();
        functions.resize(dicts.functions.len(), UNMAPPED);
        for i in 0..nodes {
            if total[i] < cut {
                continue;
            }
            let node = dicts.stacks[i];
            let parent = match node.parent {
                NO_PARENT => ROOT,
                // A kept node's caller has at least its total, so it is kept too.
                p => match ids[p as usize] {
                    UNMAPPED => continue,
                    mapped => mapped,
                },
            };
            let Some(slot) = functions.get_mut(node.function as usize) else {
                continue;
            };
            if *slot == UNMAPPED {
                *slot = self.intern_function(&dicts.functions[node.function as usize]);
            }
            ids[i] = self.add_node(parent, *slot, self_value[i], total[i]);
        }
        self.scratch = scratch;
        Ok(())
    }

    /// Adds another merge's tree: the partial answers of one query's threads.
    pub fn absorb(&mut self, other: TreeMerge) {
        let mut ids = Vec::with_capacity(other.parent.len());
        for i in 0..other.parent.len() {
            let parent = match other.parent[i] {
                ROOT => ROOT,
                p => ids[p as usize],
            };
            let function = self.intern_function(&other.functions[other.function[i] as usize]);
            ids.push(self.add_node(parent, function, other.self_value[i], other.total[i]));
        }
        self.unknown = self.unknown.saturating_add(other.unknown);
        self.grand_total = self.grand_total.saturating_add(other.grand_total);
    }

    /// The tree's `max_nodes` largest nodes as a profile: one sample per kept node with its
    /// self value, one under a frame [`OTHER_FRAME`] for what was cut below a node (or at the
    /// top), and one with an empty stack for samples without frames.
    pub fn build(
        self,
        max_nodes: usize,
        value_type: ValueType,
        start_unix_nanos: i64,
        duration_nanos: i64,
    ) -> Profile {
        let count = self.parent.len();
        let keep = kept_nodes(&self.total, max_nodes);
        let mut functions = Vec::new();
        let mut index = vec![u32::MAX; self.functions.len()];
        let mut function_of = |f: u32| -> u32 {
            let slot = &mut index[f as usize];
            if *slot == u32::MAX {
                *slot = functions.len() as u32;
                functions.push(self.functions[f as usize].clone());
            }
            *slot
        };
        // Per kept node: the total of its kept children, and its stack in the answer.
        let mut kept_children = vec![0i64; count];
        let mut top_level = 0i64;
        let mut stacks: Vec<Vec<u32>> = vec![Vec::new(); count];
        for i in (0..count).filter(|&i| keep[i]) {
            let function = function_of(self.function[i]);
            let mut stack = vec![function];
            match self.parent[i] {
                ROOT => top_level = top_level.saturating_add(self.total[i]),
                p => {
                    let p = p as usize;
                    kept_children[p] = kept_children[p].saturating_add(self.total[i]);
                    stack.extend_from_slice(&stacks[p]);
                }
            }
            stacks[i] = stack;
        }
        let mut other_index = None;
        let mut other_frame = |functions: &mut Vec<Function>| {
            *other_index.get_or_insert_with(|| {
                functions.push(Function {
                    name: OTHER_FRAME.to_string(),
                    module: String::new(),
                });
                functions.len() as u32 - 1
            })
        };
        let no_labels: Labels = Labels::from(Vec::new());
        let sample = |stack: Vec<u32>, value: i64| Sample {
            stack,
            values: vec![value],
            labels: no_labels.clone(),
        };
        let mut samples = Vec::new();
        for i in (0..count).filter(|&i| keep[i]) {
            let stack = std::mem::take(&mut stacks[i]);
            let cut = self.total[i] - self.self_value[i] - kept_children[i];
            if cut > 0 {
                let mut below = vec![other_frame(&mut functions)];
                below.extend_from_slice(&stack);
                samples.push(sample(below, cut));
            }
            if self.self_value[i] > 0 {
                samples.push(sample(stack, self.self_value[i]));
            }
        }
        let cut_at_top = self.grand_total - self.unknown - top_level;
        if cut_at_top > 0 {
            samples.push(sample(vec![other_frame(&mut functions)], cut_at_top));
        }
        if self.unknown > 0 {
            samples.push(sample(Vec::new(), self.unknown));
        }
        merged_profile(
            value_type,
            functions,
            samples,
            start_unix_nanos,
            duration_nanos,
        )
    }
}

/// Which nodes a `max_nodes` answer keeps: the largest totals, at most `max_nodes` of them (fewer
/// when ties at the cut would exceed it). A node's total never exceeds its caller's, so the kept
/// nodes' callers are kept too.
fn kept_nodes(totals: &[i64], max_nodes: usize) -> Vec<bool> {
    if totals.len() <= max_nodes {
        return vec![true; totals.len()];
    }
    let mut sorted = totals.to_vec();
    let (_, &mut nth, _) = sorted.select_nth_unstable_by(max_nodes - 1, |a, b| b.cmp(a));
    let at_least = totals.iter().filter(|&&t| t >= nth).count();
    totals
        .iter()
        .map(|&t| {
            if at_least <= max_nodes {
                t >= nth
            } else {
                t > nth
            }
        })
        .collect()
}
