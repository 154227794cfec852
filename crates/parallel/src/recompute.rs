//! Activation recomputation: what a training step recomputes in backward
//! instead of keeping from forward (Korthikanti et al. 2022, "Reducing
//! Activation Recomputation in Large Transformer Models").
//!
//! - `none`: every activation backward needs is kept.
//! - `selective` (Sec. 5): the attention core, `softmax(q k^T / sqrt(d) +
//!   bias) v`, is recomputed from `q`, `k` and `v` in backward, so its
//!   `[batch, heads, seq, seq]` scores and probabilities are never kept. The
//!   model does it (`LmUnits::with_attention_recompute`); the fused CubeCL
//!   attention is selective by construction (it keeps only its output and
//!   the per-row log-sum-exp, FlashAttention-2's recomputation).
//! - `full` (activation checkpointing): each block keeps only its input;
//!   its forward runs again in backward. The step does it (the block-by-block
//!   schedule of ZeRO-3, `micro_batch::unit_by_unit`), so ZeRO-3 is
//!   always `full`.
//!
//! Applied in torchtitan's order: tensor parallelism, then recomputation,
//! then ZeRO / FSDP.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What is recomputed in backward.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    /// Nothing: every activation backward needs is stored.
    #[default]
    None,
    /// The attention core: scores, softmax (and its dropout), the weighted
    /// sum of the values (Korthikanti Sec. 5). `sel` in a job file too, as
    /// on the command line.
    #[serde(alias = "sel")]
    Selective,
    /// Each block's forward from its stored input (activation checkpointing).
    Full,
}

/// A recomputation the trainer cannot combine with its other settings.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecomputeError {
    /// Full recomputation on a pipeline: the pipeline keeps each
    /// micro-batch's autodiff graph from its forward to its backward slot.
    #[error(
        "full recomputation with {stages} pipeline stages: the pipeline keeps each micro-batch's \
         graph between its forward and backward; use none or selective"
    )]
    Pipeline {
        /// Pipeline stages.
        stages: usize,
    },
    /// Selective recomputation under ZeRO-3, which recomputes whole blocks.
    #[error(
        "selective recomputation with ZeRO-3: ZeRO-3 recomputes every block in backward, which \
         is full recomputation"
    )]
    Zero3,
}

impl Recompute {
    /// Every choice.
    pub const ALL: [Recompute; 3] = [Recompute::None, Recompute::Selective, Recompute::Full];

    /// The short name of the planner's choice labels (`none`, `sel`, `full`).
    pub fn name(self) -> &'static str {
        match self {
            Recompute::None => "none",
            Recompute::Selective => "sel",
            Recompute::Full => "full",
        }
    }
    /// FLOPs per token and per block that backward's recomputation adds to
    /// a training step, for a block whose matmuls use `block_matmul_weights`
    /// weights at sequence length `seq` and width `hidden`: `selective` runs
    /// the attention core's forward again (`q k^T` and `p v`, `4 seq hidden`
    /// multiply-adds counted as 2 FLOPs each, every key counted as Megatron
    /// does, causal or not), `full` the whole block's forward (`2
    /// block_matmul_weights + 4 seq hidden`). A step without recomputation
    /// costs `3x` the forward (`6 weights + 12 seq hidden` per block); with
    /// full recomputation `4x`, which over a GPT model is Megatron's `96 B s
    /// l h^2 (1 + s/6h + V/16lh)` (Narayanan et al. 2021, Sec. 5.1).
    pub fn extra_flops_per_token(self, block_matmul_weights: f64, seq: f64, hidden: f64) -> f64 {
        match self {
            Recompute::None => 0.0,
            Recompute::Selective => 4.0 * seq * hidden,
            Recompute::Full => 2.0 * block_matmul_weights + 4.0 * seq * hidden,
        }
    }
}

impl fmt::Display for Recompute {
    /// The flag's spelling: `none`, `selective` or `full`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Recompute::None => "none",
            Recompute::Selective => "selective",
            Recompute::Full => "full",
        })
    }
}

impl FromStr for Recompute {
    type Err = String;

    /// `none`, `selective` (or the planner's `sel`), `full`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Recompute::None),
            "selective" | "sel" => Ok(Recompute::Selective),
            "full" => Ok(Recompute::Full),
            _ => Err(format!("'{s}' is not none, selective (sel) or full")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Recompute;

    #[test]
    fn names_parse_back() {
        for r in Recompute::ALL {
            assert_eq!(r.to_string().parse::<Recompute>(), Ok(r));
            assert_eq!(r.name().parse::<Recompute>(), Ok(r));
        }
        assert!("partial"
            .parse::<Recompute>()
            .unwrap_err()
            .contains("'partial'"));
    }

    #[test]
    fn a_job_file_takes_the_names_the_command_line_takes() {
        for name in ["none", "selective", "sel", "full"] {
            let from_file: Recompute = serde_json::from_str(&format!("\"{name}\"")).unwrap();
            assert_eq!(Ok(from_file), name.parse::<Recompute>(), "{name}");
        }
        assert!(serde_json::from_str::<Recompute>("\"partial\"").is_err());
    }
}
