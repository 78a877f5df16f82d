//! How a model scales its rotary position embeddings (linear, Llama 3 frequency
//! factors, YaRN) and its Llama 4 style attention temperature, read from GGUF metadata
//! and turned into what the forward passes use: one angle per position for each rotated
//! pair, one magnitude for the rotations, and one factor for the queries per position.
//!
//! The formulas are llama.cpp's (ggml's `rope_yarn` and the attention factor that
//! `llama_context` derives), which follow Hugging Face's `_compute_yarn_parameters`.

use crate::gguf::Metadata;

use super::config::ConfigError;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions are divided by `factor`.
    Linear {
        factor: f32,
    },
    Yarn(Yarn),
}

/// YaRN ("Yet another RoPE extensioN"): low-frequency pairs are interpolated by the
/// context extension factor, high-frequency ones keep their trained frequencies, a ramp
/// between, and every rotation is scaled by one magnitude.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    /// How many times the trained context the model is stretched to.
    pub factor: f32,
    /// The context the model was trained at before the extension.
    pub original_context: usize,
    /// Pairs that turn more than this many times over the original context keep their
    /// frequency...
    pub beta_fast: f32,
    /// ...and pairs that turn fewer than this many times are fully interpolated.
    pub beta_slow: f32,
    /// Hugging Face's `mscale_all_dim` (`rope.scaling.yarn_log_multiplier`); 0 when the
    /// file has none.
    pub log_multiplier: f32,
    /// `rope.scaling.attn_factor`: a further factor on the magnitude (1 when absent).
    pub attn_factor: f32,
}

/// Llama 4 style attention temperature (`attention.temperature_scale`, Ministral 3):
/// past every `floor` positions, the queries grow by `1 + scale * ln(⌊pos / floor⌋ + 1)`,
/// which sharpens attention over long contexts and leaves the first `floor` positions
/// as they were.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnTemperature {
    pub scale: f32,
    pub floor: usize,
}

impl AttnTemperature {
    /// The factor on the query of the token at `pos`.
    pub fn factor(&self, pos: usize) -> f32 {
        let steps = (pos / self.floor) as f64;
        ((steps + 1.0).ln() * self.scale as f64 + 1.0) as f32
    }
}

fn yarn_mscale(factor: f32, mscale: f32) -> f32 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * mscale * factor.ln() + 1.0
    }
}

impl Yarn {
    /// The magnitude every rotation is scaled by (Hugging Face's `attention_factor`):
    /// q·k grows by its square.
    pub fn magnitude(&self) -> f32 {
        let m = if self.log_multiplier != 0.0 {
            // Hugging Face's `mscale` is 1 in every model llama.cpp reads this way.
            yarn_mscale(self.factor, 1.0) / yarn_mscale(self.factor, self.log_multiplier)
        } else {
            yarn_mscale(self.factor, 1.0)
        };
        m * self.attn_factor
    }

    /// The pair index at which a pair turns `turns` times over the original context
    /// (ggml's `ggml_rope_yarn_corr_dim`).
    fn pair_turning(&self, rope_dim: usize, base: f32, turns: f32) -> f32 {
        let n = rope_dim as f32;
        n * (self.original_context as f32 / (turns * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * base.ln())
    }

    /// For pair `pair` of `rope_dim / 2`, what its trained frequency is multiplied by:
    /// 1 for the fast pairs, `1 / factor` for the slow ones, a linear ramp between.
    pub fn frequency_scale(&self, pair: usize, rope_dim: usize, base: f32) -> f32 {
        let low = self
            .pair_turning(rope_dim, base, self.beta_fast)
            .floor()
            .max(0.0);
        let high = self
            .pair_turning(rope_dim, base, self.beta_slow)
            .ceil()
            .min(rope_dim as f32 - 1.0);
        let y = (pair as f32 - low) / (high - low).max(0.001);
        let extrapolate = 1.0 - y.clamp(0.0, 1.0);
        let interpolated = 1.0 / self.factor;
        interpolated * (1.0 - extrapolate) + extrapolate
    }
}

impl RopeScaling {
    /// Reads `{arch}.rope.scaling.*`; `context_length` stands in for a missing original
    /// context, as in llama.cpp.
    pub fn from_metadata(
        meta: &Metadata,
        arch: &str,
        context_length: usize,
    ) -> Result<Self, ConfigError> {
        let key = |k: &str| format!("{arch}.rope.scaling.{k}");
        let factor = meta.opt_f32(&key("factor"))?;
        let positive = |name: &str, v: f32| {
            if v.is_finite() && v > 0.0 {
                Ok(v)
            } else {
                Err(ConfigError::Invalid(format!(
                    "rope.scaling.{name} {v} must be positive"
                )))
            }
        };
        match meta.opt_str(&key("type"))? {
            // Llama 3 style scaling arrives as a `rope_freqs.weight` tensor of per-pair
            // frequency factors (see `weights.rs`).
            Some("none") | Some("llama3") => Ok(RopeScaling::None),
            // llama.cpp takes a file without a type as linear, with the factor under
            // either key, and a factor of 0 as none.
            Some("linear") | None => {
                let factor = match factor {
                    Some(f) => Some(f),
                    None => meta.opt_f32(&format!("{arch}.rope.scale_linear"))?,
                };
                Ok(match factor {
                    None => RopeScaling::None,
                    Some(f) if f == 0.0 || f == 1.0 => RopeScaling::None,
                    Some(f) => RopeScaling::Linear {
                        factor: positive("factor", f)?,
                    },
                })
            }
            Some("yarn") => {
                let original_context = meta
                    .opt_u32(&key("original_context_length"))?
                    .map_or(context_length, |v| v as usize);
                if original_context == 0 {
                    return Err(ConfigError::Invalid(
                        "rope.scaling.original_context_length must be positive".into(),
                    ));
                }
                let yarn = Yarn {
                    factor: positive("factor", factor.unwrap_or(1.0))?,
                    original_context,
                    beta_fast: positive(
                        "yarn_beta_fast",
                        meta.opt_f32(&key("yarn_beta_fast"))?.unwrap_or(32.0),
                    )?,
                    beta_slow: positive(
                        "yarn_beta_slow",
                        meta.opt_f32(&key("yarn_beta_slow"))?.unwrap_or(1.0),
                    )?,
                    log_multiplier: meta.opt_f32(&key("yarn_log_multiplier"))?.unwrap_or(0.0),
                    attn_factor: positive(
                        "attn_factor",
                        meta.opt_f32(&key("attn_factor"))?.unwrap_or(1.0),
                    )?,
                };
                if !yarn.log_multiplier.is_finite() || !yarn.magnitude().is_finite() {
                    return Err(ConfigError::Invalid(format!(
                        "rope.scaling.yarn_log_multiplier {} gives no finite magnitude",
                        yarn.log_multiplier
                    )));
                }
                Ok(RopeScaling::Yarn(yarn))
            }
            Some(other) => Err(ConfigError::Invalid(format!(
                "unsupported rope.scaling.type `{other}`"
            ))),
        }
    }

    /// Positions are divided by this before they turn the pairs.
    pub fn position_divisor(&self) -> f32 {
        match self {
            RopeScaling::Linear { factor } => *factor,
            RopeScaling::None | RopeScaling::Yarn(_) => 1.0,
        }
    }

    /// The factor on every rotation's sine and cosine.
    pub fn magnitude(&self) -> f32 {
        match self {
            RopeScaling::Yarn(y) => y.magnitude(),
            RopeScaling::None | RopeScaling::Linear { .. } => 1.0,
        }
    }

    /// Per rotated pair, the angle it turns by per (divided) position: the base
    /// frequencies, divided by Llama 3 style `factors` where the file has them, and
    /// YaRN's interpolation folded in.
    pub fn inverse_frequencies(
        &self,
        rope_dim: usize,
        base: f32,
        factors: Option<&[f32]>,
    ) -> Vec<f32> {
        (0..rope_dim / 2)
            .map(|i| {
                let mut inv = base.powf(-2.0 * i as f32 / rope_dim as f32);
                if let Some(f) = factors {
                    inv /= f[i];
                }
                if let RopeScaling::Yarn(y) = self {
                    inv *= y.frequency_scale(i, rope_dim, base);
                }
                inv
            })
            .collect()
    }
}

impl AttnTemperature {
    /// Reads `{arch}.attention.temperature_scale`; the temperature steps every
    /// original context (YaRN's, else the trained one), as llama.cpp does for Ministral 3.
    pub fn from_metadata(
        meta: &Metadata,
        arch: &str,
        scaling: &RopeScaling,
        context_length: usize,
    ) -> Result<Option<Self>, ConfigError> {
        let Some(scale) = meta.opt_f32(&format!("{arch}.attention.temperature_scale"))? else {
            return Ok(None);
        };
        if !scale.is_finite() {
            return Err(ConfigError::Invalid(format!(
                "attention.temperature_scale {scale} is not finite"
            )));
        }
        if scale == 0.0 {
            return Ok(None);
        }
        let floor = match scaling {
            RopeScaling::Yarn(y) => y.original_context,
            _ => context_length,
        };
        Ok(Some(AttnTemperature { scale, floor }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufFile, GgufWriter, Value};

    /// ggml's CPU rope cache (`ggml_rope_cache_init` with `rope_yarn`), transliterated:
    /// theta per pair as ggml walks it, and llama_context's attention factor, which ggml
    /// multiplies by `1 + 0.1 ln(factor)` when YaRN's ext_factor is on.
    fn ggml_yarn(y: &Yarn, rope_dim: usize, base: f32, pos: f32) -> Vec<(f32, f32)> {
        let corr_dim = |n_rot: f32| {
            rope_dim as f32
                * (y.original_context as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        let start = corr_dim(y.beta_fast).floor();
        let end = corr_dim(y.beta_slow).ceil();
        let corr = [start.max(0.0), end.min(rope_dim as f32 - 1.0)];
        let freq_scale = 1.0 / y.factor;
        let get_mscale = |scale: f32, m: f32| {
            if scale <= 1.0 {
                1.0
            } else {
                0.1 * m * scale.ln() + 1.0
            }
        };
        let mut attn_factor = if y.log_multiplier != 0.0 {
            get_mscale(y.factor, 1.0) / get_mscale(y.factor, y.log_multiplier)
        } else {
            get_mscale(y.factor, 1.0)
        };
        attn_factor *= 1.0 / (1.0 + 0.1 * y.factor.ln());
        attn_factor *= y.attn_factor;
        let theta_scale = base.powf(-2.0 / rope_dim as f32);
        let mut theta = pos;
        let mut out = Vec::new();
        for i0 in (0..rope_dim).step_by(2) {
            let theta_extrap = theta;
            let theta_interp = freq_scale * theta_extrap;
            let ramp = {
                let v = ((i0 / 2) as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
                1.0 - v.clamp(0.0, 1.0)
            };
            let t = theta_interp * (1.0 - ramp) + theta_extrap * ramp;
            let mscale = attn_factor * (1.0 + 0.1 * (1.0 / freq_scale).ln());
            out.push((t.sin() * mscale, t.cos() * mscale));
            theta *= theta_scale;
        }
        out
    }

    fn ministral3() -> Yarn {
        Yarn {
            factor: 16.0,
            original_context: 16384,
            beta_fast: 32.0,
            beta_slow: 1.0,
            log_multiplier: 1.0,
            attn_factor: 1.0,
        }
    }

    #[test]
    fn yarn_matches_ggml_at_many_positions() {
        let qwen = Yarn {
            factor: 4.0,
            original_context: 32768,
            log_multiplier: 0.0,
            ..ministral3()
        };
        for (y, rope_dim, base) in [
            (ministral3(), 128, 1_000_000_000.0f32),
            (qwen, 128, 1_000_000.0),
            (ministral3(), 64, 10_000.0),
        ] {
            let scaling = RopeScaling::Yarn(y);
            let inv = scaling.inverse_frequencies(rope_dim, base, None);
            for pos in [0.0f32, 1.0, 17.0, 5000.0, 100_000.0] {
                let want = ggml_yarn(&y, rope_dim, base, pos);
                for (i, (&f, &(ws, wc))) in inv.iter().zip(&want).enumerate() {
                    let (s, c) = (pos * f).sin_cos();
                    let m = scaling.magnitude();
                    // Angles of 1e5 radians carry f32 rounding of ~1e-2 in either order
                    // of the products; compare there in angle terms.
                    let tol = 1e-5 + pos * 1e-7 * 4.0;
                    assert!(
                        (s * m - ws).abs() < tol && (c * m - wc).abs() < tol,
                        "pair {i} at {pos}: ({}, {}) vs ggml ({ws}, {wc})",
                        s * m,
                        c * m
                    );
                }
            }
        }
    }

    #[test]
    fn yarn_keeps_fast_pairs_and_interpolates_slow_ones() {
        let y = ministral3();
        let (dim, base) = (128, 1_000_000_000.0);
        assert_eq!(y.frequency_scale(0, dim, base), 1.0);
        assert!((y.frequency_scale(63, dim, base) - 1.0 / 16.0).abs() < 1e-7);
        let mid: Vec<f32> = (0..64).map(|i| y.frequency_scale(i, dim, base)).collect();
        assert!(mid.windows(2).all(|w| w[1] <= w[0]), "a monotone ramp");
        // mscale_all_dim = 1 cancels the magnitude; without it, 1 + 0.1 ln(factor).
        assert!((y.magnitude() - 1.0).abs() < 1e-7);
        let plain = Yarn {
            log_multiplier: 0.0,
            ..y
        };
        assert!((plain.magnitude() - (1.0 + 0.1 * 16f32.ln())).abs() < 1e-6);
    }

    #[test]
    fn temperature_steps_every_floor_positions() {
        let t = AttnTemperature {
            scale: 0.1,
            floor: 16384,
        };
        assert_eq!(t.factor(0), 1.0);
        assert_eq!(t.factor(16383), 1.0);
        assert!((t.factor(16384) - (1.0 + 0.1 * 2f32.ln())).abs() < 1e-7);
        assert!((t.factor(3 * 16384 + 5) - (1.0 + 0.1 * 4f32.ln())).abs() < 1e-7);
    }

    fn meta(entries: &[(&str, Value)]) -> GgufFile {
        let mut w = GgufWriter::new();
        for (k, v) in entries {
            w.add(k.to_string(), v.clone());
        }
        GgufFile::from_bytes(w.to_bytes()).unwrap()
    }

    #[test]
    fn reads_ministral3_metadata_with_defaults() {
        let m = meta(&[
            ("mistral3.rope.scaling.type", Value::String("yarn".into())),
            ("mistral3.rope.scaling.factor", Value::F32(16.0)),
            (
                "mistral3.rope.scaling.original_context_length",
                Value::U32(16384),
            ),
            ("mistral3.rope.scaling.yarn_log_multiplier", Value::F32(1.0)),
            ("mistral3.attention.temperature_scale", Value::F32(0.1)),
        ]);
        let s = RopeScaling::from_metadata(m.metadata(), "mistral3", 262_144).unwrap();
        assert_eq!(s, RopeScaling::Yarn(ministral3()));
        let t = AttnTemperature::from_metadata(m.metadata(), "mistral3", &s, 262_144).unwrap();
        assert_eq!(
            t,
            Some(AttnTemperature {
                scale: 0.1,
                floor: 16384
            })
        );
        // Without an original context, the trained one stands in.
        let m = meta(&[("qwen3.rope.scaling.type", Value::String("yarn".into()))]);
        let RopeScaling::Yarn(y) =
            RopeScaling::from_metadata(m.metadata(), "qwen3", 40960).unwrap()
        else {
            panic!("yarn expected");
        };
        assert_eq!((y.original_context, y.factor), (40960, 1.0));
        assert_eq!(y.magnitude(), 1.0);
    }

    #[test]
    fn a_factor_without_a_type_is_linear_as_in_llama_cpp() {
        let m = meta(&[("llama.rope.scaling.factor", Value::F32(4.0))]);
        let s = RopeScaling::from_metadata(m.metadata(), "llama", 4096).unwrap();
        assert_eq!(s, RopeScaling::Linear { factor: 4.0 });
        assert_eq!(s.position_divisor(), 4.0);
        let m = meta(&[("llama.rope.scale_linear", Value::F32(2.0))]);
        let s = RopeScaling::from_metadata(m.metadata(), "llama", 4096).unwrap();
        assert_eq!(s, RopeScaling::Linear { factor: 2.0 });
        let m = meta(&[("llama.rope.scaling.factor", Value::F32(0.0))]);
        let s = RopeScaling::from_metadata(m.metadata(), "llama", 4096).unwrap();
        assert_eq!(s, RopeScaling::None);
        let m = meta(&[
            ("llama.rope.scaling.type", Value::String("none".into())),
            ("llama.rope.scaling.factor", Value::F32(8.0)),
        ]);
        let s = RopeScaling::from_metadata(m.metadata(), "llama", 4096).unwrap();
        assert_eq!(s, RopeScaling::None, "`none` never scales");
    }

    #[test]
    fn refuses_bad_scaling_metadata() {
        let cases = [
            (
                "longrope",
                "factor",
                Value::F32(2.0),
                "unsupported rope.scaling.type",
            ),
            ("yarn", "factor", Value::F32(-1.0), "rope.scaling.factor"),
            ("yarn", "yarn_beta_fast", Value::F32(0.0), "yarn_beta_fast"),
            (
                "yarn",
                "original_context_length",
                Value::U32(0),
                "original_context_length",
            ),
            (
                "yarn",
                "yarn_log_multiplier",
                Value::F32(f32::NAN),
                "yarn_log_multiplier",
            ),
            (
                "linear",
                "factor",
                Value::F32(f32::INFINITY),
                "rope.scaling.factor",
            ),
        ];
        for (ty, k, v, want) in cases {
            let key = format!("llama.rope.scaling.{k}");
            let m = meta(&[
                ("llama.rope.scaling.type", Value::String(ty.into())),
                (key.as_str(), v),
            ]);
            let err = RopeScaling::from_metadata(m.metadata(), "llama", 4096).unwrap_err();
            assert!(err.to_string().contains(want), "{ty}/{k}: {err}");
        }
        let m = meta(&[("mistral3.attention.temperature_scale", Value::F32(f32::NAN))]);
        let err = AttnTemperature::from_metadata(m.metadata(), "mistral3", &RopeScaling::None, 10)
            .unwrap_err();
        assert!(err.to_string().contains("temperature_scale"), "{err}");
    }
}
