//! The captured decode graphs, one per step shape ([`GraphKey`]): the sequence count
//! padded to a power of two, the split count and the block-table width, likewise. A
//! decode step of that shape uploads its tables and replays the graph: one launch
//! instead of a dozen per layer, which is most of a small batch's step time on a fast
//! GPU.
//!
//! A graph holds raw device addresses, so it lives only as long as the buffers it was
//! recorded against: each graph remembers them, and one whose buffers were reallocated
//! since (a larger prefill grew them) is dropped and its shape captured again. Graphs
//! whose buffers still stand are kept, so a batch that goes back and forth between
//! shapes that use different buffers (two sequences on the mat-vec, three on the
//! tensor-core mat-mul with its f16 scratch) replays both instead of recapturing.

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

struct Captured {
    graph: GraphId,
    /// Ids of the scratch buffers it was recorded against (ids are never reused).
    scratch: Vec<u32>,
}

#[derive(Default)]
pub(super) struct Graphs {
    by_key: HashMap<GraphKey, Captured>,
    /// Set after a capture failed: this driver or device cannot capture our steps, so
    /// they run launch by launch from then on.
    pub broken: bool,
    pub captured: u64,
    pub replayed: u64,
}

impl Graphs {
    /// The graph for `key`, if it was captured against the scratch buffers `scratch`
    /// (the step's, as they are now). One recorded against buffers since reallocated is
    /// dropped: its addresses are gone.
    pub fn get(&mut self, gpu: &mut dyn Gpu, key: GraphKey, scratch: &[Buf]) -> Option<GraphId> {
        let captured = self.by_key.get(&key)?;
        let same = captured.scratch.len() == scratch.len()
            && captured
                .scratch
                .iter()
                .zip(scratch)
                .all(|(&id, b)| id == b.id);
        if same {
            return Some(captured.graph);
        }
        if let Some(stale) = self.by_key.remove(&key) {
            gpu.graph_free(stale.graph);
        }
        None
    }

    /// Keeps `graph`, captured for `key` against `scratch`.
    pub fn insert(&mut self, gpu: &mut dyn Gpu, key: GraphKey, graph: GraphId, scratch: &[Buf]) {
        if self.by_key.len() >= MAX_GRAPHS {
            self.clear(gpu);
        }
        let scratch = scratch.iter().map(|b| b.id).collect();
        if let Some(old) = self.by_key.insert(key, Captured { graph, scratch }) {
            gpu.graph_free(old.graph);
        }
        self.captured += 1;
    }

    pub fn clear(&mut self, gpu: &mut dyn Gpu) {
        for (_, c) in self.by_key.drain() {
            gpu.graph_free(c.graph);
        }
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }
}
