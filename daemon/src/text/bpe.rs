//! Byte-level BPE (GPT-2 style): merges one pre-tokenized word into vocabulary ids.
//!
//! Follows llama.cpp's `llm_tokenizer_bpe_session`: the word's bytes start as one symbol
//! each (in the GPT-2 byte alphabet), and the adjacent pair with the lowest merge rank is
//! merged first (ties: leftmost). Merge strings are interned at load so that the merge loop
//! works on small integers and never builds strings.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::fxhash::FxHashMap;
use super::unicode::byte_to_char_table;

/// An interned string that appears in the vocabulary or in a merge rule.
type PieceId = u32;

#[derive(Debug)]
pub(crate) struct BpeModel {
    /// `(left, right)` -> `(rank, merged piece)`.
    merges: FxHashMap<(PieceId, PieceId), (u32, PieceId)>,
    /// The piece of each byte's one-char string in the byte alphabet.
    byte_piece: [PieceId; 256],
    /// Pieces below this are vocabulary ids; the others are merge strings that are not
    /// tokens, numbered from here.
    n_vocab: u32,
    /// Text of the pieces that are not tokens, for the rare fallback.
    extra_text: Vec<String>,
    byte_chars: [char; 256],
    /// The token whose text is exactly this ASCII char, for the fallback.
    ascii_token: [Option<u32>; 128],
}

#[derive(Clone, Copy)]
struct Symbol {
    piece: PieceId,
    /// Length in bytes of the word; 0 marks a symbol merged into its left neighbour.
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl BpeModel {
    /// `token_to_id` maps each token text to its id (the last id wins for duplicates, as
    /// in llama.cpp); `merges` are `"left right"` strings in rank order.
    pub fn new(token_to_id: &FxHashMap<String, u32>, n_vocab: u32, merges: &[String]) -> Self {
        let mut extra: FxHashMap<String, PieceId> = FxHashMap::default();
        let mut extra_text: Vec<String> = Vec::new();
        let mut intern = |s: &str, extra_text: &mut Vec<String>| -> PieceId {
            if let Some(&id) = token_to_id.get(s) {
                return id;
            }
            if let Some(&id) = extra.get(s) {
                return id;
            }
            let id = n_vocab + extra_text.len() as PieceId;
            extra_text.push(s.to_string());
            extra.insert(s.to_string(), id);
            id
        };

        let mut table = FxHashMap::with_capacity_and_hasher(merges.len(), Default::default());
        let mut joined = String::new();
        for (rank, merge) in merges.iter().enumerate() {
            // llama.cpp splits at the first space after the first byte.
            let Some(split) = merge
                .as_bytes()
                .iter()
                .skip(1)
                .position(|&b| b == b' ')
                .map(|p| p + 1)
            else {
                continue;
            };
            let (left, right) = (&merge[..split], &merge[split + 1..]);
            if left.is_empty() || right.is_empty() {
                continue;
            }
            let l = intern(left, &mut extra_text);
            let r = intern(right, &mut extra_text);
            joined.clear();
            joined.push_str(left);
            joined.push_str(right);
            let merged = intern(&joined, &mut extra_text);
            // The first rule for a pair wins, like `unordered_map::emplace`.
            table.entry((l, r)).or_insert((rank as u32, merged));
        }

        let byte_chars = byte_to_char_table();
        let mut buf = [0u8; 4];
        let byte_piece =
            std::array::from_fn(|b| intern(byte_chars[b].encode_utf8(&mut buf), &mut extra_text));
        let ascii_token =
            std::array::from_fn(|b| token_to_id.get(&char::from(b as u8).to_string()).copied());
        Self {
            merges: table,
            byte_piece,
            n_vocab,
            extra_text,
            byte_chars,
            ascii_token,
        }
    }

    /// The word's bytes in the byte alphabet, as the vocabulary spells them.
    pub fn byte_encode(&self, word: &[u8]) -> String {
        word.iter().map(|&b| self.byte_chars[b as usize]).collect()
    }

    /// Appends the ids of one pre-tokenized word (raw bytes) to `out`.
    pub fn encode_word(&self, word: &[u8], out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        let n = word.len();
        let mut symbols: Vec<Symbol> = (0..n)
            .map(|i| Symbol {
                piece: self.byte_piece[word[i] as usize],
                len: 1,
                prev: i.checked_sub(1),
                next: (i + 1 < n).then_some(i + 1),
            })
            .collect();

        // Min-heap on (rank, left index); `size` detects entries made stale by other merges.
        let mut heap: BinaryHeap<Reverse<(u32, usize, usize, usize)>> = BinaryHeap::new();
        let push = |heap: &mut BinaryHeap<_>,
                    symbols: &[Symbol],
                    left: Option<usize>,
                    right: Option<usize>| {
            let (Some(l), Some(r)) = (left, right) else {
                return;
            };
            if let Some(&(rank, _)) = self.merges.get(&(symbols[l].piece, symbols[r].piece)) {
                heap.push(Reverse((rank, l, r, symbols[l].len + symbols[r].len)));
            }
        };
        for i in 1..n {
            push(&mut heap, &symbols, Some(i - 1), Some(i));
        }

        while let Some(Reverse((_, l, r, size))) = heap.pop() {
            let (left, right) = (symbols[l], symbols[r]);
            if left.len == 0 || right.len == 0 || left.len + right.len != size {
                continue;
            }
            let Some(&(_, merged)) = self.merges.get(&(left.piece, right.piece)) else {
                continue;
            };
            symbols[l].len += right.len;
            symbols[l].piece = merged;
            symbols[l].next = right.next;
            symbols[r].len = 0;
            if let Some(nx) = right.next {
                symbols[nx].prev = Some(l);
            }
            push(&mut heap, &symbols, symbols[l].prev, Some(l));
            push(&mut heap, &symbols, Some(l), symbols[l].next);
        }

        let mut at = Some(0);
        while let Some(i) = at {
            let sym = symbols[i];
            if sym.piece < self.n_vocab {
                out.push(sym.piece);
            } else {
                self.fallback(sym.piece, out);
            }
            at = sym.next;
        }
    }

    /// A symbol that is not a token: llama.cpp looks up each byte of its byte-alphabet
    /// spelling as a one-byte token and drops the bytes that are not tokens.
    fn fallback(&self, piece: PieceId, out: &mut Vec<u32>) {
        let Some(spelled) = self.extra_text.get((piece - self.n_vocab) as usize) else {
            return;
        };
        let ids = spelled
            .bytes()
            .filter(u8::is_ascii)
            .filter_map(|b| self.ascii_token[b as usize]);
        out.extend(ids);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(tokens: &[&str], merges: &[&str]) -> BpeModel {
        let map = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i as u32))
            .collect();
        let merges: Vec<String> = merges.iter().map(|m| m.to_string()).collect();
        BpeModel::new(&map, tokens.len() as u32, &merges)
    }

    #[test]
    fn merges_lowest_rank_first() {
        // "abc": rank 0 is "b c", so "a" + "bc" even though "a b" also exists.
        let m = model(&["a", "b", "c", "ab", "bc", "abc"], &["b c", "a b", "a bc"]);
        let mut out = Vec::new();
        m.encode_word(b"abc", &mut out);
        assert_eq!(out, [5]);
        let m = model(&["a", "b", "c", "ab", "bc"], &["b c", "a b"]);
        out.clear();
        m.encode_word(b"abc", &mut out);
        assert_eq!(out, [0, 4]);
    }

    #[test]
    fn equal_ranks_merge_leftmost_first() {
        // "aaa" with only "a a": the left pair merges first -> "aa" "a".
        let m = model(&["a", "aa"], &["a a"]);
        let mut out = Vec::new();
        m.encode_word(b"aaa", &mut out);
        assert_eq!(out, [1, 0]);
    }

    #[test]
    fn bytes_use_the_byte_alphabet() {
        // A space is "Ġ" in the byte alphabet.
        let m = model(&["Ġ", "x", "Ġx"], &["Ġ x"]);
        let mut out = Vec::new();
        m.encode_word(b" x", &mut out);
        assert_eq!(out, [2]);
        assert_eq!(m.byte_encode(" \n".as_bytes()), "ĠĊ");
    }

    #[test]
    fn missing_bytes_are_dropped_like_llama_cpp() {
        // "é" is two bytes; neither byte-alphabet char is a token, so nothing is emitted.
        let m = model(&["a"], &[]);
        let mut out = Vec::new();
        m.encode_word("aé".as_bytes(), &mut out);
        assert_eq!(out, [0]);
    }
}
