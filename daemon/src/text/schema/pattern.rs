//! `pattern`, and the `format`s sparkd enforces, for string values: a regular
//! expression compiled to a DFA over UTF-8 bytes that a string's characters walk as
//! they are written.
//!
//! The DFA is built for `(?s:.*)(?:P)(?s:.*)`, anchored at both ends: JSON Schema's
//! `pattern` matches anywhere in the string unless it says `^`/`$` itself, and
//! wrapping it so turns "some substring matches" into "the string ends in an
//! accepting state", which is all the acceptor has to check when the string closes.
//!
//! Refusing a byte only when the DFA dies is not enough for a sampler: a string could
//! walk into a state whose every match needs more characters than `maxLength` leaves,
//! or closes before `minLength`, and then no token could continue it. So each state
//! carries the fewest and the most characters still to write before the string may
//! close, and a byte is refused as soon as the bounds cannot be met.

use std::collections::{HashMap, VecDeque};
use std::fmt;

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::nfa::thompson;
use regex_automata::util::primitives::StateID;
use regex_automata::util::{start, syntax};
use regex_automata::{Anchored, MatchKind};

/// Most DFA states a pattern may have: patterns like `^[a-z]{1,64}$` need a few
/// hundred; a bound on what a hostile one costs to compile and to keep.
const MAX_STATES: usize = 10_000;
/// Bytes of memory the DFA may take, its construction, and the NFA it is built from.
const MAX_DFA_BYTES: usize = 8 << 20;
/// Longest pattern text.
const MAX_PATTERN_BYTES: usize = 4096;
/// No accepting state can be reached (in `fewest`).
const UNREACHABLE: u32 = u32::MAX;
/// No limit on the characters still to write (in `most`).
const UNBOUNDED: u32 = u32::MAX;

/// A compiled pattern.
#[derive(Clone)]
pub struct Pattern {
    /// What the pattern came from (`pattern` text or `format` name), for errors and
    /// for comparing schemas.
    source: String,
    dfa: dense::DFA<Vec<u32>>,
    start: StateID,
    stride2: usize,
    /// Per state (by `id >> stride2`): the fewest characters still to write before the
    /// string may close, or `UNREACHABLE`.
    fewest: Vec<u32>,
    /// Per state: the most characters that may still be written, or `UNBOUNDED`.
    most: Vec<u32>,
}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pattern")
            .field("source", &self.source)
            .field("states", &self.fewest.len())
            .finish()
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

/// Where a string's characters have taken its pattern, and how far into an escape
/// sequence the string is. `Copy`, like the acceptor state that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatternWalk {
    state: StateID,
    escape: Escape,
}

impl PatternWalk {
    /// Inside an escape sequence (after its backslash, before its last byte).
    pub fn in_escape(&self) -> bool {
        self.escape != Escape::None
    }
}

/// The escapes a string held to a pattern may use: the short ones, and `\u00XX` for
/// control characters (some have no short form). Any other character is written as itself (which
/// is what models write anyway), so the DFA sees one character per escape without
/// deciding surrogate pairs, and every escape begun can be finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Escape {
    None,
    /// After the backslash.
    Backslash,
    /// After `\u`, `\u0`, `\u00`: `digits` of the four read, all zero.
    Zeros {
        digits: u8,
    },
    /// After `\u00` and the third digit (`0` or `1`): the high half of the code point.
    Low {
        high: u8,
    },
}

/// Bytes that end a short escape, and what each stands for.
const SHORT_ESCAPES: [(u8, u8); 8] = [
    (b'"', b'"'),
    (b'\\', b'\\'),
    (b'/', b'/'),
    (b'b', 0x08),
    (b'f', 0x0C),
    (b'n', b'\n'),
    (b'r', b'\r'),
    (b't', b'\t'),
];

impl Pattern {
    /// Compiles a JSON Schema `pattern` (ECMA-262 syntax, the common subset: classes,
    /// groups, alternation, quantifiers, anchors, Unicode classes). Look-around and
    /// back-references, which no DFA can follow, are refused.
    pub fn ecma(pattern: &str) -> Result<Pattern, String> {
        if pattern.len() > MAX_PATTERN_BYTES {
            return Err(format!("a pattern longer than {MAX_PATTERN_BYTES} bytes"));
        }
        let translated = translate_ecma(pattern)?;
        Self::build(pattern, &translated)
    }

    /// Compiles a pattern already in the `regex` crate's syntax (`format`s).
    pub fn regex(source: &str, regex: &str) -> Result<Pattern, String> {
        Self::build(source, regex)
    }

    fn build(source: &str, regex: &str) -> Result<Pattern, String> {
        let dfa = dense::Builder::new()
            .configure(
                dense::Config::new()
                    .start_kind(StartKind::Anchored)
                    .match_kind(MatchKind::All)
                    .dfa_size_limit(Some(MAX_DFA_BYTES))
                    .determinize_size_limit(Some(MAX_DFA_BYTES)),
            )
            .syntax(syntax::Config::new().unicode(true).utf8(true))
            // Nested counted repetitions multiply: stop before the NFA grows large.
            .thompson(thompson::Config::new().nfa_size_limit(Some(MAX_DFA_BYTES)))
            .build(&format!("(?s:.*)(?:{regex})(?s:.*)"))
            .map_err(|e| describe_build_error(&e))?;
        let start = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .map_err(|e| format!("the pattern cannot start: {e}"))?;
        let mut pattern = Pattern {
            source: source.to_string(),
            stride2: dfa.stride2(),
            dfa,
            start,
            fewest: Vec::new(),
            most: Vec::new(),
        };
        pattern.measure()?;
        Ok(pattern)
    }

    /// Works out `fewest` and `most` for every state reachable from the start.
    fn measure(&mut self) -> Result<(), String> {
        let graph = StateGraph::explore(self)?;
        let fewest = graph.fewest();
        let most = graph.most(&fewest);
        let len = graph
            .ids
            .iter()
            .map(|&id| self.index(id))
            .max()
            .unwrap_or(0)
            + 1;
        self.fewest = vec![UNREACHABLE; len];
        self.most = vec![0; len];
        for (i, &id) in graph.ids.iter().enumerate() {
            let at = self.index(id);
            self.fewest[at] = fewest[i];
            self.most[at] = most[i];
        }
        Ok(())
    }

    fn index(&self, id: StateID) -> usize {
        id.as_usize() >> self.stride2
    }

    /// Bytes of memory the automaton and its tables take.
    pub fn memory_usage(&self) -> usize {
        self.dfa.memory_usage() + (self.fewest.len() + self.most.len()) * 4
    }

    /// The fewest and most characters a whole string matching the pattern may have
    /// (`None` when no string matches).
    pub fn lengths(&self) -> Option<(u32, u32)> {
        let at = self.index(self.start);
        (self.fewest[at] != UNREACHABLE).then(|| (self.fewest[at], self.most[at]))
    }

    /// A string just opened.
    pub fn begin(&self) -> PatternWalk {
        PatternWalk {
            state: self.start,
            escape: Escape::None,
        }
    }

    fn accepts_at_end(&self, state: StateID) -> bool {
        self.dfa.is_match_state(self.dfa.next_eoi_state(state))
    }

    /// Whether a string in `state`, with `chars` characters so far (the one being
    /// written included), can still end matching within `min..=max` characters.
    fn viable(&self, state: StateID, chars: u32, min: u32, max: u32) -> bool {
        if self.dfa.is_dead_state(state) || self.dfa.is_quit_state(state) {
            return false;
        }
        let at = self.index(state);
        let (Some(&fewest), Some(&most)) = (self.fewest.get(at), self.most.get(at)) else {
            return false;
        };
        fewest != UNREACHABLE
            && u64::from(chars) + u64::from(fewest) <= u64::from(max)
            && (most == UNBOUNDED || u64::from(chars) + u64::from(most) >= u64::from(min))
    }

    /// Whether some character written next as `code` (one of `codes`, all below 0x80)
    /// keeps the string viable.
    fn any_viable(
        &self,
        state: StateID,
        codes: impl IntoIterator<Item = u8>,
        chars: u32,
        min: u32,
        max: u32,
    ) -> bool {
        codes
            .into_iter()
            .any(|c| self.viable(self.dfa.next_state(state, c), chars, min, max))
    }

    /// One byte of the string's text (escapes as written), `chars` characters begun so
    /// far including the one `b` belongs to. `starts_char`: `b` begins a character
    /// (rather than continuing one, or an escape). False when the string can no longer
    /// match within `min..=max` characters.
    pub fn feed(
        &self,
        walk: &mut PatternWalk,
        b: u8,
        starts_char: bool,
        chars: u32,
        min: u32,
        max: u32,
    ) -> bool {
        let step = |walk: &mut PatternWalk, byte: u8| {
            walk.state = self.dfa.next_state(walk.state, byte);
            walk.escape = Escape::None;
            self.viable(walk.state, chars, min, max)
        };
        match walk.escape {
            Escape::None if starts_char && b == b'\\' => {
                walk.escape = Escape::Backslash;
                let controls = 0..0x20u8;
                self.any_viable(
                    walk.state,
                    controls.chain([b'"', b'\\', b'/']),
                    chars,
                    min,
                    max,
                )
            }
            Escape::None => step(walk, b),
            Escape::Backslash => match SHORT_ESCAPES.iter().find(|(e, _)| *e == b) {
                Some(&(_, byte)) => step(walk, byte),
                None if b == b'u' => {
                    walk.escape = Escape::Zeros { digits: 0 };
                    self.any_viable(walk.state, 0..0x20, chars, min, max)
                }
                None => false,
            },
            Escape::Zeros { digits } => match (digits, b) {
                (0 | 1, b'0') => {
                    walk.escape = Escape::Zeros { digits: digits + 1 };
                    true
                }
                (2, b'0' | b'1') => {
                    let high = b - b'0';
                    walk.escape = Escape::Low { high };
                    let first = high << 4;
                    self.any_viable(walk.state, first..first + 16, chars, min, max)
                }
                _ => false,
            },
            Escape::Low { high } => match (b as char).to_digit(16) {
                Some(low) => step(walk, high << 4 | low as u8),
                None => false,
            },
        }
    }

    /// Whether the string may close here.
    pub fn may_close(&self, walk: &PatternWalk) -> bool {
        walk.escape == Escape::None && self.accepts_at_end(walk.state)
    }

    /// The `pattern` text or `format` name it was compiled from.
    pub fn source(&self) -> &str {
        &self.source
    }
}

/// The DFA's states reachable from the start, numbered in the order found, with their
/// edges (one per distinct target and weight).
struct StateGraph {
    ids: Vec<StateID>,
    accepting: Vec<bool>,
    /// Per state: `(target, weight)`, weight 1 for a byte that begins a character.
    edges: Vec<Vec<(u32, u8)>>,
}

impl StateGraph {
    fn explore(pattern: &Pattern) -> Result<StateGraph, String> {
        let dfa = &pattern.dfa;
        let mut number: HashMap<StateID, u32> = HashMap::new();
        let mut graph = StateGraph {
            ids: Vec::new(),
            accepting: Vec::new(),
            edges: Vec::new(),
        };
        let mut queue = VecDeque::new();
        number.insert(pattern.start, 0);
        graph.ids.push(pattern.start);
        queue.push_back(pattern.start);
        while let Some(id) = queue.pop_front() {
            let mut edges = Vec::new();
            for b in 0..=255u8 {
                let next = dfa.next_state(id, b);
                if dfa.is_dead_state(next) || dfa.is_quit_state(next) {
                    continue;
                }
                let target = match number.get(&next) {
                    Some(&n) => n,
                    None => {
                        if graph.ids.len() >= MAX_STATES {
                            return Err(format!(
                                "the pattern needs more than {MAX_STATES} automaton \
                                 states; counted repetitions multiply them, so \
                                 `^[a-z]+$` with `maxLength` says what `^[a-z]{{1,300}}$` \
                                 does far more cheaply"
                            ));
                        }
                        let n = graph.ids.len() as u32;
                        number.insert(next, n);
                        graph.ids.push(next);
                        queue.push_back(next);
                        n
                    }
                };
                // UTF-8 continuation bytes (0x80..=0xBF) do not begin a character.
                let weight = u8::from(!(0x80..=0xBF).contains(&b));
                edges.push((target, weight));
            }
            edges.sort_unstable();
            edges.dedup();
            graph.accepting.push(pattern.accepts_at_end(id));
            graph.edges.push(edges);
        }
        Ok(graph)
    }

    /// Fewest characters to an accepting state: a 0-1 breadth-first search backwards
    /// from them.
    fn fewest(&self) -> Vec<u32> {
        let n = self.ids.len();
        let mut back: Vec<Vec<(u32, u8)>> = vec![Vec::new(); n];
        for (from, edges) in self.edges.iter().enumerate() {
            for &(to, w) in edges {
                back[to as usize].push((from as u32, w));
            }
        }
        let mut dist = vec![UNREACHABLE; n];
        let mut queue = VecDeque::new();
        for (i, _) in self.accepting.iter().enumerate().filter(|(_, &a)| a) {
            dist[i] = 0;
            queue.push_back(i as u32);
        }
        while let Some(to) = queue.pop_front() {
            let d = dist[to as usize];
            for &(from, w) in &back[to as usize] {
                let candidate = d + u32::from(w);
                if candidate < dist[from as usize] {
                    dist[from as usize] = candidate;
                    if w == 0 {
                        queue.push_front(from);
                    } else {
                        queue.push_back(from);
                    }
                }
            }
        }
        dist
    }

    /// Most characters to an accepting state, over the states that reach one:
    /// unbounded where a cycle lies on the way (a loop of whole characters), else the
    /// longest path, over the strongly connected components in reverse topological
    /// order.
    fn most(&self, fewest: &[u32]) -> Vec<u32> {
        let n = self.ids.len();
        let live = |s: u32| fewest[s as usize] != UNREACHABLE;
        let components = strongly_connected(n, |s| {
            self.edges[s as usize]
                .iter()
                .map(|&(t, _)| t)
                .filter(|&t| live(t))
                .collect()
        });
        let mut most = vec![0u32; n];
        for component in &components {
            let cyclic = component.len() > 1
                || self.edges[component[0] as usize]
                    .iter()
                    .any(|&(t, _)| t == component[0]);
            for &s in component {
                if !live(s) {
                    continue;
                }
                most[s as usize] = if cyclic {
                    UNBOUNDED
                } else {
                    let mut best = 0u32;
                    for &(t, w) in &self.edges[s as usize] {
                        if !live(t) {
                            continue;
                        }
                        let m = most[t as usize];
                        if m == UNBOUNDED {
                            best = UNBOUNDED;
                            break;
                        }
                        best = best.max(m.saturating_add(u32::from(w)).min(UNBOUNDED - 1));
                    }
                    best
                };
            }
        }
        most
    }
}

/// Tarjan's strongly connected components, without recursion, each listed after every
/// component it reaches (reverse topological order).
fn strongly_connected(n: usize, successors: impl Fn(u32) -> Vec<u32>) -> Vec<Vec<u32>> {
    struct Search {
        index: Vec<u32>,
        low: Vec<u32>,
        on_stack: Vec<bool>,
        stack: Vec<u32>,
        next_index: u32,
        /// Each entry: a state and its successors still to visit.
        frames: Vec<(u32, Vec<u32>)>,
    }
    impl Search {
        fn visit(&mut self, s: u32, mut successors: Vec<u32>) {
            self.index[s as usize] = self.next_index;
            self.low[s as usize] = self.next_index;
            self.next_index += 1;
            self.stack.push(s);
            self.on_stack[s as usize] = true;
            successors.reverse();
            self.frames.push((s, successors));
        }
    }
    const UNSEEN: u32 = u32::MAX;
    let mut search = Search {
        index: vec![UNSEEN; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next_index: 0,
        frames: Vec::new(),
    };
    let mut components = Vec::new();
    for root in 0..n as u32 {
        if search.index[root as usize] != UNSEEN {
            continue;
        }
        search.visit(root, successors(root));
        while let Some((s, left)) = search.frames.last_mut() {
            let s = *s;
            if let Some(t) = left.pop() {
                if search.index[t as usize] == UNSEEN {
                    search.visit(t, successors(t));
                } else if search.on_stack[t as usize] {
                    search.low[s as usize] = search.low[s as usize].min(search.index[t as usize]);
                }
                continue;
            }
            search.frames.pop();
            if let Some(&(parent, _)) = search.frames.last() {
                search.low[parent as usize] =
                    search.low[parent as usize].min(search.low[s as usize]);
            }
            if search.low[s as usize] == search.index[s as usize] {
                let mut component = Vec::new();
                loop {
                    let t = search
                        .stack
                        .pop()
                        .expect("the component's states are on the stack");
                    search.on_stack[t as usize] = false;
                    component.push(t);
                    if t == s {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}

fn describe_build_error(e: &regex_automata::dfa::dense::BuildError) -> String {
    if e.is_size_limit_exceeded() {
        return "the pattern is too large to follow (its automaton would exceed 8 MiB); \
                counted repetitions multiply states, so `^[a-z]+$` with `maxLength` \
                says what `^[a-z]{1,300}$` does far more cheaply"
            .into();
    }
    let text = e.to_string();
    // The syntax error's own text names the problem and points at it.
    match std::error::Error::source(e) {
        Some(inner) => format!("{text}: {inner}"),
        None => text,
    }
}

/// ECMA-262 pattern syntax into the `regex` crate's: the differences that matter for
/// JSON Schema patterns. `\d` and `\w` are ASCII in ECMA-262 (the `regex` crate's are
/// Unicode); `\/` escapes a slash. What the `regex` crate does not know (look-around,
/// back-references) comes back from it as an error naming the spot.
fn translate_ecma(pattern: &str) -> Result<String, String> {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut in_class = false;
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let Some(e) = chars.next() else {
                    return Err("the pattern ends with a lone backslash".into());
                };
                let class = match e {
                    'd' => Some("0-9"),
                    'w' => Some("0-9A-Za-z_"),
                    'D' => Some("^0-9"),
                    'W' => Some("^0-9A-Za-z_"),
                    _ => None,
                };
                match (class, in_class) {
                    // A negated class inside a class: a nested class is a union.
                    (Some(set), true) if set.starts_with('^') => {
                        out.push('[');
                        out.push_str(set);
                        out.push(']');
                    }
                    (Some(set), true) => out.push_str(set),
                    (Some(set), false) => {
                        out.push('[');
                        out.push_str(set);
                        out.push(']');
                    }
                    (None, _) if e == '/' => out.push('/'),
                    // ECMA-262's word boundaries are ASCII ones; in a class `\b` is a
                    // backspace.
                    (None, false) if e == 'b' || e == 'B' => {
                        out.push_str("(?-u:\\");
                        out.push(e);
                        out.push(')');
                    }
                    (None, true) if e == 'b' => out.push_str("\\x08"),
                    (None, _) if e.is_ascii_digit() && e != '0' => {
                        return Err(format!(
                            "back-references (`\\{e}`) are not supported in patterns"
                        ))
                    }
                    (None, _) => {
                        out.push('\\');
                        out.push(e);
                    }
                }
            }
            '[' if !in_class => {
                in_class = true;
                out.push('[');
                // `[^]` and `[]` are ECMA-262 spellings of "any" and "nothing".
                if chars.peek() == Some(&'^') {
                    out.push(chars.next().expect("peeked"));
                }
                if chars.peek() == Some(&']') {
                    return Err("empty character classes (`[]`, `[^]`) are not supported".into());
                }
            }
            // The `regex` crate reads `[` inside a class as a nested class, and `&&`,
            // `--`, `~~` as set operations; in ECMA-262 they are literal.
            '[' if in_class => out.push_str("\\["),
            '&' | '-' | '~' if in_class && chars.peek() == Some(&c) => {
                out.push('\\');
                out.push(c);
            }
            ']' if in_class => {
                in_class = false;
                out.push(']');
            }
            '(' if !in_class && chars.peek() == Some(&'?') => {
                let rest: String = chars.clone().take(3).collect();
                if rest.starts_with("?=")
                    || rest.starts_with("?!")
                    || rest.starts_with("?<=")
                    || rest.starts_with("?<!")
                {
                    return Err("look-around (`(?=`, `(?!`, `(?<=`, `(?<!`) is not \
                                supported in patterns"
                        .into());
                }
                out.push('(');
            }
            _ => out.push(c),
        }
    }
    Ok(out)
}

#[cfg(test)]
impl Pattern {
    /// Walks `text` (a JSON string's inner text, escapes as written) through the
    /// pattern as the acceptor does: whether every byte was taken, and whether the
    /// string may close after them.
    pub(crate) fn walk_text(&self, text: &str, min: u32, max: u32) -> (bool, bool) {
        let mut w = self.begin();
        let mut chars = 0;
        let mut escaping = false;
        for &b in text.as_bytes() {
            let starts = !escaping && !(0x80..=0xBF).contains(&b);
            if starts {
                chars += 1;
            }
            if !self.feed(&mut w, b, starts, chars, min, max) {
                return (false, false);
            }
            escaping = w.escape != Escape::None;
        }
        (true, self.may_close(&w) && chars >= min)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walk(p: &Pattern, text: &str, min: u32, max: u32) -> (bool, bool) {
        p.walk_text(text, min, max)
    }

    fn matches(pattern: &str, text: &str) -> bool {
        let p = Pattern::ecma(pattern).unwrap();
        walk(&p, text, 0, u32::MAX) == (true, true)
    }

    #[test]
    fn an_unanchored_pattern_matches_anywhere_and_anchors_pin_it() {
        assert!(matches("b+", "abbc"));
        assert!(matches("b+", "b"));
        assert!(!matches("b+", "ac"));
        assert!(matches("^a", "abc"));
        assert!(!matches("^a", "ba"));
        assert!(matches("c$", "abc"));
        assert!(!matches("c$", "cab"));
        assert!(matches("^[0-9]{3}-[0-9]{4}$", "555-1234"));
        assert!(!matches("^[0-9]{3}-[0-9]{4}$", "555-12345"));
    }

    #[test]
    fn ecma_classes_are_ascii_and_slashes_may_be_escaped() {
        assert!(matches(r"^\d+$", "0123"));
        assert!(!matches(r"^\d+$", "١٢")); // Arabic-Indic digits: Unicode \d only
        assert!(matches(r"^\w+$", "a_Z9"));
        assert!(!matches(r"^\w+$", "é"));
        assert!(matches(r"^[\d-]+$", "1-2"));
        assert!(matches(r"^[^\D]+$", "42"));
        assert!(matches(r"^a\/b$", "a/b"));
        assert!(matches(r"^[a[]+$", "a[a"));
        assert!(matches(r"^\p{L}+$", "héllo"));
        assert!(matches(r"\bcat\b", "a cat!"));
        assert!(!matches(r"\bcat\b", "concat"));
        assert!(matches(r"^a\Bb$", "ab"));
        assert!(matches(r"^[\b]$", r"\b"));
    }

    #[test]
    fn what_no_automaton_can_follow_is_refused_by_name() {
        for (pattern, words) in [
            ("(?=a)b", "look-around"),
            ("a(?!b)", "look-around"),
            (r"(a)\1", "back-references"),
            ("[]", "empty character classes"),
            ("a\\", "lone backslash"),
            ("(", "regex"),
        ] {
            let e = Pattern::ecma(pattern).unwrap_err();
            assert!(e.contains(words), "{pattern}: {e}");
        }
        let huge = Pattern::ecma("[ab]*a[ab]{15}").unwrap_err();
        assert!(
            huge.contains("states") || huge.contains("too large"),
            "{huge}"
        );
    }

    #[test]
    fn escapes_are_decoded_before_the_automaton_sees_them() {
        assert!(matches(r#"^a"b$"#, r#"a\"b"#));
        assert!(matches("^a\nb$", r"a\nb"));
        assert!(matches("^a\u{1}b$", r"a\u0001b"));
        assert!(matches("^a\u{1f}b$", r"a\u001Fb"));
        assert!(matches(r"^a\\b$", r"a\\b"));
        let p = Pattern::ecma("^[a-z]+$").unwrap();
        // Letters as `\u` escapes are not the short form a pattern string allows.
        assert!(!walk(&p, r"\u0061", 0, 9).0);
        // An escape that can only make a character the pattern refuses is refused at
        // its backslash.
        assert!(!walk(&p, r"a\", 0, 9).0);
        let q = Pattern::ecma("^a[\n\t]$").unwrap();
        assert!(walk(&q, r"a\", 0, 9).0);
        assert!(!walk(&q, r"a\r", 0, 9).0);
        assert!(!walk(&q, r"a\u002", 0, 9).0, "no control above 0x1F");
        assert!(!walk(&q, r"a\u001", 0, 9).0, "neither \\n nor \\t is 0x1X");
        assert!(walk(&q, r"a\u000", 0, 9).0);
        assert_eq!(walk(&q, r"a\u0009", 0, 9), (true, true));
    }

    #[test]
    fn lengths_are_measured_in_characters_from_each_state() {
        let p = Pattern::ecma("^(ab|cdefg)$").unwrap();
        assert_eq!(p.lengths(), Some((2, 5)));
        let q = Pattern::ecma("^é+x?$").unwrap();
        assert_eq!(q.lengths(), Some((1, UNBOUNDED)));
        let r = Pattern::ecma("x").unwrap();
        assert_eq!(r.lengths(), Some((1, UNBOUNDED)));
    }

    #[test]
    fn a_byte_that_leaves_no_match_within_the_length_bounds_is_refused() {
        let p = Pattern::ecma("^(a|bcdef)$").unwrap();
        // At least three characters: `a` alone could never be long enough.
        assert!(!walk(&p, "a", 3, 10).0);
        assert_eq!(walk(&p, "bcdef", 3, 10), (true, true));
        // At most four: `bcdef` cannot fit, so not even its `b`.
        assert!(!walk(&p, "b", 0, 4).0);
        assert_eq!(walk(&p, "a", 0, 4), (true, true));
        // Multi-byte characters count once.
        let q = Pattern::ecma("^é{2}$").unwrap();
        assert_eq!(walk(&q, "éé", 2, 2), (true, true));
        assert_eq!(q.lengths(), Some((2, 2)));
    }

    #[test]
    fn strongly_connected_components_come_in_reverse_topological_order() {
        // 0 -> 1 <-> 2 -> 3
        let succ = |s: u32| match s {
            0 => vec![1],
            1 => vec![2],
            2 => vec![1, 3],
            _ => vec![],
        };
        let components = strongly_connected(4, succ);
        let position = |s: u32| components.iter().position(|c| c.contains(&s)).unwrap();
        assert_eq!(components.len(), 3);
        assert_eq!(position(1), position(2));
        assert!(position(3) < position(1) && position(1) < position(0));
    }
}
