//! SwiGLU's gating `silu(gate) * up`.

use burn::tensor::activation::silu;
use burn::tensor::{Tensor, TensorPrimitive};

use super::fused::KernelBackend;
use crate::config::Kernels;

/// `silu(gate) * up` elementwise, `gate` and `up` of the same shape
/// (`[batch, seq, ffn]` in the decoder).
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
        Kernels::Reference => silu(gate) * up,
    }
}
