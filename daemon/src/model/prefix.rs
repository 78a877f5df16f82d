//! The prefix cache's index: which KV blocks hold which token prefixes.
//!
//! A chat resends its whole history every turn, and many requests share a system
//! prompt. A block of the KV cache that is full of computed positions is a pure
//! function of the tokens up to its end, so a later prompt that starts with the same
//! tokens can take that block instead of computing it again.
//!
//! A block is known by its *content*: its own `BLOCK_TOKENS` tokens and the id of the
//! content before it (the block it follows), so one entry stands for the whole prefix up
//! to its end without hashing that prefix. Keys are compared exactly: two prefixes
//! never share a block by a hash collision. Ids are never reused, so when a block is
//! evicted, the entries that follow it can no longer be reached (no key names the
//! evicted id any more); they age out like any other idle block.
//!
//! Blocks that tables still hold are never evicted. Blocks no table holds stay in the
//! index, idle, until the pool needs them: then the one idle longest goes first. A
//! released table hands back its last block first, so a prefix is evicted from its end.

use std::collections::{BTreeMap, HashMap};

use super::kv::BLOCK_TOKENS;

/// Names one block's content (and so the whole prefix up to its end). `ROOT` is the
/// empty prefix before a sequence's first block.
pub type ContentId = u64;
pub const ROOT: ContentId = 0;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Content {
    before: ContentId,
    tokens: [u32; BLOCK_TOKENS],
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    block: u32,
    id: ContentId,
}

/// What the index knows of one block.
#[derive(Debug, Clone, Default)]
struct BlockState {
    /// The content this block is the cached copy of.
    content: Option<Content>,
    /// When no table holds it: its place in the idle order.
    idle_since: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct PrefixIndex {
    by_content: HashMap<Content, Entry>,
    blocks: Vec<BlockState>,
    /// Idle cached blocks by the time they became idle, oldest first.
    idle: BTreeMap<u64, u32>,
    clock: u64,
    next_id: ContentId,
}

impl PrefixIndex {
    pub fn new(n_blocks: usize) -> Self {
        PrefixIndex {
            by_content: HashMap::new(),
            blocks: vec![BlockState::default(); n_blocks],
            idle: BTreeMap::new(),
            clock: 0,
            next_id: ROOT + 1,
        }
    }

    /// Cached blocks that no table holds: reusable as they are, or evictable.
    pub fn idle_blocks(&self) -> usize {
        self.idle.len()
    }

    /// Blocks whose content the index knows, held or idle.
    pub fn cached_blocks(&self) -> usize {
        self.by_content.len()
    }

    /// True when `block` is some content's cached copy.
    pub fn holds(&self, block: u32) -> bool {
        self.blocks[block as usize].content.is_some()
    }

    /// The cached block for `tokens` (one full block) following the content `before`.
    pub fn lookup(&self, before: ContentId, tokens: &[u32]) -> Option<(u32, ContentId)> {
        let content = Content {
            before,
            tokens: tokens.try_into().ok()?,
        };
        self.by_content.get(&content).map(|e| (e.block, e.id))
    }

    /// Records that `block` holds `tokens` following `before`, and returns the id of that
    /// content. When another block already holds it, that one stays the cached copy and
    /// `block` stays plain (freed as usual when released).
    pub fn insert(&mut self, before: ContentId, tokens: &[u32], block: u32) -> Option<ContentId> {
        let content = Content {
            before,
            tokens: tokens.try_into().ok()?,
        };
        if let Some(e) = self.by_content.get(&content) {
            return Some(e.id);
        }
        debug_assert!(!self.holds(block), "a block caches one content at a time");
        let id = self.next_id;
        self.next_id += 1;
        self.blocks[block as usize].content = Some(content.clone());
        self.by_content.insert(content, Entry { block, id });
        Some(id)
    }

    /// `block` (a cached one) is no longer held by any table.
    pub fn park(&mut self, block: u32) {
        self.clock += 1;
        self.blocks[block as usize].idle_since = Some(self.clock);
        self.idle.insert(self.clock, block);
    }

    /// `block` is held by a table again.
    pub fn unpark(&mut self, block: u32) {
        if let Some(t) = self.blocks[block as usize].idle_since.take() {
            self.idle.remove(&t);
        }
    }

    /// Forgets the block idle longest and hands it out for new content.
    pub fn evict(&mut self) -> Option<u32> {
        let (_, block) = self.idle.pop_first()?;
        let state = &mut self.blocks[block as usize];
        state.idle_since = None;
        if let Some(content) = state.content.take() {
            self.by_content.remove(&content);
        }
        Some(block)
    }
}
