//! A linear layer's bias add, `y + bias` over the rows of `y` `[rows, n]`
//! with the bias `[n]`, every implementation in this folder: [`bias_add`]
//! runs the one its [`OpImpl`] names.
//!
//! - `reference`: the plain Burn body (every backend, every dtype): the
//!   bias cast to `y`'s dtype and broadcast-added; its gradient is Burn's
//!   sum over the rows, cast back to the bias's dtype.
//! - `cube`: the CubeCL kernels of `ferrotron_kernels::bias`: the f32 bias
//!   added inside the kernel with one rounding, and the gradient as the
//!   kernels' fixed-order column sum in f32 ([`KernelBackend::fused_bias_add`]).
//!
//! There is no CPU operation: [`OpImpl::Cpu`] runs the reference.

pub(super) mod cube;
pub(super) mod reference;

use burn::tensor::{Tensor, TensorPrimitive};

use super::fused::KernelBackend;
use super::OpImpl;
use reference::bias_add_reference;

/// `y + bias` for `y` `[rows, n]` in the compute dtype and the parameter
/// `bias` `[n]` (f32 in every precision), in `y`'s dtype, by the
/// implementation `op` names.
pub(super) fn bias_add<B: KernelBackend>(
    op: OpImpl,
    y: Tensor<B, 2>,
    bias: Tensor<B, 1>,
) -> Tensor<B, 2> {
    match op {
        OpImpl::Fused => Tensor::from_primitive(TensorPrimitive::Float(B::fused_bias_add(
            y.into_primitive().tensor(),
            bias.into_primitive().tensor(),
        ))),
        OpImpl::Reference | OpImpl::Cpu => bias_add_reference(y, bias),
    }
}
