//! Synthetic models: complete GGUF files (weights, tokenizer, chat template) with
//! seeded random weights, for tests and for benchmarks of shapes whose real weights are
//! not at hand (`sparkd synth`).

use rand::{rngs::StdRng, Rng, SeedableRng};

use crate::gguf::{GgufError, GgufWriter, Metadata, Value};
use crate::quant::{quantize, GgmlType};

use super::config::Arch;

#[derive(Debug, Clone)]
pub struct SynthSpec {
    pub arch: Arch,
    pub n_layers: usize,
    pub d_model: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub ffn_dim: usize,
    /// At least 256 + the special tokens; extra entries become merged tokens.
    pub vocab_size: usize,
    pub context_length: usize,
    /// Type of the layer matrices. Q4_K_M style files mix in Q6_K: `mixed_k` does that.
    pub weight_type: GgmlType,
    /// Q4_K for most matrices, Q6_K for ffn_down and the output head (like Q4_K_M).
    pub mixed_k: bool,
    pub tied_embeddings: bool,
    pub seed: u64,
    /// A real model's `tokenizer.*` entries (its vocabulary, merges, special tokens and
    /// chat template) in place of the synthetic vocabulary: random weights that read
    /// and write a real model's tokens. Empty: the synthetic one.
    pub vocabulary: Vec<(String, Value)>,
}

impl SynthSpec {
    /// A model small enough for unit tests to run in milliseconds.
    pub fn tiny() -> Self {
        SynthSpec {
            arch: Arch::Llama,
            n_layers: 2,
            d_model: 64,
            n_heads: 4,
            n_kv_heads: 2,
            ffn_dim: 128,
            vocab_size: 320,
            context_length: 512,
            weight_type: GgmlType::Q4_1,
            mixed_k: false,
            tied_embeddings: true,
            seed: 42,
            vocabulary: Vec::new(),
        }
    }

    /// The smallest shapes that reach the K-quant formats (rows of 256) and a head size
    /// of 64 (the tensor-core prefill attention), with Llama-3's 2:1 grouped-query
    /// attention and Q4_K_M's mix: for tests of those paths, still quick.
    pub fn small() -> Self {
        SynthSpec {
            d_model: 256,
            n_heads: 4,
            n_kv_heads: 2,
            ffn_dim: 512,
            vocab_size: 512,
            weight_type: GgmlType::Q4_K,
            mixed_k: true,
            tied_embeddings: false,
            seed: 11,
            ..SynthSpec::tiny()
        }
    }

    /// Llama-3-8B shapes with a Q4_K_M-style mix (for GPU benchmarks).
    pub fn llama3_8b() -> Self {
        SynthSpec {
            arch: Arch::Llama,
            n_layers: 32,
            d_model: 4096,
            n_heads: 32,
            n_kv_heads: 8,
            ffn_dim: 14336,
            vocab_size: 128_256,
            context_length: 8192,
            weight_type: GgmlType::Q4_K,
            mixed_k: true,
            tied_embeddings: false,
            seed: 7,
            vocabulary: Vec::new(),
        }
    }

    /// This spec with the vocabulary (every `tokenizer.*` entry) of the GGUF file whose
    /// metadata is `meta`; `None` when it has no token list.
    pub fn with_vocabulary_of(mut self, meta: &Metadata) -> Option<Self> {
        let Some(Value::Array(tokens)) = meta.get("tokenizer.ggml.tokens") else {
            return None;
        };
        self.vocab_size = tokens.len();
        self.vocabulary = meta
            .iter()
            .filter(|(key, _)| key.starts_with("tokenizer."))
            .map(|(key, value)| (key.to_string(), value.clone()))
            .collect();
        Some(self)
    }
}

/// Special tokens every synthetic vocabulary ends with (ChatML, as SmolLM2 uses).
pub const SYNTH_SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// GPT-2's byte-to-unicode table: printable stand-ins for every byte, as byte-level
/// BPE vocabularies spell their tokens.
fn byte_to_unicode() -> Vec<char> {
    let mut direct: Vec<u32> = (b'!' as u32..=b'~' as u32).collect();
    direct.extend(0xA1..=0xAC);
    direct.extend(0xAE..=0xFF);
    let mut table = vec!['\0'; 256];
    let mut extra = 0;
    for b in 0..256u32 {
        let c = if direct.contains(&b) {
            b
        } else {
            extra += 1;
            255 + extra
        };
        table[b as usize] = char::from_u32(c).unwrap_or('?');
    }
    table
}

fn tokenizer_metadata(w: &mut GgufWriter, spec: &SynthSpec) {
    if !spec.vocabulary.is_empty() {
        for (key, value) in &spec.vocabulary {
            w.add(key.clone(), value.clone());
        }
        return;
    }
    let bytes = byte_to_unicode();
    let mut tokens: Vec<String> = bytes.iter().map(|c| c.to_string()).collect();
    let mut merges = Vec::new();
    // Merged tokens: pairs of common lowercase letters and "Ġ"+letter, enough to
    // exercise merging without a real vocabulary.
    let letters: Vec<char> = "etaoinshrdlu".chars().collect();
    let space = bytes[b' ' as usize];
    'outer: for &a in std::iter::once(&space).chain(letters.iter()) {
        for &b in &letters {
            if tokens.len() + SYNTH_SPECIALS.len() >= spec.vocab_size {
                break 'outer;
            }
            merges.push(format!("{a} {b}"));
            tokens.push(format!("{a}{b}"));
        }
    }
    while tokens.len() + SYNTH_SPECIALS.len() < spec.vocab_size {
        tokens.push(format!("<|reserved_{}|>", tokens.len()));
    }
    let first_special = tokens.len();
    let n_normal = tokens.len();
    tokens.extend(SYNTH_SPECIALS.iter().map(|s| s.to_string()));
    let types: Vec<Value> = (0..tokens.len())
        .map(|i| {
            Value::I32(if i >= n_normal || tokens[i].starts_with("<|reserved") {
                3
            } else {
                1
            })
        })
        .collect();
    w.add("tokenizer.ggml.model", Value::String("gpt2".into()));
    w.add("tokenizer.ggml.pre", Value::String("smollm".into()));
    w.add(
        "tokenizer.ggml.tokens",
        Value::Array(tokens.into_iter().map(Value::String).collect()),
    );
    w.add("tokenizer.ggml.token_type", Value::Array(types));
    w.add(
        "tokenizer.ggml.merges",
        Value::Array(merges.into_iter().map(Value::String).collect()),
    );
    w.add(
        "tokenizer.ggml.bos_token_id",
        Value::U32(first_special as u32 + 1),
    );
    w.add(
        "tokenizer.ggml.eos_token_id",
        Value::U32(first_special as u32 + 2),
    );
    w.add(
        "tokenizer.ggml.unknown_token_id",
        Value::U32(first_special as u32),
    );
    w.add(
        "tokenizer.ggml.padding_token_id",
        Value::U32(first_special as u32),
    );
    w.add("tokenizer.ggml.add_bos_token", Value::Bool(false));
    w.add(
        "tokenizer.chat_template",
        Value::String(CHATML_TEMPLATE.into()),
    );
}

/// Values drawn per generator: a tensor's rows are cut into pieces of about this many,
/// each drawn from a generator of its own so that threads can fill them in any order
/// and the file is the same on any machine.
const PIECE_VALUES: usize = 1 << 20;

/// Fills the tensors: random values in `[-scale, scale)`, quantized to the tensor's type,
/// on every core (an 8B-shaped model is 8 billion values to draw and quantize, minutes
/// on one core, and `scripts/gpu-check.sh` makes one on the GPU machine's clock).
struct Gen {
    seed: u64,
    tensors: u64,
    threads: usize,
}

impl Gen {
    fn new(seed: u64) -> Self {
        Gen {
            seed,
            tensors: 0,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }

    fn tensor(
        &mut self,
        w: &mut GgufWriter,
        name: &str,
        dims: &[usize],
        ty: GgmlType,
        scale: f32,
    ) -> Result<(), GgufError> {
        let bad = |reason: String| GgufError::BadTensor {
            tensor: name.into(),
            reason,
        };
        let n: usize = dims.iter().product();
        let n_bytes = ty
            .bytes_for(n as u64)
            .ok_or_else(|| bad(format!("{n} elements are not whole {ty} blocks")))?
            as usize;
        let row = dims.first().copied().unwrap_or(1).max(1);
        let rows = n / row;
        let row_bytes = ty
            .bytes_for(row as u64)
            .ok_or_else(|| bad(format!("rows of {row} are not whole {ty} blocks")))?
            as usize;
        let piece_rows = (PIECE_VALUES / row).max(1);
        let mut data = vec![0u8; n_bytes];
        let pieces: Vec<(usize, &mut [u8])> = data
            .chunks_mut(piece_rows * row_bytes)
            .enumerate()
            .collect();
        let tensor_seed = mix(self.seed ^ mix(self.tensors));
        self.tensors += 1;
        let next = std::sync::Mutex::new(pieces.into_iter());
        let failed = std::sync::Mutex::new(None);
        std::thread::scope(|scope| {
            for _ in 0..self.threads.min(rows.div_ceil(piece_rows)) {
                scope.spawn(|| {
                    let mut vals = Vec::new();
                    loop {
                        let Some((i, out)) = next.lock().expect("piece queue").next() else {
                            break;
                        };
                        let mut rng = StdRng::seed_from_u64(tensor_seed ^ mix(i as u64));
                        vals.clear();
                        let count = out.len() / row_bytes * row;
                        vals.extend((0..count).map(|_| rng.gen_range(-1.0f32..1.0) * scale));
                        if let Err(e) = quantize(ty, &vals, out) {
                            *failed.lock().expect("error slot") = Some(e.to_string());
                            break;
                        }
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().expect("error slot") {
            return Err(bad(e));
        }
        w.add_tensor(name, dims.iter().map(|&d| d as u64).collect(), ty, data)
    }
}

/// SplitMix64's finalizer: spreads nearby seeds (tensor and piece numbers) apart.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Ministral 3's YaRN and attention temperature, scaled down so that test-sized prompts
/// reach them: the original context a 32nd of the whole (at least 16 positions), so the
/// temperature steps within a few dozen tokens; no `yarn_log_multiplier`, so the
/// rotations' magnitude is not 1 (Ministral 3 itself sets 1, which cancels it).
fn yarn_metadata(w: &mut GgufWriter, a: &str, context_length: usize) {
    let original = (context_length / 32).max(16);
    let s = |k: &str| format!("{a}.rope.scaling.{k}");
    w.add(s("type"), Value::String("yarn".into()));
    w.add(
        s("factor"),
        Value::F32(context_length as f32 / original as f32),
    );
    w.add(s("original_context_length"), Value::U32(original as u32));
    w.add(s("yarn_beta_fast"), Value::F32(32.0));
    w.add(s("yarn_beta_slow"), Value::F32(1.0));
    w.add(format!("{a}.attention.temperature_scale"), Value::F32(0.1));
}

/// Builds the whole file in memory. Fine for test-sized models; `write_synth_file`
/// streams nothing either, so an 8B-shaped model needs its ~5 GB of RAM once.
pub fn synth_gguf(spec: &SynthSpec) -> Result<GgufWriter, GgufError> {
    let mut w = GgufWriter::new();
    let a = spec.arch.name();
    let head_dim = spec.d_model / spec.n_heads;
    w.add("general.architecture", Value::String(a.into()));
    w.add(
        "general.name",
        Value::String(format!("sparkd synthetic {a}")),
    );
    w.add(format!("{a}.block_count"), Value::U32(spec.n_layers as u32));
    w.add(
        format!("{a}.context_length"),
        Value::U32(spec.context_length as u32),
    );
    w.add(
        format!("{a}.embedding_length"),
        Value::U32(spec.d_model as u32),
    );
    w.add(
        format!("{a}.feed_forward_length"),
        Value::U32(spec.ffn_dim as u32),
    );
    w.add(
        format!("{a}.attention.head_count"),
        Value::U32(spec.n_heads as u32),
    );
    w.add(
        format!("{a}.attention.head_count_kv"),
        Value::U32(spec.n_kv_heads as u32),
    );
    w.add(
        format!("{a}.attention.layer_norm_rms_epsilon"),
        Value::F32(1e-5),
    );
    w.add(format!("{a}.rope.freq_base"), Value::F32(10_000.0));
    if spec.arch == Arch::Mistral3 {
        yarn_metadata(&mut w, a, spec.context_length);
    }
    w.add(
        format!("{a}.rope.dimension_count"),
        Value::U32(head_dim as u32),
    );
    w.add(
        format!("{a}.vocab_size"),
        Value::U32(spec.vocab_size as u32),
    );
    tokenizer_metadata(&mut w, spec);

    let mut g = Gen::new(spec.seed);
    let d = spec.d_model;
    let q_dim = spec.n_heads * head_dim;
    let kv_dim = spec.n_kv_heads * head_dim;
    let layer_ty = spec.weight_type;
    let heavy_ty = if spec.mixed_k {
        GgmlType::Q6_K
    } else {
        layer_ty
    };
    // Scales keep activations in a sane range through the residual stream.
    let s_in = 1.0 / (d as f32).sqrt();
    g.tensor(
        &mut w,
        "token_embd.weight",
        &[d, spec.vocab_size],
        GgmlType::Q8_0,
        1.0,
    )?;
    for i in 0..spec.n_layers {
        let n = |s: &str| format!("blk.{i}.{s}");
        g.tensor(&mut w, &n("attn_norm.weight"), &[d], GgmlType::F32, 1.0)?;
        g.tensor(&mut w, &n("attn_q.weight"), &[d, q_dim], layer_ty, s_in)?;
        g.tensor(&mut w, &n("attn_k.weight"), &[d, kv_dim], layer_ty, s_in)?;
        g.tensor(&mut w, &n("attn_v.weight"), &[d, kv_dim], layer_ty, s_in)?;
        g.tensor(
            &mut w,
            &n("attn_output.weight"),
            &[q_dim, d],
            layer_ty,
            s_in,
        )?;
        if spec.arch == Arch::Qwen2 {
            g.tensor(&mut w, &n("attn_q.bias"), &[q_dim], GgmlType::F32, 0.1)?;
            g.tensor(&mut w, &n("attn_k.bias"), &[kv_dim], GgmlType::F32, 0.1)?;
            g.tensor(&mut w, &n("attn_v.bias"), &[kv_dim], GgmlType::F32, 0.1)?;
        }
        if spec.arch == Arch::Qwen3 {
            g.tensor(
                &mut w,
                &n("attn_q_norm.weight"),
                &[head_dim],
                GgmlType::F32,
                1.0,
            )?;
            g.tensor(
                &mut w,
                &n("attn_k_norm.weight"),
                &[head_dim],
                GgmlType::F32,
                1.0,
            )?;
        }
        g.tensor(&mut w, &n("ffn_norm.weight"), &[d], GgmlType::F32, 1.0)?;
        g.tensor(
            &mut w,
            &n("ffn_gate.weight"),
            &[d, spec.ffn_dim],
            layer_ty,
            s_in,
        )?;
        g.tensor(
            &mut w,
            &n("ffn_up.weight"),
            &[d, spec.ffn_dim],
            layer_ty,
            s_in,
        )?;
        g.tensor(
            &mut w,
            &n("ffn_down.weight"),
            &[spec.ffn_dim, d],
            heavy_ty,
            1.0 / (spec.ffn_dim as f32).sqrt(),
        )?;
    }
    g.tensor(&mut w, "output_norm.weight", &[d], GgmlType::F32, 1.0)?;
    if !spec.tied_embeddings {
        g.tensor(
            &mut w,
            "output.weight",
            &[d, spec.vocab_size],
            heavy_ty,
            s_in,
        )?;
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tensors of every shape kind (several pieces, a partial last piece, one row) with
    /// `threads` threads.
    fn tensors(seed: u64, threads: usize) -> Vec<u8> {
        let mut g = Gen {
            threads,
            ..Gen::new(seed)
        };
        let mut w = GgufWriter::new();
        let tall = PIECE_VALUES / 256 * 2 + 3;
        g.tensor(&mut w, "a", &[256, tall], GgmlType::Q4_K, 0.5)
            .expect("a");
        g.tensor(&mut w, "b", &[64, 40], GgmlType::Q8_0, 1.0)
            .expect("b");
        g.tensor(&mut w, "c", &[64], GgmlType::F32, 1.0).expect("c");
        w.to_bytes()
    }

    #[test]
    fn weights_depend_on_the_seed_not_on_the_thread_count() {
        let one = tensors(5, 1);
        assert_eq!(one, tensors(5, 3), "3 threads");
        assert_eq!(one, tensors(5, 8), "8 threads");
        assert_ne!(one, tensors(6, 3), "another seed");
    }

    #[test]
    fn pieces_and_tensors_draw_different_values() {
        let mut g = Gen {
            threads: 2,
            ..Gen::new(1)
        };
        let mut w = GgufWriter::new();
        // Rows of PIECE_VALUES: each row is its own piece.
        let dims = [PIECE_VALUES, 2];
        g.tensor(&mut w, "x", &dims, GgmlType::F32, 1.0).expect("x");
        g.tensor(&mut w, "y", &dims, GgmlType::F32, 1.0).expect("y");
        let bytes = w.to_bytes();
        let file = crate::gguf::GgufFile::from_bytes(bytes).expect("parse");
        let rows: Vec<&[u8]> = ["x", "y"]
            .iter()
            .flat_map(|n| {
                let t = file.tensor(n).expect("tensor");
                file.tensor_data(t).chunks(PIECE_VALUES * 4)
            })
            .collect();
        assert_eq!(rows.len(), 4);
        for i in 0..4 {
            for j in i + 1..4 {
                assert_ne!(rows[i][..64], rows[j][..64], "rows {i} and {j}");
            }
        }
    }
}
