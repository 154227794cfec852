//! Training state per GPU: parameters, gradients and optimizer state under
//! each ZeRO stage, laid out by the same [`FlatLayout`] the trainer shards
//! with, so the classes and the padding are the trainer's.
//!
//! Bytes per parameter follow the ZeRO paper (Rajbhandari et al. 2020,
//! Sec. 3.1): mixed precision Adam keeps fp16/bf16 parameters (2) and
//! gradients (2) and fp32 master weights, momentum and variance (12).
//! Ferrotron's f32 training keeps f32 parameters (4), gradients (4) and
//! AdamW's two moments (8).

use burn::module::ParamId;
use ferrotron_engine::metrics::MemoryBytes;
use serde::Serialize;

use crate::flat::{FlatLayout, ParamInfo};
use crate::zero::ZeroStage;

/// The numeric format of training.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// bf16 mixed precision with fp32 master weights.
    Bf16,
    /// fp16 mixed precision with fp32 master weights.
    Fp16,
    /// Everything in f32 (what Ferrotron trains in today).
    Fp32,
}

impl Precision {
    /// Bytes per parameter of (parameters, gradients, optimizer state).
    pub fn state_bytes(self) -> (usize, usize, usize) {
        match self {
            Precision::Bf16 | Precision::Fp16 => (2, 2, 12),
            Precision::Fp32 => (4, 4, 8),
        }
    }

    /// Bytes of one activation element.
    pub fn activation_bytes(self) -> usize {
        match self {
            Precision::Bf16 | Precision::Fp16 => 2,
            Precision::Fp32 => 4,
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "bf16" => Ok(Self::Bf16),
            "fp16" => Ok(Self::Fp16),
            "fp32" => Ok(Self::Fp32),
            _ => Err(format!("'{s}' is not a precision; use bf16, fp16 or fp32")),
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
            Precision::Fp32 => "fp32",
        })
    }
}

/// The training state of rank 0 of a DP group of `dp` ranks holding the
/// tensors `units` (each FSDP unit's tensor sizes in visiting order), as
/// the trainer lays it out: stage 0 keeps everything; stages 1 and 2 shard
/// buckets of at most `bucket_elems` values (optimizer state, then
/// gradients); stage 3 shards the units and keeps a one-value placeholder
/// per tensor. Rank 0 owns the first chunk of every unit, so its bytes
/// include no padding; the last rank's may hold less.
pub fn state_bytes(
    units: &[Vec<usize>],
    dp: usize,
    zero: ZeroStage,
    precision: Precision,
    bucket_elems: usize,
) -> MemoryBytes {
    let (bp, bg, bo) = precision.state_bytes();
    let info = |n: &usize| -> ParamInfo { (ParamId::new(), vec![*n], true) };
    let total: usize = units.iter().flatten().sum();
    let tensors: usize = units.iter().map(Vec::len).sum();
    let groups: Vec<Vec<ParamInfo>> = match zero {
        ZeroStage::Off => {
            return MemoryBytes {
                param_bytes: bp * total,
                grad_bytes: bg * total,
                optimizer_bytes: bo * total,
            }
        }
        ZeroStage::Three => units.iter().map(|u| u.iter().map(info).collect()).collect(),
        _ => FlatLayout::buckets(units.iter().flatten().map(info).collect(), bucket_elems),
    };
    let shard = FlatLayout::new(groups, 0, dp).shard_elems();
    MemoryBytes {
        param_bytes: if zero == ZeroStage::Three {
            bp * (shard + tensors)
        } else {
            bp * total
        },
        grad_bytes: if zero >= ZeroStage::Two {
            bg * shard
        } else {
            bg * total
        },
        optimizer_bytes: bo * shard,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_shard_what_the_zero_paper_says() {
        // One unit of 1000 values on 4 ranks, mixed precision: 250 each.
        let units = vec![vec![600, 400]];
        let m = |z| state_bytes(&units, 4, z, Precision::Bf16, 1 << 20);
        assert_eq!(
            m(ZeroStage::Off),
            MemoryBytes {
                param_bytes: 2000,
                grad_bytes: 2000,
                optimizer_bytes: 12000
            }
        );
        assert_eq!(m(ZeroStage::One).optimizer_bytes, 3000);
        assert_eq!(m(ZeroStage::Two).grad_bytes, 500);
        // Stage 3: 250 values plus one placeholder per tensor.
        assert_eq!(m(ZeroStage::Three).param_bytes, 2 * (250 + 2));
    }
}
