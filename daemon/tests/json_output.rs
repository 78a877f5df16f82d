//! JSON output on real vocabularies: the default model's (49k byte-level BPE tokens) and
//! the vocabulary-only files of Llama 3 (128k), Qwen 3 (152k) and Llama 2 (SentencePiece
//! with byte fallback; see `fixtures/text/make_vocab_ggufs.py`). The mask's trie walk
//! is checked against trying every token alone. Each vocabulary skips, saying so, when
//! its file is not on this machine.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use sparkd::text::constraint::{JsonConstraint, JsonFilter};
use sparkd::text::sampler::TokenFilter;
use sparkd::text::schema::Schema;
use sparkd::text::Tokenizer;

mod support;

use support::{load_tokenizer, model_path, test_vocab_path, DEFAULT_MODEL};

fn load(name: &str, path: Option<PathBuf>) -> Option<Tokenizer> {
    let Some(path) = path else {
        eprintln!("skipping {name}: its GGUF file is not on this machine");
        return None;
    };
    Some(load_tokenizer(&path))
}

/// The ids the mask leaves (every logit starts finite).
fn masked(c: &mut JsonConstraint, tok: &Tokenizer) -> Vec<u32> {
    let mut logits = vec![0.0f32; tok.vocab_size()];
    let left = JsonFilter {
        constraint: c,
        tokenizer: tok,
    }
    .mask(&mut logits);
    let ids: Vec<u32> = (0..logits.len() as u32)
        .filter(|&i| logits[i as usize].is_finite())
        .collect();
    assert_eq!(ids.len(), left);
    ids
}

#[test]
fn the_mask_allows_exactly_the_tokens_that_continue_the_json() {
    let vocabs = [
        ("smollm2", model_path(DEFAULT_MODEL)),
        ("llama3", test_vocab_path("llama3-vocab.gguf")),
        ("qwen3", test_vocab_path("qwen3-vocab.gguf")),
        ("llama2", test_vocab_path("llama2-vocab.gguf")),
    ];
    for (name, path) in vocabs {
        if let Some(tok) = load(name, path) {
            check_vocab(name, &tok, JsonConstraint::new(), "any object", TEXT);
            check_vocab(
                name,
                &tok,
                JsonConstraint::with_schema(schema()),
                "schema",
                TEXT,
            );
            let patterned = JsonConstraint::with_schema(patterned());
            check_vocab(name, &tok, patterned, "patterns", PATTERNED_TEXT);
        }
    }
}

/// A schema the text below matches, with a length limit on a string (where the mask
/// cannot take plain string tokens as a set), bounds, a choice and an empty object.
fn schema() -> Arc<Schema> {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 30},
            "tags": {"type": "array", "items": {"anyOf": [
                {"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"}
            ]}},
            "x": {"type": "object", "additionalProperties": false}
        },
        "required": ["name", "age"],
        "additionalProperties": false
    });
    Arc::new(Schema::compile(&schema.to_string()).expect("compiles"))
}

const TEXT: &str = "{\n  \"name\": \"Félix 😀\",\n  \"age\": 10, \"tags\": [\"a\\n\", -1.5e+3, true, null],\n  \"x\": {}\n}";

/// Strings held to patterns and formats: every token inside them is walked through
/// the automaton (no plain-text shortcut).
fn patterned() -> Arc<Schema> {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
            "name": {"type": "string", "pattern": "^[^0-9]+$"},
            "when": {"type": "string", "format": "date-time"},
            "mail": {"type": "string", "format": "email"}
        },
        "required": ["code", "when"],
        "additionalProperties": false
    });
    Arc::new(Schema::compile(&schema.to_string()).expect("compiles"))
}

const PATTERNED_TEXT: &str = "{\"code\": \"ABC-123\", \"name\": \"Félix 😀\\n\", \"when\": \"2026-12-05T23:30:00Z\", \"mail\": \"felix@example.com\"}";

fn check_vocab(name: &str, tok: &Tokenizer, mut c: JsonConstraint, what: &str, text: &str) {
    let mut ids = tok.encode(text, false, false);
    // SentencePiece prefixes a space (`▁{`); JSON output starts at the `{` itself.
    let first = tok.token_bytes(ids[0]);
    if let Some(rest) = first.strip_prefix(b" ") {
        ids[0] = (0..tok.vocab_size() as u32)
            .find(|&id| tok.token_bytes(id) == rest)
            .unwrap_or_else(|| panic!("{name}: no token for {rest:?}"));
    }
    assert_eq!(tok.decode(&ids), text, "{name}");
    // The first mask sorts the vocabulary.
    let started = Instant::now();
    masked(&mut c, tok);
    let first = started.elapsed().as_secs_f64();
    let mut slowest = 0.0f64;
    for &id in &ids {
        let started = Instant::now();
        let allowed = masked(&mut c, tok);
        slowest = slowest.max(started.elapsed().as_secs_f64());
        let brute: Vec<u32> = (0..tok.vocab_size() as u32)
            .filter(|&t| c.allows(tok, t))
            .collect();
        if allowed != brute {
            let only_mask: Vec<String> = (allowed.iter().filter(|t| !brute.contains(t)))
                .take(8)
                .map(|&t| format!("{t} {:?}", tok.piece(t)))
                .collect();
            let only_brute: Vec<String> = (brute.iter().filter(|t| !allowed.contains(t)))
                .take(8)
                .map(|&t| format!("{t} {:?}", tok.piece(t)))
                .collect();
            panic!("{name}: allowed by the mask only: {only_mask:?}; by trying each token only: {only_brute:?}");
        }
        assert!(allowed.contains(&id), "{name}: {:?} refused", tok.piece(id));
        assert!(!c.is_done());
        c.advance(tok, id);
    }
    assert!(c.is_done(), "{name}");
    eprintln!(
        "{name}, {what}: {} tokens, {} in the vocabulary: the first mask took {:.2} ms, the slowest after it {:.2} ms",
        ids.len(),
        tok.vocab_size(),
        first * 1e3,
        slowest * 1e3
    );
}
