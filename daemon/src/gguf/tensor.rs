//! Tensor descriptors from a GGUF header.

use crate::quant::GgmlType;

/// Most dimensions a GGUF tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// One tensor's name, shape, type and where its bytes are.
///
/// The reader only hands out infos whose byte range it has checked against the file,
/// whose dims are all at least 1, and whose row length (`dims[0]`) is a whole number of
/// blocks of `ty`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the contiguous (column) dimension.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Absolute offset of the first byte in the file.
    pub offset: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elems(&self) -> u64 {
        // Checked at parse time not to overflow; saturate for hand-built infos.
        self.dims.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Elements per row (`dims[0]`).
    pub fn cols(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows: the product of `dims[1..]` (1 for a vector).
    pub fn rows(&self) -> u64 {
        self.dims
            .iter()
            .skip(1)
            .fold(1u64, |acc, &d| acc.saturating_mul(d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_helpers() {
        let t = TensorInfo {
            name: "w".into(),
            dims: vec![64, 3, 2],
            ty: GgmlType::F32,
            offset: 0,
            n_bytes: 64 * 6 * 4,
        };
        assert_eq!(t.cols(), 64);
        assert_eq!(t.rows(), 6);
        assert_eq!(t.n_elems(), 384);
        let v = TensorInfo {
            dims: vec![10],
            ..t
        };
        assert_eq!((v.cols(), v.rows(), v.n_elems()), (10, 1, 10));
    }
}
