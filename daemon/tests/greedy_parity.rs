//! The CPU forward of the real default model must pick the same greedy tokens as
//! llama.cpp on the same file (fixtures made by scripts/make-greedy-fixtures.py).

use std::path::PathBuf;

use sparkd::model::{BlockTable, Model, SeqInput, Workspace};

fn default_model() -> Option<PathBuf> {
    let path = spark_client::models::models_dir().join("smollm2-135m-instruct.gguf");
    path.is_file().then_some(path)
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn greedy_tokens_match_llama_cpp() {
    let Some(path) = default_model() else {
        eprintln!("skipping: default model not found (run `spark pull` or scripts/fetch-default-model.sh)");
        return;
    };
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/greedy_smollm2.json")).expect("fixture parses");
    let model = Model::load(&path).expect("default model loads");
    let vocab = model.config.vocab_size;
    let mut kv = model.new_kv_cache(4096);
    let mut ws = Workspace::new(2);
    let cases = fixture["cases"].as_array().expect("cases");
    assert!(cases.len() >= 5);
    let mut mismatches = Vec::new();
    for (ci, case) in cases.iter().enumerate() {
        let ids = |k: &str| -> Vec<u32> {
            case[k].as_array().expect("ids").iter().map(|v| v.as_u64().expect("id") as u32).collect()
        };
        let prompt = ids("prompt_ids");
        let expected = ids("expected_ids");
        let mut table = BlockTable::default();
        kv.reserve(&mut table, prompt.len() + expected.len()).unwrap();
        let mut toks = prompt.clone();
        let mut got = Vec::new();
        let mut pos = 0;
        while got.len() < expected.len() {
            let b = [SeqInput { table: &table, tokens: &toks[pos..], start_pos: pos, want_logits: true }];
            model.forward(&b, &mut kv, &mut ws).expect("forward");
            pos = toks.len();
            let next = argmax(ws.logits(0, vocab));
            got.push(next);
            toks.push(next);
        }
        kv.release(&mut table);
        if got != expected {
            let first = got.iter().zip(&expected).position(|(a, b)| a != b).unwrap_or(0);
            mismatches.push(format!("case {ci}: first difference at token {first}: got {got:?}, expected {expected:?}"));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}
