//! Tokenizer behaviour on small hand-made vocabularies (real vocabularies are checked
//! against llama.cpp in `tests/text_fixtures.rs`).

use super::*;
use crate::text::unicode::byte_to_char_table;
use proptest::prelude::*;

/// A byte-level vocabulary: three specials, all 256 byte chars, and a few merges.
pub(crate) fn bpe_spec(pre: &str) -> TokenizerSpec {
    let mut tokens: Vec<String> = vec![
        "<|endoftext|>".into(),
        "<|im_start|>".into(),
        "<|im_end|>".into(),
    ];
    let mut types = vec![3, 3, 3];
    tokens.extend(byte_to_char_table().iter().map(|c| c.to_string()));
    types.extend(std::iter::repeat_n(1, 256));
    let merges = [
        "h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "r l", "Ġwo rl", "Ġworl d",
    ];
    for m in merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    tokens.push("<tool>".into());
    types.push(4);
    TokenizerSpec {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        token_types: Some(types),
        merges: merges.iter().map(|s| s.to_string()).collect(),
        eos: Some(2),
        bos: Some(1),
        ..TokenizerSpec::default()
    }
}

fn bpe(pre: &str) -> Tokenizer {
    Tokenizer::new(bpe_spec(pre)).expect("valid spec")
}

fn id(tok: &Tokenizer, text: &str) -> u32 {
    tok.token_id(text)
        .unwrap_or_else(|| panic!("{text} not in vocab"))
}

#[test]
fn encodes_with_merges_and_decodes_back() {
    let tok = bpe("gpt-2");
    let ids = tok.encode("hello world", false, false);
    assert_eq!(ids, [id(&tok, "hello"), id(&tok, "Ġworld")]);
    assert_eq!(tok.decode(&ids), "hello world");
    assert_eq!(tok.token_bytes(id(&tok, "Ġworld")), b" world");
    assert_eq!(tok.piece(id(&tok, "Ġworld")), " world");
}

#[test]
fn special_tokens_are_parsed_only_when_asked() {
    let tok = bpe("gpt-2");
    let text = "<|im_start|>hello";
    let parsed = tok.encode(text, false, true);
    assert_eq!(parsed, [1, id(&tok, "hello")]);
    let plain = tok.encode(text, false, false);
    assert!(plain.len() > 5 && !plain.contains(&1), "{plain:?}");
    assert_eq!(tok.decode(&plain), text);
    // User-defined tokens are split out either way, like llama.cpp.
    let user = id(&tok, "<tool>");
    assert_eq!(tok.encode("<tool>", false, false), [user]);
}

#[test]
fn bos_and_eos_follow_the_vocabulary_flags() {
    let mut spec = bpe_spec("gpt-2");
    spec.add_bos = true;
    spec.add_eos = true;
    let tok = Tokenizer::new(spec).unwrap();
    assert_eq!(tok.encode("hello", true, false), [1, id(&tok, "hello"), 2]);
    assert_eq!(tok.encode("hello", false, false), [id(&tok, "hello")]);
    assert_eq!(tok.encode("", true, false), [1, 2]);
}

#[test]
fn end_of_generation_tokens_are_found_by_name() {
    let mut spec = bpe_spec("gpt-2");
    spec.eos = None;
    let tok = Tokenizer::new(spec).unwrap();
    // No eos/eot given: <|im_end|> is the end of turn, and both it and <|endoftext|> end
    // generation.
    assert_eq!(tok.eot(), Some(2));
    assert!(tok.is_eog(0) && tok.is_eog(2));
    assert!(!tok.is_eog(1));
    assert!(tok.is_control(1) && !tok.is_control(id(&tok, "hello")));
}

#[test]
fn rejects_bad_specs_with_clear_errors() {
    let mut spec = bpe_spec("gpt-2");
    spec.eos = Some(100_000);
    let err = Tokenizer::new(spec).unwrap_err().to_string();
    assert!(err.contains("eos") && err.contains("100000"), "{err}");

    let mut spec = bpe_spec("gpt-2");
    spec.pre = Some("made-up".into());
    let err = Tokenizer::new(spec).unwrap_err().to_string();
    assert!(err.contains("made-up"), "{err}");

    let mut spec = bpe_spec("gpt-2");
    spec.model = "t5".into();
    assert!(Tokenizer::new(spec).unwrap_err().to_string().contains("t5"));

    let mut spec = bpe_spec("gpt-2");
    spec.bos = None;
    spec.add_bos = true;
    assert!(matches!(
        Tokenizer::new(spec),
        Err(TextError::MissingSpecialToken("BOS"))
    ));

    let mut spec = bpe_spec("gpt-2");
    spec.token_types = Some(vec![1; 3]);
    assert!(matches!(
        Tokenizer::new(spec),
        Err(TextError::InvalidVocab(_))
    ));
}

#[test]
fn out_of_range_ids_decode_to_nothing() {
    let tok = bpe("gpt-2");
    assert!(tok.token_bytes(u32::MAX).is_empty());
    assert_eq!(tok.decode(&[u32::MAX, id(&tok, "hello")]), "hello");
}

#[test]
fn tokenizer_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Tokenizer>();
}

/// A SentencePiece vocabulary with byte fallback.
fn spm() -> Tokenizer {
    let mut tokens: Vec<(String, f32, i32)> = vec![
        ("<unk>".into(), 0.0, 2),
        ("<s>".into(), 0.0, 3),
        ("</s>".into(), 0.0, 3),
    ];
    for b in 0..=255u8 {
        tokens.push((format!("<0x{b:02X}>"), 0.0, 6));
    }
    for (t, s) in [
        ("▁", -1.0),
        ("h", -2.0),
        ("i", -2.0),
        ("hi", -3.0),
        ("▁hi", -4.0),
        ("▁the", -5.0),
    ] {
        tokens.push((t.into(), s, 1));
    }
    for t in ["t", "e", "▁t", "th", "he"] {
        tokens.push((t.into(), -6.0, 1));
    }
    Tokenizer::new(TokenizerSpec {
        model: "llama".into(),
        tokens: tokens.iter().map(|t| t.0.clone()).collect(),
        scores: Some(tokens.iter().map(|t| t.1).collect()),
        token_types: Some(tokens.iter().map(|t| t.2).collect()),
        bos: Some(1),
        eos: Some(2),
        unk: Some(0),
        add_bos: true,
        add_space_prefix: true,
        ..TokenizerSpec::default()
    })
    .expect("valid spm spec")
}

#[test]
fn spm_prefixes_a_space_and_falls_back_to_bytes() {
    let tok = spm();
    let ids = tok.encode("hi €", true, false);
    let euro: Vec<u32> = "€"
        .bytes()
        .map(|b| id(&tok, &format!("<0x{b:02X}>")))
        .collect();
    let mut want = vec![1, id(&tok, "▁hi"), id(&tok, "▁")];
    want.extend(&euro);
    assert_eq!(ids, want);
    // The prefix space stays in the decoded text (as llama.cpp's pieces have it).
    assert_eq!(tok.decode(&ids[1..]), " hi €");
    // After a special token the text is prefixed again.
    let ids = tok.encode("</s>hi", false, true);
    assert_eq!(ids, [2, id(&tok, "▁hi")]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn byte_level_round_trip(text in "\\PC{0,40}") {
        for pre in ["gpt-2", "smollm", "llama-bpe", "qwen2", "default"] {
            let tok = bpe(pre);
            let ids = tok.encode(&text, false, false);
            prop_assert_eq!(tok.decode(&ids), text.clone(), "pre {}", pre);
        }
    }

    #[test]
    fn byte_level_round_trip_any_chars(text in any::<String>()) {
        let tok = bpe("smollm");
        let ids = tok.encode(&text, false, true);
        prop_assert_eq!(tok.decode(&ids), text);
    }
}

#[test]
fn ids_named_by_the_file_keep_their_token_type() {
    // A normal token named as EOS ends generation but is not turned into a control
    // token, so it is still plain text when special parsing is off.
    let mut spec = bpe_spec("gpt-2");
    let hello = spec.tokens.iter().position(|t| t == "hello").unwrap() as u32;
    spec.eos = Some(hello);
    let tok = Tokenizer::new(spec).unwrap();
    assert!(tok.is_eog(hello) && !tok.is_control(hello));
    // Found by name: <|im_end|> typed normal still becomes control and EOG.
    let mut spec = bpe_spec("gpt-2");
    spec.token_types.as_mut().unwrap()[2] = 1;
    let tok = Tokenizer::new(spec).unwrap();
    assert!(tok.is_control(2) && tok.is_eog(2));
    assert_eq!(tok.encode("<|im_end|>", false, true), [2]);
}
