//! Streaming detokenization: token ids in, whole-character text deltas out.
//!
//! Byte-level tokens often end in the middle of a UTF-8 character (an emoji can span
//! three tokens). The decoder holds those bytes back until the character completes, so a
//! client never sees half a character, and the concatenation of all deltas (plus
//! [`StreamDecoder::finish`]) equals [`Tokenizer::decode`] of all ids.

use super::Tokenizer;

/// Per-sequence decoder state. Holds no reference to the tokenizer, so a sequence can own
/// it while the tokenizer is shared.
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    /// Bytes of an incomplete character at the end of the stream so far (at most 3).
    pending: Vec<u8>,
    skip_control: bool,
    /// Control tokens rendered all the same (a model's thinking tags).
    shown: Vec<u32>,
}

impl StreamDecoder {
    /// A decoder that renders every token, control tokens included, like `decode`.
    pub fn new() -> Self {
        Self::default()
    }

    /// A decoder that drops control tokens (`<|im_start|>`, BOS, ...), as llama.cpp's
    /// server does when it is not asked to show special tokens.
    pub fn skipping_control() -> Self {
        Self {
            pending: Vec::new(),
            skip_control: true,
            shown: Vec::new(),
        }
    }

    /// [`Self::skipping_control`], but rendering the control tokens `shown` (the
    /// `[THINK]` tags of Mistral's reasoning models, which belong to the text).
    pub fn skipping_control_but(shown: Vec<u32>) -> Self {
        Self {
            shown,
            ..Self::skipping_control()
        }
    }

    /// Whether token `id` has text in this stream.
    pub fn renders(&self, tokenizer: &Tokenizer, id: u32) -> bool {
        !(self.skip_control && tokenizer.is_control(id) && !self.shown.contains(&id))
    }

    /// The text that token `id` completes; empty while a character is still incomplete.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        if !self.renders(tokenizer, id) {
            return String::new();
        }
        self.push_bytes(tokenizer.token_bytes(id))
    }

    /// The text that `bytes` (a token's, or part of one) complete.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        self.drain(false)
    }

    /// Ends the stream: bytes of a character that never completed become U+FFFD.
    pub fn finish(&mut self) -> String {
        self.drain(true)
    }

    /// Whether bytes are held back waiting for the rest of a character.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Emits everything that is decided: valid text, and U+FFFD for each invalid
    /// sequence, matching `String::from_utf8_lossy` on the whole stream. An incomplete
    /// sequence at the end stays pending unless `at_end`.
    fn drain(&mut self, at_end: bool) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, tail) = rest.split_at(e.valid_up_to());
                    // `valid` is valid UTF-8 by construction.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &tail[n..];
                        }
                        None if at_end => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &[];
                            break;
                        }
                        None => {
                            rest = tail;
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::tokenizer::tests::bpe_spec;
    use proptest::prelude::*;

    fn tokenizer() -> Tokenizer {
        Tokenizer::new(bpe_spec("smollm")).expect("valid spec")
    }

    /// Byte-alphabet token ids of `text`'s bytes, one token per byte: the worst case for
    /// split characters.
    fn byte_ids(tok: &Tokenizer, bytes: &[u8]) -> Vec<u32> {
        let table = crate::text::unicode::byte_to_char_table();
        bytes
            .iter()
            .map(|&b| {
                tok.token_id(&table[b as usize].to_string())
                    .expect("byte token")
            })
            .collect()
    }

    #[test]
    fn holds_back_split_characters() {
        let tok = tokenizer();
        let ids = byte_ids(&tok, "a😀".as_bytes());
        let mut dec = StreamDecoder::new();
        assert_eq!(dec.push(&tok, ids[0]), "a");
        for &id in &ids[1..4] {
            assert_eq!(dec.push(&tok, id), "");
            assert!(dec.has_pending());
        }
        assert_eq!(dec.push(&tok, ids[4]), "😀");
        assert!(!dec.has_pending());
        assert_eq!(dec.finish(), "");
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let tok = tokenizer();
        // A stray continuation byte, then a lead byte that never completes.
        let ids = byte_ids(&tok, &[b'x', 0x80, b'y', 0xE2, 0x82]);
        let mut dec = StreamDecoder::new();
        let mut text: String = ids.iter().map(|&id| dec.push(&tok, id)).collect();
        assert_eq!(text, "x\u{FFFD}y");
        text.push_str(&dec.finish());
        assert_eq!(text, tok.decode(&ids));
        assert_eq!(text, "x\u{FFFD}y\u{FFFD}");
    }

    #[test]
    fn can_skip_control_tokens() {
        let tok = tokenizer();
        let mut dec = StreamDecoder::skipping_control();
        let ids = tok.encode("<|im_start|>hello", false, true);
        let text: String = ids.iter().map(|&id| dec.push(&tok, id)).collect();
        assert_eq!(text, "hello");
        let mut dec = StreamDecoder::new();
        let text: String = ids.iter().map(|&id| dec.push(&tok, id)).collect();
        assert_eq!(text, "<|im_start|>hello");
    }

    proptest! {
        #[test]
        fn streamed_text_equals_decode(text in "\\PC{0,30}", split_bytes in any::<bool>(), junk in proptest::collection::vec(any::<u8>(), 0..6)) {
            let tok = tokenizer();
            let mut ids = if split_bytes { byte_ids(&tok, text.as_bytes()) } else { tok.encode(&text, false, true) };
            ids.extend(byte_ids(&tok, &junk));
            let mut dec = StreamDecoder::new();
            let mut streamed = String::new();
            for &id in &ids {
                streamed.push_str(&dec.push(&tok, id));
            }
            streamed.push_str(&dec.finish());
            prop_assert_eq!(streamed, tok.decode(&ids));
        }
    }
}
