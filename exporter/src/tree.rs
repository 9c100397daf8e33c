//! A flame-graph tree as JSON, for the web UI: a [`CallTree`] written root first.
//!
//! ```json
//! { "unit": "nanoseconds", "total": 120,
//!   "root": { "name": "total", "self": 0, "total": 120, "children": [
//!     { "name": "App.Program.Main(System.String[])", "module": "App.dll",
//!       "self": 10, "total": 120, "children": [ ... ] } ] } }
//! ```
//!
//! - A node is one function called from one path: `total` is the value of the samples passing
//!   through it, `self` of those ending in it. A recursive function gets one node per level.
//! - Children are sorted by `total`, largest first (ties by name, then module), so a viewer can
//!   lay them out in order; equal profiles give equal files.
//! - A sample with an empty stack counts under a child `[unknown]` of the root, as in the
//!   folded format. Samples whose values are all 0 are left out.
//! - [`write_diff_tree`] adds `base_self` and `base_total` to every node and `base_total` to the
//!   top level, so a viewer can colour each node by its change; `self` and `total` are then the
//!   new side's.
//!
//! The JSON is written without recursion, so stacks of any depth neither overflow the stack
//! here nor need a recursive structure in memory.

use std::collections::HashMap;
use std::io::{self, BufWriter, Write};

use profile::labels::OTHER_FRAME;
use profile::tree::NodeId;
use profile::{CallTree, Profile};

use crate::{check, resolve_sample_type, ExportError};

/// Writes the tree of `sample_type` (default: the profile's default sample type).
pub fn write_tree(
    profile: &Profile,
    sample_type: Option<usize>,
    out: impl Write,
) -> Result<(), ExportError> {
    write_call_tree(&call_tree(profile, sample_type)?, out)
}

/// Writes the tree of a differential profile as [`profile::diff`] builds it: sample type 0
/// holds the base values, 1 the new ones.
pub fn write_diff_tree(diff: &Profile, out: impl Write) -> Result<(), ExportError> {
    check(diff)?;
    let base = resolve_sample_type(diff, Some(0))?;
    let new = resolve_sample_type(diff, Some(1))?;
    write_call_tree(&CallTree::from_profile(diff, new, Some(base)), out)
}

/// The call tree of `sample_type` (default: the profile's default sample type) of a checked
/// profile.
pub fn call_tree(profile: &Profile, sample_type: Option<usize>) -> Result<CallTree, ExportError> {
    check(profile)?;
    let shown = resolve_sample_type(profile, sample_type)?;
    Ok(CallTree::from_profile(profile, shown, None))
}

/// Writes a call tree (a differential one with its base values) as the web UI's JSON.
pub fn write_call_tree(tree: &CallTree, out: impl Write) -> Result<(), ExportError> {
    write_json(tree, out)?;
    Ok(())
}

/// Pyroscope's flame graph ("flamebearer"), what its `querier.v1.QuerierService` answers and
/// Grafana draws: the same tree, flattened into one row of nodes per depth.
///
/// Each level holds 4 numbers per node, `[x, total, self, name]`: `name` indexes
/// [`FlameGraph::names`] (`names[0]` is `total`, the root), `x` is the node's offset from the
/// end of the previous node of its level (so the first node's is its absolute offset), in the
/// profile's unit. A node's children start at its offset plus its self value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlameGraph {
    pub names: Vec<String>,
    pub levels: Vec<Vec<i64>>,
    pub total: i64,
    pub max_self: i64,
}

/// The flame graph of `sample_type` (default: the profile's default sample type); see
/// [`FlameGraph::of`].
pub fn flame_graph(
    profile: &Profile,
    sample_type: Option<usize>,
    max_nodes: usize,
) -> Result<FlameGraph, ExportError> {
    Ok(FlameGraph::of(&call_tree(profile, sample_type)?, max_nodes))
}

impl FlameGraph {
    /// The flame graph of a tree with at most about `max_nodes` nodes below the root, as
    /// Pyroscope cuts it: nodes whose total is below the `max_nodes`-th largest total are left
    /// out (ties may keep a few more), each parent's left-out children summed into one child
    /// [`OTHER_FRAME`], into which children of that name (what the store's
    /// [`CallTree::cut`] already cut) go too. `max_nodes` 0 keeps every node.
    ///
    /// Walks the tree depth first, children in order, so that each level receives its nodes
    /// left to right.
    pub fn of(tree: &CallTree, max_nodes: usize) -> FlameGraph {
        enum Visit {
            Node(NodeId),
            Other(i64),
        }
        let children = tree.children();
        let min_total = min_total(tree, max_nodes);
        let mut names: Vec<String> = Vec::new();
        let mut name_index: HashMap<&str, i64> = HashMap::new();
        let mut levels: Vec<Vec<i64>> = Vec::new();
        let mut max_self = 0;
        // (what, depth, absolute offset)
        let mut pending = vec![(Visit::Node(CallTree::ROOT), 0usize, 0i64)];
        while let Some((visit, depth, x)) = pending.pop() {
            let (name, self_value, total) = match visit {
                Visit::Node(i) => {
                    let values = tree.values(i);
                    (tree.name(i), values.self_value, values.total)
                }
                Visit::Other(total) => (OTHER_FRAME, total, total),
            };
            let name = *name_index.entry(name).or_insert_with(|| {
                names.push(name.to_string());
                names.len() as i64 - 1
            });
            if levels.len() == depth {
                levels.push(Vec::new());
            }
            levels[depth].extend([x, total, self_value, name]);
            max_self = max_self.max(self_value);
            let Visit::Node(i) = visit else { continue };
            let mut next = Vec::new();
            let mut cursor = x.saturating_add(self_value);
            let mut other = 0i64;
            for &child in &children[i as usize] {
                let total = tree.values(child).total;
                if total >= min_total && tree.name(child) != OTHER_FRAME {
                    next.push((Visit::Node(child), depth + 1, cursor));
                    cursor = cursor.saturating_add(total);
                } else {
                    other = other.saturating_add(total);
                }
            }
            if other != 0 {
                next.push((Visit::Other(other), depth + 1, cursor));
            }
            pending.extend(next.into_iter().rev());
        }
        for level in &mut levels {
            let mut end = 0;
            for node in level.chunks_exact_mut(4) {
                let x = node[0];
                node[0] = x - end;
                end = x.saturating_add(node[1]);
            }
        }
        FlameGraph {
            names,
            levels,
            total: tree.total(),
            max_self,
        }
    }
}

/// The smallest total a node needs to be drawn with at most about `max_nodes` nodes: the
/// `max_nodes`-th largest total below the root, or 0 when the tree is no larger.
fn min_total(tree: &CallTree, max_nodes: usize) -> i64 {
    let mut totals: Vec<i64> = (1..tree.len() as NodeId)
        .map(|i| tree.values(i).total)
        .collect();
    if max_nodes == 0 || totals.len() <= max_nodes {
        return 0;
    }
    let (_, &mut kth, _) = totals.select_nth_unstable_by(max_nodes - 1, |a, b| b.cmp(a));
    kth
}

fn write_json(tree: &CallTree, out: impl Write) -> io::Result<()> {
    let mut out = BufWriter::new(out);
    let children = tree.children();
    out.write_all(b"{\"unit\":")?;
    write_str(&mut out, tree.unit())?;
    write!(out, ",\"total\":{}", tree.total())?;
    if tree.is_diff() {
        write!(
            out,
            ",\"base_total\":{}",
            tree.base_values(CallTree::ROOT).total
        )?;
    }
    out.write_all(b",\"root\":")?;
    // Each entry: a node whose object is open and how many of its children are written.
    let mut open = vec![(CallTree::ROOT, 0)];
    open_node(tree, &mut out, CallTree::ROOT)?;
    while let Some((node, written)) = open.last_mut() {
        match children[*node as usize].get(*written) {
            Some(&child) => {
                if *written > 0 {
                    out.write_all(b",")?;
                }
                *written += 1;
                open_node(tree, &mut out, child)?;
                open.push((child, 0));
            }
            None => {
                out.write_all(b"]}")?;
                open.pop();
            }
        }
    }
    out.write_all(b"}")?;
    out.flush()
}

/// Writes a node's fields up to the opening bracket of its children.
fn open_node(tree: &CallTree, out: &mut impl Write, node: NodeId) -> io::Result<()> {
    out.write_all(b"{\"name\":")?;
    write_str(out, tree.name(node))?;
    if node != CallTree::ROOT {
        out.write_all(b",\"module\":")?;
        write_str(out, tree.module(node))?;
    }
    let shown = tree.values(node);
    write!(
        out,
        ",\"self\":{},\"total\":{}",
        shown.self_value, shown.total
    )?;
    if tree.is_diff() {
        let base = tree.base_values(node);
        write!(
            out,
            ",\"base_self\":{},\"base_total\":{}",
            base.self_value, base.total
        )?;
    }
    out.write_all(b",\"children\":[")
}

/// A JSON string literal, escaped.
fn write_str(out: &mut impl Write, s: &str) -> io::Result<()> {
    serde_json::to_writer(out, s).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use profile::{Function, FunctionIndex, ProfileBuilder, ValueType};
    use serde_json::{json, Value};

    use super::*;

    fn function(b: &mut ProfileBuilder, name: &str) -> FunctionIndex {
        b.function(Function {
            name: name.into(),
            module: "Shop.dll".into(),
        })
    }

    fn cpu_builder() -> ProfileBuilder {
        let cpu = || ValueType::new("cpu", "nanoseconds");
        ProfileBuilder::new(vec![cpu()], cpu(), 1_000_000)
    }

    /// A web request handler: `Main` → `HandleOrder` → `Serialize` (hot) and `Validate`, plus
    /// a recursive `Walk`, a sample without a stack and one with no value.
    fn shop() -> Profile {
        let mut b = cpu_builder();
        let main = function(&mut b, "Shop.Program.Main(System.String[])");
        let handle = function(&mut b, "Shop.OrderController.HandleOrder(Shop.Order)");
        let serialize = function(
            &mut b,
            "System.Text.Json.JsonSerializer.Serialize<Shop.Order>(Shop.Order)",
        );
        let validate = function(&mut b, "Shop.OrderValidator.Validate(Shop.Order)");
        let walk = function(&mut b, "Shop.Tree.Walk(Shop.Node)");
        b.add(vec![serialize, handle, main], Vec::new(), &[70]);
        b.add(vec![validate, handle, main], Vec::new(), &[20]);
        b.add(vec![handle, main], Vec::new(), &[5]);
        b.add(vec![walk, walk, main], Vec::new(), &[3]);
        b.add(Vec::new(), Vec::new(), &[2]);
        b.add(vec![validate, main], Vec::new(), &[0]);
        b.build()
    }

    fn tree_json(profile: &Profile) -> Value {
        let mut out = Vec::new();
        write_tree(profile, None, &mut out).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    /// `[name, self, total, children...]` per node, to compare shapes compactly.
    fn shape(node: &Value) -> Value {
        let mut out = vec![
            node["name"].clone(),
            node["self"].clone(),
            node["total"].clone(),
        ];
        out.extend(node["children"].as_array().unwrap().iter().map(shape));
        Value::Array(out)
    }

    #[test]
    fn stacks_merge_root_first_with_children_by_total() {
        let tree = tree_json(&shop());
        assert_eq!(tree["unit"], "nanoseconds");
        assert_eq!(tree["total"], 100);
        assert_eq!(tree["root"]["name"], "total");
        assert!(tree["root"].get("module").is_none());
        assert_eq!(
            shape(&tree["root"]),
            json!([
                "total",
                0,
                100,
                [
                    "Shop.Program.Main(System.String[])",
                    0,
                    98,
                    [
                        "Shop.OrderController.HandleOrder(Shop.Order)",
                        5,
                        95,
                        [
                            "System.Text.Json.JsonSerializer.Serialize<Shop.Order>(Shop.Order)",
                            70,
                            70
                        ],
                        ["Shop.OrderValidator.Validate(Shop.Order)", 20, 20]
                    ],
                    [
                        "Shop.Tree.Walk(Shop.Node)",
                        0,
                        3,
                        ["Shop.Tree.Walk(Shop.Node)", 3, 3]
                    ]
                ],
                ["[unknown]", 2, 2]
            ])
        );
        let main = &tree["root"]["children"][0];
        assert_eq!(main["module"], "Shop.dll");
        assert_eq!(tree["root"]["children"][1]["module"], "");
    }

    #[test]
    fn flame_graph_levels_are_pyroscope_flamebearer() {
        let graph = flame_graph(&shop(), None, 0).unwrap();
        assert_eq!(
            graph.names,
            [
                "total",
                "Shop.Program.Main(System.String[])",
                "Shop.OrderController.HandleOrder(Shop.Order)",
                "System.Text.Json.JsonSerializer.Serialize<Shop.Order>(Shop.Order)",
                "Shop.OrderValidator.Validate(Shop.Order)",
                "Shop.Tree.Walk(Shop.Node)",
                "[unknown]",
            ]
        );
        // [offset from the previous node's end, total, self, name] per node.
        assert_eq!(
            graph.levels,
            [
                vec![0, 100, 0, 0],
                vec![0, 98, 0, 1, 0, 2, 2, 6],
                vec![0, 95, 5, 2, 0, 3, 0, 5],
                vec![5, 70, 70, 3, 0, 20, 20, 4, 0, 3, 3, 5],
            ]
        );
        assert_eq!((graph.total, graph.max_self), (100, 70));
    }

    #[test]
    fn flame_graph_cut_to_max_nodes_sums_the_rest_into_other() {
        let whole = flame_graph(&shop(), None, 0).unwrap();
        let graph = flame_graph(&shop(), None, 3).unwrap();
        // total, Main, HandleOrder, Serialize, then the rest as "other".
        assert_eq!(graph.names[..4], whole.names[..4]);
        assert_eq!(graph.names[4..], [OTHER_FRAME]);
        assert_eq!(
            graph.levels,
            [
                vec![0, 100, 0, 0],
                vec![0, 98, 0, 1, 0, 2, 2, 4],
                vec![0, 95, 5, 2, 0, 3, 3, 4],
                vec![5, 70, 70, 3, 0, 20, 20, 4],
            ]
        );
        assert_eq!((graph.total, graph.max_self), (100, 70));
        // A cut no smaller than the tree keeps it whole.
        assert_eq!(flame_graph(&shop(), None, 7).unwrap(), whole);
    }

    #[test]
    fn flame_graph_folds_children_named_other_into_one() {
        let mut b = cpu_builder();
        let main = function(&mut b, "Shop.Program.Main(System.String[])");
        let cut = function(&mut b, OTHER_FRAME);
        let hot = function(&mut b, "Shop.Hot()");
        b.add(vec![hot, main], Vec::new(), &[50]);
        b.add(vec![cut, main], Vec::new(), &[30]);
        let graph = flame_graph(&b.build(), None, 0).unwrap();
        assert_eq!(graph.levels[2], [0, 50, 50, 2, 0, 30, 30, 3]);
        assert_eq!(graph.names[2..], ["Shop.Hot()", OTHER_FRAME]);
    }

    #[test]
    fn diff_nodes_carry_base_and_new() {
        let base = shop();
        let mut b = cpu_builder();
        let main = function(&mut b, "Shop.Program.Main(System.String[])");
        let handle = function(&mut b, "Shop.OrderController.HandleOrder(Shop.Order)");
        let validate = function(&mut b, "Shop.OrderValidator.Validate(Shop.Order)");
        b.add(vec![validate, handle, main], Vec::new(), &[200]);
        let new = b.build();
        let mut out = Vec::new();
        write_diff_tree(&profile::diff(&base, &new, 0), &mut out).unwrap();
        let tree: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            (&tree["total"], &tree["base_total"]),
            (&json!(200), &json!(100))
        );
        let handle = &tree["root"]["children"][0]["children"][0];
        assert_eq!(
            handle["name"],
            "Shop.OrderController.HandleOrder(Shop.Order)"
        );
        assert_eq!(
            (&handle["total"], &handle["base_total"]),
            (&json!(200), &json!(95))
        );
        assert_eq!(
            (&handle["self"], &handle["base_self"]),
            (&json!(0), &json!(5))
        );
        let children: Vec<(&str, &Value, &Value)> = handle["children"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["name"].as_str().unwrap(), &c["total"], &c["base_total"]))
            .collect();
        assert_eq!(
            children,
            [
                (
                    "Shop.OrderValidator.Validate(Shop.Order)",
                    &json!(200),
                    &json!(20)
                ),
                (
                    "System.Text.Json.JsonSerializer.Serialize<Shop.Order>(Shop.Order)",
                    &json!(0),
                    &json!(70)
                ),
            ]
        );
    }

    #[test]
    fn deep_stacks_and_awkward_names_are_written_without_recursion() {
        let mut b = ProfileBuilder::new(
            vec![ValueType::new("samples", "count")],
            ValueType::new("samples", "count"),
            1,
        );
        let recurse = function(&mut b, "Shop.Parser.Parse(\"quoted\"\n\\)");
        const DEPTH: usize = 100_000;
        b.add(vec![recurse; DEPTH], Vec::new(), &[1]);
        let mut out = Vec::new();
        write_tree(&b.build(), None, &mut out).unwrap();
        let name = r#""Shop.Parser.Parse(\"quoted\"\n\\)""#;
        let node = |self_value| {
            format!(
                r#"{{"name":{name},"module":"Shop.dll","self":{self_value},"total":1,"children":["#
            )
        };
        let mut expected =
            r#"{"unit":"count","total":1,"root":{"name":"total","self":0,"total":1,"children":["#
                .to_string();
        expected.push_str(&node(0).repeat(DEPTH - 1));
        expected.push_str(&node(1));
        expected.push_str(&"]}".repeat(DEPTH + 1));
        expected.push('}');
        assert!(String::from_utf8(out).unwrap() == expected);
    }

    #[test]
    fn empty_profile_and_bad_sample_type() {
        let p = cpu_builder().build();
        assert_eq!(
            tree_json(&p),
            json!({"unit": "nanoseconds", "total": 0,
                   "root": {"name": "total", "self": 0, "total": 0, "children": []}})
        );
        assert!(matches!(
            write_tree(&p, Some(3), Vec::new()),
            Err(ExportError::SampleTypeOutOfRange { index: 3, .. })
        ));
        assert!(matches!(
            write_diff_tree(&p, Vec::new()),
            Err(ExportError::SampleTypeOutOfRange { index: 1, .. })
        ));
    }
}
