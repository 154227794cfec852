//! Host memory one rank adds while writing a checkpoint, beyond its
//! training state, as the trainer writes one (`Trainer::write_checkpoint`,
//! `Trainer::start_checkpoint`):
//! - a streamed save copies one block at a time to the host and cuts it
//!   to the tensor (a second copy, without the vocabulary padding), so it
//!   adds twice the largest copy: a parameter's whole TP block (its
//!   weights, under ZeRO 0-2) or the rank's piece of it (ZeRO-3, and the
//!   AdamW moments under ZeRO 1-3);
//! - `--async-checkpoint` copies every block the rank stores at once (the
//!   f32 weights and both moments of its share: 12 bytes per value) and
//!   holds them while the next steps run, until the background write ends.
//!
//! The planner's rank is DP, TP and pipeline rank 0, which stores its
//! share of everything it holds. Both figures are host memory: on a GPU
//! they do not count against the device (the planner's memory total);
//! on a CPU backend they are the same memory.

use serde::Serialize;

use burn::module::ParamId;

use super::memory::{layout_state_bytes, Held, Precision};
use crate::flat::FlatLayout;
use crate::zero::ZeroStage;

/// Bytes per stored value of a checkpoint: f32 weights and AdamW's two
/// f32 moments.
const STORED_BYTES: usize = 12;

/// Host memory a checkpoint adds on one rank, bytes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CheckpointBytes {
    /// During a streamed save: the largest block's host copy and its copy
    /// cut to the tensor.
    pub streamed: f64,
    /// Under `--async-checkpoint`: the host copy of every block the rank
    /// stores, held through the steps its background write overlaps.
    pub background: f64,
}

/// [`CheckpointBytes`] of DP rank 0 of `dp` holding the tensors `units`
/// (each FSDP unit's tensors in visiting order, other stages' as
/// placeholders: what [`layout_state_bytes`] reads) under `zero`, ZeRO 1
/// and 2 in buckets of at most `bucket_elems` values. The rank stores its
/// ZeRO pieces of the tensors it holds (all of them without ZeRO): the
/// values its optimizer state covers under ZeRO 1 (whose buckets ZeRO-2
/// shares) and 3, counted by [`layout_state_bytes`].
pub fn checkpoint_bytes(
    units: &[Vec<Held>],
    dp: usize,
    zero: ZeroStage,
    bucket_elems: usize,
) -> CheckpointBytes {
    let largest_tensor = units
        .iter()
        .flatten()
        .map(|t| match t {
            Held::Values(n) => *n,
            Held::Placeholder => 0,
        })
        .max()
        .unwrap_or(0);
    let largest_copy = if zero == ZeroStage::Three {
        largest_piece(units, dp)
    } else {
        largest_tensor
    };
    let pieces_of = match zero {
        ZeroStage::Two => ZeroStage::One,
        z => z,
    };
    // f32 AdamW state: 8 bytes per value it covers.
    let stored =
        layout_state_bytes(units, dp, pieces_of, Precision::Fp32, bucket_elems).optimizer_bytes / 8;
    CheckpointBytes {
        streamed: (2 * 4 * largest_copy) as f64,
        background: (STORED_BYTES * stored) as f64,
    }
}

/// The largest piece DP rank 0 of `dp` owns of any tensor of `units`
/// under ZeRO-3 (units laid end to end, cut into `dp` chunks).
fn largest_piece(units: &[Vec<Held>], dp: usize) -> usize {
    let groups = units
        .iter()
        .map(|u| {
            u.iter()
                .map(|t| {
                    let n = match t {
                        Held::Values(n) => *n,
                        Held::Placeholder => 1,
                    };
                    (ParamId::new(), vec![n], true)
                })
                .collect()
        })
        .collect();
    let layout = FlatLayout::new(groups, 0, dp);
    (0..layout.units().len())
        .flat_map(|u| layout.pieces(u))
        .map(|p| p.len())
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`checkpoint_bytes`] of `units` on 2 ranks with buckets of
    /// `bucket` values, in f32 values: (streamed / 4, background / 4).
    fn values(units: &[Vec<Held>], zero: ZeroStage, bucket: usize) -> (f64, f64) {
        let c = checkpoint_bytes(units, 2, zero, bucket);
        (c.streamed / 4.0, c.background / 4.0)
    }

    #[test]
    fn a_save_adds_two_copies_of_the_largest_block_and_async_the_whole_share() {
        use Held::{Placeholder as P, Values as V};
        // Two units: [600, 400] and [100, 10] on 2 ranks.
        let units = vec![vec![V(600), V(400)], vec![V(100), V(10)]];
        let big = 1 << 20;
        // ZeRO 0: rank 0 copies whole tensors (largest 600, twice) and
        // stores all 1110 values x (weights, m, v).
        assert_eq!(values(&units, ZeroStage::Off, big), (1200.0, 3330.0));
        // ZeRO 1 and 2: the weights are still copied whole; rank 0 stores
        // its half of the one bucket of 1110 values: 555.
        assert_eq!(values(&units, ZeroStage::One, big), (1200.0, 3.0 * 555.0));
        assert_eq!(values(&units, ZeroStage::Two, big), (1200.0, 3.0 * 555.0));
        // ZeRO-3: chunks of 500 and 55; rank 0's pieces are the first 500
        // of the 600-value tensor and the first 55 of the 100-value one.
        assert_eq!(values(&units, ZeroStage::Three, big), (1000.0, 3.0 * 555.0));
        // Another stage's tensors are placeholders: nothing of them is
        // copied or stored.
        let staged = vec![vec![P, P], vec![V(100), V(10)]];
        assert_eq!(values(&staged, ZeroStage::Off, big), (200.0, 330.0));
        // ZeRO-2, one bucket of a placeholder and 9 values: rank 0's chunk
        // of 5 is the placeholder and 4 values, and it stores the 4 (its
        // ZeRO-2 optimizer state counts the placeholder's value too).
        let mixed = vec![vec![P], vec![V(9)]];
        assert_eq!(values(&mixed, ZeroStage::Two, 10), (18.0, 3.0 * 4.0));
    }
}
