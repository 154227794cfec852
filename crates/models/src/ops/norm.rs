//! RMSNorm and LayerNorm over the last dimension.

use burn::tensor::{Tensor, TensorPrimitive};

use super::fused::KernelBackend;
use crate::config::Kernels;

/// `x / sqrt(mean(x^2) + eps) * weight` over the last dimension of `x`
/// `[batch, seq, hidden]`; `weight` `[hidden]`.
pub fn rms_norm<B: KernelBackend>(
    kernels: Kernels,
    x: Tensor<B, 3>,
    weight: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, 3> {
    match kernels {
        Kernels::Fused => Tensor::from_primitive(TensorPrimitive::Float(B::fused_rms_norm(
            x.into_primitive().tensor(),
            weight.into_primitive().tensor(),
            eps as f32,
        ))),
        Kernels::Reference => rms_norm_reference(x, weight, eps),
    }
}

/// The plain Burn body of [`rms_norm`].
pub(super) fn rms_norm_reference<B: KernelBackend>(
    x: Tensor<B, 3>,
    weight: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, 3> {
    let ms = (x.clone() * x.clone()).mean_dim(2);
    x / ms.add_scalar(eps).sqrt() * weight.unsqueeze::<3>()
}

/// `(x - mean) / sqrt(var + eps) * weight + bias` (biased variance) over the
/// last dimension of `x` `[batch, seq, hidden]`; `weight`, `bias` `[hidden]`.
pub fn layer_norm<B: KernelBackend>(
    kernels: Kernels,
    x: Tensor<B, 3>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, 3> {
    match kernels {
        Kernels::Fused => Tensor::from_primitive(TensorPrimitive::Float(B::fused_layer_norm(
            x.into_primitive().tensor(),
            weight.into_primitive().tensor(),
            bias.into_primitive().tensor(),
            eps as f32,
        ))),
        Kernels::Reference => layer_norm_reference(x, weight, bias, eps),
    }
}

/// The plain Burn body of [`layer_norm`].
pub(super) fn layer_norm_reference<B: KernelBackend>(
    x: Tensor<B, 3>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, 3> {
    let centred = x.clone() - x.mean_dim(2);
    let var = (centred.clone() * centred.clone()).mean_dim(2);
    centred / var.add_scalar(eps).sqrt() * weight.unsqueeze::<3>() + bias.unsqueeze::<3>()
}
