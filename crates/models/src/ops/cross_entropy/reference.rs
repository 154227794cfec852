//! Cross-entropy's plain Burn body (every backend; f32 logits).

use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

/// Mean cross-entropy (nats per kept token, `[1]`) of `logits` `[rows,
/// vocab]` against `targets` `[rows]` by Burn's operations: log-softmax,
/// the target's entry, a negative target ignored (0 when all are).
pub(super) fn cross_entropy_reference<B: Backend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
) -> Tensor<B, 1> {
    let rows = targets.dims()[0];
    let kept = targets.clone().greater_equal_elem(0).float();
    let picked = targets.clamp_min(0).reshape([rows, 1]);
    let nll = log_softmax(logits, 1)
        .gather(1, picked)
        .reshape([rows])
        .neg();
    let count = kept.clone().sum().clamp_min(1.0);
    (nll * kept).sum() / count
}
