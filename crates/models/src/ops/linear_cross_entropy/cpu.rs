//! The head's blocks as Ferrotron's CPU operation on flex
//! (`cpu_kernel::linear_cross_entropy_blocks`: one GEMM per block into a
//! reused buffer, the loss and the logits' gradient in place), what flex's
//! [`KernelBackend::linear_cross_entropy_parts`] runs; inputs that are not
//! f32 take Burn's blocks.
//!
//! [`KernelBackend::linear_cross_entropy_parts`]: crate::ops::KernelBackend::linear_cross_entropy_parts

use burn::backend::flex::FlexTensor;
use burn::backend::Flex;

use super::cpu_kernel;
use super::reference::blocks_on;
use super::{block_rows, GradPrimitives};
use crate::ops::cpu::all_f32;

/// The loss (f32 `[1]`) of `x` `[rows, hidden]` times `weight` `[hidden,
/// vocab]` against `targets` `[rows]` and, with `grads`, the gradients of
/// `x` and `weight` for an upstream gradient of 1, in blocks of
/// [`block_rows`].
pub(in crate::ops) fn parts(
    x: FlexTensor,
    weight: FlexTensor,
    targets: FlexTensor,
    grads: bool,
) -> (FlexTensor, Option<GradPrimitives<Flex>>) {
    let block = block_rows(weight.layout().shape().dims::<2>()[1]);
    if all_f32(&[&x, &weight]) {
        let (loss, grads) =
            cpu_kernel::linear_cross_entropy_blocks(x, weight, targets, block, grads);
        (loss, grads.map(|(d_x, d_w)| (d_x, d_w, 1.0)))
    } else {
        blocks_on::<Flex>(x, weight, targets, grads)
    }
}
