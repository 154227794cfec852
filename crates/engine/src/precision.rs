//! Mixed precision: the dtype a model computes in, and rounding host
//! buffers to a low-precision format.
//!
//! Master weights, accumulated gradients and optimizer state stay f32
//! whatever the [`Precision`]; only the compute (matmuls, activations) runs
//! in it. The rounding here is the one of a cast to bf16 or f16
//! (round-to-nearest, ties to even), applied to f32 values in place, for
//! collectives that reduce in the low precision over an f32 wire.

use burn::tensor::backend::Backend;
use burn::tensor::{bf16, f16, FloatDType, Tensor};
use serde::{Deserialize, Serialize};

/// The dtype of a model's compute (`--precision`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in f32.
    #[default]
    Fp32,
    /// bfloat16 compute (8 exponent bits, 8 significant bits).
    Bf16,
    /// IEEE half compute (5 exponent bits, 11 significant bits; needs
    /// loss scaling).
    Fp16,
}

impl Precision {
    /// The flag's spelling (`fp32`, `bf16`, `fp16`).
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
        }
    }

    /// The Burn dtype of tensors computed in this precision.
    pub fn dtype(self) -> FloatDType {
        match self {
            Precision::Fp32 => FloatDType::F32,
            Precision::Bf16 => FloatDType::BF16,
            Precision::Fp16 => FloatDType::F16,
        }
    }

    /// Rounds every value of `values` to this precision (nearest, ties to
    /// even) and back to f32, in place; nothing for `Fp32`. Values beyond
    /// the format's range become infinite (f16's largest is 65504).
    pub fn round_in_place(self, values: &mut [f32]) {
        match self {
            Precision::Fp32 => {}
            Precision::Bf16 => values
                .iter_mut()
                .for_each(|v| *v = bf16::from_f32(*v).to_f32()),
            Precision::Fp16 => values
                .iter_mut()
                .for_each(|v| *v = f16::from_f32(*v).to_f32()),
        }
    }
}

impl Precision {
    /// `t` (f32) rounded to this precision and back to f32 on its device:
    /// [`Precision::round_in_place`] for tensors; `t` itself for `Fp32`.
    pub fn round_tensor<B: Backend, const D: usize>(self, t: Tensor<B, D>) -> Tensor<B, D> {
        match self {
            Precision::Fp32 => t,
            low => t.cast(low.dtype()).cast(FloatDType::F32),
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fp32" => Ok(Precision::Fp32),
            "bf16" => Ok(Precision::Bf16),
            "fp16" => Ok(Precision::Fp16),
            _ => Err(format!("'{s}' is not a precision; use fp32, bf16 or fp16")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bf16 of `x` by bit manipulation: keep the top 16 bits of the f32,
    /// rounding the dropped 16 to nearest, ties to even; NaN stays NaN.
    fn bf16_reference(x: f32) -> f32 {
        let bits = x.to_bits();
        if x.is_nan() {
            return x;
        }
        let lsb = (bits >> 16) & 1;
        let rounded = bits.wrapping_add(0x7fff + lsb) & 0xffff_0000;
        f32::from_bits(rounded)
    }

    #[test]
    fn bf16_rounding_matches_the_bit_level_reference() {
        // Every 16-bit tail pattern around halfway, over many exponents
        // and both signs, plus the edges of the range.
        let mut values = vec![0.0, -0.0, f32::MAX, f32::MIN_POSITIVE, 1e-40, f32::INFINITY];
        for high in (0u32..0x8000).step_by(97) {
            for tail in [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff] {
                let bits = (high << 16) | tail;
                values.push(f32::from_bits(bits));
                values.push(f32::from_bits(bits | 0x8000_0000));
            }
        }
        let mut got = values.clone();
        Precision::Bf16.round_in_place(&mut got);
        for (x, g) in values.iter().zip(&got) {
            let want = bf16_reference(*x);
            assert!(
                g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                "bf16({x:e}) = {g:e}, the bit-level rounding gives {want:e}"
            );
        }
    }

    #[test]
    fn ties_round_to_even() {
        // 1 + 2^-8 lies halfway between bf16's 1 and 1 + 2^-7: down to 1
        // (even); 1 + 3 * 2^-8 lies between 1 + 2^-7 and 1 + 2^-6: up.
        let mut v = [1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8)];
        Precision::Bf16.round_in_place(&mut v);
        assert_eq!(v, [1.0, 1.0 + 2f32.powi(-6)]);
        // f16: 2049 is halfway between 2048 and 2050; 65520 overflows.
        let mut h = [2049.0, 2051.0, 65520.0];
        Precision::Fp16.round_in_place(&mut h);
        assert_eq!(h, [2048.0, 2052.0, f32::INFINITY]);
    }

    #[test]
    fn names_round_trip() {
        for p in [Precision::Fp32, Precision::Bf16, Precision::Fp16] {
            assert_eq!(p.name().parse::<Precision>(), Ok(p));
        }
        assert!("fp8".parse::<Precision>().unwrap_err().contains("fp8"));
    }
}
