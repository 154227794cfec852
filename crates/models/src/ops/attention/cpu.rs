//! The attention core on flex's host buffers (`cpu_kernel`, f32), what
//! flex's `KernelBackend::attention_core` and `attention_core_backward`
//! run; inputs that are not all f32 (mixed precision) take the reference.
//! The autodiff node over them is `recompute`'s, with its host core.

use burn::backend::flex::FlexTensor;
use burn::backend::Flex;

use super::cpu_kernel::{attention_backward, attention_forward};
use super::reference::{attention_reference_backward_on, attention_reference_on};
use crate::ops::cpu::all_f32;

/// `softmax(q k^T / sqrt(head_dim) + bias) v` (shapes of
/// `KernelBackend::attention_core`).
pub(in crate::ops) fn forward(
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    bias: FlexTensor,
) -> FlexTensor {
    if all_f32(&[&q, &k, &v, &bias]) {
        return attention_forward(q, k, v, bias);
    }
    attention_reference_on::<Flex>(q, k, v, bias)
}

/// `[dq, dk, dv]` of [`forward`] for `d_out`, the probabilities recomputed.
pub(in crate::ops) fn backward(
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    bias: FlexTensor,
    d_out: FlexTensor,
) -> [FlexTensor; 3] {
    if all_f32(&[&q, &k, &v, &bias, &d_out]) {
        return attention_backward(q, k, v, bias, d_out);
    }
    attention_reference_backward_on::<Flex>(q, k, v, bias, d_out)
}
