//! Rotary frequencies: the per-pair inverse frequencies RoPE rotates by,
//! with the long-context scaling types of Hugging Face `transformers`.
//!
//! RoPE rotates pair `i` of a head (`i < head_dim / 2`) at position `p` by
//! the angle `p * inv_freq[i]` radians. Unscaled, `inv_freq[i] =
//! theta^(-2i / head_dim)`. A scaling type rewrites these frequencies once;
//! every consumer (the reference tables, the fused kernel, KV-cached decoding)
//! takes them from [`inv_freq`], so all agree. The arithmetic is f32 in the
//! order `transformers` uses (`modeling_rope_utils.py`), so logits match to
//! rounding.

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;

/// A long-context scaling of the RoPE frequencies (`rope_type` in a Hugging
/// Face `config.json`). None of them rescales cos/sin (attention factor 1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum RopeScaling {
    /// Position interpolation: every inverse frequency divided by `factor`
    /// (the same angles as positions divided by `factor`).
    Linear {
        /// Context extension factor (at least 1).
        factor: f64,
    },
    /// Llama 3.1's frequency-dependent scaling: wavelengths longer than
    /// `original_max_position_embeddings / low_freq_factor` are divided by
    /// `factor`, those shorter than `original_max_position_embeddings /
    /// high_freq_factor` are kept, and the band between interpolates smoothly.
    Llama3 {
        /// Context extension factor of the low frequencies (8 in Llama 3.1).
        factor: f64,
        /// Wavelength bound (as a divisor of the original context) above
        /// which frequencies are fully scaled.
        low_freq_factor: f64,
        /// Wavelength bound below which frequencies are kept.
        high_freq_factor: f64,
        /// Context length the model was pre-trained at, in tokens.
        original_max_position_embeddings: usize,
    },
}

impl RopeScaling {
    /// The `rope_type` name `transformers` uses.
    pub fn rope_type(&self) -> &'static str {
        match self {
            RopeScaling::Linear { .. } => "linear",
            RopeScaling::Llama3 { .. } => "llama3",
        }
    }

    /// Checks the parameters; the error names the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field, problem: String| Err(ConfigError { field, problem });
        let factor = match *self {
            RopeScaling::Linear { factor } => factor,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                if !(low_freq_factor.is_finite() && low_freq_factor > 0.0) {
                    return bad(
                        "position.scaling.low_freq_factor",
                        format!("must be positive, got {low_freq_factor}"),
                    );
                }
                if !(high_freq_factor.is_finite() && high_freq_factor > low_freq_factor) {
                    return bad(
                        "position.scaling.high_freq_factor",
                        format!(
                            "must exceed low_freq_factor ({low_freq_factor}), got {high_freq_factor}"
                        ),
                    );
                }
                if original_max_position_embeddings == 0 {
                    return bad(
                        "position.scaling.original_max_position_embeddings",
                        "must be positive".into(),
                    );
                }
                factor
            }
        };
        if !(factor.is_finite() && factor >= 1.0) {
            return bad(
                "position.scaling.factor",
                format!("must be a finite number >= 1, got {factor}"),
            );
        }
        Ok(())
    }
}

/// The `head_dim / 2` inverse frequencies (radians per position) of RoPE with
/// base `theta`, scaled by `scaling`, computed as `transformers` does (f32).
pub fn inv_freq(theta: f64, scaling: Option<&RopeScaling>, head_dim: usize) -> Vec<f32> {
    // `1 / base ** (arange(0, dim, 2).float() / dim)` in f32.
    let base: Vec<f32> = (0..head_dim / 2)
        .map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / head_dim as f32))
        .collect();
    match scaling {
        None => base,
        Some(RopeScaling::Linear { factor }) => base.iter().map(|f| f / *factor as f32).collect(),
        Some(&RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) => {
            let old = original_max_position_embeddings as f64;
            let low_wavelen = (old / low_freq_factor) as f32;
            let high_wavelen = (old / high_freq_factor) as f32;
            let (factor, low) = (factor as f32, low_freq_factor as f32);
            let span = (high_freq_factor - low_freq_factor) as f32;
            base.iter()
                .map(|&f| {
                    let wavelen = (2.0 * std::f64::consts::PI) as f32 / f;
                    let scaled = if wavelen > low_wavelen { f / factor } else { f };
                    if wavelen < high_wavelen || wavelen > low_wavelen {
                        return scaled;
                    }
                    let smooth = (old as f32 / wavelen - low) / span;
                    (1.0 - smooth) * scaled / factor + smooth * scaled
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Llama 3.1's published parameters over a small original context, so
    /// that the head has frequencies in all three bands.
    fn llama3(factor: f64) -> RopeScaling {
        RopeScaling::Llama3 {
            factor,
            low_freq_factor: 1.0,
            high_freq_factor: 8.0,
            original_max_position_embeddings: 64,
        }
    }

    #[test]
    fn llama3_keeps_high_scales_low_and_interpolates_the_band_between() {
        // theta 10000, head_dim 8: wavelengths 2 pi x (1, 10, 100, 1000);
        // the bands are < 8 (kept), > 64 (divided by 4) and between.
        let plain = inv_freq(10_000.0, None, 8);
        let scaled = inv_freq(10_000.0, Some(&llama3(4.0)), 8);
        assert_eq!(scaled[0], plain[0]);
        for i in [2, 3] {
            assert!((scaled[i] - plain[i] / 4.0).abs() <= 1e-7 * plain[i], "{i}");
        }
        // Band: wavelen 62.83, smooth = (64 / 62.83 - 1) / 7 = 0.002664,
        // f64 reference of (1 - s) f / 4 + s f.
        let f = 0.1f64;
        let wavelen = 2.0 * std::f64::consts::PI / f;
        let s = (64.0 / wavelen - 1.0) / 7.0;
        let want = (1.0 - s) * f / 4.0 + s * f;
        assert!(
            (scaled[1] as f64 - want).abs() < 1e-7,
            "{} vs {want}",
            scaled[1]
        );
    }

    #[test]
    fn linear_divides_every_frequency_and_factor_one_changes_nothing() {
        let plain = inv_freq(500_000.0, None, 16);
        let lin = inv_freq(500_000.0, Some(&RopeScaling::Linear { factor: 2.5 }), 16);
        for (a, b) in plain.iter().zip(&lin) {
            assert_eq!(*b, a / 2.5);
        }
        assert_eq!(inv_freq(500_000.0, Some(&llama3(1.0)), 16), plain);
    }

    #[test]
    fn bad_parameters_name_the_field() {
        let e = RopeScaling::Linear { factor: 0.5 }.validate().unwrap_err();
        assert!(e.to_string().contains("position.scaling.factor"), "{e}");
        let e = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 4.0,
            high_freq_factor: 1.0,
            original_max_position_embeddings: 8192,
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("high_freq_factor"), "{e}");
    }
}
