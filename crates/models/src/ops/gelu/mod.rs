//! GELU with the tanh approximation (GPT-2's `gelu_new`, BLOOM's gelu),
//! every implementation in this folder: [`gelu_tanh`] runs the one its
//! [`OpImpl`] names.
//!
//! - `reference`: the plain Burn body (every backend, every dtype).
//! - `cpu`: flex's one-pass host-buffer operation (`cpu_kernel::gelu_tanh`)
//!   as one autodiff node ([`KernelBackend::cpu_gelu_tanh`], flex
//!   feature).
//!
//! GELU has no CubeCL kernel: [`OpImpl::Fused`] runs the reference.

#[cfg(feature = "flex")]
pub(super) mod cpu;
#[cfg(feature = "flex")]
pub(super) mod cpu_kernel;
pub(super) mod reference;

use burn::tensor::{Tensor, TensorPrimitive};

use super::fused::KernelBackend;
use super::OpImpl;
pub use reference::gelu_tanh_reference;

/// GELU-tanh of `x` `[batch, seq, n]` (see [`gelu_tanh_reference`]) by the
/// implementation `op` names: the CPU operation for [`OpImpl::Cpu`], the
/// reference otherwise.
pub(super) fn gelu_tanh<B: KernelBackend>(op: OpImpl, x: Tensor<B, 3>) -> Tensor<B, 3> {
    match op {
        OpImpl::Cpu => Tensor::from_primitive(TensorPrimitive::Float(B::cpu_gelu_tanh(
            x.into_primitive().tensor(),
        ))),
        OpImpl::Fused | OpImpl::Reference => gelu_tanh_reference(x),
    }
}
