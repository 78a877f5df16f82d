//! A byte-at-a-time acceptor for JSON text (RFC 8259) whose top-level value is an
//! object: the grammar behind JSON output (`OutputFormat::JsonObject`).
//!
//! The whole state is `Copy`: open containers live in a 64-bit stack (one bit each, so
//! nesting stops at 64 levels), and every lexer state is a few bytes. Trying a token's
//! bytes on a copy therefore costs nothing to undo, which is what masking a vocabulary
//! of 150k tokens every step needs.
//!
//! Beyond the RFC it refuses what would make a generation useless or unparsable by
//! strict readers: whitespace before the object (the answer starts with `{`, and a
//! model cannot spend its tokens before it), more than [`MAX_WHITESPACE_RUN`]
//! whitespace bytes in a row elsewhere outside strings (a small model can otherwise
//! emit newlines until `max_tokens`), numbers a double cannot hold (10^308 and up) and
//! fractions of more than [`MAX_FRACTION_DIGITS`] digits (the same, with a digit),
//! invalid UTF-8 inside strings, and `\u` escapes that leave a surrogate unpaired
//! (serde_json, Go and Java reject those).

/// Longest run of whitespace accepted between tokens: deep pretty-printed indentation
/// fits, a model stuck on newlines does not.
pub const MAX_WHITESPACE_RUN: u8 = 64;

/// Most digits after a number's point: twice what a double can tell apart.
pub const MAX_FRACTION_DIGITS: u8 = 32;

/// Deepest nesting of objects and arrays (the bit stack's width).
pub const MAX_DEPTH: u8 = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonAcceptor {
    /// Bit `i` is set when the container at depth `i` (0 outermost) is an object.
    containers: u64,
    depth: u8,
    lex: Lex,
    /// Whitespace bytes in a row outside strings.
    whitespace_run: u8,
    /// The top-level value is an array, not an object (a Mistral model's tool calls).
    array_root: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lex {
    /// Before the top-level object: `{` only.
    Start,
    /// Before the top-level object: whitespace, then `{` (a tool call after its
    /// opening tag, where models put a newline).
    Lead,
    /// After `{`: a key or `}`.
    ObjectOpen,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// A value is due: after `:`, or after `,` in an array.
    Value,
    /// After `[`: a value or `]`.
    ArrayOpen,
    /// After a value inside a container: `,` or the container's closer.
    AfterValue,
    Str {
        key: bool,
        inner: StrState,
    },
    Number(Num, Magnitude),
    Literal {
        word: Word,
        matched: u8,
    },
    /// The top-level object is closed: trailing whitespace only.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StrState {
    /// Plain characters, or the end of the string.
    Chars,
    /// Inside a multi-byte UTF-8 character: `need` continuation bytes to come, the next
    /// one within `lo..=hi` (narrower than 0x80..=0xBF after some lead bytes, which rules
    /// out overlong forms, surrogates and code points past U+10FFFF).
    Utf8 {
        need: u8,
        lo: u8,
        hi: u8,
    },
    /// After a backslash.
    Escape,
    /// Inside `\uXXXX`: `left` hex digits to come, `value` so far; `low` when this escape
    /// must be the low half of a surrogate pair.
    Unicode {
        left: u8,
        value: u16,
        low: bool,
    },
    /// After a high surrogate's escape: `\` then `u` of the low half must follow.
    PairBackslash,
    PairU,
}

impl StrState {
    const fn utf8(need: u8, lo: u8, hi: u8) -> Self {
        StrState::Utf8 { need, lo, hi }
    }
}

/// What bounds a number's size: it must stay below 10^308, which a double holds
/// (serde_json refuses a number past `f64::MAX` as out of range), and its fraction
/// within [`MAX_FRACTION_DIGITS`] (a small model can otherwise repeat a digit until
/// `max_tokens`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Magnitude {
    /// Digits before the point.
    int_digits: u16,
    /// Digits after the point.
    frac_digits: u8,
    /// The exponent's digits so far, as a value (saturating; only a positive one is
    /// bounded, a negative one only rounds towards 0).
    exp: u16,
    exp_negative: bool,
}

impl Magnitude {
    /// The largest `int_digits + exp` (a value below 10^308).
    const MAX: u32 = 308;

    fn fits(self) -> bool {
        self.frac_digits <= MAX_FRACTION_DIGITS
            && (self.exp_negative || u32::from(self.int_digits) + u32::from(self.exp) <= Self::MAX)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
}

impl Num {
    /// Whether a number may end here.
    fn complete(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::ExpDigits)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Word {
    True,
    False,
    Null,
}

impl Word {
    fn text(self) -> &'static [u8] {
        match self {
            Word::True => b"true",
            Word::False => b"false",
            Word::Null => b"null",
        }
    }
}

/// What one byte was in a JSON text (see [`JsonAcceptor::step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Between tokens.
    Whitespace,
    /// `{` or `[`: a container value opens.
    Open,
    /// `}` or `]`: the innermost container closes.
    Close,
    /// A key's opening quote, a byte inside it, its closing quote.
    KeyOpen,
    KeyText,
    KeyClose,
    Colon,
    Comma,
    /// A string value's opening quote, a byte inside it, its closing quote.
    StrOpen,
    StrText,
    StrClose,
    /// The first byte of a number or of `true`, `false` or `null`.
    ScalarStart,
    /// A later byte of one.
    ScalarText,
}

/// One byte's [`Event`], and whether a number ended just before it (a number has no
/// closer: the byte after it ends it and is read as what follows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub event: Event,
    pub number_ended: bool,
}

impl Step {
    const fn new(event: Event, number_ended: bool) -> Self {
        Self {
            event,
            number_ended,
        }
    }
}

fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl Default for JsonAcceptor {
    fn default() -> Self {
        Self::new()
    }
}

impl JsonAcceptor {
    /// Nothing accepted yet: the text must open an object.
    pub const fn new() -> Self {
        Self {
            containers: 0,
            depth: 0,
            lex: Lex::Start,
            whitespace_run: 0,
            array_root: false,
        }
    }

    /// Nothing accepted yet: the text may begin with whitespace (at most 64 bytes),
    /// then must open an object.
    pub const fn after_whitespace() -> Self {
        Self {
            lex: Lex::Lead,
            ..Self::new()
        }
    }

    /// Nothing accepted yet: the text may begin with whitespace (at most 64 bytes),
    /// then must open an array.
    pub const fn array_after_whitespace() -> Self {
        Self {
            lex: Lex::Lead,
            array_root: true,
            ..Self::new()
        }
    }

    /// Inside a string of an object, between characters: where a token that is plain
    /// string text (see [`JsonAcceptor::in_plain_string`]) can be told from one that is
    /// not.
    pub const fn in_string() -> Self {
        Self {
            containers: 1,
            depth: 1,
            lex: Lex::Str {
                key: false,
                inner: StrState::Chars,
            },
            whitespace_run: 0,
            array_root: false,
        }
    }

    /// Inside a string, between characters. Bytes other than a closing quote are
    /// accepted or refused here whatever the string belongs to (a key or a value, at any
    /// depth): a token without a quote that leaves a string of
    /// [`JsonAcceptor::in_string`] in this state does so in any such state.
    pub fn in_plain_string(&self) -> bool {
        matches!(
            self.lex,
            Lex::Str {
                inner: StrState::Chars,
                ..
            }
        )
    }

    /// Inside a string's escape sequence (after its backslash, before its end).
    pub fn in_escape(&self) -> bool {
        matches!(
            self.lex,
            Lex::Str {
                inner: StrState::Escape
                    | StrState::Unicode { .. }
                    | StrState::PairBackslash
                    | StrState::PairU,
                ..
            }
        )
    }

    /// Whether the top-level object is complete (only whitespace may follow).
    pub fn is_done(&self) -> bool {
        self.lex == Lex::Done
    }

    /// How many containers are open.
    pub fn depth(&self) -> u8 {
        self.depth
    }

    /// Whether a value has just ended: what follows is its container's `,` or closer,
    /// or the end of the text.
    pub fn after_value(&self) -> bool {
        matches!(self.lex, Lex::AfterValue | Lex::Done)
    }

    /// Feeds every byte of `bytes`; false (and a state not to be used) when one of them
    /// cannot continue the text.
    pub fn feed_all(&mut self, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.feed(b))
    }

    /// Feeds one byte; false (and a state not to be used) when it cannot continue the
    /// text.
    pub fn feed(&mut self, b: u8) -> bool {
        self.step(b).is_some()
    }

    /// Feeds one byte and says what it was in the text's structure; `None` (and a state
    /// not to be used) when it cannot continue the text. A reader that follows the
    /// structure (the schema acceptor) builds on this.
    pub fn step(&mut self, b: u8) -> Option<Step> {
        let mut number_ended = false;
        match self.lex {
            Lex::Str { key, inner } => {
                let closes = inner == StrState::Chars && b == b'"';
                let event = match (key, closes) {
                    (true, true) => Event::KeyClose,
                    (true, false) => Event::KeyText,
                    (false, true) => Event::StrClose,
                    (false, false) => Event::StrText,
                };
                return self
                    .feed_string(key, inner, b)
                    .then_some(Step::new(event, false));
            }
            Lex::Number(num, size) => match self.feed_number(num, size, b) {
                Some(accepted) => return accepted.then_some(Step::new(Event::ScalarText, false)),
                // The byte ends the number: it belongs to what follows.
                None => {
                    self.value_done();
                    number_ended = true;
                }
            },
            Lex::Literal { word, matched } => {
                let text = word.text();
                if text[matched as usize] != b {
                    return None;
                }
                let matched = matched + 1;
                if matched as usize == text.len() {
                    self.value_done();
                } else {
                    self.lex = Lex::Literal { word, matched };
                }
                return Some(Step::new(Event::ScalarText, false));
            }
            _ => {}
        }
        let step = |event| Some(Step::new(event, number_ended));
        if is_whitespace(b) && self.lex != Lex::Start {
            self.whitespace_run += 1;
            return (self.whitespace_run <= MAX_WHITESPACE_RUN)
                .then_some(Step::new(Event::Whitespace, number_ended));
        }
        self.whitespace_run = 0;
        let accepted = match (self.lex, b) {
            (Lex::Start | Lex::Lead, b'{') if !self.array_root => {
                return self.open(true).then(|| Step::new(Event::Open, false))
            }
            (Lex::Start | Lex::Lead, b'[') if self.array_root => {
                return self.open(false).then(|| Step::new(Event::Open, false))
            }
            (Lex::ObjectOpen, b'}') => self.close(),
            (Lex::ObjectOpen | Lex::Key, b'"') => {
                self.lex = Lex::Str {
                    key: true,
                    inner: StrState::Chars,
                };
                return step(Event::KeyOpen);
            }
            (Lex::Colon, b':') => {
                self.lex = Lex::Value;
                return step(Event::Colon);
            }
            (Lex::ArrayOpen, b']') => self.close(),
            (Lex::Value | Lex::ArrayOpen, _) => {
                let event = match b {
                    b'{' | b'[' => Event::Open,
                    b'"' => Event::StrOpen,
                    _ => Event::ScalarStart,
                };
                return self
                    .start_value(b)
                    .then_some(Step::new(event, number_ended));
            }
            (Lex::AfterValue, b',') => {
                self.lex = if self.in_object() {
                    Lex::Key
                } else {
                    Lex::Value
                };
                return step(Event::Comma);
            }
            (Lex::AfterValue, b'}') => self.in_object() && self.close(),
            (Lex::AfterValue, b']') => !self.in_object() && self.close(),
            _ => false,
        };
        // What is left are the closers.
        accepted.then_some(Step::new(Event::Close, number_ended))
    }

    fn start_value(&mut self, b: u8) -> bool {
        self.lex = match b {
            b'{' => return self.open(true),
            b'[' => return self.open(false),
            b'"' => Lex::Str {
                key: false,
                inner: StrState::Chars,
            },
            b'-' => Lex::Number(Num::Minus, Magnitude::default()),
            b'0'..=b'9' => {
                let size = Magnitude {
                    int_digits: 1,
                    ..Magnitude::default()
                };
                Lex::Number(if b == b'0' { Num::Zero } else { Num::Int }, size)
            }
            b't' => Lex::Literal {
                word: Word::True,
                matched: 1,
            },
            b'f' => Lex::Literal {
                word: Word::False,
                matched: 1,
            },
            b'n' => Lex::Literal {
                word: Word::Null,
                matched: 1,
            },
            _ => return false,
        };
        true
    }

    fn in_object(&self) -> bool {
        self.depth > 0 && self.containers >> (self.depth - 1) & 1 == 1
    }

    fn open(&mut self, object: bool) -> bool {
        if self.depth == MAX_DEPTH {
            return false;
        }
        self.containers &= !(1 << self.depth);
        self.containers |= u64::from(object) << self.depth;
        self.depth += 1;
        self.lex = if object {
            Lex::ObjectOpen
        } else {
            Lex::ArrayOpen
        };
        true
    }

    /// Closes the innermost container (the caller checked its kind).
    fn close(&mut self) -> bool {
        self.depth -= 1;
        self.value_done();
        true
    }

    /// A value has ended: what its container expects next, or the end of the text.
    fn value_done(&mut self) {
        self.lex = if self.depth == 0 {
            Lex::Done
        } else {
            Lex::AfterValue
        };
    }

    /// `Some(accepted)` when `b` belongs to the number, `None` when it ends a complete
    /// number (and must be read as what follows it).
    fn feed_number(&mut self, num: Num, mut size: Magnitude, b: u8) -> Option<bool> {
        match (num, b) {
            (Num::Minus | Num::Int, b'0'..=b'9') => size.int_digits += 1,
            (Num::Dot | Num::Frac, b'0'..=b'9') => {
                size.frac_digits = size.frac_digits.saturating_add(1);
            }
            (Num::Exp, b'-') => size.exp_negative = true,
            (Num::Exp | Num::ExpSign | Num::ExpDigits, b'0'..=b'9') => {
                size.exp = size
                    .exp
                    .saturating_mul(10)
                    .saturating_add(u16::from(b - b'0'));
            }
            _ => {}
        }
        if !size.fits() {
            return Some(false);
        }
        let next = match (num, b) {
            (Num::Minus, b'0') => Num::Zero,
            (Num::Minus, b'1'..=b'9') => Num::Int,
            (Num::Int, b'0'..=b'9') => Num::Int,
            (Num::Zero | Num::Int, b'.') => Num::Dot,
            (Num::Dot | Num::Frac, b'0'..=b'9') => Num::Frac,
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Num::Exp,
            (Num::Exp, b'+' | b'-') => Num::ExpSign,
            (Num::Exp | Num::ExpSign | Num::ExpDigits, b'0'..=b'9') => Num::ExpDigits,
            _ if num.complete() => return None,
            _ => return Some(false),
        };
        self.lex = Lex::Number(next, size);
        Some(true)
    }

    fn feed_string(&mut self, key: bool, inner: StrState, b: u8) -> bool {
        let inner = match inner {
            StrState::Chars => match b {
                b'"' => {
                    if key {
                        self.lex = Lex::Colon;
                    } else {
                        self.value_done();
                    }
                    return true;
                }
                b'\\' => StrState::Escape,
                0x00..=0x1F => return false,
                0x20..=0x7F => StrState::Chars,
                0xC2..=0xDF => StrState::utf8(1, 0x80, 0xBF),
                0xE0 => StrState::utf8(2, 0xA0, 0xBF),
                0xED => StrState::utf8(2, 0x80, 0x9F),
                0xE1..=0xEF => StrState::utf8(2, 0x80, 0xBF),
                0xF0 => StrState::utf8(3, 0x90, 0xBF),
                0xF1..=0xF3 => StrState::utf8(3, 0x80, 0xBF),
                0xF4 => StrState::utf8(3, 0x80, 0x8F),
                _ => return false,
            },
            StrState::Utf8 { need, lo, hi } => {
                if !(lo..=hi).contains(&b) {
                    return false;
                }
                if need == 1 {
                    StrState::Chars
                } else {
                    StrState::utf8(need - 1, 0x80, 0xBF)
                }
            }
            StrState::Escape => match b {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => StrState::Chars,
                b'u' => StrState::Unicode {
                    left: 4,
                    value: 0,
                    low: false,
                },
                _ => return false,
            },
            StrState::Unicode { left, value, low } => {
                let Some(digit) = (b as char).to_digit(16) else {
                    return false;
                };
                let value = value << 4 | digit as u16;
                // The code points the escape can still end as: refused as soon as all
                // of them are surrogates of the wrong half (or, for the low half, none
                // is one), not at the last digit, so the text never reaches a dead end.
                let shift = 4 * (u32::from(left) - 1);
                let (first, last) = (
                    u32::from(value) << shift,
                    ((u32::from(value) + 1) << shift) - 1,
                );
                let all_low = (0xDC00..=0xDFFF).contains(&first) && last <= 0xDFFF;
                let any_low = first <= 0xDFFF && last >= 0xDC00;
                if (!low && all_low) || (low && !any_low) {
                    return false;
                }
                if left > 1 {
                    StrState::Unicode {
                        left: left - 1,
                        value,
                        low,
                    }
                } else {
                    match (low, value) {
                        (false, 0xD800..=0xDBFF) => StrState::PairBackslash,
                        (true, 0xDC00..=0xDFFF) => StrState::Chars,
                        (true, _) | (false, 0xDC00..=0xDFFF) => return false,
                        (false, _) => StrState::Chars,
                    }
                }
            }
            StrState::PairBackslash if b == b'\\' => StrState::PairU,
            StrState::PairU if b == b'u' => StrState::Unicode {
                left: 4,
                value: 0,
                low: true,
            },
            StrState::PairBackslash | StrState::PairU => return false,
        };
        self.lex = Lex::Str { key, inner };
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_root_is_an_object_unless_an_array_is_asked_for() {
        assert!(!JsonAcceptor::new().feed(b'['));
        assert!(!JsonAcceptor::after_whitespace().feed_all(b" ["));
        let mut list = JsonAcceptor::array_after_whitespace();
        assert!(!list.clone().feed(b'{'));
        assert!(list.feed_all(b" [{\"a\": 1}, 2]"));
        assert!(list.is_done());
        assert!(!list.feed(b','), "one array, nothing after it");
    }

    /// Pieces of JSON (and of near-JSON) to glue into random texts.
    const FRAGMENTS: &[&str] = &[
        "{", "}", "[", "]", ":", ",", "\"", "\"k\"", "\"v\"", " ", "\n", "0", "1", "-", ".", "e",
        "E+", "true", "fals", "e", "null", "\\n", "\\u00e9", "\\ud83d", "\\ude00", "\\", "é", "x",
        "'",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// On texts glued from JSON's pieces, the acceptor takes a whole text exactly when
        /// serde_json reads it as an object that starts the text.
        #[test]
        fn agrees_with_serde_json(pieces in proptest::collection::vec(0..FRAGMENTS.len(), 0..24)) {
            let text: String = pieces.iter().map(|&i| FRAGMENTS[i]).collect();
            let mut a = JsonAcceptor::new();
            let whole = a.feed_all(text.as_bytes()) && a.is_done();
            let serde = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&text);
            let object_first = serde.is_ok() && text.starts_with('{');
            prop_assert_eq!(whole, object_first, "{:?}: {:?}", text, serde.err());
        }

        /// Whatever serde_json writes for an object, compact or pretty, is accepted and
        /// ends exactly at its last byte.
        #[test]
        fn accepts_what_serde_json_writes(value in arb_object()) {
            for text in [serde_json::to_string(&value).unwrap(), serde_json::to_string_pretty(&value).unwrap()] {
                let mut a = JsonAcceptor::new();
                for (i, &b) in text.as_bytes().iter().enumerate() {
                    prop_assert!(!a.is_done());
                    prop_assert!(a.feed(b), "byte {} of {}", i, text);
                }
                prop_assert!(a.is_done());
            }
        }
    }

    fn arb_value() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-1e300f64..1e300).prop_map(Value::from),
            any::<String>().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(any::<String>(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn arb_object() -> impl Strategy<Value = serde_json::Value> {
        proptest::collection::btree_map(any::<String>(), arb_value(), 0..6)
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect()))
    }

    fn accepts(text: &str) -> bool {
        let mut a = JsonAcceptor::new();
        a.feed_all(text.as_bytes()) && a.is_done()
    }

    /// Accepted as a prefix (the whole text continues a valid document).
    fn prefix_ok(text: &[u8]) -> bool {
        JsonAcceptor::new().feed_all(text)
    }

    #[test]
    fn accepts_whole_objects() {
        for text in [
            "{}",
            "{ }",
            "{\"a\":1}",
            "{\"a\" : [1, -2.5e+3, 0, 0.125, 1E9, true, false, null, \"x\"]}\n",
            "{\"nested\":{\"deeper\":[[],{},[{\"k\":\"v\"}]]},\"n\":-0}",
            "{\"esc\":\"quote \\\" slash \\/ \\\\ \\b\\f\\n\\r\\t \\u00e9 \\ud83d\\ude00\"}",
            "{\"utf8\":\"é 漢字 😀\"}",
            "{\"\":\"\"}",
        ] {
            assert!(accepts(text), "{text}");
            assert!(
                serde_json::from_str::<serde_json::Value>(text).is_ok(),
                "{text} is JSON"
            );
        }
    }

    #[test]
    fn refuses_what_is_not_an_object_or_not_json() {
        for text in [
            "[]",
            "1",
            "\"s\"",
            "{\"a\"}",
            "{\"a\":}",
            "{\"a\":1,}",
            "{,}",
            "{\"a\":01}",
            "{\"a\":1.}",
            "{\"a\":.5}",
            "{\"a\":1e}",
            "{\"a\":-}",
            "{\"a\":+1}",
            "{\"a\":tru}",
            "{\"a\":True}",
            "{\"a\":[1,]}",
            "{\"a\":[1}",
            "{\"a\":{]}",
            "{a:1}",
            "{'a':1}",
            "{\"a\":\"\\x\"}",
            "{\"a\":\"\\u12\"}",
            "{\"a\":\"tab\there\"}",
            "{\"a\":\"\\ud83d\"}",
            "{\"a\":\"\\ude00\"}",
            "{\"a\":\"\\ud83d\\u0041\"}",
            "{}{}",
            "{},",
            "```json\n{}",
            " {}",
            "\n{}",
        ] {
            assert!(!accepts(text), "{text}");
        }
    }

    #[test]
    fn agrees_with_serde_json_on_objects() {
        // Every prefix of a valid document is a valid prefix; the document is done only at
        // its end.
        let text = r#"{"name":"sparkd","tags":["fast","local"],"ratio":3.5e-1,"ok":true,"none":null,"obj":{"x":-12}}"#;
        let mut a = JsonAcceptor::new();
        for (i, &b) in text.as_bytes().iter().enumerate() {
            assert!(!a.is_done(), "done early at {i}");
            assert!(a.feed(b), "refused byte {i} ({})", b as char);
        }
        assert!(a.is_done());
    }

    #[test]
    fn numbers_stay_within_what_a_double_holds() {
        let digits = |n: usize| "9".repeat(n);
        assert!(accepts(&format!("{{\"a\":{}}}", digits(308))));
        assert!(!prefix_ok(format!("{{\"a\":{}", digits(309)).as_bytes()));
        assert!(accepts("{\"a\":1e307}"));
        assert!(accepts("{\"a\":-1.5e+307}"));
        assert!(accepts("{\"a\":99e306}"));
        assert!(!prefix_ok(b"{\"a\":99e307"));
        assert!(!prefix_ok(b"{\"a\":5E515"));
        let fraction = |n: usize| format!("{{\"a\":0.{}}}", "1".repeat(n));
        assert!(accepts(&fraction(MAX_FRACTION_DIGITS as usize)));
        assert!(!accepts(&fraction(MAX_FRACTION_DIGITS as usize + 1)));
        // Tiny numbers round to 0, which every reader takes.
        assert!(accepts("{\"a\":1e-99999}"));
        for ok in ["{\"a\":1e307}", "{\"a\":1e-99999}", "{\"a\":99e306}"] {
            assert!(
                serde_json::from_str::<serde_json::Value>(ok).is_ok(),
                "{ok}"
            );
        }
    }

    #[test]
    fn numbers_end_at_the_next_structural_byte() {
        assert!(accepts("{\"a\":12}"));
        assert!(accepts("{\"a\":[12,3]}"));
        assert!(accepts("{\"a\":12 }"));
        assert!(accepts("{\"a\":0.5e-3\n}"));
        assert!(!accepts("{\"a\":12x}"));
        assert!(!accepts("{\"a\":1-2}"));
    }

    #[test]
    fn strings_hold_only_valid_utf8() {
        assert!(prefix_ok(b"{\"a\":\"\xC3\xA9"));
        assert!(prefix_ok(b"{\"a\":\"\xF0\x9F\x98\x80"));
        // A character may end in a later token.
        assert!(prefix_ok(b"{\"a\":\"\xF0\x9F"));
        for bad in [
            &b"{\"a\":\"\xC0\xAF"[..],    // overlong '/'
            b"{\"a\":\"\xE0\x80\xAF",     // overlong
            b"{\"a\":\"\xED\xA0\x80",     // a surrogate
            b"{\"a\":\"\xF4\x90\x80\x80", // past U+10FFFF
            b"{\"a\":\"\x80",
            b"{\"a\":\"\xFF",
            b"{\"a\":\"\xC3\"",
        ] {
            assert!(!prefix_ok(bad), "{bad:?}");
        }
    }

    #[test]
    fn whitespace_runs_are_bounded() {
        let ok = format!("{{{}\"a\":1}}", " ".repeat(MAX_WHITESPACE_RUN as usize));
        assert!(accepts(&ok));
        let too_long = format!("{{{}", "\n".repeat(MAX_WHITESPACE_RUN as usize + 1));
        assert!(!prefix_ok(too_long.as_bytes()));
        // Spaces inside strings are text, not whitespace between tokens.
        let in_string = format!("{{\"a\":\"{}\"}}", " ".repeat(500));
        assert!(accepts(&in_string));
        // The run restarts after each token.
        let pretty = format!("{{\n{0}\"a\": 1,\n{0}\"b\": 2\n}}", " ".repeat(40));
        assert!(accepts(&pretty));
    }

    #[test]
    fn nesting_stops_at_the_maximum_depth() {
        let depth = MAX_DEPTH as usize;
        // The top-level object is one level: 63 arrays inside it reach the maximum.
        let deepest = format!(
            "{{\"a\":{}{}}}",
            "[".repeat(depth - 1),
            "]".repeat(depth - 1)
        );
        assert!(accepts(&deepest));
        let deeper = format!("{{\"a\":{}", "[".repeat(depth));
        assert!(!prefix_ok(deeper.as_bytes()));
    }

    #[test]
    fn closers_match_their_containers() {
        assert!(accepts("{\"a\":[{\"b\":[]}]}"));
        assert!(!prefix_ok(b"{\"a\":[}"));
        assert!(!prefix_ok(b"{\"a\":{\"b\":1]"));
        assert!(!prefix_ok(b"{]"));
    }

    #[test]
    fn only_whitespace_follows_the_object() {
        let mut a = JsonAcceptor::new();
        assert!(a.feed_all(b"{\"a\":1}"));
        assert!(a.is_done());
        assert!(a.clone().feed_all(b" \n"));
        assert!(!a.clone().feed(b'{'));
        assert!(!a.clone().feed(b'x'));
    }

    /// Inside `\u` escapes every accepted prefix can still be finished: a lone low
    /// surrogate (or a high one followed by anything but a low one) is refused at the
    /// digit that decides it, not at the last one, where nothing could follow.
    #[test]
    fn unicode_escapes_never_reach_a_dead_end() {
        // No quote: the walk stays inside the string.
        let alphabet = b"0123456789abcdefABCDEF\\unx";
        let mut frontier = vec![JsonAcceptor::in_string()];
        for _ in 0..14 {
            let mut next = Vec::new();
            for state in &frontier {
                let followers: Vec<JsonAcceptor> = alphabet
                    .iter()
                    .filter_map(|&b| {
                        let mut s = *state;
                        s.feed(b).then_some(s)
                    })
                    .collect();
                assert!(!followers.is_empty(), "dead end: {state:?}");
                next.extend(followers);
            }
            next.sort_by_key(|s| format!("{s:?}"));
            next.dedup();
            frontier = next;
        }
        let mut a = JsonAcceptor::in_string();
        assert!(a.feed_all(b"\\uD"));
        assert!(
            !a.clone().feed(b'C'),
            "\\uDC.. can only be a lone low surrogate"
        );
        assert!(a.feed_all(b"83D\\u"));
        assert!(!a.clone().feed(b'0'), "a high surrogate needs a low one");
        assert!(a.feed_all(b"DE00"));
    }
}
