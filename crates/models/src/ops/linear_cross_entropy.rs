//! The output head and the cross-entropy as one operation over blocks of
//! rows: each block's logits `[block, hidden] x [hidden, vocab]`, its
//! log-softmax, the target pick and, when training, its share of the
//! gradients, so the `[rows, vocab]` logits, probabilities and their
//! gradient never exist whole (the head's three 412 MB tensors of shape A in
//! README's step profile).
//!
//! The loss is the model's last operation and its upstream gradient a
//! scalar, so the tracked forward forms the gradients of `x` and of the
//! weight for an upstream gradient of 1 and keeps only those (as Liger
//! Kernel's fused linear cross-entropy does); the backward scales them.
//! That costs the same three matmuls as the plain path and recomputes
//! nothing.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{FloatDType, IndexingUpdateOp, Int, Tensor, TensorPrimitive};

use super::cross_entropy;
use super::fused::KernelBackend;
use crate::config::Kernels;

/// The logits one block aims at, in bytes. Each block streams the head's
/// weight through three GEMMs (packed each time on the CPU, read from
/// memory each time on a GPU), so fewer, larger blocks read it less often:
/// 128 MiB ran shape A's CPU step 1.2 to 2.9 % faster than 64 MiB (README,
/// Benchmarks), for a larger transient buffer. It is also the largest
/// storage buffer wgpu gives on lavapipe.
pub const BLOCK_BYTES: usize = 128 << 20;

/// Rows per block for a vocabulary of `vocab` tokens and f32 logits (the
/// CPU backends): [`block_rows_of`] with 4 bytes (656 rows for GPT-2's
/// 50304, 1040 for Llama's 32000).
pub fn block_rows(vocab: usize) -> usize {
    block_rows_of(vocab, 4)
}

/// Rows per block for a vocabulary of `vocab` tokens and logits of
/// `elem_bytes` bytes each: about [`BLOCK_BYTES`] of logits, a multiple of
/// 16, at least 16 (on a GPU in bf16: 1328 rows for GPT-2's 50304, 512 for
/// Llama 3's 128256).
pub fn block_rows_of(vocab: usize, elem_bytes: usize) -> usize {
    (BLOCK_BYTES / (elem_bytes.max(1) * vocab.max(1)) / 16 * 16).max(16)
}

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

/// The gradients of the mean loss with respect to `x` `[rows, hidden]` and
/// the weight `[hidden, vocab]` for an upstream gradient of `scale` (a
/// power of two): the gradients of the loss are these divided by `scale`.
/// `x` is in `x`'s dtype, `weight` in its dtype or f32 (a sum over blocks
/// kept in f32 for the backward to scale before it rounds).
pub struct LinearCrossEntropyGrads<B: Backend> {
    /// `[rows, hidden]`.
    pub x: Tensor<B, 2>,
    /// `[hidden, vocab]`.
    pub weight: Tensor<B, 2>,
    /// What the gradients are scaled by: 1 for
    /// [`linear_cross_entropy_blocks`], see
    /// `linear_cross_entropy_cube_blocks` for the CubeCL backends.
    pub scale: f32,
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

/// The primitives of `d_x` and `d_w` and the scale they carry (see
/// [`LinearCrossEntropyGrads`]).
pub(super) type GradPrimitives<B> = (FloatTensor<B>, FloatTensor<B>, f32);

/// A float primitive as a rank-2 tensor.
fn t2<B: Backend>(p: FloatTensor<B>) -> Tensor<B, 2> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

/// The forward of [`linear_cross_entropy_blocks`] on primitives, blocks of
/// [`block_rows`]: the loss's primitive and, with `grads`, those of `d_x`
/// and `d_w`.
pub(super) fn blocks_on<B: Backend>(
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

/// The forward alone on a backend without autodiff (evaluation): the loss
/// `[1]` of [`linear_cross_entropy_blocks`].
pub(super) fn forward_only<B: KernelBackend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    targets: IntTensor<B>,
) -> FloatTensor<B> {
    B::linear_cross_entropy_parts(x, weight, targets, false).0
}

#[derive(Debug)]
struct LinearCrossEntropyBackward;

impl<B: Backend> Backward<B, 2> for LinearCrossEntropyBackward {
    /// `d_x` and `d_w` for an upstream gradient of the scale they carry.
    type State = GradPrimitives<B>;

    /// Each gradient times `upstream / scale`, multiplied in f32 and
    /// rounded once to `x`'s dtype, as the plain path rounds the logits'
    /// gradient once after the upstream gradient reached it (in f16 the
    /// loss scale must reach it before the rounding).
    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let upstream = t2::<B>(B::float_reshape(
            grads.consume::<B>(&ops.node),
            burn::tensor::Shape::new([1, 1]),
        ));
        let (d_x, d_w, scale) = ops.state;
        let dtype = t2::<B>(d_x.clone()).dtype();
        let factor = upstream.cast(FloatDType::F32).mul_scalar(1.0 / scale);
        for (parent, grad) in ops.parents.into_iter().zip([d_x, d_w]) {
            if let Some(node) = parent {
                let grad = (t2::<B>(grad).cast(FloatDType::F32) * factor.clone()).cast(dtype);
                grads.register::<B>(node.id, grad.into_primitive().tensor());
            }
        }
    }
}

/// The operation as one node of the autodiff graph over `B`, whose parents
/// are `x` and the weight (shapes of [`linear_cross_entropy_blocks`]).
pub(super) fn autodiff_node<B: KernelBackend, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    targets: IntTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let targets: IntTensor<B> = targets;
    let nodes = [x.node.clone(), weight.node.clone()];
    match LinearCrossEntropyBackward
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (loss, grads) =
                B::linear_cross_entropy_parts(x.primitive, weight.primitive, targets, true);
            let grads = grads.expect("the tracked forward forms the gradients");
            prep.finish(grads, loss)
        }
        OpsKind::UnTracked(prep) => {
            prep.finish(forward_only::<B>(x.primitive, weight.primitive, targets))
        }
    }
}
