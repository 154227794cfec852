//! GELU with the tanh approximation (GPT-2's `gelu_new`, BLOOM's gelu),
//! every implementation in this folder: [`gelu_tanh`] runs the one its
//! [`OpImpl`] names.
//!
//! - `reference`: the plain Burn body (every backend, every dtype).
//! - `cube`: the CubeCL kernels of `ferrotron_kernels::gelu` launched on
//!   the backend's buffers, and the autodiff node whose backward is the
//!   kernels' backward ([`KernelBackend::fused_gelu_tanh`]).
//! - `cpu`: flex's one-pass host-buffer operation (`cpu_kernel::gelu_tanh`)
//!   as one autodiff node ([`KernelBackend::cpu_gelu_tanh`], flex
//!   feature).

#[cfg(feature = "flex")]
pub(super) mod cpu;
#[cfg(feature = "flex")]
pub(super) mod cpu_kernel;
pub(super) mod cube;
pub(super) mod reference;

use burn::tensor::{Tensor, TensorPrimitive};

use super::fused::KernelBackend;
use super::OpImpl;
pub use reference::gelu_tanh_reference;

/// GELU-tanh of `x` `[batch, seq, n]` (see [`gelu_tanh_reference`]) by the
/// implementation `op` names. The reference computes in `x`'s dtype; the
/// fused kernel reads and writes it, computing in f32 and rounding once;
/// the CPU operation is one pass each way on flex in f32.
pub(super) fn gelu_tanh<B: KernelBackend>(op: OpImpl, x: Tensor<B, 3>) -> Tensor<B, 3> {
    let float = |p| Tensor::from_primitive(TensorPrimitive::Float(p));
    match op {
        OpImpl::Reference => gelu_tanh_reference(x),
        OpImpl::Fused => float(B::fused_gelu_tanh(x.into_primitive().tensor())),
        OpImpl::Cpu => float(B::cpu_gelu_tanh(x.into_primitive().tensor())),
    }
}
