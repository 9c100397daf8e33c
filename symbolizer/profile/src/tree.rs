//! The call tree a flame graph draws: one node per function per calling path, with the value of
//! the samples ending in it (`self`) and passing through it (`total`).
//!
//! It is the one representation of a flame graph: the store answers flame-graph queries with one
//! (cut to the nodes a flame graph can show), the querier merges them, and the exporters write it
//! as the web UI's JSON, Pyroscope's flamebearer levels, or back into a [`Profile`] for the file
//! formats.
//!
//! - Node 0 is the root (`total`); its total is everything the tree stands for. A node's children
//!   may account for less than its `total - self`: that difference is what a cut (or a source
//!   that pruned small nodes before merging) left out, and [`CallTree::cut`] shows it as a child
//!   [`OTHER_FRAME`].
//! - Samples with an empty stack count under a child [`UNKNOWN_FRAME`] of the root.
//! - A differential tree (from [`CallTree::from_profile`] with a base) carries a second pair of
//!   values per node, the base side's.

use std::collections::HashMap;

use crate::ids::IdMap;
use crate::labels::{OTHER_FRAME, UNKNOWN_FRAME};
use crate::model::{Function, Labels, Profile, Sample, ValueType};

/// Index of a node in a [`CallTree`].
pub type NodeId = u32;

/// The frame of a node: an index into the tree's functions, or one of these.
type FrameId = u32;
/// The root's frame.
const ROOT_FRAME: FrameId = u32::MAX;
/// The frame of samples with an empty stack.
const UNKNOWN: FrameId = u32::MAX - 1;

/// Self and total value of a node for one side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeValues {
    pub self_value: i64,
    pub total: i64,
}

impl NodeValues {
    fn add(&mut self, self_value: i64, total: i64) {
        self.self_value = self.self_value.saturating_add(self_value);
        self.total = self.total.saturating_add(total);
    }
}

/// A call tree; see the module documentation.
#[derive(Debug, Clone)]
pub struct CallTree {
    /// The unit of the values (`nanoseconds`, `count`, `bytes`).
    unit: String,
    /// What the values measure (`cpu`, …), for [`CallTree::to_profile`].
    kind: String,
    start_unix_nanos: i64,
    duration_nanos: i64,
    functions: Vec<Function>,
    function_ids: HashMap<Function, FrameId>,
    /// (parent, frame) → node.
    node_ids: IdMap<(NodeId, FrameId), NodeId>,
    parent: Vec<NodeId>,
    frame: Vec<FrameId>,
    values: Vec<NodeValues>,
    /// The base side's values of a differential tree, else empty.
    base: Vec<NodeValues>,
}

impl CallTree {
    /// The root's id.
    pub const ROOT: NodeId = 0;

    /// An empty tree of values of `value_type`.
    pub fn new(value_type: &ValueType) -> CallTree {
        CallTree {
            unit: value_type.unit.clone(),
            kind: value_type.kind.clone(),
            start_unix_nanos: 0,
            duration_nanos: 0,
            functions: Vec::new(),
            function_ids: HashMap::new(),
            node_ids: IdMap::default(),
            parent: vec![NodeId::MAX],
            frame: vec![ROOT_FRAME],
            values: vec![NodeValues::default()],
            base: Vec::new(),
        }
    }

    /// The tree of one sample type of a profile; with `base`, a differential tree whose second
    /// values are sample type `base`'s. Samples whose values are all 0 are left out. The
    /// indices must be valid sample types of the profile, and its stacks valid function indices.
    pub fn from_profile(profile: &Profile, shown: usize, base: Option<usize>) -> CallTree {
        let value_type = &profile.sample_types[shown];
        let mut tree = CallTree::new(value_type);
        tree.set_time_range(profile.start_unix_nanos, profile.duration_nanos);
        if base.is_some() {
            tree.base.push(NodeValues::default());
        }
        let frames: Vec<FrameId> = profile
            .functions
            .iter()
            .map(|f| tree.intern_function(f))
            .collect();
        for sample in &profile.samples {
            let value = sample.values[shown];
            let base_value = base.map_or(0, |b| sample.values[b]);
            if value == 0 && base_value == 0 {
                continue;
            }
            let mut at = CallTree::ROOT;
            tree.add_values(at, 0, value, 0, base_value);
            let empty = sample.stack.is_empty().then_some(UNKNOWN);
            let path = empty
                .into_iter()
                .chain(sample.stack.iter().rev().map(|&f| frames[f as usize]));
            for frame in path {
                at = tree.child(at, frame);
                tree.add_values(at, 0, value, 0, base_value);
            }
            tree.add_values(at, value, 0, base_value, 0);
        }
        tree
    }

    pub fn set_time_range(&mut self, start_unix_nanos: i64, duration_nanos: i64) {
        self.start_unix_nanos = start_unix_nanos;
        self.duration_nanos = duration_nanos;
    }

    /// The index of a function among the tree's frames, added on first use.
    pub fn intern_function(&mut self, function: &Function) -> u32 {
        if let Some(&id) = self.function_ids.get(function) {
            return id;
        }
        let id = self.functions.len() as FrameId;
        self.functions.push(function.clone());
        self.function_ids.insert(function.clone(), id);
        id
    }

    /// Adds to the node of `function` (from [`CallTree::intern_function`]) called from `parent`,
    /// created on first use; returns it. The values are added to that node only: a caller that
    /// adds a whole source's nodes also adds its grand total with [`CallTree::add_to_root`].
    pub fn add(&mut self, parent: NodeId, function: u32, self_value: i64, total: i64) -> NodeId {
        let node = self.child(parent, function);
        self.values[node as usize].add(self_value, total);
        node
    }

    /// Adds to the root's total: everything a source stood for, whether or not its nodes
    /// were all added.
    pub fn add_to_root(&mut self, total: i64) {
        self.values[0].add(0, total);
    }

    /// Adds samples with an empty stack (their value counts in the root's total too).
    pub fn add_unknown(&mut self, value: i64) {
        let node = self.child(CallTree::ROOT, UNKNOWN);
        self.values[node as usize].add(value, value);
        self.add_to_root(value);
    }

    /// Adds another tree (of the same unit) node by node, e.g. the partial answers of one query's
    /// threads, or the trees of several selections.
    pub fn merge(&mut self, other: &CallTree) {
        if other.is_diff() && !self.is_diff() {
            self.base = vec![NodeValues::default(); self.values.len()];
        }
        let frames: Vec<FrameId> = other
            .functions
            .iter()
            .map(|f| self.intern_function(f))
            .collect();
        let mut ids = Vec::with_capacity(other.len());
        ids.push(CallTree::ROOT);
        for i in 1..other.len() {
            let frame = match other.frame[i] {
                UNKNOWN => UNKNOWN,
                f => frames[f as usize],
            };
            ids.push(self.child(ids[other.parent[i] as usize], frame));
        }
        for (i, &id) in ids.iter().enumerate() {
            let v = other.values[i];
            let b = other.base.get(i).copied().unwrap_or_default();
            self.add_values(id, v.self_value, v.total, b.self_value, b.total);
        }
        self.start_unix_nanos = self.start_unix_nanos.min(other.start_unix_nanos);
    }

    /// The tree cut to its `max_nodes` largest nodes below the root (fewer when ties at the cut
    /// would exceed it): what was cut below a kept node, or at the top, shows as a child
    /// [`OTHER_FRAME`] (together with any `other` a source already had there), and empty
    /// stacks stay under [`UNKNOWN_FRAME`]. A node's total never exceeds its caller's, so the
    /// kept nodes form a tree. Totals are unchanged. Only for trees that are not differential.
    pub fn cut(&self, max_nodes: usize) -> CallTree {
        let keep = self.kept_nodes(max_nodes);
        let mut cut = CallTree::new(&self.value_type());
        cut.set_time_range(self.start_unix_nanos, self.duration_nanos);
        cut.values[0] = self.values[0];
        let mut ids = vec![NodeId::MAX; self.len()];
        ids[0] = CallTree::ROOT;
        // What each kept node's kept children and self account for, to find what was cut.
        let mut accounted: Vec<i64> = self.values.iter().map(|v| v.self_value).collect();
        for i in 1..self.len() {
            if !keep[i] {
                continue;
            }
            let parent = self.parent[i] as usize;
            accounted[parent] = accounted[parent].saturating_add(self.values[i].total);
            let frame = match self.frame[i] {
                UNKNOWN => UNKNOWN,
                f => cut.intern_function(&self.functions[f as usize]),
            };
            ids[i] = cut.child(ids[parent], frame);
            cut.values[ids[i] as usize] = self.values[i];
        }
        let other = Function {
            name: OTHER_FRAME.to_string(),
            module: String::new(),
        };
        for i in (0..self.len()).filter(|&i| keep[i]) {
            let missing = self.values[i].total.saturating_sub(accounted[i]);
            if missing > 0 {
                let frame = cut.intern_function(&other);
                cut.add(ids[i], frame, missing, missing);
            }
        }
        cut
    }

    /// Which nodes [`CallTree::cut`] keeps: the root, the empty stacks' node, and the largest
    /// totals among the others, at most `max_nodes` of them.
    fn kept_nodes(&self, max_nodes: usize) -> Vec<bool> {
        let counted = |i: usize| i > 0 && self.frame[i] != UNKNOWN;
        let totals: Vec<i64> = (0..self.len())
            .filter(|&i| counted(i))
            .map(|i| self.values[i].total)
            .collect();
        if totals.len() <= max_nodes {
            return vec![true; self.len()];
        }
        let nth = match max_nodes {
            0 => i64::MAX,
            n => {
                let mut sorted = totals.clone();
                *sorted.select_nth_unstable_by(n - 1, |a, b| b.cmp(a)).1
            }
        };
        let at_least = totals.iter().filter(|&&t| t >= nth).count();
        (0..self.len())
            .map(|i| {
                let t = self.values[i].total;
                !counted(i)
                    || (max_nodes > 0
                        && if at_least <= max_nodes {
                            t >= nth
                        } else {
                            t > nth
                        })
            })
            .collect()
    }

    /// The tree as a profile of one sample type: one sample per node with a self value (its stack
    /// the node's path), one under a frame [`OTHER_FRAME`] for what a node's children leave
    /// unaccounted, and one with an empty stack for [`UNKNOWN_FRAME`]; no sample labels
    /// ([`Profile::of_totals`]).
    pub fn to_profile(&self) -> Profile {
        let value_type = self.value_type();
        let mut functions = Vec::new();
        let mut index = vec![u32::MAX; self.functions.len()];
        let mut function_of = |frame: FrameId, functions: &mut Vec<Function>| {
            let slot = &mut index[frame as usize];
            if *slot == u32::MAX {
                *slot = functions.len() as u32;
                functions.push(self.functions[frame as usize].clone());
            }
            *slot
        };
        let mut accounted: Vec<i64> = self.values.iter().map(|v| v.self_value).collect();
        for i in 1..self.len() {
            let parent = self.parent[i] as usize;
            accounted[parent] = accounted[parent].saturating_add(self.values[i].total);
        }
        let no_labels = Labels::from(Vec::new());
        let sample = |stack: Vec<u32>, value: i64| Sample {
            stack,
            values: vec![value],
            labels: no_labels.clone(),
        };
        let mut stacks: Vec<Vec<u32>> = vec![Vec::new(); self.len()];
        let mut samples = Vec::new();
        let mut other_index = None;
        for i in 0..self.len() {
            let mut stack = Vec::new();
            if i > 0 && self.frame[i] != UNKNOWN {
                stack.push(function_of(self.frame[i], &mut functions));
                stack.extend_from_slice(&stacks[self.parent[i] as usize]);
            }
            let missing = self.values[i].total.saturating_sub(accounted[i]);
            if missing > 0 {
                let other = *other_index.get_or_insert_with(|| {
                    functions.push(Function {
                        name: OTHER_FRAME.to_string(),
                        module: String::new(),
                    });
                    functions.len() as u32 - 1
                });
                let mut below = vec![other];
                below.extend_from_slice(&stack);
                samples.push(sample(below, missing));
            }
            if self.values[i].self_value > 0 {
                samples.push(sample(stack.clone(), self.values[i].self_value));
            }
            stacks[i] = stack;
        }
        Profile::of_totals(
            value_type,
            functions,
            samples,
            self.start_unix_nanos,
            self.duration_nanos,
        )
    }

    /// The node of `frame` called from `parent`, created (with no values) on first use.
    fn child(&mut self, parent: NodeId, frame: FrameId) -> NodeId {
        let next = self.parent.len() as NodeId;
        let id = *self.node_ids.entry((parent, frame)).or_insert(next);
        if id == next {
            self.parent.push(parent);
            self.frame.push(frame);
            self.values.push(NodeValues::default());
            if self.is_diff() {
                self.base.push(NodeValues::default());
            }
        }
        id
    }

    fn add_values(&mut self, node: NodeId, self_value: i64, total: i64, base_self: i64, base: i64) {
        self.values[node as usize].add(self_value, total);
        if let Some(b) = self.base.get_mut(node as usize) {
            b.add(base_self, base);
        }
    }

    fn value_type(&self) -> ValueType {
        ValueType::new(&self.kind, &self.unit)
    }

    /// Nodes, the root included.
    pub fn len(&self) -> usize {
        self.parent.len()
    }

    /// Whether the tree has nothing but its root.
    pub fn is_empty(&self) -> bool {
        self.len() == 1
    }

    pub fn unit(&self) -> &str {
        &self.unit
    }

    pub fn start_unix_nanos(&self) -> i64 {
        self.start_unix_nanos
    }

    pub fn duration_nanos(&self) -> i64 {
        self.duration_nanos
    }

    /// Whether nodes carry a base side ([`CallTree::base_values`]).
    pub fn is_diff(&self) -> bool {
        !self.base.is_empty()
    }

    /// Everything the tree stands for: the root's total.
    pub fn total(&self) -> i64 {
        self.values[0].total
    }

    pub fn values(&self, node: NodeId) -> NodeValues {
        self.values[node as usize]
    }

    /// The base side's values of a differential tree (zero otherwise).
    pub fn base_values(&self, node: NodeId) -> NodeValues {
        self.base.get(node as usize).copied().unwrap_or_default()
    }

    /// The node's caller; `None` for the root.
    pub fn parent(&self, node: NodeId) -> Option<NodeId> {
        (node != CallTree::ROOT).then(|| self.parent[node as usize])
    }

    /// The name shown for a node: `total` for the root, [`UNKNOWN_FRAME`] for empty stacks.
    pub fn name(&self, node: NodeId) -> &str {
        match self.frame[node as usize] {
            ROOT_FRAME => "total",
            UNKNOWN => UNKNOWN_FRAME,
            f => &self.functions[f as usize].name,
        }
    }

    /// The module of a node's function; empty for the root, unknown stacks and `other`.
    pub fn module(&self, node: NodeId) -> &str {
        match self.frame[node as usize] {
            ROOT_FRAME | UNKNOWN => "",
            f => &self.functions[f as usize].module,
        }
    }

    /// The children of every node, each list sorted by total, largest first (then by the base
    /// side's total, name and module), so that equal trees are laid out alike.
    pub fn children(&self) -> Vec<Vec<NodeId>> {
        let mut children: Vec<Vec<NodeId>> = vec![Vec::new(); self.len()];
        for i in 1..self.len() {
            children[self.parent[i] as usize].push(i as NodeId);
        }
        for list in &mut children {
            list.sort_by(|&a, &b| {
                (self.values(b).total, self.base_values(b).total)
                    .cmp(&(self.values(a).total, self.base_values(a).total))
                    .then_with(|| self.name(a).cmp(self.name(b)))
                    .then_with(|| self.module(a).cmp(self.module(b)))
            });
        }
        children
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ProfileBuilder;

    fn profile(samples: &[(&[&str], i64)]) -> Profile {
        let mut b = ProfileBuilder::new(
            vec![ValueType::new("cpu", "nanoseconds")],
            ValueType::new("cpu", "nanoseconds"),
            1,
        );
        for (stack, value) in samples {
            let stack = stack
                .iter()
                .map(|name| {
                    b.function(Function {
                        name: name.to_string(),
                        module: "App.dll".into(),
                    })
                })
                .collect();
            b.add(stack, Vec::new(), &[*value]);
        }
        b.build()
    }

    fn find(tree: &CallTree, path: &[&str]) -> NodeId {
        let children = tree.children();
        let mut at = CallTree::ROOT;
        for name in path {
            at = *children[at as usize]
                .iter()
                .find(|&&c| tree.name(c) == *name)
                .unwrap_or_else(|| panic!("no {name} under {}", tree.name(at)));
        }
        at
    }

    #[test]
    fn nodes_sum_their_samples_and_children_sort_by_total() {
        // Leaf first, as profiles hold stacks.
        let tree = CallTree::from_profile(
            &profile(&[
                (&["A", "Main"], 3),
                (&["B", "Main"], 5),
                (&["Main"], 1),
                (&[], 2),
            ]),
            0,
            None,
        );
        assert_eq!(tree.total(), 11);
        let main = find(&tree, &["Main"]);
        assert_eq!(
            tree.values(main),
            NodeValues {
                self_value: 1,
                total: 9
            }
        );
        let order: Vec<&str> = tree.children()[main as usize]
            .iter()
            .map(|&c| tree.name(c))
            .collect();
        assert_eq!(order, ["B", "A"]);
        let unknown = find(&tree, &[UNKNOWN_FRAME]);
        assert_eq!(tree.values(unknown).self_value, 2);
        assert_eq!(tree.module(unknown), "");
    }

    #[test]
    fn a_cut_keeps_the_largest_nodes_and_moves_the_rest_to_other() {
        let tree = CallTree::from_profile(
            &profile(&[
                (&["A", "Main"], 50),
                (&["B", "Main"], 30),
                (&["C", "Main"], 20),
            ]),
            0,
            None,
        );
        let cut = tree.cut(3);
        assert_eq!(cut.total(), 100);
        let main = find(&cut, &["Main"]);
        let names: Vec<&str> = cut.children()[main as usize]
            .iter()
            .map(|&c| cut.name(c))
            .collect();
        assert_eq!(names, ["A", "B", OTHER_FRAME]);
        assert_eq!(cut.values(find(&cut, &["Main", OTHER_FRAME])).total, 20);
        // Back to a profile: the same totals per stack.
        let back = CallTree::from_profile(&cut.to_profile(), 0, None);
        assert_eq!(back.total(), 100);
        assert_eq!(
            back.values(find(&back, &["Main", OTHER_FRAME])).self_value,
            20
        );
    }

    #[test]
    fn merging_trees_equals_the_tree_of_all_samples() {
        let a = profile(&[(&["A", "Main"], 3), (&[], 1)]);
        let b = profile(&[(&["A", "Main"], 2), (&["B", "Main"], 4)]);
        let mut merged = CallTree::from_profile(&a, 0, None);
        merged.merge(&CallTree::from_profile(&b, 0, None));
        let all = profile(&[(&["A", "Main"], 5), (&["B", "Main"], 4), (&[], 1)]);
        let whole = CallTree::from_profile(&all, 0, None);
        assert_eq!(merged.total(), whole.total());
        for path in [
            &["Main"][..],
            &["Main", "A"],
            &["Main", "B"],
            &[UNKNOWN_FRAME],
        ] {
            assert_eq!(
                merged.values(find(&merged, path)),
                whole.values(find(&whole, path))
            );
        }
    }

    #[test]
    fn a_pruned_source_shows_its_missing_mass_as_other() {
        let mut tree = CallTree::new(&ValueType::new("cpu", "nanoseconds"));
        let main = tree.intern_function(&Function {
            name: "Main".into(),
            module: "App.dll".into(),
        });
        // A source whose grand total is 10 but which only kept Main (8, self 2).
        tree.add(CallTree::ROOT, main, 2, 8);
        tree.add_to_root(10);
        let cut = tree.cut(10);
        assert_eq!(cut.values(find(&cut, &["Main", OTHER_FRAME])).total, 6);
        assert_eq!(cut.values(find(&cut, &[OTHER_FRAME])).total, 2);
    }
}
