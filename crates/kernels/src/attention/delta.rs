//! First step of the FlashAttention-2 backward: `delta = rowsum(dO * O)`.

use cubecl::prelude::*;

use crate::dtype::load;

/// `delta[r] = sum_d d_out[r, d] * out[r, d]` for every query row `r` of
/// `out` and `d_out` (`[batch, n_heads, seq, head_dim]`); `delta` is
/// `[batch, n_heads, seq]` (f32, summed in f32). One unit per row; cube grid as in the forward
/// kernel: `x` = tile of `CUBE_DIM_X` rows, `y` = `batch * n_heads + head`.
#[cube(launch)]
pub(crate) fn attention_delta_kernel<F: Float>(
    out: &Array<F>,
    d_out: &Array<F>,
    delta: &mut Array<f32>,
    seq: u32,
    #[comptime] head_dim: usize,
    #[comptime] round_bf16: bool,
) {
    let seq = seq as usize;
    let query = CUBE_POS_X as usize * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    if query < seq {
        let row = CUBE_POS_Y as usize * seq + query;
        let base = row * head_dim;
        let mut sum = 0.0f32;
        for d in 0..head_dim {
            sum += load::<F>(d_out[base + d], round_bf16) * load::<F>(out[base + d], round_bf16);
        }
        delta[row] = sum;
    }
}
