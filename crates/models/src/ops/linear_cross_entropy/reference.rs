//! The head's plain forms by Burn's operations (every backend): the whole
//! logits then the reference cross-entropy, and the blocks of rows.

use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{FloatDType, IndexingUpdateOp, Int, Tensor};

use super::{block_rows, t2, GradPrimitives, LinearCrossEntropyGrads};
use crate::config::Kernels;
use crate::ops::cross_entropy;
use crate::ops::fused::KernelBackend;

/// The plain reference: the whole logits `x.matmul(weight)` (`x`
/// `[rows, hidden]`, `weight` `[hidden, vocab]`, in `x`'s dtype), cast to
/// f32, then the reference [`cross_entropy`] against `targets` `[rows]`.
/// Mean nats per kept token, `[1]`.
pub fn linear_cross_entropy_reference<B: KernelBackend>(
    x: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
) -> Tensor<B, 1> {
    let rows = x.dims()[0];
    let logits = x
        .clone()
        .matmul(weight.cast(x.dtype()))
        .cast(FloatDType::F32);
    let vocab = logits.dims()[1];
    cross_entropy(
        Kernels::Reference,
        logits.reshape([1, rows, vocab]),
        targets.reshape([1, rows]),
    )
}

/// The mean cross-entropy (nats per kept token, f32 `[1]`) of `x`
/// `[rows, hidden]` times `weight` `[hidden, vocab]` (both in the compute
/// dtype: f32, or bf16 whose blocks round as the comments say) against `targets` `[rows]`, computed `block` rows at
/// a time, and with `grads` the gradients for an upstream gradient of 1.
///
/// Per block: logits in the compute dtype, cast to f32, log-softmax, the
/// target's entry; the gradient of the logits `(softmax - onehot) * kept /
/// count` cast back to the compute dtype, then `d_x = d_logits w^T` and
/// `d_w += x^T d_logits` (summed in f32). Negative targets are ignored (no
/// loss, zero gradient); with every target ignored the loss is 0.
pub fn linear_cross_entropy_blocks<B: Backend>(
    x: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    block: usize,
    grads: bool,
) -> (Tensor<B, 1>, Option<LinearCrossEntropyGrads<B>>) {
    let rows = x.dims()[0];
    assert!(rows > 0 && block > 0, "linear cross-entropy of no rows");
    let dtype = x.dtype();
    let kept = targets.clone().greater_equal_elem(0).float();
    let per_kept = kept.clone().sum().clamp_min(1.0).recip();
    let mut nll = Tensor::<B, 1>::zeros([1], &x.device());
    let mut d_x = Vec::new();
    let mut d_w: Option<Tensor<B, 2>> = None;
    for start in (0..rows).step_by(block) {
        let len = block.min(rows - start);
        let x_block = x.clone().narrow(0, start, len);
        let kept = kept.clone().narrow(0, start, len).reshape([len, 1]);
        let picked = targets
            .clone()
            .narrow(0, start, len)
            .clamp_min(0)
            .reshape([len, 1]);
        let logits = x_block.clone().matmul(weight.clone()).cast(FloatDType::F32);
        let log_p = log_softmax(logits, 1);
        nll = nll + (log_p.clone().gather(1, picked.clone()) * kept.clone()).sum();
        if grads {
            let scale = kept.clone() * per_kept.clone().reshape([1, 1]);
            let d_logits = log_p
                .exp()
                .scatter(1, picked, kept.neg(), IndexingUpdateOp::Add)
                .mul(scale)
                .cast(dtype);
            d_x.push(d_logits.clone().matmul(weight.clone().transpose()));
            let part = x_block.transpose().matmul(d_logits).cast(FloatDType::F32);
            d_w = Some(match d_w {
                Some(sum) => sum + part,
                None => part,
            });
        }
    }
    let loss = nll.neg() * per_kept;
    let grads = d_w.map(|d_w| LinearCrossEntropyGrads {
        x: Tensor::cat(d_x, 0),
        weight: d_w.cast(dtype),
        scale: 1.0,
    });
    (loss, grads)
}

/// The forward of [`linear_cross_entropy_blocks`] on primitives, blocks of
/// [`block_rows`]: the loss's primitive and, with `grads`, those of `d_x`
/// and `d_w`.
pub(in crate::ops) fn blocks_on<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    targets: IntTensor<B>,
    grads: bool,
) -> (FloatTensor<B>, Option<GradPrimitives<B>>) {
    let weight = t2::<B>(weight);
    let block = block_rows(weight.dims()[1]);
    let (loss, grads) =
        linear_cross_entropy_blocks(t2(x), weight, Tensor::from_primitive(targets), block, grads);
    let grads = grads.map(|g| {
        (
            g.x.into_primitive().tensor(),
            g.weight.into_primitive().tensor(),
            g.scale,
        )
    });
    (loss.into_primitive().tensor(), grads)
}
