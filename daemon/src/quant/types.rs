//! The tensor element types sparkd reads from GGUF files, and their block layouts.
//!
//! Layouts follow ggml exactly (they are what GGUF files contain). Every block struct is
//! `#[repr(C)]` with a compile-time size check, so a slice of file bytes can be viewed as
//! a slice of blocks without copying.

use half::f16;

/// ggml's type ids, as stored in GGUF tensor infos.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ4_NL,
    IQ4_XS,
    BF16,
}

impl GgmlType {
    /// Every type sparkd reads, in the order of ggml's ids.
    pub const ALL: [GgmlType; 17] = [
        Self::F32,
        Self::F16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q8_1,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::Q8_K,
        Self::IQ4_NL,
        Self::IQ4_XS,
        Self::BF16,
    ];

    /// Whether a model's matrices may be stored as this type. Q8_1 and Q8_K are the
    /// activation formats the integer kernels quantize into: no kernel takes them as
    /// weights.
    pub fn is_weight_type(self) -> bool {
        !matches!(self, Self::Q8_1 | Self::Q8_K)
    }

    /// The weight type of this name (`Q4_K`, `q4_k`, `bf16`, ...), if there is one.
    pub fn weight_type_named(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.is_weight_type() && t.name().eq_ignore_ascii_case(name))
    }

    /// Maps a GGUF type id; `None` for types sparkd does not support.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            9 => Self::Q8_1,
            10 => Self::Q2_K,
            11 => Self::Q3_K,
            12 => Self::Q4_K,
            13 => Self::Q5_K,
            14 => Self::Q6_K,
            15 => Self::Q8_K,
            20 => Self::IQ4_NL,
            23 => Self::IQ4_XS,
            30 => Self::BF16,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q8_1 => 9,
            Self::Q2_K => 10,
            Self::Q3_K => 11,
            Self::Q4_K => 12,
            Self::Q5_K => 13,
            Self::Q6_K => 14,
            Self::Q8_K => 15,
            Self::IQ4_NL => 20,
            Self::IQ4_XS => 23,
            Self::BF16 => 30,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q8_1 => "Q8_1",
            Self::Q2_K => "Q2_K",
            Self::Q3_K => "Q3_K",
            Self::Q4_K => "Q4_K",
            Self::Q5_K => "Q5_K",
            Self::Q6_K => "Q6_K",
            Self::Q8_K => "Q8_K",
            Self::IQ4_NL => "IQ4_NL",
            Self::IQ4_XS => "IQ4_XS",
            Self::BF16 => "BF16",
        }
    }

    /// Elements per block.
    pub fn block_elems(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0
            | Self::Q4_1
            | Self::Q5_0
            | Self::Q5_1
            | Self::Q8_0
            | Self::Q8_1
            | Self::IQ4_NL => QK,
            Self::Q2_K
            | Self::Q3_K
            | Self::Q4_K
            | Self::Q5_K
            | Self::Q6_K
            | Self::Q8_K
            | Self::IQ4_XS => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => std::mem::size_of::<BlockQ4_0>(),
            Self::Q4_1 => std::mem::size_of::<BlockQ4_1>(),
            Self::Q5_0 => std::mem::size_of::<BlockQ5_0>(),
            Self::Q5_1 => std::mem::size_of::<BlockQ5_1>(),
            Self::Q8_0 => std::mem::size_of::<BlockQ8_0>(),
            Self::Q8_1 => std::mem::size_of::<BlockQ8_1>(),
            Self::Q2_K => std::mem::size_of::<BlockQ2K>(),
            Self::Q3_K => std::mem::size_of::<BlockQ3K>(),
            Self::Q4_K => std::mem::size_of::<BlockQ4K>(),
            Self::Q5_K => std::mem::size_of::<BlockQ5K>(),
            Self::Q6_K => std::mem::size_of::<BlockQ6K>(),
            Self::Q8_K => std::mem::size_of::<BlockQ8K>(),
            Self::IQ4_NL => std::mem::size_of::<BlockIQ4NL>(),
            Self::IQ4_XS => std::mem::size_of::<BlockIQ4XS>(),
        }
    }

    /// Bytes of `n_elems` elements, or `None` when `n_elems` is not a whole number of
    /// blocks or the size overflows.
    pub fn bytes_for(self, n_elems: u64) -> Option<u64> {
        let per = self.block_elems() as u64;
        if n_elems % per != 0 {
            return None;
        }
        (n_elems / per).checked_mul(self.block_bytes() as u64)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Elements in a legacy (non-K) block.
pub const QK: usize = 32;
/// Elements in a K-quant super-block.
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales and mins in Q4_K and Q5_K.
pub const K_SCALE_SIZE: usize = 12;

/// 4-bit, x = (q - 8) * d. Low nibbles are elements 0..16, high nibbles 16..32.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK / 2],
}

/// 4-bit with offset, x = q * d + m.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK / 2],
}

/// 5-bit, x = (q - 16) * d; bit 4 of element j is bit j of `qh`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// 5-bit with offset, x = q * d + m.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// 8-bit, x = q * d.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}

/// 8-bit with the block sum, `s = d * sum(qs)`: the activation format that pairs with
/// the offset types (Q4_1, Q5_1), whose `m` term needs the sum of the activations.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; QK],
}

/// 2-bit K-quant: 16 sub-blocks of 16, `x = d * sc * q - dmin * m` with 4-bit `sc` (low
/// nibble of `scales[j]`) and `m` (high nibble). Element `i` of each 128-half is bits
/// `2 * ((i % 128) / 32)` of byte `32 * half + i % 32` of `qs`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: f16,
    pub dmin: f16,
}

/// 3-bit K-quant: 16 sub-blocks of 16, `x = d * (sc - 32) * (q - 4)` with 6-bit `sc`
/// packed in `scales`; the low two bits of `q` sit as in Q2_K, the third bit of element
/// `i` is bit `i / 32` of `hmask[i % 32]`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; K_SCALE_SIZE],
    pub d: f16,
}

/// 4-bit K-quant: 8 sub-blocks of 32 with 6-bit scales and mins packed in `scales`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}

/// 5-bit K-quant: as Q4_K plus one high bit per element in `qh`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// 6-bit K-quant: 16 sub-blocks of 16 with 8-bit scales.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}

/// The 16 levels of the non-linear 4-bit types (ggml's `kvalues_iq4nl`): denser near
/// zero, where most weights are.
pub const IQ4NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Non-linear 4-bit: `x = d * IQ4NL_VALUES[q]`; nibbles laid out as Q4_0's.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockIQ4NL {
    pub d: f16,
    pub qs: [u8; QK / 2],
}

/// Non-linear 4-bit super-block: 8 sub-blocks of 32 as IQ4_NL's, each with a 6-bit scale
/// (`x = d * (ls - 32) * IQ4NL_VALUES[q]`): low 4 bits in the nibbles of `scales_l`, high
/// 2 bits in `scales_h`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockIQ4XS {
    pub d: f16,
    pub scales_h: u16,
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}

/// 8-bit super-block with per-16 sums: the activation format for K-quant dot products.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);
const _: () = assert!(std::mem::size_of::<BlockIQ4NL>() == 18);
const _: () = assert!(std::mem::size_of::<BlockIQ4XS>() == 136);
