//! The paged KV cache: a pool of fixed-size blocks shared by all sequences.
//!
//! Each sequence owns a block table (its blocks in position order). Blocks are handed
//! out from a free list in whatever order they come, so sequences of any length share
//! memory, and a finished sequence's blocks are reusable at once. The cache holds no
//! notion of requests: the engine owns the tables, the model reads and writes through
//! them.

/// Tokens per block. 16 keeps the waste per sequence small while letting attention run
/// over contiguous runs of positions.
pub const BLOCK_TOKENS: usize = 16;

/// A sequence's blocks, in position order. Position `p` lives in block
/// `blocks[p / BLOCK_TOKENS]` at slot `p % BLOCK_TOKENS`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BlockTable {
    blocks: Vec<u32>,
}

impl BlockTable {
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    /// Positions this table can hold.
    pub fn capacity(&self) -> usize {
        self.blocks.len() * BLOCK_TOKENS
    }

    #[inline]
    pub fn locate(&self, pos: usize) -> (usize, usize) {
        (self.blocks[pos / BLOCK_TOKENS] as usize, pos % BLOCK_TOKENS)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("KV cache full: {needed} more blocks needed, {free} free")]
pub struct KvFull {
    pub needed: usize,
    pub free: usize,
}

/// The block allocator: which of `n_blocks` blocks are free. Shared by every backend,
/// so the CPU cache and the device caches hand out blocks (and refuse them) the same way.
#[derive(Debug, Clone)]
pub struct BlockPool {
    n_blocks: usize,
    free: Vec<u32>,
}

impl BlockPool {
    /// A pool of at least `tokens` positions (rounded up to whole blocks, at least one).
    pub fn for_tokens(tokens: usize) -> Self {
        let n_blocks = tokens.div_ceil(BLOCK_TOKENS).max(1);
        // Reverse so that blocks are first handed out in ascending order; tests shuffle
        // the free list to check that nothing depends on that.
        let free = (0..n_blocks as u32).rev().collect();
        BlockPool { n_blocks, free }
    }

    pub fn total_blocks(&self) -> usize {
        self.n_blocks
    }

    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    pub fn used_blocks(&self) -> usize {
        self.n_blocks - self.free.len()
    }

    /// Grows `table` to hold `positions` positions; all or nothing.
    pub fn reserve(&mut self, table: &mut BlockTable, positions: usize) -> Result<(), KvFull> {
        let needed = KvCache::blocks_needed(table, positions);
        if needed > self.free.len() {
            return Err(KvFull {
                needed,
                free: self.free.len(),
            });
        }
        for _ in 0..needed {
            // Checked above: the free list holds at least `needed` blocks.
            if let Some(b) = self.free.pop() {
                table.blocks.push(b);
            }
        }
        Ok(())
    }

    /// Returns every block of `table` to the pool.
    pub fn release(&mut self, table: &mut BlockTable) {
        self.free.append(&mut table.blocks);
    }

    #[cfg(test)]
    pub(crate) fn shuffle_free_list(&mut self, seed: u64) {
        use rand::{seq::SliceRandom, SeedableRng};
        self.free
            .shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    }
}

/// Key and value storage for every layer, in f32.
///
/// Layout: `[layer][block][slot][kv_dim]` for keys and for values, so the keys of one
/// block of one layer are one contiguous run that attention streams through.
pub struct KvCache {
    n_layers: usize,
    kv_dim: usize,
    keys: Vec<f32>,
    values: Vec<f32>,
    pool: BlockPool,
}

impl KvCache {
    /// A cache of at least `tokens` positions (rounded up to whole blocks).
    pub fn new(n_layers: usize, kv_dim: usize, tokens: usize) -> Self {
        let pool = BlockPool::for_tokens(tokens);
        let len = n_layers * pool.total_blocks() * BLOCK_TOKENS * kv_dim;
        KvCache {
            n_layers,
            kv_dim,
            keys: vec![0.0; len],
            values: vec![0.0; len],
            pool,
        }
    }

    pub fn total_blocks(&self) -> usize {
        self.pool.total_blocks()
    }

    pub fn free_blocks(&self) -> usize {
        self.pool.free_blocks()
    }

    pub fn used_blocks(&self) -> usize {
        self.pool.used_blocks()
    }

    pub fn bytes(&self) -> usize {
        (self.keys.len() + self.values.len()) * std::mem::size_of::<f32>()
    }

    /// Blocks a table must gain to hold `positions` positions.
    pub fn blocks_needed(table: &BlockTable, positions: usize) -> usize {
        positions
            .div_ceil(BLOCK_TOKENS)
            .saturating_sub(table.blocks.len())
    }

    /// Grows `table` to hold `positions` positions; all or nothing.
    pub fn reserve(&mut self, table: &mut BlockTable, positions: usize) -> Result<(), KvFull> {
        self.pool.reserve(table, positions)
    }

    /// Returns every block of `table` to the pool.
    pub fn release(&mut self, table: &mut BlockTable) {
        self.pool.release(table);
    }

    #[cfg(test)]
    pub(crate) fn shuffle_free_list(&mut self, seed: u64) {
        self.pool.shuffle_free_list(seed);
    }

    #[inline]
    fn offset(&self, layer: usize, block: usize, slot: usize) -> usize {
        ((layer * self.pool.total_blocks() + block) * BLOCK_TOKENS + slot) * self.kv_dim
    }

    /// Stores one position's key and value for `layer`.
    pub fn write(&mut self, layer: usize, table: &BlockTable, pos: usize, k: &[f32], v: &[f32]) {
        let (block, slot) = table.locate(pos);
        let o = self.offset(layer, block, slot);
        self.keys[o..o + self.kv_dim].copy_from_slice(k);
        self.values[o..o + self.kv_dim].copy_from_slice(v);
    }

    /// Keys of one block of one layer: `BLOCK_TOKENS` rows of `kv_dim`.
    #[inline]
    pub fn key_block(&self, layer: usize, block: usize) -> &[f32] {
        let o = self.offset(layer, block, 0);
        &self.keys[o..o + BLOCK_TOKENS * self.kv_dim]
    }

    #[inline]
    pub fn value_block(&self, layer: usize, block: usize) -> &[f32] {
        let o = self.offset(layer, block, 0);
        &self.values[o..o + BLOCK_TOKENS * self.kv_dim]
    }

    pub fn n_layers(&self) -> usize {
        self.n_layers
    }

    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_is_all_or_nothing_and_release_returns_blocks() {
        let mut kv = KvCache::new(1, 4, 4 * BLOCK_TOKENS);
        let mut a = BlockTable::default();
        kv.reserve(&mut a, 3 * BLOCK_TOKENS).unwrap();
        assert_eq!(kv.free_blocks(), 1);
        let mut b = BlockTable::default();
        assert_eq!(
            kv.reserve(&mut b, 2 * BLOCK_TOKENS),
            Err(KvFull { needed: 2, free: 1 })
        );
        assert_eq!(b.capacity(), 0);
        assert_eq!(kv.free_blocks(), 1);
        kv.release(&mut a);
        assert_eq!(kv.free_blocks(), 4);
        assert!(a.blocks().is_empty());
        kv.reserve(&mut b, 2 * BLOCK_TOKENS + 1).unwrap();
        assert_eq!(b.blocks().len(), 3);
    }

    #[test]
    fn growing_a_table_keeps_earlier_blocks() {
        let mut kv = KvCache::new(2, 3, 8 * BLOCK_TOKENS);
        let mut t = BlockTable::default();
        kv.reserve(&mut t, 5).unwrap();
        let first = t.blocks().to_vec();
        kv.reserve(&mut t, BLOCK_TOKENS + 1).unwrap();
        assert_eq!(&t.blocks()[..1], &first[..]);
        assert_eq!(t.blocks().len(), 2);
        kv.write(1, &t, BLOCK_TOKENS, &[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]);
        let (block, slot) = t.locate(BLOCK_TOKENS);
        assert_eq!(slot, 0);
        assert_eq!(&kv.key_block(1, block)[..3], &[1.0, 2.0, 3.0]);
        assert_eq!(&kv.value_block(1, block)[..3], &[4.0, 5.0, 6.0]);
        assert_eq!(&kv.key_block(0, block)[..3], &[0.0, 0.0, 0.0]);
    }
}
