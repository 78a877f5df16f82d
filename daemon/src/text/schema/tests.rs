//! The schema acceptor against a reference validator (`jsonschema`): random texts it
//! lets through always validate and it never leaves a text with no way on; fixed
//! documents are accepted or refused as the schema says; unsupported schemas are
//! refused with a message that names the problem.

use serde_json::{json, Value};

use super::{FrameStack, Schema, SchemaState};

/// A schema shaped like what pydantic writes for a model: `$defs`, `$ref`,
/// `anyOf` with null, bounds, enums and maps.
fn person() -> Value {
    json!({
        "$defs": {
            "Address": {
                "type": "object",
                "properties": {
                    "street": {"type": "string", "maxLength": 20},
                    "zip": {"type": "string", "minLength": 5, "maxLength": 5}
                },
                "required": ["street", "zip"],
                "additionalProperties": false
            }
        },
        "type": "object",
        "title": "Person",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 130},
            "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "tags": {
                "type": "array",
                "items": {"type": "string", "enum": ["a", "bb", "b"]},
                "minItems": 1,
                "maxItems": 3
            },
            "address": {"$ref": "#/$defs/Address"},
            "nickname": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null},
            "kind": {"const": "person"},
            "flags": {"type": "object", "additionalProperties": {"type": "boolean"}},
            "extra": {}
        },
        "required": ["name", "age", "kind"],
        "additionalProperties": false
    })
}

fn tree() -> Value {
    json!({
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {
                    "value": {"type": "integer", "minimum": -5, "exclusiveMaximum": 5},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "maxItems": 2}
                },
                "required": ["value"],
                "additionalProperties": false
            }
        },
        "$ref": "#/$defs/Node"
    })
}

fn literals() -> Value {
    json!({
        "type": "object",
        "properties": {
            "v": {"enum": [1, 12, -1.5, "x", "x\"y", null, {"a": [1, 2]}, true, [] ]},
            "n": {"type": ["integer", "null", "string"], "maxLength": 3, "maximum": 99},
            "b": {"type": "boolean"}
        },
        "required": ["v", "n"]
    })
}

/// Names with escapes and names that begin alike, beside keys outside the list.
fn keys() -> Value {
    json!({
        "type": "object",
        "properties": {
            "a\"b": {"type": "null"},
            "é": {"type": "boolean"},
            "a": {"type": "integer"},
            "ab": {"type": "integer"},
            "tab\t": {"type": "integer"}
        },
        "required": ["a\"b", "é", "tab\t"],
        "additionalProperties": {"type": "string", "maxLength": 2}
    })
}

/// A union of objects told apart by `action`, as pydantic writes `Union[Search, Answer]`
/// with `Literal` fields (and OpenAPI's `discriminator` beside `oneOf`).
fn tagged() -> Value {
    json!({
        "$defs": {
            "Search": {
                "type": "object",
                "properties": {
                    "action": {"const": "search"},
                    "query": {"type": "string", "maxLength": 20}
                },
                "required": ["action", "query"],
                "additionalProperties": false
            },
            "Answer": {
                "type": "object",
                "properties": {
                    "action": {"enum": ["answer", "reply"]},
                    "text": {"type": "string"},
                    "done": {"type": "boolean"}
                },
                "required": ["action", "text"],
                "additionalProperties": false
            }
        },
        "type": "object",
        "properties": {
            "step": {"anyOf": [{"$ref": "#/$defs/Search"}, {"$ref": "#/$defs/Answer"}, {"type": "null"}]},
            "steps": {
                "type": "array",
                "items": {
                    "oneOf": [{"$ref": "#/$defs/Search"}, {"$ref": "#/$defs/Answer"}],
                    "discriminator": {"propertyName": "action"}
                },
                "maxItems": 3
            }
        },
        "required": ["step"],
        "additionalProperties": false
    })
}

/// pydantic's `Union[Url, File, Inline]` without a `Literal` field: closed objects,
/// each requiring a key of its own (`url`, `path`, `text`), beside keys they share.
fn keyed() -> Value {
    json!({
        "$defs": {
            "Url": {
                "type": "object",
                "properties": {
                    "url": {"type": "string", "maxLength": 12},
                    "timeout": {"type": "integer", "minimum": 0}
                },
                "required": ["url"],
                "additionalProperties": false
            },
            "File": {
                "type": "object",
                "properties": {
                    "timeout": {"type": "integer", "maximum": 9},
                    "path": {"type": "string"},
                    "mode": {"enum": ["r", "w"]}
                },
                "required": ["timeout", "path"]
            },
            "Inline": {
                "type": "object",
                "properties": {"text": {"type": "string"}, "mode": {"const": "r"}},
                "required": ["text"],
                "additionalProperties": false
            }
        },
        "type": "object",
        "properties": {
            "source": {"oneOf": [
                {"$ref": "#/$defs/Url"}, {"$ref": "#/$defs/File"}, {"$ref": "#/$defs/Inline"},
                {"type": "null"}
            ]},
            "more": {
                "type": "array",
                "items": {"anyOf": [{"$ref": "#/$defs/Url"}, {"$ref": "#/$defs/Inline"}]},
                "maxItems": 2
            }
        },
        "required": ["source"],
        "additionalProperties": false
    })
}

/// Strings held to patterns and formats, with length bounds that narrow them.
fn patterns() -> Value {
    json!({
        "type": "object",
        "properties": {
            "zip": {"type": "string", "pattern": "^[0-9]{5}(-[0-9]{4})?$"},
            "code": {"type": "string", "pattern": "[A-Z]{2}", "maxLength": 4},
            "word": {"type": "string", "pattern": "^(a|bcdef|g+)$", "minLength": 3, "maxLength": 6},
            "esc": {"type": "string", "pattern": "^a[\n\"\\\\]b$"},
            "when": {"type": "string", "format": "date-time"},
            "day": {"type": ["string", "null"], "format": "date"},
            "span": {"type": "string", "format": "duration"},
            "id": {"type": "string", "format": "uuid"},
            "mail": {"type": "string", "format": "email"},
            "host": {"type": "string", "format": "hostname", "maxLength": 12},
            "ip": {"type": "string", "format": "ipv6"},
            "ip4": {"format": "ipv4"},
            "t": {"type": "string", "format": "time"}
        },
        "required": ["zip", "when"],
        "additionalProperties": false
    })
}

/// Tuples: pydantic writes `Tuple[float, float]` with `prefixItems` and equal bounds.
fn tuples() -> Value {
    json!({
        "type": "object",
        "properties": {
            "point": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}], "minItems": 2, "maxItems": 2},
            "row": {
                "type": "array",
                "prefixItems": [{"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 0}],
                "items": {"type": "boolean"},
                "maxItems": 4
            },
            "closed": {"type": "array", "prefixItems": [{"const": "a"}, {"type": "null"}], "items": false},
            "nested": {"prefixItems": [{"type": "array", "prefixItems": [{"enum": [1, 2]}], "minItems": 1}]},
            "set": {"type": "array", "items": {"$ref": "#/$defs/Color"}, "uniqueItems": true, "minItems": 1}
        },
        "$defs": {"Color": {"enum": ["red", "green", "re", 1, null, {"a": [1]}]}},
        "required": ["point"],
        "additionalProperties": false
    })
}

fn any_object() -> Value {
    json!({"type": "object"})
}

fn all_schemas() -> Vec<(&'static str, Value)> {
    vec![
        ("person", person()),
        ("tree", tree()),
        ("literals", literals()),
        // In an object that takes any key, random keys would almost never spell the
        // required names: the fixed documents check those.
        ("keys", {
            let mut k = keys();
            k["required"] = json!([]);
            k
        }),
        ("tagged", tagged()),
        ("keyed", keyed()),
        ("patterns", patterns()),
        ("tuples", tuples()),
        ("any object", any_object()),
    ]
}

/// The reference validator, checking `format`s too (sparkd enforces the ones OpenAI
/// does).
fn validator_for(document: &Value) -> jsonschema::Validator {
    jsonschema::options()
        .should_validate_formats(true)
        .build(document)
        .expect("a valid schema")
}

fn compile(schema: &Value) -> Schema {
    Schema::compile(&schema.to_string()).expect("compiles")
}

/// Whether `text` is accepted whole (and ends the object).
fn accepts(schema: &Schema, text: &str) -> bool {
    let mut frames = FrameStack::default();
    let mut state = SchemaState::new(schema);
    state.feed_all(schema, &mut frames, text.as_bytes()) && state.is_done()
}

/// Whether `text` is accepted as a beginning.
fn accepts_prefix(schema: &Schema, text: &str) -> bool {
    let mut frames = FrameStack::default();
    SchemaState::new(schema).feed_all(schema, &mut frames, text.as_bytes())
}

/// xorshift64*: the tests' own small random source, seeded per case.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A random text the acceptor lets through, byte by byte: every step must leave some
/// byte to go on with. Past `soft_len` bytes, closers are preferred so the text ends;
/// `None` when it still has not after `hard_len`.
fn random_text(schema: &Schema, rng: &mut Rng, soft_len: usize, hard_len: usize) -> Option<String> {
    let mut frames = FrameStack::default();
    let mut state = SchemaState::new(schema);
    let mut text = Vec::new();
    // Mostly ASCII, with a few multi-byte characters and escapes.
    let alphabet: Vec<u8> = (0x20..0x7F)
        .chain([b'\n', 0xC3, 0xA9, 0xE2, 0x82, 0xAC])
        .collect();
    while !state.is_done() {
        let allowed: Vec<u8> = alphabet
            .iter()
            .copied()
            .filter(|&b| state.clone().feed(schema, &mut frames.clone(), b))
            .collect();
        assert!(
            !allowed.is_empty(),
            "no way on after {:?}",
            String::from_utf8_lossy(&text)
        );
        let closers: Vec<u8> = allowed
            .iter()
            .copied()
            .filter(|b| b"\"}]".contains(b))
            .collect();
        let b = if text.len() > soft_len && !closers.is_empty() {
            closers[rng.below(closers.len())]
        } else if text.len() > soft_len
            && allowed.iter().any(u8::is_ascii_digit)
            && rng.below(2) == 0
        {
            // A number ends only with what follows it: let structure come.
            let structural: Vec<u8> = allowed
                .iter()
                .copied()
                .filter(|b| b",}]".contains(b))
                .collect();
            if structural.is_empty() {
                allowed[rng.below(allowed.len())]
            } else {
                structural[rng.below(structural.len())]
            }
        } else {
            allowed[rng.below(allowed.len())]
        };
        assert!(state.feed(schema, &mut frames, b));
        text.push(b);
        if text.len() > hard_len {
            return None;
        }
    }
    Some(String::from_utf8(text).expect("the acceptor holds strings to UTF-8"))
}

#[test]
fn random_accepted_texts_validate_and_never_reach_a_dead_end() {
    for (name, document) in all_schemas() {
        let schema = compile(&document);
        let validator = validator_for(&document);
        let mut finished = 0;
        for seed in 1..=300u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let Some(text) = random_text(&schema, &mut rng, 40 + seed as usize % 80, 4000) else {
                continue;
            };
            finished += 1;
            if seed <= 3 {
                eprintln!("{name}: {text:?}");
            }
            let value: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{name}: {text:?} does not parse: {e}"));
            let errors: Vec<String> = validator
                .iter_errors(&value)
                .map(|e| e.to_string())
                .collect();
            assert!(
                errors.is_empty(),
                "{name}: {text:?} fails the schema: {errors:?}"
            );
        }
        assert!(
            finished >= 250,
            "{name}: only {finished} of 300 texts ended"
        );
    }
}

#[test]
fn documents_are_accepted_or_refused_as_the_schema_says() {
    let person = compile(&person());
    for text in [
        r#"{"name":"Ada","age":36,"kind":"person"}"#,
        r#"{ "kind" : "person", "age": 0, "name": "A", "score": 1, "tags": ["bb", "a"] }"#,
        r#"{"name":"Ada","age":130,"kind":"person","address":{"zip":"12345","street":""}}"#,
        r#"{"name":"Ada","age":36,"kind":"person","nickname":null,"flags":{"x":true,"y":false}}"#,
        r#"{"name":"Ada","age":36,"kind":"person","nickname":"ada","extra":[1,{"q":null}]}"#,
        r#"{"name":"Ada","age":36,"kind":"person","score":0.000001}"#,
    ] {
        assert!(accepts(&person, text), "refused {text}");
    }
    for (text, why) in [
        (r#"{"name":"Ada","age":36}"#, "kind is required"),
        (r#"{"name":"","age":36,"kind":"person"}"#, "name too short"),
        (
            r#"{"name":"Ada Lovelace Byron","age":36,"kind":"person"}"#,
            "name too long",
        ),
        (
            r#"{"name":"Ada","age":131,"kind":"person"}"#,
            "age above maximum",
        ),
        (
            r#"{"name":"Ada","age":-1,"kind":"person"}"#,
            "age below minimum",
        ),
        (
            r#"{"name":"Ada","age":36.5,"kind":"person"}"#,
            "age not an integer",
        ),
        (
            r#"{"name":"Ada","age":1e1,"kind":"person"}"#,
            "integer with exponent",
        ),
        (r#"{"name":"Ada","age":36,"kind":"people"}"#, "const"),
        (
            r#"{"name":"Ada","age":36,"kind":"person","score":0}"#,
            "score exclusive minimum",
        ),
        (
            r#"{"name":"Ada","age":36,"kind":"person","score":1.5}"#,
            "score above maximum",
        ),
        (
            r#"{"name":"Ada","age":36,"kind":"person","tags":[]}"#,
            "minItems",
        ),
        (
            r#"{"name":"Ada","age":36,"kind":"person","tags":["a","a","a","a"]}"#,
            "maxItems",
        ),
        (
            r#"{"name":"Ada","age":36,"kind":"person","tags":["c"]}"#,
            "enum",
        ),
        (
            r#"{"name":"Ada","age":36,"kind":"person","name":"Bo"}"#,
            "duplicate key",
        ),
        (
            r#"{"name":"Ada","age":36,"kind":"person","other":1}"#,
            "unknown key",
        ),
        (
            r#"{"name":"Ada","age":36,"kind":"person","address":{"zip":"1234","street":""}}"#,
            "zip too short",
        ),
        (
            r#"{"name":"Ada","age":36,"kind":"person","address":{"street":""}}"#,
            "zip is required",
        ),
        (
            r#"{"name":"Ada","age":36,"kind":"person","nickname":1}"#,
            "nickname is a string or null",
        ),
        (
            r#"{"name":"Ada","age":36,"kind":"person","flags":{"x":1}}"#,
            "flags are booleans",
        ),
        (r#"["name"]"#, "not an object"),
    ] {
        assert!(!accepts(&person, text), "accepted {text}: {why}");
    }

    let literals = compile(&literals());
    for text in [
        r#"{"v":1,"n":null}"#,
        r#"{"v":12,"n":99}"#,
        r#"{"v":-1.5,"n":"abc"}"#,
        r#"{"v":"x\"y","n":-7}"#,
        r#"{"v":{"a":[1,2]},"n":null,"b":false}"#,
        r#"{"v":[],"n":0}"#,
        r#"{"n":null,"v":true}"#,
    ] {
        assert!(accepts(&literals, text), "refused {text}");
    }
    for text in [
        r#"{"v":2,"n":null}"#,
        r#"{"v":123,"n":null}"#,
        r#"{"v":1.0,"n":null}"#,
        r#"{"v":{"a":[1,2,3]},"n":null}"#,
        r#"{"v":{ "a":[1,2]},"n":null}"#,
        r#"{"v":1,"n":100}"#,
        r#"{"v":1,"n":"abcd"}"#,
        r#"{"v":1,"n":true}"#,
        r#"{"v":false,"n":null}"#,
    ] {
        assert!(!accepts(&literals, text), "accepted {text}");
    }

    let keys = compile(&keys());
    for text in [
        r#"{"a\"b":null,"é":true,"tab\t":1}"#,
        r#"{"tab\t":1,"a\"b":null,"é":false,"a":1,"ab":2,"zz":"hi","abc":""}"#,
    ] {
        assert!(accepts(&keys, text), "refused {text}");
    }
    for text in [
        r#"{"a\"b":null,"é":true}"#,
        r#"{"a\"b":null,"\u00e9":true,"tab\t":1}"#,
        r#"{"a\"b":null,"é":true,"tab\t":1,"a":1,"a":2}"#,
        r#"{"a\"b":null,"é":true,"tab\t":1,"zz":"long"}"#,
        r#"{"a\"b":null,"é":true,"tab\u0009":1}"#,
        r#"{"a\"b":null,"é":true,"tab\t":1,"z\n":"x"}"#,
    ] {
        assert!(!accepts(&keys, text), "accepted {text}");
    }
}

#[test]
fn a_dead_end_is_refused_at_its_first_byte() {
    let person = compile(&person());
    // The age is at most 130: after 13, a third digit can only be 0.
    assert!(accepts_prefix(&person, r#"{"age":13"#));
    assert!(accepts_prefix(&person, r#"{"age":130"#));
    assert!(!accepts_prefix(&person, r#"{"age":131"#));
    assert!(!accepts_prefix(&person, r#"{"age":1300"#));
    // Once every name is written, no comma.
    let one =
        compile(&json!({"properties": {"a": {"type": "null"}}, "additionalProperties": false}));
    assert!(accepts_prefix(&one, r#"{"a":null"#));
    assert!(!accepts_prefix(&one, r#"{"a":null,"#));
    // A key that is no name's beginning.
    assert!(!accepts_prefix(&one, r#"{"b"#));
    // An enum string that leaves every value.
    assert!(!accepts_prefix(&person, r#"{"tags":["c"#));
}

#[test]
fn strings_follow_their_patterns_and_enforced_formats() {
    let schema = compile(&patterns());
    let base = r#""zip":"12345","when":"2026-12-05T23:30:00Z""#;
    let with = |extra: &str| format!("{{{base}{extra}}}");
    for extra in [
        "",
        r#","zip2":1"#,
        r#","code":"xAB""#,
        r#","word":"bcdef""#,
        r#","word":"ggg""#,
        r#","esc":"a\nb""#,
        r#","esc":"a\\b""#,
        r#","esc":"a\u000ab""#,
        r#","day":null"#,
        r#","day":"2024-02-29""#,
        r#","ip4":"10.0.0.1""#,
    ] {
        let text = with(extra);
        let accepted = accepts(&schema, &text);
        // `zip2` is not a listed property: the one refusal among these.
        assert_eq!(accepted, extra != r#","zip2":1"#, "{text}");
    }
    for (extra, why) in [
        (r#","code":"xyz""#, "no two capitals"),
        (r#","code":"xxxAB""#, "past maxLength"),
        (r#","word":"a""#, "below minLength"),
        (r#","word":"ggggggg""#, "past maxLength"),
        (r#","esc":"a\tb""#, "an escape the pattern refuses"),
        (
            r#","esc":"a\u0041b""#,
            "a letter as \\u0041: only control characters so",
        ),
        (r#","day":"2026-02-29""#, "not a leap year"),
        (r#","host":"abc.example.com""#, "past maxLength"),
        (r#","mail":"joe@""#, "no domain"),
        (r#","ip4":"10.0.0.256""#, "octet past 255"),
    ] {
        let text = with(extra);
        assert!(!accepts(&schema, &text), "{why}: {text}");
    }
    let zip_too_short = r#"{"zip":"1234","when":"2026-12-05T23:30:00Z"}"#;
    assert!(!accepts(&schema, zip_too_short));
    // Refused at the first byte that rules a match out, not at the closing quote.
    assert!(!accepts_prefix(&schema, r#"{"zip":"1234x"#));
    assert!(!accepts_prefix(&schema, r#"{"when":"2026-13"#));
    assert!(accepts_prefix(&schema, r#"{"when":"2026-12"#));
    // Formats sparkd does not enforce stay annotations.
    let uri = compile(
        &json!({"type": "object", "properties": {"u": {"type": "string", "format": "uri"}}}),
    );
    assert!(accepts(&uri, r#"{"u":"]]"}"#));
}

#[test]
fn patterns_that_cannot_be_followed_or_matched_are_refused_with_a_reason() {
    for (schema, at, expected) in [
        (
            json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=x)x"}}}),
            "/properties/a/pattern",
            "look-around",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "(a)\\1"}}}),
            "/properties/a/pattern",
            "back-references",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "^[0-9]{5}$", "maxLength": 3}}}),
            "/properties/a",
            "no string of at most 3 characters matches `^[0-9]{5}$`",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "string", "format": "uuid", "minLength": 40}}}),
            "/properties/a",
            "no string of at least 40 characters matches `uuid`",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "string", "format": "email", "minLength": 300}}}),
            "/properties/a",
            "`minLength` is above the format's longest value",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "string", "pattern": 5}}}),
            "/properties/a",
            "`pattern` must be a string",
        ),
        (
            // Each automaton fits alone; together they would hold too much per request.
            json!({"type": "object", "properties": {
                "a": {"type": "string", "pattern": "^\\p{L}{1,20}$"},
                "b": {"type": "string", "pattern": "^\\p{L}{1,21}$"},
                "c": {"type": "string", "pattern": "^\\p{L}{1,22}$"},
                "d": {"type": "string", "pattern": "^\\p{L}{1,23}$"},
                "e": {"type": "string", "pattern": "^\\p{L}{1,24}$"},
                "f": {"type": "string", "pattern": "^\\p{L}{1,25}$"},
                "g": {"type": "string", "pattern": "^\\p{L}{1,26}$"},
                "h": {"type": "string", "pattern": "^\\p{L}{1,27}$"}
            }}),
            "/properties/e",
            "MiB of automata together",
        ),
    ] {
        let err = Schema::compile(&schema.to_string()).expect_err(&schema.to_string());
        assert_eq!(err.at, at, "{err}");
        assert!(
            err.message.contains(expected),
            "{err} (wanted {expected:?})"
        );
    }
}

#[test]
fn tuples_hold_each_item_to_its_own_schema() {
    let schema = compile(&tuples());
    for text in [
        r#"{"point":[1,2.5]}"#,
        r#"{"point":[-1,0],"row":[]}"#,
        r#"{"point":[0,0],"row":["abc",3,true,false]}"#,
        r#"{"point":[0,0],"row":["x"]}"#,
        r#"{"point":[0,0],"closed":["a",null]}"#,
        r#"{"point":[0,0],"closed":[]}"#,
        r#"{"point":[0,0],"nested":[[2],"anything"]}"#,
        r#"{"point":[0,0],"set":["red","re",{"a":[1]},null]}"#,
        r#"{"point":[0,0],"set":["red","green","re",1,null,{"a":[1]}]}"#,
    ] {
        assert!(accepts(&schema, text), "refused {text}");
    }
    for (text, why) in [
        (r#"{"point":[1]}"#, "minItems"),
        (r#"{"point":[1,2,3]}"#, "maxItems"),
        (r#"{"point":["1",2]}"#, "first item a number"),
        (
            r#"{"point":[0,0],"row":["abcd"]}"#,
            "first item's maxLength",
        ),
        (
            r#"{"point":[0,0],"row":["a",1.5]}"#,
            "second item an integer",
        ),
        (r#"{"point":[0,0],"row":["a",-1]}"#, "second item's minimum"),
        (
            r#"{"point":[0,0],"row":["a",1,2]}"#,
            "items after the prefix",
        ),
        (
            r#"{"point":[0,0],"row":["a",1,true,true,true]}"#,
            "maxItems",
        ),
        (
            r#"{"point":[0,0],"closed":["a",null,null]}"#,
            "items: false",
        ),
        (r#"{"point":[0,0],"closed":["b"]}"#, "const"),
        (r#"{"point":[0,0],"nested":[[]]}"#, "inner minItems"),
        (r#"{"point":[0,0],"nested":[[3]]}"#, "inner enum"),
        (r#"{"point":[0,0],"set":[]}"#, "set minItems"),
        (r#"{"point":[0,0],"set":["red","red"]}"#, "set items unique"),
        (r#"{"point":[0,0],"set":[null,1,null]}"#, "set items unique"),
        (
            r#"{"point":[0,0],"set":["red","green","re",1,null,{"a":[1]},"red"]}"#,
            "no value left",
        ),
    ] {
        assert!(!accepts(&schema, text), "{why}: {text}");
    }
    // Drafts 4 to 7 write a tuple as `items` with a list, and the rest as
    // `additionalItems`.
    let draft7 = json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {
            "pair": {"type": "array", "items": [{"type": "null"}, {"type": "integer"}], "additionalItems": false},
            "open": {"type": "array", "items": [{"type": "null"}], "additionalItems": {"type": "string"}}
        }
    });
    // A value already written is refused at its first byte that no other value
    // shares, and once every value is written no comma is.
    assert!(!accepts_prefix(&schema, r#"{"point":[0,0],"set":[1,1"#));
    assert!(accepts_prefix(&schema, r#"{"point":[0,0],"set":["re","re"#));
    assert!(!accepts_prefix(
        &schema,
        r#"{"point":[0,0],"set":["re","re""#
    ));
    assert!(!accepts_prefix(
        &schema,
        r#"{"point":[0,0],"set":["red","green","re",1,null,{"a":[1]},"#
    ));
    let old = compile(&draft7);
    assert!(accepts(&old, r#"{"pair":[null,3],"open":[null,"a","b"]}"#));
    assert!(!accepts(&old, r#"{"pair":[null,3,4]}"#));
    assert!(!accepts(&old, r#"{"pair":[3]}"#));
    assert!(!accepts(&old, r#"{"open":[null,1]}"#));
    for (schema, expected) in [
        (
            json!({"type": "object", "properties": {"a": {"prefixItems": [{}], "items": [{}]}}}),
            "`prefixItems` beside `items` as a list",
        ),
        (
            json!({"type": "object", "properties": {"a": {"prefixItems": [{}], "items": false, "minItems": 2}}}),
            "`minItems` 2 but at most 1 items",
        ),
        (
            json!({"type": "object", "properties": {"a": {"prefixItems": {}}}}),
            "`prefixItems` must be a list",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}, "uniqueItems": true}}}),
            "`uniqueItems` is supported for arrays of `enum`/`const` values only",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "array", "items": {"enum": [1, 2]}, "uniqueItems": true, "minItems": 3}}}),
            "`minItems` 3 but only 2 distinct values",
        ),
    ] {
        let err = Schema::compile(&schema.to_string()).expect_err(&schema.to_string());
        assert!(err.to_string().contains(expected), "{err}");
    }
}

#[test]
fn recursive_schemas_follow_their_references() {
    let tree = compile(&tree());
    assert!(accepts(
        &tree,
        r#"{"value":1,"children":[{"value":-5,"children":[]},{"value":4,"children":[{"value":0}]}]}"#
    ));
    assert!(!accepts(&tree, r#"{"value":1,"children":[{"value":5}]}"#));
    assert!(!accepts(&tree, r#"{"value":1,"children":[{}]}"#));
    assert!(!accepts(
        &tree,
        r#"{"value":1,"children":[{"value":0},{"value":0},{"value":0}]}"#
    ));
}

#[test]
fn unsupported_or_impossible_schemas_are_refused_with_a_reason() {
    for (schema, expected) in [
        (
            json!({"type": "object", "patternProperties": {"^x": {}}}),
            "`patternProperties` is not supported",
        ),
        (
            json!({"type": "object", "properties": {"a": {"anyOf": [{"type": "object"}, {"type": "object", "properties": {"x": {}}}]}}}),
            "can both begin with `{`",
        ),
        (
            json!({"type": "object", "properties": {"a": {"anyOf": [{"type": "integer"}, {"type": "number"}]}}}),
            "can both begin with `-`",
        ),
        (json!({"type": "array"}), "root must allow an object"),
        (json!({"$ref": "#/$defs/missing"}), "points at nothing"),
        (
            json!({"$ref": "https://example.com/s.json"}),
            "same document",
        ),
        (
            json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
            "lead only to each other",
        ),
        (
            json!({"type": "object", "properties": {"a": false}}),
            "allows no value",
        ),
        (
            json!({"type": "object", "properties": {"a": {"enum": []}}}),
            "no value of `enum`",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "string", "minLength": 3, "maxLength": 2}}}),
            "`minLength` is above `maxLength`",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": 1.2, "maximum": 1.8}}}),
            "no integer",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "date"}}}),
            "unknown type `date`",
        ),
        (
            json!({"type": "object", "required": ["a"], "additionalProperties": false}),
            "`a` is required",
        ),
        (
            json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/x", "maxLength": 3}}}),
            "`$ref` beside `maxLength`",
        ),
        (
            json!({"type": "object", "properties": {"a": {"allOf": [{"type": "string"}, {"maxLength": 3}]}}}),
            "exactly one schema",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "array", "contains": {"const": 1}}}}),
            "`contains` is not supported",
        ),
    ] {
        let err = Schema::compile(&schema.to_string()).expect_err(&schema.to_string());
        assert!(
            err.to_string().contains(expected),
            "{err} (wanted {expected:?}) for {schema}"
        );
    }
    let err = Schema::compile("{not json").unwrap_err();
    assert!(err.to_string().contains("not valid JSON"), "{err}");
    // The error says where.
    let err =
        Schema::compile(&json!({"properties": {"a/b": {"not": {}}}}).to_string()).unwrap_err();
    assert_eq!(err.at, "/properties/a~1b");
}

#[test]
fn annotations_and_draft_4_forms_are_understood() {
    let schema = compile(&json!({
        "$schema": "http://json-schema.org/draft-04/schema#",
        "title": "T",
        "description": "d",
        "type": "object",
        "properties": {
            "when": {"type": "string", "format": "date-time", "examples": ["2026"]},
            "n": {"type": "number", "minimum": 0, "exclusiveMinimum": true, "maximum": 2, "exclusiveMaximum": true},
            "o": {"allOf": [{"$ref": "#/definitions/O"}], "description": "one of pydantic's wrappings"}
        },
        "definitions": {"O": {"type": "object", "properties": {"k": {"type": "boolean"}}}},
        "required": ["n"]
    }));
    assert!(accepts(
        &schema,
        r#"{"n":1.5,"when":"2026-12-05T23:30:00Z","o":{"k":true}}"#
    ));
    // `format`s OpenAI enforces are enforced.
    assert!(!accepts(&schema, r#"{"n":1.5,"when":"now"}"#));
    assert!(!accepts(&schema, r#"{"n":0}"#));
    assert!(!accepts(&schema, r#"{"n":2}"#));
    assert!(!accepts(&schema, r#"{"n":1,"o":{"k":1}}"#));
}

#[test]
fn the_root_may_reference_itself_and_a_choice_may_list_itself() {
    let schema = compile(&json!({
        "type": "object",
        "properties": {
            "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}
        },
        "required": ["next"],
        "additionalProperties": false
    }));
    assert!(accepts(&schema, r#"{"next":{"next":{"next":null}}}"#));
    assert!(!accepts(&schema, r#"{"next":{}}"#));
    // An alternative that is any value takes in the others.
    let schema =
        compile(&json!({"type": "object", "properties": {"a": {"anyOf": [{}, {"type": "null"}]}}}));
    assert!(accepts(&schema, r#"{"a":[1,{"b":null}]}"#));
    assert!(accepts(&schema, r#"{"a":null}"#));
    let looping = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/c"}},
        "$defs": {"c": {"anyOf": [{"$ref": "#/$defs/c"}, {"type": "null"}]}}});
    let schema = compile(&looping);
    assert!(accepts(&schema, r#"{"a":null}"#));
}

#[test]
fn what_only_leads_to_values_without_end_is_left_out() {
    let endless = json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/Endless"}}, "required": ["x"]});
    let schema = compile(&json!({
        "$defs": {"Endless": endless},
        "type": "object",
        "properties": {
            "a": {"type": "null"},
            "b": {"$ref": "#/$defs/Endless"},
            "c": {"anyOf": [{"$ref": "#/$defs/Endless"}, {"type": "string"}]},
            "d": {"type": "array", "items": {"$ref": "#/$defs/Endless"}}
        },
        "additionalProperties": false
    }));
    assert!(accepts(&schema, r#"{"a":null,"c":"s","d":[]}"#));
    // Once written, `b` could never be finished: it is not offered at all.
    assert!(!accepts_prefix(&schema, r#"{"b"#));
    assert!(!accepts_prefix(&schema, r#"{"c":{"#));
    assert!(!accepts_prefix(&schema, r#"{"d":[{"#));
    let err = Schema::compile(
        &json!({"type": "object", "properties": {"me": {"$ref": "#"}}, "required": ["me"]})
            .to_string(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("no finite value"), "{err}");
}

mod arbitrary {
    //! Schemas built at random from the supported keywords: compiling never panics,
    //! and under every schema that compiles, random texts never reach a dead end and
    //! validate whenever they end.

    use proptest::prelude::*;
    use serde_json::{json, Value};

    use super::*;

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(json!({"type": "string"})),
            (0u32..3, 0u32..4).prop_map(
                |(min, extra)| json!({"type": "string", "minLength": min, "maxLength": min + extra})
            ),
            (-50i64..50, 0i64..100).prop_map(
                |(lo, span)| json!({"type": "integer", "minimum": lo, "maximum": lo + span})
            ),
            (-5.0f64..5.0, 0.01f64..10.0, any::<bool>()).prop_map(|(lo, span, strict)| {
                if strict {
                    json!({"type": "number", "exclusiveMinimum": lo, "exclusiveMaximum": lo + span})
                } else {
                    json!({"type": "number", "minimum": lo, "maximum": lo + span})
                }
            }),
            Just(json!({"type": "number"})),
            Just(json!({"type": "boolean"})),
            Just(json!({"type": "null"})),
            Just(json!({"enum": ["a", "ab", 1, 10, null, {"k": [true]}]})),
            Just(json!({"const": "fixed"})),
            Just(json!({"type": ["string", "null"], "maxLength": 2})),
            Just(json!({})),
            Just(json!({"$ref": "#"})),
        ]
    }

    fn schema_value() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                (
                    proptest::collection::btree_map("[abé\"]{1,3}", inner.clone(), 0..4),
                    any::<u8>(),
                    prop_oneof![Just(json!(false)), Just(json!(true)), inner.clone()],
                )
                    .prop_map(|(props, required_bits, additional)| {
                        object(props, required_bits, additional)
                    }),
                (inner.clone(), 0u32..2, 0u32..3).prop_map(|(items, min, extra)| {
                    json!({"type": "array", "items": items, "minItems": min, "maxItems": min + extra})
                }),
                inner.clone().prop_map(|s| json!({"anyOf": [s, {"type": "null"}]})),
                (inner.clone(), inner.clone()).prop_map(|(x, y)| json!({"anyOf": [
                    {"type": "object", "properties": {"t": {"const": "x"}, "v": x}, "required": ["t"]},
                    {"type": "object", "properties": {"t": {"enum": ["y", "z"]}, "w": y},
                     "required": ["t", "w"], "additionalProperties": false}
                ]})),
                inner.prop_map(|s| json!({"allOf": [s]})),
            ]
        })
    }

    fn root() -> impl Strategy<Value = Value> {
        (
            proptest::collection::btree_map("[a-c]{1,2}", schema_value(), 1..4),
            any::<u8>(),
        )
            .prop_map(|(props, required_bits)| object(props, required_bits, json!(false)))
    }

    /// An object schema of `properties`, requiring those whose bit in `required_bits`
    /// is set.
    fn object(
        properties: std::collections::BTreeMap<String, Value>,
        required_bits: u8,
        additional: Value,
    ) -> Value {
        let required: Vec<&String> = properties
            .keys()
            .enumerate()
            .filter(|(i, _)| required_bits >> i & 1 == 1)
            .map(|(_, k)| k)
            .collect();
        json!({"type": "object", "properties": properties, "required": required,
               "additionalProperties": additional})
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn random_schemas_compile_or_explain_and_never_lead_to_a_dead_end(document in root(), seed in any::<u64>()) {
            let Ok(schema) = Schema::compile(&document.to_string()) else {
                return Ok(()); // refused with a message: alternatives that begin alike, say
            };
            let validator = validator_for(&document);
            let mut rng = Rng(seed | 1);
            for _ in 0..4 {
                // `random_text` asserts that every step leaves a way on.
                if let Some(text) = random_text(&schema, &mut rng, 30, 3000) {
                    let value: Value = serde_json::from_str(&text).expect("parses");
                    prop_assert!(validator.is_valid(&value), "{} fails {}", text, document);
                }
            }
        }
    }
}

#[test]
fn objects_told_apart_by_a_tag_are_read_against_the_one_it_picks() {
    let schema = compile(&tagged());
    for text in [
        r#"{"step":{"action":"search","query":"rust"}}"#,
        r#"{"step":{"action":"reply","done":true,"text":"t"}}"#,
        r#"{"step":null,"steps":[{"action":"answer","text":""},{"action":"search","query":""}]}"#,
    ] {
        assert!(accepts(&schema, text), "refused {text}");
    }
    for (text, why) in [
        (
            r#"{"step":{"action":"search","text":"x"}}"#,
            "`text` is Answer's",
        ),
        (r#"{"step":{"action":"search"}}"#, "Search requires `query`"),
        (r#"{"step":{"action":"other","text":"x"}}"#, "no such tag"),
        (r#"{"step":{}}"#, "the tag is required"),
        (
            r#"{"step":{"action":"search","query":"q","action":"answer"}}"#,
            "the tag twice",
        ),
        // Valid under the schema, but the tag must come first: it picks the object.
        (
            r#"{"step":{"query":"x","action":"search"}}"#,
            "the tag comes first",
        ),
    ] {
        assert!(!accepts(&schema, text), "accepted {text}: {why}");
    }
}

#[test]
fn closed_objects_with_keys_of_their_own_are_read_against_the_one_their_first_key_picks() {
    let schema = compile(&keyed());
    for text in [
        r#"{"source":{"url":"https://x"}}"#,
        r#"{"source":{"url":"u","timeout":30}}"#,
        r#"{"source":{"path":"/tmp","mode":"w","timeout":3}}"#,
        r#"{"source":{"text":"hi","mode":"r"}}"#,
        r#"{"source":null,"more":[{"text":""},{"url":"v"}]}"#,
    ] {
        assert!(accepts(&schema, text), "refused {text}");
    }
    for (text, why) in [
        (r#"{"source":{"url":"u","path":"p"}}"#, "`path` is File's"),
        (
            r#"{"source":{"path":"p","mode":"r"}}"#,
            "File requires `timeout`",
        ),
        (r#"{"source":{"url":"u","timeout":-1}}"#, "Url's own bounds"),
        (
            r#"{"source":{"path":"p","timeout":10}}"#,
            "File's own bounds",
        ),
        (
            r#"{"source":{"text":"t","mode":"w"}}"#,
            "Inline's `mode` is `r`",
        ),
        (r#"{"source":{}}"#, "every object requires its key"),
        (r#"{"source":{"url":"u","url":"v"}}"#, "the key twice"),
        (r#"{"source":{"other":1}}"#, "no object's key"),
        // Valid under the schema, but the telling key must come first: it picks.
        (
            r#"{"source":{"timeout":3,"path":"p"}}"#,
            "the object's own key comes first",
        ),
        (
            r#"{"source":null,"more":[{"path":"p","timeout":1}]}"#,
            "File is not in `more`",
        ),
    ] {
        assert!(!accepts(&schema, text), "accepted {text}: {why}");
    }
    // What stays refused: an object whose every required key another one lists, and an
    // object that takes keys it does not list (the other's key could be one of them).
    for alternatives in [
        json!([
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": false},
            {"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a", "b"], "additionalProperties": false}
        ]),
        json!([
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": {"type": "string"}},
            {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"], "additionalProperties": false}
        ]),
        json!([
            {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": false},
            {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"], "additionalProperties": false}
        ]),
    ] {
        let untold = json!({"type": "object", "properties": {"x": {"anyOf": alternatives}}});
        let err = Schema::compile(&untold.to_string()).unwrap_err();
        assert!(err.to_string().contains("tag property"), "{err}");
    }
}
