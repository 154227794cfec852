//! FlashAttention-2 backward, query side: dQ, recomputing the probabilities
//! tile by tile from the saved log-sum-exp.

use cubecl::prelude::*;

use super::tiles::{alibi_bias, stage_rows, visible};

/// One cube computes `dq` for `CUBE_DIM_X` query rows of one `(batch, head)`;
/// each unit owns one query row (its `q`, `d_out` and `dq` rows live in local
/// memory) and the cube stages K and V tiles of `block_k` keys in shared
/// memory, visiting every key tile the rows can see:
/// `p = exp(scale * q.k + bias - lse)`, `ds = p * (d_out.v - delta)`,
/// `dq = scale * sum_j ds_j k_j`.
///
/// Cube grid: `x` = query tile, `y` = `batch * n_heads + head`.
/// Layouts as in the forward kernel; `lse`, `delta` `[batch, n_heads, seq]`,
/// `dq` like `q`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward_q_kernel<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    slopes: &Array<F>,
    d_out: &Array<F>,
    lse: &Array<F>,
    delta: &Array<F>,
    dq: &mut Array<F>,
    seq: u32,
    n_heads: u32,
    group: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] block_k: usize,
    #[comptime] causal: bool,
    #[comptime] alibi: bool,
) {
    let seq = seq as usize;
    let scale = F::cast_from(scale);
    let n_heads = n_heads as usize;
    let group = group as usize;
    let bh = CUBE_POS_Y as usize;
    let head = bh % n_heads;
    let kv_bh = (bh / n_heads) * (n_heads / group) + head / group;
    let block_q = CUBE_DIM_X as usize;
    let first_query = CUBE_POS_X as usize * block_q;
    let query = first_query + UNIT_POS_X as usize;
    let row_base = (bh * seq + query) * head_dim;
    let kv_base = kv_bh * seq * head_dim;

    let mut slope = F::new(0.0);
    if alibi {
        slope = slopes[head];
    }

    // The query row is pre-multiplied by the softmax scale.
    let mut q_row = Array::<F>::new(head_dim);
    let mut do_row = Array::<F>::new(head_dim);
    let mut dq_row = Array::<F>::new(head_dim);
    let mut row_lse = F::new(0.0);
    let mut row_delta = F::new(0.0);
    for d in 0..head_dim {
        q_row[d] = F::new(0.0);
        do_row[d] = F::new(0.0);
        dq_row[d] = F::new(0.0);
    }
    if query < seq {
        for d in 0..head_dim {
            q_row[d] = q[row_base + d] * scale;
            do_row[d] = d_out[row_base + d];
        }
        row_lse = lse[bh * seq + query];
        row_delta = delta[bh * seq + query];
    }
    let mut k_tile = SharedMemory::<F>::new(block_k * head_dim);
    let mut v_tile = SharedMemory::<F>::new(block_k * head_dim);

    let mut key_end = seq;
    if causal {
        key_end = min(first_query + block_q, seq);
    }
    let mut first_key = 0usize;
    while first_key < key_end {
        stage_rows::<F>(k, kv_base, first_key, seq, &mut k_tile, block_k, head_dim);
        stage_rows::<F>(v, kv_base, first_key, seq, &mut v_tile, block_k, head_dim);
        sync_cube();

        for j in 0..block_k {
            let key = first_key + j;
            if visible(query, key, seq, causal) {
                let mut score = F::new(0.0);
                let mut dp = F::new(0.0);
                for d in 0..head_dim {
                    score += q_row[d] * k_tile[j * head_dim + d];
                    dp += do_row[d] * v_tile[j * head_dim + d];
                }
                if alibi {
                    score += alibi_bias::<F>(slope, query, key);
                }
                let ds = F::exp(score - row_lse) * (dp - row_delta);
                for d in 0..head_dim {
                    dq_row[d] += ds * k_tile[j * head_dim + d];
                }
            }
        }

        sync_cube();
        first_key += block_k;
    }

    if query < seq {
        for d in 0..head_dim {
            dq[row_base + d] = dq_row[d] * scale;
        }
    }
}
