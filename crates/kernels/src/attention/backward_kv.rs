//! FlashAttention-2 backward, key/value side: dK and dV, recomputing the
//! probabilities from the saved log-sum-exp.

use cubecl::prelude::*;

use crate::dtype::{load, store};

use super::tiles::{alibi_bias, visible, KEYS_PER_STEP};

/// Each unit computes `dk` and `dv` for one key row of one `(batch,
/// kv_head)`; its `k`, `v`, `dk` and `dv` rows live in local memory. It
/// visits every query head of the group that shares this key/value head
/// (grouped-query attention: the sum over the group happens here, without
/// atomics) and walks the queries that can see the cube's keys
/// `KEYS_PER_STEP` at a time: one pass over `head_dim` computes the step's
/// `q.k` and `d_out.v` (kept in registers), one more accumulates
/// `p = exp(scale * q.k + bias - lse)`, `dv += p * d_out`,
/// `ds = p * (d_out.v - delta)`, `dk += scale * ds * q`. The units of a cube
/// read the same Q/dO rows from global memory; there is no shared memory and
/// no barrier.
///
/// Cube grid: `x` = tile of `CUBE_DIM_X` key rows, `y` = `batch *
/// n_kv_heads + kv_head`. Layouts as in the forward kernel; `dk`, `dv` like
/// `k`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward_kv_kernel<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    slopes: &Array<f32>,
    d_out: &Array<F>,
    lse: &Array<f32>,
    delta: &Array<f32>,
    dk: &mut Array<F>,
    dv: &mut Array<F>,
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
    let kv_bh = CUBE_POS_Y as usize;
    let n_kv_heads = n_heads / group;
    let batch = kv_bh / n_kv_heads;
    let kv_head = kv_bh % n_kv_heads;
    let first_key = CUBE_POS_X as usize * CUBE_DIM_X as usize;
    let key = first_key + UNIT_POS_X as usize;
    // Rows past `seq` compute on a copy of the last row and are not written.
    let key_base = (kv_bh * seq + min(key, seq - 1)) * head_dim;

    let mut k_row = Array::<f32>::new(head_dim);
    let mut v_row = Array::<f32>::new(head_dim);
    let mut dk_row = Array::<f32>::new(head_dim);
    let mut dv_row = Array::<f32>::new(head_dim);
    for d in 0..head_dim {
        k_row[d] = load::<F>(k[key_base + d], round_bf16);
        v_row[d] = load::<F>(v[key_base + d], round_bf16);
        dk_row[d] = 0.0f32;
        dv_row[d] = 0.0f32;
    }
    let mut probs = Array::<f32>::new(KEYS_PER_STEP);
    let mut dss = Array::<f32>::new(KEYS_PER_STEP);

    // With a causal mask, queries before the cube's first key see none of
    // its keys. The same start for the whole cube keeps the Q/dO reads
    // uniform.
    let mut query_start = 0usize;
    if causal {
        query_start = first_key;
    }

    for g in 0..group {
        let head = kv_head * group + g;
        let bh = batch * n_heads + head;
        let q_base = bh * seq * head_dim;
        let mut slope = 0.0f32;
        if alibi {
            slope = slopes[head];
        }

        let mut first_query = query_start;
        while first_query < seq {
            #[unroll]
            for i in 0..KEYS_PER_STEP {
                probs[i] = 0.0f32;
                dss[i] = 0.0f32;
            }
            for d in 0..head_dim {
                let k_d = k_row[d];
                let v_d = v_row[d];
                #[unroll]
                for i in 0..KEYS_PER_STEP {
                    let at = q_base + min(first_query + i, seq - 1) * head_dim + d;
                    probs[i] += k_d * load::<F>(q[at], round_bf16);
                    dss[i] += v_d * load::<F>(d_out[at], round_bf16);
                }
            }

            // `probs` becomes `p` and `dss` becomes `ds`, 0 when masked.
            #[unroll]
            for i in 0..KEYS_PER_STEP {
                let query = first_query + i;
                let row = bh * seq + min(query, seq - 1);
                let mut score = probs[i] * scale;
                if alibi {
                    score += alibi_bias(slope, query, key);
                }
                let p = f32::exp(score - lse[row]);
                let ds = p * (dss[i] - delta[row]);
                let seen = visible(query, key, seq, causal);
                probs[i] = select(seen, p, 0.0f32);
                dss[i] = select(seen, ds, 0.0f32);
            }
            for d in 0..head_dim {
                let mut grad_v = dv_row[d];
                let mut grad_k = dk_row[d];
                #[unroll]
                for i in 0..KEYS_PER_STEP {
                    let at = q_base + min(first_query + i, seq - 1) * head_dim + d;
                    grad_v += probs[i] * load::<F>(d_out[at], round_bf16);
                    grad_k += dss[i] * load::<F>(q[at], round_bf16);
                }
                dv_row[d] = grad_v;
                dk_row[d] = grad_k;
            }
            first_query += KEYS_PER_STEP;
        }
    }

    if key < seq {
        for d in 0..head_dim {
            dk[key_base + d] = store::<F>(dk_row[d] * scale, round_bf16);
            dv[key_base + d] = store::<F>(dv_row[d], round_bf16);
        }
    }
}
