//! Constrained output: the tokens that may come next so that a generation stays valid
//! JSON (`OutputFormat::JsonObject`), held to a JSON Schema where one is given
//! (`OutputFormat::JsonSchema`).
//!
//! Masking asks, for every token of the vocabulary, whether its bytes continue the text
//! so far. Walking the vocabulary in byte order ([`ByteOrderedVocab`]) makes that a walk
//! over a trie without building one: a token shares its first bytes with the one before
//! it, so the acceptor's states for that shared prefix are reused, and when a prefix is
//! refused every following token that starts with it is skipped with one comparison.
//! Inside a string, where nearly every token is allowed, the tokens that are plain string
//! text (no quote or control byte; whole characters and whole escapes) are allowed as a set and
//! only the others are walked: a 152k vocabulary's mask there drops from about 5 ms to a
//! fraction of that. In a string with a length limit, the plain tokens that fit are
//! taken by their character counts, sorted once.

use std::sync::{Arc, OnceLock};

use super::json::JsonAcceptor;
use super::sampler::TokenFilter;
use super::schema::{FrameStack, Pattern, PatternString, PatternWalk, Schema, SchemaState};
use super::Tokenizer;

/// Whether `id` stands for text the output may hold: not a control, unknown or
/// end-of-generation token, and not empty.
fn is_text_token(tok: &Tokenizer, id: u32) -> bool {
    !tok.token_bytes(id).is_empty()
        && !tok.is_control(id)
        && !tok.is_eog(id)
        && tok.unk() != Some(id)
}

/// Tokens in byte order (ties by id), for the trie walk.
#[derive(Debug, Default)]
struct TokenOrder {
    ids: Vec<u32>,
    /// How many leading bytes each token shares with the one before it (0 for the
    /// first).
    shared: Vec<u32>,
}

impl TokenOrder {
    fn new(tok: &Tokenizer, mut ids: Vec<u32>) -> Self {
        ids.sort_by(|&a, &b| tok.token_bytes(a).cmp(tok.token_bytes(b)).then(a.cmp(&b)));
        let shared = std::iter::once(0)
            .chain(ids.windows(2).map(|w| {
                let (a, b) = (tok.token_bytes(w[0]), tok.token_bytes(w[1]));
                a.iter().zip(b).take_while(|(x, y)| x == y).count() as u32
            }))
            .collect();
        Self { ids, shared }
    }
}

/// The vocabulary's text tokens (neither control nor end-of-generation) in byte order,
/// for [`JsonConstraint`]'s mask.
#[derive(Debug, Default)]
pub struct ByteOrderedVocab {
    all: TokenOrder,
    /// One bit per token id: plain string text, which inside a string is always allowed
    /// and leaves the string open.
    plain: Vec<u64>,
    plain_count: usize,
    /// The plain tokens by how many characters each begins (an escape is one), for
    /// strings with a length limit: `(characters, id)`, fewest first.
    plain_by_chars: Vec<(u32, u32)>,
    /// The plain tokens in byte order, walked through a string's pattern alone.
    plain_order: TokenOrder,
    /// The text tokens that are not plain string text.
    not_plain: TokenOrder,
}

impl ByteOrderedVocab {
    pub fn new(tok: &Tokenizer) -> Self {
        let text: Vec<u32> = (0..tok.vocab_size() as u32)
            .filter(|&id| is_text_token(tok, id))
            .collect();
        let mut plain = vec![0u64; tok.vocab_size().div_ceil(64)];
        let mut not_plain = Vec::new();
        let mut plain_by_chars = Vec::new();
        let mut plain_ids = Vec::new();
        for &id in &text {
            // Without a quote the string cannot end (and another begin) inside the token.
            let bytes = tok.token_bytes(id);
            let mut a = JsonAcceptor::in_string();
            let mut chars = 0;
            let accepted = bytes.iter().all(|&b| {
                chars += u32::from(a.in_plain_string());
                a.feed(b)
            });
            if !bytes.contains(&b'"') && accepted && a.in_plain_string() {
                plain[id as usize / 64] |= 1 << (id % 64);
                plain_by_chars.push((chars, id));
                plain_ids.push(id);
            } else {
                not_plain.push(id);
            }
        }
        Self {
            plain_count: text.len() - not_plain.len(),
            all: TokenOrder::new(tok, text),
            plain,
            plain_by_chars: {
                plain_by_chars.sort_unstable();
                plain_by_chars
            },
            plain_order: TokenOrder::new(tok, plain_ids),
            not_plain: TokenOrder::new(tok, not_plain),
        }
    }
}

/// One request's JSON output: its schema, the text accepted so far, and scratch space
/// for masking.
#[derive(Debug, Clone)]
pub struct JsonConstraint {
    schema: Arc<Schema>,
    state: SchemaState,
    /// The frames of the containers around the innermost one; the first `committed`
    /// belong to the accepted text, the rest were pushed by tokens only tried.
    frames: FrameStack,
    committed: usize,
    /// The state after each prefix of the token being tried (index = bytes fed).
    path: Vec<SchemaState>,
    /// The same for plain tokens walked through a string's pattern: the automaton's
    /// progress and the characters so far.
    pattern_path: Vec<(PatternWalk, u32)>,
    /// The plain tokens a string's pattern allowed, for the last few places it was
    /// walked from: a pattern that loops (`^[^0-9]+$`, a hostname's labels) comes back
    /// to the same state character after character, and the walk is most of a mask.
    plain_masks: Vec<(PlainMaskKey, Vec<u64>, usize)>,
    /// The entry of `plain_masks` to replace next.
    plain_masks_next: usize,
    /// One bit per token id: allowed by the last mask.
    allowed: Vec<u64>,
}

impl Default for JsonConstraint {
    /// Any JSON object.
    fn default() -> Self {
        static ANY_OBJECT: OnceLock<Arc<Schema>> = OnceLock::new();
        Self::with_schema(
            ANY_OBJECT
                .get_or_init(|| Arc::new(Schema::default()))
                .clone(),
        )
    }
}

impl JsonConstraint {
    /// Any JSON object.
    pub fn new() -> Self {
        Self::default()
    }

    /// A JSON object that `schema` allows.
    pub fn with_schema(schema: Arc<Schema>) -> Self {
        Self {
            state: SchemaState::new(&schema),
            schema,
            frames: FrameStack::default(),
            committed: 0,
            path: Vec::new(),
            pattern_path: Vec::new(),
            plain_masks: Vec::new(),
            plain_masks_next: 0,
            allowed: Vec::new(),
        }
    }

    /// A JSON object that `schema` allows, after optional whitespace (at most 64
    /// bytes): a tool call's arguments, written after its opening tag.
    pub fn after_whitespace(schema: Arc<Schema>) -> Self {
        Self {
            state: SchemaState::after_whitespace(&schema),
            ..Self::with_schema(schema)
        }
    }

    /// A JSON array that `schema` (compiled with [`Schema::compile_array`]) allows,
    /// after optional whitespace: a Mistral model's list of tool calls.
    pub fn array_after_whitespace(schema: Arc<Schema>) -> Self {
        Self {
            state: SchemaState::array_after_whitespace(&schema),
            ..Self::with_schema(schema)
        }
    }

    /// Takes `bytes` as accepted text: a chosen token's, or bytes no mask checked (the
    /// rest of the token that ended a tool call's opening tag); false when the schema
    /// cannot continue with them (then the constraint is not to be used).
    pub fn accept(&mut self, bytes: &[u8]) -> bool {
        self.frames.truncate(self.committed);
        let accepted = self.state.feed_all(&self.schema, &mut self.frames, bytes);
        self.committed = self.frames.len();
        accepted
    }

    /// Whether the JSON object is complete: the generation ends here.
    pub fn is_done(&self) -> bool {
        self.state.is_done()
    }

    /// Takes the chosen token's bytes (which the mask allowed).
    pub fn advance(&mut self, tok: &Tokenizer, token: u32) {
        let accepted = self.accept(tok.token_bytes(token));
        debug_assert!(accepted, "token {token} was not allowed");
    }

    /// Whether `token` may come next.
    pub fn allows(&mut self, tok: &Tokenizer, token: u32) -> bool {
        let allowed = is_text_token(tok, token)
            && self
                .state
                .clone()
                .feed_all(&self.schema, &mut self.frames, tok.token_bytes(token));
        self.frames.truncate(self.committed);
        allowed
    }

    /// Marks in `self.allowed` every token that may come next; returns how many.
    fn walk(&mut self, tok: &Tokenizer) -> usize {
        let vocab = tok.byte_ordered_vocab();
        self.allowed.clear();
        let longest_plain = vocab.plain_by_chars.last().map_or(0, |&(n, _)| n);
        let (order, mut count) = match self.state.plain_string_room() {
            // A string held to a pattern: plain tokens through the automaton alone,
            // sharing prefixes as below; the others through the whole state.
            None if self.state.pattern_string().is_some() => {
                self.allowed.resize(tok.vocab_size().div_ceil(64), 0);
                let string = self.state.pattern_string().expect("checked above");
                let key = PlainMaskKey::new(&string);
                let count = match self.plain_masks.iter().find(|(k, ..)| *k == key) {
                    Some((_, mask, count)) => {
                        self.allowed.copy_from_slice(mask);
                        *count
                    }
                    None => {
                        let count = walk_through_pattern(
                            self.schema.pattern(string.index),
                            string,
                            &vocab.plain_order,
                            tok,
                            &mut self.pattern_path,
                            &mut self.allowed,
                        );
                        self.remember_plain_mask(key, count);
                        count
                    }
                };
                (&vocab.not_plain, count)
            }
            Some(room) if room >= longest_plain => {
                self.allowed.extend_from_slice(&vocab.plain);
                (&vocab.not_plain, vocab.plain_count)
            }
            // A string with room for `room` more characters: the plain tokens that fit.
            Some(room) => {
                self.allowed.resize(tok.vocab_size().div_ceil(64), 0);
                let fit = vocab.plain_by_chars.partition_point(|&(n, _)| n <= room);
                for &(_, id) in &vocab.plain_by_chars[..fit] {
                    self.allowed[id as usize / 64] |= 1 << (id % 64);
                }
                (&vocab.not_plain, fit)
            }
            None => {
                self.allowed.resize(tok.vocab_size().div_ceil(64), 0);
                (&vocab.all, 0)
            }
        };
        self.path.clear();
        self.path.push(self.state);
        // A prefix of this many bytes of the previous token was refused.
        let mut refused_at = usize::MAX;
        for (&id, &shared) in order.ids.iter().zip(&order.shared) {
            let schema = &*self.schema;
            let shared = shared as usize;
            if shared >= refused_at {
                continue; // starts with the refused prefix
            }
            // `path` holds the states of the previous token's accepted prefixes, the
            // first `shared` bytes of which this token has too.
            self.path.truncate(shared + 1);
            let mut state = self.path[shared];
            refused_at = usize::MAX;
            for (k, &b) in tok.token_bytes(id)[shared..].iter().enumerate() {
                if !state.feed(schema, &mut self.frames, b) {
                    refused_at = shared + k + 1;
                    break;
                }
                self.path.push(state);
            }
            if refused_at == usize::MAX {
                self.allowed[id as usize / 64] |= 1 << (id % 64);
                count += 1;
            }
        }
        self.frames.truncate(self.committed);
        count
    }

    /// Keeps the plain tokens now in `allowed` as what `key` allows.
    fn remember_plain_mask(&mut self, key: PlainMaskKey, count: usize) {
        const KEPT: usize = 8;
        let entry = (key, self.allowed.clone(), count);
        if self.plain_masks.len() < KEPT {
            self.plain_masks.push(entry);
        } else {
            self.plain_masks[self.plain_masks_next] = entry;
            self.plain_masks_next = (self.plain_masks_next + 1) % KEPT;
        }
    }

    fn is_allowed(&self, id: usize) -> bool {
        self.allowed
            .get(id / 64)
            .is_some_and(|w| w >> (id % 64) & 1 == 1)
    }
}

/// What the plain tokens a pattern allows depend on: the pattern, where its automaton
/// is, and the characters the string may still take and must still have (whether a
/// match fits the bounds depends on nothing else).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PlainMaskKey {
    pattern: u32,
    walk: PatternWalk,
    room: u32,
    need: u32,
}

impl PlainMaskKey {
    fn new(string: &PatternString) -> Self {
        Self {
            pattern: string.index,
            walk: string.walk,
            room: match string.max {
                u32::MAX => u32::MAX,
                max => max.saturating_sub(string.chars),
            },
            need: string.min.saturating_sub(string.chars),
        }
    }
}

/// Marks in `allowed` the tokens of `order` (plain string text) whose bytes continue
/// `string` under its pattern; returns how many. The same trie walk as
/// [`JsonConstraint::walk`], over the automaton's state only: plain text cannot end the
/// string and holds only whole escapes, so the JSON syntax has nothing to say about it.
fn walk_through_pattern(
    pattern: &Pattern,
    string: PatternString,
    order: &TokenOrder,
    tok: &Tokenizer,
    path: &mut Vec<(PatternWalk, u32)>,
    allowed: &mut [u64],
) -> usize {
    path.clear();
    path.push((string.walk, string.chars));
    let mut count = 0;
    let mut refused_at = usize::MAX;
    for (&id, &shared) in order.ids.iter().zip(&order.shared) {
        let shared = shared as usize;
        if shared >= refused_at {
            continue;
        }
        path.truncate(shared + 1);
        let (mut walk, mut chars) = path[shared];
        refused_at = usize::MAX;
        for (k, &b) in tok.token_bytes(id)[shared..].iter().enumerate() {
            // Plain tokens hold whole characters and whole escapes (`\n`): a byte
            // starts a character unless it continues a UTF-8 one or an escape.
            let starts = !walk.in_escape() && !(0x80..=0xBF).contains(&b);
            chars += u32::from(starts);
            if !pattern.feed(&mut walk, b, starts, chars, string.min, string.max) {
                refused_at = shared + k + 1;
                break;
            }
            path.push((walk, chars));
        }
        if refused_at == usize::MAX {
            allowed[id as usize / 64] |= 1 << (id % 64);
            count += 1;
        }
    }
    count
}

/// A [`JsonConstraint`] with the vocabulary it reads tokens from, as the sampler takes
/// it.
pub struct JsonFilter<'a> {
    pub constraint: &'a mut JsonConstraint,
    pub tokenizer: &'a Tokenizer,
}

impl TokenFilter for JsonFilter<'_> {
    fn allows(&mut self, token: u32) -> bool {
        self.constraint.allows(self.tokenizer, token)
    }

    fn mask(&mut self, logits: &mut [f32]) -> usize {
        self.constraint.walk(self.tokenizer);
        let mut left = 0;
        for (id, l) in logits.iter_mut().enumerate() {
            if !self.constraint.is_allowed(id) {
                *l = f32::NEG_INFINITY;
            } else if *l > f32::NEG_INFINITY {
                left += 1;
            }
        }
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::tokenizer::tests::bpe_spec;
    use crate::text::unicode::byte_to_char_table;

    /// The byte-level test vocabulary (specials, all 256 bytes, a few merges) plus tokens
    /// that span JSON's structure the way real vocabularies' do.
    fn json_vocab() -> Tokenizer {
        let mut spec = bpe_spec("gpt-2");
        let table = byte_to_char_table();
        let types = spec.token_types.as_mut().unwrap();
        for text in [
            "{\"",
            "\":",
            "\": ",
            "\",",
            "\", \"",
            "\"}",
            "\"]",
            "\"]}",
            "},",
            "}}",
            "{}",
            "[]",
            "[\"",
            "true",
            "tr",
            "false",
            "null",
            "nul",
            " {",
            " [",
            "\n",
            "\n  ",
            "  ",
            "12",
            "1.",
            ".5",
            "0.",
            "e-",
            "E+3",
            "-1",
            "\\n",
            "\\u",
            "\\ud83d",
            "\\ude00",
            "é",
            "😀",
            "\u{1F600}\"",
            "\":\"",
            ",\"",
            "a\"",
            "name",
            "\"name\":",
            "\u{00e9}t\u{00e9}",
        ] {
            spec.tokens
                .push(text.bytes().map(|b| table[b as usize]).collect());
            types.push(1);
        }
        Tokenizer::new(spec).expect("valid spec")
    }

    /// Every token, tried one by one on a copy of the acceptor.
    fn allowed_by_brute_force(c: &mut JsonConstraint, tok: &Tokenizer) -> Vec<u32> {
        (0..tok.vocab_size() as u32)
            .filter(|&id| c.allows(tok, id))
            .collect()
    }

    fn allowed_by_walk(c: &mut JsonConstraint, tok: &Tokenizer) -> Vec<u32> {
        let count = c.walk(tok);
        let ids: Vec<u32> = (0..tok.vocab_size() as u32)
            .filter(|&id| c.is_allowed(id as usize))
            .collect();
        assert_eq!(ids.len(), count);
        ids
    }

    #[test]
    fn the_trie_walk_allows_exactly_what_each_token_alone_would() {
        let tok = json_vocab();
        for text in [
            r#"{"name": "sparkd", "tags": ["fast", 12.5e-3, true, null], "é": {"x": -0}}"#,
            "{\n  \"a\": [1.5E+3, {}, [], \"\\ud83d\\ude00 😀 été\\n\"],\"b\":false}",
        ] {
            walk_matches_brute_force_along(JsonConstraint::new(), &tok, text);
        }
    }

    /// At every byte boundary of `text` (inside strings, escapes, multi-byte
    /// characters, numbers and literals, and between tokens), the mask's walk allows
    /// exactly the tokens that trying each alone does, and at least one.
    fn walk_matches_brute_force_along(mut c: JsonConstraint, tok: &Tokenizer, text: &str) {
        for (i, &b) in text.as_bytes().iter().enumerate() {
            let walk = allowed_by_walk(&mut c, tok);
            assert_eq!(
                walk,
                allowed_by_brute_force(&mut c, tok),
                "after {:?}",
                String::from_utf8_lossy(&text.as_bytes()[..i])
            );
            assert!(!walk.is_empty());
            assert!(c.accept(&[b]), "{:?}", &text.as_bytes()[..=i]);
        }
        assert!(c.is_done());
    }

    /// The same under a schema: keys matched against names, enums, bounded numbers,
    /// strings with a length limit (plain tokens taken by length, down to no room
    /// left) and without.
    #[test]
    fn under_a_schema_the_walk_allows_exactly_what_each_token_alone_would() {
        let tok = json_vocab();
        let schema = serde_json::json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 6},
                "tags": {"type": "array", "items": {"enum": ["fast", "étéé", 12, null]}},
                "n": {"type": "number", "minimum": -2, "maximum": 12.5},
                "i": {"type": "integer", "exclusiveMinimum": 0},
                "free": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{3}(-[0-9]{2})?$"},
                "day": {"type": "string", "format": "date"},
                "loop": {"type": "string", "pattern": "^[^0-9]+$"},
                "short": {"type": "string", "pattern": "[a-z]", "minLength": 2, "maxLength": 5},
                "x": {"anyOf": [
                    {"type": "object", "additionalProperties": {"type": "boolean"}},
                    {"type": "null"}
                ]}
            },
            "required": ["name", "i"],
            "additionalProperties": false
        });
        let schema = Arc::new(Schema::compile(&schema.to_string()).unwrap());
        for text in [
            r#"{"name": "sparkd", "tags": ["fast", 12, null, "étéé"], "n": -1.5, "i": 3, "x": {"a": true}}"#,
            r#"{
  "free": "\ud83d\ude00 😀 été\n","i":12,"x":null,"name":"é", "zip": "123-45", "day": "2024-02-29",
  "loop": "name: été, name: été, name", "short": "é nam"}"#,
        ] {
            walk_matches_brute_force_along(JsonConstraint::with_schema(schema.clone()), &tok, text);
        }
    }

    #[test]
    fn control_unknown_and_end_tokens_never_pass() {
        let tok = json_vocab();
        let mut c = JsonConstraint::new();
        assert!(c.accept(b"{\"a\":\""));
        // Inside a string any text goes, but not `<|im_end|>` and the like, whose text
        // would otherwise be a fine string.
        let allowed = allowed_by_walk(&mut c, &tok);
        // Printable ASCII and UTF-8 lead bytes alone, and the merged tokens.
        assert!(allowed.len() > 96 + 51);
        for id in 0..tok.vocab_size() as u32 {
            if tok.is_control(id) || tok.is_eog(id) {
                assert!(!allowed.contains(&id), "{:?}", tok.token_text(id));
                assert!(!c.allows(&tok, id));
            }
        }
        // A user-defined token is text.
        let tool = tok.token_id("<tool>").unwrap();
        assert!(allowed.contains(&tool));
    }

    #[test]
    fn advancing_follows_the_chosen_tokens_to_the_end() {
        let tok = json_vocab();
        let mut c = JsonConstraint::new();
        for text in ["{\"", "name", "\":", "[\"", "a\"", "]", "}"] {
            let id = tok
                .token_id(
                    &text
                        .bytes()
                        .map(|b| byte_to_char_table()[b as usize])
                        .collect::<String>(),
                )
                .unwrap();
            assert!(!c.is_done());
            assert!(c.allows(&tok, id), "{text}");
            c.advance(&tok, id);
        }
        assert!(c.is_done());
    }

    #[test]
    fn masking_leaves_only_allowed_finite_logits() {
        let tok = json_vocab();
        let mut c = JsonConstraint::new();
        let mut logits = vec![0.5f32; tok.vocab_size()];
        let brace = tok.token_id("{").unwrap();
        logits[brace as usize] = f32::NEG_INFINITY; // banned by a logit bias
        let left = JsonFilter {
            constraint: &mut c,
            tokenizer: &tok,
        }
        .mask(&mut logits);
        // At the start only tokens that begin with `{` may come (not even whitespace),
        // and `{` itself is banned.
        let finite: Vec<u32> = (0..logits.len() as u32)
            .filter(|&i| logits[i as usize].is_finite())
            .collect();
        assert_eq!(finite.len(), left);
        let mut pieces: Vec<String> = finite.iter().map(|&id| tok.piece(id)).collect();
        pieces.sort();
        assert_eq!(pieces, ["{\"", "{}"],);
    }
}
