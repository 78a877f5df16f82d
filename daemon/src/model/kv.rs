//! The paged KV cache: a pool of fixed-size blocks shared by all sequences.
//!
//! Each sequence has a block table (its blocks in position order). Blocks are handed
//! out from a free list in whatever order they come, so sequences of any length share
//! memory, and a finished sequence's blocks are reusable at once. The cache holds no
//! notion of requests: the engine owns the tables, the model reads and writes through
//! them.
//!
//! With the prefix cache (`prefix`), a full block whose positions are computed can be
//! published: a later table whose tokens start the same way takes that very block
//! (several tables may hold one block; nobody writes to a full one), and after its last
//! holder lets go it stays cached until the pool needs the memory.

use super::prefix::{ContentId, PrefixIndex, ROOT};

/// Tokens per block. 16 keeps the waste per sequence small while letting attention run
/// over contiguous runs of positions.
pub const BLOCK_TOKENS: usize = 16;

/// A sequence's blocks, in position order. Position `p` lives in block
/// `blocks[p / BLOCK_TOKENS]` at slot `p % BLOCK_TOKENS`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BlockTable {
    blocks: Vec<u32>,
    /// The content ids of the leading full blocks the prefix cache knows: `prefix[i]`
    /// names what `blocks[i]` holds (matched at admission or published since).
    prefix: Vec<ContentId>,
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

/// The block allocator: which of `n_blocks` blocks are free, which tables hold the
/// others, and which hold cached prefixes. Shared by every backend, so the CPU cache and
/// the device caches hand out blocks (and refuse them) and reuse prefixes the same way.
#[derive(Debug, Clone)]
pub struct BlockPool {
    n_blocks: usize,
    /// Blocks with nothing worth keeping.
    free: Vec<u32>,
    /// Tables holding each block.
    holders: Vec<u32>,
    prefixes: PrefixIndex,
    /// Cached blocks given up for room, since the pool was made.
    evicted: u64,
}

impl BlockPool {
    /// A pool of at least `tokens` positions (rounded up to whole blocks, at least one).
    pub fn for_tokens(tokens: usize) -> Self {
        let n_blocks = tokens.div_ceil(BLOCK_TOKENS).max(1);
        // Reverse so that blocks are first handed out in ascending order; tests shuffle
        // the free list to check that nothing depends on that.
        let free = (0..n_blocks as u32).rev().collect();
        BlockPool {
            n_blocks,
            free,
            holders: vec![0; n_blocks],
            prefixes: PrefixIndex::new(n_blocks),
            evicted: 0,
        }
    }

    pub fn total_blocks(&self) -> usize {
        self.n_blocks
    }

    /// Blocks a reservation can take: free ones and cached ones no table holds.
    pub fn free_blocks(&self) -> usize {
        self.free.len() + self.prefixes.idle_blocks()
    }

    /// Blocks that tables hold.
    pub fn used_blocks(&self) -> usize {
        self.n_blocks - self.free_blocks()
    }

    /// Blocks holding a cached prefix, held by tables or idle.
    pub fn cached_blocks(&self) -> usize {
        self.prefixes.cached_blocks()
    }

    /// Cached blocks no table holds: the first to give way to a reservation.
    pub fn idle_blocks(&self) -> usize {
        self.prefixes.idle_blocks()
    }

    /// Cached blocks given up for room so far.
    pub fn evicted_blocks(&self) -> u64 {
        self.evicted
    }

    /// Grows `table` to hold `positions` positions; all or nothing. Free blocks go
    /// first, then the cached blocks idle longest.
    pub fn reserve(&mut self, table: &mut BlockTable, positions: usize) -> Result<(), KvFull> {
        let needed = KvCache::blocks_needed(table, positions);
        let free = self.free_blocks();
        if needed > free {
            return Err(KvFull { needed, free });
        }
        for _ in 0..needed {
            // Checked above: free and idle blocks number at least `needed`.
            let b = match self.free.pop() {
                Some(b) => Some(b),
                None => {
                    let evicted = self.prefixes.evict();
                    self.evicted += u64::from(evicted.is_some());
                    evicted
                }
            };
            if let Some(b) = b {
                self.holders[b as usize] = 1;
                table.blocks.push(b);
            }
        }
        Ok(())
    }

    /// Lets go of every block of `table`. A block no other table holds becomes free,
    /// or idle in the prefix cache if it caches a prefix; the table's last block is let
    /// go first, so that a prefix is evicted from its end.
    pub fn release(&mut self, table: &mut BlockTable) {
        for b in table.blocks.drain(..).rev() {
            let holders = &mut self.holders[b as usize];
            *holders = holders.saturating_sub(1);
            if *holders > 0 {
                continue;
            }
            if self.prefixes.holds(b) {
                self.prefixes.park(b);
            } else {
                self.free.push(b);
            }
        }
        table.prefix.clear();
    }

    /// Gives an empty `table` the cached blocks of the longest prefix of `tokens` made
    /// of whole cached blocks, and returns the positions they hold (a multiple of
    /// [`BLOCK_TOKENS`]); those positions need no computing.
    pub fn reuse_prefix(&mut self, table: &mut BlockTable, tokens: &[u32]) -> usize {
        if !table.blocks.is_empty() {
            return 0;
        }
        let mut before = ROOT;
        for chunk in tokens.chunks_exact(BLOCK_TOKENS) {
            let Some((b, id)) = self.prefixes.lookup(before, chunk) else {
                break;
            };
            if self.holders[b as usize] == 0 {
                self.prefixes.unpark(b);
            }
            self.holders[b as usize] += 1;
            table.blocks.push(b);
            table.prefix.push(id);
            before = id;
        }
        table.blocks.len() * BLOCK_TOKENS
    }

    /// Publishes the full blocks of `table` whose positions are now computed: `computed`
    /// are the tokens whose K/V the table's blocks hold, from position 0.
    pub fn publish_prefix(&mut self, table: &mut BlockTable, computed: &[u32]) {
        let full = (computed.len() / BLOCK_TOKENS).min(table.blocks.len());
        for i in table.prefix.len()..full {
            let before = table.prefix.last().copied().unwrap_or(ROOT);
            let tokens = &computed[i * BLOCK_TOKENS..(i + 1) * BLOCK_TOKENS];
            match self.prefixes.insert(before, tokens, table.blocks[i]) {
                Some(id) => table.prefix.push(id),
                None => break,
            }
        }
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

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    pub fn pool_mut(&mut self) -> &mut BlockPool {
        &mut self.pool
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
    use proptest::prelude::*;

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

    fn toks(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 7 + salt).collect()
    }

    /// A table that computed `tokens` and published its full blocks.
    fn computed(pool: &mut BlockPool, tokens: &[u32]) -> BlockTable {
        let mut t = BlockTable::default();
        pool.reserve(&mut t, tokens.len()).unwrap();
        pool.publish_prefix(&mut t, tokens);
        t
    }

    #[test]
    fn a_published_prefix_is_reused_by_whole_blocks_only() {
        let mut pool = BlockPool::for_tokens(8 * BLOCK_TOKENS);
        let a = toks(2 * BLOCK_TOKENS + 8, 1);
        let mut ta = computed(&mut pool, &a);
        let first_two = ta.blocks()[..2].to_vec();
        pool.release(&mut ta);
        assert_eq!(pool.free_blocks(), 8, "idle cached blocks count as free");
        assert_eq!(
            pool.cached_blocks(),
            2,
            "the partial third block is not cached"
        );

        let mut tb = BlockTable::default();
        assert_eq!(pool.reuse_prefix(&mut tb, &a), 2 * BLOCK_TOKENS);
        assert_eq!(tb.blocks(), &first_two[..]);
        assert_eq!(pool.used_blocks(), 2);
        pool.release(&mut tb);

        // A prompt that leaves the cached one inside its second block takes the first.
        let mut b = a.clone();
        b[BLOCK_TOKENS + 3] += 1;
        assert_eq!(pool.reuse_prefix(&mut tb, &b), BLOCK_TOKENS);
        assert_eq!(tb.blocks(), &first_two[..1]);
        pool.release(&mut tb);
        // One shorter than a block reuses nothing, nor does a different start.
        assert_eq!(pool.reuse_prefix(&mut tb, &a[..BLOCK_TOKENS - 1]), 0);
        assert_eq!(pool.reuse_prefix(&mut tb, &toks(40, 2)), 0);
        assert!(tb.blocks().is_empty());
    }

    #[test]
    fn a_block_is_known_by_everything_before_it() {
        let mut pool = BlockPool::for_tokens(8 * BLOCK_TOKENS);
        // The same second block after two different first blocks.
        let shared_tail = toks(BLOCK_TOKENS, 50);
        let x = [toks(BLOCK_TOKENS, 1), shared_tail.clone()].concat();
        let y = [toks(BLOCK_TOKENS, 2), shared_tail].concat();
        let mut tx = computed(&mut pool, &x);
        pool.release(&mut tx);
        let mut ty = BlockTable::default();
        assert_eq!(pool.reuse_prefix(&mut ty, &y), 0);
        let mut ty = computed(&mut pool, &y);
        pool.release(&mut ty);
        assert_eq!(pool.cached_blocks(), 4);
        let mut t = BlockTable::default();
        assert_eq!(pool.reuse_prefix(&mut t, &y), 2 * BLOCK_TOKENS);
        pool.release(&mut t);
        assert_eq!(pool.reuse_prefix(&mut t, &x), 2 * BLOCK_TOKENS);
    }

    #[test]
    fn shared_blocks_stay_held_until_the_last_holder_lets_go() {
        let mut pool = BlockPool::for_tokens(6 * BLOCK_TOKENS);
        let a = toks(2 * BLOCK_TOKENS, 3);
        let mut ta = computed(&mut pool, &a);
        let mut tb = BlockTable::default();
        assert_eq!(pool.reuse_prefix(&mut tb, &a), 2 * BLOCK_TOKENS);
        pool.reserve(&mut tb, 3 * BLOCK_TOKENS).unwrap();
        assert_eq!(&tb.blocks()[..2], ta.blocks());
        assert_eq!(pool.used_blocks(), 3);
        pool.release(&mut ta);
        assert_eq!(pool.used_blocks(), 3, "b still holds the shared blocks");
        // Every other block goes to a third table: none of b's may be handed out.
        let mut tc = BlockTable::default();
        assert_eq!(
            pool.reserve(&mut tc, 4 * BLOCK_TOKENS),
            Err(KvFull { needed: 4, free: 3 })
        );
        pool.reserve(&mut tc, 3 * BLOCK_TOKENS).unwrap();
        assert!(tc.blocks().iter().all(|b| !tb.blocks().contains(b)));
        pool.release(&mut tb);
        pool.release(&mut tc);
        assert_eq!(pool.free_blocks(), 6);
        assert_eq!(pool.cached_blocks(), 2);
    }

    #[test]
    fn idle_prefixes_are_evicted_from_their_end_and_then_miss() {
        let mut pool = BlockPool::for_tokens(4 * BLOCK_TOKENS);
        let a = toks(4 * BLOCK_TOKENS, 4);
        let mut ta = computed(&mut pool, &a);
        pool.release(&mut ta);
        assert_eq!((pool.free_blocks(), pool.cached_blocks()), (4, 4));
        assert_eq!((pool.idle_blocks(), pool.evicted_blocks()), (4, 0));

        // A new table needs one block: the prefix loses its last one.
        let mut other = BlockTable::default();
        pool.reserve(&mut other, 1).unwrap();
        assert_eq!(pool.cached_blocks(), 3);
        assert_eq!((pool.idle_blocks(), pool.evicted_blocks()), (3, 1));
        let mut t = BlockTable::default();
        assert_eq!(pool.reuse_prefix(&mut t, &a), 3 * BLOCK_TOKENS);
        pool.release(&mut t);

        // The block handed out gets new content: its old key must not find it.
        pool.publish_prefix(&mut other, &toks(BLOCK_TOKENS, 9));
        pool.release(&mut other);
        pool.reserve(&mut t, 4 * BLOCK_TOKENS).unwrap();
        assert_eq!(pool.cached_blocks(), 0, "all evicted for the new table");
        assert_eq!(pool.evicted_blocks(), 5);
        pool.release(&mut t);
        assert_eq!(pool.reuse_prefix(&mut t, &a), 0);
        assert_eq!(pool.reuse_prefix(&mut t, &toks(BLOCK_TOKENS, 9)), 0);
    }

    #[test]
    fn a_prefix_computed_twice_at_once_is_cached_once() {
        let mut pool = BlockPool::for_tokens(4 * BLOCK_TOKENS);
        let a = toks(BLOCK_TOKENS, 5);
        let mut t1 = computed(&mut pool, &a);
        let mut t2 = computed(&mut pool, &a);
        assert_ne!(t1.blocks(), t2.blocks());
        assert_eq!(pool.cached_blocks(), 1);
        let cached = t1.blocks()[0];
        pool.release(&mut t2);
        pool.release(&mut t1);
        assert_eq!((pool.free_blocks(), pool.cached_blocks()), (4, 1));
        let mut t = BlockTable::default();
        assert_eq!(pool.reuse_prefix(&mut t, &a), BLOCK_TOKENS);
        assert_eq!(t.blocks(), &[cached]);
    }

    /// One step of the random workload below.
    #[derive(Debug, Clone)]
    enum Op {
        /// A sequence of these tokens starts and computes them all, `step` at a time.
        Start { tokens: Vec<u32>, step: usize },
        /// The `n % live`-th live sequence ends.
        End(usize),
    }

    /// Tokens that often share whole blocks: a few kinds of block, then a short tail.
    fn workload_tokens() -> impl Strategy<Value = Vec<u32>> {
        (
            proptest::collection::vec(0u32..3, 0..5),
            proptest::collection::vec(0u32..5, 1..20),
        )
            .prop_map(|(blocks, tail)| {
                let mut t: Vec<u32> = blocks
                    .iter()
                    .flat_map(|&k| (0..BLOCK_TOKENS as u32).map(move |i| 100 * k + i % (k + 2)))
                    .collect();
                t.extend(tail);
                t
            })
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (workload_tokens(), 1usize..40).prop_map(|(tokens, step)| Op::Start { tokens, step }),
            any::<usize>().prop_map(Op::End),
        ]
    }

    proptest! {
        /// Sequences come and go as the engine drives them (reuse, reserve, compute in
        /// steps, publish, release) on a pool too small for all: every live sequence's
        /// blocks always hold its own tokens (a shared or reused block is never written,
        /// a held one never handed out), and the counts add up.
        #[test]
        fn shared_and_reused_blocks_always_hold_their_tokens(ops in proptest::collection::vec(op(), 1..60)) {
            const N_BLOCKS: usize = 12;
            let mut pool = BlockPool::for_tokens(N_BLOCKS * BLOCK_TOKENS);
            // The token whose K/V each slot of each block holds, as the model writes them.
            let mut slots = vec![[None::<u32>; BLOCK_TOKENS]; N_BLOCKS];
            let mut live: Vec<(BlockTable, Vec<u32>)> = Vec::new();
            for op in ops {
                match op {
                    Op::Start { tokens, step } => {
                        let mut t = BlockTable::default();
                        let reused = pool.reuse_prefix(&mut t, &tokens[..tokens.len() - 1]);
                        prop_assert_eq!(reused % BLOCK_TOKENS, 0);
                        for (p, &tok) in tokens[..reused].iter().enumerate() {
                            let (b, s) = t.locate(p);
                            prop_assert_eq!(slots[b][s], Some(tok), "reused position {}", p);
                        }
                        if pool.reserve(&mut t, tokens.len()).is_err() {
                            pool.release(&mut t);
                            continue;
                        }
                        let mut done = reused;
                        while done < tokens.len() {
                            let end = (done + step).min(tokens.len());
                            for (p, &tok) in tokens.iter().enumerate().take(end).skip(done) {
                                let (b, s) = t.locate(p);
                                slots[b][s] = Some(tok);
                            }
                            done = end;
                            pool.publish_prefix(&mut t, &tokens[..done]);
                        }
                        live.push((t, tokens));
                    }
                    Op::End(n) => {
                        if !live.is_empty() {
                            let (mut t, _) = live.swap_remove(n % live.len());
                            pool.release(&mut t);
                            prop_assert!(t.blocks().is_empty());
                        }
                    }
                }
                for (t, tokens) in &live {
                    for (p, &tok) in tokens.iter().enumerate() {
                        let (b, s) = t.locate(p);
                        prop_assert_eq!(slots[b][s], Some(tok), "live position {}", p);
                    }
                }
                let held: std::collections::HashSet<u32> =
                    live.iter().flat_map(|(t, _)| t.blocks().iter().copied()).collect();
                prop_assert_eq!(pool.used_blocks(), held.len());
                prop_assert_eq!(pool.free_blocks() + pool.used_blocks(), N_BLOCKS);
                prop_assert!(pool.cached_blocks() <= N_BLOCKS);
            }
        }
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
