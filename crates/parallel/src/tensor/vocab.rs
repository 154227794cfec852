//! The vocabulary split over the TP group (Megatron-LM's
//! `VocabParallelEmbedding` and `vocab_parallel_cross_entropy`): each rank
//! holds a contiguous block of the embedding's rows (and of the head's
//! columns), so the `[tokens, vocab]` logits are never formed whole.
//!
//! The vocabulary is padded to a multiple of `divisible_by x tp` (Megatron's
//! `--make-vocab-size-divisible-by`, default 128) so every rank's block has
//! the same size. Padding rows are zero, are never looked up (token ids are
//! below the real vocabulary) and are never predicted: their logits are
//! pushed to [`PADDING_LOGIT`] before the softmax, so they get no
//! probability and no gradient.

use burn::tensor::{Bool, FloatDType, Int, Tensor, TensorData};

use super::{reduce_from_tp, TpGroup, TpOps};

/// Megatron's default `--make-vocab-size-divisible-by`.
pub const DEFAULT_VOCAB_DIVISIBLE_BY: usize = 128;

/// The logit a padding column gets before the softmax: far below any real
/// logit, so `exp` makes it exactly 0, yet finite, so a zero mask times it
/// stays 0 (an infinity would give NaN).
pub const PADDING_LOGIT: f32 = -1e30;

/// The real and padded vocabulary of a TP run and this rank's block of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VocabShard {
    /// Tokens of the real vocabulary.
    pub vocab: usize,
    /// The vocabulary padded to a multiple of `divisible_by x tp` (equal to
    /// `vocab` on one rank: a one-rank model keeps its exact shape).
    pub padded: usize,
    /// First token id of this rank's block.
    pub start: usize,
    /// Rows in every rank's block: `padded / tp`.
    pub len: usize,
}

impl VocabShard {
    /// Rank `rank`'s block of `vocab` tokens split over `tp` ranks, padded
    /// to a multiple of `divisible_by x tp` when `tp > 1`.
    pub fn new(vocab: usize, tp: usize, rank: usize, divisible_by: usize) -> Self {
        let padded = padded_vocab(vocab, tp, divisible_by);
        let len = padded / tp;
        Self {
            vocab,
            padded,
            start: rank * len,
            len,
        }
    }

    /// Rows of this rank's block that are real tokens (the rest is padding).
    pub fn valid(&self) -> usize {
        self.vocab.saturating_sub(self.start).min(self.len)
    }
}

/// `vocab` rounded up to a multiple of `divisible_by x tp` for `tp > 1`;
/// `vocab` itself on one rank.
pub fn padded_vocab(vocab: usize, tp: usize, divisible_by: usize) -> usize {
    if tp == 1 {
        return vocab;
    }
    let step = divisible_by.max(1) * tp;
    vocab.div_ceil(step) * step
}

/// Whether each of `ids` `[n]` falls in `shard`'s block, and its row there
/// (clamped into the block when outside, where the mask zeroes it).
fn local_ids<B: TpOps>(
    ids: Tensor<B, 1, Int>,
    shard: &VocabShard,
) -> (Tensor<B, 1, Int>, Tensor<B, 1, Bool>) {
    let local = ids.sub_scalar(shard.start as i64);
    let inside = local
        .clone()
        .greater_equal_elem(0)
        .bool_and(local.clone().lower_elem(shard.len as i64));
    (local.clamp(0, shard.len as i64 - 1), inside)
}

/// This rank's part of the embedding rows `[n, hidden]` of `ids` `[n]`:
/// the rows its block `table` `[shard.len, hidden]` holds, zeros for the
/// other tokens. Summed over the TP group they are the embedding (under
/// sequence parallelism the sum is a reduce-scatter along the sequence).
pub fn embedding_part<B: TpOps>(
    table: Tensor<B, 2>,
    ids: Tensor<B, 1, Int>,
    shard: &VocabShard,
) -> Tensor<B, 2> {
    let (local, inside) = local_ids(ids, shard);
    let mask = inside.float().unsqueeze_dim::<2>(1);
    table.select(0, local) * mask
}

/// Mean softmax cross-entropy (nats per kept token, shape `[1]`) of logits
/// whose vocabulary is split over `group`: this rank's `logits` `[rows,
/// shard.len]` against `targets` `[rows]`. The row maxima and the sums of
/// exponentials are combined over the group (Megatron's
/// `vocab_parallel_cross_entropy`), never the logits themselves. A negative
/// target (the goldfish loss's dropped tokens) is ignored as by the
/// one-rank loss: no loss, not counted in the mean, no gradient; 0 when
/// every target is ignored. Computed in f32 whatever the logits' dtype
/// (bf16 or f16 logits are cast up first, as the one-rank loss does).
pub fn vocab_parallel_cross_entropy<B: TpOps>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    shard: &VocabShard,
    group: &TpGroup,
) -> Tensor<B, 1> {
    let logits = logits.cast(FloatDType::F32);
    let [rows, len] = logits.dims();
    let device = logits.device();
    let logits = if shard.valid() < len {
        let pad: Vec<f32> = (0..len)
            .map(|i| {
                if i < shard.valid() {
                    0.0
                } else {
                    PADDING_LOGIT
                }
            })
            .collect();
        logits + Tensor::<B, 2>::from_data(TensorData::new(pad, [1, len]), &device)
    } else {
        logits
    };
    // Any per-row constant keeps the softmax; the group's maximum keeps the
    // exponentials in range. It is a constant: no gradient flows through it.
    let local_max = logits.clone().detach().max_dim(1).reshape([rows]);
    let row_max = group_max(local_max, group).reshape([rows, 1]);
    let shifted = logits - row_max;
    let sum_exp = reduce_from_tp(shifted.clone().exp().sum_dim(1), group);
    let kept = targets.clone().greater_equal_elem(0).float();
    let (local, inside) = local_ids(targets, shard);
    let picked = shifted.gather(1, local.reshape([rows, 1])) * inside.float().reshape([rows, 1]);
    let target_logit = reduce_from_tp(picked, group);
    let count = kept.clone().sum().clamp_min(1.0);
    ((sum_exp.log() - target_logit).reshape([rows]) * kept).sum() / count
}

/// The element-wise maximum of `x` `[n]` over `group` (no gradient).
fn group_max<B: TpOps>(x: Tensor<B, 1>, group: &TpGroup) -> Tensor<B, 1> {
    if group.size() == 1 {
        return x;
    }
    let n = x.dims()[0];
    let all = group
        .comm()
        .all_gather_tensor(x)
        .unwrap_or_else(|e| panic!("tensor-parallel all-gather over {group:?} failed: {e}"));
    all.reshape([group.size(), n]).max_dim(0).reshape([n])
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};

    /// On one rank with padding columns and ignored targets, the loss is the
    /// plain mean over the kept rows and the logits' gradient is
    /// `(softmax - onehot) / kept` on kept rows, 0 on ignored rows and on
    /// padding columns.
    #[test]
    fn ignored_targets_are_left_out_of_the_mean_and_get_no_gradient() {
        type B = Autodiff<Flex>;
        let (rows, len, vocab) = (5, 8, 6);
        let shard = VocabShard {
            vocab,
            padded: len,
            start: 0,
            len,
        };
        let values: Vec<f32> = (0..rows * len)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 4.0)
            .collect();
        let targets = [3i64, -100, 0, 5, -100];
        let device = Default::default();
        let logits =
            Tensor::<B, 2>::from_data(TensorData::new(values.clone(), [rows, len]), &device)
                .require_grad();
        let loss = vocab_parallel_cross_entropy(
            logits.clone(),
            Tensor::from_data(TensorData::new(targets.to_vec(), [rows]), &device),
            &shard,
            &TpGroup::single(),
        );
        let got = loss.clone().into_scalar() as f64;
        let grad: Vec<f32> = logits
            .grad(&loss.backward())
            .unwrap()
            .into_data()
            .to_vec()
            .unwrap();
        let kept = targets.iter().filter(|&&t| t >= 0).count() as f64;
        let mut want = 0.0;
        for (r, &target) in targets.iter().enumerate() {
            let row: Vec<f64> = values[r * len..r * len + vocab]
                .iter()
                .map(|&x| f64::from(x))
                .collect();
            let sum: f64 = row.iter().map(|x| x.exp()).sum();
            for j in 0..len {
                let g = f64::from(grad[r * len + j]);
                let expected = if target < 0 || j >= vocab {
                    0.0
                } else {
                    let onehot = if j as i64 == target { 1.0 } else { 0.0 };
                    (row[j].exp() / sum - onehot) / kept
                };
                assert!(
                    (g - expected).abs() < 1e-6,
                    "row {r} column {j}: {g} vs {expected}"
                );
            }
            if target >= 0 {
                want += sum.ln() - row[target as usize];
            }
        }
        want /= kept;
        assert!((got - want).abs() < 1e-5, "{got} vs {want}");
    }

    #[test]
    fn padding_makes_equal_blocks_and_only_on_several_ranks() {
        assert_eq!(padded_vocab(300, 1, 128), 300);
        assert_eq!(padded_vocab(300, 2, 128), 512);
        assert_eq!(padded_vocab(512, 2, 128), 512);
        assert_eq!(padded_vocab(50257, 8, 128), 51200);
        let last = VocabShard::new(300, 2, 1, 128);
        assert_eq!((last.start, last.len, last.valid()), (256, 256, 44));
        let first = VocabShard::new(300, 2, 0, 128);
        assert_eq!(first.valid(), 256);
        // A block made only of padding.
        assert_eq!(VocabShard::new(100, 2, 1, 128).valid(), 0);
    }
}
