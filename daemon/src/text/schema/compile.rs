//! A JSON Schema document compiled into the graph [`SchemaState`](super::SchemaState)
//! walks.

use std::collections::HashMap;

use serde_json::{Map, Value};
use thiserror::Error;

use super::format::format_regex;
use super::number::Bounds;
use super::pattern::Pattern;
use crate::text::json::MAX_DEPTH;

/// Index of a node in [`Schema::nodes`].
pub type NodeId = u32;

/// Most properties one object schema may list, and most values one `enum` may hold
/// (each is a bit in the acceptor's state).
pub const MAX_NAMES: usize = 64;
/// Most nodes a schema compiles to: far beyond any real schema, and a bound on the
/// work a hostile one can cause.
const MAX_NODES: usize = 10_000;
/// Longest property name or literal, in bytes of its JSON text.
const MAX_LITERAL_BYTES: usize = 4096;

/// Node 0 of every schema: any JSON value.
pub const ANY: NodeId = 0;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("JSON schema{}: {message}", if at.is_empty() { String::new() } else { format!(" at #{at}") })]
pub struct SchemaError {
    /// JSON pointer to where in the schema (empty for its root).
    pub at: String,
    pub message: String,
}

fn error<T>(at: &str, message: impl Into<String>) -> Result<T, SchemaError> {
    Err(SchemaError {
        at: at.to_string(),
        message: message.into(),
    })
}

#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// Any JSON value.
    Any,
    Object(ObjectNode),
    /// `prefix`: the schemas of the first items, in order (`prefixItems`, or draft 4
    /// to 7's `items` as a list); `items` the schema of those after them.
    /// `unique`: `uniqueItems`, for items that are `enum`/`const` values (each value
    /// at most once).
    Array {
        prefix: Vec<NodeId>,
        items: NodeId,
        min: u32,
        max: u32,
        unique: bool,
    },
    /// Lengths in characters (code points), as JSON Schema counts them; `pattern` an
    /// index into [`Schema::patterns`] (from `pattern` or an enforced `format`).
    String {
        min: u32,
        max: u32,
        pattern: Option<u32>,
    },
    Number {
        integer: bool,
        bounds: Bounds,
    },
    Boolean,
    Null,
    /// `enum` and `const`: the values' compact JSON texts, written exactly so.
    Literals(Vec<Box<[u8]>>),
    /// `anyOf`, `oneOf` or a list of types: alternatives that no first byte of a value
    /// has in common, so the first byte picks one.
    Choice(Vec<NodeId>),
    /// Objects told apart by a tag: a property every one of them requires, with
    /// `enum`/`const` values that no two share. The tag is written first; its value
    /// picks the object the rest is read against.
    Tagged(TaggedUnion),
    /// Closed objects told apart by a key: each requires a property that no other one
    /// lists. One of those keys is written first; its name picks the object.
    Keyed(KeyedUnion),
    /// A `$ref` (only while compiling: resolved into the edges that point here).
    Ref(NodeId),
}

#[derive(Debug, Clone, PartialEq)]
pub struct TaggedUnion {
    /// The tag's name, as written inside a key's quotes.
    pub name: Box<[u8]>,
    /// A `Literals` node of every object's tag values.
    pub tags: NodeId,
    /// For each of `tags`' texts, the object it picks.
    pub owners: Vec<NodeId>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct KeyedUnion {
    /// Each object's telling key, as written inside a key's quotes.
    pub names: Vec<Box<[u8]>>,
    /// The object each of `names` picks.
    pub owners: Vec<NodeId>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ObjectNode {
    /// Property names as written inside a key's quotes (JSON-escaped).
    pub names: Vec<Box<[u8]>>,
    /// Each name's value schema.
    pub values: Vec<NodeId>,
    /// One bit per name.
    pub required: u64,
    /// The value schema of keys other than `names`; `None` when only those may be
    /// written.
    pub additional: Option<NodeId>,
}

/// A compiled schema: [`Schema::compile`] checks the document, and the acceptor reads
/// only this.
#[derive(Debug, Clone, PartialEq)]
pub struct Schema {
    nodes: Vec<Node>,
    /// Each node's possible first bytes, as four 64-bit words.
    first: Vec<[u64; 4]>,
    /// Each node's shallowest value: how many levels of containers it opens (0 for
    /// scalars), where nesting stops at `json::MAX_DEPTH`.
    min_depth: Vec<u8>,
    /// The string patterns `Node::String` points at.
    patterns: Vec<Pattern>,
    /// For each `Literals` node, how deep each of its texts nests (empty for other
    /// nodes): what a value beginning with `{` or `[` needs room for.
    literal_nesting: Vec<Box<[u8]>>,
    root: NodeId,
}

/// Most distinct patterns (and enforced formats) in one schema: each is an automaton
/// built per request.
const MAX_PATTERNS: usize = 64;
/// Most memory one schema's pattern automata may take together (each may take up to
/// 8 MiB): what a request holds while it runs, and a bound on the time compiling them
/// takes.
const MAX_PATTERN_MEMORY: usize = 16 << 20;

impl Default for Schema {
    /// Any JSON object (what `OutputFormat::JsonObject` asks for).
    fn default() -> Self {
        Self::compile(r#"{"type":"object"}"#).expect("the any-object schema compiles")
    }
}

/// Keywords that are notes for people and change nothing about what is valid.
const ANNOTATIONS: &[&str] = &[
    "$schema",
    "$id",
    "$anchor",
    "$comment",
    "$defs",
    "definitions",
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    // An annotation by default in JSON Schema 2020-12; the formats OpenAI enforces
    // are enforced (see `format_regex`), others stay notes.
    "format",
    "contentEncoding",
    "contentMediaType",
    // OpenAI's structured outputs flag, not a schema keyword.
    "strict",
    // OpenAPI's note on which property tells `oneOf` objects apart: sparkd finds it
    // itself (see `Node::Tagged`).
    "discriminator",
];

/// Keywords sparkd does not enforce: a schema using them is refused rather than
/// answered with text that may not match it.
const UNSUPPORTED: &[&str] = &[
    "patternProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "contains",
    "minContains",
    "maxContains",
    "unevaluatedItems",
    "unevaluatedProperties",
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "multipleOf",
    "$dynamicRef",
    "$recursiveRef",
];

const TYPES: &[&str] = &[
    "object", "array", "string", "number", "integer", "boolean", "null",
];

impl Schema {
    /// Compiles a JSON Schema document (drafts 4 to 2020-12, the subset below) whose
    /// root allows an object.
    ///
    /// Enforced: `type` (one or a list), `properties`, `required`,
    /// `additionalProperties` (`false`, `true` or a schema), `items` (one schema),
    /// `prefixItems` (tuples; and drafts 4 to 7's `items` as a list with
    /// `additionalItems`), `uniqueItems` on `enum`/`const` items, `minItems`, `maxItems`, `minLength`, `maxLength`, `minimum`, `maximum`,
    /// `exclusiveMinimum`, `exclusiveMaximum`, `pattern` (ECMA-262 without look-around
    /// or back-references), `format` for `date`, `time`, `date-time`, `duration`,
    /// `uuid`, `ipv4`, `ipv6`, `hostname` and `email`, `enum`, `const`, `anyOf` and `oneOf`
    /// whose alternatives begin differently (a string or null, say) or are objects told
    /// apart by a tag (see [`Node::Tagged`]) or by keys of their own (see
    /// [`Node::Keyed`]), `allOf` of one
    /// schema, and `$ref` to a place in the same document (`#/$defs/…`, `#`, any JSON
    /// pointer), recursive ones too. Annotations (`title`, `description`, `default`,
    /// other `format`s…) are ignored, as validators do by default; unknown keywords too.
    /// Refused: `patternProperties`, `not`, `if`, `multipleOf`, other `uniqueItems` and the others in
    /// `UNSUPPORTED`, and alternatives that can begin alike (two objects, say).
    ///
    /// What is generated: each listed property at most once and in any order, every
    /// required one before the object closes; other keys only where
    /// `additionalProperties` is a schema or where an object lists no properties at
    /// all (leaving them out is valid either way, and a model should not invent
    /// keys); `enum` and `const` values written as compact JSON; integers and bounded
    /// numbers without an exponent.
    pub fn compile(text: &str) -> Result<Schema, SchemaError> {
        let schema = Self::compile_any_root(text)?;
        if !schema.may_start(schema.root, b'{') {
            return error(
                "",
                "the root must allow an object: JSON output is one object \
                 (put other values in a property)",
            );
        }
        Ok(schema)
    }

    /// [`Schema::compile`] for a document whose root is an array (a Mistral model's
    /// tool calls); the text is then read with an array-rooted state
    /// ([`SchemaState::array_after_whitespace`](super::SchemaState)).
    pub fn compile_array(text: &str) -> Result<Schema, SchemaError> {
        let schema = Self::compile_any_root(text)?;
        if !schema.may_start(schema.root, b'[') {
            return error("", "the root must allow an array");
        }
        Ok(schema)
    }

    fn compile_any_root(text: &str) -> Result<Schema, SchemaError> {
        let document: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => return error("", format!("not valid JSON: {e}")),
        };
        let mut compiler = Compiler {
            document: &document,
            nodes: vec![Node::Any],
            by_pointer: HashMap::new(),
            patterns: Vec::new(),
            unique_arrays: Vec::new(),
        };
        let root = compiler.reference("")?;
        let (mut schema, finite) = compiler.finish()?;
        schema.root = schema.resolve(root);
        if !finite[schema.root as usize] {
            return error(
                "",
                "no finite value matches the schema (a required property that always \
                 needs another of its own kind, say)",
            );
        }
        Ok(schema)
    }

    pub fn root(&self) -> NodeId {
        self.root
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }

    /// How deep each text of `Literals` node `id` nests.
    pub fn literal_nesting(&self, id: NodeId) -> &[u8] {
        &self.literal_nesting[id as usize]
    }

    /// The schema of item `index` (from 0) of array node `id`.
    pub fn array_item(&self, id: NodeId, index: u32) -> NodeId {
        match self.node(id) {
            Node::Array { prefix, items, .. } => {
                prefix.get(index as usize).copied().unwrap_or(*items)
            }
            _ => ANY,
        }
    }

    /// A string node's pattern.
    pub fn pattern(&self, index: u32) -> &Pattern {
        &self.patterns[index as usize]
    }

    /// How many levels of containers the shallowest value of node `id` opens.
    pub fn min_depth(&self, id: NodeId) -> u8 {
        self.min_depth[id as usize]
    }

    /// Whether a value of node `id` inside containers `depth` deep can still be
    /// written whole, nesting stopping at [`MAX_DEPTH`] levels.
    pub fn fits(&self, id: NodeId, depth: u8) -> bool {
        u16::from(depth) + u16::from(self.min_depth(id)) <= u16::from(MAX_DEPTH)
    }

    /// Whether a value of node `id` may begin with `b`.
    pub fn may_start(&self, id: NodeId, b: u8) -> bool {
        self.first[id as usize][b as usize / 64] >> (b % 64) & 1 == 1
    }

    /// The node a value beginning with `b` is read against: `id` itself, or the one
    /// alternative of a choice that may begin so; `None` when none may.
    pub fn select(&self, id: NodeId, b: u8) -> Option<NodeId> {
        if !self.may_start(id, b) {
            return None;
        }
        match self.node(id) {
            Node::Choice(alternatives) => alternatives
                .iter()
                .copied()
                .find(|&alt| self.may_start(alt, b)),
            _ => Some(id),
        }
    }

    /// Follows `$ref`s to a node that is not one (cycles were refused).
    fn resolve(&self, mut id: NodeId) -> NodeId {
        while let Node::Ref(target) = self.node(id) {
            id = *target;
        }
        id
    }
}

struct Compiler<'a> {
    document: &'a Value,
    nodes: Vec<Node>,
    /// Nodes already made for `$ref` targets (and the root), by JSON pointer: what
    /// makes a recursive schema a cycle in the graph rather than endless.
    by_pointer: HashMap<String, NodeId>,
    /// Patterns compiled so far, with the text or format each came from (one automaton
    /// per distinct one).
    patterns: Vec<(String, Pattern)>,
    /// Arrays with `uniqueItems`, and where each is: checked once references resolve.
    unique_arrays: Vec<(NodeId, String)>,
}

impl Compiler<'_> {
    fn push(&mut self, node: Node, at: &str) -> Result<NodeId, SchemaError> {
        if self.nodes.len() >= MAX_NODES {
            return error(at, format!("more than {MAX_NODES} schema nodes"));
        }
        self.nodes.push(node);
        Ok(self.nodes.len() as NodeId - 1)
    }

    /// The node for the schema at JSON pointer `pointer` in the document.
    fn reference(&mut self, pointer: &str) -> Result<NodeId, SchemaError> {
        if let Some(&id) = self.by_pointer.get(pointer) {
            return Ok(id);
        }
        let Some(target) = self.document.pointer(pointer) else {
            return error(pointer, "`$ref` points at nothing in this document");
        };
        // Claimed before compiling the target, so a reference back to it finds it.
        let id = self.push(Node::Ref(ANY), pointer)?;
        self.by_pointer.insert(pointer.to_string(), id);
        let compiled = self.schema(target, pointer)?;
        self.nodes[id as usize] = Node::Ref(compiled);
        Ok(id)
    }

    fn schema(&mut self, value: &Value, at: &str) -> Result<NodeId, SchemaError> {
        let map = match value {
            Value::Bool(true) => return Ok(ANY),
            Value::Bool(false) => return error(at, "the schema `false` allows no value"),
            Value::Object(map) => map,
            _ => return error(at, "a schema must be an object or a boolean"),
        };
        for key in map.keys() {
            if UNSUPPORTED.contains(&key.as_str()) {
                return error(
                    at,
                    format!("`{key}` is not supported by sparkd's JSON output"),
                );
            }
        }
        // Keywords other than annotations, beside one that must stand alone.
        let others = |alone: &str| {
            map.keys()
                .filter(|k| *k != alone && !ANNOTATIONS.contains(&k.as_str()))
                .cloned()
                .collect::<Vec<_>>()
        };
        for alone in ["$ref", "anyOf", "oneOf", "allOf"] {
            if let Some(inner) = map.get(alone) {
                let rest = others(alone);
                if !rest.is_empty() {
                    return error(
                        at,
                        format!("`{alone}` beside `{}` is not supported", rest.join("`, `")),
                    );
                }
                let at = format!("{at}/{alone}");
                return match alone {
                    "$ref" => self.ref_target(inner, &at),
                    "allOf" => match inner.as_array().map(Vec::as_slice) {
                        Some([one]) => self.schema(one, &format!("{at}/0")),
                        _ => error(&at, "`allOf` is supported with exactly one schema"),
                    },
                    _ => self.choice(inner, &at),
                };
            }
        }
        if map.contains_key("enum") || map.contains_key("const") {
            return self.literals(map, at);
        }
        let types: Vec<&str> = match map.get("type") {
            None => vec![infer_type(map)],
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(list)) => {
                let mut types = Vec::new();
                for t in list {
                    match t.as_str() {
                        Some(t) if !types.contains(&t) => types.push(t),
                        Some(_) => {}
                        None => return error(at, "`type` lists a value that is not a string"),
                    }
                }
                // An integer is a number.
                if types.contains(&"number") {
                    types.retain(|t| *t != "integer");
                }
                types
            }
            Some(_) => return error(at, "`type` must be a string or a list of strings"),
        };
        let mut nodes = Vec::with_capacity(types.len());
        for t in types {
            nodes.push(self.typed(t, map, at)?);
        }
        match nodes.as_slice() {
            [] => error(at, "`type` lists no type"),
            [one] => Ok(*one),
            _ => self.push(Node::Choice(nodes), at),
        }
    }

    fn ref_target(&mut self, reference: &Value, at: &str) -> Result<NodeId, SchemaError> {
        match reference.as_str().and_then(|r| r.strip_prefix('#')) {
            Some(pointer) => self.reference(pointer),
            None => error(
                at,
                "only `$ref`s within the same document (`#/…`) are supported",
            ),
        }
    }

    fn choice(&mut self, alternatives: &Value, at: &str) -> Result<NodeId, SchemaError> {
        let Some(list) = alternatives.as_array().filter(|l| !l.is_empty()) else {
            return error(at, "must be a non-empty list of schemas");
        };
        let mut nodes = Vec::with_capacity(list.len());
        for (i, alt) in list.iter().enumerate() {
            nodes.push(self.schema(alt, &format!("{at}/{i}"))?);
        }
        if nodes.len() == 1 {
            return Ok(nodes[0]);
        }
        self.push(Node::Choice(nodes), at)
    }

    fn literals(&mut self, map: &Map<String, Value>, at: &str) -> Result<NodeId, SchemaError> {
        let values: Vec<&Value> = match (map.get("enum"), map.get("const")) {
            (Some(_), Some(_)) => return error(at, "`enum` beside `const`"),
            (Some(Value::Array(values)), None) => values.iter().collect(),
            (Some(_), None) => return error(at, "`enum` must be a list"),
            (None, Some(value)) => vec![value],
            (None, None) => unreachable!("called for enum or const"),
        };
        // A value of another type than `type` says is not valid: leave it out.
        let types: Option<Vec<&str>> = match map.get("type") {
            None => None,
            Some(Value::String(t)) => Some(vec![t.as_str()]),
            Some(Value::Array(l)) => Some(l.iter().filter_map(Value::as_str).collect()),
            Some(_) => return error(at, "`type` must be a string or a list of strings"),
        };
        let mut texts: Vec<Box<[u8]>> = Vec::new();
        for value in values {
            if types
                .as_ref()
                .is_some_and(|ts| !ts.iter().any(|t| has_type(value, t)))
            {
                continue;
            }
            let text = serde_json::to_vec(value).expect("a JSON value serializes");
            if text.len() > MAX_LITERAL_BYTES {
                return error(at, format!("a value longer than {MAX_LITERAL_BYTES} bytes"));
            }
            if !texts.iter().any(|t| **t == *text) {
                texts.push(text.into());
            }
        }
        if texts.is_empty() {
            return error(at, "no value of `enum`/`const` is allowed");
        }
        if texts.len() > MAX_NAMES {
            return error(at, format!("more than {MAX_NAMES} values in `enum`"));
        }
        self.push(Node::Literals(texts), at)
    }

    fn typed(
        &mut self,
        t: &str,
        map: &Map<String, Value>,
        at: &str,
    ) -> Result<NodeId, SchemaError> {
        let node = match t {
            "object" => Node::Object(self.object(map, at)?),
            "array" => {
                let node = self.array(map, at)?;
                if matches!(node, Node::Array { unique: true, .. }) {
                    let id = self.push(node, at)?;
                    self.unique_arrays.push((id, at.to_string()));
                    return Ok(id);
                }
                node
            }
            "string" => {
                let (min, max) = length_bounds(map, "minLength", "maxLength", at)?;
                let (pattern, max) = match self.string_pattern(map, at)? {
                    Some((index, most)) => (Some(index), max.min(most)),
                    None => (None, max),
                };
                if min > max {
                    return error(at, "`minLength` is above the format's longest value");
                }
                if let Some(index) = pattern {
                    let p = &self.patterns[index as usize].1;
                    let fits = p
                        .lengths()
                        .is_some_and(|(fewest, most)| fewest <= max && most >= min);
                    if !fits {
                        return error(
                            at,
                            format!(
                                "no string {} matches `{}`",
                                length_words(min, max),
                                p.source()
                            ),
                        );
                    }
                }
                Node::String { min, max, pattern }
            }
            "number" | "integer" => {
                let integer = t == "integer";
                let bounds = number_bounds(map, at)?;
                let bounds = if integer {
                    match bounds.to_integers() {
                        Some(b) => b,
                        None => return error(at, "no integer is within the bounds"),
                    }
                } else {
                    bounds
                };
                if bounds.is_empty() {
                    return error(at, "no number is within the bounds");
                }
                Node::Number { integer, bounds }
            }
            "boolean" => Node::Boolean,
            "null" => Node::Null,
            "any" => Node::Any,
            other => {
                return error(
                    at,
                    format!("unknown type `{other}` (one of {})", TYPES.join(", ")),
                )
            }
        };
        self.push(node, at)
    }

    /// An array: its first items' own schemas (`prefixItems`, or `items` as a list as
    /// drafts 4 to 7 write tuples), then the schema of the rest (`items`, or
    /// `additionalItems` after a list), `false` closing the array after the prefix.
    fn array(&mut self, map: &Map<String, Value>, at: &str) -> Result<Node, SchemaError> {
        let (prefix_key, rest_key) = match (map.get("prefixItems"), map.get("items")) {
            (Some(_), Some(Value::Array(_))) => {
                return error(at, "`prefixItems` beside `items` as a list")
            }
            (Some(_), _) => ("prefixItems", "items"),
            (None, Some(Value::Array(_))) => ("items", "additionalItems"),
            (None, _) => ("", "items"),
        };
        let mut prefix = Vec::new();
        if !prefix_key.is_empty() {
            let Some(list) = map[prefix_key].as_array() else {
                return error(at, format!("`{prefix_key}` must be a list of schemas"));
            };
            for (i, item) in list.iter().enumerate() {
                prefix.push(self.schema(item, &format!("{at}/{prefix_key}/{i}"))?);
            }
        }
        let (min, mut max) = length_bounds(map, "minItems", "maxItems", at)?;
        let items = match map.get(rest_key) {
            None | Some(Value::Bool(true)) => ANY,
            // No items past the prefix.
            Some(Value::Bool(false)) => {
                max = max.min(prefix.len() as u32);
                ANY
            }
            Some(Value::Array(_)) => {
                return error(at, format!("`{rest_key}` as a list after `{prefix_key}`"))
            }
            Some(items) => self.schema(items, &format!("{at}/{rest_key}"))?,
        };
        if min > max {
            return error(
                at,
                format!(
                    "`minItems` {min} but at most {max} items are allowed after `{rest_key}`: false"
                ),
            );
        }
        let unique = match map.get("uniqueItems") {
            None | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) => true,
            Some(_) => return error(at, "`uniqueItems` must be a boolean"),
        };
        if unique && !prefix.is_empty() {
            return error(at, "`uniqueItems` beside `prefixItems` is not supported");
        }
        Ok(Node::Array {
            prefix,
            items,
            min,
            max,
            unique,
        })
    }

    /// The pattern a string schema is held to, and the most characters its format
    /// allows: `pattern` where there is one (a `format` beside it stays a note, as
    /// JSON Schema has it by default), else an enforced `format`.
    fn string_pattern(
        &mut self,
        map: &Map<String, Value>,
        at: &str,
    ) -> Result<Option<(u32, u32)>, SchemaError> {
        let (key, compiled, most) = match (map.get("pattern"), map.get("format")) {
            (Some(Value::String(text)), _) => (format!("pattern {text}"), None, u32::MAX),
            (Some(_), _) => return error(at, "`pattern` must be a string"),
            (None, Some(Value::String(format))) => match format_regex(format) {
                Some((regex, most)) => (format!("format {format}"), Some((regex, format)), most),
                None => return Ok(None),
            },
            (None, _) => return Ok(None),
        };
        if let Some(i) = self.patterns.iter().position(|(k, _)| *k == key) {
            return Ok(Some((i as u32, most)));
        }
        if self.patterns.len() >= MAX_PATTERNS {
            return error(at, format!("more than {MAX_PATTERNS} distinct patterns"));
        }
        let pattern = match compiled {
            Some((regex, format)) => Pattern::regex(format, &regex),
            None => Pattern::ecma(map["pattern"].as_str().expect("matched a string")),
        };
        let pattern = match pattern {
            Ok(p) => p,
            Err(message) => return error(&format!("{at}/pattern"), message),
        };
        let used: usize = self.patterns.iter().map(|(_, p)| p.memory_usage()).sum();
        if used + pattern.memory_usage() > MAX_PATTERN_MEMORY {
            return error(
                at,
                format!(
                    "the schema's patterns need more than {} MiB of automata together",
                    MAX_PATTERN_MEMORY >> 20
                ),
            );
        }
        self.patterns.push((key, pattern));
        Ok(Some((self.patterns.len() as u32 - 1, most)))
    }

    fn object(&mut self, map: &Map<String, Value>, at: &str) -> Result<ObjectNode, SchemaError> {
        let properties = match map.get("properties") {
            None => None,
            Some(Value::Object(p)) => Some(p),
            Some(_) => return error(at, "`properties` must be an object"),
        };
        let required: Vec<&str> = match map.get("required") {
            None => Vec::new(),
            Some(Value::Array(list)) => {
                let mut names = Vec::new();
                for name in list {
                    match name.as_str() {
                        Some(n) => names.push(n),
                        None => return error(at, "`required` lists a value that is not a string"),
                    }
                }
                names
            }
            Some(_) => return error(at, "`required` must be a list of names"),
        };
        let listed = properties.is_some_and(|p| !p.is_empty()) || !required.is_empty();
        let additional = match map.get("additionalProperties") {
            Some(Value::Bool(false)) => None,
            None | Some(Value::Bool(true)) => (!listed).then_some(ANY),
            Some(schema) => Some(self.schema(schema, &format!("{at}/additionalProperties"))?),
        };
        let mut object = ObjectNode {
            names: Vec::new(),
            values: Vec::new(),
            required: 0,
            additional,
        };
        for (name, schema) in properties.into_iter().flatten() {
            let value =
                self.schema(schema, &format!("{at}/properties/{}", escape_pointer(name)))?;
            object.names.push(key_text(name, at)?);
            object.values.push(value);
        }
        for name in required {
            let text = key_text(name, at)?;
            let index = match object.names.iter().position(|n| *n == text) {
                Some(i) => i,
                None => {
                    // Required but not listed: a key like any other, with the value
                    // other keys may have.
                    let Some(value) = additional.or_else(|| {
                        (!matches!(map.get("additionalProperties"), Some(Value::Bool(false))))
                            .then_some(ANY)
                    }) else {
                        return error(
                            at,
                            format!("`{name}` is required but `additionalProperties` is false"),
                        );
                    };
                    object.names.push(text);
                    object.values.push(value);
                    object.names.len() - 1
                }
            };
            if index < MAX_NAMES {
                object.required |= 1 << index;
            }
        }
        if object.names.len() > MAX_NAMES {
            return error(
                at,
                format!("more than {MAX_NAMES} properties in one object"),
            );
        }
        Ok(object)
    }

    /// Resolves every edge past `$ref` nodes, leaves out what leads to no finite value,
    /// then works out first bytes and checks that each choice's alternatives begin
    /// differently.
    /// Also says which nodes some finite value matches.
    fn finish(self) -> Result<(Schema, Vec<bool>), SchemaError> {
        let pointers: HashMap<NodeId, &String> =
            self.by_pointer.iter().map(|(p, &id)| (id, p)).collect();
        let mut schema = Schema {
            nodes: self.nodes,
            first: Vec::new(),
            min_depth: Vec::new(),
            patterns: self.patterns.into_iter().map(|(_, p)| p).collect(),
            literal_nesting: Vec::new(),
            root: ANY,
        };
        // A cycle of `$ref`s with no value in between describes nothing.
        for id in 0..schema.nodes.len() as NodeId {
            let mut at = id;
            for _ in 0..=schema.nodes.len() {
                match schema.node(at) {
                    Node::Ref(next) => at = *next,
                    _ => break,
                }
            }
            if matches!(schema.node(at), Node::Ref(_)) {
                let pointer = pointers.get(&id).map_or("", |p| p.as_str());
                return error(pointer, "`$ref`s that lead only to each other");
            }
        }
        let resolved: Vec<Node> = schema
            .nodes
            .iter()
            .map(|node| {
                let mut node = node.clone();
                match &mut node {
                    Node::Object(o) => {
                        for v in o.values.iter_mut().chain(o.additional.as_mut()) {
                            *v = schema.resolve(*v);
                        }
                    }
                    Node::Array { prefix, items, .. } => {
                        *items = schema.resolve(*items);
                        for item in prefix {
                            *item = schema.resolve(*item);
                        }
                    }
                    Node::Choice(alts) => {
                        // Nested choices flattened: each alternative is one kind.
                        // A choice met again (one that lists itself through a
                        // `$ref`) adds nothing new.
                        let mut flat = Vec::new();
                        let mut visited = Vec::new();
                        let mut stack: Vec<NodeId> = alts.iter().rev().copied().collect();
                        while let Some(alt) = stack.pop() {
                            let alt = schema.resolve(alt);
                            match schema.node(alt) {
                                Node::Choice(_) if visited.contains(&alt) => {}
                                Node::Choice(inner) => {
                                    visited.push(alt);
                                    stack.extend(inner.iter().rev());
                                }
                                _ if flat.contains(&alt) => {}
                                _ => flat.push(alt),
                            }
                        }
                        // Any value at all among the alternatives: the choice is that
                        // (pydantic writes `Optional[Any]` as `{}` or null).
                        if flat.iter().any(|&a| schema.node(a) == &Node::Any) {
                            flat = vec![ANY];
                        }
                        *alts = flat;
                    }
                    _ => {}
                }
                node
            })
            .collect();
        schema.nodes = resolved;
        // Unique items are followed as `enum`/`const` values, one bit each.
        for (id, at) in &self.unique_arrays {
            let Node::Array { items, .. } = schema.nodes[*id as usize] else {
                continue;
            };
            let Node::Literals(values) = &schema.nodes[items as usize] else {
                return error(
                    at,
                    "`uniqueItems` is supported for arrays of `enum`/`const` values only",
                );
            };
            let count = values.len() as u32;
            let Node::Array { min, max, .. } = &mut schema.nodes[*id as usize] else {
                continue;
            };
            if *min > count {
                return error(
                    at,
                    format!("`minItems` {min} but only {count} distinct values to list"),
                );
            }
            *max = (*max).min(count);
        }
        tag_object_unions(&mut schema);
        let finite = finite_nodes(&schema);
        prune_to_finite(&mut schema, &finite);
        schema.min_depth = min_depths(&schema);
        schema.literal_nesting = schema
            .nodes
            .iter()
            .map(|node| match node {
                Node::Literals(texts) => texts.iter().map(|t| nesting(t)).collect(),
                _ => Box::default(),
            })
            .collect();
        schema.first = (0..schema.nodes.len())
            .map(|id| first_bytes(&schema, id as NodeId))
            .collect();
        for (id, node) in schema.nodes.iter().enumerate() {
            let Node::Choice(alts) = node else { continue };
            let mut seen = [0u64; 4];
            for &alt in alts {
                let first = schema.first[alt as usize];
                if let Some(b) = (0..=255u8).find(|&b| {
                    seen[b as usize / 64] >> (b % 64) & 1 == 1
                        && first[b as usize / 64] >> (b % 64) & 1 == 1
                }) {
                    let pointer = pointers.get(&(id as NodeId)).map_or("", |p| p.as_str());
                    return error(
                        pointer,
                        format!(
                            "alternatives that can both begin with `{}`: sparkd needs \
                             `anyOf`/`oneOf`/`type` alternatives to begin differently \
                             (an object or null, a string or a number, …), and objects \
                             to share a required tag property whose `const`/`enum` \
                             values differ, or each to require a property no other \
                             lists and take no other keys",
                            b as char
                        ),
                    );
                }
                for (s, f) in seen.iter_mut().zip(first) {
                    *s |= f;
                }
            }
        }
        Ok((schema, finite))
    }
}

/// Where a choice has two or more objects among its alternatives, puts one union in
/// their place: a tagged one where they share a tag (see [`Node::Tagged`]), else a keyed
/// one where each has a key of its own (see [`Node::Keyed`]). pydantic writes a union of
/// models with a `Literal` field as the first, and without one as the second; OpenAI's
/// tool-like schemas are often the first.
fn tag_object_unions(schema: &mut Schema) {
    for id in 0..schema.nodes.len() {
        let Node::Choice(alts) = &schema.nodes[id] else {
            continue;
        };
        let objects: Vec<NodeId> = alts
            .iter()
            .copied()
            .filter(|&a| matches!(schema.node(a), Node::Object(_)))
            .collect();
        if objects.len() < 2 {
            continue;
        }
        let union = if let Some((name, (texts, owners))) = find_tag(schema, &objects) {
            let tags = schema.nodes.len() as NodeId;
            schema.nodes.push(Node::Literals(texts));
            Node::Tagged(TaggedUnion { name, tags, owners })
        } else if let Some(keyed) = find_keys(schema, &objects) {
            Node::Keyed(keyed)
        } else {
            continue;
        };
        let union_id = schema.nodes.len() as NodeId;
        schema.nodes.push(union);
        let Node::Choice(alts) = &mut schema.nodes[id] else {
            unreachable!("a choice")
        };
        alts.retain(|a| !objects.contains(a));
        alts.push(union_id);
    }
}

/// For each object, its first required property that no other object lists: `None`
/// unless every object has one and is closed (only its listed keys are written).
/// Closed, an object's text has its own key and no other's, so it matches that object
/// alone, as `oneOf` needs.
fn find_keys(schema: &Schema, objects: &[NodeId]) -> Option<KeyedUnion> {
    if objects.len() > MAX_NAMES {
        return None;
    }
    let listed_elsewhere = |k: usize, name: &[u8]| {
        objects.iter().enumerate().any(|(j, &other)| {
            j != k
                && match schema.node(other) {
                    Node::Object(o) => o.names.iter().any(|n| **n == *name),
                    _ => true,
                }
        })
    };
    let mut names = Vec::with_capacity(objects.len());
    for (k, &object) in objects.iter().enumerate() {
        let Node::Object(o) = schema.node(object) else {
            return None;
        };
        if o.additional.is_some() {
            return None;
        }
        let key = (0..o.names.len().min(MAX_NAMES))
            .find(|&i| o.required >> i & 1 == 1 && !listed_elsewhere(k, &o.names[i]))?;
        names.push(o.names[key].clone());
    }
    Some(KeyedUnion {
        names,
        owners: objects.to_vec(),
    })
}

/// A tag's values (JSON texts) and, for each, the object it picks.
type TagValues = (Vec<Box<[u8]>>, Vec<NodeId>);

/// The first property of the first object that tags them all: its name, its values,
/// and the object each value picks.
fn find_tag(schema: &Schema, objects: &[NodeId]) -> Option<(Box<[u8]>, TagValues)> {
    let Node::Object(first) = schema.node(objects[0]) else {
        return None;
    };
    first
        .names
        .iter()
        .find_map(|name| tag_values(schema, objects, name).map(|values| (name.clone(), values)))
}

/// The values of property `name` in each object, with the object each picks: `None`
/// unless every object requires it as an `enum`/`const` and no value is in two.
fn tag_values(schema: &Schema, objects: &[NodeId], name: &[u8]) -> Option<TagValues> {
    let (mut texts, mut owners) = (Vec::new(), Vec::new());
    for &object in objects {
        let Node::Object(o) = schema.node(object) else {
            return None;
        };
        let i = o.names.iter().position(|n| **n == *name)?;
        if o.required >> i & 1 == 0 {
            return None;
        }
        let Node::Literals(values) = schema.node(o.values[i]) else {
            return None;
        };
        for v in values {
            if texts.contains(v) {
                return None;
            }
            texts.push(v.clone());
            owners.push(object);
        }
    }
    (texts.len() <= MAX_NAMES).then_some((texts, owners))
}

/// Which nodes some finite value matches: the least fixpoint where a node is finite when
/// its required properties, a non-empty array's items, or one of its alternatives are.
/// A node that is not would lead the text into a dead end (a recursive schema that
/// requires itself, nesting without end).
fn finite_nodes(schema: &Schema) -> Vec<bool> {
    let mut finite = vec![false; schema.nodes.len()];
    loop {
        let mut changed = false;
        for (id, node) in schema.nodes.iter().enumerate() {
            if finite[id] {
                continue;
            }
            let is = |n: &NodeId| finite[*n as usize];
            finite[id] = match node {
                Node::Ref(target) => is(target),
                Node::Object(o) => o
                    .values
                    .iter()
                    .enumerate()
                    .all(|(i, v)| o.required >> i & 1 == 0 || is(v)),
                // Every item the array must have.
                Node::Array {
                    prefix, items, min, ..
                } => {
                    prefix.iter().take(*min as usize).all(is)
                        && (*min as usize <= prefix.len() || is(items))
                }
                Node::Choice(alts) => alts.iter().any(is),
                // Every object must be finishable once its tag is written.
                Node::Tagged(t) => t.owners.iter().all(is),
                Node::Keyed(k) => k.owners.iter().all(is),
                _ => true,
            };
            changed |= finite[id];
        }
        if !changed {
            return finite;
        }
    }
}

/// Leaves out of every node what only leads to values that are not finite: optional
/// properties, other keys, array items (the array stays empty) and alternatives. What
/// is left never reaches a dead end, whatever the text takes.
fn prune_to_finite(schema: &mut Schema, finite: &[bool]) {
    let is = |n: NodeId| finite[n as usize];
    for node in &mut schema.nodes {
        match node {
            Node::Object(o) => {
                let mut kept = ObjectNode {
                    names: Vec::new(),
                    values: Vec::new(),
                    required: 0,
                    additional: o.additional.filter(|&n| is(n)),
                };
                for (i, (name, &value)) in o.names.iter().zip(&o.values).enumerate() {
                    let required = o.required >> i & 1 == 1;
                    if required || is(value) {
                        if required {
                            kept.required |= 1 << kept.names.len();
                        }
                        kept.names.push(name.clone());
                        kept.values.push(value);
                    }
                }
                *o = kept;
            }
            // The array ends before its first item with no finite value (past the
            // ones it must have, which are finite).
            Node::Array {
                prefix, items, max, ..
            } => {
                if let Some(i) = prefix.iter().position(|&p| !is(p)) {
                    *max = (*max).min(i as u32);
                } else if !is(*items) {
                    *max = (*max).min(prefix.len() as u32);
                }
            }
            Node::Choice(alts) => alts.retain(|&a| is(a)),
            _ => {}
        }
    }
}

/// Each node's [`Schema::min_depth`] (after pruning, every node reached is finite): a
/// fixpoint from above, like `finite_nodes`.
fn min_depths(schema: &Schema) -> Vec<u8> {
    let mut depth = vec![u8::MAX; schema.nodes.len()];
    loop {
        let mut changed = false;
        for (id, node) in schema.nodes.iter().enumerate() {
            let of = |n: &NodeId| depth[*n as usize];
            let d = match node {
                Node::Ref(target) => of(target),
                Node::Object(o) => o
                    .values
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| o.required >> i & 1 == 1)
                    .map(|(_, v)| of(v))
                    .max()
                    .unwrap_or(0)
                    .saturating_add(1),
                // Room for the deepest item the array must have.
                Node::Array {
                    prefix, items, min, ..
                } => {
                    let required = prefix.iter().take(*min as usize).map(of);
                    let rest = (*min as usize > prefix.len()).then(|| of(items));
                    required.chain(rest).max().unwrap_or(0).saturating_add(1)
                }
                Node::Choice(alts) => alts.iter().map(of).min().unwrap_or(u8::MAX),
                // The tag picks the object: room for the deepest.
                Node::Tagged(t) => t.owners.iter().map(of).max().unwrap_or(u8::MAX),
                Node::Keyed(k) => k.owners.iter().map(of).max().unwrap_or(u8::MAX),
                Node::Literals(texts) => texts.iter().map(|t| nesting(t)).min().unwrap_or(0),
                _ => 0,
            };
            if d < depth[id] {
                depth[id] = d;
                changed = true;
            }
        }
        if !changed {
            return depth;
        }
    }
}

/// How deep a JSON text's containers nest (it came from serde_json: strings hold no
/// raw quote but an escaped one).
fn nesting(text: &[u8]) -> u8 {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0u8, 0u8, false, false);
    for &b in text {
        match (in_string, escaped, b) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') | (false, _, b'"') => in_string = !in_string,
            (false, _, b'{' | b'[') => {
                depth = depth.saturating_add(1);
                deepest = deepest.max(depth);
            }
            (false, _, b'}' | b']') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// The bytes a value of node `id` may begin with (choices were flattened).
fn first_bytes(schema: &Schema, id: NodeId) -> [u64; 4] {
    let mut set = [0u64; 4];
    let mut add = |bytes: &[u8]| {
        for &b in bytes {
            set[b as usize / 64] |= 1 << (b % 64);
        }
    };
    const NUMBER: &[u8] = b"-0123456789";
    match schema.node(schema.resolve(id)) {
        Node::Any => {
            add(b"{[\"tfn");
            add(NUMBER);
        }
        Node::Object(_) | Node::Tagged(_) | Node::Keyed(_) => add(b"{"),
        Node::Array { .. } => add(b"["),
        Node::String { .. } => add(b"\""),
        Node::Number { .. } => add(NUMBER),
        Node::Boolean => add(b"tf"),
        Node::Null => add(b"n"),
        Node::Literals(texts) => {
            for t in texts {
                add(&t[..1]);
            }
        }
        Node::Choice(alts) => {
            for &alt in alts {
                let inner = first_bytes(schema, alt);
                for (s, i) in set.iter_mut().zip(inner) {
                    *s |= i;
                }
            }
        }
        Node::Ref(_) => unreachable!("resolved"),
    }
    set
}

/// The type a schema without `type` describes: the one its keywords are about.
fn infer_type(map: &Map<String, Value>) -> &'static str {
    let has = |keys: &[&str]| keys.iter().any(|k| map.contains_key(*k));
    if has(&["properties", "required", "additionalProperties"]) {
        "object"
    } else if has(&["items", "prefixItems", "minItems", "maxItems"]) {
        "array"
    } else if has(&["minLength", "maxLength", "pattern"])
        || map
            .get("format")
            .and_then(Value::as_str)
            .is_some_and(|f| format_regex(f).is_some())
    {
        "string"
    } else if has(&["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]) {
        "number"
    } else {
        "any"
    }
}

fn has_type(value: &Value, t: &str) -> bool {
    match (t, value) {
        ("object", Value::Object(_))
        | ("array", Value::Array(_))
        | ("string", Value::String(_))
        | ("number", Value::Number(_))
        | ("boolean", Value::Bool(_))
        | ("null", Value::Null) => true,
        ("integer", Value::Number(n)) => {
            n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => false,
    }
}

/// A property name as a key's text between its quotes: JSON-escaped as serde_json
/// writes it, which is the one spelling the model is held to.
fn key_text(name: &str, at: &str) -> Result<Box<[u8]>, SchemaError> {
    let quoted = serde_json::to_vec(name).expect("a string serializes");
    if quoted.len() > MAX_LITERAL_BYTES {
        return error(
            at,
            format!("a property name longer than {MAX_LITERAL_BYTES} bytes"),
        );
    }
    Ok(quoted[1..quoted.len() - 1].into())
}

fn escape_pointer(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

fn length_bounds(
    map: &Map<String, Value>,
    min_key: &str,
    max_key: &str,
    at: &str,
) -> Result<(u32, u32), SchemaError> {
    let read = |key: &str, default: u32| match map.get(key) {
        None => Ok(default),
        Some(v) => match v.as_u64().or_else(|| {
            v.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                .map(|f| f as u64)
        }) {
            Some(n) => Ok(n.min(u64::from(u32::MAX)) as u32),
            None => error(at, format!("`{key}` must be a non-negative integer")),
        },
    };
    let (min, max) = (read(min_key, 0)?, read(max_key, u32::MAX)?);
    if min > max {
        return error(at, format!("`{min_key}` is above `{max_key}`"));
    }
    Ok((min, max))
}

/// "of 3 to 8 characters", for errors.
fn length_words(min: u32, max: u32) -> String {
    match (min, max) {
        (0, u32::MAX) => "at all".into(),
        (min, u32::MAX) => format!("of at least {min} characters"),
        (0, max) => format!("of at most {max} characters"),
        (min, max) => format!("of {min} to {max} characters"),
    }
}

fn number_bounds(map: &Map<String, Value>, at: &str) -> Result<Bounds, SchemaError> {
    let number = |key: &str| match map.get(key) {
        None => Ok(None),
        Some(v) => match v.as_f64() {
            Some(f) => Ok(Some(f)),
            // Draft 4 wrote the exclusive forms as booleans beside minimum/maximum.
            None if v.is_boolean() => Ok(None),
            None => error(at, format!("`{key}` must be a number")),
        },
    };
    let draft4 = |key: &str| map.get(key) == Some(&Value::Bool(true));
    let mut bounds = Bounds::ANY;
    if let Some(lo) = number("minimum")? {
        bounds.lo = lo;
        bounds.lo_strict = draft4("exclusiveMinimum");
    }
    if let Some(hi) = number("maximum")? {
        bounds.hi = hi;
        bounds.hi_strict = draft4("exclusiveMaximum");
    }
    if let Some(lo) = number("exclusiveMinimum")? {
        if lo >= bounds.lo {
            bounds.lo = lo;
            bounds.lo_strict = true;
        }
    }
    if let Some(hi) = number("exclusiveMaximum")? {
        if hi <= bounds.hi {
            bounds.hi = hi;
            bounds.hi_strict = true;
        }
    }
    Ok(bounds)
}
