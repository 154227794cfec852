//! The bias add's plain Burn body (every backend, every dtype).

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

/// `y + bias` over the rows of `y` `[rows, n]`: the bias `[n]` cast to
/// `y`'s dtype, then broadcast-added (mixed precision: the cast's backward
/// brings the gradient back to the bias's dtype).
pub(in crate::ops) fn bias_add_reference<B: Backend>(
    y: Tensor<B, 2>,
    bias: Tensor<B, 1>,
) -> Tensor<B, 2> {
    let bias = bias.cast(y.dtype()).unsqueeze_dim(0);
    y + bias
}
