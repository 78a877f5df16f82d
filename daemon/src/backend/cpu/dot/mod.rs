//! Dot-product kernels: one table of function pointers per instruction set, chosen once
//! at run time.
//!
//! Every kernel computes a small tile of the output, `out[r][j] = dot(weight row r,
//! activation row j)` for up to `MR` weight rows and `NR` activation rows, so each weight
//! block is decoded once and used against several activation rows while it is in
//! registers. Every SIMD kernel has a scalar twin in `scalar.rs` with the same contract;
//! the tests compare them.
//!
//! Each output element is computed by the same sequence of operations whatever the tile
//! shape, so results do not depend on how the matmul splits work between threads.

use std::sync::OnceLock;

/// Expands to a `match` on a runtime tile shape `(rows, nr)` in `1..=MR x 1..=NR` that
/// invokes `$call!(M, N)` with literal constants, so SIMD kernels can be monomorphised
/// on the shape (accumulators then live in registers).
#[allow(unused_macros)]
macro_rules! tile_shapes {
    ($m:expr, $n:expr, $call:ident) => {
        match ($m, $n) {
            (1, 1) => $call!(1, 1),
            (1, 2) => $call!(1, 2),
            (1, 3) => $call!(1, 3),
            (1, 4) => $call!(1, 4),
            (2, 1) => $call!(2, 1),
            (2, 2) => $call!(2, 2),
            (2, 3) => $call!(2, 3),
            (2, 4) => $call!(2, 4),
            (3, 1) => $call!(3, 1),
            (3, 2) => $call!(3, 2),
            (3, 3) => $call!(3, 3),
            (3, 4) => $call!(3, 4),
            (4, 1) => $call!(4, 1),
            (4, 2) => $call!(4, 2),
            (4, 3) => $call!(4, 3),
            (4, 4) => $call!(4, 4),
            (m, n) => panic!("tile shape {m}x{n} outside 4x4"),
        }
    };
}

// Output tiles are indexed `[j][r]` like the register tiles (see below).
#[allow(clippy::needless_range_loop)]
pub(crate) mod packed;
pub(crate) mod scalar;

// Register tiles are indexed `[r][j]` in lockstep over several arrays; index loops over
// the const tile shape read better than zipped iterators and unroll the same.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)]
mod avx2;
// AVX-512 intrinsics need Rust 1.89 (the workspace `rust-version` should say so).
#[cfg(target_arch = "x86_64")]
#[clippy::msrv = "1.89"]
#[allow(clippy::needless_range_loop)]
mod avx512;
#[cfg(target_arch = "aarch64")]
#[allow(clippy::needless_range_loop)]
mod neon;

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests;
#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests_packed;

/// Most weight rows per tile.
pub(crate) const MR: usize = 4;
/// Most activation rows per tile.
pub(crate) const NR: usize = 4;
/// Weight rows per packed group: one per 32-bit lane of a 512-bit vector.
pub(crate) const PACK_ROWS: usize = 16;
/// Most activation rows per call of a packed kernel.
pub(crate) const PACK_ACTS: usize = 8;
// `tile_shapes!` spells out every shape.
const _: () = assert!(MR == 4 && NR == 4);

/// A tile's results: `out[r][j]` for weight row `r`, activation row `j`.
pub(crate) type Out = [[f32; NR]; MR];

/// Up to `MR` consecutive weight rows, in their file layout.
#[derive(Clone, Copy)]
pub(crate) struct WTile<'a> {
    /// Starts at the first row of the tile; holds at least `rows * row_bytes` bytes.
    pub data: &'a [u8],
    pub row_bytes: usize,
    /// 1..=MR.
    pub rows: usize,
    /// Elements per row.
    pub cols: usize,
}

impl<'a> WTile<'a> {
    pub fn row(&self, r: usize) -> &'a [u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Asserts the layout a SIMD kernel relies on before it reads through raw pointers.
    #[allow(dead_code)]
    pub fn check(&self, block_elems: usize, block_bytes: usize) {
        self.check_up_to(MR, block_elems, block_bytes)
    }

    /// As `check`, for up to `max_rows` rows.
    #[allow(dead_code)]
    pub fn check_up_to(&self, max_rows: usize, block_elems: usize, block_bytes: usize) {
        assert!(
            (1..=max_rows).contains(&self.rows),
            "tile of {} rows",
            self.rows
        );
        assert_eq!(self.cols % block_elems, 0, "ragged row");
        assert_eq!(
            self.row_bytes,
            self.cols / block_elems * block_bytes,
            "row size"
        );
        assert!(self.data.len() >= self.rows * self.row_bytes, "tile data");
    }
}

/// Asserts that activation rows `j0..j0 + nr` exist in buffers holding `per_row` values
/// per row each (the SIMD kernels read them through raw pointers).
#[allow(dead_code)]
fn check_rows(j0: usize, nr: usize, buffers: &[(usize, usize)]) {
    assert!((1..=NR).contains(&nr), "tile of {nr} activation rows");
    for &(len, per_row) in buffers {
        assert!(
            len >= (j0 + nr) * per_row,
            "activation rows {j0}+{nr} out of range"
        );
    }
}

/// Activations quantized in blocks of 32, for the legacy weight types (Q4_0 .. Q8_0):
/// `x ~= d * qs`, with `s = d * sum(qs)` per block for the offset terms.
#[derive(Clone, Copy)]
pub(crate) struct Q8Acts<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    pub s: &'a [f32],
    /// Elements per row (a multiple of 32).
    pub cols: usize,
}

impl<'a> Q8Acts<'a> {
    #[allow(dead_code)]
    pub fn check(&self, w: &WTile, j0: usize, nr: usize) {
        assert_eq!(self.cols, w.cols, "activation width");
        let nb = self.cols / 32;
        check_rows(
            j0,
            nr,
            &[
                (self.qs.len(), self.cols),
                (self.d.len(), nb),
                (self.s.len(), nb),
            ],
        );
    }
    pub fn qs(&self, j: usize) -> &'a [i8] {
        &self.qs[j * self.cols..(j + 1) * self.cols]
    }
    pub fn d(&self, j: usize) -> &'a [f32] {
        let nb = self.cols / 32;
        &self.d[j * nb..(j + 1) * nb]
    }
    pub fn s(&self, j: usize) -> &'a [f32] {
        let nb = self.cols / 32;
        &self.s[j * nb..(j + 1) * nb]
    }
}

/// Activations quantized in super-blocks of 256 for the K-quant weight types: one scale
/// per 256 and the sum of every 16 quants (`bsums`), as ggml's Q8_K.
#[derive(Clone, Copy)]
pub(crate) struct Q8KActs<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    pub bsums: &'a [i16],
    /// Elements per row (a multiple of 256).
    pub cols: usize,
}

impl<'a> Q8KActs<'a> {
    #[allow(dead_code)]
    pub fn check(&self, w: &WTile, j0: usize, nr: usize) {
        assert_eq!(self.cols, w.cols, "activation width");
        let (nb, ns) = (self.cols / 256, self.cols / 16);
        check_rows(
            j0,
            nr,
            &[
                (self.qs.len(), self.cols),
                (self.d.len(), nb),
                (self.bsums.len(), ns),
            ],
        );
    }
    pub fn qs(&self, j: usize) -> &'a [i8] {
        &self.qs[j * self.cols..(j + 1) * self.cols]
    }
    pub fn d(&self, j: usize) -> &'a [f32] {
        let nb = self.cols / 256;
        &self.d[j * nb..(j + 1) * nb]
    }
    pub fn bsums(&self, j: usize) -> &'a [i16] {
        let nb = self.cols / 16;
        &self.bsums[j * nb..(j + 1) * nb]
    }
}

/// Plain `f32` activations, for float weights.
#[derive(Clone, Copy)]
pub(crate) struct F32Acts<'a> {
    pub x: &'a [f32],
    pub cols: usize,
}

impl<'a> F32Acts<'a> {
    #[allow(dead_code)]
    pub fn check(&self, w: &WTile, j0: usize, nr: usize) {
        assert_eq!(self.cols, w.cols, "activation width");
        check_rows(j0, nr, &[(self.x.len(), self.cols)]);
    }
    pub fn row(&self, j: usize) -> &'a [f32] {
        &self.x[j * self.cols..(j + 1) * self.cols]
    }
}

/// A tile kernel for the legacy types: fills `out[r][j]` for `r < w.rows`, `j < nr`,
/// from activation rows `j0..j0 + nr`.
pub(crate) type LegacyTile = for<'w, 'a> fn(&WTile<'w>, &Q8Acts<'a>, usize, usize, &mut Out);
/// A tile kernel for the K-quant types (same contract).
pub(crate) type KTile = for<'w, 'a> fn(&WTile<'w>, &Q8KActs<'a>, usize, usize, &mut Out);
/// A tile kernel for the float types (same contract).
pub(crate) type FloatTile = for<'w, 'a> fn(&WTile<'w>, &F32Acts<'a>, usize, usize, &mut Out);

/// Quantizes whole 32-blocks: `x.len() == qs.len() == 32 * d.len() == 32 * s.len()`.
pub(crate) type QuantizeQ8 = fn(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]);
/// Quantizes whole 256-blocks: `x.len() == qs.len() == 256 * d.len() == 16 * bsums.len()`.
pub(crate) type QuantizeQ8K = fn(x: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]);

/// A group of `PACK_ROWS` weight rows in the packed layout (see `packed.rs`).
#[derive(Clone, Copy)]
pub(crate) struct PackedGroup<'a> {
    /// Exactly `packed::group_bytes(ty, nb)` bytes.
    pub data: &'a [u8],
    /// Blocks per row.
    pub nb: usize,
}

/// `out[j][r]`: activation row `j`, weight row `r` of a packed group.
pub(crate) type PackedOut = [[f32; PACK_ROWS]; PACK_ACTS];

/// A kernel over one packed group: fills `out[j][r]` for every row of the group and
/// activation rows `j0..j0 + nr` (`1..=PACK_ACTS`).
pub(crate) type PackedDot =
    for<'w, 'a> fn(&PackedGroup<'w>, &Q8Acts<'a>, usize, usize, &mut PackedOut);

/// One instruction set's kernels.
#[derive(Clone, Copy)]
pub(crate) struct Kernels {
    pub name: &'static str,
    pub quantize_q8: QuantizeQ8,
    pub quantize_q8k: QuantizeQ8K,
    pub q4_0: LegacyTile,
    pub q4_1: LegacyTile,
    pub q5_0: LegacyTile,
    pub q5_1: LegacyTile,
    pub q8_0: LegacyTile,
    pub iq4_nl: LegacyTile,
    pub q2_k: KTile,
    pub q3_k: KTile,
    pub q4_k: KTile,
    pub q5_k: KTile,
    pub q6_k: KTile,
    pub iq4_xs: KTile,
    pub f32: FloatTile,
    pub f16: FloatTile,
    pub bf16: FloatTile,
    /// Kernels over packed Q4_0, Q4_1 and Q8_0 weights (every table has them: the
    /// scalar twins where there is no SIMD version).
    pub packed_q4_0: PackedDot,
    pub packed_q4_1: PackedDot,
    pub packed_q8_0: PackedDot,
    /// Whether the model should pack its Q4_0 / Q4_1 / Q8_0 weights at load for this
    /// table (only where the packed kernels beat the GGUF-layout tiles at every batch
    /// size).
    pub pack_weights: bool,
}

/// Every kernel table this CPU can run, plainest first (the scalar one is always there).
pub(crate) fn available() -> Vec<Kernels> {
    let mut v = vec![scalar::KERNELS];
    #[cfg(target_arch = "x86_64")]
    {
        v.extend(avx2::kernels());
        v.extend(avx512::kernels());
    }
    #[cfg(target_arch = "aarch64")]
    {
        v.extend(neon::kernels());
        v.extend(neon::kernels_dotprod());
    }
    v
}

/// The fastest kernel table for this CPU, detected once. `SPARKD_KERNELS=<name>` picks
/// another available one (for benchmarks and bisecting a numerical difference).
pub(crate) fn best() -> &'static Kernels {
    static BEST: OnceLock<Kernels> = OnceLock::new();
    BEST.get_or_init(|| {
        let mut all = available();
        let forced = std::env::var("SPARKD_KERNELS").ok();
        if let Some(name) = forced.as_deref() {
            if let Some(k) = all.iter().find(|k| k.name == name) {
                return *k;
            }
        }
        all.pop().unwrap_or(scalar::KERNELS)
    })
}
