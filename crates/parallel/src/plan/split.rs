//! Which blocks each pipeline stage holds, as the planner assumes them.
//!
//! The last stage also runs the head (the `[h, V]` matmul, `6 h V` FLOPs
//! per token forward and backward), which for a large vocabulary costs
//! more than a block's share: BLOOM-176B's head is 1.5 blocks. An even
//! split leaves every other stage waiting for the last one each
//! micro-batch. Frameworks balance it: Megatron-DeepSpeed counts the
//! embedding and head as layers when it partitions (BLOOM's
//! `--pp-partition-method 'type:transformer|embedding'`, 70 blocks + 2 =
//! 72 over 12 stages), and Ferrotron takes the split as `--pp-layers`.
//!
//! So without interleaving the planner gives the last stage the number of
//! blocks `n` that minimises the slowest stage, `max(ceil((l - n)/(p - 1)),
//! n + H)` in block times, `H` being the head's FLOPs over a block's
//! (recomputation included); a tie goes to the larger `n` (fewer blocks on
//! the first stage, which holds the most micro-batches in flight). The
//! other `l - n` blocks are spread as evenly as possible, the first stages
//! one longer (Ferrotron's order). Interleaved schedules keep the even split
//! (`l / (p v)` blocks per chunk), as Megatron requires.

use super::model::ModelShape;

/// Blocks per pipeline stage, first to last (`pp` entries; one entry, every
/// block, without a pipeline). Interleaved, each entry is the stage's
/// `interleave` chunks together.
///
/// `head_blocks` is the head's compute in block times (`H` above).
pub fn stage_blocks(m: &ModelShape, pp: usize, interleave: usize, head_blocks: f64) -> Vec<usize> {
    let l = m.layers;
    if pp <= 1 {
        return vec![l];
    }
    let even = |n: usize, k: usize| -> Vec<usize> {
        (0..k).map(|i| n / k + usize::from(i < n % k)).collect()
    };
    if interleave > 1 || l < pp {
        return even(l, pp);
    }
    let others = |n: usize| (l - n).div_ceil(pp - 1) as f64;
    let cost = |n: usize| others(n).max(n as f64 + head_blocks);
    let last = (1..=l - (pp - 1))
        .min_by(|&a, &b| {
            cost(a)
                .partial_cmp(&cost(b))
                .expect("costs are finite")
                .then(b.cmp(&a))
        })
        .expect("at least one block per stage");
    let mut split = even(l - last, pp - 1);
    split.push(last);
    split
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers(l: usize) -> ModelShape {
        ModelShape {
            layers: l,
            ..ModelShape::gpt(51200, 64, l, 4, 32)
        }
    }

    #[test]
    fn the_last_stage_gives_up_blocks_to_the_head() {
        // BLOOM: 70 blocks, 12 stages, a head of 1.46 blocks: 11 stages of
        // 6 and a last of 4 + head (5.46), slowest 6 (even split: 6 + 1.46).
        let s = stage_blocks(&layers(70), 12, 1, 1.46);
        assert_eq!(s, [vec![6; 11], vec![4]].concat());
        // A small head changes nothing: 105 blocks on 35 stages of 3.
        assert_eq!(stage_blocks(&layers(105), 35, 1, 0.2), vec![3; 35]);
        // 40 blocks on 2 stages, head 0.66 block: 20 + 20.66 beats 21 + 19.66.
        assert_eq!(stage_blocks(&layers(40), 2, 1, 0.66), vec![20, 20]);
        // Interleaved keeps the even split; no pipeline is one stage.
        assert_eq!(stage_blocks(&layers(48), 2, 2, 3.0), vec![24, 24]);
        assert_eq!(stage_blocks(&layers(48), 1, 1, 3.0), vec![48]);
    }
}
