//! The object graph of one heap walk in compact arrays (per node: address, size, type index, edge
//! range; edges as node indices), so a heap of millions of objects costs tens of bytes per object,
//! and the type histogram computed from it.

use std::collections::HashMap;

use serde::Serialize;

use super::events::{BulkNode, BulkType, HeapEvent};
use super::GcDumpError;

/// A heap snapshot: objects, their types and references, and the GC roots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeapGraph {
    /// Width of pointers in the process (4 or 8).
    pub pointer_size: u8,
    /// Type names, indexed by [`node_type`](Self::node_type).
    pub type_names: Vec<String>,
    addresses: Vec<u64>,
    sizes: Vec<u64>,
    types: Vec<u32>,
    /// Node `i`'s references are `edges[edge_starts[i]..edge_starts[i + 1]]`.
    edge_starts: Vec<u32>,
    edges: Vec<u32>,
    roots: Vec<u32>,
}

impl HeapGraph {
    /// A graph from its parts, checked: every type, edge and root index in range and the edge
    /// ranges consistent (`edge_counts[i]` references of node `i`, in order, in `edges`).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        pointer_size: u8,
        type_names: Vec<String>,
        addresses: Vec<u64>,
        sizes: Vec<u64>,
        types: Vec<u32>,
        edge_counts: &[u32],
        edges: Vec<u32>,
        roots: Vec<u32>,
    ) -> Result<Self, GcDumpError> {
        let n = addresses.len();
        let bad = |what: String| Err(GcDumpError::InvalidGraph(what));
        if sizes.len() != n || types.len() != n || edge_counts.len() != n {
            return bad(format!(
                "{n} addresses but {} sizes, {} types and {} edge counts",
                sizes.len(),
                types.len(),
                edge_counts.len()
            ));
        }
        if let Some(t) = types.iter().find(|&&t| t as usize >= type_names.len()) {
            return bad(format!("type index {t} with {} types", type_names.len()));
        }
        if let Some(e) = edges.iter().chain(&roots).find(|&&e| e as usize >= n) {
            return bad(format!("reference to node {e} of {n}"));
        }
        let mut edge_starts = Vec::with_capacity(n + 1);
        let mut at = 0u64;
        edge_starts.push(0);
        for &c in edge_counts {
            at += u64::from(c);
            edge_starts.push(u32::try_from(at).map_err(|_| too_many_edges())?);
        }
        if at != edges.len() as u64 {
            return bad(format!(
                "nodes announce {at} references but {} are present",
                edges.len()
            ));
        }
        Ok(HeapGraph {
            pointer_size,
            type_names,
            addresses,
            sizes,
            types,
            edge_starts,
            edges,
            roots,
        })
    }

    /// Number of objects.
    pub fn node_count(&self) -> usize {
        self.addresses.len()
    }

    /// Number of references between objects.
    pub fn edge_count(&self) -> usize {
        self.edges.len()
    }

    pub fn address(&self, node: usize) -> u64 {
        self.addresses[node]
    }

    /// Shallow size in bytes.
    pub fn size(&self, node: usize) -> u64 {
        self.sizes[node]
    }

    /// Index into [`type_names`](Self::type_names).
    pub fn node_type(&self, node: usize) -> u32 {
        self.types[node]
    }

    /// The objects `node` references.
    pub fn references(&self, node: usize) -> &[u32] {
        &self.edges[self.edge_starts[node] as usize..self.edge_starts[node + 1] as usize]
    }

    /// Objects referenced from GC roots (stacks, handles, statics).
    pub fn roots(&self) -> &[u32] {
        &self.roots
    }

    /// Count and shallow size of the objects of each type, largest total size first.
    pub fn histogram(&self) -> Histogram {
        let mut per_type = vec![(0u64, 0u64); self.type_names.len()];
        for (&t, &size) in self.types.iter().zip(&self.sizes) {
            let entry = &mut per_type[t as usize];
            entry.0 += 1;
            entry.1 += size;
        }
        let mut types: Vec<TypeStats> = per_type
            .into_iter()
            .zip(&self.type_names)
            .filter(|((count, _), _)| *count > 0)
            .map(|((count, bytes), name)| TypeStats {
                name: name.clone(),
                count,
                bytes,
            })
            .collect();
        // Types of the same name (generic instantiations over different modules) are one row.
        types.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        types.dedup_by(|next, kept| {
            if next.name == kept.name {
                kept.count += next.count;
                kept.bytes += next.bytes;
                true
            } else {
                false
            }
        });
        types.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
        Histogram {
            objects: self.node_count() as u64,
            bytes: self.sizes.iter().sum(),
            types,
        }
    }
}

fn too_many_edges() -> GcDumpError {
    GcDumpError::InvalidGraph("more than 4 billion references".into())
}

/// Objects and bytes per type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Histogram {
    /// All objects in the snapshot.
    pub objects: u64,
    /// Their total shallow size.
    pub bytes: u64,
    /// One row per type name, largest total size first.
    pub types: Vec<TypeStats>,
}

impl Histogram {
    /// Keeps the `n` largest rows (the totals still cover every object).
    pub fn truncate(&mut self, n: usize) {
        self.types.truncate(n);
    }

    /// The row of a type name.
    pub fn get(&self, name: &str) -> Option<&TypeStats> {
        self.types.iter().find(|t| t.name == name)
    }
}

/// One type's row of the histogram.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TypeStats {
    pub name: String,
    pub count: u64,
    /// Total shallow size in bytes.
    pub bytes: u64,
}

/// Collects the heap-walk events and turns them into a [`HeapGraph`]. Edges arrive as addresses
/// (8 bytes each) and become node indices (4 bytes) only at the end, when every node is known.
#[derive(Debug, Default)]
pub(crate) struct GraphBuilder {
    type_index: HashMap<u64, u32>,
    type_names: Vec<Option<String>>,
    type_ids: Vec<u64>,
    addresses: Vec<u64>,
    sizes: Vec<u64>,
    types: Vec<u32>,
    edge_counts: Vec<u32>,
    announced_edges: u64,
    edge_targets: Vec<u64>,
    root_addresses: Vec<u64>,
}

impl GraphBuilder {
    /// Objects seen so far, for progress displays.
    pub fn node_count(&self) -> usize {
        self.addresses.len()
    }

    /// Types objects refer to whose names never arrived.
    pub fn unnamed_types(&self) -> usize {
        self.type_names.iter().filter(|n| n.is_none()).count()
    }

    pub fn add(&mut self, event: HeapEvent) -> Result<(), GcDumpError> {
        match event {
            HeapEvent::Types(types) => types.into_iter().for_each(|t| self.add_type(t)),
            HeapEvent::Nodes(nodes) => {
                for node in nodes {
                    self.add_node(node)?;
                }
            }
            HeapEvent::Edges(targets) => self.edge_targets.extend(targets),
            HeapEvent::Roots(roots) => self.root_addresses.extend(roots),
            HeapEvent::GcStart(_) | HeapEvent::GcEnd(_) => {}
        }
        Ok(())
    }

    fn intern(&mut self, type_id: u64) -> u32 {
        let next = self.type_ids.len() as u32;
        *self.type_index.entry(type_id).or_insert_with(|| {
            self.type_ids.push(type_id);
            self.type_names.push(None);
            next
        })
    }

    fn add_type(&mut self, t: BulkType) {
        let i = self.intern(t.type_id) as usize;
        self.type_names[i] = Some(t.name);
    }

    fn add_node(&mut self, node: BulkNode) -> Result<(), GcDumpError> {
        let edge_count = u32::try_from(node.edge_count).map_err(|_| {
            GcDumpError::InvalidGraph(format!(
                "object {:#x} claims {} references",
                node.address, node.edge_count
            ))
        })?;
        let t = self.intern(node.type_id);
        self.addresses.push(node.address);
        self.sizes.push(node.size);
        self.types.push(t);
        self.edge_counts.push(edge_count);
        self.announced_edges += u64::from(edge_count);
        Ok(())
    }

    /// The graph: edges and roots resolved to node indices. References to addresses the walk
    /// did not report (objects outside the walked heap) are left out.
    pub fn finish(self, pointer_size: u8) -> Result<HeapGraph, GcDumpError> {
        if self.announced_edges != self.edge_targets.len() as u64 {
            return Err(GcDumpError::Incomplete(format!(
                "objects announce {} references but {} arrived",
                self.announced_edges,
                self.edge_targets.len()
            )));
        }
        let mut by_address: Vec<u32> = (0..self.addresses.len() as u32).collect();
        by_address.sort_unstable_by_key(|&i| self.addresses[i as usize]);
        let find = |address: u64| {
            by_address
                .binary_search_by_key(&address, |&i| self.addresses[i as usize])
                .ok()
                .map(|at| by_address[at])
        };
        let mut edge_counts = Vec::with_capacity(self.edge_counts.len());
        let mut edges = Vec::with_capacity(self.edge_targets.len());
        let mut targets = self.edge_targets.iter();
        for &announced in &self.edge_counts {
            let before = edges.len();
            edges.extend(
                targets
                    .by_ref()
                    .take(announced as usize)
                    .filter_map(|&a| find(a)),
            );
            edge_counts.push((edges.len() - before) as u32);
        }
        let mut roots: Vec<u32> = self
            .root_addresses
            .iter()
            .filter_map(|&a| find(a))
            .collect();
        roots.sort_unstable();
        roots.dedup();
        drop(by_address);
        let type_names = self
            .type_names
            .into_iter()
            .zip(&self.type_ids)
            .map(|(name, id)| name.unwrap_or_else(|| format!("<unnamed type {id:#x}>")))
            .collect();
        HeapGraph::new(
            pointer_size,
            type_names,
            self.addresses,
            self.sizes,
            self.types,
            &edge_counts,
            edges,
            roots,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(address: u64, size: u64, type_id: u64, edge_count: u64) -> BulkNode {
        BulkNode {
            address,
            size,
            type_id,
            edge_count,
        }
    }

    fn ty(type_id: u64, name: &str) -> BulkType {
        BulkType {
            type_id,
            module_id: 0,
            name: name.into(),
        }
    }

    #[test]
    fn builds_edges_roots_and_histogram() {
        let mut b = GraphBuilder::default();
        b.add(HeapEvent::Nodes(vec![
            node(0x300, 40, 7, 2),
            node(0x100, 24, 9, 0),
            node(0x200, 40, 7, 1),
        ]))
        .unwrap();
        // Types may arrive after the nodes that use them.
        b.add(HeapEvent::Types(vec![
            ty(7, "A.Node"),
            ty(9, "System.String"),
        ]))
        .unwrap();
        // 0x999 is outside the walked heap: dropped.
        b.add(HeapEvent::Edges(vec![0x100, 0x999, 0x300])).unwrap();
        b.add(HeapEvent::Roots(vec![0x300, 0x300, 0x555])).unwrap();
        let g = b.finish(8).unwrap();
        assert_eq!(g.node_count(), 3);
        assert_eq!(g.references(0), &[1]);
        assert_eq!(g.references(1), &[] as &[u32]);
        assert_eq!(g.references(2), &[0]);
        assert_eq!(g.roots(), &[0]);
        let h = g.histogram();
        assert_eq!((h.objects, h.bytes), (3, 104));
        assert_eq!(h.types[0].name, "A.Node");
        assert_eq!((h.types[0].count, h.types[0].bytes), (2, 80));
        assert_eq!(h.get("System.String").unwrap().count, 1);
    }

    #[test]
    fn missing_edges_are_an_error() {
        let mut b = GraphBuilder::default();
        b.add(HeapEvent::Nodes(vec![node(0x100, 24, 1, 3)]))
            .unwrap();
        b.add(HeapEvent::Edges(vec![0x100])).unwrap();
        assert!(matches!(b.finish(8), Err(GcDumpError::Incomplete(_))));
    }

    #[test]
    fn unnamed_types_get_a_placeholder() {
        let mut b = GraphBuilder::default();
        b.add(HeapEvent::Nodes(vec![node(0x100, 24, 0xab, 0)]))
            .unwrap();
        let g = b.finish(8).unwrap();
        assert_eq!(g.type_names, ["<unnamed type 0xab>"]);
    }
}
