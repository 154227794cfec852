//! First step of the FlashAttention-2 backward: `delta = rowsum(dO * O)`.

use cubecl::prelude::*;

/// `delta[r] = sum_d d_out[r, d] * out[r, d]` for every query row `r` of
/// `out` and `d_out` (`[batch, n_heads, seq, head_dim]`); `delta` is
/// `[batch, n_heads, seq]`. One unit per row; cube grid as in the forward
/// kernel: `x` = tile of `CUBE_DIM_X` rows, `y` = `batch * n_heads + head`.
#[cube(launch)]
pub(crate) fn attention_delta_kernel<F: Float>(
    out: &Array<F>,
    d_out: &Array<F>,
    delta: &mut Array<F>,
    seq: u32,
    #[comptime] head_dim: usize,
) {
    let seq = seq as usize;
    let query = CUBE_POS_X as usize * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    if query < seq {
        let row = CUBE_POS_Y as usize * seq + query;
        let base = row * head_dim;
        let mut sum = F::new(0.0);
        for d in 0..head_dim {
            sum += d_out[base + d] * out[base + d];
        }
        delta[row] = sum;
    }
}
