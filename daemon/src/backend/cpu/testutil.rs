//! Random weights and activations for the kernel and matmul tests.

use half::{bf16, f16};

use crate::quant::{self, GgmlType};

/// A fixed-seed generator (PCG-style LCG): tests are reproducible.
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let x = self.0;
        (x ^ (x >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9) ^ (x >> 32)
    }

    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u32 << 23) as f32) - 1.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Activation-like values: per-32 magnitudes over three decades, a few outliers.
pub(crate) fn random_acts(len: usize, rng: &mut Rng) -> Vec<f32> {
    let mut x = vec![0.0f32; len];
    for (b, block) in x.chunks_mut(32).enumerate() {
        let scale = 10f32.powf(rng.f32() * 1.5) * if b % 7 == 3 { 0.0 } else { 1.0 };
        for v in block.iter_mut() {
            *v = rng.f32() * scale;
        }
        if b % 5 == 1 {
            block[rng.below(block.len())] *= 40.0;
        }
    }
    x
}

/// Offsets of the `f16` fields within one block, which random bytes must not fill with
/// NaNs or infinities.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => {
            &[0]
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        _ => &[],
    }
}

/// Weights of `ty`: for the quantized types, random bytes (every bit pattern of the
/// quants, including ones the reference quantizers never produce) with sane scales;
/// every third row comes from the reference quantizer instead.
pub(crate) fn random_weights(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let row_bytes = ty.bytes_for(cols as u64).expect("whole blocks") as usize;
    let mut data = vec![0u8; rows * row_bytes];
    for (r, row) in data.chunks_mut(row_bytes).enumerate() {
        match ty {
            GgmlType::F32 => {
                for (c, v) in row.chunks_mut(4).enumerate() {
                    v.copy_from_slice(&(rng.f32() * (1.0 + (c % 3) as f32)).to_le_bytes());
                }
            }
            GgmlType::F16 => {
                for v in row.chunks_mut(2) {
                    v.copy_from_slice(&f16::from_f32(rng.f32() * 2.0).to_le_bytes());
                }
            }
            GgmlType::BF16 => {
                for v in row.chunks_mut(2) {
                    v.copy_from_slice(&bf16::from_f32(rng.f32() * 2.0).to_le_bytes());
                }
            }
            _ if r % 3 == 2 => {
                let vals: Vec<f32> = (0..cols).map(|_| rng.f32() * 0.5).collect();
                quant::quantize(ty, &vals, row).expect("sizes match");
            }
            _ => {
                for b in row.iter_mut() {
                    *b = rng.next_u64() as u8;
                }
                for block in row.chunks_mut(ty.block_bytes()) {
                    for &off in f16_fields(ty) {
                        let v = f16::from_f32(rng.f32() * 0.02);
                        block[off..off + 2].copy_from_slice(&v.to_le_bytes());
                    }
                }
            }
        }
    }
    data
}

/// Dequantizes a whole matrix.
pub(crate) fn dequantize_all(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; rows * cols];
    quant::dequantize(ty, data, &mut out).expect("sizes match");
    out
}

/// The most 8-bit activation quantization can change `dot(w, x)`: half a step
/// (`amax / 254` of each block of `block` elements) per element, times `|w|`.
pub(crate) fn act_quant_bound(w: &[f32], x: &[f32], block: usize) -> f32 {
    let mut bound = 0.0f64;
    for (wb, xb) in w.chunks(block).zip(x.chunks(block)) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
        let wsum: f64 = wb.iter().map(|v| v.abs() as f64).sum();
        bound += amax / 254.0 * wsum * 1.001;
    }
    bound as f32
}
