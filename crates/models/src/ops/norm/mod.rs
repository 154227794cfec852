//! RMSNorm and LayerNorm over the last dimension, every implementation in
//! this folder: [`rms_norm`] and [`layer_norm`] run the one their
//! [`OpImpl`] names.
//!
//! - `reference`: the plain Burn bodies (every backend, every dtype).
//! - `cube`: the CubeCL kernels of `ferrotron_kernels::norm` launched on
//!   the backend's buffers (f32), and the autodiff nodes whose backward is
//!   the kernels' backward ([`KernelBackend::fused_rms_norm`],
//!   [`KernelBackend::fused_layer_norm`]).
//! - `cpu`: flex's one-pass host-buffer operations (`cpu_kernel::rms_norm`,
//!   `layer_norm`, `norm_backward`) as one autodiff node each
//!   ([`KernelBackend::cpu_rms_norm`], [`KernelBackend::cpu_layer_norm`];
//!   flex feature).
//!
//! The backend traits must be implemented in one place per backend; their
//! norm methods delegate here in one line.

#[cfg(feature = "flex")]
pub(super) mod cpu;
#[cfg(feature = "flex")]
pub(super) mod cpu_kernel;
pub(super) mod cube;
pub(super) mod reference;

use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use super::fused::KernelBackend;
use super::OpImpl;
use reference::{layer_norm_reference, rms_norm_reference};

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
