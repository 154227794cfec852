//! SwiGLU's plain Burn body, on tensors and on a backend's primitives
//! (the default of [`KernelBackend::cpu_swiglu`] and the fallback of the
//! CPU operation for other dtypes).

use burn::tensor::activation::silu;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use crate::ops::KernelBackend;

/// `silu(gate) * up` by Burn's operations, in the inputs' dtype.
pub(in crate::ops) fn swiglu_reference<B: KernelBackend, const D: usize>(
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
) -> Tensor<B, D> {
    silu(gate) * up
}

/// [`swiglu_reference`] on primitives `[batch, seq, n]`.
pub(in crate::ops) fn swiglu_reference_on<B: KernelBackend>(
    gate: FloatTensor<B>,
    up: FloatTensor<B>,
) -> FloatTensor<B> {
    let tensor = |p| Tensor::<B, 3>::from_primitive(TensorPrimitive::Float(p));
    swiglu_reference(tensor(gate), tensor(up))
        .into_primitive()
        .tensor()
}
