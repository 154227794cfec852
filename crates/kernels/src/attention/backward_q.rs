//! FlashAttention-2 backward, query side: dQ, recomputing the probabilities
//! from the saved log-sum-exp.

use cubecl::prelude::*;

use crate::dtype::{load, store};

use super::tiles::{alibi_bias, visible, KEYS_PER_STEP};

/// Each unit computes `dq` for one query row of one `(batch, head)`; its
/// scaled `q`, `d_out` and `dq` rows live in local memory. It walks the keys
/// the row can see `KEYS_PER_STEP` at a time: one pass over `head_dim`
/// computes the step's scores and `d_out . v` (kept in registers), one more
/// adds `ds_j k_j` to `dq`, where `p = exp(scale * q.k + bias - lse)`,
/// `ds = p * (d_out.v - delta)` and finally `dq = scale * sum_j ds_j k_j`.
/// The units of a cube read the same K/V rows from global memory; there is
/// no shared memory and no barrier.
///
/// Cube grid: `x` = tile of `CUBE_DIM_X` query rows, `y` = `batch * n_heads
/// + head`. Layouts as in the forward kernel; `lse`, `delta` `[batch,
/// n_heads, seq]`, `dq` like `q`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward_q_kernel<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    slopes: &Array<f32>,
    d_out: &Array<F>,
    lse: &Array<f32>,
    delta: &Array<f32>,
    dq: &mut Array<F>,
    seq: u32,
    n_heads: u32,
    group: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] causal: bool,
    #[comptime] alibi: bool,
    #[comptime] round_bf16: bool,
) {
    let seq = seq as usize;
    let n_heads = n_heads as usize;
    let group = group as usize;
    let bh = CUBE_POS_Y as usize;
    let head = bh % n_heads;
    let kv_bh = (bh / n_heads) * (n_heads / group) + head / group;
    let first_query = CUBE_POS_X as usize * CUBE_DIM_X as usize;
    let query = first_query + UNIT_POS_X as usize;
    let kv_base = kv_bh * seq * head_dim;

    let mut slope = 0.0f32;
    if alibi {
        slope = slopes[head];
    }

    // Rows past `seq` compute on a copy of the last row and are not written.
    let row = bh * seq + min(query, seq - 1);
    let row_base = row * head_dim;
    let row_lse = lse[row];
    let row_delta = delta[row];
    // The query row is pre-multiplied by the softmax scale.
    let mut q_row = Array::<f32>::new(head_dim);
    let mut do_row = Array::<f32>::new(head_dim);
    let mut dq_row = Array::<f32>::new(head_dim);
    for d in 0..head_dim {
        q_row[d] = load::<F>(q[row_base + d], round_bf16) * scale;
        do_row[d] = load::<F>(d_out[row_base + d], round_bf16);
        dq_row[d] = 0.0f32;
    }
    let mut scores = Array::<f32>::new(KEYS_PER_STEP);
    let mut dps = Array::<f32>::new(KEYS_PER_STEP);

    // Same key range for the whole cube, as in the forward kernel.
    let mut key_end = seq;
    if causal {
        key_end = min(first_query + CUBE_DIM_X as usize, seq);
    }
    let mut first_key = 0usize;
    while first_key < key_end {
        #[unroll]
        for j in 0..KEYS_PER_STEP {
            scores[j] = 0.0f32;
            dps[j] = 0.0f32;
        }
        for d in 0..head_dim {
            let q_d = q_row[d];
            let do_d = do_row[d];
            #[unroll]
            for j in 0..KEYS_PER_STEP {
                let at = kv_base + min(first_key + j, seq - 1) * head_dim + d;
                scores[j] += q_d * load::<F>(k[at], round_bf16);
                dps[j] += do_d * load::<F>(v[at], round_bf16);
            }
        }

        // `scores` becomes `ds`, 0 for masked keys.
        #[unroll]
        for j in 0..KEYS_PER_STEP {
            let key = first_key + j;
            let mut score = scores[j];
            if alibi {
                score += alibi_bias(slope, query, key);
            }
            let ds = f32::exp(score - row_lse) * (dps[j] - row_delta);
            scores[j] = select(visible(query, key, seq, causal), ds, 0.0f32);
        }
        for d in 0..head_dim {
            let mut grad = dq_row[d];
            #[unroll]
            for j in 0..KEYS_PER_STEP {
                grad += scores[j]
                    * load::<F>(
                        k[kv_base + min(first_key + j, seq - 1) * head_dim + d],
                        round_bf16,
                    );
            }
            dq_row[d] = grad;
        }
        first_key += KEYS_PER_STEP;
    }

    if query < seq {
        for d in 0..head_dim {
            dq[row_base + d] = store::<F>(dq_row[d] * scale, round_bf16);
        }
    }
}
