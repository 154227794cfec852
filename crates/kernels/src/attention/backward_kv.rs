//! FlashAttention-2 backward, key/value side: dK and dV, recomputing the
//! probabilities tile by tile from the saved log-sum-exp.

use cubecl::prelude::*;

use super::tiles::{alibi_bias, stage_rows, visible};

/// One cube computes `dk` and `dv` for `CUBE_DIM_X` key rows of one
/// `(batch, kv_head)`; each unit owns one key row (its `k`, `v`, `dk` and
/// `dv` rows live in local memory). The cube visits every query head of the
/// group that shares this key/value head (grouped-query attention: the sum
/// over the group happens here, without atomics) and every query tile that
/// can see its keys, staging Q, dO, lse and delta tiles of `block_q` rows in
/// shared memory: `p = exp(scale * q.k + bias - lse)`, `dv += p * d_out`,
/// `ds = p * (d_out.v - delta)`, `dk += scale * ds * q`.
///
/// Cube grid: `x` = key tile, `y` = `batch * n_kv_heads + kv_head`.
/// Layouts as in the forward kernel; `dk`, `dv` like `k`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward_kv_kernel<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    slopes: &Array<F>,
    d_out: &Array<F>,
    lse: &Array<F>,
    delta: &Array<F>,
    dk: &mut Array<F>,
    dv: &mut Array<F>,
    seq: u32,
    n_heads: u32,
    group: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] block_q: usize,
    #[comptime] causal: bool,
    #[comptime] alibi: bool,
) {
    let seq = seq as usize;
    let scale = F::cast_from(scale);
    let n_heads = n_heads as usize;
    let group = group as usize;
    let kv_bh = CUBE_POS_Y as usize;
    let n_kv_heads = n_heads / group;
    let batch = kv_bh / n_kv_heads;
    let kv_head = kv_bh % n_kv_heads;
    let first_key = CUBE_POS_X as usize * CUBE_DIM_X as usize;
    let key = first_key + UNIT_POS_X as usize;
    let key_base = (kv_bh * seq + key) * head_dim;

    let mut k_row = Array::<F>::new(head_dim);
    let mut v_row = Array::<F>::new(head_dim);
    let mut dk_row = Array::<F>::new(head_dim);
    let mut dv_row = Array::<F>::new(head_dim);
    for d in 0..head_dim {
        k_row[d] = F::new(0.0);
        v_row[d] = F::new(0.0);
        dk_row[d] = F::new(0.0);
        dv_row[d] = F::new(0.0);
    }
    if key < seq {
        for d in 0..head_dim {
            k_row[d] = k[key_base + d];
            v_row[d] = v[key_base + d];
        }
    }
    let mut q_tile = SharedMemory::<F>::new(block_q * head_dim);
    let mut do_tile = SharedMemory::<F>::new(block_q * head_dim);
    let mut lse_tile = SharedMemory::<F>::new(block_q);
    let mut delta_tile = SharedMemory::<F>::new(block_q);

    // With a causal mask, queries before the cube's first key see none of
    // its keys: start at the query tile that contains `first_key`.
    let mut query_start = 0usize;
    if causal {
        query_start = (first_key / block_q) * block_q;
    }

    for g in 0..group {
        let head = kv_head * group + g;
        let bh = batch * n_heads + head;
        let q_base = bh * seq * head_dim;
        let mut slope = F::new(0.0);
        if alibi {
            slope = slopes[head];
        }

        let mut first_query = query_start;
        while first_query < seq {
            stage_rows::<F>(q, q_base, first_query, seq, &mut q_tile, block_q, head_dim);
            stage_rows::<F>(
                d_out,
                q_base,
                first_query,
                seq,
                &mut do_tile,
                block_q,
                head_dim,
            );
            let unit = UNIT_POS_X as usize;
            if unit < block_q {
                let mut row_lse = F::new(0.0);
                let mut row_delta = F::new(0.0);
                if first_query + unit < seq {
                    row_lse = lse[bh * seq + first_query + unit];
                    row_delta = delta[bh * seq + first_query + unit];
                }
                lse_tile[unit] = row_lse;
                delta_tile[unit] = row_delta;
            }
            sync_cube();

            for i in 0..block_q {
                let query = first_query + i;
                if visible(query, key, seq, causal) {
                    let mut score = F::new(0.0);
                    let mut dp = F::new(0.0);
                    for d in 0..head_dim {
                        score += q_tile[i * head_dim + d] * k_row[d];
                        dp += do_tile[i * head_dim + d] * v_row[d];
                    }
                    score *= scale;
                    if alibi {
                        score += alibi_bias::<F>(slope, query, key);
                    }
                    let p = F::exp(score - lse_tile[i]);
                    let ds = p * (dp - delta_tile[i]);
                    for d in 0..head_dim {
                        dv_row[d] += p * do_tile[i * head_dim + d];
                        dk_row[d] += ds * q_tile[i * head_dim + d];
                    }
                }
            }

            sync_cube();
            first_query += block_q;
        }
    }

    if key < seq {
        for d in 0..head_dim {
            dk[key_base + d] = dk_row[d] * scale;
            dv[key_base + d] = dv_row[d];
        }
    }
}
