//! The captured decode graphs, one per step shape ([`GraphKey`]): the sequence count
//! padded to a power of two, the split count and the block-table width, likewise. A
//! decode step of that shape uploads its tables and replays the graph: one launch
//! instead of a dozen per layer, which is most of a small batch's step time on a fast
//! GPU.
//!
//! A graph holds raw device addresses, so it lives only as long as the buffers it was
//! recorded against: when any step scratch buffer is reallocated (a larger prefill
//! grew it), every graph is dropped and shapes are captured again.

use std::collections::HashMap;

use super::gpu::{Buf, Gpu, GraphId};

/// Sequences a graph step may pad to; larger decode batches run launch by launch.
pub const MAX_GRAPH_SEQS: usize = 256;
/// Graphs kept at once; past it the cache starts over (shapes seen recently come
/// back at the cost of one capture each).
const MAX_GRAPHS: usize = 64;

/// The shape a decode graph was captured for; every launch argument follows from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphKey {
    pub seqs: usize,
    pub n_splits: usize,
    pub max_blocks: usize,
}

#[derive(Default)]
pub(super) struct Graphs {
    by_key: HashMap<GraphKey, GraphId>,
    /// Ids of the scratch buffers the graphs were recorded against.
    scratch: Vec<u32>,
    /// Set after a capture failed: this driver or device cannot capture our steps, so
    /// they run launch by launch from then on.
    pub broken: bool,
    pub captured: u64,
    pub replayed: u64,
}

impl Graphs {
    /// The graph for `key`, if captured against the scratch buffers `scratch`; graphs
    /// recorded against other buffers are dropped first.
    pub fn get(&mut self, gpu: &mut dyn Gpu, key: GraphKey, scratch: &[Buf]) -> Option<GraphId> {
        if self.scratch.len() != scratch.len()
            || self.scratch.iter().zip(scratch).any(|(&id, b)| id != b.id)
        {
            self.clear(gpu);
            self.scratch = scratch.iter().map(|b| b.id).collect();
        }
        self.by_key.get(&key).copied()
    }

    pub fn insert(&mut self, gpu: &mut dyn Gpu, key: GraphKey, graph: GraphId) {
        if self.by_key.len() >= MAX_GRAPHS {
            self.clear(gpu);
        }
        self.by_key.insert(key, graph);
        self.captured += 1;
    }

    pub fn clear(&mut self, gpu: &mut dyn Gpu) {
        for (_, g) in self.by_key.drain() {
            gpu.graph_free(g);
        }
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }
}
