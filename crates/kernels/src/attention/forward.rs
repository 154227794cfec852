//! FlashAttention forward kernel: online softmax over the keys that writes
//! the output and the per-row log-sum-exp, never the score matrix.

use cubecl::prelude::*;

use crate::dtype::{load, store};

use super::tiles::{alibi_bias, visible, KEYS_PER_STEP, NEG_LARGE};

/// Each unit owns one query row of one `(batch, head)` (its scaled query and
/// output accumulator live in local memory) and walks the keys
/// `KEYS_PER_STEP` at a time: one pass over `head_dim` computes the step's
/// scores (kept in registers), one more adds their probability-weighted
/// values, and the running maximum and sum are rescaled once per step. Each
/// local value read in the `head_dim` loops serves `KEYS_PER_STEP` keys. The
/// units of a cube read the same K/V rows from global memory at the same
/// time; there is no shared memory and no barrier.
///
/// Cube grid: `x` = tile of `CUBE_DIM_X` query rows, `y` = `batch * n_heads
/// + head`. Layouts (contiguous, row-major): `q`, `out` `[batch, n_heads,
/// seq, head_dim]`; `k`, `v` `[batch, n_heads / group, seq, head_dim]`;
/// `lse` `[batch, n_heads, seq]`; `slopes` `[n_heads]` (read only when
/// `alibi`). Query head `h` reads key/value head `h / group`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_forward_kernel<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    slopes: &Array<f32>,
    out: &mut Array<F>,
    lse: &mut Array<f32>,
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
    let row_base = (bh * seq + min(query, seq - 1)) * head_dim;
    // The query row is pre-multiplied by the softmax scale.
    let mut q_row = Array::<f32>::new(head_dim);
    let mut acc = Array::<f32>::new(head_dim);
    for d in 0..head_dim {
        q_row[d] = load::<F>(q[row_base + d], round_bf16) * scale;
        acc[d] = 0.0f32;
    }
    let mut scores = Array::<f32>::new(KEYS_PER_STEP);

    // The same key range for every unit of the cube keeps the K/V reads
    // uniform; with a causal mask it ends after the cube's last query.
    let mut key_end = seq;
    if causal {
        key_end = min(first_query + CUBE_DIM_X as usize, seq);
    }
    let mut row_max = f32::new(NEG_LARGE);
    let mut row_sum = 0.0f32;

    let mut first_key = 0usize;
    while first_key < key_end {
        #[unroll]
        for j in 0..KEYS_PER_STEP {
            scores[j] = 0.0f32;
        }
        for d in 0..head_dim {
            let q_d = q_row[d];
            #[unroll]
            for j in 0..KEYS_PER_STEP {
                scores[j] += q_d
                    * load::<F>(
                        k[kv_base + min(first_key + j, seq - 1) * head_dim + d],
                        round_bf16,
                    );
            }
        }

        // Masked keys score `NEG_LARGE`. Key 0 is visible to every row, so
        // `row_max` is a real score after the first step and masked keys
        // get probability 0.
        let mut step_max = f32::new(NEG_LARGE);
        #[unroll]
        for j in 0..KEYS_PER_STEP {
            let key = first_key + j;
            let mut score = scores[j];
            if alibi {
                score += alibi_bias(slope, query, key);
            }
            score = select(visible(query, key, seq, causal), score, f32::new(NEG_LARGE));
            scores[j] = score;
            step_max = max(step_max, score);
        }
        let new_max = max(row_max, step_max);
        let correction = f32::exp(row_max - new_max);
        row_sum *= correction;
        #[unroll]
        for j in 0..KEYS_PER_STEP {
            let p = select(
                visible(query, first_key + j, seq, causal),
                f32::exp(scores[j] - new_max),
                0.0f32,
            );
            row_sum += p;
            scores[j] = p;
        }

        // Rescale what was accumulated under the old maximum and add this
        // step's values.
        for d in 0..head_dim {
            let mut value = acc[d] * correction;
            #[unroll]
            for j in 0..KEYS_PER_STEP {
                value += scores[j]
                    * load::<F>(
                        v[kv_base + min(first_key + j, seq - 1) * head_dim + d],
                        round_bf16,
                    );
            }
            acc[d] = value;
        }
        row_max = new_max;
        first_key += KEYS_PER_STEP;
    }

    if query < seq {
        let inv_sum = 1.0f32 / row_sum;
        for d in 0..head_dim {
            out[row_base + d] = store::<F>(acc[d] * inv_sum, round_bf16);
        }
        lse[bh * seq + query] = row_max + f32::ln(row_sum);
    }
}
