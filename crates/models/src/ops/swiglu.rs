//! SwiGLU's gating `silu(gate) * up`.

use burn::tensor::activation::silu;
use burn::tensor::{Tensor, TensorPrimitive};

use super::fused::KernelBackend;
use crate::config::Kernels;

/// `silu(gate) * up` elementwise, `gate` and `up` of the same shape
/// (`[batch, seq, ffn]` in the decoder) and dtype. The reference computes
/// in that dtype; the fused kernel reads and writes it, computing in f32
/// and rounding once.
pub fn swiglu<B: KernelBackend, const D: usize>(
    kernels: Kernels,
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
) -> Tensor<B, D> {
    match kernels {
        Kernels::Fused => Tensor::from_primitive(TensorPrimitive::Float(B::fused_swiglu(
            gate.into_primitive().tensor(),
            up.into_primitive().tensor(),
        ))),
        Kernels::Reference => swiglu_reference(gate, up),
    }
}

/// The plain Burn body of [`swiglu`].
pub(super) fn swiglu_reference<B: KernelBackend, const D: usize>(
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
) -> Tensor<B, D> {
    silu(gate) * up
}
