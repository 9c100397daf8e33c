//! A flame-graph tree as JSON, for the web UI: the profile's stacks merged root first.
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

use store::profile::{FunctionIndex, Profile};

use crate::{check, resolve_sample_type, ExportError, UNKNOWN_FRAME};

/// Writes the tree of `sample_type` (default: the profile's default sample type).
pub fn write_tree(
    profile: &Profile,
    sample_type: Option<usize>,
    out: impl Write,
) -> Result<(), ExportError> {
    check(profile)?;
    let shown = resolve_sample_type(profile, sample_type)?;
    Tree::build(profile, shown, None).write_json(out)?;
    Ok(())
}

/// Writes the tree of a differential profile as `store::tsdb::diff` builds it: sample type 0
/// holds the base values, 1 the new ones.
pub fn write_diff_tree(diff: &Profile, out: impl Write) -> Result<(), ExportError> {
    check(diff)?;
    let base = resolve_sample_type(diff, Some(0))?;
    let new = resolve_sample_type(diff, Some(1))?;
    Tree::build(diff, new, Some(base)).write_json(out)?;
    Ok(())
}

/// What a node stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Frame {
    Root,
    /// The frame of a sample with an empty stack.
    Unknown,
    Function(FunctionIndex),
}

/// Self and total value of one node for one sample type.
#[derive(Debug, Clone, Copy, Default)]
struct Values {
    self_value: i64,
    total: i64,
}

#[derive(Debug)]
struct Node {
    frame: Frame,
    /// The shown sample type's values, then the base's (zero when there is no base).
    values: [Values; 2],
    /// Indices into `Tree::nodes`, sorted once the tree is built.
    children: Vec<usize>,
}

impl Node {
    fn new(frame: Frame) -> Node {
        Node {
            frame,
            values: [Values::default(); 2],
            children: Vec::new(),
        }
    }
}

#[derive(Debug)]
struct Tree<'a> {
    profile: &'a Profile,
    /// `nodes[0]` is the root.
    nodes: Vec<Node>,
    /// Whether the second value of each node (the base) is written.
    diff: bool,
    /// The shown sample type.
    shown: usize,
}

impl<'a> Tree<'a> {
    /// Merges the samples of a checked profile; `base` adds the diff's second sample type.
    fn build(profile: &'a Profile, shown: usize, base: Option<usize>) -> Tree<'a> {
        let mut nodes = vec![Node::new(Frame::Root)];
        let mut child_of: HashMap<(usize, Frame), usize> = HashMap::new();
        let mut path = Vec::new();
        for sample in &profile.samples {
            let values = [sample.values[shown], base.map_or(0, |b| sample.values[b])];
            if values == [0, 0] {
                continue;
            }
            path.clear();
            if sample.stack.is_empty() {
                path.push(Frame::Unknown);
            }
            path.extend(sample.stack.iter().rev().map(|&f| Frame::Function(f)));
            let mut at = 0;
            add(&mut nodes[at].values, values, false);
            for &frame in &path {
                at = *child_of.entry((at, frame)).or_insert_with(|| {
                    nodes.push(Node::new(frame));
                    let child = nodes.len() - 1;
                    nodes[at].children.push(child);
                    child
                });
                add(&mut nodes[at].values, values, false);
            }
            add(&mut nodes[at].values, values, true);
        }
        let mut tree = Tree {
            profile,
            nodes,
            diff: base.is_some(),
            shown,
        };
        tree.sort_children();
        tree
    }

    fn sort_children(&mut self) {
        for i in 0..self.nodes.len() {
            let mut children = std::mem::take(&mut self.nodes[i].children);
            children.sort_by(|&a, &b| {
                let (a, b) = (&self.nodes[a], &self.nodes[b]);
                (b.values[0].total, b.values[1].total)
                    .cmp(&(a.values[0].total, a.values[1].total))
                    .then_with(|| self.name(a.frame).cmp(self.name(b.frame)))
                    .then_with(|| self.module(a.frame).cmp(self.module(b.frame)))
            });
            self.nodes[i].children = children;
        }
    }

    fn name(&self, frame: Frame) -> &str {
        match frame {
            Frame::Root => "total",
            Frame::Unknown => UNKNOWN_FRAME,
            Frame::Function(f) => &self.profile.functions[f as usize].name,
        }
    }

    fn module(&self, frame: Frame) -> &str {
        match frame {
            Frame::Root | Frame::Unknown => "",
            Frame::Function(f) => &self.profile.functions[f as usize].module,
        }
    }

    fn write_json(&self, out: impl Write) -> io::Result<()> {
        let mut out = BufWriter::new(out);
        let unit = &self.profile.sample_types[self.shown].unit;
        let root = &self.nodes[0].values;
        out.write_all(b"{\"unit\":")?;
        write_str(&mut out, unit)?;
        write!(out, ",\"total\":{}", root[0].total)?;
        if self.diff {
            write!(out, ",\"base_total\":{}", root[1].total)?;
        }
        out.write_all(b",\"root\":")?;
        // Each entry: a node whose object is open and how many of its children are written.
        let mut open = vec![(0, 0)];
        self.open_node(&mut out, 0)?;
        while let Some((node, written)) = open.last_mut() {
            match self.nodes[*node].children.get(*written) {
                Some(&child) => {
                    if *written > 0 {
                        out.write_all(b",")?;
                    }
                    *written += 1;
                    self.open_node(&mut out, child)?;
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
    fn open_node(&self, out: &mut impl Write, index: usize) -> io::Result<()> {
        let node = &self.nodes[index];
        out.write_all(b"{\"name\":")?;
        write_str(out, self.name(node.frame))?;
        if node.frame != Frame::Root {
            out.write_all(b",\"module\":")?;
            write_str(out, self.module(node.frame))?;
        }
        let [shown, base] = node.values;
        write!(
            out,
            ",\"self\":{},\"total\":{}",
            shown.self_value, shown.total
        )?;
        if self.diff {
            write!(
                out,
                ",\"base_self\":{},\"base_total\":{}",
                base.self_value, base.total
            )?;
        }
        out.write_all(b",\"children\":[")
    }
}

/// Adds one sample's values to a node's totals, or to its self values. Saturates.
fn add(node: &mut [Values; 2], values: [i64; 2], to_self: bool) {
    for (v, add) in node.iter_mut().zip(values) {
        let field = if to_self {
            &mut v.self_value
        } else {
            &mut v.total
        };
        *field = field.saturating_add(add);
    }
}

/// A JSON string literal, escaped.
fn write_str(out: &mut impl Write, s: &str) -> io::Result<()> {
    serde_json::to_writer(out, s).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};
    use store::profile::{Function, ProfileBuilder, ValueType};

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
    fn diff_nodes_carry_base_and_new() {
        let base = shop();
        let mut b = cpu_builder();
        let main = function(&mut b, "Shop.Program.Main(System.String[])");
        let handle = function(&mut b, "Shop.OrderController.HandleOrder(Shop.Order)");
        let validate = function(&mut b, "Shop.OrderValidator.Validate(Shop.Order)");
        b.add(vec![validate, handle, main], Vec::new(), &[200]);
        let new = b.build();
        let mut out = Vec::new();
        write_diff_tree(&store::tsdb::diff(&base, &new, 0), &mut out).unwrap();
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
