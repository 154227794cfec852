//! GELU-tanh's plain Burn body (every backend, every dtype), on tensors
//! and on a backend's primitives (the default of
//! [`KernelBackend::cpu_gelu_tanh`] and the fallback of the CPU operation
//! for other dtypes).
//!
//! [`KernelBackend::cpu_gelu_tanh`]: crate::ops::KernelBackend::cpu_gelu_tanh

use burn::tensor::activation::sigmoid;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

/// GELU with the tanh approximation (GPT-2's `gelu_new`, BLOOM's gelu):
/// `0.5 x (1 + tanh(z))` with `z = sqrt(2/pi) (x + 0.044715 x^3)`, computed as
/// the identical `x * sigmoid(2 z)`, which is about three times faster on the
/// CPU backends than `tanh` and a cube through `powf`.
pub fn gelu_tanh_reference<B: Backend>(x: Tensor<B, 3>) -> Tensor<B, 3> {
    const TWO_SQRT_2_OVER_PI: f64 = 2.0 * 0.797_884_560_802_865_4;
    let cube = x.clone() * x.clone() * x.clone();
    let z2 = (x.clone() + cube.mul_scalar(0.044715)).mul_scalar(TWO_SQRT_2_OVER_PI);
    x * sigmoid(z2)
}

/// [`gelu_tanh_reference`] on a primitive `[batch, seq, n]`.
pub(in crate::ops) fn gelu_reference_on<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    gelu_tanh_reference(Tensor::<B, 3>::from_primitive(TensorPrimitive::Float(x)))
        .into_primitive()
        .tensor()
}
