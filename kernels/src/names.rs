//! Kernel entry-point names, built from typed arguments so the host cannot misspell one,
//! and the full list that the NVRTC test checks every compiled module against.

/// Weight formats the weight-reading kernels (embedding, mat-vec, dequantize) support,
/// with ggml's type ids (the numbering quant.cuh uses too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum WeightType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    IQ4_NL,
    IQ4_XS,
}

impl WeightType {
    pub const ALL: [WeightType; 15] = [
        Self::F32,
        Self::F16,
        Self::BF16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::IQ4_NL,
        Self::IQ4_XS,
    ];

    /// From a GGUF/ggml type id; `None` for formats without kernels.
    pub fn from_ggml_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.ggml_id() == id)
    }

    pub fn ggml_id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q2_K => 10,
            Self::Q3_K => 11,
            Self::Q4_K => 12,
            Self::Q5_K => 13,
            Self::Q6_K => 14,
            Self::IQ4_NL => 20,
            Self::IQ4_XS => 23,
            Self::BF16 => 30,
        }
    }

    /// The suffix of the kernel names (`mmv_q4_k_b8`).
    pub fn suffix(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
            Self::Q4_0 => "q4_0",
            Self::Q4_1 => "q4_1",
            Self::Q5_0 => "q5_0",
            Self::Q5_1 => "q5_1",
            Self::Q8_0 => "q8_0",
            Self::Q2_K => "q2_k",
            Self::Q3_K => "q3_k",
            Self::Q4_K => "q4_k",
            Self::Q5_K => "q5_k",
            Self::Q6_K => "q6_k",
            Self::IQ4_NL => "iq4_nl",
            Self::IQ4_XS => "iq4_xs",
        }
    }

    /// Elements per block: a row's length must be a multiple of this and of 8.
    pub fn block_elems(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 | Self::IQ4_NL => 32,
            Self::Q2_K | Self::Q3_K | Self::Q4_K | Self::Q5_K | Self::Q6_K | Self::IQ4_XS => 256,
        }
    }

    /// Whether the kernels accept rows of `cols` elements of this type.
    pub fn supports_cols(self, cols: usize) -> bool {
        cols > 0 && cols % 8 == 0 && cols % self.block_elems() == 0
    }
}

/// The 16-bit float formats of the prefill GEMM operands and the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Half {
    F16,
    BF16,
}

impl Half {
    fn suffix(self) -> &'static str {
        match self {
            Half::F16 => "f16",
            Half::BF16 => "bf16",
        }
    }
}

/// Element type of the paged KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvType {
    F32,
    F16,
}

impl KvType {
    /// Bytes per cached element.
    pub fn bytes(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 => 2,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
        }
    }
}

/// The batch sizes the mat-vec kernels are compiled for.
pub const MMV_BATCHES: [usize; 4] = [1, 4, 8, 16];

/// The mat-vec variant to launch for `n` activation rows: the smallest that holds them,
/// `None` above [`crate::consts::MMV_MAX_BATCH`] (split the batch, or use the GEMM).
pub fn mmv_variant(n: usize) -> Option<usize> {
    MMV_BATCHES.into_iter().find(|&b| b >= n.max(1))
}

/// The batch variants of the fused mat-vecs (`mmv_glu`, `mmv3`): decode batches up to
/// 4; larger ones take the tensor-core mat-mul.
pub const MMV_FUSED_BATCHES: [usize; 2] = [1, 4];

/// The `mmv_glu` variant for `n` activation rows, `None` above the largest.
pub fn mmv_fused_variant(n: usize) -> Option<usize> {
    MMV_FUSED_BATCHES.into_iter().find(|&b| b >= n.max(1))
}

/// The activation-row widths the tensor-core mat-mul kernels are compiled for.
pub const MMQ_WIDTHS: [usize; 4] = [8, 16, 32, 64];

/// The `mmq` variant to launch for `n` activation rows: the smallest that holds them,
/// `None` above [`crate::consts::MMQ_MAX_TOKENS`] (split the rows over launches).
pub fn mmq_variant(n: usize) -> Option<usize> {
    MMQ_WIDTHS.into_iter().find(|&w| w >= n.max(1))
}

pub fn embed(ty: WeightType) -> String {
    format!("embed_{}", ty.suffix())
}

/// `batch` must be one of [`MMV_BATCHES`] (see [`mmv_variant`]).
pub fn mmv(ty: WeightType, batch: usize) -> String {
    format!("mmv_{}_b{batch}", ty.suffix())
}

/// `batch` must be one of [`MMV_FUSED_BATCHES`] (see [`mmv_fused_variant`]).
pub fn mmv_glu(ty: WeightType, batch: usize) -> String {
    format!("mmv_glu_{}_b{batch}", ty.suffix())
}

/// Up to three mat-vec products of one input in one launch (`mmv3`); `batch` as for
/// [`mmv_glu`].
pub fn mmv3(ty: WeightType, batch: usize) -> String {
    format!("mmv3_{}_b{batch}", ty.suffix())
}

/// `width` must be one of [`MMQ_WIDTHS`] (see [`mmq_variant`]).
pub fn mmq(ty: WeightType, width: usize) -> String {
    format!("mmq_{}_n{width}", ty.suffix())
}

/// The fused gate/up/SwiGLU tensor-core mat-mul; `width` as for [`mmq`].
pub fn mmq_glu(ty: WeightType, width: usize) -> String {
    format!("mmq_glu_{}_n{width}", ty.suffix())
}

pub fn dequant(ty: WeightType, out: Half) -> String {
    format!("dequant_{}_{}", ty.suffix(), out.suffix())
}

pub fn gemm(ty: Half) -> String {
    format!("gemm_{}", ty.suffix())
}

pub fn convert_from_f32(ty: Half) -> String {
    format!("convert_f32_{}", ty.suffix())
}

/// RoPE on q and k, and the keys and values into the cache (`rope_kv.cu`).
pub fn rope_kv_write(ty: KvType) -> String {
    format!("rope_kv_write_{}", ty.suffix())
}

pub fn attn_decode(ty: KvType) -> String {
    format!("attn_decode_{}", ty.suffix())
}

pub fn attn_prefill(ty: KvType) -> String {
    format!("attn_prefill_{}", ty.suffix())
}

/// Head sizes with a tensor-core prefill attention (for an f16 cache).
pub const ATTN_PREFILL_TC_HEAD_DIMS: [usize; 4] = [32, 64, 96, 128];

/// The tensor-core prefill attention for this cache type and head size, where there is
/// one (`attn_prefill` serves the others).
pub fn attn_prefill_tc(ty: KvType, head_dim: usize) -> Option<String> {
    (ty == KvType::F16 && ATTN_PREFILL_TC_HEAD_DIMS.contains(&head_dim))
        .then(|| format!("attn_prefill_f16_tc_hd{head_dim}"))
}

pub const ATTN_DECODE_REDUCE: &str = "attn_decode_reduce";
pub const RMSNORM: &str = "rmsnorm_f32";
/// RMSNorm straight to the f16 operand of the tensor-core products.
pub const RMSNORM_F16: &str = "rmsnorm_f16";
pub const SWIGLU: &str = "swiglu_f32";
/// SwiGLU straight to the f16 operand of the tensor-core products.
pub const SWIGLU_F16: &str = "swiglu_f16";
pub const ARGMAX: &str = "argmax_f32";
/// A greedy row's logit bias, added on the device before [`ARGMAX`].
pub const LOGIT_BIAS: &str = "logit_bias_f32";

/// Every kernel the host may launch, with the module that defines it.
pub fn all() -> Vec<(&'static str, String)> {
    let mut v = Vec::new();
    for ty in WeightType::ALL {
        v.push(("embed.cu", embed(ty)));
        for b in MMV_BATCHES {
            v.push(("matvec.cu", mmv(ty, b)));
        }
        for b in MMV_FUSED_BATCHES {
            v.push(("matvec.cu", mmv_glu(ty, b)));
            v.push(("matvec.cu", mmv3(ty, b)));
        }
        for width in MMQ_WIDTHS {
            v.push(("mmq.cu", mmq(ty, width)));
            v.push(("mmq.cu", mmq_glu(ty, width)));
        }
        for h in [Half::F16, Half::BF16] {
            v.push(("dequant.cu", dequant(ty, h)));
        }
    }
    for h in [Half::F16, Half::BF16] {
        v.push(("gemm.cu", gemm(h)));
        v.push(("gemm.cu", convert_from_f32(h)));
    }
    for kv in [KvType::F32, KvType::F16] {
        v.push(("rope_kv.cu", rope_kv_write(kv)));
        v.push(("attn_decode.cu", attn_decode(kv)));
        v.push(("attn_prefill.cu", attn_prefill(kv)));
    }
    for hd in ATTN_PREFILL_TC_HEAD_DIMS {
        v.extend(attn_prefill_tc(KvType::F16, hd).map(|k| ("attn_prefill.cu", k)));
    }
    v.push(("attn_decode.cu", ATTN_DECODE_REDUCE.into()));
    v.push(("rmsnorm.cu", RMSNORM.into()));
    v.push(("rmsnorm.cu", RMSNORM_F16.into()));
    for k in [SWIGLU, SWIGLU_F16] {
        v.push(("elementwise.cu", k.into()));
    }
    v.push(("argmax.cu", LOGIT_BIAS.into()));
    v.push(("argmax.cu", ARGMAX.into()));
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consts::{MMQ_MAX_TOKENS, MMV_MAX_BATCH};
    use crate::sources::{source, SOURCES};

    #[test]
    fn ids_round_trip_and_unknown_ids_are_none() {
        for t in WeightType::ALL {
            assert_eq!(WeightType::from_ggml_id(t.ggml_id()), Some(t));
        }
        // Q8_1 and Q8_K are activation formats: no weight kernels.
        assert_eq!(WeightType::from_ggml_id(9), None);
        assert_eq!(WeightType::from_ggml_id(15), None);
        assert_eq!(WeightType::from_ggml_id(10), Some(WeightType::Q2_K));
        assert_eq!(WeightType::from_ggml_id(11), Some(WeightType::Q3_K));
        assert_eq!(WeightType::from_ggml_id(20), Some(WeightType::IQ4_NL));
        assert_eq!(WeightType::from_ggml_id(23), Some(WeightType::IQ4_XS));
    }

    #[test]
    fn the_cuda_type_macros_use_the_same_ids_and_suffixes() {
        let quant = crate::sources::HEADERS
            .iter()
            .find(|(n, _)| *n == "quant.cuh")
            .unwrap()
            .1;
        for t in WeightType::ALL {
            let macro_name = format!("W_{}", t.suffix().to_uppercase());
            assert!(
                quant.contains(&format!("#define {macro_name} {}\n", t.ggml_id())),
                "{macro_name}"
            );
            assert!(
                quant.contains(&format!("M({}, {macro_name})", t.suffix())),
                "{macro_name} in SPARKD_FOR_EACH_WTYPE"
            );
        }
    }

    #[test]
    fn mmv_variants_cover_every_batch_up_to_the_maximum() {
        assert_eq!(mmv_variant(0), Some(1));
        assert_eq!(mmv_variant(1), Some(1));
        assert_eq!(mmv_variant(3), Some(4));
        assert_eq!(mmv_variant(9), Some(16));
        assert_eq!(mmv_variant(MMV_MAX_BATCH), Some(MMV_MAX_BATCH));
        assert_eq!(mmv_variant(MMV_MAX_BATCH + 1), None);
        assert_eq!(*MMV_BATCHES.last().unwrap(), MMV_MAX_BATCH);
        let matvec = source("matvec.cu").unwrap();
        for b in MMV_BATCHES {
            assert!(matvec.contains(&format!("MMV_ENTRY(name, T, {b})")), "b{b}");
        }
    }

    #[test]
    fn mmq_variants_cover_every_width_up_to_the_maximum() {
        assert_eq!(mmq_variant(0), Some(8));
        assert_eq!(mmq_variant(5), Some(8));
        assert_eq!(mmq_variant(9), Some(16));
        assert_eq!(mmq_variant(33), Some(64));
        assert_eq!(mmq_variant(MMQ_MAX_TOKENS), Some(MMQ_MAX_TOKENS));
        assert_eq!(mmq_variant(MMQ_MAX_TOKENS + 1), None);
        assert_eq!(*MMQ_WIDTHS.last().unwrap(), MMQ_MAX_TOKENS);
        let mmq = source("mmq.cu").unwrap();
        for width in MMQ_WIDTHS {
            assert!(
                mmq.contains(&format!("MMQ_ENTRY(name, T, {width})")),
                "n{width}"
            );
        }
    }

    #[test]
    fn every_listed_kernel_belongs_to_an_embedded_module() {
        let all = all();
        let mut names: Vec<_> = all.iter().map(|(_, n)| n.clone()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len(), "names are unique");
        for (module, _) in &all {
            assert!(SOURCES.iter().any(|(m, _)| m == module), "{module}");
        }
        // Every module defines at least one listed kernel.
        for (m, _) in SOURCES {
            assert!(all.iter().any(|(module, _)| module == m), "{m}");
        }
    }

    #[test]
    fn row_lengths_must_be_whole_blocks_and_groups_of_eight() {
        assert!(WeightType::Q4_0.supports_cols(576));
        assert!(!WeightType::Q4_K.supports_cols(576));
        assert!(WeightType::Q4_K.supports_cols(4096));
        assert!(!WeightType::Q2_K.supports_cols(576));
        assert!(WeightType::Q3_K.supports_cols(768));
        assert!(WeightType::IQ4_NL.supports_cols(576));
        assert!(!WeightType::IQ4_XS.supports_cols(576));
        assert!(WeightType::IQ4_XS.supports_cols(768));
        assert!(!WeightType::F16.supports_cols(12));
        assert!(!WeightType::F16.supports_cols(0));
    }
}
