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
//!
//! Every implementation is in this folder; [`linear_cross_entropy`] runs
//! the one the model's [`HeadLoss`] names:
//!
//! - `reference`: the whole logits then the reference cross-entropy
//!   ([`linear_cross_entropy_reference`]), and the blocks by Burn's
//!   operations ([`linear_cross_entropy_blocks`], every backend).
//! - `node`: the autodiff node every backend's
//!   [`KernelBackend::chunked_linear_cross_entropy`] records, over the
//!   backend's [`KernelBackend::linear_cross_entropy_parts`].
//! - `cube`: the blocks on the CubeCL backends with the fused
//!   cross-entropy kernel ([`linear_cross_entropy_cube_blocks`]).
//! - `cpu`: the blocks as flex's host-buffer operation
//!   (`cpu_kernel::linear_cross_entropy_blocks`, f32; flex feature).

#[cfg(feature = "flex")]
pub(super) mod cpu;
#[cfg(feature = "flex")]
pub(super) mod cpu_kernel;
pub(super) mod cube;
pub(super) mod node;
pub(super) mod reference;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, FloatDType, Int, Tensor, TensorPrimitive};

use super::fused::KernelBackend;
use super::{cross_entropy, HeadLoss, OpImpl};
pub use cube::{grad_scale, linear_cross_entropy_cube_blocks};
pub use reference::{linear_cross_entropy_blocks, linear_cross_entropy_reference};

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

/// The primitives of `d_x` and `d_w` and the scale they carry (see
/// [`LinearCrossEntropyGrads`]).
pub(super) type GradPrimitives<B> = (FloatTensor<B>, FloatTensor<B>, f32);

/// A float primitive as a rank-2 tensor.
fn t2<B: Backend>(p: FloatTensor<B>) -> Tensor<B, 2> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

/// Mean cross-entropy (nats, `[1]`) of the head `weight` `[hidden,
/// vocab]` applied to `x` `[rows, hidden]` against `targets` `[rows]`, as
/// `head_loss` names (see `OpsChoice::linear_cross_entropy`): chunked
/// where the backend runs it, else the whole logits and the
/// cross-entropy `cross_entropy_impl` names.
pub(super) fn linear_cross_entropy<B: KernelBackend>(
    head_loss: HeadLoss,
    cross_entropy_impl: OpImpl,
    x: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
) -> Tensor<B, 1> {
    let weight = weight.cast(x.dtype());
    match head_loss {
        HeadLoss::Chunked if B::has_fused_kernels() || x.dtype() == DType::F32 => {
            Tensor::from_primitive(TensorPrimitive::Float(B::chunked_linear_cross_entropy(
                x.into_primitive().tensor(),
                weight.into_primitive().tensor(),
                targets.into_primitive(),
            )))
        }
        _ => {
            let [rows, _] = x.dims();
            let logits = x.matmul(weight).cast(FloatDType::F32);
            let vocab = logits.dims()[1];
            cross_entropy(
                cross_entropy_impl,
                logits.reshape([1, rows, vocab]),
                targets.reshape([1, rows]),
            )
        }
    }
}
