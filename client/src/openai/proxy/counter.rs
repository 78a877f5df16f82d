//! Counts the generated pieces of a stream as it passes, for engines that send no usage
//! report: one per line (an SSE `data:` event or an NDJSON object) whose content value
//! is a non-empty string.
//!
//! It works on each chunk by byte search for `":` and keeps only a few bytes between
//! chunks: a key may be split across two chunks. The same escaping argument as in
//! `scan` holds: a key followed by `":` cannot occur inside a JSON string.

use memchr::memchr_iter;

/// Keys whose string value is generated text, with their opening quote: OpenAI chat
/// deltas and legacy completions, Ollama's chat and generate lines, reasoning fields.
const CONTENT_KEYS: [&[u8]; 6] = [
    b"\"content",
    b"\"text",
    b"\"response",
    b"\"reasoning_content",
    b"\"reasoning",
    b"\"thinking",
];
/// Enough of the previous chunk to see the longest key and its closing quote.
const CARRY: usize = 24;

/// Where the value after a matched key stands when a chunk ends mid-way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Value {
    /// No key pending.
    Idle,
    /// Just after `"key":`; spaces may follow, then the opening quote.
    AfterColon,
    /// After the opening quote: a non-quote byte means a non-empty string.
    AfterQuote,
}

#[derive(Debug)]
pub struct PieceCounter {
    carry: [u8; CARRY],
    carry_len: usize,
    value: Value,
    /// This line was counted already: at most one piece per line.
    line_counted: bool,
    pieces: u32,
}

impl Default for PieceCounter {
    fn default() -> Self {
        Self::new()
    }
}

impl PieceCounter {
    pub fn new() -> Self {
        Self {
            carry: [0; CARRY],
            carry_len: 0,
            value: Value::Idle,
            line_counted: false,
            pieces: 0,
        }
    }

    pub fn pieces(&self) -> u32 {
        self.pieces
    }

    pub fn feed(&mut self, chunk: &[u8]) {
        let mut start = 0;
        for newline in memchr_iter(b'\n', chunk) {
            self.scan(&chunk[start..newline]);
            self.line_counted = false;
            self.value = Value::Idle;
            self.carry_len = 0;
            start = newline + 1;
        }
        self.scan(&chunk[start..]);
    }

    /// Scans a piece of the current line.
    fn scan(&mut self, seg: &[u8]) {
        if seg.is_empty() {
            return;
        }
        if !self.line_counted {
            let mut resume = 0;
            if self.value != Value::Idle {
                resume = self.check_value(seg, 0);
            }
            for colon in memchr_iter(b':', seg) {
                if self.line_counted {
                    break;
                }
                if colon < resume || !self.key_ends_at(seg, colon) {
                    continue;
                }
                self.value = Value::AfterColon;
                resume = self.check_value(seg, colon + 1);
            }
        }
        self.remember(seg);
    }

    /// Advances the pending value check over `seg[from..]`; returns where it stopped.
    fn check_value(&mut self, seg: &[u8], from: usize) -> usize {
        let mut i = from;
        while i < seg.len() && self.value != Value::Idle {
            let b = seg[i];
            self.value = match (self.value, b) {
                (Value::AfterColon, b' ' | b'\t' | b'\r') => Value::AfterColon,
                (Value::AfterColon, b'"') => Value::AfterQuote,
                (Value::AfterQuote, b) => {
                    if b != b'"' {
                        self.pieces += 1;
                        self.line_counted = true;
                    }
                    Value::Idle
                }
                // `null`, a number, an object: not generated text.
                _ => Value::Idle,
            };
            i += 1;
        }
        i
    }

    /// True when the bytes before `seg[colon]` (this segment, then the carried end of
    /// the previous one) end with one of the content keys and its closing quote.
    fn key_ends_at(&self, seg: &[u8], colon: usize) -> bool {
        let mut before = [0u8; CARRY];
        let from_seg = colon.min(CARRY);
        let from_carry = (CARRY - from_seg).min(self.carry_len);
        let len = from_carry + from_seg;
        before[..from_carry]
            .copy_from_slice(&self.carry[self.carry_len - from_carry..self.carry_len]);
        before[from_carry..len].copy_from_slice(&seg[colon - from_seg..colon]);
        let Some(key) = before[..len].strip_suffix(b"\"") else {
            return false;
        };
        CONTENT_KEYS.iter().any(|k| key.ends_with(k))
    }

    /// Keeps the last `CARRY` bytes of the line so far.
    fn remember(&mut self, seg: &[u8]) {
        if seg.len() >= CARRY {
            self.carry.copy_from_slice(&seg[seg.len() - CARRY..]);
            self.carry_len = CARRY;
            return;
        }
        let keep = (CARRY - seg.len()).min(self.carry_len);
        self.carry
            .copy_within(self.carry_len - keep..self.carry_len, 0);
        self.carry[keep..keep + seg.len()].copy_from_slice(seg);
        self.carry_len = keep + seg.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count_in_chunks(data: &[u8], chunk: usize) -> u32 {
        let mut counter = PieceCounter::new();
        for piece in data.chunks(chunk) {
            counter.feed(piece);
        }
        counter.pieces()
    }

    /// Every chunk size gives the count of the whole body: keys, quotes and values split
    /// anywhere are still seen once.
    fn assert_count(data: &[u8], want: u32) {
        for chunk in 1..=data.len().min(64) {
            assert_eq!(count_in_chunks(data, chunk), want, "chunk size {chunk}");
        }
        assert_eq!(count_in_chunks(data, data.len().max(1)), want);
    }

    #[test]
    fn counts_non_empty_content_once_per_line() {
        let sse = concat!(
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":null}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\": \"\\n\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\",\"content\":\"x\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"\"},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n",
        );
        assert_count(sse.as_bytes(), 3);
    }

    #[test]
    fn ollama_lines_and_legacy_text() {
        let ndjson = concat!(
            "{\"message\":{\"role\":\"assistant\",\"content\":\"The\"},\"done\":false}\n",
            "{\"response\":\" sky\",\"done\":false}\n",
            "{\"message\":{\"role\":\"assistant\",\"content\":\"\",\"thinking\":\"so\"},\"done\":false}\n",
            "{\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"eval_count\":3}\n",
        );
        assert_count(ndjson.as_bytes(), 3);
        assert_count(b"data: {\"choices\":[{\"text\":\" Paris\"}]}\n\n", 1);
    }

    #[test]
    fn keys_in_generated_text_or_inside_other_keys_do_not_count() {
        // The text mentions `"content":"x"`: escaped, so never a key.
        let line =
            b"data: {\"choices\":[{\"delta\":{\"content\":\"\\\"content\\\":\\\"x\\\"\"}}]}\n\n";
        assert_count(line, 1);
        let not_keys =
            b"{\"context\":\"a\",\"subtext\":\"b\",\"my_content\":\"c\",\"content_type\":\"d\"}\n";
        assert_count(not_keys, 0);
        assert_count(b": keep-alive comment\n\n", 0);
    }
}
