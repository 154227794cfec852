//! First step of the FlashAttention-2 backward: `delta = rowsum(dO * O)`.

use cubecl::prelude::*;

/// `delta[r] = sum_d d_out[r, d] * out[r, d]` for every row `r` of the
/// `[rows, head_dim]` matrices `out` and `d_out` (`rows = batch * n_heads *
/// seq`); `delta` is `[rows]`. One unit per row, cubes along `x`.
#[cube(launch)]
pub(crate) fn attention_delta_kernel<F: Float>(
    out: &Array<F>,
    d_out: &Array<F>,
    delta: &mut Array<F>,
    rows: u32,
    #[comptime] head_dim: usize,
) {
    let row = ABSOLUTE_POS_X as usize;
    if row < rows as usize {
        let base = row * head_dim;
        let mut sum = F::new(0.0);
        for d in 0..head_dim {
            sum += d_out[base + d] * out[base + d];
        }
        delta[row] = sum;
    }
}
