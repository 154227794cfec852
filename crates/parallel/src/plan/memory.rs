//! Training state per GPU: parameters, gradients and optimizer state under
//! each ZeRO stage, laid out by the same [`FlatLayout`] the trainer shards
//! with, so the classes and the padding are the trainer's.
//!
//! Bytes per parameter follow the ZeRO paper (Rajbhandari et al. 2020,
//! Sec. 3.1): mixed precision Adam keeps fp16/bf16 parameters (2) and
//! gradients (2) and fp32 master weights, momentum and variance (12).
//! Ferrotron's f32 training keeps f32 parameters (4), gradients (4) and
//! AdamW's two moments (8).

use std::collections::HashSet;

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

impl From<Precision> for ferrotron_engine::precision::Precision {
    /// The compute precision `train` takes for the planner's format.
    fn from(p: Precision) -> Self {
        match p {
            Precision::Bf16 => Self::Bf16,
            Precision::Fp16 => Self::Fp16,
            Precision::Fp32 => Self::Fp32,
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

/// One tensor of a rank's layout: its values, or another pipeline
/// stage's tensor, which the trainer keeps as a one-value placeholder (so
/// that every stage visits the same parameters in the same order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// A tensor of this many values that this rank holds.
    Values(usize),
    /// Another stage's tensor.
    Placeholder,
}

impl Held {
    /// Values in the flat layout (a placeholder takes one).
    fn len(self) -> usize {
        match self {
            Held::Values(n) => n,
            Held::Placeholder => 1,
        }
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
    let held: Vec<Vec<Held>> = units
        .iter()
        .map(|u| u.iter().map(|&n| Held::Values(n)).collect())
        .collect();
    layout_state_bytes(&held, dp, zero, precision, bucket_elems)
}

/// [`state_bytes`] of a pipeline stage, whose layout also lists the other
/// stages' tensors as placeholders (`units`: every tensor of the model in
/// visiting order). As the trainer counts them: the parameters include the
/// placeholders' values; replicated gradients (ZeRO 0-1) and ZeRO-0's
/// optimizer state only what the stage holds; ZeRO-1's optimizer state
/// this rank's pieces of the held tensors; ZeRO-2's gradients and
/// optimizer state this rank's chunk of every bucket holding a tensor of
/// the stage (its reduce-scatter returns the whole chunk, placeholders'
/// values included). Without placeholders this is [`state_bytes`].
pub fn layout_state_bytes(
    units: &[Vec<Held>],
    dp: usize,
    zero: ZeroStage,
    precision: Precision,
    bucket_elems: usize,
) -> MemoryBytes {
    let (bp, bg, bo) = precision.state_bytes();
    let all: usize = units.iter().flatten().map(|t| t.len()).sum();
    let held: usize = units
        .iter()
        .flatten()
        .map(|t| match t {
            Held::Values(n) => *n,
            Held::Placeholder => 0,
        })
        .sum();
    let tensors: usize = units.iter().map(Vec::len).sum();
    let mut held_ids = HashSet::new();
    let mut info = |t: &Held| -> ParamInfo {
        let id = ParamId::new();
        if let Held::Values(_) = t {
            held_ids.insert(id);
        }
        (id, vec![t.len()], true)
    };
    let groups: Vec<Vec<ParamInfo>> = match zero {
        ZeroStage::Off => {
            return MemoryBytes {
                param_bytes: bp * all,
                grad_bytes: bg * held,
                optimizer_bytes: bo * held,
            }
        }
        ZeroStage::Three => units
            .iter()
            .map(|u| u.iter().map(&mut info).collect())
            .collect(),
        _ => FlatLayout::buckets(
            units.iter().flatten().map(&mut info).collect(),
            bucket_elems,
        ),
    };
    let layout = FlatLayout::new(groups, 0, dp);
    if zero == ZeroStage::Three {
        let shard = layout.shard_elems();
        return MemoryBytes {
            param_bytes: bp * (shard + tensors),
            grad_bytes: bg * shard,
            optimizer_bytes: bo * shard,
        };
    }
    // Rank 0's pieces, unit by unit: (of held tensors, all) values, for
    // the units that hold a tensor of this rank.
    let (mut of_held, mut of_units) = (0, 0);
    for u in 0..layout.units().len() {
        let slots = &layout.units()[u].slots;
        if !slots.iter().any(|s| held_ids.contains(&s.id)) {
            continue;
        }
        for p in layout.pieces(u) {
            of_units += p.len();
            if held_ids.contains(&p.id) {
                of_held += p.len();
            }
        }
    }
    let shard = if zero == ZeroStage::Two {
        of_units
    } else {
        of_held
    };
    MemoryBytes {
        param_bytes: bp * all,
        grad_bytes: if zero == ZeroStage::Two {
            bg * shard
        } else {
            bg * held
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

    #[test]
    fn placeholders_count_as_the_trainer_counts_them() {
        use Held::{Placeholder as P, Values as V};
        let f32_bytes = |units: &[Vec<Held>], z, bucket| {
            let m = layout_state_bytes(units, 2, z, Precision::Fp32, bucket);
            (m.param_bytes / 4, m.grad_bytes / 4, m.optimizer_bytes / 8)
        };
        // One bucket of 8 values on 2 ranks, two placeholders first: rank 0
        // owns both placeholders and 2 of the 6 held values.
        let units = vec![vec![P, P, V(6)]];
        assert_eq!(f32_bytes(&units, ZeroStage::Off, 100), (8, 6, 6));
        assert_eq!(f32_bytes(&units, ZeroStage::One, 100), (8, 6, 2));
        assert_eq!(f32_bytes(&units, ZeroStage::Two, 100), (8, 4, 4));
        // Buckets of 2: the 6 values alone, the placeholders a bucket of
        // their own that holds nothing of this rank.
        let units = vec![vec![V(6), P, P]];
        assert_eq!(f32_bytes(&units, ZeroStage::Two, 2), (8, 3, 3));
        assert_eq!(f32_bytes(&units, ZeroStage::One, 2), (8, 6, 3));
    }
}
