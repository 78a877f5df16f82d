//! Small f32 vector operations of the forward pass (norms, rotary embeddings, gating).
//! Written as plain loops the compiler vectorises; the heavy lifting is in the matrix
//! kernels of the CPU backend.

use super::config::RopeStyle;

/// `out = x / rms(x) * w`, in f64 accumulation-free f32 like llama.cpp (sum in f32 is
/// what it does too, so greedy outputs stay comparable).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let sum: f32 = x.iter().map(|v| v * v).sum();
    let scale = 1.0 / (sum / x.len() as f32 + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// In-place RMSNorm of a vector (Qwen3's per-head q/k norm).
pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let sum: f32 = x.iter().map(|v| v * v).sum();
    let scale = 1.0 / (sum / x.len() as f32 + eps).sqrt();
    for (v, &g) in x.iter_mut().zip(w) {
        *v *= scale * g;
    }
}

/// Rotates the first `2 * inv_freq.len()` dimensions of one head at position `pos`.
pub fn rope(head: &mut [f32], pos: f32, inv_freq: &[f32], style: RopeStyle) {
    let mut sc = Vec::with_capacity(inv_freq.len());
    rope_angles(pos, inv_freq, 1.0, &mut sc);
    rope_with(head, &sc, style);
}

/// Appends `(sin, cos)` of `pos * f` for each frequency, times `magnitude` (YaRN's
/// attention factor; 1 elsewhere): the rotation of every head and layer at that
/// position, computed once.
pub fn rope_angles(pos: f32, inv_freq: &[f32], magnitude: f32, out: &mut Vec<(f32, f32)>) {
    out.extend(inv_freq.iter().map(|&f| {
        let (s, c) = (pos * f).sin_cos();
        (s * magnitude, c * magnitude)
    }));
}

/// `rope` with the angles from `rope_angles`.
pub fn rope_with(head: &mut [f32], sin_cos: &[(f32, f32)], style: RopeStyle) {
    let half = sin_cos.len();
    for (i, &(sin, cos)) in sin_cos.iter().enumerate() {
        let (a, b) = match style {
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
            RopeStyle::Neox => (i, i + half),
        };
        let (x0, x1) = (head[a], head[b]);
        head[a] = x0 * cos - x1 * sin;
        head[b] = x0 * sin + x1 * cos;
    }
}

/// `gate = silu(gate) * up`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

pub fn add_assign(acc: &mut [f32], x: &[f32]) {
    for (a, &b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}

#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent partial sums let the compiler keep several vector
    // accumulators in flight instead of one serial chain.
    let mut acc = [0.0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in chunks * 8..a.len() {
        s += a[i] * b[i];
    }
    s
}

/// `y += a * x`.
#[inline]
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv += a * xv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_normalises_to_unit_rms() {
        let x = [3.0, -4.0, 0.0, 5.0];
        let mut out = [0.0; 4];
        rms_norm(&x, &[1.0; 4], 0.0, &mut out);
        let rms = (out.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
        assert!((out[1] / out[0] - (-4.0 / 3.0)).abs() < 1e-6);
    }

    #[test]
    fn rope_preserves_norm_and_is_identity_at_zero() {
        let inv = [1.0, 0.1];
        for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
            let orig = [1.0, 2.0, 3.0, 4.0, 7.0];
            let mut h = orig;
            rope(&mut h, 0.0, &inv, style);
            assert_eq!(h, orig);
            rope(&mut h, 5.0, &inv, style);
            let n0: f32 = orig[..4].iter().map(|v| v * v).sum();
            let n1: f32 = h[..4].iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-4);
            assert_eq!(h[4], 7.0, "dimensions past the rotated ones pass through");
        }
        // Interleaved rotates (0,1) by pos * inv[0].
        let mut h = [1.0, 0.0, 0.0, 0.0];
        rope(
            &mut h,
            std::f32::consts::FRAC_PI_2,
            &inv,
            RopeStyle::Interleaved,
        );
        assert!(h[0].abs() < 1e-6 && (h[1] - 1.0).abs() < 1e-6);
        // Neox rotates (0,2) by pos * inv[0].
        let mut h = [1.0, 0.0, 0.0, 0.0];
        rope(&mut h, std::f32::consts::FRAC_PI_2, &inv, RopeStyle::Neox);
        assert!(h[0].abs() < 1e-6 && (h[2] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn dot_matches_naive_sum_for_odd_lengths() {
        let a: Vec<f32> = (0..19).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..19).map(|i| 1.0 - i as f32 * 0.1).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - naive).abs() < 1e-4);
    }
}
