//! sparkd's tokenizer and chat template against outputs recorded from llama.cpp
//! (`tests/fixtures/text/`, see the generator scripts there). Each test skips, saying so,
//! when its GGUF file is not on this machine.

use std::path::PathBuf;

use serde_json::Value;
use spark_client::protocol::ChatMessage;
use sparkd::gguf::GgufFile;
use sparkd::text::{ChatTemplate, TemplateVars, Tokenizer, TokenizerSpec};

mod support;

use support::{load_tokenizer, model_path, test_vocab_path, DEFAULT_MODEL};

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/text")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Encodes every fixture case and compares with llama.cpp's ids; also checks that text
/// without special-token parsing decodes back to itself.
fn check_tokenize_fixture(path: Option<PathBuf>, fixture_name: &str) {
    let fx = fixture(fixture_name);
    let Some(path) = path else {
        eprintln!("skipping {fixture_name}: {} not found", fx["model"]);
        return;
    };
    let tok = load_tokenizer(&path);
    let cases = fx["cases"].as_array().expect("cases");
    let mut failures = Vec::new();
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let parse_special = case["parse_special"].as_bool().expect("parse_special");
        let add_special = case["add_special"].as_bool().expect("add_special");
        let want: Vec<u32> = case["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|v| v.as_u64().expect("id") as u32)
            .collect();
        let got = tok.encode(text, add_special, parse_special);
        if got != want {
            failures.push(format!(
                "{text:?} (parse_special {parse_special}):\n  got  {got:?}\n  want {want:?}"
            ));
        }
        let plain = tok.encode(text, false, false);
        let prefix = if tok.add_space_prefix() && !text.is_empty() {
            " "
        } else {
            ""
        };
        assert_eq!(tok.decode(&plain), format!("{prefix}{text}"), "round trip");
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from llama.cpp:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    eprintln!("{fixture_name}: {} cases match llama.cpp", cases.len());
}

#[test]
fn default_model_tokenizes_like_llama_cpp() {
    check_tokenize_fixture(model_path(DEFAULT_MODEL), "smollm2_tokenize.json");
}

#[test]
fn llama3_vocab_tokenizes_like_llama_cpp() {
    check_tokenize_fixture(test_vocab_path("llama3-vocab.gguf"), "llama3_tokenize.json");
}

#[test]
fn qwen3_vocab_tokenizes_like_llama_cpp() {
    check_tokenize_fixture(test_vocab_path("qwen3-vocab.gguf"), "qwen3_tokenize.json");
}

/// The GPT-2 and llama.cpp-default splitters, exercised with the Llama 3 vocabulary.
#[test]
fn gpt2_and_default_pre_tokenizers_split_like_llama_cpp() {
    check_tokenize_fixture(
        test_vocab_path("llama3-pre-gpt2-vocab.gguf"),
        "llama3_pre_gpt2_tokenize.json",
    );
    check_tokenize_fixture(
        test_vocab_path("llama3-pre-default-vocab.gguf"),
        "llama3_pre_default_tokenize.json",
    );
}

/// Mistral's Tekken splitter (Mistral Nemo's vocabulary, shared by Mistral Small 3,
/// Devstral and Ministral).
#[test]
fn mistral_nemo_vocab_tokenizes_like_llama_cpp() {
    check_tokenize_fixture(
        test_vocab_path("mistral-nemo-vocab.gguf"),
        "mistral_nemo_tokenize.json",
    );
}

#[test]
fn mistral_nemo_vocab_special_tokens() {
    let Some(path) = test_vocab_path("mistral-nemo-vocab.gguf") else {
        eprintln!("skipping: mistral-nemo-vocab.gguf not found (see make_vocab_ggufs.py)");
        return;
    };
    let tok = load_tokenizer(&path);
    assert_eq!(tok.vocab_size(), 131072);
    assert!(tok.add_bos());
    assert_eq!(tok.bos(), tok.token_id("<s>"));
    let eos = tok.token_id("</s>").expect("</s>");
    assert_eq!(tok.eos(), Some(eos));
    assert!(tok.is_eog(eos));
    for control in ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]"] {
        let id = tok.token_id(control).expect(control);
        assert!(tok.is_control(id), "{control}");
        assert!(!tok.is_eog(id), "{control}");
    }
}

#[test]
fn llama2_vocab_tokenizes_like_llama_cpp() {
    check_tokenize_fixture(test_vocab_path("llama2-vocab.gguf"), "llama2_tokenize.json");
}

#[test]
fn default_model_special_tokens() {
    let Some(path) = model_path(DEFAULT_MODEL) else {
        eprintln!("skipping: {DEFAULT_MODEL} not found");
        return;
    };
    let tok = load_tokenizer(&path);
    assert_eq!(tok.vocab_size(), 49152);
    let im_end = tok.token_id("<|im_end|>").expect("<|im_end|>");
    let endoftext = tok.token_id("<|endoftext|>").expect("<|endoftext|>");
    assert_eq!(tok.eos(), Some(im_end));
    assert!(tok.is_eog(im_end) && tok.is_eog(endoftext));
    assert!(!tok.is_eog(tok.token_id("<|im_start|>").expect("<|im_start|>")));
    assert!(!tok.add_bos());
}

fn messages(case: &Value) -> Vec<ChatMessage> {
    let list = case["messages"].as_array().expect("messages");
    list.iter()
        .map(|m| {
            ChatMessage::new(
                m["role"].as_str().expect("role"),
                m["content"].as_str().expect("content"),
            )
        })
        .collect()
}

#[test]
fn default_model_chat_template_renders_like_llama_cpp() {
    let fx = fixture("smollm2_template.json");
    let Some(path) = model_path(DEFAULT_MODEL) else {
        eprintln!("skipping: {DEFAULT_MODEL} not found");
        return;
    };
    let file = GgufFile::open(&path).expect("open model");
    let template = ChatTemplate::from_gguf(file.metadata())
        .expect("template compiles")
        .expect("model has a template");
    let tok = Tokenizer::new(TokenizerSpec::from_gguf(file.metadata()).expect("spec"))
        .expect("tokenizer");
    let text = |id: Option<u32>| {
        id.and_then(|id| tok.token_text(id))
            .unwrap_or("")
            .to_string()
    };
    let cases = fx["cases"].as_array().expect("cases");
    for case in cases {
        let add_gen = case["add_generation_prompt"]
            .as_bool()
            .expect("add_generation_prompt");
        let got = template
            .render(&messages(case), add_gen, &text(tok.bos()), &text(tok.eos()))
            .expect("render");
        assert_eq!(
            got,
            case["prompt"].as_str().expect("prompt"),
            "case {}",
            case["name"]
        );
        if add_gen {
            assert_eq!(
                template
                    .render_prompt(&messages(case), &TemplateVars::default(), &tok)
                    .expect("render"),
                got
            );
        }
    }
    eprintln!(
        "smollm2_template.json: {} cases match llama.cpp",
        cases.len()
    );
}

/// The Llama 3 and Qwen 3 templates are larger (tools, reasoning); they must compile and
/// render a plain conversation into their turn format.
#[test]
fn other_vocab_templates_render() {
    let expectations = [
        (
            "llama3-vocab.gguf",
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        (
            "qwen3-vocab.gguf",
            "<|im_start|>user\nHi<|im_end|>\n",
            "<|im_start|>assistant\n",
        ),
        // Mistral's system message goes into the last user turn; the answer follows
        // `[/INST]` directly.
        (
            "mistral-nemo-vocab.gguf",
            "[INST]Be brief.\n\nHi",
            "[/INST]",
        ),
    ];
    for (file_name, user_turn, generation_prompt) in expectations {
        let Some(path) = test_vocab_path(file_name) else {
            eprintln!("skipping {file_name}: not found (see make_vocab_ggufs.py)");
            continue;
        };
        let file = GgufFile::open(&path).expect("open vocab");
        let template = ChatTemplate::from_gguf(file.metadata())
            .expect("compiles")
            .expect("has a template");
        let tok = Tokenizer::new(TokenizerSpec::from_gguf(file.metadata()).expect("spec"))
            .expect("tokenizer");
        let msgs = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
        ];
        let prompt = template
            .render_prompt(&msgs, &TemplateVars::default(), &tok)
            .expect("render");
        assert!(prompt.contains(user_turn), "{file_name}: {prompt:?}");
        assert!(
            prompt.ends_with(generation_prompt),
            "{file_name}: {prompt:?}"
        );
        assert!(prompt.contains("Be brief."), "{file_name}: {prompt:?}");
    }
}
