//! SwiGLU's gating `silu(gate) * up`, every implementation in this folder:
//! [`swiglu`] runs the one its [`OpImpl`] names.
//!
//! - `reference`: the plain Burn body (every backend, every dtype).
//! - `cube`: the CubeCL kernels of `ferrotron_kernels::swiglu` launched on
//!   the backend's buffers, and the autodiff node whose backward is the
//!   kernels' backward ([`KernelBackend::fused_swiglu`]).
//! - `cpu`: flex's one-pass host-buffer operation (`cpu_kernel::swiglu`) as
//!   one autodiff node ([`KernelBackend::cpu_swiglu`], flex feature).
//!
//! The backend traits (`KernelBackend`, `FusedKernels`) must be implemented
//! in one place per backend; their SwiGLU methods delegate here in one line.

#[cfg(feature = "flex")]
pub(super) mod cpu;
#[cfg(feature = "flex")]
pub(super) mod cpu_kernel;
pub(super) mod cube;
pub(super) mod reference;

use burn::tensor::{Tensor, TensorPrimitive};

use super::fused::KernelBackend;
use super::OpImpl;
pub(super) use reference::swiglu_reference;

/// `silu(gate) * up` elementwise, `gate` and `up` of the same shape
/// (`[batch, seq, ffn]` in the decoder) and dtype. The reference computes
/// in that dtype; the fused kernel reads and writes it, computing in f32
/// and rounding once; the CPU operation is one pass each way on flex in
/// f32 (`[batch, seq, n]`). `op` is an [`OpImpl`] or a `Kernels` value.
pub fn swiglu<B: KernelBackend, const D: usize>(
    op: impl Into<OpImpl>,
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
) -> Tensor<B, D> {
    let prim = |t: Tensor<B, D>| t.into_primitive().tensor();
    let float = |p| Tensor::from_primitive(TensorPrimitive::Float(p));
    match op.into() {
        OpImpl::Reference => swiglu_reference(gate, up),
        OpImpl::Fused => float(B::fused_swiglu(prim(gate), prim(up))),
        OpImpl::Cpu => float(B::cpu_swiglu(prim(gate), prim(up))),
    }
}
