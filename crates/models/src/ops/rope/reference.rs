//! RoPE's plain Burn body (every backend, every dtype), on tensors and on
//! primitives (the default of [`KernelBackend::cpu_rope`] and the fallback
//! of the CPU operation for other dtypes).
//!
//! [`KernelBackend::cpu_rope`]: crate::ops::KernelBackend::cpu_rope

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

/// `x * cos + rotate_half(x) * sin` with `rotate_half([a, b]) = [-b, a]`, for
/// `x` `[batch, heads, len, head_dim]` and tables `[1, 1, len, head_dim]`.
pub fn rope_reference<B: Backend>(
    x: Tensor<B, 4>,
    cos: &Tensor<B, 4>,
    sin: &Tensor<B, 4>,
) -> Tensor<B, 4> {
    let d = x.dims()[3];
    let a = x.clone().narrow(3, 0, d / 2);
    let b = x.clone().narrow(3, d / 2, d / 2);
    let rotated = Tensor::cat(vec![b.neg(), a], 3);
    x * cos.clone() + rotated * sin.clone()
}

/// The reference RoPE ([`rope_reference`]) on primitives `x` `[batch,
/// heads, len, head_dim]`, tables `cos`, `sin` `[1, 1, len, head_dim]`.
pub(in crate::ops) fn rope_reference_on<B: Backend>(
    x: FloatTensor<B>,
    cos: FloatTensor<B>,
    sin: FloatTensor<B>,
) -> FloatTensor<B> {
    let t = |p| Tensor::<B, 4>::from_primitive(TensorPrimitive::Float(p));
    rope_reference(t(x), &t(cos), &t(sin))
        .into_primitive()
        .tensor()
}
