//! Whole-path tests of the forward pass on a tiny synthetic model: batching, chunked
//! prefill and the paged KV cache must not change any logit.

use super::kv::BLOCK_TOKENS;
use super::synth::{synth_gguf, SynthSpec};
use super::*;
use crate::gguf::GgufFile;

fn tiny(spec: SynthSpec) -> Model {
    let bytes = synth_gguf(&spec).expect("synth").to_bytes();
    let file = GgufFile::from_bytes(bytes).expect("parse synth");
    Model::from_file(file, std::path::Path::new("tiny.gguf")).expect("load synth")
}

fn tokens(n: usize, salt: u32, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 31 + salt * 7 + 3) % vocab as u32)
        .collect()
}

/// Logits of the last token after feeding `toks` in chunks of `chunk`.
fn run_single(
    model: &Model,
    kv: &mut KvCache,
    ws: &mut Workspace,
    toks: &[u32],
    chunk: usize,
) -> Vec<f32> {
    let mut table = BlockTable::default();
    kv.reserve(&mut table, toks.len()).unwrap();
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < toks.len() {
        let end = (pos + chunk).min(toks.len());
        let b = [SeqInput {
            table: &table,
            tokens: &toks[pos..end],
            start_pos: pos,
            want_logits: end == toks.len(),
            greedy: None,
        }];
        model.forward(&b, kv, ws).unwrap();
        pos = end;
    }
    out.extend_from_slice(ws.logits(0, model.config.vocab_size));
    kv.release(&mut table);
    out
}

fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = a.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-6);
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / scale)
        .fold(0.0, f32::max)
}

#[test]
fn batched_forward_equals_single_forwards() {
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Mistral3] {
        let model = tiny(SynthSpec {
            arch,
            ..SynthSpec::tiny()
        });
        let vocab = model.config.vocab_size;
        let mut kv = model.new_kv_cache(4096);
        let mut ws = Workspace::new(2);
        let prompts: Vec<Vec<u32>> = [5usize, 17, 1, 40]
            .iter()
            .enumerate()
            .map(|(i, &n)| tokens(n, i as u32, vocab))
            .collect();
        let singles: Vec<Vec<f32>> = prompts
            .iter()
            .map(|p| run_single(&model, &mut kv, &mut ws, p, 64))
            .collect();

        let mut tables: Vec<BlockTable> = prompts.iter().map(|_| BlockTable::default()).collect();
        for (t, p) in tables.iter_mut().zip(&prompts) {
            kv.reserve(t, p.len()).unwrap();
        }
        let batch: Vec<SeqInput> = tables
            .iter()
            .zip(&prompts)
            .map(|(t, p)| SeqInput {
                table: t,
                tokens: p,
                start_pos: 0,
                want_logits: true,
                greedy: None,
            })
            .collect();
        model.forward(&batch, &mut kv, &mut ws).unwrap();
        for (i, single) in singles.iter().enumerate() {
            let d = max_rel_diff(single, ws.logits(i, vocab));
            assert!(d < 1e-4, "{arch:?}: sequence {i} differs by {d}");
        }
    }
}

#[test]
fn chunked_prefill_and_decode_steps_equal_one_pass() {
    let model = tiny(SynthSpec::tiny());
    let vocab = model.config.vocab_size;
    let mut kv = model.new_kv_cache(1024);
    let mut ws = Workspace::new(2);
    let toks = tokens(50, 9, vocab);
    let whole = run_single(&model, &mut kv, &mut ws, &toks, 64);
    for chunk in [1, 7, 16] {
        let parts = run_single(&model, &mut kv, &mut ws, &toks, chunk);
        let d = max_rel_diff(&whole, &parts);
        assert!(d < 1e-4, "chunk {chunk}: differs by {d}");
    }
}

#[test]
fn paged_kv_in_any_block_order_equals_contiguous() {
    let model = tiny(SynthSpec::tiny());
    let vocab = model.config.vocab_size;
    let toks = tokens(5 * BLOCK_TOKENS + 3, 4, vocab);
    let mut ws = Workspace::new(1);
    let mut kv = model.new_kv_cache(64 * BLOCK_TOKENS);
    let contiguous = run_single(&model, &mut kv, &mut ws, &toks, 8);
    let mut kv = model.new_kv_cache(64 * BLOCK_TOKENS);
    kv.shuffle_free_list(1234);
    // Interleave another sequence's blocks so ours are scattered and out of order.
    let mut other = BlockTable::default();
    kv.reserve(&mut other, 3 * BLOCK_TOKENS).unwrap();
    let shuffled = run_single(&model, &mut kv, &mut ws, &toks, 8);
    assert!(max_rel_diff(&contiguous, &shuffled) < 1e-5);
}

#[test]
fn a_reused_prefix_gives_the_logits_of_a_full_prefill() {
    let model = tiny(SynthSpec::tiny());
    let vocab = model.config.vocab_size;
    let mut ws = Workspace::new(2);
    let mut kv = model.new_kv_cache(64 * BLOCK_TOKENS);
    // A first prompt computes its K/V in one pass and publishes its full blocks.
    let first = tokens(3 * BLOCK_TOKENS + 5, 6, vocab);
    let mut table = BlockTable::default();
    kv.reserve(&mut table, first.len()).unwrap();
    let b = [SeqInput {
        table: &table,
        tokens: &first,
        start_pos: 0,
        want_logits: true,
        greedy: None,
    }];
    model.forward(&b, &mut kv, &mut ws).unwrap();
    kv.pool_mut().publish_prefix(&mut table, &first);
    kv.release(&mut table);

    // A second one shares two blocks and a few tokens with it, then goes its own way.
    let mut second = first[..2 * BLOCK_TOKENS + 7].to_vec();
    second.extend(tokens(20, 8, vocab));
    let reused = kv
        .pool_mut()
        .reuse_prefix(&mut table, &second[..second.len() - 1]);
    assert_eq!(reused, 2 * BLOCK_TOKENS);
    kv.reserve(&mut table, second.len()).unwrap();
    let b = [SeqInput {
        table: &table,
        tokens: &second[reused..],
        start_pos: reused,
        want_logits: true,
        greedy: None,
    }];
    model.forward(&b, &mut kv, &mut ws).unwrap();
    let with_reuse = ws.logits(0, vocab).to_vec();

    let fresh = run_single(
        &model,
        &mut model.new_kv_cache(64 * BLOCK_TOKENS),
        &mut ws,
        &second,
        64,
    );
    let d = max_rel_diff(&fresh, &with_reuse);
    assert!(d < 1e-5, "differs by {d}");
}

#[test]
fn thread_count_does_not_change_results() {
    let model = tiny(SynthSpec::tiny());
    let vocab = model.config.vocab_size;
    let toks = tokens(33, 2, vocab);
    let mut kv = model.new_kv_cache(256);
    let one = run_single(&model, &mut kv, &mut Workspace::new(1), &toks, 64);
    let three = run_single(&model, &mut kv, &mut Workspace::new(3), &toks, 64);
    assert!(max_rel_diff(&one, &three) < 1e-5);
}

#[test]
fn bad_batches_are_errors_not_panics() {
    let model = tiny(SynthSpec::tiny());
    let mut kv = model.new_kv_cache(64);
    let mut ws = Workspace::new(1);
    let mut table = BlockTable::default();
    kv.reserve(&mut table, 4).unwrap();
    let vocab = model.config.vocab_size as u32;
    let b = [SeqInput {
        table: &table,
        tokens: &[vocab],
        start_pos: 0,
        want_logits: true,
        greedy: None,
    }];
    assert!(matches!(
        model.forward(&b, &mut kv, &mut ws),
        Err(ForwardError::TokenOutOfRange { .. })
    ));
    let b = [SeqInput {
        table: &table,
        tokens: &[1; 20],
        start_pos: 0,
        want_logits: true,
        greedy: None,
    }];
    assert!(matches!(
        model.forward(&b, &mut kv, &mut ws),
        Err(ForwardError::NoKvBlock { .. })
    ));
    let b = [SeqInput {
        table: &table,
        tokens: &[],
        start_pos: 0,
        want_logits: true,
        greedy: None,
    }];
    assert_eq!(
        model.forward(&b, &mut kv, &mut ws),
        Err(ForwardError::EmptySequence)
    );
}

#[test]
fn missing_tensor_and_unknown_arch_are_load_errors() {
    let spec = SynthSpec::tiny();
    let mut w = synth_gguf(&spec).unwrap();
    w.add(
        "general.architecture",
        crate::gguf::Value::String("mamba".into()),
    );
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let err = Model::from_file(file, std::path::Path::new("x.gguf"))
        .err()
        .expect("must fail");
    // The message names the file; the cause, reported after it, names the architecture.
    let report = format!("{:#}", anyhow::Error::new(err));
    assert!(report.starts_with("x.gguf: "), "{report}");
    assert!(report.contains("mamba"), "{report}");
}

#[test]
fn a_synthetic_model_can_take_another_files_vocabulary() {
    let donor = synth_gguf(&SynthSpec {
        vocab_size: 400,
        ..SynthSpec::small()
    })
    .expect("synth")
    .to_bytes();
    let donor = GgufFile::from_bytes(donor).expect("parse");
    let spec = SynthSpec::tiny()
        .with_vocabulary_of(donor.metadata())
        .expect("a token list");
    assert_eq!(spec.vocab_size, 400);
    let model = tiny(spec);
    let meta = model.file.metadata();
    assert_eq!(
        meta.get("tokenizer.ggml.tokens"),
        donor.metadata().get("tokenizer.ggml.tokens")
    );
    assert_eq!(
        model.config.vocab_size, 400,
        "the embedding follows the vocabulary"
    );
    assert!(SynthSpec::tiny()
        .with_vocabulary_of(&crate::gguf::Metadata::default())
        .is_none());
}

fn mistral3(temperature: f32) -> Model {
    let spec = SynthSpec {
        arch: Arch::Mistral3,
        ..SynthSpec::tiny()
    };
    let mut w = synth_gguf(&spec).unwrap();
    w.add(
        "mistral3.attention.temperature_scale",
        crate::gguf::Value::F32(temperature),
    );
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    Model::from_file(file, std::path::Path::new("m3.gguf")).unwrap()
}

#[test]
fn mistral3_reads_yarn_and_its_temperature_grows_queries_past_the_original_context() {
    let model = mistral3(0.1);
    let cfg = &model.config;
    // The synthetic file's original context is 16 of 512 positions.
    let rope::RopeScaling::Yarn(yarn) = cfg.rope_scaling else {
        panic!("yarn expected, got {:?}", cfg.rope_scaling);
    };
    assert_eq!((yarn.original_context, yarn.factor), (16, 32.0));
    assert!(cfg.rope_scaling.magnitude() > 1.0);
    assert_eq!(
        cfg.attn_temperature,
        Some(rope::AttnTemperature {
            scale: 0.1,
            floor: 16
        })
    );
    // Interpolated frequencies: the slowest pair turns 32 times slower than its base.
    let inv = &model.weights.rope_inv_freq;
    let base_last = 10_000f32.powf(-2.0 * (inv.len() - 1) as f32 / cfg.rope_dim as f32);
    assert!((inv[inv.len() - 1] - base_last / 32.0).abs() < 1e-9);
    assert_eq!(inv[0], 1.0, "the fastest pair keeps its frequency");

    // Within the original context the temperature is 1: the same logits as without
    // it, to the bit; past it, different ones.
    let plain = mistral3(0.0);
    assert_eq!(plain.config.attn_temperature, None);
    let vocab = cfg.vocab_size;
    let mut kv = model.new_kv_cache(1024);
    let mut kv_plain = plain.new_kv_cache(1024);
    let mut ws = Workspace::new(1);
    let short = tokens(16, 4, vocab);
    assert_eq!(
        run_single(&model, &mut kv, &mut ws, &short, 64),
        run_single(&plain, &mut kv_plain, &mut ws, &short, 64)
    );
    let long = tokens(40, 4, vocab);
    let d = max_rel_diff(
        &run_single(&model, &mut kv, &mut ws, &long, 64),
        &run_single(&plain, &mut kv_plain, &mut ws, &long, 64),
    );
    assert!(
        d > 1e-3,
        "the temperature past position 16 moved logits by only {d}"
    );
}
