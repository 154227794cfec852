//! The step's buffers of one pipeline stage: what lives during a step
//! besides the state held across steps and the stored activations, as the
//! trainer holds it.
//!
//! - ZeRO 0-2: two gradient buckets (`--bucket-mb`), one being filled
//!   while the other is reduced.
//! - ZeRO-3 ([`crate::zero`]): the embedding and head units stay gathered
//!   for the whole step, and their gradients live from the head's backward
//!   to the step's end (a tied head's gradient is the embedding's). Of the
//!   blocks, the one computing is gathered, and where the trainer
//!   prefetches (`--zero3-prefetch N` under `--overlap-grad-reduce`, the
//!   DP group the only group of more than one rank) so are the `N` whose
//!   gathers run ahead ([`crate::zero`]'s `ahead`): `N + 1` blocks'
//!   parameters at once, with the gradients of one block.
//! - ZeRO-2 and 3 under overlap, over more than one micro-batch: a
//!   micro-batch's reduce-scatter results wait until the same units of the
//!   next micro-batch start theirs, up to one more shard of gradients.

use super::Choice;
use crate::zero::ZeroStage;

/// Whether and how far the trainer gathers ZeRO-3 blocks ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefetch {
    /// `--overlap-grad-reduce`: the collectives run on the communication
    /// thread, which is what starts gathers ahead.
    pub overlap: bool,
    /// `--zero3-prefetch N`: blocks whose gathers start ahead.
    pub depth: usize,
}

/// Blocks whose parameters ZeRO-3 holds gathered at once on a rank of
/// `c`: the one computing, plus `depth` where the trainer prefetches (it
/// overlaps only where TP, CP and PP are 1: `train::step`'s `only_dp`).
/// 0 below ZeRO-3.
pub fn gathered_blocks(c: &Choice, prefetch: Prefetch) -> usize {
    if c.zero != ZeroStage::Three {
        return 0;
    }
    let only_dp = c.tp == 1 && c.cp == 1 && c.pp == 1;
    if prefetch.overlap && only_dp {
        prefetch.depth + 1
    } else {
        1
    }
}

/// Bytes of the reduce-scatter results a rank of `c` holds besides its
/// accumulated gradient shard of `grad_bytes` (see the module doc): the
/// shard again under ZeRO-2 and 3 where the trainer overlaps, with more
/// than one micro-batch; 0 otherwise.
pub fn results_in_flight(
    c: &Choice,
    prefetch: Prefetch,
    micro_batches: usize,
    grad_bytes: usize,
) -> f64 {
    let sharded = matches!(c.zero, ZeroStage::Two | ZeroStage::Three);
    let only_dp = c.tp == 1 && c.cp == 1 && c.pp == 1;
    if sharded && prefetch.overlap && only_dp && micro_batches > 1 {
        grad_bytes as f64
    } else {
        0.0
    }
}

/// Bytes of ZeRO-3's step buffers on a stage holding `units` (each FSDP
/// unit's tensor sizes in visiting order: the embedding first on the
/// `first` stage, the head last on the `last` stage, blocks between),
/// with `gathered` blocks gathered at once and `(param, grad)` bytes per
/// value: the end units' parameters and gradients, `gathered` of the
/// largest block's parameters, and one block's gradients.
pub fn zero3_bytes(
    units: &[Vec<usize>],
    first: bool,
    last: bool,
    gathered: usize,
    (param, grad): (usize, usize),
) -> f64 {
    let size = |u: &Vec<usize>| u.iter().sum::<usize>();
    let (mut ends, mut blocks) = (0, units);
    if first {
        ends += blocks.first().map_or(0, size);
        blocks = &blocks[1.min(blocks.len())..];
    }
    if last {
        ends += blocks.last().map_or(0, size);
        blocks = &blocks[..blocks.len().saturating_sub(1)];
    }
    let block = blocks.iter().map(size).max().unwrap_or(0);
    ((param + grad) * ends + (gathered * param + grad) * block) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::estimate::stage_units;
    use crate::plan::{ModelShape, Recompute};

    /// dp 4 (and `tp`), ZeRO-3 with full recomputation, no pipeline.
    fn zero3(tp: usize) -> Choice {
        Choice {
            dp: 4,
            tp,
            cp: 1,
            pp: 1,
            sp: false,
            zero: ZeroStage::Three,
            micro_batch: 1,
            recompute: Recompute::Full,
            interleave: 1,
            offload: false,
        }
    }

    #[test]
    fn prefetch_gathers_n_plus_one_blocks_where_the_trainer_overlaps() {
        let on = |depth| Prefetch {
            overlap: true,
            depth,
        };
        assert_eq!(gathered_blocks(&zero3(1), on(0)), 1);
        assert_eq!(gathered_blocks(&zero3(1), on(1)), 2);
        assert_eq!(gathered_blocks(&zero3(1), on(3)), 4);
        // No overlap, or another group of several ranks: no prefetch.
        let off = Prefetch {
            overlap: false,
            depth: 2,
        };
        assert_eq!(gathered_blocks(&zero3(1), off), 1);
        assert_eq!(gathered_blocks(&zero3(2), on(2)), 1);
        let zero2 = Choice {
            zero: ZeroStage::Two,
            ..zero3(1)
        };
        assert_eq!(gathered_blocks(&zero2, on(2)), 0);
    }

    /// Counted by hand for a GPT of vocabulary 1000, hidden 64, 4 blocks,
    /// 16 positions, f32: a block is 2 LayerNorms (4 x 64), q, k, v, o
    /// (4 x (64 x 64 + 64)), up (64 x 256 + 256) and down (256 x 64 + 64)
    /// = 49 984 values; the embedding 1000 x 64 + 16 x 64 = 65 024; the
    /// head (tied) the final LayerNorm, 128.
    #[test]
    fn zero3_buffers_count_the_ends_and_n_plus_one_blocks() {
        let m = ModelShape::gpt(1000, 64, 4, 4, 16);
        let units = &stage_units(&m, &zero3(1), &[4])[0];
        let (block, ends) = (49_984.0, 65_024.0 + 128.0);
        for gathered in 1..=3 {
            let want = 8.0 * ends + 4.0 * gathered as f64 * block + 4.0 * block;
            let got = zero3_bytes(units, true, true, gathered, (4, 4));
            assert_eq!(got, want, "{gathered} blocks gathered");
        }
        // A middle pipeline stage holds blocks alone; a first stage
        // without the head adds only the embedding.
        let blocks = &stage_units(&m, &zero3(1), &[1, 2, 1])[1];
        assert_eq!(zero3_bytes(blocks, false, false, 2, (4, 4)), 12.0 * block);
        let first = &stage_units(&m, &zero3(1), &[2, 2])[0];
        assert_eq!(
            zero3_bytes(first, true, false, 1, (2, 2)),
            4.0 * 65_024.0 + 4.0 * block
        );
    }
}
