//! RMSNorm and LayerNorm over the last dimension.

use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use super::fused::KernelBackend;
use super::OpImpl;

/// `x / sqrt(mean(x^2) + eps) * weight` over the last dimension of `x`
/// `[batch, seq, hidden]`; `weight` `[hidden]`. `op` is an [`OpImpl`] or
/// a `Kernels` value ([`OpImpl::Cpu`]: [`KernelBackend::cpu_rms_norm`]).
pub fn rms_norm<B: KernelBackend>(
    op: impl Into<OpImpl>,
    x: Tensor<B, 3>,
    weight: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, 3> {
    match op.into() {
        OpImpl::Reference => rms_norm_reference(x, weight, eps),
        OpImpl::Fused => float(B::fused_rms_norm(prim(x), prim(weight), eps as f32)),
        OpImpl::Cpu => float(B::cpu_rms_norm(prim(x), prim(weight), eps)),
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
/// `op` as [`rms_norm`] ([`OpImpl::Cpu`]: [`KernelBackend::cpu_layer_norm`]).
pub fn layer_norm<B: KernelBackend>(
    op: impl Into<OpImpl>,
    x: Tensor<B, 3>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, 3> {
    match op.into() {
        OpImpl::Reference => layer_norm_reference(x, weight, bias, eps),
        OpImpl::Fused => float(B::fused_layer_norm(
            prim(x),
            prim(weight),
            prim(bias),
            eps as f32,
        )),
        OpImpl::Cpu => float(B::cpu_layer_norm(prim(x), prim(weight), prim(bias), eps)),
    }
}

/// A tensor's float primitive.
fn prim<B: KernelBackend, const D: usize>(t: Tensor<B, D>) -> FloatTensor<B> {
    t.into_primitive().tensor()
}

/// A float primitive as a tensor of rank `D`.
fn float<B: KernelBackend, const D: usize>(p: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
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
