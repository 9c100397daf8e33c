//! The dictionary queries share, so a block's dictionaries are read and interned once rather
//! than on every query that covers it.
//!
//! Every block has dictionaries of its own, so a query must translate each block's stack,
//! function and label set ids into one id space before it can merge equal samples. Reading the
//! dictionary files and interning a minute's stack nodes is most of what a long query costs
//! (half of an hour's profile, measured in `BENCHMARKS.md`), and the same minutes are asked for
//! again and again (a timeline, then its flame graph, then a zoom). So the translations are
//! kept: an [`Epoch`] holds one [`Interner`] and, per block, its ids in it ([`BlockIds`]).
//!
//! Memory is bounded by a byte budget: once an epoch passes it, the next query starts a fresh,
//! empty one. A query keeps the epoch it started with (an `Arc`) to the end, so the ids it holds
//! never change under it; the old epoch is freed when its last query ends. A deleted block's ids
//! are dropped at once ([`QueryCache::forget`]), and block names are never reused by a store, so
//! a deleted block cannot be served from the cache.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::block::{self, BlockInfo};
use super::error::Result;
use super::head::{Dicts, Interner, Remap};
use super::model::{Query, Series};
use super::query::{Selection, SKIP};

/// A source's ids in an epoch's [`Interner`].
#[derive(Debug)]
pub(crate) struct BlockIds {
    /// By the source's stack node id.
    pub nodes: Vec<u32>,
    /// By the source's label set id.
    pub label_sets: Vec<u32>,
}

impl BlockIds {
    fn bytes(&self) -> usize {
        4 * (self.nodes.len() + self.label_sets.len())
    }

    /// Interns everything in `dicts`.
    fn map(dicts: &Dicts, into: &mut Interner) -> Result<BlockIds> {
        let (nodes, label_sets) = Remap::new(dicts).all(into)?;
        Ok(BlockIds { nodes, label_sets })
    }
}

#[derive(Debug, Default)]
pub(crate) struct EpochState {
    pub interner: Interner,
    blocks: HashMap<String, Arc<BlockIds>>,
    ids_bytes: usize,
}

impl EpochState {
    fn bytes(&self) -> usize {
        self.interner.bytes + self.ids_bytes
    }
}

/// One id space shared by queries; see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct Epoch {
    state: Mutex<EpochState>,
}

impl Epoch {
    pub fn lock(&self) -> MutexGuard<'_, EpochState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A block's ids, reading and interning its dictionaries if no query has yet.
    pub fn block_ids(&self, info: &BlockInfo) -> Result<Arc<BlockIds>> {
        if let Some(ids) = self.lock().blocks.get(&info.name) {
            return Ok(ids.clone());
        }
        // Read and decode without the lock: other threads keep using the epoch meanwhile.
        let dicts = block::read_dicts(info)?;
        let mut state = self.lock();
        if let Some(ids) = state.blocks.get(&info.name) {
            return Ok(ids.clone()); // another query got there first
        }
        let ids = Arc::new(BlockIds::map(&dicts, &mut state.interner)?);
        state.ids_bytes += ids.bytes();
        state.blocks.insert(info.name.clone(), ids.clone());
        Ok(ids)
    }

    /// The ids of dictionaries that are not a block's (the head's), not kept.
    pub fn map(&self, dicts: &Dicts) -> Result<BlockIds> {
        BlockIds::map(dicts, &mut self.lock().interner)
    }

    /// Which rows of a source with these ids and series the query takes, and the label set of
    /// the answer each label set's rows go to.
    /// Labels of `dropped` are left out of the answer's label sets (those a downsampled block
    /// the query reads does not have), so all sources agree on the labels they group by.
    pub fn select(
        &self,
        ids: &BlockIds,
        series: &[Arc<Series>],
        query: &Query,
        dropped: &[String],
    ) -> Result<Selection> {
        let mut state = self.lock();
        let mut labels = Vec::with_capacity(ids.label_sets.len());
        for &id in &ids.label_sets {
            let set = &state.interner.dicts.label_sets[id as usize];
            labels.push(if !query.sample_labels_match(set) {
                SKIP
            } else {
                match query.sample_labels.keep(set) {
                    Cow::Borrowed(kept) if !kept.iter().any(|(k, _)| dropped.contains(k)) => id,
                    kept => {
                        let kept: Vec<_> = kept
                            .iter()
                            .filter(|(k, _)| !dropped.contains(k))
                            .cloned()
                            .collect();
                        state.interner.intern_label_set(&kept)?
                    }
                }
            });
        }
        Ok(Selection::new(series, query, Some(labels)))
    }
}

/// The current [`Epoch`] and its budget.
#[derive(Debug)]
pub(crate) struct QueryCache {
    budget: usize,
    current: Mutex<Arc<Epoch>>,
}

impl QueryCache {
    pub fn new(budget: usize) -> Self {
        QueryCache {
            budget,
            current: Mutex::new(Arc::default()),
        }
    }

    fn current(&self) -> MutexGuard<'_, Arc<Epoch>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The epoch a query uses from start to end; a fresh one if the current one is over budget.
    pub fn epoch(&self) -> Arc<Epoch> {
        let mut current = self.current();
        if current.lock().bytes() > self.budget {
            *current = Arc::default();
        }
        current.clone()
    }

    /// Drops a deleted block's ids.
    pub fn forget(&self, block: &str) {
        let current = self.current();
        let mut state = current.lock();
        if let Some(ids) = state.blocks.remove(block) {
            state.ids_bytes -= ids.bytes();
        }
    }

    /// Blocks with ids in the current epoch, and its estimated bytes.
    #[cfg(test)]
    pub fn usage(&self) -> (usize, usize) {
        let current = self.current();
        let state = current.lock();
        (state.blocks.len(), state.bytes())
    }
}
