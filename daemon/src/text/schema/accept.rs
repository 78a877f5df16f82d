//! Following a JSON text through a compiled [`Schema`], one byte at a time.

use super::compile::{Node, NodeId, ObjectNode, Schema, ANY};
use super::number::NumberProgress;
use super::pattern::PatternWalk;
use crate::text::json::{Event, JsonAcceptor, Step, MAX_DEPTH};

/// No enclosing frame (the innermost container is the top-level object).
const NO_PARENT: u32 = u32::MAX;

/// What a schema asks of one open object or array, and what it has had so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Frame {
    node: NodeId,
    /// Object: one bit per listed property already written.
    seen: u64,
    /// Array: values begun so far.
    count: u32,
}

/// The frames of the containers around the innermost one, as a persistent stack: an
/// entry is never changed once pushed, so every state tried while masking can point
/// into it, and entries pushed by tries are dropped as a whole afterwards
/// ([`FrameStack::truncate`]).
#[derive(Debug, Clone, Default)]
pub struct FrameStack {
    /// Each entry: a frame and the index of the entry around it.
    entries: Vec<(Frame, u32)>,
}

impl FrameStack {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Drops the entries past `len` (no state that is kept may point there).
    pub fn truncate(&mut self, len: usize) {
        self.entries.truncate(len);
    }
}

/// What the scalar or key being written must match.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Pending {
    Nothing,
    /// A key: `candidates` are the names (bits of the object's list) it may still be,
    /// `matched` its bytes so far; `free` when keys outside the list are allowed.
    Key {
        candidates: u64,
        matched: u32,
        free: bool,
    },
    /// An `enum`/`const` value: the texts it may still be, its bytes so far, and the
    /// depth it began at.
    Literal {
        node: NodeId,
        candidates: u64,
        matched: u32,
        depth: u8,
    },
    /// A string: characters begun so far, the bounds, and where its pattern (by index
    /// in the schema) has got to.
    Str {
        chars: u32,
        min: u32,
        max: u32,
        pattern: Option<(u32, PatternWalk)>,
    },
    Number {
        node: NodeId,
        progress: NumberProgress,
    },
}

/// A string held to a pattern, between characters: plain string text (no quote,
/// backslash or control character) continues it exactly when its bytes walk
/// [`Pattern::feed`](super::pattern::Pattern::feed) from here, each character counted
/// once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatternString {
    /// The pattern's index ([`Schema::pattern`]).
    pub index: u32,
    pub walk: PatternWalk,
    /// Characters so far.
    pub chars: u32,
    pub min: u32,
    pub max: u32,
}

/// A JSON text read so far against a schema. `Copy`, apart from the enclosing frames
/// in the [`FrameStack`] it is fed with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SchemaState {
    json: JsonAcceptor,
    /// The innermost open container (the root's node before it opens).
    top: Frame,
    /// The entry of the container around `top`, in the frame stack.
    parent: u32,
    /// The schema of the next value: set after a key, and where an array's values
    /// begin.
    due: NodeId,
    pending: Pending,
}

impl SchemaState {
    /// Nothing read yet: the text must begin the root's object.
    pub fn new(schema: &Schema) -> Self {
        Self::starting(schema, JsonAcceptor::new())
    }

    /// Nothing read yet: the text may begin with whitespace, then the root's object.
    pub fn after_whitespace(schema: &Schema) -> Self {
        Self::starting(schema, JsonAcceptor::after_whitespace())
    }

    /// Nothing read yet: the text may begin with whitespace, then the root's array.
    pub fn array_after_whitespace(schema: &Schema) -> Self {
        Self::starting(schema, JsonAcceptor::array_after_whitespace())
    }

    fn starting(schema: &Schema, json: JsonAcceptor) -> Self {
        Self {
            json,
            top: Frame {
                node: ANY,
                seen: 0,
                count: 0,
            },
            parent: NO_PARENT,
            due: schema.root(),
            pending: Pending::Nothing,
        }
    }

    /// Whether the top-level object is complete.
    pub fn is_done(&self) -> bool {
        self.json.is_done()
    }

    /// Inside a string, between characters, where plain string text (see
    /// [`JsonAcceptor::in_plain_string`]) is allowed up to a number of characters:
    /// `u32::MAX` for a string without a length limit or a key of an object that takes
    /// keys outside its list; `None` where it is not (enum values, listed keys,
    /// escapes, outside strings).
    pub fn plain_string_room(&self) -> Option<u32> {
        if !self.json.in_plain_string() {
            return None;
        }
        match self.pending {
            // Every byte goes through the pattern's automaton.
            Pending::Str {
                pattern: Some(_), ..
            } => None,
            Pending::Str { max: u32::MAX, .. } => Some(u32::MAX),
            Pending::Str { chars, max, .. } => Some(max - chars),
            Pending::Key { free: true, .. } => Some(u32::MAX),
            _ => None,
        }
    }

    /// Inside a string held to a pattern, between characters: where its pattern has
    /// got to, for walking plain string text through the automaton alone (see
    /// [`PatternString`]).
    pub fn pattern_string(&self) -> Option<PatternString> {
        if !self.json.in_plain_string() {
            return None;
        }
        match self.pending {
            Pending::Str {
                chars,
                min,
                max,
                pattern: Some((index, walk)),
            } => Some(PatternString {
                index,
                walk,
                chars,
                min,
                max,
            }),
            _ => None,
        }
    }

    /// Feeds every byte of `bytes`; false (and a state not to be used) when one of
    /// them cannot continue a text the schema allows.
    pub fn feed_all(&mut self, schema: &Schema, frames: &mut FrameStack, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.feed(schema, frames, b))
    }

    /// Feeds one byte; false (and a state not to be used) when no text that begins
    /// with what was read and `b` can match the schema.
    pub fn feed(&mut self, schema: &Schema, frames: &mut FrameStack, b: u8) -> bool {
        let boundary = self.json.in_plain_string();
        let in_escape = self.json.in_escape();
        let depth = self.json.depth();
        let Some(Step {
            event,
            number_ended,
        }) = self.json.step(b)
        else {
            return false;
        };
        if number_ended && !self.end_number(schema, depth) {
            return false;
        }
        if let Pending::Literal { .. } = self.pending {
            return self.feed_literal(schema, b);
        }
        match event {
            Event::Whitespace | Event::Colon => true,
            Event::Open | Event::StrOpen | Event::ScalarStart => {
                self.begin_value(schema, frames, b, depth)
            }
            Event::ScalarText => match &mut self.pending {
                Pending::Number { node, progress } => match schema.node(*node) {
                    Node::Number { integer, bounds } => progress.feed(b, *integer, bounds),
                    _ => true,
                },
                _ => true,
            },
            Event::StrText => match &mut self.pending {
                Pending::Str {
                    chars,
                    min,
                    max,
                    pattern,
                } => {
                    if boundary {
                        *chars += 1;
                        if *chars > *max {
                            return false;
                        }
                    }
                    match pattern {
                        Some((index, walk)) => schema
                            .pattern(*index)
                            .feed(walk, b, boundary, *chars, *min, *max),
                        None => true,
                    }
                }
                _ => true,
            },
            Event::StrClose => {
                let complete = match self.pending {
                    Pending::Str {
                        chars,
                        min,
                        pattern,
                        ..
                    } => {
                        chars >= min
                            && pattern
                                .is_none_or(|(index, walk)| schema.pattern(index).may_close(&walk))
                    }
                    _ => true,
                };
                self.pending = Pending::Nothing;
                complete
            }
            Event::KeyOpen => {
                self.pending = match schema.node(self.top.node) {
                    Node::Object(o) => {
                        let (fitting, free) = keys_that_fit(schema, o, self.json.depth());
                        // A free key that spells a listed name is that name, so names
                        // already written stay candidates (to refuse them).
                        let candidates = if free {
                            low_bits(o.names.len())
                        } else {
                            fitting & !self.top.seen
                        };
                        if candidates == 0 && !free {
                            return false; // no key left to write: `{}` only
                        }
                        Pending::Key {
                            candidates,
                            matched: 0,
                            free,
                        }
                    }
                    // A tagged union's first key is its tag.
                    Node::Tagged(_) => Pending::Key {
                        candidates: 1,
                        matched: 0,
                        free: false,
                    },
                    // A keyed union's is one of its objects' own keys (whose values
                    // fit in the depth left).
                    Node::Keyed(k) => {
                        let depth = self.json.depth();
                        let candidates = (k.owners.iter().zip(&k.names).enumerate())
                            .filter(|(_, (&object, name))| key_fits(schema, object, name, depth))
                            .fold(0u64, |m, (i, _)| m | 1 << i);
                        if candidates == 0 {
                            return false;
                        }
                        Pending::Key {
                            candidates,
                            matched: 0,
                            free: false,
                        }
                    }
                    _ => Pending::Key {
                        candidates: 0,
                        matched: 0,
                        free: true,
                    },
                };
                true
            }
            Event::KeyText => self.key_byte(schema, b, in_escape),
            Event::KeyClose => self.end_key(schema),
            Event::Comma => self.comma(schema),
            Event::Close => self.close(schema, frames),
        }
    }

    fn key_byte(&mut self, schema: &Schema, b: u8, in_escape: bool) -> bool {
        let Pending::Key {
            candidates,
            matched,
            free,
        } = &mut self.pending
        else {
            return true;
        };
        let names = match schema.node(self.top.node) {
            Node::Object(o) => &o.names[..],
            Node::Tagged(t) => std::slice::from_ref(&t.name),
            Node::Keyed(k) => &k.names[..],
            _ => return true, // any key goes
        };
        *candidates &= names_with_byte(names, *candidates, *matched as usize, b);
        *matched = matched.saturating_add(1);
        if *candidates != 0 {
            return true;
        }
        // Off every listed name: only a key outside the list can be written now. Where
        // the object lists names, such a key may not escape a character: `\u006e`
        // could spell a listed name in a way the match above cannot see (and write it
        // twice). An escape that follows a name's own spelling is fine.
        *free && (names.is_empty() || !(b == b'\\' || in_escape))
    }

    fn end_key(&mut self, schema: &Schema) -> bool {
        let Pending::Key {
            candidates,
            matched,
            free,
        } = self.pending
        else {
            return true;
        };
        self.pending = Pending::Nothing;
        let o = match schema.node(self.top.node) {
            Node::Object(o) => o,
            Node::Tagged(t) => {
                self.due = t.tags;
                return candidates & 1 == 1 && t.name.len() == matched as usize;
            }
            // The key picks the object, which goes on with that key written.
            Node::Keyed(k) => {
                let Some(i) = whole(&k.names, candidates, matched) else {
                    return false;
                };
                let object = k.owners[i];
                let Node::Object(o) = schema.node(object) else {
                    return false;
                };
                let Some(key) = o.names.iter().position(|n| *n == k.names[i]) else {
                    return false;
                };
                self.top = Frame {
                    node: object,
                    seen: 1 << key,
                    count: 0,
                };
                self.due = o.values[key];
                return true;
            }
            _ => {
                self.due = ANY;
                return true;
            }
        };
        let whole = candidates
            & low_bits(o.names.len())
            & (0..o.names.len())
                .filter(|&i| o.names[i].len() == matched as usize)
                .fold(0u64, |m, i| m | 1 << i);
        if whole != 0 {
            let i = whole.trailing_zeros();
            let value = o.values[i as usize];
            if self.top.seen >> i & 1 == 1 || !schema.fits(value, self.json.depth()) {
                return false; // written already, or a value too deep for what is left
            }
            self.top.seen |= 1 << i;
            self.due = value;
            return true;
        }
        match (free, o.additional) {
            (true, Some(node)) => {
                self.due = node;
                true
            }
            _ => false,
        }
    }

    fn comma(&mut self, schema: &Schema) -> bool {
        match schema.node(self.top.node) {
            // Another key must be possible.
            Node::Object(o) => {
                let (fitting, free) = keys_that_fit(schema, o, self.json.depth());
                free || fitting & !self.top.seen != 0
            }
            // With unique items `max` is at most the number of values, so below it one
            // not written yet is left.
            Node::Array { max, .. } => {
                let item = schema.array_item(self.top.node, self.top.count);
                self.due = item;
                self.top.count < *max && schema.fits(item, self.json.depth())
            }
            // Only the tag's value comes before the union becomes one object (a keyed
            // union becomes one at its key).
            Node::Tagged(_) | Node::Keyed(_) => false,
            _ => {
                self.due = ANY;
                true
            }
        }
    }

    /// A value begins with `b` (its container's depth is `depth`).
    fn begin_value(&mut self, schema: &Schema, frames: &mut FrameStack, b: u8, depth: u8) -> bool {
        if depth > 0 {
            if let Node::Array { max, .. } = schema.node(self.top.node) {
                if self.top.count >= *max {
                    return false;
                }
                self.top.count += 1;
            }
        }
        let Some(node) = schema.select(self.due, b) else {
            return false;
        };
        // A container whose shallowest value would nest too deep cannot be finished.
        let container = b == b'{' || b == b'[';
        if container && !matches!(schema.node(node), Node::Literals(_)) && !schema.fits(node, depth)
        {
            return false;
        }
        match schema.node(node) {
            Node::Literals(_) => {
                self.pending = Pending::Literal {
                    node,
                    candidates: 0,
                    matched: 0,
                    depth,
                };
                self.feed_literal(schema, b)
            }
            Node::String { min, max, pattern } => {
                self.pending = Pending::Str {
                    chars: 0,
                    min: *min,
                    max: *max,
                    pattern: pattern.map(|index| (index, schema.pattern(index).begin())),
                };
                true
            }
            Node::Number { integer, bounds } => {
                let mut progress = NumberProgress::new();
                let ok = progress.feed(b, *integer, bounds);
                self.pending = Pending::Number { node, progress };
                ok
            }
            Node::Any if b == b'"' => {
                self.pending = Pending::Str {
                    chars: 0,
                    min: 0,
                    max: u32::MAX,
                    pattern: None,
                };
                true
            }
            Node::Object(_) | Node::Tagged(_) | Node::Keyed(_) | Node::Array { .. } | Node::Any
                if container =>
            {
                if depth > 0 {
                    frames.entries.push((self.top, self.parent));
                    self.parent = frames.entries.len() as u32 - 1;
                }
                self.top = Frame {
                    node,
                    seen: 0,
                    count: 0,
                };
                self.due = match schema.node(node) {
                    Node::Array { .. } => schema.array_item(node, 0),
                    _ => ANY,
                };
                true
            }
            // Booleans, null, and numbers of any value: the syntax is all there is.
            _ => true,
        }
    }

    /// A byte of an `enum`/`const` value (its first too).
    fn feed_literal(&mut self, schema: &Schema, b: u8) -> bool {
        let Pending::Literal {
            node,
            candidates,
            matched,
            depth,
        } = self.pending
        else {
            return true;
        };
        let Node::Literals(texts) = schema.node(node) else {
            return false;
        };
        let candidates = if matched == 0 {
            // In an array of unique items, the values not written yet.
            let unwritten = match schema.node(self.top.node) {
                Node::Array { unique: true, .. } => !self.top.seen,
                _ => u64::MAX,
            };
            let mut first = names_with_byte(texts, low_bits(texts.len()) & unwritten, 0, b);
            if b == b'{' || b == b'[' {
                // Only the values that nest no deeper than there is room for.
                let room = MAX_DEPTH - depth;
                for (i, &deep) in schema.literal_nesting(node).iter().enumerate() {
                    if deep > room {
                        first &= !(1 << i);
                    }
                }
            }
            first
        } else {
            names_with_byte(texts, candidates, matched as usize, b)
        };
        let matched = matched + 1;
        if candidates == 0 {
            return false;
        }
        // The value has ended (a number ends only with the byte after it).
        if self.json.depth() == depth && self.json.after_value() {
            self.pending = Pending::Nothing;
            return self.literal_done(schema, node, candidates, matched);
        }
        self.pending = Pending::Literal {
            node,
            candidates,
            matched,
            depth,
        };
        true
    }

    /// The byte just read ended a number whose container is at depth `depth`.
    fn end_number(&mut self, schema: &Schema, depth: u8) -> bool {
        match self.pending {
            Pending::Number { node, progress } => {
                self.pending = Pending::Nothing;
                match schema.node(node) {
                    Node::Number { bounds, .. } => progress.ends_within(bounds),
                    _ => true,
                }
            }
            // A number that is the whole literal (not one inside an object literal,
            // which goes on).
            Pending::Literal {
                node,
                candidates,
                matched,
                depth: start,
            } if start == depth => {
                self.pending = Pending::Nothing;
                self.literal_done(schema, node, candidates, matched)
            }
            _ => true,
        }
    }

    /// An `enum`/`const` value has ended: whether it is one of them whole. Where it is
    /// a tagged union's tag, the object it picks is what the rest is read against.
    fn literal_done(
        &mut self,
        schema: &Schema,
        node: NodeId,
        candidates: u64,
        matched: u32,
    ) -> bool {
        let Node::Literals(texts) = schema.node(node) else {
            return false;
        };
        let Some(i) = whole(texts, candidates, matched) else {
            return false;
        };
        if let Node::Array { unique: true, .. } = schema.node(self.top.node) {
            self.top.seen |= 1 << i;
        }
        if let Node::Tagged(t) = schema.node(self.top.node) {
            if t.tags == node {
                let object = t.owners[i];
                let Node::Object(o) = schema.node(object) else {
                    return false;
                };
                let Some(tag) = o.names.iter().position(|n| *n == t.name) else {
                    return false;
                };
                self.top = Frame {
                    node: object,
                    seen: 1 << tag,
                    count: 0,
                };
            }
        }
        true
    }

    fn close(&mut self, schema: &Schema, frames: &FrameStack) -> bool {
        let complete = match schema.node(self.top.node) {
            Node::Object(o) => o.required & !self.top.seen == 0,
            Node::Array { min, .. } => self.top.count >= *min,
            // Every object of a union requires its tag or key: `{}` is none of them.
            Node::Tagged(_) | Node::Keyed(_) => false,
            _ => true,
        };
        if self.parent != NO_PARENT {
            (self.top, self.parent) = frames.entries[self.parent as usize];
        }
        complete
    }
}

/// In an object whose containers are `depth` deep: the listed names whose values can
/// still be written whole, and whether keys outside the list can.
fn keys_that_fit(schema: &Schema, o: &ObjectNode, depth: u8) -> (u64, bool) {
    let mut fitting = 0;
    for (i, &value) in o.values.iter().enumerate() {
        if schema.fits(value, depth) {
            fitting |= 1 << i;
        }
    }
    (fitting, o.additional.is_some_and(|n| schema.fits(n, depth)))
}

/// Whether `name`'s value in `object` fits in what is left below `depth`.
fn key_fits(schema: &Schema, object: NodeId, name: &[u8], depth: u8) -> bool {
    let Node::Object(o) = schema.node(object) else {
        return false;
    };
    o.names
        .iter()
        .position(|n| **n == *name)
        .is_some_and(|i| schema.fits(o.values[i], depth))
}

/// The low `n` bits set.
fn low_bits(n: usize) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1 << n) - 1
    }
}

/// Of `candidates`, the texts whose byte `at` is `b`.
fn names_with_byte(texts: &[Box<[u8]>], candidates: u64, at: usize, b: u8) -> u64 {
    let mut left = candidates;
    let mut out = 0;
    while left != 0 {
        let i = left.trailing_zeros() as usize;
        left &= left - 1;
        if texts[i].get(at) == Some(&b) {
            out |= 1 << i;
        }
    }
    out
}

/// The one of `candidates` that is exactly `matched` bytes long.
fn whole(texts: &[Box<[u8]>], candidates: u64, matched: u32) -> Option<usize> {
    let mut left = candidates;
    while left != 0 {
        let i = left.trailing_zeros() as usize;
        left &= left - 1;
        if texts[i].len() == matched as usize {
            return Some(i);
        }
    }
    None
}
