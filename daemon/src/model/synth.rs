//! Synthetic models: complete GGUF files (weights, tokenizer, chat template) with
//! seeded random weights, for tests and for benchmarks of shapes whose real weights are
//! not at hand (`sparkd synth`).

use rand::{rngs::StdRng, Rng, SeedableRng};

use crate::gguf::{GgufError, GgufWriter, Value};
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
        }
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

struct Gen {
    rng: StdRng,
}

impl Gen {
    fn values(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| self.rng.gen_range(-1.0f32..1.0) * scale)
            .collect()
    }

    fn tensor(
        &mut self,
        w: &mut GgufWriter,
        name: &str,
        dims: &[usize],
        ty: GgmlType,
        scale: f32,
    ) -> Result<(), GgufError> {
        let n: usize = dims.iter().product();
        let vals = self.values(n, scale);
        let n_bytes = ty.bytes_for(n as u64).ok_or_else(|| GgufError::BadTensor {
            tensor: name.into(),
            reason: format!("{n} elements are not whole {ty} blocks"),
        })? as usize;
        let mut data = vec![0u8; n_bytes];
        quantize(ty, &vals, &mut data).map_err(|e| GgufError::BadTensor {
            tensor: name.into(),
            reason: e.to_string(),
        })?;
        w.add_tensor(name, dims.iter().map(|&d| d as u64).collect(), ty, data)
    }
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
    w.add(
        format!("{a}.rope.dimension_count"),
        Value::U32(head_dim as u32),
    );
    w.add(
        format!("{a}.vocab_size"),
        Value::U32(spec.vocab_size as u32),
    );
    tokenizer_metadata(&mut w, spec);

    let mut g = Gen {
        rng: StdRng::seed_from_u64(spec.seed),
    };
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
