//! The norms' plain Burn bodies (every backend, every dtype), on tensors
//! and on primitives (what the backend traits' defaults and the CPU
//! operations' fallbacks for other dtypes run).

use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use crate::ops::fused::KernelBackend;

/// A float primitive as a tensor of rank `D`.
fn t<B: KernelBackend, const D: usize>(p: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

/// The plain Burn body of [`super::rms_norm`].
pub(in crate::ops) fn rms_norm_reference<B: KernelBackend>(
    x: Tensor<B, 3>,
    weight: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, 3> {
    let ms = (x.clone() * x.clone()).mean_dim(2);
    x / ms.add_scalar(eps).sqrt() * weight.unsqueeze::<3>()
}

/// The plain Burn body of [`super::layer_norm`].
pub(in crate::ops) fn layer_norm_reference<B: KernelBackend>(
    x: Tensor<B, 3>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, 3> {
    let centred = x.clone() - x.mean_dim(2);
    let var = (centred.clone() * centred.clone()).mean_dim(2);
    centred / var.add_scalar(eps).sqrt() * weight.unsqueeze::<3>() + bias.unsqueeze::<3>()
}

/// The reference RMSNorm on primitives `x` `[batch, seq, hidden]`,
/// `weight` `[hidden]`.
pub(in crate::ops) fn rms_norm_reference_on<B: KernelBackend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    eps: f64,
) -> FloatTensor<B> {
    rms_norm_reference(t::<B, 3>(x), t::<B, 1>(weight), eps)
        .into_primitive()
        .tensor()
}

/// The reference LayerNorm on primitives `x` `[batch, seq, hidden]`,
/// `weight` and `bias` `[hidden]`.
pub(in crate::ops) fn layer_norm_reference_on<B: KernelBackend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: FloatTensor<B>,
    eps: f64,
) -> FloatTensor<B> {
    layer_norm_reference(t::<B, 3>(x), t::<B, 1>(weight), t::<B, 1>(bias), eps)
        .into_primitive()
        .tensor()
}
