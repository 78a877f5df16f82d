//! SentencePiece-style BPE (`llama` vocabularies: Llama 2, Mistral v0.1): score-driven merges
//! over characters, with `<0xXX>` byte tokens for characters that are not in the vocabulary.
//!
//! Follows llama.cpp's `llm_tokenizer_spm_session`: adjacent symbols whose concatenation is
//! a token are merged highest score first (ties: leftmost). Symbols are contiguous in the
//! text, so a candidate pair is a slice of it and lookups never allocate.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::fxhash::FxHashMap;

/// A merge candidate: the pair starting at symbol `left`, `size` bytes long.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the lower left index.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    /// 0 once merged into the left neighbour.
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// Tokenizes `text` (spaces already escaped to `▁`) and appends the ids to `out`.
/// `byte_token` resolves one byte that no token covers.
pub(crate) fn encode(
    text: &str,
    token_to_id: &FxHashMap<String, u32>,
    scores: &[f32],
    byte_token: impl Fn(u8) -> Option<u32>,
    out: &mut Vec<u32>,
) {
    let starts: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    let n = starts.len();
    let mut symbols: Vec<Symbol> = (0..n)
        .map(|i| Symbol {
            start: starts[i],
            len: starts.get(i + 1).copied().unwrap_or(text.len()) - starts[i],
            prev: i.checked_sub(1),
            next: (i + 1 < n).then_some(i + 1),
        })
        .collect();

    let mut heap = BinaryHeap::new();
    let try_add = |heap: &mut BinaryHeap<Bigram>,
                   symbols: &[Symbol],
                   left: Option<usize>,
                   right: Option<usize>| {
        let (Some(l), Some(r)) = (left, right) else {
            return;
        };
        let size = symbols[l].len + symbols[r].len;
        let pair = &text[symbols[l].start..symbols[l].start + size];
        if let Some(&id) = token_to_id.get(pair) {
            let score = scores.get(id as usize).copied().unwrap_or(0.0);
            heap.push(Bigram {
                score,
                left: l,
                right: r,
                size,
            });
        }
    };
    for i in 1..n {
        try_add(&mut heap, &symbols, Some(i - 1), Some(i));
    }

    while let Some(b) = heap.pop() {
        let (left, right) = (symbols[b.left], symbols[b.right]);
        if left.len == 0 || right.len == 0 || left.len + right.len != b.size {
            continue;
        }
        symbols[b.left].len += right.len;
        symbols[b.left].next = right.next;
        symbols[b.right].len = 0;
        if let Some(nx) = right.next {
            symbols[nx].prev = Some(b.left);
        }
        try_add(&mut heap, &symbols, symbols[b.left].prev, Some(b.left));
        try_add(&mut heap, &symbols, Some(b.left), symbols[b.left].next);
    }

    let mut at = (n > 0).then_some(0);
    while let Some(i) = at {
        let sym = symbols[i];
        let piece = &text[sym.start..sym.start + sym.len];
        match token_to_id.get(piece) {
            Some(&id) => out.push(id),
            None => out.extend(piece.bytes().filter_map(&byte_token)),
        }
        at = sym.next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(tokens: &[(&str, f32)]) -> (FxHashMap<String, u32>, Vec<f32>) {
        let map = tokens
            .iter()
            .enumerate()
            .map(|(i, (t, _))| (t.to_string(), i as u32))
            .collect();
        (map, tokens.iter().map(|&(_, s)| s).collect())
    }

    #[test]
    fn merges_by_score_and_falls_back_to_bytes() {
        let (map, scores) = vocab(&[
            ("▁", -1.0),
            ("h", -2.0),
            ("i", -2.0),
            ("▁h", -5.0),
            ("hi", -3.0),
            ("▁hi", -4.0),
        ]);
        let mut out = Vec::new();
        // "hi" (-3) beats "▁h" (-5), then "▁" + "hi" -> "▁hi".
        encode("▁hi", &map, &scores, |_| None, &mut out);
        assert_eq!(out, [5]);
        out.clear();
        encode("▁h!", &map, &scores, |b| Some(100 + u32::from(b)), &mut out);
        assert_eq!(out, [3, 100 + u32::from(b'!')]);
    }

    #[test]
    fn equal_scores_merge_leftmost_first() {
        let (map, scores) = vocab(&[("a", 0.0), ("aa", 1.0)]);
        let mut out = Vec::new();
        encode("aaa", &map, &scores, |_| None, &mut out);
        assert_eq!(out, [1, 0]);
    }
}
