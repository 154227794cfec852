//! The output head and the cross-entropy in blocks of rows on the CubeCL
//! backends (CUDA, ROCm, wgpu), the GPU form of `linear_cross_entropy`:
//! per block, the logits `[block, hidden] x [hidden, vocab]` by Burn's
//! matmul in the compute dtype (f32, f16 or bf16), then the fused
//! cross-entropy kernel's two row passes on them (`ferrotron-kernels`'
//! `cross_entropy_rows_typed` and `cross_entropy_grad_typed`, f32
//! statistics), which overwrite the logits with their gradient, rounded
//! once to the compute dtype; then `d_x = d_logits w^T` and `d_w += x^T
//! d_logits` (summed over blocks in f32). So the `[rows, vocab]` logits,
//! probabilities and their gradient never exist for all rows: one block of
//! about [`super::BLOCK_BYTES`] at a time.
//!
//! As on the CPU, the forward forms the gradients for a fixed upstream
//! gradient and the autodiff node's backward scales them by the real one
//! (`node::LinearCrossEntropyBackward`). The fixed one is
//! [`grad_scale`], a power of two near the number of rows rather than 1:
//! each row's gradient is then `(softmax - onehot)` times about 1, not
//! `1 / rows`, before its rounding to the compute dtype. In f16 that keeps
//! small probabilities above the format's smallest values (the plain
//! path's loss scale does the same); in f32 and bf16, whose exponent range
//! is f32's, a power of two changes no rounding, so the logits' gradient
//! is rounded to the bit as the plain path rounds it for an upstream
//! gradient of 1, and the backward's division by the scale is exact.

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{FloatDType, Int, Shape, Tensor, TensorPrimitive};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use ferrotron_kernels::cross_entropy::{cross_entropy_grad_typed, cross_entropy_rows_typed};
use ferrotron_kernels::dtype::FloatDtype;

use super::{GradPrimitives, LinearCrossEntropyGrads};
use crate::ops::cross_entropy::cube::i32_targets;
use crate::ops::cube::{contiguous, empty, launched, owned, rows_hidden};
use crate::ops::fused::FusedKernels;

/// The largest [`grad_scale`]: f16 holds up to 65504, and a block's
/// gradient reaches `grad_scale / count` (one kept row of many).
const MAX_GRAD_SCALE: usize = 1 << 14;

/// The upstream gradient the blocks form the gradients for: `rows` rounded
/// up to a power of two, at most 2^14.
pub fn grad_scale(rows: usize) -> f32 {
    rows.next_power_of_two().min(MAX_GRAD_SCALE) as f32
}

/// A float primitive as a tensor of rank `D`.
fn t<B: FusedKernels, const D: usize>(p: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

/// The mean cross-entropy (nats per kept token, f32 `[1]`) of `x` `[rows,
/// hidden]` times `weight` `[hidden, vocab]` (both in the compute dtype)
/// against `targets` `[rows]` (negative: ignored; every target ignored
/// gives 0), `block` rows at a time (see the module documentation), and
/// with `grads` the gradients for an upstream gradient of
/// [`grad_scale`]`(rows)`: `x`'s in its dtype, the weight's in f32.
pub fn linear_cross_entropy_cube_blocks<B: FusedKernels>(
    x: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    block: usize,
    grads: bool,
) -> (Tensor<B, 1>, Option<LinearCrossEntropyGrads<B>>) {
    let rows = x.dims()[0];
    assert!(rows > 0 && block > 0, "linear cross-entropy of no rows");
    let scale = grad_scale(rows);
    let kept = targets
        .clone()
        .greater_equal_elem(0)
        .float()
        .cast(FloatDType::F32)
        .sum();
    let mut nll = Tensor::<B, 1>::zeros([1], &x.device());
    let mut d_x = Vec::new();
    let mut d_w: Option<Tensor<B, 2>> = None;
    for start in (0..rows).step_by(block) {
        let len = block.min(rows - start);
        let x_block = x.clone().narrow(0, start, len);
        let logits = x_block.clone().matmul(weight.clone());
        let (row_loss, d_logits) = B::cross_entropy_block(
            logits.into_primitive().tensor(),
            targets.clone().narrow(0, start, len).into_primitive(),
            grads.then(|| kept.clone().into_primitive().tensor()),
            scale,
        );
        nll = nll + t::<B, 1>(row_loss).sum();
        if let Some(d_logits) = d_logits {
            let d_logits = t::<B, 2>(d_logits);
            d_x.push(d_logits.clone().matmul(weight.clone().transpose()));
            let part = x_block.transpose().matmul(d_logits).cast(FloatDType::F32);
            d_w = Some(match d_w {
                Some(sum) => sum + part,
                None => part,
            });
        }
    }
    let loss = nll / kept.clamp_min(1.0);
    let grads = d_w.map(|d_w| LinearCrossEntropyGrads {
        x: Tensor::cat(d_x, 0),
        weight: d_w,
        scale,
    });
    (loss, grads)
}

/// [`linear_cross_entropy_cube_blocks`] on primitives: the loss's
/// primitive and, with `grads`, those of `d_x` and `d_w` with their scale.
pub(in crate::ops) fn parts<B: FusedKernels>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    targets: IntTensor<B>,
    block: usize,
    grads: bool,
) -> (FloatTensor<B>, Option<GradPrimitives<B>>) {
    let (loss, grads) = linear_cross_entropy_cube_blocks::<B>(
        t(x),
        t(weight),
        Tensor::from_primitive(targets),
        block,
        grads,
    );
    let grads = grads.map(|g| {
        (
            g.x.into_primitive().tensor(),
            g.weight.into_primitive().tensor(),
            g.scale,
        )
    });
    (loss.into_primitive().tensor(), grads)
}

/// One block's cross-entropy kernels (what
/// `FusedKernels::cross_entropy_block` runs): each row's loss (f32
/// `[rows]`) of `logits` `[rows, vocab]` (f32, f16 or bf16) against
/// `targets` `[rows]`, and with `count` the logits' gradient over their
/// buffer when nothing else holds it.
pub(in crate::ops) fn block<R: CubeRuntime>(
    logits: CubeTensor<R>,
    targets: CubeTensor<R>,
    count: Option<CubeTensor<R>>,
    grad_scale: f32,
) -> (CubeTensor<R>, Option<CubeTensor<R>>) {
    let targets = i32_targets(targets);
    let dtype = FloatDtype::from_elem_type(logits.dtype.into())
        .unwrap_or_else(|| panic!("fused cross_entropy_block: {:?} logits", logits.dtype));
    let targets = contiguous(targets);
    let logits = if count.is_some() {
        owned(logits)
    } else {
        contiguous(logits)
    };
    let (rows, vocab) = rows_hidden(&logits);
    let row_loss = empty(&logits, Shape::new([rows]));
    let lse = empty(&logits, Shape::new([rows]));
    let client = logits.client.clone();
    launched(
        "cross_entropy_block",
        cross_entropy_rows_typed(
            &client,
            dtype,
            &logits.handle,
            &targets.handle,
            &row_loss.handle,
            &lse.handle,
            rows,
            vocab,
        ),
    );
    let grad = count.map(|count| {
        let count = contiguous(count);
        launched(
            "cross_entropy_block",
            cross_entropy_grad_typed(
                &client,
                dtype,
                &logits.handle,
                &targets.handle,
                &lse.handle,
                &count.handle,
                rows,
                vocab,
                grad_scale,
            ),
        );
        logits
    });
    (row_loss, grad)
}
