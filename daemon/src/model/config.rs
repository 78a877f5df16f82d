//! Model hyper-parameters read from GGUF metadata, per architecture.

use crate::gguf::{GgufError, Metadata};

use super::rope::{AttnTemperature, RopeScaling};

/// The model families sparkd runs. They share the Llama block structure and differ in
/// details that the forward pass switches on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, SmolLM2, Mistral: no biases, "normal" (interleaved) RoPE.
    Llama,
    /// Qwen2/2.5: biases on q, k and v; NEOX RoPE.
    Qwen2,
    /// Qwen3: RMSNorm on q and k per head; NEOX RoPE.
    Qwen3,
    /// Ministral 3 and Mistral's other `mistral3` text models: Llama's block with YaRN
    /// RoPE and Llama 4 style attention temperature past the original context.
    Mistral3,
}

impl Arch {
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "llama" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            "mistral3" => Some(Arch::Mistral3),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Mistral3 => "mistral3",
        }
    }

    /// How rotary embeddings pair up dimensions.
    pub fn rope_style(self) -> RopeStyle {
        match self {
            // llama.cpp's converter permutes Llama's q/k weights so that rotated pairs
            // are adjacent; Qwen keeps Hugging Face's half-split layout.
            Arch::Llama | Arch::Mistral3 => RopeStyle::Interleaved,
            Arch::Qwen2 | Arch::Qwen3 => RopeStyle::Neox,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (x[2i], x[2i+1]).
    Interleaved,
    /// Pairs (x[i], x[i + rot_dim/2]).
    Neox,
}

/// Query heads per kv head the attention kernel handles (Llama 3 70B uses 8).
pub const MAX_GQA_GROUP: usize = 16;

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layers: usize,
    pub d_model: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    /// Leading dimensions of each head that are rotated (the rest pass through).
    pub rope_dim: usize,
    /// Linear or YaRN context extension of the rotary embeddings.
    pub rope_scaling: RopeScaling,
    /// Llama 4 style growth of the queries with the position (Ministral 3).
    pub attn_temperature: Option<AttnTemperature>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Metadata(#[from] GgufError),
    #[error("unsupported architecture `{0}` (sparkd runs llama, qwen2, qwen3 and mistral3)")]
    UnsupportedArch(String),
    #[error("invalid model metadata: {0}")]
    Invalid(String),
}

impl ModelConfig {
    pub fn from_metadata(meta: &Metadata) -> Result<Self, ConfigError> {
        let arch_name = meta.get_str("general.architecture")?;
        let arch = Arch::from_name(arch_name)
            .ok_or_else(|| ConfigError::UnsupportedArch(arch_name.into()))?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let n_layers = meta.get_u32(&key("block_count"))? as usize;
        let d_model = meta.get_u32(&key("embedding_length"))? as usize;
        let n_heads = meta.get_u32(&key("attention.head_count"))? as usize;
        let n_kv_heads = meta
            .opt_u32(&key("attention.head_count_kv"))?
            .map_or(n_heads, |v| v as usize);
        let ffn_dim = meta.get_u32(&key("feed_forward_length"))? as usize;
        let context_length = meta.get_u32(&key("context_length"))? as usize;
        let rms_eps = meta.get_f32(&key("attention.layer_norm_rms_epsilon"))?;
        let rope_base = meta.opt_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0);
        if n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(ConfigError::Invalid(format!(
                "head_count {n_heads} must be a positive multiple of head_count_kv {n_kv_heads}"
            )));
        }
        if n_heads / n_kv_heads > MAX_GQA_GROUP {
            return Err(ConfigError::Invalid(format!(
                "{} query heads per kv head is more than the {MAX_GQA_GROUP} sparkd supports",
                n_heads / n_kv_heads
            )));
        }
        let head_dim = match meta.opt_u32(&key("attention.key_length"))? {
            Some(k) => k as usize,
            None if d_model % n_heads == 0 => d_model / n_heads,
            None => {
                return Err(ConfigError::Invalid(format!(
                    "embedding_length {d_model} is not a multiple of head_count {n_heads}"
                )))
            }
        };
        if let Some(v) = meta.opt_u32(&key("attention.value_length"))? {
            if v as usize != head_dim {
                return Err(ConfigError::Invalid(format!(
                    "value_length {v} differs from key_length {head_dim}"
                )));
            }
        }
        let rope_dim = meta
            .opt_u32(&key("rope.dimension_count"))?
            .map_or(head_dim, |v| v as usize);
        if rope_dim > head_dim || rope_dim % 2 != 0 {
            return Err(ConfigError::Invalid(format!(
                "rope.dimension_count {rope_dim} must be even and at most the head size {head_dim}"
            )));
        }
        let rope_scaling = RopeScaling::from_metadata(meta, arch_name, context_length)?;
        // Only Ministral 3 reads the temperature, as in llama.cpp; elsewhere the key
        // would mean something the forward pass does not do.
        let attn_temperature = match arch {
            Arch::Mistral3 => {
                AttnTemperature::from_metadata(meta, arch_name, &rope_scaling, context_length)?
            }
            _ => None,
        };
        let vocab_size = match meta.opt_u32(&key("vocab_size"))? {
            Some(v) => v as usize,
            None => meta.get_array("tokenizer.ggml.tokens")?.len(),
        };
        let cfg = ModelConfig {
            arch,
            n_layers,
            d_model,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim,
            vocab_size,
            context_length,
            rms_eps,
            rope_base,
            rope_dim,
            rope_scaling,
            attn_temperature,
        };
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> Result<(), ConfigError> {
        let dims = [
            ("block_count", self.n_layers),
            ("embedding_length", self.d_model),
            ("feed_forward_length", self.ffn_dim),
            ("vocab_size", self.vocab_size),
            ("context_length", self.context_length),
            ("head size", self.head_dim),
        ];
        for (name, v) in dims {
            // Generous caps: they only exist so a crafted file cannot make us allocate
            // absurd buffers before tensor shapes are cross-checked.
            if v == 0 || v > (1 << 24) {
                return Err(ConfigError::Invalid(format!(
                    "{name} = {v} is out of range"
                )));
            }
        }
        if !(self.rms_eps.is_finite() && self.rms_eps > 0.0) {
            return Err(ConfigError::Invalid(format!(
                "rms epsilon {} must be positive",
                self.rms_eps
            )));
        }
        if !(self.rope_base.is_finite() && self.rope_base > 0.0) {
            return Err(ConfigError::Invalid(format!(
                "rope.freq_base {} must be positive",
                self.rope_base
            )));
        }
        Ok(())
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}
