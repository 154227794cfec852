//! SwiGLU's gating `silu(gate) * up`.

use burn::tensor::activation::silu;
use burn::tensor::{Tensor, TensorPrimitive};

use super::fused::KernelBackend;
use super::OpImpl;

/// `silu(gate) * up` elementwise, `gate` and `up` of the same shape
/// (`[batch, seq, ffn]` in the decoder) and dtype. The reference computes
/// in that dtype; the fused kernel reads and writes it, computing in f32
/// and rounding once; the CPU operation ([`KernelBackend::cpu_swiglu`])
/// is one pass each way on flex in f32 (rank 3). `op` is an [`OpImpl`] or a
/// `Kernels` value.
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

/// The plain Burn body of [`swiglu`].
pub(super) fn swiglu_reference<B: KernelBackend, const D: usize>(
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
) -> Tensor<B, D> {
    silu(gate) * up
}
