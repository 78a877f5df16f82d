//! Weight matrices packed at load into the lane-interleaved layout of `dot/packed.rs`,
//! held in an owned 64-byte-aligned buffer of the same size as their GGUF bytes.
//!
//! Packing pays once what the kernels would otherwise pay on every call (gathering 16
//! rows' bytes into vector lanes). A `PackedMatrix` is its own type, distinct from the
//! GGUF-layout `WeightMatrix`, so a packed matrix cannot reach a GGUF-layout kernel.

use super::dot::packed::{code_bytes, code_pos, d_offset, group_bytes, m_offset, row_code_bytes};
use super::dot::{self, PackedGroup, PACK_ROWS};
use super::matmul::WeightMatrix;
use super::KernelError;
use crate::quant::{self, GgmlType, QK};

/// One cache line; a `Vec` of these is a 64-byte-aligned byte buffer.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A Q4_0, Q4_1 or Q8_0 weight matrix in the packed layout: `rows.div_ceil(16)` groups,
/// the last padded with zero rows (whose outputs are zero and never written).
pub struct PackedMatrix {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    lines: Vec<Line>,
    len: usize,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedMatrix")
            .field("ty", &self.ty)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish()
    }
}

/// Whether the active kernel table wants `ty` weights packed at load.
pub fn should_pack(ty: GgmlType) -> bool {
    dot::best().pack_weights && dot::packed::supported(ty)
}

impl PackedMatrix {
    /// Packs a GGUF-layout matrix (`UnsupportedType` unless Q4_0, Q4_1 or Q8_0).
    pub fn pack(w: &WeightMatrix) -> Result<Self, KernelError> {
        let ty = w.ty;
        if !dot::packed::supported(ty) {
            return Err(KernelError::UnsupportedType(ty));
        }
        // Re-checks the sizes (the fields are public).
        let w = WeightMatrix::new(ty, w.rows, w.cols, w.data)?;
        let nb = w.cols / QK;
        let gb = group_bytes(ty, nb);
        let groups = w.rows.div_ceil(PACK_ROWS);
        let len = groups * gb;
        let mut m = PackedMatrix {
            ty,
            rows: w.rows,
            cols: w.cols,
            lines: vec![Line([0; 64]); len.div_ceil(64)],
            len,
        };
        let (rb, bb, qb) = (w.row_bytes(), ty.block_bytes(), row_code_bytes(ty));
        // The quants follow `d` (and `m` for Q4_1) in a GGUF block.
        let qs_off = bb - qb;
        let flip = if ty == GgmlType::Q8_0 { 0x80 } else { 0 };
        let (cb, doff, moff) = (code_bytes(ty), d_offset(ty, nb), m_offset(ty, nb));
        let data = m.bytes_mut();
        for (gi, group) in data.chunks_exact_mut(gb).enumerate() {
            for r in 0..PACK_ROWS.min(w.rows - gi * PACK_ROWS) {
                let row = &w.data[(gi * PACK_ROWS + r) * rb..][..rb];
                for (b, block) in row.chunks_exact(bb).enumerate() {
                    let s = 2 * (PACK_ROWS * b + r);
                    group[doff + s..doff + s + 2].copy_from_slice(&block[..2]);
                    if ty == GgmlType::Q4_1 {
                        group[moff + s..moff + s + 2].copy_from_slice(&block[2..4]);
                    }
                    for (k, &q) in block[qs_off..].iter().enumerate() {
                        group[b * cb + code_pos(r, k)] = q ^ flip;
                    }
                }
            }
        }
        Ok(m)
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Blocks per row.
    pub(crate) fn nb(&self) -> usize {
        self.cols / QK
    }

    pub(crate) fn n_groups(&self) -> usize {
        self.rows.div_ceil(PACK_ROWS)
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `Line` is `repr(C)` over `[u8; 64]` (no padding, any bit pattern
        // valid), and `len <= 64 * lines.len()` by construction.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<u8>(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, through the unique borrow of `lines`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<u8>(), self.len) }
    }

    /// Bytes of the packed data (the GGUF size, rounded up to whole groups of rows).
    pub fn byte_len(&self) -> usize {
        self.len
    }

    /// Group `g` (rows `16g..16g + 16`).
    pub(crate) fn group(&self, g: usize) -> PackedGroup<'_> {
        let gb = group_bytes(self.ty, self.nb());
        PackedGroup {
            data: &self.bytes()[g * gb..(g + 1) * gb],
            nb: self.nb(),
        }
    }

    /// Writes row `row` back in its GGUF layout into `out` (`row_bytes` long).
    ///
    /// # Panics
    /// If `row >= rows` or `out` has the wrong length.
    pub fn unpack_row(&self, row: usize, out: &mut [u8]) {
        let (ty, nb) = (self.ty, self.nb());
        assert!(row < self.rows, "row {row} out of {} rows", self.rows);
        assert_eq!(out.len(), nb * ty.block_bytes(), "GGUF row length");
        for (b, block) in out.chunks_exact_mut(ty.block_bytes()).enumerate() {
            self.unpack_block(row, b, block);
        }
    }

    /// Block `b` of row `row` in its GGUF layout.
    fn unpack_block(&self, row: usize, b: usize, block: &mut [u8]) {
        let (ty, nb) = (self.ty, self.nb());
        let g = self.group(row / PACK_ROWS);
        let r = row % PACK_ROWS;
        let s = 2 * (PACK_ROWS * b + r);
        let (doff, moff) = (d_offset(ty, nb), m_offset(ty, nb));
        block[..2].copy_from_slice(&g.data[doff + s..doff + s + 2]);
        if ty == GgmlType::Q4_1 {
            block[2..4].copy_from_slice(&g.data[moff + s..moff + s + 2]);
        }
        let flip = if ty == GgmlType::Q8_0 { 0x80 } else { 0 };
        let qs_off = ty.block_bytes() - row_code_bytes(ty);
        let cb = code_bytes(ty);
        for (k, q) in block[qs_off..].iter_mut().enumerate() {
            *q = g.data[b * cb + code_pos(r, k)] ^ flip;
        }
    }

    /// Decodes row `row` into `out` (an embedding lookup), exactly as `quant::dequantize`
    /// decodes the GGUF row.
    ///
    /// # Panics
    /// If `row >= rows` or `out.len() != cols`.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        assert!(row < self.rows, "row {row} out of {} rows", self.rows);
        assert_eq!(out.len(), self.cols, "output length");
        let mut block = [0u8; 34];
        let block = &mut block[..self.ty.block_bytes()];
        for (b, o) in out.chunks_exact_mut(QK).enumerate() {
            self.unpack_block(row, b, block);
            // The sizes match by construction.
            if let Err(e) = quant::dequantize(self.ty, block, o) {
                panic!("dequantize_row: {e}");
            }
        }
    }
}
