//! The token embedding lookup, `table[ids]` for the table `[vocab, dim]`
//! and `ids` `[tokens]`, every implementation in this folder:
//! [`embedding`] runs the one its [`OpImpl`] names.
//!
//! - the reference: Burn's `select` (every backend, every dtype); its
//!   gradient is Burn's `select_assign`, which on the CubeCL backends
//!   gives each column one unit walking every token.
//! - `cube`: the same `select` forward, and the gradient by
//!   `ferrotron_kernels::embedding` (the table's rows spread over
//!   [`ferrotron_kernels::embedding::BUCKETS`] times as many units, each
//!   element still summed over its tokens in token order;
//!   [`KernelBackend::fused_embedding`]).
//!
//! There is no CPU operation: [`OpImpl::Cpu`] runs the reference.

pub(super) mod cube;

use burn::tensor::{Int, Tensor, TensorPrimitive};

use super::fused::KernelBackend;
use super::OpImpl;

/// The rows `ids` `[tokens]` of `table` `[vocab, dim]`, `[tokens, dim]` in
/// the table's dtype, by the implementation `op` names.
pub(super) fn embedding<B: KernelBackend>(
    op: OpImpl,
    table: Tensor<B, 2>,
    ids: Tensor<B, 1, Int>,
) -> Tensor<B, 2> {
    match op {
        OpImpl::Fused => Tensor::from_primitive(TensorPrimitive::Float(B::fused_embedding(
            table.into_primitive().tensor(),
            ids.into_primitive(),
        ))),
        OpImpl::Reference | OpImpl::Cpu => table.select(0, ids),
    }
}
