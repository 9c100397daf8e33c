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

use arrow::record_batch::RecordBatch;
use profile::{CallTree, ValueType};

use super::error::Result;
use super::head::{Dicts, NO_PARENT};
use super::model::Query;
use super::query::{for_each_row, Selection, SKIP};

/// How much finer than the answer's cut a source's cut is (see the module docs).
const PRUNE_FACTOR: i64 = 4;

const UNMAPPED: u32 = u32::MAX;

/// The answer's call tree while sources are added.
pub(crate) struct TreeMerge {
    tree: CallTree,
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
    pub fn new(value_type: &ValueType) -> Self {
        TreeMerge {
            tree: CallTree::new(value_type),
            scratch: Scratch::default(),
        }
    }

    /// Adds the rows of one source (`dicts` and the `rows` that refer to them) the query selects,
    /// but none in the `excluded` spans.
    pub fn add(
        &mut self,
        dicts: &Dicts,
        rows: &[RecordBatch],
        query: &Query,
        max_nodes: usize,
        excluded: &[(i64, i64)],
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
        let selection = Selection::new(&dicts.series, query, labels).excluding(excluded);
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
        if unknown != 0 {
            self.tree.add_unknown(unknown);
        }
        self.tree.add_to_root(source_total.saturating_sub(unknown));
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
                NO_PARENT => CallTree::ROOT,
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
                *slot = self
                    .tree
                    .intern_function(&dicts.functions[node.function as usize]);
            }
            ids[i] = self.tree.add(parent, *slot, self_value[i], total[i]);
        }
        self.scratch = scratch;
        Ok(())
    }

    /// Adds another merge's tree: the partial answers of one query's threads.
    pub fn absorb(&mut self, other: TreeMerge) {
        self.tree.merge(&other.tree);
    }

    /// The tree's `max_nodes` largest nodes ([`CallTree::cut`]), over the query's range.
    pub fn build(self, max_nodes: usize, start_unix_nanos: i64, duration_nanos: i64) -> CallTree {
        let mut cut = self.tree.cut(max_nodes);
        cut.set_time_range(start_unix_nanos, duration_nanos);
        cut
    }
}
